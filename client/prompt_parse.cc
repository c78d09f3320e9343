#include "client/prompt_parse.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <vector>

namespace maskd::client {
namespace {

std::vector<std::string> SplitCommas(std::string_view text) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    parts.emplace_back(text.substr(start, comma == std::string_view::npos ? text.npos : comma - start));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return parts;
}

bool ParseFloat(const std::string& s, float* out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || end != s.c_str() + s.size() || !std::isfinite(v)) return false;
  *out = static_cast<float>(v);
  return true;
}

}  // namespace

StatusOr<PointArg> ParsePoint(std::string_view text) {
  const std::vector<std::string> parts = SplitCommas(text);
  if (parts.size() != 2 && parts.size() != 3) {
    return InvalidArgument("--point '" + std::string(text) +
                           "': expected x,y or x,y,label (label 1/fg or 0/bg)");
  }
  PointArg p;
  if (!ParseFloat(parts[0], &p.x) || !ParseFloat(parts[1], &p.y)) {
    return InvalidArgument("--point '" + std::string(text) + "': x and y must be finite numbers");
  }
  if (parts.size() == 3) {
    const std::string& l = parts[2];
    if (l == "1" || l == "fg" || l == "foreground") {
      p.foreground = true;
    } else if (l == "0" || l == "bg" || l == "background") {
      p.foreground = false;
    } else {
      return InvalidArgument("--point '" + std::string(text) + "': label '" + l +
                             "' must be 1|fg|foreground or 0|bg|background");
    }
  }
  return p;
}

StatusOr<BoxArg> ParseBox(std::string_view text) {
  const std::vector<std::string> parts = SplitCommas(text);
  BoxArg b;
  if (parts.size() != 4 || !ParseFloat(parts[0], &b.x0) || !ParseFloat(parts[1], &b.y0) ||
      !ParseFloat(parts[2], &b.x1) || !ParseFloat(parts[3], &b.y1)) {
    return InvalidArgument("--box '" + std::string(text) +
                           "': expected four finite numbers x0,y0,x1,y1");
  }
  return b;
}

StatusOr<v1::OutputFormat> ParseOutputFormat(std::string_view text) {
  if (text == "rle" || text == "coco_rle") return v1::OUTPUT_FORMAT_COCO_RLE;
  if (text == "png") return v1::OUTPUT_FORMAT_PNG;
  if (text == "logits" || text == "low_res_logits") return v1::OUTPUT_FORMAT_LOW_RES_LOGITS;
  if (text == "polygons") return v1::OUTPUT_FORMAT_POLYGONS;
  return InvalidArgument("--format '" + std::string(text) + "': expected rle, png, logits or polygons");
}

const char* OutputFormatName(v1::OutputFormat format) {
  switch (format) {
    case v1::OUTPUT_FORMAT_PNG: return "png";
    case v1::OUTPUT_FORMAT_LOW_RES_LOGITS: return "logits";
    case v1::OUTPUT_FORMAT_POLYGONS: return "polygons";
    default: return "rle";
  }
}

}  // namespace maskd::client
