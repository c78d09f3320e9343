#include <algorithm>
#include <sstream>

#include "kernels/internal.h"
#include "kernels/kernels.h"

#ifdef MASKD_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace maskd::kernels {

bool BuiltWithCuda() {
#ifdef MASKD_WITH_CUDA
  return true;
#else
  return false;
#endif
}

namespace internal {

std::string Describe(const at::Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  std::ostringstream os;
  os << c10::toString(t.scalar_type()) << t.sizes() << " on " << t.device() << " (strides "
     << t.strides() << ")";
  return os.str();
}

void CheckDim(const at::Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK(t.defined(), name, ": expected a tensor, got an undefined one");
  TORCH_CHECK(t.dim() == dim, name, ": expected ", dim, " dimensions, got ", Describe(t));
}

void CheckSize(const at::Tensor& t, const char* name, int64_t d, int64_t expected) {
  TORCH_CHECK(t.size(d) == expected, name, ": expected size ", expected, " in dimension ", d,
              ", got ", Describe(t));
}

#ifdef MASKD_WITH_CUDA
namespace {
c10::cuda::CUDAStream ResolveStream(Stream stream, const at::Device& device) {
  TORCH_CHECK(device.is_cuda(), "expected a CUDA device, got ", device);
  if (stream == nullptr) return c10::cuda::getCurrentCUDAStream(device.index());
  return c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(stream), device.index());
}
}  // namespace

StreamScope::StreamScope(Stream stream, const at::Device& device)
    : guard_(ResolveStream(stream, device)) {}

void CheckLaunch(cudaError_t err, const char* kernel) {
  TORCH_CHECK(err == cudaSuccess, "CUDA kernel ", kernel, ": ", cudaGetErrorName(err), " (",
              cudaGetErrorString(err), ")");
}

int MultiProcessors(const at::Device& device) {
  // LibTorch's per-device properties, queried once: the grid sizings call this at every launch.
  return std::max(at::cuda::getDeviceProperties(device.index())->multiProcessorCount, 1);
}

detail::DType ToDType(at::ScalarType t, const char* name) {
  switch (t) {
    case at::kFloat:
      return detail::DType::kFloat32;
    case at::kBFloat16:
      return detail::DType::kBFloat16;
    case at::kHalf:
      return detail::DType::kFloat16;
    default:
      TORCH_CHECK(false, name, ": expected float32, bfloat16 or float16, got ", t);
  }
}
#endif

}  // namespace internal
}  // namespace maskd::kernels
