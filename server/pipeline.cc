#include "server/pipeline.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <mutex>

#include <spdlog/spdlog.h>

#include "model/io/rle.h"
#include "model/io/image_id.h"
#include "server/logging.h"

namespace maskd::server {

// One Embed/Segment/stream message in flight. Shared by the lambdas of its stages.
struct Pipeline::Job {
  CallControlPtr control;
  Clock::time_point arrival;
  Clock::time_point enqueued;
  ImageInput image;
  ImageOutcome* image_out = nullptr;   // Embed's outcome, or the image part of Segment's
  SegmentOutcome* segment = nullptr;   // null for Embed
  GenerateOutcome* generate = nullptr;  // GenerateMasks only
  GenerationSpec generation;            // GenerateMasks only
  OutputSpec output;
  std::optional<Precision> export_dtype;  // Embed's return_embedding
  std::vector<PromptDraft> drafts;
  OnImage on_image;
  Done done;

  // Set once routed (from inside the router's lock, before any waiter can run).
  std::atomic<DeviceWorker*> worker{nullptr};
  CachedEmbeddingPtr entry;
  // The image's id as clients see it (a content address); entry->image_id is the cache key, which
  // also names the call's scope (CacheKey).
  std::string image_id;
  bool cached = false;
  std::atomic<bool> finished{false};

  // CallTiming, microseconds. Chunks of a large request run in parallel: their stages keep the max.
  std::atomic<uint64_t> decode_queue_us{0}, decode_us{0}, encoder_queue_us{0}, encoder_compute_us{0};
  std::atomic<uint64_t> decoder_queue_us{0}, decoder_compute_us{0}, postprocess_us{0};

  std::atomic<bool> image_reported{false};
  std::atomic<int> chunks_left{0};
  std::mutex error_mu;
  Status first_error;  // guarded by error_mu

  // Held in Pipeline::inflight_: the request's bytes until Finish; the decode's from before the
  // decode until the embedding is cached (or Finish).
  uint64_t request_bytes = 0;
  std::atomic<uint64_t> decode_bytes{0};

  const std::string& rid() const { return control->request_id(); }
  static void Max(std::atomic<uint64_t>& slot, uint64_t v) {
    uint64_t cur = slot.load();
    while (v > cur && !slot.compare_exchange_weak(cur, v)) {
    }
  }
};

namespace {

// Embeddings and stored results are keyed by scope and image id: a call finds only what calls of its
// own scope cached, while the id itself stays the content address clients see (same bytes, same
// id). Image ids are 64 hex digits (ValidateImageId), so no id contains the separator.
std::string CacheKey(const std::string& scope, const std::string& image_id) {
  return scope.empty() ? image_id : image_id + "@" + scope;
}

MaskEncoding EncodingFor(OutputFormat f) {
  switch (f) {
    case OutputFormat::kPng:
    case OutputFormat::kPolygons: return MaskEncoding::kBitmask;
    case OutputFormat::kLowResLogits: return MaskEncoding::kNone;
    case OutputFormat::kRle: break;
  }
  return MaskEncoding::kRle;
}

}  // namespace

Pipeline::Pipeline(PipelineOptions options, std::string model_identity, Router* router,
                   ThreadPool* decode_pool, ThreadPool* post_pool, ThreadPool* generate_pool)
    : options_(std::move(options)),
      identity_(std::move(model_identity)),
      router_(router),
      decode_pool_(decode_pool),
      post_pool_(post_pool),
      generate_pool_(generate_pool),
      inflight_(options_.max_inflight_bytes, "--max-inflight-bytes") {
  // MASKD_RLE_IN_PLACE=1: the device's RLE strings are copied out of the engine's pinned buffer by
  // the threads that build the responses (FinishPostChunk, spread over the post-processing pool)
  // instead of one after another inside Engine::Postprocess. Off until measured on the GPU host.
  const char* in_place = std::getenv("MASKD_RLE_IN_PLACE");
  rle_in_place_ = in_place != nullptr && std::string(in_place) == "1";
}

void Pipeline::Embed(ImageInput image, CallControlPtr control, Clock::time_point arrival,
                     ImageOutcome* out, Done done, std::optional<Precision> return_embedding) {
  auto job = std::make_shared<Job>();
  job->control = std::move(control);
  job->arrival = arrival;
  job->image = std::move(image);
  job->image_out = out;
  job->export_dtype = return_embedding;
  job->done = std::move(done);
  Start(job);
}

void Pipeline::Segment(ImageInput image, std::vector<PromptDraft> drafts, OutputSpec output,
                       CallControlPtr control, Clock::time_point arrival, SegmentOutcome* out,
                       OnImage on_image, Done done) {
  auto job = std::make_shared<Job>();
  job->control = std::move(control);
  job->arrival = arrival;
  job->image = std::move(image);
  job->segment = out;
  job->image_out = &out->image;
  job->output = output;
  out->format = output.format;
  job->drafts = std::move(drafts);
  job->on_image = std::move(on_image);
  job->done = std::move(done);
  Start(job);
}

void Pipeline::Generate(ImageInput image, GenerationSpec spec, CallControlPtr control,
                        Clock::time_point arrival, GenerateOutcome* out, Done done) {
  auto job = std::make_shared<Job>();
  job->control = std::move(control);
  job->arrival = arrival;
  job->image = std::move(image);
  job->generate = out;
  job->image_out = &out->image;
  out->format = spec.output.format;
  job->generation = std::move(spec);
  job->done = std::move(done);
  Start(job);
}

void Pipeline::Guarded(const JobPtr& job, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    Finish(job, Internal(std::string("unexpected exception in the request pipeline: ") + e.what()));
  } catch (...) {
    Finish(job, Internal("unexpected non-standard exception in the request pipeline"));
  }
}

