// The checkpoint reader and writer: round trips, the official format's variations, safetensors, and
// every error a user can hit (with the message naming the file and the problem).
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "model/checkpoint.h"
#include "model/api/engine.h"
#include "model/engine_create.h"
#include "model/sam.h"
#include "model/sam_config.h"
#include "tests/checkpoint_files.h"
#include "tests/golden_dir.h"

namespace maskd {
namespace {

using namespace std::string_literals;
using testing::ReadAll;
using testing::TempPath;
using testing::TinyStateDict;
using testing::WriteAll;

constexpr uint64_t kSeed = 7;  // TinyStateDict's weights: any seed, fixed so that a failure repeats

TEST(Checkpoint, WriteThenReadRoundTripsEveryDtypeAndShape) {
  StateDict sd = {{"a.weight", torch::randn({3, 4})},
                  {"b", torch::arange(10, torch::kLong)},
                  {"c", torch::randn({2, 3, 4}).to(torch::kBFloat16)},
                  {"d", torch::randint(0, 255, {5}, torch::kByte)},
                  {"e.scalar", torch::tensor(3.5f).reshape({})},
                  {"f.empty", torch::zeros({0, 3})}};
  const std::string path = TempPath("rt.pth");
  ASSERT_TRUE(WriteStateDict(sd, path).ok());
  auto back = ReadStateDict(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->size(), sd.size());
  for (size_t i = 0; i < sd.size(); ++i) {
    EXPECT_EQ((*back)[i].first, sd[i].first);
    EXPECT_EQ((*back)[i].second.scalar_type(), sd[i].second.scalar_type()) << sd[i].first;
    EXPECT_EQ((*back)[i].second.sizes(), sd[i].second.sizes()) << sd[i].first;
    EXPECT_TRUE(torch::equal((*back)[i].second, sd[i].second)) << sd[i].first;
  }
  std::remove(path.c_str());
}

TEST(Checkpoint, ReadsTheGoldenOfficialFormatCheckpoint) {
  MASKD_REQUIRE_GOLDEN(dir, "tiny");
  // Written by torch 1.13 (top folder named after the file, OrderedDict with _metadata).
  auto sd = ReadStateDict(dir + "/sam_tiny.pth");
  ASSERT_TRUE(sd.ok()) << sd.status().ToString();
  EXPECT_EQ(sd->front().first, "image_encoder.pos_embed");
  EXPECT_EQ(sd->front().second.sizes(), (std::vector<int64_t>{1, 64, 64, 96}));
  auto cfg = InferSamConfig(*sd, "sam_tiny.pth");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->arch, "tiny");
  EXPECT_EQ(cfg->embed_dim, 96);
  EXPECT_EQ(cfg->depth, 4);
  EXPECT_EQ(cfg->num_heads, 2);
  EXPECT_EQ(cfg->global_attn_indexes, (std::vector<int>{1, 3}));
  EXPECT_EQ(cfg->window_size, 14);
  Sam model(*cfg);
  EXPECT_TRUE(LoadStateDict(*model, *sd, "sam_tiny.pth").ok());
}

TEST(Checkpoint, TopFolderNameIsNotAssumed) {
  // The same records under a different top folder ("archive", as newer torch writes).
  StateDict sd = {{"x", torch::randn({4})}};
  const std::string a = TempPath("renamed.pth");
  ASSERT_TRUE(WriteStateDict(sd, a).ok());
  caffe2::serialize::PyTorchStreamReader r(a);
  const std::string b = TempPath("archive.pth");
  {
    caffe2::serialize::PyTorchStreamWriter w(b);  // names its folder after this file: "archive"
    for (const auto& rec : r.getAllRecords()) {
      if (rec == "version" || rec == ".data/version") continue;
      auto [data, size] = r.getRecord(rec);
      w.writeRecord(rec, data.get(), size);
    }
    w.writeEndOfFile();
  }
  auto back = ReadStateDict(b);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(torch::equal((*back)[0].second, sd[0].second));
}

TEST(Checkpoint, TruncatedFileIsAClearError) {
  MASKD_REQUIRE_GOLDEN(dir, "tiny");
  const std::string full = ReadAll(dir + "/sam_tiny.pth");
  const std::string path = TempPath("truncated.pth");
  WriteAll(path, full.substr(0, full.size() / 2));
  auto r = ReadStateDict(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("truncated"), std::string::npos) << r.status().message();
}

TEST(Checkpoint, NotACheckpointIsAClearError) {
  const std::string path = TempPath("text.pth");
  WriteAll(path, "this is not a checkpoint at all, just some text");
  auto r = ReadStateDict(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not a checkpoint"), std::string::npos) << r.status().message();
  auto missing = ReadStateDict(TempPath("does-not-exist.pth"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("cannot open"), std::string::npos);
}

TEST(Checkpoint, LegacyFormatIsNamed) {
  const std::string path = TempPath("legacy.pth");
  WriteAll(path, std::string("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.", 15));
  auto r = ReadStateDict(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("legacy"), std::string::npos) << r.status().message();
}

// A zip archive in torch.save's layout whose pickle is `payload`.
std::string ArchiveWithPickle(const std::string& name, const std::string& payload) {
  const std::string path = TempPath(name);
  caffe2::serialize::PyTorchStreamWriter w(path);
  w.writeRecord("data.pkl", payload.data(), payload.size());
  w.writeEndOfFile();
  return path;
}

TEST(Checkpoint, RefusesPickleGlobalsThatCouldRunCode) {
  // The classic exploit: os.system("echo pwned") through GLOBAL + REDUCE.
  const std::string payload = std::string("\x80\x02") + "cos\nsystem\n" + "X\x0a\x00\x00\x00"s +
                              "echo pwned" + "\x85" + "R.";
  auto r = ReadStateDict(ArchiveWithPickle("evil.pth", payload));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("os.system"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("refusing"), std::string::npos) << r.status().message();
  const std::string builtins = std::string("\x80\x02") + "c__builtin__\neval\n" + ".";
  auto r2 = ReadStateDict(ArchiveWithPickle("evil2.pth", builtins));
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("__builtin__.eval"), std::string::npos);
}

TEST(Checkpoint, RefusesAZipEntryDeclaringMoreBytesThanTheFileHolds) {
  // A fuzz_checkpoint finding: the zip reader allocates an entry's declared size before reading
  // it, so a central directory claiming 2.2 GB for a 100-byte record must be refused first.
  const std::string path = ArchiveWithPickle("liar.pth", "\x80\x02}q\x00.");
  std::string bytes = ReadAll(path);
  const size_t cd = bytes.find("PK\x01\x02");
  ASSERT_NE(cd, std::string::npos);
  const unsigned char lie[4] = {0x00, 0x00, 0x00, 0x87};  // 0x87000000 bytes, little-endian
  bytes.replace(cd + 24, 4, reinterpret_cast<const char*>(lie), 4);
  WriteAll(path, bytes);
  auto r = ReadStateDict(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("declares 2264924160 bytes"), std::string::npos)
      << r.status().message();
}

TEST(Checkpoint, RejectsTensorsReachingPastTheirStorage) {
  // _rebuild_tensor_v2(storage of 2 floats, offset 0, size (8,), stride (1,), ...)
  const std::string path = TempPath("overrun.pth");
  {
    caffe2::serialize::PyTorchStreamWriter w(path);
    float two[2] = {1, 2};
    w.writeRecord("data/0", two, sizeof two);
    std::string p = std::string("\x80\x02") + "ccollections\nOrderedDict\n)R(" + "X\x01\x00\x00\x00"s + "w" +
                    "ctorch._utils\n_rebuild_tensor_v2\n(" + "(X\x07\x00\x00\x00storagectorch\nFloatStorage\n"s +
                    "X\x01\x00\x00\x00"s + "0" + "X\x03\x00\x00\x00"s + "cpu" + "K\x02tQ" + "K\x00"s + "K\x08\x85" +
                    "K\x01\x85" + "\x89" + "ccollections\nOrderedDict\n)R" + "tRu.";
    w.writeRecord("data.pkl", p.data(), p.size());
    w.writeEndOfFile();
  }
  auto r = ReadStateDict(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("past its storage"), std::string::npos) << r.status().message();
}

TEST(Checkpoint, MissingUnexpectedAndMismatchedKeysAreListed) {
  Sam model(*SamPreset("tiny"));
  StateDict sd = TinyStateDict(kSeed);
  StateDict missing(sd.begin() + 1, sd.end());
  Status s = LoadStateDict(*model, missing, "m.pth");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("missing keys: " + sd[0].first), std::string::npos) << s.message();

  StateDict extra = sd;
  extra.emplace_back("image_encoder.blocks.9.attn.qkv.weight", torch::zeros({1}));
  s = LoadStateDict(*model, extra, "e.pth");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("unexpected keys: image_encoder.blocks.9.attn.qkv.weight"), std::string::npos)
      << s.message();

