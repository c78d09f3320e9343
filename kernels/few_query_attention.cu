// FewQueryAttention (kernels.h): softmax(scale q k^T) v for a handful of queries per (batch, head)
// against many keys, the shape of the SAM decoder's token->image attention (7 tokens of a click
// against 4096 image positions, 16 channels per head) and of its token self-attention (7 x 7, 32
// channels). A flash kernel tiles 64+ queries per block and walks the keys in one block per
// (batch, head, query tile): 8 blocks for a click, each over all 4096 keys. Here a block takes one
// (batch, head) and a range of keys (split-K over the keys, as in flash-decoding), so a click fills
// the GPU; the key range is walked in chunks of 128 keys:
//   - each thread takes one key of the chunk: its scores against every query (queries in shared
//     memory, pre-scaled) into a [queries, 128] fp32 tile, its value row into shared memory;
//   - one warp per query row: the chunk's max, the running max, exp, the running sum (online
//     softmax in fp32, as in FlashAttention);
//   - each thread accumulates fixed (query, channel) outputs over the chunk, rescaled by the change
//     of its row's running max.
// For 16 channels a head (the token->image attentions, the decoder's heavy ones) FewQueryMmaKernel
// does the same on the tensor cores: the queries padded to one m16 tile of mma.m16n8k16, each of the
// block's 4 warps an online softmax of its own over 32 keys a step (K, the key bias and V staged
// by cp.async, two stages; S = Q K^T + Q B^T in fp32 accumulators, P V with P split into two 16-bit
// halves, hi + lo, so that P keeps ~16 bits as in the fp32 path), merged across the warps at the end.
// The CUDA-core kernel spent its time on shared-memory loads (two a multiply-add; run 29: 0.31 ms for
// the two calls of 64 prompts on an H100, ~3x the traffic floor of reading k and v).
// With one split the block writes the normalised output; with several it writes fp32 partials
// (accumulator, max, sum) and FewQueryCombineKernel merges them. Output [N, L, H, C], the layout the
// output projection reads. Optional biases (the decoder's positional share of the key projection and
// the value projection's bias, so that the projections need no separate add): a [S, H * C] table added
// to the keys as they are loaded, and a [H * C] vector added to the output.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/float_convert.cuh"
#include "kernels/launchers.h"
#include "kernels/mma_sync.cuh"

