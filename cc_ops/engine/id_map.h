// The ID map of one table and the device rows it hands out: IDs sharded over
// 16 KeyMaps by the top bits of their hash, references to one ID's records,
// and the free and never used device rows. Plain C++, no TensorFlow; guarded
// by the owning HostTable's mutex.
#ifndef MXREC_ENGINE_ID_MAP_H_
#define MXREC_ENGINE_ID_MAP_H_

#include <cstdint>
#include <vector>

#include "key_map.h"

namespace mxrec {

// One ID as the key stage and the device-cache planner handle it: its key
// (the records do not hold it), its record, and (tiered tables) its tier
// record. The pointers hold until the ID is erased: records never move.
struct RecordRef {
  int64_t key = 0;
  KeyRecord* rec = nullptr;  // null: the ID has no record
  TierRecord* tier = nullptr;
};

class IdMap {
 public:
  static constexpr int kNumShards = 16;
  // The top 4 bits of an ID's hash pick its shard, so that the buckets inside
  // a shard use the low ones.
  static constexpr int kShardShift = 60;
  static_assert(kNumShards == 16, "kShardShift assumes 16 shards");

  static int ShardOf(uint64_t hash) { return static_cast<int>(hash >> kShardShift); }
  // A shard of an empty table (tiered tables: with tier records).
  static KeyMap NewShard(bool tiered) { return KeyMap(tiered); }

  explicit IdMap(bool tiered) {
    for (KeyMap& shard : shards_) shard = NewShard(tiered);
  }

  KeyMap& operator[](int s) { return shards_[s]; }
  const KeyMap& operator[](int s) const { return shards_[s]; }
  KeyMap* begin() { return shards_; }
  KeyMap* end() { return shards_ + kNumShards; }
  const KeyMap* begin() const { return shards_; }
  const KeyMap* end() const { return shards_ + kNumShards; }

  RecordRef Ref(int s, int64_t key, uint32_t index) {
    KeyMap& map = shards_[s];
    return RecordRef{key, &map.record(index), map.tiered() ? &map.tier(index) : nullptr};
  }
  RecordRef Find(int64_t key) {
    const uint64_t hash = HashKey(key);
    const int s = ShardOf(hash);
    const uint32_t index = shards_[s].Find(key, hash);
    if (index == KeyMap::kNoRecord) return RecordRef{key, nullptr, nullptr};
    return Ref(s, key, index);
  }

 private:
  KeyMap shards_[kNumShards];
};

// The device rows of a table: every row below `next` has been handed out;
// `free` holds those eviction gave back (reused last in, first out).
struct DeviceRows {
  int64_t device_capacity = 0;  // rows of the device table (device_vocabulary_size)
  int64_t next = 0;  // rows [next, device_capacity) never used
  std::vector<int32_t> free;

  int64_t in_use() const { return next - static_cast<int64_t>(free.size()); }
  // Rows that can be handed out without taking one from its owner.
  int64_t spare() const { return static_cast<int64_t>(free.size()) + (device_capacity - next); }
};

}  // namespace mxrec

#endif  // MXREC_ENGINE_ID_MAP_H_
