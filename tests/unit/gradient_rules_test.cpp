// Finite-difference checks of every gradient rule (src/autodiff/rules*.cpp), in float64.
//
// For each case: a model runs the op on its inputs, reduces every floating output to
// loss = sum_k sum(out_k * R_k) with fixed random R_k, and a Gradient node (xs = the case's
// differentiable inputs, y = loss) gives the analytic gradients. Each is compared with the
// central difference (loss(x + eps) - loss(x - eps)) / (2 eps), eps = 1e-6, evaluated by the
// same model without the Gradient node. Inputs avoid kinks (|x| >= 0.2 for ReLU-like ops,
// distinct values for Max/Min) so the difference quotient is well defined.
// RuleTable.EveryRuleHasAFiniteDifferenceCase checks that the cases cover the table.
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <onnx/defs/schema.h>

#include "autodiff/builder.h"
#include "ops/registry.h"
#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "onnxtrain/session.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::attr;

struct Input {
  Tensor value;       // undefined: an omitted optional input
  bool differentiable = false;
};

struct Case {
  std::string op;
  std::vector<onnx::AttributeProto> attrs;
  std::vector<Input> inputs;
  int outputs = 1;
  int opset = 17;
  std::string domain;
  std::string label;  // distinguishes cases of one op
  // How many of `inputs` the node reads as inputs (-1: all); the rest are graph inputs that
  // only its subgraph attributes read (an If's branches).
  int node_inputs = -1;
  // The ai.onnx opset of a case of another domain (its backward ops may emit ai.onnx ops).
  int onnx_opset = 17;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.op << (c.label.empty() ? "" : " (" + c.label + ")"); }

std::mt19937_64& rng() {
  static std::mt19937_64 engine(20261122);
  return engine;
}

// Uniform in [lo, hi].
Tensor uniform(const Shape& shape, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (double& x : v) x = dist(rng());
  return Tensor::from_vector<double>(shape, v);
}
// |x| in [0.2, 1] with a random sign: away from the kinks at 0.
Tensor signed_away_from_zero(const Shape& shape) {
  Tensor t = uniform(shape, 0.2, 1.0);
  std::bernoulli_distribution sign(0.5);
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = sign(rng()) ? p[i] : -p[i];
  return t;
}
Input x(const Shape& shape) { return {signed_away_from_zero(shape), true}; }
Input positive(const Shape& shape) { return {uniform(shape, 0.5, 2.0), true}; }
Input in_range(const Shape& shape, double lo, double hi) { return {uniform(shape, lo, hi), true}; }
Input fixed(Tensor t) { return {std::move(t), false}; }
Input omitted() { return {Tensor(), false}; }
Tensor i64(const Shape& shape, const std::vector<int64_t>& v) { return Tensor::from_vector<int64_t>(shape, v); }
Tensor i64(const std::vector<int64_t>& v) { return i64(Shape{static_cast<int64_t>(v.size())}, v); }
// Distinct values: a shuffled ramp, offset differently on each call, so Max/Min/TopK see no
// ties within or across inputs.
Input distinct(const Shape& shape) {
  static int calls = 0;
  const double offset = 0.0131 * ++calls;
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = -1.0 + offset + 0.37 * static_cast<double>(i);
  std::shuffle(v.begin(), v.end(), rng());
  return {Tensor::from_vector<double>(shape, v), true};
}

onnx::ValueInfoProto value_info(const std::string& name, const Tensor& t) {
  onnx::ValueInfoProto v;
  v.set_name(name);
  auto* type = v.mutable_type()->mutable_tensor_type();
  type->set_elem_type(static_cast<int32_t>(t.dtype()));
  for (int64_t d : t.shape()) type->mutable_shape()->add_dim()->set_dim_value(d);
  return v;
}

// The case's model; with `gradient`, a Gradient node and its outputs grad_<i> too.
onnx::ModelProto make_model(const Case& c, const std::vector<Tensor>& weights, bool gradient) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  auto add_opset = [&](const std::string& domain, int version) {
    auto* o = model.add_opset_import();
    o->set_domain(domain);
    o->set_version(version);
  };
  add_opset("", c.domain.empty() ? c.opset : c.onnx_opset);
  add_opset("ai.onnx.preview.training", 1);
  if (!c.domain.empty()) add_opset(c.domain, 1);
  auto* g = model.mutable_graph();
  g->set_name("case");
  auto* node = g->add_node();
  node->set_op_type(c.op);
  node->set_domain(c.domain);
  node->set_name("node");
  for (const auto& a : c.attrs) *node->add_attribute() = a;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const bool read_by_node = c.node_inputs < 0 || static_cast<int>(i) < c.node_inputs;
    if (!c.inputs[i].value.defined()) {
      if (read_by_node) node->add_input("");
      continue;
    }
    const std::string name = "in" + std::to_string(i);
    if (read_by_node) node->add_input(name);
    *g->add_input() = value_info(name, c.inputs[i].value);
  }
  for (int k = 0; k < c.outputs; ++k) node->add_output("out" + std::to_string(k));
  // loss = sum_k ReduceSum(out_k * R_k)
  std::vector<std::string> terms;
  for (size_t k = 0; k < weights.size(); ++k) {
    if (!weights[k].defined()) continue;
    const std::string r = "R" + std::to_string(k), t = "t" + std::to_string(k), s = "s" + std::to_string(k);
    onnx::TensorProto init;
    io::tensor_to_proto(weights[k], r, init);
    *g->add_initializer() = init;
    auto* m = g->add_node();
    m->set_op_type("Mul");
    m->add_input("out" + std::to_string(k));
    m->add_input(r);
    m->add_output(t);
    auto* red = g->add_node();
    red->set_op_type("ReduceSum");
    red->add_input(t);
    red->add_output(s);
    *red->add_attribute() = attr("keepdims", int64_t{0});
    terms.push_back(s);
  }
  auto* sum = g->add_node();
  sum->set_op_type("Sum");
  for (const auto& t : terms) sum->add_input(t);
  sum->add_output("loss");
  g->add_output()->set_name("loss");
  if (gradient) {
    auto* grad = g->add_node();
    grad->set_op_type("Gradient");
    grad->set_domain("ai.onnx.preview.training");
    grad->set_name("gradient");
    onnx::AttributeProto xs;
    xs.set_name("xs");
    xs.set_type(onnx::AttributeProto::STRINGS);
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      if (!c.inputs[i].differentiable) continue;
      const std::string name = "in" + std::to_string(i);
      xs.add_strings(name);
      grad->add_input(name);
      grad->add_output("grad_" + name);
      g->add_output()->set_name("grad_" + name);
    }
    *grad->add_attribute() = xs;
    *grad->add_attribute() = attr("y", std::string("loss"));
  }
  return model;
}

runtime::NamedTensors feeds_of(const Case& c) {
  runtime::NamedTensors feeds;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (c.inputs[i].value.defined()) feeds["in" + std::to_string(i)] = c.inputs[i].value;
  }
  return feeds;
}

double loss_at(const onnx::ModelProto& model, const runtime::NamedTensors& feeds) {
  runtime::Session session(model);  // a fresh session: random ops replay run 0
  return session.run(feeds).at("loss").to_double_vector()[0];
}

void check_case(const Case& c) {
  SCOPED_TRACE(c.op + (c.label.empty() ? "" : " (" + c.label + ")"));
  // The Gradient expansion seeds with ConstantOfShape(Shape(loss)) and names its outputs with
  // Identity: a case at an opset whose versions of those have no kernel row yet cannot run
  // (ops/registry.cpp; rows written for ONNX 1.12 stop at opset 17).
  for (const char* op : {"Shape", "ConstantOfShape", "Identity"}) {
    if (c.domain.empty() && ops::op_version("", op, c.opset) != 0 && !ops::find_kernel("", op, c.opset)) {
      GTEST_SKIP() << op << "-" << ops::op_version("", op, c.opset) << " has no kernel row (opset " << c.opset << ")";
    }
  }
  // Output shapes from a forward run, then the fixed random weights R_k.
  std::vector<Tensor> weights;
  {
    Case forward = c;
    onnx::ModelProto m = make_model(forward, {}, false);
    auto* g = m.mutable_graph();
    g->mutable_node()->RemoveLast();  // the Sum of no terms
    g->clear_output();
    for (int k = 0; k < c.outputs; ++k) g->add_output()->set_name("out" + std::to_string(k));
    runtime::Session session(m);
    const auto outs = session.run(feeds_of(c));
    for (int k = 0; k < c.outputs; ++k) {
      const Tensor& o = outs.at("out" + std::to_string(k));
      weights.push_back(o.dtype() == DataType::Float64 ? uniform(o.shape(), -1.0, 1.0) : Tensor());
    }
  }
  const onnx::ModelProto with_gradient = make_model(c, weights, true);
  const onnx::ModelProto loss_only = make_model(c, weights, false);
  runtime::NamedTensors feeds = feeds_of(c);
  runtime::NamedTensors result;
  try {
    runtime::Session session(with_gradient);
    result = session.run(feeds);
  } catch (const std::exception& e) {
    // The ops of opsets after 17 run at their models' opset, where the gradient graph's helper
    // nodes (Shape, ConstantOfShape, ...) need their newer versions: until those have kernel rows,
    // such a case is skipped with the reason, not failed.
    const std::string what = e.what();
    if (c.opset > 17 && what.find("is not implemented") != std::string::npos && what.find("(" + c.op + ")") == std::string::npos) {
      GTEST_SKIP() << "waits on newer op versions: " << what;
    }
    FAIL() << what;
  }
  constexpr double eps = 1e-6;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (!c.inputs[i].differentiable) continue;
    const std::string name = "in" + std::to_string(i);
    const Tensor& analytic = result.at("grad_" + name);
    ASSERT_EQ(analytic.shape(), c.inputs[i].value.shape()) << name;
    const auto got = analytic.to_double_vector();
    for (int64_t j = 0; j < c.inputs[i].value.numel(); ++j) {
      runtime::NamedTensors shifted = feeds;
      Tensor plus = c.inputs[i].value.clone(), minus = c.inputs[i].value.clone();
      plus.data<double>()[j] += eps;
      minus.data<double>()[j] -= eps;
      shifted[name] = plus;
      const double up = loss_at(loss_only, shifted);
      shifted[name] = minus;
      const double down = loss_at(loss_only, shifted);
      const double numeric = (up - down) / (2 * eps);
      EXPECT_NEAR(got[static_cast<size_t>(j)], numeric, 1e-6 + 1e-5 * std::abs(numeric))
          << name << "[" << j << "]";
    }
  }
}

