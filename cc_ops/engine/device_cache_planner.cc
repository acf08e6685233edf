// The device-cache planner of a tiered table: residency, swap victims (the
// recency list), host slot numbers, spills to the SSD tier, where values are
// while swap plans are pending, and the planner's part of checkpoints. See
// "Host and SSD tiers" in docs/ARCHITECTURE.md.

#include "device_cache_planner.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <utility>

#include "host_table.h"

namespace mxrec {
namespace {

// `key`'s records in the tiered maps `maps` (a restore's new ones); rec is
// null where the maps hold no record of it.
RecordRef FindIn(std::vector<KeyMap>* maps, int64_t key) {
  const uint64_t hash = HashKey(key);
  KeyMap& map = (*maps)[IdMap::ShardOf(hash)];
  const uint32_t index = map.Find(key, hash);
  if (index == KeyMap::kNoRecord) return RecordRef{key, nullptr, nullptr};
  return RecordRef{key, &map.record(index), &map.tier(index)};
}

}  // namespace

DeviceCachePlanner::DeviceCachePlanner(const TableOptions& options, IdMap* ids, DeviceRows* rows)
    : options_(options), ids_(ids), rows_(rows) {
  TierOptions tier;
  tier.name = options_.name;
  tier.dim = options_.dim;
  tier.host_capacity = options_.host_capacity;
  tier.ssd_capacity = options_.ssd_capacity;
  tier.ssd_path = options_.ssd_path;
  tier.embedding_type = options_.embedding_type;
  tier.slot_type = options_.slot_type;
  tier_ = std::make_unique<HostTier>(std::move(tier));
  const size_t device_rows = static_cast<size_t>(options_.device_capacity);
  row_owner_.assign(device_rows, RecordRef{});
  row_stamp_.assign(device_rows, 0);
  row_count_.assign(device_rows, 0.0f);
  lru_prev_.assign(device_rows, -1);
  lru_next_.assign(device_rows, -1);
}

// The scratch of one AssignRows call.
struct DeviceCachePlanner::TierBatch {
  PendingBatch* journal = nullptr;  // deferred training batches
  uint32_t epoch = 0;               // the save epoch victims and arrivals get
  // Rows to take from their owners, in the order they are handed out.
  std::vector<int32_t> victims;
  int64_t next_victim = 0;
  SwapPlan swaps;
};

struct DeviceCachePlanner::RowGrant {
  int32_t row = -1;
  // The row needs the arriving ID's values (from the host tier or the
  // initializer); a never used row holds the initializer's already.
  bool refill = true;
  // The owner leaving the row, and the host slot its values go to.
  bool has_out = false;
  int64_t out_key = 0;
  int32_t out_slot = -1;
};

void DeviceCachePlanner::SetSwapProtect(uint32_t batches) {
  swap_protect_ = std::max<uint32_t>(1, batches);
}

Status DeviceCachePlanner::AssignRows(const std::vector<RecordRef>& need,
                                      const std::vector<int32_t>& slots, uint32_t epoch,
                                      BatchPlan* plan, PendingBatch* journal) {
  MXREC_RETURN_IF_ERROR(CheckRoom(need));
  tier_->TakeReleased(&free_host_slots_, &freed_records_);
  for (int32_t record : freed_records_) ssd_records_.Release(record);
  freed_records_.clear();
  // Victims, in the order the loop below hands out rows: free rows first, then
  // never used ones, then victims. Picking them all up front picks the same
  // rows (the rows handed out meanwhile join the recency list's tail as
  // protected), and lets the victims' records load ahead of their use.
  const int64_t spare = rows_->spare();
  const int64_t victim_count = std::max<int64_t>(0, static_cast<int64_t>(need.size()) - spare);
  TierBatch t;
  t.journal = journal;
  t.epoch = epoch;
  MXREC_RETURN_IF_ERROR(PickVictims(victim_count, t));
  for (size_t i = 0; i < need.size(); ++i) {
    if (i + kAhead < need.size()) {
      __builtin_prefetch(need[i + kAhead].rec, 1);
      __builtin_prefetch(need[i + kAhead].tier, 1);
    }
    const RowGrant grant = TakeDeviceRow(t, need[i]);
    PlaceArrival(need[i], grant, slots[i], t, plan);
  }
  PlanSpills(&t.swaps);
  tier_->Enqueue(std::move(t.swaps));
  return Status::Ok();
}

Status DeviceCachePlanner::CheckRoom(const std::vector<RecordRef>& need) const {
  const int64_t device = options_.device_capacity;
  const int64_t total = device + options_.host_capacity + options_.ssd_capacity;
  int64_t brand_new = 0;
  for (const RecordRef& id : need) brand_new += id.tier->in_host ? 0 : 1;
  const int64_t owned = rows_->in_use();
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
  const int64_t available = rows_->spare() + (owned - protected_rows);
  if (static_cast<int64_t>(need.size()) > available) {
    return MXREC_ERROR(StatusCode::kResourceExhausted, "mxrec table '", options_.name,
                       "': the device cache cannot hold the batches of one step: they use ",
                       protected_rows, " device rows and this batch needs ", need.size(),
                       " more, but device_vocabulary_size is ", device, " (", swap_protect_,
                       " lookup(s) of the table per step). Raise device_vocabulary_size "
                       "to at least the unique IDs of one step.");
  }
  // With an SSD tier, the rows a batch moves out of the device cache wait in
  // host memory until the spill writer has them on disk: a host tier smaller
  // than that would not bound host memory, and is refused.
  const int64_t leaving = static_cast<int64_t>(need.size()) - rows_->spare();
  if (options_.ssd_capacity > 0 && leaving > options_.host_capacity) {
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                       "': host_vocabulary_size (", options_.host_capacity,
                       ") is smaller than the rows one batch needs in the host tier: this "
                       "batch moves ", leaving,
                       " rows out of the device cache, which wait in host memory until they "
                       "are spilled to the SSD tier. Raise host_vocabulary_size in "
                       "create_table() to at least ", leaving,
                       " (the unique IDs of one step), or use smaller batches.");
  }
  return Status::Ok();
}

