#include "spanformer/train/checkpoint.h"

#include <fmt/ranges.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <unistd.h>
#include <set>
#include <utility>

#include "spanformer/data/subwords.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "spanformer/util/run_paths.h"
#include "spanformer/util/jsonl.h"

namespace spanformer::train {
namespace {

// SHA-256 of an entry: its key, its kind, and for a tensor its dtype, shape and bytes.
std::string tensor_digest(const std::string& key, const torch::Tensor& t) {
  Sha256 d;
  d.add("t:" + key);
  d.add(std::string(c10::toString(t.scalar_type())));
  d.add(fmt::format("{}", fmt::join(t.sizes(), "x")));
  auto c = t.contiguous();
  d.add(c.data_ptr(), c.numel() * c.element_size());
  return "t:" + d.hex();
}

std::string text_digest(const std::string& key, const std::string& text) {
  Sha256 d;
  d.add("s:" + key);
  d.add(text.data(), text.size());
  return "s:" + d.hex();
}

}  // namespace

std::vector<std::pair<std::string, bool>> Checkpoint::entries() const {
  static const std::set<std::string> header = {"format", "version", "family", "config", "vocab", "vocab_level", "vocab_model", "manifest"};
  std::vector<std::pair<std::string, bool>> out;
  for (const auto& [key, t] : tensors_)
    if (!header.count(key)) out.emplace_back(key, false);
  for (const auto& [key, t] : texts_)
    if (!header.count(key)) out.emplace_back(key, true);
  return out;
}

std::string checkpoint_file(const std::string& path) {
  const RunPaths run(path);
  if (!file_exists(path) && file_exists(run.checkpoint())) return run.checkpoint();
  return path;
}

CheckpointWriter::CheckpointWriter(const std::string& family, const nlohmann::json& config, const data::Vocab& vocab) {
  archive_.write("format", c10::IValue(std::string(kCheckpointFormat)));
  put_int("version", kCheckpointVersion);
  put_text("family", family);
  put_text("config", config.dump());
  put_text("vocab", data::vocab_to_text(vocab));
  put_text("vocab_level", data::vocab_level(vocab));
  if (vocab.subwords || vocab.bpe) {  // the model's bytes, as a uint8 tensor (SentencePiece's are not text)
    const std::string proto = vocab.model_bytes();
    put("vocab_model", torch::from_blob(const_cast<char*>(proto.data()), {static_cast<int64_t>(proto.size())}, torch::kUInt8).clone());
  }
}

void CheckpointWriter::put(const std::string& key, const torch::Tensor& tensor) {
  auto t = tensor.detach().to(torch::kCPU).contiguous();
  manifest_[key] = tensor_digest(key, t);
  archive_.write(key, t);
}

void CheckpointWriter::put_text(const std::string& key, const std::string& text) {
  manifest_[key] = text_digest(key, text);
  archive_.write(key, c10::IValue(text));
}

void CheckpointWriter::put_int(const std::string& key, int64_t value) { put(key, torch::tensor(value)); }
void CheckpointWriter::put_double(const std::string& key, double value) {
  put(key, torch::tensor(value, torch::kDouble));
}

void CheckpointWriter::save(const std::string& path) {
  archive_.write("manifest", c10::IValue(manifest_.dump()));
  write_atomic_with(path, [&](const std::string& tmp) {
    // The archive is streamed through a callback that always reports success: LibTorch's zip writer
    // finishes the file in its destructor, and an error thrown there (a full disk) would terminate the
    // process. The first write error is remembered instead and reported once the writer is gone.
    std::FILE* out = std::fopen(tmp.c_str(), "wb");
    if (out == nullptr) fail("cannot write {}: {}", path, std::strerror(errno));
    int error = 0;
    auto sink = [&](const void* data, size_t n) -> size_t {
      if (error == 0 && n > 0 && std::fwrite(data, 1, n, out) != n) error = errno != 0 ? errno : EIO;
      return n;
    };
    try {
      archive_.save_to(sink);
    } catch (const c10::Error& e) {
      std::fclose(out);
      fail("cannot write {}: {}", path, one_line_message(e));
    }
    if (std::fflush(out) != 0 && error == 0) error = errno;
    if (std::fclose(out) != 0 && error == 0) error = errno;
    if (error != 0) fail("cannot write {}: {}", path, std::strerror(error));
  });
}

namespace {
// Version 1's format markers and the family each one meant (header comment).
constexpr std::pair<const char*, const char*> kVersionOneFormats[] = {{"spanformer-checkpoint-v1", "adaptive-span"},
                                                                      {"spanformer-xl-checkpoint-v1", "xl"}};
const char* version_one_family(const std::string& format) {  // nullptr: not a version 1 marker
  for (const auto& [marker, family] : kVersionOneFormats)
    if (format == marker) return family;
  return nullptr;
}
bool is_format_marker(const std::string& f) { return f == kCheckpointFormat || version_one_family(f); }
}  // namespace

bool has_checkpoint_marker(const std::string& path) {
  if (sniff_file_kind(path) != FileKind::kZip) return false;
  if (const auto zip = zip_container_problem(path); !zip.zip || !zip.what.empty()) return false;  // unsafe to load
  torch::serialize::InputArchive archive;
  c10::IValue format;
  try {
    archive.load_from(path);
    if (!archive.try_read("format", format)) return false;
  } catch (const std::exception&) {
    return false;
  }
  return format.isString() && is_format_marker(format.toStringRef());
}

Checkpoint::Checkpoint(const std::string& path_in) : path_(checkpoint_file(path_in)) {
  if (!file_exists(path_)) {
    std::error_code ec;
    if (std::filesystem::is_directory(path_in, ec) && ::access(path_in.c_str(), R_OK | X_OK) != 0)
      fail("cannot read the run directory {}: {}", path_in, std::strerror(errno));  // permission denied
    if (std::filesystem::is_directory(path_in, ec))
      fail("{} is a directory without {}: not a run directory{}", path_in, RunPaths(path_in).checkpoint(),
           file_exists(path_in + "/vocab.txt") || file_exists(path_in + "/words.txt") ? " (a prepared data directory?)" : "");
    fail("checkpoint not found: {}", path_in);
  }
  check_readable(path_);
  if (const auto zip = zip_container_problem(path_); !zip.zip) {
    if (const auto kind = sniff_file_kind(path_); kind == FileKind::kJson)
      fail("{} is {}, not a checkpoint: give a run directory or its checkpoint.pt", path_, file_kind_text(kind));
    fail("{} is not a readable spanformer checkpoint (truncated, corrupt, or another format)", path_);
  } else if (!zip.what.empty()) {
    fail("{} is damaged: {} (the file changed after it was written)", path_, zip.what);
  }
  try {
    archive_.load_from(path_);
  } catch (const std::exception&) {
    fail("{} is not a readable spanformer checkpoint (truncated, corrupt, or another format)", path_);
  }
  c10::IValue format;
  if (!archive_.try_read("format", format) || !format.isString())
    fail("{} is not a spanformer checkpoint (no format marker; reference models need `spanformer import`)", path_);
  const std::string f = format.toStringRef();
  if (const char* family = version_one_family(f)) {
    version_ = 1;
    family_ = family;
    c10::IValue config, vocab, level;
    if (!archive_.try_read("config", config) || !archive_.try_read("vocab", vocab) || !config.isString() ||
        !vocab.isString())
      fail("{} is damaged: no config or vocabulary", path_);
    std::string level_text = "byte";
    if (archive_.try_read("vocab_level", level) && level.isString()) level_text = level.toStringRef();
    texts_["config"] = config.toStringRef();
    texts_["vocab"] = vocab.toStringRef();
    texts_["vocab_level"] = level_text;
  } else if (f == kCheckpointFormat) {
    c10::IValue manifest_text;
    if (!archive_.try_read("manifest", manifest_text) || !manifest_text.isString())
      fail("{} is damaged: no manifest", path_);
    nlohmann::json manifest;
    try {
      manifest = parse_json(manifest_text.toStringRef(), path_ + ": its manifest");
    } catch (const nlohmann::json::exception&) {
      fail("{} is damaged: its manifest is not valid JSON", path_);
    }
    if (!manifest.is_object()) fail("{} is damaged: its manifest is not a key list", path_);
    texts_["manifest"] = manifest_text.toStringRef();
    for (const auto& key : archive_.keys()) {
      if (key != "format" && key != "manifest" && !manifest.contains(key))
        fail("{} is damaged: entry '{}' is not in its manifest", path_, key);
    }
    for (const auto& [key, expected] : manifest.items()) {
      if (!expected.is_string()) fail("{} is damaged: manifest entry '{}'", path_, key);
      const std::string& e = expected.get_ref<const std::string&>();
      std::string actual;
      if (e.rfind("t:", 0) == 0) {
        torch::Tensor t;
        bool ok = false;
        try {
          ok = archive_.try_read(key, t);
        } catch (const std::exception&) {
        }
        if (!ok) fail("{} is damaged: entry '{}' is missing or unreadable", path_, key);
        actual = tensor_digest(key, t);
        tensors_[key] = t;
      } else {
        c10::IValue v;
        if (!archive_.try_read(key, v) || !v.isString()) fail("{} is damaged: entry '{}' is missing or unreadable", path_, key);
        actual = text_digest(key, v.toStringRef());
        texts_[key] = v.toStringRef();
      }
      if (actual != e) fail("{} is damaged: entry '{}' fails its checksum (the file was altered or corrupted)", path_, key);
    }
    version_ = integer("version");
    if (version_ != kCheckpointVersion)
      fail("{} has checkpoint format version {}; this build reads versions 1 and {}", path_, version_, kCheckpointVersion);
    family_ = text("family");
  } else {
    fail("{} is not a spanformer checkpoint (format '{}')", path_, f);
  }
  try {
    config_ = parse_json(text("config"), path_ + ": its config");
  } catch (const nlohmann::json::exception&) {
    fail("{} is damaged: its config is not valid JSON", path_);
  }
  std::string subword_model;
  if (text("vocab_level") == "sentencepiece" || text("vocab_level") == "bpe") {
    auto bytes = tensor("vocab_model");
    if (bytes.scalar_type() != torch::kUInt8 || bytes.dim() != 1) fail("{} is damaged: its vocab_model is not bytes", path_);
    subword_model.assign(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), static_cast<size_t>(bytes.numel()));
  }
  vocab_ = data::vocab_from_parts(text("vocab"), text("vocab_level"), subword_model, path_);
}

