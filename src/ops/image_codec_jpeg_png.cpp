// JPEG through libjpeg-turbo and PNG through libpng, decoded as Pillow decodes them.
//
// JPEG: libjpeg's defaults, which Pillow keeps (its draft mode aside): the accurate integer
// IDCT (JDCT_ISLOW) and "fancy" chroma upsampling, the method the ONNX ImageDecoder doc
// describes. One component gives gray, three RGB (libjpeg's YCbCr -> RGB), four CMYK, which
// Pillow always reads with Adobe's inverted polarity ("CMYK;I") and converts to RGB as
// R = (255 - K) - (C * (255 - K) / 255, rounded) (libImaging/Convert.c cmyk2rgb). libjpeg's
// warnings about corrupt data are ignored, as Pillow ignores them; a file that ends before its
// image does is an error (Pillow: "image file is truncated").
// PNG: palettes are expanded, 1/2/4-bit gray scaled to 8 bits, 16-bit samples keep their high
// byte (Pillow's "RGB;16B"), alpha and tRNS transparency are dropped; trailing chunks after
// the image data are not read (Pillow stops at a missing IEND too).
// libjpeg's default error handler calls exit() and libpng's aborts without a jump buffer: both
// are replaced by handlers that record the message and longjmp back to the decoding function.
// No C++ object with a destructor lives in those functions' frames or in the handlers
// (longjmp would skip it); what must be freed is freed by guards in the callers.
#include <csetjmp>
#include <cstdio>  // before jpeglib.h, which uses FILE and size_t
#include <cstring>
#include <string>

#include <jerror.h>
#include <jpeglib.h>
#include <png.h>

#include "ops/image_codecs.h"

