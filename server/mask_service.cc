#include "server/mask_service.h"

#include "server/security.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "server/grpc_status.h"
#include "server/logging.h"
#include "server/stream_reactor.h"

namespace maskd::server {

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
  void Finish(const Status& given, int images, int prompts, bool cached, const std::string& tag = "") {
    if (finished.exchange(true)) return;
    // Work that completed after the client left or its deadline passed did not reach anyone: the
    // log, the counters and the (unread) reply say so instead of OK.
    Status status = given;
    if (status.ok()) {
      if (Status alive = control->Check(); !alive.ok()) status = alive;
    }
    control->MarkFinished();
    service->RecordCall(method, status, arrival);
    if (service->options_.access_log) {
      LogRequest(spdlog::level::info, control->request_id(),
                 "access method={} peer={} status={} latency_ms={:.3f} images={} prompts={} "
                 "cached={}{}{}",
                 method, LogSafe(peer), StatusCodeName(status.code()), Millis(arrival), images,
                 prompts, cached ? "true" : "false", tag.empty() ? "" : " tag=", LogSafe(tag));
    }
    if (!status.ok() && status.code() == StatusCode::kInternal) {
      LogRequest(spdlog::level::err, control->request_id(), "{} failed: {}", method,
                 LogSafe(status.message()));
    } else if (!status.ok()) {
      LogRequest(spdlog::level::debug, control->request_id(), "{} failed: {}", method,
                 LogSafe(status.ToString()));
    }
    MaskService* s = service;
    reactor->Finish(ToGrpcStatus(status));
    s->CallEnded();
  }
};

namespace {

// 4 MiB: the default maximum receive message size of gRPC's clients (C++, Python, Go, Java) and of
// grpcurl. maskd's own clients raise it; a third-party client that did not fails with
// RESOURCE_EXHAUSTED on its side, where the server's operator cannot see why.
constexpr size_t kDefaultClientReceiveLimit = size_t{4} << 20;

void WarnIfOverDefaultReceiveLimit(const CallControl& control,
                                   const google::protobuf::Message& response) {
  if (!spdlog::should_log(spdlog::level::info)) return;
  server::WarnIfOverDefaultReceiveLimit(control.request_id(), response.ByteSizeLong());
}

}  // namespace

void WarnIfOverDefaultReceiveLimit(const std::string& request_id, size_t bytes) {
  if (bytes <= kDefaultClientReceiveLimit) return;
  LogRequest(spdlog::level::info, request_id,
             "response of {} bytes is over 4 MiB, gRPC clients' default receive limit: a client "
             "that did not raise it (grpc.max_receive_message_length, grpcurl -max-msg-sz) fails "
             "with RESOURCE_EXHAUSTED",
             bytes);
}

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
  std::vector<std::pair<StreamSession*, StreamSession::Actions>> drains;
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    for (StreamSession* s : streams_) drains.emplace_back(s, s->Drain());
  }
  // Outside streams_mu_: a finish may run OnDone (RemoveStream) inline. A stream with no action may
  // be gone already and is not touched.
  for (auto& [s, a] : drains) {
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

void MaskService::RecordUnparsable() {
  std::lock_guard<std::mutex> lock(counters_mu_);
  ++calls_;
  ++calls_by_status_[StatusCodeName(StatusCode::kInvalidArgument)];
}

void MaskService::RecordCall(const char* method, const Status& status, Clock::time_point arrival) {
  RecordOutcome(status);
  if (options_.metrics != nullptr) {
    options_.metrics->ObserveCall(method, status.code(),
                                  static_cast<double>(MicrosSince(arrival)) * 1e-6);
  }
}

void MaskService::AddStream(StreamSession* s) {
  std::lock_guard<std::mutex> lock(streams_mu_);
  streams_.insert(s);
}

void MaskService::RemoveStream(StreamSession* s) {
  std::lock_guard<std::mutex> lock(streams_mu_);
  streams_.erase(s);
}

grpc::ServerUnaryReactor* MaskService::RefuseUnauthenticated(const char* method,
                                                             grpc::CallbackServerContext* context) {
  if (!options_.require_token || CallAuthorized(*context)) return nullptr;
  if (options_.access_log) {
    spdlog::info("[-] access method={} peer={} status=UNAUTHENTICATED", method, LogSafe(context->peer()));
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, ""));
  return reactor;
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
  // The id every log line of this call carries goes back to the client (before anything is sent,
  // so errors carry it too): an operator and a user can then talk about the same request.
  const std::string request_id = ClientRequestId(context);
  context->AddInitialMetadata("x-request-id", request_id);
  call->control = std::make_shared<CallControl>(request_id,
                                                SteadyDeadline(context->deadline()),
                                                [context] { return context->IsCancelled(); },
                                                CallScope(*context, options_.scoped_cache));
  return call;
}

