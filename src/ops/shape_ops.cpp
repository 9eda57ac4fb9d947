// Ops that move or view data without arithmetic (ONNX operator docs, ai.onnx opsets 1-28; the
// versions after 17 of Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Shape, Size and Pad-21+
// only add element types, which the kernel table admits as onnxtrain's Tensor gains them).
//
// Reshape, Flatten, Squeeze and Unsqueeze return views that share the input's storage.
// Transpose, Expand, Tile, DepthToSpace and SpaceToDepth describe their output as a strided
// view of the input and copy it with copy_strided (data_movement.h). Concat, Split and Pad
// copy rows. Shape and Size read only the input's shape.
#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/dispatch.h"
#include "ops/broadcast.h"
#include "ops/data_movement.h"
#include "ops/factories.h"

namespace onnxtrain::ops {

namespace {

std::string list_string(std::span<const int64_t> values) {
  std::string s = "[";
  for (size_t i = 0; i < values.size(); ++i) s += (i ? "," : "") + std::to_string(values[i]);
  return s + "]";
}

// Opset 11 documented negative axes (counting from the back) for Flatten, Squeeze, Unsqueeze,
// Concat and Split. Exporters wrote them into older opsets too (PyTorch's GLU at opset 6), and
// their meaning is unambiguous, so every opset accepts them.
int64_t resolve_axis(int64_t axis, int64_t rank, [[maybe_unused]] int opset, const std::string& what) {
  return normalize_axis(axis, rank, what);
}

// Reshape (docs of Reshape 1/5/14): a 0 copies the input's dim at that position (a literal
// 0 with allowzero=1), at most one -1 is inferred from the element count.
Shape reshape_target(const Shape& in, std::span<const int64_t> spec, bool allow_zero,
                     const std::string& what) {
  Shape out;
  std::optional<size_t> inferred;
  int64_t known = 1;
  bool has_zero = false;
  for (size_t i = 0; i < spec.size(); ++i) {
    int64_t d = spec[i];
    if (d == -1) {
      if (inferred) throw Error(what + " " + list_string(spec) + " has more than one -1");
      inferred = i;
      out.push_back(1);
      continue;
    }
    if (d < -1) throw Error(what + " " + list_string(spec) + " has a negative dim " + std::to_string(d));
    if (d == 0 && !allow_zero) {
      if (i >= in.size()) {
        throw Error(what + " " + list_string(spec) + " copies dim " + std::to_string(i) +
                    " (a 0) but the input " + in.to_string() + " has rank " + std::to_string(in.size()));
      }
      d = in[i];
    }
    has_zero = has_zero || d == 0;
    if (d > 0 && known > std::numeric_limits<int64_t>::max() / d) {
      throw Error(what + " " + list_string(spec) + " has too many elements");
    }
    known *= d;
    out.push_back(d);
  }
  if (inferred) {
    if (has_zero || in.numel() % known != 0) {
      throw Error("cannot reshape " + in.to_string() + " to " + what + " " + list_string(spec) +
                  ": the -1 cannot be inferred");
    }
    out[*inferred] = in.numel() / known;
  }
  if (out.numel() != in.numel()) {
    throw Error("cannot reshape " + in.to_string() + " (" + std::to_string(in.numel()) + " elements) to " +
                what + " " + list_string(spec) + " (" + std::to_string(out.numel()) + " elements)");
  }
  return out;
}

class Reshape final : public Kernel {
 public:
  explicit Reshape(const KernelInit& init)
      : opset_(init.opset()), allow_zero_(init.opset() >= 14 && init.attr_int("allowzero", 0) != 0) {
    if (opset_ < 5) {
      if (!init.has_attr("shape"))
        throw Error("Reshape-" + std::to_string(opset_) + " needs the 'shape' attribute");
      shape_attr_ = init.attr_ints("shape");
    }
  }
  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const std::vector<int64_t> spec =
        opset_ < 5 ? shape_attr_ : int64_list(ctx.input(1), "input " + ctx.input_name(1) + " (shape)");
    const std::string what = opset_ < 5 ? "attribute 'shape'" : "shape " + ctx.input_name(1);
    ctx.set_output(0, x.view(reshape_target(x.shape(), spec, allow_zero_, what)));
  }

