// Scalar 16-bit float conversions, torch-free: the reference rounding of an exported embedding
// (Engine::ExportEmbedding, maskd.v1.ImageEmbedding) for the fake engine, the tests and the clients.
// Both narrowings round to nearest, ties to even; NaN stays NaN (quiet), infinities stay infinite.
#pragma once

#include <cstdint>

namespace maskd {

// bfloat16: the upper 16 bits of the binary32 value after rounding.
uint16_t FloatToBf16(float value);
float Bf16ToFloat(uint16_t bits);
// IEEE 754 binary16 (subnormals kept; a finite value that rounds beyond 65504 becomes +-inf).
uint16_t FloatToHalf(float value);
float HalfToFloat(uint16_t bits);

}  // namespace maskd
