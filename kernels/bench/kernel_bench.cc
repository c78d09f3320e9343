// maskd_kernel_bench: one run prints the kernels' timings next to what they replace (SDPA with the
// bias as a mask, SDPA with rel-pos folded into q/k per backend, bf16 at::linear), with peak memory
// and a correctness column (max abs error against the LibTorch reference). Exits non-zero when a
// kernel's result is outside its tolerance.
//
// Timing: CUDA events on the current stream around each call, 3 warm-up calls, median of 20. Peak
// memory: the caching allocator's peak during one call, minus what was allocated before it (inputs
// excluded). Inputs are random (never zeros). Attention counts 4 B H N^2 D flops (QK^T and PV).
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "kernels/kernels.h"

namespace mk = maskd::kernels;

namespace {

constexpr int kWarmup = 3;
constexpr int kIters = 20;

struct Measure {
  bool ok = false;  // false: the variant refused (n/a), with `why`
  std::string why;
  double ms = 0;
  double peak_mib = 0;
};

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}

int64_t Allocated() {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(0)
      .allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .current;
}
int64_t PeakAllocated() {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(0)
      .allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .peak;
}

std::string FirstLine(const std::string& s) {
  const auto nl = s.find('\n');
  std::string line = s.substr(0, nl);
  return line.size() > 70 ? line.substr(0, 70) + "..." : line;
}

Measure Time(const std::function<void()>& fn) {
  Measure m;
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  try {
    for (int i = 0; i < kWarmup; ++i) fn();
    Check(cudaStreamSynchronize(stream), "warm-up");
    const int64_t before = Allocated();
    c10::cuda::CUDACachingAllocator::resetPeakStats(0);
    fn();
    Check(cudaStreamSynchronize(stream), "peak run");
    m.peak_mib = static_cast<double>(PeakAllocated() - before) / (1 << 20);
    cudaEvent_t start, stop;
    Check(cudaEventCreate(&start), "cudaEventCreate");
    Check(cudaEventCreate(&stop), "cudaEventCreate");
    std::vector<double> ms;
    for (int i = 0; i < kIters; ++i) {
      Check(cudaEventRecord(start, stream), "cudaEventRecord");
      fn();
      Check(cudaEventRecord(stop, stream), "cudaEventRecord");
      Check(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float t = 0;
      Check(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
      ms.push_back(t);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
    m.ms = ms[ms.size() / 2];
    m.ok = true;
  } catch (const c10::Error& e) {
    m.why = FirstLine(e.what_without_backtrace());
    Check(cudaStreamSynchronize(stream), "after refusal");
  }
  return m;
}

double MaxAbs(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kFloat) - b.to(at::kFloat)).abs().max().item<double>();
}
double RelL2(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor d = a.to(at::kDouble) - b.to(at::kDouble);
  return d.norm().item<double>() / b.to(at::kDouble).norm().item<double>();
}

int g_failures = 0;

void PrintRow(const char* what, const Measure& m, double flops, const std::string& err) {
  if (!m.ok) {
    std::printf("    %-30s %10s %9s %10s  n/a: %s\n", what, "n/a", "n/a", "n/a", m.why.c_str());
    return;
  }
  std::printf("    %-30s %10.3f %9.1f %10.1f  %s\n", what, m.ms, flops / (m.ms * 1e-3) / 1e12,
              m.peak_mib, err.c_str());
}

std::string ErrString(double max_abs, double rel, bool pass) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "max_abs %.2e rel_l2 %.2e%s", max_abs, rel, pass ? "" : "  FAIL");
  return buf;
}

// Which SDPA backends may run; math stays off so that a refusal is reported, not hidden.
void OnlyBackend(const char* name) {
  auto& ctx = at::globalContext();
  const std::string n = name;
  ctx.setSDPUseFlash(n == "flash");
  ctx.setSDPUseMemEfficient(n == "efficient");
  ctx.setSDPUseCuDNN(n == "cudnn");
  ctx.setSDPUseMath(n == "math");
}
void DefaultBackends() {
  auto& ctx = at::globalContext();
  ctx.setSDPUseFlash(true);
  ctx.setSDPUseMemEfficient(true);
  ctx.setSDPUseCuDNN(true);
  ctx.setSDPUseMath(true);
}

// ---------------------------------------------------------------------------------------------------

struct Model {
  const char* name;
  int64_t heads, head_dim, dim, mlp;
};
const Model kModels[] = {{"vit_b", 12, 64, 768, 3072}, {"vit_h", 16, 80, 1280, 5120}};

