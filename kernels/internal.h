// Helpers shared by the kernels' .cc files (ATen side): argument checks with messages that name the
// argument, its value and the expectation, and, in CUDA builds, the stream scope and launch check.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "kernels/kernels.h"

#ifdef MASKD_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "kernels/launchers.h"
#endif

namespace maskd::kernels::internal {

// "bf16[2, 12, 196, 64] on cuda:0, strides [..]" for error messages.
std::string Describe(const at::Tensor& t);

void CheckDim(const at::Tensor& t, const char* name, int64_t dim);
void CheckSize(const at::Tensor& t, const char* name, int64_t d, int64_t expected);

#ifdef MASKD_WITH_CUDA
// Makes the caller's stream (or, for nullptr, the device's current LibTorch stream) current on the
// tensor's device for the scope, so the kernels and every ATen op of the function (allocations,
// copies) are ordered on one stream.
class StreamScope {
 public:
  StreamScope(Stream stream, const at::Device& device);
  cudaStream_t get() const { return guard_.current_stream().stream(); }

 private:
  c10::cuda::CUDAStreamGuard guard_;
};

// Throws c10::Error naming the kernel when a launch returned an error.
void CheckLaunch(cudaError_t err, const char* kernel);

detail::DType ToDType(at::ScalarType t, const char* name);

// The device's streaming multiprocessors (at least 1), for sizing grids.
int MultiProcessors(const at::Device& device);
#endif

}  // namespace maskd::kernels::internal