namespace maskd::kernels::detail {
namespace {

constexpr int kFqThreads = 128;
constexpr int kFqChunk = kFqThreads;  // keys per chunk: one per thread

// The value bias of head h, channel c (0 without one): added to the normalised output.
template <typename T>
__device__ __forceinline__ float ValueBias(const FewQueryAttentionArgs& a, int h, int c) {
  return a.v_bias ? ToFloat(static_cast<const T*>(a.v_bias)[h * a.head_dim + c]) : 0.f;
}

template <typename T, int C>
__global__ void __launch_bounds__(kFqThreads) FewQueryAttentionKernel(const FewQueryAttentionArgs a) {
  constexpr int kRowGroups = kFqThreads / C;                      // query rows per pass of the threads
  constexpr int kRowsPerThread = kFewQueryMaxQueries / kRowGroups;  // accumulators per thread
  __shared__ float qs[kFewQueryMaxQueries][C];
  __shared__ float sc[kFewQueryMaxQueries][kFqChunk];
  __shared__ __align__(16) T vs[kFqChunk * C];
  __shared__ float row_m[kFewQueryMaxQueries], row_d[kFewQueryMaxQueries], row_alpha[kFewQueryMaxQueries];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t n = blockIdx.z;
  const int h = blockIdx.y, split = blockIdx.x;
  const int L = a.queries;
  const T* qb = static_cast<const T*>(a.q) + n * a.q_stride[0] + h * a.q_stride[1];
  const int64_t nkv = a.kv_rows ? a.kv_rows[n] : n;
  const T* kb = static_cast<const T*>(a.k) + nkv * a.k_stride[0] + h * a.k_stride[1];
  const T* vb = static_cast<const T*>(a.v) + nkv * a.v_stride[0] + h * a.v_stride[1];
  const T* k_bias = a.k_bias ? static_cast<const T*>(a.k_bias) + h * C : nullptr;
  for (int i = tid; i < L * C; i += kFqThreads) qs[i / C][i % C] = ToFloat(qb[(i / C) * a.q_stride[2] + i % C]) * a.scale;
  if (tid < kFewQueryMaxQueries) {
    row_m[tid] = -__builtin_huge_valf();
    row_d[tid] = 0.f;
  }
  const int c = tid % C;
  float acc[kRowsPerThread];
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) acc[r] = 0.f;
  const int64_t begin = static_cast<int64_t>(split) * a.chunks_per_split * kFqChunk;
  const int64_t end = min(static_cast<int64_t>(a.keys), begin + static_cast<int64_t>(a.chunks_per_split) * kFqChunk);
  for (int64_t chunk = begin; chunk < end; chunk += kFqChunk) {
    __syncthreads();  // qs / row state ready; the previous chunk's sc and vs consumed
    const int64_t j = chunk + tid;
    if (j < end) {
      float kr[C];
      const uint4* kp = reinterpret_cast<const uint4*>(kb + j * a.k_stride[2]);
      const uint4* bp = k_bias ? reinterpret_cast<const uint4*>(k_bias + j * a.k_bias_row_stride) : nullptr;
#pragma unroll
      for (int u = 0; u < C / 8; ++u) {
        const uint4 raw = kp[u];
        const uint4 braw = bp ? bp[u] : make_uint4(0, 0, 0, 0);  // 16-bit zeros without a bias
        const T* e = reinterpret_cast<const T*>(&raw);
        const T* be = reinterpret_cast<const T*>(&braw);
#pragma unroll
        for (int i = 0; i < 8; ++i) kr[u * 8 + i] = ToFloat(e[i]) + ToFloat(be[i]);
      }
#pragma unroll
      for (int l = 0; l < kFewQueryMaxQueries; ++l) {
        if (l < L) {
          float s = 0.f;
#pragma unroll
          for (int i = 0; i < C; ++i) s = fmaf(qs[l][i], kr[i], s);
          sc[l][tid] = s;
        }
      }
      const uint4* vp = reinterpret_cast<const uint4*>(vb + j * a.v_stride[2]);
#pragma unroll
      for (int u = 0; u < C / 8; ++u) reinterpret_cast<uint4*>(vs + tid * C)[u] = vp[u];
    } else {
      for (int l = 0; l < L; ++l) sc[l][tid] = -__builtin_huge_valf();
#pragma unroll
      for (int u = 0; u < C / 8; ++u) reinterpret_cast<uint4*>(vs + tid * C)[u] = make_uint4(0, 0, 0, 0);
    }
    __syncthreads();
    for (int l = warp; l < L; l += kFqThreads / 32) {
      float v[kFqChunk / 32];
      float m = -__builtin_huge_valf();
#pragma unroll
      for (int i = 0; i < kFqChunk / 32; ++i) {
        v[i] = sc[l][lane + 32 * i];
        m = fmaxf(m, v[i]);
      }
#pragma unroll
      for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
      const float m_old = row_m[l];
      const float m_new = fmaxf(m_old, m);  // finite: every chunk has at least one key
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < kFqChunk / 32; ++i) {
        const float p = __expf(v[i] - m_new);  // exp(-inf) = 0 for the keys past the end
        sc[l][lane + 32 * i] = p;
        sum += p;
      }
#pragma unroll
      for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      __syncwarp();
      if (lane == 0) {
        const float alpha = __expf(m_old - m_new);  // 0 on the first chunk (m_old = -inf)
        row_alpha[l] = alpha;
        row_d[l] = row_d[l] * alpha + sum;
        row_m[l] = m_new;
      }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const int l = tid / C + r * kRowGroups;
      if (l < L) {
        float x = acc[r] * row_alpha[l];
        const float* p = sc[l];
#pragma unroll 8
        for (int jj = 0; jj < kFqChunk; ++jj) x = fmaf(p[jj], ToFloat(vs[jj * C + c]), x);
        acc[r] = x;
      }
    }
  }
  // row_m / row_d were last written before the sync that precedes the final accumulation.
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const int l = tid / C + r * kRowGroups;
    if (l >= L) continue;
    if (a.splits == 1) {
      static_cast<T*>(a.out)[((n * L + l) * a.heads + h) * C + c] =
          FromFloat<T>(acc[r] / row_d[l] + ValueBias<T>(a, h, c));
    } else {
      float* part = a.partial + (((n * a.heads + h) * a.splits + split) * L + l) * (C + 2);
      part[c] = acc[r];
      if (c == 0) {
        part[C] = row_m[l];
        part[C + 1] = row_d[l];
      }
    }
  }
}

