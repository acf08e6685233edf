// The SSD tier's files (run by tests/test_ssd_tier_files.py with a scratch
// directory standing for ssd_data_path): a private directory of mode 0700 per
// tier, a data file of mode 0600 opened close-on-exec; a symlink or file
// planted at the name of the copy that widens the records (a component
// registered after the first spill) is neither followed nor truncated nor
// removed, and the error names the path and the setting; dropping the tier
// removes only what it created; a directory that cannot be made is an error
// naming ssd_data_path.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "engine/ssd_tier.h"
#include "expect.h"

namespace {

using mxrec::SsdRecord;
using mxrec::SsdTier;
using mxrec::Status;

std::set<std::string> Entries(const std::string& dir) {
  std::set<std::string> out;
  DIR* d = opendir(dir.c_str());
  EXPECT(d != nullptr);
  for (dirent* e = readdir(d); e != nullptr; e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") out.insert(name);
  }
  closedir(d);
  return out;
}

mode_t Mode(const std::string& path) {
  struct stat info;
  EXPECT(lstat(path.c_str(), &info) == 0);
  return info.st_mode;
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Whether this process holds `path` open with FD_CLOEXEC on every descriptor.
bool OpenCloseOnExec(const std::string& path) {
  bool found = false;
  DIR* d = opendir("/proc/self/fd");
  EXPECT(d != nullptr);
  for (dirent* e = readdir(d); e != nullptr; e = readdir(d)) {
    char target[4096];
    const std::string link = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
    if (n <= 0) continue;
    target[n] = '\0';
    if (path != target) continue;
    found = true;
    const int flags = fcntl(std::stoi(e->d_name), F_GETFD);
    if (flags < 0 || !(flags & FD_CLOEXEC)) return false;
  }
  closedir(d);
  return found;
}

// Writes records 0..99 (keys 0..99) of `floats` floats: wider than the
// tier's records, they make it copy its file into one of wider records.
Status Fill(SsdTier* tier, int64_t floats) {
  SsdRecord record;
  record.present = 1;
  record.values.assign(static_cast<size_t>(floats), 1.5f);
  std::vector<int64_t> keys;
  std::vector<SsdRecord> records;
  for (int64_t k = 0; k < 100; ++k) {
    keys.push_back(k);
    records.push_back(record);
  }
  return tier->PutBatch(keys, keys, records);
}

void TestPrivateDirectoryAndCleanUp(const std::string& scratch) {
  std::unique_ptr<SsdTier> tier;
  EXPECT(SsdTier::Open(scratch, "user/items", mxrec::RowLayout{64}, 1, &tier).ok());
  const std::string dir = tier->directory();
  const std::set<std::string> entries = Entries(scratch);
  EXPECT(entries.size() == 1);
  const std::string made = *entries.begin();
  EXPECT(dir == scratch + "/" + made);
  const std::string prefix = "mxrec-ssd-user_items-" + std::to_string(getpid()) + "-";
  EXPECT(made.rfind(prefix, 0) == 0 && made.size() == prefix.size() + 6);
  EXPECT(S_ISDIR(Mode(dir)) && (Mode(dir) & 0777) == 0700);
  EXPECT(tier->path() == dir + "/rows.dat");
  EXPECT(Entries(dir) == std::set<std::string>{"rows.dat"});
  EXPECT(S_ISREG(Mode(tier->path())) && (Mode(tier->path()) & 0777) == 0600);
  EXPECT(OpenCloseOnExec(tier->path()));
  EXPECT(OpenCloseOnExec(dir));
  // A second tier of the same table (a restore builds one beside the old) gets its own.
  std::unique_ptr<SsdTier> second;
  EXPECT(SsdTier::Open(scratch, "user/items", mxrec::RowLayout{64}, 1, &second).ok());
  EXPECT(second->directory() != dir && Entries(scratch).size() == 2);
  EXPECT(Fill(tier.get(), 64).ok() && Fill(tier.get(), 128).ok() && tier->restrides() == 1);
  EXPECT(Entries(dir) == std::set<std::string>{"rows.dat"});
  tier.reset();
  second.reset();
  EXPECT(Entries(scratch).empty());
}

void TestPlantedRestrideFileIsLeftAlone(const std::string& scratch) {
  const std::string victim = scratch + "/victim.txt";
  Write(victim, "not mxrec's");
  std::unique_ptr<SsdTier> tier;
  EXPECT(SsdTier::Open(scratch, "t", mxrec::RowLayout{64}, 1, &tier).ok());
  const std::string dir = tier->directory();
  const std::string planted = dir + "/rows.dat.restride";
  EXPECT(Fill(tier.get(), 64).ok());
  EXPECT(symlink(victim.c_str(), planted.c_str()) == 0);
  const Status refused = Fill(tier.get(), 128);
  EXPECT(!refused.ok() && tier->restrides() == 0);
  const std::string message = refused.message();
  EXPECT(Contains(message, planted) && Contains(message, "ssd_data_path") &&
         Contains(message, "mxrec did not create"));
  EXPECT(Read(victim) == "not mxrec's");
  EXPECT(S_ISLNK(Mode(planted)));
  // The records stay readable; with the link gone, widening works again.
  bool found = false;
  SsdRecord record;
  EXPECT(tier->Peek(42, 42, &found, &record).ok() && found && record.values.size() == 64);
  EXPECT(unlink(planted.c_str()) == 0);
  EXPECT(Fill(tier.get(), 128).ok() && tier->restrides() == 1);
  EXPECT(tier->Peek(42, 42, &found, &record).ok() && found && record.values.size() == 128);
  // A plain file planted there is not truncated either.
  Write(planted, "someone's data");
  EXPECT(!Fill(tier.get(), 192).ok());
  EXPECT(Read(planted) == "someone's data");
  EXPECT(unlink(planted.c_str()) == 0);
  tier.reset();
  EXPECT(Entries(scratch) == std::set<std::string>{"victim.txt"});
  EXPECT(unlink(victim.c_str()) == 0);
}

void TestDroppingRemovesOnlyWhatItCreated(const std::string& scratch) {
  // Another file in the private directory: the data file goes, the rest stays.
  std::unique_ptr<SsdTier> tier;
  EXPECT(SsdTier::Open(scratch, "t", mxrec::RowLayout{64}, 1, &tier).ok());
  const std::string dir = tier->directory();
  Write(dir + "/notes.txt", "kept");
  tier.reset();
  EXPECT(Entries(dir) == std::set<std::string>{"notes.txt"});
  EXPECT(Read(dir + "/notes.txt") == "kept");
  EXPECT(unlink((dir + "/notes.txt").c_str()) == 0 && rmdir(dir.c_str()) == 0);
  // A file renamed over the data file is not the tier's: it stays.
  EXPECT(SsdTier::Open(scratch, "t", mxrec::RowLayout{64}, 1, &tier).ok());
  const std::string other = scratch + "/other.dat";
  Write(other, "replacement");
  EXPECT(rename(other.c_str(), tier->path().c_str()) == 0);
  const std::string path = tier->path();
  const std::string second_dir = tier->directory();
  tier.reset();
  EXPECT(Read(path) == "replacement");
  EXPECT(unlink(path.c_str()) == 0 && rmdir(second_dir.c_str()) == 0);
  EXPECT(Entries(scratch).empty());
}

void TestDirectoryErrorsNameTheSetting(const std::string& scratch) {
  std::unique_ptr<SsdTier> tier;
  // A name too long for the file system: the directory cannot be made.
  const Status long_name = SsdTier::Open(scratch, std::string(300, 'x'), mxrec::RowLayout{10}, 1, &tier);
  EXPECT(!long_name.ok() && tier == nullptr);
  EXPECT(Contains(long_name.message(), "ssd_data_path '" + scratch + "'") &&
         Contains(long_name.message(), "cannot create the SSD tier's directory"));
  const Status missing = SsdTier::Open(scratch + "/no/such", "t", mxrec::RowLayout{10}, 1, &tier);
  const std::string expected = "ssd_data_path '" + scratch + "/no/such' is not an existing";
  EXPECT(!missing.ok() && Contains(missing.message(), expected));
  EXPECT(Entries(scratch).empty());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s SCRATCH_DIR\n", argv[0]);
    return 2;
  }
  const std::string scratch = argv[1];
  TestPrivateDirectoryAndCleanUp(scratch);
  std::printf("private directory: ok\n");
  TestPlantedRestrideFileIsLeftAlone(scratch);
  std::printf("planted restride file: ok\n");
  TestDroppingRemovesOnlyWhatItCreated(scratch);
  std::printf("drop removes only its own: ok\n");
  TestDirectoryErrorsNameTheSetting(scratch);
  std::printf("directory errors: ok\n");
  return 0;
}
