// The autodiff engine: replaces Gradient nodes by backward nodes (see gradient.h).
//
// For one Gradient node: find the nodes between xs and y (descendants of xs that y depends
// on), walk them in reverse topological order from a seed of ones shaped like y, call each
// node's rule with the summed gradients of its outputs, reduce broadcast gradients back to
// their input's shape for rules marked `unbroadcast`, and sum the contributions to every x.
// Rules live in rules*.cpp; this file owns everything that is not specific to one op.
#include "autodiff/gradient.h"

#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "autodiff/builder.h"
#include "onnxtrain/error.h"

namespace onnxtrain::autodiff {

namespace {

bool is_gradient(const onnx::NodeProto& n) {
  return n.op_type() == "Gradient" && n.domain() == kTrainingDomain;
}

std::string node_label(const onnx::NodeProto& n, int index) {
  return "node '" + (n.name().empty() ? "#" + std::to_string(index) : n.name()) + "' (" + n.op_type() + ")";
}

std::vector<std::string> strings_attr(const onnx::NodeProto& n, const std::string& name) {
  for (const auto& a : n.attribute()) {
    if (a.name() == name) return {a.strings().begin(), a.strings().end()};
  }
  return {};
}

std::string string_attr(const onnx::NodeProto& n, const std::string& name) {
  for (const auto& a : n.attribute()) {
    if (a.name() == name) return a.s();
  }
  return {};
}

// Node indices of `graph` in an order where producers come first (the node list of a valid
// ONNX graph already is, but a graph being rewritten may not be).
std::vector<int> topological_order(const onnx::GraphProto& graph) {
  std::unordered_map<std::string, int> producer;
  for (int i = 0; i < graph.node_size(); ++i) {
    for (const auto& o : graph.node(i).output()) {
      if (!o.empty()) producer[o] = i;
    }
  }
  std::vector<int> order, state(static_cast<size_t>(graph.node_size()), 0);
  std::function<void(int)> visit = [&](int i) {
    if (state[static_cast<size_t>(i)] != 0) return;  // done, or on the stack (a cycle: the planner reports it)
    state[static_cast<size_t>(i)] = 1;
    for (const auto& in : graph.node(i).input()) {
      const auto it = producer.find(in);
      if (it != producer.end()) visit(it->second);
    }
    state[static_cast<size_t>(i)] = 2;
    order.push_back(i);
  };
  for (int i = 0; i < graph.node_size(); ++i) visit(i);
  return order;
}

struct ValueTypes {
  std::unordered_map<std::string, DataType> dtypes;
  std::unordered_map<std::string, int> ranks;
  std::unordered_map<std::string, int64_t> lengths;  // dim 0 of 1-D values, where known
};

// Element types and ranks of the graph's values: declared ones, then ONNX type inference.
ValueTypes infer_types(const onnx::GraphProto& graph, const OpsetMap& opsets) {
  ValueTypes result;
  auto& types = result.dtypes;
  auto record = [&](const onnx::ValueInfoProto& v) {
    if (!v.type().has_tensor_type()) return;
    const auto& t = v.type().tensor_type();
    if (t.elem_type() != 0) types[v.name()] = static_cast<DataType>(t.elem_type());
    if (t.has_shape()) {
      result.ranks[v.name()] = t.shape().dim_size();
      if (t.shape().dim_size() == 1 && t.shape().dim(0).has_dim_value()) result.lengths[v.name()] = t.shape().dim(0).dim_value();
    }
  };
  onnx::GraphProto copy = graph;
  try {
    onnx::shape_inference::InferShapes(&copy, opsets, onnx::OpSchemaRegistry::Instance(),
                                       onnx::ShapeInferenceOptions(false, 0, true));
  } catch (const std::exception&) {
    // Inference is best effort; the types it could not find are reported where they are needed.
  }
  for (const auto& v : copy.input()) record(v);
  for (const auto& v : copy.output()) record(v);
  for (const auto& v : copy.value_info()) record(v);
  for (const auto& t : graph.initializer()) {
    types[t.name()] = static_cast<DataType>(t.data_type());
    result.ranks[t.name()] = t.dims_size();
    if (t.dims_size() == 1) result.lengths[t.name()] = t.dims(0);
  }
  // Constant nodes: ONNX inference types them, but their lengths help Reshape and Unsqueeze below.
  for (const auto& n : graph.node()) {
    if (n.op_type() != "Constant" || n.output_size() != 1) continue;
    for (const auto& a : n.attribute()) {
      if (a.name() == "value" && a.t().dims_size() == 1) result.lengths[n.output(0)] = a.t().dims(0);
    }
  }
  return result;
}

// Fills in the element types of `node`'s outputs that `types` lacks, from its inputs and
// attributes: the rule of most ONNX ops (outputs typed like the first input) and the
// exceptions among the ops gradients use. This completes ONNX type inference, which stops at
// ops it has no schema for (the ai.onnxtrain domain) and at nodes it rejects.
void assign_output_types(const onnx::NodeProto& node, std::unordered_map<std::string, DataType>& types) {
  auto input_type = [&](int i) {
    if (i >= node.input_size()) return DataType::Undefined;
    const auto it = types.find(node.input(i));
    return it == types.end() ? DataType::Undefined : it->second;
  };
  auto find_attr = [&](const char* name) -> const onnx::AttributeProto* {
    for (const auto& a : node.attribute()) {
      if (a.name() == name) return &a;
    }
    return nullptr;
  };
  static const std::set<std::string> kBool = {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not",
                                              "And", "Or", "Xor", "IsNaN", "IsInf"};
  const std::string& type = node.op_type();
  const bool onnx = node.domain().empty() || node.domain() == "ai.onnx";
  for (int k = 0; k < node.output_size(); ++k) {
    const std::string& o = node.output(k);
    if (o.empty() || types.contains(o)) continue;
    DataType t = input_type(0);
    if (onnx && (type == "Shape" || type == "Size" || type == "ArgMax" || type == "ArgMin" || type == "NonZero" ||
                 (k == 1 && (type == "TopK" || type == "MaxPool")))) {
      t = DataType::Int64;
    } else if (onnx && (kBool.contains(type) || (k == 1 && type == "Dropout"))) {
      t = DataType::Bool;
    } else if (onnx && type == "Cast") {
      const auto* to = find_attr("to");
      t = to && to->type() == onnx::AttributeProto::INT ? static_cast<DataType>(to->i()) : DataType::Undefined;
    } else if (onnx && type == "CastLike") {
      t = input_type(1);
    } else if (onnx && (type == "Constant" || type == "ConstantOfShape")) {
      const auto* v = find_attr("value");
      t = v ? static_cast<DataType>(v->t().data_type()) : DataType::Float32;
    } else if (onnx && type == "Where") {
      t = input_type(1);
    } else if (onnx && type == "OneHot") {
      t = input_type(2);
    }
    if (t != DataType::Undefined) types[o] = t;
  }
}

// Fills in the ranks of `node`'s outputs that ONNX shape inference left unknown. Inference
// stops at values computed from data (a Slice with computed starts, a Reshape to a computed
// shape), yet most ops preserve or combine ranks in a known way, and gradient rules need
// only ranks (Transpose permutations, reduction axes).
void assign_output_ranks(const onnx::NodeProto& node, std::unordered_map<std::string, int>& ranks,
                         const std::unordered_map<std::string, int64_t>& lengths) {
  auto rank = [&](int i) -> int {
    if (i >= node.input_size() || node.input(i).empty()) return -1;
    const auto it = ranks.find(node.input(i));
    return it == ranks.end() ? -1 : it->second;
  };
  auto length = [&](int i) -> int64_t {
    if (i >= node.input_size()) return -1;
    const auto it = lengths.find(node.input(i));
    return it == lengths.end() ? -1 : it->second;
  };
  auto ints_attr = [&](const char* name) -> int64_t {  // number of ints, -1 when absent
    for (const auto& a : node.attribute()) {
      if (a.name() == name) return a.ints_size();
    }
    return -1;
  };
  auto int_attr = [&](const char* name, int64_t fallback) {
    for (const auto& a : node.attribute()) {
      if (a.name() == name) return a.i();
    }
    return fallback;
  };
  static const std::set<std::string> kSameRank = {
      "Abs", "Neg", "Sqrt", "Reciprocal", "Exp", "Log", "Erf", "Tanh", "Sigmoid", "Relu", "LeakyRelu", "Elu",
      "Selu", "Celu", "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Sin", "Cos", "Tan", "Asin", "Acos",
      "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Floor", "Ceil", "Round", "Sign", "Not", "IsNaN", "IsInf",
      "ThresholdedRelu", "Shrink", "Clip", "Cast", "CastLike", "Identity", "Dropout", "Softmax", "LogSoftmax",
      "Hardmax", "Slice", "Transpose", "Pad", "Tile", "CumSum", "Trilu", "LayerNormalization",
      "BatchNormalization", "InstanceNormalization", "Split", "TopK", "Concat", "ScatterElements", "ScatterND",
      "Scatter", "GatherElements", "Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool",
      "GlobalMaxPool", "Mod"};
  static const std::set<std::string> kBroadcast = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean",
                                                   "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
                                                   "And", "Or", "Xor", "Where", "PRelu"};
  const std::string& op = node.op_type();
  if (!node.domain().empty() && node.domain() != "ai.onnx") return;
  int r = -1;
  if (kSameRank.contains(op)) {
    r = rank(0);
  } else if (kBroadcast.contains(op)) {
    for (int i = 0; i < node.input_size(); ++i) {
      if (rank(i) < 0) return;
      r = std::max(r, rank(i));
    }
  } else if (op == "MatMul") {
    const int a = rank(0), b = rank(1);
    if (a < 1 || b < 1) return;
    r = a == 1 && b == 1 ? 0 : a == 1 ? b - 1 : b == 1 ? a - 1 : std::max(a, b);
  } else if (op == "Gemm" || op == "Flatten") {
    r = 2;
  } else if (op == "Shape") {
    r = 1;
  } else if (op == "Size") {
    r = 0;
  } else if (op == "Reshape" && node.input_size() > 1) {
    r = static_cast<int>(length(1));
  } else if (op == "Expand" && rank(0) >= 0 && length(1) >= 0) {
    r = std::max<int>(rank(0), static_cast<int>(length(1)));
  } else if (op == "Unsqueeze" && rank(0) >= 0) {
    const int64_t n = node.input_size() > 1 ? length(1) : ints_attr("axes");
    if (n >= 0) r = rank(0) + static_cast<int>(n);
  } else if (op == "Squeeze" && rank(0) >= 0) {
    const int64_t n = node.input_size() > 1 ? length(1) : ints_attr("axes");
    if (n >= 0) r = rank(0) - static_cast<int>(n);
  } else if (op == "Gather" && rank(0) >= 0 && rank(1) >= 0) {
    r = rank(0) - 1 + rank(1);
  } else if (op.rfind("Reduce", 0) == 0 && rank(0) >= 0) {
    if (int_attr("keepdims", 1) != 0) {
      r = rank(0);
    } else {
      const int64_t n = node.input_size() > 1 ? length(1) : ints_attr("axes");
      r = n < 0 ? (node.input_size() > 1 ? -1 : 0) : rank(0) - static_cast<int>(n);
    }
  }
  if (r < 0) return;
  for (const auto& o : node.output()) {
    if (!o.empty() && !ranks.contains(o)) ranks[o] = r;
  }
  if (op == "TopK" && node.output_size() > 1) ranks[node.output(1)] = r;
}

class Engine;

class EngineBuilder final : public Builder {
 public:
  EngineBuilder(Engine& engine, const onnx::NodeProto& node, int index, std::vector<bool> needs)
      : engine_(engine), node_(node), index_(index), needs_(std::move(needs)) {}

