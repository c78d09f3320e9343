// maskd: the server binary. Parses the configuration, starts the server, and shuts it down cleanly
// on SIGINT/SIGTERM (health NOT_SERVING, drain, exit 0).
#include <cstdio>

#include <spdlog/spdlog.h>

#include "model/api/engine.h"
#include "model/engine_create.h"
#include "server/config.h"
#include "server/lifecycle.h"
#include "server/malloc_tuning.h"
#include "server/logging.h"
#include "server/server.h"
#include "server/startup.h"

int main(int argc, char** argv) {
  maskd::server::InstallTerminateHandler();
  maskd::server::MarkProcessMain();
  maskd::server::ConfigParseResult parsed = maskd::server::ParseConfig(argc, argv);
  if (parsed.exit) {
    std::fputs(parsed.output.c_str(), parsed.exit_code == 0 ? stdout : stderr);
    return parsed.exit_code;
  }
  if (maskd::Status s = maskd::server::SetupLogging(parsed.config.log_level, parsed.config.log_format); !s.ok()) {
    std::fprintf(stderr, "maskd: %s\n", s.message().c_str());
    return 2;
  }
  if (!parsed.config.config_file.empty()) spdlog::info("configuration from {}", parsed.config.config_file);
  if (parsed.config.malloc_tuning && !maskd::server::TuneMallocForServing()) {
    spdlog::warn("--malloc-tuning: this C library did not take the malloc settings (not glibc?)");
  }

  // Signals go to one waiting thread only: block them before any other thread exists.
  const sigset_t signals = maskd::server::BlockShutdownSignals();
  maskd::server::MaskServer server(parsed.config, &maskd::Engine::Create, maskd::CudaDeviceCount());
  return maskd::server::ServeUntilSignalled(server, signals);
}
