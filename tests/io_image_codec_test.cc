// Image codec: round trips through every encoder, every decoder path (grey, palette, alpha, 16-bit,
// EXIF orientation), and the errors for bad input (truncated files, unknown formats, limits, raw).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include <jpeglib.h>
#include <png.h>
#if __has_include(<webp/encode.h>)
#include <webp/encode.h>
#define MASKD_TEST_HAS_WEBP_ENCODER 1
#endif

#include "model/io/image_codec.h"

namespace maskd {
namespace {

ImageRGB8 Gradient(int w, int h) {
  ImageRGB8 im{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3)};
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      uint8_t* p = &im.pixels[(static_cast<size_t>(y) * w + x) * 3];
      p[0] = static_cast<uint8_t>(x * 255 / std::max(1, w - 1));
      p[1] = static_cast<uint8_t>(y * 255 / std::max(1, h - 1));
      p[2] = static_cast<uint8_t>((x + y) & 0xff);
    }
  return im;
}

ImageRGB8 Noise(int w, int h, uint32_t seed) {
  std::mt19937 rng(seed);
  ImageRGB8 im{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3)};
  for (auto& v : im.pixels) v = static_cast<uint8_t>(rng());
  return im;
}

double MeanAbsDiff(const ImageRGB8& a, const ImageRGB8& b) {
  double s = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i) s += std::abs(int(a.pixels[i]) - int(b.pixels[i]));
  return s / a.pixels.size();
}

void PngWriteToString(png_structp png, png_bytep data, png_size_t n) {
  static_cast<std::string*>(png_get_io_ptr(png))->append(reinterpret_cast<char*>(data), n);
}
void PngNoFlush(png_structp) {}

// Writes a PNG with arbitrary IHDR parameters (RGBA, palette, 16-bit...) for the decoder tests.
std::string WritePng(int w, int h, int bit_depth, int color_type, const std::vector<uint8_t>& raw_rows,
                     const std::vector<png_color>& palette = {}) {
  std::string out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  png_set_write_fn(png, &out, PngWriteToString, PngNoFlush);
  png_set_IHDR(png, info, w, h, bit_depth, color_type, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (!palette.empty()) png_set_PLTE(png, info, palette.data(), static_cast<int>(palette.size()));
  png_write_info(png, info);
  const size_t row_bytes = raw_rows.size() / h;
  for (int y = 0; y < h; ++y) png_write_row(png, raw_rows.data() + y * row_bytes);
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

std::string WriteGreyJpeg(int w, int h, const std::vector<uint8_t>& grey) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr jerr;
  cinfo.err = jpeg_std_error(&jerr);
  jpeg_create_compress(&cinfo);
  unsigned char* buf = nullptr;
  unsigned long size = 0;  // NOLINT
  jpeg_mem_dest(&cinfo, &buf, &size);
  cinfo.image_width = w;
  cinfo.image_height = h;
  cinfo.input_components = 1;
  cinfo.in_color_space = JCS_GRAYSCALE;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, 98, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(grey.data() + cinfo.next_scanline * w);
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::string out(reinterpret_cast<char*>(buf), size);
  std::free(buf);
  return out;
}

// A JPEG with an EXIF APP1 segment carrying only the orientation tag, inserted after SOI.
std::string WithExifOrientation(const std::string& jpeg, int orientation) {
  std::string tiff;
  tiff += std::string("MM\0\x2a\0\0\0\x08", 8);                      // big-endian, IFD0 at offset 8
  tiff += std::string("\0\x01", 2);                                   // one entry
  tiff += std::string("\x01\x12\0\x03\0\0\0\x01", 8);                 // tag 0x0112, SHORT, count 1
  tiff += static_cast<char>(0);
  tiff += static_cast<char>(orientation);
  tiff += std::string("\0\0", 2);                                     // value padding
  tiff += std::string("\0\0\0\0", 4);                                 // no next IFD
  std::string payload = std::string("Exif\0\0", 6) + tiff;
  const size_t len = payload.size() + 2;
  std::string app1 = "\xff\xe1";
  app1 += static_cast<char>(len >> 8);
  app1 += static_cast<char>(len & 0xff);
  app1 += payload;
  return jpeg.substr(0, 2) + app1 + jpeg.substr(2);
}

const uint8_t* Px(const ImageRGB8& im, int x, int y) {
  return &im.pixels[(static_cast<size_t>(y) * im.width + x) * 3];
}

TEST(ServerImageCodec, DetectsFormatsFromContent) {
  EXPECT_EQ(DetectImageFormat(std::string("\xff\xd8\xff\xe0", 4)), ImageFormat::kJpeg);
  EXPECT_EQ(DetectImageFormat(std::string("\x89PNG\r\n\x1a\n", 8)), ImageFormat::kPng);
  EXPECT_EQ(DetectImageFormat(std::string("RIFF\x10\0\0\0WEBPVP8 ", 16)), ImageFormat::kWebp);
  EXPECT_EQ(DetectImageFormat("GIF89a"), ImageFormat::kUnknown);
  EXPECT_EQ(DetectImageFormat(""), ImageFormat::kUnknown);
  EXPECT_STREQ(ImageFormatName(ImageFormat::kPng), "png");
}

TEST(ServerImageCodec, PngRgbRoundTripIsExact) {
  auto im = Noise(37, 23, 1);
  auto png = EncodePngRgb(im);
  ASSERT_TRUE(png.ok()) << png.status().ToString();
  auto back = DecodeImage(*png);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->width, 37);
  EXPECT_EQ(back->height, 23);
  EXPECT_EQ(back->pixels, im.pixels);
}

