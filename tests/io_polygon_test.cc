// Mask polygons: the tracer's outlines rasterise back to the exact mask (holes, several objects,
// objects touching the image border, 1-pixel features, diagonal contacts, random masks), hole/parent
// structure, Douglas-Peucker against hand-computed cases, and COCO keyhole lists rasterised by the
// even-odd rule.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "model/io/polygon.h"

namespace maskd {
namespace {

// A mask from rows of '#' (inside) and '.' (outside).
struct Art {
  std::vector<uint8_t> mask;
  int w = 0, h = 0;
};
Art FromArt(const std::vector<std::string>& rows) {
  Art a;
  a.h = static_cast<int>(rows.size());
  a.w = static_cast<int>(rows[0].size());
  for (const std::string& r : rows)
    for (char c : r) a.mask.push_back(c == '#' ? 1 : 0);
  return a;
}

double IoU(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  size_t inter = 0, uni = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    inter += (a[i] && b[i]);
    uni += (a[i] || b[i]);
  }
  return uni == 0 ? 1.0 : static_cast<double>(inter) / uni;
}

// Brute-force 8-connected labels (0 outside), the definition the tracer's objects must match.
std::vector<int> Labels8(const std::vector<uint8_t>& m, int w, int h, int* count) {
  std::vector<int> label(m.size(), 0);
  int next = 0;
  for (int i = 0; i < w * h; ++i) {
    if (!m[i] || label[i]) continue;
    label[i] = ++next;
    std::vector<int> stack = {i};
    while (!stack.empty()) {
      const int p = stack.back();
      stack.pop_back();
      for (int dy = -1; dy <= 1; ++dy)
        for (int dx = -1; dx <= 1; ++dx) {
          const int x = p % w + dx, y = p / w + dy;
          if (x < 0 || y < 0 || x >= w || y >= h || !m[y * w + x] || label[y * w + x]) continue;
          label[y * w + x] = next;
          stack.push_back(y * w + x);
        }
    }
  }
  *count = next;
  return label;
}

int CountHoles(const std::vector<Contour>& cs) {
  int n = 0;
  for (const Contour& c : cs) n += c.hole;
  return n;
}

TEST(IoPolygon, SinglePixelIsAUnitSquareClockwise) {
  Art a = FromArt({"...", ".#.", "..."});
  std::vector<Contour> cs = TraceContours(a.mask.data(), a.w, a.h);
  ASSERT_EQ(cs.size(), 1u);
  EXPECT_FALSE(cs[0].hole);
  EXPECT_EQ(cs[0].parent, -1);
  EXPECT_EQ(cs[0].xy, (std::vector<int32_t>{1, 1, 2, 1, 2, 2, 1, 2}));
}

TEST(IoPolygon, EmptyAndFullMasks) {
  std::vector<uint8_t> empty(12, 0), full(12, 1);
  EXPECT_TRUE(TraceContours(empty.data(), 4, 3).empty());
  std::vector<Contour> cs = TraceContours(full.data(), 4, 3);
  ASSERT_EQ(cs.size(), 1u);  // touching all four borders
  EXPECT_EQ(cs[0].xy, (std::vector<int32_t>{0, 0, 4, 0, 4, 3, 0, 3}));
  EXPECT_EQ(RasterisePolygons(cs, 4, 3), full);
}

TEST(IoPolygon, HoleHasItsObjectAsParent) {
  Art a = FromArt({
      "#####.",
      "#...#.",
      "#.#.#.",
      "#...#.",
      "#####.",
      "......",
  });
  std::vector<Contour> cs = TraceContours(a.mask.data(), a.w, a.h);
  // The ring (met in row 0), the island inside the hole (a separate object, row 2) and the hole
  // (whose first east edge is the ring's inner bottom side, row 4), anticlockwise.
  ASSERT_EQ(cs.size(), 3u);
  EXPECT_FALSE(cs[0].hole);
  EXPECT_EQ(cs[0].xy, (std::vector<int32_t>{0, 0, 5, 0, 5, 5, 0, 5}));
  EXPECT_FALSE(cs[1].hole);
  EXPECT_EQ(cs[1].xy, (std::vector<int32_t>{2, 2, 3, 2, 3, 3, 2, 3}));
  EXPECT_TRUE(cs[2].hole);
  EXPECT_EQ(cs[2].parent, 0);
  EXPECT_EQ(cs[2].xy, (std::vector<int32_t>{1, 4, 4, 4, 4, 1, 1, 1}));
  EXPECT_EQ(RasterisePolygons(cs, a.w, a.h), a.mask);
}

TEST(IoPolygon, DiagonalNeighboursAreOneObject) {
  // 8-connectivity: the two pixels touching at a corner are one object with one outline; the
  // outside around them stays one 4-connected region (no hole).
  Art a = FromArt({"#.", ".#"});
  std::vector<Contour> cs = TraceContours(a.mask.data(), a.w, a.h);
  ASSERT_EQ(cs.size(), 1u);
  EXPECT_FALSE(cs[0].hole);
  EXPECT_EQ(cs[0].xy.size(), 16u);  // two unit squares joined at the saddle corner (1, 1), visited twice
  EXPECT_EQ(RasterisePolygons(cs, a.w, a.h), a.mask);

  // The diamond: four pixels joined at their corners are one object, and the outside pixel they
  // surround has no 4-connected path to the border, so it is a hole of that object.
  Art d = FromArt({".#.", "#.#", ".#."});
  std::vector<Contour> ds = TraceContours(d.mask.data(), d.w, d.h);
  EXPECT_EQ(CountHoles(ds), 1);
  EXPECT_EQ(ds.size(), 2u);
  EXPECT_EQ(RasterisePolygons(ds, d.w, d.h), d.mask);
}

TEST(IoPolygon, ThinFeaturesAndBordersRoundTripExactly) {
  Art a = FromArt({
      "#.........#",
      "#.######..#",
      "#.#....#...",
      "..#.##.#.#.",
      "..#....#...",
      "..######..#",
      "#.........#",
      "######.#.#.",
  });
  std::vector<Contour> cs = TraceContours(a.mask.data(), a.w, a.h);
  EXPECT_EQ(RasterisePolygons(cs, a.w, a.h), a.mask);
  EXPECT_GE(CountHoles(cs), 1);
  for (const Contour& c : cs) {
    if (c.hole) {
      ASSERT_GE(c.parent, 0);
      EXPECT_FALSE(cs[c.parent].hole);
    }
  }
}

TEST(IoPolygon, RandomMasksRoundTripExactly) {
  std::mt19937 rng(15);
  for (int trial = 0; trial < 200; ++trial) {
    const int w = 1 + rng() % 40, h = 1 + rng() % 40;
    std::bernoulli_distribution on(0.2 + 0.6 * (trial % 5) / 4.0);
    std::vector<uint8_t> m(static_cast<size_t>(w) * h);
    for (auto& v : m) v = on(rng);
    std::vector<Contour> cs = TraceContours(m.data(), w, h);
    ASSERT_EQ(RasterisePolygons(cs, w, h), m) << "trial " << trial << " " << w << "x" << h;
    // One outer contour per 8-connected object, and every hole names the outer contour of the object
    // it lies in (each contour starts at the top-left corner of an inside pixel of its object).
    int objects = 0;
    const std::vector<int> label = Labels8(m, w, h, &objects);
    ASSERT_EQ(static_cast<int>(cs.size()) - CountHoles(cs), objects) << "trial " << trial;
    for (const Contour& c : cs) {
      if (!c.hole) continue;
      ASSERT_GE(c.parent, 0);
      const Contour& outer = cs[c.parent];
      ASSERT_FALSE(outer.hole);
      EXPECT_EQ(label[c.xy[1] * w + c.xy[0]], label[outer.xy[1] * w + outer.xy[0]]) << "trial " << trial;
    }
    // Tolerance 0 only drops collinear vertices: the shape is unchanged.
    std::vector<Contour> simple = MaskToPolygons(m.data(), w, h, 0.0);
    ASSERT_EQ(RasterisePolygons(simple, w, h), m) << "trial " << trial;
    // The COCO keyhole lists keep the holes under an even-odd fill.
    std::vector<Contour> coco;
    for (const auto& list : CocoPolygons(cs)) {
      Contour c;
      c.xy.assign(list.begin(), list.end());
      coco.push_back(std::move(c));
    }
    ASSERT_EQ(RasterisePolygons(coco, w, h), m) << "trial " << trial;
  }
}

TEST(IoPolygon, DouglasPeuckerKeepsVerticesFartherThanTheTolerance) {
  // A 10 x 10 square with a bump of height 1 in the middle of its top side.
  std::vector<int32_t> bump = {0, 0, 4, 0, 4, -1, 6, -1, 6, 0, 10, 0, 10, 10, 0, 10};
  EXPECT_EQ(SimplifyClosed(bump, 0.0), bump);
  EXPECT_EQ(SimplifyClosed(bump, 0.5), bump);
  // (4, -1) is 1 from the chord (0,0)-(10,0) and stays; then (4, 0) is 0.97 from (0,0)-(4,-1) and
  // (6, -1) 0.33 from (4,-1)-(10,0): both go.
  EXPECT_EQ(SimplifyClosed(bump, 0.99), (std::vector<int32_t>{0, 0, 4, -1, 10, 0, 10, 10, 0, 10}));
  EXPECT_EQ(SimplifyClosed(bump, 1.0), (std::vector<int32_t>{0, 0, 10, 0, 10, 10, 0, 10}));
  // Collinear vertices go at tolerance 0.
  EXPECT_EQ(SimplifyClosed({0, 0, 5, 0, 10, 0, 10, 10, 0, 10}, 0.0),
            (std::vector<int32_t>{0, 0, 10, 0, 10, 10, 0, 10}));
  // A sliver thinner than the tolerance collapses.
  EXPECT_TRUE(SimplifyClosed({0, 0, 10, 0, 10, 1, 0, 1}, 2.0).empty());
}

TEST(IoPolygon, SimplifiedDiscStaysCloseAndSmall) {
  const int w = 200, h = 150;
  std::vector<uint8_t> m(static_cast<size_t>(w) * h, 0);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      const double dx = x + 0.5 - 100, dy = y + 0.5 - 75;
      const double r2 = dx * dx + dy * dy;
      m[y * w + x] = (r2 < 60 * 60 && r2 > 20 * 20) ? 1 : 0;  // an annulus: one hole
    }
  std::vector<Contour> exact = MaskToPolygons(m.data(), w, h, 0.0);
  std::vector<Contour> simple = MaskToPolygons(m.data(), w, h, 1.0);
  ASSERT_EQ(exact.size(), 2u);
  ASSERT_EQ(simple.size(), 2u);
  EXPECT_TRUE(simple[1].hole);
  EXPECT_EQ(simple[1].parent, 0);
  EXPECT_EQ(RasterisePolygons(exact, w, h), m);
  EXPECT_LT(simple[0].xy.size(), exact[0].xy.size() / 3);
  EXPECT_GT(IoU(RasterisePolygons(simple, w, h), m), 0.97);
}

TEST(IoPolygon, CollapsedObjectTakesItsHolesAlong) {
  // A 1-pixel-wide ring around a 1-pixel hole: at tolerance 2 the ring collapses, and so must its hole.
  Art a = FromArt({"###", "#.#", "###"});
  std::vector<Contour> exact = MaskToPolygons(a.mask.data(), a.w, a.h, 0.0);
  ASSERT_EQ(exact.size(), 2u);
  std::vector<Contour> coarse = MaskToPolygons(a.mask.data(), a.w, a.h, 5.0);
  for (const Contour& c : coarse) {
    if (c.hole) {
      ASSERT_GE(c.parent, 0);
      ASSERT_LT(c.parent, static_cast<int>(coarse.size()));
    }
  }
}

}  // namespace
}  // namespace maskd
