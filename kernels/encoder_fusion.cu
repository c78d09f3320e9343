// Fused residual add + LayerNorm with the window partition/unpartition of SAM's ViT blocks folded
// into the indexing (see kernels.h, AddLayerNorm). One warp per output token; fp32 statistics.
//
// Vector path (16-bit types, C a multiple of 256): each lane holds C / 32 values in registers as
// V chunks of 8 (16-byte loads, coalesced across the warp: chunk v of lane l is elements
// [(v * 32 + l) * 8, +8)), so x and delta are read once and the statistics come from registers.
// Generic path (any C, any type): strided scalar loops, re-reading the row from L1/L2.
//
// fp8 output (vector path, args.out_scales set): the normalised row, rounded to T as the bf16 output
// would be, quantised to e4m3 with its row-wise scale in the same pass (QuantizeRowsFp8's
// arithmetic: s = max(amax * fl(1/448), smallest normal), q = e4m3_rne(satfinite(v * fl(1/s))),
// bit-identical to AddLayerNorm then QuantizeRowsFp8): the qkv / fc1 input of an fp8 encoder is
// written once, 1 byte a value, instead of 2 bytes written, 2 read and 1 written again.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/float_convert.cuh"
#include "kernels/fp8_convert.cuh"
#include "kernels/launchers.h"
#include "kernels/mma_sync.cuh"
#include "kernels/vec_load.cuh"

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

template <typename T, int V, bool kFp8>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    AddLayerNormVecKernel(const AddLayerNormArgs a) {
  constexpr int kC = V * 256;
  const int lane = threadIdx.x % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (t >= a.out_tokens) return;
  const TokenIndex ti = Locate(a, t);
  if (!ti.valid) {
    if constexpr (kFp8) {
      // a zero row: e4m3 zeros, the smallest normal scale (the reference's all-zero row)
      uint2* const q = reinterpret_cast<uint2*>(static_cast<uint8_t*>(a.out) + t * kC);
#pragma unroll
      for (int v = 0; v < V; ++v) q[v * 32 + lane] = make_uint2(0, 0);
      if (lane == 0) a.out_scales[t] = kE4m3MinScale;
    } else {
      T* const out = static_cast<T*>(a.out) + t * kC;
#pragma unroll
      for (int v = 0; v < V; ++v) reinterpret_cast<uint4*>(out)[v * 32 + lane] = make_uint4(0, 0, 0, 0);
    }
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
  float amax = 0.f;  // kFp8: |max| of the rounded outputs
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
    if constexpr (kFp8) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        vals[v][i] = ToFloat(o[i]);
        amax = fmaxf(amax, fabsf(vals[v][i]));
      }
    } else {
      reinterpret_cast<uint4*>(static_cast<T*>(a.out) + t * kC)[v * 32 + lane] = oraw;
    }
  }
  if constexpr (kFp8) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float sc = E4m3RowScale(amax);
    const float r = __frcp_rn(sc);
    if (lane == 0) a.out_scales[t] = sc;
    uint2* const q = reinterpret_cast<uint2*>(static_cast<uint8_t*>(a.out) + t * kC);
#pragma unroll
    for (int v = 0; v < V; ++v) q[v * 32 + lane] = make_uint2(E4m3x4(vals[v], r), E4m3x4(vals[v] + 4, r));
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

