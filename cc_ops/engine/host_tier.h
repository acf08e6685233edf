// The host tier of a table in DDR/SSD mode: the rows (embedding and optimizer
// slots) of admitted IDs that are not in the device cache, and the swap plans
// that the key stage made and the training step has not applied yet.
//
// The key stage decides residency ahead of the step (logical state, kept in
// HostTable); the values move at step time, in plan order, through Swap():
//
//   plan t (key stage):  row r: owner X -> Y   (X to the host tier, Y from it)
//   step t, per component (embedding, then each slot in the optimizer):
//       current = gather(var, rows)             the victims' trained values
//       Swap(rows, current) -> incoming, fresh  X's values stored, Y's returned
//       var[rows] = fresh ? initializer : incoming
//
// Each component keeps its own cursor into the plan queue, so the embedding
// (swapped before the lookup's gather) and the slots (swapped in the
// optimizer) consume the same plans independently; a plan is dropped when
// every registered component has applied it. Plain C++, no TensorFlow.
#ifndef MXREC_ENGINE_HOST_TIER_H_
#define MXREC_ENGINE_HOST_TIER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "ssd_tier.h"
#include "status.h"

namespace mxrec {

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
};

// One batch's cache decisions for one table: device row rows[i] passes from
// out_keys[i] (when has_out[i]) to in_keys[i], whose values come from the host
// tier when from_host[i] and from the initializer otherwise.
struct SwapPlan {
  uint64_t seq = 0;
  std::vector<int32_t> rows;
  std::vector<int64_t> out_keys;
  std::vector<uint8_t> has_out;
  std::vector<int64_t> in_keys;
  std::vector<uint8_t> from_host;
  uint32_t applied = 0;  // bit k: component k applied this plan
  // Host slots of out_keys / in_keys as the first component to apply the plan
  // found them (-1: none), so that later components skip the index lookups.
  // Hints only: checked against the slot's key and liveness before use.
  std::vector<int32_t> out_slots;
  std::vector<int32_t> in_slots;
};

struct TierStats {
  int64_t host_rows = 0;      // IDs whose values are in host memory
  int64_t ssd_rows = 0;       // IDs whose values are on disk
  int64_t host_bytes = 0;     // host memory held by row values (estimate)
  int64_t ssd_file_bytes = 0;
  int64_t swap_in_total = 0;  // rows brought back from the host tier (embedding)
  int64_t swap_out_total = 0; // rows written to the host tier (embedding)
  int64_t fresh_total = 0;    // rows filled by the initializer (new IDs)
  int64_t swap_in_last = 0;   // of the last step's plans
  int64_t swap_out_last = 0;
  int64_t pending_plans = 0;  // planned, not yet applied by every component
  int64_t ssd_compactions = 0;
};

class HostTier {
 public:
  static constexpr int kMaxComponents = 32;
  static constexpr const char* kEmbedding = "embedding";

  explicit HostTier(TierOptions options);

  const TierOptions& options() const { return options_; }

  // Index of the component `name`, registering it on first use. Components
  // registered after plans were queued start at the next plan.
  Status RegisterComponent(const std::string& name, int* index);

  // Queues a plan (the key stage, in batch order). Plans with no rows are not
  // queued: they move nothing.
  void Enqueue(SwapPlan plan);

  // Applies the next plan of `component` to `n` rows: stores current[i]
  // (dim floats) as the value of the row's old owner and fills incoming[i]
  // with the new owner's value, or sets fresh[i] when the initializer must
  // give it. `rows` must be the plan's rows: anything else means the step is
  // out of step with the key stage (a planned batch was dropped).
  Status Swap(int component, const int32_t* rows, int64_t n, const float* current,
              float* incoming, bool* fresh);

  // Values of `keys` still held by the tier for `component` (evaluation reads
  // host rows in place); found[i] is false where the tier has none.
  Status Read(int component, const int64_t* keys, int64_t n, float* values, bool* found);

  // Forgets `key` (eviction): its stored values, and a pending write of them.
  void Erase(int64_t key);