void Pipeline::Post(std::function<void()> fn) {
  if (!post_pool_->TrySubmit(fn)) fn();
}

uint64_t Pipeline::RequestBytes(const Job& job) const {
  uint64_t bytes = job.image.has_bytes() ? job.image.bytes.size() : 0;
  for (const PromptDraft& d : job.drafts) {
    if (d.mask == PromptDraft::Mask::kLogits) {
      bytes += 2 * uint64_t{kLowResSide} * kLowResSide * sizeof(float);  // the request's and the copy
    }
  }
  return bytes;
}

uint64_t Pipeline::DecodeBytes(const Job& job) const {
  const ImageInput& im = job.image;
  uint64_t bytes = options_.prepared_image_bytes;
  if (im.kind == ImageInput::Kind::kRaw) return bytes + im.bytes.size();  // the decoded copy
  // An unreadable header costs nothing more: decoding refuses it at once. A declared size over the
  // pixel limit is refused before allocation, so the limit caps what it costs.
  if (StatusOr<DeclaredSize> size = ReadDeclaredSize(im.bytes); size.ok()) {
    bytes += std::min<uint64_t>(size->width * size->height, options_.limits.max_image_pixels) * 3;
  }
  return bytes;
}

void Pipeline::ReleaseDecodeBytes(Job& job) {
  if (const uint64_t b = job.decode_bytes.exchange(0); b > 0) inflight_.Release(b);
}

void Pipeline::Start(const JobPtr& job) {
  job->enqueued = Clock::now();
  // Requests by image_id with plain prompts hold next to nothing and always get in, so clicks on
  // cached images pass a flood of new images.
  if (const uint64_t bytes = RequestBytes(*job); bytes > 0) {
    if (Status s = inflight_.TryReserve(bytes); !s.ok()) return Finish(job, s);
    job->request_bytes = bytes;
  }
  // A Segment by image_id with plain prompts (or stored results) has nothing to decode: resolving
  // it is a cache lookup, so it runs here instead of a hop through the decode pool. A click saves
  // that thread's wake-up (decode_queue p50 0.034 ms, mean 0.053 at 1 client, run 40) and never
  // waits behind other requests' image decodes.
  if (job->segment != nullptr && !job->image.has_bytes() && job->request_bytes == 0) {
    return Guarded(job, [&] { Resolve(job, /*on_caller=*/true); });
  }
  if (!decode_pool_->TrySubmit([this, job] { Guarded(job, [&] { Resolve(job, /*on_caller=*/false); }); })) {
    Finish(job, ResourceExhausted("the image decode queue is full (" +
                                  std::to_string(decode_pool_->depth()) + " of " +
                                  std::to_string(decode_pool_->capacity()) +
                                  " waiting): retry with backoff"));
  }
}

void Pipeline::Resolve(const JobPtr& job, bool on_caller) {
  job->decode_queue_us = MicrosSince(job->enqueued);
  if (Status alive = job->control->Check(); !alive.ok()) return Finish(job, alive);

  std::string image_id;
  const bool has_bytes = job->image.has_bytes();
  if (has_bytes) {
    const Clock::time_point t0 = Clock::now();
    const ImageInput& im = job->image;
    image_id = im.kind == ImageInput::Kind::kRaw ? ImageIdForRaw(identity_, im.width, im.height, im.bytes)
                                                 : ImageIdForEncoded(identity_, im.bytes);
    job->decode_us += MicrosSince(t0);
  } else {
    image_id = job->image.image_id;
  }
  job->image_id = image_id;
  const std::string key = CacheKey(job->control->scope(), image_id);

  const Clock::time_point join_time = Clock::now();
  Router::Routed routed = router_->Acquire(
      key, /*create=*/has_bytes, job->control, [this, job, join_time](DeviceWorker* w) {
        job->worker = w;
        w->AddLoad(1);
        return [this, job, w, join_time](StatusOr<CachedEmbeddingPtr> r) {
          // Waiting for another request's encode counts as encoder queueing for this call.
          job->encoder_queue_us = MicrosSince(join_time);
          Guarded(job, [&] { OnResolved(job, std::move(r), /*cached=*/false); });
        };
      });
  static const char* kOutcome[] = {"hit", "joined another request's encode", "miss (encoding)",
                                   "host-tier hit (promoting)", "not cached"};
  LogRequest(spdlog::level::debug, job->rid(), "image {} -> {}: {}", LogSafe(image_id),
             routed.worker ? routed.worker->label() : std::string("no device"),
             kOutcome[static_cast<int>(routed.acquired.outcome)]);
  switch (routed.acquired.outcome) {
    case EmbeddingCache::Outcome::kHit:
      return OnResolved(job, routed.acquired.entry, /*cached=*/true);
    case EmbeddingCache::Outcome::kJoined:
      return;  // the waiter continues
    case EmbeddingCache::Outcome::kPromote: {
      // Promoting copies the embedding to the device (and may demote others): not on the caller's
      // thread when the decode pool takes it.
      auto promote = [this, job, worker = routed.worker, flight = routed.acquired.flight] {
        OnResolved(job, worker->cache().Promote(flight), /*cached=*/true);
      };
      if (on_caller && decode_pool_->TrySubmit([this, job, promote] { Guarded(job, promote); })) return;
      return promote();
    }
    case EmbeddingCache::Outcome::kLeader:
      return Lead(job, routed.worker, routed.acquired.flight, key);
    case EmbeddingCache::Outcome::kAbsent:
      break;
  }
  OnResolved(job,
             NotFound("image_id = \"" + image_id +
                      "\" is not cached on this server (evicted, or never embedded here): re-send "
                      "the image bytes"),
             false);
}

