// BatchNormalization (opset 1+), InstanceNormalization (1+), LayerNormalization (17),
// Dropout (1+), after the ONNX operator docs and changelog (InstanceNormalization-22 and
// Dropout-22 only add element types).
//
// BatchNormalization, X [N, C, D1..Dn] (a 1-D X of size N has C = 1), per channel c:
//   inference: Y = (X - mean[c]) / sqrt(var[c] + epsilon) * scale[c] + B[c]
//   training:  the same with the batch statistics over N, D1..Dn: current_mean and the
//              population (biased) current_var; running = input * momentum + current * (1 - momentum).
//   Training mode is: opset 1-6 is_test = 0 (the default); opset 7-13 any of the outputs
//   1-4 (mean, var: running; saved_mean, saved_var: current_mean, current_var) asked for;
//   opset 14+ training_mode = 1, outputs running_mean, running_var (typed like input_mean;
//   asking for them with training_mode = 0 is an error, as the spec calls them invalid).
//   The batch statistics take two passes (the mean, then the squared deviations from it), over
//   each channel's planes, or for planes smaller than batch_norm::kColumnPlanes column by column
//   (batch_norm_channels.h), where each thread takes a range of channels through both passes and
//   Y in one task.
//   Deliberate limit: spatial = 0 (opset 1-8, per-activation statistics) is rejected; the spec
//   itself deprecated it in opset 9 in favour of flattening X to [N, C * D1 * .. * Dn].
//   ai.onnxtrain.BatchNormalizationChannelBlocked is BatchNormalization-15 in training mode
//   (inputs, outputs, epsilon and momentum) on X and Y blocked by `channel_block` = b channels,
//   [N, C / b, D1..Dn, b] (runtime/fusion.h block_convolution_tensors, between convolutions that
//   read and write that layout): planes under kColumnPlanes column by column (the same sums in the
//   same order as a plain X, so the same values), larger ones block by block (one accumulator per
//   channel of a block, batch_norm_channels.h; the values within rounding of the plain kernel's).
// InstanceNormalization: per (n, c) plane, Y = (X - mean) / sqrt(var + epsilon) * scale[c] + B[c].
// LayerNormalization: X seen as [outer, inner] with inner = prod(dims[axis:]) (axis in [-r, r]);
//   per row Mean, InvStdDev = 1 / sqrt(var + epsilon) and Y = (X - Mean) * InvStdDev * Scale + B,
//   Scale and B broadcast against dims[axis:]. Mean and InvStdDev have shape
//   [d0..d(axis-1), 1, .., 1] and type float32: stash_type 1 is the only one supported.
//   Its backward op LayerNormalizationGrad (ai.onnxtrain) is described at run_layer_norm_grad;
//   ai.onnxtrain.AddLayerNormalization, an Add and the LayerNormalization of its sum, at
//   run_add_layer_norm.
// Dropout: opset 1-11 takes `ratio` as attribute and runs in training mode only before opset 7
//   with is_test = 0; opset 12+ takes ratio (default 0.5) and training_mode (default false) as
//   inputs. Outside training (or with ratio 0) the output is the input and the mask all true.
//   In training an element is kept when a uniform draw u in [0, 1) has u >= ratio (probability
//   1 - ratio) and scaled by 1 / (1 - ratio); ratio must be in [0, 1). The draws come from
//   Philox (core/rng.h) as in random.cpp: key = the `seed` attribute or else the session seed,
//   stream = the first output's name, counter = (run index, element / 4). The mask is bool
//   from opset 10, typed like the data before.
// Statistics accumulate in double (LayerNormalization: in float for float32, float16 and
// bfloat16 data); Float16/BFloat16 data is normalized in float.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "core/simd.h"
#include "core/streaming_store.h"
#include "ops/batch_norm_channels.h"
#include "ops/batch_norm_mode.h"
#include "ops/broadcast.h"
#include "ops/factories.h"
#include "ops/sum_to_shape.h"

namespace onnxtrain::ops {

namespace {

struct Moments {
  double mean = 0, var = 0;
};

// Mean and population variance of `blocks` runs of `size` elements, `stride` apart.
template <class T>
Moments moments(const T* x, int64_t blocks, int64_t stride, int64_t size) {
  double sum = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const T* p = x + b * stride;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < size; ++i) sum += convert<double>(p[i]);
  }
  const double count = static_cast<double>(blocks * size);
  Moments m;
  m.mean = sum / count;
  double squares = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const T* p = x + b * stride;
#pragma omp simd reduction(+ : squares)
    for (int64_t i = 0; i < size; ++i) {
      const double d = convert<double>(p[i]) - m.mean;
      squares += d * d;
    }
  }
  m.var = squares / count;
  return m;
}

// Plane p (of `size` contiguous elements) gets y = (x - center[k]) * factor[k] + shift[k] with
// k = p % period.
struct Affine {
  std::vector<double> center, factor, shift;
};

template <class T>
void normalize_planes(const T* x, T* y, int64_t planes, int64_t size, const Affine& a) {
  using V = compute_t<T>;
  const std::vector<V> center(a.center.begin(), a.center.end()), factor(a.factor.begin(), a.factor.end()),
      shift(a.shift.begin(), a.shift.end());
  const int64_t period = static_cast<int64_t>(center.size());
  if (planes == 0) return;
  if (size == 1) {  // X [N, C]: rows of `period` elements, each with its own parameters
    parallel_for(planes / period, std::max<int64_t>(1, kParallelGrain / period), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* xr = x + r * period;
        T* yr = y + r * period;
        for (int64_t k = 0; k < period; ++k) {
          const size_t i = static_cast<size_t>(k);
          yr[k] = convert<T>((convert<V>(xr[k]) - center[i]) * factor[i] + shift[i]);
        }
      }
    });
    return;
  }
  parallel_for(planes, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(size, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const size_t k = static_cast<size_t>(p % period);
      const V c = center[k], f = factor[k], s = shift[k];
      const T* xp = x + p * size;
      T* yp = y + p * size;
      for (int64_t i = 0; i < size; ++i) yp[i] = convert<T>((convert<V>(xp[i]) - c) * f + s);
    }
  });
}

