// maskload's runner against the in-process fake server, which answers at once: the whole cost of a
// call is then the client's (plus the fake's own, in the same process), so these tests also bound
// maskload's CPU per call and show it can issue thousands of calls per second.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "fake_maskd.h"
#include "load_tests/image_pool.h"
#include "load_tests/load_runner.h"
#include "load_tests/maskload_cli.h"
#include "load_tests/report.h"

namespace maskd::load {
namespace {

// A fresh folder under the system temp dir for one test, removed when the test ends (also when an
// assertion ends it early).
struct ScopedTempDir {
  explicit ScopedTempDir(const std::string& stem)
      : path(std::filesystem::temp_directory_path() / (stem + std::to_string(::getpid()))) {
    std::filesystem::create_directories(path);
  }
  ~ScopedTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  const std::filesystem::path path;
};

LoadConfig ShortRun(const std::string& target) {
  LoadConfig c;
  c.target = target;
  c.warmup_s = 0.5;
  c.window_s = 0.5;
  c.stable_windows = 3;
  c.stability = 0.25;  // a shared 2-core CI machine is noisy; the rule itself is unit-tested
  c.max_duration_s = 6;
  c.channels = 2;
  return c;
}

// Runs `c` on GenerateImagePool(images, width, height, seed); a pool that cannot be made fails the run.
StatusOr<LoadResult> RunWithPool(const LoadConfig& c, int images, int width, int height, uint64_t seed) {
  StatusOr<std::vector<ImageAsset>> pool = GenerateImagePool(images, width, height, seed);
  if (!pool.ok()) return pool.status();
  return LoadRunner(c, *pool).Run();
}

TEST(MaskloadFake, InteractiveClosedLoopIsCheapPerCall) {
  testing::FakeMaskd server;
  LoadConfig c = ShortRun(server.target());
  c.workload = Workload::kInteractive;
  c.concurrency = 32;
  StatusOr<LoadResult> r = RunWithPool(c, /*images=*/4, 128, 96, /*seed=*/1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->whole_run.errors, 0u) << nlohmann::json(r->whole_run.errors_by_code).dump();
  EXPECT_GT(r->summary.ok, 0u);
  EXPECT_EQ(r->summary.images, 0u);  // clicks are not images
  EXPECT_EQ(r->summary.prompts, r->summary.ok);
  EXPECT_EQ(r->summary.masks, 3 * r->summary.ok);  // multimask by default
  EXPECT_GT(r->summary.rle_bytes, 0u);
  EXPECT_EQ(server.service.embeds.load(), 4u);  // one Embed per image, then ids only
  EXPECT_GE(r->windows.size(), 1u);
  const double calls_per_s = r->summary.requests_per_s();
  std::printf("fake server, 32 clients: %.0f calls/s, p50 %.3f ms, p99 %.3f ms, client+fake CPU %.1f us/call\n",
              calls_per_s, r->summary.latency.p50_us / 1e3, r->summary.latency.p99_us / 1e3,
              r->client_cpu_us_per_call);
  // Thousands of calls/s even on a shared 2-core machine with the fake in the same process; the
  // CPU per call (client and fake together) stays well under a millisecond.
  EXPECT_GT(calls_per_s, 1000);
  EXPECT_GT(r->client_cpu_us_per_call, 0);
  EXPECT_LT(r->client_cpu_us_per_call, 1000);
}

TEST(MaskloadFake, EveryCallCarriesTheAffinityHeaderOfItsImage) {
  testing::FakeMaskd server;
  StatusOr<std::vector<ImageAsset>> pool = GenerateImagePool(3, 96, 64, 5);
  ASSERT_TRUE(pool.ok());
  LoadConfig c = ShortRun(server.target());
  c.workload = Workload::kMixed;  // batch images (bytes, unique JPEGs) and clicks by id
  c.concurrency = 4;
  c.max_requests = 200;
  c.max_duration_s = 20;
  StatusOr<LoadResult> r = LoadRunner(c, *pool).Run();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->whole_run.errors, 0u);
  for (const auto& call : server.service.seen_calls()) {
    ASSERT_TRUE(call.affinity.has_value()) << call.method << " without x-maskd-image-id";
    EXPECT_EQ(*call.affinity, call.image_id) << call.method;
  }
  EXPECT_GT(server.service.seen_calls().size(), 200u);  // 3 set-up Embeds + 200 Segments
  EXPECT_GT(r->whole_run.images, 0u);                   // both kinds really ran
  EXPECT_GT(r->whole_run.ok, r->whole_run.images);

