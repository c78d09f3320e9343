// Linear layers through cuBLASLt with the algorithm chosen by timing (kernels.h, TunedLinear).
//
// LibTorch's addmm / _addmm_activation run the first algorithm of cuBLASLt's heuristic for a shape.
// For the encoder's fc1 (bias + GELU epilogue) that kernel ran at ~600 TFLOP/s on an H200 while the
// same-sized fc2 (bias only) ran at ~750 (run 40's profile): the heuristic's estimate is not the
// measured best. Here the heuristic's first kCandidates algorithms are each timed once per shape, at
// the shape's first call outside a CUDA graph capture, and the fastest is kept for the process.
#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>

#include "kernels/internal.h"
#include "kernels/kernels.h"

#ifdef MASKD_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <cublasLt.h>
#include <dlfcn.h>
#endif

namespace maskd::kernels {
namespace {

bool SupportedOperands(const at::Tensor& x, const at::Tensor& w) {
  return x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1);
}

void CheckOperands(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, const at::Tensor& out,
                   bool accumulate) {
  TORCH_CHECK(!accumulate || out.defined(), "linear: accumulate needs the output to add to");
  TORCH_CHECK(x.defined() && w.defined(), "linear: expected x and w, got an undefined tensor");
  TORCH_CHECK(SupportedOperands(x, w), "linear: expected x [M, K] and w [N, K], got x ", internal::Describe(x),
              " and w ", internal::Describe(w));
  TORCH_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == w.size(0)), "linear: expected bias [",
              w.size(0), "], got ", internal::Describe(bias));
  TORCH_CHECK(!out.defined() || (out.dim() == 2 && out.size(0) == x.size(0) && out.size(1) == w.size(0) &&
                                 out.scalar_type() == x.scalar_type()),
              "linear: expected out [", x.size(0), ", ", w.size(0), "] in ", x.scalar_type(), ", got ",
              internal::Describe(out));
}

}  // namespace

at::Tensor TunedLinearReference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, bool gelu,
                                const at::Tensor& out, bool accumulate) {
  CheckOperands(x, w, bias, out, accumulate);
  at::Tensor y = out.defined() ? out : at::empty({x.size(0), w.size(0)}, x.options());
  if (accumulate) {
    // out + (x w^T + bias) [then GELU], summed in fp32 and rounded once.
    at::Tensor sum = at::addmm(out.to(at::kFloat), x.to(at::kFloat), w.t().to(at::kFloat));
    if (bias.defined()) sum.add_(bias.to(at::kFloat));
    if (gelu) sum = at::gelu(sum, x.is_cuda() ? "tanh" : "none");
    y.copy_(sum);
  } else if (bias.defined()) {
    if (gelu) {
      at::_addmm_activation_out(y, bias, x, w.t(), 1, 1, /*use_gelu=*/true);
    } else {
      at::addmm_out(y, bias, x, w.t());
    }
  } else {
    at::mm_out(y, x, w.t());
    // The GELU form _addmm_activation uses on the device: tanh on CUDA, erf on the CPU.
    if (gelu) at::gelu_(y, x.is_cuda() ? "tanh" : "none");
  }
  return y;
}

