#include "server/stream_session.h"

#include <spdlog/spdlog.h>

#include "server/grpc_status.h"
#include "server/logging.h"

namespace maskd::server {

StreamSession::StreamSession(MaskService* service, StreamTransport* transport, StreamCallInfo call,
                             Backend backend)
    : service_(service),
      transport_(transport),
      backend_(backend),
      rid_(std::move(call.request_id)),
      peer_(std::move(call.peer)),
      arrival_(Clock::now()),
      deadline_(call.deadline),
      cancelled_flag_(std::make_shared<std::atomic<bool>>(false)),
      scope_(std::move(call.scope)) {
  if (service_->options_.access_log) {
    LogRequest(spdlog::level::debug, rid_, "SegmentStream opened by {}", LogSafe(peer_));
  }
}

void StreamSession::Start() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    reading_ = true;
  }
  transport_->Read(&read_buf_);
}

void StreamSession::OnReadDone(bool ok) {
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
  // Counted like a message answered INVALID_ARGUMENT (GetInfo.calls_by_status).
  if (ok && !parsed) service_->RecordOutcome(InvalidArgument("SegmentStream message did not parse"));
  // The accepted message keeps the stream open (it is pending), so the next read can start first.
  Run(a);
  if (m != nullptr) Process(m);
}

void StreamSession::OnWriteDone(bool ok) {
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

void StreamSession::OnCancel() {
  cancelled_flag_->store(true);
  Actions a;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    ScheduleLocked(&a);
  }
  Run(a);
}

void StreamSession::Close(std::unique_ptr<StreamSession> session) {
  std::optional<StatusCode> code;
  uint64_t messages;
  {
    std::lock_guard<std::mutex> lock(session->mu_);
    code = session->final_code_;
    messages = session->messages_;
  }
  // A client that cancelled never saw the status the stream ended with: when its failed read
  // reached the session before OnCancel (gRPC does not order them), that was OK, as for a
  // half-close. OnCancel always comes before the end, so the log and metrics can say what happened.
  if (code && session->cancelled_flag_->load()) code = StatusCode::kCancelled;
  MaskService* s = session->service_;
  if (code && s->options_.metrics != nullptr) {
    s->options_.metrics->ObserveCall("SegmentStream", *code,
                                     static_cast<double>(MicrosSince(session->arrival_)) * 1e-6);
  }
  if (s->options_.access_log) {
    const char* status = code ? StatusCodeName(*code) : "UNKNOWN";
    LogRequest(spdlog::level::info, session->rid_,
               "access method=SegmentStream peer={} status={} latency_ms={:.3f} messages={}",
               LogSafe(session->peer_), status, Millis(session->arrival_), messages);
  }
  s->RemoveStream(session.get());
  session.reset();
  s->CallEnded();
}

void StreamSession::Run(const Actions& a) {
  if (a.finish) {
    transport_->End(a.finish_status);
    return;  // Close may delete this at any moment now
  }
  if (a.empty()) return;
  if (a.write) transport_->Write(a.write);
  if (a.read) transport_->Read(&read_buf_);
  Actions next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    starting_ -= (a.write ? 1 : 0) + (a.read ? 1 : 0);
    ScheduleLocked(&next);
  }
  Run(next);
}

StreamSession::Actions StreamSession::Drain() {
  Actions a;
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
  ScheduleLocked(&a);
  return a;
}

