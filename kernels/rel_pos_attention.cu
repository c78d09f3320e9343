// Flash attention (FA2 structure) with SAM's decomposed relative-position bias added in the kernel.
//
// One CTA per (query tile of kWarps * 16 rows, head, batch); each warp owns 16 query rows and walks
// all keys in tiles of 64 (K and V double-buffered through cp.async). Per tile: S = Q K^T on the
// tensor cores (mma.m16n8k16, fp32 accumulate), S * scale + bias in the log2 domain, online softmax in
// registers, O += P V (P rounded to the input type), and at the end O / l to [B, N, H, D].
//
// Fragment layouts: kernels/mma_sync.cuh (with the PTX wrappers).
// K stored [key][d] is B = K^T "col-major" directly (non-trans ldmatrix); V stored [key][d] needs
// .trans to become B = V (k = key, n = d); the C fragment of S for keys 16c..16c+15 is exactly the A
// fragment of P for that k-step, so P never leaves registers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>

#include "kernels/launchers.h"
#include "kernels/mma_sync.cuh"

namespace maskd::kernels::detail {
namespace {

constexpr int kKeysPerTile = 64;
constexpr int kWindowModeSize = kRelPosWindowModeSize;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -__builtin_huge_valf();

// ---- PTX wrappers ---------------------------------------------------------------------------------

__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <typename T>
__device__ __forceinline__ float LoadAsFloat(const void* base, int64_t index, bool is_float32) {
  if (is_float32) return __ldg(static_cast<const float*>(base) + index);
  const T v = static_cast<const T*>(base)[index];
  return static_cast<float>(v);
}

// ---- configuration --------------------------------------------------------------------------------

template <int D>
struct HeadDim {
  static_assert(D % 16 == 0, "head dim must be a multiple of 16");
  static constexpr int kStride = D + 8;  // smem row pitch (elements): +16 B makes ldmatrix rows
                                         // of one 8x8 matrix fall in distinct banks
  static constexpr int kChunks = D / 8;  // 16-byte chunks per row
  static constexpr int kKSteps = D / 16;
  static constexpr int kOBlocks = D / 8;  // n8 blocks of the output
};

// Bias rows in shared memory: [rel_w (grid_w) | rel_h (grid_h)], pitch = 8 (mod 32) floats so the
// float2 reads of the aligned path (4 rows x 8 floats per half-warp) are conflict-free; rel_w first
// keeps those float2 reads 8-byte aligned whatever grid_h is.
__host__ __device__ inline int BiasPitch(int grid_h, int grid_w) {
  return ((grid_h + grid_w + 23) / 32) * 32 + 8;
}

template <int D>
__host__ __device__ constexpr int KvSmemBytes() {
  return 4 * kKeysPerTile * HeadDim<D>::kStride * 2;  // {K, V} x 2 stages, 16-bit elements
}
template <int D>
inline int SmemBytes(int warps, int grid_h, int grid_w) {
  return KvSmemBytes<D>() +
         warps * 16 * BiasPitch(grid_h, grid_w) * static_cast<int>(sizeof(float));
}

// Window mode's per-key tables, after the bias rows: the raster token of each of the window's seq
// keys (-1: SAM's padding), then for each key position of the key tiles (seq rounded up to a whole
// tile) the bias-row columns of its grid row and column, packed as (gw + row) | column << 16. Made
// once per CTA, they replace the per-tile divisions by the window (load_kv) and by grid_w (bias).
__host__ __device__ constexpr int WindowTokTableInts(int seq) { return (seq + 3) / 4 * 4; }
__host__ __device__ constexpr int WindowTableBytes(int seq) {
  return (WindowTokTableInts(seq) + (seq + kKeysPerTile - 1) / kKeysPerTile * kKeysPerTile) * 4;
}

// ---- rel-pos bias rows from the reversed tables ---------------------------------------------------
//
// With rev = [rev_h; rev_w] (kernels::ReversedRelPosTables: rev_h[(grid_h - 1 - r) + k] = R_h[r, k]),
// a query at grid (qr, qc) has rel_h[kh] = q . rev_h[(grid_h - 1 - qr) + kh] and
// rel_w[kw] = q . rev_w[(grid_w - 1 - qc) + kw]. The warp multiplies its 16 query rows (the A
// fragments it already holds for Q K^T) by the rev entries its rows need, n8 block by n8 block, and
// scatters each product to the (row, key row / key column) it belongs to: every bias element is
// written exactly once. `tables` is either the global table (pitch D; L <= 254 rows of D: L1/L2
// resident, shared by every CTA of the launch) or the CTA's copy of it in shared memory (pitch
// kStride): short sequences (SAM's 14 x 14 windows) stage it there with Q, because seven or so
// dependent round trips to L2 per warp were a fixed cost that 3-4 key tiles could not amortise.
template <typename T, int D, bool kTablesInSmem>
__device__ __forceinline__ void WarpBiasFromTables(const RelPosAttentionArgs& p, const T* const tables,
                                                   int table_pitch, const uint32_t (&qf)[D / 16][4],
                                                   float* const rows, int pitch, int row0,
                                                   int lane) {
  const int g = lane / 4;
  const int t = lane % 4;
  const int n = p.seq;
  const int gh = p.grid_h;
  const int gw = p.grid_w;
  // Rows past N hold zero queries (their products are 0); they take the last row's geometry so
  // that their bias rows are fully written as well.
  int qr[2], qc[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = min(row0 + g + 8 * r, n - 1);
    qr[r] = row / gw;
    qc[r] = row - qr[r] * gw;
  }
  const int first = min(row0, n - 1);
  const int last = min(row0 + 15, n - 1);
  const int qr_lo = first / gw, qr_hi = last / gw;
  // Entries the warp's rows need: h: [gh - 1 - qr_hi, 2 gh - 2 - qr_lo]; w: the columns' range
  // when the 16 rows lie in one grid row, else all 2 gw - 1.
  const int qc_lo = qr_lo == qr_hi ? first - qr_lo * gw : 0;
  const int qc_hi = qr_lo == qr_hi ? last - qr_hi * gw : gw - 1;
#pragma unroll
  for (int part = 0; part < 2; ++part) {
    const int g_part = part == 0 ? gh : gw;
    const int lo = part == 0 ? gh - 1 - qr_hi : gw - 1 - qc_hi;
    const int hi = part == 0 ? 2 * gh - 2 - qr_lo : 2 * gw - 2 - qc_lo;  // inclusive
    const T* const tab = tables + (part == 0 ? 0 : static_cast<int64_t>(2 * gh - 1) * table_pitch);
    const int col0 = part == 0 ? gw : 0;  // rel_h after rel_w in the bias row
    for (int n0 = lo & ~7; n0 <= hi; n0 += 8) {
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      const int e = n0 + g;  // this lane's B column (table entry)
      const bool ev = e < 2 * g_part - 1;
      const T* const src = tab + static_cast<int64_t>(ev ? e : 0) * table_pitch + 2 * t;
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t b0 = 0u, b1 = 0u;
        if (ev) {
          const unsigned int* const w = reinterpret_cast<const unsigned int*>(src + ks * 16);
          b0 = kTablesInSmem ? w[0] : __ldg(w);
          b1 = kTablesInSmem ? w[4] : __ldg(w + 4);
        }
        Mma<T>::Run(c, qf[ks], b0, b1);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = i / 2;
        const int j = n0 + 2 * t + (i & 1);
        const int key = j - (g_part - 1 - (part == 0 ? qr[r] : qc[r]));
        if (key >= 0 && key < g_part) rows[(g + 8 * r) * pitch + col0 + key] = c[i] * kLog2e;
      }
    }
  }
}

// ---- the kernel -----------------------------------------------------------------------------------

// kWindow: 0, or the window size of window mode (RelPosAttentionArgs::window; SAM's 14, a
// compile-time constant so that the token arithmetic is multiplies, and so that the other
// configurations keep their registers).
template <typename T, int D, int kWarps, bool kAligned, int kWindow>
__global__ void __launch_bounds__(kWarps * 32, (kWarps >= 6 ? 2 : 4))
    RelPosAttentionKernel(const RelPosAttentionArgs p) {
  using Cfg = HeadDim<D>;
  constexpr int kThreads = kWarps * 32;
  constexpr int kRows = kWarps * 16;  // query rows per CTA
  constexpr int kStride = Cfg::kStride;
  constexpr int kTileElems = kKeysPerTile * kStride;
  static_assert(kRows <= 2 * kKeysPerTile, "Q is staged in the second K/V stage");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* const smem_kv = reinterpret_cast<T*>(smem_raw);
  // Stage s: K at smem_kv + 2 s tiles, V right after it.
  float* const smem_bias = reinterpret_cast<float*>(smem_raw + KvSmemBytes<D>());
  T* const smem_q = smem_kv + 2 * kTileElems;  // stage 1, free until the first prefetch into it

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;

  const int n = p.seq;
  const int q0 = blockIdx.x * kRows;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int gh = p.grid_h;
  const int gw = p.grid_w;
  const int bias_pitch = BiasPitch(gh, gw);

  // Token geometry: row r of this sequence is raster token r of batch entry b, or in window mode
  // token (wy0 + r / ws, wx0 + r % ws) of image `img` (outside the image: SAM's padding).
  constexpr int ws = kWindow;
  constexpr int kWsDivisor = ws > 0 ? ws : 1;  // divides only where ws > 0 (no warning for ws = 0)
  int img = b, wy0 = 0, wx0 = 0;
  if constexpr (ws > 0) {
    const int nw = (p.img_w + ws - 1) / ws;
    const int per_image = ((p.img_h + ws - 1) / ws) * nw;
    img = b / per_image;
    const int wi = b - img * per_image;
    wy0 = (wi / nw) * ws;
    wx0 = (wi % nw) * ws;
  }
  // Raster token of row r (r < n), and whether it lies inside the image.
  auto token_of = [&](int r, bool& inside) -> int64_t {
    if constexpr (ws == 0) {
      inside = true;
      return r;
    } else {
      const int y = r / ws;
      const int py = wy0 + y, px = wx0 + (r - y * ws);
      inside = py < p.img_h && px < p.img_w;
      return inside ? static_cast<int64_t>(py) * p.img_w + px : 0;
    }
  };
  const int64_t out_tokens = ws > 0 ? static_cast<int64_t>(p.img_h) * p.img_w : n;

  const T* const qb = static_cast<const T*>(p.q) + img * p.q_stride[0] + h * p.q_stride[1];
  const T* const kb = static_cast<const T*>(p.k) + img * p.k_stride[0] + h * p.k_stride[1];
  const T* const vb = static_cast<const T*>(p.v) + img * p.v_stride[0] + h * p.v_stride[1];

  // ---- prologue: Q -> stage 1 (group 0), K/V tile 0 -> stage 0 (group 1), bias -> smem ----
  for (int c = tid; c < kRows * Cfg::kChunks; c += kThreads) {
    const int r = c / Cfg::kChunks;
    const int ch = c % Cfg::kChunks;
    const int row = q0 + r;
    bool inside = false;
    const int64_t tok = row < n ? token_of(row, inside) : 0;
    const bool valid = row < n && inside;  // padded queries: zeros, never written out
    CpAsync16(SmemAddr(smem_q + r * kStride + ch * 8), qb + tok * p.q_stride[2] + ch * 8, valid);
  }
  // The rev tables go to stage 1's V half in the same group when they fit there (Q takes only the K
  // half with 4 warps; L = 54 rows for SAM's 14 x 14 windows): see WarpBiasFromTables.
  const bool bias_in_kernel = p.rel_tables != nullptr;
  const int table_rows = (2 * gh - 1) + (2 * gw - 1);
  const bool tables_in_smem = kRows <= kKeysPerTile && bias_in_kernel && p.stage_tables &&
                              table_rows <= kKeysPerTile &&
                              (reinterpret_cast<uintptr_t>(p.rel_tables) & 15) == 0;
  T* const smem_tables = smem_q + kTileElems;
  if (tables_in_smem) {
    const T* const tables = static_cast<const T*>(p.rel_tables);
    for (int c = tid; c < table_rows * Cfg::kChunks; c += kThreads) {
      const int r = c / Cfg::kChunks;
      const int ch = c % Cfg::kChunks;
      CpAsync16(SmemAddr(smem_tables + r * kStride + ch * 8), tables + r * D + ch * 8, true);
    }
  }
  CpAsyncCommit();

  int* const smem_tok = reinterpret_cast<int*>(smem_bias + kRows * bias_pitch);
  uint32_t* const smem_cols = reinterpret_cast<uint32_t*>(smem_tok + WindowTokTableInts(n));
  if constexpr (ws > 0) {
    for (int r = tid; r < n; r += kThreads) {
      bool inside = false;
      const int64_t tok = token_of(r, inside);
      smem_tok[r] = inside ? static_cast<int>(tok) : -1;
    }
    // Keys past N take the last key's columns (their scores are masked to -inf afterwards).
    const int cols = (n + kKeysPerTile - 1) / kKeysPerTile * kKeysPerTile;
    for (int j = tid; j < cols; j += kThreads) {
      const int jc = min(j, n - 1);
      const int hi = jc / kWsDivisor;
      smem_cols[j] = static_cast<uint32_t>(gw + hi) | static_cast<uint32_t>(jc - hi * kWsDivisor) << 16;
    }
    __syncthreads();  // load_kv reads the token table
  }

  // Window mode: a padded key's K/V row (pad_k / pad_v at h * D) as a byte offset from kb / vb, so
  // that a key's source is one select of two offsets (flat addresses: the difference is exact).
  int64_t k_pad_off = 0, v_pad_off = 0;
  if constexpr (ws > 0) {
    k_pad_off = static_cast<int64_t>(reinterpret_cast<uintptr_t>(static_cast<const T*>(p.pad_k) + h * D) -
                                     reinterpret_cast<uintptr_t>(kb));
    v_pad_off = static_cast<int64_t>(reinterpret_cast<uintptr_t>(static_cast<const T*>(p.pad_v) + h * D) -
                                     reinterpret_cast<uintptr_t>(vb));
  }
  auto load_kv = [&](int tile, int stage) {
    T* const sk = smem_kv + 2 * stage * kTileElems;
    T* const sv = sk + kTileElems;
    const int j0 = tile * kKeysPerTile;
    // Window mode: the token from the CTA's table (-1: padding); the byte strides fit in 32 bits
    // (checked on the host), so an offset is one 32 x 32 -> 64-bit multiply or the pad's offset.
    auto load_window_row = [&](int r, int ch) {
      const int key = j0 + r;
      const bool valid = key < n;
      const int tok = valid ? smem_tok[key] : 0;
      const bool inside = tok >= 0;
      const uint32_t t32 = static_cast<uint32_t>(tok);
      const int64_t k_off = inside ? static_cast<int64_t>(static_cast<uint64_t>(t32) *
                                                          static_cast<uint32_t>(p.k_stride[2] * sizeof(T)))
                                   : k_pad_off;
      const int64_t v_off = inside ? static_cast<int64_t>(static_cast<uint64_t>(t32) *
                                                          static_cast<uint32_t>(p.v_stride[2] * sizeof(T)))
                                   : v_pad_off;
      const char* const ksrc = reinterpret_cast<const char*>(kb + ch * 8) + k_off;
      const char* const vsrc = reinterpret_cast<const char*>(vb + ch * 8) + v_off;
      CpAsync16(SmemAddr(sk + r * kStride + ch * 8), ksrc, valid);
      CpAsync16(SmemAddr(sv + r * kStride + ch * 8), vsrc, valid);
    };
    // Each thread keeps one 16-byte column (ch) of the rows r0, r0 + kRowsPerPass, ... of the tile
    // (threads past kRowsPerPass * kChunks idle), so the chunk's column, its shared-memory offset and
    // the row step are compile-time amounts. Window mode finds each row's token in the CTA's table;
    // raster keys (key j is row j) step a source pointer by a constant number of rows (was a loop over
    // chunk indices with a division by the chunks per row and a 64-bit product per copy; ~340 of
    // ~1180 instructions a tile at D = 80).
    constexpr int kRowsPerPass = kThreads / Cfg::kChunks;
    constexpr int kPasses = (kKeysPerTile + kRowsPerPass - 1) / kRowsPerPass;
    const int r0 = tid / Cfg::kChunks;
    const int ch = tid - r0 * Cfg::kChunks;
    if (r0 < kRowsPerPass) {
      [[maybe_unused]] const int64_t k_pass = static_cast<int64_t>(kRowsPerPass) * p.k_stride[2];
      [[maybe_unused]] const int64_t v_pass = static_cast<int64_t>(kRowsPerPass) * p.v_stride[2];
      [[maybe_unused]] const T* ksrc = kb + static_cast<int64_t>(j0 + r0) * p.k_stride[2] + ch * 8;
      [[maybe_unused]] const T* vsrc = vb + static_cast<int64_t>(j0 + r0) * p.v_stride[2] + ch * 8;
#pragma unroll
      for (int k = 0; k < kPasses; ++k) {
        const int r = r0 + k * kRowsPerPass;
        if (kKeysPerTile % kRowsPerPass != 0 && r >= kKeysPerTile) break;
        if constexpr (ws > 0) {
          load_window_row(r, ch);
        } else {
          // Keys past N: zeros (src-size 0), read from nowhere; the source stays a valid address.
          const bool valid = j0 + r < n;
          CpAsync16(SmemAddr(sk + r * kStride + ch * 8), valid ? ksrc : kb, valid);
          CpAsync16(SmemAddr(sv + r * kStride + ch * 8), valid ? vsrc : vb, valid);
          ksrc += k_pass;
          vsrc += v_pass;
        }
      }
    }
  };
  load_kv(0, 0);
  CpAsyncCommit();

  if (!bias_in_kernel) {
    const int64_t rh_base = b * p.rel_h_stride[0] + h * p.rel_h_stride[1];
    const int64_t rw_base = b * p.rel_w_stride[0] + h * p.rel_w_stride[1];
    for (int r = warp; r < kRows; r += kWarps) {
      const int row = q0 + r;
      float* const dst = smem_bias + r * bias_pitch;
      const int64_t qr = row / gw, qc = row % gw;
      const int64_t rw_row = rw_base + qr * p.rel_w_stride[2] + qc * p.rel_w_stride[3];
      const int64_t rh_row = rh_base + qr * p.rel_h_stride[2] + qc * p.rel_h_stride[3];
      for (int c = lane; c < gw + gh; c += 32) {
        float val = 0.0f;
        if (row < n) {
          val = c < gw ? LoadAsFloat<T>(p.rel_w, rw_row + c, p.rel_is_float32)
                       : LoadAsFloat<T>(p.rel_h, rh_row + (c - gw), p.rel_is_float32);
        }
        dst[c] = val * kLog2e;
      }
    }
  }

  CpAsyncWait<1>();  // Q (and the staged tables) have landed (K/V tile 0 may still be in flight)
  __syncthreads();

  // Warp-uniform: all 16 rows past N, or (window mode) all below the image -> idle.
  const bool warp_active =
      q0 + warp * 16 < n && (ws == 0 || wy0 + (q0 + warp * 16) / kWsDivisor < p.img_h);
  uint32_t qf[Cfg::kKSteps][4];
  if (warp_active) {
#pragma unroll
    for (int ks = 0; ks < Cfg::kKSteps; ++ks) {
      const T* src = smem_q + (warp * 16 + (lane % 16)) * kStride + ks * 16 + (lane / 16) * 8;
      LdMatrixX4(qf[ks], SmemAddr(src));
    }
  }
  if (tables_in_smem && warp_active) {
    WarpBiasFromTables<T, D, true>(p, smem_tables, kStride, qf, smem_bias + warp * 16 * bias_pitch,
                                   bias_pitch, q0 + warp * 16, lane);
  }
  __syncthreads();  // stage 1 is overwritten by the first prefetch
  if (bias_in_kernel && !tables_in_smem && warp_active) {
    // Each warp reads only its own 16 bias rows below: a warp barrier is enough.
    WarpBiasFromTables<T, D, false>(p, static_cast<const T*>(p.rel_tables), D, qf,
                                    smem_bias + warp * 16 * bias_pitch, bias_pitch, q0 + warp * 16,
                                    lane);
    __syncwarp();
  }

  float o[Cfg::kOBlocks][4];
#pragma unroll
  for (int i = 0; i < Cfg::kOBlocks; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m_run[2] = {kNegInf, kNegInf};  // running row max (log2 domain), rows g and g + 8
  float l_run[2] = {0.0f, 0.0f};        // this thread's part of the row sums

  const float scale_log2 = p.scale * kLog2e;
  const float inv_gw = 1.0f / static_cast<float>(gw);
  const float* const bias0 = smem_bias + (warp * 16 + g) * bias_pitch;
  const float* const bias1 = bias0 + 8 * bias_pitch;

  const int num_tiles = (n + kKeysPerTile - 1) / kKeysPerTile;
  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = tile & 1;
    if (tile + 1 < num_tiles) load_kv(tile + 1, stage ^ 1);
    CpAsyncCommit();  // possibly empty: keeps "all but the newest group" = this tile
    CpAsyncWait<1>();
    __syncthreads();

    if (warp_active) {
      const T* const sk = smem_kv + 2 * stage * kTileElems;
      const T* const sv = sk + kTileElems;
      const int j0 = tile * kKeysPerTile;
      const int valid_keys = min(kKeysPerTile, n - j0);

      // S = Q K^T for the 64 keys (8 n8-blocks); 16-key chunks past N are skipped.
      float s[8][4];
#pragma unroll
      for (int i = 0; i < 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < Cfg::kKSteps; ++ks) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          if (c * 16 < valid_keys) {
            uint32_t kf[4];
            const T* src = sk + (c * 16 + (lane % 8) + (lane / 16) * 8) * kStride + ks * 16 +
                           ((lane / 8) % 2) * 8;
            LdMatrixX4(kf, SmemAddr(src));
            Mma<T>::Run(s[2 * c], qf[ks], kf[0], kf[1]);
            Mma<T>::Run(s[2 * c + 1], qf[ks], kf[2], kf[3]);
          }
        }
      }

      // Scale and bias (log2 domain), mask keys >= N.
      if constexpr (kAligned) {  // grid_w % 64 == 0: the tile lies inside one grid row
        const int hi = j0 / gw;
        const int w0 = j0 - hi * gw;
        const float bh0 = bias0[gw + hi];
        const float bh1 = bias1[gw + hi];
#pragma unroll
        for (int nb = 0; nb < 8; ++nb) {
          const int col = nb * 8 + 2 * t;
          const float2 bw0 = *reinterpret_cast<const float2*>(bias0 + w0 + col);
          const float2 bw1 = *reinterpret_cast<const float2*>(bias1 + w0 + col);
          s[nb][0] = fmaf(s[nb][0], scale_log2, bh0 + bw0.x);
          s[nb][1] = fmaf(s[nb][1], scale_log2, bh0 + bw0.y);
          s[nb][2] = fmaf(s[nb][2], scale_log2, bh1 + bw1.x);
          s[nb][3] = fmaf(s[nb][3], scale_log2, bh1 + bw1.y);
        }
      } else if constexpr (ws > 0) {
        const uint32_t* const cols = smem_cols + j0 + 2 * t;
#pragma unroll
        for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const uint32_t c = cols[nb * 8 + e];
            const int hc = static_cast<int>(c & 0xffffu), wc = static_cast<int>(c >> 16);
            s[nb][e] = fmaf(s[nb][e], scale_log2, bias0[hc] + bias0[wc]);
            s[nb][2 + e] = fmaf(s[nb][2 + e], scale_log2, bias1[hc] + bias1[wc]);
          }
        }
      } else {
#pragma unroll
        for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            // Clamped so that padded keys still index inside the bias rows.
            const int j = min(j0 + nb * 8 + 2 * t + e, n - 1);
            // j / gw without an integer division: exact for N < 2^21 (checked on the host), the
            // quotient being at least 0.5 / gw away from an integer.
            const int hi = __float2int_rz((static_cast<float>(j) + 0.5f) * inv_gw);
            const int wi = j - hi * gw;
            s[nb][e] = fmaf(s[nb][e], scale_log2, bias0[gw + hi] + bias0[wi]);
            s[nb][2 + e] = fmaf(s[nb][2 + e], scale_log2, bias1[gw + hi] + bias1[wi]);
          }
        }
      }
      if (valid_keys < kKeysPerTile) {
#pragma unroll
        for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            if (nb * 8 + 2 * t + e >= valid_keys) s[nb][e] = s[nb][2 + e] = kNegInf;
          }
        }
      }

      // Online softmax: new running max over the quad (the 4 lanes sharing rows g and g + 8).
      float mx[2] = {m_run[0], m_run[1]};
