#include "load_tests/maskload_cli.h"

#include "client/security_flags.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <algorithm>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "client/mask_codec.h"
#include "client/prompt_parse.h"
#include "load_tests/image_pool.h"
#include "load_tests/report.h"

#ifndef MASKD_PYTHON_DEFAULT
#define MASKD_PYTHON_DEFAULT "python3"
#endif
#ifndef MASKD_PLOT_SCRIPT_DEFAULT
#define MASKD_PLOT_SCRIPT_DEFAULT "load_tests/plot_maskload.py"
#endif

namespace maskd::load {

void AddMaskloadFlags(CLI::App& app, MaskloadOptions& o) {
  LoadConfig& c = o.load;
  app.add_option("--server", c.target, "maskd address HOST:PORT")->envname("MASKD_SERVER")->capture_default_str();
  client::AddSecurityFlags(app, o.security);
  app.add_option("--workload", o.workload,
                 "batch: WORKLOAD.md images (JPEG + P~U{min..max} single-point prompts, one call per image); "
                 "interactive: Embed once per image, then single-click Segment calls by image_id; "
                 "mixed: both, --batch-fraction of the calls are batch images")
      ->check(CLI::IsMember({"batch", "interactive", "mixed"}))
      ->capture_default_str();
  app.add_option("--concurrency,-c", o.concurrency,
                 "closed loop: concurrent clients, each with one call in flight; a list (1,4,16,64,256) "
                 "is a sweep: one run per level, each written to PREFIX.cN.*, and PREFIX.sweep.json / "
                 "PREFIX.sweep.csv with a row per level (throughput, latency percentiles, the server's "
                 "stage timings per call), PREFIX.sweep.png (throughput against latency)")
      ->capture_default_str();
  app.add_option("--rate", o.rate,
                 "open loop: target calls/s with Poisson arrivals (0 = closed loop); a list (100,200,400) "
                 "is an open-loop sweep, written like a concurrency sweep with PREFIX.rR.* per level")
      ->capture_default_str();
  app.add_option("--max-inflight", c.max_inflight,
                 "open loop: calls in flight beyond this are not sent (counted as CLIENT_BACKLOG errors)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--channels", c.channels, "gRPC channels (TCP connections) to spread the calls over")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--warmup", c.warmup_s, "warm-up seconds before measuring (not counted)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--window", c.window_s, "measurement window, seconds")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--stable-windows", c.stable_windows,
                 "stop when this many consecutive windows agree (throughput and p50 latency)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option("--stability", c.stability, "how close those windows must be: fraction of their mean")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-duration", c.max_duration_s, "bound on the whole run, seconds (warm-up included)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-requests", c.max_requests, "bound on the calls sent (warm-up included)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--request-timeout", c.request_timeout_s, "deadline of each call, seconds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--connect-timeout", c.connect_timeout_s, "how long to wait for the server at the start, seconds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--min-prompts", c.min_prompts, "batch: fewest prompts per image")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--max-prompts", c.max_prompts, "batch: most prompts per image")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_flag("--multimask,!--no-multimask", c.multimask, "ask for SAM's three masks per prompt (default on)");
  app.add_option("--format", o.format, "mask format: rle (COCO RLE), png, logits")
      ->check(CLI::IsMember({"rle", "png", "logits"}))
      ->capture_default_str();
  app.add_flag("--unique-images,!--cached-images", c.unique_images,
               "batch: a unique JPEG comment per call so every image runs the encoder (default on); "
               "--cached-images lets repeats hit the server's embedding cache");
  app.add_flag("--affinity-header,!--no-affinity-header", c.affinity_header,
               "send x-maskd-image-id with every call, for image_id affinity behind Envoy (default on; "
               "batch calls hash their image on the client for it)");
  app.add_option("--clicks-per-image", c.clicks_per_image,
                 "interactive: clicks a closed-loop client makes on one image before the next")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--background-generate", c.background_generate,
                 "also run this many clients that loop GenerateMasks (segment everything) on one embedded "
                 "image for the whole run, reported apart from the measured workload (0..64)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  app.add_option("--generate-points-per-side", c.generate_points_per_side,
                 "grid of the --background-generate calls (points per side)")
      ->check(CLI::Range(1, 128))
      ->capture_default_str();
  app.add_option("--batch-fraction", c.batch_fraction, "mixed: fraction of calls that are batch images")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--seed", c.seed, "seed of images, prompts, clicks and arrivals")->capture_default_str();
  app.add_option("--images", o.images, "generated images in the pool (or most files read from --image-dir)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--size", o.size, "generated image size WIDTHxHEIGHT")->capture_default_str();
  app.add_option("--jpeg-quality", o.jpeg_quality, "JPEG quality of generated (or re-encoded) images")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option("--image-dir", o.image_dir,
                 "send the .jpg/.jpeg/.png/.webp files of DIR instead of generated images")
      ->check(CLI::ExistingDirectory);
  app.add_option("--out", o.out,
                 "write PREFIX.json (report), PREFIX.csv (windows + summary), PREFIX.timeline.csv "
                 "(per second) and PREFIX.png (plot)");
  app.add_flag("--plot,!--no-plot", o.plot, "draw PREFIX.png with plot_maskload.py (default on with --out)");
  app.add_option("--python", o.python,
                 "python with matplotlib for the plot (default: env MASKD_PYTHON, else " MASKD_PYTHON_DEFAULT ")")
      ->envname("MASKD_PYTHON");
  app.add_option("--plot-script", o.plot_script, "plot script (default " MASKD_PLOT_SCRIPT_DEFAULT ")");
  app.add_flag("--quiet,-q", o.quiet, "no live progress line on stderr");
  app.add_option("--max-errors", o.max_errors,
                 "exit 3 when the run has more failed calls than this (default -1: any number)")
      ->capture_default_str();
  app.add_flag("--fail-unstable", o.fail_unstable,
               "exit 5 when the run ends (--max-duration, --max-requests) before its last "
               "--stable-windows windows agree within --stability in throughput and p50 latency, "
               "saying which window was off and by how much (default: report NOT stable, exit 0)");
  app.add_flag("--malloc-tuning,!--no-malloc-tuning", o.malloc_tuning,
               "keep freed heap memory for reuse in this process, as maskd's --malloc-tuning does: "
               "less client time per large response (default on; --no-malloc-tuning: glibc's defaults)");
}

