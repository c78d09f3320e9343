#include "load_tests/load_runner.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "client/client.h"
#include "load_tests/workload.h"

namespace maskd::load {
namespace {

using Clock = std::chrono::steady_clock;

// Seed streams, so that prompts, clicks and the batch/interactive choice do not share draws.
enum : uint64_t { kStreamBatchPrompts = 1, kStreamClick = 2, kStreamMix = 3, kStreamNonce = 4,
                  kStreamArrivals = 5 };

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + u.ru_stime.tv_sec + u.ru_stime.tv_usec / 1e6;
}

}  // namespace

const char* WorkloadName(Workload w) {
  switch (w) {
    case Workload::kBatch: return "batch";
    case Workload::kInteractive: return "interactive";
    case Workload::kMixed: return "mixed";
  }
  return "?";
}

StatusOr<Workload> ParseWorkload(const std::string& name) {
  if (name == "batch") return Workload::kBatch;
  if (name == "interactive") return Workload::kInteractive;
  if (name == "mixed") return Workload::kMixed;
  return InvalidArgument("--workload '" + name + "': expected batch, interactive or mixed");
}

const char* CallKindName(uint32_t kind) {
  return kind == static_cast<uint32_t>(CallKind::kBatch) ? "batch" : "interactive";
}

namespace {

// The state shared by the issuing side (closed-loop completions, the open-loop dispatcher) and the
// controller. Calls complete on gRPC's callback threads, so everything here is either atomic,
// immutable after Start, or guarded by the mutex named next to it.
class Engine {
 public:
  // `model_identity`: ModelInfo.identity, for the affinity header of calls with bytes (empty: those
  // go without it).
  Engine(const LoadConfig& config, const std::vector<ImageAsset>& images,
         std::vector<std::unique_ptr<client::Client>> clients, std::vector<std::string> image_ids,
         std::string model_identity)
      : config_(config), images_(images), clients_(std::move(clients)),
        model_identity_(std::move(model_identity)),
        image_ids_(std::move(image_ids)), resend_(images.size(), false),
        slot_seq_(static_cast<size_t>(std::max(1, config.concurrency)), 0), start_(Clock::now()) {
    std::random_device rd;
    // Unique per run, so that a rerun with the same seed does not find the last run's images cached.
    run_salt_ = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  }

  Clock::time_point start() const { return start_; }
  uint64_t NowUs() const {
    return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start_).count();
  }

  // Closed loop: `slot` keeps one call in flight until Stop.
  void StartSlot(int slot) { Issue(slot, Clock::now()); }

  // Open loop: one call that was due at `intended`.
  void IssueOpen(Clock::time_point intended) {
    if (inflight_.load() >= config_.max_inflight) {
      Sample s;
      s.code = -1;
      Record(s, intended);
      return;
    }
    Issue(-1, intended);
  }

  void Stop() { stopping_.store(true); }
  bool stopping() const { return stopping_.load(); }
  bool budget_exhausted() const { return sent_.load() >= config_.max_requests; }
  uint64_t sent() const { return sent_.load(); }
  int inflight() const { return inflight_.load(); }

  // Waits until no call is in flight or `timeout` passes.
  bool Drain(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(drain_mu_);
    return drain_cv_.wait_for(lock, timeout, [&] { return inflight_.load() == 0; });
  }

  // Appends the samples recorded since the last call to `out` (which stays sorted by done_us,
  // because Record stamps done_us under samples_mu_).
  void TakeSamples(std::vector<Sample>& out) {
    std::lock_guard<std::mutex> lock(samples_mu_);
    out.insert(out.end(), samples_.begin(), samples_.end());
    samples_.clear();
  }

 private:
  struct Call {
    grpc::ClientContext context;
    v1::SegmentRequest request;
    v1::SegmentResponse response;
    CallKind kind = CallKind::kBatch;
    int slot = -1;
    size_t image = 0;
    bool resent_image = false;
    Clock::time_point intended;
  };

