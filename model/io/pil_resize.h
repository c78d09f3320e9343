// Pillow's antialiased bilinear resampling of 8-bit images, reimplemented from its documented
// algorithm (separable convolution with a triangle filter stretched by the scale factor when
// downsampling; weights normalised per output pixel, then converted to 22-bit fixed point; the
// horizontal pass first, each pass rounding and clamping to 8 bits). SAM's ResizeLongestSide calls
// PIL.Image.resize(BILINEAR) through torchvision, so matching it bit for bit is what makes the PNG
// path of maskd equal the original's `input_resized`.
//
// Torch-free; the GPU resize kernel uses the same coefficients, so both paths agree exactly.
#pragma once

#include <cstdint>
#include <vector>

#include "model/api/image.h"

namespace maskd {

// Fixed-point precision of Pillow's 8-bit resampling.
inline constexpr int kPilPrecisionBits = 32 - 8 - 2;

// Coefficients of one 1-D pass: output pixel i reads `bounds[2 i + 1]` input pixels starting at
// `bounds[2 i]`, with weights `weights[i * ksize + j]` in kPilPrecisionBits fixed point.
struct PilCoefficients {
  int in_size = 0;
  int out_size = 0;
  int ksize = 0;
  std::vector<int32_t> bounds;   // 2 * out_size
  std::vector<int32_t> weights;  // out_size * ksize
};

PilCoefficients PilBilinearCoefficients(int in_size, int out_size);

// Resizes RGB8 pixels to (out_width, out_height) exactly as Pillow 9.4's Image.resize(BILINEAR).
ImageRGB8 PilResizeBilinear(const ImageRGB8& in, int out_width, int out_height);

}  // namespace maskd
