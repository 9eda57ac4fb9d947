// Indexing ops (ONNX operator docs, ai.onnx opsets 1-28): Slice, Gather, GatherElements,
// GatherND, ScatterElements (and the deprecated Scatter, its opset 9-10 name), ScatterND
// (reduction none/add/mul from 16, min/max from 18), OneHot (bfloat16 values from 28), Trilu.
//
// Every index is validated before any element moves, so bad indices are an Error naming the
// value and its position, never an out-of-bounds access. Gathers copy whole rows where they
// can; scatters apply updates in index order (later duplicates win, as the reference does).
#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/dispatch.h"
#include "ops/data_movement.h"
#include "ops/factories.h"

namespace onnxtrain::ops {

namespace {

std::string list_string(std::span<const int64_t> values) {
  std::string s = "[";
  for (size_t i = 0; i < values.size(); ++i) s += (i ? "," : "") + std::to_string(values[i]);
  return s + "]";
}

// The elements of an int32/int64 index tensor as int64 (Tind of Gather, Slice, ...).
std::vector<int64_t> index_values(const Tensor& t, const std::string& what) {
  if (t.dtype() != DataType::Int32 && t.dtype() != DataType::Int64) {
    throw Error(what + " must be int32 or int64, got " + t.description());
  }
  return t.to_int64_vector(what);
}

// Resolves index `i` (position `pos` of `what`) into [0, n): ONNX indices lie in [-n, n-1],
// negative ones counting from the end.
int64_t resolve_index(int64_t i, int64_t n, size_t pos, const std::string& what) {
  if (i < -n || i >= n) {
    throw Error(what + " holds index " + std::to_string(i) + " (at element " + std::to_string(pos) +
                ") out of range for a dim of size " + std::to_string(n) + " (expected [" +
                std::to_string(-n) + ", " + std::to_string(n - 1) + "])");
  }
  return i < 0 ? i + n : i;
}

int64_t op_axis(int64_t axis, int64_t rank, const std::string& what) {
  return normalize_axis(axis, rank, what);
}

// --- Slice (docs of Slice-1 and Slice-13). Per sliced axis: negative starts/ends get the dim
// added; then for step > 0 start and end are clamped to [0, dim], for step < 0 start to
// [0, dim-1] and end to [-1, dim-1]. The output is a strided view of the input. ---
struct SliceParams {
  std::vector<int64_t> starts, ends, axes, steps;
  std::string what;  // names the source of starts/ends in messages
};

// The part of a tensor of `shape` that Slice takes: its shape, the element strides of `shape`'s
// contiguous layout along it (0 along dims of size <= 1) and the offset of its first element.
// input() names the sliced tensor in messages (called only for one).
struct SliceView {
  Shape shape;
  std::vector<int64_t> strides;
  int64_t offset = 0;
};

template <class Describe>
SliceView resolve_slice(const Shape& shape, const SliceParams& p, Describe input) {
  const auto rank = static_cast<int64_t>(shape.size());
  const size_t n = p.starts.size();
  if (p.ends.size() != n || (!p.axes.empty() && p.axes.size() != n) ||
      (!p.steps.empty() && p.steps.size() != n)) {
    throw Error(p.what + ": starts " + list_string(p.starts) + ", ends " + list_string(p.ends) + ", axes " +
                list_string(p.axes) + " and steps " + list_string(p.steps) + " differ in length");
  }
  if (static_cast<int64_t>(n) > rank && p.axes.empty()) {
    throw Error(p.what + ": " + std::to_string(n) + " starts for " + input());
  }
  const Shape in_strides = contiguous_strides(shape);
  SliceView v{shape, in_strides.to_vector(), 0};
  std::vector<bool> seen(static_cast<size_t>(rank), false);
  for (size_t i = 0; i < n; ++i) {
    const int64_t raw_axis = p.axes.empty() ? static_cast<int64_t>(i) : p.axes[i];
    const auto axis = static_cast<size_t>(op_axis(raw_axis, rank, p.what + " axes"));
    if (seen[axis])
      throw Error(p.what + ": axes " + list_string(p.axes) + " name axis " + std::to_string(axis) + " twice");
    seen[axis] = true;
    int64_t step = p.steps.empty() ? 1 : p.steps[i];
    if (step == 0) throw Error(p.what + ": steps " + list_string(p.steps) + " has a 0 step");
    step = std::max(step, -std::numeric_limits<int64_t>::max());
    const int64_t dim = shape[axis];
    int64_t start = p.starts[i] < 0 ? p.starts[i] + dim : p.starts[i];
    int64_t end = p.ends[i] < 0 ? p.ends[i] + dim : p.ends[i];
    int64_t size = 0;
    if (step > 0) {
      start = std::clamp<int64_t>(start, 0, dim);
      end = std::clamp<int64_t>(end, 0, dim);
      if (end > start) size = 1 + (end - start - 1) / step;
    } else if (dim > 0) {
      start = std::clamp<int64_t>(start, 0, dim - 1);
      end = std::clamp<int64_t>(end, -1, dim - 1);
      if (start > end) size = 1 + (start - end - 1) / -step;
    }
    v.shape[axis] = size;
    if (size > 0) v.offset += start * in_strides[axis];
    v.strides[axis] = size > 1 ? in_strides[axis] * step : 0;
  }
  return v;
}

void slice_copy(KernelContext& ctx, const SliceParams& p) {
  const Tensor& x = ctx.input(0);
  const SliceView v = resolve_slice(x.shape(), p, [&] { return "input " + ctx.input_name(0) + " " + x.description(); });
  Tensor& y = ctx.allocate_output(0, x.dtype(), v.shape);
  if (y.numel() == 0) return;
  const size_t elem = dtype_size(x.dtype());
  copy_strided(static_cast<const char*>(x.raw_data()) + v.offset * static_cast<int64_t>(elem), y.raw_data(),
               elem, v.shape, v.strides);
}

// Slice's inputs 1-4 from `first` on (starts, ends, axes, steps; the last two optional).
SliceParams slice_inputs(const KernelContext& ctx, int first) {
  SliceParams p;
  p.what = "Slice inputs " + ctx.input_name(first) + "/" + ctx.input_name(first + 1);
  p.starts = index_values(ctx.input(first), "input " + ctx.input_name(first) + " (starts)");
  p.ends = index_values(ctx.input(first + 1), "input " + ctx.input_name(first + 1) + " (ends)");
  if (ctx.has_input(first + 2)) p.axes = index_values(ctx.input(first + 2), "input " + ctx.input_name(first + 2) + " (axes)");
  if (ctx.has_input(first + 3)) p.steps = index_values(ctx.input(first + 3), "input " + ctx.input_name(first + 3) + " (steps)");
  return p;
}

class Slice final : public Kernel {
 public:
  explicit Slice(const KernelInit& init) : opset_(init.opset()) {
    if (opset_ < 10) {
      attrs_.starts = init.attr_ints("starts");
      attrs_.ends = init.attr_ints("ends");
      if (!init.has_attr("starts") || !init.has_attr("ends")) {
        throw Error("Slice-" + std::to_string(opset_) + " needs the 'starts' and 'ends' attributes");
      }
      attrs_.axes = init.attr_ints("axes");
      attrs_.what = "Slice attributes";
    }
  }
  void run(KernelContext& ctx) override { slice_copy(ctx, opset_ < 10 ? attrs_ : slice_inputs(ctx, 1)); }

