// maskd: the server binary. Parses the configuration, starts the server, and shuts it down cleanly
// on SIGINT/SIGTERM (health NOT_SERVING, drain, exit 0).
#include <csignal>
#include <cstdio>
#include <thread>

#include <pthread.h>
#include <spdlog/spdlog.h>

#include "model/api/engine.h"
#include "model/engine_create.h"
#include "server/config.h"
#include "server/logging.h"
#include "server/server.h"

int main(int argc, char** argv) {
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

  // Signals go to one waiting thread only: block them before any other thread exists.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  maskd::server::MaskServer server(parsed.config, &maskd::Engine::Create, maskd::CudaDeviceCount());
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    spdlog::info("received {}", sig == SIGINT ? "SIGINT" : "SIGTERM");
    server.Shutdown();
  });
  if (maskd::Status s = server.Start(); !s.ok()) {
    spdlog::error("maskd cannot start: {}", s.ToString());
    server.Shutdown();
    pthread_kill(signal_thread.native_handle(), SIGTERM);
    signal_thread.join();
    return 1;
  }
  server.Wait();
  signal_thread.join();
  return 0;
}