template <typename T, int V>
cudaError_t LaunchVec(const AddLayerNormArgs& a, dim3 grid, dim3 block, cudaStream_t stream) {
  if (a.out_scales != nullptr) {
    AddLayerNormVecKernel<T, V, true><<<grid, block, 0, stream>>>(a);
  } else {
    AddLayerNormVecKernel<T, V, false><<<grid, block, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchForType(const AddLayerNormArgs& a, bool vector_ok, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((a.out_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock));
  const dim3 block(kWarpsPerBlock * 32);
  if (vector_ok) {
    switch (a.C / 256) {
      case 1: return LaunchVec<T, 1>(a, grid, block, stream);
      case 2: return LaunchVec<T, 2>(a, grid, block, stream);
      case 3: return LaunchVec<T, 3>(a, grid, block, stream);
      case 4: return LaunchVec<T, 4>(a, grid, block, stream);
      case 5: return LaunchVec<T, 5>(a, grid, block, stream);
      case 6: return LaunchVec<T, 6>(a, grid, block, stream);
      default: break;
    }
  }
  if (a.out_scales != nullptr) return cudaErrorInvalidValue;  // fp8 output: the vector kernel only
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

namespace {

// q' = [q * scale, q . R_h[row], q . R_w[col], 0...] and k' = [k, e_row, e_col, 0...] for one grid
// row of one (image, head): a CTA of 256 threads over the row's `grid` tokens.
//   1. q's rows, the row's R_h rows (rev_h[grid - 1 - y + kh]) and all of rev_w into shared memory
//      as fp32;
//   2. thread t computes the terms of tokens x = t / 16 + 16 i and table columns kk = t % 16 + 16 j
//      (i, j < 4): 16 of rel_h and 16 of rel_w, fp32 sums over D, rounded once to T (as
//      RelPosTables' matmul rounds its fp32 accumulators), staged in shared memory;
//   3. the row's q' and k' rows (contiguous in the outputs) written as 16-byte chunks.
constexpr int kFoldThreads = 256;
constexpr int kFoldMaxGrid = 64;

template <int D>
__host__ __device__ constexpr int FoldPitch() { return D + 1; }  // fp32 rows: conflict-free columns

// fp32 rows (q, R_h, rev_w), rounded up to 16 bytes, then the staged terms ([g][2g] of T).
template <int D>
__host__ __device__ constexpr int FoldFloats(int grid) { return ((4 * grid - 1) * FoldPitch<D>() + 3) / 4 * 4; }

template <int D>
int FoldSmemBytes(int grid) {
  return FoldFloats<D>(grid) * 4 + grid * 2 * grid * 2;
}

// The first token of grid row y of image b, head h in a [B, H, N, D] view with element strides.
template <typename T>
__device__ __forceinline__ const T* GridRowStart(const void* base, const int64_t (&stride)[3], int b, int h, int y,
                                                 int g) {
  return static_cast<const T*>(base) + b * stride[0] + h * stride[1] + static_cast<int64_t>(y) * g * stride[2];
}

// The grid row's q' and k' rows (g x width elements each, contiguous in the outputs) as 16-byte chunks:
// q' = [q * scale, the staged terms rel[x][0, 2g), 0...], k' = [k, e_row, e_col, 0...]. `qrows` is
// row x = 0 of the row's q (global memory or a shared-memory copy) with `q_pitch` elements between
// rows; k is read from global memory. Shared by both fold kernels.
template <typename T, int D>
__device__ __forceinline__ void WriteFoldedRow(const FoldRelPosArgs& a, int y, int h, int b, const T* qrows,
                                               int64_t q_pitch, const T* k, const T* rel) {
  constexpr int C8 = D / 8;
  const int g = a.grid, tid = threadIdx.x;
  const int W8 = a.width / 8, rel8 = 2 * g / 8;
  const int64_t out0 = ((static_cast<int64_t>(b) * a.heads + h) * g * g + static_cast<int64_t>(y) * g) * a.width;
  uint4* qf = reinterpret_cast<uint4*>(static_cast<T*>(a.qf) + out0);
  uint4* kf = reinterpret_cast<uint4*>(static_cast<T*>(a.kf) + out0);
  for (int i = tid; i < g * W8; i += kFoldThreads) {
    const int x = i / W8, c8 = i % W8;
    uint4 qo = make_uint4(0, 0, 0, 0), ko = make_uint4(0, 0, 0, 0);
    if (c8 < C8) {
      float v[8];
      LoadWidened<T, 8>(qrows + x * q_pitch + 8 * c8, v);
      __align__(16) T o[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = FromFloat<T>(v[e] * a.scale);
      qo = *reinterpret_cast<const uint4*>(o);
      ko = *reinterpret_cast<const uint4*>(k + x * a.k_stride[2] + 8 * c8);
    } else if (c8 < C8 + rel8) {
      qo = *reinterpret_cast<const uint4*>(rel + x * 2 * g + 8 * (c8 - C8));
      // k': 1 at column D + y (the key's row) and at D + g + x (its column).
      const int col0 = 8 * (c8 - C8);
      __align__(16) T o[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int col = col0 + e;
        o[e] = FromFloat<T>((col == y || col == g + x) ? 1.f : 0.f);
      }
      ko = *reinterpret_cast<const uint4*>(o);
    }
    qf[static_cast<int64_t>(x) * W8 + c8] = qo;
    kf[static_cast<int64_t>(x) * W8 + c8] = ko;
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kFoldThreads) FoldRelPosKernel(const FoldRelPosArgs a) {
  extern __shared__ __align__(16) unsigned char fold_smem[];
  const int g = a.grid, y = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  constexpr int P = FoldPitch<D>();
  float* qs = reinterpret_cast<float*>(fold_smem);  // [g][P]
  float* rh = qs + g * P;                            // [g][P]: rev_h[g - 1 - y + kh]
  float* rw = rh + g * P;                            // [2g - 1][P]: rev_w
  T* rel = reinterpret_cast<T*>(qs + FoldFloats<D>(g));  // [g][2g]: rel_h | rel_w per token
  const T* q = GridRowStart<T>(a.q, a.q_stride, b, h, y, g);
  const T* k = GridRowStart<T>(a.k, a.k_stride, b, h, y, g);
  const T* rev = static_cast<const T*>(a.rev);
  constexpr int C8 = D / 8;  // 16-byte chunks of a D row
  for (int i = tid; i < g * C8; i += kFoldThreads) {
    const int r = i / C8, c = (i % C8) * 8;
    float v[8];
    LoadWidened<T, 8>(q + r * a.q_stride[2] + c, v);
#pragma unroll
    for (int e = 0; e < 8; ++e) qs[r * P + c + e] = v[e];
  }
  for (int i = tid; i < (g + 2 * g - 1) * C8; i += kFoldThreads) {
    const int r = i / C8, c = (i % C8) * 8;
    // rh rows 0..g-1 are rev_h rows g-1-y.., rw rows are rev_w = rev rows 2g-1..
    const int src = r < g ? g - 1 - y + r : (2 * g - 1) + (r - g);
    float v[8];
    LoadWidened<T, 8>(rev + static_cast<int64_t>(src) * D + c, v);
#pragma unroll
    for (int e = 0; e < 8; ++e) rh[r * P + c + e] = v[e];  // rw follows rh contiguously
  }
  __syncthreads();
  {
    const int x0 = tid / 16, k0 = tid % 16;
    // Tokens and columns past a grid smaller than 64 read row g - 1 (in bounds) and are not written.
    int xr[4], kr[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      xr[i] = min(x0 + 16 * i, g - 1);
      kr[i] = min(k0 + 16 * i, g - 1);
    }
    float acc_h[4][4] = {}, acc_w[4][4] = {};
    for (int c = 0; c < D; ++c) {
      float qv[4], hv[4], wv[7];
#pragma unroll
      for (int i = 0; i < 4; ++i) qv[i] = qs[xr[i] * P + c];
#pragma unroll
      for (int j = 0; j < 4; ++j) hv[j] = rh[kr[j] * P + c];
      // rel_w[x][kw] uses rev_w[g - 1 - x + kw]: with x = x0 + 16 i and kw = k0 + 16 j that is row
      // g - 1 - x0 + k0 + 16 (j - i), seven rows for the 16 pairs.
#pragma unroll
      for (int d = 0; d < 7; ++d) {
        const int r = g - 1 - x0 + k0 + 16 * (d - 3);
        wv[d] = (r >= 0 && r < 2 * g - 1) ? rw[r * P + c] : 0.f;
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          acc_h[i][j] = fmaf(qv[i], hv[j], acc_h[i][j]);
          acc_w[i][j] = fmaf(qv[i], wv[j - i + 3], acc_w[i][j]);
        }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int x = x0 + 16 * i, kk = k0 + 16 * j;
        if (x < g && kk < g) {
          rel[x * 2 * g + kk] = FromFloat<T>(acc_h[i][j]);
          rel[x * 2 * g + g + kk] = FromFloat<T>(acc_w[i][j]);
        }
      }
  }
  __syncthreads();
  WriteFoldedRow<T, D>(a, y, h, b, q, a.q_stride[2], k, rel);
}

// The same operands with the terms on the tensor cores (FoldRelPosArgs::tensor_cores). Run 57 put the
// kernel above at ~0.053 ms a block (vit_b bs1), bound by shared-memory loads (15 fp32 registers
// delivered per channel for 32 FMAs). Here a CTA still owns one grid row y of one (image, head):
//   1. cp.async brings the row's q (64 rows, zero past g), its R_h rows rev_h[g - 1 - y + kh] and all
//      of rev_w (128 rows, zero past 2g - 1) into shared memory as T, rows of D + 8 (ldmatrix reads 8
//      rows at a 16-byte offset each: conflict-free for D 64 and 80);
//   2. C = q [64 x D] . [R_h rows; rev_w]^T [D x 192] with mma.m16n8k16 (fp32 accumulators; T x T
//      products are exact in fp32, so only the summation order differs from RelPosTables' matmul):
//      warp w takes m-tile w % 4 and half w / 4 of the 24 n-tiles; C rounded once to T, the R_h
//      part straight into rel's rel_h columns, the rev_w part into a staging tile;
//   3. rel_w[x][kw] = staged[x][g - 1 - x + kw] gathered into rel's rel_w columns;
//   4. the row's q' and k' written by WriteFoldedRow, q read back from shared memory.
// Run 58 (H100): 0.119 ms for vit_b's 4 global blocks at batch 1 (the FMA kernel 0.213), 0.053 ms a
// block for vit_h's at batch 1; the default since.
constexpr int kFoldMmaRows = 64, kFoldMmaRevW = 128, kFoldMmaCols = kFoldMmaRows + kFoldMmaRevW;

template <int D>
__host__ __device__ constexpr int FoldMmaPitch() { return D + 8; }
constexpr int kFoldStagePitch = kFoldMmaRevW + 8;

template <int D>
int FoldMmaSmemBytes(int grid) {
  return (2 * kFoldMmaRows + kFoldMmaRevW) * FoldMmaPitch<D>() * 2 + kFoldMmaRows * kFoldStagePitch * 2 +
         grid * 2 * grid * 2;
}

template <typename T, int D>
__global__ void __launch_bounds__(kFoldThreads) FoldRelPosMmaKernel(const FoldRelPosArgs a) {
  extern __shared__ __align__(16) unsigned char fold_smem[];
  const int g = a.grid, y = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  constexpr int P = FoldMmaPitch<D>();
  T* qs = reinterpret_cast<T*>(fold_smem);     // [64][P]
  T* tb = qs + kFoldMmaRows * P;               // [192][P]: R_h rows (64), then rev_w (128)
  T* stage = tb + kFoldMmaCols * P;            // [64][kFoldStagePitch]: q . rev_w^T
  T* rel = stage + kFoldMmaRows * kFoldStagePitch;  // [g][2g]: rel_h | rel_w per token
  const T* q = GridRowStart<T>(a.q, a.q_stride, b, h, y, g);
  const T* k = GridRowStart<T>(a.k, a.k_stride, b, h, y, g);
  const T* rev = static_cast<const T*>(a.rev);
  constexpr int C8 = D / 8;  // 16-byte chunks of a D row
  for (int i = tid; i < (kFoldMmaRows + kFoldMmaCols) * C8; i += kFoldThreads) {
    const int r = i / C8, c = (i % C8) * 8;
    const T* src = rev;
    bool valid = false;
    if (r < kFoldMmaRows) {  // q rows
      valid = r < g;
      src = q + static_cast<int64_t>(valid ? r : 0) * a.q_stride[2] + c;
    } else if (r < 2 * kFoldMmaRows) {  // R_h rows: rev_h[g - 1 - y + kh]
      const int kh = r - kFoldMmaRows;
      valid = kh < g;
      src = rev + static_cast<int64_t>(valid ? g - 1 - y + kh : 0) * D + c;
    } else {  // rev_w rows: rev[2g - 1 + j]
      const int j = r - 2 * kFoldMmaRows;
      valid = j < 2 * g - 1;
      src = rev + static_cast<int64_t>(valid ? 2 * g - 1 + j : 0) * D + c;
    }
    CpAsync16(SmemAddr(qs + r * P + c), src, valid);
  }
  CpAsyncCommit();
  CpAsyncWait<0>();
  __syncthreads();
  {
    const int warp = tid / 32, lane = tid % 32;
    const int m0 = (warp % 4) * 16, nt0 = (warp / 4) * 12;  // n-tiles nt0 .. nt0 + 11 of 24
    constexpr int KS = D / 16;
    const LdmOffset a_lane = LdmRowsFirst(lane), b_lane = LdmColsFirst(lane);
    uint32_t af[KS][4];
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
      LdMatrixX4(af[ks], SmemAddr(qs + (m0 + a_lane.row) * P + ks * 16 + a_lane.col));
    const int gr = lane / 4, tc = 2 * (lane % 4);
#pragma unroll
    for (int p = 0; p < 6; ++p) {  // pairs of n-tiles
      const int n0 = (nt0 + 2 * p) * 8;
      float acc[2][4] = {};
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        // Matrices: (n-tile 2p, k 0-7), (2p, k 8-15), (2p + 1, k 0-7), (2p + 1, k 8-15).
        uint32_t bf[4];
        LdMatrixX4(bf, SmemAddr(tb + (n0 + b_lane.row) * P + ks * 16 + b_lane.col));
        Mma<T>::Run(acc[0], af[ks], bf[0], bf[1]);
        Mma<T>::Run(acc[1], af[ks], bf[2], bf[3]);
      }
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = n0 + 8 * e + tc;  // of the 192: < 64 R_h, else rev_w row col - 64
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int x = m0 + gr + 8 * half;
          const uint32_t v = Mma<T>::Pack(acc[e][2 * half], acc[e][2 * half + 1]);
          if (col < kFoldMmaRows) {
            if (x < g && col < g) *reinterpret_cast<uint32_t*>(rel + x * 2 * g + col) = v;
          } else {
            *reinterpret_cast<uint32_t*>(stage + x * kFoldStagePitch + (col - kFoldMmaRows)) = v;
          }
        }
      }
    }
  }
  __syncthreads();
  // rel_w[x][kw] = q_x . rev_w[g - 1 - x + kw].
  for (int i = tid; i < g * g; i += kFoldThreads) {
    const int x = i / g, kw = i % g;
    rel[x * 2 * g + g + kw] = stage[x * kFoldStagePitch + g - 1 - x + kw];
  }
  __syncthreads();
  WriteFoldedRow<T, D>(a, y, h, b, qs, P, k, rel);
}

template <typename T, int D>
cudaError_t LaunchFold(const FoldRelPosArgs& a, cudaStream_t stream) {
  const dim3 grid(a.grid, a.heads, a.batch);
  if (a.tensor_cores) {
    const int smem = FoldMmaSmemBytes<D>(a.grid);
    if (smem > 48 * 1024) {
      const cudaError_t e =
          cudaFuncSetAttribute(FoldRelPosMmaKernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      if (e != cudaSuccess) return e;
    }
    FoldRelPosMmaKernel<T, D><<<grid, kFoldThreads, smem, stream>>>(a);
    return cudaGetLastError();
  }
  const int smem = FoldSmemBytes<D>(a.grid);
  // Set at each launch (the attribute is per device; legal in a capture), as ImageToTokenUpdate does.
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(FoldRelPosKernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
  }
  FoldRelPosKernel<T, D><<<grid, kFoldThreads, smem, stream>>>(a);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchFoldForType(const FoldRelPosArgs& a, cudaStream_t stream) {
  return a.head_dim == 64 ? LaunchFold<T, 64>(a, stream) : LaunchFold<T, 80>(a, stream);
}

}  // namespace

bool FoldRelPosSupported(int head_dim, int grid, int width) {
  return (head_dim == 64 || head_dim == 80) && grid > 0 && grid <= kFoldMaxGrid && grid % 8 == 0 &&
         width % 8 == 0 && width >= head_dim + 2 * grid;
}

cudaError_t LaunchFoldRelPos(const FoldRelPosArgs& a, DType dtype, cudaStream_t stream) {
  if (!FoldRelPosSupported(a.head_dim, a.grid, a.width) || a.batch <= 0 || a.heads <= 0) return cudaErrorInvalidValue;
  switch (dtype) {
    case DType::kBFloat16:
      return LaunchFoldForType<__nv_bfloat16>(a, stream);
    case DType::kFloat16:
      return LaunchFoldForType<__half>(a, stream);
    default:
      return cudaErrorInvalidValue;
  }
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
