#include "ssd_tier.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

namespace mxrec {

namespace {
// Record layout: key, present mask, number of floats, floats.
constexpr int64_t kHeaderBytes = 8 + 4 + 8;
// Below this many dead bytes the file is never compacted.
constexpr int64_t kMinCompactBytes = int64_t{1} << 14;
// Address space reserved for the read mapping; a file that outgrows it is
// read with pread beyond.
constexpr size_t kMapReserve = size_t{16} << 30;
// Compaction reads and writes blocks of this size.
constexpr int64_t kCompactBlock = int64_t{8} << 20;

std::string Sanitize(const std::string& name) {
  std::string out;
  for (char c : name) out += (isalnum(static_cast<unsigned char>(c)) || c == '_') ? c : '_';
  return out;
}

Status WriteAll(int fd, const char* data, int64_t length, int64_t offset, const std::string& path) {
  while (length > 0) {
    const ssize_t done = pwrite(fd, data, static_cast<size_t>(length), offset);
    if (done < 0) {
      if (errno == EINTR) continue;
      return MXREC_ERROR(StatusCode::kInternal, "SSD tier: writing ", path, " failed: ",
                         std::strerror(errno));
    }
    data += done;
    length -= done;
    offset += done;
  }
  return Status::Ok();
}

Status ReadAll(int fd, char* data, int64_t length, int64_t offset, const std::string& path) {
  while (length > 0) {
    const ssize_t done = pread(fd, data, static_cast<size_t>(length), offset);
    if (done <= 0) {
      if (done < 0 && errno == EINTR) continue;
      return MXREC_ERROR(StatusCode::kInternal, "SSD tier: reading ", path, " failed: ",
                         done < 0 ? std::strerror(errno) : "unexpected end of file");
    }
    data += done;
    length -= done;
    offset += done;
  }
  return Status::Ok();
}

// Appends the encoded record to *buf; returns its length.
int64_t Encode(int64_t key, const SsdRecord& record, std::vector<char>* buf) {
  const int64_t floats = static_cast<int64_t>(record.values.size());
  const int64_t length = kHeaderBytes + floats * 4;
  const size_t at = buf->size();
  buf->resize(at + static_cast<size_t>(length));
  char* p = buf->data() + at;
  std::memcpy(p, &key, 8);
  std::memcpy(p + 8, &record.present, 4);
  std::memcpy(p + 12, &floats, 8);
  if (floats > 0) std::memcpy(p + kHeaderBytes, record.values.data(), floats * 4);
  return length;
}
}  // namespace

Status SsdTier::Open(const std::string& dir, const std::string& name, int64_t capacity,
                     std::unique_ptr<SsdTier>* out) {
  static std::atomic<uint64_t> counter{0};
  struct stat info;
  if (stat(dir.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", name, "': ssd_data_path '",
                       dir, "' is not an existing directory");
  }
  const std::string path = dir + "/mxrec-ssd-" + Sanitize(name) + "-" +
                           std::to_string(getpid()) + "-" + std::to_string(counter++) + ".dat";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", name,
                       "': cannot create the SSD tier file ", path, ": ", std::strerror(errno));
  }
  out->reset(new SsdTier(path, name, capacity, fd));
  return Status::Ok();
}

SsdTier::SsdTier(std::string path, std::string name, int64_t capacity, int fd)
    : path_(std::move(path)), name_(std::move(name)), capacity_(capacity), fd_(fd) {
  Map();
}

SsdTier::~SsdTier() {
  Unmap();
  close(fd_);
  unlink(path_.c_str());
}

void SsdTier::Map() {
  void* map = mmap(nullptr, kMapReserve, PROT_READ, MAP_SHARED, fd_, 0);
  if (map == MAP_FAILED) return;  // pread it is
  map_ = static_cast<const char*>(map);
  map_bytes_ = kMapReserve;
}

