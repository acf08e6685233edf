// The key-stage planner's phases (BatchPlanner::Plan): the IDs hashed,
// found and counted per shard, numbered by first occurrence and given rows
// (in order, or in parallel chunks with the same rows), the restore index,
// and a batch refused for want of rows. The tiered device cache hands out
// its own rows (device_cache_planner.cc).

#include "batch_planner.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <new>
#include <unordered_map>
#include <utility>
#include <vector>

#include "device_cache_planner.h"
#include "host_table.h"
#include "shared_counts.h"

namespace mxrec {

namespace {
// Below this many IDs a batch is planned on the calling thread: handing work to
// the pool costs more than it saves.
constexpr int64_t kParallelMinIds = 1 << 15;
constexpr int32_t kDefaultSlot = -1;
}  // namespace

BatchPlanner::BatchPlanner(const TableOptions& options, IdMap* ids, DeviceRows* rows,
                           DeviceCachePlanner* cache, const Admission* admission,
                           const PendingAdmitted* pending_admitted, TableStats* stats)
    : options_(options),
      ids_(ids),
      rows_(rows),
      cache_(cache),
      admission_(admission),
      pending_admitted_(pending_admitted),
      stats_(stats) {}

bool BatchPlanner::Admits(int64_t key, const KeyRecord& rec) const {
  const AdmissionOptions& admission = admission_->options;
  const double threshold = admission.access_threshold;
  if (threshold > 0.0 && rec.count < threshold) return false;
  if (admission.probability >= 1.0) return true;
  // The top 53 bits of a keyed hash, as a uniform number in [0, 1).
  const uint64_t h = HashKey(key ^ static_cast<int64_t>(HashKey(static_cast<int64_t>(admission.seed))));
  return static_cast<double>(h >> 11) * 0x1.0p-53 < admission.probability;
}

bool BatchPlanner::IsPadding(int64_t key) const {
  const auto& pads = options_.padding_keys;
  return std::find(pads.begin(), pads.end(), key) != pads.end();
}

namespace {
// The distinct IDs of one batch in one shard: an open-addressing table from
// key to the ID's index among the batch's distinct IDs and its occurrences so
// far, sized by the batch (so that it stays in cache) and kept between
// batches. An entry belongs to the batch whose generation it carries; older
// ones read as empty, so starting a batch clears nothing (but once in 65,535
// batches, when the generation wraps).
class Dedupe {
 public:
  struct Entry {
    int64_t key = 0;
    int32_t local = 0;
    uint16_t generation = 0;
    // Occurrences counted here; Count() moves them to the caller's total
    // before they would overflow.
    uint16_t count = 0;

    // One more occurrence; `total` takes the count when it is full.
    void Count(uint32_t* total) {
      if (count == UINT16_MAX) {
        *total += count;
        count = 0;
      }
      ++count;
    }
  };
  static_assert(sizeof(Entry) == 16, "a dedupe entry is 16 bytes");

  // Starts a batch of at most `ids` IDs.
  void Start(int64_t ids) {
    uint64_t capacity = 16;
    while (static_cast<int64_t>(capacity) < 2 * ids) capacity *= 2;
    if (capacity > entries_.size()) {
      entries_.assign(capacity, Entry());
      generation_ = 0;
    }
    mask_ = capacity - 1;
    if (++generation_ == 0) {
      for (Entry& e : entries_) e.generation = 0;
      generation_ = 1;
    }
  }

  const Entry& at(uint32_t slot) const { return entries_[slot]; }
  // Prefetches are always inlined (see KeyMap::Prefetch).
  [[gnu::always_inline]] void PrefetchSlot(uint32_t slot) const { __builtin_prefetch(&entries_[slot]); }
  uint32_t slot_of(const Entry& e) const { return static_cast<uint32_t>(&e - entries_.data()); }

  [[gnu::always_inline]] void Prefetch(uint64_t hash) const { __builtin_prefetch(&entries_[hash & mask_]); }

  // The entry of key; *added: the batch had not held it yet (the caller sets
  // its local).
  Entry& FindOrAdd(int64_t key, uint64_t hash, bool* added) {
    for (uint64_t i = hash & mask_;; i = (i + 1) & mask_) {
      Entry& e = entries_[i];
      if (e.generation != generation_) {
        e.key = key;
        e.generation = generation_;
        e.count = 0;
        *added = true;
        return e;
      }
      if (e.key == key) {
        *added = false;
        return e;
      }
    }
  }

