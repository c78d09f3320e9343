#include "server/server.h"

#include <array>
#include <algorithm>
#include <climits>
#include <thread>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <spdlog/spdlog.h>

#ifdef MASKD_HEALTH_PB_H
#include MASKD_HEALTH_PB_H  // grpc.health.v1's messages and service descriptor (proto/CMakeLists.txt)
#endif
#include "server/logging.h"
#include "server/parse_error_interceptor.h"
#include "server/security.h"

namespace maskd::server {
namespace {

// --reflection false: the reflection plugin is registered process-wide (it must be, before any
// builder exists), so it is taken out of this one builder's plugin list instead.
class WithoutReflection final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    const std::string name = grpc::reflection::ProtoServerReflectionPlugin().name();
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [&](const auto& p) { return p->name() == name; }),
                   plugins->end());
  }
};

}  // namespace

MaskServer::MaskServer(ServerConfig config, EngineFactory factory, int cuda_device_count)
    : config_(std::move(config)), factory_(std::move(factory)), cuda_device_count_(cuda_device_count) {}

MaskServer::~MaskServer() { Shutdown(); }

Status MaskServer::Start() {
  MASKD_RETURN_IF_ERROR(StartListening());
  return LoadAndServe();
}

void MaskServer::SetHealth(bool serving) {
  if (!grpc_server_) return;
  grpc::HealthCheckServiceInterface* health = grpc_server_->GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus("", serving);
  health->SetServingStatus(kServiceName, serving);
}

