// Unit tests of the SSD tier (cc_ops/engine/ssd_tier.h) against a std::map
// reference: fixed-size records at the numbers the caller gives (as the
// device-cache planner does), written in batches whose numbers are sorted into
// runs, per-component reads, releases and reuse of record numbers, the file's
// size bounded by the highest record, and the file widened once when a record
// brings a component the records had no room for. Built and run by
// tests/test_ssd_tier_units.py.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "expect.h"
#include "engine/ssd_tier.h"

namespace {

using mxrec::SsdRecord;
using mxrec::SsdTier;

struct Held {
  int64_t key;
  SsdRecord record;
};

void ExpectSame(const SsdTier& tier, const std::map<int64_t, Held>& ref, int64_t dim,
                int components) {
  EXPECT(tier.size() == static_cast<int64_t>(ref.size()));
  for (const auto& [number, held] : ref) {
    for (int c = 0; c < components; ++c) {
      float out[8];
      std::fill(out, out + dim, -1.0f);
      bool found = false;
      EXPECT(tier.ReadComponent(number, held.key, c, dim, out, &found).ok());
      EXPECT(found == (((held.record.present >> c) & 1u) != 0));
      for (int64_t d = 0; found && d < dim; ++d) {
        EXPECT(out[d] == held.record.values[c * dim + d]);
      }
    }
    bool holds = false;
    EXPECT(tier.Holds(number, held.key, &holds).ok() && holds);
    EXPECT(tier.Holds(number, held.key + 1, &holds).ok() && !holds);
    bool found = false;
    SsdRecord peeked;
    EXPECT(tier.Peek(number, held.key, &found, &peeked).ok() && found);
    EXPECT(peeked.present == held.record.present);
    // Peek gives the record's whole stride: the written floats, then zeros.
    EXPECT(peeked.values.size() >= held.record.values.size());
    for (size_t i = 0; i < peeked.values.size(); ++i) {
      EXPECT(peeked.values[i] == (i < held.record.values.size() ? held.record.values[i] : 0.0f));
    }
  }
  int64_t visited = 0;
  EXPECT(tier.ForEach([&](int64_t key, const SsdRecord& record) {
                bool known = false;
                for (const auto& [number, held] : ref) {
                  if (held.key == key && held.record.present == record.present) known = true;
                }
                EXPECT(known);
                ++visited;
              }).ok());
  EXPECT(visited == static_cast<int64_t>(ref.size()));
}

// Rounds of batches at free and new record numbers (the planner's way: freed
// numbers first), releases, and keys from the int64 extremes; the records hold
// two components, then three (the file is widened once, keeping every record).
void TestTierMatchesReference(const std::string& dir) {
  const int64_t dim = 4;
  std::unique_ptr<SsdTier> tier;
  EXPECT(SsdTier::Open(dir, "unit", 2 * dim, &tier).ok());
  std::mt19937_64 rng(11);
  std::map<int64_t, Held> ref;
  std::vector<int64_t> free_numbers;
  int64_t next = 0;
  int64_t peak = 0;
  const std::vector<int64_t> extremes = {INT64_MIN, INT64_MAX, 0, -1, 1};
  for (int round = 0; round < 300; ++round) {
    const int components = round < 150 ? 2 : 3;
    std::vector<int64_t> keys;
    std::vector<int64_t> numbers;
    std::vector<SsdRecord> records;
    for (int i = 0; i < 50; ++i) {
      int64_t number;
      if (!free_numbers.empty() && rng() % 4 != 0) {
        number = free_numbers.back();
        free_numbers.pop_back();
      } else {
        number = next++;
      }
      const int64_t key = i % 23 == 0 ? extremes[(round + i) % extremes.size()]
                                      : static_cast<int64_t>(rng());
      SsdRecord record;
      record.present = rng() % 3 == 0 ? 1u : (components == 3 && rng() % 2 ? 7u : 3u);
      const int top = record.present == 1u ? 1 : record.present == 3u ? 2 : 3;
      record.values.resize(static_cast<size_t>(top * dim));
      for (float& v : record.values) v = static_cast<float>(rng() % 100000) / 7.0f;
      keys.push_back(key);
      numbers.push_back(number);
      records.push_back(record);
    }
    EXPECT(tier->PutBatch(keys, numbers, records).ok());
    for (size_t i = 0; i < keys.size(); ++i) ref[numbers[i]] = Held{keys[i], records[i]};
    peak = std::max<int64_t>(peak, static_cast<int64_t>(ref.size()));
    for (int i = 0; i < 40 && !ref.empty(); ++i) {
      auto it = ref.begin();
      std::advance(it, static_cast<long>(rng() % ref.size()));
      tier->Release(it->first);
      free_numbers.push_back(it->first);
      bool holds = true;
      EXPECT(tier->Holds(it->first, it->second.key, &holds).ok() && !holds);
      ref.erase(it);
    }
    if (round % 50 == 0) ExpectSame(*tier, ref, dim, components);
  }
  EXPECT(tier->restrides() == 1 && tier->stride() == 3 * dim);
  ExpectSame(*tier, ref, dim, 3);
  // The file holds the records ever given out: the live and the free ones.
  EXPECT(tier->file_bytes() == next * tier->record_bytes());
  EXPECT(next == static_cast<int64_t>(ref.size() + free_numbers.size()) && next >= peak);
  float out[dim];
  bool found = true;
  EXPECT(tier->ReadComponent(next + 5, 1, 0, dim, out, &found).ok() && !found);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s SCRATCH_DIR\n", argv[0]);
    return 2;
  }
  TestTierMatchesReference(argv[1]);
  std::printf("ssd tier records: ok\n");
  return 0;
}
