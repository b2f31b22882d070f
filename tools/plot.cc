#include "tools/plot.h"

#include <png.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>

#include "absl/strings/str_cat.h"

namespace lgpt {
namespace {

// The classic 5x7 font, ASCII 32..126: five columns a glyph, bit 0 the top row.
constexpr uint8_t kFont[95][5] = {
    {0x00, 0x00, 0x00, 0x00, 0x00}, {0x00, 0x00, 0x5F, 0x00, 0x00}, {0x00, 0x07, 0x00, 0x07, 0x00},
    {0x14, 0x7F, 0x14, 0x7F, 0x14}, {0x24, 0x2A, 0x7F, 0x2A, 0x12}, {0x23, 0x13, 0x08, 0x64, 0x62},
    {0x36, 0x49, 0x55, 0x22, 0x50}, {0x00, 0x05, 0x03, 0x00, 0x00}, {0x00, 0x1C, 0x22, 0x41, 0x00},
    {0x00, 0x41, 0x22, 0x1C, 0x00}, {0x08, 0x2A, 0x1C, 0x2A, 0x08}, {0x08, 0x08, 0x3E, 0x08, 0x08},
    {0x00, 0x50, 0x30, 0x00, 0x00}, {0x08, 0x08, 0x08, 0x08, 0x08}, {0x00, 0x60, 0x60, 0x00, 0x00},
    {0x20, 0x10, 0x08, 0x04, 0x02}, {0x3E, 0x51, 0x49, 0x45, 0x3E}, {0x00, 0x42, 0x7F, 0x40, 0x00},
    {0x42, 0x61, 0x51, 0x49, 0x46}, {0x21, 0x41, 0x45, 0x4B, 0x31}, {0x18, 0x14, 0x12, 0x7F, 0x10},
    {0x27, 0x45, 0x45, 0x45, 0x39}, {0x3C, 0x4A, 0x49, 0x49, 0x30}, {0x01, 0x71, 0x09, 0x05, 0x03},
    {0x36, 0x49, 0x49, 0x49, 0x36}, {0x06, 0x49, 0x49, 0x29, 0x1E}, {0x00, 0x36, 0x36, 0x00, 0x00},
    {0x00, 0x56, 0x36, 0x00, 0x00}, {0x08, 0x14, 0x22, 0x41, 0x00}, {0x14, 0x14, 0x14, 0x14, 0x14},
    {0x00, 0x41, 0x22, 0x14, 0x08}, {0x02, 0x01, 0x51, 0x09, 0x06}, {0x32, 0x49, 0x79, 0x41, 0x3E},
    {0x7E, 0x11, 0x11, 0x11, 0x7E}, {0x7F, 0x49, 0x49, 0x49, 0x36}, {0x3E, 0x41, 0x41, 0x41, 0x22},
    {0x7F, 0x41, 0x41, 0x22, 0x1C}, {0x7F, 0x49, 0x49, 0x49, 0x41}, {0x7F, 0x09, 0x09, 0x09, 0x01},
    {0x3E, 0x41, 0x49, 0x49, 0x7A}, {0x7F, 0x08, 0x08, 0x08, 0x7F}, {0x00, 0x41, 0x7F, 0x41, 0x00},
    {0x20, 0x40, 0x41, 0x3F, 0x01}, {0x7F, 0x08, 0x14, 0x22, 0x41}, {0x7F, 0x40, 0x40, 0x40, 0x40},
    {0x7F, 0x02, 0x0C, 0x02, 0x7F}, {0x7F, 0x04, 0x08, 0x10, 0x7F}, {0x3E, 0x41, 0x41, 0x41, 0x3E},
    {0x7F, 0x09, 0x09, 0x09, 0x06}, {0x3E, 0x41, 0x51, 0x21, 0x5E}, {0x7F, 0x09, 0x19, 0x29, 0x46},
    {0x46, 0x49, 0x49, 0x49, 0x31}, {0x01, 0x01, 0x7F, 0x01, 0x01}, {0x3F, 0x40, 0x40, 0x40, 0x3F},
    {0x1F, 0x20, 0x40, 0x20, 0x1F}, {0x3F, 0x40, 0x38, 0x40, 0x3F}, {0x63, 0x14, 0x08, 0x14, 0x63},
    {0x07, 0x08, 0x70, 0x08, 0x07}, {0x61, 0x51, 0x49, 0x45, 0x43}, {0x00, 0x7F, 0x41, 0x41, 0x00},
    {0x02, 0x04, 0x08, 0x10, 0x20}, {0x00, 0x41, 0x41, 0x7F, 0x00}, {0x04, 0x02, 0x01, 0x02, 0x04},
    {0x40, 0x40, 0x40, 0x40, 0x40}, {0x00, 0x01, 0x02, 0x04, 0x00}, {0x20, 0x54, 0x54, 0x54, 0x78},
    {0x7F, 0x48, 0x44, 0x44, 0x38}, {0x38, 0x44, 0x44, 0x44, 0x20}, {0x38, 0x44, 0x44, 0x48, 0x7F},
    {0x38, 0x54, 0x54, 0x54, 0x18}, {0x08, 0x7E, 0x09, 0x01, 0x02}, {0x0C, 0x52, 0x52, 0x52, 0x3E},
    {0x7F, 0x08, 0x04, 0x04, 0x78}, {0x00, 0x44, 0x7D, 0x40, 0x00}, {0x20, 0x40, 0x44, 0x3D, 0x00},
    {0x7F, 0x10, 0x28, 0x44, 0x00}, {0x00, 0x41, 0x7F, 0x40, 0x00}, {0x7C, 0x04, 0x18, 0x04, 0x78},
    {0x7C, 0x08, 0x04, 0x04, 0x78}, {0x38, 0x44, 0x44, 0x44, 0x38}, {0x7C, 0x14, 0x14, 0x14, 0x08},
    {0x08, 0x14, 0x14, 0x18, 0x7C}, {0x7C, 0x08, 0x04, 0x04, 0x08}, {0x48, 0x54, 0x54, 0x54, 0x20},
    {0x04, 0x3F, 0x44, 0x40, 0x20}, {0x3C, 0x40, 0x40, 0x20, 0x7C}, {0x1C, 0x20, 0x40, 0x20, 0x1C},
    {0x3C, 0x40, 0x30, 0x40, 0x3C}, {0x44, 0x28, 0x10, 0x28, 0x44}, {0x0C, 0x50, 0x50, 0x50, 0x3C},
    {0x44, 0x64, 0x54, 0x4C, 0x44}, {0x00, 0x08, 0x36, 0x41, 0x00}, {0x00, 0x00, 0x7F, 0x00, 0x00},
    {0x00, 0x41, 0x36, 0x08, 0x00}, {0x08, 0x04, 0x08, 0x10, 0x08},
};

// Tick values covering [lo, hi]: 1, 2 or 5 times a power of ten, about `count` of them.
std::vector<double> LinearTicks(double lo, double hi, int count) {
  const double raw = (hi - lo) / std::max(count, 1);
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * power;
    if (step >= raw) break;
  }
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step) * step; t <= hi + 1e-9 * step; t += step) {
    ticks.push_back(std::abs(t) < 1e-12 * step ? 0.0 : t);
  }
  return ticks;
}

