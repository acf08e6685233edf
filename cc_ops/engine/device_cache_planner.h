// The device-cache planner of a tiered table (host_vocabulary_size > 0): the
// device table is a cache of device_vocabulary_size rows over the host tier.
// The planner owns which ID each device row holds, the recency list that
// picks swap victims, the host slot numbers of the IDs in the host tier, its
// spills to the SSD tier and their record numbers in the SSD file, and the
// HostTier that stores the values. It
// hands device rows to a training batch's arriving IDs and queues the swap
// plan. See "Host and SSD tiers" in docs/ARCHITECTURE.md.
//
// Locking: the planner has no lock of its own; every call runs under its
// HostTable's mutex (one mutex per table serialises batches). The HostTier
// it owns has its own lock (its swaps run from the training step's kernels).
#ifndef MXREC_ENGINE_DEVICE_CACHE_PLANNER_H_
#define MXREC_ENGINE_DEVICE_CACHE_PLANNER_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "batch_journal.h"
#include "host_tier.h"
#include "id_map.h"
#include "ssd_record_allocator.h"
#include "status.h"

namespace mxrec {

struct BatchPlan;
struct TableOptions;
struct TableState;

// Where an ID's values are at the step boundary.
struct Physical {
  int32_t row = -1;
  uint8_t in_host = 0;
  int32_t host_slot = -1;
};

class DeviceCachePlanner {
 public:
  // `ids` and `rows` are the table's ID map and device rows, which outlive
  // the planner (the planner moves IDs between device rows and the tier).
  DeviceCachePlanner(const TableOptions& options, IdMap* ids, DeviceRows* rows);

  HostTier* tier() const { return tier_.get(); }
  // Admitted IDs whose values are in the host (or SSD) tier.
  int64_t tier_ids() const { return tier_ids_; }
  // Batches planned together in one training step (the table's lookups per
  // step): their IDs are never chosen as swap victims of each other.
  void SetSwapProtect(uint32_t batches);

  // A training batch starts: the stamp that marks the rows it uses.
  void StartBatch() {
    if (++stamp_ == 0) {
      std::fill(row_stamp_.begin(), row_stamp_.end(), 0);
      stamp_ = 1;
    }
  }
  // An ID of the training batch has device row `row`: it becomes the most
  // recently used. Runs once per distinct ID, so inline.
  void Touch(int32_t row) {
    row_stamp_[row] = stamp_;
    LruUnlink(row);
    LruPushTail(row);
  }
  // The admission count of `row`'s owner changed (kept for victim choice).
  void SetCount(int32_t row, float count) { row_count_[row] = count; }

  // Hands device rows to `need` (admitted IDs without one, in order; their
  // indexes in unique_rows are `slots`), choosing victims among rows no batch
  // of this step uses, and queues the swap plan. Victims and arrivals get
  // save epoch `epoch`; plan->new_ids counts the IDs admitted; a deferred
  // batch's `journal` records the rows taken and the IDs admitted. On an
  // error nothing has changed.
  Status AssignRows(const std::vector<RecordRef>& need, const std::vector<int32_t>& slots,
                    uint32_t epoch, BatchPlan* plan, PendingBatch* journal);

  // Eviction: device row `row` loses its owner.
  void ReleaseRow(int32_t row) { LruUnlink(row); }
  // Eviction: an ID in the tier (at `host_slot`, as TierRecord's) is removed.
  void EraseTierId(int64_t key, int32_t host_slot);

  // IDs that pending swap plans moved: where their values still are. `row_owner`
  // (optional): each row a pending plan refilled -> its owner at the boundary,
  // or nullopt where the row was free. `component` >= 0: the view of that
  // component's values (plans it applied already are not undone); -1: of all
  // components, which fails while a plan is applied in part (inside a step).
  Status PhysicalView(std::unordered_map<int64_t, Physical>* physical,
                      std::unordered_map<int32_t, std::optional<int64_t>>* row_owner,
                      int component) const;
  // Where the values of `keys` are at the step boundary for tier component
  // `component` (as TierRecord::host_slot; kNotInTier where the tier holds
  // none): what HostTier::Read reads.
  Status HostSlots(int component, const int64_t* keys, int64_t n, std::vector<int32_t>* slots);

  // Checkpoints. The device cache's recency order at the step boundary
  // (rows below `next_row` not in `unowned`), into state->lru_rows/lru_ages.
  void ExportRecency(int64_t next_row, const std::unordered_set<int32_t>& unowned,
                     TableState* state) const;
  // Replaces the tier's values with the state's, renumbering host slots into
  // the new maps' tier records of the state's `host_ids` host-tier IDs (its
  // in_host ones, in order), and rebuilds the recency list. The state's
  // columns are read in place a chunk at a time: nothing is held per ID
  // beyond the new maps and the tier. Fails, changing nothing but the new
  // maps, only if the tier refuses the values.
  Status Restore(const TableState& state, int64_t host_ids, std::vector<KeyMap>* maps);

