// The SAM inference engine as an abstract interface: what the server, the tools and every test
// engine program against. Torch-free (the server, clients and tools use spdlog, protobuf and gRPC,
// whose headers clash with those bundled in LibTorch), and free of link-time tricks: the real engine
// (libmaskd_model, model/engine_create.h) and each fake derive from Engine and nothing else.
//
// What a caller may rely on, whichever engine it holds:
// - No exception leaves an Engine method: failures come back as Status (INVALID_ARGUMENT for bad
//   prompts or images, INTERNAL for unexpected LibTorch/CUDA errors, with the cause in the message).
// - Running out of device memory (a full GPU, or EngineOptions::device_memory_limit_bytes) is
//   RESOURCE_EXHAUSTED, naming what was being done and its batch size with the allocator's message;
//   the engine has then released its cached blocks, caches no half-captured CUDA graph and stays
//   usable, so the caller may retry a smaller batch (the server's batchers split it in halves).
// - Every method is synchronous: when it returns, its device work is complete and its results can be
//   used from any thread. Methods may be called concurrently from different threads; each call runs
//   on a stream of its own (CUDA), so an encoder batch, a decoder batch and post-processing overlap.
// - Handles (PreparedImage, Embedding, MaskLogits) are values: a geometry and an immutable payload
//   that only the engine which made it reads. They may be shared between threads and keep their
//   device memory until the last copy goes away. Handing a handle to another engine is an error.
// - Coordinates are in original image pixels; masks come back at the original image size.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/api/enums.h"
#include "model/api/image.h"
#include "model/api/mask_generation.h"
#include "model/api/prompt.h"
#include "model/api/status.h"

