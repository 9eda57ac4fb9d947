// One-input element-wise ops (ONNX operator docs, ai.onnx opsets 1-28; the versions after 17 of
// the math ops and activations (22, Celu 28, IsNaN/IsInf 20, Identity 19-25) only add element
// types, which the kernel table's rows admit):
//   math        Abs Neg Sqrt Reciprocal Exp Log Erf Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh
//               Acosh Atanh Floor Ceil Round Sign
//   activations Relu Sigmoid Tanh Softplus Softsign HardSwish, and with attributes LeakyRelu Elu
//               Selu Celu HardSigmoid ThresholdedRelu Shrink
//   predicates  Not IsNaN IsInf (bool output)
//   Clip (attributes min/max before opset 11, optional scalar inputs from 11), Identity (a view
//   of its input). Cast and CastLike are in cast.cpp.
//
// Float16 and BFloat16 compute in float and round once on store. Float32 Exp, Erf, Tanh and
// Sigmoid use the vectorized functions of core/vector_math.h (errors of at most 1.5-2.5 ulp,
// documented there) instead of the C library's, which GCC does not vectorize; the other types
// keep std::. Round is round-half-to-even (the doc's "round half to even"); Sign of NaN is NaN,
// as numpy.sign. The attribute `consumed_inputs` of opsets 1-5 is a legacy memory hint and is
// ignored.
#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "core/vector_math.h"
#include "ops/factories.h"

namespace onnxtrain::ops {

namespace {

// out[i] = f(in[i]) over a contiguous tensor; f receives and returns compute_t<T> (or any
// type convertible to Out).
template <class T, class Out, class F>
void map_elements(const Tensor& x, Tensor& y, F f) {
  const T* in = x.data<T>();
  Out* out = y.data<Out>();
  parallel_for(x.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      out[i] = convert<Out>(f(static_cast<compute_t<T>>(in[i])));
    }
  });
}

// y = f(x) over a contiguous float32 tensor, f an array function of core/vector_math.h called
// on each thread's chunk.
void map_float_arrays(const Tensor& x, Tensor& y, void (*f)(const float*, float*, int64_t)) {
  const float* in = x.data<float>();
  float* out = y.data<float>();
  parallel_for(x.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
    f(in + begin, out + begin, end - begin);
  });
}

enum class Unary {
  Abs, Neg, Sqrt, Reciprocal, Exp, Log, Erf, Tanh, Sigmoid, Relu, Softplus, Softsign, HardSwish,
  Sin, Cos, Tan, Asin, Acos, Atan, Sinh, Cosh, Asinh, Acosh, Atanh, Floor, Ceil, Round, Sign,
  Not, IsNaN,
};

const std::unordered_map<std::string, Unary>& unary_ops() {
  static const std::unordered_map<std::string, Unary> ops = {
      {"Abs", Unary::Abs},         {"Neg", Unary::Neg},         {"Sqrt", Unary::Sqrt},
      {"Reciprocal", Unary::Reciprocal}, {"Exp", Unary::Exp}, {"Log", Unary::Log},
      {"Erf", Unary::Erf},         {"Tanh", Unary::Tanh},       {"Sigmoid", Unary::Sigmoid},
      {"Relu", Unary::Relu},       {"Softplus", Unary::Softplus}, {"Softsign", Unary::Softsign},
      {"HardSwish", Unary::HardSwish}, {"Sin", Unary::Sin},   {"Cos", Unary::Cos},
      {"Tan", Unary::Tan},         {"Asin", Unary::Asin},       {"Acos", Unary::Acos},
      {"Atan", Unary::Atan},       {"Sinh", Unary::Sinh},       {"Cosh", Unary::Cosh},
      {"Asinh", Unary::Asinh},     {"Acosh", Unary::Acosh},     {"Atanh", Unary::Atanh},
      {"Floor", Unary::Floor},     {"Ceil", Unary::Ceil},       {"Round", Unary::Round},
      {"Sign", Unary::Sign},       {"Not", Unary::Not},         {"IsNaN", Unary::IsNaN},
  };
  return ops;
}