 private:
  std::vector<Entry> entries_;
  uint64_t mask_ = 0;
  uint16_t generation_ = 0;
};
}  // namespace

// The scratch of one batch, kept in the process's pool between batches so
// that a batch allocates nothing once the batches stop growing.
struct BatchPlanner::BatchWork {
  const int64_t* keys = nullptr;
  const int64_t* weights = nullptr;  // occurrences per position, or nullptr (one each)
  int64_t n = 0;
  bool train = false;
  uint32_t epoch = 0;  // the table's save epoch (BatchInput)
  int64_t timestamp = 0;
  bool parallel = false;
  // Shard groups of FindAndCount: one task per group, each scanning the whole
  // batch for the IDs of its shards.
  int groups = 1;
  std::vector<uint64_t> hashes;                   // per position
  // Parallel batches: HashKeys's chunks of positions (in input order), and per
  // chunk and shard the chunk's positions of that shard, in input order (the
  // one-pass scatter that lets FindIds visit only its shards' positions).
  int chunks = 1;
  std::vector<std::array<std::vector<uint32_t>, kNumShards>> buckets;
  std::array<int64_t, kNumShards> shard_ids{};    // positions per shard (Reserve)
  std::vector<int32_t> local;      // per position: index in its shard's uniques, or kDefaultSlot
  std::vector<uint8_t> first;      // per position: 1 where its ID first occurs in the batch
  // A distinct ID of the batch: its record and how often the batch holds it.
  struct Unique {
    int64_t key;
    uint32_t index;  // in its shard's map
    uint32_t slot;   // its entry in the shard's dedupe table
    // Occurrences that overflowed the dedupe entry's 16-bit count (pass 2
    // adds the entry's count).
    uint32_t occurrences : 31;
    uint32_t inserted : 1;  // the batch created the record
  };
  static_assert(sizeof(Unique) == 24, "one distinct ID of a batch takes 24 bytes of scratch");
  std::vector<Unique> uniques[kNumShards];        // per shard, first-seen order
  Dedupe dedupe[kNumShards];                      // per shard: the batch's IDs -> index in uniques
  std::vector<int32_t> global[kNumShards];        // per shard unique: index in unique_rows
  // AssignRows: (shard, local) of the distinct IDs by first occurrence.
  std::vector<std::pair<int32_t, int32_t>> ordered;
  // Parallel AssignRows: per chunk, its first occurrences (OrderDistinct),
  // then its unique IDs and its grants (SlotsInParallel), each turned into
  // the chunk's offset; per distinct ID, its row, or kDefaultSlot, or kWantsRow.
  std::vector<int64_t> chunk_firsts;
  std::vector<int64_t> chunk_uniques;
  std::vector<int64_t> chunk_grants;
  std::vector<int32_t> assigned;
  std::vector<Undo> undo[kNumShards];             // per shard (deferred batches)
  PendingBatch* journal = nullptr;                // deferred training batches
  // AssignRows: tiered tables: admitted IDs without a device row and their
  // indexes in unique_rows; device-only: the rows handed out by this batch
  // (record, row came from the free rows), to take back if the batch cannot be
  // planned, and the new IDs left without one.
  std::vector<RecordRef> need;
  std::vector<int32_t> need_slots;
  std::vector<std::pair<RecordRef, bool>> granted;
  int64_t shortfall = 0;
  // Evaluation while batches are pending: where moved IDs' values are.
  std::unordered_map<int64_t, Physical> physical;

  // Forgets the previous batch, keeping the memory.
  void Reset() {
    journal = nullptr;
    shard_ids.fill(0);
    for (int s = 0; s < kNumShards; ++s) {
      uniques[s].clear();
      undo[s].clear();
    }
    need.clear();
    need_slots.clear();
    granted.clear();
    shortfall = 0;
    physical.clear();
  }
};

namespace {
// The scratch no batch holds, shared by every table (each keeps the memory of
// the largest batch it planned). Never destroyed: a table may plan a batch
// while the process exits.
template <typename Work>
struct ScratchPool {
  std::mutex mu;
  std::vector<std::unique_ptr<Work>> idle;
};
template <typename Work>
ScratchPool<Work>& Scratch() {
  static auto* const pool = new ScratchPool<Work>();
  return *pool;
}
}  // namespace

std::unique_ptr<BatchPlanner::BatchWork> BatchPlanner::TakeScratch() {
  ScratchPool<BatchWork>& pool = Scratch<BatchWork>();
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    if (!pool.idle.empty()) {
      std::unique_ptr<BatchWork> work = std::move(pool.idle.back());
      pool.idle.pop_back();
      return work;
    }
  }
  return std::make_unique<BatchWork>();
}