// The values of a [C] parameter input.
std::vector<double> channel_param(const KernelContext& ctx, int i, int64_t channels) {
  const Tensor& t = ctx.input(i);
  if (t.rank() != 1 || t.dim(0) != channels) {
    fail("input " + ctx.input_name(i) + " is " + t.description() + ", expected shape [" +
         std::to_string(channels) + "] (one value per channel of input " + ctx.input_name(0) + ")");
  }
  if (!is_floating(t.dtype())) fail("input " + ctx.input_name(i) + " is " + t.description() + ", expected a floating type");
  return t.to_double_vector();
}

Tensor tensor_from(DataType dtype, const Shape& shape, const std::vector<double>& values) {
  Tensor t(dtype, shape);
  visit_dtype<FloatTypes>(dtype, "output", [&]<class T>() {
    T* p = t.data<T>();
    for (size_t i = 0; i < values.size(); ++i) p[i] = convert<T>(values[i]);
  });
  return t;
}

double scalar_input(const KernelContext& ctx, int i) {
  const Tensor& t = ctx.input(i);
  if (t.numel() != 1) fail("input " + ctx.input_name(i) + " is " + t.description() + ", expected a scalar");
  return t.to_double_vector()[0];
}

// --- BatchNormalization ---

struct BatchNormSpec {
  double epsilon = 1e-5, momentum = 0.9;
  bool training = false;
  bool running_only = false;  // opset 14+: outputs Y, running_mean, running_var
  int64_t channel_block = 0;  // ai.onnxtrain.BatchNormalizationChannelBlocked: X and Y blocked by it
};

void run_batch_norm(KernelContext& ctx, const BatchNormSpec& spec) {
  const Tensor& x = ctx.input(0);
  const batch_norm::Layout l = batch_norm::layout_of(ctx, 0, spec.channel_block);
  const int64_t batch = l.batch, channels = l.channels, size = l.size;
  const std::vector<double> scale = channel_param(ctx, 1, channels);
  const std::vector<double> bias = channel_param(ctx, 2, channels);
  const std::vector<double> mean = channel_param(ctx, 3, channels);
  const std::vector<double> var = channel_param(ctx, 4, channels);
  Affine a;
  a.shift = bias;
  a.factor.resize(static_cast<size_t>(channels));
  // The batch statistics (training mode), per channel.
  std::vector<double> current_mean(spec.training ? static_cast<size_t>(channels) : 0);
  std::vector<double> current_var(current_mean.size());
  if (spec.training && batch * size == 0) {
    fail("input " + ctx.input_name(0) + " is " + x.description() + ": no batch statistics in training mode");
  }
  Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
  // Channels [c0, c1) through the statistics (training: two passes of sums(out, center), the sums
  // of x or, with center, of its squared deviations) and Y (normalize(center, factor, shift)): one
  // task of the column and block paths.
  const auto channels_through = [&](int64_t c0, int64_t c1, auto&& sums, auto&& normalize) {
    if (spec.training) {
      sums(current_mean.data(), nullptr);
      for (int64_t c = c0; c < c1; ++c) current_mean[static_cast<size_t>(c)] /= l.count();
      sums(current_var.data(), current_mean.data());
      for (int64_t c = c0; c < c1; ++c) current_var[static_cast<size_t>(c)] /= l.count();
    }
    const std::vector<double>& center = spec.training ? current_mean : mean;
    const std::vector<double>& used_var = spec.training ? current_var : var;
    for (int64_t c = c0; c < c1; ++c) {
      const size_t k = static_cast<size_t>(c);
      a.factor[k] = scale[k] / std::sqrt(used_var[k] + spec.epsilon);
    }
    normalize(center.data(), a.factor.data(), a.shift.data());
  };
  if (batch_norm::by_blocks(l)) {
    // Blocked X of larger planes, block by block (batch_norm_channels.h): each thread's blocks of
    // channels through the statistics and Y, one block at a time.
    visit_dtype<FloatTypes>(x.dtype(), "input " + ctx.input_name(0), [&]<class T>() {
      const T* px = x.data<T>();
      batch_norm::with_block(l, [&]<int B>() {
        batch_norm::for_channel_blocks(l, [&](int64_t cb) {
          channels_through(
              cb * B, cb * B + B,
              [&](double* out, const double* center) { batch_norm::block_sums<B>(px, l, cb, out, center); },
              [&](const double* center, const double* factor, const double* shift) {
                batch_norm::block_normalize<B>(px, y.data<T>(), l, cb, center, factor, shift);
              });
        });
      });
    });
  } else if (batch_norm::by_columns(l)) {
    // Small planes, blocked or not, column by column (batch_norm_channels.h): each thread's range of
    // channels through the statistics and Y in one task, while it is in cache.
    visit_dtype<FloatTypes>(x.dtype(), "input " + ctx.input_name(0), [&]<class T>() {
      const T* px = x.data<T>();
      batch_norm::for_channel_ranges(l, [&](int64_t c0, int64_t c1) {
        channels_through(
            c0, c1, [&](double* out, const double* center) { batch_norm::column_sums(px, l, c0, c1, out, center); },
            [&](const double* center, const double* factor, const double* shift) {
              batch_norm::column_normalize(px, y.data<T>(), l, c0, c1, center, factor, shift);
            });
      });
    });
  } else {
    if (spec.training) {
      visit_dtype<FloatTypes>(x.dtype(), "input " + ctx.input_name(0), [&]<class T>() {
        const T* px = x.data<T>();
        parallel_for(channels, std::max<int64_t>(1, kParallelGrain / (batch * size)), [&](int64_t begin, int64_t end) {
          for (int64_t c = begin; c < end; ++c) {
            const Moments m = moments(px + c * size, batch, channels * size, size);
            current_mean[static_cast<size_t>(c)] = m.mean;
            current_var[static_cast<size_t>(c)] = m.var;
          }
        });
      });
      a.center = current_mean;
    } else {
      a.center = mean;
    }
    const std::vector<double>& used_var = spec.training ? current_var : var;
    for (size_t c = 0; c < a.factor.size(); ++c) a.factor[c] = scale[c] / std::sqrt(used_var[c] + spec.epsilon);
    visit_dtype<FloatTypes>(x.dtype(), "input " + ctx.input_name(0),
                            [&]<class T>() { normalize_planes(x.data<T>(), y.data<T>(), batch * channels, size, a); });
  }
  if (!spec.training) return;
  std::vector<double> running_mean(mean.size()), running_var(var.size());
  for (size_t c = 0; c < mean.size(); ++c) {
    running_mean[c] = mean[c] * spec.momentum + current_mean[c] * (1 - spec.momentum);
    running_var[c] = var[c] * spec.momentum + current_var[c] * (1 - spec.momentum);
  }
  // Opset 14+ types the running statistics like input_mean (T2); before, all are T.
  const DataType stats_type = spec.running_only ? ctx.input(3).dtype() : x.dtype();
  const Shape shape{channels};
  const std::vector<double>* outputs[] = {&running_mean, &running_var, &current_mean, &current_var};
  for (int i = 1; i <= (spec.running_only ? 2 : 4); ++i) {
    if (ctx.has_output(i)) ctx.set_output(i, tensor_from(stats_type, shape, *outputs[i - 1]));
  }
}

