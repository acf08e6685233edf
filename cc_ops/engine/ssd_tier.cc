#include "ssd_tier.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <set>
#include <utility>
#include <vector>

namespace mxrec {

namespace {
// Address space reserved for the read mapping; a file that outgrows it is
// read with pread beyond.
constexpr size_t kMapReserve = size_t{16} << 30;
// A restride reads and writes blocks of about this size.
constexpr int64_t kCopyBlock = int64_t{8} << 20;

std::string Sanitize(const std::string& name) {
  std::string out;
  for (char c : name) out += (isalnum(static_cast<unsigned char>(c)) || c == '_') ? c : '_';
  return out;
}

// The most one write call gives the kernel. The page cache holds what a write
// brings in folios as large as the write (up to 2 MiB on ext4 since Linux
// 6.16), and a later write of one record into a large folio dirties all of it:
// measured on this project's machines, a 528-byte record freed and reused in a
// file written in 8 MiB calls made the disk write 26-270 KB, against 4.4 KB
// after 4 KiB calls and 14 KB after 16 KiB ones. 16 KiB keeps both that and
// the calls per spill (one per 31 records of 528 bytes) small.
constexpr int64_t kWritePiece = int64_t{16} << 10;

Status WriteAll(int fd, const char* data, int64_t length, int64_t offset, const std::string& path) {
  while (length > 0) {
    const int64_t piece = std::min(length, kWritePiece - offset % kWritePiece);
    const ssize_t done = pwrite(fd, data, static_cast<size_t>(piece), offset);
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

// The tier's files, in its private directory.
constexpr char kDataFile[] = "rows.dat";
constexpr char kRestrideFile[] = "rows.dat.restride";

// Whether `name` in the directory `dir_fd` is still the file open as `fd`, not
// one put in its place.
bool SameFile(int dir_fd, const char* name, int fd) {
  struct stat at;
  struct stat held;
  return fstatat(dir_fd, name, &at, AT_SYMLINK_NOFOLLOW) == 0 && fstat(fd, &held) == 0 &&
         at.st_dev == held.st_dev && at.st_ino == held.st_ino;
}

// A new directory under `dir` that only this user can enter, open as *dir_fd.
Status MakePrivateDirectory(const std::string& dir, const std::string& name, std::string* path,
                            int* dir_fd) {
  const std::string pattern =
      dir + "/mxrec-ssd-" + Sanitize(name) + "-" + std::to_string(getpid()) + "-XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (mkdtemp(buffer.data()) == nullptr) {
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", name,
                       "': cannot create the SSD tier's directory ", pattern,
                       " under ssd_data_path '", dir, "': ", std::strerror(errno));
  }
  *path = buffer.data();
  // What is opened must be the directory mkdtemp made (0700, this user's), not
  // one renamed into its place since.
  const int fd = open(path->c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  struct stat info;
  if (fd < 0 || fstat(fd, &info) != 0 || info.st_uid != geteuid() || (info.st_mode & 077) != 0) {
    const std::string why = fd < 0 ? std::strerror(errno) : "it is not the directory mxrec made";
    if (fd >= 0) close(fd);
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", name,
                       "': cannot open the SSD tier's directory ", *path,
                       " under ssd_data_path '", dir, "': ", why);
  }
  *dir_fd = fd;
  return Status::Ok();
}

// The tiers alive in this process, whose files go when it exits (a table is
// not dropped at exit, and its file may be as large as the table). Allocated
// once and never destroyed: the exit handler may run after static destructors.
struct LiveTiers {
  std::mutex mu;
  std::set<const SsdTier*> tiers;
  pid_t pid = 0;  // the process that registered them
};

LiveTiers& Live() {
  static LiveTiers* live = new LiveTiers;
  return *live;
}

void RemoveLiveTiersAtExit() {
  LiveTiers& live = Live();
  std::lock_guard<std::mutex> lock(live.mu);
  // A forked child that exits must leave its parent's files alone.
  if (getpid() != live.pid) return;
  for (const SsdTier* tier : live.tiers) tier->RemoveFiles();
}

void RegisterLive(const SsdTier* tier) {
  static std::once_flag registered;
  std::call_once(registered, [] { std::atexit(RemoveLiveTiersAtExit); });
  LiveTiers& live = Live();
  std::lock_guard<std::mutex> lock(live.mu);
  live.pid = getpid();
  live.tiers.insert(tier);
}

void UnregisterLive(const SsdTier* tier) {
  LiveTiers& live = Live();
  std::lock_guard<std::mutex> lock(live.mu);
  live.tiers.erase(tier);
}

}  // namespace

SsdReadAhead::~SsdReadAhead() {
  if (fd_ >= 0) close(fd_);
}

void SsdReadAhead::Reset(int fd, int64_t record_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ >= 0) close(fd_);
  fd_ = fd;
  record_bytes_ = record_bytes;
}

