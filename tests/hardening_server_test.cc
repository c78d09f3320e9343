// Regression tests for the server-facing findings of issue #14, each through a real gRPC connection
// to a whole in-process server on an ephemeral loopback port (fake engines).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <thread>
#include <future>
#include <optional>
#include <regex>
#include <set>
#include <stdexcept>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grpcpp/generic/generic_stub.h>
#include <spdlog/spdlog.h>

#include "client/client.h"
#include "model/io/image_codec.h"
#include "server/lifecycle.h"
#include "server/logging.h"
#include "server/result_store.h"
#include "server/server.h"
#include "tests/fake_engine.h"
#include "tests/server_fixture.h"

namespace maskd::server {
namespace {

using client::Client;
using client::ClientOptions;
using fake::FakeEngine;
using fake::FakeEngineOptions;

// ---------------------------------------------------------------------------------------------------
// Finding 1: result ids are unguessable and scoped to their image.

// An exception that escapes a worker thread ends maskd with its message on stderr, not only the
// default handler's type name (run 30: "terminate called after throwing an instance of
// 'c10::AcceleratorError'" and nothing else).
TEST(HardeningTerminateDeathTest, UncaughtExceptionsMessageReachesStderr) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        server::InstallTerminateHandler();
        std::thread([] { throw std::runtime_error("CUDA error: an illegal memory access (test)"); }).join();
      },
      "maskd: fatal: uncaught exception: CUDA error: an illegal memory access \\(test\\) \\(thread [0-9]+\\)");
}

TEST(HardeningResultIds, AreHex128BitAndNeverRepeat) {
  ResultStore a(1 << 20), b(1 << 20);
  const std::regex shape("r[0-9a-f]{32}");
  std::set<std::string> seen;
  for (int i = 0; i < 200; ++i) {
    for (ResultStore* store : {&a, &b}) {
      StoredResult r;
      r.image_id = "img";
      r.bytes = 1;
      const std::string id = store->Put(r);
      EXPECT_TRUE(std::regex_match(id, shape)) << id;
      EXPECT_TRUE(seen.insert(id).second) << "repeated id " << id;
    }
  }
}

