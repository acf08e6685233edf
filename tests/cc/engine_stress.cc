// Stress test of the host engine (cc_ops/engine) under concurrency, with no
// TensorFlow and no Python. It links the engine's sources directly; the
// sanitizer builds (scripts/sanitize.sh: AddressSanitizer + UBSan, then
// ThreadSanitizer) and Bazel (//:engine_stress) run it.
//
// What runs at once, for a few seconds:
//   - three key-stage pipelines, each a producer thread that plans batches
//     with RunKeyStage on the Registry's pool and a thread playing the
//     training step, which takes the plans in order up to kDepth batches
//     behind (the prefetch of the graph modifier):
//       A: four device-only tables planned in parallel, admitting at first
//          sight, by count threshold, by probability, and with padding keys
//          and a fractional faae coefficient; train and eval batches, and
//          batches of 40,000 IDs that take Process's parallel path;
//       B: two tables sharing admission counts (USE_COMBINE_FAAE);
//       C: a tiered table (host_capacity > 0) and one with an SSD tier under a
//          temporary directory. The step applies each batch's swap plan the
//          way MxrecTierSwapInPlace does (HostTier::SwapInPlace on the
//          variable's buffer, then the fresh rows filled as FillFresh does),
//          component by component: the embedding, then two optimizer slots.
//          Between steps it checkpoints the tables with plans pending
//          (ExportState, ImportState into a scratch table, export again);
//   - a table planned directly with HostTable::Process by a training thread
//     and an evaluation thread;
//   - an evictor (Evict, Shrink, SetThreshold, ConfigureAdmission) that
//     protects the batches in flight as EvictHook does;
//   - a checkpoint thread taking full and delta exports of device-only tables
//     while they train and importing each full one into a scratch table;
//   - a reader of host-tier rows in place (ReadTier, as MxrecTierRead);
//   - a monitor reading Stats, tier stats, ExportRows and the Registry, and
//     resizing the key-stage pool;
//   - a dynamic-expansion store grown, updated and read by three threads.
//
// What it checks:
//   - every plan: restore indexes in [0, U] and one per distinct ID, unique
//     IDs numbered by first occurrence, unique rows distinct and in range,
//     reused rows among them, padding (and, where admission is at first
//     sight, nothing else) looking up the default;
//   - values: each step keeps its own copy of the device variables, whose
//     rows hold (ID, component, steps that trained the ID). A row the plan
//     did not refill must hold its ID's value with the count the step
//     expects, so a row given to two live IDs, or a value lost or stale after
//     a trip through the host tier or the SSD file, fails;
//   - host-tier reads and checkpointed tier values belong to their IDs;
//   - an imported state exports equal to what was imported; the fold of a
//     full export and its deltas has distinct rows and equals the final full
//     export.
// Any failure prints a line and the process exits 1; a watchdog aborts a run
// that hangs. MXREC_STRESS_SCALE (default 1) scales the number of batches.
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "engine/dynamic_store.h"
#include "engine/host_table.h"
#include "engine/host_tier.h"
#include "engine/key_stage.h"
#include "engine/registry.h"
#include "engine/status.h"
#include "engine/thread_pool.h"

