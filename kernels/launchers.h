// The CUDA side of maskd_kernels: raw pointers, plain sizes and an explicit stream, no ATen.
//
// The .cu files implement these; the .cc files (which see ATen) check tensors, allocate, and call
// them. Each launcher starts exactly one kernel and returns cudaGetLastError() of that launch, so the
// caller can name the kernel in its error. Pointers must be device pointers on the current device.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace maskd::kernels::detail {

enum class DType : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

// ---------------------------------------------------------------------------------------------------
// Fused attention with decomposed relative-position bias (rel_pos_attention.cu).
// SAM's window (every vit_b/l/h checkpoint): the one size window mode is compiled for.
constexpr int kRelPosWindowModeSize = 14;
struct RelPosAttentionArgs {
  // [B, H, N, D], last dimension contiguous; strides in elements for (b, h, n). Base pointers and
  // strides must be 16-byte aligned (the loads are 16-byte cp.async).
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t q_stride[3] = {0, 0, 0};
  int64_t k_stride[3] = {0, 0, 0};
  int64_t v_stride[3] = {0, 0, 0};
  // rel_h[b, h, n, 0..grid_h) and rel_w[b, h, n, 0..grid_w), last dimension contiguous; float32 or
  // q's dtype. Strides in elements for (b, h, query grid row n / grid_w, query grid column
  // n % grid_w): a plain [B, H, N, g] tensor has (s_b, s_h, grid_w * s_n, s_n); the skewed views of
  // kernels::RelPosTables have other row/column strides.
  const void* rel_h = nullptr;
  const void* rel_w = nullptr;
  int64_t rel_h_stride[4] = {0, 0, 0, 0};
  int64_t rel_w_stride[4] = {0, 0, 0, 0};
  bool rel_is_float32 = true;
  // Optional: ReversedRelPosTables [(2 grid_h - 1) + (2 grid_w - 1), D], q's dtype, contiguous.
  // When set, each warp computes the bias rows of its 16 queries itself (q . rev^T on the tensor
  // cores, fp32) and rel_h / rel_w are not read: no [B, H, N, L] table in memory and no copy of q.
  const void* rel_tables = nullptr;
  // Set by LaunchRelPosAttention: whether a CTA may copy rel_tables into its shared memory (when
  // they fit; MASKD_RELPOS_TABLES_FROM_L2=1 clears it, a knob for same-binary comparisons).
  bool stage_tables = true;
  // Window mode (window > 0; needs rel_tables): window b's queries and keys are gathered from raster
  // tokens, so the qkv projection never runs on SAM's padding. q/k/v strides are then (image, head,
  // raster token), batch = images * windows per image, seq = window^2, grid = window x window.
  // A window position outside the img_h x img_w image is a zero token in SAM, whose projection is
  // the bias: its key/value rows come from pad_k / pad_v ([heads * D], q's dtype, 16-byte aligned);
  // padded queries are neither computed nor written. out is the raster [images, img_h * img_w,
  // heads, D].
  // Only window == kRelPosWindowModeSize is compiled.
  int window = 0, img_h = 0, img_w = 0;
  const void* pad_k = nullptr;
  const void* pad_v = nullptr;
  // [B, N, H, D] contiguous, q's dtype.
  void* out = nullptr;
  int batch = 0, heads = 0, seq = 0, head_dim = 0, grid_h = 0, grid_w = 0;
  float scale = 1.0f;
};
// Kernel name of the configuration RelPosAttention would launch (for error messages and benches).
const char* RelPosAttentionKernelName(const RelPosAttentionArgs& args, DType dtype);
// Whether the kernel supports this head dim / grid (D in {64, 80}, bias rows fit in shared memory).
bool RelPosAttentionSupported(int head_dim, int grid_h, int grid_w, int seq);
cudaError_t LaunchRelPosAttention(const RelPosAttentionArgs& args, DType dtype,
                                  cudaStream_t stream);

