// SegmentStream's transport in maskd: gRPC's callback reactor around a StreamSession
// (server/stream_session.h), which holds all of the stream's logic. The reactor only forwards
// gRPC's reactions to the session and the session's operations to gRPC.
#pragma once

#include <memory>

#include <grpcpp/grpcpp.h>

#include "model/api/status.h"
#include "server/stream_session.h"

namespace maskd::server {

class StreamReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                            public StreamTransport {
 public:
  // Opens the stream through service->OpenStream; a refused one (loading, draining) only finishes
  // with the refusal's status.
  StreamReactor(MaskService* service, grpc::CallbackServerContext* context);

  void OnReadDone(bool ok) override { session_->OnReadDone(ok); }
  void OnWriteDone(bool ok) override { session_->OnWriteDone(ok); }
  void OnCancel() override {
    if (session_) session_->OnCancel();
  }
  void OnDone() override;

  void Read(grpc::ByteBuffer* into) override { StartRead(into); }
  void Write(const grpc::ByteBuffer* message) override { StartWrite(message); }
  void End(const grpc::Status& status) override { Finish(status); }

 private:
  MaskService* const service_;
  std::unique_ptr<StreamSession> session_;  // null when the stream was refused
};

}  // namespace maskd::server
