// The fused encoder path on CUDA (the AddLayerNorm kernels, the fused attention on the skewed rel-pos
// views, the cuBLASLt GELU epilogue) against the unfused encoder on the same weights and input, in
// bf16, on vit_b's block shapes (768 wide, 12 heads of 64, windows of 14 on a 64x64 grid).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include <torch/cuda.h>
#include <torch/torch.h>

#include "kernels/kernels.h"
#include "model/image_encoder.h"
#include "model/sam.h"
#include "model/sam_config.h"

namespace maskd {
namespace {

double RelL2(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  return (x - y).norm().item<double>() / y.norm().item<double>();
}

// vit_b's encoder cut to three blocks (windowed, windowed, global), random weights from `seed`, in
// bf16 on the GPU.
ImageEncoderViT ThreeBlockVitB(uint64_t seed) {
  SamConfig c = *SamPreset("vit_b");
  c.depth = 3;
  c.global_attn_indexes = {2};
  ImageEncoderViT enc(c);
  RandomizeWeights(*enc, seed);
  enc->to(at::Device(at::kCUDA, 0), at::kBFloat16);
  enc->Prepare();
  return enc;
}

TEST(EncoderFusionCuda, FusedEncoderMatchesUnfusedOnVitBShapes) {
  if (!torch::cuda::is_available() || !kernels::BuiltWithCuda()) GTEST_SKIP() << "no CUDA device";
  torch::NoGradGuard no_grad;
  ImageEncoderViT enc = ThreeBlockVitB(21);
  torch::manual_seed(22);
  const at::Tensor x = torch::randn({2, 3, 1024, 1024}).to(at::Device(at::kCUDA, 0), at::kBFloat16);
  enc->SetAttention(AttentionImpl::kFused);
  enc->SetFusion(false, false);
  const at::Tensor ref = enc->forward(x);
  // The fused kernels with the residual adds in them (residual_in_gemm off until its own check below,
  // so that check's GEMM shapes are first tuned there).
  enc->SetFusion(true, false, false, false, /*residual_in_gemm=*/false);
  const at::Tensor fused = enc->forward(x);
  ASSERT_TRUE(fused.isfinite().all().item<bool>());
  // Same arithmetic up to the LayerNorm's summation order and the rel-pos matmul's (bf16 outputs):
  // differences of a few bf16 ulps that the following blocks carry along.
  const double e_fused = RelL2(fused, ref);
  EXPECT_LE(e_fused, 2e-2);
  enc->SetFusion(true, true, false, false, /*residual_in_gemm=*/false);
  const at::Tensor gelu = enc->forward(x);
  ASSERT_TRUE(gelu.isfinite().all().item<bool>());
  const double e_gelu = RelL2(gelu, ref);
  EXPECT_LE(e_gelu, 3e-2);
  // The fast path's full set (rel-pos terms and windows made in the attention kernel) with the
  // residual adds in the LayerNorm kernels, then in proj's and fc2's epilogues (every block here:
  // the windowed ones are raster): the same function to bf16 rounding, and the epilogue path ran (its
  // accumulating GEMMs were tuned: the first in this process; GEMM tuning is on by default).
  enc->SetFusion(true, true, true, true, /*residual_in_gemm=*/false);
  const at::Tensor in_norm = enc->forward(x);
  const size_t tuned_before = kernels::GemmTunings().size();
  enc->SetFusion(true, true, true, true, /*residual_in_gemm=*/true);
  const at::Tensor in_gemm = enc->forward(x);
  ASSERT_TRUE(in_gemm.isfinite().all().item<bool>());
  const std::vector<kernels::GemmTuning> tuned = kernels::GemmTunings();
  EXPECT_TRUE(std::any_of(tuned.begin() + tuned_before, tuned.end(),
                          [](const kernels::GemmTuning& t) { return t.accumulate; }));
  const double e_residual = RelL2(in_gemm, in_norm);
  EXPECT_LE(e_residual, 1e-2);
  EXPECT_LE(RelL2(in_gemm, ref), 3e-2);
  std::printf("encoder rel L2: residual adds in the GEMM epilogues vs in the norms %.3e\n", e_residual);
  // The bf16 fast path against fp32 arithmetic on the same weights, for scale.
  enc->to(at::kFloat);
  enc->Prepare();
  enc->SetAttention(AttentionImpl::kMath);
  enc->SetFusion(false, false);
  const at::Tensor fp32 = enc->forward(x.to(at::kFloat));
  const double e_bf16 = RelL2(ref, fp32);
  std::printf("encoder rel L2: fused vs unfused bf16 %.3e, +gelu epilogue %.3e, unfused bf16 vs fp32 %.3e, "
              "fused+gelu vs fp32 %.3e\n", e_fused, e_gelu, e_bf16, RelL2(gelu, fp32));
  // Fusion adds no more error than bf16 itself has.
  EXPECT_LE(RelL2(gelu, fp32), 1.5 * e_bf16 + 1e-3);
}

// fp8 linears on the fused path: the norms writing e4m3 rows and adding the residuals
// (fp8_norm_fusion) against the norms writing bf16 that the linears quantise, with the adds in
// separate passes: the same operations in the same order, so the same bits, both with the raster
// windows and the residual in the GEMMs (the fast path's set) and with the padded window layout.
TEST(EncoderFusionCuda, Fp8NormFusionIsBitIdenticalToQuantisingTheNormOutputs) {
  if (!torch::cuda::is_available() || !kernels::BuiltWithCuda()) GTEST_SKIP() << "no CUDA device";
  torch::NoGradGuard no_grad;
  ImageEncoderViT enc = ThreeBlockVitB(31);
  enc->SetAttention(AttentionImpl::kFused);
  for (auto& b : enc->block_list) {
    b->attn->qkv_fast = MakeFp8Linear(b->attn->qkv);
    b->attn->proj_fast = MakeFp8Linear(b->attn->proj);
    b->mlp->lin1_fast = MakeFp8Linear(b->mlp->lin1);
    b->mlp->lin2_fast = MakeFp8Linear(b->mlp->lin2);
  }
  torch::manual_seed(32);
  const at::Tensor x = torch::randn({2, 3, 1024, 1024}).to(at::Device(at::kCUDA, 0), at::kBFloat16);
  auto run = [&](bool norm_fusion) {
    for (auto& b : enc->block_list) b->fp8_norm_fusion = norm_fusion;
    return enc->forward(x);
  };
  at::Tensor fused;
  for (const bool raster : {true, false}) {
    SCOPED_TRACE(raster ? "raster windows, residual in the GEMMs" : "padded window layout");
    enc->SetFusion(true, true, raster, raster, /*residual_in_gemm=*/raster);
    const at::Tensor separate = run(false);
    fused = run(true);
    ASSERT_TRUE(fused.isfinite().all().item<bool>());
    EXPECT_TRUE(at::equal(fused, separate)) << "rel L2 " << RelL2(fused, separate);
  }
  // and fp8 is what ran: not the bf16 encoder's output (the last configuration's)
  for (auto& b : enc->block_list) {
    b->attn->qkv_fast = b->attn->proj_fast = b->mlp->lin1_fast = b->mlp->lin2_fast = nullptr;
  }
  const at::Tensor bf16 = enc->forward(x);
  const double e = RelL2(fused, bf16);
  EXPECT_GT(e, 0.0);
  std::printf("encoder rel L2: fp8 linears vs bf16 %.3e\n", e);
}

// A vit_b global block's attention: cuDNN's attention with the rel-pos terms folded into q/k (what
// the start-up timing may choose per batch size) against the fused kernel with the terms made in it,
// in one piece and in chunks of one image, and both against fp32 arithmetic.
TEST(EncoderFusionCuda, FoldedGlobalAttentionMatchesTheFusedKernel) {
  if (!torch::cuda::is_available() || !kernels::BuiltWithCuda()) GTEST_SKIP() << "no CUDA device";
  torch::NoGradGuard no_grad;
  torch::manual_seed(24);
  RelPosAttention attn(768, 12, 64);
  attn->rel_pos_h.normal_(0, 0.5);
  attn->rel_pos_w.normal_(0, 0.5);
  const at::Tensor x32 = torch::randn({3, 64, 64, 768});
  attn->Prepare();
  attn->impl = AttentionImpl::kMath;
  const at::Tensor ref = attn->forward(x32);  // fp32, on the CPU: the original's arithmetic
  attn->to(at::Device(at::kCUDA, 0), at::kBFloat16);
  attn->Prepare();
  attn->fold_pad_v = false;  // cuDNN with the narrow v, as the engine runs it on CUDA
  attn->flat_linear = true;
  attn->rel_pos_in_kernel = true;
  attn->impl = AttentionImpl::kFused;
  const at::Tensor x = x32.to(at::Device(at::kCUDA, 0), at::kBFloat16);
  const at::Tensor fused = attn->forward(x).cpu();
  attn->folded_batches = {3};
  const at::Tensor folded = attn->forward(x).cpu();
  attn->folded_max_bytes = attn->FoldedBytesPerImage(2);  // one image a chunk
  const at::Tensor chunked = attn->forward(x).cpu();
  ASSERT_TRUE(folded.isfinite().all().item<bool>());
  const double e_fused = RelL2(fused, ref), e_folded = RelL2(folded, ref), e_chunked = RelL2(chunked, folded);
  std::printf("global attention rel L2 vs fp32: fused %.3e, folded %.3e; folded in chunks vs whole %.3e\n",
              e_fused, e_folded, e_chunked);
  EXPECT_LE(RelL2(folded, fused), 1e-2);
  // The folded way rounds the rel-pos terms to bf16: allowed up to twice the fused kernel's error.
  EXPECT_LE(e_folded, 2 * e_fused + 1e-3);
  EXPECT_LE(e_chunked, 2e-3);
}

TEST(EncoderFusionCuda, GeluEpilogueMatchesTanhGelu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::NoGradGuard no_grad;
  torch::manual_seed(23);
  MlpBlock mlp(768, 3072);
  mlp->to(at::Device(at::kCUDA, 0), at::kBFloat16);
  const at::Tensor x = torch::randn({4096, 768}).to(at::Device(at::kCUDA, 0), at::kBFloat16);
  const at::Tensor ref = mlp->lin2->forward(at::gelu(mlp->lin1->forward(x).to(at::kFloat), "tanh").to(at::kBFloat16));
  const at::Tensor out = mlp->ForwardFused(x, true);
  EXPECT_LE(RelL2(out, ref), 1e-2);
  // Which GELU the epilogue computes, measured on fc1 alone in fp32 arithmetic of bf16 inputs.
  const at::Tensor h = at::_addmm_activation(mlp->lin1->bias, x, mlp->lin1->weight.t(), 1, 1, true).to(at::kFloat);
  const at::Tensor pre = at::addmm(mlp->lin1->bias.to(at::kFloat), x.to(at::kFloat), mlp->lin1->weight.t().to(at::kFloat));
  const double d_erf = (h - at::gelu(pre)).abs().max().item<double>();
  const double d_tanh = (h - at::gelu(pre, "tanh")).abs().max().item<double>();
  std::printf("fc1 GELU epilogue: max |diff| vs erf GELU %.3e, vs tanh GELU %.3e (|pre| max %.2f)\n", d_erf,
              d_tanh, pre.abs().max().item<double>());
  EXPECT_LE(std::min(d_erf, d_tanh), 0.1);
}

}  // namespace
}  // namespace maskd