TEST(HardeningResultIds, ForeignImageLooksExactlyLikeAnUnknownId) {
  ResultStore store(1 << 20);
  StoredResult r;
  r.image_id = "image-of-client-a";
  r.bytes = 1;
  const std::string id = store.Put(r);
  EXPECT_TRUE(store.Get(id, "f", "image-of-client-a").ok());
  auto foreign = store.Get(id, "f", "image-of-client-b");
  ASSERT_FALSE(foreign.ok());
  EXPECT_EQ(foreign.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(foreign.status().message().find("image-of-client-a"), std::string::npos);
}

TEST(HardeningResultIds, AnotherImagesResultIsNotFoundWithTheUnknownIdMessage) {
  TestServer t;
  // Client A segments its image and gets a result id.
  v1::SegmentRequest a;
  *a.mutable_image() = EncodedPicture(40, 30, 1);
  *a.add_prompts() = Point(10, 10);
  auto ra = t.client->Segment(a);
  ASSERT_TRUE(ra.ok()) << ra.status().ToString();
  const std::string stolen = ra->results(0).result_id();
  ASSERT_FALSE(stolen.empty());

  // Client B uses it on its own image, and then an id that never existed.
  auto ask = [&](const std::string& result_id) {
    v1::SegmentRequest b;
    *b.mutable_image() = EncodedPicture(32, 32, 2);
    v1::Prompt p = Point(5, 5);
    p.mutable_mask_input()->set_result_id(result_id);
    *b.add_prompts() = p;
    return t.client->Segment(b);
  };
  auto with_stolen = ask(stolen);
  const std::string never = "r" + std::string(32, '0');
  auto with_unknown = ask(never);
  ASSERT_FALSE(with_stolen.ok());
  ASSERT_FALSE(with_unknown.ok());
  EXPECT_EQ(with_stolen.status().code(), StatusCode::kNotFound) << with_stolen.status().ToString();
  EXPECT_EQ(with_unknown.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(with_stolen.status().message().find(ra->image_id()), std::string::npos)
      << with_stolen.status().message();
  // Same answer except for the echoed id: nothing tells B that the id exists.
  std::string normalised = with_stolen.status().message();
  normalised.replace(normalised.find(stolen), stolen.size(), never);
  EXPECT_EQ(normalised, with_unknown.status().message());

  // Client A can still refine with it on its own image.
  v1::SegmentRequest again;
  again.set_image_id(ra->image_id());
  v1::Prompt p = Point(12, 12);
  p.mutable_mask_input()->set_result_id(stolen);
  *again.add_prompts() = p;
  auto own = t.client->Segment(again);
  EXPECT_TRUE(own.ok()) << own.status().ToString();
}

// ---------------------------------------------------------------------------------------------------
// Finding 2: a second server on a port that is in use fails instead of sharing it (SO_REUSEPORT).

TEST(HardeningListen, SecondServerOnTheSamePortFails) {
  TestServer first;
  ASSERT_GT(first.server.port(), 0);
  ServerConfig c = TestConfig();
  c.listen = "127.0.0.1:" + std::to_string(first.server.port());
  MaskServer second(c, FakeFactory(), 0);
  Status s = second.StartListening();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("address already in use"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(c.listen), std::string::npos) << s.message();
  // The first one still answers.
  EXPECT_TRUE(first.client->GetInfo().ok());
}

TEST(HardeningListen, BinaryExitsNonZeroWhenThePortIsTaken) {
  const std::string binary = std::string(MASKD_BINARY_DIR) + "/server/maskd";
  ASSERT_EQ(access(binary.c_str(), X_OK), 0) << binary << " is not built";
  TestServer first;
  const std::string listen = "127.0.0.1:" + std::to_string(first.server.port());
  // The port is checked before the model loads, so the demo model (no checkpoint) is enough.
  // `timeout`: should the bind wrongly succeed, the server must not keep the test waiting forever.
  const std::string cmd = "timeout 60 " + binary +
                          " --models-dir /nonexistent-maskd-test-models --device cpu --listen " +
                          listen + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string log;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) log.append(buf, n);
  const int status = pclose(p);
  ASSERT_TRUE(WIFEXITED(status)) << log;
  EXPECT_NE(WEXITSTATUS(status), 0) << log;
  EXPECT_NE(log.find("address already in use"), std::string::npos) << log;
  EXPECT_TRUE(first.client->GetInfo().ok());
}

// ---------------------------------------------------------------------------------------------------
// Finding 4: request text cannot forge log lines.

TEST(HardeningLogSafe, EscapesControlsBackslashesAndInvalidUtf8) {
  EXPECT_EQ(LogSafe("plain tag 42"), "plain tag 42");
  EXPECT_EQ(LogSafe("a\nb\rc\td"), "a\\nb\\rc\\td");
  EXPECT_EQ(LogSafe(std::string("nul\0esc\x1b[31m\x7f", 13)), "nul\\x00esc\\x1b[31m\\x7f");
  EXPECT_EQ(LogSafe("back\\slash\\n"), "back\\\\slash\\\\n");  // a literal "\n" stays tellable
  const std::string utf8 = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80";  // valid: kept
  EXPECT_EQ(LogSafe(utf8), utf8);
  EXPECT_EQ(LogSafe("\xc2\x85next-line"), "\\u0085next-line");               // C1 NEL
  // A stray byte, a cut sequence, an overlong form.
  EXPECT_EQ(LogSafe("bad \xff \xc3 \xc0\xaf"), "bad \\xff \\xc3 \\xc0\\xaf");
  EXPECT_EQ(LogSafe("\xed\xa0\x80"), "\\xed\\xa0\\x80");                      // a UTF-16 surrogate
  EXPECT_EQ(LogSafe("cut at the end \xe2\x82"), "cut at the end \\xe2\\x82");
}

TEST(HardeningLogSafe, NewlinesInRequestTagAndEchoedIdsStayOnTheirLine) {
  TestServer t;  // sets the level to err: capture from here on
  CapturedLog log;
  v1::SegmentRequest r;
  *r.mutable_image() = EncodedPicture(24, 24, 3);
  r.set_request_tag("mine\n2026-01-01 00:00:00.000 I 1 [admin] access method=Forged status=OK");
  v1::Prompt p = Point(3, 3);
  p.mutable_mask_input()->set_result_id("rx\nFORGED-ERROR-LINE\r");
  *r.add_prompts() = p;
  auto res = t.client->Segment(r);
  EXPECT_EQ(res.status().code(), StatusCode::kNotFound);
  const std::string text = log.text();
  // One access line with the tag escaped, one debug line with the echoed id escaped.
  EXPECT_NE(text.find(" tag=mine\\n2026-01-01 00:00:00.000 I 1 [admin] access method=Forged"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("rx\\nFORGED-ERROR-LINE\\r"), std::string::npos) << text;
  std::istringstream lines(text);
  std::string line;
  int count = 0;
  while (std::getline(lines, line)) {
    ++count;
    EXPECT_TRUE(line.rfind("I ", 0) == 0 || line.rfind("D ", 0) == 0) << "forged line: " << line;
    EXPECT_EQ(line.find('\r'), std::string::npos) << line;
  }
  EXPECT_GE(count, 2) << text;
}

// ---------------------------------------------------------------------------------------------------
// Finding 7: a message that does not parse ends the stream with INVALID_ARGUMENT, not OK.

TEST(HardeningStream, MalformedThirdOfFourMessagesEndsWithInvalidArgument) {
  TestServer t;
  v1::SegmentRequest first;
  *first.mutable_image() = EncodedPicture(32, 24, 4);
  *first.add_prompts() = Point(4, 4);
  first.set_request_tag("m0");
  v1::SegmentRequest next;
  *next.add_prompts() = Point(8, 8);
  next.set_request_tag("m1");
  // Field 1 (image), length 100, but only 7 bytes follow: not a parsable SegmentRequest.
  const std::string malformed("\x0a\x64garbage", 9);
  v1::SegmentRequest after = next;
  after.set_request_tag("m3");
  ASSERT_FALSE(v1::SegmentRequest().ParseFromString(malformed));

  grpc::CompletionQueue cq;
  grpc::GenericStub stub(t.client->channel());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto call = stub.PrepareCall(&ctx, "/maskd.v1.MaskService/SegmentStream", &cq);
  void* tag = nullptr;
  bool ok = false;
  intptr_t next_tag = 1;
  auto step = [&]() {
    const intptr_t want = next_tag++;
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(reinterpret_cast<intptr_t>(tag), want);
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(next_tag));
  ASSERT_TRUE(step());
  for (const std::string& bytes : {Serialized(first), Serialized(next), malformed, Serialized(after)}) {
    call->Write(Wire(bytes), reinterpret_cast<void*>(next_tag));
    if (!step()) break;  // the server may have ended the stream already
  }
  call->WritesDone(reinterpret_cast<void*>(next_tag));
  step();
  std::vector<v1::SegmentResponse> responses;
  for (;;) {
    grpc::ByteBuffer b;
    call->Read(&b, reinterpret_cast<void*>(next_tag));
    if (!step()) break;
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(b.Dump(&slices).ok());
    std::string bytes;
    for (const auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    v1::SegmentResponse r;
    ASSERT_TRUE(r.ParseFromString(bytes));
    responses.push_back(r);
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(next_tag));
  step();
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  ASSERT_EQ(responses.size(), 2u);
  EXPECT_EQ(responses[0].request_tag(), "m0");
  EXPECT_EQ(responses[1].request_tag(), "m1");
  EXPECT_FALSE(responses[0].has_error()) << responses[0].error().message();
  EXPECT_FALSE(responses[1].has_error()) << responses[1].error().message();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find("message 2"), std::string::npos) << status.error_message();
  EXPECT_NE(status.error_message().find("SegmentRequest"), std::string::npos) << status.error_message();
  // The malformed message is counted with the answers (GetInfo.calls_by_status).
  auto info = t.client->GetInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->calls_by_status().count("INVALID_ARGUMENT"), 1u);
  if (info->calls_by_status().count("INVALID_ARGUMENT")) {
    EXPECT_EQ(info->calls_by_status().at("INVALID_ARGUMENT"), 1u);
  }
}

TEST(HardeningUnary, UnparsableRequestIsInvalidArgument) {
  TestServer t;
  auto invalid_calls = [&] {
    auto info = t.client->GetInfo();
    EXPECT_TRUE(info.ok());
    auto it = info->calls_by_status().find("INVALID_ARGUMENT");
    return it == info->calls_by_status().end() ? uint64_t{0} : it->second;
  };
  const uint64_t invalid_before = invalid_calls();
  CapturedLog log;
  grpc::GenericStub stub(t.client->channel());
  for (const char* method : {"/maskd.v1.MaskService/Segment", "/maskd.v1.MaskService/Embed"}) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::ByteBuffer request = Wire(std::string("\x0a\x64garbage", 9)), response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response,
                   [&](grpc::Status s) { done.set_value(s); });
    const grpc::Status s = done.get_future().get();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(method), std::string::npos) << s.error_message();
  }
  // Invalid UTF-8 in a string field (request_tag, field 5) does not parse either: INVALID_ARGUMENT,
  // not UNIMPLEMENTED.
  {
    v1::SegmentRequest r;
    r.set_image_id("abc");
    *r.add_prompts() = Point(1, 1);
    const std::string bad = Serialized(r) + std::string("\x2a\x03\xff\xfe\n", 5);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::ByteBuffer request = Wire(bad), response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&ctx, "/maskd.v1.MaskService/Segment", grpc::StubOptions(), &request, &response,
                   [&](grpc::Status s) { done.set_value(s); });
    const grpc::Status s = done.get_future().get();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  }
  // Real UNIMPLEMENTED answers (no such method) are left alone.
  grpc::ClientContext ctx;
  grpc::ByteBuffer request = Wire(""), response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/maskd.v1.MaskService/NoSuchMethod", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) { done.set_value(s); });
  EXPECT_EQ(done.get_future().get().error_code(), grpc::StatusCode::UNIMPLEMENTED);
  // And well-formed requests still work.
  EXPECT_TRUE(t.client->GetInfo().ok());
  // All are logged and counted in GetInfo like any call answered INVALID_ARGUMENT.
  EXPECT_EQ(invalid_calls(), invalid_before + 3);
  const std::string text = log.text();
  for (const char* method : {"method=/maskd.v1.MaskService/Segment status=INVALID_ARGUMENT",
                             "method=/maskd.v1.MaskService/Embed status=INVALID_ARGUMENT"}) {
    EXPECT_NE(text.find(method), std::string::npos) << text;
  }
}

