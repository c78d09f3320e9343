// The work behind Embed, Segment and each SegmentStream message, from a validated request to its
// response, run entirely off the gRPC handler threads:
//
//   handler --> decode pool: hash the image as sent (image_id), route, look up the cache;
//               on a miss (single-flight leader) decode the bytes and Engine::Prepare (resize)
//           --> encoder batcher of the chosen device (Engine::Encode), result into the cache
//           --> resolve mask inputs, check prompt geometry (maskd::ValidatePrompt)
//           --> decoder batcher (jagged Engine::Decode over many requests' prompts)
//           --> post-processing pool: Engine::Postprocess (under load one call for the decoded parts of
//               many requests), RLE strings / PNGs / logits, result ids
//           --> done(status)
//
// GenerateMasks shares the first half (hash, cache, encoder), then runs the generator loop
// (model/api/mask_generator.h) on a generation pool thread: each batch of grid points goes through
// the device's decoder batcher like any request's prompts (parts of max_part_prompts in one group,
// so a generation takes a bounded share of each decoder batch), and the thread waits for it there,
// never on a gRPC or batcher thread.
//
// Every entry point returns at once; `done` is called exactly once, from some pool thread. It
// speaks values only (server/values.h): the handlers convert messages with server/wire.h.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "model/io/image_codec.h"
#include "model/api/limits.h"
#include "model/api/status.h"
#include "server/byte_budget.h"
#include "server/call_control.h"
#include "server/router.h"
#include "server/thread_pool.h"
#include "server/values.h"

namespace maskd::server {

struct PipelineOptions {
  Limits limits;
  // Masks compress well at any level; level 1 keeps PNG output cheap.
  PngOptions png{1};
  // Bytes that accepted, unfinished requests may hold (--max-inflight-bytes), and what one
  // prepared (resized, normalised) image costs the engine.
  uint64_t max_inflight_bytes = uint64_t{2} << 30;
  uint64_t prepared_image_bytes = uint64_t{1024} * 1024 * 3 * 4;
  // GenerateMasks' parameter bounds (the handler validates with them too).
  MaskGenerationLimits generation_limits;
};

class Pipeline {
 public:
  using Done = std::function<void(Status)>;
  // Told the image's id as soon as it is known (or why it is not): SegmentStream uses it for
  // later messages that omit the image.
  using OnImage = std::function<void(StatusOr<std::string>)>;

  // All engines of the router's workers must share `model_identity` (part of every image_id).
  // `generate_pool` runs GenerateMasks' generator loops (which wait for their decoder batches);
  // null: GenerateMasks answers UNAVAILABLE.
  Pipeline(PipelineOptions options, std::string model_identity, Router* router,
           ThreadPool* decode_pool, ThreadPool* post_pool, ThreadPool* generate_pool = nullptr);

  // `image`'s views and `out` must stay valid until `done` runs; `out` is complete when it does.
  // With `return_embedding`, out->embedding gets the embedding in that dtype (converted by the
  // engine on the post-processing pool, on a cache hit too).
  void Embed(ImageInput image, CallControlPtr control, Clock::time_point arrival, ImageOutcome* out,
             Done done, std::optional<Precision> return_embedding = std::nullopt);
  // `drafts` come from ValidatePrompts; an empty list only sets the image.
  void Segment(ImageInput image, std::vector<PromptDraft> drafts, OutputSpec output,
               CallControlPtr control, Clock::time_point arrival, SegmentOutcome* out,
               OnImage on_image, Done done);

  // `spec` comes from ValidateGenerateRequest. `image`'s views and `out` must stay valid until
  // `done` runs.
  void Generate(ImageInput image, GenerationSpec spec, CallControlPtr control,
                Clock::time_point arrival, GenerateOutcome* out, Done done);

  const PipelineOptions& options() const { return options_; }
  const ByteBudget& inflight() const { return inflight_; }
  const std::string& model_identity() const { return identity_; }

 private:
  struct Job;
  using JobPtr = std::shared_ptr<Job>;

