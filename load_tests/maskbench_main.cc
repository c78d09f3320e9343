// maskbench: the offline, in-process benchmark of ../shared/WORKLOAD.md (no gRPC), as a waterfall of
// cumulative optimisations, like segment-anything-fast's.
//
// Per image: a 1024 x 768 RGB image prepared up front (resized/normalised/padded, as the reference's
// "already on the GPU" input), P ~ U{1..14} single foreground-point prompts (seeded), multimask,
// masks upscaled to 1024 x 768 and thresholded (with area/bbox/stability; --output rle also encodes
// COCO RLE). Throughput = images / s with all their prompts done, after a full untimed pass.
// Accuracy columns compare with fp32 (plain arithmetic) on the same weights and prompts: on random
// weights they bound numerical error only; they are not mIoU.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cmath>
#include <functional>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "model/api/engine.h"
#include "model/api/image.h"
#include "model/api/mask_generator.h"
#include "model/golden.h"
#include "model/memory_account.h"
#include "model/profiler.h"

namespace {

using Clock = std::chrono::steady_clock;
using maskd::AttentionImpl;
using maskd::Engine;
using maskd::FastPathOptions;
using maskd::Precision;

// The last dense row: the server's default fast path (FastPathOptions::Fast()).
constexpr const char* kLastDenseRow = "+ global attention chosen by timing";

struct Row {
  std::string name;
  Precision precision;
  FastPathOptions fast;
};

// The waterfall: each row adds one step to the previous (fp8 is an alternative on top of the last
// dense row; the int8 and 2:4 rows went with those options after run 17, BENCHMARKS.md).
std::vector<Row> Waterfall() {
  std::vector<Row> rows;
  FastPathOptions f;
  f.attention = AttentionImpl::kMath;
  rows.push_back({"fp32 baseline", Precision::kFloat32, f});
  rows.push_back({"+ bf16", Precision::kBFloat16, f});
  f.attention = AttentionImpl::kSdpa;
  rows.push_back({"+ SDPA (bias as mask)", Precision::kBFloat16, f});
  f.attention = AttentionImpl::kSdpaFolded;
  rows.push_back({"+ rel-pos folded into q/k", Precision::kBFloat16, f});
  f.attention = AttentionImpl::kFused;
  rows.push_back({"+ fused rel-pos kernel", Precision::kBFloat16, f});
  f.cuda_graphs = true;
  rows.push_back({"+ CUDA graphs", Precision::kBFloat16, f});
  f.gpu_preprocess = true;
  f.gpu_postprocess = true;
  f.gpu_rle_string = true;  // the server's default: COCO strings made on the device (the RLE latency rows)
  rows.push_back({"+ GPU pre/post-processing", Precision::kBFloat16, f});
  f.fuse_encoder_ops = true;
  rows.push_back({"+ fused norm/window/residual", Precision::kBFloat16, f});
  f.gelu_epilogue = true;
  rows.push_back({"+ GELU in the fc1 epilogue", Precision::kBFloat16, f});
  f.shared_image_decoder = true;
  f.decoder_attention_kernel = true;
  rows.push_back({"+ shared-image decoder, few-query attention", Precision::kBFloat16, f});
  f.rel_pos_in_kernel = true;
  rows.push_back({"+ rel-pos terms in the attention kernel", Precision::kBFloat16, f});
  f.windows_in_kernel = true;
  rows.push_back({"+ windows made in the attention kernel", Precision::kBFloat16, f});
  f.gemm_tuning = true;
  rows.push_back({"+ GEMM algorithms chosen by timing", Precision::kBFloat16, f});
  f.residual_in_gemm = true;
  rows.push_back({"+ residual adds in the GEMM epilogues", Precision::kBFloat16, f});
  f.attention_timing = true;
  rows.push_back({kLastDenseRow, Precision::kBFloat16, f});
  FastPathOptions e = f;
  e.fp8 = true;
  rows.push_back({"+ fp8 e4m3 linears", Precision::kBFloat16, e});
  return rows;
}

// The server's default fast path: the last dense row's options.
FastPathOptions ServedFastPath() {
  for (const Row& row : Waterfall())
    if (row.name == kLastDenseRow) return row.fast;
  return FastPathOptions::Fast();
}

maskd::ImageRGB8 MakeImage(int w, int h, std::mt19937& rng) {
  // Smooth gradients with a few flat shapes: something a segmenter can bite on, not noise.
  maskd::ImageRGB8 im{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3)};
  std::uniform_int_distribution<int> c(0, 255), px(0, w - 1), py(0, h - 1), r(20, 200);
  const int base[3] = {c(rng), c(rng), c(rng)};
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int k = 0; k < 3; ++k)
        im.pixels[(static_cast<size_t>(y) * w + x) * 3 + k] = static_cast<uint8_t>((base[k] + x / 5 + y / 7 * (k + 1)) % 256);
  for (int s = 0; s < 6; ++s) {
    const int cx = px(rng), cy = py(rng), rad = r(rng), col[3] = {c(rng), c(rng), c(rng)};
    for (int y = std::max(0, cy - rad); y < std::min(h, cy + rad); ++y)
      for (int x = std::max(0, cx - rad); x < std::min(w, cx + rad); ++x)
        if ((x - cx) * (x - cx) + (y - cy) * (y - cy) < rad * rad)
          for (int k = 0; k < 3; ++k) im.pixels[(static_cast<size_t>(y) * w + x) * 3 + k] = static_cast<uint8_t>(col[k]);
  }
  return im;
}

