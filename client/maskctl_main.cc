// maskctl: command-line client of maskd (and, with the model built in, its verification tools).
#include <CLI/CLI.hpp>

#include <iostream>

#include "client/maskctl_commands.h"
#ifdef MASKD_HAVE_MODEL_COMMANDS
#include "client/model_commands.h"
#endif

int main(int argc, char** argv) {
  CLI::App app{"maskctl: talk to a maskd server (Segment Anything masks over gRPC)"};
  app.require_subcommand(1);
  maskd::client::MaskctlConfig config;
  maskd::client::MaskctlRun run;
  maskd::client::AddClientCommands(app, config, run, std::cout, std::cerr);
#ifdef MASKD_HAVE_MODEL_COMMANDS
  AddModelCommands(app);
#endif
  CLI11_PARSE(app, argc, argv);
  return run.exit_code;
}
