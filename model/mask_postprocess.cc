// EngineImpl's mask post-processing: upscale the low-res logits to the input frame, crop the padding,
// resize to the original image, threshold, and compute area, box, stability and RLE/bitmask, in one
// pass per output encoding (on the device with gpu_postprocess, else the LibTorch reference).
#include "model/engine_impl.h"

#include <memory>
#include <string_view>

#include "kernels/kernels.h"
#include "model/memory_scope.h"

namespace maskd {

StatusOr<std::vector<std::vector<MaskData>>> EngineImpl::Postprocess(
    const std::vector<PostprocessItem>& items) {
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& it = items[i];
    if (!it.logits) return InvalidArgument("postprocess item " + std::to_string(i) + " has no logits");
    if (it.original_width <= 0 || it.original_height <= 0 || it.input_width <= 0 ||
        it.input_height <= 0 || it.input_width > config_.img_size || it.input_height > config_.img_size)
      return InvalidArgument("postprocess item " + std::to_string(i) + " has an invalid geometry");
  }
  return Guarded("post-processing the masks of " + Count(items.size(), "prompt", "prompts"), [&]() -> StatusOr<std::vector<std::vector<MaskData>>> {
    MemoryScope scope("Postprocess");
    torch::NoGradGuard no_grad;
    CallStream cs(device_, decoder_priority_);
    std::vector<std::vector<MaskData>> out(items.size());
    // One pass per encoding kind over all masks of all items.
    for (MaskEncoding enc : {MaskEncoding::kNone, MaskEncoding::kRle, MaskEncoding::kBitmask}) {
      std::vector<at::Tensor> logits;
      std::vector<int32_t> geometry;
      std::vector<std::pair<size_t, int>> owners;
      for (size_t i = 0; i < items.size(); ++i) {
        const auto& it = items[i];
        if (it.encoding != enc) continue;
        const at::Tensor& t = PayloadOf(*it.logits).tensor;
        logits.push_back(t);
        for (int64_t m = 0; m < t.size(0); ++m) {
          geometry.insert(geometry.end(), {it.input_height, it.input_width, it.original_height, it.original_width});
          owners.emplace_back(i, static_cast<int>(m));
        }
      }
      if (logits.empty()) continue;
      const int64_t M = static_cast<int64_t>(owners.size());
      const at::Tensor all = logits.size() == 1 ? logits.front() : at::cat(logits, 0);
      at::Tensor geom = at::from_blob(geometry.data(), {M, 4}, at::kInt).clone();
      const kernels::MaskPostprocessOutput r =
          PostprocessLogits(all, geom, enc == MaskEncoding::kRle, enc == MaskEncoding::kBitmask,
                            /*want_rle_string=*/true, /*rle_counts_with_string=*/false);
      // The strings' pinned buffer, shared by the masks of items that take them in place.
      std::shared_ptr<const void> rle_owner;
      const at::Tensor area = r.area.to(at::kCPU).contiguous();
      const at::Tensor bbox = r.bbox.to(at::kCPU).contiguous();
      const at::Tensor stab = r.stability.to(at::kCPU, at::kFloat).contiguous();
      for (int64_t m = 0; m < M; ++m) {
        MaskData d;
        d.area = static_cast<uint64_t>(area.data_ptr<int64_t>()[m]);
        for (int k = 0; k < 4; ++k) d.bbox[k] = static_cast<uint32_t>(bbox.data_ptr<int32_t>()[m * 4 + k]);
        d.stability_score = stab.data_ptr<float>()[m];
        if (enc == MaskEncoding::kRle) {
          // The string alone when the device made it (what every caller sends); else the counts.
          if (r.rle_counts.defined()) {
            const int64_t* off = r.rle_offsets.data_ptr<int64_t>();
            const int32_t* cnt = r.rle_counts.data_ptr<int32_t>();
            d.rle_counts.assign(cnt + off[m], cnt + off[m + 1]);
          }
          if (r.rle_string.defined()) {
            const int64_t* so = r.rle_string_offsets.data_ptr<int64_t>();
            const char* chars = reinterpret_cast<const char*>(r.rle_string.data_ptr<uint8_t>());
            if (items[owners[m].first].rle_in_place) {
              if (!rle_owner) rle_owner = std::make_shared<const at::Tensor>(r.rle_string);
              d.rle_view = std::string_view(chars + so[m], static_cast<size_t>(so[m + 1] - so[m]));
              d.rle_owner = rle_owner;
            } else {
              d.rle_string.assign(chars + so[m], chars + so[m + 1]);
            }
          }
        } else if (enc == MaskEncoding::kBitmask) {
          const int64_t* off = r.bitmask_offsets.data_ptr<int64_t>();
          const uint8_t* bm = r.bitmask.data_ptr<uint8_t>();
          d.bitmask.assign(bm + off[m], bm + off[m + 1]);
        }
        out[owners[m].first].push_back(std::move(d));
      }
    }
    cs.Sync();
    return out;
  });
}

kernels::MaskPostprocessOutput EngineImpl::PostprocessLogits(const at::Tensor& logits, const at::Tensor& geometry,
                                                         bool want_rle, bool want_bitmask,
                                                         bool want_rle_string, bool rle_counts_with_string) const {
  if (gpu_post_) {
    // The kernel reads bf16/fp16 logits itself (widening is exact): no float copy of the batch.
    return kernels::MaskPostprocess(logits.contiguous(), geometry, config_.img_size, want_rle, want_bitmask,
                                    /*stream=*/nullptr, /*want_rle_string=*/want_rle_string && gpu_rle_string_,
                                    /*want_rle_counts=*/rle_counts_with_string);
  }
  // The original's float32 arithmetic in plain LibTorch, on the engine's device.
  return kernels::MaskPostprocessReference(logits.to(at::kFloat).contiguous(), geometry, config_.img_size,
                                           want_rle, want_bitmask);
}

}  // namespace maskd
