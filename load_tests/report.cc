#include "load_tests/report.h"

#include <spawn.h>
#include <sys/wait.h>

#include <cstdio>
#include <sstream>

#include "client/prompt_parse.h"

extern char** environ;

namespace maskd::load {
namespace {

using nlohmann::json;

json LatencyJson(const LatencySummary& l) {
  return {{"count", l.count},           {"mean_ms", l.mean_us / 1e3}, {"min_ms", l.min_us / 1e3},
          {"p50_ms", l.p50_us / 1e3},   {"p90_ms", l.p90_us / 1e3},   {"p99_ms", l.p99_us / 1e3},
          {"max_ms", l.max_us / 1e3}};
}

json WindowJson(const WindowStats& w) {
  json by_kind = json::object();
  for (const auto& [kind, l] : w.latency_by_kind) by_kind[CallKindName(kind)] = LatencyJson(l);
  return {
      {"start_s", w.start_s},
      {"duration_s", w.duration_s},
      {"calls", w.requests},
      {"ok", w.ok},
      {"errors", w.errors},
      {"errors_by_code", w.errors_by_code},
      {"images", w.images},
      {"prompts", w.prompts},
      {"masks", w.masks},
      {"images_per_s", w.images_per_s()},
      {"prompts_per_s", w.prompts_per_s()},
      {"calls_per_s", w.requests_per_s()},
      {"latency", LatencyJson(w.latency)},
      {"latency_by_kind", by_kind},
      {"response_bytes", w.response_bytes},
      {"response_bytes_per_call", w.ok ? static_cast<double>(w.response_bytes) / w.ok : 0.0},
      {"rle_bytes", w.rle_bytes},
      {"rle_bytes_per_mask", w.masks ? static_cast<double>(w.rle_bytes) / w.masks : 0.0},
      {"server_call_timing_mean_ms",
       {{"total", w.server_total_us / 1e3},
        {"decode", w.decode_us / 1e3},
        {"encoder_queue", w.encoder_queue_us / 1e3},
        {"encoder_compute", w.encoder_compute_us / 1e3},
        {"decoder_queue", w.decoder_queue_us / 1e3},
        {"decoder_compute", w.decoder_compute_us / 1e3},
        {"postprocess", w.postprocess_us / 1e3}}},
  };
}

json ServerJson(const v1::GetInfoResponse& info) {
  json stages = json::array();
  for (const v1::StageTiming& s : info.stages()) {
    stages.push_back({{"stage", s.stage()}, {"count", s.count()}, {"mean_ms", s.mean_us() / 1e3},
                      {"p50_ms", s.p50_us() / 1e3}, {"p99_ms", s.p99_us() / 1e3}});
  }
  json devices = json::array();
  for (const v1::DeviceInfo& d : info.devices()) devices.push_back({{"device", d.device()}, {"name", d.name()}});
  json calls_by_status = json::object();
  for (const auto& [k, v] : info.calls_by_status()) calls_by_status[k] = v;
  std::vector<std::string> optimisations(info.optimisations().begin(), info.optimisations().end());
  return {
      {"version", info.version()},
      {"model",
       {{"arch", info.model().arch()},
        {"checkpoint", info.model().checkpoint()},
        {"demo", info.model().demo()},
        {"identity", info.model().identity()}}},
      {"precision", info.precision()},
      {"optimisations", optimisations},
      {"devices", devices},
      {"gpu_memory",
       {{"allocated_mib", info.memory().allocated_bytes() / 1048576.0},
        {"peak_allocated_mib", info.memory().peak_allocated_bytes() / 1048576.0},
        {"reserved_mib", info.memory().reserved_bytes() / 1048576.0},
        {"total_mib", info.memory().total_bytes() / 1048576.0}}},
      {"cache",
       {{"hits", info.cache().hits()},
        {"misses", info.cache().misses()},
        {"evictions", info.cache().evictions()},
        {"single_flight_joins", info.cache().single_flight_joins()}}},
      {"encoder_queue",
       {{"batches", info.encoder_queue().batches()},
        {"mean_batch_size", info.encoder_queue().mean_batch_size()},
        {"rejected", info.encoder_queue().rejected()}}},
      {"decoder_queue",
       {{"batches", info.decoder_queue().batches()},
        {"mean_batch_size", info.decoder_queue().mean_batch_size()},
        {"rejected", info.decoder_queue().rejected()}}},
      {"stages", stages},
      {"calls", info.calls()},
      {"calls_by_status", calls_by_status},
  };
}

std::string CsvRow(const std::string& label, const WindowStats& w, const std::string& extra) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%s,%.3f,%.3f,%llu,%llu,%llu,%llu,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.1f,%.1f%s\n",
                label.c_str(), w.start_s, w.duration_s, static_cast<unsigned long long>(w.requests),
                static_cast<unsigned long long>(w.errors), static_cast<unsigned long long>(w.images),
                static_cast<unsigned long long>(w.prompts), w.images_per_s(), w.prompts_per_s(),
                w.requests_per_s(), w.latency.mean_us / 1e3, w.latency.p50_us / 1e3,
                w.latency.p90_us / 1e3, w.latency.p99_us / 1e3, w.latency.max_us / 1e3,
                w.ok ? static_cast<double>(w.response_bytes) / w.ok : 0.0,
                w.masks ? static_cast<double>(w.rle_bytes) / w.masks : 0.0, extra.c_str());
  return buf;
}

