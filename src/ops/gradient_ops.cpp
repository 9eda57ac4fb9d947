// Backward ops of the ai.onnxtrain domain (version 1), emitted by the gradient rules of
// src/autodiff where standard ONNX ops would need many nodes or a newer opset:
//
//   SumToShape(G, shape) -> Y            the inverse of numpy broadcasting: Y has `shape`
//                                        (which must broadcast to G's shape) and holds G
//                                        summed over the broadcast dims. Equal shapes give G.
//   GatherGrad(dY, indices, shape; axis)            dData of Y = Gather(Data, indices, axis)
//   GatherElementsGrad(dY, indices, shape; axis)    dData of GatherElements
//   GatherNDGrad(dY, indices, shape; batch_dims)    dData of GatherND
//     zeros shaped `shape` with every dY element added at the position its forward op read
//     (repeated indices accumulate). Negative indices count from the end, as in the forward
//     ops; an index out of range is an Error.
//   ReluGrad(Y, dY) -> dX                dX = dY where Y > 0, else 0 (Y = Relu(X) is > 0 exactly
//                                        where X is; a NaN Y gives 0, as Where(Y > 0, dY, 0)
//                                        does). Y and dY: one float type and shape.
#include <cstring>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/broadcast.h"
#include "ops/factories.h"
#include "ops/relu.h"
#include "ops/sum_to_shape.h"