// ---------------------------------------------------------------------------------------------------
// Residual add + LayerNorm with window (un)partition in the indexing (encoder_fusion.cu).
struct AddLayerNormArgs {
  void* x = nullptr;            // [B, H, W, C] contiguous, updated in place when delta is set
  const void* delta = nullptr;  // nullptr, or [B, H, W, C] (delta_window 0) / windowed tokens
  int delta_window = 0;
  const void* weight = nullptr;  // [C], the dtype of x
  const void* bias = nullptr;    // [C]
  void* out = nullptr;           // out_tokens x C: raster (out_window 0) or windowed with padding
  int out_window = 0;
  int B = 0, H = 0, W = 0, C = 0;
  int64_t out_tokens = 0;
  float eps = 1e-6f;
  // Set: `out` is float8_e4m3fn (out_tokens x C) and out_scales [out_tokens] the rows' scales
  // (the vector kernel only; LaunchAddLayerNorm refuses the generic one with cudaErrorInvalidValue).
  float* out_scales = nullptr;
};
// True when the 16-byte vector kernel applies (16-bit dtype, C = 256 k for k in 1..6); the generic
// kernel handles everything else.
bool AddLayerNormVectorized(int C, DType dtype);
const char* AddLayerNormKernelName(int C, DType dtype);
cudaError_t LaunchAddLayerNorm(const AddLayerNormArgs& args, DType dtype, cudaStream_t stream);

