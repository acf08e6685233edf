#include "dynamic_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>
#include <utility>

#include "registry.h"

namespace mxrec {

DynamicStore::DynamicStore(DynamicStoreOptions options, std::weak_ptr<const HostTable> owner)
    : options_(std::move(options)), owner_(std::move(owner)) {
  embedding_.name = "embedding";
}

void DynamicStore::AllocateChunks(int64_t count, float initial, std::vector<Chunk>* chunks) const {
  const int64_t floats = options_.chunk_rows * options_.dim;
  for (int64_t c = 0; c < count; ++c) {
    Chunk chunk(static_cast<float*>(AllocateLarge(static_cast<size_t>(chunk_bytes()))));
    std::fill(chunk.get(), chunk.get() + floats, initial);
    chunks->push_back(std::move(chunk));
  }
}

Status DynamicStore::EnsureRows(const int64_t* addresses, int64_t n,
                                std::vector<int64_t>* fresh) {
  // Addresses are rows the owner's key stage handed out, so they are below
  // its next row; anything else would grow the store towards an address no
  // ID holds (up to 2^31 rows).
  std::shared_ptr<const HostTable> owner = owner_.lock();
  if (!owner) {
    return MXREC_ERROR(StatusCode::kNotFound, "mxrec table '", options_.name,
                       "': the host table of this dynamic store was dropped "
                       "(terminate_config_initializer?)");
  }
  const int64_t limit = owner->next_row();
  std::unique_lock<std::shared_mutex> lock(mu_);
  int64_t highest = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (addresses[i] < 0 || addresses[i] >= limit) {
      return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                         "': dynamic store got address ", addresses[i], " at position ", i,
                         ", but the table's key stage has handed out addresses [0, ", limit,
                         ") only (at most ", owner->options().device_capacity,
                         "); addresses must come from the table's lookups. Nothing was "
                         "allocated");
    }
    highest = std::max(highest, addresses[i]);
  }
  if (capacity_ <= highest) {
    // Every new chunk is made before any joins the store, so a failed
    // allocation leaves the store as it was.
    const int64_t grow = (highest - capacity_) / options_.chunk_rows + 1;
    const int64_t new_capacity = capacity_ + grow * options_.chunk_rows;
    std::vector<Chunk> embedding;
    std::vector<std::vector<Chunk>> slots(slots_.size());
    try {
      in_use_.reserve(static_cast<size_t>(new_capacity));
      AllocateChunks(grow, embedding_.initial, &embedding);
      for (size_t s = 0; s < slots_.size(); ++s) {
        AllocateChunks(grow, slots_[s].initial, &slots[s]);
      }
    } catch (const std::bad_alloc&) {
      const int64_t arrays = 1 + static_cast<int64_t>(slots_.size());
      return OutOfMemory(
          options_.name,
          internal::StrCat("growing the dynamic store from ", capacity_, " to ", new_capacity,
                           " rows (", grow * arrays, " chunks of ", chunk_bytes(),
                           " bytes for the embedding and ", slots_.size(), " optimizer slot(s))"),
          static_cast<size_t>(grow * arrays * chunk_bytes()));
    }
    for (Chunk& chunk : embedding) embedding_.chunks.push_back(std::move(chunk));
    for (size_t s = 0; s < slots_.size(); ++s) {
      for (Chunk& chunk : slots[s]) slots_[s].chunks.push_back(std::move(chunk));
    }
    capacity_ = new_capacity;
    in_use_.resize(static_cast<size_t>(capacity_), 0);
  }
  for (int64_t i = 0; i < n; ++i) {
    uint8_t& used = in_use_[addresses[i]];
    if (!used) {
      used = 1;
      ++rows_in_use_;
      fresh->push_back(addresses[i]);
    }
  }
  return Status::Ok();
}

Status DynamicStore::AddSlot(const std::string& slot_name, float initial_value, int* index) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].name != slot_name) continue;
    if (slots_[i].initial != initial_value) {
      return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                         "': optimizer slot '", slot_name, "' exists with initial value ",
                         slots_[i].initial, ", not ", initial_value,
                         "; give the second optimizer another name");
    }
    *index = static_cast<int>(i);
    return Status::Ok();
  }
  Array slot;
  slot.name = slot_name;
  slot.initial = initial_value;
  const int64_t chunks = capacity_ / options_.chunk_rows;
  try {
    AllocateChunks(chunks, initial_value, &slot.chunks);
    slots_.push_back(std::move(slot));
  } catch (const std::bad_alloc&) {
    return OutOfMemory(options_.name,
                       internal::StrCat("optimizer slot '", slot_name, "' of the dynamic store (",
                                        chunks, " chunks of ", chunk_bytes(), " bytes)"),
                       static_cast<size_t>(chunks * chunk_bytes()));
  }
  *index = static_cast<int>(slots_.size()) - 1;
  return Status::Ok();
}