#ifdef MASKD_WITH_CUDA
namespace {

// The most of the heuristic's algorithms that are timed. cuBLASLt returns them best estimate first;
// it offered 8 for every encoder shape on the H100 (run 41).
constexpr int kCandidates = 16;
// Timed launches per candidate, after one untimed one.
constexpr int kTimedRuns = 3;

// SetGemmTuning (FastPathOptions::gemm_tuning): on by default.
std::atomic<bool> g_tuning{true};
// MASKD_GEMM_TUNING_LOG=1: one line per tuned shape on stderr (a debugging aid for benchmark runs).
bool TuningLog() {
  static const bool on = [] {
    const char* v = std::getenv("MASKD_GEMM_TUNING_LOG");
    return v != nullptr && std::strcmp(v, "0") != 0;
  }();
  return on;
}

// cuBLASLt's entry points in the copy LibTorch loaded (its libtorch_cuda.so needs libcublasLt.so.13,
// found through the wheel's search path): not linked, see kernels/CMakeLists.txt.
struct LtApi {
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
  std::string error;  // why the table is incomplete; empty when every entry was found
};

const LtApi& Lt() {
  static const LtApi api = [] {
    LtApi a;
    void* lib = dlopen("libcublasLt.so.13", RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) lib = dlopen("libcublasLt.so.13", RTLD_NOW);
    if (lib == nullptr) {
      const char* e = dlerror();
      a.error = std::string("libcublasLt.so.13 is not loadable: ") + (e ? e : "unknown error");
      return a;
    }
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (fn == nullptr && a.error.empty()) a.error = std::string("libcublasLt.so.13 has no ") + name;
    };
    get(a.desc_create, "cublasLtMatmulDescCreate");
    get(a.desc_destroy, "cublasLtMatmulDescDestroy");
    get(a.desc_set, "cublasLtMatmulDescSetAttribute");
    get(a.layout_create, "cublasLtMatrixLayoutCreate");
    get(a.layout_destroy, "cublasLtMatrixLayoutDestroy");
    get(a.pref_create, "cublasLtMatmulPreferenceCreate");
    get(a.pref_destroy, "cublasLtMatmulPreferenceDestroy");
    get(a.pref_set, "cublasLtMatmulPreferenceSetAttribute");
    get(a.heuristic, "cublasLtMatmulAlgoGetHeuristic");
    get(a.matmul, "cublasLtMatmul");
    return a;
  }();
  return api;
}

void CheckLt(cublasStatus_t s, const char* what) {
  TORCH_CHECK(s == CUBLAS_STATUS_SUCCESS, "cuBLASLt ", what, ": status ", static_cast<int>(s));
}

// Largest power-of-two alignment (up to 16 bytes) of a pointer: cuBLASLt's alignment preference.
uint32_t Alignment(const void* p) {
  uint32_t a = 16;
  while (a > 1 && reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
  return a;
}

struct Key {
  int64_t m, n, k, lda, ldb, ldc;
  int dtype;
  bool gelu, accumulate;
  uint32_t align_a, align_b, align_c, align_bias;
  int device;
  bool tuned;  // a timed choice, or the heuristic's first (tuning off): kept apart
  bool operator<(const Key& o) const {
    return std::tie(m, n, k, lda, ldb, ldc, dtype, gelu, accumulate, align_a, align_b, align_c, align_bias, device,
                    tuned) < std::tie(o.m, o.n, o.k, o.lda, o.ldb, o.ldc, o.dtype, o.gelu, o.accumulate, o.align_a,
                                      o.align_b, o.align_c, o.align_bias, o.device, o.tuned);
  }
};

struct Choice {
  cublasLtMatmulAlgo_t algo;
  size_t workspace = 0;
};

struct Cache {
  std::mutex mu;
  std::map<Key, Choice> choices;
  std::vector<GemmTuning> log;
};
Cache& TheCache() {
  static Cache* c = new Cache;  // never destroyed: read by threads until the process exits
  return *c;
}

// The RAII descriptors of one call.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descriptors() {
    const LtApi& lt = Lt();
    if (pref) lt.pref_destroy(pref);
    if (c) lt.layout_destroy(c);
    if (b) lt.layout_destroy(b);
    if (a) lt.layout_destroy(a);
    if (op) lt.desc_destroy(op);
  }
};

class Timer {
 public:
  Timer() {
    C10_CUDA_CHECK(cudaEventCreate(&start_));
    C10_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~Timer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  cudaEvent_t start_, stop_;
};

}  // namespace

void SetGemmTuning(bool on) { g_tuning.store(on, std::memory_order_relaxed); }

std::vector<GemmTuning> GemmTunings() {
  Cache& cache = TheCache();
  std::lock_guard<std::mutex> lock(cache.mu);
  return cache.log;
}

