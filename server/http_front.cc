#include "server/http_front.h"

#include <httplib.h>

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <thread>
#include <utility>
#include <vector>

#include "maskd/v1/maskd.grpc.pb.h"
#include "proto/grpc_code_name.h"
#include "server/logging.h"
#include "server/security.h"

namespace maskd::server {

// The page, generated from server/web/index.html at build time (server/web/embed_file.cmake).
extern const char kIndexHtml[];
extern const size_t kIndexHtmlSize;

namespace {

namespace pbu = google::protobuf::util;

std::string ToJson(const google::protobuf::Message& m) {
  pbu::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  std::string out;
  // Printing a well-formed message cannot fail (only Any with unknown types can).
  (void)pbu::MessageToJsonString(m, &out, o);
  return out;
}

// The error body, built as a google.protobuf.Struct so that protobuf's printer escapes the message.
HttpReply Error(int http_status, grpc::StatusCode code, const std::string& message) {
  google::protobuf::Struct body;
  google::protobuf::Struct* e = (*body.mutable_fields())["error"].mutable_struct_value();
  (*e->mutable_fields())["code"].set_number_value(http_status);
  (*e->mutable_fields())["status"].set_string_value(GrpcCodeName(code));
  (*e->mutable_fields())["message"].set_string_value(message);
  HttpReply r;
  r.status = http_status;
  r.body = ToJson(body);
  return r;
}

HttpReply Error(grpc::StatusCode code, const std::string& message) {
  return Error(HttpStatusFor(code), code, message);
}

void Send(const HttpReply& reply, httplib::Response& res) {
  res.status = reply.status;
  res.set_content(reply.body, reply.content_type.c_str());
}

}  // namespace

int HttpStatusFor(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return 200;
    case grpc::StatusCode::CANCELLED: return 499;  // client closed request
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::OUT_OF_RANGE: return 400;
    case grpc::StatusCode::UNAUTHENTICATED: return 401;
    case grpc::StatusCode::PERMISSION_DENIED: return 403;
    case grpc::StatusCode::NOT_FOUND: return 404;
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::ABORTED: return 409;
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return 429;
    case grpc::StatusCode::UNIMPLEMENTED: return 501;
    case grpc::StatusCode::UNAVAILABLE: return 503;
    case grpc::StatusCode::DEADLINE_EXCEEDED: return 504;
    default: return 500;  // UNKNOWN, INTERNAL, DATA_LOSS
  }
}

struct HttpFront::Impl {
  HttpFrontOptions options;
  std::unique_ptr<v1::MaskService::Stub> stub;
  httplib::Server http;
  std::thread thread;
  std::atomic<bool> started{false}, stopped{false};

  // One unary call: JSON body -> Request, the stub's method, Response -> JSON.
  template <typename Request, typename Response, typename Method>
  void Unary(const httplib::Request& req, httplib::Response& res, const char* what, Method method) {
    std::optional<std::string> scope;
    if (options.authorize) {
      scope = options.authorize(req.get_header_value("Authorization"));
      if (!scope) {
        res.set_header("WWW-Authenticate", "Bearer");
        Send(Error(grpc::StatusCode::UNAUTHENTICATED, ""), res);
        return;
      }
    }
    Request request;
    if (!req.body.empty()) {
      pbu::JsonParseOptions po;
      po.ignore_unknown_fields = false;
      const auto parsed = pbu::JsonStringToMessage(req.body, &request, po);
      if (!parsed.ok()) {
        Send(Error(grpc::StatusCode::INVALID_ARGUMENT,
                   std::string("request body is not a maskd.v1.") + what +
                       " in JSON: " + std::string(parsed.message())),
             res);
        return;
      }
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + options.call_timeout);
    // The service validates the id (and makes one when it is missing or unusable).
    if (req.has_header("x-request-id")) ctx.AddMetadata("x-request-id", req.get_header_value("x-request-id"));
    if (scope && !scope->empty()) ctx.AddMetadata(kInProcessScopeMetadata, *scope);
    Response response;
    const grpc::Status s = (stub.get()->*method)(&ctx, request, &response);
    const auto& md = ctx.GetServerInitialMetadata();
    if (auto it = md.find("x-request-id"); it != md.end()) {
      res.set_header("x-request-id", std::string(it->second.data(), it->second.size()));
    }
    if (!s.ok()) {
      Send(Error(s.error_code(), s.error_message()), res);
      return;
    }
    HttpReply ok;
    ok.body = ToJson(response);
    Send(ok, res);
  }
};

