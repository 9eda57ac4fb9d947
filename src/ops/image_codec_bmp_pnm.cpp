// BMP, parsed here (Debian packages no BMP library), and PNM through libnetpbm.
//
// BMP (Microsoft's "Bitmap Storage" format): the 14-byte file header, then a core (12-byte) or
// info (40, 52, 56, 64, 108 or 124-byte) header. 1, 4 and 8-bit pixels index a palette (3-byte
// entries after a core header, 4-byte after an info header; colors_used entries, or 2^bpp);
// 16 and 32-bit pixels are split by channel masks (BI_BITFIELDS / BI_ALPHABITFIELDS, or 5-5-5
// and 8-8-8 for BI_RGB) and a field of n bits is scaled as v * 255 / (2^n - 1), truncated, as
// Pillow's BGR;15 and BGR;16 unpackers do; 24-bit pixels are B, G, R. Rows are padded to 4 bytes
// and stored bottom-up unless the height is negative. RLE8 and RLE4 runs (end of line, end of
// bitmap, delta, absolute runs aligned to 2 bytes of the file) are decoded into palette indices,
// pixels no run reaches keeping index 0 (as Pillow's BmpRleDecoder); runs past a row's end are
// cut there. An index past the palette is black. Alpha is dropped; a palette of grays gives a
// gray image. Refused: JPEG/PNG-compressed BMPs, non-contiguous masks, OS/2 compressions.
// PNM: libnetpbm reads PBM, PGM, PPM (plain and raw) and PAM; depth 1-2 gives gray, 3-4 RGB
// (the second or fourth plane being alpha, dropped). Samples are scaled to 8 bits as Pillow does
// for maxval != 255, round(v / maxval * 255) with ties to even. A plain file may end right
// after its last sample (Pillow reads it; libnetpbm is given a newline after it). libnetpbm
// reports errors by longjmp to one process-wide jump buffer (pm_setjmpbuf), so its use is
// serialized by a mutex.
#include <bit>
#include <cctype>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "ops/image_codecs.h"

extern "C" {
#include <pam.h>
}

