// Admission counts shared by several tables (USE_COMBINE_FAAE): an ID's
// occurrences in any of the tables count towards its admission in each.
#ifndef MXREC_ENGINE_SHARED_COUNTS_H_
#define MXREC_ENGINE_SHARED_COUNTS_H_

#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace mxrec {

class SharedCounts {
 public:
  static constexpr int kNumShards = 16;

  // Adds `weight` to key's count and returns the new total.
  float Add(int64_t key, uint64_t hash, float weight) {
    Shard& shard = shards_[hash % kNumShards];
    std::lock_guard<std::mutex> lock(shard.mu);
    return shard.counts[key] += weight;
  }

  // Forgets key's count: an evicted ID starts counting again from zero.
  void Erase(int64_t key, uint64_t hash) {
    Shard& shard = shards_[hash % kNumShards];
    std::lock_guard<std::mutex> lock(shard.mu);
    shard.counts.erase(key);
  }

 private:
  struct Shard {
    std::mutex mu;
    std::unordered_map<int64_t, float> counts;
  };
  Shard shards_[kNumShards];
};

}  // namespace mxrec

#endif  // MXREC_ENGINE_SHARED_COUNTS_H_
