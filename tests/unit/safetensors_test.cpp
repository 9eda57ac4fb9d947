// safetensors read/write (include/onnxtrain/safetensors.h): round trips, files of the Python
// safetensors package both ways (tests/unit/safetensors_peer.py), and hostile files.
#include "onnxtrain/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "onnxtrain/error.h"
#include "onnxtrain/io.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("onnxtrain-st-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  fs::path operator/(const std::string& name) const { return path_ / name; }
  const fs::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

const DataType kAllTypes[] = {
    DataType::Float64, DataType::Float32, DataType::Float16, DataType::BFloat16, DataType::Int64,
    DataType::Int32, DataType::Int16, DataType::Int8, DataType::UInt64, DataType::UInt32,
    DataType::UInt16, DataType::UInt8, DataType::Bool, DataType::Float8E4M3FN, DataType::Float8E5M2,
    DataType::Float8E4M3FNUZ, DataType::Float8E5M2FNUZ};

// Random bytes (0 or 1 for bool).
Tensor random_tensor(DataType dtype, const Shape& shape, std::mt19937& rng) {
  Tensor t(dtype, shape);
  auto* bytes = static_cast<unsigned char*>(t.raw_data());
  for (size_t i = 0; i < t.nbytes(); ++i) bytes[i] = static_cast<unsigned char>(dtype == DataType::Bool ? rng() % 2 : rng() % 256);
  return t;
}

std::string bytes_of(const Tensor& t) {
  return t.nbytes() ? std::string(static_cast<const char*>(t.raw_data()), t.nbytes()) : std::string();
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (char& c : s) {
    c = static_cast<char>(n & 0xff);
    n >>= 8;
  }
  return s;
}

// A file with `header` (JSON text) and `buffer`.
std::string file_of(const std::string& header, const std::string& buffer) {
  return le64(header.size()) + header + buffer;
}

TEST(Safetensors, RoundTripsEveryDtype) {
  TempDir dir;
  std::mt19937 rng(1);
  std::map<std::string, Tensor> tensors;
  for (DataType dt : kAllTypes) {
    const std::string name(dtype_name(dt));
    tensors[name + ".matrix"] = random_tensor(dt, {3, 5}, rng);
    tensors[name + ".scalar"] = random_tensor(dt, {}, rng);
    tensors[name + ".empty"] = random_tensor(dt, {0, 4}, rng);
  }
  const std::map<std::string, std::string> metadata{{"format", "pt"}, {"ünïcode", "√"}};
  io::write_safetensors(dir / "t.safetensors", tensors, metadata);
  const io::SafetensorsFile back = io::read_safetensors(dir / "t.safetensors");
  EXPECT_EQ(back.metadata, metadata);
  ASSERT_EQ(back.tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(back.tensors.count(name)) << name;
    const Tensor& b = back.tensors.at(name);
    EXPECT_EQ(b.dtype(), t.dtype()) << name;
    EXPECT_EQ(b.shape(), t.shape()) << name;
    EXPECT_EQ(bytes_of(b), bytes_of(t)) << name;
  }
}

TEST(Safetensors, WriterPadsTheHeaderAndAlignsEveryTensor) {
  TempDir dir;
  std::mt19937 rng(2);
  std::map<std::string, Tensor> tensors{{"a", random_tensor(DataType::UInt8, {3}, rng)},
                                        {"b", random_tensor(DataType::Float64, {2}, rng)},
                                        {"c", random_tensor(DataType::Float16, {3}, rng)},
                                        {"d", random_tensor(DataType::Int32, {1}, rng)}};
  io::write_safetensors(dir / "t.safetensors", tensors);
  const std::string bytes = io::read_file(dir / "t.safetensors");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ((8 + n) % 8, 0u);
  const json header = json::parse(bytes.substr(8, n));
  EXPECT_FALSE(header.contains("__metadata__"));
  for (const auto& [name, t] : tensors) {
    const uint64_t begin = header[name]["data_offsets"][0].get<uint64_t>();
    EXPECT_EQ(begin % dtype_size(t.dtype()), 0u) << name;
    EXPECT_EQ(bytes.substr(8 + n + begin, t.nbytes()), bytes_of(t)) << name;
  }
  EXPECT_EQ(header["b"]["dtype"], "F64");
  EXPECT_EQ(header["c"]["shape"], json::array({3}));
}

