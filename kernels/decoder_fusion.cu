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
// mask vectors, per 32-row tile: the GEMM on tensor cores (mma.m16n8k16, fp32 accumulation), bias +
// GELU (rounded to T where the unfused path stores T) and the 4 dot products on the accumulators in
// registers, and the tile's 512 mask values written in the final [B, 4, 4h, 4w] pixel order. The
// [B, 65536, 32] activation (268 MB at 64 prompts) never exists; optionally the first step's
// LayerNorm2d + GELU is applied to each x tile as it arrives (RowNorm's arithmetic), so that the
// normalised [B, 16384, 64] input is not written either.
// ImageToTokenProbs: the image->token attention's scores and softmax for every (prompt, position,
// head) in one thread: its 16 query channels (two 16-byte loads, read in place from the projection's
// strided output, or from the prompt's image row when prompts share an image) against the prompt's
// T <= 16 token keys (staged in shared memory as fp32), softmax in fp32 registers, one rounding per
// probability, written straight in the [B, HW, heads * T] layout the value product wants. Replaces a
// GEMM (misaligned for this shape), a softmax into fp32 and a permuting copy.
// ImageToTokenUpdate: the whole image->token step of a block in one pass over the keys, per tile of
// 64 positions: the probabilities as above into shared memory (rounded to T, as the unfused path
// rounds P), then residual + P u on the tensor cores (u = the prompt's values through out_proj,
// [heads * T, 256], staged in shared memory once per block; mma.m16n8k16 with fp32 accumulators
// that start at the residual) and the LayerNorm from the accumulators, one rounding of the output.
// Replaces ImageToTokenProbs + baddbmm (with the residual copied in first) + RowNorm: one read of q
// and the residual and one write per prompt instead of four passes, and the prompts of one image
// read their shared residual in place (no expand or index_select copy). An optional q_bias [HW, I]
// (the positional share of the query projection) is added to q as it is loaded.
// ImageSideKeys: the shared decoder's image-side input for a batch of embeddings in one launch: each
// [C, 64, 64] embedding plus the no-mask dense embedding (one value per channel), transposed to the
// [4096, C] keys layout through shared-memory tiles (replaces a copy per image into a static input,
// then an add and a transposing copy).
// CopySlices: many independent contiguous byte ranges copied in one launch (a table of
// {dst, src, bytes}); the per-prompt mask logits of a decode, which as separate copies cost more
// host launch time than GPU time.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/float_convert.cuh"
#include "kernels/launchers.h"
#include "kernels/mma_sync.cuh"

