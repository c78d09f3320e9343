// int8 dynamic quantisation: per-token activation quantisation (one warp per row: absmax, scale,
// round) and the dequantise + bias epilogue after the int8 GEMM.
//
// Both use IEEE-rounded single operations (__fdiv_rn, __fmul_rn, __fadd_rn: no contraction into
// FMA) in the order of the LibTorch references, so the results are bit-identical to them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/float_convert.cuh"
#include "kernels/launchers.h"
#include "kernels/vec_load.cuh"

namespace maskd::kernels::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / 32;

__device__ __forceinline__ int8_t Quantize(float x, float s) {
  int q = __float2int_rn(__fdiv_rn(x, s));  // round half to even, as torch.round
  q = q > 127 ? 127 : (q < -127 ? -127 : q);
  return static_cast<int8_t>(q);
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    QuantizePerTokenKernel(const T* __restrict__ x, int64_t rows, int64_t cols, int64_t row_stride,
                           int8_t* __restrict__ q, float* __restrict__ scales) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // warp-uniform
  const T* xr = x + row * row_stride;
  int8_t* qr = q + row * cols;

  float amax = 0.0f;
  for (int64_t c = static_cast<int64_t>(lane) * kVec; c < cols; c += 32 * kVec) {
    float v[kVec];
    LoadWidened<T, kVec>(xr + c, v);
#pragma unroll
    for (int i = 0; i < kVec; ++i) amax = fmaxf(amax, fabsf(v[i]));
  }
#pragma unroll
  for (int d = 16; d > 0; d /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, d));
  const float s = amax == 0.0f ? 1.0f : __fdiv_rn(amax, 127.0f);
  if (lane == 0) scales[row] = s;

  // Second read of the row: it was just loaded by this warp and is in L1.
  for (int64_t c = static_cast<int64_t>(lane) * kVec; c < cols; c += 32 * kVec) {
    float v[kVec];
    LoadWidened<T, kVec>(xr + c, v);
    if constexpr (kVec == 1) {
      qr[c] = Quantize(v[0], s);
    } else {
      alignas(8) int8_t packed[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) packed[i] = Quantize(v[i], s);
      if constexpr (kVec == 8) {
        *reinterpret_cast<uint2*>(qr + c) = *reinterpret_cast<const uint2*>(packed);
      } else {
        *reinterpret_cast<uint32_t*>(qr + c) = *reinterpret_cast<const uint32_t*>(packed);
      }
    }
  }
}


// 4 consecutive columns per thread (cols % 8 == 0 for the int8 GEMM, so 16-byte aligned rows).
template <typename OutT>
__global__ void __launch_bounds__(kThreads)
    DequantizeBiasKernel(const int32_t* __restrict__ acc, int64_t rows, int64_t cols,
                         const float* __restrict__ xs, const float* __restrict__ ws,
                         const float* __restrict__ bias, OutT* __restrict__ out) {
  const int64_t quads = rows * cols / 4;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < quads;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t e = i * 4;
    const int64_t row = e / cols;
    const int64_t col = e - row * cols;
    const int4 a = *reinterpret_cast<const int4*>(acc + e);
    const float4 w = *reinterpret_cast<const float4*>(ws + col);
    float4 b = make_float4(0.f, 0.f, 0.f, 0.f);
    if (bias != nullptr) b = *reinterpret_cast<const float4*>(bias + col);
    const float s = xs[row];
    // (acc * x_scale) * w_scale + bias, each rounded: the reference's order of operations.
    const float y0 = __fadd_rn(__fmul_rn(__fmul_rn(static_cast<float>(a.x), s), w.x), b.x);
    const float y1 = __fadd_rn(__fmul_rn(__fmul_rn(static_cast<float>(a.y), s), w.y), b.y);
    const float y2 = __fadd_rn(__fmul_rn(__fmul_rn(static_cast<float>(a.z), s), w.z), b.z);
    const float y3 = __fadd_rn(__fmul_rn(__fmul_rn(static_cast<float>(a.w), s), w.w), b.w);
    OutT* o = out + e;
    o[0] = FromFloat<OutT>(y0);
    o[1] = FromFloat<OutT>(y1);
    o[2] = FromFloat<OutT>(y2);
    o[3] = FromFloat<OutT>(y3);
  }
}

template <typename T>
cudaError_t LaunchQuantize(const T* x, int64_t rows, int64_t cols, int64_t row_stride, int8_t* q,
                           float* scales, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vec_ok = cols % kVec == 0 && row_stride % kVec == 0 &&
                      reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(q) % kVec == 0;
  const unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  if (vec_ok) {
    QuantizePerTokenKernel<T, kVec><<<blocks, kThreads, 0, stream>>>(x, rows, cols, row_stride, q,
                                                                     scales);
  } else {
    QuantizePerTokenKernel<T, 1><<<blocks, kThreads, 0, stream>>>(x, rows, cols, row_stride, q,
                                                                  scales);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchQuantizePerToken(const void* x, DType dtype, int64_t rows, int64_t cols,
                                   int64_t row_stride, int8_t* q, float* scales,
                                   cudaStream_t stream) {
  switch (dtype) {
    case DType::kFloat32:
      return LaunchQuantize(static_cast<const float*>(x), rows, cols, row_stride, q, scales,
                            stream);
    case DType::kBFloat16:
      return LaunchQuantize(static_cast<const __nv_bfloat16*>(x), rows, cols, row_stride, q,
                            scales, stream);
    case DType::kFloat16:
      return LaunchQuantize(static_cast<const __half*>(x), rows, cols, row_stride, q, scales,
                            stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchDequantizeBias(const int32_t* acc, int64_t rows, int64_t cols,
                                 const float* x_scales, const float* w_scales, const float* bias,
                                 void* out, DType out_dtype, cudaStream_t stream) {
  const int64_t quads = rows * cols / 4;
  // Grid-stride: enough blocks to fill the chip several times over, not one per quad.
  const unsigned blocks =
      static_cast<unsigned>(std::min<int64_t>((quads + kThreads - 1) / kThreads, 132 * 32));
  switch (out_dtype) {
    case DType::kFloat32:
      DequantizeBiasKernel<float><<<blocks, kThreads, 0, stream>>>(
          acc, rows, cols, x_scales, w_scales, bias, static_cast<float*>(out));
      break;
    case DType::kBFloat16:
      DequantizeBiasKernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(
          acc, rows, cols, x_scales, w_scales, bias, static_cast<__nv_bfloat16*>(out));
      break;
    case DType::kFloat16:
      DequantizeBiasKernel<__half><<<blocks, kThreads, 0, stream>>>(
          acc, rows, cols, x_scales, w_scales, bias, static_cast<__half*>(out));
      break;
  }
  return cudaGetLastError();
}

}  // namespace maskd::kernels::detail
