#include "client/coco_export.h"

#include <nlohmann/json.hpp>

#include "client/mask_codec.h"
#include "model/io/polygon.h"
#include "model/io/rle.h"

namespace maskd::client {
namespace {

using nlohmann::json;

json RleJson(const std::string& counts, int width, int height) {
  return json{{"size", {height, width}}, {"counts", counts}};
}

StatusOr<json> Segmentation(const v1::MaskResult& m, int width, int height) {
  switch (m.data_case()) {
    case v1::MaskResult::kRle:
      return RleJson(m.rle().counts(), width, height);
    case v1::MaskResult::kPng: {
      StatusOr<std::vector<uint8_t>> mask = DecodeMask(m, width, height);
      if (!mask.ok()) return mask.status();
      return RleJson(RleCountsToString(RleEncode(mask->data(), width, height)), width, height);
    }
    case v1::MaskResult::kPolygons: {
      StatusOr<std::vector<Contour>> contours = ContoursFrom(m.polygons());
      if (!contours.ok()) return contours.status();
      std::vector<std::vector<double>> lists = CocoPolygons(*contours);
      if (lists.empty()) {
        const std::vector<uint32_t> zeros = {static_cast<uint32_t>(width) * static_cast<uint32_t>(height)};
        return RleJson(RleCountsToString(zeros), width, height);
      }
      return json(lists);
    }
    case v1::MaskResult::kLowResLogits:
      return InvalidArgument("COCO export: the result holds only 256x256 low-res logits (expected rle, "
                             "png or polygons)");
    case v1::MaskResult::DATA_NOT_SET:
      break;
  }
  return InvalidArgument("COCO export: a mask result has no data (expected rle, png or polygons)");
}

json Header(const char* description) {
  json out;
  out["info"] = {{"description", description}, {"version", "1.0"}};
  out["licenses"] = json::array();
  out["categories"] = json::array({{{"id", 1}, {"name", "object"}, {"supercategory", "object"}}});
  return out;
}

// A generated mask's segmentation as the MaskResult Segmentation() reads (the same oneof forms).
v1::MaskResult AsMaskResult(const v1::GeneratedMask& g) {
  v1::MaskResult m;
  switch (g.segmentation_case()) {
    case v1::GeneratedMask::kRle: *m.mutable_rle() = g.rle(); break;
    case v1::GeneratedMask::kPng: m.set_png(g.png()); break;
    case v1::GeneratedMask::kPolygons: *m.mutable_polygons() = g.polygons(); break;
    case v1::GeneratedMask::SEGMENTATION_NOT_SET: break;
  }
  return m;
}

// COCO's `images` entry, with the server's content-addressed image id beside it.
json ImageEntry(int64_t id, const std::string& file_name, int width, int height, const std::string& maskd_image_id) {
  return {{"id", id}, {"file_name", file_name}, {"width", width}, {"height", height}, {"maskd_image_id", maskd_image_id}};
}

}  // namespace

StatusOr<std::string> CocoGeneratedAnnotationsJson(const std::vector<CocoGeneratedImage>& images) {
  json out = Header("maskd GenerateMasks results");
  json jimages = json::array(), annotations = json::array();
  int64_t ann_id = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    const v1::GenerateMasksResponse& r = images[i].response;
    const int w = static_cast<int>(r.width()), h = static_cast<int>(r.height());
    const int64_t image_id = static_cast<int64_t>(i) + 1;
    jimages.push_back(ImageEntry(image_id, images[i].file_name, w, h, r.image_id()));
    for (const v1::GeneratedMask& g : r.masks()) {
      StatusOr<json> seg = Segmentation(AsMaskResult(g), w, h);
      if (!seg.ok()) return seg.status();
      const v1::BoundingBox& b = g.bbox();
      const v1::BoundingBox& c = g.crop_box();
      json points = json::array();
      for (const v1::PointXY& p : g.point_coords()) points.push_back({p.x(), p.y()});
      annotations.push_back({{"id", ++ann_id},
                             {"image_id", image_id},
                             {"category_id", 1},
                             {"segmentation", std::move(*seg)},
                             {"area", g.area()},
                             {"bbox", {b.x(), b.y(), b.width(), b.height()}},
                             {"iscrowd", 0},
                             {"score", g.predicted_iou()},
                             {"predicted_iou", g.predicted_iou()},
                             {"stability_score", g.stability_score()},
                             {"point_coords", std::move(points)},
                             {"crop_box", {c.x(), c.y(), c.width(), c.height()}}});
    }
  }
  out["images"] = std::move(jimages);
  out["annotations"] = std::move(annotations);
  return out.dump();
}

StatusOr<std::string> CocoAnnotationsJson(const std::vector<CocoImage>& images) {
  json out = Header("maskd Segment results");
  json jimages = json::array(), annotations = json::array();
  int64_t ann_id = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    const v1::SegmentResponse& r = images[i].response;
    const int w = static_cast<int>(r.width()), h = static_cast<int>(r.height());
    const int64_t image_id = static_cast<int64_t>(i) + 1;
    jimages.push_back(ImageEntry(image_id, images[i].file_name, w, h, r.image_id()));
    for (int p = 0; p < r.results_size(); ++p) {
      const v1::PromptResult& pr = r.results(p);
      for (int k = 0; k < pr.masks_size(); ++k) {
        const v1::MaskResult& m = pr.masks(k);
        StatusOr<json> seg = Segmentation(m, w, h);
        if (!seg.ok()) return seg.status();
        const v1::BoundingBox& b = m.bbox();
        annotations.push_back({{"id", ++ann_id},
                               {"image_id", image_id},
                               {"category_id", 1},
                               {"segmentation", std::move(*seg)},
                               {"area", m.area()},
                               {"bbox", {b.x(), b.y(), b.width(), b.height()}},
                               {"iscrowd", 0},
                               {"score", m.score()},
                               {"stability_score", m.stability_score()},
                               {"prompt_index", p},
                               {"mask_index", k},
                               {"best", static_cast<uint32_t>(k) == pr.best_index()},
                               {"result_id", pr.result_id()}});
      }
    }
  }
  out["images"] = std::move(jimages);
  out["annotations"] = std::move(annotations);
  // Compact: polygon lists of noisy masks run to many thousands of numbers.
  return out.dump();
}

}  // namespace maskd::client
