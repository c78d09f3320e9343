#include "model/io/image_codec.h"

#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <jpeglib.h>
#include <jerror.h>
#include <png.h>

#if MASKD_WITH_WEBP
#include <webp/decode.h>
#endif
#if MASKD_WITH_EXIF
#include <libexif/exif-data.h>
#endif

namespace maskd {
namespace {

constexpr uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
constexpr int kExifOrientationTag = 0x0112;

std::string Prefix(std::string_view field) { return std::string(field) + ": "; }

// Checks a decoded size before any pixel memory is allocated.
Status CheckSize(uint64_t width, uint64_t height, const ImageLimits& limits, std::string_view field,
                 const char* format) {
  if (width == 0 || height == 0) {
    return InvalidArgument(Prefix(field) + format + " image has size " + std::to_string(width) +
                           " x " + std::to_string(height) + " (expected at least 1 x 1)");
  }
  if (width > static_cast<uint64_t>(limits.max_side) ||
      height > static_cast<uint64_t>(limits.max_side)) {
    return InvalidArgument(Prefix(field) + format + " image is " + std::to_string(width) + " x " +
                           std::to_string(height) + " pixels (expected each side at most " +
                           std::to_string(limits.max_side) + ")");
  }
  if (width * height > limits.max_pixels) {
    return InvalidArgument(Prefix(field) + format + " image is " + std::to_string(width) + " x " +
                           std::to_string(height) + " = " + std::to_string(width * height) +
                           " pixels (expected at most " + std::to_string(limits.max_pixels) + ")");
  }
  return Status::Ok();
}

// ---- JPEG -------------------------------------------------------------------------------------

// libjpeg reports fatal errors through error_exit, which must not return: we longjmp back to the
// decode function (the documented pattern). Truncated or corrupt entropy data is only a warning in
// libjpeg (it pads the image with grey), so those warnings are promoted to errors: a half-grey
// image would give silently wrong masks.
struct JpegError {
  jpeg_error_mgr mgr;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void JpegErrorExit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void JpegEmitMessage(j_common_ptr cinfo, int msg_level) {
  if (msg_level != -1) return;  // trace messages
  switch (cinfo->err->msg_code) {
    // About metadata or stray bytes between segments: the pixels are intact (Pillow tolerates
    // these too).
    case JWRN_EXTRANEOUS_DATA:
    case JWRN_ADOBE_XFORM:
    case JWRN_JFIF_MAJOR:
    case JWRN_BOGUS_ICC:
      return;
    // Premature end of file or of a data segment (a file cut short, or cut and closed with EOI),
    // bad Huffman/arithmetic codes, broken progression: pixels are missing.
    default:
      JpegErrorExit(cinfo);
  }
}

// Huffman-coded scans spend at least one bit on every 8x8 block of each component they cover, and
// a decodable file has a scan for every component, so a file smaller than that for its declared
// size is truncated or lies about the size; refused before libjpeg allocates for the declared size.
// Arithmetic coding has no such floor; there the decode stops at the first missing byte instead.
Status CheckJpegPlausibleSize(const jpeg_decompress_struct& cinfo, size_t file_bytes,
                              std::string_view field) {
  if (cinfo.arith_code) return Status::Ok();
  uint64_t fewest_blocks = 0;
  for (int c = 0; c < cinfo.num_components; ++c) {
    const uint64_t blocks = uint64_t{cinfo.comp_info[c].width_in_blocks} *
                            cinfo.comp_info[c].height_in_blocks;
    if (c == 0 || blocks < fewest_blocks) fewest_blocks = blocks;
  }
  const uint64_t min_bytes = fewest_blocks / 8;
  if (file_bytes >= min_bytes) return Status::Ok();
  return InvalidArgument(Prefix(field) + "JPEG image declares " +
                         std::to_string(cinfo.image_width) + " x " +
                         std::to_string(cinfo.image_height) + " pixels in " +
                         std::to_string(file_bytes) + " bytes (expected at least " +
                         std::to_string(min_bytes) +
                         " bytes, one bit per 8x8 block: the file is truncated or its size is "
                         "false)");
}

struct JpegDestination {
  unsigned char* buffer = nullptr;
  unsigned long size = 0;  // NOLINT: libjpeg's type
  ~JpegDestination() { std::free(buffer); }
};

#if MASKD_WITH_EXIF
int ReadExifOrientation(const jpeg_decompress_struct& cinfo) {
  for (jpeg_saved_marker_ptr m = cinfo.marker_list; m != nullptr; m = m->next) {
    if (m->marker != JPEG_APP0 + 1 || m->data_length < 6) continue;
    if (std::memcmp(m->data, "Exif\0\0", 6) != 0) continue;
    ExifData* ed = exif_data_new_from_data(m->data, m->data_length);
    if (ed == nullptr) return 1;
    int orientation = 1;
    ExifEntry* entry = exif_data_get_entry(ed, static_cast<ExifTag>(kExifOrientationTag));
    if (entry != nullptr && entry->format == EXIF_FORMAT_SHORT && entry->components >= 1) {
      orientation = exif_get_short(entry->data, exif_data_get_byte_order(ed));
    }
    exif_data_unref(ed);
    return (orientation >= 1 && orientation <= 8) ? orientation : 1;
  }
  return 1;
}
#endif

// The libjpeg calls, in a frame whose only locals are trivially destructible: a longjmp out of
// libjpeg lands here, and C++ forbids skipping destructors that way. Results go through `st`.
struct JpegDecodeState {
  ImageRGB8 out;
  std::vector<uint8_t> row;
  Status status;
  int orientation = 1;
};

bool RunJpegDecode(jpeg_decompress_struct* cinfo, JpegError* jerr, std::string_view bytes,
                   const ImageLimits& limits, std::string_view field, JpegDecodeState* st) {
  if (setjmp(jerr->jump)) return false;
  jpeg_mem_src(cinfo, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));  // NOLINT: libjpeg's type
#if MASKD_WITH_EXIF
  jpeg_save_markers(cinfo, JPEG_APP0 + 1, 0xffff);
#endif
  jpeg_read_header(cinfo, TRUE);
  st->status = CheckSize(cinfo->image_width, cinfo->image_height, limits, field, "JPEG");
  if (!st->status.ok()) return true;
  st->status = CheckJpegPlausibleSize(*cinfo, bytes.size(), field);
  if (!st->status.ok()) return true;
  const bool cmyk = cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK;
  cinfo->out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  jpeg_start_decompress(cinfo);
  const int w = static_cast<int>(cinfo->output_width);
  const int h = static_cast<int>(cinfo->output_height);
  st->row.resize(static_cast<size_t>(w) * cinfo->output_components);
  st->out.width = w;
  st->out.height = h;
  // Reserved (address space only) and grown row by row: a file that ends early costs the memory
  // of the rows it really has, not of the size it declares.
  st->out.pixels.reserve(static_cast<size_t>(w) * h * 3);
  while (cinfo->output_scanline < cinfo->output_height) {
    const size_t y = cinfo->output_scanline;
    st->out.pixels.resize((y + 1) * w * 3);
    uint8_t* dst = st->out.pixels.data() + y * w * 3;
    JSAMPROW rows[1] = {cmyk ? st->row.data() : dst};
    jpeg_read_scanlines(cinfo, rows, 1);
    if (cmyk) {
      // Adobe writes inverted CMYK (the common case for CMYK JPEGs): R = C * K / 255 etc.
      for (int x = 0; x < w; ++x) {
        const int k = st->row[x * 4 + 3];
        for (int c = 0; c < 3; ++c) dst[x * 3 + c] = static_cast<uint8_t>(st->row[x * 4 + c] * k / 255);
      }
    }
  }
#if MASKD_WITH_EXIF
  st->orientation = ReadExifOrientation(*cinfo);
#endif
  jpeg_finish_decompress(cinfo);
  return true;
}

// jpeg_read_header alone, in its own setjmp frame (see RunJpegDecode).
bool RunJpegHeader(jpeg_decompress_struct* cinfo, JpegError* jerr, std::string_view bytes) {
  if (setjmp(jerr->jump)) return false;
  jpeg_mem_src(cinfo, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));  // NOLINT: libjpeg's type
  jpeg_read_header(cinfo, TRUE);
  return true;
}

StatusOr<DeclaredSize> ReadJpegSize(std::string_view bytes, std::string_view field) {
  jpeg_decompress_struct cinfo;
  JpegError jerr;
  cinfo.err = jpeg_std_error(&jerr.mgr);
  jerr.mgr.error_exit = JpegErrorExit;
  jerr.mgr.emit_message = JpegEmitMessage;
  jerr.message[0] = '\0';
  jpeg_create_decompress(&cinfo);
  const bool read = RunJpegHeader(&cinfo, &jerr, bytes);
  DeclaredSize size{cinfo.image_width, cinfo.image_height};
  jpeg_destroy_decompress(&cinfo);
  if (!read) return InvalidArgument(Prefix(field) + "corrupt or truncated JPEG header (" + jerr.message + ")");
  return size;
}

StatusOr<ImageRGB8> DecodeJpeg(std::string_view bytes, const ImageLimits& limits,
                               std::string_view field) {
  static_assert(sizeof(JSAMPLE) == 1, "8-bit libjpeg expected");
  jpeg_decompress_struct cinfo;
  JpegError jerr;
  cinfo.err = jpeg_std_error(&jerr.mgr);
  jerr.mgr.error_exit = JpegErrorExit;
  jerr.mgr.emit_message = JpegEmitMessage;
  jerr.message[0] = '\0';
  jpeg_create_decompress(&cinfo);
  JpegDecodeState st;
  const bool decoded = RunJpegDecode(&cinfo, &jerr, bytes, limits, field, &st);
  jpeg_destroy_decompress(&cinfo);
  if (!decoded) {
    return InvalidArgument(Prefix(field) + "corrupt or truncated JPEG (" + jerr.message + ")");
  }
  if (!st.status.ok()) return st.status;
  if (st.orientation != 1) return ApplyExifOrientation(st.out, st.orientation);
  return std::move(st.out);
}

// ---- PNG --------------------------------------------------------------------------------------

struct PngReader {
  std::string_view bytes;
  size_t offset = 0;
  char message[256] = {0};
};

void PngRead(png_structp png, png_bytep data, png_size_t length) {
  auto* r = static_cast<PngReader*>(png_get_io_ptr(png));
  if (r->bytes.size() - r->offset < length) {
    png_error(png, "unexpected end of data (the file is truncated)");
  }
  std::memcpy(data, r->bytes.data() + r->offset, length);
  r->offset += length;
}

void PngErrorFn(png_structp png, png_const_charp msg) {
  auto* r = static_cast<PngReader*>(png_get_error_ptr(png));
  std::snprintf(r->message, sizeof(r->message), "%s", msg);
  png_longjmp(png, 1);
}

void PngWarningFn(png_structp, png_const_charp) {}

// As for JPEG: libpng longjmps on errors, so its calls run in a frame with trivial locals only.
template <typename Out>
struct PngDecodeState {
  Out out;
  std::vector<png_bytep> rows;
  Status status;
  uint64_t bytes = 0;  // the file's size
};

template <typename Out>
bool RunPngDecode(png_structp png, png_infop info, const ImageLimits& limits, std::string_view field,
                  bool gray, PngDecodeState<Out>* st) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_info(png, info);
  const png_uint_32 w = png_get_image_width(png, info);
  const png_uint_32 h = png_get_image_height(png, info);
  st->status = CheckSize(w, h, limits, field, "PNG");
  if (!st->status.ok()) return true;
  {
    // Deflate cannot compress better than 1032:1, so fewer bytes than that for the declared rows
    // mean a truncated file or a false size: refused before the pixel buffer is allocated.
    const uint64_t bits_per_pixel =
        uint64_t{png_get_channels(png, info)} * png_get_bit_depth(png, info);
    const uint64_t raw = uint64_t{h} * (1 + (uint64_t{w} * bits_per_pixel + 7) / 8);
    const uint64_t min_bytes = raw / 1032;
    if (st->bytes < min_bytes) {
      st->status = InvalidArgument(Prefix(field) + "PNG image declares " + std::to_string(w) + " x " +
                                   std::to_string(h) + " pixels in " + std::to_string(st->bytes) +
                                   " bytes (expected at least " + std::to_string(min_bytes) +
                                   " bytes at deflate's best ratio: the file is truncated or its "
                                   "size is false)");
      return true;
    }
  }
  const int color_type = png_get_color_type(png, info);
  png_set_expand(png);  // palette -> RGB, grey < 8 bits -> 8 bits, tRNS -> alpha
  png_set_strip_16(png);
  png_set_strip_alpha(png);
  if (gray) {
    if (color_type & PNG_COLOR_MASK_COLOR) png_set_rgb_to_gray_fixed(png, 1, -1, -1);
  } else {
    png_set_gray_to_rgb(png);
  }
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const size_t channels = gray ? 1 : 3;
  if (png_get_rowbytes(png, info) != w * channels) {
    st->status = Internal(Prefix(field) + "libpng produced " +
                          std::to_string(png_get_rowbytes(png, info)) + " bytes per row (expected " +
                          std::to_string(w * channels) + ")");
    return true;
  }
  st->out.width = static_cast<int>(w);
  st->out.height = static_cast<int>(h);
  st->out.pixels.resize(static_cast<size_t>(w) * h * channels);
  st->rows.resize(h);
  for (png_uint_32 y = 0; y < h; ++y) st->rows[y] = st->out.pixels.data() + y * w * channels;
  png_read_image(png, st->rows.data());
  png_read_end(png, nullptr);
  return true;
}