void Pipeline::Lead(const JobPtr& job, DeviceWorker* worker,
                    const std::shared_ptr<EmbeddingCache::Flight>& flight,
                    const std::string& cache_key) {
  EmbeddingCache& cache = worker->cache();
  auto fail = [&](Status s) { OnResolved(job, cache.Complete(flight, std::move(s)), false); };
  // Decoding is wasted when the encoder would refuse the image anyway.
  if (!worker->encoder().HasRoom()) {
    QueueCounters q = worker->encoder().counters();
    return fail(ResourceExhausted("the image encoder queue of " + worker->label() + " is full (" +
                                  std::to_string(q.depth) + " of " + std::to_string(q.capacity) +
                                  " images): retry with backoff"));
  }

  // Checked before decoding: the pixels of an image that is not cached yet are the big part of a
  // request (a few header bytes can declare 64 megapixels).
  const uint64_t decode_bytes = DecodeBytes(*job);
  if (Status s = inflight_.TryReserve(decode_bytes, job->request_bytes); !s.ok()) return fail(s);
  job->decode_bytes = decode_bytes;

  const Clock::time_point t0 = Clock::now();
  const ImageInput& im = job->image;
  ImageLimits limits;
  limits.max_bytes = options_.limits.max_image_bytes;
  limits.max_pixels = options_.limits.max_image_pixels;
  limits.max_side = options_.limits.max_image_side;
  StatusOr<ImageRGB8> decoded =
      im.kind == ImageInput::Kind::kRaw ? ImageFromRaw(im.width, im.height, im.bytes, limits, "image.raw")
                                        : DecodeImage(im.bytes, limits, "image.encoded");
  if (!decoded.ok()) {
    job->decode_us += MicrosSince(t0);
    return fail(decoded.status());
  }
  StatusOr<PreparedImage> prepared = worker->engine().Prepare(*decoded);
  const uint64_t decode_us = MicrosSince(t0);
  job->decode_us += decode_us;
  worker->stages()[Stage::kDecode].Add(decode_us);
  if (!prepared.ok()) return fail(prepared.status());

  ImageGeometry geometry;
  geometry.width = decoded->width;
  geometry.height = decoded->height;
  geometry.input_width = prepared->input_width();
  geometry.input_height = prepared->input_height();
  decoded = ImageRGB8{};  // the pixels are not needed any more

  EncoderBatcher::Request request{*prepared, {}, {}};
  request.alive = [&cache, flight] { return cache.FlightAlive(flight); };
  request.request_id = job->rid();
  request.done = [this, job, worker, flight, cache_key, geometry](
                     StatusOr<std::shared_ptr<const Embedding>> embedding, const EncodeTiming& t) {
    job->encoder_queue_us = t.queue_us;
    job->encoder_compute_us = t.compute_us;
    // Off the encoder's thread: inserting may demote other entries (device-to-host copies).
    Post([this, job, worker, flight, cache_key, geometry, embedding = std::move(embedding)]() mutable {
      Guarded(job, [&] {
        StatusOr<CachedEmbedding> value = embedding.status();
        if (embedding.ok()) {
          CachedEmbedding v;
          v.image_id = cache_key;
          v.geometry = geometry;
          v.bytes = (*embedding)->bytes();
          v.embedding = std::move(*embedding);
          value = std::move(v);
        }
        OnResolved(job, worker->cache().Complete(flight, std::move(value)), false);
      });
    });
  };
  if (Status s = worker->encoder().Submit(std::move(request)); !s.ok()) fail(s);
}

void Pipeline::OnResolved(const JobPtr& job, StatusOr<CachedEmbeddingPtr> entry, bool cached) {
  ReleaseDecodeBytes(*job);  // the decoded and prepared images are gone once the flight completes
  if (entry.ok()) {
    ReportImage(job, job->image_id);
  } else {
    ReportImage(job, entry.status());
  }
  if (!entry.ok()) return Finish(job, entry.status());
  job->entry = *entry;
  job->cached = cached;
  const CachedEmbedding& e = **entry;
  ImageOutcome* out = job->image_out;
  out->image_id = job->image_id;
  out->width = e.geometry.width;
  out->height = e.geometry.height;
  out->cached = cached;
  if (job->generate != nullptr) return StartGeneration(job);
  if (job->segment == nullptr) {
    if (job->export_dtype) return ExportEmbedding(job);
    return Finish(job, Status::Ok());
  }
  if (job->drafts.empty()) return Finish(job, Status::Ok());
  StartDecode(job);
}

