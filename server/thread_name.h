// Names for the server's own threads, so that `top -H`, gdb, perf and /proc/<pid>/task/*/comm tell a
// busy post-processing thread from a decoder batcher or a gRPC thread (run 51's c256 question: which
// pool is saturated).
#pragma once

#include <string>

namespace maskd::server {

// Names the calling thread; Linux keeps the first 15 bytes. Best effort: a failure changes nothing.
void NameThisThread(const std::string& name);

// The calling thread's name ("" where it cannot be read).
std::string ThisThreadName();

}  // namespace maskd::server
