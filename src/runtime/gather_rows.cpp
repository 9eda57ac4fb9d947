// runtime/fusion.h gather_before_rowwise_ops: a Gather of a few positions moved before the ops
// that compute each position from the same position of their inputs.
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "autodiff/builder.h"
#include "autodiff/gradient.h"
#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "onnxtrain/tensor.h"
#include "runtime/fusion.h"
#include "runtime/graph_match.h"

namespace onnxtrain::runtime {

using autodiff::kInternalDomain;
using namespace graph_match;  // NOLINT(google-build-using-namespace): the rewrites' shared readers

namespace {

// Dim d of a value as shape inference states it: "#128" for a value, "$name" for a dim_param,
// "" when it states neither.
using StatedShape = std::vector<std::string>;

std::optional<StatedShape> stated_shape(const std::map<std::string, onnx::TypeProto>& types, const std::string& name) {
  const auto t = types.find(name);
  if (t == types.end() || !t->second.has_tensor_type() || !t->second.tensor_type().has_shape()) return std::nullopt;
  StatedShape shape;
  for (const auto& d : t->second.tensor_type().shape().dim()) {
    if (d.has_dim_value()) {
      shape.push_back("#" + std::to_string(d.dim_value()));
    } else {
      shape.push_back(d.dim_param().empty() ? "" : "$" + d.dim_param());
    }
  }
  return shape;
}

bool same_dim(const std::string& a, const std::string& b) { return !a.empty() && a == b; }

const std::string& dim_at(const StatedShape& shape, int64_t d) { return shape[static_cast<size_t>(d)]; }

// Dims 0 to axis - 1 of x and y are the same (values, or one dim name of one shape inference).
bool same_leading_dims(const StatedShape& x, const StatedShape& y, int64_t axis) {
  for (int64_t d = 0; d < axis; ++d) {
    if (!same_dim(dim_at(x, d), dim_at(y, d))) return false;
  }
  return true;
}

std::optional<int64_t> dim_value(const std::string& d) {
  if (d.size() < 2 || d[0] != '#') return std::nullopt;
  return std::stoll(d.substr(1));
}

// The axis of `input` (of the node's inputs, `in` its stated shape) that gives the output's
// `axis` under broadcasting (right-aligned), -1 where the input is broadcast along it (absent or
// of size 1), nullopt where shape inference does not tell.
std::optional<int64_t> broadcast_axis(const StatedShape& in, const StatedShape& out, int64_t axis) {
  const int64_t b = axis - static_cast<int64_t>(out.size() - in.size());
  if (b < 0) return -1;
  const std::string& d = dim_at(in, b);
  if (d == "#1") return -1;
  if (same_dim(d, dim_at(out, axis))) return b;
  return std::nullopt;
}

// For a node whose output 0 is wanted only at some positions along `axis` (the rows a Gather
// with constant indices reads): the axis along which each input must then give the same
// positions, -1 for an input read whole (a weight, a broadcast operand, a Reshape's shape);
// nullopt where the node's output at a position depends on other positions of that axis, or
// where the node is not one of these:
//   unary element-wise ops, Gelu (ai.onnx and ai.onnxtrain);
//   Add, Sub, Mul, Div, Pow with broadcasting (an input of size 1 along the axis is read whole);
//   LayerNormalization, Softmax, LogSoftmax normalizing over later axes than `axis`;
//   MatMul along A's rows (B read whole) or a batch axis (each operand along it unless it
//   broadcasts there);
//   Transpose (the axis it moves);
//   Reshape keeping each position along the axis one slab of the same elements;
//   ai.onnxtrain.Attention (fuse_attention's) with BSHD input and output layouts along the
//   queries (axis 1), and ai.onnx Attention along its queries without a causal mask or a
//   window: the queries' positions; keys and values whole, the mask along its query axis unless
//   it broadcasts there.
std::optional<std::vector<int64_t>> rowwise_inputs(const onnx::NodeProto& node, int64_t axis,
                                                   const std::map<std::string, onnx::TypeProto>& types) {
  static const std::set<std::string> kUnary = {"Identity", "Cast", "Relu",  "LeakyRelu", "Tanh", "Sigmoid", "Erf",
                                               "Sqrt",     "Exp",  "Log",   "Neg",       "Abs",  "Reciprocal",
                                               "Elu",      "Softplus", "Gelu", "HardSigmoid", "HardSwish"};
  static const std::set<std::string> kBinary = {"Add", "Sub", "Mul", "Div", "Pow"};
  const int inputs = node.input_size();
  const bool optional_inputs = node.op_type() == "Attention";  // empty names: omitted optional inputs
  for (const auto& in : node.input()) {
    if (in.empty() && !optional_inputs) return std::nullopt;
  }
  const auto shape = [&](int i) { return stated_shape(types, node.input(i)); };
  const std::optional<StatedShape> out = node.output_size() > 0 ? stated_shape(types, node.output(0)) : std::nullopt;
  if (!out || axis < 0 || axis >= static_cast<int64_t>(out->size())) return std::nullopt;
  const auto rank = static_cast<int64_t>(out->size());
  const bool onnx_domain = node.domain().empty() || node.domain() == "ai.onnx";
  if ((onnx_domain && kUnary.contains(node.op_type()) && inputs == 1) ||
      (node.domain() == kInternalDomain && node.op_type() == "Gelu" && inputs == 1)) {
    const auto x = shape(0);
    if (!x || static_cast<int64_t>(x->size()) != rank) return std::nullopt;
    return std::vector<int64_t>{axis};
  }
  if (onnx_domain && kBinary.contains(node.op_type()) && inputs == 2) {
    std::vector<int64_t> axes;
    for (int i = 0; i < 2; ++i) {
      const auto x = shape(i);
      if (!x || x->size() > out->size()) return std::nullopt;
      const std::optional<int64_t> b = broadcast_axis(*x, *out, axis);
      if (!b) return std::nullopt;
      axes.push_back(*b);
    }
    return axes;
  }
  const auto normalized_axis = [&](int64_t fallback) {
    const onnx::AttributeProto* a = find_attribute(node, "axis");
    const int64_t v = a ? a->i() : fallback;
    return v < 0 ? v + rank : v;
  };
  if (onnx_domain && node.op_type() == "LayerNormalization" && inputs >= 2 && inputs <= 3) {
    if (normalized_axis(-1) <= axis) return std::nullopt;
    std::vector<int64_t> axes(static_cast<size_t>(inputs), -1);
    axes[0] = axis;
    return axes;
  }
  if (onnx_domain && (node.op_type() == "Softmax" || node.op_type() == "LogSoftmax") && inputs == 1) {
    const int64_t a = normalized_axis(-1);
    if (a == axis || a < 0 || a >= rank) return std::nullopt;
    return std::vector<int64_t>{axis};
  }
  if (onnx_domain && node.op_type() == "MatMul" && inputs == 2) {
    const auto a = shape(0), b = shape(1);
    if (!a || !b || a->size() < 2 || b->size() < 2 || static_cast<int64_t>(std::max(a->size(), b->size())) != rank ||
        axis == rank - 1) {
      return std::nullopt;
    }
    if (axis == rank - 2) return std::vector<int64_t>{static_cast<int64_t>(a->size()) - 2, -1};  // rows of A
    // A batch axis: each operand along it unless it broadcasts there.
    const StatedShape out_batch(out->begin(), out->end() - 2);
    std::vector<int64_t> axes;
    for (const auto* x : {&*a, &*b}) {
      const std::optional<int64_t> k = broadcast_axis(StatedShape(x->begin(), x->end() - 2), out_batch, axis);
      if (!k) return std::nullopt;
      axes.push_back(*k);
    }
    return axes;
  }
  if (onnx_domain && node.op_type() == "Transpose" && inputs == 1) {
    const std::optional<std::vector<int64_t>> perm = stated_perm(node);
    if (!perm || static_cast<int64_t>(perm->size()) != rank) return std::nullopt;
    return std::vector<int64_t>{(*perm)[static_cast<size_t>(axis)]};
  }
  if (onnx_domain && node.op_type() == "Reshape" && inputs == 2) {
    // Each position along the axis must stay one slab of the same elements: the same size along
    // it, and the same number of elements after it (the dims before it then hold as many).
    const auto x = shape(0);
    if (!x || static_cast<int64_t>(x->size()) <= axis || !same_dim(dim_at(*x, axis), dim_at(*out, axis))) {
      return std::nullopt;
    }
    const bool leading_same = same_leading_dims(*x, *out, axis);
    const auto tail_size = [axis](const StatedShape& s) -> std::optional<int64_t> {
      int64_t n = 1;
      for (size_t d = static_cast<size_t>(axis) + 1; d < s.size(); ++d) {
        const std::optional<int64_t> v = dim_value(s[d]);
        if (!v) return std::nullopt;
        n *= *v;
      }
      return n;
    };
    const std::optional<int64_t> x_tail = tail_size(*x), y_tail = tail_size(*out);
    if (!leading_same && (!x_tail || x_tail != y_tail)) return std::nullopt;
    return std::vector<int64_t>{axis, -1};
  }
  if (node.domain() == kInternalDomain && node.op_type() == "Attention" && inputs >= 3 && inputs <= 4 && axis == 1 &&
      node.output_size() == 1 && rank == 4) {
    const onnx::AttributeProto* in_layout = find_attribute(node, "input_layout");
    const onnx::AttributeProto* out_layout = find_attribute(node, "output_layout");
    const bool bshd = in_layout && in_layout->s() == "BSHD" && out_layout && out_layout->s() == "BSHD";
    if (!bshd || int_attribute(node, "is_causal") != 0) return std::nullopt;
    std::vector<int64_t> axes = {1, -1, -1};
    if (inputs == 4) {  // the mask, added to the scores [batch, heads, queries, keys] by broadcasting
      const auto mask = shape(3);
      if (!mask || mask->size() > 4) return std::nullopt;
      const StatedShape scores = {"", "", (*out)[1], ""};
      const std::optional<int64_t> b = broadcast_axis(*mask, scores, 2);
      if (!b) return std::nullopt;
      axes.push_back(*b);
    }
    return axes;
  }
  if (onnx_domain && node.op_type() == "Attention" && inputs >= 3 && (rank == 3 || rank == 4)) {
    // ai.onnx Attention-23/24 (4-D [batch, heads, queries, head size] or 3-D [batch, queries,
    // heads * head size]) along the queries: each query's row of Y reads Q's row and every key;
    // a causal mask or a sliding window depends on the query's position, so not those.
    static const std::set<std::string> kPositionFree = {"scale", "softcap", "qk_matmul_output_mode", "q_num_heads",
                                                        "kv_num_heads", "softmax_precision", "is_causal"};
    for (const auto& a : node.attribute()) {
      if (!kPositionFree.contains(a.name()) || (a.name() == "is_causal" && a.i() != 0)) return std::nullopt;
    }
    const int64_t queries = rank - 2;
    if (axis != queries) return std::nullopt;
    std::vector<int64_t> axes(static_cast<size_t>(inputs), -1);  // K, V, past keys and values, nonpad_kv_seqlen whole
    axes[0] = queries;
    if (inputs > 3 && !node.input(3).empty()) {  // attn_mask, broadcast to [batch, heads, queries, keys]
      const auto mask = shape(3);
      if (!mask || mask->size() > 4) return std::nullopt;
      const StatedShape scores = {"", "", (*out)[static_cast<size_t>(queries)], ""};
      const std::optional<int64_t> b = broadcast_axis(*mask, scores, 2);
      if (!b) return std::nullopt;
      axes[3] = *b;
    }
    return axes;
  }
  return std::nullopt;
}

// One Gather (or Slice) of gather_before_rowwise_ops: the node, its data, axis and indices.
struct RowGather {
  int node = -1;
  std::string data;
  int64_t axis = 0;
  bool scalar = false;           // a Gather by a scalar index (its output drops the axis)
  std::vector<int64_t> indices;  // the positions read, in order
  // A Slice of one axis with step 1: its bounds, made indices once the axis's size is known.
  std::optional<OneAxisSlice> slice;
  int64_t count() const { return static_cast<int64_t>(indices.size()); }
};

// The values of an int64 Tensor.
std::vector<int64_t> values_of(const Tensor& t) { return {t.data<int64_t>(), t.data<int64_t>() + t.numel()}; }

// A 1-D int64 Tensor of `values`.
Tensor int64_list(const std::vector<int64_t>& values) {
  return Tensor::from_vector<int64_t>(Shape{static_cast<int64_t>(values.size())}, values);
}

// A Slice of data along one axis with step 1 and constant starts and ends (x[:, :1], or x[:, 0]
// written as Slice then Squeeze), as a RowGather whose indices wait for the axis's size.
std::optional<RowGather> slice_of_one_axis(const onnx::GraphProto& graph, const Matcher& m, int i) {
  const std::optional<OneAxisSlice> slice = one_axis_slice(graph, m, graph.node(i));
  if (!slice) return std::nullopt;
  RowGather g;
  g.node = i;
  g.data = slice->data;
  g.axis = slice->axis;
  g.slice = slice;
  return g;
}

// The nodes that can compute only the rows `g` reads (rowwise_inputs), each with the axis of
// each input, and the values they write with the axis of each; empty where none can.
struct RowRegion {
  std::map<int, std::vector<int64_t>> nodes;
  std::unordered_map<std::string, int64_t> values;
  std::vector<int> shapes;  // Shape nodes reading a value of the region
};

RowRegion row_region(const onnx::GraphProto& graph, const Matcher& m, const std::unordered_set<std::string>& named,
                     const std::map<std::string, onnx::TypeProto>& types, const RowGather& g) {
  RowRegion region;
  std::unordered_map<std::string, int64_t> wanted = {{g.data, g.axis}};  // -2: wanted along two axes
  for (int i = g.node - 1; i >= 0; --i) {
    const onnx::NodeProto& node = graph.node(i);
    if (node.output_size() == 0 || node.output(0).empty()) continue;
    const std::string& y = node.output(0);
    const auto w = wanted.find(y);
    if (w == wanted.end() || w->second < 0 || m.pinned(y) || named.contains(y)) continue;
    bool extra_outputs_unused = true;  // LayerNormalization's Mean and InvStdDev
    for (int o = 1; o < node.output_size(); ++o) {
      const std::string& out = node.output(o);
      const bool unused = out.empty() || (m.readers(out).empty() && !m.pinned(out) && !named.contains(out));
      extra_outputs_unused = extra_outputs_unused && unused;
    }
    if (!extra_outputs_unused) continue;
    const int64_t axis = w->second;
    const std::optional<StatedShape> y_shape = stated_shape(types, y);
    const bool static_axis = y_shape && axis < static_cast<int64_t>(y_shape->size()) && dim_value(dim_at(*y_shape, axis));
    std::vector<int> shapes;
    bool all_readers = true;
    // Every reader takes the rows: the Gather, a node of the region reading y only along this
    // axis (not as a whole operand too, as attention's keys when they are its queries), or a Shape.
    const auto reads_rows = [&](int r) {
      const auto it = region.nodes.find(r);
      if (it == region.nodes.end()) return false;
      const onnx::NodeProto& reader = graph.node(r);
      for (int k = 0; k < reader.input_size(); ++k) {
        if (reader.input(k) == y && it->second[static_cast<size_t>(k)] != axis) return false;
      }
      return true;
    };
    for (int r : m.readers(y)) {
      if (r == g.node || reads_rows(r)) continue;
      if (is_onnx_op(graph.node(r), "Shape") && static_axis) {
        shapes.push_back(r);
        continue;
      }
      all_readers = false;
    }
    if (!all_readers) continue;
    const std::optional<std::vector<int64_t>> axes = rowwise_inputs(node, axis, types);
    if (!axes) continue;
    region.nodes[i] = *axes;
    region.values[y] = axis;
    region.shapes.insert(region.shapes.end(), shapes.begin(), shapes.end());
    for (int k = 0; k < node.input_size(); ++k) {
      const int64_t a = (*axes)[static_cast<size_t>(k)];
      if (a < 0) continue;
      const auto [it, inserted] = wanted.emplace(node.input(k), a);
      if (!inserted && it->second != a) it->second = -2;
    }
  }
  return region;
}
}  // namespace

int gather_before_rowwise_ops(onnx::GraphProto& graph, const std::unordered_map<std::string, int>& opsets) {
  const auto onnx_opset = opsets.find("");
  if (onnx_opset == opsets.end() || onnx_opset->second < 13) return 0;  // Slice and Reshape with shape inputs
  int rewritten = 0;
  for (bool again = true; again;) {
    again = false;
    Matcher m(graph);
    const std::unordered_set<std::string> named = attribute_named_values(graph);
    std::vector<RowGather> candidates;
    for (int i = 0; i < graph.node_size(); ++i) {
      const onnx::NodeProto& node = graph.node(i);
      if (node.input_size() == 0) continue;
      const onnx::NodeProto* data = m.producer(node.input(0));
      if (!data || is_onnx_op(*data, "Shape")) continue;  // a shape's dims: nothing to save
      if (std::optional<RowGather> g = slice_of_one_axis(graph, m, i)) {
        candidates.push_back(std::move(*g));
        continue;
      }
      if (!is_onnx_op(node, "Gather") || node.input_size() != 2 || node.output_size() != 1) continue;
      const std::optional<Tensor> indices = int64_constant(graph, m, node.input(1));
      if (!indices || indices->rank() > 1) continue;
      RowGather g;
      g.node = i;
      g.data = node.input(0);
      g.axis = int_attribute(node, "axis");
      g.scalar = indices->rank() == 0;
      g.indices = values_of(*indices);
      candidates.push_back(std::move(g));
    }
    if (candidates.empty()) break;
    const std::map<std::string, onnx::TypeProto> types = inferred_types(graph, opsets);
    for (RowGather& g : candidates) {
      const std::optional<StatedShape> data = stated_shape(types, g.data);
      const auto type = types.find(g.data);
      // Only floating-point data: arithmetic worth moving.
      if (!data || !is_floating(static_cast<DataType>(type->second.tensor_type().elem_type()))) continue;
      const auto dim = static_dim(types, g.data, g.axis);
      if (!dim) continue;
      g.axis = dim->second;
      const std::optional<int64_t> size = dim->first;
      if (g.slice) {
        const auto [start, end] = g.slice->range(*size);
        for (int64_t k = start; k < end; ++k) g.indices.push_back(k);
      }
      // Only where it saves work: at most half the positions.
      if (g.count() < 1 || 2 * g.count() > *size) continue;
      // Indices out of range stay the Gather's own error.
      if (std::any_of(g.indices.begin(), g.indices.end(), [&](int64_t k) { return k < -*size || k >= *size; })) continue;
      const RowRegion region = row_region(graph, m, named, types, g);
      // Only where some arithmetic moves after the Gather (a lone Transpose before a Gather is
      // gather_before_transpose's).
      const bool moves_arithmetic = std::any_of(region.nodes.begin(), region.nodes.end(), [&](const auto& entry) {
        const onnx::NodeProto& n = graph.node(entry.first);
        return !is_onnx_op(n, "Transpose") && !is_onnx_op(n, "Reshape") && !is_onnx_op(n, "Identity");
      });
      if (!moves_arithmetic) continue;
      // The rewrite: each node of the region in place, on the rows; a Gather of the same
      // indices (1-D) before it for each input it reads along an axis that the region does not
      // make; a Reshape's shape gets 0 along the axis (the rows' count, copied); Shape nodes
      // reading a region value give its full shape; the Gather itself picks from the rows.
      ValueNames names(graph);
      std::map<int, std::vector<onnx::NodeProto>> replace;
      std::set<int> dropped;
      std::unordered_map<std::string, std::string> rows;  // region value -> the value of its rows
      for (const auto& [value, axis] : region.values) rows[value] = names.fresh(value + ".rows");
      const std::string indices = names.fresh(g.data + ".row_indices");
      bool indices_made = false;
      std::map<std::pair<std::string, int64_t>, std::string> gathered;
      for (const auto& [i, axes] : region.nodes) {
        const onnx::NodeProto& node = graph.node(i);
        std::vector<onnx::NodeProto>& out = replace[i];
        onnx::NodeProto copy = node;
        for (int k = 0; k < node.input_size(); ++k) {
          const int64_t a = axes[static_cast<size_t>(k)];
          const std::string& in = node.input(k);
          if (a < 0) continue;
          if (const auto r = region.values.find(in); r != region.values.end() && r->second == a) {
            copy.set_input(k, rows.at(in));
            continue;
          }
          auto [it, inserted] = gathered.try_emplace({in, a}, "");
          if (inserted) {
            if (!indices_made) {
              out.push_back(constant_node(indices, int64_list(g.indices)));
              indices_made = true;
            }
            it->second = names.fresh(in + ".rows");
            onnx::NodeProto gather = node_of("Gather", {in, indices}, it->second);
            *gather.add_attribute() = autodiff::attr_int("axis", a);
            out.push_back(std::move(gather));
          }
          copy.set_input(k, it->second);
        }
        if (is_onnx_op(node, "Reshape")) {
          // Where the dims up to the axis stay (and 0 copies an input dim: allowzero 0), the shape
          // becomes 0 for each of them, then its entries after the axis: shape inference then
          // carries the input's dims over. Else the shape with the rows' count along the axis
          // (shape * [1, .., 0, .., 1] + [0, .., count, .., 0]).
          const int64_t a = axes[0];
          const StatedShape x_shape = *stated_shape(types, node.input(0)), y_shape = *stated_shape(types, node.output(0));
          const bool leading_same = int_attribute(node, "allowzero") == 0 && same_leading_dims(x_shape, y_shape, a);
          const std::string shape = names.fresh(node.input(1) + ".rows");
          if (leading_same) {
            const std::string zeros = names.fresh(node.input(1) + ".kept"), starts = names.fresh(node.input(1) + ".starts"),
                              ends = names.fresh(node.input(1) + ".ends"), tail = names.fresh(node.input(1) + ".tail");
            out.push_back(constant_node(zeros, int64_list(std::vector<int64_t>(static_cast<size_t>(a + 1), 0))));
            out.push_back(constant_node(starts, int64_list({a + 1})));
            out.push_back(constant_node(ends, int64_list({std::numeric_limits<int64_t>::max()})));
            out.push_back(node_of("Slice", {node.input(1), starts, ends}, tail));
            onnx::NodeProto concat = node_of("Concat", {zeros, tail}, shape);
            *concat.add_attribute() = autodiff::attr_int("axis", 0);
            out.push_back(std::move(concat));
          } else {
            std::vector<int64_t> keep(y_shape.size(), 1), count(y_shape.size(), 0);
            keep[static_cast<size_t>(a)] = 0;
            count[static_cast<size_t>(a)] = g.count();
            const std::string mask = names.fresh(node.input(1) + ".mask"), masked = names.fresh(node.input(1) + ".masked"),
                              counts = names.fresh(node.input(1) + ".count");
            out.push_back(constant_node(mask, int64_list(keep)));
            out.push_back(constant_node(counts, int64_list(count)));
            out.push_back(node_of("Mul", {node.input(1), mask}, masked));
            out.push_back(node_of("Add", {masked, counts}, shape));
          }
          copy.set_input(1, shape);
        }
        copy.set_output(0, rows.at(node.output(0)));
        for (int o = 1; o < copy.output_size(); ++o) copy.set_output(o, "");  // unread (row_region)
        out.push_back(std::move(copy));
      }
      for (int s : region.shapes) {  // Shape(v) = Shape(rows of v) with the axis's full size
        const onnx::NodeProto& node = graph.node(s);
        const std::string& v = node.input(0);
        const int64_t a = region.values.at(v);
        const StatedShape full = *stated_shape(types, v);
        const auto rank_v = static_cast<int64_t>(full.size());
        const onnx::AttributeProto* start_attr = find_attribute(node, "start");
        const onnx::AttributeProto* end_attr = find_attribute(node, "end");
        const auto clamp = [&](int64_t x) { return std::clamp(x < 0 ? x + rank_v : x, int64_t{0}, rank_v); };
        const int64_t start = start_attr ? clamp(start_attr->i()) : 0, end = end_attr ? clamp(end_attr->i()) : rank_v;
        std::vector<onnx::NodeProto>& out = replace[s];
        onnx::NodeProto shape = node;
        shape.set_input(0, rows.at(v));
        if (a < start || a >= end) {  // the axis is not in the slice of the shape
          out.push_back(std::move(shape));
          continue;
        }
        const std::string of_rows = names.fresh(node.output(0) + ".rows"), mask = names.fresh(node.output(0) + ".mask"),
                          masked = names.fresh(node.output(0) + ".masked"), size = names.fresh(node.output(0) + ".size");
        shape.set_output(0, of_rows);
        std::vector<int64_t> ones(static_cast<size_t>(end - start), 1), sizes(static_cast<size_t>(end - start), 0);
        ones[static_cast<size_t>(a - start)] = 0;
        sizes[static_cast<size_t>(a - start)] = *dim_value(full[static_cast<size_t>(a)]);
        out.push_back(std::move(shape));
        out.push_back(constant_node(mask, int64_list(ones)));
        out.push_back(constant_node(size, int64_list(sizes)));
        out.push_back(node_of("Mul", {of_rows, mask}, masked));
        out.push_back(node_of("Add", {masked, size}, node.output(0)));
      }
      {  // the Gather: position 0 of a scalar's rows, or all the rows (the Slice's too)
        const onnx::NodeProto& node = graph.node(g.node);
        std::vector<onnx::NodeProto>& out = replace[g.node];
        if (g.scalar) {
          const std::string first = names.fresh(node.input(1) + ".first");
          out.push_back(constant_node(first, Tensor::from_vector<int64_t>(Shape{}, {0})));
          onnx::NodeProto gather = node;
          gather.set_input(0, rows.at(g.data));
          gather.set_input(1, first);
          out.push_back(std::move(gather));
        } else {
          onnx::NodeProto identity = node_of("Identity", {rows.at(g.data)}, node.output(0));
          identity.set_name(node.name());
          out.push_back(std::move(identity));
        }
      }
      // Types of the rows that shape inference cannot give (internal ops have no schema), for
      // the Gradient expansion; the standard ops' it infers again (with dim names of its own,
      // which fuse_attention compares).
      std::unordered_set<std::string> gone;
      for (const auto& [i, axes] : region.nodes) {
        const onnx::NodeProto& node = graph.node(i);
        const std::string& value = node.output(0);
        gone.insert(value);
        const auto t = types.find(value);
        if (t == types.end() || node.domain().empty() || node.domain() == "ai.onnx") continue;
        const int64_t axis = region.values.at(value);
        onnx::ValueInfoProto* info = graph.add_value_info();
        info->set_name(rows.at(value));
        *info->mutable_type() = t->second;
        auto* dims = info->mutable_type()->mutable_tensor_type()->mutable_shape();
        if (axis < dims->dim_size()) dims->mutable_dim(static_cast<int>(axis))->set_dim_value(g.count());
      }
      auto* infos = graph.mutable_value_info();
      for (int k = infos->size() - 1; k >= 0; --k) {
        if (gone.contains(infos->Get(k).name())) infos->DeleteSubrange(k, 1);
      }
      rebuild_nodes(graph, replace, dropped);
      ++rewritten;
      again = true;
      break;  // the graph changed: index it again
    }
  }
  return rewritten;
}

}  // namespace onnxtrain::runtime