  // --no-affinity-header: none at all.
  testing::FakeMaskd plain;
  LoadConfig off = ShortRun(plain.target());
  off.workload = Workload::kMixed;
  off.concurrency = 2;
  off.max_requests = 40;
  off.affinity_header = false;
  StatusOr<LoadResult> q = LoadRunner(off, *pool).Run();
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->whole_run.errors, 0u);
  for (const auto& call : plain.service.seen_calls()) {
    EXPECT_FALSE(call.affinity.has_value()) << call.method;
  }
  EXPECT_GT(plain.service.seen_calls().size(), 40u);
}

TEST(MaskloadFake, BatchSendsUniqueImagesWithJaggedPrompts) {
  testing::FakeMaskd server;
  LoadConfig c = ShortRun(server.target());
  c.workload = Workload::kBatch;
  c.concurrency = 4;
  c.max_requests = 300;
  c.max_duration_s = 20;
  StatusOr<LoadResult> r = RunWithPool(c, /*images=*/2, 160, 120, /*seed=*/3);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->whole_run.errors, 0u);
  EXPECT_EQ(r->whole_run.ok, r->whole_run.images);  // each batch call is one image
  // Every call got all its masks: 3 per prompt, prompts averaging ~7.5.
  EXPECT_EQ(r->whole_run.masks, 3 * r->whole_run.prompts);
  const double per_image = static_cast<double>(r->whole_run.prompts) / r->whole_run.images;
  EXPECT_GT(per_image, 5.5);
  EXPECT_LT(per_image, 9.5);
  EXPECT_LE(r->sent, 300u);
  // The last request's JPEG carries maskload's comment segment right after SOI.
  const std::string& sent = server.service.last_request.image().encoded();
  ASSERT_GT(sent.size(), 4u);
  EXPECT_EQ(static_cast<uint8_t>(sent[2]), 0xFF);
  EXPECT_EQ(static_cast<uint8_t>(sent[3]), 0xFE);

  // The outputs: JSON has the summary, CSV one row per window + summary + whole run.
  nlohmann::json j = ReportJson(c, *r);
  EXPECT_EQ(j["config"]["workload"], "batch");
  EXPECT_EQ(j["summary"]["errors"], 0);
  EXPECT_TRUE(j["summary"].contains("images_per_s"));
  EXPECT_TRUE(j["summary"]["latency"].contains("p99_ms"));
  EXPECT_EQ(j["server_after"]["model"]["arch"], "fake");
  const std::string csv = WindowsCsv(*r);
  EXPECT_EQ(static_cast<size_t>(std::count(csv.begin(), csv.end(), '\n')), r->windows.size() + 3);
  const std::string timeline = TimelineCsv(*r);
  EXPECT_EQ(static_cast<size_t>(std::count(timeline.begin(), timeline.end(), '\n')), r->timeline.size() + 1);
}

TEST(MaskloadFake, OpenLoopHoldsTheTargetRate) {
  testing::FakeMaskd server;
  LoadConfig c = ShortRun(server.target());
  c.workload = Workload::kInteractive;
  c.rate = 800;
  c.window_s = 1;
  c.max_duration_s = 8;
  StatusOr<LoadResult> r = RunWithPool(c, /*images=*/2, 64, 48, /*seed=*/1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->whole_run.errors, 0u);
  // Poisson(800) over >= 3 s: sd of the rate ~ 2 %; allow for a busy machine.
  EXPECT_NEAR(r->summary.requests_per_s(), 800, 800 * 0.15);
}

TEST(MaskloadFake, MixedCountsBothKinds) {
  testing::FakeMaskd server;
  LoadConfig c = ShortRun(server.target());
  c.workload = Workload::kMixed;
  c.batch_fraction = 0.3;
  c.concurrency = 8;
  StatusOr<LoadResult> r = RunWithPool(c, /*images=*/2, 64, 48, /*seed=*/1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->whole_run.errors, 0u);
  ASSERT_EQ(r->whole_run.latency_by_kind.size(), 2u);
  const double batch_share = static_cast<double>(r->whole_run.images) / r->whole_run.ok;
  EXPECT_NEAR(batch_share, 0.3, 0.06);
}