 private:
  int opset_;
  bool allow_zero_;
  std::vector<int64_t> shape_attr_;
};

// The axes of Squeeze/Unsqueeze: the attribute before opset 13, the optional int64 input after.
// The docs ask for a 1-D input; a 0-D one names one axis, as the ONNX reference reads it (the
// expanded AffineGrid tests of ONNX 1.23 give Unsqueeze a scalar).
std::optional<std::vector<int64_t>> axes_of(KernelContext& ctx, int opset,
                                            const std::optional<std::vector<int64_t>>& attr) {
  if (opset < 13) return attr;
  if (!ctx.has_input(1)) return std::nullopt;
  const Tensor& axes = ctx.input(1);
  const std::string what = "input " + ctx.input_name(1) + " (axes)";
  if (axes.rank() == 0 && axes.dtype() == DataType::Int64) return axes.to_int64_vector(what);
  return int64_list(axes, what);
}

// A 1-D int32 or int64 input of axes (Pad-18's `axes`).
std::vector<int64_t> index_list(const Tensor& t, const std::string& what) {
  if ((t.dtype() != DataType::Int64 && t.dtype() != DataType::Int32) || t.rank() != 1) {
    throw Error(what + " must be a 1-D int32 or int64 tensor, got " + t.description());
  }
  return t.to_int64_vector(what);
}

// Normalizes axes against `rank`; duplicates are an error.
std::vector<bool> axis_mask(std::span<const int64_t> axes, int64_t rank, int opset, const std::string& what) {
  std::vector<bool> mask(static_cast<size_t>(rank), false);
  for (int64_t a : axes) {
    const auto n = static_cast<size_t>(resolve_axis(a, rank, opset, what));
    if (mask[n]) throw Error(what + " " + list_string(axes) + " names axis " + std::to_string(n) + " twice");
    mask[n] = true;
  }
  return mask;
}

// --- Transpose: output dim i is input dim perm[i] (default: reversed) ---
std::unique_ptr<Kernel> transpose_kernel(std::optional<std::vector<int64_t>> perm) {
  return make_kernel([perm = std::move(perm)](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const size_t rank = x.rank();
    std::vector<int64_t> p(rank);
    if (perm) {
      if (perm->size() != rank) {
        throw Error("attribute 'perm' " + list_string(*perm) + " has " + std::to_string(perm->size()) +
                    " entries but input " + ctx.input_name(0) + " is " + x.description());
      }
      p = *perm;
    } else {
      for (size_t i = 0; i < rank; ++i) p[i] = static_cast<int64_t>(rank - 1 - i);
    }
    Tensor& y = ctx.allocate_output(0, x.dtype(), permuted_shape(x.shape(), p));
    copy_permuted(x, y, p);
  });
}

// --- Concat (docs of Concat 1/4/11/13): all inputs share dtype and every dim but `axis` ---
std::unique_ptr<Kernel> concat_kernel(int64_t axis_attr, int opset) {
  return make_kernel([axis_attr, opset](KernelContext& ctx) {
    const Tensor& first = ctx.input(0);
    const auto rank = static_cast<int64_t>(first.rank());
    if (rank == 0) throw Error("input " + ctx.input_name(0) + " is a scalar; Concat needs rank >= 1");
    const auto axis = static_cast<size_t>(resolve_axis(axis_attr, rank, opset, "Concat attribute 'axis'"));
    Shape out_shape = first.shape();
    out_shape[axis] = 0;
    for (int i = 0; i < ctx.num_inputs(); ++i) {
      const Tensor& t = ctx.input(i);
      bool same = t.dtype() == first.dtype() && t.rank() == first.rank();
      for (size_t d = 0; same && d < t.rank(); ++d) same = d == axis || t.dim(d) == first.dim(d);
      if (!same) {
        throw Error("input " + ctx.input_name(i) + " is " + t.description() + " but input " +
                    ctx.input_name(0) + " is " + first.description() + " (only dim " + std::to_string(axis) +
                    " may differ)");
      }
      out_shape[axis] += t.dim(axis);
    }
    Tensor& y = ctx.allocate_output(0, first.dtype(), out_shape);
    if (y.numel() == 0) return;
    // Each input contributes one row of dims [axis, rank) per outer index.
    const auto elem = static_cast<int64_t>(dtype_size(first.dtype()));
    std::vector<std::pair<const char*, int64_t>> parts;  // data, row bytes
    for (int i = 0; i < ctx.num_inputs(); ++i) {
      const Tensor& t = ctx.input(i);
      const int64_t row = t.shape().numel(axis, t.rank()) * elem;
      if (row > 0) parts.emplace_back(static_cast<const char*>(t.raw_data()), row);
    }
    const int64_t outer = out_shape.numel(0, axis);
    const int64_t out_row = out_shape.numel(axis, out_shape.size()) * elem;
    auto* out = static_cast<char*>(y.raw_data());
    parallel_for(outer, std::max<int64_t>(1, kParallelGrain * 4 / out_row), [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o) {
        char* dst = out + o * out_row;
        for (const auto& [data, row] : parts) {
          std::memcpy(dst, data + o * row, static_cast<size_t>(row));
          dst += row;
        }
      }
    });
  });
}

