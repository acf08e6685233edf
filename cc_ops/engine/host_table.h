// The host side of one sparse table: the ID -> device row map, admission
// counts, last-seen times and the free device rows. Plain C++, no TensorFlow.
// HostTable is the core table: its ID map (id_map.h), admission settings,
// pending batches (batch_journal.h), eviction and statistics
// (host_table.cc), and checkpoint export and import over that state
// (host_table_state.cc). Its BatchPlanner plans each batch against that
// state (batch_planner.h); a tiered table's device cache is planned by its
// DeviceCachePlanner (device_cache_planner.h).
#ifndef MXREC_ENGINE_HOST_TABLE_H_
#define MXREC_ENGINE_HOST_TABLE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "batch_journal.h"
#include "batch_planner.h"
#include "device_cache_planner.h"
#include "host_tier.h"
#include "id_map.h"
#include "key_map.h"
#include "shared_counts.h"
#include "status.h"
#include "thread_pool.h"

namespace mxrec {

struct TableOptions {
  // The user's table name; every error message carries it.
  std::string name;
  // Row width of the device table.
  int64_t dim = 0;
  // Rows of the device table (`device_vocabulary_size`). Must be in [1, 2^31).
  int64_t device_capacity = 0;
  // IDs that always look up as the default value and are never counted.
  std::vector<int64_t> padding_keys;
  // Rows kept in host memory for IDs outside the device cache
  // (`host_vocabulary_size`). 0 = device-only mode; > 0 makes the device table
  // a cache of device_capacity rows over the host tier.
  int64_t host_capacity = 0;
  // Rows kept on disk under ssd_path once host memory is full
  // (`ssd_vocabulary_size`, `ssd_data_path`); needs host_capacity > 0.
  int64_t ssd_capacity = 0;
  std::string ssd_path;
  // How the host and SSD tiers store the embedding (`storage_dtype`) and the
  // optimizer slots (`slot_dtype`): 4 or 2 bytes a value (row_format.h).
  ElementType embedding_type = ElementType::kFloat32;
  ElementType slot_type = ElementType::kFloat32;
  // Every row handed to a newly admitted ID is in the plan's reused_rows, also
  // a never used one, so that the step writes the ID's first values into it
  // (create_table(init_by_id=True): values drawn from the ID, not the row).
  bool refill_new_rows = false;
};

// Feature admission; may change while training.
struct AdmissionOptions {
  // Weighted count an ID needs before it gets a row; 0 admits at first sight.
  double access_threshold = 0.0;
  // Weight of one occurrence of an ID in the admission count.
  double faae_coefficient = 1.0;
  // Share of IDs admitted, decided once per ID from a hash of (ID, seed), so
  // that a rerun admits the same IDs; 1 admits every ID.
  double probability = 1.0;
  uint64_t seed = 0;
};

// A table's admission state: set by its HostTable (ConfigureAdmission,
// SetThreshold, ShareCounts, ImportState), read by its BatchPlanner, which
// counts and admits IDs by it.
struct Admission {
  AdmissionOptions options;
  // set_threshold(0): counts no longer accumulate; the threshold stays.
  bool counting_frozen = false;
  // USE_COMBINE_FAAE: counts shared with the other tables of the group, or null.
  std::shared_ptr<SharedCounts> shared_counts;
};

// What the key stage hands the training step for one batch of one table.
struct BatchPlan {
  // Device rows of the batch's admitted IDs, in order of first occurrence.
  std::vector<int32_t> unique_rows;
  // For each input position, the index into unique_rows, or unique_rows.size()
  // where the ID takes the default value (padding, unseen, not admitted).
  std::vector<int32_t> restore;
  // Set by the caller: where Process writes the restore index instead (n
  // entries, e.g. the op's output tensor), so that it is not copied; `restore`
  // stays empty then.
  int32_t* restore_out = nullptr;
  // Rows handed out in this batch that held another ID before (with
  // refill_new_rows: every row handed to a new ID): the step must
  // re-initialise them (and their optimizer slots) before the lookup.
  std::vector<int32_t> reused_rows;
  int64_t new_ids = 0;
  // Deferred training batches only: the number to pass to Commit once the
  // batch's step runs; 0 otherwise.
  uint64_t batch_id = 0;
};

// A per-ID column of a TableState: owned (an export, an import that copied),
// or a view of memory that the caller keeps alive and unchanged for the call
// (an import from a checkpoint file mapped into memory: nothing per ID is
// copied, the kernel pages the file in and may drop it again).
template <typename T>
class Column {
 public:
  Column() = default;
  Column(std::vector<T> values) : owned_(std::move(values)) {}  // NOLINT: a vector is a column
  Column& operator=(std::vector<T> values) {
    owned_ = std::move(values);
    view_ = nullptr;
    view_size_ = 0;
    return *this;
  }
  // Reads `n` values at `data` from now on (the column owns none).
  void View(const T* data, size_t n) {
    owned_ = std::vector<T>();
    view_ = data;
    view_size_ = n;
  }
  size_t size() const { return view_ != nullptr ? view_size_ : owned_.size(); }
  bool empty() const { return size() == 0; }
  const T* data() const { return view_ != nullptr ? view_ : owned_.data(); }
  const T& operator[](size_t i) const { return data()[i]; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size(); }
  // Filling (an owned column).
  void push_back(const T& value) { owned_.push_back(value); }
  void reserve(size_t n) { owned_.reserve(n); }
  void clear() {
    owned_.clear();
    view_ = nullptr;
    view_size_ = 0;
  }
  template <typename It>
  void assign(It first, It last) {
    view_ = nullptr;
    view_size_ = 0;
    owned_.assign(first, last);
  }
  // The values of an owned column (an export's).
  const std::vector<T>& owned() const { return owned_; }

