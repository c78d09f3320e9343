#include "model/api/half.h"

#include <cstring>

namespace maskd {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace

uint16_t FloatToBf16(float value) {
  const uint32_t u = Bits(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  // Adding 0x7fff plus the kept lowest bit rounds to nearest with ties to the even result; a carry
  // out of the mantissa moves the exponent, up to infinity, which is the correct rounding too.
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

float Bf16ToFloat(uint16_t bits) { return FromBits(static_cast<uint32_t>(bits) << 16); }

uint16_t FloatToHalf(float value) {
  const uint32_t u = Bits(value);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  const int exp = static_cast<int>(a >> 23) - 127;
  if (exp >= -14) {
    // Normal half: 10 mantissa bits kept of 23, round to nearest even on the 13 dropped ones; a
    // carry into the exponent is the right result (and cannot overflow: checked above).
    const uint32_t rebased = a - (static_cast<uint32_t>(127 - 15) << 23);
    const uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((rebased + rounding) >> 13));
  }
  if (exp < -25) return sign;  // below half the smallest subnormal: +-0
  // Subnormal half: value = m * 2^-24 with the implicit bit made explicit; shift and round to even.
  const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  const int shift = -exp - 14 + 13;  // 14 .. 24
  const uint32_t kept = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  const uint32_t rounded = kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
  return static_cast<uint16_t>(sign | rounded);
}

float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exp = (bits >> 10) & 0x1fu;
  const uint32_t mant = bits & 0x3ffu;
  if (exp == 0x1f) return FromBits(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return FromBits(sign | ((exp + 127 - 15) << 23) | (mant << 13));
  if (mant == 0) return FromBits(sign);
  // Subnormal: mant * 2^-24, exact in binary32.
  const float v = static_cast<float>(mant) * FromBits(0x33800000u);  // 2^-24
  return sign ? -v : v;
}

}  // namespace maskd