int64_t SsdReadAhead::Hint(std::vector<int64_t> records) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0 || records.empty() || record_bytes_ <= 0) return 0;
  std::sort(records.begin(), records.end());
  const int64_t page = std::max<int64_t>(4096, sysconf(_SC_PAGESIZE));
  int64_t runs = 0;
  int64_t first = -1;  // the current run of pages: [first, last]
  int64_t last = -1;
  for (size_t i = 0; i <= records.size(); ++i) {
    int64_t begin = 0;
    int64_t end = 0;
    if (i < records.size()) {
      if (records[i] < 0) continue;
      begin = records[i] * record_bytes_ / page;
      end = ((records[i] + 1) * record_bytes_ - 1) / page;
      if (first >= 0 && begin <= last + 1) {
        last = std::max(last, end);
        continue;
      }
    }
    if (first >= 0) {
      // Advice only: a failure (EOF, a file replaced meanwhile) costs nothing.
      posix_fadvise(fd_, first * page, (last - first + 1) * page, POSIX_FADV_WILLNEED);
      ++runs;
    }
    first = begin;
    last = end;
  }
  return runs;
}

Status SsdTier::Open(const std::string& dir, const std::string& name, const RowLayout& layout,
                     int64_t components, std::unique_ptr<SsdTier>* out) {
  struct stat info;
  if (stat(dir.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", name, "': ssd_data_path '",
                       dir, "' is not an existing directory");
  }
  std::string private_dir;
  int dir_fd = -1;
  MXREC_RETURN_IF_ERROR(MakePrivateDirectory(dir, name, &private_dir, &dir_fd));
  std::unique_ptr<SsdTier> tier(new SsdTier(private_dir, dir_fd, name, layout,
                                            layout.Bytes(std::max<int64_t>(components, 0))));
  tier->parent_ = dir;
  MXREC_RETURN_IF_ERROR(tier->CreateFile(kDataFile, &tier->fd_));
  tier->Map();
  tier->ResetReadAhead();
  RegisterLive(tier.get());
  *out = std::move(tier);
  return Status::Ok();
}

SsdTier::SsdTier(std::string dir, int dir_fd, std::string name, const RowLayout& layout,
                 int64_t stride)
    : dir_(std::move(dir)),
      dir_fd_(dir_fd),
      path_(dir_ + "/" + kDataFile),
      name_(std::move(name)),
      layout_(layout),
      stride_(stride),
      fd_(-1) {}

SsdTier::~SsdTier() {
  read_ahead_->Reset(-1, 0);  // a hint in flight keeps no descriptor of a dropped file
  UnregisterLive(this);
  Unmap();
  RemoveFiles();
  if (fd_ >= 0) close(fd_);
  close(dir_fd_);
}

void SsdTier::RemoveFiles() const {
  if (fd_ >= 0 && SameFile(dir_fd_, kDataFile, fd_)) unlinkat(dir_fd_, kDataFile, 0);
  // rmdir removes the directory only while it is empty: a file someone else
  // put there keeps it, and the file too.
  struct stat at;
  struct stat held;
  if (lstat(dir_.c_str(), &at) == 0 && fstat(dir_fd_, &held) == 0 && at.st_dev == held.st_dev &&
      at.st_ino == held.st_ino) {
    rmdir(dir_.c_str());
  }
}

Status SsdTier::CreateFile(const char* file, int* fd) const {
  *fd = openat(dir_fd_, file, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (*fd >= 0) return Status::Ok();
  const int error = errno;
  return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", name_,
                     "': cannot create the SSD tier file ", dir_, "/", file,
                     " (under ssd_data_path): ", std::strerror(error),
                     error == EEXIST || error == ELOOP
                         ? "; something mxrec did not create is at that name, and mxrec "
                           "leaves it alone"
                         : "");
}

