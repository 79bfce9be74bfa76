// GPT-2's byte-level BPE (data/byte_bpe.h has the steps and what holds them).
#include "spanformer/data/byte_bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <limits>
#include <mutex>

#include <nlohmann/json.hpp>

#include "spanformer/util/error.h"
#include "spanformer/util/io.h"

namespace spanformer::data {

namespace {

using json = nlohmann::json;

// GPT-2's pattern: contractions, letters, numbers, other symbols (each with one space before them), then
// whitespace (a run before a word leaves its last space to the word).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// GPT-2's bytes_to_unicode: the printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves, the
// other 68 for U+0100, U+0101, ... in byte order. Each as its UTF-8 text; and the way back.
struct ByteTable {
  std::array<std::string, 256> to_char;
  std::unordered_map<std::string, uint8_t> to_byte;
  ByteTable() {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_char[b] = utf8(printable ? b : next++);
      to_byte[to_char[b]] = static_cast<uint8_t>(b);
    }
  }
};
const ByteTable& byte_table() {
  static const ByteTable table;
  return table;
}

// The characters of a token (valid UTF-8, as the vocabulary stores it), one string each.
std::vector<std::string> characters(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

std::mutex cache_mutex;

}  // namespace

ByteBpe::~ByteBpe() {
  if (pattern_) pcre2_code_free(static_cast<pcre2_code*>(pattern_));
}

std::shared_ptr<const ByteBpe> ByteBpe::from_tokenizer_json(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: not JSON ({})", origin, e.what());
  }
  const auto& model = j.value("model", json::object());
  if (!model.is_object() || model.value("type", std::string()) != "BPE")
    fail("{}: the model is not BPE (this reads byte-level BPE tokenizers: GPT-2's kind)", origin);
  const auto& pre = j.value("pre_tokenizer", json());
  if (!pre.is_object() || pre.value("type", std::string()) != "ByteLevel" || !pre.value("use_regex", true))
    fail("{}: the pre-tokenizer is not GPT-2's ByteLevel with its pattern (got {}): other tokenizers are not read",
         origin, pre.is_object() ? pre.value("type", std::string("?")) : std::string("none"));
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    fail("{}: a normalizer ({}) is not read: GPT-2's tokenizer has none", origin, j["normalizer"].value("type", std::string("?")));
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty())
      fail("{}: model.{} is set: GPT-2's BPE has none", origin, key);
  if (model.contains("dropout") && model["dropout"].is_number() && model["dropout"].get<double>() > 0)
    fail("{}: BPE dropout is set: encoding would be random", origin);
  std::shared_ptr<ByteBpe> bpe(new ByteBpe());
  bpe->source_ = text;
  bpe->add_prefix_space_ = pre.value("add_prefix_space", false);
  const auto& vocab = model.value("vocab", json::object());
  if (!vocab.is_object() || vocab.empty()) fail("{}: model.vocab is missing or empty", origin);
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0) fail("{}: vocabulary id of '{}' is not an integer >= 0", origin, token);
    bpe->ids_[token] = id.get<int64_t>();
  }
  int64_t rank = 0;
  for (const auto& m : model.value("merges", json::array())) {
    std::pair<std::string, std::string> pair;
    if (m.is_string()) {
      const auto text_m = m.get<std::string>();
      const auto space = text_m.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 >= text_m.size())
        fail("{}: merge {} '{}' is not two tokens", origin, rank, text_m);
      pair = {text_m.substr(0, space), text_m.substr(space + 1)};
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      pair = {m[0].get<std::string>(), m[1].get<std::string>()};
    } else {
      fail("{}: merge {} is neither \"a b\" nor [\"a\", \"b\"]", origin, rank);
    }
    bpe->ranks_.emplace(std::move(pair), rank++);
  }
  for (const auto& t : j.value("added_tokens", json::array())) {
    if (!t.is_object() || !t.contains("content") || !t["content"].is_string() || !t.contains("id") ||
        !t["id"].is_number_integer() || t["id"].get<int64_t>() < 0)
      fail("{}: an added token without content or id", origin);
    bpe->added_.emplace_back(t["content"].get<std::string>(), t["id"].get<int64_t>());
    bpe->ids_[t["content"].get<std::string>()] = t["id"].get<int64_t>();
  }
  bpe->finish(origin);
  return bpe;
}

