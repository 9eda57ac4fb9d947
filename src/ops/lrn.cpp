// LRN (ai.onnx versions 1 and 13; ONNX operator doc "LRN") and its backward op LRNGrad.
//
// X [N, C, D1, ..., Dk] (k >= 0), float types -> Y shaped like X:
//   square_sum[n, c, d] = sum of X[n, i, d]^2 for i in [c - floor((size - 1) / 2), c + ceil((size - 1) / 2)]
//                         clipped to [0, C - 1],
//   Y[n, c, d] = X[n, c, d] / (bias + alpha / size * square_sum[n, c, d])^beta.
// Attributes: size (required, >= 1), alpha (default 1e-4), beta (0.75), bias (1). LRN-13 only
// adds bfloat16. float32 with an odd size runs oneDNN's LRN (across channels, which for an odd
// size sums the same window and scales alpha by 1 / size as ONNX does; for an even size its
// window is not ONNX's, so those run the loops below); everything else runs plain loops in
// compute_t<T> (float for float16/bfloat16).
//
// LRNGrad(dY, X) -> dX (domain ai.onnxtrain, version 1, LRN's attributes), emitted by LRN's
// gradient rule. With s[c] = bias + alpha / size * square_sum[c] and the channels c whose
// window holds j (c in [j - ceil((size - 1) / 2), j + floor((size - 1) / 2)]):
//   dX[j] = dY[j] s[j]^-beta - 2 alpha beta / size X[j] sum_c dY[c] X[c] s[c]^(-beta - 1).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/dnnl_util.h"
#include "ops/factories.h"

namespace onnxtrain::ops {

namespace {

namespace du = dnnl_util;

struct LrnAttrs {
  int64_t size = 1;
  double alpha = 1e-4, beta = 0.75, bias = 1.0;
  int64_t before() const { return (size - 1) / 2; }     // channels below c in its window
  int64_t after() const { return size - 1 - before(); }  // channels above c
};

LrnAttrs parse_lrn_attrs(const KernelInit& init) {
  LrnAttrs a;
  a.size = init.required_int("size");
  if (a.size < 1) throw Error("attribute 'size' is " + std::to_string(a.size) + ", expected >= 1");
  a.alpha = init.attr_float("alpha", 1e-4f);
  a.beta = init.attr_float("beta", 0.75f);
  a.bias = init.attr_float("bias", 1.0f);
  return a;
}

// X's layout as [N, C, S] with S the product of the spatial dims; throws for rank < 2.
struct LrnShape {
  int64_t n = 0, c = 0, s = 1;
};
LrnShape lrn_shape(const Tensor& x, const std::string& name) {
  if (x.rank() < 2) {
    fail("input " + name + " has shape " + x.shape().to_string() + ", expected rank >= 2 ([N, C, D1, ...])");
  }
  return {x.dim(0), x.dim(1), x.shape().numel(2, x.rank())};
}

// The spatial positions one task handles for every channel.
constexpr int64_t kBlock = 256;

// Calls f(n, s0, s1) over every (batch entry, spatial block) pair, in parallel.
template <class F>
void for_blocks(const LrnShape& sh, F&& f) {
  const int64_t blocks = (sh.s + kBlock - 1) / kBlock;
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, sh.c * kBlock));
  parallel_for(sh.n * blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n = t / blocks, s0 = (t % blocks) * kBlock;
      f(n, s0, std::min(sh.s, s0 + kBlock));
    }
  });
}

