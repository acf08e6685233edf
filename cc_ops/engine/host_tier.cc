#include "host_tier.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace mxrec {

namespace {
// Bytes of bookkeeping per stored row besides its values (hash node, index).
constexpr int64_t kEntryOverhead = 64;
}  // namespace

HostTier::HostTier(TierOptions options) : options_(std::move(options)) {
  components_.push_back(kEmbedding);
  cursor_.push_back(0);
}

Status HostTier::RegisterComponent(const std::string& name, int* index) {
  std::lock_guard<std::mutex> lock(mu_);
  return RegisterLocked(name, index);
}

Status HostTier::RegisterLocked(const std::string& name, int* index) {
  auto it = std::find(components_.begin(), components_.end(), name);
  if (it != components_.end()) {
    *index = static_cast<int>(it - components_.begin());
    return Status::Ok();
  }
  if (components_.size() >= kMaxComponents) {
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                       "': more than ", kMaxComponents,
                       " optimizer slots swap through the host tier");
  }
  components_.push_back(name);
  cursor_.push_back(next_seq_);
  // Plans queued before this component existed are complete without it.
  for (auto& plan : plans_) plan.applied |= 1u << (components_.size() - 1);
  *index = static_cast<int>(components_.size()) - 1;
  while (!plans_.empty() && plans_.front().applied == AllMask()) plans_.pop_front();
  return Status::Ok();
}

void HostTier::Enqueue(SwapPlan plan) {
  if (plan.rows.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  plan.seq = next_seq_++;
  plan.applied = 0;
  plans_.push_back(std::move(plan));
}

int64_t HostTier::pending_plans() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(plans_.size());
}

HostTier::Entry* HostTier::FindLocked(int64_t key, Status* status) {
  auto it = memory_.find(key);
  if (it != memory_.end()) return &it->second;
  if (!ssd_) return nullptr;
  bool found = false;
  SsdRecord record;
  *status = ssd_->Take(key, &found, &record);
  if (!status->ok() || !found) return nullptr;
  Entry& entry = memory_[key];
  entry.values = std::move(record.values);
  entry.present = record.present;
  arrival_.push_back(key);
  return &entry;
}

Status HostTier::SpillLocked() {
  if (options_.ssd_capacity <= 0) return Status::Ok();
  while (static_cast<int64_t>(memory_.size()) > options_.host_capacity && !arrival_.empty()) {
    if (!ssd_) {
      MXREC_RETURN_IF_ERROR(SsdTier::Open(options_.ssd_path, options_.name,
                                          options_.ssd_capacity, &ssd_));
    }
    // The SSD tier full here is a transient overshoot within a step (a row
    // swapped in is freed only once every slot took it): keep it in memory.
    if (ssd_->size() >= options_.ssd_capacity) return Status::Ok();
    const int64_t key = arrival_.front();
    arrival_.pop_front();
    auto it = memory_.find(key);
    if (it == memory_.end()) continue;
    SsdRecord record;
    record.present = it->second.present;
    record.values = std::move(it->second.values);
    memory_.erase(it);
    MXREC_RETURN_IF_ERROR(ssd_->Put(key, record));
  }
  // Keep the arrival queue from growing without bound with keys long gone.
  if (arrival_.size() > 2 * memory_.size() + 1024) {
    std::deque<int64_t> kept;
    for (int64_t key : arrival_) {
      if (memory_.count(key)) kept.push_back(key);
    }
    arrival_.swap(kept);
  }
  return Status::Ok();
}

Status HostTier::StoreLocked(int64_t key, int component, const float* value) {
  const int64_t dim = options_.dim;
  Status status;
  Entry* entry = FindLocked(key, &status);
  MXREC_RETURN_IF_ERROR(status);
  if (entry == nullptr) {
    entry = &memory_[key];
    if (options_.ssd_capacity > 0) arrival_.push_back(key);
  }
  if (entry->present & (1u << component)) {
    // Each component alternates out, in, out, ... for an ID; two outs in a row
    // mean plans applied out of order.
    return MXREC_ERROR(StatusCode::kInternal, "mxrec table '", options_.name, "': ID ", key,
                       " is swapped out to the host tier twice without being swapped in (",
                       components_[component], ")");
  }
  const size_t need = static_cast<size_t>((component + 1) * dim);
  if (entry->values.size() < need) entry->values.resize(need, 0.0f);
  std::memcpy(entry->values.data() + component * dim, value, dim * sizeof(float));
  entry->present |= 1u << component;
  return Status::Ok();
}

void HostTier::DropIfDoneLocked(int64_t key, Entry* entry) {
  // Components move independently (the embedding may be a plan ahead of the
  // slots within a step): an entry goes once no component holds a value in it.
  if (entry->present == 0) memory_.erase(key);
}

