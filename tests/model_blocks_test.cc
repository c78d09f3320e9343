// Unit tests per block of the model, each against an independent plain computation, plus the jagged
// decode's equality with one-at-a-time decoding.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "model/api/engine.h"
#include "model/image_encoder.h"
#include "model/mask_decoder.h"
#include "model/io/pil_resize.h"
#include "model/prompt_encoder.h"
#include "model/sam.h"

namespace maskd {
namespace {

double MaxAbs(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

TEST(Blocks, LayerNorm2dMatchesLayerNormOverChannels) {
  torch::manual_seed(0);
  LayerNorm2d ln(8);
  ln->weight.data().normal_();
  ln->bias.data().normal_();
  const at::Tensor x = torch::randn({2, 8, 5, 7}) * 3 + 1;
  const at::Tensor ref = at::layer_norm(x.permute({0, 2, 3, 1}), {8}, ln->weight, ln->bias, 1e-6).permute({0, 3, 1, 2});
  EXPECT_LT(MaxAbs(ln->forward(x), ref), 1e-5);
}

TEST(Blocks, GetRelPosGathersByRelativeOffset) {
  const int64_t g = 5;
  const at::Tensor table = torch::randn({2 * g - 1, 3});
  const at::Tensor r = GetRelPos(g, g, table);
  ASSERT_EQ(r.sizes(), (std::vector<int64_t>{g, g, 3}));
  for (int64_t i = 0; i < g; ++i)
    for (int64_t j = 0; j < g; ++j) EXPECT_TRUE(torch::equal(r[i][j], table[i - j + g - 1]));
  // A table of another length is resized by linear interpolation to 2g-1 rows first.
  const at::Tensor small = torch::randn({5, 3});
  const at::Tensor r2 = GetRelPos(g, g, small);
  ASSERT_EQ(r2.sizes(), (std::vector<int64_t>{g, g, 3}));
  // Linear interpolation (align_corners=False) of 5 rows to 9: the centre row (offset 0) samples
  // source position (4 + 0.5) * 5 / 9 - 0.5 = 2 exactly, i.e. the middle row of the table.
  EXPECT_LT(MaxAbs(r2[0][0], small[2]), 1e-6);
  // Offset +1 (row 5) samples 5.5 * 5 / 9 - 0.5 = 2.5556: between table rows 2 and 3.
  const double f = 5.5 * 5 / 9 - 0.5 - 2;
  EXPECT_LT(MaxAbs(r2[1][0], small[2] * (1 - f) + small[3] * f), 1e-5);
}

// SAM's attention with the rel-pos bias written out element by element.
at::Tensor ExplicitRelPosAttention(RelPosAttentionImpl& a, const at::Tensor& x) {
  const int64_t B = x.size(0), g = a.grid, N = g * g, nh = a.num_heads, hd = a.head_dim;
  const at::Tensor qkv = a.qkv->forward(x.reshape({B, N, -1})).reshape({B, N, 3, nh, hd});
  const at::Tensor Rh = GetRelPos(g, g, a.rel_pos_h), Rw = GetRelPos(g, g, a.rel_pos_w);
  at::Tensor out = torch::zeros({B, N, nh, hd});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < nh; ++h) {
      const at::Tensor q = qkv[b].select(1, 0).select(1, h), k = qkv[b].select(1, 1).select(1, h),
                       v = qkv[b].select(1, 2).select(1, h);  // [N, hd]
      at::Tensor s = torch::matmul(q, k.t()) / std::sqrt(static_cast<double>(hd));
      for (int64_t i = 0; i < N; ++i)
        for (int64_t j = 0; j < N; ++j) {
          const int64_t qi = i / g, qj = i % g, ki = j / g, kj = j % g;
          s[i][j] += (q[i] * Rh[qi][ki]).sum() + (q[i] * Rw[qj][kj]).sum();
        }
      out.select(0, b).select(1, h).copy_(torch::matmul(s.softmax(-1), v));
    }
  return a.proj->forward(out.reshape({B, g, g, nh * hd}));
}

TEST(Blocks, RelPosAttentionEveryImplementationMatchesTheExplicitFormula) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(1);
  RelPosAttention attn(16, 2, 4);
  attn->rel_pos_h.normal_();
  attn->rel_pos_w.normal_();
  attn->Prepare();
  const at::Tensor x = torch::randn({2, 4, 4, 16});
  const at::Tensor ref = ExplicitRelPosAttention(*attn, x);
  for (AttentionImpl impl : {AttentionImpl::kMath, AttentionImpl::kSdpa, AttentionImpl::kSdpaFolded}) {
    for (bool pad_v : {true, false}) {
      attn->impl = impl;
      attn->fold_pad_v = pad_v;
      EXPECT_LT(MaxAbs(attn->forward(x), ref), 2e-5) << AttentionImplName(impl) << " pad_v=" << pad_v;
    }
  }
}

// kSdpaFolded in chunks of images (its workspace cap) is the same function as in one piece, and a
// kFused module runs the folded way exactly at the batch sizes listed in folded_batches.
TEST(Blocks, FoldedAttentionRunsInChunksAndWhereTheTimingChoseIt) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(5);
  RelPosAttention attn(16, 2, 4);
  attn->rel_pos_h.normal_();
  attn->rel_pos_w.normal_();
  attn->Prepare();
  const at::Tensor x = torch::randn({3, 4, 4, 16});
  // 2 heads x 16 tokens x (2 x 16 (q', k': 8 + 2 x 4 wide) + 2 x 7 (the terms' product) + 8) x 4 bytes.
  EXPECT_EQ(attn->FoldedBytesPerImage(4), 2 * 16 * (2 * 16 + 2 * 7 + 8) * 4);
  attn->impl = AttentionImpl::kSdpaFolded;
  const at::Tensor whole = attn->forward(x);
  EXPECT_LT(MaxAbs(whole, ExplicitRelPosAttention(*attn, x)), 2e-5);
  for (int64_t images : {1, 2}) {  // chunks of 1 (3 of them), of 2 (2 + 1)
    attn->folded_max_bytes = images * attn->FoldedBytesPerImage(4);
    EXPECT_LT(MaxAbs(attn->forward(x), whole), 1e-6) << images << " image(s) a chunk";
  }
  attn->folded_max_bytes = int64_t{256} << 20;
  attn->impl = AttentionImpl::kFused;  // on the CPU: the kernels' LibTorch references
  const at::Tensor fused3 = attn->forward(x);
  const at::Tensor x2 = x.narrow(0, 0, 2).contiguous();
  const at::Tensor fused2 = attn->forward(x2);
  attn->folded_batches = {3};
  EXPECT_EQ(attn->ImplFor(3), AttentionImpl::kSdpaFolded);
  EXPECT_EQ(attn->ImplFor(2), AttentionImpl::kFused);
  EXPECT_TRUE(torch::equal(attn->forward(x), whole));    // batch 3: the folded way
  EXPECT_TRUE(torch::equal(attn->forward(x2), fused2));  // batch 2: still the fused one
  EXPECT_FALSE(torch::equal(fused3, whole));             // (so the first check tells the two apart)
  attn->impl = AttentionImpl::kMath;  // the list means nothing to other ways
  EXPECT_EQ(attn->ImplFor(3), AttentionImpl::kMath);
}

