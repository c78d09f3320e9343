// fp8 (e4m3) row-wise activation quantisation in one pass (kernels.h: QuantizeRowsFp8): one warp per
// row reads the row once for its |max| and again (from L1) to scale, clamp and round, optionally
// applying the erf GELU first (fc2's input: the GELU pass after fc1 disappears).
//
// The operations are those of the LibTorch reference in fp8.cc, each IEEE-rounded (__fmul_rn,
// __fdiv_rn: no contraction, no fast reciprocal), so without GELU the result is bit-identical to it:
// s = max(amax * fl(1/448), smallest normal), q = e4m3_rne(clamp(x / s, +-448)).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/launchers.h"
#include "kernels/vec_load.cuh"

namespace maskd::kernels::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / 32;
constexpr float kE4m3Max = 448.0f;
constexpr float kMinScale = 1.17549435082228750797e-38f;  // FLT_MIN, as in fp8.cc

template <bool kGelu>
__device__ __forceinline__ float Prepare(float v) {
  if constexpr (kGelu) {
    // at::gelu's exact form: x * 0.5 * (1 + erf(x * sqrt(1/2))).
    return __fmul_rn(__fmul_rn(v, 0.5f), __fadd_rn(1.0f, erff(__fmul_rn(v, 0.70710678118654752440f))));
  } else {
    return v;
  }
}

__device__ __forceinline__ __nv_fp8_storage_t ToE4m3(float v, float s) {
  float q = __fdiv_rn(v, s);
  // clamp as at::clamp does: NaN stays NaN (fminf/fmaxf would turn it into a bound).
  if (!(q != q)) q = fminf(fmaxf(q, -kE4m3Max), kE4m3Max);
  return __nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3);  // round to nearest even
}

template <typename T, int kVec, bool kGelu>
__global__ void __launch_bounds__(kThreads)
    QuantizeRowsFp8Kernel(const T* __restrict__ x, int64_t rows, int64_t cols, int64_t row_stride,
                          __nv_fp8_storage_t* __restrict__ q, float* __restrict__ scales) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // warp-uniform
  const T* xr = x + row * row_stride;
  __nv_fp8_storage_t* qr = q + row * cols;

  float amax = 0.0f;
  for (int64_t c = static_cast<int64_t>(lane) * kVec; c < cols; c += 32 * kVec) {
    float v[kVec];
    LoadWidened<T, kVec>(xr + c, v);
#pragma unroll
    for (int i = 0; i < kVec; ++i) amax = fmaxf(amax, fabsf(Prepare<kGelu>(v[i])));
  }
#pragma unroll
  for (int d = 16; d > 0; d /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, d));
  const float s = fmaxf(__fmul_rn(amax, 1.0f / kE4m3Max), kMinScale);
  if (lane == 0) scales[row] = s;

  for (int64_t c = static_cast<int64_t>(lane) * kVec; c < cols; c += 32 * kVec) {
    float v[kVec];
    LoadWidened<T, kVec>(xr + c, v);
    if constexpr (kVec == 1) {
      qr[c] = ToE4m3(Prepare<kGelu>(v[0]), s);
    } else {
      alignas(8) __nv_fp8_storage_t packed[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) packed[i] = ToE4m3(Prepare<kGelu>(v[i]), s);
      if constexpr (kVec == 8) {
        *reinterpret_cast<uint2*>(qr + c) = *reinterpret_cast<const uint2*>(packed);
      } else {
        *reinterpret_cast<uint32_t*>(qr + c) = *reinterpret_cast<const uint32_t*>(packed);
      }
    }
  }
}

template <typename T, bool kGelu>
void Launch(const T* x, int64_t rows, int64_t cols, int64_t row_stride, void* q, float* scales,
            cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vec_ok = cols % kVec == 0 && row_stride % kVec == 0 &&
                      reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(q) % kVec == 0;
  const unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  auto* qp = static_cast<__nv_fp8_storage_t*>(q);
  if (vec_ok) {
    QuantizeRowsFp8Kernel<T, kVec, kGelu><<<blocks, kThreads, 0, stream>>>(x, rows, cols, row_stride, qp, scales);
  } else {
    QuantizeRowsFp8Kernel<T, 1, kGelu><<<blocks, kThreads, 0, stream>>>(x, rows, cols, row_stride, qp, scales);
  }
}

template <typename T>
void LaunchTyped(const void* x, int64_t rows, int64_t cols, int64_t row_stride, bool gelu, void* q,
                 float* scales, cudaStream_t stream) {
  const T* xt = static_cast<const T*>(x);
  if (gelu) {
    Launch<T, true>(xt, rows, cols, row_stride, q, scales, stream);
  } else {
    Launch<T, false>(xt, rows, cols, row_stride, q, scales, stream);
  }
}

}  // namespace

cudaError_t LaunchQuantizeRowsFp8(const void* x, DType dtype, int64_t rows, int64_t cols,
                                  int64_t row_stride, bool gelu, void* q, float* scales,
                                  cudaStream_t stream) {
  switch (dtype) {
    case DType::kFloat32: LaunchTyped<float>(x, rows, cols, row_stride, gelu, q, scales, stream); break;
    case DType::kBFloat16: LaunchTyped<__nv_bfloat16>(x, rows, cols, row_stride, gelu, q, scales, stream); break;
    case DType::kFloat16: LaunchTyped<__half>(x, rows, cols, row_stride, gelu, q, scales, stream); break;
  }
  return cudaGetLastError();
}

}  // namespace maskd::kernels::detail