  void Start(const JobPtr& job);
  // What a job holds from arrival to its end: the image as sent and mask-input logits.
  uint64_t RequestBytes(const Job& job) const;
  // What decoding the job's image makes (from the header's declared size) and the prepared copy,
  // held by the job that decodes it until its embedding is cached.
  uint64_t DecodeBytes(const Job& job) const;
  void ReleaseDecodeBytes(Job& job);
  // Looks the image up (and decodes and encodes it when it was sent). `on_caller`: running on the
  // caller's (gRPC's) thread, so anything that may block is handed to the decode pool.
  void Resolve(const JobPtr& job, bool on_caller);
  void Lead(const JobPtr& job, DeviceWorker* worker,
            const std::shared_ptr<EmbeddingCache::Flight>& flight, const std::string& image_id);
  void OnResolved(const JobPtr& job, StatusOr<CachedEmbeddingPtr> entry, bool cached);
  void StartDecode(const JobPtr& job);
  // A decoder request for items[first, last) of `job`: its group (so its parts share one bound per
  // decoder batch), its liveness check and request id; the caller sets `done`.
  static DecoderBatcher::Request PartRequest(const JobPtr& job, const std::vector<DecodeItem>& items, size_t first,
                                             size_t last);
  // Embed's return_embedding: Engine::ExportEmbedding on the post-processing pool, then Finish.
  void ExportEmbedding(const JobPtr& job);
  Status BuildDecodeItems(const JobPtr& job, std::vector<DecodeItem>* items);
  // A decoded part of a request waiting for post-processing.
  struct PostChunk {
    JobPtr job;
    size_t first = 0;
    std::vector<DecodedPrompt> decoded;
    Clock::time_point queued;
  };
  // Queues a decoded part and starts a drain on the post-processing pool unless every pool thread
  // already runs one: the chunk then goes with the next batch a running drain takes.
  void QueuePostprocess(PostChunk chunk);
  // Takes queued chunks of one device in batches (DrainBatch) until the queue is empty.
  void DrainPostprocess();
  // One Engine::Postprocess call for every chunk of the batch (they are the same device's), each
  // chunk's masks then encoded and its part finished. A failed call is retried chunk by chunk, so
  // that one request's masks cannot fail another's.
  void DrainBatch(std::vector<PostChunk> batch);
  void PostprocessBatch(std::vector<PostChunk>& batch, DeviceWorker* worker,
                        const std::function<void(PostChunk&, const Status&)>& done);
  // The engine's items for a chunk (checked against what the decoder returned).
  Status PostItems(const Job& job, const std::vector<DecodedPrompt>& decoded, std::vector<PostprocessItem>* items);
  // Runs finish(0..n-1), each index once, on this thread and (for bigger batches) on helper tasks
  // of the post-processing pool (RunSpread, server/thread_pool.h); returns when all have run,
  // rethrowing the first exception of any (after all have run, so that the caller finishes what was
  // left unfinished). A batch of 64
  // calls at 256 clients finished in turn on one thread (three 55 KB RLE strings copied into each
  // response and serialised: ~90 us a call), which made the last call wait ~6 ms (run 63).
  void FinishChunks(size_t n, const std::function<void(size_t)>& finish);
  // A chunk's masks, post-processed, into its results (the result store, the requested encoding);
  // the masks' strings are moved out.
  Status FinishPostChunk(const JobPtr& job, size_t first, const std::vector<DecodedPrompt>& decoded,
                         std::vector<std::vector<MaskData>>& masks);
  Status PostprocessChunk(const JobPtr& job, size_t first, const std::vector<DecodedPrompt>& decoded);
  void ChunkDone(const JobPtr& job, const Status& status);
  // GenerateMasks after its embedding is resolved: queue the generator on the generation pool.
  void StartGeneration(const JobPtr& job);
  // The generator loop, on a generation pool thread; finishes the job.
  void RunGeneration(const JobPtr& job);
  // GenerationDecodeFn: one batch of grid points through the worker's decoder batcher; blocks the
  // (generation pool) thread until every part is decoded or failed.
  StatusOr<std::vector<StatusOr<DecodedPrompt>>> DecodeGenerationBatch(
      const JobPtr& job, DeviceWorker* worker, const std::vector<DecodeItem>& items);
  // The generated masks in the requested form.
  Status FormatGenerated(const JobPtr& job, std::vector<GeneratedMask> masks);
  void Finish(const JobPtr& job, Status status);
  // Calls the job's OnImage once.
  void ReportImage(const JobPtr& job, StatusOr<std::string> image_id);
  // Runs `fn` on the post-processing pool, or here when that pool no longer accepts work.
  void Post(std::function<void()> fn);
  // Runs `fn`, turning an escaping exception into INTERNAL for the job.
  void Guarded(const JobPtr& job, const std::function<void()>& fn);

  const PipelineOptions options_;
  const std::string identity_;
  Router* const router_;
  ThreadPool* const decode_pool_;
  ThreadPool* const post_pool_;
  ThreadPool* const generate_pool_;
  ByteBudget inflight_;
  // MASKD_RLE_IN_PLACE=1 (read at construction): PostprocessItem::rle_in_place on every item.
  bool rle_in_place_ = false;
  // Post-processing in batches across requests: under load one Engine::Postprocess call serves the
  // masks of many requests (run 17, 256 clients: each call's own post-processing, ~1.2 ms of
  // mostly GPU synchronisation, waited 42 ms for one of the pool's 8 threads).
  std::mutex post_mu_;                 // guards post_queue_ and post_drainers_
  std::deque<PostChunk> post_queue_;
  int post_drainers_ = 0;              // drains submitted and not yet returned
};

}  // namespace maskd::server
