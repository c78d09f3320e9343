// Issue #14, finding 6, with the real CPU engine (the built-in tiny demo model: its masks are
// meaningless, but every stage runs) over real gRPC: images of extreme aspect ratio embed and
// segment, with masks of the image's own size.
#include <gtest/gtest.h>

#include <spdlog/spdlog.h>

#include "client/client.h"
#include "model/api/engine.h"
#include "model/io/image_codec.h"
#include "server/server.h"

namespace maskd::server {
namespace {

TEST(HardeningAspect, ResizedSideIsNeverZero) {
  EXPECT_EQ(ResizedSize(1, 4000, 1024), std::make_pair(1, 1024));
  EXPECT_EQ(ResizedSize(4000, 1, 1024), std::make_pair(1024, 1));
  EXPECT_EQ(ResizedSize(16384, 1, 1024), std::make_pair(1024, 1));
  EXPECT_EQ(ResizedSize(1, 2049, 1024), std::make_pair(1, 1024));
  // Shapes the original handles are unchanged.
  EXPECT_EQ(ResizedSize(1, 2048, 1024), std::make_pair(1, 1024));  // 0.5 rounds up
  EXPECT_EQ(ResizedSize(640, 480, 1024), std::make_pair(1024, 768));
}

class HardeningAspectE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    spdlog::set_level(spdlog::level::warn);
    ServerConfig c;
    c.listen = "127.0.0.1:0";
    c.models_dir = "/nonexistent-maskd-test-models";  // no checkpoint: the built-in demo model
    c.device = "cpu";
    c.warmup = false;
    c.encoder_queue_delay_us = 0;
    c.decoder_queue_delay_us = 0;
    c.shutdown_grace_s = 2;
    server_ = new MaskServer(c, &Engine::Create, 0);
    Status s = server_->Start();
    ASSERT_TRUE(s.ok()) << s.ToString();
    client::ClientOptions co;
    co.target = "127.0.0.1:" + std::to_string(server_->port());
    co.timeout = std::chrono::milliseconds(120000);
    client_ = new client::Client(co);
  }
  static void TearDownTestSuite() {
    delete client_;
    delete server_;
  }

  // Embed, then Segment by image_id with a click inside the image, in every output format that
  // carries the mask at the original size.
  void EmbedAndSegment(int w, int h) {
    SCOPED_TRACE(std::to_string(w) + " x " + std::to_string(h));
    ImageRGB8 im{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3)};
    for (size_t i = 0; i < im.pixels.size(); ++i) im.pixels[i] = static_cast<uint8_t>((i * 31) & 0xff);
    v1::EmbedRequest e;
    e.mutable_image()->set_encoded(*EncodePngRgb(im));
    auto embedded = client_->Embed(e);
    ASSERT_TRUE(embedded.ok()) << embedded.status().ToString();
    EXPECT_EQ(embedded->width(), static_cast<uint32_t>(w));
    EXPECT_EQ(embedded->height(), static_cast<uint32_t>(h));

    for (v1::OutputFormat f : {v1::OUTPUT_FORMAT_COCO_RLE, v1::OUTPUT_FORMAT_PNG}) {
      v1::SegmentRequest r;
      r.set_image_id(embedded->image_id());
      r.set_output_format(f);
      v1::Prompt* p = r.add_prompts();
      v1::Point* pt = p->add_points();
      pt->set_x(static_cast<float>(w) / 2);
      pt->set_y(static_cast<float>(h) / 2);
      pt->set_label(v1::POINT_LABEL_FOREGROUND);
      p->set_multimask(true);
      auto seg = client_->Segment(r);
      ASSERT_TRUE(seg.ok()) << seg.status().ToString();
      ASSERT_EQ(seg->results_size(), 1);
      ASSERT_GT(seg->results(0).masks_size(), 0);
      for (const auto& m : seg->results(0).masks()) {
        EXPECT_TRUE(std::isfinite(m.score()));
        if (f == v1::OUTPUT_FORMAT_COCO_RLE) {
          ASSERT_EQ(m.rle().size_size(), 2);
          EXPECT_EQ(m.rle().size(0), static_cast<uint32_t>(h));  // COCO order: height, width
          EXPECT_EQ(m.rle().size(1), static_cast<uint32_t>(w));
        } else {
          auto png = DecodePngGray(m.png());
          ASSERT_TRUE(png.ok()) << png.status().ToString();
          EXPECT_EQ(png->width, w);
          EXPECT_EQ(png->height, h);
        }
      }
    }
  }

  static MaskServer* server_;
  static client::Client* client_;
};
MaskServer* HardeningAspectE2E::server_ = nullptr;
client::Client* HardeningAspectE2E::client_ = nullptr;

TEST_F(HardeningAspectE2E, TallThinImage) { EmbedAndSegment(1, 4000); }
TEST_F(HardeningAspectE2E, WideThinImage) { EmbedAndSegment(4000, 1); }
TEST_F(HardeningAspectE2E, WidestImage) { EmbedAndSegment(16384, 1); }
TEST_F(HardeningAspectE2E, JustPastTheRoundingEdge) { EmbedAndSegment(1, 2049); }

}  // namespace
}  // namespace maskd::server