Status MaskServer::StartListening() {
  MASKD_RETURN_IF_ERROR(ValidateConfig(config_));
  StatusOr<std::pair<std::string, int>> listen = ParseListen(config_.listen);
  if (!listen.ok()) return listen.status();
  StatusOr<CheckpointChoice> checkpoint = ResolveCheckpoint(config_);
  if (!checkpoint.ok()) return checkpoint.status();
  checkpoint_ = *checkpoint;

  ServiceOptions so;
  so.limits = config_.limits();
  so.generation_limits = config_.generation_limits();
  so.access_log = config_.access_log;
  so.version = std::string(MASKD_VERSION) + " (" + MASKD_GIT_REVISION + ")";
  so.checkpoint_label = checkpoint_.demo() ? "builtin-demo" : checkpoint_.path;
  so.metrics = metrics_.get();
  so.require_token = !config_.auth_tokens.empty();
  so.startup = startup_.get();
  so.scoped_cache = so.require_token && !config_.auth_shared_cache;
  service_ = std::make_unique<MaskService>(so);
  MaskService* service = service_.get();
  metrics_->SetInfoSource([service](v1::GetInfoResponse* info) { service->FillInfo(info); });

  std::shared_ptr<const TokenSet> tokens;
  if (!config_.auth_tokens.empty()) {
    StatusOr<std::shared_ptr<const TokenSet>> t = TokenSet::Load(config_.auth_tokens);
    if (!t.ok()) return t.status();
    tokens = *t;
  }
  StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds = MakeServerCredentials(config_, tokens);
  if (!creds.ok()) return creds.status();

  grpc::EnableDefaultHealthCheckService(true);
  // Reflection describes what the generated descriptor pool holds; gRPC's health service does not
  // add its proto there. Naming a health message pulls our compiled copy out of the static
  // maskd_proto (nothing else references it), and with it the proto's registration.
#ifdef MASKD_HEALTH_PB_H
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
#endif
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (!config_.reflection) builder.SetOption(std::make_unique<WithoutReflection>());
  builder.AddListeningPort(config_.listen, *creds, &port_);
  // gRPC sets SO_REUSEPORT by default, so a second maskd on the same port would start "fine" and
  // silently take a share of the first one's connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(
      MakeParseErrorInterceptorFactory([service = service_.get()] { service->RecordUnparsable(); }));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  builder.RegisterService(service_.get());
  // The largest request: a raw image at the pixel limit (or an encoded one at the byte limit) plus
  // client logits (kLowResSide^2 floats) for every prompt.
  const uint64_t image = std::max<uint64_t>(config_.max_image_bytes, config_.max_image_pixels * 3);
  const uint64_t prompts = uint64_t{config_.max_prompts_per_request} * (kLowResSide * kLowResSide * 4 + 4096);
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(std::min<uint64_t>(INT_MAX, image + prompts + (uint64_t{1} << 20))));
  builder.SetMaxSendMessageSize(INT_MAX);
  grpc_server_ = builder.BuildAndStart();
  if (!grpc_server_ || port_ == 0) {
    grpc_server_.reset();
    return Unavailable("--listen = \"" + config_.listen +
                       "\" could not be bound: address already in use (another maskd or program "
                       "listens there), or not an address of this machine (expected a free port)");
  }
  SetHealth(false);
  startup_->Mark(Milestone::kListening);
  address_ = listen->first + ":" + std::to_string(port_);
  spdlog::info("listening on {} ({}{}{}, reflection {})", address_,
               config_.tls_cert.empty() ? "plaintext" : "TLS",
               config_.tls_client_ca.empty() ? "" : ", client certificates required",
               tokens ? ", bearer tokens required (" + std::to_string(tokens->size()) + " accepted)" : "",
               config_.reflection ? "on" : "off");
  if (config_.tls_cert.empty() && !tokens && !IsLoopbackHost(listen->first)) {
    // The default stays 0.0.0.0 (existing deployments, containers and the README's demo reach it
    // from outside), so the exposure is said loudly instead (README, Security).
    spdlog::warn("************************************************************************************");
    spdlog::warn("maskd serves {} in PLAINTEXT WITHOUT AUTHENTICATION on a non-loopback address:",
                 address_);
    spdlog::warn("anyone who can reach this port can use the model and read other clients' results.");
    spdlog::warn("Use --listen 127.0.0.1:PORT, or --tls-cert/--tls-key (and --auth-tokens or "
                 "--tls-client-ca).");
    spdlog::warn("************************************************************************************");
  }
  if (!config_.http_listen.empty()) {
    StatusOr<std::pair<std::string, int>> http = ParseListen(config_.http_listen, "--http-listen");
    if (!http.ok()) return http.status();
    HttpFrontOptions ho;
    ho.host = http->first;
    ho.port = http->second;
    // JSON carries bytes in base64 (4/3) and logits as decimal text (up to ~16 characters a float).
    ho.max_body_bytes = image / 3 * 4 + 4 + prompts * 4 + (uint64_t{1} << 20);
    // The in-process channel skips the gRPC port's TLS and token check, so the front checks the
    // same tokens itself.
    // It tells the service the caller's scope (kInProcessScopeMetadata: trusted on the in-process
    // channel only, and set here from the token, never from a client's header).
    if (tokens) {
      const bool scoped = so.scoped_cache;
      ho.authorize = [tokens, scoped](std::string_view authorization) -> std::optional<std::string> {
        std::optional<std::string> scope = tokens->ScopeOfAuthorization(authorization);
        if (scope && !scoped) scope = std::string();
        return scope;
      };
    }
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    http_front_ = std::make_unique<HttpFront>(ho, grpc_server_->InProcessChannel(args));
    MASKD_RETURN_IF_ERROR(http_front_->Start());
    spdlog::info("HTTP front listening on {}:{} (web page at http://{}:{}/)", ho.host,
                 http_front_->port(), ho.host, http_front_->port());
  }
  // Up while the model loads, so that a scrape can already see the server (uptime, no model yet).
  if (!config_.metrics_listen.empty()) {
    StatusOr<std::unique_ptr<MetricsListener>> m = MetricsListener::Start(config_.metrics_listen, *metrics_);
    if (!m.ok()) return m.status();
    metrics_listener_ = std::move(*m);
    StatusOr<std::pair<std::string, int>> host = ParseListen(config_.metrics_listen, "--metrics-listen");
    spdlog::info("metrics on {}:{} (GET /metrics)", host.ok() ? host->first : config_.metrics_listen,
                 metrics_listener_->port());
  }
  return Status::Ok();
}

Status MaskServer::LoadAndServe() {
  {
    std::lock_guard<std::mutex> lock(shutdown_mu_);
    if (shutting_down_) return Unavailable("shut down before loading");
    loading_ = true;
  }
  Status s = Load();
  std::lock_guard<std::mutex> lock(shutdown_mu_);
  loading_ = false;
  if (!s.ok()) return s;
  if (shutting_down_) return Unavailable("shut down while loading");
  service_->SetBackend(Backend{pipeline_.get(), workers()});
  SetHealth(true);
  startup_->Mark(Milestone::kServing);
  spdlog::info("serving {} on {} with {} device(s)", kServiceName, address_, workers_.size());
  return Status::Ok();
}

