// SAM's image encoder: a ViT with windowed attention, global attention at configured blocks,
// decomposed relative position bias, and a convolutional neck — in the C++ frontend idiom, with the
// parameters registered under the official state_dict names (image_encoder.*).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <vector>

#include "model/api/enums.h"
#include "model/fast_linear.h"
#include "model/sam_config.h"

namespace maskd {

// Channel-wise LayerNorm over NCHW (SAM's LayerNorm2d, eps 1e-6), computed as the original does.
struct LayerNorm2dImpl : torch::nn::Module {
  explicit LayerNorm2dImpl(int64_t channels, double eps = 1e-6);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight, bias;
  double eps;
};
TORCH_MODULE(LayerNorm2d);

struct PatchEmbedImpl : torch::nn::Module {
  PatchEmbedImpl(int64_t patch, int64_t in_chans, int64_t embed_dim);
  // [B, 3, H, W] -> [B, H/patch, W/patch, embed_dim]
  at::Tensor forward(const at::Tensor& x);
  // The same function as one GEMM over the non-overlapping patches (the im2col is a permuting copy),
  // the bias in its epilogue: [B, H/patch, W/patch, embed_dim] contiguous (forward's result is a
  // permuted view). H and W must be multiples of the patch size (SAM pads the image to img_size).
  at::Tensor ForwardRows(const at::Tensor& x);
  torch::nn::Conv2d proj{nullptr};
};
TORCH_MODULE(PatchEmbed);

struct MlpBlockImpl : torch::nn::Module {
  MlpBlockImpl(int64_t dim, int64_t hidden);
  at::Tensor forward(const at::Tensor& x);
  // The fused path: with gelu_epilogue (and no fp8 replacement), fc1's bias + GELU run in the
  // cuBLASLt epilogue (its tanh approximation of GELU) and fc2's bias in its epilogue; otherwise
  // the same as forward. The hidden activation is made and consumed in row chunks of at most
  // max_hidden_bytes (vit_h at batch 32: 1.3 GB in one piece, the encoder's largest tensor), each
  // chunk's fc2 writing its rows of the output in place; every output row is the same two GEMM rows.
  // With `residual` (contiguous, x's rows by dim) fc2 adds to it in place in its epilogue (beta = 1)
  // and it is returned.
  // With `xq` (x as e4m3 rows, lin1_fast taking them: kernels::AddLayerNormFp8's output) fc1 reads
  // those, and x gives only the shape.
  at::Tensor ForwardFused(const at::Tensor& x, bool gelu_epilogue, int64_t max_hidden_bytes = kMaxHiddenBytes,
                          const at::Tensor& residual = {}, const kernels::Fp8Rows* xq = nullptr);
  static constexpr int64_t kMaxHiddenBytes = int64_t{256} << 20;
  torch::nn::Linear lin1{nullptr}, lin2{nullptr};
  std::shared_ptr<FastLinear> lin1_fast, lin2_fast;
};
TORCH_MODULE(MlpBlock);

// Multi-head attention with SAM's decomposed relative position bias, over a (grid x grid) token
// grid (a window, or the whole image for global blocks). Several numerically equivalent ways to
// compute it (AttentionImpl); kMath is the original's arithmetic.
struct RelPosAttentionImpl : torch::nn::Module {
  RelPosAttentionImpl(int64_t dim, int64_t num_heads, int64_t grid);
  // [B, grid, grid, dim] -> same
  at::Tensor forward(const at::Tensor& x);
  // The same, with `residual` ([B, grid, grid, dim], contiguous) defined: the output is added to it
  // in place (with flat_linear in proj's epilogue) and it is returned.
  // With `xq` (flat_linear, qkv_fast taking e4m3 rows) qkv reads x's e4m3 rows instead and x gives
  // only the shape.
  at::Tensor Forward(const at::Tensor& x, const at::Tensor& residual, const kernels::Fp8Rows* xq = nullptr);
  // A windowed block (grid = window) on the raster [B, H, W, dim] tokens, -> same: qkv and proj on
  // the H x W tokens only, the windows (SAM's zero padding included) made in the fused kernel's
  // indexing (kernels::RelPosWindowAttentionFromTables). Needs impl kFused. `residual` and `xq` as in
  // Forward.
  at::Tensor ForwardRasterWindows(const at::Tensor& x, const at::Tensor& residual = {},
                                  const kernels::Fp8Rows* xq = nullptr);
  // Derives the tables the fast paths need (R_h/R_w lookups, one-hot key indicators) for the
  // current dtype/device; call after loading weights and after every .to().
  void Prepare();
  // The attention itself, without qkv and proj: q, k, v [B, heads, N, hd] (views of qkv's output)
  // -> [B, N, heads, hd] (possibly a permuted view), computed the way `use` says. Forward calls it
  // with ImplFor(B); the engine calls it to time the ways against each other (ChooseGlobalAttention).
  at::Tensor Attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, AttentionImpl use) const;
  // impl, except that with impl kFused a batch size listed in folded_batches runs kSdpaFolded.
  AttentionImpl ImplFor(int64_t batch) const;
  // The workspace one image of kSdpaFolded needs (q', k', the rel-pos terms' product, q * scale), in bytes.
  int64_t FoldedBytesPerImage(size_t element_size) const;