Status HostTier::Swap(int component, const int32_t* rows, int64_t n, const float* current,
                      float* incoming, bool* fresh) {
  if (n == 0) return Status::Ok();
  std::lock_guard<std::mutex> lock(mu_);
  if (component < 0 || component >= static_cast<int>(components_.size())) {
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                       "': unknown swap component ", component);
  }
  const uint64_t seq = cursor_[component];
  const uint64_t front = plans_.empty() ? next_seq_ : plans_.front().seq;
  if (seq < front || seq >= next_seq_) {
    return MXREC_ERROR(StatusCode::kInternal, "mxrec table '", options_.name, "': the step of ",
                       components_[component], " has ", n,
                       " rows to swap but no planned batch is pending; the training step ran "
                       "without the key stage that plans it");
  }
  SwapPlan& plan = plans_[seq - front];
  if (static_cast<int64_t>(plan.rows.size()) != n ||
      !std::equal(plan.rows.begin(), plan.rows.end(), rows)) {
    return MXREC_ERROR(StatusCode::kInternal, "mxrec table '", options_.name,
                       "': the swap rows of this step (", n, " rows, ",
                       components_[component], ") are not those of the next planned batch (",
                       plan.rows.size(),
                       " rows): a planned batch was dropped before its step (an iterator "
                       "re-initialised with batches in flight?), so host-tier rows are out of "
                       "step. Host-tier tables need every planned training batch to be trained.");
  }
  const int64_t dim = options_.dim;
  const uint32_t bit = 1u << component;
  int64_t outs = 0;
  int64_t ins = 0;
  // All victims first: a row's new owner never is another row's victim in one
  // plan, but storing first keeps the rule simple to check.
  for (int64_t i = 0; i < n; ++i) {
    if (!plan.has_out[i]) continue;
    MXREC_RETURN_IF_ERROR(StoreLocked(plan.out_keys[i], component, current + i * dim));
    ++outs;
  }
  for (int64_t i = 0; i < n; ++i) {
    fresh[i] = true;
    if (!plan.from_host[i]) continue;
    Status status;
    Entry* entry = FindLocked(plan.in_keys[i], &status);
    MXREC_RETURN_IF_ERROR(status);
    // Absent: the ID was evicted while its batch was in flight; it restarts.
    if (entry == nullptr) continue;
    if (entry->present & bit) {
      std::memcpy(incoming + i * dim, entry->values.data() + component * dim,
                  dim * sizeof(float));
      fresh[i] = false;
      ++ins;
    }
    entry->present &= ~bit;
    DropIfDoneLocked(plan.in_keys[i], entry);
  }
  for (int64_t i = 0; i < n; ++i) {
    if (fresh[i]) std::memset(incoming + i * dim, 0, dim * sizeof(float));
  }
  if (component == 0) {
    // With several lookups of the table in one step, "last" is the last plan.
    stats_.swap_out_total += outs;
    stats_.swap_in_total += ins;
    stats_.fresh_total += n - ins;
    stats_.swap_out_last = outs;
    stats_.swap_in_last = ins;
  }
  plan.applied |= bit;
  cursor_[component] = seq + 1;
  while (!plans_.empty() && plans_.front().applied == AllMask()) plans_.pop_front();
  return SpillLocked();
}

Status HostTier::Read(int component, const int64_t* keys, int64_t n, float* values,
                      bool* found) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t dim = options_.dim;
  const uint32_t bit = 1u << component;
  SsdRecord record;
  for (int64_t i = 0; i < n; ++i) {
    found[i] = false;
    const float* src = nullptr;
    auto it = memory_.find(keys[i]);
    if (it != memory_.end()) {
      if (it->second.present & bit) {
        src = it->second.values.data() + component * dim;
      }
    } else if (ssd_) {
      bool on_disk = false;
      MXREC_RETURN_IF_ERROR(ssd_->Peek(keys[i], &on_disk, &record));
      if (on_disk && (record.present & bit)) {
        src = record.values.data() + component * dim;
      }
    }
    if (src != nullptr) {
      std::memcpy(values + i * dim, src, dim * sizeof(float));
      found[i] = true;
    } else {
      std::memset(values + i * dim, 0, dim * sizeof(float));
    }
  }
  return Status::Ok();
}

void HostTier::Erase(int64_t key) {
  std::lock_guard<std::mutex> lock(mu_);
  memory_.erase(key);
  if (ssd_) ssd_->Erase(key);
  // A pending plan must not write the evicted ID's values back afterwards.
  for (auto& plan : plans_) {
    for (size_t i = 0; i < plan.rows.size(); ++i) {
      if (plan.has_out[i] && plan.out_keys[i] == key) plan.has_out[i] = 0;
    }
  }
}

