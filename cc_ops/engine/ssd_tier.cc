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
#include <set>
#include <utility>
#include <vector>

#include "key_map.h"  // HashKey

namespace mxrec {

uint64_t SsdIndex::Home(int64_t key) const {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(HashKey(key)) * slots_.size()) >> 64);
}

const SsdIndex::Entry* SsdIndex::Find(int64_t key) const {
  for (uint64_t i = Home(key);; i = Next(i)) {
    const Entry& e = slots_[i];
    if (e.where == 0) return nullptr;
    if (e.key == key) return &e;
  }
}

int64_t SsdIndex::Put(int64_t key, int64_t offset, int64_t length) {
  // Below the load limit, so a probe always meets an empty slot.
  if (OverLoad(size_ + 1)) Reserve(size_ + 1);
  const uint64_t where = (static_cast<uint64_t>(offset / 4) << kLengthBits) |
                         static_cast<uint64_t>(length / 4);
  for (uint64_t i = Home(key);; i = Next(i)) {
    Entry& e = slots_[i];
    if (e.where == 0) {
      e.key = key;
      e.where = where;
      ++size_;
      return 0;
    }
    if (e.key == key) {
      const int64_t old = e.length();
      e.where = where;
      return old;
    }
  }
}

int64_t SsdIndex::Erase(int64_t key) {
  uint64_t i = Home(key);
  for (;; i = Next(i)) {
    if (slots_[i].where == 0) return 0;
    if (slots_[i].key == key) break;
  }
  const int64_t length = slots_[i].length();
  // Backward shift: later entries of the probe run whose home lies at or
  // before the hole move into it, so no look-up stops early at the hole.
  for (uint64_t j = Next(i); slots_[j].where != 0; j = Next(j)) {
    const uint64_t home = Home(slots_[j].key);
    // Whether home lies cyclically in (i, j]: then the entry must stay.
    const bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
    if (!stays) {
      slots_[i] = slots_[j];
      i = j;
    }
  }
  slots_[i] = Entry{};
  --size_;
  return length;
}

void SsdIndex::Reserve(int64_t count) {
  uint64_t slots = slots_.size();
  while (count * kLoadDen > static_cast<int64_t>(slots) * kLoadNum) slots += slots / 2;
  if (slots != slots_.size()) Rehash(slots);
}

void SsdIndex::Rehash(size_t slots) {
  // The new array is filled before it replaces the old one (a failed
  // allocation leaves the index as it was); no Put, so no load check.
  std::vector<Entry> fresh(slots);
  for (const Entry& e : slots_) {
    if (e.where == 0) continue;
    uint64_t i = static_cast<uint64_t>((static_cast<unsigned __int128>(HashKey(e.key)) * slots) >> 64);
    while (fresh[i].where != 0) i = i + 1 == slots ? 0 : i + 1;
    fresh[i] = e;
  }
  slots_.swap(fresh);
}

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

// The tier's files, in its private directory.
constexpr char kDataFile[] = "rows.dat";
constexpr char kCompactFile[] = "rows.dat.compact";

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

Status SsdTier::Open(const std::string& dir, const std::string& name, int64_t capacity,
                     std::unique_ptr<SsdTier>* out) {
  struct stat info;
  if (stat(dir.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", name, "': ssd_data_path '",
                       dir, "' is not an existing directory");
  }
  std::string private_dir;
  int dir_fd = -1;
  MXREC_RETURN_IF_ERROR(MakePrivateDirectory(dir, name, &private_dir, &dir_fd));
  std::unique_ptr<SsdTier> tier(new SsdTier(private_dir, dir_fd, name, capacity));
  tier->parent_ = dir;
  MXREC_RETURN_IF_ERROR(tier->CreateFile(kDataFile, &tier->fd_));
  tier->Map();
  RegisterLive(tier.get());
  *out = std::move(tier);
  return Status::Ok();
}

SsdTier::SsdTier(std::string dir, int dir_fd, std::string name, int64_t capacity)
    : dir_(std::move(dir)),
      dir_fd_(dir_fd),
      path_(dir_ + "/" + kDataFile),
      name_(std::move(name)),
      capacity_(capacity),
      fd_(-1) {}

