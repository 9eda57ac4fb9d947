// QuantizeLinear, DequantizeLinear (versions 10, 13, 19, 21, 23, 24, 25, 28) and
// DynamicQuantizeLinear-11 (ONNX operator docs of each version):
//
//   QuantizeLinear    y = saturate(round(x / y_scale) + y_zero_point) for integer y (round half
//                     to even, saturate to the type's range); y = convert(x / y_scale + zero_point)
//                     for float8 (rounding to nearest even, `saturate` as Cast), float4e2m1 and
//                     float6 (always saturating; dtype.h). y's type: y_zero_point's, else
//                     `output_dtype` (21+), else uint8.
//   DequantizeLinear  y = (x - x_zero_point) * x_scale; y's type: `output_dtype` (23+), else
//                     x_scale's (float32 before 19).
//
// Granularity (scale and zero point have one shape): a scalar (or one-element 1-D tensor) is
// per tensor; a 1-D tensor of x.shape[axis] elements is per axis (13+); with `block_size` B
// (21+) the scale has x's shape but ceil(x.shape[axis] / B) along `axis`, each scale covering B
// consecutive elements there (blocked).
//
// Precision: QuantizeLinear divides in the type of y_scale, or of `precision` (23+): x and the
// scale are converted to it, and the quotient is rounded to it (float32, float16, bfloat16; an
// int32 precision converts both to int32 and divides exactly, as the reference does); a
// float8e8m0 scale (24+) divides in float32. DequantizeLinear subtracts exactly (integers) or in
// float32 (float8, float4, float6), multiplies in float32 and rounds to y's type.
// Saturation tables of Cast apply to float8 y: versions 19 to 23 turn +-Inf into NaN for the
// FNUZ kinds, 24+ into +-max (Cast-19 vs Cast-24 docs).
#include "ops/quantize.h"

#include <algorithm>
#include <optional>

#include "core/parallel.h"
#include "ops/broadcast.h"
#include "ops/factories.h"
#include "ops/registry.h"

namespace onnxtrain::ops {

IntRange quant_range(DataType dtype) {
  switch (dtype) {
    case DataType::Int8: return {-128, 127};
    case DataType::UInt8: return {0, 255};
    case DataType::Int16: return {-32768, 32767};
    case DataType::UInt16: return {0, 65535};
    case DataType::Int4: return {Int4::min, Int4::max};
    case DataType::UInt4: return {UInt4::min, UInt4::max};
    case DataType::Int2: return {Int2::min, Int2::max};
    case DataType::UInt2: return {UInt2::min, UInt2::max};
    default: throw Error(std::string(dtype_name(dtype)) + " is not a quantized integer type");
  }
}

bool is_quant_integer(DataType dtype) {
  return dtype == DataType::Int8 || dtype == DataType::UInt8 || dtype == DataType::Int16 ||
         dtype == DataType::UInt16 || is_sub_byte_integral(dtype);
}

std::vector<double> values_of(const Tensor& t) { return t.to_double_vector(); }

std::vector<double> expand_param(const Tensor& p, const Shape& shape, const std::string& name) {
  Broadcast<2> b({&p.shape(), &shape});  // throws on incompatible dims
  if (!(b.shape() == shape)) {
    fail("input " + name + " " + p.shape().to_string() + " does not broadcast to " + shape.to_string());
  }
  const std::vector<double> v = values_of(p);
  std::vector<double> out(static_cast<size_t>(shape.numel()));
  b.for_each_run([&](int64_t o, const auto& in, int64_t len, const auto& step) {
    for (int64_t i = 0; i < len; ++i) out[static_cast<size_t>(o + i)] = v[static_cast<size_t>(in[0] + i * step[0])];
  });
  return out;
}

namespace {

// Which element of the scale (and zero point) each element of x uses: x is seen as
// [outer, axis_dim, inner] around `axis`.
struct QuantLayout {
  int64_t axis_dim = 1, inner = 1;
  int64_t block = 0;       // blocked: elements per scale along the axis
  int64_t scale_axis = 1;  // blocked: the scale's dim along the axis
  enum class Kind { PerTensor, PerAxis, Blocked } kind = Kind::PerTensor;

