#include "host_tier.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

namespace mxrec {

namespace {
// Rows ahead of their use whose memory is prefetched in the swap loops: each
// row costs a few cache misses (its slot's value, its metadata) and little work.
constexpr int64_t kAhead = 16;
// Plans with fewer rows are copied on the calling thread.
std::atomic<int64_t> parallel_min_rows{1 << 15};
std::atomic<int64_t> spill_delay_us{0};

// Runs fn(part, begin, end) on `parts` equal parts of [0, n), on the pool's
// threads when there are several.
void ForParts(ThreadPool* pool, int64_t parts, int64_t n,
              const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  const auto part = [&](int64_t p) { fn(p, n * p / parts, n * (p + 1) / parts); };
  if (parts > 1) {
    pool->ParallelFor(parts, part);
  } else {
    part(0);
  }
}
}  // namespace

void HostTier::SetSpillDelayForTesting(int64_t microseconds) {
  spill_delay_us.store(std::max<int64_t>(0, microseconds));
}

void HostTier::SetParallelMinRows(int64_t rows) { parallel_min_rows.store(std::max<int64_t>(1, rows)); }

HostTier::HostTier(TierOptions options)
    : options_(std::move(options)),
      layout_{options_.dim, options_.embedding_type, options_.slot_type} {
  // Rows per chunk: a power of two, at most 2 MiB of values of the widest
  // component, at least 64 rows.
  const int64_t row_bytes =
      std::max<int64_t>(1, std::max(layout_.ComponentBytes(0), layout_.ComponentBytes(1)));
  chunk_shift_ = 6;
  while (chunk_shift_ < 24 &&
         (int64_t{2} << chunk_shift_) * row_bytes <= static_cast<int64_t>(kHugePageBytes)) {
    ++chunk_shift_;
  }
  chunk_rows_ = int64_t{1} << chunk_shift_;
  components_.push_back(kEmbedding);
  cursor_.push_back(0);
  chunks_.resize(1);
}

HostTier::~HostTier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    spill_stop_ = true;
  }
  spill_work_.notify_all();
  if (spill_writer_.joinable()) spill_writer_.join();
  {
    std::lock_guard<std::mutex> lock(ahead_mu_);
    ahead_stop_ = true;
  }
  ahead_work_.notify_all();
  if (ahead_thread_.joinable()) ahead_thread_.join();
}

HostTier::Chunk HostTier::AllocateChunk(int component) const {
  return Chunk(static_cast<char*>(AllocateLarge(static_cast<size_t>(ChunkBytes(component)))));
}

char* HostTier::ValueIn(std::vector<std::vector<Chunk>>* table, int component,
                        int32_t slot) const {
  auto& chunks = (*table)[component];
  const size_t chunk = static_cast<size_t>(slot >> chunk_shift_);
  if (chunk >= chunks.size()) chunks.resize(chunk + 1);
  if (!chunks[chunk]) chunks[chunk] = AllocateChunk(component);
  return chunks[chunk].get() + (slot & (chunk_rows_ - 1)) * layout_.ComponentBytes(component);
}

char* HostTier::ValueLocked(int component, int32_t slot) {
  return ValueIn(&chunks_, component, slot);
}

Status HostTier::ChunkOutOfMemory(const std::string& component_name) const {
  // Every component but the embedding is an optimizer slot.
  const int component = component_name == kEmbedding ? 0 : 1;
  return OutOfMemory(options_.name,
                     internal::StrCat("a host-tier chunk of ", chunk_rows_, " rows of '",
                                      component_name, "'"),
                     static_cast<size_t>(ChunkBytes(component)));
}

Status HostTier::NotRepresentable(int component, int64_t key) const {
  return MXREC_ERROR(StatusCode::kInternal, "mxrec table '", options_.name, "': a swap brought ",
                     components_[component], " of ID ", key, " a value that ",
                     ElementName(layout_.type(component)),
                     " (its storage_dtype / slot_dtype) cannot hold exactly: the device "
                     "variable is not in the type the host tier stores");
}

void HostTier::EnsureSlotsLocked(int64_t count) {
  if (count > static_cast<int64_t>(meta_.size())) meta_.resize(static_cast<size_t>(count));
}

void HostTier::ReleaseLocked(int32_t slot) {
  if (slot < 0) return;
  EnsureSlotsLocked(int64_t{slot} + 1);
  if (meta_[slot].present != 0) --live_;
  meta_[slot].present = 0;
  std::lock_guard<std::mutex> queue_lock(queue_mu_);
  released_.push_back(slot);
}

void HostTier::DrainLocked() {
  std::vector<SwapPlan> incoming;
  {
    std::lock_guard<std::mutex> queue_lock(queue_mu_);
    incoming.swap(incoming_);
  }
  for (SwapPlan& plan : incoming) {
    plan.seq = next_seq_++;
    plan.applied = 0;
    int32_t top = -1;
    for (int32_t slot : plan.out_slots) top = std::max(top, slot);
    EnsureSlotsLocked(int64_t{top} + 1);
    for (size_t i = 0; i < plan.spill_keys.size(); ++i) {
      pending_spills_[plan.spill_keys[i]].emplace_back(plan.seq, plan.spill_slots[i]);
    }
    plans_.push_back(std::move(plan));
  }
}

Status HostTier::RegisterComponent(const std::string& name, int* index) {
  std::lock_guard<std::mutex> lock(mu_);
  return RegisterLocked(name, index);
}

std::vector<std::string> HostTier::components() const {
  std::lock_guard<std::mutex> lock(mu_);
  return components_;
}

