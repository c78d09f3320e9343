#include "server/config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

namespace maskd::server {
namespace {

// The flag's choices: "auto" and the enum table's names (model/api/enums.h).
template <typename E, size_t N>
std::vector<std::string> WithAuto(const std::array<EnumEntry<E>, N>& table) {
  std::vector<std::string> names = {"auto"};
  for (const auto& e : table)
    if (std::string_view(e.name) != "auto") names.push_back(e.name);
  return names;
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::optional<bool> ParseBool(const std::string& text) {
  const std::string s = Lower(text);
  if (s == "1" || s == "true" || s == "on" || s == "yes") return true;
  if (s == "0" || s == "false" || s == "off" || s == "no") return false;
  return std::nullopt;
}

std::string EnvName(const std::string& flag) {
  std::string e = "MASKD_";
  for (char c : flag) e.push_back(c == '-' ? '_' : static_cast<char>(std::toupper(c)));
  return e;
}

std::string HumanBytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  uint64_t v = b;
  while (u < 4 && v >= 1024 && v % 1024 == 0) {
    v /= 1024;
    ++u;
  }
  return std::to_string(v) + units[u];
}

// --- Security (issue #14): kept in a block of its own so that it merges apart from other options.
void AddSecurityOptions(CLI::App& app, ServerConfig& c, const CLI::Validator& boolean_word) {
  auto env = [](CLI::Option* o, const std::string& name) { return o->envname(EnvName(name)); };
  auto* g = "Security";
  env(app.add_option("--tls-cert", c.tls_cert,
                     "PEM certificate chain of the gRPC port; with --tls-key, the port speaks TLS "
                     "only (plaintext clients fail). Off unless given")
          ->type_name("PATH")
          ->group(g),
      "tls-cert");
  env(app.add_option("--tls-key", c.tls_key, "PEM private key of --tls-cert (unencrypted)")
          ->type_name("PATH")
          ->group(g),
      "tls-key");
  env(app.add_option("--tls-client-ca", c.tls_client_ca,
                     "PEM CA certificate(s): require every client to present a certificate signed by "
                     "them (mutual TLS). Needs --tls-cert")
          ->type_name("PATH")
          ->group(g),
      "tls-client-ca");
  env(app.add_option("--auth-tokens", c.auth_tokens,
                     "File of accepted bearer tokens, one per line ('#' comments, blank lines "
                     "skipped), read at start; every call must carry 'authorization: Bearer "
                     "<token>' or gets UNAUTHENTICATED. A line may name the token's cache scope: "
                     "'TOKEN scope=NAME' (NAME: 1..64 of [A-Za-z0-9._-]); a bare TOKEN gets a "
                     "scope of its own. Embeddings and results are seen only within their scope "
                     "(NOT_FOUND elsewhere). Needs --tls-cert (tokens are not sent in plaintext). "
                     "The HTTP front checks the same tokens")
          ->type_name("PATH")
          ->group(g),
      "auth-tokens");
  env(app.add_option("--auth-exempt-health", c.auth_exempt_health,
                     "With --auth-tokens: grpc.health.v1 answers without a token, so that load "
                     "balancers can probe")
          ->check(boolean_word)
          ->type_name("BOOL")
          ->capture_default_str()
          ->group(g),
      "auth-exempt-health");
  env(app.add_option("--auth-shared-cache", c.auth_shared_cache,
                     "With --auth-tokens: one embedding cache and result store for every token, as "
                     "without authentication (image_ids and result_ids of one token then work for "
                     "all; off: per scope, see --auth-tokens)")
          ->check(boolean_word)
          ->type_name("BOOL")
          ->capture_default_str()
          ->group(g),
      "auth-shared-cache");
  env(app.add_option("--reflection", c.reflection,
                     "gRPC server reflection (lets grpcurl list and call the API without the .proto)")
          ->check(boolean_word)
          ->type_name("BOOL")
          ->capture_default_str()
          ->group(g),
      "reflection");
}

// Flags that belong together; file contents are checked at start (security.cc), not here, so that
// --help and config tests never touch the files.
Status ValidateSecurityConfig(const ServerConfig& c) {
  if (c.tls_cert.empty() != c.tls_key.empty()) {
    return InvalidArgument(c.tls_cert.empty()
                               ? "--tls-key = \"" + c.tls_key + "\" without --tls-cert (expected both or neither)"
                               : "--tls-cert = \"" + c.tls_cert + "\" without --tls-key (expected both or neither)");
  }
  if (!c.tls_client_ca.empty() && c.tls_cert.empty()) {
    return InvalidArgument("--tls-client-ca = \"" + c.tls_client_ca +
                           "\" without --tls-cert/--tls-key (mutual TLS needs the server's TLS "
                           "certificate too)");
  }
  if (!c.auth_tokens.empty() && c.tls_cert.empty()) {
    return InvalidArgument("--auth-tokens = \"" + c.auth_tokens +
                           "\" without --tls-cert/--tls-key (bearer tokens are accepted over TLS "
                           "only: in plaintext anyone on the path could read and replay them)");
  }
  return Status::Ok();
}

// The option table: every setting, its flag, environment variable and JSON key.
void AddOptions(CLI::App& app, ServerConfig& c) {
  auto env = [](CLI::Option* o, const std::string& name) { return o->envname(EnvName(name)); };
  auto bytes = [&](const std::string& name, uint64_t* target, const std::string& help) {
    env(app.add_option_function<std::string>(
                "--" + name,
                [target, name](const std::string& v) {
                  StatusOr<uint64_t> b = ParseBytes(v);
                  if (!b.ok()) throw CLI::ValidationError("--" + name, b.status().message());
                  *target = *b;
                },
                help)
            ->default_str(HumanBytes(*target))
            ->type_name("BYTES"),
        name);
  };
  // Most settings: a flag and its environment variable under one name, a range check and the
  // default shown in --help.
  auto ranged = [&](const std::string& name, auto& field, const std::string& help,
                    const CLI::Validator& check, const char* group) {
    env(app.add_option("--" + name, field, help)->check(check)->capture_default_str()->group(group), name);
  };
  auto tristate = [&](const std::string& name, std::optional<bool>* target, const std::string& help) {
    env(app.add_option_function<std::string>(
                "--" + name,
                [target, name](const std::string& v) {
                  std::optional<bool> b = ParseBool(v);
                  if (!b) throw CLI::ValidationError("--" + name, "\"" + v + "\" is not true or false");
                  *target = *b;
                },
                help)
            ->type_name("BOOL")
            ->default_str("as --fast says"),
        name);
  };

  app.add_option("--config", c.config_file,
                 "JSON file of settings; keys are these flags' names, e.g. "
                 "{\"device\": \"cuda\", \"cache-device-bytes\": \"4GiB\"}. Flags and MASKD_* "
                 "environment variables override it")
      ->envname("MASKD_CONFIG")
      ->type_name("PATH");

  auto* g_model = "Model";
  env(app.add_option("--checkpoint", c.checkpoint,
                     "SAM checkpoint (.pth or .safetensors; vit_b/l/h). Unset: $MASKD_CHECKPOINT, "
                     "else the only checkpoint in --models-dir, else a built-in demo model with "
                     "random weights")
          ->type_name("PATH")
          ->group(g_model),
      "checkpoint");
  env(app.add_option("--models-dir", c.models_dir,
                     "Folder searched for a single *.pth/*.safetensors when --checkpoint is unset")
          ->type_name("DIR")
          ->capture_default_str()
          ->group(g_model),
      "models-dir");
  env(app.add_option("--demo-seed", c.demo_seed, "Seed of the demo model's random weights")
          ->capture_default_str()
          ->group(g_model),
      "demo-seed");

  auto* g_dev = "Devices and numerics";
  env(app.add_option("--device", c.device,
                     "Devices, comma separated: auto (every visible GPU, else cpu), cpu, cuda (every "
                     "visible GPU), cuda:N, or cpu:N for several CPU engines. One engine, batcher "
                     "pair and cache per device")
          ->type_name("LIST")
          ->capture_default_str()
          ->group(g_dev),
      "device");
  env(app.add_option("--precision", c.precision,
                     "auto (bf16 on CUDA, fp32 on CPU), " + EnumNames(kPrecisions))
          ->check(CLI::IsMember(WithAuto(kPrecisions)))
          ->capture_default_str()
          ->group(g_dev),
      "precision");
  env(app.add_option("--fast", c.fast,
                     "Encoder/decoder fast path preset: auto (all CUDA optimisations except fp8 on "
                     "CUDA, none on CPU), on, off. The switches below "
                     "override single parts")
          ->check(CLI::IsMember({"auto", "on", "off"}))
          ->capture_default_str()
          ->group(g_dev),
      "fast");
  env(app.add_option("--attention", c.attention,
                     "Encoder attention: " + EnumNames(kAttentionImpls) + " (default: as --fast says)")
          ->check(CLI::IsMember(WithAuto(kAttentionImpls)))
          ->type_name("NAME")
          ->group(g_dev),
      "attention");
  tristate("cuda-graphs", &c.cuda_graphs, "Replay the encoder from CUDA graphs (captured at each batch size)");
  tristate("fp8", &c.fp8, "fp8 (e4m3, row-wise scales) encoder linears on Hopper; bf16 precision only");
  tristate("gpu-preprocess", &c.gpu_preprocess, "Resize/normalise/pad on the GPU");
  tristate("gpu-postprocess", &c.gpu_postprocess, "Upscale/threshold/RLE masks on the GPU");
  tristate("gpu-rle-string", &c.gpu_rle_string,
           "With --gpu-postprocess, also make COCO's RLE string on the GPU, so the host only copies "
           "bytes (default: on with the fast path)");
  tristate("decoder-priority", &c.decoder_priority,
           "Run mask decoding and post-processing on high-priority CUDA streams, the encoder on normal "
           "ones (default: off; measured slower for batch throughput, see BENCHMARKS.md run 14)");
  tristate("gemm-tuning", &c.gemm_tuning,
           "Choose each encoder GEMM's cuBLASLt algorithm by timing its candidates at warm-up (default: "
           "on with the fast path; off: LibTorch's choice, the same algorithm on every start)");
  tristate("attention-timing", &c.attention_timing,
           "Time the global blocks' attention at each encoder batch size at start-up, the fused kernel "
           "against cuDNN's with the rel-pos terms folded into q/k, and keep the faster (default: on with "
           "the fast path; off: the fused kernel everywhere)");
  for (const char* n : {"cuda-graphs", "fp8", "gpu-preprocess", "gpu-postprocess", "gpu-rle-string",
                        "decoder-priority", "gemm-tuning", "attention-timing"}) {
    app.get_option(std::string("--") + n)->group(g_dev);
  }
  // Retired options stay in the table (flag, MASKD_* variable, config-file key), hidden from --help,
  // so that a deployment still asking for one is refused with the reason, not with CLI11's bare
  // "extra arguments" or a file key that silently means nothing. Any value is refused, false too:
  // the line has to go.
  auto retired = [&](const std::string& name, const std::string& why) {
    env(app.add_option("--" + name,
                       [name, why](const CLI::results_t&) -> bool {
                         throw CLI::ValidationError("--" + name + " was retired " + why);
                       })
            ->expected(0, 1)
            ->group(""),
        name);
  };
  retired("int8",
          "(int8 dynamic quantisation of the encoder: slower than bf16 on the H200, see "
          "BENCHMARKS.md); use --fp8 for a quantised encoder");
  retired("sparse24",
          "(2:4 sparsity of the encoder: slower than dense bf16 on the H200 and not exact enough, see "
          "BENCHMARKS.md); use --fp8 for a faster quantised encoder");
  // CLI11 alone reads any number as a bool ("--warmup 2" = true): a typo must not pass silently.
  const CLI::Validator boolean_word(
      [](std::string& v) -> std::string {
        return ParseBool(v) ? std::string()
                            : "\"" + v + "\" is not a boolean (expected true, false, 1, 0, on, off, "
                                          "yes or no)";
      },
      "BOOL");
  auto boolean = [&](const std::string& name, bool& field, const std::string& help, const char* group) {
    env(app.add_option("--" + name, field, help)
            ->check(boolean_word)
            ->type_name("BOOL")
            ->capture_default_str()
            ->group(group),
        name);
  };
  boolean("warmup", c.warmup,
          "Warm every prepared shape up before serving (health stays NOT_SERVING until then)", g_dev);
  boolean("require-checkpoint", c.require_checkpoint,
          "Refuse to start when no checkpoint is found, instead of serving the built-in demo model "
          "with random weights (for deployments: a missing mount fails loudly)",
          g_model);

  auto* g_net = "Network";
  env(app.add_option("--listen", c.listen,
                     "HOST:PORT to serve on; port 0 picks a free port (logged as 'listening on "
                     "HOST:PORT')")
          ->type_name("HOST:PORT")
          ->capture_default_str()
          ->group(g_net),
      "listen");
  env(app.add_option("--http-listen", c.http_listen,
                     "HOST:PORT for the HTTP/JSON API (POST /v1/embed, POST /v1/segment, GET /v1/info: "
                     "the proto3 JSON mapping of the gRPC calls, same validation and limits) and the "
                     "web page at / (click to segment); port 0 picks a free port (logged as 'HTTP front "
                     "listening on HOST:PORT'). Off unless given. No TLS: bind it to localhost or put it "
                     "behind a proxy; with --auth-tokens its /v1 routes need the same bearer token")
          ->type_name("HOST:PORT")
          ->group(g_net),
      "http-listen");
  env(app.add_option("--metrics-listen", c.metrics_listen,
                     "HOST:PORT serving Prometheus metrics at GET /metrics (text exposition format); "
                     "port 0 picks a free port (logged as 'metrics on HOST:PORT'); empty: off")
          ->type_name("HOST:PORT")
          ->capture_default_str()
          ->group(g_net),
      "metrics-listen");

  auto* g_batch = "Batching (per device)";
  ranged("encoder-max-batch", c.encoder_max_batch, "Images per encoder batch", CLI::Range(1, 1024), g_batch);
  ranged("encoder-queue-delay-us", c.encoder_queue_delay_us,
         "Longest an image waits for its encoder batch to fill, microseconds",
         CLI::Range(int64_t{0}, int64_t{10'000'000}), g_batch);
  ranged("encoder-queue-capacity", c.encoder_queue_capacity,
         "Images queued for the encoder before RESOURCE_EXHAUSTED", CLI::Range(1, 1'000'000), g_batch);
  ranged("decoder-max-prompts", c.decoder_max_prompts,
         "Prompts per mask-decoder batch (from any requests and images)", CLI::Range(1, 65536), g_batch);
  ranged("decoder-request-prompts", c.decoder_request_prompts,
         "Most prompts of one request in one mask-decoder batch; bigger requests run in "
         "parts that take turns with other requests' prompts (fairness, cancellation)",
         CLI::Range(1, 65536), g_batch);
  ranged("decoder-queue-delay-us", c.decoder_queue_delay_us,
         "Longest a prompt waits for its decoder batch to fill, microseconds",
         CLI::Range(int64_t{0}, int64_t{10'000'000}), g_batch);
  env(app.add_option("--decoder-launch-when-idle", c.decoder_launch_when_idle,
                     "A prompt that finds the decoder idle runs at once; --decoder-queue-delay-us "
                     "then applies only while a decoder batch is running (under load)")
          ->check(boolean_word)
          ->capture_default_str()
          ->group(g_batch),
      "decoder-launch-when-idle");
  env(app.add_option("--gpu-turns", c.gpu_turns,
                     "Encoder and decoder batches take turns on the device (one kind of work on the GPU "
                     "at a time) instead of overlapping on two streams; for batch throughput, not yet measured on "
                     "a GPU (BENCHMARKS.md)")
          ->check(boolean_word)
          ->capture_default_str()
          ->group(g_batch),
      "gpu-turns");
  ranged("decoder-queue-capacity", c.decoder_queue_capacity,
         "Prompts queued for the decoder before RESOURCE_EXHAUSTED", CLI::Range(1, 100'000'000), g_batch);

  auto* g_mem = "Memory (per device)";
  bytes("cache-device-bytes", &c.cache_device_bytes,
        "Embedding cache in device memory (on CPU engines: RAM, the only tier)");
  bytes("cache-host-bytes", &c.cache_host_bytes,
        "Embedding cache tier in host memory behind the device tier (GPU engines only)");
  bytes("result-store-bytes", &c.result_store_bytes,
        "Stored low-res logits of recent results, for MaskInput.result_id");
  bytes("gpu-memory-limit-bytes", &c.gpu_memory_limit_bytes,
        "Most memory maskd's allocator may hold on each GPU (weights, CUDA graphs, cached embeddings, "
        "activations; not the CUDA context). A batch that does not fit is split in halves and retried; "
        "what does not fit alone gets RESOURCE_EXHAUSTED. 0: no limit; else at least 256MiB. Ignored on CPU");
  for (const char* n : {"cache-device-bytes", "cache-host-bytes", "result-store-bytes", "gpu-memory-limit-bytes"}) {
    app.get_option(std::string("--") + n)->group(g_mem);
  }
  bytes("max-inflight-bytes", &c.max_inflight_bytes,
        "Memory that accepted, unfinished requests may hold (images as sent, decoded and resized; "
        "mask inputs), whole server; a request that does not fit gets RESOURCE_EXHAUSTED at once");
  app.get_option("--max-inflight-bytes")->group("Memory (whole server)");
  env(app.add_option("--malloc-tuning", c.malloc_tuning,
                     "Keep freed heap memory for reuse (glibc: trim threshold 256MiB, mmap threshold "
                     "32MiB) instead of returning it to the kernel after every response: fewer page "
                     "faults per call, more resident memory; false: glibc's defaults (or GLIBC_TUNABLES)")
          ->check(boolean_word)
          ->capture_default_str()
          ->group("Memory (whole server)"),
      "malloc-tuning");

  auto* g_thr = "Threads";
  ranged("decode-threads", c.decode_threads,
         "Threads hashing, decoding and resizing images (0: half the cores, at least 2)",
         CLI::Range(0, 1024), g_thr);
  ranged("decode-queue-capacity", c.decode_queue_capacity,
         "Requests waiting for a decode thread before RESOURCE_EXHAUSTED", CLI::Range(1, 1'000'000), g_thr);
  ranged("postprocess-threads", c.postprocess_threads,
         "Threads post-processing masks and building responses (0: half the cores, at "
         "least 2)",
         CLI::Range(0, 1024), g_thr);

  ranged("generate-threads", c.generate_threads,
         "GenerateMasks calls running at once (each runs the generator loop and waits for "
         "its point batches in the shared decoder batches)",
         CLI::Range(1, 1024), g_thr);
  ranged("generate-queue-capacity", c.generate_queue_capacity,
         "GenerateMasks calls waiting for a generation thread before RESOURCE_EXHAUSTED",
         CLI::Range(1, 1'000'000), g_thr);
  ranged("spin-wait-us", c.spin_wait_us,
         "Microseconds a decode or post-processing thread, or a device's encoder/decoder batcher, "
         "that has just finished work polls for the next before it sleeps: saves a thread wake-up "
         "per hand-over of a request (tens of microseconds on a VM) for CPU time; 0: off",
         CLI::Range(0, 100'000), g_thr);

  auto* g_lim = "Request limits";
  bytes("max-image-bytes", &c.max_image_bytes, "Largest encoded image accepted");
  app.get_option("--max-image-bytes")->group(g_lim);
  ranged("max-image-pixels", c.max_image_pixels,
         "Largest decoded width * height", CLI::Range(uint64_t{1}, uint64_t{268'435'456}), g_lim);
  ranged("max-prompts-per-request", c.max_prompts_per_request,
         "Prompts in one Segment request or stream message", CLI::Range(1u, 65536u), g_lim);
  ranged("max-points-per-prompt", c.max_points_per_prompt,
         "Points in one prompt", CLI::Range(1u, 4096u), g_lim);
  ranged("max-generate-points-per-side", c.max_generate_points_per_side,
         "GenerateMasks: largest params.points_per_side", CLI::Range(1, 1024), g_lim);
  ranged("max-generate-grid-points", c.max_generate_grid_points,
         "GenerateMasks: most grid points over all crop layers (points_per_side^2 per "
         "layer, or the explicit point_grids)",
         CLI::Range(1, 1'048'576), g_lim);
  ranged("max-generate-points-per-batch", c.max_generate_points_per_batch,
         "GenerateMasks: largest params.points_per_batch", CLI::Range(1, 65536), g_lim);
  ranged("max-generate-crop-layers", c.max_generate_crop_layers,
         "GenerateMasks: largest params.crop_n_layers (layer i encodes 4^i crops)", CLI::Range(0, 8), g_lim);
  ranged("max-generate-downscale-factor", c.max_generate_downscale_factor,
         "GenerateMasks: largest params.crop_n_points_downscale_factor", CLI::Range(1, 64), g_lim);

  auto* g_log = "Logging and lifecycle";
  env(app.add_option("--log-level", c.log_level, "trace, debug, info, warn, error, critical or off")
          ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}))
          ->capture_default_str()
          ->group(g_log),
      "log-level");
  env(app.add_option("--log-format", c.log_format,
                     "text (one readable line per event) or json (one JSON object per line: ts, "
                     "level, thread, request_id or request_ids, msg; for log shippers)")
          ->check(CLI::IsMember({"text", "json"}))
          ->capture_default_str()
          ->group(g_log),
      "log-format");
  boolean("access-log", c.access_log, "One log line per call", g_log);
  ranged("shutdown-grace-s", c.shutdown_grace_s,
         "On SIGINT/SIGTERM: seconds in-flight calls may take to finish before they are "
         "cancelled",
         CLI::Range(0.0, 3600.0), g_log);
  AddSecurityOptions(app, c, boolean_word);
}

void Describe(CLI::App& app) {
  app.description(
      "maskd: Segment Anything (SAM) masks over gRPC (maskd.v1.MaskService, grpc.health.v1, "
      "server reflection).");
  app.footer(
      "Every flag can also be set by the environment variable shown (Env:) or by the JSON file "
      "of --config; precedence: flag > environment > file > default.\n"
      "Checkpoints: https://github.com/facebookresearch/segment-anything#model-checkpoints");
  app.set_version_flag("--version", std::string("maskd ") + MASKD_VERSION + " (" +
                                        MASKD_GIT_REVISION + ")");
}

// JSON object -> argv-style tokens for the same option table.
StatusOr<std::vector<std::string>> JsonToArgs(const std::string& path) {
  std::ifstream in(path);
  if (!in) return InvalidArgument("--config = \"" + path + "\" cannot be opened");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    return InvalidArgument("--config = \"" + path + "\" is not valid JSON: " + e.what());
  }
  if (!j.is_object()) {
    return InvalidArgument("--config = \"" + path + "\" holds " + j.type_name() +
                           " (expected a JSON object of flag names to values)");
  }
  std::vector<std::string> args;
  for (auto it = j.begin(); it != j.end(); ++it) {
    std::string key = it.key();
    std::replace(key.begin(), key.end(), '_', '-');
    if (key == "config") {
      return InvalidArgument("--config = \"" + path + "\": key \"config\" (expected no nested config)");
    }
    const nlohmann::json& v = it.value();
    std::string value;
    if (v.is_string()) {
      value = v.get<std::string>();
    } else if (v.is_boolean()) {
      value = v.get<bool>() ? "true" : "false";
    } else if (v.is_number_integer() || v.is_number_unsigned()) {
      value = v.dump();
    } else if (v.is_number_float()) {
      std::ostringstream s;
      s << v.get<double>();
      value = s.str();
    } else {
      return InvalidArgument("--config = \"" + path + "\": key \"" + it.key() + "\" holds " +
                             v.type_name() + " (expected a string, number or boolean)");
    }
    args.push_back("--" + key + "=" + value);
  }
  return args;
}

