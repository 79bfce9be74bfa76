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
#include "spanformer/util/io.h"

namespace spanformer::viz {
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

}  // namespace

void write_span_plot(const std::string& path, const std::vector<std::vector<double>>& spans,
                     const SpanPlotOptions& options) {
  if (spans.empty() || spans[0].empty()) fail("no spans to draw");
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
      text(cr, x0 + w - 4, y0 + 14, fmt::format("z = {:.1f}", z), 11, kRight);
      cairo_set_source_rgb(cr, 0.4, 0.4, 0.4);
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
  canvas.save({{"picture", "spans"}, {"title", options.title}, {"spans", spans}, {"attn_span", options.attn_span},
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
