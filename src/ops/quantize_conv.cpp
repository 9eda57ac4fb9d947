// ConvInteger-10 and QLinearConv-10 (ONNX operator docs): Conv (attributes auto_pad,
// dilations, group, kernel_shape, pads, strides, as Conv's; ops/conv_geometry.h) over quantized
// int8/uint8 tensors with int32 accumulation that wraps on overflow.
//
//   ConvInteger  y (int32) = conv(x - x_zero_point, w - w_zero_point); zero points optional.
//   QLinearConv  y = saturate(round((conv(x - x_zp, w - w_zp) + B) * x_scale * w_scale[m] /
//                y_scale) + y_zp), y of y_zero_point's type; B is an optional int32 bias [M].
//
// x's zero point and scale are per tensor; w's are per tensor or per output channel (1-D of M
// elements). The multiplier x_scale * w_scale / y_scale is computed in float32 and applied to
// the int32 sum in float64, rounding half to even. The convolution is conv_ref.h's im2col and
// matrix product in int32.
#include "ops/quantize.h"

#include "ops/conv_geometry.h"
#include "ops/factories.h"
#include "ops/registry.h"

namespace onnxtrain::ops {

namespace {

// operand - zero point as an int32 tensor of the operand's shape. The zero point is a scalar,
// or (per_channel) a 1-D tensor of one value per slice along dim 0.
Tensor centered(const KernelContext& ctx, int operand, int zero_point, bool per_channel) {
  const Tensor& x = ctx.input(operand);
  if (!kInt8Quant.contains(x.dtype())) {
    fail("input " + ctx.input_name(operand) + " is " + x.description() + ", expected int8 or uint8");
  }
  Tensor out(DataType::Int32, x.shape());
  const std::vector<double> v = values_of(x);
  std::vector<double> zp(1, 0.0);
  if (ctx.has_input(zero_point)) {
    const Tensor& z = ctx.input(zero_point);
    if (z.dtype() != x.dtype()) {
      fail("input " + ctx.input_name(zero_point) + " is " + z.description() + "; it must have the type of " +
           ctx.input_name(operand));
    }
    const bool channels = per_channel && z.rank() == 1 && x.rank() >= 1 && z.dim(0) == x.dim(0);
    if (z.numel() != 1 && !channels) {
      fail("input " + ctx.input_name(zero_point) + " " + z.shape().to_string() + " must be a scalar" +
           (per_channel ? " or a 1-D tensor of " + std::to_string(x.rank() ? x.dim(0) : 0) + " elements" : ""));
    }
    zp = values_of(z);
  }
  const int64_t slice = x.numel() / std::max<int64_t>(1, x.rank() ? x.dim(0) : 1);
  int32_t* o = out.data<int32_t>();
  for (size_t i = 0; i < v.size(); ++i) {
    const double z = zp.size() == 1 ? zp[0] : zp[i / static_cast<size_t>(slice)];
    o[i] = static_cast<int32_t>(v[i] - z);
  }
  return out;
}

// conv(x - x_zp, w - w_zp) [+ bias] as an int32 tensor [N, M, out...].
Tensor integer_conv(KernelContext& ctx, const ConvAttrs& attrs, int x, int x_zp, int w, int w_zp,
                    const Tensor* bias) {
  const Tensor xc = centered(ctx, x, x_zp, false);
  const Tensor wc = centered(ctx, w, w_zp, true);
  if (xc.rank() < 3) fail("input " + ctx.input_name(x) + " " + xc.shape().to_string() + " must have rank >= 3");
  const ConvGeometry g = resolve_conv_geometry(attrs, {xc, ctx.input_name(x)}, {wc, ctx.input_name(w)});
  if (bias && (bias->dtype() != DataType::Int32 || bias->rank() != 1 || bias->dim(0) != g.M)) {
    fail("input B is " + bias->description() + ", expected int32[" + std::to_string(g.M) + "]");
  }
  Tensor y(DataType::Int32, conv_output_shape(g));
  if (y.numel() > 0) {
    conv_reference<int32_t>(g, xc.data<int32_t>(), wc.data<int32_t>(), bias ? bias->data<int32_t>() : nullptr,
                            y.data<int32_t>());
  }
  return y;
}

float scalar_float(const KernelContext& ctx, int i) {
  const Tensor& t = ctx.input(i);
  if (t.dtype() != DataType::Float32 || t.numel() != 1) {
    fail("input " + ctx.input_name(i) + " is " + t.description() + ", expected a float32 scalar");
  }
  return t.data<float>()[0];
}

}  // namespace

std::unique_ptr<Kernel> make_conv_integer(const KernelInit& init) {
  const ConvAttrs attrs = parse_conv_attrs(init, false);
  return make_kernel([attrs](KernelContext& ctx) {
    ctx.set_output(0, integer_conv(ctx, attrs, 0, 2, 1, 3, nullptr));
  });
}

std::unique_ptr<Kernel> make_qlinear_conv(const KernelInit& init) {
  const ConvAttrs attrs = parse_conv_attrs(init, false);
  return make_kernel([attrs](KernelContext& ctx) {
    const Tensor* bias = ctx.has_input(8) ? &ctx.input(8) : nullptr;
    const Tensor acc = integer_conv(ctx, attrs, 0, 2, 3, 5, bias);
    const float x_scale = scalar_float(ctx, 1), y_scale = scalar_float(ctx, 6);
    const Tensor& w_scale = ctx.input(4);
    const int64_t M = acc.dim(1);
    if (w_scale.dtype() != DataType::Float32 || !(w_scale.numel() == 1 || (w_scale.rank() == 1 && w_scale.dim(0) == M))) {
      fail("input " + ctx.input_name(4) + " is " + w_scale.description() + ", expected float32 scalar or [" +
           std::to_string(M) + "]");
    }
    const DataType out = ctx.input(7).dtype();
    if (!kInt8Quant.contains(out) || ctx.input(7).numel() != 1) {
      fail("input " + ctx.input_name(7) + " is " + ctx.input(7).description() + ", expected an int8 or uint8 scalar");
    }
    const double y_zero = values_of(ctx.input(7))[0];
    std::vector<double> multiplier(static_cast<size_t>(M));
    for (int64_t m = 0; m < M; ++m) {
      const float ws = w_scale.data<float>()[w_scale.numel() == 1 ? 0 : m];
      multiplier[static_cast<size_t>(m)] = double(x_scale * ws / y_scale);
    }
    const int64_t spatial = M ? acc.numel() / (acc.dim(0) * M) : 0;
    const int32_t* a = acc.data<int32_t>();
    Tensor& y = ctx.allocate_output(0, out, acc.shape());
    visit_dtype<TypeList<int8_t, uint8_t>>(out, "output", [&]<class Y>() {
      Y* ys = y.data<Y>();
      const IntRange range = quant_range(out);
      for (int64_t i = 0; i < acc.numel(); ++i) {
        const double m = multiplier[static_cast<size_t>((i / std::max<int64_t>(1, spatial)) % M)];
        ys[i] = static_cast<Y>(saturate_round(double(a[i]) * m, y_zero, range));
      }
    });
  });
}

}  // namespace onnxtrain::ops
