#include "model/fast_decoder.h"

#include <torch/nn/modules/conv.h>
#include <torch/types.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "kernels/kernels.h"

namespace maskd {

namespace {

// `l` applied to pe ([HW, D], fp32): the positional encoding's share of l(keys + pe), with l's bias.
at::Tensor PeTerm(const at::Tensor& pe, const torch::nn::Linear& l) {
  return at::addmm(l->bias.to(at::kFloat), pe, l->weight.to(at::kFloat).t());
}

at::Tensor Norm(const torch::nn::LayerNorm& n, const at::Tensor& x) {
  return at::layer_norm(x, n->options.normalized_shape(), n->weight, n->bias, n->options.eps());
}

at::Tensor Lin(const torch::nn::Linear& l, const at::Tensor& x) { return at::linear(x, l->weight, l->bias); }

}  // namespace

SharedImageDecoder::SharedImageDecoder(MaskDecoderImpl& decoder, const at::Tensor& dense_pe) : dec_(decoder) {
  torch::NoGradGuard no_grad;
  TORCH_CHECK(dense_pe.dim() == 4 && dense_pe.size(0) == 1, "dense_pe: expected [1, D, h, w]");
  dim_ = dense_pe.size(1);
  h_ = dense_pe.size(2);
  w_ = dense_pe.size(3);
  const int64_t hw = h_ * w_;
  // The pe as the original adds it: in the decoder's dtype.
  const at::Tensor pe = dense_pe.flatten(2).transpose(1, 2)[0].to(at::kFloat);  // [HW, D]
  auto& tr = *dec_.transformer;
  TORCH_CHECK(!tr.layer_list.empty(), "the decoder has no two-way blocks");
  for (auto& blk : tr.layer_list) {
    auto& t2i = *blk->cross_attn_token_to_image;
    auto& i2t = *blk->cross_attn_image_to_token;
    internal_ = t2i.q_proj->weight.size(0);
    heads_ = t2i.num_heads;
    TORCH_CHECK(i2t.q_proj->weight.size(0) == internal_ && i2t.num_heads == heads_,
                "the two cross attentions of a block differ in width or heads");
    const auto dt = t2i.k_proj->weight.scalar_type();
    BlockTables t;
    t.w = at::cat({t2i.k_proj->weight, t2i.v_proj->weight, i2t.q_proj->weight}, 0).contiguous();
    t.w_q = t.w.narrow(0, 2 * internal_, internal_);
    t.pe_bias = at::cat({PeTerm(pe, t2i.k_proj), t2i.v_proj->bias.to(at::kFloat).unsqueeze(0).expand({hw, internal_}),
                         PeTerm(pe, i2t.q_proj)},
                        1)
                    .to(dt)
                    .contiguous();
    const at::Tensor& wo = i2t.out_proj->weight;  // [D, I], columns (head, channel)
    t.wo_heads = wo.view({dim_, heads_, internal_ / heads_}).permute({1, 2, 0}).contiguous();
    t.wo_bias = i2t.out_proj->bias;
    blocks_.push_back(std::move(t));
  }
  auto& fin = *tr.final_attn_token_to_image;
  final_.w = at::cat({fin.k_proj->weight, fin.v_proj->weight}, 0).contiguous();
  final_.k_bias = PeTerm(pe, fin.k_proj).to(fin.k_proj->weight.scalar_type()).contiguous();
  // MASKD_DECODER_ABSORB (a same-binary comparison knob): "1" every pass, "0" none, unset or any
  // other value: passes of kAbsorbMinPrompts prompts or more (kernels/NOTES.md has the runs).
  const char* absorb = std::getenv("MASKD_DECODER_ABSORB");
  absorb_min_prompts_ = absorb != nullptr && std::strcmp(absorb, "1") == 0   ? 1
                        : absorb != nullptr && std::strcmp(absorb, "0") == 0 ? std::numeric_limits<int64_t>::max()
                                                                              : kAbsorbMinPrompts;
  if (absorb_min_prompts_ != std::numeric_limits<int64_t>::max()) {
    // Block 0 reads the groups' image side (never the prompts' own keys): no tables for it.
    for (size_t i = 0; i < tr.layer_list.size(); ++i)
      absorbed_blocks_.push_back(i == 0 ? AbsorbedTables{} : Absorb(*tr.layer_list[i]->cross_attn_token_to_image));
    absorbed_final_ = Absorb(fin);
  }

  const auto conv1 = dec_.output_upscaling->ptr<torch::nn::ConvTranspose2dImpl>(0);
  const auto conv2 = dec_.output_upscaling->ptr<torch::nn::ConvTranspose2dImpl>(3);
  TORCH_CHECK(conv1 && conv2 && dec_.output_upscaling->ptr<LayerNorm2dImpl>(1), "unexpected output_upscaling layout");
  // A k=2, s=2 transposed convolution is one GEMM per input pixel: x[Cin] . W[Cin, (dy, dx, o)].
  auto gemm_weight = [](const torch::nn::ConvTranspose2dImpl& c) {
    return c.weight.permute({0, 2, 3, 1}).reshape({c.weight.size(0), 4 * c.weight.size(1)}).contiguous();
  };
  up1_w_ = gemm_weight(*conv1);
  up1_b_ = conv1->bias.repeat({4});
  up2_w_ = gemm_weight(*conv2);
  up2_b_ = conv2->bias.repeat({4});

  // A click's decode is ~150 small kernels (run 36's profile: 0.44 ms of kernels, 46 of them GEMMs);
  // the 4 hypernetwork MLPs were 12 GEMMs and 8 ReLUs, now 3 batched GEMMs and 2 ReLUs.
  const auto& hyper = dec_.hypernetwork_list;
  TORCH_CHECK(!hyper.empty(), "the decoder has no hypernetwork MLPs");
  for (size_t l = 0; l < hyper.front()->layer_list.size(); ++l) {
    std::vector<at::Tensor> w, b;
    for (const auto& mlp : hyper) {
      TORCH_CHECK(mlp->layer_list.size() == hyper.front()->layer_list.size(), "hypernetwork MLPs of unequal depth");
      w.push_back(mlp->layer_list[l]->weight.t());
      b.push_back(mlp->layer_list[l]->bias.unsqueeze(0));
    }
    hyper_w_.push_back(at::stack(w, 0).contiguous());
    hyper_b_.push_back(at::stack(b, 0).contiguous());
  }
}

SharedImageDecoder::AbsorbedTables SharedImageDecoder::Absorb(const DecoderAttentionImpl& attn) {
  const at::Tensor& wk = attn.k_proj->weight;  // [I, D]
  const int64_t heads = attn.num_heads, internal = wk.size(0), dim = wk.size(1), c = internal / heads;
  const auto dt = wk.scalar_type();
  const at::Tensor wo = attn.out_proj->weight.to(at::kFloat);  // [Dout, I], columns (head, channel)
  const at::Tensor wv = attn.v_proj->weight.to(at::kFloat);    // [I, D], rows (head, channel)
  TORCH_CHECK(wv.size(1) == dim && wo.size(1) == internal, "absorbed attention: k_proj and v_proj read different widths");
  const int64_t dout = wo.size(0);
  AbsorbedTables a;
  a.wk_heads = wk.view({heads, c, dim}).contiguous();
  // Products in fp32, rounded once to the decoder's dtype.
  a.w_out = at::bmm(wo.view({dout, heads, c}).permute({1, 0, 2}), wv.view({heads, c, dim}))  // [H, Dout, D]
                .permute({1, 0, 2})
                .reshape({dout, heads * dim})
                .to(dt)
                .contiguous();
  a.b_out = (at::mv(wo, attn.v_proj->bias.to(at::kFloat)) + attn.out_proj->bias.to(at::kFloat)).to(dt);
  return a;
}

bool SharedImageDecoder::Absorbs(const at::Tensor& x, int64_t tokens) const {
  if (x.size(0) < absorb_min_prompts_) return false;
  return !x.is_cuda() || kernels::AbsorbedAttentionShapeSupported(heads_, internal_ / heads_, dim_, tokens,
                                                                  x.scalar_type(), x.device());
}

at::Tensor SharedImageDecoder::AbsorbedTokenToImage(const DecoderAttentionImpl& attn, const AbsorbedTables& a,
                                                    const at::Tensor& q_tokens, const at::Tensor& x,
                                                    const at::Tensor& k_bias) const {
  // q·(Wk_h x_j + k_bias_j,h) = (Wk_h^T q)·x_j + q·k_bias_j,h, and sum_j p_j (Wv_h x_j + bv_h) =
  // Wv_h (sum_j p_j x_j) + bv_h (a softmax row sums to 1): the attention runs on x itself.
  const int64_t n = q_tokens.size(0), l = q_tokens.size(1), c = internal_ / heads_;
  const at::Tensor q = Lin(attn.q_proj, q_tokens);  // [N, L, I]
  const at::Tensor qa = at::bmm(q.reshape({n * l, heads_, c}).transpose(0, 1), a.wk_heads)  // [H, N L, D]
                            .view({heads_, n, l, dim_})
                            .permute({1, 0, 2, 3});
  const at::Tensor z = kernels::AbsorbedAttention(qa, q.view({n, l, heads_, c}).transpose(1, 2), x, k_bias,
                                                  1.0 / std::sqrt(static_cast<double>(c)));  // [N, L, H, D]
  return at::linear(z.view({n, l, heads_ * dim_}), a.w_out, a.b_out);
}

at::Tensor SharedImageDecoder::Hypernetworks(const at::Tensor& mask_tokens) const {
  at::Tensor x = mask_tokens.transpose(0, 1);  // [M, B, D]
  for (size_t l = 0; l < hyper_w_.size(); ++l) {
    x = at::baddbmm(hyper_b_[l], x, hyper_w_[l]);
    if (l + 1 < hyper_w_.size()) x = at::relu_(x);
  }
  return x.transpose(0, 1);  // [B, M, out]
}

at::Tensor SharedImageDecoder::GroupKeys(const at::Tensor& src_groups) {
  return src_groups.flatten(2).transpose(1, 2).contiguous();
}

MaskDecoderImpl::Output SharedImageDecoder::forward(const at::Tensor& src_groups, const at::Tensor& group_of,
                                                    const at::Tensor& sparse) const {
  return ForwardKeys(GroupKeys(src_groups), group_of, sparse);
}

at::Tensor SharedImageDecoder::TokenToImage(const DecoderAttentionImpl& attn, const at::Tensor& q_tokens,
                                            const at::Tensor& k, const at::Tensor& v, const at::Tensor& kv_rows,
                                            const at::Tensor& k_bias, const at::Tensor& v_bias) const {
  // q_tokens [N, L, D] (with their pe), k / v [N, HW, I] (projected, possibly strided views), or
  // [G, HW, I] with kv_rows [N] naming each prompt's row; k_bias [HW, I] and v_bias [I]: what the
  // projections still lack (their positional share and bias), or undefined.
  const int64_t n = q_tokens.size(0), l = q_tokens.size(1), hw = k.size(1), c = internal_ / heads_;
  const at::Tensor q = Lin(attn.q_proj, q_tokens).view({n, l, heads_, c}).transpose(1, 2);
  const at::Tensor kh = k.view({k.size(0), hw, heads_, c}).transpose(1, 2);
  const at::Tensor vh = v.view({v.size(0), hw, heads_, c}).transpose(1, 2);
  if (!kv_rows.defined() && !k_bias.defined() && !v_bias.defined()) {
    // The few-query kernel where it fits (a prompt's few tokens against the 4096 positions, split over
    // the keys), else SDPA or the original's math.
    return Lin(attn.out_proj, attn.Attend(q, kh, vh));
  }
  // Prompts of several images: the kernel reads each prompt's image rows in place (run 27, H200:
  // gathering a copy of k and v per prompt cost 0.21 ms for 64 prompts over 16 images), and adds the
  // biases as it loads the keys and writes the output (no pass over the [N, HW, I] projections).
  if (attn.few_query_kernel && kernels::FewQueryAttentionFits(q, kh, vh, kv_rows.defined()))
    return Lin(attn.out_proj, kernels::FewQueryAttentionBiased(q, kh, vh, kv_rows, k_bias, v_bias,
                                                               1.0 / std::sqrt(static_cast<double>(c)))
                                  .view({n, l, internal_}));
  // Elsewhere (CPU, other shapes): the rows gathered and the biases added first.
  at::Tensor kk = kv_rows.defined() ? kh.index_select(0, kv_rows) : kh;
  at::Tensor vv = kv_rows.defined() ? vh.index_select(0, kv_rows) : vh;
  if (k_bias.defined()) kk = kk + k_bias.view({hw, heads_, c}).transpose(0, 1);
  if (v_bias.defined()) vv = vv + v_bias.view({heads_, 1, c});
  return Lin(attn.out_proj, attn.Attend(q, kk, vv));
}

at::Tensor SharedImageDecoder::ImageToToken(const TwoWayAttentionBlockImpl& blk, const BlockTables& t,
                                            const at::Tensor& q_img, const at::Tensor& q_rows,
                                            const at::Tensor& residual, const at::Tensor& residual_rows,
                                            const at::Tensor& queries, const at::Tensor& query_pe,
                                            const at::Tensor& q_bias) const {
  // Per prompt b: keys' = norm4(residual_b + out_proj(softmax(q_img_b k_b^T / sqrt(c)) v_b)), with k_b / v_b
  // the prompt's T tokens projected. out_proj(P V) + bias = sum over heads h of P_h (V_h Wo_h^T) + bias:
  // U_b [(h, t), D] = V_b,h Wo_h^T + bias / H (each head's softmax row sums to 1, so the bias comes out
  // once), and the update is residual_b + P_b U_b with P_b [HW, (h, t)]: one batched GEMM.
  auto& i2t = *blk.cross_attn_image_to_token;
  const int64_t b = queries.size(0), tt = queries.size(1), c = internal_ / heads_;
  const at::Tensor kt = Lin(i2t.k_proj, queries + query_pe);  // [B, T, I]
  const at::Tensor vt = Lin(i2t.v_proj, queries);             // [B, T, I]
  at::Tensor u = at::bmm(vt.reshape({b * tt, heads_, c}).transpose(0, 1), t.wo_heads);  // [H, B*T, D]
  u = u.view({heads_, b, tt, dim_}).permute({1, 0, 2, 3}).reshape({b, heads_ * tt, dim_});
  u = u + t.wo_bias / static_cast<double>(heads_);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c));
  // Scores, softmax, residual + P_b U_b and norm4 in one pass over the rows on CUDA (CPU and other
  // shapes: ImageToTokenProbs, baddbmm, RowNorm). The residual is read where it is: the image's one
  // row of keys for all its prompts, a group's row (residual_rows), or the prompt's own keys.
  auto& n4 = blk.norm4;
  return kernels::ImageToTokenUpdate(q_img, kt, q_rows, heads_, scale, u, residual, residual_rows, n4->weight,
                                     n4->bias, n4->options.eps(), q_bias);
}

