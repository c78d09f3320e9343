// maskd's HTTP front (issue #15): the proto3 JSON mapping of MaskService on a port of its own, and the
// web page at `/`. Off unless --http-listen is given.
//
// Every /v1 route is a real call of the same gRPC service over the server's in-process channel
// (grpc::Server::InProcessChannel), not a second implementation: a request parses into the same
// message, meets the same validation, limits, queues, deadlines, access log and status counters, and
// its answer is printed back with protobuf's JSON printer. So an HTTP error is exactly the gRPC error
// the same message would get, with its code name and the HTTP status of HttpStatusFor.
//
//   POST /v1/embed     EmbedRequest   -> EmbedResponse
//   POST /v1/segment   SegmentRequest -> SegmentResponse
//   POST /v1/generate  GenerateMasksRequest -> GenerateMasksResponse
//   GET  /v1/info                     -> GetInfoResponse
//   GET  /                            the page (server/web/index.html, compiled into the binary)
//
// JSON: field names as in the .proto (snake_case; lowerCamelCase is accepted on input too), bytes as
// base64, enums by name, 64-bit integers as strings (proto3's mapping), fields at their default value
// printed. Unknown fields are an error. Errors:
//   {"error": {"code": <HTTP status>, "status": "<gRPC code name>", "message": "..."}}
// The x-request-id of the call comes back as a response header.
//
// The header keeps cpp-httplib out of its includers. Routes can be added before Start (a /metrics
// page, say) with AddGet.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <grpcpp/grpcpp.h>

#include "model/api/status.h"

namespace maskd::server {

struct HttpFrontOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: pick a free port (port() tells which)
  // Largest request body: a JSON request carries the image in base64 (4/3 of its bytes) and client
  // logits as decimal text, so MaskServer derives it from the request limits.
  uint64_t max_body_bytes = uint64_t{64} << 20;
  // Deadline of each call into the service.
  std::chrono::milliseconds call_timeout{60000};
  // Threads serving connections (each blocks on its call while the service works).
  int threads = 8;
  // Set (maskd with --auth-tokens): every /v1 route needs an Authorization header it accepts, else
  // 401 UNAUTHENTICATED with an empty message. The page at / needs none (it holds no data). It
  // returns the caller's cache scope (nullopt: refused); a non-empty one goes to the service as
  // kInProcessScopeMetadata (server/security.h), whatever headers the HTTP client sent.
  std::function<std::optional<std::string>(std::string_view authorization)> authorize;
};

// JSON answers are sent uncompressed. cpp-httplib compresses a reply whose type is exactly
// "application/json" with Brotli at its slowest quality whenever the client accepts br (every
// browser does): measured ~100-200 ms for one mask's RLE on this project's CPU machine, more than the
// model takes for a click. With the charset parameter (UTF-8 is JSON's encoding anyway) httplib
// leaves it alone; server_http_front_test checks that no Content-Encoding comes back.
inline constexpr const char* kJsonContentType = "application/json; charset=utf-8";

struct HttpReply {
  int status = 200;
  std::string content_type = kJsonContentType;
  std::string body;
};

// HTTP status for a gRPC status code, as Google's API design guide maps them (INVALID_ARGUMENT 400,
// NOT_FOUND 404, RESOURCE_EXHAUSTED 429, UNAVAILABLE 503, DEADLINE_EXCEEDED 504, CANCELLED 499, ...).
int HttpStatusFor(grpc::StatusCode code);

class HttpFront {
 public:
  // `channel` reaches the MaskService (the server's in-process channel).
  HttpFront(HttpFrontOptions options, std::shared_ptr<grpc::Channel> channel);
  ~HttpFront();  // Stop()

  using GetHandler = std::function<HttpReply()>;
  // Another GET route; only before Start.
  void AddGet(const std::string& path, GetHandler handler);

  // Binds host:port (UNAVAILABLE naming --http-listen when it cannot) and serves on a thread of its
  // own.
  Status Start();
  // Stops accepting and waits for the requests being served. Idempotent.
  void Stop();

  int port() const { return port_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace maskd::server
