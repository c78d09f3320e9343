// Fused residual add + LayerNorm with the window partition/unpartition of SAM's ViT blocks folded
// into the indexing (see kernels.h, AddLayerNorm). One warp per output token; fp32 statistics.
//
// Vector path (16-bit types, C a multiple of 256): each lane holds C / 32 values in registers as
// V chunks of 8 (16-byte loads, coalesced across the warp: chunk v of lane l is elements
// [(v * 32 + l) * 8, +8)), so x and delta are read once and the statistics come from registers.
// Generic path (any C, any type): strided scalar loops, re-reading the row from L1/L2.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/float_convert.cuh"
#include "kernels/launchers.h"

namespace maskd::kernels::detail {
namespace {

constexpr int kWarpsPerBlock = 8;

struct TokenIndex {
  int64_t x;      // raster index of the token in x (valid tokens only)
  int64_t delta;  // index of the token in delta's layout
  bool valid;     // false: a padding token of a windowed output
};

__device__ __forceinline__ int64_t WindowedIndex(int b, int h, int w, int H, int W, int ws) {
  const int nh = (H + ws - 1) / ws, nw = (W + ws - 1) / ws;
  const int64_t window = (static_cast<int64_t>(b) * nh + h / ws) * nw + w / ws;
  return window * ws * ws + (h % ws) * ws + (w % ws);
}

// The token written at output index t.
__device__ __forceinline__ TokenIndex Locate(const AddLayerNormArgs& a, int64_t t) {
  int b, h, w;
  if (a.out_window > 0) {
    const int ws = a.out_window;
    const int nh = (a.H + ws - 1) / ws, nw = (a.W + ws - 1) / ws;
    const int64_t window = t / (ws * ws);
    const int in = static_cast<int>(t % (ws * ws));
    b = static_cast<int>(window / (nh * nw));
    const int r = static_cast<int>(window % (nh * nw));
    h = (r / nw) * ws + in / ws;
    w = (r % nw) * ws + in % ws;
  } else {
    b = static_cast<int>(t / (static_cast<int64_t>(a.H) * a.W));
    const int64_t r = t % (static_cast<int64_t>(a.H) * a.W);
    h = static_cast<int>(r / a.W);
    w = static_cast<int>(r % a.W);
  }
  TokenIndex ti;
  ti.valid = h < a.H && w < a.W;
  ti.x = (static_cast<int64_t>(b) * a.H + h) * a.W + w;
  ti.delta = a.delta_window > 0 ? WindowedIndex(b, h, w, a.H, a.W, a.delta_window) : ti.x;
  return ti;
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T, int V>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    AddLayerNormVecKernel(const AddLayerNormArgs a) {
  constexpr int kC = V * 256;
  const int lane = threadIdx.x % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (t >= a.out_tokens) return;
  const TokenIndex ti = Locate(a, t);
  T* const out = static_cast<T*>(a.out) + t * kC;
  if (!ti.valid) {
#pragma unroll
    for (int v = 0; v < V; ++v) reinterpret_cast<uint4*>(out)[v * 32 + lane] = make_uint4(0, 0, 0, 0);
    return;
  }
  T* const x = static_cast<T*>(a.x) + ti.x * kC;
  float vals[V][8];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const uint4 raw = reinterpret_cast<const uint4*>(x)[v * 32 + lane];
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) vals[v][i] = ToFloat(e[i]);
  }
  if (a.delta != nullptr) {
    const T* const d = static_cast<const T*>(a.delta) + ti.delta * kC;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const uint4 raw = reinterpret_cast<const uint4*>(d)[v * 32 + lane];
      const T* e = reinterpret_cast<const T*>(&raw);
      uint4 sum_raw;
      T* s = reinterpret_cast<T*>(&sum_raw);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        // The residual stream is stored in T: the statistics see the rounded sum, as in the
        // unfused `x = x + delta; norm(x)`.
        s[i] = FromFloat<T>(vals[v][i] + ToFloat(e[i]));
        vals[v][i] = ToFloat(s[i]);
      }
      reinterpret_cast<uint4*>(x)[v * 32 + lane] = sum_raw;
    }
  }
  float sum = 0.f;
#pragma unroll
  for (int v = 0; v < V; ++v)
#pragma unroll
    for (int i = 0; i < 8; ++i) sum += vals[v][i];
  const float mean = WarpSum(sum) / kC;
  float sq = 0.f;
