// Reductions, arg-reductions, cumulative sums and top-k (ONNX operator docs, ai.onnx opsets
// 1-28):
//   ReduceSum (axes attribute in 1-12; optional int64 `axes` input and noop_with_empty_axes
//   from 13), ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceL1, ReduceL2,
//   ReduceSumSquare, ReduceLogSum, ReduceLogSumExp (axes attribute in 1-17, the `axes` input
//   and noop_with_empty_axes from 18; ReduceMax/ReduceMin take bool from 20, False < True;
//   ReduceLogSum/ReduceLogSumExp-28 drop the integer types, which the kernel table enforces);
//   ArgMax, ArgMin (select_last_index from 12); CumSum (11-17); TopK (k attribute in 1-9, K
//   input from 10, largest/sorted from 11, bfloat16 from 24). Negative axes are accepted from
//   opset 11 and rejected before.
// noop_with_empty_axes with no (or empty) axes reduces over the empty set of axes: every output
// is its one input value put through the reduction's other steps (ONNX op doc 'ReduceLogSum':
// "ReduceLogSum returns the Log of input tensor, and ReduceSumSquare returns the Square").
//
// Reductions collapse the input into runs of axes (size-1 dims dropped, neighbours that are
// both reduced or both kept merged). When the innermost run is reduced, every output is the
// reduction of contiguous rows; when it is kept, a block of contiguous outputs accumulates one
// input row after another. Either way the inner loop is unit-stride and vectorizes.
// Accumulation happens in compute_t<T> (float32 for float16/bfloat16/float32, float64 for
// float64) with pairwise summation: 16 interleaved lanes per block of up to 1024 values, and
// blocks (or groups of rows) combined as a binary tree. The rounding error of an n-term sum
// then grows like log(n), so float32 needs no float64 accumulator. Work is split by size only,
// never by the thread count, so results are the same on any number of threads.
// Integer sums, products and sums of squares wrap modulo 2^64 and are cast to the element type
// (numpy's result when they overflow); integer Mean, L2, LogSum and LogSumExp are computed in
// float64 and truncated toward zero, saturating (NaN, the mean of nothing, gives 0).
// Over an empty axis: sum/L1/L2/sum-square 0, prod 1, max -inf (lowest integer), min +inf
// (highest integer), mean NaN, log-sum and log-sum-exp -inf; bool max False, min True (the
// ONNX reference). ReduceMax/Min propagate NaN.
// ArgMax/ArgMin treat NaN as the extreme value (numpy's argmax/argmin) and reject an empty
// axis. TopK orders NaN above every number (PyTorch's topk), breaks ties by the lower index,
// and always returns sorted results (sorted=0 leaves the order to the implementation).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/factories.h"

namespace onnxtrain::ops {

namespace {

constexpr int kLanes = 16;         // independent accumulators in a contiguous row
constexpr int64_t kLeaf = 1024;    // values reduced by the lanes before pairing halves
constexpr int64_t kCols = 1024;    // columns ArgMax/CumSum tasks keep on the stack
constexpr int64_t kLeafRows = 32;  // rows accumulated in order before pairing halves
constexpr int64_t kMaxTasks = 64;  // tasks a reduction is cut into when outputs alone give fewer

std::string list_string(const std::vector<int64_t>& values) {
  std::string s = "[";
  for (size_t i = 0; i < values.size(); ++i) s += (i ? "," : "") + std::to_string(values[i]);
  return s + "]";
}

// Axis `axis` of an op input of rank `rank`, checked against the range and the opset (ONNX
// allows negative axes from opset 11).
int64_t resolve_axis(int64_t axis, int64_t rank, int opset, const std::string& what) {
  if (axis < 0 && opset < 11) {
    throw Error(what + " holds the negative axis " + std::to_string(axis) +
                ", which needs opset 11 or later (the model imports opset " + std::to_string(opset) + ")");
  }
  return normalize_axis(axis, rank, what);
}

template <class T>
bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::isnan(v);
  } else {
    return false;
  }
}

template <class T>
auto widen(T v) {
  if constexpr (is_half_v<T>) {
    return static_cast<float>(v);
  } else {
    return v;
  }
}

// ------------------------------------------------------------------ collapsed view

struct Dim {
  int64_t size, stride;
};

// The element offset of the `index`-th combination (row-major) of `dims`.
int64_t offset_of(int64_t index, const std::vector<Dim>& dims) {
  int64_t offset = 0;
  for (size_t d = dims.size(); d-- > 0;) {
    offset += index % dims[d].size * dims[d].stride;
    index /= dims[d].size;
  }
  return offset;
}

// How a reduction walks its input. Row mode (innermost run reduced): output o reduces `rows`
// contiguous rows of `inner` values. Column mode (innermost run kept): block b of `inner`
// contiguous outputs accumulates `rows` input rows of `inner` values.
struct ReducePlan {
  bool row_mode = false;
  int64_t inner = 1;
  int64_t outer = 1;         // row mode: outputs; column mode: blocks
  int64_t rows = 1;          // row combinations each output (block) reduces
  std::vector<Dim> kept;     // runs giving the output (block) offset
  std::vector<Dim> reduced;  // runs giving the row offset
};