bool Checkpoint::has(const std::string& key) const {
  if (version_ >= 2) return tensors_.count(key) || texts_.count(key);
  torch::Tensor t;
  return texts_.count(key) || archive_.try_read(key, t);
}

torch::Tensor Checkpoint::tensor(const std::string& key) const {
  if (version_ >= 2) {
    auto it = tensors_.find(key);
    if (it == tensors_.end()) fail("checkpoint {} has no '{}'", path_, key);
    return it->second;
  }
  torch::Tensor t;
  if (!archive_.try_read(key, t)) fail("checkpoint {} has no '{}'", path_, key);
  return t;
}

std::string Checkpoint::text(const std::string& key) const {
  auto it = texts_.find(key);
  if (it != texts_.end()) return it->second;
  if (version_ < 2) {
    c10::IValue v;
    if (archive_.try_read(key, v) && v.isString()) return v.toStringRef();
  }
  fail("checkpoint {} has no '{}'", path_, key);
}

int64_t Checkpoint::integer(const std::string& key) const {
  auto t = tensor(key);
  if (t.numel() != 1 || t.is_floating_point()) fail("checkpoint {}: '{}' is not an integer", path_, key);
  return t.item<int64_t>();
}

double Checkpoint::number(const std::string& key) const {
  auto t = tensor(key);
  if (t.numel() != 1) fail("checkpoint {}: '{}' is not a number", path_, key);
  return t.item<double>();
}

void Checkpoint::read_parameters(const torch::OrderedDict<std::string, torch::Tensor>& params,
                                 const std::string& prefix) const {
  torch::NoGradGuard no_grad;
  for (const auto& item : params) {
    const std::string key = prefix + item.key();
    if (!has(key)) fail("checkpoint {} has no parameter '{}'", path_, item.key());
    auto t = tensor(key);
    if (t.sizes() != item.value().sizes())
      fail("checkpoint {}: parameter '{}' has shape {}, the model expects {}", path_, item.key(),
           fmt::join(t.sizes(), "x"), fmt::join(item.value().sizes(), "x"));
    if (t.is_floating_point() && !torch::isfinite(t).all().item<bool>())
      fail("checkpoint {}: parameter '{}' holds non-finite values", path_, item.key());
    item.value().copy_(t);
  }
}

}  // namespace spanformer::train
