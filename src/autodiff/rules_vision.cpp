// Gradient rules of the vision and neural-network ops of src/ops/{lrn,lp,grid_sample,roi_align,
// unpool,deform_conv,vision}.cpp (see rules.cpp for the conventions). Most emit the op's
// ai.onnxtrain backward op (<Op>Grad, with the forward node's attributes), whose derivation is in
// its kernel's header comment; LpNormalization and MeanVarianceNormalization emit ONNX ops,
// CenterCropPad itself, Upsample the ResizeGrad of the equivalent Resize.
#include "autodiff/gradient.h"
#include "autodiff/rules_common.h"
#include "onnxtrain/error.h"

namespace onnxtrain::autodiff {

namespace {

// Rules that emit `type`(dY, the forward inputs `inputs`) -> gradient of input 0.
void backward_op(Builder& b, const std::string& type, const std::vector<std::string>& inputs,
                 std::vector<onnx::AttributeProto> attrs) {
  std::vector<std::string> in{b.GO(0)};
  in.insert(in.end(), inputs.begin(), inputs.end());
  b.set_GI(0, b.op(type, in, attrs, kInternalDomain));
}

void lrn_rule(Builder& b) { backward_op(b, "LRNGrad", {b.I(0)}, forward_attributes(b)); }
void lp_pool_rule(Builder& b) { backward_op(b, "LpPoolGrad", {b.I(0), b.O(0)}, forward_attributes(b)); }
void max_unpool_rule(Builder& b) { backward_op(b, "MaxUnpoolGrad", {b.I(0), b.I(1)}, forward_attributes(b)); }
void col2im_rule(Builder& b) { backward_op(b, "Col2ImGrad", {b.I(1), b.I(2)}, forward_attributes(b)); }
void roi_align_rule(Builder& b) {
  std::vector<onnx::AttributeProto> attrs = forward_attributes(b);
  // RoiAlign-10 has no coordinate_transformation_mode and behaves as output_half_pixel;
  // RoiAlignGrad defaults to half_pixel, RoiAlign-16's default.
  if (b.opset() < 16 && !b.attr("coordinate_transformation_mode")) {
    attrs.push_back(attr_string("coordinate_transformation_mode", "output_half_pixel"));
  }
  backward_op(b, "RoiAlignGrad", {b.I(0), b.I(1), b.I(2)}, attrs);
}
void affine_grid_rule(Builder& b) { backward_op(b, "AffineGridGrad", {b.I(1)}, forward_attributes(b)); }

void grid_sample_rule(Builder& b) {
  const std::vector<bool> wanted{b.needs(0), b.needs(1)};
  const auto g = b.op_n("GridSampleGrad", {b.GO(0), b.I(0), b.I(1)}, 2, forward_attributes(b), kInternalDomain, wanted);
  for (int i = 0; i < 2; ++i) {
    if (wanted[static_cast<size_t>(i)]) b.set_GI(i, g[static_cast<size_t>(i)]);
  }
}

void deform_conv_rule(Builder& b) {
  // DeformConvGrad(dY, X, W, offset, mask) -> (dX, dW, doffset, dB, dmask), in input order.
  std::vector<bool> wanted(5);
  for (int i = 0; i < 5; ++i) wanted[static_cast<size_t>(i)] = b.has_input(i) && b.needs(i);
  const std::string mask = b.has_input(4) ? b.I(4) : "";
  std::vector<std::string> in{b.GO(0), b.I(0), b.I(1), b.I(2)};
  if (!mask.empty()) in.push_back(mask);
  const auto g = b.op_n("DeformConvGrad", in, 5, forward_attributes(b), kInternalDomain, wanted);
  for (int i = 0; i < 5; ++i) {
    if (wanted[static_cast<size_t>(i)]) b.set_GI(i, g[static_cast<size_t>(i)]);
  }
}

void center_crop_pad_rule(Builder& b) {
  // Cropping and centered zero padding are each other's transposes with the same offsets
  // (floor((long - short) / 2) on both sides): dX = CenterCropPad(dY, shape(X)) on every axis.
  b.set_GI(0, b.op("CenterCropPad", {b.GO(0), b.op("Shape", {b.I(0)})}));
}

void upsample_rule(Builder& b) {
  // Upsample is Resize with asymmetric coordinates and floor rounding (ops/vision.cpp).
  std::string scales;
  if (b.has_input(1)) {
    scales = b.I(1);
  } else {  // Upsample-7: the scales attribute as a float constant
    const onnx::AttributeProto* a = b.attr("scales");
    if (!a) throw Error("Upsample node '" + b.node().name() + "' has no scales");
    onnx::TensorProto t;
    t.set_data_type(onnx::TensorProto::FLOAT);
    t.add_dims(a->floats_size());
    for (float f : a->floats()) t.add_float_data(f);
    scales = b.op("Constant", {}, {attr_tensor("value", t)});
  }
  b.set_GI(0, b.op("ResizeGrad", {b.GO(0), b.I(0), "", scales},
                   {attr_string("mode", b.get_string("mode", "nearest")),
                    attr_string("coordinate_transformation_mode", "asymmetric"), attr_string("nearest_mode", "floor")},
                   kInternalDomain));
}

// ---- normalization by ONNX ops ----
std::string sign(Builder& b, const std::string& x) {
  if (b.opset() >= 9) return b.op("Sign", {x});
  const std::string zero = b.scalar(0, x);
  return sub(b, cast_to(b, bin(b, "Greater", x, zero), b.dtype(x)), cast_to(b, bin(b, "Less", x, zero), b.dtype(x)));
}
void lp_normalization_rule(Builder& b) {
  // y = x / n along the axis, n = ||x||_p: dx = (dy - s sum(dy y)) / n with s = y (p = 2) or
  // sign(x) (p = 1); 0 where n = 0 (y is 0 there).
  const std::string x = b.I(0), y = b.O(0), g = b.GO(0);
  const std::vector<int64_t> axis{b.get_int("axis", -1)};
  const bool l1 = b.get_int("p", 2) == 1;
  const std::string norm =
      l1 ? b.reduce_sum(b.op("Abs", {x}), axis, true) : b.op("Sqrt", {b.reduce_sum(mul(b, x, x), axis, true)});
  const std::string inner = sub(b, g, mul(b, l1 ? sign(b, x) : y, b.reduce_sum(mul(b, g, y), axis, true)));
  b.set_GI(0, where_or_zero(b, bin(b, "Greater", norm, b.scalar(0, norm)), div(b, inner, norm)));
}
std::string reduce_mean(Builder& b, const std::string& x, const std::vector<int64_t>& axes) {
  if (b.opset() >= 18) return b.op("ReduceMean", {x, b.ints(axes)}, {attr_int("keepdims", 1)});
  return b.op("ReduceMean", {x}, {attr_ints("axes", axes), attr_int("keepdims", 1)});
}
void mvn_rule(Builder& b) {
  // y = xc / (sigma + 1e-9), xc = x - mean(x), sigma = sqrt(mean(xc^2)):
  // dx = (dy - mean(dy) - xc / sigma mean(dy y)) / (sigma + 1e-9).
  std::vector<int64_t> axes = b.get_ints("axes").value_or(std::vector<int64_t>{0, 2, 3});
  const std::string x = b.I(0), y = b.O(0), g = b.GO(0);
  for (int64_t& a : axes) {
    if (a < 0) a += b.require_rank(x);  // ReduceMean takes negative axes only from opset 11
  }
  const std::string xc = sub(b, x, reduce_mean(b, x, axes));
  const std::string sigma = b.op("Sqrt", {reduce_mean(b, mul(b, xc, xc), axes)});
  const std::string inner = sub(b, sub(b, g, reduce_mean(b, g, axes)), mul(b, div(b, xc, sigma), reduce_mean(b, mul(b, g, y), axes)));
  b.set_GI(0, div(b, inner, add(b, sigma, b.scalar(1e-9, x))));
}

// The rule of a backward op without a gradient of its own.
void no_second_derivative(Builder& b) {
  const std::string& type = b.node().op_type();
  throw Error(type + " (the backward op of " + type.substr(0, type.size() - 4) + ") is not differentiable: second derivatives through " +
              type.substr(0, type.size() - 4) + " are not supported");
}

}  // namespace

std::vector<Rule> vision_rules() {
  constexpr uint32_t kIn0 = inputs_mask({0});
  constexpr const char* kNone = "not twice differentiable";
  // clang-format off
  return {
    {"", "LRN",                  kIn0, false, lrn_rule,          "dx = dy s^-beta - 2 alpha beta / size x sum over windows of dy x s^(-beta-1) (ai.onnxtrain.LRNGrad)"},
    {"", "LpPool",               kIn0, false, lp_pool_rule,      "dx = dy |x|^(p-1) sign(x) / y^(p-1) per window (ai.onnxtrain.LpPoolGrad)"},
    {"", "LpNormalization",      kIn0, false, lp_normalization_rule, "dx = (dy - s sum(dy y)) / ||x||_p, s = y (p = 2) or sign(x) (p = 1); 0 where the norm is 0"},
    {"", "MeanVarianceNormalization", kIn0, false, mvn_rule,     "dx = (dy - mean(dy) - xhat mean(dy y)) / (sigma + 1e-9)"},
    {"", "GridSample",           inputs_mask({0, 1}), false, grid_sample_rule,
                                 "dX: dy spread by the interpolation weights; dgrid: the weights' derivatives against X (ai.onnxtrain.GridSampleGrad)"},
    {"", "AffineGrid",           kIn0, false, affine_grid_rule,  "dtheta = sum over positions of dgrid (x, y[, z], 1)^T (ai.onnxtrain.AffineGridGrad)"},
    {"", "RoiAlign",             kIn0, false, roi_align_rule,    "dX: dy spread by the bilinear weights (avg) or to the maximum's corner (max) (ai.onnxtrain.RoiAlignGrad)"},
    {"", "MaxUnpool",            kIn0, false, max_unpool_rule,   "dX = dy at the position each element was written to (ai.onnxtrain.MaxUnpoolGrad)"},
    {"", "DeformConv",           inputs_mask({0, 1, 2, 3, 4}), false, deform_conv_rule,
                                 "dX, dW, doffset, dB, dmask through the im2col of the samples (ai.onnxtrain.DeformConvGrad)"},
    {"", "Col2Im",               kIn0, false, col2im_rule,       "dinput = im2col(dy) (ai.onnxtrain.Col2ImGrad)"},
    {"", "CenterCropPad",        kIn0, false, center_crop_pad_rule, "dx = CenterCropPad(dy, shape(x))"},
    {"", "Upsample",             kIn0, false, upsample_rule,     "dx = the interpolation's transpose (ai.onnxtrain.ResizeGrad, asymmetric, floor)"},
    {kInternalDomain, "AffineGridGrad", kAllInputs, false, no_second_derivative, kNone},
    {kInternalDomain, "Col2ImGrad",     kAllInputs, false, no_second_derivative, kNone},
    {kInternalDomain, "LRNGrad",        kAllInputs, false, no_second_derivative, kNone},
    {kInternalDomain, "LpPoolGrad",     kAllInputs, false, no_second_derivative, kNone},
    {kInternalDomain, "GridSampleGrad", kAllInputs, false, no_second_derivative, kNone},
    {kInternalDomain, "RoiAlignGrad",   kAllInputs, false, no_second_derivative, kNone},
    {kInternalDomain, "MaxUnpoolGrad",  kAllInputs, false, no_second_derivative, kNone},
    {kInternalDomain, "DeformConvGrad", kAllInputs, false, no_second_derivative, kNone},
  };
  // clang-format on
}

}  // namespace onnxtrain::autodiff
