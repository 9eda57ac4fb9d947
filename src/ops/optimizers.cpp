// Optimizers of the ai.onnx.preview.training domain, opset 1: Adagrad, Momentum, Adam.
//
// Each op updates n tensors at once. Inputs: R (learning rate, float or double scalar),
// T (update count, int64 scalar), then the n tensors X, the n gradients G, then the n tensors
// of each optimizer state (Adagrad: H; Momentum: V; Adam: V, H). Outputs: the n new X, then
// the n new values of each state. X, G and the states of one tensor must have the same
// shape and element type (float32 or float64); Momentum with attribute gradient_taps (internal,
// see there) takes G over a convolution weight's kept taps instead, and Adam with attribute
// gradient_rows (internal, see there) the rows of an embedding's gradient before they are
// scattered. The arithmetic is the pseudo code of each op's schema doc, quoted above its kernel;
// scalars are computed in float64, element-wise math in the tensors' type.
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "core/dispatch.h"
#include "core/finite.h"
#include "core/parallel.h"
#include "ops/factories.h"
#include "ops/store_choice.h"

namespace onnxtrain::ops {

namespace {

struct Scalars {
  double r;
  int64_t t;
};

// The input that describes optimized tensor i's G (gradient_taps, gradient_rows): after the
// `states` state tensors per X.
int gradient_form_input(int states, int n, int i) { return 2 + (2 + states) * n + i; }

// Whether that input is given and not empty (G is then not X's shape).
bool gradient_form_given(const KernelContext& ctx, int states, int n, int i) {
  const int j = gradient_form_input(states, n, i);
  return ctx.has_input(j) && ctx.input(j).numel() > 0;
}

// G's cropped taps (Momentum's attribute gradient_taps): G holds, of each block of k elements of
// X, the `offsets` ones (conv_geometry.h kept_taps_description); the others are 0.
struct GradientTaps {
  int64_t k = 0;
  std::vector<int64_t> offsets;
};

// The taps input of optimized tensor i (input 2 + (2 + states) n + i, after the states), when
// the node has attribute gradient_taps and the input is given and not empty; checks it and G
// against X. Else nullopt: G is X's shape.
std::optional<GradientTaps> gradient_taps(const KernelContext& ctx, int states, int n, int i) {
  if (!gradient_form_given(ctx, states, n, i)) return std::nullopt;
  const int j = gradient_form_input(states, n, i);
  const Tensor& t = ctx.input(j);
  const Tensor& x = ctx.input(2 + i);
  const Tensor& g = ctx.input(2 + n + i);
  const auto bad = [&](const std::string& why) {
    fail("input " + ctx.input_name(j) + " (the taps of gradient " + ctx.input_name(2 + n + i) + ") " + why);
  };
  if (t.dtype() != DataType::Int64 || t.rank() != 1) bad("is " + t.description() + ", expected int64 [1 + taps]");
  GradientTaps taps;
  const int64_t* p = t.data<int64_t>();
  taps.k = p[0];
  taps.offsets.assign(p + 1, p + t.numel());
  if (taps.k <= 0 || x.numel() % taps.k != 0) bad("names blocks of " + std::to_string(taps.k) + " elements of " + x.description());
  for (int64_t o : taps.offsets) {
    if (o < 0 || o >= taps.k) bad("names tap " + std::to_string(o) + " of blocks of " + std::to_string(taps.k));
  }
  if (g.dtype() != x.dtype() || g.numel() != x.numel() / taps.k * static_cast<int64_t>(taps.offsets.size())) {
    fail("input " + ctx.input_name(2 + n + i) + " (" + g.description() + ") must be X " + ctx.input_name(2 + i) + "'s (" +
         x.description() + ") " + std::to_string(taps.offsets.size()) + " of every " + std::to_string(taps.k) + " taps");
  }
  return taps;
}

// G as the rows of a Gather's output gradient (Adam's attribute gradient_rows): G is dY of
// Y = Gather(X, indices) along axis 0, and X's gradient is zeros with each row of dY added to
// the row of X its index names, repeated indices accumulating in index order, as
// ai.onnxtrain.GatherGrad makes it (ops/gradient_ops.cpp).
struct GradientRows {
  int64_t inner = 0;           // elements per row of X (and of dY)
  std::vector<int64_t> first;  // the rows of dY adding to row r of X: order[first[r]] .. order[first[r + 1] - 1]
  std::vector<int64_t> order;  // rows of dY by the row of X they add to, in index order within one
};

// The indices input of optimized tensor i (input 2 + (2 + states) n + i, after the states), when
// the node has attribute gradient_rows and the input is given and not empty; checks it (int32 or
// int64, each in [-rows, rows) of X, negative ones counting from the end as Gather's do) and G
// (X's type, as many elements as the indices times a row of X). Else nullopt: G is X's shape.
std::optional<GradientRows> gradient_rows(const KernelContext& ctx, int states, int n, int i) {
  if (!gradient_form_given(ctx, states, n, i)) return std::nullopt;
  const int j = gradient_form_input(states, n, i);
  const Tensor& t = ctx.input(j);
  const Tensor& x = ctx.input(2 + i);
  const Tensor& g = ctx.input(2 + n + i);
  if (t.dtype() != DataType::Int64 && t.dtype() != DataType::Int32) {
    fail("input " + ctx.input_name(j) + " (the indices of gradient " + ctx.input_name(2 + n + i) + ") is " + t.description() +
         ", expected int32 or int64");
  }
  if (x.rank() == 0) fail("X " + ctx.input_name(2 + i) + " is a scalar: its gradient cannot be given as rows");
  const int64_t rows = x.dim(0);
  GradientRows out;
  out.inner = rows > 0 ? x.numel() / rows : 0;
  if (g.dtype() != x.dtype() || g.numel() != t.numel() * out.inner) {
    fail("input " + ctx.input_name(2 + n + i) + " (" + g.description() + ") must be " + std::to_string(t.numel()) +
         " rows of X " + ctx.input_name(2 + i) + " (" + x.description() + "), one per index in " + ctx.input_name(j));
  }
  const std::vector<int64_t> indices = t.to_int64_vector("indices");
  std::vector<int64_t> row(indices.size());
  out.first.assign(static_cast<size_t>(rows + 1), 0);
  for (size_t k = 0; k < indices.size(); ++k) {
    const int64_t v = indices[k];
    if (v < -rows || v >= rows) {
      fail("index " + std::to_string(v) + " in " + ctx.input_name(j) + " is out of range for the " + std::to_string(rows) +
           " rows of X " + ctx.input_name(2 + i));
    }
    row[k] = v < 0 ? v + rows : v;
    ++out.first[static_cast<size_t>(row[k] + 1)];
  }
  for (int64_t r = 0; r < rows; ++r) out.first[static_cast<size_t>(r + 1)] += out.first[static_cast<size_t>(r)];
  out.order.resize(indices.size());
  std::vector<int64_t> next(out.first.begin(), out.first.end() - 1);
  for (size_t k = 0; k < row.size(); ++k) out.order[static_cast<size_t>(next[static_cast<size_t>(row[k])]++)] = static_cast<int64_t>(k);
  return out;
}

// How an optimizer node may give G (its attributes gradient_taps and gradient_rows).
enum class GradientForm { Whole, Taps, Rows };

// Checks the input layout and returns R and T. `states` is the number of state tensors per X;
// with G's form Taps (Momentum's attribute gradient_taps) or Rows (Adam's gradient_rows) one more
// input per X follows them, and a G given over taps is checked against them (over rows:
// gradient_rows checks it).
Scalars read_scalars_and_check(const KernelContext& ctx, int states, int& n, int trailing = 0,
                               GradientForm form = GradientForm::Whole) {
  const int per_tensor = 2 + states + (form != GradientForm::Whole ? 1 : 0);
  const int inputs = ctx.num_inputs() - trailing;
  if (inputs < 2 + per_tensor || (inputs - 2) % per_tensor != 0) {
    fail("expected inputs R, T, then " + std::to_string(per_tensor) +
         " tensors per optimized tensor (X..., G..., state...), got " +
         std::to_string(inputs) + " inputs");
  }
  n = (inputs - 2) / per_tensor;
  if (ctx.num_outputs() != n * (1 + states)) {
    fail("expected " + std::to_string(n * (1 + states)) + " outputs for " + std::to_string(n) +
         " optimized tensors, got " + std::to_string(ctx.num_outputs()));
  }
  const Tensor& r = ctx.input(0);
  const Tensor& t = ctx.input(1);
  if (r.numel() != 1 || (r.dtype() != DataType::Float32 && r.dtype() != DataType::Float64)) {
    fail("learning rate R " + ctx.input_name(0) + " must be a float32 or float64 scalar, got " + r.description());
  }
  if (t.numel() != 1 || t.dtype() != DataType::Int64) {
    fail("update count T " + ctx.input_name(1) + " must be an int64 scalar, got " + t.description());
  }
  const double rv = r.dtype() == DataType::Float32 ? r.data<float>()[0] : r.data<double>()[0];
  for (int i = 0; i < n; ++i) {
    const Tensor& x = ctx.input(2 + i);
    if (x.dtype() != DataType::Float32 && x.dtype() != DataType::Float64) {
      fail("X " + ctx.input_name(2 + i) + " must be float32 or float64, got " + x.description());
    }
    for (int k = 1; k < 2 + states; ++k) {
      const int j = 2 + k * n + i;
      if (k == 1 && form == GradientForm::Taps && gradient_taps(ctx, states, n, i)) continue;  // G holds X's cropped taps
      // G holds dY of a Gather: gradient_rows checks it.
      if (k == 1 && form == GradientForm::Rows && gradient_form_given(ctx, states, n, i)) continue;
      const Tensor& other = ctx.input(j);
      if (other.dtype() != x.dtype() || !(other.shape() == x.shape())) {
        fail("input " + ctx.input_name(j) + " (" + other.description() + ") must match X " +
             ctx.input_name(2 + i) + " (" + x.description() + ")");
      }
    }
  }
  return {rv, t.data<int64_t>()[0]};
}

// Applies `update(index, x, g, states_in..., outputs...)` element-wise to optimized tensor i.
template <class T, int States, class F>
void update_tensor(KernelContext& ctx, int n, int i, F&& update) {
  const Tensor& x = ctx.input(2 + i);
  const T* xs = x.data<T>();
  const T* gs = ctx.input(2 + n + i).data<T>();
  std::array<const T*, States> in{};
  std::array<T*, States + 1> out{};
  for (int s = 0; s < States; ++s) in[static_cast<size_t>(s)] = ctx.input(2 + (2 + s) * n + i).data<T>();
  for (int s = 0; s <= States; ++s) {
    out[static_cast<size_t>(s)] = ctx.allocate_output(s * n + i, x.dtype(), x.shape()).template data<T>();
  }
  // Elements are independent (outputs never alias inputs: each is a fresh allocation), so the
  // loop may be vectorized although the compiler cannot prove it through the pointer arrays.
  parallel_for(x.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t e = begin; e < end; ++e) update(e, xs[e], gs[e], in, out);
  });
}