Status HostTier::RegisterLocked(const std::string& name, int* index) {
  DrainLocked();
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
  return RetireAppliedLocked();
}

void HostTier::Enqueue(SwapPlan plan) {
  if (plan.rows.empty() && plan.spill_keys.empty()) return;
  if (options_.ssd_capacity > 0) {
    std::vector<int64_t> records;
    for (size_t i = 0; i < plan.rows.size(); ++i) {
      if (plan.from_host[i] && IsSsdSlot(plan.in_slots[i])) {
        records.push_back(SsdRecordOf(plan.in_slots[i]));
      }
    }
    records.insert(records.end(), plan.spill_records.begin(), plan.spill_records.end());
    if (!records.empty()) {
      std::lock_guard<std::mutex> lock(ahead_mu_);
      if (ahead_jobs_.size() >= kMaxAheadJobs) ahead_jobs_.pop_front();
      ahead_jobs_.push_back(std::move(records));
      if (!ahead_thread_.joinable()) ahead_thread_ = std::thread([this] { ReadAheadLoop(); });
      ahead_work_.notify_one();
    }
  }
  std::lock_guard<std::mutex> queue_lock(queue_mu_);
  incoming_.push_back(std::move(plan));
}

void HostTier::ReadAheadLoop() {
  std::unique_lock<std::mutex> lock(ahead_mu_);
  for (;;) {
    ahead_work_.wait(lock, [this] { return ahead_stop_ || !ahead_jobs_.empty(); });
    if (ahead_stop_) return;
    std::vector<int64_t> records = std::move(ahead_jobs_.front());
    ahead_jobs_.pop_front();
    const std::shared_ptr<SsdReadAhead> target = ahead_target_;
    if (!target) continue;  // no file yet: nothing on disk to read
    const int64_t count = static_cast<int64_t>(records.size());
    lock.unlock();
    const int64_t runs = target->Hint(std::move(records));
    lock.lock();
    ahead_records_ += count;
    ahead_runs_ += runs;
  }
}

void HostTier::SetReadAheadTargetLocked() {
  std::shared_ptr<SsdReadAhead> target = ssd_ ? ssd_->read_ahead() : nullptr;
  std::lock_guard<std::mutex> lock(ahead_mu_);
  ahead_target_ = std::move(target);
}

void HostTier::TakeReleased(std::vector<int32_t>* free_slots,
                            std::vector<int32_t>* free_records) {
  std::lock_guard<std::mutex> queue_lock(queue_mu_);
  free_slots->insert(free_slots->end(), released_.begin(), released_.end());
  released_.clear();
  free_records->insert(free_records->end(), released_records_.begin(), released_records_.end());
  released_records_.clear();
}

void HostTier::ReleaseRecordLocked(int64_t record) {
  if (ssd_) ssd_->Release(record);
  std::lock_guard<std::mutex> queue_lock(queue_mu_);
  released_records_.push_back(static_cast<int32_t>(record));
}

void HostTier::PendingPlans(std::vector<SwapPlan>* plans, bool* partly_applied) {
  std::lock_guard<std::mutex> lock(mu_);
  DrainLocked();
  plans->assign(plans_.begin(), plans_.end());
  *partly_applied = false;
  for (const SwapPlan& plan : plans_) *partly_applied |= plan.applied != 0;
}

int64_t HostTier::pending_plans() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::lock_guard<std::mutex> queue_lock(queue_mu_);
  return static_cast<int64_t>(plans_.size() + incoming_.size());
}

Status HostTier::OpenSsdLocked() {
  if (ssd_) return Status::Ok();
  MXREC_RETURN_IF_ERROR(SsdTier::Open(options_.ssd_path, options_.name, layout_,
                                      static_cast<int64_t>(components_.size()), &ssd_));
  SetReadAheadTargetLocked();
  return Status::Ok();
}

Status HostTier::ReadSpilledLocked(int component, int64_t key, int64_t record, uint64_t seq,
                                   bool strict, float* out, bool* found) {
  *found = false;
  const int64_t dim = options_.dim;
  auto it = pending_spills_.find(key);
  if (it != pending_spills_.end()) {
    // The newest spill queued before plan `seq` holds the key's values.
    int32_t slot = -1;
    for (const auto& [spill_seq, spill_slot] : it->second) {
      if (spill_seq < seq) slot = spill_slot;
    }
    if (slot >= 0) {
      if (HasValue(component, slot)) {
        Load(component, ValueAt(component, slot), out);
        *found = true;
      }
      return Status::Ok();
    }
  }
  // The record stays on disk until every component of the plan read it
  // (FinishPlanLocked frees it), so each component reads its own floats.
  if (strict) {
    bool holds = false;
    if (ssd_) MXREC_RETURN_IF_ERROR(ssd_->Holds(record, key, &holds));
    if (!holds) {
      return MXREC_ERROR(StatusCode::kInternal, "mxrec table '", options_.name,
                         "': SSD record ", record, " does not hold ID ", key,
                         " that a swap plan or a save reads from it");
    }
  }
  if (!ssd_) return Status::Ok();
  return ssd_->ReadComponent(record, key, component, dim, out, found);
}