namespace onnxtrain::ops {

namespace {

// Index values of an int32/int64 tensor as int64.
std::vector<int64_t> read_indices(const KernelContext& ctx, int i) {
  const Tensor& t = ctx.input(i);
  if (t.dtype() != DataType::Int64 && t.dtype() != DataType::Int32) {
    fail("indices " + ctx.input_name(i) + " must be int32 or int64, got " + t.description());
  }
  return t.to_int64_vector("indices");
}

int64_t resolve_index(int64_t index, int64_t dim, const KernelContext& ctx) {
  if (index < -dim || index >= dim) {
    fail("index " + std::to_string(index) + " in " + ctx.input_name(1) + " is out of range for a dim of " +
         std::to_string(dim));
  }
  return index < 0 ? index + dim : index;
}

void sum_to_shape(KernelContext& ctx) {
  const Tensor& g = ctx.input(0);
  const Shape target = shape_input(ctx, 1);
  if (target == g.shape()) {
    ctx.set_output(0, g);
    return;
  }
  check_sum_to_shape(g.shape(), target, ctx.input_name(0));
  sum_to_shape_into(g, target, ctx.allocate_output(0, g.dtype(), target));
}

enum class GatherKind { Gather, Elements, ND };

void gather_grad(KernelContext& ctx, GatherKind kind, int64_t axis_attr, int64_t batch_dims) {
  const Tensor& dy = ctx.input(0);
  const Shape shape = shape_input(ctx, 2);
  const std::vector<int64_t> indices = read_indices(ctx, 1);
  const Shape& ishape = ctx.input(1).shape();
  Tensor& out = ctx.allocate_output(0, dy.dtype(), shape);
  const auto rank = static_cast<int64_t>(shape.size());
  visit_dtype<FloatTypes>(dy.dtype(), "input " + ctx.input_name(0), [&]<class T>() {
    const T* g = dy.data<T>();
    T* o = out.data<T>();
    auto add = [](T& to, T v) { to = convert<T>(static_cast<compute_t<T>>(to) + static_cast<compute_t<T>>(v)); };
    if (kind == GatherKind::Gather) {
      const int64_t axis = normalize_axis(axis_attr, rank, "attribute 'axis'");
      const int64_t outer = shape.numel(0, static_cast<size_t>(axis));
      const int64_t dim = shape[static_cast<size_t>(axis)];
      const int64_t inner = shape.numel(static_cast<size_t>(axis) + 1, shape.size());
      const auto n = static_cast<int64_t>(indices.size());
      if (dy.numel() != outer * n * inner) {
        fail("input " + ctx.input_name(0) + " " + dy.shape().to_string() + " does not match Gather of " +
             shape.to_string() + " by indices " + ishape.to_string());
      }
      std::vector<int64_t> rows(indices.size());
      for (size_t j = 0; j < rows.size(); ++j) rows[j] = resolve_index(indices[j], dim, ctx);
      // The output's rows (outer x dim of `inner` elements; an embedding's gradient: one per
      // vocabulary entry) split between the threads: each zeroes its rows and adds to them the
      // rows of dY that index them, in index order, as one thread would, so the sums are the
      // same whatever the thread count (BERT's [30522, 256] word embeddings: 31 MB a step).
      parallel_for(outer * dim, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(inner, 1)),
                   [&](int64_t begin, int64_t end) {
        std::memset(static_cast<void*>(o + begin * inner), 0, static_cast<size_t>((end - begin) * inner) * sizeof(T));
        for (int64_t b = begin / dim; b < outer && b * dim < end; ++b) {
          for (int64_t j = 0; j < n; ++j) {
            const int64_t row = b * dim + rows[static_cast<size_t>(j)];
            if (row < begin || row >= end) continue;
            const T* src = g + (b * n + j) * inner;
            T* dst = o + row * inner;
            for (int64_t i = 0; i < inner; ++i) add(dst[i], src[i]);
          }
        }
      });
      return;
    }
    std::memset(out.raw_data(), 0, out.nbytes());
    if (kind == GatherKind::Elements) {
      const int64_t axis = normalize_axis(axis_attr, rank, "attribute 'axis'");
      if (ishape != dy.shape() || ishape.size() != shape.size()) {
        fail("indices " + ctx.input_name(1) + " " + ishape.to_string() + " and " + ctx.input_name(0) + " " +
             dy.shape().to_string() + " must have one shape, of the rank of " + shape.to_string());
      }
      const int64_t dim = shape[static_cast<size_t>(axis)];
      std::vector<int64_t> out_strides(shape.size(), 1);
      for (size_t d = shape.size(); d-- > 1;) out_strides[d - 1] = out_strides[d] * shape[d];
      std::vector<int64_t> idx(shape.size(), 0);
      for (size_t p = 0; p < indices.size(); ++p) {
        int64_t offset = 0;
        for (size_t d = 0; d < shape.size(); ++d) {
          const int64_t c = static_cast<int64_t>(d) == axis ? resolve_index(indices[p], dim, ctx) : idx[d];
          if (c >= shape[d]) fail("indices " + ctx.input_name(1) + " exceed the data shape " + shape.to_string());
          offset += c * out_strides[d];
        }
        add(o[offset], g[p]);
        for (size_t d = shape.size(); d-- > 0;) {
          if (++idx[d] < ishape[d]) break;
          idx[d] = 0;
        }
      }
    } else {
      // GatherND: indices [b..., m..., k] address data [b..., k dims..., rest...].
      const auto bd = static_cast<size_t>(batch_dims);
      if (ishape.empty() || bd >= ishape.size() || bd > shape.size()) {
        fail("indices " + ctx.input_name(1) + " " + ishape.to_string() + " do not fit batch_dims " +
             std::to_string(batch_dims));
      }
      const int64_t k = ishape[ishape.size() - 1];
      if (k < 1 || bd + static_cast<size_t>(k) > shape.size()) {
        fail("indices " + ctx.input_name(1) + " have a last dim of " + std::to_string(k) + " for data " +
             shape.to_string());
      }
      const int64_t batch = shape.numel(0, bd);
      const int64_t per_batch = ishape.numel(bd, ishape.size() - 1);
      const int64_t slice = shape.numel(bd + static_cast<size_t>(k), shape.size());
      const int64_t batch_stride = shape.numel(bd, shape.size());
      if (dy.numel() != batch * per_batch * slice) {
        fail("input " + ctx.input_name(0) + " " + dy.shape().to_string() + " does not match GatherND of " +
             shape.to_string() + " by indices " + ishape.to_string());
      }
      for (int64_t b = 0; b < batch; ++b) {
        for (int64_t j = 0; j < per_batch; ++j) {
          const int64_t* tuple = indices.data() + (b * per_batch + j) * k;
          int64_t offset = 0;
          for (int64_t t = 0; t < k; ++t) {
            const int64_t dim = shape[bd + static_cast<size_t>(t)];
            offset = offset * dim + resolve_index(tuple[t], dim, ctx);
          }
          const T* src = g + (b * per_batch + j) * slice;
          T* dst = o + b * batch_stride + offset * slice;
          for (int64_t i = 0; i < slice; ++i) add(dst[i], src[i]);
        }
      }
    }
  });
}

}  // namespace

Shape shape_input(const KernelContext& ctx, int i) {
  const Tensor& t = ctx.input(i);
  if (t.dtype() != DataType::Int64 || t.rank() != 1) {
    fail("input " + ctx.input_name(i) + " must be a 1-D int64 shape, got " + t.description());
  }
  Shape s;
  for (int64_t d : t.to_int64_vector("shape")) {
    if (d < 0) fail("input " + ctx.input_name(i) + " has a negative dim");
    s.push_back(d);
  }
  return s;
}

void check_sum_to_shape(const Shape& g, const Shape& target, const std::string& g_name) {
  bool broadcasts = target.size() <= g.size();
  for (size_t d = 1; broadcasts && d <= target.size(); ++d) {
    const int64_t t = target[target.size() - d];
    broadcasts = t == 1 || t == g[g.size() - d];
  }
  if (!broadcasts) {
    fail("shape " + target.to_string() + " does not broadcast to the shape of " + g_name + " " + g.to_string());
  }
}

