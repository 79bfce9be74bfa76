// The smallest program on the installed library: the span-aware attention op against its reference
// composition on random inputs, and, given a checkpoint of any family, what it is.
//
//   consumer                 -> "span attention: max |fast - reference| = E" (E: float32 rounding)
//   consumer runs/demo       -> ... and "runs/demo/checkpoint.pt: FAMILY, N parameters, step S"
#include <torch/types.h>
#include <torch/utils.h>

#include <spanformer/ops/adaptive_span_attention.h>
#include <spanformer/train/family.h>
#include <spanformer/util/error.h>

#include <cstdio>
#include <exception>

int main(int argc, char** argv) {
  try {
    using namespace spanformer;
    torch::manual_seed(0);
    const int64_t B = 2, K = 4, M = 32, W = 64, D = 16, L = 64;
    auto q = torch::randn({B, K, M, D}), k = torch::randn({B, K, W + M, D}), v = torch::randn({B, K, W + M, D});
    auto key_pe = torch::randn({D, L}), ratio = torch::rand({K});
    ops::SpanAttentionOptions o;
    o.attn_span = L;
    auto fast = ops::adaptive_span_attention(q, k, v, key_pe, ratio, o);                // (B, K, M, D)
    auto reference = ops::adaptive_span_attention_reference(q, k, v, key_pe, ratio, o);  // (B, K, M, D)
    std::printf("span attention: max |fast - reference| = %.1e\n", (fast - reference).abs().max().item<double>());
    if (argc > 1) {
      train::Checkpoint ck(argv[1]);
      auto family = train::family_from_checkpoint(ck);
      int64_t parameters = 0;
      for (const auto& p : family->module().parameters()) parameters += p.numel();
      std::printf("%s: %s, %lld parameters, step %lld\n", ck.path().c_str(), ck.family().c_str(),
                  static_cast<long long>(parameters),
                  static_cast<long long>(ck.has("state.step") ? ck.integer("state.step") : -1));
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: error: %s\n", spanformer::one_line_message(e).c_str());
    return 1;
  }
}
