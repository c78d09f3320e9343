// Segment results as a COCO annotations file ("instances" format: images, annotations, categories),
// the form pycocotools.coco.COCO, CVAT and Label Studio import. Numbers are JSON numbers (the proto3
// JSON mapping would write area and other 64-bit fields as strings, which COCO readers reject).
#pragma once

#include <string>
#include <vector>

#include "maskd/v1/maskd.pb.h"
#include "model/api/status.h"

namespace maskd::client {

// One image's Segment answer and the file name it is listed under.
struct CocoImage {
  std::string file_name;
  v1::SegmentResponse response;
};

// The annotations JSON (pretty-printed). Image ids are 1, 2, ... in `images` order; every mask of
// every prompt is one annotation (ids 1, 2, ...) of category 1 "object" with its bbox [x, y, w, h],
// area (pixels), score (predicted IoU), iscrowd 0, and maskd's own fields (prompt_index, mask_index,
// best, stability_score, result_id) that COCO readers ignore. `segmentation` is COCO compressed RLE
// for rle and png results, and polygon lists for polygon results (holes joined by zero-width bridges,
// see model/io/polygon.h CocoPolygons); an empty polygon mask is written as an all-zero RLE, since
// pycocotools cannot rasterise an empty polygon list. INVALID_ARGUMENT for logits-only results or
// data that does not decode.
StatusOr<std::string> CocoAnnotationsJson(const std::vector<CocoImage>& images);

// One image's GenerateMasks answer and the file name it is listed under.
struct CocoGeneratedImage {
  std::string file_name;
  v1::GenerateMasksResponse response;
};

// GenerateMasks results as the same kind of file: every generated mask is one annotation of
// category 1 "object" with segmentation (as above), area, bbox [x, y, w, h] (the original's XYWH),
// score (its predicted IoU), iscrowd 0, and the original's other record fields as extra keys
// (predicted_iou, stability_score, point_coords [[x, y]], crop_box [x, y, w, h]).
StatusOr<std::string> CocoGeneratedAnnotationsJson(const std::vector<CocoGeneratedImage>& images);

}  // namespace maskd::client
