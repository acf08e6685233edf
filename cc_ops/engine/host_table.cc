// Key-stage planning (Process and its phases, Commit), admission, eviction
// and shrink. The tiered planner is in host_table_tier.cc, checkpoints in
// host_table_state.cc.

#include "host_table.h"

#include <algorithm>
#include <array>
#include <utility>

namespace mxrec {

namespace {
// Below this many IDs a batch is planned on the calling thread: handing work to
// the pool costs more than it saves.
constexpr int64_t kParallelMinIds = 1 << 15;
constexpr int32_t kUnassigned = -2;
constexpr int32_t kDefaultSlot = -1;
}  // namespace

HostTable::HostTable(TableOptions options) : options_(std::move(options)) {
  stats_.capacity = options_.device_capacity;
  if (options_.host_capacity > 0) {
    TierOptions tier;
    tier.name = options_.name;
    tier.dim = options_.dim;
    tier.host_capacity = options_.host_capacity;
    tier.ssd_capacity = options_.ssd_capacity;
    tier.ssd_path = options_.ssd_path;
    tier_ = std::make_unique<HostTier>(std::move(tier));
    const size_t rows = static_cast<size_t>(options_.device_capacity);
    row_key_.assign(rows, 0);
    row_stamp_.assign(rows, 0);
    row_count_.assign(rows, 0.0f);
    lru_prev_.assign(rows, -1);
    lru_next_.assign(rows, -1);
  }
}

KeyRecord* HostTable::FindRecord(int64_t key) {
  const uint64_t hash = HashKey(key);
  return shards_[hash >> kShardShift].Find(key, hash);
}

void HostTable::ConfigureAdmission(const AdmissionOptions& admission) {
  std::lock_guard<std::mutex> lock(mu_);
  admission_ = admission;
}

void HostTable::ShareCounts(std::shared_ptr<SharedCounts> counts) {
  std::lock_guard<std::mutex> lock(mu_);
  shared_counts_ = std::move(counts);
}

bool HostTable::shares_counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return shared_counts_ != nullptr;
}

AdmissionOptions HostTable::admission() const {
  std::lock_guard<std::mutex> lock(mu_);
  return admission_;
}

int64_t HostTable::newest_timestamp() const {
  std::lock_guard<std::mutex> lock(mu_);
  return BoundaryNewest();
}

bool HostTable::Admits(const KeyRecord& rec) const {
  const double threshold = admission_.access_threshold;
  if (threshold > 0.0 && rec.count < threshold) return false;
  if (admission_.probability >= 1.0) return true;
  // The top 53 bits of a keyed hash, as a uniform number in [0, 1).
  const uint64_t h = HashKey(rec.key ^ static_cast<int64_t>(HashKey(static_cast<int64_t>(admission_.seed))));
  return static_cast<double>(h >> 11) * 0x1.0p-53 < admission_.probability;
}

bool HostTable::IsPadding(int64_t key) const {
  const auto& pads = options_.padding_keys;
  return std::find(pads.begin(), pads.end(), key) != pads.end();
}

// The scratch of one Process call.
struct HostTable::BatchWork {
  const int64_t* keys = nullptr;
  int64_t n = 0;
  bool train = false;
  int64_t timestamp = 0;
  bool parallel = false;
  std::vector<uint64_t> hashes;
  std::vector<uint8_t> shard_of;
  std::array<int64_t, kNumShards + 1> offsets{};
  std::vector<int64_t> order;                       // positions grouped by shard
  std::vector<std::vector<KeyRecord*>> uniques;     // per shard, first-seen order
  std::vector<int32_t> local;                       // per position: index in its shard's uniques
  std::vector<std::vector<Undo>> undo;              // per shard (deferred batches)
  PendingBatch* journal = nullptr;                  // deferred training batches
  // AssignRows: tiered tables: admitted IDs without a device row and their
  // indexes in unique_rows; device-only: the rows handed out by this batch
  // (record, row came from free_rows_), to take back if the batch cannot be
  // planned, and the new IDs left without one.
  std::vector<KeyRecord*> need;
  std::vector<int32_t> need_slots;
  std::vector<std::pair<KeyRecord*, bool>> granted;
  int64_t shortfall = 0;
  // Evaluation while batches are pending: where moved IDs' values are.
  std::unordered_map<int64_t, Physical> physical;
};

