// HostTable's checkpoints: ExportState (the state at the step boundary, full
// or delta) and ImportState (checked, then built aside and swapped in). See
// "Checkpoints" and "The step boundary: pending batches" in
// docs/ARCHITECTURE.md.

#include "host_table.h"

#include <algorithm>
#include <array>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace mxrec {

struct HostTable::Boundary {
  // The pending batches undone, newest first, so that the oldest one's
  // "before" is what remains: each ID's values at the step boundary, or
  // absent.
  std::unordered_map<int64_t, const Undo*> before;
  std::unordered_set<int64_t> unadmitted;  // IDs the pending batches admitted
  int64_t next_row = 0;
  std::vector<int32_t> free_rows;
  // Rows without an owner at the boundary: taken by pending batches, or
  // refilled from free by pending swap plans.
  std::unordered_set<int32_t> unowned;
  std::unordered_map<int64_t, Physical> physical;  // IDs a pending plan moved
};

struct HostTable::ExportedRecord {
  int64_t key;
  KeyRecord* rec;
  int64_t last_seen;
  const Undo* undo;  // its values at the boundary, if a pending batch changed them
  Physical where;
};

Status HostTable::ExportState(uint32_t since_epoch, bool delta_chain, TableState* state) {
  const auto lock = Lock();
  Boundary boundary;
  MXREC_RETURN_IF_ERROR(ViewBoundary(&boundary));
  // The caller's chunked writers (and their chunk size) outlive the reset.
  auto tier_writer = std::move(state->tier_writer);
  auto record_writer = std::move(state->record_writer);
  const int64_t tier_chunk_rows = state->tier_chunk_rows;
  *state = TableState();
  state->tier_writer = std::move(tier_writer);
  state->record_writer = std::move(record_writer);
  state->tier_chunk_rows = tier_chunk_rows;
  std::vector<ExportedRecord> records;
  if (state->record_writer) {
    MXREC_RETURN_IF_ERROR(StreamRecords(boundary, since_epoch, delta_chain, state));
  } else {
    records = CollectRecords(boundary, since_epoch);
    state->keys.reserve(records.size());
    state->rows.reserve(records.size());
    state->counts.reserve(records.size());
    state->last_seen.reserve(records.size());
    for (const ExportedRecord& e : records) {
      state->keys.push_back(e.key);
      state->rows.push_back(e.where.row);
      state->counts.push_back(e.undo != nullptr ? e.undo->count : e.rec->count);
      state->last_seen.push_back(e.undo != nullptr ? e.undo->last_seen : e.last_seen);
    }
    if (cache_) MXREC_RETURN_IF_ERROR(ExportTier(records, boundary, state));
  }
  state->free_rows = std::move(boundary.free_rows);
  state->next_row = boundary.next_row;
  state->newest_timestamp = BoundaryNewest();
  state->counting_frozen = admission_.counting_frozen;
  state->access_threshold = admission_.options.access_threshold;
  if (since_epoch > 0) {
    for (const auto& [key, epoch] : removed_log_) {
      if (epoch > since_epoch) state->removed.push_back(key);
    }
  }
  state->epoch = epoch_++;
  if (delta_chain) {
    track_removals_ = true;
    for (const ExportedRecord& e : records) e.rec->in_chain = 1;
  }
  MarkPendingChanged(boundary);
  return Status::Ok();
}

// Where a record is in the ID map: kept per device row by StreamRecords (the
// records with a row are written in row order without a sort), and for a pass
// of the records without one (NextRowless).
struct HostTable::MapSpot {
  int64_t key = 0;
  uint32_t shard = 0;
  uint32_t index = 0xFFFFFFFFu;
};

