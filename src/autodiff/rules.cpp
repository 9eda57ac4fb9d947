// The gradient rule table: one entry per (domain, op type). Read builder.h for the vocabulary
// (I, O, GO, GI, needs). Conventions:
//   - a rule sets the gradient of every input it is asked for (needs(i)); the engine sums
//     gradients of values used several times and, for `unbroadcast` rules, sums a gradient
//     back to its input's shape — rules never do either;
//   - inputs outside the `differentiable` mask get no gradient (indices, shapes, running
//     statistics); ops with an empty mask are declared non-differentiable: their output is
//     piecewise constant or integer, so their inputs' gradient is zero, not missing;
//   - rules emit standard ONNX ops in the form the model's opset defines; where those would
//     be much slower they emit ops of the ai.onnxtrain domain (src/ops/gradient_ops.cpp,
//     conv_grad.cpp, pool_grad.cpp, rnn_grad.cpp).
// The table generates docs/gradients.md and the finite-difference tests
// (tests/unit/gradient_rules_test.cpp).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <numbers>

#include "autodiff/gradient.h"
#include "autodiff/rules_common.h"
#include "onnxtrain/error.h"
#include "ops/einsum_equation.h"

namespace onnxtrain::autodiff {

namespace {

// ---- element-wise, one input ----
void neg_rule(Builder& b) { b.set_GI(0, neg(b, b.GO(0))); }
void identity_rule(Builder& b) { b.set_GI(0, b.GO(0)); }
void abs_rule(Builder& b) { b.set_GI(0, mul(b, b.GO(0), b.op("Sign", {b.I(0)}))); }
void exp_rule(Builder& b) { b.set_GI(0, mul(b, b.GO(0), b.O(0))); }
void log_rule(Builder& b) { b.set_GI(0, div(b, b.GO(0), b.I(0))); }
void sqrt_rule(Builder& b) { b.set_GI(0, div(b, b.GO(0), add(b, b.O(0), b.O(0)))); }
void reciprocal_rule(Builder& b) { b.set_GI(0, neg(b, mul(b, b.GO(0), mul(b, b.O(0), b.O(0))))); }
void tanh_rule(Builder& b) {
  const std::string one = b.scalar(1, b.O(0));
  b.set_GI(0, mul(b, b.GO(0), sub(b, one, mul(b, b.O(0), b.O(0)))));
}
void sigmoid_rule(Builder& b) {
  const std::string one = b.scalar(1, b.O(0));
  b.set_GI(0, mul(b, b.GO(0), mul(b, b.O(0), sub(b, one, b.O(0)))));
}
void relu_rule(Builder& b) {
  // From y, not x (y > 0 exactly where x > 0): the backward pass then does not keep the
  // pre-activation alive, and the runtime may fuse Relu into its producer (runtime/fusion.h).
  // One pass (ai.onnxtrain.ReluGrad) instead of Greater and Where, with its bool mask.
  b.set_GI(0, b.op("ReluGrad", {b.O(0), b.GO(0)}, {}, kInternalDomain));
}
void relu_grad_rule(Builder& b) {  // linear in dY; piecewise constant in Y
  if (b.needs(1)) b.set_GI(1, b.op("ReluGrad", {b.I(0), b.GO(0)}, {}, kInternalDomain));
}
void leaky_relu_rule(Builder& b) {
  const std::string g = b.GO(0);
  const std::string alpha = b.scalar(b.get_float("alpha", 0.01f), b.I(0));
  b.set_GI(0, select(b, bin(b, "Greater", b.I(0), b.scalar(0, b.I(0))), g, mul(b, g, alpha)));
}
void elu_rule(Builder& b) {
  // y = x (x > 0), alpha (e^x - 1) otherwise: dy/dx = 1, or y + alpha.
  const std::string g = b.GO(0);
  const std::string alpha = b.scalar(b.get_float("alpha", 1.0f), b.I(0));
  b.set_GI(0, select(b, bin(b, "Greater", b.I(0), b.scalar(0, b.I(0))), g, mul(b, g, add(b, b.O(0), alpha))));
}
void selu_rule(Builder& b) {
  // y = gamma x (x > 0), gamma alpha (e^x - 1) otherwise: dy/dx = gamma, or y + gamma alpha.
  const double alpha = b.get_float("alpha", 1.67326319217681884765625f);
  const double gamma = b.get_float("gamma", 1.05070102214813232421875f);
  const std::string g = b.GO(0);
  b.set_GI(0, select(b, bin(b, "Greater", b.I(0), b.scalar(0, b.I(0))), mul(b, g, b.scalar(gamma, b.I(0))),
                     mul(b, g, add(b, b.O(0), b.scalar(gamma * alpha, b.I(0))))));
}
void celu_rule(Builder& b) {
  // y = max(0, x) + min(0, alpha (e^(x/alpha) - 1)): dy/dx = 1 (x > 0), e^(x/alpha) otherwise.
  const std::string g = b.GO(0);
  const std::string alpha = b.scalar(b.get_float("alpha", 1.0f), b.I(0));
  b.set_GI(0, select(b, bin(b, "Greater", b.I(0), b.scalar(0, b.I(0))), g,
                     mul(b, g, b.op("Exp", {div(b, b.I(0), alpha)}))));
}
void hard_sigmoid_rule(Builder& b) {
  // y = clamp(alpha x + beta, 0, 1): dy/dx = alpha inside (0, 1), 0 outside.
  const std::string z = add(b, mul(b, b.I(0), b.scalar(b.get_float("alpha", 0.2f), b.I(0))),
                            b.scalar(b.get_float("beta", 0.5f), b.I(0)));
  const std::string inside = b.op("And", {bin(b, "Greater", z, b.scalar(0, z)), bin(b, "Less", z, b.scalar(1, z))});
  b.set_GI(0, where_or_zero(b, inside, mul(b, b.GO(0), b.scalar(b.get_float("alpha", 0.2f), b.I(0)))));
}
void hard_swish_rule(Builder& b) {
  // y = x clamp(x/6 + 1/2, 0, 1): dy/dx = 0 (x < -3), 1 (x > 3), x/3 + 1/2 between.
  const std::string x = b.I(0);
  const std::string g = b.GO(0);
  const std::string mid = add(b, div(b, x, b.scalar(3, x)), b.scalar(0.5, x));
  const std::string upper = select(b, bin(b, "Greater", x, b.scalar(3, x)), g, mul(b, g, mid));
  b.set_GI(0, where_or_zero(b, b.op("Not", {bin(b, "Less", x, b.scalar(-3, x))}), upper));
}
void softplus_rule(Builder& b) { b.set_GI(0, mul(b, b.GO(0), b.op("Sigmoid", {b.I(0)}))); }
void softsign_rule(Builder& b) {
  // y = x / (1 + |x|): dy/dx = 1 / (1 + |x|)^2.
  const std::string d = add(b, b.scalar(1, b.I(0)), b.op("Abs", {b.I(0)}));
  b.set_GI(0, div(b, b.GO(0), mul(b, d, d)));
}
void thresholded_relu_rule(Builder& b) {
  const std::string alpha = b.scalar(b.get_float("alpha", 1.0f), b.I(0));
  b.set_GI(0, where_or_zero(b, bin(b, "Greater", b.I(0), alpha), b.GO(0)));
}
void shrink_rule(Builder& b) {
  const std::string lambd = b.scalar(b.get_float("lambd", 0.5f), b.I(0));
  const std::string outside = b.op("Or", {bin(b, "Less", b.I(0), neg(b, lambd)), bin(b, "Greater", b.I(0), lambd)});
  b.set_GI(0, where_or_zero(b, outside, b.GO(0)));
}
void sin_rule(Builder& b) { b.set_GI(0, mul(b, b.GO(0), b.op("Cos", {b.I(0)}))); }
void cos_rule(Builder& b) { b.set_GI(0, neg(b, mul(b, b.GO(0), b.op("Sin", {b.I(0)})))); }
void tan_rule(Builder& b) {  // 1 + tan^2
  b.set_GI(0, mul(b, b.GO(0), add(b, b.scalar(1, b.O(0)), mul(b, b.O(0), b.O(0)))));
}
// 1 - x^2, x^2 - 1, x^2 + 1
std::string one_minus_square(Builder& b, const std::string& x) { return sub(b, b.scalar(1, x), mul(b, x, x)); }
void asin_rule(Builder& b) { b.set_GI(0, div(b, b.GO(0), b.op("Sqrt", {one_minus_square(b, b.I(0))}))); }
void acos_rule(Builder& b) { b.set_GI(0, neg(b, div(b, b.GO(0), b.op("Sqrt", {one_minus_square(b, b.I(0))})))); }
void atan_rule(Builder& b) {
  b.set_GI(0, div(b, b.GO(0), add(b, b.scalar(1, b.I(0)), mul(b, b.I(0), b.I(0)))));
}
void sinh_rule(Builder& b) { b.set_GI(0, mul(b, b.GO(0), b.op("Cosh", {b.I(0)}))); }
void cosh_rule(Builder& b) { b.set_GI(0, mul(b, b.GO(0), b.op("Sinh", {b.I(0)}))); }
void asinh_rule(Builder& b) {
  b.set_GI(0, div(b, b.GO(0), b.op("Sqrt", {add(b, mul(b, b.I(0), b.I(0)), b.scalar(1, b.I(0)))})));
}
void acosh_rule(Builder& b) {
  b.set_GI(0, div(b, b.GO(0), b.op("Sqrt", {sub(b, mul(b, b.I(0), b.I(0)), b.scalar(1, b.I(0)))})));
}
void atanh_rule(Builder& b) { b.set_GI(0, div(b, b.GO(0), one_minus_square(b, b.I(0)))); }
void erf_rule(Builder& b) {
  // d erf(x)/dx = 2/sqrt(pi) e^(-x^2)
  const std::string x = b.I(0);
  const std::string e = b.op("Exp", {neg(b, mul(b, x, x))});
  b.set_GI(0, mul(b, b.GO(0), mul(b, e, b.scalar(2 / std::sqrt(std::numbers::pi), x))));
}
void cast_rule(Builder& b) {
  // The gradient goes back to the input's (floating) type.
  b.set_GI(0, cast_to(b, b.GO(0), b.dtype(b.I(0))));
}
void cast_like_rule(Builder& b) { b.set_GI(0, cast_to(b, b.GO(0), b.dtype(b.I(0)))); }
void mod_rule(Builder& b) { b.set_GI(0, b.GO(0)); }  // a mod b = a - b floor(a / b): slope 1 in a
void clip_rule(Builder& b) {
  // Passes where min <= x <= max (PyTorch's clamp rule). Clip-1/6: attributes; 11+: inputs.
  const std::string x = b.I(0);
  std::string keep;
  auto combine = [&](const std::string& cond) { keep = keep.empty() ? cond : b.op("And", {keep, cond}); };
  if (b.opset() < 11) {
    if (b.attr("min")) combine(b.op("Not", {bin(b, "Less", x, b.scalar(b.get_float("min", 0), x))}));
    if (b.attr("max")) combine(b.op("Not", {bin(b, "Greater", x, b.scalar(b.get_float("max", 0), x))}));
  } else {
    if (b.has_input(1)) combine(b.op("Not", {bin(b, "Less", x, b.I(1))}));
    if (b.has_input(2)) combine(b.op("Not", {bin(b, "Greater", x, b.I(2))}));
  }
  b.set_GI(0, keep.empty() ? b.GO(0) : where_or_zero(b, keep, b.GO(0)));
}

// ---- broadcasting binary and variadic ----
void add_rule(Builder& b) {
  b.set_GI(0, b.GO(0));
  b.set_GI(1, b.GO(0));
}
void sub_rule(Builder& b) {
  b.set_GI(0, b.GO(0));
  if (b.needs(1)) b.set_GI(1, neg(b, b.GO(0)));
}
void mul_rule(Builder& b) {
  if (b.needs(0)) b.set_GI(0, mul(b, b.GO(0), b.I(1)));
  if (b.needs(1)) b.set_GI(1, mul(b, b.GO(0), b.I(0)));
}
void div_rule(Builder& b) {
  // y = a / b: dy/da = 1/b, dy/db = -a/b^2 = -y/b.
  if (b.needs(0)) b.set_GI(0, div(b, b.GO(0), b.I(1)));
  if (b.needs(1)) b.set_GI(1, neg(b, div(b, mul(b, b.GO(0), b.O(0)), b.I(1))));
}
void pow_rule(Builder& b) {
  // y = a^p: dy/da = p a^(p-1), dy/dp = y ln(a). An integer exponent has no gradient.
  const std::string a = b.I(0);
  std::string p = b.I(1);
  if (b.dtype(p) != b.dtype(a)) p = cast_to(b, p, b.dtype(a));
  if (b.needs(0)) {
    const std::string pm1 = sub(b, p, b.scalar(1, a));
    b.set_GI(0, mul(b, b.GO(0), mul(b, p, bin(b, "Pow", a, pm1))));
  }
  if (b.needs(1)) b.set_GI(1, mul(b, b.GO(0), mul(b, b.O(0), b.op("Log", {a}))));
}
void prelu_rule(Builder& b) {
  // y = x (x > 0), slope x otherwise.
  const std::string positive = bin(b, "Greater", b.I(0), b.scalar(0, b.I(0)));
  if (b.needs(0)) b.set_GI(0, select(b, positive, b.GO(0), mul(b, b.GO(0), b.I(1))));
  if (b.needs(1)) b.set_GI(1, where_or_zero(b, b.op("Not", {positive}), mul(b, b.GO(0), b.I(0))));
}
void sum_rule(Builder& b) {
  for (int i = 0; i < b.num_inputs(); ++i) b.set_GI(i, b.GO(0));
}
void mean_rule(Builder& b) {
  const std::string g = div(b, b.GO(0), b.scalar(b.num_inputs(), b.O(0)));
  for (int i = 0; i < b.num_inputs(); ++i) b.set_GI(i, g);
}
void min_max_rule(Builder& b) {
  // The gradient goes to every input equal to the result (ties each get all of it).
  for (int i = 0; i < b.num_inputs(); ++i) {
    if (b.needs(i)) b.set_GI(i, where_or_zero(b, bin(b, "Equal", b.I(i), b.O(0)), b.GO(0)));
  }
}
void where_rule(Builder& b) {
  if (b.needs(1)) b.set_GI(1, where_or_zero(b, b.I(0), b.GO(0)));
  if (b.needs(2)) b.set_GI(2, where_or_zero(b, b.op("Not", {b.I(0)}), b.GO(0)));
}

// ---- linear algebra ----
// The last two dims of x (of rank r) swapped.
std::string transpose_last2(Builder& b, const std::string& x, int r) {
  std::vector<int64_t> perm;
  for (int d = 0; d < r; ++d) perm.push_back(d);
  std::swap(perm[static_cast<size_t>(r - 2)], perm[static_cast<size_t>(r - 1)]);
  return b.op("Transpose", {x}, {attr_ints("perm", perm)});
}
void matmul_rule(Builder& b) {
  // C = A B: dA = dC B^T, dB = A^T dC; 1-D operands are lifted to matrices (numpy's matmul
  // rules) and the batch dims are summed back by the engine.
  const int ra = b.require_rank(b.I(0)), rb = b.require_rank(b.I(1));
  if (ra == 2 && rb == 2 && b.opset() >= 11) {  // Gemm's transpose flags instead of Transpose copies
    if (b.needs(0)) b.set_GI(0, b.op("Gemm", {b.GO(0), b.I(1)}, {attr_int("transB", 1)}));
    if (b.needs(1)) b.set_GI(1, b.op("Gemm", {b.I(0), b.GO(0)}, {attr_int("transA", 1)}));
    return;
  }
  if (ra >= 3 && rb == 2 && b.opset() >= 11) {
    // A [..., M, K] times a matrix B [K, N] (a linear layer): A's batch dims fold into its rows,
    // so dB = A2^T dY2 with A2 = A as [rows, K] and dY2 = dY as [rows, N] (Flatten keeps the
    // data in place) is one Gemm summing over the batch as it multiplies, and dA = dY2 B^T
    // reshaped to A's shape; no Transpose copies, no per-batch [K, N] products to sum after.
    const auto flat = [&](const std::string& x) { return b.op("Flatten", {x}, {attr_int("axis", ra - 1)}); };
    const std::string g2 = flat(b.GO(0));
    if (b.needs(0)) {
      b.set_GI(0, b.op("Reshape", {b.op("Gemm", {g2, b.I(1)}, {attr_int("transB", 1)}), b.op("Shape", {b.I(0)})}));
    }
    if (b.needs(1)) b.set_GI(1, b.op("Gemm", {flat(b.I(0)), g2}, {attr_int("transA", 1)}));
    return;
  }
  std::string a = b.I(0), bm = b.I(1), g = b.GO(0);
  if (ra == 1) a = b.unsqueeze(a, {0});                  // [K] -> [1, K]
  if (rb == 1) bm = b.unsqueeze(bm, {1});                // [K] -> [K, 1]
  if (ra == 1 && rb == 1) g = b.unsqueeze(g, {0, 1});    // [] -> [1, 1]
  else if (ra == 1) g = b.unsqueeze(g, {-2});            // [..., N] -> [..., 1, N]
  else if (rb == 1) g = b.unsqueeze(g, {-1});            // [..., M] -> [..., M, 1]
  if (b.needs(0)) {
    std::string ga = b.op("MatMul", {g, transpose_last2(b, bm, std::max(rb, 2))});
    if (ra == 1) ga = b.op("Reshape", {b.sum_to_shape_of(ga, a), b.op("Shape", {b.I(0)})});  // batch summed first
    b.set_GI(0, ga);
  }
  if (b.needs(1)) {
    std::string gb = b.op("MatMul", {transpose_last2(b, a, std::max(ra, 2)), g});
    if (rb == 1) gb = b.op("Reshape", {b.sum_to_shape_of(gb, bm), b.op("Shape", {b.I(1)})});
    b.set_GI(1, gb);
  }
}
// Einsum: the gradient of input i is the einsum of dY with the other inputs onto i's term,
// "out,others->term_i" (sum-of-products rule). Letters of term_i found nowhere else were summed
// over within input i alone: dY broadcasts along them (Unsqueeze, then Expand to x_i's shape).
// '...' dims of x_i that broadcast are summed back to its shape.
void einsum_rule(Builder& b) {
  const std::string eq = b.get_string("equation", "");
  const ops::EinsumTerms split = ops::split_einsum(eq);
  const std::vector<std::string>& terms = split.inputs;
  const std::string& out = split.output;
  auto letters_of = [](const std::string& t) {
    std::string l;
    for (char c : t) {
      if (std::isalpha(static_cast<unsigned char>(c))) l += c;
    }
    return l;
  };
  for (int i = 0; i < static_cast<int>(terms.size()); ++i) {
    if (!b.needs(i)) continue;
    const std::string& term = terms[static_cast<size_t>(i)];
    const bool ellipsis = term.find("...") != std::string::npos;
    const std::string letters = letters_of(term);
    std::string kept, others, others_letters = letters_of(out);
    std::vector<std::string> inputs{b.GO(0)};
    for (int j = 0; j < static_cast<int>(terms.size()); ++j) {
      if (j == i) continue;
      others += "," + terms[static_cast<size_t>(j)];
      others_letters += letters_of(terms[static_cast<size_t>(j)]);
      inputs.push_back(b.I(j));
    }
    std::vector<int64_t> lonely;  // axes of letters summed within x_i alone
    for (size_t k = 0; k < letters.size(); ++k) {
      if (std::count(letters.begin(), letters.end(), letters[k]) > 1) {
        throw Error("the gradient of Einsum '" + eq + "' is not supported: input " + std::to_string(i) +
                    " repeats label '" + std::string(1, letters[k]) + "' (a diagonal)");
      }
      if (others_letters.find(letters[k]) == std::string::npos) lonely.push_back(static_cast<int64_t>(k));
    }
    if (ellipsis && (!lonely.empty() || out.find("...") == std::string::npos)) {
      throw Error("the gradient of Einsum '" + eq + "' is not supported: input " + std::to_string(i) +
                  " has '...' and " + (lonely.empty() ? "the output does not" : "labels summed within it alone"));
    }
    for (char c : term) {
      if (c == '.' || others_letters.find(c) != std::string::npos) kept += c;
    }
    std::string g = b.op("Einsum", inputs, {attr_string("equation", out + others + "->" + kept)});
    if (!lonely.empty()) g = b.op("Expand", {b.unsqueeze(g, lonely), b.op("Shape", {b.I(i)})});
    if (ellipsis) g = b.sum_to_shape_of(g, b.I(i));
    b.set_GI(i, g);
  }
}
void gemm_rule(Builder& b) {
  // Y = alpha op(A) op(B) + beta C: d op(A) = alpha dY op(B)^T, d op(B) = alpha op(A)^T dY,
  // dC = beta dY (summed to C's shape by the engine).
  const bool ta = b.get_int("transA", 0) != 0, tb = b.get_int("transB", 0) != 0;
  const double alpha = b.get_float("alpha", 1.0f), beta = b.get_float("beta", 1.0f);
  const std::string g = b.GO(0);
  auto t = [&](const std::string& x) { return b.op("Transpose", {x}); };
  auto scaled = [&](const std::string& x, double s) { return s == 1.0 ? x : mul(b, x, b.scalar(s, x)); };
  if (b.opset() >= 11) {
    // Gemm without C (opset 11+): the transposes become flags, not copies.
    auto gemm = [&](const std::string& x, const std::string& y, bool tx, bool ty) {
      return b.op("Gemm", {x, y}, {attr_float("alpha", static_cast<float>(alpha)), attr_int("transA", tx), attr_int("transB", ty)});
    };
    if (b.needs(0)) b.set_GI(0, ta ? gemm(b.I(1), g, tb, true) : gemm(g, b.I(1), false, !tb));
    if (b.needs(1)) b.set_GI(1, tb ? gemm(g, b.I(0), true, ta) : gemm(b.I(0), g, !ta, false));
    if (b.needs(2)) b.set_GI(2, b.sum_to_shape_of(scaled(g, beta), b.I(2)));
    return;
  }
  if (b.needs(0)) {
    const std::string op_b = tb ? t(b.I(1)) : b.I(1);
    // dA = alpha dY op(B)^T, transposed back when A was.
    const std::string d = ta ? b.op("MatMul", {op_b, t(g)}) : b.op("MatMul", {g, t(op_b)});
    b.set_GI(0, scaled(d, alpha));
  }
  if (b.needs(1)) {
    const std::string op_a = ta ? t(b.I(0)) : b.I(0);
    const std::string d = tb ? b.op("MatMul", {t(g), op_a}) : b.op("MatMul", {t(op_a), g});
    b.set_GI(1, scaled(d, alpha));
  }
  if (b.needs(2)) b.set_GI(2, b.sum_to_shape_of(scaled(g, beta), b.I(2)));
}

}  // namespace

// Defined in rules_shape.cpp, rules_nn.cpp, rules_control_flow.cpp and rules_rnn.cpp.
std::vector<Rule> shape_rules();
std::vector<Rule> nn_rules();
std::vector<Rule> control_flow_rules();
std::vector<Rule> rnn_rules();
std::vector<Rule> signal_rules();  // rules_signal.cpp
std::vector<Rule> vision_rules();  // rules_vision.cpp
std::vector<Rule> transformer_rules();  // rules_transformer.cpp

namespace {

constexpr uint32_t kIn0 = inputs_mask({0});
constexpr uint32_t kIn01 = inputs_mask({0, 1});

std::vector<Rule> math_rules() {
  // clang-format off
  return {
    // domain, op,           differentiable, unbroadcast, rule,               derivation
    {"", "Identity",          kIn0,  false, identity_rule,        "dx = dy"},
    {"", "Neg",               kIn0,  false, neg_rule,             "dx = -dy"},
    {"", "Abs",               kIn0,  false, abs_rule,             "dx = dy sign(x)"},
    {"", "Exp",               kIn0,  false, exp_rule,             "dx = dy y"},
    {"", "Log",               kIn0,  false, log_rule,             "dx = dy / x"},
    {"", "Sqrt",              kIn0,  false, sqrt_rule,            "dx = dy / (2 y)"},
    {"", "Reciprocal",        kIn0,  false, reciprocal_rule,      "dx = -dy y^2"},
    {"", "Tanh",              kIn0,  false, tanh_rule,            "dx = dy (1 - y^2)"},
    {"", "Sigmoid",           kIn0,  false, sigmoid_rule,         "dx = dy y (1 - y)"},
    {"", "Relu",              kIn0,  false, relu_rule,            "dx = dy where y > 0 (the same as x > 0; ai.onnxtrain.ReluGrad)"},
    {kInternalDomain, "ReluGrad", inputs_mask({1}), false, relu_grad_rule, "d dy = ReluGrad(y, d dx); y: piecewise constant"},
    {"", "LeakyRelu",         kIn0,  false, leaky_relu_rule,      "dx = dy (x > 0), alpha dy otherwise"},
    {"", "Elu",               kIn0,  false, elu_rule,             "dx = dy (x > 0), dy (y + alpha) otherwise"},
    {"", "Selu",              kIn0,  false, selu_rule,            "dx = gamma dy (x > 0), dy (y + gamma alpha) otherwise"},
    {"", "Celu",              kIn0,  false, celu_rule,            "dx = dy (x > 0), dy e^(x/alpha) otherwise"},
    {"", "HardSigmoid",       kIn0,  false, hard_sigmoid_rule,    "dx = alpha dy where 0 < alpha x + beta < 1"},
    {"", "HardSwish",         kIn0,  false, hard_swish_rule,      "dx = dy (x/3 + 1/2) on [-3, 3], dy above, 0 below"},
    {"", "Softplus",          kIn0,  false, softplus_rule,        "dx = dy sigmoid(x)"},
    {"", "Softsign",          kIn0,  false, softsign_rule,        "dx = dy / (1 + |x|)^2"},
    {"", "ThresholdedRelu",   kIn0,  false, thresholded_relu_rule, "dx = dy where x > alpha"},
    {"", "Shrink",            kIn0,  false, shrink_rule,          "dx = dy where |x| > lambd"},
    {"", "Sin",               kIn0,  false, sin_rule,             "dx = dy cos(x)"},
    {"", "Cos",               kIn0,  false, cos_rule,             "dx = -dy sin(x)"},
    {"", "Tan",               kIn0,  false, tan_rule,             "dx = dy (1 + y^2)"},
    {"", "Asin",              kIn0,  false, asin_rule,            "dx = dy / sqrt(1 - x^2)"},
    {"", "Acos",              kIn0,  false, acos_rule,            "dx = -dy / sqrt(1 - x^2)"},
    {"", "Atan",              kIn0,  false, atan_rule,            "dx = dy / (1 + x^2)"},
    {"", "Sinh",              kIn0,  false, sinh_rule,            "dx = dy cosh(x)"},
    {"", "Cosh",              kIn0,  false, cosh_rule,            "dx = dy sinh(x)"},
    {"", "Asinh",             kIn0,  false, asinh_rule,           "dx = dy / sqrt(x^2 + 1)"},
    {"", "Acosh",             kIn0,  false, acosh_rule,           "dx = dy / sqrt(x^2 - 1)"},
    {"", "Atanh",             kIn0,  false, atanh_rule,           "dx = dy / (1 - x^2)"},
    {"", "Erf",               kIn0,  false, erf_rule,             "dx = dy 2/sqrt(pi) e^(-x^2)"},
    {"", "Cast",              kIn0,  false, cast_rule,            "dx = cast(dy) back to x's type"},
    {"", "CastLike",          kIn0,  false, cast_like_rule,       "dx = cast(dy) back to x's type"},
    {"", "Clip",              kIn0,  false, clip_rule,            "dx = dy where min <= x <= max"},
    {"", "Add",               kIn01, true,  add_rule,             "da = dy, db = dy"},
    {"", "Sub",               kIn01, true,  sub_rule,             "da = dy, db = -dy"},
    {"", "Mul",               kIn01, true,  mul_rule,             "da = dy b, db = dy a"},
    {"", "Div",               kIn01, true,  div_rule,             "da = dy / b, db = -dy y / b"},
    {"", "Pow",               kIn01, true,  pow_rule,             "da = dy p a^(p-1), dp = dy y ln(a)"},
    {"", "PRelu",             kIn01, true,  prelu_rule,           "dx = dy (x > 0), dy slope otherwise; dslope = dy x where x <= 0"},
    {"", "Sum",               kAllInputs, true, sum_rule,         "dx_i = dy"},
    {"", "Einsum",            kAllInputs, false, einsum_rule,     "dx_i = einsum(dy, the other inputs -> term of x_i); no repeated labels within x_i"},
    {"", "Mean",              kAllInputs, true, mean_rule,        "dx_i = dy / n"},
    {"", "Min",               kAllInputs, true, min_max_rule,     "dx_i = dy where x_i == y (ties each get dy)"},
    {"", "Max",               kAllInputs, true, min_max_rule,     "dx_i = dy where x_i == y (ties each get dy)"},
    {"", "Where",             inputs_mask({1, 2}), true, where_rule, "dx = dy where cond, dy' = dy where not cond"},
    {"", "MatMul",            kIn01, true,  matmul_rule,          "dA = dY B^T, dB = A^T dY (batch dims summed); A [..., K] by a matrix B: two Gemm on A and dY flattened to rows"},
    {"", "Gemm",              inputs_mask({0, 1, 2}), false, gemm_rule,
                                                                  "d op(A) = alpha dY op(B)^T, d op(B) = alpha op(A)^T dY, dC = beta dY"},
    // Piecewise constant or integer-valued: zero gradient.
    {"", "Floor",             0, false, nullptr, "piecewise constant"},
    {"", "Ceil",              0, false, nullptr, "piecewise constant"},
    {"", "Round",             0, false, nullptr, "piecewise constant"},
    {"", "Sign",              0, false, nullptr, "piecewise constant"},
    {"", "Mod",               kIn0, true,  mod_rule,              "da = dy (the divisor gets none; piecewise constant in it almost everywhere)"},
    {"", "Equal",             0, false, nullptr, "boolean output"},
    {"", "Greater",           0, false, nullptr, "boolean output"},
    {"", "Less",              0, false, nullptr, "boolean output"},
    {"", "GreaterOrEqual",    0, false, nullptr, "boolean output"},
    {"", "LessOrEqual",       0, false, nullptr, "boolean output"},
    {"", "And",               0, false, nullptr, "boolean output"},
    {"", "Or",                0, false, nullptr, "boolean output"},
    {"", "Xor",               0, false, nullptr, "boolean output"},
    {"", "Not",               0, false, nullptr, "boolean output"},
    {"", "IsNaN",             0, false, nullptr, "boolean output"},
    {"", "IsInf",             0, false, nullptr, "boolean output"},
    {"", "RandomNormal",      0, false, nullptr, "random draw"},
    {"", "RandomUniform",     0, false, nullptr, "random draw"},
    {"", "RandomNormalLike",  0, false, nullptr, "random draw"},
    {"", "RandomUniformLike", 0, false, nullptr, "random draw"},
    {"", "Bernoulli",         0, false, nullptr, "random draw"},
    // quantization and bit casts (ONNX tags none of these inputs differentiable)
    {"", "QuantizeLinear",    0, false, nullptr, "quantized (integer or narrow float) output: piecewise constant"},
    {"", "DequantizeLinear",  0, false, nullptr, "x is quantized; the scale and zero point are quantization parameters and get no gradient"},
    {"", "BitCast",           0, false, nullptr, "reinterprets bits"},
  };
  // clang-format on
}

const std::vector<Rule>& table() {
  static const std::vector<Rule> rules = [] {
    std::vector<Rule> all = math_rules();
    for (auto& r : shape_rules()) all.push_back(r);
    for (auto& r : nn_rules()) all.push_back(r);
    for (auto& r : control_flow_rules()) all.push_back(r);
    for (auto& r : rnn_rules()) all.push_back(r);
    for (auto& r : signal_rules()) all.push_back(r);
    for (auto& r : vision_rules()) all.push_back(r);
    for (auto& r : transformer_rules()) all.push_back(r);
    return all;
  }();
  return rules;
}

}  // namespace

const Rule* find_rule(const std::string& domain, const std::string& op_type) {
  for (const Rule& r : table()) {
    if (domain == r.domain && op_type == r.op_type) return &r;
  }
  return nullptr;
}

std::vector<const Rule*> all_rules() {
  std::vector<const Rule*> out;
  for (const Rule& r : table()) out.push_back(&r);
  return out;
}

}  // namespace onnxtrain::autodiff