Status DeviceCachePlanner::PickVictims(int64_t count, TierBatch& t) {
  t.victims.resize(static_cast<size_t>(count));
  for (int64_t v = 0; v < count; ++v) {
    const int32_t row = PickVictim();
    if (row < 0 || row_owner_[row].rec == nullptr) {
      // Put the rows back at the head, least recent first, as they were.
      for (int64_t u = v - 1; u >= 0; --u) LruPushHead(t.victims[u]);
      return MXREC_ERROR(StatusCode::kInternal, "mxrec table '", options_.name, "': ",
                         row < 0 ? "no swap victim although the cache count said there was one"
                                 : "a device row in the recency list has no owner record");
    }
    LruUnlink(row);
    t.victims[v] = row;
  }
  for (int64_t v = 0; v < std::min(count, kAhead); ++v) PrefetchOwner(t.victims[v]);
  return Status::Ok();
}

DeviceCachePlanner::RowGrant DeviceCachePlanner::TakeDeviceRow(TierBatch& t, const RecordRef& id) {
  RowGrant grant;
  if (!rows_->free.empty()) {
    grant.row = rows_->free.back();
    rows_->free.pop_back();
    if (t.journal != nullptr) t.journal->popped_free.push_back(grant.row);
    return grant;
  }
  if (rows_->next < rows_->device_capacity) {
    grant.row = static_cast<int32_t>(rows_->next++);
    if (t.journal != nullptr) ++t.journal->fresh_rows;
    // A never used row holds the variable initializer's value already, as in
    // device-only mode (unless the table draws new IDs' values from the ID).
    grant.refill = id.tier->in_host != 0 || options_.refill_new_rows;
    return grant;
  }
  const int64_t ahead = t.next_victim + kAhead;
  if (ahead < static_cast<int64_t>(t.victims.size())) PrefetchOwner(t.victims[ahead]);
  grant.row = t.victims[t.next_victim++];
  const RecordRef victim = row_owner_[grant.row];
  MoveToHost(victim, t.epoch);
  grant.has_out = true;
  grant.out_key = victim.key;
  grant.out_slot = victim.tier->host_slot;
  return grant;
}

void DeviceCachePlanner::MoveToHost(const RecordRef& victim, uint32_t epoch) {
  victim.rec->row = -1;
  victim.tier->in_host = 1;
  victim.tier->host_slot = AllocHostSlot();
  victim.rec->epoch = epoch;  // its tier changed: the next delta holds it
  ++tier_ids_;
  ++host_resident_;
  if (options_.ssd_capacity > 0) {
    host_arrival_.emplace_back(victim.key, int32_t{victim.tier->host_slot});  // a packed field
  }
}