namespace onnxtrain::ops::image {

namespace {

// --- BMP ---

constexpr uint32_t kBiRgb = 0, kBiRle8 = 1, kBiRle4 = 2, kBiBitfields = 3, kBiAlphaBitfields = 6;

// Little-endian fields of the file, bounds-checked.
struct Bytes {
  std::span<const uint8_t> data;
  void need(size_t offset, size_t n, const char* what) const {
    if (offset > data.size() || n > data.size() - offset) {
      throw ImageDecodeError(std::string("BMP: the file ends inside ") + what);
    }
  }
  uint32_t u16(size_t at) const {
    need(at, 2, "its header");
    return uint32_t{data[at]} | uint32_t{data[at + 1]} << 8;
  }
  uint32_t u32(size_t at) const {
    need(at, 4, "its header");
    return uint32_t{data[at]} | uint32_t{data[at + 1]} << 8 | uint32_t{data[at + 2]} << 16 | uint32_t{data[at + 3]} << 24;
  }
};

// One channel's bit field of a 16 or 32-bit pixel.
struct Field {
  uint32_t mask = 0;
  int shift = 0;
  uint64_t max = 0;  // 2^bits - 1
  explicit Field(uint32_t m) : mask(m) {
    if (m == 0) return;
    shift = std::countr_zero(m);
    const uint32_t bits = m >> shift;
    if ((bits & (bits + 1)) != 0) throw ImageDecodeError("BMP: a channel mask is not contiguous");
    max = bits;
  }
  uint8_t operator()(uint32_t pixel) const {
    if (max == 0) return 0;
    return static_cast<uint8_t>(((pixel & mask) >> shift) * 255 / max);
  }
};

struct BmpInfo {
  int64_t width = 0, height = 0;
  bool top_down = false;
  uint32_t bpp = 0, compression = kBiRgb;
  uint32_t masks[3] = {};
  std::vector<uint8_t> palette;  // RGB triplets, 256 entries (missing ones black)
  bool gray_palette = true;
};

BmpInfo read_bmp_header(const Bytes& b) {
  BmpInfo info;
  const uint32_t header_size = b.u32(14);
  size_t palette_at = 14 + size_t{header_size};
  uint32_t colors_used = 0, entry = 4;
  if (header_size == 12) {
    info.width = b.u16(18);
    info.height = b.u16(20);
    info.bpp = b.u16(24);
    entry = 3;
  } else if (header_size == 40 || header_size == 52 || header_size == 56 || header_size == 64 ||
             header_size == 108 || header_size == 124) {
    info.width = static_cast<int32_t>(b.u32(18));
    info.height = static_cast<int32_t>(b.u32(22));
    info.bpp = b.u16(28);
    info.compression = b.u32(30);
    colors_used = b.u32(46);
    if (info.compression == kBiBitfields || info.compression == kBiAlphaBitfields) {
      for (int c = 0; c < 3; ++c) info.masks[c] = b.u32(54 + 4 * static_cast<size_t>(c));
      if (header_size == 40) palette_at += info.compression == kBiBitfields ? 12 : 16;
    }
  } else {
    throw ImageDecodeError("BMP: a header of " + std::to_string(header_size) + " bytes is not supported");
  }
  info.top_down = info.height < 0;
  info.height = info.top_down ? -info.height : info.height;
  const bool rle_ok = (info.compression == kBiRle8 && info.bpp == 8) || (info.compression == kBiRle4 && info.bpp == 4);
  const bool fields_ok = (info.compression == kBiBitfields || info.compression == kBiAlphaBitfields) &&
                         (info.bpp == 16 || info.bpp == 32);
  const bool plain_ok = info.compression == kBiRgb && (info.bpp == 1 || info.bpp == 4 || info.bpp == 8 ||
                                                       info.bpp == 16 || info.bpp == 24 || info.bpp == 32);
  if (!rle_ok && !fields_ok && !plain_ok) {
    throw ImageDecodeError("BMP: " + std::to_string(info.bpp) + " bits per pixel with compression " +
                           std::to_string(info.compression) + " are not supported");
  }
  if (info.compression == kBiRgb && info.bpp == 16) info.masks[0] = 0x7C00, info.masks[1] = 0x3E0, info.masks[2] = 0x1F;
  if (info.compression == kBiRgb && info.bpp == 32) info.masks[0] = 0xFF0000, info.masks[1] = 0xFF00, info.masks[2] = 0xFF;
  if (info.bpp <= 8) {
    const uint32_t count = colors_used == 0 ? (1u << info.bpp) : std::min<uint32_t>(colors_used, 256);
    b.need(palette_at, size_t{count} * entry, "its palette");
    info.palette.assign(256 * 3, 0);
    for (uint32_t i = 0; i < count; ++i) {
      const uint8_t* bgr = b.data.data() + palette_at + size_t{i} * entry;
      info.palette[i * 3] = bgr[2], info.palette[i * 3 + 1] = bgr[1], info.palette[i * 3 + 2] = bgr[0];
      info.gray_palette = info.gray_palette && bgr[0] == bgr[1] && bgr[1] == bgr[2];
    }
  }
  return info;
}

// RLE8 / RLE4 runs from `at` into palette indices, rows in file order (bottom-up).
std::vector<uint8_t> read_rle(const Bytes& b, size_t at, const BmpInfo& info) {
  const bool rle4 = info.compression == kBiRle4;
  std::vector<uint8_t> indices(static_cast<size_t>(info.width * info.height), 0);
  int64_t x = 0, row = 0;
  const auto put = [&](uint8_t index) {
    if (x < info.width && row < info.height) indices[static_cast<size_t>(row * info.width + x)] = index;
    ++x;
  };
  while (row < info.height) {
    b.need(at, 2, "its pixel data");
    const uint8_t count = b.data[at], value = b.data[at + 1];
    at += 2;
    if (count > 0) {  // a run of `count` pixels
      for (int i = 0; i < count; ++i) put(rle4 ? (i % 2 == 0 ? value >> 4 : value & 15) : value);
    } else if (value == 0) {  // end of line
      x = 0, ++row;
    } else if (value == 1) {  // end of bitmap
      break;
    } else if (value == 2) {  // delta: right, up (in file order)
      b.need(at, 2, "its pixel data");
      x += b.data[at], row += b.data[at + 1];
      at += 2;
    } else {  // absolute: `value` literal pixels, padded to 2 bytes of the file
      const size_t bytes = rle4 ? (value + 1u) / 2 : value;
      b.need(at, bytes, "its pixel data");
      for (int i = 0; i < value; ++i) put(rle4 ? (b.data[at + i / 2] >> (i % 2 == 0 ? 4 : 0)) & 15 : b.data[at + i]);
      at += bytes + (at + bytes) % 2;
    }
  }
  return indices;
}

// Row `row` of the output (top to bottom) from its file bytes `src`.
void convert_bmp_row(const BmpInfo& info, const uint8_t* src, uint8_t* dst, int channels) {
  const Field fields[3] = {Field(info.masks[0]), Field(info.masks[1]), Field(info.masks[2])};
  for (int64_t x = 0; x < info.width; ++x, dst += channels) {
    if (info.bpp <= 8) {
      // 1, 2 or 4 bits packed from the high bits down; otherwise a byte (8 bits, or the indices
      // RLE decoding produced).
      const bool packed = info.compression == kBiRgb && info.bpp < 8;
      const int64_t bit = x * info.bpp;
      const uint32_t index =
          packed ? (src[bit / 8] >> (8 - info.bpp - bit % 8)) & ((1u << info.bpp) - 1) : src[x];
      std::memcpy(dst, &info.palette[index * 3], static_cast<size_t>(channels));
    } else if (info.bpp == 24) {
      dst[0] = src[x * 3 + 2], dst[1] = src[x * 3 + 1], dst[2] = src[x * 3];
    } else {
      const uint8_t* p = src + x * (info.bpp / 8);
      const uint32_t pixel = info.bpp == 16 ? uint32_t{p[0]} | uint32_t{p[1]} << 8
                                            : uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 |
                                                  uint32_t{p[3]} << 24;
      for (int c = 0; c < 3; ++c) dst[c] = fields[c](pixel);
    }
  }
}

// --- PNM ---

std::mutex netpbm_mutex;
char netpbm_message[256];  // written under netpbm_mutex
void netpbm_on_error(const char* message) { std::snprintf(netpbm_message, sizeof netpbm_message, "%s", message); }
void netpbm_quiet(const char*) {}

struct PnmState {
  std::jmp_buf jump;
  std::jmp_buf* previous = nullptr;
  tuple* row = nullptr;
};

// round(v * 255 / maxval), ties to even (Python's round in Pillow's PpmDecoder).
uint8_t scale_sample(uint64_t v, uint64_t maxval) {
  if (maxval == 255) return static_cast<uint8_t>(std::min<uint64_t>(v, 255));
  const uint64_t num = std::min(v, maxval) * 255, q = num / maxval, r2 = 2 * (num % maxval);
  return static_cast<uint8_t>(q + (r2 > maxval || (r2 == maxval && (q & 1)) ? 1 : 0));
}

// Reads the image; false when libnetpbm fails (netpbm_message says why). No object with a
// destructor lives in this frame (libnetpbm longjmps into it).
bool read_pnm(FILE* file, size_t size, PnmState& state, Image8& out) {
  if (setjmp(state.jump) != 0) return false;
  pm_setjmpbufsave(&state.jump, &state.previous);
  struct pam pam;
  pnm_readpaminit(file, &pam, PAM_STRUCT_SIZE(tuple_type));
  if (pam.depth < 1 || pam.depth > 4 || pam.maxval < 1 || pam.width < 1 || pam.height < 1) {
    throw ImageDecodeError("PNM: depth " + std::to_string(pam.depth) + " is not supported");
  }
  // The pixels must fit in what is left of the file: one byte per sample (one per 8 pixels for
  // raw PBM) at least, so a small file cannot claim a huge image.
  const long header = std::ftell(file);
  const uint64_t samples = uint64_t(pam.width) * uint64_t(pam.height) * pam.depth;
  const uint64_t least = pam.format == RPBM_FORMAT ? (uint64_t(pam.width) + 7) / 8 * uint64_t(pam.height) : samples;
  if (header < 0 || least > size - static_cast<size_t>(header)) {
    throw ImageDecodeError("PNM: the file ends inside the image");
  }
  const int channels = pam.depth <= 2 ? 1 : 3;
  allocate(out, pam.height, pam.width, channels);
  state.row = pnm_allocpamrow(&pam);
  uint8_t* dst = out.pixels.data();
  for (int y = 0; y < pam.height; ++y) {
    pnm_readpamrow(&pam, state.row);
    for (int x = 0; x < pam.width; ++x) {
      for (int c = 0; c < channels; ++c) *dst++ = scale_sample(state.row[x][c], pam.maxval);
    }
  }
  return true;
}

}  // namespace

Image8 decode_bmp(std::span<const uint8_t> data) {
  const Bytes b{data};
  const BmpInfo info = read_bmp_header(b);
  const size_t pixels_at = b.u32(10);
  Image8 out;
  const int channels = info.bpp <= 8 && info.gray_palette ? 1 : 3;
  allocate(out, info.height, info.width, channels);
  const size_t stride = static_cast<size_t>((info.width * info.bpp + 31) / 32 * 4);
  std::vector<uint8_t> indices;
  if (info.compression == kBiRle8 || info.compression == kBiRle4) {
    indices = read_rle(b, pixels_at, info);
  } else {
    b.need(pixels_at, stride * static_cast<size_t>(info.height - 1) + static_cast<size_t>((info.width * info.bpp + 7) / 8),
           "its pixel data");
  }
  for (int64_t y = 0; y < info.height; ++y) {
    const int64_t file_row = info.top_down ? y : info.height - 1 - y;
    const uint8_t* src = indices.empty() ? data.data() + pixels_at + stride * static_cast<size_t>(file_row)
                                         : indices.data() + file_row * info.width;
    convert_bmp_row(info, src, out.pixels.data() + y * info.width * channels, channels);
  }
  return out;
}

Image8 decode_pnm(std::span<const uint8_t> data) {
  // libnetpbm needs white space after the last sample of a plain (P1-P3) file, Pillow does not:
  // such a file is read with a newline appended.
  std::vector<uint8_t> padded;
  if (data.size() >= 2 && data[1] >= '1' && data[1] <= '3' && !std::isspace(data.back())) {
    padded.assign(data.begin(), data.end());
    padded.push_back('\n');
    data = padded;
  }
  std::lock_guard<std::mutex> lock(netpbm_mutex);
  FILE* file = fmemopen(const_cast<uint8_t*>(data.data()), data.size(), "rb");
  if (file == nullptr) throw ImageDecodeError("PNM: cannot read the data");
  PnmState state;
  struct Guard {
    FILE* file;
    PnmState& state;
    ~Guard() {
      if (state.row) pnm_freepamrow(state.row);
      pm_setjmpbuf(state.previous);
      std::fclose(file);
    }
  } guard{file, state};
  netpbm_message[0] = '\0';
  pm_setusererrormsgfn(netpbm_on_error);
  pm_setusermessagefn(netpbm_quiet);
  Image8 out;
  if (!read_pnm(file, data.size(), state, out)) throw ImageDecodeError(std::string("PNM: ") + netpbm_message);
  return out;
}

}  // namespace onnxtrain::ops::image
