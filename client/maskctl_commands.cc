#include "client/maskctl_commands.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <thread>

#include "client/client.h"
#include "client/embedding.h"
#include "client/coco_export.h"
#include "client/mask_codec.h"
#include "client/overlay.h"
#include "client/prompt_parse.h"
#include "client/security_flags.h"

namespace maskd::client {
namespace {

ClientOptions OptionsFrom(const MaskctlConfig& c) {
  ClientOptions o;
  o.target = c.server;
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(c.timeout_s * 1000));
  o.connect_timeout = std::chrono::milliseconds(static_cast<int64_t>(c.connect_timeout_s * 1000));
  return o;
}

StatusOr<std::unique_ptr<Client>> ConnectFrom(const MaskctlConfig& c) {
  ClientOptions o = OptionsFrom(c);
  MASKD_RETURN_IF_ERROR(ApplySecurityFlags(c.security, &o.security));
  return Client::Connect(o);
}

int Fail(std::ostream& err, const Status& status) {
  err << "maskctl: " << status.ToString() << "\n";
  return 1;
}

std::string ToJson(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(m, &json, options);
  return json;
}

std::string Mib(uint64_t bytes) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << bytes / (1024.0 * 1024.0) << " MiB";
  return s.str();
}

std::string Ms(uint64_t us) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(2) << us / 1000.0 << " ms";
  return s.str();
}

void PrintTiming(std::ostream& out, const v1::CallTiming& t) {
  out << "timing: total " << Ms(t.total_us()) << " (decode " << Ms(t.decode_us()) << ", encoder queue "
      << Ms(t.encoder_queue_us()) << " + compute " << Ms(t.encoder_compute_us())
      << ", decoder queue " << Ms(t.decoder_queue_us()) << " + compute "
      << Ms(t.decoder_compute_us()) << ", postprocess " << Ms(t.postprocess_us()) << ")\n";
}

void PrintQueue(std::ostream& out, const char* name, const v1::QueueStats& q) {
  out << "  " << name << ": depth " << q.depth() << "/" << q.capacity() << ", " << q.batches()
      << " batches, " << q.items() << " items (mean batch " << std::fixed << std::setprecision(2)
      << q.mean_batch_size() << "), rejected " << q.rejected() << ", dropped " << q.dropped();
  if (q.oom_splits() > 0 || q.oom_failures() > 0)
    out << ", out of memory: " << q.oom_splits() << " splits, " << q.oom_failures() << " failed alone";
  out << "\n";
}