ReducePlan make_plan(const Shape& shape, const std::vector<bool>& reduce) {
  struct Run {
    int64_t size;
    bool reduced;
  };
  std::vector<Run> runs;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!runs.empty() && runs.back().reduced == reduce[d]) {
      runs.back().size *= shape[d];
    } else {
      runs.push_back({shape[d], reduce[d]});
    }
  }
  ReducePlan p;
  if (runs.empty()) return p;
  p.row_mode = runs.back().reduced;
  p.inner = runs.back().size;
  runs.pop_back();
  int64_t stride = p.inner;
  for (size_t i = runs.size(); i-- > 0;) {
    auto& dims = runs[i].reduced ? p.reduced : p.kept;
    dims.insert(dims.begin(), Dim{runs[i].size, stride});
    (runs[i].reduced ? p.rows : p.outer) *= runs[i].size;
    stride *= runs[i].size;
  }
  return p;
}

// ------------------------------------------------------------------ reduction engine

// `#pragma omp simd` on the inner loops: GCC does not if-convert the NaN-aware selects of
// max/min on its own (it must assume comparisons trap), and the loops have no dependences.
//
// One reduction: init combined with map(x, shift) of every value; `combine` is associative
// and also merges partial results. With kShifted, map gets the output's shift value
// (log-sum-exp subtracts the maximum), otherwise A{}.
template <class T, class A, bool kShifted, class Map, class Combine>
struct Reducer {
  A init;
  Map map;
  Combine combine;

  // Pairwise reduction of the contiguous values x[0, n).
  A row(const T* x, int64_t n, A s) const {
    if (n > kLeaf) {
      // Left half first: reading memory forwards keeps the hardware prefetchers streaming.
      const int64_t half = n / 2;
      const A left = row(x, half, s);
      return combine(left, row(x + half, n - half, s));
    }
    A lane[kLanes];
    for (A& l : lane) l = init;
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
#pragma omp simd
      for (int j = 0; j < kLanes; ++j) lane[j] = combine(lane[j], map(x[i + j], s));
    }
    A tail = init;
    for (; i < n; ++i) tail = combine(tail, map(x[i], s));
    for (int w = kLanes / 2; w > 0; w /= 2) {
      for (int j = 0; j < w; ++j) lane[j] = combine(lane[j], lane[j + w]);
    }
    return combine(lane[0], tail);
  }

  // out[0, width) = the reduction of rows [q0, q1), where leaf(qa, qb, out) folds rows
  // [qa, qb) into out. Above kLeafRows rows the halves are reduced separately and combined
  // (pairwise); the right half goes to scratch, which holds width values per level.
  template <class Leaf>
  void tree(int64_t q0, int64_t q1, int64_t width, A* out, A* scratch, const Leaf& leaf) const {
    if (q1 - q0 <= kLeafRows) {
      std::fill(out, out + width, init);
      leaf(q0, q1, out);
      return;
    }
    const int64_t mid = q0 + (q1 - q0) / 2;
    tree(q0, mid, width, out, scratch, leaf);
    tree(mid, q1, width, scratch, scratch + width, leaf);
#pragma omp simd
    for (int64_t j = 0; j < width; ++j) out[j] = combine(out[j], scratch[j]);
  }
};

// Levels of scratch Reducer::tree needs for `rows` rows.
int64_t tree_depth(int64_t rows) {
  int64_t depth = 0;
  for (; rows > kLeafRows; rows = (rows + 1) / 2) ++depth;
  return depth;
}

// How reduce() cuts `blocks` blocks of `width` outputs over `rows` rows into tasks: each
// block's outputs into `chunks` ranges (at least min_width wide) and its rows into `parts`
// ranges, whose partial results are merged afterwards. Rows are cut first, so that a task
// reads whole rows. Depends on the sizes only, never on the thread count.
struct Split {
  int64_t chunks = 1, parts = 1;
};

Split split_work(int64_t blocks, int64_t width, int64_t rows, int64_t work, int64_t min_width) {
  Split s;
  const int64_t tasks = std::clamp<int64_t>(work / kParallelGrain, 1, kMaxTasks);
  if (blocks >= tasks) return s;
  const int64_t per_block = (tasks + blocks - 1) / blocks;
  s.parts = std::min(per_block, std::max<int64_t>(1, rows / kLeafRows));
  s.chunks = std::min((per_block + s.parts - 1) / s.parts, std::max<int64_t>(1, width / min_width));
  return s;
}