// --fused-only: the attention section at batch 32 without the SDPA comparisons (a quick A/B of
// the fused kernel's variants).
bool g_fused_only = false;

void BenchAttention() {
  std::printf("\n== RelPosAttention (bf16, rel_h/rel_w bf16; outputs [B, N, H, D]) ==\n");
  std::printf("    %-30s %10s %9s %10s  %s\n", "variant", "ms", "TFLOP/s", "peak MiB",
              "vs fp32 reference");
  const auto opt = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  for (const Model& md : kModels) {
    for (const bool global : {false, true}) {
      for (const int64_t batch : {1, 8, 32}) {
        if (g_fused_only && batch != 32) continue;
        const int64_t gh = global ? 64 : 14, gw = gh, N = gh * gw;
        const int64_t B = global ? batch : batch * 25;  // 25 windows of 14 x 14 per image
        const int64_t H = md.heads, D = md.head_dim;
        const double scale = 1.0 / std::sqrt(static_cast<double>(D));
        const double flops = 4.0 * B * H * N * N * D;
        std::printf("  %s %s batch %lld (B=%lld, H=%lld, N=%lld, D=%lld)\n", md.name,
                    global ? "global" : "windowed", static_cast<long long>(batch),
                    static_cast<long long>(B), static_cast<long long>(H),
                    static_cast<long long>(N), static_cast<long long>(D));
        const at::Tensor qkv = at::randn({B, N, 3, H, D}, opt);
        const at::Tensor p = qkv.permute({2, 0, 3, 1, 4});
        const at::Tensor q = p[0], k = p[1], v = p[2];
        const at::Tensor rel_h = at::randn({B, H, N, gh}, opt) * 1.5;
        const at::Tensor rel_w = at::randn({B, H, N, gw}, opt) * 1.5;

        // Reference on a slice (the fp32 reference materialises B x H x N x N).
        const int64_t s = global ? 1 : 25;
        const at::Tensor ref = mk::RelPosAttentionReference(
            q.narrow(0, 0, s), k.narrow(0, 0, s), v.narrow(0, 0, s), rel_h.narrow(0, 0, s),
            rel_w.narrow(0, 0, s), gh, gw, scale);
        auto err_of = [&](const at::Tensor& out_bnhd, bool gate) {
          const at::Tensor o = out_bnhd.narrow(0, 0, s);
          const double ma = MaxAbs(o, ref), rl = RelL2(o, ref);
          const bool pass = std::isfinite(ma) && ma <= 4e-2 && rl <= 1.5e-2;
          if (gate && !pass) ++g_failures;
          return ErrString(ma, rl, pass || !gate);
        };

        at::Tensor out;
        const Measure fused =
            Time([&] { out = mk::RelPosAttention(q, k, v, rel_h, rel_w, gh, gw, scale); });
        PrintRow("fused RelPosAttention", fused, flops, fused.ok ? err_of(out, true) : "");
        if (!fused.ok) ++g_failures;

        // What the encoder runs: the terms from the reversed tables, as a matmul + skewed views
        // (RelPosTables; copies q) or inside the kernel (RelPosAttentionFromTables).
        const at::Tensor rev = at::randn({(2 * gh - 1) + (2 * gw - 1), D}, opt) * 0.3;
        // fp32 terms: the kernel keeps them in fp32, RelPosTables rounds them to bf16.
        const mk::RelPosTerms ts =
            mk::RelPosTables(q.narrow(0, 0, s).to(at::kFloat), rev.to(at::kFloat), gh, gw);
        const at::Tensor ref_t = mk::RelPosAttentionReference(
            q.narrow(0, 0, s), k.narrow(0, 0, s), v.narrow(0, 0, s), ts.rel_h.to(at::kFloat),
            ts.rel_w.to(at::kFloat), gh, gw, scale);
        // gate: only the in-kernel terms are held to the fp32 tolerance; RelPosTables rounds its
        // terms to bf16 by design (shown, not counted as a failure).
        auto err_t = [&](const at::Tensor& out_bnhd, bool gate) {
          const at::Tensor o = out_bnhd.narrow(0, 0, s);
          const double ma = MaxAbs(o, ref_t), rl = RelL2(o, ref_t);
          const bool pass = std::isfinite(ma) && ma <= 4e-2 && rl <= 1.5e-2;
          if (gate && !pass) ++g_failures;
          return ErrString(ma, rl, pass || !gate);
        };
        const Measure via_gemm = Time([&] {
          const mk::RelPosTerms t = mk::RelPosTables(q, rev, gh, gw);
          out = mk::RelPosAttention(q, k, v, t.rel_h, t.rel_w, gh, gw, scale);
        });
        PrintRow("RelPosTables + fused kernel", via_gemm, flops, via_gemm.ok ? err_t(out, false) : "");
        const Measure in_kernel =
            Time([&] { out = mk::RelPosAttentionFromTables(q, k, v, rev, gh, gw, scale); });
        PrintRow("fused, terms in the kernel", in_kernel, flops, in_kernel.ok ? err_t(out, true) : "");
        if (!in_kernel.ok) ++g_failures;
        if (g_fused_only) continue;

        DefaultBackends();
        const Measure masked = Time([&] {
          const at::Tensor bias = (rel_h.unsqueeze(-1) + rel_w.unsqueeze(-2)).view({B, H, N, N});
          out = at::scaled_dot_product_attention(q, k, v, bias, 0.0, false, scale)
                    .transpose(1, 2)
                    .contiguous();
        });
        PrintRow("sdpa + bias mask (default)", masked, flops, masked.ok ? err_of(out, false) : "");

        // Folded: q' = [q * scale, rel_h, rel_w], k' = [k, onehot(j / gw), onehot(j % gw)], padded
        // to a multiple of 8; scale 1.
        const int64_t Dq = D + gh + gw, Dp = (Dq + 7) / 8 * 8;
        const at::Tensor j = at::arange(N, at::TensorOptions().device(at::kCUDA).dtype(at::kLong));
        const at::Tensor onehot = at::cat({at::one_hot(j.div(gw, "floor"), gh),
                                           at::one_hot(j.remainder(gw), gw)},
                                          1)
                                      .to(at::kBFloat16);  // [N, gh + gw]
        const at::Tensor zpad = at::zeros({B, H, N, Dp - Dq}, opt);
        for (const char* backend : {"flash", "efficient", "cudnn"}) {
          OnlyBackend(backend);
          for (const bool pad_v : {false, true}) {
            const Measure m = Time([&] {
              const at::Tensor qf = at::cat({q * scale, rel_h, rel_w, zpad}, -1);
              const at::Tensor kf =
                  at::cat({k, onehot.expand({B, H, N, gh + gw}), zpad}, -1);
              const at::Tensor vf =
                  pad_v ? at::cat({v, at::zeros({B, H, N, Dp - D}, opt)}, -1) : v;
              out = at::scaled_dot_product_attention(qf, kf, vf, {}, 0.0, false, 1.0)
                        .narrow(-1, 0, D)
                        .transpose(1, 2)
                        .contiguous();
            });
            if (!m.ok && !pad_v) continue;  // try again with V padded
            const std::string name =
                std::string("sdpa folded ") + backend + (pad_v ? " (V padded)" : "");
            PrintRow(name.c_str(), m, flops, m.ok ? err_of(out, false) : "");
            break;
          }
        }
        DefaultBackends();
      }
    }
  }
}