// Runs `pass` (which writes with streaming stores when given true) as choice says. `outputs`:
// how many tensors of each optimized X's size the pass writes (Momentum 2, Adam 3).
template <class Pass>
void timed_pass(StoreChoice& choice, const KernelContext& ctx, int n, int outputs, Pass&& pass) {
  int64_t bytes = 0;
  for (int i = 0; i < n; ++i) bytes += static_cast<int64_t>(ctx.input(2 + i).nbytes()) * outputs;
  pass(choice.start(bytes));
}

#if defined(__AVX2__)
// Eight floats to 32-byte aligned p, with a streaming store or an ordinary one (StoreChoice).
inline void store8(float* p, __m256 v, bool stream) {
  if (stream) {
    _mm256_stream_ps(p, v);
  } else {
    _mm256_store_ps(p, v);
  }
}

// The float32 loop of Momentum and Adam over elements [begin, end) of one tensor: `one(e)` for
// the elements before `out` + e is 32-byte aligned and after the last whole 8, `eight(e, check)`
// for the 8 elements from e, which writes with store8 (all outputs of one tensor share the
// alignment, as every tensor starts 64-byte aligned). With `guard`, `eight` adds its outputs
// times 0 to `check` (NaN exactly when one is NaN or Inf) and `finite(b, e)` checks the scalar
// elements [b, e). Returns false when the guard found NaN or Inf.
template <class One, class Eight, class Finite>
bool float32_pass(const float* out, int64_t begin, int64_t end, bool guard, One one, Eight eight, Finite finite) {
  int64_t e = begin;
  for (; e < end && (reinterpret_cast<uintptr_t>(out + e) & 31) != 0; ++e) one(e);
  const int64_t head = e;
  __m256 check = _mm256_setzero_ps();
  for (; e + 8 <= end; e += 8) eight(e, check);
  const int64_t tail = e;
  for (; e < end; ++e) one(e);
  _mm_sfence();
  return !guard || (_mm256_movemask_ps(_mm256_cmp_ps(check, check, _CMP_UNORD_Q)) == 0 && finite(begin, head) &&
                    finite(tail, end));
}
#endif