Status HostTier::Export(int component, std::vector<int64_t>* keys, std::vector<float>* values) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t dim = options_.dim;
  const uint32_t bit = 1u << component;
  std::vector<std::pair<int64_t, const float*>> found;
  std::vector<std::pair<int64_t, std::vector<float>>> from_disk;
  for (const auto& [key, entry] : memory_) {
    if (entry.present & bit) {
      found.emplace_back(key, entry.values.data() + component * dim);
    }
  }
  if (ssd_) {
    MXREC_RETURN_IF_ERROR(ssd_->ForEach([&](int64_t key, const SsdRecord& record) {
      if (record.present & bit) {
        from_disk.emplace_back(key, std::vector<float>(record.values.begin() + component * dim,
                                                       record.values.begin() + (component + 1) * dim));
      }
    }));
  }
  for (const auto& [key, row] : from_disk) found.emplace_back(key, row.data());
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  keys->clear();
  values->clear();
  values->reserve(found.size() * dim);
  for (const auto& [key, row] : found) {
    keys->push_back(key);
    values->insert(values->end(), row, row + dim);
  }
  return Status::Ok();
}

Status HostTier::Gather(const std::vector<int64_t>& keys, std::vector<std::string>* components,
                        std::vector<uint32_t>* present, std::vector<float>* values) const {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t dim = options_.dim;
  const size_t width = components_.size() * static_cast<size_t>(dim);
  *components = components_;
  present->assign(keys.size(), 0);
  values->assign(keys.size() * width, 0.0f);
  SsdRecord record;
  for (size_t i = 0; i < keys.size(); ++i) {
    const Entry* entry = nullptr;
    auto it = memory_.find(keys[i]);
    if (it != memory_.end()) {
      entry = &it->second;
      record.present = entry->present;
    } else {
      bool on_disk = false;
      if (ssd_) MXREC_RETURN_IF_ERROR(ssd_->Peek(keys[i], &on_disk, &record));
      if (!on_disk) continue;  // no values: the ID restarts from the initializer
    }
    const std::vector<float>& src = entry ? entry->values : record.values;
    const uint32_t mask = entry ? entry->present : record.present;
    present->at(i) = mask;
    const size_t copy = std::min(src.size(), width);
    std::copy(src.begin(), src.begin() + copy, values->begin() + i * width);
    for (size_t c = 0; c < components_.size(); ++c) {
      if (!(mask & (1u << c))) {
        std::fill(values->begin() + i * width + c * dim, values->begin() + i * width + (c + 1) * dim,
                  0.0f);
      }
    }
  }
  return Status::Ok();
}

Status HostTier::Replace(const std::vector<int64_t>& keys,
                         const std::vector<std::string>& components,
                         const std::vector<uint32_t>& present, const std::vector<float>& values) {
  const int64_t dim = options_.dim;
  const size_t width = components.size() * static_cast<size_t>(dim);
  if (present.size() != keys.size() || values.size() != keys.size() * width) {
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                       "': checkpointed host-tier values do not match their IDs (",
                       keys.size(), " IDs, ", present.size(), " masks, ", values.size(),
                       " floats for ", components.size(), " components of dim ", dim, ")");
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> index(components.size());
  for (size_t c = 0; c < components.size(); ++c) {
    MXREC_RETURN_IF_ERROR(RegisterLocked(components[c], &index[c]));
  }
  plans_.clear();
  for (auto& cursor : cursor_) cursor = next_seq_;
  memory_.clear();
  arrival_.clear();
  ssd_.reset();  // removes the old file; a new one is opened on the next spill
  for (size_t i = 0; i < keys.size(); ++i) {
    Entry& entry = memory_[keys[i]];
    if (options_.ssd_capacity > 0) arrival_.push_back(keys[i]);
    for (size_t c = 0; c < components.size(); ++c) {
      if (!(present[i] & (1u << c))) continue;
      const size_t need = static_cast<size_t>(index[c] + 1) * dim;
      if (entry.values.size() < need) entry.values.resize(need, 0.0f);
      std::copy(values.begin() + i * width + c * dim, values.begin() + i * width + (c + 1) * dim,
                entry.values.begin() + index[c] * dim);
      entry.present |= 1u << index[c];
    }
    if (entry.present == 0) memory_.erase(keys[i]);
  }
  return SpillLocked();
}

TierStats HostTier::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  TierStats stats = stats_;
  stats.host_rows = static_cast<int64_t>(memory_.size());
  stats.host_bytes = 0;
  for (const auto& [key, entry] : memory_) {
    stats.host_bytes += static_cast<int64_t>(entry.values.capacity() * sizeof(float)) +
                        kEntryOverhead;
  }
  stats.ssd_rows = ssd_ ? ssd_->size() : 0;
  stats.ssd_file_bytes = ssd_ ? ssd_->file_bytes() : 0;
  stats.ssd_compactions = ssd_ ? ssd_->compactions() : 0;
  stats.pending_plans = static_cast<int64_t>(plans_.size());
  return stats;
}

}  // namespace mxrec