 private:
  std::vector<T> owned_;
  const T* view_ = nullptr;
  size_t view_size_ = 0;
};

// Everything the host knows of a table, as flat arrays, for checkpoints.
struct TableState {
  Column<int64_t> keys;
  Column<int32_t> rows;  // -1: counted, not admitted
  Column<float> counts;
  Column<int64_t> last_seen;
  std::vector<int32_t> free_rows;
  int64_t next_row = 0;
  int64_t newest_timestamp = -1;
  bool counting_frozen = false;
  double access_threshold = 0.0;
  // Delta exports only: IDs removed since the base epoch (in removal order).
  std::vector<int64_t> removed;
  // The save epoch this export closed; pass it as since_epoch of the next delta.
  uint32_t epoch = 0;

  // Tables with a host tier only (empty otherwise).
  // Per key: 1 = the ID's row lives in the host (or SSD) tier; rows[i] is -1 then.
  Column<uint8_t> in_host;
  // The device rows that have an owner, least recently used first, and the
  // batches since each was last used (the swap victims' order).
  std::vector<int32_t> lru_rows;
  std::vector<uint32_t> lru_ages;
  // Values of the in_host IDs (in their order in `keys`): for each, a mask of
  // the components it holds (bit k: tier_components[k]) and
  // tier_components.size() * dim floats (zeros where the bit is clear).
  std::vector<std::string> tier_components;
  std::vector<uint32_t> tier_present;
  std::vector<float> tier_values;
  // In chunks instead (a checkpoint that streams), set by the caller:
  // ImportState reads the in_host IDs' values from `tier_reader` (and
  // tier_present/tier_values stay empty); ExportState hands them to
  // `tier_writer` (components, masks, values of up to tier_chunk_rows IDs
  // each call, in order) and leaves tier_present/tier_values empty.
  TierValueReader tier_reader;
  std::function<Status(const std::vector<std::string>& components, const uint32_t* present,
                       const float* values, int64_t n)>
      tier_writer;
  int64_t tier_chunk_rows = 65536;
  // A save that streams its records too (set by the caller, with or without
  // tier_writer): ExportState hands the records to `record_writer` in chunks
  // of up to tier_chunk_rows (each a TableState whose keys, rows, counts,
  // last_seen and, tiered, in_host are set), those without a device row first
  // in the ID map's order, then those with one in device-row order; the
  // columns of the state itself stay empty, and the host-tier values of each
  // chunk's in_host IDs reach tier_writer before the chunk does. Nothing of
  // the export then grows with the table beyond the device rows.
  std::function<Status(const TableState& chunk)> record_writer;
};

struct TableStats {
  int64_t device_capacity = 0;  // rows of the device table (device_vocabulary_size)
  int64_t rows_in_use = 0;
  int64_t ids_tracked = 0;    // IDs with a host record, admitted or still counting
  int64_t ids_seen = 0;       // occurrences of IDs in training batches
  int64_t admitted = 0;       // IDs given a row so far
  int64_t rejected = 0;       // occurrences that looked up as default (not admitted)
  int64_t evicted = 0;        // IDs removed by eviction or shrink (admitted or not)
  int64_t evicted_rows = 0;   // of those, IDs that held a row (rows freed)
  int64_t train_batches = 0;
  int64_t eval_batches = 0;
  int64_t tier_ids = 0;       // admitted IDs whose row is in the host (or SSD) tier
  int64_t id_map_bytes = 0;   // the ID map (all shards: probe arrays, records, tier records), in bytes
  bool tiered = false;        // the table has a host tier (tier_ids is listed only then)

