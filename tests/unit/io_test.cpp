#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "onnxtrain/session.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;

const fs::path kData = ONNXTRAIN_TEST_DATA;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("onnxtrain-io-" + std::to_string(::getpid()) + "-" +
                                         std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }
  size_t entries() const {
    return static_cast<size_t>(std::distance(fs::directory_iterator(path_), fs::directory_iterator()));
  }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// A small valid model: Y = Relu(X) + W, with W an initializer.
onnx::ModelProto small_model() {
  testing::NodeSpec spec{.op_type = "Identity"};
  onnx::ModelProto model = testing::node_model(spec, {Tensor::zeros(DataType::Float32, {2, 3})});
  auto* w = model.mutable_graph()->add_initializer();
  io::tensor_to_proto(Tensor::from_vector<float>({3}, {1, 2, 3}), "W", *w);
  return model;
}

TEST(Npy, ReadsNumpyFiles) {
  Tensor a = io::read_npy(kData / "arange_i4.npy");
  EXPECT_EQ(a.dtype(), DataType::Int32);
  EXPECT_EQ(a.shape(), (Shape{2, 3}));
  EXPECT_EQ(a.to_int64_vector("a"), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  Tensor s = io::read_npy(kData / "scalar_f8.npy");
  EXPECT_EQ(s.rank(), 0u);
  EXPECT_EQ(s.data<double>()[0], 2.5);
  EXPECT_EQ(io::read_npy(kData / "bools.npy").to_int64_vector("b"), (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(io::read_npy(kData / "halfs.npy").to_double_vector(), (std::vector<double>{1.0, -2.0, 0.5}));
}

TEST(Npy, WritesWhatNumpyWrites) {
  Tensor a = Tensor::from_vector<int32_t>({2, 3}, {0, 1, 2, 3, 4, 5});
  EXPECT_EQ(io::serialize_npy(a), io::read_file(kData / "arange_i4.npy"));
}

TEST(Npy, RoundTripsEveryNumpyType) {
  TempDir dir;
  for (DataType dt : {DataType::Float32, DataType::Float64, DataType::Float16, DataType::Int8,
                      DataType::Int16, DataType::Int32, DataType::Int64, DataType::UInt8,
                      DataType::UInt16, DataType::UInt32, DataType::UInt64, DataType::Bool}) {
    Tensor t = Tensor::from_vector<float>({2, 2}, {0, 1, 1, 0}).cast(dt);
    io::write_npy(t, dir / "t.npy");
    Tensor back = io::read_npy(dir / "t.npy");
    EXPECT_EQ(back.dtype(), dt);
    EXPECT_EQ(back.shape(), t.shape());
    EXPECT_EQ(back.to_double_vector(), t.to_double_vector());
  }
  Tensor empty = Tensor::zeros(DataType::Float32, {0, 3});
  io::write_npy(empty, dir / "e.npy");
  EXPECT_EQ(io::read_npy(dir / "e.npy").shape(), (Shape{0, 3}));
  EXPECT_EQ(dir.entries(), 2u);  // no temporary files left behind
}

TEST(Npy, RejectsBadFiles) {
  EXPECT_THROW(io::read_npy(kData / "fortran.npy"), Error);
  EXPECT_THROW(io::read_npy(kData / "big_endian.npy"), Error);
  EXPECT_THROW(io::read_npy(kData / "missing.npy"), Error);
  EXPECT_THROW(io::parse_npy("garbage", "g"), Error);
  const std::string good = io::read_file(kData / "arange_i4.npy");
  for (size_t cut : {size_t{0}, size_t{9}, size_t{60}, good.size() - 1}) {
    EXPECT_THROW(io::parse_npy(good.substr(0, cut), "cut"), Error) << cut;
  }
  std::string object = good;
  object.replace(object.find("<i4"), 3, "|O8");
  EXPECT_THROW(io::parse_npy(object, "object"), Error);
  TempDir dir;
  EXPECT_THROW(io::write_npy(Tensor::zeros(DataType::BFloat16, {1}), dir / "b.npy"), Error);
  EXPECT_EQ(dir.entries(), 0u);
}

TEST(Npz, ReadsStoredAndDeflatedArchives) {
  for (const char* name : {"arrays.npz", "arrays_compressed.npz"}) {
    auto arrays = io::read_npz(kData / name);
    ASSERT_EQ(arrays.size(), 2u) << name;
    EXPECT_EQ(arrays[0].first, "x");
    EXPECT_EQ(arrays[0].second.to_double_vector(), (std::vector<double>{0, 1, 2, 3}));
    EXPECT_EQ(arrays[1].first, "y");
    EXPECT_EQ(arrays[1].second.dtype(), DataType::Int64);
    EXPECT_EQ(arrays[1].second.shape(), (Shape{1, 2}));
  }
  EXPECT_THROW(io::read_npz(kData / "missing.npz"), Error);
  EXPECT_THROW(io::read_npz(kData / "arange_i4.npy"), Error);
}

TEST(TensorProto, ReadsEveryTypedField) {
  onnx::TensorProto p;
  p.set_data_type(onnx::TensorProto::FLOAT);
  p.add_dims(2);
  p.add_float_data(1.5f);
  p.add_float_data(-2.0f);
  EXPECT_EQ(io::tensor_from_proto(p, {}, "t").to_double_vector(), (std::vector<double>{1.5, -2.0}));

  p.Clear();
  p.set_data_type(onnx::TensorProto::INT8);
  p.add_dims(2);
  p.add_int32_data(-3);
  p.add_int32_data(4);
  EXPECT_EQ(io::tensor_from_proto(p, {}, "t").to_int64_vector("t"), (std::vector<int64_t>{-3, 4}));

  p.Clear();
  p.set_data_type(onnx::TensorProto::FLOAT16);
  p.add_int32_data(0x3c00);  // 1.0 as a bit pattern, rank 0
  Tensor h = io::tensor_from_proto(p, {}, "t");
  EXPECT_EQ(h.rank(), 0u);
  EXPECT_EQ(h.to_double_vector()[0], 1.0);

  p.Clear();
  p.set_data_type(onnx::TensorProto::UINT32);
  p.add_dims(1);
  p.add_uint64_data(4000000000u);
  EXPECT_EQ(io::tensor_from_proto(p, {}, "t").to_int64_vector("t")[0], 4000000000);

  p.Clear();
  p.set_data_type(onnx::TensorProto::DOUBLE);
  p.add_dims(1);
  p.add_double_data(0.25);
  EXPECT_EQ(io::tensor_from_proto(p, {}, "t").to_double_vector()[0], 0.25);
}

TEST(TensorProto, RejectsInconsistentTensors) {
  onnx::TensorProto p;
  p.set_name("w");
  p.set_data_type(onnx::TensorProto::FLOAT);
  p.add_dims(3);
  p.add_float_data(1);
  try {
    io::tensor_from_proto(p, {}, "initializer");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("float_data"), std::string::npos) << e.what();
  }
  p.clear_float_data();
  p.set_raw_data(std::string(5, '\0'));
  EXPECT_THROW(io::tensor_from_proto(p, {}, "t"), Error);
  p.set_dims(0, -3);
  EXPECT_THROW(io::tensor_from_proto(p, {}, "t"), Error);
  p.Clear();
  p.add_dims(1);
  EXPECT_THROW(io::tensor_from_proto(p, {}, "t"), Error);  // no data_type
  p.set_data_type(onnx::TensorProto::STRING);
  p.add_string_data("a");
  EXPECT_EQ(io::tensor_from_proto(p, {}, "t").data<std::string>()[0], "a");
  p.add_string_data("b");  // two strings for one element
  EXPECT_THROW(io::tensor_from_proto(p, {}, "t"), Error);
  p.clear_string_data();
  p.set_raw_data("a");  // strings are never raw
  EXPECT_THROW(io::tensor_from_proto(p, {}, "t"), Error);
  p.Clear();
  p.set_data_type(onnx::TensorProto::FLOAT);
  for (int i = 0; i < 4; ++i) p.add_dims(int64_t{1} << 20);  // 2^80 elements
  EXPECT_THROW(io::tensor_from_proto(p, {}, "t"), Error);
}

TEST(TensorProto, PbFilesRoundTrip) {
  TempDir dir;
  Tensor t = Tensor::from_vector<int64_t>({3}, {1, -2, 3});
  io::write_tensor_pb(t, "labels", dir / "t.pb");
  auto [name, back] = io::read_tensor_pb(dir / "t.pb");
  EXPECT_EQ(name, "labels");
  EXPECT_EQ(back.to_int64_vector("t"), t.to_int64_vector("t"));
  write_bytes(dir / "bad.pb", "\xff\xff\xff garbage");
  EXPECT_THROW(io::read_tensor_pb(dir / "bad.pb"), Error);
}

onnx::TensorProto external_tensor(const std::string& location, int offset, int length) {
  onnx::TensorProto p;
  p.set_name("w");
  p.set_data_type(onnx::TensorProto::FLOAT);
  p.add_dims(2);
  p.set_data_location(onnx::TensorProto::EXTERNAL);
  auto add = [&](const char* k, const std::string& v) {
    auto* e = p.add_external_data();
    e->set_key(k);
    e->set_value(v);
  };
  add("location", location);
  if (offset >= 0) add("offset", std::to_string(offset));
  if (length >= 0) add("length", std::to_string(length));
  return p;
}

TEST(ExternalData, ReadsWithOffsetAndLength) {
  TempDir dir;
  const float values[2] = {3.5f, -1.0f};
  std::string bytes(4, 'x');
  bytes.append(reinterpret_cast<const char*>(values), sizeof(values));
  write_bytes(dir / "weights.bin", bytes);
  Tensor t = io::tensor_from_proto(external_tensor("weights.bin", 4, 8), dir.path(), "initializer");
  EXPECT_EQ(t.to_double_vector(), (std::vector<double>{3.5, -1.0}));
  // Without length: the rest of the file.
  Tensor u = io::tensor_from_proto(external_tensor("weights.bin", 4, -1), dir.path(), "initializer");
  EXPECT_EQ(u.to_double_vector(), (std::vector<double>{3.5, -1.0}));
}

TEST(ExternalData, RejectsEscapingMissingAndShortFiles) {
  TempDir dir;
  fs::create_directories(dir / "model");
  write_bytes(dir / "outside.bin", std::string(8, '\0'));
  write_bytes(dir / "model" / "short.bin", std::string(6, '\0'));
  const fs::path base = dir / "model";
  EXPECT_THROW(io::tensor_from_proto(external_tensor("../outside.bin", 0, 8), base, "t"), Error);
  EXPECT_THROW(io::tensor_from_proto(external_tensor((dir / "outside.bin").string(), 0, 8), base, "t"), Error);
  EXPECT_THROW(io::tensor_from_proto(external_tensor("missing.bin", 0, 8), base, "t"), Error);
  EXPECT_THROW(io::tensor_from_proto(external_tensor("short.bin", 0, 8), base, "t"), Error);
  EXPECT_THROW(io::tensor_from_proto(external_tensor("short.bin", 0, 4), base, "t"), Error);  // length != 8
  EXPECT_THROW(io::tensor_from_proto(external_tensor("short.bin", 0, 8), {}, "t"), Error);  // no folder
}

TEST(ModelIo, RejectsMissingEmptyAndGarbageFiles) {
  TempDir dir;
  EXPECT_THROW(io::load_model(dir / "missing.onnx"), Error);
  EXPECT_THROW(io::load_model(dir.path()), Error);  // a folder
  write_bytes(dir / "empty.onnx", "");
  EXPECT_THROW(io::load_model(dir / "empty.onnx"), Error);
  write_bytes(dir / "garbage.onnx", std::string("\x08\x07\x12\xff\xff\xff\xff\x0f garbage", 17));
  EXPECT_THROW(io::load_model(dir / "garbage.onnx"), Error);
  onnx::ModelProto no_graph;
  no_graph.set_ir_version(8);
  EXPECT_THROW(io::parse_model(no_graph.SerializeAsString(), "m"), Error);
}

// Every truncation of a valid model either loads and runs or gives an Error: never a crash.
TEST(ModelIo, TruncatedModelsNeverCrash) {
  const std::string bytes = small_model().SerializeAsString();
  int errors = 0;
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    try {
      onnx::ModelProto m = io::parse_model(bytes.substr(0, cut), "truncated");
      runtime::Session session(m);
      session.run({{"in0", Tensor::zeros(DataType::Float32, {2, 3})}});
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 0);
}

TEST(ModelIo, SaveIsAtomicAndLeavesNoTemporaryFiles) {
  TempDir dir;
  const onnx::ModelProto model = small_model();
  io::save_model(model, dir / "m.onnx");
  io::save_model(model, dir / "m.onnx");  // overwrite
  EXPECT_EQ(dir.entries(), 1u);
  EXPECT_EQ(io::load_model(dir / "m.onnx").SerializeAsString(), model.SerializeAsString());
  // A folder that does not exist: Error naming the path, nothing written.
  try {
    io::save_model(model, dir / "no" / "m.onnx");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("m.onnx"), std::string::npos);
  }
  // The target is a folder: the rename fails, the folder and the old model are intact.
  fs::create_directories(dir / "taken.onnx");
  EXPECT_THROW(io::save_model(model, dir / "taken.onnx"), Error);
  EXPECT_TRUE(fs::is_directory(dir / "taken.onnx"));
  EXPECT_EQ(dir.entries(), 2u);
}

TEST(ModelIo, LargeModelsGoToExternalData) {
  TempDir dir;
  onnx::ModelProto model = small_model();
  io::SaveOptions options;
  options.external_threshold = 64;  // pretend the 2 GiB limit is 64 bytes
  options.external_min_bytes = 8;
  io::save_model(model, dir / "m.onnx", options);
  EXPECT_TRUE(fs::exists(dir / "m.onnx.data"));
  const onnx::ModelProto saved = io::load_model(dir / "m.onnx");
  const auto& w = saved.graph().initializer(0);
  EXPECT_EQ(w.data_location(), onnx::TensorProto::EXTERNAL);
  EXPECT_EQ(io::tensor_from_proto(w, dir.path(), "W").to_double_vector(), (std::vector<double>{1, 2, 3}));
  // Saving elsewhere brings the external data along.
  TempDir other;
  io::SaveOptions inline_options;
  inline_options.source_dir = dir.path();
  io::save_model(saved, other / "copy.onnx", inline_options);
  const onnx::ModelProto copy = io::load_model(other / "copy.onnx");
  EXPECT_EQ(copy.graph().initializer(0).data_location(), onnx::TensorProto::DEFAULT);
  EXPECT_EQ(io::tensor_from_proto(copy.graph().initializer(0), {}, "W").to_double_vector(),
            (std::vector<double>{1, 2, 3}));
}

// A model with variables in the main graph and in a training_info algorithm, saved with their
// values written from the tensors: the file parses to the model save_model writes for the
// filled-in copy (the same message; only the order of fields in the file may differ).
TEST(ModelIo, SaveWithValuesEqualsSavingTheFilledInModel) {
  TempDir dir;
  onnx::ModelProto model = small_model();
  onnx::TensorProto stub;
  stub.set_name("W");  // the kept model's stub: name, type, dims and no data
  stub.set_data_type(onnx::TensorProto::FLOAT);
  stub.add_dims(3);
  *model.mutable_graph()->mutable_initializer(0) = stub;
  auto* info = model.add_training_info();
  info->mutable_algorithm()->set_name("algorithm");
  io::tensor_to_proto(Tensor::from_vector<float>({2}, {9, 8}), "constant", *info->mutable_algorithm()->add_initializer());
  onnx::TensorProto moment = stub;
  moment.set_name("W.moment");
  moment.set_data_type(onnx::TensorProto::DOUBLE);
  *info->mutable_algorithm()->add_initializer() = moment;
  model.add_metadata_props()->set_key("onnxtrain.step");
  const std::map<std::string, Tensor> values{{"W", Tensor::from_vector<float>({3}, {4, 5, 6})},
                                             {"W.moment", Tensor::from_vector<double>({3}, {0.5, -1, 2})}};
  onnx::ModelProto filled = model;
  io::tensor_to_proto(values.at("W"), "W", *filled.mutable_graph()->mutable_initializer(0));
  io::tensor_to_proto(values.at("W.moment"), "W.moment", *filled.mutable_training_info(0)->mutable_algorithm()->mutable_initializer(1));
  io::save_model_with_values(model, values, dir / "streamed.onnx");
  io::save_model(filled, dir / "filled.onnx");
  EXPECT_EQ(io::load_model(dir / "streamed.onnx").SerializeAsString(), io::load_model(dir / "filled.onnx").SerializeAsString());
  EXPECT_EQ(io::load_model(dir / "streamed.onnx").SerializeAsString(), filled.SerializeAsString());
  EXPECT_EQ(dir.entries(), 2u);  // no temporary file left
  // Over the external-data threshold it takes save_model's path: the same model, data outside.
  io::SaveOptions external;
  external.external_threshold = 64;
  external.external_min_bytes = 8;
  TempDir other;
  io::save_model_with_values(model, values, other / "m.onnx", external);
  EXPECT_TRUE(fs::exists(other / "m.onnx.data"));
  const onnx::ModelProto saved = io::load_model(other / "m.onnx");
  EXPECT_EQ(io::tensor_from_proto(saved.graph().initializer(0), other.path(), "W").to_double_vector(),
            (std::vector<double>{4, 5, 6}));
  // A folder that does not exist: Error naming the path.
  EXPECT_THROW(io::save_model_with_values(model, values, dir / "no" / "m.onnx"), Error);
}

// torch.onnx.export writes weights as external data by default; make-trainable brings them in
// before the in-memory ONNX checker runs (which would look for the data file in the current
// folder).
TEST(ModelIo, InlineExternalDataReadsTheModelFolder) {
  TempDir dir;
  io::SaveOptions options;
  options.external_threshold = 64;
  options.external_min_bytes = 8;
  io::save_model(small_model(), dir / "m.onnx", options);
  onnx::ModelProto model = io::load_model(dir / "m.onnx");
  ASSERT_EQ(model.graph().initializer(0).data_location(), onnx::TensorProto::EXTERNAL);
  onnx::ModelProto without_folder = model;
  EXPECT_THROW(io::inline_external_data(without_folder, {}), Error);
  io::inline_external_data(model, dir.path());
  const auto& w = model.graph().initializer(0);
  EXPECT_EQ(w.data_location(), onnx::TensorProto::DEFAULT);
  EXPECT_EQ(w.external_data_size(), 0);
  EXPECT_EQ(w.name(), "W");
  EXPECT_EQ(io::tensor_from_proto(w, {}, "W").to_double_vector(), (std::vector<double>{1, 2, 3}));
}

}  // namespace
}  // namespace onnxtrain