// Reduces x along `p` into one accumulator per output (`shift`: one value per output, used
// with kShifted). kChain: column loops may fold four rows per pass; off for max/min, whose
// chained NaN-aware selects GCC leaves scalar.
template <class T, class A, bool kShifted = false, bool kChain = true, class Map, class Combine>
std::vector<A> reduce(const T* x, int64_t numel, const ReducePlan& p, int64_t num_out, A init, Map map,
                      Combine combine, const A* shift = nullptr) {
  const Reducer<T, A, kShifted, Map, Combine> r{init, map, combine};
  std::vector<A> acc(static_cast<size_t>(num_out), init);
  if (numel == 0 || num_out == 0) return acc;
  auto shift_at = [&](int64_t o) { return kShifted ? shift[o] : A{}; };
  // Partial results of `parts` row ranges, merged into acc in order.
  auto merge = [&](const std::vector<A>& partial, int64_t parts) {
    parallel_for(num_out, kParallelGrain, [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) {
        A v = partial[static_cast<size_t>(o)];
        for (int64_t k = 1; k < parts; ++k) v = combine(v, partial[static_cast<size_t>(k * num_out + o)]);
        acc[static_cast<size_t>(o)] = v;
      }
    });
  };

  if (p.row_mode && p.rows == 1) {
    // Each output reduces one contiguous row; a few long rows are cut into parts.
    const int64_t n = p.inner;
    const int64_t parts =
        std::min(n, std::clamp<int64_t>(n / kParallelGrain, 1, std::max<int64_t>(1, kMaxTasks / num_out)));
    std::vector<A> partial(static_cast<size_t>(parts > 1 ? parts * num_out : 0));
    parallel_for(num_out * parts, std::max<int64_t>(1, kParallelGrain * parts / n),
                 [&](int64_t b, int64_t e) {
                   for (int64_t u = b; u < e; ++u) {
                     const int64_t o = u % num_out, k = u / num_out;
                     const int64_t l0 = n * k / parts, l1 = n * (k + 1) / parts;
                     const A v = r.row(x + offset_of(o, p.kept) + l0, l1 - l0, shift_at(o));
                     (parts > 1 ? partial[static_cast<size_t>(u)] : acc[static_cast<size_t>(o)]) = v;
                   }
                 });
    if (parts > 1) merge(partial, parts);
    return acc;
  }

  // Row mode: one block of all outputs, each row value the reduction of a contiguous row.
  // Column mode: block b holds outputs [b * inner, (b + 1) * inner), read as contiguous rows.
  const int64_t blocks = p.row_mode ? 1 : p.outer;
  const int64_t width = p.row_mode ? p.outer : p.inner;
  const Split s = split_work(blocks, width, p.rows, numel, p.row_mode ? 1 : 64);
  const int64_t tasks = blocks * s.chunks * s.parts;
  const int64_t scratch_size =
      (width + s.chunks - 1) / s.chunks * tree_depth((p.rows + s.parts - 1) / s.parts);
  std::vector<A> partial(static_cast<size_t>(s.parts > 1 ? s.parts * num_out : 0));
  std::atomic<bool> out_of_memory = false;
  parallel_for(tasks, std::max<int64_t>(1, kParallelGrain * tasks / numel), [&](int64_t b, int64_t e) {
    std::unique_ptr<A[]> scratch(scratch_size > 0 ? new (std::nothrow) A[static_cast<size_t>(scratch_size)]
                                                  : nullptr);
    if (scratch_size > 0 && !scratch) {
      out_of_memory = true;
      return;
    }
    for (int64_t u = b; u < e; ++u) {
      const int64_t k = u % s.parts, c = u / s.parts % s.chunks, blk = u / s.parts / s.chunks;
      const int64_t j0 = width * c / s.chunks, j1 = width * (c + 1) / s.chunks;
      const int64_t q0 = p.rows * k / s.parts, q1 = p.rows * (k + 1) / s.parts;
      A* out = (s.parts > 1 ? partial.data() + k * num_out : acc.data()) + blk * width + j0;
      if (p.row_mode) {
        r.tree(q0, q1, j1 - j0, out, scratch.get(), [&](int64_t qa, int64_t qb, A* dst) {
          for (int64_t q = qa; q < qb; ++q) {
            const T* rows = x + offset_of(q, p.reduced);
            for (int64_t o = j0; o < j1; ++o) {
              dst[o - j0] = combine(dst[o - j0], r.row(rows + offset_of(o, p.kept), p.inner, shift_at(o)));
            }
          }
        });
      } else {
        const T* base = x + offset_of(blk, p.kept) + j0;
        const A* sh = kShifted ? shift + blk * width + j0 : nullptr;
        const int64_t w = j1 - j0;
        auto shift_of = [&](int64_t j) {
          if constexpr (kShifted) {
            return sh[j];
          } else {
            return A{};
          }
        };
        r.tree(q0, q1, w, out, scratch.get(), [&](int64_t qa, int64_t qb, A* dst) {
          // Four rows at a time: a quarter of the accumulator loads and stores.
          int64_t q = qa;
          for (; kChain && q + 4 <= qb; q += 4) {
            const T* r0 = base + offset_of(q, p.reduced);
            const T* r1 = base + offset_of(q + 1, p.reduced);
            const T* r2 = base + offset_of(q + 2, p.reduced);
            const T* r3 = base + offset_of(q + 3, p.reduced);
#pragma omp simd
            for (int64_t j = 0; j < w; ++j) {
              const A sj = shift_of(j);
              const A v = combine(combine(dst[j], map(r0[j], sj)), map(r1[j], sj));
              dst[j] = combine(combine(v, map(r2[j], sj)), map(r3[j], sj));
            }
          }
          for (; q < qb; ++q) {
            const T* row = base + offset_of(q, p.reduced);
#pragma omp simd
            for (int64_t j = 0; j < w; ++j) dst[j] = combine(dst[j], map(row[j], shift_of(j)));
          }
        });
      }
    }
  });
  if (out_of_memory) throw Error("out of memory for the partial sums of a reduction");
  if (s.parts > 1) merge(partial, s.parts);
  return acc;
}

