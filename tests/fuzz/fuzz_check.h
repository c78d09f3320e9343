// What every fuzz target shares: an invariant check that aborts (so libFuzzer records the input as
// a crash and keeps it) with a message, instead of an assert that NDEBUG would compile away.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond, ...)                                                  \
  do {                                                                        \
    if (!(cond)) {                                                            \
      std::fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s: ", __FILE__,      \
                   __LINE__, #cond);                                          \
      std::fprintf(stderr, __VA_ARGS__);                                      \
      std::fprintf(stderr, "\n");                                             \
      std::abort();                                                           \
    }                                                                         \
  } while (0)