  void Issue(int slot, Clock::time_point intended) {
    if (stopping_.load()) return;
    const uint64_t seq = sent_.fetch_add(1);
    if (seq >= config_.max_requests) return;
    inflight_.fetch_add(1);

    auto* call = new Call;
    call->slot = slot;
    call->intended = intended;
    call->kind = ChooseKind(seq);
    if (call->kind == CallKind::kBatch) {
      BuildBatch(seq, *call);
    } else {
      BuildClick(seq, slot, *call);
    }
    if (config_.affinity_header) {
      // The free function, not Client::AffinityKeyFor: this runs on gRPC callback threads, which
      // must not block on the client's lazy GetInfo; the identity was fetched once at set-up.
      if (std::optional<std::string> key = client::AffinityKey(model_identity_, call->request)) {
        call->context.AddMetadata(client::kAffinityHeader, *key);
      }
    }
    call->context.set_deadline(std::chrono::system_clock::now() +
                               std::chrono::microseconds(static_cast<int64_t>(config_.request_timeout_s * 1e6)));
    client::Client& c = *clients_[seq % clients_.size()];
    c.stub().async()->Segment(&call->context, &call->request, &call->response,
                              [this, call](grpc::Status status) { Complete(call, status); });
  }

  CallKind ChooseKind(uint64_t seq) const {
    switch (config_.workload) {
      case Workload::kBatch: return CallKind::kBatch;
      case Workload::kInteractive: return CallKind::kInteractive;
      case Workload::kMixed: {
        Rng rng(MixSeed(config_.seed, kStreamMix, seq));
        return rng.Uniform() < config_.batch_fraction ? CallKind::kBatch : CallKind::kInteractive;
      }
    }
    return CallKind::kBatch;
  }

  void BuildBatch(uint64_t seq, Call& call) const {
    call.image = seq % images_.size();
    const ImageAsset& im = images_[call.image];
    if (config_.unique_images && im.is_jpeg) {
      call.request.mutable_image()->set_encoded(
          JpegWithNonce(im.encoded, MixSeed(run_salt_, kStreamNonce, seq)));
    } else {
      call.request.mutable_image()->set_encoded(im.encoded);
    }
    for (const PointPrompt& p : GeneratePointPrompts(MixSeed(config_.seed, kStreamBatchPrompts, seq),
                                                     im.width, im.height, config_.min_prompts,
                                                     config_.max_prompts)) {
      v1::Prompt* prompt = call.request.add_prompts();
      v1::Point* point = prompt->add_points();
      point->set_x(p.x);
      point->set_y(p.y);
      point->set_label(v1::POINT_LABEL_FOREGROUND);
      prompt->set_multimask(config_.multimask);
    }
    call.request.set_output_format(config_.format);
  }

  void BuildClick(uint64_t seq, int slot, Call& call) {
    // A closed-loop client stays on one image for clicks_per_image clicks (an annotator works on one
    // picture at a time); open-loop arrivals are independent users.
    const uint64_t per_slot = slot >= 0 ? slot_seq_[slot]++ : seq;
    call.image = slot >= 0 ? (static_cast<uint64_t>(slot) + per_slot / std::max(1, config_.clicks_per_image)) %
                                 images_.size()
                           : MixSeed(config_.seed, kStreamClick, seq) % images_.size();
    const ImageAsset& im = images_[call.image];
    {
      std::lock_guard<std::mutex> lock(ids_mu_);
      if (resend_[call.image] || image_ids_[call.image].empty()) {
        // The embedding was evicted (NOT_FOUND earlier): this call sends the bytes again.
        call.request.mutable_image()->set_encoded(im.encoded);
        call.resent_image = true;
      } else {
        call.request.set_image_id(image_ids_[call.image]);
      }
    }
    const PointPrompt p = GeneratePointPrompts(MixSeed(config_.seed, kStreamClick, seq), im.width,
                                               im.height, 1, 1)[0];
    v1::Prompt* prompt = call.request.add_prompts();
    v1::Point* point = prompt->add_points();
    point->set_x(p.x);
    point->set_y(p.y);
    point->set_label(v1::POINT_LABEL_FOREGROUND);
    prompt->set_multimask(config_.multimask);
    call.request.set_output_format(config_.format);
  }

