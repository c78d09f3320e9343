// An in-process stand-in for maskd, for client and maskload tests that need a server but not a
// model: it answers at once (so a load test measures the client's own cost), with masks that are a
// pure function of the prompt (a square of side 2*kHalf around each point, clipped), so tests can
// check what the client decoded. Health is grpc's default service, SERVING. Image ids are the real
// scheme (model/io/image_id.h) over kIdentity, which GetInfo reports, and every Embed/Segment/
// SegmentStream records the x-maskd-image-id header it arrived with, so that tests can check the
// clients' affinity header against the id the server answers.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "maskd/v1/maskd.grpc.pb.h"
#include "model/io/image_codec.h"
#include "model/io/image_id.h"
#include "model/io/rle.h"

namespace maskd::testing {

class FakeMaskService final : public v1::MaskService::CallbackService {
 public:
  static constexpr int kHalf = 8;
  static constexpr char kMissingId[] = "evicted-image";
  static constexpr char kIdentity[] = "fake-model-identity";
  static constexpr char kAffinityHeader[] = "x-maskd-image-id";

  // One call as it arrived: the method ("Embed", "Segment", "SegmentStream"), its affinity header
  // (nullopt: none) and, for Embed/Segment, the image_id this server gives the request's image.
  struct SeenCall {
    std::string method;
    std::optional<std::string> affinity;
    std::string image_id;
  };
  std::vector<SeenCall> seen_calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

  // The rectangle mask of a point on a width x height image, row-major.
  static std::vector<uint8_t> SquareMask(float x, float y, int width, int height) {
    std::vector<uint8_t> m(static_cast<size_t>(width) * height, 0);
    const int cx = static_cast<int>(x), cy = static_cast<int>(y);
    for (int yy = std::max(0, cy - kHalf); yy < std::min(height, cy + kHalf); ++yy)
      for (int xx = std::max(0, cx - kHalf); xx < std::min(width, cx + kHalf); ++xx)
        m[static_cast<size_t>(yy) * width + xx] = 1;
    return m;
  }

  grpc::ServerUnaryReactor* Embed(grpc::CallbackServerContext* ctx, const v1::EmbedRequest* req,
                                  v1::EmbedResponse* resp) override {
    Note("Embed", *ctx, ImageIdForEncoded(kIdentity, req->image().encoded()));
    auto* reactor = ctx->DefaultReactor();
    int w = 0, h = 0;
    if (!SizeOf(req->image().encoded(), &w, &h)) {
      reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "image.encoded: not an image"));
      return reactor;
    }
    resp->set_image_id(IdFor(req->image().encoded()));
    resp->set_width(w);
    resp->set_height(h);
    embeds.fetch_add(1);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* Segment(grpc::CallbackServerContext* ctx, const v1::SegmentRequest* req,
                                    v1::SegmentResponse* resp) override {
    Note("Segment", *ctx,
         req->has_image() ? ImageIdForEncoded(kIdentity, req->image().encoded()) : req->image_id());
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(Answer(*req, resp));
    return reactor;
  }