Status HostTier::FinishPlanLocked(const SwapPlan& plan) {
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    if (!plan.from_host[i]) continue;
    if (plan.in_slots[i] >= 0) {
      ReleaseLocked(plan.in_slots[i]);
      continue;
    }
    // Read back by every component: from disk, or from the slot of an older
    // plan's spill the writer has not written yet (which it now skips).
    const int64_t key = plan.in_keys[i];
    auto it = pending_spills_.find(key);
    if (it != pending_spills_.end()) {
      auto& entries = it->second;
      entries.erase(std::remove_if(entries.begin(), entries.end(),
                                   [&plan](const auto& e) { return e.first < plan.seq; }),
                    entries.end());
      if (entries.empty()) pending_spills_.erase(it);
    }
    if (IsSsdSlot(plan.in_slots[i])) ReleaseRecordLocked(SsdRecordOf(plan.in_slots[i]));
  }
  // The live spills go to the writer; their slots keep the values until they
  // are on disk. A spill whose ID was erased (evicted) or read back meanwhile
  // frees its slot (its record was freed by the erase or the read).
  SpillJob job;
  job.seq = plan.seq;
  for (size_t i = 0; i < plan.spill_keys.size(); ++i) {
    if (SpillPending(plan.spill_keys[i], plan.seq, plan.spill_slots[i])) {
      job.keys.push_back(plan.spill_keys[i]);
      job.slots.push_back(plan.spill_slots[i]);
      job.records.push_back(plan.spill_records[i]);
    } else {
      ReleaseLocked(plan.spill_slots[i]);
    }
  }
  if (job.keys.empty()) return Status::Ok();
  if (!spill_writer_.joinable()) spill_writer_ = std::thread([this] { SpillLoop(); });
  spill_jobs_.push_back(std::move(job));
  spill_work_.notify_one();
  return Status::Ok();
}

bool HostTier::SpillPending(int64_t key, uint64_t seq, int32_t slot) const {
  auto it = pending_spills_.find(key);
  return it != pending_spills_.end() &&
         std::find(it->second.begin(), it->second.end(), std::make_pair(seq, slot)) !=
             it->second.end();
}

void HostTier::WaitSpills(std::unique_lock<std::mutex>* lock, size_t queued) const {
  spill_done_.wait(*lock, [&] {
    return spill_jobs_.size() <= queued && (queued > 0 || !spill_busy_);
  });
}

void HostTier::SpillLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    spill_work_.wait(lock, [this] { return spill_stop_ || !spill_jobs_.empty(); });
    if (spill_stop_) return;
    SpillJob job = std::move(spill_jobs_.front());
    spill_jobs_.pop_front();
    spill_busy_ = true;
    Status status;
    try {
      status = WriteSpill(job, &lock);
    } catch (const std::bad_alloc&) {
      if (!lock.owns_lock()) lock.lock();
      status = OutOfMemory(options_.name, "an SSD spill's write buffer", 0);
    }
    if (!status.ok() && spill_error_.ok()) spill_error_ = status;
    spill_busy_ = false;
    spill_done_.notify_all();
  }
}

Status HostTier::WriteSpill(const SpillJob& job, std::unique_lock<std::mutex>* lock) {
  // Spills dropped while the job waited (the ID erased, or read back) are not written.
  std::vector<int64_t> keys;
  std::vector<int32_t> slots;
  std::vector<int64_t> records;
  std::vector<uint32_t> present;
  std::vector<int64_t> payload;
  for (size_t i = 0; i < job.keys.size(); ++i) {
    if (!SpillPending(job.keys[i], job.seq, job.slots[i])) continue;
    const uint32_t mask = meta_[job.slots[i]].present;
    int top = 0;
    for (size_t c = 0; c < components_.size(); ++c) {
      if (mask & (1u << c)) top = static_cast<int>(c) + 1;
    }
    keys.push_back(job.keys[i]);
    slots.push_back(job.slots[i]);
    records.push_back(job.records[i]);
    present.push_back(mask);
    payload.push_back(layout_.Bytes(top));
  }
  Status status;
  if (!keys.empty()) {
    // Copied from the slots under the lock (in the element types the file
    // keeps too), written without it.
    SsdTier::Append append;
    status = OpenSsdLocked();
    SsdTier* ssd = ssd_.get();
    if (status.ok()) {
      status = ssd->BeginAppend(keys, records, present, payload, [&](size_t i, char* out) {
          const int top = static_cast<int>(layout_.ComponentsIn(payload[i]));
          for (int c = 0; c < top; ++c) {
            const size_t bytes = static_cast<size_t>(layout_.ComponentBytes(c));
            if (present[i] & (1u << c)) {
              std::memcpy(out + layout_.Offset(c), ValueAt(c, slots[i]), bytes);
            } else {
              std::memset(out + layout_.Offset(c), 0, bytes);
            }
          }
        }, &append);
    }
    if (status.ok()) {
      lock->unlock();
      if (const int64_t delay = spill_delay_us.load()) {
        std::this_thread::sleep_for(std::chrono::microseconds(delay));
      }
      status = ssd->WriteAppend(append);
      lock->lock();
    }
    if (!status.ok()) {
      // Not on disk: the values stay in their slots, still read from there.
      for (size_t i = 0; i < job.keys.size(); ++i) {
        if (!SpillPending(job.keys[i], job.seq, job.slots[i])) ReleaseLocked(job.slots[i]);
      }
      return status;
    }
    std::vector<uint8_t> keep(keys.size(), 0);
    for (size_t i = 0; i < keys.size(); ++i) {
      keep[i] = SpillPending(keys[i], job.seq, slots[i]) ? 1 : 0;
      if (!keep[i]) continue;
      auto it = pending_spills_.find(keys[i]);
      auto& entries = it->second;
      entries.erase(std::find(entries.begin(), entries.end(), std::make_pair(job.seq, slots[i])));
      if (entries.empty()) pending_spills_.erase(it);
    }
    ssd->FinishAppend(append, keep);
    stats_.ssd_spilled_records += static_cast<int64_t>(append.numbers.size());
    stats_.ssd_write_runs += append.runs;
    stats_.ssd_write_bytes += static_cast<int64_t>(append.bytes.size());
    stats_.ssd_write_pages += append.pages;
  }
  for (int32_t slot : job.slots) ReleaseLocked(slot);
  return status;
}