namespace fqm {
constexpr int kC = 16;                    // channels a head
constexpr int kWarps = kFqThreads / 32;   // a chunk of 128 keys: 32 per warp
constexpr int kKeys = kFqChunk / kWarps;  // keys per warp and step
constexpr int kPitch = kC + 8;            // 48-byte rows: an ldmatrix's 8 rows fall on distinct banks
constexpr int kTile = kKeys * kPitch;     // one staged [32 keys, 16] tile (elements)
constexpr int kStages = 2;
constexpr float kNegInf = -__builtin_huge_valf();

}  // namespace fqm

// One block per (split, head, batch) as FewQueryAttentionKernel, 4 warps. Warp w takes keys
// [chunk + 32 w, chunk + 32 w + 32) of each chunk of its split's range: its own running max m, sum
// d and output accumulators O (16 x 16, fp32) for the 16 (padded) query rows, as a flash-decoding
// split of its own; the block merges the 4 at the end (out = sum_w e^(m_w - M) O_w / sum_w e^(m_w
// - M) d_w) and writes the output or the split's partial, in FewQueryAttentionKernel's format.
// Fragments (mma_sync.cuh): lane (g, t) holds S and O for query rows g and g + 8. Scores are in the
// same units as FewQueryAttentionKernel's (scale q.k), so FewQueryCombineKernel merges either.
template <typename T>
__global__ void __launch_bounds__(kFqThreads) FewQueryMmaKernel(const FewQueryAttentionArgs a) {
  using fqm::kC;
  using fqm::kKeys;
  using fqm::kPitch;
  using fqm::kTile;
  __shared__ __align__(16) T tiles[fqm::kWarps][fqm::kStages][3][kTile];  // K, key bias, V: 36 KB
  __shared__ float warp_m[fqm::kWarps][16], warp_d[fqm::kWarps][16];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;
  const int64_t n = blockIdx.z;
  const int h = blockIdx.y, split = blockIdx.x, L = a.queries;
  const T* qb = static_cast<const T*>(a.q) + n * a.q_stride[0] + h * a.q_stride[1];
  const int64_t nkv = a.kv_rows ? a.kv_rows[n] : n;
  const T* kb = static_cast<const T*>(a.k) + nkv * a.k_stride[0] + h * a.k_stride[1];
  const T* vb = static_cast<const T*>(a.v) + nkv * a.v_stride[0] + h * a.v_stride[1];
  const T* bb = a.k_bias ? static_cast<const T*>(a.k_bias) + h * kC : nullptr;
  // Q as the A fragment (rows g, g + 8; channels 2t.., 2t + 8..), unscaled: the scale is applied to
  // the fp32 scores.
  const uint32_t qa[4] = {RowPair(qb, a.q_stride[2], g, 2 * t, L), RowPair(qb, a.q_stride[2], g + 8, 2 * t, L),
                          RowPair(qb, a.q_stride[2], g, 2 * t + 8, L),
                          RowPair(qb, a.q_stride[2], g + 8, 2 * t + 8, L)};
  const int64_t begin = static_cast<int64_t>(split) * a.chunks_per_split * kFqChunk;
  const int64_t end = min(static_cast<int64_t>(a.keys), begin + static_cast<int64_t>(a.chunks_per_split) * kFqChunk);
  // Stage the warp's 32 keys from key0: lane = key, two 16-byte pieces of each row; keys past the end
  // are zero-filled (their scores are then masked).
  auto stage_keys = [&](int64_t key0, int stage) {
    const int64_t j = key0 + lane;
    const bool valid = j < end;
    const int64_t jj = valid ? j : 0;
    T* dst = tiles[warp][stage][0] + lane * kPitch;
#pragma unroll
    for (int u = 0; u < kC / 8; ++u) {
      CpAsync16(SmemAddr(dst + 8 * u), kb + jj * a.k_stride[2] + 8 * u, valid);
      if (bb) CpAsync16(SmemAddr(dst + kTile + 8 * u), bb + jj * a.k_bias_row_stride + 8 * u, valid);
      CpAsync16(SmemAddr(dst + 2 * kTile + 8 * u), vb + jj * a.v_stride[2] + 8 * u, valid);
    }
    CpAsyncCommit();
  };
  float m[2] = {fqm::kNegInf, fqm::kNegInf}, d[2] = {0.f, 0.f};
  float o[2][4] = {};
  // ldmatrix addresses of this lane: non-trans (K, bias): matrices (keys 0-7 | 8-15) x (channels
  // 0-7 | 8-15) in the order b0, b1 of keys 0-7, then of keys 8-15; trans (V): keys 0-7 | 8-15 of
  // channels 0-7, then of channels 8-15.
  const LdmOffset k_lane = LdmColsFirst(lane), v_lane = LdmRowsFirst(lane);
  int stage = 0;
  const int64_t first = begin + warp * kKeys;
  if (first < end) stage_keys(first, 0);
  for (int64_t key0 = first; key0 < end; key0 += kFqChunk) {
    if (key0 + kFqChunk < end) {
      stage_keys(key0 + kFqChunk, stage ^ 1);
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncwarp();
    const T* kt = tiles[warp][stage][0];
    float s[4][4] = {};  // n-tile nt: keys 8 nt + 2t, + 1 of rows g (0, 1) and g + 8 (2, 3)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint32_t f[4];
      LdMatrixX4(f, SmemAddr(kt + (16 * half + k_lane.row) * kPitch + k_lane.col));
      Mma<T>::Run(s[2 * half], qa, f[0], f[1]);
      Mma<T>::Run(s[2 * half + 1], qa, f[2], f[3]);
      if (bb) {  // Q (K + B)^T = Q K^T + Q B^T, both in the fp32 accumulators
        LdMatrixX4(f, SmemAddr(kt + kTile + (16 * half + k_lane.row) * kPitch + k_lane.col));
        Mma<T>::Run(s[2 * half], qa, f[0], f[1]);
        Mma<T>::Run(s[2 * half + 1], qa, f[2], f[3]);
      }
    }
    OnlineSoftmaxStep(s, key0, end, t, a.scale, m, d, o);
    // O += P V over two k-steps of 16 keys; P (fp32) as hi + lo 16-bit halves. The C fragment of S
    // for keys 16 ks.. 16 ks + 15 is the A fragment of P for that k-step.
    const T* vt = kt + 2 * kTile;
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      uint32_t hi[4], lo[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float* pv = &s[2 * ks + i / 2][2 * (i % 2)];
        const float h0 = ToFloat(FromFloat<T>(pv[0])), h1 = ToFloat(FromFloat<T>(pv[1]));
        hi[i] = Mma<T>::Pack(h0, h1);
        lo[i] = Mma<T>::Pack(pv[0] - h0, pv[1] - h1);
      }
      uint32_t f[4];
      LdMatrixX4Trans(f, SmemAddr(vt + (16 * ks + v_lane.row) * kPitch + v_lane.col));
      Mma<T>::Run(o[0], hi, f[0], f[1]);
      Mma<T>::Run(o[0], lo, f[0], f[1]);
      Mma<T>::Run(o[1], hi, f[2], f[3]);
      Mma<T>::Run(o[1], lo, f[2], f[3]);
    }
    __syncwarp();  // the stage is read before the next step's copies overwrite it
    stage ^= 1;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    d[r] += __shfl_xor_sync(0xffffffffu, d[r], 1);
    d[r] += __shfl_xor_sync(0xffffffffu, d[r], 2);
  }
  __syncthreads();  // every warp done with its tiles: they hold the warps' O from here
  float* ow = reinterpret_cast<float*>(&tiles[0][0][0][0]);  // [warps][16 rows][16 channels]
  if (t == 0) {
    warp_m[warp][g] = m[0];
    warp_m[warp][g + 8] = m[1];
    warp_d[warp][g] = d[0];
    warp_d[warp][g + 8] = d[1];
  }