  grpc::ServerBidiReactor<v1::SegmentRequest, v1::SegmentResponse>* SegmentStream(
      grpc::CallbackServerContext* ctx) override {
    Note("SegmentStream", *ctx);
    class Stream : public grpc::ServerBidiReactor<v1::SegmentRequest, v1::SegmentResponse> {
     public:
      explicit Stream(FakeMaskService* s) : service_(s) { StartRead(&request_); }
      void OnReadDone(bool ok) override {
        if (!ok) {
          Finish(grpc::Status::OK);
          return;
        }
        response_.Clear();
        if (request_.image_source_case() == v1::SegmentRequest::IMAGE_SOURCE_NOT_SET) {
          request_.set_image_id(current_);
        }
        grpc::Status s = service_->Answer(request_, &response_);
        if (s.ok()) {
          current_ = response_.image_id();
        } else {
          response_.Clear();
          response_.mutable_error()->set_code(s.error_code());
          response_.mutable_error()->set_message(s.error_message());
        }
        StartWrite(&response_);
      }
      void OnWriteDone(bool ok) override {
        if (!ok) {
          Finish(grpc::Status::OK);
          return;
        }
        StartRead(&request_);
      }
      void OnDone() override { delete this; }

     private:
      FakeMaskService* service_;
      v1::SegmentRequest request_;
      v1::SegmentResponse response_;
      std::string current_;
    };
    return new Stream(this);
  }

  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* ctx, const v1::GetInfoRequest*,
                                    v1::GetInfoResponse* resp) override {
    resp->set_version("fake");
    resp->mutable_model()->set_arch("fake");
    if (report_identity.load()) resp->mutable_model()->set_identity(kIdentity);
    infos.fetch_add(1);
    resp->set_precision("fp32");
    resp->mutable_memory()->set_allocated_bytes(1 << 20);
    resp->mutable_memory()->set_peak_allocated_bytes(2 << 20);
    v1::StageTiming* st = resp->add_stages();
    st->set_stage("decoder_compute");
    st->set_count(segments.load());
    resp->set_calls(segments.load() + embeds.load());
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::Status Answer(const v1::SegmentRequest& req, v1::SegmentResponse* resp) {
    int w = 0, h = 0;
    std::string id;
    if (req.has_image()) {
      if (!SizeOf(req.image().encoded(), &w, &h)) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "image.encoded: not an image");
      }
      id = IdFor(req.image().encoded());
    } else {
      id = req.image_id();
      std::lock_guard<std::mutex> lock(mu_);
      auto it = std::find_if(known_.begin(), known_.end(), [&](const Known& k) { return k.id == id; });
      if (id == kMissingId || it == known_.end()) {
        return grpc::Status(grpc::StatusCode::NOT_FOUND,
                            "image_id '" + id + "' is not cached: re-send the image");
      }
      w = it->width;
      h = it->height;
    }
    if (req.prompts_size() == 0) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "prompts: expected 1..256 prompts, got 0");
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_request = req;
    }
    resp->set_image_id(id);
    resp->set_width(w);
    resp->set_height(h);
    resp->set_request_tag(req.request_tag());
    for (int p = 0; p < req.prompts_size(); ++p) {
      const v1::Prompt& prompt = req.prompts(p);
      const float x = prompt.points_size() ? prompt.points(0).x() : prompt.box().x0();
      const float y = prompt.points_size() ? prompt.points(0).y() : prompt.box().y0();
      v1::PromptResult* pr = resp->add_results();
      pr->set_result_id(id + "/" + std::to_string(p));
      const int n = prompt.multimask() ? 3 : 1;
      std::vector<uint8_t> mask = SquareMask(x, y, w, h);
      const std::vector<uint32_t> counts = RleEncode(mask.data(), w, h);
      for (int k = 0; k < n; ++k) {
        v1::MaskResult* m = pr->add_masks();
        m->set_score(0.5f + 0.1f * k);
        m->set_area(RleArea(counts));
        if (req.output_format() == v1::OUTPUT_FORMAT_PNG) {
          m->set_png(*EncodePngMask(mask.data(), w, h));
        } else {
          m->mutable_rle()->add_size(h);
          m->mutable_rle()->add_size(w);
          m->mutable_rle()->set_counts(RleCountsToString(counts));
        }
      }
      pr->set_best_index(n - 1);
    }
    resp->mutable_timing()->set_total_us(1);
    segments.fetch_add(1);
    return grpc::Status::OK;
  }

  std::atomic<uint64_t> segments{0}, embeds{0}, infos{0};
  // Off: GetInfo reports no model identity (an older server), so clients cannot compute ids.
  std::atomic<bool> report_identity{true};
  v1::SegmentRequest last_request;  // guarded by mu_ (read after the call returned)

 private:
  struct Known {
    std::string id;
    int width, height;
  };

  // Decoding a full JPEG per call would make the fake slow; the size is all it needs, so it is
  // remembered per distinct file tail (maskload's unique-comment JPEGs differ only at the front).
  bool SizeOf(const std::string& bytes, int* w, int* h) {
    if (DetectImageFormat(bytes) == ImageFormat::kUnknown) return false;
    const std::string tail = bytes.substr(bytes.size() > 64 ? bytes.size() - 64 : 0);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = sizes_.find(tail);
      if (it != sizes_.end()) {
        *w = it->second.first;
        *h = it->second.second;
        return true;
      }
    }
    StatusOr<ImageRGB8> im = DecodeImage(bytes);
    if (!im.ok()) return false;
    *w = im->width;
    *h = im->height;
    std::lock_guard<std::mutex> lock(mu_);
    sizes_[tail] = {*w, *h};
    return true;
  }

  void Note(const char* method, const grpc::CallbackServerContext& ctx, std::string image_id = {}) {
    SeenCall call{method, std::nullopt, std::move(image_id)};
    const auto& md = ctx.client_metadata();
    auto it = md.find(kAffinityHeader);
    if (it != md.end()) call.affinity = std::string(it->second.data(), it->second.size());
    std::lock_guard<std::mutex> lock(mu_);
    seen_.push_back(std::move(call));
  }

  std::string IdFor(const std::string& bytes) {
    const std::string id = ImageIdForEncoded(kIdentity, bytes);
    int w = 0, h = 0;
    SizeOf(bytes, &w, &h);
    std::lock_guard<std::mutex> lock(mu_);
    if (std::none_of(known_.begin(), known_.end(), [&](const Known& k) { return k.id == id; })) {
      known_.push_back({id, w, h});
    }
    return id;
  }

  std::mutex mu_;  // guards known_, sizes_, last_request, seen_
  std::vector<Known> known_;
  std::map<std::string, std::pair<int, int>> sizes_;
  std::vector<SeenCall> seen_;
};

// The fake on an ephemeral loopback port.
class FakeMaskd {
 public:
  FakeMaskd() {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service);
    builder.SetMaxReceiveMessageSize(64 << 20);
    server_ = builder.BuildAndStart();
    server_->GetHealthCheckService()->SetServingStatus("maskd.v1.MaskService", true);
  }
  ~FakeMaskd() { server_->Shutdown(); }
  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }
  void SetServing(bool serving) {
    server_->GetHealthCheckService()->SetServingStatus("maskd.v1.MaskService", serving);
  }

  FakeMaskService service;

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace maskd::testing