std::shared_ptr<const ByteBpe> ByteBpe::from_vocab_and_merges(const std::string& vocab_json, const std::string& merges,
                                                              const std::string& origin) {
  json tokenizer = {{"model", {{"type", "BPE"}, {"merges", json::array()}}},
                    {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}}};
  try {
    tokenizer["model"]["vocab"] = json::parse(vocab_json);
  } catch (const json::exception& e) {
    fail("{}: vocab.json is not JSON ({})", origin, e.what());
  }
  size_t start = 0;
  while (start < merges.size()) {
    size_t end = merges.find('\n', start);
    if (end == std::string::npos) end = merges.size();
    std::string line = merges.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty() && line.rfind("#version", 0) != 0) tokenizer["model"]["merges"].push_back(line);
    start = end + 1;
  }
  // GPT-2's one special token, cut out before the pattern as tokenizers' GPT2Tokenizer does.
  if (tokenizer["model"]["vocab"].is_object() && tokenizer["model"]["vocab"].contains("<|endoftext|>"))
    tokenizer["added_tokens"] = json::array({{{"content", "<|endoftext|>"}, {"id", tokenizer["model"]["vocab"]["<|endoftext|>"]}}});
  return from_tokenizer_json(tokenizer.dump(), origin);
}

void ByteBpe::finish(const std::string& origin) {
  int64_t largest = -1;
  for (const auto& [token, id] : ids_) largest = std::max(largest, id);
  if (largest + 1 != static_cast<int64_t>(ids_.size()))
    fail("{}: the ids are not 0 .. {} (the largest is {})", origin, static_cast<int64_t>(ids_.size()) - 1, largest);
  tokens_.assign(static_cast<size_t>(largest + 1), std::string());
  for (const auto& [token, id] : ids_) {
    if (!tokens_[static_cast<size_t>(id)].empty() && tokens_[static_cast<size_t>(id)] != token)
      fail("{}: id {} is given to two tokens ('{}' and '{}')", origin, id, tokens_[static_cast<size_t>(id)], token);
    tokens_[static_cast<size_t>(id)] = token;
  }
  for (size_t id = 0; id < tokens_.size(); ++id)
    if (tokens_[id].empty()) fail("{}: the ids are not 0 .. {}: id {} has no token", origin, largest, id);
  for (const auto& [pair, rank] : ranks_)
    if (!ids_.count(pair.first + pair.second))
      fail("{}: merge {} ('{}' '{}') makes a token the vocabulary lacks", origin, rank, pair.first, pair.second);
  std::sort(added_.begin(), added_.end(), [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  int error = 0;
  PCRE2_SIZE offset = 0;
  pattern_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern), PCRE2_ZERO_TERMINATED,
                           PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
  if (!pattern_) fail("byte-level BPE: the pattern does not compile (PCRE2 error {} at {})", error, offset);
  pcre2_jit_compile(static_cast<pcre2_code*>(pattern_), PCRE2_JIT_COMPLETE);  // where JIT is there; else interpreted
}

// One word's bytes -> ids: its bytes as characters, then merges of the lowest rank first.
void ByteBpe::encode_word(const std::string& bytes, std::vector<int64_t>& out) const {
  {
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (auto it = cache_.find(bytes); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const auto& table = byte_table();
  std::vector<std::string> parts;
  for (unsigned char b : bytes) parts.push_back(table.to_char[b]);
  while (parts.size() > 1) {
    int64_t best = std::numeric_limits<int64_t>::max();
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i)
      if (auto it = ranks_.find({parts[i], parts[i + 1]}); it != ranks_.end() && it->second < best) {
        best = it->second;
        at = i;
      }
    if (best == std::numeric_limits<int64_t>::max()) break;
    const std::string left = parts[at], right = parts[at + 1];
    std::vector<std::string> merged;  // every occurrence of the pair, left to right
    for (size_t i = 0; i < parts.size();) {
      if (i + 1 < parts.size() && parts[i] == left && parts[i + 1] == right) {
        merged.push_back(left + right);
        i += 2;
      } else {
        merged.push_back(parts[i++]);
      }
    }
    parts = std::move(merged);
  }
  std::vector<int64_t> ids;
  for (const auto& p : parts) {
    auto it = ids_.find(p);
    if (it == ids_.end()) fail("byte-level BPE: the piece '{}' is not in the vocabulary (a byte the tokenizer lacks)", p);
    ids.push_back(it->second);
  }
  std::lock_guard<std::mutex> lock(cache_mutex);
  if (cache_.size() < 100000) cache_.emplace(bytes, ids);
  out.insert(out.end(), ids.begin(), ids.end());
}

// Text without added tokens: the pattern's words, and each run of bytes it cannot read (not UTF-8) a
// word of its own.
void ByteBpe::encode_plain(const std::string& raw, std::vector<int64_t>& out) const {
  const std::string text = add_prefix_space_ && !raw.empty() && raw[0] != ' ' ? " " + raw : raw;
  auto* code = static_cast<pcre2_code*>(pattern_);
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t at = 0;
  while (at < text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), at, 0, match, nullptr);
    if (rc < 0) {  // nothing more the pattern reads: the rest is one word
      encode_word(text.substr(at), out);
      break;
    }
    const PCRE2_SIZE* span = pcre2_get_ovector_pointer(match);
    if (span[0] > at) encode_word(text.substr(at, span[0] - at), out);  // bytes no pattern item reads
    if (span[1] == span[0]) {  // an empty match cannot happen with this pattern; never loop on one
      encode_word(text.substr(span[0], 1), out);
      at = span[0] + 1;
      continue;
    }
    encode_word(text.substr(span[0], span[1] - span[0]), out);
    at = span[1];
  }
  pcre2_match_data_free(match);
}

