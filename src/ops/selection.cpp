// Selection ops, whose outputs pick, reorder or overwrite elements (ONNX operator docs, ai.onnx):
//   Unique (11; 28 adds bfloat16), NonZero (9; 13 adds bfloat16), Compress (9; 11 allows a
//   negative axis; 28 adds bfloat16), ReverseSequence (10; 28 adds bfloat16), TensorScatter (24).
// Element types: every type a tensor holds (onnxtrain has no string or complex tensors).
//
// Unique(X; axis?, sorted=1) -> Y, indices, inverse_indices, counts (numpy.unique): without
//   `axis` the unique values of the flattened X, with it the unique slices along the axis
//   (compared lexicographically in row-major order). Sorted ascending, or (sorted=0) in the
//   order of first occurrence. indices: the first occurrence of each; inverse_indices: for each
//   value/slice of X, its position in Y; counts: occurrences. Floating values order NaN after
//   every number and count all NaNs as one value (numpy's equal_nan=True); -0 equals +0 (Y holds
//   the first occurrence's bits).
// NonZero(X) -> [rank, count] int64: the indices of the non-zero elements in row-major order
//   (NaN is non-zero); a scalar gives [0, count] (the op doc's exception to numpy).
// Compress(input, condition; axis?) -> the slices along `axis` (or, without it, the elements of
//   the flattened input) at which the 1-D bool condition is true. A condition shorter than the
//   axis keeps nothing past its end; a true entry past the axis' end is an Error (numpy).
// ReverseSequence(input [rank >= 2], sequence_lens [batch] int64; batch_axis, time_axis, which
//   are 0 and 1 in some order) -> input with the first sequence_lens[b] steps of each batch
//   entry reversed along the time axis; lengths must lie in [0, time steps].
// TensorScatter(past_cache, update, write_indices? [batch] int64; mode, axis=-2, not 0)
//   -> present_cache: past_cache with update's `sequence_length` rows along `axis` written at
//   write_indices[b] + s (mod max_sequence_length in mode "circular"; in "linear" they must fit:
//   0 <= write_indices[b] and write_indices[b] + sequence_length <= max_sequence_length).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/data_movement.h"
#include "ops/factories.h"

namespace onnxtrain::ops {

namespace {

// ------------------------------------------------------------------ Unique

// Total order on values: NaN after every number, all NaNs equal.
template <class V>
int compare_values(V a, V b) {
  if constexpr (std::is_floating_point_v<V>) {
    const bool na = std::isnan(a), nb = std::isnan(b);
    if (na || nb) return na == nb ? 0 : na ? 1 : -1;
  }
  return a < b ? -1 : b < a ? 1 : 0;
}

class Unique final : public Kernel {
 public:
  explicit Unique(const KernelInit& init) : has_axis_(init.has_attr("axis")), axis_(init.attr_int("axis", 0)) {
    const int64_t s = init.attr_int("sorted", 1);
    if (s != 0 && s != 1) throw Error("Unique attribute 'sorted' must be 0 or 1, got " + std::to_string(s));
    sorted_ = s == 1;
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    size_t axis = 0;
    Shape view{1, x.numel(), 1};  // [outer, slices, inner]
    if (has_axis_) {
      axis = static_cast<size_t>(normalize_axis(axis_, static_cast<int64_t>(x.rank()), "Unique attribute 'axis'"));
      view = Shape{x.shape().numel(0, axis), x.dim(axis), x.shape().numel(axis + 1, x.rank())};
    }
    visit_dtype<AllTypes>(x.dtype(), "Unique input " + ctx.input_name(0),
                          [&]<class T>() { run_typed<T>(ctx, x, axis, view); });
  }

