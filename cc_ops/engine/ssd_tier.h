// The SSD tier: host-tier rows spilled to one append-only file that mxrec
// owns, with an in-memory index key -> (offset, length). A row read back or
// erased leaves a dead record; the file is compacted (live records copied to
// a new file that replaces it) once dead bytes outweigh live ones. The file is
// removed when the table is dropped. Plain C++ and POSIX I/O: records are
// appended in batches (one write per batch), read through a read-only shared
// mapping of the file (no system call per record; pread where the mapping
// cannot be made), and compaction streams the file in large blocks.
#ifndef MXREC_ENGINE_SSD_TIER_H_
#define MXREC_ENGINE_SSD_TIER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "status.h"

namespace mxrec {

// What the SSD tier stores of one ID: which components hold a value, and the
// values (dim floats per component).
struct SsdRecord {
  uint32_t present = 0;
  std::vector<float> values;
};

class SsdTier {
 public:
  // Creates a fresh data file for table `name` under directory `dir`.
  static Status Open(const std::string& dir, const std::string& name, int64_t capacity,
                     std::unique_ptr<SsdTier>* out);
  ~SsdTier();
  SsdTier(const SsdTier&) = delete;
  SsdTier& operator=(const SsdTier&) = delete;

  // Appends the record of `key` (replacing an older one). Fails when the tier
  // already holds `capacity` other IDs (ssd_vocabulary_size).
  Status Put(int64_t key, const SsdRecord& record);
  // Appends several records with one write; the capacity check covers them all
  // before anything is written.
  Status PutBatch(const std::vector<int64_t>& keys, const std::vector<SsdRecord>& records);
  // Reads the record of `key` into *record and forgets it; *found = false if absent.
  Status Take(int64_t key, bool* found, SsdRecord* record);
  // Reads without forgetting.
  Status Peek(int64_t key, bool* found, SsdRecord* record) const;
  void Erase(int64_t key);
  Status ForEach(const std::function<void(int64_t, const SsdRecord&)>& fn) const;

  int64_t size() const { return static_cast<int64_t>(index_.size()); }
  int64_t file_bytes() const { return end_; }
  int64_t compactions() const { return compactions_; }
  const std::string& path() const { return path_; }

 private:
  struct Location {
    int64_t offset = 0;
    int64_t length = 0;
  };

  SsdTier(std::string path, std::string name, int64_t capacity, int fd);
  Status ReadAt(const Location& loc, int64_t key, SsdRecord* record) const;
  Status MaybeCompact();
  // (Re)maps fd_ read-only over map_bytes_ of address space (the file grows
  // into it); on failure reads fall back to pread.
  void Map();
  void Unmap();

  std::string path_;
  std::string name_;
  int64_t capacity_;
  int fd_;
  int64_t end_ = 0;
  int64_t live_bytes_ = 0;
  int64_t compactions_ = 0;
  std::unordered_map<int64_t, Location> index_;
  const char* map_ = nullptr;
  size_t map_bytes_ = 0;
};

}  // namespace mxrec

#endif  // MXREC_ENGINE_SSD_TIER_H_
