#include "model/io/polygon.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <utility>

namespace maskd {
namespace {

// Crack following: the outline is walked along pixel edges, with the inside pixel always on the
// right-hand side (clockwise on screen around an object). Directions, clockwise order so that
// (d + 1) % 4 is a right turn and (d + 3) % 4 a left turn.
enum Dir { kEast = 0, kSouth = 1, kWest = 2, kNorth = 3 };
constexpr int kDx[4] = {1, 0, -1, 0};
constexpr int kDy[4] = {0, 1, 0, -1};

class Tracer {
 public:
  Tracer(const uint8_t* mask, int width, int height)
      : mask_(mask), w_(width), h_(height), visited_(static_cast<size_t>(width + 1) * (height + 1), 0) {}

  bool In(int x, int y) const {
    return x >= 0 && y >= 0 && x < w_ && y < h_ && mask_[static_cast<size_t>(y) * w_ + x] != 0;
  }

  // The pixels right and left of the edge that leaves corner (x, y) in direction d.
  bool IsEdge(int x, int y, int d) const {
    switch (d) {
      case kEast: return In(x, y) && !In(x, y - 1);
      case kSouth: return In(x - 1, y) && !In(x, y);
      case kWest: return In(x - 1, y - 1) && !In(x - 1, y);
      default: return In(x, y - 1) && !In(x - 1, y - 1);  // kNorth
    }
  }

  bool Visited(int x, int y, int d) const { return visited_[Corner(x, y)] & (1u << d); }

  // Walks one closed outline from the east edge leaving corner (x0, y0) and returns its corners.
  std::vector<int32_t> Walk(int x0, int y0) {
    std::vector<int32_t> xy;
    int x = x0, y = y0, d = kEast;
    do {
      visited_[Corner(x, y)] |= static_cast<uint8_t>(1u << d);
      x += kDx[d];
      y += kDy[d];
      // At a saddle corner (two inside pixels touching diagonally) both a left and a right turn are
      // edges; taking the left turn walks on around the diagonal neighbour, which is what makes the
      // inside 8-connected. Elsewhere exactly one of the three is an edge.
      const int left = (d + 3) % 4, right = (d + 1) % 4;
      int next;
      if (IsEdge(x, y, left)) {
        next = left;
      } else if (IsEdge(x, y, d)) {
        next = d;
      } else {
        next = right;
      }
      if (next != d) {
        xy.push_back(x);
        xy.push_back(y);
      }
      d = next;
    } while (!(x == x0 && y == y0 && d == kEast));
    // The start corner was entered from the south or north (a turn onto east) and recorded last: move
    // it to the front so that the list starts where the walk did.
    std::rotate(xy.rbegin(), xy.rbegin() + 2, xy.rend());
    return xy;
  }

 private:
  size_t Corner(int x, int y) const { return static_cast<size_t>(y) * (w_ + 1) + x; }

  const uint8_t* mask_;
  int w_, h_;
  std::vector<uint8_t> visited_;  // per corner, bit d: the edge leaving it in direction d was walked
};

// 8-connected objects from the runs of inside pixels: a run joins every run of the row above that
// overlaps it or touches it diagonally (union-find over runs). Far cheaper than labelling pixels:
// the work grows with the number of runs, not with the area.
class RunLabels {
 public:
  RunLabels(const uint8_t* mask, int w, int h) : row_start_(static_cast<size_t>(h) + 1, 0) {
    for (int y = 0; y < h; ++y) {
      const uint8_t* row = mask + static_cast<size_t>(y) * w;
      row_start_[y] = runs_.size();
      for (int x = 0; x < w;) {
        if (!row[x]) {
          ++x;
          continue;
        }
        const int x0 = x;
        while (x < w && row[x]) ++x;
        runs_.push_back({x0, x});
      }
      row_start_[y + 1] = runs_.size();
    }
    parent_.resize(runs_.size());
    for (size_t i = 0; i < parent_.size(); ++i) parent_[i] = i;
    for (int y = 1; y < h; ++y) {
      size_t a = row_start_[y - 1];
      const size_t a_end = row_start_[y];
      for (size_t b = row_start_[y]; b < row_start_[y + 1]; ++b) {
        // Runs above that end left of this run's diagonal neighbour cannot touch it or a later one.
        while (a < a_end && runs_[a].x1 < runs_[b].x0) ++a;
        for (size_t k = a; k < a_end && runs_[k].x0 <= runs_[b].x1; ++k) Unite(k, b);
      }
    }
  }

