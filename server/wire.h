// The wire edge: the one place that maps maskd.v1 protobuf messages to the values the pipeline
// speaks (server/values.h) and back. Requests are checked here, once, with the api's limits and
// rules, on the handler thread so that a malformed request fails at once. Every message names the
// field, its value and what was expected (e.g. "prompts[3].points has 70 points (expected at most
// 64: limits.max_points_per_prompt)"). Prompt geometry against the image size needs the image and is
// checked with maskd::ValidatePrompt (model/api/prompt.h) when the pipeline knows it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "maskd/v1/maskd.pb.h"
#include "model/api/engine.h"
#include "model/api/limits.h"
#include "model/api/status.h"
#include "server/values.h"

namespace maskd::server {

// The api's limits (model/api/limits.h): one struct, one set of defaults.
using RequestLimits = Limits;

// Exactly one of encoded/raw; encoded: non-empty, within max_image_bytes, a known format; raw:
// sides 1 .. max_image_side, max_image_pixels, exactly width * height * 3 bytes.
Status ValidateImage(const v1::Image& image, const RequestLimits& limits, const std::string& field);
// 64 lowercase hex digits, as returned by Embed/Segment.
Status ValidateImageId(const std::string& image_id, const std::string& field);
// EmbedRequest.return_embedding: nullopt for EMBEDDING_DTYPE_UNSPECIFIED (do not return it); an
// unknown number (proto3 keeps those) is INVALID_ARGUMENT naming `field`.
StatusOr<std::optional<Precision>> EmbeddingDtypeFrom(int value, const std::string& field);
// Counts, labels, mask input forms. allow_empty: SegmentStream messages that only set the image.
StatusOr<std::vector<PromptDraft>> ValidatePrompts(
    const google::protobuf::RepeatedPtrField<v1::Prompt>& prompts, const RequestLimits& limits,
    bool allow_empty);
// output_format, polygon_tolerance and request_tag.
Status ValidateSegmentOptions(const v1::SegmentRequest& request, const RequestLimits& limits);

// GenerateMasks: output_format (rle, png or polygons), polygon_tolerance, request_tag, and the
// parameters (ValidateMaskGenerationParams with `limits`, fields named "params.NAME"); unset
// optional parameters take the original's defaults. INVALID_ARGUMENT naming the field otherwise.
StatusOr<GenerationSpec> ValidateGenerateRequest(const v1::GenerateMasksRequest& request,
                                                 const RequestLimits& request_limits,
                                                 const MaskGenerationLimits& limits);

// Requests to values (after the checks above). The views point into the message.
ImageInput ImageInputFrom(const v1::Image& image);
ImageInput ImageInputFromId(const std::string& image_id);
// output_format and polygon_tolerance.
OutputSpec OutputSpecFrom(const v1::SegmentRequest& request);

// Values to responses. Results are written only when `status` is OK (a failed call has none).
void ToProto(const ImageOutcome& outcome, v1::EmbedResponse* response);
// These two move each mask's encoded bytes (COCO RLE counts, PNG) from `outcome` into the response
// instead of copying them (a click's three random-weight RLE masks are ~165 KB): the caller must be
// done with those fields; the rest of `outcome` is left as it was.
void MoveToProto(SegmentOutcome& outcome, const Status& status, v1::SegmentResponse* response);
void MoveToProto(GenerateOutcome& outcome, const Status& status, v1::GenerateMasksResponse* response);
// GetInfoResponse.limits.generation.
void ToProto(const MaskGenerationLimits& limits, v1::GenerationLimits* out);

}  // namespace maskd::server
