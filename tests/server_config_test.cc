// Configuration: defaults, precedence (flag > MASKD_* environment > --config file > default),
// --help, sizes, devices, checkpoint resolution, engine options.
#include <gtest/gtest.h>
#include <malloc.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "server/config.h"
#include "server/malloc_tuning.h"
#include "tests/scoped_env.h"

namespace maskd::server {
namespace {

namespace fs = std::filesystem;

ConfigParseResult Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "maskd");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return ParseConfig(static_cast<int>(argv.size()), argv.data());
}

using maskd::testing::ScopedEnv;

fs::path TempDir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("maskd_config_test_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

void Write(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

TEST(ServerConfig, DefaultsMatchTheDocumentedOnes) {
  auto r = Parse({});
  ASSERT_FALSE(r.exit) << r.output;
  const ServerConfig& c = r.config;
  EXPECT_EQ(c.listen, "0.0.0.0:50051");
  EXPECT_EQ(c.device, "auto");
  EXPECT_EQ(c.precision, "auto");
  EXPECT_EQ(c.max_image_bytes, 32u << 20);
  EXPECT_EQ(c.max_image_pixels, 64'000'000u);
  EXPECT_EQ(c.max_prompts_per_request, 256u);
  EXPECT_EQ(c.max_points_per_prompt, 64u);
  EXPECT_EQ(c.log_level, "info");
  EXPECT_TRUE(c.checkpoint.empty());
}

#ifdef __GLIBC__
// --malloc-tuning (on by default): an 8 MiB block comes from the heap, not a fresh mapping, and
// freeing it leaves the memory at the heap's top for the next call instead of trimming it.
TEST(ServerConfig, MallocTuningKeepsFreedMemoryForReuse) {
  EXPECT_TRUE(Parse({}).config.malloc_tuning);
  EXPECT_FALSE(Parse({"--malloc-tuning", "false"}).config.malloc_tuning);
  ASSERT_TRUE(TuneMallocForServing());
  const struct mallinfo2 before = mallinfo2();
  void* block = std::malloc(8 << 20);
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, 8 << 20);
  EXPECT_EQ(mallinfo2().hblkhd, before.hblkhd) << "the block was mmap'd";
  std::free(block);
  EXPECT_GE(mallinfo2().keepcost, size_t{8} << 20) << "the heap's top was trimmed";
}
#endif

TEST(ServerConfig, HelpDocumentsEveryFlagWithItsEnvironmentVariable) {
  auto r = Parse({"--help"});
  ASSERT_TRUE(r.exit);
  EXPECT_EQ(r.exit_code, 0);
  for (const char* flag :
       {"--checkpoint", "--models-dir", "--demo-seed", "--device", "--precision", "--fast", "--attention",
        "--cuda-graphs", "--fp8", "--gpu-preprocess", "--gpu-postprocess", "--gpu-rle-string", "--decoder-priority", "--gemm-tuning", "--attention-timing", "--warmup",
        "--require-checkpoint", "--listen", "--encoder-max-batch", "--encoder-queue-delay-us", "--encoder-queue-capacity",
        "--decoder-max-prompts", "--decoder-queue-delay-us", "--decoder-queue-capacity",
        "--cache-device-bytes", "--cache-host-bytes", "--result-store-bytes", "--decode-threads",
        "--decode-queue-capacity", "--postprocess-threads", "--max-image-bytes", "--max-image-pixels",
        "--max-prompts-per-request", "--max-points-per-prompt", "--log-level", "--access-log",
        "--shutdown-grace-s", "--config", "--version"}) {
    EXPECT_NE(r.output.find(flag), std::string::npos) << flag << " missing from --help:\n" << r.output;
  }
  EXPECT_NE(r.output.find("MASKD_CACHE_DEVICE_BYTES"), std::string::npos);
  EXPECT_NE(r.output.find("MASKD_CHECKPOINT"), std::string::npos);
  EXPECT_NE(r.output.find("segment-anything#model-checkpoints"), std::string::npos);
}

TEST(ServerConfig, RequireCheckpointIsABooleanFromFlagOrEnvironment) {
  EXPECT_FALSE(Parse({}).config.require_checkpoint);
  auto flag = Parse({"--require-checkpoint", "true"});
  ASSERT_FALSE(flag.exit) << flag.output;
  EXPECT_TRUE(flag.config.require_checkpoint);
  {
    ScopedEnv env("MASKD_REQUIRE_CHECKPOINT", "yes");
    auto from_env = Parse({});
    ASSERT_FALSE(from_env.exit) << from_env.output;
    EXPECT_TRUE(from_env.config.require_checkpoint);
  }
  auto typo = Parse({"--require-checkpoint", "2"});  // CLI11 alone would read 2 as true
  EXPECT_TRUE(typo.exit);
  EXPECT_NE(typo.exit_code, 0);
}

TEST(ServerConfig, FlagBeatsEnvironmentBeatsFileBeatsDefault) {
  const fs::path dir = TempDir("precedence");
  Write(dir / "maskd.json",
        R"({"device": "cpu:0,cpu:1", "encoder-max-batch": 4, "decoder_queue_delay_us": 750,
            "cache-device-bytes": "3GiB", "listen": "127.0.0.1:1", "access-log": false})");
  ScopedEnv env_listen("MASKD_LISTEN", "127.0.0.1:2");
  ScopedEnv env_batch("MASKD_ENCODER_MAX_BATCH", "6");
  auto r = Parse({"--config", (dir / "maskd.json").string(), "--encoder-max-batch", "16"});
  ASSERT_FALSE(r.exit) << r.output;
  const ServerConfig& c = r.config;
  EXPECT_EQ(c.encoder_max_batch, 16);           // flag over env over file
  EXPECT_EQ(c.listen, "127.0.0.1:2");           // env over file
  EXPECT_EQ(c.device, "cpu:0,cpu:1");           // file over default
  EXPECT_EQ(c.decoder_queue_delay_us, 750);     // file, key with underscores
  EXPECT_EQ(c.cache_device_bytes, 3ull << 30);  // sizes with units
  EXPECT_FALSE(c.access_log);
  EXPECT_EQ(c.decoder_max_prompts, 64);         // default
  EXPECT_EQ(c.config_file, (dir / "maskd.json").string());
}