#pragma unroll
  for (int ct = 0; ct < 2; ++ct) {
#pragma unroll
    for (int e = 0; e < 4; ++e) ow[(warp * 16 + g + 8 * (e / 2)) * kC + 8 * ct + 2 * t + (e % 2)] = o[ct][e];
  }
  __syncthreads();
  for (int i = tid; i < L * kC; i += kFqThreads) {
    const int l = i / kC, c = i % kC;
    float mm = fqm::kNegInf;
#pragma unroll
    for (int w = 0; w < fqm::kWarps; ++w) mm = fmaxf(mm, warp_m[w][l]);  // finite: warp 0 has keys
    float num = 0.f, den = 0.f;
#pragma unroll
    for (int w = 0; w < fqm::kWarps; ++w) {
      const float wgt = __expf(warp_m[w][l] - mm);  // 0 for a warp without keys
      num = fmaf(wgt, ow[(w * 16 + l) * kC + c], num);
      den = fmaf(wgt, warp_d[w][l], den);
    }
    if (a.splits == 1) {
      static_cast<T*>(a.out)[((n * L + l) * a.heads + h) * kC + c] = FromFloat<T>(num / den + ValueBias<T>(a, h, c));
    } else {
      float* part = a.partial + (((n * a.heads + h) * a.splits + split) * L + l) * (kC + 2);
      part[c] = num;
      if (c == 0) {
        part[kC] = mm;
        part[kC + 1] = den;
      }
    }
  }
}