std::vector<std::string> DynamicStore::SlotNames() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  std::vector<std::string> names;
  for (const Array& slot : slots_) names.push_back(slot.name);
  return names;
}

Status DynamicStore::CheckAddresses(const int64_t* addresses, int64_t n,
                                    const char* caller) const {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t address = addresses[i];
    if (address < 0 || address >= capacity_ || !in_use_[address]) {
      return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name, "': ",
                         caller, " got address ", address, " at position ", i,
                         ", which no ID of the table holds (", rows_in_use_,
                         " addresses in use, ", capacity_,
                         " rows allocated); addresses must come from the table's lookups "
                         "(ASCEND_SPARSE_LOOKUP_ID_OFFSET). Nothing was written");
    }
  }
  return Status::Ok();
}

Status DynamicStore::CheckSlot(int slot, const char* caller) const {
  if (slot >= static_cast<int>(slots_.size())) {
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name, "': ",
                       caller, " asked for slot ", slot, " of ", slots_.size());
  }
  return Status::Ok();
}

Status DynamicStore::Read(const int64_t* addresses, int64_t n, int slot, float* out,
                          const char* caller) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  MXREC_RETURN_IF_ERROR(CheckSlot(slot, caller));
  MXREC_RETURN_IF_ERROR(CheckAddresses(addresses, n, caller));
  const Array& array = slot < 0 ? embedding_ : slots_[slot];
  const size_t row_bytes = options_.dim * sizeof(float);
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(out + i * options_.dim, Row(array, addresses[i]), row_bytes);
  }
  return Status::Ok();
}

Status DynamicStore::Write(const int64_t* addresses, int64_t n, int slot, const float* values,
                           const char* caller) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  MXREC_RETURN_IF_ERROR(CheckSlot(slot, caller));
  MXREC_RETURN_IF_ERROR(CheckAddresses(addresses, n, caller));
  Array& array = slot < 0 ? embedding_ : slots_[slot];
  const size_t row_bytes = options_.dim * sizeof(float);
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(Row(array, addresses[i]), values + i * options_.dim, row_bytes);
  }
  return Status::Ok();
}

void DynamicStore::SumDuplicates(const int64_t* addresses, int64_t n, const float* grads,
                                 std::vector<int64_t>* unique,
                                 std::vector<float>* summed) const {
  const int64_t dim = options_.dim;
  std::unordered_map<int64_t, int64_t> position;
  position.reserve(static_cast<size_t>(n) * 2);
  unique->reserve(n);
  summed->reserve(n * dim);
  for (int64_t i = 0; i < n; ++i) {
    auto [it, inserted] = position.emplace(addresses[i], static_cast<int64_t>(unique->size()));
    const float* g = grads + i * dim;
    if (inserted) {
      unique->push_back(addresses[i]);
      summed->insert(summed->end(), g, g + dim);
    } else {
      float* acc = summed->data() + it->second * dim;
      for (int64_t d = 0; d < dim; ++d) acc[d] += g[d];
    }
  }
}

Status DynamicStore::ApplySgd(const int64_t* addresses, int64_t n, const float* grads,
                              float lr) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  MXREC_RETURN_IF_ERROR(CheckAddresses(addresses, n, "MxrecDynamicApplySgd"));
  std::vector<int64_t> unique;
  std::vector<float> summed;
  SumDuplicates(addresses, n, grads, &unique, &summed);
  const int64_t dim = options_.dim;
  for (size_t i = 0; i < unique.size(); ++i) {
    float* row = Row(embedding_, unique[i]);
    const float* g = summed.data() + i * dim;
    for (int64_t d = 0; d < dim; ++d) row[d] -= lr * g[d];
  }
  return Status::Ok();
}

Status DynamicStore::ApplyAdagrad(const int64_t* addresses, int64_t n, const float* grads,
                                  float lr, int accumulator_slot) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  MXREC_RETURN_IF_ERROR(CheckSlot(accumulator_slot, "MxrecDynamicApplyAdagrad"));
  MXREC_RETURN_IF_ERROR(CheckAddresses(addresses, n, "MxrecDynamicApplyAdagrad"));
  std::vector<int64_t> unique;
  std::vector<float> summed;
  SumDuplicates(addresses, n, grads, &unique, &summed);
  const int64_t dim = options_.dim;
  const Array& accumulators = slots_[accumulator_slot];
  for (size_t i = 0; i < unique.size(); ++i) {
    float* row = Row(embedding_, unique[i]);
    float* acc = Row(accumulators, unique[i]);
    const float* g = summed.data() + i * dim;
    // TensorFlow's SparseApplyAdagrad: accum += g^2; var -= lr * g / sqrt(accum).
    for (int64_t d = 0; d < dim; ++d) {
      acc[d] += g[d] * g[d];
      row[d] -= lr * g[d] / std::sqrt(acc[d]);
    }
  }
  return Status::Ok();
}

