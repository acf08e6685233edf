#include "ssd_record_allocator.h"

#include <cstddef>

namespace mxrec {

int64_t SsdRecordAllocator::TakeFrom(int64_t group) {
  uint64_t& word = free_bits_[static_cast<size_t>(group)];
  if (word == 0) return -1;
  const int bit = __builtin_ctzll(word);
  word &= word - 1;
  --free_count_;
  return group * kGroup + bit;
}

int64_t SsdRecordAllocator::PopDense() {
  while (!dense_.empty()) {
    const int64_t group = dense_.back();
    dense_.pop_back();
    // An entry is stale when the group was filled in part since it was listed.
    if (__builtin_popcountll(free_bits_[static_cast<size_t>(group)]) >= kDense) return group;
  }
  return -1;
}

int64_t SsdRecordAllocator::Allocate() {
  if (current_ >= 0) {
    const int64_t record = TakeFrom(current_);
    if (record >= 0) return record;
    current_ = -1;
  }
  const int64_t dense = PopDense();
  if (dense >= 0) {
    current_ = dense;
    return TakeFrom(dense);
  }
  if (next_ < max_records_ && free_count_ * kHoleDivisor <= next_) return next_++;
  if (free_count_ > 0) {
    const int64_t groups = static_cast<int64_t>(free_bits_.size());
    for (int64_t i = 0; i < groups; ++i) {
      const int64_t group = (scan_ + i) % groups;
      if (free_bits_[static_cast<size_t>(group)] != 0) {
        scan_ = group;
        current_ = group;
        return TakeFrom(group);
      }
    }
  }
  if (next_ < max_records_) return next_++;
  return -1;
}

void SsdRecordAllocator::Release(int64_t record) {
  if (record < 0 || record >= next_) return;  // never given out: nothing to free
  const size_t group = static_cast<size_t>(record / kGroup);
  if (group >= free_bits_.size()) {
    free_bits_.resize(static_cast<size_t>((next_ + kGroup - 1) / kGroup), 0);
  }
  uint64_t& word = free_bits_[group];
  const uint64_t bit = uint64_t{1} << (record % kGroup);
  if (word & bit) return;
  word |= bit;
  ++free_count_;
  if (__builtin_popcountll(word) != kDense) return;
  dense_.push_back(static_cast<int64_t>(group));
  // Entries go stale when their groups fill in part and become half free
  // again; the list is rebuilt before it outgrows the groups.
  if (dense_.size() > free_bits_.size() + 64) {
    dense_.clear();
    for (size_t g = 0; g < free_bits_.size(); ++g) {
      if (__builtin_popcountll(free_bits_[g]) >= kDense) dense_.push_back(static_cast<int64_t>(g));
    }
  }
}

void SsdRecordAllocator::Reset(int64_t used) {
  std::vector<uint64_t>().swap(free_bits_);
  std::vector<int64_t>().swap(dense_);
  free_count_ = 0;
  next_ = used;
  current_ = -1;
  scan_ = 0;
}

}  // namespace mxrec
