// AbsorbedAttention (kernels.h, launchers.h): the decoder's token->image attention over a prompt's own
// keys with the key and value projections absorbed into the query and the output (kernels/NOTES.md,
// "Weight absorption"). After the first two-way block every prompt has keys x [4096, 256] of its own;
// the projected path computes k = x Wk^T and v = x Wv^T (a [B x 4096, 256] x [256, 256] GEMM, written
// and read again) only to take products with 8 heads x ~7 token queries of 16 channels. Here the
// scores are qa . x_j with qa = Wk_h^T q (256 wide) plus q . k_bias_j (the positional share and bias
// of the key projection, 16 wide per head), and the kernel returns z = sum_j p_j x_j per (head,
// query); the caller applies Wv_h and the output projection to z (one small GEMM).
//
// One CTA of 4 warps per (prompt, split of the keys): the prompt's 64 query rows (row 8 h + l, the
// rows past the queries zero) as absorbed queries in shared memory, the keys walked 32 at a time
// (x and the k_bias rows staged by cp.async, two stages shared by the warps). Warp w owns rows
// 16 w .. 16 w + 15 (heads 2w, 2w + 1) over all of the split's keys: S = Qa X^T (16 k-steps) + Qb B^T
// (two k-steps of the warp's 32 bias columns, the A fragment block-diagonal: each row sees its own
// head's 16 channels), the online softmax in fp32 (FlashAttention), then O += P X with P rounded to
// the 16-bit type (x is both the keys and the values: one staged tile serves both products).
// Accumulators: O [16 rows, 256] fp32 = 128 registers a lane.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/float_convert.cuh"
#include "kernels/launchers.h"
#include "kernels/mma_sync.cuh"

