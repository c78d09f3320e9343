#include "server/mask_service.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "server/grpc_status.h"
#include "server/logging.h"

namespace maskd::server {
namespace {

std::string ClientRequestId(grpc::CallbackServerContext* context) {
  const auto& md = context->client_metadata();
  auto it = md.find("x-request-id");
  return RequestIdFrom(it == md.end() ? std::string() : std::string(it->second.data(), it->second.size()));
}

double Millis(Clock::time_point t0) { return static_cast<double>(MicrosSince(t0)) / 1000.0; }

int PromptCount(const v1::SegmentRequest& r) { return r.prompts_size(); }

}  // namespace

// One unary call: its reactor, control and access-log facts. Finish runs exactly once.
struct MaskService::UnaryCall {
  MaskService* service = nullptr;
  grpc::CallbackServerContext* context = nullptr;
  grpc::ServerUnaryReactor* reactor = nullptr;
  const char* method = "";
  std::string peer;
  Clock::time_point arrival;
  CallControlPtr control;
  std::atomic<bool> finished{false};

  // images/prompts/cached: what the access log reports for this call.
  void Finish(const Status& status, int images, int prompts, bool cached, const std::string& tag = "") {
    if (finished.exchange(true)) return;
    control->MarkFinished();
    service->RecordOutcome(status);
    if (service->options_.access_log) {
      spdlog::info("[{}] access method={} peer={} status={} latency_ms={:.3f} images={} prompts={} "
                   "cached={}{}{}",
                   control->request_id(), method, LogSafe(peer), StatusCodeName(status.code()),
                   Millis(arrival), images, prompts, cached ? "true" : "false",
                   tag.empty() ? "" : " tag=", LogSafe(tag));
    }
    if (!status.ok() && status.code() == StatusCode::kInternal) {
      spdlog::error("[{}] {} failed: {}", control->request_id(), method, LogSafe(status.message()));
    } else if (!status.ok()) {
      spdlog::debug("[{}] {} failed: {}", control->request_id(), method,
                    LogSafe(status.ToString()));
    }
    MaskService* s = service;
    reactor->Finish(ToGrpcStatus(status));
    s->CallEnded();
  }
};

// ---------------------------------------------------------------------------------------------------
// SegmentStream

// One bidirectional stream. Reads one message at a time (up to max_stream_in_flight being worked
// on), runs each through the Pipeline, and writes responses strictly in message order.
//
// The stream's "current image" is tracked in read order: a message that names an image creates a
// new CurrentImage, which later messages without an image wait on until it resolves to an id.
class StreamReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  StreamReactor(MaskService* service, grpc::CallbackServerContext* context, Backend backend)
      : service_(service),
        context_(context),
        backend_(backend),
        rid_(ClientRequestId(context)),
        peer_(context->peer()),
        arrival_(Clock::now()),
        deadline_(SteadyDeadline(context->deadline())),
        cancelled_flag_(std::make_shared<std::atomic<bool>>(false)) {
    if (service_->options_.access_log) {
      spdlog::debug("[{}] SegmentStream opened by {}", rid_, LogSafe(peer_));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      reading_ = true;
    }
    StartRead(&read_buf_);
  }

  void OnReadDone(bool ok) override {
    Actions a;
    Message* m = nullptr;
    // Parsed before taking the lock: no other read can start until reading_ is cleared below.
    v1::SegmentRequest request;
    const bool parsed =
        ok && grpc::SerializationTraits<v1::SegmentRequest>::Deserialize(&read_buf_, &request).ok();
    {
      std::lock_guard<std::mutex> lock(mu_);
      reading_ = false;
      if (!ok) {
        reads_done_ = true;
      } else if (!parsed) {
        // Nothing more is read: the stream ends with INVALID_ARGUMENT once the responses to the
        // earlier messages are written, so the client knows which messages were not answered.
        reads_done_ = true;
        malformed_message_ = static_cast<int64_t>(next_seq_);
      } else if (!finished_ && !draining_ && !cancelled_) {
        m = AcceptLocked(std::move(request));
      }
      ScheduleLocked(&a);
    }
    // The accepted message keeps the stream open (it is pending), so the next read can start first.
    Run(a);
    if (m != nullptr) Process(m);
  }