TEST(HardeningStream, WellFormedStreamsStillEndOk) {
  TestServer t;
  auto session = t.client->OpenSession();
  v1::SegmentRequest first;
  *first.mutable_image() = EncodedPicture(32, 24, 5);
  *first.add_prompts() = Point(4, 4);
  auto r0 = session->Send(first);
  ASSERT_TRUE(r0.ok()) << r0.status().ToString();
  v1::SegmentRequest next;
  *next.add_prompts() = Point(9, 9);
  auto r1 = session->Send(next);
  ASSERT_TRUE(r1.ok()) << r1.status().ToString();
  EXPECT_TRUE(session->Finish().ok());
}

// ---------------------------------------------------------------------------------------------------
// Finding 2: one big request does not make a click wait for all of it, and a cancelled or expired
// request is dropped from the decoder queue before more model work (the log says so, not OK).

constexpr int kBigPrompts = 256;
constexpr auto kPerPrompt = std::chrono::milliseconds(8);  // the fake decoder's cost per prompt
// What the big request costs when all of it is decoded.
constexpr auto kBigCost = kPerPrompt * kBigPrompts;

struct FairnessServer : TestServer {
  FairnessServer() : TestServer(Config(), Options()) {
    v1::EmbedRequest e;
    *e.mutable_image() = EncodedPicture(64, 48, 9);
    auto r = client->Embed(e);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) image_id = r->image_id();
  }
  static ServerConfig Config() {
    ServerConfig c = TestConfig();
    c.decoder_request_prompts = 16;
    c.shutdown_grace_s = 5;
    return c;
  }
  static FakeEngineOptions Options() {
    FakeEngineOptions fo;
    fo.decode_delay_per_prompt = kPerPrompt;
    return fo;
  }
  v1::SegmentRequest Big() const {
    v1::SegmentRequest r;
    r.set_image_id(image_id);
    for (int i = 0; i < kBigPrompts; ++i) *r.add_prompts() = Point(i % 60, (i / 60) % 40);
    return r;
  }
  // Waits until the decoder works on the big request.
  void WaitForDecoding() {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (engine.load()->decode_calls.load() == 0 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_GT(engine.load()->decode_calls.load(), 0);
  }
  // One click's latency; it must succeed.
  std::chrono::duration<double> Click() {
    v1::SegmentRequest r;
    r.set_image_id(image_id);
    *r.add_prompts() = Point(20, 20);
    const auto t0 = std::chrono::steady_clock::now();
    auto res = client->Segment(r);
    const auto dt = std::chrono::steady_clock::now() - t0;
    EXPECT_TRUE(res.ok()) << res.status().ToString();
    return dt;
  }
  uint64_t DroppedByDecoder() {
    auto info = client->GetInfo();
    EXPECT_TRUE(info.ok());
    return info.ok() ? info->decoder_queue().dropped() : 0;
  }
  std::string image_id;
};

