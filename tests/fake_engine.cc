#include "tests/fake_engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

#include "model/api/half.h"
#include "model/io/rle.h"

namespace maskd::fake {
namespace {

constexpr int kLowRes = 256;
constexpr int kImageSize = 1024;

// The fake's payloads: numbers instead of tensors.
struct FakePrepared final : HandlePayload {
  uint64_t content = 0;
};

struct FakeEmbedding final : Embedding::Payload {
  uint64_t content = 0;
  size_t size = 0;
  bool host = false;
  size_t bytes() const override { return size; }
  bool on_host() const override { return host; }
  std::vector<float> ToFloat() const override { return {static_cast<float>(content % 1000)}; }
  std::vector<int64_t> shape() const override { return {1}; }
};

struct FakeLogits final : MaskLogits::Payload {
  int n = 0, h = 0, w = 0;
  std::vector<float> values;  // n x h x w
  int num_masks() const override { return n; }
  int height() const override { return h; }
  int width() const override { return w; }
  size_t bytes() const override { return values.size() * sizeof(float); }
  std::vector<float> ToFloat() const override { return values; }
};

// Handles from another engine are a test bug; say so instead of reading garbage.
template <typename T, typename P>
const T& As(const P* payload) {
  const T* t = dynamic_cast<const T*>(payload);
  if (t == nullptr) throw std::logic_error("FakeEngine was given a handle it did not make");
  return *t;
}
const FakeEmbedding& Payload(const Embedding& e) { return As<FakeEmbedding>(&e.payload()); }
const FakeLogits& Payload(const MaskLogits& l) { return As<FakeLogits>(&l.payload()); }

std::shared_ptr<const Embedding> Wrap(const ImageGeometry& g, uint64_t content, size_t bytes,
                                      bool on_host) {
  auto p = std::make_shared<FakeEmbedding>();
  p->content = content;
  p->size = bytes;
  p->host = on_host;
  return std::make_shared<const Embedding>(g, std::move(p));
}

}  // namespace

FakeEngine::FakeEngine(FakeEngineOptions o) : o_(std::move(o)) {
  desc_.arch = "fake";
  desc_.checkpoint = "fake";
  desc_.embed_dim = 8;
  desc_.depth = 1;
  desc_.num_heads = 1;
  desc_.image_size = kImageSize;
  desc_.identity = o_.identity;
  desc_.parameter_count = 42;
  engine_options_.device = o_.device;
}

uint64_t FakeEngine::Checksum(const ImageRGB8& image) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (uint8_t v : image.pixels) h = (h ^ v) * 1099511628211ull;
  return h ^ (static_cast<uint64_t>(image.width) << 32) ^ static_cast<uint64_t>(image.height);
}

std::vector<int> FakeEngine::encode_batches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return encode_batches_;
}

std::vector<int> FakeEngine::decode_batches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return decode_batches_;
}

void FakeEngine::FailNextEncode(Status s) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_encode_ = std::move(s);
}

void FakeEngine::FailNextDecode(Status s) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_decode_ = std::move(s);
}

void FakeEngine::ThrowOnNextPostprocess(std::string what) {
  std::lock_guard<std::mutex> lock(mu_);
  throw_postprocess_ = std::move(what);
}

void FakeEngine::SetEncodeMemoryLimit(int images) {
  std::lock_guard<std::mutex> lock(mu_);
  encode_memory_limit_ = images;
}

void FakeEngine::SetDecodeMemoryLimit(int prompts) {
  std::lock_guard<std::mutex> lock(mu_);
  decode_memory_limit_ = prompts;
}

void FakeEngine::OomOnEncodeOf(uint64_t content) {
  std::lock_guard<std::mutex> lock(mu_);
  oom_encode_of_.push_back(content);
}

void FakeEngine::OomOnDecodeOf(uint64_t content) {
  std::lock_guard<std::mutex> lock(mu_);
  oom_decode_of_.push_back(content);
}

void FakeEngine::SetHold(bool* flag, bool on) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    *flag = on;
  }
  cv_.notify_all();
}

void FakeEngine::HoldEncodes() { SetHold(&hold_, true); }
void FakeEngine::ReleaseEncodes() { SetHold(&hold_, false); }
void FakeEngine::HoldPrepares() { SetHold(&hold_prepare_, true); }
void FakeEngine::ReleasePrepares() { SetHold(&hold_prepare_, false); }

