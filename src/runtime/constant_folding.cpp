#include "runtime/constant_folding.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <unordered_map>
#include <unordered_set>

#include "ir/graph.h"
#include "onnxtrain/error.h"
#include "onnxtrain/io.h"

namespace onnxtrain::runtime {

namespace {

constexpr int64_t kMaxFoldedElements = 4096;

bool is_random(const std::string& op_type) {
  static const std::set<std::string> kRandom = {"RandomNormal",     "RandomUniform", "RandomNormalLike",
                                                "RandomUniformLike", "Bernoulli",     "Multinomial",
                                                "Dropout"};
  return kRandom.contains(op_type);
}

bool has_subgraph(const onnx::NodeProto& node) {
  for (const auto& attr : node.attribute()) {
    if (attr.has_g() || attr.graphs_size() > 0) return true;
  }
  return false;
}

// The node's outputs computed by its kernel from `inputs` (the values of the names it reads),
// or nothing when the kernel fails or the outputs are too large to keep: an output over
// kMaxFoldedElements counts unless all outputs together hold at most `released` elements, what
// the folding frees (initializers only this node reads, which the graph then drops).
using KnownValue = std::pair<std::string, const onnx::TensorProto*>;
std::optional<std::vector<Tensor>> evaluate(const onnx::NodeProto& node, const std::vector<KnownValue>& inputs,
                                            const OpsetMap& opsets, const std::filesystem::path& base_dir,
                                            int64_t released) {
  onnx::GraphProto graph;
  graph.set_name("constant folding");
  *graph.add_node() = node;
  std::unordered_set<std::string> added;
  for (const auto& [name, t] : inputs) {
    if (!added.insert(name).second) continue;
    onnx::TensorProto* init = graph.add_initializer();
    *init = *t;
    init->set_name(name);  // a Constant's tensor may carry another name, or none
  }
  for (const auto& out : node.output()) {
    if (!out.empty()) graph.add_output()->set_name(out);
  }
  try {
    GraphRunner runner(ir::Graph::from_proto(graph, "constant folding", base_dir), opsets, "constant folding");
    const NamedTensors results = runner.run({});
    std::vector<Tensor> outputs;
    int64_t total = 0;
    bool large = false;
    for (const auto& out : node.output()) {
      if (out.empty()) {
        outputs.emplace_back();
        continue;
      }
      const Tensor& t = results.at(out);
      large = large || t.numel() > kMaxFoldedElements;
      total += t.numel();
      outputs.push_back(t);
    }
    if (large && total > released) return std::nullopt;
    return outputs;
  } catch (const Error&) {
    return std::nullopt;  // planning the real graph reports it, naming the model and node
  }
}

onnx::NodeProto constant_node(const std::string& name, const Tensor& value) {
  onnx::NodeProto node;
  node.set_op_type("Constant");
  node.set_name(name);
  node.add_output(name);
  auto* attr = node.add_attribute();
  attr->set_name("value");
  attr->set_type(onnx::AttributeProto::TENSOR);
  io::tensor_to_proto(value, name, *attr->mutable_t());
  return node;
}

}  // namespace

int fold_constants(onnx::GraphProto& graph, const OpsetMap& opsets, const std::filesystem::path& base_dir) {
  std::unordered_set<std::string> inputs;
  for (const auto& in : graph.input()) inputs.insert(in.name());
  // Readers of each name: node inputs, graph outputs, and the enclosing values subgraphs read.
  std::unordered_map<std::string, int> readers;
  for (const auto& node : graph.node()) {
    for (const auto& in : node.input()) ++readers[in];
    std::unordered_set<std::string> free_names;
    for (const auto& attr : node.attribute()) {
      if (attr.has_g()) ir::collect_free_names(attr.g(), free_names);
      for (const auto& g : attr.graphs()) ir::collect_free_names(g, free_names);
    }
    for (const auto& name : free_names) ++readers[name];
  }
  for (const auto& out : graph.output()) ++readers[out.name()];
  std::unordered_set<std::string> dropped;  // initializers a folded node alone read
  // Known values by name, pointing into the graph (initializers no run replaces) and into the
  // rewritten node list (Constant values), whose elements do not move as it grows.
  std::unordered_map<std::string, const onnx::TensorProto*> known;
  std::unordered_set<std::string> initializers;  // those no run replaces
  for (const auto& init : graph.initializer()) {
    if (inputs.contains(init.name())) continue;
    known[init.name()] = &init;
    initializers.insert(init.name());
  }
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  int folded = 0;
  for (auto& node : *graph.mutable_node()) {
    // A Constant holding a `value` tensor is known as it is; its other forms run once below.
    if (node.op_type() == "Constant" && node.domain().empty() && node.attribute_size() == 1 &&
        node.attribute(0).name() == "value" && node.output_size() == 1) {
      onnx::NodeProto* kept = nodes.Add();
      kept->Swap(&node);
      known[kept->output(0)] = &kept->attribute(0).t();
      continue;
    }
    const bool onnx_domain = node.domain().empty() || node.domain() == "ai.onnx";
    bool foldable = onnx_domain && !is_random(node.op_type()) && !has_subgraph(node) && node.output_size() > 0;
    std::vector<KnownValue> values;
    std::vector<std::string> released_names;  // initializers that die with this node
    int64_t released = 0;
    for (const auto& in : node.input()) {
      if (!foldable || in.empty()) continue;
      auto it = known.find(in);
      if (it == known.end()) {
        foldable = false;
        continue;
      }
      values.emplace_back(in, it->second);
      const bool initializer = initializers.contains(in) && !dropped.contains(in);
      if (initializer && readers[in] == 1 && std::find(released_names.begin(), released_names.end(), in) == released_names.end()) {
        int64_t n = 1;
        for (int64_t d : it->second->dims()) n *= d;
        released += n;
        released_names.push_back(in);
      }
    }
    std::optional<std::vector<Tensor>> outputs;
    if (foldable) outputs = evaluate(node, values, opsets, base_dir, released);
    if (!outputs) {
      nodes.Add()->Swap(&node);
      continue;
    }
    for (int k = 0; k < node.output_size(); ++k) {
      const std::string& name = node.output(k);
      if (name.empty()) continue;
      onnx::NodeProto* constant = nodes.Add();
      *constant = constant_node(name, (*outputs)[static_cast<size_t>(k)]);
      known[name] = &constant->attribute(0).t();
    }
    if (node.op_type() != "Constant") ++folded;
    dropped.insert(released_names.begin(), released_names.end());
  }
  graph.mutable_node()->Swap(&nodes);
  if (!dropped.empty()) {  // after the loop: `known` pointed into the initializer list
    google::protobuf::RepeatedPtrField<onnx::TensorProto> kept;
    for (auto& init : *graph.mutable_initializer()) {
      if (!dropped.contains(init.name())) kept.Add()->Swap(&init);
    }
    graph.mutable_initializer()->Swap(&kept);
  }
  return folded;
}

}  // namespace onnxtrain::runtime
