// The autodiff engine: replaces Gradient nodes by backward nodes (see gradient.h).
//
// For one Gradient node: find the nodes between xs and y (descendants of xs that y depends
// on), walk them in reverse topological order from a seed of ones shaped like y, call each
// node's rule with the summed gradients of its outputs, reduce broadcast gradients back to
// their input's shape for rules marked `unbroadcast`, and sum the contributions to every x.
// Rules live in rules*.cpp; this file owns everything that is not specific to one op.
//
// Control flow: a node's subgraphs read values of the enclosing graph (its implicit inputs),
// and paths from xs to y run through those reads like through inputs. A Loop on such a path is
// unrolled first (subgraphs.h), when its trip count is a constant and nothing else ends it, so
// the ordinary rules differentiate its iterations; any other Loop there is an error. An If's
// rule (rules_control_flow.cpp) asks the engine for the backward graph of each branch
// (backward_subgraph): a second Engine works on a copy of the branch, with the enclosing
// graph's types and constants, and may recurse into nested If nodes the same way.
#include "autodiff/gradient.h"

#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "autodiff/builder.h"
#include "autodiff/sequences.h"
#include "autodiff/subgraphs.h"
#include "ir/graph.h"
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

struct ValueTypes {
  std::unordered_map<std::string, DataType> dtypes;
  std::unordered_map<std::string, int> ranks;
  std::unordered_map<std::string, int64_t> lengths;  // dim 0 of 1-D values, where known
  std::unordered_map<std::string, std::vector<int64_t>> dims;  // static dims, -1 where unknown
};

// The declared type of the subgraph output that becomes output k of an If or Loop node.
const onnx::TypeProto* subgraph_output_type(const onnx::NodeProto& node, int k) {
  const bool is_if = node.op_type() == "If";
  for (const auto& a : node.attribute()) {
    if (a.name() != (is_if ? "then_branch" : "body") || !a.has_g()) continue;
    const int index = is_if ? k : k + 1;
    if (index < a.g().output_size()) return &a.g().output(index).type();
  }
  return nullptr;
}

