#include "key_stage.h"

#include <chrono>

#include "huge_pages.h"

namespace mxrec {

int64_t WallClockSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Status RunKeyStage(const std::vector<HostTable*>& tables, const std::vector<KeySpan>& spans,
                   bool train, int64_t timestamp, ThreadPool* pool,
                   std::vector<BatchPlan>* plans, bool deferred) {
  if (tables.size() != spans.size()) {
    return MXREC_ERROR(StatusCode::kInvalidArgument, "key stage got ", tables.size(),
                       " tables but ", spans.size(), " ID tensors");
  }
  if (timestamp < 0) timestamp = WallClockSeconds();
  const int64_t n = static_cast<int64_t>(tables.size());
  plans->resize(n);
  std::vector<Status> statuses(n);
  // Running out of memory (the ID map growing, on this thread or a pool
  // thread) fails the batch of that table, not the process.
  auto run_one = [&](int64_t i) {
    statuses[i] = GuardAllocation(
        tables[i]->options().name,
        internal::StrCat("planning a batch of ", spans[i].size, " IDs"), [&] {
          return tables[i]->Process(spans[i].keys, spans[i].size, train, timestamp, pool,
                                    &(*plans)[i], deferred, spans[i].weights);
        });
  };
  // Tables that share admission counts run one after another, in order, so
  // that which of them admits an ID first does not depend on scheduling.
  bool shared = false;
  for (const HostTable* table : tables) shared = shared || table->shares_counts();
  if (pool != nullptr && n > 1 && !shared) {
    pool->ParallelFor(n, run_one);
  } else {
    for (int64_t i = 0; i < n; ++i) run_one(i);
  }
  for (const auto& status : statuses) {
    if (!status.ok()) return status;
  }
  return Status::Ok();
}

}  // namespace mxrec
