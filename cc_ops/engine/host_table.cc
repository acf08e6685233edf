#include "host_table.h"

#include <algorithm>
#include <array>
#include <climits>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace mxrec {

namespace {
// Below this many IDs a batch is planned on the calling thread: handing work to
// the pool costs more than it saves.
constexpr int64_t kParallelMinIds = 1 << 15;
constexpr int32_t kUnassigned = -2;
constexpr int32_t kDefaultSlot = -1;
constexpr int kShardShift = 60;  // top 4 hash bits pick one of 16 shards
static_assert(HostTable::kNumShards == 16, "kShardShift assumes 16 shards");
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

void HostTable::SetSwapProtect(uint32_t batches) {
  std::lock_guard<std::mutex> lock(mu_);
  swap_protect_ = std::max<uint32_t>(1, batches);
}

KeyRecord* HostTable::FindRecord(int64_t key) {
  const uint64_t hash = HashKey(key);
  return shards_[hash >> kShardShift].Find(key, hash);
}

void HostTable::LruUnlink(int32_t row) {
  const int32_t prev = lru_prev_[row];
  const int32_t next = lru_next_[row];
  if (prev >= 0) {
    lru_next_[prev] = next;
  } else {
    lru_head_ = next;
  }
  if (next >= 0) {
    lru_prev_[next] = prev;
  } else {
    lru_tail_ = prev;
  }
  lru_prev_[row] = lru_next_[row] = -1;
}

void HostTable::LruPushTail(int32_t row) {
  lru_prev_[row] = lru_tail_;
  lru_next_[row] = -1;
  if (lru_tail_ >= 0) {
    lru_next_[lru_tail_] = row;
  } else {
    lru_head_ = row;
  }
  lru_tail_ = row;
}

int32_t HostTable::AllocHostSlot() {
  if (!free_host_slots_.empty()) {
    const int32_t slot = free_host_slots_.back();
    free_host_slots_.pop_back();
    return slot;
  }
  return next_host_slot_++;
}

void HostTable::PlanSpills(SwapPlan* plan) {
  if (options_.ssd_capacity <= 0) return;
  // IDs on disk (or with no values yet) are the tier's IDs without a host slot.
  // With the SSD tier full, host memory holds the rest beyond its size for a
  // while (the tier's total size is checked when rows are handed out).
  while (host_resident_ > options_.host_capacity && !host_arrival_.empty() &&
         tier_ids_ - host_resident_ < options_.ssd_capacity) {
    const auto [key, slot] = host_arrival_.front();
    host_arrival_.pop_front();
    KeyRecord* rec = FindRecord(key);
    if (rec == nullptr || !rec->in_host || rec->host_slot != slot) continue;  // moved since
    rec->host_slot = -1;
    --host_resident_;
    plan->spill_keys.push_back(key);
    plan->spill_slots.push_back(slot);
  }
  // Keep the arrival queue from growing without bound with entries long stale.
  if (static_cast<int64_t>(host_arrival_.size()) > 2 * host_resident_ + 1024) {
    std::deque<std::pair<int64_t, int32_t>> kept;
    for (const auto& entry : host_arrival_) {
      const KeyRecord* rec = FindRecord(entry.first);
      if (rec != nullptr && rec->in_host && rec->host_slot == entry.second) kept.push_back(entry);
    }
    host_arrival_.swap(kept);
  }
}

void HostTable::LruPushHead(int32_t row) {
  lru_prev_[row] = -1;
  lru_next_[row] = lru_head_;
  if (lru_head_ >= 0) {
    lru_prev_[lru_head_] = row;
  } else {
    lru_tail_ = row;
  }
  lru_head_ = row;
}

int32_t HostTable::PickVictim() {
  // Least recently used first; among rows last used by the same batch, the
  // least frequently counted of the first few goes.
  constexpr int kFrequencyWindow = 8;
  const int32_t head = lru_head_;
  if (head < 0 || stamp_ - row_stamp_[head] < swap_protect_) return -1;
  // row_count_ mirrors the owners' counts, so no record lookups are needed.
  const uint32_t head_stamp = row_stamp_[head];
  int32_t best = head;
  float best_count = row_count_[head];
  int32_t row = lru_next_[head];
  for (int i = 1; i < kFrequencyWindow && row >= 0 && row_stamp_[row] == head_stamp; ++i) {
    const float count = row_count_[row];
    if (count < best_count) {
      best = row;
      best_count = count;
    }
    row = lru_next_[row];
  }
  return best;
}

Status HostTable::AssignTieredRows(const std::vector<KeyRecord*>& need,
                                   const std::vector<int32_t>& slots, BatchPlan* plan,
                                   PendingBatch* journal) {
  const int64_t device = options_.device_capacity;
  const int64_t total = device + options_.host_capacity + options_.ssd_capacity;
  int64_t brand_new = 0;
  for (const KeyRecord* rec : need) brand_new += rec->in_host ? 0 : 1;
  const int64_t owned = next_row_ - static_cast<int64_t>(free_rows_.size());
  if (owned + tier_ids_ + brand_new > total) {
    return MXREC_ERROR(StatusCode::kResourceExhausted, "mxrec table '", options_.name,
                       "' is full: ", owned + tier_ids_, " IDs have rows (",
                       device, " device_vocabulary_size + ", options_.host_capacity,
                       " host_vocabulary_size + ", options_.ssd_capacity,
                       " ssd_vocabulary_size = ", total, ") and this batch brings ", brand_new,
                       " more new IDs. Raise host_vocabulary_size (or ssd_vocabulary_size) in "
                       "create_table(), or keep rarely seen IDs out with access_threshold and "
                       "remove stale ones with eviction_threshold.");
  }
  // Rows the step's batches use cannot be victims: count them from the
  // recency list's tail, where they are.
  int64_t protected_rows = 0;
  for (int32_t row = lru_tail_; row >= 0 && stamp_ - row_stamp_[row] < swap_protect_;
       row = lru_prev_[row]) {
    ++protected_rows;
  }
  const int64_t available = static_cast<int64_t>(free_rows_.size()) + (device - next_row_) +
                            (owned - protected_rows);
  if (static_cast<int64_t>(need.size()) > available) {
    return MXREC_ERROR(StatusCode::kResourceExhausted, "mxrec table '", options_.name,
                       "': the device cache cannot hold the batches of one step: they use ",
                       protected_rows, " device rows and this batch needs ", need.size(),
                       " more, but device_vocabulary_size is ", device, " (", swap_protect_,
                       " lookup(s) of the table per step). Raise device_vocabulary_size "
                       "to at least the unique IDs of one step.");
  }
  tier_->TakeReleased(&free_host_slots_);
  // Victims, in the order the loop below hands out rows: free rows first, then
  // never used ones, then victims. Picking them all up front picks the same
  // rows (the rows handed out meanwhile join the recency list's tail as
  // protected), and lets the victims' records load ahead of their use.
  const int64_t spare = static_cast<int64_t>(free_rows_.size()) + (device - next_row_);
  const int64_t victim_count = std::max<int64_t>(0, static_cast<int64_t>(need.size()) - spare);
  std::vector<int32_t> victims(static_cast<size_t>(victim_count));
  std::vector<uint64_t> victim_hash(static_cast<size_t>(victim_count));
  for (int64_t v = 0; v < victim_count; ++v) {
    const int32_t row = PickVictim();
    if (row < 0) {
      // Put the rows back at the head, least recent first, as they were.
      for (int64_t u = v - 1; u >= 0; --u) LruPushHead(victims[u]);
      return MXREC_ERROR(StatusCode::kInternal, "mxrec table '", options_.name,
                         "': no swap victim although the cache count said there was one");
    }
    LruUnlink(row);
    victims[v] = row;
    victim_hash[v] = HashKey(row_key_[row]);
  }
  constexpr int64_t kAhead = 8;
  for (int64_t v = 0; v < std::min(victim_count, kAhead); ++v) {
    shards_[victim_hash[v] >> kShardShift].Prefetch(victim_hash[v]);
  }
  int64_t next_victim = 0;
  SwapPlan swaps;
  for (size_t i = 0; i < need.size(); ++i) {
    if (i + kAhead < need.size()) __builtin_prefetch(need[i + kAhead], 1);
    KeyRecord* rec = need[i];
    int32_t row;
    bool has_out = false;
    int64_t out_key = 0;
    bool refill = true;
    int32_t out_slot = -1;
    if (!free_rows_.empty()) {
      row = free_rows_.back();
      free_rows_.pop_back();
      if (journal != nullptr) journal->popped_free.push_back(row);
    } else if (next_row_ < device) {
      row = static_cast<int32_t>(next_row_++);
      if (journal != nullptr) ++journal->fresh_rows;
      // A never used row holds the variable initializer's value already, as in
      // device-only mode.
      refill = rec->in_host != 0;
    } else {
      const int64_t ahead = next_victim + kAhead;
      if (ahead < victim_count) {
        shards_[victim_hash[ahead] >> kShardShift].Prefetch(victim_hash[ahead]);
      }
      const uint64_t hash = victim_hash[next_victim];
      row = victims[next_victim++];
      KeyRecord* victim = shards_[hash >> kShardShift].Find(row_key_[row], hash);
      victim->row = -1;
      victim->in_host = 1;
      victim->host_slot = AllocHostSlot();
      victim->epoch = epoch_;  // its tier changed: the next delta holds it
      ++tier_ids_;
      ++host_resident_;
      if (options_.ssd_capacity > 0) host_arrival_.emplace_back(victim->key, victim->host_slot);
      has_out = true;
      out_key = victim->key;
      out_slot = victim->host_slot;
    }
    rec->row = row;
    row_key_[row] = rec->key;
    row_stamp_[row] = stamp_;
    row_count_[row] = rec->count;
    LruPushTail(row);
    const bool from_host = rec->in_host != 0;
    const int32_t in_slot = from_host ? rec->host_slot : -1;
    if (from_host) {
      rec->in_host = 0;
      rec->host_slot = -1;
      --tier_ids_;
      if (in_slot >= 0) --host_resident_;
    } else {
      ++plan->new_ids;
      ++stats_.admitted;
      if (journal != nullptr) journal->admitted.push_back(rec->key);
    }
    plan->unique_rows[slots[i]] = row;
    if (refill) {
      plan->reused_rows.push_back(row);
      swaps.rows.push_back(row);
      swaps.out_keys.push_back(out_key);
      swaps.has_out.push_back(has_out ? 1 : 0);
      swaps.out_slots.push_back(out_slot);
      swaps.in_keys.push_back(rec->key);
      swaps.from_host.push_back(from_host ? 1 : 0);
      swaps.in_slots.push_back(in_slot);
    }
  }
  PlanSpills(&swaps);
  tier_->Enqueue(std::move(swaps));
  return Status::Ok();
}

Status HostTable::ReadTier(int component, const int64_t* keys, int64_t n, float* values,
                           bool* found) {
  std::vector<int32_t> slots(static_cast<size_t>(n), -2);
  {
    std::lock_guard<std::mutex> lock(mu_);
    // At the step boundary: where pending swap plans have not moved values yet.
    std::unordered_map<int64_t, Physical> physical;
    if (tier_->pending_plans() > 0) {
      MXREC_RETURN_IF_ERROR(PhysicalView(&physical, nullptr, component));
    }
    for (int64_t i = 0; i < n; ++i) {
      auto moved = physical.find(keys[i]);
      if (moved != physical.end()) {
        if (moved->second.in_host) slots[i] = moved->second.host_slot;
        continue;
      }
      const KeyRecord* rec = FindRecord(keys[i]);
      if (rec != nullptr && rec->in_host) slots[i] = rec->host_slot;
    }
  }
  return tier_->Read(component, keys, slots.data(), n, values, found);
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
  int64_t shortfall = 0;
  // Rows handed out by this batch, to take back if the batch cannot be planned.
  std::vector<std::pair<KeyRecord*, bool>> granted;  // (record, row came from free_rows_)
  int64_t non_padding = 0;
  int64_t defaults = 0;
  std::vector<KeyRecord*> need;     // tiered: admitted IDs without a device row
  std::vector<int32_t> need_slots;  // their indexes in unique_rows
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
        if (rec->row >= 0) {
          row_stamp_[rec->row] = stamp_;
          LruUnlink(rec->row);
          LruPushTail(rec->row);
          g = static_cast<int32_t>(plan->unique_rows.size());
          plan->unique_rows.push_back(rec->row);
        } else if (rec->in_host || Admits(*rec)) {
          // The row is handed out once the whole batch is known, so that no ID
          // of this batch becomes another one's victim.
          g = static_cast<int32_t>(plan->unique_rows.size());
          plan->unique_rows.push_back(-1);
          need.push_back(rec);
          need_slots.push_back(g);
        } else {
          g = kDefaultSlot;
        }
      } else {
        if (rec->row < 0 && Admits(*rec)) {
          if (!free_rows_.empty()) {
            rec->row = free_rows_.back();
            free_rows_.pop_back();
            plan->reused_rows.push_back(rec->row);
            granted.emplace_back(rec, true);
          } else if (next_row_ < options_.device_capacity) {
            rec->row = static_cast<int32_t>(next_row_++);
            granted.emplace_back(rec, false);
          } else {
            ++shortfall;
          }
          if (rec->row >= 0) {
            ++plan->new_ids;
            ++stats_.admitted;
          }
        }
        if (rec->row >= 0) {
          g = static_cast<int32_t>(plan->unique_rows.size());
          plan->unique_rows.push_back(rec->row);
        } else {
          g = kDefaultSlot;
        }
      }
    }
    plan->restore[p] = g;
    if (g == kDefaultSlot) ++defaults;
  }
  if (train) {
    stats_.ids_seen += non_padding;
    stats_.rejected += defaults;
  }
  if (!need.empty()) {
    const Status status = AssignTieredRows(need, need_slots, plan, w.journal);
    if (!status.ok()) {
      plan->unique_rows.clear();
      plan->reused_rows.clear();
      return status;
    }
  }
  if (shortfall > 0) {
    // The step will not run, so no row may keep an ID it was given here: a reused
    // row would otherwise serve the new ID with the evicted ID's trained values.
    for (auto it = granted.rbegin(); it != granted.rend(); ++it) {
      if (it->second) {
        free_rows_.push_back(it->first->row);
      } else {
        --next_row_;
      }
      it->first->row = -1;
    }
    stats_.admitted -= static_cast<int64_t>(granted.size());
    plan->unique_rows.clear();
    plan->reused_rows.clear();
    return MXREC_ERROR(StatusCode::kResourceExhausted, "mxrec table '", options_.name,
                       "' is full: all ", options_.device_capacity,
                       " rows (device_vocabulary_size) are in use and this batch brings ",
                       shortfall,
                       " more new IDs. Raise device_vocabulary_size in create_table(), or "
                       "keep rarely seen IDs out with access_threshold and remove stale ones "
                       "with eviction_threshold.");
  }
  if (w.journal != nullptr && !tiered) {
    for (const auto& [rec, from_free] : granted) {
      w.journal->admitted.push_back(rec->key);
      if (from_free) {
        w.journal->popped_free.push_back(rec->row);
      } else {
        ++w.journal->fresh_rows;
      }
    }
  }
  const int32_t default_index = static_cast<int32_t>(plan->unique_rows.size());
  for (auto& r : plan->restore) {
    if (r == kDefaultSlot) r = default_index;
  }
  return Status::Ok();
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

