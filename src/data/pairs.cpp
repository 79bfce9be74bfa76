#include "spanformer/data/pairs.h"

#include <algorithm>
#include <random>
#include <unordered_map>

#include <fmt/format.h>

#include "spanformer/data/subwords.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"

namespace spanformer::data {
namespace {

const char* const kSpecials[] = {"<pad>", "<unk>", "<bos>", kEos};  // ids kPadId .. kEosId

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_punct(char c) {
  return c == '.' || c == ',' || c == '!' || c == '?' || c == ';' || c == ':' || c == '"' || c == '(' || c == ')';
}

// Word counts in order of first appearance.
struct Counter {
  std::unordered_map<std::string, size_t> index;
  std::vector<std::pair<std::string, int64_t>> items;
  void add(const std::string& w) {
    auto [it, fresh] = index.emplace(w, items.size());
    if (fresh) items.emplace_back(w, 0);
    ++items[it->second].second;
  }
  // Words seen >= min_freq times, by decreasing count, ties in first-appearance order.
  std::vector<std::string> kept(int64_t min_freq) const {
    std::vector<size_t> order;
    for (size_t i = 0; i < items.size(); ++i)
      if (items[i].second >= min_freq) order.push_back(i);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return items[a].second > items[b].second; });
    std::vector<std::string> out;
    for (size_t i : order) out.push_back(items[i].first);
    return out;
  }
};

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> out(1);
  for (char c : line) {
    if (c == '\t')
      out.emplace_back();
    else
      out.back() += c;
  }
  return out;
}

}  // namespace

const std::vector<SentencePair>& PairSet::split(const std::string& name) const {
  if (name == "train") return train;
  if (name == "valid") return valid;
  if (name == "test") return test;
  fail("unknown split '{}' (train, valid or test)", name);
}

