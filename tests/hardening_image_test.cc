// Issue #14, finding 5: truncated JPEGs/PNGs and files that declare a size their bytes cannot hold
// are refused, and a lying file does not cost the memory of the size it declares. The bad files
// are made here from real ones encoded by libjpeg/libpng.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "model/io/image_codec.h"

namespace maskd {
namespace {

ImageRGB8 Busy(int w, int h) {
  ImageRGB8 im{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3)};
  uint32_t x = 12345;
  for (auto& p : im.pixels) {
    x = x * 1103515245u + 12345u;  // detail everywhere, so every part of the file carries pixels
    p = static_cast<uint8_t>(x >> 24);
  }
  return im;
}

size_t FindMarker(const std::string& jpeg, uint8_t marker) {
  for (size_t i = 2; i + 1 < jpeg.size(); ++i) {
    if (static_cast<uint8_t>(jpeg[i]) == 0xff && static_cast<uint8_t>(jpeg[i + 1]) == marker) return i;
  }
  return std::string::npos;
}

const std::string kEoi("\xff\xd9", 2);

void ExpectRefused(const std::string& bytes, const std::string& what, const std::string& mention) {
  auto r = DecodeImage(bytes);
  ASSERT_FALSE(r.ok()) << what << " was accepted as " << r->width << " x " << r->height;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << what << ": " << r.status().ToString();
  EXPECT_NE(r.status().message().find("image.encoded: "), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(mention), std::string::npos) << what << ": " << r.status().message();
}

TEST(HardeningJpeg, TheIntactFileDecodes) {
  auto jpeg = EncodeJpeg(Busy(256, 192), 90);
  ASSERT_TRUE(jpeg.ok());
  auto im = DecodeImage(*jpeg);
  ASSERT_TRUE(im.ok()) << im.status().ToString();
  EXPECT_EQ(im->width, 256);
  EXPECT_EQ(im->height, 192);
}

TEST(HardeningJpeg, TruncatedFilesAreRefused) {
  const std::string jpeg = *EncodeJpeg(Busy(256, 192), 90);
  const size_t sos = FindMarker(jpeg, 0xda);
  ASSERT_NE(sos, std::string::npos);
  ExpectRefused(jpeg.substr(0, jpeg.size() / 2) + kEoi, "cut in half, then EOI", "corrupt or truncated JPEG");
  ExpectRefused(jpeg.substr(0, jpeg.size() / 2), "cut in half", "corrupt or truncated JPEG");
  ExpectRefused(jpeg.substr(0, sos + 40), "cut just after SOS", "JPEG");
  ExpectRefused(jpeg.substr(0, jpeg.size() / 10) + kEoi, "cut at 10 %, then EOI", "JPEG");
  ExpectRefused(jpeg.substr(0, jpeg.size() - 200) + kEoi, "missing its last 200 bytes", "JPEG");
  // SOS header (its length field counts itself), then EOI right away: no entropy data at all.
  const size_t sos_len = (static_cast<uint8_t>(jpeg[sos + 2]) << 8) | static_cast<uint8_t>(jpeg[sos + 3]);
  ExpectRefused(jpeg.substr(0, sos + 2 + sos_len) + kEoi, "SOS then EOI", "JPEG");
}

TEST(HardeningJpeg, CorruptEntropyDataIsRefused) {
  std::string jpeg = *EncodeJpeg(Busy(256, 192), 90);
  const size_t sos = FindMarker(jpeg, 0xda);
  // A restart-free marker in the middle of the scan: "premature end of data segment".
  const size_t mid = sos + (jpeg.size() - sos) / 2;
  jpeg[mid] = static_cast<char>(0xff);
  jpeg[mid + 1] = static_cast<char>(0xd0);
  ExpectRefused(jpeg, "a marker inside the scan", "corrupt or truncated JPEG");
}

// Patches the SOF0 frame size (the height and width that follow the precision byte).
std::string WithDeclaredSize(std::string jpeg, int w, int h) {
  const size_t sof = FindMarker(jpeg, 0xc0);
  EXPECT_NE(sof, std::string::npos);
  jpeg[sof + 5] = static_cast<char>(h >> 8);
  jpeg[sof + 6] = static_cast<char>(h & 0xff);
  jpeg[sof + 7] = static_cast<char>(w >> 8);
  jpeg[sof + 8] = static_cast<char>(w & 0xff);
  return jpeg;
}

TEST(HardeningJpeg, TinyFileDeclaringAHugeSizeIsRefusedBeforeDecoding) {
  const std::string small = *EncodeJpeg(Busy(16, 16), 75);
  ASSERT_LT(small.size(), 2000u);
  const std::string liar = WithDeclaredSize(small, 16000, 4000);  // 64 MP: within the pixel limit
  ExpectRefused(liar, "a 16000 x 4000 JPEG in " + std::to_string(small.size()) + " bytes",
                "declares 16000 x 4000 pixels in " + std::to_string(small.size()) + " bytes");
}

// VmHWM/VmRSS of this process, in KiB.
long StatusKib(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::stol(line.substr(std::strlen(key)));
  }
  return -1;
}

// Decodes `bytes` in a child process and returns how much its peak resident memory grew (MiB), or
// -1 if the file was not refused with INVALID_ARGUMENT (-2: the child failed otherwise).
long DecodePeakGrowthMib(const std::string& bytes) {
  int fds[2];
  if (pipe(fds) != 0) return -2;
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::ofstream("/proc/self/clear_refs") << "5";  // resets VmHWM to the current RSS
    const long before = StatusKib("VmRSS:");
    long result = -2;
    try {
      auto r = DecodeImage(bytes);
      result = (!r.ok() && r.status().code() == StatusCode::kInvalidArgument)
                   ? (StatusKib("VmHWM:") - before) / 1024
                   : -1;
    } catch (...) {
      result = -2;
    }
    if (write(fds[1], &result, sizeof result) != sizeof result) _exit(3);
    _exit(0);
  }
  close(fds[1]);
  long result = -2;
  if (read(fds[0], &result, sizeof result) != sizeof result) result = -2;
  close(fds[0]);
  waitpid(pid, nullptr, 0);
  return result;
}

