// Parity with the original SAM: runs the reference cases of a golden folder (the format of
// ../shared/golden/tiny: manifest.json, sam_tiny.pth, imageN.png, imageN.pt) through the public
// engine API and measures the differences. Used by `maskctl verify-golden` and the golden tests.
// Torch-free.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/api/engine.h"

namespace maskd {

struct GoldenTolerances {
  double embedding_max_abs = 1e-3;
  double logits_max_abs = 1e-3;
  double iou_max_abs = 1e-4;
  double mask_pixel_fraction = 1e-3;
  // Where the tolerances come from, printed with the report.
  std::string source;

  // The golden README's bounds for an fp32 implementation.
  static GoldenTolerances Fp32();
  // Stated, looser bounds for reduced precision (bf16/fp16): what rounding of activations to 8 (bf16)
  // or 11 (fp16) significant bits allows on this small model; not a parity claim.
  static GoldenTolerances Reduced(Precision p);
};

// One measured comparison.
struct GoldenCaseResult {
  std::string image;
  std::string path;  // "input_resized" (model parity) or "png" (the whole pipeline)
  std::string name;  // "embedding", "case0", ..., "batch"
  double max_abs_embedding = 0;  // only for name == "embedding"
  double max_abs_logits = 0;
  double max_abs_iou = 0;
  double mask_pixel_fraction = 0;  // differing / total mask pixels
  int64_t differing_pixels = 0;
  int64_t resize_max_diff = -1;  // png path, embedding row: max |our resize - input_resized|
  bool passed = true;
  std::string failure;  // which bound was exceeded
};

struct GoldenReport {
  std::vector<GoldenCaseResult> cases;
  GoldenTolerances tolerances;
  bool passed() const;
};

struct GoldenOptions {
  std::string dir;                  // folder with manifest.json
  std::vector<std::string> images;  // empty: all images in the manifest
  bool png_path = true;             // also run from the PNG (decode + resize)
};

// Runs every case on `engine` (which must have been created from dir/<manifest checkpoint>).
StatusOr<GoldenReport> RunGolden(Engine& engine, const GoldenOptions& options,
                                 const GoldenTolerances& tolerances);

// The checkpoint named by dir/manifest.json.
StatusOr<std::string> GoldenCheckpoint(const std::string& dir);

}  // namespace maskd