// An If node's branch attribute: `nodes` (op, inputs, output) computing `outputs`; the branch
// reads in1, in2, ... of the case's graph.
onnx::AttributeProto branch(const std::string& name, const std::vector<std::vector<std::string>>& nodes,
                            const std::vector<std::string>& outputs) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::GRAPH);
  auto* g = a.mutable_g();
  g->set_name(name);
  for (const auto& n : nodes) {
    auto* node = g->add_node();
    node->set_op_type(n[0]);
    for (size_t i = 1; i + 1 < n.size(); ++i) node->add_input(n[i]);
    node->add_output(n.back());
  }
  for (const auto& o : outputs) {
    auto* v = g->add_output();
    v->set_name(o);
    v->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::DOUBLE);
  }
  return a;
}

// Vision and neural-network ops (rules_vision.cpp). Interpolation points are drawn at random, so
// no coordinate sits on a kink (an integer pixel position, a padding bound) within eps.
void vision_cases(std::vector<Case>& c) {
  using Ints = std::vector<int64_t>;
  auto ints = [](const char* name, Ints v) { return attr(name, v); };
  auto str = [](const char* name, const char* v) { return attr(name, std::string(v)); };
  c.push_back({"LRN", {attr("size", int64_t{3}), attr("alpha", 0.5f), attr("beta", 0.75f)}, {x({2, 4, 2, 2})}, 1, 13});
  c.push_back({"LRN", {attr("size", int64_t{2}), attr("alpha", 0.4f), attr("beta", 0.6f), attr("bias", 0.8f)}, {x({1, 3, 2, 2})}, 1, 12,
               "", "even size, LRN-1"});
  c.push_back({"LpPool", {ints("kernel_shape", {2, 2}), attr("p", int64_t{3}), ints("pads", {1, 0, 0, 1}), ints("strides", {1, 2}),
                          ints("dilations", {2, 1}), attr("ceil_mode", int64_t{1})},
               {x({1, 2, 4, 5})}, 1, 18, "", "p 3, dilations, ceil_mode"});
  c.push_back({"LpPool", {ints("kernel_shape", {3}), attr("p", int64_t{1}), str("auto_pad", "SAME_LOWER")}, {x({2, 1, 5})}, 1, 11, "", "p 1"});
  c.push_back({"LpPool", {ints("kernel_shape", {2, 2})}, {x({1, 1, 3, 3})}, 1, 2, "", "p 2"});
  c.push_back({"LpNormalization", {attr("axis", int64_t{1})}, {x({2, 3, 2})}, 1, 17, "", "p 2"});
  c.push_back({"LpNormalization", {attr("p", int64_t{1})}, {x({2, 3})}, 1, 17, "", "p 1"});
  c.push_back({"LpNormalization", {attr("p", int64_t{1}), attr("axis", int64_t{0})}, {x({3, 2})}, 1, 8, "", "p 1, opset 8"});
  c.push_back({"MeanVarianceNormalization", {}, {x({2, 2, 2, 3})}, 1, 17});
  c.push_back({"MeanVarianceNormalization", {ints("axes", {1, -1})}, {x({2, 3, 4})}, 1, 9, "", "axes, MVN-9"});
  auto grid_sample = [&](const char* mode, const char* padding, int64_t align, Input grid, int opset, const char* label) {
    c.push_back({"GridSample", {str("mode", mode), str("padding_mode", padding), attr("align_corners", align)},
                 {x({1, 2, 3, 4}), std::move(grid)}, 1, opset, "", label});
  };
  grid_sample("bilinear", "zeros", 0, in_range({1, 2, 3, 2}, -1.1, 1.1), 16, "bilinear, zeros");
  grid_sample("bicubic", "border", 1, in_range({1, 3, 2, 2}, -0.9, 0.9), 16, "bicubic, border, align_corners");
  grid_sample("bilinear", "reflection", 0, in_range({1, 2, 2, 2}, 1.1, 1.8), 16, "bilinear, reflection outside");
  grid_sample("nearest", "zeros", 0, in_range({1, 2, 2, 2}, -0.9, 0.9), 16, "nearest");
  c.push_back({"GridSample", {str("mode", "linear"), attr("align_corners", int64_t{1})}, {x({1, 1, 2, 3, 3}), in_range({1, 2, 1, 2, 3}, -1, 1)},
               1, 20, "", "3-D linear"});
  c.push_back({"GridSample", {str("mode", "cubic"), str("padding_mode", "reflection")}, {x({2, 1, 4}), in_range({2, 3, 1}, -1.2, 1.2)},
               1, 22, "", "1-D cubic"});
  c.push_back({"AffineGrid", {}, {x({2, 2, 3}), fixed(i64({2, 1, 3, 4}))}, 1, 20, "", "2-D"});
  c.push_back({"AffineGrid", {attr("align_corners", int64_t{1})}, {x({1, 3, 4}), fixed(i64({1, 2, 2, 3, 2}))}, 1, 20, "", "3-D"});
  const Tensor rois = Tensor::from_vector<double>({2, 4}, {0.3, 0.6, 3.1, 2.4, 1.2, 0.1, 2.9, 2.7});
  c.push_back({"RoiAlign", {attr("output_height", int64_t{2}), attr("output_width", int64_t{2}), attr("spatial_scale", 0.9f)},
               {x({2, 2, 3, 4}), fixed(rois), fixed(i64({1, 0}))}, 1, 16, "", "avg"});
  c.push_back({"RoiAlign", {str("mode", "max"), attr("output_height", int64_t{2}), attr("sampling_ratio", int64_t{2})},
               {distinct({1, 2, 3, 4}), fixed(rois), fixed(i64({0, 0}))}, 1, 10, "", "max, RoiAlign-10"});
  c.push_back({"MaxUnpool", {ints("kernel_shape", {2, 2}), ints("strides", {2, 2})},
               {x({1, 2, 1, 2}), fixed(i64({1, 2, 1, 2}, {1, 6, 8, 8})), fixed(i64({1, 2, 3, 4}))}, 1, 11, "",
               "output_shape, a repeated index"});
  c.push_back({"DeformConv", {attr("offset_group", int64_t{2}), ints("pads", {1, 0, 0, 1}), ints("strides", {1, 2})},
               {x({1, 2, 3, 4}), x({2, 2, 2, 2}), in_range({1, 16, 3, 2}, -1.5, 1.5), x({2}), x({1, 8, 3, 2})}, 1, 19, "",
               "offset groups, bias, mask"});
  c.push_back({"DeformConv", {attr("group", int64_t{2})}, {x({1, 2, 3}), x({2, 1, 2}), in_range({1, 2, 2}, -0.8, 0.8)}, 1, 22, "",
               "1-D, groups"});
  c.push_back({"Col2Im", {ints("strides", {1, 2}), ints("pads", {1, 0, 0, 1}), ints("dilations", {1, 2})},
               {x({2, 4, 6}), fixed(i64({3, 4})), fixed(i64({2, 2}))}, 1, 18});
  c.push_back({"CenterCropPad", {ints("axes", {-1, 0})}, {x({3, 2, 4}), fixed(i64({2, 5}))}, 1, 18});
  c.push_back({"Upsample", {str("mode", "linear")}, {x({1, 2, 2, 3}), fixed(Tensor::from_vector<float>({4}, {1, 1, 2.5f, 1.5f}))}, 1, 9,
               "", "linear"});
  c.push_back({"Upsample", {attr("scales", std::vector<float>{1, 2, 3})}, {x({2, 2, 1})}, 1, 7, "", "nearest, Upsample-7"});
}