  // The one list of the statistics by name: fn(name, value) for each, in
  // this order (the pybind module's stats dict is filled from it). A new
  // statistic is a member above and a line here.
  template <typename Fn>
  void ForEachField(Fn&& fn) const {
    fn("capacity", device_capacity);  // the key read since the first release
    fn("device_capacity", device_capacity);
    fn("rows_in_use", rows_in_use);
    fn("ids_tracked", ids_tracked);
    fn("ids_seen", ids_seen);
    fn("admitted", admitted);
    fn("rejected", rejected);
    fn("evicted", evicted);
    fn("evicted_rows", evicted_rows);
    fn("train_batches", train_batches);
    fn("eval_batches", eval_batches);
    fn("id_map_bytes", id_map_bytes);
    if (tiered) fn("tier_ids", tier_ids);
  }
};

class HostTable {
 public:
  static constexpr int kNumShards = IdMap::kNumShards;

  explicit HostTable(TableOptions options);
  ~HostTable();

  const TableOptions& options() const { return options_; }

  // Plans one batch. In training (train=true) IDs are counted, admitted and
  // given rows; otherwise the map is only read. `timestamp` is the batch's
  // time for last-seen bookkeeping. The result does not depend on the pool's
  // size. On a full table the plan is not produced and the map stays valid.
  //
  // A deferred training batch (planned ahead of its step, in the input
  // pipeline) stays *pending* until Commit(plan->batch_id): the table keeps
  // what the batch changed (counts, last-seen times, new IDs, rows handed
  // out), so that everything else sees the state at the step boundary:
  // ExportState saves it with pending batches undone, evaluation reads IDs
  // admitted by a pending batch as unseen (and, tiered, values where they
  // physically are), and Evict/Shrink never remove an ID a pending batch uses.
  // Evaluation batches are never pending.
  //
  // `weights` (training only, else nullptr): position p stands for weights[p]
  // occurrences of its ID (each >= 1, their sum < 2^31), as if the ID were
  // repeated that many times in place: admission counts, ids_seen and
  // rejected add weights[p], and the plan is that of the repeated batch with
  // each run of copies collapsed into its one position. The owner of a
  // sharded table plans the unique IDs it received with their counts so.
  Status Process(const int64_t* keys, int64_t n, bool train, int64_t timestamp,
                 ThreadPool* pool, BatchPlan* plan, bool deferred = false,
                 const int64_t* weights = nullptr);

  // The step of deferred batch `batch_id` runs: it stops being pending, and so
  // does every older pending batch (planned before it by the same pipeline and
  // never run: dropped with an iterator that was re-initialised). A batch no
  // longer pending is an error when the table was restored since the batch
  // was planned (its rows refer to the state replaced), and a no-op otherwise
  // (a later batch's commit retired it).
  //
  // Commit takes no lock: it raises the newest committed batch id, and the
  // next holder of the table's lock (Lock(): the key stage planning the next
  // batch, a save, an eviction, an evaluation batch) retires the batches up
  // to it before it reads anything. So a step never waits for the key stage
  // planning a later batch, and every reader still sees the step boundary.
  // A batch id this table never handed out (0, or past the newest planned) is
  // an InvalidArgument and commits nothing: it would retire batches planned
  // later before their steps ran.
  Status Commit(uint64_t batch_id);
  // What Commit(batch_id) would return, committing nothing (several tables'
  // ids are checked before any is committed).
  Status CheckCommit(uint64_t batch_id) const;
  // Deferred training batches planned and not committed.
  int64_t pending_batches() const;

  void ConfigureAdmission(const AdmissionOptions& admission);
  // Counts admission in `counts`, together with the other tables sharing it.
  void ShareCounts(std::shared_ptr<SharedCounts> counts);
  bool shares_counts() const;
  AdmissionOptions admission() const;

