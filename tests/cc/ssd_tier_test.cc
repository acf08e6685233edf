// Unit tests of the SSD tier (cc_ops/engine/ssd_tier.h) against a std::map
// reference: fixed-size records at the numbers the caller gives (as the
// device-cache planner does), written in batches whose numbers are sorted into
// runs, per-component reads, releases and reuse of record numbers, the file's
// size bounded by the highest record, and the file widened once when a record
// brings a component the records had no room for; the read-ahead's page runs
// against a set of pages computed here, the pages it hints loaded, and a hint
// after the file was widened or the tier dropped. Built and run by
// tests/test_ssd_tier_units.py. The record allocator (ssd_record_allocator.h):
// a spill after scattered frees goes to consecutive records at the file's end
// while the holes are at most a quarter of the file, a half-free group is
// filled first, the holes lowest first beyond that, and against a reference set
// over random frees and allocations: no record handed out twice, the file at
// most 4/3 of its peak of live records.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <set>
#include <thread>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "expect.h"
#include "engine/ssd_record_allocator.h"
#include "engine/row_format.h"
#include "engine/ssd_tier.h"

namespace {

using mxrec::SsdRecord;
using mxrec::SsdRecordAllocator;
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
  EXPECT(SsdTier::Open(dir, "unit", mxrec::RowLayout{dim}, 2, &tier).ok());
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
  EXPECT(tier->restrides() == 1 && tier->stride() == 3 * dim * 4);
  ExpectSame(*tier, ref, dim, 3);
  // The file holds the records ever given out: the live and the free ones.
  EXPECT(tier->file_bytes() == next * tier->record_bytes());
  EXPECT(next == static_cast<int64_t>(ref.size() + free_numbers.size()) && next >= peak);
  float out[dim];
  bool found = true;
  EXPECT(tier->ReadComponent(next + 5, 1, 0, dim, out, &found).ok() && !found);
}

// The runs of consecutive pages that records of `record_bytes` cover.
int64_t PageRuns(const std::vector<int64_t>& records, int64_t record_bytes) {
  const int64_t page = std::max<int64_t>(4096, sysconf(_SC_PAGESIZE));
  std::set<int64_t> pages;
  for (int64_t r : records) {
    for (int64_t p = r * record_bytes / page; p <= ((r + 1) * record_bytes - 1) / page; ++p) {
      pages.insert(p);
    }
  }
  int64_t runs = 0;
  int64_t previous = -2;
  for (int64_t p : pages) {
    runs += p != previous + 1 ? 1 : 0;
    previous = p;
  }
  return runs;
}

// Whether every page of `records` is in the page cache (mincore), polled for a
// few seconds: the hint queues the reads and returns before they finish.
bool Resident(const std::string& path, const std::vector<int64_t>& records, int64_t record_bytes) {
  const int64_t page = std::max<int64_t>(4096, sysconf(_SC_PAGESIZE));
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  const off_t size = lseek(fd, 0, SEEK_END);
  void* map = mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
  std::vector<unsigned char> in(static_cast<size_t>((size + page - 1) / page));
  bool all = false;
  for (int attempt = 0; attempt < 300 && !all; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT(mincore(map, static_cast<size_t>(size), in.data()) == 0);
    all = true;
    for (int64_t r : records) all = all && (in[static_cast<size_t>(r * record_bytes / page)] & 1);
  }
  munmap(map, static_cast<size_t>(size));
  close(fd);
  return all;
}

// Drops the file's pages from the page cache; false where the file system
// keeps them (tmpfs), which leaves nothing to read ahead.
bool DropPages(const std::string& path, int64_t records, int64_t record_bytes) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT(fd >= 0 && fdatasync(fd) == 0);
  EXPECT(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0);
  close(fd);
  std::vector<int64_t> all(static_cast<size_t>(records));
  for (int64_t r = 0; r < records; ++r) all[static_cast<size_t>(r)] = r;
  const int64_t page = std::max<int64_t>(4096, sysconf(_SC_PAGESIZE));
  const int map_fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  const size_t size = static_cast<size_t>(records * record_bytes);
  void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, map_fd, 0);
  std::vector<unsigned char> in((size + page - 1) / page);
  EXPECT(mincore(map, size, in.data()) == 0);
  munmap(map, size);
  close(map_fd);
  for (unsigned char c : in) {
    if (c & 1) return false;
  }
  return true;
}

