// Where every picture is drawn (viz/*.cpp; private to them): a Cairo surface chosen by the file's
// extension, rendered in memory and written atomically, with the numbers drawn in a JSON file beside
// it, and the text helper the pictures share.
//
//   .png   raster, one unit = one pixel
//   .svg   vector (SVG 1.1), one unit = one point; text stays text
//   .pdf   vector, one page of width x height points
//
// `picture.png` gets `picture.json` beside it: the values, labels and titles the picture shows, so a
// figure can be redrawn with other tools (each writer says what it puts there).
#pragma once
#include <cairo.h>

#include <nlohmann/json.hpp>

#include <array>
#include <string>

namespace spanformer::viz {

enum class PictureFormat { kPng, kSvg, kPdf };
// From the extension (case-insensitive); a one-line error naming the path for any other.
PictureFormat picture_format(const std::string& path);
// picture.png -> picture.json
std::string data_path_beside(const std::string& path);

class Canvas {
 public:
  Canvas(const std::string& path, double width, double height);  // white background, sans-serif, black ink
  ~Canvas();
  Canvas(const Canvas&) = delete;
  Canvas& operator=(const Canvas&) = delete;

  cairo_t* cr() const { return cr_; }
  // Finishes the picture and writes it, then `data` beside it (data_path_beside), both atomically.
  void save(const nlohmann::json& data);

 private:
  std::string path_;
  PictureFormat format_;
  std::string bytes_;  // what the surface wrote (vector formats write as they draw)
  cairo_surface_t* surface_ = nullptr;
  cairo_t* cr_ = nullptr;
};

// Text at (x, y) (the baseline's start), `align` of its width to the left of x (0 left, 0.5 centred,
// 1 right-aligned); `vertical` turns it a quarter anticlockwise about (x, y), for y-axis labels.
constexpr double kLeft = 0.0, kCenter = 0.5, kRight = 1.0;
void text(cairo_t* cr, double x, double y, const std::string& s, double size, double align = kLeft, bool vertical = false);
// The same text in the current colour on a white box (a label drawn over data stays readable).
void label(cairo_t* cr, double x, double y, const std::string& s, double size, double align = kLeft);

// The colour ramp of every heat map (viridis-like: dark blue, teal, green, yellow), t clamped to [0, 1].
std::array<double, 3> viridis(double t);
void set_viridis(cairo_t* cr, double t);

}  // namespace spanformer::viz
