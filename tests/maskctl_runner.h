// maskctl's real command line (CLI11 over AddClientCommands) run in-process, its stdout and stderr
// kept: shared by client_fake_server_test and client_embedding_test.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "client/maskctl_commands.h"

namespace maskd::client {

// Run() returns maskctl's exit code, or 100 when CLI11 refuses the arguments.
struct Maskctl {
  std::ostringstream out, err;
  int Run(std::vector<std::string> args) {
    CLI::App app;
    app.require_subcommand(1);
    MaskctlConfig config;
    MaskctlRun run;
    AddClientCommands(app, config, run, out, err);
    std::vector<const char*> argv = {"maskctl"};
    for (const std::string& a : args) argv.push_back(a.c_str());
    try {
      app.parse(static_cast<int>(argv.size()), const_cast<char**>(argv.data()));
    } catch (const CLI::ParseError& e) {
      err << "parse error: " << e.what();
      return 100;
    }
    return run.exit_code;
  }
};

}  // namespace maskd::client