// y[o] = f(acc[o], o).
template <class T, class A, class F>
void finish(const std::vector<A>& acc, T* y, F f) {
  parallel_for(static_cast<int64_t>(acc.size()), kParallelGrain, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) y[o] = f(acc[static_cast<size_t>(o)], o);
  });
}

enum class Kind { Sum, Mean, Max, Min, Prod, L1, L2, SumSquare, LogSum, LogSumExp };

Kind kind_of(const std::string& op) {
  if (op == "ReduceSum") return Kind::Sum;
  if (op == "ReduceMean") return Kind::Mean;
  if (op == "ReduceMax") return Kind::Max;
  if (op == "ReduceMin") return Kind::Min;
  if (op == "ReduceProd") return Kind::Prod;
  if (op == "ReduceL1") return Kind::L1;
  if (op == "ReduceL2") return Kind::L2;
  if (op == "ReduceSumSquare") return Kind::SumSquare;
  if (op == "ReduceLogSum") return Kind::LogSum;
  if (op == "ReduceLogSumExp") return Kind::LogSumExp;
  throw Error("make_reduce does not implement " + op);
}

// Reduces x (count values behind each output) into y.
template <class T>
void reduce_typed(Kind kind, const Tensor& x, const ReducePlan& p, int64_t count, Tensor& y) {
  constexpr bool kFloat = is_float_v<T>;
  using Wide = std::conditional_t<kFloat, compute_t<T>, uint64_t>;  // sums and products
  using Real = std::conditional_t<kFloat, compute_t<T>, double>;    // roots, logs, means
  using C = compute_t<T>;                                           // max and min
  const T* xs = x.data<T>();
  T* ys = y.data<T>();
  const int64_t n = x.numel(), m = y.numel();
  // A wrapped integer sum as the number it stands for (signed types wrap to negatives).
  auto real = [](Wide a) {
    if constexpr (kFloat || std::is_unsigned_v<T>) {
      return static_cast<Real>(a);
    } else {
      return static_cast<Real>(static_cast<int64_t>(a));
    }
  };
  auto to_elem = [](Wide a, int64_t) {
    if constexpr (kFloat) {
      return convert<T>(a);
    } else {
      return static_cast<T>(a);
    }
  };
  auto add = [](auto a, decltype(a) b) { return a + b; };
  auto value = [](T v, Wide) { return static_cast<Wide>(widen(v)); };
  auto square = [](T v, Wide) {
    const auto w = static_cast<Wide>(widen(v));
    return w * w;
  };
  // NaN-propagating; `|` rather than `||` keeps the select branch-free, so it vectorizes.
  auto max = [](C a, C b) { return ((a >= b) | is_nan(a)) ? a : b; };
  auto min = [](C a, C b) { return ((a <= b) | is_nan(a)) ? a : b; };
  auto as_c = [](T v, C) { return static_cast<C>(widen(v)); };
  constexpr C kLow = std::numeric_limits<C>::has_infinity ? -std::numeric_limits<C>::infinity()
                                                          : std::numeric_limits<C>::lowest();
  constexpr C kHigh = std::numeric_limits<C>::has_infinity ? std::numeric_limits<C>::infinity()
                                                           : std::numeric_limits<C>::max();
  switch (kind) {
    case Kind::Sum:
      return finish(reduce(xs, n, p, m, Wide(0), value, add), ys, to_elem);
    case Kind::SumSquare:
      return finish(reduce(xs, n, p, m, Wide(0), square, add), ys, to_elem);
    case Kind::Prod:
      return finish(reduce(xs, n, p, m, Wide(1), value, [](Wide a, Wide b) { return a * b; }), ys, to_elem);
    case Kind::L1: {
      auto abs = [](T v, Wide) {
        if constexpr (kFloat) {
          return std::abs(static_cast<Wide>(widen(v)));
        } else if constexpr (std::is_signed_v<T>) {
          return v < 0 ? Wide(0) - static_cast<Wide>(v) : static_cast<Wide>(v);
        } else {
          return static_cast<Wide>(v);
        }
      };
      return finish(reduce(xs, n, p, m, Wide(0), abs, add), ys, to_elem);
    }
    case Kind::Mean:
      return finish(reduce(xs, n, p, m, Wide(0), value, add), ys,
                    [&](Wide a, int64_t) { return convert<T>(real(a) / static_cast<Real>(count)); });
    case Kind::LogSum:
      return finish(reduce(xs, n, p, m, Wide(0), value, add), ys,
                    [&](Wide a, int64_t) { return convert<T>(std::log(real(a))); });
    case Kind::L2:
      return finish(reduce(xs, n, p, m, Wide(0), square, add), ys,
                    [](Wide a, int64_t) { return convert<T>(std::sqrt(static_cast<Real>(a))); });
    case Kind::Max:
      return finish(reduce<T, C, false, false>(xs, n, p, m, kLow, as_c, max), ys,
                    [](C a, int64_t) { return convert<T>(a); });
    case Kind::Min:
      return finish(reduce<T, C, false, false>(xs, n, p, m, kHigh, as_c, min), ys,
                    [](C a, int64_t) { return convert<T>(a); });
    case Kind::LogSumExp: {
      // log(sum(exp(x))) = s + log(sum(exp(x - s))) with s the maximum (0 when not finite).
      constexpr Real kInf = std::numeric_limits<Real>::infinity();
      auto as_real = [](T v, Real) { return static_cast<Real>(widen(v)); };
      std::vector<Real> shift = reduce<T, Real, false, false>(
          xs, n, p, m, -kInf, as_real, [](Real a, Real b) { return ((a >= b) | is_nan(a)) ? a : b; });
      for (Real& s : shift) s = std::isfinite(s) ? s : Real(0);
      auto shifted_exp = [](T v, Real s) { return std::exp(static_cast<Real>(widen(v)) - s); };
      const std::vector<Real> sums =
          reduce<T, Real, true>(xs, n, p, m, Real(0), shifted_exp, add, shift.data());
      return finish(sums, ys, [&](Real a, int64_t o) {
        return convert<T>(std::log(a) + shift[static_cast<size_t>(o)]);
      });
    }
  }
}