// --- Split (docs of Split 1/2/11/13/18): sizes from the attribute (opsets 1-12), the second
// input (opset 1 when the attribute is absent, optional int64 input from 13), else equal parts.
// Split-18's num_outputs (which must match the node's outputs) allows an uneven split: every
// part ceil(dim / num_outputs) long but the last, which gets the rest (ONNX op doc 'Split') ---
class Split final : public Kernel {
 public:
  explicit Split(const KernelInit& init)
      : opset_(init.opset()), axis_(init.attr_int("axis", 0)), outputs_(init.num_outputs()) {
    if (opset_ < 13) split_attr_ = init.optional_ints("split");
    if (outputs_ < 1) throw Error("Split needs at least one output");
    if (init.has_attr("num_outputs")) {
      if (opset_ < 18) {
        throw Error("Split attribute 'num_outputs' needs opset 18 or later (the model imports opset " +
                    std::to_string(opset_) + ")");
      }
      const int64_t n = init.attr_int("num_outputs", 0);
      if (n != outputs_) {
        throw Error("Split attribute 'num_outputs' is " + std::to_string(n) + " but the node has " +
                    std::to_string(outputs_) + " outputs");
      }
      if (init.has_input(1)) throw Error("Split takes either the 'split' input or the 'num_outputs' attribute, not both");
      uneven_ = true;
    }
  }
  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (x.rank() == 0) throw Error("input " + ctx.input_name(0) + " is a scalar; Split needs rank >= 1");
    const auto axis = static_cast<size_t>(
        resolve_axis(axis_, static_cast<int64_t>(x.rank()), opset_, "Split attribute 'axis'"));
    const int64_t dim = x.dim(axis);
    std::vector<int64_t> sizes = split_sizes(ctx, dim);
    const size_t elem = dtype_size(x.dtype());
    const int64_t outer = x.shape().numel(0, axis);
    const int64_t inner = x.shape().numel(axis + 1, x.rank());
    int64_t start = 0;
    for (int k = 0; k < outputs_; ++k) {
      Shape shape = x.shape();
      shape[axis] = sizes[static_cast<size_t>(k)];
      Tensor& y = ctx.allocate_output(k, x.dtype(), shape);
      const int64_t row = shape[axis] * inner;
      if (y.numel() > 0) {
        const auto* src = static_cast<const char*>(x.raw_data()) + start * inner * static_cast<int64_t>(elem);
        auto* dst = static_cast<char*>(y.raw_data());
        parallel_for(outer, std::max<int64_t>(1, kParallelGrain / row), [&](int64_t begin, int64_t end) {
          for (int64_t o = begin; o < end; ++o) {
            std::memcpy(dst + o * row * static_cast<int64_t>(elem),
                        src + o * dim * inner * static_cast<int64_t>(elem), static_cast<size_t>(row) * elem);
          }
        });
      }
      start += shape[axis];
    }
  }

 private:
  std::vector<int64_t> split_sizes(KernelContext& ctx, int64_t dim) const {
    std::optional<std::vector<int64_t>> split = split_attr_;
    std::string what = "attribute 'split'";
    const bool input_form = opset_ >= 13 || (opset_ == 1 && !split_attr_);
    if (input_form && ctx.has_input(1)) {
      split = ctx.input(1).to_int64_vector("input " + ctx.input_name(1) + " (split)");
      what = "input " + ctx.input_name(1) + " (split)";
    }
    const int64_t parts = outputs_;
    if (!split && uneven_ && dim % parts != 0) {
      const int64_t chunk = dim / parts + 1, last = dim - chunk * (parts - 1);
      if (last < 0) {
        throw Error("cannot split dim of size " + std::to_string(dim) + " into " + std::to_string(parts) +
                    " parts of " + std::to_string(chunk) + " (attribute 'num_outputs'): too many outputs");
      }
      std::vector<int64_t> sizes(static_cast<size_t>(parts), chunk);
      sizes.back() = last;
      return sizes;
    }
    if (!split) {
      // Equal parts; an uneven last part needs Split-18's num_outputs.
      if (dim % parts != 0) {
        throw Error("cannot split dim of size " + std::to_string(dim) + " into " + std::to_string(parts) +
                    " equal parts (give 'split' sizes)");
      }
      return std::vector<int64_t>(static_cast<size_t>(parts), dim / parts);
    }
    if (static_cast<int64_t>(split->size()) != parts) {
      throw Error(what + " " + list_string(*split) + " has " + std::to_string(split->size()) +
                  " sizes but the node has " + std::to_string(parts) + " outputs");
    }
    int64_t sum = 0;
    for (int64_t s : *split) {
      if (s < 0) throw Error(what + " " + list_string(*split) + " has a negative size");
      sum += s;
    }
    if (sum != dim) {
      throw Error(what + " " + list_string(*split) + " sums to " + std::to_string(sum) +
                  " but the split dim is " + std::to_string(dim));
    }
    return *split;
  }

  int opset_;
  int64_t axis_;
  int outputs_;
  bool uneven_ = false;  // num_outputs given
  std::optional<std::vector<int64_t>> split_attr_;
};

