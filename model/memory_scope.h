// Labels for the allocations the model makes, for the peak-memory account (model/memory_account.h):
// a MemoryScope names what the code inside it allocates ("encoder/block.global/attention"). Scopes
// nest per thread; a label is a string literal. Cheap enough to leave in: a push and a pop of a
// pointer per scope, and nothing is read unless an account is being recorded.
#pragma once

#include <string>

namespace maskd {

class MemoryScope {
 public:
  explicit MemoryScope(const char* label);
  ~MemoryScope();
  MemoryScope(const MemoryScope&) = delete;
  MemoryScope& operator=(const MemoryScope&) = delete;

  // This thread's scopes, outermost first, joined with '/'; "" outside any.
  static std::string Current();
};

}  // namespace maskd