void PrintInfo(std::ostream& out, const v1::GetInfoResponse& info) {
  const v1::ModelInfo& m = info.model();
  out << "maskd " << info.version() << ", up " << info.uptime_seconds() << " s\n";
  out << "model: " << m.arch() << (m.demo() ? " (built-in demo: random weights)" : "") << " from "
      << m.checkpoint() << "\n";
  out << "  identity " << m.identity() << ", " << m.parameter_count() << " parameters, encoder dim "
      << m.encoder_embed_dim() << " depth " << m.encoder_depth() << " heads " << m.encoder_num_heads()
      << " global attention at [";
  for (int i = 0; i < m.encoder_global_attn_indexes_size(); ++i)
    out << (i ? ", " : "") << m.encoder_global_attn_indexes(i);
  out << "], input " << m.image_size() << " px\n";
  out << "precision: " << info.precision() << "; optimisations:";
  if (info.optimisations().empty()) out << " none";
  for (const std::string& o : info.optimisations()) out << " " << o;
  out << "\n";
  const v1::CacheStats& c = info.cache();
  out << "cache: device " << c.device().entries() << " entries " << Mib(c.device().bytes()) << " / "
      << Mib(c.device().capacity_bytes()) << ", host " << c.host().entries() << " entries "
      << Mib(c.host().bytes()) << " / " << Mib(c.host().capacity_bytes()) << "\n";
  out << "  hits " << c.hits() << ", misses " << c.misses() << ", evictions " << c.evictions()
      << ", demotions " << c.demotions() << ", single-flight joins " << c.single_flight_joins()
      << ", stored results " << c.results() << " (" << Mib(c.result_bytes()) << ")\n";
  out << "queues:\n";
  PrintQueue(out, "encoder", info.encoder_queue());
  PrintQueue(out, "decoder", info.decoder_queue());
  const v1::GpuMemory& g = info.memory();
  out << "memory: allocated " << Mib(g.allocated_bytes()) << ", peak " << Mib(g.peak_allocated_bytes())
      << ", reserved " << Mib(g.reserved_bytes()) << ", total " << Mib(g.total_bytes()) << "\n";
  if (!info.stages().empty()) {
    out << "stages (recent window):\n";
    for (const v1::StageTiming& s : info.stages()) {
      out << "  " << std::left << std::setw(22) << s.stage() << std::right << " n=" << s.count()
          << " mean " << Ms(static_cast<uint64_t>(s.mean_us())) << " p50 "
          << Ms(static_cast<uint64_t>(s.p50_us())) << " p99 " << Ms(static_cast<uint64_t>(s.p99_us()))
          << "\n";
    }
  }
  for (const v1::DeviceInfo& d : info.devices()) {
    out << "device " << d.device() << " (" << d.name() << "): cache hits " << d.cache().hits()
        << ", memory peak " << Mib(d.memory().peak_allocated_bytes()) << "\n";
  }
  const v1::Limits& l = info.limits();
  out << "limits: image " << Mib(l.max_image_bytes()) << ", " << l.max_image_pixels()
      << " pixels, " << l.max_prompts_per_request() << " prompts/request, "
      << l.max_points_per_prompt() << " points/prompt\n";
  if (l.has_generation()) {
    const v1::GenerationLimits& g = l.generation();
    out << "generation limits: " << g.max_points_per_side() << " points/side, " << g.max_grid_points()
        << " grid points, " << g.max_points_per_batch() << " points/batch, " << g.max_crop_n_layers()
        << " crop layers, downscale factor " << g.max_crop_n_points_downscale_factor() << "\n";
  }
  out << "calls: " << info.calls();
  for (const auto& [code, n] : info.calls_by_status()) out << ", " << code << " " << n;
  out << "\n";
  // Cold start, in ms after the process started; "-" = not reached yet.
  const v1::StartupTimes& st = info.startup();
  const std::pair<const char*, double> phases[] = {
      {"main", st.main_ms()},         {"listening", st.listening_ms()},
      {"checkpoint read", st.checkpoint_read_ms()}, {"weights ready", st.weights_ready_ms()},
      {"warmed up", st.warmed_up_ms()}, {"SERVING", st.serving_ms()},
      {"first mask", st.first_mask_ms()}};
  out << "startup (ms after process start):";
  for (const auto& [name, ms] : phases) {
    out << (name == phases[0].first ? " " : ", ") << name << " ";
    if (ms > 0) {
      out << std::fixed << std::setprecision(1) << ms;
    } else {
      out << "-";
    }
  }
  out << "\n";
}

void PrintSegment(std::ostream& out, const v1::SegmentResponse& r) {
  out << "image_id " << r.image_id() << " (" << r.width() << "x" << r.height()
      << (r.cached() ? ", cached embedding" : "") << ")\n";
  for (int p = 0; p < r.results_size(); ++p) {
    const v1::PromptResult& pr = r.results(p);
    out << "prompt " << p << ": result_id " << pr.result_id() << "\n";
    for (int k = 0; k < pr.masks_size(); ++k) {
      const v1::MaskResult& m = pr.masks(k);
      out << "  mask " << k << (static_cast<uint32_t>(k) == pr.best_index() ? " *" : "  ")
          << " score " << std::fixed << std::setprecision(4) << m.score() << " stability "
          << m.stability_score() << " area " << m.area() << " bbox [" << m.bbox().x() << ", "
          << m.bbox().y() << ", " << m.bbox().width() << ", " << m.bbox().height() << "]";
      if (m.has_rle()) out << " rle " << m.rle().counts().size() << " B";
      if (!m.png().empty()) out << " png " << m.png().size() << " B";
      if (m.has_polygons()) {
        int holes = 0, vertices = 0;
        for (const v1::Polygon& poly : m.polygons().polygons()) {
          holes += poly.hole();
          vertices += poly.points_size() / 2;
        }
        out << " polygons " << m.polygons().polygons_size() - holes << " + " << holes << " holes, "
            << vertices << " vertices";
      }
      out << "\n";
    }
  }
  PrintTiming(out, r.timing());
}