  void OnWriteDone(bool ok) override {
    Actions a;
    {
      std::lock_guard<std::mutex> lock(mu_);
      write_in_flight_ = false;
      pending_.erase(next_write_);
      ++next_write_;
      if (!ok) cancelled_ = true;  // the client is gone; nothing more can be written
      ScheduleLocked(&a);
    }
    Run(a);
  }

  void OnCancel() override {
    cancelled_flag_->store(true);
    Actions a;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
      ScheduleLocked(&a);
    }
    Run(a);
  }

  void OnDone() override {
    if (service_->options_.access_log) {
      std::string status;
      uint64_t messages;
      {
        std::lock_guard<std::mutex> lock(mu_);
        status = final_status_name_;
        messages = messages_;
      }
      spdlog::info("[{}] access method=SegmentStream peer={} status={} latency_ms={:.3f} messages={}",
                   rid_, LogSafe(peer_), status, Millis(arrival_), messages);
    }
    MaskService* s = service_;
    s->RemoveStream(this);
    delete this;
    s->CallEnded();
  }

  // gRPC operations decided under the lock and started after it is released. gRPC may run a
  // reaction inline inside StartWrite/Finish, so no lock is held then, and every decided read or
  // write counts in starting_ until it has been started: the stream cannot finish (and be deleted)
  // under an operation that is about to start.
  struct Actions {
    bool read = false;
    grpc::ByteBuffer* write = nullptr;
    bool finish = false;
    grpc::Status finish_status;
    bool empty() const { return !read && write == nullptr && !finish; }
  };

  void Run(const Actions& a) {
    if (a.finish) {
      Finish(a.finish_status);
      return;  // OnDone may delete this at any moment now
    }
    if (a.empty()) return;
    if (a.write) StartWrite(a.write);
    if (a.read) StartRead(&read_buf_);
    Actions next;
    {
      std::lock_guard<std::mutex> lock(mu_);
      starting_ -= (a.write ? 1 : 0) + (a.read ? 1 : 0);
      ScheduleLocked(&next);
    }
    Run(next);
  }

  // Shutdown: no more messages are read; the stream ends with UNAVAILABLE once pending responses
  // are written. Returns the actions to Run() without the caller's locks; until they run, the
  // stream stays alive (a decided operation is counted in starting_, a decided finish not yet sent).
  Actions Drain() {
    Actions a;
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
    ScheduleLocked(&a);
    return a;
  }

 private:
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
  };

  // Requires mu_. Takes the parsed request into a new message in read order.
  Message* AcceptLocked(v1::SegmentRequest request) {
    auto m = std::make_unique<Message>();
    m->seq = next_seq_++;
    m->rid = rid_ + "." + std::to_string(m->seq);
    m->arrival = Clock::now();
    m->request = std::move(request);
    auto flag = cancelled_flag_;
    m->control = std::make_shared<CallControl>(m->rid, deadline_, [flag] { return flag->load(); });
    m->names_image = m->request.image_source_case() != v1::SegmentRequest::IMAGE_SOURCE_NOT_SET;
    if (m->names_image) {
      current_ = std::make_shared<CurrentImage>();
      current_->seq = m->seq;
    }
    m->image = current_;
    ++messages_;
    Message* raw = m.get();
    pending_[m->seq] = std::move(m);
    return raw;
  }

  // Requires mu_: the next write, read or the end of the stream.
  void ScheduleLocked(Actions* a) {
    if (finished_) return;
    if (cancelled_) {
      // Responses cannot be delivered any more: forget the finished ones.
      for (auto it = pending_.begin(); it != pending_.end();) {
        if (it->second->ready && !(write_in_flight_ && it->first == next_write_)) {
          it = pending_.erase(it);
        } else {
          ++it;
        }
      }
    } else if (!write_in_flight_) {
      auto it = pending_.find(next_write_);
      if (it != pending_.end() && it->second->ready) {
        write_in_flight_ = true;
        a->write = &it->second->wire;
        ++starting_;
      }
    }
    if (!reading_ && !reads_done_ && !draining_ && !cancelled_ &&
        pending_.size() < static_cast<size_t>(service_->options_.max_stream_in_flight)) {
      reading_ = true;
      a->read = true;
      ++starting_;
    }
    const bool ending = cancelled_ || draining_ || reads_done_;
    if (ending && pending_.empty() && !write_in_flight_ && starting_ == 0 && a->empty()) {
      finished_ = true;
      a->read = false;
      a->finish = true;
      if (cancelled_) {
        a->finish_status = grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the stream");
        final_status_name_ = "CANCELLED";
      } else if (malformed_message_ >= 0) {
        a->finish_status = ToGrpcStatus(InvalidArgument(
            "SegmentStream message " + std::to_string(malformed_message_) +
            " (counting from 0) is not a valid maskd.v1.SegmentRequest (expected a serialized "
            "SegmentRequest): the earlier messages were answered, it and any later ones were not "
            "read"));
        final_status_name_ = "INVALID_ARGUMENT";
      } else if (draining_ && !reads_done_) {
        a->finish_status = ToGrpcStatus(
            Unavailable("the server is shutting down: reconnect to another server or retry later"));
        final_status_name_ = "UNAVAILABLE";
      } else {
        a->finish_status = grpc::Status::OK;
        final_status_name_ = "OK";
      }
    }
  }

  void Process(Message* m) {
    try {
      ProcessImpl(m);
    } catch (const std::exception& e) {
      Complete(m, Internal(std::string("unexpected exception in SegmentStream: ") + e.what()));
    } catch (...) {
      Complete(m, Internal("unexpected non-standard exception in SegmentStream"));
    }
  }

  void ProcessImpl(Message* m) {
    const RequestLimits& limits = service_->options_.limits;
    m->response.set_request_tag(m->request.request_tag());
    auto fail = [&](const Status& s) {
      if (m->names_image) m->image->Resolve(s);
      Complete(m, s);
    };
    if (Status s = ValidateSegmentOptions(m->request, limits); !s.ok()) return fail(s);
    StatusOr<std::vector<PromptDraft>> drafts =
        ValidatePrompts(m->request.prompts(), limits, /*allow_empty=*/m->names_image);
    if (!drafts.ok()) return fail(drafts.status());

    ImageTarget target;
    switch (m->request.image_source_case()) {
      case v1::SegmentRequest::kImage:
        if (Status s = ValidateImage(m->request.image(), limits, "image"); !s.ok()) return fail(s);
        target.image = &m->request.image();
        break;
      case v1::SegmentRequest::kImageId:
        if (Status s = ValidateImageId(m->request.image_id(), "image_id"); !s.ok()) return fail(s);
        target.image_id = m->request.image_id();
        m->image->Resolve(target.image_id);
        break;
      case v1::SegmentRequest::IMAGE_SOURCE_NOT_SET: {
        if (!m->image) {
          return Complete(m, InvalidArgument(
                                 "image_source: neither image nor image_id is set, and the stream has "
                                 "no current image (expected the first message to name an image)"));
        }
        auto drafts_ptr = std::make_shared<std::vector<PromptDraft>>(std::move(*drafts));
        const uint64_t from = m->image->seq;
        m->image->Then([this, m, drafts_ptr, from](const StatusOr<std::string>& id) {
          if (!id.ok()) {
            return Complete(m, Status(id.status().code(),
                                      "the stream's current image (named by message " +
                                          std::to_string(from) + ") is not available: " +
                                          id.status().message()));
          }
          ImageTarget t;
          t.image_id = *id;
          Dispatch(m, std::move(t), std::move(*drafts_ptr));
        });
        return;
      }
    }
    Dispatch(m, std::move(target), std::move(*drafts));
  }

  void Dispatch(Message* m, ImageTarget target, std::vector<PromptDraft> drafts) {
    Pipeline::OnImage on_image;
    if (m->names_image && target.image != nullptr) {
      std::shared_ptr<CurrentImage> cur = m->image;
      on_image = [cur](StatusOr<std::string> id) { cur->Resolve(std::move(id)); };
    }
    backend_.pipeline->Segment(std::move(target), m->request, std::move(drafts), &m->response,
                               m->control, m->arrival, std::move(on_image),
                               [this, m](Status s) { Complete(m, s); });
  }

  // From any thread, once per message.
  void Complete(Message* m, const Status& status) {
    if (!status.ok()) {
      m->response.clear_results();
      v1::StreamError* e = m->response.mutable_error();
      const grpc::Status g = ToGrpcStatus(status);
      e->set_code(static_cast<int32_t>(g.error_code()));
      e->set_message(g.error_message());
    }
    service_->RecordOutcome(status);
    if (service_->options_.access_log) {
      spdlog::info("[{}] access method=SegmentStream.message peer={} status={} latency_ms={:.3f} "
                   "images={} prompts={} cached={}",
                   m->rid, LogSafe(peer_), StatusCodeName(status.code()), Millis(m->arrival),
                   m->names_image ? 1 : 0, PromptCount(m->request),
                   m->response.cached() ? "true" : "false");
    }
    if (!status.ok() && status.code() == StatusCode::kInternal) {
      spdlog::error("[{}] SegmentStream message failed: {}", m->rid, LogSafe(status.message()));
    }
    m->control->MarkFinished();
    using ResponseTraits = grpc::SerializationTraits<v1::SegmentResponse>;
    bool own_buffer = false;
    if (!ResponseTraits::Serialize(m->response, &m->wire, &own_buffer).ok()) {
      // Only a response over protobuf's 2 GiB limit gets here; answer the message with that error.
      m->response.Clear();
      m->response.set_request_tag(m->request.request_tag());
      v1::StreamError* e = m->response.mutable_error();
      e->set_code(static_cast<int32_t>(grpc::StatusCode::INTERNAL));
      e->set_message("the response to this message could not be serialized");
      (void)ResponseTraits::Serialize(m->response, &m->wire, &own_buffer);
    }
    Actions a;
    {
      std::lock_guard<std::mutex> lock(mu_);
      m->ready = true;
      ScheduleLocked(&a);
    }
    Run(a);
  }

  MaskService* const service_;
  grpc::CallbackServerContext* const context_;
  const Backend backend_;
  const std::string rid_;
  const std::string peer_;
  const Clock::time_point arrival_;
  const Clock::time_point deadline_;
  const std::shared_ptr<std::atomic<bool>> cancelled_flag_;

  // Guards everything below, and read_buf_ between reads. gRPC operations are started only after
  // it is released (see Actions).
  std::mutex mu_;
  grpc::ByteBuffer read_buf_;
  std::map<uint64_t, std::unique_ptr<Message>> pending_;  // by sequence number
  uint64_t next_seq_ = 0, next_write_ = 0;
  bool reading_ = false, reads_done_ = false, write_in_flight_ = false;
  bool draining_ = false, cancelled_ = false, finished_ = false;
  int starting_ = 0;  // decided reads/writes not yet started (see Actions)
  std::shared_ptr<CurrentImage> current_;
  uint64_t messages_ = 0;
  std::string final_status_name_ = "UNKNOWN";
  int64_t malformed_message_ = -1;  // the sequence number of a message that did not parse
};

