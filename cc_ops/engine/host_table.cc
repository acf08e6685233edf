// The core table's own phases: Process (the table's bookkeeping around the
// BatchPlanner, batch_planner.cc, which plans the batch), Commit and the
// pending batches, admission settings, eviction and shrink, statistics. The
// tiered device cache is planned by DeviceCachePlanner
// (device_cache_planner.cc), checkpoints are in host_table_state.cc.

#include "host_table.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <utility>

namespace mxrec {

HostTable::HostTable(TableOptions options)
    : options_(std::move(options)),
      ids_(options_.host_capacity > 0),
      cache_(options_.host_capacity > 0
                 ? std::make_unique<DeviceCachePlanner>(options_, &ids_, &rows_)
                 : nullptr),
      planner_(options_, &ids_, &rows_, cache_.get(), &admission_, &pending_admitted_, &stats_) {
  stats_.device_capacity = options_.device_capacity;
  rows_.device_capacity = options_.device_capacity;
}

HostTable::~HostTable() = default;

void HostTable::ConfigureAdmission(const AdmissionOptions& admission) {
  const auto lock = Lock();
  admission_.options = admission;
}

void HostTable::ShareCounts(std::shared_ptr<SharedCounts> counts) {
  const auto lock = Lock();
  admission_.shared_counts = std::move(counts);
}

bool HostTable::shares_counts() const {
  const auto lock = Lock();
  return admission_.shared_counts != nullptr;
}

AdmissionOptions HostTable::admission() const {
  const auto lock = Lock();
  return admission_.options;
}

int64_t HostTable::newest_timestamp() const {
  const auto lock = Lock();
  return BoundaryNewest();
}

Status HostTable::Process(const int64_t* keys, int64_t n, bool train, int64_t timestamp,
                          ThreadPool* pool, BatchPlan* plan, bool deferred,
                          const int64_t* weights) {
  plan->unique_rows.clear();
  plan->reused_rows.clear();
  if (plan->restore_out == nullptr) plan->restore.assign(n, 0);
  plan->new_ids = 0;
  plan->batch_id = 0;

  const auto lock = Lock();
  if (train) {
    ++stats_.train_batches;
  } else {
    ++stats_.eval_batches;
  }
  // An empty eval batch changes nothing. An empty training batch still moves the batch time
  // forward: on several ranks a rank whose shard of a batch holds no ID of this table must
  // evict as one process that saw the batch does.
  if (n == 0 && !train) return Status::Ok();
  PendingBatch journal;
  BatchInput batch{keys, n, weights, train, timestamp, epoch_, nullptr};
  if (train && deferred) {
    // The retired batch's vectors, emptied: a pipeline's journals are alike in size.
    journal = std::move(spare_);
    journal.Clear();
    journal.id = next_batch_id_.load(std::memory_order_relaxed);
    journal.newest_before = newest_timestamp_;
    batch.journal = &journal;
  }
  if (train && timestamp > newest_timestamp_) newest_timestamp_ = timestamp;
  if (!train) pending_admitted_.Refresh(pending_);
  if (n > 0) MXREC_RETURN_IF_ERROR(planner_.Plan(batch, pool, plan));
  if (batch.journal != nullptr) {
    pending_admitted_.Invalidate();
    plan->batch_id = journal.id;
    next_batch_id_.store(journal.id + 1, std::memory_order_release);
    pending_.push_back(std::move(journal));
  }
  return Status::Ok();
}

Status HostTable::CheckCommit(uint64_t batch_id) const {
  const uint64_t next = next_batch_id_.load(std::memory_order_acquire);
  if (batch_id == 0 || batch_id >= next) {
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                       "': a commit of batch ", batch_id,
                       ", which the table's key stage never planned (",
                       next == 1 ? std::string("it planned none")
                                 : "it planned batches 1 to " + std::to_string(next - 1),
                       "); commit the batch_ids its deferred key stage returned");
  }
  if (batch_id < import_barrier_.load(std::memory_order_acquire)) {
    // ImportState dropped every batch planned before it, so a batch below the
    // barrier is one planned before the restore.
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                       "': a batch planned before the table was restored reached its step; "
                       "its rows refer to the state the restore replaced. Restore before the "
                       "input pipeline starts, or re-run the iterator initializer "
                       "(mxrec.util.initialize.get_initializer) after restoring.");
  }
  return Status::Ok();
}

Status HostTable::Commit(uint64_t batch_id) {
  MXREC_RETURN_IF_ERROR(CheckCommit(batch_id));
  // Two lookups of the table in one step commit in any order: keep the newest.
  uint64_t seen = committed_through_.load(std::memory_order_relaxed);
  while (seen < batch_id &&
         !committed_through_.compare_exchange_weak(seen, batch_id, std::memory_order_release,
                                                   std::memory_order_relaxed)) {
  }
  return Status::Ok();
}

std::unique_lock<std::mutex> HostTable::Lock() const {
  std::unique_lock<std::mutex> lock(mu_);
  RetireCommittedLocked();
  return lock;
}

void HostTable::RetireCommittedLocked() const {
  const uint64_t through = committed_through_.load(std::memory_order_acquire);
  auto done = pending_.begin();
  while (done != pending_.end() && done->id <= through) ++done;
  if (done == pending_.begin()) return;
  spare_ = std::move(*(done - 1));
  pending_.erase(pending_.begin(), done);
  pending_admitted_.Invalidate();
}