TEST(ServerImageCodec, PngMaskIsOneBitAndRoundTrips) {
  const int w = 19, h = 11;
  std::vector<uint8_t> mask(w * h);
  std::mt19937 rng(5);
  for (auto& v : mask) v = rng() % 3 == 0 ? 1 : 0;
  auto png = EncodePngMask(mask.data(), w, h, PngOptions{1});
  ASSERT_TRUE(png.ok()) << png.status().ToString();
  // IHDR: bit depth at byte 24, colour type at byte 25.
  ASSERT_GT(png->size(), 26u);
  EXPECT_EQ(static_cast<uint8_t>((*png)[24]), 1);
  EXPECT_EQ(static_cast<uint8_t>((*png)[25]), PNG_COLOR_TYPE_GRAY);
  auto grey = DecodePngGray(*png);
  ASSERT_TRUE(grey.ok()) << grey.status().ToString();
  ASSERT_EQ(grey->pixels.size(), mask.size());
  for (size_t i = 0; i < mask.size(); ++i) EXPECT_EQ(grey->pixels[i], mask[i] ? 255 : 0) << i;
  auto rgb = DecodeImage(*png);
  ASSERT_TRUE(rgb.ok());
  for (size_t i = 0; i < mask.size(); ++i) EXPECT_EQ(rgb->pixels[i * 3 + 1], mask[i] ? 255 : 0);
}

TEST(ServerImageCodec, PngGreyBecomesRgb) {
  ImageGray8 g{4, 3, {0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110}};
  auto png = EncodePngGray(g);
  ASSERT_TRUE(png.ok());
  auto rgb = DecodeImage(*png);
  ASSERT_TRUE(rgb.ok()) << rgb.status().ToString();
  for (size_t i = 0; i < g.pixels.size(); ++i)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(rgb->pixels[i * 3 + c], g.pixels[i]);
}

TEST(ServerImageCodec, PngAlphaIsDroppedNotComposited) {
  // RGBA with alpha 0: compositing on black would give 0, dropping alpha keeps the colour.
  std::vector<uint8_t> rows = {200, 100, 50, 0, 1, 2, 3, 128};
  auto png = WritePng(2, 1, 8, PNG_COLOR_TYPE_RGBA, rows);
  auto rgb = DecodeImage(png);
  ASSERT_TRUE(rgb.ok()) << rgb.status().ToString();
  EXPECT_EQ(rgb->pixels, (std::vector<uint8_t>{200, 100, 50, 1, 2, 3}));
}

TEST(ServerImageCodec, PngPaletteAndSixteenBit) {
  std::vector<png_color> pal = {{10, 20, 30}, {40, 50, 60}};
  auto png = WritePng(2, 1, 8, PNG_COLOR_TYPE_PALETTE, {1, 0}, pal);
  auto rgb = DecodeImage(png);
  ASSERT_TRUE(rgb.ok()) << rgb.status().ToString();
  EXPECT_EQ(rgb->pixels, (std::vector<uint8_t>{40, 50, 60, 10, 20, 30}));

  // 16-bit RGB keeps the high byte.
  auto png16 = WritePng(1, 1, 16, PNG_COLOR_TYPE_RGB, {0x12, 0x34, 0xab, 0xcd, 0xff, 0x00});
  auto rgb16 = DecodeImage(png16);
  ASSERT_TRUE(rgb16.ok()) << rgb16.status().ToString();
  EXPECT_EQ(rgb16->pixels, (std::vector<uint8_t>{0x12, 0xab, 0xff}));
}

