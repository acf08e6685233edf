// Unit tests of the ID map's layout (engine/key_map.h) and of a device-only
// table that fills (engine/host_table.h): probe arrays that grow by 1.5x steps
// with multiply-shift home slots, deletion by backward shift (no tombstones)
// across the array's wrap-around, reinsertion after erase, the shrink-age
// chunks, and the error of a table whose rows run out. Built and run by
// tests/test_key_map_growth.py against the engine library; prints one line
// per test and exits non-zero on the first failure.
#include <cstdint>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <vector>

#include "expect.h"
#include "engine/host_table.h"
#include "engine/key_map.h"

namespace {

using mxrec::HashKey;
using mxrec::KeyMap;
using mxrec::KeyRecord;

uint32_t Insert(KeyMap* map, int64_t key) {
  bool inserted = false;
  return map->FindOrInsert(key, HashKey(key), &inserted);
}

uint32_t Find(const KeyMap& map, int64_t key) { return map.Find(key, HashKey(key)); }

// The home slot of key in an array of `slots`, computed here independently of
// the map: the hash bits below the top 4 as a fraction of 2^64, times slots.
uint64_t Home(int64_t key, uint64_t slots) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(HashKey(key) << 4) * slots) >> 64);
}

// The probe array's sizes: 16, then each 1.5x the last (s + s / 2), taken
// exactly when one more record would pass 7/10 of it. Every key inserted so
// far is found after each step.
void TestGrowthByHalfSteps() {
  KeyMap map;
  std::vector<int64_t> sizes = {16};
  while (sizes.back() < 400000) sizes.push_back(sizes.back() + sizes.back() / 2);
  EXPECT(sizes[1] == 24 && sizes[2] == 36 && sizes[3] == 54 && sizes[4] == 81 && sizes[5] == 121);
  size_t step = 0;
  std::vector<int64_t> keys;
  for (int64_t i = 0; i < 250000; ++i) {
    const int64_t key = i * 1000003 - 77;
    Insert(&map, key);
    keys.push_back(key);
    // The smallest size that holds the keys within 7/10.
    while (sizes[step] * 7 < static_cast<int64_t>(keys.size()) * 10) ++step;
    EXPECT(map.capacity() == sizes[step]);
    if (i + 1 == sizes[step] * 7 / 10 || i < 200) {
      for (int64_t k : keys) EXPECT(Find(map, k) != KeyMap::kNoRecord);
      EXPECT(Find(map, -78) == KeyMap::kNoRecord);
    }
  }
  for (size_t i = 0; i < keys.size(); ++i) EXPECT(Find(map, keys[i]) == static_cast<uint32_t>(i));
  // Reserve grows in the same steps, in one rehash to the first size that holds them.
  KeyMap reserved;
  reserved.Reserve(250000);
  EXPECT(reserved.capacity() == map.capacity());
}

