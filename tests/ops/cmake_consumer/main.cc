// Talks to a maskd through the installed client: health, GetInfo, and one typed error.
// usage: consumer HOST:PORT ; prints "arch=<arch> serving=1 not_found=1" and exits 0 on success.
#include <cstdio>
#include <string>

#include "client/client.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s HOST:PORT\n", argv[0]);
    return 2;
  }
  maskd::client::ClientOptions options;
  options.target = argv[1];
  auto client = maskd::client::Client::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  auto health = (*client)->Health();
  auto info = (*client)->GetInfo();
  if (!health.ok() || !info.ok()) {
    std::fprintf(stderr, "health/info failed\n");
    return 1;
  }
  maskd::v1::SegmentRequest unknown;
  unknown.set_image_id(std::string(64, '0'));
  unknown.add_prompts()->add_points()->set_x(1);
  auto segment = (*client)->Segment(unknown);
  const bool not_found = !segment.ok() && segment.status().code() == maskd::StatusCode::kNotFound;
  std::printf("arch=%s serving=%d not_found=%d\n", info->model().arch().c_str(),
              *health == maskd::client::ServingStatus::kServing ? 1 : 0, not_found ? 1 : 0);
  return (*health == maskd::client::ServingStatus::kServing && not_found) ? 0 : 1;
}
