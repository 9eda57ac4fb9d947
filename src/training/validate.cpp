// validate_training_info: the rules of onnx.proto's TrainingInfoProto comments, each with its
// own message.
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <set>
#include <unordered_set>

#include "ir/graph.h"
#include "onnxtrain/error.h"
#include "onnxtrain/training.h"
#include "training/combined_graph.h"
#include "training/validate.h"

namespace onnxtrain::training {

namespace {

std::unordered_set<std::string> initializer_names(const onnx::GraphProto& g) {
  std::unordered_set<std::string> names;
  for (const auto& t : g.initializer()) names.insert(t.name());
  return names;
}

std::unordered_set<std::string> output_names(const onnx::GraphProto& g) {
  std::unordered_set<std::string> names;
  for (const auto& v : g.output()) names.insert(v.name());
  return names;
}

}  // namespace

void run_checker(const onnx::ModelProto& model, const onnx::GraphProto& graph, const std::string& what) {
  onnx::ModelProto copy;
  copy.set_ir_version(model.ir_version());
  *copy.mutable_opset_import() = model.opset_import();
  *copy.mutable_graph() = graph;
  try {
    onnx::checker::check_model(copy);
  } catch (const std::exception& e) {
    throw Error(what + ": the ONNX checker rejects it: " + e.what());
  }
}

void check_bindings(const onnx::ModelProto& model, const std::string& source) {
  const onnx::GraphProto& inference = model.graph();
  const auto inference_initializers = initializer_names(inference);
  const auto inference_outputs = output_names(inference);

  std::set<std::string> update_keys;
  for (int i = 0; i < model.training_info_size(); ++i) {
    const auto& info = model.training_info(i);
    const std::string entry = source + ", " + entry_name(i);
    const auto algorithm_initializers = initializer_names(info.algorithm());
    const auto algorithm_outputs = output_names(info.algorithm());
    auto check_key = [&](const std::string& key, const std::string& field) {
      if (!inference_initializers.contains(key) && !algorithm_initializers.contains(key)) {
        throw Error(entry + "." + field + ": key '" + key + "' is not an initializer of " +
                    "ModelProto.graph or of " + entry_name(i) + ".algorithm");
      }
    };
    for (const auto& b : info.update_binding()) {
      if (!update_keys.insert(b.key()).second) {
        throw Error(entry + ".update_binding: key '" + b.key() +
                    "' is bound more than once (keys must be unique across all update_bindings)");
      }
      check_key(b.key(), "update_binding");
      if (!algorithm_outputs.contains(b.value()) && !inference_outputs.contains(b.value())) {
        throw Error(entry + ".update_binding: value '" + b.value() + "' (bound to '" + b.key() +
                    "') is not an output of " + entry_name(i) + ".algorithm or of ModelProto.graph");
      }
    }
    if (info.initialization_binding_size() > 0 && !info.has_initialization()) {
      throw Error(entry + " has initialization_binding entries but no initialization graph");
    }
    if (info.has_initialization()) {
      const auto& init = info.initialization();
      if (init.input_size() > 0) {
        throw Error(entry + ".initialization has input '" + init.input(0).name() +
                    "'; an initialization graph takes no inputs");
      }
      const auto init_outputs = output_names(init);
      std::set<std::string> init_keys;
      for (const auto& b : info.initialization_binding()) {
        if (!init_keys.insert(b.key()).second) {
          throw Error(entry + ".initialization_binding: key '" + b.key() + "' is bound more than once");
        }
        check_key(b.key(), "initialization_binding");
        if (!init_outputs.contains(b.value())) {
          throw Error(entry + ".initialization_binding: value '" + b.value() + "' (bound to '" +
                      b.key() + "') is not an output of " + entry_name(i) + ".initialization");
        }
      }
    }
  }
}

void validate_training_info(const onnx::ModelProto& model, const std::string& source,
                            const std::filesystem::path& base_dir) {
  if (model.training_info_size() == 0) return;
  check_bindings(model, source);
  // The inference graph alone must be valid: its nodes read no algorithm input or output.
  ir::Graph::from_proto(model.graph(), source + ", inference graph", base_dir);
  run_checker(model, model.graph(), source + ", inference graph");
  for (int i = 0; i < model.training_info_size(); ++i) {
    const auto& info = model.training_info(i);
    if (info.has_initialization()) {
      ir::Graph::from_proto(info.initialization(), initialization_label(source, i), base_dir);
      run_checker(model, info.initialization(), initialization_label(source, i));
    }
    const onnx::GraphProto combined = combine_graphs(model.graph(), info.algorithm());
    ir::Graph::from_proto(combined, combined_label(source, i), base_dir);
    run_checker(model, combined, combined_label(source, i));
  }
}

}  // namespace onnxtrain::training
