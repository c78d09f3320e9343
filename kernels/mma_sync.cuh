// Warp-level tensor-core helpers (PTX mma.sync m16n8k16 with fp32 accumulation, ldmatrix, shared
// addresses, cp.async) shared by the kernels that run their small GEMMs on the tensor cores without
// CUTLASS: rel_pos_attention.cu (flash attention), few_query_attention.cu (the decoder's
// token->image attention) and decoder_fusion.cu (the image->token update, UpscaleHyper).
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16" and "ldmatrix"), with
// g = lane / 4 and t = lane % 4:
//   A (16x16, row-major) a0:(g, 2t..2t+1) a1:(g+8, 2t..) a2:(g, 2t+8..) a3:(g+8, 2t+8..)
//   B (16x8, "col")      b0:(k=2t..2t+1, n=g) b1:(k=2t+8.., n=g)
//   C (16x8, fp32)       c0,c1:(g, 2t..2t+1) c2,c3:(g+8, 2t..2t+1)
//   ldmatrix.x4: lanes 8i..8i+7 give the row addresses of matrix i; each lane receives, for matrix
//   i, register i = elements (row g, cols 2t..2t+1); with .trans, (rows 2t..2t+1, col g).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace maskd::kernels::detail {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte asynchronous global->shared copy; `valid == false` writes 16 zero bytes (src-size 0),
// which is what keeps padded keys/queries finite (0 * garbage could be NaN).
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool valid) {
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_size)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// This lane's row and column in a 16 x 16 tile of 16-bit elements for ldmatrix.x4, by the order of
// the four 8 x 8 matrices it loads:
//   LdmRowsFirst: (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15,
//     cols 8-15): from a row-major [m][k] tile the A fragment a0..a3; with .trans, from a [k][n] tile,
//     the B fragments (b0, b1) of n-tile 0 (cols 0-7) and of n-tile 1 (cols 8-15).
//   LdmColsFirst: (rows 0-7, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 0-7), (rows 8-15,
//     cols 8-15): from an [n][k] tile (B stored by its columns, e.g. keys x channels) the B fragments
//     (b0, b1) of n-tile 0 (rows 0-7) and of n-tile 1 (rows 8-15).
struct LdmOffset {
  int row, col;
};
__device__ __forceinline__ LdmOffset LdmRowsFirst(int lane) { return {lane % 16, 8 * (lane / 16)}; }
__device__ __forceinline__ LdmOffset LdmColsFirst(int lane) { return {lane % 8 + 8 * (lane / 16), 8 * (lane / 8 % 2)}; }

// q[row, col] and q[row, col + 1] (16-bit) as one .b32, the lower column in the low half; zero for
// row >= rows: an A-fragment register read straight from global memory (a few query rows).
template <typename T>
__device__ __forceinline__ uint32_t RowPair(const T* q, int64_t row_stride, int row, int col, int rows) {
  if (row >= rows) return 0u;
  const T x = q[row * row_stride + col], y = q[row * row_stride + col + 1];
  return static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(&x)) |
         (static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(&y)) << 16);
}

// One step of the online softmax (FlashAttention) over a warp's scores for 16 rows x 32 keys,
// s[n-tile][register] in the C layout (rows g and g + 8; keys key0 + 8 nt + 2t, + 1): the scores
// scaled and the keys at or past `end` masked; each row's running max m (over the quad's four lanes)
// and sum d, and its output accumulators o (OT n-tiles of the same rows), rescaled by the change of
// the max; s replaced by the unnormalised probabilities exp(s - m), 0 for the masked keys. key0 must
// be a key of the range (so that the new max is finite); m = -inf, d = 0 and o = 0 before the first.
template <int OT>
__device__ __forceinline__ void OnlineSoftmaxStep(float (&s)[4][4], int64_t key0, int64_t end, int t, float scale,
                                                  float (&m)[2], float (&d)[2], float (&o)[OT][4]) {
  float mx[2] = {-__builtin_huge_valf(), -__builtin_huge_valf()};
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const bool valid = key0 + 8 * nt + 2 * t + (e % 2) < end;
      s[nt][e] = valid ? s[nt][e] * scale : -__builtin_huge_valf();
      mx[e / 2] = fmaxf(mx[e / 2], s[nt][e]);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float m_new = fmaxf(m[r], mx[r]);    // finite: key0 is a key of the range
    const float alpha = __expf(m[r] - m_new);  // 0 on the first step (m = -inf)
    m[r] = m_new;
    d[r] *= alpha;
#pragma unroll
    for (int ct = 0; ct < OT; ++ct) {
      o[ct][2 * r] *= alpha;
      o[ct][2 * r + 1] *= alpha;
    }
  }
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[nt][e] = __expf(s[nt][e] - m[e / 2]);
      d[e / 2] += s[nt][e];
    }
  }
}

template <typename T>
struct Mma;
template <>
struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void Run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  // Two floats into one .b32 of two bf16, `lo` in the low half (the lower column index).
  static __device__ __forceinline__ uint32_t Pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};
template <>
struct Mma<__half> {
  static __device__ __forceinline__ void Run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t Pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};

}  // namespace maskd::kernels::detail