void DeviceCachePlanner::PlaceArrival(const RecordRef& id, const RowGrant& grant, int32_t slot,
                                      TierBatch& t, BatchPlan* plan) {
  const int32_t row = grant.row;
  id.rec->row = row;
  row_owner_[row] = id;
  row_stamp_[row] = stamp_;
  row_count_[row] = id.rec->count;
  LruPushTail(row);
  TierRecord* tier = id.tier;
  const bool from_host = tier->in_host != 0;
  const int32_t in_slot = from_host ? tier->host_slot : -1;
  if (from_host) {
    tier->in_host = 0;
    tier->host_slot = -1;
    --tier_ids_;
    if (in_slot >= 0) --host_resident_;
  } else {
    ++plan->new_ids;
    if (t.journal != nullptr) t.journal->admitted.push_back(id.key);
  }
  plan->unique_rows[slot] = row;
  if (!grant.refill) return;
  plan->reused_rows.push_back(row);
  SwapPlan& swaps = t.swaps;
  swaps.rows.push_back(row);
  swaps.out_keys.push_back(grant.out_key);
  swaps.has_out.push_back(grant.has_out ? 1 : 0);
  swaps.out_slots.push_back(grant.out_slot);
  swaps.in_keys.push_back(id.key);
  swaps.from_host.push_back(from_host ? 1 : 0);
  swaps.in_slots.push_back(in_slot);
}

