// How sentence pairs are prepared (data/pairs.h reads them; the seq2seq config's "data" section holds
// them) and the special token ids every seq2seq vocabulary starts with. Here, below both the data and
// the model layers, so that models need not include data.
#pragma once
#include <cstdint>
#include <string>

namespace spanformer::data {

inline constexpr int64_t kPadId = 0, kUnkId = 1, kBosId = 2, kEosId = 3;

// How sentences become tokens: words (data/pairs.h, step 2) or SentencePiece subwords (data/subwords.h)
// learned on the training split, one model for both sides.
enum class Tokenizer { kWords, kSentencePiece };
enum class SubwordKind { kUnigram, kBpe };  // SentencePiece's model types (Kudo 2018; Sennrich et al. 2016)
const char* tokenizer_name(Tokenizer t);
Tokenizer parse_tokenizer(const std::string& name);
const char* subword_kind_name(SubwordKind k);
SubwordKind parse_subword_kind(const std::string& name);

struct PairsOptions {
  int64_t source_column = 1;  // tab-separated field of the source sentence (fra.txt: 1 = French)
  int64_t target_column = 0;  // and of the target (0 = English)
  bool lowercase = true;
  int64_t max_length = 16;    // tokens per side, without <bos>/<eos>
  int64_t min_freq = 2;       // rarer training words become <unk> (words only)
  Tokenizer tokenizer = Tokenizer::kWords;
  SubwordKind subword_kind = SubwordKind::kUnigram;  // sentencepiece only
  int64_t subword_vocab = 8000;                      // sentencepiece: pieces, the 4 specials included
  int64_t valid_pairs = 2000, test_pairs = 5000;
  uint64_t split_seed = 1;
};

}  // namespace spanformer::data
