// The host tier of a table in DDR/SSD mode: the rows (embedding and optimizer
// slots) of admitted IDs that are not in the device cache, and the swap plans
// that the key stage made and the training step has not applied yet.
//
// The key stage decides residency ahead of the step (logical state, kept in
// HostTable); the values move at step time, in plan order, through Swap():
//
//   plan t (key stage):  row r: owner X -> Y   (X to host slot s, Y from slot s')
//   step t, per component (embedding, then each slot in the optimizer):
//       Swap: var[r] -> slot s;  slot s' (or disk) -> var[r]  (initializer for new IDs)
//
// Host slots are numbered by the planner (HostTable keeps each ID's slot in its
// record), so a swap needs no lookup by ID: it copies rows between the device
// table and the slots the plan names. A slot read back by plan t is handed
// back to the planner (TakeReleased) once every component applied plan t.
// With an SSD tier the planner also names, per plan, the oldest host slots to
// spill, and the SSD record each goes to; once every component applied the
// plan they are handed to the tier's spill writer, a thread of its own that
// writes them to disk off the step (see SpillLoop). Until a spill is on disk
// its values stay in their slot, which every read (swaps, evaluation, saves)
// uses meanwhile.
//
// Each component keeps its own cursor into the plan queue, so the embedding
// (swapped before the lookup's gather) and the slots (swapped in the
// optimizer) consume the same plans independently; a plan is dropped when
// every registered component has applied it. Plain C++, no TensorFlow.
#ifndef MXREC_ENGINE_HOST_TIER_H_
#define MXREC_ENGINE_HOST_TIER_H_

#include <climits>
#include <cstdint>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "huge_pages.h"
#include "row_format.h"
#include "ssd_tier.h"
#include "status.h"
#include "thread_pool.h"

namespace mxrec {

// Where a tier ID's values are, as TierRecord::host_slot and the plans keep it
// (an int32): a host slot (>= 0), none yet (kNoValues: the ID restarts from
// the initializer), or SSD record r as SsdSlot(r) = -2 - r. kNotInTier (never
// a record: SsdTier::kMaxRecords keeps them above it) marks an ID the tier
// does not hold.
constexpr int32_t kNoValues = -1;
constexpr int32_t kNotInTier = INT32_MIN;
inline bool IsSsdSlot(int32_t slot) { return slot <= -2 && slot != kNotInTier; }
inline int32_t SsdSlot(int64_t record) { return static_cast<int32_t>(-2 - record); }
inline int64_t SsdRecordOf(int32_t slot) { return -2 - int64_t{slot}; }

struct TierOptions {
  // The user's table name; every error message carries it.
  std::string name;
  int64_t dim = 0;
  // Rows kept in host memory (`host_vocabulary_size`).
  int64_t host_capacity = 0;
  // Rows kept on disk under `ssd_path` once host memory is full
  // (`ssd_vocabulary_size`); 0 = no SSD tier.
  int64_t ssd_capacity = 0;
  std::string ssd_path;
  // How the tiers store the embedding and the optimizer slots
  // (`storage_dtype`, `slot_dtype`); swaps and checkpoints pass float32.
  ElementType embedding_type = ElementType::kFloat32;
  ElementType slot_type = ElementType::kFloat32;
};

// One batch's cache decisions for one table: device row rows[i] passes from
// out_keys[i] (when has_out[i]; its values go to host slot out_slots[i]) to
// in_keys[i], whose values come from in_slots[i] (a host slot or an SSD
// record, as TierRecord::host_slot) when from_host[i] and from the
// initializer otherwise. spill_keys / spill_slots / spill_records: IDs whose
// host slots go to those SSD records once the plan is applied.
struct SwapPlan {
  uint64_t seq = 0;
  std::vector<int32_t> rows;
  std::vector<int64_t> out_keys;
  std::vector<uint8_t> has_out;
  std::vector<int32_t> out_slots;
  std::vector<int64_t> in_keys;
  std::vector<uint8_t> from_host;
  std::vector<int32_t> in_slots;
  std::vector<int64_t> spill_keys;
  std::vector<int32_t> spill_slots;
  std::vector<int32_t> spill_records;
  uint32_t applied = 0;  // bit k: component k applied this plan
};

struct TierStats {
  int64_t host_rows = 0;      // IDs whose values are in host memory
  int64_t ssd_rows = 0;       // IDs whose values are on disk
  int64_t host_bytes = 0;     // host memory of rows, slots and SSD records' live bits (estimate)
  // Bytes of one ID's values in a host slot: the embedding and every
  // registered slot, each dim values of its element type.
  int64_t host_row_bytes = 0;
  int64_t ssd_file_bytes = 0;
  int64_t swap_in_total = 0;  // rows brought back from the host tier (embedding)
  int64_t swap_out_total = 0; // rows written to the host tier (embedding)
  int64_t fresh_total = 0;    // rows filled by the initializer (new IDs)
  int64_t swap_in_last = 0;   // of the last step's plans
  int64_t swap_out_last = 0;
  int64_t pending_plans = 0;  // planned, not yet applied by every component
  int64_t ssd_record_bytes = 0;  // bytes of one SSD record (the file holds whole records)
  int64_t ssd_read_ahead_records = 0;  // records hinted to the kernel ahead of their plans
  int64_t ssd_read_ahead_runs = 0;     // runs of pages those hints asked for
  // Spills written to the SSD tier: records, their runs of consecutive records
  // (each written in calls of at most 16 KiB), their bytes, and the distinct
  // 4 KiB pages each spill's runs touched (what the page cache writes back).
  int64_t ssd_spilled_records = 0;
  int64_t ssd_write_runs = 0;
  int64_t ssd_write_bytes = 0;
  int64_t ssd_write_pages = 0;

