// Device-side float -> output dtype conversion with round-to-nearest-even, shared by the kernels that
// write float32 / bf16 / fp16 outputs.
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

}  // namespace maskd::kernels
