// The SSD tier: host-tier rows spilled to one append-only file that mxrec
// owns, with an in-memory index key -> (offset, length). A row read back or
// erased leaves a dead record; the file is compacted (live records copied to
// a new file that replaces it) once dead bytes outweigh live ones.
//
// Files: each tier makes a private directory under ssd_data_path (mkdtemp:
// mode 0700, a fresh random name, "mxrec-ssd-<table>-<pid>-XXXXXX") and
// creates its files there relative to the directory's descriptor with
// O_EXCL | O_NOFOLLOW | O_CLOEXEC, so a symlink or file planted at a name is
// never followed, truncated or written. Dropping the table removes the data
// file only if it is still the one the tier created, and the directory only
// if nothing else was put in it. Plain C++ and POSIX I/O: records are
// appended in batches (one write per batch), read through a read-only shared
// mapping of the file (no system call per record; pread where the mapping
// cannot be made), and compaction streams the file in large blocks. The index
// is an open-addressing table (one cache miss per look-up, no allocation per
// record): a swap reads and erases thousands of records per step.
#ifndef MXREC_ENGINE_SSD_TIER_H_
#define MXREC_ENGINE_SSD_TIER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "status.h"

namespace mxrec {

// The SSD tier's index: key -> (offset, length) of its record in the file, 16
// bytes per entry. Offsets and lengths are multiples of 4 (a record is a
// 20-byte header and floats) and are kept in 4-byte units in one word: 40 bits
// of offset (files up to 4 TiB) and 24 of length (records up to 64 MiB).
// Linear probing with backward-shift deletion (as KeyMap), at most 4/5 full,
// growing by 1.5x, the home slot the hash multiplied onto [0, slots): the
// table is 53-80% full, so an entry costs 20-30 bytes of RAM (a power-of-two
// table at most 3/4 full with 24-byte entries cost 32-64). A word of 0 is an
// empty slot (every record has a header, so a stored length is never 0).
class SsdIndex {
 public:
  static constexpr int kLengthBits = 24;
  static constexpr int64_t kMaxLength = ((int64_t{1} << kLengthBits) - 1) * 4;
  static constexpr int64_t kMaxEnd = (int64_t{1} << (64 - kLengthBits)) * 4;
  struct Entry {
    int64_t key = 0;
    uint64_t where = 0;  // offset / 4 in the high 40 bits, length / 4 in the low 24
    int64_t offset() const { return static_cast<int64_t>(where >> kLengthBits) * 4; }
    int64_t length() const {
      return static_cast<int64_t>(where & ((uint64_t{1} << kLengthBits) - 1)) * 4;
    }
    // The record moved to `offset` (compaction), its length unchanged.
    void Move(int64_t offset) {
      where = (static_cast<uint64_t>(offset / 4) << kLengthBits) |
              (where & ((uint64_t{1} << kLengthBits) - 1));
    }
  };
  static_assert(sizeof(Entry) == 16, "an index entry is a key and a packed location");

  SsdIndex() { Rehash(kMinSlots); }
  int64_t size() const { return size_; }
  // Slots allocated; bytes() the index's memory.
  int64_t capacity() const { return static_cast<int64_t>(slots_.size()); }
  int64_t bytes() const { return capacity() * static_cast<int64_t>(sizeof(Entry)); }
  const Entry* Find(int64_t key) const;
  // Inserts or replaces key's location; returns the replaced record's length
  // (0 if the key was absent). offset and length: multiples of 4, length in
  // (0, kMaxLength], offset + length <= kMaxEnd (SsdTier checks both).
  int64_t Put(int64_t key, int64_t offset, int64_t length);
  // Removes key; returns its record's length (0 if absent).
  int64_t Erase(int64_t key);
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const Entry& e : slots_) {
      if (e.where != 0) fn(e);
    }
  }
  // Pointers to every entry; they hold until the next Put, Erase or Reserve.
  std::vector<Entry*> Entries() {
    std::vector<Entry*> out;
    out.reserve(static_cast<size_t>(size_));
    for (Entry& e : slots_) {
      if (e.where != 0) out.push_back(&e);
    }
    return out;
  }
  void Reserve(int64_t count);

 private:
  static constexpr uint64_t kMinSlots = 16;
  static constexpr int64_t kLoadNum = 4;
  static constexpr int64_t kLoadDen = 5;
  uint64_t Home(int64_t key) const;
  uint64_t Next(uint64_t i) const { return i + 1 == slots_.size() ? 0 : i + 1; }
  bool OverLoad(int64_t count) const {
    return count * kLoadDen > static_cast<int64_t>(slots_.size()) * kLoadNum;
  }
  void Rehash(size_t slots);
  std::vector<Entry> slots_;
  int64_t size_ = 0;
};

