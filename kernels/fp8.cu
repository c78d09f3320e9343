// fp8 (e4m3) row-wise activation quantisation in one pass (kernels.h: QuantizeRowsFp8), optionally
// applying the erf GELU first (fc2's input: the GELU pass after fc1 disappears). Rows of up to
// 8192 values (4096 in fp32) are held in registers by a 128-thread block between the |max| and the
// scale/round, so each value is read and (with GELU) its erf evaluated once: run 13 measured the
// GELU variant compute-bound at ~1 TB/s with the warp-per-row kernel, which reads the row again and
// evaluates GELU twice. Longer rows keep that warp-per-row kernel.
//
// The operations are those of the LibTorch reference in fp8.cc, each IEEE-rounded (__fmul_rn,
// __frcp_rn: no contraction, no fast reciprocal), so without GELU the result is bit-identical to it:
// s = max(amax * fl(1/448), smallest normal), q = e4m3_rne(clamp(x * fl(1/s), +-448)). The product
// by the row's reciprocal replaced a division per value (run 70's SASS: the IEEE division was ~10 of
// the GELU kernel's ~52 instructions a value, with a call to its slow path), and the clamp is the
// conversion's own saturation (satfinite: finite values past 448 become +-448, NaN stays NaN, as
// at::clamp then the cast do), converting two values per instruction.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/fp8_convert.cuh"
#include "kernels/launchers.h"
#include "kernels/vec_load.cuh"

namespace maskd::kernels::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / 32;

template <bool kGelu>
__device__ __forceinline__ float Prepare(float v) {
  if constexpr (kGelu) {
    // at::gelu's exact form: x * 0.5 * (1 + erf(x * sqrt(1/2))).
    return __fmul_rn(__fmul_rn(v, 0.5f), __fadd_rn(1.0f, erff(__fmul_rn(v, 0.70710678118654752440f))));
  } else {
    return v;
  }
}

// kVec (4 or 8) values -> e4m3, stored as one 4- or 8-byte word.
template <int kVec>
__device__ __forceinline__ void StoreE4m3(const float (&v)[kVec], float r, __nv_fp8_storage_t* dst) {
  static_assert(kVec == 4 || kVec == 8, "4 or 8 values");
  if constexpr (kVec == 8) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(E4m3x4(v, r), E4m3x4(v + 4, r));
  } else {
    *reinterpret_cast<uint32_t*>(dst) = E4m3x4(v, r);
  }
}

__device__ __forceinline__ __nv_fp8_storage_t ToE4m3(float v, float r) {
  return __nv_cvt_float_to_fp8(__fmul_rn(v, r), __NV_SATFINITE, __NV_E4M3);
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
  const float s = E4m3RowScale(amax);
  const float r = __frcp_rn(s);
  if (lane == 0) scales[row] = s;

  for (int64_t c = static_cast<int64_t>(lane) * kVec; c < cols; c += 32 * kVec) {
    float v[kVec];
    LoadWidened<T, kVec>(xr + c, v);
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = Prepare<kGelu>(v[i]);
    if constexpr (kVec == 1) {
      qr[c] = ToE4m3(v[0], r);
    } else {
      StoreE4m3<kVec>(v, r, qr + c);
    }
  }
}

// A row per 128-thread block, held in registers between the absmax and the quantisation (kIters
// vectors of kVec values per thread): the row is read from memory once and GELU's erf evaluated once
// per value, where QuantizeRowsFp8Kernel (a warp per row) reads it twice and evaluates GELU twice.
// The same float operations in the same order per value: bit-identical output.
constexpr int kRowThreads = 128;

template <typename T, int kVec, bool kGelu, int kIters>
__global__ void __launch_bounds__(kRowThreads)
    QuantizeRowFp8BlockKernel(const T* __restrict__ x, int64_t cols, int64_t row_stride,
                              __nv_fp8_storage_t* __restrict__ q, float* __restrict__ scales) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * row_stride;
  __nv_fp8_storage_t* qr = q + row * cols;
  float v[kIters][kVec];
  float amax = 0.0f;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int64_t c = (static_cast<int64_t>(it) * kRowThreads + threadIdx.x) * kVec;
    if (c < cols) {
      LoadWidened<T, kVec>(xr + c, v[it]);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        v[it][i] = Prepare<kGelu>(v[it][i]);
        amax = fmaxf(amax, fabsf(v[it][i]));
      }
    }
  }
#pragma unroll
  for (int d = 16; d > 0; d /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, d));
  __shared__ float warp_max[kRowThreads / 32];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kRowThreads / 32; ++w) amax = fmaxf(amax, warp_max[w]);
  const float s = E4m3RowScale(amax);
  const float r = __frcp_rn(s);
  if (threadIdx.x == 0) scales[row] = s;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int64_t c = (static_cast<int64_t>(it) * kRowThreads + threadIdx.x) * kVec;
    if (c < cols) StoreE4m3<kVec>(v[it], r, qr + c);
  }
}

// Launches the register-resident kernel when a row fits in 8 vectors per thread; false otherwise.
template <typename T, int kVec, bool kGelu>
bool LaunchBlockPerRow(const T* x, int64_t rows, int64_t cols, int64_t row_stride, __nv_fp8_storage_t* q,
                       float* scales, cudaStream_t stream) {
  const int64_t iters = (cols / kVec + kRowThreads - 1) / kRowThreads;
  const unsigned blocks = static_cast<unsigned>(rows);
  if (rows > 0x7fffffff) return false;
  switch (iters <= 1 ? 1 : iters <= 2 ? 2 : iters <= 4 ? 4 : iters <= 8 ? 8 : 0) {
    case 1: QuantizeRowFp8BlockKernel<T, kVec, kGelu, 1><<<blocks, kRowThreads, 0, stream>>>(x, cols, row_stride, q, scales); return true;
    case 2: QuantizeRowFp8BlockKernel<T, kVec, kGelu, 2><<<blocks, kRowThreads, 0, stream>>>(x, cols, row_stride, q, scales); return true;
    case 4: QuantizeRowFp8BlockKernel<T, kVec, kGelu, 4><<<blocks, kRowThreads, 0, stream>>>(x, cols, row_stride, q, scales); return true;
    case 8: QuantizeRowFp8BlockKernel<T, kVec, kGelu, 8><<<blocks, kRowThreads, 0, stream>>>(x, cols, row_stride, q, scales); return true;
    default: return false;
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
  if (vec_ok && LaunchBlockPerRow<T, kVec, kGelu>(x, rows, cols, row_stride, qp, scales, stream)) return;
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