// --- InstanceNormalization ---

void run_instance_norm(KernelContext& ctx, double epsilon) {
  const Tensor& x = ctx.input(0);
  if (x.rank() < 2) fail("input " + ctx.input_name(0) + " is " + x.description() + ", expected [N, C, D1..Dn]");
  const int64_t channels = x.dim(1);
  const int64_t planes = x.dim(0) * channels;
  const int64_t size = x.shape().numel(2, x.rank());
  const std::vector<double> scale = channel_param(ctx, 1, channels);
  const std::vector<double> bias = channel_param(ctx, 2, channels);
  Affine a;
  a.center.resize(static_cast<size_t>(planes));
  a.factor.resize(static_cast<size_t>(planes));
  a.shift.resize(static_cast<size_t>(planes));
  Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
  if (x.numel() == 0) return;
  visit_dtype<FloatTypes>(x.dtype(), "input " + ctx.input_name(0), [&]<class T>() {
    const T* px = x.data<T>();
    parallel_for(planes, std::max<int64_t>(1, kParallelGrain / size), [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        const Moments m = moments(px + p * size, 1, size, size);
        const size_t k = static_cast<size_t>(p), c = static_cast<size_t>(p % channels);
        a.center[k] = m.mean;
        a.factor[k] = scale[c] / std::sqrt(m.var + epsilon);
        a.shift[k] = bias[c];
      }
    });
    normalize_planes(px, y.data<T>(), planes, size, a);
  });
}

// --- LayerNormalization ---

// Input i (Scale or B) broadcast to the `inner` elements of dims[axis:] of X (named x_name in errors).
std::vector<double> broadcast_to_inner(const KernelContext& ctx, int i, const Shape& x_shape, size_t axis,
                                       const std::string& x_name) {
  const Tensor& t = ctx.input(i);
  const size_t norm_rank = x_shape.size() - axis;
  const Shape& s = t.shape();
  size_t skip = 0;  // leading 1s beyond the normalized dims broadcast trivially
  while (s.size() - skip > norm_rank && s[skip] == 1) ++skip;
  bool ok = s.size() - skip <= norm_rank;
  for (size_t d = skip; ok && d < s.size(); ++d) {
    const int64_t want = x_shape[x_shape.size() - (s.size() - d)];
    ok = s[d] == want || s[d] == 1;
  }
  if (!ok) {
    fail("input " + ctx.input_name(i) + " is " + t.description() + ", which does not broadcast to the normalized dims " +
         Shape(x_shape.dims().subspan(axis)).to_string() + " of " + x_name);
  }
  const std::vector<double> values = t.to_double_vector();
  const int64_t inner = x_shape.numel(axis, x_shape.size());
  std::vector<double> out(static_cast<size_t>(inner));
  // Walk the normalized dims with an odometer, tracking the offset into t.
  const size_t lead = norm_rank - (s.size() - skip);
  std::vector<int64_t> strides(norm_rank, 0), coord(norm_rank, 0);
  int64_t stride = 1;
  for (size_t d = norm_rank; d-- > lead;) {
    const int64_t dim = s[skip + d - lead];
    strides[d] = dim == 1 ? 0 : stride;
    stride *= dim;
  }
  int64_t offset = 0;
  for (int64_t e = 0; e < inner; ++e) {
    out[static_cast<size_t>(e)] = values[static_cast<size_t>(offset)];
    for (size_t d = norm_rank; d-- > 0;) {
      offset += strides[d];
      if (++coord[d] < x_shape[axis + d]) break;
      offset -= strides[d] * coord[d];
      coord[d] = 0;
    }
  }
  return out;
}

