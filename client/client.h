// maskd_client: a small, typed C++ client for maskd's v1 API (maskd/v1/maskd.proto).
//
// What a caller may rely on:
// - Every call has a deadline (ClientOptions::timeout unless the call says otherwise); a call never
//   blocks longer than that.
// - Failures come back as maskd::Status whose code is the gRPC status code the server sent (or the
//   one gRPC produced locally, e.g. UNAVAILABLE when nothing listens) and whose message is the
//   server's message. A SegmentStream response carrying `error` is returned as that Status.
// - A Client is thread-safe: its methods may be called concurrently (one HTTP/2 channel is shared).
// - No exceptions, no output: this is library code, the caller decides what to print.
// - Affinity (ClientOptions::affinity_header, on by default): Embed, Segment and SegmentStream carry
//   the gRPC metadata `x-maskd-image-id: <image_id>` whenever the image_id is known, so that a proxy
//   balancing on it (deploy/envoy/envoy.yaml, ring hash) sends every call about one image to the
//   replica that cached its embedding. By-id calls send the id; calls with bytes send the id the
//   server will compute (model/io/image_id.h), which needs the model identity: the Client asks GetInfo
//   once, on the first call with bytes, and keeps ModelInfo.identity. Without it (GetInfo failed,
//   or the server reports no identity) calls go out without the header, which is only a cache miss
//   behind a proxy, never an error.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "maskd/v1/maskd.grpc.pb.h"
#include "model/api/status.h"
#include "proto/grpc_code_name.h"

namespace maskd::client {

// The request header Envoy hashes on (deploy/envoy/envoy.yaml); gRPC metadata keys are lowercase.
inline constexpr char kAffinityHeader[] = "x-maskd-image-id";

// Transport security and credentials of a channel (PEM contents, not paths: ApplySecurityFlags
// reads the files and says which one is wrong).
struct ClientSecurity {
  // TLS: the server's certificate is verified against ca_pem (empty: the system's roots).
  bool tls = false;
  std::string ca_pem;
  // Mutual TLS: this client's certificate chain and private key (both or neither).
  std::string cert_pem, key_pem;
  // The name the server certificate must carry when it is not the target's host (an IP, a test).
  std::string server_name;
  // Bearer token, sent on every call as "authorization: Bearer <token>"; TLS only (gRPC does not
  // attach call credentials to a plaintext channel, and maskd accepts tokens over TLS only).
  std::string token;
};

// Where the flags --tls, --tls-ca, --tls-cert, --tls-key, --tls-server-name, --token and
// --token-file (or $MASKD_TOKEN) of maskctl and maskload point.
struct SecurityFlags {
  bool tls = false;
  std::string tls_ca, tls_cert, tls_key, tls_server_name, token, token_file;
};
// Reads the files into `security`. INVALID_ARGUMENT naming the flag and path when a file cannot be
// read, only one of --tls-cert/--tls-key is given, both --token and --token-file are, or a token is
// given without TLS. --tls-ca or --tls-cert imply --tls. --token-file holds the token on its first
// non-empty line; without --token/--token-file, $MASKD_TOKEN is used when set.
Status ApplySecurityFlags(const SecurityFlags& flags, ClientSecurity* security);

struct ClientOptions {
  // HOST:PORT (or any gRPC target string).
  std::string target = "localhost:50051";
  ClientSecurity security;
  // Deadline of each call.
  std::chrono::milliseconds timeout{30000};
  // How long Connect waits for the channel to become READY.
  std::chrono::milliseconds connect_timeout{5000};
  // Responses with many full-size masks are large (PNG/logits especially): gRPC's 4 MiB default is
  // too small for a 256-prompt request.
  int max_receive_message_bytes = 512 << 20;
  int max_send_message_bytes = 64 << 20;
  // Extra channel args for load generators that want one TCP connection per channel.
  std::optional<int> channel_index;
  // Send kAffinityHeader on Embed/Segment/SegmentStream (see the top of this file).
  bool affinity_header = true;
  // After a failed GetInfo for the model identity, calls with bytes go without the header for this
  // long before the identity is asked for again (so that a client started while maskd was loading
  // gets affinity later, without one extra GetInfo per call while the server is down).
  std::chrono::milliseconds identity_retry{10000};
};

// The image_id the server will give the image of `request` when its ModelInfo.identity is
// `model_identity`: the id itself for a by-id request; computed (model/io/image_id.h) for encoded or
// raw bytes, if model_identity is not empty; nullopt otherwise (no image, or bytes and no identity).
std::optional<std::string> AffinityKey(std::string_view model_identity, const v1::SegmentRequest& request);
std::optional<std::string> AffinityKey(std::string_view model_identity, const v1::Image& image);

// The grpc::Status -> maskd::Status conversion used for every call (codes are numerically equal; a
// code maskd::StatusCode does not name becomes INTERNAL with the gRPC code name in the message).
Status FromGrpcStatus(const grpc::Status& status);
// The gRPC code's name (proto/grpc_code_name.h, shared with the server's HTTP front).
using ::maskd::GrpcCodeName;

// One point of a prompt, in original image pixels.
struct PointArg {
  float x = 0, y = 0;
  bool foreground = true;
};

struct BoxArg {
  float x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};

// One prompt: points and/or a box, optionally refining an earlier result.
struct PromptArg {
  std::vector<PointArg> points;
  std::optional<BoxArg> box;
  // MaskInput.result_id of an earlier result on the same image, and which of its masks (absent: its
  // best one).
  std::string mask_from;
  std::optional<uint32_t> mask_index;
  bool multimask = false;
};

// The image of a Segment call: encoded file bytes, or the image_id of an earlier Embed/Segment.
struct ImageArg {
  std::string encoded;   // JPEG/PNG/WebP bytes
  std::string image_id;  // used when encoded is empty