  const onnx::NodeProto& node() const override { return node_; }
  std::string GO(int i) override;
  bool has_GO(int i) const override;
  bool needs(int i) const override { return i < static_cast<int>(needs_.size()) && needs_[static_cast<size_t>(i)]; }
  void set_GI(int i, const std::string& gradient) override {
    if (!needs(i)) return;
    gi_.emplace_back(i, gradient);
  }
  int opset() const override;
  DataType dtype(const std::string& value) const override;
  int rank(const std::string& value) const override;
  std::string output(int i) override;
  std::vector<std::string> op_n(const std::string& type, const std::vector<std::string>& inputs, int n,
                                const std::vector<onnx::AttributeProto>& attrs, const std::string& domain,
                                const std::vector<bool>& wanted) override;

  const std::vector<std::pair<int, std::string>>& input_gradients() const { return gi_; }

 private:
  Engine& engine_;
  const onnx::NodeProto& node_;
  int index_;
  std::vector<bool> needs_;
  std::vector<std::pair<int, std::string>> gi_;
};

class Engine {
 public:
  Engine(onnx::GraphProto& graph, const OpsetMap& opsets, std::string where)
      : graph_(graph), opsets_(opsets), where_(std::move(where)) {}

  // Expands the Gradient node at `index`.
  void expand(int index);