std::string FormatTick(double v) {
  const double a = std::abs(v);
  char buffer[32];
  if (a >= 1e9) {
    std::snprintf(buffer, sizeof(buffer), "%gG", v / 1e9);
  } else if (a >= 1e6) {
    std::snprintf(buffer, sizeof(buffer), "%gM", v / 1e6);
  } else if (a >= 1e4) {
    std::snprintf(buffer, sizeof(buffer), "%gK", v / 1e3);
  } else {
    std::snprintf(buffer, sizeof(buffer), "%.4g", v);
  }
  return buffer;
}

std::string FormatBytes(double v) {
  char buffer[32];
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (std::abs(v) >= 1024 && unit < 4) v /= 1024, ++unit;
  std::snprintf(buffer, sizeof(buffer), "%g %s", std::round(v * 100) / 100, units[unit]);
  return buffer;
}

void DrawMarker(Image& image, int x, int y, Marker marker, Color color) {
  const int r = 6;
  for (int dy = -r; dy <= r; ++dy) {
    for (int dx = -r; dx <= r; ++dx) {
      bool inside = false;
      switch (marker) {
        case Marker::kCircle:
          inside = dx * dx + dy * dy <= r * r;
          break;
        case Marker::kSquare:
          inside = std::abs(dx) <= r - 1 && std::abs(dy) <= r - 1;
          break;
        case Marker::kTriangle:
          inside = dy >= -r && 2 * std::abs(dx) <= dy + r;
          break;
        case Marker::kDiamond:
          inside = std::abs(dx) + std::abs(dy) <= r;
          break;
      }
      if (inside) image.Set(x + dx, y + dy, color);
    }
  }
}

}  // namespace

Image::Image(int width, int height, Color background)
    : width_(width), height_(height), rgb_(static_cast<size_t>(width) * height * 3) {
  for (size_t i = 0; i < rgb_.size(); i += 3) {
    rgb_[i] = background.r;
    rgb_[i + 1] = background.g;
    rgb_[i + 2] = background.b;
  }
}

