// The key-stage planner of one table: plans one batch (HostTable::Process)
// in four phases. The IDs are hashed and counted per shard; each is found (in
// training: inserted and counted) by one task per group of shards; the
// distinct IDs are numbered by first occurrence, admitted and given device
// rows (or the batch is refused); then every position's restore index is
// filled in. The result does not depend on the number of threads. See
// "Determinism" in docs/ARCHITECTURE.md.
//
// State: the planner owns only its scratch; the table's state is lent to it
// by its HostTable for the planner's whole life (all of it outlives the
// planner):
//   reads   the TableOptions (padding IDs, refill_new_rows, the name and
//           device_capacity for errors), the table's Admission (settings,
//           frozen counting, shared counts), and the IDs that pending
//           batches admitted (evaluation reads them as unseen);
//   writes  the IdMap (records inserted; the last-seen time, count, save
//           epoch and row of each ID of a training batch), the DeviceRows
//           (rows handed out, given back when a batch is refused), the
//           statistics `admitted`, `ids_seen` and `rejected`, and, tiered
//           tables, the DeviceCachePlanner (recency, rows handed to admitted
//           IDs without one, swap plans).
// Per batch the table passes the save epoch and, for a deferred training
// batch, the journal the planner fills (BatchInput).
//
// Locking: the planner has no lock of its own; Plan runs under its
// HostTable's mutex, which guards everything above (one mutex per table
// serialises batches). The work it hands to the pool's threads touches
// disjoint shards or chunks and ends before Plan returns. The scratch comes
// from a pool shared by every table of the process, which has its own lock.
#ifndef MXREC_ENGINE_BATCH_PLANNER_H_
#define MXREC_ENGINE_BATCH_PLANNER_H_

#include <cstdint>
#include <memory>

#include "batch_journal.h"
#include "id_map.h"
#include "key_map.h"
#include "status.h"
#include "thread_pool.h"

namespace mxrec {

class DeviceCachePlanner;
struct Admission;
struct BatchPlan;
struct TableOptions;
struct TableStats;

// One batch as HostTable::Process received it (see there for its contract),
// with what the table's bookkeeping gives it.
struct BatchInput {
  const int64_t* keys = nullptr;
  int64_t n = 0;
  // Training only: occurrences of each position's ID, or null (one each).
  const int64_t* weights = nullptr;
  bool train = false;
  // The batch's time: the last-seen time of its IDs (training).
  int64_t timestamp = 0;
  // The table's save epoch: the records a training batch changes carry it,
  // so that the next delta holds them.
  uint32_t epoch = 0;
  // A deferred training batch's journal, which the planner fills (each ID as
  // before the batch, the IDs admitted, the rows taken); null otherwise.
  PendingBatch* journal = nullptr;
};

class BatchPlanner {
 public:
  // `cache` is null for a device-only table. Everything passed is its
  // table's and outlives the planner.
  BatchPlanner(const TableOptions& options, IdMap* ids, DeviceRows* rows, DeviceCachePlanner* cache,
               const Admission* admission,
               const PendingAdmitted* pending_admitted, TableStats* stats);
  // A copy would plan against the same table's state.
  BatchPlanner(const BatchPlanner&) = delete;
  BatchPlanner& operator=(const BatchPlanner&) = delete;

  // Plans `batch` (n > 0) into `plan`, whose rows the caller cleared. On an
  // error the plan's rows are cleared again and the map stays valid: a
  // device-only batch that brings more new IDs than there are rows gives
  // back the rows it took (kResourceExhausted), and a tiered one changes no
  // row (DeviceCachePlanner::AssignRows).
  Status Plan(const BatchInput& batch, ThreadPool* pool, BatchPlan* plan);

 private:
  static constexpr int kNumShards = IdMap::kNumShards;
  static constexpr int kShardShift = IdMap::kShardShift;

  // Each distinct ID gets its index in unique_rows from the slot function of
  // the batch's mode: EvalSlot (evaluation), TieredSlot (training, host
  // tier: rows are handed out once the batch is known, by the
  // DeviceCachePlanner) or DeviceSlot (training, device-only: a row at once,
  // or a shortfall); on several threads, evaluation and device-only training
  // take SlotsInParallel, which hands out the same rows.
  struct BatchWork;
  // The scratch comes from one pool for every table of the process: a batch
  // takes one (or a new one) and gives it back once planned, so that the
  // process keeps as many as batches were planned at once, not one per table.
  static std::unique_ptr<BatchWork> TakeScratch();
  static void GiveBackScratch(std::unique_ptr<BatchWork> work);