TEST(Blocks, WindowedBlockEqualsAttentionPerPaddedWindow) {
  // An encoder block with window 3 on a 4x4 grid pads to 6x6: four windows whose padded tokens (zeros
  // after norm1) take part in attention, exactly as in the original.
  torch::NoGradGuard no_grad;
  torch::manual_seed(2);
  SamConfig c = *SamPreset("tiny");
  c.embed_dim = 8, c.num_heads = 2, c.mlp_dim = 16;
  EncoderBlock blk(c, 3);
  blk->attn->rel_pos_h.normal_();
  blk->attn->rel_pos_w.normal_();
  blk->attn->Prepare();
  const at::Tensor x = torch::randn({1, 4, 4, 8});
  const at::Tensor y = blk->forward(x);
  at::Tensor n = blk->norm1->forward(x);
  n = at::constant_pad_nd(n, {0, 0, 0, 2, 0, 2});  // [1, 6, 6, 8]
  at::Tensor attn_out = torch::zeros({1, 6, 6, 8});
  for (int wy = 0; wy < 2; ++wy)
    for (int wx = 0; wx < 2; ++wx) {
      const at::Tensor win = n.slice(1, 3 * wy, 3 * wy + 3).slice(2, 3 * wx, 3 * wx + 3).contiguous();
      attn_out.slice(1, 3 * wy, 3 * wy + 3).slice(2, 3 * wx, 3 * wx + 3).copy_(ExplicitRelPosAttention(*blk->attn, win));
    }
  at::Tensor h = x + attn_out.slice(1, 0, 4).slice(2, 0, 4);
  const at::Tensor ref = h + blk->mlp->forward(blk->norm2->forward(h));
  EXPECT_LT(MaxAbs(y, ref), 1e-5);
}

