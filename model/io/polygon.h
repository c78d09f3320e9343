// Binary masks as polygons: outer contours and holes, simplified with Douglas-Peucker, and COCO's
// `segmentation` lists.
//
// Vertices lie on the PIXEL-CORNER grid: pixel (x, y) is the unit square [x, x+1] x [y, y+1], so a
// polygon that follows the boundary between inside and outside pixels encloses exactly the inside
// pixels. This is the convention pycocotools' frPyObjects rasterises (a polygon [1,1, 2,1, 2,2, 1,2]
// sets pixel (1, 1) only), and the one that keeps a 1-pixel feature a polygon of non-zero area (a
// tracer through pixel centres, like OpenCV's findContours, turns a 1-pixel line into a zero-area
// polygon that rasterises to nothing).
//
// Connectivity: inside pixels are 8-connected (diagonal neighbours belong to one object, as in
// Suzuki-Abe's border following and OpenCV's findContours), so outside pixels are 4-connected: a
// hole is a 4-connected region of outside pixels that does not reach the image border.
//
// Torch-free; used by the server (OUTPUT_FORMAT_POLYGONS), the client's COCO export and the tests.
#pragma once

#include <cstdint>
#include <vector>

namespace maskd {

// One closed polygon. `xy` is [x0, y0, x1, y1, ...] without repeating the first vertex; every vertex
// is a corner of the outline (consecutive vertices differ in direction), integral pixel-corner
// coordinates. Outer contours run clockwise on screen (x right, y down: positive shoelace area), holes
// anticlockwise.
struct Contour {
  std::vector<int32_t> xy;
  bool hole = false;
  // For a hole: the index (in the same list) of the outer contour of the object it lies in; -1 for an
  // outer contour.
  int parent = -1;
};

// Outer contours and holes of a row-major width x height mask (nonzero = inside), unsimplified. Order:
// contours appear as their first edge is met in a row-major scan of pixel top edges (so an object's
// outer contour comes before its holes). An empty mask gives an empty list.
std::vector<Contour> TraceContours(const uint8_t* mask, int width, int height);

// Douglas-Peucker simplification of the closed polygon `xy`: the result keeps a subset of the
// vertices such that every dropped vertex lies within `tolerance` pixels of the segment that replaced
// it. tolerance 0 drops only collinear vertices. A polygon that collapses to fewer than 3 vertices
// (a feature thinner than the tolerance) comes back empty.
std::vector<int32_t> SimplifyClosed(const std::vector<int32_t>& xy, double tolerance);

// TraceContours, then SimplifyClosed on each contour with `tolerance`; contours that collapse are
// dropped together with their holes (indices and parents are renumbered).
std::vector<Contour> MaskToPolygons(const uint8_t* mask, int width, int height, double tolerance);

// Row-major 0/1 mask of width x height: a pixel is inside when its centre (x + 0.5, y + 0.5) is
// inside an odd number of the contours (even-odd rule, so holes cut out of their outer contour).
// Exact inverse of TraceContours; with simplification, the rasterised shape of the polygons.
std::vector<uint8_t> RasterisePolygons(const std::vector<Contour>& contours, int width, int height);

// COCO `segmentation` polygon lists ([[x1, y1, x2, y2, ...], ...]) for `contours`: one list per outer
// contour. COCO's polygon form has no holes (pycocotools unites an annotation's polygons), so each
// hole is joined to its outer contour by a zero-width bridge that is walked out and back: the list is
// the outer loop, then for each hole the hole's loop starting and ending at its first vertex, then
// the outer's first vertex again. The two passes over a bridge cancel under an even-odd fill (which
// pycocotools' rasteriser is), so the holes stay open.
std::vector<std::vector<double>> CocoPolygons(const std::vector<Contour>& contours);

}  // namespace maskd
