// Gradient rules of reductions, shape and indexing ops (see rules.cpp for the conventions).
#include <limits>

#include "autodiff/gradient.h"
#include "autodiff/rules_common.h"
#include "onnxtrain/error.h"
#include "ops/data_movement.h"

namespace onnxtrain::autodiff {

namespace {

// ---- reductions ----
// Whether the node takes its axes as input 1: ReduceSum from opset 13, the others from 18.
bool axes_from_input(Builder& b) { return b.opset() >= (b.node().op_type() == "ReduceSum" ? 13 : 18); }

// The attribute axes of a Reduce* node (empty: all axes).
std::vector<int64_t> attr_axes(Builder& b) { return b.get_ints("axes").value_or(std::vector<int64_t>{}); }

// `g`, shaped like the reduction's output, with the reduced dims restored as 1s so that it
// broadcasts against the input. With the axes input omitted, the node reduced all axes (g is a
// scalar) or, with noop_with_empty_axes, none (g is shaped like x); an empty axes input is the
// same, and Unsqueeze with no axes leaves g as it is.
std::string kept(Builder& b, const std::string& g) {
  if (b.get_int("keepdims", 1) != 0) return g;
  if (axes_from_input(b)) return b.has_input(1) ? b.op("Unsqueeze", {g, b.I(1)}) : g;
  const std::vector<int64_t> axes = attr_axes(b);
  return axes.empty() ? g : b.unsqueeze(g, axes);  // all axes reduced: g is a scalar
}

// Sums `x` over the node's reduced axes, keeping them (none with noop_with_empty_axes and no
// axes: ReduceSum-13 reads the attribute the same way).
std::string sum_over_reduced(Builder& b, const std::string& x) {
  if (axes_from_input(b)) {
    std::vector<std::string> inputs{x};
    if (b.has_input(1)) inputs.push_back(b.I(1));
    return b.op("ReduceSum", inputs,
                {attr_int("keepdims", 1), attr_int("noop_with_empty_axes", b.get_int("noop_with_empty_axes", 0))});
  }
  return b.reduce_sum(x, attr_axes(b), true);
}

void reduce_sum_rule(Builder& b) { b.set_GI(0, expand_like(b, kept(b, b.GO(0)), b.I(0))); }
void reduce_mean_rule(Builder& b) {
  const std::string g = expand_like(b, kept(b, b.GO(0)), b.I(0));
  b.set_GI(0, div(b, mul(b, g, numel_as(b, b.O(0), b.I(0))), numel_as(b, b.I(0), b.I(0))));
}
void reduce_sum_square_rule(Builder& b) {
  b.set_GI(0, mul(b, mul(b, b.I(0), b.scalar(2, b.I(0))), kept(b, b.GO(0))));
}
void reduce_l1_rule(Builder& b) { b.set_GI(0, mul(b, b.op("Sign", {b.I(0)}), kept(b, b.GO(0)))); }
void reduce_l2_rule(Builder& b) { b.set_GI(0, mul(b, b.I(0), div(b, kept(b, b.GO(0)), kept(b, b.O(0))))); }
void reduce_log_sum_rule(Builder& b) {
  // y = log(sum x): dx = dy / sum x = dy e^(-y)
  b.set_GI(0, expand_like(b, div(b, kept(b, b.GO(0)), b.op("Exp", {kept(b, b.O(0))})), b.I(0)));
}
void reduce_log_sum_exp_rule(Builder& b) {
  // y = log(sum e^x): dx = dy e^(x - y)
  b.set_GI(0, mul(b, kept(b, b.GO(0)), b.op("Exp", {sub(b, b.I(0), kept(b, b.O(0)))})));
}
void reduce_max_min_rule(Builder& b) {
  // The gradient is shared equally by the elements equal to the result (PyTorch's amax rule).
  const std::string mask = cast_to(b, bin(b, "Equal", b.I(0), kept(b, b.O(0))), b.dtype(b.I(0)));
  b.set_GI(0, mul(b, mask, div(b, kept(b, b.GO(0)), sum_over_reduced(b, mask))));
}
void reduce_prod_rule(Builder& b) {
  // dx_i = dy prod_{j != i} x_j = dy y / x_i (inputs must be non-zero).
  b.set_GI(0, div(b, mul(b, kept(b, b.GO(0)), kept(b, b.O(0))), b.I(0)));
}
void cumsum_rule(Builder& b) {
  // The adjoint of a running sum is the running sum in the other direction.
  b.set_GI(0, b.op("CumSum", {b.GO(0), b.I(1)},
                   {attr_int("exclusive", b.get_int("exclusive", 0)),
                    attr_int("reverse", b.get_int("reverse", 0) ? 0 : 1)}));
}

// ---- shape ----
void reshape_like_input_rule(Builder& b) {
  if (b.opset() < 5) throw Error("the gradient of " + b.node().op_type() + " needs opset 5 or later (Reshape with a shape input)");
  b.set_GI(0, b.op("Reshape", {b.GO(0), b.op("Shape", {b.I(0)})}));
}
void transpose_rule(Builder& b) {
  const auto perm = b.get_ints("perm");
  if (!perm) return b.set_GI(0, b.op("Transpose", {b.GO(0)}));  // reversing is its own inverse
  b.set_GI(0, b.op("Transpose", {b.GO(0)}, {attr_ints("perm", ops::inverse_permutation(*perm))}));
}
// A Slice of `x` from `start` to `end` (1-D int64 tensors) along `axis`.
std::string slice_axis(Builder& b, const std::string& x, const std::string& start, const std::string& end, int64_t axis) {
  return b.op("Slice", {x, start, end, b.ints({axis})});
}
void concat_rule(Builder& b) {
  // Each input's gradient is its slice of dy along the axis.
  if (b.opset() < 10) throw Error("the gradient of Concat needs opset 10 or later (Slice with inputs)");
  const int64_t axis = b.get_int("axis", 0);
  std::string offset = b.ints({0});
  for (int i = 0; i < b.num_inputs(); ++i) {
    const std::string size = b.op("Gather", {b.op("Shape", {b.I(i)}), b.ints({axis})});
    const std::string end = b.op("Add", {offset, size});
    if (b.needs(i)) b.set_GI(i, slice_axis(b, b.GO(0), offset, end, axis));
    offset = end;
  }
}
void split_rule(Builder& b) {
  std::vector<std::string> parts;
  for (int i = 0; i < b.num_outputs(); ++i) parts.push_back(b.GO(i));
  b.set_GI(0, b.op("Concat", parts, {attr_int("axis", b.get_int("axis", 0))}));
}
void expand_rule(Builder& b) { b.set_GI(0, b.GO(0)); }  // the engine sums it back to the input's shape
void tile_rule(Builder& b) {
  // dy viewed as [r0, d0, r1, d1, ...] and summed over the repeat dims.
  const int r = b.require_rank(b.I(0));
  const std::string reps = b.unsqueeze(b.I(1), {1});
  const std::string dims = b.unsqueeze(b.op("Shape", {b.I(0)}), {1});
  const std::string interleaved = b.op("Reshape", {b.op("Concat", {reps, dims}, {attr_int("axis", 1)}), b.ints({-1})});
  std::vector<int64_t> axes;
  for (int d = 0; d < r; ++d) axes.push_back(2 * d);
  b.set_GI(0, b.reduce_sum(b.op("Reshape", {b.GO(0), interleaved}), axes, false));
}
void pad_rule(Builder& b) {
  // Constant padding: dx is dy padded by the negated pads (constant 0), which removes what was
  // added and puts zeros where the forward removed elements. From opset 18 the pads may apply
  // to the axes of input 3 only; the backward Pad takes the same axes.
  if (b.get_string("mode", "constant") != "constant") {
    throw Error("the gradient of Pad supports mode 'constant' only, not '" + b.get_string("mode", "") + "'");
  }
  if (b.opset() >= 11) {
    std::vector<std::string> inputs{b.GO(0), neg(b, b.I(1))};
    if (b.opset() >= 18 && b.has_input(3)) inputs.insert(inputs.end(), {"", b.I(3)});
    return b.set_GI(0, b.op("Pad", inputs));
  }
  // Pad-1/2: pads must be non-negative.
  const int r = b.require_rank(b.I(0));
  std::vector<int64_t> all_axes;
  for (int d = 0; d < r; ++d) all_axes.push_back(d);
  const std::vector<int64_t> pads = b.get_ints(b.opset() < 2 ? "paddings" : "pads").value_or(std::vector<int64_t>{});
  if (pads.size() != static_cast<size_t>(2 * r)) throw Error("Pad's pads do not match the input's rank");
  std::vector<int64_t> starts, ends;
  for (int d = 0; d < r; ++d) {
    starts.push_back(pads[static_cast<size_t>(d)]);
    const int64_t e = pads[static_cast<size_t>(r + d)];
    ends.push_back(e == 0 ? std::numeric_limits<int64_t>::max() : -e);
  }
  if (b.opset() >= 10) return b.set_GI(0, b.op("Slice", {b.GO(0), b.ints(starts), b.ints(ends), b.ints(all_axes)}));
  b.set_GI(0, b.op("Slice", {b.GO(0)}, {attr_ints("starts", starts), attr_ints("ends", ends), attr_ints("axes", all_axes)}));
}

// ---- indexing ----
void slice_rule(Builder& b) {
  // dx = zeros shaped like x with dy written where the slice took its elements
  // (ai.onnxtrain.SliceGrad; Slice-1's attributes become its constant inputs).
  std::vector<std::string> inputs{b.GO(0), b.op("Shape", {b.I(0)})};
  if (b.opset() >= 10) {
    for (int i = 1; i < b.num_inputs(); ++i) inputs.push_back(b.has_input(i) ? b.I(i) : "");
  } else {
    inputs.push_back(b.ints(b.get_ints("starts").value_or(std::vector<int64_t>{})));
    inputs.push_back(b.ints(b.get_ints("ends").value_or(std::vector<int64_t>{})));
    if (const auto axes = b.get_ints("axes")) inputs.push_back(b.ints(*axes));
  }
  b.set_GI(0, b.op("SliceGrad", inputs, {}, kInternalDomain));
}
void gather_rule(Builder& b) {
  b.set_GI(0, b.op("GatherGrad", {b.GO(0), b.I(1), b.op("Shape", {b.I(0)})}, {attr_int("axis", b.get_int("axis", 0))},
                   kInternalDomain));
}
void gather_elements_rule(Builder& b) {
  b.set_GI(0, b.op("GatherElementsGrad", {b.GO(0), b.I(1), b.op("Shape", {b.I(0)})},
                   {attr_int("axis", b.get_int("axis", 0))}, kInternalDomain));
}
void gather_nd_rule(Builder& b) {
  b.set_GI(0, b.op("GatherNDGrad", {b.GO(0), b.I(1), b.op("Shape", {b.I(0)})},
                   {attr_int("batch_dims", b.get_int("batch_dims", 0))}, kInternalDomain));
}
void scatter_rule(Builder& b) {
  // Overwritten positions of data get no gradient (reduction none); updates get dy there.
  const bool nd = b.node().op_type() == "ScatterND";
  // Scatter (opsets 9-10) predates GatherElements: use onnxtrain's alias of it there.
  const bool legacy = b.node().op_type() == "Scatter";
  const std::string reduction = b.get_string("reduction", "none");
  std::vector<onnx::AttributeProto> axis;
  if (!nd) axis.push_back(attr_int("axis", b.get_int("axis", 0)));
  const std::string gather = nd ? "GatherND" : "GatherElements";
  if (reduction == "max" || reduction == "min") {
    // y = the extreme of data and the updates aimed at each position: the gradient is shared
    // equally by every contributor equal to y (PyTorch's scatter_reduce amax/amin rule).
    const DataType t = b.dtype(b.I(0));
    const std::string data_wins = cast_to(b, bin(b, "Equal", b.I(0), b.O(0)), t);
    const std::string update_wins =
        cast_to(b, bin(b, "Equal", b.I(2), b.op(gather, {b.O(0), b.I(1)}, axis)), t);
    std::vector<onnx::AttributeProto> summed = axis;
    summed.push_back(attr_string("reduction", "add"));
    const std::string count =
        add(b, data_wins, b.op(b.node().op_type(), {b.zeros_like(b.I(0)), b.I(1), update_wins}, summed));
    const std::string share = div(b, b.GO(0), count);
    if (b.needs(0)) b.set_GI(0, mul(b, share, data_wins));
    if (b.needs(2)) b.set_GI(2, mul(b, b.op(gather, {share, b.I(1)}, axis), update_wins));
    return;
  }
  if (reduction != "none" && reduction != "add") {
    throw Error("the gradient of " + b.node().op_type() + " supports reduction 'none', 'add', 'max' and 'min', not '" +
                reduction + "'");
  }
  if (b.needs(0)) {
    b.set_GI(0, reduction == "add" ? b.GO(0)
                                    : b.op(b.node().op_type(), {b.GO(0), b.I(1), b.zeros_like(b.I(2))}, axis));
  }
  if (b.needs(2)) b.set_GI(2, b.op(gather, {b.GO(0), b.I(1)}, axis, legacy ? kInternalDomain : ""));
}
void trilu_rule(Builder& b) {
  std::vector<std::string> inputs{b.GO(0)};
  if (b.has_input(1)) inputs.push_back(b.I(1));
  b.set_GI(0, b.op("Trilu", inputs, {attr_int("upper", b.get_int("upper", 1))}));
}
// DepthToSpace and SpaceToDepth are permutations and each other's inverse in the same mode;
// SpaceToDepth has a mode (CRD) only from opset 28.
void depth_to_space_rule(Builder& b) {
  const std::string mode = b.opset() >= 11 ? b.get_string("mode", "DCR") : "DCR";
  std::vector<onnx::AttributeProto> attrs{attr_int("blocksize", b.get_int("blocksize", 1))};
  if (mode != "DCR") {
    if (b.opset() < 28) throw Error("the gradient of DepthToSpace in mode " + mode + " needs opset 28 or later (SpaceToDepth's mode)");
    attrs.push_back(attr_string("mode", mode));
  }
  b.set_GI(0, b.op("SpaceToDepth", {b.GO(0)}, attrs));
}
void space_to_depth_rule(Builder& b) {
  std::vector<onnx::AttributeProto> attrs{attr_int("blocksize", b.get_int("blocksize", 1))};
  if (b.opset() >= 28) attrs.push_back(attr_string("mode", b.get_string("mode", "DCR")));
  b.set_GI(0, b.op("DepthToSpace", {b.GO(0)}, attrs));
}
void topk_rule(Builder& b) {
  // The values' gradient goes back to the positions the indices name.
  if (b.opset() < 11) throw Error("the gradient of TopK needs opset 11 or later (ScatterElements)");
  b.set_GI(0, b.op("ScatterElements", {b.zeros_like(b.I(0)), b.O(1), b.GO(0)},
                   {attr_int("axis", b.get_int("axis", -1))}));
}

}  // namespace

std::vector<Rule> shape_rules() {
  constexpr uint32_t kIn0 = inputs_mask({0});
  // clang-format off
  return {
    {"", "ReduceSum",          kIn0, false, reduce_sum_rule,         "dx = dy broadcast over the reduced axes"},
    {"", "ReduceMean",         kIn0, false, reduce_mean_rule,        "dx = dy / n broadcast"},
    {"", "ReduceSumSquare",    kIn0, false, reduce_sum_square_rule,  "dx = 2 x dy"},
    {"", "ReduceL1",           kIn0, false, reduce_l1_rule,          "dx = sign(x) dy"},
    {"", "ReduceL2",           kIn0, false, reduce_l2_rule,          "dx = x dy / y"},
    {"", "ReduceLogSum",       kIn0, false, reduce_log_sum_rule,     "dx = dy e^(-y)"},
    {"", "ReduceLogSumExp",    kIn0, false, reduce_log_sum_exp_rule, "dx = dy e^(x - y)"},
    {"", "ReduceMax",          kIn0, false, reduce_max_min_rule,     "dx = dy / count where x == y"},
    {"", "ReduceMin",          kIn0, false, reduce_max_min_rule,     "dx = dy / count where x == y"},
    {"", "ReduceProd",         kIn0, false, reduce_prod_rule,        "dx = dy y / x (x non-zero)"},
    {"", "CumSum",             kIn0, false, cumsum_rule,             "dx = CumSum(dy) in the other direction"},
    {"", "Reshape",            kIn0, false, reshape_like_input_rule, "dx = reshape(dy, shape(x))"},
    {"", "Flatten",            kIn0, false, reshape_like_input_rule, "dx = reshape(dy, shape(x))"},
    {"", "Squeeze",            kIn0, false, reshape_like_input_rule, "dx = reshape(dy, shape(x))"},
    {"", "Unsqueeze",          kIn0, false, reshape_like_input_rule, "dx = reshape(dy, shape(x))"},
    {"", "Transpose",          kIn0, false, transpose_rule,          "dx = transpose(dy, inverse perm)"},
    {"", "Concat",             kAllInputs, false, concat_rule,       "dx_i = slice i of dy along axis"},
    {"", "Split",              kIn0, false, split_rule,              "dx = concat(dy_i) along axis"},
    {"", "Expand",             kIn0, true,  expand_rule,             "dx = dy summed to shape(x)"},
    {"", "Tile",               kIn0, false, tile_rule,               "dx = dy summed over the tiles"},
    {"", "Pad",                kIn0, false, pad_rule,                "dx = Pad(dy, -pads) (constant mode): dy without the padding, zeros where it cropped"},
    {"", "Slice",              kIn0, false, slice_rule,              "dx = zeros with dy written at the sliced positions (ai.onnxtrain.SliceGrad)"},
    {"", "Gather",             kIn0, false, gather_rule,             "dx = scatter-add of dy at indices (ai.onnxtrain.GatherGrad)"},
    {"", "GatherElements",     kIn0, false, gather_elements_rule,    "dx = scatter-add of dy (ai.onnxtrain.GatherElementsGrad)"},
    {"", "GatherND",           kIn0, false, gather_nd_rule,          "dx = scatter-add of dy (ai.onnxtrain.GatherNDGrad)"},
    {"", "ScatterElements",    inputs_mask({0, 2}), false, scatter_rule,
                               "ddata = dy with scattered positions zeroed; dupdates = gather(dy) (add: ddata = dy; max/min: dy shared by the contributors equal to y)"},
    {"", "Scatter",            inputs_mask({0, 2}), false, scatter_rule, "as ScatterElements (its opset 9-10 name)"},
    {"", "ScatterND",          inputs_mask({0, 2}), false, scatter_rule,
                               "ddata = dy with scattered positions zeroed; dupdates = gather(dy) (add: ddata = dy; max/min: dy shared by the contributors equal to y)"},
    {"", "Trilu",              kIn0, false, trilu_rule,              "dx = Trilu(dy)"},
    {"", "DepthToSpace",       kIn0, false, depth_to_space_rule,     "dx = SpaceToDepth(dy) in the same mode (CRD from opset 28)"},
    {"", "SpaceToDepth",       kIn0, false, space_to_depth_rule,     "dx = DepthToSpace(dy) in the same mode"},
    {"", "TopK",               kIn0, false, topk_rule,               "dx = dy scattered at the indices"},
    {"", "Shape",              0, false, nullptr, "integer output"},
    {"", "Size",               0, false, nullptr, "integer output"},
    {"", "ArgMax",             0, false, nullptr, "integer output"},
    {"", "ArgMin",             0, false, nullptr, "integer output"},
    {"", "Constant",           0, false, nullptr, "no inputs"},
    {"", "ConstantOfShape",    0, false, nullptr, "depends only on a shape"},
    {"", "Range",              0, false, nullptr, "not differentiated"},
    {"", "EyeLike",            0, false, nullptr, "depends only on a shape"},
    {"", "OneHot",             0, false, nullptr, "piecewise constant"},
    {"", "Hardmax",            0, false, nullptr, "piecewise constant"},
  };
  // clang-format on
}

}  // namespace onnxtrain::autodiff
