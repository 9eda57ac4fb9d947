// safetensors files: see include/onnxtrain/safetensors.h for the format and the checks.
#include "onnxtrain/safetensors.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "onnxtrain/error.h"
#include "onnxtrain/io.h"

namespace onnxtrain::io {

namespace fs = std::filesystem;
using nlohmann::json;

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host would need byte swaps");

namespace {

constexpr std::string_view kMetadataKey = "__metadata__";

struct DtypeName {
  std::string_view name;
  DataType dtype;
};
constexpr DtypeName kDtypes[] = {
    {"F64", DataType::Float64},   {"F32", DataType::Float32},
    {"F16", DataType::Float16},   {"BF16", DataType::BFloat16},
    {"I64", DataType::Int64},     {"I32", DataType::Int32},
    {"I16", DataType::Int16},     {"I8", DataType::Int8},
    {"U64", DataType::UInt64},    {"U32", DataType::UInt32},
    {"U16", DataType::UInt16},    {"U8", DataType::UInt8},
    {"BOOL", DataType::Bool},     {"F8_E4M3", DataType::Float8E4M3FN},
    {"F8_E5M2", DataType::Float8E5M2}, {"F8_E4M3FNUZ", DataType::Float8E4M3FNUZ},
    {"F8_E5M2FNUZ", DataType::Float8E5M2FNUZ},
};

[[noreturn]] void fail(const fs::path& path, const std::string& message) {
  throw Error(path.string() + ": " + message);
}

std::string quoted(const std::string& name) { return "tensor '" + name + "'"; }

// Reads exactly `size` bytes at `offset`; a short file is reported as truncated.
void read_at(int fd, char* out, uint64_t size, uint64_t offset, const fs::path& path) {
  while (size > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(size, uint64_t{1} << 30));
    const ssize_t n = ::pread(fd, out, chunk, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(path, std::string("read failed: ") + std::strerror(errno));
    if (n == 0) fail(path, "truncated: the file ended while reading it");
    out += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<uint64_t>(n);
  }
}

// Parses the header, refusing a repeated key in any object (nlohmann keeps the last one).
json parse_header(const std::string& text, const fs::path& path) {
  if (text.empty() || text.front() != '{') fail(path, "the header does not start with '{'");
  std::vector<std::set<std::string>> keys;  // of each object being parsed
  std::string duplicate;
  const json::parser_callback_t callback = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) keys.emplace_back();
    if (event == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == json::parse_event_t::key && !keys.empty() &&
        !keys.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text, callback);
  } catch (const json::exception& e) {
    fail(path, std::string("the header is not valid JSON: ") + e.what());
  }
  if (!duplicate.empty()) fail(path, "the header repeats the key '" + duplicate + "'");
  if (!header.is_object()) fail(path, "the header is not a JSON object");
  return header;
}