void SsdTier::ResetReadAhead() {
  read_ahead_->Reset(fcntl(fd_, F_DUPFD_CLOEXEC, 0), record_bytes());
}

void SsdTier::Map() {
  void* map = mmap(nullptr, kMapReserve, PROT_READ, MAP_SHARED, fd_, 0);
  if (map == MAP_FAILED) return;  // pread it is
  // Records are read one at a time in the order a batch needs them: without
  // this, each page fault reads ahead up to hundreds of KiB around a record of
  // a few hundred bytes, and under a memory limit that evicts them again
  // (measured: a 2.7 GB file in a 5 GiB cgroup read 819 GB in 10 minutes).
  madvise(map, kMapReserve, MADV_RANDOM);
  map_ = static_cast<const char*>(map);
  map_bytes_ = kMapReserve;
}

void SsdTier::Unmap() {
  if (map_ != nullptr) munmap(const_cast<char*>(map_), map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
}

Status SsdTier::PutBatch(const std::vector<int64_t>& keys, const std::vector<int64_t>& numbers,
                         const std::vector<SsdRecord>& records) {
  if (keys.empty()) return Status::Ok();
  const int64_t dim = std::max<int64_t>(layout_.dim, 1);
  std::vector<uint32_t> present(keys.size());
  std::vector<int64_t> payload(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    present[i] = records[i].present;
    payload[i] = layout_.Bytes(static_cast<int64_t>(records[i].values.size()) / dim);
  }
  // Values from a checkpoint: rounded to the element types (exact when they
  // left a table of the same types).
  const auto fill = [&](size_t i, char* out) {
    const int64_t components = static_cast<int64_t>(records[i].values.size()) / dim;
    for (int c = 0; c < components; ++c) {
      EncodeRow(layout_.type(c), records[i].values.data() + c * layout_.dim, layout_.dim,
                out + layout_.Offset(c));
    }
  };
  Append append;
  MXREC_RETURN_IF_ERROR(BeginAppend(keys, numbers, present, payload, fill, &append));
  MXREC_RETURN_IF_ERROR(WriteAppend(append));
  FinishAppend(append, std::vector<uint8_t>(keys.size(), 1));
  return Status::Ok();
}

Status SsdTier::BeginAppend(const std::vector<int64_t>& keys,
                            const std::vector<int64_t>& numbers,
                            const std::vector<uint32_t>& present,
                            const std::vector<int64_t>& payload,
                            const std::function<void(size_t, char*)>& fill, Append* append) {
  int64_t widest = stride_;
  int64_t top = records_in_file_;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (numbers[i] < 0 || numbers[i] >= kMaxRecords) {
      return MXREC_ERROR(StatusCode::kInternal, "mxrec table '", name_, "': SSD record number ",
                         numbers[i], " is outside [0, ", kMaxRecords, ")");
    }
    widest = std::max(widest, payload[i]);
    top = std::max(top, numbers[i] + 1);
  }
  if (widest > stride_) MXREC_RETURN_IF_ERROR(Restride(widest));
  const int64_t bytes = record_bytes();
  MXREC_RETURN_IF_ERROR(CheckRoom((top - records_in_file_) * bytes, "grow the SSD tier file"));
  append->order.resize(keys.size());
  std::iota(append->order.begin(), append->order.end(), size_t{0});
  std::sort(append->order.begin(), append->order.end(),
            [&numbers](size_t a, size_t b) { return numbers[a] < numbers[b]; });
  append->numbers.resize(keys.size());
  append->bytes.assign(keys.size() * static_cast<size_t>(bytes), 0);
  char* p = append->bytes.data();
  append->runs = 0;
  append->pages = 0;
  int64_t last_page = -1;
  for (size_t j = 0; j < keys.size(); ++j) {
    const size_t i = append->order[j];
    append->numbers[j] = numbers[i];
    if (j == 0 || numbers[i] != append->numbers[j - 1] + 1) ++append->runs;
    const int64_t first = numbers[i] * bytes / kPageBytes;
    const int64_t last = ((numbers[i] + 1) * bytes - 1) / kPageBytes;
    append->pages += last - std::max(first, last_page + 1) + 1;
    last_page = last;
    std::memcpy(p, &keys[i], 8);
    std::memcpy(p + 8, &present[i], 4);
    fill(i, p + kHeaderBytes);
    p += bytes;
  }
  return Status::Ok();
}

