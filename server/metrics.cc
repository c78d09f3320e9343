#include "server/metrics.h"

#include <chrono>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include <httplib.h>
#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "maskd/v1/maskd.pb.h"
#include "server/config.h"

namespace maskd::server {

namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// RPC latency: from a cached GetInfo (well under a millisecond) to a large image on a slow CPU
// (tens of seconds); roughly x2.5 per bucket.
const prometheus::Histogram::BucketBoundaries kSecondsBuckets = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60};
// Batch sizes are small integers; powers of two match the encoder's usual preferred sizes.
const prometheus::Histogram::BucketBoundaries kBatchBuckets = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
// Stage times, seconds: queue waits are microseconds to milliseconds, compute up to seconds on CPU.
const prometheus::Histogram::BucketBoundaries kStageBuckets = {
    0.00001, 0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10};

// Scrape-time families built from a GetInfoResponse.
class InfoFamilies {
 public:
  MetricFamily& Family(const std::string& name, const std::string& help, MetricType type) {
    for (MetricFamily& f : families_) {
      if (f.name == name) return f;
    }
    families_.push_back(MetricFamily{name, help, type, {}});
    return families_.back();
  }
  void Gauge(const std::string& name, const std::string& help,
             std::vector<ClientMetric::Label> labels, double value) {
    ClientMetric m;
    m.label = std::move(labels);
    m.gauge.value = value;
    Family(name, help, MetricType::Gauge).metric.push_back(std::move(m));
  }
  void Counter(const std::string& name, const std::string& help,
               std::vector<ClientMetric::Label> labels, double value) {
    ClientMetric m;
    m.label = std::move(labels);
    m.counter.value = value;
    Family(name, help, MetricType::Counter).metric.push_back(std::move(m));
  }
  std::vector<MetricFamily> Take() { return std::move(families_); }

 private:
  std::vector<MetricFamily> families_;
};

void AddQueue(InfoFamilies& f, const std::string& device, const char* queue,
              const v1::QueueStats& q) {
  const std::vector<ClientMetric::Label> l = {{"device", device}, {"queue", queue}};
  f.Gauge("maskd_queue_depth", "Work waiting in a batcher queue (encoder: images, decoder: prompts)",
          l, static_cast<double>(q.depth()));
  f.Gauge("maskd_queue_capacity", "Most work a batcher queue holds before refusing more", l,
          static_cast<double>(q.capacity()));
  f.Counter("maskd_queue_rejected_total",
            "Work refused because its batcher queue was full (the call got RESOURCE_EXHAUSTED)", l,
            static_cast<double>(q.rejected()));
  f.Counter("maskd_queue_dropped_total",
            "Work dropped from a batcher queue because its call had ended (deadline or cancel)", l,
            static_cast<double>(q.dropped()));
  f.Counter("maskd_queue_batches_total", "Batches a batcher ran", l, static_cast<double>(q.batches()));
  f.Counter("maskd_queue_oom_splits_total",
            "Engine calls that ran out of device memory and were split in halves to be retried", l,
            static_cast<double>(q.oom_splits()));
  f.Counter("maskd_queue_oom_failures_total",
            "Items (images or prompts) that ran out of device memory on their own (RESOURCE_EXHAUSTED)",
            l, static_cast<double>(q.oom_failures()));
  f.Counter("maskd_queue_items_total", "Items (images or prompts) a batcher ran", l,
            static_cast<double>(q.items()));
}

void AddCache(InfoFamilies& f, const std::string& device, const v1::CacheStats& c) {
  const std::vector<ClientMetric::Label> d = {{"device", device}};
  f.Counter("maskd_cache_hits_total", "Embedding cache lookups answered from either tier", d,
            static_cast<double>(c.hits()));
  f.Counter("maskd_cache_misses_total", "Embedding cache lookups that needed the encoder", d,
            static_cast<double>(c.misses()));
  f.Counter("maskd_cache_evictions_total", "Embeddings dropped from the cache to make room", d,
            static_cast<double>(c.evictions()));
  f.Counter("maskd_cache_demotions_total", "Embeddings moved from the device tier to the host tier",
            d, static_cast<double>(c.demotions()));
  f.Counter("maskd_cache_single_flight_joins_total",
            "Lookups that joined an encode already under way for the same image", d,
            static_cast<double>(c.single_flight_joins()));
  for (const auto& [tier, t] : {std::pair<const char*, const v1::CacheTierStats*>{"device", &c.device()},
                                {"host", &c.host()}}) {
    const std::vector<ClientMetric::Label> l = {{"device", device}, {"tier", tier}};
    f.Gauge("maskd_cache_bytes", "Bytes of embeddings held in a cache tier", l,
            static_cast<double>(t->bytes()));
    f.Gauge("maskd_cache_capacity_bytes", "Capacity of a cache tier (0: the tier is off)", l,
            static_cast<double>(t->capacity_bytes()));
    f.Gauge("maskd_cache_entries", "Embeddings held in a cache tier", l,
            static_cast<double>(t->entries()));
  }
  f.Gauge("maskd_result_store_entries", "Stored low-res logits of recent results (result ids)", d,
          static_cast<double>(c.results()));
  f.Gauge("maskd_result_store_bytes", "Bytes of stored low-res logits", d,
          static_cast<double>(c.result_bytes()));
}