 private:
  int opset_;
  SliceParams attrs_;
};

// ai.onnxtrain.SliceGrad(dY, shape, starts, ends[, axes, steps]) -> dX: the gradient of
// Y = Slice(X, starts, ends, axes, steps) for X of `shape` (int64 [rank]): zeros of that shape
// with dY, which must have Y's shape, written where Slice took its elements. Slice's gradient
// rule emits it (the inputs of Slice-10+; for Slice-1 the rule passes its attributes as
// constants). Any element type.
class SliceGrad final : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const Tensor& dy = ctx.input(0);
    const std::vector<int64_t> dims = index_values(ctx.input(1), "input " + ctx.input_name(1) + " (the shape of X)");
    for (int64_t d : dims) {
      if (d < 0) throw Error("input " + ctx.input_name(1) + " is the shape " + list_string(dims) + ", expected dims >= 0");
    }
    const Shape x_shape(dims);
    const SliceView v = resolve_slice(x_shape, slice_inputs(ctx, 2), [&] { return "X of shape " + x_shape.to_string(); });
    if (!(dy.shape() == v.shape)) {
      throw Error("input " + ctx.input_name(0) + " has shape " + dy.shape().to_string() + ", expected " +
                  v.shape.to_string() + " (Slice's output for X of shape " + x_shape.to_string() + ")");
    }
    Tensor& dx = ctx.allocate_output(0, dy.dtype(), x_shape);
    const size_t elem = dtype_size(dy.dtype());
    std::memset(dx.raw_data(), 0, static_cast<size_t>(dx.numel()) * elem);
    copy_to_strided(dy.raw_data(), static_cast<char*>(dx.raw_data()) + v.offset * static_cast<int64_t>(elem), elem,
                    v.shape, v.strides);
  }
};