// A PNG's declared size from its IHDR chunk, which the PNG specification requires first: after the
// signature, length, "IHDR", then width and height as 4-byte big-endian numbers.
StatusOr<DeclaredSize> ReadPngIhdr(std::string_view bytes, std::string_view field) {
  if (bytes.size() < 24 || bytes.substr(12, 4) != "IHDR") {
    return InvalidArgument(Prefix(field) + "corrupt or truncated PNG (no IHDR chunk first)");
  }
  auto be32 = [&](size_t at) {
    uint64_t v = 0;
    for (size_t i = 0; i < 4; ++i) v = (v << 8) | static_cast<uint8_t>(bytes[at + i]);
    return v;
  };
  return DeclaredSize{be32(16), be32(20)};
}

// Decodes to 8-bit RGB (gray = false) or 8-bit grey (gray = true).
template <typename Out>
StatusOr<Out> DecodePngImpl(std::string_view bytes, const ImageLimits& limits, std::string_view field,
                            bool gray) {
  // libpng discards an ancillary chunk with a bad CRC before IHDR, and ReadDeclaredSize (the byte
  // budget's size, read before decoding) refused what then decoded (found by fuzz_image_decode).
  // One rule for both: such a file is refused here too.
  if (StatusOr<DeclaredSize> ihdr = ReadPngIhdr(bytes, field); !ihdr.ok()) return ihdr.status();
  PngReader reader{bytes};
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &reader, PngErrorFn, PngWarningFn);
  if (png == nullptr) return Internal(Prefix(field) + "libpng could not allocate a reader");
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    return Internal(Prefix(field) + "libpng could not allocate an info struct");
  }
  png_set_read_fn(png, &reader, PngRead);
  PngDecodeState<Out> st;
  st.bytes = bytes.size();
  const bool decoded = RunPngDecode(png, info, limits, field, gray, &st);
  png_destroy_read_struct(&png, &info, nullptr);
  if (!decoded) {
    return InvalidArgument(Prefix(field) + "corrupt or truncated PNG (" + reader.message + ")");
  }
  if (!st.status.ok()) return st.status;
  return std::move(st.out);
}

