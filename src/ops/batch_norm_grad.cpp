// ai.onnxtrain.SyncBatchNormalizationGrad and BatchNormalizationGrad: the gradient of
// BatchNormalization in training mode, summed across the ranks of a data-parallel step (train
// --sync-batch-norm, sync_batch_norm.cpp for the forward) or of one process.
//
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
//   (autodiff/rules_nn.cpp). With attribute channel_block = b, dY, X and dX are blocked by b
//   channels, [N, C / b, D1..Dn, b] (runtime/fusion.h block_convolution_tensors): planes under
//   kColumnPlanes run column by column (a plain X's sums in the same order), larger ones block
//   by block (one accumulator per channel of a block).
// Loops: planes (the D1..Dn of one sample and channel) of kColumnPlanes elements or more are
// run channel by channel, vectorized along the plane; with one process each channel in one go
// (its planes stay in cache between the statistics, the sums and dX). Smaller planes (ResNet's
// late layers: 4x4 to 1x1; [N, C] input) are run column by column: X as rows [N, C size], each
// column summed over the rows, vectorized across the columns, each thread's range of channels
// through every pass in one task. Across ranks, one pass over all channels between the sums
// across ranks.
// Sums accumulate in double; dX is computed in compute_t<T> (float for float32, Float16 and
// BFloat16 data) from double per-channel factors.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/batch_norm_channels.h"
#include "ops/factories.h"

namespace onnxtrain::ops {

namespace {

using namespace batch_norm;

int64_t channel_grain(const Layout& l) { return std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, l.batch * l.size)); }

// ---- channel by channel ----

// The per-channel sums keep kLanes partial sums per quantity (added at the end), so the adds
// of a vectorized loop do not wait on each other; the remainder of each plane adds to `rest`.
constexpr int kLanes = 8;

double total(const double (&lanes)[kLanes], double rest) {
  for (double v : lanes) rest += v;
  return rest;
}

// The sum in double of channel c of x.
template <class T>
double channel_sum(const T* x, const Layout& l, int64_t c) {
  double lo[kLanes] = {}, hi[kLanes] = {}, rest = 0;
  for (int64_t n = 0; n < l.batch; ++n) {
    const T* p = x + (n * l.channels + c) * l.size;
    int64_t i = 0;
    for (; i + 2 * kLanes <= l.size; i += 2 * kLanes) {
#pragma omp simd
      for (int k = 0; k < kLanes; ++k) {
        lo[k] += convert<double>(p[i + k]);
        hi[k] += convert<double>(p[i + kLanes + k]);
      }
    }
    for (; i < l.size; ++i) rest += convert<double>(p[i]);
  }
  return total(lo, total(hi, rest));
}

