// maskd's CUDA kernels behind host functions that take LibTorch tensors and an explicit stream.
//
// Every function here has a plain-LibTorch reference (the *Reference functions, also the CPU path)
// that tests compare the kernel against; on CPU tensors, or in a build without CUDA, the public
// function runs the reference. Every kernel launch is checked; a failure throws c10::Error with the
// kernel's name and the CUDA error string (the engine turns it into a Status).
//
// Internal to libmaskd_model: this header includes torch and must not reach server/client code.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace maskd::kernels {

// True when this build contains the CUDA kernels (MASKD_WITH_CUDA).
bool BuiltWithCuda();

// The CUDA stream handle as an opaque pointer, so this header stays free of cuda_runtime.h.
// nullptr = the current LibTorch stream of the tensors' device.
using Stream = void*;

// ---------------------------------------------------------------------------------------------------
// Attention with SAM's decomposed relative position bias, fused (flash-attention style: the
// B x H x N x N score matrix and bias are never materialised).
//
//   out[b, n, h, :] = sum_j softmax_j( scale * q[b,h,n,:] . k[b,h,j,:]
//                                      + rel_h[b,h,n, j / grid_w] + rel_w[b,h,n, j % grid_w] ) v[b,h,j,:]
//
// q, k, v: [B, H, N, D] with the last dimension contiguous (other strides arbitrary, so views of the
//   qkv projection work without copies); bf16 or fp16; N = grid_h * grid_w (queries and keys share
//   the grid, as in SAM's windowed and global attention); D in {64, 80} on CUDA (any on CPU).
// rel_h: [B, H, N, grid_h], rel_w: [B, H, N, grid_w]: q . R_h and q . R_w of the UNSCALED q, as in
//   SAM's add_decomposed_rel_pos; last dimension contiguous; float32 or q's dtype.
// Returns [B, N, H, D] contiguous in q's dtype (ready for the output projection as [B, N, H*D]).
at::Tensor RelPosAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& rel_h, const at::Tensor& rel_w, int64_t grid_h,
                           int64_t grid_w, double scale, Stream stream = nullptr);
// rel_h / rel_w may also be 5-D, [B, H, grid_h, grid_w, grid_h] and [B, H, grid_h, grid_w, grid_w]
// with the query index split into its grid row and column, any strides with the last one 1: the
// skewed views RelPosTables returns (read in place by the CUDA kernel; the reference copies them).
//
// The same function in plain LibTorch (fp32 accumulation), any device and dtype.
at::Tensor RelPosAttentionReference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& rel_h, const at::Tensor& rel_w,
                                    int64_t grid_h, int64_t grid_w, double scale);

// SAM's decomposed rel-pos terms as one matrix product instead of two gathers + einsums.
//
// With R_h[r, k] = table_h[r - k + grid_h - 1] (get_rel_pos when queries and keys share the grid),
// q . R_h[r, k] = S[n, (grid_h - 1 - r) + k] where S = q @ rev_h^T and rev_h is table_h reversed
// (row j = table_h[2 grid_h - 2 - j]); likewise for w with the query's column. So one GEMM
// S = q @ [rev_h; rev_w]^T ([B, H, N, (2 grid_h - 1) + (2 grid_w - 1)], q's dtype, fp32
// accumulation) holds every term, and rel_h / rel_w are strided ("skewed") 5-D views into it, which
// RelPosAttention reads without a gather pass.
struct RelPosTerms {
  at::Tensor rel_h;  // [B, H, grid_h, grid_w, grid_h] view into `table`
  at::Tensor rel_w;  // [B, H, grid_h, grid_w, grid_w] view into `table`
  at::Tensor table;  // S, [B, H, N, Lh + Lw] contiguous
};
// rev_tables: [(2 grid_h - 1) + (2 grid_w - 1), D], ReversedRelPosTables of the gathered R_h / R_w.
at::Tensor ReversedRelPosTables(const at::Tensor& Rh, const at::Tensor& Rw);
// q: [B, H, N, D] (any strides), N = grid_h * grid_w. Plain LibTorch (one matmul), any device.
RelPosTerms RelPosTables(const at::Tensor& q, const at::Tensor& rev_tables, int64_t grid_h,
                         int64_t grid_w);