namespace maskd::kernels::detail {
namespace {

namespace absd {
constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kD = kAbsorbedDim;                  // channels of x and of an absorbed query
constexpr int kC = kAbsorbedHeadDim;              // channels of a head's query (the bias product)
constexpr int kRows = kAbsorbedHeads * kAbsorbedMaxQueries;  // 64: row 8 h + l
constexpr int kKeys = 32;                         // keys per step
constexpr int kBiasCols = kAbsorbedHeads * kC;    // 128
// Row pitches padded by 16 bytes: 528- and 272-byte rows put an ldmatrix's 8 rows on distinct banks.
constexpr int kXPitch = kD + 8;
constexpr int kBPitch = kBiasCols + 8;
constexpr int kStageElems = kKeys * kXPitch + kKeys * kBPitch;
constexpr int kStages = 2;
constexpr int kSmemElems = kRows * kXPitch + kStages * kStageElems;
constexpr float kNegInf = -__builtin_huge_valf();
static_assert(kRows == kWarps * 16, "a warp per 16 query rows");
}  // namespace absd

template <typename T>
constexpr int AbsorbedSmemBytes() {
  return absd::kSmemElems * static_cast<int>(sizeof(T));
}

template <typename T>
__global__ void __launch_bounds__(absd::kThreads, 2) AbsorbedAttentionKernel(const AbsorbedAttentionArgs a) {
  using namespace absd;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* const qa_s = reinterpret_cast<T*>(smem_raw);
  T* const stages = qa_s + kRows * kXPitch;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;
  const int64_t n = blockIdx.y;
  const int split = blockIdx.x, L = a.queries;
  const T* qab = static_cast<const T*>(a.qa) + n * a.qa_stride[0];
  const T* xb = static_cast<const T*>(a.x) + n * a.x_stride[0];
  const T* kbias = static_cast<const T*>(a.k_bias);
  const int64_t begin = static_cast<int64_t>(split) * a.keys_per_split;
  const int64_t end = min(static_cast<int64_t>(a.keys), begin + a.keys_per_split);

  // The absorbed queries, row 8 h + l; rows l >= L zero-filled (their scores are 0: finite, unused).
  for (int i = tid; i < kRows * (kD / 8); i += kThreads) {
    const int r = i / (kD / 8), p = i % (kD / 8), h = r / kAbsorbedMaxQueries, l = r % kAbsorbedMaxQueries;
    const bool valid = l < L;
    CpAsync16(SmemAddr(qa_s + r * kXPitch + 8 * p),
              qab + (valid ? h * a.qa_stride[1] + l * a.qa_stride[2] : 0) + 8 * p, valid);
  }
  // Stage 32 keys from key0 (every thread): x rows (32 16-byte pieces each) and the bias rows (16).
  auto stage_keys = [&](int64_t key0, int stage) {
    T* xs = stages + stage * kStageElems;
    T* bs = xs + kKeys * kXPitch;
#pragma unroll
    for (int i = tid; i < kKeys * (kD / 8); i += kThreads) {
      const int r = i / (kD / 8), p = i % (kD / 8);
      const int64_t j = key0 + r;
      const bool valid = j < end;
      CpAsync16(SmemAddr(xs + r * kXPitch + 8 * p), xb + (valid ? j : 0) * a.x_stride[1] + 8 * p, valid);
    }
    if (kbias) {
#pragma unroll
      for (int i = tid; i < kKeys * (kBiasCols / 8); i += kThreads) {
        const int r = i / (kBiasCols / 8), p = i % (kBiasCols / 8);
        const int64_t j = key0 + r;
        const bool valid = j < end;
        CpAsync16(SmemAddr(bs + r * kBPitch + 8 * p), kbias + (valid ? j : 0) * a.k_bias_row_stride + 8 * p, valid);
      }
    }
    CpAsyncCommit();
  };

  // The bias product's A fragments (registers for the whole walk): rows g (head 2w, query g) and
  // g + 8 (head 2w + 1, query g) against the warp's bias columns 32 w .. 32 w + 31, k-step 0 = head
  // 2w's 16 channels, k-step 1 = head 2w + 1's; each row is zero in the other head's k-step.
  uint32_t qbias[2][4] = {};
  if (kbias) {
    const T* q0 = static_cast<const T*>(a.q) + n * a.q_stride[0] + (2 * warp) * a.q_stride[1];
    const T* q1 = q0 + a.q_stride[1];
    qbias[0][0] = RowPair(q0, a.q_stride[2], g, 2 * t, L);
    qbias[0][2] = RowPair(q0, a.q_stride[2], g, 2 * t + 8, L);
    qbias[1][1] = RowPair(q1, a.q_stride[2], g, 2 * t, L);
    qbias[1][3] = RowPair(q1, a.q_stride[2], g, 2 * t + 8, L);
  }

  float m[2] = {kNegInf, kNegInf}, d[2] = {0.f, 0.f};
  float o[kD / 8][4];
#pragma unroll
  for (int ct = 0; ct < kD / 8; ++ct) o[ct][0] = o[ct][1] = o[ct][2] = o[ct][3] = 0.f;
  // ldmatrix row/column of this lane (mma_sync.cuh): A (the warp's 16 query rows; matrices rows
  // 0-7 | 8-15 of k 0-7, then of k 8-15), B non-trans (keys 0-7: k 0-7 | 8-15, then keys 8-15),
  // B trans (P X: keys 0-7 | 8-15 of channels 0-7, then of channels 8-15).
  const LdmOffset rows_first = LdmRowsFirst(lane), cols_first = LdmColsFirst(lane);
  const uint32_t qa_addr = SmemAddr(qa_s + (16 * warp + rows_first.row) * kXPitch + rows_first.col);

  int stage = 0;
  stage_keys(begin, 0);  // one group with the queries' copies
  for (int64_t key0 = begin; key0 < end; key0 += kKeys) {
    if (key0 + kKeys < end) {
      stage_keys(key0 + kKeys, stage ^ 1);
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();  // this step's tile (and, on the first, the queries) visible to every warp
    const T* xs = stages + stage * kStageElems;
    const T* bs = xs + kKeys * kXPitch;
    float s[4][4] = {};  // n-tile nt: keys 8 nt + 2t, + 1 of rows g (0, 1) and g + 8 (2, 3)
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks) {
      uint32_t af[4];
      LdMatrixX4(af, qa_addr + 16 * ks * static_cast<uint32_t>(sizeof(T)));
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        uint32_t f[4];
        LdMatrixX4(f, SmemAddr(xs + (16 * half + cols_first.row) * kXPitch + 16 * ks + cols_first.col));
        Mma<T>::Run(s[2 * half], af, f[0], f[1]);
        Mma<T>::Run(s[2 * half + 1], af, f[2], f[3]);
      }
    }
    if (kbias) {
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          uint32_t f[4];
          LdMatrixX4(f, SmemAddr(bs + (16 * half + cols_first.row) * kBPitch + 32 * warp + 16 * kk + cols_first.col));
          Mma<T>::Run(s[2 * half], qbias[kk], f[0], f[1]);
          Mma<T>::Run(s[2 * half + 1], qbias[kk], f[2], f[3]);
        }
      }
    }
    OnlineSoftmaxStep(s, key0, end, t, a.scale, m, d, o);
    // O += P X over two k-steps of 16 keys; the C fragment of S for keys 16 ks .. 16 ks + 15 is the
    // A fragment of P for that k-step.
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      uint32_t pa[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float* pv = &s[2 * ks + i / 2][2 * (i % 2)];
        pa[i] = Mma<T>::Pack(pv[0], pv[1]);
      }
#pragma unroll
      for (int ct = 0; ct < kD / 16; ++ct) {
        uint32_t f[4];
        LdMatrixX4Trans(f, SmemAddr(xs + (16 * ks + rows_first.row) * kXPitch + 16 * ct + rows_first.col));
        Mma<T>::Run(o[2 * ct], pa, f[0], f[1]);
        Mma<T>::Run(o[2 * ct + 1], pa, f[2], f[3]);
      }
    }
    __syncthreads();  // every warp done with the stage before the next step's copies overwrite it
    stage ^= 1;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    d[r] += __shfl_xor_sync(0xffffffffu, d[r], 1);
    d[r] += __shfl_xor_sync(0xffffffffu, d[r], 2);
  }
  if (g >= L) return;  // padding rows
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = 2 * warp + r, row = kAbsorbedMaxQueries * h + g;
    if (a.splits == 1) {
      const float inv = 1.f / d[r];
      T* out = static_cast<T*>(a.out) + ((n * L + g) * kAbsorbedHeads + h) * kD + 2 * t;
#pragma unroll
      for (int ct = 0; ct < kD / 8; ++ct)
        *reinterpret_cast<uint32_t*>(out + 8 * ct) = Mma<T>::Pack(o[ct][2 * r] * inv, o[ct][2 * r + 1] * inv);
    } else {
      const int64_t slot = (n * a.splits + split) * kRows + row;
      float* part = a.partial + slot * kD + 2 * t;
#pragma unroll
      for (int ct = 0; ct < kD / 8; ++ct)
        *reinterpret_cast<float2*>(part + 8 * ct) = make_float2(o[ct][2 * r], o[ct][2 * r + 1]);
      if (t == 0) *reinterpret_cast<float2*>(a.partial_md + 2 * slot) = make_float2(m[r], d[r]);
    }
  }
}

