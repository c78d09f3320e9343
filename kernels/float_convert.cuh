// Device-side float <-> 16-bit conversions (round-to-nearest-even into bf16/fp16), shared by the
// kernels that read or write float32 / bf16 / fp16.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace maskd::kernels {

template <typename OutT>
__device__ __forceinline__ OutT FromFloat(float v) {
  return static_cast<OutT>(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) {
  return __float2half_rn(v);
}

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }

}  // namespace maskd::kernels
