// Management calls into the host engine from Python: creating and dropping
// tables, statistics, threshold and eviction control, and direct batch
// planning for tests and benchmarks. Planning releases the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/dynamic_store.h"
#include "engine/huge_pages.h"
#include "engine/key_stage.h"
#include "engine/registry.h"
#include "engine/row_format.h"

namespace py = pybind11;

namespace mxrec {
namespace {

void RaiseIfError(const Status& status) {
  if (status.ok()) return;
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
      throw py::value_error(status.message());
    case StatusCode::kNotFound:
      throw py::key_error(status.message());
    default:
      throw std::runtime_error(status.message());
  }
}

std::shared_ptr<HostTable> Table(const std::string& key) {
  std::shared_ptr<HostTable> table;
  RaiseIfError(Registry::Global().GetTable(key, &table));
  return table;
}

// A C-contiguous array argument, converted from any array-like.
template <typename T>
using Array = py::array_t<T, py::array::c_style | py::array::forcecast>;

template <typename T>
py::array_t<T> ToArray(const std::vector<T>& values) {
  py::array_t<T> out(static_cast<py::ssize_t>(values.size()));
  std::copy(values.begin(), values.end(), out.mutable_data());
  return out;
}

// A stats struct of the engine (TableStats, TierStats, DynamicStoreStats) as
// a dict, from the struct's own list of its fields.
template <typename Stats>
py::dict StatsDict(const Stats& stats) {
  py::dict d;
  stats.ForEachField([&d](const char* name, int64_t value) { d[name] = value; });
  return d;
}

py::list Process(const std::vector<std::string>& keys,
                 const std::vector<py::array_t<int64_t, py::array::c_style | py::array::forcecast>>& ids,
                 bool train, int64_t timestamp, bool deferred) {
  std::vector<HostTable*> tables;
  std::vector<std::shared_ptr<HostTable>> owners;
  std::vector<KeySpan> spans;
  for (size_t i = 0; i < keys.size(); ++i) {
    owners.push_back(Table(keys[i]));
    tables.push_back(owners.back().get());
  }
  for (const auto& array : ids) {
    if (array.ndim() != 1) throw py::value_error("IDs must be 1-D arrays");
    spans.push_back({array.data(), static_cast<int64_t>(array.size())});
  }
  // The restore index goes straight into the arrays returned.
  std::vector<BatchPlan> plans(spans.size());
  std::vector<py::array_t<int32_t>> restores;
  for (size_t i = 0; i < spans.size(); ++i) {
    restores.emplace_back(static_cast<py::ssize_t>(spans[i].size));
    plans[i].restore_out = restores.back().mutable_data();
  }
  Status status;
  {
    py::gil_scoped_release release;
    auto pool = Registry::Global().pool();
    status = RunKeyStage(tables, spans, train, timestamp, pool.get(), &plans, deferred);
  }
  RaiseIfError(status);
  py::list out;
  for (size_t i = 0; i < plans.size(); ++i) {
    const BatchPlan& plan = plans[i];
    if (deferred) {
      out.append(py::make_tuple(ToArray(plan.unique_rows), restores[i],
                                ToArray(plan.reused_rows), plan.batch_id));
    } else {
      out.append(py::make_tuple(ToArray(plan.unique_rows), restores[i],
                                ToArray(plan.reused_rows)));
    }
  }
  return out;
}

void CreateTable(const std::string& key, const TableOptions& options, double access_threshold,
                 double faae_coefficient) {
  std::shared_ptr<HostTable> table;
  bool created = false;
  RaiseIfError(Registry::Global().CreateTable(key, options, &table, &created));
  // An existing table (the same model built again in another graph) keeps
  // the admission policy it has, which training may have changed.
  if (created) {
    AdmissionOptions admission;
    admission.access_threshold = access_threshold;
    admission.faae_coefficient = faae_coefficient;
    table->ConfigureAdmission(admission);
  }
}

HostTier* Tier(const std::shared_ptr<HostTable>& table) {
  if (!table->tiered()) {
    throw py::value_error("mxrec table '" + table->options().name +
                          "' has no host tier (host_vocabulary_size is 0)");
  }
  return table->tier();
}

int Component(HostTier* tier, const std::string& name) {
  int index = 0;
  RaiseIfError(tier->RegisterComponent(name, &index));
  return index;
}

// Writes a save's records and host-tier values, chunk by chunk, into a spool
// folder, one file per column: `keys.bin` (int64), `rows.bin` (int32),
// `counts.bin` (float32), `last_seen.bin` (int64), `in_host.bin` (uint8,
// tiered tables), `present.bin` (uint32 per in_host ID) and
// `component-<c>.bin` ([in_host IDs, dim] float32 of component c). The Saver
// then copies them into the checkpoint file a chunk at a time: what the
// export holds in memory at once is one chunk, whatever the table's size.
class Spool {
 public:
  Spool(std::string folder, int64_t dim) : folder_(std::move(folder)), dim_(dim) {}
  ~Spool() {
    for (auto& [name, f] : files_) std::fclose(f);
  }