// Runs `range(c0, c1, g, c0)` over elements [0, count) of one optimized tensor a chunk at a time,
// G's elements [c0, c1) made in cache by `fill(c0, c1, g)` into g (zeroed first) instead of read
// from a whole G in memory (Momentum's gradient_taps, Adam's gradient_rows). Chunks start at
// multiples of 8 elements, as the whole tensor's threads' shares do on the tensors this is made
// for, so the same elements take the scalar head and tail code of float32_pass as with G whole
// (which rounds a * v + b * g through one FMA): the results are those of G made whole, to the bit.
template <class T, class Fill, class Range>
void chunked_gradient_pass(int64_t count, Fill&& fill, Range&& range) {
  constexpr int64_t kChunk = 4096;  // elements: 16 KB of float32 G
  parallel_for((count + 7) / 8, kParallelGrain / 8, [&](int64_t first, int64_t last) {
    std::vector<T> g(static_cast<size_t>(kChunk));
    for (int64_t c0 = first * 8; c0 < std::min(count, last * 8); c0 += kChunk) {
      const int64_t c1 = std::min({c0 + kChunk, last * 8, count});
      std::fill(g.begin(), g.begin() + (c1 - c0), T(0));
      fill(c0, c1, g.data());
      range(c0, c1, g.data(), c0);
    }
  });
}

