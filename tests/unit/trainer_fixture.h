// The training loop's test fixture: a 4 -> 3 linear classifier made trainable with momentum
// SGD, and a dataset of 12 samples in a folder of .npy files (with a test split).
#pragma once

#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "onnxtrain/io.h"
#include "onnxtrain/make_trainable.h"
#include "onnxtrain/trainer.h"

namespace onnxtrain::testing {

namespace fs = std::filesystem;

class TempDir {
 public:
  // Unique per process too: ctest runs each test case as its own process, in parallel.
  TempDir()
      : path_(fs::temp_directory_path() /
              ("onnxtrain_trainer_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

// A 4 -> 3 linear classifier made trainable with SGD, and a dataset of 12 samples.
struct Fixture {
  TempDir dir;
  fs::path model, data;
  Fixture() {
    onnx::ModelProto m;
    m.set_ir_version(8);
    m.add_opset_import()->set_version(17);
    auto& g = *m.mutable_graph();
    g.set_name("linear");
    auto typed = [](onnx::ValueInfoProto* v, const std::string& name, std::vector<int64_t> dims) {
      v->set_name(name);
      auto* t = v->mutable_type()->mutable_tensor_type();
      t->set_elem_type(onnx::TensorProto::FLOAT);
      for (int64_t d : dims) {
        if (d < 0) t->mutable_shape()->add_dim()->set_dim_param("N");
        else t->mutable_shape()->add_dim()->set_dim_value(d);
      }
    };
    typed(g.add_input(), "x", {-1, 4});
    typed(g.add_output(), "logits", {-1, 3});
    std::vector<float> w(12, 0.05f);
    io::tensor_to_proto(Tensor::from_vector<float>({4, 3}, w), "W", *g.add_initializer());
    auto* n = g.add_node();
    n->set_op_type("MatMul");
    n->add_input("x");
    n->add_input("W");
    n->add_output("logits");
    training::MakeTrainableOptions options;
    options.optimizer = training::Optimizer::Momentum;
    options.lr = 0.1;
    model = dir.path() / "model.onnx";
    io::save_model(training::make_trainable(m, options), model);
    data = dir.path() / "data";
    fs::create_directories(data / "test");
    std::vector<float> x(48);
    std::vector<int64_t> label(12);
    for (size_t i = 0; i < 12; ++i) {
      label[i] = static_cast<int64_t>(i % 3);
      for (size_t k = 0; k < 4; ++k) x[i * 4 + k] = std::cos(static_cast<float>(i * 4 + k)) + (k == i % 3 ? 1.0f : 0.0f);
    }
    io::write_npy(Tensor::from_vector<float>({12, 4}, x), data / "x.npy");
    io::write_npy(Tensor::from_vector<int64_t>({12}, label), data / "label.npy");
    io::write_npy(Tensor::from_vector<float>({12, 4}, x), data / "test" / "x.npy");
    io::write_npy(Tensor::from_vector<int64_t>({12}, label), data / "test" / "label.npy");
  }
  training::TrainOptions options(const std::string& out) const {
    training::TrainOptions o;
    o.model = model;
    o.data = data;
    o.output = dir.path() / out;
    o.batch_size = 5;
    o.epochs = 3;
    o.seed = 4;
    o.quiet = true;
    return o;
  }
};

// The trained weight W of the model at `path`, as raw bytes.
inline std::string weights(const fs::path& path) {
  const onnx::ModelProto model = io::load_model(path);
  for (const auto& t : model.graph().initializer()) {
    if (t.name() == "W") return t.raw_data();
  }
  return {};
}

}  // namespace onnxtrain::testing
