// NumPy .npy and .npz (https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html).
#include <zip.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>

#include "onnxtrain/error.h"
#include "onnxtrain/io.h"

namespace onnxtrain::io {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

struct DescrEntry {
  const char* code;  // without the byte-order character
  DataType dtype;
};
constexpr DescrEntry kDescrs[] = {
    {"f4", DataType::Float32}, {"f8", DataType::Float64}, {"f2", DataType::Float16},
    {"i1", DataType::Int8},    {"i2", DataType::Int16},   {"i4", DataType::Int32},
    {"i8", DataType::Int64},   {"u1", DataType::UInt8},   {"u2", DataType::UInt16},
    {"u4", DataType::UInt32},  {"u8", DataType::UInt64},  {"b1", DataType::Bool},
};

// The value text after `'key':` in the header dict, up to the next top-level comma or brace.
std::string header_field(const std::string& header, const std::string& key, const std::string& source) {
  const auto at = header.find("'" + key + "'");
  if (at == std::string::npos) throw Error(source + ": .npy header has no '" + key + "'");
  auto pos = header.find(':', at);
  if (pos == std::string::npos) throw Error(source + ": malformed .npy header");
  ++pos;
  while (pos < header.size() && header[pos] == ' ') ++pos;
  size_t end = pos;
  if (end < header.size() && header[end] == '(') {
    end = header.find(')', end);
    if (end == std::string::npos) throw Error(source + ": malformed shape in .npy header");
    return header.substr(pos, end - pos + 1);
  }
  while (end < header.size() && header[end] != ',' && header[end] != '}') ++end;
  return header.substr(pos, end - pos);
}

DataType parse_descr(std::string descr, const std::string& source) {
  if (descr.size() >= 2 && (descr.front() == '\'' || descr.front() == '"')) {
    descr = descr.substr(1, descr.size() - 2);
  }
  if (descr.size() == 3) {
    const char order = descr[0];
    const std::string code = descr.substr(1);
    for (const auto& entry : kDescrs) {
      if (code != entry.code) continue;
      const bool single_byte = code[1] == '1';
      if (order == '>' && !single_byte) {
        throw Error(source + ": big-endian .npy data ('" + descr + "') is not supported");
      }
      if (order == '<' || order == '|' || order == '=' || single_byte) return entry.dtype;
    }
  }
  throw Error(source + ": .npy element type '" + descr +
              "' is not supported (numeric and bool arrays only)");
}

Shape parse_shape(const std::string& text, const std::string& source) {
  Shape shape;
  size_t pos = 1;  // after '('
  while (pos < text.size()) {
    while (pos < text.size() && (text[pos] == ' ' || text[pos] == ',')) ++pos;
    if (pos >= text.size() || text[pos] == ')') break;
    size_t used = 0;
    long long d = 0;
    try {
      d = std::stoll(text.substr(pos), &used);
    } catch (const std::exception&) {
      throw Error(source + ": malformed shape " + text + " in .npy header");
    }
    if (d < 0) throw Error(source + ": negative dim in .npy shape " + text);
    shape.push_back(d);
    pos += used;
    while (pos < text.size() && text[pos] == 'L') ++pos;  // Python 2 longs
  }
  return shape;
}

const char* descr_of(DataType dtype) {
  switch (dtype) {
    case DataType::Float32: return "<f4";
    case DataType::Float64: return "<f8";
    case DataType::Float16: return "<f2";
    case DataType::Int8: return "|i1";
    case DataType::Int16: return "<i2";
    case DataType::Int32: return "<i4";
    case DataType::Int64: return "<i8";
    case DataType::UInt8: return "|u1";
    case DataType::UInt16: return "<u2";
    case DataType::UInt32: return "<u4";
    case DataType::UInt64: return "<u8";
    case DataType::Bool: return "|b1";
    default:
      if (is_narrow_float(dtype) || is_sub_byte_integral(dtype)) {
        throw Error(std::string(dtype_name(dtype)) +
                    " tensors have no .npy element type (NumPy has no float8, float4, float6, "
                    "int4 or int2 dtype; save them in an ONNX TensorProto, or Cast them first)");
      }
      throw Error(std::string(dtype_name(dtype)) +
                  " tensors have no .npy element type (NumPy has no bfloat16)");
  }
}

}  // namespace

