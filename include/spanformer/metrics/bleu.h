// BLEU (Papineni et al., 2002) as sacrebleu computes it (Post, 2018), so that figures here compare with
// published ones: corpus-level, n-grams of order 1..4, clipped counts, the brevity penalty against the
// closest reference length, sacrebleu's default "exp" smoothing, and the 13a tokenisation of mteval-v13a.
//
//   p_n = 100 correct_n / total_n;  a p_n with no match becomes 100 / (2^k total_n), k counting such n
//   BP = 1 if c >= r, else exp(1 - r / c)  (0 when c = 0);  c, r: hypothesis and reference token counts
//   BLEU = BP exp(mean_n log p_n), in [0, 100]; 0 when no n-gram matches at all or some total_n is 0.
//
// Whitespace is what Python's str.split() takes for it (the ASCII kinds and, in UTF-8, U+00A0, U+2000..
// U+200A, U+3000 and the other Unicode spaces). tests/python/test_oracles.py holds both functions to
// sacrebleu 2.6.0 itself on random lines and corpora (unicode, empty lines, long sentences) and on a
// trained model's fra-eng translations.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace spanformer::metrics {

// sacrebleu's "13a" tokenisation of one line: punctuation and symbols split off, periods and commas
// split off unless between digits, a dash after a digit split off; tokens joined by single spaces.
std::string tokenize_13a(const std::string& line);

struct BleuStats {
  std::array<int64_t, 4> correct{};  // clipped n-gram matches, n = 1..4
  std::array<int64_t, 4> total{};    // hypothesis n-grams
  int64_t sys_len = 0, ref_len = 0;  // tokens: hypotheses, closest references
};

struct Bleu {
  double score = 0;                  // 0..100
  std::array<double, 4> precisions{};
  double brevity_penalty = 0;
  BleuStats stats;
  // "BLEU 48.53 70.6/42.9/36.4/37.5 (BP 0.943, ratio 0.944, hyp_len 17, ref_len 18)", sacrebleu's layout.
  std::string text() const;
};

// Corpus BLEU of hypotheses against one or more reference streams (each stream as long as `hyps`,
// sacrebleu's layout). Lines are tokenised with 13a unless `tokenize` is false (then split at spaces).
Bleu corpus_bleu(const std::vector<std::string>& hyps, const std::vector<std::vector<std::string>>& refs,
                 bool tokenize = true);
// The score of corpus statistics (sums of several parts' stats: BLEU of a split scored by processes).
Bleu bleu_from_stats(const BleuStats& stats);

}  // namespace spanformer::metrics