namespace maskd {

// Where the engine's log lines go. The server routes them to spdlog; the default writes to stderr.
using LogFn = std::function<void(LogLevel, std::string_view)>;

// Start-up milestones of Engine::Create, for the server's cold-start timings (GetInfo.startup).
enum class StartupPhase {
  kCheckpointRead,  // checkpoint read and its tensors in the (CPU) model; the demo: weights made
  kWeightsReady,    // converted to the serving precision and placed on the device, fast path built
  kWarmedUp,        // warm-up done (CUDA graphs captured); reported also when warm-up is off
};
using StartupPhaseFn = std::function<void(StartupPhase)>;

// Encoder/decoder optimisations. Each can be switched on its own (maskbench's waterfall does); the
// CUDA-only ones are ignored on CPU, which always runs the exact original arithmetic in fp32 unless
// asked otherwise.
struct FastPathOptions {
  AttentionImpl attention = AttentionImpl::kAuto;
  // Capture the encoder at each EngineOptions::encoder_batch_sizes and the decoder at bucketed
  // prompt counts in CUDA graphs, replayed with static, padded inputs.
  bool cuda_graphs = false;
  // (int8 dynamic quantisation and 2:4 sparsity of the encoder linears were retired: both slower
  // than bf16 on H200, run 17; the 2:4 kernel also missed the mask IoU bar. See BENCHMARKS.md.)
  // fp8 (e4m3) encoder linears with row-wise scales (Hopper fp8 tensor cores via at::_scaled_mm),
  // weights quantised once at load, activations per token at each call. Opt-in (an accuracy
  // trade, reported by maskbench against fp32); bf16 precision on CUDA only.
  bool fp8 = false;
  // Resize/normalise/pad on the device from uint8 (bit-exact with the CPU resize).
  bool gpu_preprocess = false;
  // Upscale/crop/threshold masks and encode COCO RLE on the device.
  bool gpu_postprocess = false;
  // With gpu_postprocess: COCO's RLE string made on the device too, so the host only copies bytes
  // (instead of encoding ~10^4-10^5 runs of a noisy mask per call on the CPU). On in Fast(): the
  // kernels_gpu mask tests (the device string equals the CPU encoder's, mask by mask) passed on the
  // H200 in run 13.
  bool gpu_rle_string = false;
  // Mask decoding, post-processing and generation filters on high-priority CUDA streams, the encoder
  // on normal ones, meant to let a decoder kernel start as SMs free up instead of queueing behind an
  // encoder batch. Changes only the order of work, never its result. Off, also in Fast(): run 14's
  // served batch sweep (vit_b, 64 clients) gave 140.1 img/s with it against 165.1 without, and its
  // decoder batches still took ~150 ms each under the encoder's load.
  bool decoder_priority = false;
  // The encoder blocks' element-wise work in two fused kernels each (residual add + LayerNorm +
  // window partition/unpartition) and, with the fused attention, the rel-pos terms as one matmul
  // read in place. Same arithmetic as without (bit-for-bit up to the LayerNorm's summation order).
  bool fuse_encoder_ops = false;
  // fc1's bias + GELU in the cuBLASLt GEMM epilogue. cuBLASLt's GELU is the tanh approximation, not
  // the erf form of SAM's nn.GELU: a difference below bf16 rounding for most activations (maskbench
  // reports the logit and mask differences against fp32). Needs fuse_encoder_ops; CUDA only.
  bool gelu_epilogue = false;
  // The mask decoder with the image side shared between the prompts of one image (the first block's
  // keys, values and image queries once per image; model/fast_decoder.h) and the positional
  // encoding's share of each projection precomputed. The same function up to floating-point
  // reassociation; CPU or CUDA.
  bool shared_image_decoder = false;
  // The decoder's token-side attentions (a prompt's few tokens against its 4096 positions, and the
  // tokens' self-attention) on kernels::FewQueryAttention, split over the keys, instead of SDPA,
  // whose flash kernel tiles 64 queries per block and gives a click 8 blocks. The same function with
  // fp32 softmax; CUDA, bf16/fp16 only.
  bool decoder_attention_kernel = false;
  // With fuse_encoder_ops and the fused attention: the rel-pos terms made inside the attention
  // kernel from the (tiny) reversed tables, instead of a [B, heads, N, L] matmul product and a
  // contiguous copy of q per block. Same arithmetic in fp32 (the terms are no longer rounded to
  // bf16 before the softmax). CUDA only.
  bool rel_pos_in_kernel = false;
  // With rel_pos_in_kernel: windowed blocks keep their tokens raster and the attention kernel makes
  // the windows (SAM's zero padding: a padded key/value is qkv's bias), so qkv and proj run on the
  // image's tokens only (vit_b/h: 4096 instead of 4900 per image). CUDA only.
  bool windows_in_kernel = false;
  // With fuse_encoder_ops: the residual adds of blocks whose attention output is raster (global
  // blocks; windowed ones with windows_in_kernel) in proj's and fc2's GEMM epilogues (cuBLASLt,
  // beta = 1) instead of in the LayerNorm kernels, which then read the residual stream alone and
  // write only the normalised tokens. The same encoder output bits (run 43's GPU test). CUDA only.
  bool residual_in_gemm = false;
  // The encoder's linear layers (cuBLASLt) with each shape's algorithm chosen by timing the
  // heuristic's candidates at its first (warm-up) call, instead of the heuristic's first (LibTorch's
  // choice, the same on every start). Process-wide: the last engine prepared sets it. CUDA only.
  bool gemm_tuning = false;
  // With the fused attention: the global blocks' attention at each encoder batch size timed both
  // ways at start-up, the fused kernel against cuDNN's attention with the rel-pos terms folded into
  // q and k (AttentionImpl::kSdpaFolded, in chunks of <= 256 MiB of workspace), and the faster kept
  // for that size (the fused one unless the folded one is >= 3 % faster: the fused kernel keeps the
  // rel-pos terms in fp32, the folded one rounds them to the model's bf16 / fp16). The table is logged; the sizes that
  // run folded are in GetInfo's optimisations ("global-attention-folded@1,2"). Not part of the
  // engine's identity: like the attention implementations, the two differ by bf16 rounding, and the
  // choice may differ between starts. MASKD_GLOBAL_ATTENTION=fused|folded (a benchmarking and test
  // knob) takes that way at every size without timing. CUDA only.
  bool attention_timing = false;