MaskDecoderImpl::Output SharedImageDecoder::ForwardKeys(const at::Tensor& group_keys, const at::Tensor& group_of,
                                                        const at::Tensor& sparse) const {
  const int64_t g = group_keys.size(0), b = sparse.size(0), hw = h_ * w_;
  TORCH_CHECK(group_keys.dim() == 3 && group_keys.size(1) == hw && group_keys.size(2) == dim_,
              "group keys: expected [G, ", hw, ", ", dim_, "]");
  TORCH_CHECK(g == 1 || (group_of.defined() && group_of.numel() == b), "group_of: expected one group per prompt");
  const at::Tensor output_tokens = at::cat({dec_.iou_token->weight, dec_.mask_tokens->weight}, 0);
  const at::Tensor tokens =
      at::cat({output_tokens.unsqueeze(0).expand({b, -1, -1}), sparse.to(output_tokens.scalar_type())}, 1);
  const at::Tensor& query_pe = tokens;
  at::Tensor queries = tokens;
  auto& tr = *dec_.transformer;
  const int64_t tt = tokens.size(1);

  // The first block reads the group's image side; every later one the prompt's own keys.
  at::Tensor keys;  // [B, HW, D] once per prompt
  for (size_t i = 0; i < tr.layer_list.size(); ++i) {
    auto& blk = *tr.layer_list[i];
    const BlockTables& t = blocks_[i];
    if (blk.skip_first_layer_pe) {
      queries = blk.self_attn->forward(queries, queries, queries);
    } else {
      const at::Tensor q = queries + query_pe;
      queries = queries + blk.self_attn->forward(q, q, queries);
    }
    queries = Norm(blk.norm1, queries);
    const bool group_level = !keys.defined();
    const at::Tensor& x = group_level ? group_keys : keys;
    // The prompts' own keys, in a pass of enough prompts (Absorbs): the token->image attention runs on
    // x itself (AbsorbedTokenToImage) and the GEMM makes only the image->token q.
    const bool absorbed = !group_level && Absorbs(x, tt);
    // token->image k, v and image->token q of this block from one GEMM. Their positional shares and
    // biases (the table): added to the group's few rows here; for the prompts' own keys (B x 4096
    // rows) the kernels that read k, v and q add them as they load (FewQueryAttentionBiased,
    // ImageToTokenUpdate's q_bias), which saves a read and a write of the [B, HW, 3I] projection.
    at::Tensor y = at::linear(x, absorbed ? t.w_q : t.w);  // [N, HW, 3I] ([N, HW, I] absorbed)
    at::Tensor k_bias, v_bias, q_bias;
    if (group_level) {
      kernels::AddRowsBroadcast(y, t.pe_bias);
    } else {
      k_bias = t.pe_bias.narrow(1, 0, internal_);
      v_bias = blk.cross_attn_token_to_image->v_proj->bias;
      q_bias = t.pe_bias.narrow(1, 2 * internal_, internal_);
    }
    const at::Tensor q_img = absorbed ? y : y.narrow(2, 2 * internal_, internal_);
    const at::Tensor k = absorbed ? at::Tensor() : y.narrow(2, 0, internal_),
                     v = absorbed ? at::Tensor() : y.narrow(2, internal_, internal_);
    const at::Tensor q_tokens = queries + query_pe;
    at::Tensor attn;
    if (absorbed) {
      attn = AbsorbedTokenToImage(*blk.cross_attn_token_to_image, absorbed_blocks_[i], q_tokens, x, k_bias);
    } else if (group_level && g == 1) {
      // Every prompt's tokens are queries of one attention over the image's keys.
      attn = TokenToImage(*blk.cross_attn_token_to_image, q_tokens.reshape({1, b * tt, dim_}), k, v)
                 .view({b, tt, dim_});
    } else {
      attn = TokenToImage(*blk.cross_attn_token_to_image, q_tokens, k, v, group_level ? group_of : at::Tensor(),
                          k_bias, v_bias);
    }
    queries = Norm(blk.norm2, queries + attn);
    queries = Norm(blk.norm3, queries + blk.mlp->forward(queries));
    // With one image, x's and q_img's one row serve every prompt; with several, group_of names each
    // prompt's row of both. Later blocks: the prompt's own keys.
    const at::Tensor rows = group_level && g > 1 ? group_of : at::Tensor();
    keys = ImageToToken(blk, t, q_img, rows, x, rows, queries, query_pe, q_bias);
  }
  {
    // The prompts' own keys: the positional share and the bias added by the attention kernel.
    auto& fin = *tr.final_attn_token_to_image;
    at::Tensor attn;
    if (Absorbs(keys, tt)) {
      attn = AbsorbedTokenToImage(fin, absorbed_final_, queries + query_pe, keys, final_.k_bias);
    } else {
      const at::Tensor y = at::linear(keys, final_.w);  // [B, HW, 2I]
      attn = TokenToImage(fin, queries + query_pe, y.narrow(2, 0, internal_), y.narrow(2, internal_, internal_),
                          at::Tensor(), final_.k_bias, fin.v_proj->bias);
    }
    queries = Norm(tr.norm_final_attn, queries + attn);
  }
  const int64_t m = dec_.num_mask_tokens;
  const at::Tensor iou_token_out = queries.select(1, 0);
  const at::Tensor mask_tokens_out = queries.slice(1, 1, 1 + m);
  return {Upscale(keys, Hypernetworks(mask_tokens_out)), dec_.iou_prediction_head->forward(iou_token_out)};
}

