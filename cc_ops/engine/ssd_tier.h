// The SSD tier: host-tier rows spilled to one file of fixed-size records that
// mxrec owns. The record numbers are given out by the device-cache planner
// (under the table's mutex) and kept in each ID's TierRecord, so the tier
// keeps no index by key: record r is at r * record_bytes() in the file, and
// a record freed (its ID read back or evicted) is reused by a later spill
// (SsdRecordAllocator: the file holds at most 4/3 of its peak of records in
// use), so it is never compacted. In RAM the tier keeps one bit per record (whether it holds a
// live row), for its row count, for checks and for iterating the rows.
//
// A record is a 16-byte header (the key, the mask of components present, 4
// bytes of zero) and stride bytes: every component the table had when the
// record was written, dim values each in the component's element type
// (RowLayout: the embedding in storage_dtype, the slots in slot_dtype; zeros
// where the mask's bit is clear). A component registered after the file was
// made (an optimizer slot that first swaps after the first spill) widens the
// stride: the file is copied once into a new one with the wider records
// (Restride).
//
// Files: each tier makes a private directory under ssd_data_path (mkdtemp:
// mode 0700, a fresh random name, "mxrec-ssd-<table>-<pid>-XXXXXX") and
// creates its files there relative to the directory's descriptor with
// O_EXCL | O_NOFOLLOW | O_CLOEXEC, so a symlink or file planted at a name is
// never followed, truncated or written. Dropping the table removes the data
// file only if it is still the one the tier created, and the directory only
// if nothing else was put in it. Plain C++ and POSIX I/O: a batch's records
// are written sorted by record number, each run of consecutive records in
// calls of at most 16 KiB (see kWritePiece), and read through a read-only shared mapping of the file (no
// system call per record; pread where the mapping cannot be made).
#ifndef MXREC_ENGINE_SSD_TIER_H_
#define MXREC_ENGINE_SSD_TIER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "row_format.h"
#include "status.h"

namespace mxrec {

// What the SSD tier stores of one ID: which components hold a value, and the
// values as floats (dim per component, up to the highest present one; the
// file holds them in the layout's element types).
struct SsdRecord {
  uint32_t present = 0;
  std::vector<float> values;
};

// Read-ahead of the records a planned step will touch: the records its swaps
// read back and those its spills rewrite in part (a write into a page that is
// not in memory reads the page first). Hint() asks the kernel for their pages
// (posix_fadvise WILLNEED, sorted, one call per run of pages), which queues
// all those reads at once, so the step's own reads find the pages in memory
// instead of waiting on one page fault after another. It holds its own
// descriptor of the tier's file (Reset when the file is replaced), so a hint
// that races with the tier's drop or restride costs at most a useless read.
class SsdReadAhead {
 public:
  SsdReadAhead() = default;
  ~SsdReadAhead();
  SsdReadAhead(const SsdReadAhead&) = delete;
  SsdReadAhead& operator=(const SsdReadAhead&) = delete;

  // Hints the pages of `records` (sorted here); returns the page runs hinted.
  int64_t Hint(std::vector<int64_t> records) const;
  // The file (a descriptor this object now owns, or -1) and its record size.
  void Reset(int fd, int64_t record_bytes);

 private:
  mutable std::mutex mu_;
  int fd_ = -1;
  int64_t record_bytes_ = 0;
};

class SsdTier {
 public:
  // Record numbers are kept in an int32 (TierRecord::host_slot) as -2 - record
  // and INT32_MIN is reserved: records 0 .. kMaxRecords - 1.
  static constexpr int64_t kMaxRecords = int64_t{INT32_MAX} - 2;
  static constexpr int64_t kHeaderBytes = 16;

  // Creates a private directory under `dir` (the table's ssd_data_path) and a
  // fresh data file in it for table `name`, of records of `components`
  // components laid out as `layout`; an error names the path and the setting
  // when either cannot be made.
  static Status Open(const std::string& dir, const std::string& name, const RowLayout& layout,
                     int64_t components, std::unique_ptr<SsdTier>* out);
  ~SsdTier();
  SsdTier(const SsdTier&) = delete;
  SsdTier& operator=(const SsdTier&) = delete;

  // Writes records[i] (of key keys[i]) at record numbers numbers[i] (distinct)
  // with as few writes as their order allows, and marks them live.
  Status PutBatch(const std::vector<int64_t>& keys, const std::vector<int64_t>& numbers,
                  const std::vector<SsdRecord>& records);