// Element types and ranks of the graph's values: declared ones, then ONNX type inference.
// `enclosing` holds those of the enclosing graphs when `graph` is a subgraph.
ValueTypes infer_types(const onnx::GraphProto& graph, const OpsetMap& opsets, const ValueTypes* enclosing) {
  ValueTypes result;
  auto& types = result.dtypes;
  auto record = [&](const onnx::ValueInfoProto& v) {
    if (!v.type().has_tensor_type()) return;
    const auto& t = v.type().tensor_type();
    if (t.elem_type() != 0) types[v.name()] = static_cast<DataType>(t.elem_type());
    if (t.has_shape()) {
      result.ranks[v.name()] = t.shape().dim_size();
      if (t.shape().dim_size() == 1 && t.shape().dim(0).has_dim_value()) result.lengths[v.name()] = t.shape().dim(0).dim_value();
      std::vector<int64_t>& dims = result.dims[v.name()];
      for (const auto& d : t.shape().dim()) dims.push_back(d.has_dim_value() ? d.dim_value() : -1);
    }
  };
  onnx::GraphProto copy = graph;
  if (enclosing) {
    // The enclosing values the subgraph reads, declared as inputs so inference sees their types.
    std::unordered_set<std::string> free;
    ir::collect_free_names(graph, free);
    for (const auto& name : free) {
      const auto t = enclosing->dtypes.find(name);
      if (t == enclosing->dtypes.end() || t->second == DataType::Undefined) continue;
      auto* v = copy.add_input();
      v->set_name(name);
      auto* type = v->mutable_type()->mutable_tensor_type();
      type->set_elem_type(static_cast<int32_t>(t->second));
      const auto r = enclosing->ranks.find(name);
      if (r == enclosing->ranks.end()) continue;
      auto* shape = type->mutable_shape();
      for (int d = 0; d < r->second; ++d) shape->add_dim();
      const auto length = enclosing->lengths.find(name);
      if (r->second == 1 && length != enclosing->lengths.end()) shape->mutable_dim(0)->set_dim_value(length->second);
    }
  }
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
    result.dims[t.name()].assign(t.dims().begin(), t.dims().end());
    if (t.dims_size() == 1) result.lengths[t.name()] = t.dims(0);
  }
  // Constant nodes: ONNX inference types them, but their lengths help Reshape and Unsqueeze below.
  for (const auto& n : graph.node()) {
    if (n.op_type() != "Constant" || n.output_size() != 1) continue;
    for (const auto& a : n.attribute()) {
      if (a.name() == "value" && a.t().dims_size() == 1) result.lengths[n.output(0)] = a.t().dims(0);
    }
  }
  if (enclosing) {
    for (const auto& [name, t] : enclosing->dtypes) result.dtypes.try_emplace(name, t);
    for (const auto& [name, r] : enclosing->ranks) result.ranks.try_emplace(name, r);
    for (const auto& [name, n] : enclosing->lengths) result.lengths.try_emplace(name, n);
    for (const auto& [name, d] : enclosing->dims) result.dims.try_emplace(name, d);
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
    } else if (onnx && (type == "If" || type == "Loop")) {
      const onnx::TypeProto* declared = subgraph_output_type(node, k);
      const bool typed = declared && declared->has_tensor_type() && declared->tensor_type().elem_type() != 0;
      t = typed ? static_cast<DataType>(declared->tensor_type().elem_type()) : DataType::Undefined;
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
  if (op == "If" || op == "Loop") {
    // As the subgraph declares; a Loop's scan outputs gain a leading axis.
    const int carried = node.input_size() - 2;
    for (int k = 0; k < node.output_size(); ++k) {
      const onnx::TypeProto* declared = subgraph_output_type(node, k);
      if (node.output(k).empty() || ranks.contains(node.output(k)) || !declared || !declared->has_tensor_type() ||
          !declared->tensor_type().has_shape()) {
        continue;
      }
      const int declared_rank = declared->tensor_type().shape().dim_size();
      ranks[node.output(k)] = op == "Loop" && k >= carried ? declared_rank + 1 : declared_rank;
    }
    return;
  }
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
    // Axes absent or empty: every axis, or none with noop_with_empty_axes (the versions that
    // take axes as an input); an axes input of unknown length leaves the rank unknown.
    const bool axes_input = node.input_size() > 1 && !node.input(1).empty();
    const int64_t n = axes_input ? length(1) : ints_attr("axes");
    const bool noop = int_attr("noop_with_empty_axes", 0) != 0;
    if (int_attr("keepdims", 1) != 0) {
      r = rank(0);
    } else if (axes_input && n < 0) {
      r = -1;
    } else {
      r = n <= 0 ? (noop ? rank(0) : 0) : rank(0) - static_cast<int>(n);
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
  EngineBuilder(Engine& engine, const onnx::NodeProto& node, int index, std::vector<bool> needs,
                std::vector<std::string> implicit = {}, std::vector<bool> implicit_needs = {})
      : engine_(engine), node_(node), index_(index), needs_(std::move(needs)), implicit_(std::move(implicit)),
        implicit_needs_(std::move(implicit_needs)) {}

  const onnx::NodeProto& node() const override { return node_; }
  std::string GO(int i) override;
  bool has_GO(int i) const override;
  bool needs(int i) const override { return i < static_cast<int>(needs_.size()) && needs_[static_cast<size_t>(i)]; }
  void set_GI(int i, const std::string& gradient) override {
    if (!needs(i)) return;
    gi_.emplace_back(i, gradient);
  }
  const std::vector<std::string>& implicit_inputs() const override { return implicit_; }
  bool needs_implicit(int j) const override {
    return j >= 0 && j < static_cast<int>(implicit_needs_.size()) && implicit_needs_[static_cast<size_t>(j)];
  }
  void set_implicit_GI(int j, const std::string& gradient) override {
    if (!needs_implicit(j)) return;
    implicit_gi_.emplace_back(j, gradient);
  }
  onnx::GraphProto backward_subgraph(const onnx::GraphProto& subgraph, const std::vector<std::string>& output_gradients,
                                     const std::vector<std::string>& wrt, const std::string& label) override;
  int opset() const override;
  DataType dtype(const std::string& value) const override;
  int rank(const std::string& value) const override;
  std::string output(int i) override;
  std::vector<std::string> op_n(const std::string& type, const std::vector<std::string>& inputs, int n,
                                const std::vector<onnx::AttributeProto>& attrs, const std::string& domain,
                                const std::vector<bool>& wanted) override;

  const std::vector<std::pair<int, std::string>>& input_gradients() const { return gi_; }
  const std::vector<std::pair<int, std::string>>& implicit_gradients() const { return implicit_gi_; }

 private:
  Engine& engine_;
  const onnx::NodeProto& node_;
  int index_;
  std::vector<bool> needs_;
  std::vector<std::string> implicit_;
  std::vector<bool> implicit_needs_;
  std::vector<std::pair<int, std::string>> gi_, implicit_gi_;
};

class Engine {
 public:
  // `parent`: the engine of the enclosing graph when `graph` is a copy of one of its subgraphs.
  Engine(onnx::GraphProto& graph, const OpsetMap& opsets, std::string where, Engine* parent = nullptr)
      : graph_(graph), opsets_(opsets), where_(std::move(where)), parent_(parent) {}

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
  // See Builder::backward_subgraph.
  onnx::GraphProto backward_subgraph(const onnx::GraphProto& subgraph, const std::vector<std::string>& output_gradients,
                                     const std::vector<std::string>& wrt, const std::string& label);

 private:
  // A name not yet in use: the Gradient node's name, the forward node whose gradient rule is
  // running (scope_, so that a profile or an error names the node a backward kernel belongs to),
  // the hint and a counter.
  std::string fresh(const std::string& hint) {
    for (;;) {
      std::string name = prefix_ + (scope_.empty() || scope_.front() == '/' ? "" : "/") + scope_ + "/" + hint + "_" +
                         std::to_string(counter_++);
      if (names_.insert(name).second) return name;
    }
  }
  // Records the producers of the graph's values, leaving out node `skip` (the Gradient node),
  // and every name in use.
  void index_graph(int skip);
  // Element types and ranks of every value, with those of the enclosing graphs for a subgraph.
  void infer_value_types();
  ValueTypes value_types() const { return {types_, ranks_, lengths_, dims_}; }
  // The value of `name` when it is a constant of this graph or of an enclosing one.
  std::optional<onnx::TensorProto> constant_value(const std::string& name) const;
  // Nodes that read `roots`, directly or not (through inputs or subgraphs), leaving out `skip`.
  std::pair<std::unordered_set<std::string>, std::unordered_set<int>> descendants_of(const std::vector<std::string>& roots,
                                                                                  const std::vector<int>& order,
                                                                                  int skip) const;
  // Nodes the targets depend on, not looking past `stop` values.
  std::unordered_set<int> ancestors_of(const std::vector<std::string>& targets,
                                       const std::unordered_set<std::string>& stop) const;
  // Unrolls every Loop and Scan between xs and the targets (subgraphs.h); returns `skip` moved
  // along with the nodes.
  int unroll_loops_on_path(const std::vector<std::string>& xs, const std::vector<std::string>& targets, int skip);
  // The backward walk from `seeds` (value, gradient flowing into it) over the nodes between
  // x_values and the seeded values; `y` names the target in errors.
  void backward(const std::vector<std::string>& x_values, const std::vector<std::pair<std::string, std::string>>& seeds,
                const std::string& y, int skip);
  // Fills this engine's graph, a copy of `forward`'s nodes, as backward_subgraph describes.
  void differentiate_subgraph(const onnx::GraphProto& forward, const std::vector<std::string>& output_gradients,
                              const std::vector<std::string>& wrt);
  // An Identity node from `value` to the output name `out`.
  void emit_identity(const std::string& value, const std::string& out) {
    onnx::NodeProto identity;
    identity.set_op_type("Identity");
    identity.set_name(fresh("output"));
    identity.add_input(value);
    identity.add_output(out);
    emitted_.push_back(std::move(identity));
  }
  std::string zeros_like(const std::string& value) {
    static const onnx::NodeProto none;
    return EngineBuilder(*this, none, -1, {}).zeros_like(value);
  }
  [[noreturn]] void missing_rule(const onnx::NodeProto& node, int index, const std::vector<std::string>& xs,
                                 const std::string& y);

  onnx::GraphProto& graph_;
  const OpsetMap& opsets_;
  std::string where_;
  Engine* parent_;
  std::string context_;
  std::string prefix_;
  std::string scope_;  // the forward node being differentiated, while its rule runs
  int counter_ = 0;
  std::unordered_set<std::string> names_;
  std::unordered_map<std::string, DataType> types_;
  std::unordered_map<std::string, int> ranks_;
  std::unordered_map<std::string, int64_t> lengths_;
  std::unordered_map<std::string, std::vector<int64_t>> dims_;
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
onnx::GraphProto EngineBuilder::backward_subgraph(const onnx::GraphProto& subgraph,
                                                  const std::vector<std::string>& output_gradients,
                                                  const std::vector<std::string>& wrt, const std::string& label) {
  return engine_.backward_subgraph(subgraph, output_gradients, wrt, label + " of " + node_label(node_, index_));
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
  auto on_path = [&](const onnx::NodeProto& n, const std::string& fallback) {
    for (const auto& in : node_reads(n)) {
      if (x_set.contains(in) || producer_.contains(in)) return in;
    }
    return fallback;
  };
  std::string v = on_path(node, node.input_size() ? node.input(0) : "");
  std::set<std::string> seen;
  while (!v.empty() && !x_set.contains(v) && seen.insert(v).second) {
    const auto it = producer_.find(v);
    if (it == producer_.end()) break;
    const auto& p = graph_.node(it->second);
    back.push_back(p.op_type());
    v = on_path(p, "");
  }
  std::string path = v.empty() ? "?" : "'" + v + "'";
  for (auto it = back.rbegin(); it != back.rend(); ++it) path += " -> " + *it;
  path += " -> [" + node.op_type() + "] -> ... -> '" + y + "'";
  throw Error(context_ + ": no gradient rule for " + (node.domain().empty() ? "" : node.domain() + ".") +
              node.op_type() + " at " + node_label(node, index) + ", on the path " + path +
              " (see docs/gradients.md for the operators onnxtrain differentiates)");
}

void Engine::index_graph(int skip) {
  producer_.clear();
  for (const auto& v : graph_.input()) names_.insert(v.name());
  for (const auto& t : graph_.initializer()) names_.insert(t.name());
  for (int i = 0; i < graph_.node_size(); ++i) {
    for (const auto& o : graph_.node(i).output()) {
      if (o.empty()) continue;
      names_.insert(o);
      if (i != skip) producer_[o] = i;
    }
  }
}

void Engine::infer_value_types() {
  const ValueTypes enclosing = parent_ ? parent_->value_types() : ValueTypes{};
  ValueTypes inferred = infer_types(graph_, opsets_, parent_ ? &enclosing : nullptr);
  types_ = std::move(inferred.dtypes);
  ranks_ = std::move(inferred.ranks);
  lengths_ = std::move(inferred.lengths);
  dims_ = std::move(inferred.dims);
  for (int i : topological_order(graph_)) {
    assign_output_types(graph_.node(i), types_);
    assign_output_ranks(graph_.node(i), ranks_, lengths_);
  }
}

std::optional<onnx::TensorProto> Engine::constant_value(const std::string& name) const {
  if (auto value = constant_in(graph_, name)) return value;
  if (defines(graph_, name) || !parent_) return std::nullopt;
  return parent_->constant_value(name);
}

std::pair<std::unordered_set<std::string>, std::unordered_set<int>> Engine::descendants_of(
    const std::vector<std::string>& roots, const std::vector<int>& order, int skip) const {
  std::unordered_set<std::string> values(roots.begin(), roots.end());
  std::unordered_set<int> nodes;
  for (int i : order) {
    if (i == skip) continue;
    const auto& n = graph_.node(i);
    const std::vector<std::string> reads = node_reads(n);
    if (std::any_of(reads.begin(), reads.end(), [&](const std::string& in) { return values.contains(in); })) {
      nodes.insert(i);
      for (const auto& o : n.output()) {
        if (!o.empty()) values.insert(o);
      }
    }
  }
  return {values, nodes};
}

std::unordered_set<int> Engine::ancestors_of(const std::vector<std::string>& targets,
                                             const std::unordered_set<std::string>& stop) const {
  std::unordered_set<int> nodes;
  std::deque<std::string> queue(targets.begin(), targets.end());
  std::unordered_set<std::string> seen(targets.begin(), targets.end());
  while (!queue.empty()) {
    const std::string v = queue.front();
    queue.pop_front();
    if (stop.contains(v)) continue;
    const auto it = producer_.find(v);
    if (it == producer_.end()) continue;
    if (!nodes.insert(it->second).second) continue;
    for (const auto& in : node_reads(graph_.node(it->second))) {
      if (seen.insert(in).second) queue.push_back(in);
    }
  }
  return nodes;
}

int Engine::unroll_loops_on_path(const std::vector<std::string>& xs, const std::vector<std::string>& targets, int skip) {
  const std::unordered_set<std::string> stop(xs.begin(), xs.end());
  // Static dims come from shape inference over the graph as it is when a Scan is unrolled.
  ValueTypes shapes;
  LoopScope scope{[this](const std::string& hint) { return fresh(hint); },
                  [this](const std::string& name) { return constant_value(name); }, opset(), context_, {}};
  scope.static_dims = [&shapes](const std::string& name) -> std::optional<std::vector<int64_t>> {
    const auto it = shapes.dims.find(name);
    if (it == shapes.dims.end()) return std::nullopt;
    return it->second;
  };
  for (;;) {
    const std::vector<int> order = topological_order(graph_);
    const auto desc_nodes = descendants_of(xs, order, skip).second;
    const auto anc = ancestors_of(targets, stop);
    const auto loop = std::find_if(order.begin(), order.end(), [&](int i) {
      const auto& n = graph_.node(i);
      return (n.op_type() == "Loop" || n.op_type() == "Scan") && (n.domain().empty() || n.domain() == "ai.onnx") &&
             desc_nodes.contains(i) && anc.contains(i);
    });
    if (loop == order.end()) return skip;
    const int at = *loop;
    const onnx::NodeProto& node = graph_.node(at);
    std::vector<onnx::NodeProto> unrolled;
    if (node.op_type() == "Loop") {
      unrolled = unroll_loop(node, node_label(node, at), scope);
    } else {
      const ValueTypes enclosing = parent_ ? parent_->value_types() : ValueTypes{};
      shapes = infer_types(graph_, opsets_, parent_ ? &enclosing : nullptr);
      unrolled = unroll_scan(node, node_label(node, at), scope);
    }
    google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
    for (int i = 0; i < graph_.node_size(); ++i) {
      if (i != at) {
        nodes.Add()->Swap(graph_.mutable_node(i));
        continue;
      }
      for (auto& n : unrolled) nodes.Add()->Swap(&n);
    }
    graph_.mutable_node()->Swap(&nodes);
    if (skip > at) skip += static_cast<int>(unrolled.size()) - 1;
    index_graph(skip);
  }
}

void Engine::backward(const std::vector<std::string>& x_values,
                      const std::vector<std::pair<std::string, std::string>>& seeds, const std::string& y, int skip) {
  const std::vector<int> walk_order = topological_order(graph_);
  // Not a structured binding: the lambda below captures desc_values, which clang before 16
  // does not allow of a binding (C++20 P1091).
  const auto descendants = descendants_of(x_values, walk_order, skip);
  const auto& desc_values = descendants.first;
  const auto& desc_nodes = descendants.second;
  std::vector<std::string> targets;
  for (const auto& [value, gradient] : seeds) {
    targets.push_back(value);
    grads_[value].push_back(gradient);
  }
  const auto anc = ancestors_of(targets, std::unordered_set<std::string>(x_values.begin(), x_values.end()));
  // Whether the gradient of value v is wanted: v depends on xs and may be floating-point.
  auto wanted = [&](const std::string& v) {
    if (v.empty() || !desc_values.contains(v)) return false;
    const auto t = types_.find(v);
    return t == types_.end() || t->second == DataType::Undefined || is_floating(t->second);
  };

  for (auto it = walk_order.rbegin(); it != walk_order.rend(); ++it) {
    const int i = *it;
    if (i == skip || !anc.contains(i) || !desc_nodes.contains(i)) continue;
    const onnx::NodeProto& node = graph_.node(i);
    if (std::none_of(node.output().begin(), node.output().end(),
                     [&](const std::string& o) { return !o.empty() && has_gradient(o); })) {
      continue;
    }
    const Rule* rule = find_rule(node.domain() == "ai.onnx" ? "" : node.domain(), node.op_type());
    if (!rule) missing_rule(node, i, x_values, y);
    std::vector<bool> needs(static_cast<size_t>(node.input_size()), false);
    bool any = false;
    for (int k = 0; k < node.input_size() && k < 32; ++k) {
      if (!(rule->differentiable & (1u << k)) || !wanted(node.input(k))) continue;
      needs[static_cast<size_t>(k)] = true;
      any = true;
    }
    std::vector<std::string> implicit;
    std::vector<bool> implicit_needs;
    if (rule->enclosing_values) {
      implicit = implicit_inputs(node);
      for (const auto& v : implicit) {
        implicit_needs.push_back(wanted(v));
        any = any || implicit_needs.back();
      }
    }
    if (!any) continue;
    EngineBuilder builder(*this, node, i, needs, implicit, implicit_needs);
    scope_ = node.name().empty() ? node.op_type() + "#" + std::to_string(i) : node.name();
    try {
      rule->build(builder);
    } catch (const Error& e) {
      scope_.clear();
      throw Error(std::string(e.what()) + " (in the gradient rule of " + node_label(node, i) + ")");
    }
    for (const auto& [k, g] : builder.input_gradients()) {
      const std::string& in = node.input(k);
      grads_[in].push_back(rule->unbroadcast ? builder.sum_to_shape_of(g, in) : g);
    }
    for (const auto& [j, g] : builder.implicit_gradients()) grads_[implicit[static_cast<size_t>(j)]].push_back(g);
    scope_.clear();
  }
}

onnx::GraphProto Engine::backward_subgraph(const onnx::GraphProto& subgraph,
                                           const std::vector<std::string>& output_gradients,
                                           const std::vector<std::string>& wrt, const std::string& label) {
  if (subgraph.input_size() > 0) {
    throw Error(context_ + ": " + label + " takes inputs; only subgraphs without inputs (If branches) are differentiated");
  }
  if (static_cast<int>(output_gradients.size()) > subgraph.output_size()) {
    throw Error(context_ + ": " + label + " has " + std::to_string(subgraph.output_size()) + " outputs but " +
                std::to_string(output_gradients.size()) + " gradients flow into them");
  }
  onnx::GraphProto g;
  g.set_name((subgraph.name().empty() ? std::string("subgraph") : subgraph.name()) + "_gradient");
  *g.mutable_initializer() = subgraph.initializer();
  *g.mutable_node() = subgraph.node();
  *g.mutable_value_info() = subgraph.value_info();
  Engine sub(g, opsets_, where_, this);
  sub.context_ = context_ + ", " + label;
  sub.prefix_ = fresh(g.name());
  sub.names_ = names_;  // every name visible in the subgraph, so that no fresh name hides one
  sub.differentiate_subgraph(subgraph, output_gradients, wrt);
  return g;
}

void Engine::differentiate_subgraph(const onnx::GraphProto& forward, const std::vector<std::string>& output_gradients,
                                    const std::vector<std::string>& wrt) {
  index_graph(-1);
  std::vector<std::pair<std::string, std::string>> seeds;
  std::vector<std::string> targets;
  for (size_t k = 0; k < output_gradients.size(); ++k) {
    if (output_gradients[k].empty()) continue;
    seeds.emplace_back(forward.output(static_cast<int>(k)).name(), output_gradients[k]);
    targets.push_back(seeds.back().first);
  }
  unroll_loops_on_path(wrt, targets, -1);
  infer_value_types();
  const std::string what = "the outputs of " + (forward.name().empty() ? std::string("the subgraph") : "'" + forward.name() + "'");
  backward(wrt, seeds, what, -1);
  // One output per value of wrt: its gradient, or zeros where the subgraph does not depend on it.
  for (const auto& w : wrt) {
    std::string g = gradient_of(w);
    if (g.empty()) g = zeros_like(w);
    const std::string out = fresh("gradient");
    emit_identity(g, out);
    auto* info = graph_.add_output();
    info->set_name(out);
    auto* type = info->mutable_type()->mutable_tensor_type();
    type->set_elem_type(static_cast<int32_t>(dtype(w)));
    const int r = rank(w);
    for (int d = 0; d < r; ++d) type->mutable_shape()->add_dim();
    if (r == 0) type->mutable_shape();  // a scalar: an empty shape, not an unknown one
  }
  for (auto& e : emitted_) graph_.mutable_node()->Add()->Swap(&e);
  emitted_.clear();
  prune_to_outputs(graph_);
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
  index_graph(index);
  std::unordered_set<std::string> defined;
  for (const auto& v : graph_.input()) defined.insert(v.name());
  for (const auto& t : graph_.initializer()) defined.insert(t.name());
  for (const auto& [name, producer] : producer_) defined.insert(name);
  auto check_defined = [&](const std::string& name, const char* attr) {
    if (!defined.contains(name)) {
      throw Error(context_ + ": attribute '" + attr + "' names '" + name + "', which the graph does not define");
    }
  };
  for (const auto& x : xs) check_defined(x, "xs");
  for (const auto& z : zs) check_defined(z, "zs");
  check_defined(y, "y");

  index = unroll_loops_on_path(xs, {y}, index);
  infer_value_types();
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

  bool reuse = true;
  for (size_t i = 0; i < xs.size(); ++i) reuse = reuse && gradient.input(static_cast<int>(i)) == xs[i];
  for (size_t i = 0; i < zs.size(); ++i) reuse = reuse && gradient.input(static_cast<int>(xs.size() + i)) == zs[i];

  if (!reuse) {
    // Clone the nodes between xs+zs and y, reading the Gradient node's inputs instead.
    std::vector<std::string> roots = xs;
    roots.insert(roots.end(), zs.begin(), zs.end());
    const auto desc_nodes = descendants_of(roots, order, index).second;
    const auto anc = ancestors_of({y}, std::unordered_set<std::string>(roots.begin(), roots.end()));
    std::unordered_map<std::string, std::string> rename;
    for (size_t i = 0; i < roots.size(); ++i) rename[roots[i]] = gradient.input(static_cast<int>(i));
    for (int i : order) {
      if (!anc.contains(i) || !desc_nodes.contains(i)) continue;
      const onnx::NodeProto& original = graph_.node(i);
      onnx::NodeProto clone = copy_node(original, rename, [&](const std::string&) { return fresh("clone"); });
      clone.set_name(fresh("clone_" + clone.op_type()));
      for (int k = 0; k < clone.output_size(); ++k) {
        const std::string &o = original.output(k), &renamed = clone.output(k);
        if (o.empty()) continue;
        const auto t = types_.find(o);
        if (t != types_.end()) types_[renamed] = t->second;
        const auto r = ranks_.find(o);
        if (r != ranks_.end()) ranks_[renamed] = r->second;
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
  }

  if (!is_floating(dtype(y_value))) {
    throw Error(context_ + ": y '" + y + "' is " + std::string(dtype_name(dtype(y_value))) +
                "; only a floating-point tensor can be differentiated");
  }
  // The seed: ones shaped like y, so the result is the gradient of sum(y).
  const std::string seed = EngineBuilder(*this, gradient, index, {}).ones_like(y_value);
  backward(x_values, {{y_value, seed}}, y, index);

  // The Gradient node's outputs.
  for (int k = 0; k < gradient.output_size(); ++k) {
    const std::string& out = gradient.output(k);
    if (out.empty()) continue;
    std::string g = gradient_of(x_values[static_cast<size_t>(k)]);
    if (g.empty()) g = zeros_like(x_values[static_cast<size_t>(k)]);  // y does not depend on this x
    emit_identity(g, out);
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
  // Chunks of SplitToSequence read by SequenceAt become Slice/Gather, whose gradients exist.
  slice_sequence_chunks(graph);
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