 private:
  template <class T>
  void run_typed(KernelContext& ctx, const Tensor& x, size_t axis, const Shape& view) const {
    const int64_t outer = view[0], slices = view[1], inner = view[2];
    const T* xs = x.data<T>();
    // Three-way comparison of slices p and q.
    auto compare = [&](int64_t p, int64_t q) {
      for (int64_t o = 0; o < outer; ++o) {
        const T* a = xs + (o * slices + p) * inner;
        const T* b = xs + (o * slices + q) * inner;
        for (int64_t i = 0; i < inner; ++i) {
          const int c = compare_values(static_cast<compute_t<T>>(a[i]), static_cast<compute_t<T>>(b[i]));
          if (c != 0) return c;
        }
      }
      return 0;
    };
    std::vector<int64_t> order(static_cast<size_t>(slices));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t p, int64_t q) { return compare(p, q) < 0; });
    // Groups of equal slices; the stable sort puts each group's first occurrence first.
    std::vector<int64_t> first, counts, inverse(static_cast<size_t>(slices));
    for (size_t k = 0; k < order.size(); ++k) {
      if (k == 0 || compare(order[k - 1], order[k]) != 0) {
        first.push_back(order[k]);
        counts.push_back(0);
      }
      ++counts.back();
      inverse[static_cast<size_t>(order[k])] = static_cast<int64_t>(first.size()) - 1;
    }
    const auto uniques = static_cast<int64_t>(first.size());
    if (!sorted_) {  // renumber the groups by first occurrence
      std::vector<int64_t> by_first(first.size()), rank(first.size());
      std::iota(by_first.begin(), by_first.end(), 0);
      std::sort(by_first.begin(), by_first.end(), [&](int64_t a, int64_t b) { return first[a] < first[b]; });
      std::vector<int64_t> f2(first.size()), c2(first.size());
      for (size_t u = 0; u < by_first.size(); ++u) {
        rank[static_cast<size_t>(by_first[u])] = static_cast<int64_t>(u);
        f2[u] = first[static_cast<size_t>(by_first[u])];
        c2[u] = counts[static_cast<size_t>(by_first[u])];
      }
      first = std::move(f2);
      counts = std::move(c2);
      for (int64_t& v : inverse) v = rank[static_cast<size_t>(v)];
    }
    Shape y_shape{uniques};
    if (has_axis_) {
      y_shape = x.shape();
      y_shape[axis] = uniques;
    }
    T* ys = ctx.allocate_output(0, x.dtype(), y_shape).template data<T>();
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t u = 0; u < uniques; ++u) {
        std::copy_n(xs + (o * slices + first[static_cast<size_t>(u)]) * inner, inner, ys + (o * uniques + u) * inner);
      }
    }
    auto write = [&](int i, const std::vector<int64_t>& v) {
      if (!ctx.has_output(i)) return;
      Tensor& t = ctx.allocate_output(i, DataType::Int64, Shape{static_cast<int64_t>(v.size())});
      std::copy(v.begin(), v.end(), t.data<int64_t>());
    };
    write(1, first);
    write(2, inverse);
    write(3, counts);
  }

  bool has_axis_;
  int64_t axis_;
  bool sorted_ = true;
};

// ------------------------------------------------------------------ NonZero

void nonzero(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  std::vector<int64_t> hits;  // flat positions
  visit_dtype<AllTypes>(x.dtype(), "NonZero input " + ctx.input_name(0), [&]<class T>() {
    const T* xs = x.data<T>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      if (static_cast<compute_t<T>>(xs[i]) != compute_t<T>(0)) hits.push_back(i);
    }
  });
  const auto count = static_cast<int64_t>(hits.size());
  Tensor& y = ctx.allocate_output(0, DataType::Int64, Shape{static_cast<int64_t>(x.rank()), count});
  int64_t* out = y.data<int64_t>();
  const Shape strides = contiguous_strides(x.shape());
  for (int64_t k = 0; k < count; ++k) {
    int64_t rest = hits[static_cast<size_t>(k)];
    for (size_t d = 0; d < x.rank(); ++d) {
      out[static_cast<int64_t>(d) * count + k] = rest / strides[d];
      rest %= strides[d];
    }
  }
}

// ------------------------------------------------------------------ Compress

