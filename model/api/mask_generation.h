// Automatic mask generation ("segment everything") as values: the parameters of the original
// SamAutomaticMaskGenerator with its defaults, their validation and limits, and the torch-free parts
// of its algorithm that only need numbers (point grids, crop boxes, greedy box NMS, small-region
// removal). The generation loop itself is model/api/mask_generator.h; the model-side filtering
// (upscale, IoU/stability filter, boxes, RLE) and the device NMS are Engine::FilterMasks/BoxNms.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "model/api/status.h"

namespace maskd {

// A point in [0, 1] x [0, 1] of a crop (x across, y down), as the original's point grids.
struct NormalizedPoint {
  double x = 0, y = 0;
};

// The original's parameters and defaults (segment_anything.SamAutomaticMaskGenerator).
struct MaskGenerationParams {
  // Points per side of the grid of layer 0 (layer i: points_per_side / downscale^i). 0 when
  // point_grids is given: exactly one of the two.
  int points_per_side = 32;
  // Explicit grids, one per crop layer (crop_n_layers + 1 of them), normalised to each crop.
  std::vector<std::vector<NormalizedPoint>> point_grids;
  // Points decoded together (one decoder pass of multimask prompts).
  int points_per_batch = 64;
  // Keep masks whose predicted IoU is > this (0: no filter).
  float pred_iou_thresh = 0.88f;
  // Keep masks whose stability score is >= this (0: no filter).
  float stability_score_thresh = 0.95f;
  // Stability: |logits > offset| / |logits > -offset| (mask threshold 0).
  float stability_score_offset = 1.0f;
  // Box IoU above which NMS drops the lower-scoring mask of one crop.
  float box_nms_thresh = 0.7f;
  // Crop layers: layer i cuts the image into 2^i x 2^i overlapping crops, each encoded on its own.
  int crop_n_layers = 0;
  // Box IoU for the NMS between crops (smaller crops win).
  float crop_nms_thresh = 0.7f;
  // Overlap of neighbouring crops, as a fraction of the image's short side (at layer 1).
  double crop_overlap_ratio = 512.0 / 1500.0;
  // Layer i's grid has points_per_side / factor^i points per side.
  int crop_n_points_downscale_factor = 1;
  // > 0: fill holes and remove islands smaller than this many pixels, then NMS again.
  int min_mask_region_area = 0;
};

// What one request may ask for (the server's flags may lower them).
struct MaskGenerationLimits {
  int max_points_per_side = 128;
  // Points over all layers' grids (one grid each; each crop of a layer decodes its layer's grid).
  int max_grid_points = 16384;
  int max_points_per_batch = 1024;
  int max_crop_n_layers = 3;
  int max_crop_n_points_downscale_factor = 16;
};

// INVALID_ARGUMENT naming the field (field_prefix + "." + name), its value and what was expected.
Status ValidateMaskGenerationParams(const MaskGenerationParams& params,
                                    std::string_view field_prefix = "params",
                                    const MaskGenerationLimits& limits = MaskGenerationLimits{});

// The original's build_point_grid: n x n cell centres, row by row (y outer, x inner).
std::vector<NormalizedPoint> BuildPointGrid(int n_per_side);
// One grid per layer 0..crop_n_layers: the explicit grids, or BuildPointGrid of
// int(points_per_side / downscale^i).
std::vector<std::vector<NormalizedPoint>> BuildPointGrids(const MaskGenerationParams& params);

// x0, y0, x1, y1 (exclusive) in image pixels.
using CropBox = std::array<int, 4>;
struct LayeredCrop {
  CropBox box;
  int layer = 0;
};
// The original's generate_crop_boxes: the whole image (layer 0), then per layer i >= 1 a
// 2^i x 2^i set of overlapping crops, x outer and y inner.
std::vector<LayeredCrop> GenerateCropBoxes(int width, int height, int crop_n_layers,
                                           double crop_overlap_ratio);

// Greedy NMS on the host, torchvision's nms: visit boxes by descending score (ties in index
// order), keep one unless its IoU with an earlier kept box is > iou_threshold. Boxes x0, y0, x1, y1;
// area (x1 - x0) * (y1 - y0). Returns the kept indices in visiting order.
std::vector<int> BoxNmsHost(const std::vector<std::array<float, 4>>& boxes,
                            const std::vector<float>& scores, float iou_threshold);

// The original's remove_small_regions on a row-major 0/1 mask (8-connected components): mode
// holes fills background components smaller than area_thresh; islands removes foreground
// components smaller than it (keeping the largest when all are). Returns whether it changed
// anything (the original's "changed": true as soon as a small component exists).
bool RemoveSmallRegions(std::vector<uint8_t>& mask, int width, int height, double area_thresh,
                        bool holes);

// The original's batched_mask_to_box for one row-major mask: x0, y0, x1, y1 with x1/y1 the last
// set column/row (inclusive); all 0 for an empty mask.
std::array<int, 4> MaskBox(const uint8_t* mask, int width, int height);

}  // namespace maskd