Status SsdTier::CheckRoom(int64_t bytes, const char* what) const {
  if (bytes <= 0) return Status::Ok();
  struct statvfs fs;
  if (fstatvfs(fd_, &fs) != 0) return Status::Ok();  // no figure: the write itself will tell
  const int64_t free_bytes = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
  if (bytes <= free_bytes) return Status::Ok();
  return MXREC_ERROR(StatusCode::kResourceExhausted, "mxrec table '", name_, "': cannot ", what,
                     " ", path_, " by ", bytes, " bytes: the file system of ssd_data_path '",
                     parent_, "' has ", free_bytes, " bytes free (the file holds ",
                     file_bytes(), " bytes, ", live_count_ * record_bytes(),
                     " of them live rows). Free space there, or point ssd_data_path at a "
                     "larger disk.");
}

Status SsdTier::WriteAppend(const Append& append) const {
  const int64_t bytes = record_bytes();
  // Runs of consecutive record numbers go out with one write each.
  for (size_t j = 0; j < append.numbers.size();) {
    size_t end = j + 1;
    while (end < append.numbers.size() && append.numbers[end] == append.numbers[end - 1] + 1) {
      ++end;
    }
    MXREC_RETURN_IF_ERROR(WriteAll(fd_, append.bytes.data() + j * bytes,
                                   static_cast<int64_t>(end - j) * bytes,
                                   append.numbers[j] * bytes, path_));
    j = end;
  }
  return Status::Ok();
}

void SsdTier::FinishAppend(const Append& append, const std::vector<uint8_t>& keep) {
  if (!append.numbers.empty()) {
    records_in_file_ = std::max(records_in_file_, append.numbers.back() + 1);
    live_.resize(std::max(live_.size(), static_cast<size_t>((records_in_file_ + 63) >> 6)), 0);
  }
  for (size_t j = 0; j < append.numbers.size(); ++j) {
    if (!keep[append.order[j]]) continue;
    const int64_t r = append.numbers[j];
    if (Live(r)) continue;
    live_[static_cast<size_t>(r >> 6)] |= uint64_t{1} << (r & 63);
    ++live_count_;
  }
}

void SsdTier::Release(int64_t number) {
  if (!Live(number)) return;
  live_[static_cast<size_t>(number >> 6)] &= ~(uint64_t{1} << (number & 63));
  --live_count_;
}

Status SsdTier::ReadBytes(int64_t offset, int64_t length, char* out) const {
  if (map_ != nullptr && static_cast<size_t>(offset + length) <= map_bytes_) {
    std::memcpy(out, map_ + offset, static_cast<size_t>(length));  // pwrite is visible here
    return Status::Ok();
  }
  return ReadAll(fd_, out, length, offset, path_);
}

Status SsdTier::ReadHeader(int64_t number, int64_t* key, uint32_t* present) const {
  char header[kHeaderBytes];
  MXREC_RETURN_IF_ERROR(ReadBytes(number * record_bytes(), kHeaderBytes, header));
  std::memcpy(key, header, 8);
  std::memcpy(present, header + 8, 4);
  return Status::Ok();
}

Status SsdTier::Holds(int64_t number, int64_t key, bool* holds) const {
  *holds = false;
  if (!Live(number)) return Status::Ok();
  int64_t stored = 0;
  uint32_t present = 0;
  MXREC_RETURN_IF_ERROR(ReadHeader(number, &stored, &present));
  *holds = stored == key;
  return Status::Ok();
}

