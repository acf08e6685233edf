// Unit tests of engine pieces below the Python API: the ID map (KeyMap).
// Built and run by tests/test_engine_units.py against the engine library;
// prints one line per test and exits non-zero on the first failure.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "engine/key_map.h"

namespace {

#define EXPECT(cond)                                                          \
  do {                                                                        \
    if (!(cond)) {                                                            \
      std::fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

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

}  // namespace

int main() {
  TestInsertWithoutReserveGrows();
  std::puts("insert without reserve grows: ok");
  TestReservedInsertsKeepPointers();
  std::puts("reserved inserts keep pointers: ok");
  return 0;
}