namespace {

bool IsRateSweep(const MaskloadOptions& o) { return o.rate_levels.size() > 1; }
bool IsSweep(const MaskloadOptions& o) { return o.concurrency_levels.size() > 1 || IsRateSweep(o); }

// One run of a sweep (or the single run): its settings and the suffix of its files (PREFIX.cN,
// PREFIX.rR; none for a single run).
struct Level {
  int concurrency = 0;
  double rate = 0;
  std::string suffix;
};

std::string RateText(double rate) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", rate);
  return buf;
}

std::vector<Level> Levels(const MaskloadOptions& o) {
  std::vector<Level> out;
  if (IsRateSweep(o)) {
    for (double r : o.rate_levels) out.push_back({o.load.concurrency, r, ".r" + RateText(r)});
  } else if (IsSweep(o)) {
    for (int c : o.concurrency_levels) out.push_back({c, o.load.rate, ".c" + std::to_string(c)});
  } else {
    out.push_back({o.load.concurrency, o.load.rate, ""});
  }
  return out;
}

std::vector<std::string> OutputPaths(const MaskloadOptions& o) {
  std::vector<std::string> paths;
  for (const Level& level : Levels(o)) {
    const std::string prefix = o.out + level.suffix;
    for (const char* ext : {".json", ".csv", ".timeline.csv"}) paths.push_back(prefix + ext);
    if (o.plot) paths.push_back(prefix + ".png");
  }
  if (IsSweep(o)) {
    paths.push_back(o.out + ".sweep.json");
    paths.push_back(o.out + ".sweep.csv");
    if (o.plot) paths.push_back(o.out + ".sweep.png");
  }
  return paths;
}