Status Pipeline::BuildDecodeItems(const JobPtr& job, std::vector<DecodeItem>* items) {
  DeviceWorker* worker = job->worker.load();
  const CachedEmbedding& e = *job->entry;
  items->reserve(job->drafts.size());
  for (size_t i = 0; i < job->drafts.size(); ++i) {
    const PromptDraft& d = job->drafts[i];
    const std::string field = "prompts[" + std::to_string(i) + "]";
    PromptSpec spec = d.spec;
    if (d.mask == PromptDraft::Mask::kResult) {
      const std::string f = field + ".mask_input.result_id";
      // Scoped to this request's image in this call's scope (the cache key): another image's result,
      // or another scope's, answers like an unknown id.
      StatusOr<StoredResult> stored = worker->results().Get(d.result_id, f, e.image_id);
      if (!stored.ok()) return stored.status();
      const uint32_t index = d.mask_index ? *d.mask_index : static_cast<uint32_t>(stored->best_index);
      if (index >= static_cast<uint32_t>(stored->num_masks)) {
        return InvalidArgument(field + ".mask_input.mask_index = " + std::to_string(index) +
                               " (expected 0 .. " + std::to_string(stored->num_masks - 1) +
                               ": result \"" + d.result_id + "\" has " +
                               std::to_string(stored->num_masks) + " masks)");
      }
      spec.mask_input = stored->logits;
      spec.mask_input_index = static_cast<int>(index);
    } else if (d.mask == PromptDraft::Mask::kLogits) {
      StatusOr<std::shared_ptr<const MaskLogits>> logits =
          worker->engine().MakeMaskLogits(d.logits, kLowResSide, kLowResSide);
      if (!logits.ok()) {
        return Status(logits.status().code(),
                      field + ".mask_input.logits: " + logits.status().message());
      }
      spec.mask_input = *logits;
      spec.mask_input_index = 0;
    }
    MASKD_RETURN_IF_ERROR(ValidatePrompt(spec, e.geometry.width, e.geometry.height, field));
    items->push_back(DecodeItem{e.embedding, std::move(spec)});
  }
  return Status::Ok();
}

void Pipeline::ExportEmbedding(const JobPtr& job) {
  // A cache hit resolves on the decode pool, a miss on the post pool: converting and copying 2-4 MiB
  // belongs with the other post-processing either way.
  Post([this, job] {
    Guarded(job, [&] {
      if (Status alive = job->control->Check(); !alive.ok()) return Finish(job, alive);
      const Clock::time_point t0 = Clock::now();
      const CachedEmbedding& e = *job->entry;
      StatusOr<ExportedEmbedding> x =
          job->worker.load()->engine().ExportEmbedding(*e.embedding, *job->export_dtype);
      const uint64_t us = MicrosSince(t0);
      Job::Max(job->postprocess_us, us);
      job->worker.load()->stages()[Stage::kPostprocess].Add(us);
      if (!x.ok()) return Finish(job, x.status());
      ImageOutcome* out = job->image_out;
      out->embedding = std::move(*x);
      out->input_width = e.geometry.input_width;
      out->input_height = e.geometry.input_height;
      Finish(job, Status::Ok());
    });
  });
}

DecoderBatcher::Request Pipeline::PartRequest(const JobPtr& job, const std::vector<DecodeItem>& items, size_t first,
                                             size_t last) {
  DecoderBatcher::Request request;
  request.prompts.assign(items.begin() + static_cast<std::ptrdiff_t>(first),
                         items.begin() + static_cast<std::ptrdiff_t>(last));
  request.group = job.get();
  CallControlPtr control = job->control;
  request.alive = [control] { return control->Check(); };
  request.request_id = job->rid();
  return request;
}

void Pipeline::StartDecode(const JobPtr& job) {
  if (Status alive = job->control->Check(); !alive.ok()) return Finish(job, alive);
  DeviceWorker* worker = job->worker.load();
  std::vector<DecodeItem> items;
  if (Status s = BuildDecodeItems(job, &items); !s.ok()) return Finish(job, s);

  DecoderBatcher& decoder = worker->decoder();
  if (!decoder.HasRoom(std::min(items.size(), decoder.max_prompts()))) {
    QueueCounters q = decoder.counters();
    return Finish(job, ResourceExhausted("the mask decoder queue of " + worker->label() +
                                         " is full (" + std::to_string(q.depth) + " of " +
                                         std::to_string(q.capacity) + " prompts queued, this "
                                         "request has " + std::to_string(items.size()) +
                                         "): retry with backoff"));
  }
  job->segment->results.resize(items.size());

  // Parts of at most max_part_prompts, grouped: they take turns with other requests' prompts in
  // the decoder's batches, and a cancelled or expired call stops at its next part.
  const size_t chunk = std::max<size_t>(1, decoder.max_part_prompts());
  const size_t n_chunks = (items.size() + chunk - 1) / chunk;
  job->chunks_left = static_cast<int>(n_chunks);
  for (size_t c = 0; c < n_chunks; ++c) {
    const size_t first = c * chunk;
    const size_t last = std::min(items.size(), first + chunk);
    DecoderBatcher::Request request = PartRequest(job, items, first, last);
    request.done = [this, job, first](StatusOr<std::vector<DecodedPrompt>> decoded,
                                      const DecodeTiming& t) {
      Job::Max(job->decoder_queue_us, t.queue_us);
      Job::Max(job->decoder_compute_us, t.compute_us);
      if (!decoded.ok()) return ChunkDone(job, decoded.status());
      QueuePostprocess(PostChunk{job, first, std::move(*decoded), Clock::now()});
    };
    if (Status s = decoder.Submit(std::move(request)); !s.ok()) {
      // This chunk and the ones after it never run; earlier chunks report as usual.
      for (size_t k = c; k < n_chunks; ++k) ChunkDone(job, s);
      return;
    }
  }
}

// fn's result, or INTERNAL for an exception escaping it: every post-processing chunk must finish
// with a status, whatever a library below throws.
namespace {
template <typename Fn>
auto CatchAll(Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return Internal(std::string("unexpected exception in post-processing: ") + e.what());
  } catch (...) {
    return Internal("unexpected non-standard exception in post-processing");
  }
}
}  // namespace

// Most items (prompts) of one batched Engine::Postprocess call: bounds what one call holds on the
// device and how long the first chunk of a batch waits for the last.
constexpr size_t kMaxPostItems = 128;

