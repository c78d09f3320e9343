#include "model/golden.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/io/image_codec.h"
#include "model/io/pil_resize.h"
#include "model/tensor_file.h"

namespace maskd {

GoldenTolerances GoldenTolerances::Fp32() {
  GoldenTolerances t;
  t.source = "golden README, fp32";
  return t;
}

GoldenTolerances GoldenTolerances::Reduced(Precision p) {
  GoldenTolerances t;
  if (p == Precision::kFloat32) return Fp32();
  // Measured with headroom on the tiny model (see BENCHMARKS.md); bf16 keeps 8 significant bits,
  // fp16 11, so fp16's bounds are a quarter of bf16's where rounding dominates.
  const double f = p == Precision::kBFloat16 ? 1.0 : 0.25;
  t.embedding_max_abs = 0.25 * f;
  t.logits_max_abs = 1.0 * f;
  t.iou_max_abs = 0.03 * f;
  t.mask_pixel_fraction = 0.02 * f;
  t.source = std::string("stated bounds for ") + PrecisionName(p);
  return t;
}

bool GoldenReport::passed() const {
  return std::all_of(cases.begin(), cases.end(), [](const auto& c) { return c.passed; });
}

namespace {

StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFound("cannot open " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

StatusOr<nlohmann::json> ReadManifest(const std::string& dir) {
  auto text = ReadFile(dir + "/manifest.json");
  if (!text.ok()) return text.status();
  try {
    return nlohmann::json::parse(*text);
  } catch (const std::exception& e) {
    return InvalidArgument(dir + "/manifest.json: " + e.what());
  }
}

double MaxAbs(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  return m;
}

void Check(GoldenCaseResult& r, const GoldenTolerances& t) {
  std::ostringstream why;
  if (r.name == "embedding") {
    if (!(r.max_abs_embedding <= t.embedding_max_abs))
      why << "embedding max abs " << r.max_abs_embedding << " > " << t.embedding_max_abs << "; ";
  } else {
    if (!(r.max_abs_logits <= t.logits_max_abs))
      why << "logits max abs " << r.max_abs_logits << " > " << t.logits_max_abs << "; ";
    if (!(r.max_abs_iou <= t.iou_max_abs))
      why << "IoU max abs " << r.max_abs_iou << " > " << t.iou_max_abs << "; ";
    if (!(r.mask_pixel_fraction <= t.mask_pixel_fraction))
      why << "mask pixels differing " << r.mask_pixel_fraction << " > " << t.mask_pixel_fraction << "; ";
  }
  r.failure = why.str();
  r.passed = r.failure.empty();
}

// Runs one image's prompt cases and the batch case on `emb`, comparing with `ref`.
Status RunCases(Engine& engine, const nlohmann::json& image, const TensorMap& ref,
                const std::shared_ptr<const Embedding>& emb, const std::string& path,
                const GoldenTolerances& tol, std::vector<GoldenCaseResult>* out) {
  const std::string name = image.at("name").get<std::string>();
  const int W = image.at("width").get<int>(), H = image.at("height").get<int>();
  struct Case {
    std::string name;
    PromptSpec prompt;
  };
  std::vector<Case> cases;
  const auto& jcases = image.at("cases");
  for (size_t k = 0; k < jcases.size(); ++k) {
    const auto& jc = jcases[k];
    Case c;
    c.name = "case" + std::to_string(k);
    if (jc.contains("points")) {
      const auto& pts = jc.at("points");
      const auto& labels = jc.at("labels");
      for (size_t i = 0; i < pts.size(); ++i)
        c.prompt.points.push_back({pts[i][0].get<float>(), pts[i][1].get<float>(), labels[i].get<int>()});
    }
    if (jc.contains("box")) {
      const auto& b = jc.at("box");
      c.prompt.box = Box{b[0].get<float>(), b[1].get<float>(), b[2].get<float>(), b[3].get<float>()};
    }
    c.prompt.multimask = jc.at("multimask").get<bool>();
    if (jc.contains("mask_from")) {
      // The original fed back the low-res logits of that case's best-IoU mask.
      const std::string from = "case" + std::to_string(jc.at("mask_from").get<int>());
      const HostTensor* lr = FindTensor(ref, from + ".low_res_logits");
      const HostTensor* iou = FindTensor(ref, from + ".iou_predictions");
      if (!lr || !iou) return InvalidArgument(name + ": " + c.name + " refers to missing " + from);
      const auto iv = iou->ToFloat();
      const int64_t best = std::max_element(iv.begin(), iv.end()) - iv.begin();
      const auto all = lr->ToFloat();
      const int64_t hw = lr->shape[1] * lr->shape[2];
      auto ml = engine.MakeMaskLogits(all.data() + best * hw, static_cast<int>(lr->shape[1]),
                                      static_cast<int>(lr->shape[2]));
      if (!ml.ok()) return ml.status();
      c.prompt.mask_input = *ml;
    }
    cases.push_back(std::move(c));
  }
  // The batch case: every box of batch_boxes on the image together, multimask.
  const size_t first_batch = cases.size();
  if (image.contains("batch_boxes")) {
    for (const auto& b : image.at("batch_boxes")) {
      Case c;
      c.name = "batch";
      c.prompt.box = Box{b[0].get<float>(), b[1].get<float>(), b[2].get<float>(), b[3].get<float>()};
      c.prompt.multimask = true;
      cases.push_back(std::move(c));
    }
  }
  // All cases in one jagged Decode call: the engine must give each its one-at-a-time result.
  std::vector<DecodeItem> items;
  for (const auto& c : cases) items.push_back({emb, c.prompt});
  auto decoded = engine.Decode(items);
  if (!decoded.ok()) return decoded.status();
  std::vector<PostprocessItem> post;
  for (const auto& d : *decoded)
    post.push_back({d.logits, W, H, emb->input_width(), emb->input_height(), MaskEncoding::kBitmask});
  auto masks = engine.Postprocess(post);
  if (!masks.ok()) return masks.status();

  auto compare = [&](const std::string& label, const std::vector<size_t>& idx, const std::string& key) -> Status {
    const HostTensor* rl = FindTensor(ref, key + ".low_res_logits");
    const HostTensor* ri = FindTensor(ref, key + ".iou_predictions");
    const HostTensor* rm = FindTensor(ref, key + ".masks");
    if (!rl || !ri || !rm) return InvalidArgument(name + ": reference tensors for " + key + " missing");
    std::vector<float> logits, iou;
    std::vector<uint8_t> mask;
    for (size_t i : idx) {
      const auto l = (*decoded)[i].logits->ToFloat();
      logits.insert(logits.end(), l.begin(), l.end());
      iou.insert(iou.end(), (*decoded)[i].scores.begin(), (*decoded)[i].scores.end());
      for (const auto& m : (*masks)[i]) mask.insert(mask.end(), m.bitmask.begin(), m.bitmask.end());
    }
    GoldenCaseResult r;
    r.image = name;
    r.path = path;
    r.name = label;
    r.max_abs_logits = MaxAbs(logits, rl->ToFloat());
    r.max_abs_iou = MaxAbs(iou, ri->ToFloat());
    const auto ref_mask = rm->ToInt64();
    if (ref_mask.size() != mask.size()) {
      r.mask_pixel_fraction = 1.0;
      r.differing_pixels = static_cast<int64_t>(std::max(ref_mask.size(), mask.size()));
    } else {
      for (size_t i = 0; i < mask.size(); ++i) r.differing_pixels += (ref_mask[i] != 0) != (mask[i] != 0);
      r.mask_pixel_fraction = mask.empty() ? 0.0 : static_cast<double>(r.differing_pixels) / mask.size();
    }
    Check(r, tol);
    out->push_back(r);
    return Status::Ok();
  };
  for (size_t k = 0; k < first_batch; ++k) MASKD_RETURN_IF_ERROR(compare(cases[k].name, {k}, cases[k].name));
  if (cases.size() > first_batch) {
    std::vector<size_t> idx;
    for (size_t k = first_batch; k < cases.size(); ++k) idx.push_back(k);
    MASKD_RETURN_IF_ERROR(compare("batch", idx, "batch"));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::string> GoldenCheckpoint(const std::string& dir) {
  auto m = ReadManifest(dir);
  if (!m.ok()) return m.status();
  return dir + "/" + m->value("checkpoint", std::string("sam_tiny.pth"));
}

StatusOr<GoldenReport> RunGolden(Engine& engine, const GoldenOptions& options,
                                 const GoldenTolerances& tolerances) {
  auto manifest = ReadManifest(options.dir);
  if (!manifest.ok()) return manifest.status();
  GoldenReport report;
  report.tolerances = tolerances;
  try {
    for (const auto& image : manifest->at("images")) {
      const std::string name = image.at("name").get<std::string>();
      if (!options.images.empty() &&
          std::find(options.images.begin(), options.images.end(), name) == options.images.end())
        continue;
      auto ref = ReadTensorFile(options.dir + "/" + image.at("tensors").get<std::string>());
      if (!ref.ok()) return ref.status();
      const HostTensor* resized = FindTensor(*ref, "input_resized");
      const HostTensor* embedding = FindTensor(*ref, "embedding");
      if (!resized || !embedding) return InvalidArgument(name + ": input_resized/embedding missing");
      const int W = image.at("width").get<int>(), H = image.at("height").get<int>();
      ImageRGB8 r;
      r.height = static_cast<int>(resized->shape[0]);
      r.width = static_cast<int>(resized->shape[1]);
      r.pixels = resized->data;
      std::vector<std::pair<std::string, PreparedImage>> inputs;
      auto prepared = engine.PrepareResized(r, W, H);
      if (!prepared.ok()) return prepared.status();
      inputs.emplace_back("input_resized", *prepared);
      int64_t resize_diff = -1;
      if (options.png_path) {
        auto bytes = ReadFile(options.dir + "/" + image.at("png").get<std::string>());
        if (!bytes.ok()) return bytes.status();
        auto decoded = DecodeImage(*bytes);
        if (!decoded.ok()) return decoded.status();
        if (decoded->width != W || decoded->height != H)
          return InvalidArgument(name + ": PNG is " + std::to_string(decoded->width) + "x" +
                                 std::to_string(decoded->height) + ", manifest says " +
                                 std::to_string(W) + "x" + std::to_string(H));
        auto p = engine.Prepare(*decoded);
        if (!p.ok()) return p.status();
        inputs.emplace_back("png", *p);
        // The resize on its own, against the original's input_resized.
        const ImageRGB8 ours = PilResizeBilinear(*decoded, r.width, r.height);
        resize_diff = 0;
        for (size_t i = 0; i < ours.pixels.size() && i < r.pixels.size(); ++i)
          resize_diff = std::max<int64_t>(resize_diff, std::abs(int(ours.pixels[i]) - int(r.pixels[i])));
      }
      const auto ref_emb = embedding->ToFloat();
      for (auto& [path, prep] : inputs) {
        auto emb = engine.Encode({prep});
        if (!emb.ok()) return emb.status();
        GoldenCaseResult e;
        e.image = name;
        e.path = path;
        e.name = "embedding";
        e.max_abs_embedding = MaxAbs((*emb)[0]->ToFloat(), ref_emb);
        if (path == "png") e.resize_max_diff = resize_diff;
        Check(e, tolerances);
        report.cases.push_back(e);
        MASKD_RETURN_IF_ERROR(RunCases(engine, image, *ref, (*emb)[0], path, tolerances, &report.cases));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(options.dir + "/manifest.json: " + e.what());
  }
  if (report.cases.empty()) return InvalidArgument("no golden images selected in " + options.dir);
  return report;
}

}  // namespace maskd
