// Unit tests of the SSD tier (cc_ops/engine/ssd_tier.h) against std::unordered_map
// references: the index under random puts and erases (collisions, wrap-around, growth,
// backward-shift deletion), and the tier's records through puts, per-component reads,
// erases and compactions. Built and run by tests/test_ssd_tier_units.py.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "expect.h"
#include "engine/ssd_tier.h"

namespace {

using mxrec::SsdIndex;
using mxrec::SsdRecord;
using mxrec::SsdTier;

struct Loc {
  int64_t offset;
  int64_t length;
};

void ExpectSame(const SsdIndex& index, const std::unordered_map<int64_t, Loc>& ref) {
  EXPECT(index.size() == static_cast<int64_t>(ref.size()));
  for (const auto& [key, loc] : ref) {
    const SsdIndex::Entry* e = index.Find(key);
    EXPECT(e != nullptr && e->offset() == loc.offset && e->length() == loc.length);
  }
  int64_t visited = 0;
  index.ForEach([&](const SsdIndex::Entry& e) {
    auto it = ref.find(e.key);
    EXPECT(it != ref.end() && it->second.offset == e.offset() &&
           it->second.length == e.length());
    ++visited;
  });
  EXPECT(visited == static_cast<int64_t>(ref.size()));
}

// Keys from a small range (many repeats, long probe runs), the int64 extremes, and
// erases of present and absent keys, checked against the reference after every
// step of a few hundred and at the end.
void TestIndexMatchesReference() {
  std::mt19937_64 rng(7);
  SsdIndex index;
  std::unordered_map<int64_t, Loc> ref;
  const std::vector<int64_t> extremes = {INT64_MIN, INT64_MAX, 0, -1, 1};
  for (int step = 0; step < 200000; ++step) {
    const int64_t key = step % 97 == 0 ? extremes[step % extremes.size()]
                                       : static_cast<int64_t>(rng() % 5000) - 2500;
    const uint64_t op = rng() % 10;
    if (op < 6) {
      // Locations are multiples of 4 (the index keeps 4-byte units), up to its limits.
      const Loc loc = step % 101 == 0
                          ? Loc{SsdIndex::kMaxEnd - SsdIndex::kMaxLength, SsdIndex::kMaxLength}
                          : Loc{static_cast<int64_t>(rng() % 1000000) * 4,
                                20 + static_cast<int64_t>(rng() % 64) * 4};
      auto it = ref.find(key);
      const int64_t expected_old = it == ref.end() ? 0 : it->second.length;
      EXPECT(index.Put(key, loc.offset, loc.length) == expected_old);
      ref[key] = loc;
    } else {
      auto it = ref.find(key);
      const int64_t expected = it == ref.end() ? 0 : it->second.length;
      EXPECT(index.Erase(key) == expected);
      if (it != ref.end()) ref.erase(it);
    }
    if (step % 20000 == 0) ExpectSame(index, ref);
    if (step % 50000 == 49999) index.Reserve(index.size() * 3);  // growth keeps every entry
  }
  ExpectSame(index, ref);
  // Down to empty: every erase leaves the rest findable.
  std::vector<int64_t> keys;
  for (const auto& [key, loc] : ref) keys.push_back(key);
  for (int64_t key : keys) {
    EXPECT(index.Erase(key) > 0);
    ref.erase(key);
    EXPECT(index.Find(key) == nullptr);
  }
  ExpectSame(index, ref);
}

// Records of two components (some with only the first): reads of each component
// match what was written, a replaced record reads its new values, erased keys read
// nothing, and compactions (forced by rewriting the same keys) keep every record.
void TestTierMatchesReference(const std::string& dir) {
  const int64_t dim = 4;
  std::unique_ptr<SsdTier> tier;
  EXPECT(SsdTier::Open(dir, "unit", 1 << 20, &tier).ok());
  std::mt19937_64 rng(11);
  std::unordered_map<int64_t, SsdRecord> ref;
  for (int round = 0; round < 300; ++round) {
    std::vector<int64_t> keys;
    std::vector<SsdRecord> records;
    for (int i = 0; i < 50; ++i) {
      const int64_t key = static_cast<int64_t>(rng() % 2000) * 7919 - 5000000;
      bool repeated = false;
      for (int64_t k : keys) repeated |= k == key;
      if (repeated) continue;
      SsdRecord record;
      record.present = rng() % 3 == 0 ? 1u : 3u;
      record.values.resize(record.present == 1u ? dim : 2 * dim);
      for (float& v : record.values) v = static_cast<float>(rng() % 100000) / 7.0f;
      keys.push_back(key);
      records.push_back(record);
    }
    EXPECT(tier->PutBatch(keys, records).ok());
    for (size_t i = 0; i < keys.size(); ++i) ref[keys[i]] = records[i];
    for (int i = 0; i < 20; ++i) {
      const int64_t key = static_cast<int64_t>(rng() % 2000) * 7919 - 5000000;
      tier->Erase(key);
      ref.erase(key);
    }
  }
  EXPECT(tier->compactions() > 0);
  EXPECT(tier->size() == static_cast<int64_t>(ref.size()));
  for (const auto& [key, record] : ref) {
    for (int c = 0; c < 2; ++c) {
      float out[dim] = {-1, -1, -1, -1};
      bool found = false;
      EXPECT(tier->ReadComponent(key, c, dim, out, &found).ok());
      EXPECT(found == ((record.present >> c) & 1u));
      for (int64_t d = 0; found && d < dim; ++d) EXPECT(out[d] == record.values[c * dim + d]);
    }
    bool found = false;
    SsdRecord peeked;
    EXPECT(tier->Peek(key, &found, &peeked).ok() && found);
    EXPECT(peeked.present == record.present && peeked.values == record.values);
  }
  float out[dim];
  bool found = true;
  EXPECT(tier->ReadComponent(123456789, 0, dim, out, &found).ok() && !found);
  int64_t visited = 0;
  EXPECT(tier->ForEach([&](int64_t key, const SsdRecord& record) {
                EXPECT(ref.count(key) == 1 && ref[key].values == record.values);
                ++visited;
              }).ok());
  EXPECT(visited == static_cast<int64_t>(ref.size()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s SCRATCH_DIR\n", argv[0]);
    return 2;
  }
  TestIndexMatchesReference();
  std::printf("ssd index: ok\n");
  TestTierMatchesReference(argv[1]);
  std::printf("ssd tier records: ok\n");
  return 0;
}
