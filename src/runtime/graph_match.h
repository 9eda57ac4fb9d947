// What runtime/fusion.cpp's rewrites share to read and rebuild a graph (not a public API): a
// Matcher of producers, readers and pinned values, fresh value names, and the small readers of
// node attributes and constants. Each rewrite lives in the file of its own; fusion.h declares
// them.
#pragma once

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ir/graph.h"
#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "onnxtrain/tensor.h"

namespace onnxtrain::runtime::graph_match {

inline bool one_element(const google::protobuf::RepeatedField<int64_t>& dims) {
  for (int64_t d : dims) {
    if (d != 1) return false;
  }
  return true;
}

inline bool one_element(const onnx::TypeProto& type) {
  if (!type.has_tensor_type() || !type.tensor_type().has_shape()) return false;
  for (const auto& d : type.tensor_type().shape().dim()) {
    if (!d.has_dim_value() || d.dim_value() != 1) return false;
  }
  return true;
}

class Matcher {
 public:
  explicit Matcher(const onnx::GraphProto& graph) : graph_(graph) {
    for (int i = 0; i < graph.node_size(); ++i) {
      const auto& node = graph.node(i);
      for (const auto& out : node.output()) {
        if (!out.empty()) producer_[out] = i;
      }
      for (const auto& in : node.input()) {
        if (!in.empty()) readers_[in].push_back(i);
      }
    }
    for (const auto& out : graph.output()) pinned_.insert(out.name());
    for (const auto& node : graph.node()) {  // values subgraphs read must keep their producers
      for (const auto& attr : node.attribute()) {
        if (attr.has_g()) ir::collect_free_names(attr.g(), pinned_);
        for (const auto& g : attr.graphs()) ir::collect_free_names(g, pinned_);
      }
    }
    for (const auto& init : graph.initializer()) scalar_[init.name()] = one_element(init.dims());
    for (const auto& in : graph.input()) scalar_.try_emplace(in.name(), one_element(in.type()));
    for (const auto& vi : graph.value_info()) {
      if (one_element(vi.type())) scalar_.try_emplace(vi.name(), true);
    }
    // Ranks the graph states: a graph input's or value_info's shape, else an initializer's dims
    // (an initializer that is also an input keeps the input's declared shape).
    for (const auto& init : graph.initializer()) {
      rank_[init.name()] = init.dims_size();
      elem_type_[init.name()] = init.data_type();
    }
    for (const auto& v : graph.input()) declare(v);
    for (const auto& v : graph.value_info()) declare(v);
  }

  // The element type and rank the graph states for `name` (a graph input's or value_info's type,
  // else an initializer's), if it states both.
  std::optional<std::pair<int, int>> declared_type(const std::string& name) const {
    const auto rank = rank_.find(name);
    const auto elem = elem_type_.find(name);
    if (rank == rank_.end() || elem == elem_type_.end()) return std::nullopt;
    return std::make_pair(elem->second, rank->second);
  }

  // The index of the node producing `name`, -1 for a graph input, initializer or outer value.
  int producer_index(const std::string& name) const {
    auto it = producer_.find(name);
    return it == producer_.end() ? -1 : it->second;
  }
  const onnx::NodeProto* producer(const std::string& name) const {
    const int i = producer_index(name);
    return i < 0 ? nullptr : &graph_.node(i);
  }
  // The only reader of `name`, if it has exactly one and is not pinned.
  std::optional<int> sole_reader(const std::string& name) const {
    if (pinned_.contains(name)) return std::nullopt;
    auto it = readers_.find(name);
    if (it == readers_.end() || it->second.size() != 1) return std::nullopt;
    return it->second[0];
  }

  // The indices of the nodes reading `name` (a node reading it twice appears twice).
  const std::vector<int>& readers(const std::string& name) const {
    static const std::vector<int> kNone;
    auto it = readers_.find(name);
    return it == readers_.end() ? kNone : it->second;
  }
  // True when `name` is a graph output or read by a subgraph.
  bool pinned(const std::string& name) const { return pinned_.contains(name); }

  // True when `name` provably holds one element.
  bool is_scalar(const std::string& name) {
    if (auto it = scalar_.find(name); it != scalar_.end()) return it->second;
    scalar_[name] = false;  // breaks cycles; a graph has none, but be safe
    bool result = false;
    if (const onnx::NodeProto* node = producer(name)) {
      static const std::set<std::string> kElementwise = {"Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Neg",
                                                         "Exp", "Log", "Cast", "Identity", "Reciprocal", "Abs"};
      if (node->domain().empty() && node->op_type() == "Constant") {
        for (const auto& attr : node->attribute()) {
          if (attr.name() == "value") result = one_element(attr.t().dims());
          if (attr.name() == "value_float" || attr.name() == "value_int") result = true;
        }
      } else if (node->domain().empty() && kElementwise.contains(node->op_type()) && node->input_size() > 0) {
        result = true;
        for (const auto& in : node->input()) result = result && !in.empty() && is_scalar(in);
      } else if (node->domain().empty() && node->op_type() == "Gather" && node->input_size() == 2) {
        // One element of a 1-D tensor (make-trainable's per-group learning rates): the output
        // has as many elements as the indices.
        const auto rank = rank_.find(node->input(0));
        result = rank != rank_.end() && rank->second == 1 && is_scalar(node->input(1));
      }
    }
    return scalar_[name] = result;
  }

