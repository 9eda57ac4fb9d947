// Broadcasting binary and variadic ops (ONNX operator docs, ai.onnx opsets 1-28):
//   arithmetic  Add Sub Mul Div Pow Mod PRelu
//   comparison  Equal Greater Less GreaterOrEqual LessOrEqual (bool output)
//   logic       And Or Xor (bool)
//   variadic    Min Max Sum Mean (any number of inputs, numpy broadcast)
//   Where
//
// Broadcasting is numpy's (docs/Broadcasting.md) from opset 7. Before it, Add/Sub/Mul/Div/Pow,
// the comparisons and the logic ops broadcast only when the attribute `broadcast` is 1, and
// then B is aligned with A's dims starting at `axis` (default: aligned at the right).
//
// Integer division and modulo by zero give 0 and INT_MIN / -1 wraps, as numpy does, instead of
// trapping. Mod with fmod=0 is A - floor(A / B) B, with the sign of the divisor (Python's %),
// fmod=1 is A - trunc(A / B) B, with the sign of the dividend (C's fmod). Mod-28 defines fmod=0
// for floating-point inputs too (its doc's special cases are numpy.mod's: a zero result takes
// the divisor's sign, an infinite divisor of the other sign is returned, x mod 0 is NaN); the
// kernel computes it so in every version (Mod-10/13 only allowed integers there). Pow-12+ accepts an
// exponent of another numeric type; the result has the base's type. Min/Max propagate NaN.
// PRelu-1/6 reads a 1-D slope of C values as one per channel (dim 1 of X).
#include <cmath>
#include <limits>
#include <optional>
#include <unordered_map>

#include "core/dispatch.h"
#include "core/select.h"
#include "ops/broadcast.h"
#include "ops/factories.h"

