// The map from int64 feature IDs to their host records, in two parts:
//
//  - a compact probe array of 12-byte slots (the key and a 4-byte record
//    index), open addressing with linear probing and backward-shift deletion.
//    Every int64 value is a valid ID, so occupancy is the index: kNoRecord
//    marks an empty slot. A find reads only this array, and a rehash moves
//    only these 12 bytes per ID. The array has any size (it grows by 1.5x,
//    not 2x, so that it is 47-70% full rather than 35-70%): a key's home slot
//    is the hash's bits below the shard bits multiplied onto [0, capacity)
//    (multiply-shift), not masked. Homes follow the hash's order, so a rehash
//    writes the new array almost in order;
//  - the records themselves, dense, in fixed chunks that never move: an index
//    (and a pointer) stays valid when the probe array rehashes, until that
//    record is erased. Erased records go on a free list and are reused.
//
// Tables with a host tier also keep a TierRecord per record, in chunks of its
// own; device-only tables allocate none. The per-batch dedupe scratch is not
// in the map at all: the key stage keeps it in a table sized by the batch.
#ifndef MXREC_ENGINE_KEY_MAP_H_
#define MXREC_ENGINE_KEY_MAP_H_

#include <cstdint>
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "huge_pages.h"

namespace mxrec {

// What the host knows of one ID (its key is in the probe array). 16 bytes:
// the shrink age, which only tables that shrink need, lives apart (KeyMap::age).
struct KeyRecord {
  KeyRecord() : seen_offset(0), seen_recently(0), in_chain(0) {}

  float count = 0.0f;  // weighted occurrences, for admission
  int32_t row = -1;    // device row, or -1 while not admitted (or in the host tier)
  uint32_t epoch = 0;  // save epoch of the last change, for delta checkpoints
  // The timestamp of the last training batch that held the ID, as an offset
  // from the map's base time in [kMinOffset, kMaxOffset]: read and write it
  // with KeyMap::last_seen and set_last_seen (which keep it exact for any
  // int64 time).
  int32_t seen_offset : 30;
  uint32_t seen_recently : 1;  // seen in training since the last shrink()
  // Held by a save of a full/delta chain: its removal must reach the next delta.
  uint32_t in_chain : 1;

  static constexpr int64_t kMaxOffset = (int64_t{1} << 29) - 1;
  static constexpr int64_t kMinOffset = -(int64_t{1} << 29);
};
static_assert(sizeof(KeyRecord) == 16, "KeyRecord grew: the map's memory per ID changes");

// Where a tiered table's admitted ID keeps its values outside the device rows.
// Packed to 5 bytes: one per ID of a tiered table, most of them on the SSD
// tier in a table larger than memory, where every byte per ID counts.
struct __attribute__((packed)) TierRecord {
  // Where the ID's values are: its host slot (>= 0), none yet (-1), or SSD
  // record r as -2 - r (host_tier.h: SsdSlot). The record number here is the
  // SSD tier's whole index: it keeps none by ID.
  int32_t host_slot = -1;
  // Admitted, with its row in the host tier (KeyRecord::row == -1).
  uint8_t in_host = 0;
};
static_assert(sizeof(TierRecord) == 5, "TierRecord grew: a tiered table's memory per ID changes");

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
  // A record index that names no record: an empty probe slot, a key not found.
  static constexpr uint32_t kNoRecord = 0xFFFFFFFFu;
  // The record store's chunks: 64 records, 64, 128, ... up to 2,048 (the
  // first kSmallChunks chunks, 4,096 records together, so that a small table
  // takes little), then chunks of kChunkRecords.
  static constexpr int kChunkShift = 12;
  static constexpr uint32_t kChunkRecords = 1u << kChunkShift;
  static constexpr int kFirstShift = 6;
  static constexpr uint32_t kSmallChunks = kChunkShift - kFirstShift + 1;
  static constexpr uint32_t kGranuleMask = (1u << kFirstShift) - 1;
  // The first index in chunk `c`, and its size.
  static uint32_t ChunkStart(uint32_t c) {
    if (c >= kSmallChunks) return (c - kSmallChunks + 1) << kChunkShift;
    return c == 0 ? 0 : (1u << kFirstShift) << (c - 1);
  }
  static uint32_t ChunkSize(uint32_t c) {
    if (c >= kSmallChunks) return kChunkRecords;
    return c == 0 ? 1u << kFirstShift : (1u << kFirstShift) << (c - 1);
  }
  // The probe array holds records in at most kLoadNum/kLoadDen of its slots,
  // starts at kMinSlots and grows by 1.5x (Grown).
  static constexpr int64_t kLoadNum = 7;
  static constexpr int64_t kLoadDen = 10;
  static constexpr uint64_t kMinSlots = 16;
  static uint64_t Grown(uint64_t slots) { return slots + slots / 2; }
  // The top bits of a hash pick the IdMap shard (the same in a whole map):
  // the home slot is computed from the bits below them.
  static constexpr int kShardBits = 4;

