// Issue #14, finding 8: checkpoint files that are corrupt, inconsistent or hostile are refused with
// INVALID_ARGUMENT naming the problem, and the model identity does not depend on the container.
// Every bad file is built here from a valid one (WriteStateDict, or hand-made safetensors/pickle).
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/checkpoint.h"
#include "model/api/engine.h"
#include "model/sam.h"
#include "model/sam_config.h"
#include "tests/checkpoint_files.h"

namespace maskd {
namespace {

using namespace std::string_literals;
using testing::ReadAll;
using testing::Safetensors;
using testing::TempPath;
using testing::TinyStateDict;
using testing::WriteAll;

constexpr uint64_t kSeed = 11;  // TinyStateDict's weights: any seed, fixed so that a failure repeats

// `sd` as safetensors, tensors in the given order.
std::string SafetensorsOf(const StateDict& sd) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::string data;
  for (const auto& [n, t0] : sd) {
    at::Tensor t = t0.contiguous();
    header[n] = {{"dtype", "F32"},
                 {"shape", t.sizes().vec()},
                 {"data_offsets", {data.size(), data.size() + t.nbytes()}}};
    data.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  }
  return Safetensors(header.dump(), data);
}

StatusOr<std::unique_ptr<Engine>> EngineFor(const std::string& path) {
  EngineOptions o;
  o.checkpoint = path;
  o.warmup = false;
  o.device = "cpu";
  return Engine::Create(o);
}

void ExpectInvalid(const Status& s, const std::string& mention) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find(mention), std::string::npos) << "\"" << mention << "\" not in: " << s.message();
}

TEST(HardeningCheckpoint, SafetensorsWhoseHeaderLengthStartsWith0x80IsNotCalledLegacy) {
  const float values[4] = {1, 2, 3, 4};
  for (size_t len : {128u, 384u}) {
    const std::string path = TempPath("h" + std::to_string(len) + ".safetensors");
    WriteAll(path, Safetensors(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                               std::string(reinterpret_cast<const char*>(values), 16), len));
    ASSERT_EQ(static_cast<uint8_t>(ReadAll(path)[0]), 0x80);
    auto r = ReadStateDict(path);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->size(), 1u);
    EXPECT_EQ((*r)[0].second[3].item<float>(), 4.0f);
  }
}

TEST(HardeningCheckpoint, SameWeightsHaveOneIdentityWhateverTheContainerOrOrder) {
  StateDict sd = TinyStateDict(kSeed);
  const std::string pth = TempPath("same.pth");
  ASSERT_TRUE(WriteStateDict(sd, pth).ok());
  StateDict reversed(sd.rbegin(), sd.rend());
  const std::string pth_reversed = TempPath("same_reversed.pth");
  ASSERT_TRUE(WriteStateDict(reversed, pth_reversed).ok());
  const std::string st = TempPath("same.safetensors");
  WriteAll(st, SafetensorsOf(reversed));
  auto a = EngineFor(pth), b = EngineFor(pth_reversed), c = EngineFor(st);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ((*a)->description().identity, (*b)->description().identity);
  EXPECT_EQ((*a)->description().identity, (*c)->description().identity);
  // ... and different weights still differ.
  sd[0].second.view(-1)[0] += 1.0f;
  const std::string other = TempPath("other.pth");
  ASSERT_TRUE(WriteStateDict(sd, other).ok());
  auto d = EngineFor(other);
  ASSERT_TRUE(d.ok());
  EXPECT_NE((*a)->description().identity, (*d)->description().identity);
}

TEST(HardeningCheckpoint, PthCorruptedMidFileIsRefusedByItsCrc) {
  const std::string path = TempPath("corrupt.pth");
  ASSERT_TRUE(WriteStateDict(TinyStateDict(kSeed), path).ok());
  std::string bytes = ReadAll(path);
  // The middle of the file lies inside the largest weight record (deterministic layout).
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x5a);
  WriteAll(path, bytes);
  auto r = ReadStateDict(path);
  ASSERT_FALSE(r.ok());
  ExpectInvalid(r.status(), "CRC-32");
  EXPECT_NE(r.status().message().find(path), std::string::npos);
  auto e = EngineFor(path);
  ASSERT_FALSE(e.ok());
  ExpectInvalid(e.status(), "corrupt");
}

TEST(HardeningCheckpoint, NanOrInfWeightsAreRefusedNamingTheTensor) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    StateDict sd = TinyStateDict(kSeed);
    const std::string name = sd[sd.size() / 2].first;
    sd[sd.size() / 2].second.view(-1)[0] = bad;
    const std::string path = TempPath("nan.pth");
    ASSERT_TRUE(WriteStateDict(sd, path).ok());
    auto e = EngineFor(path);
    ASSERT_FALSE(e.ok()) << "a weight of " << bad << " was accepted";
    ExpectInvalid(e.status(), "tensor '" + name + "' has 1 NaN or infinite value");
  }
}

