// TensorProto <-> Tensor, including external data (onnx.proto, "External Tensor Data").
//
// Sub-byte types are packed in TensorProtos and unpacked in Tensors (one element per byte,
// dtype.h). onnx.proto's comments on raw_data and int32_data give the layouts:
//   int4, uint4, float4e2m1  two per byte, the first in the low 4 bits; ceil(n/2) bytes
//   int2, uint2              four per byte, the first in bits 0-1; ceil(n/4) bytes
//   float6e2m3, float6e3m2   raw_data: an LSB-first bit stream, 4 elements in 3 bytes, ceil(6n/8)
//                            bytes; int32_data: one element per entry, in bits 0-5
// raw_data and external data hold those bytes; int32_data holds one packed byte per entry for
// the 4- and 2-bit types and one element per entry for the 8-bit float types. Padding bits
// are ignored when reading and written as 0.
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <fstream>
#include <limits>

#include "core/dispatch.h"
#include "onnxtrain/error.h"
#include "onnxtrain/io.h"

namespace onnxtrain::io {

namespace fs = std::filesystem;

namespace {

// Element count of `dims`, with an Error for negative dims or an overflowing product.
int64_t checked_numel(const Shape& dims, const std::string& what) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d < 0) throw Error(what + ": negative dim in shape " + dims.to_string());
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / 8 / d) {
      throw Error(what + ": shape " + dims.to_string() + " has too many elements");
    }
    n *= d;
  }
  return n;
}

// Resolves an external data location against base_dir, rejecting paths that leave it.
fs::path resolve_location(const std::string& location, const fs::path& base_dir,
                          const std::string& what) {
  if (base_dir.empty()) {
    throw Error(what + ": tensor data is stored in external file '" + location +
                "' but the model's folder is unknown");
  }
  const fs::path rel(location);
  if (location.empty() || rel.is_absolute()) {
    throw Error(what + ": external data location '" + location +
                "' must be a path relative to the model's folder");
  }
  std::error_code ec;
  const fs::path base = fs::weakly_canonical(base_dir, ec);
  const fs::path full = fs::weakly_canonical(base / rel, ec);
  const auto [base_end, full_it] = std::mismatch(base.begin(), base.end(), full.begin(), full.end());
  if (ec || base_end != base.end()) {
    throw Error(what + ": external data location '" + location + "' points outside the folder '" +
                base_dir.string() + "'");
  }
  return full;
}

std::string read_external(const onnx::TensorProto& proto, const fs::path& base_dir,
                          uint64_t expected_bytes, const std::string& what) {
  std::string location;
  uint64_t offset = 0;
  std::optional<uint64_t> length;
  for (const auto& entry : proto.external_data()) {
    try {
      if (entry.key() == "location") location = entry.value();
      else if (entry.key() == "offset") offset = std::stoull(entry.value());
      else if (entry.key() == "length") length = std::stoull(entry.value());
    } catch (const std::exception&) {
      throw Error(what + ": external data field '" + entry.key() + "' has a bad value '" +
                  entry.value() + "'");
    }
  }
  if (location.empty()) throw Error(what + ": external data has no 'location'");
  const fs::path file = resolve_location(location, base_dir, what);
  std::error_code ec;
  const uint64_t file_size = fs::file_size(file, ec);
  if (ec) throw Error(what + ": external data file '" + file.string() + "' cannot be read");
  const uint64_t bytes = length.value_or(file_size >= offset ? file_size - offset : 0);
  if (bytes != expected_bytes) {
    throw Error(what + ": external data length " + std::to_string(bytes) + " does not match the " +
                std::to_string(expected_bytes) + " bytes its shape and type need");
  }
  if (offset > file_size || bytes > file_size - offset) {
    throw Error(what + ": external data file '" + file.string() + "' has " +
                std::to_string(file_size) + " bytes, fewer than offset " + std::to_string(offset) +
                " + length " + std::to_string(bytes));
  }
  std::ifstream in(file, std::ios::binary);
  std::string data(bytes, '\0');
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(data.data(), static_cast<std::streamsize>(bytes));
  if (!in) throw Error(what + ": reading external data file '" + file.string() + "' failed");
  return data;
}

template <class T, class Field>
void copy_field(const Field& field, Tensor& t) {
  T* out = static_cast<T*>(t.raw_data());  // raw: float16/bfloat16 are filled as uint16 bit patterns
  for (int i = 0; i < field.size(); ++i) out[i] = static_cast<T>(field[i]);
}

// Bytes of the packed encoding of n elements (raw_data, external data).
uint64_t packed_bytes(DataType dtype, int64_t n) {
  const auto count = static_cast<uint64_t>(n);
  switch (dtype_bits(dtype)) {
    case 4: return (count + 1) / 2;
    case 2: return (count + 3) / 4;
    case 6: return (count * 6 + 7) / 8;
    default: return count * dtype_size(dtype);
  }
}