  Status WriteRecords(const TableState& chunk) {
    const size_t n = chunk.keys.size();
    MXREC_RETURN_IF_ERROR(Put("keys.bin", chunk.keys.data(), sizeof(int64_t) * n));
    MXREC_RETURN_IF_ERROR(Put("rows.bin", chunk.rows.data(), sizeof(int32_t) * n));
    MXREC_RETURN_IF_ERROR(Put("counts.bin", chunk.counts.data(), sizeof(float) * n));
    MXREC_RETURN_IF_ERROR(Put("last_seen.bin", chunk.last_seen.data(), sizeof(int64_t) * n));
    if (!chunk.in_host.empty()) {
      MXREC_RETURN_IF_ERROR(Put("in_host.bin", chunk.in_host.data(), n));
    }
    records_ += static_cast<int64_t>(n);
    for (int32_t row : chunk.rows) rowless_ += row < 0 ? 1 : 0;
    return Status::Ok();
  }

  Status WriteTier(const std::vector<std::string>& components, const uint32_t* present,
                   const float* values, int64_t n) {
    MXREC_RETURN_IF_ERROR(Put("present.bin", present, sizeof(uint32_t) * n));
    const size_t width = components.size() * static_cast<size_t>(dim_);
    column_.resize(static_cast<size_t>(n * dim_));
    for (size_t c = 0; c < components.size(); ++c) {
      for (int64_t i = 0; i < n; ++i) {
        std::copy(values + i * width + c * dim_, values + i * width + (c + 1) * dim_,
                  column_.data() + i * dim_);
      }
      MXREC_RETURN_IF_ERROR(Put("component-" + std::to_string(c) + ".bin", column_.data(),
                                sizeof(float) * column_.size()));
    }
    tier_ += n;
    return Status::Ok();
  }

  Status Close() {
    bool failed = false;
    for (auto& [name, f] : files_) failed = (std::fclose(f) != 0) || failed;
    files_.clear();
    if (failed) return MXREC_ERROR(StatusCode::kInternal, "cannot write ", folder_);
    return Status::Ok();
  }

  int64_t records() const { return records_; }
  int64_t rowless() const { return rowless_; }
  int64_t tier() const { return tier_; }

 private:
  Status Put(const std::string& name, const void* data, size_t bytes) {
    auto it = files_.find(name);
    if (it == files_.end()) {
      const std::string path = folder_ + "/" + name;
      std::FILE* f = std::fopen(path.c_str(), "wb");
      if (f == nullptr) {
        return MXREC_ERROR(StatusCode::kInternal, "cannot create the save's spool file ", path);
      }
      it = files_.emplace(name, f).first;
    }
    if (bytes > 0 && std::fwrite(data, 1, bytes, it->second) != bytes) {
      return MXREC_ERROR(StatusCode::kResourceExhausted, "cannot write ", bytes,
                         " bytes to the save's spool files in ", folder_,
                         " (is the disk full?)");
    }
    return Status::Ok();
  }