void BenchPreprocess() {
  std::printf("\n== ResizeNormalizePad (uint8 RGB -> bf16 [3, 1024, 1024]) ==\n");
  const std::vector<float> mean = {123.675f, 116.28f, 103.53f};
  const std::vector<float> stdv = {58.395f, 57.12f, 57.375f};
  struct Case {
    const char* name;
    int64_t h, w;
  };
  for (const Case& c : {Case{"1024x768 (workload, no resize)", 768, 1024},
                        Case{"4032x3024 -> 1024x768", 3024, 4032}}) {
    const at::Tensor rgb =
        at::randint(0, 256, {c.h, c.w, 3}, at::TensorOptions().dtype(at::kByte)).to(at::kCUDA);
    at::Tensor out;
    const Measure m =
        Time([&] { out = mk::ResizeNormalizePad(rgb, 768, 1024, 1024, mean, stdv, at::kBFloat16); });
    const at::Tensor raw = mk::ResizeNormalizePad(rgb, 768, 1024, 1024, {0, 0, 0}, {1, 1, 1}, at::kFloat);
    const at::Tensor raw_ref =
        mk::ResizeNormalizePadReference(rgb, 768, 1024, 1024, {0, 0, 0}, {1, 1, 1}, at::kFloat);
    const at::Tensor ref = mk::ResizeNormalizePadReference(rgb, 768, 1024, 1024, mean, stdv, at::kBFloat16);
    const bool exact = at::equal(raw, raw_ref) && at::equal(out, ref);
    if (!exact) ++g_failures;
    std::printf("    %-36s %8.3f ms  peak %7.1f MiB  %s\n", c.name, m.ms, m.peak_mib,
                exact ? "bit-exact vs CPU Pillow resize" : "MISMATCH  FAIL");
  }
}

