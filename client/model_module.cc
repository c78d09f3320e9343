// libmaskctl_model.so: maskctl's model subcommands on the real engine (libmaskd_model, LibTorch),
// behind the plain-C boundary of client/model_module.h. maskctl loads this module only when one of
// them runs (client/model_commands.cc); the subcommands' options and --help stay in maskctl.
#include "client/model_module.h"

#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/api/engine.h"
#include "model/engine_create.h"
#include "model/golden.h"

namespace {

std::string Str(const char* s) { return s ? std::string(s) : std::string(); }

struct VerifyArgs {
  std::string dir, device, dtype, attention;
  std::vector<std::string> images;
  bool no_png = false;
  bool fast = false;
  std::string json;
};

int RunVerify(const VerifyArgs& a) {
  // maskctl has parsed both already (a bad value is CLI11's usage error there); checked again because
  // the values cross a plain-C boundary.
  auto precision = maskd::ParsePrecision(a.dtype);
  if (!precision.ok()) {
    std::fprintf(stderr, "verify-golden: --dtype: %s\n", precision.status().message().c_str());
    return 2;
  }
  auto attention = maskd::ParseAttentionImpl(a.attention);
  if (!attention.ok()) {
    std::fprintf(stderr, "verify-golden: --attention: %s\n", attention.status().message().c_str());
    return 2;
  }
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

int RunMakeCheckpoint(const std::string& arch, uint64_t seed, const std::string& out) {
  maskd::Status s = maskd::MakeRandomCheckpoint({arch, seed}, out);
  if (!s.ok()) {
    std::fprintf(stderr, "make-checkpoint: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("wrote %s (%s, seed %llu)\n", out.c_str(), arch.c_str(), static_cast<unsigned long long>(seed));
  return 0;
}

int RunInspectCheckpoint(const std::string& checkpoint, bool timings) {
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [start] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  maskd::EngineOptions o;
  o.checkpoint = checkpoint;
  o.warmup = false;
  if (timings) {
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
    return 1;
  }
  const auto& d = (*e)->description();
  std::printf("arch %s\nembed_dim %d\ndepth %d\nnum_heads %d\nwindow_size %d\npatch_size %d\nimage_size %d\n"
              "mlp_dim %d\nout_chans %d\nparameters %llu\nidentity %s\nglobal_attn_indexes",
              d.arch.c_str(), d.embed_dim, d.depth, d.num_heads, d.window_size, d.patch_size, d.image_size,
              d.mlp_dim, d.out_chans, static_cast<unsigned long long>(d.parameter_count), d.identity.c_str());
  for (int g : d.global_attn_indexes) std::printf(" %d", g);
  std::printf("\n");
  return 0;
}

int Run(const MaskctlModelArgs& a) {
  switch (a.command) {
    case kMaskctlVerifyGolden: {
      VerifyArgs v;
      v.dir = Str(a.dir);
      v.device = Str(a.device);
      v.dtype = Str(a.dtype);
      v.attention = Str(a.attention);
      for (size_t i = 0; i < a.image_count; ++i) v.images.push_back(Str(a.images[i]));
      v.no_png = a.no_png != 0;
      v.fast = a.fast != 0;
      v.json = Str(a.json);
      return RunVerify(v);
    }
    case kMaskctlMakeCheckpoint:
      return RunMakeCheckpoint(Str(a.arch), a.seed, Str(a.out));
    case kMaskctlInspectCheckpoint:
      return RunInspectCheckpoint(Str(a.checkpoint), a.timings != 0);
  }
  std::fprintf(stderr, "maskctl model module: unknown command %d (maskctl and %s do not match)\n", a.command,
               MASKCTL_MODEL_MODULE_NAME);
  return 2;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int maskctl_model_abi_version(void) { return MASKCTL_MODEL_ABI_VERSION; }

__attribute__((visibility("default"))) int maskctl_model_run(const MaskctlModelArgs* args) {
  // No exception may unwind into maskctl through a C function; what escapes the engine (a c10::Error,
  // std::bad_alloc) becomes the command's failure, with its message.
  const int failed = args->command == kMaskctlVerifyGolden ? 2 : 1;
  try {
    return Run(*args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "maskctl: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "maskctl: unknown exception\n");
  }
  return failed;
}

}  // extern "C"
