// ai.onnxtrain.SyncBatchNormalization and SyncBatchNormalizationGrad: BatchNormalization in
// training mode whose batch statistics cover the global batch of a data-parallel step, the
// shares of all ranks together (docs/distributed.md, "BatchNormalization"; PyTorch's
// torch.nn.SyncBatchNorm). train --sync-batch-norm rewrites training-mode BatchNormalization
// nodes into it (distributed/sync_batch_norm.h). Per-channel partial sums go through
// RunContext::sum_across_ranks; without it (one process) both ops are BatchNormalization's
// training mode and its gradient.
//
// SyncBatchNormalization(X [N, C, D1..Dn] or [N], scale [C], B [C], input_mean [C],
//   input_var [C]; epsilon = 1e-5, momentum = 0.9) -> Y, running_mean, running_var,
//   current_mean, current_var (all but Y optional). m = the element count per channel of all
//   ranks; current_mean = sum(x) / m, then current_var = sum((x - current_mean)^2) / m (two
//   passes, each one sum across ranks: the population variance, as ONNX's current_var);
//   Y = (X - current_mean) / sqrt(current_var + epsilon) * scale + B;
//   running = input * momentum + current * (1 - momentum) (ONNX BatchNormalization-15).
//   The four statistics are typed like input_mean.
// SyncBatchNormalizationGrad(dY, X, scale[, current_mean, current_var]; epsilon) -> dX, dscale,
//   dB. Without the statistics it computes them again as above. With g = dY, xhat =
//   (x - mean) invstd, this rank's sums p1 = sum(g), p2 = sum(g xhat) over its m_s elements:
//   dscale = p2 and dB = p1 (the trainer averages them weighted by m_s / m, giving the global
//   batch's sums over the per-rank means), and with Q1 = sum_r m_r p1_r, Q2 = sum_r m_r p2_r:
//     dX = scale invstd (g - Q1 / (m m_s) - xhat Q2 / (m m_s)).
//   That is the global gradient divided by this rank's weight m_s / m, which the trainer's
//   weighted mean of the gradients multiplies back: N ranks then equal one process for uneven
//   shares too. With one rank, Q1 / (m m_s) = mean(g): the ordinary BatchNormalization gradient.
// BatchNormalizationGrad (same inputs, outputs and attribute) is that one-rank gradient, never
//   summed across ranks: the rule of BatchNormalization in training mode emits it
//   (autodiff/rules_nn.cpp). With one process both gradients run each channel in one go (its
//   planes stay in cache: statistics, the sums, dX); across ranks, one pass over all channels
//   between the sums across ranks.
// Sums accumulate in double; Y is computed in double and rounded once; dX is computed in
// compute_t<T> (float for float32, Float16 and BFloat16 data) from double per-channel factors.
#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/factories.h"

namespace onnxtrain::ops {

namespace {

// X seen as [batch, channels, size]: a 1-D X has one channel.
struct Layout {
  int64_t batch = 0, channels = 1, size = 1;
  double count() const { return static_cast<double>(batch * size); }  // elements per channel
};

Layout layout_of(const KernelContext& ctx, int i) {
  const Tensor& x = ctx.input(i);
  if (x.rank() == 0) fail("input " + ctx.input_name(i) + " is a scalar, expected [N, C, D1..Dn] or [N]");
  Layout l;
  l.batch = x.dim(0);
  l.channels = x.rank() == 1 ? 1 : x.dim(1);
  l.size = x.shape().numel(std::min<size_t>(2, x.rank()), x.rank());
  return l;
}

std::vector<double> per_channel(const KernelContext& ctx, int i, const Layout& l) {
  const Tensor& t = ctx.input(i);
  if (t.rank() != 1 || t.dim(0) != l.channels || !is_floating(t.dtype())) {
    fail("input " + ctx.input_name(i) + " is " + t.description() + ", expected a floating [" +
         std::to_string(l.channels) + "] (one value per channel of input " + ctx.input_name(0) + ")");
  }
  return t.to_double_vector();
}

// In place: each element becomes its sum over the ranks (nothing with one process).
void sum_across_ranks(const KernelContext& ctx, std::vector<double>& values) {
  const auto& sum = ctx.run_context().sum_across_ranks;
  if (sum) sum(std::span<double>(values));
}

// Per channel c, the sum in double of term(x[e], c, e) over this rank's elements e of channel c
// (e the flat index into X).
template <class T, class Term>
std::vector<double> channel_sums(const T* x, const Layout& l, Term term) {
  std::vector<double> sums(static_cast<size_t>(l.channels), 0.0);
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, l.batch * l.size));
  parallel_for(l.channels, grain, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      double s = 0;
      for (int64_t n = 0; n < l.batch; ++n) {
        const int64_t offset = (n * l.channels + c) * l.size;
        for (int64_t i = 0; i < l.size; ++i) s += term(convert<double>(x[offset + i]), c, offset + i);
      }
      sums[static_cast<size_t>(c)] = s;
    }
  });
  return sums;
}