  // The one list of the statistics by name: fn(name, value) for each, in
  // this order (the pybind module's tier_stats dict is filled from it).
  template <typename Fn>
  void ForEachField(Fn&& fn) const {
    fn("host_rows", host_rows);
    fn("ssd_rows", ssd_rows);
    fn("host_bytes", host_bytes);
    fn("host_row_bytes", host_row_bytes);
    fn("ssd_file_bytes", ssd_file_bytes);
    fn("ssd_record_bytes", ssd_record_bytes);
    fn("swap_in_total", swap_in_total);
    fn("swap_out_total", swap_out_total);
    fn("fresh_total", fresh_total);
    fn("swap_in_last", swap_in_last);
    fn("swap_out_last", swap_out_last);
    fn("pending_plans", pending_plans);
    fn("ssd_read_ahead_records", ssd_read_ahead_records);
    fn("ssd_read_ahead_runs", ssd_read_ahead_runs);
    fn("ssd_spilled_records", ssd_spilled_records);
    fn("ssd_write_runs", ssd_write_runs);
    fn("ssd_write_bytes", ssd_write_bytes);
    fn("ssd_write_pages", ssd_write_pages);
  }
};

// Checkpoint import in chunks: points *present at n masks and *values at
// n * components * dim floats (the layout of HostTier::Gather) of the IDs
// begin, ..., begin + n - 1 of the import's order, held by the reader until
// its next call. Chunks are asked for in order. A restore so holds one chunk
// of values at a time, and reads it where the reader put it (no copy).
using TierValueReader = std::function<Status(int64_t begin, int64_t n, const uint32_t** present,
                                             const float** values)>;

// One chunk of a restore's host-tier IDs: n keys, masks and rows of values
// (as TierValueReader's), each held by the reader until its next call.
struct TierChunk {
  const int64_t* keys = nullptr;
  const uint32_t* present = nullptr;
  const float* values = nullptr;
};
// Fills *chunk with the IDs begin, ..., begin + n - 1; asked for in order.
using TierChunkReader = std::function<Status(int64_t begin, int64_t n, TierChunk* chunk)>;
// Where a restore put ID i (as TierRecord::host_slot; -1: no values, the ID
// restarts from the initializer). Called once per ID, in order, during the
// call to the reader's chunk that holds it is current.
using TierSlotSink = std::function<void(int64_t i, int32_t slot)>;

class HostTier {
 public:
  static constexpr int kMaxComponents = 32;
  static constexpr const char* kEmbedding = "embedding";