Status HostTier::Swap(int component, const int32_t* rows, int64_t n, const float* current,
                      float* incoming, bool* fresh, ThreadPool* pool) {
  const int64_t dim = options_.dim;
  MXREC_RETURN_IF_ERROR(GuardAllocation(options_.name, "a host-tier swap", [&] {
    return SwapRows(
        component, rows, n, [current, dim](int64_t i) { return current + i * dim; },
        [incoming, dim](int64_t i) { return incoming + i * dim; }, fresh, pool);
  }));
  for (int64_t i = 0; i < n; ++i) {
    if (fresh[i]) std::memset(incoming + i * dim, 0, dim * sizeof(float));
  }
  return Status::Ok();
}

Status HostTier::SwapInPlace(int component, const int32_t* rows, int64_t n, float* table,
                             int64_t table_rows, bool* fresh, ThreadPool* pool) {
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] < 0 || rows[i] >= table_rows) {
      return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                         "': swap row ", rows[i], " is outside the device table's ", table_rows,
                         " rows");
    }
  }
  const int64_t dim = options_.dim;
  // Every victim's value is stored before any new owner's value is written, and
  // a plan's rows are distinct, so reading and writing the same rows is safe.
  const auto row = [table, rows, dim](int64_t i) { return table + rows[i] * dim; };
  return GuardAllocation(options_.name, "a host-tier swap",
                         [&] { return SwapRows(component, rows, n, row, row, fresh, pool); });
}

Status HostTier::NextPlanLocked(int component, const int32_t* rows, int64_t n, SwapPlan** next) {
  if (component < 0 || component >= static_cast<int>(components_.size())) {
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                       "': unknown swap component ", component);
  }
  // Plans with spills only (no rows) are applied on the way to this step's.
  const uint32_t bit = 1u << component;
  for (;;) {
    const uint64_t seq = cursor_[component];
    const uint64_t front = plans_.empty() ? next_seq_ : plans_.front().seq;
    if (seq < front || seq >= next_seq_) break;
    SwapPlan& plan = plans_[seq - front];
    if (!plan.rows.empty()) break;
    plan.applied |= bit;
    cursor_[component] = seq + 1;
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
  *next = &plan;
  return Status::Ok();
}

Status HostTier::RetireAppliedLocked() {
  while (!plans_.empty() && plans_.front().applied == AllMask()) {
    MXREC_RETURN_IF_ERROR(FinishPlanLocked(plans_.front()));
    plans_.pop_front();
  }
  return Status::Ok();
}

template <typename CurrentRow>
Status HostTier::StoreVictimsLocked(int component, const SwapPlan& plan, CurrentRow current,
                                    ThreadPool* pool, int64_t parts, int64_t* outs) {
  const int64_t n = static_cast<int64_t>(plan.rows.size());
  const uint32_t bit = 1u << component;
  // A plan's out slots are distinct, and so are its rows: the parts write apart.
  std::vector<int64_t> part_outs(parts, 0);
  std::vector<int64_t> part_live(parts, 0);
  std::vector<int64_t> bad_out(parts, -1);
  std::vector<int64_t> inexact(parts, -1);
  // Rows kAhead ahead are prefetched in the loop's body: GCC drops a prefetch
  // made in a lambda of its own (it sees a call without effects).
  ForParts(pool, parts, n, [&](int64_t p, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t j = i + kAhead;
      if (j < end) {
        __builtin_prefetch(current(j));
        if (plan.has_out[j]) {
          __builtin_prefetch(&meta_[plan.out_slots[j]], 1);
          __builtin_prefetch(ValueAt(component, plan.out_slots[j]), 1);
        }
      }
      if (!plan.has_out[i]) continue;  // no old owner, or evicted since planning
      const int32_t slot = plan.out_slots[i];
      SlotMeta& meta = meta_[slot];
      if (meta.present & bit) {
        bad_out[p] = i;
        return;
      }
      if (meta.present == 0) ++part_live[p];
      meta.key = plan.out_keys[i];
      meta.present |= bit;
      if (!Store(component, current(i), ValueAt(component, slot)) && inexact[p] < 0) {
        inexact[p] = i;
      }
      ++part_outs[p];
    }
  });
  *outs = 0;
  for (int64_t p = 0; p < parts; ++p) {
    if (bad_out[p] >= 0) {
      // Each component alternates out, in, out, ... for a slot; two outs in a
      // row mean plans applied out of order.
      const int64_t i = bad_out[p];
      return MXREC_ERROR(StatusCode::kInternal, "mxrec table '", options_.name, "': host slot ",
                         plan.out_slots[i], " of ID ", plan.out_keys[i],
                         " is written twice without being read (", components_[component], ")");
    }
    *outs += part_outs[p];
    live_ += part_live[p];
  }
  for (int64_t p = 0; p < parts; ++p) {
    if (inexact[p] >= 0) return NotRepresentable(component, plan.out_keys[inexact[p]]);
  }
  return Status::Ok();
}

