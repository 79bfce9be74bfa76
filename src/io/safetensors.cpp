#include "spanformer/io/safetensors.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "spanformer/util/jsonl.h"

namespace spanformer::io {
namespace {

struct DType {
  const char* name;
  at::ScalarType type;
  int64_t size;
};
// The safetensors dtypes LibTorch 1.13 has a type for (U16/U32/U64 and the F8 kinds are refused by name).
constexpr DType kDTypes[] = {{"BOOL", at::kBool, 1},    {"U8", at::kByte, 1},   {"I8", at::kChar, 1},
                             {"I16", at::kShort, 2},    {"I32", at::kInt, 4},   {"I64", at::kLong, 8},
                             {"F16", at::kHalf, 2},     {"BF16", at::kBFloat16, 2}, {"F32", at::kFloat, 4},
                             {"F64", at::kDouble, 8}};
constexpr uint64_t kMaxHeader = 100u << 20;

void require_little_endian() {
  const uint16_t one = 1;
  uint8_t first;
  std::memcpy(&first, &one, 1);
  if (first != 1) fail("safetensors: this machine is big-endian; the format is little-endian (not supported)");
}

const DType& dtype_named(const std::string& name, const std::string& path, const std::string& tensor) {
  for (const auto& d : kDTypes)
    if (name == d.name) return d;
  fail("{}: tensor '{}' has dtype '{}', which spanformer cannot read", path, tensor, name);
}

const DType& dtype_of(at::ScalarType type, const std::string& path, const std::string& tensor) {
  for (const auto& d : kDTypes)
    if (type == d.type) return d;
  fail("cannot write {}: tensor '{}' has type {}, which safetensors has no dtype for", path, tensor, at::toString(type));
}

// The SHA-256 of a header's meaning (io/safetensors.h): the tensors' entries and the metadata without
// the two checksums, as JSON with sorted keys (nlohmann::json objects keep them sorted).
std::string header_hash(const nlohmann::json& tensors, const std::map<std::string, std::string>& metadata) {
  nlohmann::json meta = nlohmann::json::object();
  for (const auto& [key, value] : metadata)
    if (key != kSafetensorsChecksumKey && key != kSafetensorsHeaderChecksumKey) meta[key] = value;
  const std::string text = nlohmann::json{{"metadata", meta}, {"tensors", tensors}}.dump();
  Sha256 hash;
  hash.add(text.data(), text.size());
  return hash.hex();
}

}  // namespace

SafeTensors read_safetensors(const std::string& path) {
  require_little_endian();
  const std::string bytes = read_file(path);
  const auto bad = [&](const std::string& why) { fail("{} is not a valid safetensors file: {}", path, why); };
  if (bytes.size() < 8) bad("shorter than its 8-byte header length");
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  if (n > kMaxHeader || n > bytes.size() - 8) bad(fmt::format("header length {} does not fit the file of {} bytes", n, bytes.size()));
  nlohmann::json header;
  try {
    header = parse_json(std::string(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n)), path + " is not a valid safetensors file: its header");
  } catch (const nlohmann::json::exception& e) {
    bad("its header is not JSON (" + one_line_message(e) + ")");
  }
  if (!header.is_object()) bad("its header is not a JSON object");
  const uint64_t buffer = bytes.size() - 8 - n;
  const char* data = bytes.data() + 8 + n;