  explicit HostTier(TierOptions options);
  ~HostTier();
  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  const TierOptions& options() const { return options_; }

  // Index of the component `name`, registering it on first use. Components
  // registered after plans were queued start at the next plan.
  Status RegisterComponent(const std::string& name, int* index);
  // The registered component names, in index order (the embedding first).
  std::vector<std::string> components() const;

  // Queues a plan (the key stage, in batch order). Plans with no rows and no
  // spills are not queued: they move nothing. The SSD records the plan reads
  // back or rewrites are handed to the read-ahead thread (ReadAheadLoop), so
  // their pages load while the steps before this plan's run.
  void Enqueue(SwapPlan plan);

  // Moves the host slots and the SSD records freed since the last call (read
  // back by applied plans, spilled, or erased) onto *free_slots and
  // *free_records, for the planner to reuse. A record is freed only once no
  // plan reads it and no spill still to be written targets it for its ID.
  void TakeReleased(std::vector<int32_t>* free_slots, std::vector<int32_t>* free_records);

  // Applies the next plan of `component` to `n` rows: stores current[i]
  // (dim floats, exact in the component's element type) as the value of the
  // row's old owner and fills incoming[i]
  // with the new owner's value, or sets fresh[i] (and zeros) when the
  // initializer must give it. `rows` must be the plan's rows: anything else
  // means the step is out of step with the key stage (a planned batch was
  // dropped).
  // With `pool`, a large plan's rows are copied on its threads.
  Status Swap(int component, const int32_t* rows, int64_t n, const float* current,
              float* incoming, bool* fresh, ThreadPool* pool = nullptr);

  // Swap() on the device table itself, for a table whose buffer the host can
  // reach (a CPU variable of `table_rows` rows): the victims' values are read
  // at table[rows[i]] and their new owners' values written there; rows of new
  // IDs (fresh[i]) are left for the caller to fill.
  Status SwapInPlace(int component, const int32_t* rows, int64_t n, float* table,
                     int64_t table_rows, bool* fresh, ThreadPool* pool = nullptr);

  // Plans of at least this many rows are split over the pool's threads
  // (tests lower it to run the parallel path on small tables).
  static void SetParallelMinRows(int64_t rows);
  // Tests: the spill writer sleeps this long before each write (off the lock),
  // so that swaps, saves, eviction and restores meet spills still pending.
  static void SetSpillDelayForTesting(int64_t microseconds);

  // Values of `keys` still held by the tier for `component` (evaluation reads
  // host rows in place); slots[i] is where the key's values are (as
  // TierRecord::host_slot; kNotInTier: not in the tier). found[i] is false
  // where the tier has none.
  Status Read(int component, const int64_t* keys, const int32_t* slots, int64_t n,
              float* values, bool* found);

  // Forgets `key` (eviction), whose values are at `slot` (as
  // TierRecord::host_slot): its stored values, and a pending write of them.
  void Erase(int64_t key, int32_t slot);

  // Every key the tier holds for `component`, with its values, ordered by key.
  Status Export(int component, std::vector<int64_t>* keys, std::vector<float>* values);

