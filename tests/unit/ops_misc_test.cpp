// ImageDecoder and TfIdfVectorizer. Images are encoded here with the codecs' own encoders
// (libpng, libjpeg, libtiff, libwebp, OpenJPEG) or built byte by byte (BMP, PNM) from pixels
// the test chooses, and the decoded pixels are checked against those; TfIdfVectorizer's counts
// are recomputed by brute force over every (length, skip, start) of each row.
#include <cstdio>  // before jpeglib.h, which uses FILE and size_t
#include <jpeglib.h>
#include <openjpeg.h>
#include <png.h>
#include <tiffio.h>
#include <webp/encode.h>

#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <tuple>

#include "ops/image_codecs.h"
#include "onnxtrain/error.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

namespace image = ops::image;
using testing::attr;
using Bytes = std::vector<uint8_t>;

// --- pixels the tests choose ---

constexpr int kW = 7, kH = 5;  // odd: BMP rows need padding, PNG/JPEG rows are not aligned

Bytes rgb_pattern() {
  Bytes p(kW * kH * 3);
  for (int i = 0; i < kW * kH; ++i) {
    p[i * 3] = static_cast<uint8_t>(i * 37 % 256);
    p[i * 3 + 1] = static_cast<uint8_t>(255 - i * 11);
    p[i * 3 + 2] = static_cast<uint8_t>(i * 101 % 251);
  }
  return p;
}

Bytes gray_pattern() {
  Bytes p(kW * kH);
  for (int i = 0; i < kW * kH; ++i) p[i] = static_cast<uint8_t>(i * 53 % 256);
  return p;
}

Tensor bytes_tensor(const Bytes& b) { return Tensor::from_vector<uint8_t>(Shape{static_cast<int64_t>(b.size())}, b); }

Tensor decode(const Bytes& file, const std::string& pixel_format = "RGB") {
  return testing::run1("ImageDecoder", 20, {attr("pixel_format", pixel_format)}, {bytes_tensor(file)});
}

Bytes values(const Tensor& t) {
  const auto v = t.values<uint8_t>();
  return Bytes(v.begin(), v.end());
}

// Pillow's "L" from RGB, written from its definition: the ITU-R 601-2 weights in 16-bit fixed
// point, rounded.
uint8_t pillow_luma(int r, int g, int b) { return static_cast<uint8_t>((r * 19595 + g * 38470 + b * 7471 + 32768) >> 16); }

// Decodes `file` as RGB, BGR and Grayscale and checks all three against RGB pixels `rgb`.
void expect_decodes_to(const Bytes& file, const Bytes& rgb, int height, int width) {
  const Tensor t = decode(file);
  ASSERT_EQ(t.shape(), (Shape{height, width, 3}));
  EXPECT_EQ(values(t), rgb);
  Bytes bgr(rgb.size()), gray(rgb.size() / 3);
  for (size_t i = 0; i < gray.size(); ++i) {
    bgr[i * 3] = rgb[i * 3 + 2], bgr[i * 3 + 1] = rgb[i * 3 + 1], bgr[i * 3 + 2] = rgb[i * 3];
    gray[i] = pillow_luma(rgb[i * 3], rgb[i * 3 + 1], rgb[i * 3 + 2]);
  }
  EXPECT_EQ(values(decode(file, "BGR")), bgr);
  const Tensor g = decode(file, "Grayscale");
  ASSERT_EQ(g.shape(), (Shape{height, width, 1}));
  EXPECT_EQ(values(g), gray);
}

Bytes gray_to_rgb(const Bytes& gray) {
  Bytes rgb;
  for (uint8_t v : gray) rgb.insert(rgb.end(), {v, v, v});
  return rgb;
}

// An empty [0, 0, C] image: what the operator doc says a file that cannot be decoded gives.
void expect_undecodable(const Bytes& file) {
  const Tensor t = decode(file);
  EXPECT_EQ(t.shape(), (Shape{0, 0, 3}));
  EXPECT_EQ(decode(file, "Grayscale").shape(), (Shape{0, 0, 1}));
}

// --- encoders ---

void png_append(png_structp png, png_bytep data, size_t n) {
  auto* out = static_cast<Bytes*>(png_get_io_ptr(png));
  out->insert(out->end(), data, data + n);
}

// `samples` rows of width * channels samples of `bit_depth` (16-bit big-endian as PNG stores them).
Bytes encode_png(int color_type, int bit_depth, const Bytes& samples, bool interlaced = false,
                 const std::vector<png_color>& palette = {}) {
  Bytes out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png)) != 0) {
    png_destroy_write_struct(&png, &info);
    return {};
  }
  png_set_write_fn(png, &out, png_append, nullptr);
  png_set_IHDR(png, info, kW, kH, bit_depth, color_type, interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (!palette.empty()) png_set_PLTE(png, info, palette.data(), static_cast<int>(palette.size()));
  png_write_info(png, info);
  const size_t stride = samples.size() / kH;
  std::vector<png_bytep> rows(kH);
  for (int y = 0; y < kH; ++y) rows[y] = const_cast<uint8_t*>(samples.data()) + y * stride;
  png_write_image(png, rows.data());
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

Bytes encode_jpeg(const Bytes& pixels, int components, J_COLOR_SPACE space, bool full_chroma, bool progressive = false) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr errors;
  cinfo.err = jpeg_std_error(&errors);
  jpeg_create_compress(&cinfo);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = kW, cinfo.image_height = kH;
  cinfo.input_components = components, cinfo.in_color_space = space;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, 100, TRUE);
  if (full_chroma) {
    for (int c = 0; c < cinfo.num_components; ++c) cinfo.comp_info[c].h_samp_factor = cinfo.comp_info[c].v_samp_factor = 1;
  }
  if (progressive) jpeg_simple_progression(&cinfo);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(pixels.data()) + cinfo.next_scanline * kW * components;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  Bytes out(buffer, buffer + size);
  std::free(buffer);
  return out;
}

Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

