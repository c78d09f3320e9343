// The image embedding that Embed returns with return_embedding (maskd.v1.ImageEmbedding), for
// client-side decoders: its values as float32 and a .npy file of them.
//
// .npy (numpy's format 1.0, written here without numpy): the 6 bytes "\x93NUMPY", the version bytes
// 1 and 0, the header length as a little-endian uint16, then an ASCII Python dict
//   {'descr': '<f4', 'fortran_order': False, 'shape': (1, 256, 64, 64), }
// padded with spaces and ended by '\n' so that the data starts at a multiple of 64 bytes, then the
// little-endian float32 values in C order. np.load reads it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "maskd/v1/maskd.grpc.pb.h"
#include "model/api/status.h"

namespace maskd::client {

// product(shape) float32 values in C order (bf16/fp16 widened exactly). INVALID_ARGUMENT when the
// dtype is unknown or data does not hold product(shape) values.
StatusOr<std::vector<float>> EmbeddingToFloat(const v1::ImageEmbedding& embedding);

// The .npy bytes of `values` with `shape` (float32).
std::string NpyFloat32(const std::vector<float>& values, const std::vector<uint32_t>& shape);

// "fp32" | "bf16" | "fp16" (and float32, bfloat16, float16) -> the dtype; INVALID_ARGUMENT otherwise.
StatusOr<v1::EmbeddingDtype> ParseEmbeddingDtype(const std::string& name);

}  // namespace maskd::client
