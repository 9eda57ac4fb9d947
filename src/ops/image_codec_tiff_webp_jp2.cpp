// TIFF through libtiff, WebP through libwebp's animation decoder, JPEG 2000 through OpenJPEG.
//
// TIFF: the first directory (page), read through libtiff's RGBA interface
// (TIFFReadRGBAImageOriented, top-left origin), which handles every photometric
// interpretation, bit depth and compression libtiff knows; gray files (MinIsBlack/MinIsWhite)
// stay gray; colour under an unassociated alpha is kept as stored, not multiplied by alpha
// (Pillow's "RGBA" then convert("RGB")). Errors go to per-file handlers (TIFFOpenOptions, libtiff 4.5), never to stderr.
// WebP: WebPAnimDecoder with its default options (RGBA, not premultiplied), the first frame,
// as Pillow reads WebP; alpha is dropped.
// JPEG 2000: JP2 files and raw codestreams (J2K). 1-2 components give gray, 3-4 RGB (the
// second and fourth being alpha, dropped); components are brought to 8 bits as Pillow's
// Jpeg2KDecode.c does (signed samples offset by 2^(prec-1); deeper ones shifted right with
// rounding, shallower ones shifted left), clamped to [0, 255]. Subsampled components are
// sampled at the nearest lower position. sYCC/e-YCC and CMYK colour spaces are refused.
#include <openjpeg.h>
#include <tiffio.h>
#include <webp/decode.h>
#include <webp/demux.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>

#include "ops/image_codecs.h"

namespace onnxtrain::ops::image {

namespace {

// A read-only file in memory for libtiff and OpenJPEG.
struct MemoryFile {
  std::span<const uint8_t> data;
  uint64_t position = 0;
  std::string message;  // the first error reported