  // Phase A: hashes the IDs and counts them per shard (on several threads,
  // also scatters each chunk's positions into per-shard buckets).
  void HashKeys(BatchWork& w, ThreadPool* pool);
  // Shards [lo, hi): the part of a batch one FindAndCount task plans.
  struct ShardGroup {
    int lo;
    int hi;
    bool Holds(uint64_t hash) const {
      const int s = static_cast<int>(hash >> kShardShift);
      return s >= lo && s < hi;
    }
  };
  // Phase B: finds (in training: inserts and counts) every ID, one task per
  // group of shards: PrepareShards sizes the group's maps and dedupe tables
  // for the batch, FindIds (pass 1, over the positions) gives each position
  // its index among its shard's distinct IDs, CountIds (pass 2, training,
  // over the distinct IDs) updates their records.
  void FindAndCount(BatchWork& w, ThreadPool* pool);
  void PrepareShards(BatchWork& w, ShardGroup shards);
  void FindIds(BatchWork& w, ShardGroup shards);
  void CountIds(BatchWork& w, ShardGroup shards);

  // Phase C and D: numbers the distinct IDs by first occurrence and hands
  // out rows (InOrder or SlotsInParallel), fills in the restore index
  // (WriteRestore), then hands the tiered IDs without a row to the
  // DeviceCachePlanner, or refuses a device-only batch short of rows.
  Status AssignRows(BatchWork& w, ThreadPool* pool, BatchPlan* plan);
  // OrderDistinct lists the batch's distinct IDs by first occurrence
  // (parallel batches: each chunk of positions counts its first occurrences,
  // then writes them at its offset).
  void OrderDistinct(BatchWork& w, ThreadPool* pool);
  // One thread (and tiered training, whose planner picks victims in order):
  // the walk over the distinct IDs in order, each through its slot function.
  void InOrder(BatchWork& w, BatchPlan* plan);
  // Several threads, evaluation and device-only training: each chunk of
  // distinct IDs classifies them (a row, a row wanted, none), then, from the
  // chunks' counts, writes its unique indices and hands out the grants
  // numbered by first occurrence, so the rows are those of the one-thread
  // walk, whatever the threads do.
  void SlotsInParallel(BatchWork& w, ThreadPool* pool, BatchPlan* plan);
  // Every position's index into unique_rows (one past them for the default
  // value), and the batch's ids_seen and rejected.
  void WriteRestore(BatchWork& w, ThreadPool* pool, BatchPlan* plan);

  // An evaluated ID's row as the step boundary sees it, or the default slot
  // (EvalSlot's and SlotsInParallel's rule).
  int32_t EvalRow(const BatchWork& w, int64_t key, const KeyRecord& rec) const;
  int32_t EvalSlot(const BatchWork& w, int64_t key, const KeyRecord& rec, BatchPlan* plan) const;
  // TieredSlot and DeviceSlot run once per distinct ID: they are inline,
  // defined in the one file that calls them, because the -fPIC build would
  // keep a plain member function out of line.
  inline int32_t TieredSlot(BatchWork& w, const RecordRef& id, BatchPlan* plan);
  inline int32_t DeviceSlot(BatchWork& w, const RecordRef& id, BatchPlan* plan);
  // A device-only batch that brings more new IDs than there are rows: takes
  // back the rows it was given and returns the error.
  Status RefuseBatch(BatchWork& w, BatchPlan* plan);
  // Records in a deferred batch's journal the rows a device-only batch took.
  void JournalGrants(BatchWork& w);
  // The admission rule (the table's Admission) for an ID with record `rec`.
  bool Admits(int64_t key, const KeyRecord& rec) const;
  bool IsPadding(int64_t key) const;

  const TableOptions& options_;
  IdMap* const ids_;
  DeviceRows* const rows_;
  DeviceCachePlanner* const cache_;
  const Admission* const admission_;
  // IDs admitted by pending batches; current when an evaluation batch is
  // planned (HostTable::Process refreshes it), unused by training batches.
  const PendingAdmitted* const pending_admitted_;
  TableStats* const stats_;
};

}  // namespace mxrec

#endif  // MXREC_ENGINE_BATCH_PLANNER_H_
