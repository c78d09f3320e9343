// What the pipeline, batchers and caches speak: plain values, no protobuf. server/wire.h converts
// between these and maskd.v1 messages at the edge (the handlers and the stream reactor).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/api/engine.h"
#include "model/api/mask_generator.h"
#include "model/io/polygon.h"

namespace maskd::server {

// The image a request is about. The views point into the request message, which outlives the call.
struct ImageInput {
  enum class Kind { kEncoded, kRaw, kId };
  Kind kind = Kind::kId;
  std::string_view bytes;          // kEncoded: the file; kRaw: width * height * 3 RGB bytes
  uint32_t width = 0, height = 0;  // kRaw
  std::string image_id;            // kId
  bool has_bytes() const { return kind != Kind::kId; }
};

// A prompt whose structure has been checked (ValidatePrompts); its mask input is resolved and its
// geometry checked (ValidatePrompt) once the image is known.
struct PromptDraft {
  PromptSpec spec;  // points, box, multimask (mask_input not yet set)
  enum class Mask { kNone, kResult, kLogits };
  Mask mask = Mask::kNone;
  std::string result_id;
  std::optional<uint32_t> mask_index;
  const float* logits = nullptr;  // kLogits: kLowResSide x kLowResSide values in the request
};

enum class OutputFormat { kRle, kPng, kLowResLogits, kPolygons };

// How a Segment call wants its masks.
struct OutputSpec {
  OutputFormat format = OutputFormat::kRle;
  double polygon_tolerance = 0;  // kPolygons: Douglas-Peucker tolerance in pixels
};

struct MaskResult {
  float score = 0;
  float stability_score = 0;
  std::array<uint32_t, 4> bbox{};  // x, y, width, height
  uint64_t area = 0;
  std::string rle_counts;  // kRle: COCO's compressed counts string
  std::string png;         // kPng
  std::vector<float> low_res_logits;  // kLowResLogits: low_res_side x low_res_side
  int low_res_side = 0;
  std::vector<Contour> polygons;  // kPolygons
};

struct PromptResult {
  std::string result_id;
  uint32_t best_index = 0;
  std::vector<MaskResult> masks;
};

// Microseconds per stage of one call (maskd.v1.CallTiming).
struct CallTiming {
  uint64_t decode_us = 0, encoder_queue_us = 0, encoder_compute_us = 0;
  uint64_t decoder_queue_us = 0, decoder_compute_us = 0, postprocess_us = 0, total_us = 0;
};

// What Embed answers, and the image part of every Segment answer.
struct ImageOutcome {
  std::string image_id;
  int width = 0, height = 0;
  bool cached = false;
  CallTiming timing;
  // Embed with return_embedding: the embedding's values and the resized size before padding.
  std::optional<ExportedEmbedding> embedding;
  int input_width = 0, input_height = 0;
};

struct SegmentOutcome {
  ImageOutcome image;
  OutputFormat format = OutputFormat::kRle;
  std::vector<PromptResult> results;  // one per prompt, in order; empty on failure
};

// What a GenerateMasks call asks for: the generator's parameters (validated) and the output form
// (kRle, kPng or kPolygons).
struct GenerationSpec {
  MaskGenerationParams params;
  OutputSpec output;
};

// One generated mask in the requested form (maskd.v1.GeneratedMask).
struct GeneratedMaskResult {
  uint64_t area = 0;
  std::array<int, 4> bbox{};      // x, y, x1 - x0, y1 - y0 (the original's XYWH)
  std::array<int, 4> crop_box{};  // x, y, width, height
  float predicted_iou = 0, stability_score = 0;
  double point_x = 0, point_y = 0;
  std::string rle_counts;         // kRle
  std::string png;                // kPng
  std::vector<Contour> polygons;  // kPolygons
};

struct GenerateOutcome {
  ImageOutcome image;
  OutputFormat format = OutputFormat::kRle;
  std::vector<GeneratedMaskResult> masks;  // empty on failure
  MaskGenerationStats stats;
};

}  // namespace maskd::server