struct PngWriter {
  std::string out;
  char message[256] = {0};
};

void PngWrite(png_structp png, png_bytep data, png_size_t length) {
  auto* w = static_cast<PngWriter*>(png_get_io_ptr(png));
  w->out.append(reinterpret_cast<const char*>(data), length);
}

void PngFlush(png_structp) {}

void PngWriteErrorFn(png_structp png, png_const_charp msg) {
  auto* w = static_cast<PngWriter*>(png_get_error_ptr(png));
  std::snprintf(w->message, sizeof(w->message), "%s", msg);
  png_longjmp(png, 1);
}

// Writes rows of already packed pixels.
StatusOr<std::string> EncodePng(const std::vector<const uint8_t*>& rows, int width, int height,
                                int bit_depth, int color_type, const PngOptions& options) {
  if (width <= 0 || height <= 0) {
    return InvalidArgument("PNG size " + std::to_string(width) + " x " + std::to_string(height) +
                           " (expected at least 1 x 1)");
  }
  if (options.compression_level < 0 || options.compression_level > 9) {
    return InvalidArgument("PNG compression_level = " + std::to_string(options.compression_level) +
                           " (expected 0 .. 9)");
  }
  PngWriter writer;
  png_structp png =
      png_create_write_struct(PNG_LIBPNG_VER_STRING, &writer, PngWriteErrorFn, PngWarningFn);
  if (png == nullptr) return Internal("libpng could not allocate a writer");
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_write_struct(&png, nullptr);
    return Internal("libpng could not allocate an info struct");
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    return Internal(std::string("libpng could not encode the image: ") + writer.message);
  }
  png_set_write_fn(png, &writer, PngWrite, PngFlush);
  png_set_compression_level(png, options.compression_level);
  png_set_IHDR(png, info, static_cast<png_uint_32>(width), static_cast<png_uint_32>(height),
               bit_depth, color_type, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (const uint8_t* row : rows) png_write_row(png, row);
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return std::move(writer.out);
}

}  // namespace

