#include "load_tests/workload.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace maskd::load {

int64_t Rng::UniformInt(int64_t lo, int64_t hi) {
  const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
  if (span == 0) return static_cast<int64_t>(engine_());  // the whole 64-bit range
  // Reject the top partial block so that every value is equally likely.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % span;
  uint64_t r;
  do {
    r = engine_();
  } while (r >= limit);
  return lo + static_cast<int64_t>(r % span);
}

double Rng::Exponential(double mean) {
  // 1 - U is in (0, 1], so the log is finite.
  return -mean * std::log(1.0 - Uniform());
}

uint64_t MixSeed(uint64_t seed, uint64_t stream, uint64_t index) {
  auto mix = [](uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  return mix(mix(mix(seed) ^ stream) ^ index);
}

namespace {

using Rgb = std::array<float, 3>;

Rgb RandomColour(Rng& rng) {
  return {static_cast<float>(rng.Uniform(20, 235)), static_cast<float>(rng.Uniform(20, 235)),
          static_cast<float>(rng.Uniform(20, 235))};
}

enum class ShapeKind { kDisc, kEllipse, kRect, kTriangle };

struct Shape {
  ShapeKind kind;
  float cx, cy, rx, ry, cos_a, sin_a;
  std::array<float, 6> tri;  // triangle vertices
  Rgb colour;
  float shade_dx, shade_dy;  // brightness gradient across the shape, per pixel
};

float Cross(float ax, float ay, float bx, float by, float px, float py) {
  return (bx - ax) * (py - ay) - (by - ay) * (px - ax);
}

bool Inside(const Shape& s, float x, float y) {
  switch (s.kind) {
    case ShapeKind::kDisc:
    case ShapeKind::kEllipse: {
      const float c = s.cos_a, si = s.sin_a;
      const float dx = x - s.cx, dy = y - s.cy;
      const float u = (c * dx + si * dy) / s.rx, v = (-si * dx + c * dy) / s.ry;
      return u * u + v * v <= 1.0f;
    }
    case ShapeKind::kRect: {
      const float c = s.cos_a, si = s.sin_a;
      const float dx = x - s.cx, dy = y - s.cy;
      return std::abs(c * dx + si * dy) <= s.rx && std::abs(-si * dx + c * dy) <= s.ry;
    }
    case ShapeKind::kTriangle: {
      const auto& t = s.tri;
      const float d1 = Cross(t[0], t[1], t[2], t[3], x, y);
      const float d2 = Cross(t[2], t[3], t[4], t[5], x, y);
      const float d3 = Cross(t[4], t[5], t[0], t[1], x, y);
      const bool neg = d1 < 0 || d2 < 0 || d3 < 0, pos = d1 > 0 || d2 > 0 || d3 > 0;
      return !(neg && pos);
    }
  }
  return false;
}

}  // namespace

ImageRGB8 GenerateImage(uint64_t seed, int width, int height) {
  Rng rng(seed);
  ImageRGB8 im;
  im.width = width;
  im.height = height;
  im.pixels.resize(static_cast<size_t>(width) * height * 3);

  const Rgb a = RandomColour(rng), b = RandomColour(rng);
  const double theta = rng.Uniform(0, 2 * M_PI);
  const float gx = static_cast<float>(std::cos(theta)), gy = static_cast<float>(std::sin(theta));
  const float diag = std::sqrt(static_cast<float>(width) * width + static_cast<float>(height) * height);

  const int num_shapes = static_cast<int>(rng.UniformInt(6, 14));
  std::vector<Shape> shapes;
  const float scale = static_cast<float>(std::min(width, height));
  for (int i = 0; i < num_shapes; ++i) {
    Shape s{};
    s.kind = static_cast<ShapeKind>(rng.UniformInt(0, 3));
    s.cx = static_cast<float>(rng.Uniform(0, width));
    s.cy = static_cast<float>(rng.Uniform(0, height));
    s.rx = static_cast<float>(rng.Uniform(0.04, 0.22)) * scale;
    s.ry = s.kind == ShapeKind::kDisc ? s.rx : static_cast<float>(rng.Uniform(0.04, 0.22)) * scale;
    const double angle = rng.Uniform(0, M_PI);
    s.cos_a = static_cast<float>(std::cos(angle));
    s.sin_a = static_cast<float>(std::sin(angle));
    for (int k = 0; k < 3; ++k) {
      const double phi = rng.Uniform(0, 2 * M_PI);
      s.tri[2 * k] = s.cx + s.rx * 1.5f * static_cast<float>(std::cos(phi));
      s.tri[2 * k + 1] = s.cy + s.rx * 1.5f * static_cast<float>(std::sin(phi));
    }
    s.colour = RandomColour(rng);
    s.shade_dx = static_cast<float>(rng.Uniform(-0.3, 0.3));
    s.shade_dy = static_cast<float>(rng.Uniform(-0.3, 0.3));
    shapes.push_back(s);
  }

  const float cx = width / 2.0f, cy = height / 2.0f;
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const float px = x + 0.5f, py = y + 0.5f;
      const float t = std::clamp(0.5f + ((px - cx) * gx + (py - cy) * gy) / diag, 0.0f, 1.0f);
      const float r2 = ((px - cx) * (px - cx) + (py - cy) * (py - cy)) / (0.25f * diag * diag);
      const float vignette = 1.0f - 0.35f * r2;
      Rgb c{(a[0] + (b[0] - a[0]) * t) * vignette, (a[1] + (b[1] - a[1]) * t) * vignette,
            (a[2] + (b[2] - a[2]) * t) * vignette};
      // Later shapes are in front: the last one containing the pixel wins.
      for (auto it = shapes.rbegin(); it != shapes.rend(); ++it) {
        if (!Inside(*it, px, py)) continue;
        const float shade = (px - it->cx) * it->shade_dx + (py - it->cy) * it->shade_dy;
        c = {it->colour[0] + shade, it->colour[1] + shade, it->colour[2] + shade};
        break;
      }
      uint8_t* p = &im.pixels[(static_cast<size_t>(y) * width + x) * 3];
      for (int k = 0; k < 3; ++k) p[k] = static_cast<uint8_t>(std::clamp(std::lround(c[k]), 0L, 255L));
    }
  }
  return im;
}