// Transformer ops (rules_transformer.cpp): Attention in its tricky configurations (causal,
// GQA, 3-D inputs, float and bool masks shorter than the keys, softcap, a past with present
// outputs that carry gradients too, nonpad_kv_seqlen, a sliding window), RotaryEmbedding
// (interleaved, partial), the normalizations and activations.
void transformer_cases(std::vector<Case>& c) {
  auto attn = [&](std::vector<onnx::AttributeProto> attrs, std::vector<Input> in, int outputs, int opset, const char* label) {
    c.push_back({"Attention", std::move(attrs), std::move(in), outputs, opset, "", label});
  };
  const auto causal = attr("is_causal", int64_t{1});
  attn({}, {x({1, 2, 3, 4}), x({1, 2, 4, 4}), x({1, 2, 4, 3})}, 1, 23, "4-D");
  attn({causal, attr("softcap", 1.5f)}, {x({2, 1, 3, 2}), x({2, 1, 3, 2}), x({2, 1, 3, 2})}, 1, 23, "causal, softcap");
  attn({causal, attr("q_num_heads", int64_t{4}), attr("kv_num_heads", int64_t{2})}, {x({2, 3, 8}), x({2, 4, 4}), x({2, 4, 6})}, 1, 23,
       "3-D GQA, causal");
  attn({attr("scale", 0.7f)}, {x({2, 2, 3, 2}), x({2, 2, 4, 2}), x({2, 2, 4, 2}), x({2, 3, 3})}, 1, 23,
       "float mask shorter than the keys, broadcast over the batch");
  attn({}, {x({1, 2, 2, 3}), x({1, 1, 3, 3}), x({1, 1, 3, 2}),
            fixed(Tensor::from_vector<bool>({2, 3}, {true, false, true, false, false, false}))},
       1, 23, "bool mask with a fully masked row, MQA");
  attn({causal}, {x({1, 2, 2, 3}), x({1, 2, 2, 3}), x({1, 2, 2, 2}), omitted(), x({1, 2, 3, 3}), x({1, 2, 3, 2})}, 3, 23,
       "past and present, causal");
  attn({causal, attr("q_num_heads", int64_t{2}), attr("kv_num_heads", int64_t{1})},
       {x({2, 2, 4}), x({2, 4, 2}), x({2, 4, 2}), omitted(), omitted(), omitted(), fixed(i64({3, 4}))}, 1, 24,
       "nonpad_kv_seqlen, causal, 3-D");
  attn({attr("left_window_size", int64_t{1}), attr("right_window_size", int64_t{1})}, {x({1, 1, 4, 2}), x({1, 1, 4, 2}), x({1, 1, 4, 2})},
       1, 25, "sliding window");
  auto rope = [&](std::vector<onnx::AttributeProto> attrs, std::vector<Input> in, const char* label) {
    c.push_back({"RotaryEmbedding", std::move(attrs), std::move(in), 1, 23, "", label});
  };
  rope({attr("interleaved", int64_t{1})}, {x({2, 2, 3, 4}), fixed(uniform({5, 2}, -1, 1)), fixed(uniform({5, 2}, -1, 1)),
                                           fixed(i64({2, 3}, {0, 1, 2, 4, 3, 0}))},
       "interleaved, position_ids");
  rope({attr("rotary_embedding_dim", int64_t{2}), attr("num_heads", int64_t{2})},
       {x({2, 3, 8}), fixed(uniform({2, 3, 1}, -1, 1)), fixed(uniform({2, 3, 1}, -1, 1))}, "3-D, partial, no position_ids");
  c.push_back({"RMSNormalization", {attr("axis", int64_t{1})}, {x({2, 3, 4}), x({3, 4})}, 1, 23, "", "axis 1"});
  c.push_back({"RMSNormalization", {attr("epsilon", 0.1f)}, {x({3, 4}), x({1, 4})}, 1, 23, "", "scale broadcast"});
  c.push_back({"GroupNormalization", {attr("num_groups", int64_t{2})}, {x({2, 4, 3}), x({4}), x({4})}, 1, 21, "", "per channel (21)"});
  c.push_back({"GroupNormalization", {attr("num_groups", int64_t{2}), attr("epsilon", 0.01f)}, {x({2, 4, 2, 2}), x({2}), x({2})}, 1, 18,
               "", "per group (18)"});
  c.push_back({"Gelu", {}, {x({2, 3})}, 1, 20, "", "erf"});
  c.push_back({"Gelu", {attr("approximate", std::string("tanh"))}, {x({2, 3})}, 1, 20, "", "tanh"});
  c.push_back({"Swish", {attr("alpha", 0.7f)}, {x({2, 3})}, 1, 24});
  c.push_back({"Mish", {}, {x({2, 3})}, 1, 22});
  c.push_back({"SwiGLU", {attr("alpha", 1.3f)}, {x({2, 3}), x({2, 3})}, 1, 28});
  c.push_back({"CausalConvWithState", {attr("activation", std::string("silu"))},
               {x({2, 2, 4}), x({2, 1, 3}), x({2}), fixed(uniform({2, 2, 2}, -1, 1))}, 2, 27, "", "silu, past_state, present_state used"});
  c.push_back({"CausalConvWithState", {}, {x({1, 2, 3}), x({2, 1, 2})}, 1, 27, "", "no bias"});
  auto la = [&](const char* rule, std::vector<Input> in, const char* label, int64_t hq = 2, int64_t hkv = 2) {
    c.push_back({"LinearAttention", {attr("update_rule", std::string(rule)), attr("q_num_heads", hq), attr("kv_num_heads", hkv)},
                 std::move(in), 2, 27, "", label});
  };
  // Keys small, so that the delta rule's state stays moderate over the tokens.
  auto small = [](const Shape& s) { return in_range(s, -0.5, 0.5); };
  la("gated_delta", {x({1, 3, 4}), small({1, 3, 4}), x({1, 3, 6}), fixed(uniform({1, 2, 2, 3}, -1, 1)), in_range({1, 3, 4}, -0.5, 0),
                     in_range({1, 3, 2}, 0.2, 0.9)},
     "gated_delta, past_state, decay per row, present_state used");
  la("gated_delta", {x({1, 3, 8}), small({1, 3, 4}), x({1, 3, 4}), omitted(), in_range({1, 3, 2}, -0.5, 0), in_range({1, 3, 1}, 0.2, 0.9)},
     "gated_delta, GQA 4 over 2, per-head decay, beta shared by the heads", 4, 2);
  la("linear", {x({2, 2, 4}), small({2, 2, 4}), x({2, 2, 4})}, "linear");
  la("delta", {x({1, 3, 4}), small({1, 3, 4}), x({1, 3, 4}), omitted(), omitted(), in_range({1, 3, 2}, 0.2, 0.9)}, "delta");
}

