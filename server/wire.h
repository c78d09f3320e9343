// Checks of incoming requests that need neither the image nor the engine, done on the handler thread
// so that a malformed request fails at once. Every message names the field, its value and what was
// expected (e.g. "prompts[3].points has 70 points (expected at most 64: limits.max_points_per_prompt)").
// Prompt geometry against the image size is checked later with maskd::ValidatePrompt, once the
// image's size is known.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "maskd/v1/maskd.pb.h"
#include "model/api/engine.h"
#include "model/api/limits.h"
#include "model/api/status.h"

namespace maskd::server {

// The api's limits (model/api/limits.h): one struct, one set of defaults.
using RequestLimits = Limits;

// A prompt whose structure has been checked; geometry and mask inputs are resolved later.
struct PromptDraft {
  PromptSpec spec;  // points, box, multimask (mask_input not yet set)
  enum class Mask { kNone, kResult, kLogits };
  Mask mask = Mask::kNone;
  std::string result_id;
  std::optional<uint32_t> mask_index;
  const v1::LowResLogits* logits = nullptr;  // points into the request message
};

// Exactly one of encoded/raw; encoded: non-empty, within max_image_bytes, a known format; raw:
// sides 1 .. max_image_side, max_image_pixels, exactly width * height * 3 bytes.
Status ValidateImage(const v1::Image& image, const RequestLimits& limits, const std::string& field);
// 64 lowercase hex digits, as returned by Embed/Segment.
Status ValidateImageId(const std::string& image_id, const std::string& field);
// Counts, labels, mask input forms. allow_empty: SegmentStream messages that only set the image.
StatusOr<std::vector<PromptDraft>> ValidatePrompts(
    const google::protobuf::RepeatedPtrField<v1::Prompt>& prompts, const RequestLimits& limits,
    bool allow_empty);
// output_format and request_tag.
Status ValidateSegmentOptions(const v1::SegmentRequest& request, const RequestLimits& limits);

}  // namespace maskd::server