// ReduceMax/ReduceMin of bool (opset 20): any/all, with False < True.
void reduce_bool(Kind kind, const Tensor& x, const ReducePlan& p, Tensor& y) {
  const bool max = kind == Kind::Max;
  auto as_byte = [](bool v, uint8_t) { return static_cast<uint8_t>(v); };
  auto pick = [max](uint8_t a, uint8_t b) { return max ? std::max(a, b) : std::min(a, b); };
  const std::vector<uint8_t> acc =
      reduce<bool, uint8_t, false, false>(x.data<bool>(), x.numel(), p, y.numel(), static_cast<uint8_t>(max ? 0 : 1), as_byte, pick);
  finish(acc, y.data<bool>(), [](uint8_t a, int64_t) { return a != 0; });
}

class Reduce final : public Kernel {
 public:
  explicit Reduce(const KernelInit& init)
      : op_(init.op_type()),
        kind_(kind_of(op_)),
        opset_(init.opset()),
        keepdims_(init.attr_int("keepdims", 1) != 0) {
    // ReduceSum takes its axes as an input from opset 13, the other reductions from 18.
    axes_input_ = opset_ >= (kind_ == Kind::Sum ? 13 : 18);
    if (axes_input_) {
      noop_with_empty_axes_ = init.attr_int("noop_with_empty_axes", 0) != 0;
      if (init.has_attr("axes")) {
        throw Error(op_ + " (opset " + std::to_string(opset_) +
                    ") takes axes as its second input, not as an attribute");
      }
    } else {
      if (init.has_attr("noop_with_empty_axes")) {
        throw Error(op_ + " attribute 'noop_with_empty_axes' needs opset " + (kind_ == Kind::Sum ? "13" : "18") +
                    " or later (the model imports opset " + std::to_string(opset_) + ")");
      }
      axes_ = init.attr_ints("axes");
    }
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const auto rank = static_cast<int64_t>(x.rank());
    std::vector<int64_t> axes = axes_;
    std::string what = op_ + " attribute 'axes'";
    if (axes_input_ && ctx.has_input(1)) {
      const Tensor& a = ctx.input(1);
      what = "input " + ctx.input_name(1) + " (axes)";
      if (a.dtype() != DataType::Int64 || a.rank() > 1) {
        throw Error(what + " must be a 1-D int64 tensor, got " + a.description());
      }
      axes = a.to_int64_vector(what);
    }
    const bool none = axes.empty() && noop_with_empty_axes_;  // reduce over the empty set of axes
    if (none && (kind_ == Kind::Sum || kind_ == Kind::Mean || kind_ == Kind::Max || kind_ == Kind::Min ||
                 kind_ == Kind::Prod)) {
      ctx.set_output(0, x);  // the reduction of one value is that value
      return;
    }
    std::vector<bool> reduce(static_cast<size_t>(rank), axes.empty() && !none);
    for (int64_t axis : axes) {
      const auto d = static_cast<size_t>(resolve_axis(axis, rank, opset_, what));
      if (reduce[d])
        throw Error(what + " " + list_string(axes) + " names axis " + std::to_string(d) + " twice");
      reduce[d] = true;
    }
    Shape out_shape;
    int64_t count = 1;  // values reduced into each output
    for (size_t d = 0; d < x.rank(); ++d) {
      if (!reduce[d]) {
        out_shape.push_back(x.dim(d));
      } else {
        count *= x.dim(d);
        if (keepdims_) out_shape.push_back(1);
      }
    }
    const std::string what_x = op_ + " input " + ctx.input_name(0);
    if (x.dtype() == DataType::Bool && kind_ != Kind::Max && kind_ != Kind::Min) {
      throw_unsupported_dtype(x.dtype(), what_x);
    }
    Tensor& y = ctx.allocate_output(0, x.dtype(), out_shape);
    const ReducePlan plan = make_plan(x.shape(), reduce);
    if (x.dtype() == DataType::Bool) return reduce_bool(kind_, x, plan, y);
    visit_dtype<NumericTypes>(x.dtype(), what_x, [&]<class T>() { reduce_typed<T>(kind_, x, plan, count, y); });
  }