Status HostTable::PhysicalView(std::unordered_map<int64_t, Physical>* physical,
                               std::unordered_map<int32_t, std::optional<int64_t>>* row_owner,
                               int component) const {
  // Batches planned ahead of their step have moved IDs between the device rows
  // and the host tier in the records, but not yet their values.
  std::vector<SwapPlan> pending;
  bool partly_applied = false;
  tier_->PendingPlans(&pending, &partly_applied);
  if (component >= 0) {
    // Plans this component applied already moved its values.
    pending.erase(std::remove_if(pending.begin(), pending.end(),
                                 [component](const SwapPlan& plan) {
                                   return (plan.applied >> component) & 1u;
                                 }),
                  pending.end());
  } else if (partly_applied) {
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                       "': cannot read the host tier's state in the middle of a training "
                       "step (a swap plan is applied in part); save and evaluate between steps");
  }
  // Undo the plans newest first: what is left is the state before the oldest.
  for (auto plan = pending.rbegin(); plan != pending.rend(); ++plan) {
    for (size_t i = plan->rows.size(); i-- > 0;) {
      const int32_t row = plan->rows[i];
      Physical in;
      if (plan->from_host[i]) {
        in.in_host = 1;
        in.host_slot = plan->in_slots[i];
      }
      (*physical)[plan->in_keys[i]] = in;  // a new ID: no row yet
      if (plan->has_out[i]) {
        Physical out;
        out.row = row;
        (*physical)[plan->out_keys[i]] = out;
      }
      if (row_owner != nullptr) {
        (*row_owner)[row] =
            plan->has_out[i] ? std::optional<int64_t>(plan->out_keys[i]) : std::nullopt;
      }
    }
  }
  return Status::Ok();
}

