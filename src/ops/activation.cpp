// Transformer activations (ONNX operator docs): Gelu-20, Swish-24, Mish-18/22, SwiGLU-28, and
// their backward ops of the ai.onnxtrain domain (emitted by autodiff/rules_transformer.cpp).
//
//   Gelu     approximate "none": y = x Phi(x) = 0.5 x (1 + erf(x / sqrt 2))
//            approximate "tanh": y = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
//   Swish    y = x sigmoid(alpha x)                              (alpha default 1)
//   Mish     y = x tanh(softplus(x)),  softplus(x) = ln(1 + e^x)
//   SwiGLU   y = A sigmoid(alpha A) B, A and B of one shape (the op does not broadcast)
// All elementwise over float32, float64, float16 and bfloat16 (Mish-18: no bfloat16, which the
// registry rows enforce); float16/bfloat16 compute in float and round once on store.
//
// Backward ops, dY first, outputs shaped like the inputs:
//   GeluGrad(dY, X[, shape]) -> dX[, dB]   attribute approximate as Gelu; with the optional
//                                input shape (1-D int64) and output dB: dB = SumToShape(dX,
//                                shape), the gradient of a bias added before the Gelu
//                                (runtime/fusion.h fuse_gelu_bias_grad), summed while dX is made
//                                where shape is X's last dim (with leading 1s), else after it:
//                                the bits of GeluGrad then SumToShape
//   SwishGrad(dY, X) -> dX       attribute alpha
//   MishGrad(dY, X) -> dX
//   SwiGLUGrad(dY, A, B) -> dA, dB   attribute alpha (either output may be omitted)
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <string>
#include <vector>

#include "core/dispatch.h"
#include "core/vector_math.h"
#include "core/parallel.h"
#include "ops/factories.h"
#include "ops/sum_to_shape.h"

namespace onnxtrain::ops {

namespace {

// The derivative formulas, each a function of x in V (float or double).
template <class V>
V sigmoid(V z) {
  return V(1) / (V(1) + std::exp(-z));
}
template <class V>
V softplus(V x) {
  // ln(1 + e^x) = x + ln(1 + e^-x) for large x, where e^x overflows.
  return x > V(20) ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
}

constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;               // Gelu doc's tanh approximation

template <class V>
V gelu(V x, bool tanh_approx) {
  if (tanh_approx) {
    const V u = V(kSqrt2OverPi) * (x + V(kGeluCubic) * x * x * x);
    return V(0.5) * x * (V(1) + std::tanh(u));
  }
  return V(0.5) * x * (V(1) + std::erf(x * V(std::numbers::sqrt2 / 2)));
}
// d gelu / dx: Phi(x) + x phi(x), or for tanh: 0.5 (1 + t) + 0.5 x (1 - t^2) u'(x).
template <class V>
V gelu_derivative(V x, bool tanh_approx) {
  if (tanh_approx) {
    const V u = V(kSqrt2OverPi) * (x + V(kGeluCubic) * x * x * x);
    const V t = std::tanh(u);
    const V du = V(kSqrt2OverPi) * (V(1) + V(3 * kGeluCubic) * x * x);
    return V(0.5) * (V(1) + t) + V(0.5) * x * (V(1) - t * t) * du;
  }
  const V cdf = V(0.5) * (V(1) + std::erf(x * V(std::numbers::sqrt2 / 2)));
  const V pdf = std::exp(V(-0.5) * x * x) * V(0.5 * std::numbers::inv_sqrtpi * std::numbers::sqrt2);
  return cdf + x * pdf;
}
// d swish / dx = s + alpha x s (1 - s), s = sigmoid(alpha x).
template <class V>
V swish_derivative(V x, V alpha) {
  const V s = sigmoid(alpha * x);
  return s + alpha * x * s * (V(1) - s);
}
template <class V>
V mish(V x) {
  return x * std::tanh(softplus(x));
}
// d mish / dx = tanh(sp) + x (1 - tanh(sp)^2) sigmoid(x), since d softplus / dx = sigmoid(x).
template <class V>
V mish_derivative(V x) {
  const V t = std::tanh(softplus(x));
  return t + x * (V(1) - t * t) * sigmoid(x);
}

// out[i] = f(in[i]) (one input) in compute_t<T>.
template <class T, class F>
void map1(const Tensor& x, Tensor& y, F f) {
  using V = compute_t<T>;
  const T* in = x.data<T>();
  T* out = y.data<T>();
  parallel_for(x.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = convert<T>(f(static_cast<V>(in[i])));
  });
}
// out[i] = f(a[i], b[i]).
template <class T, class F>
void map2(const Tensor& a, const Tensor& b, Tensor& y, F f) {
  using V = compute_t<T>;
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* out = y.data<T>();
  parallel_for(a.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = convert<T>(f(static_cast<V>(pa[i]), static_cast<V>(pb[i])));
  });
}