void TestReadAhead(const std::string& dir) {
  const int64_t dim = 4;
  std::unique_ptr<SsdTier> tier;
  EXPECT(SsdTier::Open(dir, "ahead", mxrec::RowLayout{dim}, 2, &tier).ok());
  const int64_t count = 20000;
  std::vector<int64_t> keys(count);
  std::vector<int64_t> numbers(count);
  std::vector<SsdRecord> records(count);
  for (int64_t r = 0; r < count; ++r) {
    keys[r] = r * 3 + 1;
    numbers[r] = r;
    records[r].present = 3u;
    records[r].values.assign(2 * dim, static_cast<float>(r));
  }
  EXPECT(tier->PutBatch(keys, numbers, records).ok());
  const std::shared_ptr<mxrec::SsdReadAhead> ahead = tier->read_ahead();
  // Unsorted, repeated, neighbouring and far apart; a negative number is none.
  const std::vector<int64_t> wanted = {19999, 5, 6, 7, 4000, 5, 85, 86, 12000, 171, -3};
  std::vector<int64_t> valid;
  for (int64_t r : wanted) {
    if (r >= 0) valid.push_back(r);
  }
  const bool dropped = DropPages(tier->path(), count, tier->record_bytes());
  EXPECT(ahead->Hint(wanted) == PageRuns(valid, tier->record_bytes()));
  if (dropped) {
    EXPECT(Resident(tier->path(), valid, tier->record_bytes()));
  } else {
    std::fprintf(stderr, "note: the file system keeps the pages; residency not checked\n");
  }
  // Widened records: the hint follows the new file and record size.
  std::vector<SsdRecord> wide(1);
  wide[0].present = 7u;
  wide[0].values.assign(3 * dim, 1.0f);
  EXPECT(tier->PutBatch({7}, {count}, wide).ok() && tier->restrides() == 1);
  EXPECT(tier->read_ahead() == ahead);
  EXPECT(ahead->Hint(valid) == PageRuns(valid, tier->record_bytes()));
  EXPECT(ahead->Hint({}) == 0);
  tier.reset();  // a read-ahead kept past the tier hints nothing
  EXPECT(ahead->Hint(valid) == 0);
}

// An Append's runs and pages: what the write statistics count.
void TestAppendCounts(const std::string& dir) {
  const int64_t dim = 64;
  std::unique_ptr<SsdTier> tier;
  EXPECT(SsdTier::Open(dir, "counts", mxrec::RowLayout{dim}, 2, &tier).ok());
  EXPECT(tier->record_bytes() == 528);
  // Records 0..9 fill bytes [0, 5280): pages 0 and 1; record 100 is [52800, 53328):
  // pages 12 and 13 (given out of order: BeginAppend sorts them).
  std::vector<int64_t> numbers = {100, 3, 0, 1, 2, 4, 5, 6, 7, 8, 9};
  std::vector<int64_t> keys(numbers.size());
  std::vector<uint32_t> present(numbers.size(), 3u);
  std::vector<int64_t> payload(numbers.size(), 2 * dim * 4);
  for (size_t i = 0; i < numbers.size(); ++i) keys[i] = numbers[i] + 1000;
  SsdTier::Append append;
  EXPECT(tier->BeginAppend(keys, numbers, present, payload,
                           [](size_t, char* out) { std::memset(out, 0, 2 * 64 * 4); }, &append)
             .ok());
  EXPECT(append.runs == 2 && append.pages == 4);
  EXPECT(tier->WriteAppend(append).ok());
  tier->FinishAppend(append, std::vector<uint8_t>(numbers.size(), 1));
  EXPECT(tier->size() == 11);
}

float Float(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

uint32_t BitsOf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return bits;
}