Status DynamicStore::ApplyLazyAdam(const int64_t* addresses, int64_t n, const float* grads,
                                   const LazyAdamParams& p, int m_slot, int v_slot) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  MXREC_RETURN_IF_ERROR(CheckSlot(m_slot, "MxrecDynamicApplyLazyAdam"));
  MXREC_RETURN_IF_ERROR(CheckSlot(v_slot, "MxrecDynamicApplyLazyAdam"));
  MXREC_RETURN_IF_ERROR(CheckAddresses(addresses, n, "MxrecDynamicApplyLazyAdam"));
  std::vector<int64_t> unique;
  std::vector<float> summed;
  SumDuplicates(addresses, n, grads, &unique, &summed);
  const int64_t dim = options_.dim;
  const float step_size = p.lr * std::sqrt(1.0f - p.beta2_power) / (1.0f - p.beta1_power);
  const Array& ms = slots_[m_slot];
  const Array& vs = slots_[v_slot];
  for (size_t i = 0; i < unique.size(); ++i) {
    float* row = Row(embedding_, unique[i]);
    float* m = Row(ms, unique[i]);
    float* v = Row(vs, unique[i]);
    const float* g = summed.data() + i * dim;
    for (int64_t d = 0; d < dim; ++d) {
      m[d] = p.beta1 * m[d] + (1.0f - p.beta1) * g[d];
      v[d] = p.beta2 * v[d] + (1.0f - p.beta2) * g[d] * g[d];
      row[d] -= step_size * m[d] / (std::sqrt(v[d]) + p.epsilon);
    }
  }
  return Status::Ok();
}

DynamicStoreStats DynamicStore::Stats() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  DynamicStoreStats stats;
  stats.rows = rows_in_use_;
  stats.capacity = capacity_;
  stats.chunks = static_cast<int64_t>(embedding_.chunks.size());
  stats.slots = static_cast<int64_t>(slots_.size());
  return stats;
}

DynamicStoreRegistry& DynamicStoreRegistry::Global() {
  static DynamicStoreRegistry* registry = new DynamicStoreRegistry();  // never destroyed
  return *registry;
}

void DynamicStoreRegistry::DropOrphansLocked() {
  for (auto it = stores_.begin(); it != stores_.end();) {
    std::shared_ptr<HostTable> current;
    const bool registered = Registry::Global().GetTable(it->first, &current).ok();
    if (!registered || current != it->second.owner.lock()) {
      it = stores_.erase(it);
    } else {
      ++it;
    }
  }
}

Status DynamicStoreRegistry::Create(const std::string& key, const DynamicStoreOptions& options,
                                    std::shared_ptr<DynamicStore>* store) {
  if (options.dim <= 0 || options.chunk_rows <= 0) {
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options.name,
                       "': a dynamic store needs dim > 0 and chunk_rows > 0, got dim ",
                       options.dim, ", chunk_rows ", options.chunk_rows);
  }
  std::shared_ptr<HostTable> owner;
  MXREC_RETURN_IF_ERROR(Registry::Global().GetTable(key, &owner));
  std::lock_guard<std::mutex> lock(mu_);
  DropOrphansLocked();
  auto it = stores_.find(key);
  if (it != stores_.end()) {
    const DynamicStoreOptions& have = it->second.store->options();
    if (have.name != options.name || have.dim != options.dim ||
        have.chunk_rows != options.chunk_rows) {
      return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options.name,
                         "' already has a dynamic store with other settings (dim ", have.dim,
                         ", chunk_rows ", have.chunk_rows, ")");
    }
    *store = it->second.store;
    return Status::Ok();
  }
  *store = std::make_shared<DynamicStore>(options, owner);
  stores_[key] = Entry{owner, *store};
  return Status::Ok();
}

Status DynamicStoreRegistry::Get(const std::string& key,
                                 std::shared_ptr<DynamicStore>* store) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = stores_.find(key);
  if (it == stores_.end()) {
    return MXREC_ERROR(StatusCode::kNotFound, "mxrec table key '", key,
                       "' has no dynamic store in this process: the table was not created "
                       "with init(use_dynamic_expansion=True), or was dropped");
  }
  *store = it->second.store;
  return Status::Ok();
}

int DynamicStoreRegistry::DropPrefix(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  int dropped = 0;
  for (auto it = stores_.begin(); it != stores_.end();) {
    if (it->first.compare(0, prefix.size(), prefix) == 0) {
      it = stores_.erase(it);
      ++dropped;
    } else {
      ++it;
    }
  }
  return dropped;
}

}  // namespace mxrec