  // Everything that helps on CUDA: fused attention, graphs, GPU pre/post-processing (not fp8,
  // which trades accuracy for speed and is opt-in).
  static FastPathOptions Fast();
};

// One prepared encoder batch size and the seconds a pass of it takes (<= 0: unknown).
struct EncoderBatchCost {
  int batch_size = 0;
  double seconds = 0;
  // Not replayed: the per-image cost of the largest measured size times batch_size
  // (ExtrapolateFlatEncoderCosts, model/batch_plan.h).
  bool extrapolated = false;
};

struct EngineOptions {
  // A SAM checkpoint: official .pth (torch.save of the state dict) or .safetensors. Empty: seeded
  // random weights of `random_arch` (its masks are meaningless).
  std::string checkpoint;
  // Without a checkpoint: "tiny" (the built-in demo model: the golden reference encoder shape) or
  // "vit_b", "vit_l", "vit_h" (random weights of a released shape, for benchmarks).
  std::string random_arch = "tiny";
  // "cpu", "cuda" (= "cuda:0") or "cuda:N".
  std::string device = "cpu";
  Precision precision = Precision::kFloat32;
  FastPathOptions fast;
  // Encoder batch sizes prepared (CUDA graphs) up front; Encode covers a batch with them at the
  // least cost (see encoder_batch_seconds), padding the last pass on CUDA. Must be >= 1; sorted and
  // deduplicated by the engine.
  std::vector<int> encoder_batch_sizes = {1};
  // Seconds per pass of each encoder_batch_sizes entry (in ascending size order) to plan with; empty:
  // measured at warm-up on CUDA with graphs, else every pass counts the same (the fewest passes).
  std::vector<double> encoder_batch_seconds;
  // The most prompts of one token count that DecodeEach runs in one decoder pass; more run in
  // passes of equal size up to this (0: no limit). The decoder's activations grow ~10 MB per prompt
  // ([prompts, 4096, 384] projections), so 233 prompts in one pass took 2.3 GB, more than the vit_b
  // encoder at batch 32 with its weights (run 17's memory account); 64 is the largest prompt count
  // with a CUDA graph, and per-prompt throughput is flat from there.
  int decoder_max_pass_prompts = 64;
  // Seed of the demo model's weights.
  uint64_t demo_seed = 0x5eed;
  // fp32 on CUDA: TF32 off for matmuls and cuDNN, so fp32 means fp32 (golden parity needs it).
  bool strict_fp32 = true;
  // Run one warm-up pass of each prepared shape in Create (so that the first request is not slow).
  bool warmup = true;
  // CUDA: the most bytes LibTorch's caching allocator may hold on this device (weights, graphs,
  // cached embeddings, activations; not the CUDA context), set before the weights are loaded with
  // SetDeviceMemoryLimit (model/engine_create.h). 0: no limit. Beyond it a call fails with
  // RESOURCE_EXHAUSTED, as when the device is full. Ignored (with a warning) on CPU.
  uint64_t device_memory_limit_bytes = 0;
  LogFn log;
  // Told each StartupPhase once, in order, on the thread running Create; may be empty.
  StartupPhaseFn on_startup_phase;
};

// The model's shape, as read from the checkpoint.
struct ModelDescription {
  std::string arch;  // vit_b | vit_l | vit_h | custom
  std::string checkpoint;
  bool demo = false;
  int embed_dim = 0, depth = 0, num_heads = 0, patch_size = 0, window_size = 0, image_size = 0;
  int mlp_dim = 0, out_chans = 0;
  std::vector<int> global_attn_indexes;
  uint64_t parameter_count = 0;
  // Hex digest over the weights, precision and numerics-changing options.
  std::string identity;
};

// What an engine keeps behind a handle (its tensors, or a fake's numbers). Each engine derives its
// own payload types and reads back only the payloads it made (EngineImpl: model/engine_handles.h).
class HandlePayload {
 public:
  virtual ~HandlePayload() = default;
};

// An image ready for the encoder: resized so its longest side is the model's input size
// (Pillow-exact antialiased bilinear), normalised and padded; or, with gpu_preprocess, the uint8
// pixels on the device, resized there.
class PreparedImage {
 public:
  PreparedImage(ImageGeometry geometry, std::shared_ptr<const HandlePayload> payload)
      : geometry_(geometry), payload_(std::move(payload)) {}
  const ImageGeometry& geometry() const { return geometry_; }
  int original_width() const { return geometry_.original_width; }
  int original_height() const { return geometry_.original_height; }
  // Size after the longest-side resize, before padding.
  int input_width() const { return geometry_.input_width; }
  int input_height() const { return geometry_.input_height; }
  const HandlePayload* payload() const { return payload_.get(); }

