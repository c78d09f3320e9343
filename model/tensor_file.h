// Torch-free access to tensor files (torch.save dicts of tensors, e.g. the golden `imageN.pt`, and
// checkpoints), for tools and tests outside libmaskd_model's torch boundary.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/api/status.h"

namespace maskd {

struct HostTensor {
  // "float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"
  std::string dtype;
  std::vector<int64_t> shape;
  // Contiguous, row-major, little-endian.
  std::vector<uint8_t> data;

  int64_t numel() const;
  // Values converted to float / int64 (any numeric dtype).
  std::vector<float> ToFloat() const;
  std::vector<int64_t> ToInt64() const;
};

using TensorMap = std::vector<std::pair<std::string, HostTensor>>;

// Reads the same formats as the checkpoint reader (never executes pickle code).
StatusOr<TensorMap> ReadTensorFile(const std::string& path);

// Finds `name` in `tensors`; nullptr when absent.
const HostTensor* FindTensor(const TensorMap& tensors, const std::string& name);

}  // namespace maskd