// q' and k' of the rel-pos-folded attention (encoder_fusion.cu; kernels::FoldRelPosQK).
struct FoldRelPosArgs {
  // [B, H, N = grid^2, D] views, last dimension contiguous, 16-byte aligned rows; strides in
  // elements for (b, h, n).
  const void* q = nullptr;
  const void* k = nullptr;
  int64_t q_stride[3] = {0, 0, 0};
  int64_t k_stride[3] = {0, 0, 0};
  const void* rev = nullptr;  // ReversedRelPosTables [2 (2 grid - 1), D], q's dtype, contiguous
  void* qf = nullptr;         // [B, H, N, width] contiguous
  void* kf = nullptr;         // [B, H, N, width] contiguous
  int batch = 0, heads = 0, grid = 0, head_dim = 0, width = 0;
  float scale = 1.0f;
  bool tensor_cores = false;  // the rel-pos terms by mma.sync (FoldRelPosMmaKernel), else fp32 FMAs
};
// Whether the kernel is compiled for this shape (D 64 or 80, grid <= 64 and a multiple of 8, width
// a multiple of 8 and >= D + 2 grid).
bool FoldRelPosSupported(int head_dim, int grid, int width);
cudaError_t LaunchFoldRelPos(const FoldRelPosArgs& args, DType dtype, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------------
// The mask decoder's row LayerNorm (+ GELU) and broadcast add (decoder_fusion.cu).
struct RowNormArgs {
  const void* x = nullptr;       // [rows, C] contiguous, 16-byte aligned
  const void* weight = nullptr;  // [C]
  const void* bias = nullptr;    // [C]
  void* out = nullptr;           // [rows, C]
  int64_t rows = 0;
  int C = 0;
  float eps = 1e-6f;
  bool gelu = false;
};
// True for 16-bit dtypes and C in {32, 64, 128, 256} (C / 8 lanes per row).
bool RowNormVectorized(int C, DType dtype);
cudaError_t LaunchRowNorm(const RowNormArgs& args, DType dtype, cudaStream_t stream);
// y[i] += rows[i % period] for i < elements (16-bit dtypes, elements and period multiples of 8,
// 16-byte aligned).
cudaError_t LaunchAddRowsBroadcast(void* y, const void* rows, int64_t elements, int64_t period, DType dtype,
                                   cudaStream_t stream);
// The decoder's second transposed convolution + bias + GELU + hypernetwork product (decoder_fusion.cu).
struct UpscaleHyperArgs {
  const void* x = nullptr;      // [rows, 64], rows (b, y, x, dy, dx), 16-byte aligned
  const void* w = nullptr;      // [64, 128] columns (ddy, ddx, c), contiguous, 16-byte aligned
  const void* bias = nullptr;   // [128]
  const void* hyper = nullptr;  // [B, 4, 32]
  void* out = nullptr;          // [B, 4, 4h, 4w]
  int64_t rows = 0;             // B * h * w * 4, a multiple of 32
  int grid_h = 0, grid_w = 0;   // embedding grid; grid_w a multiple of 8
  // Optional: x is the first upscaling step's output before its LayerNorm2d + GELU, applied to each
  // row as it is loaded (RowNorm's arithmetic): weight and bias [64], 16-byte aligned; null: x is
  // already normalised.
  const void* norm_weight = nullptr;
  const void* norm_bias = nullptr;
  float norm_eps = 1e-6f;
  // bf16: the GELU by a shared-memory table of its values (built by each block with the same
  // arithmetic: the same bits) for 2^-8 <= |v| < 8 instead of erff (~35 instructions a value, about
  // half the kernel's). fp16 ignores it.
  bool gelu_table = false;
};
// The launch's blocks: one per 32-row tile, at most 6 an SM (each loops over its tiles).
int64_t UpscaleHyperBlocks(int64_t rows, int sms);
cudaError_t LaunchUpscaleHyper(const UpscaleHyperArgs& args, DType dtype, int sms, cudaStream_t stream);
// The decoder's image->token attention probabilities (decoder_fusion.cu): for every prompt b, image
// position p and head h, softmax over the T tokens of scale * q[row(b), p, h*16..] . k[b, t, h*16..],
// written as out[b, p, h*T + t] (16 channels per head, T <= 16).
struct ImageToTokenProbsArgs {
  const void* q = nullptr;          // rows (bq, p), 16-byte aligned, q[bq, p, i] at bq*q_batch_stride + p*q_row_stride + i
  int64_t q_batch_stride = 0, q_row_stride = 0;  // elements, multiples of 8
  const int64_t* q_rows = nullptr;  // [B] q batch row of each prompt, or null: row b (q_batches == B) or 0 (q_batches == 1)
  int64_t q_batches = 0;
  const void* k = nullptr;          // [B, T, I] contiguous
  void* out = nullptr;              // [B, positions, heads * T] contiguous
  int64_t batch = 0, positions = 0;
  int heads = 0, tokens = 0;        // I = 16 * heads, tokens <= 16
  float scale = 1.f;
  // Optional [positions, I] rows added to q (fp32 sum) as it is loaded: the positional share of the
  // query projection, the same for every prompt. 16-byte aligned, row stride a multiple of 8.
  const void* q_bias = nullptr;
  int64_t q_bias_row_stride = 0;
};
cudaError_t LaunchImageToTokenProbs(const ImageToTokenProbsArgs& args, DType dtype, cudaStream_t stream);
// The whole image->token step of a two-way block for every prompt (decoder_fusion.cu): the
// probabilities above (probs.out unused; probs.q_bias added to q), rounded to the input type, then
// out[b, p] = LayerNorm(residual[row(b), p] + sum over (h, t) of P[b, p, h*T + t] u[b, h*T + t]) over
// D = 256 channels (tensor cores, fp32 accumulation from the residual), one rounding of the output.
// heads == 8 (I = 128), tokens <= 16.
struct ImageToTokenUpdateArgs {
  ImageToTokenProbsArgs probs;
  const void* u = nullptr;                // [B, heads * T, 256] contiguous, 16-byte aligned
  const void* residual = nullptr;         // rows of 256 contiguous channels, 16-byte aligned
  int64_t residual_batch_stride = 0;      // elements, multiple of 8 (0: one residual for every prompt)
  const int64_t* residual_rows = nullptr; // [B] residual batch row of each prompt, or null: row b
  const void* weight = nullptr;           // [256] LayerNorm weight and bias, 16-byte aligned
  const void* bias = nullptr;
  float eps = 1e-5f;
  void* out = nullptr;                    // [B, positions, 256] contiguous
};
constexpr int kImageToTokenUpdateChannels = 256;
constexpr int kImageToTokenUpdateHeads = 8;
// sms: the device's multiprocessors (the grid walks tiles so that each block stages u once for several).
cudaError_t LaunchImageToTokenUpdate(const ImageToTokenUpdateArgs& args, DType dtype, int sms, cudaStream_t stream);
// softmax(scale q k^T) v for at most kFewQueryMaxQueries queries per (batch, head) against many keys
// (few_query_attention.cu), split over the keys: LaunchFewQueryAttention writes `out` itself when
// splits == 1, else fp32 partials that LaunchFewQueryCombine merges into `out`.
constexpr int kFewQueryMaxQueries = 16;
struct FewQueryAttentionArgs {
  // [N, H, rows, head_dim] with the last dimension contiguous; strides in elements for (n, h, row).
  // k and v rows 16-byte aligned (base and strides); q is read element-wise.
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t q_stride[3] = {0, 0, 0};
  int64_t k_stride[3] = {0, 0, 0};
  int64_t v_stride[3] = {0, 0, 0};
  void* out = nullptr;       // [N, queries, H, head_dim] contiguous, q's dtype
  float* partial = nullptr;  // splits > 1: [N, H, splits, queries, head_dim + 2] (acc, max, sum)
  int batch = 0, heads = 0, queries = 0, keys = 0, head_dim = 0;
  // Split s takes keys [s, s + 1) * chunks_per_split * FewQueryChunkKeys(); every split has keys.
  int splits = 1, chunks_per_split = 1;
  float scale = 1.f;
  // [N] int64 or null: the k / v batch row of query batch n (k and v then have their own batch
  // count); null: row n.
  const int64_t* kv_rows = nullptr;
  // Optional biases shared by every batch: k_bias rows [keys, heads * head_dim] (row stride in
  // elements, a multiple of 8; 16-byte aligned) added to each key row as it is loaded (fp32), and
  // v_bias [heads * head_dim] added to the output (each softmax row sums to 1: P (V + 1 b^T) = P V + b).
  const void* k_bias = nullptr;
  int64_t k_bias_row_stride = 0;
  const void* v_bias = nullptr;
};
bool FewQueryAttentionSupported(int queries, int head_dim, DType dtype);  // head_dim 16 or 32
int FewQueryChunkKeys();
cudaError_t LaunchFewQueryAttention(const FewQueryAttentionArgs& args, DType dtype, cudaStream_t stream);
cudaError_t LaunchFewQueryCombine(const FewQueryAttentionArgs& args, DType dtype, cudaStream_t stream);
// The decoder's token->image attention over a prompt's own keys with the key and value projections
// absorbed (absorbed_attention.cu; kernels/NOTES.md, "Weight absorption"): for batch n, head h < 8
// and query l < queries <= 8, over keys j of x[n] (256 channels),
//   z[n, l, h, :] = sum_j p_j x[n, j, :],  p = softmax_j(scale (qa[n, h, l, :] . x[n, j, :]
//                                                        + q[n, h, l, :] . k_bias[j, 16 h : 16 h + 16]))
// (qa = Wk_h^T q: the key projection moved onto the query; the value projection is the caller's,
// applied to z). Split over the keys as FewQueryAttention: with splits == 1 the kernel writes `out`,
// else fp32 partials that LaunchAbsorbedCombine merges into `out`.
constexpr int kAbsorbedHeads = 8, kAbsorbedHeadDim = 16, kAbsorbedDim = 256, kAbsorbedMaxQueries = 8;
struct AbsorbedAttentionArgs {
  // Strides in elements; the last dimension contiguous. qa and x rows 16-byte aligned (base and
  // strides multiples of 8); q is read element-wise.
  const void* qa = nullptr;  // [N, 8, queries, 256]: strides (n, h, l)
  int64_t qa_stride[3] = {0, 0, 0};
  const void* q = nullptr;   // [N, 8, queries, 16]: strides (n, h, l)
  int64_t q_stride[3] = {0, 0, 0};
  const void* x = nullptr;   // [N, keys, 256]: strides (n, key)
  int64_t x_stride[2] = {0, 0};
  // [keys, 128] shared by every batch (row stride a multiple of 8, 16-byte aligned), or null.
  const void* k_bias = nullptr;
  int64_t k_bias_row_stride = 0;
  void* out = nullptr;          // [N, queries, 8, 256] contiguous, x's dtype
  float* partial = nullptr;     // splits > 1: [N, splits, 64, 256] (row 8 h + l) accumulators
  float* partial_md = nullptr;  // splits > 1: [N, splits, 64, 2] (running max, sum)
  int batch = 0, queries = 0, keys = 0;
  // Split s takes keys [s, s + 1) * keys_per_split, a multiple of AbsorbedAttentionKeyStep(); every
  // split has keys.
  int splits = 1, keys_per_split = 0;
  float scale = 1.f;
};
int AbsorbedAttentionKeyStep();
cudaError_t LaunchAbsorbedAttention(const AbsorbedAttentionArgs& args, DType dtype, cudaStream_t stream);
cudaError_t LaunchAbsorbedCombine(const AbsorbedAttentionArgs& args, DType dtype, cudaStream_t stream);
// table: `items` rows of {dst address, src address, bytes} on the device; every address 16-byte
// aligned and every size a multiple of 16; max_bytes the largest size (sizes the grid).
cudaError_t LaunchCopySlices(const int64_t* table, int64_t items, int64_t max_bytes, cudaStream_t stream);
// out[i, p, c] = images[i][c, p] + channel_bias[c] for i < count (decoder_fusion.cu): up to
// kImageSideKeysMaxImages embeddings into the decoder's position-major keys [count, HW, C], the sum
// in fp32 and rounded once (as ATen's add). A channel-major image ([C, HW] in memory) goes through
// 32 x 32 shared-memory tiles; a position-major one (bit i of position_major: [HW, C] in memory, the
// layout the encoder's neck leaves) is the add alone. bf16 / fp16.
constexpr int kImageSideKeysMaxImages = 64;
struct ImageSideKeysArgs {
  const void* images[kImageSideKeysMaxImages] = {};
  uint64_t position_major = 0;  // bit i: images[i] is [HW, C] in memory
  int count = 0;
  const void* channel_bias = nullptr;  // [C]
  void* out = nullptr;                 // [>= count, positions, channels] contiguous
  int64_t channels = 0, positions = 0;
};
cudaError_t LaunchImageSideKeys(const ImageSideKeysArgs& args, DType dtype, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------------
// Pillow-exact resize + normalise + pad (preprocess.cu).
// Horizontal pass: in [in_h, in_w, 3] -> out [in_h, out_w, 3], uint8, Pillow's fixed point.
cudaError_t LaunchPilHorizontal(const uint8_t* in, int in_h, int in_w, uint8_t* out, int out_w,
                                const int32_t* bounds, const int32_t* weights, int ksize,
                                cudaStream_t stream);
// Vertical pass (when `vertical`; else `in` is already out_h rows) + (x - mean) / std + zero pad:
// in [src_h, out_w, 3] uint8 -> out [3, pad, pad] of out_dtype.
struct NormalizePadArgs {
  const uint8_t* in = nullptr;
  int src_h = 0;
  bool vertical = false;
  const int32_t* bounds = nullptr;   // vertical coefficients (2 * out_h)
  const int32_t* weights = nullptr;  // out_h * ksize
  int ksize = 0;
  int out_h = 0, out_w = 0, pad = 0;
  float mean[3] = {0, 0, 0};
  float std[3] = {1, 1, 1};
  void* out = nullptr;
};
cudaError_t LaunchPilVerticalNormalizePad(const NormalizePadArgs& args, DType out_dtype,
                                          cudaStream_t stream);

// ---------------------------------------------------------------------------------------------------
// Mask post-processing (postprocess.cu).
//
// Per-mask table, int64 [M, kMaskTableCols] on the device.
enum MaskTableCol : int {
  kColInputH = 0,
  kColInputW,
  kColOrigH,
  kColOrigW,
  kColWordOffset,     // into the bit words: the mask's orig_w * words_per_column words
  kColBitmaskOffset,  // into the uint8 bitmask (only read when a bitmask is written)
  kMaskTableCols
};
// Masks are processed in groups of this many output columns per block.
inline constexpr int kMaskColumnsPerBlock = 32;

struct MaskEvalArgs {
  const void* logits = nullptr;  // [M, low_h, low_w] contiguous
  int num_masks = 0, low_h = 0, low_w = 0, pad = 0;
  const int64_t* table = nullptr;
  int max_groups = 0;  // max over masks of ceil(orig_w / kMaskColumnsPerBlock)
  // Column-major bit words: bit b of word (x, k) = pixel (y = 32 k + b, x) > 0; bits past orig_h 0.
  uint32_t* words = nullptr;
  // [M, 3]: count(v > 0), count(v > 1), count(v > -1).
  unsigned long long* counts = nullptr;
  // [M, 4]: x_min, y_min, x_max, y_max (initialised to INT_MAX, INT_MAX, -1, -1).
  int32_t* extent = nullptr;
  uint8_t* bitmask = nullptr;  // nullptr: no bitmask
};
cudaError_t LaunchMaskEval(const MaskEvalArgs& args, DType logits_dtype, cudaStream_t stream);

// RLE from the bit words: first counts the run boundaries of each (mask, column group) into
// block_counts [M * max_groups], then (after the caller's scan) writes their pixel positions
// (column-major index) at block_base [M * max_groups] into positions.
struct MaskRleArgs {
  const uint32_t* words = nullptr;
  const int64_t* table = nullptr;
  int num_masks = 0, max_groups = 0;
  int32_t* block_counts = nullptr;      // count pass
  const int64_t* block_base = nullptr;  // write pass
  int32_t* positions = nullptr;         // write pass
};
cudaError_t LaunchMaskRleCount(const MaskRleArgs& args, cudaStream_t stream);
cudaError_t LaunchMaskRleWrite(const MaskRleArgs& args, cudaStream_t stream);
// counts[i] = run lengths from boundary positions: region m is [offsets[m], offsets[m+1]), its last
// slot standing for the end of the mask (orig_h * orig_w).
cudaError_t LaunchMaskRleDiff(const int32_t* positions, const int64_t* offsets,
                              const int64_t* table, int num_masks, int32_t* counts,
                              cudaStream_t stream);
// Sets counts [M, 3] to 0 and extent [M, 4] to (INT_MAX, INT_MAX, -1, -1) before LaunchMaskEval.
cudaError_t LaunchMaskStatsInit(unsigned long long* counts, int32_t* extent, int num_masks,
                                cudaStream_t stream);
// One block: base[i] = exclusive scan of counts [M * groups] (mask-major) plus `extra` per mask
// before i's; mask_offsets [M + 1]: mask_offsets[m] = base[m * groups], mask_offsets[M] = the total +
// M * extra. With MaskRleCount's block counts and extra = 1 (each region's end slot) it gives
// MaskRleWrite's block_base and the regions' offsets; with the string segments' chars and extra = 0,
// the segments' char positions and each mask's string offset.
cudaError_t LaunchGroupScan(const int32_t* counts, int num_masks, int groups, int extra, int64_t* base,
                            int64_t* mask_offsets, cudaStream_t stream);
// COCO's compressed RLE string (pycocotools rleToString) from the counts of LaunchMaskRleDiff:
// run j of mask m is x = counts[j] - (j > 2 ? counts[j - 2] : 0) within its region, written as
// 5-bit groups, low first, each char = group (| 0x20 when more follow) + 48. Each mask's runs are
// split into kRleStringSegments contiguous segments: SegmentChars counts each segment's chars into
// seg_chars [M * kRleStringSegments]; SegmentWrite writes them at seg_base (their exclusive scan,
// LaunchGroupScan) into chars, which may be device-mapped pinned host memory.
inline constexpr int kRleStringSegments = 16;
cudaError_t LaunchRleStringSegmentChars(const int32_t* counts, const int64_t* offsets, int num_masks,
                                        int32_t* seg_chars, cudaStream_t stream);
cudaError_t LaunchRleStringSegmentWrite(const int32_t* counts, const int64_t* offsets, int num_masks,
                                        const int64_t* seg_base, uint8_t* chars, cudaStream_t stream);
// dst[0, *count) = src[0, *count), the count read by the device (no host wait for it): 16-byte
// stores where src and dst are 16-byte aligned. For pinned host memory mapped into the device's
// address space, whose writes cross the bus as full lines only when they are wide and contiguous.
cudaError_t LaunchCopyCountedBytes(const uint8_t* src, uint8_t* dst, const int64_t* count, int sms,
                                   cudaStream_t stream);

// ---------------------------------------------------------------------------------------------------
// fp8 (fp8.cu). x [rows, cols] (row stride in elements) -> q [rows, cols] float8_e4m3fn contiguous,
// scales [rows] float32 (max|row| / 448, at least FLT_MIN); gelu: quantise erf-GELU(x) instead.
cudaError_t LaunchQuantizeRowsFp8(const void* x, DType dtype, int64_t rows, int64_t cols,
                                  int64_t row_stride, bool gelu, void* q, float* scales,
                                  cudaStream_t stream);

}  // namespace maskd::kernels::detail
