#include "model/api/mask_generation.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>

namespace maskd {

namespace {
// Points per side of layer i's generated grid (the original's int(n / scale**i)).
int LayerSide(int points_per_side, int factor, int layer) {
  return static_cast<int>(points_per_side / std::pow(static_cast<double>(factor), layer));
}
}  // namespace

Status ValidateMaskGenerationParams(const MaskGenerationParams& p, std::string_view prefix,
                                    const MaskGenerationLimits& lim) {
  const std::string f(prefix);
  auto bad = [&](const std::string& field, const std::string& m) {
    return InvalidArgument(f + "." + field + " " + m);
  };
  auto unit = [&](const std::string& field, double v) -> Status {
    if (!std::isfinite(v) || v < 0 || v > 1) return bad(field, "= " + FormatNumber(v) + " must be in [0, 1]");
    return Status::Ok();
  };
  if (p.crop_n_layers < 0 || p.crop_n_layers > lim.max_crop_n_layers)
    return bad("crop_n_layers", "= " + std::to_string(p.crop_n_layers) + " must be in [0, " +
                                    std::to_string(lim.max_crop_n_layers) + "]");
  if (p.crop_n_points_downscale_factor < 1 ||
      p.crop_n_points_downscale_factor > lim.max_crop_n_points_downscale_factor)
    return bad("crop_n_points_downscale_factor",
               "= " + std::to_string(p.crop_n_points_downscale_factor) + " must be in [1, " +
                   std::to_string(lim.max_crop_n_points_downscale_factor) + "]");
  if (p.point_grids.empty()) {
    if (p.points_per_side < 1 || p.points_per_side > lim.max_points_per_side)
      return bad("points_per_side", "= " + std::to_string(p.points_per_side) + " must be in [1, " +
                                        std::to_string(lim.max_points_per_side) +
                                        "] (or give point_grids)");
    int64_t total = 0;
    for (int i = 0; i <= p.crop_n_layers; ++i) {
      const int n = LayerSide(p.points_per_side, p.crop_n_points_downscale_factor, i);
      if (n < 1)
        return bad("crop_n_points_downscale_factor",
                   "= " + std::to_string(p.crop_n_points_downscale_factor) + " leaves crop layer " +
                       std::to_string(i) + " without points (points_per_side " +
                       std::to_string(p.points_per_side) + ")");
      total += int64_t{n} * n;
    }
    if (total > lim.max_grid_points)
      return bad("points_per_side", "= " + std::to_string(p.points_per_side) + " gives " +
                                        std::to_string(total) + " grid points (expected at most " +
                                        std::to_string(lim.max_grid_points) + ")");
  } else {
    if (p.points_per_side != 0)
      return bad("points_per_side", "= " + std::to_string(p.points_per_side) +
                                        " must be unset (0) when point_grids are given");
    if (static_cast<int>(p.point_grids.size()) != p.crop_n_layers + 1)
      return bad("point_grids", "has " + std::to_string(p.point_grids.size()) +
                                    " grids (expected crop_n_layers + 1 = " +
                                    std::to_string(p.crop_n_layers + 1) + ")");
    int64_t total = 0;
    for (size_t g = 0; g < p.point_grids.size(); ++g) {
      const auto& grid = p.point_grids[g];
      const std::string gname = "point_grids[" + std::to_string(g) + "]";
      if (grid.empty()) return bad(gname, "has no points");
      total += static_cast<int64_t>(grid.size());
      for (size_t i = 0; i < grid.size(); ++i) {
        const auto& pt = grid[i];
        if (!std::isfinite(pt.x) || !std::isfinite(pt.y) || pt.x < 0 || pt.x > 1 || pt.y < 0 || pt.y > 1)
          return bad(gname + ".points[" + std::to_string(i) + "]",
                     "= (" + FormatNumber(pt.x) + ", " + FormatNumber(pt.y) + ") must be in [0, 1] x [0, 1]");
      }
    }
    if (total > lim.max_grid_points)
      return bad("point_grids", "have " + std::to_string(total) + " points (expected at most " +
                                    std::to_string(lim.max_grid_points) + ")");
  }
  if (p.points_per_batch < 1 || p.points_per_batch > lim.max_points_per_batch)
    return bad("points_per_batch", "= " + std::to_string(p.points_per_batch) + " must be in [1, " +
                                       std::to_string(lim.max_points_per_batch) + "]");
  MASKD_RETURN_IF_ERROR(unit("pred_iou_thresh", p.pred_iou_thresh));
  MASKD_RETURN_IF_ERROR(unit("stability_score_thresh", p.stability_score_thresh));
  if (!std::isfinite(p.stability_score_offset) || p.stability_score_offset < 0)
    return bad("stability_score_offset", "= " + FormatNumber(p.stability_score_offset) + " must be finite and >= 0");
  MASKD_RETURN_IF_ERROR(unit("box_nms_thresh", p.box_nms_thresh));
  MASKD_RETURN_IF_ERROR(unit("crop_nms_thresh", p.crop_nms_thresh));
  if (!std::isfinite(p.crop_overlap_ratio) || p.crop_overlap_ratio < 0 || p.crop_overlap_ratio >= 1)
    return bad("crop_overlap_ratio", "= " + FormatNumber(p.crop_overlap_ratio) + " must be in [0, 1)");
  if (p.min_mask_region_area < 0)
    return bad("min_mask_region_area", "= " + std::to_string(p.min_mask_region_area) + " must be >= 0");
  return Status::Ok();
}

std::vector<NormalizedPoint> BuildPointGrid(int n) {
  std::vector<double> side(static_cast<size_t>(std::max(n, 0)));
  const double offset = 1.0 / (2 * n);
  // numpy.linspace(offset, 1 - offset, n): start + i * step, the last value exactly the stop.
  const double stop = 1 - offset;
  const double step = n > 1 ? (stop - offset) / (n - 1) : 0;
  for (int i = 0; i < n; ++i) side[i] = i * step + offset;
  if (n > 1) side[n - 1] = stop;
  std::vector<NormalizedPoint> pts;
  pts.reserve(side.size() * side.size());
  for (int y = 0; y < n; ++y)
    for (int x = 0; x < n; ++x) pts.push_back({side[x], side[y]});
  return pts;
}

std::vector<std::vector<NormalizedPoint>> BuildPointGrids(const MaskGenerationParams& p) {
  if (!p.point_grids.empty()) return p.point_grids;
  std::vector<std::vector<NormalizedPoint>> grids;
  for (int i = 0; i <= p.crop_n_layers; ++i)
    grids.push_back(BuildPointGrid(LayerSide(p.points_per_side, p.crop_n_points_downscale_factor, i)));
  return grids;
}

std::vector<LayeredCrop> GenerateCropBoxes(int w, int h, int n_layers, double overlap_ratio) {
  std::vector<LayeredCrop> crops;
  crops.push_back({{0, 0, w, h}, 0});
  const int short_side = std::min(w, h);
  auto crop_len = [](int orig_len, int n_crops, int overlap) {
    return static_cast<int>(std::ceil((static_cast<double>(overlap) * (n_crops - 1) + orig_len) / n_crops));
  };
  for (int layer = 0; layer < n_layers; ++layer) {
    const int n = 1 << (layer + 1);
    const int overlap = static_cast<int>(overlap_ratio * short_side * (2.0 / n));
    const int cw = crop_len(w, n, overlap), ch = crop_len(h, n, overlap);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        const int x0 = (cw - overlap) * i, y0 = (ch - overlap) * j;
        crops.push_back({{x0, y0, std::min(x0 + cw, w), std::min(y0 + ch, h)}, layer + 1});
      }
  }
  return crops;
}