std::string normalize_sentence(const std::string& text, bool lowercase) {
  std::string s;
  s.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    const auto next = [&](size_t k) { return i + k < text.size() ? static_cast<unsigned char>(text[i + k]) : 0; };
    if (c == 0xC2 && next(1) == 0xA0) {  // U+00A0 no-break space
      s += ' ', i += 1;
    } else if (c == 0xC2 && (next(1) == 0xAB || next(1) == 0xBB)) {  // « »
      s += '"', i += 1;
    } else if (c == 0xE2 && next(1) == 0x80 && (next(2) == 0xAF || next(2) == 0x89 || next(2) == 0x8B)) {
      s += ' ', i += 2;  // U+202F narrow no-break, U+2009 thin, U+200B zero-width
    } else if (c == 0xE2 && next(1) == 0x80 && (next(2) == 0x98 || next(2) == 0x99)) {
      s += '\'', i += 2;  // ‘ ’
    } else if (c == 0xE2 && next(1) == 0x80 && (next(2) == 0x9C || next(2) == 0x9D)) {
      s += '"', i += 2;  // “ ”
    } else if (c == 0xE2 && next(1) == 0x80 && next(2) == 0xA6) {
      s += "...", i += 2;  // …
    } else if (lowercase && c == 0xC3 && next(1) >= 0x80 && next(1) <= 0x9E && next(1) != 0x97) {
      s += static_cast<char>(c), s += static_cast<char>(next(1) + 0x20), i += 1;  // À..Þ -> à..þ (not ×)
    } else if (lowercase && c == 0xC5 && next(1) == 0x92) {
      s += static_cast<char>(c), s += static_cast<char>(0x93), i += 1;  // Œ -> œ
    } else if (lowercase && c >= 'A' && c <= 'Z') {
      s += static_cast<char>(c + 32);
    } else {
      s += static_cast<char>(c);
    }
  }
  std::string out;  // collapse and trim whitespace
  for (char c : s) {
    if (is_space(c)) {
      if (!out.empty() && out.back() != ' ') out += ' ';
    } else {
      out += c;
    }
  }
  if (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

std::vector<std::string> tokenize_sentence(const std::string& normalised) {
  std::vector<std::string> tokens;
  std::string word;
  auto flush = [&] {
    if (word.empty()) return;
    const size_t apostrophe = word.find('\'');
    if (apostrophe != std::string::npos && apostrophe > 0 && apostrophe + 1 < word.size()) {
      tokens.push_back(word.substr(0, apostrophe + 1));
      tokens.push_back(word.substr(apostrophe + 1));
    } else {
      tokens.push_back(word);
    }
    word.clear();
  };
  for (char c : normalised) {
    if (is_space(c)) {
      flush();
    } else if (is_punct(c)) {
      flush();
      tokens.emplace_back(1, c);
    } else {
      word += c;
    }
  }
  flush();
  return tokens;
}

std::string detokenize(const std::vector<std::string>& tokens) {
  std::string out;
  bool glue = true;  // no space before the next token
  for (const auto& t : tokens) {
    const bool closing = t.size() == 1 && (t[0] == '.' || t[0] == ',' || t[0] == '!' || t[0] == '?' || t[0] == ';' ||
                                           t[0] == ':' || t[0] == ')');
    if (!glue && !closing) out += ' ';
    out += t;
    glue = t == "(" || (t.size() > 1 && t.back() == '\'');
  }
  return out;
}

std::vector<int64_t> encode_sentence(const std::string& normalised, const Vocab& vocab) {
  if (vocab.subwords) return vocab.subwords->encode(normalised);
  std::unordered_map<std::string, int64_t> id;
  for (size_t i = 0; i < vocab.tokens.size(); ++i) id.emplace(vocab.tokens[i], static_cast<int64_t>(i));
  std::vector<int64_t> out;
  for (const auto& w : tokenize_sentence(normalised)) {
    auto it = id.find(w);
    out.push_back(it == id.end() ? kUnkId : it->second);
  }
  return out;
}

std::vector<std::string> decode_ids(const std::vector<int64_t>& ids, const Vocab& vocab) {
  std::vector<std::string> out;
  for (int64_t i : ids) {
    if (i == kEosId) break;
    if (i == kPadId || i == kBosId) continue;
    if (i < 0 || i >= vocab.size()) fail("decode: token id {} is outside the vocabulary of {}", i, vocab.size());
    out.push_back(vocab.tokens[static_cast<size_t>(i)]);
  }
  return out;
}

std::string decode_sentence(const std::vector<int64_t>& ids, const Vocab& vocab) {
  if (vocab.subwords) return vocab.subwords->decode(ids);
  return detokenize(decode_ids(ids, vocab));
}

PairSet load_pairs(const std::string& path, const PairsOptions& o) {
  if (o.source_column < 0 || o.target_column < 0 || o.source_column == o.target_column)
    fail("{}: source_column and target_column must be two different fields (got {} and {})", path, o.source_column,
         o.target_column);
  if (o.max_length < 1) fail("{}: max_length must be positive (got {})", path, o.max_length);
  if (o.min_freq < 1) fail("{}: min_freq must be at least 1 (got {})", path, o.min_freq);
  if (o.valid_pairs < 1 || o.test_pairs < 1)
    fail("{}: valid_pairs and test_pairs must be positive (got {} and {})", path, o.valid_pairs, o.test_pairs);
  require_file(path, " (the seq2seq family reads one file of tab-separated sentence pairs)");
  const std::string text = read_file(path);
  if (text.empty()) fail("{}: the file is empty", path);

  struct Raw {
    std::vector<std::string> src, tgt;
    std::string source, target;
  };
  std::vector<Raw> kept;
  PairSet set;
  const size_t need = static_cast<size_t>(std::max(o.source_column, o.target_column)) + 1;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    ++set.read_lines;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    auto fields = split_tabs(line);
    if (fields.size() < need)
      fail("{}:{}: {} tab-separated field(s), the config reads field {}: not a file of sentence pairs", path,
           set.read_lines, fields.size(), need - 1);
    Raw r;
    r.source = normalize_sentence(fields[static_cast<size_t>(o.source_column)], o.lowercase);
    r.target = normalize_sentence(fields[static_cast<size_t>(o.target_column)], o.lowercase);
    r.src = tokenize_sentence(r.source);
    r.tgt = tokenize_sentence(r.target);
    const auto n = static_cast<int64_t>(r.src.size()), m = static_cast<int64_t>(r.tgt.size());
    if (n < 1 || m < 1 || n > o.max_length || m > o.max_length) continue;
    kept.push_back(std::move(r));
  }
  set.kept_pairs = static_cast<int64_t>(kept.size());
  if (set.kept_pairs < o.valid_pairs + o.test_pairs + 1)
    fail("{}: {} pairs of 1..{} tokens, too few for {} valid and {} test pairs and a training split", path,
         set.kept_pairs, o.max_length, o.valid_pairs, o.test_pairs);

  std::mt19937_64 rng(o.split_seed);  // Fisher-Yates with a plain modulo: identical on every library
  std::vector<size_t> order(kept.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[rng() % (i + 1)]);
  const auto n_test = static_cast<size_t>(o.test_pairs), n_valid = static_cast<size_t>(o.valid_pairs);

  Sha256 sha;
  sha.add(text);
  sha.add(fmt::format("pairs v1 {} {} {} {} {} {} {} {}", o.source_column, o.target_column, o.lowercase, o.max_length,
                      o.min_freq, o.valid_pairs, o.test_pairs, o.split_seed));
  if (o.tokenizer == Tokenizer::kSentencePiece) {
    sha.add(fmt::format("sentencepiece {} {}", subword_kind_name(o.subword_kind), o.subword_vocab));
    set.fingerprint = sha.hex();
    std::vector<std::string> sentences;  // the training split, target then source of each pair
    for (size_t k = n_test + n_valid; k < order.size(); ++k) {
      sentences.push_back(kept[order[k]].target);
      sentences.push_back(kept[order[k]].source);
    }
    auto model = std::make_shared<const SubwordModel>(learn_subwords(sentences, o.subword_kind, o.subword_vocab, path),
                                                      path + " (learned subwords)");
    set.vocab.tokens = model->pieces();
    set.vocab.word_level = true;
    set.vocab.subwords = model;
    set.target_vocab = set.vocab.size();  // every piece can be an output
    for (size_t k = 0; k < order.size(); ++k) {
      Raw& r = kept[order[k]];
      SentencePair p{std::move(r.source), std::move(r.target), {}, {}};
      p.src = model->encode(p.source);
      p.tgt = model->encode(p.target);
      (k < n_test ? set.test : k < n_test + n_valid ? set.valid : set.train).push_back(std::move(p));
    }
    return set;
  }
  set.fingerprint = sha.hex();

  Counter src_count, tgt_count;
  for (size_t k = n_test + n_valid; k < order.size(); ++k) {
    for (const auto& w : kept[order[k]].tgt) tgt_count.add(w);
    for (const auto& w : kept[order[k]].src) src_count.add(w);
  }
  std::unordered_map<std::string, int64_t> id;
  auto add_word = [&](const std::string& w) {
    if (id.emplace(w, set.vocab.size()).second) set.vocab.tokens.push_back(w);
  };
  for (const char* s : kSpecials) add_word(s);
  for (const auto& w : tgt_count.kept(o.min_freq)) add_word(w);
  set.target_vocab = set.vocab.size();
  for (const auto& w : src_count.kept(o.min_freq)) add_word(w);
  set.vocab.word_level = true;

  auto ids = [&](const std::vector<std::string>& words) {
    std::vector<int64_t> out;
    for (const auto& w : words) {
      auto it = id.find(w);
      out.push_back(it == id.end() ? kUnkId : it->second);
    }
    return out;
  };
  auto target_ids = [&](const std::vector<std::string>& words) {  // source-only words are <unk> to a decoder
    auto out = ids(words);
    for (auto& i : out)
      if (i >= set.target_vocab) i = kUnkId;
    return out;
  };
  for (size_t k = 0; k < order.size(); ++k) {
    Raw& r = kept[order[k]];
    SentencePair p{std::move(r.source), std::move(r.target), ids(r.src), target_ids(r.tgt)};
    (k < n_test ? set.test : k < n_test + n_valid ? set.valid : set.train).push_back(std::move(p));
  }

  return set;
}

}  // namespace spanformer::data
