#include "spanformer/viz/heatmap.h"

#include "spanformer/build_options.h"
#if SPANFORMER_WITH_CAIRO
#include "canvas.h"
#endif

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "spanformer/util/error.h"
#include "spanformer/util/io.h"

namespace spanformer::viz {
#if SPANFORMER_WITH_CAIRO
namespace {

std::string tick(double v) { return std::abs(v) >= 100 || v == std::floor(v) ? fmt::format("{:.0f}", v) : fmt::format("{:.2g}", v); }

}  // namespace

void write_heatmaps(const std::string& path, const std::vector<Heatmap>& panels) {
  if (panels.empty()) fail("no heat map to draw");
  const double panel = 360, margin = 70, top = 50, bar = 14;
  const int width = static_cast<int>(panels.size() * (panel + margin + 60) + margin);
  const int height = static_cast<int>(top + panel + 80);
  Canvas canvas(path, width, height);
  cairo_t* cr = canvas.cr();
  nlohmann::json data = nlohmann::json::array();
  for (size_t p = 0; p < panels.size(); ++p) {
    const auto& h = panels[p];
    const size_t R = h.values.size(), C = R ? h.values[0].size() : 0;
    if (R == 0 || C == 0) fail("heat map '{}' is empty", h.title);
    double vmax = 0;
    for (const auto& row : h.values) {
      if (row.size() != C) fail("heat map '{}': rows of different lengths", h.title);
      for (double v : row) vmax = std::max(vmax, std::isfinite(v) ? v : 0.0);
    }
    if (vmax <= 0) vmax = 1;
    const double x0 = margin + static_cast<double>(p) * (panel + margin + 60), y0 = top;
    const double cw = panel / static_cast<double>(C), ch = panel / static_cast<double>(R);
    for (size_t i = 0; i < R; ++i)
      for (size_t j = 0; j < C; ++j) {
        set_viridis(cr, h.values[i][j] / vmax);
        cairo_rectangle(cr, x0 + j * cw, y0 + i * ch, cw + 0.5, ch + 0.5);
        cairo_fill(cr);
      }
    cairo_set_source_rgb(cr, 0, 0, 0);
    text(cr, x0 + panel / 2, y0 - 18, h.title, 14, 0.5);
    text(cr, x0 + panel / 2, y0 + panel + 45, h.col_label, 12, 0.5);
    text(cr, x0 - 45, y0 + panel / 2, h.row_label, 12, 0.5, true);
    auto ticks = [&](const std::vector<std::string>& labels, size_t n, double cell, bool rows) {
      if (labels.empty()) return;
      const size_t every = std::max<size_t>(1, static_cast<size_t>(std::ceil(12.0 / cell)));  // labels >= 12 px apart
      for (size_t i = 0; i < n && i < labels.size(); i += every) {
        if (rows) text(cr, x0 - 4, y0 + (i + 0.5) * cell + 4, labels[i], 9, 1.0);
        else text(cr, x0 + (i + 0.5) * cell + 3, y0 + panel + 4, labels[i], 9, 1.0, true);
      }
    };
    ticks(h.row_ticks, R, ch, true);
    ticks(h.col_ticks, C, cw, false);
    for (int k = 0; k < 100; ++k) {  // colour bar
      set_viridis(cr, k / 99.0);
      cairo_rectangle(cr, x0 + panel + 12, y0 + panel * (1 - (k + 1) / 100.0), bar, panel / 100.0 + 0.5);
      cairo_fill(cr);
    }
    cairo_set_source_rgb(cr, 0, 0, 0);
    text(cr, x0 + panel + 14 + bar, y0 + 8, tick(vmax), 9);
    text(cr, x0 + panel + 14 + bar, y0 + panel, "0", 9);
    data.push_back({{"title", h.title}, {"row_label", h.row_label}, {"col_label", h.col_label},
                    {"row_ticks", h.row_ticks}, {"col_ticks", h.col_ticks}, {"values", h.values}});
  }
  canvas.save({{"picture", "heatmaps"}, {"panels", data}});
}

void write_line_plot(const std::string& path, const LinePlot& plot) {
  if (plot.series.empty()) fail("no series to draw");
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
  for (const auto& s : plot.series) {
    if (s.x.size() != s.y.size() || s.x.empty()) fail("series '{}': x and y must be non-empty and of one length", s.name);
    for (double v : s.x) xmin = std::min(xmin, v), xmax = std::max(xmax, v);
    for (double v : s.y) ymin = std::min(ymin, v), ymax = std::max(ymax, v);
  }
  if (xmax <= xmin) xmax = xmin + 1;
  if (ymax <= ymin) ymax = ymin + 1;
  const double pad = 0.05 * (ymax - ymin);
  ymin -= pad, ymax += pad;
  const double W = 720, H = 440, left = 70, right = 170, top = 40, bottom = 55;
  Canvas canvas(path, W, H);
  cairo_t* cr = canvas.cr();
  const double pw = W - left - right, ph = H - top - bottom;
  auto X = [&](double x) { return left + (x - xmin) / (xmax - xmin) * pw; };
  auto Y = [&](double y) { return top + (1 - (y - ymin) / (ymax - ymin)) * ph; };
  cairo_set_source_rgb(cr, 0, 0, 0);
  cairo_set_line_width(cr, 1);
  cairo_rectangle(cr, left, top, pw, ph);
  cairo_stroke(cr);
  for (int k = 0; k <= 5; ++k) {
    const double xv = xmin + k * (xmax - xmin) / 5, yv = ymin + k * (ymax - ymin) / 5;
    text(cr, X(xv), top + ph + 16, fmt::format("{:.3g}", xv), 10, 0.5);
    text(cr, left - 6, Y(yv) + 4, fmt::format("{:.3g}", yv), 10, 1.0);
  }
  text(cr, left + pw / 2, H - 12, plot.x_label, 12, 0.5);
  text(cr, 18, top + ph / 2, plot.y_label, 12, 0.5, true);
  text(cr, left + pw / 2, 24, plot.title, 14, 0.5);
  static const double palette[6][3] = {{0.12, 0.47, 0.71}, {1.0, 0.5, 0.05}, {0.17, 0.63, 0.17}, {0.84, 0.15, 0.16}, {0.58, 0.4, 0.74}, {0.3, 0.3, 0.3}};
  for (size_t i = 0; i < plot.series.size(); ++i) {
    const auto& s = plot.series[i];
    const auto* c = palette[i % 6];
    cairo_set_source_rgb(cr, c[0], c[1], c[2]);
    if (s.points) {
      for (size_t k = 0; k < s.x.size(); ++k) {
        cairo_arc(cr, X(s.x[k]), Y(s.y[k]), 2.5, 0, 2 * M_PI);
        cairo_fill(cr);
      }
    } else {
      cairo_set_line_width(cr, 2);
      for (size_t k = 0; k < s.x.size(); ++k)
        k == 0 ? cairo_move_to(cr, X(s.x[k]), Y(s.y[k])) : cairo_line_to(cr, X(s.x[k]), Y(s.y[k]));
      cairo_stroke(cr);
    }
    const double ly = top + 14 + 18 * static_cast<double>(i);
    cairo_rectangle(cr, W - right + 12, ly - 8, 14, 8);
    cairo_fill(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    text(cr, W - right + 32, ly, s.name, 11);
  }
  nlohmann::json series = nlohmann::json::array();
  for (const auto& s : plot.series) series.push_back({{"name", s.name}, {"points", s.points}, {"x", s.x}, {"y", s.y}});
  canvas.save({{"picture", "line plot"}, {"title", plot.title}, {"x_label", plot.x_label}, {"y_label", plot.y_label},
               {"series", series}});
}

void write_overlays(const std::string& path, const std::vector<Overlay>& items, const std::string& title) {
  if (items.empty()) fail("no image to draw");
  const double cell = 168, gap = 14, top = 40;
  const int width = static_cast<int>(items.size() * 2 * (cell + gap) + gap), height = static_cast<int>(top + cell + 40);
  Canvas canvas(path, width, height);
  cairo_t* cr = canvas.cr();
  text(cr, width / 2.0, 22, title, 14, kCenter);
  for (size_t n = 0; n < items.size(); ++n) {
    const auto& it = items[n];
    const size_t S = it.image.size(), G = it.map.size();
    if (S == 0 || G == 0) fail("overlay {}: empty image or map", n);
    double vmax = 0;
    for (const auto& row : it.map) vmax = std::max(vmax, *std::max_element(row.begin(), row.end()));
    if (vmax <= 0) vmax = 1;
    const double x_image = gap + static_cast<double>(n) * 2 * (cell + gap), x_map = x_image + cell + gap / 2;
    const double px = cell / static_cast<double>(S);
    for (size_t i = 0; i < S; ++i)
      for (size_t j = 0; j < S; ++j) {
        const double g = std::clamp(it.image[i][j], 0.0, 1.0);
        cairo_set_source_rgb(cr, g, g, g);
        cairo_rectangle(cr, x_image + j * px, top + i * px, px + 0.5, px + 0.5);
        cairo_fill(cr);
        // The map, stretched over the image: G x G cells, the image at half strength beneath.
        const size_t gi = i * G / S, gj = j * G / S;
        set_viridis(cr, it.map[gi][gj] / vmax);
        cairo_rectangle(cr, x_map + j * px, top + i * px, px + 0.5, px + 0.5);
        cairo_fill(cr);
        cairo_set_source_rgba(cr, g, g, g, 0.35);
        cairo_rectangle(cr, x_map + j * px, top + i * px, px + 0.5, px + 0.5);
        cairo_fill(cr);
      }
    cairo_set_source_rgb(cr, 0, 0, 0);
    text(cr, x_image + cell + gap / 4, top + cell + 20, it.caption, 11, kCenter);
  }
  nlohmann::json data = nlohmann::json::array();
  for (const auto& it : items) data.push_back({{"caption", it.caption}, {"image", it.image}, {"map", it.map}});
  canvas.save({{"picture", "overlays"}, {"title", title}, {"items", data}});
}

#else
namespace {
[[noreturn]] void no_cairo(const std::string& path) {
  fail("cannot draw {}: this spanformer was built without Cairo (-DSPANFORMER_PICTURES=OFF)", path);
}
}  // namespace
void write_heatmaps(const std::string& path, const std::vector<Heatmap>&) { no_cairo(path); }
void write_line_plot(const std::string& path, const LinePlot&) { no_cairo(path); }
void write_overlays(const std::string& path, const std::vector<Overlay>&, const std::string&) { no_cairo(path); }
#endif

}  // namespace spanformer::viz