TEST(HardeningJpeg, LyingFilesDoNotCostTheDeclaredMemory) {
  const std::string small = *EncodeJpeg(Busy(16, 16), 75);
  // 192 MB of RGB declared in a few hundred bytes: refused before any of it is allocated.
  const long liar = DecodePeakGrowthMib(WithDeclaredSize(small, 16000, 4000));
  EXPECT_GE(liar, 0);
  EXPECT_LT(liar, 16);
  // A file big enough for its size that stops early: only the rows it has are paid for, not the
  // 48 MB of the whole 4000 x 4000 image.
  const std::string big = *EncodeJpeg(Busy(4000, 4000), 90);
  const long cut = DecodePeakGrowthMib(big.substr(0, big.size() / 20) + kEoi);
  EXPECT_GE(cut, 0);
  EXPECT_LT(cut, 16);
}

// ---- PNG ---------------------------------------------------------------------------------------

struct Chunk {
  size_t at;  // offset of the length field
  uint32_t length;
  std::string type;
};

std::vector<Chunk> Chunks(const std::string& png) {
  std::vector<Chunk> out;
  for (size_t at = 8; at + 12 <= png.size();) {
    const auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<uint8_t>(png[i])); };
    const uint32_t len = (b(at) << 24) | (b(at + 1) << 16) | (b(at + 2) << 8) | b(at + 3);
    out.push_back({at, len, png.substr(at + 4, 4)});
    at += 12 + len;
  }
  return out;
}

std::string MakeChunk(const std::string& type, const std::string& data) {
  std::string out;
  const uint32_t len = static_cast<uint32_t>(data.size());
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((len >> s) & 0xff));
  out += type + data;
  uLong crc = crc32(0, reinterpret_cast<const Bytef*>(type.data()), 4);
  crc = crc32(crc, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(data.size()));
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((crc >> s) & 0xff));
  return out;
}

TEST(HardeningPng, TruncatedImageDataIsRefused) {
  const std::string png = *EncodePngRgb(Busy(128, 96));
  ASSERT_TRUE(DecodeImage(png).ok());
  std::string rebuilt = png.substr(0, 8);
  for (const Chunk& c : Chunks(png)) {
    std::string data = png.substr(c.at + 8, c.length);
    if (c.type == "IDAT") data.resize(data.size() / 2);  // valid chunk, half the pixel data
    rebuilt += MakeChunk(c.type, data);
  }
  ExpectRefused(rebuilt, "IDAT cut in half (CRCs fixed)", "corrupt or truncated PNG");
  ExpectRefused(png.substr(0, png.size() / 2), "file cut in half", "corrupt or truncated PNG");
}

TEST(HardeningPng, TinyFileDeclaringAHugeSizeIsRefusedBeforeDecoding) {
  const std::string png = *EncodePngRgb(Busy(16, 16));
  std::string rebuilt = png.substr(0, 8);
  for (const Chunk& c : Chunks(png)) {
    std::string data = png.substr(c.at + 8, c.length);
    if (c.type == "IHDR") {
      const uint32_t w = 16000, h = 4000;
      for (int i = 0; i < 4; ++i) {
        data[i] = static_cast<char>((w >> (24 - 8 * i)) & 0xff);
        data[4 + i] = static_cast<char>((h >> (24 - 8 * i)) & 0xff);
      }
    }
    rebuilt += MakeChunk(c.type, data);
  }
  ExpectRefused(rebuilt, "a 16000 x 4000 PNG in " + std::to_string(rebuilt.size()) + " bytes",
                "declares 16000 x 4000 pixels");
  const long growth = DecodePeakGrowthMib(rebuilt);
  EXPECT_GE(growth, 0);
  EXPECT_LT(growth, 16);
}

// IHDR must come first (the PNG specification). libpng discards an ancillary chunk with a bad CRC
// in front of it, so such a file decoded while ReadDeclaredSize (the byte budget's size check before
// decoding) refused it (fuzz_image_decode found it in CI on 2026-12-06): both refuse it now, with
// the same message. The file with its chunks in order still decodes.
TEST(HardeningPng, AChunkBeforeIhdrIsRefusedByTheDecoderAndTheSizeReader) {
  const std::string png = *EncodePngRgb(Busy(9, 9));
  // A private ancillary chunk whose CRC is wrong: libpng discards it (an ancillary chunk's CRC error
  // is a warning) and went on to IHDR.
  std::string chunk = MakeChunk("prVt", "private data before IHDR");
  chunk.back() = static_cast<char>(chunk.back() ^ 0x5a);
  const std::string rebuilt = png.substr(0, 8) + chunk + png.substr(8);
  ExpectRefused(rebuilt, "an ancillary chunk before IHDR", "no IHDR chunk first");
  const auto declared = ReadDeclaredSize(rebuilt);
  ASSERT_FALSE(declared.ok());
  EXPECT_NE(declared.status().message().find("no IHDR chunk first"), std::string::npos);
  ASSERT_TRUE(DecodeImage(png).ok());
  ASSERT_TRUE(ReadDeclaredSize(png).ok());
  EXPECT_EQ(ReadDeclaredSize(png)->width, 9u);
}

}  // namespace
}  // namespace maskd
