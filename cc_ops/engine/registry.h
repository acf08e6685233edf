// The process-wide directory of host tables.
//
// Tables must be reachable by name from op kernels that run inside tf.data
// functions (where no resource handle can be captured), from any session, and
// from Python management calls. It maps names to tables and owns the key
// stage's thread pool, while all table state lives in the HostTable objects
// themselves. The engine's other process state: `DynamicStoreRegistry`
// (dynamic_store.h: the dynamic-expansion stores, by the same keys) and three
// atomics (huge_pages.cc: the allocation limit tests set; host_tier.cc: the
// row count from which swaps run in parallel and the spill writer's delay that
// tests set).
#ifndef MXREC_ENGINE_REGISTRY_H_
#define MXREC_ENGINE_REGISTRY_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "host_table.h"
#include "status.h"
#include "thread_pool.h"

namespace mxrec {

class Registry {
 public:
  static Registry& Global();

  // Creates the table under `key`, or returns the existing one when its
  // options are the same (an Estimator rebuilds the graph for each mode).
  // `created` tells whether the table is new.
  Status CreateTable(const std::string& key, const TableOptions& options,
                     std::shared_ptr<HostTable>* table, bool* created = nullptr);
  Status GetTable(const std::string& key, std::shared_ptr<HostTable>* table) const;
  // Drops every table whose key starts with prefix; returns how many.
  int DropPrefix(const std::string& prefix);
  std::vector<std::string> Keys() const;

  // The shared admission counts named `group`, created on first use and
  // dropped with DropPrefix like tables.
  std::shared_ptr<SharedCounts> CountGroup(const std::string& group);

  void SetNumThreads(int num_threads);
  std::shared_ptr<ThreadPool> pool() const;

 private:
  Registry();
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<HostTable>> tables_;
  std::map<std::string, std::shared_ptr<SharedCounts>> count_groups_;
  std::shared_ptr<ThreadPool> pool_;
};

}  // namespace mxrec

#endif  // MXREC_ENGINE_REGISTRY_H_