TEST(HardeningFairness, ClickAfterABigRequestDoesNotWaitForAllOfIt) {
  FairnessServer t;
  ASSERT_FALSE(t.image_id.empty());
  const auto t0 = std::chrono::steady_clock::now();
  auto big = std::async(std::launch::async, [&] {
    auto r = t.client->Segment(t.Big());
    return std::make_pair(r, std::chrono::steady_clock::now() - t0);
  });
  t.WaitForDecoding();
  const auto click = t.Click();
  auto [res, big_took] = big.get();
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->results_size(), kBigPrompts);
  const double big_s = std::chrono::duration<double>(big_took).count();
  // All of the big request: >= 2 s of decoding. The click waits for one 16-prompt part (0.13 s).
  EXPECT_GE(big_s, std::chrono::duration<double>(kBigCost).count() * 0.9);
  EXPECT_LT(click.count(), big_s / 3) << "the click took " << click.count() << " s, the big request "
                                      << big_s << " s";
}

TEST(HardeningFairness, ExpiredBigRequestIsDroppedAndLoggedAsDeadlineExceeded) {
  FairnessServer t;
  ASSERT_FALSE(t.image_id.empty());
  CapturedLog log;
  auto stub = v1::MaskService::NewStub(t.client->channel());
  const auto t0 = std::chrono::steady_clock::now();
  auto big = std::async(std::launch::async, [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(400));
    v1::SegmentResponse response;
    return stub->Segment(&ctx, t.Big(), &response);
  });
  t.WaitForDecoding();
  const auto click = t.Click();
  const grpc::Status s = big.get();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  EXPECT_LT(click.count(), std::chrono::duration<double>(kBigCost).count() / 3);
  // Let the time pass that the whole big request would have taken: its parts after the deadline
  // never reach the engine.
  std::this_thread::sleep_until(t0 + kBigCost + std::chrono::milliseconds(300));
  const int decoded = t.engine.load()->decoded_prompts.load();
  EXPECT_LT(decoded, kBigPrompts / 2) << "prompts decoded after the deadline";
  EXPECT_GE(t.DroppedByDecoder(), 1u);
  const std::string text = log.text();
  EXPECT_TRUE(std::regex_search(text, std::regex("method=Segment [^\n]*status=DEADLINE_EXCEEDED"
                                                 "[^\n]*prompts=256")))
      << text;
  EXPECT_FALSE(std::regex_search(text, std::regex("method=Segment [^\n]*status=OK[^\n]*prompts=256")))
      << text;
}

