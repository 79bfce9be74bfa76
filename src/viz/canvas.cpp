#include "spanformer/build_options.h"
#if SPANFORMER_WITH_CAIRO
#include "canvas.h"

#include <cairo-pdf.h>
#include <cairo-svg.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>

#include "spanformer/util/error.h"
#include "spanformer/util/io.h"

namespace spanformer::viz {
namespace {

cairo_status_t append(void* closure, const unsigned char* data, unsigned int length) {
  static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
  return CAIRO_STATUS_SUCCESS;
}

}  // namespace

PictureFormat picture_format(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (ext == ".png") return PictureFormat::kPng;
  if (ext == ".svg") return PictureFormat::kSvg;
  if (ext == ".pdf") return PictureFormat::kPdf;
  fail("{}: a picture is written as .png, .svg or .pdf (by its extension)", path);
}

std::string data_path_beside(const std::string& path) {
  return std::filesystem::path(path).replace_extension(".json").string();
}

Canvas::Canvas(const std::string& path, double width, double height) : path_(path), format_(picture_format(path)) {
  // Cairo's image surfaces end at 32767 pixels a side (beyond it: "invalid value (typically too big)").
  constexpr double kMaxSide = 32767;
  if (!(width >= 1 && height >= 1 && width <= kMaxSide && height <= kMaxSide))
    fail("cannot draw {}: {:.0f} x {:.0f} pixels, beyond the {:.0f} a side a picture can have (show fewer "
         "tokens, layers or heads)", path, width, height, kMaxSide);
  switch (format_) {
    case PictureFormat::kPng:
      surface_ = cairo_image_surface_create(CAIRO_FORMAT_ARGB32, static_cast<int>(std::ceil(width)),
                                            static_cast<int>(std::ceil(height)));
      break;
    case PictureFormat::kSvg:
      surface_ = cairo_svg_surface_create_for_stream(append, &bytes_, width, height);
      break;
    case PictureFormat::kPdf:
      surface_ = cairo_pdf_surface_create_for_stream(append, &bytes_, width, height);
      break;
  }
  if (cairo_surface_status(surface_) != CAIRO_STATUS_SUCCESS)
    fail("cannot draw {}: {}", path, cairo_status_to_string(cairo_surface_status(surface_)));
  cr_ = cairo_create(surface_);
  cairo_set_source_rgb(cr_, 1, 1, 1);
  cairo_paint(cr_);
  cairo_select_font_face(cr_, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_source_rgb(cr_, 0, 0, 0);
}

Canvas::~Canvas() {
  if (cr_) cairo_destroy(cr_);
  if (surface_) cairo_surface_destroy(surface_);
}

void Canvas::save(const nlohmann::json& data) {
  cairo_destroy(cr_);
  cr_ = nullptr;
  cairo_status_t status = CAIRO_STATUS_SUCCESS;
  if (format_ == PictureFormat::kPng) {
    status = cairo_surface_write_to_png_stream(surface_, append, &bytes_);
  } else {
    cairo_surface_finish(surface_);
    status = cairo_surface_status(surface_);
  }
  if (status != CAIRO_STATUS_SUCCESS) fail("cannot draw {}: {}", path_, cairo_status_to_string(status));
  write_file_atomic(path_, bytes_);
  write_file_atomic(data_path_beside(path_), data.dump() + "\n");
}

void text(cairo_t* cr, double x, double y, const std::string& s, double size, double align, bool vertical) {
  cairo_set_font_size(cr, size);
  cairo_text_extents_t ext;
  cairo_text_extents(cr, s.c_str(), &ext);
  cairo_save(cr);
  cairo_move_to(cr, x, y);
  if (vertical) cairo_rotate(cr, -M_PI / 2);
  cairo_rel_move_to(cr, -align * (ext.width + ext.x_bearing), 0);
  cairo_show_text(cr, s.c_str());
  cairo_restore(cr);
}

void label(cairo_t* cr, double x, double y, const std::string& s, double size, double align) {
  cairo_set_font_size(cr, size);
  cairo_text_extents_t ext;
  cairo_text_extents(cr, s.c_str(), &ext);
  const double left = x - align * (ext.width + ext.x_bearing) + ext.x_bearing, pad = 2;
  cairo_save(cr);
  cairo_set_source_rgba(cr, 1, 1, 1, 0.9);
  cairo_rectangle(cr, left - pad, y + ext.y_bearing - pad, ext.width + 2 * pad, ext.height + 2 * pad);
  cairo_fill(cr);
  cairo_restore(cr);
  text(cr, x, y, s, size, align);
}

std::array<double, 3> viridis(double t) {
  t = std::clamp(t, 0.0, 1.0);
  static const double stops[5][3] = {{0.27, 0.00, 0.33}, {0.23, 0.32, 0.55}, {0.13, 0.57, 0.55}, {0.37, 0.79, 0.38},
                                     {0.99, 0.91, 0.14}};
  const double f = t * 4;
  const int i = std::min(3, static_cast<int>(f));
  const double u = f - i;
  std::array<double, 3> c{};
  for (int k = 0; k < 3; ++k) c[k] = stops[i][k] + u * (stops[i + 1][k] - stops[i][k]);
  return c;
}

void set_viridis(cairo_t* cr, double t) {
  const auto c = viridis(t);
  cairo_set_source_rgb(cr, c[0], c[1], c[2]);
}

}  // namespace spanformer::viz
#endif  // SPANFORMER_WITH_CAIRO