#pragma unroll
      for (int nb = 0; nb < 8; ++nb) {
        mx[0] = fmaxf(mx[0], fmaxf(s[nb][0], s[nb][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[nb][2], s[nb][3]));
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      }
      float alpha[2];
      float sub[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        // A row that has seen only -inf keeps sub = 0 so exp2 gives 0, never NaN.
        sub[r] = mx[r] == kNegInf ? 0.0f : mx[r];
        alpha[r] = Exp2(m_run[r] - sub[r]);
        m_run[r] = mx[r];
        l_run[r] *= alpha[r];
      }
#pragma unroll
      for (int i = 0; i < Cfg::kOBlocks; ++i) {
        o[i][0] *= alpha[0];
        o[i][1] *= alpha[0];
        o[i][2] *= alpha[1];
        o[i][3] *= alpha[1];
      }
#pragma unroll
      for (int nb = 0; nb < 8; ++nb) {
        s[nb][0] = Exp2(s[nb][0] - sub[0]);
        s[nb][1] = Exp2(s[nb][1] - sub[0]);
        s[nb][2] = Exp2(s[nb][2] - sub[1]);
        s[nb][3] = Exp2(s[nb][3] - sub[1]);
        l_run[0] += s[nb][0] + s[nb][1];
        l_run[1] += s[nb][2] + s[nb][3];
      }

      // O += P V, one 16-key k-step per chunk; P's A fragment is the C fragment of S.
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        if (c * 16 < valid_keys) {
          uint32_t pa[4];
          pa[0] = Mma<T>::Pack(s[2 * c][0], s[2 * c][1]);
          pa[1] = Mma<T>::Pack(s[2 * c][2], s[2 * c][3]);
          pa[2] = Mma<T>::Pack(s[2 * c + 1][0], s[2 * c + 1][1]);
          pa[3] = Mma<T>::Pack(s[2 * c + 1][2], s[2 * c + 1][3]);
#pragma unroll
          for (int dp = 0; dp < Cfg::kOBlocks / 2; ++dp) {
            uint32_t vf[4];
            const T* src = sv + (c * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kStride +
                           dp * 16 + (lane / 16) * 8;
            LdMatrixX4Trans(vf, SmemAddr(src));
            Mma<T>::Run(o[2 * dp], pa, vf[0], vf[1]);
            Mma<T>::Run(o[2 * dp + 1], pa, vf[2], vf[3]);
          }
        }
      }
    }
    __syncthreads();  // everyone is done with this stage before it is refilled
  }

  if (!warp_active) return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  const float inv_l[2] = {1.0f / l_run[0], 1.0f / l_run[1]};
  T* const out = static_cast<T*>(p.out);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = q0 + warp * 16 + g + 8 * r;
    if (row >= n) continue;
    bool inside = false;
    const int64_t tok = token_of(row, inside);
    if (!inside) continue;
    T* const dst = out + ((img * out_tokens + tok) * p.heads + h) * D + 2 * t;