// s[c][k] = bias + alpha / size * (sum of X[n, i, s0 + k]^2 over c's window), for one block.
template <class T, class V>
void window_scales(const LrnAttrs& a, const LrnShape& sh, const T* x, int64_t n, int64_t s0, int64_t s1,
                   std::vector<V>& s) {
  const int64_t w = s1 - s0;
  const V coef = static_cast<V>(a.alpha / static_cast<double>(a.size));
  const V bias = static_cast<V>(a.bias);
  s.assign(static_cast<size_t>(sh.c * w), V(0));
  for (int64_t c = 0; c < sh.c; ++c) {
    V* __restrict out = s.data() + c * w;
    const int64_t lo = std::max<int64_t>(0, c - a.before()), hi = std::min(sh.c - 1, c + a.after());
    for (int64_t i = lo; i <= hi; ++i) {
      const T* __restrict xi = x + (n * sh.c + i) * sh.s + s0;
      for (int64_t k = 0; k < w; ++k) {
        const V v = static_cast<V>(xi[k]);
        out[k] += v * v;
      }
    }
    for (int64_t k = 0; k < w; ++k) out[k] = bias + coef * out[k];
  }
}

// Calls f(p) with p(s) = s^-beta: for the common beta = 0.75 (AlexNet's, the default) as
// 1 / (sqrt(s) sqrt(sqrt(s))), which vectorizes where pow does not.
template <class V, class F>
void with_inverse_power(double beta, F&& f) {
  if (beta == 0.75) {
    f([](V s) {
      const V r = std::sqrt(s);
      return V(1) / (r * std::sqrt(r));
    });
  } else {
    f([b = static_cast<V>(-beta)](V s) { return std::pow(s, b); });
  }
}

template <class T>
void lrn_loops(const LrnAttrs& a, const LrnShape& sh, const T* x, T* y) {
  using V = compute_t<T>;
  with_inverse_power<V>(a.beta, [&](auto inv_pow) {
    for_blocks(sh, [&](int64_t n, int64_t s0, int64_t s1) {
      std::vector<V> s;
      window_scales<T, V>(a, sh, x, n, s0, s1, s);
      const int64_t w = s1 - s0;
      for (int64_t c = 0; c < sh.c; ++c) {
        const int64_t base = (n * sh.c + c) * sh.s + s0;
        const V* sc = s.data() + c * w;
        for (int64_t k = 0; k < w; ++k) y[base + k] = static_cast<T>(static_cast<V>(x[base + k]) * inv_pow(sc[k]));
      }
    });
  });
}

template <class T>
void lrn_grad_loops(const LrnAttrs& a, const LrnShape& sh, const T* dy, const T* x, T* dx) {
  using V = compute_t<T>;
  const V coef = static_cast<V>(2 * a.alpha * a.beta / static_cast<double>(a.size));
  with_inverse_power<V>(a.beta, [&](auto inv_pow) {
    for_blocks(sh, [&](int64_t n, int64_t s0, int64_t s1) {
      std::vector<V> s, t;
      window_scales<T, V>(a, sh, x, n, s0, s1, s);
      const int64_t w = s1 - s0;
      t.resize(s.size());  // t[c] = dY[c] X[c] s[c]^(-beta - 1); s becomes s^-beta
      for (int64_t c = 0; c < sh.c; ++c) {
        const int64_t base = (n * sh.c + c) * sh.s + s0;
        for (int64_t k = 0; k < w; ++k) {
          const size_t i = static_cast<size_t>(c * w + k);
          const V p = inv_pow(s[i]);
          t[i] = static_cast<V>(dy[base + k]) * static_cast<V>(x[base + k]) * p / s[i];
          s[i] = p;
        }
      }
      std::vector<V> sum(static_cast<size_t>(w));
      for (int64_t j = 0; j < sh.c; ++j) {
        std::fill(sum.begin(), sum.end(), V(0));
        const int64_t lo = std::max<int64_t>(0, j - a.after()), hi = std::min(sh.c - 1, j + a.before());
        for (int64_t c = lo; c <= hi; ++c) {
          const V* tc = t.data() + c * w;
          for (int64_t k = 0; k < w; ++k) sum[static_cast<size_t>(k)] += tc[k];
        }
        const int64_t base = (n * sh.c + j) * sh.s + s0;
        for (int64_t k = 0; k < w; ++k) {
          const size_t i = static_cast<size_t>(j * w + k);
          const V xj = static_cast<V>(x[base + k]);
          dx[base + k] = static_cast<T>(static_cast<V>(dy[base + k]) * s[i] - coef * xj * sum[static_cast<size_t>(k)]);
        }
      }
    });
  });
}