  // --- used by EngineBuilder ---
  std::vector<std::string> emit(const std::string& type, const std::vector<std::string>& inputs, int n,
                                const std::vector<onnx::AttributeProto>& attrs, const std::string& domain,
                                const std::vector<bool>& wanted = {});
  DataType dtype(const std::string& value) const {
    const auto it = types_.find(value);
    if (it == types_.end() || it->second == DataType::Undefined) {
      throw Error(context_ + ": cannot infer the element type of '" + value +
                  "', which the gradient needs (declare it in the graph's value_info)");
    }
    return it->second;
  }
  int opset() const {
    const auto it = opsets_.find("");
    return it == opsets_.end() ? 1 : it->second;
  }
  int rank(const std::string& value) const {
    const auto it = ranks_.find(value);
    return it == ranks_.end() ? -1 : it->second;
  }
  // Names optional output `i` of node `index` when the graph left it unnamed.
  std::string name_output(int index, int i) {
    onnx::NodeProto& n = *graph_.mutable_node(index);
    while (n.output_size() <= i) n.add_output("");
    if (n.output(i).empty()) {
      const std::string name = fresh(n.op_type() + "_output" + std::to_string(i));
      n.set_output(i, name);
      producer_[name] = index;
      assign_output_types(n, types_);
    }
    return n.output(i);
  }
  // The summed gradient of `value` ("" when none has flowed into it).
  std::string gradient_of(const std::string& value) {
    auto it = grads_.find(value);
    if (it == grads_.end() || it->second.empty()) return {};
    auto& list = it->second;
    if (list.size() > 1) {
      const std::string sum = emit("Sum", list, 1, {}, "")[0];
      list = {sum};
    }
    return list[0];
  }
  bool has_gradient(const std::string& value) const {
    const auto it = grads_.find(value);
    return it != grads_.end() && !it->second.empty();
  }