void Pipeline::QueuePostprocess(PostChunk chunk) {
  bool start = false;
  {
    std::lock_guard<std::mutex> lock(post_mu_);
    post_queue_.push_back(std::move(chunk));
    if (post_drainers_ < std::max(1, post_pool_->threads())) {
      ++post_drainers_;
      start = true;
    }
  }
  if (start) Post([this] { DrainPostprocess(); });
}

void Pipeline::DrainPostprocess() {
  for (;;) {
    std::vector<PostChunk> batch;
    {
      std::lock_guard<std::mutex> lock(post_mu_);
      if (post_queue_.empty()) {
        --post_drainers_;
        return;
      }
      // The oldest chunk's device, then its other chunks in arrival order, up to kMaxPostItems.
      DeviceWorker* const worker = post_queue_.front().job->worker.load();
      size_t items = 0;
      for (auto it = post_queue_.begin(); it != post_queue_.end();) {
        if (it->job->worker.load() != worker || (!batch.empty() && items + it->decoded.size() > kMaxPostItems)) {
          ++it;
          continue;
        }
        items += it->decoded.size();
        batch.push_back(std::move(*it));
        it = post_queue_.erase(it);
      }
    }
    DrainBatch(std::move(batch));
  }
}

void Pipeline::DrainBatch(std::vector<PostChunk> batch) {
  DeviceWorker* worker = batch.front().job->worker.load();
  const Clock::time_point t0 = Clock::now();
  for (const PostChunk& c : batch) worker->stages()[Stage::kPostprocessQueue].Add(MicrosSince(c.queued));
  // Finishes a chunk with its status and the stage timings; every chunk exactly once, also when
  // something below throws (the catch at the end finishes the rest). One flag per chunk (not
  // vector<bool>'s shared bits): chunks finish on several threads (FinishChunks).
  std::vector<char> finished(batch.size(), 0);
  auto done = [&](PostChunk& c, const Status& s) {
    finished[static_cast<size_t>(&c - batch.data())] = 1;
    const uint64_t us = MicrosSince(t0);
    worker->stages()[Stage::kPostprocess].Add(us);
    Job::Max(c.job->postprocess_us, us);
    ChunkDone(c.job, s);
  };
  const Status s = CatchAll([&] {
    PostprocessBatch(batch, worker, done);
    return Status::Ok();
  });
  if (!s.ok())
    for (size_t k = 0; k < batch.size(); ++k)
      if (!finished[k]) done(batch[k], s);
}

void Pipeline::PostprocessBatch(std::vector<PostChunk>& batch, DeviceWorker* worker,
                                const std::function<void(PostChunk&, const Status&)>& done) {
  if (batch.size() == 1) {
    PostChunk& c = batch.front();
    done(c, CatchAll([&] { return PostprocessChunk(c.job, c.first, c.decoded); }));
    return;
  }
  // Every chunk's items in one call; a chunk whose items cannot be made finishes with that error.
  std::vector<PostprocessItem> items;
  std::vector<size_t> begin(batch.size()), count(batch.size(), 0);
  std::vector<Status> status(batch.size());
  for (size_t k = 0; k < batch.size(); ++k) {
    std::vector<PostprocessItem> own;
    status[k] = CatchAll([&] { return PostItems(*batch[k].job, batch[k].decoded, &own); });
    begin[k] = items.size();
    if (!status[k].ok()) continue;
    count[k] = own.size();
    for (auto& item : own) items.push_back(std::move(item));
  }
  StatusOr<std::vector<std::vector<MaskData>>> masks = Internal("not post-processed");
  const Clock::time_point t1 = Clock::now();
  if (!items.empty()) {
    masks = CatchAll([&] { return worker->engine().Postprocess(items); });
  }
  const uint64_t masks_us = MicrosSince(t1);
  const bool batch_ok = masks.ok() && masks->size() == items.size();
  FinishChunks(batch.size(), [&](size_t k) {
    PostChunk& c = batch[k];
    if (!status[k].ok()) {
      done(c, status[k]);
    } else if (!batch_ok) {
      // Alone, so that one chunk's failure (out of memory, a bad mask) stays its own.
      done(c, CatchAll([&] { return PostprocessChunk(c.job, c.first, c.decoded); }));
    } else {
      worker->stages()[Stage::kPostprocessMasks].Add(masks_us);
      std::vector<std::vector<MaskData>> own(std::make_move_iterator(masks->begin() + static_cast<std::ptrdiff_t>(begin[k])),
                                             std::make_move_iterator(masks->begin() +
                                                                     static_cast<std::ptrdiff_t>(begin[k] + count[k])));
      done(c, CatchAll([&] { return FinishPostChunk(c.job, c.first, c.decoded, own); }));
    }
  });
}

void Pipeline::FinishChunks(size_t n, const std::function<void(size_t)>& finish) {
  // A small batch (a click, a few calls) finishes on this thread: handing it out costs more.
  constexpr size_t kChunksPerHelper = 4;
  // MASKD_POST_FANOUT=0: every chunk on this thread (the behaviour before; a same-binary comparison
  // on the GPU host).
  static const bool fan_out = [] {
    const char* v = std::getenv("MASKD_POST_FANOUT");
    return !(v && std::string(v) == "0");
  }();
  const size_t helpers =
      fan_out ? std::min(static_cast<size_t>(std::max(0, post_pool_->threads() - 1)), n / kChunksPerHelper) : 0;
  // As on one thread, an exception comes back after every chunk ran: the caller's catch finishes
  // the chunks that were not.
  RunSpread(*post_pool_, n, helpers, finish);
}

