#include "server/security.h"

#include <cctype>
#include <fstream>
#include <sstream>

#include <grpcpp/security/server_credentials.h>
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/sha.h>
#include <openssl/x509.h>

namespace maskd::server {
namespace {

std::array<unsigned char, 32> Digest(std::string_view text) {
  std::array<unsigned char, 32> d{};
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), d.data());
  return d;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// OpenSSL's reason for the last failure, for start-up messages (they name files, never contents).
std::string OpenSslReason() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "no PEM block found";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

std::unique_ptr<BIO, BioDeleter> MemBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioDeleter>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

StatusOr<std::unique_ptr<X509, X509Deleter>> FirstCert(const std::string& flag, const std::string& path,
                                                       const std::string& pem) {
  auto bio = MemBio(pem);
  std::unique_ptr<X509, X509Deleter> cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (!cert) {
    return InvalidArgument(flag + " = \"" + path + "\" is not a PEM certificate (expected "
                           "-----BEGIN CERTIFICATE-----): " + OpenSslReason());
  }
  return cert;
}

}  // namespace

StatusOr<std::string> ReadFileForFlag(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgument(flag + " = \"" + path + "\" cannot be opened (expected a readable file)");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return InvalidArgument(flag + " = \"" + path + "\" cannot be read");
  return ss.str();
}

StatusOr<std::shared_ptr<const TokenSet>> TokenSet::Parse(std::string_view text, const std::string& origin) {
  auto set = std::make_shared<TokenSet>();
  size_t line_no = 0;
  // Messages name the line, never its token: they go to the log.
  auto bad_line = [&](const std::string& what) {
    return InvalidArgument("--auth-tokens = \"" + origin + "\": line " + std::to_string(line_no) + " " +
                           what + " (expected one token per line, optionally followed by "
                           "\" scope=NAME\")");
  };
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = Trim(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++line_no;
    if (line.empty() || line.front() == '#') continue;
    size_t end = 0;
    while (end < line.size() && line[end] != ' ' && line[end] != '\t') ++end;
    const std::string_view token = line.substr(0, end);
    const std::string_view rest = Trim(line.substr(end));
    for (char c : line) {
      if (c != ' ' && c != '\t' && std::iscntrl(static_cast<unsigned char>(c))) {
        return bad_line("has a control character");
      }
    }
    std::string scope;
    const std::array<unsigned char, 32> digest = Digest(token);
    if (rest.empty()) {
      // Named from a digest of the digest: the name is logged, and says nothing usable about the
      // token (nor is it the value compared at authentication).
      std::string material = "maskd-scope:";
      material.append(reinterpret_cast<const char*>(digest.data()), digest.size());
      const std::array<unsigned char, 32> name = Digest(material);
      static const char kHex[] = "0123456789abcdef";
      scope = kDerivedScopePrefix;
      for (int i = 0; i < 8; ++i) {
        scope += kHex[name[i] >> 4];
        scope += kHex[name[i] & 15];
      }
    } else {
      constexpr std::string_view kKey = "scope=";
      if (rest.substr(0, kKey.size()) != kKey) {
        return bad_line("has a space inside the token or something other than \"scope=NAME\" after it");
      }
      const std::string_view name = rest.substr(kKey.size());
      bool valid = !name.empty() && name.size() <= kMaxScopeName;
      for (char c : name) {
        valid = valid && (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-');
      }
      if (!valid) {
        return bad_line("names a scope that is not 1.." + std::to_string(kMaxScopeName) +
                        " of letters, digits, '.', '_' and '-'");
      }
      scope = std::string(name);
    }
    for (const auto& known : set->digests_) {
      if (known == digest) return bad_line("repeats a token of an earlier line");
    }
    set->digests_.push_back(digest);
    set->scopes_.push_back(std::move(scope));
  }
  if (set->digests_.empty()) {
    return InvalidArgument("--auth-tokens = \"" + origin +
                           "\" holds no token (expected one token per line; '#' starts a comment)");
  }
  return std::shared_ptr<const TokenSet>(std::move(set));
}

StatusOr<std::shared_ptr<const TokenSet>> TokenSet::Load(const std::string& path) {
  StatusOr<std::string> text = ReadFileForFlag("--auth-tokens", path);
  if (!text.ok()) return text.status();
  return Parse(*text, path);
}

std::optional<std::string> TokenSet::ScopeOf(std::string_view token) const {
  // Hashing first gives every comparison the same length; every digest is compared, and the index
  // of the match is selected arithmetically, so that the time does not depend on which token (if
  // any) matched.
  const std::array<unsigned char, 32> d = Digest(token);
  size_t matched = 0, index = 0;
  for (size_t i = 0; i < digests_.size(); ++i) {
    const size_t same = static_cast<size_t>(CRYPTO_memcmp(digests_[i].data(), d.data(), d.size()) == 0);
    matched |= same;
    index |= i & (size_t{0} - same);  // tokens are distinct (Parse), so at most one contributes
  }
  if (matched == 0 || token.empty()) return std::nullopt;
  return scopes_[index];
}

bool TokenSet::Accepts(std::string_view token) const { return ScopeOf(token).has_value(); }

std::optional<std::string> TokenSet::ScopeOfAuthorization(std::string_view value) const {
  constexpr std::string_view kScheme = "bearer ";
  if (value.size() <= kScheme.size()) return std::nullopt;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(value[i])) != kScheme[i]) return std::nullopt;
  }
  return ScopeOf(Trim(value.substr(kScheme.size())));
}

