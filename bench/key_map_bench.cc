// Baselines of the key-stage benchmark (bench/bench_key_stage_op.py), in C++:
//
//   ceiling FILE     a bare single-thread dedupe + find-or-insert loop over the
//                    batches in FILE: per table an absl::flat_hash_map from ID to
//                    (row, batch stamp, index in the batch), new IDs get the next
//                    row, every position gets its index among the batch's unique
//                    IDs. No admission, journal, shards or threads: the least
//                    work the key stage can do. Like the engine (which reserves
//                    room for a batch's IDs before inserting any), each map is
//                    reserved for the batch before it; like the session
//                    contenders, the first batch (all new IDs) is run but not
//                    timed. Prints the seconds of the other batches.
//   maps FILE N      mxrec::KeyMap (engine/key_map.h: probe array + record
//                    chunks) against absl::flat_hash_map holding the same record
//                    (mxrec::KeyRecord) beside the key, on the first N distinct
//                    IDs of FILE: insert all, then find them in stream order and
//                    read each one's record. Prints one JSON line: ns per insert
//                    and per find and bytes per ID of each map (KeyMap: its own
//                    bytes(); absl: capacity x (slot + control byte)).
//
// FILE: int64 little-endian: num_batches, num_tables, then per batch and table
// the ID count and the IDs. The Python driver compiles this file against
// TensorFlow's headers (absl ships with them) and links libtensorflow_framework
// for absl's out-of-line symbols.
#include <chrono>
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/key_map.h"