  const onnx::GraphProto& graph() const { return graph_; }

 private:
  const onnx::GraphProto& graph_;
  std::unordered_map<std::string, int> producer_;
  std::unordered_map<std::string, std::vector<int>> readers_;
  std::unordered_set<std::string> pinned_;
  std::unordered_map<std::string, bool> scalar_;
  std::unordered_map<std::string, int> rank_;
  std::unordered_map<std::string, int> elem_type_;

  void declare(const onnx::ValueInfoProto& v) {
    if (!v.type().has_tensor_type()) return;
    if (v.type().tensor_type().has_shape()) rank_[v.name()] = v.type().tensor_type().shape().dim_size();
    if (v.type().tensor_type().elem_type() != 0) elem_type_[v.name()] = v.type().tensor_type().elem_type();
  }
};

inline bool is_onnx_op(const onnx::NodeProto& node, const char* op_type) {
  return (node.domain().empty() || node.domain() == "ai.onnx") && node.op_type() == op_type;
}

// The value names of a graph (inputs, initializers, every node's inputs and outputs), to give
// the values a rewrite adds names no other value has.
class ValueNames {
 public:
  explicit ValueNames(const onnx::GraphProto& graph) {
    for (const auto& v : graph.input()) names_.insert(v.name());
    for (const auto& v : graph.initializer()) names_.insert(v.name());
    for (const auto& node : graph.node()) {
      names_.insert(node.input().begin(), node.input().end());
      names_.insert(node.output().begin(), node.output().end());
    }
  }
  // `base`, or base.1, base.2, ... the first no value has; taken from then on.
  std::string fresh(const std::string& base) {
    std::string name = base;
    for (int k = 1; names_.contains(name); ++k) name = base + "." + std::to_string(k);
    names_.insert(name);
    return name;
  }

