// Sentence pairs for translation (Tatoeba's English-French export, ../shared/data/fra-eng/fra.txt:
// `english<TAB>french` per line): normalisation, word tokenisation, a seeded train / valid / test split
// with the test part held out, and one joint vocabulary.
//
// Pipeline, every step deterministic (same file + same PairsOptions -> same ids on any machine):
//   1. normalise each side: non-breaking and thin spaces -> ' ', typographic quotes -> ASCII, Latin-1
//      capitals lower-cased when `lowercase`, whitespace collapsed;
//   2. tokenise: split at spaces; each of . , ! ? ; : " ( ) is a token of its own; a word with an
//      apostrophe is cut after it ("l'homme" -> "l'" "homme", "don't" -> "don'" "t");
//   3. keep pairs whose sides both have 1..max_length tokens;
//   4. shuffle with split_seed (Fisher-Yates on mt19937_64, the same on every standard library): the
//      first test_pairs are the test split, the next valid_pairs the valid split, the rest train;
//   5. tokenizer words: vocabulary counted on the training split only: <pad> <unk> <bos> <eos>, then the target side's
//      words seen >= min_freq times (by decreasing count, ties in order of first appearance), then the
//      source side's words not already there (same rule). Ids below target_vocab are the only ones a
//      decoder ever predicts; a shared embedding (encoder, decoder and output) is the table's first rows.
//      tokenizer sentencepiece: a subword model (data/subwords.h) learned on the training split's
//      normalised sentences, target then source of each pair; its pieces are the vocabulary, all of them
//      decoder outputs. Step 3 still counts words, so both tokenizers give the same three splits.
// detokenize() undoes step 2 for output text (attached punctuation, cut apostrophes joined again);
// decode_sentence() turns output ids into text under either tokenizer.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "spanformer/config/pairs_options.h"
#include "spanformer/data/corpus.h"

namespace spanformer::data {

struct SentencePair {
  std::string source, target;       // normalised text (the BLEU reference is the normalised target)
  std::vector<int64_t> src, tgt;    // token ids, no <bos>/<eos>
};

struct PairSet {
  std::vector<SentencePair> train, valid, test;
  Vocab vocab;                 // word_level (subwords set for sentencepiece); ids as in step 5
  int64_t target_vocab = 0;    // ids [0, target_vocab) are the decoder's outputs
  int64_t read_lines = 0, kept_pairs = 0;
  std::string fingerprint;     // SHA-256 of the file and the options: what a resumed run checks
  const std::vector<SentencePair>& split(const std::string& name) const;  // train | valid | test
};

// Reads and prepares `path` (one-line errors: missing or empty file, a line without the columns).
PairSet load_pairs(const std::string& path, const PairsOptions& options);

std::string normalize_sentence(const std::string& text, bool lowercase);
std::vector<std::string> tokenize_sentence(const std::string& normalised);
std::string detokenize(const std::vector<std::string>& tokens);

// Ids of a normalised sentence in `vocab` (words or subwords; unknown -> <unk>), tokens of ids (stops
// at <eos>, skips <pad> and <bos>), and the text of ids.
std::vector<int64_t> encode_sentence(const std::string& normalised, const Vocab& vocab);
std::vector<std::string> decode_ids(const std::vector<int64_t>& ids, const Vocab& vocab);
std::string decode_sentence(const std::vector<int64_t>& ids, const Vocab& vocab);

}  // namespace spanformer::data