  // One probe slot: 12 bytes, unaligned keys (x86 loads them at full speed).
  struct __attribute__((packed)) Slot {
    int64_t key = 0;
    uint32_t index = kNoRecord;
  };
  static_assert(sizeof(Slot) == 12, "a probe slot is a key and a record index");

  // `tiered`: keep a TierRecord per record.
  explicit KeyMap(bool tiered = false) : tiered_(tiered) { Rehash(kMinSlots); }
  KeyMap(KeyMap&&) = default;
  KeyMap& operator=(KeyMap&&) = default;

  bool tiered() const { return tiered_; }
  int64_t size() const { return size_; }
  // Probe slots allocated (records fit in 7/10 of them).
  int64_t capacity() const { return static_cast<int64_t>(slots_.size()); }
  // The map's memory: probe array, record chunks (and tier chunks, wide
  // last-seen chunks and shrink-age chunks), and their granule tables (8
  // bytes per 64 records each).
  int64_t bytes() const {
    const int64_t families = 1 + (tiered_ ? 1 : 0) + (wide() ? 1 : 0) + (aged() ? 1 : 0);
    const int64_t per_record = static_cast<int64_t>(sizeof(KeyRecord)) +
                               (tiered_ ? static_cast<int64_t>(sizeof(TierRecord)) : 0) +
                               (wide() ? static_cast<int64_t>(sizeof(int64_t)) : 0) +
                               (aged() ? static_cast<int64_t>(sizeof(uint16_t)) : 0);
    const int64_t records = ChunkCapacity();
    return capacity() * static_cast<int64_t>(sizeof(Slot)) + records * per_record +
           families * (records >> kFirstShift) * static_cast<int64_t>(sizeof(void*));
  }

  // A record by index: through the table of 64-record granules, one load
  // whatever the chunk sizes.
  KeyRecord& record(uint32_t index) { return granules_[index >> kFirstShift][index & kGranuleMask]; }
  const KeyRecord& record(uint32_t index) const {
    return granules_[index >> kFirstShift][index & kGranuleMask];
  }
  // Tiered maps only.
  TierRecord& tier(uint32_t index) { return tier_granules_[index >> kFirstShift][index & kGranuleMask]; }
  const TierRecord& tier(uint32_t index) const {
    return tier_granules_[index >> kFirstShift][index & kGranuleMask];
  }

  // Last-seen times. Each map keeps them as 30-bit offsets from a base time
  // (the first time it was given), which covers 17 years of seconds either
  // side of it; the first time that does not fit turns the map wide: every
  // record's time then lives in 64-bit chunks of their own (8 more bytes per
  // record).
  // A record's time is defined once set (the key stage and a restore set it
  // on creation).
  int64_t last_seen(uint32_t index) const {
    if (wide()) return wide_granules_[index >> kFirstShift][index & kGranuleMask];
    return base_time_ + record(index).seen_offset;
  }
  // Call PrepareTime(time) first where an allocation must not happen here.
  void set_last_seen(uint32_t index, int64_t time) {
    if (!Fits(time)) Widen();
    if (wide()) {
      wide_granules_[index >> kFirstShift][index & kGranuleMask] = time;
    } else {
      record(index).seen_offset = static_cast<int32_t>(time - base_time_);
    }
  }
  // Makes set_last_seen(_, time) allocation-free (widens the map now if the
  // time needs it). Throws AllocationError, the map unchanged.
  void PrepareTime(int64_t time) {
    if (!Fits(time)) Widen();
  }
  bool wide() const { return wide_; }