void BatchPlanner::GiveBackScratch(std::unique_ptr<BatchWork> work) {
  ScratchPool<BatchWork>& pool = Scratch<BatchWork>();
  std::lock_guard<std::mutex> lock(pool.mu);
  try {
    pool.idle.push_back(std::move(work));
  } catch (const std::bad_alloc&) {
    // No room to keep it: the scratch is freed (it runs in a destructor).
  }
}

namespace {
// Splits [0, n) into `chunks` ranges and runs fn(begin, end) on each, on the
// pool when `parallel`.
template <typename Fn>
void ForChunks(int64_t n, bool parallel, ThreadPool* pool, Fn&& fn) {
  if (!parallel) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t chunks = pool->num_threads() * 4;
  pool->ParallelFor(chunks, [&](int64_t c) { fn(n * c / chunks, n * (c + 1) / chunks); });
}

// Probes this many positions ahead of the one being planned: the map bucket
// of a key is prefetched while the keys before it are handled.
constexpr int64_t kPrefetchDistance = 16;
// FindIds on scattered positions: the run of positions probed together.
constexpr int64_t kProbeGroup = 16;
}  // namespace

void BatchPlanner::HashKeys(BatchWork& w, ThreadPool* pool) {
  const int64_t n = w.n;
  w.hashes.resize(n);
  w.local.resize(n);
  w.first.resize(n);
  std::mutex mu;
  if (w.groups > 1 && n <= static_cast<int64_t>(UINT32_MAX)) {
    // Hash and scatter in one pass: each chunk appends its positions to its
    // own per-shard buckets, so no two threads write one bucket and each
    // shard's positions read in input order chunk after chunk.
    w.chunks = pool->num_threads() * 4;
    if (static_cast<int>(w.buckets.size()) < w.chunks) w.buckets.resize(w.chunks);
    pool->ParallelFor(w.chunks, [&](int64_t c) {
      auto& bucket = w.buckets[c];
      for (auto& b : bucket) b.clear();
      const int64_t begin = n * c / w.chunks;
      const int64_t end = n * (c + 1) / w.chunks;
      for (int64_t i = begin; i < end; ++i) {
        const uint64_t h = HashKey(w.keys[i]);
        w.hashes[i] = h;
        bucket[h >> kShardShift].push_back(static_cast<uint32_t>(i));
      }
      std::lock_guard<std::mutex> lock(mu);
      for (int s = 0; s < kNumShards; ++s) {
        w.shard_ids[s] += static_cast<int64_t>(bucket[s].size());
      }
    });
    return;
  }
  w.chunks = 0;  // no buckets: FindIds scans every position
  ForChunks(n, w.parallel, pool, [&](int64_t begin, int64_t end) {
    std::array<int64_t, kNumShards> count{};
    for (int64_t i = begin; i < end; ++i) {
      const uint64_t h = HashKey(w.keys[i]);
      w.hashes[i] = h;
      ++count[h >> kShardShift];
    }
    std::lock_guard<std::mutex> lock(mu);
    for (int s = 0; s < kNumShards; ++s) w.shard_ids[s] += count[s];
  });
}

void BatchPlanner::FindAndCount(BatchWork& w, ThreadPool* pool) {
  // One task per group of shards: it visits the batch in input order and
  // plans the IDs of its shards, so that each shard sees its IDs in input
  // order whatever the number of groups.
  auto plan_group = [this, &w](int64_t group) {
    const ShardGroup shards{static_cast<int>(kNumShards * group / w.groups),
                            static_cast<int>(kNumShards * (group + 1) / w.groups)};
    PrepareShards(w, shards);
    FindIds(w, shards);
    if (w.train) CountIds(w, shards);
  };
  if (w.groups > 1) {
    pool->ParallelFor(w.groups, plan_group);
  } else {
    plan_group(0);
  }
}

void BatchPlanner::PrepareShards(BatchWork& w, ShardGroup shards) {
  // No growth of the probe arrays inside FindIds, so prefetched slots hold
  // (record indices would hold anyway).
  IdMap& ids = *ids_;
  for (int s = shards.lo; s < shards.hi; ++s) {
    if (w.train) {
      ids[s].Reserve(w.shard_ids[s]);
      ids[s].PrepareTime(w.timestamp);
    }
    if (w.shard_ids[s] > 0) w.dedupe[s].Start(w.shard_ids[s]);
    w.uniques[s].reserve(static_cast<size_t>(w.shard_ids[s]));
  }
}

