// Images as plain values: the pixels a request brings and the geometry of SAM's longest-side resize.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace maskd {

// 8-bit RGB pixels, rows top to bottom, 3 bytes per pixel.
struct ImageRGB8 {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;  // width * height * 3
};

// The shape SAM's longest-side resize gives: (width, height) scaled so max(width, height) == target,
// rounded as the original (ResizeLongestSide.get_preprocess_shape: scale in double, round half up).
// One deviation: a side is never below 1 pixel. The original rounds the short side of e.g. a
// 1 x 4000 or 1 x 2049 image to 0, an empty image no mask can be cropped from; any other shape is
// unchanged.
inline std::pair<int, int> ResizedSize(int width, int height, int target) {
  const double scale = target * 1.0 / std::max(width, height);
  const int w = std::max(1, static_cast<int>(width * scale + 0.5));
  const int h = std::max(1, static_cast<int>(height * scale + 0.5));
  return {w, h};
}

// Where an image lies in the model's frame: its original size and its size after the longest-side
// resize (before padding). Every handle of an image carries one.
struct ImageGeometry {
  int original_width = 0, original_height = 0;
  int input_width = 0, input_height = 0;
};

}  // namespace maskd
