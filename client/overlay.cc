#include "client/overlay.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace maskd::client {
namespace {

using Rgb = std::array<uint8_t, 3>;

void Put(ImageRGB8& im, int x, int y, const Rgb& c) {
  if (x < 0 || y < 0 || x >= im.width || y >= im.height) return;
  uint8_t* p = &im.pixels[(static_cast<size_t>(y) * im.width + x) * 3];
  p[0] = c[0];
  p[1] = c[1];
  p[2] = c[2];
}

void FillRect(ImageRGB8& im, int x0, int y0, int x1, int y1, const Rgb& c) {
  for (int y = std::max(0, y0); y <= std::min(im.height - 1, y1); ++y)
    for (int x = std::max(0, x0); x <= std::min(im.width - 1, x1); ++x) Put(im, x, y, c);
}

void Disc(ImageRGB8& im, int cx, int cy, int r, const Rgb& c) {
  for (int dy = -r; dy <= r; ++dy)
    for (int dx = -r; dx <= r; ++dx)
      if (dx * dx + dy * dy <= r * r) Put(im, cx + dx, cy + dy, c);
}

}  // namespace

StatusOr<ImageRGB8> DrawOverlay(const ImageRGB8& image, const std::vector<uint8_t>& mask,
                                const PromptArg& prompt, const OverlayStyle& style) {
  const size_t n = static_cast<size_t>(image.width) * image.height;
  if (image.pixels.size() != n * 3) {
    return InvalidArgument("overlay image: " + std::to_string(image.pixels.size()) +
                           " bytes for " + std::to_string(image.width) + "x" +
                           std::to_string(image.height) + " RGB, expected " + std::to_string(n * 3));
  }
  if (mask.size() != n) {
    return InvalidArgument("overlay mask: " + std::to_string(mask.size()) + " pixels, expected " +
                           std::to_string(n) + " (" + std::to_string(image.width) + "x" +
                           std::to_string(image.height) + ")");
  }
  const int longest = std::max(image.width, image.height);
  const int radius = style.point_radius > 0 ? style.point_radius : std::max(4, longest / 150);
  const int line = style.line_width > 0 ? style.line_width : std::max(2, longest / 400);

  ImageRGB8 out = image;
  const float a = std::clamp(style.alpha, 0.0f, 1.0f);
  for (int y = 0; y < image.height; ++y) {
    for (int x = 0; x < image.width; ++x) {
      const size_t i = static_cast<size_t>(y) * image.width + x;
      if (!mask[i]) continue;
      uint8_t* p = &out.pixels[i * 3];
      for (int k = 0; k < 3; ++k) {
        p[k] = static_cast<uint8_t>(std::lround((1 - a) * p[k] + a * style.mask_colour[k]));
      }
      // An outline makes thin or low-contrast masks readable: inside pixels with an outside
      // 4-neighbour (or on the image border) get the full colour.
      const bool edge = x == 0 || y == 0 || x == image.width - 1 || y == image.height - 1 ||
                        !mask[i - 1] || !mask[i + 1] || !mask[i - image.width] ||
                        !mask[i + image.width];
      if (edge) Put(out, x, y, style.mask_colour);
    }
  }

  if (prompt.box) {
    const Rgb yellow{255, 215, 0};
    const int x0 = static_cast<int>(std::floor(prompt.box->x0));
    const int y0 = static_cast<int>(std::floor(prompt.box->y0));
    const int x1 = static_cast<int>(std::floor(prompt.box->x1));
    const int y1 = static_cast<int>(std::floor(prompt.box->y1));
    FillRect(out, x0, y0, x1, y0 + line - 1, yellow);
    FillRect(out, x0, y1 - line + 1, x1, y1, yellow);
    FillRect(out, x0, y0, x0 + line - 1, y1, yellow);
    FillRect(out, x1 - line + 1, y0, x1, y1, yellow);
  }
  for (const PointArg& p : prompt.points) {
    const int cx = static_cast<int>(std::floor(p.x));
    const int cy = static_cast<int>(std::floor(p.y));
    Disc(out, cx, cy, radius + line, Rgb{255, 255, 255});
    Disc(out, cx, cy, radius, p.foreground ? Rgb{0, 200, 0} : Rgb{220, 0, 0});
  }
  return out;
}

}  // namespace maskd::client