// --int8 and --sparse24 were retired after run 17 (slower than bf16 on H200): a deployment that still
// asks for them, by flag, MASKD_* variable or config-file key, is refused with the reason and the
// alternative, not with CLI11's bare "extra arguments" nor silently ignored.
TEST(ServerConfig, RetiredInt8AndSparse24AreRefusedWithTheReason) {
  const fs::path dir = TempDir("retired");
  for (const std::string name : {"int8", "sparse24"}) {
    const std::string flag = "--" + name;
    auto expect_refused = [&](const ConfigParseResult& r, const std::string& how) {
      EXPECT_TRUE(r.exit) << how;
      EXPECT_NE(r.exit_code, 0) << how;
      EXPECT_NE(r.output.find(flag + " was retired"), std::string::npos) << how << ": " << r.output;
      EXPECT_NE(r.output.find("BENCHMARKS.md"), std::string::npos) << how << ": " << r.output;
      EXPECT_NE(r.output.find("use --fp8"), std::string::npos) << how << ": " << r.output;
    };
    expect_refused(Parse({flag}), flag + " alone");
    expect_refused(Parse({flag, "true", "--fp8", "on"}), flag + " true");
    expect_refused(Parse({"--device", "cpu", flag}), flag + " last");
    expect_refused(Parse({flag + "=false"}), flag + "=false");  // the line has to go, whatever it says
    {
      std::string env = "MASKD_";
      for (char ch : name) env.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(ch))));
      ScopedEnv e(env.c_str(), "1");
      expect_refused(Parse({}), env);
    }
    const fs::path file = dir / (name + ".json");
    Write(file, "{\"device\": \"cpu\", \"" + name + "\": true}");
    const auto from_file = Parse({"--config", file.string()});
    expect_refused(from_file, "config key \"" + name + "\"");
    EXPECT_NE(from_file.output.find(file.string()), std::string::npos) << from_file.output;
  }
  // Not offered any more.
  auto help = Parse({"--help"});
  EXPECT_EQ(help.output.find("--int8"), std::string::npos) << help.output;
  EXPECT_EQ(help.output.find("--sparse24"), std::string::npos) << help.output;
  // The quantised encoder that stays.
  auto fp8 = Parse({"--fp8", "true"});
  ASSERT_FALSE(fp8.exit) << fp8.output;
  EXPECT_EQ(fp8.config.fp8, std::optional<bool>(true));
}