// Sum over i of f(x[i]) for float32 x: four running sums of 8 lanes (element i into sum
// (i / 8) % 4, lane i % 8, for the whole blocks of 32; the rest into a scalar), then the lanes
// added in order. One running sum makes each addition wait for the last (4 cycles): a
// LayerNormalization of [1, 128, 256] (BERT's at batch 1, its operands in cache) took 12.8-12.9
// us so against 8.4-8.5 (`onnxtrain-bench-infer`, three alternating pairs); BERT's inference at
// batch 1 3.12-3.21 ms against 3.17-3.23, its training step's AddLayerNormalization 4.6-4.9 ms
// against 4.9-5.2 (three pairs each).
template <class F>
float partial_sums(const float* x, int64_t n, F f) {
  using F8 = simd::Floats<8>;
  F8 s0{}, s1{}, s2{}, s3{};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 += f(simd::load<8>(x + i));
    s1 += f(simd::load<8>(x + i + 8));
    s2 += f(simd::load<8>(x + i + 16));
    s3 += f(simd::load<8>(x + i + 24));
  }
  const F8 all = (s0 + s1) + (s2 + s3);
  float sum = 0;
  for (int j = 0; j < 8; ++j) sum += all[j];
  float rest = 0;
  for (; i < n; ++i) rest += f(x[i]);
  return sum + rest;
}

// Mean and population variance of one row of n values, two passes in the compute type (float
// for float32 and the 16-bit types, double for float64) that vectorize; float32 in
// partial_sums.
template <class T, class V = compute_t<T>>
std::pair<V, V> row_moments(const T* x, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    const float mean = partial_sums(x, n, [](auto v) { return v; }) / static_cast<float>(n);
    const float squares = partial_sums(x, n, [mean](auto v) {
      const auto d = v - mean;
      return d * d;
    });
    return {mean, squares / static_cast<float>(n)};
  }
  V sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += static_cast<V>(x[i]);
  const V mean = sum / static_cast<V>(n);
  V squares = 0;
#pragma omp simd reduction(+ : squares)
  for (int64_t i = 0; i < n; ++i) {
    const V d = static_cast<V>(x[i]) - mean;
    squares += d * d;
  }
  return {mean, squares / static_cast<V>(n)};
}

// A sum at or above this size is written with streaming stores (core/streaming_store.h): it does
// not stay in a core's cache (2 MiB of L2 on the Intel VM of docs/performance.md) until the
// backward pass reads it, and below it the next reader may find it there. Ordinary stores would
// leave it in cache in place of Y, which the next product reads at once (BERT's step measured its
// products 2-3 ms slower so).
constexpr int64_t kStreamedSumBytes = int64_t{2} << 20;

// Two same-shaped tensors whose sum (as Add makes it: A + B in the compute type, rounded to the
// element type) layer_norm normalizes, writing it to `s` where given.
struct RowSum {
  const Tensor* a;
  const Tensor* b;
  Tensor* s;  // the sum's output, or null when the graph does not read it
};

// LayerNormalization of x (named x_name in errors) into outputs 0-2 (Y, Mean, InvStdDev), Scale
// and B from inputs scale_input and scale_input + 1. With `sum`, each row of x is sum's, made
// right before it is normalized, while it is in cache; x itself then only gives the shape and
// element type.
void layer_norm(KernelContext& ctx, const Tensor& x, const std::string& x_name, int scale_input, int64_t axis_attr,
                double epsilon, const RowSum* sum) {
  const int64_t rank = static_cast<int64_t>(x.rank());
  if (axis_attr < -rank || axis_attr > rank) {
    fail("attribute 'axis' = " + std::to_string(axis_attr) + " is out of range for " + x_name + " " +
         x.description() + " (expected [" + std::to_string(-rank) + ", " + std::to_string(rank) + "])");
  }
  const size_t axis = static_cast<size_t>(axis_attr < 0 ? axis_attr + rank : axis_attr);
  const int64_t outer = x.shape().numel(0, axis), inner = x.shape().numel(axis, x.rank());
  const std::vector<double> scale = broadcast_to_inner(ctx, scale_input, x.shape(), axis, x_name);
  const std::vector<double> bias = ctx.has_input(scale_input + 1)
                                       ? broadcast_to_inner(ctx, scale_input + 1, x.shape(), axis, x_name)
                                       : std::vector<double>(static_cast<size_t>(inner), 0.0);
  Shape stats_shape = x.shape();
  for (size_t d = axis; d < x.rank(); ++d) stats_shape[d] = 1;
  // Copies share the storage: an output the graph does not ask for stays alive here.
  Tensor y = ctx.allocate_output(0, x.dtype(), x.shape());
  Tensor mean_t = ctx.allocate_output(1, DataType::Float32, stats_shape);
  Tensor inv_t = ctx.allocate_output(2, DataType::Float32, stats_shape);
  float* mean_out = mean_t.data<float>();
  float* inv_out = inv_t.data<float>();
  if (inner == 0) {
    for (int64_t r = 0; r < outer; ++r) mean_out[r] = inv_out[r] = std::nanf("");
    return;
  }
  visit_dtype<FloatTypes>(x.dtype(), x_name, [&]<class T>() {
    using V = compute_t<T>;
    const std::vector<V> scale_v(scale.begin(), scale.end()), bias_v(bias.begin(), bias.end());
    const T* px = sum ? nullptr : x.data<T>();
    T* py = y.data<T>();
    const T* pa = sum ? sum->a->data<T>() : nullptr;
    const T* pb = sum ? sum->b->data<T>() : nullptr;
    T* ps = sum && sum->s ? sum->s->data<T>() : nullptr;
    const bool stream = ps && sum->s->nbytes() >= static_cast<size_t>(kStreamedSumBytes);
    parallel_for(outer, std::max<int64_t>(1, kParallelGrain / inner), [&](int64_t begin, int64_t end) {
      std::vector<T> row(sum ? static_cast<size_t>(inner) : 0);  // a row of the sum, made here
      for (int64_t r = begin; r < end; ++r) {
        const T* xr = sum ? nullptr : px + r * inner;
        if (sum) {
          const T* ar = pa + r * inner;
          const T* br = pb + r * inner;
          T* sr = row.data();
#pragma omp simd
          for (int64_t i = 0; i < inner; ++i) sr[i] = convert<T>(V(convert<V>(ar[i]) + convert<V>(br[i])));
          xr = sr;
        }
        const auto [mean, var] = row_moments(xr, inner);
        const V inv = static_cast<V>(1.0 / std::sqrt(static_cast<double>(var) + epsilon));
        mean_out[r] = static_cast<float>(mean);
        inv_out[r] = static_cast<float>(inv);
        const V c = mean, f = inv;
        T* yr = py + r * inner;
#pragma omp simd
        for (int64_t i = 0; i < inner; ++i) {
          yr[i] = convert<T>((convert<V>(xr[i]) - c) * f * scale_v[static_cast<size_t>(i)] + bias_v[static_cast<size_t>(i)]);
        }
        if (stream) {
          store_streaming(row.data(), ps + r * inner, inner);
        } else if (ps) {
          std::copy(row.begin(), row.end(), ps + r * inner);
        }
      }
      if (stream) end_streaming_stores();
    });
  });
}