TEST(Safetensors, WriterRefusesWhatTheFormatCannotHoldAndWritesNothing) {
  TempDir dir;
  std::map<std::string, Tensor> tensors{{"ok", Tensor::zeros(DataType::Float32, {2})},
                                        {"s", Tensor(DataType::String, {1})}};
  try {
    io::write_safetensors(dir / "t.safetensors", tensors);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 's'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(io::write_safetensors(dir / "t.safetensors", {{"i4", Tensor::zeros(DataType::Int4, {2})}}), Error);
  EXPECT_THROW(io::write_safetensors(dir / "t.safetensors", {{"__metadata__", Tensor::zeros(DataType::Float32, {2})}}), Error);
  EXPECT_THROW(io::write_safetensors(dir / "t.safetensors", {{"u", Tensor()}}), Error);
  EXPECT_THROW(io::write_safetensors(dir / "t.safetensors", {{std::string("\xff\xfe"), Tensor::zeros(DataType::Float32, {1})}}), Error);
  EXPECT_TRUE(fs::is_empty(dir.path()));
  EXPECT_THROW(io::write_safetensors(dir / "missing" / "t.safetensors", {}), Error);
}

// The project's Python (the test's environment, else the build's).
std::string python() {
  const char* env = std::getenv("ONNXTRAIN_PYTHON");
  return env ? env : ONNXTRAIN_PYTHON_EXE;
}

int run_peer(const std::string& mode, const fs::path& dir) {
  const std::string command = python() + " " + ONNXTRAIN_PEER_SCRIPT + " " + mode + " '" + dir.string() + "'";
  return std::system(command.c_str());
}

TEST(Safetensors, ReadsFilesOfThePythonPackage) {
  TempDir dir;
  ASSERT_EQ(run_peer("write", dir.path()), 0);
  const json manifest = json::parse(io::read_file(dir / "manifest.json"));
  const io::SafetensorsFile file = io::read_safetensors(dir / "py.safetensors");
  EXPECT_EQ(json(file.metadata), manifest["metadata"]);
  ASSERT_EQ(file.tensors.size(), manifest["tensors"].size());
  EXPECT_EQ(manifest["tensors"].size(), std::size(kAllTypes) * 3);
  for (const auto& [name, info] : manifest["tensors"].items()) {
    ASSERT_TRUE(file.tensors.count(name)) << name;
    const Tensor& t = file.tensors.at(name);
    EXPECT_EQ(dtype_name(t.dtype()), info["dtype"].get<std::string>()) << name;
    EXPECT_EQ(t.shape().to_vector(), info["shape"].get<std::vector<int64_t>>()) << name;
    EXPECT_EQ(bytes_of(t), io::read_file(dir / (name + ".bin"))) << name;
  }
}

TEST(Safetensors, ThePythonPackageReadsOurFiles) {
  TempDir dir;
  std::mt19937 rng(3);
  const std::map<std::string, std::string> metadata{{"format", "pt"}, {"producer", "onnxtrain"}};
  std::map<std::string, Tensor> tensors;
  json manifest{{"metadata", metadata}, {"tensors", json::object()}};
  for (DataType dt : kAllTypes) {
    for (const Shape& shape : {Shape{2, 3}, Shape{}, Shape{4, 0}}) {
      const std::string name = std::string(dtype_name(dt)) + "." + std::to_string(shape.size()) + "." + std::to_string(shape.numel());
      tensors[name] = random_tensor(dt, shape, rng);
      manifest["tensors"][name] = {{"dtype", dtype_name(dt)}, {"shape", shape.to_vector()}};
      write_bytes(dir / (name + ".bin"), bytes_of(tensors[name]));
    }
  }
  write_bytes(dir / "manifest.json", manifest.dump());
  io::write_safetensors(dir / "cpp.safetensors", tensors, metadata);
  EXPECT_EQ(run_peer("check", dir.path()), 0);
}

// Hostile files: each is an Error that names the file and says what is wrong.
void expect_error(const std::string& bytes, const std::string& fragment, const io::SafetensorsLimits& limits = {}) {
  TempDir dir;
  const fs::path path = dir / "hostile.safetensors";
  write_bytes(path, bytes);
  try {
    io::read_safetensors(path, limits);
    ADD_FAILURE() << "no error; wanted one with '" << fragment << "'";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind(path.string() + ": ", 0), 0u) << message;
    EXPECT_NE(message.find(fragment), std::string::npos) << "wanted '" << fragment << "' in: " << message;
  }
}

