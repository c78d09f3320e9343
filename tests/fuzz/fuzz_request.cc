// Request validation at the wire edge under libFuzzer: the input is parsed as a SegmentRequest or an
// EmbedRequest (first byte), then goes through what MaskService and the stream reactor do on the
// handler thread (server/wire.*: ValidateSegmentOptions, ValidateImage / ValidateImageId,
// ValidatePrompts, the conversions to values) and what the pipeline does once the image size is
// known (maskd::ValidatePrompt). What validation lets through is checked against the promises the
// engine relies on: finite coordinates inside the image, labels 0/1, ordered boxes, counts within
// the limits. The codecs themselves have their own target (fuzz_image_decode).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include <google/protobuf/stubs/logging.h>

#include "maskd/v1/maskd.pb.h"
#include "model/api/prompt.h"
#include "server/wire.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using maskd::server::RequestLimits;

// The checks an engine may assume after ValidatePrompt (model/api/prompt.h).
void CheckValidPrompt(const maskd::PromptSpec& p, int width, int height, const RequestLimits& limits) {
  FUZZ_CHECK(!p.points.empty() || p.box.has_value(), "a prompt with neither points nor a box");
  FUZZ_CHECK(p.points.size() <= limits.max_points_per_prompt, "%zu points", p.points.size());
  for (const maskd::Point& pt : p.points) {
    FUZZ_CHECK(std::isfinite(pt.x) && std::isfinite(pt.y), "a non-finite point passed");
    FUZZ_CHECK(pt.x >= 0 && pt.y >= 0 && pt.x <= width && pt.y <= height,
               "point (%g, %g) outside %dx%d passed", pt.x, pt.y, width, height);
    FUZZ_CHECK(pt.label == 0 || pt.label == 1, "label %d passed", pt.label);
  }
  if (p.box) {
    const maskd::Box& b = *p.box;
    FUZZ_CHECK(std::isfinite(b.x0) && std::isfinite(b.y0) && std::isfinite(b.x1) &&
                   std::isfinite(b.y1),
               "a non-finite box passed");
    FUZZ_CHECK(b.x0 <= b.x1 && b.y0 <= b.y1, "an inverted box passed");
    FUZZ_CHECK(b.x0 >= 0 && b.y0 >= 0 && b.x1 <= width && b.y1 <= height,
               "box outside %dx%d passed", width, height);
  }
}

void FuzzSegment(const uint8_t* data, size_t size, bool stream_follow_up) {
  maskd::v1::SegmentRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  RequestLimits limits;
  // Smaller than the defaults so that the fuzzer reaches the limits with inputs it can make.
  limits.max_prompts_per_request = 16;
  limits.max_points_per_prompt = 8;
  limits.max_image_bytes = 4096;
  limits.max_image_pixels = 4096;
  limits.max_image_side = 256;

  if (!maskd::server::ValidateSegmentOptions(request, limits).ok()) return;
  (void)maskd::server::OutputSpecFrom(request);
  int width = 640, height = 480;  // an image_id's image: any size the server may have cached
  switch (request.image_source_case()) {
    case maskd::v1::SegmentRequest::kImage: {
      if (!maskd::server::ValidateImage(request.image(), limits, "image").ok()) return;
      const maskd::server::ImageInput input = maskd::server::ImageInputFrom(request.image());
      FUZZ_CHECK(input.bytes.size() <= limits.max_image_bytes || input.kind ==
                     maskd::server::ImageInput::Kind::kRaw,
                 "%zu encoded bytes passed", input.bytes.size());
      if (input.kind == maskd::server::ImageInput::Kind::kRaw) {
        FUZZ_CHECK(input.width >= 1 && input.height >= 1 &&
                       input.bytes.size() == uint64_t{input.width} * input.height * 3,
                   "raw %ux%u with %zu bytes passed", input.width, input.height, input.bytes.size());
        width = static_cast<int>(input.width);
        height = static_cast<int>(input.height);
      }
      break;
    }
    case maskd::v1::SegmentRequest::kImageId: {
      if (!maskd::server::ValidateImageId(request.image_id(), "image_id").ok()) return;
      const maskd::server::ImageInput input = maskd::server::ImageInputFromId(request.image_id());
      FUZZ_CHECK(input.image_id.size() == 64, "image_id of %zu characters passed",
                 input.image_id.size());
      break;
    }
    default:
      if (!stream_follow_up) return;  // Segment needs an image; a stream message may omit it
  }
  maskd::StatusOr<std::vector<maskd::server::PromptDraft>> drafts =
      maskd::server::ValidatePrompts(request.prompts(), limits, /*allow_empty=*/stream_follow_up);
  if (!drafts.ok()) {
    FUZZ_CHECK(!drafts.status().message().empty(), "a refusal without a message");
    return;
  }
  FUZZ_CHECK(drafts->size() <= limits.max_prompts_per_request, "%zu prompts passed", drafts->size());
  for (size_t i = 0; i < drafts->size(); ++i) {
    const maskd::server::PromptDraft& d = (*drafts)[i];
    if (d.mask == maskd::server::PromptDraft::Mask::kLogits) {
      // The pipeline reads kLowResSide^2 floats from here: touch them all so ASan checks the view.
      float sum = 0;
      for (int k = 0; k < maskd::kLowResSide * maskd::kLowResSide; ++k) sum += d.logits[k];
      (void)sum;
    }
    const std::string field = "prompts[" + std::to_string(i) + "]";
    if (maskd::ValidatePrompt(d.spec, width, height, field, limits).ok()) {
      CheckValidPrompt(d.spec, width, height, limits);
    }
  }
}

void FuzzEmbed(const uint8_t* data, size_t size) {
  maskd::v1::EmbedRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  RequestLimits limits;
  limits.max_image_bytes = 4096;
  limits.max_image_pixels = 4096;
  limits.max_image_side = 256;
  if (!maskd::server::ValidateImage(request.image(), limits, "image").ok()) return;
  (void)maskd::server::ImageInputFrom(request.image());
}

}  // namespace

// protobuf logs every string field with invalid UTF-8 it parses; at thousands of inputs a second
// that would be all the fuzzer prints (the parse failure itself is what is exercised).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  switch (data[0] % 3) {
    case 0: FuzzSegment(data + 1, size - 1, /*stream_follow_up=*/false); break;
    case 1: FuzzSegment(data + 1, size - 1, /*stream_follow_up=*/true); break;
    default: FuzzEmbed(data + 1, size - 1); break;
  }
  return 0;
}