Bytes encode_tiff(const Bytes& samples, int channels, uint16_t photometric, uint16_t compression) {
  const std::string path = ::testing::TempDir() + "/ops_misc_test.tif";
  TIFF* tif = TIFFOpen(path.c_str(), "w");
  TIFFSetField(tif, TIFFTAG_IMAGEWIDTH, kW);
  TIFFSetField(tif, TIFFTAG_IMAGELENGTH, kH);
  TIFFSetField(tif, TIFFTAG_SAMPLESPERPIXEL, channels);
  TIFFSetField(tif, TIFFTAG_BITSPERSAMPLE, 8);
  TIFFSetField(tif, TIFFTAG_PHOTOMETRIC, photometric);
  TIFFSetField(tif, TIFFTAG_PLANARCONFIG, PLANARCONFIG_CONTIG);
  TIFFSetField(tif, TIFFTAG_COMPRESSION, compression);
  TIFFSetField(tif, TIFFTAG_ROWSPERSTRIP, 2);
  if (channels == 4) {
    const uint16_t unassociated = EXTRASAMPLE_UNASSALPHA;
    TIFFSetField(tif, TIFFTAG_EXTRASAMPLES, 1, &unassociated);
  }
  for (int y = 0; y < kH; ++y) TIFFWriteScanline(tif, const_cast<uint8_t*>(samples.data()) + y * kW * channels, y, 0);
  TIFFClose(tif);
  return read_file(path);
}

// A seekable in-memory output for OpenJPEG (JP2 writes box lengths back).
struct OpjSink {
  Bytes bytes;
  size_t at = 0;
};
OPJ_SIZE_T opj_sink_write(void* data, OPJ_SIZE_T n, void* user) {
  auto* s = static_cast<OpjSink*>(user);
  if (s->bytes.size() < s->at + n) s->bytes.resize(s->at + n);
  std::memcpy(s->bytes.data() + s->at, data, n);
  s->at += n;
  return n;
}
OPJ_OFF_T opj_sink_skip(OPJ_OFF_T n, void* user) {
  static_cast<OpjSink*>(user)->at += static_cast<size_t>(n);
  return n;
}
OPJ_BOOL opj_sink_seek(OPJ_OFF_T at, void* user) {
  static_cast<OpjSink*>(user)->at = static_cast<size_t>(at);
  return OPJ_TRUE;
}

// Lossless JPEG 2000 of `channels` components of `prec` bits (`sgnd`: signed samples).
Bytes encode_jpeg2000(const std::vector<int32_t>& samples, int channels, int prec, bool sgnd, OPJ_CODEC_FORMAT codec_format) {
  std::vector<opj_image_cmptparm_t> parms(static_cast<size_t>(channels));
  for (auto& p : parms) {
    p = opj_image_cmptparm_t{};
    p.dx = p.dy = 1, p.w = kW, p.h = kH, p.prec = static_cast<OPJ_UINT32>(prec), p.sgnd = sgnd ? 1 : 0;
  }
  opj_image_t* image = opj_image_create(static_cast<OPJ_UINT32>(channels), parms.data(),
                                        channels == 1 ? OPJ_CLRSPC_GRAY : OPJ_CLRSPC_SRGB);
  image->x0 = image->y0 = 0, image->x1 = kW, image->y1 = kH;
  for (int i = 0; i < kW * kH; ++i) {
    for (int c = 0; c < channels; ++c) image->comps[c].data[i] = samples[static_cast<size_t>(i * channels + c)];
  }
  opj_cparameters_t parameters;
  opj_set_default_encoder_parameters(&parameters);
  parameters.tcp_numlayers = 1, parameters.tcp_rates[0] = 0, parameters.cp_disto_alloc = 1;  // lossless
  parameters.numresolution = 2;  // a 7x5 image has room for few resolutions
  opj_codec_t* codec = opj_create_compress(codec_format);
  OpjSink sink;
  opj_stream_t* stream = opj_stream_create(OPJ_J2K_STREAM_CHUNK_SIZE, OPJ_FALSE);
  opj_stream_set_user_data(stream, &sink, nullptr);
  opj_stream_set_write_function(stream, opj_sink_write);
  opj_stream_set_skip_function(stream, opj_sink_skip);
  opj_stream_set_seek_function(stream, opj_sink_seek);
  const bool ok = opj_setup_encoder(codec, &parameters, image) && opj_start_compress(codec, image, stream) &&
                  opj_encode(codec, stream) && opj_end_compress(codec, stream);
  opj_stream_destroy(stream);
  opj_destroy_codec(codec);
  opj_image_destroy(image);
  EXPECT_TRUE(ok);
  return sink.bytes;
}

// --- hand-built files ---

void put16(Bytes& b, uint32_t v) { b.insert(b.end(), {uint8_t(v), uint8_t(v >> 8)}); }
void put32(Bytes& b, uint32_t v) { b.insert(b.end(), {uint8_t(v), uint8_t(v >> 8), uint8_t(v >> 16), uint8_t(v >> 24)}); }