void HostTable::NextRowless(const Boundary& boundary, uint32_t since_epoch, bool first,
                            int64_t after, size_t capacity, std::vector<MapSpot>* out) {
  out->clear();
  // The keys seen, until `capacity` of them: then a max-heap by key of the
  // smallest keys seen, whose top is the first one to go. The pass ends with
  // one sort (faster than the heap's pops), and a pass that takes every key
  // left (the last, or the only one) pushes nothing through the heap.
  const auto by_key = [](const MapSpot& a, const MapSpot& b) { return a.key < b.key; };
  bool heap = false;
  for (int s = 0; s < kNumShards; ++s) {
    ids_[s].ForEach([&](int64_t key, uint32_t index) {
      if (!first && key <= after) return;  // an earlier pass's
      if (heap && key >= out->front().key) return;  // decided by the key alone: no lookup
      ExportedRecord e;
      if (!BoundaryRecord(boundary, since_epoch, s, key, index, &e) || e.where.row >= 0) return;
      const MapSpot spot{key, static_cast<uint32_t>(s), index};
      if (!heap) {
        out->push_back(spot);
        if (out->size() >= capacity) {
          std::make_heap(out->begin(), out->end(), by_key);
          heap = true;
        }
        return;
      }
      std::pop_heap(out->begin(), out->end(), by_key);
      out->back() = spot;
      std::push_heap(out->begin(), out->end(), by_key);
    });
  }
  std::sort(out->begin(), out->end(), by_key);
}

Status HostTable::StreamRecords(const Boundary& boundary, uint32_t since_epoch, bool delta_chain,
                                TableState* state) {
  if (state->tier_chunk_rows < 1) {
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                       "': a save's chunk of records must hold at least one record, got ",
                       state->tier_chunk_rows);
  }
  const size_t chunk_rows = static_cast<size_t>(state->tier_chunk_rows);
  if (cache_) {
    cache_->ExportRecency(boundary.next_row, boundary.unowned, state);
    std::vector<uint32_t> present;
    std::vector<float> values;
    MXREC_RETURN_IF_ERROR(
        cache_->tier()->Gather({}, {}, &state->tier_components, &present, &values));
  }
  // One chunk of records, and the host-tier places of its in_host IDs.
  TableState chunk;
  std::vector<int64_t> tier_keys;
  std::vector<int32_t> tier_slots;
  const auto flush = [&]() -> Status {
    if (chunk.keys.empty()) return Status::Ok();
    if (!tier_keys.empty()) {
      if (!state->tier_writer) {
        return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                           "': a save that streams its records needs a writer of the host "
                           "tier's values");
      }
      std::vector<std::string> components;
      std::vector<uint32_t> present;
      std::vector<float> values;
      MXREC_RETURN_IF_ERROR(
          cache_->tier()->Gather(tier_keys, tier_slots, &components, &present, &values));
      if (components != state->tier_components) {
        return MXREC_ERROR(StatusCode::kInternal, "mxrec table '", options_.name,
                           "': the host tier's components changed during a save");
      }
      MXREC_RETURN_IF_ERROR(state->tier_writer(components, present.data(), values.data(),
                                               static_cast<int64_t>(tier_keys.size())));
    }
    MXREC_RETURN_IF_ERROR(state->record_writer(chunk));
    chunk.keys.clear();
    chunk.rows.clear();
    chunk.counts.clear();
    chunk.last_seen.clear();
    chunk.in_host.clear();
    tier_keys.clear();
    tier_slots.clear();
    return Status::Ok();
  };
  const auto add = [&](const ExportedRecord& e) -> Status {
    chunk.keys.push_back(e.key);
    chunk.rows.push_back(e.where.row);
    chunk.counts.push_back(e.undo != nullptr ? e.undo->count : e.rec->count);
    chunk.last_seen.push_back(e.undo != nullptr ? e.undo->last_seen : e.last_seen);
    if (cache_) {
      chunk.in_host.push_back(e.where.in_host);
      if (e.where.in_host) {
        tier_keys.push_back(e.key);
        tier_slots.push_back(e.where.host_slot);
      }
    }
    // The chain's mark goes on as the record is written: a save that fails later
    // leaves marks that only make a later delta log more removals.
    if (delta_chain) e.rec->in_chain = 1;
    return chunk.keys.size() >= chunk_rows ? flush() : Status::Ok();
  };
  // First pass: where the records with a device row are, and how many have none.
  std::vector<MapSpot> at_row(static_cast<size_t>(std::max<int64_t>(boundary.next_row, 0)));
  size_t rowless = 0;
  Status status;
  for (int s = 0; s < kNumShards && status.ok(); ++s) {
    ids_[s].ForEach([&](int64_t key, uint32_t index) {
      if (!status.ok()) return;
      ExportedRecord e;
      if (!BoundaryRecord(boundary, since_epoch, s, key, index, &e)) return;
      if (e.where.row < 0) {
        ++rowless;
      } else if (e.where.row >= static_cast<int32_t>(at_row.size()) ||
                 at_row[e.where.row].index != 0xFFFFFFFFu) {
        status = MXREC_ERROR(StatusCode::kInternal, "mxrec table '", options_.name,
                             "': device row ", e.where.row, " of ID ", key,
                             " is beyond the rows in use or held twice at the step boundary");
      } else {
        at_row[e.where.row] = MapSpot{key, static_cast<uint32_t>(s), index};
      }
    });
  }
  MXREC_RETURN_IF_ERROR(status);
  // The records without a device row, in key order: a restore of a delta chain and the
  // serving export read a file's records by key, which is then a sequential read (in the
  // ID map's order, the keys' hash order, they would read the file at random, and under a
  // memory limit that thrashes the page cache). Sorting them all would hold a spot per ID;
  // instead each pass over the ID map selects the next `capacity` keys (NextRowless). A
  // spot takes 16 bytes, a chunk row at least dim x 4 x 3 (stream.chunk_rows): passes of
  // chunk_rows x dim / 4 spots hold at most a third of the save's budget.
  const size_t per_chunk_row = static_cast<size_t>(std::max<int64_t>(options_.dim / 4, 1));
  const size_t capacity = std::min(rowless, std::max(chunk_rows * per_chunk_row,
                                                     size_t{1} << 16));
  std::vector<MapSpot> spots;
  spots.reserve(capacity);
  int64_t after = 0;
  for (size_t done = 0; done < rowless;) {
    NextRowless(boundary, since_epoch, done == 0, after, capacity, &spots);
    if (spots.empty()) break;  // none left (the count above is an upper bound)
    for (const MapSpot& spot : spots) {
      ExportedRecord e;
      BoundaryRecord(boundary, since_epoch, static_cast<int>(spot.shard), spot.key, spot.index,
                     &e);
      MXREC_RETURN_IF_ERROR(add(e));
    }
    done += spots.size();
    after = spots.back().key;
  }
  MXREC_RETURN_IF_ERROR(flush());
  // Second pass: those with a device row, in row order.
  for (const MapSpot& spot : at_row) {
    if (spot.index == 0xFFFFFFFFu) continue;
    ExportedRecord e;
    const int s = static_cast<int>(spot.shard);
    BoundaryRecord(boundary, since_epoch, s, spot.key, spot.index, &e);
    MXREC_RETURN_IF_ERROR(add(e));
  }
  return flush();
}

