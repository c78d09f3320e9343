// Device-side e4m3 row quantisation pieces shared by the kernels that write fp8 rows (fp8.cu's
// QuantizeRowsFp8 kernels, encoder_fusion.cu's AddLayerNorm with fp8 output): the row scale and the
// saturating conversion, the arithmetic of fp8.cc's LibTorch reference (kernels.h, Fp8Rows).
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

namespace maskd::kernels {

constexpr float kE4m3Max = 448.0f;
// A zero row's scale (FLT_MIN, as in fp8.cc): any positive value quantises it to zeros; the smallest
// normal float keeps its reciprocal finite.
constexpr float kE4m3MinScale = 1.17549435082228750797e-38f;

// The scale of a row whose largest magnitude is amax: max(amax * fl(1/448), FLT_MIN).
__device__ __forceinline__ float E4m3RowScale(float amax) {
  return fmaxf(__fmul_rn(amax, 1.0f / kE4m3Max), kE4m3MinScale);
}

// e4m3 of a * r and b * r (r = fl(1/scale)), round to nearest even, saturating (the clamp to +-448
// of the reference without its instructions; NaN stays NaN); a in the low byte.
__device__ __forceinline__ __nv_fp8x2_storage_t E4m3x2(float a, float b, float r) {
  return __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(a, r), __fmul_rn(b, r)), __NV_SATFINITE, __NV_E4M3);
}

// Four values v[0..3] -> four e4m3 bytes in one word (v[0] lowest).
__device__ __forceinline__ uint32_t E4m3x4(const float* v, float r) {
  return static_cast<uint32_t>(E4m3x2(v[0], v[1], r)) | (static_cast<uint32_t>(E4m3x2(v[2], v[3], r)) << 16);
}

}  // namespace maskd::kernels
