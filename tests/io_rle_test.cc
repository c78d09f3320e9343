// COCO RLE: runs against a brute-force encoder, the compressed string against strings produced by
// pycocotools (the reference implementation) for fixed masks, and round trips on random masks.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "model/io/rle.h"

namespace maskd {
namespace {

// The definition, spelled out: walk pixels in column-major order and record the length of every
// maximal run, starting with the (possibly empty) run of zeros.
std::vector<uint32_t> BruteForceRuns(const std::vector<uint8_t>& mask, int w, int h) {
  std::vector<uint8_t> col_major;
  for (int x = 0; x < w; ++x)
    for (int y = 0; y < h; ++y) col_major.push_back(mask[y * w + x] ? 1 : 0);
  std::vector<uint32_t> runs;
  uint8_t colour = 0;
  size_t i = 0;
  while (i < col_major.size()) {
    uint32_t n = 0;
    while (i < col_major.size() && col_major[i] == colour) {
      ++n;
      ++i;
    }
    runs.push_back(n);
    colour ^= 1;
  }
  if (runs.empty()) runs.push_back(0);
  return runs;
}

std::vector<uint8_t> RandomMask(std::mt19937& rng, int w, int h, double p_flip) {
  std::bernoulli_distribution flip(p_flip);
  std::vector<uint8_t> m(static_cast<size_t>(w) * h);
  uint8_t v = rng() & 1;
  for (auto& px : m) {
    if (flip(rng)) v ^= 1;
    px = v;
  }
  return m;
}

TEST(ServerRle, MatchesBruteForceOnRandomMasks) {
  std::mt19937 rng(42);
  for (int trial = 0; trial < 200; ++trial) {
    const int w = 1 + rng() % 40, h = 1 + rng() % 40;
    const double p = (trial % 4 == 0) ? 0.5 : 0.02;
    auto m = RandomMask(rng, w, h, p);
    EXPECT_EQ(RleEncode(m.data(), w, h), BruteForceRuns(m, w, h)) << w << "x" << h;
  }
}

TEST(ServerRle, FirstRunCountsZerosAndIsEmptyWhenFirstPixelSet) {
  std::vector<uint8_t> m = {1, 0, 0, 0};  // 2 x 2, top-left set
  auto runs = RleEncode(m.data(), 2, 2);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0], 0u);
  EXPECT_EQ(runs[1], 1u);
  EXPECT_EQ(runs[2], 3u);
  std::vector<uint8_t> empty(6, 0);
  EXPECT_EQ(RleEncode(empty.data(), 3, 2), std::vector<uint32_t>{6});
  std::vector<uint8_t> full(6, 255);
  EXPECT_EQ(RleEncode(full.data(), 3, 2), (std::vector<uint32_t>{0, 6}));
}

TEST(ServerRle, ColumnMajorOrder) {
  // 3 wide, 2 high; row-major [[1,1,0],[0,0,0]]: column-major is 1,0 | 1,0 | 0,0.
  std::vector<uint8_t> m = {1, 1, 0, 0, 0, 0};
  EXPECT_EQ(RleEncode(m.data(), 3, 2), (std::vector<uint32_t>{0, 1, 1, 1, 3}));
}

// Strings from pycocotools.mask.encode(np.asfortranarray(m)) for the masks below.
TEST(ServerRle, StringMatchesPycocotools) {
  {
    // 4 wide, 3 high.
    std::vector<uint8_t> m(12, 0);
    m[0 * 4 + 0] = 1;
    m[1 * 4 + 2] = 1;
    m[2 * 4 + 3] = 1;
    EXPECT_EQ(RleCountsToString(RleEncode(m.data(), 4, 3)), "0160M0");
  }
  {
    // 5 wide, 7 high.
    const std::vector<std::vector<uint8_t>> rows = {{1, 1, 1, 0, 0}, {1, 0, 1, 1, 0}, {0, 0, 0, 0, 1},
                                                    {1, 1, 1, 1, 1}, {0, 0, 1, 0, 0}, {1, 0, 1, 1, 1},
                                                    {0, 0, 0, 0, 1}};
    std::vector<uint8_t> m;
    for (const auto& r : rows) m.insert(m.end(), r.begin(), r.end());
    EXPECT_EQ(RleCountsToString(RleEncode(m.data(), 5, 7)), "021O00001011N11NO00021N0");
  }
  // Large counts and negative deltas (pycocotools.mask.frPyObjects of uncompressed counts).
  EXPECT_EQ(RleCountsToString({5, 100000, 3, 200000, 1, 699891}), "5PeQ33PeQ3NcUX?");
  auto back = RleCountsFromString("5PeQ33PeQ3NcUX?");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, (std::vector<uint32_t>{5, 100000, 3, 200000, 1, 699891}));
}

TEST(ServerRle, StringRoundTripRandomCounts) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<uint32_t> counts(1 + rng() % 30);
    for (auto& c : counts) {
      switch (rng() % 4) {
        case 0: c = 0; break;
        case 1: c = rng() % 32; break;
        case 2: c = rng() % 100000; break;
        default: c = rng() % 50'000'000; break;
      }
    }
    auto s = RleCountsToString(counts);
    for (char ch : s) ASSERT_TRUE(ch >= '0' && ch <= 'o') << s;
    auto back = RleCountsFromString(s);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, counts);
  }
}

TEST(ServerRle, DecodeRoundTrip) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 100; ++trial) {
    const int w = 1 + rng() % 64, h = 1 + rng() % 64;
    auto m = RandomMask(rng, w, h, 0.05);
    auto runs = RleEncode(m.data(), w, h);
    auto decoded = RleDecode(runs, w, h);
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ(*decoded, m);
    uint64_t area = 0;
    for (auto v : m) area += v;
    EXPECT_EQ(RleArea(runs), area);
    auto from_string = RleCountsFromString(RleCountsToString(runs));
    ASSERT_TRUE(from_string.ok());
    EXPECT_EQ(*from_string, runs);
  }
}

TEST(ServerRle, BadInputIsInvalidArgument) {
  auto bad_char = RleCountsFromString("01~");
  ASSERT_FALSE(bad_char.ok());
  EXPECT_EQ(bad_char.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_char.status().message().find("'~' at offset 2"), std::string::npos)
      << bad_char.status().message();

  // 'P' = 0x20 + 48: a continuation bit with nothing after it.
  auto truncated = RleCountsFromString("5P");
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.status().message().find("ends inside a count"), std::string::npos);

  auto wrong_sum = RleDecode({3, 2}, 2, 2);
  ASSERT_FALSE(wrong_sum.ok());
  EXPECT_NE(wrong_sum.status().message().find("sum to 5 pixels"), std::string::npos)
      << wrong_sum.status().message();

  // A delta that makes a count negative: 'N' is -2 relative to counts[1] = 1 at index 3.
  auto negative = RleCountsFromString("010N");
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("count -1"), std::string::npos)
      << negative.status().message();
}

}  // namespace
}  // namespace maskd
