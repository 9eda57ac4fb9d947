#include "runtime/fusion.h"

#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numbers>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "autodiff/builder.h"
#include "autodiff/gradient.h"
#include "ir/graph.h"
#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "onnxtrain/tensor.h"
#include "ops/conv_geometry.h"
#include "ops/data_movement.h"
#include "runtime/graph_match.h"

namespace onnxtrain::runtime {

using namespace graph_match;  // NOLINT(google-build-using-namespace): the rewrites' shared readers

namespace {

using autodiff::kInternalDomain;
using autodiff::kTrainingDomain;

struct Fusion {
  int adam = -1;
  std::vector<std::string> inputs;   // the ScaledAdam node's inputs
  std::vector<std::string> outputs;  // and outputs
  std::vector<int> removed;          // Div and Mul nodes it replaces
  bool x_scaled = false;             // a sixth scalar S_X multiplies X (attribute x_scaled)
};

// The Div nodes feeding Adam input `name`: returns (dividend, divisor) when it matches.
std::optional<std::pair<std::string, std::string>> divided_input(Matcher& m, const std::string& name, int adam,
                                                                 int& div_node) {
  const onnx::NodeProto* div = m.producer(name);
  if (!div || !div->domain().empty() || div->op_type() != "Div" || div->input_size() != 2) return std::nullopt;
  if (m.sole_reader(name) != adam || !m.is_scalar(div->input(1))) return std::nullopt;
  div_node = m.producer_index(name);
  return std::make_pair(div->input(0), div->input(1));
}

// The Mul node making Adam input `name` from a tensor and a scalar (AdamW's decayed parameter,
// p (1 - lr wd)), read by the Adam node alone: returns (the tensor, the scalar) on a match.
std::optional<std::pair<std::string, std::string>> multiplied_input(Matcher& m, const std::string& name, int adam,
                                                                    int& mul_node) {
  const onnx::NodeProto* mul = m.producer(name);
  if (!mul || !mul->domain().empty() || mul->op_type() != "Mul" || mul->input_size() != 2) return std::nullopt;
  if (m.sole_reader(name) != adam) return std::nullopt;
  const bool first_scalar = m.is_scalar(mul->input(0)), second_scalar = m.is_scalar(mul->input(1));
  if (first_scalar == second_scalar) return std::nullopt;  // which one is the tensor must be clear
  mul_node = m.producer_index(name);
  return second_scalar ? std::make_pair(mul->input(0), mul->input(1)) : std::make_pair(mul->input(1), mul->input(0));
}

// The Mul node reading Adam output `name`: returns (its output, the scalar factor) on a match.
std::optional<std::pair<std::string, std::string>> multiplied_output(Matcher& m, const std::string& name,
                                                                     int& mul_node) {
  const std::optional<int> reader = m.sole_reader(name);
  if (!reader) return std::nullopt;
  const onnx::NodeProto& mul = m.graph().node(*reader);
  if (!mul.domain().empty() || mul.op_type() != "Mul" || mul.input_size() != 2 || mul.output_size() != 1) {
    return std::nullopt;
  }
  const std::string& factor = mul.input(0) == name ? mul.input(1) : mul.input(0);
  if (factor == name || !m.is_scalar(factor)) return std::nullopt;
  mul_node = *reader;
  return std::make_pair(mul.output(0), factor);
}

std::optional<Fusion> match(Matcher& m, int adam) {
  const onnx::NodeProto& node = m.graph().node(adam);
  const int n = (node.input_size() - 2) / 4;
  if (n < 1 || node.input_size() != 2 + 4 * n || node.output_size() != 3 * n) return std::nullopt;
  Fusion f;
  f.adam = adam;
  f.inputs.assign(node.input().begin(), node.input().begin() + 2 + n);  // R, T, X...
  std::vector<std::string> divisors(3), factors(2);
  for (int group = 0; group < 3; ++group) {  // G, V, H
    for (int i = 0; i < n; ++i) {
      int div_node = -1;
      auto d = divided_input(m, node.input(2 + (group + 1) * n + i), adam, div_node);
      if (!d || (i > 0 && d->second != divisors[static_cast<size_t>(group)])) return std::nullopt;
      divisors[static_cast<size_t>(group)] = d->second;
      f.inputs.push_back(d->first);
      f.removed.push_back(div_node);
    }
  }
  f.outputs.assign(node.output().begin(), node.output().begin() + n);  // X_new...
  for (int group = 0; group < 2; ++group) {  // V_new, H_new
    for (int i = 0; i < n; ++i) {
      int mul_node = -1;
      auto mo = multiplied_output(m, node.output((group + 1) * n + i), mul_node);
      if (!mo || (i > 0 && mo->second != factors[static_cast<size_t>(group)])) return std::nullopt;
      factors[static_cast<size_t>(group)] = mo->second;
      f.outputs.push_back(mo->first);
      f.removed.push_back(mul_node);
    }
  }
  f.inputs.insert(f.inputs.end(), divisors.begin(), divisors.end());
  f.inputs.insert(f.inputs.end(), factors.begin(), factors.end());
  // AdamW: every X a Mul of its parameter by one scalar, read by Adam alone -> S_X.
  std::string x_factor;
  std::vector<std::string> params;
  std::vector<int> x_muls;
  for (int i = 0; i < n; ++i) {
    int mul_node = -1;
    auto mi = multiplied_input(m, node.input(2 + i), adam, mul_node);
    if (!mi || (i > 0 && mi->second != x_factor)) {
      x_muls.clear();
      break;
    }
    x_factor = mi->second;
    params.push_back(mi->first);
    x_muls.push_back(mul_node);
  }
  if (static_cast<int>(x_muls.size()) == n) {
    for (int i = 0; i < n; ++i) f.inputs[static_cast<size_t>(2 + i)] = params[static_cast<size_t>(i)];
    f.removed.insert(f.removed.end(), x_muls.begin(), x_muls.end());
    f.inputs.push_back(x_factor);
    f.x_scaled = true;
  }
  return f;
}

// Marks a fused node as ending in `activation` (attribute activation: "Relu", or "ReluGrad" for
// FusedGemm).
void add_activation(onnx::NodeProto& node, const char* activation = "Relu") {
  auto* attr = node.add_attribute();
  attr->set_name("activation");
  attr->set_type(onnx::AttributeProto::STRING);
  attr->set_s(activation);
}

// Removes the nodes marked in `drop`, keeping the order of the others.
void drop_nodes(onnx::GraphProto& graph, const std::vector<bool>& drop) {
  google::protobuf::RepeatedPtrField<onnx::NodeProto> kept;
  for (int i = 0; i < graph.node_size(); ++i) {
    if (!drop[static_cast<size_t>(i)]) kept.Add()->Swap(graph.mutable_node(i));
  }
  graph.mutable_node()->Swap(&kept);
}

}  // namespace

int fuse_scaled_adam(onnx::GraphProto& graph) {
  std::vector<Fusion> fusions;
  {
    Matcher m(graph);
    for (int i = 0; i < graph.node_size(); ++i) {
      const auto& node = graph.node(i);
      if (node.domain() != kTrainingDomain || node.op_type() != "Adam") continue;
      if (auto f = match(m, i)) fusions.push_back(std::move(*f));
    }
  }
  if (fusions.empty()) return 0;
  std::vector<bool> drop(static_cast<size_t>(graph.node_size()), false);
  for (const Fusion& f : fusions) {
    for (int r : f.removed) drop[static_cast<size_t>(r)] = true;
    onnx::NodeProto& node = *graph.mutable_node(f.adam);
    node.set_domain(kInternalDomain);
    node.set_op_type("ScaledAdam");
    node.clear_input();
    for (const auto& in : f.inputs) node.add_input(in);
    node.clear_output();
    for (const auto& out : f.outputs) node.add_output(out);
    if (f.x_scaled) *node.add_attribute() = autodiff::attr_int("x_scaled", 1);
  }
  drop_nodes(graph, drop);
  return static_cast<int>(fusions.size());
}

int fuse_conv_pool(onnx::GraphProto& graph) {
  struct Chain {
    int conv = -1, relu = -1, pool = -1;
  };
  std::vector<Chain> chains;
  {
    Matcher m(graph);
    for (int i = 0; i < graph.node_size(); ++i) {
      const onnx::NodeProto& pool = graph.node(i);
      if (!is_onnx_op(pool, "MaxPool") || pool.input_size() != 1) continue;
      if (pool.output_size() > 1 && !pool.output(1).empty()) continue;  // Indices wanted
      Chain c;
      c.pool = i;
      std::string x = pool.input(0);
      if (m.sole_reader(x) != i) continue;
      const onnx::NodeProto* p = m.producer(x);
      if (p && is_onnx_op(*p, "Relu") && p->input_size() == 1) {
        c.relu = m.producer_index(x);
        x = p->input(0);
        if (m.sole_reader(x) != c.relu) continue;
        p = m.producer(x);
      }
      if (!p || !is_onnx_op(*p, "Conv") || p->output_size() != 1) continue;
      c.conv = m.producer_index(x);
      chains.push_back(c);
    }
  }
  if (chains.empty()) return 0;
  std::vector<bool> drop(static_cast<size_t>(graph.node_size()), false);
  for (const Chain& c : chains) {
    onnx::NodeProto fused = graph.node(c.conv);  // inputs, name and attributes
    fused.set_domain(kInternalDomain);
    fused.set_op_type("FusedConv");
    fused.clear_output();
    const onnx::NodeProto& pool = graph.node(c.pool);
    fused.add_output(pool.output(0));
    if (c.relu >= 0) {
      add_activation(fused);
      drop[static_cast<size_t>(c.relu)] = true;
    }
    for (const auto& attr : pool.attribute()) {
      if (attr.name() == "storage_order") continue;  // orders Indices only
      auto* copy = fused.add_attribute();
      *copy = attr;
      copy->set_name("pool_" + attr.name());
    }
    drop[static_cast<size_t>(c.conv)] = true;
    graph.mutable_node(c.pool)->Swap(&fused);  // at the MaxPool's place: every input is ready there
  }
  drop_nodes(graph, drop);
  return static_cast<int>(chains.size());
}

// For each (kept, absorbed) pair of node indices: edit(kept node, absorbed node), then every
// absorbed node goes. The pairs were matched on the graph as it was; each node is in at most one.
// Returns the number of pairs.
template <class F>
int absorb_nodes(onnx::GraphProto& graph, const std::vector<std::pair<int, int>>& pairs, F edit) {
  if (pairs.empty()) return 0;
  std::vector<bool> drop(static_cast<size_t>(graph.node_size()), false);
  for (const auto& [kept, absorbed] : pairs) {
    edit(*graph.mutable_node(kept), graph.node(absorbed));
    drop[static_cast<size_t>(absorbed)] = true;
  }
  drop_nodes(graph, drop);
  return static_cast<int>(pairs.size());
}

namespace {
// For each (producer, activation node) pair: the producer becomes the internal `fused_op` with
// attribute activation = `activation`, writing the activation node's output; the activation
// nodes go. Returns the number of pairs.
int fold_into_producers(onnx::GraphProto& graph, const std::vector<std::pair<int, int>>& pairs, const char* fused_op,
                        const char* activation) {
  return absorb_nodes(graph, pairs, [&](onnx::NodeProto& node, const onnx::NodeProto& act) {
    node.set_domain(kInternalDomain);
    node.set_op_type(fused_op);
    node.set_output(0, act.output(0));
    add_activation(node, activation);
  });
}

// Replaces each `op` node (ONNX domain) whose one output only a Relu reads with an internal
// `fused_op` node of the same inputs and attributes plus activation = "Relu", writing the Relu's
// output. Returns the number of pairs fused.
int fuse_relu_into(onnx::GraphProto& graph, const char* op, const char* fused_op) {
  std::vector<std::pair<int, int>> pairs;  // (producer, Relu)
  {
    Matcher m(graph);
    for (int i = 0; i < graph.node_size(); ++i) {
      const onnx::NodeProto& relu = graph.node(i);
      if (!is_onnx_op(relu, "Relu") || relu.input_size() != 1 || relu.output_size() != 1) continue;
      const std::string& x = relu.input(0);
      const onnx::NodeProto* producer = m.producer(x);
      if (!producer || !is_onnx_op(*producer, op) || producer->output_size() != 1 || m.sole_reader(x) != i) continue;
      pairs.emplace_back(m.producer_index(x), i);
    }
  }
  return fold_into_producers(graph, pairs, fused_op, "Relu");
}
}  // namespace

int fuse_conv_relu(onnx::GraphProto& graph) { return fuse_relu_into(graph, "Conv", "FusedConv"); }

int fuse_gemm_relu(onnx::GraphProto& graph) {
  int fused = fuse_relu_into(graph, "Gemm", "FusedGemm");
  std::vector<std::pair<int, int>> pairs;  // (Gemm, ReluGrad)
  {
    Matcher m(graph);
    for (int i = 0; i < graph.node_size(); ++i) {
      const onnx::NodeProto& grad = graph.node(i);
      if (grad.domain() != kInternalDomain || grad.op_type() != "ReluGrad" || grad.input_size() != 2 ||
          grad.output_size() != 1) {
        continue;
      }
      const std::string& dx = grad.input(1);
      const onnx::NodeProto* gemm = m.producer(dx);
      if (!gemm || !is_onnx_op(*gemm, "Gemm") || gemm->output_size() != 1 || m.sole_reader(dx) != i) continue;
      // The fused node takes the Gemm's place: Y must be ready there.
      if (m.producer_index(grad.input(0)) > m.producer_index(dx)) continue;
      pairs.emplace_back(m.producer_index(dx), i);
    }
  }
  for (const auto& [gemm, grad] : pairs) {  // Y becomes input 3, after C ("" when absent)
    onnx::NodeProto& node = *graph.mutable_node(gemm);
    while (node.input_size() < 3) node.add_input("");
    node.add_input(graph.node(grad).input(0));
  }
  return fused + fold_into_producers(graph, pairs, "FusedGemm", "ReluGrad");
}

namespace {

// The element type and dims of `name` when it is a constant (constant_proto).
std::optional<std::pair<int, std::vector<int64_t>>> constant_type(const onnx::GraphProto& graph,
                                                                   const Matcher& m, const std::string& name) {
  const onnx::TensorProto* proto = constant_proto(graph, m, name);
  if (!proto) return std::nullopt;
  return std::make_pair(proto->data_type(), std::vector<int64_t>(proto->dims().begin(), proto->dims().end()));
}

// The value of constant `name` (constant_proto) as float64, if it is a float32 or float64 tensor
// of `elements` elements (any, when negative) stored in the model file itself.
std::optional<Tensor> constant_value(const onnx::GraphProto& graph, const Matcher& m, const std::string& name,
                                     int64_t elements = -1) {
  const onnx::TensorProto* proto = constant_proto(graph, m, name);
  if (!proto || (proto->data_type() != onnx::TensorProto::FLOAT && proto->data_type() != onnx::TensorProto::DOUBLE)) {
    return std::nullopt;
  }
  try {
    Tensor t = io::tensor_from_proto(*proto, {}, name);
    if (elements >= 0 && t.numel() != elements) return std::nullopt;
    return t.cast(DataType::Float64);
  } catch (const Error&) {  // external data or a malformed tensor: left to the run
    return std::nullopt;
  }
}
}  // namespace

int fold_batch_norm_into_conv(onnx::GraphProto& graph, const std::unordered_map<std::string, int>& opsets) {
  const auto onnx_opset = opsets.find("");
  if (onnx_opset == opsets.end() || onnx_opset->second < 7) return 0;  // is_test decides before 7
  struct Fold {
    int conv = 0, bn = 0;
    onnx::TensorProto w, b;  // the new initializers
  };
  std::vector<Fold> folds;
  {
    Matcher m(graph);
    ValueNames names(graph);
    for (int i = 0; i < graph.node_size(); ++i) {
      const onnx::NodeProto& bn = graph.node(i);
      if (!is_onnx_op(bn, "BatchNormalization") || bn.input_size() != 5 || bn.output_size() != 1) continue;
      double epsilon = 1e-5;
      bool inference = true;
      for (const auto& attr : bn.attribute()) {
        if (attr.name() == "epsilon") epsilon = attr.f();
        if (attr.name() == "training_mode" && attr.i() != 0) inference = false;
        if (attr.name() == "spatial" && attr.i() != 1) inference = false;
      }
      const std::string& y = bn.input(0);
      const onnx::NodeProto* conv = m.producer(y);
      if (!inference || !conv || !is_onnx_op(*conv, "Conv") || conv->output_size() != 1 || m.sole_reader(y) != i ||
          conv->input_size() < 2) {
        continue;
      }
      const onnx::TensorProto* w_proto = constant_proto(graph, m, conv->input(1));
      const std::optional<Tensor> w = constant_value(graph, m, conv->input(1));
      if (!w_proto || !w || w->rank() < 1) continue;
      const int64_t channels = w->dim(0);
      const bool has_b = conv->input_size() > 2 && !conv->input(2).empty();
      std::optional<Tensor> b = has_b ? constant_value(graph, m, conv->input(2), channels)
                                      : Tensor::zeros(DataType::Float64, Shape{channels});
      std::optional<Tensor> params[4];  // scale, bias, mean, var
      bool constant = b.has_value();
      for (int k = 0; k < 4 && constant; ++k) {
        params[k] = constant_value(graph, m, bn.input(k + 1), channels);
        constant = params[k].has_value();
      }
      if (!constant) continue;
      const double* scale = params[0]->data<double>();
      const double* bias = params[1]->data<double>();
      const double* mean = params[2]->data<double>();
      const double* var = params[3]->data<double>();
      Tensor w_new = *w;  // a copy: cast() made w's own storage, not shared with the model
      Tensor b_new = b->cast(DataType::Float64);
      double* wd = w_new.data<double>();
      double* bd = b_new.data<double>();
      const int64_t per_channel = channels == 0 ? 0 : w_new.numel() / channels;
      for (int64_t c = 0; c < channels; ++c) {
        const double s = scale[c] / std::sqrt(var[c] + epsilon);
        for (int64_t k = 0; k < per_channel; ++k) wd[c * per_channel + k] *= s;
        bd[c] = (bd[c] - mean[c]) * s + bias[c];
      }
      const DataType type = w_proto->data_type() == onnx::TensorProto::FLOAT ? DataType::Float32 : DataType::Float64;
      Fold fold;
      fold.conv = m.producer_index(y);
      fold.bn = i;
      io::tensor_to_proto(w_new.cast(type), names.fresh(bn.output(0) + ".conv_weight"), fold.w);
      io::tensor_to_proto(b_new.cast(type), names.fresh(bn.output(0) + ".conv_bias"), fold.b);
      folds.push_back(std::move(fold));
    }
  }
  if (folds.empty()) return 0;
  std::vector<bool> drop(static_cast<size_t>(graph.node_size()), false);
  std::unordered_set<std::string> old_weights;
  for (Fold& fold : folds) {
    onnx::NodeProto& conv = *graph.mutable_node(fold.conv);
    old_weights.insert(conv.input(1));
    if (conv.input_size() > 2) old_weights.insert(conv.input(2));
    for (int k = 1; k < graph.node(fold.bn).input_size(); ++k) old_weights.insert(graph.node(fold.bn).input(k));
    conv.set_input(1, fold.w.name());
    if (conv.input_size() > 2) {
      conv.set_input(2, fold.b.name());
    } else {
      conv.add_input(fold.b.name());
    }
    conv.set_output(0, graph.node(fold.bn).output(0));
    drop[static_cast<size_t>(fold.bn)] = true;
    graph.add_initializer()->Swap(&fold.w);
    graph.add_initializer()->Swap(&fold.b);
  }
  // The old weights, bias and BatchNormalization inputs where nothing reads them any more
  // (initializers and Constant nodes: a graph output or a subgraph could read one, so every name
  // read anywhere counts).
  std::unordered_set<std::string> read;
  for (const auto& out : graph.output()) read.insert(out.name());
  for (int i = 0; i < graph.node_size(); ++i) {
    const onnx::NodeProto& node = graph.node(i);
    if (drop[static_cast<size_t>(i)]) continue;  // a folded BatchNormalization
    for (const auto& in : node.input()) read.insert(in);
    for (const auto& attr : node.attribute()) {
      if (attr.has_g()) ir::collect_free_names(attr.g(), read);
      for (const auto& g : attr.graphs()) ir::collect_free_names(g, read);
    }
  }
  const auto unread = [&](const std::string& name) { return old_weights.contains(name) && !read.contains(name); };
  for (int i = 0; i < graph.node_size(); ++i) {
    const onnx::NodeProto& node = graph.node(i);
    if (is_onnx_op(node, "Constant") && node.output_size() == 1 && unread(node.output(0))) {
      drop[static_cast<size_t>(i)] = true;
    }
  }
  drop_nodes(graph, drop);
  google::protobuf::RepeatedPtrField<onnx::TensorProto> kept;
  for (auto& init : *graph.mutable_initializer()) {
    if (!unread(init.name())) kept.Add()->Swap(&init);
  }
  graph.mutable_initializer()->Swap(&kept);
  return static_cast<int>(folds.size());
}

namespace {
// Calls f(add, y, other, producer, shapes) for each two-operand Add node (index `add`) and each
// of its operands y (first, then second) made by a node (`producer`) whose output y is read by
// that Add once and otherwise only by Shape nodes (`shapes`, which read only its shape), and is
// neither a graph output nor read by a subgraph, with `other` the Add's other operand, until f
// returns true (a match) for that Add.
template <class F>
void for_each_add_of_a_sole_output_or_shape(const onnx::GraphProto& graph, const Matcher& m, F&& f) {
  for (int i = 0; i < graph.node_size(); ++i) {
    const onnx::NodeProto& add = graph.node(i);
    if (!is_onnx_op(add, "Add") || add.input_size() != 2 || add.output_size() != 1) continue;
    for (int side = 0; side < 2; ++side) {
      const std::string& y = add.input(side);
      const onnx::NodeProto* producer = m.producer(y);
      if (!producer || producer->output_size() != 1 || m.pinned(y)) continue;
      std::vector<int> shapes;
      int adds = 0;
      for (int reader : m.readers(y)) {
        const onnx::NodeProto& r = graph.node(reader);
        if (reader == i) {
          ++adds;
        } else if (is_onnx_op(r, "Shape") && r.input_size() == 1) {
          shapes.push_back(reader);
        } else {
          adds = -1;
          break;
        }
      }
      if (adds == 1 && f(i, y, add.input(1 - side), *producer, std::move(shapes))) break;
    }
  }
}

// The same where y has no reader but the Add: f(add, y, other, producer).
template <class F>
void for_each_add_of_a_sole_output(const onnx::GraphProto& graph, const Matcher& m, F&& f) {
  for_each_add_of_a_sole_output_or_shape(
      graph, m, [&](int add, const std::string& y, const std::string& other, const onnx::NodeProto& producer,
                    const std::vector<int>& shapes) { return shapes.empty() && f(add, y, other, producer); });
}
}  // namespace

namespace {

// The rank of `name` when it is a float32 constant (constant_type) or the graph states it float32
// (Matcher::declared_type).
std::optional<int> float32_rank(const onnx::GraphProto& graph, const Matcher& m, const std::string& name) {
  if (const auto c = constant_type(graph, m, name)) {
    if (c->first != onnx::TensorProto::FLOAT) return std::nullopt;
    return static_cast<int>(c->second.size());
  }
  if (m.producer(name)) return std::nullopt;
  const auto d = m.declared_type(name);
  if (!d || d->first != onnx::TensorProto::FLOAT) return std::nullopt;
  return d->second;
}

// Whether `node` is a Transpose of a rank-2 value that swaps its dims (perm [1, 0], or none).
bool transposes_matrix(const onnx::NodeProto& node, const onnx::GraphProto& graph, const Matcher& m) {
  if (!is_onnx_op(node, "Transpose") || node.input_size() != 1 || node.input(0).empty() ||
      float32_rank(graph, m, node.input(0)) != 2) {
    return false;
  }
  const auto perm = stated_perm(node);
  return !perm || *perm == std::vector<int64_t>{1, 0};  // no perm: the dims reversed
}

}  // namespace

int fuse_matmul_add(onnx::GraphProto& graph) {
  struct Match {
    int matmul = -1, add = -1;
    std::string b, c;            // the MatMulAdd's B and C
    bool trans_b = false;        // B is the Transpose's input
    int transpose = -1;          // the Transpose node, when the MatMul alone read it
    std::vector<int> shapes;     // Shape nodes reading the product
  };
  std::vector<Match> matches;
  {
    Matcher m(graph);
    for_each_add_of_a_sole_output_or_shape(graph, m, [&](int add, const std::string& y, const std::string& c,
                                                         const onnx::NodeProto& matmul, std::vector<int> shapes) {
      if (!is_onnx_op(matmul, "MatMul") || matmul.input_size() != 2 || y == c) return false;
      if (m.producer_index(c) > m.producer_index(y)) return false;  // the fused node takes the MatMul's place
      // The ranks decide the product's shape, and z's with it: [..., N] (the kernel checks that C
      // has N or 1 elements, as Add's broadcasting would).
      if (float32_rank(graph, m, c) != 1) return false;
      Match match;
      match.matmul = m.producer_index(y);
      match.add = add;
      match.b = matmul.input(1);
      match.c = c;
      match.shapes = std::move(shapes);
      const onnx::NodeProto* t = m.producer(match.b);
      if (t && transposes_matrix(*t, graph, m)) {
        if (m.sole_reader(match.b) == match.matmul) match.transpose = m.producer_index(match.b);
        match.b = t->input(0);
        match.trans_b = true;
      } else if (float32_rank(graph, m, match.b) != 2) {
        return false;
      }
      matches.push_back(std::move(match));
      return true;
    });
  }
  if (matches.empty()) return 0;
  std::vector<bool> drop(static_cast<size_t>(graph.node_size()), false);
  for (const Match& match : matches) {
    const std::string z = graph.node(match.add).output(0);
    for (int shape : match.shapes) graph.mutable_node(shape)->set_input(0, z);  // the product's shape is z's
    onnx::NodeProto& node = *graph.mutable_node(match.matmul);
    node.set_domain(kInternalDomain);
    node.set_op_type("MatMulAdd");
    node.set_input(1, match.b);
    node.add_input(match.c);
    if (match.trans_b) *node.add_attribute() = autodiff::attr_int("transB", 1);
    node.set_output(0, z);
    drop[static_cast<size_t>(match.add)] = true;
    if (match.transpose >= 0) drop[static_cast<size_t>(match.transpose)] = true;
  }
  drop_nodes(graph, drop);
  return static_cast<int>(matches.size());
}

namespace {
// Whether `node` is a Transpose whose perm swaps the last two of r >= 2 dims and keeps the rest.
bool swaps_last_two_dims(const onnx::NodeProto& node) {
  const auto perm = stated_perm(node);  // none: all dims reversed, the last two only at rank 2, not known here
  if (!perm || perm->size() < 2) return false;
  const auto r = static_cast<int64_t>(perm->size());
  for (int64_t d = 0; d < r; ++d) {
    if ((*perm)[static_cast<size_t>(d)] != (d < r - 2 ? d : (d == r - 2 ? r - 1 : r - 2))) return false;
  }
  return true;
}
}  // namespace

namespace {

// A Gather node named `name` picking the elements `indices` of the 1-D `data` (a shape) into a
// fresh value; the indices become an initializer of `graph`.
onnx::NodeProto gather_node(onnx::GraphProto& graph, ValueNames& names, const std::string& data,
                            const std::vector<int64_t>& indices, const std::string& name) {
  const std::string constant = names.fresh(name + "/indices");
  io::tensor_to_proto(Tensor::from_vector<int64_t>({static_cast<int64_t>(indices.size())}, indices), constant,
                      *graph.add_initializer());
  onnx::NodeProto gather;
  gather.set_name(name);
  gather.set_op_type("Gather");
  gather.add_input(data);
  gather.add_input(constant);
  gather.add_output(names.fresh(name));
  return gather;
}

// The two nodes that compute what Shape node `shape` reads off Transpose(x) with `perm` from x:
// Shape(x), then Gather by perm[start:end] (the start / end of `shape`), writing shape's output.
// The indices become an initializer of `graph`.
std::vector<onnx::NodeProto> shape_of_transpose_input(onnx::GraphProto& graph, ValueNames& names,
                                                      const onnx::NodeProto& shape, const std::string& x,
                                                      const std::vector<int64_t>& perm) {
  const auto rank = static_cast<int64_t>(perm.size());
  int64_t begin = 0, end = rank;
  for (const auto& attr : shape.attribute()) {
    if (attr.name() == "start") begin = attr.i();
    if (attr.name() == "end") end = attr.i();
  }
  begin = std::clamp<int64_t>(begin < 0 ? begin + rank : begin, 0, rank);
  end = std::clamp<int64_t>(end < 0 ? end + rank : end, 0, rank);
  std::vector<int64_t> picked(perm.begin() + begin, perm.begin() + std::max(begin, end));
  const std::string of_x = names.fresh(shape.output(0) + "/of_transpose_input");
  onnx::NodeProto whole;
  whole.set_name(shape.name());
  whole.set_op_type("Shape");
  whole.add_input(x);
  whole.add_output(of_x);
  onnx::NodeProto gather = gather_node(graph, names, of_x, picked, shape.name() + "/permuted");
  gather.set_output(0, shape.output(0));
  return {whole, gather};
}

// Calls f(i, t, perm) for each Transpose node t (index i) of `graph` with a stated perm, an
// input, and an output that is neither a graph output nor read by a subgraph.
template <class F>
void for_each_free_transpose(const onnx::GraphProto& graph, const Matcher& m, F&& f) {
  for (int i = 0; i < graph.node_size(); ++i) {
    const onnx::NodeProto& t = graph.node(i);
    const auto perm = stated_perm(t);
    if (perm && !t.input(0).empty() && !m.pinned(t.output(0))) f(i, t, *perm);
  }
}

// A rewrite around some of a graph's Transposes: the nodes to put in place of node indices, and
// the node indices to drop.
struct TransposeRewrite {
  std::map<int, std::vector<onnx::NodeProto>> replace;
  std::set<int> dropped;
};

// One free Transpose (node index i, node t, its perm) as rewrite_free_transposes visits it, with
// the graph's Matcher and names and the rewrite to fill.
struct TransposeSite {
  const Matcher& m;
  ValueNames& names;
  TransposeRewrite& rewrite;
  int i;
  const onnx::NodeProto& t;
  const std::vector<int64_t>& perm;
};

// Calls visit(site) for each free Transpose of `graph` (for_each_free_transpose), which fills
// site.rewrite, then rebuilds the graph's nodes by it.
template <class F>
TransposeRewrite rewrite_free_transposes(onnx::GraphProto& graph, F&& visit) {
  TransposeRewrite rewrite;
  {
    Matcher m(graph);
    ValueNames names(graph);
    for_each_free_transpose(graph, m, [&](int i, const onnx::NodeProto& t, const std::vector<int64_t>& perm) {
      visit(TransposeSite{m, names, rewrite, i, t, perm});
    });
  }
  if (!rewrite.replace.empty() || !rewrite.dropped.empty()) rebuild_nodes(graph, rewrite.replace, rewrite.dropped);
  return rewrite;
}

// Sets a product node's int attribute `name` (transA / transB) to `value`, adding it if absent.
void set_trans_flag(onnx::NodeProto& node, const std::string& name, bool value) {
  for (auto& attr : *node.mutable_attribute()) {
    if (attr.name() != name) continue;
    attr.set_i(value ? 1 : 0);
    return;
  }
  *node.add_attribute() = autodiff::attr_int(name, value ? 1 : 0);
}

// For site.t = Transpose(perm [1, 0]) whose readers are Gemm nodes reading it as A or B (not C),
// besides Shape nodes: each Gemm reads the Transpose's input with that operand's flag flipped,
// Gemm(Transpose(x), B, transA) = Gemm(x, B, !transA) and likewise for B, and each Shape reads
// Gather(Shape(x), [1, 0]). Adds to site.rewrite and returns true; false when the readers are
// others.
bool read_transpose_in_gemms(onnx::GraphProto& graph, const TransposeSite& site) {
  const onnx::NodeProto& t = site.t;
  const std::string& y = t.output(0);
  auto& replace = site.rewrite.replace;
  std::vector<int> shapes, gemms;
  for (int r : site.m.readers(y)) {
    const onnx::NodeProto& reader = graph.node(r);
    if (is_onnx_op(reader, "Shape") && reader.input_size() == 1) {
      shapes.push_back(r);
    } else if (is_onnx_op(reader, "Gemm") && reader.input_size() >= 2 && !replace.contains(r) &&
               (reader.input(0) == y) != (reader.input(1) == y) && (reader.input_size() < 3 || reader.input(2) != y)) {
      gemms.push_back(r);
    } else {
      return false;
    }
  }
  if (gemms.empty()) return false;
  for (int sh : shapes) {
    replace[sh] = shape_of_transpose_input(graph, site.names, graph.node(sh), t.input(0), site.perm);
  }
  for (int r : gemms) {
    onnx::NodeProto gemm = graph.node(r);
    const int k = gemm.input(0) == y ? 0 : 1;
    const std::string flag = k == 0 ? "transA" : "transB";
    gemm.set_input(k, t.input(0));
    set_trans_flag(gemm, flag, int_attribute(gemm, flag) == 0);
    replace[r] = {gemm};
  }
  site.rewrite.dropped.insert(site.i);
  return true;
}

// The transposed product written directly: for site.t = Transpose(perm [1, 0]) of a Gemm's
// product without C, read through a SumToShape or not, each value on the way read by the next
// node alone and neither a graph output nor read by a subgraph, (A' B')^T = B'^T A'^T: the Gemm
// takes its operands swapped with transA = !transB and transB = !transA, the SumToShape (a
// training graph's gradient of a Linear's W^T, dW = Transpose(SumToShape(X^T dY))) takes its
// target permuted by a Gather, and the last of them writes the Transpose's output. Adds to
// site.rewrite; nothing when the pattern is not there.
void transpose_gemm_output(onnx::GraphProto& graph, const TransposeSite& site) {
  const Matcher& m = site.m;
  const onnx::NodeProto& t = site.t;
  auto& replace = site.rewrite.replace;
  int sum = -1, gemm = m.producer_index(t.input(0));
  if (gemm >= 0 && graph.node(gemm).domain() == kInternalDomain && graph.node(gemm).op_type() == "SumToShape") {
    sum = gemm;
    const onnx::NodeProto& s = graph.node(sum);
    if (s.input_size() != 2 || m.sole_reader(s.output(0)) != site.i) return;
    gemm = m.producer_index(s.input(0));
  }
  if (gemm < 0) return;
  const onnx::NodeProto& g = graph.node(gemm);
  const std::string& product = g.output(0);
  if (!is_onnx_op(g, "Gemm") || g.input_size() < 2 || (g.input_size() > 2 && !g.input(2).empty()) ||
      m.sole_reader(product) != (sum >= 0 ? sum : site.i) || replace.contains(gemm) ||
      (sum >= 0 && replace.contains(sum))) {
    return;
  }
  onnx::NodeProto swapped = g;
  swapped.set_input(0, g.input(1));
  swapped.set_input(1, g.input(0));
  set_trans_flag(swapped, "transA", int_attribute(g, "transB") == 0);
  set_trans_flag(swapped, "transB", int_attribute(g, "transA") == 0);
  if (sum < 0) {
    swapped.set_output(0, t.output(0));
    replace[gemm] = {swapped};
  } else {
    onnx::NodeProto target =
        gather_node(graph, site.names, graph.node(sum).input(1), site.perm, graph.node(sum).name() + "/permuted");
    onnx::NodeProto s = graph.node(sum);
    s.set_input(1, target.output(0));
    s.set_output(0, t.output(0));
    replace[gemm] = {swapped};
    replace[sum] = {target, s};
  }
  site.rewrite.dropped.insert(site.i);
}

}  // namespace

int fuse_transpose_gemm(onnx::GraphProto& graph) {
  const TransposeRewrite done = rewrite_free_transposes(graph, [&](const TransposeSite& site) {
    if (site.perm == std::vector<int64_t>{1, 0} && !read_transpose_in_gemms(graph, site)) {
      transpose_gemm_output(graph, site);
    }
  });
  return static_cast<int>(done.dropped.size());
}

int fuse_transpose_matmul(onnx::GraphProto& graph) {
  struct Fold {
    int matmul;
    int transposes[2];  // the node index folded into operand 0 / 1, or -1
  };
  std::vector<Fold> folds;
  {
    Matcher m(graph);
    for (int i = 0; i < graph.node_size(); ++i) {
      const onnx::NodeProto& node = graph.node(i);
      if (!is_onnx_op(node, "MatMul") || node.input_size() != 2) continue;
      Fold f{i, {-1, -1}};
      for (int k = 0; k < 2; ++k) {
        const onnx::NodeProto* t = m.producer(node.input(k));
        if (t && swaps_last_two_dims(*t) && m.sole_reader(node.input(k)) == i) {  // A = B has two readers
          f.transposes[k] = m.producer_index(node.input(k));
        }
      }
      if (f.transposes[0] >= 0 || f.transposes[1] >= 0) folds.push_back(f);
    }
  }
  if (folds.empty()) return 0;
  std::vector<bool> drop(static_cast<size_t>(graph.node_size()), false);
  int removed = 0;
  for (const Fold& f : folds) {
    onnx::NodeProto& node = *graph.mutable_node(f.matmul);
    node.set_domain(kInternalDomain);
    node.set_op_type("MatMulTransposed");
    for (int k = 0; k < 2; ++k) {
      if (f.transposes[k] < 0) continue;
      node.set_input(k, graph.node(f.transposes[k]).input(0));
      *node.add_attribute() = autodiff::attr_int(k == 0 ? "transA" : "transB", 1);
      drop[static_cast<size_t>(f.transposes[k])] = true;
      ++removed;
    }
  }
  drop_nodes(graph, drop);
  return removed;
}

namespace {

// Whether `node` is a Mul of `value` by a one-element constant of rank <= `rank` (the product
// has value's shape); `side` is value's operand index.
bool scales_by_a_constant(const onnx::GraphProto& graph, const Matcher& m, const onnx::NodeProto& node,
                          const std::string& value, size_t rank, int& side) {
  if (!is_onnx_op(node, "Mul") || node.input_size() != 2 || node.output_size() != 1) return false;
  for (side = 0; side < 2; ++side) {
    if (node.input(side) != value || node.input(1 - side) == value) continue;
    const auto scale = constant_type(graph, m, node.input(1 - side));
    return scale && scale->second.size() <= rank &&
           std::all_of(scale->second.begin(), scale->second.end(), [](int64_t d) { return d == 1; });
  }
  return false;
}

// Whether `node` is a product whose operands fuse_permuted_matmul can permute: MatMul, or
// ai.onnxtrain.MatMulTransposed (whose transA / transB compose with the perm).
bool permutable_product(const onnx::NodeProto& node) {
  return node.input_size() == 2 && node.output_size() == 1 &&
         (is_onnx_op(node, "MatMul") || (node.domain() == kInternalDomain && node.op_type() == "MatMulTransposed"));
}

// Prepares the Transposes that fuse_permuted_matmul can fold: a Transpose with a stated perm of
// rank >= 3 whose output one MatMul reads, or one Mul by a one-element constant, besides Shape
// nodes. Each such Shape node becomes Gather(Shape(x), perm) (the shape the Transpose gives x),
// and a Mul moves ahead of the Transpose: Mul(Transpose(x), s) = Transpose(Mul(x, s)), the same
// products (the BERT export scales Q and K by d^-1/4 after the head split, and reads the split's
// shapes for its Reshapes). Returns the number of nodes rewritten.
int prepare_permuted_operands(onnx::GraphProto& graph) {
  const TransposeRewrite done = rewrite_free_transposes(graph, [&](const TransposeSite& site) {
    const Matcher& m = site.m;  // references, not a structured binding of site (see above)
    const onnx::NodeProto& t = site.t;
    const std::vector<int64_t>& perm = site.perm;
    const std::string& y = t.output(0);
    auto& replace = site.rewrite.replace;
    if (perm.size() < 3) return;
    std::vector<int> shapes, others;
    for (int r : m.readers(y)) {
      const onnx::NodeProto& reader = graph.node(r);
      (is_onnx_op(reader, "Shape") && reader.input_size() == 1 ? shapes : others).push_back(r);
    }
    if (others.empty() || std::any_of(others.begin(), others.end(), [&](int r) { return replace.contains(r); })) return;
    const onnx::NodeProto& reader = graph.node(others[0]);
    int side = 0;
    const bool mul = others.size() == 1 && scales_by_a_constant(graph, m, reader, y, perm.size(), side);
    if (!mul && !std::all_of(others.begin(), others.end(), [&](int r) { return permutable_product(graph.node(r)); })) {
      return;
    }
    if (!mul && shapes.empty()) return;  // nothing to prepare: fuse_permuted_matmul folds it as is
    for (int sh : shapes) replace[sh] = shape_of_transpose_input(graph, site.names, graph.node(sh), t.input(0), perm);
    if (mul) {  // at the Mul's place: Mul(x, s) -> scaled, Transpose(scaled) -> the Mul's output
      onnx::NodeProto scaled_mul = reader, moved = t;
      const std::string scaled = site.names.fresh(reader.output(0) + "/before_transpose");
      scaled_mul.set_input(side, t.input(0));
      scaled_mul.set_output(0, scaled);
      moved.set_input(0, scaled);
      moved.set_output(0, reader.output(0));
      replace[others[0]] = {scaled_mul, moved};
      site.rewrite.dropped.insert(site.i);
    }
  });
  return static_cast<int>(done.replace.size());
}
}  // namespace

int fuse_permuted_matmul(onnx::GraphProto& graph) {
  // Until nothing changes: a Mul moved ahead of its Transpose hands the Transpose the Mul's
  // readers, whose Shape nodes (in a training graph, those of the Mul's gradient) the next round
  // takes. Each round drops a Shape reader of a Transpose or moves a Mul, so the rounds end.
  // BERT's training step: the Q and K splits fold too (8 Transposes fewer per step), Transpose
  // 86.6 -> 63.8 and 93.0 -> 72.2 ms over 6 steps, the attention's products 158.3 -> 154.2 and
  // 157.7 -> 161.4 ms (two alternating pairs of profiles).
  while (prepare_permuted_operands(graph) > 0) {
  }
  // Candidates: Transposes with a stated perm of rank >= 3 whose every reader is a product
  // (permutable_product) reading it as an operand; then those whose products flag (transA /
  // transB) an operand that no candidate makes are dropped, until none is (such a flag stays
  // a flag only on a MatMulTransposed).
  Matcher m(graph);
  std::map<std::string, int> candidates;  // output -> Transpose index
  for_each_free_transpose(graph, m, [&](int i, const onnx::NodeProto& t, const std::vector<int64_t>& perm) {
    const auto& readers = m.readers(t.output(0));
    if (perm.size() >= 3 && !readers.empty() &&
        std::all_of(readers.begin(), readers.end(), [&](int r) { return permutable_product(graph.node(r)); })) {
      candidates[t.output(0)] = i;
    }
  });
  const auto flagged = [](const onnx::NodeProto& node, int k) {
    return int_attribute(node, k == 0 ? "transA" : "transB") != 0;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (auto it = candidates.begin(); it != candidates.end();) {
      bool keep = true;
      for (int r : m.readers(it->first)) {
        const onnx::NodeProto& node = graph.node(r);
        for (int k = 0; k < 2; ++k) keep = keep && (!flagged(node, k) || candidates.contains(node.input(k)));
      }
      it = keep ? std::next(it) : candidates.erase(it);
      changed = changed || !keep;
    }
  }
  if (candidates.empty()) return 0;
  std::set<int> products;
  for (const auto& [value, t] : candidates) {
    for (int r : m.readers(value)) products.insert(r);
  }
  for (int r : products) {
    onnx::NodeProto& node = *graph.mutable_node(r);
    onnx::NodeProto permuted = node;
    permuted.set_domain(kInternalDomain);
    permuted.set_op_type("MatMulPermuted");
    permuted.clear_attribute();
    for (int k = 0; k < 2; ++k) {
      auto it = candidates.find(node.input(k));
      if (it == candidates.end()) continue;
      const onnx::NodeProto& t = graph.node(it->second);
      std::vector<int64_t> perm = *stated_perm(t);
      if (flagged(node, k)) std::swap(perm[perm.size() - 2], perm[perm.size() - 1]);  // then the last two swapped
      permuted.set_input(k, t.input(0));
      *permuted.add_attribute() = autodiff::attr_ints(k == 0 ? "perm_a" : "perm_b", perm);
    }
    node.Swap(&permuted);
  }
  std::vector<bool> drop(static_cast<size_t>(graph.node_size()), false);
  for (const auto& [value, t] : candidates) drop[static_cast<size_t>(t)] = true;
  drop_nodes(graph, drop);
  return static_cast<int>(candidates.size());
}

int permute_product_outputs(onnx::GraphProto& graph) {
  const TransposeRewrite done = rewrite_free_transposes(graph, [&](const TransposeSite& site) {
    const Matcher& m = site.m;  // references, not a structured binding of site (see above)
    const onnx::NodeProto& t = site.t;
    const std::vector<int64_t>& perm = site.perm;
    const std::string& product = t.input(0);
    auto& replace = site.rewrite.replace;
    const int p = m.producer_index(product);
    if (perm.size() < 3 || p < 0 || replace.contains(p) || m.pinned(product)) return;
    const onnx::NodeProto& node = graph.node(p);
    const bool matmul = permutable_product(node) && is_onnx_op(node, "MatMul");
    const bool permuted = node.domain() == kInternalDomain && node.op_type() == "MatMulPermuted" &&
                          node.input_size() == 2 && node.output_size() == 1 &&
                          std::none_of(node.attribute().begin(), node.attribute().end(),
                                       [](const onnx::AttributeProto& a) { return a.name() == "perm_y"; });
    if (!matmul && !permuted) return;
    std::vector<int> shapes;
    int transposes = 0;
    for (int r : m.readers(product)) {
      const onnx::NodeProto& reader = graph.node(r);
      if (r == site.i) {
        ++transposes;
      } else if (is_onnx_op(reader, "Shape") && reader.input_size() == 1 && !replace.contains(r)) {
        shapes.push_back(r);
      } else {
        return;
      }
    }
    if (transposes != 1) return;
    const std::vector<int64_t> inverse = ops::inverse_permutation(perm);
    for (int sh : shapes) replace[sh] = shape_of_transpose_input(graph, site.names, graph.node(sh), t.output(0), inverse);
    onnx::NodeProto written = node;
    written.set_domain(kInternalDomain);
    written.set_op_type("MatMulPermuted");
    written.set_output(0, t.output(0));
    *written.add_attribute() = autodiff::attr_ints("perm_y", perm);
    replace[p] = {written};
    site.rewrite.dropped.insert(site.i);
  });
  return static_cast<int>(done.dropped.size());
}

void fuse_matrix_products(onnx::GraphProto& graph) {
  fuse_matmul_add(graph);
  fuse_transpose_gemm(graph);
  fuse_transpose_matmul(graph);
  fuse_permuted_matmul(graph);
  permute_product_outputs(graph);
}

int fuse_max_pool_relu_grad(onnx::GraphProto& graph) {
  std::vector<std::pair<int, int>> pairs;  // (MaxPoolGrad, ReluGrad)
  {
    Matcher m(graph);
    const auto has_activation = [](const onnx::NodeProto& node) {
      for (const auto& attr : node.attribute()) {
        if (attr.name() == "activation") return true;
      }
      return false;
    };
    for (int i = 0; i < graph.node_size(); ++i) {
      const onnx::NodeProto& relu_grad = graph.node(i);
      if (relu_grad.domain() != kInternalDomain || relu_grad.op_type() != "ReluGrad" ||
          relu_grad.input_size() != 2 || relu_grad.output_size() != 1) {
        continue;
      }
      const std::string& dy = relu_grad.input(1);
      const onnx::NodeProto* pool_grad = m.producer(dy);
      if (!pool_grad || pool_grad->domain() != kInternalDomain || pool_grad->op_type() != "MaxPoolGrad" ||
          pool_grad->input_size() != 2 || pool_grad->input(1) != relu_grad.input(0) || has_activation(*pool_grad) ||
          m.sole_reader(dy) != i) {
        continue;
      }
      pairs.emplace_back(m.producer_index(dy), i);
    }
  }
  return absorb_nodes(graph, pairs, [](onnx::NodeProto& pool_grad, const onnx::NodeProto& relu_grad) {
    pool_grad.set_output(0, relu_grad.output(0));
    add_activation(pool_grad);
  });
}

int fuse_matmul_add_gelu(onnx::GraphProto& graph) {
  std::vector<std::pair<int, int>> pairs;  // (MatMulAdd, Gelu)
  {
    Matcher m(graph);
    for (int i = 0; i < graph.node_size(); ++i) {
      const onnx::NodeProto& gelu = graph.node(i);
      const bool is_gelu = (gelu.domain() == kInternalDomain && gelu.op_type() == "Gelu") || is_onnx_op(gelu, "Gelu");
      if (!is_gelu || gelu.input_size() != 1 || gelu.output_size() != 1) continue;
      bool erf_form = true;
      for (const auto& attr : gelu.attribute()) {
        erf_form = erf_form && attr.name() == "approximate" && attr.s() == "none";
      }
      const onnx::NodeProto* product = m.producer(gelu.input(0));
      if (!erf_form || !product || product->domain() != kInternalDomain || product->op_type() != "MatMulAdd" ||
          product->output_size() != 1 || m.sole_reader(gelu.input(0)) != i) {
        continue;
      }
      const bool has_activation = std::any_of(product->attribute().begin(), product->attribute().end(),
                                              [](const onnx::AttributeProto& a) { return a.name() == "activation"; });
      if (!has_activation) pairs.emplace_back(m.producer_index(gelu.input(0)), i);
    }
  }
  return fold_into_producers(graph, pairs, "MatMulAdd", "Gelu");
}

namespace {

// Whether `n` is ai.onnxtrain.SumToShape(t, shape) with both inputs given.
bool is_sum_to_shape(const onnx::NodeProto& n) {
  return n.domain() == kInternalDomain && n.op_type() == "SumToShape" && n.input_size() == 2 && n.output_size() == 1 &&
         !n.input(0).empty() && !n.input(1).empty();
}

}  // namespace

int fuse_gelu_bias_grad(onnx::GraphProto& graph) {
  std::vector<std::pair<int, int>> pairs;  // (GeluGrad, SumToShape)
  {
    Matcher m(graph);
    for (int i = 0; i < graph.node_size(); ++i) {
      const onnx::NodeProto& sum = graph.node(i);
      if (!is_sum_to_shape(sum)) continue;
      const int producer = m.producer_index(sum.input(0));
      if (producer < 0) continue;
      const onnx::NodeProto& grad = graph.node(producer);
      if (grad.domain() != kInternalDomain || grad.op_type() != "GeluGrad" || grad.input_size() != 2 ||
          grad.output_size() != 1 || grad.output(0) != sum.input(0)) {
        continue;
      }
      const bool taken = std::any_of(pairs.begin(), pairs.end(), [&](const auto& p) { return p.first == producer; });
      if (!taken) pairs.emplace_back(producer, i);
    }
  }
  return absorb_nodes(graph, pairs, [](onnx::NodeProto& grad, const onnx::NodeProto& sum) {
    grad.add_input(sum.input(1));
    grad.add_output(sum.output(0));
  });
}

int fuse_layer_norm_grad_sum(onnx::GraphProto& graph) {
  std::vector<std::pair<int, int>> pairs;  // (LayerNormalizationGrad, Sum)
  {
    Matcher m(graph);
    for (int i = 0; i < graph.node_size(); ++i) {
      const onnx::NodeProto& grad = graph.node(i);
      if (grad.domain() != kInternalDomain || grad.op_type() != "LayerNormalizationGrad" || grad.input_size() < 2 ||
          grad.input_size() > 5 || grad.input(0).empty()) {
        continue;
      }
      const onnx::NodeProto* sum = m.producer(grad.input(0));
      if (!sum || !is_onnx_op(*sum, "Sum") || sum->input_size() < 2 || sum->output_size() != 1 ||
          m.sole_reader(grad.input(0)) != i) {
        continue;
      }
      const bool all_named = std::none_of(sum->input().begin(), sum->input().end(), [](const std::string& in) { return in.empty(); });
      if (all_named) pairs.emplace_back(i, m.producer_index(grad.input(0)));
    }
  }
  return absorb_nodes(graph, pairs, [](onnx::NodeProto& grad, const onnx::NodeProto& sum) {
    grad.set_input(0, sum.input(0));
    while (grad.input_size() < 5) grad.add_input("");
    for (int k = 1; k < sum.input_size(); ++k) grad.add_input(sum.input(k));
  });
}

int fuse_add_layer_norm(onnx::GraphProto& graph) {
  std::vector<std::pair<int, int>> pairs;  // (LayerNormalization, Add)
  std::set<std::string> unread;            // sums the normalization alone reads
  {
    Matcher m(graph);
    std::vector<bool> taken(static_cast<size_t>(graph.node_size()), false);
    for (int i = 0; i < graph.node_size(); ++i) {
      const onnx::NodeProto& norm = graph.node(i);
      if (!is_onnx_op(norm, "LayerNormalization") || norm.input_size() < 2 || norm.input_size() > 3 ||
          norm.output_size() > 3 || norm.input(0).empty() || norm.input(1).empty()) {
        continue;
      }
      const std::string& x = norm.input(0);
      const int add = m.producer_index(x);
      if (add < 0 || add > i || taken[static_cast<size_t>(add)]) continue;
      const onnx::NodeProto& sum = graph.node(add);
      if (!is_onnx_op(sum, "Add") || sum.input_size() != 2 || sum.output_size() != 1 || sum.attribute_size() != 0 ||
          sum.input(0).empty() || sum.input(1).empty() || m.pinned(x)) {
        continue;
      }
      // The sum is made where the normalization was: its other readers must come after it.
      const std::vector<int>& readers = m.readers(x);
      if (std::any_of(readers.begin(), readers.end(), [&](int r) { return r < i; })) continue;
      taken[static_cast<size_t>(add)] = true;
      pairs.emplace_back(i, add);
      if (readers.size() == 1) unread.insert(x);
    }
  }
  return absorb_nodes(graph, pairs, [&](onnx::NodeProto& norm, const onnx::NodeProto& sum) {
    std::vector<std::string> inputs = {sum.input(0), sum.input(1)};
    for (int k = 1; k < norm.input_size(); ++k) inputs.push_back(norm.input(k));
    norm.clear_input();
    for (const auto& in : inputs) norm.add_input(in);
    while (norm.output_size() < 3) norm.add_output("");
    norm.add_output(unread.contains(sum.output(0)) ? "" : sum.output(0));
    norm.set_domain(kInternalDomain);
    norm.set_op_type("AddLayerNormalization");
  });
}

void fuse_products_and_gradients(onnx::GraphProto& graph) {
  fuse_matrix_products(graph);
  fuse_matmul_add_gelu(graph);
  fuse_gemm_relu(graph);
  fuse_max_pool_relu_grad(graph);
  fuse_layer_norm_grad_sum(graph);
  fuse_layer_norm_bias_grad(graph);
  fuse_gelu_bias_grad(graph);
  fuse_add_layer_norm(graph);
}

namespace {

// The value of `name` when it is one float element of an initializer or a Constant node's
// `value` / `value_float`; nullopt otherwise.
std::optional<double> scalar_constant(const onnx::GraphProto& graph, Matcher& m, const std::string& name) {
  const onnx::TensorProto* proto = nullptr;
  for (const auto& init : graph.initializer()) {
    if (init.name() == name) proto = &init;
  }
  if (const onnx::NodeProto* node = m.producer(name); node && is_onnx_op(*node, "Constant")) {
    for (const auto& attr : node->attribute()) {
      if (attr.name() == "value_float") return attr.f();
      if (attr.name() == "value") proto = &attr.t();
    }
  }
  if (!proto || !one_element(proto->dims())) return std::nullopt;
  const auto type = static_cast<onnx::TensorProto::DataType>(proto->data_type());
  if (type != onnx::TensorProto::FLOAT && type != onnx::TensorProto::DOUBLE && type != onnx::TensorProto::FLOAT16 &&
      type != onnx::TensorProto::BFLOAT16) {
    return std::nullopt;
  }
  try {
    return io::tensor_from_proto(*proto, {}, name).to_double_vector()[0];
  } catch (const Error&) {  // external data or a malformed tensor: not a constant this pass reads
    return std::nullopt;
  }
}

// sqrt 2 rounded to float32, float64, float16 or bfloat16 (whichever type the exporter used).
bool is_sqrt2(double v) {
  constexpr double kSqrt2 = std::numbers::sqrt2;
  return v == kSqrt2 || v == static_cast<double>(static_cast<float>(kSqrt2)) ||
         v == Tensor::from_vector<double>(Shape{1}, {kSqrt2}).cast(DataType::Float16).to_double_vector()[0] ||
         v == Tensor::from_vector<double>(Shape{1}, {kSqrt2}).cast(DataType::BFloat16).to_double_vector()[0];
}

// The other operand of the binary node `node` when one of its two inputs is `operand`.
std::optional<std::string> other_operand(const onnx::NodeProto& node, const std::string& operand) {
  if (node.input_size() != 2) return std::nullopt;
  if (node.input(0) == operand) return node.input(1);
  if (node.input(1) == operand) return node.input(0);
  return std::nullopt;
}

// The node's attributes by name, serialized (a canonical form to compare).
std::map<std::string, std::string> attributes_of(const onnx::NodeProto& node) {
  std::map<std::string, std::string> out;
  for (const auto& attr : node.attribute()) out[attr.name()] = attr.SerializeAsString();
  return out;
}

// Whether `grad` is the gradient node of the recurrent node `forward` (op RNN, GRU or LSTM with
// `inputs` input positions): the same inputs and attributes (the gradient rule leaves out
// `layout` below opset 14, where the forward op ignores it).
bool is_gradient_of(const onnx::NodeProto& grad, const onnx::NodeProto& forward, int inputs) {
  if (grad.domain() != kInternalDomain || grad.op_type() != forward.op_type() + "Grad") return false;
  for (int k = 0; k < inputs; ++k) {
    const std::string& mine = k < forward.input_size() ? forward.input(k) : std::string();
    const std::string& theirs = k < grad.input_size() ? grad.input(k) : std::string();
    if (mine != theirs) return false;
  }
  std::map<std::string, std::string> want = attributes_of(forward);
  const std::map<std::string, std::string> have = attributes_of(grad);
  if (!have.contains("layout")) want.erase("layout");
  return want == have;
}

}  // namespace

std::map<std::string, onnx::TypeProto> inferred_types(const onnx::GraphProto& graph,
                                                      const std::unordered_map<std::string, int>& opsets) {
  onnx::GraphProto copy = graph;
  try {
    onnx::shape_inference::InferShapes(&copy, opsets, onnx::OpSchemaRegistry::Instance(),
                                       onnx::ShapeInferenceOptions(false, 0, true));
  } catch (const std::exception&) {  // best effort: keep what was inferred before the error
  }
  std::map<std::string, onnx::TypeProto> types;
  for (const auto* list : {&copy.input(), &copy.output(), &copy.value_info()}) {
    for (const auto& v : *list) types[v.name()] = v.type();
  }
  for (const auto& t : graph.initializer()) {  // the initializer's own dims, not appended to a declared shape's
    auto* tensor = types[t.name()].mutable_tensor_type();
    tensor->set_elem_type(t.data_type());
    tensor->clear_shape();
    tensor->mutable_shape();  // a scalar's empty shape is still a shape
    for (int64_t d : t.dims()) tensor->mutable_shape()->add_dim()->set_dim_value(d);
  }
  return types;
}

int drop_zero_dropout(onnx::GraphProto& graph, const std::unordered_map<std::string, int>& opsets) {
  const auto it = opsets.find("");
  if (it == opsets.end() || it->second < 12) return 0;
  std::unordered_set<std::string> inputs;  // a graph input's value is the caller's, not the file's
  for (const auto& in : graph.input()) inputs.insert(in.name());
  std::vector<int> found;
  {
    Matcher m(graph);
    for (int i = 0; i < graph.node_size(); ++i) {
      const onnx::NodeProto& node = graph.node(i);
      if (!is_onnx_op(node, "Dropout") || node.input_size() < 2 || node.input(0).empty()) continue;
      const std::string& ratio = node.input(1);
      if (ratio.empty() || inputs.contains(ratio) || scalar_constant(graph, m, ratio) != 0.0) continue;
      if (node.output_size() > 1 && !node.output(1).empty()) {
        const std::string& mask = node.output(1);
        if (m.pinned(mask) || !m.readers(mask).empty()) continue;
      }
      found.push_back(i);
    }
  }
  for (int i : found) {
    onnx::NodeProto& node = *graph.mutable_node(i);
    const std::string x = node.input(0), y = node.output(0);
    node.set_op_type("Identity");
    node.clear_attribute();
    node.clear_input();
    node.add_input(x);
    node.clear_output();
    node.add_output(y);
  }
  return static_cast<int>(found.size());
}

int gather_before_transpose(onnx::GraphProto& graph) {
  std::vector<bool> drop(static_cast<size_t>(graph.node_size()), false);
  std::unordered_set<std::string> removed;  // the Transposes' outputs
  {
    Matcher m(graph);
    const std::unordered_set<std::string> named = attribute_named_values(graph);
    for (int i = 0; i < graph.node_size(); ++i) {
      onnx::NodeProto& gather = *graph.mutable_node(i);
      if (!is_onnx_op(gather, "Gather") || gather.input_size() != 2 || gather.output_size() != 1) continue;
      const std::string y = gather.input(0);  // a copy: the input is replaced below
      const int t = m.producer_index(y);
      if (t < 0 || drop[static_cast<size_t>(t)] || named.contains(y)) continue;
      if (m.sole_reader(y) != std::optional<int>(i)) continue;
      const std::optional<std::vector<int64_t>> perm = stated_perm(graph.node(t));
      const auto index = constant_type(graph, m, gather.input(1));
      if (!perm || perm->empty() || !index || !index->second.empty() ||
          (index->first != onnx::TensorProto::INT64 && index->first != onnx::TensorProto::INT32)) {
        continue;
      }
      const auto rank = static_cast<int64_t>(perm->size());
      int64_t axis = int_attribute(gather, "axis");
      if (axis < -rank || axis >= rank) continue;  // the kernel names the error
      if (axis < 0) axis += rank;
      // The input dims the output keeps, in the output's order, must ascend.
      const int64_t from = (*perm)[static_cast<size_t>(axis)];
      int64_t last = -1;
      bool ordered = true;
      for (int64_t d = 0; d < rank && ordered; ++d) {
        const int64_t p = (*perm)[static_cast<size_t>(d)];
        if (d == axis) continue;
        ordered = p > last && p >= 0 && p < rank && p != from;
        last = p;
      }
      if (!ordered || from < 0 || from >= rank) continue;
      gather.set_input(0, graph.node(t).input(0));
      bool set = false;
      for (auto& attr : *gather.mutable_attribute()) {
        if (attr.name() == "axis") {
          attr.set_i(from);
          set = true;
        }
      }
      if (!set) *gather.add_attribute() = autodiff::attr_int("axis", from);
      drop[static_cast<size_t>(t)] = true;
      removed.insert(y);
    }
  }
  if (removed.empty()) return 0;
  drop_nodes(graph, drop);
  auto* infos = graph.mutable_value_info();
  for (int k = infos->size() - 1; k >= 0; --k) {
    if (removed.contains(infos->Get(k).name())) infos->DeleteSubrange(k, 1);
  }
  return static_cast<int>(removed.size());
}

void fuse_before_expansion(onnx::GraphProto& graph, const std::unordered_map<std::string, int>& opsets) {
  concat_of_slices_to_gather(graph, opsets);
  fuse_gelu(graph, opsets);
  drop_zero_dropout(graph, opsets);
  gather_before_rowwise_ops(graph, opsets);
  fuse_attention(graph, opsets);
}

int fuse_gelu(onnx::GraphProto& graph, const std::unordered_map<std::string, int>& opsets) {
  struct Chain {
    std::vector<int> nodes;  // Div, Erf, Add, Mul, Mul
    std::string x, y;
  };
  std::vector<Chain> chains;
  {
    Matcher m(graph);
    const std::unordered_set<std::string> named = attribute_named_values(graph);
    // The index of the sole reader of `value`, of op `op_type`, when `value` may disappear; -1 if none.
    auto only_reader = [&](const std::string& value, const char* op_type) {
      const std::optional<int> r = named.contains(value) ? std::nullopt : m.sole_reader(value);
      return r && is_onnx_op(graph.node(*r), op_type) && graph.node(*r).output_size() == 1 ? *r : -1;
    };
    auto at = [&](int index) { return index < 0 ? nullptr : &graph.node(index); };
    for (int i = 0; i < graph.node_size(); ++i) {
      const onnx::NodeProto& div = graph.node(i);
      if (!is_onnx_op(div, "Div") || div.input_size() != 2 || div.output_size() != 1) continue;
      const std::string& x = div.input(0);
      const std::optional<double> root = scalar_constant(graph, m, div.input(1));
      if (!root || !is_sqrt2(*root)) continue;
      const int erf = only_reader(div.output(0), "Erf");
      const int add = erf < 0 ? -1 : only_reader(at(erf)->output(0), "Add");
      const auto one = add < 0 ? std::nullopt : other_operand(*at(add), at(erf)->output(0));
      if (!one || scalar_constant(graph, m, *one) != 1.0) continue;
      const int mul = only_reader(at(add)->output(0), "Mul");
      if (mul < 0 || other_operand(*at(mul), at(add)->output(0)) != x) continue;
      const int half_mul = only_reader(at(mul)->output(0), "Mul");
      const auto half = half_mul < 0 ? std::nullopt : other_operand(*at(half_mul), at(mul)->output(0));
      if (!half || scalar_constant(graph, m, *half) != 0.5) continue;
      chains.push_back({{i, erf, add, mul, half_mul}, x, at(half_mul)->output(0)});
    }
  }
  if (chains.empty()) return 0;
  const std::map<std::string, onnx::TypeProto> types = inferred_types(graph, opsets);
  std::unordered_set<std::string> declared;
  for (const auto* list : {&graph.input(), &graph.output(), &graph.value_info()}) {
    for (const auto& v : *list) declared.insert(v.name());
  }
  std::vector<bool> drop(static_cast<size_t>(graph.node_size()), false);
  for (const Chain& c : chains) {
    if (const auto type = types.find(c.y); type != types.end() && !declared.contains(c.y)) {
      auto* info = graph.add_value_info();
      info->set_name(c.y);
      *info->mutable_type() = type->second;
    }
    for (size_t k = 0; k + 1 < c.nodes.size(); ++k) drop[static_cast<size_t>(c.nodes[k])] = true;
    onnx::NodeProto& node = *graph.mutable_node(c.nodes.back());  // the last Mul's place: x and y exist there
    const std::string name = node.name();
    node.Clear();
    node.set_name(name);
    node.set_domain(kInternalDomain);
    node.set_op_type("Gelu");
    node.add_input(c.x);
    node.add_output(c.y);
  }
  drop_nodes(graph, drop);
  return static_cast<int>(chains.size());
}

namespace {
// The value of `name` when it is a one-element float constant (scalar_constant) or Identity,
// Cast (to float32, rounded, or float64), Sqrt, Reciprocal, Mul or Div of such values: the
// factors exporters compute in the graph, such as attention's Cast(Sqrt(1 / 8)) on Q and on K.
// Computed in float64; nullopt for anything else.
std::optional<double> scalar_value(const onnx::GraphProto& graph, Matcher& m, const std::string& name, int depth = 0) {
  if (const auto c = scalar_constant(graph, m, name)) return c;
  const onnx::NodeProto* node = m.producer(name);
  if (!node || depth > 8 || node->output_size() != 1 || node->input_size() < 1 || node->input(0).empty()) return std::nullopt;
  const auto in = [&](int i) {
    return i < node->input_size() && !node->input(i).empty() ? scalar_value(graph, m, node->input(i), depth + 1) : std::nullopt;
  };
  const auto x = in(0);
  if (!x) return std::nullopt;
  if (is_onnx_op(*node, "Identity")) return x;
  if (is_onnx_op(*node, "Cast")) {
    for (const auto& attr : node->attribute()) {
      if (attr.name() != "to") continue;
      if (attr.i() == onnx::TensorProto::FLOAT) return static_cast<double>(static_cast<float>(*x));
      if (attr.i() == onnx::TensorProto::DOUBLE) return x;
    }
    return std::nullopt;
  }
  if (is_onnx_op(*node, "Sqrt")) return *x >= 0 ? std::optional<double>(std::sqrt(*x)) : std::nullopt;
  if (is_onnx_op(*node, "Reciprocal")) return *x != 0 ? std::optional<double>(1 / *x) : std::nullopt;
  if (node->input_size() != 2) return std::nullopt;
  const auto y = in(1);
  if (!y) return std::nullopt;
  if (is_onnx_op(*node, "Mul")) return *x * *y;
  if (is_onnx_op(*node, "Div")) return *y != 0 ? std::optional<double>(*x / *y) : std::nullopt;
  return std::nullopt;
}

// One MatMul-Softmax-MatMul attention fuse_attention replaces.
struct AttentionMatch {
  int product = -1;          // the P V MatMul, whose place (and output) the fused node takes
  std::vector<int> removed;  // the other nodes of the pattern, and the nodes only they feed
  std::string q, k, v, mask;
  double scale = 1;
  bool nan_to_zero = false;  // Where(IsNaN(P), 0, P) after the Softmax
  // Shape nodes reading a Transpose of q, k or v (or its scaled copy), which read Gather(Shape(x),
  // perm) instead: node index, x, perm.
  std::vector<std::tuple<int, std::string, std::vector<int64_t>>> shapes;
};

// `value` as t times a scalar factor: Mul(t, c), Mul(c, t) or Div(t, c) with c a scalar_value;
// returns t (pushing the node and multiplying `factor`), else value itself.
std::string unscaled(const onnx::GraphProto& graph, Matcher& m, const std::string& value, double& factor, std::vector<int>& nodes) {
  const int i = m.producer_index(value);
  if (i < 0) return value;
  const onnx::NodeProto& n = graph.node(i);
  if (n.input_size() != 2 || n.output_size() != 1) return value;
  if (is_onnx_op(n, "Mul")) {
    for (int side : {1, 0}) {
      if (const auto c = scalar_value(graph, m, n.input(side)); c && !scalar_value(graph, m, n.input(1 - side))) {
        factor *= *c;
        nodes.push_back(i);
        return n.input(1 - side);
      }
    }
  } else if (is_onnx_op(n, "Div")) {
    if (const auto c = scalar_value(graph, m, n.input(1)); c && *c != 0) {
      factor /= *c;
      nodes.push_back(i);
      return n.input(0);
    }
  }
  return value;
}

// The input of `value`'s producer when that is a Transpose by exactly `perm` (pushing it).
std::optional<std::string> transposed_from(const onnx::GraphProto& graph, const Matcher& m, const std::string& value,
                                           const std::vector<int64_t>& perm, std::vector<int>& nodes) {
  const int i = m.producer_index(value);
  if (i < 0 || stated_perm(graph.node(i)) != perm) return std::nullopt;
  nodes.push_back(i);
  return graph.node(i).input(0);
}

std::optional<AttentionMatch> match_attention(const onnx::GraphProto& graph, Matcher& m, int softmax, int onnx_opset,
                                              const std::unordered_set<std::string>& named) {
  const onnx::NodeProto& sm = graph.node(softmax);
  if (!is_onnx_op(sm, "Softmax") || sm.input_size() != 1 || sm.output_size() != 1) return std::nullopt;
  int64_t axis = onnx_opset >= 13 ? -1 : 1;
  for (const auto& attr : sm.attribute()) {
    if (attr.name() == "axis") axis = attr.i();
  }
  if (axis != -1 && axis != 3) return std::nullopt;  // the keys of [B, H, S, T] scores
  AttentionMatch a;
  std::vector<int> nodes{softmax};
  // P -> [Where(IsNaN(P), 0, P)] -> Identity ... -> MatMul(P, Transpose(v, [0, 2, 1, 3]))
  std::string p = sm.output(0);
  if (const std::vector<int>& readers = m.readers(p); readers.size() == 2) {
    // PyTorch's export of scaled_dot_product_attention with a boolean mask zeroes the NaN of rows
    // the mask disallows entirely.
    const int isnan = is_onnx_op(graph.node(readers[0]), "IsNaN") ? readers[0] : readers[1];
    const int where = isnan == readers[0] ? readers[1] : readers[0];
    const onnx::NodeProto& n = graph.node(isnan);
    const onnx::NodeProto& w = graph.node(where);
    if (!is_onnx_op(n, "IsNaN") || n.output_size() != 1 || !is_onnx_op(w, "Where") || w.input_size() != 3 || w.output_size() != 1 ||
        w.input(0) != n.output(0) || w.input(2) != p || m.readers(n.output(0)).size() != 1 || scalar_value(graph, m, w.input(1)) != 0.0) {
      return std::nullopt;
    }
    nodes.push_back(isnan);
    nodes.push_back(where);
    a.nan_to_zero = true;
    p = w.output(0);
  }
  for (;;) {
    const std::vector<int>& readers = m.readers(p);
    if (readers.size() != 1) return std::nullopt;
    const onnx::NodeProto& r = graph.node(readers[0]);
    if (is_onnx_op(r, "Identity") && r.output_size() == 1) {
      nodes.push_back(readers[0]);
      p = r.output(0);
      continue;
    }
    if (!is_onnx_op(r, "MatMul") || r.input_size() != 2 || r.input(0) != p || r.input(1) == p) return std::nullopt;
    a.product = readers[0];
    break;
  }
  const std::vector<int64_t> split{0, 2, 1, 3};
  const auto v = transposed_from(graph, m, graph.node(a.product).input(1), split, nodes);
  if (!v) return std::nullopt;
  a.v = *v;
  // scores = [Add(., mask)] of [Mul / Div by a scalar] of MatMul(Q', K')
  const auto product_of = [&](const std::string& value, double& factor, std::vector<int>& found) -> int {
    const std::string t = unscaled(graph, m, value, factor, found);
    const int i = m.producer_index(t);
    if (i < 0 || !is_onnx_op(graph.node(i), "MatMul") || graph.node(i).input_size() != 2) return -1;
    found.push_back(i);
    return i;
  };
  int qk = -1;
  if (const int add = m.producer_index(sm.input(0)); add >= 0 && is_onnx_op(graph.node(add), "Add") && graph.node(add).input_size() == 2) {
    for (int side : {0, 1}) {
      double factor = 1;
      std::vector<int> found{add};
      if (const int i = product_of(graph.node(add).input(side), factor, found); i >= 0) {
        qk = i, a.scale = factor, a.mask = graph.node(add).input(1 - side);
        nodes.insert(nodes.end(), found.begin(), found.end());
        break;
      }
    }
  } else {
    double factor = 1;
    std::vector<int> found;
    if ((qk = product_of(sm.input(0), factor, found)) >= 0) {
      a.scale = factor;
      nodes.insert(nodes.end(), found.begin(), found.end());
    }
  }
  if (qk < 0) return std::nullopt;
  // Q' = [Mul by a scalar] of Transpose(q, [0, 2, 1, 3]); K' = [Mul by a scalar] of
  // Transpose(k, [0, 2, 3, 1]) or of Transpose(Transpose(k, [0, 2, 1, 3]), [0, 1, 3, 2]).
  const auto q = transposed_from(graph, m, unscaled(graph, m, graph.node(qk).input(0), a.scale, nodes), split, nodes);
  const std::string kt = unscaled(graph, m, graph.node(qk).input(1), a.scale, nodes);
  auto k = transposed_from(graph, m, kt, {0, 2, 3, 1}, nodes);
  if (!k) {
    if (const auto k4 = transposed_from(graph, m, kt, {0, 1, 3, 2}, nodes)) k = transposed_from(graph, m, *k4, split, nodes);
  }
  if (!q || !k) return std::nullopt;
  a.q = *q, a.k = *k;
  // The pattern's values that are q, k or v permuted (the Transposes and the scaled copies), so
  // that Shape nodes reading them can read Shape(q, k or v) permuted instead.
  // In graph order (ONNX's nodes are topologically sorted), so that a Transpose comes before
  // the Transpose or Mul reading it.
  std::unordered_map<std::string, std::pair<std::string, std::vector<int64_t>>> permuted;
  std::vector<int> in_order = nodes;
  std::sort(in_order.begin(), in_order.end());
  for (int i : in_order) {
    const onnx::NodeProto& n = graph.node(i);
    if (n.output_size() != 1) continue;
    std::string from = n.input_size() > 0 ? n.input(0) : "";
    std::vector<int64_t> perm{0, 1, 2, 3};
    if (const auto t = stated_perm(n)) {
      perm = *t;
    } else if (!is_onnx_op(n, "Mul")) {
      continue;
    }
    if (is_onnx_op(n, "Mul") && !permuted.contains(n.input(0))) from = n.input(1);  // Mul(c, t)
    if (const auto up = permuted.find(from); up != permuted.end()) {  // a Transpose or Mul of one met before
      std::vector<int64_t> composed(perm.size());
      for (size_t d = 0; d < perm.size(); ++d) composed[d] = up->second.second[static_cast<size_t>(perm[d])];
      permuted[n.output(0)] = {up->second.first, composed};
    } else if (stated_perm(n) && (from == a.q || from == a.k || from == a.v)) {
      permuted[n.output(0)] = {from, perm};
    }
  }

  // Every node of the pattern goes, and with it whatever reads its values besides the pattern
  // (the Shape nodes exporters hang on them, and what only those feed): each such value must
  // be read by nothing that stays, be no graph output nor read by a subgraph nor named by an
  // attribute. A bounded search: patterns with more hangers-on stay as they are.
  std::unordered_set<int> gone(nodes.begin(), nodes.end());
  if (gone.size() != nodes.size() || gone.contains(a.product)) return std::nullopt;  // a node met twice
  std::vector<int> work(nodes.begin(), nodes.end());
  while (!work.empty()) {
    const onnx::NodeProto& n = graph.node(work.back());
    work.pop_back();
    for (const auto& out : n.output()) {
      if (out.empty()) continue;
      if (m.pinned(out) || named.contains(out)) return std::nullopt;
      for (int r : m.readers(out)) {
        if (const auto p = permuted.find(out); p != permuted.end() && is_onnx_op(graph.node(r), "Shape") &&
                                                  graph.node(r).output_size() == 1 && graph.node(r).input_size() == 1) {
          a.shapes.emplace_back(r, p->second.first, p->second.second);
          continue;
        }
        if (r == a.product) {
          const onnx::NodeProto& pv = graph.node(a.product);
          if (out != pv.input(0) && out != pv.input(1)) return std::nullopt;
          continue;
        }
        if (gone.insert(r).second) {
          if (gone.size() > nodes.size() + 64) return std::nullopt;
          work.push_back(r);
        }
      }
    }
  }
  for (const std::string* in : {&a.q, &a.k, &a.v, &a.mask}) {
    if (!in->empty() && gone.contains(m.producer_index(*in))) return std::nullopt;
  }
  a.removed.assign(gone.begin(), gone.end());
  return a;
}

// The values of `name` when it is an int64 constant (constant_proto) of at most 8 elements.
std::optional<std::vector<int64_t>> small_int_constant(const onnx::GraphProto& graph, const Matcher& m,
                                                       const std::string& name) {
  const onnx::TensorProto* proto = constant_proto(graph, m, name);
  if (!proto || proto->data_type() != onnx::TensorProto::INT64) return std::nullopt;
  const std::optional<Tensor> t = int64_constant(graph, m, name);
  if (!t || t->numel() > 8) return std::nullopt;
  return std::vector<int64_t>(t->data<int64_t>(), t->data<int64_t>() + t->numel());
}

// Whether Reshape node `reshape`, reading the fused attention's output y (as MatMul wrote it:
// [B, H, Sq, Dv] of q [B, Sq, H, D] and v [B, Skv, H, Dv], the batch checked equal), gives y its
// own shape, as PyTorch's export of scaled_dot_product_attention writes it before the head merge
// (Reshape(y, [B, -1, Sq, Dv]), the dims from Shape nodes): its shape a Concat of four
// one-element values, value i a constant or Unsqueeze(c, [0]) with c 0 (Reshape keeps the dim,
// allowzero 0), y's dim i as shape inference states it (`dim`), or -1 (once: the three others
// proven, it is y's dim i; on a y with a dim of 0, where the unfused Reshape cannot infer it,
// the fused graph has no Reshape to fail), or [Unsqueeze of] Gather(Shape(t), j) with dim j of t
// y's dim i: t = y and j = i, or t a Transpose of q or v whose Shape the fusion reads off q or v
// (a.shapes: dim j of t is dim perm[j] of x) with x's dim y's dim i. `y_shapes` gets the other
// readers of y, which must all be Shape nodes.
bool reshapes_to_own_shape(const onnx::GraphProto& graph, const Matcher& m, const AttentionMatch& a,
                           const std::string& y, int reshape,
                           const std::function<std::string(const std::string&, int)>& dim, std::vector<int>& y_shapes) {
  const onnx::NodeProto& r = graph.node(reshape);
  if (!is_onnx_op(r, "Reshape") || r.input_size() != 2 || r.output_size() != 1 || r.input(0) != y || r.input(1) == y) {
    return false;
  }
  const bool allowzero = int_attribute(r, "allowzero") != 0;
  y_shapes.clear();
  for (int reader : m.readers(y)) {
    if (reader == reshape) continue;
    const onnx::NodeProto& n = graph.node(reader);
    if (!is_onnx_op(n, "Shape") || n.input_size() != 1 || n.output_size() != 1) return false;
    y_shapes.push_back(reader);
  }
  const int concat = m.producer_index(r.input(1));
  if (concat < 0) return false;
  const onnx::NodeProto& c = graph.node(concat);
  if (!is_onnx_op(c, "Concat") || c.input_size() != 4 || int_attribute(c, "axis") != 0) return false;
  // y's dim i as dim `of[i].second` of q or v (the batch is q's, k's and v's alike).
  const std::pair<const std::string*, int64_t> of[4] = {{&a.q, 0}, {&a.q, 2}, {&a.q, 1}, {&a.v, 3}};
  // Whether dim j of what Shape node `shape` reads is y's dim i.
  const auto same_dim = [&](int shape, int64_t j, int64_t i) {
    if (j < 0) j += 4;
    if (graph.node(shape).input(0) == y) return j == i;
    for (const auto& [node, x, perm] : a.shapes) {
      if (node != shape || j < 0 || j >= static_cast<int64_t>(perm.size())) continue;
      const int64_t d = perm[static_cast<size_t>(j)];
      return (x == *of[i].first && d == of[i].second) || (i == 0 && d == 0 && (x == a.k || x == a.v));
    }
    return false;
  };
  int inferred = 0;  // elements -1: Reshape infers the dim from the others
  const auto stated = [&](int64_t value, int64_t i) {
    if (value == -1) return ++inferred == 1;
    if (value == 0) return !allowzero;
    const std::string v = std::to_string(value);
    return v == dim(y, static_cast<int>(i)) || v == dim(*of[i].first, static_cast<int>(of[i].second));
  };
  for (int64_t i = 0; i < 4; ++i) {
    std::string e = c.input(static_cast<int>(i));
    if (const onnx::NodeProto* u = m.producer(e); u && is_onnx_op(*u, "Unsqueeze")) {  // of a scalar
      std::vector<int64_t> axes;
      for (const auto& attr : u->attribute()) {
        if (attr.name() == "axes") axes.assign(attr.ints().begin(), attr.ints().end());
      }
      if (u->input_size() == 2) axes = small_int_constant(graph, m, u->input(1)).value_or(std::vector<int64_t>{});
      if (axes != std::vector<int64_t>{0} && axes != std::vector<int64_t>{-1}) return false;
      e = u->input(0);
    }
    if (const auto value = small_int_constant(graph, m, e)) {
      if (value->size() != 1 || !stated((*value)[0], i)) return false;
      continue;
    }
    // Gather(Shape(t), j) over axis 0, j one index; Shape of the whole of t.
    const onnx::NodeProto* n = m.producer(e);
    if (!n || !is_onnx_op(*n, "Gather") || n->input_size() != 2 || int_attribute(*n, "axis") != 0) return false;
    const auto j = small_int_constant(graph, m, n->input(1));
    const int shape = m.producer_index(n->input(0));
    if (!j || j->size() != 1 || shape < 0) return false;
    const onnx::NodeProto& sh = graph.node(shape);
    if (!is_onnx_op(sh, "Shape") || sh.input_size() != 1 || sh.attribute_size() != 0) return false;
    if (!same_dim(shape, (*j)[0], i)) return false;
  }
  return true;
}

}  // namespace

int fuse_attention(onnx::GraphProto& graph, const std::unordered_map<std::string, int>& opsets) {
  const auto onnx_opset = opsets.find("");
  std::vector<AttentionMatch> matches;
  Matcher m(graph);  // of the graph before the rewrite, which happens at the end
  {
    const std::unordered_set<std::string> named = attribute_named_values(graph);
    std::unordered_set<int> taken;
    for (int i = 0; i < graph.node_size(); ++i) {
      auto a = match_attention(graph, m, i, onnx_opset == opsets.end() ? 0 : onnx_opset->second, named);
      if (!a || taken.contains(a->product) ||
          std::any_of(a->removed.begin(), a->removed.end(), [&](int r) { return taken.contains(r); })) {
        continue;
      }
      taken.insert(a->product);
      taken.insert(a->removed.begin(), a->removed.end());
      matches.push_back(std::move(*a));
    }
  }
  if (matches.empty()) return 0;
  // float32 operands of rank 4 and a float32 mask of rank 4 at most, as shape inference gives
  // them (the kernel's other types round differently from the unfused graph); the product's
  // type for the rewrites after (the Gradient expansion needs ranks downstream).
  const std::map<std::string, onnx::TypeProto> types = inferred_types(graph, opsets);
  const auto float_of_rank = [&](const std::string& name, int lo, int hi) {
    const auto t = types.find(name);
    if (t == types.end() || !t->second.has_tensor_type() || t->second.tensor_type().elem_type() != onnx::TensorProto::FLOAT ||
        !t->second.tensor_type().has_shape()) {
      return false;
    }
    const int rank = t->second.tensor_type().shape().dim_size();
    return rank >= lo && rank <= hi;
  };
  std::unordered_set<std::string> declared;
  for (const auto* list : {&graph.input(), &graph.output(), &graph.value_info()}) {
    for (const auto& v : *list) declared.insert(v.name());
  }
  ValueNames names(graph);
  std::map<int, std::vector<onnx::NodeProto>> replace;
  std::set<int> dropped;
  int fused = 0;
  // Dim d of `name` as shape inference states it ("" when it states neither a value nor a name).
  const auto dim = [&](const std::string& name, int d) -> std::string {
    const auto t = types.find(name);
    if (t == types.end() || !t->second.has_tensor_type() || !t->second.tensor_type().has_shape()) return "";
    const auto& shape = t->second.tensor_type().shape();
    if (d >= shape.dim_size()) return "";
    const auto& x = shape.dim(d);
    return x.has_dim_value() ? std::to_string(x.dim_value()) : x.dim_param();
  };
  for (const AttentionMatch& a : matches) {
    if (!float_of_rank(a.q, 4, 4) || !float_of_rank(a.k, 4, 4) || !float_of_rank(a.v, 4, 4) ||
        (!a.mask.empty() && !float_of_rank(a.mask, 1, 4))) {
      continue;
    }
    // One batch for Q, K and V (MatMul would broadcast a batch of 1; the kernel does not).
    const std::string batch = dim(a.q, 0);
    if (batch.empty() || dim(a.k, 0) != batch || dim(a.v, 0) != batch) continue;
    const onnx::NodeProto& product = graph.node(a.product);
    std::string y = product.output(0);
    // The head merge's Transpose to [batch, sequence, heads, head size], read by nothing else:
    // the kernel writes that layout itself (output_layout BSHD). Between the two may stand a
    // Reshape of y to its own shape (reshapes_to_own_shape), which goes too; the Shape nodes
    // reading y then read the new output permuted.
    std::optional<int> merge = m.sole_reader(y);
    std::optional<int> same_shape;
    std::vector<int> y_shapes;
    if (!merge && !m.pinned(y)) {
      for (int r : m.readers(y)) {
        if (is_onnx_op(graph.node(r), "Reshape") && reshapes_to_own_shape(graph, m, a, y, r, dim, y_shapes)) {
          same_shape = r;
          merge = m.sole_reader(graph.node(r).output(0));
          break;
        }
      }
    }
    const auto untouched = [&](int node) { return !dropped.contains(node) && !replace.contains(node); };
    const bool y_bshd =
        merge && stated_perm(graph.node(*merge)) == std::vector<int64_t>{0, 2, 1, 3} && untouched(*merge) &&
        (!same_shape || (untouched(*same_shape) && std::all_of(y_shapes.begin(), y_shapes.end(), untouched)));
    if (y_bshd) {
      dropped.insert(*merge);
      y = graph.node(*merge).output(0);
      if (same_shape) {
        dropped.insert(*same_shape);
        for (int sh : y_shapes) replace[sh] = shape_of_transpose_input(graph, names, graph.node(sh), y, {0, 2, 1, 3});
      }
    }
    if (const auto type = types.find(y); type != types.end() && !declared.contains(y)) {
      auto* info = graph.add_value_info();
      info->set_name(y);
      *info->mutable_type() = type->second;
    }
    dropped.insert(a.removed.begin(), a.removed.end());
    for (const auto& [shape, x, perm] : a.shapes) {
      replace[shape] = shape_of_transpose_input(graph, names, graph.node(shape), x, perm);
    }
    onnx::NodeProto node;
    node.set_name(product.name());
    node.set_domain(kInternalDomain);
    node.set_op_type("Attention");
    for (const std::string* in : {&a.q, &a.k, &a.v}) node.add_input(*in);
    if (!a.mask.empty()) node.add_input(a.mask);
    node.add_output(y);
    *node.add_attribute() = autodiff::attr_float("scale", static_cast<float>(a.scale));
    *node.add_attribute() = autodiff::attr_string("input_layout", "BSHD");
    if (y_bshd) *node.add_attribute() = autodiff::attr_string("output_layout", "BSHD");
    *node.add_attribute() = autodiff::attr_int("graph_semantics", 1);
    if (a.nan_to_zero) *node.add_attribute() = autodiff::attr_int("nan_to_zero", 1);
    *node.add_attribute() = autodiff::attr_int("version", 23);
    replace[a.product] = {std::move(node)};
    ++fused;
  }
  rebuild_nodes(graph, replace, dropped);
  return fused;
}

int share_attention_probabilities(onnx::GraphProto& graph) {
  ValueNames names(graph);
  int shared = 0;
  for (int i = 0; i < graph.node_size(); ++i) {
    const onnx::NodeProto& forward = graph.node(i);
    if (forward.domain() != kInternalDomain || forward.op_type() != "Attention" || forward.output_size() != 1) continue;
    const std::map<std::string, std::string> attrs = attributes_of(forward);
    if (attrs.contains("softcap") || attrs.contains("qk_matmul_output_mode")) continue;
    std::vector<int> grads;
    for (int j = i + 1; j < graph.node_size(); ++j) {
      const onnx::NodeProto& grad = graph.node(j);
      if (grad.domain() != kInternalDomain || grad.op_type() != "AttentionGrad" || grad.input_size() > 10 ||
          grad.input_size() < forward.input_size() + 1 || attributes_of(grad) != attrs) {
        continue;
      }
      bool same = true;
      for (int k = 0; k < forward.input_size(); ++k) same = same && grad.input(k + 1) == forward.input(k);
      for (int k = forward.input_size() + 1; k < grad.input_size(); ++k) same = same && grad.input(k).empty();
      if (same) grads.push_back(j);
    }
    if (grads.empty()) continue;
    const std::string probabilities = names.fresh((forward.name().empty() ? "Attention" : forward.name()) + "/onnxtrain.probabilities");
    onnx::NodeProto& node = *graph.mutable_node(i);
    *node.add_attribute() = autodiff::attr_int("qk_matmul_output_mode", 3);
    while (node.output_size() < 3) node.add_output("");
    node.add_output(probabilities);
    for (int j : grads) {
      onnx::NodeProto& grad = *graph.mutable_node(j);
      while (grad.input_size() < 10) grad.add_input("");
      grad.add_input(probabilities);
    }
    ++shared;
  }
  return shared;
}

int share_rnn_trace(onnx::GraphProto& graph) {
  ValueNames names(graph);  // to make the trace's name unique
  int rewritten = 0;
  for (int i = 0; i < graph.node_size(); ++i) {
    const onnx::NodeProto& forward = graph.node(i);
    const std::string& op = forward.op_type();
    if ((!forward.domain().empty() && forward.domain() != "ai.onnx") || (op != "RNN" && op != "GRU" && op != "LSTM")) {
      continue;
    }
    const int inputs = op == "LSTM" ? 8 : 6, outputs = op == "LSTM" ? 3 : 2;
    std::vector<int> grads;
    for (int j = i + 1; j < graph.node_size(); ++j) {
      const onnx::NodeProto& grad = graph.node(j);
      if (grad.input_size() <= inputs + outputs && is_gradient_of(grad, forward, inputs)) grads.push_back(j);
    }
    if (grads.empty()) continue;
    const std::string trace = names.fresh((forward.name().empty() ? op : forward.name()) + "/onnxtrain.trace");
    onnx::NodeProto& node = *graph.mutable_node(i);
    node.set_domain(kInternalDomain);
    node.set_op_type(op + "Training");
    *node.mutable_attribute() = graph.node(grads.front()).attribute();
    while (node.output_size() < outputs) node.add_output("");
    node.add_output(trace);
    for (int j : grads) {
      onnx::NodeProto& grad = *graph.mutable_node(j);
      while (grad.input_size() < inputs + outputs) grad.add_input("");
      grad.add_input(trace);
    }
    ++rewritten;
  }
  return rewritten;
}

namespace {
// Element-wise ops whose result, permuted, is their result on permuted operands, when every
// operand that is not one element is permuted alike (ONNX broadcasting pairs dims from the back;
// operands of one rank pair them position by position, so any common permutation commutes).
bool layout_free(const onnx::NodeProto& node) {
  static const std::set<std::string> kOnnx = {"Relu",  "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish",
                                              "Elu",   "Selu",      "Softplus", "Softsign", "Clip", "Identity",
                                              "Abs",   "Neg",       "Exp",     "Sqrt", "Erf",  "Gelu",
                                              "Add",   "Sub",       "Mul",     "Div",  "Max",  "Min",
                                              "Sum",   "Mean",      "Pow"};
  if (node.output_size() != 1) return false;
  if (node.domain() == kInternalDomain) return node.op_type() == "Gelu";
  return (node.domain().empty() || node.domain() == "ai.onnx") && kOnnx.contains(node.op_type());
}

// The rank of a Conv or ai.onnxtrain.FusedConv whose weights are a float32 constant of rank 3
// to 5 (1 to 3 spatial dims: what the oneDNN path takes), else 0. `pooled`: a FusedConv with a
// MaxPool, which reads its input as it is and writes channels-last with attribute channels_last.
int channels_last_conv_rank(const onnx::GraphProto& graph, const Matcher& m, const onnx::NodeProto& node,
                            bool& pooled) {
  const bool conv = is_onnx_op(node, "Conv");
  const bool fused = node.domain() == kInternalDomain && node.op_type() == "FusedConv";
  if ((!conv && !fused) || node.input_size() < 2 || node.input_size() > 3 || node.output_size() != 1) return 0;
  pooled = false;
  for (const auto& attr : node.attribute()) pooled = pooled || attr.name().starts_with("pool_");
  if (node.input(0).empty()) return 0;
  const auto w = constant_type(graph, m, node.input(1));
  if (!w || w->first != onnx::TensorProto::FLOAT || w->second.size() < 3 || w->second.size() > 5) return 0;
  return static_cast<int>(w->second.size());
}

// Transpose `from` -> `to` with the permutation that moves the channel dim (1) of a rank-`rank`
// tensor last, or back (`to_channels_last` false).
onnx::NodeProto channels_transpose(const std::string& name, const std::string& from, const std::string& to,
                                   int rank, bool to_channels_last) {
  onnx::NodeProto t;
  t.set_name(name);
  t.set_op_type("Transpose");
  t.add_input(from);
  t.add_output(to);
  std::vector<int64_t> perm{0};
  if (to_channels_last) {
    for (int d = 2; d < rank; ++d) perm.push_back(d);
    perm.push_back(1);
  } else {
    perm.push_back(rank - 1);
    for (int d = 1; d < rank - 1; ++d) perm.push_back(d);
  }
  *t.add_attribute() = autodiff::attr_ints("perm", perm);
  return t;
}
}  // namespace

int use_channels_last(onnx::GraphProto& graph) {
  const int count = graph.node_size();
  Matcher m(graph);
  // Which nodes run channels-last, in node order: a convolution always (its input is
  // transposed when no converted node made it), an element-wise op when each operand is
  // channels-last of one rank or a one-element constant of no higher rank.
  std::vector<int> rank(static_cast<size_t>(count), 0);  // of a converted node's output; 0: not converted
  std::vector<bool> is_conv(static_cast<size_t>(count), false);
  std::vector<bool> pooled(static_cast<size_t>(count), false);  // reads its input plain (channels_last_conv_rank)
  std::unordered_map<std::string, std::pair<int, int>> twin;  // value -> (rank, the node that makes its twin)
  std::vector<int> parent(static_cast<size_t>(count));        // components of converted nodes
  for (int i = 0; i < count; ++i) parent[static_cast<size_t>(i)] = i;
  const auto up = [&](int i) -> int& { return parent[static_cast<size_t>(i)]; };
  const auto root = [&](int i) {
    while (up(i) != i) i = up(i) = up(up(i));  // path halving
    return i;
  };
  const auto join = [&](int a, int b) { up(root(a)) = root(b); };
  for (int i = 0; i < count; ++i) {
    const onnx::NodeProto& node = graph.node(i);
    bool pool = false;
    if (const int r = channels_last_conv_rank(graph, m, node, pool); r && pool) {
      rank[static_cast<size_t>(i)] = r;  // a component starts here: nothing joins through its input
      is_conv[static_cast<size_t>(i)] = true;
      pooled[static_cast<size_t>(i)] = true;
    } else if (r) {
      auto it = twin.find(node.input(0));
      if (it != twin.end() && it->second.first != r) continue;  // a rank mismatch the run reports
      if (it != twin.end()) {
        join(i, it->second.second);
      } else {
        twin[node.input(0)] = {r, i};
      }
      rank[static_cast<size_t>(i)] = r;
      is_conv[static_cast<size_t>(i)] = true;
    } else if (layout_free(node)) {
      int r = 0;
      bool ok = true;
      std::vector<int> joined;
      std::vector<size_t> constant_ranks;
      for (const auto& in : node.input()) {
        if (in.empty()) continue;
        if (auto it = twin.find(in); it != twin.end()) {
          ok = ok && (r == 0 || r == it->second.first);
          r = it->second.first;
          joined.push_back(it->second.second);
        } else if (const auto c = constant_type(graph, m, in);
                   c && std::all_of(c->second.begin(), c->second.end(), [](int64_t d) { return d == 1; })) {
          constant_ranks.push_back(c->second.size());
        } else {
          ok = false;
        }
      }
      for (size_t cr : constant_ranks) ok = ok && static_cast<int>(cr) <= r;
      if (!ok || r == 0) continue;
      for (int j : joined) join(i, j);
      rank[static_cast<size_t>(i)] = r;
    } else {
      continue;
    }
    twin[node.output(0)] = {rank[static_cast<size_t>(i)], i};
  }
  // Components with fewer than two convolutions stay as they are: one convolution gains nothing
  // over the reorders oneDNN does inside it.
  std::unordered_map<int, int> convs;
  for (int i = 0; i < count; ++i) {
    if (is_conv[static_cast<size_t>(i)]) ++convs[root(i)];
  }
  std::vector<bool> converted(static_cast<size_t>(count), false);
  int converted_convs = 0;
  for (int i = 0; i < count; ++i) {
    converted[static_cast<size_t>(i)] = rank[static_cast<size_t>(i)] > 0 && convs[root(i)] >= 2;
    if (converted[static_cast<size_t>(i)] && is_conv[static_cast<size_t>(i)]) ++converted_convs;
  }
  if (converted_convs == 0) return 0;

  ValueNames names(graph);
  std::unordered_map<std::string, std::string> twin_name;  // made so far
  const auto make_twin_name = [&](const std::string& value) {
    return twin_name[value] = names.fresh(value + "/channels_last");
  };
  // Whether a converted node reads input k in the channels-last layout (a convolution: X only).
  const auto reads_twin = [&](int node, int k) {
    return !is_conv[static_cast<size_t>(node)] || (k == 0 && !pooled[static_cast<size_t>(node)]);
  };

  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  for (int i = 0; i < count; ++i) {
    onnx::NodeProto& node = *graph.mutable_node(i);
    if (!converted[static_cast<size_t>(i)]) {
      nodes.Add()->Swap(&node);
      continue;
    }
    const int r = rank[static_cast<size_t>(i)];
    for (int k = 0; k < node.input_size(); ++k) {
      const std::string& in = node.input(k);
      if (in.empty() || !reads_twin(i, k) || !twin.contains(in)) continue;
      auto it = twin_name.find(in);
      if (it == twin_name.end()) {  // a convolution's input no converted node makes
        const std::string name = make_twin_name(in);
        *nodes.Add() = channels_transpose((node.name().empty() ? node.output(0) : node.name()) + "/to_channels_last",
                                          in, name, r, true);
        it = twin_name.find(in);
      }
      node.set_input(k, it->second);
    }
    const std::string y = node.output(0);
    bool plain_wanted = m.pinned(y);
    for (int reader : m.readers(y)) {
      const onnx::NodeProto& rn = graph.node(reader);
      for (int k = 0; k < rn.input_size(); ++k) {
        if (rn.input(k) == y && (!converted[static_cast<size_t>(reader)] || !reads_twin(reader, k))) {
          plain_wanted = true;
        }
      }
    }
    node.set_output(0, make_twin_name(y));
    if (pooled[static_cast<size_t>(i)]) {
      *node.add_attribute() = autodiff::attr_int("channels_last", 1);
    } else if (is_conv[static_cast<size_t>(i)]) {
      node.set_domain(kInternalDomain);
      node.set_op_type("ConvChannelsLast");
    }
    const std::string name = node.name().empty() ? y : node.name();
    const std::string twin_of_y = node.output(0);
    nodes.Add()->Swap(&node);
    if (plain_wanted) *nodes.Add() = channels_transpose(name + "/to_channels_first", twin_of_y, y, r, false);
  }
  graph.mutable_node()->Swap(&nodes);
  return converted_convs;
}

int block_pooled_conv_pairs(onnx::GraphProto& graph) {
  const int64_t block = ops::pooled_conv_channel_block();
  if (block == 0) return 0;
  Matcher m(graph);
  // The rank of a pooled FusedConv's constant float32 weights (channels_last_conv_rank), else 0.
  const auto pooled_rank = [&](const onnx::NodeProto& node) {
    bool pooled = false;
    const int r = channels_last_conv_rank(graph, m, node, pooled);
    return pooled ? r : 0;
  };
  std::vector<int> writers, readers;  // nodes that get y_channel_block, x_channel_block
  for (int i = 0; i < graph.node_size(); ++i) {
    const onnx::NodeProto& node = graph.node(i);
    const int r = pooled_rank(node);
    if (r == 0 || m.pinned(node.output(0))) continue;
    const auto w = constant_type(graph, m, node.input(1));
    if (int_attribute(node, "channels_last") != 0 || w->second[0] % block != 0) continue;
    const std::vector<int>& next = m.readers(node.output(0));
    bool all_pooled = !next.empty();
    for (int reader : next) {
      const onnx::NodeProto& rn = graph.node(reader);
      all_pooled = all_pooled && pooled_rank(rn) == r && rn.input(0) == node.output(0) &&
                   std::count(rn.input().begin(), rn.input().end(), node.output(0)) == 1;
    }
    if (!all_pooled) continue;
    writers.push_back(i);
    readers.insert(readers.end(), next.begin(), next.end());
  }
  for (int i : writers) *graph.mutable_node(i)->add_attribute() = autodiff::attr_int("y_channel_block", block);
  for (int i : readers) *graph.mutable_node(i)->add_attribute() = autodiff::attr_int("x_channel_block", block);
  return static_cast<int>(writers.size());
}

int fuse_conv_add(onnx::GraphProto& graph) {
  struct Match {
    int conv = -1, add = -1, relu = -1;
    std::string z;
  };
  std::vector<Match> matches;
  {
    Matcher m(graph);
    for_each_add_of_a_sole_output(graph, m, [&](int add, const std::string& y, const std::string& z,
                                                const onnx::NodeProto& conv) {
      if (conv.domain() != kInternalDomain || conv.op_type() != "ConvChannelsLast" || conv.input_size() > 3) {
        return false;
      }
      for (const auto& attr : conv.attribute()) {
        if (attr.name() == "activation") return false;  // Relu before the sum
      }
      Match match{m.producer_index(y), add, -1, z};
      if (const auto reader = m.sole_reader(graph.node(add).output(0))) {
        const onnx::NodeProto& relu = graph.node(*reader);
        if (is_onnx_op(relu, "Relu") && relu.input_size() == 1 && relu.output_size() == 1) match.relu = *reader;
      }
      matches.push_back(std::move(match));
      return true;
    });
  }
  if (matches.empty()) return 0;
  std::vector<bool> drop(static_cast<size_t>(graph.node_size()), false);
  for (const Match& match : matches) {
    onnx::NodeProto fused = graph.node(match.conv);
    while (fused.input_size() < 3) fused.add_input("");
    fused.add_input(match.z);
    fused.set_output(0, graph.node(match.relu >= 0 ? match.relu : match.add).output(0));
    if (match.relu >= 0) {
      add_activation(fused);
      drop[static_cast<size_t>(match.relu)] = true;
    }
    drop[static_cast<size_t>(match.conv)] = true;
    graph.mutable_node(match.add)->Swap(&fused);  // at the Add's place: z is ready there
  }
  drop_nodes(graph, drop);
  return static_cast<int>(matches.size());
}

namespace {

// A node block_convolution_tensors can run on channel-blocked tensors, with the dims of the
// float32 rank-4 weights it reads.
struct BlockableNode {
  // kBatchNorm: BatchNormalization in training mode (X, Y); kBatchNormGrad: its gradient (dY, X,
  // dX); kElementwise: Relu, ReluGrad, Add, Sum, Identity (every input and the output);
  // kSumToShape: SumToShape (its data and output; its shape from a kShape node); kShape: Shape.
  enum Kind {
    kNone, kConv, kPool, kPoolGrad, kConvGrad, kBatchNorm, kBatchNormGrad, kElementwise, kSumToShape, kShape
  } kind = kNone;
  std::vector<int64_t> weights;
};

// The float32 values whose dims the graph states: an initializer's, or a graph input's static
// shape (the training graph's parameters, fed at every step).
using StatedDims = std::unordered_map<std::string, std::vector<int64_t>>;
StatedDims stated_float_dims(const onnx::GraphProto& graph) {
  StatedDims dims;
  for (const auto& init : graph.initializer()) {
    if (init.data_type() == onnx::TensorProto::FLOAT) dims[init.name()].assign(init.dims().begin(), init.dims().end());
  }
  for (const auto& in : graph.input()) {
    const auto& type = in.type();
    if (!type.has_tensor_type() || type.tensor_type().elem_type() != onnx::TensorProto::FLOAT ||
        !type.tensor_type().has_shape()) {
      continue;
    }
    std::vector<int64_t> shape;
    for (const auto& d : type.tensor_type().shape().dim()) {
      if (!d.has_dim_value()) break;
      shape.push_back(d.dim_value());
    }
    if (static_cast<int>(shape.size()) == type.tensor_type().shape().dim_size()) dims[in.name()] = shape;
  }
  return dims;
}

// The dims of the 2-D convolution weights (float32, rank 4) a Conv / FusedConv / ConvGrad reads as
// input `index`, for group 1, else empty.
std::vector<int64_t> blockable_weights(const onnx::NodeProto& node, int index, const StatedDims& stated) {
  if (node.input_size() <= index || int_attribute(node, "group") > 1) return {};
  const auto it = stated.find(node.input(index));
  return it != stated.end() && it->second.size() == 4 ? it->second : std::vector<int64_t>{};
}

bool has_attribute(const onnx::NodeProto& node, const std::string& name) { return find_attribute(node, name); }

// Whether the node's attribute activation is "Relu".
bool relu_activation(const onnx::NodeProto& node) {
  const onnx::AttributeProto* a = find_attribute(node, "activation");
  return a && a->s() == "Relu";
}

// Removes the node's attribute `name`, if it has one.
void drop_attribute(onnx::NodeProto& node, const std::string& name) {
  auto& attrs = *node.mutable_attribute();
  attrs.erase(std::remove_if(attrs.begin(), attrs.end(), [&](const auto& a) { return a.name() == name; }), attrs.end());
}

// Whether a pool node's kernel_shape has two dims.
bool two_spatial_dims(const onnx::NodeProto& node) {
  for (const auto& attr : node.attribute()) {
    if (attr.name() == "kernel_shape") return attr.ints_size() == 2;
  }
  return false;
}

// Whether a pool node (MaxPool, MaxPoolChannelBlocked, MaxPoolGrad) has 2x2 windows at stride 2
// and no padding, dilations or ceil_mode: windows that never overlap nor reach past the input.
bool pool_2x2_stride_2(const onnx::NodeProto& node) {
  bool kernel = false, strides = false;
  for (const auto& a : node.attribute()) {
    const auto all = [&](int64_t v) { return std::all_of(a.ints().begin(), a.ints().end(), [&](int64_t i) { return i == v; }); };
    if (a.name() == "kernel_shape") kernel = a.ints_size() == 2 && all(2);
    if (a.name() == "strides") strides = a.ints_size() == 2 && all(2);
    if ((a.name() == "pads" && !all(0)) || (a.name() == "dilations" && !all(1)) || (a.name() == "ceil_mode" && a.i() != 0) ||
        (a.name() == "auto_pad" && a.s() != "NOTSET")) {
      return false;
    }
  }
  return kernel && strides;
}

BlockableNode blockable(const onnx::NodeProto& node, const StatedDims& stated) {
  BlockableNode b;
  const bool internal = node.domain() == kInternalDomain;
  if ((is_onnx_op(node, "Conv") || (internal && node.op_type() == "FusedConv" &&
                                    !has_attribute(node, "pool_kernel_shape") && !has_attribute(node, "channels_last") &&
                                    !has_attribute(node, "x_channel_block") && !has_attribute(node, "y_channel_block"))) &&
      node.output_size() == 1) {
    b.weights = blockable_weights(node, 1, stated);
    if (!b.weights.empty()) b.kind = BlockableNode::kConv;
  } else if (is_onnx_op(node, "MaxPool") && two_spatial_dims(node) &&
             (node.output_size() == 1 || node.output(1).empty())) {
    b.kind = BlockableNode::kPool;
  } else if (internal && node.op_type() == "MaxPoolGrad" && two_spatial_dims(node) && node.input_size() == 2) {
    b.kind = BlockableNode::kPoolGrad;
  } else if (internal && node.op_type() == "ConvGrad" && node.input_size() == 3) {
    b.weights = blockable_weights(node, 2, stated);
    if (!b.weights.empty()) b.kind = BlockableNode::kConvGrad;
  } else if (is_onnx_op(node, "BatchNormalization") && node.input_size() == 5 && node.output_size() <= 3 &&
             int_attribute(node, "training_mode") == 1) {  // training_mode: opset 14+, whose outputs these are
    b.kind = BlockableNode::kBatchNorm;
  } else if (internal && node.op_type() == "BatchNormalizationGrad" &&
             (node.input_size() == 3 || node.input_size() == 5) && !has_attribute(node, "channel_block")) {
    b.kind = BlockableNode::kBatchNormGrad;
  } else if ((is_onnx_op(node, "Relu") || is_onnx_op(node, "Add") || is_onnx_op(node, "Sum") ||
              is_onnx_op(node, "Identity") || (internal && node.op_type() == "ReluGrad")) &&
             node.output_size() == 1 && node.input_size() >= 1 &&
             std::none_of(node.input().begin(), node.input().end(), [](const std::string& in) { return in.empty(); })) {
    b.kind = BlockableNode::kElementwise;
  } else if (internal && node.op_type() == "SumToShape" && node.input_size() == 2) {
    b.kind = BlockableNode::kSumToShape;
  } else if (is_onnx_op(node, "Shape") && node.input_size() == 1 && !has_attribute(node, "start") &&
             !has_attribute(node, "end")) {
    b.kind = BlockableNode::kShape;
  }
  return b;
}

}  // namespace

int block_convolution_tensors(onnx::GraphProto& graph) {
  const int64_t block = ops::conv_channel_block();
  if (block != 16) return 0;  // AVX-512 only: see fusion.h
  const StatedDims stated = stated_float_dims(graph);
  std::vector<BlockableNode> nodes;
  for (const auto& node : graph.node()) nodes.push_back(blockable(node, stated));
  Matcher m(graph);
  // The channels of each value a blockable node writes (its output 0), where known.
  std::unordered_map<std::string, int64_t> channels;
  for (int i = 0; i < graph.node_size(); ++i) {
    const onnx::NodeProto& node = graph.node(i);
    const BlockableNode& b = nodes[static_cast<size_t>(i)];
    if (b.kind == BlockableNode::kNone || node.output(0).empty()) continue;
    int64_t c = 0;
    if (b.kind == BlockableNode::kConv) c = b.weights[0];
    if (b.kind == BlockableNode::kConvGrad) c = b.weights[1];
    if (b.kind == BlockableNode::kPool || b.kind == BlockableNode::kPoolGrad || b.kind == BlockableNode::kBatchNorm ||
        b.kind == BlockableNode::kBatchNormGrad || b.kind == BlockableNode::kSumToShape) {  // those of X; producers come first
      const bool second = b.kind == BlockableNode::kPoolGrad || b.kind == BlockableNode::kBatchNormGrad;
      const auto it = channels.find(node.input(second ? 1 : 0));
      if (it != channels.end()) c = it->second;
    }
    if (b.kind == BlockableNode::kElementwise) {  // those of every input, when they agree
      const auto it = channels.find(node.input(0));
      c = it == channels.end() ? 0 : it->second;
      for (const auto& in : node.input()) {
        const auto other = channels.find(in);
        if (other == channels.end() || other->second != c) c = 0;
      }
    }
    if (c > 0) channels[node.output(0)] = c;
  }
  // Whether reader `r` reads `value` only where it can read it blocked.
  const auto reads_blocked = [&](int r, const std::string& value) {
    const onnx::NodeProto& node = graph.node(r);
    const BlockableNode& b = nodes[static_cast<size_t>(r)];
    for (int k = 0; k < node.input_size(); ++k) {
      if (node.input(k) != value) continue;
      const bool ok = (b.kind == BlockableNode::kConv && k == 0 && b.weights[1] % block == 0) ||
                      (b.kind == BlockableNode::kPool && k == 0) || (b.kind == BlockableNode::kPoolGrad && k <= 1) ||
                      (b.kind == BlockableNode::kConvGrad && k <= 1) || (b.kind == BlockableNode::kBatchNorm && k == 0) ||
                      (b.kind == BlockableNode::kBatchNormGrad && k <= 1) || b.kind == BlockableNode::kElementwise ||
                      (b.kind == BlockableNode::kSumToShape && k == 0) || (b.kind == BlockableNode::kShape && k == 0);
      if (!ok) return false;
    }
    return true;
  };
  std::set<std::string> blocked;
  for (const auto& entry : channels) {
    const std::string& value = entry.first;  // a plain name: lambdas below capture it
    if (entry.second % block != 0 || m.pinned(value) || m.readers(value).empty()) continue;
    const std::vector<int>& readers = m.readers(value);
    if (std::all_of(readers.begin(), readers.end(), [&](int r) { return reads_blocked(r, value); })) {
      blocked.insert(value);
    }
  }
  // A pool writes blocked only from a blocked input; MaxPoolGrad reads X and writes dX both blocked
  // or both plain, and reads dY blocked only with them. The values a BatchNormalization (X and Y),
  // its gradient (dY, X and dX), an element-wise node (its inputs and output: the same element-wise
  // arithmetic in either layout, broadcasting over the batch and the spatial dims included, as
  // their channels agree) or a SumToShape (its data and output) reads and writes go blocked all
  // together or not at all; a SumToShape's target shape must then be a Shape of a blocked value
  // (the gradient of an Add: the same reduction in the blocked layout), and a blocked value's
  // Shape may be read by such SumToShapes only.
  for (bool changed = true; changed;) {
    changed = false;
    const auto drop = [&](const std::string& value) { changed |= blocked.erase(value) > 0; };
    // The values of a group: all blocked, or none.
    const auto all_or_none = [&](const std::vector<std::string>& values) {
      const bool all = std::all_of(values.begin(), values.end(), [&](const std::string& v) { return blocked.contains(v); });
      if (!all) std::for_each(values.begin(), values.end(), drop);
    };
    for (int i = 0; i < graph.node_size(); ++i) {
      const onnx::NodeProto& node = graph.node(i);
      const BlockableNode::Kind kind = nodes[static_cast<size_t>(i)].kind;
      if (kind == BlockableNode::kPool && !blocked.contains(node.input(0))) drop(node.output(0));
      if (kind == BlockableNode::kPoolGrad) {
        if (blocked.contains(node.input(1)) != blocked.contains(node.output(0))) {
          drop(node.input(1));
          drop(node.output(0));
        }
        if (!blocked.contains(node.input(1))) drop(node.input(0));
      }
      if (kind == BlockableNode::kBatchNorm) all_or_none({node.input(0), node.output(0)});
      if (kind == BlockableNode::kBatchNormGrad) {
        std::vector<std::string> group = {node.input(0), node.input(1)};
        if (!node.output(0).empty()) group.push_back(node.output(0));
        all_or_none(group);
      }
      if (kind == BlockableNode::kElementwise) {
        std::vector<std::string> group(node.input().begin(), node.input().end());
        group.push_back(node.output(0));
        all_or_none(group);
      }
      if (kind == BlockableNode::kSumToShape) {
        const int shape = m.producer_index(node.input(1));
        const bool from_blocked_shape = shape >= 0 && nodes[static_cast<size_t>(shape)].kind == BlockableNode::kShape &&
                                        blocked.contains(graph.node(shape).input(0));
        if (!from_blocked_shape) {
          drop(node.input(0));
          drop(node.output(0));
        }
        all_or_none({node.input(0), node.output(0)});
      }
      if (kind == BlockableNode::kShape && blocked.contains(node.input(0))) {
        const bool only_sums = !m.pinned(node.output(0)) &&
                               std::all_of(m.readers(node.output(0)).begin(), m.readers(node.output(0)).end(), [&](int r) {
                                 const onnx::NodeProto& reader = graph.node(r);
                                 return nodes[static_cast<size_t>(r)].kind == BlockableNode::kSumToShape &&
                                        reader.input(0) != node.output(0) && blocked.contains(reader.input(0));
                               });
        if (!only_sums) drop(node.input(0));
      }
    }
  }
  if (blocked.empty()) return 0;
  // A blocked convolution whose output c, after the Relu moved past its pool, only one pool of
  // 2x2 windows at stride 2 and MaxPoolGrads with activation Relu read takes the pool in: output 0
  // becomes the pool's output (pool_<name> attributes, activation Relu, y_channel_block as the
  // pool's), output 1 the pool's routing mask (ops/pool_plan.h max_pool_relu_with_mask), which the
  // MaxPoolGrads read instead of c (routing_mask = 1, their Relu in the mask). c is then made chunk
  // by chunk in cache and never stored: not written, nor read by the pool and its gradient.
  ValueNames names(graph);
  std::vector<int> dropped;
  const auto pool_into_conv = [&](int conv_index, int pool_index, const std::vector<int>& readers) {
    onnx::NodeProto& conv = *graph.mutable_node(conv_index);
    const onnx::NodeProto& pool = graph.node(pool_index);
    for (int r : readers) {
      if (r != pool_index && !pool_2x2_stride_2(graph.node(r))) return;  // the MaxPoolGrads'
    }
    const std::string mask = names.fresh(conv.output(0) + "/routing_mask");
    drop_attribute(conv, "y_channel_block");
    for (const auto& a : pool.attribute()) {
      if (a.name() == "kernel_shape" || a.name() == "strides") {
        *conv.add_attribute() = a;
        conv.mutable_attribute(conv.attribute_size() - 1)->set_name("pool_" + a.name());
      } else if (a.name() == "y_channel_block" || a.name() == "activation") {
        *conv.add_attribute() = a;
      }
    }
    conv.set_output(0, pool.output(0));
    conv.add_output(mask);
    for (int r : readers) {
      if (r == pool_index) continue;
      onnx::NodeProto& grad = *graph.mutable_node(r);
      grad.set_input(1, mask);
      drop_attribute(grad, "activation");
      *grad.add_attribute() = autodiff::attr_int("routing_mask", 1);
    }
    dropped.push_back(pool_index);
  };
  const auto set_block = [&](onnx::NodeProto& node, const char* name, const std::string& value) {
    if (!value.empty() && blocked.contains(value)) *node.add_attribute() = autodiff::attr_int(name, block);
  };
  for (int i = 0; i < graph.node_size(); ++i) {
    onnx::NodeProto& node = *graph.mutable_node(i);
    switch (nodes[static_cast<size_t>(i)].kind) {
      case BlockableNode::kConv:
        if (!blocked.contains(node.input(0)) && !blocked.contains(node.output(0))) break;
        node.set_domain(kInternalDomain);
        node.set_op_type("FusedConv");
        set_block(node, "x_channel_block", node.input(0));
        set_block(node, "y_channel_block", node.output(0));
        break;
      case BlockableNode::kPool:
        if (!blocked.contains(node.input(0))) break;
        node.set_domain(kInternalDomain);
        node.set_op_type("MaxPoolChannelBlocked");
        if (node.output_size() > 1) node.mutable_output()->RemoveLast();  // an absent Indices output
        set_block(node, "x_channel_block", node.input(0));
        set_block(node, "y_channel_block", node.output(0));
        break;
      case BlockableNode::kPoolGrad:
        set_block(node, "x_channel_block", node.input(1));
        set_block(node, "dy_channel_block", node.input(0));
        break;
      case BlockableNode::kConvGrad:
        set_block(node, "dy_channel_block", node.input(0));
        set_block(node, "x_channel_block", node.input(1));
        set_block(node, "dx_channel_block", node.output(0));
        break;
      case BlockableNode::kBatchNorm:
        if (!blocked.contains(node.input(0))) break;
        node.set_domain(kInternalDomain);
        node.set_op_type("BatchNormalizationChannelBlocked");  // training mode, the outputs of opset 14+
        drop_attribute(node, "training_mode");
        set_block(node, "channel_block", node.input(0));
        break;
      case BlockableNode::kBatchNormGrad:
        set_block(node, "channel_block", node.input(1));
        break;
      case BlockableNode::kElementwise:
      case BlockableNode::kSumToShape:
      case BlockableNode::kShape:
      case BlockableNode::kNone:
        break;
    }
  }
  // A blocked convolution's Relu moves past the pools reading its output when only those pools and
  // MaxPoolGrads with activation Relu (as X) read it: MaxPool(Relu(c)) = Relu(MaxPool(c)), and
  // MaxPoolGrad's mask X > 0 picks the same maximum in c as in Relu(c) where it passes anything.
  // The convolution then writes c, and no pass over its largest output applies Relu.
  for (int i = 0; i < graph.node_size(); ++i) {
    onnx::NodeProto& conv = *graph.mutable_node(i);
    if (nodes[static_cast<size_t>(i)].kind != BlockableNode::kConv || !blocked.contains(conv.output(0))) continue;
    if (!relu_activation(conv)) continue;
    const std::vector<int>& readers = m.readers(conv.output(0));
    std::vector<int> pools;
    bool movable = true;
    for (int r : readers) {
      const onnx::NodeProto& reader = graph.node(r);
      if (reader.op_type() == "MaxPoolChannelBlocked" && !has_attribute(reader, "activation")) {
        pools.push_back(r);
      } else if (!(reader.op_type() == "MaxPoolGrad" && reader.input(0) != conv.output(0) && relu_activation(reader))) {
        movable = false;
      }
    }
    if (!movable || pools.empty()) continue;
    drop_attribute(conv, "activation");
    for (int r : pools) add_activation(*graph.mutable_node(r));
    if (pools.size() == 1 && pool_2x2_stride_2(graph.node(pools[0]))) pool_into_conv(i, pools[0], readers);
  }
  if (!dropped.empty()) {
    std::vector<bool> drop(static_cast<size_t>(graph.node_size()), false);
    for (int i : dropped) drop[static_cast<size_t>(i)] = true;
    drop_nodes(graph, drop);
  }
  return static_cast<int>(blocked.size());
}

int share_weight_taps(onnx::GraphProto& graph) {
  std::set<std::string> initializers;
  for (const auto& init : graph.initializer()) initializers.insert(init.name());
  // The attributes that decide which taps of W a convolution reads, serialized.
  const auto geometry = [](const onnx::NodeProto& node) {
    std::map<std::string, std::string> out;
    for (const auto& attr : node.attribute()) {
      const std::string& n = attr.name();
      if (n == "kernel_shape" || n == "strides" || n == "pads" || n == "dilations" || n == "auto_pad" || n == "group") {
        out[n] = attr.SerializeAsString();
      }
    }
    return out;
  };
  ValueNames names(graph);
  Matcher m(graph);
  int rewritten = 0;
  for (int i = 0; i < graph.node_size(); ++i) {
    const onnx::NodeProto& conv = graph.node(i);
    const bool plain_conv = is_onnx_op(conv, "Conv") ||
                            (conv.domain() == kInternalDomain && conv.op_type() == "FusedConv" &&
                             !has_attribute(conv, "pool_kernel_shape") && !has_attribute(conv, "weight_taps"));
    if (!plain_conv || conv.output_size() != 1 || conv.input_size() < 2 || conv.input(1).empty() ||
        initializers.contains(conv.input(1))) {
      continue;
    }
    std::vector<int> grads;
    for (int r : m.readers(conv.input(1))) {
      const onnx::NodeProto& grad = graph.node(r);
      if (grad.domain() == kInternalDomain && grad.op_type() == "ConvGrad" && grad.input_size() == 3 &&
          grad.input(1) == conv.input(0) && grad.input(2) == conv.input(1) && geometry(grad) == geometry(conv)) {
        grads.push_back(r);
      }
    }
    if (grads.empty()) continue;
    const std::string taps = names.fresh(conv.input(1) + "/onnxtrain.taps");
    onnx::NodeProto& node = *graph.mutable_node(i);
    node.set_domain(kInternalDomain);
    node.set_op_type("FusedConv");
    *node.add_attribute() = autodiff::attr_int("weight_taps", 1);
    node.add_output(taps);
    for (int r : grads) graph.mutable_node(r)->add_input(taps);
    ++rewritten;
  }
  return rewritten;
}

namespace {

// The node making optimizer input `g` (read by node `reader`), through Identity nodes (the
// Gradient op's outputs) each the sole reader of its input: its index, with `g` set to the value
// it makes and the Identity nodes added to `identities`; -1 where no node makes it or a value on
// the way has another reader.
int gradient_producer(Matcher& m, std::string& g, int reader, std::vector<int>& identities) {
  int producer = m.producer_index(g);
  while (!g.empty() && producer >= 0 && m.sole_reader(g) == reader && is_onnx_op(m.graph().node(producer), "Identity")) {
    identities.push_back(producer);
    reader = producer;
    g = m.graph().node(producer).input(0);
    producer = m.producer_index(g);
  }
  return !g.empty() && producer >= 0 && m.sole_reader(g) == reader ? producer : -1;
}

// An optimized tensor's gradient and the node that makes it (gradient_producer).
struct GradientSource {
  int tensor;                   // t of the optimizer's n tensors: its G is input 2 + n + t
  int producer;                 // the node making G
  std::string value;            // the value it makes (G, or what the Identity nodes pass on as G)
  std::vector<int> identities;  // the Identity nodes between it and the optimizer node
};

// The gradient_producer of each of the n G inputs of optimizer node `i` that has one.
std::vector<GradientSource> gradient_sources(Matcher& m, int i, int n) {
  std::vector<GradientSource> sources;
  for (int t = 0; t < n; ++t) {
    std::string g = m.graph().node(i).input(2 + n + t);
    std::vector<int> identities;
    const int producer = gradient_producer(m, g, i, identities);
    if (producer >= 0) sources.push_back({t, producer, g, std::move(identities)});
  }
  return sources;
}

}  // namespace

int crop_momentum_gradients(onnx::GraphProto& graph) {
  Matcher m(graph);
  ValueNames names(graph);
  int rewritten = 0;
  std::vector<int> dropped;
  for (int i = 0; i < graph.node_size(); ++i) {
    const onnx::NodeProto& opt = graph.node(i);
    if (opt.domain() != kTrainingDomain || opt.op_type() != "Momentum" || has_attribute(opt, "gradient_taps") ||
        opt.input_size() < 5 || (opt.input_size() - 2) % 3 != 0) {
      continue;
    }
    const int n = (opt.input_size() - 2) / 3;
    std::vector<GradientSource> crops;  // the ConvGrads' dW
    for (GradientSource& source : gradient_sources(m, i, n)) {
      const onnx::NodeProto& grad = graph.node(source.producer);
      if (grad.domain() == kInternalDomain && grad.op_type() == "ConvGrad" && grad.output_size() >= 2 &&
          grad.output(1) == source.value && !has_attribute(grad, "dw_taps")) {
        crops.push_back(std::move(source));
      }
    }
    if (crops.empty()) continue;
    onnx::NodeProto& node = *graph.mutable_node(i);
    *node.add_attribute() = autodiff::attr_int("gradient_taps", 1);
    for (int t = 0; t < n; ++t) node.add_input("");
    for (const GradientSource& c : crops) {
      onnx::NodeProto& grad = *graph.mutable_node(c.producer);
      const std::string taps = names.fresh(grad.output(1) + "/onnxtrain.taps");
      *grad.add_attribute() = autodiff::attr_int("dw_taps", 1);
      while (grad.output_size() < 3) grad.add_output("");
      grad.add_output(taps);
      node.set_input(2 + n + c.tensor, grad.output(1));  // dW itself: the Identity nodes go
      node.set_input(2 + 3 * n + c.tensor, taps);
      for (int k : c.identities) dropped.push_back(k);
      ++rewritten;
    }
  }
  if (!dropped.empty()) {
    std::vector<bool> drop(static_cast<size_t>(graph.node_size()), false);
    for (int k : dropped) drop[static_cast<size_t>(k)] = true;
    drop_nodes(graph, drop);
  }
  return rewritten;
}

int fuse_gather_grad_adam(onnx::GraphProto& graph) {
  Matcher m(graph);
  int rewritten = 0;
  std::vector<bool> drop(static_cast<size_t>(graph.node_size()), false);
  for (int i = 0; i < graph.node_size(); ++i) {
    const onnx::NodeProto& opt = graph.node(i);
    const bool adam = opt.domain() == kTrainingDomain && opt.op_type() == "Adam";
    const bool scaled = opt.domain() == kInternalDomain && opt.op_type() == "ScaledAdam";
    if ((!adam && !scaled) || has_attribute(opt, "gradient_rows")) continue;
    const int scalars = scaled ? (int_attribute(opt, "x_scaled") != 0 ? 6 : 5) : 0;
    const int body = opt.input_size() - scalars;
    if (body < 6 || (body - 2) % 4 != 0) continue;
    const int n = (body - 2) / 4;
    std::vector<std::string> inputs(opt.input().begin(), opt.input().end());
    std::vector<std::string> indices(static_cast<size_t>(n));  // "" for a G given whole
    std::vector<int> removed;
    int found = 0;
    for (const GradientSource& source : gradient_sources(m, i, n)) {
      const onnx::NodeProto& grad = graph.node(source.producer);
      // GatherGrad(dY, indices, shape) along axis 0, G its only output.
      if (grad.domain() != kInternalDomain || grad.op_type() != "GatherGrad" || grad.input_size() != 3 ||
          grad.output_size() != 1 || grad.output(0) != source.value || int_attribute(grad, "axis") != 0 ||
          grad.input(0).empty() || grad.input(1).empty()) {
        continue;
      }
      inputs[static_cast<size_t>(2 + n + source.tensor)] = grad.input(0);  // G: GatherGrad's dY
      indices[static_cast<size_t>(source.tensor)] = grad.input(1);
      removed.push_back(source.producer);
      removed.insert(removed.end(), source.identities.begin(), source.identities.end());
      ++found;
    }
    if (found == 0) continue;
    inputs.insert(inputs.begin() + body, indices.begin(), indices.end());
    onnx::NodeProto& node = *graph.mutable_node(i);
    node.clear_input();
    for (const auto& in : inputs) node.add_input(in);
    *node.add_attribute() = autodiff::attr_int("gradient_rows", 1);
    for (int r : removed) drop[static_cast<size_t>(r)] = true;
    rewritten += found;
  }
  if (rewritten > 0) drop_nodes(graph, drop);
  return rewritten;
}

int fuse_layer_norm_bias_grad(onnx::GraphProto& graph) {
  struct Match {
    int grad, through, sum;  // LayerNormalizationGrad, SumToShape(dX, A), SumToShape(that, B)
  };
  std::vector<Match> matches;
  {
    Matcher m(graph);
    // A bias's shape: Shape of a value the graph states to be of rank 1 (a parameter), or an int64
    // constant [n] or [1, ..., 1, n].
    const auto bias_shape = [&](const std::string& name) {
      const onnx::NodeProto* shape = m.producer(name);
      if (shape && is_onnx_op(*shape, "Shape") && shape->input_size() == 1 && shape->attribute_size() == 0) {
        const auto type = m.declared_type(shape->input(0));
        return type && type->second == 1;
      }
      const auto dims = small_int_constant(graph, m, name);
      return dims && !dims->empty() && std::all_of(dims->begin(), dims->end() - 1, [](int64_t d) { return d == 1; });
    };
    for (int i = 0; i < graph.node_size(); ++i) {
      const onnx::NodeProto& grad = graph.node(i);
      if (grad.domain() != kInternalDomain || grad.op_type() != "LayerNormalizationGrad" || grad.input_size() < 2 ||
          grad.output_size() < 1 || grad.output_size() > 3 || grad.output(0).empty() || int_attribute(grad, "dx_sum") != 0) {
        continue;
      }
      std::optional<Match> found;
      for (int t : m.readers(grad.output(0))) {
        if (found || !is_sum_to_shape(graph.node(t)) || graph.node(t).input(0) != grad.output(0)) continue;
        for (int s : m.readers(graph.node(t).output(0))) {
          const onnx::NodeProto& sum = graph.node(s);
          if (!found && is_sum_to_shape(sum) && sum.input(0) == graph.node(t).output(0) && bias_shape(sum.input(1))) {
            found = Match{i, t, s};
          }
        }
      }
      if (found) matches.push_back(*found);
    }
  }
  if (matches.empty()) return 0;
  std::vector<bool> drop(static_cast<size_t>(graph.node_size()), false);
  for (const Match& mt : matches) {
    const std::string through_shape = graph.node(mt.through).input(1);
    const onnx::NodeProto& sum = graph.node(mt.sum);
    onnx::NodeProto& grad = *graph.mutable_node(mt.grad);
    std::vector<std::string> inputs(grad.input().begin(), grad.input().end());
    inputs.resize(std::max<size_t>(inputs.size(), 5));
    inputs.insert(inputs.begin() + 5, {through_shape, sum.input(1)});  // A, B, then any further terms of dY
    grad.clear_input();
    for (const auto& in : inputs) grad.add_input(in);
    while (grad.output_size() < 3) grad.add_output("");
    grad.add_output(sum.output(0));
    *grad.add_attribute() = autodiff::attr_int("dx_sum", 1);
    drop[static_cast<size_t>(mt.sum)] = true;
  }
  drop_nodes(graph, drop);
  return static_cast<int>(matches.size());
}

}  // namespace onnxtrain::runtime
