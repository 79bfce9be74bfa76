#include "spanformer/data/idx.h"

#include <zlib.h>

#include <filesystem>
#include <fstream>

#include "spanformer/util/error.h"
#include "spanformer/util/io.h"

namespace spanformer::data {
namespace {

// The whole file, decompressed when it is gzip (zlib reads plain files through unchanged).
std::string read_maybe_gzip(const std::string& path) {
  if (!std::filesystem::is_regular_file(path)) fail("{}: no such file", path);
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) fail("{}: cannot open", path);
  std::string out;
  char buffer[1 << 16];
  for (;;) {
    const int n = gzread(f, buffer, sizeof buffer);
    if (n < 0) {
      int code = 0;
      const std::string message = gzerror(f, &code);
      gzclose(f);
      fail("{}: corrupt compressed data ({})", path, message);
    }
    if (n == 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  gzclose(f);
  return out;
}

std::string file_sha256(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  Sha256 hash;
  char buffer[1 << 16];
  while (in) {
    in.read(buffer, sizeof buffer);
    hash.add(buffer, static_cast<size_t>(in.gcount()));
  }
  return hash.hex();
}

uint32_t big_endian(const std::string& s, size_t at) {
  return (static_cast<uint32_t>(static_cast<uint8_t>(s[at])) << 24) | (static_cast<uint32_t>(static_cast<uint8_t>(s[at + 1])) << 16) |
         (static_cast<uint32_t>(static_cast<uint8_t>(s[at + 2])) << 8) | static_cast<uint32_t>(static_cast<uint8_t>(s[at + 3]));
}

// dir/name or dir/name.gz, whichever exists.
std::string find(const std::string& dir, const std::string& name) {
  for (const auto& candidate : {dir + "/" + name, dir + "/" + name + ".gz"})
    if (std::filesystem::is_regular_file(candidate)) return candidate;
  fail("{}: no {} or {}.gz (an IDX image set: MNIST or Fashion-MNIST, e.g. /usr/share/datasets/fashion-mnist)", dir, name,
       name);
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  const std::string bytes = read_maybe_gzip(path);
  if (bytes.size() < 4) fail("{}: too short for an IDX header ({} bytes)", path, bytes.size());
  if (bytes[0] != 0 || bytes[1] != 0) fail("{}: not an IDX file (its first two bytes are not zero)", path);
  if (static_cast<uint8_t>(bytes[2]) != 0x08)
    fail("{}: IDX value type 0x{:02x} is not supported (only 0x08, unsigned bytes)", path, static_cast<uint8_t>(bytes[2]));
  const int rank = static_cast<uint8_t>(bytes[3]);
  if (rank < 1 || rank > 4) fail("{}: IDX rank {} (expected 1 to 4)", path, rank);
  const size_t header = 4 + 4 * static_cast<size_t>(rank);
  if (bytes.size() < header) fail("{}: truncated IDX header", path);
  IdxArray out;
  size_t count = 1;
  for (int i = 0; i < rank; ++i) {
    const uint32_t d = big_endian(bytes, 4 + 4 * static_cast<size_t>(i));
    if (d == 0) fail("{}: IDX dimension {} is zero", path, i);
    out.dims.push_back(d);
    count *= d;
    if (count > (size_t{1} << 34)) fail("{}: IDX dimensions too large", path);
  }
  if (bytes.size() - header != count)
    fail("{}: {} value bytes after the header, but its dimensions need {} (truncated or corrupt)", path,
         bytes.size() - header, count);
  out.values.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  out.sha256 = file_sha256(path);
  return out;
}

void write_idx(const std::string& path, const std::vector<int64_t>& dims, const std::vector<uint8_t>& values) {
  std::string out = {0, 0, 0x08, static_cast<char>(dims.size())};
  for (int64_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) out += static_cast<char>((static_cast<uint32_t>(d) >> shift) & 0xff);
  out.append(reinterpret_cast<const char*>(values.data()), values.size());
  write_file_atomic(path, out);
}

const ImageSplit& ImageSet::split(const std::string& name) const {
  if (name == "train") return train;
  if (name == "valid") return valid;
  if (name == "test") return test;
  fail("unknown split '{}' (train, valid or test)", name);
}

ImageSet load_image_set(const std::string& dir, int64_t valid_count) {
  auto load = [&](const std::string& prefix) {
    const auto images_path = find(dir, prefix + "-images-idx3-ubyte"), labels_path = find(dir, prefix + "-labels-idx1-ubyte");
    auto images = read_idx(images_path);
    auto labels = read_idx(labels_path);
    if (images.dims.size() != 3) fail("{}: images must be an IDX array of rank 3 (n, rows, columns)", images_path);
    if (labels.dims.size() != 1) fail("{}: labels must be an IDX array of rank 1", labels_path);
    if (labels.dims[0] != images.dims[0])
      fail("{}: {} labels for {} images in {}", labels_path, labels.dims[0], images.dims[0], images_path);
    for (uint8_t l : labels.values)
      if (l > 9) fail("{}: label {} outside 0..9", labels_path, static_cast<int>(l));
    ImageSplit s;
    s.images = torch::from_blob(images.values.data(), images.dims, torch::kUInt8).clone();  // (n, H, W)
    s.labels = torch::from_blob(labels.values.data(), {labels.dims[0]}, torch::kUInt8).to(torch::kLong);  // (n)
    s.fingerprint = images.sha256 + labels.sha256;
    return s;
  };
  ImageSet set;
  set.dir = dir;
  ImageSplit all = load("train");
  set.test = load("t10k");
  const int64_t n = all.images.size(0);
  if (valid_count < 1 || valid_count >= n)
    fail("{}: cannot hold out {} of {} training images for validation", dir, valid_count, n);
  if (set.test.images.sizes().slice(1) != all.images.sizes().slice(1)) fail("{}: test and train images differ in size", dir);
  set.train = {all.images.narrow(0, 0, n - valid_count), all.labels.narrow(0, 0, n - valid_count),
               all.fingerprint + ":first" + std::to_string(n - valid_count)};
  set.valid = {all.images.narrow(0, n - valid_count, valid_count), all.labels.narrow(0, n - valid_count, valid_count),
               all.fingerprint + ":last" + std::to_string(valid_count)};
  set.classes = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle-boot"};
  return set;
}

}  // namespace spanformer::data