// ---------------------------------------------------------------------------------------------------
// MaskService

MaskService::MaskService(ServiceOptions options)
    : options_(std::move(options)), started_(std::chrono::steady_clock::now()) {}

MaskService::~MaskService() = default;

void MaskService::SetBackend(Backend backend) {
  std::lock_guard<std::mutex> lock(state_mu_);
  backend_ = std::move(backend);
  if (state_ == State::kLoading) state_ = State::kServing;
}

Status MaskService::Admit(Backend* backend) const {
  std::lock_guard<std::mutex> lock(state_mu_);
  switch (state_) {
    case State::kLoading:
      return Unavailable("maskd is still loading the model (health: NOT_SERVING): retry shortly");
    case State::kDraining:
      return Unavailable("the server is shutting down: retry on another server or later");
    case State::kServing:
      *backend = backend_;
      return Status::Ok();
  }
  return Internal("unknown service state");
}

void MaskService::BeginDrain() {
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    state_ = State::kDraining;
  }
  std::vector<std::pair<StreamReactor*, StreamReactor::Actions>> todo;
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    for (StreamReactor* s : streams_) todo.emplace_back(s, s->Drain());
  }
  // Outside streams_mu_: a finish may run OnDone (RemoveStream) inline. A stream with no action may
  // be gone already and is not touched.
  for (auto& [s, a] : todo) {
    if (!a.empty()) s->Run(a);
  }
}

