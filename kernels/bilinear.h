// The per-pixel arithmetic of at::upsample_bilinear2d (align_corners=False), shared by the mask
// post-processing kernel and a CPU test that checks it against ATen itself. Plain C++ (host and
// device), no ATen, no CUDA headers.
//
// ATen: scale = float(in) / out; src = scale * (dst + 0.5) - 0.5, clamped at 0; i0 = (int)src;
// i1 = i0 + (i0 < in - 1); lambda1 = src - i0; lambda0 = 1 - lambda1;
// value = h0 * (w0 * a + w1 * b) + h1 * (w0 * c + w1 * d), written in the same expression shape.
#pragma once

#if defined(__CUDACC__)
#define MASKD_HD __host__ __device__ __forceinline__
#else
#define MASKD_HD inline
#endif

namespace maskd::kernels::bilinear {

struct Taps {
  int i0, i1;
  float l0, l1;
};

MASKD_HD float Scale(int in_size, int out_size) {
  return static_cast<float>(in_size) / static_cast<float>(out_size);
}

MASKD_HD Taps SourceTaps(float scale, int dst, int in_size) {
  float src = scale * (dst + 0.5f) - 0.5f;
  if (src < 0.0f) src = 0.0f;
  Taps t;
  t.i0 = static_cast<int>(src);
  t.i1 = t.i0 + (t.i0 < in_size - 1 ? 1 : 0);
  t.l1 = src - t.i0;
  t.l0 = 1.0f - t.l1;
  return t;
}

// The horizontal step of one source row: (row, c.i0) = a and (row, c.i1) = b.
MASKD_HD float Horizontal(const Taps& c, float a, float b) { return c.l0 * a + c.l1 * b; }
// The vertical step from the two rows' horizontal values.
MASKD_HD float Vertical(const Taps& r, float top, float bottom) { return r.l0 * top + r.l1 * bottom; }

// One interpolated value from the four taps (a = (r.i0, c.i0), b = (r.i0, c.i1), c = (r.i1, c.i0),
// d = (r.i1, c.i1)): ATen's expression, r.l0 * (c.l0 * a + c.l1 * b) + r.l1 * (c.l0 * cc + c.l1 * d),
// as its two steps, so that a kernel may compute a row's horizontal values once and reuse them for
// every output row between its taps. The same operations in the same order; nvcc may still pair the
// products into FMAs differently from ATen's build (an fp32 rounding: postprocess.cu says what the
// tests allow).
MASKD_HD float Combine(const Taps& r, const Taps& c, float a, float b, float cc, float d) {
  return Vertical(r, Horizontal(c, a, b), Horizontal(c, cc, d));
}

}  // namespace maskd::kernels::bilinear