  void Complete(Call* call, const grpc::Status& status) {
    Sample s;
    s.kind = static_cast<uint32_t>(call->kind);
    s.code = static_cast<int32_t>(status.error_code());
    if (status.ok()) {
      const v1::SegmentResponse& r = call->response;
      if (r.results_size() != call->request.prompts_size()) {
        s.code = -2;
      } else {
        s.images = call->kind == CallKind::kBatch ? 1 : 0;
        s.prompts = static_cast<uint32_t>(r.results_size());
        for (const v1::PromptResult& pr : r.results()) {
          s.masks += static_cast<uint32_t>(pr.masks_size());
          for (const v1::MaskResult& m : pr.masks()) s.rle_bytes += m.rle().counts().size();
        }
        s.response_bytes = r.ByteSizeLong();
        const v1::CallTiming& t = r.timing();
        s.server_total_us = t.total_us();
        s.decode_us = t.decode_us();
        s.encoder_queue_us = t.encoder_queue_us();
        s.encoder_compute_us = t.encoder_compute_us();
        s.decoder_queue_us = t.decoder_queue_us();
        s.decoder_compute_us = t.decoder_compute_us();
        s.postprocess_us = t.postprocess_us();
      }
      if (call->kind == CallKind::kInteractive && call->resent_image) {
        std::lock_guard<std::mutex> lock(ids_mu_);
        image_ids_[call->image] = r.image_id();
        resend_[call->image] = false;
      }
    } else if (status.error_code() == grpc::StatusCode::NOT_FOUND &&
               call->kind == CallKind::kInteractive) {
      std::lock_guard<std::mutex> lock(ids_mu_);
      resend_[call->image] = true;
    }
    Record(s, call->intended);
    const int slot = call->slot;
    delete call;
    if (slot >= 0 && !stopping_.load()) Issue(slot, Clock::now());
    if (inflight_.fetch_sub(1) == 1) {
      std::lock_guard<std::mutex> lock(drain_mu_);
      drain_cv_.notify_all();
    }
  }

  void Record(Sample s, Clock::time_point intended) {
    std::lock_guard<std::mutex> lock(samples_mu_);
    const Clock::time_point now = Clock::now();
    s.done_us = std::chrono::duration_cast<std::chrono::microseconds>(now - start_).count();
    s.latency_us = s.code == -1 ? 0 : std::chrono::duration_cast<std::chrono::microseconds>(now - intended).count();
    samples_.push_back(s);
  }

  const LoadConfig& config_;
  const std::vector<ImageAsset>& images_;
  std::vector<std::unique_ptr<client::Client>> clients_;
  const std::string model_identity_;
  uint64_t run_salt_ = 0;

  // Interactive image ids and whether the next click must re-send the image (after NOT_FOUND).
  // Locking: ids_mu_ guards image_ids_ and resend_; held only to copy a string or flip a flag.
  std::mutex ids_mu_;
  std::vector<std::string> image_ids_;
  std::vector<bool> resend_;

  // Clicks sent by each closed-loop slot. A slot has one call in flight at a time and issues the
  // next from the previous one's completion, so each element has one writer at a time, ordered by
  // gRPC's callback chain: no lock.
  std::vector<uint64_t> slot_seq_;
  std::atomic<uint64_t> sent_{0};
  std::atomic<int> inflight_{0};
  std::atomic<bool> stopping_{false};
  const Clock::time_point start_;

  // Locking: samples_mu_ guards samples_; Record stamps the completion time while holding it, so
  // samples_ is in completion-time order.
  std::mutex samples_mu_;
  std::vector<Sample> samples_;

  std::mutex drain_mu_;  // with drain_cv_: wakes Drain when the last call completes
  std::condition_variable drain_cv_;
};