void BatchPlanner::FindIds(BatchWork& w, ShardGroup shards) {
  // Over the positions: each distinct ID is looked up (in training: inserted)
  // once, at its first occurrence; later ones only count. Writes w.local and
  // w.first of the group's positions and the shards' uniques.
  const bool has_padding = !options_.padding_keys.empty();
  const bool train = w.train;
  const int64_t* const weights = w.weights;
  const int64_t n = w.n;
  // Always inlined: a call that only prefetches is deleted (KeyMap::Prefetch).
  auto prefetch = [this, &w](uint64_t h) __attribute__((always_inline)) {
    const int s = static_cast<int>(h >> kShardShift);
    (*ids_)[s].Prefetch(h);
    w.dedupe[s].Prefetch(h);
  };
  // One position of the group's shards (`hash` is its hash).
  auto plan = [&](int64_t p, uint64_t hash) {
    const int s = static_cast<int>(hash >> kShardShift);
    const int64_t key = w.keys[p];
    w.first[p] = 0;
    if (has_padding && IsPadding(key)) {
      w.local[p] = kDefaultSlot;
      return;
    }
    std::vector<BatchWork::Unique>& uniq = w.uniques[s];
    bool added = false;
    Dedupe::Entry& entry = w.dedupe[s].FindOrAdd(key, hash, &added);
    if (added) {
      bool inserted = false;
      const uint32_t index = train ? (*ids_)[s].FindOrInsert(key, hash, &inserted)
                                   : (*ids_)[s].Find(key, hash);
      if (index == KeyMap::kNoRecord) {
        entry.local = kDefaultSlot;
      } else {
        entry.local = static_cast<int32_t>(uniq.size());
        uniq.push_back(
            BatchWork::Unique{key, index, w.dedupe[s].slot_of(entry), 0, inserted ? 1u : 0u});
        w.first[p] = 1;
      }
    }
    if (entry.local != kDefaultSlot) {
      if (weights != nullptr) {
        // HostTable::Process's caller bounds the sum of the weights below 2^31.
        uniq[entry.local].occurrences += static_cast<uint32_t>(weights[p]);
      } else {
        uint32_t overflow = 0;
        entry.Count(&overflow);
        if (overflow != 0) uniq[entry.local].occurrences += overflow;
      }
    }
    w.local[p] = entry.local;
  };
  if (w.chunks > 0) {
    // The positions HashKeys scattered to the group's shards, shard by shard
    // (shards share nothing), each in input order, probed in runs of
    // kProbeGroup whose prefetches are issued together one run ahead.
    for (int s = shards.lo; s < shards.hi; ++s) {
      for (int c = 0; c < w.chunks; ++c) {
        const std::vector<uint32_t>& bucket = w.buckets[c][s];
        const int64_t size = static_cast<int64_t>(bucket.size());
        for (int64_t q = 0; q < std::min(size, kProbeGroup); ++q) prefetch(w.hashes[bucket[q]]);
        for (int64_t start = 0; start < size; start += kProbeGroup) {
          const int64_t stop = std::min(size, start + kProbeGroup);
          for (int64_t q = stop; q < std::min(size, stop + kProbeGroup); ++q) {
            prefetch(w.hashes[bucket[q]]);
          }
          for (int64_t q = start; q < stop; ++q) plan(bucket[q], w.hashes[bucket[q]]);
        }
      }
    }
    return;
  }
  for (int64_t p = 0; p < std::min(n, kPrefetchDistance); ++p) {
    if (shards.Holds(w.hashes[p])) prefetch(w.hashes[p]);
  }
  for (int64_t p = 0; p < n; ++p) {
    if (p + kPrefetchDistance < n) {
      const uint64_t ahead = w.hashes[p + kPrefetchDistance];
      if (shards.Holds(ahead)) prefetch(ahead);
    }
    const uint64_t hash = w.hashes[p];
    if (shards.Holds(hash)) plan(p, hash);
  }
}