struct Entry {
  std::string name;
  DataType dtype = DataType::Undefined;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

uint64_t unsigned_of(const json& value, const fs::path& path, const std::string& what) {
  if (!value.is_number_unsigned()) {
    fail(path, what + " is " + value.dump() + ", expected a non-negative integer");
  }
  return value.get<uint64_t>();
}

// The entry of one tensor, its byte size checked against its offsets and `buffer_size`.
Entry parse_entry(const std::string& name, const json& info, uint64_t buffer_size,
                  const fs::path& path) {
  const std::string label = quoted(name);
  if (!info.is_object()) fail(path, label + ": expected an object with dtype, shape and data_offsets");
  for (const auto& [key, value] : info.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      fail(path, label + ": unexpected key '" + key + "'");
    }
  }
  if (!info.contains("dtype") || !info.contains("shape") || !info.contains("data_offsets")) {
    fail(path, label + ": needs the keys dtype, shape and data_offsets");
  }
  Entry entry{.name = name};
  const json& dtype = info["dtype"];
  if (!dtype.is_string()) fail(path, label + ": dtype is not a string");
  entry.dtype = dtype_from_safetensors(dtype.get<std::string>());
  if (entry.dtype == DataType::Undefined) {
    fail(path, label + ": unknown or unsupported dtype '" + dtype.get<std::string>() + "'");
  }
  const json& shape = info["shape"];
  if (!shape.is_array()) fail(path, label + ": shape is not a list");
  // The product of max(dim, 1) bounds every partial product, so numel never overflows later.
  uint64_t bound = dtype_size(entry.dtype);
  uint64_t bytes = dtype_size(entry.dtype);
  for (const json& d : shape) {
    const uint64_t dim = unsigned_of(d, path, label + ": a dim of the shape");
    if (__builtin_mul_overflow(bound, std::max<uint64_t>(dim, 1), &bound) ||
        bound > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail(path, label + ": the shape " + shape.dump() + " is too large (its byte size overflows)");
    }
    bytes *= dim;
    entry.shape.push_back(static_cast<int64_t>(dim));
  }
  const json& offsets = info["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    fail(path, label + ": data_offsets is " + offsets.dump() + ", expected [BEGIN, END]");
  }
  entry.begin = unsigned_of(offsets[0], path, label + ": data_offsets BEGIN");
  entry.end = unsigned_of(offsets[1], path, label + ": data_offsets END");
  if (entry.begin > entry.end) fail(path, label + ": data_offsets " + offsets.dump() + " has BEGIN > END");
  if (entry.end > buffer_size) {
    fail(path, label + ": data_offsets " + offsets.dump() + " ends beyond the buffer of " +
                   std::to_string(buffer_size) + " bytes");
  }
  if (entry.end - entry.begin != bytes) {
    fail(path, label + ": data_offsets " + offsets.dump() + " span " + std::to_string(entry.end - entry.begin) +
                   " bytes, but dtype " + dtype.get<std::string>() + " and shape " + shape.dump() +
                   " need " + std::to_string(bytes));
  }
  return entry;
}

std::map<std::string, std::string> parse_metadata(const json& metadata, const fs::path& path) {
  if (!metadata.is_object()) fail(path, "__metadata__ is not an object");
  std::map<std::string, std::string> result;
  for (const auto& [key, value] : metadata.items()) {
    if (!value.is_string()) fail(path, "__metadata__ '" + key + "' is not a string");
    result[key] = value.get<std::string>();
  }
  return result;
}

// The buffer must be covered exactly: tensors back to back from 0 to buffer_size.
void check_coverage(std::vector<Entry>& entries, uint64_t buffer_size, const fs::path& path) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    if (e.begin < covered) {
      fail(path, quoted(e.name) + ": its bytes [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                     ") overlap " + quoted(previous->name));
    }
    if (e.begin > covered) {
      fail(path, "a hole in the buffer: bytes [" + std::to_string(covered) + ", " + std::to_string(e.begin) +
                     ") belong to no tensor (before " + quoted(e.name) + ")");
    }
    covered = e.end;
    previous = &e;
  }
  if (covered != buffer_size) {
    fail(path, "bytes [" + std::to_string(covered) + ", " + std::to_string(buffer_size) +
                   ") at the end of the buffer belong to no tensor");
  }
}

Tensor read_tensor(int fd, const Entry& e, uint64_t buffer_start, const fs::path& path) {
  Tensor tensor(e.dtype, e.shape);
  read_at(fd, static_cast<char*>(tensor.raw_data()), e.end - e.begin, buffer_start + e.begin, path);
  if (e.dtype == DataType::Bool) {
    const auto* bytes = static_cast<const unsigned char*>(tensor.raw_data());
    for (uint64_t i = 0; i < e.end - e.begin; ++i) {
      if (bytes[i] > 1) fail(path, quoted(e.name) + ": a BOOL byte is " + std::to_string(bytes[i]) + ", not 0 or 1");
    }
  }
  return tensor;
}

}  // namespace

std::optional<std::string_view> safetensors_dtype_name(DataType dtype) {
  for (const DtypeName& d : kDtypes) {
    if (d.dtype == dtype) return d.name;
  }
  return std::nullopt;
}

DataType dtype_from_safetensors(std::string_view name) {
  for (const DtypeName& d : kDtypes) {
    if (d.name == name) return d.dtype;
  }
  return DataType::Undefined;
}