TEST(Blocks, PromptTokensArePeplusLabelEmbeddingAndPaddingIsNotAPoint) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(3);
  SamConfig c = *SamPreset("tiny");
  PromptEncoder pe(c);
  for (auto& p : pe->parameters()) p.normal_();
  pe->pe_layer->positional_encoding_gaussian_matrix.normal_();
  const at::Tensor coords = torch::tensor({{100.f, 200.f}, {0.f, 0.f}, {5.f, 7.f}, {1000.f, 3.f}});
  const at::Tensor labels = torch::tensor({1, -1, 2, 0}, torch::kLong);
  const at::Tensor t = pe->EmbedTokens(coords, labels);
  // Independent: the Fourier features of ((x+0.5)/1024, (y+0.5)/1024).
  auto fourier = [&](float x, float y) {
    const at::Tensor g = pe->pe_layer->positional_encoding_gaussian_matrix;
    const at::Tensor v = torch::tensor({2 * (x + 0.5f) / 1024 - 1, 2 * (y + 0.5f) / 1024 - 1}).unsqueeze(0);
    const at::Tensor a = 2 * M_PI * torch::matmul(v, g);
    return torch::cat({torch::sin(a), torch::cos(a)}, -1).squeeze(0);
  };
  EXPECT_LT(MaxAbs(t[0], fourier(100, 200) + pe->point_embedding_list[1]->weight[0]), 1e-5);
  EXPECT_TRUE(torch::equal(t[1], pe->not_a_point_embed->weight[0]));
  EXPECT_LT(MaxAbs(t[2], fourier(5, 7) + pe->point_embedding_list[2]->weight[0]), 1e-5);
  EXPECT_LT(MaxAbs(t[3], fourier(1000, 3) + pe->point_embedding_list[0]->weight[0]), 1e-5);
  // The dense grid PE at cell (i, j) is the Fourier feature of the cell centre.
  const at::Tensor dense = pe->DensePe();
  ASSERT_EQ(dense.sizes(), (std::vector<int64_t>{1, 256, 64, 64}));
  EXPECT_LT(MaxAbs(dense[0].select(1, 10).select(1, 3), fourier(3 * 16 + 7.5f, 10 * 16 + 7.5f)), 1e-4);
}

TEST(Blocks, MaskDecoderBatchRowsAreIndependent) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(4);
  SamConfig c = *SamPreset("tiny");
  MaskDecoder dec(c);
  RandomizeWeights(*dec, 4);
  const at::Tensor src = torch::randn({3, 256, 64, 64});
  const at::Tensor pos = torch::randn({1, 256, 64, 64});
  const at::Tensor sparse = torch::randn({3, 2, 256});
  auto all = dec->forward(src, pos, sparse);
  ASSERT_EQ(all.masks.sizes(), (std::vector<int64_t>{3, 4, 256, 256}));
  for (int64_t i = 0; i < 3; ++i) {
    auto one = dec->forward(src.slice(0, i, i + 1), pos, sparse.slice(0, i, i + 1));
    EXPECT_LT(MaxAbs(one.masks[0], all.masks[i]), 1e-4);
    EXPECT_LT(MaxAbs(one.iou_predictions[0], all.iou_predictions[i]), 1e-5);
  }
}

