// A picture of a segmentation for people: the image with one mask blended in colour, its outline,
// and the prompt's points (green = foreground, red = background) and box drawn on top.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "client/client.h"
#include "model/api/image.h"

namespace maskd::client {

struct OverlayStyle {
  std::array<uint8_t, 3> mask_colour{30, 144, 255};
  // Weight of the mask colour in the blend.
  float alpha = 0.5f;
  // Marker radius and line width in pixels, scaled up for large images so that they stay visible.
  int point_radius = 0;  // 0: max(4, longest side / 150)
  int line_width = 0;    // 0: max(2, longest side / 400)
};

// `mask` is row-major, height x width, nonzero = inside. Points and box are drawn clipped to the
// image. Returns INVALID_ARGUMENT when the mask does not match the image size.
StatusOr<ImageRGB8> DrawOverlay(const ImageRGB8& image, const std::vector<uint8_t>& mask,
                                const PromptArg& prompt, const OverlayStyle& style = {});

}  // namespace maskd::client