void HostTable::HashAndGroup(BatchWork& w, ThreadPool* pool) {
  const int64_t n = w.n;
  w.hashes.resize(n);
  w.shard_of.resize(n);
  auto hash_range = [&w](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      w.hashes[i] = HashKey(w.keys[i]);
      w.shard_of[i] = static_cast<uint8_t>(w.hashes[i] >> kShardShift);
    }
  };
  if (w.parallel) {
    const int64_t chunks = pool->num_threads() * 4;
    pool->ParallelFor(chunks, [&](int64_t c) { hash_range(n * c / chunks, n * (c + 1) / chunks); });
  } else {
    hash_range(0, n);
  }
  for (int64_t i = 0; i < n; ++i) ++w.offsets[w.shard_of[i] + 1];
  for (int s = 0; s < kNumShards; ++s) w.offsets[s + 1] += w.offsets[s];
  w.order.resize(n);
  std::array<int64_t, kNumShards> fill{};
  std::copy(w.offsets.begin(), w.offsets.end() - 1, fill.begin());
  for (int64_t i = 0; i < n; ++i) w.order[fill[w.shard_of[i]]++] = i;
}

void HostTable::FindAndCount(BatchWork& w, ThreadPool* pool) {
  const bool has_padding = !options_.padding_keys.empty();
  const bool train = w.train;
  const bool count = train && !counting_frozen_;
  const bool tiered_rows = tier_ != nullptr;
  const bool journal = w.journal != nullptr;
  const float weight = static_cast<float>(admission_.faae_coefficient);
  const uint32_t stamp = dedupe_stamp_;
  w.uniques.assign(kNumShards, {});
  w.local.resize(w.n);
  if (journal) w.undo.assign(kNumShards, {});
  auto plan_shard = [&](int64_t s) {
    KeyMap& map = shards_[s];
    std::vector<KeyRecord*>& uniq = w.uniques[s];
    // No growth inside the loop, so the record pointers kept in `uniq` hold.
    if (train) map.Reserve(w.offsets[s + 1] - w.offsets[s]);
    for (int64_t j = w.offsets[s]; j < w.offsets[s + 1]; ++j) {
      const int64_t p = w.order[j];
      const int64_t key = w.keys[p];
      if (has_padding && IsPadding(key)) {
        w.local[p] = kDefaultSlot;
        continue;
      }
      KeyRecord* rec;
      bool inserted = false;
      if (train) {
        rec = map.FindOrInsert(key, w.hashes[p], &inserted);
      } else {
        rec = map.Find(key, w.hashes[p]);
        if (rec == nullptr) {
          w.local[p] = kDefaultSlot;
          continue;
        }
      }
      if (rec->stamp != stamp) {
        rec->stamp = stamp;
        rec->local = static_cast<int32_t>(uniq.size());
        uniq.push_back(rec);
        if (train) {
          if (journal) {
            w.undo[s].push_back(Undo{key, rec->last_seen, rec->count, rec->epoch,
                                     rec->seen_recently, static_cast<uint8_t>(inserted ? 1 : 0)});
          }
          rec->last_seen = w.timestamp;
          rec->seen_recently = 1;
          rec->epoch = epoch_;
        }
      }
      if (count) {
        rec->count = shared_counts_ ? shared_counts_->Add(key, w.hashes[p], weight)
                                    : rec->count + weight;
        // Tiered: keep the row's copy of its owner's count (rows are disjoint
        // across shards, so the shards write apart).
        if (tiered_rows && rec->row >= 0) row_count_[rec->row] = rec->count;
      }
      w.local[p] = rec->local;
    }
  };
  if (w.parallel) {
    pool->ParallelFor(kNumShards, plan_shard);
  } else {
    for (int s = 0; s < kNumShards; ++s) plan_shard(s);
  }
}