class Adagrad final : public Kernel {
 public:
  explicit Adagrad(const KernelInit& init)
      : decay_factor_(init.attr_float("decay_factor", 0.0f)),
        epsilon_(init.attr_float("epsilon", 1e-6f)),
        norm_coefficient_(init.attr_float("norm_coefficient", 0.0f)) {}

  // r = R / (1 + T * decay_factor)
  // G_regularized = norm_coefficient * X + G
  // H_new = H + G_regularized * G_regularized
  // X_new = X - r * G_regularized / (Sqrt(H_new) + epsilon)
  void run(KernelContext& ctx) override {
    int n = 0;
    const Scalars s = read_scalars_and_check(ctx, 1, n);
    const double r = s.r / (1.0 + static_cast<double>(s.t) * decay_factor_);
    for (int i = 0; i < n; ++i) {
      visit_dtype<TypeList<float, double>>(ctx.input(2 + i).dtype(), "Adagrad X", [&]<class T>() {
        const T rr = static_cast<T>(r), eps = static_cast<T>(epsilon_), norm = static_cast<T>(norm_coefficient_);
        update_tensor<T, 1>(ctx, n, i, [=](int64_t e, T x, T g, const auto& in, const auto& out) {
          const T gr = norm * x + g;
          const T h = in[0][e] + gr * gr;
          out[1][e] = h;
          out[0][e] = x - rr * gr / (std::sqrt(h) + eps);
        });
      });
    }
  }

 private:
  float decay_factor_, epsilon_, norm_coefficient_;
};

class Momentum final : public Kernel {
 public:
  explicit Momentum(const KernelInit& init)
      : alpha_(init.attr_float("alpha", 0.0f)),
        beta_(init.attr_float("beta", 0.0f)),
        norm_coefficient_(init.attr_float("norm_coefficient", 0.0f)) {
    for (const char* required : {"alpha", "beta", "mode", "norm_coefficient"}) {
      if (!init.has_attr(required)) fail("required attribute '" + std::string(required) + "' is missing");
    }
    const std::string mode = init.attr_string("mode", "standard");
    if (mode != "standard" && mode != "nesterov") {
      fail("attribute 'mode' is '" + mode + "', expected 'standard' or 'nesterov'");
    }
    nesterov_ = mode == "nesterov";
    gradient_taps_ = init.attr_int("gradient_taps", 0) != 0;
  }

  // G_regularized = norm_coefficient * X + G
  // beta_adjusted = T > 0 ? beta : 1
  // V_new = alpha * V + beta_adjusted * G_regularized
  // standard: X_new = X - R * V_new;  nesterov: X_new = X - R * (G_regularized + alpha * V_new)
  // One pass per tensor; with the run's nan_guard it checks X_new and V_new while writing them
  // (checks_outputs_for_nan_guard) and fails on NaN or Inf, naming them.
  // With attribute gradient_taps = 1 (made by runtime/fusion.h crop_momentum_gradients, never
  // saved) n more inputs follow V...: for tensor i an int64 description of G's taps
  // (conv_geometry.h kept_taps_description: ConvGrad's output 3 with attribute dw_taps), where G
  // holds only those taps of each block of k elements of X and the others are 0; an absent or
  // empty one leaves G as X's shape. The update is the same element for element; the zeros are
  // made in cache, chunk by chunk, instead of being written and read as a whole tensor (the 3x3
  // convolutions on ResNet-18's 1x1 layer-4 maps: 9.4 MB of dW each, of which 1 tap in 9 is not 0).
  void run(KernelContext& ctx) override {
    int n = 0;
    const Scalars s = read_scalars_and_check(ctx, 1, n, 0, gradient_taps_ ? GradientForm::Taps : GradientForm::Whole);
    const double beta_adjusted = s.t > 0 ? beta_ : 1.0;
    timed_pass(store_choice_, ctx, n, 2, [&](bool stream) {
      for (int i = 0; i < n; ++i) {
        visit_dtype<TypeList<float, double>>(ctx.input(2 + i).dtype(), "Momentum X", [&]<class T>() {
          if (nesterov_) {
            update<T, true>(ctx, n, i, s.r, beta_adjusted, stream);
          } else {
            update<T, false>(ctx, n, i, s.r, beta_adjusted, stream);
          }
        });
      }
    });
  }