namespace maskd::kernels::detail {
namespace {

constexpr int kThreads = 256;

template <typename T>
__device__ __forceinline__ float RoundTo(float v) {
  return ToFloat(FromFloat<T>(v));
}

// LayerNorm (+ GELU) of a row of 8 L values held by L consecutive lanes (8 each, a 16-byte chunk;
// `lane` = the chunk's index): statistics in fp32 through xor-shuffles within the L-lane group (every
// lane of the warp takes part), the affine, GELU (erf form) on the fp32 value when asked, one
// rounding to T. RowNormKernel and UpscaleHyperKernel's fused input norm: the same arithmetic.
template <typename T, int L>
__device__ __forceinline__ uint4 NormalizeRowChunk(const float (&v)[8], const void* weight, const void* bias,
                                                   int lane, float eps, bool gelu) {
  constexpr int kC = 8 * L;
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
  const float rstd = rsqrtf(sq / kC + eps);
  const uint4 wraw = reinterpret_cast<const uint4*>(weight)[lane];
  const uint4 braw = reinterpret_cast<const uint4*>(bias)[lane];
  const T* we = reinterpret_cast<const T*>(&wraw);
  const T* be = reinterpret_cast<const T*>(&braw);
  uint4 oraw;
  T* o = reinterpret_cast<T*>(&oraw);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    float y = (v[i] - mean) * rstd * ToFloat(we[i]) + ToFloat(be[i]);
    if (gelu) y = 0.5f * y * (1.f + erff(y * 0.70710678118654752f));
    o[i] = FromFloat<T>(y);
  }
  return oraw;
}

template <typename T>
__device__ __forceinline__ void Widen8(const uint4& raw, float (&v)[8]) {
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = ToFloat(e[i]);
}

template <typename T, int L>
__global__ void __launch_bounds__(kThreads) RowNormKernel(const RowNormArgs a) {
  constexpr int kC = 8 * L;
  const int lane = threadIdx.x % L;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / L) + threadIdx.x / L;
  const bool active = row < a.rows;
  float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  if (active) Widen8<T>(reinterpret_cast<const uint4*>(static_cast<const T*>(a.x) + row * kC)[lane], v);
  const uint4 out = NormalizeRowChunk<T, L>(v, a.weight, a.bias, lane, a.eps, a.gelu);
  if (active) reinterpret_cast<uint4*>(static_cast<T*>(a.out) + row * kC)[lane] = out;
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


// GELU (erf form, ATen's expression) of a value v that is already rounded to T, rounded to T: the
// conv's activation as the unfused path stores it.
template <typename T>
__device__ __forceinline__ float GeluRounded(float v) {
  return RoundTo<T>(0.5f * v * (1.0f + erff(v * 0.70710678118654752f)));
}

namespace up {
constexpr int kRows = 32;     // GEMM rows per tile: 8 embedding columns x (dy, dx)
constexpr int kK = 64;        // input channels
constexpr int kN = 128;       // (ddy, ddx, c) output columns
constexpr int kC = 32;        // channels per sub-pixel
constexpr int kM = 4;         // masks
constexpr int kXs = kK + 8;   // x rows in shared memory: 144 B, an ldmatrix's 8 rows on distinct banks
constexpr int kWs = kN + 8;   // w rows: 272 B, likewise
constexpr int kThreads = 128; // 4 warps: rows 16 (warp / 2).., columns 64 (warp % 2)..
// GELU table (bf16, args.gelu_table): GeluRounded of every bf16 value with 2^-8 <= |v| < 8, both
// signs, by bit pattern (exponent fields kGeluExpLo.. kGeluExpLo + kGeluExps - 1, all 128
// mantissas), 5.5 KB; other values take erff.
constexpr int kGeluExpLo = 127 - 8;
constexpr int kGeluExps = 11;
constexpr int kGeluHalf = kGeluExps * 128;  // entries a sign
}  // namespace up

// GeluRounded<T>(v) for v already rounded to bf16, by v's bit pattern from `table` (GeluRounded of the
// values it covers, filled by the same function: the same bits) where it covers v, else erff.
template <typename T>
__device__ __forceinline__ float GeluRoundedLookup(float v, const T* table) {
  const uint32_t h = __float_as_uint(v) >> 16;  // v is a bf16 value: its low 16 bits are zero
  const uint32_t i = (h & 0x7fffu) - static_cast<uint32_t>(up::kGeluExpLo << 7);
  if (i < static_cast<uint32_t>(up::kGeluHalf)) return ToFloat(table[i + (h >> 15) * up::kGeluHalf]);
  return GeluRounded<T>(v);
}

// Per tile of 32 rows (one prompt b, one embedding row y, columns x0..x0+7, all (dy, dx)):
//   1. the x tile [32, 64] arrives by cp.async, issued one tile ahead (two buffers); with the input
//      norm, each 16-byte chunk is normalised in place (NormalizeRowChunk, the RowNorm kernel's
//      arithmetic: 8 lanes a row);
//   2. warp (rows 16 (w / 2).., columns 64 (w % 2)..): x w on the tensor cores (mma.m16n8k16, fp32;
//      x by ldmatrix, w [k][n] by ldmatrix.trans from shared memory, staged once per block);
//   3. from the accumulators, in registers: + bias, rounded to T, GELU, rounded to T (the unfused
//      path's two stores), times the prompt's hypernetwork vectors, summed over a sub-pixel's 32
//      channels (each lane holds 8: a quad's four lanes reduce by shuffles); lane t of a quad
//      keeps mask t's two values;
//   4. the tile's 512 mask values through shared memory into the [B, 4, 4h, 4w] pixel order, written
//      as 16 rows of 32 contiguous pixels.
template <typename T, bool kTable>
__global__ void __launch_bounds__(up::kThreads) UpscaleHyperKernel(const UpscaleHyperArgs a) {
  __shared__ __align__(16) T ws[up::kK * up::kWs];
  __shared__ __align__(16) T xs[2][up::kRows * up::kXs];
  __shared__ float bias[up::kN];
  __shared__ float hyper[up::kM * up::kC];
  __shared__ __align__(16) T ost[up::kM * 4 * 32];
  static_assert(!kTable || std::is_same_v<T, __nv_bfloat16>, "the GELU table is bf16's");
  __shared__ T gelu[kTable ? 2 * up::kGeluHalf : 1];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const T* x = static_cast<const T*>(a.x);
  const T* wg = static_cast<const T*>(a.w);
  for (int i = tid; i < up::kK * up::kN / 8; i += up::kThreads) {
    const int r = i / (up::kN / 8), c = (i % (up::kN / 8)) * 8;
    *reinterpret_cast<uint4*>(ws + r * up::kWs + c) = reinterpret_cast<const uint4*>(wg)[i];
  }
  const T* table = nullptr;
  if constexpr (kTable) {  // made visible by the tile loop's first __syncthreads
    for (int i = tid; i < 2 * up::kGeluHalf; i += up::kThreads) {
      const uint32_t h = static_cast<uint32_t>(i / up::kGeluHalf) << 15 |
                         (static_cast<uint32_t>(up::kGeluExpLo << 7) + static_cast<uint32_t>(i % up::kGeluHalf));
      gelu[i] = FromFloat<T>(GeluRounded<T>(__uint_as_float(h << 16)));
    }
    table = gelu;
  }
  for (int i = tid; i < up::kN; i += up::kThreads) bias[i] = ToFloat(static_cast<const T*>(a.bias)[i]);
  const int64_t per_image = static_cast<int64_t>(a.grid_h) * a.grid_w * 4;
  const int64_t tiles = a.rows / up::kRows;
  // Thread's two 16-byte chunks of a tile: rows tid / 8 and tid / 8 + 16, chunk tid % 8 (8 lanes a row).
  auto issue = [&](int64_t tile, int buf) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int r = tid / 8 + 16 * k, c8 = tid % 8;
      CpAsync16(SmemAddr(xs[buf] + r * up::kXs + 8 * c8), x + (tile * up::kRows + r) * up::kK + 8 * c8, true);
    }
    CpAsyncCommit();
  };
  const int rb = (warp / 2) * 16, cb = (warp % 2) * 64;
  const LdmOffset ld = LdmRowsFirst(lane);
  int buf = 0;
  if (blockIdx.x < tiles) issue(blockIdx.x, 0);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x, buf ^= 1) {
    __syncthreads();  // the previous tile's reads of xs[buf ^ 1], hyper and ost done; w staged
    if (tile + gridDim.x < tiles) {
      issue(tile + gridDim.x, buf ^ 1);
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    const int64_t r0 = tile * up::kRows;
    const int64_t b = r0 / per_image;
    const int64_t rem = r0 - b * per_image;
    const int y = static_cast<int>(rem / (4 * a.grid_w));
    const int x0 = static_cast<int>(rem % (4 * a.grid_w)) / 4;  // first embedding column of the tile
    hyper[tid] = ToFloat(static_cast<const T*>(a.hyper)[b * up::kM * up::kC + tid]);
    if (a.norm_weight) {  // each thread normalises the chunks it copied (its own cp.async is complete)
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        uint4* chunk = reinterpret_cast<uint4*>(xs[buf] + (tid / 8 + 16 * k) * up::kXs + 8 * (tid % 8));
        float v[8];
        Widen8<T>(*chunk, v);
        *chunk = NormalizeRowChunk<T, 8>(v, a.norm_weight, a.norm_bias, tid % 8, a.norm_eps, true);
      }
    }
    __syncthreads();
    float acc[8][4] = {};
#pragma unroll
    for (int kk = 0; kk < up::kK; kk += 16) {
      uint32_t af[4];
      LdMatrixX4(af, SmemAddr(xs[buf] + (rb + ld.row) * up::kXs + kk + ld.col));
#pragma unroll
      for (int j = 0; j < 8; j += 2) {
        uint32_t bf[4];
        LdMatrixX4Trans(bf, SmemAddr(ws + (kk + ld.row) * up::kWs + cb + 8 * j + ld.col));
        Mma<T>::Run(acc[j], af, bf[0], bf[1]);
        Mma<T>::Run(acc[j + 1], af, bf[2], bf[3]);
      }
    }
    // n-tiles 4 grp.. 4 grp + 3 are sub-pixel sp = cb / 32 + grp; lane (g, t) holds rows g, g + 8 and
    // channels 8 jj + 2t, + 1 of each.
#pragma unroll
    for (int grp = 0; grp < 2; ++grp) {
      float o[2][up::kM] = {};
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = 8 * jj + 2 * t + (e % 2);
          const float v = RoundTo<T>(acc[4 * grp + jj][e] + bias[cb + 32 * grp + c]);
          const float h = kTable ? GeluRoundedLookup<T>(v, table) : GeluRounded<T>(v);
#pragma unroll
          for (int m = 0; m < up::kM; ++m) o[e / 2][m] = fmaf(h, hyper[m * up::kC + c], o[e / 2][m]);
        }
      }
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
#pragma unroll
        for (int m = 0; m < up::kM; ++m) {
          o[rr][m] += __shfl_xor_sync(0xffffffffu, o[rr][m], 1);
          o[rr][m] += __shfl_xor_sync(0xffffffffu, o[rr][m], 2);
        }
        const float mine = t == 0 ? o[rr][0] : t == 1 ? o[rr][1] : t == 2 ? o[rr][2] : o[rr][3];
        const int row = rb + g + 8 * rr, sp = cb / 32 + grp;
        const int xl = row / 4, dy = (row % 4) / 2, dx = row % 2, ddy = sp / 2, ddx = sp % 2;
        ost[((t * 2 + dy) * 2 + ddy) * 32 + 4 * xl + 2 * dx + ddx] = FromFloat<T>(mine);
      }
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