struct SegmentFlags {
  std::string image_path;
  std::string image_id;
  std::vector<std::string> points;
  std::string box;
  std::string mask_from;
  int mask_index = -1;
  bool multimask = false;
  std::string format = "rle";
  float polygon_tolerance = 0;
  std::string out_json;
  std::string out_coco;
  std::string out_overlay;
  std::string tag;
};

int RunSegment(const MaskctlConfig& config, const SegmentFlags& f, std::ostream& out,
               std::ostream& err) {
  if (f.image_path.empty() == f.image_id.empty()) {
    return Fail(err, InvalidArgument("segment: give exactly one of IMAGE or --image-id"));
  }
  if (!f.out_overlay.empty() && f.image_path.empty()) {
    return Fail(err, InvalidArgument("--out-overlay needs IMAGE: the server does not return pixels"));
  }
  PromptArg prompt;
  for (const std::string& text : f.points) {
    StatusOr<PointArg> p = ParsePoint(text);
    if (!p.ok()) return Fail(err, p.status());
    prompt.points.push_back(*p);
  }
  if (!f.box.empty()) {
    StatusOr<BoxArg> b = ParseBox(f.box);
    if (!b.ok()) return Fail(err, b.status());
    prompt.box = *b;
  }
  prompt.mask_from = f.mask_from;
  if (f.mask_index >= 0) prompt.mask_index = static_cast<uint32_t>(f.mask_index);
  prompt.multimask = f.multimask;
  StatusOr<v1::OutputFormat> format = ParseOutputFormat(f.format);
  if (!format.ok()) return Fail(err, format.status());
  if (!f.out_overlay.empty() && *format == v1::OUTPUT_FORMAT_LOW_RES_LOGITS) {
    return Fail(err, InvalidArgument("--out-overlay needs --format rle, png or polygons (logits are "
                                     "256x256)"));
  }
  if (!f.out_coco.empty() && *format == v1::OUTPUT_FORMAT_LOW_RES_LOGITS) {
    return Fail(err, InvalidArgument("--out-coco needs --format rle, png or polygons (COCO has no "
                                     "low-res logits)"));
  }

  SegmentArgs args;
  std::string image_bytes;
  if (!f.image_path.empty()) {
    StatusOr<std::string> bytes = ReadFileBytes(f.image_path);
    if (!bytes.ok()) return Fail(err, bytes.status());
    image_bytes = std::move(*bytes);
    args.image = ImageArg::Encoded(image_bytes);
  } else {
    args.image = ImageArg::Id(f.image_id);
  }
  args.prompts.push_back(prompt);
  args.format = *format;
  args.polygon_tolerance = f.polygon_tolerance;
  args.request_tag = f.tag;

  StatusOr<std::unique_ptr<Client>> client = ConnectFrom(config);
  if (!client.ok()) return Fail(err, client.status());
  StatusOr<v1::SegmentResponse> response = (*client)->Segment(args);
  if (!response.ok()) return Fail(err, response.status());
  PrintSegment(out, *response);

  if (!f.out_json.empty()) {
    Status s = WriteFileBytes(f.out_json, ToJson(*response) + "\n");
    if (!s.ok()) return Fail(err, s);
    out << "wrote " << f.out_json << "\n";
  }
  if (!f.out_coco.empty()) {
    CocoImage image;
    image.file_name = f.image_path.empty() ? response->image_id() : f.image_path;
    image.response = *response;
    StatusOr<std::string> coco = CocoAnnotationsJson({image});
    if (!coco.ok()) return Fail(err, coco.status());
    Status s = WriteFileBytes(f.out_coco, *coco + "\n");
    if (!s.ok()) return Fail(err, s);
    out << "wrote " << f.out_coco << "\n";
  }
  if (!f.out_overlay.empty()) {
    if (response->results_size() == 0 || response->results(0).masks_size() == 0) {
      return Fail(err, Internal("segment: the server returned no masks to draw"));
    }
    const v1::PromptResult& pr = response->results(0);
    const uint32_t best = pr.best_index() < static_cast<uint32_t>(pr.masks_size()) ? pr.best_index() : 0;
    StatusOr<ImageRGB8> image = DecodeImageBytes(image_bytes);
    if (!image.ok()) return Fail(err, image.status());
    if (image->width != static_cast<int>(response->width()) ||
        image->height != static_cast<int>(response->height())) {
      // EXIF orientation rotates the server's frame; the overlay would not line up.
      return Fail(err, InvalidArgument("--out-overlay: decoded image is " + std::to_string(image->width) +
                                       "x" + std::to_string(image->height) + " but the server saw " +
                                       std::to_string(response->width()) + "x" +
                                       std::to_string(response->height()) + " (EXIF orientation?)"));
    }
    StatusOr<std::vector<uint8_t>> mask = DecodeMask(pr.masks(best), image->width, image->height);
    if (!mask.ok()) return Fail(err, mask.status());
    StatusOr<ImageRGB8> overlay = DrawOverlay(*image, *mask, prompt);
    if (!overlay.ok()) return Fail(err, overlay.status());
    StatusOr<std::string> png = EncodePng(*overlay);
    if (!png.ok()) return Fail(err, png.status());
    Status s = WriteFileBytes(f.out_overlay, *png);
    if (!s.ok()) return Fail(err, s);
    out << "wrote " << f.out_overlay << " (mask " << best << ")\n";
  }
  return 0;
}