namespace onnxtrain::ops {

namespace {

template <class T>
inline compute_t<T> widen(T v) {
  return static_cast<compute_t<T>>(v);
}

// out = f(a, b) element-wise over the broadcast `bc` of a's and b's shapes. The inner loop is
// specialised on which input advances, so the common cases are plain contiguous loops.
template <class A, class B, class Out, class F>
void binary_loop(const Broadcast<2>& bc, const Tensor& a, const Tensor& b, Tensor& out, F f) {
  const A* pa = a.data<A>();
  const B* pb = b.data<B>();
  Out* po = out.data<Out>();
  bc.for_each_run([&](int64_t o, const auto& in, int64_t len, const auto& step) {
    const A* x = pa + in[0];
    const B* y = pb + in[1];
    Out* z = po + o;
    if (step[0] && step[1]) {
      for (int64_t i = 0; i < len; ++i) z[i] = convert<Out>(f(widen(x[i]), widen(y[i])));
    } else if (step[0]) {
      const auto yv = widen(*y);
      for (int64_t i = 0; i < len; ++i) z[i] = convert<Out>(f(widen(x[i]), yv));
    } else if (step[1]) {
      const auto xv = widen(*x);
      for (int64_t i = 0; i < len; ++i) z[i] = convert<Out>(f(xv, widen(y[i])));
    } else {
      const Out v = convert<Out>(f(widen(*x), widen(*y)));
      for (int64_t i = 0; i < len; ++i) z[i] = v;
    }
  });
}

enum class Binary {
  Add, Sub, Mul, Div, Pow, Mod, PRelu, Equal, Greater, Less, GreaterOrEqual, LessOrEqual, And, Or,
  Xor,
};

const std::unordered_map<std::string, Binary>& binary_ops() {
  static const std::unordered_map<std::string, Binary> ops = {
      {"Add", Binary::Add},     {"Sub", Binary::Sub},         {"Mul", Binary::Mul},
      {"Div", Binary::Div},     {"Pow", Binary::Pow},         {"Mod", Binary::Mod},
      {"PRelu", Binary::PRelu}, {"Equal", Binary::Equal},     {"Greater", Binary::Greater},
      {"Less", Binary::Less},   {"GreaterOrEqual", Binary::GreaterOrEqual},
      {"LessOrEqual", Binary::LessOrEqual}, {"And", Binary::And}, {"Or", Binary::Or},
      {"Xor", Binary::Xor},
  };
  return ops;
}

// Integer a^e by squaring, wrapping on overflow like numpy; a negative exponent gives the
// truncated value of 1/a^|e| (0 unless |a| is 1).
template <class T>
T int_pow(T a, T e) {
  if constexpr (std::is_signed_v<T>) {
    if (e < 0) return a == 1 ? T(1) : (a == -1 ? T((e % 2) ? -1 : 1) : T(0));
  }
  using U = std::make_unsigned_t<T>;
  U result = 1, base = static_cast<U>(a);
  for (auto n = static_cast<U>(e); n; n >>= 1) {
    if (n & 1) result = static_cast<U>(result * base);
    base = static_cast<U>(base * base);
  }
  return static_cast<T>(result);
}

template <class T>
void run_arithmetic(Binary op, bool fmod, const Broadcast<2>& bc, const Tensor& a, const Tensor& b,
                    Tensor& out) {
  using C = compute_t<T>;
  constexpr bool kFloat = std::is_floating_point_v<C>;
  switch (op) {
    case Binary::Add: return binary_loop<T, T, T>(bc, a, b, out, [](C x, C y) { return C(x + y); });
    case Binary::Sub: return binary_loop<T, T, T>(bc, a, b, out, [](C x, C y) { return C(x - y); });
    case Binary::Mul: return binary_loop<T, T, T>(bc, a, b, out, [](C x, C y) { return C(x * y); });
    case Binary::Div:
      return binary_loop<T, T, T>(bc, a, b, out, [](C x, C y) {
        if constexpr (kFloat) {
          return x / y;
        } else {
          if (y == 0) return C(0);
          if constexpr (std::is_signed_v<C>) {
            if (y == -1) return C(std::make_unsigned_t<C>(0) - static_cast<std::make_unsigned_t<C>>(x));
          }
          return C(x / y);
        }
      });
    case Binary::Pow:
      return binary_loop<T, T, T>(bc, a, b, out, [](C x, C y) {
        if constexpr (kFloat) {
          return std::pow(x, y);
        } else {
          return int_pow(x, y);
        }
      });
    case Binary::Mod:
      if constexpr (kFloat) {
        if (fmod) return binary_loop<T, T, T>(bc, a, b, out, [](C x, C y) { return std::fmod(x, y); });
        return binary_loop<T, T, T>(bc, a, b, out, [](C x, C y) {
          C r = std::fmod(x, y);  // NaN for an infinite x or a zero y
          if (r == 0) return std::copysign(C(0), y);
          return (r < 0) != (y < 0) ? C(r + y) : r;
        });
      } else {
        return binary_loop<T, T, T>(bc, a, b, out, [fmod](C x, C y) {
          if (y == 0) return C(0);
          if constexpr (std::is_signed_v<C>) {
            if (y == -1) return C(0);
            const C r = C(x % y);
            return (!fmod && r != 0 && ((r < 0) != (y < 0))) ? C(r + y) : r;
          } else {
            static_cast<void>(fmod);  // unsigned: both conventions give the same remainder
            return C(x % y);
          }
        });
      }
    case Binary::PRelu:
      return binary_loop<T, T, T>(bc, a, b, out, [](C x, C slope) { return x < C(0) ? C(slope * x) : x; });
    default:
      break;
  }
  throw Error("unreachable binary op");
}

template <class T>
void run_comparison(Binary op, const Broadcast<2>& bc, const Tensor& a, const Tensor& b, Tensor& out) {
  using C = compute_t<T>;
  switch (op) {
    case Binary::Equal: return binary_loop<T, T, bool>(bc, a, b, out, [](C x, C y) { return x == y; });
    case Binary::Greater: return binary_loop<T, T, bool>(bc, a, b, out, [](C x, C y) { return x > y; });
    case Binary::Less: return binary_loop<T, T, bool>(bc, a, b, out, [](C x, C y) { return x < y; });
    case Binary::GreaterOrEqual:
      return binary_loop<T, T, bool>(bc, a, b, out, [](C x, C y) { return x >= y; });
    case Binary::LessOrEqual:
      return binary_loop<T, T, bool>(bc, a, b, out, [](C x, C y) { return x <= y; });
    case Binary::And: return binary_loop<T, T, bool>(bc, a, b, out, [](C x, C y) { return x && y; });
    case Binary::Or: return binary_loop<T, T, bool>(bc, a, b, out, [](C x, C y) { return x || y; });
    case Binary::Xor: return binary_loop<T, T, bool>(bc, a, b, out, [](C x, C y) { return x != y; });
    default:
      break;
  }
  throw Error("unreachable comparison op");
}

bool is_comparison(Binary op) {
  return op == Binary::Equal || op == Binary::Greater || op == Binary::Less ||
         op == Binary::GreaterOrEqual || op == Binary::LessOrEqual;
}
bool is_logic(Binary op) { return op == Binary::And || op == Binary::Or || op == Binary::Xor; }

struct LegacyBroadcast {
  bool enabled = false;  // opset < 7 and the op has the attribute
  bool broadcast = false;
  std::optional<int64_t> axis;
};

// B viewed so that numpy broadcasting reproduces the opset-1..6 rule: B's dims line up with
// A's starting at `axis`.
Tensor legacy_align(const LegacyBroadcast& legacy, const KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  if (!legacy.broadcast) {
    if (a.shape() != b.shape()) {
      fail("inputs " + ctx.input_name(0) + " " + a.shape().to_string() + " and " +
           ctx.input_name(1) + " " + b.shape().to_string() +
           " differ in shape and the attribute 'broadcast' is 0 (opset < 7)");
    }
    return b;
  }
  if (!legacy.axis) return b;
  const auto rank = static_cast<int64_t>(a.shape().size());
  const int64_t axis = normalize_axis(*legacy.axis, rank, "attribute 'axis'");
  const auto b_rank = static_cast<int64_t>(b.shape().size());
  if (axis + b_rank > rank) {
    fail("input " + ctx.input_name(1) + " " + b.shape().to_string() + " does not fit in " +
         ctx.input_name(0) + " " + a.shape().to_string() + " at axis " + std::to_string(axis));
  }
  Shape aligned;
  for (int64_t d = 0; d < b_rank; ++d) aligned.push_back(b.shape()[static_cast<size_t>(d)]);
  for (int64_t d = axis + b_rank; d < rank; ++d) aligned.push_back(1);
  return b.view(aligned);
}

}  // namespace

void add_broadcast(const Broadcast<2>& bc, const Tensor& a, const Tensor& b, Tensor& out, const std::string& what) {
  visit_dtype<NumericTypes>(a.dtype(), what, [&]<class T>() { run_arithmetic<T>(Binary::Add, false, bc, a, b, out); });
}

std::unique_ptr<Kernel> make_binary(const KernelInit& init) {
  const auto it = binary_ops().find(init.op_type());
  if (it == binary_ops().end()) throw Error("no binary kernel for " + init.op_type());
  const Binary op = it->second;
  LegacyBroadcast legacy;
  if (init.opset() < 7 && op != Binary::PRelu) {
    legacy.enabled = true;
    legacy.broadcast = init.attr_int("broadcast", 0) != 0;
    if (init.has_attr("axis")) legacy.axis = init.attr_int("axis", 0);
  }
  const bool fmod = init.attr_int("fmod", 0) != 0;
  const bool mixed_pow = op == Binary::Pow && init.opset() >= 12;
  const bool channel_slope = op == Binary::PRelu && init.opset() < 7;
  return make_kernel([=](KernelContext& ctx) {
    const Tensor& a = ctx.input(0);
    Tensor b = legacy.enabled ? legacy_align(legacy, ctx) : ctx.input(1);
    if (channel_slope && b.rank() == 1 && a.rank() >= 2 && b.numel() == a.shape()[1] && b.numel() != 1) {
      // PRelu-1/6: a 1-D slope holds one value per channel (dim 1), as PyTorch exported it.
      Shape per_channel = Shape::filled(a.rank() - 1, 1);
      per_channel[0] = b.numel();
      b = b.view(per_channel);
    }
    const bool mixed = mixed_pow && a.dtype() != b.dtype();
    if (a.dtype() != b.dtype() && !mixed) {
      fail("inputs " + ctx.input_name(0) + " (" + std::string(dtype_name(a.dtype())) + ") and " +
           ctx.input_name(1) + " (" + std::string(dtype_name(b.dtype())) + ") must have the same type");
    }
    Broadcast<2> bc({&a.shape(), &b.shape()});
    if (op == Binary::PRelu && bc.shape() != a.shape()) {
      fail("slope " + ctx.input_name(1) + " " + b.shape().to_string() +
           " does not broadcast to the shape of " + ctx.input_name(0) + " " + a.shape().to_string());
    }
    const bool bool_out = is_comparison(op) || is_logic(op);
    Tensor& out = ctx.allocate_output(0, bool_out ? DataType::Bool : a.dtype(), bc.shape());
    const std::string what = "input " + ctx.input_name(0);
    if (mixed) {
      // Pow-12+: base and exponent of different types; evaluated in double.
      visit_dtype<NumericTypes>(a.dtype(), what, [&]<class T>() {
        visit_dtype<NumericTypes>(b.dtype(), "exponent " + ctx.input_name(1), [&]<class E>() {
          binary_loop<T, E, T>(bc, a, b, out, [](auto x, auto y) {
            return std::pow(static_cast<double>(x), static_cast<double>(y));
          });
        });
      });
    } else if (a.dtype() == DataType::String) {
      // Equal-19 compares strings (the rows admit strings for Equal only).
      if (op != Binary::Equal) fail(what + " is a string tensor; only Equal compares strings");
      const std::string* pa = a.data<std::string>();
      const std::string* pb = b.data<std::string>();
      bool* po = out.data<bool>();
      bc.for_each_run([&](int64_t o, const auto& in, int64_t len, const auto& step) {
        for (int64_t i = 0; i < len; ++i) po[o + i] = pa[in[0] + i * step[0]] == pb[in[1] + i * step[1]];
      });
    } else if (is_logic(op)) {
      visit_dtype<TypeList<bool>>(a.dtype(), what, [&]<class T>() { run_comparison<T>(op, bc, a, b, out); });
    } else if (is_comparison(op)) {
      visit_dtype<AllTypes>(a.dtype(), what, [&]<class T>() { run_comparison<T>(op, bc, a, b, out); });
    } else {
      visit_dtype<NumericTypes>(a.dtype(), what, [&]<class T>() { run_arithmetic<T>(op, fmod, bc, a, b, out); });
    }
  });
}

// Min, Max, Sum, Mean over one or more inputs of one type, broadcast together (numpy rules;
// the opset-1..7 versions required equal shapes, a subset of this). The output starts as a
// broadcast copy of the first input and each further input is folded in.
std::unique_ptr<Kernel> make_variadic(const KernelInit& init) {
  enum class Fold { Min, Max, Sum, Mean };
  const std::string& name = init.op_type();
  const Fold fold = name == "Min" ? Fold::Min : name == "Max" ? Fold::Max : name == "Sum" ? Fold::Sum : Fold::Mean;
  return make_kernel([fold](KernelContext& ctx) {
    const int n = ctx.num_inputs();
    if (n == 0 || !ctx.has_input(0)) fail("needs at least one input");
    const Tensor& first = ctx.input(0);
    Shape shape = first.shape();
    for (int i = 1; i < n; ++i) {
      const Tensor& t = ctx.input(i);
      if (t.dtype() != first.dtype()) {
        fail("input " + ctx.input_name(i) + " is " + std::string(dtype_name(t.dtype())) + " but " +
             ctx.input_name(0) + " is " + std::string(dtype_name(first.dtype())));
      }
      shape = broadcast_shapes(shape, t.shape());
    }
    Tensor& out = ctx.allocate_output(0, first.dtype(), shape);
    visit_dtype<NumericTypes>(first.dtype(), "input " + ctx.input_name(0), [&]<class T>() {
      using C = compute_t<T>;
      {
        Broadcast<2> bc({&shape, &first.shape()});
        binary_loop<T, T, T>(bc, out, first, out, [](C, C y) { return y; });
      }
      for (int i = 1; i < n; ++i) {
        const Tensor& t = ctx.input(i);
        Broadcast<2> bc({&shape, &t.shape()});
        switch (fold) {
          case Fold::Min:
            binary_loop<T, T, T>(bc, out, t, out, [](C x, C y) {
              if constexpr (std::is_floating_point_v<C>) {
                if (std::isnan(y)) return y;
              }
              return y < x ? y : x;
            });
            break;
          case Fold::Max:
            binary_loop<T, T, T>(bc, out, t, out, [](C x, C y) {
              if constexpr (std::is_floating_point_v<C>) {
                if (std::isnan(y)) return y;
              }
              return y > x ? y : x;
            });
            break;
          case Fold::Sum:
          case Fold::Mean:
            binary_loop<T, T, T>(bc, out, t, out, [](C x, C y) { return C(x + y); });
            break;
        }
      }
      if (fold == Fold::Mean && n > 1) {
        T* p = out.data<T>();
        const C scale = C(1) / static_cast<C>(n);
        parallel_for(out.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) p[i] = convert<T>(widen(p[i]) * scale);
        });
      }
    });
  });
}

