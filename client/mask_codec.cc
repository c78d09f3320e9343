#include "client/mask_codec.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "model/io/image_codec.h"
#include "model/io/polygon.h"
#include "model/io/rle.h"

namespace maskd::client {

StatusOr<std::vector<Contour>> ContoursFrom(const v1::Polygons& polygons) {
  std::vector<Contour> out;
  const int n = polygons.polygons_size();
  for (int i = 0; i < n; ++i) {
    const v1::Polygon& p = polygons.polygons(i);
    const std::string f = "polygons[" + std::to_string(i) + "]";
    if (p.points_size() % 2 != 0) {
      return InvalidArgument(f + ".points has " + std::to_string(p.points_size()) +
                             " values (expected x, y pairs)");
    }
    Contour c;
    for (float v : p.points()) {
      if (!std::isfinite(v) || v != std::round(v) || std::fabs(v) > 1e9f) {
        return InvalidArgument(f + ".points holds " + std::to_string(v) +
                               " (expected integral pixel-corner coordinates)");
      }
      c.xy.push_back(static_cast<int32_t>(v));
    }
    c.hole = p.hole();
    c.parent = p.parent();
    if (c.hole && (c.parent < 0 || c.parent >= n)) {
      return InvalidArgument(f + ".parent = " + std::to_string(c.parent) + " (expected 0 .. " +
                             std::to_string(n - 1) + " for a hole)");
    }
    out.push_back(std::move(c));
  }
  return out;
}

StatusOr<std::vector<uint8_t>> DecodeMask(const v1::MaskResult& mask, int width, int height) {
  switch (mask.data_case()) {
    case v1::MaskResult::kRle: {
      const v1::CocoRle& rle = mask.rle();
      if (rle.size_size() != 2 || rle.size(0) != static_cast<uint32_t>(height) ||
          rle.size(1) != static_cast<uint32_t>(width)) {
        return InvalidArgument("mask.rle.size: expected [" + std::to_string(height) + ", " +
                               std::to_string(width) + "] (the image's [height, width])");
      }
      StatusOr<std::vector<uint32_t>> counts = RleCountsFromString(rle.counts());
      if (!counts.ok()) return counts.status();
      return RleDecode(*counts, width, height);
    }
    case v1::MaskResult::kPng: {
      StatusOr<ImageGray8> png = DecodePngGray(mask.png(), "mask.png");
      if (!png.ok()) return png.status();
      if (png->width != width || png->height != height) {
        return InvalidArgument("mask.png: " + std::to_string(png->width) + "x" +
                               std::to_string(png->height) + ", expected " + std::to_string(width) +
                               "x" + std::to_string(height));
      }
      std::vector<uint8_t> out(png->pixels.size());
      for (size_t i = 0; i < out.size(); ++i) out[i] = png->pixels[i] != 0;
      return out;
    }
    case v1::MaskResult::kPolygons: {
      StatusOr<std::vector<Contour>> contours = ContoursFrom(mask.polygons());
      if (!contours.ok()) return contours.status();
      return RasterisePolygons(*contours, width, height);
    }
    case v1::MaskResult::kLowResLogits:
      return InvalidArgument("mask: only 256x256 low-res logits were returned; ask for rle, png or polygons");
    case v1::MaskResult::DATA_NOT_SET:
      break;
  }
  return InvalidArgument("mask: no mask data in the result (rle, png, low_res_logits or polygons expected)");
}

StatusOr<ImageRGB8> DecodeImageBytes(const std::string& bytes) { return DecodeImage(bytes, {}, "image"); }

StatusOr<std::string> EncodePng(const ImageRGB8& image) { return EncodePngRgb(image); }

StatusOr<std::string> ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgument(path + ": cannot open for reading: " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return InvalidArgument(path + ": read error");
  return ss.str();
}

Status WriteFileBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return InvalidArgument(path + ": cannot open for writing: " + std::strerror(errno));
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return Internal(path + ": write error (disk full?)");
  return Status::Ok();
}

}  // namespace maskd::client