int64_t sum_to_shape_parts(const Shape& shape) {
  if (shape.empty()) return 1;
  const int64_t inner = shape[shape.size() - 1];
  const int64_t rows = inner ? shape.numel() / inner : 0;
  return std::max<int64_t>(1, std::min<int64_t>({static_cast<int64_t>(omp_get_max_threads()), shape.numel() / kParallelGrain, rows}));
}

void sum_to_shape_into(const Tensor& g, const Shape& target, Tensor& out) {
  // Output strides per G dim (0 where the dim is summed or padded on the left).
  const size_t rank = g.rank();
  const size_t pad = rank - target.size();
  std::vector<int64_t> stride(rank, 0);
  int64_t running = 1;
  for (size_t d = rank; d-- > pad;) {
    const int64_t t = target[d - pad];
    stride[d] = t == 1 ? 0 : running;
    running *= t;
  }
  const int64_t inner = rank ? g.dim(rank - 1) : 1;
  const int64_t inner_stride = rank ? stride[rank - 1] : 0;
  // Rows [r0, r1) of G summed into acc (the target's elements), odometer style from row r0.
  auto accumulate = [&]<class T, class C>(const T* src, int64_t r0, int64_t r1, C* acc) {
    std::vector<int64_t> index(rank, 0);
    int64_t base = 0;  // output offset of the current row
    for (size_t d = rank - 1, r = static_cast<size_t>(r0); d-- > 0;) {
      index[d] = static_cast<int64_t>(r % static_cast<size_t>(g.dim(d)));
      r /= static_cast<size_t>(g.dim(d));
      base += index[d] * stride[d];
    }
    for (int64_t r = r0; r < r1; ++r) {
      const T* row = src + r * inner;
      C* dst = acc + base;
      if (inner_stride) {
        for (int64_t i = 0; i < inner; ++i) dst[i] += static_cast<C>(row[i]);
      } else {
        C s = 0;
        for (int64_t i = 0; i < inner; ++i) s += static_cast<C>(row[i]);
        dst[0] += s;
      }
      for (size_t d = rank - 1; d-- > 0;) {
        base += stride[d];
        if (++index[d] < g.dim(d)) break;
        base -= stride[d] * g.dim(d);
        index[d] = 0;
      }
    }
  };
  // Large inputs: the rows split into one part per thread, each summed into its own
  // accumulator, the parts then added in order (BERT's bias gradients: [4096, 256] -> [256]).
  visit_dtype<NumericTypes>(g.dtype(), "SumToShape's input", [&]<class T>() {
    using C = compute_t<T>;
    const T* src = g.data<T>();
    const auto n = static_cast<size_t>(target.numel());
    const std::vector<C> acc = rank == 0 ? std::vector<C>{static_cast<C>(src[0])}
                                         : sum_row_ranges<C>(g.shape(), n, [&](int64_t, int64_t r0, int64_t r1, C* part) {
                                             accumulate.template operator()<T, C>(src, r0, r1, part);
                                           });
    T* o = out.data<T>();
    for (size_t i = 0; i < n; ++i) o[i] = convert<T>(acc[i]);
  });
}

std::unique_ptr<Kernel> make_sum_to_shape(const KernelInit&) { return make_kernel(sum_to_shape); }

std::unique_ptr<Kernel> make_relu_grad(const KernelInit&) {
  return make_kernel([](KernelContext& ctx) {
    const Tensor& y = ctx.input(0);
    const Tensor& dy = ctx.input(1);
    if (dy.dtype() != y.dtype() || !(dy.shape() == y.shape())) {
      fail("input " + ctx.input_name(1) + " is " + dy.description() + ", expected the type and shape of " +
           ctx.input_name(0) + " " + y.description());
    }
    visit_dtype<FloatTypes>(y.dtype(), "ReluGrad input " + ctx.input_name(0), [&]<class T>() {
      relu_grad<T>(y.data<T>(), dy.data<T>(), ctx.allocate_output(0, y.dtype(), y.shape()).template data<T>(),
                   y.numel());
    });
  });
}

std::unique_ptr<Kernel> make_gather_grad(const KernelInit& init) {
  const GatherKind kind = init.op_type() == "GatherGrad"           ? GatherKind::Gather
                          : init.op_type() == "GatherElementsGrad" ? GatherKind::Elements
                                                                   : GatherKind::ND;
  const int64_t axis = init.attr_int("axis", 0);
  const int64_t batch_dims = init.attr_int("batch_dims", 0);
  return make_kernel([=](KernelContext& ctx) { gather_grad(ctx, kind, axis, batch_dims); });
}

}  // namespace onnxtrain::ops