 private:
  std::unordered_set<std::string> names_;
};

// The tensor of `name` when it is a constant: an initializer that is not a graph input (a run
// may replace those) or the `value` tensor of a Constant node; null otherwise.
inline const onnx::TensorProto* constant_proto(const onnx::GraphProto& graph, const Matcher& m, const std::string& name) {
  const onnx::TensorProto* proto = nullptr;
  if (const onnx::NodeProto* node = m.producer(name)) {
    if (is_onnx_op(*node, "Constant")) {
      for (const auto& attr : node->attribute()) {
        if (attr.name() == "value") proto = &attr.t();
      }
    }
    return proto;
  }
  for (const auto& in : graph.input()) {
    if (in.name() == name) return nullptr;
  }
  for (const auto& init : graph.initializer()) {
    if (init.name() == name) proto = &init;
  }
  return proto;
}

// The perm attribute of Transpose `node`, if it states one.
inline std::optional<std::vector<int64_t>> stated_perm(const onnx::NodeProto& node) {
  if (!is_onnx_op(node, "Transpose") || node.input_size() != 1 || node.output_size() != 1) return std::nullopt;
  for (const auto& attr : node.attribute()) {
    if (attr.name() == "perm") return std::vector<int64_t>(attr.ints().begin(), attr.ints().end());
  }
  return std::nullopt;
}

// graph's nodes with each node index in `replace` replaced by its nodes (in order) and each in
// `dropped` left out.
inline void rebuild_nodes(onnx::GraphProto& graph, std::map<int, std::vector<onnx::NodeProto>>& replace,
                   const std::set<int>& dropped) {
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  for (int i = 0; i < graph.node_size(); ++i) {
    if (dropped.contains(i)) continue;
    if (auto it = replace.find(i); it != replace.end()) {
      for (auto& node : it->second) nodes.Add()->Swap(&node);
    } else {
      nodes.Add()->Swap(graph.mutable_node(i));
    }
  }
  graph.mutable_node()->Swap(&nodes);
}

// The value of a node's int attribute `name` (transA or transB of a Gemm or a MatMulTransposed,
// a FusedConv's channels_last; 0 when absent).
inline int64_t int_attribute(const onnx::NodeProto& node, const std::string& name) {
  for (const auto& attr : node.attribute()) {
    if (attr.name() == name) return attr.i();
  }
  return 0;
}

// The values the graph's nodes name in string attributes (a Gradient node's xs, zs and y), which
// a rewrite must not make disappear.
inline std::unordered_set<std::string> attribute_named_values(const onnx::GraphProto& graph) {
  std::unordered_set<std::string> named;
  for (const auto& node : graph.node()) {
    for (const auto& attr : node.attribute()) {
      if (attr.type() == onnx::AttributeProto::STRING) named.insert(attr.s());
      for (const auto& v : attr.strings()) named.insert(v);
    }
  }
  return named;
}

// The node's attribute `name`, or null.
inline const onnx::AttributeProto* find_attribute(const onnx::NodeProto& node, const std::string& name) {
  for (const auto& attr : node.attribute()) {
    if (attr.name() == name) return &attr;
  }
  return nullptr;
}

// A Constant node writing `value` as `name` (the node is named `name` too).
inline onnx::NodeProto constant_node(const std::string& name, const Tensor& value) {
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

// The value of `name`, as int64, when it is an int64 or int32 constant (constant_proto) stored in
// the model file itself; nullopt otherwise (external data or a malformed tensor: left to the run).
inline std::optional<Tensor> int64_constant(const onnx::GraphProto& graph, const Matcher& m, const std::string& name) {
  const onnx::TensorProto* proto = constant_proto(graph, m, name);
  if (!proto || (proto->data_type() != onnx::TensorProto::INT64 && proto->data_type() != onnx::TensorProto::INT32)) {
    return std::nullopt;
  }
  try {
    return io::tensor_from_proto(*proto, {}, name).cast(DataType::Int64);
  } catch (const Error&) {
    return std::nullopt;
  }
}

// A Slice (opset 10 and later: bounds as inputs) of one axis with step 1 whose start, end, axis
// and step are constant single values: data[..., start:end, ...] along `axis`, the bounds as
// written (negative, or past the end: Slice's clamping is the caller's, once it knows the size).
struct OneAxisSlice {
  std::string data;
  int64_t axis = 0, start = 0, end = 0;
  // The positions [first, second) it takes of an axis of `size` (ONNX Slice-13's clamping, step 1).
  std::pair<int64_t, int64_t> range(int64_t size) const {
    const auto clamp = [size](int64_t v) { return std::clamp(v < 0 ? v + size : v, int64_t{0}, size); };
    const int64_t first = clamp(start);
    return {first, std::max(clamp(end), first)};
  }
};
// The size of dim `axis` (negative: from the end) of `name` as shape inference states it in
// `types`, and the axis made non-negative; nullopt when either is unknown or the axis is out of
// range (the kernel then names the error at run time).
inline std::optional<std::pair<int64_t, int64_t>> static_dim(const std::map<std::string, onnx::TypeProto>& types,
                                                              const std::string& name, int64_t axis) {
  const auto t = types.find(name);
  if (t == types.end() || !t->second.has_tensor_type() || !t->second.tensor_type().has_shape()) return std::nullopt;
  const auto& dims = t->second.tensor_type().shape().dim();
  const auto rank = static_cast<int64_t>(dims.size());
  if (axis < -rank || axis >= rank) return std::nullopt;
  if (axis < 0) axis += rank;
  const auto& d = dims[static_cast<int>(axis)];
  if (!d.has_dim_value()) return std::nullopt;
  return std::make_pair(d.dim_value(), axis);
}

// A node of `op_type` (ai.onnx) with these inputs and one output.
inline onnx::NodeProto node_of(const std::string& op_type, const std::vector<std::string>& inputs,
                               const std::string& output) {
  onnx::NodeProto node;
  node.set_op_type(op_type);
  for (const auto& in : inputs) node.add_input(in);
  node.add_output(output);
  return node;
}

inline std::optional<OneAxisSlice> one_axis_slice(const onnx::GraphProto& graph, const Matcher& m,
                                                  const onnx::NodeProto& node) {
  if (!is_onnx_op(node, "Slice") || node.input_size() < 3 || node.output_size() != 1) return std::nullopt;
  // Input k as its one value, `fallback` where the input is omitted; nullopt where it is not one
  // constant value.
  const auto one_value = [&](int k, std::optional<int64_t> fallback) -> std::optional<int64_t> {
    if (node.input_size() <= k || node.input(k).empty()) return fallback;
    const std::optional<Tensor> t = int64_constant(graph, m, node.input(k));
    if (!t || t->numel() != 1) return std::nullopt;
    return t->data<int64_t>()[0];
  };
  const auto start = one_value(1, std::nullopt), end = one_value(2, std::nullopt), axis = one_value(3, 0),
             step = one_value(4, 1);
  if (!start || !end || !axis || step != 1) return std::nullopt;
  return OneAxisSlice{node.input(0), *axis, *start, *end};
}

}  // namespace onnxtrain::runtime::graph_match
