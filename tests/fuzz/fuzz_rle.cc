// COCO RLE (model/io/rle.h) under libFuzzer. Two halves, picked by the first byte:
// - the input as a counts string (what a client sends back as a mask or reads from a response):
//   RleCountsFromString must never crash, and what it accepts must survive a round trip through
//   RleCountsToString; RleDecode at any size must agree with RleArea when it succeeds;
// - the input as a mask: encode, stringify, parse and decode must give the same 0/1 mask back.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "model/io/rle.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

void FuzzCountsString(std::string_view text, uint16_t width, uint16_t height) {
  maskd::StatusOr<std::vector<uint32_t>> counts = maskd::RleCountsFromString(text);
  if (!counts.ok()) return;
  const std::string again = maskd::RleCountsToString(*counts);
  maskd::StatusOr<std::vector<uint32_t>> back = maskd::RleCountsFromString(again);
  FUZZ_CHECK(back.ok() && *back == *counts, "counts do not survive RleCountsToString: %s",
             back.ok() ? "different counts" : back.status().message().c_str());
  // The size is the fuzzer's, so most decodes fail the sum check; those that pass are checked.
  maskd::StatusOr<std::vector<uint8_t>> mask = maskd::RleDecode(*counts, width, height);
  if (!mask.ok()) return;
  uint64_t ones = 0;
  for (uint8_t v : *mask) ones += v;
  FUZZ_CHECK(mask->size() == size_t{width} * height, "decoded %zu bytes for %ux%u", mask->size(),
             width, height);
  FUZZ_CHECK(ones == maskd::RleArea(*counts), "area %llu vs %llu",
             static_cast<unsigned long long>(ones),
             static_cast<unsigned long long>(maskd::RleArea(*counts)));
}

void FuzzMask(const uint8_t* data, size_t size, uint8_t width_byte) {
  if (size == 0) return;
  const int width = 1 + width_byte % 64;
  const int height = static_cast<int>(size / width);
  if (height == 0) return;
  std::vector<uint32_t> counts = maskd::RleEncode(data, width, height);
  const std::string text = maskd::RleCountsToString(counts);
  maskd::StatusOr<std::vector<uint32_t>> parsed = maskd::RleCountsFromString(text);
  FUZZ_CHECK(parsed.ok() && *parsed == counts, "own counts string \"%s\" does not parse back",
             text.c_str());
  maskd::StatusOr<std::vector<uint8_t>> mask = maskd::RleDecode(counts, width, height);
  FUZZ_CHECK(mask.ok(), "own counts do not decode: %s", mask.status().message().c_str());
  for (size_t i = 0; i < mask->size(); ++i) {
    FUZZ_CHECK((*mask)[i] == (data[i] != 0 ? 1 : 0), "pixel %zu differs after a round trip", i);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const uint8_t mode = data[0];
  if (mode & 1) {
    const uint16_t width = data[1] % 128, height = data[2] % 128;
    FuzzCountsString(std::string_view(reinterpret_cast<const char*>(data + 3), size - 3), width,
                     height);
  } else {
    FuzzMask(data + 2, size - 2, data[1]);
  }
  return 0;
}
