// SAM's postprocess_masks (bilinear 256 -> pad, crop, bilinear -> original size) fused with the
// threshold, the mask statistics and COCO RLE, evaluated per output pixel without any full-size float
// tensor.
//
// The interpolation reproduces at::upsample_bilinear2d (CUDA, align_corners=False): scale = in / out
// in float, src = scale * (dst + 0.5) - 0.5 clamped at 0, i0 = (int)src, i1 = i0 + (i0 < in - 1),
// lambda = src - i0, value = h0 * (w0 * a + w1 * b) + h1 * (w0 * c + w1 * d) (bilinear.h, as its
// horizontal and vertical steps); each stage's result is rounded to the logits' dtype, as the
// reference stores it. nvcc may contract the products into FMAs otherwise than ATen's build, an fp32
// rounding that flips a pixel only where the value is within it of 0: the GPU tests allow 4 such
// pixels a mask against LibTorch and have seen none. Taps of the second stage whose weight is exactly 0 are
// skipped (0 * finite adds nothing), which makes the usual identity second stage one evaluation.
//
// Layout: see MaskEvalColumnsKernel (a lane per output column, the separable stages' row values
// reused from registers). The bit words go to a scratch buffer (1/32 of a float mask) from which the
// RLE kernels find the run boundaries.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernels/bilinear.h"
#include "kernels/launchers.h"

namespace maskd::kernels::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kCols = kMaskColumnsPerBlock;
static_assert(kCols == 32, "a lane per column of the block");

template <typename T>
__device__ __forceinline__ float RoundTo(float v) {
  return static_cast<float>(static_cast<T>(v));
}
template <>
__device__ __forceinline__ float RoundTo<float>(float v) {
  return v;
}

template <typename T>
__device__ __forceinline__ float Load(const T* p) {
  return static_cast<float>(*p);
}

using bilinear::SourceTaps;
using bilinear::Taps;

// Mask evaluation, a lane per output column (MaskEvalColumnsKernel). Block = (mask, 32 output
// columns), 8 warps; lane l owns column x0 + l and warp w the row groups k = w, w + 8, ...; within a
// group the lane walks its column's 32 rows and builds the column-major bit words itself (bit j =
// row 32 k + j). The rows' taps are warp-uniform, the columns' taps a lane's own for the whole kernel,
// and both stages are separable: a low-res row's horizontal values (H, per lane: one for each
// first-stage column the lane reads) serve every intermediate row between its taps (4 rows at the
// usual 4x), and an intermediate row's values (S, rounded to T) every output row between its taps.
// The general case keeps each in a two-entry register cache keyed by its (warp-uniform) row: rows
// only move forward, so a miss evicts the smaller key. The identity second stage (the original image
// is the input's crop: orig = input size, the workload's 1024 x 768) is S itself: the first stage's
// row taps come from a per-block table and the lane keeps the H of the two low-res rows they name.
// Run 63 (H100): 0.107 ms for 64 masks at 1024 x 768, where the layout before it (a lane per row,
// ballots, four loads and both bilinear steps per pixel) took 0.223 with the same bits.
namespace cols {
constexpr int kMaxIdentityRows = 1024;  // the identity path's row-tap table (16 KB); taller: general

// A lane's statistics over its column's bit words.
struct Stats {
  uint32_t area = 0, n_hi = 0, n_lo = 0;
  int xmin = INT_MAX, ymin = INT_MAX, xmax = -1, ymax = -1;
  __device__ __forceinline__ void Add(uint32_t bits, uint32_t hi, uint32_t lo, int x, int k) {
    area += __popc(bits);
    n_hi += __popc(hi);
    n_lo += __popc(lo);
    if (bits != 0) {
      xmin = min(xmin, x);
      xmax = max(xmax, x);
      ymin = min(ymin, 32 * k + __ffs(bits) - 1);
      ymax = max(ymax, 32 * k + 31 - __clz(bits));
    }
  }
};

// One output pixel's three threshold bits into the words at bit j.
__device__ __forceinline__ void Threshold(float v, int j, uint32_t& bits, uint32_t& hi, uint32_t& lo) {
  bits |= static_cast<uint32_t>(v > 0.0f) << j;
  hi |= static_cast<uint32_t>(v > 1.0f) << j;
  lo |= static_cast<uint32_t>(v > -1.0f) << j;
}
}  // namespace cols

