// Image decoding and encoding for maskd, its clients and tools. Torch-free.
//
// Decoding (what the server accepts):
// - The format is detected from the content (magic bytes), never from a name: JPEG (libjpeg API; on
//   the GPU host libjpeg-turbo), PNG (libpng), WebP (libwebp; only when built with MASKD_WITH_WEBP,
//   see WebpSupported()).
// - JPEG EXIF orientation (tag 0x0112, values 1..8) is applied when built with libexif
//   (ExifSupported()); without libexif it is ignored and the stored pixel grid is returned.
// - Grey, palette and 16-bit images become 8-bit RGB; alpha is dropped (not composited), as
//   Pillow's Image.convert("RGB") does. CMYK JPEGs are converted to RGB.
// - Limits are checked before any pixel is decoded: encoded size, each side, and the pixel count.
// - Truncated or corrupt data is INVALID_ARGUMENT with the decoder's reason; every message starts
//   with the caller's field name (e.g. "image.encoded: ...").
//
// Encoding (what the server returns and clients/tools send): PNG (1-bit grey masks, 8-bit grey, RGB)
// and JPEG at a given quality.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/api/image.h"
#include "model/api/status.h"

namespace maskd {

enum class ImageFormat { kUnknown, kJpeg, kPng, kWebp };
const char* ImageFormatName(ImageFormat f);  // "jpeg", "png", "webp", "unknown"

// From the first bytes: JPEG FF D8 FF, PNG's 8-byte signature, WebP "RIFF" .... "WEBP".
ImageFormat DetectImageFormat(std::string_view bytes);

bool WebpSupported();
bool ExifSupported();

struct ImageLimits {
  // Encoded bytes (the maskd.proto default: 32 MiB).
  uint64_t max_bytes = uint64_t{32} << 20;
  // Decoded width * height (the maskd.proto default: 64 megapixels).
  uint64_t max_pixels = 64'000'000;
  // Each side, after EXIF orientation.
  int max_side = 16384;
};

// Decodes JPEG/PNG/WebP bytes to upright RGB8.
StatusOr<ImageRGB8> DecodeImage(std::string_view bytes, const ImageLimits& limits = {},
                                std::string_view field = "image.encoded");

// The width and height an encoded file declares, read from its header only (JPEG markers up to the
// first scan, PNG IHDR, WebP's header): what decoding it would cost (width * height * 3 bytes)
// before any pixel is decoded. Limits are DecodeImage's job; INVALID_ARGUMENT when the header is
// unreadable or the format unknown.
struct DeclaredSize {
  uint64_t width = 0, height = 0;
};
StatusOr<DeclaredSize> ReadDeclaredSize(std::string_view bytes, std::string_view field = "image.encoded");

// Validates and copies raw RGB8 pixels (width * height * 3 bytes, rows top to bottom).
StatusOr<ImageRGB8> ImageFromRaw(int64_t width, int64_t height, std::string_view rgb,
                                 const ImageLimits& limits = {}, std::string_view field = "image.raw");

// A single-channel 8-bit image (masks, greyscale).
struct ImageGray8 {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;  // width * height
};

// Decodes a PNG to one 8-bit channel (for masks: a 1-bit PNG gives 0 and 255; colour is converted
// to luma). For tests and clients reading OUTPUT_FORMAT_PNG masks.
StatusOr<ImageGray8> DecodePngGray(std::string_view bytes, std::string_view field = "png");

// zlib levels: 1 is fastest; the server uses it for masks, which compress well at any level.
struct PngOptions {
  int compression_level = 6;
};

// A 1-bit greyscale PNG of a row-major mask (nonzero -> 1).
StatusOr<std::string> EncodePngMask(const uint8_t* mask, int width, int height,
                                    const PngOptions& options = {});
StatusOr<std::string> EncodePngGray(const ImageGray8& image, const PngOptions& options = {});
StatusOr<std::string> EncodePngRgb(const ImageRGB8& image, const PngOptions& options = {});

// Baseline JPEG, 4:2:0 chroma subsampling (libjpeg's default), quality 1 .. 100.
StatusOr<std::string> EncodeJpeg(const ImageRGB8& image, int quality = 90);

// Applies an EXIF orientation (1..8, the TIFF tag's meaning) to pixels: e.g. 6 rotates 90 degrees
// clockwise. Exposed for tests; DecodeImage calls it for JPEGs when built with libexif.
ImageRGB8 ApplyExifOrientation(const ImageRGB8& image, int orientation);

}  // namespace maskd
