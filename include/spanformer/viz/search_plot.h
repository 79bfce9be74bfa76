// The PAR search as one picture (Cairo PNG):
//  - three heat maps, one per block type (attention, feed-forward, identity): P(type) of every block
//    (rows, block 0 at the bottom as the network's input) against the training step (columns);
//  - the final probabilities of every block as stacked bars, with the argmax letter under each;
//  - the same probabilities as lines against the step, one small panel per block (8 panels a row).
// PNG, SVG or PDF by extension, with the steps and probabilities in a JSON file beside it.
#pragma once
#include <array>
#include <string>
#include <vector>

namespace spanformer::viz {

struct SearchHistory {
  std::vector<int64_t> steps;                                  // T logged steps
  std::vector<std::vector<std::array<double, 3>>> probs;       // [T][N] = (P_a, P_f, P_i)
};

// Reads the "probs" records of a run's log.jsonl (clear error when the run logged none).
SearchHistory read_search_history(const std::string& log_path);

void write_search_plot(const std::string& path, const SearchHistory& history, const std::string& title);

}  // namespace spanformer::viz