// Inputs i and j must have one dtype and one shape (no broadcasting).
void require_same(const KernelContext& ctx, int i, int j) {
  const Tensor& a = ctx.input(i);
  const Tensor& b = ctx.input(j);
  if (a.dtype() != b.dtype() || !(a.shape() == b.shape())) {
    fail("input " + ctx.input_name(j) + " is " + b.description() + ", expected " + a.description() +
         " like input " + ctx.input_name(i) + " (" + ctx.node().op_type + " does not broadcast)");
  }
}

// float32 Gelu (approximate "none") and its derivative through core/vector_math's gelu and
// gelu_backward (one pass, one e^(-x^2 / 2) per element for both Phi and phi), which the
// per-element std::erf / std::exp above do not vectorize. out = Gelu(x) when dy is null, else
// dy Gelu'(x).
void gelu_float(const float* x, const float* dy, float* out, int64_t n) {
  parallel_for(n, kParallelGrain, [&](int64_t begin, int64_t end) {
    if (dy) {
      vmath::gelu_backward(dy + begin, x + begin, out + begin, end - begin);
    } else {
      vmath::gelu(x + begin, out + begin, end - begin);
    }
  });
}

enum class Act { Gelu, Swish, Mish };

struct ActSpec {
  Act act = Act::Gelu;
  bool tanh_approx = false;  // Gelu
  double alpha = 1.0;        // Swish, SwiGLU
};

// y = act(x), or dY act'(x) with dY = input 0 when `backward`.
void run_activation_values(KernelContext& ctx, const ActSpec& spec, bool backward, const Tensor& x, Tensor& y) {
  const int xi = backward ? 1 : 0;
  visit_dtype<FloatTypes>(x.dtype(), "input " + ctx.input_name(xi), [&]<class T>() {
    using V = compute_t<T>;
    const bool ta = spec.tanh_approx;
    const V alpha = static_cast<V>(spec.alpha);
    if constexpr (std::is_same_v<T, float>) {
      if (spec.act == Act::Gelu && !ta) {
        return gelu_float(x.data<float>(), backward ? ctx.input(0).data<float>() : nullptr, y.data<float>(), x.numel());
      }
    }
    if (!backward) {
      switch (spec.act) {
        case Act::Gelu: return map1<T>(x, y, [ta](V v) { return gelu(v, ta); });
        case Act::Swish: return map1<T>(x, y, [alpha](V v) { return v * sigmoid(alpha * v); });
        case Act::Mish: return map1<T>(x, y, [](V v) { return mish(v); });
      }
    }
    const Tensor& dy = ctx.input(0);
    switch (spec.act) {
      case Act::Gelu: return map2<T>(dy, x, y, [ta](V g, V v) { return g * gelu_derivative(v, ta); });
      case Act::Swish: return map2<T>(dy, x, y, [alpha](V g, V v) { return g * swish_derivative(v, alpha); });
      case Act::Mish: return map2<T>(dy, x, y, [](V g, V v) { return g * mish_derivative(v); });
    }
  });
}

// GeluGrad's dX = dY Gelu'(X) (float32, approximate "none") and db = SumToShape(dX, target) for a
// target sums_to_last_dim allows: each row of dX made by vmath::gelu_backward and added to its
// range's sums while in cache, in sum_row_ranges' order, so the bits of GeluGrad then SumToShape.
void gelu_grad_with_bias_grad(const float* dy, const float* x, float* dx, const Shape& shape, float* db) {
  const int64_t n = shape[shape.size() - 1];
  const std::vector<float> sums = sum_row_ranges<float>(shape, static_cast<size_t>(n), [&](int64_t, int64_t r0, int64_t r1, float* acc) {
    for (int64_t r = r0; r < r1; ++r) {
      vmath::gelu_backward(dy + r * n, x + r * n, dx + r * n, n);
      const float* __restrict row = dx + r * n;
      float* __restrict sum = acc;
      for (int64_t i = 0; i < n; ++i) sum[i] += row[i];
    }
  });
  std::copy(sums.begin(), sums.end(), db);
}