bool FakeEngine::WaitForEncodeCalls(int n, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (encode_calls.load() < n) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

StatusOr<PreparedImage> FakeEngine::Prepare(const ImageRGB8& image) {
  ++prepare_calls;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !hold_prepare_; });
  }
  if (image.width <= 0 || image.height <= 0 ||
      image.pixels.size() != static_cast<size_t>(image.width) * image.height * 3) {
    return InvalidArgument("fake Prepare: bad image");
  }
  ImageGeometry g;
  g.original_width = image.width;
  g.original_height = image.height;
  std::tie(g.input_width, g.input_height) = ResizedSize(image.width, image.height, kImageSize);
  auto payload = std::make_shared<FakePrepared>();
  payload->content = Checksum(image);
  return PreparedImage(g, payload);
}

StatusOr<PreparedImage> FakeEngine::PrepareResized(const ImageRGB8& resized, int ow, int oh) {
  auto p = Prepare(resized);
  if (!p.ok()) return p;
  ImageGeometry g = p->geometry();
  g.original_width = ow;
  g.original_height = oh;
  return PreparedImage(g, std::static_pointer_cast<const HandlePayload>(
                              std::make_shared<FakePrepared>(As<FakePrepared>(p->payload()))));
}

StatusOr<std::vector<std::shared_ptr<const Embedding>>> FakeEngine::Encode(
    const std::vector<PreparedImage>& images) {
  ++encode_calls;
  {
    std::unique_lock<std::mutex> lock(mu_);
    encode_batches_.push_back(static_cast<int>(images.size()));
    cv_.wait(lock, [this] { return !hold_; });
    if (fail_encode_) {
      Status s = *fail_encode_;
      fail_encode_.reset();
      return s;
    }
    bool poisoned = false;
    for (const auto& p : images) {
      const uint64_t c = As<FakePrepared>(p.payload()).content;
      poisoned |= std::find(oom_encode_of_.begin(), oom_encode_of_.end(), c) != oom_encode_of_.end();
    }
    if (poisoned || (encode_memory_limit_ > 0 && static_cast<int>(images.size()) > encode_memory_limit_)) {
      ++oom_returns;
      return ResourceExhausted("out of device memory while running the image encoder on " +
                               std::to_string(images.size()) + " images: fake allocator (limit " +
                               std::to_string(encode_memory_limit_) + " images)");
    }
  }
  if (o_.encode_delay.count() > 0) std::this_thread::sleep_for(o_.encode_delay);
  encoded_images += static_cast<int>(images.size());
  std::vector<std::shared_ptr<const Embedding>> out;
  for (const auto& p : images) {
    out.push_back(Wrap(p.geometry(), As<FakePrepared>(p.payload()).content, o_.embedding_bytes, false));
  }
  return out;
}

