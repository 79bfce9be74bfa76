// BLEU and the 13a tokenisation (formulas and conventions: include/spanformer/metrics/bleu.h).
#include "spanformer/metrics/bleu.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <unordered_map>

#include <fmt/format.h>

#include "spanformer/util/error.h"

namespace spanformer::metrics {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f'); }

// Bytes of the whitespace character starting at s[i] (0: none), as Python's str.split() sees
// whitespace: the ASCII ones above and, in UTF-8, U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028,
// U+2029, U+202F, U+205F and U+3000.
size_t space_at(const std::string& s, size_t i) {
  const auto byte = [&](size_t k) { return k < s.size() ? static_cast<unsigned char>(s[k]) : 0u; };
  const unsigned a = byte(i), b = byte(i + 1), c = byte(i + 2);
  if (is_space(s[i])) return 1;
  if (a == 0xC2 && (b == 0x85 || b == 0xA0)) return 2;
  if (a == 0xE1 && b == 0x9A && c == 0x80) return 3;
  if (a == 0xE2 && b == 0x80 && ((c >= 0x80 && c <= 0x8A) || c == 0xA8 || c == 0xA9 || c == 0xAF)) return 3;
  if (a == 0xE2 && b == 0x81 && c == 0x9F) return 3;
  if (a == 0xE3 && b == 0x80 && c == 0x80) return 3;
  return 0;
}

// Python's str.rstrip(): trailing whitespace (of space_at's kinds) removed.
std::string rstrip(const std::string& s) {
  size_t end = 0;
  for (size_t i = 0; i < s.size();) {
    const size_t n = space_at(s, i);
    if (n == 0) end = ++i;
    else i += n;
  }
  return s.substr(0, end);
}

// mteval's symbol class [{-~[-` -&(-+:-@/]: the ASCII punctuation except ' , - . (and digits, letters).
bool is_13a_symbol(char c) {
  return (c >= '{' && c <= '~') || (c >= '[' && c <= '`') || (c >= ' ' && c <= '&') || (c >= '(' && c <= '+') ||
         (c >= ':' && c <= '@') || c == '/';
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

// One pass of a two-character pattern (a, b) -> a' b', left to right without overlaps, as Python's
// re.sub does for the fixed-width patterns of 13a.
template <typename Match, typename Emit>
std::string substitute_pairs(const std::string& s, Match match, Emit emit) {
  std::string out;
  out.reserve(s.size() * 2);
  size_t i = 0;
  while (i < s.size()) {
    if (i + 1 < s.size() && match(s[i], s[i + 1])) {
      emit(out, s[i], s[i + 1]);
      i += 2;
    } else {
      out += s[i++];
    }
  }
  return out;
}

std::vector<std::string> split_words(const std::string& s) {
  std::vector<std::string> words;
  size_t i = 0;
  while (i < s.size()) {
    for (size_t n; i < s.size() && (n = space_at(s, i)) > 0;) i += n;
    const size_t start = i;
    while (i < s.size() && space_at(s, i) == 0) ++i;
    if (i > start) words.push_back(s.substr(start, i - start));
  }
  return words;
}

// n-gram -> count, the n-gram's words joined by '\x01' (never inside a word).
std::unordered_map<std::string, int64_t> ngram_counts(const std::vector<std::string>& words, size_t n) {
  std::unordered_map<std::string, int64_t> counts;
  for (size_t i = 0; i + n <= words.size(); ++i) {
    std::string key = words[i];
    for (size_t j = 1; j < n; ++j) key += '\x01' + words[i + j];
    ++counts[key];
  }
  return counts;
}

}  // namespace

std::string tokenize_13a(const std::string& input) {
  if (input.empty()) return "";
  std::string line = replace_all(input, "<skipped>", "");
  line = replace_all(line, "-\n", "");
  std::replace(line.begin(), line.end(), '\n', ' ');
  if (line.find('&') != std::string::npos) {
    line = replace_all(line, "&quot;", "\"");
    line = replace_all(line, "&amp;", "&");
    line = replace_all(line, "&lt;", "<");
    line = replace_all(line, "&gt;", ">");
  }
  line = " " + line + " ";
  std::string spaced;
  for (char c : line) {
    if (is_13a_symbol(c)) {
      spaced += ' ';
      spaced += c;
      spaced += ' ';
    } else {
      spaced += c;
    }
  }
  auto period_comma = [](char c) { return c == '.' || c == ','; };
  // Periods and commas unless preceded by a digit: ([^0-9])([.,]) -> "\1 \2 ".
  spaced = substitute_pairs(spaced, [&](char a, char b) { return !is_digit(a) && period_comma(b); },
                            [](std::string& o, char a, char b) { o += a; o += ' '; o += b; o += ' '; });
  // ... unless followed by a digit: ([.,])([^0-9]) -> " \1 \2".
  spaced = substitute_pairs(spaced, [&](char a, char b) { return period_comma(a) && !is_digit(b); },
                            [](std::string& o, char a, char b) { o += ' '; o += a; o += ' '; o += b; });
  // A dash preceded by a digit: ([0-9])(-) -> "\1 \2 ".
  spaced = substitute_pairs(spaced, [](char a, char b) { return is_digit(a) && b == '-'; },
                            [](std::string& o, char a, char b) { o += a; o += ' '; o += b; o += ' '; });
  std::string out;
  for (const auto& w : split_words(spaced)) {
    if (!out.empty()) out += ' ';
    out += w;
  }
  return out;
}

std::string Bleu::text() const {
  const double ratio = stats.ref_len > 0 ? static_cast<double>(stats.sys_len) / static_cast<double>(stats.ref_len) : 0.0;
  return fmt::format("BLEU {:.2f} {:.1f}/{:.1f}/{:.1f}/{:.1f} (BP {:.3f}, ratio {:.3f}, hyp_len {}, ref_len {})", score,
                     precisions[0], precisions[1], precisions[2], precisions[3], brevity_penalty, ratio, stats.sys_len,
                     stats.ref_len);
}

Bleu corpus_bleu(const std::vector<std::string>& hyps, const std::vector<std::vector<std::string>>& refs,
                 bool tokenize) {
  if (refs.empty()) fail("BLEU: no reference stream");
  for (size_t s = 0; s < refs.size(); ++s)
    if (refs[s].size() != hyps.size())
      fail("BLEU: reference stream {} has {} lines for {} hypotheses", s + 1, refs[s].size(), hyps.size());
  auto words_of = [&](const std::string& line) {
    const std::string trimmed = rstrip(line);  // sacrebleu's rstrip
    return split_words(tokenize ? tokenize_13a(trimmed) : trimmed);
  };
  BleuStats st;
  for (size_t i = 0; i < hyps.size(); ++i) {
    const auto hyp = words_of(hyps[i]);
    const auto hyp_len = static_cast<int64_t>(hyp.size());
    std::vector<std::vector<std::string>> ref_words;
    int64_t closest = -1;
    for (const auto& stream : refs) {
      ref_words.push_back(words_of(stream[i]));
      const auto len = static_cast<int64_t>(ref_words.back().size());
      const int64_t diff = std::llabs(hyp_len - len), best = closest < 0 ? -1 : std::llabs(hyp_len - closest);
      if (closest < 0 || diff < best || (diff == best && len < closest)) closest = len;
    }
    st.sys_len += hyp_len;
    st.ref_len += closest;
    for (size_t n = 1; n <= 4; ++n) {
      auto counts = ngram_counts(hyp, n);
      std::unordered_map<std::string, int64_t> max_ref;
      for (const auto& r : ref_words)
        for (const auto& [gram, c] : ngram_counts(r, n)) max_ref[gram] = std::max(max_ref[gram], c);
      for (const auto& [gram, c] : counts) {
        auto it = max_ref.find(gram);
        if (it != max_ref.end()) st.correct[n - 1] += std::min(c, it->second);
      }
      st.total[n - 1] += std::max<int64_t>(0, hyp_len - static_cast<int64_t>(n) + 1);
    }
  }
  return bleu_from_stats(st);
}

Bleu bleu_from_stats(const BleuStats& stats) {
  Bleu bleu;
  bleu.stats = stats;
  const BleuStats& st = bleu.stats;
  bleu.brevity_penalty = st.sys_len >= st.ref_len ? 1.0
                         : st.sys_len > 0        ? std::exp(1.0 - static_cast<double>(st.ref_len) / static_cast<double>(st.sys_len))
                                                 : 0.0;
  if (std::all_of(st.correct.begin(), st.correct.end(), [](int64_t c) { return c == 0; })) return bleu;
  double smooth = 1.0, log_sum = 0.0;
  bool zero = false;
  for (size_t n = 0; n < 4; ++n) {
    if (st.total[n] == 0) {  // a precision left at 0: the score is 0 (sacrebleu's my_log(0))
      zero = true;
      break;
    }
    if (st.correct[n] == 0) {
      smooth *= 2;
      bleu.precisions[n] = 100.0 / (smooth * static_cast<double>(st.total[n]));
    } else {
      bleu.precisions[n] = 100.0 * static_cast<double>(st.correct[n]) / static_cast<double>(st.total[n]);
    }
    log_sum += std::log(bleu.precisions[n]);
  }
  bleu.score = zero ? 0.0 : bleu.brevity_penalty * std::exp(log_sum / 4.0);
  return bleu;
}

}  // namespace spanformer::metrics