Status HostTable::ExportState(uint32_t since_epoch, bool delta_chain, TableState* state) {
  std::lock_guard<std::mutex> lock(mu_);
  std::unordered_map<int64_t, Physical> physical;  // IDs a pending plan moved
  // Rows a pending plan refilled -> their owner before it (nullopt: free).
  std::unordered_map<int32_t, std::optional<int64_t>> row_owner;
  if (tier_) MXREC_RETURN_IF_ERROR(PhysicalView(&physical, &row_owner, -1));
  // The pending batches undone, newest first, so that the oldest one's "before"
  // is what remains: each ID's values at the step boundary, or absent.
  std::unordered_map<int64_t, const Undo*> before;
  std::unordered_set<int64_t> unadmitted;
  int64_t next_row = next_row_;
  std::vector<int32_t> free_rows = free_rows_;
  std::unordered_set<int32_t> unowned;  // rows pending batches took
  for (auto batch = pending_.rbegin(); batch != pending_.rend(); ++batch) {
    for (const Undo& u : batch->undo) before[u.key] = &u;
    unadmitted.insert(batch->admitted.begin(), batch->admitted.end());
    next_row -= batch->fresh_rows;
    for (auto row = batch->popped_free.rbegin(); row != batch->popped_free.rend(); ++row) {
      free_rows.push_back(*row);
      unowned.insert(*row);
    }
  }
  const auto physical_of = [&](const KeyRecord* rec) {
    Physical now;
    auto it = physical.find(rec->key);
    if (it != physical.end()) {
      now = it->second;
    } else {
      now.row = rec->row;
      now.in_host = rec->in_host;
      now.host_slot = rec->host_slot;
    }
    if (!unadmitted.empty() && unadmitted.count(rec->key) > 0) now = Physical();
    return now;
  };
  struct Exported {
    KeyRecord* rec;
    const Undo* undo;
    Physical where;
  };
  std::vector<Exported> records;
  for (auto& shard : shards_) {
    shard.ForEach([&](KeyRecord& rec) {
      auto it = before.find(rec.key);
      const Undo* undo = it == before.end() ? nullptr : it->second;
      if (undo != nullptr && undo->inserted) return;  // not known at the boundary
      const uint32_t epoch = undo != nullptr ? undo->epoch : rec.epoch;
      if (since_epoch == 0 || epoch > since_epoch) records.push_back({&rec, undo, physical_of(&rec)});
    });
  }
  std::sort(records.begin(), records.end(), [](const Exported& a, const Exported& b) {
    return a.where.row != b.where.row ? a.where.row < b.where.row : a.rec->key < b.rec->key;
  });
  *state = TableState();
  for (const Exported& e : records) {
    state->keys.push_back(e.rec->key);
    state->rows.push_back(e.where.row);
    state->counts.push_back(e.undo != nullptr ? e.undo->count : e.rec->count);
    state->last_seen.push_back(e.undo != nullptr ? e.undo->last_seen : e.rec->last_seen);
  }
  state->free_rows = std::move(free_rows);
  state->next_row = next_row;
  state->newest_timestamp = BoundaryNewest();
  state->counting_frozen = counting_frozen_;
  state->access_threshold = admission_.access_threshold;
  if (since_epoch > 0) {
    for (const auto& [key, epoch] : removed_log_) {
      if (epoch > since_epoch) state->removed.push_back(key);
    }
  }
  if (tier_) {
    for (const auto& [row, owner] : row_owner) {
      if (!owner.has_value()) unowned.insert(row);
    }
    std::vector<int64_t> host_keys;
    std::vector<int32_t> host_slots;
    state->in_host.reserve(records.size());
    for (const Exported& e : records) {
      state->in_host.push_back(e.where.in_host);
      if (e.where.in_host) {
        host_keys.push_back(e.rec->key);
        host_slots.push_back(e.where.host_slot);
      }
    }
    for (int32_t row = lru_head_; row >= 0; row = lru_next_[row]) {
      if (row >= next_row || unowned.count(row) > 0) continue;
      state->lru_rows.push_back(row);
      state->lru_ages.push_back(std::min<uint32_t>(stamp_ - row_stamp_[row], 1u << 30));
    }
    MXREC_RETURN_IF_ERROR(tier_->Gather(host_keys, host_slots, &state->tier_components,
                                        &state->tier_present, &state->tier_values));
  }
  state->epoch = epoch_++;
  if (delta_chain) {
    track_removals_ = true;
    for (const Exported& e : records) e.rec->in_chain = 1;
  }
  // What the pending batches' steps will change, and IDs saved where a pending
  // plan moves them from: the next delta holds them as they are then.
  for (const auto& [key, undo] : before) {
    KeyRecord* rec = FindRecord(key);
    if (rec != nullptr) rec->epoch = epoch_;
  }
  for (const auto& entry : physical) {
    KeyRecord* rec = FindRecord(entry.first);
    if (rec != nullptr) rec->epoch = epoch_;
  }
  return Status::Ok();
}