// Flags and environment onto `config`. False when maskd should exit instead: `out` then holds the
// --help or --version text, or the error, and the exit code.
bool ParseFlags(int argc, const char* const* argv, ServerConfig& config, ConfigParseResult& out) {
  CLI::App app{"maskd", "maskd"};
  Describe(app);
  AddOptions(app, config);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::ostringstream o, err;
    out.exit = true;
    out.exit_code = app.exit(e, o, err);
    out.output = o.str() + err.str();
    return false;
  }
  return true;
}

}  // namespace

ConfigParseResult ParseConfig(int argc, const char* const* argv) {
  ConfigParseResult out;
  // Pass 1: flags and environment alone, to find --config (and to answer --help/--version or a bad
  // flag before anything is read).
  ServerConfig scratch;
  if (!ParseFlags(argc, argv, scratch, out)) return out;
  ServerConfig config;
  // Pass 2: the file onto the defaults.
  if (!scratch.config_file.empty()) {
    StatusOr<std::vector<std::string>> args = JsonToArgs(scratch.config_file);
    if (!args.ok()) {
      out.exit = true;
      out.exit_code = 2;
      out.output = args.status().message() + "\n";
      return out;
    }
    CLI::App app{"maskd", "maskd"};
    AddOptions(app, config);
    std::vector<std::string> reversed(args->rbegin(), args->rend());
    try {
      app.parse(reversed);
    } catch (const CLI::ParseError& e) {
      out.exit = true;
      out.exit_code = 2;
      out.output = "--config = \"" + scratch.config_file + "\": " + e.what() + "\n";
      return out;
    }
  }
  // Pass 3: environment and flags over the file.
  if (!ParseFlags(argc, argv, config, out)) return out;
  config.config_file = scratch.config_file;
  if (!config.checkpoint.empty()) {
    bool flag = false;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--checkpoint" || a.rfind("--checkpoint=", 0) == 0) flag = true;
    }
    const char* env = std::getenv("MASKD_CHECKPOINT");
    config.checkpoint_origin = flag                      ? "--checkpoint"
                               : (env != nullptr && *env) ? "$MASKD_CHECKPOINT"
                                                          : "\"checkpoint\" of --config " + config.config_file;
  }
  if (Status s = ValidateConfig(config); !s.ok()) {
    out.exit = true;
    out.exit_code = 2;
    out.output = s.message() + "\n";
    return out;
  }
  out.config = std::move(config);
  return out;
}