template <typename IncomingRow>
Status HostTier::LoadArrivalsLocked(int component, const SwapPlan& plan, IncomingRow incoming,
                                    bool* fresh, ThreadPool* pool, int64_t parts, int64_t* ins) {
  const int64_t n = static_cast<int64_t>(plan.rows.size());
  std::vector<int64_t> part_ins(parts, 0);
  std::vector<int64_t> bad_in(parts, -1);
  std::vector<std::vector<int64_t>> spilled(parts);
  ForParts(pool, parts, n, [&](int64_t p, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t j = i + kAhead;
      if (j < end && plan.from_host[j]) {
        const int32_t slot = plan.in_slots[j];
        if (slot >= 0 && static_cast<size_t>(slot) < meta_.size()) {
          __builtin_prefetch(&meta_[slot]);
          if (HasChunk(component, slot)) __builtin_prefetch(ValueAt(component, slot));
        }
      }
      fresh[i] = true;
      if (!plan.from_host[i]) continue;
      const int32_t slot = plan.in_slots[i];
      if (slot == kNoValues) continue;  // restored without values: the initializer's
      if (slot < 0) {
        spilled[p].push_back(i);
        continue;
      }
      if (static_cast<size_t>(slot) < meta_.size() && meta_[slot].present != 0 &&
          meta_[slot].key != plan.in_keys[i]) {
        bad_in[p] = i;
        return;
      }
      // No value: a component registered after the ID left (it starts afresh).
      if (HasValue(component, slot)) {
        Load(component, ValueAt(component, slot), incoming(i));
        fresh[i] = false;
        ++part_ins[p];
      }
    }
  });
  *ins = 0;
  for (int64_t p = 0; p < parts; ++p) {
    if (bad_in[p] >= 0) {
      const int64_t i = bad_in[p];
      const int32_t slot = plan.in_slots[i];
      return MXREC_ERROR(StatusCode::kInternal, "mxrec table '", options_.name,
                         "': host slot ", slot, " holds ID ", meta_[slot].key, ", not ID ",
                         plan.in_keys[i], " that the plan reads from it");
    }
    *ins += part_ins[p];
    for (int64_t i : spilled[p]) {
      bool found = false;
      MXREC_RETURN_IF_ERROR(ReadSpilledLocked(component, plan.in_keys[i],
                                              SsdRecordOf(plan.in_slots[i]), plan.seq, true,
                                              incoming(i), &found));
      fresh[i] = !found;
      *ins += found ? 1 : 0;
    }
  }
  return Status::Ok();
}

template <typename CurrentRow, typename IncomingRow>
Status HostTier::SwapRows(int component, const int32_t* rows, int64_t n, CurrentRow current,
                          IncomingRow incoming, bool* fresh, ThreadPool* pool) {
  if (n == 0) return Status::Ok();
  std::unique_lock<std::mutex> lock(mu_);
  if (!spill_error_.ok()) {  // the spill writer's, reported once
    Status error = spill_error_;
    spill_error_ = Status::Ok();
    return error;
  }
  DrainLocked();
  SwapPlan* next = nullptr;
  MXREC_RETURN_IF_ERROR(NextPlanLocked(component, rows, n, &next));
  SwapPlan& plan = *next;
  const uint64_t seq = cursor_[component];
  // Every value block a victim is written to exists before the copies start,
  // so that the copy loops allocate nothing and may run on several threads,
  // and so that running out of memory leaves the plan unapplied.
  try {
    for (int64_t i = 0; i < n; ++i) {
      if (plan.has_out[i]) ValueLocked(component, plan.out_slots[i]);
    }
  } catch (const std::bad_alloc&) {
    return ChunkOutOfMemory(components_[component]);
  }
  const int64_t parts =
      (pool != nullptr && pool->num_threads() > 1 && n >= parallel_min_rows.load())
          ? std::min<int64_t>(pool->num_threads(), n)
          : 1;
  // Victims first: their values go to the slots the planner gave them. Then
  // the new owners' values: from their host slots, or from disk.
  int64_t outs = 0;
  MXREC_RETURN_IF_ERROR(StoreVictimsLocked(component, plan, current, pool, parts, &outs));
  int64_t ins = 0;
  MXREC_RETURN_IF_ERROR(LoadArrivalsLocked(component, plan, incoming, fresh, pool, parts, &ins));
  if (component == 0) {
    // With several lookups of the table in one step, "last" is the last plan.
    stats_.swap_out_total += outs;
    stats_.swap_in_total += ins;
    stats_.fresh_total += n - ins;
    stats_.swap_out_last = outs;
    stats_.swap_in_last = ins;
  }
  plan.applied |= 1u << component;
  cursor_[component] = seq + 1;
  const Status status = RetireAppliedLocked();
  // At most one more plan's spills wait behind the one being written.
  WaitSpills(&lock, 1);
  return status;
}

Status HostTier::Read(int component, const int64_t* keys, const int32_t* slots, int64_t n,
                      float* values, bool* found) {
  std::lock_guard<std::mutex> lock(mu_);
  DrainLocked();
  const int64_t dim = options_.dim;
  for (int64_t i = 0; i < n; ++i) {
    found[i] = false;
    float* out = values + i * dim;
    const int32_t slot = slots[i];
    if (slot >= 0) {
      // The planner may be ahead of the values: trust the slot only if it
      // holds the key already.
      if (HasValue(component, slot) && meta_[slot].key == keys[i]) {
        Load(component, ValueAt(component, slot), out);
        found[i] = true;
      }
    } else if (IsSsdSlot(slot)) {
      MXREC_RETURN_IF_ERROR(ReadSpilledLocked(component, keys[i], SsdRecordOf(slot), next_seq_,
                                              false, out, &found[i]));
    }
    if (!found[i]) std::memset(out, 0, dim * sizeof(float));
  }
  return Status::Ok();
}

