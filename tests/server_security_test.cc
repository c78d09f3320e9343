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
#include <spdlog/spdlog.h>
#include <unistd.h>

#include "client/client.h"
#include "client/maskctl_commands.h"
#include "model/io/image_codec.h"
#include "server/config.h"
#include "server/security.h"
#include "server/server.h"
#include "tests/fake_engine.h"
#include "tests/server_fixture.h"

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

ServerConfig BaseConfig() { return TestConfig(/*threads=*/1, /*shutdown_grace_s=*/1); }

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
                        "--auth-tokens", "t.txt", "--auth-exempt-health", "false", "--reflection", "off",
                        "--auth-shared-cache", "true"};
  ConfigParseResult r = ParseConfig(static_cast<int>(std::size(argv)), argv);
  ASSERT_FALSE(r.exit) << r.output;
  EXPECT_EQ(r.config.tls_cert, "c.pem");
  EXPECT_EQ(r.config.tls_key, "k.pem");
  EXPECT_EQ(r.config.tls_client_ca, "ca.pem");
  EXPECT_EQ(r.config.auth_tokens, "t.txt");
  EXPECT_FALSE(r.config.auth_exempt_health);
  EXPECT_FALSE(r.config.reflection);
  EXPECT_TRUE(r.config.auth_shared_cache);
  const char* defaults[] = {"maskd"};
  ConfigParseResult d = ParseConfig(1, defaults);
  EXPECT_TRUE(d.config.auth_exempt_health);
  EXPECT_TRUE(d.config.reflection);
  EXPECT_FALSE(d.config.auth_shared_cache);  // scoped per token unless asked
  const char* help[] = {"maskd", "--help"};
  ConfigParseResult h = ParseConfig(2, help);
  for (const char* flag : {"--tls-cert", "--tls-key", "--tls-client-ca", "--auth-tokens",
                           "--auth-exempt-health", "--reflection", "--auth-shared-cache"}) {
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

TEST_F(ServerSecurity, TokensMissingOrWrongAreUnauthenticatedWithNoDetail) {
  ServerConfig cfg = TlsConfig();
  cfg.auth_tokens = Pki::Get().path("tokens.txt");
  CapturedLog log(spdlog::level::trace);
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
  const std::string logged = log.text();
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
    CapturedLog log(spdlog::level::trace);
    ServerConfig cfg = BaseConfig();
    cfg.listen = "0.0.0.0:0";
    MaskServer server(cfg, FakeFactory(), 0);
    ASSERT_TRUE(server.StartListening().ok());
    server.Shutdown();
    EXPECT_NE(log.text().find(warning), std::string::npos) << log.text();
  }
  for (ServerConfig cfg : {BaseConfig(), [] {
                             ServerConfig c = TlsConfig();
                             c.listen = "0.0.0.0:0";
                             return c;
                           }()}) {
    CapturedLog log(spdlog::level::trace);
    MaskServer server(cfg, FakeFactory(), 0);
    Status s = server.StartListening();
    ASSERT_TRUE(s.ok()) << s.ToString();
    server.Shutdown();
    EXPECT_EQ(log.text().find(warning), std::string::npos) << cfg.listen << ": " << log.text();
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

// ---------------------------------------------------------------------------------------------------
// Per-principal cache scopes (issue #14: with auth on, cached embeddings and results are visible only
// to the principal that created them, or a configured shared scope).

constexpr char kAlphaToken[] = "alpha-token-one-0123456789abcdef";
constexpr char kAlphaToken2[] = "alpha-token-two-0123456789abcdef";
constexpr char kBetaToken[] = "beta-token-with-a-derived-scope-42";

std::string ScopedTokenFile() {
  const std::string path = Pki::Get().path("scoped-tokens.txt");
  std::ofstream f(path);
  f << kAlphaToken << " scope=alpha\n" << kAlphaToken2 << "\tscope=alpha\n" << kBetaToken << "\n";
  return path;
}

TEST(ServerSecurityTokens, ScopesFromTheFile) {
  auto set = TokenSet::Parse("a1 scope=alpha\n a2   scope=alpha \nb\nc scope=x.Y_z-9\n", "t");
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ((*set)->size(), 4u);
  EXPECT_EQ((*set)->ScopeOf("a1"), std::optional<std::string>("alpha"));
  EXPECT_EQ((*set)->ScopeOf("a2"), std::optional<std::string>("alpha"));
  EXPECT_EQ((*set)->ScopeOf("c"), std::optional<std::string>("x.Y_z-9"));
  EXPECT_EQ((*set)->ScopeOfAuthorization("Bearer c"), std::optional<std::string>("x.Y_z-9"));
  EXPECT_EQ((*set)->ScopeOf("alpha"), std::nullopt);
  EXPECT_EQ((*set)->ScopeOf(""), std::nullopt);
  EXPECT_EQ((*set)->ScopeOfAuthorization("Bearer nope"), std::nullopt);
  // A bare token gets a scope of its own, named from a digest: not the token, stable, distinct.
  const std::optional<std::string> b = (*set)->ScopeOf("b");
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->rfind(kDerivedScopePrefix, 0), 0u) << *b;
  EXPECT_EQ(b->size(), std::string(kDerivedScopePrefix).size() + 16) << *b;
  auto again = TokenSet::Parse("other\nb\n", "t");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->ScopeOf("b"), b);
  EXPECT_NE((*again)->ScopeOf("other"), b);
  auto secret = TokenSet::Parse(std::string(kToken) + "\n", "t");
  ASSERT_TRUE(secret.ok());
  EXPECT_EQ((*secret)->ScopeOf(kToken)->find(kToken), std::string::npos);
}

