#include "server/wire.h"

#include <cmath>
#include <utility>

#include "model/io/image_codec.h"
#include "model/io/image_id.h"
#include "model/io/rle.h"

namespace maskd::server {
namespace {

std::string Quote(const std::string& s) {
  constexpr size_t kShown = 80;
  std::string shown = s.size() > kShown ? s.substr(0, kShown) + "..." : s;
  return "\"" + shown + "\"";
}

}  // namespace

Status ValidateImage(const v1::Image& image, const RequestLimits& limits, const std::string& field) {
  switch (image.source_case()) {
    case v1::Image::kEncoded: {
      const std::string& bytes = image.encoded();
      const std::string f = field + ".encoded";
      if (bytes.empty()) return InvalidArgument(f + " is empty (expected JPEG, PNG or WebP bytes)");
      if (bytes.size() > limits.max_image_bytes) {
        return InvalidArgument(f + " is " + std::to_string(bytes.size()) + " bytes (expected at most " +
                               std::to_string(limits.max_image_bytes) + ": limits.max_image_bytes)");
      }
      const ImageFormat format = DetectImageFormat(bytes);
      if (format == ImageFormat::kUnknown) {
        // DecodeImage's message lists the first bytes and the accepted formats.
        ImageLimits l;
        l.max_bytes = limits.max_image_bytes;
        auto r = DecodeImage(bytes, l, f);
        return r.ok() ? Internal(f + ": format detection disagrees with the decoder") : r.status();
      }
      if (format == ImageFormat::kWebp && !WebpSupported()) {
        return InvalidArgument(f + " is WebP, which this build of maskd cannot decode (built without "
                               "libwebp; expected JPEG or PNG)");
      }
      return Status::Ok();
    }
    case v1::Image::kRaw: {
      const v1::RawImage& raw = image.raw();
      const std::string f = field + ".raw";
      if (raw.width() < 1 || raw.width() > static_cast<uint32_t>(limits.max_image_side)) {
        return InvalidArgument(f + ".width = " + std::to_string(raw.width()) + " (expected 1 .. " +
                               std::to_string(limits.max_image_side) + ")");
      }
      if (raw.height() < 1 || raw.height() > static_cast<uint32_t>(limits.max_image_side)) {
        return InvalidArgument(f + ".height = " + std::to_string(raw.height()) + " (expected 1 .. " +
                               std::to_string(limits.max_image_side) + ")");
      }
      const uint64_t pixels = uint64_t{raw.width()} * raw.height();
      if (pixels > limits.max_image_pixels) {
        return InvalidArgument(f + " is " + std::to_string(raw.width()) + " x " +
                               std::to_string(raw.height()) + " = " + std::to_string(pixels) +
                               " pixels (expected at most " + std::to_string(limits.max_image_pixels) +
                               ": limits.max_image_pixels)");
      }
      if (raw.rgb().size() != pixels * 3) {
        return InvalidArgument(f + ".rgb has " + std::to_string(raw.rgb().size()) +
                               " bytes (expected width * height * 3 = " + std::to_string(pixels * 3) +
                               ")");
      }
      return Status::Ok();
    }
    case v1::Image::SOURCE_NOT_SET: break;
  }
  return InvalidArgument(field + " has neither encoded nor raw set (expected exactly one)");
}

Status ValidateImageId(const std::string& image_id, const std::string& field) {
  if (!LooksLikeImageId(image_id)) {
    return InvalidArgument(field + " = " + Quote(image_id) +
                           " is not an image id (expected the 64 lowercase hex digits returned by "
                           "Embed or Segment)");
  }
  return Status::Ok();
}

StatusOr<std::vector<PromptDraft>> ValidatePrompts(
    const google::protobuf::RepeatedPtrField<v1::Prompt>& prompts, const RequestLimits& limits,
    bool allow_empty) {
  const int n = prompts.size();
  if ((n == 0 && !allow_empty) || static_cast<uint32_t>(n) > limits.max_prompts_per_request) {
    return InvalidArgument("prompts has " + std::to_string(n) + " prompts (expected " +
                           (allow_empty ? "0" : "1") + " .. " +
                           std::to_string(limits.max_prompts_per_request) +
                           ": limits.max_prompts_per_request)");
  }
  std::vector<PromptDraft> drafts;
  drafts.reserve(n);
  for (int i = 0; i < n; ++i) {
    const v1::Prompt& p = prompts[i];
    const std::string f = "prompts[" + std::to_string(i) + "]";
    PromptDraft d;
    if (static_cast<uint32_t>(p.points_size()) > limits.max_points_per_prompt) {
      return InvalidArgument(f + ".points has " + std::to_string(p.points_size()) +
                             " points (expected at most " +
                             std::to_string(limits.max_points_per_prompt) +
                             ": limits.max_points_per_prompt)");
    }
    for (int j = 0; j < p.points_size(); ++j) {
      const v1::Point& pt = p.points(j);
      Point q;
      q.x = pt.x();
      q.y = pt.y();
      switch (pt.label()) {
        case v1::POINT_LABEL_UNSPECIFIED:
        case v1::POINT_LABEL_FOREGROUND: q.label = 1; break;
        case v1::POINT_LABEL_BACKGROUND: q.label = 0; break;
        default:
          return InvalidArgument(f + ".points[" + std::to_string(j) + "].label = " +
                                 std::to_string(static_cast<int>(pt.label())) +
                                 " (expected 0 POINT_LABEL_UNSPECIFIED, 1 POINT_LABEL_FOREGROUND or "
                                 "2 POINT_LABEL_BACKGROUND)");
      }
      d.spec.points.push_back(q);
    }
    if (p.has_box()) {
      d.spec.box = Box{p.box().x0(), p.box().y0(), p.box().x1(), p.box().y1()};
    }
    if (p.points_size() == 0 && !p.has_box()) {
      return InvalidArgument(f + " has no points and no box (expected at least one point or a box)");
    }
    d.spec.multimask = p.multimask();
    if (p.has_mask_input()) {
      const v1::MaskInput& m = p.mask_input();
      const std::string mf = f + ".mask_input";
      switch (m.source_case()) {
        case v1::MaskInput::kResultId:
          if (m.result_id().empty()) {
            return InvalidArgument(mf + ".result_id is empty (expected a result_id returned earlier "
                                   "for this image)");
          }
          d.mask = PromptDraft::Mask::kResult;
          d.result_id = m.result_id();
          if (m.has_mask_index()) d.mask_index = m.mask_index();
          break;
        case v1::MaskInput::kLogits: {
          const v1::LowResLogits& l = m.logits();
          if (l.width() != kLowResSide || l.height() != kLowResSide) {
            return InvalidArgument(mf + ".logits is " + std::to_string(l.width()) + " x " +
                                   std::to_string(l.height()) + " (expected " + std::to_string(kLowResSide) + " x " +
                                   std::to_string(kLowResSide) + ")");
          }
          const size_t want = static_cast<size_t>(kLowResSide) * kLowResSide;
          if (static_cast<size_t>(l.values_size()) != want) {
            return InvalidArgument(mf + ".logits.values has " + std::to_string(l.values_size()) +
                                   " values (expected width * height = " + std::to_string(want) + ")");
          }
          for (int k = 0; k < l.values_size(); ++k) {
            if (!std::isfinite(l.values(k))) {
              return InvalidArgument(mf + ".logits.values[" + std::to_string(k) + "] = " +
                                     std::to_string(l.values(k)) + " (expected a finite number)");
            }
          }
          if (m.has_mask_index()) {
            return InvalidArgument(mf + ".mask_index = " + std::to_string(m.mask_index()) +
                                   " is set with logits (expected it only with result_id)");
          }
          d.mask = PromptDraft::Mask::kLogits;
          d.logits = l.values().data();
          break;
        }
        case v1::MaskInput::SOURCE_NOT_SET:
          return InvalidArgument(mf + " has neither result_id nor logits set (expected exactly one)");
      }
    }
    drafts.push_back(std::move(d));
  }
  return drafts;
}

namespace {

// The polygon tolerance check shared by Segment and GenerateMasks.
Status ValidateTolerance(float tol) {
  if (!std::isfinite(tol) || tol < 0) {
    return InvalidArgument("polygon_tolerance = " + std::to_string(tol) +
                           " (expected a finite number of pixels >= 0)");
  }
  return Status::Ok();
}

}  // namespace

Status ValidateSegmentOptions(const v1::SegmentRequest& request, const RequestLimits& limits) {
  if (!v1::OutputFormat_IsValid(request.output_format())) {
    return InvalidArgument("output_format = " + std::to_string(static_cast<int>(request.output_format())) +
                           " (expected 0 OUTPUT_FORMAT_UNSPECIFIED, 1 OUTPUT_FORMAT_COCO_RLE, 2 "
                           "OUTPUT_FORMAT_PNG, 3 OUTPUT_FORMAT_LOW_RES_LOGITS or 4 "
                           "OUTPUT_FORMAT_POLYGONS)");
  }
  MASKD_RETURN_IF_ERROR(ValidateTolerance(request.polygon_tolerance()));
  if (request.request_tag().size() > limits.max_request_tag_bytes) {
    return InvalidArgument("request_tag is " + std::to_string(request.request_tag().size()) +
                           " bytes (expected at most " + std::to_string(limits.max_request_tag_bytes) +
                           ")");
  }
  return Status::Ok();
}

StatusOr<GenerationSpec> ValidateGenerateRequest(const v1::GenerateMasksRequest& request,
                                                 const RequestLimits& request_limits,
                                                 const MaskGenerationLimits& limits) {
  GenerationSpec spec;
  switch (request.output_format()) {
    case v1::OUTPUT_FORMAT_UNSPECIFIED:
    case v1::OUTPUT_FORMAT_COCO_RLE: spec.output.format = OutputFormat::kRle; break;
    case v1::OUTPUT_FORMAT_PNG: spec.output.format = OutputFormat::kPng; break;
    case v1::OUTPUT_FORMAT_POLYGONS: spec.output.format = OutputFormat::kPolygons; break;
    default:
      return InvalidArgument("output_format = " + std::to_string(static_cast<int>(request.output_format())) +
                             " (expected 0 OUTPUT_FORMAT_UNSPECIFIED, 1 OUTPUT_FORMAT_COCO_RLE, 2 "
                             "OUTPUT_FORMAT_PNG or 4 OUTPUT_FORMAT_POLYGONS: generated masks have no "
                             "single low-res logits frame)");
  }
  MASKD_RETURN_IF_ERROR(ValidateTolerance(request.polygon_tolerance()));
  spec.output.polygon_tolerance = request.polygon_tolerance();
  if (request.request_tag().size() > request_limits.max_request_tag_bytes) {
    return InvalidArgument("request_tag is " + std::to_string(request.request_tag().size()) +
                           " bytes (expected at most " +
                           std::to_string(request_limits.max_request_tag_bytes) + ")");
  }
  const v1::MaskGenerationParams& p = request.params();
  MaskGenerationParams& q = spec.params;
  // Counted before anything is copied: a request may carry many more points than any grid allows.
  int64_t total = 0;
  for (const v1::PointGrid& g : p.point_grids()) total += g.points_size();
  if (total > limits.max_grid_points) {
    return InvalidArgument("params.point_grids have " + std::to_string(total) +
                           " points (expected at most " + std::to_string(limits.max_grid_points) +
                           ": limits.generation.max_grid_points)");
  }
  for (const v1::PointGrid& g : p.point_grids()) {
    std::vector<NormalizedPoint>& grid = q.point_grids.emplace_back();
    grid.reserve(static_cast<size_t>(g.points_size()));
    for (const v1::PointXY& pt : g.points()) grid.push_back({pt.x(), pt.y()});
  }
  // With explicit grids the original ignores points_per_side (it must be None there).
  q.points_per_side = p.has_points_per_side() ? p.points_per_side() : (q.point_grids.empty() ? 32 : 0);
  if (p.has_points_per_batch()) q.points_per_batch = p.points_per_batch();
  if (p.has_pred_iou_thresh()) q.pred_iou_thresh = p.pred_iou_thresh();
  if (p.has_stability_score_thresh()) q.stability_score_thresh = p.stability_score_thresh();
  if (p.has_stability_score_offset()) q.stability_score_offset = p.stability_score_offset();
  if (p.has_box_nms_thresh()) q.box_nms_thresh = p.box_nms_thresh();
  if (p.has_crop_n_layers()) q.crop_n_layers = p.crop_n_layers();
  if (p.has_crop_nms_thresh()) q.crop_nms_thresh = p.crop_nms_thresh();
  if (p.has_crop_overlap_ratio()) q.crop_overlap_ratio = p.crop_overlap_ratio();
  if (p.has_crop_n_points_downscale_factor()) q.crop_n_points_downscale_factor = p.crop_n_points_downscale_factor();
  if (p.has_min_mask_region_area()) q.min_mask_region_area = p.min_mask_region_area();
  MASKD_RETURN_IF_ERROR(ValidateMaskGenerationParams(q, "params", limits));
  return spec;
}

ImageInput ImageInputFrom(const v1::Image& image) {
  ImageInput in;
  if (image.has_raw()) {
    in.kind = ImageInput::Kind::kRaw;
    in.width = image.raw().width();
    in.height = image.raw().height();
    in.bytes = image.raw().rgb();
  } else {
    in.kind = ImageInput::Kind::kEncoded;
    in.bytes = image.encoded();
  }
  return in;
}

ImageInput ImageInputFromId(const std::string& image_id) {
  ImageInput in;
  in.kind = ImageInput::Kind::kId;
  in.image_id = image_id;
  return in;
}

OutputSpec OutputSpecFrom(const v1::SegmentRequest& request) {
  OutputSpec spec;
  switch (request.output_format()) {
    case v1::OUTPUT_FORMAT_PNG: spec.format = OutputFormat::kPng; break;
    case v1::OUTPUT_FORMAT_LOW_RES_LOGITS: spec.format = OutputFormat::kLowResLogits; break;
    case v1::OUTPUT_FORMAT_POLYGONS: spec.format = OutputFormat::kPolygons; break;
    default: spec.format = OutputFormat::kRle;  // UNSPECIFIED and COCO_RLE
  }
  spec.polygon_tolerance = request.polygon_tolerance();
  return spec;
}

namespace {

void TimingToProto(const CallTiming& t, v1::CallTiming* p) {
  p->set_decode_us(t.decode_us);
  p->set_encoder_queue_us(t.encoder_queue_us);
  p->set_encoder_compute_us(t.encoder_compute_us);
  p->set_decoder_queue_us(t.decoder_queue_us);
  p->set_decoder_compute_us(t.decoder_compute_us);
  p->set_postprocess_us(t.postprocess_us);
  p->set_total_us(t.total_us);
}

// The image fields that EmbedResponse, SegmentResponse and GenerateMasksResponse all carry under
// the same names; a template because the three messages share no base type.
template <typename Response>
void ImageOutcomeToProto(const ImageOutcome& o, Response* r) {
  r->set_image_id(o.image_id);
  r->set_width(o.width);
  r->set_height(o.height);
  r->set_cached(o.cached);
  TimingToProto(o.timing, r->mutable_timing());
}

// A mask's contours as Polygons (Segment's MaskResult and GenerateMasks' GeneratedMask alike).
void PolygonsToProto(const std::vector<Contour>& contours, v1::Polygons* ps) {
  for (const Contour& c : contours) {
    v1::Polygon* p = ps->add_polygons();
    p->mutable_points()->Add(c.xy.begin(), c.xy.end());
    p->set_hole(c.hole);
    p->set_parent(c.parent);
  }
}

}  // namespace

StatusOr<std::optional<Precision>> EmbeddingDtypeFrom(int value, const std::string& field) {
  switch (value) {
    case v1::EMBEDDING_DTYPE_UNSPECIFIED: return std::optional<Precision>();
    case v1::EMBEDDING_DTYPE_FP32: return std::optional<Precision>(Precision::kFloat32);
    case v1::EMBEDDING_DTYPE_BF16: return std::optional<Precision>(Precision::kBFloat16);
    case v1::EMBEDDING_DTYPE_FP16: return std::optional<Precision>(Precision::kFloat16);
    default: break;
  }
  return InvalidArgument(field + " = " + std::to_string(value) +
                         " (expected EMBEDDING_DTYPE_UNSPECIFIED, EMBEDDING_DTYPE_FP32, "
                         "EMBEDDING_DTYPE_BF16 or EMBEDDING_DTYPE_FP16)");
}

void ToProto(const ImageOutcome& o, v1::EmbedResponse* r) {
  ImageOutcomeToProto(o, r);
  if (o.embedding) {
    v1::ImageEmbedding* e = r->mutable_embedding();
    e->set_dtype(o.embedding->dtype == Precision::kBFloat16  ? v1::EMBEDDING_DTYPE_BF16
                 : o.embedding->dtype == Precision::kFloat16 ? v1::EMBEDDING_DTYPE_FP16
                                                             : v1::EMBEDDING_DTYPE_FP32);
    for (int64_t d : o.embedding->shape) e->add_shape(static_cast<uint32_t>(d));
    e->set_data(o.embedding->data);
    e->set_input_width(o.input_width);
    e->set_input_height(o.input_height);
    e->set_original_width(o.width);
    e->set_original_height(o.height);
  }
}

void MoveToProto(SegmentOutcome& o, const Status& status, v1::SegmentResponse* r) {
  ImageOutcomeToProto(o.image, r);
  r->clear_results();
  if (!status.ok()) return;
  for (PromptResult& p : o.results) {
    v1::PromptResult* pr = r->add_results();
    pr->set_result_id(p.result_id);
    pr->set_best_index(p.best_index);
    for (MaskResult& m : p.masks) {
      v1::MaskResult* mr = pr->add_masks();
      mr->set_score(m.score);
      mr->set_stability_score(m.stability_score);
      v1::BoundingBox* bb = mr->mutable_bbox();
      bb->set_x(m.bbox[0]);
      bb->set_y(m.bbox[1]);
      bb->set_width(m.bbox[2]);
      bb->set_height(m.bbox[3]);
      mr->set_area(m.area);
      switch (o.format) {
        case OutputFormat::kRle: {
          v1::CocoRle* rle = mr->mutable_rle();
          rle->add_size(static_cast<uint32_t>(o.image.height));
          rle->add_size(static_cast<uint32_t>(o.image.width));
          rle->set_counts(std::move(m.rle_counts));
          break;
        }
        case OutputFormat::kPng:
          mr->set_png(std::move(m.png));
          break;
        case OutputFormat::kLowResLogits: {
          v1::LowResLogits* l = mr->mutable_low_res_logits();
          l->set_width(static_cast<uint32_t>(m.low_res_side));
          l->set_height(static_cast<uint32_t>(m.low_res_side));
          l->mutable_values()->Add(m.low_res_logits.begin(), m.low_res_logits.end());
          break;
        }
        case OutputFormat::kPolygons: PolygonsToProto(m.polygons, mr->mutable_polygons()); break;
      }
    }
  }
}

void MoveToProto(GenerateOutcome& o, const Status& status, v1::GenerateMasksResponse* r) {
  ImageOutcomeToProto(o.image, r);
  r->clear_masks();
  if (!status.ok()) return;
  v1::GenerationStats* st = r->mutable_stats();
  st->set_crops(static_cast<uint32_t>(o.stats.crops));
  st->set_points(static_cast<uint32_t>(o.stats.points));
  st->set_point_batches(static_cast<uint32_t>(o.stats.decoder_batches));
  st->set_candidates(static_cast<uint32_t>(o.stats.candidates));
  auto box = [](const std::array<int, 4>& b, v1::BoundingBox* out) {
    out->set_x(static_cast<uint32_t>(b[0]));
    out->set_y(static_cast<uint32_t>(b[1]));
    out->set_width(static_cast<uint32_t>(b[2]));
    out->set_height(static_cast<uint32_t>(b[3]));
  };
  r->mutable_masks()->Reserve(static_cast<int>(o.masks.size()));
  for (GeneratedMaskResult& m : o.masks) {
    v1::GeneratedMask* g = r->add_masks();
    switch (o.format) {
      case OutputFormat::kPng: g->set_png(std::move(m.png)); break;
      case OutputFormat::kPolygons: PolygonsToProto(m.polygons, g->mutable_polygons()); break;
      default: {
        v1::CocoRle* rle = g->mutable_rle();
        rle->add_size(static_cast<uint32_t>(o.image.height));
        rle->add_size(static_cast<uint32_t>(o.image.width));
        rle->set_counts(std::move(m.rle_counts));
      }
    }
    g->set_area(m.area);
    box(m.bbox, g->mutable_bbox());
    g->set_predicted_iou(m.predicted_iou);
    v1::PointXY* pt = g->add_point_coords();
    pt->set_x(m.point_x);
    pt->set_y(m.point_y);
    g->set_stability_score(m.stability_score);
    box(m.crop_box, g->mutable_crop_box());
  }
}

void ToProto(const MaskGenerationLimits& l, v1::GenerationLimits* out) {
  out->set_max_points_per_side(static_cast<uint32_t>(l.max_points_per_side));
  out->set_max_grid_points(static_cast<uint32_t>(l.max_grid_points));
  out->set_max_points_per_batch(static_cast<uint32_t>(l.max_points_per_batch));
  out->set_max_crop_n_layers(static_cast<uint32_t>(l.max_crop_n_layers));
  out->set_max_crop_n_points_downscale_factor(static_cast<uint32_t>(l.max_crop_n_points_downscale_factor));
}

}  // namespace maskd::server