// The folded attention's operands (AttentionImpl::kSdpaFolded): q' = [q * scale, rel_h, rel_w, 0...]
// and k' = [k, e_row(j), e_col(j), 0...], each [B, H, N, width] contiguous (width >= D + 2 grid, a
// multiple of 8), so that q' . k' = scale q . k + rel_h[row(j)] + rel_w[col(j)]. rel_h / rel_w are
// RelPosTables' terms rounded to q's dtype. On CUDA (bf16/fp16, D 64 or 80, grid <= 64 and a multiple
// of 8, 16-byte aligned rows) one kernel reads q and k in place and writes both; elsewhere
// RelPosTables and concatenations (the same values up to the fp32 summation order of the terms),
// with key_indicators as FoldRelPosQKReference takes them. Run 57 (H100) tested the kernel and measured
// it at ~0.05 ms a block for vit_b at batch 1 against ~0.12 for the LibTorch way; the encoder uses it
// unless MASKD_FOLD_KERNEL=0. The terms are made on the tensor cores (FoldRelPosMmaKernel, run 58:
// 0.119 against 0.213 ms for vit_b's 4 global blocks at batch 1); MASKD_FOLD_MMA=0 (read at each call)
// makes them with fp32 FMAs instead.
struct FoldedQK {
  at::Tensor q, k;
};
FoldedQK FoldRelPosQK(const at::Tensor& q, const at::Tensor& k, const at::Tensor& rev_tables, int64_t grid,
                      double scale, int64_t width, const at::Tensor& key_indicators = {},
                      Stream stream = nullptr);
// key_indicators: k's extra columns [N, width - D] (e_row, e_col, zeros), when the caller keeps them;
// else they are built for the call.
FoldedQK FoldRelPosQKReference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& rev_tables,
                               int64_t grid, double scale, int64_t width, const at::Tensor& key_indicators = {});
// The indicator columns of k' for a grid x grid image: [grid^2, width - D] of `options`.
at::Tensor FoldedKeyIndicators(int64_t grid, int64_t extra, const at::TensorOptions& options);

// RelPosAttention with the rel-pos terms made inside the kernel from rev_tables (ReversedRelPosTables;
// converted to q's dtype if it is not): each warp multiplies its 16 queries by the table entries
// they need on the tensor cores (fp32) and writes its bias rows to shared memory, so neither the
// [B, H, N, L] product of RelPosTables nor a contiguous copy of q is made. Same contract as
// RelPosAttention otherwise. Off CUDA: RelPosTables + RelPosAttentionReference.
at::Tensor RelPosAttentionFromTables(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& rev_tables, int64_t grid_h, int64_t grid_w,
                                     double scale, Stream stream = nullptr);

// SAM's windowed attention straight from the raster qkv projection: the window partition (with
// SAM's zero padding to a multiple of the window) and the unpartition happen in the kernel's
// indexing, so qkv and proj run on the img_h x img_w tokens only, not on the padded grid (vit_b/h:
// 4096 instead of 4900 tokens per image). A padded token is a zero input to qkv, so its key and value
// are the projection's bias: pad_k / pad_v ([heads * D]); padded queries are not computed.
// q, k, v: [B, heads, img_h * img_w, D] (views of the qkv output: last dim contiguous). Returns the
// raster [B, img_h * img_w, heads, D]. Off CUDA: the padded windows spelled out + the reference.
at::Tensor RelPosWindowAttentionFromTables(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, const at::Tensor& pad_k,
                                           const at::Tensor& pad_v, const at::Tensor& rev_tables,
                                           int64_t window, int64_t img_h, int64_t img_w,
                                           double scale, Stream stream = nullptr);
// Whether the CUDA kernel has window mode for this window and head dim (SAM's 14; D 64 or 80).
// The CPU fallback takes any.
bool RelPosWindowAttentionSupported(int64_t window, int64_t head_dim);

