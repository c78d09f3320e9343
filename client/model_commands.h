// maskctl's model-side subcommands, which run the engine (libmaskd_model, LibTorch) instead of talking
// to a server: verify-golden (parity with the original SAM on this build and device), make-checkpoint
// (random weights in the official format, for benchmarks without the real weights) and
// inspect-checkpoint. Their options live here, torch-free; the work is in libmaskctl_model.so
// (client/model_module.h), which is loaded only when one of them runs, so that maskctl's RPC commands
// start without LibTorch.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

void AddModelCommands(CLI::App& app);

// Where maskctl looks for libmaskctl_model.so, in order: $MASKCTL_MODEL_MODULE alone when it is set;
// otherwise beside the executable (a build tree), in the install's library folder relative to it
// (bin/../lib), then the bare name (the dynamic linker's search, LD_LIBRARY_PATH included).
std::vector<std::string> ModelModuleCandidates();
