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
// The gradients, SyncBatchNormalizationGrad and BatchNormalizationGrad, are in batch_norm_grad.cpp.
// Sums accumulate in double (planes under kColumnPlanes elements column by column,
// batch_norm_channels.h); Y is computed in double and rounded once.
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
    const bool columns = l.size < kColumnPlanes;  // small planes: column by column
    std::vector<double> sums =
        columns ? column_channel_sums(px, l) : channel_sums(px, l, [](double v, int64_t, int64_t) { return v; });
    sums.push_back(l.count());
    sum_across_ranks(ctx, sums);
    const double count = sums.back();
    if (count == 0) fail("input " + ctx.input_name(xi) + " is " + x.description() + ": no batch statistics on any rank");
    s.mean.assign(sums.begin(), sums.end() - 1);
    for (double& m : s.mean) m /= count;
    s.var = columns ? column_channel_sums(px, l, &s.mean) : channel_sums(px, l, [&](double v, int64_t c, int64_t) {
      const double d = v - s.mean[static_cast<size_t>(c)];
      return d * d;
    });
    sum_across_ranks(ctx, s.var);
    for (double& v : s.var) v /= count;
  });
  return s;
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
  const std::vector<double> scale = per_channel(ctx, 1, l, 0), bias = per_channel(ctx, 2, l, 0);
  const std::vector<double> input_mean = per_channel(ctx, 3, l, 0), input_var = per_channel(ctx, 4, l, 0);
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

}  // namespace

std::unique_ptr<Kernel> make_sync_batch_norm(const KernelInit& init) {
  if (init.num_inputs() != 5) fail("SyncBatchNormalization takes 5 inputs (X, scale, B, input_mean, input_var)");
  const double epsilon = init.attr_float("epsilon", 1e-5f), momentum = init.attr_float("momentum", 0.9f);
  return make_kernel([epsilon, momentum](KernelContext& ctx) { run_sync_batch_norm(ctx, epsilon, momentum); });
}

}  // namespace onnxtrain::ops