 private:
  template <class T, bool Nesterov>
  void update(KernelContext& ctx, int n, int i, double lr, double beta_adjusted, bool stream) const {
    const T r = static_cast<T>(lr), a = static_cast<T>(alpha_), b = static_cast<T>(beta_adjusted);
    const T norm = static_cast<T>(norm_coefficient_);
    const Tensor& x_in = ctx.input(2 + i);
    const T* __restrict xs = x_in.data<T>();
    const T* __restrict gs = ctx.input(2 + n + i).data<T>();
    const T* __restrict vs = ctx.input(2 + 2 * n + i).data<T>();
    T* __restrict x_out = ctx.allocate_output(i, x_in.dtype(), x_in.shape()).template data<T>();
    T* __restrict v_out = ctx.allocate_output(n + i, x_in.dtype(), x_in.shape()).template data<T>();
    const bool guard = ctx.run_context().nan_guard;
    std::atomic<bool> non_finite{false};
    std::atomic<bool>* flag = &non_finite;
    // Elements [begin, end), G's element e at g[e - g_first].
    const auto range = [=](int64_t begin, int64_t end, const T* g, int64_t g_first) {
      const auto one = [&](int64_t e) {
        const T gr = norm * xs[e] + g[e - g_first];
        const T v = a * vs[e] + b * gr;
        v_out[e] = v;
        x_out[e] = Nesterov ? xs[e] - r * (gr + a * v) : xs[e] - r * v;
      };
      const auto finite = [&](int64_t from, int64_t to) { return all_finite(x_out, from, to) && all_finite(v_out, from, to); };
#if defined(__AVX2__)
      if constexpr (std::is_same_v<T, float>) {
        const __m256 vr = _mm256_set1_ps(r), va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b), vn = _mm256_set1_ps(norm);
        const __m256 zero = _mm256_setzero_ps();
        const auto eight = [&](int64_t e, __m256& check) {
          const __m256 x = _mm256_loadu_ps(xs + e);
          const __m256 gr = _mm256_add_ps(_mm256_mul_ps(vn, x), _mm256_loadu_ps(g + (e - g_first)));
          const __m256 v = _mm256_add_ps(_mm256_mul_ps(va, _mm256_loadu_ps(vs + e)), _mm256_mul_ps(vb, gr));
          const __m256 step = Nesterov ? _mm256_add_ps(gr, _mm256_mul_ps(va, v)) : v;
          const __m256 x_new = _mm256_sub_ps(x, _mm256_mul_ps(vr, step));
          store8(x_out + e, x_new, stream);
          store8(v_out + e, v, stream);
          if (guard) check = _mm256_add_ps(check, _mm256_add_ps(_mm256_mul_ps(x_new, zero), _mm256_mul_ps(v, zero)));
        };
        if (!float32_pass(x_out, begin, end, guard, one, eight, finite)) flag->store(true, std::memory_order_relaxed);
        return;
      }
#endif
#pragma omp simd
      for (int64_t e = begin; e < end; ++e) one(e);
      if (guard && !finite(begin, end)) flag->store(true, std::memory_order_relaxed);
    };
    const std::optional<GradientTaps> taps = gradient_taps_ ? gradient_taps(ctx, 1, n, i) : std::nullopt;
    if (!taps) {
      parallel_for(x_in.numel(), kParallelGrain, [&](int64_t begin, int64_t end) { range(begin, end, gs, 0); });
    } else {  // G's kept taps into each chunk
      const int64_t k = taps->k, kept = static_cast<int64_t>(taps->offsets.size());
      chunked_gradient_pass<T>(
          x_in.numel(),
          [&](int64_t c0, int64_t c1, T* g) {
            for (int64_t blk = c0 / k; blk * k < c1; ++blk) {
              for (int64_t j = 0; j < kept; ++j) {
                const int64_t e = blk * k + taps->offsets[static_cast<size_t>(j)];
                if (e >= c0 && e < c1) g[e - c0] = gs[blk * kept + j];
              }
            }
          },
          range);
    }
    if (non_finite.load()) {
      fail("output " + ctx.output_name(i) + " or " + ctx.output_name(n + i) +
           " holds NaN or Inf (NaN guard: the step is rejected)");
    }
  }

  float alpha_, beta_, norm_coefficient_;
  bool nesterov_ = false;
  bool gradient_taps_ = false;  // attribute gradient_taps
  StoreChoice store_choice_;
};