HttpFront::HttpFront(HttpFrontOptions options, std::shared_ptr<grpc::Channel> channel)
    : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  impl_->stub = v1::MaskService::NewStub(std::move(channel));
  httplib::Server& http = impl_->http;
  Impl* impl = impl_.get();
  const int threads = std::max(1, impl_->options.threads);
  http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http.set_payload_max_length(static_cast<size_t>(impl_->options.max_body_bytes));
  // Small JSON answers on kept-alive connections: without TCP_NODELAY, Nagle's algorithm holds the
  // last segment until the client's delayed ACK (tens of milliseconds per click).
  http.set_tcp_nodelay(true);
  // A page makes a request per click; httplib's default closes a kept-alive connection after 5.
  http.set_keep_alive_max_count(1000);
  // httplib's default sets SO_REUSEPORT, with which a second maskd on the same port would start
  // "fine" and take a share of the first one's connections (the reason gRPC's is off too).
  // SO_REUSEADDR alone still allows a restart while old connections sit in TIME_WAIT.
  http.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });

  http.Post("/v1/embed", [impl](const httplib::Request& req, httplib::Response& res) {
    impl->Unary<v1::EmbedRequest, v1::EmbedResponse>(req, res, "EmbedRequest",
                                                      &v1::MaskService::Stub::Embed);
  });
  http.Post("/v1/segment", [impl](const httplib::Request& req, httplib::Response& res) {
    impl->Unary<v1::SegmentRequest, v1::SegmentResponse>(req, res, "SegmentRequest",
                                                          &v1::MaskService::Stub::Segment);
  });
  http.Post("/v1/generate", [impl](const httplib::Request& req, httplib::Response& res) {
    impl->Unary<v1::GenerateMasksRequest, v1::GenerateMasksResponse>(
        req, res, "GenerateMasksRequest", &v1::MaskService::Stub::GenerateMasks);
  });
  http.Get("/v1/info", [impl](const httplib::Request& req, httplib::Response& res) {
    impl->Unary<v1::GetInfoRequest, v1::GetInfoResponse>(req, res, "GetInfoRequest",
                                                          &v1::MaskService::Stub::GetInfo);
  });
  // The wrong method on a known route is 405 (with Allow), not the 404 of an unknown path.
  const auto wrong_method = [](const char* allow) {
    return [allow](const httplib::Request& req, httplib::Response& res) {
      res.set_header("Allow", allow);
      Send(Error(405, grpc::StatusCode::UNIMPLEMENTED,
                 req.method + " " + req.path + ": expected " + allow),
           res);
    };
  };
  http.Get("/v1/embed", wrong_method("POST"));
  http.Get("/v1/segment", wrong_method("POST"));
  http.Get("/v1/generate", wrong_method("POST"));
  http.Post("/v1/info", wrong_method("GET"));
  http.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(std::string(kIndexHtml, kIndexHtmlSize), "text/html; charset=utf-8");
  });
  // Errors httplib itself produces (unknown path 404, body over the limit 413, unreadable request 400)
  // get the same JSON body; replies that already have one keep it.
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    grpc::StatusCode code = grpc::StatusCode::INVALID_ARGUMENT;
    std::string message = "HTTP " + std::to_string(res.status);
    if (res.status == 404) {
      code = grpc::StatusCode::NOT_FOUND;
      message = req.method + " " + req.path +
                ": no such route (expected POST /v1/embed, POST /v1/segment, POST /v1/generate, GET "
                "/v1/info or GET /)";
    } else if (res.status == 413) {
      code = grpc::StatusCode::RESOURCE_EXHAUSTED;
      message = "request body is larger than this server accepts (the image limit in base64 plus "
                "the prompts; see GET /v1/info limits)";
    }
    const int status = res.status;
    Send(Error(status, code, message), res);
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unexpected non-standard exception in the HTTP front";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = std::string("unexpected exception in the HTTP front: ") + e.what();
    } catch (...) {
    }
    spdlog::error("{}", LogSafe(what));
    Send(Error(grpc::StatusCode::INTERNAL, what), res);
  });
}

HttpFront::~HttpFront() { Stop(); }

void HttpFront::AddGet(const std::string& path, GetHandler handler) {
  impl_->http.Get(path, [handler = std::move(handler)](const httplib::Request&, httplib::Response& res) {
    Send(handler(), res);
  });
}

Status HttpFront::Start() {
  httplib::Server& http = impl_->http;
  const std::string where = impl_->options.host + ":" + std::to_string(impl_->options.port);
  if (impl_->options.port == 0) {
    port_ = http.bind_to_any_port(impl_->options.host);
  } else if (http.bind_to_port(impl_->options.host, impl_->options.port)) {
    port_ = impl_->options.port;
  } else {
    port_ = -1;
  }
  if (port_ <= 0) {
    port_ = 0;
    return Unavailable("--http-listen = \"" + where +
                       "\" could not be bound: address already in use, or not an address of this "
                       "machine (expected a free port)");
  }
  impl_->started = true;
  impl_->thread = std::thread([this] { impl_->http.listen_after_bind(); });
  // httplib's stop() does nothing before the accept loop runs, so a Stop right after Start would
  // leave it running and the join waiting: wait for the loop (it starts at once after bind).
  for (int i = 0; i < 5000 && !http.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return Status::Ok();
}

void HttpFront::Stop() {
  if (!impl_ || !impl_->started || impl_->stopped.exchange(true)) return;
  impl_->http.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace maskd::server