#pragma unroll
    for (int i = 0; i < Cfg::kOBlocks; ++i) {
      *reinterpret_cast<uint32_t*>(dst + i * 8) =
          Mma<T>::Pack(o[i][2 * r] * inv_l[r], o[i][2 * r + 1] * inv_l[r]);
    }
  }
}

// ---- host side ------------------------------------------------------------------------------------

// Large sequences (global attention) get 8 warps (128 query rows: half the K/V smem traffic per
// row); short ones (14x14 windows) 4 warps, which wastes fewer rows on the partial last tile.
// MASKD_RELPOS_WINDOW_WARPS=7 or 8 runs the short (windowed) sequences with 7 warps (112 rows: a
// 196-token window in two CTAs instead of four, the second without a 4-row straggler CTA) or 8: a
// benchmarking knob (the choice is measured, see BENCHMARKS.md), read once per process.
// A warp-count knob: `name`'s value if it is one of `allowed`, else `fallback`.
inline int WarpsFromEnv(const char* name, int fallback, std::initializer_list<int> allowed) {
  const char* e = std::getenv(name);
  const int w = e != nullptr ? std::atoi(e) : 0;
  for (int a : allowed)
    if (w == a) return w;
  return fallback;
}
inline int WindowWarps() {
  static const int warps = WarpsFromEnv("MASKD_RELPOS_WINDOW_WARPS", 4, {7, 8});
  return warps;
}
// MASKD_RELPOS_GLOBAL_WARPS=4, 6 or 7 runs the long (global) sequences with that many warps, not 8:
// a benchmarking knob for the grid's fill at batch 1. vit_b's global blocks at bs1 are 12 heads x
// 32 tiles = 384 CTAs of 128 rows at 2 CTAs per SM (128 registers x 256 threads fill the register
// file), 1.45 waves on an H100's 132 SMs; 7 warps (112 rows) make 444 CTAs, 6 warps (96 rows) 516,
// both at 2 CTAs per SM, and 4 warps 768 at 3 CTAs per SM (shared memory). Read once per process.
// Run 55 (H100, vit_b bs1): 6 and 4 warps 1.283 ms for the global blocks against 8 warps' 1.281.
inline int GlobalWarps() {
  static const int warps = WarpsFromEnv("MASKD_RELPOS_GLOBAL_WARPS", 8, {4, 6, 7});
  return warps;
}
inline int WarpsFor(int seq) { return seq >= 1024 ? GlobalWarps() : WindowWarps(); }