// A BMP with a 40-byte info header; `extra` (masks, palette) follows it, then `pixels`.
Bytes bmp(int32_t width, int32_t height, int bpp, uint32_t compression, const Bytes& extra, const Bytes& pixels,
          uint32_t colors_used = 0) {
  Bytes b{'B', 'M'};
  put32(b, static_cast<uint32_t>(54 + extra.size() + pixels.size()));
  put32(b, 0);
  put32(b, static_cast<uint32_t>(54 + extra.size()));
  put32(b, 40);
  put32(b, static_cast<uint32_t>(width));
  put32(b, static_cast<uint32_t>(height));
  put16(b, 1);
  put16(b, static_cast<uint32_t>(bpp));
  put32(b, compression);
  put32(b, static_cast<uint32_t>(pixels.size()));
  put32(b, 2835), put32(b, 2835), put32(b, colors_used), put32(b, 0);
  b.insert(b.end(), extra.begin(), extra.end());
  b.insert(b.end(), pixels.begin(), pixels.end());
  return b;
}

Bytes text(const std::string& s) { return Bytes(s.begin(), s.end()); }
// A literal's bytes, embedded NULs included.
template <size_t N>
Bytes raw(const char (&s)[N]) {
  return Bytes(s, s + N - 1);
}

// ======================= ImageDecoder =======================

