#include "cache/eval/plot.h"

#include <cstring>

#include "gtest/gtest.h"

namespace lgpt {
namespace {

uint32_t ReadU32(const std::string& s, size_t at) {
  return (static_cast<uint32_t>(static_cast<uint8_t>(s[at])) << 24) |
         (static_cast<uint32_t>(static_cast<uint8_t>(s[at + 1])) << 16) |
         (static_cast<uint32_t>(static_cast<uint8_t>(s[at + 2])) << 8) |
         static_cast<uint32_t>(static_cast<uint8_t>(s[at + 3]));
}

const uint8_t* Bytes(const std::string& s, size_t at = 0) {
  return reinterpret_cast<const uint8_t*>(s.data()) + at;
}

TEST(PlotTest, ChecksumsMatchKnownAnswers) {
  const std::string digits = "123456789", wiki = "Wikipedia";
  EXPECT_EQ(Crc32(Bytes(digits), digits.size()), 0xCBF43926u);
  EXPECT_EQ(Adler32(Bytes(wiki), wiki.size()), 0x11E60398u);
}

// Decodes what EncodePng writes (stored blocks only) and checks every field on the way.
TEST(PlotTest, PngRoundTripsThroughADecoder) {
  // Wide enough that the image data needs several stored blocks.
  Image image(300, 90, {10, 20, 30});
  image.Set(0, 0, {255, 0, 0});
  image.Set(299, 89, {0, 255, 0});
  image.Line(0, 89, 299, 0, {1, 2, 3});
  const std::string png = EncodePng(image);
  ASSERT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  size_t at = 8;
  std::string idat;
  std::vector<std::string> types;
  while (at < png.size()) {
    const uint32_t length = ReadU32(png, at);
    const std::string type = png.substr(at + 4, 4);
    types.push_back(type);
    EXPECT_EQ(Crc32(Bytes(png, at + 4), length + 4), ReadU32(png, at + 8 + length)) << type;
    if (type == "IHDR") {
      EXPECT_EQ(ReadU32(png, at + 8), 300u);
      EXPECT_EQ(ReadU32(png, at + 12), 90u);
      EXPECT_EQ(png.substr(at + 16, 5), std::string("\x08\x02\x00\x00\x00", 5));
    }
    if (type == "IDAT") idat += png.substr(at + 8, length);
    at += 12 + length;
  }
  EXPECT_EQ(at, png.size());
  EXPECT_EQ(types, (std::vector<std::string>{"IHDR", "IDAT", "IEND"}));
  ASSERT_EQ((static_cast<uint8_t>(idat[0]) * 256 + static_cast<uint8_t>(idat[1])) % 31, 0);
  std::string raw;
  size_t p = 2;
  int blocks = 0;
  while (true) {
    const uint8_t header = static_cast<uint8_t>(idat[p]);
    ASSERT_EQ(header & 6, 0) << "stored blocks only";
    const uint16_t length =
        static_cast<uint8_t>(idat[p + 1]) | (static_cast<uint8_t>(idat[p + 2]) << 8);
    const uint16_t inverse =
        static_cast<uint8_t>(idat[p + 3]) | (static_cast<uint8_t>(idat[p + 4]) << 8);
    ASSERT_EQ(static_cast<uint16_t>(~length), inverse);
    raw += idat.substr(p + 5, length);
    p += 5 + length;
    ++blocks;
    if (header & 1) break;
  }
  EXPECT_GT(blocks, 1);
  EXPECT_EQ(ReadU32(idat, p), Adler32(Bytes(raw), raw.size()));
  EXPECT_EQ(p + 4, idat.size());
  ASSERT_EQ(raw.size(), 90u * (1 + 300 * 3));
  for (int y = 0; y < 90; ++y) {
    ASSERT_EQ(raw[y * 901], '\0');
    EXPECT_EQ(std::memcmp(raw.data() + y * 901 + 1, image.rgb().data() + y * 900, 900), 0);
  }
  EXPECT_EQ(image.At(0, 0), (Color{255, 0, 0}));
  EXPECT_EQ(image.At(299, 89), (Color{0, 255, 0}));
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
  EXPECT_FALSE(EncodePng(image).empty());
}

}  // namespace
}  // namespace lgpt