// What the SSD tier stores of one ID: which components hold a value, and the
// values (dim floats per component).
struct SsdRecord {
  uint32_t present = 0;
  std::vector<float> values;
};

class SsdTier {
 public:
  // Creates a private directory under `dir` (the table's ssd_data_path) and a
  // fresh data file in it for table `name`; an error names the path and the
  // setting when either cannot be made.
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
  // PutBatch without SsdRecords: record i holds present[i] and floats[i]
  // floats, which fill(i, out) writes at `out` (unaligned: copy, do not cast).
  Status PutBatchWith(const std::vector<int64_t>& keys, const std::vector<uint32_t>& present,
                      const std::vector<int64_t>& floats,
                      const std::function<void(size_t, char*)>& fill);

  // PutBatchWith in three steps, so that the write itself needs no lock (the
  // host tier's background spill writer): BeginAppend checks the capacity and
  // encodes the records at the end of the file into *append; WriteAppend
  // writes them (the file and the index are not changed: readers may read
  // other records meanwhile, but nothing else may append, compact or drop
  // the tier until FinishAppend); FinishAppend indexes record i where keep[i]
  // (the others are dead bytes at once) and may compact.
  struct Append {
    std::vector<int64_t> keys;
    std::vector<int64_t> lengths;
    std::vector<char> bytes;
    int64_t offset = 0;
  };
  Status BeginAppend(const std::vector<int64_t>& keys, const std::vector<uint32_t>& present,
                     const std::vector<int64_t>& floats,
                     const std::function<void(size_t, char*)>& fill, Append* append) const;
  Status WriteAppend(const Append& append) const;
  Status FinishAppend(const Append& append, const std::vector<uint8_t>& keep);
  // Copies the dim floats of `component` in key's record to `out`, leaving the
  // record in place; *found = false if the key has no record or the record no
  // value of that component. No allocation: the swap's read path.
  Status ReadComponent(int64_t key, int component, int64_t dim, float* out, bool* found) const;
  // Reads the record of `key` into *record and forgets it; *found = false if absent.
  Status Take(int64_t key, bool* found, SsdRecord* record);
  // Reads without forgetting.
  Status Peek(int64_t key, bool* found, SsdRecord* record) const;
  void Erase(int64_t key);
  Status ForEach(const std::function<void(int64_t, const SsdRecord&)>& fn) const;

  int64_t size() const { return static_cast<int64_t>(index_.size()); }
  int64_t file_bytes() const { return end_; }
  int64_t compactions() const { return compactions_; }
  // Removes the data file, if it is still the one this tier created, and the
  // private directory, if nothing else is in it (the destructor; and at the
  // process's exit, for every tier still alive, since tables are not dropped
  // then). Reads still work through the open file.
  void RemoveFiles() const;
  // The data file and its private directory.
  const std::string& path() const { return path_; }
  const std::string& directory() const { return dir_; }

 private:
  struct Location {
    int64_t offset = 0;
    int64_t length = 0;
  };

  // Owns dir_fd; the data file is created by Open (fd_ -1 until then).
  SsdTier(std::string dir, int dir_fd, std::string name, int64_t capacity);
  // A new file `file` of the private directory (O_EXCL: never one that exists).
  Status CreateFile(const char* file, int* fd) const;
  Status ReadAt(const Location& loc, int64_t key, SsdRecord* record) const;
  // The record's header at `loc` (its present mask and float count), checked
  // against `key`; reads through the mapping or, beyond it, with pread.
  Status ReadHeader(const Location& loc, int64_t key, uint32_t* present, int64_t* floats) const;
  // `length` bytes at `offset` of the file into `out`.
  Status ReadBytes(int64_t offset, int64_t length, char* out) const;
  Status MaybeCompact();
  // kResourceExhausted, naming the table, ssd_data_path and the bytes needed
  // and free, when the file system has less than `bytes` free (to `what`).
  Status CheckRoom(int64_t bytes, const char* what) const;
  // (Re)maps fd_ read-only over map_bytes_ of address space (the file grows
  // into it); on failure reads fall back to pread.
  void Map();
  void Unmap();

  std::string dir_;
  std::string parent_;  // ssd_data_path, for messages
  int dir_fd_;
  std::string path_;
  std::string name_;
  int64_t capacity_;
  int fd_;
  int64_t end_ = 0;
  int64_t live_bytes_ = 0;
  int64_t compactions_ = 0;
  SsdIndex index_;
  const char* map_ = nullptr;
  size_t map_bytes_ = 0;
};

}  // namespace mxrec

#endif  // MXREC_ENGINE_SSD_TIER_H_