TEST(ServerConfig, BadInputNamesTheSetting) {
  auto bad_flag = Parse({"--no-such-flag"});
  EXPECT_TRUE(bad_flag.exit);
  EXPECT_NE(bad_flag.exit_code, 0);
  auto bad_precision = Parse({"--precision", "fp8"});
  EXPECT_TRUE(bad_precision.exit);
  EXPECT_NE(bad_precision.output.find("--precision"), std::string::npos) << bad_precision.output;
  auto bad_size = Parse({"--cache-device-bytes", "12 parsecs"});
  EXPECT_TRUE(bad_size.exit);
  EXPECT_NE(bad_size.output.find("--cache-device-bytes"), std::string::npos) << bad_size.output;

  const fs::path dir = TempDir("bad");
  Write(dir / "unknown.json", R"({"encoder-max-batch": 2, "colour": "blue"})");
  auto unknown = Parse({"--config", (dir / "unknown.json").string()});
  EXPECT_TRUE(unknown.exit);
  EXPECT_NE(unknown.output.find("colour"), std::string::npos) << unknown.output;
  Write(dir / "broken.json", "{\"device\": ");
  auto broken = Parse({"--config", (dir / "broken.json").string()});
  EXPECT_TRUE(broken.exit);
  EXPECT_NE(broken.output.find("is not valid JSON"), std::string::npos) << broken.output;
  auto missing = Parse({"--config", (dir / "none.json").string()});
  EXPECT_TRUE(missing.exit);
  EXPECT_NE(missing.output.find("cannot be opened"), std::string::npos) << missing.output;
}

TEST(ServerConfig, Bytes) {
  EXPECT_EQ(*ParseBytes("1048576"), 1048576u);
  EXPECT_EQ(*ParseBytes("512MiB"), 512ull << 20);
  EXPECT_EQ(*ParseBytes("2GiB"), 2ull << 30);
  EXPECT_EQ(*ParseBytes("2 G"), 2ull << 30);
  EXPECT_EQ(*ParseBytes("1.5KiB"), 1536u);
  EXPECT_EQ(*ParseBytes("3GB"), 3'000'000'000u);
  EXPECT_EQ(*ParseBytes("0"), 0u);
  EXPECT_FALSE(ParseBytes("lots").ok());
  EXPECT_FALSE(ParseBytes("3 furlongs").ok());
}

TEST(ServerConfig, Listen) {
  auto a = ParseListen("0.0.0.0:50051");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->first, "0.0.0.0");
  EXPECT_EQ(a->second, 50051);
  auto b = ParseListen("[::1]:0");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->first, "[::1]");
  EXPECT_EQ(b->second, 0);
  EXPECT_FALSE(ParseListen("localhost").ok());
  EXPECT_FALSE(ParseListen("localhost:99999").ok());
  EXPECT_FALSE(ParseListen(":80").ok());
}

