#include "client/model_commands.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/api/engine.h"
#include "model/engine_create.h"
#include "model/golden.h"

namespace {

struct VerifyArgs {
  std::string dir;
  std::string device = "cpu";
  std::string dtype = "fp32";
  std::string attention = "auto";
  std::vector<std::string> images;
  bool no_png = false;
  bool fast = false;
  std::string json;
};

int RunVerify(const VerifyArgs& a) {
  auto precision = maskd::ParsePrecision(a.dtype);
  if (!precision.ok()) throw CLI::ValidationError("--dtype", precision.status().message());
  auto attention = maskd::ParseAttentionImpl(a.attention);
  if (!attention.ok()) throw CLI::ValidationError("--attention", attention.status().message());
  auto ckpt = maskd::GoldenCheckpoint(a.dir);
  if (!ckpt.ok()) {
    std::fprintf(stderr, "verify-golden: %s\n", ckpt.status().ToString().c_str());
    return 2;
  }
  maskd::EngineOptions o;
  o.checkpoint = *ckpt;
  o.device = a.device;
  o.precision = *precision;
  if (a.fast) o.fast = maskd::FastPathOptions::Fast();
  o.fast.attention = *attention;
  o.log = [](maskd::LogLevel l, std::string_view m) {
    if (l >= maskd::LogLevel::kWarning) std::fprintf(stderr, "%.*s\n", static_cast<int>(m.size()), m.data());
  };
  auto engine = maskd::Engine::Create(o);
  if (!engine.ok()) {
    std::fprintf(stderr, "verify-golden: %s\n", engine.status().ToString().c_str());
    return 2;
  }
  const maskd::GoldenTolerances tol = *precision == maskd::Precision::kFloat32
                                          ? maskd::GoldenTolerances::Fp32()
                                          : maskd::GoldenTolerances::Reduced(*precision);
  auto report = maskd::RunGolden(**engine, {a.dir, a.images, !a.no_png}, tol);
  if (!report.ok()) {
    std::fprintf(stderr, "verify-golden: %s\n", report.status().ToString().c_str());
    return 2;
  }
  std::printf("maskd verify-golden: %s on %s (%s), %s, attention %s\n", a.dir.c_str(),
              (*engine)->device().c_str(), (*engine)->device_name().c_str(), a.dtype.c_str(),
              a.attention.c_str());
  std::printf("optimisations: ");
  for (const auto& s : (*engine)->optimisations()) std::printf("%s ", s.c_str());
  std::printf("\ntolerances (%s): embedding %.1e, logits %.1e, IoU %.1e, mask pixels %.1e\n",
              tol.source.c_str(), tol.embedding_max_abs, tol.logits_max_abs, tol.iou_max_abs,
              tol.mask_pixel_fraction);
  std::printf("%-8s %-14s %-10s %12s %12s %12s %12s %8s  %s\n", "image", "path", "case", "emb max|d|",
              "logit max|d|", "iou max|d|", "mask px frac", "resize", "result");
  nlohmann::json j = nlohmann::json::array();
  for (const auto& c : report->cases) {
    const bool emb = c.name == "embedding";
    std::printf("%-8s %-14s %-10s %12s %12s %12s %12s %8s  %s%s\n", c.image.c_str(), c.path.c_str(),
                c.name.c_str(), emb ? std::to_string(c.max_abs_embedding).substr(0, 10).c_str() : "",
                emb ? "" : std::to_string(c.max_abs_logits).substr(0, 10).c_str(),
                emb ? "" : std::to_string(c.max_abs_iou).substr(0, 10).c_str(),
                emb ? "" : std::to_string(c.mask_pixel_fraction).substr(0, 10).c_str(),
                c.resize_max_diff >= 0 ? std::to_string(c.resize_max_diff).c_str() : "",
                c.passed ? "ok" : "FAIL ", c.failure.c_str());
    j.push_back({{"image", c.image}, {"path", c.path}, {"case", c.name},
                 {"embedding_max_abs", c.max_abs_embedding}, {"logits_max_abs", c.max_abs_logits},
                 {"iou_max_abs", c.max_abs_iou}, {"mask_pixel_fraction", c.mask_pixel_fraction},
                 {"differing_pixels", c.differing_pixels}, {"resize_max_diff", c.resize_max_diff},
                 {"passed", c.passed}});
  }
  if (!a.json.empty()) {
    std::ofstream f(a.json);
    f << nlohmann::json{{"device", (*engine)->device()}, {"dtype", a.dtype}, {"attention", a.attention},
                        {"tolerances", tol.source}, {"cases", j}}
             .dump(1);
  }
  const bool ok = report->passed();
  std::printf("%s: %zu comparisons, %s\n", ok ? "PASSED" : "FAILED", report->cases.size(),
              ok ? "all within tolerance" : "some exceed the tolerances above");
  return ok ? 0 : 1;
}

}  // namespace

