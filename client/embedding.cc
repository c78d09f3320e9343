#include "client/embedding.h"

#include <cstring>

#include "model/api/enums.h"
#include "model/api/half.h"

namespace maskd::client {

StatusOr<std::vector<float>> EmbeddingToFloat(const v1::ImageEmbedding& e) {
  uint64_t n = 1;
  for (uint32_t d : e.shape()) n *= d;
  const std::string& data = e.data();
  size_t width = 0;
  switch (e.dtype()) {
    case v1::EMBEDDING_DTYPE_FP32: width = 4; break;
    case v1::EMBEDDING_DTYPE_BF16:
    case v1::EMBEDDING_DTYPE_FP16: width = 2; break;
    default:
      return InvalidArgument("embedding.dtype = " + std::to_string(e.dtype()) +
                             " (expected EMBEDDING_DTYPE_FP32, _BF16 or _FP16)");
  }
  if (e.shape_size() == 0 || data.size() != n * width) {
    return InvalidArgument("embedding.data has " + std::to_string(data.size()) + " bytes, expected " +
                           std::to_string(n * width) + " for its shape");
  }
  std::vector<float> out(static_cast<size_t>(n));
  const auto* b = reinterpret_cast<const uint8_t*>(data.data());
  for (size_t i = 0; i < out.size(); ++i) {
    if (width == 4) {
      const uint32_t u = static_cast<uint32_t>(b[4 * i]) | static_cast<uint32_t>(b[4 * i + 1]) << 8 |
                         static_cast<uint32_t>(b[4 * i + 2]) << 16 | static_cast<uint32_t>(b[4 * i + 3]) << 24;
      std::memcpy(&out[i], &u, 4);
    } else {
      const uint16_t h = static_cast<uint16_t>(b[2 * i] | b[2 * i + 1] << 8);
      out[i] = e.dtype() == v1::EMBEDDING_DTYPE_BF16 ? Bf16ToFloat(h) : HalfToFloat(h);
    }
  }
  return out;
}

std::string NpyFloat32(const std::vector<float>& values, const std::vector<uint32_t>& shape) {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) dict += std::to_string(shape[i]) + ", ";
  if (shape.size() > 1) dict.resize(dict.size() - 2);  // (1,) keeps its comma, (1, 2) does not
  if (shape.size() == 1) dict.pop_back();
  dict += "), }";
  const size_t preamble = 10;  // magic (6), version (2), header length (2)
  size_t header = dict.size() + 1;  // + '\n'
  header += (64 - (preamble + header) % 64) % 64;
  dict.append(header - 1 - dict.size(), ' ');
  dict += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header & 0xff);
  out += static_cast<char>(header >> 8);
  out += dict;
  const size_t at = out.size();
  out.resize(at + values.size() * 4);
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &values[i], 4);
    for (int k = 0; k < 4; ++k) out[at + 4 * i + k] = static_cast<char>((u >> (8 * k)) & 0xff);
  }
  return out;
}

StatusOr<v1::EmbeddingDtype> ParseEmbeddingDtype(const std::string& name) {
  StatusOr<Precision> p = ParseEnum(kPrecisions, name, "embedding dtype");
  if (!p.ok()) return p.status();
  switch (*p) {
    case Precision::kBFloat16: return v1::EMBEDDING_DTYPE_BF16;
    case Precision::kFloat16: return v1::EMBEDDING_DTYPE_FP16;
    case Precision::kFloat32: break;
  }
  return v1::EMBEDDING_DTYPE_FP32;
}

}  // namespace maskd::client
