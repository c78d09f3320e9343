// maskd with the fake engine (tests/fake_engine.h): the product's configuration, logging and process
// life (server/lifecycle.h) around an engine whose loading and decoding take as long as a test
// needs, so that tests can signal a real process in the middle of a load or of a long batch.
//
//   maskd_fake [--fake-load-ms N] [--fake-decode-ms N] <maskd flags...>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "server/config.h"
#include "server/lifecycle.h"
#include "server/logging.h"
#include "server/server.h"
#include "tests/fake_engine.h"

int main(int argc, char** argv) {
  std::chrono::milliseconds load{0}, decode{0};
  std::vector<const char*> args{argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--fake-load-ms" || a == "--fake-decode-ms") && i + 1 < argc) {
      (a == "--fake-load-ms" ? load : decode) = std::chrono::milliseconds(std::atoll(argv[++i]));
    } else {
      args.push_back(argv[i]);
    }
  }
  maskd::server::ConfigParseResult parsed =
      maskd::server::ParseConfig(static_cast<int>(args.size()), args.data());
  if (parsed.exit) {
    std::fputs(parsed.output.c_str(), stderr);
    return parsed.exit_code;
  }
  if (maskd::Status s = maskd::server::SetupLogging(parsed.config.log_level); !s.ok()) return 2;
  const sigset_t signals = maskd::server::BlockShutdownSignals();
  auto factory = [load, decode](const maskd::EngineOptions& eo)
      -> maskd::StatusOr<std::unique_ptr<maskd::Engine>> {
    std::this_thread::sleep_for(load);
    maskd::fake::FakeEngineOptions fo;
    fo.device = eo.device;
    fo.decode_delay = std::chrono::duration_cast<std::chrono::microseconds>(decode);
    return std::unique_ptr<maskd::Engine>(std::make_unique<maskd::fake::FakeEngine>(fo));
  };
  maskd::server::MaskServer server(parsed.config, factory, 0);
  return maskd::server::ServeUntilSignalled(server, signals);
}