TEST(ImageDecoder, DetectsFormatsByTheirMagicNumbers) {
  using image::ImageFormat;
  EXPECT_EQ(image::detect_format(Bytes{0xFF, 0xD8, 0xFF, 0xE0}), ImageFormat::Jpeg);
  EXPECT_EQ(image::detect_format(Bytes{0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'}), ImageFormat::Png);
  EXPECT_EQ(image::detect_format(Bytes{'M', 'M', 0, 42}), ImageFormat::Tiff);
  EXPECT_EQ(image::detect_format(Bytes{'I', 'I', 42, 0}), ImageFormat::Tiff);
  EXPECT_EQ(image::detect_format(raw("RIFF\x10\0\0\0WEBPVP8L")), ImageFormat::WebP);
  EXPECT_EQ(image::detect_format(Bytes{0xFF, 0x4F, 0xFF, 0x51}), ImageFormat::Jpeg2000);
  EXPECT_EQ(image::detect_format(Bytes{0, 0, 0, 12, 'j', 'P', ' ', ' ', '\r', '\n', 0x87, '\n'}), ImageFormat::Jpeg2000);
  EXPECT_EQ(image::detect_format(text("BM....")), ImageFormat::Bmp);
  EXPECT_EQ(image::detect_format(text("P6\n")), ImageFormat::Pnm);
  EXPECT_EQ(image::detect_format(text("P8\n")), ImageFormat::Unknown);
  EXPECT_EQ(image::detect_format(raw("RIFF\x10\0\0\0WAVE")), ImageFormat::Unknown);
  EXPECT_EQ(image::detect_format(Bytes{}), ImageFormat::Unknown);
}

TEST(ImageDecoder, PngRgbGrayPaletteAlphaSixteenBitInterlaced) {
  const Bytes rgb = rgb_pattern(), gray = gray_pattern();
  expect_decodes_to(encode_png(PNG_COLOR_TYPE_RGB, 8, rgb), rgb, kH, kW);
  expect_decodes_to(encode_png(PNG_COLOR_TYPE_RGB, 8, rgb, /*interlaced=*/true), rgb, kH, kW);
  // Gray stays gray: Grayscale gives the samples themselves.
  const Bytes gray_png = encode_png(PNG_COLOR_TYPE_GRAY, 8, gray);
  expect_decodes_to(gray_png, gray_to_rgb(gray), kH, kW);
  EXPECT_EQ(values(decode(gray_png, "Grayscale")), gray);
  // RGBA: alpha dropped.
  Bytes rgba;
  for (int i = 0; i < kW * kH; ++i) rgba.insert(rgba.end(), {rgb[i * 3], rgb[i * 3 + 1], rgb[i * 3 + 2], uint8_t(i * 7)});
  expect_decodes_to(encode_png(PNG_COLOR_TYPE_RGB_ALPHA, 8, rgba), rgb, kH, kW);
  // 16 bits: the high byte.
  Bytes wide;
  for (uint8_t v : rgb) wide.insert(wide.end(), {v, uint8_t(255 - v)});
  expect_decodes_to(encode_png(PNG_COLOR_TYPE_RGB, 16, wide), rgb, kH, kW);
  // A palette of 4 colours, 2 bits per index.
  const std::vector<png_color> palette = {{10, 20, 30}, {200, 0, 50}, {0, 255, 0}, {90, 90, 250}};
  Bytes packed, expected;
  for (int y = 0; y < kH; ++y) {
    packed.insert(packed.end(), 2, 0);  // 7 pixels of 2 bits: 2 bytes per row
    for (int x = 0; x < kW; ++x) {
      const int index = (x + 2 * y) % 4;
      packed[packed.size() - 2 + x / 4] |= static_cast<uint8_t>(index << (6 - 2 * (x % 4)));
      expected.insert(expected.end(), {palette[index].red, palette[index].green, palette[index].blue});
    }
  }
  expect_decodes_to(encode_png(PNG_COLOR_TYPE_PALETTE, 2, packed, false, palette), expected, kH, kW);
}

TEST(ImageDecoder, JpegColourGrayAndAdobeCmyk) {
  // Flat colours in whole 8x8 blocks survive quality 100 without chroma subsampling to within
  // rounding; the grayscale conversion is checked exactly on the decoded RGB.
  Bytes flat(kW * kH * 3);
  for (int i = 0; i < kW * kH; ++i) flat[i * 3] = 200, flat[i * 3 + 1] = 40, flat[i * 3 + 2] = 90;
  const Bytes jpeg = encode_jpeg(flat, 3, JCS_RGB, true);
  const Tensor t = decode(jpeg);
  ASSERT_EQ(t.shape(), (Shape{kH, kW, 3}));
  const Bytes got = values(t);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], flat[i], 2) << i;
  const Bytes gray = values(decode(jpeg, "Grayscale"));
  for (int i = 0; i < kW * kH; ++i) EXPECT_EQ(gray[i], pillow_luma(got[i * 3], got[i * 3 + 1], got[i * 3 + 2]));
  const Bytes bgr = values(decode(jpeg, "BGR"));
  for (int i = 0; i < kW * kH; ++i) EXPECT_EQ(bgr[i * 3], got[i * 3 + 2]);

  // One component: gray.
  const Bytes g = encode_jpeg(Bytes(kW * kH, 77), 1, JCS_GRAYSCALE, true);
  for (uint8_t v : values(decode(g, "Grayscale"))) EXPECT_NEAR(v, 77, 1);
  const Bytes g_rgb = values(decode(g));
  for (int i = 0; i < kW * kH; ++i) EXPECT_TRUE(g_rgb[i * 3] == g_rgb[i * 3 + 1] && g_rgb[i * 3] == g_rgb[i * 3 + 2]);

  // Four components are read with Adobe's inverted polarity, as Pillow does:
  // C = 255 - stored, ..., and R = (255 - K) - C (255 - K) / 255.
  const uint8_t stored[4] = {30, 120, 220, 180};
  Bytes cmyk;
  for (int i = 0; i < kW * kH; ++i) cmyk.insert(cmyk.end(), stored, stored + 4);
  const Bytes from_cmyk = values(decode(encode_jpeg(cmyk, 4, JCS_CMYK, true)));
  const double not_k = stored[3];
  for (int c = 0; c < 3; ++c) {
    const double want = not_k - (255.0 - stored[c]) * not_k / 255.0;
    EXPECT_NEAR(from_cmyk[c], want, 2.5) << c;
  }
}

TEST(ImageDecoder, TiffRgbCompressedAlphaAndMinIsWhite) {
  const Bytes rgb = rgb_pattern(), gray = gray_pattern();
  expect_decodes_to(encode_tiff(rgb, 3, PHOTOMETRIC_RGB, COMPRESSION_NONE), rgb, kH, kW);
  expect_decodes_to(encode_tiff(rgb, 3, PHOTOMETRIC_RGB, COMPRESSION_LZW), rgb, kH, kW);
  // Colour under an unassociated alpha is kept, not multiplied by alpha (Pillow's RGBA -> RGB).
  Bytes rgba;
  for (int i = 0; i < kW * kH; ++i) rgba.insert(rgba.end(), {rgb[i * 3], rgb[i * 3 + 1], rgb[i * 3 + 2], uint8_t(i * 7)});
  expect_decodes_to(encode_tiff(rgba, 4, PHOTOMETRIC_RGB, COMPRESSION_NONE), rgb, kH, kW);
  Bytes inverted = gray;
  for (uint8_t& v : inverted) v = static_cast<uint8_t>(255 - v);
  const Bytes tiff = encode_tiff(inverted, 1, PHOTOMETRIC_MINISWHITE, COMPRESSION_ADOBE_DEFLATE);
  EXPECT_EQ(values(decode(tiff, "Grayscale")), gray);
  expect_decodes_to(tiff, gray_to_rgb(gray), kH, kW);
}

TEST(ImageDecoder, WebpLossless) {
  const Bytes rgb = rgb_pattern();
  uint8_t* out = nullptr;
  const size_t size = WebPEncodeLosslessRGB(rgb.data(), kW, kH, kW * 3, &out);
  ASSERT_GT(size, 0u);
  const Bytes webp(out, out + size);
  WebPFree(out);
  expect_decodes_to(webp, rgb, kH, kW);
}

TEST(ImageDecoder, Jpeg2000LosslessAndDeepSignedSamples) {
  const Bytes rgb = rgb_pattern();
  expect_decodes_to(encode_jpeg2000(std::vector<int32_t>(rgb.begin(), rgb.end()), 3, 8, false, OPJ_CODEC_JP2), rgb, kH, kW);
  // A raw codestream of signed 12-bit gray: v + 2048, then 12 -> 8 bits rounding (Pillow's
  // shift with an offset of half a step), clamped.
  std::vector<int32_t> deep(kW * kH);
  for (int i = 0; i < kW * kH; ++i) deep[i] = -2048 + i * 4095 / (kW * kH - 1);
  const Bytes j2k = encode_jpeg2000(deep, 1, 12, true, OPJ_CODEC_J2K);
  const Bytes got = values(decode(j2k, "Grayscale"));
  for (int i = 0; i < kW * kH; ++i) {
    const double want = std::min(255.0, std::floor((deep[i] + 2048) / 16.0 + 0.5));
    EXPECT_EQ(got[i], want) << i;
  }
}

TEST(ImageDecoder, BmpDepthsPaddingOrientationAndBitfields) {
  const Bytes rgb = rgb_pattern();
  // 24-bit, bottom-up, rows of 21 bytes padded to 24.
  Bytes px24;
  for (int y = kH - 1; y >= 0; --y) {
    for (int x = 0; x < kW; ++x) {
      const uint8_t* p = &rgb[(y * kW + x) * 3];
      px24.insert(px24.end(), {p[2], p[1], p[0]});
    }
    px24.insert(px24.end(), 3, 0xEE);
  }
  expect_decodes_to(bmp(kW, kH, 24, 0, {}, px24), rgb, kH, kW);
  // 32-bit BGRX, top-down (negative height); the fourth byte is ignored.
  Bytes px32;
  for (int i = 0; i < kW * kH; ++i) px32.insert(px32.end(), {rgb[i * 3 + 2], rgb[i * 3 + 1], rgb[i * 3], 0x55});
  expect_decodes_to(bmp(kW, -kH, 32, 0, {}, px32), rgb, kH, kW);
  // 16-bit 5-6-5 bit fields: a field of n bits v becomes v * 255 / (2^n - 1), truncated.
  Bytes masks, px16, want16;
  put32(masks, 0xF800), put32(masks, 0x07E0), put32(masks, 0x001F);
  for (int y = 0; y < kH; ++y) {
    for (int x = 0; x < 8; ++x) {  // 7 pixels of 2 bytes, padded to 16
      const uint32_t r = (x * 5 + y) % 32, g = (x * 9 + y * 3) % 64, b = (31 - x - y) % 32;
      put16(px16, r << 11 | g << 5 | b);
    }
  }
  // Expected pixels top to bottom: the file is bottom-up.
  for (int y = kH - 1; y >= 0; --y) {
    for (int x = 0; x < kW; ++x) {
      const uint32_t r = (x * 5 + y) % 32, g = (x * 9 + y * 3) % 64, b = (31 - x - y) % 32;
      want16.insert(want16.end(), {uint8_t(r * 255 / 31), uint8_t(g * 255 / 63), uint8_t(b * 255 / 31)});
    }
  }
  expect_decodes_to(bmp(kW, kH, 16, 3, masks, px16), want16, kH, kW);
}

TEST(ImageDecoder, BmpPalettesAndRle) {
  // 4-bit palette of 3 colours (colors_used = 3), top-down; index 3 is past the palette: black.
  Bytes palette;
  const uint8_t colours[3][3] = {{255, 0, 0}, {0, 128, 255}, {7, 7, 7}};
  for (const auto& c : colours) {
    for (uint8_t v : {c[2], c[1], c[0], uint8_t{0}}) palette.push_back(v);  // (insert: a GCC 12 false -Wstringop-overflow)
  }
  Bytes px4, want;
  for (int y = 0; y < kH; ++y) {
    for (int x = 0; x < 8; x += 2) px4.push_back(static_cast<uint8_t>(((x + y) % 4) << 4 | ((x + 1 + y) % 4)));
    for (int x = 0; x < kW; ++x) {
      const int i = (x + y) % 4;
      if (i < 3) want.insert(want.end(), colours[i], colours[i] + 3);
      else want.insert(want.end(), 3, 0);
    }
  }
  expect_decodes_to(bmp(kW, -kH, 4, 0, palette, px4, 3), want, kH, kW);

  // 1-bit gray palette (black, white): a gray image.
  Bytes mono_palette{0, 0, 0, 0, 255, 255, 255, 0}, px1, want1;
  for (int y = 0; y < kH; ++y) {
    const uint8_t bits = static_cast<uint8_t>(0b10110010 ^ (y * 0x11));
    for (uint8_t v : {bits, uint8_t{0}, uint8_t{0}, uint8_t{0}}) px1.push_back(v);
  }
  for (int y = kH - 1; y >= 0; --y) {
    const uint8_t bits = static_cast<uint8_t>(0b10110010 ^ (y * 0x11));
    for (int x = 0; x < kW; ++x) want1.push_back((bits >> (7 - x)) & 1 ? 255 : 0);
  }
  EXPECT_EQ(values(decode(bmp(kW, kH, 1, 0, mono_palette, px1), "Grayscale")), want1);

  // RLE8 (bottom-up): row 0 of the file is a run of 3 then an absolute run of 4 (padded), row 1
  // ends early (the rest keeps index 0), a delta skips to row 3, x 2; then end of bitmap.
  Bytes pal8;
  for (int i = 0; i < 256; ++i) pal8.insert(pal8.end(), {uint8_t(i), uint8_t(255 - i), uint8_t(i / 2), 0});
  const Bytes rle = {3, 9, 0, 4, 1, 2, 3, 4,  // run, absolute 4 (even: no pad)
                     0, 0,                    // end of line
                     2, 5, 0, 0,              // row 1: 5 5, end of line
                     0, 2, 2, 1,              // delta right 2, up 1: row 3, x 2
                     0, 3, 6, 7, 8, 0,        // absolute 3, padded to 2 bytes
                     0, 1};                   // end of bitmap
  std::vector<int> index(kW * kH, 0);  // file rows (bottom-up)
  index[0] = index[1] = index[2] = 9, index[3] = 1, index[4] = 2, index[5] = 3, index[6] = 4;
  index[kW] = index[kW + 1] = 5;
  index[3 * kW + 2] = 6, index[3 * kW + 3] = 7, index[3 * kW + 4] = 8;
  Bytes want8;
  for (int y = kH - 1; y >= 0; --y) {
    for (int x = 0; x < kW; ++x) {
      const int i = index[y * kW + x];
      want8.insert(want8.end(), {uint8_t(i / 2), uint8_t(255 - i), uint8_t(i)});  // entries are B, G, R, 0
    }
  }
  expect_decodes_to(bmp(kW, kH, 8, 1, pal8, rle), want8, kH, kW);
}

TEST(ImageDecoder, PnmRawPlainBitmapAndScaledMaxval) {
  const Bytes rgb = rgb_pattern();
  Bytes ppm = text("P6\n# a comment\n7 5\n255\n");
  ppm.insert(ppm.end(), rgb.begin(), rgb.end());
  expect_decodes_to(ppm, rgb, kH, kW);
  // maxval 2 and 6: round(v * 255 / maxval), ties to even (127.5 -> 128, 42.5 -> 42).
  EXPECT_EQ(values(decode(text("P2 3 1 2\n0 1 2\n"), "Grayscale")), (Bytes{0, 128, 255}));
  EXPECT_EQ(values(decode(text("P2 4 1 6 1 3 5 6"), "Grayscale")), (Bytes{42, 128, 212, 255}));  // no final newline
  // 16-bit raw samples (big-endian), maxval 65535.
  EXPECT_EQ(values(decode(Bytes{'P', '5', ' ', '2', ' ', '1', ' ', '6', '5', '5', '3', '5', '\n', 0x80, 0x00, 0xFF, 0xFF},
                          "Grayscale")),
            (Bytes{128, 255}));
  // PBM: 1 is black.
  EXPECT_EQ(values(decode(text("P1\n3 1\n1 0 1\n"), "Grayscale")), (Bytes{0, 255, 0}));
  EXPECT_EQ(values(decode(Bytes{'P', '4', '\n', '3', ' ', '1', '\n', 0b01000000}, "Grayscale")), (Bytes{255, 0, 255}));
}

TEST(ImageDecoder, UndecodableInputGivesAnEmptyImage) {
  expect_undecodable({});                                   // empty tensor
  expect_undecodable(text("GIF89a......"));                 // a format ImageDecoder does not read
  const Bytes png = encode_png(PNG_COLOR_TYPE_RGB, 8, rgb_pattern());
  expect_undecodable(Bytes(png.begin(), png.begin() + static_cast<ptrdiff_t>(png.size() / 2)));  // truncated
  Bytes bad_crc = png;
  bad_crc[20] ^= 1;  // inside IHDR: its CRC no longer matches
  expect_undecodable(bad_crc);
  Bytes flat(kW * kH * 3, 100);
  const Bytes jpeg = encode_jpeg(flat, 3, JCS_RGB, false);
  expect_undecodable(Bytes(jpeg.begin(), jpeg.end() - 40));  // ends inside the scan
  expect_undecodable(Bytes{0xFF, 0xD8, 0xFF, 0xE0, 0x00});   // a JPEG header and nothing else
  expect_undecodable(raw("P6\n100000 100000\n255\n\x01\x02"));  // claims 30 GB, holds 2 bytes
  expect_undecodable(text("P6\n7 5\n255\nabc"));             // raw samples missing
  expect_undecodable(text("P3\n1 1\n255\n1 2 x\n"));         // junk in a plain file
  expect_undecodable(bmp(100000, 100000, 24, 0, {}, Bytes(16, 0)));
  expect_undecodable(bmp(kW, kH, 24, 4, {}, Bytes(200, 0)));  // BI_JPEG
  expect_undecodable(raw("II*\0\x08\0\0\0\0\0"));          // TIFF with an empty directory
  expect_undecodable(raw("RIFF\x10\0\0\0WEBPVP8 junk"));
  expect_undecodable(Bytes{0xFF, 0x4F, 0xFF, 0x51, 0, 0});
  // The decoders say why.
  try {
    image::decode_jpeg(Bytes(jpeg.begin(), jpeg.end() - 40));
    ADD_FAILURE() << "no error";
  } catch (const image::ImageDecodeError& e) {
    EXPECT_NE(std::string(e.what()).find("Premature end"), std::string::npos) << e.what();
  }
  try {
    image::decode_png(bad_crc);
    ADD_FAILURE() << "no error";
  } catch (const image::ImageDecodeError& e) {
    EXPECT_NE(std::string(e.what()).find("CRC"), std::string::npos) << e.what();
  }
}

// Every prefix of a small file of each format, and the file with each byte inverted, decodes
// to a whole image or fails with ImageDecodeError: no crash, no other exception.
TEST(ImageDecoder, TruncatedAndCorruptedFilesFailCleanly) {
  const Bytes rgb = rgb_pattern();
  uint8_t* webp_out = nullptr;
  const size_t webp_size = WebPEncodeLosslessRGB(rgb.data(), kW, kH, kW * 3, &webp_out);
  const Bytes webp(webp_out, webp_out + webp_size);
  WebPFree(webp_out);
  Bytes ppm = text("P6 7 5 255\n");
  ppm.insert(ppm.end(), rgb.begin(), rgb.end());
  Bytes px24(static_cast<size_t>(24 * kH), 0x40);
  const std::vector<Bytes> files = {
      encode_png(PNG_COLOR_TYPE_RGB, 8, rgb, true), encode_jpeg(rgb, 3, JCS_RGB, false),
      encode_tiff(rgb, 3, PHOTOMETRIC_RGB, COMPRESSION_LZW), webp,
      encode_jpeg2000(std::vector<int32_t>(rgb.begin(), rgb.end()), 3, 8, false, OPJ_CODEC_JP2),
      bmp(kW, kH, 24, 0, {}, px24), ppm, text("P3 2 1 255 1 2 3 4 5 6\n")};
  int decoded = 0, failed = 0;
  const auto check = [&](const Bytes& file) {
    try {
      const image::Image8 img = image::decode(file);
      EXPECT_EQ(img.pixels.size(), static_cast<size_t>(img.height * img.width * img.channels));
      ++decoded;
    } catch (const image::ImageDecodeError&) {
      ++failed;
    }
  };
  for (const Bytes& file : files) {
    for (size_t n = 0; n < file.size(); ++n) check(Bytes(file.begin(), file.begin() + static_cast<ptrdiff_t>(n)));
    for (size_t i = 0; i < file.size(); ++i) {
      Bytes corrupt = file;
      corrupt[i] ^= 0xFF;
      check(corrupt);
    }
  }
  EXPECT_GT(failed, 0);
  EXPECT_GT(decoded, 0);
}

// A small file claiming a huge image is refused before the decoder sizes its buffers (a
// progressive JPEG's coefficient arrays would take gigabytes).
TEST(ImageDecoder, HugeClaimedSizesAreRefusedBeforeDecoding) {
  Bytes jpeg = encode_jpeg(rgb_pattern(), 3, JCS_RGB, false, /*progressive=*/true);
  for (size_t i = 0; i + 9 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xC2) {  // SOF2: length, precision, height, width
      jpeg[i + 5] = 0xEA, jpeg[i + 6] = 0x60, jpeg[i + 7] = 0xEA, jpeg[i + 8] = 0x60;  // 60000 x 60000
      break;
    }
  }
  expect_undecodable(jpeg);
  try {
    image::decode_jpeg(jpeg);
    ADD_FAILURE() << "no error";
  } catch (const image::ImageDecodeError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("JPEG: 60000x60000 pixels exceed", 0), 0u) << e.what();
  }
  // WebP: an extended header (VP8X) declaring a 16000 x 16000 canvas.
  Bytes webp = raw("RIFF\x16\0\0\0WEBPVP8X\x0a\0\0\0\0\0\0\0");
  for (int k = 0; k < 2; ++k) webp.insert(webp.end(), {uint8_t((16000 - 1) & 0xFF), uint8_t((16000 - 1) >> 8), 0});
  expect_undecodable(webp);
  try {
    image::decode_webp(webp);
    ADD_FAILURE() << "no error";
  } catch (const image::ImageDecodeError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("WebP: 16000x16000 pixels exceed", 0), 0u) << e.what();
  }
}

