#include "spanformer/data/words.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "spanformer/data/corpus.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"

namespace spanformer::data {
namespace {

// Calls fn(word) for every whitespace-separated word of the file and fn("<eos>") at every line end.
template <typename Fn>
void for_each_word(const std::string& path, Fn&& fn) {
  MappedFile map(path);
  const char* p = reinterpret_cast<const char*>(map.data());
  const size_t n = map.size();
  size_t i = 0;
  while (i < n) {
    size_t end = i;
    while (end < n && p[end] != '\n') ++end;
    size_t k = i;
    while (k < end) {
      while (k < end && (p[k] == ' ' || p[k] == '\t' || p[k] == '\r')) ++k;
      size_t w = k;
      while (w < end && p[w] != ' ' && p[w] != '\t' && p[w] != '\r') ++w;
      if (w > k) fn(std::string_view(p + k, w - k));
      k = w;
    }
    fn(std::string_view(kEos));
    i = end + 1;
  }
}

}  // namespace

Vocab read_word_vocab(const std::string& path) { return parse_word_vocab(read_file(path), path); }

Vocab parse_word_vocab(const std::string& text, const std::string& path) {
  Vocab vocab;
  vocab.word_level = true;
  std::unordered_set<std::string> seen;
  size_t start = 0, line = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string word = text.substr(start, end - start);
    ++line;
    start = end + 1;
    if (word.empty() || word.find_first_of(" \t\r") != std::string::npos)
      fail("{} line {}: expected one word without spaces, got '{}'", path, line, word);
    if (!seen.insert(word).second) fail("{} line {}: '{}' appears twice", path, line, word);
    vocab.tokens.push_back(std::move(word));
  }
  if (vocab.tokens.empty()) fail("{} is empty: no vocabulary", path);
  return vocab;
}

WordPrepareStats prepare_words(const WordPrepareOptions& o, const std::string& out_dir) {
  for (const auto* f : {&o.train, &o.valid, &o.test})
    if (f->empty()) fail("data words: --train, --valid and --test files are all needed");
  for (const auto* f : {&o.train, &o.valid, &o.test}) {
    if (!file_exists(*f)) fail("{} not found", *f);
    if (MappedFile(*f).size() == 0) fail("{} is empty", *f);
  }
  if (o.min_freq < 0 || o.max_size < 0) fail("data words: --min-freq and --max-size must be >= 0");
  // Count, remembering first appearance for stable ties.
  std::unordered_map<std::string, std::pair<int64_t, int64_t>> counts;  // word -> (count, first index)
  int64_t order = 0;
  auto count = [&](std::string_view w) {
    if (w == kEos) return;
    auto [it, inserted] = counts.try_emplace(std::string(w), 0, order);
    if (inserted) ++order;
    ++it->second.first;
  };
  for_each_word(o.train, count);
  if (o.vocab_from_all) {
    for_each_word(o.valid, count);
    for_each_word(o.test, count);
  }
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return a.second.first != b.second.first ? a.second.first > b.second.first : a.second.second < b.second.second;
  });
  Vocab vocab;
  vocab.word_level = true;
  vocab.tokens.push_back(kEos);
  for (const auto& [word, c] : sorted) {
    if (o.min_freq > 0 && c.first < o.min_freq) break;
    if (o.max_size > 0 && vocab.size() >= o.max_size) break;
    vocab.tokens.push_back(word);
  }
  std::unordered_map<std::string, int64_t> index;
  for (int64_t i = 0; i < vocab.size(); ++i) index.emplace(vocab.tokens[i], i);
  if (!index.count(kUnk)) {
    index.emplace(kUnk, vocab.size());
    vocab.tokens.push_back(kUnk);
  }
  std::vector<int64_t> word_counts(vocab.tokens.size(), 0);  // occurrences in the training split
  const int64_t unk = index.at(kUnk);

  make_dirs(out_dir);
  WordPrepareStats stats;
  stats.vocab_size = vocab.size();
  stats.same_train_valid = o.train == o.valid;
  auto encode = [&](const std::string& input, const char* name, int64_t& tokens, int64_t& unknown, bool is_train) {
    std::vector<int64_t> ids;
    for_each_word(input, [&](std::string_view w) {
      auto it = index.find(std::string(w));
      const int64_t id = it == index.end() ? unk : it->second;
      if (it == index.end()) ++unknown;
      if (is_train) ++word_counts[id];
      ids.push_back(id);
    });
    tokens = static_cast<int64_t>(ids.size());
    write_tokens(out_dir + "/" + name + ".bin", ids, vocab.size());
  };
  encode(o.train, "train", stats.train_tokens, stats.train_unk, true);
  encode(o.valid, "valid", stats.valid_tokens, stats.valid_unk, false);
  encode(o.test, "test", stats.test_tokens, stats.test_unk, false);
  const std::string vocab_text = vocab_to_text(vocab);
  write_file_atomic(out_dir + "/words.txt", vocab_text);
  std::string counts_text;
  for (auto c : word_counts) counts_text += std::to_string(c) + "\n";
  write_file_atomic(out_dir + "/counts.txt", counts_text);
  nlohmann::json meta = {{"level", "word"},
                         {"train", o.train},
                         {"valid", o.valid},
                         {"test", o.test},
                         {"vocab_from", o.vocab_from_all ? "train+valid+test" : "train"},
                         {"vocab_size", stats.vocab_size},
                         {"vocab_sha256", vocab_checksum(vocab_text)},
                         {"tokens", {stats.train_tokens, stats.valid_tokens, stats.test_tokens}},
                         {"unk", {stats.train_unk, stats.valid_unk, stats.test_unk}}};
  write_file_atomic(out_dir + "/meta.json", meta.dump(1) + "\n");
  return stats;
}

std::vector<int64_t> read_word_counts(const std::string& dir) {
  const std::string path = dir + "/counts.txt";
  if (!file_exists(path)) fail("{} not found: is '{}' a word-level data directory (spanformer data words)?", path, dir);
  std::string text = read_file(path);
  std::vector<int64_t> counts;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string s = text.substr(start, end - start);
    if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos)
      fail("{}: '{}' is not a count", path, s.substr(0, 40));
    counts.push_back(std::stoll(s));
    start = end + 1;
  }
  return counts;
}

}  // namespace spanformer::data
