// What one request may ask for, with the defaults. The server's flags start from these values,
// validation checks against them and GetInfo reports them; nothing else writes the numbers.
#pragma once

#include <cstddef>
#include <cstdint>

namespace maskd {

struct Limits {
  uint64_t max_image_bytes = uint64_t{32} << 20;
  uint64_t max_image_pixels = 64'000'000;
  int max_image_side = 16384;
  uint32_t max_prompts_per_request = 256;
  uint32_t max_points_per_prompt = 64;
  size_t max_request_tag_bytes = 128;
};

// SAM's low-res mask side: mask inputs and low-res logits are kLowResSide x kLowResSide in v1.
inline constexpr int kLowResSide = 256;

}  // namespace maskd
