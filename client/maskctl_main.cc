// maskctl: command-line client of maskd, and its verification tools (which load the engine only when
// they run: client/model_commands.h).
#include <CLI/CLI.hpp>

#include <iostream>

#include "client/maskctl_commands.h"
#include "client/model_commands.h"

int main(int argc, char** argv) {
  CLI::App app{"maskctl: talk to a maskd server (Segment Anything masks over gRPC)"};
  app.require_subcommand(1);
  maskd::client::MaskctlConfig config;
  maskd::client::MaskctlRun run;
  maskd::client::AddClientCommands(app, config, run, std::cout, std::cerr);
  AddModelCommands(app);
  CLI11_PARSE(app, argc, argv);
  return run.exit_code;
}