int32_t HostTable::EvalSlot(const BatchWork& w, const KeyRecord& rec, BatchPlan* plan) const {
  // The step boundary: an ID admitted by a pending batch has no row yet, and
  // an ID a pending swap plan moves is still where it was.
  if (!pending_admitted_.empty() && pending_admitted_.count(rec.key) > 0) return kDefaultSlot;
  int32_t row = rec.row;
  if (!w.physical.empty()) {
    auto it = w.physical.find(rec.key);
    if (it != w.physical.end()) row = it->second.row;
  }
  if (row < 0) return kDefaultSlot;
  plan->unique_rows.push_back(row);
  return static_cast<int32_t>(plan->unique_rows.size()) - 1;
}

Status HostTable::Process(const int64_t* keys, int64_t n, bool train, int64_t timestamp,
                          ThreadPool* pool, BatchPlan* plan, bool deferred) {
  plan->unique_rows.clear();
  plan->reused_rows.clear();
  plan->restore.assign(n, 0);
  plan->new_ids = 0;
  plan->batch_id = 0;

  std::lock_guard<std::mutex> lock(mu_);
  if (train) {
    ++stats_.train_batches;
  } else {
    ++stats_.eval_batches;
  }
  if (n == 0) return Status::Ok();
  if (++dedupe_stamp_ == 0) {
    // The stamp wrapped around: forget every stale stamp once.
    for (auto& shard : shards_) shard.ForEach([](KeyRecord& r) { r.stamp = 0; });
    dedupe_stamp_ = 1;
  }
  if (train && ++stamp_ == 0) {
    std::fill(row_stamp_.begin(), row_stamp_.end(), 0);
    stamp_ = 1;
  }
  BatchWork w;
  w.keys = keys;
  w.n = n;
  w.train = train;
  w.timestamp = timestamp;
  w.parallel = pool != nullptr && pool->num_threads() > 1 && n >= kParallelMinIds;
  PendingBatch journal;
  if (train && deferred) {
    journal.id = next_batch_id_;
    journal.newest_before = newest_timestamp_;
    w.journal = &journal;
  }
  if (!train && tier_ != nullptr && tier_->pending_plans() > 0) {
    // Evaluation reads the embedding (component 0) where its values are.
    MXREC_RETURN_IF_ERROR(PhysicalView(&w.physical, nullptr, 0));
  }
  HashAndGroup(w, pool);
  if (train && timestamp > newest_timestamp_) newest_timestamp_ = timestamp;
  FindAndCount(w, pool);
  MXREC_RETURN_IF_ERROR(AssignRows(w, plan));
  if (w.journal != nullptr) {
    for (auto& part : w.undo) {
      journal.undo.insert(journal.undo.end(), part.begin(), part.end());
    }
    for (int64_t key : journal.admitted) pending_admitted_[key] = journal.id;
    plan->batch_id = journal.id;
    ++next_batch_id_;
    pending_.push_back(std::move(journal));
  }
  return Status::Ok();
}