TEST(ImageDecoder, RejectsANonVectorInputAndAnUnknownPixelFormat) {
  try {
    testing::run1("ImageDecoder", 20, {}, {Tensor::zeros(DataType::UInt8, {2, 2})});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'in0'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(testing::run1("ImageDecoder", 20, {attr("pixel_format", std::string("RGBA"))},
                             {bytes_tensor(text("P2 1 1 1 1"))}),
               Error);
}

// ======================= TfIdfVectorizer =======================

struct TfIdfCase {
  std::string mode;
  int64_t min_gram, max_gram, max_skip;
  std::vector<int64_t> ngram_counts, ngram_indexes, pool;
  std::vector<float> weights;
};

std::vector<onnx::AttributeProto> tfidf_attrs(const TfIdfCase& c) {
  std::vector<onnx::AttributeProto> a = {
      attr("mode", c.mode),          attr("min_gram_length", c.min_gram), attr("max_gram_length", c.max_gram),
      attr("max_skip_count", c.max_skip), attr("ngram_counts", c.ngram_counts), attr("ngram_indexes", c.ngram_indexes),
      attr("pool_int64s", c.pool)};
  if (!c.weights.empty()) a.push_back(attr("weights", c.weights));
  return a;
}

// Y by brute force: every n-gram (length n, skip s, start i) of each row compared with every
// pool n-gram of that length.
std::vector<float> brute_force(const TfIdfCase& c, const std::vector<int64_t>& x, int64_t rows, int64_t cols) {
  struct PoolGram {
    std::vector<int64_t> items;
  };
  std::vector<PoolGram> grams;
  for (size_t i = 0; i < c.ngram_counts.size(); ++i) {
    const int64_t n = static_cast<int64_t>(i) + 1;
    const int64_t end = i + 1 < c.ngram_counts.size() ? c.ngram_counts[i + 1] : static_cast<int64_t>(c.pool.size());
    for (int64_t at = c.ngram_counts[i]; at < end; at += n) grams.push_back({{c.pool.begin() + at, c.pool.begin() + at + n}});
  }
  const int64_t out = *std::max_element(c.ngram_indexes.begin(), c.ngram_indexes.end()) + 1;
  std::vector<float> y(static_cast<size_t>(rows * out), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (size_t k = 0; k < grams.size(); ++k) {
      const auto n = static_cast<int64_t>(grams[k].items.size());
      if (n < c.min_gram || n > c.max_gram) continue;
      int64_t count = 0;
      for (int64_t s = 0; s <= (n == 1 ? 0 : c.max_skip); ++s) {
        for (int64_t i = 0; i + (n - 1) * (s + 1) < cols; ++i) {
          bool same = true;
          for (int64_t j = 0; j < n; ++j) same = same && x[r * cols + i + j * (s + 1)] == grams[k].items[j];
          count += same;
        }
      }
      const float w = c.weights.empty() ? 1.0f : c.weights[k];
      const float v = c.mode == "TF" ? float(count) : c.mode == "IDF" ? (count > 0 ? w : 0.0f) : w * float(count);
      y[r * out + c.ngram_indexes[k]] += v;
    }
  }
  return y;
}

TEST(TfIdfVectorizer, DocExampleSkipsTwoItems) {
  // The doc: [94, 17, 36, 12, 28] with 2 skips gives the 2-grams [94, 12] and [17, 28]; with
  // max_skip_count 2, skips 0 and 1 count too ([94, 17] and [94, 36]).
  const TfIdfCase c{"TF", 2, 2, 2, {0, 0}, {0, 1, 2, 3, 4}, {94, 12, 17, 28, 94, 17, 94, 36, 36, 94}, {}};
  const Tensor y = testing::run1("TfIdfVectorizer", 9, tfidf_attrs(c), {testing::i64({94, 17, 36, 12, 28})});
  EXPECT_EQ(y.dtype(), DataType::Float32);
  EXPECT_EQ(y.shape(), (Shape{5}));
  EXPECT_EQ(y.to_double_vector(), (std::vector<double>{1, 1, 1, 1, 0}));
}

TEST(TfIdfVectorizer, MatchesBruteForceInEveryMode) {
  std::mt19937 rng(5);
  const int64_t rows = 3, cols = 17;
  std::vector<int64_t> x(rows * cols);
  for (auto& v : x) v = rng() % 4;  // a small alphabet: many repeats
  // 4 unigrams, 5 bigrams, 3 trigrams (one bigram repeated), reported in a shuffled order with
  // two n-grams sharing coordinate 0.
  TfIdfCase c{"TF", 1, 3, 3, {0, 4, 14},
              {5, 2, 0, 7, 1, 0, 8, 3, 9, 4, 6, 10},
              {0, 1, 2, 3, 0, 1, 1, 1, 2, 0, 3, 3, 0, 1, 0, 1, 2, 3, 3, 3, 1, 0, 2},
              {0.5f, 1.5f, 2.0f, 0.25f, 3.0f, 1.0f, 0.75f, 2.5f, 1.25f, 4.0f, 0.1f, 0.2f}};
  ASSERT_EQ(c.pool.size(), 4u + 10u + 9u);
  const Tensor input = Tensor::from_vector<int64_t>(Shape{rows, cols}, x);
  for (const char* mode : {"TF", "IDF", "TFIDF"}) {
    for (const auto& [lo, hi, skip] : std::vector<std::tuple<int, int, int>>{{1, 3, 3}, {2, 2, 0}, {1, 1, 4}, {2, 3, 1}, {3, 3, 5}}) {
      c.mode = mode, c.min_gram = lo, c.max_gram = hi, c.max_skip = skip;
      const Tensor y = testing::run1("TfIdfVectorizer", 9, tfidf_attrs(c), {input});
      ASSERT_EQ(y.shape(), (Shape{rows, 11}));
      const std::vector<float> want = brute_force(c, x, rows, cols);
      const auto got = y.values<float>();
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_FLOAT_EQ(got[i], want[i]) << mode << " " << lo << ".." << hi << " skip " << skip << " at " << i;
      }
    }
  }
  // int32 input gives the same.
  std::vector<int32_t> x32(x.begin(), x.end());
  c.mode = "TFIDF", c.min_gram = 1, c.max_gram = 3, c.max_skip = 2;
  const Tensor y32 = testing::run1("TfIdfVectorizer", 9, tfidf_attrs(c), {Tensor::from_vector<int32_t>(Shape{rows, cols}, x32)});
  const Tensor y64 = testing::run1("TfIdfVectorizer", 9, tfidf_attrs(c), {input});
  EXPECT_EQ(y32.to_double_vector(), y64.to_double_vector());
}