int32_t DeviceCachePlanner::PickVictim() {
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

void DeviceCachePlanner::LruPushHead(int32_t row) {
  lru_prev_[row] = -1;
  lru_next_[row] = lru_head_;
  if (lru_head_ >= 0) {
    lru_prev_[lru_head_] = row;
  } else {
    lru_tail_ = row;
  }
  lru_head_ = row;
}

int32_t DeviceCachePlanner::AllocHostSlot() {
  if (!free_host_slots_.empty()) {
    const int32_t slot = free_host_slots_.back();
    free_host_slots_.pop_back();
    return slot;
  }
  return next_host_slot_++;
}

void DeviceCachePlanner::PlanSpills(SwapPlan* plan) {
  if (options_.ssd_capacity <= 0) return;
  // The writer sorts a spill's records and writes each run of consecutive
  // ones with one write; the allocator keeps them together.
  // IDs on disk (or with no values yet) are the tier's IDs without a host slot.
  // With the SSD tier full, host memory holds the rest beyond its size for a
  // while (the tier's total size is checked when rows are handed out).
  while (host_resident_ > options_.host_capacity && !host_arrival_.empty() &&
         tier_ids_ - host_resident_ < options_.ssd_capacity) {
    const auto [key, slot] = host_arrival_.front();
    host_arrival_.pop_front();
    const RecordRef id = ids_->Find(key);
    if (id.rec == nullptr || !id.tier->in_host || id.tier->host_slot != slot) continue;  // moved since
    const int64_t record = ssd_records_.Allocate();
    if (record < 0) {
      host_arrival_.emplace_front(key, slot);  // no record number left: it stays in host memory
      break;
    }
    id.tier->host_slot = SsdSlot(record);
    --host_resident_;
    plan->spill_keys.push_back(key);
    plan->spill_slots.push_back(slot);
    plan->spill_records.push_back(static_cast<int32_t>(record));
  }
  // Keep the arrival queue from growing without bound with entries long stale.
  if (static_cast<int64_t>(host_arrival_.size()) > 2 * host_resident_ + 1024) {
    std::deque<std::pair<int64_t, int32_t>> kept;
    for (const auto& entry : host_arrival_) {
      const RecordRef id = ids_->Find(entry.first);
      if (id.rec != nullptr && id.tier->in_host && id.tier->host_slot == entry.second) {
        kept.push_back(entry);
      }
    }
    host_arrival_.swap(kept);
  }
}

Status DeviceCachePlanner::HostSlots(int component, const int64_t* keys, int64_t n,
                                     std::vector<int32_t>* slots) {
  slots->assign(static_cast<size_t>(n), kNotInTier);
  // At the step boundary: where pending swap plans have not moved values yet.
  std::unordered_map<int64_t, Physical> physical;
  if (tier_->pending_plans() > 0) {
    MXREC_RETURN_IF_ERROR(PhysicalView(&physical, nullptr, component));
  }
  for (int64_t i = 0; i < n; ++i) {
    auto moved = physical.find(keys[i]);
    if (moved != physical.end()) {
      if (moved->second.in_host) (*slots)[i] = moved->second.host_slot;
      continue;
    }
    const RecordRef id = ids_->Find(keys[i]);
    if (id.rec != nullptr && id.tier->in_host) (*slots)[i] = id.tier->host_slot;
  }
  return Status::Ok();
}

void DeviceCachePlanner::EraseTierId(int64_t key, int32_t host_slot) {
  --tier_ids_;
  if (host_slot >= 0) --host_resident_;
  tier_->Erase(key, host_slot);
}

Status DeviceCachePlanner::PhysicalView(std::unordered_map<int64_t, Physical>* physical,
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

void DeviceCachePlanner::ExportRecency(int64_t next_row, const std::unordered_set<int32_t>& unowned,
                                       TableState* state) const {
  for (int32_t row = lru_head_; row >= 0; row = lru_next_[row]) {
    if (row >= next_row || unowned.count(row) > 0) continue;
    state->lru_rows.push_back(row);
    state->lru_ages.push_back(std::min<uint32_t>(stamp_ - row_stamp_[row], 1u << 30));
  }
}

Status DeviceCachePlanner::Restore(const TableState& state, int64_t host_ids,
                                   std::vector<KeyMap>* maps) {
  const size_t width = state.tier_components.size() * static_cast<size_t>(options_.dim);
  if (!state.tier_reader && (state.tier_present.size() != static_cast<size_t>(host_ids) ||
                             state.tier_values.size() != static_cast<size_t>(host_ids) * width)) {
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                       "': checkpointed host-tier values do not match their IDs (", host_ids,
                       " IDs, ", state.tier_present.size(), " masks, ", state.tier_values.size(),
                       " floats for ", state.tier_components.size(), " components of dim ",
                       options_.dim, ")");
  }
  // One chunk of the host-tier IDs at a time, in state order: their keys and
  // new tier records (found by a scan of the state's columns, which are read
  // in place), and their values from the state's reader or its arrays.
  size_t scanned = 0;
  int64_t chunk_begin = 0;
  std::vector<int64_t> keys;
  std::vector<TierRecord*> records;
  const TierChunkReader reader = [&](int64_t begin, int64_t n, TierChunk* chunk) -> Status {
    keys.clear();
    records.clear();
    for (; static_cast<int64_t>(keys.size()) < n && scanned < state.keys.size(); ++scanned) {
      if (!state.in_host[scanned]) continue;
      keys.push_back(state.keys[scanned]);
      records.push_back(FindIn(maps, state.keys[scanned]).tier);
    }
    if (static_cast<int64_t>(keys.size()) != n) {
      return MXREC_ERROR(StatusCode::kInternal, "mxrec table '", options_.name,
                         "': a restore asked for host-tier IDs past the state's ", host_ids);
    }
    chunk_begin = begin;
    chunk->keys = keys.data();
    if (state.tier_reader) return state.tier_reader(begin, n, &chunk->present, &chunk->values);
    chunk->present = state.tier_present.data() + begin;
    chunk->values = state.tier_values.data() + static_cast<size_t>(begin) * width;
    return Status::Ok();
  };
  // The planner's host-slot bookkeeping, kept aside until the tier is replaced.
  int64_t records_used = 0;
  int32_t next_slot = 0;
  int64_t resident = 0;
  std::deque<std::pair<int64_t, int32_t>> arrival;
  const TierSlotSink placed = [&](int64_t i, int32_t slot) {
    const size_t at = static_cast<size_t>(i - chunk_begin);
    records[at]->host_slot = slot;
    if (IsSsdSlot(slot)) records_used = std::max(records_used, SsdRecordOf(slot) + 1);
    if (slot < 0) return;
    next_slot = std::max(next_slot, slot + 1);
    ++resident;
    if (options_.ssd_capacity > 0) arrival.emplace_back(keys[at], slot);
  };
  MXREC_RETURN_IF_ERROR(tier_->ReplaceFrom(host_ids, state.tier_components, reader,
                                           state.tier_reader ? state.tier_chunk_rows : 65536,
                                           placed));
  // Nothing below fails.
  free_host_slots_.clear();
  host_arrival_.swap(arrival);
  next_host_slot_ = next_slot;
  host_resident_ = resident;
  ssd_records_.Reset(records_used);
  stamp_ = RebuildRecency(state, maps);
  tier_ids_ = host_ids;
  return Status::Ok();
}

uint32_t DeviceCachePlanner::RebuildRecency(const TableState& state, std::vector<KeyMap>* maps) {
  uint32_t max_age = 0;
  for (uint32_t age : state.lru_ages) max_age = std::max(max_age, age);
  const uint32_t stamp = max_age + 1;
  std::fill(row_owner_.begin(), row_owner_.end(), RecordRef{});
  std::fill(row_stamp_.begin(), row_stamp_.end(), 0);
  std::fill(row_count_.begin(), row_count_.end(), 0.0f);
  std::fill(lru_prev_.begin(), lru_prev_.end(), -1);
  std::fill(lru_next_.begin(), lru_next_.end(), -1);
  lru_head_ = lru_tail_ = -1;
  for (size_t i = 0; i < state.keys.size(); ++i) {
    if (state.rows[i] >= 0) {
      // BuildMaps put every key in the maps.
      row_owner_[state.rows[i]] = FindIn(maps, state.keys[i]);
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
  return stamp;
}

}  // namespace mxrec
