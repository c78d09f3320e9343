// The loopback gRPC round trip of a canned SegmentResponse (3 masks of RLE counts of the given
// size each, random characters as random-weight masks give), the service a callback one as maskd's,
// the client a sync stub; N timed calls after 200 untimed. Arguments after N: channel args,
// "s:NAME=INT" for the server, "c:NAME=INT" for the client. Built against the tree's generated
// proto (run.sh); a record of the 2026-12-06 experiment, not part of the build.
//   loopback_roundtrip MASK_BYTES N [s:|c:ARG=VALUE ...]
#include <grpcpp/grpcpp.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include "maskd/v1/maskd.grpc.pb.h"
using namespace maskd;
struct Svc : v1::MaskService::CallbackService {
  v1::SegmentResponse canned;
  grpc::ServerUnaryReactor* Segment(grpc::CallbackServerContext* ctx, const v1::SegmentRequest*, v1::SegmentResponse* r) override {
    *r = canned;
    auto* re = ctx->DefaultReactor();
    re->Finish(grpc::Status::OK);
    return re;
  }
};
int main(int argc, char** argv) {
  size_t mask_bytes = std::stoul(argv[1]);
  int n = std::stoi(argv[2]);
  std::vector<std::pair<std::string,int>> sargs, cargs;
  for (int i = 3; i < argc; ++i) {
    std::string s = argv[i]; bool srv = s[0]=='s'; s = s.substr(2); auto eq = s.find('=');
    (srv ? sargs : cargs).push_back({s.substr(0, eq), std::stoi(s.substr(eq+1))});
  }
  Svc svc;
  std::mt19937 rng(1);
  auto* pr = svc.canned.add_results();
  for (int m = 0; m < 3; ++m) {
    auto* mr = pr->add_masks();
    std::string c(mask_bytes, 'a');
    for (auto& ch : c) ch = char(48 + rng() % 64);
    mr->mutable_rle()->set_counts(c);
    mr->mutable_rle()->add_size(768); mr->mutable_rle()->add_size(1024);
  }
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.SetMaxSendMessageSize(INT_MAX);
  for (auto& [k, v] : sargs) b.AddChannelArgument(k, v);
  b.RegisterService(&svc);
  auto server = b.BuildAndStart();
  grpc::ChannelArguments ca;
  ca.SetMaxReceiveMessageSize(-1);
  for (auto& [k, v] : cargs) ca.SetInt(k, v);
  auto ch = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials(), ca);
  auto stub = v1::MaskService::NewStub(ch);
  v1::SegmentRequest req;
  req.set_image_id("abc");
  std::vector<double> lat;
  for (int i = 0; i < n + 200; ++i) {
    grpc::ClientContext ctx;
    v1::SegmentResponse resp;
    auto t0 = std::chrono::steady_clock::now();
    auto st = stub->Segment(&ctx, req, &resp);
    auto t1 = std::chrono::steady_clock::now();
    if (!st.ok()) { std::printf("err %s\n", st.error_message().c_str()); return 1; }
    if (i >= 200) lat.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::sort(lat.begin(), lat.end());
  std::printf("bytes %zu  p50 %.0f us  p90 %.0f  p99 %.0f\n", svc.canned.ByteSizeLong(), lat[lat.size()/2], lat[lat.size()*9/10], lat[lat.size()*99/100]);
  server->Shutdown();
}
