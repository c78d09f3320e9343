// The bad-input corpus of issue #14: one table of cases across every RPC (Embed, Segment, the
// messages of a SegmentStream, GetInfo), each sent through real gRPC to a whole in-process maskd on
// fake engines (tests/server_fixture.h). Each case names the status it must get and a piece of the
// message that names the field (or the cause); after every case a good request must still succeed.
// It stands on its own: the hardening suites test the same findings one by one, this checks that
// the whole surface holds under all of them in one server's life.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <set>
#include <array>
#include <tuple>
#include <string>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <jpeglib.h>
#include <png.h>
#include <zlib.h>

#include "model/io/image_codec.h"
#include "model/io/image_id.h"
#include "proto/grpc_code_name.h"
#include "tests/server_fixture.h"

namespace maskd::server {
namespace {

using grpc::StatusCode;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Small limits, so that the cases at and over them stay cheap.
constexpr uint64_t kMaxImageBytes = 256 * 1024;
constexpr uint64_t kMaxImagePixels = 1'000'000;
constexpr uint32_t kMaxPrompts = 8;
constexpr uint32_t kMaxPoints = 16;

ServerConfig CorpusConfig() {
  ServerConfig c = TestConfig();
  c.max_image_bytes = kMaxImageBytes;
  c.max_image_pixels = kMaxImagePixels;
  c.max_prompts_per_request = kMaxPrompts;
  c.max_points_per_prompt = kMaxPoints;
  return c;
}

// What a call came back with: the gRPC code and message (for a stream message, its StreamError).
struct Outcome {
  StatusCode code = StatusCode::OK;
  std::string message;
};

Outcome From(const Status& s) { return {static_cast<StatusCode>(s.code()), s.message()}; }

// ----------------------------------------------------------------------------------------------
// Image builders.

ImageRGB8 Busy(int w, int h) {
  ImageRGB8 im{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3)};
  for (size_t i = 0; i < im.pixels.size(); ++i) im.pixels[i] = static_cast<uint8_t>((i * 29 + i / 7) & 0xff);
  return im;
}

std::string Png(int w, int h) { return *EncodePngRgb(Busy(w, h)); }
std::string Jpeg(int w, int h) { return *EncodeJpeg(Busy(w, h), 85); }

void PngAppend(png_structp png, png_bytep data, png_size_t n) {
  static_cast<std::string*>(png_get_io_ptr(png))->append(reinterpret_cast<char*>(data), n);
}
void PngNoFlush(png_structp) {}

// A PNG of any bit depth and colour type (16-bit, grey, grey+alpha, RGBA, palette).
std::string PngOf(int w, int h, int bit_depth, int color_type) {
  int channels = 1;
  if (color_type == PNG_COLOR_TYPE_RGB) channels = 3;
  if (color_type == PNG_COLOR_TYPE_RGBA) channels = 4;
  if (color_type == PNG_COLOR_TYPE_GRAY_ALPHA) channels = 2;
  const size_t row = (static_cast<size_t>(w) * channels * bit_depth + 7) / 8;
  std::vector<uint8_t> rows(row * h);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<uint8_t>(i * 37);
  std::string out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  png_set_write_fn(png, &out, PngAppend, PngNoFlush);
  png_set_IHDR(png, info, w, h, bit_depth, color_type, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  std::vector<png_color> palette(256);
  for (int i = 0; i < 256; ++i) palette[i] = png_color{static_cast<png_byte>(i), 0, static_cast<png_byte>(255 - i)};
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_PLTE(png, info, palette.data(), 1 << std::min(bit_depth, 8));
  png_write_info(png, info);
  for (int y = 0; y < h; ++y) png_write_row(png, rows.data() + y * row);
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

// A JPEG of 1 (grey) or 4 (CMYK) components.
std::string JpegOf(int w, int h, int components) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr jerr;
  cinfo.err = jpeg_std_error(&jerr);
  jpeg_create_compress(&cinfo);
  unsigned char* buf = nullptr;
  unsigned long size = 0;  // NOLINT(runtime/int): libjpeg's type
  jpeg_mem_dest(&cinfo, &buf, &size);
  cinfo.image_width = w;
  cinfo.image_height = h;
  cinfo.input_components = components;
  cinfo.in_color_space = components == 1 ? JCS_GRAYSCALE : JCS_CMYK;
  jpeg_set_defaults(&cinfo);
  jpeg_start_compress(&cinfo, TRUE);
  std::vector<uint8_t> row(static_cast<size_t>(w) * components);
  while (cinfo.next_scanline < cinfo.image_height) {
    for (size_t i = 0; i < row.size(); ++i) row[i] = static_cast<uint8_t>(i + cinfo.next_scanline * 3);
    JSAMPROW r = row.data();
    jpeg_write_scanlines(&cinfo, &r, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::string out(reinterpret_cast<char*>(buf), size);
  std::free(buf);
  return out;
}

// An EXIF APP1 segment with only the orientation tag, inserted after SOI.
std::string WithExifOrientation(const std::string& jpeg, int orientation) {
  std::string tiff = std::string("MM\0\x2a\0\0\0\x08", 8) + std::string("\0\x01", 2) +
                     std::string("\x01\x12\0\x03\0\0\0\x01", 8);
  tiff += static_cast<char>(0);
  tiff += static_cast<char>(orientation);
  tiff += std::string("\0\0\0\0\0\0", 6);
  const std::string payload = std::string("Exif\0\0", 6) + tiff;
  const size_t len = payload.size() + 2;
  std::string app1 = "\xff\xe1";
  app1 += static_cast<char>(len >> 8);
  app1 += static_cast<char>(len & 0xff);
  return jpeg.substr(0, 2) + app1 + payload + jpeg.substr(2);
}

size_t FindMarker(const std::string& jpeg, uint8_t marker) {
  for (size_t i = 0; i + 1 < jpeg.size(); ++i) {
    if (static_cast<uint8_t>(jpeg[i]) == 0xff && static_cast<uint8_t>(jpeg[i + 1]) == marker) return i;
  }
  return std::string::npos;
}

// The JPEG with its SOF0 saying w x h (a few hundred bytes that declare any size).
std::string JpegDeclaring(int w, int h) {
  std::string j = Jpeg(16, 16);
  const size_t sof = FindMarker(j, 0xc0);
  j[sof + 5] = static_cast<char>(h >> 8);
  j[sof + 6] = static_cast<char>(h & 0xff);
  j[sof + 7] = static_cast<char>(w >> 8);
  j[sof + 8] = static_cast<char>(w & 0xff);
  return j;
}

uint32_t Crc(const std::string& bytes) {
  return static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(bytes.data()),
                                     static_cast<uInt>(bytes.size())));
}

void Be32(std::string* s, uint32_t v) {
  for (int sh = 24; sh >= 0; sh -= 8) s->push_back(static_cast<char>((v >> sh) & 0xff));
}

// The PNG with its IHDR saying w x h (CRC fixed, so only the size lies).
std::string PngDeclaring(int w, int h) {
  std::string p = Png(16, 16);
  std::string ihdr = p.substr(12, 17);  // "IHDR" + 13 bytes
  std::string wh;
  Be32(&wh, static_cast<uint32_t>(w));
  Be32(&wh, static_cast<uint32_t>(h));
  ihdr.replace(4, 8, wh);
  std::string crc;
  Be32(&crc, Crc(ihdr));
  return p.substr(0, 12) + ihdr + crc + p.substr(33);
}

// A PNG whose IDAT inflates to far more than its header allows (a decompression bomb): a 64 x 64
// IHDR in front of 64 MiB of zeros compressed into ~64 KiB.
std::string PngBomb() {
  std::string p = Png(64, 64);
  const size_t idat = p.find("IDAT") - 4;
  std::vector<uint8_t> zeros(64u << 20, 0);
  uLongf n = compressBound(zeros.size());
  std::string z(n, '\0');
  compress2(reinterpret_cast<Bytef*>(z.data()), &n, zeros.data(), zeros.size(), 9);
  z.resize(n);
  std::string chunk;
  Be32(&chunk, static_cast<uint32_t>(z.size()));
  std::string body = "IDAT" + z;
  chunk += body;
  Be32(&chunk, Crc(body));
  const size_t iend = p.find("IEND") - 4;
  return p.substr(0, idat) + chunk + p.substr(iend);
}

std::string Riff(const std::string& fourcc, const std::string& body) {
  std::string out = "RIFF";
  const uint32_t n = static_cast<uint32_t>(4 + 8 + body.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += "WEBP" + fourcc;
  const uint32_t m = static_cast<uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((m >> (8 * i)) & 0xff));
  return out + body;
}

v1::Image Encoded(std::string bytes) {
  v1::Image im;
  im.set_encoded(std::move(bytes));
  return im;
}

v1::Image Raw(int64_t w, int64_t h, size_t bytes) {
  v1::Image im;
  im.mutable_raw()->set_width(static_cast<uint32_t>(w));
  im.mutable_raw()->set_height(static_cast<uint32_t>(h));
  im.mutable_raw()->set_rgb(std::string(bytes, '\x40'));
  return im;
}

// ----------------------------------------------------------------------------------------------
// Request builders.

v1::Prompt PointAt(float x, float y, v1::PointLabel label = v1::POINT_LABEL_FOREGROUND) {
  v1::Prompt p;
  v1::Point* pt = p.add_points();
  pt->set_x(x);
  pt->set_y(y);
  pt->set_label(label);
  return p;
}

v1::Prompt BoxPrompt(float x0, float y0, float x1, float y1) {
  v1::Prompt p;
  v1::Box* b = p.mutable_box();
  b->set_x0(x0);
  b->set_y0(y0);
  b->set_x1(x1);
  b->set_y1(y1);
  return p;
}

// The corpus's image: 64 x 48 PNG, embedded once; its id is known to every case.
constexpr int kW = 64, kH = 48;

struct Corpus {
  TestServer* t = nullptr;
  std::string image_id;   // cached on the server
  std::string result_id;  // a stored result of that image
  std::string other_id;   // a well-formed id never embedded

  v1::SegmentRequest OnImage(std::vector<v1::Prompt> prompts) const {
    v1::SegmentRequest r;
    r.set_image_id(image_id);
    for (auto& p : prompts) *r.add_prompts() = std::move(p);
    return r;
  }

  Outcome Embed(const v1::EmbedRequest& r) const {
    auto out = t->client->Embed(r);
    return out.ok() ? Outcome{} : From(out.status());
  }
  Outcome EmbedImage(const v1::Image& im) const {
    v1::EmbedRequest r;
    *r.mutable_image() = im;
    return Embed(r);
  }
  Outcome Segment(const v1::SegmentRequest& r) const {
    auto out = t->client->Segment(r);
    return out.ok() ? Outcome{} : From(out.status());
  }
  Outcome Generate(const v1::GenerateMasksRequest& r) const {
    auto out = t->client->GenerateMasks(r);
    return out.ok() ? Outcome{} : From(out.status());
  }
  // GenerateMasks on the corpus image by id, its parameters set by `edit`.
  v1::GenerateMasksRequest GenerateOnImage(const std::function<void(v1::MaskGenerationParams*)>& edit) const {
    v1::GenerateMasksRequest r;
    r.set_image_id(image_id);
    edit(r.mutable_params());
    return r;
  }
  Outcome SegmentImage(const v1::Image& im) const {
    v1::SegmentRequest r;
    *r.mutable_image() = im;
    *r.add_prompts() = PointAt(1, 1);
    return Segment(r);
  }
  // `r` as the second message of a stream whose first message (on the corpus image) is good: the
  // answer to `r` (its StreamError) is the outcome; the stream must have answered the first.
  Outcome StreamSecond(const v1::SegmentRequest& r) const {
    auto session = t->client->OpenSession(std::chrono::milliseconds(20000));
    auto first = session->Send(OnImage({PointAt(2, 2)}));
    if (!first.ok()) return {StatusCode::INTERNAL, "the good first stream message failed: " + first.status().ToString()};
    auto second = session->Send(r);
    Outcome o = second.ok() ? Outcome{} : From(second.status());
    // A refused message is answered in the stream, which stays usable: a third, good message (naming
    // the image again: a refused one that named an image leaves the stream without a current image)
    // is answered too.
    if (o.code == StatusCode::INVALID_ARGUMENT || o.code == StatusCode::NOT_FOUND || o.code == StatusCode::OK) {
      auto third = session->Send(OnImage({PointAt(3, 3)}));
      if (!third.ok()) {
        return {StatusCode::INTERNAL, "the stream did not answer a good message after \"" + o.message +
                                          "\": " + third.status().ToString()};
      }
    }
    (void)session->Finish();
    return o;
  }
  // A follow-up that omits the image (the stream's current one) with one point.
  static v1::SegmentRequest PointsOnly() {
    v1::SegmentRequest r;
    *r.add_prompts() = PointAt(3, 3);
    return r;
  }
  // `r` as the first message of a stream.
  Outcome StreamFirst(const v1::SegmentRequest& r) const {
    auto session = t->client->OpenSession(std::chrono::milliseconds(20000));
    auto out = session->Send(r);
    (void)session->Finish();
    return out.ok() ? Outcome{} : From(out.status());
  }
  // Raw bytes as the request of a unary method.
  Outcome RawUnary(const std::string& method, const std::string& bytes) const {
    grpc::GenericStub stub(t->client->channel());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    grpc::ByteBuffer request = Wire(bytes), response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&ctx, "/maskd.v1.MaskService/" + method, grpc::StubOptions(), &request, &response,
                   [&](grpc::Status s) { done.set_value(s); });
    const grpc::Status s = done.get_future().get();
    return {s.error_code(), s.error_message()};
  }
  // Raw bytes as the second message of a stream (after a good one): the stream's final status.
  Outcome RawStreamSecond(const std::string& bytes) const {
    grpc::CompletionQueue cq;
    grpc::GenericStub stub(t->client->channel());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    auto call = stub.PrepareCall(&ctx, "/maskd.v1.MaskService/SegmentStream", &cq);
    intptr_t next_tag = 1;
    auto step = [&]() {
      void* tag = nullptr;
      bool ok = false;
      const intptr_t want = next_tag++;
      while (cq.Next(&tag, &ok)) {
        if (reinterpret_cast<intptr_t>(tag) == want) return ok;
      }
      return false;
    };
    call->StartCall(reinterpret_cast<void*>(next_tag));
    step();
    for (const std::string& m : {Serialized(OnImage({PointAt(2, 2)})), bytes}) {
      call->Write(Wire(m), reinterpret_cast<void*>(next_tag));
      if (!step()) break;
    }
    call->WritesDone(reinterpret_cast<void*>(next_tag));
    step();
    for (;;) {
      grpc::ByteBuffer b;
      call->Read(&b, reinterpret_cast<void*>(next_tag));
      if (!step()) break;
    }
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(next_tag));
    step();
    cq.Shutdown();
    void* tag;
    bool ok;
    while (cq.Next(&tag, &ok)) {
    }
    return {status.error_code(), status.error_message()};
  }
};

