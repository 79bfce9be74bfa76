// Reading attention weights out of a language model's forward pass, for pictures (`spanformer
// attention CHECKPOINT --text ...`). While a WeightRecorder is alive on a thread, every causal attention
// layer of the language-model families computes its reference composition (the fused, banded, flash and
// per-head paths are skipped: they never hold the whole weight matrix) and hands its weights to the
// recorder, in layer order, in one layout by distance:
//
//     w (B, K, n, S + 1):  w[b, h, i, d] = weight of query i on the key d positions before it
//                          (d = 0: the query itself), for d = 0 .. S
//
// where S is the layer's farthest key. Weights are after every mask and renormalisation and before
// dropout: what the layer multiplies its values by. The three layouts met (and their converters below):
//   by key position   a (B, K, n, c), query i at key position c - n + i  (GPT, Transformer-XL)
//   by window          a (B, K, n, L'), column j at distance L' - j      (adaptive span, models.py's skew)
// A recorder is a thread-local switch: layers not being recorded pay one pointer test.
#pragma once
#include <ATen/ATen.h>

#include <vector>

namespace spanformer::attention {

class WeightRecorder {
 public:
  WeightRecorder();   // becomes this thread's active recorder (one at a time)
  ~WeightRecorder();
  WeightRecorder(const WeightRecorder&) = delete;
  WeightRecorder& operator=(const WeightRecorder&) = delete;

  static WeightRecorder* active();  // null when none records

  // a (B, K, n, c) by key position, query i at key position c - n + i; stored by distance.
  void add_by_position(const at::Tensor& a);
  // a (B, K, n, L') by window: column j at distance L' - j (1 .. L'); stored by distance (d = 0 empty).
  void add_by_window(const at::Tensor& a);

  std::vector<at::Tensor> layers;  // (B, K, n, S + 1) each, float64 on the CPU, in call order
};

}  // namespace spanformer::attention
