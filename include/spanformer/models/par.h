// Deriving a plain PAR model from a trained super-network (Mandava et al. 2020, sec. 4).
//
// Input: the super-network's block probabilities P (N, 3), columns [attention, feed-forward,
// identity], with softmax(alpha) and no noise. Output: a layer string of 'a' and 'f' (identity
// blocks are dropped: they compute nothing).
//
//   argmax: each block takes its most likely type.
//   par:    blocks whose most likely type is identity are dropped; of the T kept blocks,
//           n_a = clamp(round(T / p), 1, |lower|) become attention, chosen by the highest P(attention)
//           among the kept blocks in the lower two thirds (block index < ceil(2N / 3)); every other
//           kept block is feed-forward. p is the total : attention ratio (5 in the paper).
#pragma once
#include <array>
#include <string>
#include <vector>

#include "spanformer/config/xl_config.h"

namespace spanformer::models::par {

using BlockProbs = std::vector<std::array<double, 3>>;

std::string derive_argmax(const BlockProbs& probs);
std::string derive_par(const BlockProbs& probs, double ratio);

// The search config turned into the config of the derived plain model (same widths, data, training).
XlConfig derived_config(const XlConfig& search_config, const std::string& layers);

}  // namespace spanformer::models::par