// MASKD_RELPOS_TABLES_FROM_L2=1: the bias MMAs read the rev tables from global memory (L1/L2) even
// where a CTA could stage them in shared memory: a benchmarking knob, read once per process.
inline bool StageTables() {
  static const bool stage = [] {
    const char* e = std::getenv("MASKD_RELPOS_TABLES_FROM_L2");
    return !(e != nullptr && std::atoi(e) == 1);
  }();
  return stage;
}

constexpr int kMaxSmemPerBlock = 227 * 1024;
constexpr int kMaxDevices = 64;

template <typename T, int D, int kWarps, bool kAligned, int kWindow = 0>
cudaError_t LaunchKernel(const RelPosAttentionArgs& p, int smem, cudaStream_t stream) {
  auto kernel = RelPosAttentionKernel<T, D, kWarps, kAligned, kWindow>;
  if (smem > 48 * 1024) {
    // The opt-in limit is raised once per (kernel, device), to the most a block may have: it is
    // only a ceiling (occupancy follows each launch's own size), so racing callers agree, and
    // CUDA-graph capture sees only the launches.
    static std::atomic<bool> raised[kMaxDevices];
    int device = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e != cudaSuccess) return e;
    if (device >= kMaxDevices || !raised[device].load(std::memory_order_acquire)) {
      e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               kMaxSmemPerBlock);
      if (e != cudaSuccess) return e;
      if (device < kMaxDevices) raised[device].store(true, std::memory_order_release);
    }
  }
  const dim3 grid((p.seq + kWarps * 16 - 1) / (kWarps * 16), p.heads, p.batch);
  kernel<<<grid, kWarps * 32, smem, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, int D, int kWarps>