// ---------------------------------------------------------------------------------------------------
// The element-wise work between the encoder's matrix products, fused: residual add, LayerNorm and
// the window partition (zero padding) or unpartition (crop) of SAM's ViT blocks in one pass.
//
// Token layouts: raster [B, H, W, C] (the residual stream), or windowed for window size ws > 0:
// [B * nh * nw, ws, ws, C] with nh = ceil(H / ws), nw = ceil(W / ws), window (b, i, j) at index
// (b * nh + i) * nw + j, token (y, x) of it at image position (i ws + y, j ws + x); positions past
// H or W are padding (SAM's window_partition pads with zeros after norm1).
//
// x: the residual stream [B, H, W, C], contiguous, bf16/fp16/fp32; when `delta` is defined it is
//   updated in place, x = x + delta (rounded to x's dtype), delta in the `delta_window` layout
//   (0: raster; ws: windowed, its padding tokens ignored), contiguous.
// Returns LayerNorm(x) over C (fp32 statistics, eps, weight/bias [C] in x's dtype) in the
// `out_window` layout (0: raster; ws: windowed with zero padding tokens).
at::Tensor AddLayerNorm(at::Tensor& x, const at::Tensor& delta, int64_t delta_window,
                        const at::Tensor& weight, const at::Tensor& bias, double eps,
                        int64_t out_window, Stream stream = nullptr);
// The unfused composition in LibTorch (add_, layer_norm, pad/permute), any device and dtype.
at::Tensor AddLayerNormReference(at::Tensor& x, const at::Tensor& delta, int64_t delta_window,
                                 const at::Tensor& weight, const at::Tensor& bias, double eps,
                                 int64_t out_window);
// Layout helpers (plain LibTorch views/copies), shared by the reference, the model and the tests.
// [B, H, W, C] -> windowed [B * nh * nw, ws, ws, C] with zero padding.
at::Tensor WindowPartition(const at::Tensor& x, int64_t ws);
// windowed tokens (any shape with C last and B * nh * nw * ws * ws rows) -> [B, H, W, C], cropped.
at::Tensor WindowUnpartition(const at::Tensor& windows, int64_t ws, int64_t B, int64_t H, int64_t W);

// ---------------------------------------------------------------------------------------------------
// The mask decoder's element-wise passes (decoder_fusion.cu), used by model/fast_decoder.cc.
//
// RowNorm: LayerNorm over the last dimension of x ([..., C], contiguous; fp32 statistics, weight and
// bias [C] in x's dtype), then GELU (erf form) when `gelu`, in one pass. The CUDA kernel covers
// bf16/fp16 with C in {32, 64, 128, 256} (GELU applied before rounding the normalised value);
// everything else runs RowNormReference.
at::Tensor RowNorm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps, bool gelu,
                   Stream stream = nullptr);
at::Tensor RowNormReference(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps,
                            bool gelu);
// y += rows, rows [R, n] broadcast over y's leading dimensions (y [..., R, n], contiguous, in
// place). Bit-identical to y.add_(rows) (fp32 sum, one rounding); CUDA kernel for bf16/fp16.
void AddRowsBroadcast(at::Tensor& y, const at::Tensor& rows, Stream stream = nullptr);
// The mask decoder's last upscaling step and the hypernetwork product: x [B*h*w*4, C1] (rows
// (b, y, x, dy, dx): the first transposed convolution's output after LayerNorm + GELU), w [C1, 4*C2]
// and bias [4*C2] (the second transposed convolution as a GEMM, columns (ddy, ddx, c)), hyper
// [B, M, C2]. Returns masks [B, M, 4h, 4w] = hyper . GELU(x w + bias) at pixel
// (4y + 2dy + ddy, 4x + 2dx + ddx). CUDA kernel for bf16/fp16 with C1 = 64, C2 = 32, M = 4 and w a
// multiple of 8 (SAM's decoder); otherwise UpscaleHyperReference (addmm, gelu, bmm, permute).
// With `norm` (weight defined), x is the first step's output before its LayerNorm2d + GELU, which the
// kernel applies to each row as it loads it (RowNorm's arithmetic; the [B*h*w*4, C1] normalised
// activation is never written); every other path runs RowNorm first.
struct UpscaleInputNorm {
  at::Tensor weight, bias;  // [C1]
  double eps = 1e-6;
};
at::Tensor UpscaleHyper(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, const at::Tensor& hyper,
                        int64_t h, int64_t width, const UpscaleInputNorm& norm = {}, Stream stream = nullptr);
at::Tensor UpscaleHyperReference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
                                 const at::Tensor& hyper, int64_t h, int64_t width);
