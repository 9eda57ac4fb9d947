// Gradient rules of the signal-processing, determinant, cumulative-product and selection ops
// (see rules.cpp for the conventions). DFT and Det emit backward ops of the ai.onnxtrain domain
// (DFTGrad: the adjoint transform in one FFT pass per line, where ONNX ops would need a Pad with
// a runtime axis, copies and weights; DetGrad: cofactors from an LU factorization, which no
// ONNX op computes); the others emit ONNX ops.
#include <onnx/onnx_pb.h>

#include "autodiff/gradient.h"
#include "autodiff/rules_common.h"
#include "onnxtrain/error.h"

namespace onnxtrain::autodiff {

namespace {

// A 0-D int64 constant (DFT-20's axis input is a scalar).
std::string int64_scalar(Builder& b, int64_t v) {
  onnx::TensorProto t;
  t.set_data_type(onnx::TensorProto::INT64);
  t.add_int64_data(v);
  return b.op("Constant", {}, {attr_tensor("value", t)});
}

// `inputs` with trailing omitted ("") entries dropped.
std::vector<std::string> trimmed(std::vector<std::string> inputs) {
  while (!inputs.empty() && inputs.back().empty()) inputs.pop_back();
  return inputs;
}

// ---- DFT ----
void dft_rule(Builder& b) {
  // dX = DFT^T dY, the adjoint transform (ops/signal.cpp documents each case).
  std::vector<onnx::AttributeProto> attrs{attr_int("inverse", b.get_int("inverse", 0)),
                                          attr_int("onesided", b.get_int("onesided", 0))};
  std::string axis;
  if (b.opset() >= 20 && b.has_input(2)) {
    axis = b.I(2);
  } else {
    attrs.push_back(attr_int("axis", b.opset() >= 20 ? -2 : b.get_int("axis", 1)));
  }
  const std::string length = b.has_input(1) ? b.I(1) : "";
  b.set_GI(0, b.op("DFTGrad", trimmed({b.I(0), b.GO(0), length, axis}), attrs, kInternalDomain));
}
void dft_grad_rule(Builder& b) {
  // DFTGrad is linear in dY and its adjoint is DFT itself.
  std::vector<onnx::AttributeProto> attrs{attr_int("inverse", b.get_int("inverse", 0)),
                                          attr_int("onesided", b.get_int("onesided", 0))};
  const std::string length = b.has_input(2) ? b.I(2) : "";
  if (b.opset() >= 20) {
    const std::string axis = b.has_input(3) ? b.I(3) : int64_scalar(b, b.get_int("axis", 1));
    b.set_GI(1, b.op("DFT", trimmed({b.GO(0), length, axis}), attrs));
    return;
  }
  attrs.push_back(attr_int("axis", b.get_int("axis", 1)));
  b.set_GI(1, b.op("DFT", trimmed({b.GO(0), length}), attrs));
}

// ---- Det ----
void det_rule(Builder& b) {
  // d det(X) = tr(adj(X) dX): dX = dY adj(X)^T = dY det(X) X^-T (ai.onnxtrain.DetGrad).
  b.set_GI(0, b.op("DetGrad", {b.I(0), b.GO(0)}, {}, kInternalDomain));
}
void det_grad_rule(Builder&) {
  throw Error("DetGrad (the backward op of Det) is not differentiable: second derivatives through Det are not supported");
}

// ---- CumProd ----
void cumprod_rule(Builder& b) {
  // y_i = prod_{k <= i} x_k (k < i when exclusive; in processing order, which `reverse` flips).
  // Let z be the first zero of x in processing order. Then
  //   j < z:  dx_j = (sum_{i >= j} dy_i y_i) / x_j                (x_j != 0; i > j when exclusive)
  //   j = z:  dx_z = sum_{i >= z} dy_i c_i, c = CumProd of x with x_z replaced by 1
  //   j > z:  dx_j = 0 (every product that holds x_j holds x_z).
  // The sums over i >= j run against the processing order: CumSum with reverse flipped.
  const std::string x = b.I(0), axis = b.I(1);
  const int64_t exclusive = b.get_int("exclusive", 0), reverse = b.get_int("reverse", 0);
  auto adjoint_sum = [&](const std::string& v) {
    return b.op("CumSum", {v, axis}, {attr_int("exclusive", exclusive), attr_int("reverse", 1 - reverse)});
  };
  const std::string zero = b.scalar(0, x), one = b.scalar(1, x);
  const std::string is_zero = b.op("Equal", {x, zero});
  const std::string zeros_so_far =
      b.op("CumSum", {b.op("Where", {is_zero, one, zero}), axis}, {attr_int("reverse", reverse)});
  const std::string before = b.op("Less", {zeros_so_far, b.scalar(0.5, x)});
  const std::string first = b.op("And", {is_zero, b.op("Less", {zeros_so_far, b.scalar(1.5, x)})});
  const std::string g = b.GO(0);
  const std::string dx_before = div(b, adjoint_sum(mul(b, g, b.O(0))), x);
  const std::string c = b.op("CumProd", {b.op("Where", {first, one, x}), axis},
                             {attr_int("exclusive", exclusive), attr_int("reverse", reverse)});
  const std::string dx_first = adjoint_sum(mul(b, g, c));
  b.set_GI(0, b.op("Where", {before, dx_before, b.op("Where", {first, dx_first, zero})}));
}

// ---- selection ----
void reverse_sequence_rule(Builder& b) {
  // A permutation that is its own inverse.
  b.set_GI(0, b.op("ReverseSequence", {b.GO(0), b.I(1)},
                   {attr_int("batch_axis", b.get_int("batch_axis", 1)), attr_int("time_axis", b.get_int("time_axis", 0))}));
}

// Shape [1, ..., 1, -1, 1, ..., 1] of rank r with the -1 at `axis`.
std::vector<int64_t> along_axis(int r, int64_t axis) {
  std::vector<int64_t> s(static_cast<size_t>(r), 1);
  s[static_cast<size_t>(axis)] = -1;
  return s;
}

void compress_rule(Builder& b) {
  // dinput = zeros with dy scattered back to the kept positions (the true entries of condition).
  const std::string x = b.I(0);
  const std::string kept = b.op("NonZero", {b.I(1)});  // [1, kept]
  const char* scatter = b.opset() >= 11 ? "ScatterElements" : "Scatter";
  if (!b.attr("axis")) {
    const std::string flat = b.zeros_like(b.op("Reshape", {x, b.ints({-1})}));
    const std::string s = b.op(scatter, {flat, b.op("Reshape", {kept, b.ints({-1})}), b.GO(0)}, {attr_int("axis", 0)});
    return b.set_GI(0, b.op("Reshape", {s, b.op("Shape", {x})}));
  }
  const int r = b.require_rank(x);
  int64_t axis = b.get_int("axis", 0);
  if (axis < 0) axis += r;
  const std::string index = b.op("Expand", {b.op("Reshape", {kept, b.ints(along_axis(r, axis))}), b.op("Shape", {b.GO(0)})});
  b.set_GI(0, b.op(scatter, {b.zeros_like(x), index, b.GO(0)}, {attr_int("axis", axis)}));
}

void tensor_scatter_rule(Builder& b) {
  // dpast = dy with the written rows zeroed; dupdate = the written rows of dy.
  std::vector<onnx::AttributeProto> attrs{attr_string("mode", b.get_string("mode", "linear")),
                                          attr_int("axis", b.get_int("axis", -2))};
  const std::string indices = b.has_input(2) ? b.I(2) : "";
  if (b.needs(0)) b.set_GI(0, b.op("TensorScatter", trimmed({b.GO(0), b.zeros_like(b.I(1)), indices}), attrs));
  if (!b.needs(1)) return;
  const int r = b.require_rank(b.I(0));
  int64_t axis = b.get_int("axis", -2);
  if (axis < 0) axis += r;
  // Row s of the update went to row write_indices[b] + s (mod max_sequence_length when circular).
  const std::string update_shape = b.op("Shape", {b.I(1)});
  const std::string rows = b.op("Gather", {update_shape, b.scalar(static_cast<double>(axis), update_shape)});
  std::string index = b.op("Reshape", {b.op("Range", {b.scalar(0, rows), rows, b.scalar(1, rows)}), b.ints(along_axis(r, axis))});
  if (!indices.empty()) {
    std::vector<int64_t> per_batch(static_cast<size_t>(r), 1);
    per_batch[0] = -1;
    index = b.op("Add", {index, b.op("Reshape", {indices, b.ints(per_batch)})});
  }
  if (b.get_string("mode", "linear") == "circular") {
    const std::string past_shape = b.op("Shape", {b.I(0)});
    index = b.op("Mod", {index, b.op("Gather", {past_shape, b.scalar(static_cast<double>(axis), past_shape)})});
  }
  b.set_GI(1, b.op("GatherElements", {b.GO(0), b.op("Expand", {index, update_shape})}, {attr_int("axis", axis)}));
}

}  // namespace

std::vector<Rule> signal_rules() {
  constexpr uint32_t kIn0 = inputs_mask({0});
  // clang-format off
  return {
    {"", "DFT",               kIn0, false, dft_rule,              "dx = DFT^T dy, the adjoint transform (ai.onnxtrain.DFTGrad)"},
    {"", "Det",               kIn0, false, det_rule,              "dX = dY det(X) X^-T, cofactors where X is singular (ai.onnxtrain.DetGrad)"},
    {"", "CumProd",           kIn0, false, cumprod_rule,          "dx_j = sum_{i >= j} dy_i y_i / x_j before the first zero, the products skipping it at it, 0 after"},
    {"", "ReverseSequence",   kIn0, false, reverse_sequence_rule, "dx = ReverseSequence(dy)"},
    {"", "Compress",          kIn0, false, compress_rule,         "dx = dy scattered into zeros at the kept positions"},
    {"", "TensorScatter",     inputs_mask({0, 1}), false, tensor_scatter_rule,
                                                                  "dpast = dy with the written rows zeroed; dupdate = dy at the written rows"},
    {"", "NonZero",           0, false, nullptr, "integer output"},
    {"", "NonMaxSuppression", 0, false, nullptr, "integer output"},
    {"", "BitShift",          0, false, nullptr, "integer output"},
    {"", "BitwiseAnd",        0, false, nullptr, "integer output"},
    {"", "BitwiseOr",         0, false, nullptr, "integer output"},
    {"", "BitwiseXor",        0, false, nullptr, "integer output"},
    {"", "BitwiseNot",        0, false, nullptr, "integer output"},
    {"", "HannWindow",        0, false, nullptr, "depends only on a size"},
    {"", "HammingWindow",     0, false, nullptr, "depends only on a size"},
    {"", "BlackmanWindow",    0, false, nullptr, "depends only on a size"},
    {"", "MelWeightMatrix",   0, false, nullptr, "piecewise constant"},
    {kInternalDomain, "DFTGrad", inputs_mask({1}), false, dft_grad_rule, "d(dy) = DFT(g): the adjoint of the adjoint"},
    {kInternalDomain, "DetGrad", kAllInputs, false, det_grad_rule, "not twice differentiable"},
  };
  // clang-format on
}

}  // namespace onnxtrain::autodiff