TEST(ServerConfig, Devices) {
  auto cpu = ParseDevices("cpu", 0);
  ASSERT_TRUE(cpu.ok());
  ASSERT_EQ(cpu->size(), 1u);
  EXPECT_EQ((*cpu)[0].label, "cpu");
  EXPECT_EQ((*cpu)[0].engine_device, "cpu");

  auto sim = ParseDevices("cpu:0, cpu:1", 0);
  ASSERT_TRUE(sim.ok());
  ASSERT_EQ(sim->size(), 2u);
  EXPECT_EQ((*sim)[1].label, "cpu:1");
  EXPECT_EQ((*sim)[1].engine_device, "cpu");  // simulated devices are all the CPU

  auto all = ParseDevices("cuda", 4);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 4u);
  EXPECT_EQ((*all)[3].label, "cuda:3");
  EXPECT_TRUE((*all)[3].cuda);
  auto auto_gpu = ParseDevices("auto", 2);
  ASSERT_TRUE(auto_gpu.ok());
  EXPECT_EQ(auto_gpu->size(), 2u);
  auto auto_cpu = ParseDevices("auto", 0);
  ASSERT_TRUE(auto_cpu.ok());
  EXPECT_EQ((*auto_cpu)[0].label, "cpu");
  auto pick = ParseDevices("cuda:1,cuda:0", 2);
  ASSERT_TRUE(pick.ok());
  EXPECT_EQ((*pick)[0].label, "cuda:1");

  // Unknown device count (an old model library): cuda means cuda:0.
  auto unknown = ParseDevices("cuda", -1);
  ASSERT_TRUE(unknown.ok());
  ASSERT_EQ(unknown->size(), 1u);
  EXPECT_EQ((*unknown)[0].label, "cuda:0");

  EXPECT_NE(ParseDevices("cuda:2", 2).status().message().find("cuda:2 is not visible"), std::string::npos);
  EXPECT_NE(ParseDevices("cuda", 0).status().message().find("no CUDA device is visible"),
            std::string::npos);
  EXPECT_NE(ParseDevices("cpu,cuda:0", 1).status().message().find("mixes CPU and CUDA"),
            std::string::npos);
  EXPECT_NE(ParseDevices("cpu:1,cpu:1", 0).status().message().find("names cpu:1 twice"),
            std::string::npos);
  EXPECT_NE(ParseDevices("tpu", 0).status().message().find("\"tpu\""), std::string::npos);
  EXPECT_FALSE(ParseDevices("", 0).ok());
}

TEST(ServerConfig, CheckpointResolution) {
  const fs::path dir = TempDir("models");
  ServerConfig c;
  c.models_dir = (dir / "models").string();
  // Nothing anywhere: the demo model.
  auto demo = ResolveCheckpoint(c);
  ASSERT_TRUE(demo.ok());
  EXPECT_TRUE(demo->demo());
  // ... unless the deployment asked for a real one.
  c.require_checkpoint = true;
  auto refused = ResolveCheckpoint(c);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("--require-checkpoint"), std::string::npos);
  EXPECT_NE(refused.status().message().find(c.models_dir), std::string::npos);
  c.require_checkpoint = false;

  // One checkpoint in models/: that one.
  fs::create_directories(dir / "models");
  Write(dir / "models" / "sam_vit_b.pth", "x");
  Write(dir / "models" / "notes.txt", "not a checkpoint");
  auto one = ResolveCheckpoint(c);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->path, (dir / "models" / "sam_vit_b.pth").string());
  c.require_checkpoint = true;  // a checkpoint was found: nothing to refuse
  auto required = ResolveCheckpoint(c);
  ASSERT_TRUE(required.ok()) << required.status().ToString();
  EXPECT_EQ(required->path, one->path);
  c.require_checkpoint = false;

  // Several: refuse and list them.
  Write(dir / "models" / "sam_vit_h.safetensors", "y");
  auto several = ResolveCheckpoint(c);
  ASSERT_FALSE(several.ok());
  EXPECT_EQ(several.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(several.status().message().find("sam_vit_b.pth"), std::string::npos);
  EXPECT_NE(several.status().message().find("sam_vit_h.safetensors"), std::string::npos);

  // An explicit one wins over models/.
  c.checkpoint = (dir / "models" / "sam_vit_h.safetensors").string();
  auto flag = ResolveCheckpoint(c);
  ASSERT_TRUE(flag.ok());
  EXPECT_EQ(flag->path, c.checkpoint);
  c.checkpoint = (dir / "missing.pth").string();
  auto missing = ResolveCheckpoint(c);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("is not a readable file"), std::string::npos);
}