void HostTier::Erase(int64_t key, int32_t slot) {
  std::lock_guard<std::mutex> lock(mu_);
  DrainLocked();
  // A pending plan must not write the evicted ID's values to its slot afterwards.
  for (auto& plan : plans_) {
    for (size_t i = 0; i < plan.rows.size(); ++i) {
      if (plan.has_out[i] && plan.out_keys[i] == key) plan.has_out[i] = 0;
    }
  }
  if (slot >= 0) ReleaseLocked(slot);
  // Spills still pending skip the key (their slots are freed with their plan);
  // the record the planner gave it is free once the key is gone (a later
  // spill to it is written after any still in flight: one writer, in order).
  pending_spills_.erase(key);
  if (IsSsdSlot(slot)) ReleaseRecordLocked(SsdRecordOf(slot));
}

Status HostTier::Export(int component, std::vector<int64_t>* keys, std::vector<float>* values) {
  std::unique_lock<std::mutex> lock(mu_);
  WaitSpills(&lock, 0);
  const int64_t dim = options_.dim;
  const uint32_t bit = 1u << component;
  // (key, where): a host slot (>= 0), or from_disk[-1 - where] (decoded already).
  std::vector<std::pair<int64_t, int64_t>> found;
  std::vector<std::vector<float>> from_disk;
  for (size_t slot = 0; slot < meta_.size(); ++slot) {
    if (meta_[slot].present & bit) found.emplace_back(meta_[slot].key, slot);
  }
  if (ssd_) {
    MXREC_RETURN_IF_ERROR(ssd_->ForEach([&](int64_t key, const SsdRecord& record) {
      if (record.present & bit) {
        found.emplace_back(key, -1 - static_cast<int64_t>(from_disk.size()));
        from_disk.emplace_back(record.values.begin() + component * dim,
                               record.values.begin() + (component + 1) * dim);
      }
    }));
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  keys->clear();
  values->assign(found.size() * dim, 0.0f);
  for (size_t i = 0; i < found.size(); ++i) {
    const auto [key, where] = found[i];
    keys->push_back(key);
    float* out = values->data() + i * dim;
    if (where >= 0) {
      Load(component, ValueAt(component, static_cast<int32_t>(where)), out);
    } else {
      std::copy(from_disk[-1 - where].begin(), from_disk[-1 - where].end(), out);
    }
  }
  return Status::Ok();
}

Status HostTier::Gather(const std::vector<int64_t>& keys, const std::vector<int32_t>& slots,
                        std::vector<std::string>* components, std::vector<uint32_t>* present,
                        std::vector<float>* values) const {
  // Spills the writer has not written yet are read from their slots (below):
  // a save does not wait for the disk.
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t dim = options_.dim;
  const size_t width = components_.size() * static_cast<size_t>(dim);
  *components = components_;
  present->assign(keys.size(), 0);
  values->assign(keys.size() * width, 0.0f);
  if (ssd_) {
    // The IDs come in the save's order, their records anywhere in the file:
    // all their reads are queued at once, in file order, before the loop
    // below reads them one by one.
    std::vector<int64_t> records;
    for (int32_t slot : slots) {
      if (IsSsdSlot(slot)) records.push_back(SsdRecordOf(slot));
    }
    ssd_->read_ahead()->Hint(std::move(records));
  }
  SsdRecord record;
  for (size_t i = 0; i < keys.size(); ++i) {
    float* out = values->data() + i * width;
    // In host memory: its slot, or, on its way to disk (a pending plan spills
    // it), the slot it is spilled from.
    int32_t from = -1;
    if (slots[i] >= 0) {
      if (static_cast<size_t>(slots[i]) >= meta_.size() || meta_[slots[i]].key != keys[i]) {
        continue;
      }
      from = slots[i];
    } else {
      auto spill = pending_spills_.find(keys[i]);
      if (spill != pending_spills_.end() && !spill->second.empty()) {
        from = spill->second.back().second;
      }
    }
    if (from >= 0) {
      const uint32_t mask = static_cast<size_t>(from) < meta_.size() ? meta_[from].present : 0;
      (*present)[i] = mask;
      for (size_t c = 0; c < components_.size(); ++c) {
        if (mask & (1u << c)) {
          Load(static_cast<int>(c), ValueAt(static_cast<int>(c), from), out + c * dim);
        }
      }
      continue;
    }
    if (!IsSsdSlot(slots[i])) continue;  // no values: the ID restarts from the initializer
    bool on_disk = false;
    const int64_t number = SsdRecordOf(slots[i]);
    if (ssd_) MXREC_RETURN_IF_ERROR(ssd_->Peek(number, keys[i], &on_disk, &record));
    if (!on_disk) {
      return MXREC_ERROR(StatusCode::kInternal, "mxrec table '", options_.name,
                         "': SSD record ", number, " does not hold ID ", keys[i],
                         " that the save reads from it");
    }
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

Status HostTier::ReplaceFrom(int64_t count, const std::vector<std::string>& components,
                             const TierChunkReader& reader, int64_t chunk_rows,
                             const TierSlotSink& placed) {
  if (chunk_rows < 1) {
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                       "': a restore's chunk of host-tier rows must hold at least one row, got ",
                       chunk_rows);
  }
  std::unique_lock<std::mutex> lock(mu_);
  WaitSpills(&lock, 0);  // the writer holds slots and the file of the state replaced
  return GuardAllocation(options_.name, "restoring the host tier", [&] {
    return ReplaceLocked(count, components, reader, chunk_rows, placed);
  });
}

// A tier's new contents, built aside by ReplaceLocked.
struct HostTier::Rebuilt {
  // The registered components, then the checkpoint's new ones; the
  // checkpoint's component c is names[index[c]].
  std::vector<std::string> names;
  std::vector<int> index;
  std::vector<SlotMeta, HugePageAllocator<SlotMeta>> meta;
  std::vector<std::vector<Chunk>> chunks;
  int64_t live = 0;
  std::unique_ptr<SsdTier> ssd;
  int64_t records = 0;  // SSD records written, numbered from 0
};

Status HostTier::ReplaceLocked(int64_t count, const std::vector<std::string>& components,
                               const TierChunkReader& reader, int64_t chunk_rows,
                               const TierSlotSink& placed) {
  DrainLocked();
  // The new state is built aside and replaces the old one only once all of it,
  // the SSD file included, is written: a restore that fails on the way (disk,
  // memory, a bad checkpoint) leaves the tier as it was. The old file keeps
  // serving the old state until the swap below.
  Rebuilt next;
  MXREC_RETURN_IF_ERROR(MapComponents(components, &next));
  MXREC_RETURN_IF_ERROR(FillAside(count, components, reader, chunk_rows, placed, &next));
  cursor_.reserve(next.names.size());
  // Nothing below fails: the new state replaces the old one.
  InstallLocked(&next);
  return Status::Ok();
}

Status HostTier::MapComponents(const std::vector<std::string>& components, Rebuilt* next) const {
  // Components of the checkpoint that are new here are registered with it.
  next->names = components_;
  next->index.resize(components.size());
  for (size_t c = 0; c < components.size(); ++c) {
    auto it = std::find(next->names.begin(), next->names.end(), components[c]);
    if (it == next->names.end()) {
      if (next->names.size() >= kMaxComponents) {
        return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                           "': more than ", kMaxComponents,
                           " optimizer slots swap through the host tier");
      }
      it = next->names.insert(next->names.end(), components[c]);
    }
    next->index[c] = static_cast<int>(it - next->names.begin());
  }
  return Status::Ok();
}

Status HostTier::FillAside(int64_t count, const std::vector<std::string>& components,
                           const TierChunkReader& reader, int64_t chunk_rows,
                           const TierSlotSink& placed, Rebuilt* next) const {
  next->chunks.resize(next->names.size());
  int32_t next_slot = 0;
  for (int64_t begin = 0; begin < count; begin += chunk_rows) {
    const int64_t n = std::min(chunk_rows, count - begin);
    TierChunk chunk;
    MXREC_RETURN_IF_ERROR(reader(begin, n, &chunk));
    MXREC_RETURN_IF_ERROR(FillChunk(chunk, begin, static_cast<size_t>(n), components, placed,
                                    &next_slot, next));
  }
  return Status::Ok();
}

Status HostTier::FillChunk(const TierChunk& chunk, int64_t begin, size_t n,
                           const std::vector<std::string>& components, const TierSlotSink& placed,
                           int32_t* next_slot, Rebuilt* next) const {
  const size_t width = components.size() * static_cast<size_t>(options_.dim);
  const uint32_t mask = components.size() >= 32 ? ~0u : (1u << components.size()) - 1;
  // Beyond host_capacity the rows go to a new SSD file: the chunk's places of
  // those IDs (4 bytes each), their records numbered from `first`.
  std::vector<uint32_t> disk;
  const int64_t first = next->records;
  for (size_t j = 0; j < n; ++j) {
    const int64_t i = begin + static_cast<int64_t>(j);
    if ((chunk.present[j] & mask) == 0) {  // no values: restarts from the initializer
      placed(i, -1);
      continue;
    }
    if (*next_slot < options_.host_capacity) {
      const int32_t slot = (*next_slot)++;
      MXREC_RETURN_IF_ERROR(StoreAside(slot, chunk.keys[j], chunk.present[j],
                                       chunk.values + j * width, components, next));
      placed(i, slot);
      continue;
    }
    if (options_.ssd_capacity <= 0) {
      return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                         "': the checkpoint holds more host-tier IDs than "
                         "host_vocabulary_size (", options_.host_capacity,
                         ") and the table has no SSD tier");
    }
    if (next->records >= std::min(options_.ssd_capacity, SsdTier::kMaxRecords)) {
      return MXREC_ERROR(StatusCode::kResourceExhausted, "mxrec table '", options_.name,
                         "': the checkpoint holds more host-tier IDs than "
                         "host_vocabulary_size (", options_.host_capacity,
                         ") and ssd_vocabulary_size (", options_.ssd_capacity,
                         ") together. Raise ssd_vocabulary_size or host_vocabulary_size in "
                         "create_table().");
    }
    placed(i, SsdSlot(next->records++));
    disk.push_back(static_cast<uint32_t>(j));
  }
  if (disk.empty()) return Status::Ok();
  if (!next->ssd) {
    MXREC_RETURN_IF_ERROR(SsdTier::Open(options_.ssd_path, options_.name, layout_,
                                        static_cast<int64_t>(next->names.size()), &next->ssd));
  }
  return WriteAside(chunk, disk, first, components, next);
}

