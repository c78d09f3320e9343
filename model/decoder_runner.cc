// EngineImpl's jagged mask decoder: prompts of many images in one pass per sparse-token count, each
// pass replaying a CUDA graph captured per (prompt bucket, token count), or running eagerly. Items are
// checked one by one: a bad item gets its own status and the others still decode.
#include "model/engine_impl.h"

namespace maskd {

// Prompt counts a decoder graph is captured for; larger batches run eagerly (launch overhead is
// amortised there anyway). Token counts above kMaxGraphTokens run eagerly too.
constexpr int64_t kDecoderGraphBuckets[] = {1, 2, 4, 8, 16, 32, 64};
constexpr int64_t kMaxGraphTokens = 16;
constexpr size_t kMaxDecoderGraphs = 64;

MaskDecoderImpl::Output EngineImpl::RunDecoder(const at::Tensor& src, const at::Tensor& sparse) {
#ifdef MASKD_WITH_CUDA
  const int64_t G = sparse.size(0), T = sparse.size(1);
  if (device_.is_cuda() && options_.fast.cuda_graphs && T <= kMaxGraphTokens) {
    int64_t bucket = 0;
    for (int64_t b : kDecoderGraphBuckets)
      if (b >= G) {
        bucket = b;
        break;
      }
    if (bucket > 0) {
      std::lock_guard<std::mutex> lock(decoder_graph_mu_);
      auto it = decoder_graphs_.find({bucket, T});
      if (it == decoder_graphs_.end() && decoder_graphs_.size() < kMaxDecoderGraphs) {
        DecoderGraph g;
        g.src = at::zeros({bucket, src.size(1), src.size(2), src.size(3)}, src.options());
        g.sparse = at::zeros({bucket, T, sparse.size(2)}, sparse.options());
        sam_->mask_decoder->forward(g.src, dense_pe_, g.sparse);  // warm-up outside the capture
        c10::cuda::getCurrentCUDAStream().synchronize();
        if (!decoder_pool_) decoder_pool_ = at::cuda::graph_pool_handle();
        g.graph = std::make_unique<at::cuda::CUDAGraph>();
        g.graph->capture_begin(*decoder_pool_, cudaStreamCaptureModeThreadLocal);
        auto out = sam_->mask_decoder->forward(g.src, dense_pe_, g.sparse);
        g.graph->capture_end();
        g.masks = out.masks;
        g.iou = out.iou_predictions;
        it = decoder_graphs_.emplace(std::make_pair(bucket, T), std::move(g)).first;
      }
      if (it != decoder_graphs_.end()) {
        DecoderGraph& g = it->second;
        // Rows past G keep whatever they held: every decoder operation is per row.
        g.src.narrow(0, 0, G).copy_(src);
        g.sparse.narrow(0, 0, G).copy_(sparse);
        g.graph->replay();
        return {g.masks.narrow(0, 0, G).clone(), g.iou.narrow(0, 0, G).clone()};
      }
    }
  }
#endif
  return sam_->mask_decoder->forward(src, dense_pe_, sparse);
}

Status EngineImpl::CheckDecodeItem(const DecodeItem& item, size_t i) const {
  if (!item.embedding) return InvalidArgument("decode item " + std::to_string(i) + " has no embedding");
  const Embedding& e = *item.embedding;
  MASKD_RETURN_IF_ERROR(ValidatePrompt(item.prompt, e.original_width(), e.original_height(),
                                       "prompts[" + std::to_string(i) + "]"));
  if (e.on_host())
    return FailedPrecondition("decode item " + std::to_string(i) +
                              " has a host-tier embedding; move it with ToDevice first");
  return Status::Ok();
}

StatusOr<std::vector<StatusOr<DecodedPrompt>>> EngineImpl::DecodeEach(const std::vector<DecodeItem>& items) {
  // A refused item keeps its error; only the others go into the buckets.
  std::vector<StatusOr<DecodedPrompt>> checked;
  std::vector<bool> good(items.size());
  checked.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    Status s = CheckDecodeItem(items[i], i);
    good[i] = s.ok();
    checked.push_back(s.ok() ? StatusOr<DecodedPrompt>(Internal("decode item " + std::to_string(i) +
                                                               " was not decoded"))
                             : StatusOr<DecodedPrompt>(std::move(s)));
  }
  return Guarded("running the mask decoder", [&]() -> StatusOr<std::vector<StatusOr<DecodedPrompt>>> {
    torch::NoGradGuard no_grad;
    CallStream cs(device_);
    std::vector<StatusOr<DecodedPrompt>> out = checked;
    // Bucket by sparse token count: the decoder attends over every token without a mask, so only
    // prompts with equal counts can share a pass (the original's padding token is part of a
    // point-only prompt's own count).
    std::map<int64_t, std::vector<size_t>> buckets;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!good[i]) continue;
      const auto& p = items[i].prompt;
      const int64_t t = static_cast<int64_t>(p.points.size()) + (p.box ? 2 : 1);
      buckets[t].push_back(i);
    }
    struct Pending {
      at::Tensor scores;  // [G, 4] on device
      at::Tensor masks;   // [G, 4, 256, 256]
      std::vector<size_t> idx;
    };
    std::vector<Pending> pending;
    for (auto& [T, idx] : buckets) {
      const int64_t G = static_cast<int64_t>(idx.size());
      // Flat prompt tensors in the model's input frame: the original transforms coordinates in
      // float64 (numpy) and then uses them as float32.
      std::vector<float> coords(static_cast<size_t>(G * T * 2), 0.f);
      std::vector<int64_t> labels(static_cast<size_t>(G * T), -1);
      std::vector<at::Tensor> embs;
      std::vector<int64_t> mask_rows;
      std::vector<at::Tensor> mask_inputs;
      for (int64_t g = 0; g < G; ++g) {
        const auto& item = items[idx[g]];
        const Embedding& e = *item.embedding;
        const double sx = static_cast<double>(e.input_width()) / e.original_width();
        const double sy = static_cast<double>(e.input_height()) / e.original_height();
        int64_t t = 0;
        auto put = [&](double x, double y, int64_t label) {
          const size_t k = static_cast<size_t>(g * T + t);
          coords[2 * k] = static_cast<float>(x * sx);
          coords[2 * k + 1] = static_cast<float>(y * sy);
          labels[k] = label;
          ++t;
        };
        for (const auto& pt : item.prompt.points) put(pt.x, pt.y, pt.label);
        if (item.prompt.box) {
          put(item.prompt.box->x0, item.prompt.box->y0, 2);
          put(item.prompt.box->x1, item.prompt.box->y1, 3);
        } else {
          ++t;  // the "not a point" token: coordinates (0, 0), label -1
        }
        embs.push_back(PayloadOf(e).tensor);
        if (item.prompt.mask_input) {
          mask_rows.push_back(g);
          mask_inputs.push_back(PayloadOf(*item.prompt.mask_input).tensor[item.prompt.mask_input_index]);
        }
      }
      const at::Tensor c = at::from_blob(coords.data(), {G, T, 2}, at::kFloat).to(device_);
      const at::Tensor l = at::from_blob(labels.data(), {G, T}, at::kLong).to(device_);
      const at::Tensor sparse = sam_->prompt_encoder->EmbedTokens(c, l).to(dtype_);
      at::Tensor src = at::stack(embs);
      if (mask_rows.empty()) {
        src = src + no_mask_;
      } else {
        const at::Tensor m = at::stack(mask_inputs).unsqueeze(1).to(dtype_);
        const at::Tensor dense_m = sam_->prompt_encoder->EmbedMasks(m);
        at::Tensor dense = no_mask_.expand({G, -1, src.size(2), src.size(3)}).clone();
        const at::Tensor rows = at::tensor(mask_rows, at::TensorOptions().dtype(at::kLong)).to(device_);
        dense.index_copy_(0, rows, dense_m);
        src = src + dense;
      }
      auto dec = RunDecoder(src, sparse);
      pending.push_back({dec.iou_predictions, dec.masks, idx});
    }
    for (auto& p : pending) {
      const at::Tensor scores = p.scores.to(at::kCPU, at::kFloat).contiguous();
      const float* s = scores.data_ptr<float>();
      const int64_t nt = scores.size(1);
      for (size_t g = 0; g < p.idx.size(); ++g) {
        const bool multi = items[p.idx[g]].prompt.multimask;
        const int64_t first = multi ? 1 : 0, count = multi ? nt - 1 : 1;
        DecodedPrompt d;
        d.scores.assign(s + g * nt + first, s + g * nt + first + count);
        // A copy of its own: a view would keep the whole batch's [G, 4, 256, 256] alive for as long
        // as any one result is stored, and bytes() would under-count it.
        d.logits = WrapMaskLogits(p.masks[static_cast<int64_t>(g)].narrow(0, first, count).clone());
        out[p.idx[g]] = std::move(d);
      }
    }
    cs.Sync();
    return out;
  });
}

}  // namespace maskd