  // Shrink ages: shrink() calls since the ID was last seen, saturating at
  // UINT16_MAX. A map keeps them (2 bytes more per record, in chunks of
  // their own) from the first PrepareAges on; until then every age is 0.
  uint16_t age(uint32_t index) const {
    return aged() ? age_granules_[index >> kFirstShift][index & kGranuleMask] : 0;
  }
  // PrepareAges first.
  void set_age(uint32_t index, uint16_t age) {
    age_granules_[index >> kFirstShift][index & kGranuleMask] = age;
  }
  // Makes set_age allocation-free (allocates the age chunks, zeroed, if the
  // map has none). Throws AllocationError, the map unchanged.
  void PrepareAges() {
    if (aged()) return;
    std::vector<Chunk<uint16_t>> chunks;
    std::vector<uint16_t*> granules;
    chunks.reserve(chunks_.size());
    granules.reserve(granules_.size());
    for (size_t c = 0; c < chunks_.size(); ++c) {
      const uint32_t size = ChunkSize(static_cast<uint32_t>(c));
      chunks.emplace_back(static_cast<uint16_t*>(AllocateLarge(size * sizeof(uint16_t))));
      std::fill(chunks.back().get(), chunks.back().get() + size, uint16_t{0});
      for (uint32_t g = 0; g < size; g += 1u << kFirstShift) granules.push_back(chunks.back().get() + g);
    }
    age_chunks_ = std::move(chunks);
    age_granules_ = std::move(granules);
    aged_ = true;
  }
  bool aged() const { return aged_; }

  // The record index of key, or kNoRecord.
  uint32_t Find(int64_t key, uint64_t hash) const {
    const Slot* const slots = slots_.data();
    for (uint64_t i = Home(hash);; i = Next(i)) {
      const Slot& slot = slots[i];
      const uint32_t index = slot.index;
      if (index == kNoRecord) return kNoRecord;
      if (slot.key == key) return index;
    }
  }

  // Starts loading the home slot of `hash` into the cache. Always inlined, and
  // so must be any wrapper of it: GCC takes a function whose only effect is a
  // prefetch for a pure one and deletes the calls to it (their result is
  // unused), so a prefetch behind a call that is not inlined is silently lost.
  // That is how the key stage lost every prefetch of its probe (tests/
  // test_engine_units.py checks the built library for them).
  [[gnu::always_inline]] void Prefetch(uint64_t hash) const { __builtin_prefetch(&slots_[Home(hash)]); }

  // Returns the record index of key, inserting a fresh record if absent. The
  // map grows here (probe array, record chunks) when one more record would
  // pass the load limit or the chunks; record indices and pointers stay valid
  // through that. A caller that must not allocate in between calls Reserve
  // first. Because every insert goes through the load check, the probe array
  // always has an empty slot, so no probe loop can run forever.
  uint32_t FindOrInsert(int64_t key, uint64_t hash, bool* inserted) {
    if (OverLoad(size_ + 1) || (free_count_ == 0 && high_water_ == ChunkCapacity())) {
      const uint32_t found = Find(key, hash);
      if (found != kNoRecord) {
        *inserted = false;
        return found;
      }
      Reserve(1);
    }
    for (uint64_t i = Home(hash);; i = Next(i)) {
      Slot& slot = slots_[i];
      const uint32_t index = slot.index;
      if (index == kNoRecord) {
        const uint32_t fresh = NewRecord();
        slot.key = key;
        slot.index = fresh;
        ++size_;
        *inserted = true;
        return fresh;
      }
      if (slot.key == key) {
        *inserted = false;
        return index;
      }
    }
  }

  // Makes room for `extra` more records (probe slots and record chunks)
  // without allocating in between. Throws AllocationError when memory cannot
  // be had; the map stays valid and unchanged in content.
  void Reserve(int64_t extra) {
    const int64_t need = size_ + extra;
    if (OverLoad(need)) {
      uint64_t capacity = slots_.size();
      while (static_cast<int64_t>(capacity) * kLoadNum < need * kLoadDen) capacity = Grown(capacity);
      Rehash(capacity);
    }
    const int64_t records = static_cast<int64_t>(high_water_) + std::max<int64_t>(0, extra - free_count_);
    if (records >= static_cast<int64_t>(kNoRecord)) throw AllocationError(static_cast<size_t>(-1));
    while (static_cast<int64_t>(ChunkCapacity()) < records) AddChunk();
  }

  // Removes key (which must be present); its record goes on the free list.
  void Erase(int64_t key, uint64_t hash) {
    uint64_t hole = Home(hash);
    while (slots_[hole].key != key || slots_[hole].index == kNoRecord) hole = Next(hole);
    const uint32_t index = slots_[hole].index;
    // The free list runs through the erased records' epoch fields.
    record(index) = KeyRecord();
    record(index).epoch = free_head_;
    if (tiered_) tier(index) = TierRecord();
    if (aged_) set_age(index, 0);
    free_head_ = index;
    ++free_count_;
    slots_[hole].index = kNoRecord;
    --size_;
    for (uint64_t i = Next(hole); slots_[i].index != kNoRecord; i = Next(i)) {
      const uint64_t home = Home(HashKey(slots_[i].key));
      // Move the slot back into the hole unless its home lies cyclically in
      // (hole, i], where it would become unreachable.
      const bool movable = (i > hole) ? (home <= hole || home > i) : (home <= hole && home > i);
      if (movable) {
        slots_[hole] = slots_[i];
        slots_[i].index = kNoRecord;
        hole = i;
      }
    }
  }