struct Workload {
  std::vector<maskd::ImageRGB8> images;
  std::vector<std::vector<maskd::Point>> prompts;  // per image, one point per prompt
};

Workload MakeWorkload(int n, uint64_t seed) {
  Workload w;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_int_distribution<int> count(1, 14);
  std::uniform_real_distribution<float> fx(0, 1024), fy(0, 768);
  for (int i = 0; i < n; ++i) {
    w.images.push_back(MakeImage(1024, 768, rng));
    std::vector<maskd::Point> p;
    const int k = count(rng);
    for (int j = 0; j < k; ++j) p.push_back({fx(rng), fy(rng), 1});
    w.prompts.push_back(p);
  }
  return w;
}

struct Outputs {
  std::vector<std::vector<float>> logits;  // per prompt: 3 x 256 x 256
  std::vector<std::vector<uint8_t>> masks; // per prompt: 3 masks at 1024 x 768 (bitmask)
};

// Seconds spent in each stage (every Engine call is synchronous, so host clocks time device work).
struct StageTimes {
  double encode = 0, decode = 0, post = 0;
};

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Runs images [first, first + n) through encode + jagged decode + post-processing in batches of bs.
maskd::Status RunPass(Engine& e, const Workload& w, const std::vector<maskd::PreparedImage>& prepared,
                      int first, int n, int bs, maskd::MaskEncoding enc, Outputs* keep,
                      StageTimes* times = nullptr) {
  StageTimes local;
  StageTimes& t = times ? *times : local;
  for (int start = first; start < first + n; start += bs) {
    const int end = std::min(first + n, start + bs);
    std::vector<maskd::PreparedImage> batch;
    for (int i = start; i < end; ++i) batch.push_back(prepared[i % prepared.size()]);
    auto t0 = Clock::now();
    auto embs = e.Encode(batch);
    if (!embs.ok()) return embs.status();
    t.encode += Since(t0);
    std::vector<maskd::DecodeItem> items;
    for (int i = start; i < end; ++i)
      for (const auto& pt : w.prompts[i % w.prompts.size()]) {
        maskd::PromptSpec p;
        p.points = {pt};
        p.multimask = true;
        items.push_back({(*embs)[i - start], p});
      }
    t0 = Clock::now();
    auto dec = e.Decode(items);
    if (!dec.ok()) return dec.status();
    t.decode += Since(t0);
    std::vector<maskd::PostprocessItem> post;
    for (size_t k = 0; k < dec->size(); ++k) {
      const auto& emb = *items[k].embedding;
      post.push_back({(*dec)[k].logits, emb.original_width(), emb.original_height(), emb.input_width(),
                      emb.input_height(), keep ? maskd::MaskEncoding::kBitmask : enc});
    }
    t0 = Clock::now();
    auto masks = e.Postprocess(post);
    if (!masks.ok()) return masks.status();
    t.post += Since(t0);
    if (keep) {
      for (size_t k = 0; k < dec->size(); ++k) {
        keep->logits.push_back((*dec)[k].logits->ToFloat());
        std::vector<uint8_t> m;
        for (const auto& md : (*masks)[k]) m.insert(m.end(), md.bitmask.begin(), md.bitmask.end());
        keep->masks.push_back(std::move(m));
      }
    }
  }
  return maskd::Status::Ok();
}

struct Accuracy {
  double max_logit_err = 0;
  double mean_mask_iou = 1;
};

Accuracy Compare(const Outputs& got, const Outputs& ref) {
  Accuracy a;
  double iou_sum = 0;
  size_t iou_n = 0;
  const size_t hw = 1024 * 768;
  for (size_t p = 0; p < ref.logits.size() && p < got.logits.size(); ++p) {
    for (size_t i = 0; i < ref.logits[p].size(); ++i)
      a.max_logit_err = std::max(a.max_logit_err, static_cast<double>(std::fabs(got.logits[p][i] - ref.logits[p][i])));
    for (size_t m = 0; m * hw < ref.masks[p].size(); ++m) {
      size_t inter = 0, uni = 0;
      for (size_t i = m * hw; i < (m + 1) * hw; ++i) {
        inter += ref.masks[p][i] & got.masks[p][i];
        uni += ref.masks[p][i] | got.masks[p][i];
      }
      iou_sum += uni ? static_cast<double>(inter) / uni : 1.0;
      ++iou_n;
    }
  }
  a.mean_mask_iou = iou_n ? iou_sum / iou_n : 1.0;
  return a;
}

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5))];
}

std::string Slug(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (std::isalnum(static_cast<unsigned char>(c))) o += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    else if (!o.empty() && o.back() != '-') o += '-';
  }
  while (!o.empty() && o.back() == '-') o.pop_back();
  return o;
}

