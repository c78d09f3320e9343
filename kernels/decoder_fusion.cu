// The mask decoder's element-wise passes over its [prompts x 4096 x 256] and [prompts x 16384 x 4 x 64]
// activations (kernels.h, RowNorm and AddRowsBroadcast): LibTorch's generic LayerNorm launches one
// block per row, which for 64-channel rows leaves most of the GPU idle, and its broadcast add of a
// [HW, n] table over a batch takes the non-vectorised TensorIterator path.
//
// RowNorm: a row of C = 8 L values is held by L lanes (16-byte loads, 8 values each), statistics in
// fp32 from registers via xor-shuffles within the L-lane group, then LayerNorm's affine and, when
// asked, GELU (erf form, on the fp32 value) before the one rounding to T.
// AddRowsBroadcast: y[i] += rows[i mod period] in 16-byte vectors (fp32 sum, one rounding, as ATen).
// UpscaleHyper: the decoder's second transposed convolution (64 -> 4 x 32 channels, one GEMM row per
// pixel) with its bias and GELU, and the hypernetwork product of the 32 channels with each prompt's 4
// mask vectors, per 32-row tile: the GEMM on tensor cores (WMMA, fp32 accumulation) into shared
// memory, then one thread per (row, sub-pixel) applies bias + GELU (rounded to T where the unfused
// path stores T) and the 4 dot products, and the tile's 512 mask values are written in the final
// [B, 4, 4h, 4w] pixel order. The [B, 65536, 32] activation (268 MB at 64 prompts) never exists.
// ImageToTokenProbs: the image->token attention's scores and softmax for every (prompt, position,
// head) in one thread: its 16 query channels (two 16-byte loads, read in place from the projection's
// strided output, or from the prompt's image row when prompts share an image) against the prompt's
// T <= 16 token keys (staged in shared memory as fp32), softmax in fp32 registers, one rounding per
// probability, written straight in the [B, HW, heads * T] layout the value product wants. Replaces a
// GEMM (misaligned for this shape), a softmax into fp32 and a permuting copy.
// ImageToTokenUpdate: the whole image->token step of a block in one pass over the keys: the
// probabilities as above, then residual + P u (u = the prompt's values through out_proj, [heads * T,
// 256], staged in shared memory) and the LayerNorm, in fp32 registers from the loads to the one
// rounding of the output. Replaces ImageToTokenProbs + baddbmm (with the residual copied in first)
// + RowNorm: one read of q and the residual and one write per prompt instead of four passes, and
// the prompts of one image read their shared residual in place (no expand or index_select copy).
// CopySlices: many independent contiguous byte ranges copied in one launch (a table of
// {dst, src, bytes}); the per-prompt mask logits of a decode, which as separate copies cost more
// host launch time than GPU time.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <mma.h>

#include <algorithm>
#include <cstdint>

#include "kernels/float_convert.cuh"
#include "kernels/launchers.h"