void BenchPostprocess() {
  std::printf("\n== MaskPostprocess (1000 masks 256x256 fp32 -> 1024x768, RLE to host) ==\n");
  const int64_t M = 1000;
  const at::Tensor coarse = at::randn({M, 1, 12, 12}, at::TensorOptions().device(at::kCUDA)) * 6.0;
  const at::Tensor logits =
      (at::upsample_bicubic2d(coarse, {256, 256}, false) +
       at::randn({M, 1, 256, 256}, at::TensorOptions().device(at::kCUDA)) * 0.2)
          .select(1, 0)
          .contiguous();
  const at::Tensor geometry =
      at::tensor({768, 1024, 768, 1024}, at::kInt).view({1, 4}).expand({M, 4}).contiguous().to(at::kCUDA);
  mk::MaskPostprocessOutput out;
  const Measure m = Time([&] { out = mk::MaskPostprocess(logits, geometry, 1024, true, false); });
  // Correctness on the first 16 masks against the original's two interpolations + CPU RLE.
  const int64_t S = 16;
  const mk::MaskPostprocessOutput got =
      mk::MaskPostprocess(logits.narrow(0, 0, S), geometry.narrow(0, 0, S), 1024, true, true);
  const mk::MaskPostprocessOutput ref = mk::MaskPostprocessReference(
      logits.narrow(0, 0, S), geometry.narrow(0, 0, S), 1024, true, true);
  const int64_t differing = (got.bitmask != ref.bitmask).sum().item<int64_t>();
  const bool rle_equal = at::equal(got.rle_offsets, ref.rle_offsets) &&
                         at::equal(got.rle_counts, ref.rle_counts);
  const bool pass = differing <= 4 * S && (differing > 0 || rle_equal);
  if (!pass) ++g_failures;
  std::printf("    %-36s %8.3f ms  (%.0f masks/s)  peak %7.1f MiB  %lld RLE counts\n",
              "fused upsample+crop+threshold+RLE", m.ms, M / (m.ms * 1e-3), m.peak_mib,
              static_cast<long long>(out.rle_counts.numel()));
  std::printf("    check (16 masks): %lld differing pixels, RLE %s%s\n",
              static_cast<long long>(differing), rle_equal ? "identical" : "differs",
              pass ? "" : "  FAIL");
}

}  // namespace

int main(int argc, char** argv) {
  // Sections to run (all by default): attention, preprocess, postprocess; --fused-only.
  std::vector<std::string> sections;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--fused-only") {
      g_fused_only = true;
    } else if (a == "attention" || a == "preprocess" || a == "postprocess") {
      sections.push_back(a);
    } else {
      std::fprintf(stderr,
                   "usage: maskd_kernel_bench [attention] [preprocess] [postprocess] "
                   "[--fused-only]\nunknown argument '%s'\n",
                   argv[i]);
      return 2;
    }
  }
  auto wanted = [&](const char* name) {
    return sections.empty() || std::find(sections.begin(), sections.end(), name) != sections.end();
  };
  if (!at::hasCUDA() || at::cuda::getNumGPUs() == 0) {
    std::fprintf(stderr, "maskd_kernel_bench: no CUDA device\n");
    return 2;
  }
  if (!mk::BuiltWithCuda()) {
    std::fprintf(stderr, "maskd_kernel_bench: maskd_kernels was built without CUDA\n");
    return 2;
  }
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  std::printf("maskd_kernel_bench on %s (%d SMs, %zu KiB smem/SM, CC %d.%d); median of %d after %d warm-up\n",
              prop->name, prop->multiProcessorCount, prop->sharedMemPerMultiprocessor / 1024,
              prop->major, prop->minor, kIters, kWarmup);
  at::manual_seed(1234);
  try {
    if (wanted("attention")) BenchAttention();
    if (wanted("preprocess")) BenchPreprocess();
    if (wanted("postprocess")) BenchPostprocess();
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "maskd_kernel_bench: %s\n", e.what_without_backtrace());
    return 3;
  }
  std::printf("\n%s: %d correctness failure(s)\n", g_failures == 0 ? "OK" : "FAIL", g_failures);
  return g_failures == 0 ? 0 : 1;
}