  StateDict bad = sd;
  for (auto& [n, t] : bad)
    if (n == "mask_decoder.iou_token.weight") t = torch::zeros({1, 128});
  s = LoadStateDict(*model, bad, "s.pth");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("mask_decoder.iou_token.weight (expected [1, 256], got [1, 128])"),
            std::string::npos)
      << s.message();
}

TEST(Checkpoint, EngineReportsCheckpointErrorsWithTheFileName) {
  const std::string path = TempPath("broken_sam.pth");
  StateDict sd = TinyStateDict(kSeed);
  sd.erase(std::remove_if(sd.begin(), sd.end(),
                          [](const auto& kv) { return kv.first == "image_encoder.blocks.0.norm1.weight"; }),
           sd.end());
  ASSERT_TRUE(WriteStateDict(sd, path).ok());
  EngineOptions o;
  o.checkpoint = path;
  o.warmup = false;
  auto e = Engine::Create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find(path), std::string::npos) << e.status().message();
  EXPECT_NE(e.status().message().find("missing keys: image_encoder.blocks.0.norm1.weight"), std::string::npos)
      << e.status().message();
}

void WriteSafetensors(const std::string& path, const StateDict& sd, bool truncate = false) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [n, t0] : sd) {
    at::Tensor t = t0.contiguous();
    header[n] = {{"dtype", t.scalar_type() == at::kFloat ? "F32" : "BF16"},
                 {"shape", t.sizes().vec()},
                 {"data_offsets", {data.size(), data.size() + t.nbytes()}}};
    data.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string out = testing::Safetensors(header.dump(), data);
  if (truncate) out.resize(out.size() - 16);
  WriteAll(path, out);
}

