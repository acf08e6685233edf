// What a deferred training batch (planned ahead of its step) changed in its
// table, so that views of the state at the step boundary can undo it. See
// "The step boundary: pending batches" in docs/ARCHITECTURE.md.
#ifndef MXREC_ENGINE_BATCH_JOURNAL_H_
#define MXREC_ENGINE_BATCH_JOURNAL_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <vector>

namespace mxrec {

// One ID of the batch, as it was before the batch.
struct Undo {
  int64_t key;
  int64_t last_seen;
  float count;
  uint32_t epoch;
  uint8_t seen_recently;
  uint8_t inserted;  // the batch created the record
};

struct PendingBatch {
  uint64_t id = 0;
  std::vector<Undo> undo;              // each ID of the batch, as before it
  std::vector<int64_t> admitted;       // IDs the batch gave a row first
  std::vector<int32_t> popped_free;    // rows taken from the free rows, in order
  int64_t fresh_rows = 0;              // rows taken from the never used ones
  int64_t newest_before = -1;          // the table's newest batch time before the batch

  // Empty, keeping the vectors' capacity (HostTable reuses a retired batch's).
  void Clear() {
    undo.clear();
    admitted.clear();
    popped_free.clear();
    fresh_rows = 0;
    newest_before = -1;
  }
};

// The IDs the pending batches admitted, which evaluation reads as unseen (their
// rows are not trained yet). Built from the journals when an evaluation batch
// asks for it, not kept up to date by each deferred batch: a table planned
// ahead by an input pipeline plans many training batches for each evaluation
// batch (often none), and a hash map entry per admitted ID, inserted when its
// batch is planned and erased when it retires, was most of the journal's cost.
class PendingAdmitted {
 public:
  // The pending batches changed (one planned, retired or dropped).
  void Invalidate() { current_ = false; }
  // No batch is pending (ImportState dropped them).
  void clear() {
    keys_.clear();
    current_ = true;
  }
  // Brings the set up to date with `pending` (every pending batch), if it changed.
  void Refresh(const std::deque<PendingBatch>& pending) {
    if (current_) return;
    keys_.clear();
    for (const PendingBatch& batch : pending) {
      keys_.insert(keys_.end(), batch.admitted.begin(), batch.admitted.end());
    }
    std::sort(keys_.begin(), keys_.end());
    current_ = true;
  }
  // As of the last Refresh.
  bool empty() const { return keys_.empty(); }
  bool Contains(int64_t key) const { return std::binary_search(keys_.begin(), keys_.end(), key); }

 private:
  std::vector<int64_t> keys_;  // sorted
  bool current_ = true;
};

}  // namespace mxrec

#endif  // MXREC_ENGINE_BATCH_JOURNAL_H_