  torch::nn::Linear qkv{nullptr}, proj{nullptr};
  at::Tensor rel_pos_h, rel_pos_w;
  std::shared_ptr<FastLinear> qkv_fast, proj_fast;
  AttentionImpl impl = AttentionImpl::kMath;
  // kSdpaFolded: zero-pad v to the augmented q/k width so that the generic SDPA dispatcher can
  // use flash (which wants equal widths); false on CUDA calls cuDNN's attention with the narrow v.
  bool fold_pad_v = true;
  // With impl kFused: the batch sizes at which this block's attention runs as kSdpaFolded instead
  // (cuDNN's attention with the rel-pos terms folded into q and k), because it was measured faster
  // there (EngineImpl::ChooseGlobalAttention). Empty: the fused kernel at every size.
  std::vector<int64_t> folded_batches;
  // kSdpaFolded builds q' and k' (head_dim + 2 grid wide) and the rel-pos terms: the batch runs in
  // chunks of images whose workspace stays under this many bytes (vit_h at batch 32 would need
  // ~3 GB in one piece; the memory target for it is 4 GiB in all).
  int64_t folded_max_bytes = int64_t{256} << 20;
  // kFused: the rel-pos terms as one matmul read through skewed views (kernels::RelPosTables)
  // instead of two einsums over gathered tables.
  bool rel_pos_gemm = false;
  // The fused kernel makes the rel-pos terms itself from rev_tables_ (kernels::RelPosAttentionFromTables).
  bool rel_pos_in_kernel = false;
  // qkv and proj as 2-D GEMMs over all tokens ([B*H*W, C]): at::linear folds only 2-D/3-D inputs
  // into one addmm with the bias in the cuBLASLt epilogue; a 4-D input gets a matmul and a separate
  // broadcast bias add. Set with the fused path (the unfused one keeps the original's arithmetic).
  bool flat_linear = false;
  int64_t num_heads, head_dim, grid;

