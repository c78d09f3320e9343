// Where the reference outputs of the original SAM live, for tests: $MASKD_GOLDEN_DIR, else the
// configure-time default (../shared/golden beside the repository). Under CI=true a missing folder
// is a test failure; elsewhere the test is skipped, loudly.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <string>

namespace maskd::testing {

inline std::string GoldenRoot() {
  const char* env = std::getenv("MASKD_GOLDEN_DIR");
  return env && *env ? env : MASKD_GOLDEN_DIR_DEFAULT;
}

inline bool IsDir(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

inline bool RunningInCi() {
  const char* ci = std::getenv("CI");
  return ci && std::string(ci) == "true";
}

}  // namespace maskd::testing

// Sets `var` to <golden root>/<sub> or ends the test: FAIL under CI=true, SKIP elsewhere.
#define MASKD_REQUIRE_GOLDEN(var, sub)                                                        \
  std::string var = ::maskd::testing::GoldenRoot() + "/" + (sub);                            \
  if (!::maskd::testing::IsDir(var)) {                                                       \
    if (::maskd::testing::RunningInCi()) {                                                   \
      FAIL() << "golden data not found at " << var << " (set MASKD_GOLDEN_DIR); required under CI=true"; \
    } else {                                                                                 \
      GTEST_SKIP() << "*** golden data not found at " << var                                 \
                   << " (set MASKD_GOLDEN_DIR): SKIPPING parity test ***";                   \
    }                                                                                        \
  }