  // Every key the tier holds for `component`, with its values, ordered by key.
  Status Export(int component, std::vector<int64_t>* keys, std::vector<float>* values);

  // Checkpoints. Values of `keys` (each must be in the tier): the registered
  // component names, a mask of the components each key holds, and
  // components.size() * dim floats per key (zeros where the bit is clear).
  Status Gather(const std::vector<int64_t>& keys, std::vector<std::string>* components,
                std::vector<uint32_t>* present, std::vector<float>* values) const;
  // Replaces every row of the tier with `keys` (layout of Gather; components
  // named as in the checkpoint, registered when new) and drops pending plans.
  Status Replace(const std::vector<int64_t>& keys, const std::vector<std::string>& components,
                 const std::vector<uint32_t>& present, const std::vector<float>& values);

  TierStats Stats() const;
  int64_t pending_plans() const;

 private:
  // Host rows live in a slab store: each stored ID owns a slot, found through
  // an open-addressing index (key -> slot); each component keeps its values
  // in fixed-size chunks of kChunkRows slots * dim floats, allocated on first
  // use and reused through a free list of slots, so a swap allocates nothing
  // per row.
  static constexpr int kChunkShift = 12;
  static constexpr int64_t kChunkRows = int64_t{1} << kChunkShift;
  struct IndexEntry {
    int64_t key = 0;
    int32_t slot = -1;  // -1: empty
  };

  uint32_t AllMask() const {
    return components_.size() >= 32 ? ~0u : (1u << components_.size()) - 1;
  }
  int32_t LookupSlot(int64_t key) const;
  // A new slot for `key` (absent from the index), with no component present.
  int32_t InsertSlot(int64_t key);
  // Removes the slot's key from the index and frees the slot.
  void DropSlot(int32_t slot);
  void GrowIndex();
  void ClearStoreLocked();
  float* ValueLocked(int component, int32_t slot);
  const float* ValueAt(int component, int32_t slot) const {
    return chunks_[component][slot >> kChunkShift].get() +
           (slot & (kChunkRows - 1)) * options_.dim;
  }
  // The slot of key, in memory (loaded from disk if it was spilled), or -1.
  int32_t FindLocked(int64_t key, Status* status);
  // Stores `value` as `key`'s row of `component`; *slot_out (if given) gets its slot.
  Status StoreLocked(int64_t key, int component, const float* value,
                     int32_t* slot_out = nullptr);
  // `hint` when it still is key's live slot in memory, else -1.
  int32_t CheckHint(const std::vector<int32_t>& hints, int64_t i, int64_t key) const {
    if (hints.empty()) return -1;
    const int32_t slot = hints[static_cast<size_t>(i)];
    if (slot < 0 || static_cast<size_t>(slot) >= slot_key_.size()) return -1;
    return slot_key_[slot] == key && slot_present_[slot] != 0 ? slot : -1;
  }
  Status RegisterLocked(const std::string& name, int* index);
  Status SpillLocked();

  const TierOptions options_;
  mutable std::mutex mu_;
  std::vector<std::string> components_;
  std::vector<uint64_t> cursor_;  // next plan seq per component
  std::deque<SwapPlan> plans_;
  uint64_t next_seq_ = 0;
  // The slab store.
  std::vector<IndexEntry> index_;
  uint64_t index_mask_ = 0;
  int64_t live_ = 0;                   // stored IDs (slots in use)
  std::vector<int64_t> slot_key_;      // per slot: its ID
  std::vector<uint32_t> slot_present_; // per slot: bit k = component k holds a value
  std::vector<int32_t> free_slots_;
  std::vector<std::vector<std::unique_ptr<float[]>>> chunks_;  // [component][chunk]
  // Memory entries in order of arrival, for spilling the oldest to disk;
  // may hold keys already gone from memory (skipped lazily).
  std::deque<int64_t> arrival_;
  std::unique_ptr<SsdTier> ssd_;
  TierStats stats_;
};

}  // namespace mxrec

#endif  // MXREC_ENGINE_HOST_TIER_H_
