// The engine's enums, each with one table: its names (the first is the one printed), the help text
// of each value, parse and print. Flags, the engine, maskctl and the docs take names and help from
// here, so a new value is added in exactly one place.
#pragma once

#include <array>
#include <string>
#include <string_view>

#include "model/api/status.h"

namespace maskd {

enum class LogLevel { kDebug, kInfo, kWarning, kError };

enum class Precision { kFloat32, kBFloat16, kFloat16 };

// How the image encoder computes attention.
enum class AttentionImpl {
  kAuto,        // kFused on CUDA (kSdpaFolded where the kernel does not apply), kMath on CPU
  kMath,        // the original's arithmetic: materialised scores + rel-pos bias, softmax, matmul
  kSdpa,        // scaled_dot_product_attention with the rel-pos bias as an additive mask
  kSdpaFolded,  // SDPA with rel-pos folded into augmented q/k: no bias tensor at all
  kFused,       // maskd's CUDA kernel: flash attention with the decomposed rel-pos added in-kernel
};

enum class MaskEncoding {
  kNone,     // only stats (bbox, area, stability)
  kRle,      // COCO RLE counts, column-major, first run = zeros
  kBitmask,  // one byte per pixel (0 / 1), row-major, original size
};

// One value of an enum: its printed name, an accepted alias (or null) and what it means.
template <typename E>
struct EnumEntry {
  E value;
  const char* name;
  const char* alias;
  const char* help;
};

inline constexpr std::array<EnumEntry<Precision>, 3> kPrecisions{{
    {Precision::kFloat32, "fp32", "float32", "float32 everywhere (the original's numerics)"},
    {Precision::kBFloat16, "bf16", "bfloat16", "bfloat16 weights and activations"},
    {Precision::kFloat16, "fp16", "float16", "float16 weights and activations"},
}};

inline constexpr std::array<EnumEntry<AttentionImpl>, 5> kAttentionImpls{{
    {AttentionImpl::kAuto, "auto", nullptr,
     "fused on CUDA (sdpa-folded where the kernel does not apply), math on CPU and in fp32"},
    {AttentionImpl::kMath, "math", nullptr, "the original's arithmetic: scores + rel-pos bias, softmax"},
    {AttentionImpl::kSdpa, "sdpa", nullptr, "scaled_dot_product_attention with the bias as a mask"},
    {AttentionImpl::kSdpaFolded, "sdpa-folded", nullptr, "SDPA with rel-pos folded into q/k"},
    {AttentionImpl::kFused, "fused", nullptr, "maskd's CUDA kernel with rel-pos added in-kernel"},
}};

inline constexpr std::array<EnumEntry<MaskEncoding>, 3> kMaskEncodings{{
    {MaskEncoding::kNone, "none", nullptr, "only stats (bbox, area, stability)"},
    {MaskEncoding::kRle, "rle", nullptr, "COCO RLE counts, column-major, first run = zeros"},
    {MaskEncoding::kBitmask, "bitmask", nullptr, "one byte per pixel, row-major, original size"},
}};

// The printed name of `value` ("?" for a value outside the table).
template <typename E, size_t N>
constexpr const char* EnumName(const std::array<EnumEntry<E>, N>& table, E value) {
  for (const auto& e : table)
    if (e.value == value) return e.name;
  return "?";
}

// "a, b or c": the names of a table for messages and help texts.
template <typename E, size_t N>
std::string EnumNames(const std::array<EnumEntry<E>, N>& table) {
  std::string s;
  for (size_t i = 0; i < N; ++i) {
    if (i > 0) s += i + 1 == N ? " or " : ", ";
    s += table[i].name;
  }
  return s;
}

// `what` names the thing parsed in the error ("precision 'x' is not one of fp32, bf16 or fp16").
template <typename E, size_t N>
StatusOr<E> ParseEnum(const std::array<EnumEntry<E>, N>& table, std::string_view name,
                      std::string_view what) {
  for (const auto& e : table)
    if (name == e.name || (e.alias != nullptr && name == e.alias)) return e.value;
  return InvalidArgument(std::string(what) + " '" + std::string(name) + "' is not one of " +
                         EnumNames(table));
}

inline const char* PrecisionName(Precision p) { return EnumName(kPrecisions, p); }
inline StatusOr<Precision> ParsePrecision(std::string_view name) {
  return ParseEnum(kPrecisions, name, "precision");
}
inline const char* AttentionImplName(AttentionImpl a) { return EnumName(kAttentionImpls, a); }
inline StatusOr<AttentionImpl> ParseAttentionImpl(std::string_view name) {
  return ParseEnum(kAttentionImpls, name, "attention");
}
inline const char* MaskEncodingName(MaskEncoding m) { return EnumName(kMaskEncodings, m); }

}  // namespace maskd