// The maskload command line end to end: flags, outputs, plot (via plot_maskload.py and MASKD_PYTHON).
TEST(MaskloadFake, CommandLineWritesJsonCsvAndPlot) {
  testing::FakeMaskd server;
  const ScopedTempDir tmp("maskload_cli_test_");
  const std::filesystem::path& dir = tmp.path;
  const std::string prefix = (dir / "run").string();
  CLI::App app;
  MaskloadOptions o;
  AddMaskloadFlags(app, o);
  std::vector<std::string> args = {"maskload", "--server", server.target(), "--workload", "mixed",
                                   "-c", "4", "--images", "2", "--size", "96x64", "--warmup", "0.3",
                                   "--window", "0.5", "--max-duration", "3", "--out", prefix, "-q",
                                   "--max-errors", "0"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  app.parse(static_cast<int>(argv.size()), argv.data());
  ASSERT_TRUE(FinishMaskloadOptions(o).ok());
  EXPECT_EQ(o.width, 96);
  EXPECT_EQ(o.height, 64);
  EXPECT_EQ(o.load.workload, Workload::kMixed);
  EXPECT_EQ(o.load.concurrency, 4);
  ASSERT_EQ(RunMaskload(o), 0);
  for (const char* ext : {".json", ".csv", ".timeline.csv", ".png"}) {
    const std::filesystem::path f = prefix + ext;
    ASSERT_TRUE(std::filesystem::exists(f)) << f;
    EXPECT_GT(std::filesystem::file_size(f), 100u) << f;
  }
  std::ifstream png(prefix + ".png", std::ios::binary);
  char magic[4] = {};
  png.read(magic, 4);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG");

  // Bad values are refused, naming the flag.
  MaskloadOptions bad;
  bad.size = "1024by768";
  Status s = FinishMaskloadOptions(bad);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--size"), std::string::npos);
}

// The whole run's rates are per real second: its duration is the span from the start to the last
// completion, not an open-ended window (once UINT64_MAX us, printed as 18446744073709.551 s).
TEST(MaskloadFake, WholeRunDurationIsTheMeasuredSpan) {
  testing::FakeMaskd server;
  LoadConfig c = ShortRun(server.target());
  c.workload = Workload::kInteractive;
  c.concurrency = 4;
  c.max_duration_s = 2;
  c.stable_windows = 100;  // never stable: the run goes to max-duration
  StatusOr<LoadResult> r = RunWithPool(c, /*images=*/2, 64, 48, /*seed=*/1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->stop_reason, "max-duration");
  EXPECT_DOUBLE_EQ(r->whole_run.start_s, 0);
  // At least the time to the stop; at most that plus the drain of the 4 calls in flight.
  EXPECT_GE(r->whole_run.duration_s, r->wall_s);
  EXPECT_LT(r->whole_run.duration_s, r->wall_s + 1.0);
  ASSERT_GT(r->whole_run.ok, 0u);
  EXPECT_NEAR(r->whole_run.requests_per_s(), r->whole_run.ok / r->wall_s, 0.2 * r->whole_run.ok / r->wall_s);
  const nlohmann::json j = ReportJson(c, *r);
  EXPECT_LT(j["whole_run"]["duration_s"].get<double>(), 10.0);
}

// The interactive set-up embeds every image before the clock starts; it reports how far it got.
TEST(MaskloadFake, PreEmbedPhaseReportsProgress) {
  testing::FakeMaskd server;
  StatusOr<std::vector<ImageAsset>> pool = GenerateImagePool(5, 64, 48, 1);
  ASSERT_TRUE(pool.ok());
  LoadConfig c = ShortRun(server.target());
  c.workload = Workload::kInteractive;
  c.concurrency = 2;
  c.max_duration_s = 1;
  std::vector<std::pair<std::string, bool>> lines;
  LoadRunner runner(c, *pool, [&](const std::string& line, bool final_line) {
    lines.emplace_back(line, final_line);
  });
  StatusOr<LoadResult> r = runner.Run();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<std::pair<std::string, bool>> embed_lines;
  for (const auto& l : lines) {
    if (l.first.find("pre-embed") != std::string::npos) embed_lines.push_back(l);
  }
  ASSERT_GE(embed_lines.size(), 2u);
  // The first line comes before any image is embedded, the last says all are, and ends its line.
  EXPECT_NE(embed_lines.front().first.find("pre-embed 0/5 images"), std::string::npos) << embed_lines.front().first;
  EXPECT_FALSE(embed_lines.front().second);
  EXPECT_NE(embed_lines.back().first.find("pre-embed 5/5 images (100 %)"), std::string::npos)
      << embed_lines.back().first;
  EXPECT_TRUE(embed_lines.back().second);
  // ... and all of them come before the load phase's lines.
  EXPECT_NE(lines[embed_lines.size() - 1].first.find("pre-embed"), std::string::npos);
}

std::vector<std::string> CliArgs(const std::string& target, const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"maskload", "--server", target, "--workload", "interactive", "-c", "2",
                                   "--images", "2", "--size", "96x64", "--warmup", "0.2", "--window", "0.5",
                                   "--max-duration", "2", "-q", "--no-plot"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

MaskloadOptions ParseCli(std::vector<std::string> args) {
  CLI::App app;
  MaskloadOptions o;
  AddMaskloadFlags(app, o);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  app.parse(static_cast<int>(argv.size()), argv.data());
  EXPECT_TRUE(FinishMaskloadOptions(o).ok());
  return o;
}

// A bad --out fails at once, before any call is sent, naming the path; a good one leaves no files
// behind from the check.
TEST(MaskloadFake, OutIsCheckedBeforeTheRun) {
  testing::FakeMaskd server;
  const ScopedTempDir tmp("maskload_out_test_");
  const std::filesystem::path& dir = tmp.path;

  for (const std::string& bad : {(dir / "missing" / "run").string(), (dir / "taken").string()}) {
    if (bad == (dir / "taken").string()) std::filesystem::create_directories(dir / "taken.json");
    MaskloadOptions o = ParseCli(CliArgs(server.target(), {"--out", bad}));
    EXPECT_FALSE(CheckOutputPaths(o).ok());
    ::testing::internal::CaptureStderr();
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(RunMaskload(o), 1) << bad;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("--out '" + bad + "'"), std::string::npos) << err;
    EXPECT_LT(seconds, 1.0);  // the run (2 s) never started
    EXPECT_EQ(server.service.embeds.load(), 0u);
    EXPECT_EQ(server.service.segments.load(), 0u);
  }

  MaskloadOptions good = ParseCli(CliArgs(server.target(), {"--out", (dir / "ok").string()}));
  EXPECT_TRUE(CheckOutputPaths(good).ok());
  EXPECT_FALSE(std::filesystem::exists(dir / "ok.json"));
  EXPECT_FALSE(std::filesystem::exists(dir / "ok.csv"));
}

// --fail-unstable: a run that ends before its windows agree exits 5 and says why; the report is
// still written.
TEST(MaskloadFake, FailUnstableExitsNonZeroWithTheReason) {
  testing::FakeMaskd server;
  const ScopedTempDir tmp("maskload_unstable_test_");
  const std::filesystem::path& dir = tmp.path;
  const std::string prefix = (dir / "run").string();
  MaskloadOptions o = ParseCli(
      CliArgs(server.target(), {"--stable-windows", "100", "--fail-unstable", "--out", prefix}));
  EXPECT_TRUE(o.fail_unstable);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(RunMaskload(o), 5);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("NOT stable"), std::string::npos) << err;
  EXPECT_NE(err.find("max-duration"), std::string::npos) << err;
  EXPECT_NE(err.find("fewer than the 100"), std::string::npos) << err;
  EXPECT_TRUE(std::filesystem::exists(prefix + ".json"));

  // Without the flag the same run reports NOT stable and exits 0.
  MaskloadOptions plain = ParseCli(CliArgs(server.target(), {"--stable-windows", "100"}));
  EXPECT_FALSE(plain.fail_unstable);
  EXPECT_EQ(RunMaskload(plain), 0);
}

