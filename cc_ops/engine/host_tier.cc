#include "host_tier.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "key_map.h"

namespace mxrec {

HostTier::HostTier(TierOptions options) : options_(std::move(options)) {
  components_.push_back(kEmbedding);
  cursor_.push_back(0);
  chunks_.resize(1);
  index_.assign(16, IndexEntry());
  index_mask_ = 15;
}

int32_t HostTier::LookupSlot(int64_t key) const {
  for (uint64_t i = HashKey(key) & index_mask_;; i = (i + 1) & index_mask_) {
    const IndexEntry& e = index_[i];
    if (e.slot < 0) return -1;
    if (e.key == key) return e.slot;
  }
}

void HostTier::GrowIndex() {
  std::vector<IndexEntry> old;
  old.swap(index_);
  index_.assign(old.size() * 2, IndexEntry());
  index_mask_ = index_.size() - 1;
  for (const IndexEntry& e : old) {
    if (e.slot < 0) continue;
    uint64_t i = HashKey(e.key) & index_mask_;
    while (index_[i].slot >= 0) i = (i + 1) & index_mask_;
    index_[i] = e;
  }
}

int32_t HostTier::InsertSlot(int64_t key) {
  // Load factor at most 1/2: probes stay short.
  if (static_cast<uint64_t>(live_ + 1) * 2 > index_.size()) GrowIndex();
  int32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = static_cast<int32_t>(slot_key_.size());
    slot_key_.push_back(0);
    slot_present_.push_back(0);
  }
  slot_key_[slot] = key;
  slot_present_[slot] = 0;
  uint64_t i = HashKey(key) & index_mask_;
  while (index_[i].slot >= 0) i = (i + 1) & index_mask_;
  index_[i].key = key;
  index_[i].slot = slot;
  ++live_;
  return slot;
}

void HostTier::DropSlot(int32_t slot) {
  const int64_t key = slot_key_[slot];
  uint64_t hole = HashKey(key) & index_mask_;
  while (index_[hole].slot != slot) hole = (hole + 1) & index_mask_;
  index_[hole].slot = -1;
  // Backward-shift deletion, as in KeyMap.
  for (uint64_t i = (hole + 1) & index_mask_; index_[i].slot >= 0; i = (i + 1) & index_mask_) {
    const uint64_t home = HashKey(index_[i].key) & index_mask_;
    const bool movable = (i > hole) ? (home <= hole || home > i) : (home <= hole && home > i);
    if (movable) {
      index_[hole] = index_[i];
      index_[i].slot = -1;
      hole = i;
    }
  }
  slot_present_[slot] = 0;
  free_slots_.push_back(slot);
  --live_;
}

void HostTier::ClearStoreLocked() {
  index_.assign(16, IndexEntry());
  index_mask_ = 15;
  live_ = 0;
  slot_key_.clear();
  slot_present_.clear();
  free_slots_.clear();
  for (auto& chunks : chunks_) chunks.clear();
}