namespace maskd::kernels::detail {
namespace {

constexpr int kThreads = 256;

template <typename T>
__device__ __forceinline__ float RoundTo(float v) {
  return ToFloat(FromFloat<T>(v));
}

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


namespace up {
constexpr int kRows = 32;        // GEMM rows per tile: 8 embedding columns x (dy, dx)
constexpr int kK = 64;           // input channels
constexpr int kN = 128;          // (ddy, ddx, c) output columns
constexpr int kC = 32;           // channels per sub-pixel
constexpr int kM = 4;            // masks
constexpr int kXs = kK + 8;      // padded leading dimensions (bank spread; WMMA needs multiples of 8 / 4)
constexpr int kWs = kN + 8;
constexpr int kAcc = kN + 4;
}  // namespace up

template <typename T>
__global__ void __launch_bounds__(128) UpscaleHyperKernel(const UpscaleHyperArgs a) {
  using namespace nvcuda;
  __shared__ __align__(32) T xs[up::kRows * up::kXs];
  __shared__ __align__(32) T ws[up::kK * up::kWs];
  __shared__ __align__(32) float acc[up::kRows * up::kAcc];
  __shared__ float bias[up::kN];
  __shared__ float hyper[up::kM * up::kC];
  __shared__ __align__(16) T ost[up::kM * 4 * 32];
  const int tid = threadIdx.x, warp = tid / 32;
  const T* x = static_cast<const T*>(a.x);
  const T* wg = static_cast<const T*>(a.w);
  for (int i = tid; i < up::kK * up::kN / 8; i += 128) {
    const int r = i / (up::kN / 8), c = (i % (up::kN / 8)) * 8;
    *reinterpret_cast<uint4*>(ws + r * up::kWs + c) = reinterpret_cast<const uint4*>(wg)[i];
  }
  for (int i = tid; i < up::kN; i += 128) bias[i] = ToFloat(static_cast<const T*>(a.bias)[i]);
  const int64_t per_image = static_cast<int64_t>(a.grid_h) * a.grid_w * 4;
  const int64_t tiles = a.rows / up::kRows;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t r0 = tile * up::kRows;
    const int64_t b = r0 / per_image;
    const int64_t rem = r0 - b * per_image;
    const int y = static_cast<int>(rem / (4 * a.grid_w));
    const int x0 = static_cast<int>(rem % (4 * a.grid_w)) / 4;  // first embedding column of the tile
    // x tile: 32 rows x 64 channels = 256 16-byte vectors.
    for (int i = tid; i < up::kRows * up::kK / 8; i += 128) {
      const int r = i / (up::kK / 8), c = (i % (up::kK / 8)) * 8;
      *reinterpret_cast<uint4*>(xs + r * up::kXs + c) =
          reinterpret_cast<const uint4*>(x + (r0 + r) * up::kK)[c / 8];
    }
    hyper[tid] = ToFloat(static_cast<const T*>(a.hyper)[b * up::kM * up::kC + tid]);
    __syncthreads();
    {
      // Warp w: rows 16 (w / 2) .. +16, columns 64 (w % 2) .. +64 (4 tiles of 16).
      const int rb = (warp / 2) * 16, cb = (warp % 2) * 64;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> f[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) wmma::fill_fragment(f[j], 0.0f);
#pragma unroll
      for (int k = 0; k < up::kK; k += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
        wmma::load_matrix_sync(fa, xs + rb * up::kXs + k, up::kXs);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
          wmma::load_matrix_sync(fb, ws + k * up::kWs + cb + 16 * j, up::kWs);
          wmma::mma_sync(f[j], fa, fb, f[j]);
        }
      }
#pragma unroll
      for (int j = 0; j < 4; ++j)
        wmma::store_matrix_sync(acc + rb * up::kAcc + cb + 16 * j, f[j], up::kAcc, wmma::mem_row_major);
    }
    __syncthreads();
    {
      // Thread: sub-pixel g = (ddy, ddx) = warp, tile row = lane: (column x0 + row / 4, dy, dx).
      const int row = tid % 32, g = warp;
      const float* ar = acc + row * up::kAcc + g * up::kC;
      const float* br = bias + g * up::kC;
      float o[up::kM] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
      for (int c = 0; c < up::kC; ++c) {
        const float v = RoundTo<T>(ar[c] + br[c]);
        const float h = RoundTo<T>(0.5f * v * (1.0f + erff(v * 0.70710678118654752f)));
#pragma unroll
        for (int m = 0; m < up::kM; ++m) o[m] += h * hyper[m * up::kC + c];
      }
      const int xl = row / 4, dy = (row % 4) / 2, dx = row % 2, ddy = g / 2, ddx = g % 2;
#pragma unroll
      for (int m = 0; m < up::kM; ++m)
        ost[((m * 2 + dy) * 2 + ddy) * 32 + 4 * xl + 2 * dx + ddx] = FromFloat<T>(o[m]);
    }
    __syncthreads();
    {
      // 16 output rows (m, dy, ddy) of 32 contiguous pixels; 4 values (8 bytes) per thread.
      const int seg = tid / 8, part = tid % 8;
      const int m = seg / 4, dy = (seg % 4) / 2, ddy = seg % 2;
      const int64_t H = 4 * a.grid_h, W = 4 * a.grid_w;
      T* dst = static_cast<T*>(a.out) + ((b * up::kM + m) * H + 4 * y + 2 * dy + ddy) * W + 4 * x0 + 4 * part;
      *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(ost + seg * 32 + 4 * part);
    }
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


constexpr int kProbsHeadDim = 16;
constexpr int kProbsMaxTokens = 16;
constexpr int kProbsMaxHeads = 16;

template <typename T>
__global__ void __launch_bounds__(kThreads) ImageToTokenProbsKernel(const ImageToTokenProbsArgs a) {
  // blockIdx.y: prompt b; threads: (position, head) pairs, head fastest.
  __shared__ float k_s[kProbsMaxTokens * kProbsMaxHeads * kProbsHeadDim];
  const int64_t b = blockIdx.y;
  const int channels = a.heads * kProbsHeadDim;
  const T* kb = static_cast<const T*>(a.k) + b * a.tokens * channels;
  for (int i = threadIdx.x; i < a.tokens * channels; i += blockDim.x) k_s[i] = ToFloat(kb[i]) * a.scale;
  __syncthreads();
  const int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= a.positions * a.heads) return;
  const int64_t p = item / a.heads;
  const int h = static_cast<int>(item % a.heads);
  const int64_t bq = a.q_rows ? a.q_rows[b] : (a.q_batches == 1 ? 0 : b);
  const T* qp = static_cast<const T*>(a.q) + bq * a.q_batch_stride + p * a.q_row_stride + h * kProbsHeadDim;
  float q[kProbsHeadDim];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const uint4 raw = reinterpret_cast<const uint4*>(qp)[half];
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) q[half * 8 + i] = ToFloat(e[i]);
  }
  float s[kProbsMaxTokens];
  float m = -__builtin_huge_valf();
