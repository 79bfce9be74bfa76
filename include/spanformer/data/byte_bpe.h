// GPT-2's tokenizer: byte-level byte-pair encoding (Radford et al., 2019, "Language Models are
// Unsupervised Multitask Learners", section 2.2), as Hugging Face's `tokenizers` runs it from a
// tokenizer.json ("model": BPE, "pre_tokenizer": ByteLevel) or from GPT-2's vocab.json + merges.txt.
//
// Encoding, in three steps:
//   1. added tokens ("<|endoftext|>" and the like, tokenizer.json's added_tokens) are cut out first and
//      become their own ids;
//   2. the rest is split into words by GPT-2's pattern
//          's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (PCRE2, Unicode properties; a space joins the word after it, a run of spaces keeps its last
//      space for the next word). Bytes that are not UTF-8 match no letter, number or space: each run of
//      them is a word of its own, so that any bytes encode and decode(encode(x)) == x;
//   3. each word's bytes become characters by GPT-2's byte-to-unicode table (printable bytes stand for
//      themselves, the others for U+0100 onwards), and merges join neighbours, the pair of lowest rank
//      first, until no pair of the word has a rank; each piece is a vocabulary token.
// Decoding joins the tokens' characters and maps them back to bytes.
//
// Held to the `tokenizers` library (tests/python/test_oracles.py) on tokenizers it trains: the same ids
// for text with unicode, runs of whitespace, contractions and digits, and decode(encode(x)) == x for
// any bytes.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace spanformer::data {

class ByteBpe {
 public:
  // From a tokenizer.json's text, or from vocab.json and merges.txt; `origin` names the file(s) in errors.
  static std::shared_ptr<const ByteBpe> from_tokenizer_json(const std::string& text, const std::string& origin);
  static std::shared_ptr<const ByteBpe> from_vocab_and_merges(const std::string& vocab_json, const std::string& merges,
                                                              const std::string& origin);
  ~ByteBpe();

  std::vector<int64_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int64_t>& ids) const;  // added tokens as their text
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  // id -> token as the vocabulary writes it (byte-to-unicode characters; added tokens as their text).
  const std::vector<std::string>& tokens() const { return tokens_; }
  // The tokenizer.json it was read from (vocab.json + merges.txt written as one): what checkpoints keep.
  const std::string& source() const { return source_; }
  // The id of GPT-2's "<|endoftext|>", or -1 where the tokenizer has none.
  int64_t end_of_text() const;

 private:
  ByteBpe() = default;
  void finish(const std::string& origin);
  void encode_word(const std::string& bytes, std::vector<int64_t>& out) const;
  void encode_plain(const std::string& text, std::vector<int64_t>& out) const;

  std::string source_;
  std::vector<std::string> tokens_;                      // id -> token
  std::unordered_map<std::string, int64_t> ids_;         // token -> id
  std::map<std::pair<std::string, std::string>, int64_t> ranks_;  // merge -> rank
  std::vector<std::pair<std::string, int64_t>> added_;   // added tokens, longest first
  bool add_prefix_space_ = false;
  void* pattern_ = nullptr;                              // the compiled pattern (pcre2_code_8)
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache_;  // word -> ids (one thread)
};

// A tokenizer from a path: a tokenizer.json, or a directory holding tokenizer.json (preferred) or
// vocab.json and merges.txt. One-line errors name what is missing.
std::shared_ptr<const ByteBpe> load_byte_bpe(const std::string& path);

}  // namespace spanformer::data