grpc::ServerUnaryReactor* MaskService::Embed(grpc::CallbackServerContext* context,
                                             const v1::EmbedRequest* request,
                                             v1::EmbedResponse* response) {
  if (grpc::ServerUnaryReactor* refused = RefuseUnauthenticated("Embed", context)) return refused;
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
    StatusOr<std::optional<Precision>> dtype =
        EmbeddingDtypeFrom(request->return_embedding(), "return_embedding");
    if (!dtype.ok()) {
      call->Finish(dtype.status(), 1, 0, false);
      return call->reactor;
    }
    auto out = std::make_shared<ImageOutcome>();
    backend.pipeline->Embed(
        ImageInputFrom(request->image()), call->control, call->arrival, out.get(),
        [call, out, response](Status s) {
          ToProto(*out, response);
          // An fp32 embedding alone is 4 MiB: tell the operator when a client may refuse it.
          if (s.ok() && out->embedding) WarnIfOverDefaultReceiveLimit(*call->control, *response);
          call->Finish(s, 1, 0, out->cached);
        },
        *dtype);
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
  if (grpc::ServerUnaryReactor* refused = RefuseUnauthenticated("Segment", context)) return refused;
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
    ImageInput target;
    if (valid.ok()) {
      switch (request->image_source_case()) {
        case v1::SegmentRequest::kImage:
          valid = ValidateImage(request->image(), options_.limits, "image");
          target = ImageInputFrom(request->image());
          break;
        case v1::SegmentRequest::kImageId:
          valid = ValidateImageId(request->image_id(), "image_id");
          target = ImageInputFromId(request->image_id());
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
    auto out = std::make_shared<SegmentOutcome>();
    backend.pipeline->Segment(std::move(target), std::move(*drafts),
                              OutputSpecFrom(*request), call->control,
                              call->arrival, out.get(), nullptr,
                              [this, call, out, response, prompts, tag](Status s) {
                                MoveToProto(*out, s, response);
                                if (s.ok() && options_.startup) options_.startup->Mark(Milestone::kFirstMask);
                                WarnIfOverDefaultReceiveLimit(*call->control, *response);
                                call->Finish(s, 1, prompts, out->image.cached, tag);
                              });
  } catch (const std::exception& e) {
    call->Finish(Internal(std::string("unexpected exception in Segment: ") + e.what()), 1, prompts,
                 false, tag);
  } catch (...) {
    call->Finish(Internal("unexpected non-standard exception in Segment"), 1, prompts, false, tag);
  }
  return call->reactor;
}

grpc::ServerUnaryReactor* MaskService::GenerateMasks(grpc::CallbackServerContext* context,
                                                     const v1::GenerateMasksRequest* request,
                                                     v1::GenerateMasksResponse* response) {
  if (grpc::ServerUnaryReactor* refused = RefuseUnauthenticated("GenerateMasks", context)) return refused;
  std::shared_ptr<UnaryCall> call = BeginUnary("GenerateMasks", context);
  const std::string tag = request->request_tag().substr(0, 128);
  try {
    Backend backend;
    if (Status s = Admit(&backend); !s.ok()) {
      call->Finish(s, 1, 0, false, tag);
      return call->reactor;
    }
    response->set_request_tag(request->request_tag());
    StatusOr<GenerationSpec> spec =
        ValidateGenerateRequest(*request, options_.limits, options_.generation_limits);
    if (!spec.ok()) {
      call->Finish(spec.status(), 1, 0, false, tag);
      return call->reactor;
    }
    Status valid;
    ImageInput target;
    switch (request->image_source_case()) {
      case v1::GenerateMasksRequest::kImage:
        valid = ValidateImage(request->image(), options_.limits, "image");
        target = ImageInputFrom(request->image());
        break;
      case v1::GenerateMasksRequest::kImageId:
        valid = ValidateImageId(request->image_id(), "image_id");
        target = ImageInputFromId(request->image_id());
        // Checked before any lookup: crops are encoded from pixels the cache does not keep.
        if (valid.ok() && spec->params.crop_n_layers > 0) {
          valid = FailedPrecondition("params.crop_n_layers = " + std::to_string(spec->params.crop_n_layers) +
                                     " needs the image's pixels (each crop is encoded): send image, "
                                     "not image_id");
        }
        break;
      case v1::GenerateMasksRequest::IMAGE_SOURCE_NOT_SET:
        valid = InvalidArgument("image_source: neither image nor image_id is set (expected exactly one)");
        break;
    }
    if (!valid.ok()) {
      call->Finish(valid, 1, 0, false, tag);
      return call->reactor;
    }
    auto out = std::make_shared<GenerateOutcome>();
    backend.pipeline->Generate(std::move(target), std::move(*spec), call->control, call->arrival,
                               out.get(), [call, out, response, tag](Status s) {
                                 MoveToProto(*out, s, response);
                                 WarnIfOverDefaultReceiveLimit(*call->control, *response);
                                 // The access log's "prompts" of a generation: its grid points.
                                 call->Finish(s, 1, out->stats.points, out->image.cached, tag);
                               });
  } catch (const std::exception& e) {
    call->Finish(Internal(std::string("unexpected exception in GenerateMasks: ") + e.what()), 1, 0,
                 false, tag);
  } catch (...) {
    call->Finish(Internal("unexpected non-standard exception in GenerateMasks"), 1, 0, false, tag);
  }
  return call->reactor;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* MaskService::SegmentStream(
    grpc::CallbackServerContext* context) {
  if (options_.require_token && !CallAuthorized(*context)) {
    class Unauthenticated final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
     public:
      Unauthenticated() { Finish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "")); }
      void OnDone() override { delete this; }
    };
    if (options_.access_log) {
      spdlog::info("[-] access method=SegmentStream peer={} status=UNAUTHENTICATED", LogSafe(context->peer()));
    }
    return new Unauthenticated();
  }
  return new StreamReactor(this, context);
}

