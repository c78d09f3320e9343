// Issue #14, Security: TLS, mutual TLS, bearer tokens, the health exemption, reflection on/off and
// the plaintext warning, each through a real gRPC connection to a whole in-process server (fake
// engines) on an ephemeral loopback port. The certificates are made at test time by
// tests/make_test_certs.sh (Debian's openssl CLI): no private key lives in the tree.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <grpcpp/generic/generic_stub.h>
#include <httplib.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include "client/client.h"
#include "client/maskctl_commands.h"
#include "server/config.h"
#include "server/security.h"
#include "server/server.h"
#include "tests/fake_engine.h"

namespace maskd::server {
namespace {

namespace fs = std::filesystem;
using client::Client;
using client::ClientOptions;

constexpr char kToken[] = "s3cret-token-for-the-tests-0123456789";
constexpr char kOtherToken[] = "second-accepted-token";

// The PKI and token file, made once per test binary.
class Pki {
 public:
  static const Pki& Get() {
    static Pki pki;
    return pki;
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string read(const std::string& name) const {
    std::ifstream in(path(name));
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
  bool ok() const { return ok_; }

 private:
  Pki() {
    dir_ = fs::temp_directory_path() / ("maskd-security-test-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    const std::string cmd = std::string("bash '") + MASKD_SOURCE_DIR + "/tests/make_test_certs.sh' '" +
                            dir_.string() + "'";
    ok_ = std::system(cmd.c_str()) == 0;
    std::ofstream tokens(path("tokens.txt"));
    tokens << "# maskd test tokens\n\n  " << kToken << "  \n# a comment\n" << kOtherToken << "\n";
    std::ofstream one(path("token.txt"));
    one << "\n" << kToken << "\n";
    std::ofstream garbage(path("garbage.pem"));
    garbage << "not a certificate\n";
  }
  // Throwaway keys do not outlive the test binary.
  ~Pki() {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  fs::path dir_;
  bool ok_ = false;
};

EngineFactory FakeFactory() {
  return [](const EngineOptions& eo) -> StatusOr<std::unique_ptr<Engine>> {
    fake::FakeEngineOptions fo;
    fo.device = eo.device;
    return std::unique_ptr<Engine>(std::make_unique<fake::FakeEngine>(fo));
  };
}

ServerConfig BaseConfig() {
  ServerConfig c;
  c.listen = "127.0.0.1:0";
  c.models_dir = "/nonexistent-maskd-test-models";
  c.device = "cpu:0";
  c.encoder_queue_delay_us = 0;
  c.decoder_queue_delay_us = 0;
  c.decode_threads = 1;
  c.postprocess_threads = 1;
  c.shutdown_grace_s = 1;
  return c;
}

ServerConfig TlsConfig() {
  const Pki& pki = Pki::Get();
  ServerConfig c = BaseConfig();
  c.tls_cert = pki.path("server.pem");
  c.tls_key = pki.path("server.key");
  return c;
}

struct Running {
  explicit Running(const ServerConfig& c) : server(c, FakeFactory(), 0) {
    spdlog::set_level(spdlog::level::err);
    status = server.Start();
  }
  ~Running() { server.Shutdown(); }
  std::string target() const { return "127.0.0.1:" + std::to_string(server.port()); }
  MaskServer server;
  Status status;
};

ClientOptions Options(const Running& r, client::ClientSecurity sec = {}) {
  ClientOptions o;
  o.target = r.target();
  o.timeout = std::chrono::milliseconds(5000);
  o.connect_timeout = std::chrono::milliseconds(3000);
  o.security = std::move(sec);
  return o;
}

client::ClientSecurity TrustingCa(std::string token = "") {
  client::ClientSecurity s;
  s.tls = true;
  s.ca_pem = Pki::Get().read("ca.pem");
  s.token = std::move(token);
  return s;
}

// The client library keeps UNAUTHENTICATED (maskd::StatusCode::kUnauthenticated); the server's
// message must be empty.
bool IsUnauthenticated(const Status& s) {
  return s.code() == StatusCode::kUnauthenticated && s.message().empty();
}

// Health (when not exempt) and reflection are refused by gRPC's auth filter, whose message in gRPC
// 1.51 is its own error chain (no request data, no token): the code is what is promised there.
bool IsUnauthenticatedByGrpc(const Status& s) {
  return s.code() == StatusCode::kUnauthenticated && s.message().find(kToken) == std::string::npos;
}

class ServerSecurity : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(Pki::Get().ok()) << "tests/make_test_certs.sh failed (openssl?)"; }
};

// ---------------------------------------------------------------------------------------------------
// Tokens.

TEST(ServerSecurityTokens, FileSkipsCommentsAndBlanksAndTrims) {
  auto set = TokenSet::Parse("# c\n\n  abc  \r\n#x\ndef\n", "t");
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ((*set)->size(), 2u);
  EXPECT_TRUE((*set)->Accepts("abc"));
  EXPECT_TRUE((*set)->Accepts("def"));
  EXPECT_FALSE((*set)->Accepts("ab"));
  EXPECT_FALSE((*set)->Accepts("abcd"));
  EXPECT_FALSE((*set)->Accepts("#x"));
  EXPECT_FALSE((*set)->Accepts(""));
  EXPECT_TRUE((*set)->AcceptsAuthorization("Bearer abc"));
  EXPECT_TRUE((*set)->AcceptsAuthorization("bearer def"));
  EXPECT_FALSE((*set)->AcceptsAuthorization("abc"));
  EXPECT_FALSE((*set)->AcceptsAuthorization("Basic abc"));
  EXPECT_FALSE((*set)->AcceptsAuthorization("Bearer "));
}

TEST(ServerSecurityTokens, BadFilesAreRefusedWithoutShowingTokens) {
  auto empty = TokenSet::Parse("# only a comment\n\n", "tokens.txt");
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("--auth-tokens = \"tokens.txt\" holds no token"), std::string::npos)
      << empty.status().message();
  auto spaced = TokenSet::Parse("good\nhalf secret\n", "tokens.txt");
  ASSERT_FALSE(spaced.ok());
  EXPECT_NE(spaced.status().message().find("line 2"), std::string::npos) << spaced.status().message();
  EXPECT_EQ(spaced.status().message().find("secret"), std::string::npos) << spaced.status().message();
  auto missing = TokenSet::Load("/nonexistent/maskd-tokens");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("--auth-tokens = \"/nonexistent/maskd-tokens\" cannot be opened"),
            std::string::npos);
}

// ---------------------------------------------------------------------------------------------------
// Configuration and start-up errors.

TEST(ServerSecurityConfig, FlagsThatBelongTogether) {
  ServerConfig c = BaseConfig();
  c.tls_cert = "a.pem";
  Status s = ValidateConfig(c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--tls-cert = \"a.pem\" without --tls-key"), std::string::npos) << s.message();
  c = BaseConfig();
  c.tls_client_ca = "ca.pem";
  s = ValidateConfig(c);
  EXPECT_NE(s.message().find("--tls-client-ca = \"ca.pem\" without --tls-cert"), std::string::npos) << s.message();
  c = BaseConfig();
  c.auth_tokens = "t.txt";
  s = ValidateConfig(c);
  EXPECT_NE(s.message().find("--auth-tokens = \"t.txt\" without --tls-cert"), std::string::npos) << s.message();
}

TEST(ServerSecurityConfig, FlagsParse) {
  const char* argv[] = {"maskd", "--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-client-ca", "ca.pem",
                        "--auth-tokens", "t.txt", "--auth-exempt-health", "false", "--reflection", "off"};
  ConfigParseResult r = ParseConfig(static_cast<int>(std::size(argv)), argv);
  ASSERT_FALSE(r.exit) << r.output;
  EXPECT_EQ(r.config.tls_cert, "c.pem");
  EXPECT_EQ(r.config.tls_key, "k.pem");
  EXPECT_EQ(r.config.tls_client_ca, "ca.pem");
  EXPECT_EQ(r.config.auth_tokens, "t.txt");
  EXPECT_FALSE(r.config.auth_exempt_health);
  EXPECT_FALSE(r.config.reflection);
  const char* defaults[] = {"maskd"};
  ConfigParseResult d = ParseConfig(1, defaults);
  EXPECT_TRUE(d.config.auth_exempt_health);
  EXPECT_TRUE(d.config.reflection);
  const char* help[] = {"maskd", "--help"};
  ConfigParseResult h = ParseConfig(2, help);
  for (const char* flag : {"--tls-cert", "--tls-key", "--tls-client-ca", "--auth-tokens",
                           "--auth-exempt-health", "--reflection"}) {
    EXPECT_NE(h.output.find(flag), std::string::npos) << flag;
  }
}

TEST_F(ServerSecurity, StartupErrorsNameTheFlagAndFile) {
  const Pki& pki = Pki::Get();
  struct Case {
    std::function<void(ServerConfig&)> edit;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {[](ServerConfig& c) { c.tls_cert = "/nonexistent/server.pem"; },
       "--tls-cert = \"/nonexistent/server.pem\" cannot be opened"},
      {[](ServerConfig& c) { c.tls_key = "/nonexistent/server.key"; },
       "--tls-key = \"/nonexistent/server.key\" cannot be opened"},
      {[&](ServerConfig& c) { c.tls_cert = pki.path("garbage.pem"); }, "is not a PEM certificate"},
      {[&](ServerConfig& c) { c.tls_key = pki.path("garbage.pem"); }, "is not an unencrypted PEM private key"},
      {[&](ServerConfig& c) { c.tls_key = pki.path("server-encrypted.key"); },
       "is not an unencrypted PEM private key"},
      {[&](ServerConfig& c) { c.tls_key = pki.path("other.key"); },
       "\" does not belong to --tls-cert = \"" + pki.path("server.pem") + "\""},
      {[](ServerConfig& c) { c.tls_client_ca = "/nonexistent/ca.pem"; },
       "--tls-client-ca = \"/nonexistent/ca.pem\" cannot be opened"},
      {[&](ServerConfig& c) { c.tls_client_ca = pki.path("garbage.pem"); }, "--tls-client-ca = \""},
      {[](ServerConfig& c) { c.auth_tokens = "/nonexistent/tokens"; },
       "--auth-tokens = \"/nonexistent/tokens\" cannot be opened"},
  };
  for (const Case& k : cases) {
    ServerConfig c = TlsConfig();
    k.edit(c);
    Running r(c);
    EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument) << k.expected;
    EXPECT_NE(r.status.message().find(k.expected), std::string::npos)
        << "expected \"" << k.expected << "\" in: " << r.status.message();
  }
}