SsdTier::~SsdTier() {
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

Status SsdTier::Put(int64_t key, const SsdRecord& record) {
  return PutBatch({key}, {record});
}

Status SsdTier::PutBatch(const std::vector<int64_t>& keys, const std::vector<SsdRecord>& records) {
  std::vector<uint32_t> present(keys.size());
  std::vector<int64_t> floats(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    present[i] = records[i].present;
    floats[i] = static_cast<int64_t>(records[i].values.size());
  }
  return PutBatchWith(keys, present, floats, [&records](size_t i, char* out) {
    if (!records[i].values.empty()) {
      std::memcpy(out, records[i].values.data(), records[i].values.size() * sizeof(float));
    }
  });
}

Status SsdTier::PutBatchWith(const std::vector<int64_t>& keys,
                             const std::vector<uint32_t>& present,
                             const std::vector<int64_t>& floats,
                             const std::function<void(size_t, char*)>& fill) {
  if (keys.empty()) return Status::Ok();
  Append append;
  MXREC_RETURN_IF_ERROR(BeginAppend(keys, present, floats, fill, &append));
  MXREC_RETURN_IF_ERROR(WriteAppend(append));
  return FinishAppend(append, std::vector<uint8_t>(keys.size(), 1));
}

Status SsdTier::BeginAppend(const std::vector<int64_t>& keys,
                            const std::vector<uint32_t>& present,
                            const std::vector<int64_t>& floats,
                            const std::function<void(size_t, char*)>& fill,
                            Append* append) const {
  int64_t added = 0;
  for (int64_t key : keys) added += index_.Find(key) != nullptr ? 0 : 1;
  if (size() + added > capacity_) {
    return MXREC_ERROR(StatusCode::kResourceExhausted, "mxrec table '", name_,
                       "': the SSD tier is full: all ", capacity_,
                       " rows (ssd_vocabulary_size) are in use. Raise ssd_vocabulary_size or "
                       "host_vocabulary_size in create_table().");
  }
  // Encoded straight into one buffer: key, present mask, float count, floats.
  append->keys = keys;
  append->lengths.resize(keys.size());
  int64_t total = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    append->lengths[i] = kHeaderBytes + floats[i] * 4;
    if (append->lengths[i] > SsdIndex::kMaxLength) {
      return MXREC_ERROR(StatusCode::kInvalidArgument, "mxrec table '", name_, "': a row of ",
                         floats[i], " floats (dim times the optimizer's components) is over the "
                         "SSD tier's limit of ", (SsdIndex::kMaxLength - kHeaderBytes) / 4,
                         " floats per ID");
    }
    total += append->lengths[i];
  }
  if (end_ + total > SsdIndex::kMaxEnd) {
    return MXREC_ERROR(StatusCode::kResourceExhausted, "mxrec table '", name_,
                       "': the SSD tier file would pass its limit of ", SsdIndex::kMaxEnd,
                       " bytes (", end_, " used, ", total, " more needed)");
  }
  MXREC_RETURN_IF_ERROR(CheckRoom(total, "grow the SSD tier file"));
  append->bytes.resize(static_cast<size_t>(total));
  append->offset = end_;
  char* p = append->bytes.data();
  for (size_t i = 0; i < keys.size(); ++i) {
    std::memcpy(p, &keys[i], 8);
    std::memcpy(p + 8, &present[i], 4);
    std::memcpy(p + 12, &floats[i], 8);
    fill(i, p + kHeaderBytes);
    p += append->lengths[i];
  }
  return Status::Ok();
}

Status SsdTier::CheckRoom(int64_t bytes, const char* what) const {
  struct statvfs fs;
  if (fstatvfs(fd_, &fs) != 0) return Status::Ok();  // no figure: the write itself will tell
  const int64_t free_bytes = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
  if (bytes <= free_bytes) return Status::Ok();
  return MXREC_ERROR(StatusCode::kResourceExhausted, "mxrec table '", name_, "': cannot ", what,
                     " ", path_, " by ", bytes, " bytes: the file system of ssd_data_path '",
                     parent_, "' has ", free_bytes, " bytes free (the file holds ", end_,
                     " bytes, ", live_bytes_, " of them live rows). Free space there, or point "
                     "ssd_data_path at a larger disk.");
}

Status SsdTier::WriteAppend(const Append& append) const {
  return WriteAll(fd_, append.bytes.data(), static_cast<int64_t>(append.bytes.size()),
                  append.offset, path_);
}

Status SsdTier::FinishAppend(const Append& append, const std::vector<uint8_t>& keep) {
  int64_t added = 0;
  for (size_t i = 0; i < append.keys.size(); ++i) added += keep[i] ? 1 : 0;
  index_.Reserve(index_.size() + added);
  int64_t at = append.offset;
  for (size_t i = 0; i < append.keys.size(); ++i) {
    if (keep[i]) live_bytes_ += append.lengths[i] - index_.Put(append.keys[i], at, append.lengths[i]);
    at += append.lengths[i];
  }
  end_ = at;
  return MaybeCompact();
}

Status SsdTier::ReadBytes(int64_t offset, int64_t length, char* out) const {
  if (map_ != nullptr && static_cast<size_t>(offset + length) <= map_bytes_) {
    std::memcpy(out, map_ + offset, static_cast<size_t>(length));  // pwrite is visible here
    return Status::Ok();
  }
  return ReadAll(fd_, out, length, offset, path_);
}

Status SsdTier::ReadHeader(const Location& loc, int64_t key, uint32_t* present,
                           int64_t* floats) const {
  char header[kHeaderBytes];
  MXREC_RETURN_IF_ERROR(ReadBytes(loc.offset, kHeaderBytes, header));
  int64_t stored_key = 0;
  std::memcpy(&stored_key, header, 8);
  std::memcpy(present, header + 8, 4);
  std::memcpy(floats, header + 12, 8);
  if (stored_key != key || *floats < 0 || kHeaderBytes + *floats * 4 != loc.length) {
    return MXREC_ERROR(StatusCode::kInternal, "mxrec table '", name_, "': the SSD tier file ",
                       path_, " is corrupted at offset ", loc.offset);
  }
  return Status::Ok();
}