// `maskctl everything`: the generator's parameters as flags; only those given are sent (the server
// applies the original's defaults to the rest).
struct EverythingFlags {
  std::string input;  // an image file or a folder of them
  std::string format = "rle";
  float polygon_tolerance = 0;
  std::string out_coco, out_json, tag;
  int points_per_side = 32, points_per_batch = 64, crop_n_layers = 0;
  int crop_n_points_downscale_factor = 1, min_mask_region_area = 0;
  float pred_iou_thresh = 0.88f, stability_score_thresh = 0.95f, stability_score_offset = 1.0f;
  float box_nms_thresh = 0.7f, crop_nms_thresh = 0.7f;
  double crop_overlap_ratio = 512.0 / 1500.0;
  // The options whose values were given (CLI::Option::count() after parsing).
  std::vector<std::pair<std::string, CLI::Option*>> given;
  bool Given(const std::string& name) const {
    for (const auto& [n, o] : given)
      if (n == name) return o->count() > 0;
    return false;
  }
};

bool IsImageFile(const std::filesystem::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png" || ext == ".webp";
}

StatusOr<std::vector<std::string>> EverythingInputs(const std::string& input) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(input, ec)) {
    if (!fs::is_regular_file(input, ec)) {
      return InvalidArgument("everything: IMAGE_OR_FOLDER = \"" + input +
                             "\" is neither a file nor a folder");
    }
    return std::vector<std::string>{input};
  }
  std::vector<std::string> files;
  for (const fs::directory_entry& e : fs::directory_iterator(input, ec)) {
    if (e.is_regular_file() && IsImageFile(e.path())) files.push_back(e.path().string());
  }
  if (ec) return InvalidArgument("everything: cannot list \"" + input + "\": " + ec.message());
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    return InvalidArgument("everything: the folder \"" + input +
                           "\" holds no .jpg, .jpeg, .png or .webp files");
  }
  return files;
}