class Compress final : public Kernel {
 public:
  explicit Compress(const KernelInit& init)
      : has_axis_(init.has_attr("axis")), axis_(init.attr_int("axis", 0)), opset_(init.opset()) {
    if (has_axis_ && axis_ < 0 && opset_ < 11) {
      throw Error("Compress attribute 'axis' is negative (" + std::to_string(axis_) +
                  "), which needs opset 11 or later (the model imports opset " + std::to_string(opset_) + ")");
    }
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& cond = ctx.input(1);
    if (x.rank() < 1) throw Error("input " + ctx.input_name(0) + " must have rank >= 1, got " + x.description());
    if (cond.dtype() != DataType::Bool || cond.rank() != 1) {
      throw Error("input " + ctx.input_name(1) + " (condition) must be a 1-D bool tensor, got " + cond.description());
    }
    size_t axis = 0;
    Shape view{1, x.numel(), 1};  // [outer, length, inner]
    if (has_axis_) {
      axis = static_cast<size_t>(normalize_axis(axis_, static_cast<int64_t>(x.rank()), "Compress attribute 'axis'"));
      view = Shape{x.shape().numel(0, axis), x.dim(axis), x.shape().numel(axis + 1, x.rank())};
    }
    const bool* c = cond.data<bool>();
    std::vector<int64_t> kept;
    for (int64_t j = 0; j < cond.numel(); ++j) {
      if (!c[j]) continue;
      if (j >= view[1]) {
        throw Error("input " + ctx.input_name(1) + " (condition) is true at " + std::to_string(j) +
                    ", past the end of the " + std::to_string(view[1]) + " entries of input " + ctx.input_name(0) +
                    " " + x.description() + (has_axis_ ? " along the axis" : " (flattened)"));
      }
      kept.push_back(j);
    }
    Shape y_shape{static_cast<int64_t>(kept.size())};
    if (has_axis_) {
      y_shape = x.shape();
      y_shape[axis] = static_cast<int64_t>(kept.size());
    }
    Tensor& y = ctx.allocate_output(0, x.dtype(), y_shape);
    const size_t block = static_cast<size_t>(view[2]) * dtype_size(x.dtype());
    const auto* src = static_cast<const char*>(x.raw_data());
    auto* dst = static_cast<char*>(y.raw_data());
    for (int64_t o = 0; o < view[0]; ++o) {
      for (int64_t j : kept) {
        std::memcpy(dst, src + static_cast<size_t>(o * view[1] + j) * block, block);
        dst += block;
      }
    }
  }

 private:
  bool has_axis_;
  int64_t axis_;
  int opset_;
};

// ------------------------------------------------------------------ ReverseSequence

class ReverseSequence final : public Kernel {
 public:
  explicit ReverseSequence(const KernelInit& init)
      : batch_axis_(init.attr_int("batch_axis", 1)), time_axis_(init.attr_int("time_axis", 0)) {
    const bool ok = (batch_axis_ == 0 && time_axis_ == 1) || (batch_axis_ == 1 && time_axis_ == 0);
    if (!ok) {
      throw Error("ReverseSequence attributes batch_axis and time_axis must be 0 and 1 in some order, got " +
                  std::to_string(batch_axis_) + " and " + std::to_string(time_axis_));
    }
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& lens = ctx.input(1);
    if (x.rank() < 2) throw Error("input " + ctx.input_name(0) + " must have rank >= 2, got " + x.description());
    const int64_t batch = x.dim(static_cast<size_t>(batch_axis_)), steps = x.dim(static_cast<size_t>(time_axis_));
    if (lens.dtype() != DataType::Int64 || lens.rank() != 1 || lens.dim(0) != batch) {
      throw Error("input " + ctx.input_name(1) + " (sequence_lens) must be int64 [" + std::to_string(batch) +
                  "] (the batch size), got " + lens.description());
    }
    const int64_t* len = lens.data<int64_t>();
    for (int64_t b = 0; b < batch; ++b) {
      if (len[b] < 0 || len[b] > steps) {
        throw Error("input " + ctx.input_name(1) + " (sequence_lens) holds " + std::to_string(len[b]) +
                    " at batch " + std::to_string(b) + ", outside [0, " + std::to_string(steps) + "] time steps");
      }
    }
    Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
    const size_t block = static_cast<size_t>(x.shape().numel(2, x.rank())) * dtype_size(x.dtype());
    // Element [b, t] of the two leading axes starts at this block.
    auto at = [&](int64_t b, int64_t t) { return static_cast<size_t>(time_axis_ == 0 ? t * batch + b : b * steps + t); };
    const auto* src = static_cast<const char*>(x.raw_data());
    auto* dst = static_cast<char*>(y.raw_data());
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t t = 0; t < steps; ++t) {
        const int64_t from = t < len[b] ? len[b] - 1 - t : t;
        std::memcpy(dst + at(b, t) * block, src + at(b, from) * block, block);
      }
    }
  }

 private:
  int64_t batch_axis_;
  int64_t time_axis_;
};