// LoadConfig::background_generate clients, each a thread that loops a blocking GenerateMasks on
// one embedded image until Stop. Only calls that finish after MeasureFrom count.
class BackgroundGenerators {
 public:
  BackgroundGenerators(const LoadConfig& config, std::string image_id) : config_(config) {
    request_.set_image_id(std::move(image_id));
    request_.mutable_params()->set_points_per_side(config.generate_points_per_side);
    request_.set_output_format(v1::OUTPUT_FORMAT_COCO_RLE);
  }
  ~BackgroundGenerators() { Stop(); }

  void Start() {
    for (int i = 0; i < config_.background_generate; ++i) {
      threads_.emplace_back([this, i] {
        client::ClientOptions o;
        o.target = config_.target;
        o.security = config_.security;
        o.timeout = std::chrono::milliseconds(static_cast<int64_t>(config_.request_timeout_s * 1000));
        o.channel_index = 1000 + i;  // channels of their own, not the measured workload's
        client::Client c(o);
        while (!stop_.load()) {
          const Clock::time_point t0 = Clock::now();
          StatusOr<v1::GenerateMasksResponse> r = c.GenerateMasks(request_);
          const Clock::time_point t1 = Clock::now();
          // A refused call (an evicted image_id, a full queue) comes back at once: do not spin on it.
          if (!r.ok() && !stop_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
          std::lock_guard<std::mutex> lock(mu_);
          if (!measuring_ || t1 < measure_from_ || t1 > measure_until_) continue;
          if (!r.ok()) {
            ++stats_.errors;
            if (stats_.first_error.empty()) stats_.first_error = r.status().ToString();
            continue;
          }
          ++stats_.ok;
          stats_.masks += static_cast<uint64_t>(r->masks_size());
          server_total_us_ += r->timing().total_us();
          latencies_us_.push_back(static_cast<uint64_t>(
              std::chrono::duration_cast<std::chrono::microseconds>(t1 - t0).count()));
        }
      });
    }
  }
  void MeasureFrom(Clock::time_point t) {
    std::lock_guard<std::mutex> lock(mu_);
    measuring_ = true;
    measure_from_ = t;
  }
  void MeasureUntil(Clock::time_point t) {
    std::lock_guard<std::mutex> lock(mu_);
    measure_until_ = t;
  }
  void Stop() {
    stop_.store(true);
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }
  BackgroundStats Result() {
    std::lock_guard<std::mutex> lock(mu_);
    BackgroundStats s = stats_;
    s.latency = Summarize(latencies_us_);
    if (s.ok > 0) s.server_total_ms = static_cast<double>(server_total_us_) / 1e3 / static_cast<double>(s.ok);
    return s;
  }

 private:
  const LoadConfig& config_;
  v1::GenerateMasksRequest request_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
  // Locking: mu_ guards everything below.
  std::mutex mu_;
  bool measuring_ = false;
  Clock::time_point measure_from_;
  Clock::time_point measure_until_ = Clock::time_point::max();
  BackgroundStats stats_;
  uint64_t server_total_us_ = 0;
  std::vector<uint64_t> latencies_us_;
};

std::optional<v1::GetInfoResponse> TryGetInfo(client::Client& control) {
  StatusOr<v1::GetInfoResponse> info = control.GetInfo();
  if (!info.ok()) return std::nullopt;
  return *info;
}

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string FormatPreEmbedProgress(size_t done, size_t total, double elapsed_s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "maskload %6.1fs pre-embed %zu/%zu images (%.0f %%)", elapsed_s, done,
                total, total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0);
  return buf;
}

