// Every image decoder path of model/io/image_codec (JPEG with and without EXIF orientation, PNG in
// every colour type and depth, WebP when built) under libFuzzer, with the server's own entry points:
// ReadDeclaredSize (the byte budget reads it before decoding) and DecodeImage, plus DecodePngGray
// (clients reading PNG masks). Invariants checked on success: the pixel buffer is width * height * 3,
// the sides are within the limits, the decoded size is the declared one (or its transpose, after an
// EXIF rotation), and a decoded image survives a PNG round trip unchanged.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

#include "model/io/image_codec.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  // Small limits keep a lying header from spending the fuzzer's time and memory (the limit checks
  // themselves are what is fuzzed); the server's defaults are bigger but checked the same way.
  maskd::ImageLimits limits;
  limits.max_bytes = 1 << 20;
  limits.max_pixels = 1 << 20;
  limits.max_side = 4096;

  maskd::StatusOr<maskd::DeclaredSize> declared = maskd::ReadDeclaredSize(bytes);
  maskd::StatusOr<maskd::ImageRGB8> image = maskd::DecodeImage(bytes, limits);
  if (image.ok()) {
    const maskd::ImageRGB8& im = *image;
    FUZZ_CHECK(im.width >= 1 && im.height >= 1 && im.width <= limits.max_side &&
                   im.height <= limits.max_side,
               "decoded %dx%d outside the limits", im.width, im.height);
    FUZZ_CHECK(static_cast<uint64_t>(im.width) * im.height <= limits.max_pixels,
               "decoded %dx%d over max_pixels", im.width, im.height);
    FUZZ_CHECK(im.pixels.size() == static_cast<size_t>(im.width) * im.height * 3,
               "%zu bytes of pixels for %dx%d", im.pixels.size(), im.width, im.height);
    FUZZ_CHECK(declared.ok(), "decodes but ReadDeclaredSize refuses it: %s",
               declared.status().message().c_str());
    const uint64_t w = im.width, h = im.height;
    FUZZ_CHECK((declared->width == w && declared->height == h) ||
                   (declared->width == h && declared->height == w),
               "declared %llux%llu, decoded %dx%d", static_cast<unsigned long long>(declared->width),
               static_cast<unsigned long long>(declared->height), im.width, im.height);
    if (w * h <= 4096) {
      maskd::StatusOr<std::string> png = maskd::EncodePngRgb(im);
      FUZZ_CHECK(png.ok(), "re-encoding failed: %s", png.status().message().c_str());
      maskd::StatusOr<maskd::ImageRGB8> again = maskd::DecodeImage(*png, limits);
      FUZZ_CHECK(again.ok() && again->width == im.width && again->height == im.height &&
                     again->pixels == im.pixels,
                 "a decoded image does not survive a PNG round trip");
      for (int orientation = 1; orientation <= 8; ++orientation) {
        maskd::ImageRGB8 turned = maskd::ApplyExifOrientation(im, orientation);
        FUZZ_CHECK(turned.pixels.size() == im.pixels.size(), "orientation %d changed the size",
                   orientation);
      }
    }
  }
  if (maskd::DetectImageFormat(bytes) == maskd::ImageFormat::kPng) {
    maskd::StatusOr<maskd::ImageGray8> gray = maskd::DecodePngGray(bytes);
    if (gray.ok()) {
      FUZZ_CHECK(gray->pixels.size() == static_cast<size_t>(gray->width) * gray->height,
                 "%zu grey bytes for %dx%d", gray->pixels.size(), gray->width, gray->height);
    }
  }
  return 0;
}
