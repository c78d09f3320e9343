// The checkpoint reader (model/checkpoint.cc: torch.save zips with the restricted unpickler and the
// CRC checks, and safetensors) under libFuzzer. It reads a path, so each input is written to one
// scratch file first. This target sees torch, so it must not see protobuf, gRPC, spdlog or fmt
// (docs/HELPERS.md); LibTorch itself is prebuilt and not instrumented, only our reader is.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "model/checkpoint.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

const std::string& ScratchPath() {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir ? dir : "/tmp") + "/maskd_fuzz_checkpoint." + std::to_string(getpid());
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = ScratchPath();
  FILE* f = std::fopen(path.c_str(), "wb");
  FUZZ_CHECK(f != nullptr, "cannot write %s", path.c_str());
  FUZZ_CHECK(std::fwrite(data, 1, size, f) == size, "short write to %s", path.c_str());
  std::fclose(f);
  maskd::StatusOr<maskd::StateDict> state = maskd::ReadStateDict(path);
  if (state.ok()) {
    for (const auto& [name, tensor] : *state) {
      FUZZ_CHECK(!name.empty(), "a tensor without a name");
      // A tensor the reader returns must be readable in full (not a view past its storage).
      FUZZ_CHECK(tensor.defined(), "undefined tensor %s", name.c_str());
      volatile double s = tensor.numel() > 0 ? tensor.to(at::kDouble).sum().item<double>() : 0.0;
      (void)s;
    }
  } else {
    FUZZ_CHECK(state.status().code() == maskd::StatusCode::kInvalidArgument ||
                   state.status().code() == maskd::StatusCode::kNotFound,
               "code %d: %s", static_cast<int>(state.status().code()),
               state.status().message().c_str());
  }
  std::remove(path.c_str());
  return 0;
}
