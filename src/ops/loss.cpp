// SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss (ai.onnx opset 12+; 13 and
// NegativeLogLikelihoodLoss-22 only widened the types), after their operator docs.
//
// Scores / input [N, C] or [N, C, D1..Dk], labels / target [N] or [N, D1..Dk] (int32 or
// int64), optional weights [C]. With logp = LogSoftmax(scores, axis 1) (SCE) or logp = input
// (NLL), each sample's loss is
//   l[n, d] = -logp[n, c, d] * weights[c]   with c = labels[n, d] (weights[c] = 1 without weights)
//   l[n, d] = 0                             when labels[n, d] == ignore_index.
// reduction 'none' gives l (shaped like labels), 'sum' the scalar sum(l), 'mean' (the default)
// sum(l) / sum(W) with W[n, d] = weights[c] for the samples not ignored: without weights the
// count of samples not ignored. When every sample is ignored the mean is 0 / 0 = NaN, as in the
// reference. A label outside [0, C) that is not ignore_index is an error. SCE's optional second
// output is log_prob = logp, shaped like scores. Sums accumulate in double; Float16 and BFloat16
// scores are computed in float.
#include <cmath>
#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/factories.h"

namespace onnxtrain::ops {

namespace {

enum class Reduction { None, Sum, Mean };

struct LossSpec {
  bool softmax = false;  // SoftmaxCrossEntropyLoss: the loss reads LogSoftmax(scores)
  Reduction reduction = Reduction::Mean;
  bool has_ignore_index = false;
  int64_t ignore_index = 0;
};

// logp[n, :, j] = LogSoftmax(x[n, :, j]) for x [N, C, inner]; `m` and `s` hold N * inner values.
template <class T, class V = compute_t<T>>
void log_softmax_axis1(const T* x, T* logp, int64_t batch, int64_t classes, int64_t inner, V* m, V* s) {
  parallel_for(batch, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, classes * inner)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t n = begin; n < end; ++n) {
                   const T* xn = x + n * classes * inner;
                   T* yn = logp + n * classes * inner;
                   V* mn = m + n * inner;
                   V* sn = s + n * inner;
                   for (int64_t j = 0; j < inner; ++j) mn[j] = convert<V>(xn[j]);
                   for (int64_t c = 1; c < classes; ++c) {
                     for (int64_t j = 0; j < inner; ++j) {
                       mn[j] = std::max(mn[j], convert<V>(xn[c * inner + j]));
                     }
                   }
                   for (int64_t j = 0; j < inner; ++j) sn[j] = 0;
                   for (int64_t c = 0; c < classes; ++c) {
                     for (int64_t j = 0; j < inner; ++j) sn[j] += std::exp(convert<V>(xn[c * inner + j]) - mn[j]);
                   }
                   for (int64_t j = 0; j < inner; ++j) sn[j] = std::log(sn[j]);
                   for (int64_t c = 0; c < classes; ++c) {
                     for (int64_t j = 0; j < inner; ++j) {
                       const V v = convert<V>(xn[c * inner + j]);
                       yn[c * inner + j] = convert<T>((v - mn[j]) - sn[j]);
                     }
                   }
                 }
               });
}