Tensor parse_npy(const std::string& bytes, const std::string& source) {
  if (bytes.size() < kMagicSize + 4 || bytes.compare(0, kMagicSize, kMagic, kMagicSize) != 0) {
    throw Error(source + ": not a .npy file (bad magic)");
  }
  const auto major = static_cast<uint8_t>(bytes[6]);
  size_t header_len = 0;
  size_t header_start = 0;
  auto byte = [&](size_t i) { return static_cast<size_t>(static_cast<uint8_t>(bytes[i])); };
  if (major == 1) {
    header_len = byte(8) | (byte(9) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) throw Error(source + ": truncated .npy header");
    header_len = byte(8) | (byte(9) << 8) | (byte(10) << 16) | (byte(11) << 24);
    header_start = 12;
  } else {
    throw Error(source + ": unsupported .npy format version " + std::to_string(major));
  }
  if (header_start + header_len > bytes.size()) throw Error(source + ": truncated .npy header");
  const std::string header = bytes.substr(header_start, header_len);
  const DataType dtype = parse_descr(header_field(header, "descr", source), source);
  if (header_field(header, "fortran_order", source).find("True") != std::string::npos) {
    throw Error(source + ": Fortran-order .npy arrays are not supported (save with C order)");
  }
  const Shape shape = parse_shape(header_field(header, "shape", source), source);
  // numel() may overflow no int64 (a header can declare any dims): the product of max(dim, 1)
  // bounds every partial product.
  uint64_t bound = dtype_size(dtype);
  for (const int64_t d : shape) {
    if (__builtin_mul_overflow(bound, static_cast<uint64_t>(std::max<int64_t>(d, 1)), &bound) ||
        bound > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw Error(source + ": .npy shape " + shape.to_string() + " is too large");
    }
  }
  const size_t data_start = header_start + header_len;
  const uint64_t need = static_cast<uint64_t>(shape.numel()) * dtype_size(dtype);
  if (bytes.size() - data_start != need) {
    throw Error(source + ": .npy data has " + std::to_string(bytes.size() - data_start) +
                " bytes, expected " + std::to_string(need) + " for " +
                std::string(dtype_name(dtype)) + shape.to_string());
  }
  Tensor t(dtype, shape);
  std::memcpy(t.raw_data(), bytes.data() + data_start, need);
  if (dtype == DataType::Bool) {
    bool* p = t.data<bool>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = reinterpret_cast<const uint8_t*>(p)[i] != 0;
  }
  return t;
}

Tensor read_npy(const fs::path& path) { return parse_npy(read_file(path), path.string()); }

std::string serialize_npy(const Tensor& tensor) {
  std::string shape = "(";
  for (size_t i = 0; i < tensor.rank(); ++i) shape += std::to_string(tensor.dim(i)) + ", ";
  if (tensor.rank() > 1) shape.resize(shape.size() - 1), shape.back() = ')';
  else if (tensor.rank() == 1) shape.resize(shape.size() - 1), shape.back() = ',', shape += ")";
  else shape += ")";
  std::string header = std::string("{'descr': '") + descr_of(tensor.dtype()) +
                       "', 'fortran_order': False, 'shape': " + shape + ", }";
  // Pad with spaces so the data starts at a multiple of 64 bytes; end with a newline.
  const size_t unpadded = kMagicSize + 2 + 2 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::string out(kMagic, kMagicSize);
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>((header.size() >> 8) & 0xff);
  out += header;
  out.append(static_cast<const char*>(tensor.raw_data()), tensor.nbytes());
  return out;
}

void write_npy(const Tensor& tensor, const fs::path& path) {
  std::string bytes;
  try {
    bytes = serialize_npy(tensor);
  } catch (const Error& e) {
    throw e.with_context(path.string());
  }
  write_file_atomic(path, bytes);
}

std::vector<std::pair<std::string, Tensor>> read_npz(const fs::path& path) {
  int err = 0;
  std::unique_ptr<zip_t, decltype(&zip_discard)> archive(
      zip_open(path.c_str(), ZIP_RDONLY, &err), &zip_discard);
  if (!archive) {
    zip_error_t error;
    zip_error_init_with_code(&error, err);
    const std::string message = zip_error_strerror(&error);
    zip_error_fini(&error);
    std::error_code ec;
    if (!fs::exists(path, ec)) throw Error(path.string() + ": no such file");
    throw Error(path.string() + ": not a readable .npz archive: " + message);
  }
  std::vector<std::pair<std::string, Tensor>> arrays;
  const zip_int64_t count = zip_get_num_entries(archive.get(), 0);
  for (zip_int64_t i = 0; i < count; ++i) {
    zip_stat_t st;
    if (zip_stat_index(archive.get(), static_cast<zip_uint64_t>(i), 0, &st) != 0) {
      throw Error(path.string() + ": cannot read entry " + std::to_string(i) + " of the archive");
    }
    if (!(st.valid & ZIP_STAT_NAME) || !(st.valid & ZIP_STAT_SIZE) || st.name == nullptr) {
      throw Error(path.string() + ": entry " + std::to_string(i) + " of the archive has no name or size");
    }
    std::string name = st.name;
    const std::string source = path.string() + ":" + name;
    std::unique_ptr<zip_file_t, decltype(&zip_fclose)> file(
        zip_fopen_index(archive.get(), static_cast<zip_uint64_t>(i), 0), &zip_fclose);
    if (!file) throw Error(source + ": cannot open archive entry");
    // Read as the data comes rather than allocating the size the archive claims: a few bytes
    // of a stranger's archive can claim any size.
    std::string bytes;
    char chunk[1 << 16];
    zip_int64_t got = 0;
    while (bytes.size() <= st.size && (got = zip_fread(file.get(), chunk, sizeof(chunk))) > 0) {
      bytes.append(chunk, static_cast<size_t>(got));
    }
    if (got < 0 || bytes.size() != st.size) {
      throw Error(source + ": archive entry is truncated or corrupt");
    }
    if (name.ends_with(".npy")) name.resize(name.size() - 4);
    arrays.emplace_back(name, parse_npy(bytes, source));
  }
  return arrays;
}

}  // namespace onnxtrain::io
