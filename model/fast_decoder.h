// SAM's mask decoder restructured for many prompts per image (FastPathOptions::shared_image_decoder).
//
// The original decoder (mask_decoder.*) runs every prompt through the two-way transformer with its
// own copy of the image side: 64 prompts of one image mean 64 copies of the [4096, 256] keys being
// added to the positional encoding, projected, attended over and normalised. This decoder computes
// the same function with the work arranged by what it depends on:
//
//  - Per model (Prepare, once): the positional encoding's share of every projection of "keys + pe"
//    — k_proj(keys + pe) = keys·Wk^T + (pe·Wk^T + bk) — as constant [HW, n] tables, and the three
//    projections that read the same keys in a block (token->image k and v, image->token q) as one
//    concatenated weight: one GEMM instead of three plus two element-wise adds of pe.
//  - Per image (a "group": the prompts of one embedding without a mask input share their whole
//    image-side input, embedding + no-mask dense embedding): the first block's token->image keys and
//    values and its image->token queries. The first block's token->image attention runs all the
//    group's prompts as queries of one attention call against the image's 4096 keys.
//  - Per prompt: everything from the first block's image->token attention on. That attention's
//    output updates the keys with prompt-specific values (its keys and values are the prompt's
//    tokens), so from there each prompt has image-side state of its own; this is where sharing stops.
//    The image->token attention itself has a handful of keys per prompt: its softmax weights are a
//    [4096, heads x T] matrix per prompt, and the value and output projections are folded into one
//    [heads x T, D] matrix per prompt (out_proj(P·V) = P·(V·Wo_h^T) head by head), so the update of
//    the keys is one batched GEMM with the residual as its accumulator, then the LayerNorm.
//  - From 8 prompts a pass, the token->image attentions over the prompts' own keys (block 1's and
//    the final one) run with their key and value projections absorbed (kernels::AbsorbedAttention):
//    q·(Wk_h x + b) = (Wk_h^T q)·x + q·b, and the value projection is applied after the weighted
//    sum, so the [B x 4096, 256] keys are not projected for them (run 60: ahead from 16 prompts).
//  - The upscaling keeps the channels-last transposed convolutions as GEMMs and defers their pixel
//    shuffles to the final [B, masks, 256, 256] logits (the LayerNorm, GELUs and the hypernetwork
//    product do not care about the order of pixels), so no full-resolution activation is permuted.
//
// The arithmetic is the original's up to floating-point reassociation (the pe share of a projection
// is added after the GEMM rather than before it, the image->token output projection is applied
// before the softmax-weighted sum); tests/model_fast_decoder_test.cc bounds the difference against
// the original decoder in fp32 (CPU) and tests/model_fast_decoder_gpu_test.cc in bf16 against fp32.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "model/mask_decoder.h"

namespace maskd {

class SharedImageDecoder {
 public:
  // `decoder` must outlive this object and keep its weights (device and dtype) from here on; a
  // change of either needs a new SharedImageDecoder. dense_pe [1, D, h, w] in the decoder's dtype.
  SharedImageDecoder(MaskDecoderImpl& decoder, const at::Tensor& dense_pe);

  // src_groups [G, D, h, w]: each group's image-side input (embedding + dense prompt embedding);
  // group_of [B] int64 on the decoder's device: the group of each prompt (may be undefined when
  // G == 1); sparse [B, T, D]. Returns what MaskDecoderImpl::forward returns for the per-prompt
  // src = src_groups[group_of].
  MaskDecoderImpl::Output forward(const at::Tensor& src_groups, const at::Tensor& group_of,
                                  const at::Tensor& sparse) const;

  // The image side of a group in the decoder's layout ([G, HW, D], contiguous): done by the caller
  // once per group, so that a CUDA graph can take it as a static input.
  static at::Tensor GroupKeys(const at::Tensor& src_groups);

  // forward() on GroupKeys(src_groups).
  MaskDecoderImpl::Output ForwardKeys(const at::Tensor& group_keys, const at::Tensor& group_of,
                                      const at::Tensor& sparse) const;

