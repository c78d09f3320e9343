// The client side of Embed's return_embedding: ImageEmbedding bytes to float32, the .npy writer
// (numpy format 1.0, header checked byte by byte), and `maskctl embed --return-embedding
// --out-embedding` against an in-process maskd on a fake engine (the file holds the engine's
// values rounded as the dtype says).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <spdlog/spdlog.h>

#include "client/embedding.h"
#include "client/mask_codec.h"
#include "client/maskctl_commands.h"
#include "model/api/half.h"
#include "model/io/image_codec.h"
#include "server/server.h"
#include "tests/fake_engine.h"
#include "tests/maskctl_runner.h"
#include "tests/server_fixture.h"

namespace maskd::client {
namespace {

using fake::FakeEngine;

TEST(ClientEmbedding, WidensEachDtypeFromLittleEndianBytes) {
  v1::ImageEmbedding e;
  e.add_shape(1);
  e.add_shape(3);
  e.set_dtype(v1::EMBEDDING_DTYPE_BF16);
  e.set_data(std::string("\x80\x3f\x00\xc0\xc9\x40", 6));  // 1, -2, 6.28125
  auto v = EmbeddingToFloat(e);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, (std::vector<float>{1.0f, -2.0f, 6.28125f}));
  e.set_dtype(v1::EMBEDDING_DTYPE_FP16);
  e.set_data(std::string("\x00\x3c\x00\xc0\x01\x00", 6));  // 1, -2, 2^-24
  v = EmbeddingToFloat(e);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, (std::vector<float>{1.0f, -2.0f, 5.9604645e-8f}));
  e.set_dtype(v1::EMBEDDING_DTYPE_FP32);
  e.set_data(std::string("\x00\x00\x80\x3f\x00\x00\x00\xc0\x00\x00\xc9\x40", 12));
  v = EmbeddingToFloat(e);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, (std::vector<float>{1.0f, -2.0f, 6.28125f}));
  e.set_data(std::string(10, '\0'));
  v = EmbeddingToFloat(e);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("expected 12"), std::string::npos) << v.status().message();
  e.set_dtype(v1::EMBEDDING_DTYPE_UNSPECIFIED);
  EXPECT_FALSE(EmbeddingToFloat(e).ok());
}

TEST(ClientEmbedding, NpyIsNumpyFormatOne) {
  const std::string npy = NpyFloat32({1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f}, {1, 2, 3});
  ASSERT_GE(npy.size(), 10u);
  EXPECT_EQ(npy.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const size_t header = static_cast<uint8_t>(npy[8]) | static_cast<uint8_t>(npy[9]) << 8;
  EXPECT_EQ((10 + header) % 64, 0u);
  const std::string dict = npy.substr(10, header);
  EXPECT_EQ(dict.rfind("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 3), }", 0), 0u) << dict;
  EXPECT_EQ(dict.back(), '\n');
  ASSERT_EQ(npy.size(), 10 + header + 24);
  float third;
  std::memcpy(&third, npy.data() + 10 + header + 8, 4);
  EXPECT_EQ(third, 3.0f);
  // A one-dimensional shape is a Python 1-tuple.
  const std::string one = NpyFloat32({7.0f}, {1});
  EXPECT_NE(one.find("'shape': (1,), }"), std::string::npos);
}

TEST(ClientEmbedding, ParsesDtypeNames) {
  EXPECT_EQ(*ParseEmbeddingDtype("bf16"), v1::EMBEDDING_DTYPE_BF16);
  EXPECT_EQ(*ParseEmbeddingDtype("float16"), v1::EMBEDDING_DTYPE_FP16);
  EXPECT_EQ(*ParseEmbeddingDtype("fp32"), v1::EMBEDDING_DTYPE_FP32);
  auto bad = ParseEmbeddingDtype("int8");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'int8' is not one of fp32, bf16 or fp16"), std::string::npos)
      << bad.status().message();
}

TEST(ClientEmbedding, MaskctlWritesTheEmbeddingAsNpy) {
  spdlog::set_level(spdlog::level::err);
  server::MaskServer server(server::TestConfig(), server::FakeFactory(), 0);
  ASSERT_TRUE(server.StartListening().ok());
  ASSERT_TRUE(server.LoadAndServe().ok());
  const std::string target = "127.0.0.1:" + std::to_string(server.port());

  const auto dir = std::filesystem::temp_directory_path() / ("maskctl_embed_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  ImageRGB8 im{120, 80, std::vector<uint8_t>(120 * 80 * 3)};
  for (size_t i = 0; i < im.pixels.size(); ++i) im.pixels[i] = static_cast<uint8_t>(i * 11 % 241);
  const std::string image = (dir / "in.png").string(), npy = (dir / "emb.npy").string();
  ASSERT_TRUE(WriteFileBytes(image, *EncodePngRgb(im)).ok());

  for (const char* dtype : {"fp16", "bf16", "fp32"}) {
    Maskctl m;
    ASSERT_EQ(m.Run({"--server", target, "embed", image, "--return-embedding", dtype,
                     "--out-embedding", npy}),
              0)
        << m.err.str();
    EXPECT_NE(m.out.str().find("shape [1, 256, 64, 64]"), std::string::npos) << m.out.str();
    EXPECT_NE(m.out.str().find("input size 1024x683"), std::string::npos) << m.out.str();
    StatusOr<std::string> bytes = ReadFileBytes(npy);
    ASSERT_TRUE(bytes.ok());
    const size_t header = static_cast<uint8_t>((*bytes)[8]) | static_cast<uint8_t>((*bytes)[9]) << 8;
    EXPECT_NE(bytes->substr(10, header).find("'shape': (1, 256, 64, 64)"), std::string::npos);
    const std::vector<float> want = FakeEngine::EmbeddingValues(FakeEngine::Checksum(im));
    ASSERT_EQ(bytes->size(), 10 + header + want.size() * 4);
    size_t wrong = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      float got;
      std::memcpy(&got, bytes->data() + 10 + header + 4 * i, 4);
      const float expect = std::string(dtype) == "fp16"   ? HalfToFloat(FloatToHalf(want[i]))
                           : std::string(dtype) == "bf16" ? Bf16ToFloat(FloatToBf16(want[i]))
                                                          : want[i];
      wrong += std::memcmp(&got, &expect, 4) != 0;
    }
    EXPECT_EQ(wrong, 0u) << dtype;
  }
  Maskctl bad;
  EXPECT_EQ(bad.Run({"--server", target, "embed", image, "--return-embedding", "int8"}), 1);
  EXPECT_NE(bad.err.str().find("--return-embedding"), std::string::npos) << bad.err.str();
  std::filesystem::remove_all(dir);
  server.Shutdown();
}

}  // namespace
}  // namespace maskd::client
