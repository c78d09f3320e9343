#include "server/thread_name.h"

#include <pthread.h>

namespace maskd::server {

void NameThisThread(const std::string& name) {
  // pthread_setname_np refuses names of 16 bytes or more (ERANGE) instead of truncating them.
  (void)pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

std::string ThisThreadName() {
  char buf[16] = {};
  if (pthread_getname_np(pthread_self(), buf, sizeof buf) != 0) return "";
  return buf;
}

}  // namespace maskd::server
