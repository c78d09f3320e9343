#include "client/client.h"

#include <algorithm>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/generic/generic_stub.h>

#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <mutex>
#include <type_traits>

#include "model/io/image_id.h"

namespace maskd::client {
namespace {

constexpr char kHealthCheckMethod[] = "/grpc.health.v1.Health/Check";

std::chrono::system_clock::time_point DeadlineAfter(std::chrono::milliseconds timeout) {
  return std::chrono::system_clock::now() + timeout;
}

// grpc.health.v1.HealthCheckRequest is one string field (1: service) and HealthCheckResponse one
// enum field (1: status). Encoding them by hand avoids a second copy of grpc's health.proto in
// this repository; the generic stub carries the bytes.
grpc::ByteBuffer EncodeHealthRequest(const std::string& service) {
  std::string bytes;
  if (!service.empty()) {
    google::protobuf::io::StringOutputStream raw(&bytes);
    google::protobuf::io::CodedOutputStream out(&raw);
    out.WriteTag((1 << 3) | 2);  // field 1, length-delimited
    out.WriteVarint32(static_cast<uint32_t>(service.size()));
    out.WriteString(service);
  }
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

StatusOr<ServingStatus> DecodeHealthResponse(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return Internal("health response: unreadable byte buffer");
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  uint32_t status = 0;  // absent field = UNKNOWN
  while (uint32_t tag = in.ReadTag()) {
    if (tag == ((1 << 3) | 0)) {
      if (!in.ReadVarint32(&status)) return Internal("health response: truncated status field");
    } else if (!google::protobuf::internal::WireFormatLite::SkipField(&in, tag)) {
      return Internal("health response: malformed field with tag " + std::to_string(tag));
    }
  }
  if (status > 3) return ServingStatus::kUnknown;
  return static_cast<ServingStatus>(status);
}

grpc::ChannelArguments MakeChannelArgs(const ClientOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  args.SetMaxSendMessageSize(options.max_send_message_bytes);
  if (options.channel_index) {
    // Distinct args give distinct subchannels, i.e. separate TCP connections, so that a load
    // generator is not limited by one HTTP/2 connection's single I/O thread.
    args.SetInt("maskd.channel_index", *options.channel_index);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  }
  return args;
}

std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const ClientSecurity& sec) {
  if (!sec.tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = sec.ca_pem;
  ssl.pem_cert_chain = sec.cert_pem;
  ssl.pem_private_key = sec.key_pem;
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::SslCredentials(ssl);
  if (!sec.token.empty()) {
    // AccessTokenCredentials sends "authorization: Bearer <token>".
    creds = grpc::CompositeChannelCredentials(creds, grpc::AccessTokenCredentials(sec.token));
  }
  return creds;
}

grpc::ChannelArguments WithServerName(grpc::ChannelArguments args, const ClientSecurity& sec) {
  if (sec.tls && !sec.server_name.empty()) args.SetSslTargetNameOverride(sec.server_name);
  return args;
}

StatusOr<std::string> ReadForFlag(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgument(flag + " = \"" + path + "\" cannot be opened (expected a readable file)");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string TrimToken(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

}  // namespace

Status ApplySecurityFlags(const SecurityFlags& f, ClientSecurity* sec) {
  sec->tls = f.tls || !f.tls_ca.empty() || !f.tls_cert.empty();
  sec->server_name = f.tls_server_name;
  if (!f.tls_ca.empty()) {
    StatusOr<std::string> ca = ReadForFlag("--tls-ca", f.tls_ca);
    if (!ca.ok()) return ca.status();
    sec->ca_pem = *ca;
  }
  if (f.tls_cert.empty() != f.tls_key.empty()) {
    return InvalidArgument(f.tls_cert.empty() ? "--tls-key = \"" + f.tls_key + "\" without --tls-cert (expected both or neither)"
                                              : "--tls-cert = \"" + f.tls_cert + "\" without --tls-key (expected both or neither)");
  }
  if (!f.tls_cert.empty()) {
    StatusOr<std::string> cert = ReadForFlag("--tls-cert", f.tls_cert);
    if (!cert.ok()) return cert.status();
    StatusOr<std::string> key = ReadForFlag("--tls-key", f.tls_key);
    if (!key.ok()) return key.status();
    sec->cert_pem = *cert;
    sec->key_pem = *key;
  }
  if (!f.token.empty() && !f.token_file.empty()) {
    return InvalidArgument("--token and --token-file = \"" + f.token_file + "\" both given (expected one)");
  }
  if (!f.token_file.empty()) {
    StatusOr<std::string> text = ReadForFlag("--token-file", f.token_file);
    if (!text.ok()) return text.status();
    std::istringstream lines(*text);
    std::string line;
    while (std::getline(lines, line) && TrimToken(line).empty()) {
    }
    sec->token = TrimToken(line);
    if (sec->token.empty()) {
      return InvalidArgument("--token-file = \"" + f.token_file + "\" holds no token (expected it on the first non-empty line)");
    }
  } else if (!f.token.empty()) {
    sec->token = f.token;
  } else if (const char* env = std::getenv("MASKD_TOKEN"); env != nullptr && *env != '\0') {
    sec->token = TrimToken(env);
  }
  if (!sec->token.empty() && !sec->tls) {
    // The token itself is never part of a message.
    return InvalidArgument("a bearer token (--token, --token-file or $MASKD_TOKEN) without TLS "
                           "(expected --tls-ca PATH or --tls: tokens are sent over TLS only)");
  }
  return Status::Ok();
}

Status FromGrpcStatus(const grpc::Status& status) {
  // gRPC's own wording when a response is over the channel's receive limit: the server answered,
  // this client refused it. Say which knob that is.
  if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
      status.error_message().find("larger than max") != std::string::npos) {
    return ResourceExhausted(status.error_message() +
                             " (the response is over this client's receive limit: raise "
                             "ClientOptions::max_receive_message_bytes, or ask for fewer prompts, "
                             "multimask off or RLE instead of PNG/logits)");
  }
  switch (status.error_code()) {
    case grpc::StatusCode::OK:
      return Status::Ok();
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::UNAUTHENTICATED:
      return {static_cast<StatusCode>(status.error_code()), status.error_message()};
    default:
      return Internal(std::string("gRPC status ") + GrpcCodeName(status.error_code()) + ": " +
                      status.error_message());
  }
}

const char* ServingStatusName(ServingStatus s) {
  switch (s) {
    case ServingStatus::kServing: return "SERVING";
    case ServingStatus::kNotServing: return "NOT_SERVING";
    case ServingStatus::kServiceUnknown: return "SERVICE_UNKNOWN";
    case ServingStatus::kUnknown: break;
  }
  return "UNKNOWN";
}

v1::Prompt BuildPrompt(const PromptArg& prompt) {
  v1::Prompt out;
  for (const PointArg& p : prompt.points) {
    v1::Point* point = out.add_points();
    point->set_x(p.x);
    point->set_y(p.y);
    point->set_label(p.foreground ? v1::POINT_LABEL_FOREGROUND : v1::POINT_LABEL_BACKGROUND);
  }
  if (prompt.box) {
    v1::Box* box = out.mutable_box();
    box->set_x0(prompt.box->x0);
    box->set_y0(prompt.box->y0);
    box->set_x1(prompt.box->x1);
    box->set_y1(prompt.box->y1);
  }
  if (!prompt.mask_from.empty()) {
    v1::MaskInput* mask = out.mutable_mask_input();
    mask->set_result_id(prompt.mask_from);
    if (prompt.mask_index) mask->set_mask_index(*prompt.mask_index);
  }
  out.set_multimask(prompt.multimask);
  return out;
}

v1::SegmentRequest BuildSegmentRequest(const SegmentArgs& args) {
  v1::SegmentRequest request;
  if (!args.image.encoded.empty()) {
    request.mutable_image()->set_encoded(args.image.encoded);
  } else if (!args.image.image_id.empty()) {
    request.set_image_id(args.image.image_id);
  }
  for (const PromptArg& p : args.prompts) *request.add_prompts() = BuildPrompt(p);
  request.set_output_format(args.format);
  if (args.polygon_tolerance != 0) request.set_polygon_tolerance(args.polygon_tolerance);
  if (!args.request_tag.empty()) request.set_request_tag(args.request_tag);
  return request;
}

std::optional<std::string> AffinityKey(std::string_view model_identity, const v1::Image& image) {
  if (model_identity.empty()) return std::nullopt;
  switch (image.source_case()) {
    case v1::Image::kEncoded:
      return ImageIdForEncoded(model_identity, image.encoded());
    case v1::Image::kRaw:
      return ImageIdForRaw(model_identity, image.raw().width(), image.raw().height(), image.raw().rgb());
    case v1::Image::SOURCE_NOT_SET:
      break;
  }
  return std::nullopt;
}

std::optional<std::string> AffinityKey(std::string_view model_identity, const v1::SegmentRequest& request) {
  if (request.has_image()) return AffinityKey(model_identity, request.image());
  // Only what a header may carry: gRPC aborts the process on a header value with a control or
  // non-ASCII character (hardening_corpus_test sends one); the server refuses such an id anyway.
  const std::string& id = request.image_id();
  const bool printable = std::all_of(id.begin(), id.end(), [](char c) { return c >= 0x20 && c <= 0x7e; });
  if (!id.empty() && printable) return id;
  return std::nullopt;
}

Client::Client(const ClientOptions& options)
    : options_(options),
      channel_(grpc::CreateCustomChannel(options.target, MakeChannelCredentials(options.security),
                                         WithServerName(MakeChannelArgs(options), options.security))),
      stub_(v1::MaskService::NewStub(channel_)) {}

StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (!options.security.token.empty() && !options.security.tls) {
    return InvalidArgument("ClientOptions.security.token without security.tls (expected TLS: tokens "
                           "are sent over TLS only)");
  }
  auto client = std::make_unique<Client>(options);
  if (!client->channel_->WaitForConnected(DeadlineAfter(options.connect_timeout))) {
    return Unavailable("could not connect to " + options.target + " within " +
                       std::to_string(options.connect_timeout.count()) +
                       " ms (is maskd running and listening there?)");
  }
  return client;
}

void Client::SetDeadline(grpc::ClientContext& context) const {
  context.set_deadline(DeadlineAfter(options_.timeout));
}

StatusOr<std::string> Client::ModelIdentity() {
  std::lock_guard<std::mutex> lock(identity_mu_);
  if (identity_) return *identity_;
  if (identity_failed_at_ &&
      std::chrono::steady_clock::now() - *identity_failed_at_ < options_.identity_retry) {
    return Unavailable("model identity: GetInfo failed less than " +
                       std::to_string(options_.identity_retry.count()) + " ms ago; not asking again yet");
  }
  StatusOr<v1::GetInfoResponse> info = GetInfo();
  if (!info.ok()) {
    identity_failed_at_ = std::chrono::steady_clock::now();
    return Status(info.status().code(), "model identity: GetInfo: " + info.status().message());
  }
  // An empty identity (a server that does not report one) is kept too: asking again would not help.
  identity_ = info->model().identity();
  identity_failed_at_.reset();
  return *identity_;
}

std::optional<std::string> Client::AffinityKeyFor(const v1::SegmentRequest& request) {
  if (!options_.affinity_header) return std::nullopt;
  if (!request.has_image()) return AffinityKey("", request);  // by id (or none): no identity needed
  return AffinityKeyFor(request.image());
}

std::optional<std::string> Client::AffinityKeyFor(const v1::Image& image) {
  if (!options_.affinity_header || image.source_case() == v1::Image::SOURCE_NOT_SET) return std::nullopt;
  StatusOr<std::string> identity = ModelIdentity();
  if (!identity.ok()) return std::nullopt;
  return AffinityKey(*identity, image);
}

template <typename Request>
void Client::AddAffinity(grpc::ClientContext& context, const Request& request) {
  std::optional<std::string> key;
  if constexpr (std::is_same_v<Request, v1::EmbedRequest>) {
    key = AffinityKeyFor(request.image());
  } else if constexpr (std::is_same_v<Request, v1::GenerateMasksRequest>) {
    if (request.has_image()) {
      key = AffinityKeyFor(request.image());
    } else if (options_.affinity_header) {
      v1::SegmentRequest by_id;  // the same header rules for an id as Segment's
      by_id.set_image_id(request.image_id());
      key = AffinityKey("", by_id);
    }
  } else {
    key = AffinityKeyFor(request);
  }
  if (key) context.AddMetadata(kAffinityHeader, *key);
}

StatusOr<v1::EmbedResponse> Client::Embed(const std::string& encoded_image) {
  v1::EmbedRequest request;
  request.mutable_image()->set_encoded(encoded_image);
  return Embed(request);
}

StatusOr<v1::EmbedResponse> Client::Embed(const v1::EmbedRequest& request) {
  grpc::ClientContext context;
  AddAffinity(context, request);  // first: a GetInfo for the identity must not eat this call's deadline
  SetDeadline(context);
  v1::EmbedResponse response;
  Status status = FromGrpcStatus(stub_->Embed(&context, request, &response));
  if (!status.ok()) return status;
  return response;
}

StatusOr<v1::SegmentResponse> Client::Segment(const SegmentArgs& args) {
  return Segment(BuildSegmentRequest(args));
}

StatusOr<v1::SegmentResponse> Client::Segment(const v1::SegmentRequest& request) {
  grpc::ClientContext context;
  AddAffinity(context, request);
  SetDeadline(context);
  v1::SegmentResponse response;
  Status status = FromGrpcStatus(stub_->Segment(&context, request, &response));
  if (!status.ok()) return status;
  return response;
}

StatusOr<v1::GenerateMasksResponse> Client::GenerateMasks(const v1::GenerateMasksRequest& request) {
  grpc::ClientContext context;
  AddAffinity(context, request);
  SetDeadline(context);
  v1::GenerateMasksResponse response;
  Status status = FromGrpcStatus(stub_->GenerateMasks(&context, request, &response));
  if (!status.ok()) return status;
  return response;
}

StatusOr<v1::GetInfoResponse> Client::GetInfo() {
  grpc::ClientContext context;
  SetDeadline(context);
  v1::GetInfoResponse response;
  Status status = FromGrpcStatus(stub_->GetInfo(&context, v1::GetInfoRequest(), &response));
  if (!status.ok()) return status;
  return response;
}

StatusOr<ServingStatus> Client::Health(const std::string& service) {
  // The generic stub only offers the callback form; wait for it here to keep Health synchronous.
  grpc::GenericStub generic(channel_);
  grpc::ClientContext context;
  SetDeadline(context);
  grpc::ByteBuffer request = EncodeHealthRequest(service);
  grpc::ByteBuffer response;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;  // guarded by mu
  grpc::Status rpc_status;
  generic.UnaryCall(&context, kHealthCheckMethod, grpc::StubOptions(), &request, &response,
                    [&](grpc::Status s) {
                      std::lock_guard<std::mutex> lock(mu);
                      rpc_status = std::move(s);
                      done = true;
                      cv.notify_one();
                    });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
  }
  Status status = FromGrpcStatus(rpc_status);
  if (!status.ok()) return status;
  return DecodeHealthResponse(response);
}

std::unique_ptr<SegmentSession> Client::OpenSession(std::chrono::milliseconds stream_timeout) {
  return std::make_unique<SegmentSession>(*this, stream_timeout);
}

SegmentSession::SegmentSession(v1::MaskService::Stub& stub, std::chrono::milliseconds timeout)
    : stub_(stub) {
  if (timeout.count() > 0) context_.set_deadline(DeadlineAfter(timeout));
}

SegmentSession::SegmentSession(Client& client, std::chrono::milliseconds timeout)
    : SegmentSession(client.stub(), timeout) {
  client_ = &client;
}

SegmentSession::~SegmentSession() {
  if (!finished_ && stream_) {
    context_.TryCancel();
    (void)Finish();
  }
}

StatusOr<v1::SegmentResponse> SegmentSession::Send(const v1::SegmentRequest& request) {
  if (finished_) return FailedPrecondition("SegmentSession::Send after Finish");
  if (!stream_) {
    // Metadata goes out when the stream opens, so the stream opens here, keyed by its first image.
    if (client_) {
      if (std::optional<std::string> key = client_->AffinityKeyFor(request)) {
        context_.AddMetadata(kAffinityHeader, *key);
      }
    }
    stream_ = stub_.SegmentStream(&context_);
  }
  v1::SegmentResponse response;
  if (!stream_->Write(request) || !stream_->Read(&response)) {
    Status status = Finish();
    if (status.ok()) return Unavailable("SegmentStream closed by the server before answering");
    return status;
  }
  if (response.has_error()) {
    const int code = response.error().code();
    if (code == 0) return Internal("SegmentStream response has `error` set with code 0: " + response.error().message());
    return FromGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(code), response.error().message()));
  }
  return response;
}

Status SegmentSession::Finish() {
  if (finished_) return final_status_;
  finished_ = true;
  if (!stream_) return final_status_;  // never opened: nothing was sent
  stream_->WritesDone();
  v1::SegmentResponse ignored;
  while (stream_->Read(&ignored)) {
  }
  final_status_ = FromGrpcStatus(stream_->Finish());
  return final_status_;
}

}  // namespace maskd::client