 private:
  ImageGeometry geometry_;
  std::shared_ptr<const HandlePayload> payload_;
};

// The image encoder's output for one image (256 x 64 x 64 for SAM) on the engine's device (or in host
// memory after Engine::ToHost).
class Embedding {
 public:
  class Payload : public HandlePayload {
   public:
    virtual size_t bytes() const = 0;
    virtual bool on_host() const = 0;
    virtual std::vector<float> ToFloat() const = 0;
    virtual std::vector<int64_t> shape() const = 0;
  };
  Embedding(ImageGeometry geometry, std::shared_ptr<const Payload> payload)
      : geometry_(geometry), payload_(std::move(payload)) {}
  const ImageGeometry& geometry() const { return geometry_; }
  int original_width() const { return geometry_.original_width; }
  int original_height() const { return geometry_.original_height; }
  int input_width() const { return geometry_.input_width; }
  int input_height() const { return geometry_.input_height; }
  // Bytes of tensor memory held.
  size_t bytes() const { return payload_->bytes(); }
  // True when ToHost moved it off a CUDA device (the cache's host tier); never for CPU engines,
  // whose embeddings live in host memory as their device memory.
  bool on_host() const { return payload_->on_host(); }
  // The values as float32, C x H x W (for tests and verification tools; copies).
  std::vector<float> ToFloat() const { return payload_->ToFloat(); }
  std::vector<int64_t> shape() const { return payload_->shape(); }
  const Payload& payload() const { return *payload_; }

 private:
  ImageGeometry geometry_;
  std::shared_ptr<const Payload> payload_;
};

// Low-resolution mask logits (N x 256 x 256) of one prompt's masks, on the engine's device.
class MaskLogits {
 public:
  class Payload : public HandlePayload {
   public:
    virtual int num_masks() const = 0;
    virtual int height() const = 0;
    virtual int width() const = 0;
    virtual size_t bytes() const = 0;
    virtual std::vector<float> ToFloat() const = 0;
  };
  explicit MaskLogits(std::shared_ptr<const Payload> payload) : payload_(std::move(payload)) {}
  int num_masks() const { return payload_->num_masks(); }
  int height() const { return payload_->height(); }  // 256
  int width() const { return payload_->width(); }    // 256
  size_t bytes() const { return payload_->bytes(); }
  // Values as float32, N x H x W, row-major (copies).
  std::vector<float> ToFloat() const { return payload_->ToFloat(); }
  const Payload& payload() const { return *payload_; }

