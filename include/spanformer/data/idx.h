// IDX files (LeCun et al.'s MNIST format, also Fashion-MNIST's): a big-endian header
//     0x00 0x00 | type (0x08 = unsigned byte) | rank r | r x uint32 dims
// then prod(dims) values. Read whole, gzip-compressed (*.gz, as Debian's dataset-fashion-mnist ships
// them) or not; every malformed file is a one-line error naming it.
//
// Image sets: `load_image_set(dir)` reads Fashion-MNIST / MNIST's four files from `dir`
// (train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], t10k-...): train = the first
// 60000 - valid_count training images, valid = the last valid_count, test = the t10k files.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace spanformer::data {

struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> values;  // row-major, prod(dims)
  std::string sha256;           // of the file as stored (compressed or not)
};
IdxArray read_idx(const std::string& path);
// Writes an uncompressed unsigned-byte IDX file (tests and tools).
void write_idx(const std::string& path, const std::vector<int64_t>& dims, const std::vector<uint8_t>& values);

struct ImageSplit {
  torch::Tensor images;  // (n, H, W) uint8
  torch::Tensor labels;  // (n) int64 in [0, classes)
  std::string fingerprint;  // SHA-256 of the image and label files, and of the split rule
};
struct ImageSet {
  ImageSplit train, valid, test;
  std::vector<std::string> classes;  // names of the labels (Fashion-MNIST's when 10 classes)
  std::string dir;
  const ImageSplit& split(const std::string& name) const;  // train | valid | test, else an error
};
// `valid_count` training images (the last ones) are held out for validation.
ImageSet load_image_set(const std::string& dir, int64_t valid_count = 5000);

}  // namespace spanformer::data