// Ops defined for integers too (the registry admits integer inputs only for these).
template <class T>
void run_integer_capable(Unary op, const Tensor& x, Tensor& y) {
  using C = compute_t<T>;
  switch (op) {
    case Unary::Abs:
      if constexpr (std::is_unsigned_v<T>) {
        map_elements<T, T>(x, y, [](C v) { return v; });
      } else {
        map_elements<T, T>(x, y, [](C v) { return v < C(0) ? C(-v) : v; });
      }
      return;
    case Unary::Neg:
      map_elements<T, T>(x, y, [](C v) { return C(-v); });
      return;
    case Unary::Relu:
      map_elements<T, T>(x, y, [](C v) { return v < C(0) ? C(0) : v; });  // max(x, 0); NaN stays NaN
      return;
    case Unary::Sign:
      map_elements<T, T>(x, y, [](C v) {
        if constexpr (std::is_floating_point_v<C>) {
          if (std::isnan(v)) return v;
        }
        return C(v > C(0) ? 1 : (v < C(0) ? -1 : 0));
      });
      return;
    default:
      break;
  }
  throw Error("unreachable unary op");
}

template <class T>
void run_floating(Unary op, const Tensor& x, Tensor& y) {
  using C = compute_t<T>;
  if constexpr (std::is_same_v<T, float>) {
    switch (op) {
      case Unary::Exp: return map_float_arrays(x, y, vmath::exp);
      case Unary::Erf: return map_float_arrays(x, y, vmath::erf);
      case Unary::Tanh: return map_float_arrays(x, y, vmath::tanh);
      case Unary::Sigmoid: return map_float_arrays(x, y, vmath::sigmoid);
      default: break;
    }
  }
  switch (op) {
    case Unary::Abs: case Unary::Neg: case Unary::Relu: case Unary::Sign:
      return run_integer_capable<T>(op, x, y);
    case Unary::Sqrt: return map_elements<T, T>(x, y, [](C v) { return std::sqrt(v); });
    case Unary::Reciprocal: return map_elements<T, T>(x, y, [](C v) { return C(1) / v; });
    case Unary::Exp: return map_elements<T, T>(x, y, [](C v) { return std::exp(v); });
    case Unary::Log: return map_elements<T, T>(x, y, [](C v) { return std::log(v); });
    case Unary::Erf: return map_elements<T, T>(x, y, [](C v) { return std::erf(v); });
    case Unary::Tanh: return map_elements<T, T>(x, y, [](C v) { return std::tanh(v); });
    case Unary::Sigmoid:
      // Written so that exp never overflows: for v < 0 use e^v / (1 + e^v).
      return map_elements<T, T>(x, y, [](C v) {
        if (v >= C(0)) return C(1) / (C(1) + std::exp(-v));
        const C e = std::exp(v);
        return e / (C(1) + e);
      });
    case Unary::Softplus:
      // log(1 + e^v) = max(v, 0) + log1p(e^-|v|), finite for every finite v.
      return map_elements<T, T>(x, y, [](C v) {
        return std::max(v, C(0)) + std::log1p(std::exp(-std::abs(v)));
      });
    case Unary::Softsign: return map_elements<T, T>(x, y, [](C v) { return v / (C(1) + std::abs(v)); });
    case Unary::HardSwish:
      // x * HardSigmoid(x) with alpha = 1/6, beta = 1/2 (HardSwish-14).
      return map_elements<T, T>(x, y, [](C v) {
        return v * std::clamp(v / C(6) + C(0.5), C(0), C(1));
      });
    case Unary::Sin: return map_elements<T, T>(x, y, [](C v) { return std::sin(v); });
    case Unary::Cos: return map_elements<T, T>(x, y, [](C v) { return std::cos(v); });
    case Unary::Tan: return map_elements<T, T>(x, y, [](C v) { return std::tan(v); });
    case Unary::Asin: return map_elements<T, T>(x, y, [](C v) { return std::asin(v); });
    case Unary::Acos: return map_elements<T, T>(x, y, [](C v) { return std::acos(v); });
    case Unary::Atan: return map_elements<T, T>(x, y, [](C v) { return std::atan(v); });
    case Unary::Sinh: return map_elements<T, T>(x, y, [](C v) { return std::sinh(v); });
    case Unary::Cosh: return map_elements<T, T>(x, y, [](C v) { return std::cosh(v); });
    case Unary::Asinh: return map_elements<T, T>(x, y, [](C v) { return std::asinh(v); });
    case Unary::Acosh: return map_elements<T, T>(x, y, [](C v) { return std::acosh(v); });
    case Unary::Atanh: return map_elements<T, T>(x, y, [](C v) { return std::atanh(v); });
    case Unary::Floor: return map_elements<T, T>(x, y, [](C v) { return std::floor(v); });
    case Unary::Ceil: return map_elements<T, T>(x, y, [](C v) { return std::ceil(v); });
    case Unary::Round:
      // nearbyint rounds half to even in the default rounding mode, which nothing here changes.
      return map_elements<T, T>(x, y, [](C v) { return std::nearbyint(v); });
    case Unary::IsNaN: return map_elements<T, bool>(x, y, [](C v) { return std::isnan(v); });
    case Unary::Not: break;
  }
  throw Error("unreachable unary op");
}

}  // namespace