 private:
  // Records are prefetched this many places ahead of their use.
  static constexpr int64_t kAhead = 8;

  // The scratch of one AssignRows call, and the device row one arriving ID
  // gets (with what leaves it).
  struct TierBatch;
  struct RowGrant;
  // Whether `need` fits: in the table's tiers, and in the device rows that
  // the step's batches leave to victims.
  Status CheckRoom(const std::vector<RecordRef>& need) const;
  // Takes `count` victims off the recency list, in the order they are used.
  Status PickVictims(int64_t count, TierBatch& t);
  // A free row, else a never used one, else the next victim (its owner moves
  // to a host slot). TakeDeviceRow, MoveToHost and PlaceArrival run once per
  // arriving ID: they are inline, defined in the one file that calls them,
  // because the -fPIC build would keep a plain member function out of line.
  inline RowGrant TakeDeviceRow(TierBatch& t, const RecordRef& id);
  inline void MoveToHost(const RecordRef& victim, uint32_t epoch);
  // Gives `id` the granted row, at index `slot` of unique_rows, and adds the
  // row's swap to the plan.
  inline void PlaceArrival(const RecordRef& id, const RowGrant& grant, int32_t slot, TierBatch& t,
                           BatchPlan* plan);
  int32_t PickVictim();
  // The recency list (head: least recently used): `row` taken off it, or put
  // back at one end.
  void LruUnlink(int32_t row) {
    const int32_t prev = lru_prev_[row];
    const int32_t next = lru_next_[row];
    if (prev >= 0) {
      lru_next_[prev] = next;
    } else {
      lru_head_ = next;
    }
    if (next >= 0) {
      lru_prev_[next] = prev;
    } else {
      lru_tail_ = prev;
    }
    lru_prev_[row] = lru_next_[row] = -1;
  }
  void LruPushTail(int32_t row) {
    lru_prev_[row] = lru_tail_;
    lru_next_[row] = -1;
    if (lru_tail_ >= 0) {
      lru_next_[lru_tail_] = row;
    } else {
      lru_head_ = row;
    }
    lru_tail_ = row;
  }
  void LruPushHead(int32_t row);
  int32_t AllocHostSlot();
  // Chooses the oldest host-resident IDs to go to disk while host memory is
  // over host_vocabulary_size (SSD tier only), adding them to `plan`.
  void PlanSpills(SwapPlan* plan);
  // The recency list from the state (rows keep their order and their ages in
  // batches), and each device row's owner in the new maps; returns the batch
  // stamp to continue from.
  uint32_t RebuildRecency(const TableState& state, std::vector<KeyMap>* maps);
  // Loads the records of `row`'s owner, which is about to leave the row.
  void PrefetchOwner(int32_t row) const {
    __builtin_prefetch(row_owner_[row].rec, 1);
    __builtin_prefetch(row_owner_[row].tier, 1);
  }

  const TableOptions& options_;
  IdMap* const ids_;
  DeviceRows* const rows_;
  std::unique_ptr<HostTier> tier_;
  uint32_t stamp_ = 0;  // training batches planned
  // The owner of each device row (its ID and records: a victim's records
  // need no lookup by ID; records never move, and a row whose owner is
  // erased leaves the recency list until it is handed out again), the batch
  // stamp that last used it, its owner's admission count (victim choice), and
  // a recency list of owned rows (head: least recently used), which is also
  // ordered by stamp.
  std::vector<RecordRef> row_owner_;
  std::vector<uint32_t> row_stamp_;
  std::vector<float> row_count_;
  std::vector<int32_t> lru_prev_;
  std::vector<int32_t> lru_next_;
  int32_t lru_head_ = -1;
  int32_t lru_tail_ = -1;
  int64_t tier_ids_ = 0;
  // Host slots, numbered by this planner (HostTier stores the values): free
  // ones, the next never used one, IDs holding one, and (SSD tier) the order
  // in which IDs took theirs, oldest first, for spilling; entries whose ID
  // no longer holds that slot are skipped.
  std::vector<int32_t> free_host_slots_;
  int32_t next_host_slot_ = 0;
  // SSD records, numbered by this planner so that a spill's records lie
  // together (see SsdRecordAllocator), and the scratch that takes the records
  // the tier freed.
  SsdRecordAllocator ssd_records_{SsdTier::kMaxRecords};
  std::vector<int32_t> freed_records_;
  int64_t host_resident_ = 0;
  std::deque<std::pair<int64_t, int32_t>> host_arrival_;
  uint32_t swap_protect_ = 1;
};

}  // namespace mxrec

#endif  // MXREC_ENGINE_DEVICE_CACHE_PLANNER_H_