void BatchPlanner::CountIds(BatchWork& w, ShardGroup shards) {
  // Over the distinct IDs (training): last-seen time, the journal's undo
  // entry, and the admission count, one occurrence after another as before
  // (each adds the same weight, so the sum is the same float).
  const bool count = !admission_->counting_frozen;
  SharedCounts* const shared_counts = admission_->shared_counts.get();
  DeviceCachePlanner* const cache = cache_;
  const bool journal = w.journal != nullptr;
  const uint32_t epoch = w.epoch;
  const float weight = static_cast<float>(admission_->options.faae_coefficient);
  // One group visits every shard in order: its undo entries go straight into
  // the journal, in the order Plan's concatenation of the shards' would give.
  std::vector<Undo>* const direct = journal && w.groups == 1 ? &w.journal->undo : nullptr;
  if (direct != nullptr) {
    size_t total = direct->size();
    for (int s = shards.lo; s < shards.hi; ++s) total += w.uniques[s].size();
    direct->reserve(total);
  }
  for (int s = shards.lo; s < shards.hi; ++s) {
    KeyMap& map = (*ids_)[s];
    const std::vector<BatchWork::Unique>& uniq = w.uniques[s];
    std::vector<Undo>& undo = direct != nullptr ? *direct : w.undo[s];
    const size_t distinct = uniq.size();
    for (size_t u = 0; u < distinct; ++u) {
      if (u + kPrefetchDistance < distinct) {
        __builtin_prefetch(&map.record(uniq[u + kPrefetchDistance].index), 1);
        w.dedupe[s].PrefetchSlot(uniq[u + kPrefetchDistance].slot);
      }
      const BatchWork::Unique& id = uniq[u];
      KeyRecord& rec = map.record(id.index);
      const uint32_t occurrences = id.occurrences + w.dedupe[s].at(id.slot).count;
      if (journal) {
        undo.push_back(Undo{id.key, map.last_seen(id.index), rec.count, rec.epoch,
                            static_cast<uint8_t>(rec.seen_recently),
                            static_cast<uint8_t>(id.inserted ? 1 : 0)});
      }
      map.set_last_seen(id.index, w.timestamp);
      rec.seen_recently = 1;
      rec.epoch = epoch;
      if (!count) continue;
      if (shared_counts != nullptr) {
        const uint64_t hash = HashKey(id.key);
        for (uint32_t k = 0; k < occurrences; ++k) {
          rec.count = shared_counts->Add(id.key, hash, weight);
        }
      } else {
        float total = rec.count;
        for (uint32_t k = 0; k < occurrences; ++k) total += weight;
        rec.count = total;
      }
      // Tiered: keep the row's copy of its owner's count (rows are disjoint
      // across shards, so the groups write apart).
      if (cache != nullptr && rec.row >= 0) cache->SetCount(rec.row, rec.count);
    }
  }
}

int32_t BatchPlanner::EvalRow(const BatchWork& w, int64_t key, const KeyRecord& rec) const {
  // The step boundary: an ID admitted by a pending batch has no row yet, and
  // an ID a pending swap plan moves is still where it was.
  if (!pending_admitted_->empty() && pending_admitted_->Contains(key)) return kDefaultSlot;
  int32_t row = rec.row;
  if (!w.physical.empty()) {
    auto it = w.physical.find(key);
    if (it != w.physical.end()) row = it->second.row;
  }
  return row < 0 ? kDefaultSlot : row;
}

int32_t BatchPlanner::EvalSlot(const BatchWork& w, int64_t key, const KeyRecord& rec,
                               BatchPlan* plan) const {
  const int32_t row = EvalRow(w, key, rec);
  if (row == kDefaultSlot) return kDefaultSlot;
  plan->unique_rows.push_back(row);
  return static_cast<int32_t>(plan->unique_rows.size()) - 1;
}

Status BatchPlanner::Plan(const BatchInput& batch, ThreadPool* pool, BatchPlan* plan) {
  if (batch.train && cache_ != nullptr) cache_->StartBatch();
  // Given back however Plan ends (an error, an allocation failure).
  struct Lease {
    std::unique_ptr<BatchWork> work = TakeScratch();
    ~Lease() { GiveBackScratch(std::move(work)); }
  } lease;
  BatchWork& w = *lease.work;
  w.Reset();
  w.keys = batch.keys;
  w.weights = batch.train ? batch.weights : nullptr;
  w.n = batch.n;
  w.train = batch.train;
  w.timestamp = batch.timestamp;
  w.epoch = batch.epoch;
  w.parallel = pool != nullptr && pool->num_threads() > 1 && batch.n >= kParallelMinIds;
  w.groups = w.parallel ? std::min(pool->num_threads(), kNumShards) : 1;
  w.journal = batch.journal;
  if (!batch.train && cache_ != nullptr && cache_->tier()->pending_plans() > 0) {
    // Evaluation reads the embedding (component 0) where its values are.
    MXREC_RETURN_IF_ERROR(cache_->PhysicalView(&w.physical, nullptr, 0));
  }
  HashKeys(w, pool);
  FindAndCount(w, pool);
  MXREC_RETURN_IF_ERROR(AssignRows(w, pool, plan));
  if (w.journal != nullptr && w.groups > 1) {  // one group wrote the journal's (CountIds)
    size_t total = w.journal->undo.size();
    for (const auto& part : w.undo) total += part.size();
    w.journal->undo.reserve(total);
    for (const auto& part : w.undo) {
      w.journal->undo.insert(w.journal->undo.end(), part.begin(), part.end());
    }
  }
  return Status::Ok();
}