namespace {

using Batch = std::vector<std::vector<int64_t>>;  // per table

std::vector<Batch> ReadBatches(const char* path) {
  std::ifstream in(path, std::ios::binary);
  int64_t header[2] = {0, 0};
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  std::vector<Batch> batches(header[0], Batch(header[1]));
  for (auto& batch : batches) {
    for (auto& ids : batch) {
      int64_t n = 0;
      in.read(reinterpret_cast<char*>(&n), sizeof(n));
      ids.resize(n);
      in.read(reinterpret_cast<char*>(ids.data()), n * sizeof(int64_t));
    }
  }
  if (!in) {
    std::fprintf(stderr, "key_map_bench: %s is truncated\n", path);
    std::exit(2);
  }
  return batches;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

struct Entry {
  int32_t row;
  uint32_t stamp;
  int32_t local;
};

int Ceiling(const std::vector<Batch>& batches) {
  const size_t tables = batches.empty() ? 0 : batches[0].size();
  std::vector<absl::flat_hash_map<int64_t, Entry>> maps(tables);
  std::vector<int32_t> next_row(tables, 0);
  std::vector<int32_t> unique_rows;
  std::vector<int32_t> restore;
  uint64_t checksum = 0;
  auto started = std::chrono::steady_clock::now();
  std::clock_t cpu_started = std::clock();
  uint32_t stamp = 0;
  for (const auto& batch : batches) {
    if (stamp == 1) {  // the first batch is not timed
      started = std::chrono::steady_clock::now();
      cpu_started = std::clock();
    }
    ++stamp;
    for (size_t t = 0; t < tables; ++t) {
      const auto& ids = batch[t];
      unique_rows.clear();
      restore.resize(ids.size());
      auto& map = maps[t];
      map.reserve(map.size() + ids.size());  // as the engine's Reserve per batch
      for (size_t p = 0; p < ids.size(); ++p) {
        auto [it, inserted] = map.try_emplace(ids[p], Entry{0, 0, 0});
        Entry& e = it->second;
        if (inserted) e.row = next_row[t]++;
        if (e.stamp != stamp) {
          e.stamp = stamp;
          e.local = static_cast<int32_t>(unique_rows.size());
          unique_rows.push_back(e.row);
        }
        restore[p] = e.local;
      }
      checksum += unique_rows.size() + restore.back();
    }
  }
  const double seconds = Seconds(started);
  const double cpu_seconds = static_cast<double>(std::clock() - cpu_started) / CLOCKS_PER_SEC;
  std::printf("{\"seconds\": %.6f, \"cpu_seconds\": %.6f, \"checksum\": %llu}\n", seconds,
              cpu_seconds, static_cast<unsigned long long>(checksum));
  return 0;
}

using RecordBody = mxrec::KeyRecord;  // what absl::flat_hash_map stores beside the key

struct SplitMix {
  size_t operator()(int64_t key) const { return mxrec::HashKey(key); }
};

int Maps(const std::vector<Batch>& batches, int64_t limit) {
  std::vector<int64_t> distinct;
  std::vector<int64_t> stream;
  {
    absl::flat_hash_map<int64_t, char> seen;
    for (const auto& batch : batches) {
      for (const auto& ids : batch) {
        for (int64_t id : ids) {
          if (static_cast<int64_t>(distinct.size()) < limit && seen.emplace(id, 0).second) {
            distinct.push_back(id);
          }
          if (seen.contains(id)) stream.push_back(id);
        }
      }
    }
  }
  const double n = static_cast<double>(distinct.size());
  const double finds = static_cast<double>(stream.size());
  uint64_t checksum = 0;

  mxrec::KeyMap ours;
  auto started = std::chrono::steady_clock::now();
  for (int64_t id : distinct) {
    bool inserted = false;
    ours.record(ours.FindOrInsert(id, mxrec::HashKey(id), &inserted)).row = 1;
  }
  const double ours_insert = Seconds(started);
  started = std::chrono::steady_clock::now();
  for (int64_t id : stream) checksum += ours.record(ours.Find(id, mxrec::HashKey(id))).row;
  const double ours_find = Seconds(started);
  const int64_t ours_bytes = ours.bytes();

  auto run_absl = [&](auto& map, double* insert, double* find) {
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t id : distinct) map[id].row = 1;
    *insert = Seconds(t0);
    t0 = std::chrono::steady_clock::now();
    for (int64_t id : stream) checksum += map.find(id)->second.row;
    *find = Seconds(t0);
  };
  absl::flat_hash_map<int64_t, RecordBody> lib;
  double lib_insert = 0, lib_find = 0;
  run_absl(lib, &lib_insert, &lib_find);
  absl::flat_hash_map<int64_t, RecordBody, SplitMix> lib_mix;
  double mix_insert = 0, mix_find = 0;
  run_absl(lib_mix, &mix_insert, &mix_find);
  // absl: one control byte per bucket (plus a group's worth at the end).
  const double slot = sizeof(std::pair<const int64_t, RecordBody>) + 1.0;
  std::printf(
      "{\"ids\": %.0f, \"finds\": %.0f, "
      "\"keymap_insert_ns\": %.2f, \"keymap_find_ns\": %.2f, \"keymap_bytes_per_id\": %.1f, "
      "\"absl_insert_ns\": %.2f, \"absl_find_ns\": %.2f, \"absl_bytes_per_id\": %.1f, "
      "\"absl_splitmix_insert_ns\": %.2f, \"absl_splitmix_find_ns\": %.2f, "
      "\"checksum\": %llu}\n",
      n, finds, ours_insert * 1e9 / n, ours_find * 1e9 / finds,
      ours_bytes / n, lib_insert * 1e9 / n, lib_find * 1e9 / finds,
      lib.capacity() * slot / n, mix_insert * 1e9 / n, mix_find * 1e9 / finds,
      static_cast<unsigned long long>(checksum));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "ceiling") return Ceiling(ReadBatches(argv[2]));
  if (argc >= 4 && std::string(argv[1]) == "maps") {
    return Maps(ReadBatches(argv[2]), std::stoll(argv[3]));
  }
  std::fprintf(stderr, "usage: key_map_bench ceiling FILE | maps FILE N\n");
  return 2;
}