bool MaskService::WaitIdle(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(counters_mu_);
  return idle_cv_.wait_until(lock, deadline, [this] { return active_ == 0; });
}

int MaskService::active_calls() const {
  std::lock_guard<std::mutex> lock(counters_mu_);
  return active_;
}

void MaskService::CallStarted() {
  std::lock_guard<std::mutex> lock(counters_mu_);
  ++calls_;
  ++active_;
}

void MaskService::CallEnded() {
  std::lock_guard<std::mutex> lock(counters_mu_);
  if (--active_ == 0) idle_cv_.notify_all();
}

void MaskService::RecordOutcome(const Status& status) {
  std::lock_guard<std::mutex> lock(counters_mu_);
  ++calls_by_status_[StatusCodeName(status.code())];
}

void MaskService::AddStream(StreamReactor* s) {
  std::lock_guard<std::mutex> lock(streams_mu_);
  streams_.insert(s);
}

void MaskService::RemoveStream(StreamReactor* s) {
  std::lock_guard<std::mutex> lock(streams_mu_);
  streams_.erase(s);
}

std::shared_ptr<MaskService::UnaryCall> MaskService::BeginUnary(const char* method,
                                                                grpc::CallbackServerContext* context) {
  CallStarted();
  auto call = std::make_shared<UnaryCall>();
  call->service = this;
  call->context = context;
  call->reactor = context->DefaultReactor();
  call->method = method;
  call->peer = context->peer();
  call->arrival = Clock::now();
  call->control = std::make_shared<CallControl>(ClientRequestId(context),
                                                SteadyDeadline(context->deadline()),
                                                [context] { return context->IsCancelled(); });
  return call;
}

