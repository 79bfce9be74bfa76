#include "spanformer/data/corpus.h"

#include <nlohmann/json.hpp>

#include <array>
#include <cstring>
#include <fstream>

#include "spanformer/data/byte_bpe.h"
#include "spanformer/data/subwords.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "spanformer/util/jsonl.h"

namespace spanformer::data {
namespace {

constexpr char kMagic[8] = {'S', 'P', 'F', 'T', 'O', 'K', '0', '1'};
constexpr size_t kHeaderBytes = 24;

struct Header {
  char magic[8];
  uint32_t bytes_per_token;
  uint32_t vocab_size;
  uint64_t count;
};
static_assert(sizeof(Header) == kHeaderBytes);

// Streams tokens to a file: header first (count patched at the end), then ids.
class TokenWriter {
 public:
  TokenWriter(const std::string& path, int64_t vocab_size) : path_(path), out_(path, std::ios::binary) {
    if (!out_) fail("cannot write {}", path);
    header_.bytes_per_token = vocab_size <= 256 ? 1 : vocab_size <= 65536 ? 2 : 4;
    std::memcpy(header_.magic, kMagic, 8);
    header_.vocab_size = static_cast<uint32_t>(vocab_size);
    header_.count = 0;
    out_.write(reinterpret_cast<const char*>(&header_), sizeof(header_));
    buffer_.reserve(1 << 20);
  }
  void put(int64_t id) {
    if (header_.bytes_per_token == 1) {
      buffer_.push_back(static_cast<char>(id));
    } else if (header_.bytes_per_token == 2) {
      auto v = static_cast<uint16_t>(id);
      buffer_.append(reinterpret_cast<const char*>(&v), 2);
    } else {
      auto v = static_cast<uint32_t>(id);
      buffer_.append(reinterpret_cast<const char*>(&v), 4);
    }
    ++header_.count;
    if (buffer_.size() >= (1 << 20)) flush();
  }
  void close() {
    flush();
    out_.seekp(0);
    out_.write(reinterpret_cast<const char*>(&header_), sizeof(header_));
    out_.close();
    if (!out_) fail("cannot write {}: disk full?", path_);
  }

 private:
  void flush() {
    out_.write(buffer_.data(), static_cast<std::streamsize>(buffer_.size()));
    buffer_.clear();
  }
  std::string path_;
  std::ofstream out_;
  Header header_{};
  std::string buffer_;
};

// Calls fn(byte) for every byte of data[begin, end), with CRLF -> LF when asked.
template <typename Fn>
void for_each_byte(const uint8_t* data, int64_t begin, int64_t end, bool crlf_to_lf, Fn&& fn) {
  for (int64_t i = begin; i < end; ++i) {
    if (crlf_to_lf && data[i] == '\r' && i + 1 < end && data[i + 1] == '\n') continue;
    fn(data[i]);
  }
}

}  // namespace

std::string Vocab::decode(int64_t id) const {
  if (id < 0 || id >= size()) return "?";
  if (bpe) return bpe->decode({id});
  const auto& t = tokens[id];
  if (word_level) return t == kEos ? "\n" : t + " ";
  if (t == kEos) return "\n";
  return std::string(1, static_cast<char>(std::stoi(t)));
}

std::vector<int64_t> Vocab::byte_to_id() const {
  std::vector<int64_t> map(256, -1);
  if (word_level || bpe) return map;  // no token is one byte of the text
  for (int64_t id = 0; id < size(); ++id) {
    if (tokens[id] == kEos) {
      map['\n'] = id;
    } else {
      map[std::stoi(tokens[id])] = id;
    }
  }
  return map;
}

Vocab read_vocab(const std::string& path) { return parse_vocab(read_file(path), path); }

std::string vocab_checksum(const std::string& text) {
  Sha256 hash;
  hash.add(text.data(), text.size());
  return hash.hex();
}

Vocab parse_vocab(const std::string& text, const std::string& path) {
  Vocab vocab;
  size_t start = 0, line_no = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string token = text.substr(start, end - start);
    ++line_no;
    start = end + 1;
    if (token == kEos) {
      vocab.tokens.push_back(token);
      continue;
    }
    bool digits = !token.empty() && token.size() <= 3 && token.find_first_not_of("0123456789") == std::string::npos;
    if (!digits || std::stoi(token) > 255)
      fail("{} line {}: expected a byte value 0..255 or <eos>, got '{}'", path, line_no, token);
    vocab.tokens.push_back(token);
  }
  if (vocab.tokens.empty()) fail("{} is empty: no vocabulary", path);
  auto map = vocab.byte_to_id();
  int64_t mapped = 0;
  for (auto id : map) mapped += id >= 0;
  if (mapped != vocab.size()) fail("{}: a token appears twice", path);
  return vocab;
}

