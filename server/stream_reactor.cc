#include "server/stream_reactor.h"

#include "server/call_control.h"
#include "server/grpc_status.h"
#include "server/logging.h"
#include "server/security.h"

namespace maskd::server {

StreamReactor::StreamReactor(MaskService* service, grpc::CallbackServerContext* context)
    : service_(service) {
  StreamCallInfo call;
  call.request_id = ClientRequestId(context);
  call.peer = context->peer();
  call.deadline = SteadyDeadline(context->deadline());
  call.scope = CallScope(*context, service->options_.scoped_cache);
  context->AddInitialMetadata("x-request-id", call.request_id);  // before the first response is sent
  // Operations on a reactor not yet returned to gRPC are queued until it is bound, so nothing the
  // session starts here runs inline.
  StatusOr<std::unique_ptr<StreamSession>> session = service->OpenStream(this, std::move(call));
  if (session.ok()) {
    session_ = std::move(*session);
  } else {
    Finish(ToGrpcStatus(session.status()));
  }
}

void StreamReactor::OnDone() {
  std::unique_ptr<StreamSession> session = std::move(session_);
  MaskService* service = service_;
  delete this;
  if (session) {
    StreamSession::Close(std::move(session));
  } else {
    service->RefusedStreamEnded();
  }
}

}  // namespace maskd::server