// oneDNN's LRN forward for one input shape; `ok` false when oneDNN has no implementation.
struct LrnEntry {
  bool ok = false;
  dnnl::lrn_forward primitive;
  dnnl::memory src, dst;
};

LrnEntry make_lrn_entry(const LrnAttrs& a, const Shape& shape) {
  LrnEntry e;
  const dnnl::memory::desc desc = du::plain_f32(du::to_dims(shape));
  const dnnl::engine& engine = du::cpu_engine();
  try {
    const dnnl::lrn_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::lrn_across_channels, desc,
                                    a.size, static_cast<float>(a.alpha), static_cast<float>(a.beta),
                                    static_cast<float>(a.bias));
    e.primitive = dnnl::lrn_forward(dnnl::lrn_forward::primitive_desc(d, engine));
  } catch (const dnnl::error&) {
    return e;
  }
  du::checked("prepare LRN memories", [&] {
    e.src = dnnl::memory(desc, engine, nullptr);
    e.dst = dnnl::memory(desc, engine, nullptr);
  });
  e.ok = true;
  return e;
}

class LrnKernel final : public Kernel {
 public:
  LrnKernel(LrnAttrs a, bool grad) : a_(a), grad_(grad) {}

  void run(KernelContext& ctx) override {
    if (grad_) return run_grad(ctx);
    const Tensor& x = ctx.input(0);
    const LrnShape sh = lrn_shape(x, ctx.input_name(0));
    Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
    if (x.numel() == 0) return;
    if (x.dtype() == DataType::Float32 && a_.size % 2 == 1 && x.rank() <= DNNL_MAX_NDIMS) {
      LrnEntry& e = cache_.get(du::CacheKey().add(x.shape()), [&] { return make_lrn_entry(a_, x.shape()); });
      if (e.ok) {
        dnnl::stream& stream = du::cpu_stream();
        du::checked("run LRN", [&] {
          e.src.set_data_handle(const_cast<void*>(x.raw_data()));
          e.dst.set_data_handle(y.raw_data());
          e.primitive.execute(stream, {{DNNL_ARG_SRC, e.src}, {DNNL_ARG_DST, e.dst}});
          stream.wait();
        });
        return;
      }
    }
    visit_dtype<FloatTypes>(x.dtype(), "LRN input " + ctx.input_name(0),
                            [&]<class T>() { lrn_loops<T>(a_, sh, x.data<T>(), y.data<T>()); });
  }

 private:
  void run_grad(KernelContext& ctx) {
    const Tensor& dy = ctx.input(0);
    const Tensor& x = ctx.input(1);
    const LrnShape sh = lrn_shape(x, ctx.input_name(1));
    if (dy.dtype() != x.dtype() || dy.shape() != x.shape()) {
      fail("input " + ctx.input_name(0) + " is " + dy.description() + ", expected " + x.description() +
           " like " + ctx.input_name(1));
    }
    Tensor& dx = ctx.allocate_output(0, x.dtype(), x.shape());
    if (x.numel() == 0) return;
    visit_dtype<FloatTypes>(x.dtype(), "LRNGrad input " + ctx.input_name(1), [&]<class T>() {
      lrn_grad_loops<T>(a_, sh, dy.data<T>(), x.data<T>(), dx.data<T>());
    });
  }

  LrnAttrs a_;
  bool grad_;
  du::PrimitiveCache<LrnEntry> cache_;
};

}  // namespace

std::unique_ptr<Kernel> make_lrn(const KernelInit& init) {
  return std::make_unique<LrnKernel>(parse_lrn_attrs(init), init.op_type() == "LRNGrad");
}

}  // namespace onnxtrain::ops