  // Checkpoints. Values of `keys` (at `slots`, as TierRecord::host_slot): the
  // registered component names, a mask of the components each key holds, and
  // components.size() * dim floats per key (zeros where the bit is clear).
  Status Gather(const std::vector<int64_t>& keys, const std::vector<int32_t>& slots,
                std::vector<std::string>* components, std::vector<uint32_t>* present,
                std::vector<float>* values) const;
  // Replaces every row of the tier with the `count` IDs that `reader` gives a
  // chunk of up to `chunk_rows` at a time (layout of Gather; components named
  // as in the checkpoint, registered when new) and drops pending plans. The
  // first host_capacity IDs with values get host slots 0, 1, ...; the rest go
  // to a new SSD file, records 0, 1, ..., written a chunk at a time.
  // placed(i, slot) tells where ID i went. Nothing here holds memory per ID
  // beyond the tier's own: the values in memory at once are the reader's
  // chunk and a few MiB of SSD records. On any error (the SSD file cannot be
  // written, memory runs out, the reader fails) the tier is left as it was.
  Status ReplaceFrom(int64_t count, const std::vector<std::string>& components,
                     const TierChunkReader& reader, int64_t chunk_rows,
                     const TierSlotSink& placed);

  TierStats Stats() const;
  int64_t pending_plans() const;

  // Copies of the plans queued and not yet applied by every component, oldest
  // first; *partly_applied is set when some component applied one already (a
  // step in progress).
  void PendingPlans(std::vector<SwapPlan>* plans, bool* partly_applied);

 private:
  // Host rows live in a slab store: each component keeps its values in
  // chunks of chunk_rows_ slots * dim values of its element type (layout_;
  // at most 2 MiB, aligned so that the
  // kernel may back them with huge pages: a swap touches thousands of random
  // slots, and small pages would make most of those touches TLB misses),
  // allocated on first use.
  struct ChunkFree {
    void operator()(char* chunk) const { std::free(chunk); }
  };
  using Chunk = std::unique_ptr<char, ChunkFree>;
  Chunk AllocateChunk(int component) const;
  int64_t ChunkBytes(int component) const {
    return chunk_rows_ * layout_.ComponentBytes(component);
  }
  // The dim values of `slot` for `component` in the chunk table *table,
  // allocating its chunk if needed (throws AllocationError).
  char* ValueIn(std::vector<std::vector<Chunk>>* table, int component, int32_t slot) const;
  // Stores the dim floats `in` at `out`, the slot value of `component`
  // (exact: a swap's values left a device variable of the element type), and
  // reads them back; Store returns false for a value the type would round.
  bool Store(int component, const float* in, char* out) const {
    return EncodeRow(layout_.type(component), in, options_.dim, out);
  }
  void Load(int component, const char* in, float* out) const {
    DecodeRow(layout_.type(component), in, options_.dim, out);
  }
  // kInternal: a swap brought `component` a value of `key` that its element
  // type cannot hold exactly.
  Status NotRepresentable(int component, int64_t key) const;
  // kResourceExhausted: no memory for a chunk of `component_name`.
  Status ChunkOutOfMemory(const std::string& component_name) const;
  struct SlotMeta {
    int64_t key = 0;
    uint32_t present = 0;  // bit k: component k holds a value in the slot
  };

