// safetensors (huggingface/safetensors): the tensor format the Hugging Face ecosystem reads and writes.
//
// A file is
//   8 bytes      N, the header length, unsigned little-endian
//   N bytes      a JSON object: name -> {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]}
//                and optionally "__metadata__": {string -> string}; padded with spaces
//   the rest     the tensors' bytes, little-endian, row-major; offsets are relative to the end of the header
// Invariants checked on reading (a file that breaks one is refused, naming the file and the tensor):
// every (end - begin) equals numel x element size, the tensors tile the byte buffer exactly (no hole,
// no overlap, nothing after the last one), dtypes are known, the header is at most 100 MB.
//
// spanformer writes every family's parameters under their own names (module.named_parameters()) and
// puts what a checkpoint needs besides the weights into __metadata__ (spanformer.family, .config,
// .vocab, .vocab_level), so `import safetensors` rebuilds a checkpoint from the file alone.
//
// The format has no checksum, and a flipped exponent bit reads as a valid (wildly wrong) weight. So
// spanformer writes the SHA-256 of the whole data buffer into __metadata__ as "spanformer.sha256", and
// the SHA-256 of the header's meaning as "spanformer.header_sha256": every tensor's name, dtype, shape
// and offsets and every other metadata entry (the config, the vocabulary), as the canonical JSON
// {"metadata": {...}, "tensors": {name: [dtype, shape, [begin, end]]}} with sorted keys. A reader checks
// each where present (the data first); files from elsewhere have none and are read as they are
// (SafeTensors::checksummed says which), and files written before the header hash carry the data's only.
// A tool that changes the tensors or the header on purpose drops the key it invalidates.
#pragma once
#include <ATen/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace spanformer::io {

inline constexpr const char* kSafetensorsChecksumKey = "spanformer.sha256";
inline constexpr const char* kSafetensorsHeaderChecksumKey = "spanformer.header_sha256";

struct SafeTensors {
  std::vector<std::pair<std::string, at::Tensor>> tensors;  // in file order of their data
  std::map<std::string, std::string> metadata;              // spanformer.sha256 included when present
  bool checksummed = false;                                 // spanformer.sha256 was present (and matched)
};

// Reads and validates a whole file (tensors are copied out of it, on the CPU).
SafeTensors read_safetensors(const std::string& path);

// Writes the tensors (any device, any layout: copied to contiguous CPU memory) and the metadata, with
// spanformer.sha256 of the data added, atomically; names must be unique and non-empty and must not be
// "__metadata__".
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata);

}  // namespace spanformer::io