std::string FormatProgress(double t, const char* phase, int window, const WindowStats& last,
                           int inflight, uint64_t errors, bool batch_unit) {
  char buf[256];
  if (batch_unit) {
    std::snprintf(buf, sizeof buf,
                  "maskload %6.1fs %-7s w%-2d | %7.1f img/s %8.1f prompts/s | p50 %7.2f p99 %7.2f ms | in flight %4d | errors %llu",
                  t, phase, window, last.images_per_s(), last.prompts_per_s(), last.latency.p50_us / 1e3,
                  last.latency.p99_us / 1e3, inflight, static_cast<unsigned long long>(errors));
  } else {
    std::snprintf(buf, sizeof buf,
                  "maskload %6.1fs %-7s w%-2d | %8.1f calls/s %8.1f prompts/s | p50 %7.2f p99 %7.2f ms | in flight %4d | errors %llu",
                  t, phase, window, last.requests_per_s(), last.prompts_per_s(), last.latency.p50_us / 1e3,
                  last.latency.p99_us / 1e3, inflight, static_cast<unsigned long long>(errors));
  }
  return buf;
}

}  // namespace

LoadRunner::LoadRunner(LoadConfig config, std::vector<ImageAsset> images, ProgressFn progress)
    : config_(std::move(config)), images_(std::move(images)), progress_(std::move(progress)) {}