namespace onnxtrain::ops::image {

namespace {

// --- JPEG ---

struct JpegErrors {
  jpeg_error_mgr pub;  // first member: libjpeg holds a jpeg_error_mgr*
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jpeg_error_exit(j_common_ptr cinfo) {
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  cinfo->err->format_message(cinfo, errors->message);
  std::longjmp(errors->jump, 1);
}

// Warnings (level -1) pass silently, but for the end of the data inside the image.
void jpeg_emit_message(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) jpeg_error_exit(cinfo);
}

// round(a * b / 255) for a, b in [0, 255] (never a tie: 255 is odd).
inline int mul_div_255(int a, int b) { return (a * b + 127) / 255; }

// A row of Adobe-inverted CMYK to RGB, as Pillow's "CMYK;I" unpacker and cmyk2rgb do.
void inverted_cmyk_to_rgb(const uint8_t* cmyk, uint8_t* rgb, int64_t width) {
  for (int64_t x = 0; x < width; ++x, cmyk += 4, rgb += 3) {
    const int not_k = cmyk[3];  // 255 - K, K = 255 - stored
    for (int c = 0; c < 3; ++c) rgb[c] = static_cast<uint8_t>(not_k - mul_div_255(255 - cmyk[c], not_k));
  }
}

// Decodes into `out`; false when libjpeg fails (errors.message says why). `row` is scratch.
bool read_jpeg(jpeg_decompress_struct& cinfo, JpegErrors& errors, std::span<const uint8_t> data, Image8& out,
               std::vector<uint8_t>& row) {
  if (setjmp(errors.jump) != 0) return false;
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data.data(), static_cast<unsigned long>(data.size()));
  jpeg_read_header(&cinfo, TRUE);
  // Before libjpeg sizes its buffers (a progressive file's are whole-image coefficient arrays).
  if (int64_t{cinfo.image_width} * cinfo.image_height > kMaxPixels) {
    throw ImageDecodeError("JPEG: " + std::to_string(cinfo.image_width) + "x" + std::to_string(cinfo.image_height) +
                           " pixels exceed the limit of " + std::to_string(kMaxPixels));
  }
  switch (cinfo.num_components) {
    case 1: cinfo.out_color_space = JCS_GRAYSCALE; break;
    case 3: cinfo.out_color_space = JCS_RGB; break;
    case 4: cinfo.out_color_space = JCS_CMYK; break;
    default:
      throw ImageDecodeError("JPEG: " + std::to_string(cinfo.num_components) + " components are not supported");
  }
  jpeg_start_decompress(&cinfo);
  const bool cmyk = cinfo.num_components == 4;
  allocate(out, cinfo.output_height, cinfo.output_width, cmyk ? 3 : cinfo.num_components);
  const size_t stride = static_cast<size_t>(out.width) * static_cast<size_t>(out.channels);
  if (cmyk) row.resize(static_cast<size_t>(out.width) * 4);
  while (cinfo.output_scanline < cinfo.output_height) {
    uint8_t* dst = out.pixels.data() + stride * cinfo.output_scanline;
    JSAMPROW target = cmyk ? row.data() : dst;
    jpeg_read_scanlines(&cinfo, &target, 1);
    if (cmyk) inverted_cmyk_to_rgb(row.data(), dst, out.width);
  }
  jpeg_finish_decompress(&cinfo);
  return true;
}

// --- PNG ---

struct PngSource {
  std::span<const uint8_t> data;
  size_t offset = 0;
  char message[256] = {};
};

void png_read_memory(png_structp png, png_bytep out, size_t length) {
  auto* source = static_cast<PngSource*>(png_get_io_ptr(png));
  if (length > source->data.size() - source->offset) png_error(png, "the file ends inside the image");
  std::memcpy(out, source->data.data() + source->offset, length);
  source->offset += length;
}

[[noreturn]] void png_on_error(png_structp png, png_const_charp message) {
  auto* source = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(source->message, sizeof source->message, "%s", message);
  png_longjmp(png, 1);
}

void png_on_warning(png_structp, png_const_charp) {}

// Decodes into `out`; false when libpng fails (source.message says why). `rows` is scratch.
bool read_png(png_structp png, png_infop info, Image8& out, std::vector<png_bytep>& rows) {
  if (setjmp(png_jmpbuf(png)) != 0) return false;
  png_read_info(png, info);
  const int bit_depth = png_get_bit_depth(png, info);
  const int color_type = png_get_color_type(png, info);
  if (bit_depth == 16) png_set_strip_16(png);
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  png_set_strip_alpha(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const int channels = png_get_channels(png, info);
  if (png_get_bit_depth(png, info) != 8 || (channels != 1 && channels != 3)) {
    throw ImageDecodeError("PNG: unexpected layout after conversion to 8-bit gray or RGB");
  }
  allocate(out, png_get_image_height(png, info), png_get_image_width(png, info), channels);
  rows.resize(static_cast<size_t>(out.height));
  const size_t stride = static_cast<size_t>(out.width) * static_cast<size_t>(channels);
  for (size_t y = 0; y < rows.size(); ++y) rows[y] = out.pixels.data() + y * stride;
  png_read_image(png, rows.data());
  return true;
}

}  // namespace

Image8 decode_jpeg(std::span<const uint8_t> data) {
  jpeg_decompress_struct cinfo{};
  JpegErrors errors{};
  cinfo.err = jpeg_std_error(&errors.pub);
  errors.pub.error_exit = jpeg_error_exit;
  errors.pub.emit_message = jpeg_emit_message;
  struct Guard {
    jpeg_decompress_struct* cinfo;
    ~Guard() { jpeg_destroy_decompress(cinfo); }  // frees nothing when creation failed (mem is null)
  } guard{&cinfo};
  Image8 out;
  std::vector<uint8_t> row;
  if (!read_jpeg(cinfo, errors, data, out, row)) throw ImageDecodeError(std::string("JPEG: ") + errors.message);
  return out;
}

Image8 decode_png(std::span<const uint8_t> data) {
  PngSource source{data};
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &source, png_on_error, png_on_warning);
  if (png == nullptr) throw ImageDecodeError("PNG: libpng could not start");
  png_infop info = png_create_info_struct(png);
  struct Guard {
    png_structp png;
    png_infop info;
    ~Guard() { png_destroy_read_struct(&png, info ? &info : nullptr, nullptr); }
  } guard{png, info};
  if (info == nullptr) throw ImageDecodeError("PNG: libpng could not start");
  png_set_read_fn(png, &source, png_read_memory);
  Image8 out;
  std::vector<png_bytep> rows;
  if (!read_png(png, info, out, rows)) throw ImageDecodeError(std::string("PNG: ") + source.message);
  return out;
}

}  // namespace onnxtrain::ops::image