float* HostTier::ValueLocked(int component, int32_t slot) {
  auto& chunks = chunks_[component];
  const size_t chunk = static_cast<size_t>(slot >> kChunkShift);
  if (chunk >= chunks.size()) chunks.resize(chunk + 1);
  if (!chunks[chunk]) {
    chunks[chunk].reset(new float[static_cast<size_t>(kChunkRows * options_.dim)]());
  }
  return chunks[chunk].get() + (slot & (kChunkRows - 1)) * options_.dim;
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
  chunks_.resize(components_.size());
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

int32_t HostTier::FindLocked(int64_t key, Status* status) {
  const int32_t slot = LookupSlot(key);
  if (slot >= 0 || !ssd_) return slot;
  bool found = false;
  SsdRecord record;
  *status = ssd_->Take(key, &found, &record);
  if (!status->ok() || !found) return -1;
  const int32_t loaded = InsertSlot(key);
  const int64_t dim = options_.dim;
  for (size_t c = 0; c < components_.size(); ++c) {
    if (!(record.present & (1u << c))) continue;
    if (record.values.size() < (c + 1) * static_cast<size_t>(dim)) continue;
    std::memcpy(ValueLocked(static_cast<int>(c), loaded), record.values.data() + c * dim,
                dim * sizeof(float));
    slot_present_[loaded] |= 1u << c;
  }
  arrival_.push_back(key);
  return loaded;
}

Status HostTier::SpillLocked() {
  if (options_.ssd_capacity <= 0) return Status::Ok();
  const int64_t dim = options_.dim;
  while (live_ > options_.host_capacity && !arrival_.empty()) {
    if (!ssd_) {
      MXREC_RETURN_IF_ERROR(SsdTier::Open(options_.ssd_path, options_.name,
                                          options_.ssd_capacity, &ssd_));
    }
    // The SSD tier full here is a transient overshoot within a step (a row
    // swapped in is freed only once every slot took it): keep it in memory.
    if (ssd_->size() >= options_.ssd_capacity) return Status::Ok();
    const int64_t key = arrival_.front();
    arrival_.pop_front();
    const int32_t slot = LookupSlot(key);
    if (slot < 0) continue;
    SsdRecord record;
    record.present = slot_present_[slot];
    int top = 0;
    for (size_t c = 0; c < components_.size(); ++c) {
      if (record.present & (1u << c)) top = static_cast<int>(c) + 1;
    }
    record.values.assign(static_cast<size_t>(top * dim), 0.0f);
    for (int c = 0; c < top; ++c) {
      if (record.present & (1u << c)) {
        std::memcpy(record.values.data() + c * dim, ValueAt(c, slot), dim * sizeof(float));
      }
    }
    DropSlot(slot);
    MXREC_RETURN_IF_ERROR(ssd_->Put(key, record));
  }
  // Keep the arrival queue from growing without bound with keys long gone.
  if (static_cast<int64_t>(arrival_.size()) > 2 * live_ + 1024) {
    std::deque<int64_t> kept;
    for (int64_t key : arrival_) {
      if (LookupSlot(key) >= 0) kept.push_back(key);
    }
    arrival_.swap(kept);
  }
  return Status::Ok();
}

Status HostTier::StoreLocked(int64_t key, int component, const float* value,
                             int32_t* slot_out) {
  Status status;
  int32_t slot = FindLocked(key, &status);
  MXREC_RETURN_IF_ERROR(status);
  if (slot < 0) {
    slot = InsertSlot(key);
    if (options_.ssd_capacity > 0) arrival_.push_back(key);
  }
  if (slot_present_[slot] & (1u << component)) {
    // Each component alternates out, in, out, ... for an ID; two outs in a row
    // mean plans applied out of order.
    return MXREC_ERROR(StatusCode::kInternal, "mxrec table '", options_.name, "': ID ", key,
                       " is swapped out to the host tier twice without being swapped in (",
                       components_[component], ")");
  }
  std::memcpy(ValueLocked(component, slot), value, options_.dim * sizeof(float));
  slot_present_[slot] |= 1u << component;
  if (slot_out != nullptr) *slot_out = slot;
  return Status::Ok();
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
  // The index is far larger than the caches: fetch the home buckets of the
  // keys a few rows ahead of their use.
  constexpr int64_t kAhead = 8;
  const auto prefetch = [this](int64_t key) {
    __builtin_prefetch(&index_[HashKey(key) & index_mask_]);
  };
  // The first component to apply the plan records the slots it finds; the
  // others use them where they still hold the key (else look up as usual).
  const bool first = plan.out_slots.empty();
  if (first) {
    plan.out_slots.assign(static_cast<size_t>(n), -1);
    plan.in_slots.assign(static_cast<size_t>(n), -1);
  }
  if (first) {
    for (int64_t i = 0; i < std::min(n, kAhead); ++i) prefetch(plan.out_keys[i]);
  }
  for (int64_t i = 0; i < n; ++i) {
    if (first && i + kAhead < n) prefetch(plan.out_keys[i + kAhead]);
    if (!plan.has_out[i]) continue;
    if (first && free_slots_.size() > static_cast<size_t>(kAhead)) {
      // Victims mostly take new slots, from the free list's end: warm the
      // one a few inserts ahead.
      const int32_t s = free_slots_[free_slots_.size() - 1 - kAhead];
      __builtin_prefetch(&slot_key_[s], 1);
      __builtin_prefetch(&slot_present_[s], 1);
      const auto& chunks = chunks_[component];
      const size_t chunk = static_cast<size_t>(s >> kChunkShift);
      if (chunk < chunks.size() && chunks[chunk]) {
        __builtin_prefetch(chunks[chunk].get() + (s & (kChunkRows - 1)) * dim, 1);
      }
    }
    const int64_t key = plan.out_keys[i];
    const int32_t hint = first ? -1 : CheckHint(plan.out_slots, i, key);
    if (hint >= 0 && !(slot_present_[hint] & bit)) {
      std::memcpy(ValueLocked(component, hint), current + i * dim, dim * sizeof(float));
      slot_present_[hint] |= bit;
    } else {
      MXREC_RETURN_IF_ERROR(StoreLocked(key, component, current + i * dim, &plan.out_slots[i]));
    }
    ++outs;
  }
  if (first) {
    // Resolve the incoming IDs' slots up front (index buckets prefetched ahead),
    // so that the copy loop below can prefetch the slots' values. Slots are
    // stable identities: the loop checks each still holds its key.
    for (int64_t i = 0; i < std::min(n, kAhead); ++i) prefetch(plan.in_keys[i]);
    for (int64_t i = 0; i < n; ++i) {
      if (i + kAhead < n) prefetch(plan.in_keys[i + kAhead]);
      if (plan.from_host[i]) plan.in_slots[i] = LookupSlot(plan.in_keys[i]);
    }
  }
  const auto prefetch_slot = [this, component, &plan](int64_t i) {
    if (!plan.from_host[i]) return;
    const int32_t s = plan.in_slots[i];
    if (s < 0 || static_cast<size_t>(s) >= slot_key_.size()) return;
    __builtin_prefetch(&slot_key_[s]);
    __builtin_prefetch(&slot_present_[s]);
    const auto& chunks = chunks_[component];
    const size_t chunk = static_cast<size_t>(s >> kChunkShift);
    if (chunk < chunks.size() && chunks[chunk]) {
      __builtin_prefetch(chunks[chunk].get() + (s & (kChunkRows - 1)) * options_.dim);
    }
    // The index bucket, for DropSlot.
    __builtin_prefetch(&index_[HashKey(plan.in_keys[i]) & index_mask_]);
  };
  for (int64_t i = 0; i < std::min(n, kAhead); ++i) prefetch_slot(i);
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) prefetch_slot(i + kAhead);
    fresh[i] = true;
    if (!plan.from_host[i]) continue;
    Status status;
    int32_t slot = CheckHint(plan.in_slots, i, plan.in_keys[i]);
    if (slot < 0) {
      slot = FindLocked(plan.in_keys[i], &status);
      plan.in_slots[i] = slot;
    }
    MXREC_RETURN_IF_ERROR(status);
    // Absent: the ID was evicted while its batch was in flight; it restarts.
    if (slot < 0) continue;
    if (slot_present_[slot] & bit) {
      std::memcpy(incoming + i * dim, ValueAt(component, slot), dim * sizeof(float));
      fresh[i] = false;
      ++ins;
    }
    slot_present_[slot] &= ~bit;
    // Components move independently (the embedding may be a plan ahead of the
    // slots within a step): a slot is freed once no component holds a value in it.
    if (slot_present_[slot] == 0) DropSlot(slot);
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
    const int32_t slot = LookupSlot(keys[i]);
    if (slot >= 0) {
      if (slot_present_[slot] & bit) src = ValueAt(component, slot);
    } else if (ssd_) {
      bool on_disk = false;
      MXREC_RETURN_IF_ERROR(ssd_->Peek(keys[i], &on_disk, &record));
      if (on_disk && (record.present & bit) &&
          record.values.size() >= static_cast<size_t>((component + 1) * dim)) {
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
  const int32_t slot = LookupSlot(key);
  if (slot >= 0) DropSlot(slot);
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
  for (size_t slot = 0; slot < slot_key_.size(); ++slot) {
    if (slot_present_[slot] & bit) {
      found.emplace_back(slot_key_[slot], ValueAt(component, static_cast<int32_t>(slot)));
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
    float* out = values->data() + i * width;
    const int32_t slot = LookupSlot(keys[i]);
    if (slot >= 0) {
      const uint32_t mask = slot_present_[slot];
      (*present)[i] = mask;
      for (size_t c = 0; c < components_.size(); ++c) {
        if (mask & (1u << c)) {
          std::memcpy(out + c * dim, ValueAt(static_cast<int>(c), slot), dim * sizeof(float));
        }
      }
      continue;
    }
    bool on_disk = false;
    if (ssd_) MXREC_RETURN_IF_ERROR(ssd_->Peek(keys[i], &on_disk, &record));
    if (!on_disk) continue;  // no values: the ID restarts from the initializer
    (*present)[i] = record.present;
    for (size_t c = 0; c < components_.size(); ++c) {
      if ((record.present & (1u << c)) && record.values.size() >= (c + 1) * dim) {
        std::copy(record.values.begin() + c * dim, record.values.begin() + (c + 1) * dim,
                  out + c * dim);
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
  ClearStoreLocked();
  arrival_.clear();
  ssd_.reset();  // removes the old file; a new one is opened on the next spill
  for (size_t i = 0; i < keys.size(); ++i) {
    if ((present[i] & ((components.size() >= 32) ? ~0u : (1u << components.size()) - 1)) == 0) {
      continue;
    }
    int32_t slot = LookupSlot(keys[i]);
    if (slot < 0) {
      slot = InsertSlot(keys[i]);
      if (options_.ssd_capacity > 0) arrival_.push_back(keys[i]);
    }
    for (size_t c = 0; c < components.size(); ++c) {
      if (!(present[i] & (1u << c))) continue;
      std::memcpy(ValueLocked(index[c], slot), values.data() + i * width + c * dim,
                  dim * sizeof(float));
      slot_present_[slot] |= 1u << index[c];
    }
  }
  return SpillLocked();
}

TierStats HostTier::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  TierStats stats = stats_;
  stats.host_rows = live_;
  int64_t bytes = static_cast<int64_t>(index_.capacity() * sizeof(IndexEntry) +
                                       slot_key_.capacity() * sizeof(int64_t) +
                                       slot_present_.capacity() * sizeof(uint32_t) +
                                       free_slots_.capacity() * sizeof(int32_t));
  for (const auto& chunks : chunks_) {
    for (const auto& chunk : chunks) {
      if (chunk) bytes += kChunkRows * options_.dim * static_cast<int64_t>(sizeof(float));
    }
  }
  stats.host_bytes = bytes;
  stats.ssd_rows = ssd_ ? ssd_->size() : 0;
  stats.ssd_file_bytes = ssd_ ? ssd_->file_bytes() : 0;
  stats.ssd_compactions = ssd_ ? ssd_->compactions() : 0;
  stats.pending_plans = static_cast<int64_t>(plans_.size());
  return stats;
}

}  // namespace mxrec
