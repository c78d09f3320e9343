#include "server/parse_error_interceptor.h"

#include <string>

#include <spdlog/spdlog.h>

#include "server/logging.h"

namespace maskd::server {
namespace {

class ParseErrorInterceptor final : public grpc::experimental::Interceptor {
 public:
  ParseErrorInterceptor(grpc::experimental::ServerRpcInfo* info,
                        const std::function<void()>* on_unparsable)
      : info_(info), on_unparsable_(on_unparsable) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    // For a unary call the request is deserialized before any handler exists; a failure leaves
    // the received message empty (null) and gRPC answers UNIMPLEMENTED with no message.
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      unparsable_ = true;
    }
    if (unparsable_ &&
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS) &&
        methods->GetSendStatus().error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      const std::string method = info_->method() ? info_->method() : "?";
      LogRequest(spdlog::level::info, NewRequestId(),
                 "access method={} status=INVALID_ARGUMENT: the request did not parse",
                 LogSafe(method));
      if (*on_unparsable_) (*on_unparsable_)();
      methods->ModifySendStatus(grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          "the request to " + method +
              " is not a valid protobuf message of the method's request type (expected a "
              "serialized maskd.v1 request)"));
    }
    methods->Proceed();
  }

 private:
  grpc::experimental::ServerRpcInfo* const info_;
  const std::function<void()>* const on_unparsable_;  // the factory's, which outlives the server
  bool unparsable_ = false;
};

class Factory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit Factory(std::function<void()> on_unparsable) : on_unparsable_(std::move(on_unparsable)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    if (info->type() != grpc::experimental::ServerRpcInfo::Type::UNARY) return nullptr;
    return new ParseErrorInterceptor(info, &on_unparsable_);
  }

 private:
  const std::function<void()> on_unparsable_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeParseErrorInterceptorFactory(std::function<void()> on_unparsable) {
  return std::make_unique<Factory>(std::move(on_unparsable));
}

}  // namespace maskd::server
