#include "model/api/prompt.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "model/api/engine.h"

namespace maskd {

Status ValidatePrompt(const PromptSpec& p, int w, int h, std::string_view prefix, const Limits& limits) {
  const std::string f(prefix);
  auto bad = [&](const std::string& m) { return InvalidArgument(m); };
  if (p.points.empty() && !p.box)
    return bad(f + " has no points and no box (expected at least one point or a box)");
  if (p.points.size() > limits.max_points_per_prompt)
    return bad(f + ".points has " + std::to_string(p.points.size()) + " points (expected at most " +
               std::to_string(limits.max_points_per_prompt) + ": limits.max_points_per_prompt)");
  for (size_t i = 0; i < p.points.size(); ++i) {
    const auto& pt = p.points[i];
    const std::string n = f + ".points[" + std::to_string(i) + "]";
    if (!std::isfinite(pt.x) || !std::isfinite(pt.y))
      return bad(n + " has a non-finite coordinate");
    if (pt.x < 0 || pt.x > w)
      return bad(n + ".x = " + FormatNumber(pt.x) + " is outside the image width [0, " +
                 std::to_string(w) + "]");
    if (pt.y < 0 || pt.y > h)
      return bad(n + ".y = " + FormatNumber(pt.y) + " is outside the image height [0, " +
                 std::to_string(h) + "]");
    if (pt.label != 0 && pt.label != 1)
      return bad(n + ".label = " + std::to_string(pt.label) + " must be 0 (background) or 1 (foreground)");
  }
  if (p.box) {
    const Box& b = *p.box;
    const std::string n = f + ".box";
    if (!std::isfinite(b.x0) || !std::isfinite(b.y0) || !std::isfinite(b.x1) || !std::isfinite(b.y1))
      return bad(n + " has a non-finite coordinate");
    if (b.x0 > b.x1 || b.y0 > b.y1)
      return bad(n + " = (" + FormatNumber(b.x0) + ", " + FormatNumber(b.y0) + ", " +
                 FormatNumber(b.x1) + ", " + FormatNumber(b.y1) +
                 ") must have x0 <= x1 and y0 <= y1");
    if (b.x0 < 0 || b.y0 < 0 || b.x1 > w || b.y1 > h)
      return bad(n + " = (" + FormatNumber(b.x0) + ", " + FormatNumber(b.y0) + ", " +
                 FormatNumber(b.x1) + ", " + FormatNumber(b.y1) + ") is outside the image " +
                 std::to_string(w) + "x" + std::to_string(h));
  }
  if (p.mask_input) {
    if (p.mask_input_index < 0 || p.mask_input_index >= p.mask_input->num_masks())
      return bad(f + ".mask_input index " + std::to_string(p.mask_input_index) + " is outside its " +
                 std::to_string(p.mask_input->num_masks()) + " masks");
  }
  return Status::Ok();
}

}  // namespace maskd
