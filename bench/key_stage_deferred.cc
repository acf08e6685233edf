// The key stage of several tables (one RunKeyStage call per batch, as the key-stage op
// makes it) planned deferred and not, in one process, interleaved run after run: the cost
// of the pending-batch journal. Each run plans every batch of FILE from empty tables; a
// deferred run commits batch k - LAG once batch k is planned, as a pipeline that plans LAG
// batches ahead of its step does (mk.data.plan_ahead(prefetch=2): LAG 2). Prints the
// median milliseconds per batch of each mode and their ratio, wall and CPU time (the
// process's, every thread's: on a loaded machine the steadier of the two). Build from the repository
// root:
//
//   g++ -std=c++17 -O3 -g -pthread -Icc_ops -o /tmp/key_stage_deferred
//       bench/key_stage_deferred.cc cc_ops/engine/*.cc          (one command line)
//   /tmp/key_stage_deferred FILE [RUNS [THREADS [LAG [MODE]]]]
//
// MODE: both (default), or plain or deferred alone (for a profile of one mode).
// FILE: int64 little-endian: num_batches, num_tables, then per batch and table the ID
// count and the IDs (bench_key_stage.py's format with several tables).
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "engine/key_stage.h"
#include "engine/thread_pool.h"

namespace {

using Batches = std::vector<std::vector<std::vector<int64_t>>>;  // [batch][table] -> IDs

// The process's CPU seconds (every thread's): on a loaded machine wall time
// also counts the time other processes ran.
double CpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct Timing {
  double wall_ms = 0;  // per batch
  double cpu_ms = 0;   // per batch
};

// Per batch times of one run from empty tables.
Timing Run(const Batches& batches, mxrec::ThreadPool* pool, bool deferred, int lag) {
  const size_t num_tables = batches[0].size();
  std::vector<std::unique_ptr<mxrec::HostTable>> owned;
  std::vector<mxrec::HostTable*> tables;
  for (size_t t = 0; t < num_tables; ++t) {
    mxrec::TableOptions options;
    options.name = "t" + std::to_string(t);
    options.dim = 16;
    options.device_capacity = int64_t{1} << 17;
    owned.push_back(std::make_unique<mxrec::HostTable>(options));
    tables.push_back(owned.back().get());
  }
  std::vector<std::vector<uint64_t>> ids;  // per batch: each table's batch id
  std::vector<mxrec::BatchPlan> plans;
  const auto started = std::chrono::steady_clock::now();
  const double cpu_started = CpuSeconds();
  for (size_t b = 0; b < batches.size(); ++b) {
    std::vector<mxrec::KeySpan> spans(num_tables);
    for (size_t t = 0; t < num_tables; ++t) {
      spans[t].keys = batches[b][t].data();
      spans[t].size = static_cast<int64_t>(batches[b][t].size());
    }
    const mxrec::Status status =
        mxrec::RunKeyStage(tables, spans, true, static_cast<int64_t>(b), pool, &plans, deferred);
    if (!status.ok()) {
      std::fprintf(stderr, "%s\n", status.message().c_str());
      std::exit(1);
    }
    if (!deferred) continue;
    ids.emplace_back();
    for (const auto& plan : plans) ids.back().push_back(plan.batch_id);
    if (static_cast<int>(b) >= lag) {
      for (size_t t = 0; t < num_tables; ++t) {
        if (!tables[t]->Commit(ids[b - lag][t]).ok()) std::exit(1);
      }
    }
  }
  const double count = static_cast<double>(batches.size());
  Timing timing;
  timing.cpu_ms = (CpuSeconds() - cpu_started) * 1e3 / count;
  timing.wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
          .count() /
      count;
  return timing;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE [RUNS [THREADS [LAG [MODE]]]]\n", argv[0]);
    return 2;
  }
  const int runs = argc > 2 ? std::atoi(argv[2]) : 5;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 2;
  const int lag = argc > 4 ? std::atoi(argv[4]) : 2;
  const std::string mode = argc > 5 ? argv[5] : "both";
  if (mode != "both" && mode != "plain" && mode != "deferred") {
    std::fprintf(stderr, "%s: MODE is both, plain or deferred, not %s\n", argv[0], mode.c_str());
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  int64_t header[2] = {0, 0};
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  Batches batches(header[0], std::vector<std::vector<int64_t>>(header[1]));
  for (auto& batch : batches) {
    for (auto& table : batch) {
      int64_t n = 0;
      in.read(reinterpret_cast<char*>(&n), sizeof(n));
      table.resize(n);
      in.read(reinterpret_cast<char*>(table.data()), n * sizeof(int64_t));
    }
  }
  if (!in || batches.empty()) {
    std::fprintf(stderr, "%s: %s is truncated\n", argv[0], argv[1]);
    return 2;
  }
  std::unique_ptr<mxrec::ThreadPool> pool;
  if (threads > 1) pool = std::make_unique<mxrec::ThreadPool>(threads);
  std::vector<double> plain[2];  // wall, CPU
  std::vector<double> deferred[2];
  Run(batches, pool.get(), mode == "deferred", lag);  // warm-up: the scratch, the allocator
  for (int r = 0; r < runs; ++r) {
    const Timing p = mode != "deferred" ? Run(batches, pool.get(), false, lag) : Timing{1, 1};
    const Timing d = mode != "plain" ? Run(batches, pool.get(), true, lag) : Timing{1, 1};
    plain[0].push_back(p.wall_ms);
    plain[1].push_back(p.cpu_ms);
    deferred[0].push_back(d.wall_ms);
    deferred[1].push_back(d.cpu_ms);
    std::printf("run %d: plain %.3f ms/batch (CPU %.3f), deferred %.3f ms/batch (CPU %.3f)\n", r,
                p.wall_ms, p.cpu_ms, d.wall_ms, d.cpu_ms);
  }
  std::printf(
      "| batches | tables | threads | lag | plain ms/batch | deferred ms/batch | ratio | "
      "plain CPU ms/batch | deferred CPU ms/batch | CPU ratio |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  const double pw = Median(plain[0]);
  const double dw = Median(deferred[0]);
  const double pc = Median(plain[1]);
  const double dc = Median(deferred[1]);
  std::printf("| %zu | %zu | %d | %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |\n",
              batches.size(), batches[0].size(), threads, lag, pw, dw, dw / pw, pc, dc, dc / pc);
  return 0;
}