 private:
  // q . R_h and q . R_w of the unscaled q [B, heads, N, hd] -> [B, heads, N, grid] each.
  void RelTables(const at::Tensor& q, at::Tensor* rel_h, at::Tensor* rel_w) const;
  // kSdpaFolded on the images of q, k, v ([b, heads, N, hd]) -> [b, heads, N, hd] (any strides).
  at::Tensor FoldedChunk(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const;
  // kSdpaFolded's q' / k' width: head_dim + 2 grid term / indicator columns, a multiple of 8.
  int64_t FoldedWidth() const { return (head_dim + 2 * grid + 7) / 8 * 8; }
  at::Tensor Rh_, Rw_;       // [grid, grid, head_dim] in the module dtype
  at::Tensor rev_tables_;    // [(2 grid - 1) * 2, head_dim]: rel_pos_gemm, the fused kernel, kSdpaFolded
  at::Tensor key_onehot_;    // [grid^2, folded width - head_dim]: k's indicator columns for kSdpaFolded
};
TORCH_MODULE(RelPosAttention);

struct EncoderBlockImpl : torch::nn::Module {
  EncoderBlockImpl(const SamConfig& c, int64_t window_size);
  at::Tensor forward(const at::Tensor& x);
  // The same block with its element-wise work in two fused kernels (kernels::AddLayerNorm):
  // x is the residual stream [B, H, W, C], contiguous, updated in place; `pending` (undefined for
  // the first block) is the previous block's MLP output, added here instead of in that block.
  // Returns this block's MLP output, still to be added to x; with residual_in_gemm (and the
  // attention's output in the raster layout) proj and fc2 add to x themselves and it returns an
  // undefined tensor.
  at::Tensor ForwardFused(at::Tensor& x, const at::Tensor& pending, bool gelu_epilogue);
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  RelPosAttention attn{nullptr};
  MlpBlock mlp{nullptr};
  int64_t window_size;  // 0 = global attention
  // Fused path, windowed block: attention on the raster tokens (RelPosAttentionImpl::
  // ForwardRasterWindows) instead of on AddLayerNorm's padded window layout.
  bool raster_windows = false;
  // Fused path: the residual adds in proj's and fc2's epilogues (cuBLASLt, beta = 1) instead of in
  // the AddLayerNorm kernels, for blocks whose attention output is raster (global, raster windows).
  bool residual_in_gemm = false;
  // Fused path with fp8 linears (qkv and fc1 taking e4m3 rows): the norms write their outputs as
  // e4m3 rows (kernels::AddLayerNormFp8) instead of bf16 that the linears quantise again, and the
  // residual adds stay in the norms (the fp8 GEMM has no accumulating epilogue: in "the GEMM" they
  // were separate element-wise passes). Bit-identical to the path without it; off to test that and,
  // with MASKD_FP8_NORM_FUSION=0 (the default of every block built after it is read), to time it.
  bool fp8_norm_fusion = true;
};
TORCH_MODULE(EncoderBlock);

struct ImageEncoderViTImpl : torch::nn::Module {
  explicit ImageEncoderViTImpl(const SamConfig& c);
  // [B, 3, img, img] normalised and padded -> [B, out_chans, grid, grid]
  at::Tensor forward(const at::Tensor& x);
  void SetAttention(AttentionImpl impl);
  void Prepare();
  // The fused block path (EncoderBlockImpl::ForwardFused, rel-pos terms as one matmul) and, on top
  // of it, fc1's GELU in the GEMM epilogue. Numerically the unfused arithmetic except the GELU
  // epilogue (tanh approximation).
  // residual_in_gemm: EncoderBlockImpl::residual_in_gemm for every block (with fused_ops).
  void SetFusion(bool fused_ops, bool gelu_epilogue, bool rel_pos_in_kernel = false,
                 bool windows_in_kernel = false, bool residual_in_gemm = true);
  bool fused_ops = false;
  bool gelu_epilogue = false;

  PatchEmbed patch_embed{nullptr};
  at::Tensor pos_embed;
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::Sequential neck{nullptr};
  std::vector<EncoderBlock> block_list;
};
TORCH_MODULE(ImageEncoderViT);

// SAM's get_rel_pos: the relative position table resized (linear interpolation) to 2*max(q,k)-1 rows
// if needed, then gathered to [q_size, k_size, C].
at::Tensor GetRelPos(int64_t q_size, int64_t k_size, const at::Tensor& rel_pos);

}  // namespace maskd
