// Automatic mask generation ("segment everything"), the original SamAutomaticMaskGenerator's
// algorithm over the torch-free Engine: for each crop (the whole image, then crop_n_layers layers of
// overlapping crops) the layer's point grid is decoded in batches of points_per_batch multimask
// prompts, each batch filtered on the engine (Engine::FilterMasks), the crop's masks deduplicated by
// box NMS, uncropped, then deduplicated across crops (smaller crops win), and optionally cleaned of
// small holes and islands (min_mask_region_area) with one more NMS. Crops other than the whole image
// are cut from the pixels, prepared and encoded.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <vector>

#include "model/api/engine.h"
#include "model/api/mask_generation.h"

namespace maskd {

// One output record, the original's fields.
struct GeneratedMask {
  // COCO RLE counts (column-major, first run zeros) at the image's size.
  std::vector<uint32_t> rle_counts;
  uint64_t area = 0;
  // The original's box_xyxy_to_xywh of its inclusive boxes: x0, y0, x1 - x0, y1 - y0.
  std::array<int, 4> bbox{};
  float predicted_iou = 0, stability_score = 0;
  // The grid point that produced the mask, in image pixels.
  double point_x = 0, point_y = 0;
  // The crop it was generated in: x, y, width, height.
  std::array<int, 4> crop_box{};
};

struct MaskGenerationInput {
  int width = 0, height = 0;
  // The whole image's embedding; without it the image is encoded.
  std::shared_ptr<const Embedding> embedding;
  // The pixels: needed for crop layers, or when there is no embedding.
  const ImageRGB8* image = nullptr;
};

// How point batches are decoded (the server routes them through its shared decoder batcher);
// default: Engine::DecodeEach.
using GenerationDecodeFn =
    std::function<StatusOr<std::vector<StatusOr<DecodedPrompt>>>(const std::vector<DecodeItem>&)>;

struct MaskGenerationStats {
  int crops = 0, points = 0, decoder_batches = 0, candidates = 0;
};

// Validates params (INVALID_ARGUMENT naming the field) and runs the generator. Records come in the
// original's order (after its NMS passes).
StatusOr<std::vector<GeneratedMask>> GenerateMasks(Engine& engine, const MaskGenerationInput& input,
                                                   const MaskGenerationParams& params,
                                                   const GenerationDecodeFn& decode = {},
                                                   MaskGenerationStats* stats = nullptr,
                                                   const MaskGenerationLimits& limits = MaskGenerationLimits{});

}  // namespace maskd