std::string vocab_to_text(const Vocab& vocab) {
  std::string text;
  for (const auto& t : vocab.tokens) text += t + "\n";
  return text;
}

bool same_vocabulary(const Vocab& a, const Vocab& b) {
  if (a.tokens != b.tokens || a.word_level != b.word_level || !a.subwords != !b.subwords || !a.bpe != !b.bpe) return false;
  return a.model_bytes() == b.model_bytes();
}

std::string Vocab::model_bytes() const {
  return subwords ? subwords->proto() : bpe ? bpe->source() : std::string();
}

const char* vocab_level(const Vocab& vocab) {
  return vocab.subwords ? "sentencepiece" : vocab.bpe ? "bpe" : vocab.word_level ? "word" : "byte";
}

Vocab bpe_vocab(std::shared_ptr<const ByteBpe> bpe) {
  Vocab vocab;
  vocab.tokens = bpe->tokens();
  vocab.bpe = std::move(bpe);
  return vocab;
}

Vocab vocab_from_parts(const std::string& text, const std::string& level, const std::string& subword_model,
                       const std::string& origin) {
  if (level == "byte" || level.empty()) return parse_vocab(text, origin + " (vocabulary)");
  if (level == "word") return parse_word_vocab(text, origin + " (vocabulary)");
  if (level == "bpe") {
    Vocab vocab = bpe_vocab(ByteBpe::from_tokenizer_json(subword_model, origin + " (tokenizer)"));
    if (vocab_to_text(vocab) != text) fail("{}: the vocabulary is not the tokens of its tokenizer", origin);
    return vocab;
  }
  if (level != "sentencepiece") fail("{}: unknown vocabulary level '{}'", origin, level);
  Vocab vocab = parse_word_vocab(text, origin + " (vocabulary)");
  auto model = std::make_shared<const SubwordModel>(subword_model, origin + " (subword model)");
  if (model->pieces() != vocab.tokens) fail("{}: the vocabulary is not the pieces of its subword model", origin);
  vocab.subwords = std::move(model);
  return vocab;
}