StatusOr<std::vector<StatusOr<DecodedPrompt>>> FakeEngine::DecodeEach(const std::vector<DecodeItem>& items) {
  ++decode_calls;
  {
    std::lock_guard<std::mutex> lock(mu_);
    decode_batches_.push_back(static_cast<int>(items.size()));
    if (fail_decode_) {
      Status s = *fail_decode_;
      fail_decode_.reset();
      return s;
    }
    bool poisoned = false;
    for (const auto& item : items) {
      if (!item.embedding) continue;
      const uint64_t c = Payload(*item.embedding).content;
      poisoned |= std::find(oom_decode_of_.begin(), oom_decode_of_.end(), c) != oom_decode_of_.end();
    }
    if (poisoned || (decode_memory_limit_ > 0 && static_cast<int>(items.size()) > decode_memory_limit_)) {
      ++oom_returns;
      return ResourceExhausted("out of device memory while running the mask decoder on " +
                               std::to_string(items.size()) + " prompts: fake allocator (limit " +
                               std::to_string(decode_memory_limit_) + " prompts)");
    }
  }
  if (o_.decode_delay.count() > 0) std::this_thread::sleep_for(o_.decode_delay);
  if (o_.decode_delay_per_prompt.count() > 0) {
    std::this_thread::sleep_for(o_.decode_delay_per_prompt * static_cast<int64_t>(items.size()));
  }
  std::vector<StatusOr<DecodedPrompt>> out;
  for (size_t i = 0; i < items.size(); ++i) {
    const DecodeItem& item = items[i];
    if (!item.embedding) {
      out.push_back(InvalidArgument("fake Decode: item " + std::to_string(i) + " has no embedding"));
      continue;
    }
    const Embedding& e = *item.embedding;
    if (e.on_host()) {
      out.push_back(FailedPrecondition("fake Decode: host-tier embedding"));
      continue;
    }
    if (Status s = ValidatePrompt(item.prompt, e.original_width(), e.original_height(),
                                  "prompts[" + std::to_string(i) + "]");
        !s.ok()) {
      out.push_back(std::move(s));
      continue;
    }
    ++decoded_prompts;
    const PromptSpec& p = item.prompt;
    // The prompt's centre in the low-res frame (input frame / 4).
    double cx, cy;
    if (!p.points.empty()) {
      cx = p.points[0].x, cy = p.points[0].y;
    } else {
      cx = (p.box->x0 + p.box->x1) / 2, cy = (p.box->y0 + p.box->y1) / 2;
    }
    const double sx = static_cast<double>(e.input_width()) / e.original_width() * kLowRes / kImageSize;
    const double sy = static_cast<double>(e.input_height()) / e.original_height() * kLowRes / kImageSize;
    cx *= sx;
    cy *= sy;
    const int n = p.multimask ? 3 : 1;
    const double base = 4.0 + static_cast<double>(Payload(e).content % 5) + (p.points.size() % 3);
    const bool background = !p.points.empty() && p.points[0].label == 0;
    auto impl = std::make_shared<FakeLogits>();
    impl->n = n;
    impl->h = kLowRes;
    impl->w = kLowRes;
    impl->values.resize(static_cast<size_t>(n) * kLowRes * kLowRes);
    std::vector<float> hint;
    if (p.mask_input) {
      const std::vector<float> all = p.mask_input->ToFloat();
      const size_t plane = static_cast<size_t>(kLowRes) * kLowRes;
      hint.assign(all.begin() + p.mask_input_index * plane, all.begin() + (p.mask_input_index + 1) * plane);
    }
    DecodedPrompt d;
    for (int m = 0; m < n; ++m) {
      // In low-res units (4 input pixels): discs of a few to a few dozen image pixels.
      const double r = (background ? 0.5 : 1.0) * base * 4 * (m + 1);
      for (int y = 0; y < kLowRes; ++y) {
        for (int x = 0; x < kLowRes; ++x) {
          const double dist = std::hypot(x + 0.5 - cx, y + 0.5 - cy);
          float v = static_cast<float>((r - dist) / 2.0);
          if (!hint.empty()) v += 0.5f * hint[static_cast<size_t>(y) * kLowRes + x];
          impl->values[(static_cast<size_t>(m) * kLowRes + y) * kLowRes + x] = v;
        }
      }
      // Scores differ per mask so that best_index is not always 0.
      d.scores.push_back(static_cast<float>(0.5 + 0.1 * ((m + Payload(e).content) % 3)));
    }
    d.logits = std::make_shared<const MaskLogits>(impl);
    out.push_back(std::move(d));
  }
  return out;
}

StatusOr<std::vector<std::vector<MaskData>>> FakeEngine::Postprocess(
    const std::vector<PostprocessItem>& items) {
  ++postprocess_calls;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (throw_postprocess_) {
      const std::string what = std::move(*throw_postprocess_);
      throw_postprocess_.reset();
      throw std::runtime_error(what);
    }
  }
  if (o_.postprocess_delay.count() > 0) std::this_thread::sleep_for(o_.postprocess_delay);
  std::vector<std::vector<MaskData>> out;
  // rle_in_place items: their strings in one buffer for the call, as a CUDA engine's pinned one
  // (views set once it stops growing).
  auto strings = std::make_shared<std::string>();
  struct InPlace {
    size_t item, mask, offset, size;
  };
  std::vector<InPlace> in_place;
  for (const auto& it : items) {
    const MaskLogits& l = *it.logits;
    const int W = it.original_width, H = it.original_height;
    std::vector<MaskData> masks;
    for (int m = 0; m < l.num_masks(); ++m) {
      const float* plane = Payload(l).values.data() + static_cast<size_t>(m) * l.height() * l.width();
      std::vector<uint8_t> mask(static_cast<size_t>(W) * H);
      uint64_t hi = 0, lo = 0;
      uint32_t x0 = W, y0 = H, x1 = 0, y1 = 0;
      uint64_t area = 0;
      for (int y = 0; y < H; ++y) {
        const int ly = std::min(l.height() - 1, static_cast<int>((y + 0.5) * it.input_height / H / 4));
        for (int x = 0; x < W; ++x) {
          const int lx = std::min(l.width() - 1, static_cast<int>((x + 0.5) * it.input_width / W / 4));
          const float v = plane[static_cast<size_t>(ly) * l.width() + lx];
          const bool in = v > 0;
          mask[static_cast<size_t>(y) * W + x] = in;
          hi += v > 1.0f;
          lo += v > -1.0f;
          if (in) {
            ++area;
            x0 = std::min<uint32_t>(x0, x);
            y0 = std::min<uint32_t>(y0, y);
            x1 = std::max<uint32_t>(x1, x);
            y1 = std::max<uint32_t>(y1, y);
          }
        }
      }
      MaskData d;
      d.area = area;
      d.stability_score = lo ? static_cast<float>(hi) / static_cast<float>(lo) : 0.f;
      if (area) d.bbox = {x0, y0, x1 - x0 + 1, y1 - y0 + 1};
      if (it.encoding == MaskEncoding::kRle && it.rle_in_place) {
        const std::string str = RleCountsToString(RleEncode(mask.data(), W, H));
        in_place.push_back({out.size(), masks.size(), strings->size(), str.size()});
        strings->append(str);
      } else if (it.encoding == MaskEncoding::kRle) {
        d.rle_counts = RleEncode(mask.data(), W, H);
      }
      if (it.encoding == MaskEncoding::kBitmask) d.bitmask = std::move(mask);
      masks.push_back(std::move(d));
    }
    out.push_back(std::move(masks));
  }
  for (const InPlace& p : in_place) {
    MaskData& d = out[p.item][p.mask];
    d.rle_view = std::string_view(strings->data() + p.offset, p.size);
    d.rle_owner = strings;
  }
  rle_in_place_masks += static_cast<int>(in_place.size());
  return out;
}