// --- Expand (Expand-8/13): numpy broadcast of the input and the `shape` input ---
void expand(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const std::vector<int64_t> spec = int64_list(ctx.input(1), "input " + ctx.input_name(1) + " (shape)");
  for (int64_t d : spec) {
    if (d < 0)
      throw Error("input " + ctx.input_name(1) + " (shape) " + list_string(spec) + " has a negative dim");
  }
  Shape out_shape;
  try {
    out_shape = broadcast_shapes(x.shape(), Shape(spec));
  } catch (const Error& e) {
    throw e.with_context("cannot expand input " + ctx.input_name(0) + " to shape " + list_string(spec));
  }
  const Shape in_strides = contiguous_strides(x.shape());
  const size_t pad = out_shape.size() - x.rank();
  std::vector<int64_t> strides(out_shape.size(), 0);
  for (size_t d = pad; d < out_shape.size(); ++d) {
    strides[d] = x.dim(d - pad) == 1 ? 0 : in_strides[d - pad];
  }
  Tensor& y = ctx.allocate_output(0, x.dtype(), out_shape);
  copy_strided(x.raw_data(), y.raw_data(), dtype_size(x.dtype()), out_shape, strides);
}

// --- Tile (Tile-6/13): output dim d is input dim d times repeats[d]. As a strided view it is
// [r0, d0, r1, d1, ...] with stride 0 on each repeat dim. ---
void tile(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const std::vector<int64_t> repeats = int64_list(ctx.input(1), "input " + ctx.input_name(1) + " (repeats)");
  if (repeats.size() != x.rank()) {
    throw Error("input " + ctx.input_name(1) + " (repeats) " + list_string(repeats) + " has " +
                std::to_string(repeats.size()) + " entries but input " + ctx.input_name(0) + " is " +
                x.description());
  }
  const Shape in_strides = contiguous_strides(x.shape());
  Shape out_shape, view_shape;
  std::vector<int64_t> strides;
  for (size_t d = 0; d < x.rank(); ++d) {
    if (repeats[d] < 0)
      throw Error("input " + ctx.input_name(1) + " (repeats) " + list_string(repeats) + " is negative");
    out_shape.push_back(x.dim(d) * repeats[d]);
    view_shape.push_back(repeats[d]);
    view_shape.push_back(x.dim(d));
    strides.push_back(0);
    strides.push_back(in_strides[d]);
  }
  Tensor& y = ctx.allocate_output(0, x.dtype(), out_shape);
  copy_strided(x.raw_data(), y.raw_data(), dtype_size(x.dtype()), view_shape, strides);
}

// --- Pad (docs of Pad-1/2/11/13/18/19): pads = [x1_begin, x2_begin, ..., x1_end, x2_end, ...]
// for every axis, or from opset 18 for the axes the optional `axes` input lists (the others
// get none). Negative pads remove elements; the rest is padded with a constant (`value`
// attribute before opset 11, optional `constant_value` input after, default 0), the border
// element (edge), the mirror image around the border element (reflect, as numpy.pad), or from
// opset 19 the other end of the axis, as if it were a ring (wrap, as numpy.pad). Cropping is
// done first, so edge, reflect and wrap read the kept elements. ---
enum class PadMode { Constant, Reflect, Edge, Wrap };

// One padded dim: out coordinate -> input coordinate (-1: the constant). Out coordinates
// [begin, begin + kept) read input [lo, lo + kept) in order.
struct PadDim {
  std::vector<int64_t> map;
  int64_t begin, kept, lo;
};

PadDim pad_dim(int64_t n, int64_t b, int64_t e, PadMode mode, const std::string& what) {
  PadDim p;
  p.lo = std::max<int64_t>(0, -b);
  p.kept = n - p.lo - std::max<int64_t>(0, -e);
  p.begin = std::max<int64_t>(0, b);
  if (p.kept < 0) throw Error(what + " remove more than the " + std::to_string(n) + " elements of the dim");
  const int64_t out = p.kept + p.begin + std::max<int64_t>(0, e);
  if (mode != PadMode::Constant && p.kept == 0 && out > 0) {
    const char* name = mode == PadMode::Edge ? "edge" : mode == PadMode::Wrap ? "wrap" : "reflect";
    throw Error(what + " pad an empty dim in " + name + " mode");
  }
  p.map.resize(static_cast<size_t>(out));
  const int64_t period = 2 * (p.kept - 1);
  for (int64_t o = 0; o < out; ++o) {
    int64_t s = o - p.begin;
    if (s < 0 || s >= p.kept) {
      if (mode == PadMode::Constant) {
        s = -1 - p.lo;
      } else if (mode == PadMode::Wrap) {
        s = ((s % p.kept) + p.kept) % p.kept;
      } else if (mode == PadMode::Edge || p.kept == 1) {
        s = std::clamp<int64_t>(s, 0, p.kept - 1);
      } else {
        s = ((s % period) + period) % period;
        if (s >= p.kept) s = period - s;
      }
    }
    p.map[static_cast<size_t>(o)] = p.lo + s;
  }
  return p;
}