  uint32_t AllMask() const {
    return components_.size() >= 32 ? ~0u : (1u << components_.size()) - 1;
  }
  // Swap and SwapInPlace: current(i) / incoming(i) point at row i's dim floats
  // before and after the swap (they may be the same row).
  template <typename CurrentRow, typename IncomingRow>
  Status SwapRows(int component, const int32_t* rows, int64_t n, CurrentRow current,
                  IncomingRow incoming, bool* fresh, ThreadPool* pool);
  // SwapRows' steps: the plan the step of `component` applies next (plans
  // with spills only are applied on the way), after checking that its rows
  // are `rows`; the victims' values into their host slots; the arriving IDs'
  // values from their host slots or from disk (fresh[i]: none). The copy
  // loops run in `parts` parts on `pool`.
  Status NextPlanLocked(int component, const int32_t* rows, int64_t n, SwapPlan** next);
  template <typename CurrentRow>
  Status StoreVictimsLocked(int component, const SwapPlan& plan, CurrentRow current,
                            ThreadPool* pool, int64_t parts, int64_t* outs);
  template <typename IncomingRow>
  Status LoadArrivalsLocked(int component, const SwapPlan& plan, IncomingRow incoming,
                            bool* fresh, ThreadPool* pool, int64_t parts, int64_t* ins);
  // Finishes and drops the plans at the queue's front that every component
  // applied.
  Status RetireAppliedLocked();
  // The background spill writer. FinishPlanLocked queues a plan's live
  // spills as a SpillJob; SpillLoop (its own thread, started with the first
  // job) takes one job at a time: under mu_ it encodes the slots' values
  // into the records the planner gave them (BeginAppend), writes without the
  // lock, then under mu_ again marks live the records whose spill is still
  // pending (an ID erased or read back meanwhile is skipped: its record was
  // freed then, and is rewritten only by a later job), drops their
  // pending_spills_ entries and frees the slots. A failed write keeps the
  // values in their slots (the IDs stay readable and saved from there) and
  // is reported by the next swap.
  struct SpillJob {
    uint64_t seq = 0;
    std::vector<int64_t> keys;
    std::vector<int32_t> slots;
    std::vector<int32_t> records;
  };
  void SpillLoop();
  Status WriteSpill(const SpillJob& job, std::unique_lock<std::mutex>* lock);
  // Waits, with mu_ held through *lock, until at most `queued` jobs wait and,
  // when `queued` is 0, none is being written.
  void WaitSpills(std::unique_lock<std::mutex>* lock, size_t queued) const;
  // Whether a queued, not yet written spill of `key` by plan `seq` from `slot`
  // is still wanted.
  bool SpillPending(int64_t key, uint64_t seq, int32_t slot) const;
  // The value of `key` for `component` kept for a plan of sequence `seq`:
  // from a slot whose spill to disk is still pending, else from SSD record
  // `record` (it stays there until every component applied the plan). With
  // `strict`, a record that does not hold the key is an error (the plans'
  // reads); without, the key is not found (evaluation, which reads slots
  // taken under the table's lock after releasing it).
  Status ReadSpilledLocked(int component, int64_t key, int64_t record, uint64_t seq, bool strict,
                           float* out, bool* found);
  // Frees SSD record `record` for the planner to reuse.
  void ReleaseRecordLocked(int64_t record);
  // Every component applied `plan`: free the slots it read back, write its
  // spills to disk.
  Status FinishPlanLocked(const SwapPlan& plan);
  void ReleaseLocked(int32_t slot);
  void EnsureSlotsLocked(int64_t count);
  // The dim values of `slot` for `component`, allocating its chunk if needed.
  char* ValueLocked(int component, int32_t slot);
  // Whether the chunk holding `slot` exists for `component`.
  bool HasChunk(int component, int32_t slot) const {
    const size_t chunk = static_cast<size_t>(slot >> chunk_shift_);
    return chunk < chunks_[component].size() && chunks_[component][chunk] != nullptr;
  }
  // The dim values of `slot` for `component`, whose chunk exists.
  char* ValueAt(int component, int32_t slot) const {
    return chunks_[component][slot >> chunk_shift_].get() +
           (slot & (chunk_rows_ - 1)) * layout_.ComponentBytes(component);
  }
  bool HasValue(int component, int32_t slot) const {
    return static_cast<size_t>(slot) < meta_.size() &&
           (meta_[slot].present & (1u << component)) != 0;
  }
  Status OpenSsdLocked();
  // The read-ahead thread: takes the records of one queued plan at a time and
  // hints them through the current SSD file's SsdReadAhead (ahead_target_),
  // with no lock of the tier held, so neither the step nor the spill writer
  // waits for it. Plans hinted too late for their step only cost reads the
  // step would have made anyway; a backlog beyond kMaxAheadJobs drops the
  // oldest plans' hints (their steps are the nearest, already reading).
  void ReadAheadLoop();
  // Points the read-ahead at ssd_'s file (none without one). Under mu_.
  void SetReadAheadTargetLocked();
  Status ReplaceLocked(int64_t count, const std::vector<std::string>& components,
                       const TierChunkReader& reader, int64_t chunk_rows,
                       const TierSlotSink& placed);
  // ReplaceLocked's steps: the tier's new contents, built aside (the
  // checkpoint's components mapped to this tier's, then the IDs' values in
  // new host slots up to host_capacity and in SSD records beyond), and the
  // swap that installs them once nothing can fail.
  struct Rebuilt;
  Status MapComponents(const std::vector<std::string>& components, Rebuilt* next) const;
  Status FillAside(int64_t count, const std::vector<std::string>& components,
                   const TierChunkReader& reader, int64_t chunk_rows, const TierSlotSink& placed,
                   Rebuilt* next) const;
  Status FillChunk(const TierChunk& chunk, int64_t begin, size_t n,
                   const std::vector<std::string>& components, const TierSlotSink& placed,
                   int32_t* next_slot, Rebuilt* next) const;
  Status StoreAside(int32_t slot, int64_t key, uint32_t present, const float* row,
                    const std::vector<std::string>& components, Rebuilt* next) const;
  // Writes the SSD records of the chunk's IDs at `at` (numbered from
  // `first`), encoded straight from the chunk's rows.
  Status WriteAside(const TierChunk& chunk, const std::vector<uint32_t>& at, int64_t first,
                    const std::vector<std::string>& components, Rebuilt* next) const;
  void InstallLocked(Rebuilt* next);
  // Moves the plans queued by Enqueue into plans_ (numbering them), so that
  // the key stage never waits for a swap in progress to queue its plan.
  void DrainLocked();
  Status RegisterLocked(const std::string& name, int* index);