StatusOr<std::unique_ptr<StreamSession>> MaskService::OpenStream(StreamTransport* transport,
                                                                 StreamCallInfo call) {
  CallStarted();
  Backend backend;
  Status admit = Admit(&backend);
  if (!admit.ok()) {
    RecordCall("SegmentStream", admit, Clock::now());
    return admit;
  }
  auto s = std::make_unique<StreamSession>(this, transport, std::move(call), backend);
  // The first read before the stream is visible to BeginDrain: a drain that ended it first would
  // make this read start after the end. (gRPC queues the operations of a reactor not yet returned
  // to it, and a test transport its completions until bound, so nothing runs inline here.)
  s->Start();
  AddStream(s.get());
  bool draining;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    draining = state_ == State::kDraining;
  }
  // A drain that began between Admit and AddStream must still reach this stream.
  if (draining) s->Run(s->Drain());
  return s;
}

grpc::ServerUnaryReactor* MaskService::GetInfo(grpc::CallbackServerContext* context,
                                               const v1::GetInfoRequest* /*request*/,
                                               v1::GetInfoResponse* response) {
  if (grpc::ServerUnaryReactor* refused = RefuseUnauthenticated("GetInfo", context)) return refused;
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
  s->set_oom_splits(s->oom_splits() + q.oom_splits);
  s->set_oom_failures(s->oom_failures() + q.oom_failures);
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
  if (options_.startup) options_.startup->Fill(info->mutable_startup());
  info->set_uptime_seconds(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::seconds>(
                                                     std::chrono::steady_clock::now() - started_)
                                                     .count()));
  v1::Limits* l = info->mutable_limits();
  l->set_max_image_bytes(options_.limits.max_image_bytes);
  l->set_max_image_pixels(options_.limits.max_image_pixels);
  l->set_max_prompts_per_request(options_.limits.max_prompts_per_request);
  l->set_max_points_per_prompt(options_.limits.max_points_per_prompt);
  ToProto(options_.generation_limits, l->mutable_generation());
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