const std::string kF32x2 = R"("dtype": "F32", "shape": [2])";

TEST(SafetensorsHostile, LengthAndJson) {
  expect_error("", "truncated");
  expect_error("abcde", "truncated");
  expect_error(le64(uint64_t{1} << 63) + "{}", "above the limit");
  expect_error(le64(100'000'001) + "{}", "above the limit");
  expect_error(le64(1000) + "{}", "truncated: the header length 1000");
  expect_error(file_of("{", ""), "not valid JSON");
  expect_error(file_of(R"({"a": )", ""), "not valid JSON");
  expect_error(file_of("[1, 2]", ""), "does not start with '{'");
  expect_error(file_of(" {}", ""), "does not start with '{'");
  expect_error(file_of("{} x", ""), "not valid JSON");
  expect_error(file_of("{\"\xff\": 1}", ""), "not valid JSON");  // not UTF-8
  expect_error(file_of(R"({"a": {)" + kF32x2 + R"(, "data_offsets": [0, 8]}, "a": {)" + kF32x2 +
                           R"(, "data_offsets": [0, 8]}})", std::string(8, '\0')),
               "repeats the key 'a'");
  expect_error(file_of(R"({"a": {"dtype": "F32", "dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
                       std::string(8, '\0')),
               "repeats the key 'dtype'");
  expect_error(file_of(R"({"a": 1})", ""), "tensor 'a': expected an object");
  expect_error(file_of(R"({"__metadata__": {"k": 1}})", ""), "__metadata__ 'k' is not a string");
  expect_error(file_of(R"({"__metadata__": [1]})", ""), "__metadata__ is not an object");
  expect_error(file_of(std::string(R"({"a": {)") + kF32x2 + R"(, "data_offsets": [0, 8], "x": 1}})", std::string(8, '\0')),
               "tensor 'a': unexpected key 'x'");
  expect_error(file_of(R"({"a": {"dtype": "F32", "shape": [2]}})", ""), "tensor 'a': needs the keys");
  expect_error(io::read_file(fs::path(ONNXTRAIN_PEER_SCRIPT)), "above the limit");  // "\"\"\"The P..." as a length
  expect_error(file_of("{}", "") + "xy", "at the end of the buffer belong to no tensor", {});
  expect_error(file_of("{}", ""), "above the limit", {.max_header_bytes = 100, .max_file_bytes = 9});
}