// One element's `bits`-bit code, as the Tensor stores it (sign-extended for int4/int2).
uint8_t unpacked_code(DataType dtype, unsigned code) {
  if (dtype == DataType::Int4) return static_cast<uint8_t>(Int4::wrap(code).value);
  if (dtype == DataType::Int2) return static_cast<uint8_t>(Int2::wrap(code).value);
  return static_cast<uint8_t>(code);
}

// Unpacks n elements of a sub-byte dtype from `packed` (packed_bytes(dtype, n) bytes) into t.
void unpack_into(DataType dtype, const uint8_t* packed, int64_t n, Tensor& t) {
  auto* out = static_cast<uint8_t*>(t.raw_data());
  const int bits = dtype_bits(dtype);
  const unsigned mask = (1u << bits) - 1u;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t bit = static_cast<uint64_t>(i) * static_cast<uint64_t>(bits);
    unsigned window = packed[bit / 8];
    if (bit % 8 + static_cast<uint64_t>(bits) > 8) window |= static_cast<unsigned>(packed[bit / 8 + 1]) << 8;
    out[i] = unpacked_code(dtype, (window >> (bit % 8)) & mask);
  }
}

// The packed encoding of a sub-byte tensor (padding bits 0).
std::string pack(const Tensor& t) {
  const int bits = dtype_bits(t.dtype());
  const unsigned mask = (1u << bits) - 1u;
  std::string packed(packed_bytes(t.dtype(), t.numel()), '\0');
  auto* out = reinterpret_cast<uint8_t*>(packed.data());
  const auto* in = static_cast<const uint8_t*>(t.raw_data());
  for (int64_t i = 0; i < t.numel(); ++i) {
    const uint64_t bit = static_cast<uint64_t>(i) * static_cast<uint64_t>(bits);
    const unsigned code = (in[i] & mask) << (bit % 8);
    out[bit / 8] = static_cast<uint8_t>(out[bit / 8] | (code & 0xffu));
    if (code > 0xffu) out[bit / 8 + 1] = static_cast<uint8_t>(out[bit / 8 + 1] | (code >> 8));
  }
  return packed;
}

bool is_packed(DataType dtype) { return dtype_bits(dtype) < 8; }

// A tensor of `dtype` and `shape` from its raw/external bytes (already checked to be
// packed_bytes long).
Tensor from_bytes(DataType dtype, const Shape& shape, int64_t n, const char* bytes) {
  Tensor t(dtype, shape);
  if (is_packed(dtype)) {
    unpack_into(dtype, reinterpret_cast<const uint8_t*>(bytes), n, t);
  } else {
    std::memcpy(t.raw_data(), bytes, t.nbytes());
  }
  return t;
}

// int32_data of a narrow type: one packed byte per entry (4- and 2-bit types) or one element
// per entry (8- and 6-bit types), in the entry's low bits.
Tensor narrow_from_int32_data(DataType dtype, const Shape& shape, int64_t n,
                              const google::protobuf::RepeatedField<int32_t>& field) {
  const int bits = dtype_bits(dtype);
  if (bits == 4 || bits == 2) {
    std::string packed(static_cast<size_t>(field.size()), '\0');
    for (int i = 0; i < field.size(); ++i) packed[static_cast<size_t>(i)] = static_cast<char>(field[i] & 0xff);
    return from_bytes(dtype, shape, n, packed.data());
  }
  Tensor t(dtype, shape);
  auto* out = static_cast<uint8_t*>(t.raw_data());
  const unsigned mask = (1u << bits) - 1u;
  for (int i = 0; i < field.size(); ++i) out[i] = static_cast<uint8_t>(static_cast<unsigned>(field[i]) & mask);
  return t;
}

[[noreturn]] void count_mismatch(const std::string& what, int64_t got, int64_t need,
                                 const char* field) {
  throw Error(what + ": " + field + " holds " + std::to_string(got) + " values but the shape needs " +
              std::to_string(need));
}

}  // namespace

