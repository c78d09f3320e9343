// The client library's pure parts: prompt text, wire requests, status conversion, overlays.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "client/client.h"
#include "client/mask_codec.h"
#include "client/overlay.h"
#include "client/prompt_parse.h"

namespace maskd::client {
namespace {

TEST(ClientParse, PointForms) {
  StatusOr<PointArg> p = ParsePoint("12.5,7");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_FLOAT_EQ(p->x, 12.5f);
  EXPECT_FLOAT_EQ(p->y, 7.0f);
  EXPECT_TRUE(p->foreground);
  for (const char* bg : {"1,2,0", "1,2,bg", "1,2,background"}) {
    StatusOr<PointArg> q = ParsePoint(bg);
    ASSERT_TRUE(q.ok()) << bg;
    EXPECT_FALSE(q->foreground) << bg;
  }
  EXPECT_TRUE(ParsePoint("1,2,fg")->foreground);
}

TEST(ClientParse, PointErrorsNameTheText) {
  for (const char* bad : {"", "1", "1,2,3,4", "a,2", "1,nan", "1,inf", "1,2,7", "1,,2", "1e999,2"}) {
    StatusOr<PointArg> p = ParsePoint(bad);
    ASSERT_FALSE(p.ok()) << bad;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(std::string("'") + bad + "'"), std::string::npos)
        << p.status().message();
  }
}

TEST(ClientParse, Box) {
  StatusOr<BoxArg> b = ParseBox("1,2,30.5,40");
  ASSERT_TRUE(b.ok());
  EXPECT_FLOAT_EQ(b->x0, 1);
  EXPECT_FLOAT_EQ(b->y0, 2);
  EXPECT_FLOAT_EQ(b->x1, 30.5f);
  EXPECT_FLOAT_EQ(b->y1, 40);
  EXPECT_FALSE(ParseBox("1,2,3").ok());
  EXPECT_FALSE(ParseBox("1,2,3,x").ok());
}

TEST(ClientParse, OutputFormat) {
  EXPECT_EQ(*ParseOutputFormat("rle"), v1::OUTPUT_FORMAT_COCO_RLE);
  EXPECT_EQ(*ParseOutputFormat("png"), v1::OUTPUT_FORMAT_PNG);
  EXPECT_EQ(*ParseOutputFormat("logits"), v1::OUTPUT_FORMAT_LOW_RES_LOGITS);
  EXPECT_EQ(*ParseOutputFormat("polygons"), v1::OUTPUT_FORMAT_POLYGONS);
  EXPECT_FALSE(ParseOutputFormat("jpeg").ok());
}

// Polygons from a server are checked before they are rasterised: a vertex off the pixel-corner grid,
// half a pair or a dangling parent is named, and a valid ring with its hole decodes to the ring.
TEST(ClientMaskCodec, PolygonsAreCheckedAndDecoded) {
  v1::MaskResult m;
  v1::Polygon* outer = m.mutable_polygons()->add_polygons();
  for (float v : {0, 0, 3, 0, 3, 3, 0, 3}) outer->add_points(v);
  outer->set_parent(-1);
  v1::Polygon* hole = m.mutable_polygons()->add_polygons();
  for (float v : {1, 2, 2, 2, 2, 1, 1, 1}) hole->add_points(v);
  hole->set_hole(true);
  hole->set_parent(0);
  auto mask = DecodeMask(m, 4, 3);
  ASSERT_TRUE(mask.ok()) << mask.status().ToString();
  EXPECT_EQ(*mask, (std::vector<uint8_t>{1, 1, 1, 0, 1, 0, 1, 0, 1, 1, 1, 0}));

  v1::MaskResult bad = m;
  bad.mutable_polygons()->mutable_polygons(1)->set_parent(7);
  EXPECT_NE(DecodeMask(bad, 4, 3).status().message().find("polygons[1].parent = 7"), std::string::npos);
  bad = m;
  bad.mutable_polygons()->mutable_polygons(0)->set_points(1, 0.5f);
  EXPECT_NE(DecodeMask(bad, 4, 3).status().message().find("integral pixel-corner"), std::string::npos);
  bad = m;
  bad.mutable_polygons()->mutable_polygons(0)->add_points(1);
  EXPECT_NE(DecodeMask(bad, 4, 3).status().message().find("x, y pairs"), std::string::npos);
}

TEST(ClientRequest, BuildSegmentRequestCarriesEveryField) {
  SegmentArgs args;
  args.image = ImageArg::Id("abc");
  PromptArg p;
  p.points = {{1, 2, true}, {3, 4, false}};
  p.box = BoxArg{5, 6, 7, 8};
  p.mask_from = "abc/0";
  p.mask_index = 2;
  p.multimask = true;
  args.prompts = {p, PromptArg{{{9, 9, true}}, std::nullopt, "", std::nullopt, false}};
  args.format = v1::OUTPUT_FORMAT_PNG;
  args.request_tag = "t1";
  const v1::SegmentRequest r = BuildSegmentRequest(args);
  EXPECT_EQ(r.image_id(), "abc");
  EXPECT_FALSE(r.has_image());
  ASSERT_EQ(r.prompts_size(), 2);
  const v1::Prompt& q = r.prompts(0);
  ASSERT_EQ(q.points_size(), 2);
  EXPECT_EQ(q.points(0).label(), v1::POINT_LABEL_FOREGROUND);
  EXPECT_EQ(q.points(1).label(), v1::POINT_LABEL_BACKGROUND);
  EXPECT_FLOAT_EQ(q.points(1).x(), 3);
  EXPECT_TRUE(q.has_box());
  EXPECT_FLOAT_EQ(q.box().y1(), 8);
  EXPECT_EQ(q.mask_input().result_id(), "abc/0");
  ASSERT_TRUE(q.mask_input().has_mask_index());
  EXPECT_EQ(q.mask_input().mask_index(), 2u);
  EXPECT_TRUE(q.multimask());
  EXPECT_FALSE(r.prompts(1).has_box());
  EXPECT_FALSE(r.prompts(1).has_mask_input());
  EXPECT_FALSE(r.prompts(1).multimask());
  EXPECT_EQ(r.output_format(), v1::OUTPUT_FORMAT_PNG);
  EXPECT_EQ(r.request_tag(), "t1");

  args.image = ImageArg::Encoded("\xff\xd8\xff");
  const v1::SegmentRequest e = BuildSegmentRequest(args);
  EXPECT_EQ(e.image().encoded(), "\xff\xd8\xff");
  EXPECT_TRUE(e.image_id().empty());
}

TEST(ClientStatus, FromGrpcKeepsCodeAndMessage) {
  Status s = FromGrpcStatus(grpc::Status(grpc::StatusCode::NOT_FOUND, "image_id 'x' evicted"));
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "image_id 'x' evicted");
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
  Status u = FromGrpcStatus(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no such method"));
  EXPECT_EQ(u.code(), StatusCode::kInternal);
  EXPECT_NE(u.message().find("UNIMPLEMENTED"), std::string::npos);
  EXPECT_NE(u.message().find("no such method"), std::string::npos);
}

TEST(ClientOverlay, BlendsMaskAndDrawsPrompt) {
  ImageRGB8 im{40, 30, std::vector<uint8_t>(40 * 30 * 3, 100)};
  std::vector<uint8_t> mask(40 * 30, 0);
  for (int y = 10; y < 20; ++y)
    for (int x = 10; x < 30; ++x) mask[y * 40 + x] = 1;
  PromptArg p;
  p.points = {{2.5f, 27.5f, false}};
  p.box = BoxArg{0, 0, 39, 29};
  OverlayStyle style;
  style.point_radius = 1;
  style.line_width = 1;
  StatusOr<ImageRGB8> out = DrawOverlay(im, mask, p, style);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  auto px = [&](int x, int y) { return &out->pixels[(y * 40 + x) * 3]; };
  // Inside (not on the outline): blended half-way towards the mask colour.
  EXPECT_EQ(px(20, 15)[0], static_cast<uint8_t>(std::lround(0.5 * 100 + 0.5 * 30)));
  EXPECT_EQ(px(20, 15)[2], static_cast<uint8_t>(std::lround(0.5 * 100 + 0.5 * 255)));
  // Outline: full mask colour.
  EXPECT_EQ(px(10, 15)[2], 255);
  // Outside the mask and away from the marks: unchanged.
  EXPECT_EQ(px(20, 5)[0], 100);
  // The box's border (yellow) and the background point (red centre).
  EXPECT_EQ(px(0, 5)[0], 255);
  EXPECT_EQ(px(0, 5)[2], 0);
  EXPECT_EQ(px(2, 27)[0], 220);
  EXPECT_EQ(px(2, 27)[1], 0);

  std::vector<uint8_t> wrong(10, 0);
  EXPECT_EQ(DrawOverlay(im, wrong, p).status().code(), StatusCode::kInvalidArgument);
}

// One mapping (proto/grpc_code_name.h) for the client's messages and the HTTP front's error bodies.
TEST(GrpcCodeNames, EveryCodeAndAnUnrecognisedOne) {
  EXPECT_STREQ(GrpcCodeName(grpc::StatusCode::OK), "OK");
  EXPECT_STREQ(GrpcCodeName(grpc::StatusCode::INVALID_ARGUMENT), "INVALID_ARGUMENT");
  EXPECT_STREQ(GrpcCodeName(grpc::StatusCode::UNIMPLEMENTED), "UNIMPLEMENTED");
  EXPECT_STREQ(GrpcCodeName(grpc::StatusCode::UNAUTHENTICATED), "UNAUTHENTICATED");
  EXPECT_STREQ(GrpcCodeName(static_cast<grpc::StatusCode>(99)), "UNRECOGNISED_CODE");
  std::set<std::string> names;
  for (int c = 0; c <= 16; ++c) names.insert(GrpcCodeName(static_cast<grpc::StatusCode>(c)));
  EXPECT_EQ(names.size(), 17u);
  EXPECT_EQ(names.count("UNRECOGNISED_CODE"), 0u);
  // The client folds a code maskd::Status does not name into INTERNAL, naming it.
  const Status s = FromGrpcStatus(grpc::Status(grpc::StatusCode::DATA_LOSS, "x"));
  EXPECT_NE(s.message().find("DATA_LOSS"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace maskd::client
