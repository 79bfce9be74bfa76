// Adaptive input and adaptive softmax with Transformer-XL's semantics (kimiyoung/transformer-xl,
// utils/proj_adaptive_softmax.py and mem_transformer.py AdaptiveEmbedding), not PyTorch's
// AdaptiveLogSoftmaxWithLoss (which has no projections, no div_val tying and another head layout).
//
// The vocabulary is sorted by frequency and cut at cutoffs c_1 < ... < c_n into a shortlist
// [0, c_1) and n tail clusters [c_i, c_{i+1}) (c_{n+1} = V). With E = d_embed, P = d_proj (= d_model):
//
//   div_val == 1  one weight table (V, E) for the whole vocabulary; a projection (P, E) per cluster
//                 only when P != E
//   div_val  > 1  cluster i has its own table (V_i, E / div_val^i) and projection (P, E / div_val^i)
//
// AdaptiveEmbedding:  e(x) = proj_i(table_i[x - c_i]) * sqrt(P)                       (N) -> (N, P)
// AdaptiveLogSoftmax: head = [shortlist words | one logit per tail cluster], over proj_0(h);
//   log p(x) = head_logprob[x]                                        for x in the shortlist
//   log p(x) = head_logprob[H_0 + n - i] + tail_logprob_i[x - c_i]    for x in cluster i >= 1
// where H_0 = c_1 and the cluster logits sit in REVERSE order at the end of the head (cluster i uses
// head column -i, as in the reference), tail_logprob_i = log_softmax(W_i proj_i(h) + b_i).
// "proj(h)" for the output is h @ proj (P -> E_i); for the input e @ proj^T (E_i -> P), so one
// projection can be tied between input and output.
//
// Tying (tie_weight: output tables = input tables; tie_projs: output projections of clusters >= 1 =
// input projections) shares one tensor: it is registered once (in the embedding) so an optimizer
// updates it once.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <vector>

namespace spanformer::nn {

struct AdaptiveOptions {
  int64_t vocab_size = 0;          // V
  int64_t d_embed = 0;             // E
  int64_t d_proj = 0;              // P
  std::vector<int64_t> cutoffs;    // empty: one cluster (a plain embedding / full softmax)
  int64_t div_val = 1;
  double init_std = 0.02, proj_init_std = 0.01;
};

class AdaptiveEmbeddingImpl : public torch::nn::Module {
 public:
  explicit AdaptiveEmbeddingImpl(AdaptiveOptions options);
  // x: any shape of int64 ids -> x.shape + (P)
  torch::Tensor forward(const torch::Tensor& x) const;

  const AdaptiveOptions& options() const { return options_; }
  std::vector<torch::Tensor> tables;  // per cluster (V_i, E_i) (one (V, E) table when div_val == 1)
  std::vector<torch::Tensor> projs;   // per cluster (P, E_i); empty when div_val == 1 and P == E

 private:
  AdaptiveOptions options_;
  std::vector<int64_t> bounds_;  // 0, c_1, ..., V
};
TORCH_MODULE(AdaptiveEmbedding);

class AdaptiveLogSoftmaxImpl : public torch::nn::Module {
 public:
  // `tied`: the embedding whose tables/projections are shared (per tie_weight / tie_projs); may be null.
  AdaptiveLogSoftmaxImpl(AdaptiveOptions options, const AdaptiveEmbeddingImpl* tied, bool tie_weight, bool tie_projs);

  // hidden (N, P), target (N) -> per-token negative log-likelihood (N), in the input order.
  torch::Tensor nll(const torch::Tensor& hidden, const torch::Tensor& target) const;
  // hidden (N, P) -> log-probabilities over the whole vocabulary (N, V) (tests, sampling).
  torch::Tensor log_prob(const torch::Tensor& hidden) const;

  int64_t nb_clusters() const { return static_cast<int64_t>(options_.cutoffs.size()); }

  std::vector<torch::Tensor> weights, biases, projs;  // per cluster; projs[i] undefined = none
  torch::Tensor cluster_weight, cluster_bias;          // (n, E), (n) when n > 0

 private:
  // The weight/bias of cluster i's output layer (head rows include the cluster logits for i == 0).
  std::pair<torch::Tensor, torch::Tensor> layer(int64_t i) const;
  torch::Tensor logits(const torch::Tensor& hidden, int64_t i) const;
  AdaptiveOptions options_;
  std::vector<int64_t> bounds_;
};
TORCH_MODULE(AdaptiveLogSoftmax);

// Proposes cutoffs from token counts in vocabulary order (which is by decreasing frequency): for each
// of `coverage` (increasing, in (0, 1)) the smallest c such that ids [0, c) hold that share of the
// tokens, rounded up to a multiple of `round_to`, kept strictly increasing and below V.
std::vector<int64_t> propose_cutoffs(const std::vector<int64_t>& sorted_counts, const std::vector<double>& coverage,
                                     int64_t round_to = 1000);

}  // namespace spanformer::nn