 private:
  std::string fresh(const std::string& hint) {
    for (;;) {
      std::string name = prefix_ + "/" + hint + "_" + std::to_string(counter_++);
      if (names_.insert(name).second) return name;
    }
  }
  [[noreturn]] void missing_rule(const onnx::NodeProto& node, int index, const std::vector<std::string>& xs,
                                 const std::string& y);

  onnx::GraphProto& graph_;
  const OpsetMap& opsets_;
  std::string where_;
  std::string context_;
  std::string prefix_;
  int counter_ = 0;
  std::unordered_set<std::string> names_;
  std::unordered_map<std::string, DataType> types_;
  std::unordered_map<std::string, int> ranks_;
  std::unordered_map<std::string, std::vector<std::string>> grads_;
  std::vector<onnx::NodeProto> emitted_;
  std::unordered_map<std::string, int> producer_;
};

std::string EngineBuilder::GO(int i) {
  const std::string g = engine_.gradient_of(O(i));
  return g.empty() ? zeros_like(O(i)) : g;
}
bool EngineBuilder::has_GO(int i) const { return engine_.has_gradient(O(i)); }
int EngineBuilder::opset() const { return engine_.opset(); }
DataType EngineBuilder::dtype(const std::string& value) const { return engine_.dtype(value); }
int EngineBuilder::rank(const std::string& value) const { return engine_.rank(value); }
std::string EngineBuilder::output(int i) { return engine_.name_output(index_, i); }
std::vector<std::string> EngineBuilder::op_n(const std::string& type, const std::vector<std::string>& inputs,
                                             int n, const std::vector<onnx::AttributeProto>& attrs,
                                             const std::string& domain, const std::vector<bool>& wanted) {
  return engine_.emit(type, inputs, n, attrs, domain, wanted);
}

std::vector<std::string> Engine::emit(const std::string& type, const std::vector<std::string>& inputs, int n,
                                      const std::vector<onnx::AttributeProto>& attrs, const std::string& domain,
                                      const std::vector<bool>& wanted) {
  onnx::NodeProto node;
  node.set_op_type(type);
  if (!domain.empty()) node.set_domain(domain);
  node.set_name(fresh(type));
  for (const auto& in : inputs) node.add_input(in);
  std::vector<std::string> outputs;
  for (int k = 0; k < n; ++k) {
    const bool named = wanted.empty() || (static_cast<size_t>(k) < wanted.size() && wanted[static_cast<size_t>(k)]);
    outputs.push_back(named ? fresh(type + "_out") : std::string());
    node.add_output(outputs.back());
  }
  for (const auto& a : attrs) *node.add_attribute() = a;
  assign_output_types(node, types_);
  emitted_.push_back(std::move(node));
  return outputs;
}

void Engine::missing_rule(const onnx::NodeProto& node, int index, const std::vector<std::string>& xs,
                          const std::string& y) {
  // A path x -> ... -> node -> ... -> y, found by walking producers back from the node and
  // consumers forward to y.
  std::vector<std::string> back;
  std::set<std::string> x_set(xs.begin(), xs.end());
  std::string v = node.input_size() ? node.input(0) : "";
  for (const auto& in : node.input()) {
    if (x_set.contains(in) || producer_.contains(in)) {
      v = in;
      break;
    }
  }
  std::set<std::string> seen;
  while (!v.empty() && !x_set.contains(v) && seen.insert(v).second) {
    const auto it = producer_.find(v);
    if (it == producer_.end()) break;
    const auto& p = graph_.node(it->second);
    back.push_back(p.op_type());
    std::string next;
    for (const auto& in : p.input()) {
      if (x_set.contains(in) || producer_.contains(in)) {
        next = in;
        break;
      }
    }
    v = next;
  }
  std::string path = v.empty() ? "?" : "'" + v + "'";
  for (auto it = back.rbegin(); it != back.rend(); ++it) path += " -> " + *it;
  path += " -> [" + node.op_type() + "] -> ... -> '" + y + "'";
  throw Error(context_ + ": no gradient rule for " + (node.domain().empty() ? "" : node.domain() + ".") +
              node.op_type() + " at " + node_label(node, index) + ", on the path " + path +
              " (see docs/gradients.md for the operators onnxtrain differentiates)");
}

void Engine::expand(int index) {
  const onnx::NodeProto gradient = graph_.node(index);
  context_ = where_ + ", " + node_label(gradient, index);
  prefix_ = gradient.name().empty() ? "Gradient_" + std::to_string(index) : gradient.name();
  counter_ = 0;
  emitted_.clear();
  grads_.clear();
  producer_.clear();
  names_.clear();

  const std::vector<std::string> xs = strings_attr(gradient, "xs");
  const std::vector<std::string> zs = strings_attr(gradient, "zs");
  const std::string y = string_attr(gradient, "y");
  if (xs.empty()) throw Error(context_ + ": attribute 'xs' is missing or empty");
  if (y.empty()) throw Error(context_ + ": attribute 'y' is missing");
  if (gradient.input_size() != static_cast<int>(xs.size() + zs.size())) {
    throw Error(context_ + ": has " + std::to_string(gradient.input_size()) + " inputs but xs and zs name " +
                std::to_string(xs.size() + zs.size()) + " tensors (the inputs are the values of xs, then zs)");
  }
  if (gradient.output_size() > static_cast<int>(xs.size())) {
    throw Error(context_ + ": has " + std::to_string(gradient.output_size()) + " outputs but xs names only " +
                std::to_string(xs.size()) + " tensors");
  }

  // Every name the graph defines, apart from the Gradient node's own outputs.
  std::unordered_set<std::string> defined;
  for (const auto& v : graph_.input()) defined.insert(v.name());
  for (const auto& t : graph_.initializer()) defined.insert(t.name());
  for (int i = 0; i < graph_.node_size(); ++i) {
    for (const auto& o : graph_.node(i).output()) {
      if (o.empty()) continue;
      names_.insert(o);
      if (i == index) continue;
      defined.insert(o);
      producer_[o] = i;
    }
  }
  names_.insert(defined.begin(), defined.end());
  auto check_defined = [&](const std::string& name, const char* attr) {
    if (!defined.contains(name)) {
      throw Error(context_ + ": attribute '" + attr + "' names '" + name + "', which the graph does not define");
    }
  };
  for (const auto& x : xs) check_defined(x, "xs");
  for (const auto& z : zs) check_defined(z, "zs");
  check_defined(y, "y");

  {
    ValueTypes inferred = infer_types(graph_, opsets_);
    types_ = std::move(inferred.dtypes);
    ranks_ = std::move(inferred.ranks);
    for (int i : topological_order(graph_)) {
      assign_output_types(graph_.node(i), types_);
      assign_output_ranks(graph_.node(i), ranks_, inferred.lengths);
    }
  }
  for (const auto& x : xs) {
    const auto it = types_.find(x);
    if (it != types_.end() && it->second != DataType::Undefined && !is_floating(it->second)) {
      throw Error(context_ + ": xs names '" + x + "' of type " + std::string(dtype_name(it->second)) +
                  "; gradients exist only for floating-point tensors");
    }
  }

  const std::vector<int> order = topological_order(graph_);
  std::vector<onnx::NodeProto> clones;
  std::vector<std::string> x_values = xs;
  std::string y_value = y;

  // Nodes that read xs or zs, directly or not (their values change when the node's inputs do).
  auto descendants_of = [&](const std::vector<std::string>& roots, const std::vector<int>& node_order) {
    std::unordered_set<std::string> values(roots.begin(), roots.end());
    std::unordered_set<int> nodes;
    for (int i : node_order) {
      if (i == index) continue;
      const auto& n = graph_.node(i);
      if (std::any_of(n.input().begin(), n.input().end(), [&](const std::string& in) { return values.contains(in); })) {
        nodes.insert(i);
        for (const auto& o : n.output()) {
          if (!o.empty()) values.insert(o);
        }
      }
    }
    return std::pair{values, nodes};
  };
  // Nodes y depends on, not looking past `stop` values.
  auto ancestors_of = [&](const std::string& target, const std::unordered_set<std::string>& stop) {
    std::unordered_set<int> nodes;
    std::deque<std::string> queue{target};
    std::unordered_set<std::string> seen{target};
    while (!queue.empty()) {
      const std::string v = queue.front();
      queue.pop_front();
      if (stop.contains(v)) continue;
      const auto it = producer_.find(v);
      if (it == producer_.end()) continue;
      if (!nodes.insert(it->second).second) continue;
      for (const auto& in : graph_.node(it->second).input()) {
        if (!in.empty() && seen.insert(in).second) queue.push_back(in);
      }
    }
    return nodes;
  };

  bool reuse = true;
  for (size_t i = 0; i < xs.size(); ++i) reuse = reuse && gradient.input(static_cast<int>(i)) == xs[i];
  for (size_t i = 0; i < zs.size(); ++i) reuse = reuse && gradient.input(static_cast<int>(xs.size() + i)) == zs[i];

  std::unordered_set<std::string> leaf_set(xs.begin(), xs.end());
  if (!reuse) {
    // Clone the nodes between xs+zs and y, reading the Gradient node's inputs instead.
    std::vector<std::string> roots = xs;
    roots.insert(roots.end(), zs.begin(), zs.end());
    const auto [desc_values, desc_nodes] = descendants_of(roots, order);
    std::unordered_set<std::string> stop(roots.begin(), roots.end());
    const auto anc = ancestors_of(y, stop);
    std::unordered_map<std::string, std::string> rename;
    for (size_t i = 0; i < roots.size(); ++i) rename[roots[i]] = gradient.input(static_cast<int>(i));
    for (int i : order) {
      if (!anc.contains(i) || !desc_nodes.contains(i)) continue;
      onnx::NodeProto clone = graph_.node(i);
      clone.set_name(fresh("clone_" + clone.op_type()));
      for (auto& in : *clone.mutable_input()) {
        const auto it = rename.find(in);
        if (it != rename.end()) in = it->second;
      }
      for (auto& o : *clone.mutable_output()) {
        if (o.empty()) continue;
        const std::string renamed = fresh("clone");
        const auto t = types_.find(o);
        if (t != types_.end()) types_[renamed] = t->second;
        const auto r = ranks_.find(o);
        if (r != ranks_.end()) ranks_[renamed] = r->second;
        rename[o] = renamed;
        o = renamed;
      }
      clones.push_back(std::move(clone));
    }
    if (!rename.contains(y)) {
      throw Error(context_ + ": y '" + y + "' does not depend on xs or zs, so there is nothing to re-evaluate");
    }
    y_value = rename.at(y);
    for (size_t i = 0; i < xs.size(); ++i) {
      x_values[i] = gradient.input(static_cast<int>(i));
      const auto t = types_.find(xs[i]);
      if (t != types_.end() && !types_.contains(x_values[i])) types_[x_values[i]] = t->second;
      const auto r = ranks_.find(xs[i]);
      if (r != ranks_.end() && !ranks_.contains(x_values[i])) ranks_[x_values[i]] = r->second;
    }
    // The walk below runs over the clones: index them as the graph's nodes.
    for (auto& c : clones) *graph_.add_node() = c;
    for (int i = graph_.node_size() - static_cast<int>(clones.size()); i < graph_.node_size(); ++i) {
      for (const auto& o : graph_.node(i).output()) {
        if (!o.empty()) producer_[o] = i;
      }
    }
    leaf_set = std::unordered_set<std::string>(x_values.begin(), x_values.end());
  }

  // The backward walk over nodes between x_values and y_value.
  const std::vector<int> walk_order = topological_order(graph_);
  const auto [desc_values, desc_nodes] = descendants_of(x_values, walk_order);
  const auto anc = ancestors_of(y_value, leaf_set);
  if (!is_floating(dtype(y_value))) {
    throw Error(context_ + ": y '" + y + "' is " + std::string(dtype_name(dtype(y_value))) +
                "; only a floating-point tensor can be differentiated");
  }
  // The seed: ones shaped like y, so the result is the gradient of sum(y).
  const std::string seed = EngineBuilder(*this, gradient, index, {}).ones_like(y_value);
  grads_[y_value].push_back(seed);

  for (auto it = walk_order.rbegin(); it != walk_order.rend(); ++it) {
    const int i = *it;
    if (i == index || !anc.contains(i) || !desc_nodes.contains(i)) continue;
    const onnx::NodeProto& node = graph_.node(i);
    if (std::none_of(node.output().begin(), node.output().end(),
                     [&](const std::string& o) { return !o.empty() && has_gradient(o); })) {
      continue;
    }
    const Rule* rule = find_rule(node.domain() == "ai.onnx" ? "" : node.domain(), node.op_type());
    if (!rule) missing_rule(node, i, x_values, y);
    if (rule->differentiable == 0) continue;
    std::vector<bool> needs(static_cast<size_t>(node.input_size()), false);
    bool any = false;
    for (int k = 0; k < node.input_size(); ++k) {
      const std::string& in = node.input(k);
      if (in.empty() || !desc_values.contains(in) || k >= 32 || !(rule->differentiable & (1u << k))) continue;
      const auto t = types_.find(in);
      if (t != types_.end() && t->second != DataType::Undefined && !is_floating(t->second)) continue;
      needs[static_cast<size_t>(k)] = true;
      any = true;
    }
    if (!any) continue;
    EngineBuilder builder(*this, node, i, needs);
    try {
      rule->build(builder);
    } catch (const Error& e) {
      throw Error(std::string(e.what()) + " (in the gradient rule of " + node_label(node, i) + ")");
    }
    for (const auto& [k, g] : builder.input_gradients()) {
      const std::string& in = node.input(k);
      grads_[in].push_back(rule->unbroadcast ? builder.sum_to_shape_of(g, in) : g);
    }
  }

  // The Gradient node's outputs.
  for (int k = 0; k < gradient.output_size(); ++k) {
    const std::string& out = gradient.output(k);
    if (out.empty()) continue;
    std::string g = gradient_of(x_values[static_cast<size_t>(k)]);
    if (g.empty()) {
      // y does not depend on this x: zeros shaped like it.
      EngineBuilder builder(*this, gradient, index, {});
      g = builder.zeros_like(x_values[static_cast<size_t>(k)]);
    }
    onnx::NodeProto identity;
    identity.set_op_type("Identity");
    identity.set_name(fresh("output"));
    identity.add_input(g);
    identity.add_output(out);
    emitted_.push_back(std::move(identity));
  }

  // Splice: the emitted nodes take the Gradient node's place; clones were appended already.
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  for (int i = 0; i < graph_.node_size(); ++i) {
    if (i == index) {
      for (auto& e : emitted_) *nodes.Add() = std::move(e);
    } else {
      *nodes.Add() = graph_.node(i);
    }
  }
  graph_.mutable_node()->Swap(&nodes);
}

}  // namespace

bool has_gradient_nodes(const onnx::GraphProto& graph) {
  return std::any_of(graph.node().begin(), graph.node().end(), is_gradient);
}

void expand_gradients(onnx::GraphProto& graph, const OpsetMap& opsets, const std::string& where) {
  // One node at a time, earliest in topological order first, so a Gradient node whose y
  // depends on another one's outputs (a higher-order derivative) sees that one expanded.
  while (has_gradient_nodes(graph)) {
    int next = -1;
    for (int i : topological_order(graph)) {
      if (is_gradient(graph.node(i))) {
        next = i;
        break;
      }
    }
    Engine engine(graph, opsets, where);
    engine.expand(next);
  }
}

}  // namespace onnxtrain::autodiff