// Where-9/16: out = condition ? X : Y, the three broadcast together.
std::unique_ptr<Kernel> make_where(const KernelInit&) {
  return make_kernel([](KernelContext& ctx) {
    const Tensor& cond = ctx.input(0);
    const Tensor& x = ctx.input(1);
    const Tensor& y = ctx.input(2);
    if (cond.dtype() != DataType::Bool) fail("condition " + ctx.input_name(0) + " must be bool");
    if (x.dtype() != y.dtype()) {
      fail("inputs " + ctx.input_name(1) + " (" + std::string(dtype_name(x.dtype())) + ") and " +
           ctx.input_name(2) + " (" + std::string(dtype_name(y.dtype())) + ") must have the same type");
    }
    Broadcast<3> bc({&cond.shape(), &x.shape(), &y.shape()});
    Tensor& out = ctx.allocate_output(0, x.dtype(), bc.shape());
    visit_dtype<AllTypes>(x.dtype(), "input " + ctx.input_name(1), [&]<class T>() {
      const bool* pc = cond.data<bool>();
      const T* px = x.data<T>();
      const T* py = y.data<T>();
      T* po = out.data<T>();
      bc.for_each_run([&](int64_t o, const auto& in, int64_t len, const auto& step) {
        const bool* c = pc + in[0];
        const T* a = px + in[1];
        const T* b = py + in[2];
        T* z = po + o;
        // Branch-free selects on the bits: a condition like x > 0 is unpredictable.
        if (step[0] && step[1] && step[2]) {
#pragma omp simd
          for (int64_t i = 0; i < len; ++i) z[i] = select_bits(c[i], a[i], b[i]);
        } else if (step[0] && step[1]) {  // y a scalar along the run: dx = Where(x > 0, dy, 0)
          const T bv = *b;
#pragma omp simd
          for (int64_t i = 0; i < len; ++i) z[i] = select_bits(c[i], a[i], bv);
        } else if (step[0] && step[2]) {
          const T av = *a;
#pragma omp simd
          for (int64_t i = 0; i < len; ++i) z[i] = select_bits(c[i], av, b[i]);
        } else {
          for (int64_t i = 0; i < len; ++i) z[i] = c[i * step[0]] ? a[i * step[1]] : b[i * step[2]];
        }
      });
    });
  });
}

}  // namespace onnxtrain::ops