void SsdTier::Unmap() {
  if (map_ != nullptr) munmap(const_cast<char*>(map_), map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
}

Status SsdTier::Put(int64_t key, const SsdRecord& record) {
  return PutBatch({key}, {record});
}

Status SsdTier::PutBatch(const std::vector<int64_t>& keys, const std::vector<SsdRecord>& records) {
  if (keys.empty()) return Status::Ok();
  int64_t added = 0;
  for (int64_t key : keys) added += index_.count(key) ? 0 : 1;
  if (size() + added > capacity_) {
    return MXREC_ERROR(StatusCode::kResourceExhausted, "mxrec table '", name_,
                       "': the SSD tier is full: all ", capacity_,
                       " rows (ssd_vocabulary_size) are in use. Raise ssd_vocabulary_size or "
                       "host_vocabulary_size in create_table().");
  }
  std::vector<char> buf;
  std::vector<int64_t> lengths(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) lengths[i] = Encode(keys[i], records[i], &buf);
  MXREC_RETURN_IF_ERROR(WriteAll(fd_, buf.data(), static_cast<int64_t>(buf.size()), end_, path_));
  for (size_t i = 0; i < keys.size(); ++i) {
    auto [it, inserted] = index_.try_emplace(keys[i], Location{end_, lengths[i]});
    if (!inserted) {
      live_bytes_ -= it->second.length;
      it->second = {end_, lengths[i]};
    }
    end_ += lengths[i];
    live_bytes_ += lengths[i];
  }
  return MaybeCompact();
}

Status SsdTier::ReadAt(const Location& loc, int64_t key, SsdRecord* record) const {
  const char* data = nullptr;
  std::vector<char> buf;
  if (map_ != nullptr && static_cast<size_t>(loc.offset + loc.length) <= map_bytes_) {
    data = map_ + loc.offset;  // written with pwrite: the shared mapping sees it
  } else {
    buf.resize(loc.length);
    MXREC_RETURN_IF_ERROR(ReadAll(fd_, buf.data(), loc.length, loc.offset, path_));
    data = buf.data();
  }
  int64_t stored_key = 0;
  int64_t floats = 0;
  std::memcpy(&stored_key, data, 8);
  std::memcpy(&record->present, data + 8, 4);
  std::memcpy(&floats, data + 12, 8);
  if (stored_key != key || kHeaderBytes + floats * 4 != loc.length) {
    return MXREC_ERROR(StatusCode::kInternal, "mxrec table '", name_, "': the SSD tier file ",
                       path_, " is corrupted at offset ", loc.offset);
  }
  record->values.resize(floats);
  if (floats > 0) std::memcpy(record->values.data(), data + kHeaderBytes, floats * 4);
  return Status::Ok();
}

Status SsdTier::Take(int64_t key, bool* found, SsdRecord* record) {
  MXREC_RETURN_IF_ERROR(Peek(key, found, record));
  if (*found) Erase(key);
  return Status::Ok();
}

Status SsdTier::Peek(int64_t key, bool* found, SsdRecord* record) const {
  auto it = index_.find(key);
  *found = it != index_.end();
  if (!*found) return Status::Ok();
  return ReadAt(it->second, key, record);
}

void SsdTier::Erase(int64_t key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  live_bytes_ -= it->second.length;
  index_.erase(it);
}

Status SsdTier::ForEach(const std::function<void(int64_t, const SsdRecord&)>& fn) const {
  SsdRecord record;
  for (const auto& [key, loc] : index_) {
    MXREC_RETURN_IF_ERROR(ReadAt(loc, key, &record));
    fn(key, record);
  }
  return Status::Ok();
}

Status SsdTier::MaybeCompact() {
  const int64_t dead = end_ - live_bytes_;
  if (dead < kMinCompactBytes || dead < live_bytes_) return Status::Ok();
  const std::string tmp = path_ + ".compact";
  const int fd = open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return MXREC_ERROR(StatusCode::kInternal, "mxrec table '", name_,
                       "': cannot create the SSD compaction file ", tmp, ": ",
                       std::strerror(errno));
  }
  // Live records in file order, read through blocks of the old file and
  // written out in blocks.
  std::vector<std::pair<int64_t, int64_t>> live;  // (offset, key)
  live.reserve(index_.size());
  for (const auto& [key, loc] : index_) live.emplace_back(loc.offset, key);
  std::sort(live.begin(), live.end());
  std::unordered_map<int64_t, Location> moved;
  moved.reserve(index_.size());
  std::vector<char> in;
  std::vector<char> out;
  int64_t in_start = 0;
  int64_t in_end = 0;
  int64_t end = 0;       // bytes of the new file, written or buffered
  int64_t written = 0;   // bytes of the new file on disk
  Status status;
  for (const auto& [offset, key] : live) {
    const Location loc = index_[key];
    if (loc.offset < in_start || loc.offset + loc.length > in_end) {
      in_start = loc.offset;
      const int64_t want = std::min(std::max(kCompactBlock, loc.length), end_ - in_start);
      in.resize(static_cast<size_t>(want));
      status = ReadAll(fd_, in.data(), want, in_start, path_);
      if (!status.ok()) break;
      in_end = in_start + want;
    }
    out.insert(out.end(), in.begin() + (loc.offset - in_start),
               in.begin() + (loc.offset - in_start + loc.length));
    moved[key] = {end, loc.length};
    end += loc.length;
    if (static_cast<int64_t>(out.size()) >= kCompactBlock) {
      status = WriteAll(fd, out.data(), static_cast<int64_t>(out.size()), written, tmp);
      if (!status.ok()) break;
      written += static_cast<int64_t>(out.size());
      out.clear();
    }
  }
  if (status.ok() && !out.empty()) {
    status = WriteAll(fd, out.data(), static_cast<int64_t>(out.size()), written, tmp);
  }
  if (status.ok() && rename(tmp.c_str(), path_.c_str()) != 0) {
    status = MXREC_ERROR(StatusCode::kInternal, "mxrec table '", name_,
                         "': replacing the SSD tier file after compaction failed: ",
                         std::strerror(errno));
  }
  if (!status.ok()) {
    close(fd);
    unlink(tmp.c_str());
    return status;
  }
  Unmap();
  close(fd_);
  fd_ = fd;
  Map();
  index_ = std::move(moved);
  end_ = end;
  live_bytes_ = end;
  ++compactions_;
  return Status::Ok();
}

}  // namespace mxrec