TEST(HardeningCheckpoint, SafetensorsOffsetsThatWrapAroundAreRefused) {
  const std::string data(16, '\0');
  // data_start + off[1] wraps to a small number; off[1] - off[0] == 16 == the tensor's bytes.
  const std::string header_text = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[OFF0,OFF1]}})";
  const size_t pad = 256;
  const uint64_t data_start = 8 + pad;
  const uint64_t off0 = ~uint64_t{0} - data_start - 3;  // 2^64 - data_start - 4
  std::string h = header_text;
  h.replace(h.find("OFF0"), 4, std::to_string(off0));
  h.replace(h.find("OFF1"), 4, std::to_string(off0 + 16));
  const std::string path = TempPath("wrap.safetensors");
  WriteAll(path, Safetensors(h, data, pad));
  auto r = ReadStateDict(path);
  ASSERT_FALSE(r.ok());
  ExpectInvalid(r.status(), "data offsets");
}

// JSON numbers that are not integers (1e28 parses as a double; converting it was undefined behaviour:
// the checkpoint fuzzer's find) and shape entries past int64 are refused, naming the field.
TEST(HardeningCheckpoint, SafetensorsNonIntegerShapesAndOffsetsAreRefused) {
  const std::string data(16, '\0');
  for (const auto& [header, field] : std::vector<std::pair<std::string, std::string>>{
           {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,9999999999999999999999999924]}})", "data offsets"},
           {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16.0]}})", "data offsets"},
           {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[-16,0]}})", "data offsets"},
           {R"({"w":{"dtype":"F32","shape":[4.5],"data_offsets":[0,16]}})", "shape"},
           {R"({"w":{"dtype":"F32","shape":[1e30],"data_offsets":[0,16]}})", "shape"},
           {R"({"w":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,16]}})", "shape"},
           {R"({"w":{"dtype":"F32","shape":4,"data_offsets":[0,16]}})", "not arrays"}}) {
    const std::string path = TempPath("nonint.safetensors");
    WriteAll(path, Safetensors(header, data));
    auto r = ReadStateDict(path);
    ASSERT_FALSE(r.ok()) << header;
    ExpectInvalid(r.status(), field);
  }
  // The same file with integers reads.
  const std::string path = TempPath("int.safetensors");
  WriteAll(path, Safetensors(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", data));
  EXPECT_TRUE(ReadStateDict(path).ok());
}

TEST(HardeningCheckpoint, SafetensorsShapeOverflowIsInvalidArgument) {
  // 2^62 * 4 elements wraps to 0, which matches empty offsets.
  const std::string path = TempPath("overflow.safetensors");
  WriteAll(path, Safetensors(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})",
                             ""));
  auto r = ReadStateDict(path);
  ASSERT_FALSE(r.ok());
  ExpectInvalid(r.status(), "overflows 64 bits");
}

// A torch.save-style archive with one float storage of `storage_floats` elements and a tensor
// rebuilt from it with the given size and stride (one dimension), as pickle.
std::string ArchiveWithView(const std::string& name, int storage_floats, int32_t size, int32_t stride) {
  const std::string path = TempPath(name);
  caffe2::serialize::PyTorchStreamWriter w(path);
  std::vector<float> storage(static_cast<size_t>(storage_floats), 1.0f);
  w.writeRecord("data/0", storage.data(), storage.size() * sizeof(float));
  auto int32 = [](int32_t v) {
    std::string s = "J";
    for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((static_cast<uint32_t>(v) >> (8 * i)) & 0xff));
    return s;
  };
  const std::string p = "\x80\x02"s + "ccollections\nOrderedDict\n)R(" + "X\x01\x00\x00\x00"s + "w" +
                        "ctorch._utils\n_rebuild_tensor_v2\n(" +
                        "(X\x07\x00\x00\x00storagectorch\nFloatStorage\n"s + "X\x01\x00\x00\x00"s + "0" +
                        "X\x03\x00\x00\x00"s + "cpu" + int32(storage_floats) + "tQ" + "K\x00"s +
                        int32(size) + "\x85" + int32(stride) + "\x85" + "\x89" +
                        "ccollections\nOrderedDict\n)R" + "tRu.";
  w.writeRecord("data.pkl", p.data(), p.size());
  w.writeEndOfFile();
  return path;
}

TEST(HardeningCheckpoint, ZeroStrideTensorDoesNotBlowUpFromSixteenBytes) {
  // 16 bytes of storage viewed as 600 M floats (2.4 GB once made contiguous).
  auto r = ReadStateDict(ArchiveWithView("zero_stride.pth", 4, 600'000'000, 0));
  ASSERT_FALSE(r.ok());
  ExpectInvalid(r.status(), "zero or overlapping strides");
  // The same layout with a real stride is fine.
  auto ok = ReadStateDict(ArchiveWithView("plain.pth", 4, 4, 1));
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ((*ok)[0].second.numel(), 4);
}

}  // namespace
}  // namespace maskd