  uint64_t read(void* out, uint64_t count) {
    const uint64_t available = position < data.size() ? data.size() - position : 0;
    const uint64_t n = std::min(count, available);
    if (n > 0) std::memcpy(out, data.data() + position, n);
    position += n;
    return n;
  }
};

// --- TIFF ---

tmsize_t tiff_read(thandle_t h, void* out, tmsize_t n) {
  return n < 0 ? -1 : static_cast<tmsize_t>(static_cast<MemoryFile*>(h)->read(out, static_cast<uint64_t>(n)));
}
tmsize_t tiff_write(thandle_t, void*, tmsize_t) { return -1; }
toff_t tiff_seek(thandle_t h, toff_t offset, int whence) {
  auto* file = static_cast<MemoryFile*>(h);
  const uint64_t base = whence == SEEK_CUR ? file->position : whence == SEEK_END ? file->data.size() : 0;
  file->position = base + offset;
  return file->position;
}
int tiff_close(thandle_t) { return 0; }
toff_t tiff_size(thandle_t h) { return static_cast<MemoryFile*>(h)->data.size(); }
int tiff_map(thandle_t, void**, toff_t*) { return 0; }  // not mapped: libtiff reads through tiff_read
void tiff_unmap(thandle_t, void*, toff_t) {}

int tiff_on_error(TIFF*, void* user_data, const char* module, const char* format, va_list args) {
  auto* file = static_cast<MemoryFile*>(user_data);
  if (file->message.empty()) {
    char text[512];
    std::vsnprintf(text, sizeof text, format, args);
    file->message = std::string(module ? module : "libtiff") + ": " + text;
  }
  return 1;  // handled: libtiff's global handler (stderr) is not called
}
int tiff_on_warning(TIFF*, void*, const char*, const char*, va_list) { return 1; }

// --- JPEG 2000 ---

OPJ_SIZE_T opj_read(void* out, OPJ_SIZE_T count, void* user_data) {
  const uint64_t n = static_cast<MemoryFile*>(user_data)->read(out, count);
  return n == 0 ? static_cast<OPJ_SIZE_T>(-1) : static_cast<OPJ_SIZE_T>(n);
}
OPJ_OFF_T opj_skip(OPJ_OFF_T count, void* user_data) {
  auto* file = static_cast<MemoryFile*>(user_data);
  if (count < 0 && static_cast<uint64_t>(-count) > file->position) return -1;
  file->position += static_cast<uint64_t>(count);
  return count;
}
OPJ_BOOL opj_seek(OPJ_OFF_T position, void* user_data) {
  auto* file = static_cast<MemoryFile*>(user_data);
  if (position < 0 || static_cast<uint64_t>(position) > file->data.size()) return OPJ_FALSE;
  file->position = static_cast<uint64_t>(position);
  return OPJ_TRUE;
}
void opj_on_error(const char* message, void* user_data) {
  auto* file = static_cast<MemoryFile*>(user_data);
  if (file->message.empty()) file->message = message;
  while (!file->message.empty() && file->message.back() == '\n') file->message.pop_back();
}
void opj_quiet(const char*, void*) {}

// A sample of `component` brought to 8 bits as Pillow does, clamped.
uint8_t to_8_bits(const opj_image_comp_t& component, int32_t value) {
  const int prec = static_cast<int>(component.prec);
  int64_t v = value;
  if (component.sgnd) v += int64_t{1} << (prec - 1);
  if (prec > 8) {
    v = (v + (int64_t{1} << (prec - 9))) >> (prec - 8);
  } else {
    v <<= 8 - prec;
  }
  return static_cast<uint8_t>(std::clamp<int64_t>(v, 0, 255));
}

void convert_jpeg2000(const opj_image_t& image, Image8& out) {
  const uint32_t n = image.numcomps;
  const bool srgb_or_gray = image.color_space == OPJ_CLRSPC_SRGB || image.color_space == OPJ_CLRSPC_GRAY ||
                            image.color_space == OPJ_CLRSPC_UNSPECIFIED || image.color_space == OPJ_CLRSPC_UNKNOWN;
  if (n < 1 || n > 4 || !srgb_or_gray || (image.color_space == OPJ_CLRSPC_GRAY && n > 2) ||
      (image.color_space == OPJ_CLRSPC_SRGB && n < 3)) {
    throw ImageDecodeError("JPEG 2000: " + std::to_string(n) + " components in colour space " +
                           std::to_string(static_cast<int>(image.color_space)) + " are not supported");
  }
  const int channels = n <= 2 ? 1 : 3;
  for (int c = 0; c < channels; ++c) {
    const opj_image_comp_t& comp = image.comps[c];
    if (comp.data == nullptr || comp.dx == 0 || comp.dy == 0 || comp.w == 0 || comp.h == 0 || comp.prec < 1 ||
        comp.prec > 31) {
      throw ImageDecodeError("JPEG 2000: component " + std::to_string(c) + " has no usable samples");
    }
  }
  allocate(out, int64_t{image.y1} - image.y0, int64_t{image.x1} - image.x0, channels);
  for (int c = 0; c < channels; ++c) {
    const opj_image_comp_t& comp = image.comps[c];
    for (int64_t y = 0; y < out.height; ++y) {
      // The component's sample covering image row y0 + y (reference grid / subsampling).
      const int64_t cy = std::min<int64_t>((image.y0 + y) / comp.dy - comp.y0, comp.h - 1);
      const int32_t* src = comp.data + std::max<int64_t>(cy, 0) * comp.w;
      uint8_t* dst = out.pixels.data() + (y * out.width) * channels + c;
      for (int64_t x = 0; x < out.width; ++x) {
        const int64_t cx = std::clamp<int64_t>((image.x0 + x) / comp.dx - comp.x0, 0, comp.w - 1);
        dst[x * channels] = to_8_bits(comp, src[cx]);
      }
    }
  }
}

// libtiff's RGBA interface multiplies colour by an unassociated alpha; Pillow keeps the colour
// (and then drops alpha). Declaring such alpha associated (in memory only) keeps the colour.
void keep_colour_of_unassociated_alpha(TIFF* tif) {
  uint16_t count = 0;
  const uint16_t* types = nullptr;
  if (!TIFFGetField(tif, TIFFTAG_EXTRASAMPLES, &count, &types) || types == nullptr) return;
  std::vector<uint16_t> associated(types, types + count);
  if (std::find(associated.begin(), associated.end(), EXTRASAMPLE_UNASSALPHA) == associated.end()) return;
  std::replace(associated.begin(), associated.end(), uint16_t{EXTRASAMPLE_UNASSALPHA}, uint16_t{EXTRASAMPLE_ASSOCALPHA});
  TIFFSetField(tif, TIFFTAG_EXTRASAMPLES, count, associated.data());
}

}  // namespace

Image8 decode_tiff(std::span<const uint8_t> data) {
  MemoryFile file{data};
  TIFFOpenOptions* options = TIFFOpenOptionsAlloc();
  if (options == nullptr) throw ImageDecodeError("TIFF: libtiff could not start");
  TIFFOpenOptionsSetErrorHandlerExtR(options, tiff_on_error, &file);
  TIFFOpenOptionsSetWarningHandlerExtR(options, tiff_on_warning, &file);
  TIFFOpenOptionsSetMaxSingleMemAlloc(options, tmsize_t{1} << 31);
  TIFF* tif = TIFFClientOpenExt("ImageDecoder input", "r", &file, tiff_read, tiff_write, tiff_seek, tiff_close,
                                tiff_size, tiff_map, tiff_unmap, options);
  TIFFOpenOptionsFree(options);
  if (tif == nullptr) throw ImageDecodeError("TIFF: " + (file.message.empty() ? "cannot open" : file.message));
  struct Guard {
    TIFF* tif;
    ~Guard() { TIFFClose(tif); }
  } guard{tif};
  keep_colour_of_unassociated_alpha(tif);
  char reason[1024] = {};
  if (!TIFFRGBAImageOK(tif, reason)) throw ImageDecodeError(std::string("TIFF: ") + reason);
  uint32_t width = 0, height = 0;
  uint16_t photometric = PHOTOMETRIC_RGB;
  TIFFGetField(tif, TIFFTAG_IMAGEWIDTH, &width);
  TIFFGetField(tif, TIFFTAG_IMAGELENGTH, &height);
  TIFFGetField(tif, TIFFTAG_PHOTOMETRIC, &photometric);
  const bool gray = photometric == PHOTOMETRIC_MINISBLACK || photometric == PHOTOMETRIC_MINISWHITE;
  Image8 out;
  allocate(out, height, width, gray ? 1 : 3);
  std::vector<uint32_t> raster(static_cast<size_t>(width) * height);
  if (!TIFFReadRGBAImageOriented(tif, width, height, raster.data(), ORIENTATION_TOPLEFT, 1) ||
      !file.message.empty()) {
    throw ImageDecodeError("TIFF: " + (file.message.empty() ? "cannot decode" : file.message));
  }
  uint8_t* dst = out.pixels.data();
  for (const uint32_t abgr : raster) {
    *dst++ = static_cast<uint8_t>(TIFFGetR(abgr));
    if (gray) continue;
    *dst++ = static_cast<uint8_t>(TIFFGetG(abgr));
    *dst++ = static_cast<uint8_t>(TIFFGetB(abgr));
  }
  return out;
}

Image8 decode_webp(std::span<const uint8_t> data) {
  // The canvas size first: the decoder allocates two canvases before it can be asked.
  int width = 0, height = 0;
  if (!WebPGetInfo(data.data(), data.size(), &width, &height)) throw ImageDecodeError("WebP: not a decodable WebP file");
  if (int64_t{width} * height > kMaxPixels) {
    throw ImageDecodeError("WebP: " + std::to_string(width) + "x" + std::to_string(height) + " pixels exceed the limit of " +
                           std::to_string(kMaxPixels));
  }
  const WebPData webp{data.data(), data.size()};
  WebPAnimDecoder* decoder = WebPAnimDecoderNew(&webp, nullptr);  // defaults: RGBA, one thread
  if (decoder == nullptr) throw ImageDecodeError("WebP: not a decodable WebP file");
  struct Guard {
    WebPAnimDecoder* decoder;
    ~Guard() { WebPAnimDecoderDelete(decoder); }
  } guard{decoder};
  WebPAnimInfo info{};
  uint8_t* rgba = nullptr;
  int timestamp = 0;
  if (!WebPAnimDecoderGetInfo(decoder, &info) || !WebPAnimDecoderGetNext(decoder, &rgba, &timestamp)) {
    throw ImageDecodeError("WebP: cannot decode the first frame");
  }
  Image8 out;
  allocate(out, info.canvas_height, info.canvas_width, 3);
  const int64_t pixels = out.height * out.width;
  for (int64_t i = 0; i < pixels; ++i) std::memcpy(&out.pixels[static_cast<size_t>(i) * 3], rgba + i * 4, 3);
  return out;
}

Image8 decode_jpeg2000(std::span<const uint8_t> data) {
  // A raw codestream starts with SOC and SIZ (FF 4F FF 51); anything else detected as JPEG 2000
  // is a JP2 file.
  const bool codestream = data.size() >= 4 && data[0] == 0xFF && data[1] == 0x4F && data[2] == 0xFF && data[3] == 0x51;
  MemoryFile file{data};
  opj_codec_t* codec = opj_create_decompress(codestream ? OPJ_CODEC_J2K : OPJ_CODEC_JP2);
  opj_stream_t* stream = opj_stream_create(OPJ_J2K_STREAM_CHUNK_SIZE, OPJ_TRUE);
  opj_image_t* image = nullptr;
  struct Guard {
    opj_codec_t*& codec;
    opj_stream_t*& stream;
    opj_image_t*& image;
    ~Guard() {
      if (image) opj_image_destroy(image);
      if (stream) opj_stream_destroy(stream);
      if (codec) opj_destroy_codec(codec);
    }
  } guard{codec, stream, image};
  if (codec == nullptr || stream == nullptr) throw ImageDecodeError("JPEG 2000: OpenJPEG could not start");
  opj_set_error_handler(codec, opj_on_error, &file);
  opj_set_warning_handler(codec, opj_quiet, nullptr);
  opj_set_info_handler(codec, opj_quiet, nullptr);
  opj_dparameters_t parameters;
  opj_set_default_decoder_parameters(&parameters);
  opj_stream_set_user_data(stream, &file, nullptr);
  opj_stream_set_user_data_length(stream, data.size());
  opj_stream_set_read_function(stream, opj_read);
  opj_stream_set_skip_function(stream, opj_skip);
  opj_stream_set_seek_function(stream, opj_seek);
  const auto fail = [&](const char* what) {
    throw ImageDecodeError(std::string("JPEG 2000: ") + (file.message.empty() ? what : file.message.c_str()));
  };
  if (!opj_setup_decoder(codec, &parameters) || !opj_read_header(stream, codec, &image) || image == nullptr) {
    fail("cannot read the header");
  }
  if (image->x1 <= image->x0 || image->y1 <= image->y0 ||
      (int64_t{image->x1} - image->x0) * (int64_t{image->y1} - image->y0) > kMaxPixels) {
    fail("the image is empty or larger than the decoder's limit");
  }
  if (!opj_decode(codec, stream, image) || !opj_end_decompress(codec, stream)) fail("cannot decode");
  Image8 out;
  convert_jpeg2000(*image, out);
  return out;
}

}  // namespace onnxtrain::ops::image