std::vector<int64_t> ByteBpe::encode(const std::string& text) const {
  std::vector<int64_t> out;
  size_t start = 0, i = 0;
  while (i < text.size()) {
    const auto hit = std::find_if(added_.begin(), added_.end(),
                                  [&](const auto& a) { return !a.first.empty() && text.compare(i, a.first.size(), a.first) == 0; });
    if (hit == added_.end()) {
      ++i;
      continue;
    }
    if (i > start) encode_plain(text.substr(start, i - start), out);
    out.push_back(hit->second);
    i += hit->first.size();
    start = i;
  }
  if (start < text.size()) encode_plain(text.substr(start), out);
  return out;
}

std::string ByteBpe::decode(const std::vector<int64_t>& ids) const {
  const auto& table = byte_table();
  std::string out;
  for (int64_t id : ids) {
    if (id < 0 || id >= size()) fail("byte-level BPE: id {} is outside the vocabulary (0 .. {})", id, size() - 1);
    const std::string& token = tokens_[static_cast<size_t>(id)];
    if (std::any_of(added_.begin(), added_.end(), [&](const auto& a) { return a.second == id; })) {
      out += token;
      continue;
    }
    for (const auto& c : characters(token)) {
      auto it = table.to_byte.find(c);
      if (it == table.to_byte.end()) fail("byte-level BPE: token {} ('{}') holds a character that is no byte", id, token);
      out += static_cast<char>(it->second);
    }
  }
  return out;
}

int64_t ByteBpe::end_of_text() const {
  for (const auto& [text, id] : added_)
    if (text == "<|endoftext|>") return id;
  return -1;
}

std::shared_ptr<const ByteBpe> load_byte_bpe(const std::string& path) {
  if (!std::filesystem::exists(path)) fail("{}: no such file or directory (a tokenizer.json, or a directory holding one)", path);
  if (!std::filesystem::is_directory(path)) return ByteBpe::from_tokenizer_json(read_file(path), path);
  if (file_exists(path + "/tokenizer.json")) return ByteBpe::from_tokenizer_json(read_file(path + "/tokenizer.json"), path + "/tokenizer.json");
  if (file_exists(path + "/vocab.json") && file_exists(path + "/merges.txt"))
    return ByteBpe::from_vocab_and_merges(read_file(path + "/vocab.json"), read_file(path + "/merges.txt"),
                                          path + "/vocab.json + merges.txt");
  fail("{}: holds neither tokenizer.json nor vocab.json + merges.txt (GPT-2's tokenizer files)", path);
}

}  // namespace spanformer::data