Status HostTier::StoreAside(int32_t slot, int64_t key, uint32_t present, const float* row,
                            const std::vector<std::string>& components, Rebuilt* next) const {
  const int64_t dim = options_.dim;
  next->meta.resize(static_cast<size_t>(slot) + 1);
  next->meta[slot].key = key;
  for (size_t c = 0; c < components.size(); ++c) {
    if (!(present & (1u << c))) continue;
    char* value = nullptr;
    try {
      value = ValueIn(&next->chunks, next->index[c], slot);
    } catch (const std::bad_alloc&) {
      return ChunkOutOfMemory(components[c]);
    }
    // A checkpoint's values, rounded to the element type (exact when they left
    // a table of the same types).
    Store(next->index[c], row + c * dim, value);
    next->meta[slot].present |= 1u << next->index[c];
  }
  ++next->live;
  return Status::Ok();
}

Status HostTier::WriteAside(const TierChunk& chunk, const std::vector<uint32_t>& at,
                            int64_t first, const std::vector<std::string>& components,
                            Rebuilt* next) const {
  const int64_t dim = options_.dim;
  const size_t width = components.size() * static_cast<size_t>(dim);
  // Records go out a few MiB at a time (one sequential write each: their numbers
  // follow each other), encoded from the chunk's rows, so that the chunk's
  // values are never held a second time.
  constexpr size_t kBatchBytes = size_t{8} << 20;
  const size_t batch = std::max<size_t>(
      1, kBatchBytes / static_cast<size_t>(SsdTier::kHeaderBytes + layout_.Bytes(
                                                static_cast<int64_t>(next->names.size()))));
  std::vector<int64_t> keys;
  std::vector<int64_t> numbers;
  std::vector<uint32_t> present;
  std::vector<int64_t> payload;
  for (size_t begin = 0; begin < at.size(); begin += batch) {
    const size_t end = std::min(at.size(), begin + batch);
    keys.clear();
    numbers.clear();
    present.clear();
    payload.clear();
    for (size_t k = begin; k < end; ++k) {
      const uint32_t mask = chunk.present[at[k]];
      uint32_t mapped = 0;
      int top = 0;
      for (size_t c = 0; c < components.size(); ++c) {
        if (!(mask & (1u << c))) continue;
        mapped |= 1u << next->index[c];
        top = std::max(top, next->index[c] + 1);
      }
      keys.push_back(chunk.keys[at[k]]);
      numbers.push_back(first + static_cast<int64_t>(k));
      present.push_back(mapped);
      payload.push_back(layout_.Bytes(top));
    }
    // Values from a checkpoint: rounded to the element types (exact when they
    // left a table of the same types).
    const auto fill = [&](size_t i, char* out) {
      const uint32_t mask = chunk.present[at[begin + i]];
      const float* row = chunk.values + at[begin + i] * width;
      for (size_t c = 0; c < components.size(); ++c) {
        if (!(mask & (1u << c))) continue;
        const int to = next->index[c];
        EncodeRow(layout_.type(to), row + c * dim, dim, out + layout_.Offset(to));
      }
    };
    SsdTier::Append append;
    MXREC_RETURN_IF_ERROR(next->ssd->BeginAppend(keys, numbers, present, payload, fill, &append));
    MXREC_RETURN_IF_ERROR(next->ssd->WriteAppend(append));
    next->ssd->FinishAppend(append, std::vector<uint8_t>(keys.size(), 1));
  }
  return Status::Ok();
}