Status ValidateConfig(const ServerConfig& c) {
  struct NonZero {
    const char* flag;
    uint64_t value;
    const char* why;
  };
  for (const NonZero& n : {
           NonZero{"--max-image-bytes", c.max_image_bytes, "no image could be sent"},
           NonZero{"--cache-device-bytes", c.cache_device_bytes,
                   "no embedding could be kept, so no image could be segmented"},
           NonZero{"--result-store-bytes", c.result_store_bytes,
                   "every result_id would be unknown at once"},
           NonZero{"--max-inflight-bytes", c.max_inflight_bytes,
                   "only one image request at a time would be accepted"},
       }) {
    if (n.value == 0) {
      return InvalidArgument(std::string(n.flag) + " = 0 (expected at least 1 byte; with 0 " + n.why +
                             ")");
    }
  }
  if (c.gpu_memory_limit_bytes != 0 && c.gpu_memory_limit_bytes < (uint64_t{256} << 20)) {
    return InvalidArgument("--gpu-memory-limit-bytes = " + std::to_string(c.gpu_memory_limit_bytes) +
                           " (expected 0 for no limit, or at least 256MiB: less cannot hold a SAM model)");
  }
  // Written so that NaN fails too (every comparison with NaN is false).
  if (!(c.shutdown_grace_s >= 0.0 && c.shutdown_grace_s <= 3600.0)) {
    std::ostringstream v;
    v << c.shutdown_grace_s;
    return InvalidArgument("--shutdown-grace-s = " + v.str() +
                           " (expected a number of seconds, 0 .. 3600)");
  }
  if (!c.http_listen.empty()) {
    if (StatusOr<std::pair<std::string, int>> l = ParseListen(c.http_listen, "--http-listen"); !l.ok()) {
      return l.status();
    }
  }
  if (!c.metrics_listen.empty()) {
    if (StatusOr<std::pair<std::string, int>> m = ParseListen(c.metrics_listen, "--metrics-listen"); !m.ok()) {
      return m.status();
    }
  }
  if (c.log_format != "text" && c.log_format != "json") {
    return InvalidArgument("--log-format = \"" + c.log_format + "\" (expected text or json)");
  }
  MASKD_RETURN_IF_ERROR(ValidateSecurityConfig(c));
  return Status::Ok();
}

