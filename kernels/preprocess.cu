// Pillow-exact bilinear resize of uint8 RGB, then (x - mean) / std and zero padding.
//
// The integer arithmetic mirrors model/pil_resize.cc term for term (22-bit fixed-point weights, the
// rounding constant 1 << 21, an arithmetic shift and a clamp to 0..255 after each pass), so the uint8
// intermediate is bit-identical; the normalisation uses IEEE sub/div (__fsub_rn / __fdiv_rn), the same
// two roundings as LibTorch's (x - mean) / std in float32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/float_convert.cuh"
#include "kernels/launchers.h"

namespace maskd::kernels::detail {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // model/pil_resize.h kPilPrecisionBits

__device__ __forceinline__ uint8_t Clip8(int32_t v) {
  const int32_t s = v >> kPrecisionBits;
  return static_cast<uint8_t>(s < 0 ? 0 : (s > 255 ? 255 : s));
}

// One thread per output pixel (3 channels) of one input row (blockIdx.y).
__global__ void PilHorizontalKernel(const uint8_t* __restrict__ in, int in_w,
                                    uint8_t* __restrict__ out, int out_w,
                                    const int32_t* __restrict__ bounds,
                                    const int32_t* __restrict__ weights, int ksize) {
  const int xx = blockIdx.x * blockDim.x + threadIdx.x;
  const int y = blockIdx.y;
  if (xx >= out_w) return;
  const int xmin = bounds[2 * xx];
  const int xlen = bounds[2 * xx + 1];
  const int32_t* k = weights + static_cast<int64_t>(xx) * ksize;
  const uint8_t* row = in + static_cast<int64_t>(y) * in_w * 3;
  int32_t s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
  for (int x = 0; x < xlen; ++x) {
    const uint8_t* px = row + static_cast<int64_t>(x + xmin) * 3;
    const int32_t w = k[x];
    s0 += px[0] * w;
    s1 += px[1] * w;
    s2 += px[2] * w;
  }
  uint8_t* o = out + (static_cast<int64_t>(y) * out_w + xx) * 3;
  o[0] = Clip8(s0);
  o[1] = Clip8(s1);
  o[2] = Clip8(s2);
}


// One thread per padded output pixel (x, y = blockIdx.y), all 3 planes.
template <typename OutT>
__global__ void PilVerticalNormalizePadKernel(const NormalizePadArgs a) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x;
  const int y = blockIdx.y;
  if (x >= a.pad) return;
  OutT* out = static_cast<OutT*>(a.out);
  const int64_t plane = static_cast<int64_t>(a.pad) * a.pad;
  const int64_t o = static_cast<int64_t>(y) * a.pad + x;
  if (y >= a.out_h || x >= a.out_w) {
    for (int c = 0; c < 3; ++c) out[c * plane + o] = FromFloat<OutT>(0.0f);
    return;
  }
  const int64_t row_pitch = static_cast<int64_t>(a.out_w) * 3;
  uint8_t v[3];
  if (a.vertical) {
    const int ymin = a.bounds[2 * y];
    const int ylen = a.bounds[2 * y + 1];
    const int32_t* k = a.weights + static_cast<int64_t>(y) * a.ksize;
    int32_t s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
    for (int j = 0; j < ylen; ++j) {
      const uint8_t* px = a.in + (ymin + j) * row_pitch + x * 3;
      const int32_t w = k[j];
      s0 += px[0] * w;
      s1 += px[1] * w;
      s2 += px[2] * w;
    }
    v[0] = Clip8(s0);
    v[1] = Clip8(s1);
    v[2] = Clip8(s2);
  } else {
    const uint8_t* px = a.in + y * row_pitch + x * 3;
    v[0] = px[0];
    v[1] = px[1];
    v[2] = px[2];
  }
  for (int c = 0; c < 3; ++c) {
    const float r = __fdiv_rn(__fsub_rn(static_cast<float>(v[c]), a.mean[c]), a.std[c]);
    out[c * plane + o] = FromFloat<OutT>(r);
  }
}

constexpr int kThreads = 128;

}  // namespace

cudaError_t LaunchPilHorizontal(const uint8_t* in, int in_h, int in_w, uint8_t* out, int out_w,
                                const int32_t* bounds, const int32_t* weights, int ksize,
                                cudaStream_t stream) {
  const dim3 grid((out_w + kThreads - 1) / kThreads, in_h);
  PilHorizontalKernel<<<grid, kThreads, 0, stream>>>(in, in_w, out, out_w, bounds, weights, ksize);
  return cudaGetLastError();
}

cudaError_t LaunchPilVerticalNormalizePad(const NormalizePadArgs& a, DType out_dtype,
                                          cudaStream_t stream) {
  const dim3 grid((a.pad + kThreads - 1) / kThreads, a.pad);
  switch (out_dtype) {
    case DType::kFloat32:
      PilVerticalNormalizePadKernel<float><<<grid, kThreads, 0, stream>>>(a);
      break;
    case DType::kBFloat16:
      PilVerticalNormalizePadKernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(a);
      break;
    case DType::kFloat16:
      PilVerticalNormalizePadKernel<__half><<<grid, kThreads, 0, stream>>>(a);
      break;
  }
  return cudaGetLastError();
}

}  // namespace maskd::kernels::detail