// "a,b,c" -> {"a", "b", "c"} (an empty text or item stays an empty item, which the parsers refuse).
std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> items;
  size_t pos = 0;
  while (true) {
    const size_t comma = text.find(',', pos);
    items.push_back(text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (comma == std::string::npos) return items;
    pos = comma + 1;
  }
}

StatusOr<std::vector<int>> ParseConcurrencyList(const std::string& text) {
  std::vector<int> levels;
  for (const std::string& item : SplitList(text)) {
    int v = 0;
    char extra = 0;
    if (std::sscanf(item.c_str(), "%d%c", &v, &extra) != 1 || v < 1 || v > 4096) {
      return InvalidArgument("--concurrency '" + text + "': '" + item +
                             "' is not a client count; expected N or a list N1,N2,... each 1..4096");
    }
    if (std::find(levels.begin(), levels.end(), v) != levels.end()) {
      return InvalidArgument("--concurrency '" + text + "': " + item + " is listed twice");
    }
    levels.push_back(v);
  }
  return levels;
}

StatusOr<std::vector<double>> ParseRateList(const std::string& text) {
  std::vector<double> levels;
  for (const std::string& item : SplitList(text)) {
    double v = 0;
    char extra = 0;
    if (std::sscanf(item.c_str(), "%lf%c", &v, &extra) != 1 || !(v >= 0) || v > 1e7) {
      return InvalidArgument("--rate '" + text + "': '" + item +
                             "' is not a rate; expected calls/s (0 = closed loop) or a list R1,R2,... each > 0");
    }
    if (std::find(levels.begin(), levels.end(), v) != levels.end()) {
      return InvalidArgument("--rate '" + text + "': " + item + " is listed twice");
    }
    levels.push_back(v);
  }
  if (levels.size() > 1 && std::find(levels.begin(), levels.end(), 0.0) != levels.end()) {
    return InvalidArgument("--rate '" + text + "': a rate sweep is open loop; every level must be > 0");
  }
  return levels;
}

}  // namespace

Status CheckOutputPaths(const MaskloadOptions& o) {
  if (o.out.empty()) return Status::Ok();
  namespace fs = std::filesystem;
  const fs::path folder = fs::path(o.out).parent_path().empty() ? fs::path(".") : fs::path(o.out).parent_path();
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) {
    return InvalidArgument("--out '" + o.out + "': folder '" + folder.string() +
                           "' does not exist (expected an existing folder followed by a file-name prefix)");
  }
  for (const std::string& path : OutputPaths(o)) {
    if (fs::is_directory(path, ec)) {
      return InvalidArgument("--out '" + o.out + "': '" + path + "' is a folder, expected a file it can write");
    }
    // Opening is the only test that also sees read-only mounts and ACLs: an existing file is opened
    // for writing without truncating it (an earlier run's report survives until this one replaces
    // it), a new one is created and removed again.
    const bool existed = fs::exists(path, ec);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | (existed ? 0 : O_CREAT | O_EXCL), 0644);
    if (fd < 0) {
      return InvalidArgument("--out '" + o.out + "': cannot write '" + path + "': " + std::strerror(errno));
    }
    ::close(fd);
    if (!existed) ::unlink(path.c_str());
  }
  return Status::Ok();
}