StatusOr<std::pair<std::string, int>> ParseListen(const std::string& listen, const std::string& flag) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == listen.size()) {
    return InvalidArgument(flag + " = \"" + listen + "\" (expected HOST:PORT, e.g. 0.0.0.0:50051)");
  }
  std::string host = listen.substr(0, colon);
  const std::string port_text = listen.substr(colon + 1);
  if (!std::all_of(port_text.begin(), port_text.end(), [](unsigned char c) { return std::isdigit(c); }) ||
      port_text.size() > 5) {
    return InvalidArgument(flag + " = \"" + listen + "\": port \"" + port_text +
                           "\" (expected 0 .. 65535)");
  }
  const int port = std::stoi(port_text);
  if (port > 65535) {
    return InvalidArgument(flag + " = \"" + listen + "\": port " + port_text +
                           " (expected 0 .. 65535)");
  }
  return std::make_pair(host, port);
}

StatusOr<uint64_t> ParseBytes(const std::string& text) {
  std::string s;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c))) s.push_back(c);
  }
  size_t end = 0;
  while (end < s.size() && (std::isdigit(static_cast<unsigned char>(s[end])) || s[end] == '.')) ++end;
  if (end == 0) {
    return InvalidArgument("\"" + text + "\" is not a size (expected e.g. 1073741824, 512MiB, 2GiB)");
  }
  double number = 0;
  try {
    number = std::stod(s.substr(0, end));
  } catch (...) {
    return InvalidArgument("\"" + text + "\" is not a size (expected e.g. 1073741824, 512MiB, 2GiB)");
  }
  const std::string unit = Lower(s.substr(end));
  double scale = 1;
  if (unit.empty() || unit == "b") {
    scale = 1;
  } else if (unit == "k" || unit == "ki" || unit == "kib") {
    scale = 1024.0;
  } else if (unit == "m" || unit == "mi" || unit == "mib") {
    scale = 1024.0 * 1024;
  } else if (unit == "g" || unit == "gi" || unit == "gib") {
    scale = 1024.0 * 1024 * 1024;
  } else if (unit == "t" || unit == "ti" || unit == "tib") {
    scale = 1024.0 * 1024 * 1024 * 1024;
  } else if (unit == "kb") {
    scale = 1e3;
  } else if (unit == "mb") {
    scale = 1e6;
  } else if (unit == "gb") {
    scale = 1e9;
  } else if (unit == "tb") {
    scale = 1e12;
  } else {
    return InvalidArgument("\"" + text + "\" has unit \"" + s.substr(end) +
                           "\" (expected B, KiB, MiB, GiB, TiB, K, M, G, T, KB, MB, GB or TB)");
  }
  const double bytes = number * scale;
  if (!std::isfinite(bytes) || bytes > 1.8e19) {
    return InvalidArgument("\"" + text + "\" is too large (expected at most 16 EiB)");
  }
  return static_cast<uint64_t>(std::llround(bytes));
}

