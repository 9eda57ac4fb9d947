// Datasets and the training loop: every dataset format, exact resume, the interrupt
// checkpoint, metrics, and each bad-data case. The Fashion-MNIST run and the PyTorch parity of
// `onnxtrain train` are tests/parity/train_parity.py.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "onnxtrain/dataset.h"
#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "onnxtrain/make_trainable.h"
#include "onnxtrain/trainer.h"
#include "onnxtrain/training.h"
#include "trainer_fixture.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;
using testing::Fixture;
using testing::TempDir;
using testing::weights;

// An IDX file of uint8 with the given dims, raw or gzip-compressed.
void write_idx(const fs::path& path, const std::vector<int32_t>& dims, const std::vector<uint8_t>& data, size_t cut = 0) {
  std::string bytes = {0, 0, 0x08, static_cast<char>(dims.size())};
  for (int32_t d : dims) {
    for (int s = 24; s >= 0; s -= 8) bytes.push_back(static_cast<char>((d >> s) & 0xff));
  }
  bytes.append(reinterpret_cast<const char*>(data.data()), data.size() - cut);
  if (path.extension() == ".gz") {
    gzFile f = gzopen(path.c_str(), "wb");
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
  } else {
    std::ofstream(path, std::ios::binary) << bytes;
  }
}

TEST(Dataset, ReadsIdxFoldersRawAndCompressed) {
  TempDir dir;
  std::vector<uint8_t> images(3 * 2 * 2);
  for (size_t i = 0; i < images.size(); ++i) images[i] = static_cast<uint8_t>(i);
  write_idx(dir.path() / "train-images-idx3-ubyte.gz", {3, 2, 2}, images);
  write_idx(dir.path() / "train-labels-idx1-ubyte", {3}, {7, 8, 9});
  const data::Splits s = data::load_dataset(dir.path());
  EXPECT_EQ(s.format, "idx");
  EXPECT_FALSE(s.test.has_value());
  EXPECT_EQ(s.train.columns.at("image").shape(), (Shape{3, 2, 2}));
  EXPECT_EQ(s.train.columns.at("image").to_double_vector()[5], 5);
  EXPECT_EQ(s.train.columns.at("label").to_double_vector(), (std::vector<double>{7, 8, 9}));
  // Truncated data and a missing partner file are errors naming the file.
  write_idx(dir.path() / "t10k-images-idx3-ubyte", {3, 2, 2}, images, 1);
  write_idx(dir.path() / "t10k-labels-idx1-ubyte", {3}, {1, 2, 3});
  try {
    data::load_dataset(dir.path());
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("t10k-images-idx3-ubyte: truncated IDX file"), std::string::npos) << e.what();
  }
  fs::remove(dir.path() / "t10k-images-idx3-ubyte");
  EXPECT_THROW(data::load_dataset(dir.path()), Error);  // labels without images
}

TEST(Dataset, ReadsNpyFoldersNpzAndCsv) {
  TempDir dir;
  io::write_npy(Tensor::from_vector<float>({2, 2}, {1, 2, 3, 4}), dir.path() / "x.npy");
  io::write_npy(Tensor::from_vector<int64_t>({2}, {0, 1}), dir.path() / "y.npy");
  fs::create_directories(dir.path() / "test");
  io::write_npy(Tensor::from_vector<float>({1, 2}, {5, 6}), dir.path() / "test" / "x.npy");
  io::write_npy(Tensor::from_vector<int64_t>({1}, {1}), dir.path() / "test" / "y.npy");
  const data::Splits npy = data::load_dataset(dir.path());
  EXPECT_EQ(npy.format, "npy");
  EXPECT_EQ(npy.train.size(), 2);
  EXPECT_EQ(npy.test->size(), 1);

  const data::Splits npz = data::load_dataset(fs::path(ONNXTRAIN_TEST_DATA) / "dataset.npz");
  EXPECT_EQ(npz.train.size(), 6);
  EXPECT_EQ(npz.test->columns.at("label").to_double_vector(), (std::vector<double>{1, 2}));

  std::ofstream(dir.path() / "table.csv") << "a, b\n1, 2.5\n3, -4\n";
  std::ofstream(dir.path() / "table_test.csv") << "a,b\n0,0\n";
  const data::Splits csv = data::load_dataset(dir.path() / "table.csv");
  EXPECT_EQ(csv.train.columns.at("b").to_double_vector(), (std::vector<double>{2.5, -4}));
  EXPECT_EQ(csv.test->size(), 1);
  std::ofstream(dir.path() / "bad.csv") << "a,b\n1,x\n";
  EXPECT_THROW(data::load_dataset(dir.path() / "bad.csv"), Error);
  io::write_npy(Tensor::from_vector<int64_t>({3}, {0, 1, 2}), dir.path() / "y.npy");  // 3 labels, 2 samples
  EXPECT_THROW(data::load_dataset(dir.path()), Error);
  EXPECT_THROW(data::load_dataset(dir.path() / "missing"), Error);
}