  // Changes the admission threshold; a threshold of 0 freezes the counts
  // ("no longer accumulate, use the counts so far") and keeps the threshold.
  void SetThreshold(double threshold);

  // Removes IDs last seen more than `max_age` seconds before the newest
  // trained batch time (pending batches excluded), with their rows. IDs of
  // pending batches are kept whatever their time: their step has not run.
  // Returns how many IDs were removed.
  int64_t Evict(int64_t max_age);

  // PaddlePaddle's shrink: ages every ID by one, except that an ID seen in
  // training since the last shrink restarts at 0, and removes the IDs whose
  // age reaches `threshold` (unseen for `threshold` shrink periods), keeping
  // the IDs of pending batches.
  int64_t Shrink(int threshold);

  // Newest batch time of the trained batches (pending ones excluded), or -1
  // before the first batch.
  int64_t newest_timestamp() const;

  // Rows handed out so far: every row the key stage gave an ID is below it.
  int64_t next_row() const {
    std::lock_guard<std::mutex> lock(mu_);
    return rows_.next;
  }

  TableStats Stats() const;

  // Copies the host state at the step boundary out (pending batches undone in
  // the copy), IDs ordered by (row, key) so that equal states export equal
  // arrays, and closes a save epoch. since_epoch == 0 exports every ID;
  // otherwise only IDs changed after that epoch and the IDs removed since (a
  // delta). IDs of pending batches stay marked as changed for the next delta.
  // Tiered tables also export the host-tier values of the exported IDs and
  // the device cache's recency order, each ID where its values are (pending
  // swap plans undone).
  // `delta_chain`: the export belongs to a chain of full and delta saves
  // (mxrec's Saver): from then on the table logs the removal of every ID a
  // save of the chain holds, which the next delta must list.
  Status ExportState(uint32_t since_epoch, bool delta_chain, TableState* state);
  // Forgets removals logged up to `epoch` (after a save of the chain closed it).
  void PruneRemovedLog(uint32_t epoch);
  // Removals logged and not pruned yet.
  int64_t removed_log_size() const;
  // Replaces the whole host state; checks that rows are unique and in range.
  // Tiered tables: also replaces the host tier's rows with the state's tier
  // values. Pending batches (and their swap plans) are dropped: they were
  // planned against the state replaced, and committing one is an error.
  Status ImportState(const TableState& state);

  // Copies out (key, row) of every admitted ID, ordered by row.
  void ExportRows(std::vector<int64_t>* keys, std::vector<int32_t>* rows) const;
  // The same at the step boundary: pending batches undone (IDs they admitted
  // left out, rows they refilled given back to their owners), as ExportState
  // sees the table, without ExportState's epoch or delta bookkeeping.
  Status ExportBoundaryRows(std::vector<int64_t>* keys, std::vector<int32_t>* rows);

  // Tiered tables: the host-tier values of `keys` for tier component
  // `component` (evaluation reads rows off the device in place); found[i] is
  // false, and the row zeros, where the tier holds none.
  Status ReadTier(int component, const int64_t* keys, int64_t n, float* values, bool* found);

  // Whether the table has a host tier (host_capacity > 0).
  bool tiered() const { return cache_ != nullptr; }
  // The host tier, or null in device-only mode.
  HostTier* tier() const { return cache_ != nullptr ? cache_->tier() : nullptr; }
  // Batches planned together in one training step (the table's lookups per
  // step): their IDs are never chosen as swap victims of each other. Batches
  // of later steps need no protection: their swaps run in plan order.
  void SetSwapProtect(uint32_t batches);

 private:
  static constexpr int kShardShift = IdMap::kShardShift;

  // Pending batches, admission and eviction (host_table.cc); Process hands
  // each batch to planner_ under the table's lock.
  //
  // Keys of every pending batch.
  std::vector<int64_t> PendingKeys() const;
  // mu_, taken after Commit's record is applied: the batches committed since
  // the last holder leave pending_ (RetireCommittedLocked). Every method
  // takes the table's lock through it.
  std::unique_lock<std::mutex> Lock() const;
  void RetireCommittedLocked() const;
  // Erases records matching pred, except IDs of pending batches.
  int64_t EraseUnpending(const std::function<bool(const KeyMap&, uint32_t)>& pred);
  // The maps of an empty table (tiered tables: with tier records).
  KeyMap NewMap() const { return IdMap::NewShard(options_.host_capacity > 0); }
  // Newest trained batch time.
  int64_t BoundaryNewest() const;