StatusOr<std::vector<DeviceSpec>> ParseDevices(const std::string& device, int cuda_device_count) {
  std::vector<std::string> parts;
  std::stringstream ss(device);
  std::string part;
  while (std::getline(ss, part, ',')) {
    part.erase(std::remove_if(part.begin(), part.end(), [](unsigned char c) { return std::isspace(c); }),
               part.end());
    if (!part.empty()) parts.push_back(Lower(part));
  }
  if (parts.empty()) {
    return InvalidArgument("--device = \"" + device + "\" names no device (expected e.g. cpu, cuda, "
                           "cuda:0,cuda:1)");
  }
  std::vector<DeviceSpec> out;
  std::set<std::string> seen;
  const bool unknown = cuda_device_count < 0;
  auto add_cuda = [&](int n) -> Status {
    if (!unknown && (n < 0 || n >= cuda_device_count)) {
      return InvalidArgument("--device = \"" + device + "\": cuda:" + std::to_string(n) +
                             " is not visible (expected cuda:0 .. cuda:" +
                             std::to_string(cuda_device_count - 1) + "; " +
                             std::to_string(cuda_device_count) + " CUDA devices visible)");
    }
    out.push_back({"cuda:" + std::to_string(n), "cuda:" + std::to_string(n), true});
    return Status::Ok();
  };
  for (const std::string& p : parts) {
    if (p == "auto") {
      if (parts.size() != 1) {
        return InvalidArgument("--device = \"" + device + "\": auto must stand alone");
      }
      if (cuda_device_count > 0) {
        for (int i = 0; i < cuda_device_count; ++i) MASKD_RETURN_IF_ERROR(add_cuda(i));
      } else {
        out.push_back({"cpu", "cpu", false});
      }
    } else if (p == "cpu") {
      out.push_back({"cpu", "cpu", false});
    } else if (p == "cuda" && unknown) {
      MASKD_RETURN_IF_ERROR(add_cuda(0));
    } else if (p == "cuda") {
      if (cuda_device_count < 1) {
        return InvalidArgument("--device = \"" + device + "\": cuda, but no CUDA device is visible "
                               "(expected cpu, or a machine with a GPU)");
      }
      for (int i = 0; i < cuda_device_count; ++i) MASKD_RETURN_IF_ERROR(add_cuda(i));
    } else if (p.rfind("cuda:", 0) == 0 || p.rfind("cpu:", 0) == 0) {
      const bool cuda = p[1] == 'u';
      const std::string num = p.substr(cuda ? 5 : 4);
      if (num.empty() || num.size() > 4 ||
          !std::all_of(num.begin(), num.end(), [](unsigned char c) { return std::isdigit(c); })) {
        return InvalidArgument("--device = \"" + device + "\": \"" + p +
                               "\" (expected cuda:N or cpu:N with a number N)");
      }
      const int n = std::stoi(num);
      if (cuda) {
        MASKD_RETURN_IF_ERROR(add_cuda(n));
      } else {
        out.push_back({"cpu:" + std::to_string(n), "cpu", false});
      }
    } else {
      return InvalidArgument("--device = \"" + device + "\": \"" + p +
                             "\" (expected auto, cpu, cpu:N, cuda or cuda:N)");
    }
  }
  for (const auto& d : out) {
    if (!seen.insert(d.label).second) {
      return InvalidArgument("--device = \"" + device + "\" names " + d.label +
                             " twice (expected each device once)");
    }
    if (d.cuda != out.front().cuda) {
      return InvalidArgument("--device = \"" + device + "\" mixes CPU and CUDA devices (expected one "
                             "kind: image ids depend on the numerics, so all engines must match)");
    }
  }
  return out;
}

