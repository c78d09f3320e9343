// The maskd server: listens at once (health NOT_SERVING), loads one engine per device, then serves
// (health SERVING); Shutdown drains and stops. main.cc is a thin wrapper around this class, and the
// end-to-end tests run it in-process on an ephemeral loopback port.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "model/api/engine.h"
#include "model/api/status.h"
#include "server/config.h"
#include "server/device_worker.h"
#include "server/http_front.h"
#include "server/mask_service.h"
#include "server/metrics.h"
#include "server/pipeline.h"
#include "server/router.h"
#include "server/startup.h"
#include "server/thread_pool.h"

namespace maskd::server {

// Engine::Create in the product; tests pass fakes.
using EngineFactory = std::function<StatusOr<std::unique_ptr<Engine>>(const EngineOptions&)>;

inline constexpr const char* kServiceName = "maskd.v1.MaskService";

class MaskServer {
 public:
  // cuda_device_count: what "cuda"/"auto" in --device expand to.
  MaskServer(ServerConfig config, EngineFactory factory, int cuda_device_count);
  ~MaskServer();

  // StartListening + LoadAndServe.
  Status Start();
  // Binds --listen and starts gRPC with health NOT_SERVING; MaskService calls answer UNAVAILABLE.
  // With --http-listen, also the HTTP front (its calls reach the same service, so they answer
  // UNAVAILABLE too until the model is loaded).
  Status StartListening();
  // Creates the engines (in parallel, one per device), checks they agree on the model identity,
  // builds the workers and pipeline, then reports SERVING.
  Status LoadAndServe();
  // Health NOT_SERVING, new calls UNAVAILABLE, waits up to --shutdown-grace-s for in-flight calls,
  // then stops gRPC, the batchers and the pools. Idempotent; safe from any thread but a handler.
  void Shutdown();
  // Blocks until Shutdown has completed.
  void Wait();
  // Wait, up to `deadline`; true when Shutdown has completed.
  bool WaitDown(std::chrono::steady_clock::time_point deadline);

  int port() const { return port_; }
  // The HTTP front's port; 0 without --http-listen.
  int http_port() const { return http_front_ ? http_front_->port() : 0; }
  const std::string& address() const { return address_; }
  MaskService& service() { return *service_; }
  std::vector<DeviceWorker*> workers() const;
  // Null until loaded.
  const Pipeline* pipeline() const { return pipeline_.get(); }
  const ServerConfig& config() const { return config_; }
  // What GET /metrics serves; any HTTP front may host Serialize() too.
  Metrics& metrics() { return *metrics_; }
  // The --metrics-listen port (0: no metrics listener).
  int metrics_port() const { return metrics_listener_ ? metrics_listener_->port() : 0; }

 private:
  void SetHealth(bool serving);
  // LoadAndServe's work without the state changes: engines, workers, pools, pipeline.
  Status Load();

  const ServerConfig config_;
  const EngineFactory factory_;
  const int cuda_device_count_;
  CheckpointChoice checkpoint_;

  // Cold-start milestones; before the service, which reads it and marks the first mask.
  std::unique_ptr<StartupTimes> startup_ = std::make_unique<StartupTimes>();
  // Before everything that records into it; the listener stops first in Shutdown.
  std::unique_ptr<Metrics> metrics_ = std::make_unique<Metrics>();
  std::unique_ptr<MetricsListener> metrics_listener_;
  std::unique_ptr<MaskService> service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<HttpFront> http_front_;
  int port_ = 0;
  std::string address_;

  std::unique_ptr<ThreadPool> decode_pool_, post_pool_, generate_pool_;
  std::vector<std::unique_ptr<DeviceWorker>> workers_;
  std::unique_ptr<Router> router_;
  std::unique_ptr<Pipeline> pipeline_;

  // Guards the shutdown sequence (shutting_down_, down_) and loading_: while LoadAndServe builds
  // the workers, pools and pipeline, Shutdown leaves them alone (LoadAndServe then sees
  // shutting_down_ and stops; the destructor stops what it built).
  std::mutex shutdown_mu_;
  std::condition_variable down_cv_;
  bool shutting_down_ = false, down_ = false, loading_ = false;
};

}  // namespace maskd::server
