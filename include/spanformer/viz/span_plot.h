// Pictures of learned spans, drawn with Cairo:
//  - a grid of layers (rows) x heads (columns); each cell draws the head's soft mask m_z(d) against
//    distance d (the curve is 1 up to z, then a ramp of width R down to 0), with z written in the cell;
//  - under it, a bar chart of every head's span per layer (log scale, as in the paper's figure 3).
#pragma once
#include <string>
#include <vector>

namespace spanformer::viz {

struct SpanPlotOptions {
  int64_t attn_span = 0;  // L
  int64_t ramp = 32;      // R
  std::string title;
};

// spans[l][k] = z of head k in layer l (tokens). Writes a PNG atomically.
void write_span_plot(const std::string& path, const std::vector<std::vector<double>>& spans,
                     const SpanPlotOptions& options);

}  // namespace spanformer::viz
