// maskload's outputs: a JSON report (configuration, server, summary, windows, per-second timeline),
// a CSV with one row per measurement window plus a summary row, a per-second timeline CSV (what
// plot_maskload.py draws), and a human summary.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "load_tests/load_runner.h"

namespace maskd::load {

nlohmann::json ReportJson(const LoadConfig& config, const LoadResult& result);
std::string WindowsCsv(const LoadResult& result);
std::string TimelineCsv(const LoadResult& result);
std::string HumanSummary(const LoadConfig& config, const LoadResult& result);

// A sweep (maskload -c 1,4,16,... closed loop, or --rate 100,200,... open loop): one complete run
// per level.
struct SweepLevel {
  int concurrency = 0;
  double rate = 0;  // > 0: an open-loop level
  LoadResult result;
};
// One row per level: its summary (rates, latency percentiles, the server's per-call stage timings),
// stability and stop reason; the configuration shared by the levels. `by_rate`: an open-loop sweep.
nlohmann::json SweepJson(const LoadConfig& config, const std::vector<SweepLevel>& levels, bool by_rate);
std::string SweepCsv(const std::vector<SweepLevel>& levels);
std::string SweepSummary(const std::vector<SweepLevel>& levels, bool by_rate);

// Runs `python plot_script timeline_csv report_json out_png`; returns its exit status (127 when it
// could not be started).
int RunPlot(const std::string& python, const std::string& plot_script, const std::string& timeline_csv,
            const std::string& report_json, const std::string& out_png);

}  // namespace maskd::load