template <typename T>
__global__ void __launch_bounds__(kThreads) MaskEvalColumnsKernel(const MaskEvalArgs a) {
  const int m = blockIdx.x;
  const int64_t* tb = a.table + static_cast<int64_t>(m) * kMaskTableCols;
  const int in_h = static_cast<int>(tb[kColInputH]);
  const int in_w = static_cast<int>(tb[kColInputW]);
  const int oh = static_cast<int>(tb[kColOrigH]);
  const int ow = static_cast<int>(tb[kColOrigW]);
  const int x0 = blockIdx.y * kCols;
  if (x0 >= ow) return;  // whole block: this mask is narrower than the widest
  const int64_t word_off = tb[kColWordOffset];
  const int nw = (oh + 31) / 32;
  const T* __restrict__ low = static_cast<const T*>(a.logits) + static_cast<int64_t>(m) * a.low_h * a.low_w;
  // Scales exactly as area_pixel_compute_scale: float(in) / out.
  const float s1h = bilinear::Scale(a.low_h, a.pad);
  const float s1w = bilinear::Scale(a.low_w, a.pad);
  const float s2h = bilinear::Scale(in_h, oh);
  const float s2w = bilinear::Scale(in_w, ow);
  const bool identity = in_h == oh && in_w == ow && oh <= cols::kMaxIdentityRows;  // block-uniform

  __shared__ __align__(16) Taps row_taps[cols::kMaxIdentityRows];
  __shared__ unsigned long long red_counts[kWarps][3];
  __shared__ int red_extent[kWarps][4];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int x = x0 + lane;
  const bool x_valid = x < ow;
  // Second-stage column taps, and the first-stage taps of the intermediate columns they read. Lanes
  // past the mask's width evaluate its last column and keep nothing.
  const Taps tx = SourceTaps(s2w, x_valid ? x : ow - 1, in_w);
  const Taps c0 = SourceTaps(s1w, tx.i0, a.low_w);
  const Taps c1 = SourceTaps(s1w, tx.i1, a.low_w);
  const bool two_cols = tx.l1 != 0.0f;  // else column tx.i1 has weight 0 and is skipped (exact)
  uint8_t* const bitmask = a.bitmask != nullptr ? a.bitmask + tb[kColBitmaskOffset] : nullptr;
  cols::Stats st;

  if (identity) {
    // v(y, x) = S(y, x): the second stage's taps are (y, weight 1) and (x, weight 1) exactly (scale
    // 1.0f), the two-stage evaluation then returns its one tap unchanged, and S is already in T.
    for (int y = tid; y < oh; y += kThreads) row_taps[y] = SourceTaps(s1h, y, a.low_h);
    __syncthreads();
    int key0 = -1, key1 = -1;  // the low-res rows whose H the lane holds
    float h0 = 0.0f, h1 = 0.0f;
    auto horizontal = [&](int lr) {
      const T* row = low + static_cast<int64_t>(lr) * a.low_w;
      return bilinear::Horizontal(c0, Load(row + c0.i0), Load(row + c0.i1));
    };
    for (int k = warp; k < nw; k += kWarps) {
      uint32_t bits = 0, hi = 0, lo = 0;
      const int rows = min(32, oh - 32 * k);
#pragma unroll 4
      for (int j = 0; j < rows; ++j) {
        const int y = 32 * k + j;
        const Taps r = row_taps[y];
        if (r.i0 != key0) {  // warp-uniform
          if (r.i0 == key1) h0 = h1;
          else h0 = horizontal(r.i0);
          key0 = r.i0;
        }
        if (r.i1 != key1) {
          h1 = r.i1 == key0 ? h0 : horizontal(r.i1);
          key1 = r.i1;
        }
        const float v = RoundTo<T>(bilinear::Vertical(r, h0, h1));
        cols::Threshold(v, j, bits, hi, lo);
        if (bitmask != nullptr && x_valid) bitmask[static_cast<int64_t>(y) * ow + x] = static_cast<uint8_t>(v > 0.0f);
      }
      if (!x_valid) continue;
      a.words[word_off + static_cast<int64_t>(x) * nw + k] = bits;
      st.Add(bits, hi, lo, x, k);
    }
  } else {
    // H(lr): low-res row lr's horizontal values at intermediate columns tx.i0 (f) and tx.i1 (s);
    // S(ir): the first stage at intermediate row ir and those columns, rounded to T.
    struct Cached {
      int key;
      float f, s;
    };
    Cached h_a{-1, 0.0f, 0.0f}, h_b{-1, 0.0f, 0.0f}, s_a{-1, 0.0f, 0.0f}, s_b{-1, 0.0f, 0.0f};
    auto horizontal = [&](int lr) -> Cached {
      if (lr == h_a.key) return h_a;
      if (lr == h_b.key) return h_b;
      const T* row = low + static_cast<int64_t>(lr) * a.low_w;
      Cached h{lr, bilinear::Horizontal(c0, Load(row + c0.i0), Load(row + c0.i1)), 0.0f};
      if (two_cols) h.s = bilinear::Horizontal(c1, Load(row + c1.i0), Load(row + c1.i1));
      if (h_a.key < h_b.key) h_a = h;
      else h_b = h;
      return h;
    };
    auto intermediate = [&](int ir) -> Cached {
      if (ir == s_a.key) return s_a;
      if (ir == s_b.key) return s_b;
      const Taps r = SourceTaps(s1h, ir, a.low_h);
      const Cached top = horizontal(r.i0), bottom = horizontal(r.i1);
      Cached v{ir, RoundTo<T>(bilinear::Vertical(r, top.f, bottom.f)), 0.0f};
      if (two_cols) v.s = RoundTo<T>(bilinear::Vertical(r, top.s, bottom.s));
      if (s_a.key < s_b.key) s_a = v;
      else s_b = v;
      return v;
    };
    for (int k = warp; k < nw; k += kWarps) {
      uint32_t bits = 0, hi = 0, lo = 0;
      const int rows = min(32, oh - 32 * k);
      for (int j = 0; j < rows; ++j) {
        const int y = 32 * k + j;
        const Taps ty = SourceTaps(s2h, y, in_h);
        const Cached top = intermediate(ty.i0);
        float ba = 0.0f, bb = 0.0f;
        if (ty.l1 != 0.0f) {  // warp-uniform
          const Cached bottom = intermediate(ty.i1);
          ba = bottom.f;
          bb = bottom.s;
        }
        // top.s / bottom.s are 0 where the column's second tap is skipped (weight 0: exact).
        const float v = RoundTo<T>(bilinear::Combine(ty, tx, top.f, top.s, ba, bb));
        cols::Threshold(v, j, bits, hi, lo);
        if (bitmask != nullptr && x_valid) bitmask[static_cast<int64_t>(y) * ow + x] = static_cast<uint8_t>(v > 0.0f);
      }
      if (!x_valid) continue;
      a.words[word_off + static_cast<int64_t>(x) * nw + k] = bits;
      st.Add(bits, hi, lo, x, k);
    }
  }
  uint32_t area = st.area, n_hi = st.n_hi, n_lo = st.n_lo;
  int xmin = st.xmin, ymin = st.ymin, xmax = st.xmax, ymax = st.ymax;
  // The warp's sums and extremes, then the block's, then one atomic per statistic.
#pragma unroll
  for (int d = 16; d > 0; d /= 2) {
    area += __shfl_xor_sync(0xffffffffu, area, d);
    n_hi += __shfl_xor_sync(0xffffffffu, n_hi, d);
    n_lo += __shfl_xor_sync(0xffffffffu, n_lo, d);
    xmin = min(xmin, __shfl_xor_sync(0xffffffffu, xmin, d));
    ymin = min(ymin, __shfl_xor_sync(0xffffffffu, ymin, d));
    xmax = max(xmax, __shfl_xor_sync(0xffffffffu, xmax, d));
    ymax = max(ymax, __shfl_xor_sync(0xffffffffu, ymax, d));
  }
  if (lane == 0) {
    red_counts[warp][0] = area;
    red_counts[warp][1] = n_hi;
    red_counts[warp][2] = n_lo;
    red_extent[warp][0] = xmin;
    red_extent[warp][1] = ymin;
    red_extent[warp][2] = xmax;
    red_extent[warp][3] = ymax;
  }
  __syncthreads();
  if (tid == 0) {
    unsigned long long total[3] = {0, 0, 0};
    for (int w = 0; w < kWarps; ++w) {
      for (int i = 0; i < 3; ++i) total[i] += red_counts[w][i];
      xmin = min(xmin, red_extent[w][0]);
      ymin = min(ymin, red_extent[w][1]);
      xmax = max(xmax, red_extent[w][2]);
      ymax = max(ymax, red_extent[w][3]);
    }
    unsigned long long* counts = a.counts + static_cast<int64_t>(m) * 3;
    for (int i = 0; i < 3; ++i)
      if (total[i]) atomicAdd(counts + i, total[i]);
    if (total[0]) {
      int32_t* e = a.extent + static_cast<int64_t>(m) * 4;
      atomicMin(e + 0, xmin);
      atomicMin(e + 1, ymin);
      atomicMax(e + 2, xmax);
      atomicMax(e + 3, ymax);
    }
  }
}