TEST(ServerConfig, CheckpointFromEnvironmentIsReportedAsSuch) {
  const fs::path dir = TempDir("env");
  Write(dir / "a.pth", "x");
  ScopedEnv env("MASKD_CHECKPOINT", (dir / "a.pth").c_str());
  auto r = Parse({});
  ASSERT_FALSE(r.exit);
  EXPECT_EQ(r.config.checkpoint, (dir / "a.pth").string());
  EXPECT_EQ(r.config.checkpoint_origin, "$MASKD_CHECKPOINT");
  auto f = Parse({"--checkpoint", (dir / "b.pth").string()});
  EXPECT_EQ(f.config.checkpoint, (dir / "b.pth").string());
  EXPECT_EQ(f.config.checkpoint_origin, "--checkpoint");
}

TEST(ServerConfig, EngineOptionsPerDeviceKind) {
  ServerConfig c;
  c.encoder_max_batch = 6;
  CheckpointChoice ck;
  auto cpu = MakeEngineOptions(c, DeviceSpec{"cpu:1", "cpu", false}, ck);
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(cpu->device, "cpu");
  EXPECT_EQ(cpu->precision, Precision::kFloat32);
  EXPECT_FALSE(cpu->fast.cuda_graphs);
  EXPECT_EQ(cpu->encoder_batch_sizes, (std::vector<int>{1, 2, 4, 6}));

  auto gpu = MakeEngineOptions(c, DeviceSpec{"cuda:1", "cuda:1", true}, ck);
  ASSERT_TRUE(gpu.ok());
  EXPECT_EQ(gpu->device, "cuda:1");
  EXPECT_EQ(gpu->precision, Precision::kBFloat16);
  EXPECT_TRUE(gpu->fast.cuda_graphs);  // FastPathOptions::Fast() on CUDA
  EXPECT_TRUE(gpu->fast.gpu_postprocess);
  EXPECT_TRUE(gpu->fast.rel_pos_in_kernel);
  EXPECT_TRUE(gpu->fast.windows_in_kernel);
  EXPECT_TRUE(gpu->fast.residual_in_gemm);
  EXPECT_TRUE(gpu->fast.gemm_tuning);
  EXPECT_TRUE(gpu->fast.attention_timing);
  EXPECT_FALSE(gpu->fast.fp8);  // opt-in
  EXPECT_TRUE(gpu->fast.gpu_rle_string);
  EXPECT_FALSE(gpu->fast.decoder_priority);  // opt-in (BENCHMARKS.md, run 14)
  {
    auto on = Parse({"--decoder-priority=1"});
    ASSERT_FALSE(on.exit) << on.output;
    auto o = MakeEngineOptions(on.config, DeviceSpec{"cuda:0", "cuda:0", true}, ck);
    ASSERT_TRUE(o.ok());
    EXPECT_TRUE(o->fast.decoder_priority);
  }
  {
    auto off = Parse({"--decoder-priority=0", "--gpu-rle-string", "off", "--gemm-tuning=false",
                      "--attention-timing=0"});
    ASSERT_FALSE(off.exit) << off.output;
    auto o = MakeEngineOptions(off.config, DeviceSpec{"cuda:0", "cuda:0", true}, ck);
    ASSERT_TRUE(o.ok());
    EXPECT_FALSE(o->fast.gemm_tuning);
    EXPECT_FALSE(o->fast.attention_timing);
    EXPECT_FALSE(o->fast.decoder_priority);
    EXPECT_FALSE(o->fast.gpu_rle_string);
    EXPECT_TRUE(o->fast.gpu_postprocess);
  }
  {
    ServerConfig f = c;
    f.fp8 = true;
    auto fp8 = MakeEngineOptions(f, DeviceSpec{"cuda:0", "cuda:0", true}, ck);
    ASSERT_TRUE(fp8.ok());
    EXPECT_TRUE(fp8->fast.fp8);
    auto parsed = Parse({"--fp8", "on"});
    ASSERT_FALSE(parsed.exit) << parsed.output;
    EXPECT_EQ(parsed.config.fp8, std::optional<bool>(true));
  }

  c.precision = "fp16";
  c.cuda_graphs = false;
  c.gpu_preprocess = false;
  c.attention = "sdpa";
  auto tuned = MakeEngineOptions(c, DeviceSpec{"cuda:0", "cuda:0", true}, ck);
  ASSERT_TRUE(tuned.ok());
  EXPECT_EQ(tuned->precision, Precision::kFloat16);
  EXPECT_FALSE(tuned->fast.cuda_graphs);
  EXPECT_FALSE(tuned->fast.gpu_preprocess);  // on in Fast(): the switch overrides the preset
  EXPECT_EQ(tuned->fast.attention, AttentionImpl::kSdpa);

  c = ServerConfig{};
  c.fast = "off";
  auto off = MakeEngineOptions(c, DeviceSpec{"cuda:0", "cuda:0", true}, ck);
  EXPECT_FALSE(off->fast.cuda_graphs);
  EXPECT_EQ(off->fast.attention, AttentionImpl::kMath);
}

