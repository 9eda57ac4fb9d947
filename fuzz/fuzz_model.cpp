// Fuzz harness: ModelProto bytes through everything that reads a model before it runs:
//   io::parse_model (io.h), the ONNX checker, training::validate_training_info (training.h)
//   and planning: an inference runtime::Session and, for a model with training_info, a
//   training::TrainingSession (their constructors make every graph's first plan: kernels with
//   parsed attributes; Gradient nodes expanded).
// Planning runs with fuse = false, so that no constant folding runs a kernel, and only when
// every tensor the model stores (initializers, attribute tensors, in every graph) holds at most
// kMaxElements elements: planning materializes initializers, and a model may declare any size.
// Models are read with an empty folder as base_dir, so external data finds no file.
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <cstdint>
#include <exception>
#include <filesystem>
#include <string>

#include "harness.h"
#include "onnxtrain/io.h"
#include "onnxtrain/session.h"
#include "onnxtrain/training.h"

namespace {

// The size cap for planning: 2^22 elements (16 MiB of float32) per tensor.
constexpr int64_t kMaxElements = int64_t{1} << 22;

bool small(const onnx::TensorProto& t) {
  int64_t n = 1;
  for (const int64_t d : t.dims()) {
    if (d < 0) continue;  // the readers reject it; no allocation follows
    if (d > kMaxElements || (n *= d) > kMaxElements) return false;
  }
  return true;
}

bool small(const onnx::GraphProto& g);

bool small(const onnx::SparseTensorProto& s) { return small(s.values()) && small(s.indices()); }

bool small(const onnx::NodeProto& node) {
  for (const auto& a : node.attribute()) {
    if (a.has_t() && !small(a.t())) return false;
    if (a.has_sparse_tensor() && !small(a.sparse_tensor())) return false;
    if (a.has_g() && !small(a.g())) return false;
    for (const auto& t : a.tensors()) {
      if (!small(t)) return false;
    }
    for (const auto& s : a.sparse_tensors()) {
      if (!small(s)) return false;
    }
    for (const auto& g : a.graphs()) {
      if (!small(g)) return false;
    }
  }
  return true;
}

bool small(const onnx::GraphProto& g) {
  for (const auto& t : g.initializer()) {
    if (!small(t)) return false;
  }
  for (const auto& s : g.sparse_initializer()) {
    if (!small(s)) return false;
  }
  for (const auto& node : g.node()) {
    if (!small(node)) return false;
  }
  return true;
}

bool small(const onnx::ModelProto& model) {
  if (!small(model.graph())) return false;
  for (const auto& info : model.training_info()) {
    if (!small(info.initialization()) || !small(info.algorithm())) return false;
  }
  for (const auto& f : model.functions()) {
    for (const auto& node : f.node()) {
      if (!small(node)) return false;
    }
  }
  return true;
}

// An empty folder (harness.h's shared folder; nothing writes to it): the models' base_dir.
const std::filesystem::path& base_dir() {
  static const std::filesystem::path dir = [] {
    auto d = onnxtrain::fuzz::shared_folder("empty");
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace io = onnxtrain::io;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  onnx::ModelProto model;
  try {
    model = io::parse_model(bytes, "fuzz.onnx");
  } catch (const onnxtrain::Error&) {
    return 0;
  }
  try {
    onnx::checker::check_model(model);
  } catch (const std::exception&) {  // ONNX's ValidationError (and others) for a bad model
  }
  onnxtrain::fuzz::expect_error_or_success(
      [&] { onnxtrain::training::validate_training_info(model, "fuzz.onnx", base_dir()); });
  if (!small(model)) return 0;
  onnxtrain::fuzz::expect_error_or_success([&] {
    onnxtrain::runtime::Session session(model, {.threads = 1, .fuse = false}, base_dir(), "fuzz.onnx");
  });
  if (model.training_info_size() > 0) {
    onnxtrain::fuzz::expect_error_or_success([&] {
      onnxtrain::training::TrainingSession session(model, {.threads = 1, .fuse = false}, base_dir(), "fuzz.onnx");
    });
  }
  return 0;
}