int64_t HostTable::pending_batches() const {
  const auto lock = Lock();
  return static_cast<int64_t>(pending_.size());
}

void HostTable::SetThreshold(double threshold) {
  const auto lock = Lock();
  if (threshold == 0.0) {
    admission_.counting_frozen = true;
  } else {
    admission_.counting_frozen = false;
    admission_.options.access_threshold = threshold;
  }
}

std::vector<int64_t> HostTable::PendingKeys() const {
  std::vector<int64_t> keys;
  for (const PendingBatch& batch : pending_) {
    for (const Undo& u : batch.undo) keys.push_back(u.key);
  }
  return keys;
}

int64_t HostTable::BoundaryNewest() const {
  return pending_.empty() ? newest_timestamp_ : pending_.front().newest_before;
}

int64_t HostTable::EraseUnpending(const std::function<bool(const KeyMap&, uint32_t)>& pred) {
  std::vector<int64_t> pending_keys = PendingKeys();
  std::sort(pending_keys.begin(), pending_keys.end());
  auto is_pending = [&pending_keys](int64_t key) {
    return std::binary_search(pending_keys.begin(), pending_keys.end(), key);
  };
  // The side effects run after the scan, in key order: the rows and host slots an
  // eviction frees (and so the rows later IDs get) must not depend on the maps' probe
  // layout, which differs between a table grown batch by batch and one restored from a
  // checkpoint (or planned on another thread count).
  struct Removal {
    int64_t key;
    int32_t row;
    int32_t host_slot;
    bool in_tier;
    bool in_chain;
  };
  std::vector<Removal> removals;
  for (auto& shard : ids_) {
    shard.EraseIf([&](int64_t key, uint32_t index) {
      const KeyRecord& rec = shard.record(index);
      if (!pred(shard, index) || (!pending_keys.empty() && is_pending(key))) return false;
      const bool in_tier = shard.tiered() && shard.tier(index).in_host;
      removals.push_back({key, rec.row, in_tier ? shard.tier(index).host_slot : -1, in_tier,
                          rec.in_chain != 0});
      return true;
    });
  }
  std::sort(removals.begin(), removals.end(),
            [](const Removal& a, const Removal& b) { return a.key < b.key; });
  for (const Removal& r : removals) {
    if (r.row >= 0) {
      rows_.free.push_back(r.row);
      ++stats_.evicted_rows;
      if (cache_) cache_->ReleaseRow(r.row);
    }
    if (r.in_tier) {
      ++stats_.evicted_rows;
      cache_->EraseTierId(r.key, r.host_slot);
    }
    if (admission_.shared_counts) admission_.shared_counts->Erase(r.key, HashKey(r.key));
    // Only a removal a later delta must list: of an ID that a save of the
    // chain holds. The rest (IDs that came and went between saves) would
    // only grow the log.
    if (track_removals_ && r.in_chain) removed_log_.emplace_back(r.key, epoch_);
  }
  const int64_t removed = static_cast<int64_t>(removals.size());
  stats_.evicted += removed;
  return removed;
}

int64_t HostTable::Evict(int64_t max_age) {
  const auto lock = Lock();
  const int64_t newest = BoundaryNewest();
  if (newest < 0) return 0;
  const int64_t oldest_kept = newest - max_age;
  return EraseUnpending([&](const KeyMap& map, uint32_t index) {
    return map.last_seen(index) < oldest_kept;
  });
}

int64_t HostTable::Shrink(int threshold) {
  const auto lock = Lock();
  // The maps keep ages from the first shrink on (a table that never shrinks
  // pays nothing for them).
  for (auto& shard : ids_) shard.PrepareAges();
  for (auto& shard : ids_) {
    shard.ForEach([&shard](int64_t, uint32_t index) {
      KeyRecord& rec = shard.record(index);
      if (rec.seen_recently) {
        shard.set_age(index, 0);
        rec.seen_recently = 0;
      } else if (shard.age(index) < UINT16_MAX) {
        shard.set_age(index, static_cast<uint16_t>(shard.age(index) + 1));
      }
    });
  }
  return EraseUnpending([&](const KeyMap& map, uint32_t index) {
    return map.age(index) >= threshold;
  });
}

TableStats HostTable::Stats() const {
  const auto lock = Lock();
  TableStats stats = stats_;
  stats.rows_in_use = rows_.in_use();
  stats.tier_ids = cache_ != nullptr ? cache_->tier_ids() : 0;
  stats.tiered = cache_ != nullptr;
  stats.ids_tracked = 0;
  for (const auto& shard : ids_) {
    stats.ids_tracked += shard.size();
    stats.id_map_bytes += shard.bytes();
  }
  return stats;
}

void HostTable::SetSwapProtect(uint32_t batches) {
  const auto lock = Lock();
  if (cache_ != nullptr) cache_->SetSwapProtect(batches);
}

Status HostTable::ReadTier(int component, const int64_t* keys, int64_t n, float* values,
                           bool* found) {
  std::vector<int32_t> slots;
  {
    const auto lock = Lock();
    MXREC_RETURN_IF_ERROR(cache_->HostSlots(component, keys, n, &slots));
  }
  // Outside the table's lock: the tier has its own.
  return cache_->tier()->Read(component, keys, slots.data(), n, values, found);
}

}  // namespace mxrec
