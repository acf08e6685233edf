// Row storage of a table in dynamic-expansion mode (init(use_dynamic_expansion=True)).
//
// Instead of a tf.Variable of fixed size, the table's rows live in chunks of
// `chunk_rows` rows that are allocated as rows are handed out, so the table
// has no preset capacity. A row is addressed by an int64 address, which is
// the row the host key stage gave the ID (rows are never reused: eviction is
// not offered in this mode). Each optimizer slot (Adagrad's accumulator,
// LazyAdam's m and v) is another chunked array of the same shape.
//
// This is the CPU stand-in for mxRec's device-side dynamic tables: plain C++,
// no TensorFlow; the MxrecDynamic* op kernels are thin adapters over it.
#ifndef MXREC_ENGINE_DYNAMIC_STORE_H_
#define MXREC_ENGINE_DYNAMIC_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "host_table.h"
#include "huge_pages.h"
#include "status.h"

namespace mxrec {

struct DynamicStoreOptions {
  // The user's table name; every error message carries it.
  std::string name;
  // Row width.
  int64_t dim = 0;
  // Rows allocated at a time when the store grows. Must be >= 1.
  int64_t chunk_rows = 0;
};

// LazyAdam's hyper-parameters for one update; powers are beta^t of this step.
struct LazyAdamParams {
  float lr = 0.001f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
  float beta1_power = 0.9f;
  float beta2_power = 0.999f;
};

struct DynamicStoreStats {
  int64_t rows = 0;      // addresses in use (handed to IDs)
  int64_t capacity = 0;  // rows allocated (whole chunks)
  int64_t chunks = 0;
  int64_t slots = 0;

  // The one list of the statistics by name: fn(name, value) for each, in
  // this order (the pybind module's dynamic_store_stats dict is filled from it).
  template <typename Fn>
  void ForEachField(Fn&& fn) const {
    fn("rows", rows);
    fn("capacity", capacity);
    fn("chunks", chunks);
    fn("slots", slots);
  }
};

class DynamicStore {
 public:
  // `owner` is the host table whose key stage hands out the addresses: the
  // store never grows beyond the rows it has handed out.
  DynamicStore(DynamicStoreOptions options, std::weak_ptr<const HostTable> owner);

  const DynamicStoreOptions& options() const { return options_; }

  // Marks `addresses` as in use, growing every array by whole chunks as
  // needed, and appends to `fresh` the addresses that were not in use before
  // (first occurrence order): the caller writes their initial values. An
  // address the owner's key stage has not handed out (>= its next row) is
  // InvalidArgument and memory that cannot be had is ResourceExhausted; either
  // way nothing is grown or marked.
  Status EnsureRows(const int64_t* addresses, int64_t n, std::vector<int64_t>* fresh);

  // The index of the optimizer slot `slot_name`, added (every row at
  // `initial_value`) on first use. An existing slot with another initial
  // value is an error: two optimizers would share it.
  Status AddSlot(const std::string& slot_name, float initial_value, int* index);
  std::vector<std::string> SlotNames() const;

  // Reads rows [n, dim] of the embedding (slot < 0) or of slot `slot`.
  Status Read(const int64_t* addresses, int64_t n, int slot, float* out,
              const char* caller) const;
  // Writes rows of the embedding (slot < 0) or of a slot.
  Status Write(const int64_t* addresses, int64_t n, int slot, const float* values,
               const char* caller);

  // Updates by address. Gradients of a repeated address are summed first.
  // Every address is checked before anything is written, so a refused call
  // changes nothing.
  Status ApplySgd(const int64_t* addresses, int64_t n, const float* grads, float lr);
  Status ApplyAdagrad(const int64_t* addresses, int64_t n, const float* grads, float lr,
                      int accumulator_slot);
  Status ApplyLazyAdam(const int64_t* addresses, int64_t n, const float* grads,
                       const LazyAdamParams& params, int m_slot, int v_slot);

  DynamicStoreStats Stats() const;

 private:
  // Chunks come from AllocateLarge (huge pages: rows are read by random address).
  struct ChunkFree {
    void operator()(float* chunk) const { std::free(chunk); }
  };
  using Chunk = std::unique_ptr<float, ChunkFree>;
  struct Array {
    std::string name;
    float initial = 0.0f;
    std::vector<Chunk> chunks;
  };

  // Both need mu_ held.
  Status CheckAddresses(const int64_t* addresses, int64_t n, const char* caller) const;
  Status CheckSlot(int slot, const char* caller) const;
  int64_t chunk_bytes() const {
    return options_.chunk_rows * options_.dim * static_cast<int64_t>(sizeof(float));
  }
  // Appends `count` chunks filled with `initial` to *chunks. Throws
  // AllocationError, leaving *chunks with the chunks made so far.
  void AllocateChunks(int64_t count, float initial, std::vector<Chunk>* chunks) const;
  float* Row(const Array& array, int64_t address) const {
    return array.chunks[address / options_.chunk_rows].get() +
           (address % options_.chunk_rows) * options_.dim;
  }
  // Sums the gradients of repeated addresses: unique addresses in first
  // occurrence order and their summed gradient rows.
  void SumDuplicates(const int64_t* addresses, int64_t n, const float* grads,
                     std::vector<int64_t>* unique, std::vector<float>* summed) const;

  const DynamicStoreOptions options_;
  const std::weak_ptr<const HostTable> owner_;
  mutable std::shared_mutex mu_;
  Array embedding_;
  std::vector<Array> slots_;
  std::vector<uint8_t> in_use_;  // per allocated row
  int64_t rows_in_use_ = 0;
  int64_t capacity_ = 0;
};

// The dynamic stores of the process, by the same key as their host tables.
// A store belongs to the host table registered under its key when it was
// created: once that table is dropped (terminate_config_initializer) or
// replaced, the store is dropped too, at the latest on the next Create.
class DynamicStoreRegistry {
 public:
  static DynamicStoreRegistry& Global();

  // Creates the store of the host table `key`, or returns the existing one
  // when its options are the same (an Estimator rebuilds the graph).
  Status Create(const std::string& key, const DynamicStoreOptions& options,
                std::shared_ptr<DynamicStore>* store);
  Status Get(const std::string& key, std::shared_ptr<DynamicStore>* store) const;
  // Drops the stores whose key starts with `prefix`; returns how many.
  int DropPrefix(const std::string& prefix);

 private:
  struct Entry {
    std::weak_ptr<HostTable> owner;
    std::shared_ptr<DynamicStore> store;
  };
  void DropOrphansLocked();

  mutable std::mutex mu_;
  std::map<std::string, Entry> stores_;
};

}  // namespace mxrec

#endif  // MXREC_ENGINE_DYNAMIC_STORE_H_