bool TokenSet::AcceptsAuthorization(std::string_view value) const {
  return ScopeOfAuthorization(value).has_value();
}

grpc::Status TokenAuthProcessor::Process(const InputMetadata& md, grpc::AuthContext* context,
                                         OutputMetadata* consumed, OutputMetadata*) {
  if (exempt_health_) {
    auto path = md.find(":path");
    if (path != md.end() && std::string_view(path->second.data(), path->second.size()).rfind("/grpc.health.v1.Health/", 0) == 0) {
      return grpc::Status::OK;
    }
  }
  auto auth = md.find("authorization");
  std::optional<std::string> scope;
  if (auth != md.end()) {
    scope = tokens_->ScopeOfAuthorization(std::string_view(auth->second.data(), auth->second.size()));
  }
  if (scope) {
    // Consumed: the token does not reach the handlers' client_metadata (nor any log of it).
    consumed->insert(std::make_pair(std::string(auth->first.data(), auth->first.size()),
                                    std::string(auth->second.data(), auth->second.size())));
    context->AddProperty(kTokenAcceptedProperty, "true");
    context->AddProperty(kScopeProperty, *scope);
    return grpc::Status::OK;
  }
  auto path = md.find(":path");
  if (path != md.end() &&
      std::string_view(path->second.data(), path->second.size()).rfind("/maskd.v1.MaskService/", 0) == 0) {
    return grpc::Status::OK;  // unmarked: MaskService refuses it (see the header)
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "");
}

StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerConfig& config, std::shared_ptr<const TokenSet> tokens) {
  if (config.tls_cert.empty()) return grpc::InsecureServerCredentials();
  StatusOr<std::string> cert_pem = ReadFileForFlag("--tls-cert", config.tls_cert);
  if (!cert_pem.ok()) return cert_pem.status();
  StatusOr<std::string> key_pem = ReadFileForFlag("--tls-key", config.tls_key);
  if (!key_pem.ok()) return key_pem.status();

  auto cert = FirstCert("--tls-cert", config.tls_cert, *cert_pem);
  if (!cert.ok()) return cert.status();
  auto key_bio = MemBio(*key_pem);
  // A callback that has no passphrase: with none, OpenSSL would prompt on the terminal for an
  // encrypted key and a server start would hang there.
  pem_password_cb* no_passphrase = [](char*, int, int, void*) { return 0; };
  std::unique_ptr<EVP_PKEY, KeyDeleter> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, no_passphrase, nullptr));
  if (!key) {
    return InvalidArgument("--tls-key = \"" + config.tls_key +
                           "\" is not an unencrypted PEM private key (expected -----BEGIN PRIVATE "
                           "KEY-----): " + OpenSslReason());
  }
  if (X509_check_private_key(cert->get(), key.get()) != 1) {
    ERR_clear_error();
    return InvalidArgument("--tls-key = \"" + config.tls_key + "\" does not belong to --tls-cert = \"" +
                           config.tls_cert + "\" (expected the private key of that certificate)");
  }

  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({*key_pem, *cert_pem});
  if (!config.tls_client_ca.empty()) {
    StatusOr<std::string> ca_pem = ReadFileForFlag("--tls-client-ca", config.tls_client_ca);
    if (!ca_pem.ok()) return ca_pem.status();
    auto ca = FirstCert("--tls-client-ca", config.tls_client_ca, *ca_pem);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca_pem;
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::SslServerCredentials(options);
  if (tokens) {
    creds->SetAuthMetadataProcessor(std::make_shared<TokenAuthProcessor>(std::move(tokens),
                                                                         config.auth_exempt_health));
  }
  return creds;
}

bool CallAuthorized(const grpc::ServerContextBase& context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (!auth) return true;  // no transport security at all: the in-process channel
  bool tls = false;
  for (const grpc::string_ref& v : auth->FindPropertyValues("transport_security_type")) {
    tls = tls || v == "ssl";
  }
  return !tls || !auth->FindPropertyValues(kTokenAcceptedProperty).empty();
}

namespace {

bool OverTls(const grpc::AuthContext& auth) {
  for (const grpc::string_ref& v : auth.FindPropertyValues("transport_security_type")) {
    if (v == "ssl") return true;
  }
  return false;
}

}  // namespace

std::string CallScope(const grpc::ServerContextBase& context, bool scoped) {
  if (!scoped) return "";
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth && OverTls(*auth)) {
    // Set by TokenAuthProcessor from the token itself: nothing the client sends besides it counts.
    const std::vector<grpc::string_ref> v = auth->FindPropertyValues(kScopeProperty);
    // CallAuthorized refused calls without a token before this is asked; an empty name would be
    // the shared scope, so a call that somehow has none gets a scope of its own instead.
    if (v.empty()) return "#tls-without-scope";
    return std::string(v.front().data(), v.front().size());
  }
  // In-process (the HTTP front, which authenticated the caller itself).
  const auto& md = context.client_metadata();
  auto it = md.find(kInProcessScopeMetadata);
  if (it == md.end() || it->second.empty()) return kUnnamedInProcessScope;
  return std::string(it->second.data(), it->second.size());
}

bool IsLoopbackHost(const std::string& host) {
  std::string h = host;
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  return h == "localhost" || h == "::1" || h.rfind("127.", 0) == 0;
}

}  // namespace maskd::server