namespace mxrec {
namespace stress {
namespace {

// Batches planned ahead of the step (prefetch_batch_number).
constexpr int kDepth = 3;
// Floats per row: the ID's 64 bits, the component tag, the steps count.
constexpr int64_t kDim = 4;
constexpr int64_t kMaxAge = 30;  // eviction age, in batches (timestamps count batches)
const char* const kPrefix = "stress/";

std::atomic<int> failures{0};
std::mutex print_mu;

template <typename... Args>
void Fail(const Args&... args) {
  const int count = ++failures;
  if (count > 30) return;
  const std::string line = internal::StrCat(args...);
  std::lock_guard<std::mutex> lock(print_mu);
  std::cerr << "FAIL: " << line << std::endl;
}

#define STRESS_CHECK(cond, ...)                                            \
  do {                                                                     \
    if (!(cond)) ::mxrec::stress::Fail(__LINE__, ": ", #cond, ": ", __VA_ARGS__); \
  } while (0)

bool CheckOk(const Status& status, const std::string& what) {
  if (!status.ok()) Fail(what, ": ", status.message());
  return status.ok();
}

// ---------------------------------------------------------------------------
// Row values of the simulated device variables.

struct Value {
  int64_t key = 0;
  int tag = 0;  // component + 1; 0: never written (the variable's initial value)
  uint32_t steps = 0;
};

void WriteValue(float* row, int64_t key, int component, uint32_t steps) {
  std::memcpy(row, &key, sizeof(key));  // floats 0 and 1: the ID's bits, copied as they are
  row[2] = static_cast<float>(component + 1);
  row[3] = static_cast<float>(steps);
}

Value ReadValue(const float* row) {
  Value value;
  std::memcpy(&value.key, row, sizeof(value.key));
  value.tag = static_cast<int>(row[2]);
  value.steps = static_cast<uint32_t>(row[3]);
  return value;
}

// ---------------------------------------------------------------------------
// IDs: a bijection of an index in [0, universe) onto int64, so that IDs spread
// over the whole range, negatives included; low indexes are drawn far more
// often (a hot head and a long tail that eviction removes).

int64_t KeyOf(uint64_t index, uint64_t salt) {
  return static_cast<int64_t>((index + 1) * 0x9E3779B97F4A7C15ULL ^ salt);
}

class KeySource {
 public:
  KeySource(uint64_t seed, uint64_t universe, uint64_t salt)
      : rng_(seed), universe_(universe), salt_(salt) {}

  void Fill(int64_t n, std::vector<int64_t>* keys) {
    static const int64_t kExtremes[] = {std::numeric_limits<int64_t>::min(),
                                        std::numeric_limits<int64_t>::max(), -1, 0};
    keys->resize(static_cast<size_t>(n));
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    for (auto& key : *keys) {
      const double u = unit(rng_);
      if (u < 0.002) {
        key = kExtremes[rng_() % 4];
      } else {
        key = KeyOf(static_cast<uint64_t>(u * u * u * static_cast<double>(universe_)), salt_);
      }
    }
  }

  uint64_t universe() const { return universe_; }
  uint64_t salt() const { return salt_; }

 private:
  std::mt19937_64 rng_;
  uint64_t universe_;
  uint64_t salt_;
};

// ---------------------------------------------------------------------------
// Checks of one plan. Returns the batch's unique IDs in plan order.

#define PLAN_CHECK(cond, ...)                                                     \
  do {                                                                            \
    if (!(cond)) {                                                                \
      ok = false;                                                                 \
      ::mxrec::stress::Fail(__LINE__, ": ", #cond, ": ", __VA_ARGS__);            \
    }                                                                             \
  } while (0)

bool CheckPlan(const TableOptions& options, const std::vector<int64_t>& keys, bool train,
               bool admits_all, const BatchPlan& plan, std::vector<int64_t>* unique_keys) {
  const std::string& name = options.name;
  const int64_t n = static_cast<int64_t>(keys.size());
  const int64_t u_count = static_cast<int64_t>(plan.unique_rows.size());
  bool ok = true;  // this plan's checks; other threads fail on their own
  PLAN_CHECK(static_cast<int64_t>(plan.restore.size()) == n, name, ": restore has ",
               plan.restore.size(), " entries for ", n, " IDs");
  if (static_cast<int64_t>(plan.restore.size()) != n) return false;
  std::unordered_set<int32_t> rows;
  for (int32_t row : plan.unique_rows) {
    PLAN_CHECK(row >= 0 && row < options.device_capacity, name, ": unique row ", row,
                 " outside [0, ", options.device_capacity, ")");
    PLAN_CHECK(rows.insert(row).second, name, ": row ", row, " given to two IDs of a batch");
  }
  unique_keys->assign(static_cast<size_t>(u_count), 0);
  std::vector<uint8_t> seen(static_cast<size_t>(u_count), 0);
  std::unordered_map<int64_t, int32_t> index_of;
  int32_t next_index = 0;
  const auto& pads = options.padding_keys;
  for (int64_t p = 0; p < n; ++p) {
    const int64_t key = keys[p];
    const int32_t r = plan.restore[p];
    if (r < 0 || r > u_count) {
      Fail(name, ": restore[", p, "] = ", r, " outside [0, ", u_count, "]");
      return false;
    }
    const bool padding = std::find(pads.begin(), pads.end(), key) != pads.end();
    if (padding) PLAN_CHECK(r == u_count, name, ": padding ID ", key, " got index ", r);
    if (train && admits_all && !padding) {
      PLAN_CHECK(r < u_count, name, ": ID ", key, " not admitted at first sight");
    }
    auto [it, inserted] = index_of.emplace(key, r);
    PLAN_CHECK(it->second == r, name, ": ID ", key, " has indexes ", it->second, " and ", r);
    if (r == u_count) continue;
    if (!seen[r]) {
      // Unique IDs are numbered by first occurrence.
      PLAN_CHECK(r == next_index, name, ": first index of ID ", key, " is ", r,
                   ", expected ", next_index);
      next_index = std::max(next_index, r + 1);
      seen[r] = 1;
      (*unique_keys)[r] = key;
    } else {
      PLAN_CHECK((*unique_keys)[r] == key, name, ": index ", r, " serves IDs ",
                   (*unique_keys)[r], " and ", key);
    }
  }
  PLAN_CHECK(next_index == u_count, name, ": ", u_count - next_index,
               " unique rows no position uses");
  std::unordered_set<int32_t> reused;
  for (int32_t row : plan.reused_rows) {
    PLAN_CHECK(rows.count(row) == 1, name, ": reused row ", row, " is not a row of the batch");
    PLAN_CHECK(reused.insert(row).second, name, ": reused row ", row, " listed twice");
  }
  if (!train) {
    PLAN_CHECK(plan.reused_rows.empty() && plan.new_ids == 0, name,
                 ": an eval batch handed out rows");
  }
  PLAN_CHECK(plan.new_ids >= 0 && plan.new_ids <= u_count, name, ": new_ids ", plan.new_ids);
  return ok;
}

// ---------------------------------------------------------------------------
// The step's copy of one table: its device variables (the embedding and, for
// tiered tables, optimizer slots) and the steps each live ID was trained.

struct DeviceCopy {
  DeviceCopy(int64_t rows, int components)
      : values(static_cast<size_t>(components),
               std::vector<float>(static_cast<size_t>(rows * kDim), 0.0f)) {}
  float* Row(int component, int32_t row) { return values[component].data() + row * kDim; }
  std::vector<std::vector<float>> values;  // [component][row * kDim]
  std::unordered_map<int64_t, uint32_t> steps;
};

// Checks that `row` holds `key`'s value of `component` as trained so far.
void CheckRowValue(const std::string& name, DeviceCopy* copy, int component, int32_t row,
                   int64_t key) {
  const Value value = ReadValue(copy->Row(component, row));
  auto it = copy->steps.find(key);
  if (value.key != key || value.tag != component + 1 || it == copy->steps.end() ||
      value.steps != it->second) {
    Fail(name, ": row ", row, " of component ", component, " should hold ID ", key, " after ",
         it == copy->steps.end() ? -1 : static_cast<int64_t>(it->second),
         " steps; it holds ID ", value.key, " (tag ", value.tag, ") after ", value.steps);
  }
}

// A device-only table's step: rows handed out by the plan take the
// initializer (reused rows, and never used rows that still hold the
// variable's initial value); every other row must hold its ID's value.
void StepDeviceOnly(const std::string& name, const BatchPlan& plan,
                    const std::vector<int64_t>& unique_keys, bool train, DeviceCopy* copy) {
  const std::unordered_set<int32_t> reused(plan.reused_rows.begin(), plan.reused_rows.end());
  for (size_t u = 0; u < unique_keys.size(); ++u) {
    const int32_t row = plan.unique_rows[u];
    const int64_t key = unique_keys[u];
    float* value = copy->Row(0, row);
    if (reused.count(row) != 0 || ReadValue(value).tag == 0) {
      if (!train) {
        Fail(name, ": an eval batch reads row ", row, " of ID ", key, ", which no step wrote");
        continue;
      }
      WriteValue(value, key, 0, 0);
      copy->steps[key] = 0;
    } else {
      CheckRowValue(name, copy, 0, row, key);
    }
    if (train) {
      const uint32_t steps = ++copy->steps[key];
      WriteValue(value, key, 0, steps);
    }
  }
}

// A tiered table's step, as the graph runs it: per component, in order, the
// swap of the batch's plan on the variable's buffer (MxrecTierSwapInPlace),
// the initializer into the rows of IDs the tier has no value for; then the
// lookup (checked here) and the update of every component.
void StepTiered(HostTable* table, const std::vector<int>& components, const BatchPlan& plan,
                const std::vector<int64_t>& unique_keys, DeviceCopy* copy) {
  const std::string& name = table->options().name;
  const int64_t capacity = table->options().device_capacity;
  std::unordered_map<int32_t, int64_t> row_key;
  for (size_t u = 0; u < unique_keys.size(); ++u) row_key[plan.unique_rows[u]] = unique_keys[u];
  const std::vector<int32_t>& rows = plan.reused_rows;  // the plan's rows
  const int64_t n = static_cast<int64_t>(rows.size());
  auto pool = Registry::Global().pool();
  std::vector<uint8_t> fresh_embedding;
  for (size_t c = 0; c < components.size(); ++c) {
    std::unique_ptr<bool[]> fresh(new bool[static_cast<size_t>(std::max<int64_t>(n, 1))]);
    const Status status = table->tier()->SwapInPlace(components[c], rows.data(), n,
                                                     copy->values[c].data(), capacity,
                                                     fresh.get(), pool.get());
    if (!CheckOk(status, name + ": SwapInPlace")) return;
    for (int64_t i = 0; i < n; ++i) {
      if (c == 0) {
        fresh_embedding.push_back(fresh[i] ? 1 : 0);
      } else {
        STRESS_CHECK(fresh[i] == (fresh_embedding[i] != 0), name, ": row ", rows[i],
                     " is fresh for component ", c, " but not for the embedding, or back");
      }
      if (!fresh[i]) continue;
      auto it = row_key.find(rows[i]);
      if (it == row_key.end()) {
        Fail(name, ": swap row ", rows[i], " is no row of the batch");
        return;
      }
      WriteValue(copy->Row(static_cast<int>(c), rows[i]), it->second, static_cast<int>(c), 0);
      if (c == 0) copy->steps[it->second] = 0;
    }
  }
  for (size_t u = 0; u < unique_keys.size(); ++u) {
    const int32_t row = plan.unique_rows[u];
    const int64_t key = unique_keys[u];
    if (ReadValue(copy->Row(0, row)).tag == 0) {
      // A never used row holds the initializer's value already.
      for (size_t c = 0; c < components.size(); ++c) {
        STRESS_CHECK(ReadValue(copy->Row(static_cast<int>(c), row)).tag == 0, name, ": row ", row,
                     " was written for component ", c, " but not for the embedding");
        WriteValue(copy->Row(static_cast<int>(c), row), key, static_cast<int>(c), 0);
      }
      copy->steps[key] = 0;
    }
    for (size_t c = 0; c < components.size(); ++c) {
      CheckRowValue(name, copy, static_cast<int>(c), row, key);
    }
    const uint32_t steps = ++copy->steps[key];
    for (size_t c = 0; c < components.size(); ++c) {
      WriteValue(copy->Row(static_cast<int>(c), row), key, static_cast<int>(c), steps);
    }
  }
}

// ---------------------------------------------------------------------------
// Checkpoints.

// A state's per-ID fields by ID, the host-tier values as their bits: with swap
// plans pending, ExportState orders IDs by their planned rows but exports
// where their values are, so equal states may list IDs in other orders.
std::map<int64_t, std::string> ById(const TableState& state) {
  std::map<int64_t, std::string> ids;
  const size_t width = state.tier_components.size() * kDim;
  size_t h = 0;
  for (size_t i = 0; i < state.keys.size(); ++i) {
    std::string fields = internal::StrCat(state.rows[i], "/", state.counts[i], "/",
                                          state.last_seen[i]);
    if (i < state.in_host.size() && state.in_host[i]) {
      const uint32_t present = h < state.tier_present.size() ? state.tier_present[h] : 0;
      fields += internal::StrCat("/host/", present);
      if ((h + 1) * width <= state.tier_values.size()) {
        fields.append(reinterpret_cast<const char*>(&state.tier_values[h * width]),
                      width * sizeof(float));
      }
      ++h;
    }
    ids[state.keys[i]] = std::move(fields);
  }
  return ids;
}

bool SameState(const TableState& a, const TableState& b) {
  return ById(a) == ById(b) && a.free_rows == b.free_rows && a.next_row == b.next_row &&
         a.newest_timestamp == b.newest_timestamp && a.counting_frozen == b.counting_frozen &&
         a.access_threshold == b.access_threshold && a.lru_rows == b.lru_rows &&
         a.lru_ages == b.lru_ages && a.tier_components == b.tier_components &&
         a.keys.size() == b.keys.size() && a.tier_present.size() == b.tier_present.size();
}

// Rows of a state: distinct, in range, none both owned and free.
void CheckStateRows(const std::string& what, const TableOptions& options,
                    const TableState& state) {
  const size_t n = state.keys.size();
  STRESS_CHECK(state.rows.size() == n && state.counts.size() == n && state.last_seen.size() == n,
               what, ": arrays of different lengths");
  STRESS_CHECK(state.next_row >= 0 && state.next_row <= options.device_capacity, what,
               ": next_row ", state.next_row);
  std::vector<uint8_t> taken(static_cast<size_t>(std::max<int64_t>(state.next_row, 0)), 0);
  auto claim = [&](int32_t row, const char* kind) {
    if (row < 0 || row >= state.next_row || taken[row]) {
      Fail(what, ": ", kind, " row ", row, " out of [0, ", state.next_row, ") or taken twice");
      return;
    }
    taken[row] = 1;
  };
  for (size_t i = 0; i < state.rows.size(); ++i) {
    if (state.rows[i] >= 0) claim(state.rows[i], "owned");
  }
  for (int32_t row : state.free_rows) claim(row, "free");
}

// Imports `state` into a new table with `options` and checks that it exports
// the same arrays.
void CheckRoundTrip(const std::string& what, const TableOptions& options, const TableState& state) {
  HostTable scratch(options);
  if (!CheckOk(scratch.ImportState(state), what + ": ImportState")) return;
  TableState again;
  if (!CheckOk(scratch.ExportState(0, /*delta_chain=*/true, &again), what + ": export after import")) return;
  STRESS_CHECK(SameState(state, again), what, ": an imported state exports differently (",
               state.keys.size(), " vs ", again.keys.size(), " IDs)");
}

// A device-only table's host state folded from a full export and its deltas,
// as the Saver restores it.
struct Folded {
  std::map<int64_t, std::tuple<int32_t, float, int64_t>> ids;  // key -> (row, count, last_seen)
  std::vector<int32_t> free_rows;
  int64_t next_row = 0;
  uint32_t epoch = 0;

  void Reset(const TableState& full) {
    ids.clear();
    Apply(full);
  }
  void Apply(const TableState& state) {
    for (int64_t key : state.removed) ids.erase(key);
    for (size_t i = 0; i < state.keys.size(); ++i) {
      ids[state.keys[i]] = {state.rows[i], state.counts[i], state.last_seen[i]};
    }
    free_rows = state.free_rows;
    next_row = state.next_row;
    epoch = state.epoch;
  }
  TableState AsState() const {
    TableState state;
    for (const auto& [key, record] : ids) {
      state.keys.push_back(key);
      state.rows.push_back(std::get<0>(record));
      state.counts.push_back(std::get<1>(record));
      state.last_seen.push_back(std::get<2>(record));
    }
    state.free_rows = free_rows;
    state.next_row = next_row;
    return state;
  }
};

// Full and delta exports of device-only tables while they train.
class CheckpointChains {
 public:
  explicit CheckpointChains(std::vector<std::shared_ptr<HostTable>> tables)
      : tables_(std::move(tables)), chains_(tables_.size()) {
    for (size_t t = 0; t < tables_.size(); ++t) Full(t);
  }

  void Round() {
    ++rounds_;
    for (size_t t = 0; t < tables_.size(); ++t) {
      if (rounds_ % 5 == 0) {
        Full(t);
      } else {
        Delta(t);
      }
    }
  }

  // With nothing training: the last delta folded in equals a full export.
  void Finish() {
    for (size_t t = 0; t < tables_.size(); ++t) {
      Delta(t);
      TableState full;
      const std::string& name = tables_[t]->options().name;
      if (!CheckOk(tables_[t]->ExportState(0, /*delta_chain=*/true, &full), name + ": final export")) continue;
      Folded expected;
      expected.Reset(full);
      STRESS_CHECK(chains_[t].ids == expected.ids, name, ": full export + ", deltas_,
                   " deltas folded hold ", chains_[t].ids.size(), " IDs unlike the full export's ",
                   expected.ids.size(), " (or other rows or counts)");
      STRESS_CHECK(chains_[t].free_rows == full.free_rows && chains_[t].next_row == full.next_row,
                   name, ": folded free rows differ from the full export's");
    }
  }

  int64_t exports() const { return exports_; }

 private:
  void Full(size_t t) {
    HostTable& table = *tables_[t];
    TableState state;
    if (!CheckOk(table.ExportState(0, /*delta_chain=*/true, &state), table.options().name + ": full export")) {
      return;
    }
    ++exports_;
    CheckStateRows(table.options().name + " full export", table.options(), state);
    CheckRoundTrip(table.options().name + " full export", table.options(), state);
    chains_[t].Reset(state);
    // As after a full save: the next delta starts from here.
    table.PruneRemovedLog(state.epoch);
  }

  void Delta(size_t t) {
    HostTable& table = *tables_[t];
    TableState delta;
    if (!CheckOk(table.ExportState(chains_[t].epoch, /*delta_chain=*/true, &delta),
                 table.options().name + ": delta export")) {
      return;
    }
    ++exports_;
    ++deltas_;
    STRESS_CHECK(delta.epoch > chains_[t].epoch, table.options().name, ": delta epoch ",
                 delta.epoch, " after ", chains_[t].epoch);
    chains_[t].Apply(delta);
    // The fold is the table's state at the delta: a delta that missed a
    // change shows as a row owned twice, or owned and free.
    CheckStateRows(table.options().name + " full + deltas", table.options(),
                   chains_[t].AsState());
  }

  std::vector<std::shared_ptr<HostTable>> tables_;
  std::vector<Folded> chains_;
  int64_t rounds_ = 0;
  int64_t exports_ = 0;
  int64_t deltas_ = 0;
};

// A tiered table's checkpoint between steps, with the plans of prefetched
// batches pending: host-tier values belong to their IDs and are as trained,
// device rows hold their IDs' values (or the initial value), and the state
// imports into a new table and exports the same.
void CheckTieredCheckpoint(HostTable* table, DeviceCopy* copy, uint32_t* epoch) {
  const std::string& name = table->options().name;
  TableState state;
  if (!CheckOk(table->ExportState(0, /*delta_chain=*/true, &state), name + ": tiered export")) return;
  CheckStateRows(name + " tiered export", table->options(), state);
  const size_t n = state.keys.size();
  STRESS_CHECK(state.in_host.size() == n, name, ": ", state.in_host.size(), " tier flags for ", n,
               " IDs");
  if (state.in_host.size() != n) return;
  const size_t components = state.tier_components.size();
  STRESS_CHECK(components == copy->values.size(), name, ": checkpoint names ", components,
               " components");
  if (components != copy->values.size()) return;
  const uint32_t all = (1u << components) - 1;
  size_t h = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t key = state.keys[i];
    if (state.in_host[i]) {
      STRESS_CHECK(state.rows[i] == -1, name, ": ID ", key, " in the host tier has row ",
                   state.rows[i]);
      STRESS_CHECK(state.tier_present[h] == all, name, ": ID ", key,
                   " in the host tier lacks values (mask ", state.tier_present[h], ")");
      for (size_t c = 0; c < components; ++c) {
        if (!(state.tier_present[h] & (1u << c))) continue;
        const Value value = ReadValue(&state.tier_values[(h * components + c) * kDim]);
        auto it = copy->steps.find(key);
        STRESS_CHECK(value.key == key && value.tag == static_cast<int>(c) + 1 &&
                         it != copy->steps.end() && value.steps == it->second,
                     name, ": checkpointed host value of ID ", key, " component ", c,
                     " holds ID ", value.key, " tag ", value.tag, " after ", value.steps,
                     " steps");
      }
      ++h;
    } else if (state.rows[i] >= 0) {
      // Brand-new IDs of pending batches own never used rows (initial values).
      if (ReadValue(copy->Row(0, state.rows[i])).tag != 0) {
        CheckRowValue(name + " checkpointed row", copy, 0, state.rows[i], key);
      }
    }
  }
  STRESS_CHECK(h == state.tier_present.size(), name, ": ", state.tier_present.size(),
               " tier masks for ", h, " IDs in the host tier");
  CheckRoundTrip(name + " tiered export", table->options(), state);
  // A delta with the same plans pending.
  TableState delta;
  if (CheckOk(table->ExportState(state.epoch, /*delta_chain=*/true, &delta), name + ": tiered delta")) {
    STRESS_CHECK(delta.in_host.size() == delta.keys.size(), name, ": delta tier flags");
    *epoch = delta.epoch;
  }
}

// ---------------------------------------------------------------------------
// A pipeline: a producer planning batches of several tables with the key
// stage, and a step consuming them in order.

template <typename T>
class BoundedQueue {
 public:
  explicit BoundedQueue(size_t capacity) : capacity_(capacity) {}
  void Push(T item) {
    std::unique_lock<std::mutex> lock(mu_);
    not_full_.wait(lock, [&] { return items_.size() < capacity_; });
    items_.push_back(std::move(item));
    not_empty_.notify_one();
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    not_empty_.notify_all();
  }
  bool Pop(T* item) {
    std::unique_lock<std::mutex> lock(mu_);
    not_empty_.wait(lock, [&] { return closed_ || !items_.empty(); });
    if (items_.empty()) return false;
    *item = std::move(items_.front());
    items_.pop_front();
    not_full_.notify_one();
    return true;
  }

 private:
  const size_t capacity_;
  std::mutex mu_;
  std::condition_variable not_empty_;
  std::condition_variable not_full_;
  std::deque<T> items_;
  bool closed_ = false;
};

struct PipelineTable {
  std::shared_ptr<HostTable> table;
  int64_t batch_ids = 0;
  bool admits_all = false;
  std::vector<int> components;  // tiered tables: tier component indexes
};

struct PipelineConfig {
  std::string name;
  int batches = 0;
  int eval_every = 0;     // every n-th batch is an eval batch (0: none)
  int big_every = 0;      // every n-th batch of the first table has kBigBatch IDs
  int checkpoint_every = 0;  // tiered tables: checkpoint between steps
  uint64_t seed = 0;
};

constexpr int64_t kBigBatch = 40000;

class Pipeline {
 public:
  Pipeline(PipelineConfig config, std::vector<PipelineTable> tables,
           std::vector<KeySource> sources)
      : config_(std::move(config)), tables_(std::move(tables)), sources_(std::move(sources)),
        queue_(kDepth) {
    for (const auto& t : tables_) {
      copies_.emplace_back(t.table->options().device_capacity,
                           std::max<int>(1, static_cast<int>(t.components.size())));
    }
  }

  void Start() {
    producer_ = std::thread([this] { Produce(); });
    step_ = std::thread([this] { Step(); });
  }
  void Join() {
    producer_.join();
    step_.join();
  }
  // Checks the tiered tables' checkpoints once more; call after Join.
  void FinalCheck() {
    for (size_t t = 0; t < tables_.size(); ++t) {
      if (tables_[t].table->tiered()) {
        uint32_t epoch = 0;
        CheckTieredCheckpoint(tables_[t].table.get(), &copies_[t], &epoch);
      }
    }
  }
  int64_t steps() const { return steps_; }
  int64_t ids() const { return ids_; }
  int64_t evicted() const { return evicted_; }

 private:
  struct Batch {
    bool train = true;
    std::vector<std::vector<int64_t>> keys;
    std::vector<BatchPlan> plans;
  };

  void Produce() {
    for (int b = 0; b < config_.batches && failures.load() == 0; ++b) {
      Batch batch;
      batch.train = config_.eval_every == 0 || b % config_.eval_every != config_.eval_every - 1;
      std::vector<HostTable*> tables;
      std::vector<KeySpan> spans;
      batch.keys.resize(tables_.size());
      for (size_t t = 0; t < tables_.size(); ++t) {
        int64_t size = tables_[t].batch_ids;
        if (t == 0 && batch.train && config_.big_every > 0 && b % config_.big_every == 1) {
          size = kBigBatch;
        }
        sources_[t].Fill(size, &batch.keys[t]);
        tables.push_back(tables_[t].table.get());
        spans.push_back({batch.keys[t].data(), static_cast<int64_t>(batch.keys[t].size())});
        ids_ += size;
      }
      // Each pipeline evicts its own tables before a key stage, as EvictHook does between
      // steps: the background thread's eviction runs concurrently but may be starved on a
      // loaded machine, and the tables must not fill whatever the scheduling (the IDs of
      // the last kMaxAge batches fit every table).
      for (auto* table : tables) evicted_ += table->Evict(kMaxAge);
      auto pool = Registry::Global().pool();  // per batch, as the kernel does
      // Planned ahead of its step, as the input pipeline plans: pending until the step
      // thread commits it.
      if (!CheckOk(RunKeyStage(tables, spans, batch.train, b, pool.get(), &batch.plans,
                               /*deferred=*/true),
                   config_.name + ": key stage")) {
        break;
      }
      queue_.Push(std::move(batch));
    }
    queue_.Close();
  }

  void Step() {
    Batch batch;
    int64_t step = 0;
    std::vector<uint32_t> epochs(tables_.size(), 0);
    while (queue_.Pop(&batch)) {
      ++step;
      for (size_t t = 0; t < tables_.size(); ++t) {
        HostTable* table = tables_[t].table.get();
        std::vector<int64_t> unique_keys;
        if (!CheckPlan(table->options(), batch.keys[t], batch.train, tables_[t].admits_all,
                       batch.plans[t], &unique_keys)) {
          continue;
        }
        if (table->tiered()) {
          StepTiered(table, tables_[t].components, batch.plans[t], unique_keys, &copies_[t]);
        } else {
          StepDeviceOnly(table->options().name, batch.plans[t], unique_keys, batch.train,
                         &copies_[t]);
        }
        if (batch.plans[t].batch_id != 0) {
          CheckOk(table->Commit(batch.plans[t].batch_id), table->options().name + ": commit");
        }
        if (table->tiered() && config_.checkpoint_every > 0 &&
            step % config_.checkpoint_every == 0) {
          CheckTieredCheckpoint(table, &copies_[t], &epochs[t]);
        }
      }
    }
    steps_ = step;
  }

  PipelineConfig config_;
  std::vector<PipelineTable> tables_;
  std::vector<KeySource> sources_;
  std::vector<DeviceCopy> copies_;
  BoundedQueue<Batch> queue_;
  std::thread producer_;
  std::thread step_;
  int64_t steps_ = 0;
  int64_t ids_ = 0;
  int64_t evicted_ = 0;
};

// ---------------------------------------------------------------------------

std::shared_ptr<HostTable> CreateTable(const TableOptions& options) {
  std::shared_ptr<HostTable> table;
  bool created = false;
  const std::string key = kPrefix + options.name;
  CheckOk(Registry::Global().CreateTable(key, options, &table, &created), "CreateTable " + key);
  STRESS_CHECK(created, key, ": not created");
  // The same settings again: the same table (an Estimator rebuilding its graph).
  std::shared_ptr<HostTable> again;
  CheckOk(Registry::Global().CreateTable(key, options, &again, &created), "CreateTable again");
  STRESS_CHECK(!created && again == table, key, ": a second CreateTable made a new table");
  TableOptions other = options;
  other.dim += 1;
  STRESS_CHECK(!Registry::Global().CreateTable(key, other, &again).ok(), key,
               ": other settings under the same key were accepted");
  return table;
}

TableOptions Options(const std::string& name, int64_t capacity) {
  TableOptions options;
  options.name = name;
  options.dim = kDim;
  options.device_capacity = capacity;
  return options;
}

// Runs `fn` every `period` until `stop`.
std::thread Every(std::chrono::microseconds period, const std::atomic<bool>& stop,
                  std::function<void()> fn) {
  return std::thread([period, &stop, fn = std::move(fn)] {
    while (!stop.load()) {
      fn();
      std::this_thread::sleep_for(period);
    }
  });
}

// Three threads on one dynamic-expansion store: one grows it, one updates the
// rows handed out so far, one reads them.
void StressDynamicStore(double scale) {
  DynamicStoreOptions options;
  options.name = "dynamic";
  options.dim = kDim;
  options.chunk_rows = 256;
  // The host table whose key stage hands out the addresses (rows 0, 1, ... in order).
  auto owner = std::make_shared<HostTable>(Options("dynamic_owner", (int64_t{1} << 31) - 1));
  DynamicStore store(options, owner);
  int accumulator = -1;
  CheckOk(store.AddSlot("adagrad/accumulator", 0.1f, &accumulator), "AddSlot");
  const int rounds = std::max(20, static_cast<int>(200 * scale));
  std::atomic<int64_t> grown{0};
  std::thread grow([&] {
    for (int r = 0; r < rounds; ++r) {
      std::vector<int64_t> addresses;
      for (int64_t i = 0; i < 64; ++i) addresses.push_back(r * 64 + i);
      BatchPlan plan;  // 64 new IDs: the owner hands out the next 64 rows
      CheckOk(owner->Process(addresses.data(), 64, true, r, nullptr, &plan), "owner plan");
      std::vector<int64_t> fresh;
      CheckOk(store.EnsureRows(addresses.data(), 64, &fresh), "EnsureRows");
      STRESS_CHECK(fresh.size() == 64, "dynamic: ", fresh.size(), " fresh of 64 new addresses");
      std::vector<float> init(64 * kDim, 0.5f);
      CheckOk(store.Write(fresh.data(), 64, -1, init.data(), "stress"), "Write");
      grown.store((r + 1) * 64);
    }
  });
  auto worker = [&](bool update) {
    std::mt19937_64 rng(update ? 1 : 2);
    for (int r = 0; r < rounds; ++r) {
      const int64_t limit = grown.load();
      if (limit == 0) {
        std::this_thread::yield();
        continue;
      }
      std::vector<int64_t> addresses(32);
      for (auto& a : addresses) a = static_cast<int64_t>(rng() % limit);
      std::vector<float> rows(32 * kDim, 0.01f);
      if (update) {
        CheckOk(store.ApplyAdagrad(addresses.data(), 32, rows.data(), 0.1f, accumulator),
                "ApplyAdagrad");
      } else {
        CheckOk(store.Read(addresses.data(), 32, -1, rows.data(), "stress"), "Read");
        for (float v : rows) STRESS_CHECK(v > 0.0f && v <= 0.5f, "dynamic: row value ", v);
      }
    }
  };
  std::thread update(worker, true);
  std::thread read(worker, false);
  grow.join();
  update.join();
  read.join();
}

// Everything but the watchdog and the SSD directory; every table is gone when
// it returns.
void Run(const std::string& ssd_dir) {
  const char* scale_env = getenv("MXREC_STRESS_SCALE");
  const double scale = scale_env != nullptr ? std::max(0.01, atof(scale_env)) : 1.0;
  const auto batches = [scale](int n) { return std::max(10, static_cast<int>(n * scale)); };
  const auto start = std::chrono::steady_clock::now();

  Registry& registry = Registry::Global();
  registry.SetNumThreads(3);
  // Plans of 64 rows and more are copied on the pool, so the parallel swap runs.
  HostTier::SetParallelMinRows(64);
  {
    std::shared_ptr<HostTable> missing;
    STRESS_CHECK(registry.GetTable("stress/none", &missing).code() == StatusCode::kNotFound,
                 "GetTable of an unknown key");
    TableOptions bad = Options("bad", 0);
    STRESS_CHECK(!registry.CreateTable("stress/bad", bad, &missing).ok(), "capacity 0 accepted");
  }

  // Pipeline A: device-only tables, each admitting its own way.
  auto a_first_sight = CreateTable(Options("a_first_sight", 1 << 16));
  auto a_threshold = CreateTable(Options("a_threshold", 1 << 14));
  auto a_probability = CreateTable(Options("a_probability", 1 << 14));
  TableOptions padded = Options("a_padding", 1 << 14);
  padded.padding_keys = {0, -1};
  auto a_padding = CreateTable(padded);
  AdmissionOptions admission;
  admission.access_threshold = 3;
  a_threshold->ConfigureAdmission(admission);
  admission = AdmissionOptions();
  admission.probability = 0.5;
  admission.seed = 7;
  a_probability->ConfigureAdmission(admission);
  admission = AdmissionOptions();
  admission.access_threshold = 2;
  admission.faae_coefficient = 0.5;
  a_padding->ConfigureAdmission(admission);

  // Pipeline B: two tables sharing admission counts.
  auto b_left = CreateTable(Options("b_left", 1 << 14));
  auto b_right = CreateTable(Options("b_right", 1 << 14));
  auto counts = registry.CountGroup(std::string(kPrefix) + "faae");
  admission = AdmissionOptions();
  admission.access_threshold = 2;
  for (auto& table : {b_left, b_right}) {
    table->ShareCounts(counts);
    table->ConfigureAdmission(admission);
  }

  // Pipeline C: a host tier, and a host tier over an SSD tier.
  TableOptions host_options = Options("c_host", 1024);
  host_options.host_capacity = 8192;
  auto c_host = CreateTable(host_options);
  TableOptions ssd_options = Options("c_ssd", 256);
  ssd_options.host_capacity = 512;
  ssd_options.ssd_capacity = 16384;
  ssd_options.ssd_path = ssd_dir;
  auto c_ssd = CreateTable(ssd_options);
  std::vector<int> components;
  for (const char* component : {HostTier::kEmbedding, "m", "v"}) {
    int index = -1;
    CheckOk(c_host->tier()->RegisterComponent(component, &index), "RegisterComponent");
    CheckOk(c_ssd->tier()->RegisterComponent(component, &index), "RegisterComponent");
    components.push_back(index);
  }
  STRESS_CHECK(components == std::vector<int>({0, 1, 2}), "components numbered ",
               components.size());

  // Planned directly, by a training and an evaluation thread.
  auto direct = CreateTable(Options("direct", 1 << 15));

  std::vector<std::shared_ptr<HostTable>> all = {a_first_sight, a_threshold, a_probability,
                                                 a_padding, b_left, b_right, c_host, c_ssd,
                                                 direct};

  PipelineConfig config_a{"A", batches(240), 5, 40, 0, 1};
  Pipeline pipeline_a(config_a,
                      {{a_first_sight, 1024, true, {}},
                       {a_threshold, 1024, false, {}},
                       {a_probability, 1024, false, {}},
                       {a_padding, 1024, false, {}}},
                      {KeySource(11, 50000, 1), KeySource(12, 20000, 2), KeySource(13, 20000, 3),
                       KeySource(14, 20000, 4)});
  PipelineConfig config_b{"B", batches(240), 0, 0, 0, 2};
  // Both tables see the same IDs, so the shared counts matter.
  Pipeline pipeline_b(config_b, {{b_left, 512, false, {}}, {b_right, 512, false, {}}},
                      {KeySource(21, 20000, 5), KeySource(22, 20000, 5)});
  PipelineConfig config_c{"C", batches(240), 0, 0, 25, 3};
  Pipeline pipeline_c(config_c,
                      {{c_host, 384, true, components}, {c_ssd, 160, true, components}},
                      {KeySource(31, 6000, 6), KeySource(32, 5000, 7)});

  std::atomic<bool> stop{false};
  std::atomic<int64_t> evicted{0};
  std::atomic<int64_t> tier_reads{0};
  CheckpointChains chains({a_first_sight, a_threshold, direct});
  std::vector<std::thread> background;
  int64_t rounds = 0;
  background.push_back(Every(std::chrono::milliseconds(2), stop, [&, rounds]() mutable {
    ++rounds;
    for (auto& table : all) {
      evicted += table->Evict(kMaxAge);
      if (rounds % 5 == 0) evicted += table->Shrink(3);
    }
    a_threshold->SetThreshold(rounds % 7 == 0 ? 0.0 : 3.0);  // 0 freezes the counts
    AdmissionOptions probability;
    probability.probability = 0.5;
    probability.seed = 7;
    a_probability->ConfigureAdmission(probability);
  }));
  background.push_back(Every(std::chrono::milliseconds(3), stop, [&] { chains.Round(); }));
  KeySource tier_keys(41, 6000, 6);
  KeySource ssd_keys(42, 5000, 7);
  background.push_back(Every(std::chrono::milliseconds(1), stop, [&]() {
    for (auto* pair : {&tier_keys, &ssd_keys}) {
      HostTable* table = pair == &tier_keys ? c_host.get() : c_ssd.get();
      std::vector<int64_t> keys;
      pair->Fill(64, &keys);
      const int component = static_cast<int>(tier_reads.load() % 3);
      std::vector<float> values(keys.size() * kDim);
      std::unique_ptr<bool[]> found(new bool[keys.size()]);
      if (!CheckOk(table->ReadTier(component, keys.data(), static_cast<int64_t>(keys.size()),
                                   values.data(), found.get()),
                   "ReadTier")) {
        continue;
      }
      for (size_t i = 0; i < keys.size(); ++i) {
        const Value value = ReadValue(&values[i * kDim]);
        if (found[i]) {
          STRESS_CHECK(value.key == keys[i] && value.tag == component + 1, table->options().name,
                       ": ReadTier of ID ", keys[i], " component ", component, " gave ID ",
                       value.key, " tag ", value.tag);
        } else {
          STRESS_CHECK(value.key == 0 && value.tag == 0, table->options().name,
                       ": ReadTier found no value of ID ", keys[i], " but wrote one");
        }
      }
      ++tier_reads;
    }
  }));
  int64_t monitor_rounds = 0;
  background.push_back(Every(std::chrono::milliseconds(2), stop, [&, monitor_rounds]() mutable {
    for (auto& table : all) {
      const TableStats stats = table->Stats();
      STRESS_CHECK(stats.rows_in_use >= 0 && stats.rows_in_use <= stats.device_capacity &&
                       stats.ids_tracked >= 0 && stats.admitted >= 0 && stats.evicted >= 0,
                   table->options().name, ": stats rows ", stats.rows_in_use, " of ",
                   stats.device_capacity);
      if (table->tiered()) {
        const TierStats tier = table->tier()->Stats();
        STRESS_CHECK(tier.host_rows >= 0 && tier.ssd_rows >= 0 && tier.pending_plans >= 0,
                     table->options().name, ": tier stats");
        // Host memory may hold up to a device cache more than its size for a while.
        STRESS_CHECK(tier.host_rows <= table->options().host_capacity +
                                           table->options().device_capacity,
                     table->options().name, ": ", tier.host_rows, " host rows");
      }
    }
    if (++monitor_rounds % 4 == 0) {
      std::vector<int64_t> keys;
      std::vector<int32_t> rows;
      a_first_sight->ExportRows(&keys, &rows);
      for (size_t i = 1; i < rows.size(); ++i) {
        STRESS_CHECK(rows[i - 1] < rows[i], "ExportRows not ordered by distinct rows");
      }
    }
    if (monitor_rounds % 50 == 0) {
      // The kernels fetch the pool per call; a resize swaps it under them.
      Registry::Global().SetNumThreads(monitor_rounds % 100 == 0 ? 3 : 2);
    }
    STRESS_CHECK(Registry::Global().Keys().size() >= all.size(), "registry lost tables");
  }));

  pipeline_a.Start();
  pipeline_b.Start();
  pipeline_c.Start();
  std::atomic<bool> direct_done{false};
  std::thread direct_train([&] {
    KeySource source(51, 30000, 8);
    std::vector<int64_t> keys;
    BatchPlan plan;
    std::vector<int64_t> unique_keys;
    for (int b = 0; b < batches(240) && failures.load() == 0; ++b) {
      source.Fill(b % 50 == 7 ? kBigBatch : 1024, &keys);
      auto pool = Registry::Global().pool();
      if (!CheckOk(direct->Process(keys.data(), static_cast<int64_t>(keys.size()), true, b,
                                   pool.get(), &plan),
                   "direct train")) {
        break;
      }
      CheckPlan(direct->options(), keys, true, true, plan, &unique_keys);
    }
    direct_done = true;
  });
  std::thread direct_eval([&] {
    KeySource source(52, 30000, 8);
    std::vector<int64_t> keys;
    BatchPlan plan;
    std::vector<int64_t> unique_keys;
    while (!direct_done.load() && failures.load() == 0) {
      source.Fill(512, &keys);
      if (!CheckOk(direct->Process(keys.data(), static_cast<int64_t>(keys.size()), false, -1,
                                   nullptr, &plan),
                   "direct eval")) {
        break;
      }
      CheckPlan(direct->options(), keys, false, false, plan, &unique_keys);
    }
  });
  StressDynamicStore(scale);

  pipeline_a.Join();
  pipeline_b.Join();
  pipeline_c.Join();
  direct_train.join();
  direct_eval.join();
  stop = true;
  for (auto& thread : background) thread.join();
  chains.Finish();
  pipeline_c.FinalCheck();

  int64_t swapped_in = 0;
  int64_t ssd_rows = 0;
  int64_t ssd_file_bytes = 0;
  for (auto& table : {c_host, c_ssd}) {
    const TierStats tier = table->tier()->Stats();
    swapped_in += tier.swap_in_total;
    ssd_rows += tier.ssd_rows;
    ssd_file_bytes += tier.ssd_file_bytes;
  }
  STRESS_CHECK(swapped_in > 0, "no row came back from the host tier");
  STRESS_CHECK(ssd_file_bytes > 0 || ssd_rows > 0, "the SSD tier was never used");
  evicted += pipeline_a.evicted() + pipeline_b.evicted() + pipeline_c.evicted();
  STRESS_CHECK(evicted.load() > 0, "nothing was evicted");

  const int dropped = registry.DropPrefix(kPrefix);
  STRESS_CHECK(dropped == static_cast<int>(all.size()), "DropPrefix dropped ", dropped);
  all.clear();
  a_first_sight.reset();
  a_threshold.reset();
  a_probability.reset();
  a_padding.reset();
  b_left.reset();
  b_right.reset();
  c_host.reset();
  c_ssd.reset();
  direct.reset();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "engine_stress: steps A " << pipeline_a.steps() << " B " << pipeline_b.steps()
            << " C " << pipeline_c.steps() << ", IDs planned "
            << pipeline_a.ids() + pipeline_b.ids() + pipeline_c.ids() << ", evicted "
            << evicted.load() << ", checkpoint exports " << chains.exports()
            << ", tier rows swapped in " << swapped_in << ", SSD file bytes " << ssd_file_bytes
            << ", tier reads " << tier_reads.load() << ", " << seconds << " s" << std::endl;
}

int Main() {
  // A run that hangs (a deadlock) aborts instead of stalling CI.
  std::mutex done_mu;
  std::condition_variable done_cv;
  bool done = false;
  std::thread watchdog([&] {
    const char* env = getenv("MXREC_STRESS_TIMEOUT");
    const int seconds = env != nullptr ? atoi(env) : 300;
    std::unique_lock<std::mutex> lock(done_mu);
    if (!done_cv.wait_for(lock, std::chrono::seconds(seconds), [&] { return done; })) {
      std::cerr << "FAIL: engine_stress did not finish in " << seconds << " s (a hang?)"
                << std::endl;
      std::abort();
    }
  });

  // Under `bazel test`, TEST_TMPDIR is the test's own writable directory.
  const char* tmp = getenv("TEST_TMPDIR");
  if (tmp == nullptr || *tmp == '\0') tmp = getenv("TMPDIR");
  std::string path = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
                     "/mxrec-stress-XXXXXX";
  std::vector<char> buf(path.begin(), path.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    Fail("cannot create a temporary directory under ", path);
  } else {
    const std::string ssd_dir = buf.data();
    Run(ssd_dir);
    // Dropped tables remove their SSD files: the directory is empty again.
    if (rmdir(ssd_dir.c_str()) != 0) {
      Fail("SSD directory ", ssd_dir, " not empty after every table was dropped: ",
           std::strerror(errno));
    }
  }

  {
    std::lock_guard<std::mutex> lock(done_mu);
    done = true;
  }
  done_cv.notify_all();
  watchdog.join();
  return failures.load() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace stress
}  // namespace mxrec

int main() {
  const int code = mxrec::stress::Main();
  if (code != 0) {
    std::cerr << "engine_stress: " << mxrec::stress::failures.load() << " failure(s)\n";
  }
  return code;
}