Status BatchPlanner::AssignRows(BatchWork& w, ThreadPool* pool, BatchPlan* plan) {
  // By first occurrence, so that the result does not depend on threads: number
  // the batch's distinct IDs, admit, and hand out rows to newly admitted IDs.
  // One thread (and tiered training, whose planner picks victims in order)
  // walks the distinct IDs in order; several threads number them in chunks
  // (SlotsInParallel), with the same result. The restore index of every
  // position is filled in after it, in parallel.
  const bool tiered = cache_ != nullptr;
  for (int s = 0; s < kNumShards; ++s) w.global[s].resize(w.uniques[s].size());
  OrderDistinct(w, pool);
  if (w.parallel && (!w.train || !tiered)) {
    SlotsInParallel(w, pool, plan);
  } else {
    InOrder(w, plan);
  }
  WriteRestore(w, pool, plan);
  if (!w.need.empty()) {
    const int64_t new_before = plan->new_ids;
    const Status status = cache_->AssignRows(w.need, w.need_slots, w.epoch, plan, w.journal);
    stats_->admitted += plan->new_ids - new_before;
    if (!status.ok()) {
      plan->unique_rows.clear();
      plan->reused_rows.clear();
      return status;
    }
  }
  if (w.shortfall > 0) return RefuseBatch(w, plan);
  if (w.journal != nullptr && !tiered) JournalGrants(w);
  return Status::Ok();
}

void BatchPlanner::InOrder(BatchWork& w, BatchPlan* plan) {
  const bool train = w.train;
  const bool tiered = cache_ != nullptr;
  IdMap& ids = *ids_;
  const int64_t distinct = static_cast<int64_t>(w.ordered.size());
  // The records left the cache since FindAndCount, so each is prefetched a
  // few IDs ahead.
  for (int64_t i = 0; i < distinct; ++i) {
    if (i + kPrefetchDistance < distinct) {
      const auto& [s_ahead, l_ahead] = w.ordered[i + kPrefetchDistance];
      const uint32_t ahead = w.uniques[s_ahead][l_ahead].index;
      __builtin_prefetch(&ids[s_ahead].record(ahead));
      // A tiered ID without a device row reads its tier record too (a separate array).
      if (tiered && train) __builtin_prefetch(&ids[s_ahead].tier(ahead));
    }
    const auto [s, l] = w.ordered[i];
    const BatchWork::Unique& id = w.uniques[s][l];
    int32_t g;
    if (!train) {
      g = EvalSlot(w, id.key, ids[s].record(id.index), plan);
    } else if (tiered) {
      g = TieredSlot(w, ids.Ref(s, id.key, id.index), plan);
    } else {
      g = DeviceSlot(w, RecordRef{id.key, &ids[s].record(id.index), nullptr}, plan);
    }
    w.global[s][l] = g;
  }
}

void BatchPlanner::WriteRestore(BatchWork& w, ThreadPool* pool, BatchPlan* plan) {
  // IDs that look up as the default value point one past the unique rows;
  // the planner fills the rows it hands out in place, so the count holds.
  const int32_t default_index = static_cast<int32_t>(plan->unique_rows.size());
  int32_t* restore = plan->restore_out != nullptr ? plan->restore_out : plan->restore.data();
  std::atomic<int64_t> non_padding{0};
  std::atomic<int64_t> defaults{0};
  const int64_t* const weights = w.weights;
  ForChunks(w.n, w.parallel, pool, [&](int64_t begin, int64_t end) {
    int64_t seen = 0;
    int64_t rejected = 0;
    for (int64_t p = begin; p < end; ++p) {
      const int32_t l = w.local[p];
      const int64_t occurrences = weights != nullptr ? weights[p] : 1;
      int32_t g = kDefaultSlot;
      if (l != kDefaultSlot) {
        seen += occurrences;
        g = w.global[w.hashes[p] >> kShardShift][l];
      }
      if (g == kDefaultSlot) {
        g = default_index;
        if (l != kDefaultSlot) rejected += occurrences;
      }
      restore[p] = g;
    }
    non_padding += seen;
    defaults += rejected;
  });
  if (w.train) {
    stats_->ids_seen += non_padding.load();
    stats_->rejected += defaults.load();
  }
}

namespace {
// A distinct ID of SlotsInParallel's first pass that gets a row in its second.
constexpr int32_t kWantsRow = -2;
// Chunks of a parallel pass over `n` items: several per thread, so that a
// slow chunk is shared out, each large enough to pay for its task.
int64_t ChunkCount(int64_t n, const ThreadPool* pool) {
  return std::max<int64_t>(1, std::min<int64_t>(pool->num_threads() * 4, n / 4096));
}
// Turns per-chunk counts into each chunk's offset; returns the total.
int64_t ToOffsets(std::vector<int64_t>* counts) {
  int64_t total = 0;
  for (int64_t& c : *counts) {
    const int64_t here = c;
    c = total;
    total += here;
  }
  return total;
}
}  // namespace