Status HostTable::ViewBoundary(Boundary* boundary) const {
  // Rows a pending plan refilled -> their owner before it (nullopt: free).
  std::unordered_map<int32_t, std::optional<int64_t>> row_owner;
  if (cache_) MXREC_RETURN_IF_ERROR(cache_->PhysicalView(&boundary->physical, &row_owner, -1));
  boundary->next_row = rows_.next;
  boundary->free_rows = rows_.free;
  for (auto batch = pending_.rbegin(); batch != pending_.rend(); ++batch) {
    for (const Undo& u : batch->undo) boundary->before[u.key] = &u;
    boundary->unadmitted.insert(batch->admitted.begin(), batch->admitted.end());
    boundary->next_row -= batch->fresh_rows;
    for (auto row = batch->popped_free.rbegin(); row != batch->popped_free.rend(); ++row) {
      boundary->free_rows.push_back(*row);
      boundary->unowned.insert(*row);
    }
  }
  for (const auto& [row, owner] : row_owner) {
    if (!owner.has_value()) boundary->unowned.insert(row);
  }
  return Status::Ok();
}

bool HostTable::BoundaryRecord(const Boundary& boundary, uint32_t since_epoch, int s, int64_t key,
                               uint32_t index, ExportedRecord* out) {
  const RecordRef id = ids_.Ref(s, key, index);
  const Undo* undo = nullptr;
  if (!boundary.before.empty()) {
    auto it = boundary.before.find(key);
    if (it != boundary.before.end()) undo = it->second;
  }
  if (undo != nullptr && undo->inserted) return false;  // not known at the boundary
  const uint32_t epoch = undo != nullptr ? undo->epoch : id.rec->epoch;
  if (since_epoch != 0 && epoch <= since_epoch) return false;
  Physical now;
  auto it = boundary.physical.empty() ? boundary.physical.end() : boundary.physical.find(key);
  if (it != boundary.physical.end()) {
    now = it->second;
  } else {
    now.row = id.rec->row;
    if (id.tier != nullptr) {
      now.in_host = id.tier->in_host;
      now.host_slot = id.tier->host_slot;
    }
  }
  if (!boundary.unadmitted.empty() && boundary.unadmitted.count(key) > 0) now = Physical();
  *out = ExportedRecord{key, id.rec, ids_[s].last_seen(index), undo, now};
  return true;
}