// Adam as ai.onnx.preview.training.Adam defines it. With `scaled` (ai.onnxtrain.ScaledAdam,
// made by runtime/fusion.cpp) five scalar inputs follow the 4n + 2 of Adam, S_G, S_V, S_H, M_V,
// M_H, and the op computes, in one pass per tensor, what this subgraph computes in six
// (up to rounding, see update()):
//   Adam(R, T, X..., G / S_G..., V / S_V..., H / S_H...) -> X_new..., V_new * M_V..., H_new * M_H...
// With attribute x_scaled = 1 a sixth scalar S_X follows, and X... stand for X * S_X (AdamW's
// decayed parameters; the same product the Mul nodes it replaces computed).
// With attribute gradient_rows = 1 (made by runtime/fusion.h fuse_gather_grad_adam, never saved;
// Adam and ScaledAdam) n more inputs follow H... (before ScaledAdam's scalars): for tensor i the
// indices of a Gather along axis 0 of X (an embedding lookup), where G is then that Gather's
// output gradient dY and X's gradient is GatherGrad's (the zeros with each row of dY added to the
// row its index names); an absent or empty one leaves G as X's shape. The update is the same to
// the bit; the gradient is made in cache, chunk by chunk, instead of written and read as a whole
// tensor (BERT's [30522, 256] word embeddings: 31 MB each way a step, for 4096 rows of dY).
// When the run's context has nan_guard (a TrainingSession with its NaN guard on), both check
// every output for NaN and Inf while writing it and fail on any, naming the outputs.
class Adam final : public Kernel {
 public:
  Adam(const KernelInit& init, bool scaled)
      : alpha_(init.attr_float("alpha", 0.9f)),
        beta_(init.attr_float("beta", 0.999f)),
        epsilon_(init.attr_float("epsilon", 1e-6f)),
        norm_coefficient_(init.attr_float("norm_coefficient", 0.0f)),
        norm_coefficient_post_(init.attr_float("norm_coefficient_post", 0.0f)),
        scaled_(scaled),
        x_scaled_(scaled && init.attr_int("x_scaled", 0) != 0),
        gradient_rows_(init.attr_int("gradient_rows", 0) != 0) {}

  // G_regularized = norm_coefficient * X + G
  // V_new = alpha * V + (1 - alpha) * G_regularized
  // H_new = beta * H + (1 - beta) * G_regularized * G_regularized
  // H_sqrt = Sqrt(H_new) + epsilon
  // R_adjusted = T > 0 ? R * Sqrt(1 - beta**T) / (1 - alpha**T) : R
  // X_new = X - R_adjusted * V_new / H_sqrt
  // X_final = (1 - norm_coefficient_post) * X_new
  void run(KernelContext& ctx) override {
    int n = 0;
    const int scalars = scaled_ ? (x_scaled_ ? 6 : 5) : 0;
    const Scalars s = read_scalars_and_check(ctx, 2, n, scalars, gradient_rows_ ? GradientForm::Rows : GradientForm::Whole);
    std::vector<std::optional<GradientRows>> rows(static_cast<size_t>(n));
    if (gradient_rows_) {  // every check before the first output is written
      for (int i = 0; i < n; ++i) rows[static_cast<size_t>(i)] = gradient_rows(ctx, 2, n, i);
    }
    const int first_scalar = 2 + (gradient_rows_ ? 5 : 4) * n;
    const double t = static_cast<double>(s.t);
    const double r_adjusted =
        s.t > 0 ? s.r * std::sqrt(1.0 - std::pow(double{beta_}, t)) / (1.0 - std::pow(double{alpha_}, t)) : s.r;
    timed_pass(store_choice_, ctx, n, 3, [&](bool stream) {
      for (int i = 0; i < n; ++i) {
        const GradientRows* g_rows = rows[static_cast<size_t>(i)] ? &*rows[static_cast<size_t>(i)] : nullptr;
        visit_dtype<TypeList<float, double>>(ctx.input(2 + i).dtype(), "Adam X", [&]<class T>() {
          if (scaled_) {
            std::array<T, 6> k{T(1), T(1), T(1), T(1), T(1), T(1)};
            for (int j = 0; j < scalars; ++j) k[static_cast<size_t>(j)] = scale_input<T>(ctx, first_scalar + j, ctx.input(2 + i));
            update<T, true>(ctx, n, i, r_adjusted, k, g_rows, stream);
          } else {
            update<T, false>(ctx, n, i, r_adjusted, {}, g_rows, stream);
          }
        });
      }
    });
  }