StatusOr<LoadResult> LoadRunner::Run() {
  if (images_.empty()) return InvalidArgument("maskload: no images to send");
  if (config_.concurrency < 1 || config_.concurrency > 4096) {
    return InvalidArgument("--concurrency " + std::to_string(config_.concurrency) + ": expected 1..4096");
  }
  if (config_.min_prompts < 1 || config_.max_prompts < config_.min_prompts) {
    return InvalidArgument("--prompts " + std::to_string(config_.min_prompts) + ".." +
                           std::to_string(config_.max_prompts) + ": expected 1 <= min <= max");
  }
  if (config_.background_generate < 0 || config_.background_generate > 64) {
    return InvalidArgument("--background-generate " + std::to_string(config_.background_generate) +
                           ": expected 0..64");
  }
  const std::chrono::milliseconds call_timeout(static_cast<int64_t>(config_.request_timeout_s * 1000));

  client::ClientOptions control_options;
  control_options.target = config_.target;
  control_options.security = config_.security;
  control_options.timeout = std::chrono::milliseconds(5000);
  control_options.connect_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(config_.connect_timeout_s * 1000));
  StatusOr<std::unique_ptr<client::Client>> control = client::Client::Connect(control_options);
  if (!control.ok()) return control.status();

  LoadResult result;
  result.info_before = TryGetInfo(**control);

  // Interactive calls (and --background-generate) name images by id: each is embedded once, before
  // anything is measured.
  std::vector<std::string> image_ids(images_.size());
  client::ClientOptions embed_options = control_options;
  embed_options.timeout = call_timeout;
  embed_options.affinity_header = config_.affinity_header;
  client::Client embedder(embed_options);
  auto embed = [&](size_t i, const char* purpose) -> Status {
    StatusOr<v1::EmbedResponse> r = embedder.Embed(images_[i].encoded);
    if (!r.ok()) {
      return Status(r.status().code(),
                    "embedding image " + images_[i].name + " for " + purpose + ": " + r.status().message());
    }
    image_ids[i] = r->image_id();
    return Status::Ok();
  };
  if (config_.workload != Workload::kBatch) {
    // A pool of large images on a busy server takes minutes to embed: say so, about once a second
    // and at the end, so that a silent start does not look like a hang.
    const Clock::time_point embed_start = Clock::now();
    Clock::time_point next_line = embed_start;
    for (size_t i = 0; i < images_.size(); ++i) {
      if (progress_ && Clock::now() >= next_line) {
        progress_(FormatPreEmbedProgress(i, images_.size(), SecondsSince(embed_start)), false);
        next_line = Clock::now() + std::chrono::seconds(1);
      }
      if (Status s = embed(i, "the interactive workload"); !s.ok()) return s;
    }
    if (progress_) {
      progress_(FormatPreEmbedProgress(images_.size(), images_.size(), SecondsSince(embed_start)), true);
    }
  }

  // The background generators' image: the pool's first, embedded once (by the interactive set-up
  // when it ran).
  std::unique_ptr<BackgroundGenerators> background;
  if (config_.background_generate > 0) {
    if (image_ids[0].empty()) {
      if (Status st = embed(0, "--background-generate"); !st.ok()) return st;
    }
    background = std::make_unique<BackgroundGenerators>(config_, image_ids[0]);
  }

  std::vector<std::unique_ptr<client::Client>> clients;
  for (int i = 0; i < std::max(1, config_.channels); ++i) {
    client::ClientOptions o;
    o.target = config_.target;
    o.security = config_.security;
    o.timeout = call_timeout;
    o.channel_index = i;
    clients.push_back(std::make_unique<client::Client>(o));
  }

  // The identity from the GetInfo above (one more try if that one failed): without it batch calls
  // go without the affinity header, by-id clicks still carry theirs.
  std::string model_identity;
  if (config_.affinity_header) {
    const std::optional<v1::GetInfoResponse> info =
        result.info_before ? result.info_before : TryGetInfo(**control);
    if (info) model_identity = info->model().identity();
  }
  Engine engine(config_, images_, std::move(clients), std::move(image_ids), std::move(model_identity));
  const bool open_loop = config_.rate > 0;
  const RateUnit unit = config_.workload == Workload::kBatch ? RateUnit::kImages : RateUnit::kRequests;

  if (background) background->Start();
  std::thread dispatcher;
  if (open_loop) {
    dispatcher = std::thread([&] {
      PoissonArrivals arrivals(config_.rate, MixSeed(config_.seed, kStreamArrivals));
      Clock::time_point next = Clock::now();
      while (!engine.stopping() && !engine.budget_exhausted()) {
        next += std::chrono::nanoseconds(static_cast<int64_t>(arrivals.NextGapSeconds() * 1e9));
        std::this_thread::sleep_until(next);
        if (engine.stopping()) break;
        engine.IssueOpen(next);
      }
    });
  } else {
    for (int slot = 0; slot < config_.concurrency; ++slot) engine.StartSlot(slot);
  }

  std::vector<Sample> all;
  const uint64_t warmup_end_us = static_cast<uint64_t>(config_.warmup_s * 1e6);
  const uint64_t window_us = static_cast<uint64_t>(config_.window_s * 1e6);
  const uint64_t max_us = static_cast<uint64_t>(config_.max_duration_s * 1e6);
  uint64_t window_start_us = warmup_end_us;
  uint64_t next_progress_us = 1000000;
  double cpu_at_measure_start = -1;
  uint64_t calls_at_measure_start = 0;
  bool measuring = false;
  uint64_t errors_so_far = 0;

  auto tail = [&](uint64_t from_us, uint64_t to_us) {
    auto lo = std::lower_bound(all.begin(), all.end(), from_us,
                               [](const Sample& s, uint64_t t) { return s.done_us < t; });
    return Aggregate(all.data() + (lo - all.begin()), all.data() + all.size(), from_us, to_us);
  };
  auto record_memory = [&](uint64_t now_us) {
    if (std::optional<v1::GetInfoResponse> info = TryGetInfo(**control)) {
      result.memory.push_back({now_us / 1e6, info->memory().allocated_bytes(),
                               info->memory().peak_allocated_bytes()});
    }
  };

  while (true) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const uint64_t now_us = engine.NowUs();
    const size_t before = all.size();
    engine.TakeSamples(all);
    for (size_t i = before; i < all.size(); ++i) errors_so_far += all[i].code != 0;

    if (!measuring && now_us >= warmup_end_us) {
      measuring = true;
      window_start_us = now_us;
      cpu_at_measure_start = CpuSeconds();
      calls_at_measure_start = engine.sent();
      result.warmup_end_s = now_us / 1e6;
      if (background) background->MeasureFrom(engine.start() + std::chrono::microseconds(now_us));
      record_memory(now_us);
    }
    if (measuring && now_us >= window_start_us + window_us) {
      const uint64_t end_us = window_start_us + window_us;
      result.windows.push_back(tail(window_start_us, end_us));
      window_start_us = end_us;
      record_memory(now_us);
      if (IsStable(result.windows, config_.stable_windows, config_.stability, unit)) {
        result.stable = true;
        result.stop_reason = "stable";
      }
    }
    if (progress_ && now_us >= next_progress_us) {
      next_progress_us += 1000000;
      progress_(FormatProgress(now_us / 1e6, measuring ? "measure" : "warm-up",
                               static_cast<int>(result.windows.size()),
                               tail(now_us > 1000000 ? now_us - 1000000 : 0, now_us), engine.inflight(),
                               errors_so_far, unit == RateUnit::kImages),
                false);
    }
    if (result.stable) break;
    if (now_us >= max_us) {
      result.stop_reason = "max-duration";
      break;
    }
    if (engine.budget_exhausted() && engine.inflight() == 0) {
      result.stop_reason = "max-requests";
      break;
    }
  }
  const uint64_t stop_us = engine.NowUs();
  engine.Stop();
  if (dispatcher.joinable()) dispatcher.join();
  if (background) {
    // Generations still running at the stop end after the measured part: Stop waits for them
    // (each is bounded by the request timeout) but they are not counted.
    background->MeasureUntil(Clock::now());
    background->Stop();
    result.background = background->Result();
  }
  const double cpu_at_stop = CpuSeconds();
  const uint64_t calls_at_stop = engine.sent();
  engine.Drain(call_timeout + std::chrono::seconds(2));
  engine.TakeSamples(all);

  // A stop before stability keeps the last partial window when it covers at least half a window,
  // so that a bounded run still reports what it measured.
  if (!result.stable && measuring && stop_us > window_start_us &&
      stop_us - window_start_us >= window_us / 2) {
    result.windows.push_back(tail(window_start_us, stop_us));
  }
  const size_t n = result.windows.size();
  const size_t k = result.stable ? static_cast<size_t>(config_.stable_windows) : n;
  if (k > 0) {
    const WindowStats& first = result.windows[n - k];
    const WindowStats& last = result.windows[n - 1];
    const uint64_t from = static_cast<uint64_t>(first.start_s * 1e6 + 0.5);
    const uint64_t to = static_cast<uint64_t>((last.start_s + last.duration_s) * 1e6 + 0.5);
    result.summary = tail(from, to);
    result.summary_windows = static_cast<int>(k);
  } else {
    // Stopped during warm-up (a tiny bound): report everything rather than nothing.
    result.summary = Aggregate(all, 0, stop_us + 1);
  }
  // The whole run spans the start to the last completion (calls drained after the stop included),
  // so its rates are per real second; an open end would make the duration UINT64_MAX us.
  const uint64_t run_end_us = std::max<uint64_t>(stop_us, all.empty() ? 0 : all.back().done_us) + 1;
  result.whole_run = Aggregate(all, 0, run_end_us);
  result.wall_s = stop_us / 1e6;
  result.sent = std::min<uint64_t>(engine.sent(), config_.max_requests);
  if (cpu_at_measure_start >= 0) {
    result.client_cpu_s = cpu_at_stop - cpu_at_measure_start;
    const uint64_t calls = std::min<uint64_t>(calls_at_stop, config_.max_requests) - calls_at_measure_start;
    if (calls > 0) result.client_cpu_us_per_call = result.client_cpu_s * 1e6 / calls;
  }
  // The timeline runs to the last completion, so calls that were in flight at the stop (and, say,
  // ran into their deadline while draining) show up in the plot too.
  const uint64_t timeline_end = run_end_us;
  for (uint64_t t = 0; t < timeline_end; t += 1000000) {
    result.timeline.push_back(tail(t, std::min<uint64_t>(t + 1000000, timeline_end)));
  }
  result.info_after = TryGetInfo(**control);
  if (progress_) {
    progress_(FormatProgress(stop_us / 1e6, "done", static_cast<int>(n), result.summary, 0,
                             result.whole_run.errors, unit == RateUnit::kImages),
              true);
  }
  return result;
}

}  // namespace maskd::load