Status HostTable::AssignRows(BatchWork& w, BatchPlan* plan) {
  // In input order, so that the result does not depend on threads: number the
  // batch's distinct IDs by first occurrence, admit, and hand out rows to
  // newly admitted IDs.
  const bool train = w.train;
  const bool tiered = tier_ != nullptr;
  std::vector<std::vector<int32_t>> global(kNumShards);
  for (int s = 0; s < kNumShards; ++s) global[s].assign(w.uniques[s].size(), kUnassigned);
  int64_t non_padding = 0;
  int64_t defaults = 0;
  for (int64_t p = 0; p < w.n; ++p) {
    const int32_t l = w.local[p];
    if (l == kDefaultSlot) {
      plan->restore[p] = kDefaultSlot;
      continue;
    }
    ++non_padding;
    int32_t& g = global[w.shard_of[p]][l];
    if (g == kUnassigned) {
      KeyRecord* rec = w.uniques[w.shard_of[p]][l];
      if (!train) {
        g = EvalSlot(w, *rec, plan);
      } else if (tiered) {
        g = TieredSlot(w, rec, plan);
      } else {
        g = DeviceSlot(w, rec, plan);
      }
    }
    plan->restore[p] = g;
    if (g == kDefaultSlot) ++defaults;
  }
  if (train) {
    stats_.ids_seen += non_padding;
    stats_.rejected += defaults;
  }
  if (!w.need.empty()) {
    const Status status = AssignTieredRows(w.need, w.need_slots, plan, w.journal);
    if (!status.ok()) {
      plan->unique_rows.clear();
      plan->reused_rows.clear();
      return status;
    }
  }
  if (w.shortfall > 0) return RefuseBatch(w, plan);
  if (w.journal != nullptr && !tiered) JournalGrants(w);
  const int32_t default_index = static_cast<int32_t>(plan->unique_rows.size());
  for (auto& r : plan->restore) {
    if (r == kDefaultSlot) r = default_index;
  }
  return Status::Ok();
}

int32_t HostTable::TieredSlot(BatchWork& w, KeyRecord* rec, BatchPlan* plan) {
  const int32_t index = static_cast<int32_t>(plan->unique_rows.size());
  if (rec->row >= 0) {
    row_stamp_[rec->row] = stamp_;
    LruUnlink(rec->row);
    LruPushTail(rec->row);
    plan->unique_rows.push_back(rec->row);
    return index;
  }
  if (rec->in_host || Admits(*rec)) {
    // The row is handed out once the whole batch is known, so that no ID
    // of this batch becomes another one's victim.
    plan->unique_rows.push_back(-1);
    w.need.push_back(rec);
    w.need_slots.push_back(index);
    return index;
  }
  return kDefaultSlot;
}

int32_t HostTable::DeviceSlot(BatchWork& w, KeyRecord* rec, BatchPlan* plan) {
  if (rec->row < 0 && Admits(*rec)) {
    if (!free_rows_.empty()) {
      rec->row = free_rows_.back();
      free_rows_.pop_back();
      plan->reused_rows.push_back(rec->row);
      w.granted.emplace_back(rec, true);
    } else if (next_row_ < options_.device_capacity) {
      rec->row = static_cast<int32_t>(next_row_++);
      w.granted.emplace_back(rec, false);
    } else {
      ++w.shortfall;
    }
    if (rec->row >= 0) {
      ++plan->new_ids;
      ++stats_.admitted;
    }
  }
  if (rec->row < 0) return kDefaultSlot;
  plan->unique_rows.push_back(rec->row);
  return static_cast<int32_t>(plan->unique_rows.size()) - 1;
}

Status HostTable::RefuseBatch(BatchWork& w, BatchPlan* plan) {
  // The step will not run, so no row may keep an ID it was given here: a reused
  // row would otherwise serve the new ID with the evicted ID's trained values.
  for (auto it = w.granted.rbegin(); it != w.granted.rend(); ++it) {
    if (it->second) {
      free_rows_.push_back(it->first->row);
    } else {
      --next_row_;
    }
    it->first->row = -1;
  }
  stats_.admitted -= static_cast<int64_t>(w.granted.size());
  plan->unique_rows.clear();
  plan->reused_rows.clear();
  return MXREC_ERROR(StatusCode::kResourceExhausted, "mxrec table '", options_.name,
                     "' is full: all ", options_.device_capacity,
                     " rows (device_vocabulary_size) are in use and this batch brings ",
                     w.shortfall,
                     " more new IDs. Raise device_vocabulary_size in create_table(), or "
                     "keep rarely seen IDs out with access_threshold and remove stale ones "
                     "with eviction_threshold.");
}

void HostTable::JournalGrants(BatchWork& w) {
  for (const auto& [rec, from_free] : w.granted) {
    w.journal->admitted.push_back(rec->key);
    if (from_free) {
      w.journal->popped_free.push_back(rec->row);
    } else {
      ++w.journal->fresh_rows;
    }
  }
}

