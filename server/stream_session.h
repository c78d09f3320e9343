// One SegmentStream (maskd.v1.MaskService) without its transport: reads, the stream's current
// image, ordered writes and the end of the stream. In maskd the transport is gRPC's callback reactor
// (server/stream_reactor.h); tests/server_stream_session_test.cc drives the same session from a
// transport of plain threads, so ThreadSanitizer sees every hand-over between them (Debian's gRPC
// and abseil are not instrumented: their hand-overs would all look like races). MaskService opens
// and drains sessions; a session owns nothing of the model and never blocks its caller.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "maskd/v1/maskd.grpc.pb.h"
#include "server/mask_service.h"
#include "server/pipeline.h"
#include "server/wire.h"

namespace maskd::server {

// What a session needs from its transport, with the rules of gRPC's callback API: at most one read
// and one write outstanding; each completes exactly once (ok = false once the client is gone or has
// half-closed), on any thread, possibly inline inside the call that started it; End is called once,
// after which no operation starts, and once every operation has completed the transport calls
// StreamSession::Close. A cancelled call completes outstanding operations with ok = false and calls
// OnCancel.
class StreamTransport {
 public:
  virtual void Read(grpc::ByteBuffer* into) = 0;
  virtual void Write(const grpc::ByteBuffer* message) = 0;
  virtual void End(const grpc::Status& status) = 0;

 protected:
  ~StreamTransport() = default;
};

// The call a session belongs to, as its transport knows it.
struct StreamCallInfo {
  std::string request_id;  // ClientRequestId: messages are "<id>.<n>"
  std::string peer;
  Clock::time_point deadline = Clock::time_point::max();
  std::string scope;  // every message's CallControl scope (CallScope)
};

// One bidirectional stream. Reads one message at a time (up to max_stream_in_flight being worked
// on), runs each through the Pipeline, and writes responses strictly in message order.
//
// The stream's "current image" is tracked in read order: a message that names an image creates a
// new CurrentImage, which later messages without an image wait on until it resolves to an id.
//
// Made by MaskService::OpenStream, which starts the first read; ended by Close.
class StreamSession {
 public:
  StreamSession(MaskService* service, StreamTransport* transport, StreamCallInfo call, Backend backend);

  // The transport's completions (see StreamTransport).
  void OnReadDone(bool ok);
  void OnWriteDone(bool ok);
  void OnCancel();

  // Once the transport has ended and every operation has completed: logs the stream's end, removes
  // it from the service, deletes it, and only then counts the call as ended (the service may be
  // torn down as soon as no call is left).
  static void Close(std::unique_ptr<StreamSession> session);

  // Transport operations decided under the lock and started after it is released. gRPC may run a
  // reaction inline inside Write/End, so no lock is held then, and every decided read or write
  // counts in starting_ until it has been started: the stream cannot end (and be deleted) under an
  // operation that is about to start.
  struct Actions {
    bool read = false;
    grpc::ByteBuffer* write = nullptr;
    bool finish = false;
    grpc::Status finish_status;
    bool empty() const { return !read && write == nullptr && !finish; }
  };

  void Run(const Actions& a);

  // Shutdown: no more messages are read; the stream ends with UNAVAILABLE once pending responses
  // are written. Returns the actions to Run() without the caller's locks; until they run, the
  // stream stays alive (a decided operation is counted in starting_, a decided finish not yet sent).
  Actions Drain();

 private:
  // The first read (OpenStream, before the session is visible to a drain: a drain that ended it
  // first would have this read start after the end).
  void Start();

  struct CurrentImage {
    uint64_t seq = 0;  // the message that named it
    std::mutex mu;
    bool resolved = false;
    StatusOr<std::string> id = Internal("unresolved");
    std::vector<std::function<void(const StatusOr<std::string>&)>> waiters;

    void Resolve(StatusOr<std::string> value) {
      std::vector<std::function<void(const StatusOr<std::string>&)>> w;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (resolved) return;
        resolved = true;
        id = std::move(value);
        w = std::move(waiters);
      }
      for (auto& f : w) f(id);
    }
    void Then(std::function<void(const StatusOr<std::string>&)> f) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!resolved) {
          waiters.push_back(std::move(f));
          return;
        }
      }
      f(id);
    }
  };

  struct Message {
    uint64_t seq = 0;
    std::string rid;
    Clock::time_point arrival;
    v1::SegmentRequest request;
    v1::SegmentResponse response;
    grpc::ByteBuffer wire;  // `response`, serialized once it is complete
    CallControlPtr control;
    std::shared_ptr<CurrentImage> image;  // produced (names an image) or consumed (omits it)
    bool names_image = false;
    bool ready = false;
    // What the pipeline answered (once dispatched), converted into `response` by Complete.
    SegmentOutcome outcome;
    bool dispatched = false;
  };

  // Requires mu_. Takes the parsed request into a new message in read order.
  Message* AcceptLocked(v1::SegmentRequest request);

  // Requires mu_: the next write, read or the end of the stream.
  void ScheduleLocked(Actions* a);

  // Validates the message (once, here at the edge) and hands it to the Pipeline.
  void Process(Message* m);
  void ProcessImpl(Message* m);
  void Dispatch(Message* m, ImageInput target, std::vector<PromptDraft> drafts);

  // From any thread, once per message.
  void Complete(Message* m, const Status& status);

  friend class MaskService;  // OpenStream starts the first read

  MaskService* const service_;
  StreamTransport* const transport_;
  const Backend backend_;
  const std::string rid_;
  const std::string peer_;
  const Clock::time_point arrival_;
  const Clock::time_point deadline_;
  const std::shared_ptr<std::atomic<bool>> cancelled_flag_;
  const std::string scope_;  // every message's CallControl scope (CallScope)

  // Guards everything below, and read_buf_ between reads. Transport operations are started only
  // after it is released (see Actions).
  std::mutex mu_;
  grpc::ByteBuffer read_buf_;
  std::map<uint64_t, std::unique_ptr<Message>> pending_;  // by sequence number
  uint64_t next_seq_ = 0, next_write_ = 0;
  bool reading_ = false, reads_done_ = false, write_in_flight_ = false;
  bool draining_ = false, cancelled_ = false, finished_ = false;
  int starting_ = 0;  // decided reads/writes not yet started (see Actions)
  std::shared_ptr<CurrentImage> current_;
  uint64_t messages_ = 0;
  // How the stream was finished; unset until then (the access log says UNKNOWN).
  std::optional<StatusCode> final_code_;
  int64_t malformed_message_ = -1;  // the sequence number of a message that did not parse
};

}  // namespace maskd::server