// ---------------------------------------------------------------------------------------------------
// TLS and mutual TLS.

TEST_F(ServerSecurity, TlsClientTrustingTheCaIsServed) {
  Running r(TlsConfig());
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  auto c = Client::Connect(Options(r, TrustingCa()));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto info = (*c)->GetInfo();
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  auto health = (*c)->Health();
  ASSERT_TRUE(health.ok());
  EXPECT_EQ(*health, client::ServingStatus::kServing);
}

TEST_F(ServerSecurity, PlaintextClientAndWrongCaFailAgainstTls) {
  Running r(TlsConfig());
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  Client plain(Options(r));
  auto info = plain.GetInfo();
  EXPECT_EQ(info.status().code(), StatusCode::kUnavailable) << info.status().ToString();
  client::ClientSecurity other = TrustingCa();
  other.ca_pem = Pki::Get().read("other-ca.pem");
  Client wrong(Options(r, other));
  info = wrong.GetInfo();
  EXPECT_EQ(info.status().code(), StatusCode::kUnavailable) << info.status().ToString();
}

TEST_F(ServerSecurity, MutualTlsNeedsAClientCertificateFromTheCa) {
  ServerConfig cfg = TlsConfig();
  cfg.tls_client_ca = Pki::Get().path("ca.pem");
  Running r(cfg);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  Client anonymous(Options(r, TrustingCa()));
  auto info = anonymous.GetInfo();
  EXPECT_EQ(info.status().code(), StatusCode::kUnavailable) << info.status().ToString();
  // Health too: without a certificate nothing gets through the handshake.
  EXPECT_FALSE(anonymous.Health().ok());

  client::ClientSecurity with_cert = TrustingCa();
  with_cert.cert_pem = Pki::Get().read("client.pem");
  with_cert.key_pem = Pki::Get().read("client.key");
  Client good(Options(r, with_cert));
  info = good.GetInfo();
  EXPECT_TRUE(info.ok()) << info.status().ToString();

  // A certificate the client CA did not sign (the server's own CA is the same here, so use a
  // self-signed one from the other CA's key material: the other CA's certificate is not a client
  // certificate of ca.pem).
  client::ClientSecurity foreign = TrustingCa();
  foreign.cert_pem = Pki::Get().read("other-ca.pem");
  foreign.key_pem = Pki::Get().read("other-ca.key");
  Client stranger(Options(r, foreign));
  info = stranger.GetInfo();
  EXPECT_EQ(info.status().code(), StatusCode::kUnavailable) << info.status().ToString();
}