TEST(ServerImageCodec, JpegRoundTripIsClose) {
  auto im = Gradient(64, 48);
  auto jpeg = EncodeJpeg(im, 95);
  ASSERT_TRUE(jpeg.ok()) << jpeg.status().ToString();
  EXPECT_EQ(DetectImageFormat(*jpeg), ImageFormat::kJpeg);
  auto back = DecodeImage(*jpeg);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->width, 64);
  ASSERT_EQ(back->height, 48);
  EXPECT_LT(MeanAbsDiff(im, *back), 3.0);
  // Lower quality: smaller file, still the same picture.
  auto small = EncodeJpeg(im, 20);
  ASSERT_TRUE(small.ok());
  EXPECT_LT(small->size(), jpeg->size());
}

TEST(ServerImageCodec, JpegGreyBecomesRgb) {
  std::vector<uint8_t> grey(16 * 8);
  for (size_t i = 0; i < grey.size(); ++i) grey[i] = static_cast<uint8_t>(i * 2);
  auto rgb = DecodeImage(WriteGreyJpeg(16, 8, grey));
  ASSERT_TRUE(rgb.ok()) << rgb.status().ToString();
  for (size_t i = 0; i < grey.size(); ++i) {
    EXPECT_EQ(rgb->pixels[i * 3], rgb->pixels[i * 3 + 1]);
    EXPECT_EQ(rgb->pixels[i * 3], rgb->pixels[i * 3 + 2]);
    EXPECT_NEAR(rgb->pixels[i * 3], grey[i], 4);
  }
}

// The EXIF specification's words for each orientation, as pixel positions: where the stored image's
// first row (x, 0) ends up on the upright image of size (W', H').
TEST(ServerImageCodec, ExifOrientationFollowsTheSpecification) {
  const int W = 3, H = 2;
  ImageRGB8 s{W, H, {}};
  for (int i = 0; i < W * H; ++i) s.pixels.insert(s.pixels.end(), {uint8_t(i), uint8_t(i), uint8_t(i)});
  auto at = [&](const ImageRGB8& im, int x, int y) { return int(Px(im, x, y)[0]); };
  auto stored = [&](int x, int y) { return y * W + x; };
  for (int o = 1; o <= 8; ++o) {
    auto d = ApplyExifOrientation(s, o);
    const bool swapped = o >= 5;
    ASSERT_EQ(d.width, swapped ? H : W) << o;
    ASSERT_EQ(d.height, swapped ? W : H) << o;
    for (int x = 0; x < W; ++x) {
      const int v = stored(x, 0);
      switch (o) {
        case 1: EXPECT_EQ(at(d, x, 0), v); break;                      // row 0 = top, col 0 = left
        case 2: EXPECT_EQ(at(d, W - 1 - x, 0), v); break;              // row 0 = top, col 0 = right
        case 3: EXPECT_EQ(at(d, W - 1 - x, H - 1), v); break;          // row 0 = bottom, col 0 = right
        case 4: EXPECT_EQ(at(d, x, H - 1), v); break;                  // row 0 = bottom, col 0 = left
        case 5: EXPECT_EQ(at(d, 0, x), v); break;                      // row 0 = left, col 0 = top
        case 6: EXPECT_EQ(at(d, H - 1, x), v); break;                  // row 0 = right, col 0 = top
        case 7: EXPECT_EQ(at(d, H - 1, W - 1 - x), v); break;          // row 0 = right, col 0 = bottom
        case 8: EXPECT_EQ(at(d, 0, W - 1 - x), v); break;              // row 0 = left, col 0 = bottom
      }
    }
  }
}

