// MatMulInteger-10 and QLinearMatMul-10/21 (ONNX operator docs): numpy.matmul of quantized
// operands (1-D operands, batch broadcasting) with int32 accumulation that wraps on overflow
// ("accumulation may overflow if and only if in 32 bits").
//
//   MatMulInteger  Y (int32) = (A - a_zero_point) · (B - b_zero_point); zero points optional.
//   QLinearMatMul  y = saturate(round(((a - a_zp) · (b - b_zp)) * a_scale * b_scale / y_scale)
//                  + y_zp); y's type is y_zero_point's.
//
// Parameters of `a` are per tensor (one element) or per row: a vector of M elements for a 2-D
// a, or a tensor [..., M, 1]; those of `b` per tensor or per column: N elements, or
// [..., 1, N]; each must broadcast (numpy) to its operand. The multiplier a_scale * b_scale /
// y_scale is computed in the scales' type (float32, or float16/bfloat16 from version 21),
// rounding after each operation, and applied to the int32 sum in float64, rounding half to
// even. Version 21's float8 operands are dequantized (x - zero_point in float32), multiplied
// in float32, and the result converted to y's float8 type with saturation.
#include "ops/quantize.h"

#include <optional>

#include "ops/broadcast.h"
#include "ops/factories.h"
#include "ops/matmul_shape.h"
#include "ops/gemm_ref.h"
#include "ops/registry.h"