cudaError_t Launch(const RelPosAttentionArgs& p, cudaStream_t stream) {
  const int smem = SmemBytes<D>(kWarps, p.grid_h, p.grid_w);
  if (p.window > 0) {
    // Window mode is compiled for SAM's window only (kRelPosWindowModeSize).
    if (p.window != kWindowModeSize || p.rel_tables == nullptr) return cudaErrorInvalidValue;
    return LaunchKernel<T, D, kWarps, false, kWindowModeSize>(p, smem + WindowTableBytes(p.seq), stream);
  }
  return p.grid_w % kKeysPerTile == 0 ? LaunchKernel<T, D, kWarps, true>(p, smem, stream)
                                      : LaunchKernel<T, D, kWarps, false>(p, smem, stream);
}

template <typename T, int D>
cudaError_t LaunchForDim(const RelPosAttentionArgs& p, cudaStream_t stream) {
  switch (WarpsFor(p.seq)) {
    case 8:
      return Launch<T, D, 8>(p, stream);
    case 7:
      return Launch<T, D, 7>(p, stream);
    case 6:
      return Launch<T, D, 6>(p, stream);
    default:
      return Launch<T, D, 4>(p, stream);
  }
}

template <typename T>
cudaError_t LaunchForType(const RelPosAttentionArgs& p, cudaStream_t stream) {
  switch (p.head_dim) {
    case 64:
      return LaunchForDim<T, 64>(p, stream);
    case 80:
      return LaunchForDim<T, 80>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

bool RelPosAttentionSupported(int head_dim, int grid_h, int grid_w, int seq) {
  if (head_dim != 64 && head_dim != 80) return false;
  if (grid_h <= 0 || grid_w <= 0 || seq != grid_h * grid_w || seq >= (1 << 21)) return false;
  const int warps = WarpsFor(seq);
  const int smem = head_dim == 64 ? SmemBytes<64>(warps, grid_h, grid_w) : SmemBytes<80>(warps, grid_h, grid_w);
  return smem <= kMaxSmemPerBlock;
}

const char* RelPosAttentionKernelName(const RelPosAttentionArgs& p, DType dtype) {
  const bool bf16 = dtype == DType::kBFloat16;
  // [dtype][head dim][warps 4 / 6 / 7 / 8]
  static const char* const kNames[2][2][4] = {
      {{"RelPosAttentionKernel<fp16,64,4>", "RelPosAttentionKernel<fp16,64,6>", "RelPosAttentionKernel<fp16,64,7>",
        "RelPosAttentionKernel<fp16,64,8>"},
       {"RelPosAttentionKernel<fp16,80,4>", "RelPosAttentionKernel<fp16,80,6>", "RelPosAttentionKernel<fp16,80,7>",
        "RelPosAttentionKernel<fp16,80,8>"}},
      {{"RelPosAttentionKernel<bf16,64,4>", "RelPosAttentionKernel<bf16,64,6>", "RelPosAttentionKernel<bf16,64,7>",
        "RelPosAttentionKernel<bf16,64,8>"},
       {"RelPosAttentionKernel<bf16,80,4>", "RelPosAttentionKernel<bf16,80,6>", "RelPosAttentionKernel<bf16,80,7>",
        "RelPosAttentionKernel<bf16,80,8>"}}};
  const int w = WarpsFor(p.seq);
  return kNames[bf16 ? 1 : 0][p.head_dim == 64 ? 0 : 1][w == 8 ? 3 : w == 7 ? 2 : w == 6 ? 1 : 0];
}

cudaError_t LaunchRelPosAttention(const RelPosAttentionArgs& args, DType dtype,
                                  cudaStream_t stream) {
  RelPosAttentionArgs p = args;
  p.stage_tables = StageTables();
  switch (dtype) {
    case DType::kBFloat16:
      return LaunchForType<__nv_bfloat16>(p, stream);
    case DType::kFloat16:
      return LaunchForType<__half>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace maskd::kernels::detail
