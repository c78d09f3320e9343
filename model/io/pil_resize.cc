#include "model/io/pil_resize.h"

#include <algorithm>
#include <cmath>

namespace maskd {
namespace {

// Pillow's bilinear ("triangle") filter, support 1.
double Triangle(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

inline uint8_t Clip8(int32_t v) {
  // Arithmetic shift: negative sums clamp to 0, sums past 255.99 clamp to 255.
  int32_t s = v >> kPilPrecisionBits;
  return static_cast<uint8_t>(std::clamp(s, 0, 255));
}

}  // namespace

PilCoefficients PilBilinearCoefficients(int in_size, int out_size) {
  PilCoefficients c;
  c.in_size = in_size;
  c.out_size = out_size;
  const double support_unit = 1.0;
  // Pillow passes the box edges as floats; for a whole-image resize in1 - in0 == in_size exactly.
  const double scale = static_cast<double>(static_cast<float>(in_size) - 0.0f) / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = support_unit * filterscale;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.bounds.resize(2 * static_cast<size_t>(out_size));
  c.weights.assign(static_cast<size_t>(out_size) * c.ksize, 0);
  std::vector<double> k(c.ksize);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      k[x] = Triangle((x + xmin - center + 0.5) * ss);
      ww += k[x];
    }
    for (int x = 0; x < xmax; ++x) {
      const double w = ww != 0.0 ? k[x] / ww : k[x];
      // Round half away from zero into fixed point, as Pillow's normalize_coeffs_8bpc.
      const double f = w * (1 << kPilPrecisionBits);
      c.weights[static_cast<size_t>(xx) * c.ksize + x] =
          static_cast<int32_t>(w < 0 ? -0.5 + f : 0.5 + f);
    }
    c.bounds[2 * xx] = xmin;
    c.bounds[2 * xx + 1] = xmax;
  }
  return c;
}

ImageRGB8 PilResizeBilinear(const ImageRGB8& in, int out_width, int out_height) {
  const bool need_horizontal = out_width != in.width;
  const bool need_vertical = out_height != in.height;
  ImageRGB8 cur = in;
  if (need_horizontal) {
    const PilCoefficients c = PilBilinearCoefficients(in.width, out_width);
    ImageRGB8 tmp;
    tmp.width = out_width;
    tmp.height = cur.height;
    tmp.pixels.resize(static_cast<size_t>(tmp.width) * tmp.height * 3);
    for (int y = 0; y < cur.height; ++y) {
      const uint8_t* row = cur.pixels.data() + static_cast<size_t>(y) * cur.width * 3;
      uint8_t* out = tmp.pixels.data() + static_cast<size_t>(y) * tmp.width * 3;
      for (int xx = 0; xx < out_width; ++xx) {
        const int xmin = c.bounds[2 * xx], xlen = c.bounds[2 * xx + 1];
        const int32_t* k = c.weights.data() + static_cast<size_t>(xx) * c.ksize;
        int32_t s0 = 1 << (kPilPrecisionBits - 1), s1 = s0, s2 = s0;
        for (int x = 0; x < xlen; ++x) {
          const uint8_t* p = row + static_cast<size_t>(x + xmin) * 3;
          s0 += p[0] * k[x];
          s1 += p[1] * k[x];
          s2 += p[2] * k[x];
        }
        out[3 * xx] = Clip8(s0);
        out[3 * xx + 1] = Clip8(s1);
        out[3 * xx + 2] = Clip8(s2);
      }
    }
    cur = std::move(tmp);
  }
  if (need_vertical) {
    const PilCoefficients c = PilBilinearCoefficients(cur.height, out_height);
    ImageRGB8 tmp;
    tmp.width = cur.width;
    tmp.height = out_height;
    tmp.pixels.resize(static_cast<size_t>(tmp.width) * tmp.height * 3);
    const size_t stride = static_cast<size_t>(cur.width) * 3;
    for (int yy = 0; yy < out_height; ++yy) {
      const int ymin = c.bounds[2 * yy], ylen = c.bounds[2 * yy + 1];
      const int32_t* k = c.weights.data() + static_cast<size_t>(yy) * c.ksize;
      uint8_t* out = tmp.pixels.data() + static_cast<size_t>(yy) * stride;
      for (size_t xc = 0; xc < stride; ++xc) {
        int32_t s = 1 << (kPilPrecisionBits - 1);
        for (int y = 0; y < ylen; ++y) s += cur.pixels[(y + ymin) * stride + xc] * k[y];
        out[xc] = Clip8(s);
      }
    }
    cur = std::move(tmp);
  }
  return cur;
}

}  // namespace maskd