// ------------------------------------------------------------------ TensorScatter

class TensorScatter final : public Kernel {
 public:
  explicit TensorScatter(const KernelInit& init) : axis_(init.attr_int("axis", -2)) {
    const std::string mode = init.attr_string("mode", "linear");
    if (mode != "linear" && mode != "circular") {
      throw Error("TensorScatter attribute 'mode' must be \"linear\" or \"circular\", got \"" + mode + "\"");
    }
    circular_ = mode == "circular";
  }

  void run(KernelContext& ctx) override {
    const Tensor& past = ctx.input(0);
    const Tensor& update = ctx.input(1);
    const auto r = static_cast<int64_t>(past.rank());
    const auto axis = static_cast<size_t>(normalize_axis(axis_, r, "TensorScatter attribute 'axis'"));
    if (axis == 0) throw Error("TensorScatter attribute 'axis' must not be the batch axis 0 (got " + std::to_string(axis_) + ")");
    bool compatible = update.rank() == past.rank() && update.dtype() == past.dtype() && update.dim(axis) <= past.dim(axis);
    for (size_t d = 0; compatible && d < past.rank(); ++d) compatible = d == axis || update.dim(d) == past.dim(d);
    if (!compatible) {
      throw Error("input " + ctx.input_name(1) + " (update) " + update.description() + " must match input " +
                  ctx.input_name(0) + " (past_cache) " + past.description() + " except for at most as many rows along axis " +
                  std::to_string(axis));
    }
    const int64_t batch = past.dim(0), length = past.dim(axis), rows = update.dim(axis);
    std::vector<int64_t> where(static_cast<size_t>(batch), 0);
    if (ctx.has_input(2)) {
      const Tensor& w = ctx.input(2);
      if (w.dtype() != DataType::Int64 || w.rank() != 1 || w.dim(0) != batch) {
        throw Error("input " + ctx.input_name(2) + " (write_indices) must be int64 [" + std::to_string(batch) +
                    "], got " + w.description());
      }
      where = w.to_int64_vector("write_indices");
    }
    for (int64_t b = 0; b < batch && rows > 0; ++b) {
      int64_t& w = where[static_cast<size_t>(b)];
      if (circular_) {
        w = (w % length + length) % length;
      } else if (w < 0 || w > length - rows) {
        throw Error("input " + ctx.input_name(2) + " (write_indices) holds " + std::to_string(w) + " at batch " +
                    std::to_string(b) + ": " + std::to_string(rows) + " rows from there do not fit in the " +
                    std::to_string(length) + " of the cache (mode \"linear\")");
      }
    }
    Tensor& out = ctx.allocate_output(0, past.dtype(), past.shape());
    std::memcpy(out.raw_data(), past.raw_data(), past.nbytes());
    const int64_t prefix = past.shape().numel(0, axis), per_batch = past.shape().numel(1, axis);
    const size_t block = static_cast<size_t>(past.shape().numel(axis + 1, past.rank())) * dtype_size(past.dtype());
    const auto* src = static_cast<const char*>(update.raw_data());
    auto* dst = static_cast<char*>(out.raw_data());
    for (int64_t p = 0; p < prefix; ++p) {
      const int64_t w = where[static_cast<size_t>(p / per_batch)];
      for (int64_t s = 0; s < rows; ++s) {
        const int64_t row = circular_ ? (w + s) % length : w + s;
        std::memcpy(dst + static_cast<size_t>(p * length + row) * block, src + static_cast<size_t>(p * rows + s) * block, block);
      }
    }
  }

 private:
  int64_t axis_;
  bool circular_ = false;
};

}  // namespace

std::unique_ptr<Kernel> make_unique_op(const KernelInit& init) { return std::make_unique<Unique>(init); }
std::unique_ptr<Kernel> make_nonzero(const KernelInit& /*init*/) { return make_kernel(nonzero); }
std::unique_ptr<Kernel> make_compress(const KernelInit& init) { return std::make_unique<Compress>(init); }
std::unique_ptr<Kernel> make_reverse_sequence(const KernelInit& init) { return std::make_unique<ReverseSequence>(init); }
std::unique_ptr<Kernel> make_tensor_scatter(const KernelInit& init) { return std::make_unique<TensorScatter>(init); }

}  // namespace onnxtrain::ops