// Block (32, 8): a 32-position x 32-channel tile of image blockIdx.z, read along positions (rows of
// the channel-major embedding) and written along channels; a position-major image is read and
// written along channels.
template <typename T>
__global__ void __launch_bounds__(kThreads) ImageSideKeysKernel(const ImageSideKeysArgs a) {
  __shared__ float tile[32][33];
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  const int64_t p0 = static_cast<int64_t>(blockIdx.x) * 32, c0 = static_cast<int64_t>(blockIdx.y) * 32;
  const T* img = static_cast<const T*>(a.images[blockIdx.z]);
  const T* bias = static_cast<const T*>(a.channel_bias);
  T* out = static_cast<T*>(a.out) + static_cast<int64_t>(blockIdx.z) * a.positions * a.channels;
  if ((a.position_major >> blockIdx.z) & 1) {  // uniform in the block
    for (int r = ty; r < 32; r += kThreads / 32) {
      const int64_t p = p0 + r, c = c0 + tx;
      if (c < a.channels && p < a.positions)
        out[p * a.channels + c] = FromFloat<T>(ToFloat(img[p * a.channels + c]) + ToFloat(bias[c]));
    }
    return;
  }
  for (int r = ty; r < 32; r += kThreads / 32) {
    const int64_t c = c0 + r, p = p0 + tx;
    if (c < a.channels && p < a.positions) tile[r][tx] = ToFloat(img[c * a.positions + p]) + ToFloat(bias[c]);
  }
  __syncthreads();
  for (int r = ty; r < 32; r += kThreads / 32) {
    const int64_t p = p0 + r, c = c0 + tx;
    if (c < a.channels && p < a.positions) out[p * a.channels + c] = FromFloat<T>(tile[tx][r]);
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

// The softmax over the T token keys of one (position, head) of the image->token attention, shared by
// ImageToTokenProbsKernel and ImageToTokenUpdateKernel: the position's 16 query channels (+ q_bias's,
// summed in fp32, when given) against the keys in shared memory (fp32, pre-scaled, 16-byte aligned;
// token t at k + t * k_token_stride), into s[0..tokens).
template <typename T>
__device__ __forceinline__ void HeadSoftmax(const T* q, const T* q_bias, const float* k, int k_token_stride,
                                            int tokens, float (&s)[kProbsMaxTokens]) {
  float qf[kProbsHeadDim];
  uint4 bias_raw[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};  // 16-bit zeros without q_bias
  if (q_bias) {
    bias_raw[0] = reinterpret_cast<const uint4*>(q_bias)[0];
    bias_raw[1] = reinterpret_cast<const uint4*>(q_bias)[1];
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const uint4 raw = reinterpret_cast<const uint4*>(q)[half];
    const T* e = reinterpret_cast<const T*>(&raw);
    const T* be = reinterpret_cast<const T*>(&bias_raw[half]);
#pragma unroll
    for (int i = 0; i < 8; ++i) qf[half * 8 + i] = ToFloat(e[i]) + ToFloat(be[i]);
  }
  float m = -__builtin_huge_valf();
#pragma unroll
  for (int t = 0; t < kProbsMaxTokens; ++t) {
    if (t < tokens) {
      const float4* kt = reinterpret_cast<const float4*>(k + t * k_token_stride);
      float acc = 0.f;
#pragma unroll
      for (int i = 0; i < kProbsHeadDim / 4; ++i) {
        const float4 kv = kt[i];
        acc = fmaf(qf[4 * i], kv.x, acc);
        acc = fmaf(qf[4 * i + 1], kv.y, acc);
        acc = fmaf(qf[4 * i + 2], kv.z, acc);
        acc = fmaf(qf[4 * i + 3], kv.w, acc);
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
    if (t < tokens) s[t] *= inv;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) ImageToTokenProbsKernel(const ImageToTokenProbsArgs a) {
  // blockIdx.y: prompt b; threads: (position, head) pairs, head fastest.
  __shared__ __align__(16) float k_s[kProbsMaxTokens * kProbsMaxHeads * kProbsHeadDim];
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
  const T* qb = a.q_bias ? static_cast<const T*>(a.q_bias) + p * a.q_bias_row_stride + h * kProbsHeadDim : nullptr;
  float s[kProbsMaxTokens];
  HeadSoftmax<T>(qp, qb, k_s + h * kProbsHeadDim, channels, a.tokens, s);
  T* o = static_cast<T*>(a.out) + (b * a.positions + p) * (static_cast<int64_t>(a.heads) * a.tokens) +
         static_cast<int64_t>(h) * a.tokens;
#pragma unroll
  for (int t = 0; t < kProbsMaxTokens; ++t)
    if (t < a.tokens) o[t] = FromFloat<T>(s[t]);
}

namespace upd {
constexpr int kD = kImageToTokenUpdateChannels;  // channels of the keys (D)
constexpr int kHeads = kImageToTokenUpdateHeads;
constexpr int kTileRows = 64;   // positions per tile: 4 groups of 16 rows, each by two warps (128 channels each)
constexpr int kUPitch = kD + 8; // u's rows in shared memory (elements): +16 B, conflict-free ldmatrix
constexpr int kKStride = 20;    // floats per (token, head) in shared memory: 16 + 4 (16-byte aligned)
constexpr int kXPitch = kD + 8; // the residual/output tile's rows in shared memory: 528 B, an odd multiple of
                                // 16 B, so the fragment-layout accesses of a warp hit 32 distinct banks
// P's k dimension padded to the mma's 16, and its row pitch (an odd multiple of 16 bytes).
__host__ __device__ constexpr int KPad(int ht) { return (ht + 15) / 16 * 16; }
__host__ __device__ constexpr int PPitch(int ht) { return KPad(ht) + 8; }
// The token keys' region: in fp32, [t][h][kKStride].
__host__ __device__ constexpr int KeysBytes(int tokens) { return tokens * kHeads * kKStride * 4; }
__host__ __device__ constexpr int SharedBytes(int elem, int ht, int tokens) {
  return KPad(ht) * kUPitch * elem + kTileRows * PPitch(ht) * elem + KeysBytes(tokens) + 2 * 2 * kTileRows * 4 +
         kTileRows * kXPitch * elem;
}

template <typename T>
__device__ __forceinline__ uint32_t Load32(const T* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
template <typename T>
__device__ __forceinline__ float2 Load2(const T* p) {
  const uint32_t raw = *reinterpret_cast<const uint32_t*>(p);
  const T* e = reinterpret_cast<const T*>(&raw);
  return make_float2(ToFloat(e[0]), ToFloat(e[1]));
}
template <typename T>
__device__ __forceinline__ void Store2(T* p, float x, float y) {
  *reinterpret_cast<uint32_t*>(p) = Mma<T>::Pack(x, y);
}

// A row's total over its 256 channels, held as (own, other) 16-row halves: the quad's four lanes
// first, then the other warp's half through `red` ([2 halves][kTileRows]); one __syncthreads.
__device__ __forceinline__ float2 RowTotals(float v0, float v1, float* red, int half, int row0, bool writer) {
  v0 += __shfl_xor_sync(0xffffffffu, v0, 1);
  v0 += __shfl_xor_sync(0xffffffffu, v0, 2);
  v1 += __shfl_xor_sync(0xffffffffu, v1, 1);
  v1 += __shfl_xor_sync(0xffffffffu, v1, 2);
  if (writer) {
    red[half * kTileRows + row0] = v0;
    red[half * kTileRows + row0 + 8] = v1;
  }
  __syncthreads();
  // Both warps of a row add the halves in the same order: one mean and one rstd per row.
  return make_float2(red[row0] + red[kTileRows + row0], red[row0 + 8] + red[kTileRows + row0 + 8]);
}
}  // namespace upd

// The update kernel's staging and per-prompt addressing (`tid` of `threads` threads).
// The prompt's u [ht, 256] into u_s ([kpad][kUPitch]; the padding rows zero).
template <typename T>
__device__ __forceinline__ void StageU(const ImageToTokenUpdateArgs& a, T* u_s, int64_t b, int ht, int kpad, int tid,
                                       int threads) {
  const T* ub = static_cast<const T*>(a.u) + b * ht * upd::kD;
  for (int i = tid; i < kpad * (upd::kD / 8); i += threads) {
    const int row = i / (upd::kD / 8), c8 = i % (upd::kD / 8);
    const uint4 v = row < ht ? reinterpret_cast<const uint4*>(ub + row * upd::kD)[c8] : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(u_s + row * upd::kUPitch + 8 * c8) = v;
  }
}
// The prompt's token keys in fp32, pre-scaled, as [t][h][kKStride] (HeadSoftmax's layout).
template <typename T>
__device__ __forceinline__ void StageKeys(const ImageToTokenUpdateArgs& a, float* k_s, int64_t b, int tokens, int tid,
                                          int threads) {
  const T* kb = static_cast<const T*>(a.probs.k) + b * tokens * (upd::kHeads * kProbsHeadDim);
  for (int i = tid; i < tokens * upd::kHeads * kProbsHeadDim; i += threads) {
    const int t = i / (upd::kHeads * kProbsHeadDim), h = (i / kProbsHeadDim) % upd::kHeads, c = i % kProbsHeadDim;
    k_s[(t * upd::kHeads + h) * upd::kKStride + c] = ToFloat(kb[i]) * a.probs.scale;
  }
}
// P's padding columns ht..kpad-1 zero: the probabilities write columns < ht only.
template <typename T>
__device__ __forceinline__ void ZeroPPadding(T* p_s, int ht, int kpad, int ppitch, int tid, int threads) {
  for (int i = tid; i < upd::kTileRows * (kpad - ht); i += threads)
    p_s[(i / (kpad - ht)) * ppitch + ht + i % (kpad - ht)] = FromFloat<T>(0.f);
}
// The prompt's rows: its q (row q_rows[b], 0 or b), the positional share, its residual (row
// residual_rows[b] or b) and its output.
template <typename T>
struct PromptRows {
  const T* q;
  const T* q_bias;
  const T* residual;
  T* out;
};
template <typename T>
__device__ __forceinline__ PromptRows<T> RowsOfPrompt(const ImageToTokenUpdateArgs& a, int64_t b) {
  const int64_t bq = a.probs.q_rows ? a.probs.q_rows[b] : (a.probs.q_batches == 1 ? 0 : b);
  const int64_t br = a.residual_rows ? a.residual_rows[b] : b;
  return {static_cast<const T*>(a.probs.q) + bq * a.probs.q_batch_stride, static_cast<const T*>(a.probs.q_bias),
          static_cast<const T*>(a.residual) + br * a.residual_batch_stride,
          static_cast<T*>(a.out) + b * a.probs.positions * upd::kD};
}
// A tile's residual rows into x_s by 16-byte cp.async, by the tile's 256 threads: 64 x 32 chunks, a
// warp per row and access; rows past the end are zero-filled (their outputs are not stored). The
// caller commits.
template <typename T>
__device__ __forceinline__ void LoadResidualTile(T* x_s, const T* residual, int64_t row0, int64_t positions, int htid) {
#pragma unroll
  for (int i = 0; i < upd::kTileRows * (upd::kD / 8) / kThreads; ++i) {
    const int chunk = htid + i * kThreads, r = chunk / (upd::kD / 8), c8 = chunk % (upd::kD / 8);
    const bool valid = row0 + r < positions;
    CpAsync16(SmemAddr(x_s + r * upd::kXPitch + 8 * c8), residual + (valid ? (row0 + r) * upd::kD + 8 * c8 : 0),
              valid);
  }
}

// Step 1 of ImageToTokenUpdateKernel for a tile: thread `htid` of the tile's 256 makes two (row,
// head) pairs' probabilities (HeadSoftmax), rounded to T into p_s.
template <typename T>
__device__ __forceinline__ void TileProbs(const ImageToTokenUpdateArgs& a, const T* qbase, const T* qbias,
                                          const float* k_s, T* p_s, int ppitch, int64_t row0, int htid) {
  const int tokens = a.probs.tokens;
  const int64_t positions = a.probs.positions;
#pragma unroll 1
  for (int i = 0; i < upd::kTileRows * upd::kHeads / kThreads; ++i) {
    const int pair = htid + i * kThreads, r = pair / upd::kHeads, h = pair % upd::kHeads;
    const int64_t p = row0 + r;
    T* pr = p_s + r * ppitch + h * tokens;
    float s[kProbsMaxTokens];
    if (p < positions) {
      HeadSoftmax<T>(qbase + p * a.probs.q_row_stride + h * kProbsHeadDim,
                     qbias ? qbias + p * a.probs.q_bias_row_stride + h * kProbsHeadDim : nullptr,
                     k_s + h * upd::kKStride, upd::kHeads * upd::kKStride, tokens, s);
    } else {
#pragma unroll
      for (int t = 0; t < kProbsMaxTokens; ++t) s[t] = 0.f;
    }
#pragma unroll
    for (int t = 0; t < kProbsMaxTokens; ++t)
      if (t < tokens) pr[t] = FromFloat<T>(s[t]);
  }
}

// Steps 2 and 3 of a tile and its output (ImageToTokenUpdateKernel): thread `htid` of the tile's 256,
// warp (row group rg = warp / 2, half = warp % 2) rows 16 rg..16 rg+15, channels 128 half..+127:
// accumulators from the residual tile x_s, += P u on the tensor cores, the LayerNorm from the
// accumulators (the row totals through red_sum / red_sq), the output written back into x_s and, after
// a __syncthreads, out to global memory as 16-byte rows. The caller syncs before x_s, p_s or the
// totals are written again.
template <typename T>
__device__ __forceinline__ void TileUpdateAndStore(const ImageToTokenUpdateArgs& a, T* x_s, const T* p_s,
                                                   const T* u_s, int ppitch, int kpad, float* red_sum,
                                                   float* red_sq, int64_t row0, T* obase, int htid) {
  const int warp = htid / 32, lane = htid % 32, rg = warp / 2, half = warp % 2, g = lane / 4, tq = lane % 4;
  const int col0 = half * (upd::kD / 2) + 2 * tq;  // this lane's first channel of each 8-channel n-tile
  const int64_t positions = a.probs.positions;
  float acc[16][4];
  T* xa = x_s + (rg * 16 + g) * upd::kXPitch + col0;  // this lane's rows g and g + 8 of the tile
  {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const float2 x = upd::Load2(xa + 8 * j);
      const float2 y = upd::Load2(xa + 8 * upd::kXPitch + 8 * j);
      acc[j][0] = x.x;
      acc[j][1] = x.y;
      acc[j][2] = y.x;
      acc[j][3] = y.y;
    }
  }
  const LdmOffset ld = LdmRowsFirst(lane);
  for (int kk = 0; kk < kpad; kk += 16) {
    uint32_t af[4];
    LdMatrixX4(af, SmemAddr(p_s + (rg * 16 + ld.row) * ppitch + kk + ld.col));
#pragma unroll
    for (int j = 0; j < 16; j += 2) {
      uint32_t bf[4];
      LdMatrixX4Trans(bf, SmemAddr(u_s + (kk + ld.row) * upd::kUPitch + half * (upd::kD / 2) + 8 * j + ld.col));
      Mma<T>::Run(acc[j], af, bf[0], bf[1]);
      Mma<T>::Run(acc[j + 1], af, bf[2], bf[3]);
    }
  }
  const int r0 = rg * 16 + g;
  float s0 = 0.f, s1 = 0.f;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    s0 += acc[j][0] + acc[j][1];
    s1 += acc[j][2] + acc[j][3];
  }
  const float2 total = upd::RowTotals(s0, s1, red_sum, half, r0, tq == 0);
  const float mean0 = total.x / upd::kD, mean1 = total.y / upd::kD;
  float q0 = 0.f, q1 = 0.f;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    q0 += (acc[j][0] - mean0) * (acc[j][0] - mean0) + (acc[j][1] - mean0) * (acc[j][1] - mean0);
    q1 += (acc[j][2] - mean1) * (acc[j][2] - mean1) + (acc[j][3] - mean1) * (acc[j][3] - mean1);
  }
  const float2 sq = upd::RowTotals(q0, q1, red_sq, half, r0, tq == 0);
  const float rstd0 = rsqrtf(sq.x / upd::kD + a.eps), rstd1 = rsqrtf(sq.y / upd::kD + a.eps);
  const T* wp = static_cast<const T*>(a.weight) + col0;
  const T* bp = static_cast<const T*>(a.bias) + col0;
  // Each lane overwrites only the residual values it read itself.
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const float2 w = upd::Load2(wp + 8 * j), bi = upd::Load2(bp + 8 * j);
    upd::Store2(xa + 8 * j, (acc[j][0] - mean0) * rstd0 * w.x + bi.x, (acc[j][1] - mean0) * rstd0 * w.y + bi.y);
    upd::Store2(xa + 8 * upd::kXPitch + 8 * j, (acc[j][2] - mean1) * rstd1 * w.x + bi.x,
                (acc[j][3] - mean1) * rstd1 * w.y + bi.y);
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < upd::kTileRows * (upd::kD / 8) / kThreads; ++i) {
    const int chunk = htid + i * kThreads, r = chunk / (upd::kD / 8), c8 = chunk % (upd::kD / 8);
    if (row0 + r < positions)
      *reinterpret_cast<uint4*>(obase + (row0 + r) * upd::kD + 8 * c8) =
          *reinterpret_cast<const uint4*>(x_s + r * upd::kXPitch + 8 * c8);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 2) ImageToTokenUpdateKernel(const ImageToTokenUpdateArgs a) {
  // blockIdx.y: prompt b; blockIdx.x walks tiles of 64 positions (tile = blockIdx.x, + gridDim.x, ...).
  // Per tile:
  //   1. the probabilities P [64, 8 T] (TileProbs: a thread's two (row, head) pairs, HeadSoftmax),
  //      rounded to T into shared memory (the unfused path's rounding of P), columns 8 T..KPad-1 zero;
  //   2. and 3. TileUpdateAndStore: warp (row group rg = warp / 2, half = warp % 2): rows 16 rg..16
  //      rg+15, channels 128 half..+127: accumulators start at the residual, += P u on the tensor cores
  //      (mma.m16n8k16, fp32; P by ldmatrix, u [k][n] by ldmatrix.trans); LayerNorm per row from the
  //      accumulators: the halves' totals through shared memory (mean, then the squared deviations),
  //      the affine, one rounding.
  // The residual tile comes into shared memory by 16-byte cp.async issued before step 1 (the copy
  // overlaps the softmax), and the output tile goes out through the same buffer as 16-byte rows: the
  // accumulators' fragment layout touches 16 bytes of 8 rows per warp access, which read and wrote
  // global memory in 4-byte pieces (run 29: ~1.3 TB/s).
  extern __shared__ __align__(16) unsigned char smem[];
  const int tokens = a.probs.tokens, ht = upd::kHeads * tokens, kpad = upd::KPad(ht), ppitch = upd::PPitch(ht);
  T* u_s = reinterpret_cast<T*>(smem);
  T* p_s = u_s + kpad * upd::kUPitch;
  unsigned char* keys_s = reinterpret_cast<unsigned char*>(p_s + upd::kTileRows * ppitch);
  float* k_s = reinterpret_cast<float*>(keys_s);  // the token keys in fp32
  float* red_sum = reinterpret_cast<float*>(keys_s + upd::KeysBytes(tokens));
  float* red_sq = red_sum + 2 * upd::kTileRows;
  T* x_s = reinterpret_cast<T*>(red_sq + 2 * upd::kTileRows);  // the residual tile, then the output tile
  const int tid = threadIdx.x;
  const int64_t b = blockIdx.y;
  StageU<T>(a, u_s, b, ht, kpad, tid, kThreads);
  StageKeys<T>(a, k_s, b, tokens, tid, kThreads);
  ZeroPPadding<T>(p_s, ht, kpad, ppitch, tid, kThreads);
  const int64_t positions = a.probs.positions;
  const PromptRows<T> rows = RowsOfPrompt<T>(a, b);
  const int64_t tiles = (positions + upd::kTileRows - 1) / upd::kTileRows;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t row0 = tile * upd::kTileRows;
    __syncthreads();  // staging done; the previous tile's reads of p_s, x_s and the row totals done
    LoadResidualTile<T>(x_s, rows.residual, row0, positions, tid);
    CpAsyncCommit();
    TileProbs<T>(a, rows.q, rows.q_bias, k_s, p_s, ppitch, row0, tid);
    CpAsyncWait<0>();
    __syncthreads();
    TileUpdateAndStore<T>(a, x_s, p_s, u_s, ppitch, kpad, red_sum, red_sq, row0, rows.out, tid);
  }
}

template <typename T>
cudaError_t LaunchImageToTokenUpdateT(const ImageToTokenUpdateArgs& a, int sms, cudaStream_t stream) {
  const int ht = upd::kHeads * a.probs.tokens;
  const int bytes = upd::SharedBytes(static_cast<int>(sizeof(T)), ht, a.probs.tokens);
  // Above the default 48 KB from T = 1 on (the residual/output tile is 33 KB, u 4 KB a token in 16
  // bits; ~82 KB at T = 7, two blocks per SM). Set at each such launch, as flash-attention does: the
  // attribute is per device, and the call is legal in a capture.
  if (bytes > 48 * 1024) {
    const cudaError_t attr =
        cudaFuncSetAttribute(ImageToTokenUpdateKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (attr != cudaSuccess) return attr;
  }
  // A block walks several tiles so that u is staged once per about 4 tiles (u is 32 KB at T = 7 and
  // a tile reads 80 KB of q, residual and output), with about 8 blocks per SM over all prompts; a
  // click (one prompt) gets a block per tile.
  const int64_t tiles = (a.probs.positions + upd::kTileRows - 1) / upd::kTileRows;
  const int64_t per_prompt = std::max<int64_t>(1, (8 * static_cast<int64_t>(std::max(sms, 1)) + a.probs.batch - 1) /
                                                      a.probs.batch);
  const dim3 grid(static_cast<unsigned>(std::min(tiles, per_prompt)), static_cast<unsigned>(a.probs.batch));
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

cudaError_t LaunchImageSideKeys(const ImageSideKeysArgs& a, DType dtype, cudaStream_t stream) {
  if (a.count <= 0 || a.positions <= 0 || a.channels <= 0) return cudaSuccess;
  if (dtype == DType::kFloat32 || a.count > kImageSideKeysMaxImages || (a.channels + 31) / 32 > 65535)
    return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((a.positions + 31) / 32), static_cast<unsigned>((a.channels + 31) / 32),
                  static_cast<unsigned>(a.count));
  if (dtype == DType::kBFloat16)
    ImageSideKeysKernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(a);
  else
    ImageSideKeysKernel<__half><<<grid, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

int64_t UpscaleHyperBlocks(int64_t rows, int sms) {
  // ~29 KB of shared memory a block (~35 KB in bf16 with the GELU table): 6 per SM over the tiles.
  return std::min<int64_t>(rows / up::kRows, static_cast<int64_t>(sms) * 6);
}

cudaError_t LaunchUpscaleHyper(const UpscaleHyperArgs& a, DType dtype, int sms, cudaStream_t stream) {
  if (a.rows <= 0) return cudaSuccess;
  if (dtype == DType::kFloat32 || a.rows % up::kRows != 0 || a.grid_w % 8 != 0) return cudaErrorInvalidValue;
  if (a.norm_weight && (reinterpret_cast<uintptr_t>(a.norm_weight) % 16 != 0 ||
                        reinterpret_cast<uintptr_t>(a.norm_bias) % 16 != 0))
    return cudaErrorInvalidValue;
  const unsigned grid = static_cast<unsigned>(UpscaleHyperBlocks(a.rows, sms));
  if (dtype == DType::kBFloat16 && a.gelu_table)
    UpscaleHyperKernel<__nv_bfloat16, true><<<grid, up::kThreads, 0, stream>>>(a);
  else if (dtype == DType::kBFloat16)
    UpscaleHyperKernel<__nv_bfloat16, false><<<grid, up::kThreads, 0, stream>>>(a);
  else
    UpscaleHyperKernel<__half, false><<<grid, up::kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t LaunchImageToTokenProbs(const ImageToTokenProbsArgs& a, DType dtype, cudaStream_t stream) {
  if (a.batch <= 0 || a.positions <= 0) return cudaSuccess;
  if (dtype == DType::kFloat32 || a.tokens < 1 || a.tokens > kProbsMaxTokens || a.heads < 1 ||
      a.heads > kProbsMaxHeads || a.q_batch_stride % 8 != 0 || a.q_row_stride % 8 != 0 ||
      reinterpret_cast<uintptr_t>(a.q) % 16 != 0 || a.batch > 65535 ||
      (a.q_bias && (reinterpret_cast<uintptr_t>(a.q_bias) % 16 != 0 || a.q_bias_row_stride % 8 != 0)))
    return cudaErrorInvalidValue;
  const int64_t items = a.positions * a.heads;
  const dim3 grid(static_cast<unsigned>((items + kThreads - 1) / kThreads), static_cast<unsigned>(a.batch));
  if (dtype == DType::kBFloat16)
    ImageToTokenProbsKernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(a);
  else
    ImageToTokenProbsKernel<__half><<<grid, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t LaunchImageToTokenUpdate(const ImageToTokenUpdateArgs& a, DType dtype, int sms, cudaStream_t stream) {
  const ImageToTokenProbsArgs& p = a.probs;
  if (p.batch <= 0 || p.positions <= 0) return cudaSuccess;
  const auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  if (dtype == DType::kFloat32 || p.tokens < 1 || p.tokens > kProbsMaxTokens || p.heads != upd::kHeads ||
      p.q_batch_stride % 8 != 0 || p.q_row_stride % 8 != 0 || !aligned(p.q) || p.batch > 65535 ||
      a.residual_batch_stride % 8 != 0 || !aligned(a.residual) || !aligned(a.u) || !aligned(a.weight) ||
      !aligned(a.bias) || !aligned(a.out) || (p.q_bias && (!aligned(p.q_bias) || p.q_bias_row_stride % 8 != 0)))
    return cudaErrorInvalidValue;
  return dtype == DType::kBFloat16 ? LaunchImageToTokenUpdateT<__nv_bfloat16>(a, sms, stream)
                                   : LaunchImageToTokenUpdateT<__half>(a, sms, stream);
}

}  // namespace maskd::kernels::detail