namespace onnxtrain {
namespace {

TEST(TensorProto, WritingKeepsANameThatAliasesTheTarget) {
  // tensor_to_proto(t, proto.name(), proto) must not lose the name while clearing proto.
  onnx::TensorProto proto;
  proto.set_name("weight");
  io::tensor_to_proto(Tensor::from_vector<float>({2}, {1, 2}), proto.name(), proto);
  EXPECT_EQ(proto.name(), "weight");
  EXPECT_EQ(io::tensor_from_proto(proto, {}, "t").to_double_vector(), (std::vector<double>{1, 2}));
}

}  // namespace
}  // namespace onnxtrain

// write_file_atomic: stale temporary files, failures, file-size limits (issue 19).
namespace onnxtrain {
namespace {

namespace fs = std::filesystem;

std::string read_all(const fs::path& path) { return io::read_file(path); }

std::set<std::string> names_in(const fs::path& folder) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder)) names.insert(entry.path().filename().string());
  return names;
}

// The id of a process that has exited and been reaped.
pid_t dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return child;
}

TEST(WriteFileAtomic, RemovesOnlyStaleTemporariesOfTheSameTarget) {
  TempDir dir;
  const std::string dead = std::to_string(dead_pid());
  const std::string live = std::to_string(::getpid());
  const std::vector<std::string> stale = {"m.onnx.tmp-" + dead + "-123", "m.onnx.tmp-" + dead + "-0"};
  const std::vector<std::string> kept = {
      "m.onnx.tmp-" + live + "-7",         // a live writer's
      "other.onnx.tmp-" + dead + "-1",     // another target's
      "xm.onnx.tmp-" + dead + "-1",        // another target's
      "m.onnx.tmp-" + dead + "-",          // not the pattern
      "m.onnx.tmp-" + dead + "-1x",        // not the pattern
      "m.onnx.tmp-" + dead,                // not the pattern
      "m.onnx.tmp--" + dead + "-1",        // not a process id
      "m.onnx.tmp-0-1",                    // kill(0, 0) would mean the process group
      "m.onnx.tmp-99999999999999999999-1", // out of range
      "m.onnx.bak"};
  for (const auto& name : stale) write_bytes(dir / name, "stale");
  for (const auto& name : kept) write_bytes(dir / name, "kept");
  fs::create_directories(dir / ("m.onnx.tmp-" + dead + "-5"));  // a folder is not unlinked
  io::write_file_atomic(dir / "m.onnx", std::string("new"));
  EXPECT_EQ(read_all(dir / "m.onnx"), "new");
  std::set<std::string> want(kept.begin(), kept.end());
  want.insert({"m.onnx", "m.onnx.tmp-" + dead + "-5"});
  EXPECT_EQ(names_in(dir.path()), want);
  for (const auto& name : kept) EXPECT_EQ(read_all(dir / name), "kept") << name;
}