void run_layer_norm(KernelContext& ctx, int64_t axis_attr, double epsilon) {
  layer_norm(ctx, ctx.input(0), "input " + ctx.input_name(0), 1, axis_attr, epsilon, nullptr);
}

// ai.onnxtrain.AddLayerNormalization(A, B, Scale, Bias) -> (Y, Mean, InvStdDev, S)
// (runtime/fusion.h fuse_add_layer_norm): S = Add(A, B) with Add's broadcasting, and
// LayerNormalization(S, Scale, Bias) with attributes axis and epsilon (stash_type 1): the
// residual Add before a transformer's normalization. Where A and B have one shape (the residual
// case), each row of S is summed and normalized in one pass, so S is not read back from memory;
// otherwise S is summed first, as Add does. Either way the values are the two ops' to the bit.
// S (output 3) is what the backward pass reads as LayerNormalizationGrad's X.
void run_add_layer_norm(KernelContext& ctx, int64_t axis_attr, double epsilon) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  if (a.dtype() != b.dtype()) {
    fail("inputs " + ctx.input_name(0) + " (" + a.description() + ") and " + ctx.input_name(1) + " (" + b.description() +
         ") of the Add have different element types");
  }
  const std::string s_name = "the sum of inputs " + ctx.input_name(0) + " and " + ctx.input_name(1);
  if (a.shape() == b.shape()) {
    Tensor s;  // shares the output's storage
    if (ctx.has_output(3)) s = ctx.allocate_output(3, a.dtype(), a.shape());
    const RowSum sum{&a, &b, ctx.has_output(3) ? &s : nullptr};
    layer_norm(ctx, a, s_name, 2, axis_attr, epsilon, &sum);
    return;
  }
  const Broadcast<2> bc({&a.shape(), &b.shape()});
  Tensor s = ctx.allocate_output(3, a.dtype(), bc.shape());
  add_broadcast(bc, a, b, s, "input " + ctx.input_name(0));
  layer_norm(ctx, s, s_name, 2, axis_attr, epsilon, nullptr);
}