const char* ImageFormatName(ImageFormat f) {
  switch (f) {
    case ImageFormat::kJpeg: return "jpeg";
    case ImageFormat::kPng: return "png";
    case ImageFormat::kWebp: return "webp";
    case ImageFormat::kUnknown: break;
  }
  return "unknown";
}

ImageFormat DetectImageFormat(std::string_view b) {
  auto u = [&](size_t i) { return static_cast<uint8_t>(b[i]); };
  if (b.size() >= 3 && u(0) == 0xff && u(1) == 0xd8 && u(2) == 0xff) return ImageFormat::kJpeg;
  if (b.size() >= 8 && std::memcmp(b.data(), kPngSignature, 8) == 0) return ImageFormat::kPng;
  if (b.size() >= 12 && b.substr(0, 4) == "RIFF" && b.substr(8, 4) == "WEBP") {
    return ImageFormat::kWebp;
  }
  return ImageFormat::kUnknown;
}

bool WebpSupported() {
#if MASKD_WITH_WEBP
  return true;
#else
  return false;
#endif
}

bool ExifSupported() {
#if MASKD_WITH_EXIF
  return true;
#else
  return false;
#endif
}

StatusOr<ImageRGB8> DecodeImage(std::string_view bytes, const ImageLimits& limits,
                                std::string_view field) {
  if (bytes.empty()) return InvalidArgument(Prefix(field) + "is empty (expected JPEG, PNG or WebP bytes)");
  if (bytes.size() > limits.max_bytes) {
    return InvalidArgument(Prefix(field) + "is " + std::to_string(bytes.size()) +
                           " bytes (expected at most " + std::to_string(limits.max_bytes) + ")");
  }
  switch (DetectImageFormat(bytes)) {
    case ImageFormat::kJpeg: return DecodeJpeg(bytes, limits, field);
    case ImageFormat::kPng: return DecodePngImpl<ImageRGB8>(bytes, limits, field, /*gray=*/false);
    case ImageFormat::kWebp: {
#if MASKD_WITH_WEBP
      int w = 0, h = 0;
      if (!WebPGetInfo(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &w, &h)) {
        return InvalidArgument(Prefix(field) + "corrupt or truncated WebP (no valid header)");
      }
      MASKD_RETURN_IF_ERROR(CheckSize(w, h, limits, field, "WebP"));
      ImageRGB8 out;
      out.width = w;
      out.height = h;
      out.pixels.resize(static_cast<size_t>(w) * h * 3);
      if (WebPDecodeRGBInto(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                            out.pixels.data(), out.pixels.size(), w * 3) == nullptr) {
        return InvalidArgument(Prefix(field) + "corrupt or truncated WebP (the bitstream did not decode)");
      }
      return out;
#else
      return InvalidArgument(Prefix(field) +
                             "is WebP, which this build of maskd cannot decode (built without "
                             "libwebp; expected JPEG or PNG)");
#endif
    }
    case ImageFormat::kUnknown: break;
  }
  std::string head;
  static const char kHex[] = "0123456789abcdef";
  for (size_t i = 0; i < bytes.size() && i < 8; ++i) {
    const auto c = static_cast<uint8_t>(bytes[i]);
    head += kHex[c >> 4];
    head += kHex[c & 15];
    head += ' ';
  }
  if (!head.empty()) head.pop_back();
  return InvalidArgument(Prefix(field) + "unknown image format (first bytes " + head +
                         "; expected JPEG, PNG" + (WebpSupported() ? " or WebP" : "") + ")");
}

