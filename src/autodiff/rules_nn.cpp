// Gradient rules of neural-network ops: convolution, pooling, normalization, softmax, dropout,
// losses, and of the ai.onnxtrain backward ops themselves (see rules.cpp for the conventions).
#include "autodiff/gradient.h"
#include "autodiff/rules_common.h"
#include "ops/batch_norm_mode.h"
#include "onnxtrain/error.h"

namespace onnxtrain::autodiff {

namespace {

std::vector<int64_t> range(int64_t begin, int64_t end) {
  std::vector<int64_t> v;
  for (int64_t i = begin; i < end; ++i) v.push_back(i);
  return v;
}

// ---- convolution and pooling: oneDNN backward kernels (ai.onnxtrain.*Grad) ----
void conv_rule(Builder& b) {
  const std::vector<bool> wanted{b.needs(0), b.needs(1), b.has_input(2) && b.needs(2)};
  const std::string type = b.node().op_type() == "Conv" ? "ConvGrad" : "ConvTransposeGrad";
  const auto grads = b.op_n(type, {b.GO(0), b.I(0), b.I(1)}, 3, forward_attributes(b), kInternalDomain, wanted);
  for (int i = 0; i < 3; ++i) {
    if (wanted[static_cast<size_t>(i)]) b.set_GI(i, grads[static_cast<size_t>(i)]);
  }
}
void pool_rule(Builder& b) {
  const std::string type = b.node().op_type() + "Grad";
  std::vector<onnx::AttributeProto> attrs;
  for (const auto& a : b.node().attribute()) {
    if (a.name() != "storage_order") attrs.push_back(a);
  }
  b.set_GI(0, b.op(type, {b.GO(0), b.I(0)}, attrs, kInternalDomain));
}
void resize_rule(Builder& b) {
  std::vector<std::string> in{b.GO(0), b.I(0)};
  for (int i = 1; i < 4; ++i) in.push_back(b.has_input(i) ? b.I(i) : "");
  while (in.back().empty()) in.pop_back();
  b.set_GI(0, b.op("ResizeGrad", in, forward_attributes(b), kInternalDomain));
}
void global_average_pool_rule(Builder& b) {
  const std::string g = expand_like(b, b.GO(0), b.I(0));
  b.set_GI(0, div(b, mul(b, g, numel_as(b, b.O(0), b.I(0))), numel_as(b, b.I(0), b.I(0))));
}
void global_max_pool_rule(Builder& b) {
  // Ties each get the gradient.
  b.set_GI(0, where_or_zero(b, bin(b, "Equal", b.I(0), b.O(0)), expand_like(b, b.GO(0), b.I(0))));
}

// ---- normalization ----
// Normalization backward with statistics over `axes` of x (kept dims):
//   xhat = (x - mean) invstd,  dx = invstd (g - mean(g) - xhat mean(g xhat)),
// where g is the output gradient already multiplied by the scale.
struct Normalized {
  std::string xhat, invstd;
};
// ReduceMean over `axes`, keeping them: the axes attribute before opset 18, an input from 18.
std::string reduce_mean(Builder& b, const std::string& x, const std::vector<int64_t>& axes) {
  if (b.opset() >= 18) return b.op("ReduceMean", {x, b.ints(axes)}, {attr_int("keepdims", 1)});
  return b.op("ReduceMean", {x}, {attr_ints("axes", axes), attr_int("keepdims", 1)});
}
Normalized normalize(Builder& b, const std::string& x, const std::vector<int64_t>& axes, double epsilon) {
  const std::string mean = reduce_mean(b, x, axes);
  const std::string centered = sub(b, x, mean);
  const std::string var = reduce_mean(b, mul(b, centered, centered), axes);
  const std::string invstd = b.op("Reciprocal", {b.op("Sqrt", {add(b, var, b.scalar(epsilon, x))})});
  return {mul(b, centered, invstd), invstd};
}
std::string normalized_input_gradient(Builder& b, const std::string& g, const Normalized& n,
                                      const std::vector<int64_t>& axes) {
  auto mean = [&](const std::string& v) { return reduce_mean(b, v, axes); };
  const std::string inner = sub(b, sub(b, g, mean(g)), mul(b, n.xhat, mean(mul(b, g, n.xhat))));
  return mul(b, n.invstd, inner);
}

bool batch_norm_training(Builder& b) {
  bool extra_outputs = false;
  for (int i = 1; i < b.num_outputs(); ++i) extra_outputs = extra_outputs || !b.O(i).empty();
  return ops::batch_norm_training(b.opset(), b.get_int("is_test", 0), extra_outputs, b.get_int("training_mode", 0));
}
// dX, dscale, dB from ai.onnxtrain.BatchNormalizationGrad (dY, X, scale[, mean, var]), or its
// Sync variant (dY, X, scale[, current_mean, current_var]) that sums across ranks
// (ops/sync_batch_norm.cpp): one kernel where the composition of primitives took about 15 nodes.
void batch_norm_grad_node(Builder& b, const std::string& type, const std::vector<std::string>& in) {
  const std::vector<bool> wanted{b.needs(0), b.needs(1), b.needs(2)};
  if (!wanted[0] && !wanted[1] && !wanted[2]) return;
  const auto grads = b.op_n(type, in, 3, {attr_float("epsilon", b.get_float("epsilon", 1e-5f))}, kInternalDomain, wanted);
  for (int i = 0; i < 3; ++i) {
    if (wanted[static_cast<size_t>(i)]) b.set_GI(i, grads[static_cast<size_t>(i)]);
  }
}
void batch_norm_rule(Builder& b) {
  const std::string x = b.I(0), g = b.GO(0);
  // Training mode: the statistics of the batch, computed again by the Grad kernel.
  if (batch_norm_training(b)) return batch_norm_grad_node(b, "BatchNormalizationGrad", {g, x, b.I(1)});
  const int r = b.require_rank(x);
  std::vector<int64_t> axes{0};
  for (int64_t d = 2; d < r; ++d) axes.push_back(d);
  const std::vector<int64_t> channel_axes = range(1, r - 1);  // [C] -> [C, 1, ...]
  auto per_channel = [&](const std::string& v) { return channel_axes.empty() ? v : b.unsqueeze(v, channel_axes); };
  const double eps = b.get_float("epsilon", 1e-5f);
  const std::string scale = per_channel(b.I(1));
  // y = scale (x - mean) invstd + B with invstd = 1/sqrt(var + eps) from the inputs.
  Normalized n;
  const std::string invstd_c = b.op("Reciprocal", {b.op("Sqrt", {add(b, b.I(4), b.scalar(eps, x))})});
  n.invstd = per_channel(invstd_c);
  n.xhat = mul(b, sub(b, x, per_channel(b.I(3))), n.invstd);
  if (b.needs(0)) b.set_GI(0, mul(b, g, mul(b, scale, n.invstd)));
  // dmean = -sum(dy) scale invstd, dvar = -1/2 sum(dy xhat) scale invstd^2.
  if (b.needs(3)) b.set_GI(3, neg(b, mul(b, b.reduce_sum(g, axes, false), mul(b, b.I(1), invstd_c))));
  if (b.needs(4)) {
    b.set_GI(4, mul(b, b.scalar(-0.5, x),
                    mul(b, b.reduce_sum(mul(b, g, n.xhat), axes, false), mul(b, b.I(1), mul(b, invstd_c, invstd_c)))));
  }
  if (b.needs(1)) b.set_GI(1, b.reduce_sum(mul(b, g, n.xhat), axes, false));
  if (b.needs(2)) b.set_GI(2, b.reduce_sum(g, axes, false));
}
// ai.onnxtrain.SyncBatchNormalization (train --sync-batch-norm, ops/sync_batch_norm.cpp): its
// Grad op sums the per-channel sums of dy and dy xhat across ranks; it reads the forward's
// current_mean and current_var where the node names them, else computes them again.
void sync_batch_norm_rule(Builder& b) {
  std::vector<std::string> in{b.GO(0), b.I(0), b.I(1)};
  if (b.num_outputs() >= 5 && !b.O(3).empty() && !b.O(4).empty()) {
    in.push_back(b.O(3));
    in.push_back(b.O(4));
  }
  batch_norm_grad_node(b, "SyncBatchNormalizationGrad", in);
}
void instance_norm_rule(Builder& b) {
  const std::string x = b.I(0), g = b.GO(0);
  const int r = b.require_rank(x);
  const std::vector<int64_t> spatial = range(2, r);
  std::vector<int64_t> sum_axes{0};
  for (int64_t d = 2; d < r; ++d) sum_axes.push_back(d);
  const Normalized n = normalize(b, x, spatial, b.get_float("epsilon", 1e-5f));
  const std::vector<int64_t> channel_axes = range(1, r - 1);
  if (b.needs(0)) b.set_GI(0, normalized_input_gradient(b, mul(b, g, b.unsqueeze(b.I(1), channel_axes)), n, spatial));
  if (b.needs(1)) b.set_GI(1, b.reduce_sum(mul(b, g, n.xhat), sum_axes, false));
  if (b.needs(2)) b.set_GI(2, b.reduce_sum(g, sum_axes, false));
}
// ---- dropout ----
void dropout_rule(Builder& b) {
  // Training: dx = dy mask / (1 - ratio); otherwise dx = dy.
  const std::string g = b.GO(0);
  if (b.opset() >= 12) {
    if (!b.has_input(2)) return b.set_GI(0, g);
    const std::string x = b.I(0);
    const std::string ratio = b.has_input(1) ? cast_to(b, b.I(1), b.dtype(x)) : b.scalar(0.5, x);
    const std::string scale = b.op("Reciprocal", {sub(b, b.scalar(1, x), ratio)});
    const std::string s = select(b, b.I(2), scale, b.scalar(1, x));
    return b.set_GI(0, where_or_zero(b, b.output(1), mul(b, g, s)));
  }
  if (b.opset() >= 7 || b.get_int("is_test", 0) != 0) return b.set_GI(0, g);
  // Dropout-1/6 in training: the mask is typed like the data.
  const double ratio = b.get_float("ratio", 0.5f);
  b.set_GI(0, mul(b, mul(b, g, b.output(1)), b.scalar(1 / (1 - ratio), b.I(0))));
}

// ---- softmax ----
int64_t softmax_axis(Builder& b) { return b.get_int("axis", b.opset() >= 13 ? -1 : 1); }
// Softmax-1/11 work on the input flattened to 2-D at `axis`; `f` gets (g, y) as 2-D and
// the softmax axis 1, and its result is reshaped back.
template <class F>
void softmax_family(Builder& b, F f) {
  const int64_t axis = softmax_axis(b);
  if (b.opset() >= 13) return b.set_GI(0, f(b.GO(0), b.O(0), axis));
  const std::string g2 = b.op("Flatten", {b.GO(0)}, {attr_int("axis", axis)});
  const std::string y2 = b.op("Flatten", {b.O(0)}, {attr_int("axis", axis)});
  b.set_GI(0, b.op("Reshape", {f(g2, y2, 1), b.op("Shape", {b.I(0)})}));
}
void softmax_rule(Builder& b) {
  // dx = y (dy - sum(dy y)): ai.onnxtrain.SoftmaxGrad, one kernel (ops/softmax.cpp)
  softmax_family(b, [&](const std::string& g, const std::string& y, int64_t axis) {
    return b.op("SoftmaxGrad", {g, y}, {attr_int("axis", axis)}, kInternalDomain);
  });
}
void log_softmax_rule(Builder& b) {
  // dx = dy - e^y sum(dy): ai.onnxtrain.LogSoftmaxGrad
  softmax_family(b, [&](const std::string& g, const std::string& y, int64_t axis) {
    return b.op("LogSoftmaxGrad", {g, y}, {attr_int("axis", axis)}, kInternalDomain);
  });
}
// The second-order rules: with v the gradient flowing into dx and s the line sums along axis,
//   SoftmaxGrad(g, y) = y (g - s),  s = sum(g y):  dg = SoftmaxGrad(v, y) (it is linear in g),
//                                                   dy = v (g - s) - g sum(v y)
//   LogSoftmaxGrad(g, y) = g - e^y sum(g):        dg = v - sum(v e^y),  dy = -v e^y sum(g)
void softmax_grad_rule(Builder& b) {
  const int64_t axis = b.get_int("axis", -1);
  const std::string g = b.I(0), y = b.I(1), v = b.GO(0);
  if (b.needs(0)) b.set_GI(0, b.op("SoftmaxGrad", {v, y}, {attr_int("axis", axis)}, kInternalDomain));
  if (b.needs(1)) {
    const std::string s = b.reduce_sum(mul(b, g, y), {axis}, true);
    b.set_GI(1, sub(b, mul(b, v, sub(b, g, s)), mul(b, g, b.reduce_sum(mul(b, v, y), {axis}, true))));
  }
}
void log_softmax_grad_rule(Builder& b) {
  const int64_t axis = b.get_int("axis", -1);
  const std::string g = b.I(0), v = b.GO(0);
  const std::string e = b.op("Exp", {b.I(1)});
  if (b.needs(0)) b.set_GI(0, sub(b, v, b.reduce_sum(mul(b, v, e), {axis}, true)));
  if (b.needs(1)) b.set_GI(1, neg(b, mul(b, mul(b, v, e), b.reduce_sum(g, {axis}, true))));
}

// ---- losses ----
// Per-element weight w[label] (1 without weights), 0 where label == ignore_index, and the
// labels with ignored ones replaced by 0 (safe to index with).
struct LabelWeights {
  std::string weight, safe_labels;
};
LabelWeights label_weights(Builder& b, const std::string& scores, int weight_input) {
  const std::string labels = b.I(1);
  LabelWeights w{b.has_input(weight_input) ? std::string() : b.ones_like(labels), labels};
  if (!w.weight.empty()) w.weight = cast_to(b, w.weight, b.dtype(scores));
  const onnx::AttributeProto* ignore = b.attr("ignore_index");
  std::string ignored;
  if (ignore) {
    ignored = bin(b, "Equal", labels, b.scalar(static_cast<double>(ignore->i()), labels));
    w.safe_labels = b.op("Where", {ignored, b.scalar(0, labels), labels});
  }
  if (b.has_input(weight_input)) w.weight = b.op("Gather", {b.I(weight_input), w.safe_labels});
  if (ignore) w.weight = where_or_zero(b, b.op("Not", {ignored}), w.weight);
  return w;
}
// dloss/dscores for the per-element loss -w log p[label]: coefficient (w dy, scaled for the
// reduction) broadcast over the class axis 1.
std::string loss_coefficient(Builder& b, const LabelWeights& w) {
  const std::string reduction = b.get_string("reduction", "mean");
  std::string coef = mul(b, w.weight, b.GO(0));
  if (reduction == "mean") coef = div(b, coef, b.reduce_sum(w.weight, {}, false));
  return b.unsqueeze(coef, {1});
}
std::string one_hot(Builder& b, const std::string& labels, const std::string& scores) {
  const std::string depth = b.op("Gather", {b.op("Shape", {scores}), b.ints({1})});
  const std::string off_on = cast_to(b, b.ints({0, 1}), b.dtype(scores));
  return b.op("OneHot", {labels, depth, off_on}, {attr_int("axis", 1)});
}
void softmax_cross_entropy_rule(Builder& b) {
  // loss_i = -w_i log softmax(x)_i[label]: dx = (softmax(x) - onehot(label)) w_i dy (/ sum w for mean).
  const std::string scores = b.I(0);
  const std::string log_prob = b.output(1);
  const std::string p = b.op("Exp", {log_prob});
  const LabelWeights w = label_weights(b, scores, 2);
  std::string gi = mul(b, sub(b, p, one_hot(b, w.safe_labels, scores)), loss_coefficient(b, w));
  if (b.has_GO(1)) {  // log_prob is also used downstream: the LogSoftmax rule along axis 1
    const std::string g1 = b.GO(1);
    gi = add(b, gi, sub(b, g1, mul(b, p, b.reduce_sum(g1, {1}, true))));
  }
  b.set_GI(0, gi);
}
void nll_loss_rule(Builder& b) {
  // loss_i = -w_i x_i[target]: dx = -onehot(target) w_i dy (/ sum w for mean).
  const LabelWeights w = label_weights(b, b.I(0), 2);
  b.set_GI(0, neg(b, mul(b, one_hot(b, w.safe_labels, b.I(0)), loss_coefficient(b, w))));
}

// ---- the ai.onnxtrain backward ops, differentiated again ----
void sum_to_shape_rule(Builder& b) { b.set_GI(0, expand_like(b, b.GO(0), b.I(0))); }
void gather_grad_rule(Builder& b) {
  const std::string& op = b.node().op_type();
  if (op == "GatherNDGrad") {
    return b.set_GI(0, b.op("GatherND", {b.GO(0), b.I(1)}, {attr_int("batch_dims", b.get_int("batch_dims", 0))}));
  }
  b.set_GI(0, b.op(op == "GatherGrad" ? "Gather" : "GatherElements", {b.GO(0), b.I(1)},
                   {attr_int("axis", b.get_int("axis", 0))}));
}

void slice_grad_rule(Builder& b) {
  // SliceGrad(dy, shape, starts, ends[, axes, steps]) is linear in dy: its transpose is the Slice.
  if (b.opset() < 10) throw Error("the gradient of ai.onnxtrain.SliceGrad needs opset 10 or later (Slice with inputs)");
  std::vector<std::string> inputs{b.GO(0)};
  for (int i = 2; i < b.num_inputs(); ++i) inputs.push_back(b.has_input(i) ? b.I(i) : "");
  b.set_GI(0, b.op("Slice", inputs));
}

}  // namespace

std::vector<Rule> nn_rules() {
  constexpr uint32_t kIn0 = inputs_mask({0});
  // clang-format off
  return {
    {"", "Conv",                 inputs_mask({0, 1, 2}), false, conv_rule,  "dX, dW, dB by ai.onnxtrain.ConvGrad (oneDNN backward)"},
    {"", "Resize",               inputs_mask({0}),       false, resize_rule, "dx = the interpolation's transpose applied to dy (ai.onnxtrain.ResizeGrad)"},
    {"", "ConvTranspose",        inputs_mask({0, 1, 2}), false, conv_rule,  "dX, dW, dB by ai.onnxtrain.ConvTransposeGrad"},
    {"", "MaxPool",              kIn0, false, pool_rule,                 "dy routed to each window's maximum (ai.onnxtrain.MaxPoolGrad)"},
    {"", "AveragePool",          kIn0, false, pool_rule,                 "dy spread over each window (ai.onnxtrain.AveragePoolGrad)"},
    {"", "GlobalAveragePool",    kIn0, false, global_average_pool_rule,  "dx = dy / (spatial size)"},
    {"", "GlobalMaxPool",        kIn0, false, global_max_pool_rule,      "dx = dy where x == y"},
    {"", "BatchNormalization",   inputs_mask({0, 1, 2, 3, 4}), false, batch_norm_rule,
                                 "training: dx = scale invstd (dy - mean(dy) - xhat mean(dy xhat)) (ai.onnxtrain.BatchNormalizationGrad); inference: dx = dy scale invstd"},
    {"", "InstanceNormalization", inputs_mask({0, 1, 2}), false, instance_norm_rule, "as BatchNormalization in training, per instance"},
    {"", "Dropout",              kIn0, false, dropout_rule,              "training: dx = dy mask / (1 - ratio); inference: dx = dy"},
    {"", "Softmax",              kIn0, false, softmax_rule,              "dx = y (dy - sum(dy y)) (ai.onnxtrain.SoftmaxGrad)"},
    {"", "LogSoftmax",           kIn0, false, log_softmax_rule,          "dx = dy - e^y sum(dy) (ai.onnxtrain.LogSoftmaxGrad)"},
    {"", "SoftmaxCrossEntropyLoss", kIn0, false, softmax_cross_entropy_rule, "dx = (softmax(x) - onehot(label)) w dy"},
    {"", "NegativeLogLikelihoodLoss", kIn0, false, nll_loss_rule,        "dx = -onehot(target) w dy"},
    {kInternalDomain, "SumToShape",         kIn0, false, sum_to_shape_rule, "dg = expand(dy, shape(g))"},
    {kInternalDomain, "GatherGrad",         kIn0, false, gather_grad_rule,  "dg = Gather(dy)"},
    {kInternalDomain, "SliceGrad",          kIn0, false, slice_grad_rule,   "dg = Slice(dy)"},
    {kInternalDomain, "SoftmaxGrad",        inputs_mask({0, 1}), false, softmax_grad_rule,
     "z = SoftmaxGrad(g, y): dg = SoftmaxGrad(dz, y), dy = dz (g - sum(g y)) - g sum(dz y)"},
    {kInternalDomain, "LogSoftmaxGrad",     inputs_mask({0, 1}), false, log_softmax_grad_rule,
     "z = LogSoftmaxGrad(g, y): dg = dz - sum(dz e^y), dy = -dz e^y sum(g)"},
    {kInternalDomain, "GatherElementsGrad", kIn0, false, gather_grad_rule,  "dg = GatherElements(dy)"},
    {kInternalDomain, "GatherNDGrad",       kIn0, false, gather_grad_rule,  "dg = GatherND(dy)"},
    {kInternalDomain, "SyncBatchNormalization", inputs_mask({0, 1, 2}), false, sync_batch_norm_rule,
                                 "as BatchNormalization in training, the sums of dy and dy xhat over all ranks (ai.onnxtrain.SyncBatchNormalizationGrad)"},
    {kInternalDomain, "SyncBatchNormalizationGrad", kAllInputs, false, not_twice_differentiable, "not twice differentiable"},
    {kInternalDomain, "BatchNormalizationGrad", kAllInputs, false, not_twice_differentiable, "not twice differentiable"},
    {kInternalDomain, "ConvGrad",           kAllInputs, false, not_twice_differentiable, "not twice differentiable"},
    {kInternalDomain, "ResizeGrad",         kAllInputs, false, not_twice_differentiable, "not twice differentiable"},
    {kInternalDomain, "ConvTransposeGrad",  kAllInputs, false, not_twice_differentiable, "not twice differentiable"},
    {kInternalDomain, "MaxPoolGrad",        kAllInputs, false, not_twice_differentiable, "not twice differentiable"},
    {kInternalDomain, "AveragePoolGrad",    kAllInputs, false, not_twice_differentiable, "not twice differentiable"},
  };
  // clang-format on
}

}  // namespace onnxtrain::autodiff