// The mask decoder's image->token attention probabilities: q [Bq, HW, I] (its last dimension
// contiguous, rows may be strided), k [B, T, I]; q_rows [B] int64 (may be undefined) names each
// prompt's q batch row, else row b (Bq == B) or row 0 (Bq == 1). Returns [B, HW, heads * T] in q's
// dtype, P[b, p, h*T + t] = softmax over t of scale * q[row, p, h] . k[b, t, h] (heads of I / heads
// channels), scores and softmax in fp32, one rounding. CUDA kernel for bf16/fp16 with 16 channels
// per head, T <= 16 and 16-byte aligned rows; otherwise ImageToTokenProbsReference.
at::Tensor ImageToTokenProbs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_rows, int64_t heads,
                             double scale, Stream stream = nullptr);
at::Tensor ImageToTokenProbsReference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_rows,
                                      int64_t heads, double scale);
// The image->token step of a two-way block with its LayerNorm: out[b] = LayerNorm(res_b + P_b u_b)
// with P = ImageToTokenProbs(q, k, q_rows, heads, scale) [B, HW, heads * T], u [B, heads * T, D] (the
// prompt's values through the output projection, its bias included), res_b = residual[row] with row
// = residual_rows[b] when defined, else b (residual [B, HW, D]) or 0 (residual [1, HW, D]: one image
// for every prompt), and LayerNorm(weight, bias, eps) over D. Returns [B, HW, D] in q's dtype. CUDA
// kernel for bf16/fp16 with 8 heads of 16 channels, T <= 16, D = 256 and 16-byte aligned rows (the
// probabilities in fp32, rounded to q's dtype as the composition rounds them; P u on the tensor cores
// with fp32 accumulation from the residual; the statistics in fp32, one rounding of the output);
// otherwise the composition ImageToTokenUpdateReference (ImageToTokenProbs, baddbmm, RowNorm:
// roundings to q's dtype between). q_bias [HW, I] (optional, q's dtype): added to every prompt's q
// before the scores (the kernel adds it in fp32 as q is loaded; the composition adds it first).
at::Tensor ImageToTokenUpdate(const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_rows, int64_t heads,
                              double scale, const at::Tensor& u, const at::Tensor& residual,
                              const at::Tensor& residual_rows, const at::Tensor& weight, const at::Tensor& bias,
                              double eps, const at::Tensor& q_bias = at::Tensor(), Stream stream = nullptr);
at::Tensor ImageToTokenUpdateReference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_rows,
                                       int64_t heads, double scale, const at::Tensor& u, const at::Tensor& residual,
                                       const at::Tensor& residual_rows, const at::Tensor& weight,
                                       const at::Tensor& bias, double eps, const at::Tensor& q_bias = at::Tensor());
// softmax(scale q k^T) v for a few queries against many keys: q [N, H, L, C], k and v [N, H, S, C]
// (any strides, last dimension contiguous; the decoder's projections viewed per head). Returns
// [N, L, H, C] contiguous in q's dtype (the layout of out_proj's input), scores, softmax and the
// weighted sum in fp32. CUDA kernel (split over the keys, few_query_attention.cu) when
// FewQueryAttentionFits; otherwise FewQueryAttentionReference.
// kv_rows: k and v have their own batch count G ([G, H, S, C]) and query batch n reads row
// kv_rows[n] of them (FewQueryAttentionRows).
bool FewQueryAttentionFits(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool kv_rows = false);
at::Tensor FewQueryAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                             Stream stream = nullptr);
// The same with k / v [G, H, S, C] shared by query batches: batch n attends to k[kv_rows[n]],
// v[kv_rows[n]] (kv_rows [N] int64 on q's device), read in place by the kernel (the prompts of
// several images against their image's keys, without gathering a copy per prompt). Otherwise
// (CPU, shapes the kernel does not cover) FewQueryAttentionReference on the gathered rows.
at::Tensor FewQueryAttentionRows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& kv_rows, double scale, Stream stream = nullptr);
// The same with biases shared by every batch, so that the decoder's projections need no separate add:
// attention over keys k + k_bias (k_bias [S, H * C], the positional share of the key projection,
// added per key and channel) and values v + v_bias (v_bias [H * C], the value projection's bias);
// either may be undefined, and kv_rows as in FewQueryAttentionRows or undefined. The kernel adds the
// key bias in fp32 as it loads a key and the value bias to the output; otherwise the biases are added
// in fp32 to fp32 copies and FewQueryAttentionReference runs on them.
at::Tensor FewQueryAttentionBiased(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& kv_rows, const at::Tensor& k_bias, const at::Tensor& v_bias,
                                   double scale, Stream stream = nullptr);