std::vector<MetricFamily> FamiliesFromInfo(const v1::GetInfoResponse& info) {
  InfoFamilies f;
  f.Gauge("maskd_uptime_seconds", "Seconds since the server started", {},
          static_cast<double>(info.uptime_seconds()));
  if (info.has_startup()) {
    const v1::StartupTimes& st = info.startup();
    const std::pair<const char*, double> phases[] = {
        {"main", st.main_ms()},           {"listening", st.listening_ms()},
        {"checkpoint_read", st.checkpoint_read_ms()}, {"weights_ready", st.weights_ready_ms()},
        {"warmed_up", st.warmed_up_ms()}, {"serving", st.serving_ms()},
        {"first_mask", st.first_mask_ms()}};
    for (const auto& [phase, ms] : phases) {
      if (ms <= 0) continue;  // not reached yet
      f.Gauge("maskd_startup_seconds",
              "When a start-up milestone was reached, in seconds after the process started", {{"phase", phase}},
              ms / 1e3);
    }
  }
  if (!info.has_model()) return f.Take();  // still loading: no devices yet
  const v1::ModelInfo& m = info.model();
  f.Gauge("maskd_model_info", "The model served (value is always 1; the facts are the labels)",
          {{"arch", m.arch()},
           {"checkpoint", m.checkpoint()},
           {"demo", m.demo() ? "true" : "false"},
           {"identity", m.identity()},
           {"precision", info.precision()},
           {"version", info.version()}},
          1);
  f.Gauge("maskd_model_parameters", "Parameters of the model served", {},
          static_cast<double>(m.parameter_count()));
  for (const v1::DeviceInfo& dev : info.devices()) {
    AddQueue(f, dev.device(), "encoder", dev.encoder_queue());
    AddQueue(f, dev.device(), "decoder", dev.decoder_queue());
    AddCache(f, dev.device(), dev.cache());
    const v1::GpuMemory& g = dev.memory();
    // CPU engines report no device memory; a zero there would read as "nothing allocated".
    if (g.total_bytes() > 0 || g.allocated_bytes() > 0) {
      const std::vector<ClientMetric::Label> l = {{"device", dev.device()}};
      f.Gauge("maskd_device_memory_allocated_bytes", "Device memory allocated by the engine now", l,
              static_cast<double>(g.allocated_bytes()));
      f.Gauge("maskd_device_memory_peak_allocated_bytes",
              "Most device memory the engine had allocated at once since start", l,
              static_cast<double>(g.peak_allocated_bytes()));
      f.Gauge("maskd_device_memory_reserved_bytes", "Device memory held by the engine's allocator",
              l, static_cast<double>(g.reserved_bytes()));
      f.Gauge("maskd_device_memory_total_bytes", "Device memory of the device", l,
              static_cast<double>(g.total_bytes()));
    }
  }
  return f.Take();
}

}  // namespace

// Collects both halves: the registry of recorded metrics and the scrape-time families.
struct Metrics::Impl : prometheus::Collectable {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  prometheus::Family<prometheus::Counter>& requests =
      prometheus::BuildCounter()
          .Name("maskd_requests_total")
          .Help("Finished calls (and SegmentStream messages) by method and gRPC status code")
          .Register(*registry);
  prometheus::Family<prometheus::Histogram>& latency =
      prometheus::BuildHistogram()
          .Name("maskd_request_duration_seconds")
          .Help("Time from a call's arrival to its status, by method")
          .Register(*registry);
  prometheus::Family<prometheus::Histogram>& encoder_batch =
      prometheus::BuildHistogram()
          .Name("maskd_encoder_batch_size")
          .Help("Images per image-encoder pass")
          .Register(*registry);
  prometheus::Family<prometheus::Histogram>& decoder_batch =
      prometheus::BuildHistogram()
          .Name("maskd_decoder_batch_size")
          .Help("Prompts per mask-decoder pass (from any requests and images)")
          .Register(*registry);
  prometheus::Family<prometheus::Histogram>& stage =
      prometheus::BuildHistogram()
          .Name("maskd_stage_duration_seconds")
          .Help("Time work items spent in each pipeline stage (*_queue stages are waiting time)")
          .Register(*registry);