StatusOr<DeclaredSize> ReadDeclaredSize(std::string_view bytes, std::string_view field) {
  switch (DetectImageFormat(bytes)) {
    case ImageFormat::kJpeg: return ReadJpegSize(bytes, field);
    case ImageFormat::kPng: return ReadPngIhdr(bytes, field);
    case ImageFormat::kWebp: {
#if MASKD_WITH_WEBP
      int w = 0, h = 0;
      if (!WebPGetInfo(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &w, &h)) {
        return InvalidArgument(Prefix(field) + "corrupt or truncated WebP (no valid header)");
      }
      return DeclaredSize{static_cast<uint64_t>(w), static_cast<uint64_t>(h)};
#else
      break;
#endif
    }
    case ImageFormat::kUnknown: break;
  }
  return InvalidArgument(Prefix(field) + "not a JPEG, PNG" + (WebpSupported() ? " or WebP" : "") +
                         " file (no size to read)");
}

StatusOr<ImageRGB8> ImageFromRaw(int64_t width, int64_t height, std::string_view rgb,
                                 const ImageLimits& limits, std::string_view field) {
  const std::string f(field);
  if (width < 1 || width > limits.max_side) {
    return InvalidArgument(f + ".width = " + std::to_string(width) + " (expected 1 .. " +
                           std::to_string(limits.max_side) + ")");
  }
  if (height < 1 || height > limits.max_side) {
    return InvalidArgument(f + ".height = " + std::to_string(height) + " (expected 1 .. " +
                           std::to_string(limits.max_side) + ")");
  }
  const uint64_t pixels = static_cast<uint64_t>(width) * static_cast<uint64_t>(height);
  if (pixels > limits.max_pixels) {
    return InvalidArgument(f + " is " + std::to_string(width) + " x " + std::to_string(height) +
                           " = " + std::to_string(pixels) + " pixels (expected at most " +
                           std::to_string(limits.max_pixels) + ")");
  }
  if (rgb.size() != pixels * 3) {
    return InvalidArgument(f + ".rgb has " + std::to_string(rgb.size()) +
                           " bytes (expected width * height * 3 = " + std::to_string(pixels * 3) +
                           ")");
  }
  ImageRGB8 out;
  out.width = static_cast<int>(width);
  out.height = static_cast<int>(height);
  out.pixels.assign(reinterpret_cast<const uint8_t*>(rgb.data()),
                    reinterpret_cast<const uint8_t*>(rgb.data()) + rgb.size());
  return out;
}