namespace onnxtrain::ops {

namespace {

// A row parameter given as a vector of M elements, seen as [M, 1] so that it broadcasts along
// the rows of a 2-D operand; every other parameter keeps its shape.
Tensor as_row_param(const Tensor& p, const Tensor& operand) {
  if (p.rank() == 1 && p.numel() > 1 && operand.rank() >= 2) return p.view(Shape{p.dim(0), 1});
  return p;
}

// Input `i` (a row parameter when `rows`) broadcast to `shape`; all zeros when absent.
std::vector<double> param_values(const KernelContext& ctx, int i, const Tensor& operand, bool rows,
                                 const Shape& shape) {
  if (!ctx.has_input(i)) return std::vector<double>(static_cast<size_t>(shape.numel()), 0.0);
  const Tensor& p = ctx.input(i);
  return expand_param(rows ? as_row_param(p, operand) : p, shape, ctx.input_name(i));
}

// operand - zero point, element-wise in the operand's shape, as T (int32 or float).
template <class T>
std::vector<T> centered(const KernelContext& ctx, int operand, int zero_point, bool rows) {
  const Tensor& x = ctx.input(operand);
  if (ctx.has_input(zero_point) && ctx.input(zero_point).dtype() != x.dtype()) {
    fail("input " + ctx.input_name(zero_point) + " is " + ctx.input(zero_point).description() +
         "; it must have the type of " + ctx.input_name(operand) + " (" + std::string(dtype_name(x.dtype())) + ")");
  }
  const std::vector<double> zp = param_values(ctx, zero_point, x, rows, x.shape());
  const std::vector<double> v = values_of(x);
  std::vector<T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<T>(v[i] - zp[i]);
  return out;
}

// (A - a_zp) · (B - b_zp) over the numpy.matmul shapes s, in T.
template <class T>
std::vector<T> product(const KernelContext& ctx, const MatMulShape& s, int a, int a_zp, int b, int b_zp) {
  const std::vector<T> av = centered<T>(ctx, a, a_zp, true);
  const std::vector<T> bv = centered<T>(ctx, b, b_zp, false);
  std::vector<T> y(static_cast<size_t>(s.out.numel()));
  const auto a_off = batch_offsets(s.a_batch, s.batch, s.M * s.K);
  const auto b_off = batch_offsets(s.b_batch, s.batch, s.K * s.N);
  batched_matmul_ref<T>(av.data(), a_off, bv.data(), b_off, y.data(), s.M, s.K, s.N);
  return y;
}

// One element of the scales' type TS, as a double, after rounding to TS.
double round_to(DataType ts, double v) {
  if (ts == DataType::Float16) return double(float(Float16(float(v))));
  if (ts == DataType::BFloat16) return double(float(BFloat16(float(v))));
  return double(float(v));
}

void check_types(const KernelContext& ctx, std::initializer_list<int> inputs, DTypeSet allowed,
                 const std::string& op) {
  for (int i : inputs) {
    if (!allowed.contains(ctx.input(i).dtype())) {
      fail("input " + ctx.input_name(i) + " is " + ctx.input(i).description() + "; " + op + " takes " +
           allowed.to_string());
    }
  }
}

}  // namespace

std::unique_ptr<Kernel> make_matmul_integer(const KernelInit&) {
  return make_kernel([](KernelContext& ctx) {
    check_types(ctx, {0, 1}, kInt8Quant, "MatMulInteger");
    const MatMulShape s = matmul_shape(ctx, 0, 1);
    const std::vector<int32_t> y = product<int32_t>(ctx, s, 0, 2, 1, 3);
    Tensor& out = ctx.allocate_output(0, DataType::Int32, s.out);
    std::copy(y.begin(), y.end(), out.data<int32_t>());
  });
}

std::unique_ptr<Kernel> make_qlinear_matmul(const KernelInit& init) {
  const int version = op_version("", "QLinearMatMul", init.opset());
  return make_kernel([version](KernelContext& ctx) {
    const std::string op = "QLinearMatMul-" + std::to_string(version);
    const DTypeSet quantized = version >= 21 ? kInt8Quant | kFloat8 : kInt8Quant;
    const DTypeSet scales = version >= 21 ? DTypeSet{DataType::Float32, DataType::Float16, DataType::BFloat16}
                                          : DTypeSet{DataType::Float32};
    check_types(ctx, {0, 3, 7}, quantized, op);
    check_types(ctx, {1, 4, 6}, scales, op);
    const DataType ts = ctx.input(1).dtype();
    if (ctx.input(4).dtype() != ts || ctx.input(6).dtype() != ts) {
      fail("inputs " + ctx.input_name(1) + ", " + ctx.input_name(4) + " and " + ctx.input_name(6) +
           " must have one type");
    }
    const MatMulShape s = matmul_shape(ctx, 0, 3);
    const std::vector<double> a_scale = param_values(ctx, 1, ctx.input(0), true, s.out);
    const std::vector<double> b_scale = param_values(ctx, 4, ctx.input(3), false, s.out);
    const std::vector<double> y_scale = param_values(ctx, 6, ctx.input(0), false, s.out);
    const std::vector<double> y_zero = param_values(ctx, 7, ctx.input(0), false, s.out);
    const bool floats = is_narrow_float(ctx.input(0).dtype()) || is_narrow_float(ctx.input(3).dtype());
    std::vector<double> acc(static_cast<size_t>(s.out.numel()));
    if (floats) {
      const auto p = product<float>(ctx, s, 0, 2, 3, 5);
      std::copy(p.begin(), p.end(), acc.begin());
    } else {
      const auto p = product<int32_t>(ctx, s, 0, 2, 3, 5);
      std::copy(p.begin(), p.end(), acc.begin());
    }
    const DataType out = ctx.input(7).dtype();
    Tensor& y = ctx.allocate_output(0, out, s.out);
    for (size_t i = 0; i < acc.size(); ++i) {
      const double multiplier = round_to(ts, round_to(ts, a_scale[i] * b_scale[i]) / y_scale[i]);
      acc[i] *= multiplier;
    }
    visit_dtype<TypeList<int8_t, uint8_t, Float8E4M3FN, Float8E4M3FNUZ, Float8E5M2, Float8E5M2FNUZ>>(
        out, "input " + ctx.input_name(7), [&]<class Y>() {
          Y* ys = y.data<Y>();
          for (size_t i = 0; i < acc.size(); ++i) {
            if constexpr (is_narrow_float_v<Y>) {
              ys[i] = Y(static_cast<float>(acc[i]) + static_cast<float>(y_zero[i]));
            } else {
              ys[i] = static_cast<Y>(saturate_round(acc[i], y_zero[i], quant_range(dtype_of<Y>)));
            }
          }
        });
  });
}

}  // namespace onnxtrain::ops
