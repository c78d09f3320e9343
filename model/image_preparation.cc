// EngineImpl's image preparation: the longest-side resize (Pillow-exact on the CPU, or the bit-exact
// kernel with gpu_preprocess), SAM's normalisation and the zero padding to the model's square input.
#include "model/engine_impl.h"

#include "kernels/kernels.h"
#include "model/io/pil_resize.h"

namespace maskd {

at::Tensor EngineImpl::Normalize(const at::Tensor& hwc_u8, int h, int w) const {
  // The original: (uint8 - mean) / std in float32, then zero padding at the right and bottom.
  const int64_t S = config_.img_size;
  at::Tensor x = hwc_u8.permute({2, 0, 1});
  x = (x - pixel_mean_) / pixel_std_;
  x = at::constant_pad_nd(x, {0, S - w, 0, S - h});
  return x.to(dtype_).contiguous();
}

StatusOr<PreparedImage> EngineImpl::Prepare(const ImageRGB8& image) {
  if (image.width <= 0 || image.height <= 0 ||
      image.pixels.size() != static_cast<size_t>(image.width) * image.height * 3)
    return InvalidArgument("image of " + std::to_string(image.width) + "x" +
                           std::to_string(image.height) + " with " +
                           std::to_string(image.pixels.size()) + " bytes (expected width*height*3)");
  const auto [rw, rh] = ResizedSize(image.width, image.height, config_.img_size);
  return Guarded("preparing a " + std::to_string(image.width) + "x" + std::to_string(image.height) + " image",
                 [&]() -> StatusOr<PreparedImage> {
    torch::NoGradGuard no_grad;
    auto impl = std::make_shared<TorchPreparedImage>();
    const ImageGeometry geometry{image.width, image.height, rw, rh};
    if (gpu_pre_) {
      CallStream cs(device_);
      const at::Tensor host = at::from_blob(const_cast<uint8_t*>(image.pixels.data()),
                                            {image.height, image.width, 3}, at::kByte);
      const at::Tensor dev = host.to(device_);
      impl->input = kernels::ResizeNormalizePad(dev, rh, rw, config_.img_size, kPixelMean, kPixelStd, dtype_);
      cs.Sync();
    } else {
      const ImageRGB8 resized = PilResizeBilinear(image, rw, rh);
      CallStream cs(device_);
      const at::Tensor host = at::from_blob(const_cast<uint8_t*>(resized.pixels.data()), {rh, rw, 3}, at::kByte);
      impl->input = Normalize(host.to(device_), rh, rw);
      cs.Sync();
    }
    return PreparedImage(geometry, impl);
  });
}

StatusOr<PreparedImage> EngineImpl::PrepareResized(const ImageRGB8& resized, int ow, int oh) {
  const auto [rw, rh] = ResizedSize(ow, oh, config_.img_size);
  if (resized.width != rw || resized.height != rh)
    return InvalidArgument("resized image is " + std::to_string(resized.width) + "x" +
                           std::to_string(resized.height) + " but " + std::to_string(ow) + "x" +
                           std::to_string(oh) + " resizes to " + std::to_string(rw) + "x" +
                           std::to_string(rh));
  if (resized.pixels.size() != static_cast<size_t>(rw) * rh * 3)
    return InvalidArgument("resized image has the wrong number of bytes");
  return Guarded("preparing the image", [&]() -> StatusOr<PreparedImage> {
    torch::NoGradGuard no_grad;
    CallStream cs(device_);
    auto impl = std::make_shared<TorchPreparedImage>();
    const ImageGeometry geometry{ow, oh, rw, rh};
    const at::Tensor host = at::from_blob(const_cast<uint8_t*>(resized.pixels.data()), {rh, rw, 3}, at::kByte);
    impl->input = Normalize(host.to(device_), rh, rw);
    cs.Sync();
    return PreparedImage(geometry, impl);
  });
}

}  // namespace maskd