std::vector<PointPrompt> GeneratePointPrompts(uint64_t seed, int width, int height, int min_prompts,
                                              int max_prompts) {
  Rng rng(seed);
  const int n = static_cast<int>(rng.UniformInt(min_prompts, max_prompts));
  std::vector<PointPrompt> prompts(n);
  for (PointPrompt& p : prompts) {
    p.x = static_cast<float>(rng.UniformInt(0, width - 1)) + 0.5f;
    p.y = static_cast<float>(rng.UniformInt(0, height - 1)) + 0.5f;
  }
  return prompts;
}

std::string JpegWithNonce(const std::string& jpeg, uint64_t nonce) {
  if (jpeg.size() < 2 || static_cast<uint8_t>(jpeg[0]) != 0xFF || static_cast<uint8_t>(jpeg[1]) != 0xD8) {
    return {};
  }
  // COM marker: FF FE, then a big-endian length that counts itself (2 bytes) and the payload.
  static constexpr char kTag[] = "maskload:";
  const size_t payload = sizeof(kTag) - 1 + 16;
  std::string out;
  out.reserve(jpeg.size() + 4 + payload);
  out.append(jpeg, 0, 2);
  out.push_back(static_cast<char>(0xFF));
  out.push_back(static_cast<char>(0xFE));
  out.push_back(static_cast<char>(((payload + 2) >> 8) & 0xFF));
  out.push_back(static_cast<char>((payload + 2) & 0xFF));
  out.append(kTag);
  static constexpr char kHex[] = "0123456789abcdef";
  for (int i = 15; i >= 0; --i) out.push_back(kHex[(nonce >> (4 * i)) & 0xF]);
  out.append(jpeg, 2, std::string::npos);
  return out;
}

}  // namespace maskd::load