template <class U>
void pad_rows(const U* src, U* dst, const std::vector<PadDim>& dims, const Shape& in_strides, U value) {
  const PadDim& inner = dims.back();
  const auto width = static_cast<int64_t>(inner.map.size());
  const size_t outer_rank = dims.size() - 1;
  int64_t rows = 1;
  for (size_t d = 0; d < outer_rank; ++d) rows *= static_cast<int64_t>(dims[d].map.size());
  auto put = [&](U* out, const U* row, int64_t j) {
    const int64_t s = inner.map[static_cast<size_t>(j)];
    out[j] = s < 0 ? value : row[s];
  };
  parallel_for(rows, std::max<int64_t>(1, kParallelGrain / width), [&](int64_t begin, int64_t end) {
    std::vector<int64_t> index(outer_rank);
    for (size_t d = outer_rank, rest = static_cast<size_t>(begin); d-- > 0;) {
      index[d] = static_cast<int64_t>(rest % dims[d].map.size());
      rest /= dims[d].map.size();
    }
    for (int64_t r = begin; r < end; ++r) {
      U* out = dst + r * width;
      int64_t offset = 0;
      bool constant_row = false;
      for (size_t d = 0; d < outer_rank; ++d) {
        const int64_t s = dims[d].map[static_cast<size_t>(index[d])];
        constant_row = constant_row || s < 0;
        offset += s * in_strides[d];
      }
      if (constant_row) {
        std::fill(out, out + width, value);
      } else {
        const U* row = src + offset;
        for (int64_t j = 0; j < inner.begin; ++j) put(out, row, j);
        if (inner.kept > 0)
          std::memcpy(out + inner.begin, row + inner.lo, static_cast<size_t>(inner.kept) * sizeof(U));
        for (int64_t j = inner.begin + inner.kept; j < width; ++j) put(out, row, j);
      }
      for (size_t d = outer_rank; d-- > 0;) {
        if (++index[d] < static_cast<int64_t>(dims[d].map.size())) break;
        index[d] = 0;
      }
    }
  });
}

class Pad final : public Kernel {
 public:
  explicit Pad(const KernelInit& init) : opset_(init.opset()) {
    const std::string mode = init.attr_string("mode", "constant");
    if (mode == "constant") {
      mode_ = PadMode::Constant;
    } else if (mode == "reflect") {
      mode_ = PadMode::Reflect;
    } else if (mode == "edge") {
      mode_ = PadMode::Edge;
    } else if (mode == "wrap" && opset_ >= 19) {
      mode_ = PadMode::Wrap;
    } else {
      throw Error("attribute 'mode' is '" + mode + "', expected 'constant', 'reflect', 'edge'" +
                  (opset_ >= 19 ? " or 'wrap'" : " (or 'wrap' from opset 19; the model imports opset " +
                                                     std::to_string(opset_) + ")"));
    }
    if (opset_ < 11) {
      const std::string name = opset_ == 1 ? "paddings" : "pads";
      auto pads = init.optional_ints(name);
      if (!pads) throw Error("Pad-" + std::to_string(opset_) + " needs the '" + name + "' attribute");
      pads_attr_ = *pads;
      value_attr_ = init.attr_float("value", 0.0f);
    }
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const std::string what = opset_ < 11
                                 ? std::string(opset_ == 1 ? "attribute 'paddings'" : "attribute 'pads'")
                                 : "input " + ctx.input_name(1) + " (pads)";
    const size_t rank = x.rank();
    const std::vector<int64_t> pads =
        full_pads(ctx, opset_ < 11 ? pads_attr_ : int64_list(ctx.input(1), what), rank, what);
    std::vector<PadDim> dims;
    Shape out_shape;
    for (size_t d = 0; d < rank; ++d) {
      dims.push_back(pad_dim(x.dim(d), pads[d], pads[d + rank], mode_,
                             what + " " + list_string(pads) + " for axis " + std::to_string(d)));
      out_shape.push_back(static_cast<int64_t>(dims.back().map.size()));
    }
    const uint64_t value = constant_bits(ctx, x.dtype());
    Tensor& y = ctx.allocate_output(0, x.dtype(), out_shape);
    if (y.numel() == 0) return;
    if (rank == 0) {
      std::memcpy(y.raw_data(), x.raw_data(), dtype_size(x.dtype()));
      return;
    }
    const Shape in_strides = contiguous_strides(x.shape());
    visit_elem_size(dtype_size(x.dtype()), [&]<class U>() {
      U v;
      std::memcpy(&v, &value, sizeof(U));
      pad_rows(static_cast<const U*>(x.raw_data()), static_cast<U*>(y.raw_data()), dims, in_strides, v);
    });
  }

