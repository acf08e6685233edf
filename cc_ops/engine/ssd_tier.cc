#include "ssd_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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

std::vector<char> Encode(int64_t key, const SsdRecord& record) {
  const int64_t floats = static_cast<int64_t>(record.values.size());
  std::vector<char> buf(kHeaderBytes + floats * 4);
  char* p = buf.data();
  std::memcpy(p, &key, 8);
  std::memcpy(p + 8, &record.present, 4);
  std::memcpy(p + 12, &floats, 8);
  if (floats > 0) std::memcpy(p + kHeaderBytes, record.values.data(), floats * 4);
  return buf;
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
    : path_(std::move(path)), name_(std::move(name)), capacity_(capacity), fd_(fd) {}

SsdTier::~SsdTier() {
  close(fd_);
  unlink(path_.c_str());
}

Status SsdTier::Put(int64_t key, const SsdRecord& record) {
  auto it = index_.find(key);
  if (it == index_.end() && size() >= capacity_) {
    return MXREC_ERROR(StatusCode::kResourceExhausted, "mxrec table '", name_,
                       "': the SSD tier is full: all ", capacity_,
                       " rows (ssd_vocabulary_size) are in use. Raise ssd_vocabulary_size or "
                       "host_vocabulary_size in create_table().");
  }
  const std::vector<char> buf = Encode(key, record);
  MXREC_RETURN_IF_ERROR(WriteAll(fd_, buf.data(), static_cast<int64_t>(buf.size()), end_, path_));
  if (it != index_.end()) {
    live_bytes_ -= it->second.length;
    it->second = {end_, static_cast<int64_t>(buf.size())};
  } else {
    index_[key] = {end_, static_cast<int64_t>(buf.size())};
  }
  end_ += static_cast<int64_t>(buf.size());
  live_bytes_ += static_cast<int64_t>(buf.size());
  return MaybeCompact();
}

Status SsdTier::ReadAt(const Location& loc, int64_t key, SsdRecord* record) const {
  std::vector<char> buf(loc.length);
  MXREC_RETURN_IF_ERROR(ReadAll(fd_, buf.data(), loc.length, loc.offset, path_));
  int64_t stored_key = 0;
  int64_t floats = 0;
  std::memcpy(&stored_key, buf.data(), 8);
  std::memcpy(&record->present, buf.data() + 8, 4);
  std::memcpy(&floats, buf.data() + 12, 8);
  if (stored_key != key || kHeaderBytes + floats * 4 != loc.length) {
    return MXREC_ERROR(StatusCode::kInternal, "mxrec table '", name_, "': the SSD tier file ",
                       path_, " is corrupted at offset ", loc.offset);
  }
  record->values.resize(floats);
  if (floats > 0) std::memcpy(record->values.data(), buf.data() + kHeaderBytes, floats * 4);
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
  std::unordered_map<int64_t, Location> moved;
  int64_t end = 0;
  std::vector<char> buf;
  for (const auto& [key, loc] : index_) {
    buf.resize(loc.length);
    Status status = ReadAll(fd_, buf.data(), loc.length, loc.offset, path_);
    if (status.ok()) status = WriteAll(fd, buf.data(), loc.length, end, tmp);
    if (!status.ok()) {
      close(fd);
      unlink(tmp.c_str());
      return status;
    }
    moved[key] = {end, loc.length};
    end += loc.length;
  }
  if (rename(tmp.c_str(), path_.c_str()) != 0) {
    close(fd);
    unlink(tmp.c_str());
    return MXREC_ERROR(StatusCode::kInternal, "mxrec table '", name_,
                       "': replacing the SSD tier file after compaction failed: ",
                       std::strerror(errno));
  }
  close(fd_);
  fd_ = fd;
  index_ = std::move(moved);
  end_ = end;
  live_bytes_ = end;
  ++compactions_;
  return Status::Ok();
}

}  // namespace mxrec