  int64_t index(int64_t e) const {
    switch (kind) {
      case Kind::PerTensor: return 0;
      case Kind::PerAxis: return (e / inner) % axis_dim;
      case Kind::Blocked: {
        const int64_t i = e % inner, a = (e / inner) % axis_dim, o = e / (inner * axis_dim);
        return (o * scale_axis + a / block) * inner + i;
      }
    }
    return 0;
  }
};

// Resolves and checks the granularity (header comment) of `scale` against x.
QuantLayout quant_layout(const KernelContext& ctx, int version, int64_t axis, int64_t block_size) {
  const Tensor& x = ctx.input(0);
  const Tensor& scale = ctx.input(1);
  const std::string scale_name = "input " + ctx.input_name(1);
  // The zero point has the scale's shape; a one-element zero point of rank <= 1 goes with a
  // per-tensor scale of either form (ONNX's own tests pair a scalar scale with a [1] zero point).
  const auto one = [](const Tensor& t) { return t.numel() == 1 && t.rank() <= 1; };
  if (ctx.has_input(2) && !(ctx.input(2).shape() == scale.shape()) && !(one(ctx.input(2)) && one(scale))) {
    fail("input " + ctx.input_name(2) + " " + ctx.input(2).shape().to_string() +
         " must have the shape of " + ctx.input_name(1) + " " + scale.shape().to_string());
  }
  QuantLayout l;
  if (scale.numel() == 1 && scale.rank() <= 1) return l;  // per tensor
  const auto r = static_cast<int64_t>(x.rank());
  if (version < 13) fail(scale_name + " must be a scalar, got " + scale.shape().to_string());
  if (axis < -r || axis >= r) {
    fail("attribute 'axis' is " + std::to_string(axis) + ", out of range for " + ctx.input_name(0) +
         " of rank " + std::to_string(r));
  }
  const auto ax = static_cast<size_t>(axis < 0 ? axis + r : axis);
  l.axis_dim = x.dim(ax);
  for (size_t d = ax + 1; d < x.rank(); ++d) l.inner *= x.dim(d);
  if (block_size == 0) {
    if (scale.rank() != 1 || scale.dim(0) != l.axis_dim) {
      fail(scale_name + " " + scale.shape().to_string() + " is neither a scalar nor a 1-D tensor of " +
           std::to_string(l.axis_dim) + " elements (" + ctx.input_name(0) + " " +
           x.shape().to_string() + " along axis " + std::to_string(axis) + ")" +
           (version >= 21 ? "; blocked quantization needs 'block_size'" : ""));
    }
    l.kind = QuantLayout::Kind::PerAxis;
    return l;
  }
  bool ok = scale.rank() == x.rank();
  for (size_t d = 0; ok && d < x.rank(); ++d) {
    ok = d == ax ? scale.dim(d) == (x.dim(d) + block_size - 1) / block_size : scale.dim(d) == x.dim(d);
  }
  if (!ok) {
    fail(scale_name + " " + scale.shape().to_string() + " does not block " + ctx.input_name(0) + " " +
         x.shape().to_string() + " along axis " + std::to_string(axis) + " with block_size " +
         std::to_string(block_size) + " (expected x's shape with ceil(dim / block_size) on the axis)");
  }
  l.kind = QuantLayout::Kind::Blocked;
  l.block = block_size;
  l.scale_axis = scale.dim(ax);
  return l;
}

// The types QuantizeLinear produces (and DequantizeLinear reads, with int32) at `version`.
DTypeSet quantized_types(int version) {
  DTypeSet s = kInt8Quant;
  if (version >= 19) s = s | kFloat8;
  if (version >= 21) s = s | kInt4 | DTypeSet{DataType::Int16, DataType::UInt16};
  if (version >= 23) s = s | DTypeSet{DataType::Float4E2M1};
  if (version >= 25) s = s | kInt2;
  if (version >= 28) s = s | kFloat6;
  return s;
}

// The types of the scale at `version` (QuantizeLinear's also include int32).
DTypeSet scale_types(int version, bool quantize) {
  if (version < 19) return DTypeSet{DataType::Float32};
  DTypeSet s{DataType::Float32, DataType::Float16, DataType::BFloat16};
  if (quantize) s = s | DTypeSet{DataType::Int32};
  if (version >= 24) s = s | DTypeSet{DataType::Float8E8M0};
  return s;
}

constexpr DTypeSet kRealTypes{DataType::Float32, DataType::Float16, DataType::BFloat16};

void check_type(const KernelContext& ctx, int i, DTypeSet allowed, const std::string& op_version) {
  const Tensor& t = ctx.input(i);
  if (!allowed.contains(t.dtype())) {
    fail("input " + ctx.input_name(i) + " is " + t.description() + "; " + op_version + " takes " +
         allowed.to_string());
  }
}

std::optional<DataType> dtype_attr(const KernelInit& init, const char* name, DTypeSet allowed,
                                   const std::string& op_version) {
  const int64_t v = init.attr_int(name, 0);
  if (v == 0) return std::nullopt;
  const DataType t = dtype_from_onnx(static_cast<int32_t>(v), std::string("attribute '") + name + "'");
  if (!allowed.contains(t)) {
    throw Error(std::string("attribute '") + name + "' is " + std::string(dtype_name(t)) + "; " +
                op_version + " takes " + allowed.to_string());
  }
  return t;
}

// Runs f(begin, end, buffer) over [0, n) in parallel blocks of at most kBlock elements, with a
// buffer of kBlock doubles per call.
constexpr int64_t kBlock = 1024;
template <class F>
void for_blocks(int64_t n, F&& f) {
  parallel_for((n + kBlock - 1) / kBlock, std::max<int64_t>(1, kParallelGrain / kBlock),
               [&](int64_t first, int64_t last) {
                 std::vector<double> buffer(static_cast<size_t>(kBlock));
                 for (int64_t blk = first; blk < last; ++blk) {
                   const int64_t begin = blk * kBlock;
                   f(begin, std::min(n, begin + kBlock), buffer.data());
                 }
               });
}

// ---------------------------------------------------------------------------------------------
// QuantizeLinear

struct QuantizeAttrs {
  int version = 10;
  int64_t axis = 1, block_size = 0;
  std::optional<DataType> output_dtype, precision;
  NarrowFloatCast how;
};

// q[j] = x[e] / scale[index(e)] in precision P (header comment), for e in [begin, end).
template <class X>
void quotients(const Tensor& x, const std::vector<double>& scale, const QuantLayout& l,
               DataType precision, int64_t begin, int64_t end, double* q) {
  const X* xs = x.data<X>();
  auto each = [&](auto divide) {
    for (int64_t e = begin; e < end; ++e) {
      q[e - begin] = divide(static_cast<double>(detail::widen(xs[e])), scale[static_cast<size_t>(l.index(e))]);
    }
  };
  switch (precision) {
    case DataType::Float16:
      return each([](double a, double b) {
        const float fa = float(Float16(float(a))), fb = float(Float16(float(b)));
        return double(float(Float16(fa / fb)));
      });
    case DataType::BFloat16:
      return each([](double a, double b) {
        const float fa = float(BFloat16(float(a))), fb = float(BFloat16(float(b)));
        return double(float(BFloat16(fa / fb)));
      });
    case DataType::Int32:
      return each([](double a, double b) {
        return static_cast<double>(convert<int32_t>(a)) / static_cast<double>(convert<int32_t>(b));
      });
    default:  // float32, and float8e8m0 scales
      return each([](double a, double b) { return double(float(a) / float(b)); });
  }
}

// y[e] from the quotients q of [begin, end) and the zero points.
template <class Y>
void store_quantized(Tensor& y, const std::vector<double>* zero, const QuantLayout& l,
                     const NarrowFloatCast& how, int64_t begin, int64_t end, const double* q) {
  Y* ys = y.data<Y>();
  auto zp = [&](int64_t e) { return zero ? (*zero)[static_cast<size_t>(l.index(e))] : 0.0; };
  if constexpr (is_narrow_float_v<Y>) {
    for (int64_t e = begin; e < end; ++e) {
      const double v = zero ? q[e - begin] + zp(e) : q[e - begin];
      ys[e] = Y::from_bits(narrow_float_bits(Y::dtype, v, how));
    }
  } else {
    const IntRange range = quant_range(dtype_of<Y>);
    for (int64_t e = begin; e < end; ++e) ys[e] = store_int<Y>(saturate_round(q[e - begin], zp(e), range));
  }
}

using QuantizedTypes = TypeList<int8_t, uint8_t, int16_t, uint16_t, Int4, UInt4, Int2, UInt2, Float8E4M3FN,
                                Float8E4M3FNUZ, Float8E5M2, Float8E5M2FNUZ, Float4E2M1, Float6E2M3, Float6E3M2>;
using QuantizeInputTypes = TypeList<float, Float16, BFloat16, int32_t>;

void run_quantize(KernelContext& ctx, const QuantizeAttrs& a) {
  const std::string op = "QuantizeLinear-" + std::to_string(a.version);
  const Tensor& x = ctx.input(0);
  const Tensor& scale = ctx.input(1);
  check_type(ctx, 1, a.version == 19 || a.version == 21 ? DTypeSet{x.dtype()} : scale_types(a.version, true), op);
  DataType out = a.output_dtype.value_or(DataType::UInt8);
  if (ctx.has_input(2)) {
    out = ctx.input(2).dtype();
    if (a.output_dtype && *a.output_dtype != out) {
      fail("input " + ctx.input_name(2) + " is " + ctx.input(2).description() + " but attribute 'output_dtype' is " +
           std::string(dtype_name(*a.output_dtype)));
    }
    check_type(ctx, 2, quantized_types(a.version), op);
  }
  const QuantLayout l = quant_layout(ctx, a.version, a.axis, a.block_size);
  const std::vector<double> scales = values_of(scale);
  std::optional<std::vector<double>> zero;
  if (ctx.has_input(2)) zero = values_of(ctx.input(2));
  DataType precision = a.precision.value_or(scale.dtype());
  Tensor& y = ctx.allocate_output(0, out, x.shape());
  visit_dtype<QuantizeInputTypes>(x.dtype(), "input " + ctx.input_name(0), [&]<class X>() {
    visit_dtype<QuantizedTypes>(out, "QuantizeLinear output", [&]<class Y>() {
      for_blocks(x.numel(), [&](int64_t begin, int64_t end, double* q) {
        quotients<X>(x, scales, l, precision, begin, end, q);
        store_quantized<Y>(y, zero ? &*zero : nullptr, l, a.how, begin, end, q);
      });
    });
  });
}

// ---------------------------------------------------------------------------------------------
// DequantizeLinear

using DequantizeInputTypes = TypeList<int8_t, uint8_t, int16_t, uint16_t, int32_t, Int4, UInt4, Int2, UInt2,
                                      Float8E4M3FN, Float8E4M3FNUZ, Float8E5M2, Float8E5M2FNUZ, Float4E2M1,
                                      Float6E2M3, Float6E3M2>;

void run_dequantize(KernelContext& ctx, int version, int64_t axis, int64_t block_size,
                    std::optional<DataType> output_dtype) {
  const std::string op = "DequantizeLinear-" + std::to_string(version);
  const Tensor& x = ctx.input(0);
  const Tensor& scale = ctx.input(1);
  check_type(ctx, 1, scale_types(version, false), op);
  if (ctx.has_input(2) && ctx.input(2).dtype() != x.dtype()) {
    fail("input " + ctx.input_name(2) + " is " + ctx.input(2).description() + "; it must have the type of " +
         ctx.input_name(0) + " (" + std::string(dtype_name(x.dtype())) + ")");
  }
  const DataType out = output_dtype.value_or(scale.dtype());
  if (!kRealTypes.contains(out)) {
    fail("the output type would be that of input " + ctx.input_name(1) + " (" + std::string(dtype_name(out)) +
         "); set attribute 'output_dtype' to float32, float16 or bfloat16");
  }
  const QuantLayout l = quant_layout(ctx, version, axis, block_size);
  const std::vector<double> scales = values_of(scale);
  std::optional<std::vector<double>> zero;
  if (ctx.has_input(2)) zero = values_of(ctx.input(2));
  Tensor& y = ctx.allocate_output(0, out, x.shape());
  visit_dtype<DequantizeInputTypes>(x.dtype(), "input " + ctx.input_name(0), [&]<class X>() {
    visit_dtype<FloatTypes>(out, "DequantizeLinear output", [&]<class Y>() {
      const X* xs = x.data<X>();
      Y* ys = y.data<Y>();
      parallel_for(x.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
        for (int64_t e = begin; e < end; ++e) {
          const auto p = static_cast<size_t>(l.index(e));
          float d = 0;
          if constexpr (is_narrow_float_v<X>) {
            d = static_cast<float>(xs[e]) - (zero ? static_cast<float>((*zero)[p]) : 0.0f);
          } else {  // exact in int64, then rounded once to float
            const auto v = static_cast<int64_t>(detail::widen(xs[e]));
            d = static_cast<float>(v - (zero ? static_cast<int64_t>((*zero)[p]) : 0));
          }
          ys[e] = convert<Y>(d * static_cast<float>(scales[p]));
        }
      });
    });
  });
}

}  // namespace

