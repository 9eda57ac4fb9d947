// ImageDecoder (ai.onnx 20, ONNX operator doc "ImageDecoder"): encoded_stream, a 1-D uint8
// tensor holding an image file's bytes, in; image, uint8 [H, W, C] (channel-last) out, with
// pixel_format "RGB" (the default, C = 3), "BGR" (C = 3) or "Grayscale" (C = 1).
// The format is detected from the file's magic number: BMP, JPEG, JPEG 2000 (JP2 or codestream),
// PNG, PNM (PBM/PGM/PPM/PAM), TIFF, WebP; each is decoded by Debian's library for it as Pillow
// decodes it (ops/image_codecs.h says how, format by format); Pillow is what the ONNX reference
// implementation and backend tests decode with. Gray files give R = G = B; colour to
// Grayscale is Pillow's convert("L"), L = (19595 R + 38470 G + 7471 B + 2^15) >> 16.
// A file that cannot be decoded (an empty tensor, an unknown format, corrupt or truncated data,
// a variant no decoder handles, more than Pillow's 178956970-pixel limit) gives an empty image
// of shape [0, 0, C]: the operator doc says "If it can't decode for any reason (e.g. corrupted
// encoded stream, invalid format), it will return an empty matrix". An input that is not a
// 1-D tensor is an Error. Not differentiable (the doc's tags: both sides non-differentiable).
#include <algorithm>
#include <cstring>
#include <string>

#include "ops/factories.h"
#include "ops/image_codecs.h"