  // The object of inside pixel (x, y).
  size_t ObjectOf(int x, int y) {
    const auto first = runs_.begin() + static_cast<std::ptrdiff_t>(row_start_[y]);
    const auto last = runs_.begin() + static_cast<std::ptrdiff_t>(row_start_[y + 1]);
    auto it = std::upper_bound(first, last, x, [](int v, const Run& r) { return v < r.x0; });
    return Find(static_cast<size_t>(it - runs_.begin()) - 1);
  }
  size_t objects_bound() const { return runs_.size(); }

 private:
  struct Run {
    int x0, x1;  // [x0, x1)
  };
  size_t Find(size_t i) {
    while (parent_[i] != i) i = parent_[i] = parent_[parent_[i]];
    return i;
  }
  void Unite(size_t a, size_t b) {
    a = Find(a);
    b = Find(b);
    if (a != b) parent_[std::max(a, b)] = std::min(a, b);
  }

  std::vector<Run> runs_;
  std::vector<size_t> row_start_;  // runs of row y: [row_start_[y], row_start_[y + 1])
  std::vector<size_t> parent_;
};

double SignedArea2(const std::vector<int32_t>& xy) {
  const size_t n = xy.size() / 2;
  double a = 0;
  for (size_t i = 0; i < n; ++i) {
    const size_t j = (i + 1) % n;
    a += static_cast<double>(xy[2 * i]) * xy[2 * j + 1] - static_cast<double>(xy[2 * j]) * xy[2 * i + 1];
  }
  return a;
}

// Distance from point p to the segment a-b (to a when a == b).
double SegmentDistance(double px, double py, double ax, double ay, double bx, double by) {
  const double dx = bx - ax, dy = by - ay;
  const double len2 = dx * dx + dy * dy;
  double t = len2 > 0 ? ((px - ax) * dx + (py - ay) * dy) / len2 : 0;
  t = std::clamp(t, 0.0, 1.0);
  const double ex = ax + t * dx - px, ey = ay + t * dy - py;
  return std::sqrt(ex * ex + ey * ey);
}

}  // namespace

std::vector<Contour> TraceContours(const uint8_t* mask, int width, int height) {
  std::vector<Contour> out;
  if (width <= 0 || height <= 0) return out;
  Tracer tracer(mask, width, height);
  RunLabels objects(mask, width, height);
  std::vector<int> outer_of(objects.objects_bound(), -1);  // object -> index of its outer contour
  for (int y = 0; y < height; ++y) {
    const uint8_t* row = mask + static_cast<size_t>(y) * width;
    const uint8_t* above = y > 0 ? row - width : nullptr;
    for (int x = 0; x < width; ++x) {
      // An east edge: inside pixel, outside (or the border) above it.
      if (!row[x] || (above && above[x]) || tracer.Visited(x, y, kEast)) continue;
      Contour c;
      c.xy = tracer.Walk(x, y);
      // An 8-connected object has one outer outline (clockwise, positive area); every other outline
      // around its pixels is a hole. The object is the one of the pixel right of the start edge.
      c.hole = SignedArea2(c.xy) < 0;
      const size_t object = objects.ObjectOf(x, y);
      if (!c.hole) {
        outer_of[object] = static_cast<int>(out.size());
      } else {
        // The scan meets an object's topmost row (its outer outline) before any of its holes.
        c.parent = outer_of[object];
      }
      out.push_back(std::move(c));
    }
  }
  return out;
}

std::vector<int32_t> SimplifyClosed(const std::vector<int32_t>& xy, double tolerance) {
  const size_t n = xy.size() / 2;
  auto X = [&](size_t i) { return static_cast<double>(xy[2 * (i % n)]); };
  auto Y = [&](size_t i) { return static_cast<double>(xy[2 * (i % n) + 1]); };
  if (n < 3) return {};
  // A closed polygon has no natural end points: split it at vertex 0 and the vertex farthest from it,
  // and simplify both open halves (indices past n wrap to vertex 0).
  size_t far = 0;
  double far_d = -1;
  for (size_t i = 1; i < n; ++i) {
    const double d = std::hypot(X(i) - X(0), Y(i) - Y(0));
    if (d > far_d) far_d = d, far = i;
  }
  std::vector<uint8_t> keep(n + 1, 0);
  keep[0] = keep[far] = keep[n] = 1;
  std::vector<std::pair<size_t, size_t>> stack = {{0, far}, {far, n}};
  while (!stack.empty()) {
    auto [a, b] = stack.back();
    stack.pop_back();
    double best = -1;
    size_t best_i = a;
    for (size_t i = a + 1; i < b; ++i) {
      const double d = SegmentDistance(X(i), Y(i), X(a), Y(a), X(b), Y(b));
      if (d > best) best = d, best_i = i;
    }
    // Strictly greater: with tolerance 0 a vertex on the segment (collinear) is dropped.
    if (best > tolerance) {
      keep[best_i] = 1;
      stack.emplace_back(a, best_i);
      stack.emplace_back(best_i, b);
    }
  }
  std::vector<int32_t> out;
  for (size_t i = 0; i < n; ++i) {
    if (keep[i]) {
      out.push_back(xy[2 * i]);
      out.push_back(xy[2 * i + 1]);
    }
  }
  if (out.size() < 6 || SignedArea2(out) == 0) return {};
  return out;
}

std::vector<Contour> MaskToPolygons(const uint8_t* mask, int width, int height, double tolerance) {
  std::vector<Contour> traced = TraceContours(mask, width, height);
  std::vector<Contour> out;
  std::vector<int> renumber(traced.size(), -1);
  for (size_t i = 0; i < traced.size(); ++i) {
    Contour& c = traced[i];
    if (c.hole && (c.parent < 0 || renumber[c.parent] < 0)) continue;  // its object collapsed
    std::vector<int32_t> simple = SimplifyClosed(c.xy, tolerance);
    if (simple.empty()) continue;
    Contour s;
    s.xy = std::move(simple);
    s.hole = c.hole;
    s.parent = c.hole ? renumber[c.parent] : -1;
    renumber[i] = static_cast<int>(out.size());
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<uint8_t> RasterisePolygons(const std::vector<Contour>& contours, int width, int height) {
  std::vector<uint8_t> mask(static_cast<size_t>(std::max(width, 0)) * std::max(height, 0), 0);
  std::vector<double> xs;
  for (int y = 0; y < height; ++y) {
    const double cy = y + 0.5;
    xs.clear();
    for (const Contour& c : contours) {
      const size_t n = c.xy.size() / 2;
      for (size_t i = 0; i < n; ++i) {
        const size_t j = (i + 1) % n;
        const double x0 = c.xy[2 * i], y0 = c.xy[2 * i + 1], x1 = c.xy[2 * j], y1 = c.xy[2 * j + 1];
        // Half-open in y so that a vertex on the scan line counts once; centres are at half
        // integers, so with integral vertices this never even happens.
        if ((y0 <= cy) == (y1 <= cy)) continue;
        xs.push_back(x0 + (cy - y0) * (x1 - x0) / (y1 - y0));
      }
    }
    std::sort(xs.begin(), xs.end());
    for (size_t k = 0; k + 1 < xs.size(); k += 2) {
      // Pixels whose centre x + 0.5 lies in [xs[k], xs[k+1]).
      const int from = std::max(0, static_cast<int>(std::ceil(xs[k] - 0.5)));
      const int to = std::min(width, static_cast<int>(std::ceil(xs[k + 1] - 0.5)));
      for (int x = from; x < to; ++x) mask[static_cast<size_t>(y) * width + x] = 1;
    }
  }
  return mask;
}

std::vector<std::vector<double>> CocoPolygons(const std::vector<Contour>& contours) {
  std::vector<std::vector<double>> out;
  std::vector<int> slot(contours.size(), -1);
  for (size_t i = 0; i < contours.size(); ++i) {
    if (contours[i].hole || contours[i].xy.size() < 6) continue;
    slot[i] = static_cast<int>(out.size());
    out.emplace_back(contours[i].xy.begin(), contours[i].xy.end());
  }
  for (const Contour& h : contours) {
    if (!h.hole || h.parent < 0 || slot[h.parent] < 0 || h.xy.size() < 6) continue;
    std::vector<double>& poly = out[slot[h.parent]];
    const double ox = contours[h.parent].xy[0], oy = contours[h.parent].xy[1];
    // poly ends at the outer loop's last vertex or at the previous hole's first vertex: step to the
    // outer's first vertex (closing the outer loop, or walking the previous bridge back), then over
    // the bridge into this hole and once around it. The list's implicit closing edge walks the last
    // bridge back.
    poly.push_back(ox);
    poly.push_back(oy);
    poly.insert(poly.end(), h.xy.begin(), h.xy.end());
    poly.push_back(h.xy[0]);
    poly.push_back(h.xy[1]);
  }
  return out;
}

}  // namespace maskd
