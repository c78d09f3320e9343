// File helpers of the checkpoint tests (model_checkpoint_test, hardening_checkpoint_test), which
// write good checkpoints and bad ones made from them byte by byte.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>

#include "model/checkpoint.h"
#include "model/sam.h"
#include "model/sam_config.h"

namespace maskd::testing {

// `name` under gtest's temporary folder, with this process's id so that parallel runs do not meet.
inline std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/maskd_ckpt_" + std::to_string(::getpid()) + "_" + name;
}

inline std::string ReadAll(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

inline void WriteAll(const std::string& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f.write(s.data(), static_cast<std::streamsize>(s.size()));
}

// The tiny preset's parameters, random from `seed`, as a checkpoint would hold them.
inline StateDict TinyStateDict(uint64_t seed) {
  Sam model(*SamPreset("tiny"));
  RandomizeWeights(*model, seed);
  StateDict sd;
  for (auto& [n, t] : ModelStateDict(*model)) sd.emplace_back(n, t.clone());
  return sd;
}

// A safetensors file: the header's length (8 bytes, little endian), `header` (JSON text) padded with
// spaces to `pad_to` bytes, then the tensor bytes.
inline std::string Safetensors(const std::string& header, const std::string& data, size_t pad_to = 0) {
  std::string h = header;
  if (h.size() < pad_to) h.append(pad_to - h.size(), ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  return out + h + data;
}

}  // namespace maskd::testing