// One block per (row 8 h + l, batch), one thread per channel: the splits' partials merged with their
// maxima (z = sum_p e^(m_p - M) acc_p / sum_p e^(m_p - M) d_p).
template <typename T>
__global__ void __launch_bounds__(kAbsorbedDim) AbsorbedCombineKernel(const AbsorbedAttentionArgs a) {
  const int row = blockIdx.x, h = row / kAbsorbedMaxQueries, l = row % kAbsorbedMaxQueries, c = threadIdx.x;
  const int64_t n = blockIdx.y;
  if (l >= a.queries) return;
  const int64_t slot0 = n * a.splits * absd::kRows + row;
  float mm = -__builtin_huge_valf();
  for (int p = 0; p < a.splits; ++p) mm = fmaxf(mm, a.partial_md[2 * (slot0 + p * absd::kRows)]);
  float num = 0.f, den = 0.f;
  for (int p = 0; p < a.splits; ++p) {
    const int64_t slot = slot0 + p * absd::kRows;
    const float w = __expf(a.partial_md[2 * slot] - mm);
    num = fmaf(w, a.partial[slot * kAbsorbedDim + c], num);
    den = fmaf(w, a.partial_md[2 * slot + 1], den);
  }
  static_cast<T*>(a.out)[((n * a.queries + l) * kAbsorbedHeads + h) * kAbsorbedDim + c] = FromFloat<T>(num / den);
}

template <typename T>
cudaError_t LaunchAbsorbedT(const AbsorbedAttentionArgs& a, cudaStream_t stream) {
  constexpr int bytes = AbsorbedSmemBytes<T>();  // 85 KB: two blocks an SM
  // Set at each launch, as ImageToTokenUpdate's: per device, and legal in a capture.
  const cudaError_t attr =
      cudaFuncSetAttribute(AbsorbedAttentionKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (attr != cudaSuccess) return attr;
  const dim3 grid(static_cast<unsigned>(a.splits), static_cast<unsigned>(a.batch));
  AbsorbedAttentionKernel<T><<<grid, absd::kThreads, bytes, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

int AbsorbedAttentionKeyStep() { return absd::kKeys; }

cudaError_t LaunchAbsorbedAttention(const AbsorbedAttentionArgs& a, DType dtype, cudaStream_t stream) {
  if (a.batch <= 0) return cudaSuccess;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (dtype == DType::kFloat32 || a.queries < 1 || a.queries > kAbsorbedMaxQueries || a.keys < 1 ||
      a.splits < 1 || a.batch > 65535 || a.splits > 65535 || a.keys_per_split < absd::kKeys ||
      a.keys_per_split % absd::kKeys != 0 || static_cast<int64_t>(a.splits - 1) * a.keys_per_split >= a.keys ||
      static_cast<int64_t>(a.splits) * a.keys_per_split < a.keys || (a.splits > 1 && (!a.partial || !a.partial_md)) ||
      !aligned(a.qa) || !aligned(a.x) || a.qa_stride[0] % 8 || a.qa_stride[1] % 8 || a.qa_stride[2] % 8 ||
      a.x_stride[0] % 8 || a.x_stride[1] % 8 || (a.k_bias && (!aligned(a.k_bias) || a.k_bias_row_stride % 8 != 0)))
    return cudaErrorInvalidValue;
  return dtype == DType::kBFloat16 ? LaunchAbsorbedT<__nv_bfloat16>(a, stream) : LaunchAbsorbedT<__half>(a, stream);
}

cudaError_t LaunchAbsorbedCombine(const AbsorbedAttentionArgs& a, DType dtype, cudaStream_t stream) {
  if (a.batch <= 0) return cudaSuccess;
  if (dtype == DType::kFloat32 || !a.partial || !a.partial_md || a.queries < 1 || a.queries > kAbsorbedMaxQueries)
    return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(absd::kRows), static_cast<unsigned>(a.batch));
  if (dtype == DType::kBFloat16)
    AbsorbedCombineKernel<__nv_bfloat16><<<grid, kAbsorbedDim, 0, stream>>>(a);
  else
    AbsorbedCombineKernel<__half><<<grid, kAbsorbedDim, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace maskd::kernels::detail
