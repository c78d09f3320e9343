// The fused encoder path (AddLayerNorm with the window layouts, the rel-pos terms as one matmul, the
// deferred residual of each block's MLP) against SAM's unfused blocks, on the CPU in fp32 where the
// fused kernels run their LibTorch references: this checks the composition (layouts, padding,
// the order of the residual adds), the GPU tests check each kernel against its reference.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "model/image_encoder.h"
#include "model/sam.h"
#include "model/sam_config.h"

namespace maskd {
namespace {

double MaxAbs(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// A small encoder whose 10x10 token grid pads to 12x12 in windows of 4 (so padding tokens take part
// in windowed attention), with a global block between windowed ones.
SamConfig SmallConfig() {
  SamConfig c = *SamPreset("tiny");
  c.img_size = 160;
  c.patch_size = 16;
  c.embed_dim = 32;
  c.num_heads = 2;
  c.mlp_dim = 64;
  c.out_chans = 16;
  c.depth = 3;
  c.window_size = 4;
  c.global_attn_indexes = {1};
  return c;
}

TEST(EncoderFusion, FusedBlocksEqualTheUnfusedEncoder) {
  torch::NoGradGuard no_grad;
  ImageEncoderViT enc(SmallConfig());
  RandomizeWeights(*enc, 11);
  enc->Prepare();
  torch::manual_seed(12);
  const at::Tensor x = torch::randn({2, 3, 160, 160});
  enc->SetAttention(AttentionImpl::kMath);
  enc->SetFusion(false, false);
  const at::Tensor ref = enc->forward(x);
  ASSERT_EQ(ref.sizes(), (std::vector<int64_t>{2, 16, 10, 10}));
  // The fused kernel's CPU path is its reference; with the fused block path it reads the skewed
  // rel-pos views.
  for (AttentionImpl impl : {AttentionImpl::kMath, AttentionImpl::kFused}) {
    enc->SetAttention(impl);
    enc->SetFusion(true, false);
    const at::Tensor fused = enc->forward(x);
    EXPECT_LT(MaxAbs(fused, ref), 1e-4) << AttentionImplName(impl);
    // The fused path must not be the unfused one in disguise: the flag reaches the blocks.
    EXPECT_TRUE(enc->block_list[0]->attn->rel_pos_gemm);
  }
  enc->SetAttention(AttentionImpl::kMath);
  enc->SetFusion(false, false);
  EXPECT_FALSE(enc->block_list[0]->attn->rel_pos_gemm);
  // The input is not modified by the in-place residual stream.
  const at::Tensor again = enc->forward(x);
  EXPECT_TRUE(at::equal(again, ref));
}

// The patch embedding as a GEMM over the patches is the stride-16 convolution, written contiguous
// in the [B, h, w, C] layout; an input that is not a whole number of patches is refused.
TEST(EncoderFusion, PatchEmbedRowsIsTheConvolution) {
  torch::NoGradGuard no_grad;
  PatchEmbed pe(16, 3, 24);
  torch::manual_seed(13);
  for (auto& p : pe->parameters()) p.normal_();
  const at::Tensor x = torch::randn({2, 3, 64, 48});
  const at::Tensor rows = pe->ForwardRows(x);
  ASSERT_EQ(rows.sizes(), (std::vector<int64_t>{2, 4, 3, 24}));
  EXPECT_TRUE(rows.is_contiguous());
  EXPECT_LT(MaxAbs(rows, pe->forward(x)), 1e-4);
  EXPECT_THROW(pe->ForwardRows(torch::randn({1, 3, 40, 48})), c10::Error);
}

TEST(EncoderFusion, GeluEpilogueMlpIsTheMlp) {
  // On the CPU, _addmm_activation computes addmm + the exact (erf) GELU, so the fused MLP must equal
  // lin2(gelu(lin1(x))) up to rounding; on CUDA its GELU is cuBLASLt's epilogue (model_fusion_gpu_test).
  torch::NoGradGuard no_grad;
  torch::manual_seed(13);
  MlpBlock mlp(16, 32);
  const at::Tensor x = torch::randn({2, 5, 5, 16});
  const at::Tensor ref = mlp->lin2->forward(at::gelu(mlp->lin1->forward(x)));
  EXPECT_LT(MaxAbs(mlp->ForwardFused(x, true), ref), 1e-5);
  EXPECT_LT(MaxAbs(mlp->ForwardFused(x, false), mlp->forward(x)), 1e-7);
}

TEST(EncoderFusion, MlpInRowChunksIsTheWholeMlp) {
  // 3 x 40 x 40 tokens = 4800 rows of a 32-wide hidden layer: a 64-row tile is 8 KiB in fp32, so a
  // 40 KiB budget gives chunks of 320 rows and a last, partial one.
  torch::NoGradGuard no_grad;
  torch::manual_seed(17);
  MlpBlock mlp(16, 32);
  const at::Tensor x = torch::randn({3, 40, 40, 16});
  const at::Tensor whole = mlp->ForwardFused(x, true);
  const at::Tensor chunked = mlp->ForwardFused(x, true, 40 << 10);
  ASSERT_EQ(chunked.sizes(), whole.sizes());
  EXPECT_LT(MaxAbs(chunked, whole), 1e-6);
  // A budget under one tile still makes progress (64-row chunks).
  EXPECT_LT(MaxAbs(mlp->ForwardFused(x, true, 1), whole), 1e-6);
}

}  // namespace
}  // namespace maskd