at::Tensor FewQueryAttentionReference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale);
// The decoder's token->image attention over each prompt's own keys with the key and value
// projections absorbed (kernels/NOTES.md, "Weight absorption"): for batch n, head h and query l,
//   z[n, l, h, :] = sum_j p_j x[n, j, :],  p = softmax_j(scale (qa[n, h, l, :] . x[n, j, :]
//                                                        + q[n, h, l, :] . k_bias[j, h C : (h + 1) C]))
// qa [N, H, L, D] (Wk_h^T q), q [N, H, L, C], x [N, S, D] (the keys, which are also the values),
// k_bias [S, H * C] (the key projection's positional share and bias) or undefined; any strides with
// the last dimension contiguous, one dtype and device. Returns z [N, L, H, D] contiguous in x's dtype;
// the caller applies Wv_h and the output projection to it. CUDA kernel (absorbed_attention.cu) when
// AbsorbedAttentionFits (bf16 / fp16, H = 8, C = 16, D = 256, L <= 8, 16-byte aligned rows), else
// AbsorbedAttentionReference (fp32 products and softmax, rounded once).
bool AbsorbedAttentionFits(const at::Tensor& qa, const at::Tensor& q, const at::Tensor& x, const at::Tensor& k_bias);
// The shapes the kernel covers, before any tensor exists (the decoder picks its path with it).
bool AbsorbedAttentionShapeSupported(int64_t heads, int64_t head_dim, int64_t dim, int64_t queries,
                                     at::ScalarType dtype, const at::Device& device);
at::Tensor AbsorbedAttention(const at::Tensor& qa, const at::Tensor& q, const at::Tensor& x, const at::Tensor& k_bias,
                             double scale, Stream stream = nullptr);
at::Tensor AbsorbedAttentionReference(const at::Tensor& qa, const at::Tensor& q, const at::Tensor& x,
                                      const at::Tensor& k_bias, double scale);
// The shared decoder's image side of a batch of embeddings, written into `out` [N, HW, C] (N >=
// images.size(), contiguous; rows past the images are left as they are): out[i] = (images[i] +
// channel_bias) as [HW, C], images[i] [C, h, w] (or [1, C, h, w]) with HW = h * w, channel_bias C
// values (the no-mask dense embedding, [1, C, 1, 1] or [C]); everything in out's dtype and device.
// One CUDA launch (up to 64 images each) for bf16/fp16 images that are contiguous or position-major
// ([h, w, C] in memory, as the encoder leaves them), bit-identical to ATen's add then transposing
// copy, which is the path elsewhere.
void ImageSideKeys(const std::vector<at::Tensor>& images, const at::Tensor& channel_bias, at::Tensor& out,
                   Stream stream = nullptr);
// Whether ImageSideKeys's launch reads `image` ([C, h, w] or [1, C, h, w]) where it is: contiguous
// (channel-major) or position-major ([h, w, C] in memory). Any other layout takes ATen's path, an add
// and a transposing copy per image (run 66: ~20 us of host time an image).
bool ImageSideKeysReadsInPlace(const at::Tensor& image);
// For each i: a contiguous tensor of its own holding src[row[i]].narrow(0, first[i], count[i])
// (src [G, K, ...]; the decoder's per-prompt mask logits out of its [G, 4, 256, 256] batch). On
// CUDA all of them are copied by one kernel when every slice is 16-byte aligned; otherwise (and on
// the CPU) by one clone each. Same values either way: a byte copy.
std::vector<at::Tensor> CopySlices(const at::Tensor& src, const std::vector<int64_t>& row,
                                   const std::vector<int64_t>& first, const std::vector<int64_t>& count,
                                   Stream stream = nullptr);

// ---------------------------------------------------------------------------------------------------
// Image pre-processing on the device: Pillow-exact antialiased bilinear resize of uint8 RGB (the
// coefficients of model/io/pil_resize.h, integer arithmetic, so the result is bit-identical to the CPU
// resize), then (x - mean) / std per channel and zero padding to pad_size x pad_size.
//
// rgb: [H, W, 3] uint8 contiguous. out_h/out_w: the resized size (<= pad_size).
// Returns [3, pad_size, pad_size] of out_dtype (float32, bf16 or fp16).
at::Tensor ResizeNormalizePad(const at::Tensor& rgb, int64_t out_h, int64_t out_w, int64_t pad_size,
                              const std::vector<float>& mean, const std::vector<float>& std,
                              at::ScalarType out_dtype, Stream stream = nullptr);