Status Pipeline::PostItems(const Job& job, const std::vector<DecodedPrompt>& decoded,
                           std::vector<PostprocessItem>* items) {
  const CachedEmbedding& e = *job.entry;
  const MaskEncoding encoding = EncodingFor(job.output.format);
  items->reserve(items->size() + decoded.size());
  for (const auto& d : decoded) {
    if (!d.logits || d.logits->num_masks() != static_cast<int>(d.scores.size())) {
      return Internal("Engine::Decode returned " + std::to_string(d.scores.size()) + " scores and " +
                      std::to_string(d.logits ? d.logits->num_masks() : 0) + " masks for one prompt");
    }
    PostprocessItem item;
    item.logits = d.logits;
    item.original_width = e.geometry.width;
    item.original_height = e.geometry.height;
    item.input_width = e.geometry.input_width;
    item.input_height = e.geometry.input_height;
    item.encoding = encoding;
    item.rle_in_place = rle_in_place_;
    items->push_back(std::move(item));
  }
  return Status::Ok();
}

Status Pipeline::PostprocessChunk(const JobPtr& job, size_t first,
                                  const std::vector<DecodedPrompt>& decoded) {
  DeviceWorker* worker = job->worker.load();
  std::vector<PostprocessItem> items;
  MASKD_RETURN_IF_ERROR(PostItems(*job, decoded, &items));
  const Clock::time_point t0 = Clock::now();
  StatusOr<std::vector<std::vector<MaskData>>> masks = worker->engine().Postprocess(items);
  worker->stages()[Stage::kPostprocessMasks].Add(MicrosSince(t0));
  if (!masks.ok()) return masks.status();
  return FinishPostChunk(job, first, decoded, *masks);
}

Status Pipeline::FinishPostChunk(const JobPtr& job, size_t first, const std::vector<DecodedPrompt>& decoded,
                                 std::vector<std::vector<MaskData>>& masks) {
  DeviceWorker* worker = job->worker.load();
  const CachedEmbedding& e = *job->entry;
  const OutputFormat format = job->output.format;
  const MaskEncoding encoding = EncodingFor(format);
  const Clock::time_point t1 = Clock::now();
  struct EncodeTimer {  // every return below counts as the end of the encoding
    StageWindow& window;
    Clock::time_point start;
    ~EncodeTimer() { window.Add(MicrosSince(start)); }
  } encode_timer{worker->stages()[Stage::kPostprocessEncode], t1};
  if (masks.size() != decoded.size()) {
    return Internal("Engine::Postprocess returned " + std::to_string(masks.size()) +
                    " results for " + std::to_string(decoded.size()) + " prompts");
  }
  const int w = e.geometry.width, h = e.geometry.height;
  for (size_t k = 0; k < decoded.size(); ++k) {
    const DecodedPrompt& d = decoded[k];
    std::vector<MaskData>& md = masks[k];  // its strings move into the response
    if (md.size() != d.scores.size()) {
      return Internal("Engine::Postprocess returned " + std::to_string(md.size()) + " masks for a " +
                      "prompt with " + std::to_string(d.scores.size()) + " scores");
    }
    PromptResult& pr = job->segment->results[first + k];
    const int best = static_cast<int>(std::max_element(d.scores.begin(), d.scores.end()) -
                                      d.scores.begin());
    StoredResult stored;
    stored.image_id = e.image_id;
    stored.logits = d.logits;
    stored.num_masks = static_cast<int>(d.scores.size());
    stored.best_index = best;
    stored.bytes = d.logits->bytes();
    pr.result_id = worker->results().Put(std::move(stored));
    pr.best_index = static_cast<uint32_t>(best);
    std::vector<float> low_res;
    if (format == OutputFormat::kLowResLogits) low_res = d.logits->ToFloat();
    const size_t plane = static_cast<size_t>(d.logits->height()) * d.logits->width();
    pr.masks.resize(md.size());
    for (size_t m = 0; m < md.size(); ++m) {
      MaskResult& mr = pr.masks[m];
      mr.score = d.scores[m];
      mr.stability_score = md[m].stability_score;
      mr.bbox = md[m].bbox;
      mr.area = md[m].area;
      switch (encoding) {
        case MaskEncoding::kRle:
          // The device's string when it made one (the same bytes: kernels_gpu tests it), moved, or
          // copied from where it landed (rle_in_place).
          if (md[m].rle_owner) {
            mr.rle_counts.assign(md[m].rle_view);
          } else {
            mr.rle_counts = md[m].rle_string.empty() ? RleCountsToString(md[m].rle_counts)
                                                     : std::move(md[m].rle_string);
          }
          break;
        case MaskEncoding::kBitmask: {
          if (md[m].bitmask.size() != static_cast<size_t>(w) * h) {
            return Internal("Engine::Postprocess returned a bitmask of " +
                            std::to_string(md[m].bitmask.size()) + " bytes for a " +
                            std::to_string(w) + " x " + std::to_string(h) + " image");
          }
          if (format == OutputFormat::kPolygons) {
            mr.polygons = MaskToPolygons(md[m].bitmask.data(), w, h, job->output.polygon_tolerance);
            break;
          }
          StatusOr<std::string> png = EncodePngMask(md[m].bitmask.data(), w, h, options_.png);
          if (!png.ok()) return png.status();
          mr.png = std::move(*png);
          break;
        }
        case MaskEncoding::kNone: {
          if (low_res.size() < (m + 1) * plane) {
            return Internal("MaskLogits::ToFloat returned " + std::to_string(low_res.size()) +
                            " values for " + std::to_string(md.size()) + " masks");
          }
          if (d.logits->width() != d.logits->height()) {
            return Internal("MaskLogits are " + std::to_string(d.logits->width()) + " x " +
                            std::to_string(d.logits->height()) + " (expected square low-res logits)");
          }
          mr.low_res_side = d.logits->width();
          mr.low_res_logits.assign(low_res.begin() + m * plane, low_res.begin() + (m + 1) * plane);
          break;
        }
      }
    }
  }
  // Results are tied to their image: if it left the cache meanwhile, so do they.
  if (!worker->cache().Contains(e.image_id)) worker->results().DropImage(e.image_id);
  return Status::Ok();
}

