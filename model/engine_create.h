// What libmaskd_model offers besides the Engine it creates (Engine::Create, declared with the
// interface in model/api/engine.h): the CUDA device count and random checkpoints. Torch-free; only
// programs that link the real engine (maskd, maskctl, maskbench, the model tests) include it.
#pragma once

#include <cstdint>
#include <string>

#include "model/api/status.h"

namespace maskd {

// CUDA devices this process can use (0 without a CUDA build, driver or device). The server expands
// --device cuda (and auto) to cuda:0 .. cuda:N-1 with it.
int CudaDeviceCount();

// Caps what LibTorch's caching allocator may hold on a CUDA device ("cuda" or "cuda:N") at `bytes`
// (at::cuda's setMemoryFraction of the device's total memory), for the whole process; 0 lifts the
// cap. An allocation beyond it fails like one on a full device (the engine's calls then answer
// RESOURCE_EXHAUSTED). INVALID_ARGUMENT for a CPU device, an unknown one, or more bytes than the
// device has. May be called at any time (the GPU tests tighten it after warm-up); it also hands the
// allocator's cached free blocks back to the driver, since they count against the cap.
Status SetDeviceMemoryLimit(const std::string& device, uint64_t bytes);

// Bytes (zip archive of torch.save, or safetensors) to a file in the official SAM format.
struct CheckpointSpec {
  std::string arch;  // vit_b | vit_l | vit_h | tiny (the golden encoder shape)
  uint64_t seed = 0;
};
// Writes a random-weight checkpoint in the official format (torch.save(state_dict) layout).
Status MakeRandomCheckpoint(const CheckpointSpec& spec, const std::string& path);

}  // namespace maskd
