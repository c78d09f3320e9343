// Content addresses of images: lowercase hex SHA-256 over the model identity and the image exactly
// as the client sent it (encoded bytes, or width, height and pixels for raw input). Computed before
// any decoding, so that a cached image costs one hash and no decode. Clients never choose it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace maskd::server {

std::string ImageIdForEncoded(std::string_view model_identity, std::string_view bytes);
std::string ImageIdForRaw(std::string_view model_identity, uint32_t width, uint32_t height,
                          std::string_view rgb);
// 64 lowercase hex digits.
bool LooksLikeImageId(std::string_view s);

// Lowercase hex SHA-256 of arbitrary bytes (for tests and other ids).
std::string Sha256Hex(std::string_view bytes);

}  // namespace maskd::server
