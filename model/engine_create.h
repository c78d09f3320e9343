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

// Bytes (zip archive of torch.save, or safetensors) to a file in the official SAM format.
struct CheckpointSpec {
  std::string arch;  // vit_b | vit_l | vit_h | tiny (the golden encoder shape)
  uint64_t seed = 0;
};
// Writes a random-weight checkpoint in the official format (torch.save(state_dict) layout).
Status MakeRandomCheckpoint(const CheckpointSpec& spec, const std::string& path);

}  // namespace maskd