void AddModelCommands(CLI::App& app) {
  auto verify = std::make_shared<VerifyArgs>();
  CLI::App* v = app.add_subcommand(
      "verify-golden",
      "Check this build against reference outputs of the original SAM: every image and prompt case of a "
      "golden folder (manifest.json, checkpoint, imageN.png/.pt), from input_resized (model parity) "
      "and from the PNG (whole pipeline). Exits 1 when a tolerance is exceeded.");
  v->add_option("dir", verify->dir, "Golden folder (e.g. ../shared/golden/tiny)")->required()->check(CLI::ExistingDirectory);
  v->add_option("--device", verify->device, "cpu, cuda or cuda:N")->capture_default_str();
  v->add_option("--dtype", verify->dtype, "fp32 (golden tolerances; TF32 off on CUDA), bf16 or fp16 (stated looser bounds)")
      ->capture_default_str();
  v->add_option("--attention", verify->attention, "Encoder attention: auto, math, sdpa, sdpa-folded, fused")
      ->capture_default_str();
  v->add_option("--images", verify->images, "Only these images (e.g. image0), comma separated")->delimiter(',');
  v->add_flag("--no-png", verify->no_png, "Skip the PNG (decode + resize) path");
  v->add_flag("--fast", verify->fast, "Enable the CUDA fast path (graphs, GPU pre/post-processing)");
  v->add_option("--json", verify->json, "Also write the per-case results as JSON");
  v->callback([verify] {
    const int rc = RunVerify(*verify);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });

  struct MakeArgs {
    std::string arch, out;
    uint64_t seed = 0;
  };
  auto make = std::make_shared<MakeArgs>();
  CLI::App* m = app.add_subcommand(
      "make-checkpoint",
      "Write a random-weight SAM checkpoint in the official format (torch.save of the state dict), for "
      "benchmarks on machines without the real weights. Its masks are meaningless.");
  m->add_option("--arch", make->arch, "vit_b, vit_l, vit_h or tiny")->required()
      ->check(CLI::IsMember({"vit_b", "vit_l", "vit_h", "tiny"}));
  m->add_option("--seed", make->seed, "Random seed")->capture_default_str();
  m->add_option("out", make->out, "Output .pth path")->required();
  m->callback([make] {
    maskd::Status s = maskd::MakeRandomCheckpoint({make->arch, make->seed}, make->out);
    if (!s.ok()) {
      std::fprintf(stderr, "make-checkpoint: %s\n", s.ToString().c_str());
      throw CLI::RuntimeError(1);
    }
    std::printf("wrote %s (%s, seed %llu)\n", make->out.c_str(), make->arch.c_str(),
                static_cast<unsigned long long>(make->seed));
  });

  struct InspectArgs {
    std::string checkpoint;
    bool timings = false;
  };
  auto inspect = std::make_shared<InspectArgs>();
  CLI::App* i = app.add_subcommand("inspect-checkpoint",
                                   "Load a checkpoint (.pth or .safetensors) and print the SAM shape inferred from it.");
  i->add_option("checkpoint", inspect->checkpoint, "Checkpoint path")->required();
  i->add_flag("--timings", inspect->timings,
              "Also print the engine's log and its start-up phases with seconds since the start (stderr)");
  i->callback([inspect] {
    const auto start = std::chrono::steady_clock::now();
    auto elapsed = [start] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    maskd::EngineOptions o;
    o.checkpoint = inspect->checkpoint;
    o.warmup = false;
    if (inspect->timings) {
      o.log = [elapsed](maskd::LogLevel, std::string_view m) {
        std::fprintf(stderr, "%7.2f s  %.*s\n", elapsed(), static_cast<int>(m.size()), m.data());
      };
      o.on_startup_phase = [elapsed](maskd::StartupPhase p) {
        const char* name = p == maskd::StartupPhase::kCheckpointRead ? "checkpoint_read"
                           : p == maskd::StartupPhase::kWeightsReady  ? "weights_ready"
                                                                       : "warmed_up";
        std::fprintf(stderr, "%7.2f s  phase %s\n", elapsed(), name);
      };
    } else {
      o.log = [](maskd::LogLevel, std::string_view) {};
    }
    auto e = maskd::Engine::Create(o);
    if (!e.ok()) {
      std::fprintf(stderr, "inspect-checkpoint: %s\n", e.status().ToString().c_str());
      throw CLI::RuntimeError(1);
    }
    const auto& d = (*e)->description();
    std::printf("arch %s\nembed_dim %d\ndepth %d\nnum_heads %d\nwindow_size %d\npatch_size %d\nimage_size %d\n"
                "mlp_dim %d\nout_chans %d\nparameters %llu\nidentity %s\nglobal_attn_indexes",
                d.arch.c_str(), d.embed_dim, d.depth, d.num_heads, d.window_size, d.patch_size, d.image_size,
                d.mlp_dim, d.out_chans, static_cast<unsigned long long>(d.parameter_count), d.identity.c_str());
    for (int g : d.global_attn_indexes) std::printf(" %d", g);
    std::printf("\n");
  });
}