Status MaskServer::Load() {
  StatusOr<std::vector<DeviceSpec>> devices = ParseDevices(config_.device, cuda_device_count_);
  if (!devices.ok()) return devices.status();

  if (checkpoint_.demo()) {
    spdlog::warn("************************************************************************************");
    spdlog::warn("maskd is serving the BUILT-IN DEMO MODEL: random weights, its masks are MEANINGLESS.");
    spdlog::warn("Get vit_b, vit_l or vit_h from "
                 "https://github.com/facebookresearch/segment-anything#model-checkpoints");
    spdlog::warn("and pass --checkpoint PATH, set MASKD_CHECKPOINT, or put the file in {}/",
                 config_.models_dir);
    spdlog::warn("************************************************************************************");
  } else {
    spdlog::info("model: {} (from {})", checkpoint_.path, checkpoint_.source);
  }

  // Engines load in parallel: a multi-GPU server should not take N times as long to start.
  std::vector<StatusOr<std::unique_ptr<Engine>>> engines;
  for (size_t i = 0; i < devices->size(); ++i) engines.emplace_back(Internal("engine not created"));
  // Per device, when it reached each engine milestone (StartupPhase order); the server's milestone
  // is the last device's. An engine that reports none (the tests' fake) reaches all three when its
  // factory returns.
  using PhaseTimes = std::array<StartupTimes::Clock::time_point, 3>;
  std::vector<PhaseTimes> phases(devices->size());
  {
    std::vector<std::thread> loaders;
    for (size_t i = 0; i < devices->size(); ++i) {
      loaders.emplace_back([&, i] {
        const DeviceSpec& d = (*devices)[i];
        StatusOr<EngineOptions> options = MakeEngineOptions(config_, d, checkpoint_);
        if (!options.ok()) {
          engines[i] = options.status();
          return;
        }
        options->log = EngineLogger(d.label);
        options->on_startup_phase = [&phases, i](StartupPhase p) {
          phases[i][static_cast<size_t>(p)] = StartupTimes::Clock::now();
        };
        spdlog::info("loading the engine for {} ({} {})", d.label, PrecisionName(options->precision),
                     d.engine_device);
        try {
          engines[i] = factory_(*options);
          const auto done = StartupTimes::Clock::now();
          for (auto& t : phases[i]) {
            if (t == StartupTimes::Clock::time_point{}) t = done;
          }
        } catch (const std::exception& e) {
          engines[i] = Internal("creating the engine for " + d.label + " threw: " + e.what());
        }
      });
    }
    for (auto& t : loaders) t.join();
  }
  bool all_loaded = true;
  for (const auto& e : engines) all_loaded = all_loaded && e.ok();
  if (all_loaded) {
    for (size_t p = 0; p < 3; ++p) {
      StartupTimes::Clock::time_point last{};
      for (const PhaseTimes& t : phases) last = std::max(last, t[p]);
      startup_->Mark(static_cast<Milestone>(static_cast<int>(Milestone::kCheckpointRead) + static_cast<int>(p)),
                     last);
    }
  }
  for (size_t i = 0; i < engines.size(); ++i) {
    if (!engines[i].ok()) {
      return Status(engines[i].status().code(), "engine for " + (*devices)[i].label + ": " +
                                                    engines[i].status().message());
    }
  }
  const std::string identity = (*engines[0])->description().identity;
  for (size_t i = 1; i < engines.size(); ++i) {
    if ((*engines[i])->description().identity != identity) {
      return FailedPrecondition("engines disagree on the model identity (" + (*devices)[0].label +
                                ": " + identity + ", " + (*devices)[i].label + ": " +
                                (*engines[i])->description().identity +
                                "); image ids would differ between devices");
    }
  }

  WorkerOptions wo;
  wo.encoder.max_batch_weight = static_cast<size_t>(config_.encoder_max_batch);
  wo.encoder.max_queue_delay = std::chrono::microseconds(config_.encoder_queue_delay_us);
  wo.encoder.capacity_weight = static_cast<size_t>(config_.encoder_queue_capacity);
  wo.decoder.max_batch_weight = static_cast<size_t>(config_.decoder_max_prompts);
  wo.decoder.max_group_weight = static_cast<size_t>(config_.decoder_request_prompts);
  wo.decoder.max_queue_delay = std::chrono::microseconds(config_.decoder_queue_delay_us);
  wo.decoder.launch_when_idle = config_.decoder_launch_when_idle;
  wo.decoder.capacity_weight = static_cast<size_t>(config_.decoder_queue_capacity);
  wo.encoder.spin = wo.decoder.spin = std::chrono::microseconds(config_.spin_wait_us);
  wo.cache_device_bytes = config_.cache_device_bytes;
  wo.cache_host_bytes = config_.cache_host_bytes;
  wo.result_store_bytes = config_.result_store_bytes;
  wo.metrics = metrics_.get();
  wo.gpu_turns = config_.gpu_turns;
  std::vector<DeviceWorker*> raw;
  for (size_t i = 0; i < engines.size(); ++i) {
    const Engine& e = **engines[i];
    spdlog::info("device {}: {} ({}), {} {}, encoder batch <= {}, optimisations: {}",
                 (*devices)[i].label, e.device(), e.device_name(), e.description().arch,
                 PrecisionName(e.options().precision), config_.encoder_max_batch,
                 e.optimisations().empty() ? std::string("none") : [&] {
                   std::string s;
                   for (const auto& o : e.optimisations()) s += (s.empty() ? "" : ",") + o;
                   return s;
                 }());
    // The cost table Encode plans its passes with (model/batch_plan.h): measured at warm-up on CUDA
    // with graphs ("~": extrapolated from a smaller size), else "-" (every pass counts the same).
    std::string costs;
    for (const EncoderBatchCost& c : e.encoder_batch_costs()) {
      costs += (costs.empty() ? "" : ", ") + std::to_string(c.batch_size) + ": " +
               (c.seconds > 0 ? fmt::format("{}{:.2f} ms", c.extrapolated ? "~" : "", c.seconds * 1e3)
                              : std::string("-"));
    }
    if (!costs.empty()) spdlog::info("device {}: encoder batch costs {}", (*devices)[i].label, costs);
    workers_.push_back(std::make_unique<DeviceWorker>(static_cast<int>(i), (*devices)[i].label,
                                                      std::move(*engines[i]), wo));
    raw.push_back(workers_.back().get());
  }
  router_ = std::make_unique<Router>(raw);
  const std::chrono::microseconds spin(config_.spin_wait_us);
  decode_pool_ = std::make_unique<ThreadPool>("decode", ResolvedThreads(config_.decode_threads),
                                              static_cast<size_t>(config_.decode_queue_capacity), spin);
  post_pool_ = std::make_unique<ThreadPool>("postprocess",
                                            ResolvedThreads(config_.postprocess_threads), 0, spin);
  generate_pool_ = std::make_unique<ThreadPool>("generate", config_.generate_threads,
                                                static_cast<size_t>(config_.generate_queue_capacity));
  PipelineOptions po;
  po.limits = config_.limits();
  po.generation_limits = config_.generation_limits();
  po.max_inflight_bytes = config_.max_inflight_bytes;
  // The engine's input, at fp32 (the widest precision): an upper bound for every device.
  const uint64_t side = static_cast<uint64_t>(std::max(1, workers_[0]->engine().description().image_size));
  po.prepared_image_bytes = side * side * 3 * sizeof(float);
  pipeline_ = std::make_unique<Pipeline>(po, identity, router_.get(), decode_pool_.get(),
                                         post_pool_.get(), generate_pool_.get());
  return Status::Ok();
}

