// Request validation on the handler thread: each message names the field, its value and what was
// expected.
#include <gtest/gtest.h>

#include "model/io/image_codec.h"
#include "server/grpc_status.h"
#include "server/wire.h"

namespace maskd::server {
namespace {

std::string Message(const Status& s) { return s.message(); }

v1::Image Png(int w, int h) {
  ImageRGB8 im{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3, 9)};
  v1::Image out;
  out.set_encoded(*EncodePngRgb(im));
  return out;
}

TEST(ServerValidation, Images) {
  RequestLimits limits;
  EXPECT_TRUE(ValidateImage(Png(4, 3), limits, "image").ok());

  v1::Image none;
  EXPECT_EQ(Message(ValidateImage(none, limits, "image")),
            "image has neither encoded nor raw set (expected exactly one)");

  v1::Image empty;
  empty.set_encoded("");
  EXPECT_EQ(Message(ValidateImage(empty, limits, "image")),
            "image.encoded is empty (expected JPEG, PNG or WebP bytes)");

  RequestLimits small;
  small.max_image_bytes = 10;
  EXPECT_EQ(Message(ValidateImage(Png(4, 3), small, "image")).rfind("image.encoded is ", 0), 0u);
  EXPECT_NE(Message(ValidateImage(Png(4, 3), small, "image")).find("(expected at most 10: "
                                                                   "limits.max_image_bytes)"),
            std::string::npos);

  v1::Image gif;
  gif.set_encoded("GIF89a....");
  const Status g = ValidateImage(gif, limits, "image");
  EXPECT_EQ(g.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(Message(g).find("image.encoded: unknown image format (first bytes 47 49 46"),
            std::string::npos)
      << Message(g);

  v1::Image raw;
  raw.mutable_raw()->set_width(0);
  raw.mutable_raw()->set_height(5);
  EXPECT_EQ(Message(ValidateImage(raw, limits, "image")), "image.raw.width = 0 (expected 1 .. 16384)");
  raw.mutable_raw()->set_width(20000);
  EXPECT_EQ(Message(ValidateImage(raw, limits, "image")),
            "image.raw.width = 20000 (expected 1 .. 16384)");
  raw.mutable_raw()->set_width(4);
  raw.mutable_raw()->set_rgb(std::string(59, '\0'));
  EXPECT_EQ(Message(ValidateImage(raw, limits, "image")),
            "image.raw.rgb has 59 bytes (expected width * height * 3 = 60)");
  RequestLimits few;
  few.max_image_pixels = 19;
  raw.mutable_raw()->set_rgb(std::string(60, '\0'));
  EXPECT_TRUE(ValidateImage(raw, limits, "image").ok());
  EXPECT_EQ(Message(ValidateImage(raw, few, "image")),
            "image.raw is 4 x 5 = 20 pixels (expected at most 19: limits.max_image_pixels)");
}

TEST(ServerValidation, ImageIds) {
  EXPECT_TRUE(ValidateImageId(std::string(64, 'a'), "image_id").ok());
  const Status s = ValidateImageId("my-cat.jpg", "image_id");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(s), "image_id = \"my-cat.jpg\" is not an image id (expected the 64 lowercase hex "
                        "digits returned by Embed or Segment)");
}

v1::Prompt Click(float x, float y) {
  v1::Prompt p;
  auto* pt = p.add_points();
  pt->set_x(x);
  pt->set_y(y);
  return p;
}

TEST(ServerValidation, PromptsStructure) {
  RequestLimits limits;
  limits.max_prompts_per_request = 3;
  limits.max_points_per_prompt = 2;
  google::protobuf::RepeatedPtrField<v1::Prompt> prompts;
  EXPECT_EQ(Message(ValidatePrompts(prompts, limits, false).status()),
            "prompts has 0 prompts (expected 1 .. 3: limits.max_prompts_per_request)");
  EXPECT_TRUE(ValidatePrompts(prompts, limits, true).ok());  // a stream message that sets the image

  *prompts.Add() = Click(1, 2);
  v1::Prompt box;
  box.mutable_box()->set_x1(5);
  box.mutable_box()->set_y1(6);
  box.set_multimask(true);
  *prompts.Add() = box;
  auto ok = ValidatePrompts(prompts, limits, false);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  ASSERT_EQ(ok->size(), 2u);
  EXPECT_EQ((*ok)[0].spec.points[0].label, 1);  // unspecified = foreground
  EXPECT_FALSE((*ok)[0].spec.multimask);
  ASSERT_TRUE((*ok)[1].spec.box.has_value());
  EXPECT_EQ((*ok)[1].spec.box->x1, 5);
  EXPECT_TRUE((*ok)[1].spec.multimask);

  auto* bg = prompts.Mutable(0)->add_points();
  bg->set_label(v1::POINT_LABEL_BACKGROUND);
  EXPECT_EQ((*ValidatePrompts(prompts, limits, false))[0].spec.points[1].label, 0);
  prompts.Mutable(0)->add_points();
  EXPECT_EQ(Message(ValidatePrompts(prompts, limits, false).status()),
            "prompts[0].points has 3 points (expected at most 2: limits.max_points_per_prompt)");
  prompts.Mutable(0)->mutable_points()->RemoveLast();
  prompts.Mutable(0)->mutable_points(1)->set_label(static_cast<v1::PointLabel>(7));
  EXPECT_EQ(Message(ValidatePrompts(prompts, limits, false).status()),
            "prompts[0].points[1].label = 7 (expected 0 POINT_LABEL_UNSPECIFIED, 1 "
            "POINT_LABEL_FOREGROUND or 2 POINT_LABEL_BACKGROUND)");
  prompts.Mutable(0)->mutable_points(1)->set_label(v1::POINT_LABEL_FOREGROUND);

  *prompts.Add() = v1::Prompt();
  EXPECT_EQ(Message(ValidatePrompts(prompts, limits, false).status()),
            "prompts[2] has no points and no box (expected at least one point or a box)");
  *prompts.Mutable(2) = Click(0, 0);
  *prompts.Add() = Click(0, 0);
  EXPECT_EQ(Message(ValidatePrompts(prompts, limits, false).status()),
            "prompts has 4 prompts (expected 1 .. 3: limits.max_prompts_per_request)");
}

TEST(ServerValidation, MaskInputs) {
  RequestLimits limits;
  google::protobuf::RepeatedPtrField<v1::Prompt> prompts;
  *prompts.Add() = Click(1, 1);
  *prompts.Add() = Click(2, 2);
  v1::MaskInput* m = prompts.Mutable(1)->mutable_mask_input();
  EXPECT_EQ(Message(ValidatePrompts(prompts, limits, false).status()),
            "prompts[1].mask_input has neither result_id nor logits set (expected exactly one)");
  m->set_result_id("");
  EXPECT_NE(Message(ValidatePrompts(prompts, limits, false).status())
                .find("prompts[1].mask_input.result_id is empty"),
            std::string::npos);
  m->set_result_id("r0123");
  m->set_mask_index(2);
  auto by_ref = ValidatePrompts(prompts, limits, false);
  ASSERT_TRUE(by_ref.ok());
  EXPECT_EQ((*by_ref)[1].mask, PromptDraft::Mask::kResult);
  EXPECT_EQ((*by_ref)[1].result_id, "r0123");
  EXPECT_EQ(*(*by_ref)[1].mask_index, 2u);

  v1::LowResLogits* l = m->mutable_logits();
  l->set_width(128);
  l->set_height(256);
  EXPECT_EQ(Message(ValidatePrompts(prompts, limits, false).status()),
            "prompts[1].mask_input.logits is 128 x 256 (expected 256 x 256)");
  l->set_width(256);
  l->mutable_values()->Resize(100, 0.f);
  EXPECT_EQ(Message(ValidatePrompts(prompts, limits, false).status()),
            "prompts[1].mask_input.logits.values has 100 values (expected width * height = 65536)");
  l->mutable_values()->Resize(65536, 0.5f);
  EXPECT_NE(Message(ValidatePrompts(prompts, limits, false).status())
                .find("prompts[1].mask_input.mask_index = 2 is set with logits"),
            std::string::npos);
  m->clear_mask_index();
  l->set_values(7, std::numeric_limits<float>::quiet_NaN());
  EXPECT_NE(Message(ValidatePrompts(prompts, limits, false).status())
                .find("prompts[1].mask_input.logits.values[7] = nan (expected a finite number)"),
            std::string::npos);
  l->set_values(7, 1.f);
  auto by_value = ValidatePrompts(prompts, limits, false);
  ASSERT_TRUE(by_value.ok()) << by_value.status().ToString();
  EXPECT_EQ((*by_value)[1].mask, PromptDraft::Mask::kLogits);
  EXPECT_EQ((*by_value)[1].logits[7], 1.f);  // a view of the request's values
}

TEST(ServerValidation, SegmentOptions) {
  RequestLimits limits;
  v1::SegmentRequest r;
  EXPECT_TRUE(ValidateSegmentOptions(r, limits).ok());
  r.set_output_format(static_cast<v1::OutputFormat>(9));
  EXPECT_EQ(Message(ValidateSegmentOptions(r, limits)).rfind("output_format = 9 (expected 0 ", 0), 0u);
  r.set_output_format(v1::OUTPUT_FORMAT_PNG);
  r.set_request_tag(std::string(129, 't'));
  EXPECT_EQ(Message(ValidateSegmentOptions(r, limits)), "request_tag is 129 bytes (expected at most 128)");
}

TEST(ServerValidation, OneStatusMapping) {
  for (auto [code, grpc_code] : std::vector<std::pair<StatusCode, grpc::StatusCode>>{
           {StatusCode::kOk, grpc::StatusCode::OK},
           {StatusCode::kCancelled, grpc::StatusCode::CANCELLED},
           {StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
           {StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED},
           {StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
           {StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
           {StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
           {StatusCode::kInternal, grpc::StatusCode::INTERNAL},
           {StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE}}) {
    const grpc::Status g = ToGrpcStatus(code == StatusCode::kOk ? Status::Ok() : Status(code, "why"));
    EXPECT_EQ(g.error_code(), grpc_code);
    if (code != StatusCode::kOk) {
      EXPECT_EQ(g.error_message(), "why");
    }
  }
}

}  // namespace
}  // namespace maskd::server
