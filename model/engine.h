// The SAM inference engine: the one public, torch-free interface of libmaskd_model.
//
// Everything LibTorch stays inside the shared library; this header uses plain structs so that the
// server, clients and tools (which use spdlog, protobuf and gRPC, whose headers clash with those
// bundled in LibTorch) can include it.
//
// What a caller may rely on:
// - No exception leaves an Engine method: failures come back as Status (INVALID_ARGUMENT for bad
//   prompts or images, INTERNAL for unexpected LibTorch/CUDA errors, with the cause in the message).
// - Every method is synchronous: when it returns, its device work is complete and its results can be
//   used from any thread. Methods may be called concurrently from different threads; each call runs
//   on a stream of its own (CUDA), so an encoder batch, a decoder batch and post-processing overlap.
// - Opaque handles (PreparedImage, Embedding, MaskLogits) are immutable once returned and may be
//   shared between threads; they keep their device memory until the last reference goes away.
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

#include "model/status.h"

namespace maskd {

enum class LogLevel { kDebug, kInfo, kWarning, kError };
// Where the engine's log lines go. The server routes them to spdlog; the default writes to stderr.
using LogFn = std::function<void(LogLevel, std::string_view)>;

enum class Precision { kFloat32, kBFloat16, kFloat16 };
const char* PrecisionName(Precision p);  // "fp32", "bf16", "fp16"
StatusOr<Precision> ParsePrecision(std::string_view name);

// How the image encoder computes attention.
enum class AttentionImpl {
  kAuto,        // kFused on CUDA (kSdpaFolded where the kernel does not apply), kMath on CPU
  kMath,        // the original's arithmetic: materialised scores + rel-pos bias, softmax, matmul
  kSdpa,        // scaled_dot_product_attention with the rel-pos bias as an additive mask
  kSdpaFolded,  // SDPA with rel-pos folded into augmented q/k: no bias tensor at all
  kFused,       // maskd's CUDA kernel: flash attention with the decomposed rel-pos added in-kernel
};
const char* AttentionImplName(AttentionImpl a);  // "math", "sdpa", "sdpa-folded", "fused", "auto"
StatusOr<AttentionImpl> ParseAttentionImpl(std::string_view name);

// Encoder/decoder optimisations. Each can be switched on its own (maskbench's waterfall does); the
// CUDA-only ones are ignored on CPU, which always runs the exact original arithmetic in fp32 unless
// asked otherwise.
struct FastPathOptions {
  AttentionImpl attention = AttentionImpl::kAuto;
  // Capture the encoder at each EngineOptions::encoder_batch_sizes and the decoder at bucketed
  // prompt counts in CUDA graphs, replayed with static, padded inputs.
  bool cuda_graphs = false;
  // int8 dynamic quantisation of the encoder's linear layers (per-token activation scales,
  // per-channel weight scales, int8 tensor-core GEMM).
  bool int8 = false;
  // 2:4 semi-structured sparsity of the encoder's MLP weights (magnitude pruned), sparse GEMM.
  bool sparse24 = false;
  // Resize/normalise/pad on the device from uint8 (bit-exact with the CPU resize).
  bool gpu_preprocess = false;
  // Upscale/crop/threshold masks and encode COCO RLE on the device.
  bool gpu_postprocess = false;
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