TEST(Checkpoint, ReadsSafetensorsAndLoadsAModelFromIt) {
  StateDict sd = TinyStateDict(kSeed);
  const std::string path = TempPath("tiny.safetensors");
  WriteSafetensors(path, sd);
  auto back = ReadStateDict(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->size(), sd.size());
  for (const auto& [n, t] : sd) {
    bool found = false;
    for (const auto& [m, u] : *back)
      if (m == n) found = torch::equal(t, u);
    EXPECT_TRUE(found) << n;
  }
  EngineOptions o;
  o.checkpoint = path;
  o.warmup = false;
  auto e = Engine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ((*e)->description().arch, "tiny");
}

// The checkpoint path builds the model without initialising it and lets the file's tensors become
// its weights: what it serves must still be exactly the weights in the file.
TEST(Checkpoint, LoadedModelHoldsTheFilesWeightsBitForBit) {
  const std::string path = TempPath("seeded.pth");
  ASSERT_TRUE(MakeRandomCheckpoint({"tiny", 7}, path).ok());
  auto sd = ReadStateDict(path);
  ASSERT_TRUE(sd.ok()) << sd.status().ToString();
  auto cfg = InferSamConfig(*sd, path);
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  Sam loaded = MakeSamForLoading(*cfg);
  ASSERT_TRUE(LoadStateDict(*loaded, *sd, path, /*share_storage=*/true).ok());

  Sam reference(*cfg);
  RandomizeWeights(*reference, 7);
  const StateDict want = ModelStateDict(*reference), got = ModelStateDict(*loaded);
  ASSERT_EQ(got.size(), want.size());
  std::map<const void*, std::string> file_data;
  for (const auto& [n, t] : *sd) file_data[t.data_ptr()] = n;
  for (size_t i = 0; i < want.size(); ++i) {
    const auto& [name, w] = want[i];
    const at::Tensor& g = got[i].second;
    ASSERT_EQ(got[i].first, name);
    ASSERT_EQ(g.scalar_type(), w.scalar_type()) << name;
    ASSERT_EQ(g.sizes(), w.sizes()) << name;
    ASSERT_TRUE(g.device().is_cpu() && g.is_contiguous()) << name;
    EXPECT_EQ(std::memcmp(g.data_ptr(), w.data_ptr(), w.nbytes()), 0) << name << " differs from seed 7";
    // Shared with the file's tensor of the same name, not copied.
    auto it = file_data.find(g.data_ptr());
    ASSERT_NE(it, file_data.end()) << name << " was copied";
    EXPECT_EQ(it->second, name);
  }
  EXPECT_TRUE(loaded->named_parameters()["image_encoder.pos_embed"].requires_grad());
}