void run_loss(KernelContext& ctx, const LossSpec& spec) {
  const Tensor& scores = ctx.input(0);
  if (scores.rank() < 2) {
    fail("input " + ctx.input_name(0) + " is " + scores.description() + ", expected [N, C] or [N, C, D1..Dk]");
  }
  const int64_t batch = scores.dim(0), classes = scores.dim(1);
  const int64_t inner = scores.shape().numel(2, scores.rank());
  const Tensor& labels = ctx.input(1);
  Shape label_shape = scores.shape();
  label_shape.erase(1);
  if (labels.dtype() != DataType::Int32 && labels.dtype() != DataType::Int64) {
    fail("input " + ctx.input_name(1) + " is " + labels.description() + ", expected int32 or int64 class indices");
  }
  if (!(labels.shape() == label_shape)) {
    fail("input " + ctx.input_name(1) + " is " + labels.description() + ", expected shape " + label_shape.to_string() +
         " (the shape of input " + ctx.input_name(0) + " " + scores.description() + " without its class dim)");
  }
  std::vector<double> weights(static_cast<size_t>(classes), 1.0);
  if (ctx.has_input(2)) {
    const Tensor& w = ctx.input(2);
    if (w.rank() != 1 || w.dim(0) != classes || !is_floating(w.dtype())) {
      fail("input " + ctx.input_name(2) + " is " + w.description() + ", expected a floating [" + std::to_string(classes) +
           "] (one weight per class)");
    }
    weights = w.to_double_vector();
  }
  const std::vector<int64_t> target = labels.to_int64_vector("input " + ctx.input_name(1));
  for (size_t i = 0; i < target.size(); ++i) {
    const int64_t c = target[i];
    if ((c < 0 || c >= classes) && !(spec.has_ignore_index && c == spec.ignore_index)) {
      fail("input " + ctx.input_name(1) + " holds class " + std::to_string(c) + " at element " + std::to_string(i) +
           ", outside [0, " + std::to_string(classes) + ")" +
           (spec.has_ignore_index ? " and not ignore_index " + std::to_string(spec.ignore_index) : std::string()));
    }
  }
  // Per sample: the loss and its weight (0 when ignored).
  std::vector<double> loss(target.size()), weight(target.size());
  visit_dtype<FloatTypes>(scores.dtype(), "input " + ctx.input_name(0), [&]<class T>() {
    const T* logp = scores.data<T>();
    Tensor log_prob;
    if (spec.softmax) {
      log_prob = ctx.allocate_output(1, scores.dtype(), scores.shape());  // a copy keeps it alive
      std::vector<compute_t<T>> m(target.size()), s(target.size());
      if (classes > 0) log_softmax_axis1(scores.data<T>(), log_prob.data<T>(), batch, classes, inner, m.data(), s.data());
      logp = log_prob.data<T>();
    }
    for (size_t i = 0; i < target.size(); ++i) {
      const int64_t c = target[i];
      if (spec.has_ignore_index && c == spec.ignore_index) continue;
      const int64_t n = static_cast<int64_t>(i) / inner, j = static_cast<int64_t>(i) % inner;
      const double w = weights[static_cast<size_t>(c)];
      loss[i] = -convert<double>(logp[(n * classes + c) * inner + j]) * w;
      weight[i] = w;
    }
  });
  if (spec.reduction == Reduction::None) {
    Tensor& out = ctx.allocate_output(0, scores.dtype(), label_shape);
    visit_dtype<FloatTypes>(scores.dtype(), "output", [&]<class T>() {
      T* p = out.data<T>();
      for (size_t i = 0; i < loss.size(); ++i) p[i] = convert<T>(loss[i]);
    });
    return;
  }
  double total = 0, total_weight = 0;
  for (size_t i = 0; i < loss.size(); ++i) {
    total += loss[i];
    total_weight += weight[i];
  }
  const double value = spec.reduction == Reduction::Sum ? total : total / total_weight;
  Tensor& out = ctx.allocate_output(0, scores.dtype(), Shape{});
  visit_dtype<FloatTypes>(scores.dtype(), "output", [&]<class T>() { out.data<T>()[0] = convert<T>(value); });
}

LossSpec read_spec(const KernelInit& init, bool softmax) {
  LossSpec spec;
  spec.softmax = softmax;
  const std::string reduction = init.attr_string("reduction", "mean");
  if (reduction == "none") {
    spec.reduction = Reduction::None;
  } else if (reduction == "sum") {
    spec.reduction = Reduction::Sum;
  } else if (reduction == "mean") {
    spec.reduction = Reduction::Mean;
  } else {
    fail("attribute 'reduction' is '" + reduction + "', expected 'none', 'sum' or 'mean'");
  }
  spec.has_ignore_index = init.has_attr("ignore_index");
  spec.ignore_index = init.attr_int("ignore_index", 0);
  if (!softmax && init.num_outputs() > 1) fail("NegativeLogLikelihoodLoss has one output, the node has more");
  return spec;
}

}  // namespace

std::unique_ptr<Kernel> make_softmax_cross_entropy_loss(const KernelInit& init) {
  const LossSpec spec = read_spec(init, true);
  return make_kernel([spec](KernelContext& ctx) { run_loss(ctx, spec); });
}

std::unique_ptr<Kernel> make_nll_loss(const KernelInit& init) {
  const LossSpec spec = read_spec(init, false);
  return make_kernel([spec](KernelContext& ctx) { run_loss(ctx, spec); });
}

}  // namespace onnxtrain::ops