namespace onnxtrain::ops {

namespace image {

ImageFormat detect_format(std::span<const uint8_t> d) {
  const auto starts = [&](std::initializer_list<uint8_t> magic, size_t at = 0) {
    return d.size() >= at + magic.size() && std::equal(magic.begin(), magic.end(), d.begin() + static_cast<ptrdiff_t>(at));
  };
  if (starts({0xFF, 0xD8, 0xFF})) return ImageFormat::Jpeg;
  if (starts({0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'})) return ImageFormat::Png;
  if (starts({'I', 'I', 42, 0}) || starts({'M', 'M', 0, 42}) || starts({'I', 'I', 43, 0}) || starts({'M', 'M', 0, 43})) {
    return ImageFormat::Tiff;  // classic TIFF and BigTIFF
  }
  if (starts({'R', 'I', 'F', 'F'}) && starts({'W', 'E', 'B', 'P'}, 8)) return ImageFormat::WebP;
  if (starts({0, 0, 0, 12, 'j', 'P', ' ', ' ', '\r', '\n', 0x87, '\n'}) || starts({0xFF, 0x4F, 0xFF, 0x51})) {
    return ImageFormat::Jpeg2000;  // JP2 signature box, or a raw codestream (SOC, SIZ)
  }
  if (starts({'B', 'M'})) return ImageFormat::Bmp;
  const auto space = [](uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  if (d.size() >= 3 && d[0] == 'P' && d[1] >= '1' && d[1] <= '7' && space(d[2])) {
    return ImageFormat::Pnm;
  }
  return ImageFormat::Unknown;
}

const char* format_name(ImageFormat format) {
  switch (format) {
    case ImageFormat::Bmp: return "BMP";
    case ImageFormat::Jpeg: return "JPEG";
    case ImageFormat::Jpeg2000: return "JPEG 2000";
    case ImageFormat::Png: return "PNG";
    case ImageFormat::Pnm: return "PNM";
    case ImageFormat::Tiff: return "TIFF";
    case ImageFormat::WebP: return "WebP";
    case ImageFormat::Unknown: break;
  }
  return "unknown";
}

void allocate(Image8& image, int64_t height, int64_t width, int channels) {
  if (height <= 0 || width <= 0) throw ImageDecodeError("the image is empty");
  if (height > kMaxPixels / width) {
    throw ImageDecodeError(std::to_string(width) + "x" + std::to_string(height) + " pixels exceed the limit of " +
                           std::to_string(kMaxPixels));
  }
  image.height = height;
  image.width = width;
  image.channels = channels;
  image.pixels.resize(static_cast<size_t>(height * width * channels));
}

Image8 decode(std::span<const uint8_t> data) {
  switch (detect_format(data)) {
    case ImageFormat::Bmp: return decode_bmp(data);
    case ImageFormat::Jpeg: return decode_jpeg(data);
    case ImageFormat::Jpeg2000: return decode_jpeg2000(data);
    case ImageFormat::Png: return decode_png(data);
    case ImageFormat::Pnm: return decode_pnm(data);
    case ImageFormat::Tiff: return decode_tiff(data);
    case ImageFormat::WebP: return decode_webp(data);
    case ImageFormat::Unknown: break;
  }
  throw ImageDecodeError(data.empty() ? "the encoded stream is empty" : "the format is not one ImageDecoder reads");
}

}  // namespace image

namespace {

enum class PixelFormat { Rgb, Bgr, Grayscale };

// `image` (gray or RGB) into `out` ([H, W, C] for `format`).
void convert_pixels(const image::Image8& image, PixelFormat format, uint8_t* out) {
  const size_t pixels = static_cast<size_t>(image.height * image.width);
  const uint8_t* in = image.pixels.data();
  if (format == PixelFormat::Grayscale) {
    if (image.channels == 1) {
      std::memcpy(out, in, pixels);
    } else {
      for (size_t i = 0; i < pixels; ++i) out[i] = image::luma(in[3 * i], in[3 * i + 1], in[3 * i + 2]);
    }
    return;
  }
  if (image.channels == 1) {
    for (size_t i = 0; i < pixels; ++i) out[3 * i] = out[3 * i + 1] = out[3 * i + 2] = in[i];
  } else if (format == PixelFormat::Rgb) {
    std::memcpy(out, in, pixels * 3);
  } else {
    for (size_t i = 0; i < pixels; ++i) {
      out[3 * i] = in[3 * i + 2], out[3 * i + 1] = in[3 * i + 1], out[3 * i + 2] = in[3 * i];
    }
  }
}

class ImageDecoderKernel final : public Kernel {
 public:
  explicit ImageDecoderKernel(PixelFormat format) : format_(format) {}

  void run(KernelContext& ctx) override {
    const Tensor& encoded = ctx.input(0);
    if (encoded.rank() != 1) {
      fail("input " + ctx.input_name(0) + " must be 1-D (the bytes of an encoded image), got " + encoded.description());
    }
    const int64_t channels = format_ == PixelFormat::Grayscale ? 1 : 3;
    image::Image8 decoded;
    try {
      decoded = image::decode({encoded.data<uint8_t>(), static_cast<size_t>(encoded.numel())});
    } catch (const image::ImageDecodeError&) {
      // The operator doc: an image that cannot be decoded gives an empty matrix.
      ctx.allocate_output(0, DataType::UInt8, Shape{0, 0, channels});
      return;
    }
    Tensor& out = ctx.allocate_output(0, DataType::UInt8, Shape{decoded.height, decoded.width, channels});
    convert_pixels(decoded, format_, out.data<uint8_t>());
  }

 private:
  PixelFormat format_;
};

}  // namespace

std::unique_ptr<Kernel> make_image_decoder(const KernelInit& init) {
  const std::string format = init.attr_string("pixel_format", "RGB");
  if (format == "RGB") return std::make_unique<ImageDecoderKernel>(PixelFormat::Rgb);
  if (format == "BGR") return std::make_unique<ImageDecoderKernel>(PixelFormat::Bgr);
  if (format == "Grayscale") return std::make_unique<ImageDecoderKernel>(PixelFormat::Grayscale);
  throw Error("ImageDecoder attribute 'pixel_format' is '" + format + "'; expected 'RGB', 'BGR' or 'Grayscale'");
}

}  // namespace onnxtrain::ops
