// The attention picture every language-model family shares (families.h, draw_text_attention).
#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <algorithm>

#include <fmt/format.h>

#include "families.h"
#include "spanformer/attention/record.h"
#include "spanformer/util/error.h"
#include "spanformer/viz/heatmap.h"

namespace spanformer::train {

namespace {

// A token as a tick label: bytes made visible (space, newline, tab, non-ASCII as hex), words as they are.
std::string token_label(const data::Vocab& vocab, int64_t id) {
  if (vocab.word_level) return vocab.tokens[static_cast<size_t>(id)];
  const std::string b = vocab.decode(id);
  if (b == "\n") return "\\n";
  if (b == "\t") return "\\t";
  if (b == " ") return "\u2423";  // open box
  if (b.size() == 1 && (static_cast<unsigned char>(b[0]) < 32 || static_cast<unsigned char>(b[0]) >= 127))
    return fmt::format("0x{:02x}", static_cast<unsigned char>(b[0]));
  return b;
}

}  // namespace

void draw_text_attention(const data::Vocab& vocab, const AttentionRequest& r, int64_t block,
                         const std::function<torch::Tensor(const torch::Tensor&)>& forward, torch::Device device) {
  if (r.texts.size() != 1 || !r.indices.empty()) fail("attention: a language model takes one --text");
  torch::NoGradGuard no_grad;
  auto ids = prompt_ids(vocab, r.texts[0]);
  const auto n_ids = static_cast<int64_t>(ids.size());
  // A short block first (the remainder), so that the recorded last block is a whole one.
  const int64_t last = std::max<int64_t>(0, n_ids - block);  // the last block starts here
  for (int64_t start = 0; start < last;) {
    const int64_t n = start == 0 && last % block != 0 ? last % block : block;
    forward(torch::from_blob(ids.data() + start, {1, n}, torch::kLong).to(device));
    start += n;
  }
  attention::WeightRecorder recorder;
  forward(torch::from_blob(ids.data() + last, {1, n_ids - last}, torch::kLong).to(device));
  const auto& layers = recorder.layers;  // (1, K, n, S + 1) each
  if (layers.empty()) fail("attention: this model recorded no attention weights");
  if (r.weights) *r.weights = layers;
  if (r.out.empty()) return;
  const auto L = static_cast<int64_t>(layers.size()), K = layers[0].size(1), n = layers[0].size(2);
  if (r.layer < -1 || r.layer >= L) fail("attention: --layer must be in [0, {}) (got {})", L, r.layer);
  if (r.head < -1 || r.head >= K) fail("attention: --head must be in [0, {}) (got {})", K, r.head);
  const int64_t R = std::min<int64_t>(n, 32);
  struct Panel {
    torch::Tensor w;  // (R, S + 1)
    std::string title;
  };
  std::vector<Panel> panels;
  auto rows = [&](int64_t l) { return layers[static_cast<size_t>(l)][0].narrow(1, n - R, R); };  // (K, R, S + 1)
  if (r.layer < 0) {
    for (int64_t l = 0; l < L; ++l)
      panels.push_back({r.head < 0 ? rows(l).mean(0) : rows(l)[r.head],
                        r.head < 0 ? fmt::format("layer {} (heads' mean)", l) : fmt::format("layer {} head {}", l, r.head)});
  } else if (r.head < 0) {
    for (int64_t h = 0; h < K; ++h) panels.push_back({rows(r.layer)[h], fmt::format("layer {} head {}", r.layer, h)});
  } else {
    panels.push_back({rows(r.layer)[r.head], fmt::format("layer {} head {}", r.layer, r.head)});
  }
  // The distances shown: up to the farthest any panel weighs (1e-6 of a row or more).
  int64_t farthest = 1;
  for (const auto& p : panels) {
    auto reach = p.w.ge(1e-6).any(0).nonzero();  // (k, 1) distances with weight
    if (reach.numel() > 0) farthest = std::max(farthest, reach.max().item<int64_t>());
  }
  const int64_t columns = farthest + 1, bins = std::min<int64_t>(columns, 360);
  std::vector<viz::Heatmap> out;
  for (const auto& p : panels) {
    viz::Heatmap h;
    auto w = p.w.narrow(1, 0, columns).contiguous();  // (R, columns) float64
    for (int64_t i = 0; i < R; ++i) {
      std::vector<double> row(static_cast<size_t>(bins), 0.0);
      auto row_i = w[i];  // (columns)
      auto a = row_i.accessor<double, 1>();
      for (int64_t d = 0; d < columns; ++d) row[static_cast<size_t>(d * bins / columns)] += a[d];
      h.values.push_back(std::move(row));
      h.row_ticks.push_back(token_label(vocab, ids[static_cast<size_t>(n_ids - R + i)]));
    }
    for (int64_t b = 0; b < bins; ++b) h.col_ticks.push_back(fmt::format("{}", (b * columns + bins - 1) / bins));
    h.title = p.title;
    h.row_label = "query (the text's last tokens)";
    h.col_label = bins < columns ? fmt::format("distance (bins of ~{})", columns / bins) : "distance (0 = the token itself)";
    out.push_back(std::move(h));
  }
  viz::write_heatmaps(r.out, out);
  fmt::print("{} tokens; the last {} drawn over distances 0 .. {} in {}\n", n_ids, R, farthest, r.out);
}

}  // namespace spanformer::train
