// Row loads for the quantisation kernels (fp8.cu): kVec consecutive float / bf16 / fp16
// values widened to float, as one 16-byte load (kVec * sizeof(T) == 16) or one scalar (kVec == 1,
// for rows that are not 16-byte aligned).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace maskd::kernels::detail {

template <typename T, int kVec>
__device__ __forceinline__ void LoadWidened(const T* p, float (&out)[kVec]) {
  if constexpr (kVec == 1) {
    out[0] = static_cast<float>(p[0]);
  } else {
    static_assert(kVec * sizeof(T) == 16, "16-byte vectors");
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < kVec; ++i) out[i] = static_cast<float>(e[i]);
  }
}

}  // namespace maskd::kernels::detail