struct Statistics {
  std::vector<double> mean, var;
};

// The global batch's per-channel mean and population variance (two sums across ranks).
Statistics global_statistics(const KernelContext& ctx, int xi, const Layout& l) {
  const Tensor& x = ctx.input(xi);
  Statistics s;
  visit_dtype<FloatTypes>(x.dtype(), "input " + ctx.input_name(xi), [&]<class T>() {
    const T* px = x.data<T>();
    std::vector<double> sums = channel_sums(px, l, [](double v, int64_t, int64_t) { return v; });
    sums.push_back(l.count());
    sum_across_ranks(ctx, sums);
    const double count = sums.back();
    if (count == 0) fail("input " + ctx.input_name(xi) + " is " + x.description() + ": no batch statistics on any rank");
    s.mean.assign(sums.begin(), sums.end() - 1);
    for (double& m : s.mean) m /= count;
    s.var = channel_sums(px, l, [&](double v, int64_t c, int64_t) {
      const double d = v - s.mean[static_cast<size_t>(c)];
      return d * d;
    });
    sum_across_ranks(ctx, s.var);
    for (double& v : s.var) v /= count;
  });
  return s;
}

Tensor channel_tensor(DataType dtype, const std::vector<double>& values) {
  Tensor t(dtype, Shape{static_cast<int64_t>(values.size())});
  visit_dtype<FloatTypes>(dtype, "statistics", [&]<class T>() {
    for (size_t i = 0; i < values.size(); ++i) t.data<T>()[i] = convert<T>(values[i]);
  });
  return t;
}

// out[e] = f(e, c) over every element e of X, c its channel.
template <class T, class F>
void for_each_element(T* out, const Layout& l, F f) {
  const int64_t planes = l.batch * l.channels;
  parallel_for(planes, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, l.size)), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t c = p % l.channels;
      for (int64_t e = p * l.size; e < (p + 1) * l.size; ++e) out[e] = convert<T>(f(e, c));
    }
  });
}

void run_sync_batch_norm(KernelContext& ctx, double epsilon, double momentum) {
  const Layout l = layout_of(ctx, 0);
  const std::vector<double> scale = per_channel(ctx, 1, l), bias = per_channel(ctx, 2, l);
  const std::vector<double> input_mean = per_channel(ctx, 3, l), input_var = per_channel(ctx, 4, l);
  const Statistics s = global_statistics(ctx, 0, l);
  std::vector<double> factor(scale.size());
  for (size_t c = 0; c < factor.size(); ++c) factor[c] = scale[c] / std::sqrt(s.var[c] + epsilon);
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
  visit_dtype<FloatTypes>(x.dtype(), "input " + ctx.input_name(0), [&]<class T>() {
    const T* px = x.data<T>();
    for_each_element(y.data<T>(), l, [&](int64_t e, int64_t c) {
      const size_t k = static_cast<size_t>(c);
      return (convert<double>(px[e]) - s.mean[k]) * factor[k] + bias[k];
    });
  });
  std::vector<double> running_mean(scale.size()), running_var(scale.size());
  for (size_t c = 0; c < scale.size(); ++c) {
    running_mean[c] = input_mean[c] * momentum + s.mean[c] * (1 - momentum);
    running_var[c] = input_var[c] * momentum + s.var[c] * (1 - momentum);
  }
  const DataType stats = ctx.input(3).dtype();
  const std::vector<double>* outputs[] = {&running_mean, &running_var, &s.mean, &s.var};
  for (int i = 1; i <= 4; ++i) {
    if (ctx.has_output(i)) ctx.set_output(i, channel_tensor(stats, *outputs[i - 1]));
  }
}

// ---- the gradient: per-channel loops over contiguous planes, vectorized by the compiler ----

// The sum in double of channel c of x.
template <class T>
double channel_sum(const T* x, const Layout& l, int64_t c) {
  double s = 0;
  for (int64_t n = 0; n < l.batch; ++n) {
    const T* p = x + (n * l.channels + c) * l.size;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < l.size; ++i) s += convert<double>(p[i]);
  }
  return s;
}

