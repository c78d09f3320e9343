// A fake maskd::Engine for the server's unit tests: deterministic, torch-free, with controllable
// latency, failures and a gate that holds Encode calls, and counters of everything it was asked.
//
// It implements the abstract maskd::Engine of model/api/engine.h like the real engine does, with
// payloads of its own behind the handles; it follows the api's prompt rules (ValidatePrompt).
//
// Its "model": the embedding of an image is a checksum of its pixels; a prompt's mask m is a disc
// around the first point (or the box centre) in the low-res frame, radius growing with m, plus half
// of the mask input's logits. Postprocess thresholds at 0 after a nearest-neighbour upscale.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "model/api/engine.h"

namespace maskd::fake {

struct FakeEngineOptions {
  std::string device = "cpu";
  std::string identity = "fake-model-identity";
  int max_batch = 8;
  size_t embedding_bytes = 1 << 20;
  std::chrono::microseconds encode_delay{0};
  std::chrono::microseconds decode_delay{0};
  // Added per prompt of a DecodeEach call: a batch costs in proportion to its size, like the model.
  std::chrono::microseconds decode_delay_per_prompt{0};
  std::chrono::microseconds postprocess_delay{0};
};

class FakeEngine final : public Engine {
 public:
  explicit FakeEngine(FakeEngineOptions o = {});

  // Counters.
  std::atomic<int> prepare_calls{0}, encode_calls{0}, encoded_images{0}, decode_calls{0};
  std::atomic<int> decoded_prompts{0}, postprocess_calls{0}, to_host_calls{0}, to_device_calls{0};
  // Masks whose RLE string Postprocess left in its shared buffer (PostprocessItem::rle_in_place).
  std::atomic<int> rle_in_place_masks{0};
  std::vector<int> encode_batches() const;  // sizes of Encode calls, in order
  std::vector<int> decode_batches() const;

  // The next Encode/Decode returns `s` instead of running.
  void FailNextEncode(Status s);
  void FailNextDecode(Status s);
  // The next Postprocess throws std::runtime_error(what) (a library failing below the engine).
  void ThrowOnNextPostprocess(std::string what);
  // Out of memory, as the real engine reports it (RESOURCE_EXHAUSTED for the whole call, the engine
  // still usable): an Encode of more than `images` images, a DecodeEach of more than `prompts`
  // prompts (0: no limit), or any Encode with an image of content `content` (Checksum) / any
  // DecodeEach with a prompt on an embedding of it, whatever the size. Counted in oom_returns.
  void SetEncodeMemoryLimit(int images);
  void SetDecodeMemoryLimit(int prompts);
  void OomOnEncodeOf(uint64_t content);
  void OomOnDecodeOf(uint64_t content);
  std::atomic<int> oom_returns{0};
  // While held, Encode blocks (after counting the call) until Release().
  void HoldEncodes();
  void ReleaseEncodes();
  // While held, Prepare (on the server's decode pool) blocks, after counting the call, until
  // ReleasePrepares(): keeps the decode threads busy.
  void HoldPrepares();
  void ReleasePrepares();
  // Blocks until `n` Encode calls have started (for tests that need the encoder busy).
  bool WaitForEncodeCalls(int n, std::chrono::milliseconds timeout);

  const ModelDescription& description() const override { return desc_; }
  const EngineOptions& options() const override { return engine_options_; }
  std::string device() const override { return o_.device; }
  std::string device_name() const override { return "fake " + o_.device; }
  std::vector<std::string> optimisations() const override { return {"fake"}; }
  int max_encoder_batch() const override { return o_.max_batch; }
  StatusOr<PreparedImage> Prepare(const ImageRGB8& image) override;
  StatusOr<PreparedImage> PrepareResized(const ImageRGB8& resized, int ow, int oh) override;
  StatusOr<std::vector<std::shared_ptr<const Embedding>>> Encode(
      const std::vector<PreparedImage>& images) override;
  StatusOr<std::vector<StatusOr<DecodedPrompt>>> DecodeEach(const std::vector<DecodeItem>& items) override;
  StatusOr<std::vector<std::vector<MaskData>>> Postprocess(
      const std::vector<PostprocessItem>& items) override;
  StatusOr<std::shared_ptr<const Embedding>> ToHost(const Embedding& e) override;
  StatusOr<std::shared_ptr<const Embedding>> ToDevice(const Embedding& e) override;
  StatusOr<std::shared_ptr<const MaskLogits>> MakeMaskLogits(const float* v, int h, int w) override;
  // The fp32 values of EmbeddingValues(content) in `dtype` (rounded with model/api/half.h).
  StatusOr<ExportedEmbedding> ExportEmbedding(const Embedding& e, Precision dtype) override;
  DeviceMemoryStats memory() const override;
  void ResetPeakMemory() override {}

  // What ExportEmbedding calls made (counter), and the fake's embedding values: kEmbeddingShape
  // floats from the content, with exponents over a wide range (bf16/fp16 ties, fp16 subnormals
  // and overflow included).
  std::atomic<int> export_calls{0};
  static constexpr int64_t kEmbeddingShape[4] = {1, 256, 64, 64};
  static std::vector<float> EmbeddingValues(uint64_t content);

  // A stand-alone embedding (for cache tests), with its size in bytes.
  static std::shared_ptr<const Embedding> MakeEmbedding(size_t bytes, uint64_t content = 0,
                                                        bool on_host = false);
  // The content checksum an embedding was made from (tests compare it to the image's).
  static uint64_t ContentOf(const Embedding& e);
  static uint64_t Checksum(const ImageRGB8& image);

 private:
  void SetHold(bool* flag, bool on);  // under mu_, then wakes the held calls

  FakeEngineOptions o_;
  ModelDescription desc_;
  EngineOptions engine_options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool hold_ = false, hold_prepare_ = false;
  std::optional<Status> fail_encode_, fail_decode_;
  std::optional<std::string> throw_postprocess_;
  int encode_memory_limit_ = 0, decode_memory_limit_ = 0;
  std::vector<uint64_t> oom_encode_of_, oom_decode_of_;
  std::vector<int> encode_batches_, decode_batches_;
};

}  // namespace maskd::fake
