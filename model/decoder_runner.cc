// EngineImpl's jagged mask decoder: prompts of many images in one pass per sparse-token count, each
// pass replaying a CUDA graph captured per (prompt bucket, token count), or running eagerly. With the
// shared-image decoder (FastPathOptions::shared_image_decoder) a pass groups its prompts by
// embedding, so each image's side is computed once. Items are checked one by one: a bad item gets its
// own status and the others still decode.
#include "model/engine_impl.h"

#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/kernels.h"
#include "model/batch_plan.h"
#include "model/memory_scope.h"

namespace maskd {

// Prompt counts a decoder graph is captured for; larger batches run eagerly (launch overhead is
// amortised there anyway). Token counts above kMaxGraphTokens run eagerly too.
constexpr int64_t kDecoderGraphBuckets[] = {1, 2, 4, 8, 16, 32, 64};
constexpr int64_t kMaxGraphTokens = 16;
constexpr size_t kMaxDecoderGraphs = 64;

// The smallest graph bucket that holds n (0: none does).
int64_t GraphBucket(int64_t n) {
  for (int64_t b : kDecoderGraphBuckets)
    if (b >= n) return b;
  return 0;
}

#ifdef MASKD_WITH_CUDA
// Captures run() into `graph` (CaptureGraph, which ends a broken-off capture). Out of memory for
// the graph's private pool: nullopt after a warning, and the caller caches nothing (its graph is
// dropped with the half-captured work), runs this pass eagerly, and a later pass tries again.
template <typename Run>
std::optional<MaskDecoderImpl::Output> CaptureDecoderGraph(at::cuda::CUDAGraph& graph, c10::MempoolId_t pool,
                                                          Run&& run, const LogFn& log, int64_t prompts,
                                                          int64_t tokens) {
  try {
    return CaptureGraph(graph, pool, run);
  } catch (const c10::Error& e) {
    if (!IsOutOfMemory(e)) throw;
    ReleaseCachedDeviceMemory();
    log(LogLevel::kWarning, "out of device memory while capturing the decoder graph for " +
                                std::to_string(prompts) + " prompts of " + std::to_string(tokens) +
                                " tokens; running the pass eagerly: " + e.what_without_backtrace());
    return std::nullopt;
  }
}

std::map<EngineImpl::DecoderGraphKey, EngineImpl::DecoderGraph>::iterator EngineImpl::CaptureAndCacheDecoderGraph(
    const DecoderGraphKey& key, DecoderGraph g, const std::function<MaskDecoderImpl::Output()>& run) {
  run();  // warm-up outside the capture
  c10::cuda::getCurrentCUDAStream().synchronize();
  if (!decoder_pool_) decoder_pool_ = at::cuda::graph_pool_handle();
  g.graph = std::make_unique<at::cuda::CUDAGraph>();
  // A pool whose capture broke off cannot take another one: PyTorch's allocator keeps the pool's
  // entry with a use count of 0 and asserts in create_or_incref_pool at the next capture_begin
  // (model_oom_gpu_test on the H200, run 15). The graphs already captured keep their reference to
  // the old pool; the next capture gets a fresh one.
  std::optional<MaskDecoderImpl::Output> out;
  try {
    out = CaptureDecoderGraph(*g.graph, *decoder_pool_, run, options_.log, std::get<0>(key), std::get<1>(key));
  } catch (...) {
    decoder_pool_.reset();
    throw;
  }
  if (!out) {
    decoder_pool_.reset();
    return decoder_graphs_.end();
  }
  g.masks = out->masks;
  g.iou = out->iou_predictions;
  return decoder_graphs_.emplace(key, std::move(g)).first;
}
#endif

at::Tensor EngineImpl::Upload(const at::Tensor& host) const {
  if (!device_.is_cuda()) return host.to(device_);
  // pin_memory() copies into a block of the caching host allocator, which keeps it until the
  // non-blocking copy recorded on the stream has run.
  return host.pin_memory().to(device_, /*non_blocking=*/true);
}

std::optional<MaskDecoderImpl::Output> EngineImpl::ReplayDecoderGraph(const at::Tensor& image_side, bool per_prompt,
                                                                      const at::Tensor& sparse,
                                                                      const at::Tensor& group_of,
                                                                      const DecoderPassFn& run) {
#ifdef MASKD_WITH_CUDA
  const int64_t G = sparse.size(0), T = sparse.size(1);
  if (!device_.is_cuda() || !options_.fast.cuda_graphs || T > kMaxGraphTokens) return std::nullopt;
  const int64_t bucket = GraphBucket(G);
  if (bucket == 0) return std::nullopt;
  // Several images: their keys padded to an image bucket (rows past the real ones are never
  // selected by a real prompt's group index, and every operation on them is per row).
  const bool grouped = group_of.defined();
  const int64_t images = grouped ? image_side.size(0) : 0;
  const int64_t image_bucket = grouped ? GraphBucket(images) : 0;
  if (grouped && image_bucket == 0) return std::nullopt;
  std::lock_guard<std::mutex> lock(decoder_graph_mu_);
  const auto key = std::make_tuple(bucket, T, image_bucket, false);
  auto it = decoder_graphs_.find(key);
  if (it == decoder_graphs_.end() && decoder_graphs_.size() < kMaxDecoderGraphs) {
    DecoderGraph g;
    std::vector<int64_t> shape = image_side.sizes().vec();
    if (per_prompt) shape[0] = bucket;
    if (grouped) shape[0] = image_bucket;
    // Graphs of one input shape share their static input (replays are serialised by the mutex), so
    // the graphs of many (prompt, token) buckets do not each hold up to 64 images' keys.
    auto [in, fresh] = decoder_graph_inputs_.try_emplace(shape);
    if (fresh) in->second = at::zeros(shape, image_side.options());
    g.src = in->second;
    g.sparse = at::zeros({bucket, T, sparse.size(2)}, sparse.options());
    if (grouped) g.group_of = at::zeros({bucket}, group_of.options());
    // The static inputs by value: g itself moves into the cache.
    auto pass = [&run, src = g.src, groups = g.group_of, sp = g.sparse] { return run(src, groups, sp); };
    it = CaptureAndCacheDecoderGraph(key, std::move(g), pass);
  }
  if (it == decoder_graphs_.end()) return std::nullopt;
  DecoderGraph& g = it->second;
  // Rows past G (and past the real images) keep whatever they held: every decoder operation is per
  // prompt row, and a padded prompt's group index is one this graph was given before (or 0).
  if (per_prompt || grouped) g.src.narrow(0, 0, image_side.size(0)).copy_(image_side);
  else g.src.copy_(image_side);
  g.sparse.narrow(0, 0, G).copy_(sparse);
  if (grouped) g.group_of.narrow(0, 0, G).copy_(group_of);
  g.graph->replay();
  return MaskDecoderImpl::Output{g.masks.narrow(0, 0, G).clone(), g.iou.narrow(0, 0, G).clone()};
#else
  (void)image_side, (void)per_prompt, (void)sparse, (void)group_of, (void)run;
  return std::nullopt;
#endif
}

std::optional<MaskDecoderImpl::Output> EngineImpl::ReplaySharedPromptGraph(const std::vector<at::Tensor>& images,
                                                                           const std::vector<float>& packed,
                                                                           int64_t G, int64_t T) {
#ifdef MASKD_WITH_CUDA
  if (!device_.is_cuda() || !options_.fast.cuda_graphs || !shared_dec_ || T > kMaxGraphTokens) return std::nullopt;
  const int64_t ng = static_cast<int64_t>(images.size()), width = 3 * T + 1;
  const int64_t bucket = GraphBucket(G), image_bucket = ng > 1 ? GraphBucket(ng) : 0;
  if (bucket == 0 || ng == 0 || (ng > 1 && image_bucket == 0)) return std::nullopt;
  TORCH_CHECK(static_cast<int64_t>(packed.size()) == G * width, "packed prompts: expected ", G * width, " values");
  // Packed on the host into one pinned buffer: one upload for coordinates, labels and groups.
  const at::Tensor host = at::from_blob(const_cast<float*>(packed.data()), {G, width}, at::kFloat).pin_memory();
  std::lock_guard<std::mutex> lock(decoder_graph_mu_);
  const auto key = std::make_tuple(bucket, T, image_bucket, true);
  auto it = decoder_graphs_.find(key);
  if (it == decoder_graphs_.end() && decoder_graphs_.size() < kMaxDecoderGraphs) {
    DecoderGraph g;
    // The static input is the images' keys ([images, HW, C], the no-mask dense embedding added):
    // written by one ImageSideKeys launch per replay, so the graph starts at the decoder.
    const std::vector<int64_t> shape = {std::max<int64_t>(image_bucket, 1), images[0].size(-2) * images[0].size(-1),
                                        images[0].size(-3)};
    auto [in, fresh] = decoder_graph_inputs_.try_emplace(shape);
    if (fresh) in->second = at::zeros(shape, images[0].options());
    g.src = in->second;
    // Padding rows: a "not a point" token on image row 0 (any valid values would do: every
    // operation is per prompt row).
    g.packed = at::zeros({bucket, width}, at::TensorOptions().dtype(at::kFloat).device(device_));
    g.packed.narrow(1, 2 * T, T).fill_(-1);
    // The static inputs by value: g itself moves into the cache.
    auto run = [this, packed = g.packed, keys = g.src, bucket, T, image_bucket]() {
      const at::Tensor coords = packed.narrow(1, 0, 2 * T).view({bucket, T, 2});
      const at::Tensor labels = packed.narrow(1, 2 * T, T).to(at::kLong);
      const at::Tensor sparse = sam_->prompt_encoder->EmbedTokens(coords, labels).to(dtype_);
      const at::Tensor groups = image_bucket > 0 ? packed.select(1, 3 * T).to(at::kLong) : at::Tensor();
      return shared_dec_->ForwardKeys(keys, groups, sparse);
    };
    it = CaptureAndCacheDecoderGraph(key, std::move(g), run);
  }
  if (it == decoder_graphs_.end()) return std::nullopt;
  DecoderGraph& g = it->second;
  kernels::ImageSideKeys(images, no_mask_, g.src);
  g.packed.narrow(0, 0, G).copy_(host, /*non_blocking=*/true);
  g.graph->replay();
  return MaskDecoderImpl::Output{g.masks.narrow(0, 0, G).clone(), g.iou.narrow(0, 0, G).clone()};
#else
  (void)images, (void)packed, (void)G, (void)T;
  return std::nullopt;
#endif
}

MaskDecoderImpl::Output EngineImpl::RunDecoder(const at::Tensor& src, const at::Tensor& sparse) {
  auto run = [this](const at::Tensor& s, const at::Tensor&, const at::Tensor& sp) {
    return sam_->mask_decoder->forward(s, dense_pe_, sp);
  };
  if (auto out = ReplayDecoderGraph(src, /*per_prompt=*/true, sparse, at::Tensor(), run)) return std::move(*out);
  return run(src, at::Tensor(), sparse);
}

MaskDecoderImpl::Output EngineImpl::RunSharedDecoder(const at::Tensor& keys, const at::Tensor& group_of,
                                                     const at::Tensor& sparse) {
  auto run = [this](const at::Tensor& k, const at::Tensor& groups, const at::Tensor& sp) {
    return shared_dec_->ForwardKeys(k, groups, sp);
  };
  const at::Tensor groups = keys.size(0) > 1 ? group_of : at::Tensor();
  if (auto out = ReplayDecoderGraph(keys, /*per_prompt=*/false, sparse, groups, run)) return std::move(*out);
  return run(keys, groups, sparse);
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
  return Guarded("running the mask decoder on " + Count(items.size(), "prompt", "prompts"), [&]() -> StatusOr<std::vector<StatusOr<DecodedPrompt>>> {
    MemoryScope scope("Decode");
    torch::NoGradGuard no_grad;
    CallStream cs(device_, decoder_priority_);
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
    // Each bucket in passes of equal size, at most decoder_max_pass_prompts each, with the prompts of
    // one image together where it takes several passes (SplitDecodePasses).
    // MASKD_DECODE_GROUP_PASSES=0 keeps the items' order instead (a same-binary comparison on the GPU host).
    static const bool group_passes = [] {
      const char* v = std::getenv("MASKD_DECODE_GROUP_PASSES");
      return !(v && std::string(v) == "0");
    }();
    std::vector<std::pair<int64_t, std::vector<size_t>>> passes;
    const size_t limit = options_.decoder_max_pass_prompts > 0 ? static_cast<size_t>(options_.decoder_max_pass_prompts) : 0;
    for (auto& [T, all] : buckets) {
      std::vector<int64_t> image_of;
      image_of.reserve(all.size());
      if (group_passes)
        for (size_t i : all)
          image_of.push_back(
              static_cast<int64_t>(reinterpret_cast<std::uintptr_t>(PayloadOf(*items[i].embedding).tensor.data_ptr())));
      for (auto& pass : SplitDecodePasses(all, image_of, limit)) passes.emplace_back(T, std::move(pass));
    }
    std::vector<Pending> pending;
    for (auto& [T, idx] : passes) {
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
      auto encode_prompts = [&]() {
        const at::Tensor c = Upload(at::from_blob(coords.data(), {G, T, 2}, at::kFloat));
        const at::Tensor l = Upload(at::from_blob(labels.data(), {G, T}, at::kLong));
        return sam_->prompt_encoder->EmbedTokens(c, l).to(dtype_);
      };
      if (shared_dec_) {
        // Groups of prompts with one image side: the prompts of one embedding without a mask input;
        // a prompt with a mask input is a group of its own (its dense embedding is its own).
        std::vector<at::Tensor> group_src, group_masks;
        std::vector<int64_t> group_of(static_cast<size_t>(G)), mask_groups;
        std::map<const void*, int64_t> by_embedding;
        size_t next_mask = 0;
        for (int64_t g = 0; g < G; ++g) {
          const auto& item = items[idx[g]];
          const at::Tensor& e = PayloadOf(*item.embedding).tensor;
          if (item.prompt.mask_input) {
            mask_groups.push_back(static_cast<int64_t>(group_src.size()));
            group_masks.push_back(mask_inputs[next_mask++]);
            group_of[g] = static_cast<int64_t>(group_src.size());
            group_src.push_back(e);
            continue;
          }
          auto [it, fresh] = by_embedding.emplace(e.data_ptr(), static_cast<int64_t>(group_src.size()));
          if (fresh) group_src.push_back(e);
          group_of[g] = it->second;
        }
        const int64_t ng = static_cast<int64_t>(group_src.size());
        if (mask_groups.empty()) {
          // Per prompt: T x/y pairs, T labels, its group (exact in float: labels -1..3, groups < 64).
          std::vector<float> packed(static_cast<size_t>(G * (3 * T + 1)));
          for (int64_t g = 0; g < G; ++g) {
            float* row = packed.data() + g * (3 * T + 1);
            std::copy_n(coords.data() + g * T * 2, 2 * T, row);
            for (int64_t t = 0; t < T; ++t) row[2 * T + t] = static_cast<float>(labels[static_cast<size_t>(g * T + t)]);
            row[3 * T] = static_cast<float>(group_of[static_cast<size_t>(g)]);
          }
          if (auto dec = ReplaySharedPromptGraph(group_src, packed, G, T)) {
            pending.push_back({dec->iou_predictions, dec->masks, idx});
            continue;
          }
        }
        const at::Tensor sparse = encode_prompts();
        at::Tensor keys;
        if (mask_groups.empty()) {
          const at::Tensor& e0 = group_src[0];
          keys = at::empty({ng, e0.size(-2) * e0.size(-1), e0.size(-3)}, e0.options());
          kernels::ImageSideKeys(group_src, no_mask_, keys);
        } else {
          at::Tensor src = at::stack(group_src);
          const at::Tensor dense_m = sam_->prompt_encoder->EmbedMasks(at::stack(group_masks).unsqueeze(1).to(dtype_));
          at::Tensor dense = no_mask_.expand({ng, -1, src.size(2), src.size(3)}).clone();
          dense.index_copy_(0, Upload(at::tensor(mask_groups, at::TensorOptions().dtype(at::kLong))), dense_m);
          keys = SharedImageDecoder::GroupKeys(src + dense);
        }
        const at::Tensor group_index =
            ng > 1 ? Upload(at::tensor(group_of, at::TensorOptions().dtype(at::kLong))) : at::Tensor();
        auto dec = RunSharedDecoder(keys, group_index, sparse);
        pending.push_back({dec.iou_predictions, dec.masks, idx});
        continue;
      }
      const at::Tensor sparse = encode_prompts();
      at::Tensor src = at::stack(embs);
      if (mask_rows.empty()) {
        src = src + no_mask_;
      } else {
        const at::Tensor m = at::stack(mask_inputs).unsqueeze(1).to(dtype_);
        const at::Tensor dense_m = sam_->prompt_encoder->EmbedMasks(m);
        at::Tensor dense = no_mask_.expand({G, -1, src.size(2), src.size(3)}).clone();
        const at::Tensor rows = Upload(at::tensor(mask_rows, at::TensorOptions().dtype(at::kLong)));
        dense.index_copy_(0, rows, dense_m);
        src = src + dense;
      }
      auto dec = RunDecoder(src, sparse);
      pending.push_back({dec.iou_predictions, dec.masks, idx});
    }
    // Every pass's mask copies are queued before the first score download synchronises, so the
    // host waits once, for work that is already all on the stream.
    // Per prompt: mask 0 (single mask) or masks 1..3 (multimask), for its logits and its scores.
    struct Selection {
      std::vector<int64_t> row, first, count;
    };
    std::vector<Selection> selected(pending.size());
    std::vector<std::vector<at::Tensor>> logits(pending.size());
    for (size_t k = 0; k < pending.size(); ++k) {
      const Pending& p = pending[k];
      const int64_t nt = p.scores.size(1);
      Selection& sel = selected[k];
      for (size_t g = 0; g < p.idx.size(); ++g) {
        const bool multi = items[p.idx[g]].prompt.multimask;
        sel.row.push_back(static_cast<int64_t>(g));
        sel.first.push_back(multi ? 1 : 0);
        sel.count.push_back(multi ? nt - 1 : 1);
      }
      // A copy of its own per prompt (one launch for all): a view would keep the whole batch's
      // [G, 4, 256, 256] alive for as long as any one result is stored, and bytes() would
      // under-count it.
      logits[k] = kernels::CopySlices(p.masks, sel.row, sel.first, sel.count);
    }
    for (size_t k = 0; k < pending.size(); ++k) {
      const Pending& p = pending[k];
      const Selection& sel = selected[k];
      const at::Tensor scores = p.scores.to(at::kCPU, at::kFloat).contiguous();
      const float* s = scores.data_ptr<float>();
      const int64_t nt = scores.size(1);
      for (size_t g = 0; g < p.idx.size(); ++g) {
        const float* row = s + static_cast<int64_t>(g) * nt + sel.first[g];
        DecodedPrompt d;
        d.scores.assign(row, row + sel.count[g]);
        d.logits = WrapMaskLogits(std::move(logits[k][g]));
        out[p.idx[g]] = std::move(d);
      }
    }
    cs.Sync();
    return out;
  });
}

}  // namespace maskd