void Pipeline::ChunkDone(const JobPtr& job, const Status& status) {
  if (!status.ok()) {
    std::lock_guard<std::mutex> lock(job->error_mu);
    if (job->first_error.ok()) job->first_error = status;
  }
  if (job->chunks_left.fetch_sub(1) != 1) return;
  Status s;
  {
    std::lock_guard<std::mutex> lock(job->error_mu);
    s = job->first_error;
  }
  Finish(job, s);
}

void Pipeline::StartGeneration(const JobPtr& job) {
  if (Status alive = job->control->Check(); !alive.ok()) return Finish(job, alive);
  if (generate_pool_ == nullptr) {
    return Finish(job, Unavailable("this server runs no mask generation threads (--generate-threads)"));
  }
  job->enqueued = Clock::now();
  if (!generate_pool_->TrySubmit([this, job] { Guarded(job, [&] { RunGeneration(job); }); })) {
    Finish(job, ResourceExhausted("the mask generation queue is full (" +
                                  std::to_string(generate_pool_->depth()) + " of " +
                                  std::to_string(generate_pool_->capacity()) +
                                  " generations waiting): retry with backoff"));
  }
}

StatusOr<std::vector<StatusOr<DecodedPrompt>>> Pipeline::DecodeGenerationBatch(
    const JobPtr& job, DeviceWorker* worker, const std::vector<DecodeItem>& items) {
  // A cancelled or expired call stops here, before its next batch of points.
  if (Status alive = job->control->Check(); !alive.ok()) return alive;
  if (items.empty()) return std::vector<StatusOr<DecodedPrompt>>{};
  DecoderBatcher& decoder = worker->decoder();
  const size_t chunk = std::max<size_t>(1, decoder.max_part_prompts());
  const size_t n_parts = (items.size() + chunk - 1) / chunk;
  // Filled by the batcher's thread, read by this one once `left` is 0.
  struct Wait {
    std::mutex mu;  // guards everything below
    std::condition_variable cv;
    size_t left = 0;
    Status error;
    std::vector<std::optional<DecodedPrompt>> decoded;
    uint64_t compute_us = 0;  // the decoder batches' compute, summed over the parts
  };
  const Clock::time_point t0 = Clock::now();
  auto wait = std::make_shared<Wait>();
  wait->left = n_parts;
  wait->decoded.resize(items.size());
  for (size_t c = 0; c < n_parts; ++c) {
    const size_t first = c * chunk;
    const size_t last = std::min(items.size(), first + chunk);
    // One group for the whole generation: the batcher gives it at most max_part_prompts per batch.
    DecoderBatcher::Request request = PartRequest(job, items, first, last);
    request.done = [wait, first](StatusOr<std::vector<DecodedPrompt>> decoded, const DecodeTiming& t) {
      std::lock_guard<std::mutex> lock(wait->mu);
      wait->compute_us += t.compute_us;
      if (decoded.ok()) {
        for (size_t k = 0; k < decoded->size() && first + k < wait->decoded.size(); ++k) {
          wait->decoded[first + k] = std::move((*decoded)[k]);
        }
      } else if (wait->error.ok()) {
        wait->error = decoded.status();
      }
      if (--wait->left == 0) wait->cv.notify_all();
    };
    if (Status s = decoder.Submit(std::move(request)); !s.ok()) {
      // This part and the ones after it never run; earlier parts report as usual.
      std::lock_guard<std::mutex> lock(wait->mu);
      if (wait->error.ok()) wait->error = s;
      wait->left -= n_parts - c;
      break;
    }
  }
  std::unique_lock<std::mutex> lock(wait->mu);
  wait->cv.wait(lock, [&] { return wait->left == 0; });
  // The parts queue side by side, so their queue times overlap: what the generation waited is the
  // wall time of the batch less the decoder's compute.
  const uint64_t wall = MicrosSince(t0);
  job->decoder_compute_us += wait->compute_us;
  job->decoder_queue_us += wall > wait->compute_us ? wall - wait->compute_us : 0;
  if (!wait->error.ok()) return wait->error;
  std::vector<StatusOr<DecodedPrompt>> out;
  out.reserve(items.size());
  for (auto& d : wait->decoded) {
    if (!d) return Internal("the decoder batcher returned fewer prompts than a generation batch sent");
    out.emplace_back(std::move(*d));
  }
  return out;
}

