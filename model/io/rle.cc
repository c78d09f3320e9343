#include "model/io/rle.h"

#include <string>

namespace maskd {
namespace {

// The alphabet starts at '0' so that the string is printable JSON without escapes.
constexpr int kCharOffset = 48;
constexpr int kGroupBits = 5;
constexpr int kGroupMask = 0x1f;
constexpr int kMoreBit = 0x20;
constexpr int kSignBit = 0x10;

}  // namespace

std::vector<uint32_t> RleEncode(const uint8_t* mask, int width, int height) {
  std::vector<uint32_t> counts;
  if (width <= 0 || height <= 0) return {0};
  uint8_t current = 0;
  uint32_t run = 0;
  for (int x = 0; x < width; ++x) {
    const uint8_t* column = mask + x;
    for (int y = 0; y < height; ++y) {
      const uint8_t v = column[static_cast<size_t>(y) * width] != 0 ? 1 : 0;
      if (v != current) {
        counts.push_back(run);
        run = 0;
        current = v;
      }
      ++run;
    }
  }
  counts.push_back(run);
  return counts;
}

std::string RleCountsToString(const std::vector<uint32_t>& counts) {
  std::string out;
  out.reserve(counts.size() * 2);
  for (size_t i = 0; i < counts.size(); ++i) {
    int64_t x = counts[i];
    if (i > 2) x -= static_cast<int64_t>(counts[i - 2]);
    bool more = true;
    while (more) {
      int c = static_cast<int>(x & kGroupMask);
      x >>= kGroupBits;  // arithmetic shift: negative values converge to -1
      more = (c & kSignBit) ? x != -1 : x != 0;
      if (more) c |= kMoreBit;
      out.push_back(static_cast<char>(c + kCharOffset));
    }
  }
  return out;
}

StatusOr<std::vector<uint32_t>> RleCountsFromString(std::string_view s) {
  std::vector<uint32_t> counts;
  size_t p = 0;
  while (p < s.size()) {
    int64_t x = 0;
    int k = 0;
    bool more = true;
    while (more) {
      if (p >= s.size()) {
        return InvalidArgument("RLE counts string ends inside a count at offset " +
                               std::to_string(p) + " (expected a character without the 0x20 "
                               "continuation bit to end it)");
      }
      const int c = static_cast<unsigned char>(s[p]) - kCharOffset;
      if (c < 0 || c > (kGroupMask | kMoreBit)) {
        return InvalidArgument("RLE counts string has character '" + std::string(1, s[p]) +
                               "' at offset " + std::to_string(p) +
                               " (expected characters '0' .. 'o')");
      }
      if (k >= 12) {
        return InvalidArgument("RLE counts string has a count longer than 12 characters at offset " +
                               std::to_string(p));
      }
      x |= static_cast<int64_t>(c & kGroupMask) << (kGroupBits * k);
      more = (c & kMoreBit) != 0;
      ++p;
      ++k;
      if (!more && (c & kSignBit)) x |= static_cast<int64_t>(-1) * (int64_t{1} << (kGroupBits * k));
    }
    const size_t m = counts.size();
    if (m > 2) x += static_cast<int64_t>(counts[m - 2]);
    if (x < 0 || x > static_cast<int64_t>(UINT32_MAX)) {
      return InvalidArgument("RLE counts string decodes to count " + std::to_string(x) + " at index " +
                             std::to_string(m) + " (expected 0 .. 4294967295)");
    }
    counts.push_back(static_cast<uint32_t>(x));
  }
  return counts;
}

StatusOr<std::vector<uint8_t>> RleDecode(const std::vector<uint32_t>& counts, int width, int height) {
  if (width < 0 || height < 0) {
    return InvalidArgument("RLE size " + std::to_string(width) + " x " + std::to_string(height) +
                           " is negative");
  }
  const uint64_t total = static_cast<uint64_t>(width) * static_cast<uint64_t>(height);
  uint64_t sum = 0;
  for (uint32_t c : counts) sum += c;
  if (sum != total) {
    return InvalidArgument("RLE runs sum to " + std::to_string(sum) + " pixels (expected width " +
                           std::to_string(width) + " x height " + std::to_string(height) + " = " +
                           std::to_string(total) + ")");
  }
  std::vector<uint8_t> mask(total, 0);
  uint64_t pos = 0;  // column-major position
  for (size_t i = 0; i < counts.size(); ++i) {
    const uint64_t end = pos + counts[i];
    if (i % 2 == 1) {
      for (uint64_t q = pos; q < end; ++q) {
        const uint64_t x = q / static_cast<uint64_t>(height);
        const uint64_t y = q % static_cast<uint64_t>(height);
        mask[y * static_cast<uint64_t>(width) + x] = 1;
      }
    }
    pos = end;
  }
  return mask;
}

uint64_t RleArea(const std::vector<uint32_t>& counts) {
  uint64_t area = 0;
  for (size_t i = 1; i < counts.size(); i += 2) area += counts[i];
  return area;
}

}  // namespace maskd