TEST(SafetensorsHostile, DtypesAndShapes) {
  const std::string data(8, '\0');
  expect_error(file_of(R"({"a": {"dtype": "F128", "shape": [2], "data_offsets": [0, 8]}})", data),
               "tensor 'a': unknown or unsupported dtype 'F128'");
  expect_error(file_of(R"({"a": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}})", data), "unsupported dtype 'C64'");
  expect_error(file_of(R"({"a": {"dtype": 1, "shape": [2], "data_offsets": [0, 8]}})", data), "dtype is not a string");
  expect_error(file_of(R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", data), "a dim of the shape is -2");
  expect_error(file_of(R"({"a": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}})", data), "non-negative integer");
  expect_error(file_of(R"({"a": {"dtype": "F32", "shape": 2, "data_offsets": [0, 8]}})", data), "shape is not a list");
  expect_error(file_of(R"({"a": {"dtype": "F32", "shape": [4611686018427387904, 4611686018427387904], "data_offsets": [0, 0]}})", ""),
               "too large");
  expect_error(file_of(R"({"a": {"dtype": "F64", "shape": [2305843009213693952], "data_offsets": [0, 0]}})", ""), "too large");
  expect_error(file_of(R"({"a": {"dtype": "F32", "shape": [18446744073709551615], "data_offsets": [0, 0]}})", ""), "too large");
  expect_error(file_of(R"({"a": {"dtype": "F32", "shape": [0, 4611686018427387904, 4611686018427387904], "data_offsets": [0, 0]}})", ""),
               "too large");
  expect_error(file_of(R"({"a": {"dtype": "BOOL", "shape": [2], "data_offsets": [0, 2]}})", std::string("\x01\x02", 2)),
               "tensor 'a': a BOOL byte is 2");
}

TEST(SafetensorsHostile, Offsets) {
  const std::string a = R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": )";
  expect_error(file_of(a + "[0]}}", std::string(8, '\0')), "tensor 'a': data_offsets is [0], expected [BEGIN, END]");
  expect_error(file_of(a + "[0, 8, 8]}}", std::string(8, '\0')), "expected [BEGIN, END]");
  expect_error(file_of(a + "{}}}", std::string(8, '\0')), "expected [BEGIN, END]");
  expect_error(file_of(a + R"(["0", 8]}})", std::string(8, '\0')), "data_offsets BEGIN is \"0\"");
  expect_error(file_of(a + "[0, -8]}}", std::string(8, '\0')), "data_offsets END is -8");
  expect_error(file_of(a + "[8, 0]}}", std::string(8, '\0')), "BEGIN > END");
  expect_error(file_of(a + "[0, 8]}}", std::string(7, '\0')), "ends beyond the buffer of 7 bytes");
  expect_error(file_of(a + "[0, 18446744073709551615]}}", std::string(8, '\0')), "ends beyond the buffer");
  expect_error(file_of(a + "[0, 4]}}", std::string(4, '\0')), "span 4 bytes, but dtype F32 and shape [2] need 8");
  // Overlap, hole, trailing bytes.
  const std::string b = R"(, "b": {"dtype": "F32", "shape": [2], "data_offsets": )";
  expect_error(file_of(a + "[0, 8]}" + b + "[4, 12]}}", std::string(12, '\0')), "tensor 'b': its bytes [4, 12) overlap tensor 'a'");
  expect_error(file_of(a + "[0, 8]}" + b + "[0, 8]}}", std::string(8, '\0')), "overlap");
  expect_error(file_of(a + "[0, 8]}" + b + "[12, 20]}}", std::string(20, '\0')), "a hole in the buffer: bytes [8, 12)");
  expect_error(file_of(a + "[4, 12]}}", std::string(12, '\0')), "a hole in the buffer: bytes [0, 4)");
  expect_error(file_of(a + "[0, 8]}}", std::string(10, '\0')), "bytes [8, 10) at the end of the buffer");
}

TEST(SafetensorsHostile, TruncatedFilesOfOurWriter) {
  TempDir dir;
  std::mt19937 rng(4);
  io::write_safetensors(dir / "t.safetensors", {{"w", random_tensor(DataType::Float32, {64, 3}, rng)},
                                                 {"b", random_tensor(DataType::Float32, {3}, rng)}});
  const std::string whole = io::read_file(dir / "t.safetensors");
  for (size_t cut : {size_t{0}, size_t{4}, size_t{8}, size_t{20}, whole.size() / 2, whole.size() - 1}) {
    SCOPED_TRACE(cut);
    expect_error(whole.substr(0, cut), cut < 8 ? "truncated" : cut < 100 ? "" : "ends beyond the buffer");
  }
  // Empty tensors sit between others without a hole.
  io::write_safetensors(dir / "e.safetensors", {{"e", Tensor::zeros(DataType::Float64, {0})},
                                                 {"f", Tensor::zeros(DataType::Float64, {1})},
                                                 {"g", Tensor::zeros(DataType::UInt8, {0, 3})}});
  EXPECT_EQ(io::read_safetensors(dir / "e.safetensors").tensors.size(), 3u);
}

TEST(SafetensorsHostile, MissingFileAndFolder) {
  TempDir dir;
  EXPECT_THROW(io::read_safetensors(dir / "none.safetensors"), Error);
  EXPECT_THROW(io::read_safetensors(dir.path()), Error);
}

}  // namespace
}  // namespace onnxtrain