TEST(TfIdfVectorizer, EmptyRowsGiveZeros) {
  const TfIdfCase c{"TF", 1, 2, 0, {0, 2}, {0, 1, 2}, {5, 6, 5, 6}, {}};
  const Tensor y = testing::run1("TfIdfVectorizer", 9, tfidf_attrs(c), {Tensor::zeros(DataType::Int64, {2, 0})});
  EXPECT_EQ(y.shape(), (Shape{2, 3}));
  EXPECT_EQ(y.to_double_vector(), std::vector<double>(6, 0.0));
}

TEST(TfIdfVectorizer, RejectsBadAttributesAndInputs) {
  const TfIdfCase good{"TF", 1, 2, 0, {0, 2}, {0, 1, 2}, {5, 6, 5, 6}, {}};
  const Tensor x = testing::i64({5, 6});
  const auto rejects = [&](TfIdfCase c, const std::string& needle) {
    try {
      testing::run1("TfIdfVectorizer", 9, tfidf_attrs(c), {x});
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  TfIdfCase c = good;
  c.mode = "BM25";
  rejects(c, "'mode'");
  c = good, c.ngram_counts = {0, 3};  // 1 item of 2-grams
  rejects(c, "ngram_counts");
  c = good, c.ngram_indexes = {0, 1};
  rejects(c, "ngram_indexes");
  c = good, c.weights = {1.0f};
  rejects(c, "weights");
  c = good, c.min_gram = 3;
  rejects(c, "min_gram_length");
  c = good, c.ngram_indexes = {0, -1, 2};
  rejects(c, "ngram_indexes");
  std::vector<onnx::AttributeProto> strings = tfidf_attrs(good);
  strings.push_back(attr("pool_strings", std::vector<std::string>{"a", "b"}));
  EXPECT_THROW(testing::run1("TfIdfVectorizer", 9, strings, {x}), Error);
  try {
    testing::run1("TfIdfVectorizer", 9, tfidf_attrs(good), {testing::i64(Shape{1, 1, 2}, {5, 6})});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'in0'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace onnxtrain