PrepareStats prepare_bytes(const std::string& input, const std::string& out_dir, const PrepareOptions& options) {
  MappedFile file(input);
  if (file.size() == 0) fail("{} is empty: nothing to prepare", input);
  const uint8_t* data = file.data();
  const int64_t n_raw = static_cast<int64_t>(file.size());

  // Split points are defined on the (possibly CRLF-converted) byte stream: map them back to raw offsets.
  int64_t n = n_raw;
  if (options.crlf_to_lf) {
    for (int64_t i = 0; i + 1 < n_raw; ++i) n -= (data[i] == '\r' && data[i + 1] == '\n');
  }
  const int64_t v = n / 20;
  if (v == 0) fail("{} is too small to split ({} bytes; need at least 20)", input, n);
  const std::array<int64_t, 3> split_sizes = {n - 2 * v, v, v};
  std::array<int64_t, 4> raw_bounds{0, 0, 0, n_raw};
  {
    // Raw offsets where the converted stream reaches n - 2v and n - v bytes. A boundary never falls
    // inside a CRLF pair: the skipped '\r' does not advance the converted count.
    const int64_t targets[2] = {split_sizes[0], split_sizes[0] + split_sizes[1]};
    int64_t converted = 0;
    int next = 0;
    for (int64_t i = 0; i <= n_raw && next < 2; ++i) {
      while (next < 2 && converted == targets[next]) raw_bounds[1 + next++] = i;
      if (i == n_raw) break;
      bool skipped = options.crlf_to_lf && data[i] == '\r' && i + 1 < n_raw && data[i + 1] == '\n';
      converted += !skipped;
    }
  }

  // Pass 1: ids in order of first appearance in train (newline = <eos>, which also ends the split).
  std::vector<int64_t> byte_id(256, -1);
  Vocab vocab;
  auto add = [&](uint8_t b) {
    if (byte_id[b] < 0) {
      byte_id[b] = vocab.size();
      vocab.tokens.push_back(b == '\n' ? std::string(kEos) : std::to_string(b));
    }
  };
  for_each_byte(data, raw_bounds[0], raw_bounds[1], options.crlf_to_lf, add);
  add('\n');

  // Pass 2: write the three splits.
  make_dirs(out_dir);
  PrepareStats stats;
  stats.input_bytes = n_raw;
  stats.vocab_size = vocab.size();
  const char* names[3] = {"train", "valid", "test"};
  int64_t* counts[3] = {&stats.train_tokens, &stats.valid_tokens, &stats.test_tokens};
  for (int s = 0; s < 3; ++s) {
    std::string path = out_dir + "/" + names[s] + ".bin";
    write_atomic_with(path, [&](const std::string& tmp) {
      TokenWriter writer(tmp, vocab.size());
      for_each_byte(data, raw_bounds[s], raw_bounds[s + 1], options.crlf_to_lf, [&](uint8_t b) {
        if (byte_id[b] >= 0) {
          writer.put(byte_id[b]);
          ++*counts[s];
        } else {
          ++stats.dropped;
        }
      });
      writer.put(byte_id['\n']);
      ++*counts[s];
      writer.close();
    });
  }
  const std::string vocab_text = vocab_to_text(vocab);
  write_file_atomic(out_dir + "/vocab.txt", vocab_text);
  nlohmann::json meta = {{"source", input},          {"input_bytes", n_raw}, {"vocab_sha256", vocab_checksum(vocab_text)},
                         {"crlf_to_lf", options.crlf_to_lf}, {"vocab_size", stats.vocab_size},
                         {"train_tokens", stats.train_tokens}, {"valid_tokens", stats.valid_tokens},
                         {"test_tokens", stats.test_tokens},   {"dropped_bytes", stats.dropped}};
  write_file_atomic(out_dir + "/meta.json", meta.dump(1) + "\n");
  return stats;
}

void write_tokens(const std::string& path, const std::vector<int64_t>& ids, int64_t vocab_size) {
  write_atomic_with(path, [&](const std::string& tmp) {
    TokenWriter writer(tmp, vocab_size);
    for (auto id : ids) writer.put(id);
    writer.close();
  });
}

TokenFile::TokenFile(const std::string& path) : map_(path) {
  if (map_.size() == 0) fail("{} is empty (prepare the data again)", path);
  if (map_.size() < kHeaderBytes || std::memcmp(map_.data(), kMagic, 8) != 0)
    fail("{} is not a spanformer token file (bad header)", path);
  Header header;
  std::memcpy(&header, map_.data(), sizeof(header));
  if (header.bytes_per_token != 1 && header.bytes_per_token != 2 && header.bytes_per_token != 4)
    fail("{} is corrupt: {} bytes per token", path, header.bytes_per_token);
  bytes_per_token_ = header.bytes_per_token;
  const size_t body = map_.size() - kHeaderBytes;  // compared by division: a huge count cannot overflow
  if (body % bytes_per_token_ != 0 || header.count != body / bytes_per_token_)
    fail("{} is truncated or corrupt: header says {} tokens, file has {} bytes", path, header.count, map_.size());
  count_ = static_cast<int64_t>(header.count);
  vocab_size_ = header.vocab_size;
  if (count_ == 0) fail("{} holds no tokens", path);
  tokens_ = map_.data() + kHeaderBytes;
  if (bytes_per_token_ == 1 && vocab_size_ >= 256) return;  // every byte value is a valid id
  for (int64_t i = 0; i < count_; ++i) {
    if (at(i) >= vocab_size_) fail("{} is corrupt: token {} has id {} >= vocab size {}", path, i, at(i), vocab_size_);
  }
}

std::string TokenFile::fingerprint() const {
  Sha256 hash;
  hash.add(map_.data(), map_.size());
  return hash.hex();
}