constexpr char kCsvHeader[] =
    "start_s,duration_s,calls,errors,images,prompts,images_per_s,prompts_per_s,calls_per_s,"
    "mean_ms,p50_ms,p90_ms,p99_ms,max_ms,response_bytes_per_call,rle_bytes_per_mask";

}  // namespace

nlohmann::json ReportJson(const LoadConfig& c, const LoadResult& r) {
  json windows = json::array();
  for (const WindowStats& w : r.windows) windows.push_back(WindowJson(w));
  json timeline = json::array();
  for (const WindowStats& w : r.timeline) timeline.push_back(WindowJson(w));
  json memory = json::array();
  for (const MemoryPoint& m : r.memory) {
    memory.push_back({{"t_s", m.t_s},
                      {"allocated_mib", m.allocated_bytes / 1048576.0},
                      {"peak_allocated_mib", m.peak_allocated_bytes / 1048576.0}});
  }
  json out = {
      {"tool", "maskload"},
      {"config",
       {{"target", c.target},
        {"workload", WorkloadName(c.workload)},
        {"mode", c.rate > 0 ? "open-loop" : "closed-loop"},
        {"concurrency", c.concurrency},
        {"rate", c.rate},
        {"channels", c.channels},
        {"warmup_s", c.warmup_s},
        {"window_s", c.window_s},
        {"stable_windows", c.stable_windows},
        {"stability", c.stability},
        {"max_duration_s", c.max_duration_s},
        {"max_requests", c.max_requests},
        {"request_timeout_s", c.request_timeout_s},
        {"prompts", {c.min_prompts, c.max_prompts}},
        {"multimask", c.multimask},
        {"format", client::OutputFormatName(c.format)},
        {"unique_images", c.unique_images},
        {"affinity_header", c.affinity_header},
        {"clicks_per_image", c.clicks_per_image},
        {"batch_fraction", c.batch_fraction},
        {"seed", c.seed}}},
      {"stable", r.stable},
      {"stop_reason", r.stop_reason},
      {"summary_windows", r.summary_windows},
      {"summary", WindowJson(r.summary)},
      {"whole_run", WindowJson(r.whole_run)},
      {"warmup_end_s", r.warmup_end_s},
      {"wall_s", r.wall_s},
      {"calls_sent", r.sent},
      {"client_cpu_s", r.client_cpu_s},
      {"client_cpu_us_per_call", r.client_cpu_us_per_call},
      {"windows", windows},
      {"timeline", timeline},
      {"server_memory", memory},
  };
  if (r.background) {
    const BackgroundStats& b = *r.background;
    out["background_generate"] = {{"clients", c.background_generate},
                                  {"points_per_side", c.generate_points_per_side},
                                  {"ok", b.ok}, {"errors", b.errors}, {"masks", b.masks},
                                  {"mean_ms", b.latency.mean_us / 1e3}, {"p50_ms", b.latency.p50_us / 1e3},
                                  {"p99_ms", b.latency.p99_us / 1e3}, {"max_ms", b.latency.max_us / 1e3},
                                  {"server_total_ms", b.server_total_ms},
                                  {"first_error", b.first_error}};
  }
  if (r.info_before) out["server_before"] = ServerJson(*r.info_before);
  if (r.info_after) out["server_after"] = ServerJson(*r.info_after);
  return out;
}