// Half-precision records (row_format.h): the embedding in bfloat16, the slots in float16,
// 2 bytes a value in the file; exact values come back as written, others rounded to
// nearest even (the ties, float16's subnormals and overflow), and a slot added later widens
// the records by its 2-byte values.
void TestHalfPrecisionRecords(const std::string& dir) {
  using mxrec::ElementType;
  const int64_t dim = 6;
  const mxrec::RowLayout layout{dim, ElementType::kBfloat16, ElementType::kFloat16};
  std::unique_ptr<SsdTier> tier;
  EXPECT(SsdTier::Open(dir, "half", layout, 2, &tier).ok());
  EXPECT(tier->record_bytes() == 16 + 2 * dim * 2 && tier->stride() == 2 * dim * 2);
  const float inf = Float(0x7f800000u);
  // {written, read back}: bfloat16 (component 0), then float16 (component 1).
  const std::vector<std::pair<float, float>> cases = {
      {1.0f + 0x1p-8f, 1.0f},                  // a tie: to the even neighbour
      {1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-6f},    // a tie: to the even neighbour, up
      {-0x1p-130f, -0x1p-130f},                // a subnormal float32, exact in bfloat16
      {-0.0f, -0.0f},
      {3.0f, 3.0f},
      {Float(0x7f7fffffu), inf},               // the largest float32 rounds up, to infinity
      {1.0f + 0x1p-11f, 1.0f},                 // float16 ties
      {1.0f + 3 * 0x1p-11f, 1.0f + 0x1p-9f},
      {0x1p-25f, 0.0f},                        // half the smallest subnormal: to even (0)
      {3 * 0x1p-25f, 0x1p-23f},
      {65520.0f, inf},                         // beyond the largest float16 (65504)
      {-65504.0f, -65504.0f}};
  SsdRecord record;
  record.present = 3u;
  for (const auto& c : cases) record.values.push_back(c.first);
  EXPECT(record.values.size() == 2 * dim);
  EXPECT(tier->PutBatch({42}, {0}, {record}).ok());
  float out[8];
  bool found = false;
  for (int component = 0; component < 2; ++component) {
    EXPECT(tier->ReadComponent(0, 42, component, dim, out, &found).ok() && found);
    for (int64_t d = 0; d < dim; ++d) {
      const auto& c = cases[static_cast<size_t>(component * dim + d)];
      EXPECT(BitsOf(out[d]) == BitsOf(c.second));
    }
  }
  // Exact values are reported exact; a value the type rounds is not; NaN stays NaN.
  char bytes[8];
  const float exact[2] = {0.5f, -3.0f};
  const float rounded[2] = {0.5f, 0.1f};
  EXPECT(mxrec::EncodeRow(ElementType::kBfloat16, exact, 2, bytes));
  EXPECT(!mxrec::EncodeRow(ElementType::kBfloat16, rounded, 2, bytes));
  EXPECT(!mxrec::EncodeRow(ElementType::kFloat16, rounded, 2, bytes));
  const float nan[2] = {Float(0x7fc00000u), Float(0xffc00000u)};
  for (ElementType type : {ElementType::kBfloat16, ElementType::kFloat16}) {
    EXPECT(mxrec::EncodeRow(type, nan, 2, bytes));
    float back[2];
    mxrec::DecodeRow(type, bytes, 2, back);
    EXPECT(back[0] != back[0] && back[1] != back[1] && (BitsOf(back[1]) >> 31) == 1u);
  }
  // A third component: the records widen by one float16 slot; the first two stay.
  SsdRecord wide;
  wide.present = 7u;
  wide.values.assign(3 * dim, 0.25f);
  EXPECT(tier->PutBatch({43}, {1}, {wide}).ok() && tier->restrides() == 1);
  EXPECT(tier->stride() == 3 * dim * 2);
  SsdRecord peeked;
  EXPECT(tier->Peek(0, 42, &found, &peeked).ok() && found && peeked.values.size() == 3 * dim);
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT(BitsOf(peeked.values[i]) == BitsOf(cases[i].second));
  }
  EXPECT(tier->Peek(1, 43, &found, &peeked).ok() && found);
  for (float v : peeked.values) EXPECT(v == 0.25f);
}

// The allocator's records for `count` allocations.
std::vector<int64_t> Take(SsdRecordAllocator* allocator, int64_t count) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < count; ++i) out.push_back(allocator->Allocate());
  return out;
}

