// Prompts as values, and the one set of rules a prompt must follow. The server checks every prompt
// once, at its edge, with ValidatePrompt; engines may assume what it checks.
#pragma once

#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "model/api/limits.h"
#include "model/api/status.h"

namespace maskd {

class MaskLogits;

struct Point {
  float x = 0, y = 0;
  int label = 1;  // 1 foreground, 0 background (SAM's labels)
};

struct Box {
  float x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};

// One prompt on one image for Engine::Decode.
struct PromptSpec {
  std::vector<Point> points;
  std::optional<Box> box;
  // SAM's mask_input: one mask of low-res logits (MaskLogits with num_masks() == 1, or use
  // mask_input_index to pick one mask of a multi-mask result).
  std::shared_ptr<const MaskLogits> mask_input;
  int mask_input_index = 0;
  bool multimask = true;
};

// Checks a prompt against an image's size and the limits: at least one point or a box, at most
// limits.max_points_per_prompt points, finite coordinates inside the image, labels 0/1, box corners
// ordered, the mask input index inside its masks. The message names the field (field_prefix), the
// value and what was expected.
Status ValidatePrompt(const PromptSpec& prompt, int image_width, int image_height,
                      std::string_view field_prefix = "prompt", const Limits& limits = Limits{});

}  // namespace maskd