void BatchPlanner::OrderDistinct(BatchWork& w, ThreadPool* pool) {
  // (shard, index in its uniques) of the distinct IDs, by first occurrence.
  w.ordered.clear();
  if (!w.parallel) {
    for (int64_t p = 0; p < w.n; ++p) {
      if (w.first[p]) {
        w.ordered.emplace_back(static_cast<int32_t>(w.hashes[p] >> kShardShift), w.local[p]);
      }
    }
    return;
  }
  const int64_t n = w.n;
  const int64_t chunks = ChunkCount(n, pool);
  w.chunk_firsts.assign(chunks, 0);
  pool->ParallelFor(chunks, [&](int64_t c) {
    int64_t firsts = 0;
    for (int64_t p = n * c / chunks, end = n * (c + 1) / chunks; p < end; ++p) firsts += w.first[p];
    w.chunk_firsts[c] = firsts;
  });
  w.ordered.resize(ToOffsets(&w.chunk_firsts));
  pool->ParallelFor(chunks, [&](int64_t c) {
    int64_t out = w.chunk_firsts[c];
    for (int64_t p = n * c / chunks, end = n * (c + 1) / chunks; p < end; ++p) {
      if (w.first[p]) {
        w.ordered[out++] = {static_cast<int32_t>(w.hashes[p] >> kShardShift), w.local[p]};
      }
    }
  });
}

void BatchPlanner::SlotsInParallel(BatchWork& w, ThreadPool* pool, BatchPlan* plan) {
  const bool train = w.train;
  IdMap& ids = *ids_;
  DeviceRows& rows = *rows_;
  const int64_t distinct = static_cast<int64_t>(w.ordered.size());
  const int64_t chunks = ChunkCount(distinct, pool);
  w.assigned.resize(distinct);
  w.chunk_uniques.assign(chunks, 0);
  w.chunk_grants.assign(chunks, 0);
  // Pass 1: each distinct ID's row, kWantsRow (training: admitted now), or
  // kDefaultSlot; the chunk counts the IDs that take a unique index and the
  // grants. Records are only read, and no two distinct IDs share one.
  pool->ParallelFor(chunks, [&](int64_t c) {
    const int64_t begin = distinct * c / chunks;
    const int64_t end = distinct * (c + 1) / chunks;
    int64_t uniques = 0;
    int64_t grants = 0;
    for (int64_t i = begin; i < end; ++i) {
      if (i + kPrefetchDistance < end) {
        const auto& [s_ahead, l_ahead] = w.ordered[i + kPrefetchDistance];
        __builtin_prefetch(&ids[s_ahead].record(w.uniques[s_ahead][l_ahead].index));
      }
      const auto [s, l] = w.ordered[i];
      const BatchWork::Unique& id = w.uniques[s][l];
      const KeyRecord& rec = ids[s].record(id.index);
      int32_t row;
      if (!train) {
        row = EvalRow(w, id.key, rec);
      } else if (rec.row >= 0) {
        row = rec.row;
      } else {
        row = Admits(id.key, rec) ? kWantsRow : kDefaultSlot;
      }
      w.assigned[i] = row;
      uniques += row != kDefaultSlot;
      grants += row == kWantsRow;
    }
    w.chunk_uniques[c] = uniques;
    w.chunk_grants[c] = grants;
  });
  const int64_t unique_count = ToOffsets(&w.chunk_uniques);
  const int64_t wanted = ToOffsets(&w.chunk_grants);
  // Grant k (numbered by first occurrence) takes the free list's k-th row
  // from its back, then the never used rows in order, as DeviceSlot does.
  const int64_t from_free = std::min<int64_t>(wanted, static_cast<int64_t>(rows.free.size()));
  const int64_t fresh = std::min<int64_t>(wanted - from_free, rows.device_capacity - rows.next);
  const int64_t granted = from_free + fresh;
  const int64_t free_top = static_cast<int64_t>(rows.free.size()) - 1;
  const int64_t next = rows.next;
  const bool refill = options_.refill_new_rows;
  plan->unique_rows.resize(unique_count);
  plan->reused_rows.resize(from_free + (refill ? fresh : 0));
  w.granted.resize(granted);
  // Pass 2: unique indices and rows; the granted IDs' records take their rows.
  pool->ParallelFor(chunks, [&](int64_t c) {
    const int64_t begin = distinct * c / chunks;
    const int64_t end = distinct * (c + 1) / chunks;
    int64_t u = w.chunk_uniques[c];
    int64_t k = w.chunk_grants[c];
    for (int64_t i = begin; i < end; ++i) {
      if (i + kPrefetchDistance < end && w.assigned[i + kPrefetchDistance] == kWantsRow) {
        const auto& [s_ahead, l_ahead] = w.ordered[i + kPrefetchDistance];
        __builtin_prefetch(&ids[s_ahead].record(w.uniques[s_ahead][l_ahead].index), 1);
      }
      const auto [s, l] = w.ordered[i];
      int32_t row = w.assigned[i];
      if (row == kDefaultSlot) {
        w.global[s][l] = kDefaultSlot;
        continue;
      }
      if (row == kWantsRow) {
        if (k < granted) {
          const BatchWork::Unique& id = w.uniques[s][l];
          KeyRecord* rec = &ids[s].record(id.index);
          row = static_cast<int32_t>(k < from_free ? rows.free[free_top - k] : next + (k - from_free));
          rec->row = row;
          if (k < from_free || refill) plan->reused_rows[k] = row;
          w.granted[k] = {RecordRef{id.key, rec, nullptr}, k < from_free};
        }
        ++k;
      }
      // A shortfall's ID keeps a unique index it never reads: the batch is
      // refused (RefuseBatch clears the plan).
      plan->unique_rows[u] = row;
      w.global[s][l] = static_cast<int32_t>(u++);
    }
  });
  rows.free.resize(rows.free.size() - from_free);
  rows.next += fresh;
  plan->new_ids += granted;
  stats_->admitted += granted;
  w.shortfall += wanted - granted;
}

