#include "registry.h"

#include <thread>

namespace mxrec {

namespace {
bool SameOptions(const TableOptions& a, const TableOptions& b) {
  return a.name == b.name && a.dim == b.dim && a.device_capacity == b.device_capacity &&
         a.padding_keys == b.padding_keys && a.host_capacity == b.host_capacity &&
         a.ssd_capacity == b.ssd_capacity && a.ssd_path == b.ssd_path &&
         a.refill_new_rows == b.refill_new_rows && a.embedding_type == b.embedding_type &&
         a.slot_type == b.slot_type;
}
}  // namespace

Registry& Registry::Global() {
  static Registry* registry = new Registry();  // never destroyed: kernels may outlive atexit
  return *registry;
}

Registry::Registry() : pool_(std::make_shared<ThreadPool>(1)) {}

Status Registry::CreateTable(const std::string& key, const TableOptions& options,
                             std::shared_ptr<HostTable>* table, bool* created) {
  if (created != nullptr) *created = false;
  if (options.dim <= 0) {
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options.name,
                       "': dim must be positive, got ", options.dim);
  }
  if (options.device_capacity <= 0 || options.device_capacity >= (int64_t{1} << 31)) {
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options.name,
                       "': device_vocabulary_size must be in [1, 2^31), got ",
                       options.device_capacity);
  }
  if (options.host_capacity < 0 || options.ssd_capacity < 0) {
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options.name,
                       "': host_vocabulary_size and ssd_vocabulary_size must be >= 0, got ",
                       options.host_capacity, " and ", options.ssd_capacity);
  }
  if (options.ssd_capacity > 0 && (options.host_capacity == 0 || options.ssd_path.empty())) {
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options.name,
                       "': ssd_vocabulary_size > 0 needs host_vocabulary_size > 0 and an "
                       "ssd_data_path");
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tables_.find(key);
  if (it != tables_.end()) {
    if (!SameOptions(it->second->options(), options)) {
      return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options.name,
                         "' already exists with other settings; use another name or call "
                         "terminate_config_initializer() first");
    }
    *table = it->second;
    return Status::Ok();
  }
  *table = std::make_shared<HostTable>(options);
  tables_[key] = *table;
  if (created != nullptr) *created = true;
  return Status::Ok();
}

Status Registry::GetTable(const std::string& key, std::shared_ptr<HostTable>* table) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tables_.find(key);
  if (it == tables_.end()) {
    return MXREC_ERROR(StatusCode::kNotFound, "mxrec table key '", key,
                       "' is not registered in this process: the graph was built under an "
                       "earlier init(), or terminate_config_initializer() dropped it");
  }
  *table = it->second;
  return Status::Ok();
}

std::shared_ptr<SharedCounts> Registry::CountGroup(const std::string& group) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& counts = count_groups_[group];
  if (!counts) counts = std::make_shared<SharedCounts>();
  return counts;
}

int Registry::DropPrefix(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = count_groups_.begin(); it != count_groups_.end();) {
    if (it->first.compare(0, prefix.size(), prefix) == 0) {
      it = count_groups_.erase(it);
    } else {
      ++it;
    }
  }
  int dropped = 0;
  for (auto it = tables_.begin(); it != tables_.end();) {
    if (it->first.compare(0, prefix.size(), prefix) == 0) {
      it = tables_.erase(it);
      ++dropped;
    } else {
      ++it;
    }
  }
  return dropped;
}

std::vector<std::string> Registry::Keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> keys;
  for (const auto& entry : tables_) keys.push_back(entry.first);
  return keys;
}

void Registry::SetNumThreads(int num_threads) {
  auto pool = std::make_shared<ThreadPool>(num_threads);
  std::lock_guard<std::mutex> lock(mu_);
  pool_ = std::move(pool);
}

std::shared_ptr<ThreadPool> Registry::pool() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pool_;
}

}  // namespace mxrec