StatusOr<CheckpointChoice> ResolveCheckpoint(const ServerConfig& config) {
  namespace fs = std::filesystem;
  CheckpointChoice c;
  if (!config.checkpoint.empty()) {
    const std::string what =
        config.checkpoint_origin.empty() ? std::string("--checkpoint") : config.checkpoint_origin;
    std::error_code ec;
    if (!fs::is_regular_file(config.checkpoint, ec)) {
      return InvalidArgument(what + " = \"" + config.checkpoint +
                             "\" is not a readable file (expected a SAM .pth or .safetensors "
                             "checkpoint)");
    }
    c.path = config.checkpoint;
    c.source = what;
    return c;
  }
  std::error_code ec;
  std::vector<std::string> found;
  if (fs::is_directory(config.models_dir, ec)) {
    for (const auto& entry : fs::directory_iterator(config.models_dir, ec)) {
      if (!entry.is_regular_file(ec)) continue;
      const std::string ext = Lower(entry.path().extension().string());
      if (ext == ".pth" || ext == ".safetensors") found.push_back(entry.path().string());
    }
  }
  std::sort(found.begin(), found.end());
  if (found.size() > 1) {
    std::string list;
    for (const auto& f : found) list += "\n  " + f;
    return FailedPrecondition("--models-dir = \"" + config.models_dir + "\" holds " +
                              std::to_string(found.size()) +
                              " checkpoints (expected one, or choose with --checkpoint):" + list);
  }
  if (found.size() == 1) {
    c.path = found.front();
    c.source = config.models_dir + "/ (its only checkpoint)";
    return c;
  }
  if (config.require_checkpoint) {
    return FailedPrecondition("no checkpoint found and --require-checkpoint refuses the demo model (expected "
                              "--checkpoint PATH, $MASKD_CHECKPOINT, or one *.pth/*.safetensors in --models-dir = \"" +
                              config.models_dir + "\")");
  }
  c.source = "demo";
  return c;
}