int32_t BatchPlanner::TieredSlot(BatchWork& w, const RecordRef& id, BatchPlan* plan) {
  const int32_t index = static_cast<int32_t>(plan->unique_rows.size());
  KeyRecord* rec = id.rec;
  if (rec->row >= 0) {
    cache_->Touch(rec->row);
    plan->unique_rows.push_back(rec->row);
    return index;
  }
  if (id.tier->in_host || Admits(id.key, *rec)) {
    // The row is handed out once the whole batch is known, so that no ID
    // of this batch becomes another one's victim.
    plan->unique_rows.push_back(-1);
    w.need.push_back(id);
    w.need_slots.push_back(index);
    return index;
  }
  return kDefaultSlot;
}

int32_t BatchPlanner::DeviceSlot(BatchWork& w, const RecordRef& id, BatchPlan* plan) {
  KeyRecord* rec = id.rec;
  if (rec->row < 0 && Admits(id.key, *rec)) {
    if (!rows_->free.empty()) {
      rec->row = rows_->free.back();
      rows_->free.pop_back();
      plan->reused_rows.push_back(rec->row);
      w.granted.emplace_back(id, true);
    } else if (rows_->next < rows_->device_capacity) {
      rec->row = static_cast<int32_t>(rows_->next++);
      // A never used row holds the variable initializer's value, which is right
      // unless the table draws each ID's first values from the ID itself.
      if (options_.refill_new_rows) plan->reused_rows.push_back(rec->row);
      w.granted.emplace_back(id, false);
    } else {
      ++w.shortfall;
    }
    if (rec->row >= 0) {
      ++plan->new_ids;
      ++stats_->admitted;
    }
  }
  if (rec->row < 0) return kDefaultSlot;
  plan->unique_rows.push_back(rec->row);
  return static_cast<int32_t>(plan->unique_rows.size()) - 1;
}

Status BatchPlanner::RefuseBatch(BatchWork& w, BatchPlan* plan) {
  // The step will not run, so no row may keep an ID it was given here: a reused
  // row would otherwise serve the new ID with the evicted ID's trained values.
  for (auto it = w.granted.rbegin(); it != w.granted.rend(); ++it) {
    if (it->second) {
      rows_->free.push_back(it->first.rec->row);
    } else {
      --rows_->next;
    }
    it->first.rec->row = -1;
  }
  stats_->admitted -= static_cast<int64_t>(w.granted.size());
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

void BatchPlanner::JournalGrants(BatchWork& w) {
  w.journal->admitted.reserve(w.journal->admitted.size() + w.granted.size());
  for (const auto& [id, from_free] : w.granted) {
    w.journal->admitted.push_back(id.key);
    if (from_free) {
      w.journal->popped_free.push_back(id.rec->row);
    } else {
      ++w.journal->fresh_rows;
    }
  }
}

}  // namespace mxrec
