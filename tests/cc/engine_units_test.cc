// Unit tests of engine pieces below the Python API: the ID map (KeyMap), the
// thread pool's failure path, and what evaluation reads while batches are pending. Built and run by tests/test_engine_units.py
// against the engine library; prints one line per test and exits non-zero on
// the first failure.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <climits>
#include <cstdlib>
#include <new>
#include <iterator>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "expect.h"
#include "engine/host_table.h"
#include "engine/huge_pages.h"
#include "engine/key_map.h"
#include "engine/thread_pool.h"

namespace {

using mxrec::HashKey;
using mxrec::KeyMap;
using mxrec::KeyRecord;

uint32_t Insert(KeyMap* map, int64_t key, bool* inserted) {
  return map->FindOrInsert(key, HashKey(key), inserted);
}

uint32_t Find(const KeyMap& map, int64_t key) { return map.Find(key, HashKey(key)); }

// Records the store allocates for n: chunks of 64, 64, 128, ..., 2,048, then 4,096.
int64_t RecordCapacity(int64_t n) {
  if (n == 0) return 0;
  int64_t capacity = 64;
  while (capacity < n) capacity = capacity < 4096 ? capacity * 2 : capacity + 4096;
  return capacity;
}

// The record store's bytes for n records of `per_record` bytes in `families`
// chunk families (records, tier records, wide times), each with its table of
// one 8-byte pointer per 64 records.
int64_t RecordBytes(int64_t n, int64_t per_record, int64_t families) {
  const int64_t capacity = RecordCapacity(n);
  return capacity * per_record + families * (capacity / 64) * 8;
}

// FindOrInsert alone (no Reserve) grows the map: a map of 16 probe slots once
// probed forever for a free one after its 16th key. Every int64 is a valid
// key, including 0 and the extremes.
void TestInsertWithoutReserveGrows() {
  KeyMap map;
  constexpr int64_t kKeys = 100000;
  std::vector<int64_t> keys;
  for (int64_t i = 0; i < kKeys - 3; ++i) keys.push_back(i * 7919 - 500000);
  keys.push_back(INT64_MIN);
  keys.push_back(INT64_MAX);
  keys.push_back(-1);
  bool inserted = false;
  for (int64_t i = 0; i < kKeys; ++i) {
    const uint32_t index = Insert(&map, keys[i], &inserted);
    EXPECT(inserted && index != KeyMap::kNoRecord);
    map.record(index).row = static_cast<int32_t>(i);
  }
  EXPECT(map.size() == kKeys);
  for (int64_t i = 0; i < kKeys; ++i) {
    const uint32_t index = Find(map, keys[i]);
    EXPECT(index != KeyMap::kNoRecord && map.record(index).row == i);
    EXPECT(Insert(&map, keys[i], &inserted) == index && !inserted);
  }
  EXPECT(Find(map, -2) == KeyMap::kNoRecord);  // an absent key ends its probe
  int64_t visited = 0;
  map.ForEach([&](int64_t key, uint32_t index) {
    ++visited;
    EXPECT(Find(map, key) == index);
  });
  EXPECT(visited == kKeys);
}

// Records never move: pointers taken before the probe array rehashes (many
// times over) still point at the same IDs' records.
void TestRecordsStayWhileTheProbeArrayGrows() {
  KeyMap map;
  std::vector<KeyRecord*> records;
  bool inserted = false;
  for (int64_t key = 0; key < 50000; ++key) {
    KeyRecord* rec = &map.record(Insert(&map, key, &inserted));
    rec->row = static_cast<int32_t>(key * 3);
    records.push_back(rec);
  }
  for (int64_t key = 0; key < 50000; ++key) {
    EXPECT(&map.record(Find(map, key)) == records[key] && records[key]->row == key * 3);
  }
}

// Erase against std::unordered_map: random inserts and erases keep the same
// content; erased records are reset and reused (the record store does not
// grow while the number of IDs stays put); tier records only where asked for.
void TestEraseAgainstReference() {
  for (bool tiered : {false, true}) {
    KeyMap map(tiered);
    std::unordered_map<int64_t, int32_t> reference;
    uint64_t state = 12345;
    auto next = [&state]() {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      return state >> 33;
    };
    bool inserted = false;
    int64_t most = 0;  // IDs held at once, at most
    for (int step = 0; step < 60000; ++step) {
      // Keys from a small range (collisions, long probe runs) with a shared low part.
      const int64_t key = static_cast<int64_t>(next() % 3000) * 1024 - 700000;
      if (reference.size() < 2000 || next() % 2 == 0) {
        const uint32_t index = Insert(&map, key, &inserted);
        EXPECT(inserted == (reference.count(key) == 0));
        KeyRecord& rec = map.record(index);
        if (inserted) {
          // A fresh or reused record starts out empty.
          EXPECT(rec.row == -1 && rec.count == 0.0f && rec.seen_offset == 0 && rec.epoch == 0 &&
                 map.age(index) == 0 && rec.seen_recently == 0 && rec.in_chain == 0);
          if (tiered) EXPECT(map.tier(index).in_host == 0 && map.tier(index).host_slot == -1);
          rec.row = static_cast<int32_t>(step);
          rec.epoch = 7;
          rec.in_chain = 1;
          if (tiered) map.tier(index) = mxrec::TierRecord{step, 1};
          reference[key] = step;
        }
      } else {
        auto it = reference.begin();
        std::advance(it, static_cast<int64_t>(next() % reference.size()));
        map.Erase(it->first, HashKey(it->first));
        reference.erase(it);
      }
      EXPECT(map.size() == static_cast<int64_t>(reference.size()));
      most = std::max<int64_t>(most, map.size());
    }
    for (const auto& [key, row] : reference) {
      const uint32_t index = Find(map, key);
      EXPECT(index != KeyMap::kNoRecord && map.record(index).row == row);
      if (tiered) EXPECT(map.tier(index).host_slot == row && map.tier(index).in_host == 1);
    }
    int64_t visited = 0;
    map.ForEach([&](int64_t key, uint32_t) {
      ++visited;
      EXPECT(reference.count(key) == 1);
    });
    EXPECT(visited == static_cast<int64_t>(reference.size()));
    for (int64_t key = -700000 - 1024 * 3; key < -700000; key += 1024) {
      EXPECT(Find(map, key) == KeyMap::kNoRecord);
    }
    // Erased records were reused: the store holds what the most IDs held at
    // once need (about 3000, 60000 inserted in all), and the probe array the
    // smallest size of 16 grown by 1.5x steps that keeps them within 7/10 of it.
    int64_t slots = 16;
    while (slots * 7 < most * 10) slots += slots / 2;
    const int64_t per_record = sizeof(KeyRecord) + (tiered ? sizeof(mxrec::TierRecord) : 0);
    EXPECT(most <= KeyMap::kChunkRecords);
    EXPECT(map.capacity() == slots);
    EXPECT(map.bytes() == slots * 12 + RecordBytes(most, per_record, tiered ? 2 : 1));
    EXPECT(map.tiered() == tiered);
  }
}

// Last-seen times are exact for every int64: 30-bit offsets from the first
// time while they fit (no extra bytes), then the map turns wide (8 bytes more
// per record) keeping every time already set; a refused widening changes
// nothing.
void TestLastSeenTimes() {
  KeyMap map;
  bool inserted = false;
  std::vector<int64_t> times;
  for (int64_t key = 0; key < 5000; ++key) {
    // Around a base of 1.7e9 (seconds), 17 years either side.
    const int64_t time = 1700000000 + (key % 2 == 0 ? 1 : -1) * key * 100000;
    map.set_last_seen(Insert(&map, key, &inserted), time);
    times.push_back(time);
  }
  const int64_t narrow = map.bytes();
  EXPECT(!map.wide() && narrow == map.capacity() * 12 + RecordBytes(5000, 16, 1));
  const uint32_t edge = Insert(&map, 5000, &inserted);
  map.set_last_seen(edge, 1700000000LL + KeyRecord::kMaxOffset);  // the last offset that fits
  EXPECT(map.last_seen(edge) == 1700000000LL + KeyRecord::kMaxOffset);
  map.set_last_seen(edge, 1700000000LL + KeyRecord::kMinOffset);
  EXPECT(map.last_seen(edge) == 1700000000LL + KeyRecord::kMinOffset);
  times.push_back(1700000000LL + KeyRecord::kMinOffset);
  EXPECT(!map.wide());
  // A time that does not fit, with the wide chunks refused: nothing changes.
  mxrec::SetAllocationLimitForTesting(1024);
  bool refused = false;
  try {
    map.PrepareTime(INT64_MIN);
  } catch (const mxrec::AllocationError&) {
    refused = true;
  }
  mxrec::SetAllocationLimitForTesting(0);
  EXPECT(refused && !map.wide() && map.bytes() == narrow);
  for (int64_t key = 0; key <= 5000; ++key) EXPECT(map.last_seen(Find(map, key)) == times[key]);
  map.set_last_seen(Insert(&map, 5001, &inserted), INT64_MIN);
  map.set_last_seen(Insert(&map, 5002, &inserted), INT64_MAX);
  times.push_back(INT64_MIN);
  times.push_back(INT64_MAX);
  EXPECT(map.wide() && map.bytes() == map.capacity() * 12 + RecordBytes(5003, 24, 2));
  for (int64_t key = 0; key <= 5002; ++key) EXPECT(map.last_seen(Find(map, key)) == times[key]);
  // Chunks added once wide have their 64-bit times too.
  for (int64_t key = 5003; key < 12000; ++key) {
    map.set_last_seen(Insert(&map, key, &inserted), -key);
  }
  for (int64_t key = 5003; key < 12000; ++key) EXPECT(map.last_seen(Find(map, key)) == -key);
  EXPECT(map.bytes() == map.capacity() * 12 + RecordBytes(12000, 24, 2));
}

// A small map takes small chunks: 1 ID, 64 records; 65, 128; 5000, 8192.
void TestSmallMapsTakeLittle() {
  KeyMap map(true);
  EXPECT(map.bytes() == 16 * 12);
  bool inserted = false;
  for (int64_t key = 0; key < 5000; ++key) {
    const uint32_t index = Insert(&map, key, &inserted);
    map.record(index).row = static_cast<int32_t>(key);
    map.tier(index).host_slot = static_cast<int32_t>(-key);
    const int64_t n = key + 1;
    if (n == 1 || n == 65 || n == 5000) {
      EXPECT(map.bytes() == map.capacity() * 12 + RecordBytes(n, 16 + 5, 2));
    }
  }
  EXPECT(RecordCapacity(1) == 64 && RecordCapacity(65) == 128 && RecordCapacity(5000) == 8192);
  for (int64_t key = 0; key < 5000; ++key) {
    const uint32_t index = Find(map, key);
    EXPECT(map.record(index).row == key && map.tier(index).host_slot == -key);
  }
}

// Growth that cannot get memory throws AllocationError with the bytes asked
// for, and leaves every record where it was.
void TestFailedGrowthKeepsTheMap() {
  KeyMap map;
  bool inserted = false;
  for (int64_t key = 0; key < 11; ++key) map.record(Insert(&map, key, &inserted)).row = 7;
  KeyRecord* first = &map.record(Find(map, 0));
  // The first chunk of records is there already (kChunkRecords of them).
  mxrec::SetAllocationLimitForTesting(256);
  size_t bytes = 0;
  try {
    map.Reserve(100);
  } catch (const mxrec::AllocationError& error) {
    bytes = error.bytes();
  }
  EXPECT(bytes == 181 * sizeof(KeyMap::Slot));  // 16 -> 24 -> 36 -> 54 -> 81 -> 121 -> 181
  bytes = 0;
  try {
    Insert(&map, 100, &inserted);  // the 12th record passes 7/10 of 16 slots
  } catch (const mxrec::AllocationError& error) {
    bytes = error.bytes();
  }
  EXPECT(bytes == 24 * sizeof(KeyMap::Slot));
  mxrec::SetAllocationLimitForTesting(0);
  EXPECT(map.size() == 11 && &map.record(Find(map, 0)) == first);
  for (int64_t key = 0; key < 11; ++key) EXPECT(map.record(Find(map, key)).row == 7);
  EXPECT(Find(map, 100) == KeyMap::kNoRecord);
  // The first chunk full, a second one refused (the probe array has room):
  // Reserve and an insert throw with the chunk's bytes, and change nothing.
  for (int64_t key = 11; key < KeyMap::kChunkRecords; ++key) {
    map.record(Insert(&map, key, &inserted)).row = 7;
  }
  const int64_t bytes_full = map.bytes();
  mxrec::SetAllocationLimitForTesting(8192);
  for (int attempt = 0; attempt < 2; ++attempt) {
    bytes = 0;
    try {
      if (attempt == 0) {
        map.Reserve(1);
      } else {
        Insert(&map, -1, &inserted);
      }
    } catch (const mxrec::AllocationError& error) {
      bytes = error.bytes();
    }
    EXPECT(bytes == KeyMap::kChunkRecords * sizeof(KeyRecord));
  }
  mxrec::SetAllocationLimitForTesting(0);
  EXPECT(map.size() == KeyMap::kChunkRecords && map.bytes() == bytes_full);
  EXPECT(Find(map, -1) == KeyMap::kNoRecord && &map.record(Find(map, 0)) == first);
  // Room made by Reserve is used without allocating.
  map.Reserve(KeyMap::kChunkRecords);
  mxrec::SetAllocationLimitForTesting(1);
  for (int64_t key = 0; key < KeyMap::kChunkRecords; ++key) Insert(&map, -1 - key, &inserted);
  mxrec::SetAllocationLimitForTesting(0);
  EXPECT(map.size() == 2 * KeyMap::kChunkRecords);
}

// An exception on any thread of a ParallelFor (std::bad_alloc above all) is
// rethrown to the caller, after the items in progress finished; the pool works on.
void TestParallelForRethrows() {
  mxrec::ThreadPool pool(4);
  for (int round = 0; round < 50; ++round) {
    std::atomic<int64_t> running{0};
    std::atomic<int64_t> max_after_return{0};
    bool caught = false;
    try {
      pool.ParallelFor(64, [&](int64_t i) {
        ++running;
        if (i == round % 64) {
          --running;
          throw std::bad_alloc();
        }
        for (volatile int spin = 0; spin < 1000; ++spin) {
        }
        --running;
      });
    } catch (const std::bad_alloc&) {
      caught = true;
      max_after_return = running.load();
    }
    EXPECT(caught);
    EXPECT(max_after_return.load() == 0);  // no item still runs once the caller sees it
    std::atomic<int64_t> sum{0};
    pool.ParallelFor(100, [&](int64_t i) { sum += i; });
    EXPECT(sum.load() == 4950);
  }
  bool caught = false;
  try {
    pool.ParallelFor(3, [](int64_t i) {
      if (i == 2) throw std::runtime_error("not an allocation");
    });
  } catch (const std::runtime_error&) {
    caught = true;
  }
  EXPECT(caught);
}

// Evaluation reads an ID that a pending (deferred, not committed) batch admitted
// as unseen, and reads its row once the batch's step committed it. The table
// gathers those IDs from the journals when an evaluation batch asks
// (PendingAdmitted), so every change of the pending batches (one planned, one
// retired) must show in the next evaluation batch.
void TestEvaluationSeesCommittedAdmissionsOnly() {
  mxrec::TableOptions options;
  options.name = "pending";
  options.dim = 4;
  options.device_capacity = 16;
  mxrec::HostTable table(options);
  int64_t time = 0;
  auto train = [&](int64_t key) {
    mxrec::BatchPlan plan;
    EXPECT(table.Process(&key, 1, true, ++time, nullptr, &plan, true).ok());
    EXPECT(plan.batch_id > 0 && plan.unique_rows.size() == 1);
    return plan.batch_id;
  };
  auto eval_row = [&](int64_t key) {
    mxrec::BatchPlan plan;
    EXPECT(table.Process(&key, 1, false, time, nullptr, &plan).ok());
    const size_t index = static_cast<size_t>(plan.restore[0]);
    return index < plan.unique_rows.size() ? plan.unique_rows[index] : -1;
  };
  const int64_t a = 7;
  const int64_t b = -(int64_t{1} << 62);
  const uint64_t first = train(a);
  EXPECT(eval_row(a) == -1);
  const uint64_t second = train(b);  // planned after an evaluation batch read the set
  EXPECT(eval_row(b) == -1);
  EXPECT(eval_row(a) == -1);
  EXPECT(table.Commit(first).ok());
  EXPECT(eval_row(a) >= 0);
  EXPECT(eval_row(b) == -1);
  EXPECT(table.pending_batches() == 1);
  EXPECT(table.Commit(second).ok());
  EXPECT(eval_row(b) >= 0 && eval_row(b) != eval_row(a));
  EXPECT(table.pending_batches() == 0);
  // A batch planned after the set was emptied: its admission is pending again.
  const int64_t c = 1;
  const uint64_t third = train(c);
  EXPECT(eval_row(c) == -1 && eval_row(a) >= 0);
  EXPECT(table.Commit(third).ok());
  EXPECT(eval_row(c) >= 0);
}

}  // namespace

int main() {
  TestInsertWithoutReserveGrows();
  std::puts("insert without reserve grows: ok");
  TestRecordsStayWhileTheProbeArrayGrows();
  std::puts("records stay while the probe array grows: ok");
  TestEraseAgainstReference();
  std::puts("erase against std::unordered_map: ok");
  TestLastSeenTimes();
  std::puts("last-seen times: ok");
  TestSmallMapsTakeLittle();
  std::puts("small maps take little: ok");
  TestFailedGrowthKeepsTheMap();
  std::puts("failed growth keeps the map: ok");
  TestParallelForRethrows();
  std::puts("parallel for rethrows: ok");
  TestEvaluationSeesCommittedAdmissionsOnly();
  std::puts("evaluation sees committed admissions only: ok");
  return 0;
}