struct Case {
  std::string name;
  std::function<Outcome(const Corpus&)> run;
  StatusCode code;
  std::string mention;  // must occur in the message (the field or the cause); "" for OK
};

// A Segment request variant sent three ways: unary, as the first message of a stream and as a
// later stream message (the image then comes from the request itself, or from the stream).
void AddSegmentEverywhere(std::vector<Case>* cases, const std::string& name,
                          std::function<v1::SegmentRequest(const Corpus&)> build, StatusCode code,
                          const std::string& mention) {
  cases->push_back({"Segment/" + name, [build](const Corpus& c) { return c.Segment(build(c)); }, code, mention});
  cases->push_back({"SegmentStream[0]/" + name, [build](const Corpus& c) { return c.StreamFirst(build(c)); }, code,
                    mention});
  cases->push_back({"SegmentStream[1]/" + name, [build](const Corpus& c) { return c.StreamSecond(build(c)); }, code,
                    mention});
}

std::vector<Case> BuildCorpus() {
  std::vector<Case> cases;
  const StatusCode kInvalid = StatusCode::INVALID_ARGUMENT;
  const StatusCode kNotFound = StatusCode::NOT_FOUND;

  // --- Embed: missing and empty fields, wrong oneofs.
  cases.push_back({"Embed/empty request", [](const Corpus& c) { return c.Embed(v1::EmbedRequest()); }, kInvalid,
                   "image is not set"});
  cases.push_back({"Embed/image with no source", [](const Corpus& c) {
                     v1::EmbedRequest r;
                     r.mutable_image();
                     return c.Embed(r);
                   }, kInvalid, "image has neither encoded nor raw"});
  cases.push_back({"Embed/empty encoded", [](const Corpus& c) { return c.EmbedImage(Encoded("")); }, kInvalid,
                   "image.encoded is empty"});
  cases.push_back({"Embed/raw with no pixels", [](const Corpus& c) { return c.EmbedImage(Raw(4, 4, 0)); }, kInvalid,
                   "image.raw.rgb"});

  // --- Garbage, truncated, lying and bomb images, for Embed and for Segment with bytes.
  std::vector<std::tuple<std::string, std::function<std::string()>, std::string>> images = {
      {"garbage bytes", [] { return std::string("this is not an image at all, just text"); }, "image.encoded"},
      {"one byte", [] { return std::string("\xff", 1); }, "image.encoded"},
      {"JPEG SOI only", [] { return std::string("\xff\xd8", 2); }, "image.encoded"},
      {"JPEG cut in half", [] { std::string j = Jpeg(64, 48); return j.substr(0, j.size() / 2); }, "image.encoded"},
      {"JPEG cut in half + EOI", [] { std::string j = Jpeg(64, 48); return j.substr(0, j.size() / 2) + "\xff\xd9"; },
       "image.encoded"},
      {"JPEG cut at 10%", [] { std::string j = Jpeg(64, 48); return j.substr(0, j.size() / 10); }, "image.encoded"},
      {"JPEG SOS then EOI", [] { std::string j = Jpeg(64, 48); return j.substr(0, FindMarker(j, 0xda) + 14) + "\xff\xd9"; },
       "image.encoded"},
      {"JPEG declaring 16000x4000", [] { return JpegDeclaring(16000, 4000); }, "image.encoded"},
      {"JPEG declaring 65535x65535", [] { return JpegDeclaring(65535, 65535); }, "image.encoded"},
      {"JPEG declaring 0x16", [] { return JpegDeclaring(0, 16); }, "image.encoded"},
      {"JPEG with corrupt entropy data", [] {
         std::string j = Jpeg(64, 48);
         const size_t sos = FindMarker(j, 0xda);
         for (size_t i = sos + 20; i < j.size() - 2; i += 3) j[i] = static_cast<char>(0xff);
         return j;
       }, "image.encoded"},
      {"PNG signature only", [] { return Png(8, 8).substr(0, 8); }, "image.encoded"},
      {"PNG cut in half", [] { std::string p = Png(64, 48); return p.substr(0, p.size() / 2); }, "image.encoded"},
      {"PNG without IEND", [] { std::string p = Png(64, 48); return p.substr(0, p.size() - 12); }, "image.encoded"},
      {"PNG with a bad CRC", [] { std::string p = Png(64, 48); p[30] ^= 0x55; return p; }, "image.encoded"},
      {"PNG declaring 20000x20000", [] { return PngDeclaring(20000, 20000); }, "image.encoded"},
      {"PNG declaring 100000x1", [] { return PngDeclaring(100000, 1); }, "image.encoded"},
      {"PNG declaring 0x0", [] { return PngDeclaring(0, 0); }, "image.encoded"},
      {"WebP header only", [] { return Riff("VP8 ", ""); }, "image.encoded"},
      {"WebP garbage VP8", [] { return Riff("VP8 ", std::string(40, '\x11')); }, "image.encoded"},
      {"WebP garbage VP8L", [] { return Riff("VP8L", std::string(40, '\x2f')); }, "image.encoded"},
      {"WebP unknown chunk", [] { return Riff("ABCD", std::string(16, '\0')); }, "image.encoded"},
      {"GIF", [] { return std::string("GIF89a\x01\0\x01\0\0\0\0;", 14); }, "image.encoded"},
      {"BMP", [] { return std::string("BM") + std::string(60, '\0'); }, "image.encoded"},
      {"image over max_image_bytes", [] { return Png(8, 8) + std::string(kMaxImageBytes, '\0'); }, "image.encoded"},
      {"side over 16384", [] { return PngDeclaring(16385, 8); }, "image.encoded"},
      {"over max_image_pixels", [] { return Png(1001, 1000); }, "image.encoded"},
  };
  for (const auto& [name, make, mention] : images) {
    cases.push_back({"Embed/" + name, [make = make](const Corpus& c) { return c.EmbedImage(Encoded(make())); },
                     kInvalid, mention});
    cases.push_back({"Segment/" + name, [make = make](const Corpus& c) { return c.SegmentImage(Encoded(make())); },
                     kInvalid, mention});
  }
  // Images that are fine however odd: 16-bit, grey, palette, alpha, CMYK, EXIF-rotated, tiny, at the
  // byte and pixel limits.
  std::vector<std::pair<std::string, std::function<std::string()>>> good_images = {
      {"16-bit RGB PNG", [] { return PngOf(40, 30, 16, PNG_COLOR_TYPE_RGB); }},
      {"16-bit grey PNG", [] { return PngOf(40, 30, 16, PNG_COLOR_TYPE_GRAY); }},
      {"1-bit grey PNG", [] { return PngOf(40, 30, 1, PNG_COLOR_TYPE_GRAY); }},
      {"8-bit grey+alpha PNG", [] { return PngOf(40, 30, 8, PNG_COLOR_TYPE_GRAY_ALPHA); }},
      {"16-bit RGBA PNG", [] { return PngOf(40, 30, 16, PNG_COLOR_TYPE_RGBA); }},
      {"palette PNG", [] { return PngOf(40, 30, 8, PNG_COLOR_TYPE_PALETTE); }},
      {"grey JPEG", [] { return JpegOf(40, 30, 1); }},
      {"CMYK JPEG", [] { return JpegOf(40, 30, 4); }},
      {"EXIF orientation 6 JPEG", [] { return WithExifOrientation(Jpeg(40, 30), 6); }},
      {"EXIF orientation 8 JPEG", [] { return WithExifOrientation(Jpeg(40, 30), 8); }},
      {"EXIF orientation 3 JPEG", [] { return WithExifOrientation(Jpeg(40, 30), 3); }},
      {"EXIF orientation 0 (invalid) JPEG", [] { return WithExifOrientation(Jpeg(40, 30), 0); }},
      {"EXIF orientation 200 (invalid) JPEG", [] { return WithExifOrientation(Jpeg(40, 30), 200); }},
      {"1x1 PNG", [] { return Png(1, 1); }},
      // Extreme aspect ratios are handled (a resized side is clamped to >= 1 pixel), not refused.
      {"1x4000 PNG", [] { return Png(1, 4000); }},
      {"4000x1 PNG", [] { return Png(4000, 1); }},
      {"16384x1 PNG", [] { return Png(16384, 1); }},
      {"1x2049 PNG", [] { return Png(1, 2049); }},
      // A decompression bomb: a 64 x 64 header in front of 64 MiB of zeros in ~64 KiB. Only what
      // the header declares is decoded (the memory is bounded by the declared size, checked first).
      {"PNG with a 64 MiB zlib stream behind a 64x64 header", [] { return PngBomb(); }},
      {"exactly max_image_bytes", [] {
         std::string p = Png(16, 16);
         return p + std::string(kMaxImageBytes - p.size(), '\0');  // trailing bytes after IEND
       }},
      {"exactly max_image_pixels (1000x1000)", [] { return Png(1000, 1000); }},
  };
  for (const auto& [name, make] : good_images) {
    cases.push_back({"Embed/" + name, [make = make](const Corpus& c) { return c.EmbedImage(Encoded(make())); },
                     StatusCode::OK, ""});
    cases.push_back({"Segment/" + name, [make = make](const Corpus& c) { return c.SegmentImage(Encoded(make())); },
                     StatusCode::OK, ""});
  }
  cases.push_back({"Segment/raw 1x3000", [](const Corpus& c) { return c.SegmentImage(Raw(1, 3000, 9000)); },
                   StatusCode::OK, ""});
  // Raw images.
  const std::vector<std::tuple<std::string, int64_t, int64_t, size_t, std::string>> raws = {
      {"raw width 0", 0, 4, 0, "image.raw.width"},
      {"raw height 0", 4, 0, 0, "image.raw.height"},
      {"raw rgb too short", 4, 4, 47, "image.raw.rgb"},
      {"raw rgb too long", 4, 4, 49, "image.raw.rgb"},
      {"raw side over the limit", 20000, 1, 60000, "image.raw"},
      {"raw over max_image_pixels", 1001, 1000, 1001 * 1000 * 3, "image.raw"},
  };
  for (const auto& [name, w, h, n, mention] : raws) {
    cases.push_back({"Embed/" + name, [w = w, h = h, n = n](const Corpus& c) { return c.EmbedImage(Raw(w, h, n)); },
                     kInvalid, mention});
    cases.push_back({"Segment/" + name, [w = w, h = h, n = n](const Corpus& c) { return c.SegmentImage(Raw(w, h, n)); },
                     kInvalid, mention});
  }

  // --- Segment: image_source and ids.
  AddSegmentEverywhere(&cases, "no image_source, no prompts", [](const Corpus&) { return v1::SegmentRequest(); },
                       kInvalid, "");
  cases.push_back({"Segment/no image_source", [](const Corpus& c) {
                     v1::SegmentRequest r;
                     *r.add_prompts() = PointAt(1, 1);
                     return c.Segment(r);
                   }, kInvalid, "image_source"});
  cases.push_back({"SegmentStream[0]/no image_source", [](const Corpus& c) {
                     v1::SegmentRequest r;
                     *r.add_prompts() = PointAt(1, 1);
                     return c.StreamFirst(r);
                   }, kInvalid, "image_source"});
  for (const auto& [name, id, code, mention] : std::vector<std::tuple<std::string, std::string, StatusCode, std::string>>{
           {"empty image_id", "", kInvalid, "image_id"},
           {"short image_id", "abc", kInvalid, "image_id"},
           {"upper-case image_id", std::string(64, 'A'), kInvalid, "image_id"},
           {"non-hex image_id", std::string(63, 'a') + "g", kInvalid, "image_id"},
           {"65-digit image_id", std::string(65, 'a'), kInvalid, "image_id"},
           {"image_id with a newline", std::string(32, 'a') + "\n" + std::string(31, 'a'), kInvalid, "image_id"},
           {"image_id with a scope suffix", std::string(64, 'a') + "@alpha", kInvalid, "image_id"},
           {"unknown image_id", "", kNotFound, "image_id"},
       }) {
    const bool unknown = name == "unknown image_id";
    AddSegmentEverywhere(&cases, name, [id = id, unknown](const Corpus& c) {
      v1::SegmentRequest r = c.OnImage({PointAt(1, 1)});
      r.set_image_id(unknown ? c.other_id : id);
      return r;
    }, code, mention);
  }

  // --- Prompts: counts, coordinates, labels, boxes.
  cases.push_back({"Segment/no prompts", [](const Corpus& c) { return c.Segment(c.OnImage({})); }, kInvalid,
                   "prompts has 0 prompts"});
  // A stream message without prompts only sets the stream's image (documented): answered OK.
  cases.push_back({"SegmentStream[1]/no prompts (sets the image)",
                   [](const Corpus& c) { return c.StreamSecond(c.OnImage({})); }, StatusCode::OK, ""});
  AddSegmentEverywhere(&cases, "too many prompts", [](const Corpus& c) {
    return c.OnImage(std::vector<v1::Prompt>(kMaxPrompts + 1, PointAt(1, 1)));
  }, kInvalid, "prompts has 9 prompts");
  AddSegmentEverywhere(&cases, "thousands of points", [](const Corpus& c) {
    v1::Prompt p;
    for (int i = 0; i < 5000; ++i) {
      v1::Point* pt = p.add_points();
      pt->set_x(1);
      pt->set_y(1);
      pt->set_label(v1::POINT_LABEL_FOREGROUND);
    }
    return c.OnImage({p});
  }, kInvalid, "prompts[0].points has 5000");
  AddSegmentEverywhere(&cases, "one point over max_points", [](const Corpus& c) {
    v1::Prompt p;
    for (uint32_t i = 0; i <= kMaxPoints; ++i) *p.add_points() = PointAt(1, 1).points(0);
    return c.OnImage({p});
  }, kInvalid, "prompts[0].points has 17");
  AddSegmentEverywhere(&cases, "empty prompt", [](const Corpus& c) { return c.OnImage({v1::Prompt()}); }, kInvalid,
                       "prompts[0] has no points and no box");
  for (const auto& [what, x, y] : std::vector<std::tuple<std::string, float, float>>{
           {"x NaN", kNaN, 1}, {"y NaN", 1, kNaN}, {"x +inf", kInf, 1}, {"y -inf", 1, -kInf},
           {"x negative", -1, 1}, {"y negative", 1, -0.5f}, {"x past the width", kW + 1.0f, 1},
           {"y past the height", 1, kH + 1.0f}, {"x huge", 3e38f, 1}, {"y huge", 1, 1e30f},
       }) {
    // Non-finite values are named by point ("has a non-finite coordinate"), others by coordinate.
    const bool finite = std::isfinite(x) && std::isfinite(y);
    const std::string field = !finite ? "prompts[0].points[0]"
                              : what[0] == 'x' ? "prompts[0].points[0].x" : "prompts[0].points[0].y";
    AddSegmentEverywhere(&cases, "point " + what, [x = x, y = y](const Corpus& c) { return c.OnImage({PointAt(x, y)}); },
                         kInvalid, field);
  }
  // POINT_LABEL_UNSPECIFIED is documented as FOREGROUND.
  AddSegmentEverywhere(&cases, "point label unspecified (foreground)", [](const Corpus& c) {
    return c.OnImage({PointAt(1, 1, v1::POINT_LABEL_UNSPECIFIED)});
  }, StatusCode::OK, "");
  AddSegmentEverywhere(&cases, "second prompt's point NaN", [](const Corpus& c) {
    return c.OnImage({PointAt(1, 1), PointAt(kNaN, 2)});
  }, kInvalid, "prompts[1].points[0]");
  for (const auto& [what, label] : std::vector<std::pair<std::string, int>>{
           {"label 3", 3}, {"label -1", -1}, {"label 1000000", 1000000}}) {
    AddSegmentEverywhere(&cases, "point " + what, [label = label](const Corpus& c) {
      return c.OnImage({PointAt(1, 1, static_cast<v1::PointLabel>(label))});
    }, kInvalid, "prompts[0].points[0].label");
  }
  for (const auto& [what, box] : std::vector<std::pair<std::string, std::array<float, 4>>>{
           {"inverted box x", {30, 5, 10, 20}}, {"inverted box y", {5, 30, 20, 10}},
           {"box NaN", {kNaN, 1, 10, 10}}, {"box inf", {1, 1, kInf, 10}},
           {"box negative", {-5, -5, 10, 10}}, {"box past the image", {1, 1, kW + 10.0f, kH + 10.0f}},
       }) {
    AddSegmentEverywhere(&cases, what, [box = box](const Corpus& c) {
      return c.OnImage({BoxPrompt(box[0], box[1], box[2], box[3])});
    }, kInvalid, "prompts[0].box");
  }

  // --- mask_input.
  AddSegmentEverywhere(&cases, "mask_input with no source", [](const Corpus& c) {
    v1::Prompt p = PointAt(1, 1);
    p.mutable_mask_input();
    return c.OnImage({p});
  }, kInvalid, "prompts[0].mask_input has neither");
  AddSegmentEverywhere(&cases, "empty result_id", [](const Corpus& c) {
    v1::Prompt p = PointAt(1, 1);
    p.mutable_mask_input()->set_result_id("");
    return c.OnImage({p});
  }, kInvalid, "prompts[0].mask_input.result_id");
  AddSegmentEverywhere(&cases, "unknown result_id", [](const Corpus& c) {
    v1::Prompt p = PointAt(1, 1);
    p.mutable_mask_input()->set_result_id("r" + std::string(32, '0'));
    return c.OnImage({p});
  }, kNotFound, "prompts[0].mask_input.result_id");
  AddSegmentEverywhere(&cases, "garbage result_id", [](const Corpus& c) {
    v1::Prompt p = PointAt(1, 1);
    p.mutable_mask_input()->set_result_id("../../etc/passwd");
    return c.OnImage({p});
  }, kNotFound, "prompts[0].mask_input.result_id");
  AddSegmentEverywhere(&cases, "mask_index out of range", [](const Corpus& c) {
    v1::Prompt p = PointAt(1, 1);
    p.mutable_mask_input()->set_result_id(c.result_id);
    p.mutable_mask_input()->set_mask_index(7);
    return c.OnImage({p});
  }, kInvalid, "prompts[0].mask_input.mask_index");
  cases.push_back({"Segment/foreign result_id (another image's)", [](const Corpus& c) {
                     v1::SegmentRequest r;
                     *r.mutable_image() = Encoded(Png(20, 20));
                     v1::Prompt p = PointAt(1, 1);
                     p.mutable_mask_input()->set_result_id(c.result_id);
                     *r.add_prompts() = p;
                     return c.Segment(r);
                   }, kNotFound, "prompts[0].mask_input.result_id"});
  for (const auto& [what, w, h, n, mention] : std::vector<std::tuple<std::string, int, int, int, std::string>>{
           {"logits 0x0", 0, 0, 0, "prompts[0].mask_input.logits"},
           {"logits 255x256", 255, 256, 255 * 256, "prompts[0].mask_input.logits"},
           {"logits too few values", 256, 256, 100, "prompts[0].mask_input.logits.values"},
           {"logits too many values", 256, 256, 256 * 256 + 1, "prompts[0].mask_input.logits.values"},
       }) {
    AddSegmentEverywhere(&cases, what, [w = w, h = h, n = n](const Corpus& c) {
      v1::Prompt p = PointAt(1, 1);
      v1::LowResLogits* l = p.mutable_mask_input()->mutable_logits();
      l->set_width(static_cast<uint32_t>(w));
      l->set_height(static_cast<uint32_t>(h));
      for (int i = 0; i < n; ++i) l->add_values(0.5f);
      return c.OnImage({p});
    }, kInvalid, mention);
  }
  for (const auto& [what, v] : std::vector<std::pair<std::string, float>>{{"NaN", kNaN}, {"inf", kInf}}) {
    AddSegmentEverywhere(&cases, "logits value " + what, [v = v](const Corpus& c) {
      v1::Prompt p = PointAt(1, 1);
      v1::LowResLogits* l = p.mutable_mask_input()->mutable_logits();
      l->set_width(256);
      l->set_height(256);
      for (int i = 0; i < 256 * 256; ++i) l->add_values(i == 1234 ? v : 0.f);
      return c.OnImage({p});
    }, kInvalid, "prompts[0].mask_input.logits.values[1234]");
  }

  // --- Options: unknown enum values, tolerances, tags.
  for (int f : {5, 99, -3}) {
    AddSegmentEverywhere(&cases, "output_format " + std::to_string(f), [f](const Corpus& c) {
      v1::SegmentRequest r = c.OnImage({PointAt(1, 1)});
      r.set_output_format(static_cast<v1::OutputFormat>(f));
      return r;
    }, kInvalid, "output_format");
  }
  for (const auto& [what, tol] : std::vector<std::pair<std::string, float>>{
           {"NaN", kNaN}, {"negative", -1}, {"inf", kInf}}) {
    AddSegmentEverywhere(&cases, "polygon_tolerance " + what, [tol = tol](const Corpus& c) {
      v1::SegmentRequest r = c.OnImage({PointAt(1, 1)});
      r.set_output_format(v1::OUTPUT_FORMAT_POLYGONS);
      r.set_polygon_tolerance(tol);
      return r;
    }, kInvalid, "polygon_tolerance");
  }
  AddSegmentEverywhere(&cases, "request_tag over 128 bytes", [](const Corpus& c) {
    v1::SegmentRequest r = c.OnImage({PointAt(1, 1)});
    r.set_request_tag(std::string(129, 't'));
    return r;
  }, kInvalid, "request_tag");
  AddSegmentEverywhere(&cases, "request_tag of 128 bytes with control characters", [](const Corpus& c) {
    v1::SegmentRequest r = c.OnImage({PointAt(1, 1)});
    r.set_request_tag("line\nforged access line\r\x1b[31m" + std::string(128 - 30, 'x'));
    return r;
  }, StatusCode::OK, "");

  // --- Unparsable bytes and unknown fields, per method.
  const std::string truncated("\x0a\x64garbage", 9);  // field 1, length 100, 7 bytes follow
  const std::string bad_utf8_tag = std::string("\x2a\x03\xff\xfe\n", 5);
  for (const std::string method : {"Embed", "Segment", "GetInfo", "GenerateMasks"}) {
    cases.push_back({method + "/unparsable (truncated field)",
                     [method, truncated](const Corpus& c) { return c.RawUnary(method, truncated); }, kInvalid,
                     method});
    cases.push_back({method + "/unparsable (bad varint)",
                     [method](const Corpus& c) { return c.RawUnary(method, std::string(11, '\xff')); }, kInvalid,
                     method});
    cases.push_back({method + "/unparsable (wire type 7)",
                     [method](const Corpus& c) { return c.RawUnary(method, std::string("\x0f\x01", 2)); }, kInvalid,
                     method});
  }
  cases.push_back({"Segment/invalid UTF-8 in request_tag", [bad_utf8_tag](const Corpus& c) {
                     return c.RawUnary("Segment", Serialized(c.OnImage({PointAt(1, 1)})) + bad_utf8_tag);
                   }, kInvalid, "Segment"});
  cases.push_back({"SegmentStream[1]/unparsable message", [truncated](const Corpus& c) {
                     return c.RawStreamSecond(truncated);
                   }, kInvalid, "is not a valid maskd.v1.SegmentRequest"});
  cases.push_back({"SegmentStream[1]/invalid UTF-8 in request_tag", [bad_utf8_tag](const Corpus& c) {
                     return c.RawStreamSecond(Serialized(Corpus::PointsOnly()) + bad_utf8_tag);
                   }, kInvalid, "is not a valid maskd.v1.SegmentRequest"});
  // Unknown fields are what newer clients send: ignored, as protobuf intends.
  cases.push_back({"GetInfo/unknown field", [](const Corpus& c) {
                     return c.RawUnary("GetInfo", std::string("\xa0\x06\x01", 3));
                   }, StatusCode::OK, ""});
  cases.push_back({"GetInfo/empty", [](const Corpus& c) { return c.RawUnary("GetInfo", ""); }, StatusCode::OK, ""});
  cases.push_back({"Segment/unknown field", [](const Corpus& c) {
                     return c.RawUnary("Segment", Serialized(c.OnImage({PointAt(1, 1)})) + std::string("\xa0\x06\x01", 3));
                   }, StatusCode::OK, ""});
  cases.push_back({"Embed/empty bytes", [](const Corpus& c) { return c.RawUnary("Embed", ""); }, kInvalid,
                   "image is not set"});

  // --- Messages at and over the server's receive limit (gRPC refuses them before any handler).
  cases.push_back({"Embed/message over the receive limit", [](const Corpus& c) {
                     return c.EmbedImage(Raw(1000, 1000, 8u << 20));
                   }, StatusCode::RESOURCE_EXHAUSTED, "larger than max"});
  cases.push_back({"Segment/message over the receive limit", [](const Corpus& c) {
                     v1::SegmentRequest r = c.OnImage({PointAt(1, 1)});
                     r.set_request_tag(std::string(8u << 20, 'x'));
                     return c.Segment(r);
                   }, StatusCode::RESOURCE_EXHAUSTED, "larger than max"});
  cases.push_back({"SegmentStream[1]/message over the receive limit", [](const Corpus& c) {
                     v1::SegmentRequest r = Corpus::PointsOnly();
                     r.set_request_tag(std::string(8u << 20, 'x'));
                     return c.StreamSecond(r);
                   }, StatusCode::RESOURCE_EXHAUSTED, "larger than max"});
  cases.push_back({"Embed/raw at max_image_pixels", [](const Corpus& c) {
                     return c.EmbedImage(Raw(1000, 1000, 1000 * 1000 * 3));
                   }, StatusCode::OK, ""});

  // --- GenerateMasks (issue #15): every parameter out of its range, huge and malformed grids, the
  // output forms it has no use for, unknown and malformed ids. The parameters are checked on the
  // handler thread, before any lookup or model work.
  using Params = v1::MaskGenerationParams;
  const std::vector<std::tuple<std::string, std::function<void(Params*)>, std::string>> params = {
      {"points_per_side 0", [](Params* p) { p->set_points_per_side(0); }, "params.points_per_side"},
      {"points_per_side -3", [](Params* p) { p->set_points_per_side(-3); }, "params.points_per_side"},
      {"points_per_side 100000", [](Params* p) { p->set_points_per_side(100000); }, "params.points_per_side"},
      {"points_per_side 129 (over the limit)", [](Params* p) { p->set_points_per_side(129); },
       "params.points_per_side"},
      {"points_per_side 128 with 3 crop layers (grid points over the limit)",
       [](Params* p) { p->set_points_per_side(128); p->set_crop_n_layers(3); }, "grid points"},
      {"points_per_batch 0", [](Params* p) { p->set_points_per_batch(0); }, "params.points_per_batch"},
      {"points_per_batch 1000000", [](Params* p) { p->set_points_per_batch(1000000); }, "params.points_per_batch"},
      {"pred_iou_thresh NaN", [](Params* p) { p->set_pred_iou_thresh(kNaN); }, "params.pred_iou_thresh"},
      {"pred_iou_thresh 2", [](Params* p) { p->set_pred_iou_thresh(2); }, "params.pred_iou_thresh"},
      {"stability_score_thresh -1", [](Params* p) { p->set_stability_score_thresh(-1); },
       "params.stability_score_thresh"},
      {"stability_score_offset inf", [](Params* p) { p->set_stability_score_offset(kInf); },
       "params.stability_score_offset"},
      {"stability_score_offset -0.5", [](Params* p) { p->set_stability_score_offset(-0.5f); },
       "params.stability_score_offset"},
      {"box_nms_thresh NaN", [](Params* p) { p->set_box_nms_thresh(kNaN); }, "params.box_nms_thresh"},
      {"crop_nms_thresh 1.5", [](Params* p) { p->set_crop_nms_thresh(1.5f); }, "params.crop_nms_thresh"},
      {"crop_n_layers -1", [](Params* p) { p->set_crop_n_layers(-1); }, "params.crop_n_layers"},
      {"crop_n_layers 99", [](Params* p) { p->set_crop_n_layers(99); }, "params.crop_n_layers"},
      {"crop_overlap_ratio 1", [](Params* p) { p->set_crop_overlap_ratio(1.0); }, "params.crop_overlap_ratio"},
      {"crop_overlap_ratio NaN", [](Params* p) { p->set_crop_overlap_ratio(std::nan("")); },
       "params.crop_overlap_ratio"},
      {"crop_n_points_downscale_factor 0", [](Params* p) { p->set_crop_n_points_downscale_factor(0); },
       "params.crop_n_points_downscale_factor"},
      {"downscale leaves a layer without points",
       [](Params* p) { p->set_points_per_side(4); p->set_crop_n_layers(2); p->set_crop_n_points_downscale_factor(16); },
       "params.crop_n_points_downscale_factor"},
      {"min_mask_region_area -1", [](Params* p) { p->set_min_mask_region_area(-1); }, "params.min_mask_region_area"},
      {"point_grids and points_per_side",
       [](Params* p) { p->set_points_per_side(8); p->add_point_grids()->add_points()->set_x(0.5); },
       "params.points_per_side"},
      {"point_grids: two grids for no crop layer",
       [](Params* p) { p->add_point_grids()->add_points(); p->add_point_grids()->add_points(); }, "params.point_grids"},
      {"point_grids: an empty grid", [](Params* p) { p->add_point_grids(); }, "params.point_grids[0]"},
      {"point_grids: a point at x 1.5",
       [](Params* p) { v1::PointXY* q = p->add_point_grids()->add_points(); q->set_x(1.5); q->set_y(0.5); },
       "params.point_grids[0].points[0]"},
      {"point_grids: a NaN point",
       [](Params* p) { v1::PointXY* q = p->add_point_grids()->add_points(); q->set_x(std::nan("")); },
       "params.point_grids[0].points[0]"},
      {"point_grids: 20000 points (over the limit)",
       [](Params* p) {
         v1::PointGrid* g = p->add_point_grids();
         for (int i = 0; i < 20000; ++i) g->add_points()->set_x(0.5);
       },
       "params.point_grids"},
  };
  for (const auto& [name, edit, mention] : params) {
    cases.push_back({"GenerateMasks/" + name, [edit](const Corpus& c) { return c.Generate(c.GenerateOnImage(edit)); },
                     kInvalid, mention});
  }
  cases.push_back({"GenerateMasks/empty request", [](const Corpus& c) {
                     return c.Generate(v1::GenerateMasksRequest());
                   }, kInvalid, "image_source"});
  cases.push_back({"GenerateMasks/output_format LOW_RES_LOGITS", [](const Corpus& c) {
                     v1::GenerateMasksRequest r = c.GenerateOnImage([](Params*) {});
                     r.set_output_format(v1::OUTPUT_FORMAT_LOW_RES_LOGITS);
                     return c.Generate(r);
                   }, kInvalid, "output_format"});
  cases.push_back({"GenerateMasks/output_format 99", [](const Corpus& c) {
                     v1::GenerateMasksRequest r = c.GenerateOnImage([](Params*) {});
                     r.set_output_format(static_cast<v1::OutputFormat>(99));
                     return c.Generate(r);
                   }, kInvalid, "output_format"});
  cases.push_back({"GenerateMasks/polygon_tolerance NaN", [](const Corpus& c) {
                     v1::GenerateMasksRequest r = c.GenerateOnImage([](Params*) {});
                     r.set_output_format(v1::OUTPUT_FORMAT_POLYGONS);
                     r.set_polygon_tolerance(kNaN);
                     return c.Generate(r);
                   }, kInvalid, "polygon_tolerance"});
  cases.push_back({"GenerateMasks/request_tag of 129 bytes", [](const Corpus& c) {
                     v1::GenerateMasksRequest r = c.GenerateOnImage([](Params*) {});
                     r.set_request_tag(std::string(129, 't'));
                     return c.Generate(r);
                   }, kInvalid, "request_tag"});
  cases.push_back({"GenerateMasks/malformed image_id", [](const Corpus& c) {
                     v1::GenerateMasksRequest r;
                     r.set_image_id("../../etc/passwd");
                     return c.Generate(r);
                   }, kInvalid, "image_id"});
  cases.push_back({"GenerateMasks/unknown image_id", [](const Corpus& c) {
                     v1::GenerateMasksRequest r;
                     r.set_image_id(c.other_id);
                     return c.Generate(r);
                   }, kNotFound, "is not cached"});
  cases.push_back({"GenerateMasks/crop layers on an image_id", [](const Corpus& c) {
                     return c.Generate(c.GenerateOnImage([](Params* p) { p->set_crop_n_layers(1); }));
                   }, StatusCode::FAILED_PRECONDITION, "params.crop_n_layers"});
  cases.push_back({"GenerateMasks/garbage image bytes", [](const Corpus& c) {
                     v1::GenerateMasksRequest r;
                     *r.mutable_image() = Encoded("not an image");
                     return c.Generate(r);
                   }, kInvalid, "image.encoded"});
  cases.push_back({"GenerateMasks/raw image of the wrong size", [](const Corpus& c) {
                     v1::GenerateMasksRequest r;
                     *r.mutable_image() = Raw(8, 8, 10);
                     return c.Generate(r);
                   }, kInvalid, "image.raw.rgb"});
  // The fake engine has no model-side filtering: a well-formed request gets the engine's own
  // answer through the whole pipeline (not INTERNAL, and the server keeps serving).
  cases.push_back({"GenerateMasks/well-formed on an engine that cannot generate", [](const Corpus& c) {
                     return c.Generate(c.GenerateOnImage([](Params* p) { p->set_points_per_side(4); }));
                   }, StatusCode::FAILED_PRECONDITION, "cannot generate masks"});
  return cases;
}

