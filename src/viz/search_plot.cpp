#include "spanformer/viz/search_plot.h"

#include "spanformer/build_options.h"
#if SPANFORMER_WITH_CAIRO
#include "canvas.h"
#endif
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "spanformer/util/jsonl.h"

namespace spanformer::viz {
#if SPANFORMER_WITH_CAIRO
namespace {

// Block-type colours: attention red, feed-forward blue, identity grey.
constexpr double kColour[3][3] = {{0.84, 0.19, 0.15}, {0.17, 0.40, 0.75}, {0.55, 0.55, 0.55}};
constexpr const char* kName[3] = {"attention", "feed-forward", "identity"};

}  // namespace

#endif

SearchHistory read_search_history(const std::string& log_path) {
  SearchHistory h;
  for (const auto& j : read_jsonl(log_path)) {
    if (!j.contains("probs")) continue;
    if (!j.contains("step") || !j["step"].is_number_integer()) fail("{}: a search record without an integer step", log_path);
    const auto step = j["step"].get<int64_t>();
    const auto& probs = j["probs"];
    // One row per block: P(attention), P(feed-forward), P(identity).
    if (!probs.is_array() || probs.empty())
      fail("{}: the search record at step {} has no block probabilities", log_path, step);
    std::vector<std::array<double, 3>> rows;
    for (const auto& r : probs) {
      if (!r.is_array() || r.size() != 3 || !r[0].is_number() || !r[1].is_number() || !r[2].is_number())
        fail("{}: the search record at step {} has a block without its three probabilities", log_path, step);
      rows.push_back({r[0].get<double>(), r[1].get<double>(), r[2].get<double>()});
    }
    if (!h.probs.empty() && rows.size() != h.probs.back().size())
      fail("{}: the number of blocks changed at step {}", log_path, step);
    h.steps.push_back(step);
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
  const double gap = 58, bars_h = 200;
  // Small multiples: P(type) against step as three lines, one panel per block, `cols` panels a row.
  const size_t cols = std::min<size_t>(N, std::clamp<size_t>(static_cast<size_t>(map_w / 120), 2, 8)), rows = (N + cols - 1) / cols;
  const double panel_w = map_w / static_cast<double>(cols), panel_h = 78, lines_top = top + 3 * (map_h + gap) + bars_h + 126;
  const int width = static_cast<int>(margin + map_w + 140);
  const int height = static_cast<int>(lines_top + static_cast<double>(rows) * (panel_h + 26) + 40);
  Canvas canvas(path, width, height);
  cairo_t* cr = canvas.cr();
  text(cr, margin, 26, title, 17);
  text(cr, margin, 46, fmt::format("P(block type) = softmax(alpha) of each of the {} blocks, steps {} to {}", N,
                                   history.steps.front(), history.steps.back()), 12);
  const double col_w = map_w / static_cast<double>(T);
  // Ticks under a map: five logged steps spread over the columns, and the axis name.
  auto step_ticks = [&](double y) {
    cairo_set_source_rgb(cr, 0, 0, 0);
    for (int q = 0; q <= 4; ++q) {
      const size_t t = std::min(T - 1, static_cast<size_t>(std::lround(q * (static_cast<double>(T) - 1) / 4)));
      const double x = margin + col_w * (static_cast<double>(t) + 0.5);
      cairo_move_to(cr, x, y);
      cairo_line_to(cr, x, y + 4);
      cairo_stroke(cr);
      text(cr, x, y + 14, fmt::format("{}", history.steps[t]), 9, q == 0 ? 0.0 : q == 4 ? 1.0 : 0.5);
    }
    text(cr, margin + map_w / 2, y + 26, "training step", 10, 0.5);
  };
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
    step_ticks(y0 + map_h);
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
  for (double p : {0.0, 0.5, 1.0}) {  // y axis of the bars
    const double y = by0 + bars_h * (1 - p);
    cairo_move_to(cr, margin - 4, y);
    cairo_line_to(cr, margin, y);
    cairo_stroke(cr);
    text(cr, margin - 6, y + 4, fmt::format("{:g}", p), 9, 1.0);
  }
  text(cr, margin - 30, by0 + bars_h / 2, "P", 10, 0.5, true);
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

  cairo_set_source_rgb(cr, 0, 0, 0);
  text(cr, margin, lines_top - 40, "P(type) against training step, one panel per block (y from 0 to 1)", 13);
  for (int k = 0; k < 3; ++k) {  // legend
    const double lx = margin + 110 * k;
    cairo_set_source_rgb(cr, kColour[k][0], kColour[k][1], kColour[k][2]);
    cairo_rectangle(cr, lx, lines_top - 23, 14, 9);
    cairo_fill(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    text(cr, lx + 18, lines_top - 14, kName[k], 10);
  }
  const double s0 = static_cast<double>(history.steps.front());
  const double s1 = std::max(s0 + 1, static_cast<double>(history.steps.back()));
  for (size_t b = 0; b < N; ++b) {
    const double px = margin + panel_w * static_cast<double>(b % cols) + 4;
    const double py = lines_top + (panel_h + 26) * static_cast<double>(b / cols);
    const double pw = panel_w - 12;
    cairo_set_source_rgb(cr, 0.97, 0.97, 0.97);
    cairo_rectangle(cr, px, py, pw, panel_h);
    cairo_fill(cr);
    cairo_set_source_rgb(cr, 0.6, 0.6, 0.6);
    cairo_set_line_width(cr, 1);
    cairo_rectangle(cr, px, py, pw, panel_h);
    cairo_stroke(cr);
    cairo_set_line_width(cr, 1.6);
    for (int k = 0; k < 3; ++k) {
      cairo_set_source_rgb(cr, kColour[k][0], kColour[k][1], kColour[k][2]);
      for (size_t t = 0; t < T; ++t) {
        const double x = px + pw * (static_cast<double>(history.steps[t]) - s0) / (s1 - s0);
        const double y = py + panel_h * (1 - history.probs[t][b][k]);
        t == 0 ? cairo_move_to(cr, x, y) : cairo_line_to(cr, x, y);
      }
      cairo_stroke(cr);
    }
    cairo_set_source_rgb(cr, 0, 0, 0);
    text(cr, px + 3, py + 11, fmt::format("block {}", b), 9);
    if (b % cols == 0) {
      text(cr, px - 3, py + 8, "1", 8, 1.0);
      text(cr, px - 3, py + panel_h, "0", 8, 1.0);
    }
    text(cr, px, py + panel_h + 11, fmt::format("{}", history.steps.front()), 8);
    text(cr, px + pw, py + panel_h + 11, fmt::format("{}", history.steps.back()), 8, 1.0);
  }
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