std::vector<HostTable::ExportedRecord> HostTable::CollectRecords(const Boundary& boundary,
                                                                 uint32_t since_epoch) {
  std::vector<ExportedRecord> records;
  int64_t known = 0;
  for (int s = 0; s < kNumShards; ++s) known += ids_[s].size();
  records.reserve(static_cast<size_t>(known));
  for (int s = 0; s < kNumShards; ++s) {
    ids_[s].ForEach([&](int64_t key, uint32_t index) {
      ExportedRecord e;
      if (BoundaryRecord(boundary, since_epoch, s, key, index, &e)) records.push_back(e);
    });
  }
  OrderByRowThenKey(&records);
  return records;
}

void HostTable::OrderByRowThenKey(std::vector<ExportedRecord>* records) {
  const auto by_row_then_key = [](const ExportedRecord& a, const ExportedRecord& b) {
    return a.where.row != b.where.row ? a.where.row < b.where.row : a.key < b.key;
  };
  // At the boundary every device row has one owner, so the records with a row are
  // ordered by placing each at its row, not by a sort; those without one (row -1:
  // not admitted, or in a host tier) are sorted. A row held twice, or rows spread far
  // wider than the records, fall back to one sort of them all (the same order).
  const size_t n = records->size();
  int64_t max_row = -1;
  size_t rowless = 0;
  for (const ExportedRecord& e : *records) {
    if (e.where.row < 0) {
      ++rowless;
    } else if (e.where.row > max_row) {
      max_row = e.where.row;
    }
  }
  if (max_row + 1 > static_cast<int64_t>(4 * n + 4096)) {
    std::sort(records->begin(), records->end(), by_row_then_key);
    return;
  }
  constexpr uint32_t kNone = 0xFFFFFFFFu;
  std::vector<uint32_t> at_row(static_cast<size_t>(max_row + 1), kNone);
  std::vector<uint32_t> without_row;
  without_row.reserve(rowless);
  for (size_t i = 0; i < n; ++i) {
    const int32_t row = (*records)[i].where.row;
    if (row < 0) {
      without_row.push_back(static_cast<uint32_t>(i));
    } else if (at_row[row] != kNone) {
      std::sort(records->begin(), records->end(), by_row_then_key);
      return;
    } else {
      at_row[row] = static_cast<uint32_t>(i);
    }
  }
  std::sort(without_row.begin(), without_row.end(), [records, &by_row_then_key](uint32_t a, uint32_t b) {
    return by_row_then_key((*records)[a], (*records)[b]);
  });
  std::vector<ExportedRecord> ordered;
  ordered.reserve(n);
  for (uint32_t i : without_row) ordered.push_back((*records)[i]);
  for (uint32_t i : at_row) {
    if (i != kNone) ordered.push_back((*records)[i]);
  }
  *records = std::move(ordered);
}