grpc::ServerUnaryReactor* MaskService::Embed(grpc::CallbackServerContext* context,
                                             const v1::EmbedRequest* request,
                                             v1::EmbedResponse* response) {
  std::shared_ptr<UnaryCall> call = BeginUnary("Embed", context);
  try {
    Backend backend;
    if (Status s = Admit(&backend); !s.ok()) {
      call->Finish(s, 1, 0, false);
      return call->reactor;
    }
    if (!request->has_image()) {
      call->Finish(InvalidArgument("image is not set (expected encoded bytes or raw pixels)"), 0, 0,
                   false);
      return call->reactor;
    }
    if (Status s = ValidateImage(request->image(), options_.limits, "image"); !s.ok()) {
      call->Finish(s, 1, 0, false);
      return call->reactor;
    }
    backend.pipeline->Embed(*request, response, call->control, call->arrival,
                            [call, response](Status s) { call->Finish(s, 1, 0, response->cached()); });
  } catch (const std::exception& e) {
    call->Finish(Internal(std::string("unexpected exception in Embed: ") + e.what()), 1, 0, false);
  } catch (...) {
    call->Finish(Internal("unexpected non-standard exception in Embed"), 1, 0, false);
  }
  return call->reactor;
}

grpc::ServerUnaryReactor* MaskService::Segment(grpc::CallbackServerContext* context,
                                               const v1::SegmentRequest* request,
                                               v1::SegmentResponse* response) {
  std::shared_ptr<UnaryCall> call = BeginUnary("Segment", context);
  const int prompts = request->prompts_size();
  const std::string tag = request->request_tag().substr(0, 128);
  try {
    Backend backend;
    if (Status s = Admit(&backend); !s.ok()) {
      call->Finish(s, 1, prompts, false, tag);
      return call->reactor;
    }
    response->set_request_tag(request->request_tag());
    Status valid = ValidateSegmentOptions(*request, options_.limits);
    ImageTarget target;
    if (valid.ok()) {
      switch (request->image_source_case()) {
        case v1::SegmentRequest::kImage:
          valid = ValidateImage(request->image(), options_.limits, "image");
          target.image = &request->image();
          break;
        case v1::SegmentRequest::kImageId:
          valid = ValidateImageId(request->image_id(), "image_id");
          target.image_id = request->image_id();
          break;
        case v1::SegmentRequest::IMAGE_SOURCE_NOT_SET:
          valid = InvalidArgument("image_source: neither image nor image_id is set (expected exactly "
                                  "one)");
          break;
      }
    }
    if (!valid.ok()) {
      call->Finish(valid, 1, prompts, false, tag);
      return call->reactor;
    }
    StatusOr<std::vector<PromptDraft>> drafts =
        ValidatePrompts(request->prompts(), options_.limits, /*allow_empty=*/false);
    if (!drafts.ok()) {
      call->Finish(drafts.status(), 1, prompts, false, tag);
      return call->reactor;
    }
    backend.pipeline->Segment(std::move(target), *request, std::move(*drafts), response,
                              call->control, call->arrival, nullptr,
                              [call, response, prompts, tag](Status s) {
                                call->Finish(s, 1, prompts, response->cached(), tag);
                              });
  } catch (const std::exception& e) {
    call->Finish(Internal(std::string("unexpected exception in Segment: ") + e.what()), 1, prompts,
                 false, tag);
  } catch (...) {
    call->Finish(Internal("unexpected non-standard exception in Segment"), 1, prompts, false, tag);
  }
  return call->reactor;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* MaskService::SegmentStream(
    grpc::CallbackServerContext* context) {
  Backend backend;
  Status admit = Admit(&backend);
  if (!admit.ok()) {
    // A reactor that only finishes: streams refused while loading or draining.
    class Refuse final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
     public:
      Refuse(MaskService* s, const Status& st) : service_(s) { Finish(ToGrpcStatus(st)); }
      void OnDone() override {
        MaskService* s = service_;
        delete this;
        s->CallEnded();
      }

     private:
      MaskService* service_;
    };
    CallStarted();
    RecordOutcome(admit);
    return new Refuse(this, admit);
  }
  CallStarted();
  auto* s = new StreamReactor(this, context, backend);
  AddStream(s);
  bool draining;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    draining = state_ == State::kDraining;
  }
  // A drain that began between Admit and AddStream must still reach this stream. (Operations on a
  // reactor not yet returned to gRPC are queued until it is bound, so nothing runs inline here.)
  if (draining) s->Run(s->Drain());
  return s;
}

