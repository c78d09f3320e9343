// Engine::Create, the real engine's factory: the device, the weights (checkpoint or seeded random),
// the weight hash that goes into the model identity, and random checkpoints for tests and tools.
#include "model/engine_create.h"

#include <torch/cuda.h>
#ifdef MASKD_WITH_CUDA
#include <c10/cuda/CUDAException.h>
#endif
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <sstream>
#include <thread>

#include "model/checkpoint.h"
#include "model/engine_impl.h"

namespace maskd {

int CudaDeviceCount() {
  try {
    return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  } catch (const std::exception&) {
    return 0;
  }
}

namespace {

StatusOr<at::Device> ParseDevice(const std::string& name) {
  if (name == "cpu" || name.rfind("cpu:", 0) == 0) return at::Device(at::kCPU);
  if (name == "cuda" || name.rfind("cuda:", 0) == 0) {
    int index = 0;
    if (name.size() > 5) {
      try {
        index = std::stoi(name.substr(5));
      } catch (...) {
        return InvalidArgument("device '" + name + "' is not cpu, cuda or cuda:N");
      }
    }
    if (!torch::cuda::is_available())
      return InvalidArgument("device '" + name + "' requested but no CUDA device is available");
    if (index < 0 || index >= static_cast<int>(torch::cuda::device_count()))
      return InvalidArgument("device '" + name + "': only " + std::to_string(torch::cuda::device_count()) +
                             " CUDA device(s) visible");
    return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  return InvalidArgument("device '" + name + "' is not cpu, cuda or cuda:N");
}

// Seconds since the previous call (or since construction), for the start-up breakdown in the log.
class StepTimer {
 public:
  double Lap() {
    const auto now = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    return s;
  }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f s", s);
  return buf;
}

std::string WeightsDigest(const StateDict& sd) {
  // Over the tensors in name order, each framed with its name, dtype and shape: the same weights
  // give the same identity (and image_ids) whatever the container (.pth keeps file order,
  // safetensors does not) and however they are ordered in it.
  std::vector<const std::pair<std::string, at::Tensor>*> sorted;
  for (const auto& kv : sd) sorted.push_back(&kv);
  std::sort(sorted.begin(), sorted.end(),
            [](const auto* a, const auto* b) { return a->first < b->first; });
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  auto framed = [st](const void* p, uint64_t n) {
    XXH3_128bits_update(st, &n, sizeof n);
    XXH3_128bits_update(st, p, n);
  };
  for (const auto* kv : sorted) {
    const at::Tensor c = kv->second.contiguous();
    framed(kv->first.data(), kv->first.size());
    const std::string dtype = c10::toString(c.scalar_type());
    framed(dtype.data(), dtype.size());
    const std::vector<int64_t> shape = c.sizes().vec();
    framed(shape.data(), shape.size() * sizeof(int64_t));
    framed(c.data_ptr(), c.nbytes());
  }
  const XXH128_hash_t h = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  return Hex(h.high64, h.low64);
}

}  // namespace

Status SetDeviceMemoryLimit(const std::string& device, uint64_t bytes) {
  auto d = ParseDevice(device);
  if (!d.ok()) return d.status();
  if (!d->is_cuda()) return InvalidArgument("a device memory limit needs a CUDA device, not '" + device + "'");
#ifdef MASKD_WITH_CUDA
  return Guarded("limiting the memory of " + device, [&]() -> Status {
    const c10::DeviceIndex index = d->has_index() ? d->index() : 0;
    c10::cuda::CUDAGuard guard(index);
    // The caching allocator exists once CUDA is initialised on the device.
    (void)at::empty({1}, at::TensorOptions().device(at::kCUDA, index));
    size_t free_bytes = 0, total_bytes = 0;
    C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (bytes > total_bytes)
      return InvalidArgument("device memory limit of " + std::to_string(bytes >> 20) + " MiB is more than " +
                             device + " has (" + std::to_string(total_bytes >> 20) + " MiB)");
    const double fraction = bytes == 0 ? 1.0 : static_cast<double>(bytes) / static_cast<double>(total_bytes);
    c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, index);
    // Cached free blocks count against the cap too: handing them back makes it apply to what is
    // really in use from now on.
    ReleaseCachedDeviceMemory();
    return Status::Ok();
  });
#else
  (void)bytes;
  return InvalidArgument("a device memory limit needs a CUDA build");
#endif
}

StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options_in) {
  EngineOptions options = options_in;
  if (!options.log) options.log = DefaultLog;
  auto device = ParseDevice(options.device);
  if (!device.ok()) return device.status();
  if (options.device_memory_limit_bytes > 0) {
    if (device->is_cuda()) {
      MASKD_RETURN_IF_ERROR(SetDeviceMemoryLimit(options.device, options.device_memory_limit_bytes));
      options.log(LogLevel::kInfo, "device memory limit on " + device->str() + ": " +
                                       std::to_string(options.device_memory_limit_bytes >> 20) + " MiB");
    } else {
      options.log(LogLevel::kWarning, "the device memory limit is ignored on " + device->str());
    }
  }
  return Guarded("creating the engine", [&]() -> StatusOr<std::unique_ptr<Engine>> {
    SamConfig config;
    StateDict sd;
    std::optional<Sam> model;
    if (options.checkpoint.empty()) {
      auto preset = SamPreset(options.random_arch);
      if (!preset.ok()) return preset.status();
      config = *preset;
      model.emplace(config);
      RandomizeWeights(**model, options.demo_seed);
      sd = ModelStateDict(**model);
      options.log(LogLevel::kWarning,
                  "NO CHECKPOINT GIVEN: serving " +
                      (options.random_arch == "tiny" ? std::string("the built-in demo model (small encoder, ")
                                                     : "a " + options.random_arch + " model (") +
                      "random weights, "
                  "seed " + std::to_string(options.demo_seed) + "). ITS MASKS ARE MEANINGLESS. Download an "
                  "official SAM checkpoint (vit_b: sam_vit_b_01ec64.pth, vit_l: sam_vit_l_0b3195.pth, "
                  "vit_h: sam_vit_h_4b8939.pth from "
                  "https://github.com/facebookresearch/segment-anything#model-checkpoints) and pass it with "
                  "--checkpoint, $MASKD_CHECKPOINT, or put it in ./models/.");
    } else {
      // The CUDA context (hundreds of ms, a driver call that needs no weights) initialises while
      // the checkpoint is read from disk; the first .to(device) below would otherwise pay for it
      // after the read. A failure here is left for that .to() to report.
      std::thread context;
      if (device->is_cuda()) {
        context = std::thread([dev = *device] {
          try {
            (void)at::empty({1}, at::TensorOptions().device(dev));
          } catch (...) {
          }
        });
      }
      StepTimer timer;
      auto read = ReadStateDict(options.checkpoint);
      const double read_s = timer.Lap();
      if (context.joinable()) context.join();
      if (!read.ok()) return read.status();
      sd = std::move(*read);
      auto cfg = InferSamConfig(sd, options.checkpoint);
      if (!cfg.ok()) return cfg.status();
      config = *cfg;
      model.emplace(MakeSamForLoading(config));
      const double build_s = timer.Lap();
      MASKD_RETURN_IF_ERROR(LoadStateDict(**model, sd, options.checkpoint, /*share_storage=*/true));
      options.log(LogLevel::kInfo, "checkpoint " + options.checkpoint + ": read in " + Seconds(read_s) +
                                       ", model built in " + Seconds(build_s) + ", weights checked and loaded in " +
                                       Seconds(timer.Lap()));
    }
    if (options.on_startup_phase) options.on_startup_phase(StartupPhase::kCheckpointRead);
    uint64_t params = 0;
    for (const auto& p : (*model)->parameters()) params += static_cast<uint64_t>(p.numel());
    std::ostringstream os;
    os << "SAM " << config.arch << " (embed " << config.embed_dim << ", depth " << config.depth << ", heads "
       << config.num_heads << ", " << params << " parameters) from "
       << (options.checkpoint.empty() ? "random weights" : options.checkpoint) << " on "
       << device->str() << " in " << PrecisionName(options.precision);
    options.log(LogLevel::kInfo, os.str());
    // The weights' digest (0.42 s of vit_h's 2.5 GB, run 45) is needed only for the identity, once
    // the engine is ready: on a CUDA device it is computed beside Init (placement, GEMM timing, graph
    // capture, warm-up), which reads the host tensors only to copy them to the device; the task owns
    // `sd`, so the host copies live until the digest is done. On the CPU, Init may keep using (and
    // preparing from) those very tensors, so the digest comes first there, as before.
    auto digest_of = [](StateDict weights) {
      StepTimer timer;
      std::string digest = WeightsDigest(weights);
      return std::make_pair(std::move(digest), timer.Lap());
    };
    // The task hashes aliases of the tensors (detach(): the same storage under another TensorImpl).
    // Without a checkpoint `sd` holds the parameters' own TensorImpls, and Init's sam_->to(device)
    // swaps their storage (set_data) for the device copy while the task reads them: run 49 (H100)
    // segfaulted there in every random-weight engine on CUDA. An alias keeps the host storage alive
    // and unchanged for the task.
    for (auto& entry : sd) entry.second = entry.second.detach();
    std::future<std::pair<std::string, double>> digest =
        std::async(device->is_cuda() ? std::launch::async : std::launch::deferred, digest_of, std::move(sd));
    if (!device->is_cuda()) digest.wait();
    auto engine = std::make_unique<EngineImpl>(options, config, *model, *device, params);
    const Status init = engine->Init();
    const auto [weights_digest, digest_s] = digest.get();
    MASKD_RETURN_IF_ERROR(init);
    engine->SetWeightsDigest(weights_digest);
    options.log(LogLevel::kInfo, "weights hashed in " + Seconds(digest_s) +
                                     (device->is_cuda() ? " (beside the device's preparation)" : "") +
                                     ": model identity " + engine->description().identity);
    return std::unique_ptr<Engine>(std::move(engine));
  });
}

Status MakeRandomCheckpoint(const CheckpointSpec& spec, const std::string& path) {
  auto config = SamPreset(spec.arch);
  if (!config.ok()) return config.status();
  return Guarded("making a checkpoint", [&]() -> Status {
    torch::NoGradGuard no_grad;
    Sam model(*config);
    RandomizeWeights(*model, spec.seed);
    return WriteStateDict(ModelStateDict(*model), path);
  });
}


}  // namespace maskd
