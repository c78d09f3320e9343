// maskctl's model-side subcommands, which link the engine (libmaskd_model) instead of talking to a
// server: verify-golden (parity with the original SAM on this build and device), make-checkpoint
// (random weights in the official format, for benchmarks without the real weights) and
// inspect-checkpoint.
#pragma once

#include <CLI/CLI.hpp>

void AddModelCommands(CLI::App& app);
