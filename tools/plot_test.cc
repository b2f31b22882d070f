#include "tools/plot.h"

#include <png.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace lgpt {
namespace {

// Decodes `png` with libpng into 8-bit RGB rows.
bool DecodePng(const std::string& png, int* width, int* height, std::vector<uint8_t>* rgb) {
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, png.data(), png.size())) return false;
  image.format = PNG_FORMAT_RGB;
  rgb->assign(PNG_IMAGE_SIZE(image), 0);
  if (!png_image_finish_read(&image, nullptr, rgb->data(), 0, nullptr)) return false;
  *width = static_cast<int>(image.width);
  *height = static_cast<int>(image.height);
  return true;
}

TEST(PlotTest, PngDecodesWithLibpngToTheSamePixels) {
  Image image(300, 90, {10, 20, 30});
  image.Set(0, 0, {255, 0, 0});
  image.Set(299, 89, {0, 255, 0});
  image.Line(0, 89, 299, 0, {1, 2, 3});
  const absl::StatusOr<std::string> png = EncodePng(image);
  ASSERT_TRUE(png.ok()) << png.status();
  ASSERT_EQ(png->substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
  ASSERT_TRUE(DecodePng(*png, &width, &height, &rgb));
  EXPECT_EQ(width, 300);
  EXPECT_EQ(height, 90);
  EXPECT_EQ(rgb, image.rgb());
  // Compressed: far below the 81 KB of raw pixels.
  EXPECT_LT(png->size(), 4000u);
}

TEST(PlotTest, TextDrawsGlyphs) {
  Image image(40, 10);
  image.Text(1, 1, "1", {0, 0, 0});
  // '1' is a vertical bar in the middle column with a foot.
  EXPECT_EQ(image.At(1 + 2, 1 + 3), (Color{0, 0, 0}));
  EXPECT_EQ(image.At(1 + 0, 1 + 3), (Color{255, 255, 255}));
  int inked = 0;
  Image word(60, 10);
  word.Text(0, 0, "h2o 8K", {0, 0, 0});
  for (int y = 0; y < 10; ++y) {
    for (int x = 0; x < 60; ++x) inked += word.At(x, y) == Color{0, 0, 0};
  }
  EXPECT_GT(inked, 30);
  EXPECT_EQ(Image::TextWidth("h2o 8K"), 36);
}

TEST(PlotTest, ScatterPlotPutsMarkersWhereThePointsAre) {
  Series a{"window 16-bit", {200, 30, 30}, Marker::kCircle, {{1024, 10}, {4096, 12}}};
  Series b{"sink 4-bit", {30, 30, 200}, Marker::kSquare, {{2048, 11}}};
  PlotOptions options;
  options.log_x = true;
  const Image image = ScatterPlot({a, b}, options);
  int red = 0, blue = 0;
  for (int y = 0; y < image.height(); ++y) {
    for (int x = 0; x < image.width(); ++x) {
      red += image.At(x, y) == a.color;
      blue += image.At(x, y) == b.color;
    }
  }
  EXPECT_GT(red, 60);   // two markers, the line and the legend
  EXPECT_GT(blue, 80);  // one square marker plus the legend's
  EXPECT_FALSE(EncodePng(image).value().empty());
}

// A chart the size eval_cache writes: it decodes, and it is small (the stored-block encoder
// this replaced wrote 1.5 MB).
TEST(PlotTest, ChartPngIsSmallAndDecodes) {
  std::vector<Series> series;
  const char* policies[] = {"dense", "window", "sink", "h2o"};
  for (int p = 0; p < 4; ++p) {
    Series s{absl::StrCat(policies[p], " 32-bit"),
             {static_cast<uint8_t>(60 * p), 80, 200},
             Marker::kCircle,
             {}};
    for (int budget : {64, 128, 256}) {
      s.points.push_back({budget * 4096.0, 50.0 + p + 8.0 * 64 / budget});
      s.point_labels.push_back(absl::StrCat(budget));
    }
    series.push_back(s);
  }
  PlotOptions options;
  options.title = "Perplexity vs KV bytes";
  options.log_x = true;
  options.x_bytes = true;
  options.note = "labels: budget";
  const std::string path =
      absl::StrCat(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp", "/chart.png");
  ASSERT_TRUE(WritePng(path, ScatterPlot(series, options)).ok());
  std::ifstream in(path, std::ios::binary);
  const std::string png((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
  ASSERT_TRUE(DecodePng(png, &width, &height, &rgb));
  EXPECT_EQ(width, options.width);
  EXPECT_EQ(height, options.height);
  EXPECT_LT(png.size(), 60000u);
  // The budget labels are drawn in their series' colour beside the points.
  auto inked = [](const Image& image, Color color) {
    int count = 0;
    for (int y = 0; y < image.height(); ++y) {
      for (int x = 0; x < image.width(); ++x) count += image.At(x, y) == color;
    }
    return count;
  };
  std::vector<Series> unlabelled = series;
  for (Series& s : unlabelled) s.point_labels.clear();
  EXPECT_GT(inked(ScatterPlot(series, options), series[3].color),
            inked(ScatterPlot(unlabelled, options), series[3].color) + 50);
}

}  // namespace
}  // namespace lgpt