Status SsdTier::ReadComponent(int64_t key, int component, int64_t dim, float* out,
                              bool* found) const {
  *found = false;
  const SsdIndex::Entry* entry = index_.Find(key);
  if (entry == nullptr) return Status::Ok();
  const Location loc{entry->offset(), entry->length()};
  uint32_t present = 0;
  int64_t floats = 0;
  MXREC_RETURN_IF_ERROR(ReadHeader(loc, key, &present, &floats));
  if (!(present & (1u << component)) || floats < (component + 1) * dim) return Status::Ok();
  MXREC_RETURN_IF_ERROR(ReadBytes(loc.offset + kHeaderBytes + component * dim * 4, dim * 4,
                                  reinterpret_cast<char*>(out)));
  *found = true;
  return Status::Ok();
}

Status SsdTier::ReadAt(const Location& loc, int64_t key, SsdRecord* record) const {
  int64_t floats = 0;
  MXREC_RETURN_IF_ERROR(ReadHeader(loc, key, &record->present, &floats));
  record->values.resize(static_cast<size_t>(floats));
  if (floats == 0) return Status::Ok();
  return ReadBytes(loc.offset + kHeaderBytes, floats * 4,
                   reinterpret_cast<char*>(record->values.data()));
}

Status SsdTier::Take(int64_t key, bool* found, SsdRecord* record) {
  MXREC_RETURN_IF_ERROR(Peek(key, found, record));
  if (*found) Erase(key);
  return Status::Ok();
}

Status SsdTier::Peek(int64_t key, bool* found, SsdRecord* record) const {
  const SsdIndex::Entry* entry = index_.Find(key);
  *found = entry != nullptr;
  if (!*found) return Status::Ok();
  return ReadAt(Location{entry->offset(), entry->length()}, key, record);
}

void SsdTier::Erase(int64_t key) { live_bytes_ -= index_.Erase(key); }

Status SsdTier::ForEach(const std::function<void(int64_t, const SsdRecord&)>& fn) const {
  std::vector<SsdIndex::Entry> entries;
  entries.reserve(static_cast<size_t>(index_.size()));
  index_.ForEach([&entries](const SsdIndex::Entry& e) { entries.push_back(e); });
  SsdRecord record;
  for (const SsdIndex::Entry& e : entries) {
    MXREC_RETURN_IF_ERROR(ReadAt(Location{e.offset(), e.length()}, e.key, &record));
    fn(e.key, record);
  }
  return Status::Ok();
}

Status SsdTier::MaybeCompact() {
  const int64_t dead = end_ - live_bytes_;
  if (dead < kMinCompactBytes || dead < live_bytes_) return Status::Ok();
  const std::string tmp = dir_ + "/" + kCompactFile;
  // The compacted copy is written beside the file it replaces.
  MXREC_RETURN_IF_ERROR(CheckRoom(live_bytes_, "compact the SSD tier file"));
  int fd = -1;
  MXREC_RETURN_IF_ERROR(CreateFile(kCompactFile, &fd));
  // Live records in file order, read through blocks of the old file and
  // written out in blocks. The entries are moved in place once the new file
  // replaced the old one (8 bytes per live record meanwhile, no second index).
  std::vector<SsdIndex::Entry*> live = index_.Entries();
  std::sort(live.begin(), live.end(), [](const SsdIndex::Entry* a, const SsdIndex::Entry* b) {
    return a->offset() < b->offset();
  });
  std::vector<char> in;
  std::vector<char> out;
  int64_t in_start = 0;
  int64_t in_end = 0;
  int64_t end = 0;       // bytes of the new file, written or buffered
  int64_t written = 0;   // bytes of the new file on disk
  Status status;
  for (const SsdIndex::Entry* entry : live) {
    const Location loc{entry->offset(), entry->length()};
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
  if (status.ok() && renameat(dir_fd_, kCompactFile, dir_fd_, kDataFile) != 0) {
    status = MXREC_ERROR(StatusCode::kInternal, "mxrec table '", name_,
                         "': replacing the SSD tier file ", path_, " after compaction failed: ",
                         std::strerror(errno));
  }
  if (!status.ok()) {
    if (SameFile(dir_fd_, kCompactFile, fd)) unlinkat(dir_fd_, kCompactFile, 0);
    close(fd);
    return status;
  }
  Unmap();
  close(fd_);
  fd_ = fd;
  Map();
  int64_t at = 0;
  for (SsdIndex::Entry* entry : live) {
    const int64_t length = entry->length();
    entry->Move(at);
    at += length;
  }
  end_ = end;
  live_bytes_ = end;
  ++compactions_;
  return Status::Ok();
}

}  // namespace mxrec