// One encoder pass of `bs` images (encoder) and decode + post-processing of 64 prompts of one image, 64 over 16
// images and one click (decode), each under the Kineto profiler; the per-kernel tables are appended to
// DIR/profiles.txt, Chrome traces (with the host-side operators) written beside it.
// The original image size the decoder rows' masks are post-processed to (--post-original), and its
// longest-side resize.
struct PostGeometry {
  int original_w = 1024, original_h = 768, input_w = 1024, input_h = 768;
};

void ProfileRow(Engine& e, const std::vector<maskd::PreparedImage>& prepared, const std::string& arch,
                const std::string& row, int bs, const std::string& dir, bool encoder, bool decode,
                const PostGeometry& pg = {}) {
  std::vector<maskd::PreparedImage> batch;
  for (int i = 0; i < bs; ++i) batch.push_back(prepared[i % prepared.size()]);
  const std::string tag = arch + "-" + Slug(row) + "-bs" + std::to_string(bs);
  FILE* f = std::fopen((dir + "/profiles.txt").c_str(), "a");
  if (!f) {
    std::fprintf(stderr, "maskbench: cannot append to %s/profiles.txt\n", dir.c_str());
    return;
  }
  auto section = [&](const std::string& title, const std::string& trace, int units, const std::string& unit,
                     const std::function<maskd::Status()>& fn) {
    maskd::Status s = maskd::KernelProfiler::Start();
    if (s.ok()) s = fn();
    auto p = maskd::KernelProfiler::Stop(s.ok() ? dir + "/" + trace : "");
    std::fprintf(f, "\n=== %s (%s)\n", title.c_str(), e.device_name().c_str());
    if (!s.ok()) std::fprintf(f, "failed: %s\n", s.ToString().c_str());
    else if (!p.ok()) std::fprintf(f, "profiler failed: %s\n", p.status().ToString().c_str());
    else std::fprintf(f, "%s", maskd::FormatKernelProfile(*p, units, unit).c_str());
  };
  if (encoder)
    section(arch + " | " + row + " | encoder, batch " + std::to_string(bs), "trace-" + tag + "-encoder.json", bs,
            "img", [&] { return e.Encode(batch).status(); });
  // Sixteen embeddings of one image: the decoder groups prompts by embedding, as it does for sixteen
  // different images.
  auto emb = decode ? e.Encode(std::vector<maskd::PreparedImage>(16, prepared[0]))
                    : maskd::StatusOr<std::vector<std::shared_ptr<const maskd::Embedding>>>(
                          maskd::InvalidArgument("not profiled"));
  // 64 prompts of one image (the figure); 64 prompts over 16 images (the jagged batches the
  // server decodes at 256 clients: run 23, ~64 prompts a batch over the workload's 16 images); one
  // click (kernel total against wall time shows what the click spends off the GPU).
  struct Case {
    int prompts, images;
  };
  for (const Case c : {Case{64, 1}, Case{64, 16}, Case{1, 1}}) {
    if (!emb.ok()) break;
    std::vector<maskd::DecodeItem> items;
    for (int k = 0; k < c.prompts; ++k) {
      maskd::PromptSpec p;
      p.points = {{static_cast<float>((37 * k) % 1024), static_cast<float>((53 * k) % 768), 1}};
      p.multimask = c.prompts == 1;
      items.push_back({(*emb)[static_cast<size_t>(k % c.images)], p});
    }
    auto run = [&]() -> maskd::Status {
      auto dec = e.Decode(items);
      if (!dec.ok()) return dec.status();
      std::vector<maskd::PostprocessItem> post;
      for (auto& d : *dec)
        post.push_back({d.logits, pg.original_w, pg.original_h, pg.input_w, pg.input_h, maskd::MaskEncoding::kRle});
      return e.Postprocess(post).status();
    };
    (void)run();  // this prompt count's decoder graph captured outside the profile
    const std::string what = c.prompts == 1    ? std::string("one click (multimask)")
                             : c.images == 1 ? std::to_string(c.prompts) + " prompts of one image"
                                             : std::to_string(c.prompts) + " prompts over " +
                                                   std::to_string(c.images) + " images";
    const std::string at = pg.original_w == 1024 && pg.original_h == 768
                               ? std::string()
                               : " at " + std::to_string(pg.original_w) + "x" + std::to_string(pg.original_h);
    section(arch + " | " + row + " | " + what + ": decode + RLE post-processing" + at,
            "trace-" + tag + "-decode" + std::to_string(c.prompts) +
                (c.images > 1 ? "x" + std::to_string(c.images) : std::string()) + ".json",
            c.prompts, "prompt", run);
  }
  std::fclose(f);
}

}  // namespace