 private:
  // Scalar input j, which must have X's element type.
  template <class T>
  static T scale_input(const KernelContext& ctx, int j, const Tensor& x) {
    const Tensor& k = ctx.input(j);
    if (k.numel() != 1 || k.dtype() != x.dtype()) {
      fail("scale " + ctx.input_name(j) + " must be a scalar of X's type " + std::string(dtype_name(x.dtype())) +
           ", got " + k.description());
    }
    return k.data<T>()[0];
  }

  // The hottest loop of Adam training: restrict-qualified locals let it vectorize. The scaled
  // variant multiplies by the reciprocals of S_G, S_V and S_H where the Div nodes it replaces
  // divide: each scaled input may differ from theirs in the last bit. `rows`: G as the rows of a
  // Gather's output gradient (attribute gradient_rows), else null and G is X's shape.
  template <class T, bool Scaled>
  void update(KernelContext& ctx, int n, int i, double r_adjusted, std::array<T, 6> k, const GradientRows* rows, bool stream) {
    const T r = static_cast<T>(r_adjusted), a = static_cast<T>(alpha_), b = static_cast<T>(beta_);
    const T eps = static_cast<T>(epsilon_), norm = static_cast<T>(norm_coefficient_);
    const T keep = static_cast<T>(1.0 - double{norm_coefficient_post_});
    const Tensor& x_in = ctx.input(2 + i);
    const T* __restrict xs = x_in.data<T>();
    const T* __restrict gs = ctx.input(2 + n + i).data<T>();
    const T* __restrict vs = ctx.input(2 + 2 * n + i).data<T>();
    const T* __restrict hs = ctx.input(2 + 3 * n + i).data<T>();
    T* __restrict x_out = ctx.allocate_output(i, x_in.dtype(), x_in.shape()).template data<T>();
    T* __restrict v_out = ctx.allocate_output(n + i, x_in.dtype(), x_in.shape()).template data<T>();
    T* __restrict h_out = ctx.allocate_output(2 * n + i, x_in.dtype(), x_in.shape()).template data<T>();
    // With the NaN guard on, each chunk sums its outputs times 0: NaN exactly when one of them
    // is NaN or Inf.
    const bool guard = ctx.run_context().nan_guard;
    std::atomic<bool> non_finite{false};
    std::atomic<bool>* flag = &non_finite;
    // Elements [begin, end), G's element e at g[e - g_first].
    const auto range = [=](int64_t begin, int64_t end, const T* g, int64_t g_first) {
      const T* __restrict x0 = xs;
      const T* __restrict g0 = g;
      const T* __restrict v0 = vs;
      const T* __restrict h0 = hs;
      T* __restrict x1 = x_out;
      T* __restrict v1 = v_out;
      T* __restrict h1 = h_out;
      const T rr = r, aa = a, bb = b, ee = eps, nn = norm, kk = keep;
      // Reciprocals: three divisions per element would make this loop compute-bound.
      const T sg = T(1) / k[0], sv = T(1) / k[1], sh = T(1) / k[2], mv = k[3], mh = k[4], sx = k[5];
      const auto one = [&](int64_t e) {
        T gv = g0[e - g_first], vp = v0[e], hp = h0[e], x = x0[e];
        if constexpr (Scaled) {
          gv = gv * sg;
          vp = vp * sv;
          hp = hp * sh;
          x = x * sx;
        }
        const T gr = nn * x + gv;
        const T v = aa * vp + (T(1) - aa) * gr;
        const T h = bb * hp + (T(1) - bb) * gr * gr;
        x1[e] = kk * (x - rr * v / (std::sqrt(h) + ee));
        v1[e] = Scaled ? v * mv : v;
        h1[e] = Scaled ? h * mh : h;
      };
#if defined(__AVX2__)
      if constexpr (std::is_same_v<T, float>) {
        const __m256 vsg = _mm256_set1_ps(Scaled ? sg : 1.0f), vsv = _mm256_set1_ps(Scaled ? sv : 1.0f);
        const __m256 vsh = _mm256_set1_ps(Scaled ? sh : 1.0f), vmv = _mm256_set1_ps(Scaled ? mv : 1.0f);
        const __m256 vmh = _mm256_set1_ps(Scaled ? mh : 1.0f), va = _mm256_set1_ps(aa), va1 = _mm256_set1_ps(1.0f - aa);
        const __m256 vsx = _mm256_set1_ps(Scaled ? sx : 1.0f);
        const __m256 vb = _mm256_set1_ps(bb), vb1 = _mm256_set1_ps(1.0f - bb), vr = _mm256_set1_ps(rr);
        const __m256 ve = _mm256_set1_ps(ee), vn = _mm256_set1_ps(nn), vk = _mm256_set1_ps(kk);
        const __m256 zero = _mm256_setzero_ps();
        const auto eight = [&](int64_t e, __m256& check) {
          const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(x0 + e), vsx);
          const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(g0 + (e - g_first)), vsg);
          const __m256 gr = _mm256_add_ps(_mm256_mul_ps(vn, x), g);
          const __m256 v = _mm256_add_ps(_mm256_mul_ps(va, _mm256_mul_ps(_mm256_loadu_ps(v0 + e), vsv)), _mm256_mul_ps(va1, gr));
          const __m256 h = _mm256_add_ps(_mm256_mul_ps(vb, _mm256_mul_ps(_mm256_loadu_ps(h0 + e), vsh)),
                                         _mm256_mul_ps(_mm256_mul_ps(vb1, gr), gr));
          const __m256 u = _mm256_div_ps(_mm256_mul_ps(vr, v), _mm256_add_ps(_mm256_sqrt_ps(h), ve));
          const __m256 x_new = _mm256_mul_ps(vk, _mm256_sub_ps(x, u));
          const __m256 v_new = _mm256_mul_ps(v, vmv), h_new = _mm256_mul_ps(h, vmh);
          store8(x1 + e, x_new, stream);
          store8(v1 + e, v_new, stream);
          store8(h1 + e, h_new, stream);
          if (guard) {
            check = _mm256_add_ps(check, _mm256_mul_ps(x_new, zero));
            check = _mm256_add_ps(check, _mm256_add_ps(_mm256_mul_ps(v_new, zero), _mm256_mul_ps(h_new, zero)));
          }
        };
        const auto finite = [&](int64_t from, int64_t to) { return outputs_finite(x1, v1, h1, from, to); };
        if (!float32_pass(x1, begin, end, guard, one, eight, finite)) flag->store(true, std::memory_order_relaxed);
        return;
      }
#endif
#pragma omp simd
      for (int64_t e = begin; e < end; ++e) one(e);
      if (guard && !outputs_finite(x1, v1, h1, begin, end)) flag->store(true, std::memory_order_relaxed);
    };
    if (!rows) {
      parallel_for(x_in.numel(), kParallelGrain, [&](int64_t begin, int64_t end) { range(begin, end, gs, 0); });
    } else {  // each chunk's rows of X's gradient summed from the rows of dY that index them, in index order
      const int64_t inner = rows->inner;
      chunked_gradient_pass<T>(
          inner > 0 ? x_in.numel() : 0,
          [&](int64_t c0, int64_t c1, T* g) {
            for (int64_t row = c0 / inner; row * inner < c1; ++row) {
              const int64_t e0 = std::max(c0, row * inner), e1 = std::min(c1, (row + 1) * inner);
              for (int64_t j = rows->first[static_cast<size_t>(row)]; j < rows->first[static_cast<size_t>(row + 1)]; ++j) {
                const T* src = gs + rows->order[static_cast<size_t>(j)] * inner;
                for (int64_t e = e0; e < e1; ++e) g[e - c0] = g[e - c0] + src[e - row * inner];
              }
            }
          },
          range);
    }
    if (non_finite.load()) {
      fail("output " + ctx.output_name(i) + ", " + ctx.output_name(n + i) + " or " + ctx.output_name(2 * n + i) +
           " holds NaN or Inf (NaN guard: the step is rejected)");
    }
  }

  // Whether x, v and h hold only finite values over [begin, end).
  template <class T>
  static bool outputs_finite(const T* x, const T* v, const T* h, int64_t begin, int64_t end) {
    return all_finite(x, begin, end) && all_finite(v, begin, end) && all_finite(h, begin, end);
  }

  float alpha_, beta_, epsilon_, norm_coefficient_, norm_coefficient_post_;
  bool scaled_;
  bool x_scaled_;       // ScaledAdam with S_X (attribute x_scaled)
  bool gradient_rows_;  // attribute gradient_rows
  StoreChoice store_choice_;
};

}  // namespace

std::unique_ptr<Kernel> make_adagrad(const KernelInit& init) { return std::make_unique<Adagrad>(init); }
std::unique_ptr<Kernel> make_momentum(const KernelInit& init) { return std::make_unique<Momentum>(init); }
std::unique_ptr<Kernel> make_adam(const KernelInit& init) { return std::make_unique<Adam>(init, false); }
std::unique_ptr<Kernel> make_scaled_adam(const KernelInit& init) { return std::make_unique<Adam>(init, true); }

bool checks_outputs_for_nan_guard(const std::string& domain, const std::string& op_type) {
  return (domain == "ai.onnx.preview.training" && (op_type == "Adam" || op_type == "Momentum")) ||
         (domain == "ai.onnxtrain" && op_type == "ScaledAdam");
}

}  // namespace onnxtrain::ops