Status HostTable::ExportTier(const std::vector<ExportedRecord>& records, const Boundary& boundary,
                             TableState* state) const {
  std::vector<int64_t> host_keys;
  std::vector<int32_t> host_slots;
  state->in_host.reserve(records.size());
  for (const ExportedRecord& e : records) {
    state->in_host.push_back(e.where.in_host);
    if (e.where.in_host) {
      host_keys.push_back(e.key);
      host_slots.push_back(e.where.host_slot);
    }
  }
  cache_->ExportRecency(boundary.next_row, boundary.unowned, state);
  if (!state->tier_writer) {
    return cache_->tier()->Gather(host_keys, host_slots, &state->tier_components,
                                  &state->tier_present, &state->tier_values);
  }
  if (state->tier_chunk_rows < 1) {
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                       "': a save's chunk of host-tier rows must hold at least one row, got ",
                       state->tier_chunk_rows);
  }
  // A chunk of IDs at a time: the values in memory at once are one chunk's. The
  // table's lock is held throughout, so the tier is the one at the boundary.
  std::vector<uint32_t> present;
  std::vector<float> values;
  MXREC_RETURN_IF_ERROR(cache_->tier()->Gather({}, {}, &state->tier_components, &present, &values));
  const size_t chunk = static_cast<size_t>(state->tier_chunk_rows);
  for (size_t begin = 0; begin < host_keys.size(); begin += chunk) {
    const size_t end = std::min(host_keys.size(), begin + chunk);
    const std::vector<int64_t> keys(host_keys.begin() + begin, host_keys.begin() + end);
    const std::vector<int32_t> slots(host_slots.begin() + begin, host_slots.begin() + end);
    std::vector<std::string> components;
    MXREC_RETURN_IF_ERROR(cache_->tier()->Gather(keys, slots, &components, &present, &values));
    if (components != state->tier_components) {
      return MXREC_ERROR(StatusCode::kInternal, "mxrec table '", options_.name,
                         "': the host tier's components changed during a save");
    }
    MXREC_RETURN_IF_ERROR(state->tier_writer(state->tier_components, present.data(),
                                             values.data(), static_cast<int64_t>(end - begin)));
  }
  return Status::Ok();
}

void HostTable::MarkPendingChanged(const Boundary& boundary) {
  // What the pending batches' steps will change, and IDs saved where a pending
  // plan moves them from: the next delta holds them as they are then.
  for (const auto& [key, undo] : boundary.before) {
    const RecordRef id = ids_.Find(key);
    if (id.rec != nullptr) id.rec->epoch = epoch_;
  }
  for (const auto& entry : boundary.physical) {
    const RecordRef id = ids_.Find(entry.first);
    if (id.rec != nullptr) id.rec->epoch = epoch_;
  }
}

void HostTable::PruneRemovedLog(uint32_t epoch) {
  const auto lock = Lock();
  removed_log_.erase(std::remove_if(removed_log_.begin(), removed_log_.end(),
                                    [epoch](const auto& entry) { return entry.second <= epoch; }),
                     removed_log_.end());
}

int64_t HostTable::removed_log_size() const {
  const auto lock = Lock();
  return static_cast<int64_t>(removed_log_.size());
}

Status HostTable::ImportState(const TableState& state) {
  // One critical section: nothing plans a batch between the checks and the
  // replacement.
  const auto lock = Lock();
  MXREC_RETURN_IF_ERROR(CheckTierFlags(state));
  MXREC_RETURN_IF_ERROR(CheckRows(state));
  int64_t host_ids = 0;  // tiered: the IDs in the host tier
  if (cache_) MXREC_RETURN_IF_ERROR(CheckTierRows(state, &host_ids));
  std::vector<KeyMap> fresh;
  fresh.reserve(kNumShards);
  for (int s = 0; s < kNumShards; ++s) fresh.push_back(NewMap());
  MXREC_RETURN_IF_ERROR(BuildMaps(state, &fresh));
  // Tiered: the host tier's values, the planner's host slots and recency list.
  if (cache_) MXREC_RETURN_IF_ERROR(cache_->Restore(state, host_ids, &fresh));
  for (int s = 0; s < kNumShards; ++s) ids_[s] = std::move(fresh[s]);
  rows_.free = state.free_rows;
  rows_.next = state.next_row;
  newest_timestamp_ = state.newest_timestamp;
  admission_.counting_frozen = state.counting_frozen;
  admission_.options.access_threshold = state.access_threshold;
  removed_log_.clear();
  // Batches planned against the state replaced never train: committing one
  // is an error (Commit), and HostTier::Replace dropped their swap plans.
  pending_.clear();
  pending_admitted_.clear();
  import_barrier_ = next_batch_id_.load(std::memory_order_relaxed);
  return Status::Ok();
}