// The model identity hashes the weights: a checkpoint of the seeded demo model and the demo model
// itself are one model.
TEST(Checkpoint, EngineFromASeededCheckpointHasTheSeededModelsIdentity) {
  const std::string path = TempPath("seeded_engine.pth");
  ASSERT_TRUE(MakeRandomCheckpoint({"tiny", 9}, path).ok());
  EngineOptions from_file, seeded;
  from_file.checkpoint = path;
  seeded.random_arch = "tiny";
  seeded.demo_seed = 9;
  for (EngineOptions* o : {&from_file, &seeded}) {
    o->warmup = false;
    o->device = "cpu";
    o->log = [](LogLevel, std::string_view) {};
  }
  auto a = Engine::Create(from_file), b = Engine::Create(seeded);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ((*a)->description().identity, (*b)->description().identity);
  EXPECT_EQ((*a)->description().parameter_count, (*b)->description().parameter_count);
}

TEST(Checkpoint, SkippingInitialisationLeavesTheThreadAsItWas) {
  Sam model = MakeSamForLoading(*SamPreset("tiny"));
  for (const auto& [n, t] : ModelStateDict(*model)) ASSERT_TRUE(t.device().is_cpu()) << n;
  // Plain CPU ops are CPU ops again, with their results ...
  const at::Tensor x = torch::full({2, 2}, 3.0f);
  const at::Tensor y = at::mm(x, x);
  EXPECT_TRUE(y.device().is_cpu());
  EXPECT_FALSE(y.is_meta());
  EXPECT_EQ(y[1][1].item<float>(), 18.0f);
  // ... and modules built afterwards are initialised as LibTorch does it.
  torch::manual_seed(5);
  torch::nn::Linear a(16, 16);
  torch::manual_seed(5);
  torch::nn::Linear b(16, 16);
  EXPECT_TRUE(a->weight.equal(b->weight));
  const float bound = 1.0f / 4.0f;  // kaiming_uniform_(a = sqrt(5)) on fan_in 16
  EXPECT_LE(a->weight.abs().max().item<float>(), bound);
  EXPECT_GT(a->weight.abs().max().item<float>(), bound / 2);
}

// A checkpoint may hold views of one storage (tied or sliced tensors): those are copied, so that
// no two model tensors share memory.
TEST(Checkpoint, SharingNeverAliasesTwoModelTensors) {
  Sam reference(*SamPreset("tiny"));
  RandomizeWeights(*reference, 3);
  StateDict sd;
  for (auto& [n, t] : ModelStateDict(*reference)) sd.emplace_back(n, t.clone());
  // Two tensors of one shape become views into one storage.
  size_t first = 0, second = 0;
  for (size_t i = 0; i < sd.size() && !second; ++i)
    for (size_t j = 0; j < i && !second; ++j)
      if (sd[i].second.sizes() == sd[j].second.sizes() && sd[i].second.numel() > 1) first = j, second = i;
  ASSERT_NE(second, 0u);
  const at::Tensor a = sd[first].second, b = sd[second].second;
  const at::Tensor both = at::cat({a.reshape(-1), b.reshape(-1)});
  sd[first].second = both.slice(0, 0, a.numel()).view(a.sizes());
  sd[second].second = both.slice(0, a.numel()).view(b.sizes());
  Sam loaded = MakeSamForLoading(*SamPreset("tiny"));
  ASSERT_TRUE(LoadStateDict(*loaded, sd, "views.pth", /*share_storage=*/true).ok());
  const StateDict got = ModelStateDict(*loaded);
  const char* lo = static_cast<const char*>(both.data_ptr());
  const char* hi = lo + both.nbytes();
  for (size_t i = 0; i < got.size(); ++i) {
    const char* p = static_cast<const char*>(got[i].second.data_ptr());
    EXPECT_FALSE(p >= lo && p < hi) << got[i].first << " aliases the shared storage";
    EXPECT_TRUE(got[i].second.equal(sd[i].second)) << got[i].first;
  }
}