// --- Gather (Gather-1/11/13): output[j.., i.., k..] = data[j.., indices[i..], k..], where the
// indices replace dim `axis` of data ---
void gather(KernelContext& ctx, int64_t axis_attr) {
  const Tensor& data = ctx.input(0);
  const Tensor& indices = ctx.input(1);
  if (data.rank() == 0) throw Error("input " + ctx.input_name(0) + " is a scalar; Gather needs rank >= 1");
  const auto axis =
      static_cast<size_t>(op_axis(axis_attr, static_cast<int64_t>(data.rank()), "Gather attribute 'axis'"));
  const std::string what = "input " + ctx.input_name(1) + " (indices)";
  std::vector<int64_t> idx = index_values(indices, what);
  const int64_t n = data.dim(axis);
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = resolve_index(idx[i], n, i, what);
  Shape out_shape;
  for (size_t d = 0; d < axis; ++d) out_shape.push_back(data.dim(d));
  for (int64_t d : indices.shape()) out_shape.push_back(d);
  for (size_t d = axis + 1; d < data.rank(); ++d) out_shape.push_back(data.dim(d));
  Tensor& y = ctx.allocate_output(0, data.dtype(), out_shape);
  if (y.numel() == 0) return;
  const auto elem = static_cast<int64_t>(dtype_size(data.dtype()));
  const int64_t row = data.shape().numel(axis + 1, data.rank()) * elem;  // bytes per gathered row
  const auto q = static_cast<int64_t>(idx.size());
  const auto* src = static_cast<const char*>(data.raw_data());
  auto* dst = static_cast<char*>(y.raw_data());
  parallel_for(data.shape().numel(0, axis) * q, std::max<int64_t>(1, kParallelGrain * 4 / row),
               [&](int64_t b, int64_t e) {
                 for (int64_t r = b; r < e; ++r) {
                   const int64_t o = r / q;
                   std::memcpy(dst + r * row, src + (o * n + idx[static_cast<size_t>(r % q)]) * row,
                               static_cast<size_t>(row));
                 }
               });
}

// For GatherElements/ScatterElements: the data offset each element of `indices` addresses.
// Element i.. of indices addresses data[i_0, .., indices[i..], .., i_r-1] (index on `axis`).
std::vector<int64_t> element_offsets(const Shape& data_shape, const Tensor& indices, size_t axis,
                                     const std::string& what) {
  std::vector<int64_t> idx = index_values(indices, what);
  const Shape strides = contiguous_strides(data_shape);
  std::vector<detail::CopyDim> dims;
  for (size_t d = 0; d < data_shape.size(); ++d) {
    dims.push_back({indices.dim(d), d == axis ? 0 : strides[d], 0});
  }
  if (idx.empty()) return idx;
  detail::Odometer od(dims, 0);
  const int64_t n = data_shape[axis];
  for (size_t i = 0; i < idx.size(); ++i, od.next()) {
    idx[i] = od.src() + resolve_index(idx[i], n, i, what) * strides[axis];
  }
  return idx;
}

// Checks the shared shape rules of GatherElements/ScatterElements: equal ranks, and indices
// no larger than data on every dim but `axis`.
size_t check_elements_shapes(KernelContext& ctx, int64_t axis_attr) {
  const Tensor& data = ctx.input(0);
  const Tensor& indices = ctx.input(1);
  if (data.rank() == 0 || indices.rank() != data.rank()) {
    throw Error("input " + ctx.input_name(1) + " is " + indices.description() + " and input " +
                ctx.input_name(0) + " is " + data.description() + ": expected equal ranks >= 1");
  }
  const auto axis =
      static_cast<size_t>(op_axis(axis_attr, static_cast<int64_t>(data.rank()), "attribute 'axis'"));
  for (size_t d = 0; d < data.rank(); ++d) {
    if (d != axis && indices.dim(d) > data.dim(d)) {
      throw Error("input " + ctx.input_name(1) + " " + indices.description() + " is larger than input " +
                  ctx.input_name(0) + " " + data.description() + " on dim " + std::to_string(d));
    }
  }
  return axis;
}

