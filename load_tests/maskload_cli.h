// maskload's command line: every flag fills one field of MaskloadOptions (flags, then the
// environment for --server and --python), in this one place.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "load_tests/load_runner.h"

namespace maskd::load {

struct MaskloadOptions {
  LoadConfig load;
  // --concurrency as given ("8" or a sweep "1,4,16,64"); Finish parses it into concurrency_levels
  // and sets load.concurrency to the first level.
  std::string concurrency = "8";
  std::vector<int> concurrency_levels;
  // --rate as given ("0", "200" or an open-loop sweep "100,200,400"); parsed into rate_levels, the
  // first of which is load.rate.
  std::string rate = "0";
  std::vector<double> rate_levels;
  client::SecurityFlags security;  // read into load.security by FinishMaskloadOptions
  std::string workload = "batch";
  std::string format = "rle";
  // Image pool.
  int images = 16;
  std::string size = "1024x768";
  int width = 1024, height = 768;
  int jpeg_quality = 90;
  std::string image_dir;
  // Outputs.
  std::string out;  // prefix: PREFIX.json, PREFIX.csv, PREFIX.timeline.csv, PREFIX.png
  bool plot = true;
  std::string python;
  std::string plot_script;
  bool quiet = false;
  int64_t max_errors = -1;
  // Exit 5 when the run stopped before its last --stable-windows windows agreed (IsStable).
  bool fail_unstable = false;
  // This process's glibc malloc keeps freed memory (server/malloc_tuning.h), as maskd's does.
  bool malloc_tuning = true;
};

// Adds the flags to `app`; call Finish after app.parse() to validate and convert the text fields.
void AddMaskloadFlags(CLI::App& app, MaskloadOptions& options);
Status FinishMaskloadOptions(MaskloadOptions& options);

// Checks, before anything is run, that every file --out will write can be created or overwritten
// (the folder exists and takes new files; no output name is a folder). Ok without --out.
Status CheckOutputPaths(const MaskloadOptions& options);

// Runs maskload as configured (output paths checked, image pool, run, outputs, plot); returns the
// process exit status (of a sweep: the first level's that is not 0): 0 ok, 1 could not run (or cannot write --out), 3 more errors than
// --max-errors, 4 the plot was asked for and failed, 5 not stable with --fail-unstable.
int RunMaskload(const MaskloadOptions& options);

}  // namespace maskd::load