// LayerNormalizationGrad(dY, X, Scale, Mean, InvStdDev) -> dX, dScale, dBias (ai.onnxtrain, emitted
// by the LayerNormalization rule): one pass over the rows with the forward's saved statistics
// (recomputed from X in double when Mean and InvStdDev are omitted, and for float64 X: the
// saved statistics are float32, 1e-7 off the double ones the forward normalized with, which
// left float64 gradients 1e-7 off PyTorch's). Per row, with
// xhat = (x - Mean) InvStdDev and g = dY Scale:
//   dX = InvStdDev (g - mean(g) - xhat mean(g xhat)),
// and dScale = sum over rows of dY xhat, dBias = sum over rows of dY, both shaped like the
// normalized dims X.shape[axis:] (the rule sums them to Scale's and B's shapes).
// Inputs 5 and on, optional, are further terms of dY, each shaped and typed like X: dY is then
// Sum(dY, input 5, input 6, ...) as the ONNX Sum op computes it (left to right, each partial sum
// rounded to X's type), formed row by row (runtime/fusion.h fuse_layer_norm_grad_sum writes them
// for the Sum that accumulates the gradient of LayerNormalization's output), so the results are
// those of the Sum followed by this op, without the summed tensor.
// With attribute dx_sum = 1 (runtime/fusion.h fuse_layer_norm_bias_grad) inputs 5 and 6 are
// shapes A and B and the terms of dY follow from input 7; output 3 is
// SumToShape(SumToShape(dX, A), B): the gradient of a bias added before the normalization, as the
// Gradient expansion writes it for a transformer's dense layer before its residual Add and
// LayerNormalization (A the dense output's shape, through the Add, B the bias's). Where A is X's
// shape (the inner SumToShape gives dX itself), the normalized dims are X's last and B sums dX to
// them, each row of dX is added to its range's sums as it is made, in SumToShape's row ranges
// and order (sum_to_shape.h sum_row_ranges) when those ranges are this op's own split of the
// rows; else both sums are taken after. Either way the two SumToShapes' bits.
void run_layer_norm_grad(KernelContext& ctx, int64_t axis_attr, double epsilon, bool dx_sum) {
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const int64_t rank = static_cast<int64_t>(x.rank());
  if (axis_attr < -rank || axis_attr >= rank) {
    fail("attribute 'axis' = " + std::to_string(axis_attr) + " is out of range for input " + ctx.input_name(1) + " " + x.description());
  }
  std::vector<int> terms = {0};  // the inputs that sum to dY
  if (dx_sum && (!ctx.has_input(5) || !ctx.has_input(6))) fail("inputs 5 and 6 (the shapes dX sums to, attribute dx_sum) are missing");
  for (int i = dx_sum ? 7 : 5; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) fail("input " + std::to_string(i) + " (a term of dY) is missing");
    terms.push_back(i);
  }
  for (int i : terms) {
    const Tensor& t = ctx.input(i);
    if (t.dtype() != x.dtype() || !(t.shape() == x.shape())) {
      fail("input " + ctx.input_name(i) + " is " + t.description() + ", expected " + x.description() + " like input " + ctx.input_name(1));
    }
  }
  const size_t axis = static_cast<size_t>(axis_attr < 0 ? axis_attr + rank : axis_attr);
  const int64_t outer = x.shape().numel(0, axis), inner = x.shape().numel(axis, x.rank());
  const std::vector<double> scale = broadcast_to_inner(ctx, 2, x.shape(), axis, "input " + ctx.input_name(1));
  const bool saved = ctx.has_input(3) && ctx.has_input(4);
  for (int i = 3; saved && i <= 4; ++i) {
    if (ctx.input(i).dtype() != DataType::Float32 || ctx.input(i).numel() != outer) {
      fail("input " + ctx.input_name(i) + " is " + ctx.input(i).description() + ", expected float32 with " + std::to_string(outer) +
           " values (LayerNormalization's saved statistics)");
    }
  }
  const Shape inner_shape(x.shape().dims().subspan(axis));
  Tensor dx = ctx.allocate_output(0, x.dtype(), x.shape());  // copies: see run_layer_norm
  Tensor dscale = ctx.allocate_output(1, x.dtype(), inner_shape);
  Tensor dbias = ctx.allocate_output(2, x.dtype(), inner_shape);
  Shape dx_through, dx_target;      // shapes A and B
  bool summed_while_made = false;  // output 3 made by the row loop
  if (dx_sum) {
    dx_through = shape_input(ctx, 5);
    dx_target = shape_input(ctx, 6);
    check_sum_to_shape(x.shape(), dx_through, "dX (shaped like input " + ctx.input_name(1) + ")");
    check_sum_to_shape(dx_through, dx_target, "dX summed to input " + ctx.input_name(5));
  }
  visit_dtype<FloatTypes>(x.dtype(), "input " + ctx.input_name(1), [&]<class T>() {
    using V = compute_t<T>;
    const std::vector<V> scale_v(scale.begin(), scale.end());
    const bool use_saved = saved && !std::is_same_v<T, double>;
    const float* saved_mean = use_saved ? ctx.input(3).data<float>() : nullptr;
    const float* saved_inv = use_saved ? ctx.input(4).data<float>() : nullptr;
    const T* px = x.data<T>();
    const T* pg = dy.data<T>();
    std::vector<const T*> more;  // the further terms of dY
    for (size_t i = 1; i < terms.size(); ++i) more.push_back(ctx.input(terms[i]).data<T>());
    T* pdx = dx.data<T>();
    const int threads = std::max(1, std::min<int>(omp_get_max_threads(), static_cast<int>(outer / 8)));
    // dX summed row by row while made: SumToShape's ranges are this op's split of the rows.
    const bool sum_rows = dx_sum && dx_through == x.shape() && axis + 1 == x.rank() && sums_to_last_dim(x.shape(), dx_target) &&
                          sum_to_shape_parts(x.shape()) == threads;
    // Per thread: dScale and dBias partial sums over its rows.
    std::vector<V> partial(static_cast<size_t>(threads) * 2 * static_cast<size_t>(inner), V(0));
    // Per thread: the row of dY when it is a sum of terms.
    std::vector<T> summed(more.empty() ? 0 : static_cast<size_t>(threads) * static_cast<size_t>(inner));
    // Rows [begin, end) as thread t, each row of dX added to dx_sums where given.
    const auto rows = [&](int t, int64_t begin, int64_t end, V* dx_sums) {
      V* ds = partial.data() + static_cast<size_t>(t) * 2 * static_cast<size_t>(inner);
      V* db = ds + inner;
      T* row_sum = more.empty() ? nullptr : summed.data() + static_cast<size_t>(t) * static_cast<size_t>(inner);
      for (int64_t r = begin; r < end; ++r) {
        V mean, inv;
        if (use_saved) {
          mean = static_cast<V>(saved_mean[r]), inv = static_cast<V>(saved_inv[r]);
        } else {
          const auto [m, var] = row_moments(px + r * inner, inner);
          mean = m, inv = static_cast<V>(1.0 / std::sqrt(static_cast<double>(var) + epsilon));
        }
        const T* xr = px + r * inner;
        const T* gr = pg + r * inner;
        if (row_sum) {  // Sum's fold: the first term, then each further one added in turn
          std::copy(gr, gr + inner, row_sum);
          for (const T* term : more) {
            const T* tr = term + r * inner;
#pragma omp simd
            for (int64_t k = 0; k < inner; ++k) row_sum[k] = convert<T>(static_cast<V>(row_sum[k]) + static_cast<V>(tr[k]));
          }
          gr = row_sum;
        }
        V sum_g = 0, sum_gx = 0;
        const V* sv = scale_v.data();
#pragma omp simd reduction(+ : sum_g, sum_gx)
        for (int64_t k = 0; k < inner; ++k) {
          const V g = static_cast<V>(gr[k]), xhat = (static_cast<V>(xr[k]) - mean) * inv;
          sum_g += g * sv[k];
          sum_gx += g * sv[k] * xhat;
        }
#pragma omp simd
        for (int64_t k = 0; k < inner; ++k) {
          const V g = static_cast<V>(gr[k]);
          ds[k] += g * ((static_cast<V>(xr[k]) - mean) * inv);
          db[k] += g;
        }
        const V a = sum_g / static_cast<V>(inner), b = sum_gx / static_cast<V>(inner);
        T* dxr = pdx + r * inner;
#pragma omp simd
        for (int64_t k = 0; k < inner; ++k) {
          const V xhat = (static_cast<V>(xr[k]) - mean) * inv;
          dxr[k] = convert<T>(inv * (static_cast<V>(gr[k]) * sv[k] - a - xhat * b));
        }
        if (dx_sums) {
          for (int64_t k = 0; k < inner; ++k) dx_sums[k] += static_cast<V>(dxr[k]);
        }
      }
    };
    if (sum_rows) {
      const std::vector<V> sums = sum_row_ranges<V>(x.shape(), static_cast<size_t>(inner), [&](int64_t p, int64_t r0, int64_t r1, V* acc) {
        rows(static_cast<int>(p), r0, r1, acc);  // range p is thread p's rows (sum_rows)
      });
      T* out = ctx.allocate_output(3, x.dtype(), dx_target).template data<T>();
      for (int64_t k = 0; k < inner; ++k) out[k] = convert<T>(sums[static_cast<size_t>(k)]);
      summed_while_made = true;
    } else {
#pragma omp parallel num_threads(threads)
      {
        const int t = omp_get_thread_num();
        rows(t, outer * t / threads, outer * (t + 1) / threads, nullptr);
      }
    }
    T* pds = dscale.data<T>();
    T* pdb = dbias.data<T>();
    for (int64_t k = 0; k < inner; ++k) {
      V s = 0, b = 0;
      for (int t = 0; t < threads; ++t) {
        s += partial[static_cast<size_t>(t) * 2 * static_cast<size_t>(inner) + static_cast<size_t>(k)];
        b += partial[(static_cast<size_t>(t) * 2 + 1) * static_cast<size_t>(inner) + static_cast<size_t>(k)];
      }
      pds[k] = convert<T>(s);
      pdb[k] = convert<T>(b);
    }
  });
  if (dx_sum && !summed_while_made) {
    Tensor through = dx;
    if (!(dx_through == x.shape())) {
      through = Tensor(x.dtype(), dx_through);
      sum_to_shape_into(dx, dx_through, through);
    }
    Tensor& out = ctx.allocate_output(3, x.dtype(), dx_target);
    if (dx_target == dx_through) {  // SumToShape's identity: the values as they are (a -0 too)
      std::copy_n(static_cast<const char*>(through.raw_data()), through.nbytes(), static_cast<char*>(out.raw_data()));
    } else {
      sum_to_shape_into(through, dx_target, out);
    }
  }
}