std::unique_ptr<Kernel> make_quantize_linear(const KernelInit& init) {
  QuantizeAttrs a;
  a.version = op_version("", "QuantizeLinear", init.opset());
  const std::string op = "QuantizeLinear-" + std::to_string(a.version);
  if (a.version >= 13) a.axis = init.attr_int("axis", 1);
  if (a.version >= 19) a.how.saturate = init.attr_int("saturate", 1) != 0;
  a.how.fnuz_inf_is_nan = a.version < 24;
  if (a.version >= 21) {
    a.block_size = init.attr_int("block_size", 0);
    if (a.block_size < 0) throw Error("attribute 'block_size' is " + std::to_string(a.block_size) + ", expected >= 0");
    a.output_dtype = dtype_attr(init, "output_dtype", quantized_types(a.version), op);
  }
  if (a.version >= 23) {
    a.precision = dtype_attr(init, "precision", kRealTypes | DTypeSet{DataType::Int32}, op);
  }
  return make_kernel([a](KernelContext& ctx) { run_quantize(ctx, a); });
}

std::unique_ptr<Kernel> make_dequantize_linear(const KernelInit& init) {
  const int version = op_version("", "DequantizeLinear", init.opset());
  const int64_t axis = version >= 13 ? init.attr_int("axis", 1) : 1;
  int64_t block_size = 0;
  if (version >= 21) {
    block_size = init.attr_int("block_size", 0);
    if (block_size < 0) throw Error("attribute 'block_size' is " + std::to_string(block_size) + ", expected >= 0");
  }
  std::optional<DataType> output_dtype;
  if (version >= 23) {
    output_dtype = dtype_attr(init, "output_dtype", kRealTypes, "DequantizeLinear-" + std::to_string(version));
  }
  return make_kernel([=](KernelContext& ctx) { run_dequantize(ctx, version, axis, block_size, output_dtype); });
}

