// maskd.v1.MaskService on gRPC's callback API. Handlers validate, hand the request to the Pipeline
// and return; completions arrive on pool threads and call Finish. No exception crosses an RPC
// boundary: every entry point turns one into INTERNAL with its message.
//
// States: loading (calls answer UNAVAILABLE until SetBackend), serving, draining (shutdown: new
// calls answer UNAVAILABLE, streams end with UNAVAILABLE after their pending responses).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "maskd/v1/maskd.grpc.pb.h"
#include "server/device_worker.h"
#include "server/metrics.h"
#include "server/pipeline.h"
#include "server/wire.h"
#include "server/router.h"
#include "server/startup.h"

namespace maskd::server {

class StreamReactor;
class StreamSession;
class StreamTransport;
struct StreamCallInfo;

struct ServiceOptions {
  RequestLimits limits;
  // GenerateMasks' parameter bounds (--max-generate-*).
  MaskGenerationLimits generation_limits;
  bool access_log = true;
  // Messages of one SegmentStream being worked on at once; further reads wait.
  int max_stream_in_flight = 32;
  std::string version;           // "0.1.0 (abc123)"
  std::string checkpoint_label;  // as given, or "builtin-demo"
  // Told every finished call and stream message; may be null. Must outlive the service.
  Metrics* metrics = nullptr;
  // --auth-tokens: calls over TLS need a token TokenAuthProcessor accepted (server/security.h);
  // others get UNAUTHENTICATED with an empty message before anything else is looked at.
  bool require_token = false;
  // Cold-start milestones: GetInfo reports them, the first successful Segment marks kFirstMask.
  // May be null. Must outlive the service.
  StartupTimes* startup = nullptr;
  // --auth-tokens without --auth-shared-cache: each call sees only the embeddings and results of
  // its token's scope (server/security.h, CallScope).
  bool scoped_cache = false;
};

// Logs (INFO, against the request id) a response over 4 MiB, gRPC clients' default receive limit,
// naming the limit to raise: Segment responses and SegmentStream messages.
void WarnIfOverDefaultReceiveLimit(const std::string& request_id, size_t bytes);

// What the service needs once the model is loaded.
struct Backend {
  Pipeline* pipeline = nullptr;
  std::vector<DeviceWorker*> workers;
};

// SegmentStream is a raw (ByteBuffer) method: with the typed one, gRPC reports a message that does
// not parse exactly like the client's end of the stream, and the stream ended OK with the rest of
// the messages silently dropped. The reactor parses each message itself instead.
using MaskServiceBase = v1::MaskService::WithCallbackMethod_Embed<
    v1::MaskService::WithCallbackMethod_Segment<v1::MaskService::WithRawCallbackMethod_SegmentStream<
        v1::MaskService::WithCallbackMethod_GetInfo<
        v1::MaskService::WithCallbackMethod_GenerateMasks<v1::MaskService::Service>>>>>;

class MaskService final : public MaskServiceBase {
 public:
  explicit MaskService(ServiceOptions options);
  ~MaskService() override;

  // Loading -> serving.
  void SetBackend(Backend backend);
  // Serving -> draining (idempotent). Ends idle streams now and busy ones once their pending
  // responses are written.
  void BeginDrain();
  // Blocks until no call or stream is in flight, or until `deadline`; true when none is left.
  bool WaitIdle(std::chrono::steady_clock::time_point deadline);
  int active_calls() const;

  grpc::ServerUnaryReactor* Embed(grpc::CallbackServerContext* context,
                                  const v1::EmbedRequest* request,
                                  v1::EmbedResponse* response) override;
  grpc::ServerUnaryReactor* Segment(grpc::CallbackServerContext* context,
                                    const v1::SegmentRequest* request,
                                    v1::SegmentResponse* response) override;
  grpc::ServerUnaryReactor* GenerateMasks(grpc::CallbackServerContext* context,
                                          const v1::GenerateMasksRequest* request,
                                          v1::GenerateMasksResponse* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* SegmentStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const v1::GetInfoRequest* request,
                                    v1::GetInfoResponse* response) override;

  void FillInfo(v1::GetInfoResponse* info) const;
  // A unary call whose request did not parse (it never reaches a handler): counted as a call
  // answered INVALID_ARGUMENT.
  void RecordUnparsable();

  // Opens a SegmentStream on `transport` (gRPC's reactor in maskd; tests' transports too) and
  // starts its first read; the transport's completions go to the session it returns. Counts as a
  // call until StreamSession::Close. Refused while loading or draining: the status to end the
  // stream with, counted as a call until RefusedStreamEnded.
  StatusOr<std::unique_ptr<StreamSession>> OpenStream(StreamTransport* transport, StreamCallInfo call);
  // What a refused OpenStream's transport calls once it has ended the stream with the refusal.
  void RefusedStreamEnded() { CallEnded(); }

 private:
  friend class StreamReactor;
  friend class StreamSession;
  enum class State { kLoading, kServing, kDraining };
  struct UnaryCall;

  // Null when the call may proceed; else the reactor that has already refused it (UNAUTHENTICATED).
  grpc::ServerUnaryReactor* RefuseUnauthenticated(const char* method, grpc::CallbackServerContext* context);
  std::shared_ptr<UnaryCall> BeginUnary(const char* method, grpc::CallbackServerContext* context);
  // UNAVAILABLE while loading or draining, else OK and the backend.
  Status Admit(Backend* backend) const;
  void RecordOutcome(const Status& status);
  // RecordOutcome plus the metrics of one call or stream message (`method`: Metrics::ObserveCall's).
  void RecordCall(const char* method, const Status& status, Clock::time_point arrival);
  void CallStarted();
  void CallEnded();
  void AddStream(StreamSession* s);
  void RemoveStream(StreamSession* s);

  const ServiceOptions options_;
  const std::chrono::steady_clock::time_point started_;

  // Guards state_ and backend_.
  mutable std::mutex state_mu_;
  State state_ = State::kLoading;
  Backend backend_;

  // Guards the counters; idle_cv_ is signalled when active_ drops to 0.
  mutable std::mutex counters_mu_;
  std::condition_variable idle_cv_;
  uint64_t calls_ = 0;
  int active_ = 0;
  std::map<std::string, uint64_t> calls_by_status_;

  // Guards streams_. Lock order: streams_mu_, then a stream's own lock.
  std::mutex streams_mu_;
  std::set<StreamSession*> streams_;
};

}  // namespace maskd::server