  static ImageArg Encoded(std::string bytes) { return {std::move(bytes), {}}; }
  static ImageArg Id(std::string id) { return {{}, std::move(id)}; }
};

struct SegmentArgs {
  ImageArg image;
  std::vector<PromptArg> prompts;
  v1::OutputFormat format = v1::OUTPUT_FORMAT_COCO_RLE;
  float polygon_tolerance = 0;  // OUTPUT_FORMAT_POLYGONS: Douglas-Peucker tolerance, pixels
  std::string request_tag;
};

// Builds the wire request (exposed for the load generator and tests). Does not validate: the server
// does, and says which field is wrong.
v1::SegmentRequest BuildSegmentRequest(const SegmentArgs& args);
v1::Prompt BuildPrompt(const PromptArg& prompt);

enum class ServingStatus { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };
const char* ServingStatusName(ServingStatus s);

class SegmentSession;

class Client {
 public:
  // Creates the channel and waits (up to connect_timeout) until it is connected. UNAVAILABLE with
  // the target in the message when it does not connect in time.
  static StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  // Creates the channel without waiting (calls then fail or wait as gRPC decides).
  explicit Client(const ClientOptions& options);

  StatusOr<v1::EmbedResponse> Embed(const std::string& encoded_image);
  StatusOr<v1::EmbedResponse> Embed(const v1::EmbedRequest& request);
  StatusOr<v1::SegmentResponse> Segment(const SegmentArgs& args);
  StatusOr<v1::SegmentResponse> Segment(const v1::SegmentRequest& request);
  // Automatic mask generation ("segment everything") on one image; carries the affinity header like
  // Segment. A generation on a large grid takes longer than a click: ClientOptions::timeout applies.
  StatusOr<v1::GenerateMasksResponse> GenerateMasks(const v1::GenerateMasksRequest& request);
  StatusOr<v1::GetInfoResponse> GetInfo();
  // grpc.health.v1.Health/Check for `service` ("" = the whole server).
  StatusOr<ServingStatus> Health(const std::string& service = "maskd.v1.MaskService");

  // A SegmentStream session. The stream's own deadline is `stream_timeout` from now (zero: none;
  // interactive sessions last as long as the user clicks). The stream opens at the first Send, so
  // that the affinity header can name that request's image: a stream stays on the replica chosen
  // when it opens.
  std::unique_ptr<SegmentSession> OpenSession(
      std::chrono::milliseconds stream_timeout = std::chrono::milliseconds{0});

  // ModelInfo.identity from one GetInfo, asked for on first use and then kept (see identity_retry
  // for failures). Blocks for at most one call's deadline; concurrent first users wait for the same
  // answer.
  StatusOr<std::string> ModelIdentity();
  // The affinity header value this client sends for `request` (nullopt: none; always nullopt when
  // options().affinity_header is off). May call ModelIdentity.
  std::optional<std::string> AffinityKeyFor(const v1::SegmentRequest& request);
  std::optional<std::string> AffinityKeyFor(const v1::Image& image);

  const ClientOptions& options() const { return options_; }
  v1::MaskService::Stub& stub() { return *stub_; }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

 private:
  void SetDeadline(grpc::ClientContext& context) const;
  template <typename Request>
  void AddAffinity(grpc::ClientContext& context, const Request& request);

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::MaskService::Stub> stub_;

  // Locking: identity_mu_ guards identity_ and identity_failed_at_, and is held across the one
  // GetInfo that fills them, so that concurrent first callers make one call, not many. Callers by
  // id never take it.
  std::mutex identity_mu_;
  std::optional<std::string> identity_;
  std::optional<std::chrono::steady_clock::time_point> identity_failed_at_;
};

// One SegmentStream: each Send writes one request and reads its one response (the server answers in
// order). Not thread-safe: one user, one session.
class SegmentSession {
 public:
  // Without affinity: the stream carries no kAffinityHeader.
  SegmentSession(v1::MaskService::Stub& stub, std::chrono::milliseconds timeout);
  // With `client`'s affinity header for the first request's image (client must outlive the session).
  SegmentSession(Client& client, std::chrono::milliseconds timeout);
  ~SegmentSession();
  SegmentSession(const SegmentSession&) = delete;
  SegmentSession& operator=(const SegmentSession&) = delete;

  // A response whose `error` is set comes back as that error (the stream stays usable). A broken
  // stream returns the stream's final status.
  StatusOr<v1::SegmentResponse> Send(const v1::SegmentRequest& request);
  StatusOr<v1::SegmentResponse> Send(const SegmentArgs& args) { return Send(BuildSegmentRequest(args)); }
  // Half-closes and returns the stream's status. Idempotent.
  Status Finish();

 private:
  v1::MaskService::Stub& stub_;
  Client* client_ = nullptr;  // for the affinity header; null: none
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SegmentRequest, v1::SegmentResponse>> stream_;
  bool finished_ = false;
  Status final_status_;
};

}  // namespace maskd::client