  // Everything that helps on CUDA: fused attention, graphs, GPU pre/post-processing (not int8 or
  // 2:4 sparsity, which trade accuracy for speed and are opt-in).
  static FastPathOptions Fast();
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
  // Encoder batch sizes prepared (CUDA graphs) up front; Encode pads a batch up to the next one.
  // Larger batches are split. Must be ascending, >= 1.
  std::vector<int> encoder_batch_sizes = {1};
  // Seed of the demo model's weights.
  uint64_t demo_seed = 0x5eed;
  // fp32 on CUDA: TF32 off for matmuls and cuDNN, so fp32 means fp32 (golden parity needs it).
  bool strict_fp32 = true;
  // Run one warm-up pass of each prepared shape in Create (so that the first request is not slow).
  bool warmup = true;
  LogFn log;
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

// 8-bit RGB pixels, rows top to bottom, 3 bytes per pixel.
struct ImageRGB8 {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;  // width * height * 3
};

struct Point {
  float x = 0, y = 0;
  int label = 1;  // 1 foreground, 0 background (SAM's labels)
};

struct Box {
  float x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};

// An image ready for the encoder: resized so its longest side is the model's input size
// (Pillow-exact antialiased bilinear), normalised and padded; or, with gpu_preprocess, the uint8
// pixels on the device, resized there. Opaque.
class PreparedImage {
 public:
  struct Impl;
  explicit PreparedImage(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  int original_width() const;
  int original_height() const;
  // Size after the longest-side resize, before padding.
  int input_width() const;
  int input_height() const;
  const std::shared_ptr<Impl>& impl() const { return impl_; }

 private:
  std::shared_ptr<Impl> impl_;
};

// The image encoder's output for one image (256 x 64 x 64 for SAM) on the engine's device (or in host
// memory after Engine::ToHost). Opaque.
class Embedding {
 public:
  struct Impl;
  explicit Embedding(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  int original_width() const;
  int original_height() const;
  int input_width() const;
  int input_height() const;
  // Bytes of tensor memory held.
  size_t bytes() const;
  // True when ToHost moved it off a CUDA device (the cache's host tier); never for CPU engines,
  // whose embeddings live in host memory as their device memory.
  bool on_host() const;
  // The values as float32, C x H x W (for tests and verification tools; copies).
  std::vector<float> ToFloat() const;
  std::vector<int64_t> shape() const;
  const std::shared_ptr<Impl>& impl() const { return impl_; }

 private:
  std::shared_ptr<Impl> impl_;
};

// Low-resolution mask logits (N x 256 x 256) of one prompt's masks, on the engine's device. Opaque.
class MaskLogits {
 public:
  struct Impl;
  explicit MaskLogits(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  int num_masks() const;
  int height() const;  // 256
  int width() const;   // 256
  size_t bytes() const;
  // Values as float32, N x H x W, row-major (copies).
  std::vector<float> ToFloat() const;
  const std::shared_ptr<Impl>& impl() const { return impl_; }

 private:
  std::shared_ptr<Impl> impl_;
};

// One prompt on one image for Engine::Decode.
struct PromptSpec {
  std::vector<Point> points;
  std::optional<Box> box;
  // SAM's mask_input: one mask of low-res logits (MaskLogits with num_masks() == 1, or use
  // mask_input_index to pick one mask of a multi-mask result).
  std::shared_ptr<const MaskLogits> mask_input;
  int mask_input_index = 0;
  bool multimask = true;
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

enum class MaskEncoding {
  kNone,     // only stats (bbox, area, stability)
  kRle,      // COCO RLE counts, column-major, first run = zeros
  kBitmask,  // one byte per pixel (0 / 1), row-major, original size
};

struct PostprocessItem {
  std::shared_ptr<const MaskLogits> logits;
  // Geometry of the image the logits belong to.
  int original_width = 0, original_height = 0;
  int input_width = 0, input_height = 0;
  MaskEncoding encoding = MaskEncoding::kRle;
};

struct MaskData {
  float stability_score = 0;
  // Tight box (x, y, width, height), zero for an empty mask.
  std::array<uint32_t, 4> bbox{};
  uint64_t area = 0;
  std::vector<uint32_t> rle_counts;  // kRle
  std::vector<uint8_t> bitmask;      // kBitmask
};

struct DeviceMemoryStats {
  uint64_t allocated = 0, peak_allocated = 0, reserved = 0, total = 0;
};

class Engine {
 public:
  // Loads the checkpoint (or builds the demo model), moves it to the device, prepares the fast path
  // and warms it up.
  static StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  virtual ~Engine() = default;

  virtual const ModelDescription& description() const = 0;
  virtual const EngineOptions& options() const = 0;
  // "cpu", "cuda:0", ...
  virtual std::string device() const = 0;
  // e.g. "NVIDIA H200" or "cpu".
  virtual std::string device_name() const = 0;
  // Optimisations in effect ("sdpa-folded", "fused-relpos-attention", "cuda-graphs", "int8", ...).
  virtual std::vector<std::string> optimisations() const = 0;
  // Largest batch Encode runs in one pass.
  virtual int max_encoder_batch() const = 0;

  // Switches the fast path (attention, graphs, int8/2:4, GPU pre/post-processing) of a created
  // engine, e.g. for the benchmark waterfall; re-derives quantised weights from the dense ones and
  // recaptures graphs. Must not overlap any other call on this engine. The identity changes when the
  // numerics do (int8, 2:4).
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
  // in item order and equal (within floating-point tolerance) decoding each prompt alone.
  virtual StatusOr<std::vector<DecodedPrompt>> Decode(const std::vector<DecodeItem>& items) = 0;

  // Upscales, crops and thresholds masks to the original size and encodes them; one MaskData per
  // mask of every item, in order.
  virtual StatusOr<std::vector<std::vector<MaskData>>> Postprocess(
      const std::vector<PostprocessItem>& items) = 0;

  // Moves an embedding to host memory (pinned where possible) and back to the device.
  virtual StatusOr<std::shared_ptr<const Embedding>> ToHost(const Embedding& e) = 0;
  virtual StatusOr<std::shared_ptr<const Embedding>> ToDevice(const Embedding& e) = 0;

  // Client-supplied low-res logits (1 x 256 x 256 values) for PromptSpec::mask_input.
  virtual StatusOr<std::shared_ptr<const MaskLogits>> MakeMaskLogits(const float* values, int height,
                                                                     int width) = 0;

  virtual DeviceMemoryStats memory() const = 0;
  virtual void ResetPeakMemory() = 0;
};

// Checks a prompt against an image's size (finite coordinates inside the image, box corners ordered,
// at least one point or a box, labels 0/1, mask input shape). The message names the field.
Status ValidatePrompt(const PromptSpec& prompt, int image_width, int image_height,
                      std::string_view field_prefix = "prompt");

// CUDA devices this process can use (0 without a CUDA build, driver or device). The server expands
// --device cuda (and auto) to cuda:0 .. cuda:N-1 with it.
int CudaDeviceCount();

// The shape SAM's longest-side resize gives: (width, height) scaled so max(width, height) == target,
// rounded as the original, except that a side that would round to 0 (aspect ratios beyond about
// 2 * target : 1) is 1.
std::pair<int, int> ResizedSize(int width, int height, int target);

// Bytes (zip archive of torch.save, or safetensors) to a file in the official SAM format.
struct CheckpointSpec {
  std::string arch;  // vit_b | vit_l | vit_h | tiny (the golden encoder shape)
  uint64_t seed = 0;
};
// Writes a random-weight checkpoint in the official format (torch.save(state_dict) layout).
Status MakeRandomCheckpoint(const CheckpointSpec& spec, const std::string& path);

}  // namespace maskd