TEST(Engine, JaggedDecodeEqualsOneAtATime) {
  EngineOptions o;  // the demo model
  o.warmup = false;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  ImageRGB8 a{320, 200, {}}, b{150, 400, {}};
  for (auto* im : {&a, &b}) {
    im->pixels.resize(static_cast<size_t>(im->width) * im->height * 3);
    for (size_t i = 0; i < im->pixels.size(); ++i) im->pixels[i] = static_cast<uint8_t>((i * 37 + im->width) % 251);
  }
  auto pa = (*engine)->Prepare(a), pb = (*engine)->Prepare(b);
  ASSERT_TRUE(pa.ok() && pb.ok());
  auto embs = (*engine)->Encode({*pa, *pb});
  ASSERT_TRUE(embs.ok()) << embs.status().ToString();
  std::vector<DecodeItem> items;
  auto add = [&](int img, std::vector<Point> pts, std::optional<Box> box, bool multi) {
    PromptSpec p;
    p.points = std::move(pts);
    p.box = box;
    p.multimask = multi;
    items.push_back({(*embs)[img], p});
  };
  add(0, {{10, 20, 1}}, std::nullopt, true);
  add(1, {{100, 300, 1}, {20, 30, 0}}, std::nullopt, false);
  add(0, {}, Box{5, 5, 200, 150}, true);
  add(1, {{50, 60, 1}}, Box{10, 10, 140, 390}, false);
  add(0, {{300, 190, 1}}, std::nullopt, false);
  add(1, {{1, 1, 0}, {2, 2, 1}, {3, 3, 1}}, std::nullopt, true);
  auto together = (*engine)->Decode(items);
  ASSERT_TRUE(together.ok()) << together.status().ToString();
  // A refinement prompt with a mask input from the first result, decoded with others and alone.
  PromptSpec refine;
  refine.points = {{12, 22, 1}};
  refine.mask_input = (*together)[0].logits;
  refine.mask_input_index = 2;
  refine.multimask = false;
  items.push_back({(*embs)[0], refine});
  auto with_mask = (*engine)->Decode(items);
  ASSERT_TRUE(with_mask.ok()) << with_mask.status().ToString();
  for (size_t i = 0; i < items.size(); ++i) {
    auto alone = (*engine)->Decode({items[i]});
    ASSERT_TRUE(alone.ok());
    const auto& ref = (*alone)[0];
    const auto& got = (*with_mask)[i];
    ASSERT_EQ(got.scores.size(), items[i].prompt.multimask ? 3u : 1u);
    for (size_t k = 0; k < ref.scores.size(); ++k) EXPECT_NEAR(got.scores[k], ref.scores[k], 1e-5) << i;
    const auto lr = ref.logits->ToFloat(), lg = got.logits->ToFloat();
    ASSERT_EQ(lr.size(), lg.size());
    double m = 0;
    for (size_t k = 0; k < lr.size(); ++k) m = std::max(m, static_cast<double>(std::fabs(lr[k] - lg[k])));
    EXPECT_LT(m, 1e-4) << "prompt " << i;
  }
}

