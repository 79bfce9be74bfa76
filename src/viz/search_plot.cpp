#include "spanformer/viz/search_plot.h"

#include "spanformer/build_options.h"
#if SPANFORMER_WITH_CAIRO
#include "canvas.h"
#endif
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>

#include <fmt/format.h>

#include "spanformer/util/error.h"
#include "spanformer/util/io.h"

namespace spanformer::viz {
#if SPANFORMER_WITH_CAIRO
namespace {

// Block-type colours: attention red, feed-forward blue, identity grey.
constexpr double kColour[3][3] = {{0.84, 0.19, 0.15}, {0.17, 0.40, 0.75}, {0.55, 0.55, 0.55}};
constexpr const char* kName[3] = {"attention", "feed-forward", "identity"};

}  // namespace

#endif

SearchHistory read_search_history(const std::string& log_path) {
  std::string text = read_file(log_path);
  SearchHistory h;
  size_t start = 0, line_no = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    ++line_no;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception&) {
      fail("{} line {} is not JSON", log_path, line_no);
    }
    if (!j.contains("probs")) continue;
    std::vector<std::array<double, 3>> rows;
    for (const auto& r : j["probs"]) rows.push_back({r[0].get<double>(), r[1].get<double>(), r[2].get<double>()});
    if (!h.probs.empty() && rows.size() != h.probs.back().size()) fail("{} line {}: the number of blocks changed", log_path, line_no);
    h.steps.push_back(j["step"].get<int64_t>());
    h.probs.push_back(std::move(rows));
  }
  if (h.steps.empty()) fail("{} has no search records: was this run a super-network (model.search)?", log_path);
  return h;
}

#if SPANFORMER_WITH_CAIRO
void write_search_plot(const std::string& path, const SearchHistory& history, const std::string& title) {
  if (history.steps.empty()) fail("no search history to draw");
  const size_t T = history.steps.size(), N = history.probs[0].size();
  const double margin = 70, top = 60, map_w = std::max(480.0, std::min(900.0, 6.0 * static_cast<double>(T)));
  const double row_h = std::clamp(260.0 / static_cast<double>(N), 8.0, 22.0), map_h = row_h * static_cast<double>(N);
  const double gap = 48, bars_h = 200;
  const int width = static_cast<int>(margin + map_w + 140);
  const int height = static_cast<int>(top + 3 * (map_h + gap) + bars_h + 60);
  Canvas canvas(path, width, height);
  cairo_t* cr = canvas.cr();
  text(cr, margin, 26, title, 17);
  text(cr, margin, 46, fmt::format("P(block type) = softmax(alpha) of each of the {} blocks, steps {} to {}", N,
                                   history.steps.front(), history.steps.back()), 12);
  const double col_w = map_w / static_cast<double>(T);
  for (int k = 0; k < 3; ++k) {
    const double y0 = top + gap / 2 + k * (map_h + gap);
    cairo_set_source_rgb(cr, 0, 0, 0);
    text(cr, margin, y0 - 6, fmt::format("P({})", kName[k]), 13);
    for (size_t t = 0; t < T; ++t) {
      for (size_t b = 0; b < N; ++b) {
        const double p = history.probs[t][b][k];
        // White (0) to the type's colour (1).
        cairo_set_source_rgb(cr, 1 - p * (1 - kColour[k][0]), 1 - p * (1 - kColour[k][1]), 1 - p * (1 - kColour[k][2]));
        const double y = y0 + map_h - row_h * static_cast<double>(b + 1);  // block 0 at the bottom
        cairo_rectangle(cr, margin + col_w * static_cast<double>(t), y, col_w + 0.5, row_h + 0.5);
        cairo_fill(cr);
      }
    }
    cairo_set_source_rgb(cr, 0.3, 0.3, 0.3);
    cairo_set_line_width(cr, 1);
    cairo_rectangle(cr, margin, y0, map_w, map_h);
    cairo_stroke(cr);
    for (size_t b = 0; b < N; b += std::max<size_t>(1, N / 8))
      text(cr, margin - 6, y0 + map_h - row_h * (static_cast<double>(b) + 0.5) + 4, fmt::format("{}", b), 9, 1.0);
    text(cr, margin - 40, y0 + map_h / 2, "block", 10, 0.5);
    text(cr, margin, y0 + map_h + 13, fmt::format("step {}", history.steps.front()), 9);
    text(cr, margin + map_w, y0 + map_h + 13, fmt::format("step {}", history.steps.back()), 9, 1.0);
    // Colour scale.
    for (int i = 0; i < 50; ++i) {
      const double p = i / 49.0;
      cairo_set_source_rgb(cr, 1 - p * (1 - kColour[k][0]), 1 - p * (1 - kColour[k][1]), 1 - p * (1 - kColour[k][2]));
      cairo_rectangle(cr, margin + map_w + 20, y0 + map_h - map_h * (i + 1) / 50.0, 14, map_h / 50.0 + 0.5);
      cairo_fill(cr);
    }
    cairo_set_source_rgb(cr, 0, 0, 0);
    text(cr, margin + map_w + 38, y0 + 9, "1", 9);
    text(cr, margin + map_w + 38, y0 + map_h, "0", 9);
  }
  // Final probabilities: one stacked bar per block.
  const double by0 = top + 3 * (map_h + gap) + 20, bar_w = map_w / static_cast<double>(N);
  cairo_set_source_rgb(cr, 0, 0, 0);
  text(cr, margin, by0 - 8, fmt::format("final P at step {} (stacked: attention, feed-forward, identity; letter = argmax)",
                                        history.steps.back()), 13);
  const auto& last = history.probs.back();
  for (size_t b = 0; b < N; ++b) {
    double y = by0 + bars_h;
    for (int k = 0; k < 3; ++k) {
      const double h = bars_h * last[b][k];
      cairo_set_source_rgb(cr, kColour[k][0], kColour[k][1], kColour[k][2]);
      cairo_rectangle(cr, margin + bar_w * static_cast<double>(b) + 1, y - h, bar_w - 2, h);
      cairo_fill(cr);
      y -= h;
    }
    const int arg = static_cast<int>(std::max_element(last[b].begin(), last[b].end()) - last[b].begin());
    cairo_set_source_rgb(cr, 0, 0, 0);
    text(cr, margin + bar_w * (static_cast<double>(b) + 0.5), by0 + bars_h + 14, std::string(1, "afi"[arg]), 10, 0.5);
  }
  text(cr, margin, by0 + bars_h + 30, "block 0 (input side) ... last block", 10);
  canvas.save({{"picture", "par search"}, {"title", title}, {"steps", history.steps}, {"probs", history.probs},
               {"columns", {"attention", "feed-forward", "identity"}}});
}

#else
namespace {
[[noreturn]] void no_cairo(const std::string& path) {
  fail("cannot draw {}: this spanformer was built without Cairo (-DSPANFORMER_PICTURES=OFF)", path);
}
}  // namespace
void write_search_plot(const std::string& path, const SearchHistory&, const std::string&) { no_cairo(path); }
#endif

}  // namespace spanformer::viz