  // fn(key, record index) for every ID, in probe-array order.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const Slot& slot : slots_) {
      const uint32_t index = slot.index;
      if (index != kNoRecord) fn(static_cast<int64_t>(slot.key), index);
    }
  }

  // Removes every ID for which pred(key, record index) is true.
  template <typename Pred>
  int64_t EraseIf(Pred&& pred) {
    std::vector<int64_t> doomed;
    ForEach([&](int64_t key, uint32_t index) {
      if (pred(key, index)) doomed.push_back(key);
    });
    for (int64_t key : doomed) Erase(key, HashKey(key));
    return static_cast<int64_t>(doomed.size());
  }

 private:
  template <typename T>
  struct FreeDeleter {
    void operator()(T* p) const { std::free(p); }
  };
  template <typename T>
  using Chunk = std::unique_ptr<T[], FreeDeleter<T>>;

  // Whether `time` can be kept as an offset (choosing the base time if none
  // was chosen yet).
  bool Fits(int64_t time) {
    if (wide_) return true;
    if (!has_base_time_) {
      base_time_ = time;
      has_base_time_ = true;
      return true;
    }
    // Without overflow: time - base_time_ in [kMinOffset, kMaxOffset].
    if (time >= base_time_) {
      return static_cast<uint64_t>(time) - static_cast<uint64_t>(base_time_) <=
             static_cast<uint64_t>(KeyRecord::kMaxOffset);
    }
    return static_cast<uint64_t>(base_time_) - static_cast<uint64_t>(time) <=
           static_cast<uint64_t>(-KeyRecord::kMinOffset);
  }

  // Moves every record's last-seen time into 64-bit chunks, all allocated
  // before any is used.
  void Widen() {
    std::vector<Chunk<int64_t>> chunks;
    chunks.reserve(chunks_.size());
    for (size_t c = 0; c < chunks_.size(); ++c) {
      chunks.emplace_back(static_cast<int64_t*>(
          AllocateLarge(ChunkSize(static_cast<uint32_t>(c)) * sizeof(int64_t))));
    }
    for (size_t c = 0; c < chunks_.size(); ++c) {
      for (uint32_t i = 0; i < ChunkSize(static_cast<uint32_t>(c)); ++i) {
        chunks[c][i] = base_time_ + chunks_[c][i].seen_offset;
      }
    }
    std::vector<int64_t*> granules;
    granules.reserve(granules_.size());
    for (size_t c = 0; c < chunks.size(); ++c) {
      for (uint32_t g = 0; g < ChunkSize(static_cast<uint32_t>(c)); g += 1u << kFirstShift) {
        granules.push_back(chunks[c].get() + g);
      }
    }
    wide_chunks_ = std::move(chunks);
    wide_granules_ = std::move(granules);
    wide_ = true;
  }

  // Whether `records` would fill more than the load limit of the slots.
  bool OverLoad(int64_t records) const {
    return records * kLoadDen > static_cast<int64_t>(slots_.size()) * kLoadNum;
  }

  // Records the allocated chunks hold.
  uint32_t ChunkCapacity() const {
    const uint32_t n = static_cast<uint32_t>(chunks_.size());
    return n == 0 ? 0 : ChunkStart(n - 1) + ChunkSize(n - 1);
  }

  // One more chunk of records (and of tier records, wide times and ages),
  // default-initialised. All are allocated before any joins, so a failure
  // changes nothing.
  void AddChunk() {
    const uint32_t size = ChunkSize(static_cast<uint32_t>(chunks_.size()));
    Chunk<KeyRecord> records(static_cast<KeyRecord*>(AllocateLarge(size * sizeof(KeyRecord))));
    Chunk<TierRecord> tiers;
    if (tiered_) tiers.reset(static_cast<TierRecord*>(AllocateLarge(size * sizeof(TierRecord))));
    Chunk<int64_t> times;
    if (wide_) times.reset(static_cast<int64_t*>(AllocateLarge(size * sizeof(int64_t))));
    Chunk<uint16_t> ages;
    if (aged_) ages.reset(static_cast<uint16_t*>(AllocateLarge(size * sizeof(uint16_t))));
    for (uint32_t i = 0; i < size; ++i) new (&records[i]) KeyRecord();
    if (tiered_) {
      for (uint32_t i = 0; i < size; ++i) new (&tiers[i]) TierRecord();
    }
    if (wide_) std::fill(times.get(), times.get() + size, int64_t{0});
    if (aged_) std::fill(ages.get(), ages.get() + size, uint16_t{0});
    const size_t granules = granules_.size() + (size >> kFirstShift);
    chunks_.reserve(chunks_.size() + 1);
    granules_.reserve(granules);
    if (tiered_) {
      tier_chunks_.reserve(tier_chunks_.size() + 1);
      tier_granules_.reserve(granules);
    }
    if (wide_) {
      wide_chunks_.reserve(wide_chunks_.size() + 1);
      wide_granules_.reserve(granules);
    }
    if (aged_) {
      age_chunks_.reserve(age_chunks_.size() + 1);
      age_granules_.reserve(granules);
    }
    // Nothing below allocates.
    for (uint32_t g = 0; g < size; g += 1u << kFirstShift) {
      granules_.push_back(records.get() + g);
      if (tiered_) tier_granules_.push_back(tiers.get() + g);
      if (wide_) wide_granules_.push_back(times.get() + g);
      if (aged_) age_granules_.push_back(ages.get() + g);
    }
    chunks_.push_back(std::move(records));
    if (tiered_) tier_chunks_.push_back(std::move(tiers));
    if (wide_) wide_chunks_.push_back(std::move(times));
    if (aged_) age_chunks_.push_back(std::move(ages));
  }

  // A fresh record's index (new chunks are default-initialised, erased
  // records reset). Room was made by the caller.
  uint32_t NewRecord() {
    if (free_count_ == 0) return high_water_++;
    const uint32_t index = free_head_;
    KeyRecord& rec = record(index);
    free_head_ = rec.epoch;
    rec.epoch = 0;
    --free_count_;
    return index;
  }

  // The home slot of `hash` in an array of `slots`: the bits below the
  // shard bits, as a fraction of 2^64, times the size.
  static uint64_t HomeIn(uint64_t hash, uint64_t slots) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(hash << kShardBits) * slots) >> 64);
  }
  uint64_t Home(uint64_t hash) const { return HomeIn(hash, slot_count_); }
  // The slot after i, cyclically.
  uint64_t Next(uint64_t i) const { return i + 1 == slot_count_ ? 0 : i + 1; }

  // Moves every slot into a new array of `capacity` slots. The new array is
  // filled before it replaces the old one, so a failed allocation leaves the
  // map as it was. Records do not move.
  void Rehash(uint64_t capacity) {
    std::vector<Slot, HugePageAllocator<Slot>> fresh(capacity);
    for (const Slot& slot : slots_) {
      if (slot.index == kNoRecord) continue;
      for (uint64_t i = HomeIn(HashKey(slot.key), capacity);; i = i + 1 == capacity ? 0 : i + 1) {
        if (fresh[i].index == kNoRecord) {
          fresh[i] = slot;
          break;
        }
      }
    }
    slots_.swap(fresh);
    slot_count_ = capacity;
  }

  bool tiered_ = false;
  std::vector<Slot, HugePageAllocator<Slot>> slots_;
  uint64_t slot_count_ = 0;  // slots_.size()
  int64_t size_ = 0;
  std::vector<Chunk<KeyRecord>> chunks_;
  std::vector<Chunk<TierRecord>> tier_chunks_;
  // Per 64 records: where they are (records, tier records, wide times).
  std::vector<KeyRecord*> granules_;
  std::vector<TierRecord*> tier_granules_;
  std::vector<int64_t*> wide_granules_;
  // Last-seen times: the base of the offsets, or (wide) 64-bit chunks.
  int64_t base_time_ = 0;
  bool has_base_time_ = false;
  bool wide_ = false;
  std::vector<Chunk<int64_t>> wide_chunks_;
  // Shrink ages, from the first PrepareAges on.
  bool aged_ = false;
  std::vector<Chunk<uint16_t>> age_chunks_;
  std::vector<uint16_t*> age_granules_;
  uint32_t high_water_ = 0;  // records ever handed out (indices below it)
  // Erased records, reused last-in first-out: the newest, and how many.
  uint32_t free_head_ = kNoRecord;
  int64_t free_count_ = 0;
};

}  // namespace mxrec

#endif  // MXREC_ENGINE_KEY_MAP_H_