std::unique_ptr<Kernel> make_unary(const KernelInit& init) {
  const auto it = unary_ops().find(init.op_type());
  if (it == unary_ops().end()) throw Error("no unary kernel for " + init.op_type());
  const Unary op = it->second;
  return make_kernel([op](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    if (op == Unary::Not) {
      if (x.dtype() != DataType::Bool) fail("input " + ctx.input_name(0) + " of Not must be bool");
      Tensor& y = ctx.allocate_output(0, DataType::Bool, x.shape());
      map_elements<bool, bool>(x, y, [](bool v) { return !v; });
      return;
    }
    const DataType out_type = op == Unary::IsNaN ? DataType::Bool : x.dtype();
    Tensor& y = ctx.allocate_output(0, out_type, x.shape());
    const std::string what = "input " + ctx.input_name(0);
    if (is_floating(x.dtype())) {
      visit_dtype<FloatTypes>(x.dtype(), what, [&]<class T>() { run_floating<T>(op, x, y); });
    } else if (op == Unary::Abs || op == Unary::Neg || op == Unary::Relu || op == Unary::Sign) {
      visit_dtype<IntTypes>(x.dtype(), what, [&]<class T>() { run_integer_capable<T>(op, x, y); });
    } else {
      throw_unsupported_dtype(x.dtype(), what);
    }
  });
}

