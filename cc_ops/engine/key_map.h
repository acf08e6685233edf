// An open-addressing hash map from int64 feature IDs to their host records.
// Every int64 value is a valid ID, so occupancy is kept in the record rather
// than in a reserved key value. Linear probing with backward-shift deletion.
#ifndef MXREC_ENGINE_KEY_MAP_H_
#define MXREC_ENGINE_KEY_MAP_H_

#include <cstdint>
#include <vector>

#include "huge_pages.h"

namespace mxrec {

// What the host knows of one ID.
struct KeyRecord {
  int64_t key = 0;
  int64_t last_seen = 0;  // timestamp of the last training batch that held it
  float count = 0.0f;     // weighted occurrences, for admission
  int32_t row = -1;       // device row, or -1 while not admitted
  // Per-batch scratch used to deduplicate: the batch stamp that last touched
  // this record and the record's index among that batch's unique IDs.
  uint32_t stamp = 0;
  int32_t local = 0;
  uint32_t epoch = 0;  // save epoch of the last change, for delta checkpoints
  uint8_t used = 0;
  uint16_t age = 0;         // shrink() calls since the ID was last seen, saturating
  uint8_t seen_recently = 0;  // seen in training since the last shrink()
  // Admitted, with its row in the host tier (row == -1); tiered tables only.
  uint8_t in_host = 0;
  // Held by a save of a full/delta chain: its removal must reach the next delta.
  uint8_t in_chain = 0;
  // in_host: the ID's host slot, or -1 when its values are on disk (or it has
  // none yet).
  int32_t host_slot = -1;
};
static_assert(sizeof(KeyRecord) == 48, "KeyRecord grew: the map's memory per ID changes");

inline uint64_t HashKey(int64_t key) {
  // splitmix64 finalizer: IDs are often sequential or share low bits.
  uint64_t x = static_cast<uint64_t>(key);
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

class KeyMap {
 public:
  KeyMap() { Rehash(16); }

  int64_t size() const { return size_; }
  // Buckets allocated (records fit in 7/10 of them).
  int64_t capacity() const { return static_cast<int64_t>(slots_.size()); }

  KeyRecord* Find(int64_t key, uint64_t hash) {
    for (uint64_t i = hash & mask_;; i = (i + 1) & mask_) {
      KeyRecord& slot = slots_[i];
      if (!slot.used) return nullptr;
      if (slot.key == key) return &slot;
    }
  }

  // Starts loading the home bucket of `hash` into the cache.
  void Prefetch(uint64_t hash) const { __builtin_prefetch(&slots_[hash & mask_]); }

  // Returns the record of key, inserting an empty one if absent. The map grows
  // here when one more record would pass the load limit, which invalidates
  // every record pointer; a caller that keeps pointers across inserts calls
  // Reserve first, after which the inserts it reserved for never grow the map.
  // Because every insert goes through this check, the map always has an empty
  // bucket, so no probe loop can run forever.
  KeyRecord* FindOrInsert(int64_t key, uint64_t hash, bool* inserted) {
    if (OverLoad(size_ + 1)) {
      if (KeyRecord* found = Find(key, hash)) {
        *inserted = false;
        return found;
      }
      Rehash(slots_.size() * 2);
    }
    for (uint64_t i = hash & mask_;; i = (i + 1) & mask_) {
      KeyRecord& slot = slots_[i];
      if (!slot.used) {
        slot = KeyRecord();
        slot.key = key;
        slot.used = 1;
        ++size_;
        *inserted = true;
        return &slot;
      }
      if (slot.key == key) {
        *inserted = false;
        return &slot;
      }
    }
  }

  // Makes room for `extra` more records without growing in between. Throws
  // AllocationError (the map unchanged) when the larger array cannot be had.
  void Reserve(int64_t extra) {
    const int64_t need = size_ + extra;
    if (!OverLoad(need)) return;
    uint64_t capacity = slots_.size();
    while (static_cast<int64_t>(capacity) * 7 < need * 10) capacity *= 2;
    Rehash(capacity);
  }

  void Erase(KeyRecord* record) {
    uint64_t hole = static_cast<uint64_t>(record - slots_.data());
    slots_[hole].used = 0;
    --size_;
    for (uint64_t i = (hole + 1) & mask_; slots_[i].used; i = (i + 1) & mask_) {
      const uint64_t home = HashKey(slots_[i].key) & mask_;
      // Move the record back into the hole unless its home lies cyclically in
      // (hole, i], where it would become unreachable.
      const bool movable = (i > hole) ? (home <= hole || home > i) : (home <= hole && home > i);
      if (movable) {
        slots_[hole] = slots_[i];
        slots_[i].used = 0;
        hole = i;
      }
    }
  }

  template <typename Fn>
  void ForEach(Fn&& fn) {
    for (auto& slot : slots_) {
      if (slot.used) fn(slot);
    }
  }

  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const auto& slot : slots_) {
      if (slot.used) fn(slot);
    }
  }

  // Removes every record for which pred(record) is true.
  template <typename Pred>
  int64_t EraseIf(Pred&& pred) {
    std::vector<int64_t> doomed;
    for (const auto& slot : slots_) {
      if (slot.used && pred(slot)) doomed.push_back(slot.key);
    }
    for (int64_t key : doomed) Erase(Find(key, HashKey(key)));
    return static_cast<int64_t>(doomed.size());
  }

 private:
  // Whether `records` would fill more than 7/10 of the buckets.
  bool OverLoad(int64_t records) const {
    return records * 10 > static_cast<int64_t>(slots_.size()) * 7;
  }

  // Moves every record into a new array of `capacity` buckets (a power of
  // two). The new array is filled before it replaces the old one, so a failed
  // allocation leaves the map as it was.
  void Rehash(uint64_t capacity) {
    std::vector<KeyRecord, HugePageAllocator<KeyRecord>> fresh(capacity);
    const uint64_t mask = capacity - 1;
    for (const auto& slot : slots_) {
      if (!slot.used) continue;
      for (uint64_t i = HashKey(slot.key) & mask;; i = (i + 1) & mask) {
        if (!fresh[i].used) {
          fresh[i] = slot;
          break;
        }
      }
    }
    slots_.swap(fresh);
    mask_ = mask;
  }

  std::vector<KeyRecord, HugePageAllocator<KeyRecord>> slots_;
  uint64_t mask_ = 0;
  int64_t size_ = 0;
};

}  // namespace mxrec

#endif  // MXREC_ENGINE_KEY_MAP_H_