Color Image::At(int x, int y) const {
  const size_t i = (static_cast<size_t>(y) * width_ + x) * 3;
  return {rgb_[i], rgb_[i + 1], rgb_[i + 2]};
}

void Image::Set(int x, int y, Color color) {
  if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
  const size_t i = (static_cast<size_t>(y) * width_ + x) * 3;
  rgb_[i] = color.r;
  rgb_[i + 1] = color.g;
  rgb_[i + 2] = color.b;
}

void Image::FillRect(int x0, int y0, int x1, int y1, Color color) {
  for (int y = std::min(y0, y1); y <= std::max(y0, y1); ++y) {
    for (int x = std::min(x0, x1); x <= std::max(x0, x1); ++x) Set(x, y, color);
  }
}

void Image::Line(int x0, int y0, int x1, int y1, Color color) {
  const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
  const int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  int error = dx + dy;
  while (true) {
    Set(x0, y0, color);
    if (x0 == x1 && y0 == y1) break;
    const int e2 = 2 * error;
    if (e2 >= dy) {
      error += dy;
      x0 += sx;
    }
    if (e2 <= dx) {
      error += dx;
      y0 += sy;
    }
  }
}

void Image::Text(int x, int y, absl::string_view text, Color color, int scale) {
  for (char c : text) {
    const int index = (c >= 32 && c <= 126) ? c - 32 : '?' - 32;
    for (int column = 0; column < 5; ++column) {
      for (int row = 0; row < 7; ++row) {
        if ((kFont[index][column] >> row) & 1) {
          FillRect(x + column * scale, y + row * scale, x + (column + 1) * scale - 1,
                   y + (row + 1) * scale - 1, color);
        }
      }
    }
    x += 6 * scale;
  }
}

absl::StatusOr<std::string> EncodePng(const Image& image) {
  png_image png;
  std::memset(&png, 0, sizeof(png));
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(image.width());
  png.height = static_cast<png_uint_32>(image.height());
  png.format = PNG_FORMAT_RGB;
  const png_int_32 row_stride = image.width() * 3;
  png_alloc_size_t size = 0;
  // First the size, then the bytes (libpng's simplified API, zlib's default compression).
  if (!png_image_write_to_memory(&png, nullptr, &size, 0, image.rgb().data(), row_stride,
                                 nullptr)) {
    const std::string message = png.message;
    png_image_free(&png);
    return absl::InternalError(absl::StrCat("libpng: ", message));
  }
  std::string bytes(size, '\0');
  if (!png_image_write_to_memory(&png, bytes.data(), &size, 0, image.rgb().data(), row_stride,
                                 nullptr)) {
    const std::string message = png.message;
    png_image_free(&png);
    return absl::InternalError(absl::StrCat("libpng: ", message));
  }
  bytes.resize(size);
  return bytes;
}

absl::Status WritePng(const std::string& path, const Image& image) {
  absl::StatusOr<std::string> png = EncodePng(image);
  if (!png.ok()) return png.status();
  std::ofstream out(path, std::ios::binary);
  if (!out) return absl::NotFoundError(absl::StrCat("cannot write ", path));
  out.write(png->data(), static_cast<std::streamsize>(png->size()));
  if (!out) return absl::DataLossError(absl::StrCat("failed writing ", path));
  return absl::OkStatus();
}