Status HostTable::CheckTierFlags(const TableState& state) const {
  if (state.in_host.empty()) return Status::Ok();
  if (!cache_) {
    int64_t host_ids = 0;
    for (uint8_t flag : state.in_host) host_ids += flag ? 1 : 0;
    if (host_ids > 0) {
      return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                         "': the checkpoint holds ", host_ids,
                         " IDs in a host tier, but this table has none "
                         "(host_vocabulary_size is 0)");
    }
  } else if (state.in_host.size() != state.keys.size()) {
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                       "': checkpointed host-tier flags do not match the IDs");
  }
  return Status::Ok();
}

Status HostTable::CheckRows(const TableState& state) const {
  const size_t n = state.keys.size();
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
  return Status::Ok();
}

Status HostTable::CheckTierRows(const TableState& state, int64_t* host_ids) const {
  for (size_t i = 0; i < state.keys.size() && !state.in_host.empty(); ++i) {
    if (!state.in_host[i]) continue;
    if (state.rows[i] >= 0) {
      return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                         "': checkpointed ID ", state.keys[i],
                         " has both a device row and a host-tier row");
    }
    ++*host_ids;
  }
  if (*host_ids > options_.host_capacity + options_.ssd_capacity) {
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                       "': the checkpoint holds ", *host_ids,
                       " IDs in the host tier but host_vocabulary_size + ssd_vocabulary_size "
                       "is ", options_.host_capacity + options_.ssd_capacity);
  }
  return CheckCacheOrder(state);
}

Status HostTable::CheckCacheOrder(const TableState& state) const {
  int64_t owned = 0;
  for (int32_t row : state.rows) owned += row >= 0 ? 1 : 0;
  if (state.lru_rows.empty()) return Status::Ok();
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
  return Status::Ok();
}

Status HostTable::BuildMaps(const TableState& state, std::vector<KeyMap>* maps) const {
  std::vector<KeyMap>& fresh = *maps;
  std::array<int64_t, kNumShards> per_shard{};
  for (int64_t key : state.keys) ++per_shard[HashKey(key) >> kShardShift];
  for (int s = 0; s < kNumShards; ++s) fresh[s].Reserve(per_shard[s]);
  for (size_t i = 0; i < state.keys.size(); ++i) {
    const uint64_t hash = HashKey(state.keys[i]);
    bool inserted = false;
    KeyMap& map = fresh[hash >> kShardShift];
    const uint32_t index = map.FindOrInsert(state.keys[i], hash, &inserted);
    if (!inserted) {
      return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", options_.name,
                         "': ID ", state.keys[i], " appears twice in the checkpoint");
    }
    KeyRecord& rec = map.record(index);
    rec.row = state.rows[i];
    rec.count = state.counts[i];
    map.set_last_seen(index, state.last_seen[i]);
    if (cache_ && !state.in_host.empty()) map.tier(index).in_host = state.in_host[i];
    rec.in_chain = 1;  // a restored save: its removals matter to a later delta
  }
  return Status::Ok();
}

namespace {

// (row, key) pairs -> keys and rows ordered by row.
void SortedByRow(std::vector<std::pair<int32_t, int64_t>>* pairs, std::vector<int64_t>* keys,
                 std::vector<int32_t>* rows) {
  std::sort(pairs->begin(), pairs->end());
  keys->clear();
  rows->clear();
  for (const auto& [row, key] : *pairs) {
    rows->push_back(row);
    keys->push_back(key);
  }
}

}  // namespace

void HostTable::ExportRows(std::vector<int64_t>* keys, std::vector<int32_t>* rows) const {
  const auto lock = Lock();
  std::vector<std::pair<int32_t, int64_t>> pairs;
  for (const auto& shard : ids_) {
    shard.ForEach([&](int64_t key, uint32_t index) {
      const int32_t row = shard.record(index).row;
      if (row >= 0) pairs.emplace_back(row, key);
    });
  }
  SortedByRow(&pairs, keys, rows);
}

Status HostTable::ExportBoundaryRows(std::vector<int64_t>* keys, std::vector<int32_t>* rows) {
  const auto lock = Lock();
  Boundary boundary;
  MXREC_RETURN_IF_ERROR(ViewBoundary(&boundary));
  std::vector<std::pair<int32_t, int64_t>> pairs;
  for (const ExportedRecord& e : CollectRecords(boundary, 0)) {
    if (e.where.row >= 0) pairs.emplace_back(e.where.row, e.key);
  }
  SortedByRow(&pairs, keys, rows);
  return Status::Ok();
}

}  // namespace mxrec