void HostTable::PruneRemovedLog(uint32_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  removed_log_.erase(std::remove_if(removed_log_.begin(), removed_log_.end(),
                                    [epoch](const auto& entry) { return entry.second <= epoch; }),
                     removed_log_.end());
}

int64_t HostTable::removed_log_size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(removed_log_.size());
}

Status HostTable::ImportState(const TableState& state) {
  // One critical section: nothing plans a batch between the checks and the
  // replacement.
  std::lock_guard<std::mutex> lock(mu_);
  const size_t n = state.keys.size();
  int64_t host_ids = 0;
  if (!state.in_host.empty()) {
    if (!tier_) {
      for (uint8_t flag : state.in_host) host_ids += flag ? 1 : 0;
      if (host_ids > 0) {
        return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                           "': the checkpoint holds ", host_ids,
                           " IDs in a host tier, but this table has none "
                           "(host_vocabulary_size is 0)");
      }
    } else if (state.in_host.size() != n) {
      return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                         "': checkpointed host-tier flags do not match the IDs");
    }
  }
  if (state.rows.size() != n || state.counts.size() != n || state.last_seen.size() != n) {
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                       "': checkpointed host state has arrays of different lengths");
  }
  if (state.next_row < 0 || state.next_row > options_.device_capacity) {
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                       "': checkpoint uses ", state.next_row,
                       " rows but device_vocabulary_size is ", options_.device_capacity);
  }
  std::vector<uint8_t> taken(state.next_row, 0);
  auto claim = [&](int32_t row) {
    if (row < 0 || row >= state.next_row || taken[row]) return false;
    taken[row] = 1;
    return true;
  };
  for (size_t i = 0; i < n; ++i) {
    if (state.rows[i] >= 0 && !claim(state.rows[i])) {
      return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                         "': checkpointed row ", state.rows[i], " of ID ", state.keys[i],
                         " is out of range or used twice");
    }
  }
  for (int32_t row : state.free_rows) {
    if (!claim(row)) {
      return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                         "': checkpointed free row ", row, " is out of range or in use");
    }
  }
  // Tiered tables: which IDs are in the host tier, and the cache's recency order.
  std::vector<int64_t> host_keys;
  if (tier_) {
    for (size_t i = 0; i < n && !state.in_host.empty(); ++i) {
      if (!state.in_host[i]) continue;
      if (state.rows[i] >= 0) {
        return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                           "': checkpointed ID ", state.keys[i],
                           " has both a device row and a host-tier row");
      }
      host_keys.push_back(state.keys[i]);
    }
    host_ids = static_cast<int64_t>(host_keys.size());
    if (host_ids > options_.host_capacity + options_.ssd_capacity) {
      return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                         "': the checkpoint holds ", host_ids,
                         " IDs in the host tier but host_vocabulary_size + ssd_vocabulary_size "
                         "is ", options_.host_capacity + options_.ssd_capacity);
    }
    int64_t owned = 0;
    for (int32_t row : state.rows) owned += row >= 0 ? 1 : 0;
    if (!state.lru_rows.empty()) {
      if (state.lru_rows.size() != static_cast<size_t>(owned) ||
          state.lru_ages.size() != state.lru_rows.size()) {
        return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                           "': the checkpoint's device-cache order lists ", state.lru_rows.size(),
                           " rows but ", owned, " rows have an ID");
      }
      std::vector<uint8_t> listed(state.next_row, 0);
      for (int32_t row : state.rows) {
        if (row >= 0) listed[row] = 1;
      }
      for (int32_t row : state.lru_rows) {
        if (row < 0 || row >= state.next_row || listed[row] != 1) {
          return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                             "': the checkpoint's device-cache order names row ", row,
                             ", which has no ID or is listed twice");
        }
        listed[row] = 2;
      }
    }
  }
  // Build the new maps aside, so that a bad checkpoint leaves the table as it was.
  std::vector<KeyMap> fresh(kNumShards);
  std::array<int64_t, kNumShards> per_shard{};
  for (int64_t key : state.keys) ++per_shard[HashKey(key) >> kShardShift];
  for (int s = 0; s < kNumShards; ++s) fresh[s].Reserve(per_shard[s]);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t hash = HashKey(state.keys[i]);
    bool inserted = false;
    KeyRecord* rec = fresh[hash >> kShardShift].FindOrInsert(state.keys[i], hash, &inserted);
    if (!inserted) {
      return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                         "': ID ", state.keys[i], " appears twice in the checkpoint");
    }
    rec->row = state.rows[i];
    rec->count = state.counts[i];
    rec->last_seen = state.last_seen[i];
    if (tier_ && !state.in_host.empty()) rec->in_host = state.in_host[i];
    rec->in_chain = 1;  // a restored save: its removals matter to a later delta
  }
  // The new records of host_keys, in order (pointers hold: the maps are full).
  std::vector<KeyRecord*> host_records;
  host_records.reserve(host_keys.size());
  for (int64_t key : host_keys) {
    const uint64_t hash = HashKey(key);
    host_records.push_back(fresh[hash >> kShardShift].Find(key, hash));
  }
  uint32_t stamp = 0;
  if (tier_) {
    std::vector<int32_t> host_slots;
    MXREC_RETURN_IF_ERROR(tier_->Replace(host_keys, state.tier_components, state.tier_present,
                                         state.tier_values, &host_slots));
    free_host_slots_.clear();
    host_arrival_.clear();
    next_host_slot_ = 0;
    host_resident_ = 0;
    for (size_t i = 0; i < host_records.size(); ++i) {
      host_records[i]->host_slot = host_slots[i];
      if (host_slots[i] < 0) continue;
      next_host_slot_ = std::max(next_host_slot_, host_slots[i] + 1);
      ++host_resident_;
      if (options_.ssd_capacity > 0) host_arrival_.emplace_back(host_keys[i], host_slots[i]);
    }
    // Recency: rows keep their order and their ages in batches.
    uint32_t max_age = 0;
    for (uint32_t age : state.lru_ages) max_age = std::max(max_age, age);
    stamp = max_age + 1;
    std::fill(row_key_.begin(), row_key_.end(), 0);
    std::fill(row_stamp_.begin(), row_stamp_.end(), 0);
    std::fill(row_count_.begin(), row_count_.end(), 0.0f);
    std::fill(lru_prev_.begin(), lru_prev_.end(), -1);
    std::fill(lru_next_.begin(), lru_next_.end(), -1);
    lru_head_ = lru_tail_ = -1;
    for (size_t i = 0; i < n; ++i) {
      if (state.rows[i] >= 0) {
        row_key_[state.rows[i]] = state.keys[i];
        row_count_[state.rows[i]] = state.counts[i];
      }
    }
    for (size_t i = 0; i < state.lru_rows.size(); ++i) {
      const int32_t row = state.lru_rows[i];
      row_stamp_[row] = stamp - state.lru_ages[i];
      LruPushTail(row);
    }
    if (state.lru_rows.empty()) {
      // A snapshot without the cache order (a device-only table's, a warm
      // start): owned rows in row order, all equally old.
      std::vector<int32_t> owned_rows;
      for (int32_t row : state.rows) {
        if (row >= 0) owned_rows.push_back(row);
      }
      std::sort(owned_rows.begin(), owned_rows.end());
      for (int32_t row : owned_rows) {
        row_stamp_[row] = stamp;
        LruPushTail(row);
      }
    }
    tier_ids_ = host_ids;
  }
  for (int s = 0; s < kNumShards; ++s) shards_[s] = std::move(fresh[s]);
  free_rows_ = state.free_rows;
  next_row_ = state.next_row;
  newest_timestamp_ = state.newest_timestamp;
  counting_frozen_ = state.counting_frozen;
  admission_.access_threshold = state.access_threshold;
  stamp_ = stamp;
  removed_log_.clear();
  // Batches planned against the state replaced never train: committing one
  // is an error (Commit), and HostTier::Replace dropped their swap plans.
  pending_.clear();
  pending_admitted_.clear();
  import_barrier_ = next_batch_id_;
  return Status::Ok();
}

void HostTable::ExportRows(std::vector<int64_t>* keys, std::vector<int32_t>* rows) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<int32_t, int64_t>> pairs;
  for (const auto& shard : shards_) {
    shard.ForEach([&](const KeyRecord& rec) {
      if (rec.row >= 0) pairs.emplace_back(rec.row, rec.key);
    });
  }
  std::sort(pairs.begin(), pairs.end());
  keys->clear();
  rows->clear();
  for (const auto& [row, key] : pairs) {
    rows->push_back(row);
    keys->push_back(key);
  }
}

}  // namespace mxrec