// ---------------------------------------------------------------------------------------------------
// Bearer tokens.

class CapturingSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::string text() {
    std::lock_guard<std::mutex> lock(mutex_);
    return text_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    text_.append(formatted.data(), formatted.size());
  }
  void flush_() override {}

 private:
  std::string text_;
};

struct CapturedLog {
  CapturedLog() : old(spdlog::default_logger()), sink(std::make_shared<CapturingSink>()) {
    auto logger = std::make_shared<spdlog::logger>("security-capture", sink);
    logger->set_level(spdlog::level::trace);
    spdlog::set_default_logger(logger);
  }
  ~CapturedLog() { spdlog::set_default_logger(old); }
  std::shared_ptr<spdlog::logger> old;
  std::shared_ptr<CapturingSink> sink;
};

TEST_F(ServerSecurity, TokensMissingOrWrongAreUnauthenticatedWithNoDetail) {
  ServerConfig cfg = TlsConfig();
  cfg.auth_tokens = Pki::Get().path("tokens.txt");
  CapturedLog log;
  MaskServer server(cfg, FakeFactory(), 0);
  Status started = server.Start();
  ASSERT_TRUE(started.ok()) << started.ToString();
  ClientOptions o;
  o.target = "127.0.0.1:" + std::to_string(server.port());
  o.timeout = std::chrono::milliseconds(5000);

  for (const std::string& token : {std::string(), std::string("wrong"), std::string(kToken) + "x",
                                   std::string(kToken).substr(1)}) {
    o.security = TrustingCa(token);
    Client c(o);
    auto info = c.GetInfo();
    EXPECT_TRUE(IsUnauthenticated(info.status())) << "token \"" << token << "\": " << info.status().ToString();
    auto e = c.Embed(std::string("not an image"));
    EXPECT_TRUE(IsUnauthenticated(e.status())) << e.status().ToString();
  }
  for (const char* token : {kToken, kOtherToken}) {
    o.security = TrustingCa(token);
    Client c(o);
    auto info = c.GetInfo();
    EXPECT_TRUE(info.ok()) << token << ": " << info.status().ToString();
  }
  // SegmentStream (a raw bidi method with a reactor of its own) is refused the same way.
  {
    o.security = TrustingCa("wrong");
    Client c(o);
    auto session = c.OpenSession(std::chrono::milliseconds(5000));
    client::SegmentArgs args;
    args.image = client::ImageArg::Id("no-such-image");
    args.prompts.push_back(client::PromptArg{{client::PointArg{1, 1, true}}, std::nullopt, "", std::nullopt, false});
    auto r = session->Send(args);
    EXPECT_TRUE(IsUnauthenticated(r.status())) << r.status().ToString();
  }
  {
    o.security = TrustingCa(kToken);
    Client c(o);
    auto session = c.OpenSession(std::chrono::milliseconds(5000));
    client::SegmentArgs args;
    args.image = client::ImageArg::Id("no-such-image");
    args.prompts.push_back(client::PromptArg{{client::PointArg{1, 1, true}}, std::nullopt, "", std::nullopt, false});
    auto r = session->Send(args);
    // Past authentication: the server validates the id (and says what it expected).
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
    EXPECT_NE(r.status().message().find("image_id"), std::string::npos) << r.status().ToString();
  }
  server.Shutdown();
  const std::string logged = log.sink->text();
  EXPECT_EQ(logged.find(kToken), std::string::npos) << logged;
  EXPECT_EQ(logged.find(kOtherToken), std::string::npos) << logged;
  EXPECT_NE(logged.find("bearer tokens required (2 accepted)"), std::string::npos) << logged;
}

