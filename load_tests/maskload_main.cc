// maskload: the load generator for maskd (closed/open loop, batch/interactive/mixed workloads).
#include <CLI/CLI.hpp>

#include <cstdio>

#include "load_tests/maskload_cli.h"
#include "server/malloc_tuning.h"

int main(int argc, char** argv) {
  CLI::App app{
      "maskload: drive a maskd server and report img/s, prompts/s, latency percentiles, errors, "
      "response sizes and the server's memory and stage timings"};
  maskd::load::MaskloadOptions options;
  maskd::load::AddMaskloadFlags(app, options);
  CLI11_PARSE(app, argc, argv);
  if (maskd::Status s = maskd::load::FinishMaskloadOptions(options); !s.ok()) {
    std::fprintf(stderr, "maskload: %s\n", s.ToString().c_str());
    return 1;
  }
  if (options.malloc_tuning) maskd::server::TuneMallocForServing();
  return maskd::load::RunMaskload(options);
}