 private:
  std::string op_;
  Kind kind_;
  int opset_;
  bool keepdims_;
  bool axes_input_ = false;
  bool noop_with_empty_axes_ = false;
  std::vector<int64_t> axes_;
};

// ------------------------------------------------------------------ ArgMax, ArgMin

// Whether v replaces best: strictly better, or equal with select_last_index; NaN beats every
// number (numpy). Bitwise operators keep it branch-free so the column loop vectorizes.
template <bool kMax, bool kLast, class C>
bool better(C v, C best) {
  const bool wins = kMax ? (kLast ? v >= best : v > best) : (kLast ? v <= best : v < best);
  const bool v_nan = is_nan(v), best_nan = is_nan(best);  // evaluated both, for `|` and `&`
  if constexpr (kLast) {
    return wins | v_nan;
  } else {
    return wins | (v_nan & !best_nan);
  }
}

template <class T, bool kMax, bool kLast, class Index>
void arg_columns(const T* x, int64_t outer, int64_t n, int64_t inner, int64_t* out) {
  using C = compute_t<T>;
  const int64_t chunks = (inner + kCols - 1) / kCols;
  const int64_t work = n * std::min(inner, kCols);
  parallel_for(outer * chunks, std::max<int64_t>(1, kParallelGrain / work), [&](int64_t b, int64_t e) {
    C best[kCols];
    Index index[kCols];
    for (int64_t u = b; u < e; ++u) {
      const int64_t o = u / chunks, j0 = u % chunks * kCols, width = std::min(kCols, inner - j0);
      const T* base = x + o * n * inner + j0;
      for (int64_t j = 0; j < width; ++j) {
        best[j] = static_cast<C>(widen(base[j]));
        index[j] = 0;
      }
      for (int64_t i = 1; i < n; ++i) {
        const T* row = base + i * inner;
        const auto ii = static_cast<Index>(i);
#pragma omp simd
        for (int64_t j = 0; j < width; ++j) {
          const auto v = static_cast<C>(widen(row[j]));
          const bool replace = better<kMax, kLast>(v, best[j]);
          best[j] = replace ? v : best[j];
          index[j] = replace ? ii : index[j];
        }
      }
      std::copy(index, index + width, out + o * inner + j0);
    }
  });
}

// out[o * inner + j] = arg-extreme of x[(o * n + i) * inner + j] over i (n >= 1).
template <class T, bool kMax, bool kLast>
void arg_reduce(const T* x, int64_t outer, int64_t n, int64_t inner, int64_t* out) {
  using C = compute_t<T>;
  if (inner == 1) {
    // Contiguous rows, in blocks: each block's extreme value by a vectorized reduction; the
    // block that wins (first or last, by the same rule as single values) holds the answer.
    constexpr int64_t kBlock = 512;
    auto as_c = [](T v, C) { return static_cast<C>(widen(v)); };
    auto pick = [](C a, C b) { return ((kMax ? a >= b : a <= b) | is_nan(a)) ? a : b; };
    const C init = kMax ? (std::numeric_limits<C>::has_infinity ? -std::numeric_limits<C>::infinity()
                                                                : std::numeric_limits<C>::lowest())
                        : (std::numeric_limits<C>::has_infinity ? std::numeric_limits<C>::infinity()
                                                                : std::numeric_limits<C>::max());
    const Reducer<T, C, false, decltype(as_c), decltype(pick)> r{init, as_c, pick};
    parallel_for(outer, std::max<int64_t>(1, kParallelGrain / n), [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) {
        const T* row = x + o * n;
        C best = static_cast<C>(widen(row[0]));
        int64_t best_block = 0;
        for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
          const C v = r.row(row + b0, std::min(kBlock, n - b0), C{});
          if (b0 == 0 || better<kMax, kLast>(v, best)) {
            best = v;
            best_block = b0;
          }
        }
        auto hit = [&](int64_t i) {
          const C v = static_cast<C>(widen(row[i]));
          return is_nan(best) ? is_nan(v) : v == best;
        };
        int64_t i = kLast ? std::min(n, best_block + kBlock) - 1 : best_block;
        while (!hit(i)) i += kLast ? -1 : 1;
        out[o] = i;
      }
    });
    return;
  }
  // Column blocks: running best values and indices, kCols wide. The indices are int32 where
  // they fit (SSE2 has no 64-bit selects, so int64 indices keep the loop scalar).
  if (n <= std::numeric_limits<int32_t>::max()) {
    arg_columns<T, kMax, kLast, int32_t>(x, outer, n, inner, out);
  } else {
    arg_columns<T, kMax, kLast, int64_t>(x, outer, n, inner, out);
  }
}