void Pipeline::RunGeneration(const JobPtr& job) {
  const uint64_t queued_us = MicrosSince(job->enqueued);
  if (Status alive = job->control->Check(); !alive.ok()) return Finish(job, alive);
  DeviceWorker* worker = job->worker.load();
  const CachedEmbedding& e = *job->entry;
  const MaskGenerationParams& params = job->generation.params;
  const Clock::time_point t0 = Clock::now();
  MaskGenerationInput input;
  input.embedding = e.embedding;
  input.width = e.geometry.width;
  input.height = e.geometry.height;
  // Crops are cut from the pixels, which the cache does not keep: decode the image again (held in
  // the byte budget while the generator runs). With only an image_id the generator answers
  // FAILED_PRECONDITION naming params.crop_n_layers.
  std::optional<ImageRGB8> pixels;
  if (params.crop_n_layers > 0 && job->image.has_bytes()) {
    const uint64_t bytes = DecodeBytes(*job);
    if (Status s = inflight_.TryReserve(bytes, job->request_bytes); !s.ok()) return Finish(job, s);
    job->decode_bytes = bytes;
    ImageLimits limits;
    limits.max_bytes = options_.limits.max_image_bytes;
    limits.max_pixels = options_.limits.max_image_pixels;
    limits.max_side = options_.limits.max_image_side;
    const ImageInput& im = job->image;
    StatusOr<ImageRGB8> decoded =
        im.kind == ImageInput::Kind::kRaw ? ImageFromRaw(im.width, im.height, im.bytes, limits, "image.raw")
                                          : DecodeImage(im.bytes, limits, "image.encoded");
    job->decode_us += MicrosSince(t0);
    if (!decoded.ok()) return Finish(job, decoded.status());
    pixels = std::move(*decoded);
    input.image = &*pixels;
  }
  const GenerationDecodeFn decode = [this, job, worker](const std::vector<DecodeItem>& items) {
    return DecodeGenerationBatch(job, worker, items);
  };
  MaskGenerationStats stats;
  StatusOr<std::vector<GeneratedMask>> masks =
      GenerateMasks(worker->engine(), input, params, decode, &stats, options_.generation_limits);
  pixels.reset();
  ReleaseDecodeBytes(*job);
  if (!masks.ok()) return Finish(job, masks.status());
  job->generate->stats = stats;
  if (Status s = FormatGenerated(job, std::move(*masks)); !s.ok()) return Finish(job, s);
  const uint64_t total = MicrosSince(t0);
  const uint64_t decoder = job->decoder_queue_us + job->decoder_compute_us;
  job->postprocess_us = total > decoder ? total - decoder : 0;
  LogRequest(spdlog::level::debug, job->rid(),
             "generated {} masks: {} crops, {} points in {} batches, {} candidates; waited {} us for a "
             "generation thread, ran {} us",
             job->generate->masks.size(), stats.crops, stats.points, stats.decoder_batches,
             stats.candidates, queued_us, total);
  Finish(job, Status::Ok());
}

Status Pipeline::FormatGenerated(const JobPtr& job, std::vector<GeneratedMask> masks) {
  const int w = job->image_out->width, h = job->image_out->height;
  const OutputSpec& output = job->generation.output;
  std::vector<GeneratedMaskResult>& out = job->generate->masks;
  out.clear();
  out.reserve(masks.size());
  for (GeneratedMask& m : masks) {
    GeneratedMaskResult r;
    r.area = m.area;
    r.bbox = m.bbox;
    r.crop_box = m.crop_box;
    r.predicted_iou = m.predicted_iou;
    r.stability_score = m.stability_score;
    r.point_x = m.point_x;
    r.point_y = m.point_y;
    if (output.format == OutputFormat::kRle) {
      r.rle_counts = RleCountsToString(m.rle_counts);
    } else {
      StatusOr<std::vector<uint8_t>> bits = RleDecode(m.rle_counts, w, h);
      if (!bits.ok()) return Internal("a generated mask does not decode: " + bits.status().message());
      if (output.format == OutputFormat::kPolygons) {
        r.polygons = MaskToPolygons(bits->data(), w, h, output.polygon_tolerance);
      } else {
        StatusOr<std::string> png = EncodePngMask(bits->data(), w, h, options_.png);
        if (!png.ok()) return png.status();
        r.png = std::move(*png);
      }
    }
    out.push_back(std::move(r));
  }
  return Status::Ok();
}

void Pipeline::ReportImage(const JobPtr& job, StatusOr<std::string> image_id) {
  if (job->image_reported.exchange(true) || !job->on_image) return;
  job->on_image(std::move(image_id));
}

void Pipeline::Finish(const JobPtr& job, Status status) {
  if (job->finished.exchange(true)) {
    LogRequest(spdlog::level::err, job->rid(),
               "request finished twice (second status {}): a server bug",
               LogSafe(status.ToString()));
    return;
  }
  const uint64_t total_us = MicrosSince(job->arrival);
  CallTiming& t = job->image_out->timing;
  t.decode_us = job->decode_us;
  t.encoder_queue_us = job->encoder_queue_us;
  t.encoder_compute_us = job->encoder_compute_us;
  t.decoder_queue_us = job->decoder_queue_us;
  t.decoder_compute_us = job->decoder_compute_us;
  t.postprocess_us = job->postprocess_us;
  t.total_us = total_us;
  if (job->segment && !status.ok()) job->segment->results.clear();
  if (job->generate && !status.ok()) job->generate->masks.clear();
  ReleaseDecodeBytes(*job);
  if (job->request_bytes > 0) inflight_.Release(job->request_bytes);
  if (DeviceWorker* w = job->worker.load()) {
    w->stages()[Stage::kDecodeQueue].Add(job->decode_queue_us);
    // A generation's seconds would hide the clicks' latency in the total stage's window.
    if (job->generate == nullptr) w->stages()[Stage::kTotal].Add(total_us);
    w->AddLoad(-1);
  }
  // A stream waits for this job's image before running its next messages: never leave it waiting.
  ReportImage(job, status.ok() ? Status(Internal("request finished without resolving its image"))
                               : status);
  Done done = std::move(job->done);
  if (done) done(status);
}

}  // namespace maskd::server