// --- Dropout ---

struct DropoutSpec {
  int opset = 13;
  float ratio = 0.5f;     // opset < 12
  bool training = false;  // opset < 12
  bool bool_mask = true;
  bool has_seed = false;
  uint64_t seed = 0;
  uint64_t stream = 0;
};

void run_dropout(KernelContext& ctx, const DropoutSpec& spec) {
  const Tensor& x = ctx.input(0);
  bool training = spec.training;
  double ratio = spec.ratio;
  if (spec.opset >= 12) {
    if (ctx.has_input(2)) {
      if (ctx.input(2).dtype() != DataType::Bool) {
        fail("input " + ctx.input_name(2) + " (training_mode) is " + ctx.input(2).description() + ", expected bool");
      }
      training = scalar_input(ctx, 2) != 0;
    }
    ratio = ctx.has_input(1) ? scalar_input(ctx, 1) : 0.5;
  }
  const DataType mask_type = spec.bool_mask ? DataType::Bool : x.dtype();
  if (!training || ratio == 0) {
    ctx.set_output(0, x);
    if (ctx.has_output(1)) {
      Tensor& mask = ctx.allocate_output(1, mask_type, x.shape());
      visit_dtype<AllTypes>(mask_type, "mask", [&]<class M>() {
        std::fill(mask.data<M>(), mask.data<M>() + mask.numel(), convert<M>(1));
      });
    }
    return;
  }
  if (!(ratio >= 0 && ratio < 1)) {
    fail((spec.opset >= 12 ? "input " + ctx.input_name(1) + " (ratio)" : std::string("attribute 'ratio'")) + " is " +
         std::to_string(ratio) + "; Dropout in training mode needs a ratio in [0, 1)");
  }
  const RunContext& run = ctx.run_context();
  const Philox philox(spec.has_seed ? spec.seed : run.seed, spec.stream);
  const int64_t n = x.numel();
  Tensor y = ctx.allocate_output(0, x.dtype(), x.shape());  // copies: see run_layer_norm
  Tensor mask = ctx.allocate_output(1, mask_type, x.shape());
  visit_dtype<FloatTypes>(x.dtype(), "input " + ctx.input_name(0), [&]<class T>() {
    using V = compute_t<T>;
    const V scale = static_cast<V>(1.0 / (1.0 - ratio));
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const auto draw = [&]<class M>(M* pm) {
      parallel_for((n + 3) / 4, 4096, [&](int64_t begin, int64_t end) {
        for (int64_t blk = begin; blk < end; ++blk) {
          const auto w = philox.block(run.run_index, static_cast<uint64_t>(blk));
          for (int64_t k = 0; k < 4 && blk * 4 + k < n; ++k) {
            const int64_t i = blk * 4 + k;
            const bool keep = Philox::to_unit_double(w[k], w[(k + 1) % 4]) >= ratio;
            // output = scale * data * mask, as the spec writes it (so inf * 0 stays NaN).
            py[i] = convert<T>(convert<V>(px[i]) * (keep ? scale : V(0)));
            pm[i] = convert<M>(keep ? 1 : 0);
          }
        }
      });
    };
    if (spec.bool_mask) {
      draw(mask.data<bool>());
    } else {
      draw(mask.data<T>());
    }
  });
}

}  // namespace