TEST(ServerSecurityTokens, BadScopeLinesNameTheLineNotTheToken) {
  const std::pair<const char*, const char*> cases[] = {
      {"ok\nhidden-one scope=\n", "names a scope that is not"},
      {"ok\nhidden-one scope=has#hash\n", "names a scope that is not"},
      {"ok\nhidden-one scope=a:b\n", "names a scope that is not"},
      {"ok\nhidden-one realm=alpha\n", "something other than \"scope=NAME\""},
      {"ok\nhidden-one scope=a scope=b\n", "names a scope that is not"},
      {"ok\nhidden-one\nhidden-one scope=b\n", "repeats a token"},
  };
  for (const auto& [text, want] : cases) {
    auto set = TokenSet::Parse(text, "tokens.txt");
    ASSERT_FALSE(set.ok()) << text;
    const std::string m = set.status().message();
    EXPECT_NE(m.find(want), std::string::npos) << text << ": " << m;
    EXPECT_NE(m.find("line "), std::string::npos) << m;
    EXPECT_EQ(m.find("hidden-one"), std::string::npos) << m;
  }
  auto long_name = TokenSet::Parse("t scope=" + std::string(kMaxScopeName + 1, 'a') + "\n", "t");
  EXPECT_FALSE(long_name.ok());
  EXPECT_TRUE(TokenSet::Parse("t scope=" + std::string(kMaxScopeName, 'a') + "\n", "t").ok());
}

v1::Image ScopeTestImage(int seed) {
  ImageRGB8 im{40, 30, std::vector<uint8_t>(40 * 30 * 3)};
  for (size_t i = 0; i < im.pixels.size(); ++i) im.pixels[i] = static_cast<uint8_t>((i * 7 + seed * 31) & 0xff);
  v1::Image out;
  out.set_encoded(*EncodePngRgb(im));
  return out;
}

v1::SegmentRequest ById(const std::string& image_id, const std::string& result_id = "") {
  v1::SegmentRequest req;
  req.set_image_id(image_id);
  v1::Prompt* p = req.add_prompts();
  v1::Point* pt = p->add_points();
  pt->set_x(10);
  pt->set_y(10);
  pt->set_label(v1::POINT_LABEL_FOREGROUND);
  if (!result_id.empty()) p->mutable_mask_input()->set_result_id(result_id);
  return req;
}

// A TLS stub with `token` and any extra metadata (the client library sends none of its own).
struct RawStub {
  RawStub(const std::string& target, const std::string& token) {
    grpc::SslCredentialsOptions so;
    so.pem_root_certs = Pki::Get().read("ca.pem");
    auto creds = grpc::CompositeChannelCredentials(grpc::SslCredentials(so),
                                                   grpc::AccessTokenCredentials(token));
    stub = v1::MaskService::NewStub(grpc::CreateChannel(target, creds));
  }
  grpc::Status Segment(const v1::SegmentRequest& req, v1::SegmentResponse* resp,
                       const std::vector<std::pair<std::string, std::string>>& metadata) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    for (const auto& [k, v] : metadata) ctx.AddMetadata(k, v);
    return stub->Segment(&ctx, req, resp);
  }
  std::unique_ptr<v1::MaskService::Stub> stub;
};

// NOT_FOUND, and nothing in the message about the scope the id lives in or its other identifiers.
void ExpectForeignNotFound(const Status& s, const std::vector<std::string>& secrets) {
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  for (const std::string& x : secrets) EXPECT_EQ(s.message().find(x), std::string::npos) << x << ": " << s.message();
}

std::string HttpSegmentBody(const std::string& image_id) {
  return "{\"image_id\": \"" + image_id + "\", \"prompts\": [{\"points\": [{\"x\": 10, \"y\": 10, "
         "\"label\": \"POINT_LABEL_FOREGROUND\"}]}]}";
}