std::vector<Case> cases() {
  const Shape s23{2, 3};
  std::vector<Case> c;
  auto unary = [&](const std::string& op, Input in, std::vector<onnx::AttributeProto> attrs = {}) {
    c.push_back({op, std::move(attrs), {std::move(in)}});
  };
  for (const char* op : {"Identity", "Neg", "Abs", "Exp", "Tanh", "Sigmoid", "Relu", "LeakyRelu", "Elu", "Selu",
                         "Celu", "Softplus", "Softsign", "Sin", "Cos", "Tan", "Atan", "Sinh", "Cosh", "Asinh",
                         "Erf"}) {
    unary(op, x(s23));
  }
  for (const char* op : {"Log", "Sqrt", "Reciprocal"}) unary(op, positive(s23));
  for (const char* op : {"Asin", "Acos", "Atanh"}) unary(op, in_range(s23, -0.8, 0.8));
  unary("Acosh", in_range(s23, 1.2, 3.0));
  unary("HardSigmoid", in_range(s23, -2.0, 2.0));
  unary("HardSwish", in_range({3, 4}, -4.0, 4.0));
  unary("ThresholdedRelu", in_range(s23, -2.0, 2.0), {attr("alpha", 0.1f)});
  unary("Shrink", x(s23), {attr("lambd", 0.1f), attr("bias", 0.3f)});
  c.push_back({"Cast", {attr("to", int64_t{11})}, {x(s23)}, 1, 17, "", "double to double"});
  c.push_back({"CastLike", {}, {x(s23), fixed(Tensor::scalar(0.0))}});
  c.push_back({"Mod", {attr("fmod", int64_t{1})}, {in_range(s23, 0.2, 4.8), fixed(Tensor::scalar(5.0))}});
  c.push_back({"Clip", {}, {x(s23), fixed(Tensor::scalar(-0.5)), fixed(Tensor::scalar(0.5))}});
  c.push_back({"Clip", {}, {x(s23), omitted(), fixed(Tensor::scalar(0.5))}, 1, 17, "", "max only"});
  c.push_back({"Clip", {attr("min", -0.5f), attr("max", 0.5f)}, {x(s23)}, 1, 6, "", "opset 6"});
  // Broadcasting binary ops: the engine sums gradients back to each input's shape.
  for (const char* op : {"Add", "Sub", "Mul"}) {
    c.push_back({op, {}, {x({2, 1, 3}), x({4, 1})}, 1, 17, "", "broadcast"});
  }
  c.push_back({"Add", {attr("broadcast", int64_t{1})}, {x({2, 3}), x({3})}, 1, 6, "", "opset 6 broadcast"});
  c.push_back({"Div", {}, {x({2, 3}), positive({3})}});
  c.push_back({"Pow", {}, {positive({2, 3}), x({2, 3})}});
  c.push_back({"PRelu", {}, {x({2, 3, 2}), x({3, 1})}});
  c.push_back({"Sum", {}, {x({2, 3}), x({3}), x({2, 1})}});
  c.push_back({"Mean", {}, {x({2, 3}), x({3})}});
  c.push_back({"Max", {}, {distinct({2, 3}), distinct({3})}});
  c.push_back({"Min", {}, {distinct({2, 3}), distinct({2, 3})}});
  c.push_back({"Where", {}, {fixed(Tensor::from_vector<bool>({2, 3}, {true, false, true, false, false, true})),
                             x({2, 3}), x({3})}});
  auto eq = [](const char* e) { return std::vector<onnx::AttributeProto>{attr("equation", std::string(e))}; };
  c.push_back({"Einsum", eq("bij,bjk->bik"), {x({2, 3, 4}), x({2, 4, 2})}, 1, 17, "", "batched matmul"});
  c.push_back({"Einsum", eq("ij,j"), {x({3, 4}), x({4})}, 1, 17, "", "implicit output"});
  c.push_back({"Einsum", eq("ij->i"), {x({3, 4})}, 1, 17, "", "a label summed within one input"});
  c.push_back({"Einsum", eq("...ij,...jk->...ik"), {x({2, 1, 3, 4}), x({3, 4, 2})}, 1, 17, "", "broadcast ellipsis"});
  c.push_back({"Einsum", eq("i,j,k->ijk"), {x({2}), x({3}), x({2})}, 1, 17, "", "three inputs"});
  auto resize = [&](const char* mode, const char* transform, std::vector<Input> in, const char* label) {
    c.push_back({"Resize", {attr("mode", std::string(mode)), attr("coordinate_transformation_mode", std::string(transform))},
                 std::move(in), 1, 17, "", label});
  };
  resize("linear", "half_pixel", {x({1, 2, 3, 4}), omitted(), fixed(Tensor::from_vector<float>({4}, {1, 1, 2, 1.5f}))}, "linear, scales");
  resize("cubic", "align_corners", {x({1, 1, 4, 3}), omitted(), omitted(), fixed(Tensor::from_vector<int64_t>({4}, {1, 1, 3, 5}))},
         "cubic, sizes, align_corners");
  resize("nearest", "asymmetric", {x({2, 5}), omitted(), fixed(Tensor::from_vector<float>({2}, {1, 0.6f}))}, "nearest, downsampling");
  c.push_back({"MatMul", {}, {x({3, 4}), x({4, 2})}, 1, 17, "", "2-D"});
  c.push_back({"MatMul", {}, {x({2, 3, 4}), x({4, 2})}, 1, 17, "", "batched"});
  c.push_back({"MatMul", {}, {x({2, 2, 3, 4}), x({4, 2})}, 1, 17, "", "rank 4 by a matrix"});
  c.push_back({"MatMul", {}, {x({2, 3, 4}), x({4, 2})}, 1, 9, "", "opset 9 batched (Transpose and MatMul)"});
  c.push_back({"MatMul", {}, {x({2, 3, 4}), x({2, 4, 2})}, 1, 17, "", "both batched"});
  c.push_back({"MatMul", {}, {x({2, 1, 3, 4}), x({3, 4, 2})}, 1, 17, "", "broadcast batches"});
  c.push_back({"MatMul", {}, {x({4}), x({2, 4, 3})}, 1, 17, "", "1-D left"});
  c.push_back({"MatMul", {}, {x({2, 4}), x({4})}, 1, 17, "", "1-D right"});
  c.push_back({"Gemm", {attr("alpha", 0.5f), attr("beta", 2.0f)}, {x({2, 3}), x({3, 4}), x({4})}});
  c.push_back({"Gemm", {attr("transA", int64_t{1}), attr("transB", int64_t{1})}, {x({3, 2}), x({4, 3}), x({2, 4})},
               1, 17, "", "transposed"});
  c.push_back({"Gemm", {attr("transA", int64_t{1}), attr("alpha", 2.0f)}, {x({3, 2}), x({3, 4}), x({4})}, 1, 9, "",
               "opset 9"});
  // Reductions.
  const std::vector<int64_t> axis1{1};
  c.push_back({"ReduceSum", {attr("keepdims", int64_t{0})}, {x({2, 3, 2}), fixed(i64(axis1))}});
  c.push_back({"ReduceSum", {attr("axes", axis1)}, {x({2, 3, 2})}, 1, 11, "", "opset 11"});
  c.push_back({"ReduceMean", {attr("axes", std::vector<int64_t>{0, 2}), attr("keepdims", int64_t{0})}, {x({2, 3, 2})}});
  c.push_back({"ReduceSumSquare", {attr("axes", axis1)}, {x({2, 3})}});
  c.push_back({"ReduceL1", {attr("axes", axis1)}, {x({2, 3})}});
  c.push_back({"ReduceL2", {attr("axes", axis1), attr("keepdims", int64_t{0})}, {x({2, 3})}});
  c.push_back({"ReduceLogSum", {attr("axes", axis1)}, {positive({2, 3})}});
  c.push_back({"ReduceLogSumExp", {attr("keepdims", int64_t{0})}, {x({2, 3})}});
  c.push_back({"ReduceMax", {attr("axes", axis1), attr("keepdims", int64_t{0})}, {distinct({2, 3})}});
  c.push_back({"ReduceMin", {}, {distinct({2, 3})}});
  c.push_back({"ReduceProd", {attr("axes", axis1)}, {x({2, 3})}});
  c.push_back({"CumSum", {attr("reverse", int64_t{1})}, {x({2, 3}), fixed(Tensor::scalar<int64_t>(1))}});
  // Shape and indexing.
  c.push_back({"Reshape", {}, {x({2, 3}), fixed(i64({3, 2}))}});
  c.push_back({"Flatten", {}, {x({2, 3, 2})}});
  c.push_back({"Squeeze", {}, {x({2, 1, 3}), fixed(i64({1}))}});
  c.push_back({"Unsqueeze", {}, {x({2, 3}), fixed(i64({0}))}});
  c.push_back({"Transpose", {attr("perm", std::vector<int64_t>{1, 2, 0})}, {x({2, 3, 4})}});
  c.push_back({"Concat", {attr("axis", int64_t{1})}, {x({2, 1}), x({2, 3})}});
  c.push_back({"Split", {attr("axis", int64_t{1})}, {x({2, 5}), fixed(i64({2, 3}))}, 2});
  c.push_back({"Expand", {}, {x({3, 1}), fixed(i64({2, 3, 4}))}});
  c.push_back({"Tile", {}, {x({2, 3}), fixed(i64({2, 2}))}});
  c.push_back({"Pad", {}, {x({2, 3}), fixed(i64({0, 1, 1, 2}))}});
  c.push_back({"Slice", {}, {x({3, 4}), fixed(i64({0, 3})), fixed(i64({3, 0})), fixed(i64({0, 1})), fixed(i64({2, -1}))}});
  c.push_back({"Slice", {}, {x({2, 5, 3}), fixed(i64({1, -1})), fixed(i64({4, 100}))}, 1, 17, "", "axes and steps omitted, end clamped"});
  c.push_back({"Slice", {}, {x({4, 3, 2}), fixed(i64({-1, 0})), fixed(i64({-5, 2})), fixed(i64({0, 2})), fixed(i64({-2, 1}))},
               1, 17, "", "negative steps and a contiguous last dim"});
  c.push_back({"Slice", {}, {x({3, 4}), fixed(i64({2})), fixed(i64({2})), fixed(i64({1}))}, 1, 17, "", "empty"});
  c.push_back({"Slice", {attr("starts", std::vector<int64_t>{1, 0}), attr("ends", std::vector<int64_t>{3, 2}),
                         attr("axes", std::vector<int64_t>{1, 0})},
               {x({3, 4})}, 1, 9, "", "Slice-1 attributes"});
  c.push_back({"Gather", {attr("axis", int64_t{0})}, {x({4, 3}), fixed(i64({2, 2}, {1, 3, 1, 0}))}});
  c.push_back({"GatherElements", {attr("axis", int64_t{1})}, {x({2, 3}), fixed(i64({2, 2}, {0, 0, 2, 1}))}});
  c.push_back({"GatherND", {}, {x({2, 3}), fixed(i64({2, 2}, {0, 1, 1, 2}))}});
  c.push_back({"ScatterElements", {attr("axis", int64_t{1})},
               {x({2, 3}), fixed(i64({2, 1}, {2, 0})), x({2, 1})}});
  c.push_back({"Scatter", {attr("axis", int64_t{1})}, {x({2, 3}), fixed(i64({2, 1}, {2, 0})), x({2, 1})}, 1, 10});
  c.push_back({"ScatterND", {}, {x({3, 2}), fixed(i64({2, 1}, {2, 0})), x({2, 2})}});
  c.push_back({"Trilu", {}, {x({3, 3})}});
  c.push_back({"DepthToSpace", {attr("blocksize", int64_t{2})}, {x({1, 4, 2, 2})}});
  c.push_back({"SpaceToDepth", {attr("blocksize", int64_t{2})}, {x({1, 1, 4, 4})}});
  c.push_back({"TopK", {}, {distinct({2, 4}), fixed(i64({2}))}, 2});
  // Neural-network ops.
  c.push_back({"Conv", {attr("pads", std::vector<int64_t>{1, 0, 1, 1}), attr("strides", std::vector<int64_t>{2, 1})},
               {x({2, 2, 4, 3}), x({3, 2, 3, 2}), x({3})}});
  c.push_back({"Conv", {attr("group", int64_t{2})}, {x({1, 4, 3}), x({2, 2, 2})}, 1, 17, "", "groups"});
  c.push_back({"ConvTranspose", {attr("strides", std::vector<int64_t>{2, 2})}, {x({1, 2, 2, 3}), x({2, 3, 2, 2}), x({3})}});
  c.push_back({"MaxPool", {attr("kernel_shape", std::vector<int64_t>{2, 2})}, {distinct({1, 2, 3, 4})}});
  c.push_back({"AveragePool", {attr("kernel_shape", std::vector<int64_t>{2, 2}), attr("pads", std::vector<int64_t>{1, 1, 0, 0})},
               {x({1, 2, 3, 4})}});
  c.push_back({"GlobalAveragePool", {}, {x({2, 3, 2, 2})}});
  c.push_back({"GlobalMaxPool", {}, {distinct({2, 3, 2, 2})}});
  c.push_back({"BatchNormalization", {attr("training_mode", int64_t{1})},
               {x({3, 2, 2}), x({2}), x({2}), fixed(uniform({2}, -1, 1)), fixed(uniform({2}, 0.5, 1.5))}, 1, 15, "", "training"});
  c.push_back({"BatchNormalization", {}, {x({3, 2, 2}), x({2}), x({2}), x({2}), positive({2})}, 1, 15, "", "inference"});
  c.push_back({"InstanceNormalization", {}, {x({2, 2, 3}), x({2}), x({2})}});
  c.push_back({"LayerNormalization", {attr("axis", int64_t{1})}, {x({2, 2, 3}), x({2, 3}), x({2, 3})}});
  c.push_back({"Dropout", {attr("seed", int64_t{7})},
               {x({4, 5}), fixed(Tensor::scalar(0.3)), fixed(Tensor::scalar(true))}, 2, 17, "", "training"});
  c.push_back({"Dropout", {}, {x({2, 3})}, 1, 17, "", "inference"});
  c.push_back({"Softmax", {}, {x({2, 3})}});
  c.push_back({"Softmax", {}, {x({2, 2, 3})}, 1, 11, "", "opset 11 (2-D coercion)"});
  c.push_back({"LogSoftmax", {attr("axis", int64_t{1})}, {x({2, 3, 2})}});
  for (const char* reduction : {"mean", "sum", "none"}) {
    c.push_back({"SoftmaxCrossEntropyLoss", {attr("reduction", std::string(reduction)), attr("ignore_index", int64_t{2})},
                 {x({4, 3}), fixed(i64({0, 2, 1, 1})), fixed(uniform({3}, 0.5, 1.5))}, 1, 17, "", reduction});
  }
  c.push_back({"SoftmaxCrossEntropyLoss", {}, {x({2, 3, 2}), fixed(i64({2, 2}, {0, 2, 1, 1}))}, 2, 17, "", "log_prob used"});
  c.push_back({"NegativeLogLikelihoodLoss", {attr("reduction", std::string("mean"))},
               {x({3, 4}), fixed(i64({3, 0, 1})), fixed(uniform({4}, 0.5, 1.5))}});
  // If: the node reads only the condition; its branches read in1 and in2 of the graph. The
  // else_branch returns in2 itself as its second output.
  for (const bool cond : {true, false}) {
    Case c_if{"If",
              {branch("then_branch", {{"Mul", "in1", "in2", "p"}, {"Tanh", "p", "t0"}, {"Exp", "in1", "t1"}}, {"t0", "t1"}),
               branch("else_branch", {{"Sub", "in1", "in2", "e0"}}, {"e0", "in2"})},
              {fixed(Tensor::scalar(cond)), x({2, 3}), x({2, 3})}, 2, 17, "", cond ? "then_branch" : "else_branch"};
    c_if.node_inputs = 1;
    c.push_back(c_if);
  }
  // Recurrent layers (hidden size 3; B is [directions, 2 * gates * 3]).
  auto seq_lens = [](const std::vector<int32_t>& v) {
    return fixed(Tensor::from_vector<int32_t>(Shape{static_cast<int64_t>(v.size())}, v));
  };
  c.push_back({"RNN", {attr("hidden_size", int64_t{3}), attr("direction", std::string("bidirectional"))},
               {x({3, 2, 2}), x({2, 3, 2}), x({2, 3, 3}), x({2, 6}), omitted(), x({2, 2, 3})}, 2, 17, "",
               "bidirectional with initial_h"});
  c.push_back({"RNN", {attr("hidden_size", int64_t{3})}, {x({2, 2, 2}), x({1, 3, 2}), x({1, 3, 3})}, 2, 7, "", "opset 7"});
  c.push_back({"GRU", {attr("hidden_size", int64_t{3}), attr("direction", std::string("reverse"))},
               {x({3, 2, 2}), x({1, 9, 2}), x({1, 9, 3}), x({1, 18}), seq_lens({3, 2}), x({1, 2, 3})}, 2, 17, "",
               "reverse with sequence_lens"});
  c.push_back({"GRU", {attr("hidden_size", int64_t{3}), attr("linear_before_reset", int64_t{1}), attr("layout", int64_t{1})},
               {x({2, 3, 2}), x({1, 9, 2}), x({1, 9, 3}), x({1, 18})}, 2, 14, "", "linear_before_reset in layout 1"});
  c.push_back({"LSTM", {attr("hidden_size", int64_t{3}), attr("direction", std::string("bidirectional"))},
               {x({3, 2, 2}), x({2, 12, 2}), x({2, 12, 3}), x({2, 24}), seq_lens({1, 3}), x({2, 2, 3}), x({2, 2, 3}),
                x({2, 9})},
               3, 17, "", "bidirectional with sequence_lens, initial states and peepholes"});
  // Versions after opset 17: the forms a rule must read (axes inputs, num_outputs, Pad's axes,
  // Resize-18/19's attributes, Scatter max/min, CRD) and ops whose rules emit ops at the new
  // opsets (ReduceMean with an axes input in the normalization rules, Cos-22, ...).
  for (const char* op : {"ReduceMean", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceProd"}) {
    c.push_back({op, {attr("keepdims", int64_t{0})}, {x({2, 3, 2}), fixed(i64({-1, 0}))}, 1, 18, "", "opset 18 axes input"});
  }
  c.push_back({"ReduceLogSum", {}, {positive({2, 3}), fixed(i64({1}))}, 1, 18, "", "opset 18 axes input"});
  c.push_back({"ReduceLogSumExp", {attr("keepdims", int64_t{0})}, {x({2, 3}), fixed(i64({0}))}, 1, 28, "", "opset 28"});
  // (Opset 18: the rule casts its mask, and Cast-19+ is served by the element-type work.)
  c.push_back({"ReduceMax", {attr("keepdims", int64_t{0})}, {distinct({2, 3}), fixed(i64({1}))}, 1, 18, "", "opset 18 axes input"});
  c.push_back({"Max", {}, {distinct({2, 3}), distinct({3})}, 1, 19, "", "opset 19 (Equal-19)"});
  c.push_back({"ReduceMin", {}, {distinct({2, 3})}, 1, 18, "", "opset 18 axes omitted: all"});
  c.push_back({"ReduceMean", {attr("keepdims", int64_t{0})}, {x({2, 3}), fixed(i64(Shape{0}, {}))}, 1, 18, "",
               "opset 18 empty axes: all"});
  for (const char* op : {"ReduceL2", "ReduceLogSum", "ReduceMax", "ReduceSumSquare"}) {
    c.push_back({op, {attr("noop_with_empty_axes", int64_t{1}), attr("keepdims", int64_t{0})}, {positive({2, 3})}, 1, 18, "",
                 "opset 18 noop_with_empty_axes"});
  }
  c.push_back({"ReduceSum", {attr("noop_with_empty_axes", int64_t{1})}, {x({2, 3}), fixed(i64(Shape{0}, {}))}, 1, 18, "",
               "noop_with_empty_axes, empty axes input"});
  c.push_back({"Split", {attr("axis", int64_t{1}), attr("num_outputs", int64_t{2})}, {x({2, 5})}, 2, 18, "",
               "opset 18 num_outputs, uneven"});
  c.push_back({"Pad", {}, {x({2, 3}), fixed(i64({2, -1})), omitted(), fixed(i64({-1}))}, 1, 18, "", "opset 18 axes, a crop"});
  c.push_back({"Pad", {}, {x({2, 3}), fixed(i64({-1, 1, 1, -2}))}, 1, 19, "", "opset 19 crops"});
  const auto resize18 = [&](std::vector<onnx::AttributeProto> attrs, std::vector<Input> in, int opset, const char* label) {
    c.push_back({"Resize", std::move(attrs), std::move(in), 1, opset, "", label});
  };
  resize18({attr("mode", std::string("linear")), attr("antialias", int64_t{1}), attr("axes", std::vector<int64_t>{2})},
           {x({1, 2, 6}), omitted(), fixed(Tensor::from_vector<float>({1}, {0.5f}))}, 18, "antialias linear, axes");
  resize18({attr("mode", std::string("cubic")), attr("antialias", int64_t{1}), attr("exclude_outside", int64_t{1})},
           {x({1, 7}), omitted(), fixed(Tensor::from_vector<float>({2}, {1, 0.6f}))}, 18, "antialias cubic");
  resize18({attr("mode", std::string("linear")), attr("keep_aspect_ratio_policy", std::string("not_smaller")),
            attr("axes", std::vector<int64_t>{0, 1})},
           {x({3, 4}), omitted(), omitted(), fixed(Tensor::from_vector<int64_t>({2}, {2, 2}))}, 18, "keep_aspect_ratio_policy");
  resize18({attr("mode", std::string("cubic")), attr("coordinate_transformation_mode", std::string("half_pixel_symmetric"))},
           {x({2, 5}), omitted(), fixed(Tensor::from_vector<float>({2}, {1, 1.7f}))}, 19, "half_pixel_symmetric");
  c.push_back({"ScatterElements", {attr("axis", int64_t{1}), attr("reduction", std::string("max"))},
               {distinct({2, 3}), fixed(i64({2, 2}, {2, 0, 2, 2})), distinct({2, 2})}, 1, 18, "", "max, duplicates"});
  c.push_back({"ScatterND", {attr("reduction", std::string("min"))},
               {distinct({3, 2}), fixed(i64({2, 1}, {2, 2})), distinct({2, 2})}, 1, 18, "", "min, duplicates"});
  const std::vector<onnx::AttributeProto> crd{attr("blocksize", int64_t{2}), attr("mode", std::string("CRD"))};
  c.push_back({"DepthToSpace", crd, {x({1, 4, 2, 2})}, 1, 28, "", "CRD, opset 28"});
  c.push_back({"SpaceToDepth", crd, {x({1, 1, 4, 4})}, 1, 28, "", "CRD, opset 28"});
  c.push_back({"Mod", {}, {in_range(s23, 0.2, 4.8), fixed(Tensor::scalar(-5.0))}, 1, 28, "", "float fmod=0, opset 28"});
  c.push_back({"InstanceNormalization", {}, {x({2, 2, 3}), x({2}), x({2})}, 1, 22, "", "opset 22"});
  c.push_back({"LayerNormalization", {}, {x({2, 3}), x({3}), x({3})}, 1, 18, "", "opset 18 (ReduceMean with axes input)"});
  c.push_back({"BatchNormalization", {attr("training_mode", int64_t{1})},
               {x({3, 2, 2}), x({2}), x({2}), fixed(uniform({2}, -1, 1)), fixed(uniform({2}, 0.5, 1.5))}, 1, 18, "",
               "training, opset 18"});
  c.push_back({"Sin", {}, {x(s23)}, 1, 22, "", "opset 22"});
  c.push_back({"Celu", {attr("alpha", 0.5f)}, {x(s23)}, 1, 28, "", "opset 28"});
  c.push_back({"Einsum", eq("ij,jk->ik"), {x({2, 3}), x({3, 2})}, 1, 28, "", "opset 28"});
  c.push_back({"TopK", {}, {distinct({2, 4}), fixed(i64({2}))}, 2, 24, "", "opset 24"});
  c.push_back({"AveragePool", {attr("kernel_shape", std::vector<int64_t>{2}), attr("dilations", std::vector<int64_t>{2})},
               {x({1, 2, 5})}, 1, 19, "", "opset 19 dilations"});
  c.push_back({"GRU", {attr("hidden_size", int64_t{3})}, {x({2, 2, 2}), x({1, 9, 2}), x({1, 9, 3})}, 2, 22, "", "opset 22"});
  // Signal processing, determinants, cumulative products and selection (rules_signal.cpp).
  // DFT-17 (axis attribute): complex and real inputs, one-sided, inverse, IRFFT, a dft_length
  // that pads or cuts, lengths 5 and 6 (Bluestein) and 4 (radix-2).
  auto dft = [&](std::vector<onnx::AttributeProto> attrs, std::vector<Input> in, const char* label, int opset = 17) {
    c.push_back({"DFT", std::move(attrs), std::move(in), 1, opset, "", label});
  };
  const auto len = [](int64_t n) { return fixed(Tensor::scalar<int64_t>(n)); };
  dft({}, {x({2, 5, 2})}, "complex");
  dft({attr("axis", int64_t{0})}, {x({4, 3, 1}), len(6)}, "real, axis 0, zero-padded to 6");
  dft({attr("onesided", int64_t{1})}, {x({2, 6, 1})}, "real, one-sided");
  dft({attr("onesided", int64_t{1})}, {x({2, 6, 1}), len(5)}, "real, one-sided, cut to 5");
  dft({attr("inverse", int64_t{1})}, {x({2, 5, 2}), len(3)}, "inverse, cut to 3");
  dft({attr("inverse", int64_t{1}), attr("onesided", int64_t{1})}, {x({2, 4, 2})}, "IRFFT, length 6");
  dft({attr("inverse", int64_t{1}), attr("onesided", int64_t{1})}, {x({3, 2, 2}), len(5)}, "IRFFT, length 5");
  dft({attr("inverse", int64_t{1}), attr("onesided", int64_t{1})}, {x({2, 4, 2}), len(4)}, "IRFFT, bins cut to 3");
  dft({}, {x({2, 4, 3, 2}), omitted(), fixed(Tensor::scalar<int64_t>(1))}, "DFT-20, axis input", 20);
  dft({attr("onesided", int64_t{1})}, {x({3, 5, 1})}, "DFT-20, default axis -2", 20);
  c.push_back({"DFTGrad", {attr("axis", int64_t{1}), attr("onesided", int64_t{1})},
               {fixed(uniform({2, 6, 1}, -1, 1)), x({2, 4, 2})}, 1, 1, "ai.onnxtrain", "one-sided"});
  c.push_back({"DFTGrad", {attr("axis", int64_t{1}), attr("inverse", int64_t{1})},
               {fixed(uniform({2, 5, 2}, -1, 1)), x({2, 5, 2})}, 1, 1, "ai.onnxtrain", "inverse"});
  {
    Case second{"DFTGrad", {attr("axis", int64_t{0})}, {fixed(uniform({3, 2, 2}, -1, 1)), x({3, 2, 2})}, 1, 1,
                "ai.onnxtrain", "DFT-20 emitted"};
    second.onnx_opset = 20;
    c.push_back(second);
  }
  c.push_back({"Det", {}, {x({3, 3})}});
  c.push_back({"Det", {}, {x({2, 4, 4})}, 1, 17, "", "batched"});
  c.push_back({"Det", {}, {Input{Tensor::from_vector<double>({3, 3}, {1, 2, 3, 2, 4, 6, 1, 0.5, 1}), true}}, 1, 17, "",
               "singular (rank 2)"});
  c.push_back({"Det", {}, {x({2, 2, 2})}, 1, 22, "", "Det-22"});
  const auto on_axis1 = fixed(Tensor::scalar<int64_t>(1));
  c.push_back({"CumProd", {}, {x({2, 4}), on_axis1}, 1, 26});
  c.push_back({"CumProd", {attr("exclusive", int64_t{1}), attr("reverse", int64_t{1})}, {x({3, 2, 3}), on_axis1}, 1, 26, "",
               "exclusive, reverse"});
  for (const int64_t exclusive : {0, 1}) {
    for (const int64_t reverse : {0, 1}) {
      // Zeros at the start, inside and twice in one row: the branches before, at and after the first zero.
      c.push_back({"CumProd", {attr("exclusive", exclusive), attr("reverse", reverse)},
                   {Input{Tensor::from_vector<double>({3, 4}, {0, 0.5, -0.7, 0.9, 0.6, 0, -0.8, 0.4, 0.3, 0, 0.7, 0}), true},
                    on_axis1},
                   1, 26, "", "zeros, exclusive " + std::to_string(exclusive) + ", reverse " + std::to_string(reverse)});
    }
  }
  c.push_back({"TensorScatter", {attr("axis", int64_t{1})}, {x({2, 5, 3}), x({2, 2, 3}), fixed(i64({1, 3}))}, 1, 24, "",
               "linear"});
  c.push_back({"TensorScatter", {attr("mode", std::string("circular"))}, {x({2, 1, 4, 2}), x({2, 1, 3, 2}), fixed(i64({3, 1}))},
               1, 24, "", "circular"});
  c.push_back({"TensorScatter", {}, {x({2, 4, 2}), x({2, 1, 2})}, 1, 24, "", "no write_indices"});
  c.push_back({"ReverseSequence", {}, {x({4, 2, 3}), fixed(i64({3, 1}))}});
  c.push_back({"ReverseSequence", {attr("batch_axis", int64_t{0}), attr("time_axis", int64_t{1})},
               {x({3, 4}), fixed(i64({4, 0, 2}))}, 1, 17, "", "batch first"});
  const auto keep = [](const std::vector<bool>& v) {
    Tensor t(DataType::Bool, Shape{static_cast<int64_t>(v.size())});
    for (size_t i = 0; i < v.size(); ++i) t.data<bool>()[i] = v[i];
    return fixed(t);
  };
  c.push_back({"Compress", {attr("axis", int64_t{1})}, {x({2, 4, 2}), keep({true, false, true})}});
  c.push_back({"Compress", {attr("axis", int64_t{-1})}, {x({3, 2}), keep({false, true})}, 1, 17, "", "negative axis"});
  c.push_back({"Compress", {}, {x({2, 3}), keep({false, true, true, false, true})}, 1, 17, "", "flattened"});
  c.push_back({"Compress", {attr("axis", int64_t{0})}, {x({3, 2}), keep({true, false, true})}, 1, 9, "", "opset 9"});
  // onnxtrain's own backward ops, differentiated again (second-order gradients).
  c.push_back({"SumToShape", {}, {x({2, 3}), fixed(i64({3}))}, 1, 1, "ai.onnxtrain"});
  c.push_back({"ReluGrad", {}, {fixed(Tensor::from_vector<double>({2, 3}, {1, -2, 0.5, -0.1, 3, -4})), x({2, 3})}, 1, 1,
               "ai.onnxtrain"});
  c.push_back({"GatherGrad", {}, {x({2, 3}), fixed(i64({2}, {1, 1})), fixed(i64({4, 3}))}, 1, 1, "ai.onnxtrain"});
  c.push_back({"GatherElementsGrad", {attr("axis", int64_t{1})},
               {x({2, 2}), fixed(i64({2, 2}, {0, 0, 2, 1})), fixed(i64({2, 3}))}, 1, 1, "ai.onnxtrain"});
  c.push_back({"GatherNDGrad", {}, {x({2}), fixed(i64({2, 2}, {0, 1, 1, 2})), fixed(i64({2, 3}))}, 1, 1, "ai.onnxtrain"});
  c.push_back({"SliceGrad", {}, {x({2, 2}), fixed(i64({3, 4})), fixed(i64({0, 3})), fixed(i64({3, 0})), fixed(i64({0, 1})),
                                fixed(i64({2, -2}))},
               1, 1, "ai.onnxtrain"});
  // Softmax's and LogSoftmax's backward ops, along the last axis (contiguous lines) and a
  // middle one (lines strided by the inner size); y need not be a softmax for the rules.
  for (const char* op : {"SoftmaxGrad", "LogSoftmaxGrad"}) {
    c.push_back({op, {}, {x({2, 3}), x({2, 3})}, 1, 1, "ai.onnxtrain"});
    c.push_back({op, {attr("axis", int64_t{1})}, {x({2, 3, 2}), x({2, 3, 2})}, 1, 1, "ai.onnxtrain", "middle axis"});
  }
  // train --sync-batch-norm's BatchNormalization (one process: no sums across ranks); its Grad
  // computes the statistics again when the forward's current_mean and current_var are not named.
  c.push_back({"SyncBatchNormalization", {attr("epsilon", 0.01f)},
               {x({3, 2, 2, 2}), x({2}), x({2}), fixed(uniform({2}, -1, 1)), fixed(uniform({2}, 0.5, 1.5))}, 1, 1,
               "ai.onnxtrain", "one rank"});
  // runtime/fusion.h's fuse_gelu: Gelu of the erf formula in models below opset 20.
  c.push_back({"Gelu", {}, {x({2, 3})}, 1, 1, "ai.onnxtrain", "fused erf formula"});
  // fuse_attention's Attention: [batch, sequence, heads, head size] inputs, a mask added as by
  // Add (one value per row where its last dim is 1).
  const std::vector<onnx::AttributeProto> fused_attention{attr("input_layout", std::string("BSHD")), attr("graph_semantics", int64_t{1}),
                                                          attr("version", int64_t{23}), attr("scale", 0.6f)};
  c.push_back({"Attention", fused_attention, {x({2, 3, 2, 4}), x({2, 4, 2, 4}), x({2, 4, 2, 3}), x({2, 1, 1, 4})}, 1, 1, "ai.onnxtrain",
               "fused, mask over the keys"});
  c.push_back({"Attention", fused_attention, {x({1, 3, 2, 2}), x({1, 2, 2, 2}), x({1, 2, 2, 2}), x({2, 3, 1})}, 1, 1, "ai.onnxtrain",
               "fused, mask of one value per row"});
  std::vector<onnx::AttributeProto> merged = fused_attention;  // Y written [batch, sequence, heads, head size]
  merged.push_back(attr("output_layout", std::string("BSHD")));
  c.push_back({"Attention", merged, {x({2, 3, 2, 4}), x({2, 4, 2, 4}), x({2, 4, 2, 3}), x({2, 1, 1, 4})}, 1, 1, "ai.onnxtrain",
               "fused, output BSHD"});
  std::vector<onnx::AttributeProto> zeroing = fused_attention;
  zeroing.push_back(attr("nan_to_zero", int64_t{1}));
  c.push_back({"Attention", zeroing, {x({2, 2, 1, 3}), x({2, 3, 1, 3}), x({2, 3, 1, 2})}, 1, 1, "ai.onnxtrain", "fused, NaN to zero"});
  vision_cases(c);
  transformer_cases(c);
  return c;
}

class RuleCase : public ::testing::TestWithParam<Case> {};

// Ops that ONNX defines only after opset 17 (CumProd-26, TensorScatter-24, DFT-20, Det-22) are
// checked at their own opsets, where gradients also emit Constant, Shape, ConstantOfShape,
// Reshape, Equal and Cast. Until this build has rows for those ops' versions at that opset, such
// a case cannot run and is skipped with the reason.
std::string missing_basic_op(const Case& c) {
  const int opset = c.domain.empty() ? c.opset : c.onnx_opset;
  if (opset <= 17) return "";
  for (const char* op : {"Constant", "Shape", "ConstantOfShape", "Reshape", "Equal", "Cast"}) {
    if (!ops::find_kernel("", op, opset)) return op + std::string(" at opset ") + std::to_string(opset);
  }
  return "";
}

TEST_P(RuleCase, MatchesFiniteDifferences) {
  const std::string missing = missing_basic_op(GetParam());
  if (!missing.empty()) {
    GTEST_SKIP() << "no kernel row for " << missing << " in this build";
  }
  check_case(GetParam());
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name = info.param.op + "_" + info.param.label;
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name + "_" + std::to_string(info.index);
}

INSTANTIATE_TEST_SUITE_P(AllRules, RuleCase, ::testing::ValuesIn(cases()), case_name);

TEST(RuleTable, EveryRuleHasAFiniteDifferenceCase) {
  std::set<std::string> covered;
  for (const Case& c : cases()) covered.insert(c.domain + "." + c.op);
  for (const auto* rule : autodiff::all_rules()) {
    if ((rule->differentiable == 0 && !rule->enclosing_values) || std::string(rule->note) == "not twice differentiable") {
      continue;
    }
    EXPECT_TRUE(covered.contains(std::string(rule->domain) + "." + rule->op_type))
        << rule->op_type << " has a rule but no finite-difference case";
  }
}

// The ONNX schemas tag each input Differentiable or not (libonnx OpSchema formal parameters).
// Every tagged input of an operator onnxtrain runs must be in its rule's differentiable mask,
// or the rule must declare the op non-differentiable (piecewise constant, like Hardmax).
// A rule serves every version of its op that a kernel row serves, so the inputs each of those
// versions tags Differentiable (up to ONNX 1.23's opset 28) need a gradient: Reduce*-18's axes
// input, for one, is tagged non-differentiable, and a later version could tag a new input.
TEST(RuleTable, CoversEveryInputTheSchemasTagDifferentiable) {
  std::set<std::string> missing;
  for (const auto& def : ops::kernel_table()) {
    if (!def.domain.empty()) continue;
    const std::string op(def.op_type);
    const auto* rule = autodiff::find_rule("", op);
    for (int opset = def.since; opset <= std::min(def.until, 28); ++opset) {
      const auto* schema = onnx::OpSchemaRegistry::Schema(op, opset, "");
      if (!schema || schema->SinceVersion() != opset) continue;  // not a version of the op
      const auto& inputs = schema->inputs();
      for (size_t i = 0; i < inputs.size(); ++i) {
        if (inputs[i].GetDifferentiationCategory() != onnx::OpSchema::Differentiable) continue;
        const bool covered = rule && (rule->differentiable == 0 || (i < 32 && (rule->differentiable & (1u << i))));
        if (!covered) {
          missing.insert(op + "-" + std::to_string(opset) + " input " + std::to_string(i) + " (" + inputs[i].GetName() + ")");
        }
      }
    }
  }
  std::string list;
  for (const auto& m : missing) list += "\n  " + m;
  EXPECT_TRUE(missing.empty()) << "inputs tagged Differentiable without a gradient rule:" << list;
}

// docs/gradients.md is generated from the rule table and the cases above; this test fails when
// it is stale. Regenerate: ONNXTRAIN_UPDATE_DOCS=1 build/release/tests/gradient_rules_test
// --gtest_filter=RuleTable.DocsAreUpToDate
std::string gradients_doc() {
  std::ostringstream out;
  out << "# Gradients\n\n"
      << "Generated from the rule table (`src/autodiff/rules*.cpp`) by\n"
      << "`ONNXTRAIN_UPDATE_DOCS=1 build/release/tests/gradient_rules_test --gtest_filter=RuleTable.DocsAreUpToDate`;\n"
      << "the test fails when this file is stale.\n\n"
      << "## The Gradient operator\n\n"
      << "`Gradient` (`ai.onnx.preview.training` version 1) is expanded before planning into ordinary nodes\n"
      << "(`src/autodiff/engine.cpp`), so the backward pass runs on the same kernels and can be\n"
      << "differentiated again:\n\n"
      << "- `y` need not be a scalar: the seed gradient is a tensor of ones shaped like `y`, so the\n"
      << "  result is the gradient of `sum(y)`.\n"
      << "- An input in `xs` that `y` does not depend on gets zeros shaped like it; an empty output name\n"
      << "  skips that gradient; `xs` may name intermediate tensors.\n"
      << "- When the node's inputs are the tensors `xs` and `zs` name, the forward values are reused;\n"
      << "  otherwise the part of the graph between them and `y` is cloned and evaluated at the node's inputs.\n"
      << "- The engine, not the rules, sums the gradients of a value used several times and sums a\n"
      << "  broadcast gradient back to its input's shape (`ai.onnxtrain.SumToShape`).\n"
      << "- Control flow: paths run through the values an `If`'s branches or a `Loop`'s body read from the\n"
      << "  enclosing graph. `If` has a rule (below). A `Loop` on a path from `xs` to `y` is unrolled into copies\n"
      << "  of its body first, which needs its trip count to be an initializer or `Constant` and nothing else\n"
      << "  to end it (the `cond` input omitted or constant, the body's `cond` output constant or its `cond`\n"
      << "  input passed through); other Loops on such a path are errors that say why. A `Scan` (version 9\n"
      << "  and later) on such a path is unrolled the same way, one copy per position along its scan axis,\n"
      << "  whose length must be a static dim of the first scan input (a symbolic one is an error).\n"
      << "- Names: a node the expansion adds is named `<Gradient node>/<forward node>/<op>_<n>` after the\n"
      << "  forward node whose rule made it (`grad/layer1/conv/Conv/ConvGrad_12`; a forward name that\n"
      << "  begins with `/`, as PyTorch's exporter writes them, is joined without a second one), so a\n"
      << "  profile (`ONNXTRAIN_PROFILE`) or an error about a backward kernel names the layer it belongs to.\n"
      << "- Errors: an operator without a rule on a path from `xs` to `y` (the message names the op, the\n"
      << "  node and the path), an integer tensor in `xs`, a name in `xs`, `zs` or `y` the graph does not define.\n\n"
      << "## Rules\n\n"
      << "\"Differentiable inputs\" are the inputs that receive a gradient (input names from the ONNX\n"
      << "schema); the others (indices, shapes, running statistics) get none. Operators whose output is\n"
      << "piecewise constant or integer are declared non-differentiable: their inputs' gradient is\n"
      << "zero, not missing. Every rule is checked by finite differences in float64\n"
      << "(`tests/unit/gradient_rules_test.cpp`, the cases named in the last column).\n\n"
      << "| operator | differentiable inputs | gradient | finite-difference cases |\n|---|---|---|---|\n";
  std::map<std::string, std::vector<std::string>> case_labels;
  for (const Case& c : cases()) case_labels[c.domain + "." + c.op].push_back(c.label.empty() ? "default" : c.label);
  auto row = [&](const autodiff::Rule* rule) {
    const std::string domain(rule->domain);
    const std::string name = domain.empty() ? rule->op_type : domain + "." + rule->op_type;
    std::string inputs;
    if (std::string(rule->note) == "not twice differentiable") {
      inputs = "- (differentiating it is an error)";
    } else if (rule->enclosing_values) {
      inputs = "the values its subgraphs read from the enclosing graph";
    } else if (rule->differentiable == 0) {
      inputs = "none";
    } else if (rule->differentiable == autodiff::kAllInputs) {
      inputs = "all";
    } else {
      const auto* schema = domain.empty() ? onnx::OpSchemaRegistry::Schema(rule->op_type, 17, "") : nullptr;
      for (int i = 0; i < 32; ++i) {
        if (!(rule->differentiable & (1u << i))) continue;
        if (!inputs.empty()) inputs += ", ";
        const bool named = schema && static_cast<size_t>(i) < schema->inputs().size();
        inputs += named ? schema->inputs()[static_cast<size_t>(i)].GetName() : "input " + std::to_string(i);
      }
    }
    std::string checked = "-";
    const auto it = case_labels.find(domain + "." + rule->op_type);
    if (it != case_labels.end()) {
      checked.clear();
      for (const auto& l : it->second) checked += (checked.empty() ? "" : ", ") + l;
    }
    out << "| " << name << " | " << inputs << " | " << rule->note << " | " << checked << " |\n";
  };
  std::vector<const autodiff::Rule*> rules = autodiff::all_rules();
  std::sort(rules.begin(), rules.end(), [](const auto* a, const auto* b) {
    return std::string(a->domain) + a->op_type < std::string(b->domain) + b->op_type;
  });
  for (const auto* r : rules) {
    if (std::string(r->domain).empty()) row(r);
  }
  out << "\n## Backward ops of the `ai.onnxtrain` domain\n\n"
      << "Emitted by rules where standard ONNX ops would be much slower or need a newer opset\n"
      << "(`src/ops/gradient_ops.cpp`, `conv_grad.cpp`, `pool_grad.cpp`, `resize.cpp`, `rnn_grad.cpp`, and the vision ops'\n"
      << "files: `lrn.cpp`, `lp.cpp`, `grid_sample.cpp`, `roi_align.cpp`, `unpool.cpp`, `deform_conv.cpp`, `vision.cpp`). Their own\n"
      << "rules make second derivatives work, except through convolution, pooling, normalization, Resize, the recurrent layers\n"
      << "and the vision ops.\n\n"
      << "| operator | differentiable inputs | gradient | finite-difference cases |\n|---|---|---|---|\n";
  for (const auto* r : rules) {
    if (!std::string(r->domain).empty()) row(r);
  }
  return out.str();
}

TEST(RuleTable, DocsAreUpToDate) {
  const std::filesystem::path path = std::filesystem::path(ONNXTRAIN_TEST_DATA) / ".." / ".." / "docs" / "gradients.md";
  const std::string doc = gradients_doc();
  if (std::getenv("ONNXTRAIN_UPDATE_DOCS")) {
    io::write_file_atomic(path, doc);
    return;
  }
  std::string current;
  try {
    current = io::read_file(path);
  } catch (const Error&) {
  }
  EXPECT_EQ(current, doc) << path << " is stale; regenerate it (see the comment above this test)";
}

}  // namespace
}  // namespace onnxtrain
