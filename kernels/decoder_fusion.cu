// The mask decoder's element-wise passes over its [prompts x 4096 x 256] and [prompts x 16384 x 4 x 64]
// activations (kernels.h, RowNorm and AddRowsBroadcast): LibTorch's generic LayerNorm launches one
// block per row, which for 64-channel rows leaves most of the GPU idle, and its broadcast add of a
// [HW, n] table over a batch takes the non-vectorised TensorIterator path.
//
// RowNorm: a row of C = 8 L values is held by L lanes (16-byte loads, 8 values each), statistics in
// fp32 from registers via xor-shuffles within the L-lane group, then LayerNorm's affine and, when
// asked, GELU (erf form, on the fp32 value) before the one rounding to T.
// AddRowsBroadcast: y[i] += rows[i mod period] in 16-byte vectors (fp32 sum, one rounding, as ATen).
// CopySlices: many independent contiguous byte ranges copied in one launch (a table of
// {dst, src, bytes}); the per-prompt mask logits of a decode, which as separate copies cost more
// host launch time than GPU time.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/float_convert.cuh"
#include "kernels/launchers.h"

namespace maskd::kernels::detail {
namespace {

constexpr int kThreads = 256;

template <typename T, int L>
__global__ void __launch_bounds__(kThreads) RowNormKernel(const RowNormArgs a) {
  constexpr int kC = 8 * L;
  const int lane = threadIdx.x % L;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / L) + threadIdx.x / L;
  const bool active = row < a.rows;
  float v[8];
  if (active) {
    const uint4 raw = reinterpret_cast<const uint4*>(static_cast<const T*>(a.x) + row * kC)[lane];
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = ToFloat(e[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = 0.f;
  }
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) sum += v[i];
#pragma unroll
  for (int o = L / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float mean = sum / kC;
  float sq = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) sq += (v[i] - mean) * (v[i] - mean);
#pragma unroll
  for (int o = L / 2; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
  const float rstd = rsqrtf(sq / kC + a.eps);
  if (!active) return;
  const uint4 wraw = reinterpret_cast<const uint4*>(a.weight)[lane];
  const uint4 braw = reinterpret_cast<const uint4*>(a.bias)[lane];
  const T* we = reinterpret_cast<const T*>(&wraw);
  const T* be = reinterpret_cast<const T*>(&braw);
  uint4 oraw;
  T* o = reinterpret_cast<T*>(&oraw);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    float y = (v[i] - mean) * rstd * ToFloat(we[i]) + ToFloat(be[i]);
    if (a.gelu) y = 0.5f * y * (1.f + erff(y * 0.70710678118654752f));
    o[i] = FromFloat<T>(y);
  }
  reinterpret_cast<uint4*>(static_cast<T*>(a.out) + row * kC)[lane] = oraw;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) AddRowsBroadcastKernel(void* y, const void* rows, int64_t vectors,
                                                                    int64_t period_vectors) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < vectors;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    uint4 a = reinterpret_cast<const uint4*>(y)[i];
    const uint4 b = reinterpret_cast<const uint4*>(rows)[i % period_vectors];
    T* ae = reinterpret_cast<T*>(&a);
    const T* be = reinterpret_cast<const T*>(&b);
#pragma unroll
    for (int k = 0; k < 8; ++k) ae[k] = FromFloat<T>(ToFloat(ae[k]) + ToFloat(be[k]));
    reinterpret_cast<uint4*>(y)[i] = a;
  }
}

// Block y walks the table (items i = y, y + gridDim.y, ...); blocks x share one item's vectors.
__global__ void __launch_bounds__(kThreads) CopySlicesKernel(const int64_t* table, int64_t items) {
  for (int64_t i = blockIdx.y; i < items; i += gridDim.y) {
    uint4* dst = reinterpret_cast<uint4*>(table[3 * i]);
    const uint4* src = reinterpret_cast<const uint4*>(table[3 * i + 1]);
    const int64_t vectors = table[3 * i + 2] / 16;
    for (int64_t v = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; v < vectors;
         v += static_cast<int64_t>(gridDim.x) * kThreads)
      dst[v] = src[v];
  }
}

template <typename T>
cudaError_t LaunchRowNormT(const RowNormArgs& a, cudaStream_t stream) {
  const int lanes = a.C / 8;
  const unsigned grid = static_cast<unsigned>((a.rows * lanes + kThreads - 1) / kThreads);
  switch (lanes) {
    case 4: RowNormKernel<T, 4><<<grid, kThreads, 0, stream>>>(a); break;
    case 8: RowNormKernel<T, 8><<<grid, kThreads, 0, stream>>>(a); break;
    case 16: RowNormKernel<T, 16><<<grid, kThreads, 0, stream>>>(a); break;
    case 32: RowNormKernel<T, 32><<<grid, kThreads, 0, stream>>>(a); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

bool RowNormVectorized(int C, DType dtype) {
  return dtype != DType::kFloat32 && (C == 32 || C == 64 || C == 128 || C == 256);
}

cudaError_t LaunchRowNorm(const RowNormArgs& a, DType dtype, cudaStream_t stream) {
  if (a.rows <= 0) return cudaSuccess;
  if (!RowNormVectorized(a.C, dtype)) return cudaErrorInvalidValue;
  return dtype == DType::kBFloat16 ? LaunchRowNormT<__nv_bfloat16>(a, stream) : LaunchRowNormT<__half>(a, stream);
}

cudaError_t LaunchAddRowsBroadcast(void* y, const void* rows, int64_t elements, int64_t period, DType dtype,
                                   cudaStream_t stream) {
  if (elements <= 0) return cudaSuccess;
  if (dtype == DType::kFloat32 || elements % 8 != 0 || period % 8 != 0) return cudaErrorInvalidValue;
  const int64_t vectors = elements / 8;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((vectors + kThreads - 1) / kThreads, 132 * 16));
  if (dtype == DType::kBFloat16)
    AddRowsBroadcastKernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(y, rows, vectors, period / 8);
  else
    AddRowsBroadcastKernel<__half><<<grid, kThreads, 0, stream>>>(y, rows, vectors, period / 8);
  return cudaGetLastError();
}

cudaError_t LaunchCopySlices(const int64_t* table, int64_t items, int64_t max_bytes, cudaStream_t stream) {
  if (items <= 0 || max_bytes <= 0) return cudaSuccess;
  const int64_t vectors = max_bytes / 16;
  const unsigned gx = static_cast<unsigned>(std::min<int64_t>((vectors + kThreads - 1) / kThreads, 64));
  const unsigned gy = static_cast<unsigned>(std::min<int64_t>(items, 65535));
  CopySlicesKernel<<<dim3(gx, gy), kThreads, 0, stream>>>(table, items);
  return cudaGetLastError();
}

}  // namespace maskd::kernels::detail
