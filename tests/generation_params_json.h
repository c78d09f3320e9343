// The automatic mask generator's parameters from a JSON object with the original's argument names
// (the oracle's cases, tests/oracle/amg_oracle.py, and the server tests' cases): the keys present
// override MaskGenerationParams' defaults. Shared by model_generate_test and server_generate_test.
#pragma once

#include <nlohmann/json.hpp>

#include "model/api/mask_generation.h"

namespace maskd::testing {

inline MaskGenerationParams GenerationParamsFromJson(const nlohmann::json& j) {
  MaskGenerationParams p;
  if (j.contains("points_per_side")) p.points_per_side = j["points_per_side"];
  if (j.contains("points_per_batch")) p.points_per_batch = j["points_per_batch"];
  if (j.contains("pred_iou_thresh")) p.pred_iou_thresh = j["pred_iou_thresh"].get<float>();
  if (j.contains("stability_score_thresh")) p.stability_score_thresh = j["stability_score_thresh"].get<float>();
  if (j.contains("stability_score_offset")) p.stability_score_offset = j["stability_score_offset"].get<float>();
  if (j.contains("box_nms_thresh")) p.box_nms_thresh = j["box_nms_thresh"].get<float>();
  if (j.contains("crop_n_layers")) p.crop_n_layers = j["crop_n_layers"];
  if (j.contains("crop_nms_thresh")) p.crop_nms_thresh = j["crop_nms_thresh"].get<float>();
  if (j.contains("crop_overlap_ratio")) p.crop_overlap_ratio = j["crop_overlap_ratio"].get<double>();
  if (j.contains("crop_n_points_downscale_factor")) p.crop_n_points_downscale_factor = j["crop_n_points_downscale_factor"];
  if (j.contains("min_mask_region_area")) p.min_mask_region_area = j["min_mask_region_area"];
  return p;
}

}  // namespace maskd::testing