// Keys whose home slot is the array's last slot probe on from slot 0; erasing
// them and their neighbours (backward shift, no tombstones) keeps every other
// key reachable, ends the probe of an absent key at the first empty slot, and
// leaves the array as a fresh insert of the remaining keys would.
void TestEraseAcrossTheWrap() {
  constexpr uint64_t kSlots = 81;  // 16 -> 24 -> 36 -> 54 -> 81: holds 56 records
  std::vector<int64_t> last;       // home = kSlots - 1
  std::vector<int64_t> first;      // home = 0
  std::vector<int64_t> others;
  for (int64_t key = 0; last.size() < 4 || first.size() < 3 || others.size() < 40; ++key) {
    const uint64_t home = Home(key, kSlots);
    if (home == kSlots - 1 && last.size() < 4) {
      last.push_back(key);
    } else if (home == 0 && first.size() < 3) {
      first.push_back(key);
    } else if (home > 3 && home < kSlots - 6 && others.size() < 40) {
      others.push_back(key);
    }
  }
  for (int round = 0; round < 8; ++round) {
    KeyMap map;
    map.Reserve(55);
    EXPECT(map.capacity() == static_cast<int64_t>(kSlots));
    std::unordered_map<int64_t, int32_t> reference;
    auto add = [&](int64_t key) {
      map.record(Insert(&map, key)).row = static_cast<int32_t>(key);
      reference[key] = static_cast<int32_t>(key);
    };
    for (int64_t k : last) add(k);   // slots 80, 0, 1, 2
    for (int64_t k : first) add(k);  // pushed on to 3, 4, 5
    for (int64_t k : others) add(k);
    EXPECT(map.capacity() == static_cast<int64_t>(kSlots));
    // Erase a different mix each round: wrapped keys, the keys behind them.
    std::vector<int64_t> doomed;
    for (size_t i = 0; i < last.size(); ++i) {
      if ((round >> (i % 3)) & 1) doomed.push_back(last[i]);
    }
    for (size_t i = 0; i < first.size(); ++i) {
      if (((round + static_cast<int>(i)) % 3) == 0) doomed.push_back(first[i]);
    }
    for (size_t i = 0; i < others.size(); i += 3 + round % 2) doomed.push_back(others[i]);
    for (int64_t k : doomed) {
      map.Erase(k, HashKey(k));
      reference.erase(k);
      EXPECT(Find(map, k) == KeyMap::kNoRecord);
      for (const auto& [key, row] : reference) {
        const uint32_t index = Find(map, key);
        EXPECT(index != KeyMap::kNoRecord && map.record(index).row == row);
      }
    }
    EXPECT(map.size() == static_cast<int64_t>(reference.size()));
    int64_t visited = 0;
    map.ForEach([&](int64_t key, uint32_t) {
      ++visited;
      EXPECT(reference.count(key) == 1);
    });
    EXPECT(visited == static_cast<int64_t>(reference.size()));
    // No tombstones: erasing and inserting again many times over never
    // fills the array (nor grows it), and every key stays reachable.
    for (int cycle = 0; cycle < 200; ++cycle) {
      const int64_t k = doomed[cycle % doomed.size()];
      add(k);
      map.Erase(k, HashKey(k));
      reference.erase(k);
    }
    EXPECT(map.capacity() == static_cast<int64_t>(kSlots));
    for (const auto& [key, row] : reference) EXPECT(map.record(Find(map, key)).row == row);
  }
}

// An erased ID inserted again gets a fresh record (reset, the erased one
// reused: the store does not grow), with no trace of its old values; the
// shrink ages exist from PrepareAges on, are reset with their record, and
// chunks added later have them too.
void TestReinsertAfterErase() {
  KeyMap map;
  EXPECT(!map.aged() && map.age(0) == 0);
  for (int64_t key = 0; key < 100; ++key) {
    KeyRecord& rec = map.record(Insert(&map, key));
    rec.row = static_cast<int32_t>(key);
    rec.count = 3.0f;
    rec.epoch = 9;
    rec.seen_recently = 1;
    rec.in_chain = 1;
    map.set_last_seen(Find(map, key), 1700000000 + key);
  }
  const int64_t bytes_plain = map.bytes();
  map.PrepareAges();
  EXPECT(map.aged());
  // 128 records (chunks of 64 + 64): 2 bytes each and a pointer per 64.
  EXPECT(map.bytes() == bytes_plain + 128 * 2 + 2 * 8);
  for (int64_t key = 0; key < 100; ++key) {
    EXPECT(map.age(Find(map, key)) == 0);
    map.set_age(Find(map, key), static_cast<uint16_t>(key + 1));
  }
  for (int64_t key = 0; key < 100; key += 2) map.Erase(key, HashKey(key));
  const int64_t bytes_before = map.bytes();
  for (int64_t key = 0; key < 100; key += 2) {
    bool inserted = false;
    const uint32_t index = map.FindOrInsert(key, HashKey(key), &inserted);
    EXPECT(inserted);
    const KeyRecord& rec = map.record(index);
    EXPECT(rec.row == -1 && rec.count == 0.0f && rec.epoch == 0 && rec.seen_offset == 0 &&
           rec.seen_recently == 0 && rec.in_chain == 0 && map.age(index) == 0);
  }
  EXPECT(map.bytes() == bytes_before && map.size() == 100);
  for (int64_t key = 1; key < 100; key += 2) {
    const uint32_t index = Find(map, key);
    EXPECT(map.record(index).row == key && map.age(index) == key + 1);
    EXPECT(map.last_seen(index) == 1700000000 + key);
  }
  // New chunks once aged: ages there too, zero.
  for (int64_t key = 100; key < 5000; ++key) EXPECT(map.age(Insert(&map, key)) == 0);
  for (int64_t key = 100; key < 5000; key += 97) {
    map.set_age(Find(map, key), 7);
    EXPECT(map.age(Find(map, key)) == 7);
  }
}