 private:
  // The pads of every axis: `given` itself, or from opset 18 with the `axes` input, given's
  // begin/end pairs spread over those axes (the others 0).
  std::vector<int64_t> full_pads(KernelContext& ctx, const std::vector<int64_t>& given, size_t rank,
                                 const std::string& what) const {
    const Tensor& x = ctx.input(0);
    if (opset_ < 18 || !ctx.has_input(3)) {
      if (given.size() != 2 * rank) {
        throw Error(what + " " + list_string(given) + " has " + std::to_string(given.size()) +
                    " values, expected " + std::to_string(2 * rank) + " for input " + ctx.input_name(0) + " " +
                    x.description());
      }
      return given;
    }
    const std::string axes_what = "input " + ctx.input_name(3) + " (axes)";
    const std::vector<int64_t> axes = index_list(ctx.input(3), axes_what);
    if (given.size() != 2 * axes.size()) {
      throw Error(what + " " + list_string(given) + " has " + std::to_string(given.size()) + " values, expected " +
                  std::to_string(2 * axes.size()) + " for the " + std::to_string(axes.size()) + " axes of " +
                  axes_what + " " + list_string(axes));
    }
    const std::vector<bool> seen = axis_mask(axes, static_cast<int64_t>(rank), opset_, axes_what);
    (void)seen;  // axis_mask rejects out-of-range and repeated axes
    std::vector<int64_t> pads(2 * rank, 0);
    for (size_t i = 0; i < axes.size(); ++i) {
      const auto d = static_cast<size_t>(normalize_axis(axes[i], static_cast<int64_t>(rank), axes_what));
      pads[d] = given[i];
      pads[d + rank] = given[i + axes.size()];
    }
    return pads;
  }

  // The pad value's bytes in the data's dtype (little-endian low bytes of the result).
  uint64_t constant_bits(KernelContext& ctx, DataType dtype) const {
    uint64_t bits = 0;
    if (opset_ < 11) {
      visit_dtype<AllTypes>(dtype, "Pad input " + ctx.input_name(0), [&]<class T>() {
        const T v = convert<T>(value_attr_);
        std::memcpy(&bits, &v, sizeof(T));
      });
    } else if (ctx.has_input(2)) {
      const Tensor& c = ctx.input(2);
      if (c.dtype() != dtype || c.numel() != 1) {
        throw Error("input " + ctx.input_name(2) + " (constant_value) is " + c.description() +
                    ", expected one element of " + std::string(dtype_name(dtype)));
      }
      std::memcpy(&bits, c.raw_data(), dtype_size(dtype));
    }
    return bits;
  }

  int opset_;
  PadMode mode_ = PadMode::Constant;
  std::vector<int64_t> pads_attr_;
  float value_attr_ = 0.0f;
};

// --- Shape (Shape-1/13/15): the dims as int64, from opset 15 sliced by start/end clamped to
// [0, rank] after adding rank to negative values ---
std::unique_ptr<Kernel> shape_kernel(int64_t start, std::optional<int64_t> end) {
  return make_kernel([start, end](KernelContext& ctx) {
    const Shape& s = ctx.input(0).shape();
    const auto rank = static_cast<int64_t>(s.size());
    auto clamp = [rank](int64_t a) { return std::clamp(a < 0 ? a + rank : a, int64_t{0}, rank); };
    const int64_t b = clamp(start);
    const int64_t e = end ? clamp(*end) : rank;
    const int64_t n = std::max<int64_t>(0, e - b);
    Tensor& y = ctx.allocate_output(0, DataType::Int64, Shape{n});
    for (int64_t i = 0; i < n; ++i) y.data<int64_t>()[i] = s[static_cast<size_t>(b + i)];
  });
}

// --- DepthToSpace / SpaceToDepth (docs of DepthToSpace-13/28, SpaceToDepth-13/28): a reshape
// to 6-D, a transpose and a reshape back, done as one strided copy. Both take `mode`, DCR
// (depth-column-row, the default) or CRD (column-row-depth): DepthToSpace from opset 11,
// SpaceToDepth from opset 28, where it is DepthToSpace's inverse in either mode ---
Shape checked_nchw(const Tensor& x, const std::string& name) {
  if (x.rank() != 4) throw Error("input " + name + " is " + x.description() + ", expected rank 4 [N,C,H,W]");
  return x.shape();
}