#pragma unroll
  for (int t = 0; t < kProbsMaxTokens; ++t) {
    if (t < a.tokens) {
      const float* kt = k_s + t * channels + h * kProbsHeadDim;
      float acc = 0.f;
#pragma unroll
      for (int i = 0; i < kProbsHeadDim; ++i) acc = fmaf(q[i], kt[i], acc);
      s[t] = acc;
      m = fmaxf(m, acc);
    }
  }
  float sum = 0.f;
#pragma unroll
  for (int t = 0; t < kProbsMaxTokens; ++t) {
    if (t < a.tokens) {
      s[t] = __expf(s[t] - m);
      sum += s[t];
    }
  }
  const float inv = 1.f / sum;
  T* o = static_cast<T*>(a.out) + (b * a.positions + p) * (static_cast<int64_t>(a.heads) * a.tokens) +
         static_cast<int64_t>(h) * a.tokens;
#pragma unroll
  for (int t = 0; t < kProbsMaxTokens; ++t)
    if (t < a.tokens) o[t] = FromFloat<T>(s[t] * inv);
}


namespace upd {
constexpr int kD = kImageToTokenUpdateChannels;  // channels of the keys (D)
constexpr int kHeads = kImageToTokenUpdateHeads;
constexpr int kRowsPerStep = 32 / kHeads;         // rows a warp handles at once: one lane per (row, head)
constexpr int kRowsPerBlock = 128;                // 16 per warp
constexpr int kKStride = 20;                      // floats per (token, head) in shared memory: 16 + 4
                                                  // (float4 reads of the 8 heads hit distinct banks)
__host__ __device__ constexpr int SharedBytes(int elem, int ht, int tokens) {
  return ht * kD * elem + tokens * kHeads * kKStride * 4 + (kThreads / 32) * kRowsPerStep * ht * 4;
}
}  // namespace upd