// DynamicQuantizeLinear-11, as its function body computes it in float32:
//   scale = (max(max(x), 0) - min(min(x), 0)) / 255
//   zero_point = uint8(round(clip(0 - min(min(x), 0) / scale, 0, 255)))
//   y = saturate(round(x / scale) + zero_point) to [0, 255]
// NaN elements are skipped by min and max. An all-zero (or empty) x gives scale 0 and, as the
// function body's Cast of NaN, zero point 0 (y: 0 / 0 is NaN, which quantizes to the zero point).
std::unique_ptr<Kernel> make_dynamic_quantize_linear(const KernelInit&) {
  return make_kernel([](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    if (x.dtype() != DataType::Float32) fail("input " + ctx.input_name(0) + " must be float32, got " + x.description());
    const float* xs = x.data<float>();
    float lo = 0.0f, hi = 0.0f;  // min(x, 0), max(x, 0)
    for (int64_t i = 0; i < x.numel(); ++i) {
      lo = xs[i] < lo ? xs[i] : lo;
      hi = xs[i] > hi ? xs[i] : hi;
    }
    const float scale = (hi - lo) / 255.0f;
    const float zero_fp = 0.0f - lo / scale;
    const float clipped = std::isnan(zero_fp) ? zero_fp : std::clamp(zero_fp, 0.0f, 255.0f);
    const uint8_t zero = convert<uint8_t>(std::nearbyint(clipped));
    Tensor& y = ctx.allocate_output(0, DataType::UInt8, x.shape());
    uint8_t* ys = y.data<uint8_t>();
    parallel_for(x.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        ys[i] = static_cast<uint8_t>(saturate_round(double(xs[i] / scale), zero, {0, 255}));
      }
    });
    ctx.allocate_output(1, DataType::Float32, Shape{}).data<float>()[0] = scale;
    ctx.allocate_output(2, DataType::UInt8, Shape{}).data<uint8_t>()[0] = zero;
  });
}

}  // namespace onnxtrain::ops
