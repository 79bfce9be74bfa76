// Word-level corpora in the WikiText layout (wiki.{train,valid,test}.tokens), prepared as the
// Transformer-XL reference reads them (kimiyoung/transformer-xl, utils/vocabulary.py):
//   - every line is split on whitespace and ends with "<eos>" (empty lines give a lone "<eos>");
//   - the vocabulary is counted on the training split (or on all splits, which is what the reference
//     does for WikiText-2 and PTB), then sorted by decreasing count, ties in order of first
//     appearance, with "<eos>" first;
//   - words absent from the vocabulary (min_freq, max_size, or unseen in the counted splits) become
//     "<unk>", which is added to the vocabulary when the data do not already contain it.
// Output: words.txt (one word per line, id order), counts.txt (the count of each word, same order),
// {train,valid,test}.bin token files, meta.json.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace spanformer::data {

inline constexpr const char* kUnk = "<unk>";

struct WordPrepareOptions {
  std::string train, valid, test;  // input files
  bool vocab_from_all = false;     // count valid and test too (the reference's WikiText-2 rule)
  int64_t min_freq = 0;            // words seen fewer times become <unk>
  int64_t max_size = 0;            // keep at most this many words (0 = all)
};

struct WordPrepareStats {
  int64_t vocab_size = 0;
  int64_t train_tokens = 0, valid_tokens = 0, test_tokens = 0;
  int64_t train_unk = 0, valid_unk = 0, test_unk = 0;  // tokens mapped to <unk> that were other words
  bool same_train_valid = false;                        // train and valid are the same file
};

WordPrepareStats prepare_words(const WordPrepareOptions& options, const std::string& out_dir);

// Word counts of a prepared directory (counts.txt), in vocabulary order.
std::vector<int64_t> read_word_counts(const std::string& dir);

}  // namespace spanformer::data