// One block per (batch, head), one thread per (query, channel): the splits' partials merged with
// their maxima (out = sum_p e^(m_p - M) acc_p / sum_p e^(m_p - M) d_p).
template <typename T>
__global__ void FewQueryCombineKernel(const FewQueryAttentionArgs a) {
  const int64_t n = blockIdx.y;
  const int h = blockIdx.x, C = a.head_dim, L = a.queries;
  const int l = threadIdx.x / C, c = threadIdx.x % C;
  if (l >= L) return;
  const float* base = a.partial + ((n * a.heads + h) * a.splits * L + l) * (C + 2);
  const int64_t step = static_cast<int64_t>(L) * (C + 2);
  float m = -__builtin_huge_valf();
  for (int p = 0; p < a.splits; ++p) m = fmaxf(m, base[p * step + C]);
  float num = 0.f, den = 0.f;
  for (int p = 0; p < a.splits; ++p) {
    const float w = __expf(base[p * step + C] - m);
    num = fmaf(w, base[p * step + c], num);
    den = fmaf(w, base[p * step + C + 1], den);
  }
  static_cast<T*>(a.out)[((n * L + l) * a.heads + h) * C + c] = FromFloat<T>(num / den + ValueBias<T>(a, h, c));
}

template <typename T>
cudaError_t LaunchFewQueryT(const FewQueryAttentionArgs& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.splits), static_cast<unsigned>(a.heads), static_cast<unsigned>(a.batch));
  if (a.head_dim == 16)
    FewQueryMmaKernel<T><<<grid, kFqThreads, 0, stream>>>(a);
  else
    FewQueryAttentionKernel<T, 32><<<grid, kFqThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

bool FewQueryAttentionSupported(int queries, int head_dim, DType dtype) {
  return dtype != DType::kFloat32 && queries >= 1 && queries <= kFewQueryMaxQueries &&
         (head_dim == 16 || head_dim == 32);
}

int FewQueryChunkKeys() { return kFqChunk; }

cudaError_t LaunchFewQueryAttention(const FewQueryAttentionArgs& a, DType dtype, cudaStream_t stream) {
  if (a.batch <= 0 || a.heads <= 0) return cudaSuccess;
  if (!FewQueryAttentionSupported(a.queries, a.head_dim, dtype) || a.keys < 1 || a.splits < 1 ||
      a.chunks_per_split < 1 || a.batch > 65535 || a.heads > 65535 || (a.splits > 1 && a.partial == nullptr) ||
      static_cast<int64_t>(a.splits - 1) * a.chunks_per_split * kFqChunk >= a.keys ||
      (a.k_bias && (reinterpret_cast<uintptr_t>(a.k_bias) % 16 != 0 || a.k_bias_row_stride % 8 != 0)))
    return cudaErrorInvalidValue;
  return dtype == DType::kBFloat16 ? LaunchFewQueryT<__nv_bfloat16>(a, stream) : LaunchFewQueryT<__half>(a, stream);
}

cudaError_t LaunchFewQueryCombine(const FewQueryAttentionArgs& a, DType dtype, cudaStream_t stream) {
  if (a.batch <= 0 || a.heads <= 0) return cudaSuccess;
  if (!FewQueryAttentionSupported(a.queries, a.head_dim, dtype) || a.partial == nullptr) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(a.heads), static_cast<unsigned>(a.batch));
  const unsigned threads = static_cast<unsigned>(a.queries * a.head_dim);
  if (dtype == DType::kBFloat16)
    FewQueryCombineKernel<__nv_bfloat16><<<grid, threads, 0, stream>>>(a);
  else
    FewQueryCombineKernel<__half><<<grid, threads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace maskd::kernels::detail
