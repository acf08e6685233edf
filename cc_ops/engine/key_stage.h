// The host key stage: plans one batch for several tables at once.
#ifndef MXREC_ENGINE_KEY_STAGE_H_
#define MXREC_ENGINE_KEY_STAGE_H_

#include <cstdint>
#include <vector>

#include "host_table.h"
#include "status.h"
#include "thread_pool.h"

namespace mxrec {

struct KeySpan {
  const int64_t* keys = nullptr;
  int64_t size = 0;
  // Occurrences of each position's ID (training; see HostTable::Process), or
  // nullptr: each position is one occurrence.
  const int64_t* weights = nullptr;
};

// Seconds since the Unix epoch; the batch time when the data gives none.
int64_t WallClockSeconds();

// Plans spans[i] against tables[i] for every i, the tables in parallel on the
// pool (and a large batch also within its table). A caller may size `plans`
// and set restore_out in them beforehand (see BatchPlan). A negative timestamp means
// "now". `deferred`: the batch is planned ahead of its step (input pipeline)
// and stays pending until HostTable::Commit (see HostTable::Process). Returns
// the first error in table order; plans of tables without an error are
// complete either way.
Status RunKeyStage(const std::vector<HostTable*>& tables, const std::vector<KeySpan>& spans,
                   bool train, int64_t timestamp, ThreadPool* pool,
                   std::vector<BatchPlan>* plans, bool deferred = false);

}  // namespace mxrec

#endif  // MXREC_ENGINE_KEY_STAGE_H_