TEST(HardeningFairness, CancelledBigRequestIsDroppedAndLoggedAsCancelled) {
  FairnessServer t;
  ASSERT_FALSE(t.image_id.empty());
  CapturedLog log;
  auto stub = v1::MaskService::NewStub(t.client->channel());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  const auto t0 = std::chrono::steady_clock::now();
  auto big = std::async(std::launch::async, [&] {
    v1::SegmentResponse response;
    return stub->Segment(&ctx, t.Big(), &response);
  });
  t.WaitForDecoding();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ctx.TryCancel();
  const grpc::Status s = big.get();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED) << s.error_message();
  const auto click = t.Click();
  EXPECT_LT(click.count(), std::chrono::duration<double>(kBigCost).count() / 3);
  std::this_thread::sleep_until(t0 + kBigCost + std::chrono::milliseconds(300));
  EXPECT_LT(t.engine.load()->decoded_prompts.load(), kBigPrompts / 2);
  EXPECT_GE(t.DroppedByDecoder(), 1u);
  // The server's access line for the big call comes when its last part is reported.
  std::string text;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < until) {
    text = log.text();
    if (text.find("prompts=256") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(std::regex_search(text, std::regex("method=Segment [^\n]*status=CANCELLED[^\n]*prompts=256")))
      << text;
}

TEST(HardeningFairness, ExpiredImageIsDroppedFromTheEncoderQueue) {
  TestServer t;
  CapturedLog log;
  FakeEngine* engine = t.engine.load();
  engine->HoldEncodes();
  auto first = std::async(std::launch::async, [&] {
    v1::EmbedRequest r;
    *r.mutable_image() = EncodedPicture(40, 40, 11);
    return t.client->Embed(r);
  });
  ASSERT_TRUE(engine->WaitForEncodeCalls(1, std::chrono::seconds(10)));
  // Queued behind the held batch until its deadline passes.
  auto stub = v1::MaskService::NewStub(t.client->channel());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
  v1::EmbedRequest late;
  *late.mutable_image() = EncodedPicture(40, 40, 12);
  v1::EmbedResponse response;
  const grpc::Status s = stub->Embed(&ctx, late, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  // The server's deadline is the client's plus the request's transit time.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  engine->ReleaseEncodes();
  auto res = first.get();
  EXPECT_TRUE(res.ok()) << res.status().ToString();
  // The expired image is dropped when the next batch forms, never encoded.
  uint64_t dropped = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (dropped == 0 && std::chrono::steady_clock::now() < until) {
    auto info = t.client->GetInfo();
    dropped = info.ok() ? info->encoder_queue().dropped() : 0;
    if (dropped == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(dropped, 1u);
  EXPECT_EQ(engine->encoded_images.load(), 1);
  // Its access line follows the drop (the counter is updated first).
  const std::regex expired("method=Embed [^\n]*status=DEADLINE_EXCEEDED");
  bool logged = false;
  for (int i = 0; i < 500 && !logged; ++i) {
    logged = std::regex_search(log.text(), expired);
    if (!logged) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(logged) << log.text();
}

// ---------------------------------------------------------------------------------------------------
// Truncated and lying JPEGs: INVALID_ARGUMENT through gRPC, naming the field, and nothing reaches the
// engine.

TEST(HardeningImages, TruncatedAndLyingJpegsAreInvalidArgumentOverGrpc) {
  TestServer t;
  ImageRGB8 busy{256, 192, std::vector<uint8_t>(256 * 192 * 3)};
  uint32_t x = 7;
  for (auto& p : busy.pixels) p = static_cast<uint8_t>((x = x * 1103515245u + 12345u) >> 24);
  const std::string jpeg = *EncodeJpeg(busy, 90);
  const std::string eoi("\xff\xd9", 2);
  std::string liar = *EncodeJpeg(ImageRGB8{16, 16, std::vector<uint8_t>(16 * 16 * 3, 90)}, 75);
  for (size_t i = 2; i + 8 < liar.size(); ++i) {
    if (static_cast<uint8_t>(liar[i]) == 0xff && static_cast<uint8_t>(liar[i + 1]) == 0xc0) {
      liar[i + 5] = static_cast<char>(4000 >> 8), liar[i + 6] = static_cast<char>(4000 & 0xff);
      liar[i + 7] = static_cast<char>(16000 >> 8), liar[i + 8] = static_cast<char>(16000 & 0xff);
      break;
    }
  }
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"cut in half, then EOI", jpeg.substr(0, jpeg.size() / 2) + eoi},
      {"cut at 10 %", jpeg.substr(0, jpeg.size() / 10)},
      {"16000 x 4000 declared in a tiny file", liar},
  };
  for (const auto& [what, bytes] : cases) {
    v1::EmbedRequest e;
    e.mutable_image()->set_encoded(bytes);
    auto embedded = t.client->Embed(e);
    ASSERT_FALSE(embedded.ok()) << what;
    EXPECT_EQ(embedded.status().code(), StatusCode::kInvalidArgument) << what;
    EXPECT_NE(embedded.status().message().find("image.encoded: "), std::string::npos)
        << what << ": " << embedded.status().message();
    EXPECT_NE(embedded.status().message().find("JPEG"), std::string::npos)
        << what << ": " << embedded.status().message();
    v1::SegmentRequest r;
    r.mutable_image()->set_encoded(bytes);
    *r.add_prompts() = Point(4, 4);
    auto segmented = t.client->Segment(r);
    ASSERT_FALSE(segmented.ok()) << what;
    EXPECT_EQ(segmented.status().code(), StatusCode::kInvalidArgument) << what;
  }
  EXPECT_EQ(t.engine.load()->prepare_calls.load(), 0);
  // The intact file is served.
  v1::EmbedRequest good;
  good.mutable_image()->set_encoded(jpeg);
  auto ok = t.client->Embed(good);
  EXPECT_TRUE(ok.ok()) << ok.status().ToString();
}

// ---------------------------------------------------------------------------------------------------
// Finding 8: a signal ends maskd in bounded time with exit 0, during a long batch and during loading.
// These run maskd_fake (the product's process life around the fake engine) as a child process.

class ChildProcess {
 public:
  explicit ChildProcess(const std::vector<std::string>& args) {
    int fds[2];
    EXPECT_EQ(pipe(fds), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    EXPECT_EQ(posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ), 0) << args[0];
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    reader_ = std::thread([this, fd = fds[0]] {
      char buf[4096];
      ssize_t n;
      while ((n = read(fd, buf, sizeof buf)) > 0) {
        std::lock_guard<std::mutex> lock(mu_);
        out_.append(buf, static_cast<size_t>(n));
      }
      close(fd);
    });
  }
  ~ChildProcess() {
    if (!exited_) {
      kill(pid_, SIGKILL);
      int status;
      waitpid(pid_, &status, 0);
    }
    reader_.join();
  }
  std::string output() {
    std::lock_guard<std::mutex> lock(mu_);
    return out_;
  }
  // The first match of `pattern` in the output (group 1 if any), waiting up to `timeout`.
  std::optional<std::string> WaitFor(const std::string& pattern, std::chrono::seconds timeout) {
    const std::regex re(pattern);
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      std::smatch m;
      const std::string text = output();
      if (std::regex_search(text, m, re)) return m.size() > 1 ? m[1].str() : m[0].str();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return std::nullopt;
  }
  void Signal(int sig) { kill(pid_, sig); }
  // The exit code, or nullopt when the process is still running after `timeout` (or was killed).
  std::optional<int> WaitExit(std::chrono::seconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        if (WIFEXITED(status)) return WEXITSTATUS(status);
        return std::nullopt;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return std::nullopt;
  }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  std::thread reader_;
  std::mutex mu_;
  std::string out_;
};

std::vector<std::string> FakeMaskdArgs(std::vector<std::string> extra) {
  std::vector<std::string> args{std::string(MASKD_BINARY_DIR) + "/tests/maskd_fake",
                                "--listen", "127.0.0.1:0", "--device", "cpu",
                                "--models-dir", "/nonexistent-maskd-test-models", "--log-level", "info"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST(HardeningShutdown, SignalDuringLoadingExitsZeroPromptly) {
  ChildProcess p(FakeMaskdArgs({"--fake-load-ms", "60000"}));
  ASSERT_TRUE(p.WaitFor("loading the engine", std::chrono::seconds(20))) << p.output();
  const auto t0 = std::chrono::steady_clock::now();
  p.Signal(SIGTERM);
  const std::optional<int> code = p.WaitExit(std::chrono::seconds(20));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(code.has_value()) << "still running or killed: " << p.output();
  EXPECT_EQ(*code, 0) << p.output();
  EXPECT_LT(took, 10.0) << "waited for the 60 s load";
}

// maskd_fake whose decoder batches take 60 s, and one Segment call in such a batch: what a signal does
// while a batch runs.
struct LongBatch {
  explicit LongBatch(const std::string& shutdown_grace_s)
      : p(FakeMaskdArgs({"--fake-decode-ms", "60000", "--shutdown-grace-s", shutdown_grace_s,
                         "--decoder-queue-delay-us", "0"})) {}

  // Returns once the call's decoder batch runs (fatal failure if maskd does not get there in 20 s).
  void Start(int seed) {
    const std::optional<std::string> port =
        p.WaitFor("listening on 127\\.0\\.0\\.1:([0-9]+)", std::chrono::seconds(20));
    ASSERT_TRUE(port) << p.output();
    ASSERT_TRUE(p.WaitFor("serving maskd", std::chrono::seconds(20))) << p.output();
    ClientOptions co;
    co.target = "127.0.0.1:" + *port;
    co.timeout = std::chrono::milliseconds(120000);
    client = std::make_unique<Client>(co);
    call = std::async(std::launch::async, [this, seed] {
      v1::SegmentRequest r;
      *r.mutable_image() = EncodedPicture(32, 32, seed);
      *r.add_prompts() = Point(5, 5);
      return client->Segment(r);
    });
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    bool running = false;
    while (!running && std::chrono::steady_clock::now() < until) {
      auto info = client->GetInfo();
      running = info.ok() && info->decoder_queue().batches() >= 1;
      if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_TRUE(running) << p.output();
  }

  ChildProcess p;
  std::unique_ptr<Client> client;
  std::future<StatusOr<v1::SegmentResponse>> call;
};

TEST(HardeningShutdown, LongBatchDoesNotHoldTheExitPastTheGracePeriod) {
  LongBatch batch("1");
  ASSERT_NO_FATAL_FAILURE(batch.Start(/*seed=*/4));
  ChildProcess& p = batch.p;
  const auto t0 = std::chrono::steady_clock::now();
  p.Signal(SIGTERM);
  const std::optional<int> code = p.WaitExit(std::chrono::seconds(40));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(code.has_value()) << "still running or killed: " << p.output();
  EXPECT_EQ(*code, 0) << p.output();
  // --shutdown-grace-s 1 + kShutdownMarginS (2 s), with room for a loaded machine; the batch: 60 s.
  EXPECT_LT(took, 1 + kShutdownMarginS + 4) << p.output();
  EXPECT_NE(p.output().find("exiting without waiting"), std::string::npos) << p.output();
  auto res = batch.call.get();
  EXPECT_FALSE(res.ok());
}

TEST(HardeningShutdown, SecondSignalExitsAtOnce) {
  LongBatch batch("60");
  ASSERT_NO_FATAL_FAILURE(batch.Start(/*seed=*/6));
  ChildProcess& p = batch.p;
  p.Signal(SIGTERM);
  ASSERT_TRUE(p.WaitFor("received SIGTERM: shutting down", std::chrono::seconds(10))) << p.output();
  // Draining (the call has 60 s of grace): the operator insists.
  const auto t0 = std::chrono::steady_clock::now();
  p.Signal(SIGINT);
  const std::optional<int> code = p.WaitExit(std::chrono::seconds(30));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(code.has_value()) << p.output();
  EXPECT_EQ(*code, 0) << p.output();
  EXPECT_LT(took, 3.0) << p.output();
  EXPECT_NE(p.output().find("received SIGINT again: exiting at once"), std::string::npos) << p.output();
  EXPECT_FALSE(batch.call.get().ok());
}

TEST(HardeningShutdown, IdleServerDrainsAndExitsZero) {
  ChildProcess p(FakeMaskdArgs({}));
  ASSERT_TRUE(p.WaitFor("serving maskd", std::chrono::seconds(20))) << p.output();
  p.Signal(SIGINT);
  const std::optional<int> code = p.WaitExit(std::chrono::seconds(20));
  ASSERT_TRUE(code.has_value()) << p.output();
  EXPECT_EQ(*code, 0) << p.output();
  EXPECT_NE(p.output().find("shut down"), std::string::npos) << p.output();
}

// ---------------------------------------------------------------------------------------------------
// Finding 9: accepted-but-unfinished work has a byte budget, checked before decoding.

TEST(HardeningMemory, NewImagesOverTheBudgetAreRefusedAtOnceAndClicksStillPass) {
  ServerConfig c = TestConfig();
  // The fake engine's prepared image is 1024 x 1024 x 3 floats (12.6 MB): one new image fits.
  c.max_inflight_bytes = 20 << 20;
  TestServer t(c);
  v1::EmbedRequest cached;
  *cached.mutable_image() = EncodedPicture(64, 64, 1);
  auto cached_res = t.client->Embed(cached);
  ASSERT_TRUE(cached_res.ok()) << cached_res.status().ToString();

  FakeEngine* engine = t.engine.load();
  engine->HoldEncodes();
  auto first = std::async(std::launch::async, [&] {
    v1::EmbedRequest r;
    *r.mutable_image() = EncodedPicture(200, 150, 2);
    return t.client->Embed(r);
  });
  ASSERT_TRUE(engine->WaitForEncodeCalls(2, std::chrono::seconds(10)));

  // A second new image, and one whose header claims 8000 x 8000 in a few bytes: refused at once.
  v1::EmbedRequest second;
  *second.mutable_image() = EncodedPicture(200, 150, 3);
  std::string lying = EncodedPicture(16, 16, 4).encoded();
  for (int at : {16, 20}) {
    lying[at] = 0, lying[at + 1] = 0, lying[at + 2] = 0x1f, lying[at + 3] = 0x40;  // 8000
  }
  v1::EmbedRequest lie;
  lie.mutable_image()->set_encoded(lying);
  const int prepares = engine->prepare_calls.load();
  for (const v1::EmbedRequest* r : {&second, &lie}) {
    const auto t0 = std::chrono::steady_clock::now();
    auto res = t.client->Embed(*r);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_FALSE(res.ok());
    EXPECT_EQ(res.status().code(), StatusCode::kResourceExhausted) << res.status().ToString();
    EXPECT_NE(res.status().message().find("--max-inflight-bytes"), std::string::npos)
        << res.status().message();
    EXPECT_LT(took, 2.0);
  }
  EXPECT_EQ(engine->prepare_calls.load(), prepares) << "a refused image was decoded";

  // Clicks on a cached image pass the flood: by image_id, and with the image's bytes again (found
  // in the cache, so never decoded).
  v1::SegmentRequest click;
  click.set_image_id(cached_res->image_id());
  *click.add_prompts() = Point(10, 10);
  auto clicked = t.client->Segment(click);
  EXPECT_TRUE(clicked.ok()) << clicked.status().ToString();
  v1::SegmentRequest click_bytes;
  *click_bytes.mutable_image() = cached.image();
  *click_bytes.add_prompts() = Point(10, 10);
  auto clicked_bytes = t.client->Segment(click_bytes);
  EXPECT_TRUE(clicked_bytes.ok()) << clicked_bytes.status().ToString();
  EXPECT_EQ(engine->prepare_calls.load(), prepares);

  engine->ReleaseEncodes();
  auto first_res = first.get();
  EXPECT_TRUE(first_res.ok()) << first_res.status().ToString();
  // Finished work gives its bytes back.
  EXPECT_EQ(t.server.pipeline()->inflight().used(), 0u);
  // A budget holding nothing else admits an image larger than all of it.
  {
    ServerConfig small = TestConfig();
    small.max_inflight_bytes = 1 << 20;
    TestServer u(small);
    auto big = u.client->Embed(second);
    EXPECT_TRUE(big.ok()) << big.status().ToString();
  }
  auto again = t.client->Embed(second);
  EXPECT_TRUE(again.ok()) << again.status().ToString();
}

}  // namespace
}  // namespace maskd::server