 private:
  std::shared_ptr<const Payload> payload_;
};

struct DecodeItem {
  std::shared_ptr<const Embedding> embedding;
  PromptSpec prompt;
};

struct DecodedPrompt {
  // Predicted IoU per mask (3 for multimask, else 1).
  std::vector<float> scores;
  // The masks' low-res logits (same order as scores).
  std::shared_ptr<const MaskLogits> logits;
};

struct PostprocessItem {
  std::shared_ptr<const MaskLogits> logits;
  // Geometry of the image the logits belong to.
  int original_width = 0, original_height = 0;
  int input_width = 0, input_height = 0;
  MaskEncoding encoding = MaskEncoding::kRle;
  // kRle: where the device makes COCO's string, leave it where it landed (MaskData::rle_view) rather
  // than copy it into MaskData::rle_string, so that the caller copies it out on its own threads.
  bool rle_in_place = false;
};

struct MaskData {
  float stability_score = 0;
  // Tight box (x, y, width, height), zero for an empty mask.
  std::array<uint32_t, 4> bbox{};
  uint64_t area = 0;
  // kRle: the counts, unless the device made rle_string (then empty: only the string crosses to
  // the host, and every consumer sends the string; model/io/rle.h converts between the two).
  std::vector<uint32_t> rle_counts;
  // kRle, when the device made COCO's compressed counts string (else empty: an RLE string is never
  // empty, it holds at least one count).
  std::string rle_string;
  // kRle with PostprocessItem::rle_in_place, when the device made the string: it is rle_view, in host
  // memory shared by the call's masks that rle_owner keeps alive (rle_string stays empty). The whole
  // call's buffer (room for the longest strings possible) stays allocated while any owner lives.
  std::string_view rle_view;
  std::shared_ptr<const void> rle_owner;
  std::vector<uint8_t> bitmask;      // kBitmask
};

// An embedding copied out for a client (maskd.v1.ImageEmbedding): [1, C, h, w] values of `dtype`,
// little-endian, C order. bf16 and fp16 are the engine's values rounded to nearest even (through
// fp32 when the engine runs in another 16-bit type): exactly FloatToBf16 / FloatToHalf
// (model/api/half.h) of the fp32 export.
struct ExportedEmbedding {
  Precision dtype = Precision::kFloat32;
  std::vector<int64_t> shape;
  std::string data;
};

// Automatic mask generation's model-side step for one batch of grid points on one crop
// (model/api/mask_generator.h drives it): the original's _process_batch after the decoder.
struct MaskFilterRequest {
  // One multimask result per grid point, in point order.
  std::vector<DecodedPrompt> decoded;
  // The crop image the points were decoded on (original_* = the crop's size).
  ImageGeometry crop;
  // Where the crop lies in the image, and the image's size.
  CropBox crop_box{};
  int image_width = 0, image_height = 0;
  float pred_iou_thresh = 0, stability_score_thresh = 0, stability_score_offset = 1;
  float mask_threshold = 0;
};

// A mask that passed the filters, in the order of the original (point-major, then mask).
struct MaskCandidate {
  int prompt = 0, mask = 0;  // indices into MaskFilterRequest::decoded and its masks
  float predicted_iou = 0, stability_score = 0;
  // x0, y0, x1, y1 with x1/y1 the last set column/row, in the crop's frame (the original's boxes
  // before uncrop_boxes_xyxy).
  std::array<int, 4> box{};
  uint64_t area = 0;
  // COCO RLE counts of the mask placed in the whole image (image_width x image_height).
  std::vector<uint32_t> rle_counts;
};

struct DeviceMemoryStats {
  uint64_t allocated = 0, peak_allocated = 0, reserved = 0, total = 0;
};

class Engine {
 public:
  // The real engine: loads the checkpoint (or builds the demo model), moves it to the device,
  // prepares the fast path and warms it up. Declared here so that programs keep one spelling;
  // defined by libmaskd_model (model/engine_create.cc), so only programs linking it may call it.
  // Test engines are constructed directly.
  static StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  virtual ~Engine() = default;

  virtual const ModelDescription& description() const = 0;
  virtual const EngineOptions& options() const = 0;
  // "cpu", "cuda:0", ...
  virtual std::string device() const = 0;
  // e.g. "NVIDIA H200" or "cpu".
  virtual std::string device_name() const = 0;
  // Optimisations in effect ("sdpa-folded", "fused-relpos-attention", "cuda-graphs", "fp8", ...).
  virtual std::vector<std::string> optimisations() const = 0;
  // Largest batch Encode runs in one pass.
  virtual int max_encoder_batch() const = 0;

  // Switches the fast path (attention, graphs, fp8, GPU pre/post-processing) of a created
  // engine, e.g. for the benchmark waterfall; re-derives quantised weights from the dense ones and
  // recaptures graphs. Must not overlap any other call on this engine. The identity changes when the
  // numerics do (fp8).
  virtual Status Reconfigure(const FastPathOptions& fast) {
    (void)fast;
    return FailedPrecondition("this engine cannot be reconfigured");
  }

