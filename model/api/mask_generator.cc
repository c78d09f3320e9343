#include "model/api/mask_generator.h"

#include <algorithm>
#include <future>
#include <optional>
#include <string>
#include <utility>

#include "model/io/rle.h"

namespace maskd {

namespace {

struct Record {
  GeneratedMask mask;
  std::array<int, 4> box{};  // x0, y0, x1, y1 (inclusive), crop frame until uncropped
  CropBox crop{};
};

ImageRGB8 Cut(const ImageRGB8& image, const CropBox& b) {
  ImageRGB8 out;
  out.width = b[2] - b[0];
  out.height = b[3] - b[1];
  out.pixels.resize(static_cast<size_t>(out.width) * out.height * 3);
  for (int y = 0; y < out.height; ++y) {
    const uint8_t* src = image.pixels.data() + (static_cast<size_t>(b[1] + y) * image.width + b[0]) * 3;
    std::copy(src, src + static_cast<size_t>(out.width) * 3, out.pixels.data() + static_cast<size_t>(y) * out.width * 3);
  }
  return out;
}

// Keeps records[keep[0]], records[keep[1]], ... in that order (the original's MaskData.filter).
void Reorder(std::vector<Record>& records, const std::vector<int>& keep) {
  std::vector<Record> out;
  out.reserve(keep.size());
  for (int k : keep) out.push_back(std::move(records[k]));
  records = std::move(out);
}

StatusOr<std::vector<int>> Nms(Engine& engine, const std::vector<Record>& records, const std::vector<float>& scores,
                               float thresh) {
  std::vector<std::array<float, 4>> boxes;
  boxes.reserve(records.size());
  for (const auto& r : records)
    boxes.push_back({static_cast<float>(r.box[0]), static_cast<float>(r.box[1]), static_cast<float>(r.box[2]),
                     static_cast<float>(r.box[3])});
  return engine.BoxNms(boxes, scores, thresh);
}

}  // namespace

StatusOr<std::vector<GeneratedMask>> GenerateMasks(Engine& engine, const MaskGenerationInput& input,
                                                   const MaskGenerationParams& params,
                                                   const GenerationDecodeFn& decode_fn, MaskGenerationStats* stats,
                                                   const MaskGenerationLimits& limits) {
  MASKD_RETURN_IF_ERROR(ValidateMaskGenerationParams(params, "params", limits));
  int W = input.width, H = input.height;
  if (input.embedding) W = input.embedding->original_width(), H = input.embedding->original_height();
  else if (input.image) W = input.image->width, H = input.image->height;
  if (!input.embedding && !input.image) return InvalidArgument("mask generation needs an image or an embedding");
  if (input.image && (input.image->width != W || input.image->height != H ||
                      input.image->pixels.size() != static_cast<size_t>(W) * H * 3))
    return InvalidArgument("mask generation: the image does not match its embedding's size");
  if (W <= 0 || H <= 0) return InvalidArgument("mask generation needs a non-empty image");
  if (params.crop_n_layers > 0 && !input.image)
    return FailedPrecondition("params.crop_n_layers = " + std::to_string(params.crop_n_layers) +
                              " needs the image's pixels (each crop is encoded): send the image, not only its id");
  GenerationDecodeFn decode = decode_fn;
  if (!decode) decode = [&engine](const std::vector<DecodeItem>& items) { return engine.DecodeEach(items); };

  const auto grids = BuildPointGrids(params);
  const auto crops = GenerateCropBoxes(W, H, params.crop_n_layers, params.crop_overlap_ratio);
  MaskGenerationStats st;
  std::vector<Record> all;
  for (const LayeredCrop& crop : crops) {
    const CropBox& cb = crop.box;
    const bool whole = cb[0] == 0 && cb[1] == 0 && cb[2] == W && cb[3] == H;
    std::shared_ptr<const Embedding> emb;
    if (whole && input.embedding) {
      emb = input.embedding;
    } else {
      StatusOr<PreparedImage> prep = whole ? engine.Prepare(*input.image) : engine.Prepare(Cut(*input.image, cb));
      if (!prep.ok()) return prep.status();
      auto enc = engine.Encode({*prep});
      if (!enc.ok()) return enc.status();
      emb = (*enc)[0];
    }
    ++st.crops;
    const int cw = cb[2] - cb[0], ch = cb[3] - cb[1];
    const auto& grid = grids[crop.layer];
    std::vector<Record> recs;
    // One batch's points in crop pixels, and its decode started on a thread of its own, so that
    // batch i + 1 decodes while batch i is filtered (the filter's upscaling and the host's share
    // overlap the next decoder pass). Batches are still filtered in order: the records come out
    // as the original's. At most two batches' logits are alive at a time.
    const size_t per_batch = static_cast<size_t>(params.points_per_batch);
    auto start_batch = [&](size_t start) {
      const size_t end = std::min(grid.size(), start + per_batch);
      std::vector<DecodeItem> items;
      std::vector<std::pair<double, double>> pts;
      for (size_t k = start; k < end; ++k) {
        const double px = grid[k].x * cw, py = grid[k].y * ch;
        pts.emplace_back(px, py);
        DecodeItem item;
        item.embedding = emb;
        item.prompt.points = {Point{static_cast<float>(px), static_cast<float>(py), 1}};
        item.prompt.multimask = true;
        items.push_back(std::move(item));
      }
      auto decoding = std::async(std::launch::async, [&decode, items = std::move(items)] { return decode(items); });
      return std::make_pair(std::move(pts), std::move(decoding));
    };
    std::optional<std::pair<std::vector<std::pair<double, double>>,
                            std::future<StatusOr<std::vector<StatusOr<DecodedPrompt>>>>>>
        next;
    if (!grid.empty()) next = start_batch(0);
    for (size_t start = 0; start < grid.size(); start += per_batch) {
      const std::vector<std::pair<double, double>> pts = std::move(next->first);
      auto decoded = next->second.get();
      next.reset();
      if (start + per_batch < grid.size()) next = start_batch(start + per_batch);
      if (!decoded.ok()) return decoded.status();
      ++st.decoder_batches;
      st.points += static_cast<int>(pts.size());
      MaskFilterRequest req;
      for (auto& d : *decoded) {
        if (!d.ok()) return d.status();
        req.decoded.push_back(std::move(*d));
      }
      req.crop = emb->geometry();
      req.crop_box = cb;
      req.image_width = W;
      req.image_height = H;
      req.pred_iou_thresh = params.pred_iou_thresh;
      req.stability_score_thresh = params.stability_score_thresh;
      req.stability_score_offset = params.stability_score_offset;
      auto cands = engine.FilterMasks(req);
      if (!cands.ok()) return cands.status();
      for (auto& c : *cands) {
        Record r;
        r.mask.rle_counts = std::move(c.rle_counts);
        r.mask.area = c.area;
        r.mask.predicted_iou = c.predicted_iou;
        r.mask.stability_score = c.stability_score;
        r.mask.point_x = pts[c.prompt].first;
        r.mask.point_y = pts[c.prompt].second;
        r.box = c.box;
        r.crop = cb;
        recs.push_back(std::move(r));
      }
    }
    st.candidates += static_cast<int>(recs.size());
    // Deduplicate within the crop, by predicted IoU.
    std::vector<float> scores;
    for (const auto& r : recs) scores.push_back(r.mask.predicted_iou);
    auto keep = Nms(engine, recs, scores, params.box_nms_thresh);
    if (!keep.ok()) return keep.status();
    Reorder(recs, *keep);
    for (auto& r : recs) {
      r.box = {r.box[0] + cb[0], r.box[1] + cb[1], r.box[2] + cb[0], r.box[3] + cb[1]};
      r.mask.point_x += cb[0];
      r.mask.point_y += cb[1];
      all.push_back(std::move(r));
    }
  }
  if (crops.size() > 1) {
    // Across crops: smaller crops first (the original scores 1 / crop area).
    std::vector<float> scores;
    for (const auto& r : all)
      scores.push_back(1.0f / static_cast<float>(static_cast<int64_t>(r.crop[2] - r.crop[0]) * (r.crop[3] - r.crop[1])));
    auto keep = Nms(engine, all, scores, params.crop_nms_thresh);
    if (!keep.ok()) return keep.status();
    Reorder(all, *keep);
  }
  if (params.min_mask_region_area > 0 && !all.empty()) {
    std::vector<std::vector<uint8_t>> masks;
    std::vector<float> scores;
    std::vector<Record> boxed = all;  // boxes of the cleaned masks, for the NMS
    for (size_t i = 0; i < all.size(); ++i) {
      auto m = RleDecode(all[i].mask.rle_counts, W, H);
      if (!m.ok()) return Internal("mask generation: " + m.status().message());
      bool changed = RemoveSmallRegions(*m, W, H, params.min_mask_region_area, /*holes=*/true);
      changed = RemoveSmallRegions(*m, W, H, params.min_mask_region_area, /*holes=*/false) || changed;
      scores.push_back(changed ? 0.0f : 1.0f);
      boxed[i].box = MaskBox(m->data(), W, H);
      masks.push_back(std::move(*m));
    }
    auto keep = Nms(engine, boxed, scores, std::max(params.box_nms_thresh, params.crop_nms_thresh));
    if (!keep.ok()) return keep.status();
    for (int k : *keep) {
      if (scores[k] != 0.0f) continue;
      all[k].mask.rle_counts = RleEncode(masks[k].data(), W, H);
      all[k].box = boxed[k].box;
    }
    Reorder(all, *keep);
  }
  std::vector<GeneratedMask> out;
  out.reserve(all.size());
  for (auto& r : all) {
    r.mask.area = RleArea(r.mask.rle_counts);
    r.mask.bbox = {r.box[0], r.box[1], r.box[2] - r.box[0], r.box[3] - r.box[1]};
    r.mask.crop_box = {r.crop[0], r.crop[1], r.crop[2] - r.crop[0], r.crop[3] - r.crop[1]};
    out.push_back(std::move(r.mask));
  }
  if (stats) *stats = st;
  return out;
}

}  // namespace maskd