// -c 1,3: one complete run per level, each with its own files, and a sweep JSON/CSV with a row per
// level (rates, percentiles, the server's per-call stage timings).
TEST(MaskloadFake, ConcurrencySweepWritesARowPerLevel) {
  testing::FakeMaskd server;
  const ScopedTempDir tmp("maskload_sweep_test_");
  const std::filesystem::path& dir = tmp.path;
  const std::string prefix = (dir / "sweep").string();
  std::vector<std::string> args = CliArgs(server.target(), {"--out", prefix});
  args.erase(std::find(args.begin(), args.end(), "--no-plot"));  // the sweep plot too
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "-c") args[i + 1] = "1,3";
    if (args[i] == "--max-duration") args[i + 1] = "1.5";
  }
  MaskloadOptions o = ParseCli(args);
  EXPECT_EQ(o.concurrency_levels, (std::vector<int>{1, 3}));
  EXPECT_EQ(o.load.concurrency, 1);
  ASSERT_EQ(RunMaskload(o), 0);
  for (const char* level : {".c1", ".c3"}) {
    for (const char* ext : {".json", ".csv", ".timeline.csv"}) {
      EXPECT_TRUE(std::filesystem::exists(prefix + level + ext)) << prefix + level + ext;
    }
  }
  for (const char* png : {".c1.png", ".c3.png", ".sweep.png"}) {
    EXPECT_GT(std::filesystem::exists(prefix + png) ? std::filesystem::file_size(prefix + png) : 0, 1000u) << png;
  }
  std::ifstream in(prefix + ".sweep.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  ASSERT_EQ(j["levels"].size(), 2u);
  EXPECT_EQ(j["levels"][0]["concurrency"], 1);
  EXPECT_EQ(j["levels"][1]["concurrency"], 3);
  for (const auto& row : j["levels"]) {
    EXPECT_GT(row["summary"]["ok"].get<uint64_t>(), 0u);
    EXPECT_GT(row["summary"]["calls_per_s"].get<double>(), 0);
    EXPECT_TRUE(row["summary"].contains("server_call_timing_mean_ms"));
  }
  EXPECT_FALSE(j["config"].contains("concurrency"));
  std::ifstream csv_in(prefix + ".sweep.csv");
  std::string header, row1, row3, extra;
  std::getline(csv_in, header);
  std::getline(csv_in, row1);
  std::getline(csv_in, row3);
  EXPECT_FALSE(std::getline(csv_in, extra));
  EXPECT_EQ(header.rfind("concurrency,rate,stable,stop_reason,start_s", 0), 0u) << header;
  EXPECT_NE(header.find("decoder_queue_ms"), std::string::npos) << header;
  EXPECT_EQ(row1.rfind("1,", 0), 0u) << row1;
  EXPECT_EQ(row3.rfind("3,", 0), 0u) << row3;

  // Bad lists are refused, naming the flag and the item.
  for (const std::string& bad : {"1,,4", "0", "4,4", "2,x"}) {
    CLI::App app;
    MaskloadOptions b;
    AddMaskloadFlags(app, b);
    std::vector<std::string> a = {"maskload", "-c", bad};
    std::vector<char*> argv;
    for (std::string& x : a) argv.push_back(x.data());
    app.parse(static_cast<int>(argv.size()), argv.data());
    const Status s = FinishMaskloadOptions(b);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("--concurrency '" + bad + "'"), std::string::npos) << s.message();
  }
  MaskloadOptions both;
  both.concurrency = "1,2";
  both.rate = "10";
  EXPECT_FALSE(FinishMaskloadOptions(both).ok());
  for (const std::string& bad : {"0,10", "10,10", "-1", "fast"}) {
    MaskloadOptions b;
    b.rate = bad;
    const Status s = FinishMaskloadOptions(b);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("--rate '" + bad + "'"), std::string::npos) << s.message();
  }
}