StatusOr<ImageGray8> DecodePngGray(std::string_view bytes, std::string_view field) {
  if (DetectImageFormat(bytes) != ImageFormat::kPng) {
    return InvalidArgument(Prefix(field) + "is not a PNG (no PNG signature)");
  }
  ImageLimits limits;
  limits.max_bytes = UINT64_MAX;
  return DecodePngImpl<ImageGray8>(bytes, limits, field, /*gray=*/true);
}

StatusOr<std::string> EncodePngMask(const uint8_t* mask, int width, int height,
                                    const PngOptions& options) {
  if (width <= 0 || height <= 0) return EncodePng({}, width, height, 1, PNG_COLOR_TYPE_GRAY, options);
  const size_t row_bytes = (static_cast<size_t>(width) + 7) / 8;
  std::vector<uint8_t> packed(row_bytes * height, 0);
  std::vector<const uint8_t*> rows(height);
  for (int y = 0; y < height; ++y) {
    uint8_t* dst = packed.data() + y * row_bytes;
    const uint8_t* src = mask + static_cast<size_t>(y) * width;
    for (int x = 0; x < width; ++x) {
      if (src[x]) dst[x >> 3] |= static_cast<uint8_t>(0x80u >> (x & 7));
    }
    rows[y] = dst;
  }
  return EncodePng(rows, width, height, 1, PNG_COLOR_TYPE_GRAY, options);
}

StatusOr<std::string> EncodePngGray(const ImageGray8& image, const PngOptions& options) {
  if (image.pixels.size() != static_cast<size_t>(image.width) * image.height) {
    return InvalidArgument("grey image has " + std::to_string(image.pixels.size()) +
                           " bytes (expected width * height = " +
                           std::to_string(static_cast<size_t>(image.width) * image.height) + ")");
  }
  std::vector<const uint8_t*> rows(image.height > 0 ? image.height : 0);
  for (int y = 0; y < image.height; ++y) rows[y] = image.pixels.data() + static_cast<size_t>(y) * image.width;
  return EncodePng(rows, image.width, image.height, 8, PNG_COLOR_TYPE_GRAY, options);
}