// Over channel c, with d = x - mean: sum(d^2) (when `squares`, else 0), sum(g) and sum(g d).
struct GradSums {
  double squares = 0, g = 0, gd = 0;
};
template <class T>
GradSums channel_grad_sums(const T* x, const T* g, const Layout& l, int64_t c, double mean, bool squares) {
  double sq = 0, sg = 0, sgd = 0;
  for (int64_t n = 0; n < l.batch; ++n) {
    const int64_t offset = (n * l.channels + c) * l.size;
    const T *px = x + offset, *pg = g + offset;
    if (squares) {
#pragma omp simd reduction(+ : sq, sg, sgd)
      for (int64_t i = 0; i < l.size; ++i) {
        const double d = convert<double>(px[i]) - mean, v = convert<double>(pg[i]);
        sq += d * d;
        sg += v;
        sgd += v * d;
      }
    } else {
#pragma omp simd reduction(+ : sg, sgd)
      for (int64_t i = 0; i < l.size; ++i) {
        const double v = convert<double>(pg[i]);
        sg += v;
        sgd += v * (convert<double>(px[i]) - mean);
      }
    }
  }
  return {sq, sg, sgd};
}

// dX over channel c: a g + b (x - mean) + k, computed in compute_t<T> (float for float32).
struct DxTerms {
  double mean = 0, a = 0, b = 0, k = 0;
};
template <class T>
void write_channel_dx(const T* x, const T* g, T* dx, const Layout& l, int64_t c, const DxTerms& t) {
  using V = compute_t<T>;
  const V mean = static_cast<V>(t.mean), a = static_cast<V>(t.a), b = static_cast<V>(t.b), k = static_cast<V>(t.k);
  for (int64_t n = 0; n < l.batch; ++n) {
    const int64_t offset = (n * l.channels + c) * l.size;
    const T *px = x + offset, *pg = g + offset;
    T* out = dx + offset;
#pragma omp simd
    for (int64_t i = 0; i < l.size; ++i) out[i] = convert<T>(a * convert<V>(pg[i]) + b * (convert<V>(px[i]) - mean) + k);
  }
}

// With q1 = Q1 / (m m_s) and q2 = Q2 / (m m_s): dX = scale invstd (g - q1 - (x - mean) invstd q2).
DxTerms dx_terms(double mean, double scale, double invstd, double q1, double q2) {
  const double a = scale * invstd;
  return {mean, a, -a * invstd * q2, -a * q1};
}

// What one gradient computes: inputs, per-channel statistics and sums, outputs.
template <class T>
struct GradPass {
  const T *x, *g;
  T* dx;  // null when dX is not asked for
  Layout l;
  const std::vector<double>& scale;
  double epsilon;
  bool given;  // the statistics are inputs (`mean`, `var` hold them)
  std::vector<double> mean, var, p1, p2;
};

// One process: each channel in one go (its planes stay in cache between the passes).
template <class T>
void grad_local(GradPass<T>& p) {
  const double count = p.l.count();
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, p.l.batch * p.l.size));
  parallel_for(p.l.channels, grain, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const size_t k = static_cast<size_t>(c);
      if (!p.given) p.mean[k] = channel_sum(p.x, p.l, c) / count;
      const GradSums s = channel_grad_sums(p.x, p.g, p.l, c, p.mean[k], !p.given);
      if (!p.given) p.var[k] = s.squares / count;
      const double invstd = 1 / std::sqrt(p.var[k] + p.epsilon);
      p.p1[k] = s.g;
      p.p2[k] = s.gd * invstd;
      if (p.dx) write_channel_dx(p.x, p.g, p.dx, p.l, c, dx_terms(p.mean[k], p.scale[k], invstd, s.g / count, p.p2[k] / count));
    }
  });
}