std::vector<int> BoxNmsHost(const std::vector<std::array<float, 4>>& boxes, const std::vector<float>& scores,
                            float iou_threshold) {
  const size_t n = boxes.size();
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return scores[a] > scores[b]; });
  std::vector<float> area(n);
  for (size_t i = 0; i < n; ++i) area[i] = (boxes[i][2] - boxes[i][0]) * (boxes[i][3] - boxes[i][1]);
  std::vector<char> suppressed(n, 0);
  std::vector<int> keep;
  for (size_t a = 0; a < n; ++a) {
    const int i = order[a];
    if (suppressed[i]) continue;
    keep.push_back(i);
    for (size_t b = a + 1; b < n; ++b) {
      const int j = order[b];
      if (suppressed[j]) continue;
      const float w = std::max(0.0f, std::min(boxes[i][2], boxes[j][2]) - std::max(boxes[i][0], boxes[j][0]));
      const float h = std::max(0.0f, std::min(boxes[i][3], boxes[j][3]) - std::max(boxes[i][1], boxes[j][1]));
      const float inter = w * h;
      const float iou = inter / (area[i] + area[j] - inter);
      if (iou > iou_threshold) suppressed[j] = 1;
    }
  }
  return keep;
}

namespace {
// 8-connected components of the set pixels, labelled 1.. in raster order of each component's first
// pixel; returns the label image and the sizes (index 0 unused).
std::pair<std::vector<int>, std::vector<int64_t>> Components(const std::vector<uint8_t>& m, int w, int h) {
  std::vector<int> parent;
  std::vector<int> lab(m.size(), -1);
  auto find = [&](int x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  };
  auto unite = [&](int a, int b) {
    a = find(a), b = find(b);
    if (a != b) parent[std::max(a, b)] = std::min(a, b);
  };
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      const size_t i = static_cast<size_t>(y) * w + x;
      if (!m[i]) continue;
      int l = -1;
      const int nb[4][2] = {{-1, -1}, {0, -1}, {1, -1}, {-1, 0}};
      for (const auto& d : nb) {
        const int nx = x + d[0], ny = y + d[1];
        if (nx < 0 || nx >= w || ny < 0) continue;
        const int o = lab[static_cast<size_t>(ny) * w + nx];
        if (o < 0) continue;
        if (l < 0) l = o;
        else unite(l, o);
      }
      if (l < 0) {
        l = static_cast<int>(parent.size());
        parent.push_back(l);
      }
      lab[i] = l;
    }
  std::vector<int> final_of(parent.size(), 0);
  std::vector<int> out(m.size(), 0);
  std::vector<int64_t> sizes(1, 0);
  for (size_t i = 0; i < m.size(); ++i) {
    if (lab[i] < 0) continue;
    const int r = find(lab[i]);
    if (!final_of[r]) {
      final_of[r] = static_cast<int>(sizes.size());
      sizes.push_back(0);
    }
    out[i] = final_of[r];
    ++sizes[final_of[r]];
  }
  return {std::move(out), std::move(sizes)};
}
}  // namespace