v1::GenerateMasksRequest BuildGenerateRequest(const EverythingFlags& f, v1::OutputFormat format) {
  v1::GenerateMasksRequest r;
  r.set_output_format(format);
  r.set_polygon_tolerance(f.polygon_tolerance);
  r.set_request_tag(f.tag);
  v1::MaskGenerationParams* p = r.mutable_params();
  if (f.Given("points-per-side")) p->set_points_per_side(f.points_per_side);
  if (f.Given("points-per-batch")) p->set_points_per_batch(f.points_per_batch);
  if (f.Given("pred-iou-thresh")) p->set_pred_iou_thresh(f.pred_iou_thresh);
  if (f.Given("stability-score-thresh")) p->set_stability_score_thresh(f.stability_score_thresh);
  if (f.Given("stability-score-offset")) p->set_stability_score_offset(f.stability_score_offset);
  if (f.Given("box-nms-thresh")) p->set_box_nms_thresh(f.box_nms_thresh);
  if (f.Given("crop-n-layers")) p->set_crop_n_layers(f.crop_n_layers);
  if (f.Given("crop-nms-thresh")) p->set_crop_nms_thresh(f.crop_nms_thresh);
  if (f.Given("crop-overlap-ratio")) p->set_crop_overlap_ratio(f.crop_overlap_ratio);
  if (f.Given("crop-n-points-downscale-factor")) {
    p->set_crop_n_points_downscale_factor(f.crop_n_points_downscale_factor);
  }
  if (f.Given("min-mask-region-area")) p->set_min_mask_region_area(f.min_mask_region_area);
  return r;
}

int RunEverything(const MaskctlConfig& config, const EverythingFlags& f, std::ostream& out,
                  std::ostream& err) {
  StatusOr<v1::OutputFormat> format = ParseOutputFormat(f.format);
  if (!format.ok()) return Fail(err, format.status());
  StatusOr<std::vector<std::string>> files = EverythingInputs(f.input);
  if (!files.ok()) return Fail(err, files.status());
  StatusOr<std::unique_ptr<Client>> client = ConnectFrom(config);
  if (!client.ok()) return Fail(err, client.status());
  const v1::GenerateMasksRequest base = BuildGenerateRequest(f, *format);
  std::vector<CocoGeneratedImage> done;
  int failed = 0;
  const size_t n = files->size();
  for (size_t i = 0; i < n; ++i) {
    const std::string& path = (*files)[i];
    // Progress: one line per image, "[i/n]" when the input is a folder.
    const std::string prefix = n > 1 ? "[" + std::to_string(i + 1) + "/" + std::to_string(n) + "] " : "";
    StatusOr<std::string> bytes = ReadFileBytes(path);
    if (!bytes.ok()) {
      ++failed;
      err << "maskctl: " << prefix << path << ": " << bytes.status().ToString() << "\n";
      continue;
    }
    v1::GenerateMasksRequest request = base;
    request.mutable_image()->set_encoded(std::move(*bytes));
    StatusOr<v1::GenerateMasksResponse> r = (*client)->GenerateMasks(request);
    if (!r.ok()) {
      ++failed;
      err << "maskctl: " << prefix << path << ": " << r.status().ToString() << "\n";
      continue;
    }
    const v1::GenerationStats& st = r->stats();
    out << prefix << path << ": " << r->masks_size() << " masks (" << r->width() << "x" << r->height()
        << ", " << st.crops() << " crop(s), " << st.points() << " points, " << st.candidates()
        << " candidates) in " << Ms(r->timing().total_us()) << (r->cached() ? ", cached embedding" : "")
        << "\n";
    out.flush();
    done.push_back({path, std::move(*r)});
  }
  if (!f.out_json.empty()) {
    // One GenerateMasksResponse per line (JSON Lines), in input order.
    std::string lines;
    google::protobuf::util::JsonPrintOptions options;
    options.preserve_proto_field_names = true;
    for (const CocoGeneratedImage& d : done) {
      std::string line;
      (void)google::protobuf::util::MessageToJsonString(d.response, &line, options);
      lines += line + "\n";
    }
    if (Status s = WriteFileBytes(f.out_json, lines); !s.ok()) return Fail(err, s);
    out << "wrote " << f.out_json << "\n";
  }
  if (!f.out_coco.empty()) {
    StatusOr<std::string> coco = CocoGeneratedAnnotationsJson(done);
    if (!coco.ok()) return Fail(err, coco.status());
    if (Status s = WriteFileBytes(f.out_coco, *coco + "\n"); !s.ok()) return Fail(err, s);
    size_t masks = 0;
    for (const CocoGeneratedImage& d : done) masks += static_cast<size_t>(d.response.masks_size());
    out << "wrote " << f.out_coco << " (" << done.size() << " images, " << masks << " annotations)\n";
  }
  if (failed > 0) {
    err << "maskctl: everything: " << failed << " of " << n << " images failed\n";
    return 1;
  }
  return 0;
}