  SafeTensors out;
  nlohmann::json entries = nlohmann::json::object();  // name -> [dtype, shape, offsets], for the header hash
  struct Span {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const auto& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) bad("__metadata__ is not an object");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string()) bad("__metadata__ value of '" + m.key() + "' is not a string");
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!entry.is_object() || !entry.contains("dtype") || !entry["dtype"].is_string() || !entry.contains("shape") ||
        !entry["shape"].is_array() || !entry.contains("data_offsets") || !entry["data_offsets"].is_array() ||
        entry["data_offsets"].size() != 2)
      bad("tensor '" + name + "' lacks dtype, shape or data_offsets");
    const DType& d = dtype_named(entry["dtype"].get<std::string>(), path, name);
    std::vector<int64_t> shape;
    uint64_t numel = 1;
    for (const auto& dim : entry["shape"]) {
      if (!dim.is_number_unsigned() || dim.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        bad("tensor '" + name + "' has a shape entry that is not a non-negative integer");
      const uint64_t s = dim.get<uint64_t>();
      if (s != 0 && numel > buffer / s) numel = buffer + 1;  // more elements than the file has bytes: refused below
      else numel *= s;
      shape.push_back(static_cast<int64_t>(s));
    }
    const auto& offsets = entry["data_offsets"];
    if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
      bad("tensor '" + name + "' has data_offsets that are not non-negative integers");
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    if (begin > end || end > buffer) bad(fmt::format("tensor '{}' has data_offsets [{}, {}] outside the {} data bytes", name, begin, end, buffer));
    if (numel > buffer || end - begin != numel * static_cast<uint64_t>(d.size))
      bad(fmt::format("tensor '{}' of shape {} and dtype {} does not fill its {} bytes", name, entry["shape"].dump(), d.name, end - begin));
    auto t = at::empty(shape, at::TensorOptions().dtype(d.type));
    if (end > begin) std::memcpy(t.data_ptr(), data + begin, end - begin);
    spans.push_back({begin, end, name});
    entries[name] = nlohmann::json::array({d.name, shape, nlohmann::json::array({begin, end})});
    out.tensors.emplace_back(name, std::move(t));
  }
  // The tensors tile the buffer: sorted by offset, each starts where the previous one ends.
  std::vector<size_t> order(spans.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return spans[a].begin != spans[b].begin ? spans[a].begin < spans[b].begin : spans[a].end < spans[b].end;
  });
  uint64_t at = 0;
  for (size_t i : order) {
    if (spans[i].begin != at) bad(fmt::format("tensor '{}' starts at byte {}, not {} (a hole or an overlap)", spans[i].name, spans[i].begin, at));
    at = spans[i].end;
  }
  if (at != buffer) bad(fmt::format("{} bytes after the last tensor", buffer - at));
  if (auto it = out.metadata.find(kSafetensorsChecksumKey); it != out.metadata.end()) {
    Sha256 hash;
    hash.add(data, buffer);
    if (hash.hex() != it->second)
      bad(fmt::format("its tensors' bytes do not match the {} in its metadata (damaged after it was written; a tool "
                      "that changes tensors on purpose must drop that key)", kSafetensorsChecksumKey));
    out.checksummed = true;
  }
  if (auto it = out.metadata.find(kSafetensorsHeaderChecksumKey); it != out.metadata.end()) {
    if (header_hash(entries, out.metadata) != it->second)
      bad(fmt::format("its tensors' names, dtypes, shapes or offsets, or its metadata (config, vocabulary), do not "
                      "match the {} in its metadata (edited after it was written; a tool that changes the header "
                      "on purpose must drop that key)", kSafetensorsHeaderChecksumKey));
  }
  std::vector<std::pair<std::string, at::Tensor>> sorted;
  for (size_t i : order) sorted.push_back(std::move(out.tensors[i]));
  out.tensors = std::move(sorted);
  return out;
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  require_little_endian();
  nlohmann::json header = nlohmann::json::object();
  nlohmann::json entries = nlohmann::json::object();  // for the header hash
  std::vector<at::Tensor> contiguous;
  Sha256 hash;  // of the data buffer: the tensors' bytes in the order written
  uint64_t offset = 0;
  std::set<std::string> names;
  for (const auto& [name, tensor] : tensors) {
    if (name.empty() || name == "__metadata__" || !names.insert(name).second)
      fail("cannot write {}: tensor name '{}' is empty, reserved or repeated", path, name);
    const DType& d = dtype_of(tensor.scalar_type(), path, name);
    auto t = tensor.detach().to(at::kCPU).contiguous();
    const uint64_t size = static_cast<uint64_t>(t.numel()) * static_cast<uint64_t>(d.size);
    header[name] = {{"dtype", d.name}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + size}}};
    entries[name] = nlohmann::json::array({d.name, t.sizes().vec(), nlohmann::json::array({offset, offset + size})});
    offset += size;
    if (size > 0) hash.add(t.data_ptr(), static_cast<size_t>(size));
    contiguous.push_back(std::move(t));
  }
  auto with_checksum = metadata;
  with_checksum[kSafetensorsChecksumKey] = hash.hex();
  with_checksum[kSafetensorsHeaderChecksumKey] = header_hash(entries, metadata);
  header["__metadata__"] = with_checksum;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  const uint64_t n = text.size();
  write_atomic_with(path, [&](const std::string& tmp) {
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) fail("cannot write {}: {}", path, std::strerror(errno));
    bool ok = std::fwrite(&n, 8, 1, f) == 1 && std::fwrite(text.data(), 1, text.size(), f) == text.size();
    for (const auto& t : contiguous) {
      const size_t size = static_cast<size_t>(t.numel() * t.element_size());
      if (ok && size > 0) ok = std::fwrite(t.data_ptr(), 1, size, f) == size;
    }
    int error = ok ? 0 : errno;
    if (std::fflush(f) != 0 && ok) ok = false, error = errno;
    if (std::fclose(f) != 0 && ok) ok = false, error = errno;
    if (!ok) fail("cannot write {}: {}", path, std::strerror(error));
  });
}

}  // namespace spanformer::io
