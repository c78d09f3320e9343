// maskload's outputs: a JSON report (configuration, server, summary, windows, per-second timeline),
// a CSV with one row per measurement window plus a summary row, a per-second timeline CSV (what
// plot_maskload.py draws), and a human summary.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "load_tests/load_runner.h"

namespace maskd::load {

nlohmann::json ReportJson(const LoadConfig& config, const LoadResult& result);
std::string WindowsCsv(const LoadResult& result);
std::string TimelineCsv(const LoadResult& result);
std::string HumanSummary(const LoadConfig& config, const LoadResult& result);

// Runs `python plot_script timeline_csv report_json out_png`; returns its exit status (127 when it
// could not be started).
int RunPlot(const std::string& python, const std::string& plot_script, const std::string& timeline_csv,
            const std::string& report_json, const std::string& out_png);

}  // namespace maskd::load
