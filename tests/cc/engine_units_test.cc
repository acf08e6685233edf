// Unit tests of engine pieces below the Python API: the ID map (KeyMap) and the
// thread pool's failure path. Built and run by tests/test_engine_units.py
// against the engine library; prints one line per test and exits non-zero on
// the first failure.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <vector>

#include "expect.h"
#include "engine/huge_pages.h"
#include "engine/key_map.h"
#include "engine/thread_pool.h"

namespace {

using mxrec::HashKey;
using mxrec::KeyMap;
using mxrec::KeyRecord;

KeyRecord* Insert(KeyMap* map, int64_t key, bool* inserted) {
  return map->FindOrInsert(key, HashKey(key), inserted);
}

// FindOrInsert alone (no Reserve) grows the map: a map of 16 buckets once
// probed forever for a free one after its 16th key.
void TestInsertWithoutReserveGrows() {
  KeyMap map;
  constexpr int64_t kKeys = 100000;
  bool inserted = false;
  for (int64_t i = 0; i < kKeys; ++i) {
    KeyRecord* rec = Insert(&map, i * 7919 - 500000, &inserted);
    EXPECT(inserted && rec->key == i * 7919 - 500000);
    rec->row = static_cast<int32_t>(i);
  }
  EXPECT(map.size() == kKeys);
  for (int64_t i = 0; i < kKeys; ++i) {
    const int64_t key = i * 7919 - 500000;
    KeyRecord* rec = map.Find(key, HashKey(key));
    EXPECT(rec != nullptr && rec->row == i);
    EXPECT(Insert(&map, key, &inserted) == rec && !inserted);
  }
  EXPECT(map.Find(-1, HashKey(-1)) == nullptr);  // an absent key ends its probe
}

// After Reserve(n), n inserts never move records: pointers taken meanwhile hold.
void TestReservedInsertsKeepPointers() {
  KeyMap map;
  map.Reserve(1000);
  std::vector<KeyRecord*> records;
  bool inserted = false;
  for (int64_t key = 0; key < 1000; ++key) records.push_back(Insert(&map, key, &inserted));
  for (int64_t key = 0; key < 1000; ++key) {
    EXPECT(records[key] == map.Find(key, HashKey(key)) && records[key]->key == key);
  }
}

// Growth that cannot get memory throws AllocationError with the bytes asked
// for, and leaves every record where it was.
void TestFailedGrowthKeepsTheMap() {
  KeyMap map;
  bool inserted = false;
  for (int64_t key = 0; key < 11; ++key) Insert(&map, key, &inserted)->row = 7;
  KeyRecord* first = map.Find(0, HashKey(0));
  mxrec::SetAllocationLimitForTesting(1024);
  size_t bytes = 0;
  try {
    map.Reserve(100);
  } catch (const mxrec::AllocationError& error) {
    bytes = error.bytes();
  }
  EXPECT(bytes == 256 * sizeof(KeyRecord));
  bytes = 0;
  try {
    Insert(&map, 100, &inserted);  // the 12th record passes 7/10 of 16 buckets
  } catch (const mxrec::AllocationError& error) {
    bytes = error.bytes();
  }
  EXPECT(bytes == 32 * sizeof(KeyRecord));
  mxrec::SetAllocationLimitForTesting(0);
  EXPECT(map.size() == 11 && map.Find(0, HashKey(0)) == first);
  for (int64_t key = 0; key < 11; ++key) EXPECT(map.Find(key, HashKey(key))->row == 7);
  EXPECT(map.Find(100, HashKey(100)) == nullptr);
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

}  // namespace

int main() {
  TestInsertWithoutReserveGrows();
  std::puts("insert without reserve grows: ok");
  TestReservedInsertsKeepPointers();
  std::puts("reserved inserts keep pointers: ok");
  TestFailedGrowthKeepsTheMap();
  std::puts("failed growth keeps the map: ok");
  TestParallelForRethrows();
  std::puts("parallel for rethrows: ok");
  return 0;
}