bool RemoveSmallRegions(std::vector<uint8_t>& mask, int w, int h, double area_thresh, bool holes) {
  std::vector<uint8_t> working(mask.size());
  for (size_t i = 0; i < mask.size(); ++i) working[i] = static_cast<uint8_t>((mask[i] != 0) != holes);
  auto [labels, sizes] = Components(working, w, h);
  const int n_labels = static_cast<int>(sizes.size());
  std::vector<char> small(n_labels, 0);
  bool any_small = false;
  for (int l = 1; l < n_labels; ++l)
    if (static_cast<double>(sizes[l]) < area_thresh) small[l] = 1, any_small = true;
  if (!any_small) return false;
  std::vector<char> fill(n_labels, 0);
  if (holes) {
    fill[0] = 1;
    for (int l = 1; l < n_labels; ++l) fill[l] = small[l];
  } else {
    bool any = false;
    for (int l = 1; l < n_labels; ++l)
      if (!small[l]) fill[l] = 1, any = true;
    if (!any) {
      int best = 1;
      for (int l = 2; l < n_labels; ++l)
        if (sizes[l] > sizes[best]) best = l;
      fill[best] = 1;
    }
  }
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = static_cast<uint8_t>(fill[labels[i]]);
  return true;
}

std::array<int, 4> MaskBox(const uint8_t* m, int w, int h) {
  int x0 = w, y0 = h, x1 = -1, y1 = -1;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      if (m[static_cast<size_t>(y) * w + x]) {
        x0 = std::min(x0, x), x1 = std::max(x1, x);
        y0 = std::min(y0, y), y1 = std::max(y1, y);
      }
  if (x1 < x0 || y1 < y0) return {0, 0, 0, 0};
  return {x0, y0, x1, y1};
}

}  // namespace maskd