  // A batch's write in three steps, so that the write itself needs no lock
  // (the host tier's background spill writer): BeginAppend checks the room on
  // disk, widens the records if some need it, and encodes the records into
  // *append, sorted by record number; fill(i, out) writes payload[i] bytes of
  // record i at `out` (its components in the layout's element types; unaligned:
  // copy, do not cast). WriteAppend writes them
  // (readers may read other records meanwhile, but nothing else may write or
  // drop the tier until FinishAppend); FinishAppend marks record i live where
  // keep[i] (i in the order of `keys`).
  struct Append {
    std::vector<int64_t> numbers;  // sorted
    std::vector<size_t> order;     // numbers[j] is the record of keys[order[j]]
    std::vector<char> bytes;       // record_bytes() per record, in `numbers` order
    int64_t runs = 0;   // runs of consecutive records: the writes WriteAppend makes
    int64_t pages = 0;  // distinct pages of kPageBytes the writes touch
  };
  // The unit of the page cache (and of what the disk writes back) that the
  // write statistics count.
  static constexpr int64_t kPageBytes = 4096;
  Status BeginAppend(const std::vector<int64_t>& keys, const std::vector<int64_t>& numbers,
                     const std::vector<uint32_t>& present, const std::vector<int64_t>& payload,
                     const std::function<void(size_t, char*)>& fill, Append* append);
  Status WriteAppend(const Append& append) const;
  void FinishAppend(const Append& append, const std::vector<uint8_t>& keep);

  // Whether record `number` is live and holds `key`.
  Status Holds(int64_t number, int64_t key, bool* holds) const;
  // Copies the dim values of `component` in record `number` to `out` as floats; *found
  // = false if the record is not live, holds another key, or no value of that
  // component. No allocation: the swap's read path.
  Status ReadComponent(int64_t number, int64_t key, int component, int64_t dim, float* out,
                       bool* found) const;
  // The whole record `number` of `key` (*found as ReadComponent's).
  Status Peek(int64_t number, int64_t key, bool* found, SsdRecord* record) const;
  // Record `number` no longer holds a row (its bytes stay until reused).
  void Release(int64_t number);
  // Every live record, in record order: fn(key, record).
  Status ForEach(const std::function<void(int64_t, const SsdRecord&)>& fn) const;

  // Live records.
  int64_t size() const { return live_count_; }
  int64_t file_bytes() const { return records_in_file_ * record_bytes(); }
  int64_t record_bytes() const { return kHeaderBytes + stride_; }
  // Bytes of values per record, and how many times the file was widened.
  const RowLayout& layout() const { return layout_; }
  int64_t stride() const { return stride_; }
  int64_t restrides() const { return restrides_; }
  // Host memory the tier holds per record: its live bits.
  int64_t ram_bytes() const { return static_cast<int64_t>(live_.capacity() * sizeof(uint64_t)); }
  // Removes the data file, if it is still the one this tier created, and the
  // private directory, if nothing else is in it (the destructor; and at the
  // process's exit, for every tier still alive, since tables are not dropped
  // then). Reads still work through the open file.
  void RemoveFiles() const;
  // The read-ahead of this tier's file (shared: see SsdReadAhead).
  std::shared_ptr<SsdReadAhead> read_ahead() const { return read_ahead_; }
  // The data file and its private directory.
  const std::string& path() const { return path_; }
  const std::string& directory() const { return dir_; }

 private:
  // Owns dir_fd; the data file is created by Open (fd_ -1 until then).
  SsdTier(std::string dir, int dir_fd, std::string name, const RowLayout& layout,
          int64_t stride);
  // A new file `file` of the private directory (O_EXCL: never one that exists).
  Status CreateFile(const char* file, int* fd) const;
  // `length` bytes at `offset` of the file into `out`, through the mapping or,
  // beyond it, with pread.
  Status ReadBytes(int64_t offset, int64_t length, char* out) const;
  // The header of record `number`: its key and present mask.
  Status ReadHeader(int64_t number, int64_t* key, uint32_t* present) const;
  bool Live(int64_t number) const {
    return number >= 0 && static_cast<size_t>(number >> 6) < live_.size() &&
           ((live_[static_cast<size_t>(number >> 6)] >> (number & 63)) & 1u) != 0;
  }
  // Copies the file into one of records of `stride` bytes of values.
  Status Restride(int64_t stride);
  // kResourceExhausted, naming the table, ssd_data_path and the bytes needed
  // and free, when the file system has less than `bytes` free (to `what`).
  Status CheckRoom(int64_t bytes, const char* what) const;
  // Points the read-ahead at fd_ (a duplicate of it).
  void ResetReadAhead();
  // (Re)maps fd_ read-only over map_bytes_ of address space (the file grows
  // into it); on failure reads fall back to pread.
  void Map();
  void Unmap();

  std::string dir_;
  std::string parent_;  // ssd_data_path, for messages
  int dir_fd_;
  std::string path_;
  std::string name_;
  RowLayout layout_;
  int64_t stride_;
  int fd_;
  int64_t records_in_file_ = 0;  // records the file has room for (written up to)
  std::vector<uint64_t> live_;   // bit r: record r holds a row
  int64_t live_count_ = 0;
  int64_t restrides_ = 0;
  const char* map_ = nullptr;
  size_t map_bytes_ = 0;
  std::shared_ptr<SsdReadAhead> read_ahead_ = std::make_shared<SsdReadAhead>();
};

}  // namespace mxrec

#endif  // MXREC_ENGINE_SSD_TIER_H_
