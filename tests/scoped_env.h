// Sets an environment variable for one scope and puts back what was there (or unsets it) when the
// scope ends, also when an ASSERT returns early: for the tests of settings read from MASKD_* variables
// (server configuration, the kernels' same-binary comparison knobs).
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace maskd::testing {

class ScopedEnv {
 public:
  // value nullptr: the variable unset for the scope.
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace maskd::testing
