#include <cstring>
#include <vector>

#include "kernels/internal.h"
#include "kernels/kernels.h"
#include "model/io/pil_resize.h"

namespace maskd::kernels {
namespace {

using internal::CheckDim;
using internal::CheckSize;
using internal::Describe;

void CheckPreprocessArgs(const at::Tensor& rgb, int64_t out_h, int64_t out_w, int64_t pad_size,
                         const std::vector<float>& mean, const std::vector<float>& std,
                         at::ScalarType out_dtype) {
  CheckDim(rgb, "rgb", 3);
  CheckSize(rgb, "rgb", 2, 3);
  TORCH_CHECK(rgb.scalar_type() == at::kByte, "rgb: expected uint8, got ", Describe(rgb));
  TORCH_CHECK(rgb.size(0) > 0 && rgb.size(1) > 0, "rgb: expected a non-empty image, got ",
              Describe(rgb));
  TORCH_CHECK(out_h > 0 && out_w > 0 && out_h <= pad_size && out_w <= pad_size,
              "out_h x out_w: expected 1..pad_size (", pad_size, ") each, got ", out_h, " x ",
              out_w);
  // One CUDA grid row per image row (grid.y <= 65535).
  TORCH_CHECK(rgb.size(0) <= 65535 && pad_size <= 65535,
              "rgb/pad_size: expected at most 65535 rows, got ", Describe(rgb), ", pad_size ",
              pad_size);
  TORCH_CHECK(mean.size() == 3, "mean: expected 3 values (R, G, B), got ", mean.size());
  TORCH_CHECK(std.size() == 3, "std: expected 3 values (R, G, B), got ", std.size());
  for (float s : std) TORCH_CHECK(s != 0.0f, "std: expected non-zero values, got ", s);
  TORCH_CHECK(out_dtype == at::kFloat || out_dtype == at::kBFloat16 || out_dtype == at::kHalf,
              "out_dtype: expected float32, bfloat16 or float16, got ", out_dtype);
}

#ifdef MASKD_WITH_CUDA
at::Tensor ResizeNormalizePadCuda(const at::Tensor& rgb_in, int64_t out_h, int64_t out_w,
                                  int64_t pad_size, const std::vector<float>& mean,
                                  const std::vector<float>& std, at::ScalarType out_dtype,
                                  Stream stream) {
  internal::StreamScope scope(stream, rgb_in.device());
  const at::Tensor rgb = rgb_in.contiguous();
  const int in_h = static_cast<int>(rgb.size(0));
  const int in_w = static_cast<int>(rgb.size(1));
  const bool horizontal = out_w != in_w;
  const bool vertical = out_h != in_h;

  // Both passes' coefficients in one pinned buffer, one asynchronous upload.
  PilCoefficients ch, cv;
  if (horizontal) ch = PilBilinearCoefficients(in_w, static_cast<int>(out_w));
  if (vertical) cv = PilBilinearCoefficients(in_h, static_cast<int>(out_h));
  const size_t nh = ch.bounds.size() + ch.weights.size();
  const size_t nv = cv.bounds.size() + cv.weights.size();
  at::Tensor coeffs_host = at::empty({static_cast<int64_t>(nh + nv + 1)},
                                     at::TensorOptions().dtype(at::kInt).pinned_memory(true));
  int32_t* hp = coeffs_host.data_ptr<int32_t>();
  for (const std::vector<int32_t>* part : {&ch.bounds, &ch.weights, &cv.bounds, &cv.weights}) {
    if (!part->empty()) std::memcpy(hp, part->data(), part->size() * sizeof(int32_t));
    hp += part->size();
  }
  const at::Tensor coeffs = coeffs_host.to(rgb.device(), /*non_blocking=*/true);
  const int32_t* dp = coeffs.data_ptr<int32_t>();

  at::Tensor tmp = rgb;
  if (horizontal) {
    tmp = at::empty({in_h, out_w, 3}, rgb.options());
    internal::CheckLaunch(
        detail::LaunchPilHorizontal(rgb.data_ptr<uint8_t>(), in_h, in_w, tmp.data_ptr<uint8_t>(),
                                    static_cast<int>(out_w), dp, dp + ch.bounds.size(), ch.ksize,
                                    scope.get()),
        "PilHorizontalKernel");
  }
  at::Tensor out = at::empty({3, pad_size, pad_size}, rgb.options().dtype(out_dtype));
  detail::NormalizePadArgs a;
  a.in = tmp.data_ptr<uint8_t>();
  a.src_h = in_h;
  a.vertical = vertical;
  a.bounds = dp + nh;
  a.weights = dp + nh + cv.bounds.size();
  a.ksize = cv.ksize;
  a.out_h = static_cast<int>(out_h);
  a.out_w = static_cast<int>(out_w);
  a.pad = static_cast<int>(pad_size);
  for (int c = 0; c < 3; ++c) {
    a.mean[c] = mean[c];
    a.std[c] = std[c];
  }
  a.out = out.data_ptr();
  internal::CheckLaunch(detail::LaunchPilVerticalNormalizePad(
                            a, internal::ToDType(out_dtype, "out_dtype"), scope.get()),
                        "PilVerticalNormalizePadKernel");
  return out;
}
#endif

}  // namespace

at::Tensor ResizeNormalizePadReference(const at::Tensor& rgb, int64_t out_h, int64_t out_w,
                                       int64_t pad_size, const std::vector<float>& mean,
                                       const std::vector<float>& std, at::ScalarType out_dtype) {
  CheckPreprocessArgs(rgb, out_h, out_w, pad_size, mean, std, out_dtype);
  const at::Tensor cpu = rgb.to(at::kCPU).contiguous();
  ImageRGB8 image;
  image.height = static_cast<int>(cpu.size(0));
  image.width = static_cast<int>(cpu.size(1));
  image.pixels.assign(cpu.data_ptr<uint8_t>(), cpu.data_ptr<uint8_t>() + cpu.numel());
  ImageRGB8 resized =
      PilResizeBilinear(image, static_cast<int>(out_w), static_cast<int>(out_h));
  const at::Tensor pixels =
      at::from_blob(resized.pixels.data(), {out_h, out_w, 3}, at::kByte).permute({2, 0, 1});
  const at::Tensor mean_t = at::tensor(at::ArrayRef<float>(mean)).view({3, 1, 1});
  const at::Tensor std_t = at::tensor(at::ArrayRef<float>(std)).view({3, 1, 1});
  const at::Tensor normalized = (pixels.to(at::kFloat) - mean_t) / std_t;
  const at::Tensor padded =
      at::constant_pad_nd(normalized, {0, pad_size - out_w, 0, pad_size - out_h}, 0.0);
  return padded.to(out_dtype).to(rgb.device());
}

at::Tensor ResizeNormalizePad(const at::Tensor& rgb, int64_t out_h, int64_t out_w,
                              int64_t pad_size, const std::vector<float>& mean,
                              const std::vector<float>& std, at::ScalarType out_dtype,
                              Stream stream) {
  CheckPreprocessArgs(rgb, out_h, out_w, pad_size, mean, std, out_dtype);
#ifdef MASKD_WITH_CUDA
  if (rgb.is_cuda()) {
    return ResizeNormalizePadCuda(rgb, out_h, out_w, pad_size, mean, std, out_dtype, stream);
  }
#endif
  (void)stream;
  return ResizeNormalizePadReference(rgb, out_h, out_w, pad_size, mean, std, out_dtype);
}

}  // namespace maskd::kernels