grpc::ServerUnaryReactor* MaskService::GetInfo(grpc::CallbackServerContext* context,
                                               const v1::GetInfoRequest* /*request*/,
                                               v1::GetInfoResponse* response) {
  std::shared_ptr<UnaryCall> call = BeginUnary("GetInfo", context);
  try {
    FillInfo(response);
    call->Finish(Status::Ok(), 0, 0, false);
  } catch (const std::exception& e) {
    call->Finish(Internal(std::string("unexpected exception in GetInfo: ") + e.what()), 0, 0, false);
  } catch (...) {
    call->Finish(Internal("unexpected non-standard exception in GetInfo"), 0, 0, false);
  }
  return call->reactor;
}

namespace {

void FillTier(const CacheTierCounts& c, v1::CacheTierStats* t) {
  t->set_entries(t->entries() + c.entries);
  t->set_bytes(t->bytes() + c.bytes);
  t->set_capacity_bytes(t->capacity_bytes() + c.capacity_bytes);
}

void AddCache(const DeviceWorker& w, v1::CacheStats* c) {
  const CacheCounters k = w.cache().counters();
  const ResultStoreCounters r = w.results().counters();
  FillTier(k.device, c->mutable_device());
  FillTier(k.host, c->mutable_host());
  c->set_hits(c->hits() + k.hits);
  c->set_misses(c->misses() + k.misses);
  c->set_evictions(c->evictions() + k.evictions);
  c->set_demotions(c->demotions() + k.demotions);
  c->set_single_flight_joins(c->single_flight_joins() + k.single_flight_joins);
  c->set_results(c->results() + r.entries);
  c->set_result_bytes(c->result_bytes() + r.bytes);
}

void AddQueue(const QueueCounters& q, v1::QueueStats* s) {
  const uint64_t batches = s->batches() + q.batches;
  const uint64_t items = s->items() + q.items;
  s->set_depth(s->depth() + q.depth);
  s->set_capacity(s->capacity() + q.capacity);
  s->set_batches(batches);
  s->set_items(items);
  s->set_rejected(s->rejected() + q.rejected);
  s->set_dropped(s->dropped() + q.dropped);
  s->set_mean_batch_size(batches ? static_cast<double>(items) / static_cast<double>(batches) : 0.0);
}

void AddMemory(const DeviceMemoryStats& m, v1::GpuMemory* g) {
  g->set_allocated_bytes(g->allocated_bytes() + m.allocated);
  g->set_peak_allocated_bytes(g->peak_allocated_bytes() + m.peak_allocated);
  g->set_reserved_bytes(g->reserved_bytes() + m.reserved);
  g->set_total_bytes(g->total_bytes() + m.total);
}

void SetStage(const StageSummary& s, v1::StageTiming* t) {
  t->set_stage(s.stage);
  t->set_count(s.count);
  t->set_mean_us(s.mean_us);
  t->set_p50_us(s.p50_us);
  t->set_p99_us(s.p99_us);
}

}  // namespace

