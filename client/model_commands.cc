#include "client/model_commands.h"

#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "client/model_module.h"
#include "model/api/enums.h"

#ifndef MASKCTL_MODEL_MODULE_RELDIR
#define MASKCTL_MODEL_MODULE_RELDIR "../lib"
#endif

namespace {

// The folder of the running maskctl, symlinks resolved (a maskctl linked into another bin/ still finds
// its own module). /proc/self/exe first; dladdr on this function as the fallback where /proc is absent.
std::string ExecutableDir() {
  std::string path;
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) {
    path.assign(buf, static_cast<size_t>(n));
  } else {
    Dl_info info{};
    if (::dladdr(reinterpret_cast<void*>(&ExecutableDir), &info) != 0 && info.dli_fname != nullptr) {
      char* real = ::realpath(info.dli_fname, nullptr);
      if (real != nullptr) {
        path = real;
        std::free(real);
      }
    }
  }
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

// Loads the module and runs one subcommand in it; returns its exit code, or `failed` when the module
// cannot be loaded (the message names every path tried and the loader's reason).
int RunInModule(const char* name, const MaskctlModelArgs& args, int failed) {
  std::string tried;
  for (const auto& path : ModelModuleCandidates()) {
    // RTLD_NOW: a missing LibTorch or CUDA library is reported here, not as a crash later.
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = ::dlerror();
      tried += "\n  " + path + ": " + (why ? why : "unknown error");
      continue;
    }
    // Never dlclose'd: LibTorch's static destructors run at exit as they did when maskctl linked it.
    auto version = reinterpret_cast<MaskctlModelAbiVersionFn>(::dlsym(handle, MASKCTL_MODEL_ABI_VERSION_SYMBOL));
    auto run = reinterpret_cast<MaskctlModelRunFn>(::dlsym(handle, MASKCTL_MODEL_RUN_SYMBOL));
    if (version == nullptr || run == nullptr) {
      tried += "\n  " + path + ": not a maskctl model module (no " MASKCTL_MODEL_RUN_SYMBOL ")";
      continue;
    }
    if (version() != MASKCTL_MODEL_ABI_VERSION) {
      tried += "\n  " + path + ": module interface version " + std::to_string(version()) + ", this maskctl needs " +
               std::to_string(MASKCTL_MODEL_ABI_VERSION) + " (a module of another build)";
      continue;
    }
    return run(&args);
  }
  std::fprintf(stderr,
               "%s: cannot load the model module " MASKCTL_MODEL_MODULE_NAME
               " (the engine, with LibTorch, that this subcommand runs; set " MASKCTL_MODEL_MODULE_ENV
               " to its path). Tried:%s\n",
               name, tried.c_str());
  return failed;
}

// Throws what CLI11_PARSE turns into the exit code, silently (as the subcommands did when linked in).
void Finish(int rc) {
  if (rc != 0) throw CLI::RuntimeError(rc);
}

constexpr const char* kModuleFooter =
    "Runs the engine from " MASKCTL_MODEL_MODULE_NAME ", loaded from beside maskctl, its ../lib or the "
    "library path (env " MASKCTL_MODEL_MODULE_ENV ": that file instead).";

}  // namespace

std::vector<std::string> ModelModuleCandidates() {
  const char* env = std::getenv(MASKCTL_MODEL_MODULE_ENV);
  if (env != nullptr && *env != '\0') return {env};
  std::vector<std::string> paths;
  const std::string dir = ExecutableDir();
  if (!dir.empty()) {
    paths.push_back(dir + "/" MASKCTL_MODEL_MODULE_NAME);
    paths.push_back(dir + "/" MASKCTL_MODEL_MODULE_RELDIR "/" MASKCTL_MODEL_MODULE_NAME);
  }
  paths.push_back(MASKCTL_MODEL_MODULE_NAME);
  return paths;
}

void AddModelCommands(CLI::App& app) {
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
  v->footer(kModuleFooter);
  v->callback([verify] {
    // Usage errors before the module loads, with CLI11's message and exit code as before the split.
    auto precision = maskd::ParsePrecision(verify->dtype);
    if (!precision.ok()) throw CLI::ValidationError("--dtype", precision.status().message());
    auto attention = maskd::ParseAttentionImpl(verify->attention);
    if (!attention.ok()) throw CLI::ValidationError("--attention", attention.status().message());
    std::vector<const char*> images;
    for (const auto& i : verify->images) images.push_back(i.c_str());
    MaskctlModelArgs a{};
    a.command = kMaskctlVerifyGolden;
    a.dir = verify->dir.c_str();
    a.device = verify->device.c_str();
    a.dtype = verify->dtype.c_str();
    a.attention = verify->attention.c_str();
    a.images = images.data();
    a.image_count = images.size();
    a.no_png = verify->no_png ? 1 : 0;
    a.fast = verify->fast ? 1 : 0;
    a.json = verify->json.c_str();
    Finish(RunInModule("verify-golden", a, 2));
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
  m->footer(kModuleFooter);
  m->callback([make] {
    MaskctlModelArgs a{};
    a.command = kMaskctlMakeCheckpoint;
    a.arch = make->arch.c_str();
    a.out = make->out.c_str();
    a.seed = make->seed;
    Finish(RunInModule("make-checkpoint", a, 1));
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
  i->footer(kModuleFooter);
  i->callback([inspect] {
    MaskctlModelArgs a{};
    a.command = kMaskctlInspectCheckpoint;
    a.checkpoint = inspect->checkpoint.c_str();
    a.timings = inspect->timings ? 1 : 0;
    Finish(RunInModule("inspect-checkpoint", a, 1));
  });
}
