#include "onnxtrain/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/dispatch.h"
#include "onnxtrain/error.h"
#include "onnxtrain/io.h"

namespace onnxtrain::data {

namespace fs = std::filesystem;

int64_t Dataset::size() const { return columns.empty() ? 0 : columns.begin()->second.dim(0); }

Dataset Dataset::rows(const std::vector<int64_t>& indices) const {
  Dataset out;
  for (const auto& [name, column] : columns) {
    Shape shape = column.shape();
    shape[0] = static_cast<int64_t>(indices.size());
    Tensor t(column.dtype(), shape);
    const size_t row_bytes = column.nbytes() / static_cast<size_t>(std::max<int64_t>(column.dim(0), 1));
    const auto* src = static_cast<const char*>(column.raw_data());
    auto* dst = static_cast<char*>(t.raw_data());
    for (size_t i = 0; i < indices.size(); ++i) {
      std::memcpy(dst + i * row_bytes, src + static_cast<size_t>(indices[i]) * row_bytes, row_bytes);
    }
    out.columns.emplace(name, std::move(t));
  }
  return out;
}

namespace {

// The whole file, inflated when it is gzip-compressed (by name).
std::string read_maybe_gzip(const fs::path& path) {
  if (path.extension() != ".gz") return io::read_file(path);
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw Error(path.string() + ": cannot open");
  std::string data;
  char buffer[1 << 16];
  for (;;) {
    const int n = gzread(f, buffer, sizeof(buffer));
    if (n < 0) {
      int code = 0;
      const std::string message = gzerror(f, &code);
      gzclose(f);
      throw Error(path.string() + ": corrupt gzip data (" + message + ")");
    }
    if (n == 0) break;
    data.append(buffer, static_cast<size_t>(n));
  }
  gzclose(f);
  return data;
}

uint32_t big_endian32(const std::string& s, size_t at) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data() + at);
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

void check_lengths(const Dataset& d, const std::string& what) {
  if (d.columns.empty()) throw Error(what + ": no columns");
  const int64_t n = d.size();
  for (const auto& [name, t] : d.columns) {
    if (t.rank() == 0 || t.dim(0) != n) {
      throw Error(what + ": column '" + name + "' has " + (t.rank() ? std::to_string(t.dim(0)) : "no") +
                  " samples, but '" + d.columns.begin()->first + "' has " + std::to_string(n));
    }
  }
  if (n == 0) throw Error(what + ": the dataset is empty");
}

fs::path find_with_optional_gz(const fs::path& dir, const std::string& name) {
  if (fs::exists(dir / name)) return dir / name;
  if (fs::exists(dir / (name + ".gz"))) return dir / (name + ".gz");
  return {};
}

std::optional<Dataset> idx_split(const fs::path& dir, const std::string& prefix) {
  const fs::path images = find_with_optional_gz(dir, prefix + "-images-idx3-ubyte");
  const fs::path labels = find_with_optional_gz(dir, prefix + "-labels-idx1-ubyte");
  if (images.empty() && labels.empty()) return std::nullopt;
  if (images.empty() || labels.empty()) {
    throw Error(dir.string() + ": found " + (images.empty() ? labels : images).filename().string() +
                " but not its " + (images.empty() ? "images" : "labels") + " file (" + prefix + "-" +
                (images.empty() ? "images-idx3" : "labels-idx1") + "-ubyte[.gz])");
  }
  Dataset d;
  d.columns["image"] = read_idx(images);
  d.columns["label"] = read_idx(labels);
  check_lengths(d, dir.string() + " (" + prefix + ")");
  return d;
}

Dataset npy_folder(const fs::path& dir) {
  Dataset d;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() == ".npy") d.columns[e.path().stem().string()] = io::read_npy(e.path());
  }
  check_lengths(d, dir.string());
  return d;
}

}  // namespace

