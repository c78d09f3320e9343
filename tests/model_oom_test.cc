// Issue #14: how the real engine reports running out of memory. Every Engine call runs its LibTorch
// work inside Guarded (model/engine_impl.h); these tests throw what LibTorch and CUDA throw and check
// what crosses the torch-free api: RESOURCE_EXHAUSTED naming the work and its batch size with the
// allocator's message, INTERNAL for everything else, never an exception. The real allocator under a
// real cap: model_oom_gpu_test and server_oom_gpu_test.
#include <gtest/gtest.h>

#include <new>
#include <stdexcept>

#include "model/engine_create.h"
#include "model/engine_impl.h"

namespace maskd {
namespace {

const std::string kWhat = "running the image encoder on " + Count(16, "image", "images");

TEST(ModelOom, AllocatorOutOfMemoryIsResourceExhaustedWithWhatAndTheAllocatorsMessage) {
  Status s = Guarded(kWhat, []() -> Status {
    TORCH_CHECK_WITH(OutOfMemoryError, false,
                     "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.8 GiB");
    return Status::Ok();
  });
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("out of device memory while running the image encoder on 16 images: "
                             "CUDA out of memory. Tried to allocate 2.00 GiB"),
            std::string::npos)
      << s.message();
}

TEST(ModelOom, CudaAndLibraryAllocationFailuresAreResourceExhausted) {
  for (const char* message : {"CUDA error: out of memory", "CUDA driver error: out of memory",
                              "CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
                              "cuDNN error: CUDNN_STATUS_ALLOC_FAILED"}) {
    StatusOr<int> r = Guarded(kWhat, [&]() -> StatusOr<int> {
      TORCH_CHECK(false, message);
      return 0;
    });
    EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << message;
    EXPECT_NE(r.status().message().find(message), std::string::npos) << r.status().message();
  }
#ifdef MASKD_WITH_CUDA
  // What C10_CUDA_CHECK throws for cudaErrorMemoryAllocation, whatever its text.
  Status a = Guarded(kWhat, []() -> Status {
    throw c10::AcceleratorError({__func__, __FILE__, __LINE__}, cudaErrorMemoryAllocation, "CUDA error 2");
  });
  EXPECT_EQ(a.code(), StatusCode::kResourceExhausted) << a.ToString();
#endif
}

TEST(ModelOom, HostOutOfMemoryIsResourceExhaustedAndOtherErrorsAreInternal) {
  Status host = Guarded(kWhat, []() -> Status { throw std::bad_alloc(); });
  EXPECT_EQ(host.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(host.message().find("out of host memory while running the image encoder on 16 images"),
            std::string::npos)
      << host.message();
  Status illegal = Guarded(kWhat, []() -> Status {
    TORCH_CHECK(false, "CUDA error: an illegal memory access");
    return Status::Ok();
  });
  EXPECT_EQ(illegal.code(), StatusCode::kInternal);
  EXPECT_NE(illegal.message().find("running the image encoder on 16 images: CUDA error: an illegal"),
            std::string::npos)
      << illegal.message();
  Status other = Guarded(kWhat, []() -> Status { throw std::runtime_error("shape mismatch"); });
  EXPECT_EQ(other.code(), StatusCode::kInternal);
  EXPECT_EQ(Count(1, "prompt", "prompts"), "1 prompt");
}

TEST(ModelOom, MemoryLimitNeedsACudaDeviceAndIsIgnoredByCpuEngines) {
  Status cpu = SetDeviceMemoryLimit("cpu", uint64_t{1} << 30);
  EXPECT_EQ(cpu.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(cpu.message().find("needs a CUDA device, not 'cpu'"), std::string::npos) << cpu.message();
  EXPECT_EQ(SetDeviceMemoryLimit("tpu:0", 1).code(), StatusCode::kInvalidArgument);
  EngineOptions o;
  o.device = "cpu";
  o.warmup = false;
  o.device_memory_limit_bytes = uint64_t{1} << 30;
  std::vector<std::string> warnings;
  o.log = [&](LogLevel level, std::string_view m) {
    if (level == LogLevel::kWarning) warnings.emplace_back(m);
  };
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  bool said = false;
  for (const auto& w : warnings) said |= w.find("memory limit is ignored on cpu") != std::string::npos;
  EXPECT_TRUE(said);
}

}  // namespace
}  // namespace maskd