 private:
  struct BlockTables {
    at::Tensor w;        // [3I, D]: token->image k_proj, v_proj, image->token q_proj weights
    at::Tensor w_q;      // [I, D]: rows 2I.. of w (image->token q_proj), for the absorbed form
    at::Tensor pe_bias;  // [HW, 3I]: pe·W^T + bias for k and q, the v bias for v
    at::Tensor wo_heads; // [H, I/H, D]: image->token out_proj, split by head
    at::Tensor wo_bias;  // [D]: image->token out_proj bias
  };
  struct FinalTables {
    at::Tensor w;       // [2I, D]: final token->image k_proj, v_proj
    at::Tensor k_bias;  // [HW, I]: pe·Wk^T + bk (the v bias is v_proj's, added by the attention)
  };
  // A token->image attention over the prompts' own keys with its key and value projections absorbed
  // (kernels::AbsorbedAttention): scores qa·x with qa = Wk_h^T q per head, and the output
  // out_proj(v_proj applied to z) = sum_h (Wo_h Wv_h) z_h + (Wo bv + bo) as one linear.
  struct AbsorbedTables {
    at::Tensor wk_heads;  // [H, I/H, D]: k_proj's weight by head
    at::Tensor w_out;     // [D, H * D]: Wo_h Wv_h side by side, h = 0..H-1
    at::Tensor b_out;     // [D]
  };
  static AbsorbedTables Absorb(const DecoderAttentionImpl& attn);
  // q_img and residual: [1, HW, .] (one image for every prompt), [B, HW, .], or the groups'
  // [G, HW, .] with q_rows / residual_rows [B] (int64) naming each prompt's group.
  // q_bias [HW, I]: q_img's positional share when q_img lacks it (the prompts' own keys), else undefined.
  at::Tensor ImageToToken(const TwoWayAttentionBlockImpl& blk, const BlockTables& t, const at::Tensor& q_img,
                          const at::Tensor& q_rows, const at::Tensor& residual, const at::Tensor& residual_rows,
                          const at::Tensor& queries, const at::Tensor& query_pe, const at::Tensor& q_bias) const;
  at::Tensor TokenToImage(const DecoderAttentionImpl& attn, const at::Tensor& q_tokens, const at::Tensor& k,
                          const at::Tensor& v, const at::Tensor& kv_rows = at::Tensor(),
                          const at::Tensor& k_bias = at::Tensor(), const at::Tensor& v_bias = at::Tensor()) const;
  // TokenToImage over the prompts' own keys x [B, HW, D] with the absorbed tables; k_bias [HW, I].
  at::Tensor AbsorbedTokenToImage(const DecoderAttentionImpl& attn, const AbsorbedTables& a,
                                  const at::Tensor& q_tokens, const at::Tensor& x, const at::Tensor& k_bias) const;
  // Whether the attentions over the prompts' own keys x [B, HW, D] take the absorbed form for
  // `tokens` tokens a prompt (B >= absorb_min_prompts_, and on CUDA the kernel's shapes and dtypes).
  bool Absorbs(const at::Tensor& x, int64_t tokens) const;
  at::Tensor Upscale(const at::Tensor& keys, const at::Tensor& hyper_in) const;
  // The mask tokens' hypernetwork MLPs, one per mask token, as one batched GEMM per layer:
  // mask_tokens [B, M, D] -> [B, M, out].
  at::Tensor Hypernetworks(const at::Tensor& mask_tokens) const;

  MaskDecoderImpl& dec_;
  int64_t h_ = 0, w_ = 0, dim_ = 0, internal_ = 0, heads_ = 0;
  std::vector<BlockTables> blocks_;
  FinalTables final_;
  // The absorbed form from this many prompts a pass (MASKD_DECODER_ABSORB, read at construction:
  // "1" -> 1, "0" -> never, otherwise kAbsorbMinPrompts). Run 60 (H100, same binary, A-B-A-B): decode
  // p50 of 1 / 2 / 4 prompts +0.01 ms absorbed, 8 equal, 16 -0.03, 32 -0.07, 64 -0.15, 256 over 32
  // images -0.6 ms.
  static constexpr int64_t kAbsorbMinPrompts = 8;
  int64_t absorb_min_prompts_ = kAbsorbMinPrompts;
  std::vector<AbsorbedTables> absorbed_blocks_;  // per block (block 0's empty: it reads the image side)
  AbsorbedTables absorbed_final_;
  at::Tensor up1_w_, up1_b_, up2_w_, up2_b_;  // channels-last transposed-convolution GEMM operands
  // Per layer of the hypernetwork MLPs: the M tokens' weights stacked [M, in, out] and biases [M, 1, out].
  std::vector<at::Tensor> hyper_w_, hyper_b_;
};

}  // namespace maskd