std::unique_ptr<Kernel> make_batch_norm(const KernelInit& init) {
  BatchNormSpec spec;
  spec.epsilon = init.attr_float("epsilon", 1e-5f);
  spec.momentum = init.attr_float("momentum", 0.9f);
  const int opset = init.opset();
  if (opset < 9 && init.attr_int("spatial", 1) == 0) {
    fail("attribute 'spatial' = 0 (statistics per activation) is not supported; flatten X to [N, C * D1 * .. * Dn] "
         "and use spatial = 1, as BatchNormalization-9 recommends");
  }
  const int max_outputs = opset >= 14 ? 3 : 5;
  if (init.num_outputs() > max_outputs) {
    fail("BatchNormalization-" + std::to_string(opset) + " has at most " + std::to_string(max_outputs) +
         " outputs, the node has " + std::to_string(init.num_outputs()));
  }
  bool extra_outputs = false;
  for (int i = 1; i < init.num_outputs(); ++i) extra_outputs = extra_outputs || init.has_output(i);
  spec.training = batch_norm_training(opset, init.attr_int("is_test", 0), extra_outputs, init.attr_int("training_mode", 0));
  if (opset >= 14) {
    spec.running_only = true;
    if (!spec.training && extra_outputs) {
      fail("outputs running_mean and running_var are only defined with training_mode = 1");
    }
  }
  return make_kernel([spec](KernelContext& ctx) { run_batch_norm(ctx, spec); });
}

std::unique_ptr<Kernel> make_batch_norm_channel_blocked(const KernelInit& init) {
  BatchNormSpec spec;
  spec.epsilon = init.attr_float("epsilon", 1e-5f);
  spec.momentum = init.attr_float("momentum", 0.9f);
  spec.training = true;
  spec.running_only = true;
  spec.channel_block = init.attr_int("channel_block", 0);
  if (spec.channel_block <= 0) {
    fail("attribute channel_block is " + std::to_string(spec.channel_block) + ", expected a positive channel count");
  }
  if (init.num_outputs() > 3) fail("BatchNormalizationChannelBlocked has at most 3 outputs, the node has " + std::to_string(init.num_outputs()));
  return make_kernel([spec](KernelContext& ctx) { run_batch_norm(ctx, spec); });
}

std::unique_ptr<Kernel> make_instance_norm(const KernelInit& init) {
  const double epsilon = init.attr_float("epsilon", 1e-5f);
  return make_kernel([epsilon](KernelContext& ctx) { run_instance_norm(ctx, epsilon); });
}

namespace {
// LayerNormalization's axis and epsilon; stash_type 1 (float32 statistics) is the one supported.
struct LayerNormAttributes {
  int64_t axis;
  double epsilon;
};
LayerNormAttributes layer_norm_attributes(const KernelInit& init) {
  const int64_t stash_type = init.attr_int("stash_type", 1);
  if (stash_type != 1) {
    fail("attribute 'stash_type' = " + std::to_string(stash_type) + " is not supported (only 1, float32)");
  }
  return {init.attr_int("axis", -1), init.attr_float("epsilon", 1e-5f)};
}
}  // namespace

std::unique_ptr<Kernel> make_layer_norm(const KernelInit& init) {
  const LayerNormAttributes a = layer_norm_attributes(init);
  return make_kernel([a](KernelContext& ctx) { run_layer_norm(ctx, a.axis, a.epsilon); });
}

std::unique_ptr<Kernel> make_add_layer_norm(const KernelInit& init) {
  const LayerNormAttributes a = layer_norm_attributes(init);
  return make_kernel([a](KernelContext& ctx) { run_add_layer_norm(ctx, a.axis, a.epsilon); });
}

std::unique_ptr<Kernel> make_layer_norm_grad(const KernelInit& init) {
  const int64_t axis = init.attr_int("axis", -1);
  const double epsilon = init.attr_float("epsilon", 1e-5f);
  const bool dx_sum = init.attr_int("dx_sum", 0) != 0;
  return make_kernel([axis, epsilon, dx_sum](KernelContext& ctx) { run_layer_norm_grad(ctx, axis, epsilon, dx_sum); });
}

std::unique_ptr<Kernel> make_dropout(const KernelInit& init) {
  DropoutSpec spec;
  spec.opset = init.opset();
  spec.bool_mask = spec.opset >= 10;
  if (spec.opset < 12) {
    spec.ratio = init.attr_float("ratio", 0.5f);
    spec.training = spec.opset < 7 && init.attr_int("is_test", 0) == 0;
  } else if (init.has_attr("seed")) {
    spec.has_seed = true;
    spec.seed = static_cast<uint64_t>(init.attr_int("seed", 0));
  }
  spec.stream = init.has_output(0) ? stream_id(init.graph().value(init.node().outputs[0]).name) : 0;
  return make_kernel([spec](KernelContext& ctx) { run_dropout(ctx, spec); });
}

}  // namespace onnxtrain::ops
