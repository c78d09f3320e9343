// Content addresses of images (EmbedResponse.image_id): lowercase hex SHA-256 over length-framed
// fields, each an 8-byte little-endian length followed by the bytes, in this order:
//   "maskd.image_id.v1", the model identity (ModelInfo.identity), the kind ("encoded" or "raw"),
//   then for "encoded" the file's bytes exactly as sent; for "raw" the width and the height as
//   8-byte little-endian integers (not framed) followed by the framed RGB bytes.
// The server computes it before any decoding, so that a cached image costs one hash and no decode.
// Clients compute the same value up front for the x-maskd-image-id affinity header
// (deploy/envoy/envoy.yaml); this is the one C++ implementation, shared by both (torch-free).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace maskd {

std::string ImageIdForEncoded(std::string_view model_identity, std::string_view bytes);
std::string ImageIdForRaw(std::string_view model_identity, uint32_t width, uint32_t height,
                          std::string_view rgb);
// 64 lowercase hex digits.
bool LooksLikeImageId(std::string_view s);

// Lowercase hex SHA-256 of arbitrary bytes (for tests and other ids).
std::string Sha256Hex(std::string_view bytes);

}  // namespace maskd
