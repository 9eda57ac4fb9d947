// `onnxtrain export --weights` and `onnxtrain load-weights`: a model's initializers to and from
// a safetensors file (include/onnxtrain/safetensors.h).
#include <onnx/onnx_pb.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include "cli/commands.h"
#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "onnxtrain/make_trainable.h"
#include "onnxtrain/safetensors.h"

namespace onnxtrain::cli {

namespace fs = std::filesystem;

namespace {

// The initializers an update_binding of training_info writes that live in an algorithm graph
// (make-trainable's optimizer state and step counter), by name.
std::map<std::string, onnx::TensorProto*> training_state(onnx::ModelProto& model) {
  std::map<std::string, onnx::TensorProto*> state;
  for (onnx::TrainingInfoProto& info : *model.mutable_training_info()) {
    std::set<std::string> bound;
    for (const auto& binding : info.update_binding()) bound.insert(binding.key());
    for (onnx::TensorProto& init : *info.mutable_algorithm()->mutable_initializer()) {
      if (bound.count(init.name())) state.emplace(init.name(), &init);
    }
  }
  return state;
}

// ModelProto.graph's initializers and, with `optimizer_state`, training_state(model).
std::map<std::string, onnx::TensorProto*> weight_protos(onnx::ModelProto& model, bool optimizer_state) {
  std::map<std::string, onnx::TensorProto*> protos;
  for (onnx::TensorProto& init : *model.mutable_graph()->mutable_initializer()) protos.emplace(init.name(), &init);
  if (optimizer_state) protos.merge(training_state(model));
  return protos;
}

std::string description(const onnx::TensorProto& proto) {
  std::string text(dtype_name(static_cast<DataType>(proto.data_type())));
  text += "[";
  for (int i = 0; i < proto.dims_size(); ++i) text += (i ? "," : "") + std::to_string(proto.dims(i));
  return text + "]";
}

bool same_type(const onnx::TensorProto& proto, const Tensor& tensor) {
  if (proto.data_type() != static_cast<int32_t>(tensor.dtype()) ||
      proto.dims_size() != static_cast<int>(tensor.rank())) {
    return false;
  }
  for (int i = 0; i < proto.dims_size(); ++i) {
    if (proto.dims(i) != tensor.dim(static_cast<size_t>(i))) return false;
  }
  return true;
}

}  // namespace

int export_model(const ExportArgs& args) {
  if (args.output.empty() && args.weights.empty()) {
    throw Error("export: give -o/--output (the inference model), --weights (a .safetensors file) or both");
  }
  if (args.optimizer_state && args.weights.empty()) throw Error("export: --optimizer-state needs --weights");
  onnx::ModelProto model = io::load_model(args.model);
  const fs::path source_dir = model_folder(args.model);
  if (!args.weights.empty()) {
    std::map<std::string, Tensor> tensors;
    for (const auto& [name, proto] : weight_protos(model, args.optimizer_state)) {
      tensors.emplace(name, io::tensor_from_proto(*proto, source_dir, args.model + ": initializer '" + name + "'"));
    }
    io::write_safetensors(args.weights, tensors, {{"format", "pt"}, {"producer", "onnxtrain"}});
    std::cout << "wrote " << args.weights << " (" << tensors.size() << " tensors)\n";
  }
  if (!args.output.empty()) {
    const onnx::ModelProto inference = training::export_inference(model);
    io::save_model(inference, args.output, {.source_dir = source_dir});
    std::cout << "wrote " << args.output << " (" << inference.graph().initializer_size() << " initializers)\n";
  }
  return 0;
}

int load_weights(const LoadWeightsArgs& args) {
  onnx::ModelProto model = io::load_model(args.model);
  const io::SafetensorsFile file = io::read_safetensors(args.weights);
  // Every initializer, the training state too: a file written with --optimizer-state loads back.
  std::map<std::string, onnx::TensorProto*> protos = weight_protos(model, true);
  std::map<onnx::TensorProto*, const Tensor*> replace;
  size_t extra = 0;
  for (const auto& [name, tensor] : file.tensors) {
    const auto it = protos.find(name);
    if (it == protos.end()) {
      if (args.allow_extra) {
        ++extra;
        continue;
      }
      throw Error(args.weights + ": tensor '" + name + "' is no initializer of " + args.model +
                  " (--allow-extra skips such tensors)");
    }
    if (!same_type(*it->second, tensor)) {
      throw Error(args.weights + ": tensor '" + name + "' is " + tensor.description() + ", but the initializer in " +
                  args.model + " is " + description(*it->second));
    }
    replace.emplace(it->second, &tensor);
  }
  for (const auto& [proto, tensor] : replace) io::tensor_to_proto(*tensor, proto->name(), *proto);
  io::save_model(std::move(model), args.output, {.source_dir = model_folder(args.model)});
  std::cout << "wrote " << args.output << " (" << replace.size() << " of " << protos.size()
            << " initializers replaced from " << args.weights;
  if (extra) std::cout << ", " << extra << " tensors of the file skipped";
  std::cout << ")\n";
  return 0;
}

}  // namespace onnxtrain::cli
