// Token batches as tensors: the blocks of contiguous streams every language-model family reads (the
// reference's batching: data::Streams cut into `batch` streams, block `pos` of each), and contexts at
// given starts (the GPT family's random contexts and its evaluation windows).
#pragma once
#include <ATen/ATen.h>

#include <utility>
#include <vector>

#include "spanformer/data/corpus.h"

namespace spanformer::data {

// inputs/targets for block `pos` of streams [first, first + count) (all when count < 0) as int64
// (count, M) tensors on `device`.
std::pair<at::Tensor, at::Tensor> make_block(const Streams& streams, int64_t pos, int64_t M, at::Device device,
                                             int64_t first = 0, int64_t count = -1);

// inputs/targets of contexts starting at `starts` (tokens [s, s + T) / [s + 1, s + T + 1); each
// s + T < tokens.size()) as int64 (starts.size(), T) tensors on `device`.
std::pair<at::Tensor, at::Tensor> make_contexts(const TokenFile& tokens, const std::vector<int64_t>& starts,
                                                int64_t T, at::Device device);

}  // namespace spanformer::data