// --- GatherElements (GatherElements-11/13): output has the shape of indices ---
void gather_elements(KernelContext& ctx, int64_t axis_attr) {
  const size_t axis = check_elements_shapes(ctx, axis_attr);
  const Tensor& data = ctx.input(0);
  const Tensor& indices = ctx.input(1);
  const std::vector<int64_t> offsets =
      element_offsets(data.shape(), indices, axis, "input " + ctx.input_name(1) + " (indices)");
  Tensor& y = ctx.allocate_output(0, data.dtype(), indices.shape());
  visit_elem_size(dtype_size(data.dtype()), [&]<class U>() {
    const U* src = static_cast<const U*>(data.raw_data());
    U* dst = static_cast<U*>(y.raw_data());
    parallel_for(static_cast<int64_t>(offsets.size()), kParallelGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) dst[i] = src[offsets[static_cast<size_t>(i)]];
    });
  });
}

// --- GatherND (GatherND-11/12/13): with b = batch_dims and k = indices.shape[-1], each
// k-tuple of indices selects the slice data[batch.., idx_0, .., idx_k-1, :]; the output shape
// is indices.shape[:-1] + data.shape[b+k:] ---
struct NdIndex {
  std::vector<int64_t> offsets;  // data offset of each selected slice
  int64_t slice = 1;             // elements per slice
};

NdIndex nd_offsets(const Shape& data_shape, const Tensor& indices, size_t batch_dims,
                   const std::string& what) {
  if (indices.dtype() != DataType::Int64) throw Error(what + " must be int64, got " + indices.description());
  const size_t r = data_shape.size(), q = indices.rank();
  if (q < 1 || r < 1 || batch_dims >= std::min(q, r)) {
    throw Error(what + " " + indices.description() + " and data " + data_shape.to_string() +
                ": need ranks >= 1 and batch_dims " + std::to_string(batch_dims) + " < both ranks");
  }
  const auto k = static_cast<size_t>(indices.dim(q - 1));
  if (k < 1 || k > r - batch_dims) {
    throw Error(what + " " + indices.description() + ": last dim " + std::to_string(k) + " must be in [1, " +
                std::to_string(r - batch_dims) + "] for data " + data_shape.to_string());
  }
  for (size_t d = 0; d < batch_dims; ++d) {
    if (indices.dim(d) != data_shape[d]) {
      throw Error(what + " " + indices.description() + " and data " + data_shape.to_string() +
                  " differ in batch dim " + std::to_string(d));
    }
  }
  const std::vector<int64_t> idx = indices.to_int64_vector(what);
  const Shape strides = contiguous_strides(data_shape);
  NdIndex result;
  result.slice = data_shape.numel(batch_dims + k, r);
  const int64_t batch_stride = data_shape.numel(batch_dims, r);
  const int64_t tuples_per_batch = indices.shape().numel(batch_dims, q - 1);
  const size_t tuples = idx.size() / k;
  result.offsets.resize(tuples);
  for (size_t t = 0; t < tuples; ++t) {
    int64_t offset = static_cast<int64_t>(t) / std::max<int64_t>(1, tuples_per_batch) * batch_stride;
    for (size_t j = 0; j < k; ++j) {
      const size_t d = batch_dims + j;
      offset += resolve_index(idx[t * k + j], data_shape[d], t * k + j, what) * strides[d];
    }
    result.offsets[t] = offset;
  }
  return result;
}