std::string WindowsCsv(const LoadResult& r) {
  std::string csv = std::string("window,") + kCsvHeader + "\n";
  for (size_t i = 0; i < r.windows.size(); ++i) csv += CsvRow(std::to_string(i), r.windows[i], "");
  csv += CsvRow("summary", r.summary, "");
  csv += CsvRow("whole_run", r.whole_run, "");
  return csv;
}

std::string TimelineCsv(const LoadResult& r) {
  std::string csv = std::string("second,") + kCsvHeader + ",phase\n";
  for (size_t i = 0; i < r.timeline.size(); ++i) {
    const WindowStats& w = r.timeline[i];
    const char* phase = w.start_s < r.warmup_end_s ? "warmup" : "measure";
    csv += CsvRow(std::to_string(i), w, std::string(",") + phase);
  }
  return csv;
}

std::string HumanSummary(const LoadConfig& c, const LoadResult& r) {
  std::ostringstream s;
  const WindowStats& w = r.summary;
  char buf[512];
  char mode_buf[64];
  if (c.rate > 0) {
    std::snprintf(mode_buf, sizeof mode_buf, "%g calls/s", c.rate);
  } else {
    std::snprintf(mode_buf, sizeof mode_buf, "%d clients", c.concurrency);
  }
  const std::string mode = mode_buf;
  std::snprintf(buf, sizeof buf,
                "maskload %s %s (%s), %s after %.1f s: %s over %d window(s) of %.1f s\n",
                WorkloadName(c.workload), c.rate > 0 ? "open loop" : "closed loop",
                mode.c_str(),
                r.stop_reason.c_str(), r.wall_s, r.stable ? "stable" : "NOT stable", r.summary_windows,
                c.window_s);
  s << buf;
  std::snprintf(buf, sizeof buf,
                "  throughput: %.2f img/s, %.1f prompts/s, %.1f calls/s (%llu ok, %llu errors)\n",
                w.images_per_s(), w.prompts_per_s(), w.requests_per_s(),
                static_cast<unsigned long long>(w.ok), static_cast<unsigned long long>(w.errors));
  s << buf;
  std::snprintf(buf, sizeof buf, "  latency ms: p50 %.2f  p90 %.2f  p99 %.2f  max %.2f  (mean %.2f)\n",
                w.latency.p50_us / 1e3, w.latency.p90_us / 1e3, w.latency.p99_us / 1e3,
                w.latency.max_us / 1e3, w.latency.mean_us / 1e3);
  s << buf;
  std::snprintf(buf, sizeof buf,
                "  server per call ms: decode %.2f, encoder queue %.2f + compute %.2f, decoder queue %.2f + compute %.2f, postprocess %.2f, total %.2f\n",
                w.decode_us / 1e3, w.encoder_queue_us / 1e3, w.encoder_compute_us / 1e3,
                w.decoder_queue_us / 1e3, w.decoder_compute_us / 1e3, w.postprocess_us / 1e3,
                w.server_total_us / 1e3);
  s << buf;
  std::snprintf(buf, sizeof buf, "  response: %.0f B/call, RLE %.0f B/mask\n",
                w.ok ? static_cast<double>(w.response_bytes) / w.ok : 0.0,
                w.masks ? static_cast<double>(w.rle_bytes) / w.masks : 0.0);
  s << buf;
  s << "  errors (whole run):";
  if (r.whole_run.errors_by_code.empty()) s << " none";
  for (const auto& [code, n] : r.whole_run.errors_by_code) s << " " << code << "=" << n;
  s << "\n";
  if (r.info_after) {
    const v1::GpuMemory& m = r.info_after->memory();
    std::snprintf(buf, sizeof buf, "  server memory: %.1f MiB allocated, %.1f MiB peak (%s)\n",
                  m.allocated_bytes() / 1048576.0, m.peak_allocated_bytes() / 1048576.0,
                  r.info_after->devices_size() ? r.info_after->devices(0).device().c_str() : "?");
    s << buf;
  }
  std::snprintf(buf, sizeof buf, "  client CPU: %.2f s (%.1f us/call)\n", r.client_cpu_s,
                r.client_cpu_us_per_call);
  s << buf;
  if (r.background) {
    const BackgroundStats& b = *r.background;
    std::snprintf(buf, sizeof buf,
                  "  background GenerateMasks (%d client(s), %dx%d grid): %llu ok, %llu errors, "
                  "p50 %.1f p99 %.1f ms (server %.1f ms), %.1f masks/call%s%s\n",
                  c.background_generate, c.generate_points_per_side, c.generate_points_per_side,
                  static_cast<unsigned long long>(b.ok), static_cast<unsigned long long>(b.errors),
                  b.latency.p50_us / 1e3, b.latency.p99_us / 1e3, b.server_total_ms, b.ok ? static_cast<double>(b.masks) / b.ok : 0.0,
                  b.first_error.empty() ? "" : "; first error: ", b.first_error.c_str());
    s << buf;
  }
  return s.str();
}

