// Turning what the server returns into pixels, for clients: a MaskResult (COCO RLE, PNG or polygons) to a
// row-major 0/1 mask, and image files to and from RGB pixels. Thin glue over maskd_io's codecs
// (model/io/image_codec.h, model/io/rle.h), so that the clients decode exactly what the server encodes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "maskd/v1/maskd.pb.h"
#include "model/api/image.h"
#include "model/api/status.h"
#include "model/io/polygon.h"

namespace maskd::client {

// Row-major height x width mask, one byte per pixel (0 or 1). INVALID_ARGUMENT for logits-only
// results (the low-res logits need the server's upscaling) or undecodable data.
StatusOr<std::vector<uint8_t>> DecodeMask(const v1::MaskResult& mask, int width, int height);

// The polygons of an OUTPUT_FORMAT_POLYGONS result as maskd_io contours. INVALID_ARGUMENT for an odd
// number of coordinates, a non-integral vertex (v1 vertices are pixel corners) or a parent out of
// range.
StatusOr<std::vector<Contour>> ContoursFrom(const v1::Polygons& polygons);

StatusOr<ImageRGB8> DecodeImageBytes(const std::string& bytes);
StatusOr<std::string> EncodePng(const ImageRGB8& image);

StatusOr<std::string> ReadFileBytes(const std::string& path);
Status WriteFileBytes(const std::string& path, const std::string& bytes);

}  // namespace maskd::client