Tensor read_idx(const fs::path& path) {
  const std::string data = read_maybe_gzip(path);
  const std::string what = path.string();
  if (data.size() < 4 || data[0] != 0 || data[1] != 0) throw Error(what + ": not an IDX file (bad magic number)");
  DataType dtype;
  switch (static_cast<unsigned char>(data[2])) {
    case 0x08: dtype = DataType::UInt8; break;
    case 0x09: dtype = DataType::Int8; break;
    case 0x0B: dtype = DataType::Int16; break;
    case 0x0C: dtype = DataType::Int32; break;
    case 0x0D: dtype = DataType::Float32; break;
    case 0x0E: dtype = DataType::Float64; break;
    default: throw Error(what + ": unknown IDX element type 0x" + std::to_string(static_cast<unsigned char>(data[2])));
  }
  const size_t rank = static_cast<unsigned char>(data[3]);
  if (rank == 0 || data.size() < 4 + 4 * rank) throw Error(what + ": truncated IDX header");
  Shape shape;
  for (size_t d = 0; d < rank; ++d) shape.push_back(big_endian32(data, 4 + 4 * d));
  // The size is checked before the tensor is allocated, and numel() may overflow no int64: 255
  // dims of up to 2^32 - 1 can declare any size. The product of max(dim, 1) bounds every
  // partial product.
  uint64_t bound = dtype_size(dtype);
  for (const int64_t d : shape) {
    if (__builtin_mul_overflow(bound, static_cast<uint64_t>(std::max<int64_t>(d, 1)), &bound) ||
        bound > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw Error(what + ": IDX shape " + shape.to_string() + " is too large");
    }
  }
  const size_t offset = 4 + 4 * rank;
  const uint64_t need = static_cast<uint64_t>(shape.numel()) * dtype_size(dtype);
  if (data.size() - offset != need) {
    throw Error(what + ": truncated IDX file: " + shape.to_string() + " needs " + std::to_string(need) +
                " bytes of data, found " + std::to_string(data.size() - offset));
  }
  Tensor t(dtype, shape);
  std::memcpy(t.raw_data(), data.data() + offset, t.nbytes());
  // IDX stores multi-byte values big-endian.
  const size_t width = dtype_size(dtype);
  if (width > 1) {
    auto* bytes = static_cast<unsigned char*>(t.raw_data());
    for (size_t i = 0; i < t.nbytes(); i += width) std::reverse(bytes + i, bytes + i + width);
  }
  return t;
}

Dataset read_csv(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw Error(path.string() + ": cannot open");
  std::string line;
  if (!std::getline(in, line)) throw Error(path.string() + ": empty file (a header row is required)");
  std::vector<std::string> names;
  {
    std::stringstream header(line);
    std::string name;
    while (std::getline(header, name, ',')) {
      name.erase(0, name.find_first_not_of(" \t\r\""));
      name.erase(name.find_last_not_of(" \t\r\"") + 1);
      if (std::find(names.begin(), names.end(), name) != names.end()) {  // one would be dropped
        throw Error(path.string() + ":1: the header names column '" + name + "' twice");
      }
      names.push_back(name);
    }
  }
  std::vector<std::vector<float>> values(names.size());
  size_t row = 1;
  while (std::getline(in, line)) {
    ++row;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::stringstream fields(line);
    std::string field;
    size_t c = 0;
    while (std::getline(fields, field, ',')) {
      if (c >= names.size()) throw Error(path.string() + ":" + std::to_string(row) + ": more fields than the header has");
      try {
        size_t used = 0;
        values[c].push_back(std::stof(field, &used));
        if (field.find_first_not_of(" \t\r", used) != std::string::npos) throw std::invalid_argument(field);
      } catch (const std::exception&) {
        throw Error(path.string() + ":" + std::to_string(row) + ": column '" + names[c] + "' is not a number: '" + field + "'");
      }
      ++c;
    }
    if (c != names.size()) {
      throw Error(path.string() + ":" + std::to_string(row) + ": " + std::to_string(c) + " fields, the header has " +
                  std::to_string(names.size()));
    }
  }
  Dataset d;
  for (size_t c = 0; c < names.size(); ++c) {
    d.columns[names[c]] = Tensor::from_vector<float>({static_cast<int64_t>(values[c].size())}, values[c]);
  }
  check_lengths(d, path.string());
  return d;
}

Splits load_dataset(const fs::path& spec) {
  if (!fs::exists(spec)) throw Error(spec.string() + ": no such file or folder");
  Splits s;
  if (fs::is_directory(spec)) {
    if (auto train = idx_split(spec, "train")) {
      s.format = "idx";
      s.train = std::move(*train);
      s.test = idx_split(spec, "t10k");
      return s;
    }
    s.format = "npy";
    s.train = npy_folder(spec);
    if (fs::is_directory(spec / "test")) s.test = npy_folder(spec / "test");
    return s;
  }
  const fs::path test_file = spec.parent_path() / (spec.stem().string() + "_test" + spec.extension().string());
  if (spec.extension() == ".npz") {
    s.format = "npz";
    Dataset test;
    for (auto& [name, t] : io::read_npz(spec)) {
      if (name.rfind("test/", 0) == 0) test.columns[name.substr(5)] = std::move(t);
      else s.train.columns[name] = std::move(t);
    }
    check_lengths(s.train, spec.string());
    if (!test.columns.empty()) {
      check_lengths(test, spec.string() + " (test/)");
      s.test = std::move(test);
    } else if (fs::exists(test_file)) {
      Dataset t;
      for (auto& [name, tensor] : io::read_npz(test_file)) t.columns[name] = std::move(tensor);
      check_lengths(t, test_file.string());
      s.test = std::move(t);
    }
    return s;
  }
  if (spec.extension() == ".csv") {
    s.format = "csv";
    s.train = read_csv(spec);
    if (fs::exists(test_file)) s.test = read_csv(test_file);
    return s;
  }
  throw Error(spec.string() + ": not a dataset (expected a folder of IDX or .npy files, a .npz or a .csv file)");
}

}  // namespace onnxtrain::data