// A TLS server with the scoped token file and the HTTP front, and a client for each token: alpha and
// alpha2 are two tokens of scope "alpha", beta has a scope of its own. The clients only make a
// channel, so they may be built before the test checks r.status.
struct ScopedServer {
  explicit ScopedServer(bool shared_cache = false)
      : r(Config(shared_cache)),
        alpha(Options(r, TrustingCa(kAlphaToken))),
        alpha2(Options(r, TrustingCa(kAlphaToken2))),
        beta(Options(r, TrustingCa(kBetaToken))) {}
  static ServerConfig Config(bool shared_cache) {
    ServerConfig cfg = TlsConfig();
    cfg.auth_tokens = ScopedTokenFile();
    cfg.auth_shared_cache = shared_cache;
    cfg.http_listen = "127.0.0.1:0";
    return cfg;
  }
  Running r;
  Client alpha;
  Client alpha2;
  Client beta;
};

TEST_F(ServerSecurity, CachesAreScopedPerTokenWithAuthOn) {
  ScopedServer scoped;
  auto& [r, alpha, alpha2, beta] = scoped;
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();

  v1::EmbedRequest embed;
  *embed.mutable_image() = ScopeTestImage(1);
  auto a = alpha.Embed(embed);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  const std::string image_id = a->image_id();
  auto first = alpha.Segment(ById(image_id));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(first->results_size(), 1);
  const std::string result_id = first->results(0).result_id();
  // The messages may echo the id the caller sent, nothing else of the other scope.
  const std::vector<std::string> secrets = {"alpha", kAlphaToken, kBetaToken};

  // Another scope: the image_id is unknown, by unary call and on a stream.
  ExpectForeignNotFound(beta.Segment(ById(image_id)).status(), secrets);
  {
    auto session = beta.OpenSession(std::chrono::milliseconds(5000));
    ExpectForeignNotFound(session->Send(ById(image_id)).status(), secrets);
  }
  // The same bytes give the same id (a content address) but the embedding is its own.
  auto b = beta.Embed(embed);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->image_id(), image_id);
  EXPECT_FALSE(b->cached());
  // Even on the same image, now in beta's cache too, alpha's result is not beta's.
  ASSERT_TRUE(beta.Segment(ById(image_id)).ok());
  const Status foreign = beta.Segment(ById(image_id, result_id)).status();
  ExpectForeignNotFound(foreign, secrets);
  // ... and reads exactly like an id that was never issued.
  const std::string never(result_id.size(), '0');
  std::string as_unknown = foreign.message();
  const size_t at = as_unknown.find(result_id);
  ASSERT_NE(at, std::string::npos) << as_unknown;
  as_unknown.replace(at, result_id.size(), never);
  EXPECT_EQ(as_unknown, beta.Segment(ById(image_id, never)).status().message());

  // The same scope (another token of it) sees both; alpha's own calls do too.
  auto same = alpha2.Segment(ById(image_id, result_id));
  ASSERT_TRUE(same.ok()) << same.status().ToString();
  EXPECT_TRUE(same->cached());
  {
    auto session = alpha2.OpenSession(std::chrono::milliseconds(5000));
    auto s = session->Send(ById(image_id, result_id));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
  }

  // A second image only alpha embedded: the scope cannot be forged with the in-process metadata key,
  // neither over gRPC (TLS calls take their scope from the token) nor through the HTTP front.
  v1::EmbedRequest embed2;
  *embed2.mutable_image() = ScopeTestImage(2);
  auto a2 = alpha.Embed(embed2);
  ASSERT_TRUE(a2.ok()) << a2.status().ToString();
  const std::string only_alpha = a2->image_id();
  RawStub raw(r.target(), kBetaToken);
  v1::SegmentResponse resp;
  grpc::Status forged = raw.Segment(ById(only_alpha), &resp, {{kInProcessScopeMetadata, "alpha"}});
  EXPECT_EQ(forged.error_code(), grpc::StatusCode::NOT_FOUND) << forged.error_message();
  RawStub raw_alpha(r.target(), kAlphaToken);
  grpc::Status own = raw_alpha.Segment(ById(only_alpha), &resp, {{kInProcessScopeMetadata, "beta"}});
  EXPECT_TRUE(own.ok()) << own.error_message();

  httplib::Client http("127.0.0.1", r.server.http_port());
  auto as_beta = http.Post("/v1/segment",
                           httplib::Headers{{"Authorization", std::string("Bearer ") + kBetaToken},
                                            {kInProcessScopeMetadata, "alpha"}},
                           HttpSegmentBody(only_alpha), "application/json");
  ASSERT_TRUE(as_beta);
  EXPECT_EQ(as_beta->status, 404) << as_beta->body;
  EXPECT_EQ(as_beta->body.find("alpha"), std::string::npos) << as_beta->body;
  auto as_alpha = http.Post("/v1/segment",
                            httplib::Headers{{"Authorization", std::string("Bearer ") + kAlphaToken2}},
                            HttpSegmentBody(only_alpha), "application/json");
  ASSERT_TRUE(as_alpha);
  EXPECT_EQ(as_alpha->status, 200) << as_alpha->body;
  // An image embedded through the HTTP front lands in the caller's scope, not a shared one.
  auto via_http_beta = http.Post("/v1/segment",
                                 httplib::Headers{{"Authorization", std::string("Bearer ") + kBetaToken}},
                                 HttpSegmentBody(image_id), "application/json");
  ASSERT_TRUE(via_http_beta);
  EXPECT_EQ(via_http_beta->status, 200) << via_http_beta->body;  // beta embedded it above
}

