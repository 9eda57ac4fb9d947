// The decoders behind ImageDecoder (ops/image_decoder.cpp): an encoded file's bytes in, 8-bit
// pixels out. Each format is decoded by Debian's library for it, as Pillow (the library the
// ONNX reference implementation and backend tests use) decodes it:
//   JPEG      libjpeg-turbo (image_codec_jpeg_png.cpp)
//   PNG       libpng        (image_codec_jpeg_png.cpp)
//   TIFF      libtiff       (image_codec_tiff_webp_jp2.cpp)
//   WebP      libwebp's animation decoder, first frame (image_codec_tiff_webp_jp2.cpp)
//   JPEG 2000 OpenJPEG, JP2 files and raw codestreams (image_codec_tiff_webp_jp2.cpp)
//   PNM       libnetpbm: PBM, PGM, PPM, PAM, plain and raw (image_codec_bmp_pnm.cpp)
//   BMP       parsed here; Debian packages no BMP library (image_codec_bmp_pnm.cpp)
// Every decoder gives gray (1 channel) or RGB (3 channels): alpha is dropped, palettes are
// expanded, CMYK is converted to RGB, samples deeper than 8 bits are scaled to 8 bits. Where the
// file cannot be decoded (corrupt, truncated, a variant the decoder does not handle) a decoder
// throws ImageDecodeError; the libraries' own error paths (which would print or exit) are
// replaced by handlers that report back, so no input can abort the process.
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace onnxtrain::ops::image {

// An 8-bit image, rows top to bottom, pixels interleaved (HWC).
struct Image8 {
  int64_t height = 0;
  int64_t width = 0;
  int channels = 0;  // 1 (gray) or 3 (RGB)
  std::vector<uint8_t> pixels;
};

// A file that cannot be decoded; what() says why.
class ImageDecodeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class ImageFormat { Unknown, Bmp, Jpeg, Jpeg2000, Png, Pnm, Tiff, WebP };

// The format named by the file's first bytes (its magic number), or Unknown.
ImageFormat detect_format(std::span<const uint8_t> data);
const char* format_name(ImageFormat format);

// Pillow's decompression-bomb limit (Image.MAX_IMAGE_PIXELS * 2, where Pillow refuses to open a
// file): larger images are an ImageDecodeError, so a small file cannot claim gigabytes.
constexpr int64_t kMaxPixels = 2 * (int64_t{1024} * 1024 * 1024 / 4 / 3);

// Sizes `image` for height x width pixels of `channels`, or throws ImageDecodeError for an empty
// or too large image.
void allocate(Image8& image, int64_t height, int64_t width, int channels);

// Pillow's RGB -> L conversion (libImaging/Convert.c, "ITU-R Recommendation 601-2"):
// L = (R * 19595 + G * 38470 + B * 7471 + 0x8000) >> 16, the weights 0.299, 0.587, 0.114 in
// 16-bit fixed point, rounded to nearest.
inline uint8_t luma(uint8_t r, uint8_t g, uint8_t b) {
  return static_cast<uint8_t>((uint32_t{r} * 19595 + uint32_t{g} * 38470 + uint32_t{b} * 7471 + 0x8000) >> 16);
}

Image8 decode_bmp(std::span<const uint8_t> data);
Image8 decode_jpeg(std::span<const uint8_t> data);
Image8 decode_jpeg2000(std::span<const uint8_t> data);
Image8 decode_png(std::span<const uint8_t> data);
Image8 decode_pnm(std::span<const uint8_t> data);
Image8 decode_tiff(std::span<const uint8_t> data);
Image8 decode_webp(std::span<const uint8_t> data);

// Detects the format and decodes; ImageDecodeError for an unknown format or a failed decode.
Image8 decode(std::span<const uint8_t> data);

}  // namespace onnxtrain::ops::image
