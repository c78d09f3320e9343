// Transport security and bearer-token authentication for maskd's gRPC port (issue #14, Security).
//
// What a caller may rely on:
// - TokenSet holds the accepted tokens as SHA-256 digests only; Accepts() hashes the presented value
//   and compares it with every digest with CRYPTO_memcmp, without an early exit, so neither the
//   position of the first differing byte nor the token's length nor which token matched shows in
//   the time taken. Tokens never reach a log line or an error message.
// - MakeServerCredentials reads and checks every PEM file before gRPC sees it, so a missing,
//   unreadable, unparsable or mismatched file is a start-up error naming the flag and the path,
//   not a handshake failure at the first client.
// - gRPC runs an AuthMetadataProcessor on secure (TLS) connections only, so --auth-tokens requires
//   TLS (ValidateConfig says so): a bearer token sent in plaintext can be read by anyone on the path,
//   and gRPC's own clients refuse to attach call credentials to an insecure channel anyway.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/server_context.h>
#include <grpcpp/security/server_credentials.h>

#include "model/api/status.h"
#include "server/config.h"

namespace maskd::server {

// Caches are scoped per principal (issue #14): with --auth-tokens, an embedding or a stored result is
// found only by calls in the scope that made it, unless --auth-shared-cache. A scope is a name, never
// a token: `TOKEN scope=NAME` names it; a bare `TOKEN` gets its own scope, named from a digest of the
// token (kDerivedScopePrefix + 16 hex digits), so two tokens share a cache only when configured to.
inline constexpr char kDerivedScopePrefix[] = "token-";
// Scope names in the file: 1..64 of [A-Za-z0-9._-] (they are logged; no ':' or '#', see below).
inline constexpr size_t kMaxScopeName = 64;

class TokenSet {
 public:
  // One token per line, optionally followed by ` scope=NAME`; blank lines and lines starting with
  // '#' are skipped, surrounding spaces and tabs trimmed. INVALID_ARGUMENT naming --auth-tokens, the
  // path and the line number (never a token) when the file cannot be read, holds no token, a line
  // has anything but a token and one scope=NAME, a scope name is not 1..64 of [A-Za-z0-9._-], or one
  // token is listed twice.
  static StatusOr<std::shared_ptr<const TokenSet>> Load(const std::string& path);
  // Same rules, from the file's text (tests).
  static StatusOr<std::shared_ptr<const TokenSet>> Parse(std::string_view text, const std::string& origin);

  size_t size() const { return digests_.size(); }
  // `token` exactly as configured.
  bool Accepts(std::string_view token) const;
  // An "authorization" header value: "Bearer <token>" (the scheme case-insensitive, RFC 6750).
  bool AcceptsAuthorization(std::string_view header_value) const;
  // The scope of an accepted token / authorization header value; nullopt when not accepted. Every
  // digest is compared, and the match picked without a branch on which one it was.
  std::optional<std::string> ScopeOf(std::string_view token) const;
  std::optional<std::string> ScopeOfAuthorization(std::string_view header_value) const;

 private:
  std::vector<std::array<unsigned char, 32>> digests_;
  std::vector<std::string> scopes_;  // scopes_[i] belongs to digests_[i]
};

// The AuthContext property TokenAuthProcessor sets to the accepted token's scope.
inline constexpr char kScopeProperty[] = "maskd.scope";
// The metadata key by which the HTTP front tells the service its caller's scope over the in-process
// channel. Read only from calls without transport security (in-process: with --auth-tokens every
// network call is TLS), so a client sending it over the network changes nothing.
inline constexpr char kInProcessScopeMetadata[] = "maskd-internal-scope";
// The scope of in-process calls that name none (only the HTTP front calls in-process, and it always
// names one): a name no token file can give (it has a '#').
inline constexpr char kUnnamedInProcessScope[] = "#in-process";

// The cache scope of a MaskService call: "" (one shared cache) without tokens or with
// --auth-shared-cache (`scoped` false); else the accepted token's scope for TLS calls, and
// kInProcessScopeMetadata (or kUnnamedInProcessScope) for in-process calls.
std::string CallScope(const grpc::ServerContextBase& context, bool scoped);

// The AuthContext property TokenAuthProcessor sets on a call whose token it accepted.
inline constexpr char kTokenAcceptedProperty[] = "maskd.bearer_token_accepted";

// The gRPC check: "authorization: Bearer <token>" on every call but grpc.health.v1 when
// `exempt_health`. A call with an accepted token gets kTokenAcceptedProperty. MaskService calls
// without one pass through unmarked and the service refuses them (CallAuthorized below) with
// UNAUTHENTICATED and an empty message: refused here, gRPC 1.51 would put its own error chain
// ("Missing :authority or :path", file names, timestamps) in the message. Other services (health
// when not exempt, reflection) are refused here, as they cannot check for themselves.
class TokenAuthProcessor final : public grpc::AuthMetadataProcessor {
 public:
  TokenAuthProcessor(std::shared_ptr<const TokenSet> tokens, bool exempt_health)
      : tokens_(std::move(tokens)), exempt_health_(exempt_health) {}
  // A few hashes per call: cheap enough for gRPC's own thread.
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata, OutputMetadata* response_metadata) override;

 private:
  const std::shared_ptr<const TokenSet> tokens_;
  const bool exempt_health_;
};

// Whether a MaskService call may proceed when tokens are required: calls over TLS (the only way in
// from outside with --auth-tokens) need kTokenAcceptedProperty; calls without transport security
// are the HTTP front's, over the in-process channel, which checks the token itself.
bool CallAuthorized(const grpc::ServerContextBase& context);

// InsecureServerCredentials without --tls-cert; else SslServerCredentials with the certificate chain
// and key (checked to belong together) and, with --tls-client-ca, client certificates required and
// verified against that CA. With `tokens`, a TokenAuthProcessor on top (TLS only, see above).
StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerConfig& config, std::shared_ptr<const TokenSet> tokens);

// Reads a whole file for `flag`; INVALID_ARGUMENT naming the flag and path when it cannot.
StatusOr<std::string> ReadFileForFlag(const std::string& flag, const std::string& path);

// True for 127.0.0.0/8, ::1 and "localhost": what only this machine can reach.
bool IsLoopbackHost(const std::string& host);

}  // namespace maskd::server