Status SsdTier::ReadComponent(int64_t number, int64_t key, int component, int64_t dim,
                              float* out, bool* found) const {
  *found = false;
  if (!Live(number)) return Status::Ok();
  int64_t stored = 0;
  uint32_t present = 0;
  MXREC_RETURN_IF_ERROR(ReadHeader(number, &stored, &present));
  const int64_t bytes = layout_.ComponentBytes(component);
  if (stored != key || !(present & (1u << component)) || dim != layout_.dim ||
      layout_.Offset(component) + bytes > stride_) {
    return Status::Ok();
  }
  // Read into `out` and widened there: no buffer of its own on the swap path.
  char* raw = reinterpret_cast<char*>(out);
  MXREC_RETURN_IF_ERROR(
      ReadBytes(number * record_bytes() + kHeaderBytes + layout_.Offset(component), bytes, raw));
  DecodeRow(layout_.type(component), raw, dim, out);
  *found = true;
  return Status::Ok();
}

Status SsdTier::Peek(int64_t number, int64_t key, bool* found, SsdRecord* record) const {
  *found = false;
  if (!Live(number)) return Status::Ok();
  int64_t stored = 0;
  MXREC_RETURN_IF_ERROR(ReadHeader(number, &stored, &record->present));
  if (stored != key) return Status::Ok();
  const int64_t components = layout_.ComponentsIn(stride_);
  record->values.resize(static_cast<size_t>(components * layout_.dim));
  *found = true;
  if (stride_ == 0) return Status::Ok();
  std::vector<char> raw(static_cast<size_t>(stride_));
  MXREC_RETURN_IF_ERROR(ReadBytes(number * record_bytes() + kHeaderBytes, stride_, raw.data()));
  for (int c = 0; c < components; ++c) {
    DecodeRow(layout_.type(c), raw.data() + layout_.Offset(c), layout_.dim,
              record->values.data() + c * layout_.dim);
  }
  return Status::Ok();
}

Status SsdTier::ForEach(const std::function<void(int64_t, const SsdRecord&)>& fn) const {
  SsdRecord record;
  for (int64_t r = 0; r < records_in_file_; ++r) {
    if (!Live(r)) continue;
    int64_t key = 0;
    MXREC_RETURN_IF_ERROR(ReadHeader(r, &key, &record.present));
    bool found = false;
    MXREC_RETURN_IF_ERROR(Peek(r, key, &found, &record));
    fn(key, record);
  }
  return Status::Ok();
}

Status SsdTier::Restride(int64_t stride) {
  // Records keep their numbers: record r moves from r * old bytes to r * new
  // bytes, its values padded with zeros (components keep their offsets: new
  // ones come last). The copy is written beside the file it replaces, in blocks.
  const int64_t old_bytes = record_bytes();
  const int64_t new_bytes = kHeaderBytes + stride;
  MXREC_RETURN_IF_ERROR(CheckRoom(records_in_file_ * new_bytes, "widen the records of"));
  int fd = -1;
  MXREC_RETURN_IF_ERROR(CreateFile(kRestrideFile, &fd));
  const std::string tmp = dir_ + "/" + kRestrideFile;
  const int64_t per_block = std::max<int64_t>(1, kCopyBlock / new_bytes);
  std::vector<char> in;
  std::vector<char> out;
  Status status;
  for (int64_t first = 0; first < records_in_file_ && status.ok(); first += per_block) {
    const int64_t n = std::min(per_block, records_in_file_ - first);
    in.resize(static_cast<size_t>(n * old_bytes));
    out.assign(static_cast<size_t>(n * new_bytes), 0);
    status = ReadAll(fd_, in.data(), n * old_bytes, first * old_bytes, path_);
    if (!status.ok()) break;
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(out.data() + r * new_bytes, in.data() + r * old_bytes,
                  static_cast<size_t>(old_bytes));
    }
    status = WriteAll(fd, out.data(), n * new_bytes, first * new_bytes, tmp);
  }
  if (status.ok() && renameat(dir_fd_, kRestrideFile, dir_fd_, kDataFile) != 0) {
    status = MXREC_ERROR(StatusCode::kInternal, "mxrec table '", name_,
                         "': replacing the SSD tier file ", path_, " with wider records failed: ",
                         std::strerror(errno));
  }
  if (!status.ok()) {
    if (SameFile(dir_fd_, kRestrideFile, fd)) unlinkat(dir_fd_, kRestrideFile, 0);
    close(fd);
    return status;
  }
  Unmap();
  close(fd_);
  fd_ = fd;
  Map();
  stride_ = stride;
  ++restrides_;
  ResetReadAhead();
  return Status::Ok();
}

}  // namespace mxrec
