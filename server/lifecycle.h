// maskd's process life, shared by the binary and the tests' fake-engine server: start, serve until
// SIGINT/SIGTERM, drain, and the exit code.
#pragma once

#include <csignal>

#include "server/server.h"

namespace maskd::server {

// How long after --shutdown-grace-s the process waits for its last batch before exiting anyway:
// gRPC's own shutdown (1 s) and the pools' last completions.
inline constexpr double kShutdownMarginS = 2;

// Blocks SIGINT and SIGTERM in the calling thread and every thread started after it, so that only
// ServeUntilSignalled's waiter receives them. Call it first thing in main, before any thread exists.
sigset_t BlockShutdownSignals();

// Makes std::terminate (an exception that escaped a thread, a destructor or a noexcept function)
// write what the exception said to stderr before aborting: "maskd: fatal: uncaught exception in
// thread T: <what()>" (at most 4 KB of it; c10 errors carry their C++ backtrace), where the default
// handler prints only the type. Logs are flushed first. Call it first thing in main.
void InstallTerminateHandler();

// Starts `server` and serves until a signal of `signals` arrives, then shuts it down. Returns the
// process's exit code: 0 after a signal, also one that arrives while the model loads; 1 when the
// server cannot start (the reason is logged). Exits the process itself (std::_Exit(0), logs flushed)
// where waiting would break the promise that a signal ends maskd in bounded time:
// - a batch running on a device cannot be interrupted: when the drain has not ended
//   shutdown_grace_s + kShutdownMarginS after the signal, maskd exits without waiting for it;
// - a signal during loading: a model load cannot be interrupted either, so maskd exits once the
//   (empty) drain is done instead of finishing the load first;
// - a second signal exits at once.
int ServeUntilSignalled(MaskServer& server, const sigset_t& signals);

}  // namespace maskd::server