TEST_F(ServerSecurity, HealthIsExemptUnlessTurnedOff) {
  ServerConfig cfg = TlsConfig();
  cfg.auth_tokens = Pki::Get().path("tokens.txt");
  {
    Running r(cfg);
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    Client c(Options(r, TrustingCa()));
    auto h = c.Health();
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    EXPECT_EQ(*h, client::ServingStatus::kServing);
    // The exemption is for health only.
    EXPECT_TRUE(IsUnauthenticated(c.GetInfo().status()));
  }
  cfg.auth_exempt_health = false;
  Running r(cfg);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  Client without(Options(r, TrustingCa()));
  EXPECT_TRUE(IsUnauthenticatedByGrpc(without.Health().status())) << without.Health().status().ToString();
  Client with(Options(r, TrustingCa(kToken)));
  auto h = with.Health();
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(*h, client::ServingStatus::kServing);
}

TEST_F(ServerSecurity, HttpFrontChecksTheSameTokens) {
  ServerConfig cfg = TlsConfig();
  cfg.auth_tokens = Pki::Get().path("tokens.txt");
  cfg.http_listen = "127.0.0.1:0";
  Running r(cfg);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  httplib::Client http("127.0.0.1", r.server.http_port());
  auto none = http.Get("/v1/info");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  EXPECT_NE(none->body.find("UNAUTHENTICATED"), std::string::npos) << none->body;
  auto wrong = http.Get("/v1/info", httplib::Headers{{"Authorization", "Bearer nope"}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  auto right = http.Get("/v1/info", httplib::Headers{{"Authorization", std::string("Bearer ") + kToken}});
  ASSERT_TRUE(right);
  EXPECT_EQ(right->status, 200) << right->body;
}

// ---------------------------------------------------------------------------------------------------
// Reflection and exposure.

// One ServerReflectionInfo exchange (list_services) with raw bytes: OK and the response, or the
// status (UNIMPLEMENTED when reflection is off).
grpc::Status ListServices(const std::string& target, std::string* response_bytes) {
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  auto call = stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  auto wait = [&cq](intptr_t want) {
    void* tag = nullptr;
    bool ok = false;
    while (cq.Next(&tag, &ok)) {
      if (reinterpret_cast<intptr_t>(tag) == want) return ok;
    }
    return false;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  wait(1);
  // ServerReflectionRequest{list_services: ""}: field 7, length-delimited, empty.
  const char request[] = {0x3a, 0x00};
  grpc::Slice slice(request, sizeof request);
  grpc::ByteBuffer out(&slice, 1);
  call->Write(out, reinterpret_cast<void*>(2));
  wait(2);
  call->WritesDone(reinterpret_cast<void*>(3));
  wait(3);
  grpc::ByteBuffer in;
  call->Read(&in, reinterpret_cast<void*>(4));
  if (wait(4)) {
    std::vector<grpc::Slice> slices;
    (void)in.Dump(&slices);
    for (const auto& s : slices) response_bytes->append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  wait(5);
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

TEST_F(ServerSecurity, ReflectionCanBeTurnedOff) {
  {
    Running r(BaseConfig());
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    std::string listed;
    grpc::Status s = ListServices(r.target(), &listed);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_NE(listed.find("maskd.v1.MaskService"), std::string::npos);
  }
  ServerConfig cfg = BaseConfig();
  cfg.reflection = false;
  Running r(cfg);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  std::string listed;
  grpc::Status s = ListServices(r.target(), &listed);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED) << s.error_message();
  EXPECT_EQ(listed.find("maskd.v1.MaskService"), std::string::npos);
}

TEST_F(ServerSecurity, PlaintextOnAPublicAddressWarnsLoudly) {
  const std::string warning = "PLAINTEXT WITHOUT AUTHENTICATION";
  {
    CapturedLog log;
    ServerConfig cfg = BaseConfig();
    cfg.listen = "0.0.0.0:0";
    MaskServer server(cfg, FakeFactory(), 0);
    ASSERT_TRUE(server.StartListening().ok());
    server.Shutdown();
    EXPECT_NE(log.sink->text().find(warning), std::string::npos) << log.sink->text();
  }
  for (ServerConfig cfg : {BaseConfig(), [] {
                             ServerConfig c = TlsConfig();
                             c.listen = "0.0.0.0:0";
                             return c;
                           }()}) {
    CapturedLog log;
    MaskServer server(cfg, FakeFactory(), 0);
    Status s = server.StartListening();
    ASSERT_TRUE(s.ok()) << s.ToString();
    server.Shutdown();
    EXPECT_EQ(log.sink->text().find(warning), std::string::npos) << cfg.listen << ": " << log.sink->text();
  }
}

// ---------------------------------------------------------------------------------------------------
// maskctl and the client flags.

int Maskctl(const std::vector<std::string>& args, std::string* out_text, std::string* err_text) {
  std::ostringstream out, err;
  CLI::App app{"maskctl"};
  app.require_subcommand(1);
  client::MaskctlConfig config;
  client::MaskctlRun run;
  client::AddClientCommands(app, config, run, out, err);
  std::vector<const char*> argv = {"maskctl"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  int code;
  try {
    app.parse(static_cast<int>(argv.size()), const_cast<char**>(argv.data()));
    code = run.exit_code;
  } catch (const CLI::ParseError& e) {
    err << "parse error: " << e.what();
    code = 100;
  }
  *out_text = out.str();
  *err_text = err.str();
  return code;
}

TEST_F(ServerSecurity, MaskctlWithTlsCaAndToken) {
  const Pki& pki = Pki::Get();
  ServerConfig cfg = TlsConfig();
  cfg.auth_tokens = pki.path("tokens.txt");
  Running r(cfg);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  std::string out, err;
  ::unsetenv("MASKD_TOKEN");
  EXPECT_EQ(Maskctl({"--server", r.target(), "--tls-ca", pki.path("ca.pem"), "--token-file",
                     pki.path("token.txt"), "info"},
                    &out, &err),
            0)
      << err;
  EXPECT_NE(out.find("maskd"), std::string::npos) << out;
  EXPECT_EQ(Maskctl({"--server", r.target(), "--tls-ca", pki.path("ca.pem"), "--token", kOtherToken, "info"},
                    &out, &err),
            0)
      << err;
  ::setenv("MASKD_TOKEN", kToken, 1);
  EXPECT_EQ(Maskctl({"--server", r.target(), "--tls-ca", pki.path("ca.pem"), "info"}, &out, &err), 0) << err;
  ::unsetenv("MASKD_TOKEN");
  EXPECT_EQ(Maskctl({"--server", r.target(), "--tls-ca", pki.path("ca.pem"), "info"}, &out, &err), 1);
  EXPECT_NE(err.find("UNAUTHENTICATED"), std::string::npos) << err;
  // A token without TLS is refused before anything is sent, and not echoed.
  EXPECT_EQ(Maskctl({"--server", r.target(), "--token", kToken, "info"}, &out, &err), 1);
  EXPECT_NE(err.find("without TLS"), std::string::npos) << err;
  EXPECT_EQ(err.find(kToken), std::string::npos) << err;
  EXPECT_EQ(Maskctl({"--server", r.target(), "--tls-ca", "/nonexistent/ca.pem", "info"}, &out, &err), 1);
  EXPECT_NE(err.find("--tls-ca = \"/nonexistent/ca.pem\" cannot be opened"), std::string::npos) << err;
}

TEST(ServerSecurityClientFlags, ApplySecurityFlagsRules) {
  client::ClientSecurity sec;
  client::SecurityFlags f;
  f.tls_cert = "c.pem";
  Status s = client::ApplySecurityFlags(f, &sec);
  EXPECT_NE(s.message().find("--tls-cert = \"c.pem\" without --tls-key"), std::string::npos) << s.message();
  f = {};
  f.token = "a";
  f.token_file = "b";
  s = client::ApplySecurityFlags(f, &sec);
  EXPECT_NE(s.message().find("--token and --token-file"), std::string::npos) << s.message();
  f = {};
  f.tls = true;
  f.token = "tok";
  ASSERT_TRUE(client::ApplySecurityFlags(f, &sec).ok());
  EXPECT_TRUE(sec.tls);
  EXPECT_EQ(sec.token, "tok");
  EXPECT_TRUE(sec.ca_pem.empty());
}

}  // namespace
}  // namespace maskd::server
