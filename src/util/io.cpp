#include "spanformer/util/io.h"

#include <openssl/evp.h>
#include <zlib.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "pickle_storages.h"
#include "spanformer/util/error.h"

namespace spanformer {

std::string read_file(const std::string& path) {
  require_file(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open {}: {}", path, std::strerror(errno));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

void check_readable(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail("cannot open {}: {}", path, std::strerror(errno));
  char byte;
  const bool ok = std::fread(&byte, 1, 1, f) == 1 || !std::ferror(f);  // a directory opens but cannot be read
  const int error = errno;
  std::fclose(f);
  if (!ok) fail("cannot read {}: {}", path, std::strerror(error));
}

bool file_exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
}

void require_file(const std::string& path, const std::string& hint) {
  if (file_exists(path)) return;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail("{} is a directory, not a file{}", path, hint);
  fail("file not found: {}", path);
}

FileKind sniff_file_kind(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char head[4] = {0, 0, 0, 0};
  in.read(head, 4);
  if (head[0] == 'P' && head[1] == 'K' && head[2] == 3 && head[3] == 4) return FileKind::kZip;
  size_t i = 0;
  while (i < 4 && (head[i] == ' ' || head[i] == '\n' || head[i] == '\t' || head[i] == '\r')) ++i;
  if (i < 4 && head[i] == '{') return FileKind::kJson;
  return FileKind::kUnknown;
}

const char* file_kind_text(FileKind kind) {
  switch (kind) {
    case FileKind::kZip: return "a checkpoint (zip)";
    case FileKind::kJson: return "a JSON file (a config or a log)";
    case FileKind::kUnknown: break;
  }
  return "";
}

void check_regular_or_absent(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
    fail("{} exists and is not a regular file ({}): move it away or choose another path", path, what);
}

void make_dirs(const std::string& path) {
  if (path.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) fail("cannot create directory {}: {}", path, ec.message());
}

void write_atomic_with(const std::string& path_in, const std::function<void(const std::string&)>& write) {
  // A symbolic link is written through (its target is replaced), never replaced by a file; anything
  // that is not a regular file (a device, a directory, a pipe) is refused rather than renamed over.
  std::string path = path_in;
  std::error_code ec;
  if (std::filesystem::is_symlink(path, ec)) {
    auto target = std::filesystem::read_symlink(path, ec);
    if (ec) fail("cannot write {}: {}", path_in, ec.message());
    path = (target.is_absolute() ? target : std::filesystem::path(path).parent_path() / target).string();
  }
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
    fail("cannot write {}: it exists and is not a regular file", path_in);
  auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) make_dirs(parent.string());
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    write(tmp);
    int fd = ::open(tmp.c_str(), O_RDONLY);
    if (fd >= 0) {
      ::fsync(fd);
      ::close(fd);
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot write {}: {}", path, std::strerror(errno));
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}

void write_file_atomic(const std::string& path, const std::string& content) {
  write_atomic_with(path, [&](const std::string& tmp) {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) fail("cannot write {}: {}", path, std::strerror(errno));
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    out.close();
    if (!out) fail("cannot write {}: disk full?", path);
  });
}

void remove_stale_temporaries(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const auto at = name.rfind(".tmp.");
    if (at == std::string::npos || !entry.is_regular_file(ec)) continue;
    const std::string pid = name.substr(at + 5);
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    // Only files of writers that are gone: a live process may still be renaming its file.
    if (::kill(static_cast<pid_t>(std::stol(pid)), 0) != 0 && errno == ESRCH) std::filesystem::remove(entry.path(), ec);
  }
}

DirectoryLock::DirectoryLock(const std::string& dir, const std::string& what) {
  make_dirs(dir);
  const std::string path = dir + "/.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot lock {}: {}", dir, std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd_);
    fd_ = -1;
    fail("{} is in use by another {} (one run directory, one writer)", dir, what);
  }
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  require_file(path);
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail("cannot open {}: {}", path, std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      fail("cannot map {}: {}", path, std::strerror(errno));
    }
    ::madvise(p, size_, MADV_SEQUENTIAL);
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    data_ = other.data_;
    size_ = other.size_;
    path_ = std::move(other.path_);
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr); }
Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }
void Sha256::add(const void* data, size_t size) { EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, size); }
std::string hex_encode(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string h;
  h.reserve(2 * bytes.size());
  for (unsigned char c : bytes) h += {digits[c >> 4], digits[c & 15]};
  return h;
}

std::string hex_decode(const std::string& hex, const std::string& origin) {
  if (hex.size() % 2 != 0) fail("{}: hex text of odd length {}", origin, hex.size());
  auto digit = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    fail("{}: '{}' is not a hex digit", origin, c);
  };
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(digit(hex[2 * i]) * 16 + digit(hex[2 * i + 1]));
  return out;
}

std::string Sha256::hex() {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), out, &length);
  return hex_encode(std::string(reinterpret_cast<const char*>(out), length));
}

namespace {
uint32_t le32(const uint8_t* p) { return p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24); }
uint16_t le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
}  // namespace