void gather_nd(KernelContext& ctx, int64_t batch_dims) {
  const Tensor& data = ctx.input(0);
  const Tensor& indices = ctx.input(1);
  const NdIndex nd = nd_offsets(data.shape(), indices, static_cast<size_t>(batch_dims),
                                "input " + ctx.input_name(1) + " (indices)");
  Shape out_shape;
  for (size_t d = 0; d + 1 < indices.rank(); ++d) out_shape.push_back(indices.dim(d));
  const auto first_slice_dim = static_cast<size_t>(batch_dims + indices.dim(indices.rank() - 1));
  for (size_t d = first_slice_dim; d < data.rank(); ++d) out_shape.push_back(data.dim(d));
  Tensor& y = ctx.allocate_output(0, data.dtype(), out_shape);
  if (y.numel() == 0) return;
  const auto elem = static_cast<int64_t>(dtype_size(data.dtype()));
  const int64_t row = nd.slice * elem;
  const auto* src = static_cast<const char*>(data.raw_data());
  auto* dst = static_cast<char*>(y.raw_data());
  parallel_for(static_cast<int64_t>(nd.offsets.size()), std::max<int64_t>(1, kParallelGrain * 4 / row),
               [&](int64_t b, int64_t e) {
                 for (int64_t t = b; t < e; ++t) {
                   std::memcpy(dst + t * row, src + nd.offsets[static_cast<size_t>(t)] * elem,
                               static_cast<size_t>(row));
                 }
               });
}

// --- ScatterElements / ScatterND (opset 16 adds reduction none/add/mul, 18 min/max): output =
// copy of data, then each update is written (or added, multiplied, or its maximum or minimum
// with the target taken, NaN-propagating as Max and Min are) at its target, in index order ---
enum class Reduction { None, Add, Mul, Max, Min };

Reduction reduction_of(const KernelInit& init) {
  if (init.opset() < 16) {
    if (init.has_attr("reduction")) throw Error("attribute 'reduction' needs opset 16 or later");
    return Reduction::None;
  }
  const std::string r = init.attr_string("reduction", "none");
  if (r == "none") return Reduction::None;
  if (r == "add") return Reduction::Add;
  if (r == "mul") return Reduction::Mul;
  if (init.opset() >= 18) {
    if (r == "max") return Reduction::Max;
    if (r == "min") return Reduction::Min;
    throw Error("attribute 'reduction' is '" + r + "', expected 'none', 'add', 'mul', 'max' or 'min'");
  }
  throw Error("attribute 'reduction' is '" + r + "', expected 'none', 'add' or 'mul'" +
              (r == "max" || r == "min" ? " ('" + r + "' needs opset 18 or later)" : std::string()));
}

// y = data; y[offsets[t] + j] (op)= updates[t * slice + j] for every t, j.
void scatter_into(KernelContext& ctx, std::span<const int64_t> offsets, int64_t slice, Reduction reduction) {
  const Tensor& data = ctx.input(0);
  const Tensor& updates = ctx.input(2);
  Tensor& y = ctx.allocate_output(0, data.dtype(), data.shape());
  if (data.numel() > 0) std::memcpy(y.raw_data(), data.raw_data(), data.nbytes());
  visit_dtype<AllTypes>(data.dtype(), "input " + ctx.input_name(0), [&]<class T>() {
    const T* u = updates.data<T>();
    T* out = y.data<T>();
    for (size_t t = 0; t < offsets.size(); ++t) {
      T* target = out + offsets[t];
      const T* src = u + static_cast<int64_t>(t) * slice;
      for (int64_t j = 0; j < slice; ++j) {
        using C = compute_t<T>;
        if (reduction == Reduction::None) {
          target[j] = src[j];
        } else if (reduction == Reduction::Add) {
          target[j] = convert<T>(static_cast<C>(convert<C>(target[j]) + convert<C>(src[j])));
        } else if (reduction == Reduction::Mul) {
          target[j] = convert<T>(static_cast<C>(convert<C>(target[j]) * convert<C>(src[j])));
        } else {
          const C a = convert<C>(target[j]), b = convert<C>(src[j]);
          const bool take_b = reduction == Reduction::Max ? (b > a || b != b) : (b < a || b != b);
          if (take_b && a == a) target[j] = src[j];  // NaN stays; a NaN update wins
        }
      }
    }
  });
}

void check_updates_dtype(KernelContext& ctx) {
  if (ctx.input(2).dtype() != ctx.input(0).dtype()) {
    throw Error("input " + ctx.input_name(2) + " (updates) is " + ctx.input(2).description() + " but input " +
                ctx.input_name(0) + " is " + ctx.input(0).description());
  }
}