// --rate 200,400: an open-loop sweep, a row per target rate, each level near its rate.
TEST(MaskloadFake, RateSweepWritesARowPerRate) {
  testing::FakeMaskd server;
  const ScopedTempDir tmp("maskload_rate_sweep_test_");
  const std::filesystem::path& dir = tmp.path;
  const std::string prefix = (dir / "open").string();
  std::vector<std::string> args = CliArgs(server.target(), {"--out", prefix, "--rate", "200,400"});
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--max-duration") args[i + 1] = "2.5";
  }
  MaskloadOptions o = ParseCli(args);
  EXPECT_EQ(o.rate_levels, (std::vector<double>{200, 400}));
  EXPECT_EQ(o.load.rate, 200);
  ASSERT_EQ(RunMaskload(o), 0);
  for (const char* level : {".r200", ".r400"}) {
    EXPECT_TRUE(std::filesystem::exists(prefix + level + ".json")) << prefix + level;
  }
  std::ifstream in(prefix + ".sweep.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["sweep"], "rate");
  EXPECT_EQ(j["config"]["mode"], "open-loop");
  ASSERT_EQ(j["levels"].size(), 2u);
  EXPECT_EQ(j["levels"][0]["rate"].get<double>(), 200);
  EXPECT_EQ(j["levels"][1]["rate"].get<double>(), 400);
  // Poisson arrivals over ~2 s of windows: generous bounds for a busy 2-core machine.
  EXPECT_NEAR(j["levels"][0]["summary"]["calls_per_s"].get<double>(), 200, 200 * 0.3);
  EXPECT_NEAR(j["levels"][1]["summary"]["calls_per_s"].get<double>(), 400, 400 * 0.3);
}

TEST(MaskloadFake, UnreachableServerFailsFast) {
  StatusOr<std::vector<ImageAsset>> pool = GenerateImagePool(1, 32, 32, 1);
  LoadConfig c;
  c.target = "127.0.0.1:1";
  c.connect_timeout_s = 0.5;
  LoadRunner runner(c, *pool);
  StatusOr<LoadResult> r = runner.Run();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace maskd::load