  // Guards source.
  mutable std::mutex mu;
  InfoSource source;

  std::vector<MetricFamily> Collect() const override {
    std::vector<MetricFamily> out = registry->Collect();
    InfoSource s;
    {
      std::lock_guard<std::mutex> lock(mu);
      s = source;
    }
    if (s) {
      v1::GetInfoResponse info;
      s(&info);
      for (MetricFamily& f : FamiliesFromInfo(info)) out.push_back(std::move(f));
    }
    return out;
  }
};

Metrics::Metrics() : impl_(std::make_unique<Impl>()) {}
Metrics::~Metrics() = default;

void Metrics::SetInfoSource(InfoSource source) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->source = std::move(source);
}

void Metrics::ObserveCall(const char* method, StatusCode code, double seconds) {
  impl_->requests.Add({{"method", method}, {"code", StatusCodeName(code)}}).Increment();
  impl_->latency.Add({{"method", method}}, kSecondsBuckets).Observe(seconds);
}

void Metrics::ObserveEncoderBatch(const std::string& device, size_t images) {
  impl_->encoder_batch.Add({{"device", device}}, kBatchBuckets).Observe(static_cast<double>(images));
}

void Metrics::ObserveDecoderBatch(const std::string& device, size_t prompts) {
  impl_->decoder_batch.Add({{"device", device}}, kBatchBuckets).Observe(static_cast<double>(prompts));
}

void Metrics::ObserveStage(const std::string& device, Stage s, uint64_t micros) {
  impl_->stage.Add({{"device", device}, {"stage", StageName(s)}}, kStageBuckets)
      .Observe(static_cast<double>(micros) * 1e-6);
}

std::string Metrics::Serialize() const {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, impl_->Collect());
  return out.str();
}

struct MetricsListener::Http {
  httplib::Server server;
  std::thread thread;
};

StatusOr<std::unique_ptr<MetricsListener>> MetricsListener::Start(const std::string& listen,
                                                                  const Metrics& metrics) {
  StatusOr<std::pair<std::string, int>> where = ParseListen(listen);
  if (!where.ok()) return InvalidArgument("--metrics-listen = \"" + listen + "\" (expected HOST:PORT)");
  std::string host = where->first;
  // "[::1]" on the command line (as for --listen); the socket API wants the bare address.
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);

  std::unique_ptr<MetricsListener> l(new MetricsListener());
  l->http_ = std::make_unique<Http>();
  httplib::Server& server = l->http_->server;
  // Scrapes come every few seconds from one or two Prometheus servers: two threads, not one per core.
  server.new_task_queue = [] { return new httplib::ThreadPool(2); };
  // cpp-httplib's default also sets SO_REUSEPORT, with which a second maskd on the same metrics
  // port would bind "fine" and take half the scrapes (the same reason --listen turns it off).
  // SO_REUSEADDR alone still allows a restart while old connections linger in TIME_WAIT.
  server.set_socket_options([](socket_t sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  server.Get("/metrics", [&metrics](const httplib::Request&, httplib::Response& response) {
    response.set_content(metrics.Serialize(), "text/plain; version=0.0.4; charset=utf-8");
  });
  const int port = where->second == 0 ? server.bind_to_any_port(host)
                                      : (server.bind_to_port(host, where->second) ? where->second : -1);
  if (port <= 0) {
    return Unavailable("--metrics-listen = \"" + listen +
                       "\" could not be bound: address already in use (another maskd or program "
                       "listens there), or not an address of this machine (expected a free port)");
  }
  l->port_ = port;
  l->http_->thread = std::thread([&server] { server.listen_after_bind(); });
  // stop() does nothing to a server whose loop has not begun, which would then never end: the
  // destructor may only run once it runs. It begins at once; the bound is for a stuck machine.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!server.is_running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!server.is_running()) {
    // It cannot be stopped or joined: leave thread and server be (the process fails to start).
    l->http_->thread.detach();
    (void)l->http_.release();
    return Unavailable("--metrics-listen = \"" + listen + "\": the metrics listener did not start");
  }
  return l;
}

MetricsListener::~MetricsListener() {
  if (!http_) return;
  http_->server.stop();
  if (http_->thread.joinable()) http_->thread.join();
}

}  // namespace maskd::server