ZipProblem zip_container_problem(const std::string& path) {
  struct Found {
    ZipProblem problem;
  };
  MappedFile file(path);
  const uint8_t* d = file.data();
  const size_t n = file.size();
  auto damaged = [](const std::string& what) { throw Found{{true, what}}; };
  auto le64 = [&](size_t at) { return static_cast<uint64_t>(le32(d + at)) | (static_cast<uint64_t>(le32(d + at + 4)) << 32); };
  // End of central directory: 22 bytes + a comment of at most 65535, searched from the end.
  if (n < 22) return {false, "too short for a zip archive"};
  size_t eocd = std::string::npos;
  for (size_t i = n - 22 + 1; i-- > 0 && n - i <= 22 + 65535;)
    if (le32(d + i) == 0x06054b50u) {
      eocd = i;
      break;
    }
  if (eocd == std::string::npos) return {false, "no end of a zip's central directory"};
  struct Record {
    uint64_t begin, size;
    uint16_t method;
  };
  std::map<std::string, Record> records;
  try {
    uint64_t entries = le16(d + eocd + 10), cd_size = le32(d + eocd + 12), cd_offset = le32(d + eocd + 16);
    size_t cd_end = eocd;
    // Zip64 (LibTorch writes it always): the locator just before the record points at the zip64 record,
    // which holds the counts and offsets in 64 bits.
    if (eocd >= 20 && le32(d + eocd - 20) == 0x07064b50u) {
      const uint64_t record = le64(eocd - 20 + 8);
      if (record + 56 > eocd - 20 || le32(d + record) != 0x06064b50u) damaged("a zip64 locator pointing nowhere");
      entries = le64(record + 32);
      cd_size = le64(record + 40);
      cd_offset = le64(record + 48);
      cd_end = record;
    }
    if (entries == 0) damaged("a zip archive without entries");
    if (cd_offset > cd_end || cd_size > cd_end - cd_offset) damaged("a central directory outside the file");
    size_t at = cd_offset;
    for (uint64_t e = 0; e < entries; ++e) {
      if (at + 46 > cd_end || le32(d + at) != 0x02014b50u) damaged(fmt::format("central directory entry {} is broken", e));
      const uint16_t method = le16(d + at + 10), name_len = le16(d + at + 28), extra_len = le16(d + at + 30),
                     comment_len = le16(d + at + 32);
      const uint32_t crc = le32(d + at + 16);
      uint64_t packed = le32(d + at + 20), size = le32(d + at + 24), local = le32(d + at + 42);
      if (at + 46 + name_len + extra_len > cd_end) damaged(fmt::format("central directory entry {} is broken", e));
      const std::string name(reinterpret_cast<const char*>(d + at + 46), name_len);
      // The zip64 extra field (id 1) holds, in this order, whichever of size, packed size and offset are 0xFFFFFFFF.
      for (size_t x = at + 46 + name_len; x + 4 <= at + 46 + name_len + extra_len;) {
        const uint16_t id = le16(d + x), len = le16(d + x + 2);
        if (x + 4 + len > at + 46 + name_len + extra_len) damaged(fmt::format("entry '{}' has a broken extra field", name));
        if (id == 1) {
          size_t v = x + 4;
          for (uint64_t* field : {&size, &packed, &local})
            if (*field == 0xFFFFFFFFu) {
              if (v + 8 > x + 4 + len) damaged(fmt::format("entry '{}' has a broken zip64 field", name));
              *field = le64(v);
              v += 8;
            }
        }
        x += 4 + static_cast<size_t>(len);
      }
      at += 46 + static_cast<size_t>(name_len) + extra_len + comment_len;
      if (local > n || n - local < 30 || le32(d + local) != 0x04034b50u)
        damaged(fmt::format("entry '{}' has no local header where the directory says", name));
      const uint64_t begin = local + 30 + le16(d + local + 26) + le16(d + local + 28);
      if (begin > n || packed > n - begin) damaged(fmt::format("entry '{}' runs past the end of the file", name));
      records[name] = {begin, packed, method};
      if (method == 8) continue;  // deflated (LibTorch's code entries): the inflating reader checks the CRC itself
      if (method != 0) damaged(fmt::format("entry '{}' has compression method {}, neither stored nor deflated", name, method));
      if (packed != size) damaged(fmt::format("entry '{}' is stored with two different sizes", name));
      uint32_t actual = static_cast<uint32_t>(crc32(0L, Z_NULL, 0));
      for (uint64_t done = 0; done < size;) {  // zlib takes 32-bit lengths
        const auto chunk = static_cast<uInt>(std::min<uint64_t>(size - done, 1u << 30));
        actual = static_cast<uint32_t>(crc32(actual, d + begin + done, chunk));
        done += chunk;
      }
      if (actual != crc) damaged(fmt::format("entry '{}' fails its CRC-32", name));
    }
    // Every storage a pickle declares fits in its record (see pickle_storages.h).
    for (const auto& [name, record] : records) {
      const size_t slash = name.find('/');
      const std::string dir = name.substr(0, slash + 1), base = name.substr(slash + 1);
      if (slash == std::string::npos || (base != "data.pkl" && base != "constants.pkl")) continue;
      if (record.method != 0) damaged(fmt::format("entry '{}' is compressed (LibTorch stores its pickles)", name));
      std::vector<DeclaredStorage> storages;
      try {
        storages = pickle_storages(d + record.begin, record.size, name);
      } catch (const Error& e) {
        damaged(e.what());
      }
      const std::string prefix = dir + base.substr(0, base.size() - 4) + "/";
      for (const auto& storage : storages) {
        const auto it = records.find(prefix + storage.key);
        if (it == records.end()) damaged(fmt::format("{} names storage '{}' and there is no entry {}", name, storage.key, prefix + storage.key));
        if (storage.bytes > it->second.size)
          damaged(fmt::format("{} declares {} bytes for storage '{}' and its entry holds {}", name, storage.bytes,
                              storage.key, it->second.size));
      }
    }
  } catch (const Found& found) {
    return found.problem;
  }
  return {};
}

}  // namespace spanformer