#pragma unroll
  for (int v = 0; v < V; ++v)
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float dv = vals[v][i] - mean;
      sq += dv * dv;
    }
  const float rstd = rsqrtf(WarpSum(sq) / kC + a.eps);
  const T* const wt = static_cast<const T*>(a.weight);
  const T* const bs = static_cast<const T*>(a.bias);
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const uint4 wraw = reinterpret_cast<const uint4*>(wt)[v * 32 + lane];
    const uint4 braw = reinterpret_cast<const uint4*>(bs)[v * 32 + lane];
    const T* we = reinterpret_cast<const T*>(&wraw);
    const T* be = reinterpret_cast<const T*>(&braw);
    uint4 oraw;
    T* o = reinterpret_cast<T*>(&oraw);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      o[i] = FromFloat<T>((vals[v][i] - mean) * rstd * ToFloat(we[i]) + ToFloat(be[i]));
    reinterpret_cast<uint4*>(out)[v * 32 + lane] = oraw;
  }
}

template <typename T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    AddLayerNormGenericKernel(const AddLayerNormArgs a) {
  const int lane = threadIdx.x % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (t >= a.out_tokens) return;
  const int C = a.C;
  const TokenIndex ti = Locate(a, t);
  T* const out = static_cast<T*>(a.out) + t * C;
  if (!ti.valid) {
    for (int c = lane; c < C; c += 32) out[c] = FromFloat<T>(0.f);
    return;
  }
  T* const x = static_cast<T*>(a.x) + ti.x * C;
  const T* const d = a.delta != nullptr ? static_cast<const T*>(a.delta) + ti.delta * C : nullptr;
  // Each lane re-reads only the elements it wrote itself: no synchronisation needed.
  float sum = 0.f;
  for (int c = lane; c < C; c += 32) {
    float v = ToFloat(x[c]);
    if (d != nullptr) {
      const T s = FromFloat<T>(v + ToFloat(d[c]));
      x[c] = s;
      v = ToFloat(s);
    }
    sum += v;
  }
  const float mean = WarpSum(sum) / C;
  float sq = 0.f;
  for (int c = lane; c < C; c += 32) {
    const float dv = ToFloat(x[c]) - mean;
    sq += dv * dv;
  }
  const float rstd = rsqrtf(WarpSum(sq) / C + a.eps);
  const T* const wt = static_cast<const T*>(a.weight);
  const T* const bs = static_cast<const T*>(a.bias);
  for (int c = lane; c < C; c += 32)
    out[c] = FromFloat<T>((ToFloat(x[c]) - mean) * rstd * ToFloat(wt[c]) + ToFloat(bs[c]));
}

template <typename T>
cudaError_t LaunchForType(const AddLayerNormArgs& a, bool vector_ok, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((a.out_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock));
  const dim3 block(kWarpsPerBlock * 32);
  if (vector_ok) {
    switch (a.C / 256) {
      case 1: AddLayerNormVecKernel<T, 1><<<grid, block, 0, stream>>>(a); return cudaGetLastError();
      case 2: AddLayerNormVecKernel<T, 2><<<grid, block, 0, stream>>>(a); return cudaGetLastError();
      case 3: AddLayerNormVecKernel<T, 3><<<grid, block, 0, stream>>>(a); return cudaGetLastError();
      case 4: AddLayerNormVecKernel<T, 4><<<grid, block, 0, stream>>>(a); return cudaGetLastError();
      case 5: AddLayerNormVecKernel<T, 5><<<grid, block, 0, stream>>>(a); return cudaGetLastError();
      case 6: AddLayerNormVecKernel<T, 6><<<grid, block, 0, stream>>>(a); return cudaGetLastError();
      default: break;
    }
  }
  AddLayerNormGenericKernel<T><<<grid, block, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

bool AddLayerNormVectorized(int C, DType dtype) {
  return dtype != DType::kFloat32 && C % 256 == 0 && C / 256 >= 1 && C / 256 <= 6;
}

const char* AddLayerNormKernelName(int C, DType dtype) {
  return AddLayerNormVectorized(C, dtype) ? "AddLayerNormVecKernel" : "AddLayerNormGenericKernel";
}

cudaError_t LaunchAddLayerNorm(const AddLayerNormArgs& a, DType dtype, cudaStream_t stream) {
  if (a.out_tokens <= 0) return cudaSuccess;
  const bool vec = AddLayerNormVectorized(a.C, dtype);
  switch (dtype) {
    case DType::kBFloat16: return LaunchForType<__nv_bfloat16>(a, vec, stream);
    case DType::kFloat16: return LaunchForType<__half>(a, vec, stream);
    case DType::kFloat32: return LaunchForType<float>(a, false, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace maskd::kernels::detail