class ArgReduce final : public Kernel {
 public:
  explicit ArgReduce(const KernelInit& init)
      : op_(init.op_type()),
        max_(op_ == "ArgMax"),
        opset_(init.opset()),
        axis_(init.attr_int("axis", 0)),
        keepdims_(init.attr_int("keepdims", 1) != 0) {
    if (init.has_attr("select_last_index") && opset_ < 12) {
      throw Error(op_ + " attribute 'select_last_index' needs opset 12 or later (the model imports opset " +
                  std::to_string(opset_) + ")");
    }
    last_ = init.attr_int("select_last_index", 0) != 0;
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const auto axis = static_cast<size_t>(
        resolve_axis(axis_, static_cast<int64_t>(x.rank()), opset_, op_ + " attribute 'axis'"));
    const int64_t outer = x.shape().numel(0, axis), n = x.dim(axis),
                  inner = x.shape().numel(axis + 1, x.rank());
    Shape out_shape = x.shape();
    if (keepdims_) {
      out_shape[axis] = 1;
    } else {
      out_shape.erase(axis);
    }
    if (n == 0 && outer * inner > 0) {
      throw Error(op_ + " over axis " + std::to_string(axis) + " of input " + ctx.input_name(0) + " " +
                  x.description() + ": the axis is empty");
    }
    Tensor& y = ctx.allocate_output(0, DataType::Int64, out_shape);
    if (y.numel() == 0) return;
    visit_dtype<NumericTypes>(x.dtype(), op_ + " input " + ctx.input_name(0), [&]<class T>() {
      const T* xs = x.data<T>();
      int64_t* ys = y.data<int64_t>();
      if (max_) {
        last_ ? arg_reduce<T, true, true>(xs, outer, n, inner, ys)
              : arg_reduce<T, true, false>(xs, outer, n, inner, ys);
      } else {
        last_ ? arg_reduce<T, false, true>(xs, outer, n, inner, ys)
              : arg_reduce<T, false, false>(xs, outer, n, inner, ys);
      }
    });
  }

 private:
  std::string op_;
  bool max_;
  int opset_;
  int64_t axis_;
  bool keepdims_;
  bool last_ = false;
};

// ------------------------------------------------------------------ CumSum

// The single value of an axis/k input: a 0-D or one-element 1-D integer tensor.
int64_t scalar_input(const KernelContext& ctx, int i, const std::string& role, bool int32_ok) {
  const Tensor& t = ctx.input(i);
  const bool dtype_ok = t.dtype() == DataType::Int64 || (int32_ok && t.dtype() == DataType::Int32);
  if (!dtype_ok || t.rank() > 1 || t.numel() != 1) {
    throw Error("input " + ctx.input_name(i) + " (" + role + ") must be a 0-D or one-element 1-D " +
                (int32_ok ? "int32/int64" : "int64") + " tensor, got " + t.description());
  }
  return t.to_int64_vector(role)[0];
}

class CumSum final : public Kernel {
 public:
  explicit CumSum(const KernelInit& init)
      : exclusive_(init.attr_int("exclusive", 0) != 0), reverse_(init.attr_int("reverse", 0) != 0) {}

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const int64_t raw = scalar_input(ctx, 1, "axis", true);
    const auto axis = static_cast<size_t>(
        normalize_axis(raw, static_cast<int64_t>(x.rank()), "CumSum input " + ctx.input_name(1) + " (axis)"));
    const int64_t outer = x.shape().numel(0, axis), n = x.dim(axis),
                  inner = x.shape().numel(axis + 1, x.rank());
    Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
    if (y.numel() == 0) return;
    visit_dtype<NumericTypes>(x.dtype(), "CumSum input " + ctx.input_name(0), [&]<class T>() {
      // Integers accumulate modulo 2^64 and wrap to T, floats in compute_t<T>.
      using A = std::conditional_t<is_float_v<T>, compute_t<T>, uint64_t>;
      const T* xs = x.data<T>();
      T* ys = y.data<T>();
      if (inner == 1) {
        // Contiguous rows: one running sum each, walked forwards or backwards.
        const int64_t step = reverse_ ? -1 : 1;
        parallel_for(outer, std::max<int64_t>(1, kParallelGrain / n), [&](int64_t b, int64_t e) {
          for (int64_t o = b; o < e; ++o) {
            const int64_t first = o * n + (reverse_ ? n - 1 : 0);
            const T* xr = xs + first;
            T* yr = ys + first;
            A acc = 0;
            for (int64_t k = 0; k < n; ++k, xr += step, yr += step) {
              const A before = acc;
              acc += static_cast<A>(widen(*xr));
              *yr = static_cast<T>(exclusive_ ? before : acc);
            }
          }
        });
        return;
      }
      const int64_t chunks = (inner + kCols - 1) / kCols;
      const int64_t work = n * std::min(inner, kCols);
      parallel_for(outer * chunks, std::max<int64_t>(1, kParallelGrain / work), [&](int64_t b, int64_t e) {
        A acc[kCols];
        for (int64_t u = b; u < e; ++u) {
          const int64_t o = u / chunks, j0 = u % chunks * kCols, width = std::min(kCols, inner - j0);
          std::fill(acc, acc + width, A(0));
          for (int64_t k = 0; k < n; ++k) {
            const int64_t offset = (o * n + (reverse_ ? n - 1 - k : k)) * inner + j0;
            const T* xr = xs + offset;
            T* yr = ys + offset;
            for (int64_t j = 0; j < width; ++j) {
              const A before = acc[j];
              acc[j] += static_cast<A>(widen(xr[j]));
              yr[j] = static_cast<T>(exclusive_ ? before : acc[j]);
            }
          }
        }
      });
    });
  }

 private:
  bool exclusive_, reverse_;
};