TEST(WriteFileAtomic, WritesThroughAnUnnamedOrAProperlyNamedTemporary) {
  TempDir dir;
  write_bytes(dir / "m.npy", "old");
  std::set<std::string> while_writing;
  io::write_file_atomic(dir / "m.npy", [&](int fd) {
    while_writing = names_in(dir.path());
    return ::write(fd, "new", 3) == 3 ? std::string() : std::string("writing 3 bytes");
  });
  EXPECT_EQ(read_all(dir / "m.npy"), "new");
  EXPECT_EQ(names_in(dir.path()), std::set<std::string>{"m.npy"});
  // O_TMPFILE: nothing but the old file is visible; without it, one "m.npy.tmp-PID-N".
  while_writing.erase("m.npy");
  const std::string prefix = "m.npy.tmp-" + std::to_string(::getpid()) + "-";
  for (const auto& name : while_writing) EXPECT_EQ(name.rfind(prefix, 0), 0u) << name;
  EXPECT_LE(while_writing.size(), 1u);
  // The mode of a created file: 0644 less the umask.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  const auto perms = fs::status(dir / "m.npy").permissions();
  EXPECT_EQ(static_cast<mode_t>(perms) & 0777, 0644 & ~mask);
}

TEST(WriteFileAtomic, AFailingWriteLeavesTheOldFileAndNothingElse) {
  TempDir dir;
  write_bytes(dir / "m.onnx", "old");
  try {
    io::write_file_atomic(dir / "m.onnx", [](int fd) {
      if (::write(fd, "par", 3) != 3) return std::string("writing");
      errno = ENOSPC;
      return std::string("writing 6 bytes");
    });
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string what = e.what();
    const std::string want = "m.onnx: writing 6 bytes failed: " + std::string(std::strerror(ENOSPC));
    EXPECT_NE(what.find(want), std::string::npos) << what;
  }
  EXPECT_THROW(io::write_file_atomic(dir / "m.onnx", [](int) -> std::string { throw std::runtime_error("boom"); }),
               std::runtime_error);
  EXPECT_EQ(names_in(dir.path()), std::set<std::string>{"m.onnx"});
  EXPECT_EQ(read_all(dir / "m.onnx"), "old");
}

// RLIMIT_FSIZE (ulimit -f) with SIGXFSZ ignored: write(2) fails with EFBIG.
TEST(WriteFileAtomic, AFileSizeLimitIsAnErrorNamingTheFile) {
  TempDir dir;
  write_bytes(dir / "big.npy", "old");
  rlimit old_limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  struct sigaction ignore {}, old_action {};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGXFSZ, &ignore, &old_action), 0);
  rlimit limit = old_limit;
  limit.rlim_cur = 1 << 16;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  std::string what;
  try {
    io::write_file_atomic(dir / "big.npy", std::string(1 << 20, 'x'));
  } catch (const Error& e) {
    what = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::sigaction(SIGXFSZ, &old_action, nullptr);
  EXPECT_NE(what.find("big.npy: writing 1048576 bytes failed: " + std::string(std::strerror(EFBIG))), std::string::npos)
      << what;
  EXPECT_EQ(names_in(dir.path()), std::set<std::string>{"big.npy"});
  EXPECT_EQ(read_all(dir / "big.npy"), "old");
}

}  // namespace
}  // namespace onnxtrain