// Y = act(X) (forward) or dX = dY act'(X) (backward: inputs dY, X; GeluGrad with input 2 also
// dB = SumToShape(dX, input 2) as output 1).
void run_activation(KernelContext& ctx, const ActSpec& spec, bool backward) {
  const int xi = backward ? 1 : 0;
  const Tensor& x = ctx.input(xi);
  if (backward) require_same(ctx, 1, 0);
  Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
  if (backward && ctx.num_inputs() > 2 && ctx.has_input(2) && ctx.has_output(1)) {
    const Shape target = shape_input(ctx, 2);
    check_sum_to_shape(x.shape(), target, "dX (shaped like input " + ctx.input_name(1) + ")");
    Tensor& db = ctx.allocate_output(1, x.dtype(), target);
    if (x.dtype() == DataType::Float32 && spec.act == Act::Gelu && !spec.tanh_approx && sums_to_last_dim(x.shape(), target)) {
      gelu_grad_with_bias_grad(ctx.input(0).data<float>(), x.data<float>(), y.data<float>(), x.shape(), db.data<float>());
      return;
    }
    run_activation_values(ctx, spec, true, x, y);
    if (target == x.shape()) {
      std::memcpy(db.raw_data(), y.raw_data(), y.nbytes());
    } else {
      sum_to_shape_into(y, target, db);
    }
    return;
  }
  run_activation_values(ctx, spec, backward, x, y);
}

void run_swiglu(KernelContext& ctx, double alpha_d) {
  require_same(ctx, 0, 1);
  const Tensor& a = ctx.input(0);
  Tensor& y = ctx.allocate_output(0, a.dtype(), a.shape());
  visit_dtype<FloatTypes>(a.dtype(), "input " + ctx.input_name(0), [&]<class T>() {
    using V = compute_t<T>;
    const V alpha = static_cast<V>(alpha_d);
    map2<T>(a, ctx.input(1), y, [alpha](V va, V vb) { return va * sigmoid(alpha * va) * vb; });
  });
}

// dA = dY B swish'(A), dB = dY swish(A).
void run_swiglu_grad(KernelContext& ctx, double alpha_d) {
  require_same(ctx, 1, 0);
  require_same(ctx, 1, 2);
  const Tensor& dy = ctx.input(0);
  const Tensor& a = ctx.input(1);
  const Tensor& b = ctx.input(2);
  Tensor da = ctx.allocate_output(0, a.dtype(), a.shape());  // copies: scratch when not asked for
  Tensor db = ctx.allocate_output(1, a.dtype(), a.shape());
  visit_dtype<FloatTypes>(a.dtype(), "input " + ctx.input_name(1), [&]<class T>() {
    using V = compute_t<T>;
    const V alpha = static_cast<V>(alpha_d);
    const T* pg = dy.data<T>();
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* pda = da.data<T>();
    T* pdb = db.data<T>();
    parallel_for(a.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const V g = static_cast<V>(pg[i]), va = static_cast<V>(pa[i]), vb = static_cast<V>(pb[i]);
        const V s = sigmoid(alpha * va);
        pda[i] = convert<T>(g * vb * (s + alpha * va * s * (V(1) - s)));
        pdb[i] = convert<T>(g * va * s);
      }
    });
  });
}

ActSpec parse_activation(const KernelInit& init) {
  const std::string& op = init.op_type();
  ActSpec spec;
  if (op == "Gelu" || op == "GeluGrad") {
    const std::string approximate = init.attr_string("approximate", "none");
    if (approximate != "none" && approximate != "tanh") {
      fail("attribute 'approximate' = '" + approximate + "' is not one of 'none', 'tanh'");
    }
    spec.tanh_approx = approximate == "tanh";
  } else if (op == "Swish" || op == "SwishGrad") {
    spec.act = Act::Swish;
    spec.alpha = init.attr_float("alpha", 1.0f);
  } else {
    spec.act = Act::Mish;
  }
  return spec;
}

}  // namespace

std::unique_ptr<Kernel> make_transformer_activation(const KernelInit& init) {
  const ActSpec spec = parse_activation(init);
  const bool backward = init.op_type().ends_with("Grad");
  return make_kernel([spec, backward](KernelContext& ctx) { run_activation(ctx, spec, backward); });
}

std::unique_ptr<Kernel> make_swiglu(const KernelInit& init) {
  const double alpha = init.attr_float("alpha", 1.0f);
  if (init.op_type() == "SwiGLUGrad") return make_kernel([alpha](KernelContext& ctx) { run_swiglu_grad(ctx, alpha); });
  return make_kernel([alpha](KernelContext& ctx) { run_swiglu(ctx, alpha); });
}

}  // namespace onnxtrain::ops
