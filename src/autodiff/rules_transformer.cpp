// Gradient rules of the transformer ops (see rules.cpp for the conventions): Attention,
// RotaryEmbedding, the normalizations RMSNormalization, GroupNormalization and
// LayerNormalization, and the activations Gelu, Swish, Mish and SwiGLU. Except RotaryEmbedding
// (whose transpose is itself), each emits one backward op of the ai.onnxtrain domain that does
// the work in one pass (src/ops/attention_grad.cpp, transformer_norm.cpp, normalization.cpp,
// activation.cpp); those backward ops are not differentiated again.
#include "autodiff/gradient.h"
#include "autodiff/rules_common.h"
#include "onnxtrain/error.h"
#include "ops/registry.h"

namespace onnxtrain::autodiff {

namespace {

std::vector<onnx::AttributeProto> attrs_named(Builder& b, std::initializer_list<const char*> names) {
  std::vector<onnx::AttributeProto> out;
  for (const char* n : names) {
    if (const auto* a = b.attr(n)) out.push_back(*a);
  }
  return out;
}

// Sets GI(i) = grads[i] for each wanted output of a backward op.
void set_wanted(Builder& b, const std::vector<std::string>& grads, const std::vector<bool>& wanted) {
  for (size_t i = 0; i < grads.size(); ++i) {
    if (wanted[i]) b.set_GI(static_cast<int>(i), grads[i]);
  }
}

// ---- attention ----
// dQ, dK, dV, d attn_mask (float), d past_key, d past_value by ai.onnxtrain.AttentionGrad, which
// recomputes the softmax; the gradients flowing into present_key / present_value join dK, dV
// and the past's gradients there.
void attention_rule(Builder& b) {
  if (b.num_outputs() > 3 && !b.O(3).empty() && b.has_GO(3)) {
    throw Error("Attention's output qk_matmul_output (a debug output) has no gradient; a loss must not depend on it");
  }
  std::vector<std::string> in{b.GO(0)};
  for (int i = 0; i < 7; ++i) in.push_back(b.has_input(i) ? b.I(i) : "");
  in.push_back(b.num_outputs() > 1 && !b.O(1).empty() && b.has_GO(1) ? b.GO(1) : "");
  in.push_back(b.num_outputs() > 2 && !b.O(2).empty() && b.has_GO(2) ? b.GO(2) : "");
  while (in.back().empty()) in.pop_back();
  std::vector<bool> wanted(6);
  for (int i = 0; i < 6; ++i) wanted[static_cast<size_t>(i)] = b.has_input(i) && b.needs(i);
  std::vector<onnx::AttributeProto> attrs = forward_attributes(b);
  // ai.onnxtrain.Attention (runtime/fusion.h fuse_attention) states its version among them.
  if (b.node().domain() != kInternalDomain) attrs.push_back(attr_int("version", ops::op_version("", "Attention", b.opset())));
  set_wanted(b, b.op_n("AttentionGrad", in, 6, attrs, kInternalDomain, wanted), wanted);
}

// ---- RotaryEmbedding: each pair is rotated by an orthogonal matrix, so dX is dY rotated back:
// the same op with sin negated. ----
void rotary_embedding_rule(Builder& b) {
  std::vector<std::string> in{b.GO(0), b.I(1), neg(b, b.I(2))};
  if (b.has_input(3)) in.push_back(b.I(3));
  b.set_GI(0, b.op("RotaryEmbedding", in, forward_attributes(b)));
}

// ---- normalizations ----
void rms_norm_rule(Builder& b) {
  const std::vector<bool> wanted{b.needs(0), b.needs(1)};
  set_wanted(b, b.op_n("RMSNormalizationGrad", {b.GO(0), b.I(0), b.I(1)}, 2, attrs_named(b, {"axis", "epsilon"}), kInternalDomain, wanted),
             wanted);
}
void group_norm_rule(Builder& b) {
  const std::vector<bool> wanted{b.needs(0), b.needs(1), b.needs(2)};
  set_wanted(b,
             b.op_n("GroupNormalizationGrad", {b.GO(0), b.I(0), b.I(1)}, 3, attrs_named(b, {"num_groups", "epsilon"}),
                    kInternalDomain, wanted),
             wanted);
}
// Through the saved statistics too, when a loss reads them: d mean/dx = 1/n and
// d invstd/dx = -invstd^3 (x - mean) / n per row.
std::string layer_norm_stats_gradient(Builder& b, const std::string& mean, const std::string& invstd) {
  const std::string x = b.I(0);
  auto like_x = [&](const std::string& v) { return b.dtype(v) == b.dtype(x) ? v : cast_to(b, v, b.dtype(x)); };
  const std::string n = div(b, numel_as(b, x, x), numel_as(b, mean, x));
  std::string g;
  if (b.has_GO(1)) g = expand_like(b, div(b, like_x(b.GO(1)), n), x);
  if (b.has_GO(2)) {
    const std::string s = like_x(invstd);
    const std::string t = neg(b, div(b, mul(b, mul(b, mul(b, s, s), s), sub(b, x, like_x(mean))), n));
    const std::string term = mul(b, like_x(b.GO(2)), t);
    g = g.empty() ? term : add(b, g, term);
  }
  return g;
}
void layer_norm_rule(Builder& b) {
  const std::vector<bool> wanted{b.needs(0), b.needs(1), b.has_input(2) && b.needs(2)};
  const std::string mean = b.output(1), invstd = b.output(2);
  const auto grads = b.op_n("LayerNormalizationGrad", {b.GO(0), b.I(0), b.I(1), mean, invstd}, 3,
                            attrs_named(b, {"axis", "epsilon"}), kInternalDomain, wanted);
  if (b.needs(0)) {
    const bool stats_used = (!b.O(1).empty() && b.has_GO(1)) || (!b.O(2).empty() && b.has_GO(2));
    b.set_GI(0, stats_used ? add(b, grads[0], layer_norm_stats_gradient(b, mean, invstd)) : grads[0]);
  }
  if (wanted[1]) b.set_GI(1, b.sum_to_shape_of(grads[1], b.I(1)));
  if (wanted[2]) b.set_GI(2, b.sum_to_shape_of(grads[2], b.I(2)));
}

// ---- activations ----
void activation_rule(Builder& b) {
  const std::string type = b.node().op_type() + "Grad";
  b.set_GI(0, b.op(type, {b.GO(0), b.I(0)}, forward_attributes(b), kInternalDomain));
}
void swiglu_rule(Builder& b) {
  const std::vector<bool> wanted{b.needs(0), b.needs(1)};
  set_wanted(b, b.op_n("SwiGLUGrad", {b.GO(0), b.I(0), b.I(1)}, 2, forward_attributes(b), kInternalDomain, wanted), wanted);
}

// ---- CausalConvWithState: dInput, dWeight, dBias by ai.onnxtrain.CausalConvWithStateGrad, with the
// gradient flowing into present_state ----
void causal_conv_rule(Builder& b) {
  const std::vector<bool> wanted{b.needs(0), b.needs(1), b.has_input(2) && b.needs(2)};
  std::vector<std::string> in{b.GO(0), b.I(0), b.I(1), b.has_input(2) ? b.I(2) : "", b.has_input(3) ? b.I(3) : "",
                              b.num_outputs() > 1 && !b.O(1).empty() && b.has_GO(1) ? b.GO(1) : ""};
  while (in.back().empty()) in.pop_back();
  set_wanted(b, b.op_n("CausalConvWithStateGrad", in, 3, forward_attributes(b), kInternalDomain, wanted), wanted);
}

// ---- LinearAttention: dquery, dkey, dvalue, ddecay, dbeta by ai.onnxtrain.LinearAttentionGrad
// (backpropagation through the tokens), with the gradient flowing into present_state ----
void linear_attention_rule(Builder& b) {
  const std::vector<bool> wanted{b.needs(0), b.needs(1), b.needs(2), b.has_input(4) && b.needs(4), b.has_input(5) && b.needs(5)};
  std::vector<std::string> in{b.GO(0)};
  for (int i = 0; i < 6; ++i) in.push_back(b.has_input(i) ? b.I(i) : "");
  in.push_back(b.num_outputs() > 1 && !b.O(1).empty() && b.has_GO(1) ? b.GO(1) : "");
  while (in.back().empty()) in.pop_back();
  const auto grads = b.op_n("LinearAttentionGrad", in, 5, forward_attributes(b), kInternalDomain, wanted);
  const int input_of[] = {0, 1, 2, 4, 5};
  for (size_t i = 0; i < 5; ++i) {
    if (wanted[i]) b.set_GI(input_of[i], grads[i]);
  }
}

// The rule of the backward ops above.
void transformer_backward_op(Builder& b) {
  throw Error(b.node().op_type() + " (a backward op of the transformer ops) is not differentiable: second derivatives through "
              "Attention, the normalizations and Gelu, Swish, Mish and SwiGLU are not supported");
}

}  // namespace

std::vector<Rule> transformer_rules() {
  constexpr uint32_t kIn0 = inputs_mask({0});
  // clang-format off
  return {
    {"", "Attention",          inputs_mask({0, 1, 2, 3, 4, 5}), false, attention_rule,
        "dQ, dK, dV, d attn_mask (float masks), d past_key, d past_value by ai.onnxtrain.AttentionGrad (recomputes P = softmax; dV = P^T dY, dS = P (dY V^T - rowsum), dQ = scale dS K, dK = scale dS^T Q)"},
    {kInternalDomain, "Attention", inputs_mask({0, 1, 2, 3}), false, attention_rule,
        "as Attention (the op runtime/fusion.h's fuse_attention makes of the MatMul-Softmax-MatMul pattern): dQ, dK, dV in the inputs' layout, d mask by ai.onnxtrain.AttentionGrad"},
    {"", "RotaryEmbedding",    kIn0, false, rotary_embedding_rule, "dX = RotaryEmbedding(dY, cos, -sin): each pair rotated back"},
    {"", "RMSNormalization",   inputs_mask({0, 1}), false, rms_norm_rule,
        "dX = r (g - xhat mean(g xhat)), g = dY scale, xhat = x r; dscale = sum dY xhat (ai.onnxtrain.RMSNormalizationGrad)"},
    {"", "GroupNormalization", inputs_mask({0, 1, 2}), false, group_norm_rule,
        "per group dX = invstd (g - mean(g) - xhat mean(g xhat)), g = dY scale; dscale = sum dY xhat, dbias = sum dY (ai.onnxtrain.GroupNormalizationGrad)"},
    {"", "LayerNormalization", inputs_mask({0, 1, 2}), false, layer_norm_rule,
        "dX = invstd (g - mean(g) - xhat mean(g xhat)), g = dY scale, from the saved Mean and InvStdDev (ai.onnxtrain.LayerNormalizationGrad)"},
    {"", "Gelu",               kIn0, false, activation_rule, "dx = dy (Phi(x) + x phi(x)), or the tanh form's derivative (ai.onnxtrain.GeluGrad)"},
    {kInternalDomain, "Gelu",  kIn0, false, activation_rule, "as Gelu (the op runtime/fusion.h's fuse_gelu makes of the erf formula)"},
    {"", "Swish",              kIn0, false, activation_rule, "dx = dy (s + alpha x s (1 - s)), s = sigmoid(alpha x) (ai.onnxtrain.SwishGrad)"},
    {"", "Mish",               kIn0, false, activation_rule, "dx = dy (tanh(sp) + x (1 - tanh(sp)^2) sigmoid(x)), sp = softplus(x) (ai.onnxtrain.MishGrad)"},
    {"", "SwiGLU",             inputs_mask({0, 1}), false, swiglu_rule, "dA = dy B swish'(A), dB = dy swish(A) (ai.onnxtrain.SwiGLUGrad)"},
    {"", "CausalConvWithState", inputs_mask({0, 1, 2}), false, causal_conv_rule,
        "dz = dy act'(z); dinput = the transposed depthwise convolution of dz (plus d present_state); dweight = sum dz padded; dbias = sum dz (ai.onnxtrain.CausalConvWithStateGrad); past_state: not differentiable (its schema tag)"},
    {"", "LinearAttention", inputs_mask({0, 1, 2, 4, 5}), false, linear_attention_rule,
        "backpropagation through the tokens: dq = scale S do, dS += scale q do^T, du = dS^T k, dk = dS u, delta: dv = beta du, dbeta = du (v - S'^T k); gated: dg = e^g sum dS' S (ai.onnxtrain.LinearAttentionGrad); past_state: not differentiable (its schema tag)"},
    {kInternalDomain, "LinearAttentionGrad", kAllInputs, false, transformer_backward_op, "not twice differentiable"},
    {kInternalDomain, "CausalConvWithStateGrad", kAllInputs, false, transformer_backward_op, "not twice differentiable"},
    {kInternalDomain, "AttentionGrad",          kAllInputs, false, transformer_backward_op, "not twice differentiable"},
    {kInternalDomain, "LayerNormalizationGrad", kAllInputs, false, transformer_backward_op, "not twice differentiable"},
    {kInternalDomain, "RMSNormalizationGrad",   kAllInputs, false, transformer_backward_op, "not twice differentiable"},
    {kInternalDomain, "GroupNormalizationGrad", kAllInputs, false, transformer_backward_op, "not twice differentiable"},
    {kInternalDomain, "GeluGrad",               kAllInputs, false, transformer_backward_op, "not twice differentiable"},
    {kInternalDomain, "SwishGrad",              kAllInputs, false, transformer_backward_op, "not twice differentiable"},
    {kInternalDomain, "MishGrad",               kAllInputs, false, transformer_backward_op, "not twice differentiable"},
    {kInternalDomain, "SwiGLUGrad",             kAllInputs, false, transformer_backward_op, "not twice differentiable"},
  };
  // clang-format on
}

}  // namespace onnxtrain::autodiff