at::Tensor TunedLinear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, bool gelu,
                       const at::Tensor& out, bool accumulate) {
  CheckOperands(x, w, bias, out, accumulate);
  const at::ScalarType dt = x.scalar_type();
  // cuBLASLt here: half-precision CUDA operands with unit inner strides and a bias of their dtype
  // (the encoder's layers); anything else takes LibTorch's path.
  const bool lt_operands = x.is_cuda() && (dt == at::kBFloat16 || dt == at::kHalf) && w.scalar_type() == dt &&
                           w.device() == x.device() && bias.defined() && bias.scalar_type() == dt &&
                           bias.device() == x.device() && bias.is_contiguous() && x.stride(1) == 1 &&
                           w.stride(1) == 1 && x.size(0) > 0 && x.size(1) > 0 && w.size(0) > 0 &&
                           x.stride(0) >= x.size(1) && w.stride(0) >= w.size(1) &&
                           (!out.defined() || (out.stride(1) == 1 && out.stride(0) >= out.size(1)));
  const LtApi& lt = Lt();
  if (!lt_operands || !lt.error.empty()) {
    if (lt_operands) {
      static std::once_flag warned;
      std::call_once(warned, [&] {
        std::fprintf(stderr, "maskd: linear layers without cuBLASLt tuning: %s\n", lt.error.c_str());
      });
    }
    return TunedLinearReference(x, w, bias, gelu, out, accumulate);
  }

  const c10::cuda::CUDAGuard device_guard(x.device());
  at::Tensor y = out.defined() ? out : at::empty({x.size(0), w.size(0)}, x.options());
  const int64_t m = x.size(0), n = w.size(0), k = x.size(1);
  const cudaDataType_t cdt = dt == at::kBFloat16 ? CUDA_R_16BF : CUDA_R_16F;
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  cublasLtHandle_t handle = at::cuda::getCurrentCUDABlasLtHandle();
  void* workspace = at::cuda::getCUDABlasLtWorkspace();
  const size_t workspace_size = at::cuda::getCUDABlasLtWorkspaceSize();

  // Column-major view of y^T [N, M] = w [N, K] . x^T [K, M]: A = w stored K x N (op T), B = x^T stored
  // K x M (op N), C = D = y^T stored N x M; the bias runs along D's rows (N), as in LibTorch.
  Descriptors d;
  CheckLt(lt.desc_create(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor");
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  CheckLt(lt.desc_set(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)), "transa");
  CheckLt(lt.desc_set(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)), "transb");
  const cublasLtEpilogue_t epilogue = gelu ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
  CheckLt(lt.desc_set(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)), "epilogue");
  const void* bias_ptr = bias.data_ptr();
  CheckLt(lt.desc_set(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr, sizeof(bias_ptr)), "bias pointer");
  CheckLt(lt.layout_create(&d.a, cdt, k, n, w.stride(0)), "layout of w");
  CheckLt(lt.layout_create(&d.b, cdt, k, m, x.stride(0)), "layout of x");
  CheckLt(lt.layout_create(&d.c, cdt, n, m, y.stride(0)), "layout of the output");

  const Key key{m,
                n,
                k,
                w.stride(0),
                x.stride(0),
                y.stride(0),
                static_cast<int>(dt),
                gelu,
                accumulate,
                Alignment(w.data_ptr()),
                Alignment(x.data_ptr()),
                Alignment(y.data_ptr()),
                Alignment(bias_ptr),
                static_cast<int>(x.device().index()),
                g_tuning.load(std::memory_order_relaxed)};
  // accumulate: D = C = out, beta = 1 (cuBLASLt runs C == D in place when the layouts are equal).
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  auto launch = [&](const cublasLtMatmulAlgo_t& algo, size_t ws) {
    return lt.matmul(handle, d.op, &alpha, w.data_ptr(), d.a, x.data_ptr(), d.b, &beta, y.data_ptr(), d.c,
                     y.data_ptr(), d.c, &algo, ws > 0 ? workspace : nullptr, ws, stream);
  };

  Cache& cache = TheCache();
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    auto it = cache.choices.find(key);
    if (it != cache.choices.end()) {
      CheckLt(launch(it->second.algo, it->second.workspace), "matmul");
      return y;
    }
  }

  CheckLt(lt.pref_create(&d.pref), "preference");
  const uint64_t ws_limit = workspace_size;
  CheckLt(lt.pref_set(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_limit, sizeof(ws_limit)),
          "workspace preference");
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c}};
  for (const auto& [attr, value] : aligns)
    CheckLt(lt.pref_set(d.pref, attr, &value, sizeof(value)), "alignment preference");
  cublasLtMatmulHeuristicResult_t results[kCandidates];
  int found = 0;
  CheckLt(lt.heuristic(handle, d.op, d.a, d.b, d.c, d.c, d.pref, kCandidates, results, &found), "heuristic");
  TORCH_CHECK(found > 0, "cuBLASLt found no algorithm for a ", m, "x", n, "x", k, " linear layer");

  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (!key.tuned || capture != cudaStreamCaptureStatusNone || found == 1) {
    // Untimed: the heuristic's first (LibTorch's choice). A shape to be timed that is first seen
    // inside a capture is not cached, so that its first call outside one times the candidates.
    CheckLt(launch(results[0].algo, results[0].workspaceSize), "matmul");
    if (!key.tuned || found == 1 || capture == cudaStreamCaptureStatusNone) {
      std::lock_guard<std::mutex> lock(cache.mu);
      cache.choices.emplace(key, Choice{results[0].algo, results[0].workspaceSize});
    }
    return y;
  }

  // Each candidate writes y (the last launch below writes the answer); one that fails to launch is
  // skipped. Times are the mean of kTimedRuns back-to-back launches after one untimed one. With
  // accumulate every launch adds to y: its value is kept aside and put back before the last.
  const auto wall_start = std::chrono::steady_clock::now();
  const at::Tensor saved = accumulate ? y.clone() : at::Tensor();
  Timer timer;
  int best = -1;
  float best_ms = 0, first_ms = 0;
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    if (launch(results[i].algo, results[i].workspaceSize) != CUBLAS_STATUS_SUCCESS) continue;
    C10_CUDA_CHECK(cudaEventRecord(timer.start_, stream));
    bool ok = true;
    for (int r = 0; r < kTimedRuns && ok; ++r)
      ok = launch(results[i].algo, results[i].workspaceSize) == CUBLAS_STATUS_SUCCESS;
    C10_CUDA_CHECK(cudaEventRecord(timer.stop_, stream));
    C10_CUDA_CHECK(cudaEventSynchronize(timer.stop_));
    if (!ok) continue;
    float ms = 0;
    C10_CUDA_CHECK(cudaEventElapsedTime(&ms, timer.start_, timer.stop_));
    ms /= kTimedRuns;
    if (i == 0) first_ms = ms;
    if (best < 0 || ms < best_ms) {
      best = i;
      best_ms = ms;
    }
  }
  TORCH_CHECK(best >= 0, "cuBLASLt: none of ", found, " algorithms ran a ", m, "x", n, "x", k, " linear layer");
  if (accumulate) y.copy_(saved);
  CheckLt(launch(results[best].algo, results[best].workspaceSize), "matmul");
  const float wall_ms =
      std::chrono::duration<float, std::milli>(std::chrono::steady_clock::now() - wall_start).count();
  const GemmTuning entry{m, n, k, gelu, accumulate, found, best, first_ms, best_ms, wall_ms};
  if (TuningLog())
    std::fprintf(stderr,
                 "maskd: linear %ldx%ldx%ld%s%s: %d algorithms, heuristic's first %.4f ms, chose #%d %.4f ms\n",
                 static_cast<long>(m), static_cast<long>(n), static_cast<long>(k), gelu ? " +gelu" : "",
                 accumulate ? " +=" : "", found, first_ms, best, best_ms);
  std::lock_guard<std::mutex> lock(cache.mu);
  cache.choices.emplace(key, Choice{results[best].algo, results[best].workspaceSize});
  cache.log.push_back(entry);
  return y;
}

#else

void SetGemmTuning(bool) {}
std::vector<GemmTuning> GemmTunings() { return {}; }

at::Tensor TunedLinear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, bool gelu,
                       const at::Tensor& out, bool accumulate) {
  return TunedLinearReference(x, w, bias, gelu, out, accumulate);
}

#endif

}  // namespace maskd::kernels
