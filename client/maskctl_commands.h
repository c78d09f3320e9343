// maskctl's client subcommands (embed, segment, info, health) on a CLI11 app. Kept out of main so
// that tests can drive the exact command line against a server.
#pragma once

#include "client/client.h"

#include <CLI/CLI.hpp>

#include <iosfwd>
#include <memory>
#include <string>

namespace maskd::client {

// Options every client subcommand shares, filled from flags and the environment in one place.
struct MaskctlConfig {
  std::string server = "localhost:50051";  // --server, env MASKD_SERVER
  double timeout_s = 30;                   // --timeout
  double connect_timeout_s = 5;            // --connect-timeout
  SecurityFlags security;                  // --tls, --tls-ca, --tls-cert/--tls-key, --token, ...
};

// The result of the subcommand that ran: its exit status (0 ok, 1 RPC or I/O error, 2 not serving).
struct MaskctlRun {
  int exit_code = 0;
};

// Adds --server/--timeout/--connect-timeout to `app` and the subcommands. `out` gets results,
// `err` errors. `config` and `run` must outlive app.parse().
void AddClientCommands(CLI::App& app, MaskctlConfig& config, MaskctlRun& run, std::ostream& out,
                       std::ostream& err);

}  // namespace maskd::client