// "Segment everything" as ../shared/anchors/anchors.py's amg set measures it: one seeded 1024 x 768
// noise image, the original generator's defaults (32 x 32 grid unless --generate-grid, 64 points per batch, no crops,
// thresholds 0.88 / 0.95, box NMS 0.7, COCO RLE records), ms per image after one untimed run. Three
// cases: on a cached embedding (GenerateMasks by image_id), with the encoder (the image's pixels, no
// embedding), and on the cached embedding with both thresholds 0 (every candidate goes through the
// filter, NMS and RLE: the most post-processing a grid can ask for).
void GenerationBench(Engine& engine, const std::string& arch, int iters, int grid, nlohmann::json& results,
                     const std::string& profile_dir) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> byte(0, 255);
  maskd::ImageRGB8 image{1024, 768, std::vector<uint8_t>(1024 * 768 * 3)};
  for (uint8_t& b : image.pixels) b = static_cast<uint8_t>(byte(rng));
  auto prepared = engine.Prepare(image);
  if (!prepared.ok()) {
    std::printf("%-6s generate: prepare failed: %s\n", arch.c_str(), prepared.status().ToString().c_str());
    return;
  }
  auto embedded = engine.Encode({*prepared});
  if (!embedded.ok()) {
    std::printf("%-6s generate: encode failed: %s\n", arch.c_str(), embedded.status().ToString().c_str());
    return;
  }
  struct Case {
    const char* name;
    bool cached;
    float thresh;
  };
  for (const Case c : {Case{"cached embedding", true, -1}, Case{"with the encoder", false, -1},
                       Case{"cached, thresholds 0", true, 0}}) {
    maskd::MaskGenerationParams params;
    params.points_per_side = grid;
    if (c.thresh >= 0) params.pred_iou_thresh = params.stability_score_thresh = c.thresh;
    maskd::MaskGenerationInput input;
    input.width = image.width;
    input.height = image.height;
    if (c.cached) input.embedding = (*embedded)[0];
    else input.image = &image;
    std::vector<double> ms;
    size_t kept = 0;
    maskd::MaskGenerationStats stats;
    for (int it = 0; it < iters + 1; ++it) {
      const auto t0 = Clock::now();
      stats = {};
      auto masks = maskd::GenerateMasks(engine, input, params, {}, &stats);
      if (!masks.ok()) {
        std::printf("%-6s generate %-22s: failed: %s\n", arch.c_str(), c.name, masks.status().ToString().c_str());
        ms.clear();
        break;
      }
      kept = masks->size();
      if (it > 0) ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    if (ms.empty()) continue;
    double mean = 0;
    for (double v : ms) mean += v / ms.size();
    std::printf("%-6s generate %-22s: %dx%d grid, %d decoder batches, %d candidates, %zu masks kept: "
                "mean %.1f ms p50 %.1f ms p99 %.1f ms (%d runs)\n",
                arch.c_str(), c.name, grid, grid, stats.decoder_batches, stats.candidates, kept, mean, Percentile(ms, 0.5),
                Percentile(ms, 0.99), iters);
    std::fflush(stdout);
    results.push_back({{"arch", arch}, {"row", "generate"}, {"case", c.name}, {"points_per_side", grid},
                       {"pred_iou_thresh", params.pred_iou_thresh},
                       {"stability_score_thresh", params.stability_score_thresh},
                       {"decoder_batches", stats.decoder_batches}, {"candidates", stats.candidates},
                       {"masks", kept}, {"mean_ms", mean}, {"p50_ms", Percentile(ms, 0.5)},
                       {"p99_ms", Percentile(ms, 0.99)}, {"runs", iters}, {"device", engine.device_name()}});
    if (!profile_dir.empty()) {
      // One more run of this case under the Kineto profiler: its per-kernel table shows where the
      // generation's time goes (decoder passes, the filter, NMS) and kernel total against wall
      // time what it spends off the GPU.
      FILE* f = std::fopen((profile_dir + "/profiles.txt").c_str(), "a");
      if (!f) continue;
      maskd::Status s = maskd::KernelProfiler::Start();
      if (s.ok()) s = maskd::GenerateMasks(engine, input, params).status();
      auto p = maskd::KernelProfiler::Stop(s.ok() ? profile_dir + "/trace-" + arch + "-generate-" + Slug(c.name) + ".json"
                                                  : "");
      std::fprintf(f, "\n=== %s | generate | %s, %dx%d grid (%s)\n", arch.c_str(), c.name, grid, grid,
                   engine.device_name().c_str());
      if (!s.ok()) std::fprintf(f, "failed: %s\n", s.ToString().c_str());
      else if (!p.ok()) std::fprintf(f, "profiler failed: %s\n", p.status().ToString().c_str());
      else std::fprintf(f, "%s", maskd::FormatKernelProfile(*p, grid * grid, "point").c_str());
      std::fclose(f);
    }
  }
}

