// maskd's configuration: one struct with defaults, filled in one place (ParseConfig) from, in order of
// precedence, command-line flags, MASKD_* environment variables (the flag's name in upper case with
// '_' for '-': --cache-device-bytes -> MASKD_CACHE_DEVICE_BYTES) and an optional JSON file
// (--config; keys are the flag names, e.g. {"device": "cuda", "encoder-max-batch": 16}).
// All three go through the same option table, so they accept exactly the same names and values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/api/engine.h"
#include "model/api/limits.h"
#include "model/api/mask_generation.h"
#include "model/api/status.h"

namespace maskd::server {

struct ServerConfig {
  // Model.
  std::string checkpoint;              // empty: $MASKD_CHECKPOINT, the one file in models_dir, demo
  std::string models_dir = "models";   // searched for a single *.pth / *.safetensors
  uint64_t demo_seed = 0x5eed;
  bool require_checkpoint = false;     // refuse to start on the demo model

  // Devices and numerics.
  std::string device = "auto";     // auto | cpu | cuda | cuda:N | cpu:N, comma separated
  std::string precision = "auto";  // auto (bf16 on CUDA, fp32 on CPU) | fp32 | bf16 | fp16
  std::string fast = "auto";       // auto (FastPathOptions::Fast() on CUDA) | on | off
  std::string attention;           // empty: as `fast` says; else auto|math|sdpa|sdpa-folded|fused
  // (--int8 and --sparse24 were retired after run 17: refused with the reason, config.cc.)
  std::optional<bool> cuda_graphs, fp8, gpu_preprocess, gpu_postprocess, gpu_rle_string, decoder_priority,
      gemm_tuning, attention_timing;
  bool warmup = true;

  // Network.
  std::string listen = "0.0.0.0:50051";
  // The HTTP/JSON front and web page (server/http_front.h) on a port of its own; empty: off.
  std::string http_listen;
  // Prometheus text exposition at GET /metrics on this HOST:PORT; empty: no metrics listener.
  std::string metrics_listen;

  // Security (issue #14; server/security.h). TLS when tls_cert is set; mutual TLS with
  // tls_client_ca; bearer tokens with auth_tokens (TLS required: see security.h).
  std::string tls_cert, tls_key, tls_client_ca;
  std::string auth_tokens;          // file, one token per line; empty: no authentication
  bool auth_exempt_health = true;   // grpc.health.v1 answers without a token (load balancers)
  bool auth_shared_cache = false;   // with auth_tokens: one cache for every token (else per scope)
  bool reflection = true;           // gRPC server reflection (grpcurl without the .proto)

  // Batching (per device).
  int encoder_max_batch = 8;
  int64_t encoder_queue_delay_us = 2000;
  int encoder_queue_capacity = 64;
  // Prompts per decoder batch. 64 (the largest prompt count with a CUDA graph): served vit_b batch
  // mode on the H200 went from 241.6 img/s at 256 to 271.4 (0.90 of offline) at 64 (run 18), the
  // batches' activations fit in a quarter of the memory, and post-processing starts sooner.
  int decoder_max_prompts = 64;
  // The most prompts of one request in one decoder batch: a bigger request runs in parts that take
  // turns with other requests, so that a click never waits for a whole 256-prompt request, and a
  // cancelled or expired request stops at its next part.
  int decoder_request_prompts = 64;
  int64_t decoder_queue_delay_us = 500;
  // A prompt that finds the decoder idle runs at once; the queue delay applies only under load.
  bool decoder_launch_when_idle = true;
  int decoder_queue_capacity = 8192;
  // Encoder and decoder batches take turns on the device instead of overlapping on two streams
  // (server/gpu_turns.h).
  bool gpu_turns = false;

  // Memory (per device).
  uint64_t cache_device_bytes = uint64_t{2} << 30;
  uint64_t cache_host_bytes = uint64_t{8} << 30;
  uint64_t result_store_bytes = uint64_t{512} << 20;
  // The most GPU memory LibTorch's caching allocator may hold on each CUDA device (EngineOptions::
  // device_memory_limit_bytes); 0: no limit. Ignored on CPU devices.
  uint64_t gpu_memory_limit_bytes = 0;
  // Whole server: what accepted, unfinished requests may hold (server/byte_budget.h).
  uint64_t max_inflight_bytes = uint64_t{2} << 30;
  // glibc malloc keeps freed memory for reuse (server/malloc_tuning.h) instead of returning it to
  // the kernel after every response.
  bool malloc_tuning = true;

  // Threads (whole server). 0: half the cores, at least 2.
  int decode_threads = 0;
  int decode_queue_capacity = 256;
  int postprocess_threads = 0;
  // GenerateMasks: generator loops running at once (each waits for its decoder batches, so they
  // also bound how many generations share the decoders), and calls waiting for one.
  int generate_threads = 2;
  int generate_queue_capacity = 16;
  // How long a decode/post-processing thread or a batcher that has just finished work polls for the
  // next before it sleeps (server/spin_wait.h), microseconds; 0: not at all.
  int spin_wait_us = 0;