TEST(Engine, InvalidPromptsAreRejectedWithTheFieldNamed) {
  EngineOptions o;
  o.warmup = false;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok());
  ImageRGB8 im{64, 32, std::vector<uint8_t>(64 * 32 * 3, 9)};
  auto emb = (*engine)->Encode({*(*engine)->Prepare(im)});
  ASSERT_TRUE(emb.ok());
  PromptSpec p;
  p.points = {{70, 10, 1}};
  auto r = (*engine)->Decode({{(*emb)[0], p}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("prompts[0].points[0].x = 70"), std::string::npos) << r.status().message();
  p.points = {};
  r = (*engine)->Decode({{(*emb)[0], p}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no points and no box"), std::string::npos);
  p.box = Box{10, 10, 5, 20};
  r = (*engine)->Decode({{(*emb)[0], p}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("x0 <= x1"), std::string::npos);
  p.box.reset();
  p.points = {{1, 1, 7}};
  r = (*engine)->Decode({{(*emb)[0], p}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("label = 7"), std::string::npos);
  auto bad_mask = (*engine)->MakeMaskLogits(std::vector<float>(100).data(), 10, 10);
  ASSERT_FALSE(bad_mask.ok());
  EXPECT_NE(bad_mask.status().message().find("expected 256x256"), std::string::npos);
  auto bad_img = (*engine)->Prepare(ImageRGB8{4, 4, std::vector<uint8_t>(5)});
  ASSERT_FALSE(bad_img.ok());
  EXPECT_EQ(bad_img.status().code(), StatusCode::kInvalidArgument);
}

TEST(Engine, ResizedSizeRoundsLikeTheOriginal) {
  EXPECT_EQ(ResizedSize(640, 480, 1024), std::make_pair(1024, 768));
  EXPECT_EQ(ResizedSize(533, 800, 1024), std::make_pair(682, 1024));
  EXPECT_EQ(ResizedSize(1500, 256, 1024), std::make_pair(1024, 175));
  EXPECT_EQ(ResizedSize(1, 1, 1024), std::make_pair(1024, 1024));
}

TEST(Engine, DemoModelIsDeterministicPerSeed) {
  EngineOptions o;
  o.warmup = false;
  auto e1 = Engine::Create(o), e2 = Engine::Create(o);
  o.demo_seed = 99;
  auto e3 = Engine::Create(o);
  ASSERT_TRUE(e1.ok() && e2.ok() && e3.ok());
  EXPECT_TRUE((*e1)->description().demo);
  EXPECT_EQ((*e1)->description().identity, (*e2)->description().identity);
  EXPECT_NE((*e1)->description().identity, (*e3)->description().identity);
}

}  // namespace
}  // namespace maskd

namespace maskd {
namespace {

TEST(Engine, MaskLogitsOwnTheirValues) {
  // Found by the differential test: on a CPU fp32 engine MakeMaskLogits returned a view of the
  // caller's buffer, so a refinement prompt read freed memory once the buffer was gone.
  EngineOptions o;
  o.warmup = false;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok());
  std::vector<float> buf(256 * 256, 1.5f);
  auto logits = (*engine)->MakeMaskLogits(buf.data(), 256, 256);
  ASSERT_TRUE(logits.ok());
  std::fill(buf.begin(), buf.end(), -7.f);
  const auto v = (*logits)->ToFloat();
  ASSERT_EQ(v.size(), buf.size());
  EXPECT_EQ(v.front(), 1.5f);
  EXPECT_EQ(v.back(), 1.5f);
}

}  // namespace
}  // namespace maskd

namespace maskd {
namespace {

TEST(Blocks, MatmulUpscalingEqualsTransposedConvolutions) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(5);
  SamConfig c = *SamPreset("tiny");
  MaskDecoder dec(c);
  RandomizeWeights(*dec, 5);
  const at::Tensor src = torch::randn({2, 256, 64, 64});
  const at::Tensor pos = torch::randn({1, 256, 64, 64});
  const at::Tensor sparse = torch::randn({2, 3, 256});
  const auto ref = dec->forward(src, pos, sparse);
  dec->matmul_upscaling = true;
  const auto got = dec->forward(src, pos, sparse);
  EXPECT_LT(MaxAbs(got.masks, ref.masks), 1e-4);
  EXPECT_TRUE(torch::equal(got.iou_predictions, ref.iou_predictions));
}

}  // namespace
}  // namespace maskd

namespace maskd {
namespace {

// fp8 linears are CUDA-only: on CPU the option is accepted, logged and ignored, and the encoder
// stays the exact dense one. (The int8 and 2:4 options that used to be tested here were retired.)
TEST(Engine, Fp8LinearsAreIgnoredOnCpu) {
  EngineOptions o;
  o.warmup = false;
  auto made = Engine::Create(o);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Engine& e = **made;
  ImageRGB8 im{64, 48, std::vector<uint8_t>(64 * 48 * 3)};
  for (size_t i = 0; i < im.pixels.size(); ++i) im.pixels[i] = static_cast<uint8_t>((i * 7) % 251);
  auto embed = [&] {
    auto p = e.Prepare(im);
    EXPECT_TRUE(p.ok());
    auto emb = e.Encode({*p});
    EXPECT_TRUE(emb.ok()) << emb.status().ToString();
    return (*emb)[0]->ToFloat();
  };
  const std::vector<float> dense = embed();

  FastPathOptions fp8;
  fp8.fp8 = true;
  const Status s = e.Reconfigure(fp8);
  ASSERT_TRUE(s.ok()) << s.ToString();
  const auto& opts = e.optimisations();
  EXPECT_EQ(std::find(opts.begin(), opts.end(), "fp8-e4m3-linears"), opts.end());
  EXPECT_EQ(embed(), dense);
}

}  // namespace
}  // namespace maskd