StreamSession::Message* StreamSession::AcceptLocked(v1::SegmentRequest request) {
  auto m = std::make_unique<Message>();
  m->seq = next_seq_++;
  m->rid = rid_ + "." + std::to_string(m->seq);
  m->arrival = Clock::now();
  m->request = std::move(request);
  auto flag = cancelled_flag_;
  m->control = std::make_shared<CallControl>(m->rid, deadline_, [flag] { return flag->load(); }, scope_);
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

void StreamSession::ScheduleLocked(Actions* a) {
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
      final_code_ = StatusCode::kCancelled;
    } else if (malformed_message_ >= 0) {
      a->finish_status = ToGrpcStatus(InvalidArgument(
          "SegmentStream message " + std::to_string(malformed_message_) +
          " (counting from 0) is not a valid maskd.v1.SegmentRequest (expected a serialized "
          "SegmentRequest): the earlier messages were answered, it and any later ones were not "
          "read"));
      final_code_ = StatusCode::kInvalidArgument;
    } else if (draining_ && !reads_done_) {
      a->finish_status = ToGrpcStatus(
          Unavailable("the server is shutting down: reconnect to another server or retry later"));
      final_code_ = StatusCode::kUnavailable;
    } else {
      a->finish_status = grpc::Status::OK;
      final_code_ = StatusCode::kOk;
    }
  }
}

void StreamSession::Process(Message* m) {
  try {
    ProcessImpl(m);
  } catch (const std::exception& e) {
    Complete(m, Internal(std::string("unexpected exception in SegmentStream: ") + e.what()));
  } catch (...) {
    Complete(m, Internal("unexpected non-standard exception in SegmentStream"));
  }
}

void StreamSession::ProcessImpl(Message* m) {
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

  ImageInput target;
  switch (m->request.image_source_case()) {
    case v1::SegmentRequest::kImage:
      if (Status s = ValidateImage(m->request.image(), limits, "image"); !s.ok()) return fail(s);
      target = ImageInputFrom(m->request.image());
      break;
    case v1::SegmentRequest::kImageId:
      if (Status s = ValidateImageId(m->request.image_id(), "image_id"); !s.ok()) return fail(s);
      target = ImageInputFromId(m->request.image_id());
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
        Dispatch(m, ImageInputFromId(*id), std::move(*drafts_ptr));
      });
      return;
    }
  }
  Dispatch(m, std::move(target), std::move(*drafts));
}

void StreamSession::Dispatch(Message* m, ImageInput target, std::vector<PromptDraft> drafts) {
  Pipeline::OnImage on_image;
  if (m->names_image && target.has_bytes()) {
    std::shared_ptr<CurrentImage> cur = m->image;
    on_image = [cur](StatusOr<std::string> id) { cur->Resolve(std::move(id)); };
  }
  m->dispatched = true;
  backend_.pipeline->Segment(std::move(target), std::move(drafts),
                             OutputSpecFrom(m->request), m->control, m->arrival,
                             &m->outcome, std::move(on_image), [this, m](Status s) { Complete(m, s); });
}

void StreamSession::Complete(Message* m, const Status& status) {
  if (m->dispatched) MoveToProto(m->outcome, status, &m->response);
  if (!status.ok()) {
    m->response.clear_results();
    v1::StreamError* e = m->response.mutable_error();
    const grpc::Status g = ToGrpcStatus(status);
    e->set_code(static_cast<int32_t>(g.error_code()));
    e->set_message(g.error_message());
  }
  service_->RecordCall("SegmentStreamMessage", status, m->arrival);
  if (service_->options_.access_log) {
    LogRequest(spdlog::level::info, m->rid,
               "access method=SegmentStream.message peer={} status={} latency_ms={:.3f} "
               "images={} prompts={} cached={}",
               LogSafe(peer_), StatusCodeName(status.code()), Millis(m->arrival),
               m->names_image ? 1 : 0, m->request.prompts_size(),
               m->response.cached() ? "true" : "false");
  }
  if (!status.ok() && status.code() == StatusCode::kInternal) {
    LogRequest(spdlog::level::err, m->rid, "SegmentStream message failed: {}",
               LogSafe(status.message()));
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
  WarnIfOverDefaultReceiveLimit(m->rid, m->wire.Length());
  Actions a;
  {
    std::lock_guard<std::mutex> lock(mu_);
    m->ready = true;
    ScheduleLocked(&a);
  }
  Run(a);
}

}  // namespace maskd::server