// ------------------------------------------------------------------ TopK

class TopK final : public Kernel {
 public:
  explicit TopK(const KernelInit& init) : opset_(init.opset()), axis_(init.attr_int("axis", -1)) {
    if (opset_ < 10) {
      k_ = init.required_int("k");
      if (k_ < 0) throw Error("TopK attribute 'k' is " + std::to_string(k_) + ", expected >= 0");
    }
    if (opset_ < 11 && (init.has_attr("largest") || init.has_attr("sorted"))) {
      throw Error("TopK attributes 'largest' and 'sorted' need opset 11 or later (the model imports opset " +
                  std::to_string(opset_) + ")");
    }
    largest_ = init.attr_int("largest", 1) != 0;
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    // TopK-1 already defaults axis to -1, so negative axes are valid in every opset.
    const auto axis =
        static_cast<size_t>(normalize_axis(axis_, static_cast<int64_t>(x.rank()), "TopK attribute 'axis'"));
    const int64_t n = x.dim(axis);
    int64_t k = k_;
    std::string k_what = "TopK attribute 'k'";
    if (opset_ >= 10) {
      k = scalar_input(ctx, 1, "K", false);
      k_what = "TopK input " + ctx.input_name(1) + " (K)";
    }
    if (k < 0 || k > n) {
      throw Error(k_what + " is " + std::to_string(k) + ", expected 0 <= K <= " + std::to_string(n) +
                  " (dim " + std::to_string(axis) + " of input " + ctx.input_name(0) + " " + x.description() +
                  ")");
    }
    Shape out_shape = x.shape();
    out_shape[axis] = k;
    Tensor& values = ctx.allocate_output(0, x.dtype(), out_shape);
    Tensor& indices = ctx.allocate_output(1, DataType::Int64, out_shape);
    if (values.numel() == 0) return;
    const int64_t outer = x.shape().numel(0, axis), inner = x.shape().numel(axis + 1, x.rank());
    visit_dtype<NumericTypes>(x.dtype(), "TopK input " + ctx.input_name(0), [&]<class T>() {
      largest_ ? top_k<T, true>(x.data<T>(), outer, n, inner, k, values.data<T>(), indices.data<int64_t>())
               : top_k<T, false>(x.data<T>(), outer, n, inner, k, values.data<T>(), indices.data<int64_t>());
    });
  }

 private:
  // For each of the outer * inner slices along the axis: its k first values in the order
  // "greater first" (kLargest) or "smaller first", NaN counting as the greatest, ties by index.
  template <class T, bool kLargest>
  static void top_k(const T* x, int64_t outer, int64_t n, int64_t inner, int64_t k, T* values,
                    int64_t* indices) {
    using C = compute_t<T>;
    struct Item {
      C v;
      int64_t i;
    };
    // above(p, q): p comes first. NaN counts as the greatest value, so it leads with largest=1
    // and trails with largest=0.
    auto above = [](C p, C q) {
      if constexpr (kLargest) {
        return (is_nan(p) && !is_nan(q)) || p > q;
      } else {
        return (!is_nan(p) && is_nan(q)) || p < q;
      }
    };
    auto before = [&](const Item& a, const Item& b) {
      return above(a.v, b.v) || (!above(b.v, a.v) && a.i < b.i);
    };
    const int64_t slices = outer * inner;
    const int64_t tasks =
        std::clamp<int64_t>(slices * n / kParallelGrain, 1, std::min<int64_t>(slices, kMaxTasks));
    std::vector<std::vector<Item>> scratch(static_cast<size_t>(tasks),
                                           std::vector<Item>(static_cast<size_t>(n)));
    parallel_for(tasks, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        std::vector<Item>& items = scratch[static_cast<size_t>(t)];
        for (int64_t s = slices * t / tasks; s < slices * (t + 1) / tasks; ++s) {
          const int64_t o = s / inner, j = s % inner;
          const T* src = x + o * n * inner + j;
          for (int64_t i = 0; i < n; ++i)
            items[static_cast<size_t>(i)] = {static_cast<C>(widen(src[i * inner])), i};
          if (k < n) std::nth_element(items.begin(), items.begin() + k, items.end(), before);
          std::sort(items.begin(), items.begin() + k, before);
          T* vd = values + o * k * inner + j;
          int64_t* id = indices + o * k * inner + j;
          for (int64_t r = 0; r < k; ++r) {
            vd[r * inner] = convert<T>(items[static_cast<size_t>(r)].v);
            id[r * inner] = items[static_cast<size_t>(r)].i;
          }
        }
      }
    });
  }

  int opset_;
  int64_t axis_;
  int64_t k_ = 0;
  bool largest_ = true;
};

}  // namespace

std::unique_ptr<Kernel> make_reduce(const KernelInit& init) { return std::make_unique<Reduce>(init); }

std::unique_ptr<Kernel> make_arg_reduce(const KernelInit& init) { return std::make_unique<ArgReduce>(init); }

std::unique_ptr<Kernel> make_cumsum(const KernelInit& init) { return std::make_unique<CumSum>(init); }

std::unique_ptr<Kernel> make_topk(const KernelInit& init) { return std::make_unique<TopK>(init); }

}  // namespace onnxtrain::ops
