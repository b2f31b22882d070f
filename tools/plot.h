// A minimal chart maker for the KV cache evaluation (no plotting library is available): RGB
// images, line-and-marker scatter plots with axes, ticks, labels on the points and a legend
// drawn in a built-in 5x7 bitmap font (scaled), written as PNG by Debian's libpng.
#ifndef LGPT_TOOLS_PLOT_H_
#define LGPT_TOOLS_PLOT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lgpt {

struct Color {
  uint8_t r = 0, g = 0, b = 0;
  bool operator==(const Color& o) const { return r == o.r && g == o.g && b == o.b; }
};

// An RGB image, rows top to bottom, 3 bytes a pixel.
class Image {
 public:
  Image(int width, int height, Color background = {255, 255, 255});
  int width() const { return width_; }
  int height() const { return height_; }
  const std::vector<uint8_t>& rgb() const { return rgb_; }
  Color At(int x, int y) const;
  void Set(int x, int y, Color color);                         // ignores pixels outside the image
  void FillRect(int x0, int y0, int x1, int y1, Color color);  // inclusive corners
  void Line(int x0, int y0, int x1, int y1, Color color);
  // Text in the 5x7 font (6 pixels a character at scale 1), top-left at (x, y). Characters
  // outside printable ASCII draw as '?'.
  void Text(int x, int y, absl::string_view text, Color color, int scale = 1);
  static int TextWidth(absl::string_view text, int scale = 1) {
    return static_cast<int>(text.size()) * 6 * scale;
  }

 private:
  int width_, height_;
  std::vector<uint8_t> rgb_;
};

// The PNG file bytes (8-bit RGB, compressed by libpng/zlib).
absl::StatusOr<std::string> EncodePng(const Image& image);
absl::Status WritePng(const std::string& path, const Image& image);

enum class Marker { kCircle, kSquare, kTriangle, kDiamond };

struct Series {
  std::string label;
  Color color;
  Marker marker = Marker::kCircle;
  std::vector<std::pair<double, double>> points;  // (x, y), joined in x order
  // Optional text beside each point (e.g. its KV budget), parallel to `points`; a label that
  // would cover another is left out.
  std::vector<std::string> point_labels = {};
};

struct PlotOptions {
  std::string title, x_label, y_label;
  bool log_x = false;
  bool x_bytes = false;  // x tick labels in binary units (KiB, MiB, GiB)
  std::string note;      // a line under the legend (e.g. what the point labels mean)
  int width = 1200, height = 760;
  int text_scale = 2;  // 5x7 glyphs drawn this many pixels a dot (the title one more)
};

// Axes with about five ticks each (log_x: powers of two), every series' points joined by a
// line and drawn with its marker, and a legend of the series' labels on the right.
Image ScatterPlot(const std::vector<Series>& series, const PlotOptions& options);

}  // namespace lgpt

#endif  // LGPT_TOOLS_PLOT_H_