// --format and --polygon-tolerance for segment and everything, which differ only in the formats
// they offer (everything has no low-res logits).
void AddMaskFormatOptions(CLI::App* cmd, std::string* format, float* polygon_tolerance,
                          const std::string& format_help, const std::vector<std::string>& formats) {
  cmd->add_option("--format", *format, format_help)->check(CLI::IsMember(formats))->capture_default_str();
  cmd->add_option("--polygon-tolerance", *polygon_tolerance,
                  "--format polygons: Douglas-Peucker tolerance in pixels (0 = exact pixel outline)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
}

}  // namespace

void AddClientCommands(CLI::App& app, MaskctlConfig& config, MaskctlRun& run, std::ostream& out,
                       std::ostream& err) {
  app.add_option("--server", config.server, "maskd address HOST:PORT")
      ->envname("MASKD_SERVER")
      ->capture_default_str();
  app.add_option("--timeout", config.timeout_s, "deadline of each call, seconds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--connect-timeout", config.connect_timeout_s,
                 "how long to wait for the connection, seconds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  AddSecurityFlags(app, config.security);

  // embed
  {
    auto path = std::make_shared<std::string>();
    auto json = std::make_shared<bool>(false);
    auto return_embedding = std::make_shared<std::string>();
    auto out_embedding = std::make_shared<std::string>();
    CLI::App* embed = app.add_subcommand(
        "embed", "Compute (or find cached) the embedding of IMAGE; prints its image_id");
    embed->add_option("IMAGE", *path, "JPEG, PNG or WebP file")->required()->check(CLI::ExistingFile);
    embed->add_flag("--json", *json, "print the EmbedResponse as JSON");
    embed->add_option("--return-embedding", *return_embedding,
                      "also fetch the embedding (1x256x64x64) as fp32, bf16 or fp16 "
                      "(bf16/fp16: 2 MiB on the wire, fp32: 4 MiB)");
    embed->add_option("--out-embedding", *out_embedding,
                      "write the embedding to FILE.npy as float32 (numpy format 1.0; bf16/fp16 "
                      "widened exactly); without --return-embedding it is fetched as bf16");
    embed->callback([&config, &run, &out, &err, path, json, return_embedding, out_embedding] {
      StatusOr<std::string> bytes = ReadFileBytes(*path);
      if (!bytes.ok()) {
        run.exit_code = Fail(err, bytes.status());
        return;
      }
      v1::EmbedRequest request;
      request.mutable_image()->set_encoded(std::move(*bytes));
      if (!return_embedding->empty() || !out_embedding->empty()) {
        StatusOr<v1::EmbeddingDtype> d =
            ParseEmbeddingDtype(return_embedding->empty() ? "bf16" : *return_embedding);
        if (!d.ok()) {
          run.exit_code = Fail(err, InvalidArgument("--return-embedding: " + d.status().message()));
          return;
        }
        request.set_return_embedding(*d);
      }
      StatusOr<std::unique_ptr<Client>> client = ConnectFrom(config);
      if (!client.ok()) {
        run.exit_code = Fail(err, client.status());
        return;
      }
      StatusOr<v1::EmbedResponse> r = (*client)->Embed(request);
      if (!r.ok()) {
        run.exit_code = Fail(err, r.status());
        return;
      }
      if (!out_embedding->empty()) {
        StatusOr<std::vector<float>> values = EmbeddingToFloat(r->embedding());
        if (!values.ok()) {
          run.exit_code = Fail(err, values.status());
          return;
        }
        const std::vector<uint32_t> shape(r->embedding().shape().begin(), r->embedding().shape().end());
        if (Status s = WriteFileBytes(*out_embedding, NpyFloat32(*values, shape)); !s.ok()) {
          run.exit_code = Fail(err, s);
          return;
        }
      }
      if (*json) {
        out << ToJson(*r) << "\n";
      } else {
        out << "image_id " << r->image_id() << " (" << r->width() << "x" << r->height()
            << (r->cached() ? ", cached" : ", computed") << ")\n";
        if (r->has_embedding()) {
          const v1::ImageEmbedding& e = r->embedding();
          out << "embedding " << v1::EmbeddingDtype_Name(e.dtype()) << " shape [";
          for (int i = 0; i < e.shape_size(); ++i) out << (i ? ", " : "") << e.shape(i);
          out << "], " << e.data().size() << " bytes, input size " << e.input_width() << "x"
              << e.input_height();
          if (!out_embedding->empty()) out << " -> " << *out_embedding;
          out << "\n";
        }
        PrintTiming(out, r->timing());
      }
      run.exit_code = 0;
    });
  }

  // segment
  {
    auto f = std::make_shared<SegmentFlags>();
    CLI::App* seg = app.add_subcommand(
        "segment", "Segment one prompt (points and/or a box) on IMAGE or a cached --image-id");
    seg->add_option("IMAGE", f->image_path, "JPEG, PNG or WebP file (or use --image-id)")
        ->check(CLI::ExistingFile);
    seg->add_option("--image-id", f->image_id, "image_id of an earlier embed/segment (cached on the server)");
    seg->add_option("--point", f->points,
                    "x,y[,label] in original image pixels; label 1|fg (default) or 0|bg; repeatable")
        ->allow_extra_args(false)
        ->take_all();
    seg->add_option("--box", f->box, "x0,y0,x1,y1 in original image pixels");
    seg->add_option("--mask-from", f->mask_from,
                    "result_id of an earlier result on the same image, fed back as the mask input");
    seg->add_option("--mask-index", f->mask_index,
                    "which mask of --mask-from to use (default: its best)")
        ->check(CLI::NonNegativeNumber);
    seg->add_flag("--multimask", f->multimask, "return SAM's three candidate masks instead of one");
    AddMaskFormatOptions(seg, &f->format, &f->polygon_tolerance,
                         "mask format: rle (COCO RLE), png, logits (256x256 low-res), polygons "
                         "(outer contours and holes)",
                         {"rle", "png", "logits", "polygons"});
    seg->add_option("--out-json", f->out_json, "write the SegmentResponse as JSON to FILE");
    seg->add_option("--out-coco", f->out_coco,
                    "write the masks as a COCO annotations JSON to FILE (images, annotations with "
                    "segmentation, area, bbox, score; categories), readable by pycocotools; "
                    "segmentation is RLE, or polygons with --format polygons");
    seg->add_option("--out-overlay", f->out_overlay,
                    "write a PNG of IMAGE with the best mask blended in colour and the prompt drawn");
    seg->add_option("--tag", f->tag, "request tag echoed by the server and shown in its logs");
    seg->callback([&config, &run, &out, &err, f] {
      if (f->points.empty() && f->box.empty()) {
        run.exit_code = Fail(err, InvalidArgument("segment: give at least one --point or a --box"));
        return;
      }
      run.exit_code = RunSegment(config, *f, out, err);
    });
  }

  // everything
  {
    auto f = std::make_shared<EverythingFlags>();
    CLI::App* ev = app.add_subcommand(
        "everything",
        "Automatic mask generation (\"segment everything\", the original SamAutomaticMaskGenerator) on "
        "an image or every image of a folder, with progress; parameters not given take the "
        "original's defaults");
    ev->add_option("IMAGE_OR_FOLDER", f->input, "JPEG, PNG or WebP file, or a folder of them")->required();
    AddMaskFormatOptions(ev, &f->format, &f->polygon_tolerance, "mask format: rle (COCO RLE), png, polygons",
                         {"rle", "png", "polygons"});
    ev->add_option("--out-coco", f->out_coco,
                   "write every image's masks as one COCO annotations JSON to FILE (images, "
                   "annotations with segmentation, area, bbox, score; categories), readable by "
                   "pycocotools");
    ev->add_option("--out-json", f->out_json,
                   "write each image's GenerateMasksResponse as one JSON line to FILE");
    ev->add_option("--tag", f->tag, "request tag echoed by the server and shown in its logs");
    auto param = [&](const std::string& name, auto* target, const std::string& help) {
      CLI::Option* o = ev->add_option("--" + name, *target, help)->capture_default_str();
      f->given.emplace_back(name, o);
    };
    param("points-per-side", &f->points_per_side, "grid points per side of the whole image");
    param("points-per-batch", &f->points_per_batch, "grid points decoded together");
    param("pred-iou-thresh", &f->pred_iou_thresh, "keep masks whose predicted IoU is > this");
    param("stability-score-thresh", &f->stability_score_thresh,
          "keep masks whose stability score is >= this");
    param("stability-score-offset", &f->stability_score_offset, "logit offset of the stability score");
    param("box-nms-thresh", &f->box_nms_thresh, "box IoU of the NMS within a crop");
    param("crop-n-layers", &f->crop_n_layers, "crop layers (layer i: 2^i x 2^i crops, each encoded)");
    param("crop-nms-thresh", &f->crop_nms_thresh, "box IoU of the NMS between crops");
    param("crop-overlap-ratio", &f->crop_overlap_ratio, "overlap of neighbouring crops");
    param("crop-n-points-downscale-factor", &f->crop_n_points_downscale_factor,
          "layer i's grid has points-per-side / factor^i points per side");
    param("min-mask-region-area", &f->min_mask_region_area,
          "fill holes and remove islands smaller than this many pixels");
    ev->callback([&config, &run, &out, &err, f] { run.exit_code = RunEverything(config, *f, out, err); });
  }

  // info
  {
    auto json = std::make_shared<bool>(false);
    CLI::App* info = app.add_subcommand(
        "info", "Show the server's model, precision, cache, queues, stage timings, memory, limits");
    info->add_flag("--json", *json, "print the GetInfoResponse as JSON");
    info->callback([&config, &run, &out, &err, json] {
      StatusOr<std::unique_ptr<Client>> client = ConnectFrom(config);
      if (!client.ok()) {
        run.exit_code = Fail(err, client.status());
        return;
      }
      StatusOr<v1::GetInfoResponse> r = (*client)->GetInfo();
      if (!r.ok()) {
        run.exit_code = Fail(err, r.status());
        return;
      }
      if (*json) {
        out << ToJson(*r) << "\n";
      } else {
        PrintInfo(out, *r);
      }
      run.exit_code = 0;
    });
  }

  // health
  {
    auto service = std::make_shared<std::string>("maskd.v1.MaskService");
    CLI::App* health = app.add_subcommand(
        "health", "Ask grpc.health.v1 whether the server is SERVING (exit 0) or not (exit 2)");
    auto wait_s = std::make_shared<double>(0);
    health->add_option("--service", *service, "service name to check (\"\" = the whole server)")
        ->capture_default_str();
    health->add_option("--wait", *wait_s,
                       "keep asking (every 10 ms, reconnecting while the server is not up yet) until it "
                       "is SERVING or this many seconds have passed; 0 = ask once")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    health->callback([&config, &run, &out, &err, service, wait_s] {
      const auto deadline = std::chrono::steady_clock::now() +
                            std::chrono::microseconds(static_cast<int64_t>(*wait_s * 1e6));
      for (;;) {
        StatusOr<ServingStatus> s = [&]() -> StatusOr<ServingStatus> {
          MaskctlConfig c = config;
          // While waiting, a server that is not listening yet is one more try, not a 10 s stall.
          if (*wait_s > 0) c.connect_timeout_s = std::min(c.connect_timeout_s, 0.25);
          StatusOr<std::unique_ptr<Client>> client = ConnectFrom(c);
          if (!client.ok()) return client.status();
          return (*client)->Health(*service);
        }();
        const bool serving = s.ok() && *s == ServingStatus::kServing;
        if (serving || std::chrono::steady_clock::now() >= deadline) {
          if (!s.ok()) {
            run.exit_code = Fail(err, s.status());
            return;
          }
          out << ServingStatusName(*s) << "\n";
          run.exit_code = serving ? 0 : 2;
          return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
  }
}

}  // namespace maskd::client