  const TierOptions options_;
  const RowLayout layout_;
  mutable std::mutex mu_;  // everything below but what queue_mu_ guards
  // The hand-over between the key stage and the step: plans queued and not
  // yet drained, and slots freed and not yet taken. Taken inside mu_ when
  // both are held.
  mutable std::mutex queue_mu_;
  std::vector<SwapPlan> incoming_;
  std::vector<int32_t> released_;
  std::vector<int32_t> released_records_;
  std::vector<std::string> components_;
  std::vector<uint64_t> cursor_;  // next plan seq per component
  std::deque<SwapPlan> plans_;
  uint64_t next_seq_ = 0;
  std::vector<SlotMeta, HugePageAllocator<SlotMeta>> meta_;
  int64_t live_ = 0;  // slots holding a value of some component
  int chunk_shift_ = 0;
  int64_t chunk_rows_ = 0;
  std::vector<std::vector<Chunk>> chunks_;  // [component][chunk]
  // Spills queued by plans not yet applied: key -> (plan seq, slot), oldest first.
  std::unordered_map<int64_t, std::vector<std::pair<uint64_t, int32_t>>> pending_spills_;
  std::unique_ptr<SsdTier> ssd_;
  TierStats stats_;
  // The spill writer's state, under mu_: jobs queued, whether one is being
  // written, the first write error not yet reported, the stop request.
  std::deque<SpillJob> spill_jobs_;
  bool spill_busy_ = false;
  bool spill_stop_ = false;
  Status spill_error_;
  std::condition_variable spill_work_;          // a job queued, or stop
  mutable std::condition_variable spill_done_;  // a job finished
  std::thread spill_writer_;
  // The read-ahead's state, under ahead_mu_ (a leaf lock: nothing else is
  // taken while holding it): record lists of queued plans, the file they are
  // hinted on, the stop request and the counts for Stats().
  static constexpr size_t kMaxAheadJobs = 8;
  mutable std::mutex ahead_mu_;
  std::condition_variable ahead_work_;
  std::deque<std::vector<int64_t>> ahead_jobs_;
  std::shared_ptr<SsdReadAhead> ahead_target_;
  bool ahead_stop_ = false;
  int64_t ahead_records_ = 0;
  int64_t ahead_runs_ = 0;
  std::thread ahead_thread_;
};

}  // namespace mxrec

#endif  // MXREC_ENGINE_HOST_TIER_H_