  // Request limits (reported in GetInfo.limits); the defaults are the api's (model/api/limits.h).
  uint64_t max_image_bytes = Limits{}.max_image_bytes;
  uint64_t max_image_pixels = Limits{}.max_image_pixels;
  uint32_t max_prompts_per_request = Limits{}.max_prompts_per_request;
  uint32_t max_points_per_prompt = Limits{}.max_points_per_prompt;
  // GenerateMasks' parameter bounds; defaults from the api (model/api/mask_generation.h).
  int max_generate_points_per_side = MaskGenerationLimits{}.max_points_per_side;
  int max_generate_grid_points = MaskGenerationLimits{}.max_grid_points;
  int max_generate_points_per_batch = MaskGenerationLimits{}.max_points_per_batch;
  int max_generate_crop_layers = MaskGenerationLimits{}.max_crop_n_layers;
  int max_generate_downscale_factor = MaskGenerationLimits{}.max_crop_n_points_downscale_factor;
  MaskGenerationLimits generation_limits() const {
    MaskGenerationLimits l;
    l.max_points_per_side = max_generate_points_per_side;
    l.max_grid_points = max_generate_grid_points;
    l.max_points_per_batch = max_generate_points_per_batch;
    l.max_crop_n_layers = max_generate_crop_layers;
    l.max_crop_n_points_downscale_factor = max_generate_downscale_factor;
    return l;
  }
  // The limits above as the api's struct (the rest at their defaults).
  Limits limits() const {
    Limits l;
    l.max_image_bytes = max_image_bytes;
    l.max_image_pixels = max_image_pixels;
    l.max_prompts_per_request = max_prompts_per_request;
    l.max_points_per_prompt = max_points_per_prompt;
    return l;
  }

  // Logging and lifecycle.
  std::string log_level = "info";  // trace | debug | info | warn | error | critical | off
  std::string log_format = "text";  // text | json (one object per line, for log shippers)
  bool access_log = true;
  double shutdown_grace_s = 10;

  std::string config_file;  // the JSON file that was read, if any
  // Where `checkpoint` came from: "--checkpoint", "$MASKD_CHECKPOINT", "--config file" (set by
  // ParseConfig, for the log line that says which model is served).
  std::string checkpoint_origin;
};

struct ConfigParseResult {
  ServerConfig config;
  // --help, --version or a bad flag: print `output` and exit with `exit_code`.
  bool exit = false;
  int exit_code = 0;
  std::string output;
};

// Flags > MASKD_* environment > --config JSON file > defaults. Ends with ValidateConfig.
ConfigParseResult ParseConfig(int argc, const char* const* argv);

// Settings that parse but would leave the API unusable (a zero byte limit, a NaN grace period):
// INVALID_ARGUMENT naming the flag, the value and what is expected. MaskServer checks it too.
Status ValidateConfig(const ServerConfig& config);

// "0.0.0.0:50051", "[::1]:0" -> host and port; INVALID_ARGUMENT naming `flag`.
StatusOr<std::pair<std::string, int>> ParseListen(const std::string& listen,
                                                  const std::string& flag = "--listen");

// "512MiB", "2GiB", "1.5G", "1000000" -> bytes (K/M/G/T and Ki/Mi/Gi/Ti are powers of 1024,
// KB/MB/GB/TB powers of 1000).
StatusOr<uint64_t> ParseBytes(const std::string& text);

struct DeviceSpec {
  std::string label;          // "cpu", "cpu:1", "cuda:0": names the worker in logs and GetInfo
  std::string engine_device;  // EngineOptions::device: "cpu" or "cuda:N"
  bool cuda = false;
};
// --device: "auto" = every visible GPU, else "cpu"; "cuda" = every visible GPU; "cpu:0,cpu:1" =
// several CPU engines (the multi-device code path without GPUs). One kind only, no duplicates.
// cuda_device_count < 0 means unknown: cuda is cuda:0, cuda:N is left to the engine, auto is cpu.
StatusOr<std::vector<DeviceSpec>> ParseDevices(const std::string& device, int cuda_device_count);

struct CheckpointChoice {
  std::string path;    // empty: the built-in demo model
  std::string source;  // "--checkpoint", "$MASKD_CHECKPOINT", "models/ (the only checkpoint)", "demo"
  bool demo() const { return path.empty(); }
};
// --checkpoint, else $MASKD_CHECKPOINT, else the file's "checkpoint" (all arrive in
// config.checkpoint, with checkpoint_origin), else the single *.pth/*.safetensors in models_dir
// (several: FAILED_PRECONDITION listing them), else the demo model.
StatusOr<CheckpointChoice> ResolveCheckpoint(const ServerConfig& config);

// EngineOptions for one device (precision/fast-path defaults depend on CUDA vs CPU).
StatusOr<EngineOptions> MakeEngineOptions(const ServerConfig& config, const DeviceSpec& device,
                                          const CheckpointChoice& checkpoint);

// The resolved thread counts (0 = half the cores, at least 2).
int ResolvedThreads(int configured);

}  // namespace maskd::server