TEST(ServerImageCodec, JpegExifOrientationIsApplied) {
  // Four flat quadrants (JPEG-safe), 32 wide and 16 high: red | green over blue | white.
  ImageRGB8 im{32, 16, std::vector<uint8_t>(32 * 16 * 3)};
  for (int y = 0; y < 16; ++y)
    for (int x = 0; x < 32; ++x) {
      uint8_t* p = &im.pixels[(y * 32 + x) * 3];
      const bool right = x >= 16, bottom = y >= 8;
      const uint8_t c[4][3] = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {255, 255, 255}};
      std::memcpy(p, c[(bottom ? 2 : 0) + (right ? 1 : 0)], 3);
    }
  auto jpeg = EncodeJpeg(im, 95);
  ASSERT_TRUE(jpeg.ok());
  auto rotated = DecodeImage(WithExifOrientation(*jpeg, 6));
  ASSERT_TRUE(rotated.ok()) << rotated.status().ToString();
  if (!ExifSupported()) {
    // Documented behaviour without libexif: the orientation is ignored.
    EXPECT_EQ(rotated->width, 32);
    EXPECT_EQ(rotated->height, 16);
    GTEST_SKIP() << "built without libexif: EXIF orientation is ignored (checked that it is)";
  }
  // Rotated 90 degrees clockwise: 16 wide, 32 high; the stored top-left (red) is now top-right.
  ASSERT_EQ(rotated->width, 16);
  ASSERT_EQ(rotated->height, 32);
  const uint8_t* top_right = Px(*rotated, 12, 4);
  EXPECT_GT(top_right[0], 200);
  EXPECT_LT(top_right[1], 60);
  const uint8_t* top_left = Px(*rotated, 3, 4);  // stored bottom-left: blue
  EXPECT_GT(top_left[2], 200);
  EXPECT_LT(top_left[0], 60);
  // Orientation 1 changes nothing.
  auto upright = DecodeImage(WithExifOrientation(*jpeg, 1));
  ASSERT_TRUE(upright.ok());
  EXPECT_EQ(upright->width, 32);
}

TEST(ServerImageCodec, WebpDecodes) {
  if (!WebpSupported()) {
    auto r = DecodeImage(std::string("RIFF\x10\0\0\0WEBPVP8 xxxxxxxx", 24));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("built without libwebp"), std::string::npos);
    GTEST_SKIP() << "built without libwebp: checked that WebP is refused with a clear message";
  }
#ifdef MASKD_TEST_HAS_WEBP_ENCODER
  auto im = Noise(20, 10, 9);
  uint8_t* out = nullptr;
  const size_t n = WebPEncodeLosslessRGB(im.pixels.data(), 20, 10, 60, &out);
  ASSERT_GT(n, 0u);
  std::string webp(reinterpret_cast<char*>(out), n);
  WebPFree(out);
  EXPECT_EQ(DetectImageFormat(webp), ImageFormat::kWebp);
  auto back = DecodeImage(webp);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->pixels, im.pixels);
  auto truncated = DecodeImage(webp.substr(0, webp.size() / 2));
  ASSERT_FALSE(truncated.ok());
  EXPECT_EQ(truncated.status().code(), StatusCode::kInvalidArgument);
#endif
}

TEST(ServerImageCodec, TruncatedJpegIsInvalidArgument) {
  auto jpeg = EncodeJpeg(Noise(64, 64, 2), 90);
  ASSERT_TRUE(jpeg.ok());
  for (size_t keep : {jpeg->size() / 2, jpeg->size() - 10, size_t{20}, size_t{3}}) {
    auto r = DecodeImage(jpeg->substr(0, keep), ImageLimits{}, "images[1].encoded");
    ASSERT_FALSE(r.ok()) << "kept " << keep;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message().rfind("images[1].encoded: corrupt or truncated JPEG (", 0), 0u)
        << r.status().message();
  }
}

TEST(ServerImageCodec, TruncatedOrCorruptPngIsInvalidArgument) {
  auto png = EncodePngRgb(Noise(64, 64, 3));
  ASSERT_TRUE(png.ok());
  for (size_t keep : {png->size() / 2, png->size() - 20, size_t{30}, size_t{8}}) {
    auto r = DecodeImage(png->substr(0, keep));
    ASSERT_FALSE(r.ok()) << "kept " << keep;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message().rfind("image.encoded: corrupt or truncated PNG (", 0), 0u)
        << r.status().message();
  }
  std::string flipped = *png;
  flipped[40] ^= 0x5a;  // inside IDAT: CRC or zlib error
  auto r = DecodeImage(flipped);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

TEST(ServerImageCodec, UnknownAndEmptyAreInvalidArgument) {
  auto unknown = DecodeImage("GIF89a\x01\x02");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("unknown image format (first bytes 47 49 46 38 39 61"),
            std::string::npos)
      << unknown.status().message();
  auto empty = DecodeImage("");
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("image.encoded: is empty"), std::string::npos);
}

TEST(ServerImageCodec, LimitsAreCheckedBeforeDecoding) {
  auto png = EncodePngRgb(Gradient(100, 50));
  ASSERT_TRUE(png.ok());
  ImageLimits bytes_limit;
  bytes_limit.max_bytes = 10;
  auto r1 = DecodeImage(*png, bytes_limit);
  ASSERT_FALSE(r1.ok());
  EXPECT_NE(r1.status().message().find("bytes (expected at most 10)"), std::string::npos)
      << r1.status().message();

  ImageLimits pixel_limit;
  pixel_limit.max_pixels = 4999;
  auto r2 = DecodeImage(*png, pixel_limit);
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("100 x 50 = 5000 pixels (expected at most 4999)"),
            std::string::npos)
      << r2.status().message();

  ImageLimits side_limit;
  side_limit.max_side = 64;
  auto jpeg = EncodeJpeg(Gradient(100, 50), 80);
  auto r3 = DecodeImage(*jpeg, side_limit);
  ASSERT_FALSE(r3.ok());
  EXPECT_NE(r3.status().message().find("100 x 50 pixels (expected each side at most 64)"),
            std::string::npos)
      << r3.status().message();
}