  // CPU work (plus an upload with gpu_preprocess): the longest-side resize, normalisation, padding.
  virtual StatusOr<PreparedImage> Prepare(const ImageRGB8& image) = 0;
  // For parity checks: an image already resized (e.g. the golden `input_resized`), with the
  // original size it came from.
  virtual StatusOr<PreparedImage> PrepareResized(const ImageRGB8& resized, int original_width,
                                                 int original_height) = 0;

  // Runs the image encoder on a batch (any size; split and padded to the prepared batch sizes).
  virtual StatusOr<std::vector<std::shared_ptr<const Embedding>>> Encode(
      const std::vector<PreparedImage>& images) = 0;

  // Prompt encoder + mask decoder over a jagged batch: prompts of any number of images, any point
  // counts, boxes, mask inputs and multimask flags, in one pass per token-count bucket. Results are
  // in item order and equal (within floating-point tolerance) decoding each prompt alone. An item
  // the engine refuses (no embedding, a host-tier embedding, a prompt ValidatePrompt rejects) gets
  // its own error and the others still decode; the outer status fails the whole pass (device errors).
  virtual StatusOr<std::vector<StatusOr<DecodedPrompt>>> DecodeEach(const std::vector<DecodeItem>& items) = 0;
  // DecodeEach, all or nothing: the first item's error, else every result.
  StatusOr<std::vector<DecodedPrompt>> Decode(const std::vector<DecodeItem>& items);

  // The prepared encoder batch sizes with the seconds one pass of each takes (measured at warm-up on
  // CUDA with graphs, or as given in EngineOptions::encoder_batch_seconds; 0 = not measured). Encode
  // splits a batch by the cheapest cover (model/batch_plan.h).
  virtual std::vector<EncoderBatchCost> encoder_batch_costs() const { return {}; }

  // Upscales, crops and thresholds masks to the original size and encodes them; one MaskData per
  // mask of every item, in order.
  virtual StatusOr<std::vector<std::vector<MaskData>>> Postprocess(
      const std::vector<PostprocessItem>& items) = 0;

  // Upscales a point batch's masks to the crop, keeps those with predicted IoU > pred_iou_thresh
  // (when > 0) and stability score >= stability_score_thresh (when > 0; the score from the logits
  // with stability_score_offset), thresholds them, boxes them, drops boxes near a crop edge that is
  // not an image edge (20 px), and RLE-encodes the survivors in the whole image's frame. On the
  // engine's device. Engines without it (test fakes) answer FAILED_PRECONDITION.
  virtual StatusOr<std::vector<MaskCandidate>> FilterMasks(const MaskFilterRequest& request) {
    (void)request;
    return FailedPrecondition("this engine cannot generate masks");
  }
  // Greedy box NMS (BoxNmsHost's contract: kept indices by descending score, ties in index order).
  // The real engine runs it on its device; the default runs BoxNmsHost.
  virtual StatusOr<std::vector<int>> BoxNms(const std::vector<std::array<float, 4>>& boxes,
                                            const std::vector<float>& scores, float iou_threshold) {
    return BoxNmsHost(boxes, scores, iou_threshold);
  }

  // Moves an embedding to host memory (pinned where possible) and back to the device.
  virtual StatusOr<std::shared_ptr<const Embedding>> ToHost(const Embedding& e) = 0;
  virtual StatusOr<std::shared_ptr<const Embedding>> ToDevice(const Embedding& e) = 0;

  // Client-supplied low-res logits (1 x 256 x 256 values) for PromptSpec::mask_input.
  virtual StatusOr<std::shared_ptr<const MaskLogits>> MakeMaskLogits(const float* values, int height,
                                                                     int width) = 0;

  // The embedding's values converted to `dtype` on its device (CUDA: one device-to-host copy of the
  // converted tensor), for returning to a client; works on host-tier embeddings too. Bytes of memory
  // it takes: the returned data, plus the converted tensor on the device while it runs.
  virtual StatusOr<ExportedEmbedding> ExportEmbedding(const Embedding& e, Precision dtype) {
    (void)e;
    (void)dtype;
    return FailedPrecondition("this engine cannot export embeddings");
  }

  virtual DeviceMemoryStats memory() const = 0;
  virtual void ResetPeakMemory() = 0;
};

}  // namespace maskd