void scatter_elements(KernelContext& ctx, int64_t axis_attr, Reduction reduction) {
  const size_t axis = check_elements_shapes(ctx, axis_attr);
  check_updates_dtype(ctx);
  if (ctx.input(2).shape() != ctx.input(1).shape()) {
    throw Error("input " + ctx.input_name(2) + " (updates) is " + ctx.input(2).description() + " but input " +
                ctx.input_name(1) + " (indices) is " + ctx.input(1).description() + ": shapes must be equal");
  }
  const std::vector<int64_t> offsets =
      element_offsets(ctx.input(0).shape(), ctx.input(1), axis, "input " + ctx.input_name(1) + " (indices)");
  scatter_into(ctx, offsets, 1, reduction);
}

void scatter_nd(KernelContext& ctx, Reduction reduction) {
  const Tensor& data = ctx.input(0);
  const Tensor& indices = ctx.input(1);
  const Tensor& updates = ctx.input(2);
  check_updates_dtype(ctx);
  const NdIndex nd = nd_offsets(data.shape(), indices, 0, "input " + ctx.input_name(1) + " (indices)");
  // updates.shape must be indices.shape[:-1] + data.shape[k:].
  Shape expected;
  for (size_t d = 0; d + 1 < indices.rank(); ++d) expected.push_back(indices.dim(d));
  for (auto d = static_cast<size_t>(indices.dim(indices.rank() - 1)); d < data.rank(); ++d)
    expected.push_back(data.dim(d));
  if (updates.shape() != expected) {
    throw Error("input " + ctx.input_name(2) + " (updates) is " + updates.description() +
                ", expected shape " + expected.to_string() + " (indices.shape[:-1] + data.shape[k:])");
  }
  scatter_into(ctx, nd.offsets, nd.slice, reduction);
}

// --- OneHot (OneHot-9/11): output[.., d, ..] (d inserted at `axis`) is values[1] where
// indices[..] == d and values[0] elsewhere. Indices outside [0, depth) give all off_value;
// from opset 11 indices in [-depth, -1] count from the end. ---
void one_hot(KernelContext& ctx, int64_t axis_attr, int opset) {
  const Tensor& indices = ctx.input(0);
  const Tensor& depth_t = ctx.input(1);
  const Tensor& values = ctx.input(2);
  if (depth_t.numel() != 1 || depth_t.rank() > 1) {
    throw Error("input " + ctx.input_name(1) + " (depth) must be a scalar, got " + depth_t.description());
  }
  if (values.numel() != 2 || values.rank() != 1) {
    throw Error("input " + ctx.input_name(2) + " (values) must be [off_value, on_value], got " +
                values.description());
  }
  int64_t depth = 0;
  visit_dtype<NumericTypes>(depth_t.dtype(), "input " + ctx.input_name(1) + " (depth)",
                            [&]<class T>() { depth = convert<int64_t>(depth_t.data<T>()[0]); });
  if (depth < 1)
    throw Error("input " + ctx.input_name(1) + " (depth) is " + std::to_string(depth) + ", expected >= 1");
  std::vector<int64_t> idx(static_cast<size_t>(indices.numel()));
  visit_dtype<NumericTypes>(indices.dtype(), "input " + ctx.input_name(0) + " (indices)", [&]<class T>() {
    const T* p = indices.data<T>();
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = convert<int64_t>(p[i]);
  });
  const auto axis = static_cast<size_t>(
      op_axis(axis_attr, static_cast<int64_t>(indices.rank()) + 1, "OneHot attribute 'axis'"));
  Shape out_shape = indices.shape();
  out_shape.insert(axis, depth);
  Tensor& y = ctx.allocate_output(0, values.dtype(), out_shape);
  const int64_t inner = indices.shape().numel(axis, indices.rank());
  visit_elem_size(dtype_size(values.dtype()), [&]<class U>() {
    const U off = static_cast<const U*>(values.raw_data())[0];
    const U on = static_cast<const U*>(values.raw_data())[1];
    U* out = static_cast<U*>(y.raw_data());
    std::fill(out, out + y.numel(), off);
    for (size_t i = 0; i < idx.size(); ++i) {
      int64_t d = idx[i];
      if (d < 0 && opset >= 11) d += depth;
      if (d < 0 || d >= depth) continue;
      const int64_t o = static_cast<int64_t>(i) / inner, in = static_cast<int64_t>(i) % inner;
      out[(o * depth + d) * inner + in] = on;
    }
  });
}