std::vector<DeviceWorker*> MaskServer::workers() const {
  std::vector<DeviceWorker*> out;
  for (const auto& w : workers_) out.push_back(w.get());
  return out;
}

void MaskServer::Shutdown() {
  bool loading;
  {
    std::lock_guard<std::mutex> lock(shutdown_mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    loading = loading_;
    SetHealth(false);
  }
  if (service_) {
    spdlog::info("shutting down: health NOT_SERVING, draining {} call(s) for up to {} s",
                 service_->active_calls(), config_.shutdown_grace_s);
    service_->BeginDrain();
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::microseconds(static_cast<int64_t>(config_.shutdown_grace_s * 1e6));
  if (service_ && !service_->WaitIdle(deadline)) {
    spdlog::warn("shutdown grace period over with {} call(s) in flight: cancelling them",
                 service_->active_calls());
  }
  if (grpc_server_) grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  // After gRPC: HTTP requests in flight are gRPC calls, which the shutdown above has drained or
  // cancelled, so stopping the front (which waits for its handlers) does not wait for long.
  if (http_front_) http_front_->Stop();
  // Queued work fails with UNAVAILABLE; then the pools run what is left (which only finishes calls).
  // While loading, nothing served yet and LoadAndServe owns these members (see shutdown_mu_).
  if (!loading) {
    for (auto& w : workers_) w->Stop();
    if (decode_pool_) decode_pool_->Stop();
    if (post_pool_) post_pool_->Stop();
    // After the workers: a generator waiting for a decoder batch gets the batcher's UNAVAILABLE.
    if (generate_pool_) generate_pool_->Stop();
  }
  if (grpc_server_) grpc_server_->Wait();
  // Its scrapes read the workers (FillInfo), which the destructor frees after this.
  metrics_listener_.reset();
  {
    std::lock_guard<std::mutex> lock(shutdown_mu_);
    down_ = true;
  }
  down_cv_.notify_all();
  spdlog::info("shut down");
}

void MaskServer::Wait() {
  std::unique_lock<std::mutex> lock(shutdown_mu_);
  down_cv_.wait(lock, [this] { return down_; });
}

bool MaskServer::WaitDown(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(shutdown_mu_);
  return down_cv_.wait_until(lock, deadline, [this] { return down_; });
}

}  // namespace maskd::server