nlohmann::json SweepJson(const LoadConfig& c, const std::vector<SweepLevel>& levels, bool by_rate) {
  json config = ReportJson(c, LoadResult{})["config"];
  config.erase(by_rate ? "rate" : "concurrency");
  if (by_rate) config["mode"] = "open-loop";
  json rows = json::array();
  for (const SweepLevel& l : levels) {
    rows.push_back({{"concurrency", l.concurrency},
                    {"rate", l.rate},
                    {"stable", l.result.stable},
                    {"stop_reason", l.result.stop_reason},
                    {"summary_windows", l.result.summary_windows},
                    {"summary", WindowJson(l.result.summary)},
                    {"whole_run_errors", l.result.whole_run.errors}});
  }
  return {{"tool", "maskload"}, {"sweep", by_rate ? "rate" : "concurrency"}, {"config", config}, {"levels", rows}};
}

std::string SweepCsv(const std::vector<SweepLevel>& levels) {
  std::string csv = std::string("concurrency,rate,stable,stop_reason,") + kCsvHeader +
                    ",server_total_ms,decode_ms,encoder_queue_ms,encoder_compute_ms,decoder_queue_ms,"
                    "decoder_compute_ms,postprocess_ms\n";
  for (const SweepLevel& l : levels) {
    const WindowStats& w = l.result.summary;
    char stages[256];
    std::snprintf(stages, sizeof stages, ",%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f", w.server_total_us / 1e3,
                  w.decode_us / 1e3, w.encoder_queue_us / 1e3, w.encoder_compute_us / 1e3,
                  w.decoder_queue_us / 1e3, w.decoder_compute_us / 1e3, w.postprocess_us / 1e3);
    char rate[32];
    std::snprintf(rate, sizeof rate, "%g", l.rate);
    csv += CsvRow(std::to_string(l.concurrency) + "," + rate + "," + (l.result.stable ? "1" : "0") + "," +
                      l.result.stop_reason,
                  w, stages);
  }
  return csv;
}

std::string SweepSummary(const std::vector<SweepLevel>& levels, bool by_rate) {
  std::string s = std::string("maskload sweep (") + (by_rate ? "open loop)\n   rate/s" : "closed loop)\n  clients") +
                  "   img/s  prompts/s   calls/s    p50 ms    p99 ms  enc q+c ms  dec q+c ms  stable\n";
  char buf[256];
  for (const SweepLevel& l : levels) {
    const WindowStats& w = l.result.summary;
    char level[32];
    if (by_rate) {
      std::snprintf(level, sizeof level, "%g", l.rate);
    } else {
      std::snprintf(level, sizeof level, "%d", l.concurrency);
    }
    std::snprintf(buf, sizeof buf, "  %7s %7.2f %10.1f %9.1f %9.2f %9.2f %11.2f %11.2f  %s\n", level,
                  w.images_per_s(), w.prompts_per_s(), w.requests_per_s(), w.latency.p50_us / 1e3,
                  w.latency.p99_us / 1e3, (w.encoder_queue_us + w.encoder_compute_us) / 1e3,
                  (w.decoder_queue_us + w.decoder_compute_us) / 1e3, l.result.stable ? "yes" : "NO");
    s += buf;
  }
  return s;
}

int RunPlot(const std::string& python, const std::string& plot_script, const std::string& timeline_csv,
            const std::string& report_json, const std::string& out_png) {
  std::vector<std::string> args = {python, plot_script, timeline_csv, report_json, out_png};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawnp(&pid, python.c_str(), nullptr, nullptr, argv.data(), environ) != 0) return 127;
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return 127;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace maskd::load