// Data parallel (RunContext::sum_across_ranks): a pass over all channels between the sums
// across ranks, which every rank makes in the same order.
template <class T>
void grad_across_ranks(const KernelContext& ctx, GradPass<T>& p, int xi) {
  const size_t channels = p.scale.size();
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, p.l.batch * p.l.size));
  double count = p.l.count();
  if (!p.given) {
    std::vector<double> sums(channels + 1);
    parallel_for(p.l.channels, grain, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) sums[static_cast<size_t>(c)] = channel_sum(p.x, p.l, c);
    });
    sums.back() = count;
    sum_across_ranks(ctx, sums);
    count = sums.back();
    if (count == 0) fail("input " + ctx.input_name(xi) + " is " + ctx.input(xi).description() + ": no batch statistics on any rank");
    for (size_t c = 0; c < channels; ++c) p.mean[c] = sums[c] / count;
  }
  std::vector<GradSums> s(channels);
  parallel_for(p.l.channels, grain, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      s[static_cast<size_t>(c)] = channel_grad_sums(p.x, p.g, p.l, c, p.mean[static_cast<size_t>(c)], !p.given);
    }
  });
  if (!p.given) {
    for (size_t c = 0; c < channels; ++c) p.var[c] = s[c].squares;
    sum_across_ranks(ctx, p.var);
    for (double& v : p.var) v /= count;
  }
  // [m_s p1, m_s p2, m_s] summed across ranks: Q1, Q2 and m.
  const double local = p.l.count();
  std::vector<double> invstd(channels), q(2 * channels + 1);
  for (size_t c = 0; c < channels; ++c) {
    invstd[c] = 1 / std::sqrt(p.var[c] + p.epsilon);
    p.p1[c] = s[c].g;
    p.p2[c] = s[c].gd * invstd[c];
    q[c] = local * p.p1[c];
    q[channels + c] = local * p.p2[c];
  }
  q.back() = local;
  sum_across_ranks(ctx, q);
  if (!p.dx) return;
  const double denominator = q.back() * local;
  parallel_for(p.l.channels, grain, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const size_t k = static_cast<size_t>(c);
      const DxTerms t = dx_terms(p.mean[k], p.scale[k], invstd[k], q[k] / denominator, q[channels + k] / denominator);
      write_channel_dx(p.x, p.g, p.dx, p.l, c, t);
    }
  });
}

// SyncBatchNormalizationGrad (across_ranks) and BatchNormalizationGrad (never across ranks).
void run_batch_norm_grad(KernelContext& ctx, double epsilon, bool across_ranks) {
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  if (dy.dtype() != x.dtype() || !(dy.shape() == x.shape())) {
    fail("input " + ctx.input_name(0) + " is " + dy.description() + ", expected the type and shape of input " +
         ctx.input_name(1) + " (" + x.description() + ")");
  }
  const Layout l = layout_of(ctx, 1);
  const std::vector<double> scale = per_channel(ctx, 2, l);
  const bool given = ctx.has_input(3) && ctx.has_input(4);
  const bool ranks = across_ranks && ctx.run_context().sum_across_ranks;
  if (!given && !ranks && l.count() == 0) {
    fail("input " + ctx.input_name(1) + " is " + x.description() + ": no batch statistics on any rank");
  }
  visit_dtype<FloatTypes>(x.dtype(), "input " + ctx.input_name(1), [&]<class T>() {
    T* dx = ctx.has_output(0) ? ctx.allocate_output(0, x.dtype(), x.shape()).template data<T>() : nullptr;
    const size_t channels = scale.size();
    GradPass<T> p{x.data<T>(), dy.data<T>(), dx, l, scale, epsilon, given,
                  given ? per_channel(ctx, 3, l) : std::vector<double>(channels),
                  given ? per_channel(ctx, 4, l) : std::vector<double>(channels),
                  std::vector<double>(channels), std::vector<double>(channels)};
    if (ranks) {
      grad_across_ranks(ctx, p, 1);
    } else {
      grad_local(p);
    }
    const DataType param = ctx.input(2).dtype();
    if (ctx.has_output(1)) ctx.set_output(1, channel_tensor(param, p.p2));
    if (ctx.has_output(2)) ctx.set_output(2, channel_tensor(param, p.p1));
  });
}

}  // namespace

std::unique_ptr<Kernel> make_sync_batch_norm(const KernelInit& init) {
  if (init.num_inputs() != 5) fail("SyncBatchNormalization takes 5 inputs (X, scale, B, input_mean, input_var)");
  const double epsilon = init.attr_float("epsilon", 1e-5f), momentum = init.attr_float("momentum", 0.9f);
  return make_kernel([epsilon, momentum](KernelContext& ctx) { run_sync_batch_norm(ctx, epsilon, momentum); });
}

std::unique_ptr<Kernel> make_sync_batch_norm_grad(const KernelInit& init) {
  if (init.num_inputs() != 3 && init.num_inputs() != 5) {
    fail("SyncBatchNormalizationGrad takes 3 or 5 inputs (dY, X, scale[, current_mean, current_var])");
  }
  const double epsilon = init.attr_float("epsilon", 1e-5f);
  return make_kernel([epsilon](KernelContext& ctx) { run_batch_norm_grad(ctx, epsilon, true); });
}

std::unique_ptr<Kernel> make_batch_norm_grad(const KernelInit& init) {
  if (init.num_inputs() != 3 && init.num_inputs() != 5) {
    fail("BatchNormalizationGrad takes 3 or 5 inputs (dY, X, scale[, mean, var])");
  }
  const double epsilon = init.attr_float("epsilon", 1e-5f);
  return make_kernel([epsilon](KernelContext& ctx) { run_batch_norm_grad(ctx, epsilon, false); });
}

}  // namespace onnxtrain::ops