// --- Trilu (Trilu-14): keeps, in each of the last two dims' [N, M] matrices, the elements with
// j - i >= k (upper) or j - i <= k (lower), and zeroes the rest ---
void trilu(KernelContext& ctx, bool upper) {
  const Tensor& x = ctx.input(0);
  if (x.rank() < 2)
    throw Error("input " + ctx.input_name(0) + " is " + x.description() + ", expected rank >= 2");
  int64_t k = 0;
  if (ctx.has_input(1)) {
    const Tensor& kt = ctx.input(1);
    if (kt.dtype() != DataType::Int64)
      throw Error("input " + ctx.input_name(1) + " (k) must be int64, got " + kt.description());
    k = scalar_int64(kt, "input " + ctx.input_name(1) + " (k)");
  }
  Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
  if (x.numel() == 0) return;
  const int64_t rows = x.dim(x.rank() - 2), cols = x.dim(x.rank() - 1);
  k = std::clamp<int64_t>(k, -rows - 1, cols + 1);
  visit_elem_size(dtype_size(x.dtype()), [&]<class U>() {
    const U* src = static_cast<const U*>(x.raw_data());
    U* dst = static_cast<U*>(y.raw_data());
    parallel_for(x.numel() / cols, std::max<int64_t>(1, kParallelGrain / cols), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const int64_t i = r % rows;
        // Kept columns [lo, hi) of row i.
        const int64_t lo = upper ? std::clamp<int64_t>(i + k, 0, cols) : 0;
        const int64_t hi = upper ? cols : std::clamp<int64_t>(i + k + 1, 0, cols);
        const U* s = src + r * cols;
        U* d = dst + r * cols;
        std::fill(d, d + cols, U{0});
        if (hi > lo) std::memcpy(d + lo, s + lo, static_cast<size_t>(hi - lo) * sizeof(U));
      }
    });
  });
}

}  // namespace

std::unique_ptr<Kernel> make_slice(const KernelInit& init) { return std::make_unique<Slice>(init); }
std::unique_ptr<Kernel> make_slice_grad(const KernelInit&) { return std::make_unique<SliceGrad>(); }

std::unique_ptr<Kernel> make_gather(const KernelInit& init) {
  const int64_t axis = init.attr_int("axis", 0);
  return make_kernel([axis](KernelContext& ctx) { gather(ctx, axis); });
}

std::unique_ptr<Kernel> make_gather_elements(const KernelInit& init) {
  const int64_t axis = init.attr_int("axis", 0);
  return make_kernel([axis](KernelContext& ctx) { gather_elements(ctx, axis); });
}

std::unique_ptr<Kernel> make_gather_nd(const KernelInit& init) {
  // batch_dims arrived in GatherND-12.
  const int64_t batch_dims = init.opset() >= 12 ? init.attr_int("batch_dims", 0) : 0;
  if (batch_dims < 0)
    throw Error("attribute 'batch_dims' is " + std::to_string(batch_dims) + ", expected >= 0");
  return make_kernel([batch_dims](KernelContext& ctx) { gather_nd(ctx, batch_dims); });
}

// Also serves Scatter-9/10, the deprecated name of ScatterElements.
std::unique_ptr<Kernel> make_scatter_elements(const KernelInit& init) {
  const int64_t axis = init.attr_int("axis", 0);
  const Reduction reduction = reduction_of(init);
  return make_kernel([axis, reduction](KernelContext& ctx) { scatter_elements(ctx, axis, reduction); });
}

std::unique_ptr<Kernel> make_scatter_nd(const KernelInit& init) {
  const Reduction reduction = reduction_of(init);
  return make_kernel([reduction](KernelContext& ctx) { scatter_nd(ctx, reduction); });
}

std::unique_ptr<Kernel> make_one_hot(const KernelInit& init) {
  const int64_t axis = init.attr_int("axis", -1);
  const int opset = init.opset();
  return make_kernel([axis, opset](KernelContext& ctx) { one_hot(ctx, axis, opset); });
}

std::unique_ptr<Kernel> make_trilu(const KernelInit& init) {
  const bool upper = init.attr_int("upper", 1) != 0;
  return make_kernel([upper](KernelContext& ctx) { trilu(ctx, upper); });
}

}  // namespace onnxtrain::ops