Status HostTable::Commit(uint64_t batch_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(pending_.begin(), pending_.end(),
                         [batch_id](const PendingBatch& b) { return b.id == batch_id; });
  if (it == pending_.end()) {
    if (batch_id < import_barrier_) {
      return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                         "': a batch planned before the table was restored reached its step; "
                         "its rows refer to the state the restore replaced. Restore before the "
                         "input pipeline starts, or re-run the iterator initializer "
                         "(mxrec.util.initialize.get_initializer) after restoring.");
    }
    // Retired already by a later batch's commit (two lookups of the table in
    // one step commit in any order).
    return Status::Ok();
  }
  ++it;
  for (auto done = pending_.begin(); done != it; ++done) {
    for (int64_t key : done->admitted) {
      auto entry = pending_admitted_.find(key);
      if (entry != pending_admitted_.end() && entry->second == done->id) {
        pending_admitted_.erase(entry);
      }
    }
  }
  pending_.erase(pending_.begin(), it);
  return Status::Ok();
}

int64_t HostTable::pending_batches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(pending_.size());
}

void HostTable::SetThreshold(double threshold) {
  std::lock_guard<std::mutex> lock(mu_);
  if (threshold == 0.0) {
    counting_frozen_ = true;
  } else {
    counting_frozen_ = false;
    admission_.access_threshold = threshold;
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

int64_t HostTable::EraseUnpending(const std::function<bool(const KeyRecord&)>& pred) {
  std::vector<int64_t> pending_keys = PendingKeys();
  std::sort(pending_keys.begin(), pending_keys.end());
  auto is_pending = [&pending_keys](int64_t key) {
    return std::binary_search(pending_keys.begin(), pending_keys.end(), key);
  };
  int64_t removed = 0;
  for (auto& shard : shards_) {
    removed += shard.EraseIf([&](const KeyRecord& rec) {
      if (!pred(rec) || (!pending_keys.empty() && is_pending(rec.key))) return false;
      if (rec.row >= 0) {
        free_rows_.push_back(rec.row);
        ++stats_.evicted_rows;
        if (tier_) LruUnlink(rec.row);
      }
      if (rec.in_host) {
        --tier_ids_;
        ++stats_.evicted_rows;
        if (rec.host_slot >= 0) --host_resident_;
        tier_->Erase(rec.key, rec.host_slot);
      }
      if (shared_counts_) shared_counts_->Erase(rec.key, HashKey(rec.key));
      // Only a removal a later delta must list: of an ID that a save of the
      // chain holds. The rest (IDs that came and went between saves) would
      // only grow the log.
      if (track_removals_ && rec.in_chain) removed_log_.emplace_back(rec.key, epoch_);
      return true;
    });
  }
  stats_.evicted += removed;
  return removed;
}

int64_t HostTable::Evict(int64_t max_age) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t newest = BoundaryNewest();
  if (newest < 0) return 0;
  const int64_t oldest_kept = newest - max_age;
  return EraseUnpending([&](const KeyRecord& rec) { return rec.last_seen < oldest_kept; });
}

int64_t HostTable::Shrink(int threshold) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& shard : shards_) {
    shard.ForEach([](KeyRecord& rec) {
      if (rec.seen_recently) {
        rec.age = 0;
        rec.seen_recently = 0;
      } else if (rec.age < UINT16_MAX) {
        ++rec.age;
      }
    });
  }
  return EraseUnpending([&](const KeyRecord& rec) { return rec.age >= threshold; });
}

TableStats HostTable::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  TableStats stats = stats_;
  stats.rows_in_use = next_row_ - static_cast<int64_t>(free_rows_.size());
  stats.tier_ids = tier_ids_;
  stats.ids_tracked = 0;
  for (const auto& shard : shards_) stats.ids_tracked += shard.size();
  return stats;
}

}  // namespace mxrec