int main(int argc, char** argv) {
  CLI::App app{"maskbench: offline SAM benchmark (WORKLOAD.md) as a waterfall of optimisations"};
  std::vector<std::string> archs = {"vit_b", "vit_h"};
  std::vector<int> batches = {1, 8, 32};
  std::vector<int> fp32_batches = {1, 8};
  std::vector<std::string> only_rows;
  std::string device = "cuda", json_path, output = "threshold", golden;
  int images = 32, accuracy_images = 2, latency_iters = 200;
  uint64_t seed = 1;
  bool latency = true;
  app.add_option("--arch", archs, "Architectures (random weights, seeded)")->delimiter(',')->capture_default_str();
  app.add_option("--batch", batches, "Encoder batch sizes")->delimiter(',')->capture_default_str();
  app.add_option("--fp32-batch", fp32_batches, "Batch sizes for the fp32 baseline row (its materialised attention "
                 "needs B x heads x 4096^2 floats)")->delimiter(',')->capture_default_str();
  app.add_option("--rows", only_rows, "Only rows whose name contains one of these (default: all)")->delimiter(',');
  app.add_option("--images", images, "Distinct images; the timed pass covers max(images, 2 x batch)")->capture_default_str();
  app.add_option("--accuracy-images", accuracy_images, "Images compared with fp32 per row")->capture_default_str();
  app.add_option("--seed", seed, "Seed of weights, images and prompts")->capture_default_str();
  app.add_option("--device", device, "cuda, cuda:N or cpu")->capture_default_str();
  app.add_option("--output", output, "threshold (masks + stats, as the reference) or rle (also COCO RLE)")
      ->check(CLI::IsMember({"threshold", "rle"}))->capture_default_str();
  app.add_option("--latency-iters", latency_iters, "Iterations of the one-click latency measurement")->capture_default_str();
  app.add_flag("!--no-latency", latency, "Skip the decoder latency table");
  std::vector<std::string> decode_cases_arg;
  app.add_option("--decode-cases", decode_cases_arg,
                 "Extra rows of the shared-image decoder's latency table, thresholded masks: PROMPTS/IMAGES per call "
                 "(e.g. 16/1,16/16; images <= 32, prompts >= images)")
      ->delimiter(',');
  std::string post_original = "1024x768";
  app.add_option("--post-original", post_original,
                 "WIDTHxHEIGHT of the original image the decoder rows' masks are post-processed to (the "
                 "input is its longest-side resize to 1024; 1024x768, the workload's, makes the second "
                 "resize the identity; e.g. 1920x1080 times the general path)")
      ->capture_default_str();
  int pass_prompts = maskd::EngineOptions{}.decoder_max_pass_prompts;
  app.add_option("--decoder-pass-prompts", pass_prompts,
                 "The most prompts of one token count in one decoder pass (EngineOptions::decoder_max_pass_prompts; "
                 "0: no limit; above 64 the passes run without CUDA graphs)")
      ->check(CLI::Range(0, 4096))->capture_default_str();
  app.add_option("--golden", golden, "Golden folder: also run verify-golden (tiny model) with each row's options");
  app.add_option("--json", json_path, "Write every number as JSON");
  std::string profile_dir;
  bool memory_account = false;
  std::vector<std::string> profile_rows = {"+ fused rel-pos kernel", "+ GPU pre/post-processing", kLastDenseRow};
  app.add_flag("--memory-account", memory_account,
               "After each reported row's timed pass at its largest batch, one more pass (encode + decode + "
               "post-processing of that batch) with the CUDA allocator's history recorded: the peak, and what "
               "was allocated at that moment grouped by the model code that allocated it (CUDA only)");
  app.add_option("--profile", profile_dir,
                 "Folder for per-kernel profiles (LibTorch's Kineto profiler): for each --profile-rows row and "
                 "batch, one encoder pass and the decodes (64 prompts of one image, 64 over 16 images, one click) are profiled; tables go to "
                 "DIR/profiles.txt, Chrome traces to DIR/trace-*.json");
  app.add_option("--profile-rows", profile_rows, "Rows (name substrings) that --profile profiles")
      ->delimiter(',')->capture_default_str();
  int generate_iters = 0;
  bool generate_only = false;
  int generate_grid = 32;
  app.add_option("--generate-grid", generate_grid, "Points per side of the --generate grid")
      ->check(CLI::Range(1, 128))->capture_default_str();
  app.add_option("--generate", generate_iters,
                 "Also time automatic mask generation (anchors.py's amg set) over this many runs per case, "
                 "with the last dense row's options (0: not)")->capture_default_str();
  app.add_flag("--generate-only", generate_only,
               "Only the --generate cases (bf16, the server's default fast path): no waterfall, no latency table");
  CLI11_PARSE(app, argc, argv);
  int post_w = 0, post_h = 0;
  {
    char x = 0, extra = 0;
    std::istringstream in(post_original);
    if (!(in >> post_w >> x >> post_h) || x != 'x' || in >> extra || post_w < 1 || post_h < 1 || post_w > 16384 ||
        post_h > 16384) {
      std::fprintf(stderr, "--post-original: '%s' is not WIDTHxHEIGHT with sides in [1, 16384]\n",
                   post_original.c_str());
      return 2;
    }
  }
  const auto [post_in_w, post_in_h] = maskd::ResizedSize(post_w, post_h, 1024);
  const PostGeometry post_geometry{post_w, post_h, post_in_w, post_in_h};
  std::vector<std::pair<int, int>> decode_cases;  // (prompts, images)
  for (const std::string& c : decode_cases_arg) {
    int p = 0, i = 0;
    char tail = 0;
    if (std::sscanf(c.c_str(), "%d/%d%c", &p, &i, &tail) != 2 || i < 1 || i > 32 || p < i || p > 4096) {
      std::fprintf(stderr, "--decode-cases: '%s' is not PROMPTS/IMAGES with 1 <= IMAGES <= 32 and IMAGES <= PROMPTS <= 4096\n",
                   c.c_str());
      return 2;
    }
    decode_cases.emplace_back(p, i);
  }
  if (generate_only && generate_iters <= 0) generate_iters = 10;

  const auto enc = output == "rle" ? maskd::MaskEncoding::kRle : maskd::MaskEncoding::kNone;
  const Workload w = MakeWorkload(images, seed);
  nlohmann::json results = nlohmann::json::array();
  // Warnings, and the choices the engine makes by timing at start-up (what a row ran).
  auto quiet = [](maskd::LogLevel l, std::string_view m) {
    const bool choice = m.rfind("global attention per block", 0) == 0;
    if ((l >= maskd::LogLevel::kWarning && m.find("MEANINGLESS") == std::string_view::npos) || choice)
      std::fprintf(stderr, "%.*s\n", static_cast<int>(m.size()), m.data());
  };

  if (!generate_only) {
  std::printf("maskbench: %d images 1024x768, P~U{1..14} points/image (%zu prompts), multimask, output %s, seed %llu\n",
              images, [&] { size_t n = 0; for (auto& p : w.prompts) n += p.size(); return n; }(), output.c_str(),
              static_cast<unsigned long long>(seed));
  std::printf("%-6s %-34s %5s %9s %9s %10s %9s %11s %9s %8s  %s\n", "model", "configuration", "batch", "img/s", "ms/img",
              "peak MiB", "prep ms", "max|dlogit|", "mask IoU", "golden", "ms/img: encode decode post");
  }
  for (const std::string& arch : archs) {
    // Reference outputs: fp32, plain arithmetic, on the first accuracy_images images.
    maskd::EngineOptions base;
    base.random_arch = arch;
    base.demo_seed = seed;
    base.device = device;
    base.encoder_batch_sizes = batches;
    base.warmup = false;
    base.decoder_max_pass_prompts = pass_prompts;
    base.log = quiet;
    if (generate_only) {
      maskd::EngineOptions o = base;
      o.encoder_batch_sizes = {1};
      o.precision = Precision::kBFloat16;
      o.fast = ServedFastPath();
      if (device.rfind("cpu", 0) == 0) o.fast = FastPathOptions{};  // the fast path's kernels are CUDA's
      auto e = Engine::Create(o);
      if (!e.ok()) {
        std::printf("%-6s generate: cannot create engine: %s\n", arch.c_str(), e.status().ToString().c_str());
        continue;
      }
      GenerationBench(**e, arch, generate_iters, generate_grid, results, profile_dir);
      continue;
    }
    Outputs ref;
    std::unique_ptr<Engine> engine;
    Precision current = Precision::kFloat32;
    auto selected = [&](const std::string& name) {
      return only_rows.empty() || std::any_of(only_rows.begin(), only_rows.end(),
                                              [&](const std::string& r) { return name.find(r) != std::string::npos; });
    };
    for (const Row& row : Waterfall()) {
      // The fp32 row is every row's reference: run it (untimed) when only other rows are asked for.
      if (!selected(row.name) && !(row.precision == Precision::kFloat32 && ref.logits.empty())) continue;
      if (!engine || current != row.precision) {
        engine.reset();
        maskd::EngineOptions o = base;
        o.precision = row.precision;
        o.fast = row.fast;
        if (row.precision == Precision::kFloat32) o.encoder_batch_sizes = fp32_batches;
        auto e = Engine::Create(o);
        if (!e.ok()) {
          std::printf("%-6s %-34s  cannot create engine: %s\n", arch.c_str(), row.name.c_str(), e.status().ToString().c_str());
          continue;
        }
        engine = std::move(*e);
        current = row.precision;
      } else {
        maskd::Status s = engine->Reconfigure(row.fast);
        if (!s.ok()) {
          std::printf("%-6s %-34s  n/a: %s\n", arch.c_str(), row.name.c_str(), s.ToString().c_str());
          continue;
        }
      }
      // Preparation (resize/normalise/pad) once per row, timed separately.
      std::vector<maskd::PreparedImage> prepared;
      const auto p0 = Clock::now();
      for (const auto& im : w.images) {
        auto p = engine->Prepare(im);
        if (!p.ok()) {
          std::fprintf(stderr, "prepare: %s\n", p.status().ToString().c_str());
          return 1;
        }
        prepared.push_back(*p);
      }
      const double prep_ms = std::chrono::duration<double, std::milli>(Clock::now() - p0).count() / images;
      Outputs out;
      maskd::Status s = RunPass(*engine, w, prepared, 0, accuracy_images, 1, enc, &out);
      if (s.ok() && ref.logits.empty()) ref = out;
      const std::vector<int>& bss = row.precision == Precision::kFloat32 ? fp32_batches : batches;
      const bool report_row = selected(row.name);
      if (!report_row) continue;
      const Accuracy acc = Compare(out, ref);
      std::string golden_result = "-";
      if (!golden.empty()) {
        maskd::EngineOptions g;
        auto golden_ckpt = maskd::GoldenCheckpoint(golden);  // the checkpoint its manifest names
        g.checkpoint = golden_ckpt.ok() ? *golden_ckpt : golden + "/sam_tiny.pth";
        g.device = device;
        g.precision = row.precision;
        g.fast = row.fast;
        if (g.fast.attention == AttentionImpl::kFused) g.fast.attention = AttentionImpl::kAuto;  // head width 48
        g.log = quiet;
        auto ge = Engine::Create(g);
        if (ge.ok()) {
          const auto tol = row.precision == Precision::kFloat32 ? maskd::GoldenTolerances::Fp32()
                                                                 : maskd::GoldenTolerances::Reduced(row.precision);
          auto rep = maskd::RunGolden(**ge, {golden, {}, true}, tol);
          golden_result = rep.ok() ? (rep->passed() ? "pass" : "FAIL") : "error";
        } else {
          golden_result = "n/a";
        }
      }
      for (int bs : bss) {
        if (!s.ok()) break;
        // Untimed full pass (every jagged prompt count warm), then the timed pass.
        const int n = std::max(images, 2 * bs);
        s = RunPass(*engine, w, prepared, 0, n, bs, enc, nullptr);
        if (!s.ok()) break;
        engine->ResetPeakMemory();
        const auto t0 = Clock::now();
        StageTimes st;
        s = RunPass(*engine, w, prepared, 0, n, bs, enc, nullptr, &st);
        const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
        if (!s.ok()) break;
        const double peak = engine->memory().peak_allocated / 1048576.0;
        std::printf("%-6s %-34s %5d %9.1f %9.2f %10.0f %9.2f %11.3e %9.4f %8s  %6.2f %6.2f %6.2f\n", arch.c_str(),
                    row.name.c_str(), bs, n / sec, 1000 * sec / n, peak, prep_ms, acc.max_logit_err, acc.mean_mask_iou,
                    golden_result.c_str(), 1000 * st.encode / n, 1000 * st.decode / n, 1000 * st.post / n);
        std::fflush(stdout);
        std::string opts;
        for (const auto& o : engine->optimisations()) opts += o + " ";
        if (!profile_dir.empty() &&
            std::any_of(profile_rows.begin(), profile_rows.end(),
                        [&](const std::string& r) { return row.name.find(r) != std::string::npos; })) {
          ProfileRow(*engine, prepared, arch, row.name, bs, profile_dir, /*encoder=*/true, /*decode=*/false);
        }
        nlohmann::json account_json;
        if (memory_account && bs == bss.back()) {
          const std::string& dev = engine->device();
          const int index = dev.rfind("cuda:", 0) == 0 ? std::atoi(dev.c_str() + 5) : 0;
          auto acct = maskd::AccountDevicePeak(index, [&] { return RunPass(*engine, w, prepared, 0, bs, bs, enc, nullptr); });
          if (!acct.ok()) {
            std::printf("%-6s %-34s  memory account: %s\n", arch.c_str(), row.name.c_str(), acct.status().ToString().c_str());
          } else {
            std::printf("--- memory account: %s, %s, batch %d\n%s", arch.c_str(), row.name.c_str(), bs,
                        maskd::FormatMemoryAccount(*acct).c_str());
            account_json = {{"peak_mib", acct->peak_bytes / 1048576.0}, {"before_mib", acct->before_bytes / 1048576.0},
                            {"truncated", acct->truncated}, {"rows", nlohmann::json::array()}};
            for (const auto& r : acct->rows)
              account_json["rows"].push_back({{"label", r.label}, {"mib", r.bytes / 1048576.0}, {"blocks", r.count},
                                              {"largest_mib", r.largest / 1048576.0}});
          }
          std::fflush(stdout);
        }
        results.push_back({{"arch", arch}, {"row", row.name}, {"batch", bs}, {"images", n}, {"img_per_s", n / sec},
                           {"ms_per_img", 1000 * sec / n}, {"peak_mib", peak}, {"prepare_ms", prep_ms},
                           {"max_logit_err_vs_fp32", acc.max_logit_err}, {"mean_mask_iou_vs_fp32", acc.mean_mask_iou},
                           {"golden", golden_result}, {"optimisations", opts}, {"device", engine->device_name()},
                           {"encode_ms_per_img", 1000 * st.encode / n}, {"decode_ms_per_img", 1000 * st.decode / n},
                           {"postprocess_ms_per_img", 1000 * st.post / n}});
        if (!account_json.is_null()) results.back()["memory_account"] = account_json;
      }
      if (!s.ok()) std::printf("%-6s %-34s  failed: %s\n", arch.c_str(), row.name.c_str(), s.ToString().c_str());
    }
    if (latency && engine) {
      // The decoder as served (the last dense row's options; fp8 touches only the encoder), with
      // the original decoder and with the shared-image one. Per call: decode + RLE post-processing of
      // masks at 1024 x 768. "1" is one click; "64" 64 prompts of one image in one call; "256/32" 256
      // prompts over 32 images (8 each) in one call, the jagged batch of a loaded server.
      const FastPathOptions served = ServedFastPath();
      if (current != Precision::kBFloat16) continue;
      std::vector<std::shared_ptr<const maskd::Embedding>> embs;
      for (int i = 0; i < 32 && i < static_cast<int>(w.images.size()); ++i) {
        auto e = engine->Encode({*engine->Prepare(w.images[i])});
        if (e.ok()) embs.push_back((*e)[0]);
      }
      if (embs.empty()) continue;
      for (bool shared : {false, true}) {
        FastPathOptions f = served;
        f.shared_image_decoder = shared;
        const char* name = shared ? "shared-image" : "original";
        if (const maskd::Status st = engine->Reconfigure(f); !st.ok()) {
          std::printf("%-6s decoder %-12s: cannot configure: %s\n", arch.c_str(), name, st.ToString().c_str());
          continue;
        }
        struct Case {
          int prompts, images;
        };
        // Threshold-only ("none": area, box and stability of each mask at 1024 x 768, no encoding) is
        // what the seed's prompts64_ms measures; RLE is what the server returns.
        std::vector<std::pair<Case, maskd::MaskEncoding>> cases = {
            {Case{1, 1}, maskd::MaskEncoding::kRle}, {Case{64, 1}, maskd::MaskEncoding::kRle},
            {Case{256, 32}, maskd::MaskEncoding::kRle}};
        if (shared) {
          for (Case c : {Case{1, 1}, Case{64, 1}, Case{256, 32}}) cases.push_back({c, maskd::MaskEncoding::kNone});
          for (const auto& [p, i] : decode_cases) cases.push_back({Case{p, i}, maskd::MaskEncoding::kNone});
        }
        for (auto [cs, out_enc] : cases) {
          const char* enc_name = out_enc == maskd::MaskEncoding::kRle ? "rle" : "none";
          if (cs.images > static_cast<int>(embs.size())) continue;
          std::vector<double> ms, dec_ms, post_ms;  // the call, and its Decode / Postprocess shares
          const int iters = cs.prompts >= 64 ? std::max(20, latency_iters / 4) : latency_iters;
          for (int it = 0; it < iters + 10; ++it) {
            std::vector<maskd::DecodeItem> items;
            for (int k = 0; k < cs.prompts; ++k) {
              maskd::PromptSpec p;
              p.points = {{static_cast<float>((37 * (it + k)) % 1024), static_cast<float>((53 * (it + k)) % 768), 1}};
              items.push_back({embs[k % cs.images], p});
            }
            const auto t0 = Clock::now();
            auto dec = engine->Decode(items);
            if (!dec.ok()) {
              std::printf("%-6s decoder %-12s: decode failed: %s\n", arch.c_str(), name, dec.status().ToString().c_str());
              break;
            }
            const auto t1 = Clock::now();
            std::vector<maskd::PostprocessItem> post;
            for (auto& d : *dec) post.push_back({d.logits, post_w, post_h, post_in_w, post_in_h, out_enc});
            auto m = engine->Postprocess(post);
            if (!m.ok()) {
              std::printf("%-6s decoder %-12s: post-processing failed: %s\n", arch.c_str(), name,
                          m.status().ToString().c_str());
              break;
            }
            if (it >= 10) {
              const auto t2 = Clock::now();
              ms.push_back(std::chrono::duration<double, std::milli>(t2 - t0).count());
              dec_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
              post_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
            }
          }
          if (ms.empty()) continue;
          // Decode and Postprocess each return after their device work (results on the host), so
          // their shares against the profile's kernel totals say where host time goes.
          std::printf("%-6s decoder %-12s: %3d prompt(s) over %2d image(s)/call, masks %-4s: p50 %.2f ms p99 %.2f ms -> %.0f prompts/s"
                      " (decode p50 %.2f + post-processing p50 %.2f ms)%s\n",
                      arch.c_str(), name, cs.prompts, cs.images, enc_name, Percentile(ms, 0.5), Percentile(ms, 0.99),
                      cs.prompts * 1000.0 / Percentile(ms, 0.5), Percentile(dec_ms, 0.5), Percentile(post_ms, 0.5),
                      post_original == "1024x768" ? "" : (" masks at " + post_original).c_str());
          std::fflush(stdout);
          results.push_back({{"arch", arch}, {"row", "decoder latency"}, {"decoder", name},
                             {"prompts_per_call", cs.prompts}, {"images_per_call", cs.images}, {"masks", enc_name},
                             {"p50_ms", Percentile(ms, 0.5)}, {"p99_ms", Percentile(ms, 0.99)},
                             {"decode_p50_ms", Percentile(dec_ms, 0.5)}, {"postprocess_p50_ms", Percentile(post_ms, 0.5)},
                             {"post_original", post_original}});
        }
        if (!profile_dir.empty()) {
          // The 64-prompt call under the profiler with this decoder (trace for the host gaps too).
          std::vector<maskd::PreparedImage> one = {*engine->Prepare(w.images[0])};
          ProfileRow(*engine, one, arch, std::string("decoder ") + name, 1, profile_dir, /*encoder=*/false,
                     /*decode=*/true, post_geometry);
        }
      }
    }
    if (generate_iters > 0 && engine && current == Precision::kBFloat16) {
      if (engine->Reconfigure(ServedFastPath()).ok())
        GenerationBench(*engine, arch, generate_iters, generate_grid, results, profile_dir);
    }
  }
  if (!json_path.empty()) std::ofstream(json_path) << results.dump(1) << "\n";
  return 0;
}
