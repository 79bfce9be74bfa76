// Files: reading whole files with clear errors, atomic writes, and read-only memory maps.
//
// Invariant: spanformer never leaves a half-written output file. Every writer goes through
// AtomicFile (write to "<path>.tmp.<pid>", fsync, rename over <path>).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace spanformer {

// Reads a whole file; throws Error naming the file when it is missing or unreadable.
std::string read_file(const std::string& path);

// Writes `content` to `path` atomically.
void write_file_atomic(const std::string& path, const std::string& content);

// Calls `write(tmp_path)` and then renames tmp_path over `path`; on any exception the temporary file
// is removed and the exception propagates, leaving `path` untouched. A symbolic link is written
// through; a path that exists and is not a regular file (a device, a directory) is refused.
void write_atomic_with(const std::string& path, const std::function<void(const std::string& tmp_path)>& write);

bool file_exists(const std::string& path);
// Refuses a path that is not a regular file in one line naming what it is: "X is a directory, not a
// file" (with `hint` after it when given) or "file not found: X".
void require_file(const std::string& path, const std::string& hint = "");
// What the first bytes of an existing file say it is, for refusals; file_kind_text names it in a
// message: "a checkpoint (zip)", "a JSON file (a config or a log)", "" when nothing is recognised.
enum class FileKind { kUnknown, kZip, kJson };
FileKind sniff_file_kind(const std::string& path);
const char* file_kind_text(FileKind kind);

// Throws Error "PATH exists and is not a regular file (what): ..." when something other than a regular
// file (a directory, a device, a pipe) is at `path`; an absent path or a regular file passes. `what`
// names what the path is for, e.g. "the run's checkpoint".
void check_regular_or_absent(const std::string& path, const std::string& what);

// Throws Error "cannot open PATH: <reason>" unless `path` can be opened for reading (permission, a
// directory): so that a reader whose own errors cannot tell why (an archive loader) names the real cause.
void check_readable(const std::string& path);

// Bytes as lower-case hex digits, and back (one-line error naming `origin` on a bad digit or odd length).
std::string hex_encode(const std::string& bytes);
std::string hex_decode(const std::string& hex, const std::string& origin);

// SHA-256 (OpenSSL), fed piece by piece; hex() finishes it.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void add(const void* data, size_t size);
  void add(const std::string& s) { add(s.data(), s.size() + 1); }  // with its terminator: "ab","c" != "a","bc"
  std::string hex();

 private:
  void* ctx_;
};

// Removes "<name>.tmp.<pid>" files in `dir` left by writers that were killed (their process is gone).
void remove_stale_temporaries(const std::string& dir);

// An exclusive lock on a directory (flock on DIR/.lock) for as long as the object lives: a second
// writer fails at once with a one-line error instead of interleaving with the first.
class DirectoryLock {
 public:
  DirectoryLock(const std::string& dir, const std::string& what);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

 private:
  int fd_ = -1;
};
void make_dirs(const std::string& path);

// The zip container of a checkpoint (torch::serialize archives, torch.save files) checked before
// LibTorch's reader parses it: the end-of-central-directory record found, every entry's local header
// and stored bytes inside the file, and every entry's CRC-32 equal to the one the central directory
// records. LibTorch's reader verifies no CRC and trusts the lengths inside its pickle: a damaged byte
// could make it allocate gigabytes (found by fuzzing: tests/fuzz/crashes/checkpoint). The problem
// names the entry. Stored entries (the tensors and the pickles) are checked here,
// deflated ones (LibTorch's code entries) by the inflating reader; zip64 records (LibTorch writes them
// always) are followed. Every storage that data.pkl or constants.pkl declares must fit in its entry:
// LibTorch sizes a storage from the pickle and reads its entry's buffer that far (util/pickle_storages.h).
struct ZipProblem {
  bool zip = true;   // false: no zip archive at all (too short, no central directory)
  std::string what;  // "" when the container is sound
};
ZipProblem zip_container_problem(const std::string& path);

// A read-only memory map of a whole file (move-only).
class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace spanformer