StatusOr<EngineOptions> MakeEngineOptions(const ServerConfig& config, const DeviceSpec& device,
                                          const CheckpointChoice& checkpoint) {
  EngineOptions o;
  o.checkpoint = checkpoint.path;
  o.device = device.engine_device;
  o.demo_seed = config.demo_seed;
  o.warmup = config.warmup;
  o.device_memory_limit_bytes = config.gpu_memory_limit_bytes;
  if (config.precision == "auto") {
    o.precision = device.cuda ? Precision::kBFloat16 : Precision::kFloat32;
  } else {
    StatusOr<Precision> p = ParsePrecision(config.precision);
    if (!p.ok()) return InvalidArgument("--precision: " + p.status().message());
    o.precision = *p;
  }
  if (config.fast == "on" || (config.fast == "auto" && device.cuda)) {
    o.fast = FastPathOptions::Fast();
  } else {
    o.fast = FastPathOptions{};
    if (config.fast == "off") o.fast.attention = AttentionImpl::kMath;
  }
  if (!config.attention.empty()) {
    StatusOr<AttentionImpl> a = ParseAttentionImpl(config.attention);
    if (!a.ok()) return InvalidArgument("--attention: " + a.status().message());
    o.fast.attention = *a;
  }
  if (config.cuda_graphs) o.fast.cuda_graphs = *config.cuda_graphs;
  if (config.fp8) o.fast.fp8 = *config.fp8;
  if (config.gpu_preprocess) o.fast.gpu_preprocess = *config.gpu_preprocess;
  if (config.gpu_postprocess) o.fast.gpu_postprocess = *config.gpu_postprocess;
  if (config.gpu_rle_string) o.fast.gpu_rle_string = *config.gpu_rle_string;
  if (config.decoder_priority) o.fast.decoder_priority = *config.decoder_priority;
  if (config.gemm_tuning) o.fast.gemm_tuning = *config.gemm_tuning;
  if (config.attention_timing) o.fast.attention_timing = *config.attention_timing;
  // Powers of two up to the maximum, and the maximum itself: what the encoder pads batches to.
  o.encoder_batch_sizes.clear();
  for (int b = 1; b < config.encoder_max_batch; b *= 2) o.encoder_batch_sizes.push_back(b);
  o.encoder_batch_sizes.push_back(config.encoder_max_batch);
  return o;
}

int ResolvedThreads(int configured) {
  if (configured > 0) return configured;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(2, cores / 2);
}

}  // namespace maskd::server