template <typename T>
__global__ void __launch_bounds__(kThreads, 3) ImageToTokenUpdateKernel(const ImageToTokenUpdateArgs a) {
  // blockIdx.y: prompt b; blockIdx.x: 128 positions, 16 per warp, 4 at a time.
  //   1. lane (r, h) = (lane / 8, lane % 8): scores of row r's head h against the T token keys and
  //      their softmax, into the warp's probability rows in shared memory (fp32);
  //   2. lane l owns channels 8l..8l+7 of the 4 rows: residual + sum over k of P[r, k] u[k] (u staged
  //      in shared memory once per block, each 16-byte row slice reused for the 4 rows);
  //   3. LayerNorm of each row (xor-shuffle sums over the warp), affine, one rounding, 16-byte stores.
  extern __shared__ __align__(16) unsigned char smem[];
  const int tokens = a.probs.tokens, ht = upd::kHeads * tokens;
  T* u_s = reinterpret_cast<T*>(smem);
  float* k_s = reinterpret_cast<float*>(smem + static_cast<size_t>(ht) * upd::kD * sizeof(T));
  float* p_s = k_s + tokens * upd::kHeads * upd::kKStride;
  const int64_t b = blockIdx.y;
  {
    const uint4* ub = reinterpret_cast<const uint4*>(static_cast<const T*>(a.u) + b * ht * upd::kD);
    for (int i = threadIdx.x; i < ht * upd::kD / 8; i += kThreads) reinterpret_cast<uint4*>(u_s)[i] = ub[i];
    const T* kb = static_cast<const T*>(a.probs.k) + b * tokens * (upd::kHeads * kProbsHeadDim);
    for (int i = threadIdx.x; i < tokens * upd::kHeads * kProbsHeadDim; i += kThreads) {
      const int t = i / (upd::kHeads * kProbsHeadDim), h = (i / kProbsHeadDim) % upd::kHeads, c = i % kProbsHeadDim;
      k_s[(t * upd::kHeads + h) * upd::kKStride + c] = ToFloat(kb[i]) * a.probs.scale;
    }
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* pw = p_s + warp * upd::kRowsPerStep * ht;
  const int64_t bq = a.probs.q_rows ? a.probs.q_rows[b] : (a.probs.q_batches == 1 ? 0 : b);
  const int64_t br = a.residual_rows ? a.residual_rows[b] : b;
  const T* qbase = static_cast<const T*>(a.probs.q) + bq * a.probs.q_batch_stride;
  const T* rbase = static_cast<const T*>(a.residual) + br * a.residual_batch_stride;
  T* obase = static_cast<T*>(a.out) + b * a.probs.positions * upd::kD;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * upd::kRowsPerBlock + warp * (upd::kRowsPerBlock / 8);
  for (int step = 0; step < upd::kRowsPerBlock / 8 / upd::kRowsPerStep; ++step) {
    const int64_t p0 = first + step * upd::kRowsPerStep;
    if (p0 >= a.probs.positions) break;  // uniform over the warp
    {
      const int r = lane / upd::kHeads, h = lane % upd::kHeads;
      const int64_t p = p0 + r;
      if (p < a.probs.positions) {
        const uint4* qp = reinterpret_cast<const uint4*>(qbase + p * a.probs.q_row_stride + h * kProbsHeadDim);
        float q[kProbsHeadDim];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const uint4 raw = qp[half];
          const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
          for (int i = 0; i < 8; ++i) q[half * 8 + i] = ToFloat(e[i]);
        }
        float s[kProbsMaxTokens];
        float m = -__builtin_huge_valf();
#pragma unroll
        for (int t = 0; t < kProbsMaxTokens; ++t) {
          if (t < tokens) {
            const float4* kt = reinterpret_cast<const float4*>(k_s + (t * upd::kHeads + h) * upd::kKStride);
            float acc = 0.f;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const float4 kv = kt[i];
              acc = fmaf(q[4 * i], kv.x, acc);
              acc = fmaf(q[4 * i + 1], kv.y, acc);
              acc = fmaf(q[4 * i + 2], kv.z, acc);
              acc = fmaf(q[4 * i + 3], kv.w, acc);
            }
            s[t] = acc;
            m = fmaxf(m, acc);
          }
        }
        float sum = 0.f;
#pragma unroll
        for (int t = 0; t < kProbsMaxTokens; ++t) {
          if (t < tokens) {
            s[t] = __expf(s[t] - m);
            sum += s[t];
          }
        }
        const float inv = 1.f / sum;
#pragma unroll
        for (int t = 0; t < kProbsMaxTokens; ++t)
          if (t < tokens) pw[r * ht + h * tokens + t] = s[t] * inv;
      }
    }
    __syncwarp();
    float acc[upd::kRowsPerStep][8];
#pragma unroll
    for (int r = 0; r < upd::kRowsPerStep; ++r) {
      if (p0 + r < a.probs.positions) {
        const uint4 raw = reinterpret_cast<const uint4*>(rbase + (p0 + r) * upd::kD)[lane];
        const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[r][i] = ToFloat(e[i]);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[r][i] = 0.f;
      }
    }
    // Four k at a time: the rows' probabilities as float4 broadcasts (ht = 8 T is a multiple of 4).
    for (int k0 = 0; k0 < ht; k0 += 4) {
      float4 pk[upd::kRowsPerStep];
#pragma unroll
      for (int r = 0; r < upd::kRowsPerStep; ++r) pk[r] = *reinterpret_cast<const float4*>(pw + r * ht + k0);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint4 raw = reinterpret_cast<const uint4*>(u_s + (k0 + kk) * upd::kD)[lane];
        const T* e = reinterpret_cast<const T*>(&raw);
        float u[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) u[i] = ToFloat(e[i]);
#pragma unroll
        for (int r = 0; r < upd::kRowsPerStep; ++r) {
          const float p = kk == 0 ? pk[r].x : kk == 1 ? pk[r].y : kk == 2 ? pk[r].z : pk[r].w;
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[r][i] = fmaf(p, u[i], acc[r][i]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < upd::kRowsPerStep; ++r) {
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) sum += acc[r][i];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      const float mean = sum / upd::kD;
      float sq = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) sq += (acc[r][i] - mean) * (acc[r][i] - mean);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
      const float rstd = rsqrtf(sq / upd::kD + a.eps);
      if (p0 + r < a.probs.positions) {
        // LayerNorm's affine straight from global memory (L1-resident): 80 registers allow 3 blocks
        // of 256 threads per SM, and they are full with the 4 rows' accumulators.
        const uint4 wraw = reinterpret_cast<const uint4*>(a.weight)[lane];
        const uint4 braw = reinterpret_cast<const uint4*>(a.bias)[lane];
        const T* we = reinterpret_cast<const T*>(&wraw);
        const T* be = reinterpret_cast<const T*>(&braw);
        uint4 oraw;
        T* o = reinterpret_cast<T*>(&oraw);
#pragma unroll
        for (int i = 0; i < 8; ++i) o[i] = FromFloat<T>((acc[r][i] - mean) * rstd * ToFloat(we[i]) + ToFloat(be[i]));
        reinterpret_cast<uint4*>(obase + (p0 + r) * upd::kD)[lane] = oraw;
      }
    }
    __syncwarp();  // the next step's probabilities overwrite pw
  }
}