  std::string folder_;
  int64_t dim_;
  std::map<std::string, std::FILE*> files_;
  std::vector<float> column_;
  int64_t records_ = 0;
  int64_t rowless_ = 0;
  int64_t tier_ = 0;
};

// The checkpoint state of a table as a dict (ExportState), and back.
// spool: a folder where the records and a tiered table's host-tier values go
// in chunks of chunk_rows IDs (Spool) instead of into the dict, which then
// holds their counts: "records", "rowless" (records without a device row,
// first in the files) and "tier_spooled".
py::dict ExportState(const std::string& key, uint32_t since_epoch, bool delta_chain,
                     const std::string& spool_folder, int64_t chunk_rows) {
  std::shared_ptr<HostTable> table = Table(key);
  TableState state;
  Status status;
  std::unique_ptr<Spool> spool;
  {
    py::gil_scoped_release release;
    if (!spool_folder.empty()) {
      spool = std::make_unique<Spool>(spool_folder, table->options().dim);
      state.tier_chunk_rows = chunk_rows;
      Spool* out = spool.get();
      state.record_writer = [out](const TableState& chunk) { return out->WriteRecords(chunk); };
      state.tier_writer = [out](const std::vector<std::string>& components,
                                const uint32_t* present, const float* values, int64_t n) {
        return out->WriteTier(components, present, values, n);
      };
    }
    status = table->ExportState(since_epoch, delta_chain, &state);
    if (spool) {
      const Status closed = spool->Close();
      if (status.ok()) status = closed;
    }
  }
  RaiseIfError(status);
  py::dict d;
  if (spool) {
    d["records"] = spool->records();
    d["rowless"] = spool->rowless();
  } else {
    d["keys"] = ToArray(state.keys.owned());
    d["rows"] = ToArray(state.rows.owned());
    d["counts"] = ToArray(state.counts.owned());
    d["last_seen"] = ToArray(state.last_seen.owned());
  }
  d["free_rows"] = ToArray(state.free_rows);
  d["removed"] = ToArray(state.removed);
  d["next_row"] = state.next_row;
  d["newest_timestamp"] = state.newest_timestamp;
  d["counting_frozen"] = state.counting_frozen;
  d["access_threshold"] = state.access_threshold;
  if (table->tiered()) {
    const int64_t dim = table->options().dim;
    const int64_t n_host = static_cast<int64_t>(state.tier_present.size());
    const int64_t n_comp = static_cast<int64_t>(state.tier_components.size());
    if (!spool) d["in_host"] = ToArray(state.in_host.owned());
    d["lru_rows"] = ToArray(state.lru_rows);
    d["lru_ages"] = ToArray(state.lru_ages);
    d["tier_components"] = state.tier_components;
    if (spool) {
      d["tier_spooled"] = spool->tier();
    } else {
      d["tier_present"] = ToArray(state.tier_present);
      py::array_t<float> values({n_host, n_comp, dim});
      std::copy(state.tier_values.begin(), state.tier_values.end(), values.mutable_data());
      d["tier_values"] = values;
    }
  }
  d["epoch"] = state.epoch;
  return d;
}

// tier_reader(begin, n) -> (present [n] uint32, values [n, C, dim] float32):
// the host-tier values of the in_host IDs begin, ..., begin + n - 1, read in
// chunks of chunk_rows (None: tier_present and tier_values hold them all). It
// runs with the GIL held, as the whole import does. The engine reads each
// chunk in the arrays returned (kept until the next call), not in a copy.
TierValueReader PythonTierReader(py::object reader, int64_t width,
                                 std::unique_ptr<py::error_already_set>* raised) {
  auto held = std::make_shared<std::pair<Array<uint32_t>, Array<float>>>();
  return [reader, width, raised, held](int64_t begin, int64_t n, const uint32_t** present,
                                       const float** values) {
    try {
      py::tuple chunk = reader(begin, n);
      held->first = chunk[0].cast<Array<uint32_t>>();
      held->second = chunk[1].cast<Array<float>>();
      if (held->first.size() != n || held->second.size() != n * width) {
        return MXREC_ERROR(StatusCode::kInvalidArgument, "a restore's host-tier chunk of ", n,
                           " IDs holds ", held->first.size(), " masks and ",
                           held->second.size(), " values (expected ", n * width, ")");
      }
      *present = held->first.data();
      *values = held->second.data();
    } catch (py::error_already_set& err) {
      *raised = std::make_unique<py::error_already_set>(std::move(err));
      return MXREC_ERROR(StatusCode::kInternal, "the restore's host-tier reader raised");
    }
    return Status::Ok();
  };
}

void ImportState(const std::string& key, Array<int64_t> keys, Array<int32_t> rows,
                 Array<float> counts, Array<int64_t> last_seen, Array<int32_t> free_rows,
                 int64_t next_row, int64_t newest_timestamp, bool counting_frozen,
                 double access_threshold, Array<uint8_t> in_host, Array<int32_t> lru_rows,
                 Array<uint32_t> lru_ages, const std::vector<std::string>& tier_components,
                 Array<uint32_t> tier_present, Array<float> tier_values, py::object tier_reader,
                 int64_t chunk_rows) {
  std::shared_ptr<HostTable> table = Table(key);
  TableState state;
  state.in_host.View(in_host.data(), in_host.size());
  state.lru_rows.assign(lru_rows.data(), lru_rows.data() + lru_rows.size());
  state.lru_ages.assign(lru_ages.data(), lru_ages.data() + lru_ages.size());
  state.tier_components = tier_components;
  std::unique_ptr<py::error_already_set> raised;
  if (!tier_reader.is_none()) {
    state.tier_reader = PythonTierReader(
        tier_reader, static_cast<int64_t>(tier_components.size()) * table->options().dim, &raised);
    state.tier_chunk_rows = chunk_rows;
  } else {
    state.tier_present.assign(tier_present.data(), tier_present.data() + tier_present.size());
    state.tier_values.assign(tier_values.data(), tier_values.data() + tier_values.size());
  }
  // The columns are read where they are (arrays mapped from a checkpoint file
  // included): the arguments outlive the import, which holds the GIL.
  state.keys.View(keys.data(), keys.size());
  state.rows.View(rows.data(), rows.size());
  state.counts.View(counts.data(), counts.size());
  state.last_seen.View(last_seen.data(), last_seen.size());
  state.free_rows.assign(free_rows.data(), free_rows.data() + free_rows.size());
  state.next_row = next_row;
  state.newest_timestamp = newest_timestamp;
  state.counting_frozen = counting_frozen;
  state.access_threshold = access_threshold;
  const Status status = table->ImportState(state);
  if (raised) throw *raised;
  RaiseIfError(status);
}

// Tables: create, look up, plan batches, statistics, eviction; the pool.
void DefineTableCalls(py::module_& m) {
  m.def(
      "create_table",
      [](const std::string& key, const std::string& name, int64_t dim, int64_t device_capacity,
         const std::vector<int64_t>& padding_keys, double access_threshold,
         double faae_coefficient, int64_t host_capacity, int64_t ssd_capacity,
         const std::string& ssd_path, bool refill_new_rows, const std::string& storage_dtype,
         const std::string& slot_dtype) {
        TableOptions options;
        if (!ParseElementType(storage_dtype, &options.embedding_type) ||
            !ParseElementType(slot_dtype, &options.slot_type)) {
          throw py::value_error("mxrec table '" + name +
                                "': storage_dtype and slot_dtype must be 'float32', 'bfloat16' "
                                "or 'float16', got '" + storage_dtype + "' and '" + slot_dtype +
                                "'");
        }
        options.name = name;
        options.dim = dim;
        options.device_capacity = device_capacity;
        options.padding_keys = padding_keys;
        options.host_capacity = host_capacity;
        options.ssd_capacity = ssd_capacity;
        options.ssd_path = ssd_path;
        options.refill_new_rows = refill_new_rows;
        CreateTable(key, options, access_threshold, faae_coefficient);
      },
      // "capacity": the device rows (mx_rec's device_vocabulary_size), the
      // keyword every caller passes.
      py::arg("key"), py::arg("name"), py::arg("dim"), py::arg("capacity"),
      py::arg("padding_keys") = std::vector<int64_t>(), py::arg("access_threshold") = 0.0,
      py::arg("faae_coefficient") = 1.0, py::arg("host_capacity") = 0,
      py::arg("ssd_capacity") = 0, py::arg("ssd_path") = "",
      py::arg("refill_new_rows") = false, py::arg("storage_dtype") = "float32",
      py::arg("slot_dtype") = "float32");
  m.def("is_tiered", [](const std::string& key) { return Table(key)->tiered(); });
  m.def("drop_prefix", [](const std::string& prefix) { return Registry::Global().DropPrefix(prefix); });
  m.def("table_keys", [] { return Registry::Global().Keys(); });
  m.def("set_num_threads", [](int n) {
    if (n < 1) throw py::value_error("KEY_PROCESS_THREAD_NUM must be >= 1");
    Registry::Global().SetNumThreads(n);
  });
  m.def("num_threads", [] { return Registry::Global().pool()->num_threads(); });
  m.def("set_tier_parallel_min_rows", [](int64_t rows) { HostTier::SetParallelMinRows(rows); });
  m.def("set_spill_delay_for_testing",
        [](int64_t microseconds) { HostTier::SetSpillDelayForTesting(microseconds); });
  // Tests of the out-of-memory paths: larger blocks are refused (0: no limit).
  m.def("set_allocation_limit_for_testing", [](int64_t bytes) {
    if (bytes < 0) throw py::value_error("the allocation limit must be >= 0");
    SetAllocationLimitForTesting(static_cast<size_t>(bytes));
  });
  m.def("process", &Process, py::arg("keys"), py::arg("ids"), py::arg("train"),
        py::arg("timestamp") = -1, py::arg("deferred") = false);
  m.def("commit", [](const std::string& key, uint64_t batch_id) {
    RaiseIfError(Table(key)->Commit(batch_id));
  });
  m.def("pending_batches", [](const std::string& key) { return Table(key)->pending_batches(); });
  m.def("removed_log_size", [](const std::string& key) { return Table(key)->removed_log_size(); });
  m.def("stats", [](const std::string& key) {
    return StatsDict(Table(key)->Stats());
  });
  m.def(
      "export_rows",
      [](const std::string& key, bool at_boundary) {
        std::vector<int64_t> keys;
        std::vector<int32_t> rows;
        if (at_boundary) {
          RaiseIfError(Table(key)->ExportBoundaryRows(&keys, &rows));
        } else {
          Table(key)->ExportRows(&keys, &rows);
        }
        return py::make_tuple(ToArray(keys), ToArray(rows));
      },
      py::arg("key"), py::arg("at_boundary") = false);
  m.def("set_threshold", [](const std::string& key, double threshold) {
    if (threshold < 0) throw py::value_error("threshold must be >= 0");
    Table(key)->SetThreshold(threshold);
  });
  m.def(
      "evict",
      [](const std::string& key, int64_t max_age) {
        if (max_age < 0) throw py::value_error("eviction_threshold must be >= 0");
        std::shared_ptr<HostTable> table = Table(key);
        py::gil_scoped_release release;
        return table->Evict(max_age);
      },
      py::arg("key"), py::arg("max_age"));
  m.def(
      "shrink",
      [](const std::string& key, int threshold) {
        if (threshold < 1 || threshold > UINT16_MAX) {
          throw py::value_error("shrink threshold must be in [1, 65535]");
        }
        std::shared_ptr<HostTable> table = Table(key);
        py::gil_scoped_release release;
        return table->Shrink(threshold);
      },
      py::arg("key"), py::arg("threshold"));
  m.def("newest_timestamp", [](const std::string& key) { return Table(key)->newest_timestamp(); });
  m.def("wall_clock_seconds", &WallClockSeconds);
}

// Feature admission.
void DefineAdmissionCalls(py::module_& m) {
  m.def(
      "configure_admission",
      [](const std::string& key, double access_threshold, double faae_coefficient,
         double probability, uint64_t seed) {
        if (access_threshold < 0) throw py::value_error("access_threshold must be >= 0");
        if (faae_coefficient <= 0) throw py::value_error("faae_coefficient must be > 0");
        if (!(probability > 0 && probability <= 1)) {
          throw py::value_error("admission probability must be in (0, 1]");
        }
        AdmissionOptions admission{access_threshold, faae_coefficient, probability, seed};
        Table(key)->ConfigureAdmission(admission);
      },
      py::arg("key"), py::arg("access_threshold") = 0.0, py::arg("faae_coefficient") = 1.0,
      py::arg("probability") = 1.0, py::arg("seed") = 0);
  m.def(
      "share_counts",
      [](const std::string& key, const std::string& group) {
        Table(key)->ShareCounts(Registry::Global().CountGroup(group));
      },
      py::arg("key"), py::arg("group"));
  m.def("admission", [](const std::string& key) {
    const AdmissionOptions a = Table(key)->admission();
    py::dict d;
    d["access_threshold"] = a.access_threshold;
    d["faae_coefficient"] = a.faae_coefficient;
    d["probability"] = a.probability;
    d["seed"] = a.seed;
    return d;
  });
}

// The host tier of tiered tables (host_vocabulary_size > 0).
void DefineTierCalls(py::module_& m) {
  m.def("set_swap_protect", [](const std::string& key, uint32_t batches) {
    Table(key)->SetSwapProtect(batches);
  });
  m.def("tier_register", [](const std::string& key, const std::string& component) {
    return Component(Tier(Table(key)), component);
  });
  m.def("tier_components", [](const std::string& key) {
    return Tier(Table(key))->components();
  });
  m.def(
      "tier_swap",
      [](const std::string& key, const std::string& component,
         py::array_t<int32_t, py::array::c_style | py::array::forcecast> rows,
         py::array_t<float, py::array::c_style | py::array::forcecast> current) {
        std::shared_ptr<HostTable> table = Table(key);
        HostTier* tier = Tier(table);
        const int64_t n = rows.size();
        const int64_t dim = table->options().dim;
        if (current.size() != n * dim) throw py::value_error("current must be [len(rows), dim]");
        py::array_t<float> incoming({n, dim});
        std::vector<uint8_t> fresh_bytes(n);
        const int index = Component(tier, component);
        Status status;
        {
          py::gil_scoped_release release;
          std::unique_ptr<bool[]> fresh(new bool[n > 0 ? n : 1]);
          status = tier->Swap(index, rows.data(), n, current.data(), incoming.mutable_data(),
                              fresh.get(), Registry::Global().pool().get());
          for (int64_t i = 0; i < n; ++i) fresh_bytes[i] = fresh[i] ? 1 : 0;
        }
        RaiseIfError(status);
        py::array_t<bool> fresh_out(n);
        for (int64_t i = 0; i < n; ++i) fresh_out.mutable_data()[i] = fresh_bytes[i] != 0;
        return py::make_tuple(incoming, fresh_out);
      },
      py::arg("key"), py::arg("component"), py::arg("rows"), py::arg("current"));
  m.def(
      "tier_export",
      [](const std::string& key, const std::string& component) {
        std::shared_ptr<HostTable> table = Table(key);
        HostTier* tier = Tier(table);
        const int index = Component(tier, component);
        std::vector<int64_t> keys;
        std::vector<float> values;
        RaiseIfError(tier->Export(index, &keys, &values));
        const int64_t dim = table->options().dim;
        py::array_t<float> out({static_cast<int64_t>(keys.size()), dim});
        std::copy(values.begin(), values.end(), out.mutable_data());
        return py::make_tuple(ToArray(keys), out);
      },
      py::arg("key"), py::arg("component") = std::string(HostTier::kEmbedding));
  m.def("tier_stats", [](const std::string& key) {
    std::shared_ptr<HostTable> table = Table(key);
    return StatsDict(Tier(table)->Stats());
  });
}

// Host state in and out of checkpoints.
void DefineCheckpointCalls(py::module_& m) {
  m.def("export_state", &ExportState, py::arg("key"), py::arg("since_epoch") = 0,
        py::arg("delta_chain") = false, py::arg("spool") = std::string(),
        py::arg("chunk_rows") = 65536);
  m.def("import_state", &ImportState, py::arg("key"), py::arg("keys"), py::arg("rows"), py::arg("counts"), py::arg("last_seen"),
      py::arg("free_rows"), py::arg("next_row"), py::arg("newest_timestamp"),
      py::arg("counting_frozen"), py::arg("access_threshold"),
      py::arg("in_host") = py::array_t<uint8_t>(0), py::arg("lru_rows") = py::array_t<int32_t>(0),
      py::arg("lru_ages") = py::array_t<uint32_t>(0),
      py::arg("tier_components") = std::vector<std::string>(),
      py::arg("tier_present") = py::array_t<uint32_t>(0),
      py::arg("tier_values") = py::array_t<float>(0), py::arg("tier_reader") = py::none(),
      py::arg("chunk_rows") = 65536);
  m.def("prune_removed_log", [](const std::string& key, uint32_t epoch) {
    Table(key)->PruneRemovedLog(epoch);
  });
}

// Dynamic expansion (init(use_dynamic_expansion=True)): the chunked row store
// of a table, keyed like its host table. See engine/dynamic_store.h.
void DefineDynamicStoreCalls(py::module_& m) {
  m.def(
      "create_dynamic_store",
      [](const std::string& key, const std::string& name, int64_t dim, int64_t chunk_rows) {
        DynamicStoreOptions options;
        options.name = name;
        options.dim = dim;
        options.chunk_rows = chunk_rows;
        std::shared_ptr<DynamicStore> store;
        RaiseIfError(DynamicStoreRegistry::Global().Create(key, options, &store));
      },
      py::arg("key"), py::arg("name"), py::arg("dim"), py::arg("chunk_rows"));
  m.def("drop_dynamic_stores", [](const std::string& prefix) {
    return DynamicStoreRegistry::Global().DropPrefix(prefix);
  });
  m.def("dynamic_store_stats", [](const std::string& key) {
    std::shared_ptr<DynamicStore> store;
    RaiseIfError(DynamicStoreRegistry::Global().Get(key, &store));
    py::dict d = StatsDict(store->Stats());
    d["chunk_rows"] = store->options().chunk_rows;
    d["slot_names"] = store->SlotNames();
    return d;
  });
  // Reads rows of the embedding (slot "") or of the named optimizer slot.
  m.def(
      "dynamic_store_read",
      [](const std::string& key,
         py::array_t<int64_t, py::array::c_style | py::array::forcecast> addresses,
         const std::string& slot) {
        std::shared_ptr<DynamicStore> store;
        RaiseIfError(DynamicStoreRegistry::Global().Get(key, &store));
        int index = -1;
        if (!slot.empty()) {
          const std::vector<std::string> names = store->SlotNames();
          auto it = std::find(names.begin(), names.end(), slot);
          if (it == names.end()) throw py::key_error("no optimizer slot named " + slot);
          index = static_cast<int>(it - names.begin());
        }
        const int64_t n = addresses.size();
        py::array_t<float> out({static_cast<py::ssize_t>(n),
                                static_cast<py::ssize_t>(store->options().dim)});
        Status status;
        {
          py::gil_scoped_release release;
          status = store->Read(addresses.data(), n, index, out.mutable_data(),
                               "dynamic_store_read");
        }
        RaiseIfError(status);
        return out;
      },
      py::arg("key"), py::arg("addresses"), py::arg("slot") = "");
  // Marks rows as in use and writes their values (embedding, or a slot added
  // with `initial` if new): how a restore puts saved rows back.
  m.def(
      "dynamic_store_write",
      [](const std::string& key,
         py::array_t<int64_t, py::array::c_style | py::array::forcecast> addresses,
         py::array_t<float, py::array::c_style | py::array::forcecast> values,
         const std::string& slot, float initial) {
        std::shared_ptr<DynamicStore> store;
        RaiseIfError(DynamicStoreRegistry::Global().Get(key, &store));
        const int64_t n = addresses.size();
        if (values.ndim() != 2 || values.shape(0) != n || values.shape(1) != store->options().dim) {
          throw py::value_error("dynamic_store_write: values must be [len(addresses), dim]");
        }
        int index = -1;
        if (!slot.empty()) RaiseIfError(store->AddSlot(slot, initial, &index));
        std::vector<int64_t> fresh;
        RaiseIfError(store->EnsureRows(addresses.data(), n, &fresh));
        RaiseIfError(store->Write(addresses.data(), n, index, values.data(),
                                  "dynamic_store_write"));
      },
      py::arg("key"), py::arg("addresses"), py::arg("values"), py::arg("slot") = "",
      py::arg("initial") = 0.0f);
}

}  // namespace
}  // namespace mxrec

PYBIND11_MODULE(_mxrec_engine, m) {
  m.doc() = "Host engine of mxrec (management calls; the training path uses the TF ops).";
  mxrec::DefineTableCalls(m);
  mxrec::DefineAdmissionCalls(m);
  mxrec::DefineTierCalls(m);
  mxrec::DefineCheckpointCalls(m);
  mxrec::DefineDynamicStoreCalls(m);
}