Status FinishMaskloadOptions(MaskloadOptions& o) {
  MASKD_RETURN_IF_ERROR(client::ApplySecurityFlags(o.security, &o.load.security));
  StatusOr<Workload> w = ParseWorkload(o.workload);
  if (!w.ok()) return w.status();
  o.load.workload = *w;
  StatusOr<v1::OutputFormat> f = client::ParseOutputFormat(o.format);
  if (!f.ok()) return f.status();
  o.load.format = *f;
  int w_px = 0, h_px = 0;
  char tail = 0;
  if (std::sscanf(o.size.c_str(), "%dx%d%c", &w_px, &h_px, &tail) != 2 || w_px < 1 || h_px < 1 ||
      w_px > 16384 || h_px > 16384) {
    return InvalidArgument("--size '" + o.size + "': expected WIDTHxHEIGHT, each 1..16384 (e.g. 1024x768)");
  }
  o.width = w_px;
  o.height = h_px;
  if (o.load.max_prompts < o.load.min_prompts) {
    return InvalidArgument("--max-prompts " + std::to_string(o.load.max_prompts) +
                           " is below --min-prompts " + std::to_string(o.load.min_prompts));
  }
  StatusOr<std::vector<int>> levels = ParseConcurrencyList(o.concurrency);
  if (!levels.ok()) return levels.status();
  o.concurrency_levels = *levels;
  o.load.concurrency = o.concurrency_levels.front();
  StatusOr<std::vector<double>> rates = ParseRateList(o.rate);
  if (!rates.ok()) return rates.status();
  o.rate_levels = *rates;
  o.load.rate = o.rate_levels.front();
  if (o.concurrency_levels.size() > 1 && o.load.rate > 0) {
    return InvalidArgument("--concurrency '" + o.concurrency +
                           "': a concurrency sweep is closed loop; it cannot be combined with --rate " + o.rate);
  }
  if (o.python.empty()) o.python = MASKD_PYTHON_DEFAULT;
  if (o.plot_script.empty()) o.plot_script = MASKD_PLOT_SCRIPT_DEFAULT;
  return Status::Ok();
}

namespace {

// One run at `config`, its human summary, its files under `prefix` (none when empty) and its plot;
// returns RunMaskload's exit status for it.
int RunLevel(const MaskloadOptions& o, const LoadConfig& config, const std::string& prefix,
             std::vector<ImageAsset> pool, const ProgressFn& progress, LoadResult& result_out) {
  LoadRunner runner(config, std::move(pool), progress);
  StatusOr<LoadResult> result = runner.Run();
  if (!result.ok()) {
    std::fprintf(stderr, "maskload: %s\n", result.status().ToString().c_str());
    return 1;
  }
  std::fputs(HumanSummary(config, *result).c_str(), stdout);
  result_out = *result;

  int exit_code = 0;
  if (!prefix.empty()) {
    const std::string json_path = prefix + ".json", csv_path = prefix + ".csv",
                      timeline_path = prefix + ".timeline.csv", png_path = prefix + ".png";
    for (const auto& [path, text] :
         {std::pair{json_path, ReportJson(config, *result).dump(2) + "\n"},
          std::pair{csv_path, WindowsCsv(*result)}, std::pair{timeline_path, TimelineCsv(*result)}}) {
      Status s = client::WriteFileBytes(path, text);
      if (!s.ok()) {
        std::fprintf(stderr, "maskload: %s\n", s.ToString().c_str());
        return 1;
      }
      std::printf("wrote %s\n", path.c_str());
    }
    if (o.plot) {
      const int rc = RunPlot(o.python, o.plot_script, timeline_path, json_path, png_path);
      if (rc == 0) {
        std::printf("wrote %s\n", png_path.c_str());
      } else {
        std::fprintf(stderr,
                     "maskload: plot failed (exit %d): `%s %s %s %s %s`; is matplotlib installed for %s? "
                     "(--python, env MASKD_PYTHON; --no-plot to skip)\n",
                     rc, o.python.c_str(), o.plot_script.c_str(), timeline_path.c_str(),
                     json_path.c_str(), png_path.c_str(), o.python.c_str());
        exit_code = 4;
      }
    }
  }
  if (o.max_errors >= 0 && result->whole_run.errors > static_cast<uint64_t>(o.max_errors)) {
    std::fprintf(stderr, "maskload: %llu failed calls, more than --max-errors %lld\n",
                 static_cast<unsigned long long>(result->whole_run.errors),
                 static_cast<long long>(o.max_errors));
    return 3;
  }
  if (o.fail_unstable && !result->stable) {
    std::string why = WhyNotStable(result->windows, config.stable_windows, config.stability,
                                   config.workload == Workload::kBatch ? RateUnit::kImages : RateUnit::kRequests);
    // The runner's partial last window can make the rule hold after the stop; the stop still came first.
    if (why.empty()) why = "the rule was met only by the partial window after the stop";
    std::fprintf(stderr, "maskload: run NOT stable (stopped by %s after %.1f s; --fail-unstable): %s\n",
                 result->stop_reason.c_str(), result->wall_s, why.c_str());
    return 5;
  }
  return exit_code;
}

}  // namespace

