// Pictures of attention, drawn with Cairo and written atomically as PNG:
//  - heat maps of weight matrices (queries as rows, keys as columns: pooling weights, alignment maps,
//    attention heads), with tick labels, axis names and a colour bar;
//  - line plots (fits of attention pooling against the truth, with the training points);
//  - images with a coarse map laid over them (ViT attention rollout: which patches fed the class).
#pragma once
#include <string>
#include <vector>

namespace spanformer::viz {

struct Heatmap {
  std::vector<std::vector<double>> values;     // rows x columns
  std::vector<std::string> row_ticks, col_ticks;  // empty, or one per row / column (drawn when they fit)
  std::string title, row_label, col_label;
};
// Panels side by side, one colour scale each (0 .. the panel's largest value).
void write_heatmaps(const std::string& path, const std::vector<Heatmap>& panels);

struct Series {
  std::string name;
  std::vector<double> x, y;
  bool points = false;  // dots instead of a line
};
struct LinePlot {
  std::vector<Series> series;
  std::string title, x_label, y_label;
};
void write_line_plot(const std::string& path, const LinePlot& plot);

struct Overlay {
  std::vector<std::vector<double>> image;  // S x S grey levels in [0, 1]
  std::vector<std::vector<double>> map;    // G x G weights (scaled to its maximum), stretched over the image
  std::string caption;
};
void write_overlays(const std::string& path, const std::vector<Overlay>& items, const std::string& title);

}  // namespace spanformer::viz