TEST(HardeningCorpus, EveryBadInputGetsItsStatusAndTheServerKeepsServing) {
  TestServer t(CorpusConfig());
  Corpus corpus;
  corpus.t = &t;
  v1::EmbedRequest embed;
  *embed.mutable_image() = Encoded(Png(kW, kH));
  auto e = t.client->Embed(embed);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  corpus.image_id = e->image_id();
  auto s = t.client->Segment(corpus.OnImage({PointAt(5, 5)}));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  corpus.result_id = s->results(0).result_id();
  corpus.other_id = std::string(64, '0');

  const std::vector<Case> cases = BuildCorpus();
  std::map<std::string, int> by_code;
  std::set<std::string> names;
  int good_after = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_TRUE(names.insert(c.name).second) << "two cases named " << c.name;
    const Outcome o = c.run(corpus);
    by_code[GrpcCodeName(o.code)]++;
    EXPECT_EQ(o.code, c.code) << c.name << ": got " << GrpcCodeName(o.code)
                              << " \"" << o.message << "\"";
    if (c.code != StatusCode::OK) {
      EXPECT_FALSE(o.message.empty()) << c.name;
      EXPECT_NE(o.message.find(c.mention), std::string::npos)
          << c.name << ": the message does not mention \"" << c.mention << "\": " << o.message;
    }
    EXPECT_NE(o.code, StatusCode::INTERNAL) << c.name << ": " << o.message;
    EXPECT_NE(o.code, StatusCode::UNKNOWN) << c.name << ": " << o.message;
    // The server still serves a good request right after.
    auto good = t.client->Segment(corpus.OnImage({PointAt(7, 7)}));
    EXPECT_TRUE(good.ok()) << "after " << c.name << ": " << good.status().ToString();
    good_after += good.ok();
  }
  EXPECT_GE(cases.size(), 150u);
  std::printf("bad-input corpus: %zu cases, %d good requests answered OK after them\n", cases.size(), good_after);
  std::printf("%-20s %s\n", "code", "cases");
  for (const auto& [code, n] : by_code) std::printf("%-20s %d\n", code.c_str(), n);
}

}  // namespace
}  // namespace maskd::server