at::Tensor SharedImageDecoder::Upscale(const at::Tensor& keys, const at::Tensor& hyper_in) const {
  // keys [B, HW, D] -> conv1 as a GEMM: rows (b, y, x), columns (dy, dx, c1) -> rows (b, y, x, dy, dx)
  // -> LayerNorm2d + GELU -> conv2: rows (b, y, x, dy, dx, ddy, ddx) -> GELU -> hypernetwork product.
  // The pixel order is fixed once, on the [B, masks, 4h, 4w] result: pixel (4y + 2dy + ddy, 4x + 2dx + ddx).
  const int64_t b = keys.size(0), c1 = up1_w_.size(1) / 4;
  const auto norm = dec_.output_upscaling->ptr<LayerNorm2dImpl>(1);
  const at::Tensor x = at::addmm(up1_b_, keys.reshape({b * h_ * w_, dim_}), up1_w_).view({-1, c1});
  // LayerNorm2d + GELU as each row is loaded, conv2 + GELU and the hypernetwork product in one kernel
  // on CUDA (kernels::UpscaleHyper; elsewhere RowNorm first).
  return kernels::UpscaleHyper(x, up2_w_, up2_b_, hyper_in, h_, w_, {norm->weight, norm->bias, norm->eps});
}

}  // namespace maskd