// Over channel c, with d = x - mean: sum(d^2) (when `squares`, else 0), sum(g) and sum(g d).
struct GradSums {
  double squares = 0, g = 0, gd = 0;
};
template <class T>
GradSums channel_grad_sums(const T* x, const T* g, const Layout& l, int64_t c, double mean, bool squares) {
  double sq[kLanes] = {}, sg[kLanes] = {}, sgd[kLanes] = {};
  GradSums rest;
  auto add = [&](double xv, double gv, double& s_sq, double& s_g, double& s_gd) {
    const double d = xv - mean;
    if (squares) s_sq += d * d;
    s_g += gv;
    s_gd += gv * d;
  };
  for (int64_t n = 0; n < l.batch; ++n) {
    const int64_t offset = (n * l.channels + c) * l.size;
    const T *px = x + offset, *pg = g + offset;
    int64_t i = 0;
    for (; i + kLanes <= l.size; i += kLanes) {
#pragma omp simd
      for (int k = 0; k < kLanes; ++k) add(convert<double>(px[i + k]), convert<double>(pg[i + k]), sq[k], sg[k], sgd[k]);
    }
    for (; i < l.size; ++i) add(convert<double>(px[i]), convert<double>(pg[i]), rest.squares, rest.g, rest.gd);
  }
  return {total(sq, rest.squares), total(sg, rest.g), total(sgd, rest.gd)};
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

// One process, planes of kColumnPlanes or more: each channel in one go (its planes stay in cache
// between the passes).
template <class T>
void grad_local(GradPass<T>& p) {
  const double count = p.l.count();
  parallel_for(p.l.channels, channel_grain(p.l), [&](int64_t begin, int64_t end) {
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

// ---- column by column: X as rows [N, width = C size], column j in channel j / size ----

// sums[c] for each channel c of [c0, c1): sum(d^2) (when `squares`), sum(g) and sum(g d) over
// channel c, d = x - mean[c].
template <class T>
void column_grad_sums(const T* x, const T* g, const Layout& l, int64_t c0, int64_t c1, const double* mean, bool squares,
                      GradSums* sums) {
  const int64_t width = l.channels * l.size, first = c0 * l.size, count = (c1 - c0) * l.size;
  const std::vector<double> m = per_column<double>(l, c0, c1, [&](int64_t c) { return mean[c]; });
  std::vector<double> sq(m.size(), 0.0), sg(m.size(), 0.0), sgd(m.size(), 0.0);
  double *__restrict a_sq = sq.data(), *__restrict a_g = sg.data(), *__restrict a_gd = sgd.data();
  const double* __restrict pm = m.data();
  for (int64_t n = 0; n < l.batch; ++n) {
    const T *__restrict px = x + n * width + first, *__restrict pg = g + n * width + first;
#pragma omp simd
    for (int64_t j = 0; j < count; ++j) {
      const double d = convert<double>(px[j]) - pm[j], v = convert<double>(pg[j]);
      if (squares) a_sq[j] += d * d;
      a_g[j] += v;
      a_gd[j] += v * d;
    }
  }
  std::vector<double> s_sq(static_cast<size_t>(c1)), s_g(static_cast<size_t>(c1)), s_gd(static_cast<size_t>(c1));
  add_columns(sq, l, c0, c1, s_sq.data());
  add_columns(sg, l, c0, c1, s_g.data());
  add_columns(sgd, l, c0, c1, s_gd.data());
  for (int64_t c = c0; c < c1; ++c) {
    const size_t k = static_cast<size_t>(c);
    sums[k] = {s_sq[k], s_g[k], s_gd[k]};
  }
}

// dX over the columns of channels [c0, c1), as write_channel_dx.
template <class T>
void column_dx(const T* x, const T* g, T* dx, const Layout& l, int64_t c0, int64_t c1, const DxTerms* terms) {
  using V = compute_t<T>;
  const int64_t width = l.channels * l.size, first = c0 * l.size, count = (c1 - c0) * l.size;
  const std::vector<V> m = per_column<V>(l, c0, c1, [&](int64_t c) { return terms[c].mean; });
  const std::vector<V> a = per_column<V>(l, c0, c1, [&](int64_t c) { return terms[c].a; });
  const std::vector<V> b = per_column<V>(l, c0, c1, [&](int64_t c) { return terms[c].b; });
  const std::vector<V> k = per_column<V>(l, c0, c1, [&](int64_t c) { return terms[c].k; });
  const V *__restrict pm = m.data(), *__restrict pa = a.data(), *__restrict pb = b.data(), *__restrict pk = k.data();
  for (int64_t n = 0; n < l.batch; ++n) {
    const T *__restrict px = x + n * width + first, *__restrict pg = g + n * width + first;
    T* __restrict out = dx + n * width + first;
#pragma omp simd
    for (int64_t j = 0; j < count; ++j) out[j] = convert<T>(pa[j] * convert<V>(pg[j]) + pb[j] * (convert<V>(px[j]) - pm[j]) + pk[j]);
  }
}

// From the sums of channels [c0, c1) of one process: their variances (unless given), the
// outputs dscale (p2) and dB (p1), and the terms of dX.
template <class T>
void finish_channels(GradPass<T>& p, const GradSums* sums, int64_t c0, int64_t c1, DxTerms* terms) {
  const double count = p.l.count();
  for (int64_t c = c0; c < c1; ++c) {
    const size_t k = static_cast<size_t>(c);
    if (!p.given) p.var[k] = sums[k].squares / count;
    const double invstd = 1 / std::sqrt(p.var[k] + p.epsilon);
    p.p1[k] = sums[k].g;
    p.p2[k] = sums[k].gd * invstd;
    terms[k] = dx_terms(p.mean[k], p.scale[k], invstd, sums[k].g / count, p.p2[k] / count);
  }
}

// One process, planes under kColumnPlanes: each thread's range of channels through the statistics,
// the sums and dX in one task (the range stays in its core's cache between the passes).
template <class T>
void grad_columns_local(GradPass<T>& p) {
  const double count = p.l.count();
  std::vector<GradSums> sums(static_cast<size_t>(p.l.channels));
  std::vector<DxTerms> terms(static_cast<size_t>(p.l.channels));
  for_channel_ranges(p.l, [&](int64_t c0, int64_t c1) {
    if (!p.given) {
      column_sums(p.x, p.l, c0, c1, p.mean.data());
      for (int64_t c = c0; c < c1; ++c) p.mean[static_cast<size_t>(c)] /= count;
    }
    column_grad_sums(p.x, p.g, p.l, c0, c1, p.mean.data(), !p.given, sums.data());
    finish_channels(p, sums.data(), c0, c1, terms.data());
    if (p.dx) column_dx(p.x, p.g, p.dx, p.l, c0, c1, terms.data());
  });
}

// ---- block by block: dY, X and dX blocked, planes of kColumnPlanes or more ----

// sums[c] for the B channels c of block cb, as column_grad_sums, with one accumulator per channel
// of the block (batch_norm_channels.h: block_sums).
template <int B, class T>
void block_grad_sums(const T* x, const T* g, const Layout& l, int64_t cb, const double* mean, bool squares,
                     GradSums* sums) {
  const int64_t blocks = l.channels / B, first = cb * B;
  double m[B], sq[B] = {}, sg[B] = {}, sgd[B] = {};
  std::copy(mean + first, mean + first + B, m);
  // The pass, with the squares or without (a test outside the vectorized loop).
  const auto pass = [&]<bool Squares>() {
    for (int64_t n = 0; n < l.batch; ++n) {
      const int64_t offset = (n * blocks + cb) * l.size * B;
      const T *__restrict px = x + offset, *__restrict pg = g + offset;
      for (int64_t s = 0; s < l.size; ++s) {
#pragma omp simd
        for (int k = 0; k < B; ++k) {
          const double d = convert<double>(px[s * B + k]) - m[k], v = convert<double>(pg[s * B + k]);
          if constexpr (Squares) sq[k] += d * d;
          sg[k] += v;
          sgd[k] += v * d;
        }
      }
    }
  };
  if (squares) {
    pass.template operator()<true>();
  } else {
    pass.template operator()<false>();
  }
  for (int k = 0; k < B; ++k) sums[first + k] = {sq[k], sg[k], sgd[k]};
}

// dX over block cb, as write_channel_dx.
template <int B, class T>
void block_dx(const T* x, const T* g, T* dx, const Layout& l, int64_t cb, const DxTerms* terms) {
  using V = compute_t<T>;
  const int64_t blocks = l.channels / B, first = cb * B;
  V m[B], a[B], b[B], k0[B];
  for (int k = 0; k < B; ++k) {
    const DxTerms& t = terms[first + k];
    m[k] = static_cast<V>(t.mean);
    a[k] = static_cast<V>(t.a);
    b[k] = static_cast<V>(t.b);
    k0[k] = static_cast<V>(t.k);
  }
  for (int64_t n = 0; n < l.batch; ++n) {
    const int64_t offset = (n * blocks + cb) * l.size * B;
    const T *__restrict px = x + offset, *__restrict pg = g + offset;
    T* __restrict out = dx + offset;
    for (int64_t s = 0; s < l.size; ++s) {
#pragma omp simd
      for (int k = 0; k < B; ++k) {
        out[s * B + k] = convert<T>(a[k] * convert<V>(pg[s * B + k]) + b[k] * (convert<V>(px[s * B + k]) - m[k]) + k0[k]);
      }
    }
  }
}

// One process, blocked tensors of larger planes: each thread's blocks through the statistics, the
// sums and dX, one block at a time (it stays in cache between the passes).
template <class T>
void grad_blocks_local(GradPass<T>& p) {
  const double count = p.l.count();
  std::vector<GradSums> sums(static_cast<size_t>(p.l.channels));
  std::vector<DxTerms> terms(static_cast<size_t>(p.l.channels));
  with_block(p.l, [&]<int B>() {
    for_channel_blocks(p.l, [&](int64_t cb) {
      const int64_t c0 = cb * B, c1 = c0 + B;
      if (!p.given) {
        block_sums<B>(p.x, p.l, cb, p.mean.data());
        for (int64_t c = c0; c < c1; ++c) p.mean[static_cast<size_t>(c)] /= count;
      }
      block_grad_sums<B>(p.x, p.g, p.l, cb, p.mean.data(), !p.given, sums.data());
      finish_channels(p, sums.data(), c0, c1, terms.data());
      if (p.dx) block_dx<B>(p.x, p.g, p.dx, p.l, cb, terms.data());
    });
  });
}

// ---- one pass over all channels, channel by channel or column by column ----

template <class T>
std::vector<double> sums_of_x(const T* x, const Layout& l) {
  if (by_columns(l)) return column_channel_sums(x, l);
  std::vector<double> sums(static_cast<size_t>(l.channels));
  parallel_for(l.channels, channel_grain(l), [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) sums[static_cast<size_t>(c)] = channel_sum(x, l, c);
  });
  return sums;
}

template <class T>
std::vector<GradSums> grad_sums(const T* x, const T* g, const Layout& l, const std::vector<double>& mean, bool squares) {
  std::vector<GradSums> sums(static_cast<size_t>(l.channels));
  if (by_columns(l)) {
    for_channel_ranges(l, [&](int64_t c0, int64_t c1) { column_grad_sums(x, g, l, c0, c1, mean.data(), squares, sums.data()); });
    return sums;
  }
  parallel_for(l.channels, channel_grain(l), [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      sums[static_cast<size_t>(c)] = channel_grad_sums(x, g, l, c, mean[static_cast<size_t>(c)], squares);
    }
  });
  return sums;
}

template <class T>
void write_dx(const T* x, const T* g, T* dx, const Layout& l, const std::vector<DxTerms>& terms) {
  if (by_columns(l)) {
    for_channel_ranges(l, [&](int64_t c0, int64_t c1) { column_dx(x, g, dx, l, c0, c1, terms.data()); });
    return;
  }
  parallel_for(l.channels, channel_grain(l), [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) write_channel_dx(x, g, dx, l, c, terms[static_cast<size_t>(c)]);
  });
}

// Across ranks (`ranks`: RunContext::sum_across_ranks): a pass over all channels between the sums
// across ranks, which every rank makes in the same order.
template <class T>
void grad_in_passes(const KernelContext& ctx, GradPass<T>& p, int xi, bool ranks) {
  auto sum = [&](std::vector<double>& values) {
    if (ranks) sum_across_ranks(ctx, values);
  };
  const size_t channels = p.scale.size();
  double count = p.l.count();
  if (!p.given) {
    std::vector<double> sums = sums_of_x(p.x, p.l);
    sums.push_back(count);
    sum(sums);
    count = sums.back();
    if (count == 0) fail("input " + ctx.input_name(xi) + " is " + ctx.input(xi).description() + ": no batch statistics on any rank");
    for (size_t c = 0; c < channels; ++c) p.mean[c] = sums[c] / count;
  }
  const std::vector<GradSums> s = grad_sums(p.x, p.g, p.l, p.mean, !p.given);
  if (!p.given) {
    for (size_t c = 0; c < channels; ++c) p.var[c] = s[c].squares;
    sum(p.var);
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
  sum(q);
  if (!p.dx) return;
  const double denominator = q.back() * local;
  std::vector<DxTerms> terms(channels);
  for (size_t c = 0; c < channels; ++c) {
    terms[c] = dx_terms(p.mean[c], p.scale[c], invstd[c], q[c] / denominator, q[channels + c] / denominator);
  }
  write_dx(p.x, p.g, p.dx, p.l, terms);
}

// SyncBatchNormalizationGrad (across_ranks) and BatchNormalizationGrad (never across ranks).
void run_batch_norm_grad(KernelContext& ctx, double epsilon, bool across_ranks, int64_t channel_block) {
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  if (dy.dtype() != x.dtype() || !(dy.shape() == x.shape())) {
    fail("input " + ctx.input_name(0) + " is " + dy.description() + ", expected the type and shape of input " +
         ctx.input_name(1) + " (" + x.description() + ")");
  }
  const Layout l = layout_of(ctx, 1, channel_block);
  const std::vector<double> scale = per_channel(ctx, 2, l, 1);
  const bool given = ctx.has_input(3) && ctx.has_input(4);
  const bool ranks = across_ranks && ctx.run_context().sum_across_ranks;
  if (!given && !ranks && l.count() == 0) {
    fail("input " + ctx.input_name(1) + " is " + x.description() + ": no batch statistics on any rank");
  }
  visit_dtype<FloatTypes>(x.dtype(), "input " + ctx.input_name(1), [&]<class T>() {
    T* dx = ctx.has_output(0) ? ctx.allocate_output(0, x.dtype(), x.shape()).template data<T>() : nullptr;
    const size_t channels = scale.size();
    GradPass<T> p{x.data<T>(), dy.data<T>(), dx, l, scale, epsilon, given,
                  given ? per_channel(ctx, 3, l, 1) : std::vector<double>(channels),
                  given ? per_channel(ctx, 4, l, 1) : std::vector<double>(channels),
                  std::vector<double>(channels), std::vector<double>(channels)};
    if (ranks) {
      grad_in_passes(ctx, p, 1, ranks);  // never blocked: SyncBatchNormalizationGrad takes no channel_block
    } else if (by_blocks(l)) {
      grad_blocks_local(p);
    } else if (!by_columns(l)) {
      grad_local(p);
    } else {
      grad_columns_local(p);
    }
    const DataType param = ctx.input(2).dtype();
    if (ctx.has_output(1)) ctx.set_output(1, channel_tensor(param, p.p2));
    if (ctx.has_output(2)) ctx.set_output(2, channel_tensor(param, p.p1));
  });
}

}  // namespace

std::unique_ptr<Kernel> make_sync_batch_norm_grad(const KernelInit& init) {
  if (init.num_inputs() != 3 && init.num_inputs() != 5) {
    fail("SyncBatchNormalizationGrad takes 3 or 5 inputs (dY, X, scale[, current_mean, current_var])");
  }
  const double epsilon = init.attr_float("epsilon", 1e-5f);
  return make_kernel([epsilon](KernelContext& ctx) { run_batch_norm_grad(ctx, epsilon, true, 0); });
}

std::unique_ptr<Kernel> make_batch_norm_grad(const KernelInit& init) {
  if (init.num_inputs() != 3 && init.num_inputs() != 5) {
    fail("BatchNormalizationGrad takes 3 or 5 inputs (dY, X, scale[, mean, var])");
  }
  const double epsilon = init.attr_float("epsilon", 1e-5f);
  const int64_t channel_block = init.attr_int("channel_block", 0);
  if (channel_block < 0) fail("attribute channel_block is " + std::to_string(channel_block) + ", expected 0 or more");
  return make_kernel([epsilon, channel_block](KernelContext& ctx) { run_batch_norm_grad(ctx, epsilon, false, channel_block); });
}

}  // namespace onnxtrain::ops