template <typename T>
cudaError_t LaunchImageToTokenUpdateT(const ImageToTokenUpdateArgs& a, cudaStream_t stream) {
  const int ht = upd::kHeads * a.probs.tokens;
  const int bytes = upd::SharedBytes(static_cast<int>(sizeof(T)), ht, a.probs.tokens);
  // Above the default 48 KB from T = 9 on (u alone is 4 KB a token in 16 bits). Set at each such
  // launch, as flash-attention does: the attribute is per device, and the call is legal in a capture.
  if (bytes > 48 * 1024) {
    const cudaError_t attr =
        cudaFuncSetAttribute(ImageToTokenUpdateKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (attr != cudaSuccess) return attr;
  }
  const dim3 grid(static_cast<unsigned>((a.probs.positions + upd::kRowsPerBlock - 1) / upd::kRowsPerBlock),
                  static_cast<unsigned>(a.probs.batch));
  ImageToTokenUpdateKernel<T><<<grid, kThreads, bytes, stream>>>(a);
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

cudaError_t LaunchUpscaleHyper(const UpscaleHyperArgs& a, DType dtype, int sms, cudaStream_t stream) {
  if (a.rows <= 0) return cudaSuccess;
  if (dtype == DType::kFloat32 || a.rows % up::kRows != 0 || a.grid_w % 8 != 0) return cudaErrorInvalidValue;
  const int64_t tiles = a.rows / up::kRows;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tiles, static_cast<int64_t>(sms) * 4));
  if (dtype == DType::kBFloat16)
    UpscaleHyperKernel<__nv_bfloat16><<<grid, 128, 0, stream>>>(a);
  else
    UpscaleHyperKernel<__half><<<grid, 128, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t LaunchImageToTokenProbs(const ImageToTokenProbsArgs& a, DType dtype, cudaStream_t stream) {
  if (a.batch <= 0 || a.positions <= 0) return cudaSuccess;
  if (dtype == DType::kFloat32 || a.tokens < 1 || a.tokens > kProbsMaxTokens || a.heads < 1 ||
      a.heads > kProbsMaxHeads || a.q_batch_stride % 8 != 0 || a.q_row_stride % 8 != 0 ||
      reinterpret_cast<uintptr_t>(a.q) % 16 != 0 || a.batch > 65535)
    return cudaErrorInvalidValue;
  const int64_t items = a.positions * a.heads;
  const dim3 grid(static_cast<unsigned>((items + kThreads - 1) / kThreads), static_cast<unsigned>(a.batch));
  if (dtype == DType::kBFloat16)
    ImageToTokenProbsKernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(a);
  else
    ImageToTokenProbsKernel<__half><<<grid, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t LaunchImageToTokenUpdate(const ImageToTokenUpdateArgs& a, DType dtype, cudaStream_t stream) {
  const ImageToTokenProbsArgs& p = a.probs;
  if (p.batch <= 0 || p.positions <= 0) return cudaSuccess;
  const auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  if (dtype == DType::kFloat32 || p.tokens < 1 || p.tokens > kProbsMaxTokens || p.heads != upd::kHeads ||
      p.q_batch_stride % 8 != 0 || p.q_row_stride % 8 != 0 || !aligned(p.q) || p.batch > 65535 ||
      a.residual_batch_stride % 8 != 0 || !aligned(a.residual) || !aligned(a.u) || !aligned(a.weight) ||
      !aligned(a.bias) || !aligned(a.out))
    return cudaErrorInvalidValue;
  return dtype == DType::kBFloat16 ? LaunchImageToTokenUpdateT<__nv_bfloat16>(a, stream)
                                   : LaunchImageToTokenUpdateT<__half>(a, stream);
}

}  // namespace maskd::kernels::detail