// Exclusive block-wide prefix sum of one value per thread (kT threads, all of them calling); also
// returns the block's total. Safe to call in a loop: the warp sums are read before anyone returns.
template <int kT, typename V>
__device__ __forceinline__ V BlockExclusiveScan(V v, V* total) {
  __shared__ V warp_sums[kT / 32];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  V incl = v;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const V o = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += o;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  V before = 0, sum = 0;
#pragma unroll
  for (int w = 0; w < kT / 32; ++w) {
    const V x = warp_sums[w];
    if (w < warp) before += x;
    sum += x;
  }
  __syncthreads();
  *total = sum;
  return before + incl - v;
}

// Run boundaries of the block's words (32 columns of one mask, column-major, contiguous in the
// scratch buffer). Word i of the block is column i / nw, row word i % nw; a boundary is a pixel whose
// bit differs from the previous pixel in column-major order (the pixel before the first counts as 0,
// so a mask starting with 1 gets a leading zero-length run).
template <bool kWrite>
__global__ void __launch_bounds__(kThreads) MaskRleKernel(const MaskRleArgs a) {
  const int m = blockIdx.x;
  const int grp = blockIdx.y;
  const int64_t* tb = a.table + static_cast<int64_t>(m) * kMaskTableCols;
  const int oh = static_cast<int>(tb[kColOrigH]);
  const int ow = static_cast<int>(tb[kColOrigW]);
  const int64_t slot = static_cast<int64_t>(m) * a.max_groups + grp;
  const int x0 = grp * kCols;
  if (x0 >= ow) {
    if (!kWrite && threadIdx.x == 0) a.block_counts[slot] = 0;
    return;
  }
  const int nw = (oh + 31) / 32;
  const int ncols = min(kCols, ow - x0);
  const int nwords = ncols * nw;
  const uint32_t* w = a.words + tb[kColWordOffset] + static_cast<int64_t>(x0) * nw;
  const int last_bit = (oh - 1) % 32;  // bit of a column's last pixel in its last word

  const int per = (nwords + kThreads - 1) / kThreads;
  const int begin = min(nwords, static_cast<int>(threadIdx.x) * per);
  const int end = min(nwords, begin + per);

  auto boundaries = [&](int i) -> uint32_t {
    const int c = i / nw;
    const int k = i - c * nw;
    uint32_t prev = 0;
    if (k > 0) {
      prev = w[i - 1] >> 31;
    } else if (x0 + c > 0) {
      prev = (w[i - 1] >> last_bit) & 1u;  // i - 1 may be the previous group's last word
    }
    const int nbits = min(32, oh - 32 * k);
    const uint32_t valid = nbits == 32 ? 0xffffffffu : ((1u << nbits) - 1u);
    const uint32_t word = w[i];
    return (word ^ ((word << 1) | prev)) & valid;
  };

  int count = 0;
  for (int i = begin; i < end; ++i) count += __popc(boundaries(i));

  int total = 0;
  const int before = BlockExclusiveScan<kThreads>(count, &total);
  if (!kWrite) {
    if (threadIdx.x == 0) a.block_counts[slot] = total;
    return;
  }
  int64_t pos = a.block_base[slot] + before;
  for (int i = begin; i < end; ++i) {
    uint32_t bnd = boundaries(i);
    const int c = i / nw;
    const int k = i - c * nw;
    const int pixel0 = (x0 + c) * oh + 32 * k;
    while (bnd != 0) {
      const int b = __ffs(bnd) - 1;
      a.positions[pos++] = pixel0 + b;
      bnd &= bnd - 1;
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    MaskRleDiffKernel(const int32_t* __restrict__ positions, const int64_t* __restrict__ offsets,
                      const int64_t* __restrict__ table, int32_t* __restrict__ counts) {
  const int m = blockIdx.x;
  const int64_t* tb = table + static_cast<int64_t>(m) * kMaskTableCols;
  const int32_t hw = static_cast<int32_t>(tb[kColOrigH] * tb[kColOrigW]);
  const int64_t start = offsets[m];
  const int64_t end = offsets[m + 1];
  for (int64_t i = start + threadIdx.x; i < end; i += kThreads) {
    const int32_t cur = i == end - 1 ? hw : positions[i];
    const int32_t prev = i == start ? 0 : positions[i - 1];
    counts[i] = cur - prev;
  }
}

// The value COCO's string encodes for run i of the region [start, end).
__device__ __forceinline__ int64_t RleStringValue(const int32_t* counts, int64_t start, int64_t i) {
  int64_t x = counts[i];
  if (i - start > 2) x -= counts[i - 2];
  return x;
}

// pycocotools' rleToString for one value: 5-bit groups, low first, | 0x20 while more follow, + 48.
// Returns the number of chars; writes them when out is not null.
__device__ __forceinline__ int RleStringChars(int64_t x, uint8_t* out) {
  int n = 0;
  bool more = true;
  while (more) {
    int c = static_cast<int>(x & 0x1f);
    x >>= 5;  // arithmetic: a negative value converges to -1
    more = (c & 0x10) ? x != -1 : x != 0;
    if (more) c |= 0x20;
    if (out != nullptr) out[n] = static_cast<uint8_t>(c + 48);
    ++n;
  }
  return n;
}

// Segment s of mask m's runs: a contiguous kRleStringSegments-th of its region (every slot of the
// region is a run after MaskRleDiffKernel, the end slot the last one).
__device__ __forceinline__ void RleSegment(const int64_t* offsets, int m, int s, int64_t* start,
                                           int64_t* begin, int64_t* end) {
  *start = offsets[m];
  const int64_t runs = offsets[m + 1] - *start;
  *begin = *start + runs * s / kRleStringSegments;
  *end = *start + runs * (s + 1) / kRleStringSegments;
}

// Count pass: each segment's number of chars. Write pass: the chars at seg_base (an exclusive scan
// of the counts, GroupScanKernel), each thread's at its block-scan position within the segment.
template <bool kWrite>
__global__ void __launch_bounds__(kThreads)
    RleStringSegmentKernel(const int32_t* __restrict__ counts, const int64_t* __restrict__ offsets,
                           int32_t* __restrict__ seg_chars, const int64_t* __restrict__ seg_base,
                           uint8_t* __restrict__ chars) {
  const int m = blockIdx.x;
  const int s = blockIdx.y;
  int64_t start, begin, end;
  RleSegment(offsets, m, s, &start, &begin, &end);
  const int64_t slot = static_cast<int64_t>(m) * kRleStringSegments + s;
  if constexpr (!kWrite) {
    int64_t n = 0;
    for (int64_t i = begin + threadIdx.x; i < end; i += kThreads)
      n += RleStringChars(RleStringValue(counts, start, i), nullptr);
    int64_t total = 0;
    BlockExclusiveScan<kThreads>(n, &total);
    if (threadIdx.x == 0) seg_chars[slot] = static_cast<int32_t>(total);
  } else {
    int64_t pos = seg_base[slot];
    for (int64_t c0 = begin; c0 < end; c0 += kThreads) {  // block-uniform trip count
      const int64_t i = c0 + threadIdx.x;
      const int64_t x = i < end ? RleStringValue(counts, start, i) : 0;
      const int n = i < end ? RleStringChars(x, nullptr) : 0;
      int total = 0;
      const int before = BlockExclusiveScan<kThreads>(n, &total);
      if (i < end) RleStringChars(x, chars + pos + before);
      pos += total;
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    CopyCountedBytesKernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst, const int64_t* count) {
  const int64_t n = *count;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const bool vec = reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  const int64_t vectors = vec ? n / 16 : 0;
  for (int64_t i = first; i < vectors; i += stride)
    reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
  for (int64_t i = vectors * 16 + first; i < n; i += stride) dst[i] = src[i];
}

constexpr int kScanThreads = 1024;

// One block: base[i] = exclusive scan of counts [M * G] (mask-major) + extra per mask before i's;
// mask_offsets[m] = base[m * G], mask_offsets[M] = the total + M * extra.
__global__ void __launch_bounds__(kScanThreads)
    GroupScanKernel(const int32_t* __restrict__ counts, int num_masks, int groups, int extra,
                    int64_t* __restrict__ base, int64_t* __restrict__ mask_offsets) {
  const int64_t n = static_cast<int64_t>(num_masks) * groups;
  int64_t carry = 0;
  for (int64_t c0 = 0; c0 < n; c0 += kScanThreads) {  // block-uniform trip count
    const int64_t i = c0 + threadIdx.x;
    const int64_t v = i < n ? counts[i] : 0;
    int64_t total = 0;
    const int64_t before = BlockExclusiveScan<kScanThreads>(v, &total);
    if (i < n) {
      const int64_t b = carry + before + (i / groups) * extra;
      base[i] = b;
      if (i % groups == 0) mask_offsets[i / groups] = b;
    }
    carry += total;
  }
  if (threadIdx.x == 0) mask_offsets[num_masks] = carry + static_cast<int64_t>(num_masks) * extra;
}

__global__ void MaskStatsInitKernel(unsigned long long* __restrict__ counts, int32_t* __restrict__ extent,
                                    int num_masks) {
  for (int m = blockIdx.x * blockDim.x + threadIdx.x; m < num_masks; m += gridDim.x * blockDim.x) {
    counts[3 * m] = counts[3 * m + 1] = counts[3 * m + 2] = 0;
    extent[4 * m] = extent[4 * m + 1] = INT_MAX;
    extent[4 * m + 2] = extent[4 * m + 3] = -1;
  }
}

}  // namespace

cudaError_t LaunchMaskEval(const MaskEvalArgs& a, DType dtype, cudaStream_t stream) {
  const dim3 grid(a.num_masks, a.max_groups);
  switch (dtype) {
    case DType::kFloat32:
      MaskEvalColumnsKernel<float><<<grid, kThreads, 0, stream>>>(a);
      break;
    case DType::kBFloat16:
      MaskEvalColumnsKernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(a);
      break;
    case DType::kFloat16:
      MaskEvalColumnsKernel<__half><<<grid, kThreads, 0, stream>>>(a);
      break;
  }
  return cudaGetLastError();
}

cudaError_t LaunchMaskRleCount(const MaskRleArgs& a, cudaStream_t stream) {
  MaskRleKernel<false><<<dim3(a.num_masks, a.max_groups), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t LaunchMaskRleWrite(const MaskRleArgs& a, cudaStream_t stream) {
  MaskRleKernel<true><<<dim3(a.num_masks, a.max_groups), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t LaunchMaskRleDiff(const int32_t* positions, const int64_t* offsets,
                              const int64_t* table, int num_masks, int32_t* counts,
                              cudaStream_t stream) {
  MaskRleDiffKernel<<<num_masks, kThreads, 0, stream>>>(positions, offsets, table, counts);
  return cudaGetLastError();
}

cudaError_t LaunchMaskStatsInit(unsigned long long* counts, int32_t* extent, int num_masks,
                                cudaStream_t stream) {
  MaskStatsInitKernel<<<(num_masks + kThreads - 1) / kThreads, kThreads, 0, stream>>>(counts, extent, num_masks);
  return cudaGetLastError();
}

cudaError_t LaunchGroupScan(const int32_t* counts, int num_masks, int groups, int extra, int64_t* base,
                            int64_t* mask_offsets, cudaStream_t stream) {
  GroupScanKernel<<<1, kScanThreads, 0, stream>>>(counts, num_masks, groups, extra, base, mask_offsets);
  return cudaGetLastError();
}

cudaError_t LaunchRleStringSegmentChars(const int32_t* counts, const int64_t* offsets, int num_masks,
                                        int32_t* seg_chars, cudaStream_t stream) {
  const dim3 grid(num_masks, kRleStringSegments);
  RleStringSegmentKernel<false><<<grid, kThreads, 0, stream>>>(counts, offsets, seg_chars, nullptr, nullptr);
  return cudaGetLastError();
}

cudaError_t LaunchRleStringSegmentWrite(const int32_t* counts, const int64_t* offsets, int num_masks,
                                        const int64_t* seg_base, uint8_t* chars, cudaStream_t stream) {
  const dim3 grid(num_masks, kRleStringSegments);
  RleStringSegmentKernel<true><<<grid, kThreads, 0, stream>>>(counts, offsets, nullptr, seg_base, chars);
  return cudaGetLastError();
}

cudaError_t LaunchCopyCountedBytes(const uint8_t* src, uint8_t* dst, const int64_t* count, int sms,
                                   cudaStream_t stream) {
  CopyCountedBytesKernel<<<std::max(sms, 1) * 2, kThreads, 0, stream>>>(src, dst, count);
  return cudaGetLastError();
}

}  // namespace maskd::kernels::detail