// Reference: model/io/pil_resize.h on the CPU, then the same normalisation in LibTorch.
at::Tensor ResizeNormalizePadReference(const at::Tensor& rgb, int64_t out_h, int64_t out_w,
                                       int64_t pad_size, const std::vector<float>& mean,
                                       const std::vector<float>& std, at::ScalarType out_dtype);

// ---------------------------------------------------------------------------------------------------
// Mask post-processing, SAM's postprocess_masks fused with thresholding and encoding:
//   low-res logits (256 x 256) --bilinear, align_corners=False--> pad_size x pad_size
//   --crop--> input_h x input_w --bilinear--> orig_h x orig_w --> mask = logit > 0
// without materialising any full-size float tensor; per mask also the area, the tight bbox and SAM's
// stability score (count(logit > +1) / count(logit > -1), 1 when both are 0... see below).
//
// logits: [M, 256, 256] float32/bf16/fp16 contiguous. geometry: [M, 4] int32 (input_h, input_w,
//   orig_h, orig_w) per mask, on the logits' device.
struct MaskPostprocessOutput {
  // [M] int64: pixels with logit > 0.
  at::Tensor area;
  // [M, 4] int32: x, y, width, height of the tight box (all 0 for an empty mask).
  at::Tensor bbox;
  // [M] float32: |logit > 1| / |logit > -1| (1.0 when the latter is 0, i.e. an empty mask).
  at::Tensor stability;
  // want_rle: COCO RLE counts (column-major, first run counts zeros, possibly 0), all masks
  //   concatenated, int32 [total]; rle_offsets [M + 1] int64 into it. On the host (CPU tensors).
  //   rle_counts is left undefined when the string below is made and want_rle_counts is false.
  at::Tensor rle_counts;
  at::Tensor rle_offsets;
  // want_rle and want_rle_string on CUDA only (undefined from the reference and otherwise): the same runs as COCO's compressed counts
  // string (pycocotools' rleToString; model/io/rle.h RleCountsToString), all masks concatenated,
  // uint8 [chars] with rle_string_offsets [M + 1] int64. On the host.
  at::Tensor rle_string;
  at::Tensor rle_string_offsets;
  // want_bitmask: [sum(orig_h * orig_w)] uint8 (0/1), each mask row-major at bitmask_offsets[m]
  //   ([M + 1] int64). On the host.
  at::Tensor bitmask;
  at::Tensor bitmask_offsets;
};
// want_rle_counts = false with the string: the host copies only the string (a noisy mask's counts
// take 4 bytes a run across PCIe, its string about 1.5), for callers that need nothing else.
MaskPostprocessOutput MaskPostprocess(const at::Tensor& logits, const at::Tensor& geometry,
                                      int64_t pad_size, bool want_rle, bool want_bitmask,
                                      Stream stream = nullptr, bool want_rle_string = false,
                                      bool want_rle_counts = true);
// Reference: the original's two F.interpolate calls (upsample_bilinear2d) and a CPU encoder.
MaskPostprocessOutput MaskPostprocessReference(const at::Tensor& logits, const at::Tensor& geometry,
                                               int64_t pad_size, bool want_rle, bool want_bitmask);