// A hand-made torch.save archive: one float storage record "data/0" holding `record`, of which the
// pickle claims `numel` floats, and tensors viewing it as (name, offset, sizes, strides).
struct View {
  std::string name;
  int32_t offset;
  std::vector<int32_t> sizes, strides;
};
std::string ArchiveWithViews(const std::string& name, const std::vector<float>& record, int32_t numel,
                             const std::vector<View>& views) {
  auto int32 = [](int32_t v) {
    std::string s = "J";
    for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((static_cast<uint32_t>(v) >> (8 * i)) & 0xff));
    return s;
  };
  auto str = [](const std::string& v) {
    std::string s = "X";
    for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v.size() >> (8 * i)) & 0xff));
    return s + v;
  };
  auto tuple = [&](const std::vector<int32_t>& v) {
    std::string s = "(";
    for (int32_t x : v) s += int32(x);
    return s + "t";
  };
  std::string p = "\x80\x02"s + "ccollections\nOrderedDict\n)R(";  // split: \x02c would be one escape
  for (const View& v : views) {
    p += str(v.name) + "ctorch._utils\n_rebuild_tensor_v2\n(" + "(" + str("storage") +
         "ctorch\nFloatStorage\n" + str("0") + str("cpu") + int32(numel) + "tQ" + int32(v.offset) +
         tuple(v.sizes) + tuple(v.strides) + "\x89" + "ccollections\nOrderedDict\n)R" + "tR";
  }
  p += "u.";
  const std::string path = TempPath(name);
  caffe2::serialize::PyTorchStreamWriter w(path);
  w.writeRecord("data/0", record.data(), record.size() * sizeof(float));
  w.writeRecord("data.pkl", p.data(), p.size());
  w.writeEndOfFile();
  return path;
}

// Storages are read after the pickle, all at once: views into them (strided, offset, two tensors
// of one storage) must still see the file's values, and a record longer than its storage is
// checked over all its bytes.
TEST(Checkpoint, ViewsOfOneLongerStorageSeeTheFilesValues) {
  std::vector<float> record(16);
  for (size_t i = 0; i < record.size(); ++i) record[i] = static_cast<float>(i);
  const std::vector<View> views = {{"t", 0, {4, 3}, {1, 4}}, {"s", 2, {5}, {2}}};
  const std::string path = ArchiveWithViews("views.pth", record, 12, views);
  auto r = ReadStateDict(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 2u);
  const at::Tensor storage = torch::arange(12, torch::kFloat);
  EXPECT_TRUE((*r)[0].second.equal(storage.view({3, 4}).t().contiguous()));
  EXPECT_TRUE((*r)[0].second.is_contiguous());
  EXPECT_TRUE((*r)[1].second.equal(torch::tensor({2.0f, 4.0f, 6.0f, 8.0f, 10.0f})));

  // A flipped byte in the record's last float (beyond the 12 the storage uses) is still caught.
  std::string bytes = ReadAll(path);
  const std::string last(reinterpret_cast<const char*>(&record[15]), sizeof(float));
  const size_t at = bytes.find(last);
  ASSERT_NE(at, std::string::npos);
  bytes[at] = static_cast<char>(bytes[at] ^ 0x01);
  WriteAll(path, bytes);
  auto bad = ReadStateDict(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("data/0 is corrupt (CRC-32"), std::string::npos) << bad.status().message();
}

TEST(Checkpoint, TruncatedSafetensorsIsAClearError) {
  const std::string path = TempPath("cut.safetensors");
  WriteSafetensors(path, {{"a", torch::randn({64})}}, /*truncate=*/true);
  auto r = ReadStateDict(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("truncated"), std::string::npos) << r.status().message();
}

TEST(SamConfig, InfersEveryPresetFromItsTensorShapes) {
  for (const char* arch : {"vit_b", "vit_l", "vit_h", "tiny"}) {
    auto preset = SamPreset(arch);
    ASSERT_TRUE(preset.ok());
    Sam model(*preset);
    StateDict sd;
    for (auto& [n, t] : ModelStateDict(*model)) sd.emplace_back(n, t);
    auto cfg = InferSamConfig(sd, arch);
    ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
    EXPECT_EQ(cfg->arch, arch);
    EXPECT_EQ(cfg->embed_dim, preset->embed_dim);
    EXPECT_EQ(cfg->depth, preset->depth);
    EXPECT_EQ(cfg->num_heads, preset->num_heads);
    EXPECT_EQ(cfg->global_attn_indexes, preset->global_attn_indexes);
  }
}

TEST(SamConfig, InfersAnUnreleasedShape) {
  SamConfig c = *SamPreset("tiny");
  c.embed_dim = 64, c.depth = 3, c.num_heads = 4, c.mlp_dim = 128, c.window_size = 8;
  c.global_attn_indexes = {2};
  Sam model(c);
  auto cfg = InferSamConfig(ModelStateDict(*model), "custom");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->arch, "custom");
  EXPECT_EQ(cfg->num_heads, 4);
  EXPECT_EQ(cfg->window_size, 8);
  EXPECT_EQ(cfg->mlp_dim, 128);
  EXPECT_EQ(cfg->global_attn_indexes, (std::vector<int>{2}));
}

}  // namespace
}  // namespace maskd
