// COCO run-length encoding of binary masks, as used by the COCO dataset's JSON files and read by
// pycocotools.mask.decode({"size": [h, w], "counts": counts}).
//
// Reimplemented from the documented format:
// - Runs are counted over the mask in COLUMN-MAJOR order (down the first column, then the next), and
//   the first run counts zeros (it is 0 when the first pixel is set). Counts sum to width * height.
// - The compressed string stores each count as a signed value in groups of 5 bits, least significant
//   group first; each group becomes one character (value + 48), bit 0x20 of a group says "more groups
//   follow" and bit 0x10 of the last group is the sign. From the fourth count on (index > 2) the value
//   stored is the difference to the count two places back (the previous run of the same colour),
//   which keeps the string short for smooth shapes.
//
// Torch-free; used by the server (responses), the clients and the tests.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/api/status.h"

namespace maskd {

// Runs of a row-major mask of width x height bytes (nonzero = inside).
std::vector<uint32_t> RleEncode(const uint8_t* mask, int width, int height);

// COCO's compressed counts string of `counts`.
std::string RleCountsToString(const std::vector<uint32_t>& counts);

// Inverse of RleCountsToString. INVALID_ARGUMENT for characters outside the alphabet, a string that
// ends inside a count, or a count that becomes negative.
StatusOr<std::vector<uint32_t>> RleCountsFromString(std::string_view counts);

// Row-major 0/1 mask of width x height from runs; INVALID_ARGUMENT unless the runs sum to
// width * height.
StatusOr<std::vector<uint8_t>> RleDecode(const std::vector<uint32_t>& counts, int width, int height);

// Pixels inside the mask (the sum of the odd-indexed runs).
uint64_t RleArea(const std::vector<uint32_t>& counts);

}  // namespace maskd