Tensor tensor_from_proto(const onnx::TensorProto& proto, const fs::path& base_dir,
                         const std::string& what_in) {
  const std::string what = proto.name().empty() ? what_in : what_in + " '" + proto.name() + "'";
  if (!proto.has_data_type() || proto.data_type() == 0) throw Error(what + ": data_type is not set");
  const DataType dtype = dtype_from_onnx(proto.data_type(), what);
  if (proto.has_segment()) throw Error(what + ": segmented tensors are not supported");
  Shape shape;
  for (int64_t d : proto.dims()) shape.push_back(d);
  const int64_t n = checked_numel(shape, what);
  if (dtype == DataType::String) {  // string_data only (onnx.proto: strings are never raw)
    if (proto.data_location() == onnx::TensorProto::EXTERNAL || proto.has_raw_data()) {
      throw Error(what + ": a string tensor must keep its values in string_data");
    }
    if (proto.string_data_size() != n) count_mismatch(what, proto.string_data_size(), n, "string_data");
    Tensor t(dtype, shape);
    std::copy(proto.string_data().begin(), proto.string_data().end(), t.data<std::string>());
    return t;
  }
  const uint64_t nbytes = packed_bytes(dtype, n);

  if (proto.data_location() == onnx::TensorProto::EXTERNAL) {
    const std::string data = read_external(proto, base_dir, nbytes, what);
    return from_bytes(dtype, shape, n, data.data());
  }
  if (proto.has_raw_data()) {
    if (proto.raw_data().size() != nbytes) {
      throw Error(what + ": raw_data has " + std::to_string(proto.raw_data().size()) +
                  " bytes but " + std::string(dtype_name(dtype)) + shape.to_string() + " needs " +
                  std::to_string(nbytes));
    }
    return from_bytes(dtype, shape, n, proto.raw_data().data());
  }
  // The typed field that carries this dtype; its length must match before anything is
  // allocated, so a corrupt shape cannot ask for terabytes.
  int field_size = 0;
  const char* field_name = "int32_data";
  switch (dtype) {
    case DataType::Float32: field_size = proto.float_data_size(), field_name = "float_data"; break;
    case DataType::Float64: field_size = proto.double_data_size(), field_name = "double_data"; break;
    case DataType::Int64: field_size = proto.int64_data_size(), field_name = "int64_data"; break;
    case DataType::UInt32:
    case DataType::UInt64: field_size = proto.uint64_data_size(), field_name = "uint64_data"; break;
    default: field_size = proto.int32_data_size(); break;  // every narrower type, and float16 bits
  }
  if (is_narrow_float(dtype) || is_sub_byte_integral(dtype)) {
    const int64_t entries = dtype_bits(dtype) == 4 || dtype_bits(dtype) == 2 ? static_cast<int64_t>(nbytes) : n;
    if (field_size != entries) count_mismatch(what, field_size, entries, field_name);
    return narrow_from_int32_data(dtype, shape, n, proto.int32_data());
  }
  if (field_size != n) count_mismatch(what, field_size, n, field_name);
  Tensor t(dtype, shape);
  switch (dtype) {
    case DataType::Float32: copy_field<float>(proto.float_data(), t); break;
    case DataType::Float64: copy_field<double>(proto.double_data(), t); break;
    case DataType::Int64: copy_field<int64_t>(proto.int64_data(), t); break;
    case DataType::UInt32: copy_field<uint32_t>(proto.uint64_data(), t); break;
    case DataType::UInt64: copy_field<uint64_t>(proto.uint64_data(), t); break;
    default: {
      const auto& field = proto.int32_data();
      switch (dtype) {
        case DataType::Int32: copy_field<int32_t>(field, t); break;
        case DataType::Int16: copy_field<int16_t>(field, t); break;
        case DataType::Int8: copy_field<int8_t>(field, t); break;
        case DataType::UInt16: copy_field<uint16_t>(field, t); break;
        case DataType::UInt8: copy_field<uint8_t>(field, t); break;
        case DataType::Bool: {
          bool* out = t.data<bool>();
          for (int i = 0; i < field.size(); ++i) out[i] = field[i] != 0;
          break;
        }
        case DataType::Float16:
        case DataType::BFloat16: copy_field<uint16_t>(field, t); break;  // same bits
        default: throw_unsupported_dtype(dtype, what);
      }
    }
  }
  return t;
}

void tensor_to_proto(const Tensor& tensor, const std::string& name_in, onnx::TensorProto& proto) {
  const std::string name = name_in;  // may alias proto.name(), which Clear() empties
  proto.Clear();
  if (!name.empty()) proto.set_name(name);
  proto.set_data_type(static_cast<int32_t>(tensor.dtype()));
  for (int64_t d : tensor.shape()) proto.add_dims(d);
  if (tensor.dtype() == DataType::String) {
    for (const std::string& v : tensor.values<std::string>()) proto.add_string_data(v);
    return;
  }
  if (is_packed(tensor.dtype())) {
    proto.set_raw_data(pack(tensor));
  } else {
    proto.set_raw_data(tensor.raw_data(), tensor.nbytes());
  }
}

std::pair<std::string, Tensor> read_tensor_pb(const fs::path& path) {
  const std::string bytes = read_file(path);
  onnx::TensorProto proto;
  if (!proto.ParseFromString(bytes)) {
    throw Error(path.string() + ": not a valid serialized TensorProto");
  }
  return {proto.name(), tensor_from_proto(proto, path.parent_path(), path.string())};
}

void write_tensor_pb(const Tensor& tensor, const std::string& name, const fs::path& path) {
  onnx::TensorProto proto;
  tensor_to_proto(tensor, name, proto);
  write_file_atomic(path, proto.SerializeAsString());
}

}  // namespace onnxtrain::io