StatusOr<std::string> EncodePngRgb(const ImageRGB8& image, const PngOptions& options) {
  if (image.pixels.size() != static_cast<size_t>(image.width) * image.height * 3) {
    return InvalidArgument("RGB image has " + std::to_string(image.pixels.size()) +
                           " bytes (expected width * height * 3 = " +
                           std::to_string(static_cast<size_t>(image.width) * image.height * 3) + ")");
  }
  std::vector<const uint8_t*> rows(image.height > 0 ? image.height : 0);
  for (int y = 0; y < image.height; ++y) {
    rows[y] = image.pixels.data() + static_cast<size_t>(y) * image.width * 3;
  }
  return EncodePng(rows, image.width, image.height, 8, PNG_COLOR_TYPE_RGB, options);
}

StatusOr<std::string> EncodeJpeg(const ImageRGB8& image, int quality) {
  if (quality < 1 || quality > 100) {
    return InvalidArgument("JPEG quality = " + std::to_string(quality) + " (expected 1 .. 100)");
  }
  if (image.width <= 0 || image.height <= 0 ||
      image.pixels.size() != static_cast<size_t>(image.width) * image.height * 3) {
    return InvalidArgument("RGB image is " + std::to_string(image.width) + " x " +
                           std::to_string(image.height) + " with " +
                           std::to_string(image.pixels.size()) +
                           " bytes (expected at least 1 x 1 and width * height * 3 bytes)");
  }
  jpeg_compress_struct cinfo;
  JpegError jerr;
  cinfo.err = jpeg_std_error(&jerr.mgr);
  jerr.mgr.error_exit = JpegErrorExit;
  jerr.message[0] = '\0';
  JpegDestination dest;
  if (setjmp(jerr.jump)) {
    jpeg_destroy_compress(&cinfo);
    return Internal(std::string("libjpeg could not encode the image: ") + jerr.message);
  }
  jpeg_create_compress(&cinfo);
  jpeg_mem_dest(&cinfo, &dest.buffer, &dest.size);
  cinfo.image_width = static_cast<JDIMENSION>(image.width);
  cinfo.image_height = static_cast<JDIMENSION>(image.height);
  cinfo.input_components = 3;
  cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row[1] = {const_cast<JSAMPLE*>(image.pixels.data() +
                                            static_cast<size_t>(cinfo.next_scanline) * image.width * 3)};
    jpeg_write_scanlines(&cinfo, row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  return std::string(reinterpret_cast<const char*>(dest.buffer), dest.size);
}

ImageRGB8 ApplyExifOrientation(const ImageRGB8& in, int orientation) {
  if (orientation < 2 || orientation > 8) return in;
  const int W = in.width, H = in.height;
  const bool swap = orientation >= 5;
  ImageRGB8 out;
  out.width = swap ? H : W;
  out.height = swap ? W : H;
  out.pixels.resize(in.pixels.size());
  for (int y = 0; y < out.height; ++y) {
    for (int x = 0; x < out.width; ++x) {
      int sx = x, sy = y;
      switch (orientation) {
        case 2: sx = W - 1 - x; sy = y; break;              // mirror horizontally
        case 3: sx = W - 1 - x; sy = H - 1 - y; break;      // rotate 180
        case 4: sx = x; sy = H - 1 - y; break;              // mirror vertically
        case 5: sx = y; sy = x; break;                      // transpose
        case 6: sx = y; sy = H - 1 - x; break;              // rotate 90 clockwise
        case 7: sx = W - 1 - y; sy = H - 1 - x; break;      // transverse
        case 8: sx = W - 1 - y; sy = x; break;              // rotate 90 counter-clockwise
      }
      const uint8_t* s = in.pixels.data() + (static_cast<size_t>(sy) * W + sx) * 3;
      uint8_t* d = out.pixels.data() + (static_cast<size_t>(y) * out.width + x) * 3;
      d[0] = s[0];
      d[1] = s[1];
      d[2] = s[2];
    }
  }
  return out;
}

}  // namespace maskd
