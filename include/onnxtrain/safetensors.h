// Reading and writing safetensors files, the common weights format of Hugging Face and PyTorch.
//
// The format (https://github.com/huggingface/safetensors, README "Format"):
//   8 bytes   N, an unsigned little-endian 64-bit integer: the header's length;
//   N bytes   the header: UTF-8 JSON that starts with '{' and may end in spaces (padding), an
//             object {"NAME": {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]},
//             ..., "__metadata__": {"KEY": "VALUE", ...}} (metadata optional, strings only);
//   the rest  the byte buffer. A tensor's bytes are buffer[BEGIN, END): offsets count from the
//             buffer's start, not the file's. Data is little-endian, row-major (C order).
// The README also requires: no duplicate keys, the buffer "entirely indexed" without holes
// (tensors back to back, no byte outside a tensor, no overlap), empty tensors (a dim of 0, no
// bytes) and scalars (shape []) allowed; the reference implementation caps the header at
// 100,000,000 bytes.
//
// Element types (the format's names <-> DataType): F64 float64, F32 float32, F16 float16, BF16
// bfloat16, I64 int64, I32 int32, I16 int16, I8 int8, U64 uint64, U32 uint32, U16 uint16, U8
// uint8, BOOL bool (one byte, 0 or 1), F8_E4M3 float8e4m3fn, F8_E5M2 float8e5m2, F8_E4M3FNUZ
// float8e4m3fnuz, F8_E5M2FNUZ float8e5m2fnuz (the names safetensors' torch module uses).
// Not supported: C64 (complex), the packed sub-byte types (F4, F6_*), F8_E8M0; and for writing
// string, complex and the sub-byte ONNX types.
//
// read_safetensors reads a file from a stranger: every failure is an Error naming the file (and
// the tensor), and nothing is allocated for tensor data before the header has been checked
// against the file's real size.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "onnxtrain/tensor.h"

namespace onnxtrain::io {

struct SafetensorsLimits {
  // The header's length N; the reference implementation's cap (MAX_HEADER_SIZE).
  uint64_t max_header_bytes = 100'000'000;
  // The whole file (header and buffer); 1 TiB by default.
  uint64_t max_file_bytes = uint64_t{1} << 40;
};

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;            // by name
  std::map<std::string, std::string> metadata;      // "__metadata__", empty when absent
};

// Reads every tensor of a safetensors file. Throws Error ("FILE: ...", naming the tensor where
// there is one) for: a missing or unreadable file; a file shorter than 8 bytes; a header length
// beyond the file or above limits.max_header_bytes, a file above limits.max_file_bytes; a header
// that is not UTF-8 JSON, not an object, does not start with '{', or repeats a key; a tensor
// entry that is not an object of exactly "dtype", "shape" and "data_offsets"; an unknown or
// unsupported dtype; a shape that is not a list of non-negative integers or whose byte size
// overflows; data_offsets that are not two integers BEGIN <= END, or END beyond the buffer;
// END - BEGIN != element count x element size; overlapping tensors, a hole or bytes after the
// last tensor; metadata that is not an object of strings; a BOOL byte other than 0 or 1.
SafetensorsFile read_safetensors(const std::filesystem::path& path,
                                 const SafetensorsLimits& limits = {});

// Writes `tensors` (and `metadata` as "__metadata__" when not empty) atomically (io.h's
// write_file_atomic: a temporary file renamed over `path`). Layout: tensors by element size,
// largest first, then by name, back to back; the header padded with spaces to a multiple of 8
// bytes so that every tensor starts at a multiple of its element size, as the reference writer
// does. Throws Error naming the tensor for an undefined tensor, a dtype the format has no name
// for, or the name "__metadata__"; naming `path` when it cannot be written (nothing is left).
void write_safetensors(const std::filesystem::path& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// "F32" for float32, ...; nullopt for a dtype the format has no supported name for.
std::optional<std::string_view> safetensors_dtype_name(DataType dtype);
// DataType::Undefined for a name not listed above.
DataType dtype_from_safetensors(std::string_view name);

}  // namespace onnxtrain::io