void MaskService::FillInfo(v1::GetInfoResponse* info) const {
  Backend backend;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    backend = backend_;
  }
  info->set_version(options_.version);
  info->set_uptime_seconds(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::seconds>(
                                                     std::chrono::steady_clock::now() - started_)
                                                     .count()));
  v1::Limits* l = info->mutable_limits();
  l->set_max_image_bytes(options_.limits.max_image_bytes);
  l->set_max_image_pixels(options_.limits.max_image_pixels);
  l->set_max_prompts_per_request(options_.limits.max_prompts_per_request);
  l->set_max_points_per_prompt(options_.limits.max_points_per_prompt);
  {
    std::lock_guard<std::mutex> lock(counters_mu_);
    info->set_calls(calls_);
    for (const auto& [name, n] : calls_by_status_) (*info->mutable_calls_by_status())[name] = n;
  }
  if (backend.workers.empty()) return;

  const Engine& first = backend.workers.front()->engine();
  const ModelDescription& d = first.description();
  v1::ModelInfo* m = info->mutable_model();
  m->set_arch(d.arch);
  m->set_checkpoint(options_.checkpoint_label);
  m->set_demo(d.demo);
  m->set_identity(d.identity);
  m->set_encoder_embed_dim(static_cast<uint32_t>(d.embed_dim));
  m->set_encoder_depth(static_cast<uint32_t>(d.depth));
  m->set_encoder_num_heads(static_cast<uint32_t>(d.num_heads));
  for (int g : d.global_attn_indexes) m->add_encoder_global_attn_indexes(static_cast<uint32_t>(g));
  m->set_image_size(static_cast<uint32_t>(d.image_size));
  m->set_parameter_count(d.parameter_count);
  info->set_precision(PrecisionName(first.options().precision));
  for (const auto& o : first.optimisations()) info->add_optimisations(o);

  std::vector<std::vector<uint64_t>> merged(kNumStages);
  std::vector<uint64_t> merged_count(kNumStages, 0);
  for (const DeviceWorker* w : backend.workers) {
    v1::DeviceInfo* dev = info->add_devices();
    dev->set_device(w->label());
    dev->set_name(w->engine().device_name());
    AddCache(*w, dev->mutable_cache());
    AddCache(*w, info->mutable_cache());
    const QueueCounters enc = w->encoder().counters();
    const QueueCounters dec = w->decoder().counters();
    AddQueue(enc, dev->mutable_encoder_queue());
    AddQueue(enc, info->mutable_encoder_queue());
    AddQueue(dec, dev->mutable_decoder_queue());
    AddQueue(dec, info->mutable_decoder_queue());
    const DeviceMemoryStats mem = w->engine().memory();
    AddMemory(mem, dev->mutable_memory());
    AddMemory(mem, info->mutable_memory());
    for (int i = 0; i < kNumStages; ++i) {
      const StageWindow& window = w->stages()[static_cast<Stage>(i)];
      SetStage(window.Summary(), dev->add_stages());
      std::vector<uint64_t> s = window.Samples();
      merged[i].insert(merged[i].end(), s.begin(), s.end());
      merged_count[i] += window.Summary().count;
    }
  }
  for (int i = 0; i < kNumStages; ++i) {
    SetStage(StageWindow::Summarize(StageName(static_cast<Stage>(i)), merged_count[i],
                                    std::move(merged[i])),
             info->add_stages());
  }
}

}  // namespace maskd::server