// Copies x viewed as `tmp` (6-D, contiguous) and transposed by `perm` into y.
void permute_6d(const Tensor& x, Tensor& y, const Shape& tmp, const std::array<size_t, 6>& perm) {
  const Shape tmp_strides = contiguous_strides(tmp);
  Shape out;
  std::vector<int64_t> strides;
  for (size_t p : perm) {
    out.push_back(tmp[p]);
    strides.push_back(tmp_strides[p]);
  }
  copy_strided(x.raw_data(), y.raw_data(), dtype_size(x.dtype()), out, strides);
}

std::unique_ptr<Kernel> depth_to_space_kernel(int64_t bs, bool crd) {
  return make_kernel([bs, crd](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Shape s = checked_nchw(x, ctx.input_name(0));
    const int64_t b = s[0], c = s[1], h = s[2], w = s[3];
    if (c % (bs * bs) != 0) {
      throw Error("input " + ctx.input_name(0) + " is " + x.description() +
                  ": channels are not divisible by blocksize^2 = " + std::to_string(bs * bs));
    }
    const int64_t c2 = c / (bs * bs);
    Tensor& y = ctx.allocate_output(0, x.dtype(), Shape{b, c2, h * bs, w * bs});
    if (crd) {
      permute_6d(x, y, Shape{b, c2, bs, bs, h, w}, {0, 1, 4, 2, 5, 3});
    } else {
      permute_6d(x, y, Shape{b, bs, bs, c2, h, w}, {0, 3, 4, 1, 5, 2});
    }
  });
}

std::unique_ptr<Kernel> space_to_depth_kernel(int64_t bs, bool crd) {
  return make_kernel([bs, crd](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Shape s = checked_nchw(x, ctx.input_name(0));
    const int64_t b = s[0], c = s[1], h = s[2], w = s[3];
    if (h % bs != 0 || w % bs != 0) {
      throw Error("input " + ctx.input_name(0) + " is " + x.description() +
                  ": height and width must be divisible by blocksize " + std::to_string(bs));
    }
    Tensor& y = ctx.allocate_output(0, x.dtype(), Shape{b, c * bs * bs, h / bs, w / bs});
    const Shape tmp{b, c, h / bs, bs, w / bs, bs};
    if (crd) {
      permute_6d(x, y, tmp, {0, 1, 3, 5, 2, 4});  // channel c * bs^2 + row * bs + column
    } else {
      permute_6d(x, y, tmp, {0, 3, 5, 1, 2, 4});  // channel (row * bs + column) * C + c
    }
  });
}

int64_t blocksize_of(const KernelInit& init) {
  const int64_t bs = init.required_int("blocksize");
  if (bs < 1) throw Error("attribute 'blocksize' is " + std::to_string(bs) + ", expected >= 1");
  return bs;
}

}  // namespace

std::unique_ptr<Kernel> make_reshape(const KernelInit& init) { return std::make_unique<Reshape>(init); }

// Flatten (Flatten-1/9/11/13): [d_0 * ... * d_(axis-1), d_axis * ... * d_n]; axis in [0, r]
// (documented from opset 11, accepted in every opset: also [-r, -1]).
std::unique_ptr<Kernel> make_flatten(const KernelInit& init) {
  const int64_t axis = init.attr_int("axis", 1);
  return make_kernel([axis](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const auto rank = static_cast<int64_t>(x.rank());
    if (axis < -rank || axis > rank) {
      throw Error("attribute 'axis' is " + std::to_string(axis) + ", expected [" +
                  std::to_string(-rank) + ", " + std::to_string(rank) + "] for input " +
                  ctx.input_name(0) + " " + x.description());
    }
    const auto a = static_cast<size_t>(axis < 0 ? axis + rank : axis);
    ctx.set_output(0, x.view(Shape{x.shape().numel(0, a), x.shape().numel(a, x.rank())}));
  });
}

// Squeeze (Squeeze-1/11/13): removes the listed dims, which must be 1, or every 1-dim when
// axes are absent (or empty, as ONNX Runtime reads them).
std::unique_ptr<Kernel> make_squeeze(const KernelInit& init) {
  const int opset = init.opset();
  std::optional<std::vector<int64_t>> attr = opset < 13 ? init.optional_ints("axes") : std::nullopt;
  return make_kernel([opset, attr](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const auto axes = axes_of(ctx, opset, attr);
    const auto rank = static_cast<int64_t>(x.rank());
    std::vector<bool> drop(static_cast<size_t>(rank));
    if (axes && !axes->empty()) {
      drop = axis_mask(*axes, rank, opset, "Squeeze axes");
    } else {
      for (size_t d = 0; d < x.rank(); ++d) drop[d] = x.dim(d) == 1;
    }
    Shape out;
    for (size_t d = 0; d < x.rank(); ++d) {
      if (!drop[d]) {
        out.push_back(x.dim(d));
      } else if (x.dim(d) != 1) {
        throw Error("cannot squeeze axis " + std::to_string(d) + " of input " + ctx.input_name(0) + " " +
                    x.description() + ": its size is " + std::to_string(x.dim(d)) + ", not 1");
      }
    }
    ctx.set_output(0, x.view(out));
  });
}