// ---------------------------------------------------------------------------------------------------
// fp8 (e4m3) linear layers with row-wise scales: Hopper's fp8 tensor cores through at::_scaled_mm
// (CUTLASS's f8f8bf16 row-wise kernel: fp32 accumulation, scales and bf16 bias in the epilogue).
//
// Weights are quantised once per output channel, activations per row at each call:
// q = round_e4m3(clamp(v * fl(1/s), +-448)), s = max|row| * fl(1/448) (the smallest normal scale
// where a row is all zero). e4m3 keeps 3 mantissa bits: each value within 2^-4 relative, so the product's error
// is that of the inputs' rounding, not of the accumulation.
struct Fp8Rows {
  at::Tensor values;  // float8_e4m3fn [M, K]
  at::Tensor scales;  // float32 [M, 1]
};
// x [M, K], any float dtype and device; gelu: quantise at::gelu(x) (erf form, in fp32) instead,
// for the input of the layer after a GELU. CUDA: one pass (fp8.cu), bit-identical to the reference
// without gelu; elsewhere the reference.
Fp8Rows QuantizeRowsFp8(const at::Tensor& x, bool gelu = false, Stream stream = nullptr);
Fp8Rows QuantizeRowsFp8Reference(const at::Tensor& x, bool gelu = false);
struct Fp8Weight {
  at::Tensor values;  // float8_e4m3fn [N, K] (row-major: .t() is the column-major B operand)
  at::Tensor scales;  // float32 [1, N]
};
Fp8Weight QuantizeWeightFp8(const at::Tensor& w);  // w [N, K]
// y [M, N] = (xq * x_scales) @ (wq * w_scales)^T + bias. CUDA (sm_90): at::_scaled_mm, bf16 out
// only (the row-wise kernel writes bf16); K and N multiples of 16. Elsewhere: the reference.
at::Tensor Fp8Linear(const Fp8Rows& x, const Fp8Weight& w, const at::Tensor& bias,
                     at::ScalarType out_dtype);
// The same in fp32 on the dequantised values, any device.
at::Tensor Fp8LinearReference(const Fp8Rows& x, const Fp8Weight& w, const at::Tensor& bias,
                              at::ScalarType out_dtype);
// AddLayerNorm (same arguments and effect on x) with its output quantised to e4m3 rows in the same
// pass, for the qkv / fc1 input of an fp8 encoder: bit for bit QuantizeRowsFp8 of AddLayerNorm's
// output. values: float8_e4m3fn in AddLayerNorm's output shape (padding tokens: zeros);
// scales [tokens, 1]. One CUDA kernel for bf16/fp16 with C = 256 k (k <= 6); otherwise
// AddLayerNorm then QuantizeRowsFp8 (any device).
Fp8Rows AddLayerNormFp8(at::Tensor& x, const at::Tensor& delta, int64_t delta_window, const at::Tensor& weight,
                        const at::Tensor& bias, double eps, int64_t out_window, Stream stream = nullptr);


// ---------------------------------------------------------------------------------------------------
// Linear layers through cuBLASLt with the algorithm chosen by timing (the encoder's qkv, proj, fc1,
// fc2): y [M, N] = x [M, K] @ w [N, K]^T + bias [N], and with gelu GELU of that in cuBLASLt's
// epilogue (its tanh form, what at::_addmm_activation(use_gelu=true) computes on CUDA; on the CPU
// LibTorch's uses the erf form). Written into out ([M, N], unit column stride) when given, else into
// a new tensor; returns it.
//
// CUDA, bf16/fp16 operands of one dtype with a bias of it and unit column strides: the first call of
// a shape outside a CUDA graph capture times cuBLASLt's heuristic candidates (up to 16, four
// launches each, three of them timed) and keeps the fastest for the process; later calls (and
// captures) launch it.
// With SetGemmTuning(false) a new shape gets the heuristic's first (LibTorch's choice: the same
// algorithm on every start); MASKD_GEMM_TUNING_LOG=1 prints each timed choice on stderr. Anything
// else (CPU, fp32, no bias, strided columns): TunedLinearReference.
at::Tensor TunedLinear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, bool gelu,
                       const at::Tensor& out = {}, bool accumulate = false);
// accumulate: out (required) += the product and bias, in place (cuBLASLt's beta = 1 with C = D; the
// encoder's residual adds), then GELU when gelu.
//
// The reference: LibTorch's addmm / _addmm_activation / mm (+ GELU of the same form); with
// accumulate the sum in fp32, rounded once. Any device and dtype.
at::Tensor TunedLinearReference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, bool gelu,
                                const at::Tensor& out = {}, bool accumulate = false);
// One tuned shape: the candidates cuBLASLt offered, the one kept (0 = the heuristic's first), the
// mean time of the first and of the kept one, and the host time the timing took.
struct GemmTuning {
  int64_t m, n, k;
  bool gelu, accumulate;
  int candidates, chosen;
  float first_ms, chosen_ms;
  float tuning_ms;
};
// The shapes tuned so far in this process, in order (empty without CUDA).
std::vector<GemmTuning> GemmTunings();
// Whether TunedLinear times the candidates of shapes it has not seen yet (process-wide; on by
// default in CUDA builds; no effect without CUDA).
void SetGemmTuning(bool on);

}  // namespace maskd::kernels