void HostTier::InstallLocked(Rebuilt* next) {
  while (components_.size() < next->names.size()) {
    components_.push_back(next->names[components_.size()]);
    cursor_.push_back(next_seq_);
  }
  plans_.clear();
  for (auto& cursor : cursor_) cursor = next_seq_;
  {
    std::lock_guard<std::mutex> queue_lock(queue_mu_);
    released_.clear();
    released_records_.clear();
  }
  pending_spills_.clear();
  meta_.swap(next->meta);
  live_ = next->live;
  chunks_.swap(next->chunks);
  ssd_ = std::move(next->ssd);  // removes the old file; a new one is opened on the next spill
  SetReadAheadTargetLocked();
}

TierStats HostTier::Stats() const {
  std::unique_lock<std::mutex> lock(mu_);
  WaitSpills(&lock, 0);  // rows on disk counted once written
  std::lock_guard<std::mutex> queue_lock(queue_mu_);
  TierStats stats = stats_;
  stats.host_rows = live_;
  int64_t bytes = static_cast<int64_t>(
      meta_.capacity() * sizeof(SlotMeta) +
      (released_.capacity() + released_records_.capacity()) * sizeof(int32_t));
  for (size_t c = 0; c < chunks_.size(); ++c) {
    for (const auto& chunk : chunks_[c]) {
      if (chunk) bytes += ChunkBytes(static_cast<int>(c));
    }
  }
  stats.host_bytes = bytes + (ssd_ ? ssd_->ram_bytes() : 0);
  stats.host_row_bytes = layout_.Bytes(static_cast<int64_t>(components_.size()));
  stats.ssd_rows = ssd_ ? ssd_->size() : 0;
  stats.ssd_file_bytes = ssd_ ? ssd_->file_bytes() : 0;
  stats.ssd_record_bytes = ssd_ ? ssd_->record_bytes() : 0;
  stats.pending_plans = static_cast<int64_t>(plans_.size() + incoming_.size());
  std::lock_guard<std::mutex> ahead_lock(ahead_mu_);
  stats.ssd_read_ahead_records = ahead_records_;
  stats.ssd_read_ahead_runs = ahead_runs_;
  return stats;
}

}  // namespace mxrec
