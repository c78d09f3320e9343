#include "server/lifecycle.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <string>
#include <thread>

#include <pthread.h>
#include <spdlog/spdlog.h>

namespace maskd::server {
namespace {

const char* SignalName(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal"; }

[[noreturn]] void ExitNow(int code) {
  spdlog::default_logger()->flush();
  std::_Exit(code);
}

[[noreturn]] void LogUncaughtAndAbort() {
  std::string what = "std::terminate without an active exception";
  if (const std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      what = std::string("uncaught exception: ") + x.what();
    } catch (...) {
      what = "uncaught exception of a type not derived from std::exception";
    }
  }
  if (what.size() > 4096) what.resize(4096);
  try {
    spdlog::default_logger()->flush();
  } catch (...) {
  }
  std::fprintf(stderr, "maskd: fatal: %s (thread %lu)\n", what.c_str(),
               static_cast<unsigned long>(pthread_self()));
  std::fflush(stderr);
  std::abort();
}
}  // namespace

void InstallTerminateHandler() { std::set_terminate(&LogUncaughtAndAbort); }

sigset_t BlockShutdownSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

int ServeUntilSignalled(MaskServer& server, const sigset_t& signals) {
  std::atomic<bool> start_failed{false}, signalled{false}, start_returned{false};
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (start_failed.load()) return;  // woken by the failed start below, not by an operator
    signalled.store(true);
    const double grace = server.config().shutdown_grace_s;
    spdlog::info("received {}: shutting down (drain up to {} s, exit within {} s; a second signal "
                 "exits at once)",
                 SignalName(sig), grace, grace + kShutdownMarginS);
    const auto limit = std::chrono::steady_clock::now() +
                       std::chrono::microseconds(static_cast<int64_t>((grace + kShutdownMarginS) * 1e6));
    std::thread stopper([&server] { server.Shutdown(); });
    for (;;) {
      if (server.WaitDown(std::chrono::steady_clock::now() + std::chrono::milliseconds(100))) break;
      const timespec now_only{0, 0};
      if (int again = sigtimedwait(&signals, nullptr, &now_only); again > 0) {
        spdlog::warn("received {} again: exiting at once", SignalName(again));
        ExitNow(0);
      }
      if (std::chrono::steady_clock::now() >= limit) {
        spdlog::warn("shutdown: work still running {} s after the signal (a device batch cannot be "
                     "interrupted): exiting without waiting for it",
                     grace + kShutdownMarginS);
        ExitNow(0);
      }
    }
    stopper.join();
    if (!start_returned.load()) {
      spdlog::info("shut down while the model was loading: exiting without waiting for the load");
      ExitNow(0);
    }
  });
  const Status s = server.Start();
  start_returned.store(true);
  if (!s.ok()) {
    if (signalled.load()) {
      spdlog::info("shut down while loading ({})", s.message());
      waiter.join();
      return 0;
    }
    spdlog::error("maskd cannot start: {}", s.ToString());
    start_failed.store(true);
    server.Shutdown();
    pthread_kill(waiter.native_handle(), SIGTERM);
    waiter.join();
    return 1;
  }
  server.Wait();
  waiter.join();
  return 0;
}

}  // namespace maskd::server