TEST(ServerImageCodec, RawImageChecks) {
  auto ok = ImageFromRaw(2, 1, std::string("\x01\x02\x03\x04\x05\x06", 6));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->pixels, (std::vector<uint8_t>{1, 2, 3, 4, 5, 6}));

  auto zero = ImageFromRaw(0, 10, "");
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().message(), "image.raw.width = 0 (expected 1 .. 16384)");
  auto zero_h = ImageFromRaw(3, 0, "");
  ASSERT_FALSE(zero_h.ok());
  EXPECT_EQ(zero_h.status().message(), "image.raw.height = 0 (expected 1 .. 16384)");

  auto wrong = ImageFromRaw(4, 3, std::string(35, '\0'));
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(wrong.status().message(),
            "image.raw.rgb has 35 bytes (expected width * height * 3 = 36)");

  ImageLimits small;
  small.max_pixels = 11;
  auto big = ImageFromRaw(4, 3, std::string(36, '\0'), small);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().message(), "image.raw is 4 x 3 = 12 pixels (expected at most 11)");
}

TEST(ServerImageCodec, EncoderArgumentErrors) {
  EXPECT_FALSE(EncodeJpeg(Gradient(4, 4), 0).ok());
  EXPECT_FALSE(EncodeJpeg(ImageRGB8{4, 4, {}}, 90).ok());
  EXPECT_FALSE(EncodePngRgb(ImageRGB8{4, 4, std::vector<uint8_t>(5)}).ok());
  std::vector<uint8_t> m(4, 1);
  EXPECT_FALSE(EncodePngMask(m.data(), 0, 4).ok());
  EXPECT_FALSE(EncodePngMask(m.data(), 2, 2, PngOptions{12}).ok());
}

TEST(ServerImageCodec, DeclaredSizeComesFromTheHeaderOnly) {
  const ImageRGB8 im = Gradient(37, 21);
  const std::string png = *EncodePngRgb(im);
  const std::string jpeg = *EncodeJpeg(im);
  for (const std::string* file : {&png, &jpeg}) {
    auto size = ReadDeclaredSize(*file);
    ASSERT_TRUE(size.ok()) << size.status().ToString();
    EXPECT_EQ(size->width, 37u);
    EXPECT_EQ(size->height, 21u);
    // The header alone is enough: the pixel data may be missing.
    auto head = ReadDeclaredSize(file->substr(0, file == &png ? 33 : file->size() - 10));
    ASSERT_TRUE(head.ok()) << head.status().ToString();
    EXPECT_EQ(head->width * head->height, 37u * 21u);
  }
#ifdef MASKD_TEST_HAS_WEBP_ENCODER
  if (WebpSupported()) {
    uint8_t* out = nullptr;
    const size_t n = WebPEncodeLosslessRGB(im.pixels.data(), 37, 21, 37 * 3, &out);
    ASSERT_GT(n, 0u);
    auto size = ReadDeclaredSize(std::string(reinterpret_cast<const char*>(out), n));
    WebPFree(out);
    ASSERT_TRUE(size.ok()) << size.status().ToString();
    EXPECT_EQ(size->width, 37u);
    EXPECT_EQ(size->height, 21u);
  }
#endif
  // A PNG header may declare any size: it is reported, for the caller to budget or refuse.
  std::string huge = png;
  for (int i = 0; i < 4; ++i) huge[16 + i] = static_cast<char>(i == 1 ? 0x01 : 0);  // 65536 wide
  EXPECT_EQ(ReadDeclaredSize(huge)->width, 65536u);
  auto garbage = ReadDeclaredSize("not an image at all");
  ASSERT_FALSE(garbage.ok());
  EXPECT_EQ(garbage.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(garbage.status().message().find("image.encoded"), std::string::npos);
  EXPECT_FALSE(ReadDeclaredSize(jpeg.substr(0, 4)).ok());
  EXPECT_FALSE(ReadDeclaredSize(png.substr(0, 20)).ok());
}

}  // namespace
}  // namespace maskd
