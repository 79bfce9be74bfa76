// How the adaptive-span attention layer computes its attention (an execution choice: checkpoints load
// under any of them, and all give the reference's result; tests/test_equivalence.cpp holds them to it).
//   plain  the reference's operations, one batched product per step over the whole window;
//   fused  the span-aware op (ops/adaptive_span_attention.h): no M x W tensor stored, values, mask and
//          dropout only over each head's span;
//   auto   per layer and block, the one the measured rule in attention/seq_attention.cpp expects to
//          be faster (docs/kernels.md has the figures behind it). The default.
#pragma once
#include <string>

namespace spanformer::attention {

enum class AttnImpl { kAuto, kFused, kPlain };

// "auto" | "fused" | "plain"; parse fails with a one-line error naming the value.
const char* attn_impl_name(AttnImpl impl);
AttnImpl parse_attn_impl(const std::string& name);

}  // namespace spanformer::attention
