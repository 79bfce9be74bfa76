// Pictures of learned spans, drawn with Cairo, in one of two layouts:
//  curves: a grid of layers (rows) x heads (columns); each cell draws the head's soft mask m_z(d) against
//          distance d (1 up to z, then a ramp of width R down to 0), with z written in the cell; under it,
//          a bar chart of every head's span per layer (log scale, as in the paper's figure 3);
//  grid:   one heat map, layers (rows, layer 0 at the top) x heads (columns), colour = log10 z on a
//          1..L scale with its colour bar, z written in every cell: 24 layers x 8 heads fit one page.
// kAuto picks curves up to 32 heads in all and the grid beyond.
#pragma once
#include <string>
#include <vector>

namespace spanformer::viz {

enum class SpanLayout { kAuto, kCurves, kGrid };
SpanLayout parse_span_layout(const std::string& name);  // auto | curves | grid

struct SpanPlotOptions {
  int64_t attn_span = 0;  // L
  int64_t ramp = 32;      // R
  std::string title;
  SpanLayout layout = SpanLayout::kAuto;
};

// spans[l][k] = z of head k in layer l (tokens). Writes PNG, SVG or PDF (by extension) atomically,
// with the numbers in a JSON file beside it.
void write_span_plot(const std::string& path, const std::vector<std::vector<double>>& spans,
                     const SpanPlotOptions& options);

}  // namespace spanformer::viz