Image ScatterPlot(const std::vector<Series>& series, const PlotOptions& options) {
  const Color black{0, 0, 0}, grid{225, 225, 225}, grey{90, 90, 90};
  const int text = options.text_scale, glyph_height = 7 * text;
  Image image(options.width, options.height);
  int legend_width = 0;
  for (const Series& s : series) {
    legend_width = std::max(legend_width, Image::TextWidth(s.label, text));
  }
  legend_width += 60;
  const int left = 24 + Image::TextWidth("0000.0", text), right = options.width - legend_width - 20,
            top = 40 + 7 * (text + 1), bottom = options.height - 30 - 3 * glyph_height;
  image.Text(left, 16, options.title, black, text + 1);

  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo, y_lo = x_lo, y_hi = -x_lo;
  auto tx = [&](double x) { return options.log_x ? std::log2(std::max(x, 1e-300)) : x; };
  for (const Series& s : series) {
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      x_lo = std::min(x_lo, tx(x));
      x_hi = std::max(x_hi, tx(x));
      y_lo = std::min(y_lo, y);
      y_hi = std::max(y_hi, y);
    }
  }
  if (!std::isfinite(x_lo)) x_lo = 0, x_hi = 1, y_lo = 0, y_hi = 1;
  if (x_hi - x_lo < 1e-12) x_lo -= 0.5, x_hi += 0.5;
  if (y_hi - y_lo < 1e-12 * std::max(1.0, std::abs(y_hi))) y_lo -= 0.5, y_hi += 0.5;
  const double x_pad = 0.06 * (x_hi - x_lo), y_pad = 0.1 * (y_hi - y_lo);
  x_lo -= x_pad, x_hi += x_pad, y_lo -= y_pad, y_hi += y_pad;
  auto px = [&](double x) {
    return left + static_cast<int>(std::lround((tx(x) - x_lo) / (x_hi - x_lo) * (right - left)));
  };
  auto py = [&](double y) {
    return bottom - static_cast<int>(std::lround((y - y_lo) / (y_hi - y_lo) * (bottom - top)));
  };

  // Grid, ticks and tick labels.
  std::vector<double> x_ticks;
  if (options.log_x) {
    const int first = static_cast<int>(std::ceil(x_lo)), last = static_cast<int>(std::floor(x_hi));
    const int stride = std::max(1, (last - first + 1) / 6 + 1);
    for (int e = first; e <= last; e += stride) x_ticks.push_back(std::ldexp(1.0, e));
  } else {
    x_ticks = LinearTicks(x_lo, x_hi, 6);
  }
  for (double t : x_ticks) {
    const int x = px(t);
    image.Line(x, top, x, bottom, grid);
    image.Line(x, bottom, x, bottom + 5, black);
    const std::string label = options.x_bytes ? FormatBytes(t) : FormatTick(t);
    image.Text(x - Image::TextWidth(label, text) / 2, bottom + 10, label, black, text);
  }
  for (double t : LinearTicks(y_lo, y_hi, 5)) {
    const int y = py(t);
    image.Line(left, y, right, y, grid);
    image.Line(left - 5, y, left, y, black);
    const std::string label = FormatTick(t);
    image.Text(left - 10 - Image::TextWidth(label, text), y - glyph_height / 2, label, black, text);
  }
  image.Line(left, top, left, bottom, black);
  image.Line(left, bottom, right, bottom, black);
  image.Text((left + right - Image::TextWidth(options.x_label, text)) / 2,
             bottom + 20 + glyph_height, options.x_label, grey, text);
  image.Text(8, top - glyph_height - 4, options.y_label, grey, text);

  // Series: lines in x order, then markers on top, then the points' labels where they do not
  // cover another label (points of several policies often share a position).
  struct Box {
    int x0, y0, x1, y1;
    bool Overlaps(const Box& o) const { return x0 < o.x1 && o.x0 < x1 && y0 < o.y1 && o.y0 < y1; }
  };
  std::vector<Box> taken;
  for (const Series& s : series) {
    std::vector<std::pair<double, double>> points;
    for (const auto& p : s.points) {
      if (std::isfinite(p.first) && std::isfinite(p.second)) points.push_back(p);
    }
    std::sort(points.begin(), points.end());
    for (size_t i = 1; i < points.size(); ++i) {
      image.Line(px(points[i - 1].first), py(points[i - 1].second), px(points[i].first),
                 py(points[i].second), s.color);
    }
    for (const auto& [x, y] : points) DrawMarker(image, px(x), py(y), s.marker, s.color);
  }
  for (const Series& s : series) {
    for (size_t i = 0; i < s.points.size() && i < s.point_labels.size(); ++i) {
      const auto& [x, y] = s.points[i];
      if (!std::isfinite(x) || !std::isfinite(y) || s.point_labels[i].empty()) continue;
      const int w = Image::TextWidth(s.point_labels[i], text);
      const int cx = px(x), cy = py(y);
      // Above the marker, below it, then to its right.
      for (const auto& [lx, ly] : {std::pair<int, int>{cx - w / 2, cy - 10 - glyph_height},
                                   {cx - w / 2, cy + 10},
                                   {cx + 10, cy - glyph_height / 2}}) {
        const Box box{lx - 2, ly - 2, lx + w + 2, ly + glyph_height + 2};
        if (std::any_of(taken.begin(), taken.end(),
                        [&](const Box& b) { return b.Overlaps(box); })) {
          continue;
        }
        taken.push_back(box);
        image.Text(lx, ly, s.point_labels[i], s.color, text);
        break;
      }
    }
  }
  // Legend.
  int y = top + 4;
  for (const Series& s : series) {
    DrawMarker(image, right + 36, y + glyph_height / 2, s.marker, s.color);
    image.Line(right + 22, y + glyph_height / 2, right + 50, y + glyph_height / 2, s.color);
    image.Text(right + 60, y, s.label, black, text);
    y += glyph_height + 12;
  }
  if (!options.note.empty()) {
    image.Text(right + 22, y + 8, options.note, grey, text);
  }
  return image;
}

}  // namespace lgpt