// Activations with attributes (defaults from each op's doc), and IsInf.
std::unique_ptr<Kernel> make_activation(const KernelInit& init) {
  const std::string& op = init.op_type();
  if (op == "IsInf") {
    const bool negative = init.attr_int("detect_negative", 1) != 0;
    const bool positive = init.attr_int("detect_positive", 1) != 0;
    return make_kernel([negative, positive](KernelContext& ctx) {
      const Tensor& x = ctx.input(0);
      Tensor& y = ctx.allocate_output(0, DataType::Bool, x.shape());
      visit_dtype<FloatTypes>(x.dtype(), "input " + ctx.input_name(0), [&]<class T>() {
        map_elements<T, bool>(x, y, [=](auto v) {
          return std::isinf(v) && (v > 0 ? positive : negative);
        });
      });
    });
  }
  // f(v, alpha, beta) in double for the constants, evaluated in compute_t<T>.
  double alpha = 0, beta = 0;
  enum class Act { LeakyRelu, Elu, Selu, Celu, HardSigmoid, ThresholdedRelu, Shrink } act;
  if (op == "LeakyRelu") {
    act = Act::LeakyRelu, alpha = init.attr_float("alpha", 0.01f);
  } else if (op == "Elu") {
    act = Act::Elu, alpha = init.attr_float("alpha", 1.0f);
  } else if (op == "Selu") {
    act = Act::Selu;
    alpha = init.attr_float("alpha", 1.67326319217681884765625f);
    beta = init.attr_float("gamma", 1.05070102214813232421875f);
  } else if (op == "Celu") {
    act = Act::Celu, alpha = init.attr_float("alpha", 1.0f);
    if (alpha == 0) throw Error("Celu attribute 'alpha' must not be 0");
  } else if (op == "HardSigmoid") {
    act = Act::HardSigmoid, alpha = init.attr_float("alpha", 0.2f), beta = init.attr_float("beta", 0.5f);
  } else if (op == "ThresholdedRelu") {
    act = Act::ThresholdedRelu, alpha = init.attr_float("alpha", 1.0f);
  } else if (op == "Shrink") {
    act = Act::Shrink, alpha = init.attr_float("lambd", 0.5f), beta = init.attr_float("bias", 0.0f);
  } else {
    throw Error("no activation kernel for " + op);
  }
  return make_kernel([act, alpha, beta](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
    const std::string what = "input " + ctx.input_name(0);
    if (act == Act::Shrink) {  // the only one defined for integers
      visit_dtype<NumericTypes>(x.dtype(), what, [&]<class T>() {
        using C = compute_t<T>;
        using A = std::conditional_t<std::is_floating_point_v<C>, C, double>;
        const A lambd = static_cast<A>(alpha), bias = static_cast<A>(beta);
        map_elements<T, T>(x, y, [=](C v) {
          const A a = static_cast<A>(v);
          return a < -lambd ? a + bias : (a > lambd ? a - bias : A(0));
        });
      });
      return;
    }
    visit_dtype<FloatTypes>(x.dtype(), what, [&]<class T>() {
      using C = compute_t<T>;
      const C a = static_cast<C>(alpha), b = static_cast<C>(beta);
      switch (act) {
        case Act::LeakyRelu:
          return map_elements<T, T>(x, y, [=](C v) { return v >= C(0) ? v : a * v; });
        case Act::Elu:
          return map_elements<T, T>(x, y, [=](C v) { return v >= C(0) ? v : a * std::expm1(v); });
        case Act::Selu:  // gamma * (v > 0 ? v : alpha * (e^v - 1))
          return map_elements<T, T>(x, y, [=](C v) { return b * (v > C(0) ? v : a * std::expm1(v)); });
        case Act::Celu:  // max(0, v) + min(0, alpha * (e^(v/alpha) - 1))
          return map_elements<T, T>(x, y, [=](C v) {
            return std::max(C(0), v) + std::min(C(0), a * std::expm1(v / a));
          });
        case Act::HardSigmoid:
          return map_elements<T, T>(x, y, [=](C v) { return std::clamp(a * v + b, C(0), C(1)); });
        case Act::ThresholdedRelu:
          return map_elements<T, T>(x, y, [=](C v) { return v > a ? v : C(0); });
        case Act::Shrink:
          break;
      }
    });
  });
}

// Clip-1/6: attributes min and max (defaults: the float range). Clip-11+: optional scalar
// inputs min and max (absent: no bound). min > max clips everything to max.
std::unique_ptr<Kernel> make_clip(const KernelInit& init) {
  const bool attributes = init.opset() < 11;
  const float attr_min = init.attr_float("min", -std::numeric_limits<float>::infinity());
  const float attr_max = init.attr_float("max", std::numeric_limits<float>::infinity());
  return make_kernel([=](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
    visit_dtype<NumericTypes>(x.dtype(), "input " + ctx.input_name(0), [&]<class T>() {
      using C = compute_t<T>;
      C lo = std::numeric_limits<C>::lowest(), hi = std::numeric_limits<C>::max();
      if constexpr (std::is_floating_point_v<C>) {
        lo = -std::numeric_limits<C>::infinity(), hi = std::numeric_limits<C>::infinity();
      }
      if (attributes) {
        lo = convert<C>(attr_min), hi = convert<C>(attr_max);
      } else {
        for (int i = 1; i <= 2; ++i) {
          if (!ctx.has_input(i)) continue;
          const Tensor& bound = ctx.input(i);
          if (bound.dtype() != x.dtype() || bound.numel() != 1) {
            fail("input " + ctx.input_name(i) + " must be a one-element " +
                 std::string(dtype_name(x.dtype())) + " tensor, got " +
                 std::string(dtype_name(bound.dtype())) + " " + bound.shape().to_string());
          }
          (i == 1 ? lo : hi) = static_cast<C>(bound.data<T>()[0]);
        }
      }
      map_elements<T, T>(x, y, [=](C v) { return std::min(std::max(v, lo), hi); });
    });
  });
}

// Identity passes any value through: tensors, and from version 14 sequences, from 16 optionals.
std::unique_ptr<Kernel> make_identity(const KernelInit&) {
  return make_kernel([](KernelContext& ctx) { ctx.set_output_value(0, ctx.input_value(0)); });
}

}  // namespace onnxtrain::ops