  // Checkpoint export and import (host_table_state.cc).
  //
  // The state at the step boundary as ExportState sees it (pending batches
  // and swap plans undone), and one exported ID.
  struct Boundary;
  struct ExportedRecord;
  Status ViewBoundary(Boundary* boundary) const;
  // The IDs to export (since_epoch > 0: those changed after it), ordered by
  // (row, key) at the boundary.
  std::vector<ExportedRecord> CollectRecords(const Boundary& boundary, uint32_t since_epoch);
  // The record of ID `key` (shard s, record `index`) at the boundary: false
  // when it is not exported (unknown at the boundary, or unchanged since
  // since_epoch > 0).
  bool BoundaryRecord(const Boundary& boundary, uint32_t since_epoch, int s, int64_t key,
                      uint32_t index, ExportedRecord* out);
  // Sorts `records` by (device row, key): rows -1 first (see CollectRecords).
  static void OrderByRowThenKey(std::vector<ExportedRecord>* records);
  // Tiered tables: in_host flags, the device cache's recency order and the
  // host-tier values of `records`.
  Status ExportTier(const std::vector<ExportedRecord>& records, const Boundary& boundary,
                    TableState* state) const;
  // ExportState's streaming path (record_writer set): the records a chunk at
  // a time, with the host-tier values of each chunk's in_host IDs.
  Status StreamRecords(const Boundary& boundary, uint32_t since_epoch, bool delta_chain,
                       TableState* state);
  struct MapSpot;
  // StreamRecords' pass over the ID map: into `out`, in key order, the spots of
  // the `capacity` smallest keys of the exported records without a device row,
  // among the keys above `after` (all keys when `first`).
  void NextRowless(const Boundary& boundary, uint32_t since_epoch, bool first, int64_t after,
                   size_t capacity, std::vector<MapSpot>* out);
  // IDs of pending batches and of pending swap plans: changed for the next delta.
  void MarkPendingChanged(const Boundary& boundary);
  // ImportState's checks of a TableState, in this order: host-tier flags
  // against the table, array lengths and rows, and (tiered) the host-tier IDs
  // (counted into *host_ids) and the device cache's recency order.
  Status CheckTierFlags(const TableState& state) const;
  Status CheckRows(const TableState& state) const;
  Status CheckTierRows(const TableState& state, int64_t* host_ids) const;
  Status CheckCacheOrder(const TableState& state) const;
  // The state's records in new maps (built aside: a bad checkpoint leaves the
  // table as it was).
  Status BuildMaps(const TableState& state, std::vector<KeyMap>* maps) const;

  // Locking: mu_ serialises everything below (one mutex per table serialises
  // batches), the planners included; the HostTier has its own lock.
  const TableOptions options_;
  mutable std::mutex mu_;
  IdMap ids_;
  DeviceRows rows_;
  Admission admission_;
  uint32_t epoch_ = 1;
  std::vector<std::pair<int64_t, uint32_t>> removed_log_;
  bool track_removals_ = false;  // a delta chain exists (ExportState delta_chain)
  int64_t newest_timestamp_ = -1;
  // Deferred training batches planned and not retired, oldest first (ids
  // increasing); IDs their batches admitted (for evaluation batches); the
  // storage of the last batch retired, which the next deferred batch's journal
  // reuses. All mutable: a const reader retires committed batches first (Lock()).
  mutable std::deque<PendingBatch> pending_;
  mutable PendingAdmitted pending_admitted_;
  mutable PendingBatch spare_;
  // Written under mu_, read by Commit without it: the id of the next deferred batch.
  std::atomic<uint64_t> next_batch_id_{1};
  // Outside mu_: the newest batch id a step committed (Commit), and the first
  // batch id not dropped by ImportState (written under mu_).
  std::atomic<uint64_t> committed_through_{0};
  std::atomic<uint64_t> import_barrier_{1};
  TableStats stats_;
  // Tiered tables only (null otherwise): the device cache over the host tier.
  std::unique_ptr<DeviceCachePlanner> cache_;
  // Plans each batch over ids_, rows_ and cache_ (see batch_planner.h for
  // what it reads and writes); declared last, as it refers to the members above.
  BatchPlanner planner_;
};

}  // namespace mxrec

#endif  // MXREC_ENGINE_HOST_TABLE_H_