std::vector<int64_t> Range(int64_t begin, int64_t end) {
  std::vector<int64_t> out;
  for (int64_t r = begin; r < end; ++r) out.push_back(r);
  return out;
}

void TestAllocatorOrder() {
  SsdRecordAllocator allocator(SsdTier::kMaxRecords);
  EXPECT(Take(&allocator, 6400) == Range(0, 6400));
  // Every 7th record freed (914 holes, 14 % of the file): a spill of 1000
  // records writes one run at the file's end, not 914 scattered records (each a
  // page of its own on disk) and 86 more.
  for (int64_t r = 0; r < 6400; r += 7) allocator.Release(r);
  allocator.Release(7);  // freed twice: counted once
  allocator.Release(9000);  // never given out: nothing to free
  EXPECT(allocator.free_count() == 915);
  EXPECT(Take(&allocator, 1000) == Range(6400, 7400));
  // Group 10 (records 640..703) half free: its free records go first, in order.
  std::vector<int64_t> group;
  for (int64_t r = 640; r < 704; ++r) {
    if (r % 7 == 0 || r % 2 == 0) group.push_back(r);
    if (r % 2 == 0) allocator.Release(r);
  }
  EXPECT(static_cast<int64_t>(group.size()) >= SsdRecordAllocator::kDense);
  std::vector<int64_t> expected = group;
  expected.push_back(7400);
  EXPECT(Take(&allocator, static_cast<int64_t>(group.size()) + 1) == expected);
  // Holes beyond a quarter of the file (every 3rd and 7th record: no group half
  // free): they are reused, lowest first, before the file grows.
  for (int64_t r = 1002; r < 6000; r += 3) allocator.Release(r);
  EXPECT(allocator.free_count() * SsdRecordAllocator::kHoleDivisor > allocator.used());
  const int64_t used = allocator.used();
  const std::vector<int64_t> reused = Take(&allocator, 100);
  EXPECT(allocator.used() == used);
  EXPECT(std::is_sorted(reused.begin(), reused.end()) && reused.front() < 1000);
  allocator.Reset(50);
  EXPECT(allocator.free_count() == 0 && allocator.Allocate() == 50);
  SsdRecordAllocator tiny(3);
  EXPECT(Take(&tiny, 4) == (std::vector<int64_t>{0, 1, 2, -1}));
  tiny.Release(1);
  EXPECT(tiny.Allocate() == 1);
}

void TestAllocatorAgainstReference() {
  SsdRecordAllocator allocator(SsdTier::kMaxRecords);
  std::mt19937_64 rng(5);
  std::set<int64_t> live;
  std::vector<int64_t> order;  // live records, for random frees
  int64_t peak = 0;
  for (int round = 0; round < 400; ++round) {
    // Bursts of spills and of frees, as steps that grow, shrink or churn the tier.
    const int64_t spills = static_cast<int64_t>(rng() % 300);
    for (int64_t i = 0; i < spills; ++i) {
      const int64_t r = allocator.Allocate();
      EXPECT(r >= 0 && live.insert(r).second);
      order.push_back(r);
    }
    peak = std::max(peak, static_cast<int64_t>(live.size()));
    EXPECT(allocator.used() <= peak * 4 / 3 + 1);
    const int64_t frees = static_cast<int64_t>(rng() % (order.size() / 2 + 1));
    for (int64_t i = 0; i < frees; ++i) {
      const size_t at = static_cast<size_t>(rng() % order.size());
      allocator.Release(order[at]);
      live.erase(order[at]);
      order[at] = order.back();
      order.pop_back();
    }
    EXPECT(allocator.free_count() == allocator.used() - static_cast<int64_t>(live.size()));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s SCRATCH_DIR\n", argv[0]);
    return 2;
  }
  TestTierMatchesReference(argv[1]);
  TestReadAhead(argv[1]);
  TestAppendCounts(argv[1]);
  TestHalfPrecisionRecords(argv[1]);
  TestAllocatorOrder();
  TestAllocatorAgainstReference();
  std::printf("ssd tier records: ok\n");
  return 0;
}
