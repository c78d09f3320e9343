// What maskload sends: seeded synthetic images, the WORKLOAD.md prompt distribution, Poisson
// arrivals. Everything here is deterministic in its seed: it uses only std::mt19937_64's raw output,
// whose sequence the C++ standard fixes, never std::*_distribution, whose algorithms are
// implementation-defined (images also use libm's sin/cos/log, so another libm may move a few pixels).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "model/api/image.h"

namespace maskd::load {

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  uint64_t Next() { return engine_(); }
  // Uniform in [0, 1) with 53 random bits.
  double Uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  // Uniform integer in [lo, hi] (inclusive), unbiased (rejection sampling).
  int64_t UniformInt(int64_t lo, int64_t hi);
  // Exponential with the given mean (inverse transform).
  double Exponential(double mean);

 private:
  std::mt19937_64 engine_;
};

// Derives independent, reproducible seeds for (seed, stream, index) triples (SplitMix64 mixing).
uint64_t MixSeed(uint64_t seed, uint64_t stream, uint64_t index = 0);

// Open-loop arrivals at `rate` per second: successive inter-arrival gaps, exponential with mean
// 1/rate, so that the arrival count in any interval is Poisson.
class PoissonArrivals {
 public:
  PoissonArrivals(double rate_per_s, uint64_t seed) : mean_gap_s_(1.0 / rate_per_s), rng_(seed) {}
  double NextGapSeconds() { return rng_.Exponential(mean_gap_s_); }

 private:
  double mean_gap_s_;
  Rng rng_;
};

// A picture with structure for the encoder to look at (compresses like a photo, not like noise): a
// smooth two-colour gradient with a soft vignette, then 6..14 random filled shapes (discs, ellipses,
// rectangles, triangles), each with its own shading gradient, drawn back to front.
ImageRGB8 GenerateImage(uint64_t seed, int width, int height);

struct PointPrompt {
  float x = 0, y = 0;
};

// WORKLOAD.md: P ~ U{min_prompts .. max_prompts} prompts of one foreground point each, uniform over
// the image's pixel centres.
std::vector<PointPrompt> GeneratePointPrompts(uint64_t seed, int width, int height, int min_prompts,
                                              int max_prompts);

// The same JPEG with a COM (comment) segment holding `nonce` right after SOI: a valid file that
// decodes to the same pixels, but different bytes, so the server's content-addressed cache cannot
// serve it. INVALID_ARGUMENT-like empty string when `jpeg` does not start with SOI.
std::string JpegWithNonce(const std::string& jpeg, uint64_t nonce);

}  // namespace maskd::load