// GenerateMasks by image_id (issue #15) looks the embedding up in the caller's scope like Segment:
// another scope's id is NOT_FOUND over gRPC and through POST /v1/generate, and the same scope finds it
// (the fake engine then answers that it cannot generate: the lookup succeeded).
TEST_F(ServerSecurity, GenerateMasksByIdIsScopedToo) {
  ScopedServer scoped;
  auto& [r, alpha, alpha2, beta] = scoped;
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  v1::EmbedRequest embed;
  *embed.mutable_image() = ScopeTestImage(3);
  auto a = alpha.Embed(embed);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  v1::GenerateMasksRequest gen;
  gen.set_image_id(a->image_id());
  gen.mutable_params()->set_points_per_side(4);
  ExpectForeignNotFound(beta.GenerateMasks(gen).status(), {"alpha", kAlphaToken, kBetaToken});
  const Status same_scope = alpha2.GenerateMasks(gen).status();
  EXPECT_EQ(same_scope.code(), StatusCode::kFailedPrecondition) << same_scope.ToString();
  EXPECT_NE(same_scope.message().find("cannot generate masks"), std::string::npos) << same_scope.message();

  httplib::Client http("127.0.0.1", r.server.http_port());
  const std::string body = "{\"image_id\": \"" + a->image_id() + "\", \"params\": {\"points_per_side\": 4}}";
  auto as_beta = http.Post("/v1/generate", httplib::Headers{{"Authorization", std::string("Bearer ") + kBetaToken}},
                           body, "application/json");
  ASSERT_TRUE(as_beta);
  EXPECT_EQ(as_beta->status, 404) << as_beta->body;
  EXPECT_EQ(as_beta->body.find("alpha"), std::string::npos) << as_beta->body;
  auto as_alpha = http.Post("/v1/generate", httplib::Headers{{"Authorization", std::string("Bearer ") + kAlphaToken}},
                            body, "application/json");
  ASSERT_TRUE(as_alpha);
  EXPECT_EQ(as_alpha->status, 400) << as_alpha->body;  // FAILED_PRECONDITION from the fake engine
  auto unauthenticated = http.Post("/v1/generate", body, "application/json");
  ASSERT_TRUE(unauthenticated);
  EXPECT_EQ(unauthenticated->status, 401);
}

TEST_F(ServerSecurity, SharedCacheFlagRestoresOneCache) {
  ScopedServer scoped(/*shared_cache=*/true);
  auto& [r, alpha, alpha2, beta] = scoped;
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  v1::EmbedRequest embed;
  *embed.mutable_image() = ScopeTestImage(3);
  auto a = alpha.Embed(embed);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto first = alpha.Segment(ById(a->image_id()));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto b = beta.Segment(ById(a->image_id(), first->results(0).result_id()));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_TRUE(b->cached());
  auto again = beta.Embed(embed);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->cached());
  httplib::Client http("127.0.0.1", r.server.http_port());
  auto h = http.Post("/v1/segment", httplib::Headers{{"Authorization", std::string("Bearer ") + kBetaToken}},
                     HttpSegmentBody(a->image_id()), "application/json");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200) << h->body;
}

TEST_F(ServerSecurity, WithoutAuthTheScopeMetadataIsIgnored) {
  Running r(BaseConfig());
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  Client c(Options(r));
  v1::EmbedRequest embed;
  *embed.mutable_image() = ScopeTestImage(4);
  auto a = c.Embed(embed);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto stub = v1::MaskService::NewStub(grpc::CreateChannel(r.target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  ctx.AddMetadata(kInProcessScopeMetadata, "someone-else");
  v1::SegmentResponse resp;
  grpc::Status s = stub->Segment(&ctx, ById(a->image_id()), &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(resp.cached());
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
