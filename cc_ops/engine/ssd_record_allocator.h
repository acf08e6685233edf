// The record numbers of an SSD tier's file, handed out so that a spill's
// records lie together: a spill writes each run of consecutive records with
// one write, and what the disk finally writes is the pages those writes
// dirtied. A record freed (its ID read back or evicted) lies among live ones;
// filling such holes one by one dirties a whole page (4 KiB) for each record
// of a few hundred bytes, and needs the page read first where it is not in
// memory. So the allocator hands out, in this order:
//   1. records of a group that is at least half free (groups of 64 records,
//      one word of the free bitmap), all of the group's free records in turn;
//   2. never used records at the file's end, while the free records are at
//      most a quarter of the records given out (the holes' share of the file,
//      so the file holds at most 4/3 of its live rows);
//   3. free records, lowest first from a cursor that wraps around;
//   4. never used records (no free one is left), up to SsdTier::kMaxRecords.
// RAM: one bit per record of the file, and a list of the groups that became
// half free.
#ifndef MXREC_ENGINE_SSD_RECORD_ALLOCATOR_H_
#define MXREC_ENGINE_SSD_RECORD_ALLOCATOR_H_

#include <cstdint>
#include <vector>

namespace mxrec {

class SsdRecordAllocator {
 public:
  // Records per group, and the free ones that make a group worth filling.
  static constexpr int64_t kGroup = 64;
  static constexpr int kDense = 32;
  // Never used records are given out while free ones are at most
  // 1 / kHoleDivisor of all given out.
  static constexpr int64_t kHoleDivisor = 4;

  // `max_records`: record numbers are below it.
  explicit SsdRecordAllocator(int64_t max_records) : max_records_(max_records) {}

  // A free record, or the next never used one; -1 when max_records are in use.
  int64_t Allocate();
  // `record` (given out before) is free again. A record freed twice counts once.
  void Release(int64_t record);
  // Forgets every free record; records [0, used) are in use (a restore).
  void Reset(int64_t used);

  // Records given out at some point (the file's extent in records).
  int64_t used() const { return next_; }
  int64_t free_count() const { return free_count_; }
  // Bytes of RAM the allocator holds.
  int64_t ram_bytes() const {
    return static_cast<int64_t>(free_bits_.capacity() * sizeof(uint64_t) +
                                dense_.capacity() * sizeof(int64_t));
  }

 private:
  // Takes the lowest free record of group `group`; -1 if it has none.
  int64_t TakeFrom(int64_t group);
  // The next group that is at least half free, taken off dense_; -1 if none.
  int64_t PopDense();

  const int64_t max_records_;
  std::vector<uint64_t> free_bits_;  // bit r % 64 of word r / 64: record r is free
  std::vector<int64_t> dense_;       // groups that became half free (may be stale)
  int64_t free_count_ = 0;
  int64_t next_ = 0;           // never used records start here
  int64_t current_ = -1;       // the group being filled (step 1 or 3)
  int64_t scan_ = 0;           // step 3's cursor, a group
};

}  // namespace mxrec

#endif  // MXREC_ENGINE_SSD_RECORD_ALLOCATOR_H_