// A device-only table of 1,000 rows takes new IDs across several probe-array
// steps until its rows run out: the batch that brings more new IDs than rows
// is refused with an error naming the table, the limit and the setting, and
// takes back the row it handed out (the IDs admitted before keep their rows;
// a batch of known IDs plans as before).
void TestTableThatFills() {
  mxrec::TableOptions options;
  options.name = "clicks";
  options.dim = 4;
  options.device_capacity = 1000;
  mxrec::HostTable table(options);
  std::vector<int64_t> admitted;
  mxrec::BatchPlan plan;
  for (int batch = 0; batch < 9; ++batch) {
    std::vector<int64_t> keys;
    for (int i = 0; i < 111; ++i) keys.push_back((batch * 111 + i) * 7919LL);
    const mxrec::Status status = table.Process(keys.data(), static_cast<int64_t>(keys.size()), true,
                                               100 + batch, nullptr, &plan);
    EXPECT(status.ok());
    EXPECT(plan.new_ids == 111);
    admitted.insert(admitted.end(), keys.begin(), keys.end());
  }
  EXPECT(table.next_row() == 999);
  std::vector<int64_t> more = {admitted[5], -1, -2, admitted[0]};
  const mxrec::Status full = table.Process(more.data(), 4, true, 200, nullptr, &plan);
  EXPECT(!full.ok() && full.code() == mxrec::StatusCode::kResourceExhausted);
  const std::string& message = full.message();
  EXPECT(message.find("'clicks'") != std::string::npos);
  EXPECT(message.find("1000 rows") != std::string::npos);
  EXPECT(message.find("device_vocabulary_size") != std::string::npos);
  EXPECT(message.find("1 more new IDs") != std::string::npos);
  EXPECT(table.next_row() == 999);
  // Known IDs still plan, with the rows they had (row = order of admission).
  const mxrec::Status again = table.Process(admitted.data(), static_cast<int64_t>(admitted.size()),
                                            false, 300, nullptr, &plan);
  EXPECT(again.ok() && plan.unique_rows.size() == admitted.size());
  for (size_t i = 0; i < admitted.size(); ++i) EXPECT(plan.unique_rows[i] == static_cast<int32_t>(i));
  // One new ID fits in the last row.
  std::vector<int64_t> last = {-1};
  EXPECT(table.Process(last.data(), 1, true, 400, nullptr, &plan).ok());
  EXPECT(plan.unique_rows.size() == 1 && plan.unique_rows[0] == 999);
}

}  // namespace

int main() {
  TestGrowthByHalfSteps();
  std::puts("probe arrays grow by 1.5x steps: ok");
  TestEraseAcrossTheWrap();
  std::puts("erase across the wrap-around, no tombstones: ok");
  TestReinsertAfterErase();
  std::puts("reinsert after erase, shrink ages: ok");
  TestTableThatFills();
  std::puts("a table that fills: ok");
  return 0;
}
