#include "autodiff/sequences.h"

#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "autodiff/builder.h"
#include "autodiff/subgraphs.h"
#include "onnxtrain/io.h"

namespace onnxtrain::autodiff {

namespace {

bool is_onnx(const onnx::NodeProto& n, const char* type) {
  return n.op_type() == type && (n.domain().empty() || n.domain() == "ai.onnx");
}

int64_t int_attr(const onnx::NodeProto& n, const std::string& name, int64_t fallback) {
  for (const auto& a : n.attribute()) {
    if (a.name() == name) return a.i();
  }
  return fallback;
}

// The values of an integer constant `name` of `graph`, or nullopt (not a constant, not an
// integer tensor).
std::optional<std::vector<int64_t>> int_constant(const onnx::GraphProto& graph, const std::string& name, int* rank) {
  const std::optional<onnx::TensorProto> proto = constant_in(graph, name);
  if (!proto) return std::nullopt;
  const Tensor t = io::tensor_from_proto(*proto, ".", name);
  if (t.dtype() != DataType::Int64 && t.dtype() != DataType::Int32) return std::nullopt;
  *rank = static_cast<int>(t.rank());
  return t.to_int64_vector(name);
}

onnx::TensorProto int64_tensor(const std::vector<int64_t>& values, bool scalar) {
  onnx::TensorProto t;
  t.set_data_type(onnx::TensorProto::INT64);
  if (!scalar) t.add_dims(static_cast<int64_t>(values.size()));
  for (int64_t v : values) t.add_int64_data(v);
  return t;
}

// The nodes reading chunk `p` of `split` as a tensor (see the header), or an empty vector.
std::vector<onnx::NodeProto> chunk_nodes(const onnx::GraphProto& graph, const onnx::NodeProto& split,
                                         const onnx::NodeProto& at, int64_t p,
                                         const std::function<std::string(const std::string&)>& fresh) {
  const std::string& x = split.input(0);
  const int64_t axis = int_attr(split, "axis", 0);
  std::vector<onnx::NodeProto> nodes;
  auto constant = [&](const std::vector<int64_t>& v, bool scalar) {
    onnx::NodeProto c;
    c.set_op_type("Constant");
    c.set_name(fresh(at.output(0) + "_chunk"));
    c.add_output(c.name());
    *c.add_attribute() = attr_tensor("value", int64_tensor(v, scalar));
    nodes.push_back(c);
    return c.output(0);
  };
  onnx::NodeProto op;
  op.set_name(at.name());
  if (split.input_size() < 2 || split.input(1).empty()) {
    const bool keep = int_attr(split, "keepdims", 1) != 0;
    op.set_op_type("Gather");
    op.add_input(x);
    op.add_input(constant({p}, !keep));
  } else {
    int rank = 0;
    const std::optional<std::vector<int64_t>> sizes = int_constant(graph, split.input(1), &rank);
    if (!sizes) return {};
    int64_t begin = 0, end = 0;
    if (rank == 0) {
      if (p < 0) return {};
      begin = p * (*sizes)[0], end = begin + (*sizes)[0];
    } else {
      const int64_t n = static_cast<int64_t>(sizes->size());
      if (p < -n || p >= n) return {};
      if (p < 0) p += n;
      for (int64_t k = 0; k < p; ++k) begin += (*sizes)[static_cast<size_t>(k)];
      end = begin + (*sizes)[static_cast<size_t>(p)];
    }
    op.set_op_type("Slice");
    op.add_input(x);
    op.add_input(constant({begin}, false));
    op.add_input(constant({end}, false));
    op.add_input(constant({axis}, false));
  }
  if (op.op_type() == "Gather") *op.add_attribute() = attr_int("axis", axis);
  op.add_output(at.output(0));
  nodes.push_back(op);
  return nodes;
}

}  // namespace

int slice_sequence_chunks(onnx::GraphProto& graph) {
  std::unordered_map<std::string, int> splits;  // sequence value -> its SplitToSequence node
  std::unordered_set<std::string> names;
  for (const auto& v : graph.input()) names.insert(v.name());
  for (const auto& t : graph.initializer()) names.insert(t.name());
  for (int i = 0; i < graph.node_size(); ++i) {
    const auto& n = graph.node(i);
    for (const auto& o : n.output()) names.insert(o);
    if (is_onnx(n, "SplitToSequence") && n.output_size() == 1 && n.input_size() >= 1) splits[n.output(0)] = i;
  }
  if (splits.empty()) return 0;
  auto fresh = [&](const std::string& hint) {
    std::string name = hint;
    for (int k = 1; names.contains(name); ++k) name = hint + "_" + std::to_string(k);
    names.insert(name);
    return name;
  };

  int rewritten = 0;
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  for (int i = 0; i < graph.node_size(); ++i) {
    const onnx::NodeProto& n = graph.node(i);
    std::vector<onnx::NodeProto> replacement;
    if (is_onnx(n, "SequenceAt") && n.input_size() == 2 && n.output_size() == 1 && splits.contains(n.input(0))) {
      int rank = 0;
      const auto position = int_constant(graph, n.input(1), &rank);
      if (position && position->size() == 1) {
        replacement = chunk_nodes(graph, graph.node(splits.at(n.input(0))), n, (*position)[0], fresh);
      }
    }
    if (replacement.empty()) {
      *nodes.Add() = n;
      continue;
    }
    for (auto& r : replacement) nodes.Add()->Swap(&r);
    ++rewritten;
  }
  if (rewritten == 0) return 0;
  graph.mutable_node()->Swap(&nodes);

  // Drop the SplitToSequence nodes nothing reads any more.
  std::unordered_set<std::string> read;
  for (const auto& n : graph.node()) {
    for (const auto& v : node_reads(n)) read.insert(v);
  }
  for (const auto& o : graph.output()) read.insert(o.name());
  google::protobuf::RepeatedPtrField<onnx::NodeProto> kept;
  for (auto& n : *graph.mutable_node()) {
    if (is_onnx(n, "SplitToSequence") && n.output_size() == 1 && !read.contains(n.output(0))) continue;
    kept.Add()->Swap(&n);
  }
  graph.mutable_node()->Swap(&kept);
  return rewritten;
}

}  // namespace onnxtrain::autodiff
