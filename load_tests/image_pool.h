// The images maskload sends: generated (seeded, JPEG-encoded once up front) or read from a folder.
#pragma once

#include <string>
#include <vector>

#include "load_tests/load_runner.h"

namespace maskd::load {

// `count` images of width x height from GenerateImage(MixSeed(seed, image index)), JPEG at
// `quality`.
StatusOr<std::vector<ImageAsset>> GenerateImagePool(int count, int width, int height, uint64_t seed,
                                                    int quality = 90);

// Every .jpg/.jpeg/.png/.webp file of `dir` (sorted by name, at most `max_count`; 0 = all). Each is
// decoded once for its size. With `reencode_as_jpeg`, non-JPEG files are re-encoded as JPEG (the
// unique-bytes trick of LoadConfig::unique_images needs JPEG).
StatusOr<std::vector<ImageAsset>> LoadImageFolder(const std::string& dir, int max_count,
                                                  bool reencode_as_jpeg, int quality = 90);

}  // namespace maskd::load
