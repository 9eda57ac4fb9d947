#include "runtime/constant_folding.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <string>
#include <utility>
#include <unordered_map>
#include <unordered_set>

#include "ir/graph.h"
#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "runtime/graph_match.h"

namespace onnxtrain::runtime {

using graph_match::constant_node;

namespace {

constexpr int64_t kMaxFoldedElements = 4096;

bool has_subgraph(const onnx::NodeProto& node) {
  for (const auto& attr : node.attribute()) {
    if (attr.has_g() || attr.graphs_size() > 0) return true;
  }
  return false;
}

// The node's outputs computed by its kernel from `inputs` (the values of the names it reads),
// or nothing when the kernel fails or the outputs are too large to keep: an output over
// kMaxFoldedElements counts unless all outputs together hold at most `released` elements, this
// node's share of what the folding frees (see fold_constants).
using KnownValue = std::pair<std::string, const onnx::TensorProto*>;
std::optional<std::vector<Tensor>> evaluate(const onnx::NodeProto& node, const std::vector<KnownValue>& inputs,
                                            const OpsetMap& opsets, const std::filesystem::path& base_dir,
                                            double released) {
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
    if (large && static_cast<double>(total) > released + 0.5) return std::nullopt;
    return outputs;
  } catch (const Error&) {
    return std::nullopt;  // planning the real graph reports it, naming the model and node
  }
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
  // The A operand of a MatMul or Gemm node reading a value as its B (operand 1 and not operand 0
  // as well); which one when several do does not matter (below, the value has one reader).
  std::unordered_map<std::string, std::string> product_a_of_b;
  for (const auto& node : graph.node()) {
    const bool onnx_domain = node.domain().empty() || node.domain() == "ai.onnx";
    if (onnx_domain && (node.op_type() == "MatMul" || node.op_type() == "Gemm") && node.input_size() >= 2 &&
        node.input(0) != node.input(1)) {
      product_a_of_b[node.input(1)] = node.input(0);
    }
  }
  // A linear layer's W^T as exporters write it, Transpose(W) with perm [1, 0] of a float32 rank-2
  // W read by one product as its B, whose A is not known (computable, below): left to the product,
  // which reads W in place (fusion.h: fuse_matmul_add, fuse_transpose_matmul,
  // fuse_transpose_gemm), instead of a Constant W^T that ConstantWeightsProduct would copy back
  // into W's layout, two copies of the weights.
  std::unordered_set<std::string> computable;
  const auto weight_transpose_for_a_product = [&](const onnx::NodeProto& node,
                                                   const onnx::TensorProto* input) {
    if (node.op_type() != "Transpose" || node.output_size() != 1 || !input || input->dims_size() != 2 ||
        input->data_type() != onnx::TensorProto::FLOAT) {
      return false;
    }
    for (const auto& attr : node.attribute()) {
      if (attr.name() == "perm" && !(attr.ints_size() == 2 && attr.ints(0) == 1 && attr.ints(1) == 0)) return false;
    }
    const std::string& out = node.output(0);
    const auto it = product_a_of_b.find(out);
    return readers[out] == 1 && it != product_a_of_b.end() && !computable.contains(it->second);
  };
  const auto is_value_constant = [](const onnx::NodeProto& node) {
    return node.op_type() == "Constant" && node.domain().empty() && node.attribute_size() == 1 &&
           node.attribute(0).name() == "value" && node.output_size() == 1;
  };
  const auto kind_foldable = [](const onnx::NodeProto& node) {
    const bool onnx_domain = node.domain().empty() || node.domain() == "ai.onnx";
    return onnx_domain && !is_random_op(node.op_type()) && !has_subgraph(node) && node.output_size() > 0;
  };
  // Reads by nodes that fold if their kernels succeed and their outputs are not too large (every
  // input known, assuming the nodes before them fold): a value all of whose readers are such
  // nodes goes once they have folded, so its elements are a budget its readers' large outputs
  // may take, first come first served (an LSTM's weight read by the three Slice nodes that
  // reorder its gates, whose outputs a Concat reads: the weight and the slices go, the Concat's
  // output stays, and memory stays the same).
  std::unordered_map<std::string, int> computable_reads;
  {
    for (const auto& init : graph.initializer()) {
      if (!inputs.contains(init.name())) computable.insert(init.name());
    }
    for (const auto& node : graph.node()) {
      bool all_known = kind_foldable(node) || is_value_constant(node);
      for (const auto& in : node.input()) all_known = all_known && (in.empty() || computable.contains(in));
      if (!all_known) continue;
      for (const auto& in : node.input()) {
        if (!in.empty()) ++computable_reads[in];
      }
      for (const auto& out : node.output()) {
        if (!out.empty()) computable.insert(out);
      }
    }
  }
  // Known values by name, pointing into the graph (initializers no run replaces) and into the
  // rewritten node list (Constant values), whose elements do not move as it grows.
  std::unordered_map<std::string, const onnx::TensorProto*> known;
  std::unordered_set<std::string> initializers;  // those no run replaces
  for (const auto& init : graph.initializer()) {
    if (inputs.contains(init.name())) continue;
    known[init.name()] = &init;
    initializers.insert(init.name());
  }
  std::unordered_map<std::string, int> folded_reads;  // reads by nodes that were folded
  std::unordered_map<std::string, double> budget;     // elements left to large folded outputs
  const auto budget_of = [&](const std::string& name, const onnx::TensorProto& value) -> double& {
    auto [it, added] = budget.try_emplace(name, 0.0);
    if (added && readers[name] > 0 && computable_reads[name] == readers[name]) {
      int64_t n = 1;
      for (int64_t d : value.dims()) n *= d;
      it->second = static_cast<double>(n);
    }
    return it->second;
  };
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  int folded = 0;
  for (auto& node : *graph.mutable_node()) {
    // A Constant holding a `value` tensor is known as it is; its other forms run once below.
    if (is_value_constant(node)) {
      onnx::NodeProto* kept = nodes.Add();
      kept->Swap(&node);
      known[kept->output(0)] = &kept->attribute(0).t();
      continue;
    }
    bool foldable = kind_foldable(node);
    std::vector<KnownValue> values;
    std::vector<double*> budgets;  // of the distinct inputs
    double released = 0;           // what they have left
    for (const auto& in : node.input()) {
      if (!foldable || in.empty()) continue;
      auto it = known.find(in);
      if (it == known.end()) {
        foldable = false;
        continue;
      }
      values.emplace_back(in, it->second);
      double* b = &budget_of(in, *it->second);
      if (std::find(budgets.begin(), budgets.end(), b) == budgets.end()) {
        budgets.push_back(b);
        released += *b;
      }
    }
    if (foldable && values.size() == 1 && weight_transpose_for_a_product(node, values.front().second)) foldable = false;
    std::optional<std::vector<Tensor>> outputs;
    if (foldable) outputs = evaluate(node, values, opsets, base_dir, released);
    if (!outputs) {
      nodes.Add()->Swap(&node);
      continue;
    }
    int64_t total = 0;
    bool large = false;
    for (const Tensor& t : *outputs) {
      total += t.numel();
      large = large || t.numel() > kMaxFoldedElements;
    }
    if (large) {  // taken from the inputs' budgets
      double left = static_cast<double>(total);
      for (double* b : budgets) {
        const double take = std::min(*b, left);
        *b -= take;
        left -= take;
      }
    }
    for (int k = 0; k < node.output_size(); ++k) {
      const std::string& name = node.output(k);
      if (name.empty()) continue;
      onnx::NodeProto* constant = nodes.Add();
      *constant = constant_node(name, (*outputs)[static_cast<size_t>(k)]);
      known[name] = &constant->attribute(0).t();
    }
    for (const auto& in : node.input()) {
      if (!in.empty()) ++folded_reads[in];
    }
    if (node.op_type() != "Constant") ++folded;
  }
  // Values every reader of which was folded: initializers and Constant nodes nothing reads now.
  const auto gone = [&](const std::string& name) {
    auto it = folded_reads.find(name);
    return it != folded_reads.end() && it->second == readers[name];
  };
  google::protobuf::RepeatedPtrField<onnx::NodeProto> kept_nodes;
  for (auto& node : nodes) {
    if (!(is_value_constant(node) && gone(node.output(0)))) kept_nodes.Add()->Swap(&node);
  }
  graph.mutable_node()->Swap(&kept_nodes);
  // After the loop: `known` pointed into the initializer list.
  google::protobuf::RepeatedPtrField<onnx::TensorProto> kept;
  for (auto& init : *graph.mutable_initializer()) {
    if (!(initializers.contains(init.name()) && gone(init.name()))) kept.Add()->Swap(&init);
  }
  graph.mutable_initializer()->Swap(&kept);
  return folded;
}

}  // namespace onnxtrain::runtime
