// What a deferred training batch (planned ahead of its step) changed in its
// table, so that views of the state at the step boundary can undo it. See
// "The step boundary: pending batches" in docs/ARCHITECTURE.md.
#ifndef MXREC_ENGINE_BATCH_JOURNAL_H_
#define MXREC_ENGINE_BATCH_JOURNAL_H_

#include <cstdint>
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
};

}  // namespace mxrec

#endif  // MXREC_ENGINE_BATCH_JOURNAL_H_