TEST(Train, LearnsEvaluatesAndWritesMetrics) {
  Fixture f;
  auto o = f.options("trained.onnx");
  o.metrics = f.dir.path() / "metrics.jsonl";
  o.export_inference = f.dir.path() / "inference.onnx";
  std::ostringstream log;
  const auto result = training::train(o, log);
  EXPECT_EQ(result.steps, 9);  // 3 epochs of ceil(12 / 5) batches
  ASSERT_TRUE(result.test_accuracy.has_value());
  EXPECT_GT(*result.test_accuracy, 0.5);
  EXPECT_EQ(io::load_model(o.export_inference).training_info_size(), 0);
  // The result's metadata is the output's (the training metadata with its progress), and so is
  // the in-memory model's.
  const onnx::ModelProto saved = io::load_model(o.output);
  const onnx::ModelProto in_memory = result.session->model(result.metadata);
  ASSERT_EQ(result.metadata.count("onnxtrain.training"), 1U);
  const auto progress = nlohmann::json::parse(result.metadata.at("onnxtrain.training"))["progress"];
  EXPECT_EQ(progress["global_step"], 9);
  EXPECT_EQ(progress["epochs_done"], 3);
  for (const onnx::ModelProto* m : {&saved, &in_memory}) {
    int found = 0;
    for (const auto& e : m->metadata_props()) found += e.key() == "onnxtrain.training" && e.value() == result.metadata.at("onnxtrain.training");
    EXPECT_EQ(found, 1);
  }
  std::ifstream metrics(o.metrics);
  int steps = 0, evals = 0;
  for (std::string line; std::getline(metrics, line);) {
    const auto record = nlohmann::json::parse(line);
    (record["type"] == "eval" ? evals : steps)++;
    if (record["type"] == "step") {
      EXPECT_TRUE(record.contains("lr"));
#if defined(__SANITIZE_ADDRESS__)
      // AddressSanitizer builds give every tensor its own heap block (runtime/memory_plan.cpp):
      // no arena.
      EXPECT_EQ(record["step_arena_bytes"].get<int64_t>(), 0) << line;
#else
      EXPECT_GT(record["step_arena_bytes"].get<int64_t>(), 0) << line;
#endif
      EXPECT_GE(record["threads"].get<int>(), 1) << line;
    }
  }
  EXPECT_EQ(evals, 3);
  EXPECT_GT(steps, 0);
}

TEST(Train, ResumedRunEndsBitIdenticalToAnUninterruptedOne) {
  Fixture f;
  const auto whole = f.options("whole.onnx");
  training::train(whole, std::cout);
  auto first = f.options("first.onnx");
  first.max_steps = 4;  // stops inside the second epoch, after a checkpoint at step 4
  first.checkpoint_every = 4;
  first.checkpoint = f.dir.path() / "ckpt.onnx";
  training::train(first, std::cout);
  auto rest = f.options("resumed.onnx");
  rest.resume = first.checkpoint;
  const auto result = training::train(rest, std::cout);
  EXPECT_EQ(result.steps, 9);
  EXPECT_EQ(weights(f.dir.path() / "resumed.onnx"), weights(f.dir.path() / "whole.onnx"));
  EXPECT_NE(weights(f.dir.path() / "first.onnx"), weights(f.dir.path() / "whole.onnx"));
}