SafetensorsFile read_safetensors(const fs::path& path, const SafetensorsLimits& limits) {
  SafetensorsFile result;
  read_file(path, [&](int fd) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) fail(path, std::string("cannot stat: ") + std::strerror(errno));
    const auto file_size = static_cast<uint64_t>(st.st_size);
    if (file_size > limits.max_file_bytes) {
      fail(path, "the file has " + std::to_string(file_size) + " bytes, above the limit of " +
                     std::to_string(limits.max_file_bytes));
    }
    if (file_size < 8) fail(path, "truncated: " + std::to_string(file_size) + " bytes, shorter than the 8-byte header length");
    unsigned char length_bytes[8];
    read_at(fd, reinterpret_cast<char*>(length_bytes), 8, 0, path);
    uint64_t header_size = 0;
    for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | length_bytes[i];
    if (header_size > limits.max_header_bytes) {
      fail(path, "the header length " + std::to_string(header_size) + " is above the limit of " +
                     std::to_string(limits.max_header_bytes) + " bytes");
    }
    if (header_size > file_size - 8) {
      fail(path, "truncated: the header length " + std::to_string(header_size) + " goes beyond the file's " +
                     std::to_string(file_size) + " bytes");
    }
    std::string text(static_cast<size_t>(header_size), '\0');
    read_at(fd, text.data(), header_size, 8, path);
    const json header = parse_header(text, path);
    const uint64_t buffer_start = 8 + header_size;
    const uint64_t buffer_size = file_size - buffer_start;
    std::vector<Entry> entries;
    for (const auto& [key, value] : header.items()) {
      if (key == kMetadataKey) {
        result.metadata = parse_metadata(value, path);
      } else {
        entries.push_back(parse_entry(key, value, buffer_size, path));
      }
    }
    check_coverage(entries, buffer_size, path);
    for (const Entry& e : entries) result.tensors.emplace(e.name, read_tensor(fd, e, buffer_start, path));
  });
  return result;
}

namespace {

// Writes all of `size` bytes; "" on success, else the failed action (write_file_atomic).
std::string write_all(int fd, const char* data, uint64_t size) {
  const uint64_t total = size;
  while (size > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(size, uint64_t{1} << 30));
    const ssize_t n = ::write(fd, data, chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return "writing " + std::to_string(total) + " bytes";
    data += n;
    size -= static_cast<uint64_t>(n);
  }
  return "";
}

struct Item {
  const std::string* name;
  const Tensor* tensor;
  std::string_view dtype;
};

}  // namespace

void write_safetensors(const fs::path& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<Item> items;
  for (const auto& [name, tensor] : tensors) {
    if (name == kMetadataKey) fail(path, "a tensor cannot be named " + std::string(kMetadataKey));
    if (!tensor.defined()) fail(path, quoted(name) + ": undefined tensor");
    const auto dtype = safetensors_dtype_name(tensor.dtype());
    if (!dtype) {
      fail(path, quoted(name) + ": safetensors has no supported type for " + std::string(dtype_name(tensor.dtype())));
    }
    items.push_back({&name, &tensor, *dtype});
  }
  // Largest elements first: with the header padded to 8 bytes every tensor is then aligned.
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return dtype_size(a.tensor->dtype()) > dtype_size(b.tensor->dtype());
  });
  json header = json::object();
  if (!metadata.empty()) header[std::string(kMetadataKey)] = metadata;
  uint64_t offset = 0;
  for (const Item& item : items) {
    const uint64_t end = offset + item.tensor->nbytes();
    header[*item.name] = {{"dtype", item.dtype},
                          {"shape", item.tensor->shape().to_vector()},
                          {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception&) {
    fail(path, "a tensor name or a metadata string is not valid UTF-8");
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // 8 + text.size() is then a multiple of 8
  write_file_atomic(path, [&](int fd) {
    char length[8];
    uint64_t n = text.size();
    for (char& byte : length) {
      byte = static_cast<char>(n & 0xff);
      n >>= 8;
    }
    std::string failed = write_all(fd, length, 8);
    if (failed.empty()) failed = write_all(fd, text.data(), text.size());
    for (const Item& item : items) {
      if (!failed.empty()) break;
      failed = write_all(fd, static_cast<const char*>(item.tensor->raw_data()), item.tensor->nbytes());
    }
    return failed;
  });
}

}  // namespace onnxtrain::io
