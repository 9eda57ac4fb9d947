#include "training/combined_graph.h"

namespace onnxtrain::training {

onnx::GraphProto combine_graphs(const onnx::GraphProto& inference, const onnx::GraphProto& algorithm) {
  onnx::GraphProto combined = inference;
  combined.set_name(inference.name() + "+" + algorithm.name());
  for (const auto& v : algorithm.input()) *combined.add_input() = v;
  for (const auto& t : algorithm.initializer()) *combined.add_initializer() = t;
  for (const auto& v : algorithm.output()) *combined.add_output() = v;
  for (const auto& n : algorithm.node()) *combined.add_node() = n;
  for (const auto& v : algorithm.value_info()) *combined.add_value_info() = v;
  for (const auto& s : algorithm.sparse_initializer()) *combined.add_sparse_initializer() = s;
  return combined;
}

std::string entry_name(int i) { return "training_info[" + std::to_string(i) + "]"; }

std::string combined_label(const std::string& source, int i) {
  return source + ", " + entry_name(i) + " combined graph (ModelProto.graph + algorithm)";
}

std::string initialization_label(const std::string& source, int i) {
  return source + ", " + entry_name(i) + ".initialization";
}

}  // namespace onnxtrain::training