int RunMaskload(const MaskloadOptions& o) {
  // A run can take minutes; a bad --out must not be found only when the report is written.
  if (Status s = CheckOutputPaths(o); !s.ok()) {
    std::fprintf(stderr, "maskload: %s\n", s.ToString().c_str());
    return 1;
  }
  StatusOr<std::vector<ImageAsset>> pool =
      o.image_dir.empty() ? GenerateImagePool(o.images, o.width, o.height, o.load.seed, o.jpeg_quality)
                          : LoadImageFolder(o.image_dir, o.images, o.load.unique_images, o.jpeg_quality);
  if (!pool.ok()) {
    std::fprintf(stderr, "maskload: %s\n", pool.status().ToString().c_str());
    return 1;
  }
  const bool tty = isatty(STDERR_FILENO);
  ProgressFn progress;
  if (!o.quiet) {
    progress = [tty](const std::string& line, bool final_line) {
      // On a terminal one line redrawn in place; in a log one line per second.
      if (tty) {
        std::fprintf(stderr, "\r%s\033[K%s", line.c_str(), final_line ? "\n" : "");
      } else {
        std::fprintf(stderr, "%s\n", line.c_str());
      }
      std::fflush(stderr);
    };
  }
  if (!IsSweep(o)) {
    LoadResult result;
    return RunLevel(o, o.load, o.out, std::move(*pool), progress, result);
  }
  // A sweep: the levels one after another on the same image pool, each a complete run (warm-up,
  // windows until stable); a level that cannot run at all ends the sweep.
  int exit_code = 0;
  std::vector<SweepLevel> rows;
  for (const Level& level : Levels(o)) {
    LoadConfig config = o.load;
    config.concurrency = level.concurrency;
    config.rate = level.rate;
    if (!o.quiet) {
      if (IsRateSweep(o)) {
        std::fprintf(stderr, "maskload sweep: %s calls/s\n", RateText(level.rate).c_str());
      } else {
        std::fprintf(stderr, "maskload sweep: %d clients\n", level.concurrency);
      }
    }
    SweepLevel row;
    row.concurrency = level.concurrency;
    row.rate = level.rate;
    const int rc = RunLevel(o, config, o.out.empty() ? "" : o.out + level.suffix, *pool, progress, row.result);
    if (rc == 1) return 1;
    if (exit_code == 0) exit_code = rc;
    rows.push_back(std::move(row));
  }
  std::fputs(SweepSummary(rows, IsRateSweep(o)).c_str(), stdout);
  if (!o.out.empty()) {
    for (const auto& [path, text] : {std::pair{o.out + ".sweep.json",
                                               SweepJson(o.load, rows, IsRateSweep(o)).dump(2) + "\n"},
                                     std::pair{o.out + ".sweep.csv", SweepCsv(rows)}}) {
      if (Status s = client::WriteFileBytes(path, text); !s.ok()) {
        std::fprintf(stderr, "maskload: %s\n", s.ToString().c_str());
        return 1;
      }
      std::printf("wrote %s\n", path.c_str());
    }
    if (o.plot) {
      // plot_maskload.py --sweep SWEEP.json OUT.png (RunPlot passes its three paths in that order).
      const std::string sweep_json = o.out + ".sweep.json", png = o.out + ".sweep.png";
      const int rc = RunPlot(o.python, o.plot_script, "--sweep", sweep_json, png);
      if (rc == 0) {
        std::printf("wrote %s\n", png.c_str());
      } else {
        std::fprintf(stderr, "maskload: sweep plot failed (exit %d): `%s %s --sweep %s %s` (--no-plot to skip)\n",
                     rc, o.python.c_str(), o.plot_script.c_str(), sweep_json.c_str(), png.c_str());
        if (exit_code == 0) exit_code = 4;
      }
    }
  }
  return exit_code;
}

}  // namespace maskd::load
