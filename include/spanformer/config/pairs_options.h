// How sentence pairs are prepared (data/pairs.h reads them; the seq2seq config's "data" section holds
// them) and the special token ids every seq2seq vocabulary starts with. Here, below both the data and
// the model layers, so that models need not include data.
#pragma once
#include <cstdint>

namespace spanformer::data {

inline constexpr int64_t kPadId = 0, kUnkId = 1, kBosId = 2, kEosId = 3;

struct PairsOptions {
  int64_t source_column = 1;  // tab-separated field of the source sentence (fra.txt: 1 = French)
  int64_t target_column = 0;  // and of the target (0 = English)
  bool lowercase = true;
  int64_t max_length = 16;    // tokens per side, without <bos>/<eos>
  int64_t min_freq = 2;       // rarer training words become <unk>
  int64_t valid_pairs = 2000, test_pairs = 5000;
  uint64_t split_seed = 1;
};

}  // namespace spanformer::data