TokenFile::TokenFile(const std::string& path, RawBytes, int64_t vocab_size) : map_(path) {
  if (map_.size() == 0) fail("{} is empty", path);
  tokens_ = map_.data();
  count_ = static_cast<int64_t>(map_.size());
  vocab_size_ = vocab_size;
  bytes_per_token_ = 1;
  for (int64_t i = 0; i < count_; ++i) {
    if (at(i) >= vocab_size_) fail("{}: token {} has id {} >= vocabulary size {}", path, i, at(i), vocab_size_);
  }
}

const TokenFile& Corpus::split(const std::string& name) const {
  if (name != "train" && name != "valid" && name != "test") fail("unknown split '{}' (train, valid or test)", name);
  const auto& ptr = name == "train" ? train : name == "valid" ? valid : test;
  if (!ptr) fail("split '{}' was not loaded from {}", name, dir);
  return *ptr;
}

Corpus load_corpus(const std::string& dir, const std::string& only_split) {
  Corpus corpus;
  corpus.dir = dir;
  if (file_exists(dir))
    fail("{} is a file; a prepared data directory is expected (spanformer data prepare FILE --out DIR)", dir);
  if (file_exists(dir + "/train-images-idx3-ubyte") || file_exists(dir + "/train-images-idx3-ubyte.gz"))
    fail("{} holds an IDX image set (the vit family's data); language models read a prepared text directory "
         "(spanformer data prepare FILE --out DIR)", dir);
  const bool words = !file_exists(dir + "/vocab.txt") && file_exists(dir + "/words.txt");
  if (!words && !file_exists(dir + "/vocab.txt"))
    fail("{}/vocab.txt not found: is '{}' a prepared data directory? (spanformer data prepare FILE --out DIR)", dir, dir);
  const std::string vocab_path = dir + (words ? "/words.txt" : "/vocab.txt");
  // The vocabulary as prepared: meta.json's checksum where it has one (directories prepared before it
  // was written are taken as they are).
  if (file_exists(dir + "/meta.json")) {
    const auto meta = parse_json_or_discarded(read_file(dir + "/meta.json"), dir + "/meta.json");
    if (meta.is_discarded() || !meta.is_object()) fail("{}/meta.json is not valid JSON (prepare the data again)", dir);
    if (meta.contains("vocab_sha256") && meta["vocab_sha256"] != vocab_checksum(read_file(vocab_path)))
      fail("{} was changed after the data was prepared (its checksum differs from meta.json's): prepare the data again",
           vocab_path);
  }
  corpus.vocab = words ? read_word_vocab(vocab_path) : read_vocab(vocab_path);
  auto load = [&](const char* name, std::unique_ptr<TokenFile>& slot) {
    if (!only_split.empty() && only_split != name) return;
    slot = std::make_unique<TokenFile>(dir + "/" + name + ".bin");
    if (slot->vocab_size() != corpus.vocab.size())
      fail("{}/{}.bin was prepared with {} tokens but {} has {}", dir, name, slot->vocab_size(),
           corpus.vocab.word_level ? "words.txt" : "vocab.txt", corpus.vocab.size());
  };
  if (!only_split.empty() && only_split != "train" && only_split != "valid" && only_split != "test")
    fail("unknown split '{}' (train, valid or test)", only_split);
  load("train", corpus.train);
  load("valid", corpus.valid);
  load("test", corpus.test);
  return corpus;
}

Streams::Streams(const TokenFile& tokens, int64_t batch) : tokens_(&tokens), batch_(batch) {
  length_ = tokens.size() / batch;
  if (length_ < 2) fail("{} has {} tokens: too few for {} streams", tokens.path(), tokens.size(), batch);
}

void Streams::block(int64_t pos, int64_t M, int64_t* inputs, int64_t* targets, int64_t first_stream,
                    int64_t nb_streams) const {
  if (nb_streams < 0) nb_streams = batch_ - first_stream;
  for (int64_t b = 0; b < nb_streams; ++b) {
    const int64_t base = (first_stream + b) * length_ + pos;
    for (int64_t t = 0; t < M; ++t) {
      inputs[b * M + t] = tokens_->at(base + t);
      targets[b * M + t] = tokens_->at(base + t + 1);
    }
  }
}

}  // namespace spanformer::data