// Unsqueeze (Unsqueeze-1/11/13): inserts 1-dims at the given positions of the output.
std::unique_ptr<Kernel> make_unsqueeze(const KernelInit& init) {
  const int opset = init.opset();
  std::optional<std::vector<int64_t>> attr;
  if (opset < 13) {
    attr = init.optional_ints("axes");
    if (!attr) throw Error("Unsqueeze-" + std::to_string(opset) + " needs the 'axes' attribute");
  }
  return make_kernel([opset, attr](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const auto axes = axes_of(ctx, opset, attr);
    if (!axes) throw Error("Unsqueeze needs the 'axes' input");
    const auto out_rank = static_cast<int64_t>(x.rank() + axes->size());
    const std::vector<bool> insert = axis_mask(*axes, out_rank, opset, "Unsqueeze axes");
    Shape out;
    size_t next = 0;
    for (size_t d = 0; d < static_cast<size_t>(out_rank); ++d) out.push_back(insert[d] ? 1 : x.dim(next++));
    ctx.set_output(0, x.view(out));
  });
}

std::unique_ptr<Kernel> make_transpose(const KernelInit& init) {
  auto perm = init.optional_ints("perm");
  if (perm && !is_permutation(*perm)) {
    throw Error("attribute 'perm' " + list_string(*perm) + " is not a permutation of [0, " +
                std::to_string(perm->size()) + ")");
  }
  return transpose_kernel(std::move(perm));
}

std::unique_ptr<Kernel> make_concat(const KernelInit& init) {
  // Concat-1: axis defaults to 1; from Concat-4 it is required.
  if (init.opset() >= 4 && !init.has_attr("axis")) throw Error("Concat needs the 'axis' attribute");
  return concat_kernel(init.attr_int("axis", 1), init.opset());
}

std::unique_ptr<Kernel> make_split(const KernelInit& init) { return std::make_unique<Split>(init); }

std::unique_ptr<Kernel> make_expand(const KernelInit&) { return make_kernel(expand); }

std::unique_ptr<Kernel> make_tile(const KernelInit&) { return make_kernel(tile); }

std::unique_ptr<Kernel> make_pad(const KernelInit& init) { return std::make_unique<Pad>(init); }

std::unique_ptr<Kernel> make_shape(const KernelInit& init) {
  if (init.opset() < 15) return shape_kernel(0, std::nullopt);
  std::optional<int64_t> end;
  if (init.has_attr("end")) end = init.attr_int("end", 0);
  return shape_kernel(init.attr_int("start", 0), end);
}

// Size (Size-1/13): the element count as an int64 scalar.
std::unique_ptr<Kernel> make_size(const KernelInit&) {
  return make_kernel([](KernelContext& ctx) {
    const int64_t n = ctx.input(0).numel();
    ctx.allocate_output(0, DataType::Int64, Shape{}).data<int64_t>()[0] = n;
  });
}

std::unique_ptr<Kernel> make_depth_to_space(const KernelInit& init) {
  const int64_t bs = blocksize_of(init);
  // DepthToSpace-1 has no mode and rearranges as DCR.
  const std::string mode = init.opset() >= 11 ? init.attr_string("mode", "DCR") : "DCR";
  if (mode != "DCR" && mode != "CRD")
    throw Error("attribute 'mode' is '" + mode + "', expected 'DCR' or 'CRD'");
  return depth_to_space_kernel(bs, mode == "CRD");
}

std::unique_ptr<Kernel> make_space_to_depth(const KernelInit& init) {
  const int64_t bs = blocksize_of(init);
  // SpaceToDepth-1/13 have no mode and rearrange as DCR.
  if (init.opset() < 28 && init.has_attr("mode")) {
    throw Error("SpaceToDepth attribute 'mode' needs opset 28 or later (the model imports opset " +
                std::to_string(init.opset()) + ")");
  }
  const std::string mode = init.opset() >= 28 ? init.attr_string("mode", "DCR") : "DCR";
  if (mode != "DCR" && mode != "CRD")
    throw Error("attribute 'mode' is '" + mode + "', expected 'DCR' or 'CRD'");
  return space_to_depth_kernel(bs, mode == "CRD");
}

}  // namespace onnxtrain::ops