TEST(Train, AnInterruptWritesACheckpointAndStops) {
  Fixture f;
  auto o = f.options("out.onnx");
  const std::atomic<int> stop{SIGINT};
  const auto result = training::train(o, std::cout, &stop);
  EXPECT_EQ(result.signal, SIGINT);
  EXPECT_EQ(result.steps, 1);
  const auto checkpoint = io::load_model(f.dir.path() / "out.ckpt.onnx");
  bool found = false;
  for (const auto& e : checkpoint.metadata_props()) found |= e.key() == "onnxtrain.steps_done" && e.value() == "1";
  EXPECT_TRUE(found);
  EXPECT_FALSE(fs::exists(f.dir.path() / "out.onnx"));
}

std::string train_error(const training::TrainOptions& o) {
  try {
    training::train(o, std::cout);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Train, IntegerColumnsScaledIntoFloatInputsAreCheckedOnlyWhereTheyCanOverflow) {
  // uint8 columns scaled into the float32 input: at 1/255 no value can be NaN or Inf (the check is
  // left out) and the step trains; at 1e37 the column's range can overflow float32 (255e37), so the
  // check runs and names the first value that did (200e37 is Inf in float32), though 1e37 is not.
  Fixture f;
  auto o = f.options("out.onnx");
  o.shuffle = false;
  o.epochs = 1;
  std::vector<uint8_t> pixels(48);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i % 3 == 0 ? 1 : 0);
  io::write_npy(Tensor::from_vector<uint8_t>({12, 4}, pixels), f.data / "x.npy");
  o.scale = {"x=1/255"};
  EXPECT_EQ(training::train(o, std::cout).steps, 3);
  o.scale = {"x=1e37"};
  o.max_steps = 1;
  EXPECT_EQ(training::train(o, std::cout).steps, 1);  // 1e37 and 0 are finite in float32
  o.max_steps = 0;
  pixels[4 * 6 + 1] = 200;  // batch 2 (rows 5 to 9), its element 5
  io::write_npy(Tensor::from_vector<uint8_t>({12, 4}, pixels), f.data / "x.npy");
  EXPECT_NE(train_error(o).find("epoch 1, batch 2: input 'x' holds Inf at element 5"), std::string::npos) << train_error(o);
}

TEST(Train, BadDataIsAClearError) {
  Fixture f;
  // NaN in a batch: named by epoch and batch; the last checkpoint stays.
  auto o = f.options("out.onnx");
  o.shuffle = false;
  Tensor x = io::read_npy(f.data / "x.npy");
  x.data<float>()[4 * 7] = std::nanf("");
  io::write_npy(x, f.data / "x.npy");
  EXPECT_NE(train_error(o).find("epoch 1, batch 2: input 'x' holds NaN"), std::string::npos);
  // A label out of range for the loss.
  x.data<float>()[4 * 7] = 0;
  io::write_npy(x, f.data / "x.npy");
  io::write_npy(Tensor::from_vector<int64_t>({12}, {0, 1, 2, 0, 1, 7, 0, 1, 2, 0, 1, 2}), f.data / "label.npy");
  EXPECT_NE(train_error(o).find("epoch 1, batch 2:"), std::string::npos);
  // An input that reads no column, a --map to a missing input, a fixed batch dim, a bad path.
  io::write_npy(Tensor::from_vector<int64_t>({12}, {0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2}), f.data / "label.npy");
  fs::rename(f.data / "label.npy", f.data / "target.npy");
  EXPECT_NE(train_error(o).find("input 'label' int64[N] reads no column"), std::string::npos) << train_error(o);
  o.map = {"label=target", "nope=x"};
  EXPECT_NE(train_error(o).find("the model has no step input 'nope'"), std::string::npos);
  o.map = {"label=target"};
  o.output = f.dir.path() / "missing_folder" / "out.onnx";
  EXPECT_NE(train_error(o).find("does not exist"), std::string::npos);
  o.output = f.dir.path() / "out.onnx";
  // A fixed batch dim that disagrees with --batch-size.
  onnx::ModelProto fixed = io::load_model(f.model);
  fixed.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(0)->set_dim_value(4);
  io::save_model(fixed, f.dir.path() / "fixed.onnx");
  o.model = f.dir.path() / "fixed.onnx";
  EXPECT_NE(train_error(o).find("input 'x' has a fixed batch dim of 4 but --batch-size is 5"), std::string::npos)
      << train_error(o);
  o.model = f.model;
  o.data = f.dir.path() / "nothing";
  EXPECT_NE(train_error(o).find("no such file or folder"), std::string::npos);
}

}  // namespace
}  // namespace onnxtrain