StatusOr<std::shared_ptr<const Embedding>> FakeEngine::ToHost(const Embedding& e) {
  ++to_host_calls;
  return Wrap(e.geometry(), Payload(e).content, e.bytes(), true);
}

StatusOr<std::shared_ptr<const Embedding>> FakeEngine::ToDevice(const Embedding& e) {
  ++to_device_calls;
  return Wrap(e.geometry(), Payload(e).content, e.bytes(), false);
}

StatusOr<std::shared_ptr<const MaskLogits>> FakeEngine::MakeMaskLogits(const float* v, int h, int w) {
  if (h != kLowRes || w != kLowRes) return InvalidArgument("fake MakeMaskLogits: expected 256 x 256");
  auto impl = std::make_shared<FakeLogits>();
  impl->n = 1;
  impl->h = h;
  impl->w = w;
  impl->values.assign(v, v + static_cast<size_t>(h) * w);
  return std::make_shared<const MaskLogits>(impl);
}

std::vector<float> FakeEngine::EmbeddingValues(uint64_t content) {
  const int64_t n = kEmbeddingShape[0] * kEmbeddingShape[1] * kEmbeddingShape[2] * kEmbeddingShape[3];
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t x = content * 0x9e3779b97f4a7c15ull + 1;
  for (int64_t i = 0; i < n; ++i) {
    // splitmix64
    x += 0x9e3779b97f4a7c15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const uint32_t mant = static_cast<uint32_t>(z) & 0x7fffffu;
    // Exponent 2^-30 .. 2^17: fp16 subnormals, underflow and overflow; every 7th value a tie of
    // both 16-bit roundings (only the bit just below the kept ones set).
    const uint32_t exp = 127 - 30 + static_cast<uint32_t>((z >> 32) % 48);
    const uint32_t sign = static_cast<uint32_t>(z >> 63) << 31;
    const uint32_t m = i % 7 == 0 ? ((mant & 0x7f0000u) | 0x8000u) : mant;
    const uint32_t bits = sign | (exp << 23) | m;
    std::memcpy(&v[static_cast<size_t>(i)], &bits, sizeof(float));
  }
  return v;
}

StatusOr<ExportedEmbedding> FakeEngine::ExportEmbedding(const Embedding& e, Precision dtype) {
  ++export_calls;
  const std::vector<float> values = EmbeddingValues(Payload(e).content);
  ExportedEmbedding out;
  out.dtype = dtype;
  out.shape.assign(std::begin(kEmbeddingShape), std::end(kEmbeddingShape));
  if (dtype == Precision::kFloat32) {
    out.data.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
    return out;
  }
  out.data.resize(values.size() * 2);
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t h = dtype == Precision::kBFloat16 ? FloatToBf16(values[i]) : FloatToHalf(values[i]);
    std::memcpy(&out.data[2 * i], &h, 2);
  }
  return out;
}

DeviceMemoryStats FakeEngine::memory() const {
  DeviceMemoryStats s;
  s.allocated = 1000;
  s.peak_allocated = 2000;
  s.reserved = 3000;
  s.total = 4000;
  return s;
}

std::shared_ptr<const Embedding> FakeEngine::MakeEmbedding(size_t bytes, uint64_t content,
                                                           bool on_host) {
  return Wrap(ImageGeometry{64, 48, 1024, 768}, content, bytes, on_host);
}

uint64_t FakeEngine::ContentOf(const Embedding& e) { return Payload(e).content; }

}  // namespace maskd::fake