// Issue #15: GenerateMasks' threads and parameter limits are flags, documented in --help with their
// environment variables, and reach MaskGenerationLimits.
TEST(ServerConfig, GenerationFlags) {
  auto help = Parse({"--help"});
  for (const char* flag : {"--generate-threads", "--generate-queue-capacity", "--max-generate-points-per-side",
                           "--max-generate-grid-points", "--max-generate-points-per-batch",
                           "--max-generate-crop-layers", "--max-generate-downscale-factor",
                           "MASKD_MAX_GENERATE_GRID_POINTS"}) {
    EXPECT_NE(help.output.find(flag), std::string::npos) << flag << " missing from --help";
  }
  const MaskGenerationLimits defaults = Parse({}).config.generation_limits();
  EXPECT_EQ(defaults.max_points_per_side, MaskGenerationLimits{}.max_points_per_side);
  EXPECT_EQ(defaults.max_grid_points, MaskGenerationLimits{}.max_grid_points);
  EXPECT_EQ(Parse({}).config.generate_threads, 2);
  auto r = Parse({"--max-generate-points-per-side", "64", "--max-generate-grid-points", "5000",
                  "--max-generate-points-per-batch", "256", "--max-generate-crop-layers", "1",
                  "--max-generate-downscale-factor", "4", "--generate-threads", "3"});
  ASSERT_FALSE(r.exit) << r.output;
  const MaskGenerationLimits l = r.config.generation_limits();
  EXPECT_EQ(l.max_points_per_side, 64);
  EXPECT_EQ(l.max_grid_points, 5000);
  EXPECT_EQ(l.max_points_per_batch, 256);
  EXPECT_EQ(l.max_crop_n_layers, 1);
  EXPECT_EQ(l.max_crop_n_points_downscale_factor, 4);
  EXPECT_EQ(r.config.generate_threads, 3);
  auto bad = Parse({"--max-generate-crop-layers", "9"});
  EXPECT_TRUE(bad.exit);
  EXPECT_NE(bad.output.find("--max-generate-crop-layers"), std::string::npos) << bad.output;
  auto zero_threads = Parse({"--generate-threads", "0"});
  EXPECT_TRUE(zero_threads.exit);
}

}  // namespace
}  // namespace maskd::server
