// The engine's key stage alone, in C++: the batches of FILE (key_map_bench's format, one
// table) planned by one HostTable, RUNS times from an empty table, on THREADS threads (1:
// no pool). Prints seconds and M keys/s per run. No Python, no TensorFlow: for instruction
// counts (valgrind --tool=callgrind, repeatable on a loaded machine) and perf profiles of
// HostTable::Process. Build from the repository root:
//
//   g++ -std=c++17 -O3 -g -pthread -Icc_ops -o /tmp/key_stage_driver
//       bench/key_stage_driver.cc cc_ops/engine/*.cc          (one command line)
//   /tmp/key_stage_driver FILE [RUNS [THREADS]]
//
// FILE: int64 little-endian: num_batches, 1, then per batch the ID count and the IDs;
// bench_key_stage.py --write_large FILE writes its large workload (8 x 1,048,576 IDs) so.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <vector>

#include "engine/host_table.h"
#include "engine/thread_pool.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE [RUNS [THREADS]]\n", argv[0]);
    return 2;
  }
  const int runs = argc > 2 ? std::atoi(argv[2]) : 1;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 1;
  std::ifstream in(argv[1], std::ios::binary);
  int64_t header[2] = {0, 0};
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  if (header[1] != 1) {
    std::fprintf(stderr, "%s: %s holds %lld tables, not 1\n", argv[0], argv[1],
                 static_cast<long long>(header[1]));
    return 2;
  }
  std::vector<std::vector<int64_t>> batches(header[0]);
  int64_t keys = 0;
  for (auto& batch : batches) {
    int64_t n = 0;
    in.read(reinterpret_cast<char*>(&n), sizeof(n));
    batch.resize(n);
    in.read(reinterpret_cast<char*>(batch.data()), n * sizeof(int64_t));
    keys += n;
  }
  if (!in) {
    std::fprintf(stderr, "%s: %s is truncated\n", argv[0], argv[1]);
    return 2;
  }
  std::unique_ptr<mxrec::ThreadPool> pool;
  if (threads > 1) pool = std::make_unique<mxrec::ThreadPool>(threads);
  for (int r = 0; r < runs; ++r) {
    mxrec::TableOptions options;
    options.name = "big";
    options.dim = 16;
    options.device_capacity = int64_t{1} << 30;
    auto table = std::make_unique<mxrec::HostTable>(options);
    mxrec::BatchPlan plan;
    const auto started = std::chrono::steady_clock::now();
    for (const auto& batch : batches) {
      const mxrec::Status status = table->Process(batch.data(), static_cast<int64_t>(batch.size()),
                                                  true, -1, pool.get(), &plan);
      if (!status.ok()) {
        std::fprintf(stderr, "%s: %s\n", argv[0], status.message().c_str());
        return 1;
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::printf("%.4f s  %.2f M keys/s  id_map_bytes %lld\n", seconds, keys / seconds / 1e6,
                static_cast<long long>(table->Stats().id_map_bytes));
  }
  return 0;
}
