#include "spanformer/viz/span_plot.h"

#include "spanformer/build_options.h"
#if SPANFORMER_WITH_CAIRO
#include "canvas.h"
#endif

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "spanformer/nn/adaptive_span.h"
#include "spanformer/util/error.h"
#include "spanformer/util/names.h"
#include "spanformer/util/io.h"

namespace spanformer::viz {

constexpr auto kSpanLayoutNames = name_table("--layout", std::pair{SpanLayout::kAuto, "auto"},
                                             std::pair{SpanLayout::kCurves, "curves"},
                                             std::pair{SpanLayout::kGrid, "grid"});

SpanLayout parse_span_layout(const std::string& name) { return kSpanLayoutNames.parse(name); }

#if SPANFORMER_WITH_CAIRO
namespace {

// A distinct colour per head.
void head_colour(cairo_t* cr, size_t k, size_t K) {
  double h = K <= 1 ? 0.6 : static_cast<double>(k) / static_cast<double>(K);
  double r = 0.5 + 0.45 * std::cos(2 * M_PI * (h + 0.0));
  double g = 0.5 + 0.45 * std::cos(2 * M_PI * (h + 0.33));
  double b = 0.5 + 0.45 * std::cos(2 * M_PI * (h + 0.67));
  cairo_set_source_rgb(cr, r * 0.85, g * 0.85, b * 0.85);
}

// Layers x heads heat map of log10 z (1..L), the value in each cell.
void write_span_grid(const std::string& path, const std::vector<std::vector<double>>& spans,
                     const SpanPlotOptions& options) {
  const size_t layers = spans.size(), heads = spans[0].size();
  const double L = std::max(10.0, static_cast<double>(options.attn_span));
  const double cell_w = std::clamp(480.0 / static_cast<double>(heads), 44.0, 90.0);
  const double cell_h = std::clamp(640.0 / static_cast<double>(layers), 18.0, 40.0);
  const double left = 80, top = 96, grid_w = cell_w * static_cast<double>(heads), grid_h = cell_h * static_cast<double>(layers);
  const double width = left + grid_w + 130, height = top + grid_h + 30;
  Canvas canvas(path, std::max(width, 560.0), height);
  cairo_t* cr = canvas.cr();
  text(cr, 20, 28, options.title.empty() ? "Learned attention spans" : options.title, 17);
  text(cr, 20, 48, fmt::format("span z of every head in tokens (colour: log scale from 1 to L = {}, ramp R = {})",
                               options.attn_span, options.ramp), 12);
  auto t_of = [&](double z) { return std::log10(std::max(1.0, z)) / std::log10(L); };
  for (size_t l = 0; l < layers; ++l)
    for (size_t k = 0; k < heads; ++k) {
      const double x = left + cell_w * static_cast<double>(k), y = top + cell_h * static_cast<double>(l);
      const double t = t_of(spans[l][k]);
      set_viridis(cr, t);
      cairo_rectangle(cr, x, y, cell_w + 0.5, cell_h + 0.5);
      cairo_fill(cr);
      // Dark ink on the light (yellow/green) end, white on the dark end.
      if (t > 0.6) cairo_set_source_rgb(cr, 0, 0, 0);
      else cairo_set_source_rgb(cr, 1, 1, 1);
      const double z = spans[l][k];
      text(cr, x + cell_w / 2, y + cell_h / 2 + 4, z >= 100 ? fmt::format("{:.0f}", z) : fmt::format("{:.1f}", z),
           std::min(11.0, cell_h * 0.55), kCenter);
    }
  cairo_set_source_rgb(cr, 0.3, 0.3, 0.3);
  cairo_set_line_width(cr, 1);
  cairo_rectangle(cr, left, top, grid_w, grid_h);
  cairo_stroke(cr);
  cairo_set_source_rgb(cr, 0, 0, 0);
  for (size_t k = 0; k < heads; ++k)
    text(cr, left + cell_w * (static_cast<double>(k) + 0.5), top - 6, fmt::format("{}", k), 10, kCenter);
  text(cr, left + grid_w / 2, top - 20, "head", 12, kCenter);
  const size_t every = cell_h >= 12 ? 1 : 2;
  for (size_t l = 0; l < layers; l += every)
    text(cr, left - 6, top + cell_h * (static_cast<double>(l) + 0.5) + 4, fmt::format("{}", l), 10, kRight);
  text(cr, left - 34, top + grid_h / 2, "layer", 12, kCenter, true);
  // Colour bar with ticks at 1, 10, 100, ... and L.
  const double bx = left + grid_w + 24, bw = 16;
  for (int i = 0; i < 100; ++i) {
    set_viridis(cr, i / 99.0);
    cairo_rectangle(cr, bx, top + grid_h * (1 - (i + 1) / 100.0), bw, grid_h / 100.0 + 0.5);
    cairo_fill(cr);
  }
  cairo_set_source_rgb(cr, 0, 0, 0);
  std::vector<double> ticks;
  for (double tick = 1; tick < L * 0.8; tick *= 10) ticks.push_back(tick);
  ticks.push_back(L);
  for (double tick : ticks) {
    const double y = top + grid_h * (1 - t_of(tick));
    cairo_move_to(cr, bx + bw, y);
    cairo_line_to(cr, bx + bw + 4, y);
    cairo_stroke(cr);
    text(cr, bx + bw + 7, y + 4, fmt::format("{:.0f}", tick), 10);
  }
  text(cr, bx + bw + 52, top + grid_h / 2, "span z (tokens, log scale)", 11, kCenter, true);
  canvas.save({{"picture", "spans"}, {"layout", "grid"}, {"title", options.title}, {"spans", spans},
               {"attn_span", options.attn_span}, {"ramp", options.ramp}, {"unit", "tokens"},
               {"rows", "layer"}, {"columns", "head"}});
}

}  // namespace

void write_span_plot(const std::string& path, const std::vector<std::vector<double>>& spans,
                     const SpanPlotOptions& options) {
  if (spans.empty() || spans[0].empty()) fail("no spans to draw");
  for (const auto& layer : spans)
    if (layer.size() != spans[0].size()) fail("spans: layers with different numbers of heads");
  const bool grid = options.layout == SpanLayout::kGrid ||
                    (options.layout == SpanLayout::kAuto && spans.size() * spans[0].size() > 32);
  if (grid) return write_span_grid(path, spans, options);
  const size_t layers = spans.size(), heads = spans[0].size();
  const double L = static_cast<double>(options.attn_span), R = static_cast<double>(options.ramp);
  double z_max = 0;
  for (const auto& layer : spans)
    for (double z : layer) z_max = std::max(z_max, z);
  // Distance axis: up to the largest span + ramp, with 15% headroom, capped at L.
  const double x_max = std::max(8.0, std::min(L, std::ceil((z_max + R) * 1.15)));

  const double cell_w = 170, cell_h = 90, margin = 60, top = 70;
  const double grid_w = cell_w * static_cast<double>(heads), grid_h = cell_h * static_cast<double>(layers);
  const double bars_h = 260;
  const int width = static_cast<int>(std::max(grid_w, 520.0) + 2 * margin);
  const int height = static_cast<int>(top + grid_h + 50 + bars_h + 10);

  Canvas canvas(path, width, height);
  cairo_t* cr = canvas.cr();
  text(cr, margin, 28, options.title.empty() ? "Learned attention spans" : options.title, 18);
  text(cr, margin, 50,
       fmt::format("soft mask m_z(d) against distance d (0..{:.0f} tokens); max span L = {:.0f}, ramp R = {:.0f}",
                   x_max, L, R),
       12);

  // Grid of mask curves.
  for (size_t l = 0; l < layers; ++l) {
    for (size_t k = 0; k < heads; ++k) {
      const double x0 = margin + cell_w * static_cast<double>(k) + 8, y0 = top + cell_h * static_cast<double>(l) + 8;
      const double w = cell_w - 16, h = cell_h - 30;
      cairo_set_source_rgb(cr, 0.96, 0.96, 0.96);
      cairo_rectangle(cr, x0, y0, w, h);
      cairo_fill(cr);
      cairo_set_source_rgb(cr, 0.7, 0.7, 0.7);
      cairo_set_line_width(cr, 1);
      cairo_rectangle(cr, x0, y0, w, h);
      cairo_stroke(cr);
      // Curve: filled area under m_z(d).
      const double z = spans[l][k];
      head_colour(cr, k, heads);
      cairo_move_to(cr, x0, y0 + h);
      const int samples = 200;
      for (int i = 0; i <= samples; ++i) {
        double d = 1 + (x_max - 1) * i / samples;
        double m = nn::span_mask_value(z, static_cast<int64_t>(std::lround(d)), options.ramp);
        cairo_line_to(cr, x0 + w * (d / x_max), y0 + h * (1 - m));
      }
      cairo_line_to(cr, x0 + w, y0 + h);
      cairo_close_path(cr);
      cairo_fill(cr);
      cairo_set_source_rgb(cr, 0, 0, 0);
      label(cr, x0 + w - 4, y0 + 14, fmt::format("z = {:.1f}", z), 11, kRight);
      cairo_set_source_rgb(cr, 0.4, 0.4, 0.4);
      if (k == 0) {  // m axis: 1 at the top, 0 at the bottom
        text(cr, x0 - 3, y0 + 7, "1", 8, kRight);
        text(cr, x0 - 3, y0 + h, "0", 8, kRight);
      }
      text(cr, x0 + 1, y0 + h + 11, "0", 8);
      text(cr, x0 + w, y0 + h + 11, fmt::format("{:.0f}", x_max), 8, kRight);
      cairo_set_source_rgb(cr, 0, 0, 0);
      text(cr, x0 + w / 2, y0 + h + 14, fmt::format("layer {} head {}", l, k), 10, kCenter);
    }
  }

  // Bar chart: spans per layer, one bar per head, log scale from 1 to L.
  const double by0 = top + grid_h + 50, bh = bars_h - 40, bx0 = margin + 40;
  const double bw_total = std::max(grid_w, 520.0) - 40;
  cairo_set_source_rgb(cr, 0, 0, 0);
  text(cr, margin, by0 - 14, "span z per layer (one bar per head, log scale; spans below 1 token show no bar)", 13);
  text(cr, margin - 22, by0 + bh / 2, "span z (tokens)", 11, kCenter, true);
  auto y_of = [&](double z) { return by0 + bh * (1 - std::log10(std::max(1.0, z)) / std::log10(std::max(10.0, L))); };
  cairo_set_line_width(cr, 1);
  std::vector<double> ticks;
  for (double tick = 1; tick < L * 0.8; tick *= 10) ticks.push_back(tick);
  ticks.push_back(L);  // the top of the axis is the largest possible span
  for (double tick : ticks) {
    cairo_set_source_rgb(cr, 0.85, 0.85, 0.85);
    cairo_move_to(cr, bx0, y_of(tick));
    cairo_line_to(cr, bx0 + bw_total, y_of(tick));
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    text(cr, bx0 - 6, y_of(tick) + 4, tick == L ? fmt::format("L={:.0f}", tick) : fmt::format("{:.0f}", tick), 10,
         kRight);
  }
  const double group = bw_total / static_cast<double>(layers);
  const double bar = std::max(2.0, group * 0.8 / static_cast<double>(heads));
  for (size_t l = 0; l < layers; ++l) {
    for (size_t k = 0; k < heads; ++k) {
      const double x = bx0 + group * static_cast<double>(l) + group * 0.1 + bar * static_cast<double>(k);
      const double y = y_of(spans[l][k]);
      head_colour(cr, k, heads);
      cairo_rectangle(cr, x, y, bar - 1, by0 + bh - y);
      cairo_fill(cr);
    }
    cairo_set_source_rgb(cr, 0, 0, 0);
    text(cr, bx0 + group * (static_cast<double>(l) + 0.5), by0 + bh + 16, fmt::format("layer {}", l), 10, kCenter);
  }
  for (size_t k = 0; k < heads; ++k) {  // legend: the colour of each head
    const double lx = bx0 + 62 * static_cast<double>(k), ly = by0 + bh + 36;
    head_colour(cr, k, heads);
    cairo_rectangle(cr, lx, ly - 8, 10, 9);
    cairo_fill(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    text(cr, lx + 13, ly, fmt::format("head {}", k), 9);
  }
  canvas.save({{"picture", "spans"}, {"layout", "curves"}, {"title", options.title}, {"spans", spans}, {"attn_span", options.attn_span},
               {"ramp", options.ramp}, {"unit", "tokens"}});
}

#else
namespace {
[[noreturn]] void no_cairo(const std::string& path) {
  fail("cannot draw {}: this spanformer was built without Cairo (-DSPANFORMER_PICTURES=OFF)", path);
}
}  // namespace
void write_span_plot(const std::string& path, const std::vector<std::vector<double>>&, const SpanPlotOptions&) {
  no_cairo(path);
}
#endif

}  // namespace spanformer::viz
