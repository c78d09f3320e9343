// EngineImpl's model-side steps of automatic mask generation (model/api/mask_generator.h drives
// them): FilterMasks, the original's _process_batch after the decoder (upscale to the crop,
// predicted-IoU and stability filters, threshold, boxes, the crop-edge filter, uncrop, COCO RLE), and
// BoxNms, torchvision's greedy nms with the IoU matrix made on the device. Plain LibTorch ops, on the
// engine's device, in float32 (the original's arithmetic).
#include <algorithm>
#include <cmath>

#include "model/engine_impl.h"

namespace maskd {

StatusOr<std::vector<MaskCandidate>> EngineImpl::FilterMasks(const MaskFilterRequest& r) {
  const CropBox& cb = r.crop_box;
  const int cw = cb[2] - cb[0], ch = cb[3] - cb[1];
  if (r.image_width <= 0 || r.image_height <= 0 || cb[0] < 0 || cb[1] < 0 || cw <= 0 || ch <= 0 ||
      cb[2] > r.image_width || cb[3] > r.image_height)
    return InvalidArgument("mask filter: the crop box lies outside the image");
  if (r.crop.original_width != cw || r.crop.original_height != ch || r.crop.input_width <= 0 ||
      r.crop.input_height <= 0 || r.crop.input_width > config_.img_size || r.crop.input_height > config_.img_size)
    return InvalidArgument("mask filter: the crop's geometry does not match its box");
  for (size_t i = 0; i < r.decoded.size(); ++i)
    if (!r.decoded[i].logits || r.decoded[i].logits->num_masks() != static_cast<int>(r.decoded[i].scores.size()))
      return InvalidArgument("mask filter: decoded prompt " + std::to_string(i) + " has no logits or scores");
  return Guarded("filtering the generated masks of " + Count(r.decoded.size(), "grid point", "grid points"), [&]() -> StatusOr<std::vector<MaskCandidate>> {
    torch::NoGradGuard no_grad;
    CallStream cs(device_, decoder_priority_);
    std::vector<MaskCandidate> out;
    // Masks passing the predicted-IoU filter (point-major, then mask), with their owners.
    std::vector<at::Tensor> logits;
    std::vector<int64_t> picked;
    std::vector<std::pair<int, int>> owner;
    std::vector<float> iou;
    int64_t base = 0;
    for (size_t i = 0; i < r.decoded.size(); ++i) {
      const auto& d = r.decoded[i];
      logits.push_back(PayloadOf(*d.logits).tensor);
      for (size_t m = 0; m < d.scores.size(); ++m) {
        if (r.pred_iou_thresh > 0 && !(d.scores[m] > r.pred_iou_thresh)) continue;
        picked.push_back(base + static_cast<int64_t>(m));
        owner.emplace_back(static_cast<int>(i), static_cast<int>(m));
        iou.push_back(d.scores[m]);
      }
      base += static_cast<int64_t>(d.scores.size());
    }
    if (picked.empty()) return out;
    const auto K = static_cast<int64_t>(picked.size());
    const at::Tensor idx = Upload(at::from_blob(picked.data(), {K}, at::kLong).clone());
    const bool whole_image = cb[0] == 0 && cb[1] == 0 && cw == r.image_width && ch == r.image_height;
    if (whole_image && r.mask_threshold == 0.0f && r.stability_score_offset == 1.0f) {
      // Segment's post-processing (kernels::MaskPostprocess): with gpu_postprocess the fused kernel
      // (upscale, threshold, area, box, the +-1 stability counts and COCO RLE in one pass per mask
      // without a full-size float tensor; only the runs come to the host), else its LibTorch
      // reference, the same float32 arithmetic as the plain path below, so that the CPU parity
      // tests run this wrapper too. Its fixed threshold 0 and offset 1 are the generator's defaults;
      // a whole-image crop needs no uncrop and its crop-edge filter never drops a box (the crop's
      // edges are the image's). The kernel's masks may differ from the reference by a few boundary
      // pixels (its GPU test bounds it at 4 per mask).
      const at::Tensor low = at::cat(logits, 0).index_select(0, idx).contiguous();  // [K, 256, 256]
      std::vector<int32_t> geo(static_cast<size_t>(K) * 4);
      for (int64_t k = 0; k < K; ++k) {
        geo[k * 4 + 0] = r.crop.input_height;
        geo[k * 4 + 1] = r.crop.input_width;
        geo[k * 4 + 2] = ch;
        geo[k * 4 + 3] = cw;
      }
      const at::Tensor geometry = at::from_blob(geo.data(), {K, 4}, at::kInt).clone();
      const kernels::MaskPostprocessOutput pp =
          PostprocessLogits(low, geometry, /*want_rle=*/true, /*want_bitmask=*/false, /*want_rle_string=*/false);
      const int64_t* area = pp.area.data_ptr<int64_t>();
      const int32_t* bbox = pp.bbox.data_ptr<int32_t>();
      const float* stab = pp.stability.data_ptr<float>();
      const int32_t* counts = pp.rle_counts.data_ptr<int32_t>();
      const int64_t* offsets = pp.rle_offsets.data_ptr<int64_t>();
      for (int64_t k = 0; k < K; ++k) {
        // The kernel says 1 for 0 / 0 (nothing above -offset, so an empty mask); the original
        // divides and gets NaN, which no stability threshold keeps.
        const float stability = area[k] == 0 && stab[k] == 1.0f ? std::nanf("") : stab[k];
        if (r.stability_score_thresh > 0 && !(stability >= r.stability_score_thresh)) continue;
        MaskCandidate m;
        m.prompt = owner[k].first;
        m.mask = owner[k].second;
        m.predicted_iou = iou[k];
        m.stability_score = stability;
        m.area = static_cast<uint64_t>(area[k]);
        if (area[k] > 0) {  // x, y, width, height -> inclusive x0, y0, x1, y1; zeros when empty
          m.box = {bbox[k * 4], bbox[k * 4 + 1], bbox[k * 4] + bbox[k * 4 + 2] - 1, bbox[k * 4 + 1] + bbox[k * 4 + 3] - 1};
        }
        m.rle_counts.assign(counts + offsets[k], counts + offsets[k + 1]);
        out.push_back(std::move(m));
      }
      return out;
    }
    const at::Tensor low = at::cat(logits, 0).index_select(0, idx).to(at::kFloat).unsqueeze(1);
    // SAM's postprocess_masks to the crop's size.
    const at::Tensor up = at::upsample_bilinear2d(low, {config_.img_size, config_.img_size}, false);
    const at::Tensor cut = up.slice(2, 0, r.crop.input_height).slice(3, 0, r.crop.input_width);
    const at::Tensor masks = at::upsample_bilinear2d(cut, {ch, cw}, false).squeeze(1);  // [K, ch, cw]
    // Stability: masks above threshold + offset over masks above threshold - offset.
    const float hi = r.mask_threshold + r.stability_score_offset, lo = r.mask_threshold - r.stability_score_offset;
    const at::Tensor inter = (masks > hi).sum({1, 2}).to(at::kFloat);
    const at::Tensor uni = (masks > lo).sum({1, 2}).to(at::kFloat);
    const at::Tensor stability = inter / uni;
    at::Tensor keep = at::ones({K}, masks.options().dtype(at::kBool));
    if (r.stability_score_thresh > 0) keep = keep & (stability >= r.stability_score_thresh);
    const at::Tensor bin = masks > r.mask_threshold;
    // Boxes (batched_mask_to_box): inclusive extents, zeros for an empty mask.
    const at::Tensor rows = bin.any(2), cols = bin.any(1);  // [K, ch], [K, cw]
    const auto lopt = masks.options().dtype(at::kLong);
    const at::Tensor ry = at::arange(ch, lopt), rx = at::arange(cw, lopt);
    const at::Tensor bottom = (rows * ry).amax(1), top = (rows * ry + ch * rows.logical_not()).amin(1);
    const at::Tensor right = (cols * rx).amax(1), left = (cols * rx + cw * cols.logical_not()).amin(1);
    at::Tensor boxes = at::stack({left, top, right, bottom}, 1);
    const at::Tensor empty = (right < left) | (bottom < top);
    boxes = boxes * empty.logical_not().unsqueeze(1);
    // Boxes near a crop edge that is not an image edge (is_box_near_crop_edge, atol 20).
    const at::Tensor offs = at::tensor({cb[0], cb[1], cb[0], cb[1]}, at::kLong).to(masks.device());
    const at::Tensor ub = (boxes + offs).to(at::kFloat);
    const at::Tensor crop_t = at::tensor({float(cb[0]), float(cb[1]), float(cb[2]), float(cb[3])}).to(masks.device());
    const at::Tensor img_t =
        at::tensor({0.0f, 0.0f, float(r.image_width), float(r.image_height)}).to(masks.device());
    const at::Tensor near_crop = (ub - crop_t).abs() <= 20.0f;
    const at::Tensor near_img = (ub - img_t).abs() <= 20.0f;
    keep = keep & (near_crop & near_img.logical_not()).any(1).logical_not();
    const at::Tensor kept = keep.nonzero().view({-1});
    const int64_t K2 = kept.size(0);
    if (K2 == 0) return out;
    const at::Tensor kbin = bin.index_select(0, kept);
    // Uncrop into the image and encode COCO RLE (column-major runs, first run zeros).
    at::Tensor full;
    if (cw == r.image_width && ch == r.image_height) {
      full = kbin;
    } else {
      full = at::zeros({K2, r.image_height, r.image_width}, kbin.options());
      full.slice(1, cb[1], cb[3]).slice(2, cb[0], cb[2]).copy_(kbin);
    }
    const at::Tensor flat = full.transpose(1, 2).reshape({K2, -1});
    const at::Tensor change = (flat.slice(1, 1) != flat.slice(1, 0, -1)).nonzero().to(at::kCPU).contiguous();
    const at::Tensor first = flat.select(1, 0).to(at::kCPU).contiguous();
    const at::Tensor area = kbin.sum({1, 2}).to(at::kCPU).contiguous();
    const at::Tensor kept_h = kept.to(at::kCPU).contiguous();
    const at::Tensor stab_h = stability.index_select(0, kept).to(at::kCPU).contiguous();
    const at::Tensor box_h = boxes.index_select(0, kept).to(at::kCPU).contiguous();
    const int64_t total = static_cast<int64_t>(r.image_width) * r.image_height;
    const int64_t* ch_p = change.data_ptr<int64_t>();
    const int64_t n_change = change.size(0);
    int64_t c = 0;
    for (int64_t k = 0; k < K2; ++k) {
      const int64_t j = kept_h.data_ptr<int64_t>()[k];
      MaskCandidate m;
      m.prompt = owner[j].first;
      m.mask = owner[j].second;
      m.predicted_iou = iou[j];
      m.stability_score = stab_h.data_ptr<float>()[k];
      for (int q = 0; q < 4; ++q) m.box[q] = static_cast<int>(box_h.data_ptr<int64_t>()[k * 4 + q]);
      m.area = static_cast<uint64_t>(area.data_ptr<int64_t>()[k]);
      if (first.data_ptr<bool>()[k]) m.rle_counts.push_back(0);
      int64_t prev = 0;
      for (; c < n_change && ch_p[c * 2] == k; ++c) {
        const int64_t at_idx = ch_p[c * 2 + 1] + 1;
        m.rle_counts.push_back(static_cast<uint32_t>(at_idx - prev));
        prev = at_idx;
      }
      m.rle_counts.push_back(static_cast<uint32_t>(total - prev));
      out.push_back(std::move(m));
    }
    cs.Sync();
    return out;
  });
}

StatusOr<std::vector<int>> EngineImpl::BoxNms(const std::vector<std::array<float, 4>>& boxes,
                                             const std::vector<float>& scores, float iou_threshold) {
  if (boxes.size() != scores.size()) return InvalidArgument("box NMS: boxes and scores differ in count");
  const auto N = static_cast<int64_t>(boxes.size());
  // The IoU matrix is N x N: past this the host's O(N^2) loop without a matrix is the better trade.
  constexpr int64_t kMaxDeviceBoxes = 8192;
  if (N == 0) return std::vector<int>{};
  if (N > kMaxDeviceBoxes) return BoxNmsHost(boxes, scores, iou_threshold);
  return Guarded("box NMS over " + Count(boxes.size(), "box", "boxes"), [&]() -> StatusOr<std::vector<int>> {
    torch::NoGradGuard no_grad;
    CallStream cs(device_, decoder_priority_);
    std::vector<float> flat;
    flat.reserve(boxes.size() * 4);
    for (const auto& b : boxes) flat.insert(flat.end(), b.begin(), b.end());
    const at::Tensor bx = Upload(at::from_blob(flat.data(), {N, 4}, at::kFloat).clone());
    const at::Tensor sc = Upload(at::from_blob(const_cast<float*>(scores.data()), {N}, at::kFloat).clone());
    const at::Tensor order = std::get<1>(sc.sort(/*stable=*/true, /*dim=*/0, /*descending=*/true));
    const at::Tensor b = bx.index_select(0, order);
    const at::Tensor x0 = b.select(1, 0), y0 = b.select(1, 1), x1 = b.select(1, 2), y1 = b.select(1, 3);
    const at::Tensor area = (x1 - x0) * (y1 - y0);
    const at::Tensor w = (at::minimum(x1.unsqueeze(1), x1.unsqueeze(0)) - at::maximum(x0.unsqueeze(1), x0.unsqueeze(0))).clamp_min(0);
    const at::Tensor h = (at::minimum(y1.unsqueeze(1), y1.unsqueeze(0)) - at::maximum(y0.unsqueeze(1), y0.unsqueeze(0))).clamp_min(0);
    const at::Tensor inter = w * h;
    const at::Tensor over = (inter / (area.unsqueeze(1) + area.unsqueeze(0) - inter) > iou_threshold)
                                .to(at::kCPU).contiguous();
    const at::Tensor order_h = order.to(at::kCPU).contiguous();
    cs.Sync();
    const bool* ov = over.data_ptr<bool>();
    const int64_t* ord = order_h.data_ptr<int64_t>();
    std::vector<char> suppressed(N, 0);
    std::vector<int> keep;
    for (int64_t a = 0; a < N; ++a) {
      if (suppressed[a]) continue;
      keep.push_back(static_cast<int>(ord[a]));
      for (int64_t bi = a + 1; bi < N; ++bi)
        if (ov[a * N + bi]) suppressed[bi] = 1;
    }
    return keep;
  });
}

}  // namespace maskd
