// MaxUnpool (ai.onnx versions 9, 11, 22; ONNX operator doc "MaxUnpool" and the ONNX reference
// onnx/reference/ops/op_max_unpool.py) and its backward op MaxUnpoolGrad (ai.onnxtrain,
// version 1).
//
// MaxUnpool(X [N, C, D1..Dn], I (int64, X's shape), output_shape (optional, int64 [n + 2])) -> Y.
// The unpooled shape is [N, C, U1..Un] with U = (D - 1) * stride - (pad_begin + pad_end) +
// kernel (kernel_shape required; strides default 1, pads 0). Y starts as zeros of that shape
// and each X element is written at its flat index I (row-major over the whole unpooled tensor,
// as MaxPool's Indices); a later element wins a repeated index. With output_shape, Y has that
// shape (each dim >= the unpooled one) and holds the unpooled tensor at its beginning, as the
// reference and the backend tests define it. Indices outside [0, N*C*U1*..*Un) are an Error.
//
// MaxUnpoolGrad(dY, X, I) -> dX (MaxUnpool's attributes): dX[i] = dY at the position element i
// was written to, 0 for an element a later one overwrote.
#include <algorithm>
#include <vector>

#include "core/dispatch.h"
#include "ops/factories.h"
#include "ops/spatial_attrs.h"

namespace onnxtrain::ops {

namespace {

struct UnpoolAttrs {
  std::vector<int64_t> kernel, strides, pads;
};

UnpoolAttrs parse_unpool_attrs(const KernelInit& init) {
  UnpoolAttrs a;
  if (!init.has_attr("kernel_shape")) throw Error("required attribute 'kernel_shape' is missing");
  a.kernel = *ints_at_least(init, "kernel_shape", 1);
  const size_t nd = a.kernel.size();
  if (nd == 0) throw Error("attribute 'kernel_shape' is empty, expected one value per spatial dim");
  a.strides = spatial_values(ints_at_least(init, "strides", 1), "strides", nd, 1);
  a.pads = spatial_values(ints_at_least(init, "pads", 0), "pads", nd, 0, 2);
  return a;
}

// Position p of a row-major `from` shape as a flat index of row-major `to` (dims of `to` >=).
int64_t reindex(int64_t p, const Shape& from, const Shape& to) {
  int64_t out = 0, stride = 1;
  for (size_t d = from.size(); d-- > 0;) {
    out += (p % from[d]) * stride;
    p /= from[d];
    stride *= to[d];
  }
  return out;
}

class MaxUnpoolKernel final : public Kernel {
 public:
  MaxUnpoolKernel(UnpoolAttrs a, bool grad) : a_(std::move(a)), grad_(grad) {}

  void run(KernelContext& ctx) override {
    const int xi = grad_ ? 1 : 0;
    const Tensor& x = ctx.input(xi);
    const Tensor& ind = ctx.input(xi + 1);
    const size_t nd = a_.kernel.size();
    if (x.rank() != nd + 2) {
      fail("input " + ctx.input_name(xi) + " has shape " + x.shape().to_string() + ", expected rank " + std::to_string(nd + 2) +
           " for kernel_shape " + ints_to_string(a_.kernel));
    }
    if (ind.dtype() != DataType::Int64 || ind.shape() != x.shape()) {
      fail("indices " + ctx.input_name(xi + 1) + " are " + ind.description() + ", expected int64 " + x.shape().to_string());
    }
    Shape unpooled{x.dim(0), x.dim(1)};
    for (size_t d = 0; d < nd; ++d) {
      const int64_t u = (x.dim(d + 2) - 1) * a_.strides[d] - (a_.pads[d] + a_.pads[d + nd]) + a_.kernel[d];
      if (u < 0) fail("the unpooled size of spatial dim " + std::to_string(d) + " of " + ctx.input_name(xi) + " is negative");
      unpooled.push_back(u);
    }
    Shape out = unpooled;
    if (grad_) {
      out = ctx.input(0).shape();
    } else if (ctx.has_input(2)) {
      const Tensor& s = ctx.input(2);
      if (s.dtype() != DataType::Int64 || s.rank() != 1 || s.dim(0) != static_cast<int64_t>(nd + 2)) {
        fail("output_shape " + ctx.input_name(2) + " is " + s.description() + ", expected int64 [" + std::to_string(nd + 2) + "]");
      }
      out = Shape(s.to_int64_vector("output_shape"));
    }
    bool fits = out.size() == unpooled.size();
    for (size_t d = 0; fits && d < out.size(); ++d) fits = out[d] >= unpooled[d];
    if (!fits) {
      fail((grad_ ? "input " + ctx.input_name(0) + " has shape " : "output_shape is ") + out.to_string() +
           ", expected the rank and at least the dims of the unpooled shape " + unpooled.to_string());
    }
    const std::vector<int64_t> idx = ind.to_int64_vector("indices");
    const int64_t total = unpooled.numel();
    for (int64_t i : idx) {
      if (i < 0 || i >= total) {
        fail("indices " + ctx.input_name(xi + 1) + " hold " + std::to_string(i) + ", outside [0, " + std::to_string(total) +
             ") for the unpooled shape " + unpooled.to_string());
      }
    }
    if (grad_) {
      const Tensor& dy = ctx.input(0);
      if (dy.dtype() != x.dtype()) fail("input " + ctx.input_name(0) + " is " + dy.description() + ", expected " + std::string(dtype_name(x.dtype())));
      // The element that wrote each position last.
      std::vector<int64_t> writer(static_cast<size_t>(total), -1);
      for (size_t i = 0; i < idx.size(); ++i) writer[static_cast<size_t>(idx[i])] = static_cast<int64_t>(i);
      Tensor& dx = ctx.allocate_output(0, x.dtype(), x.shape());
      visit_dtype<FloatTypes>(x.dtype(), "MaxUnpoolGrad input " + ctx.input_name(0), [&]<class T>() {
        const T* g = dy.data<T>();
        T* p = dx.data<T>();
        for (size_t i = 0; i < idx.size(); ++i) {
          const bool kept = writer[static_cast<size_t>(idx[i])] == static_cast<int64_t>(i);
          p[i] = kept ? g[reindex(idx[i], unpooled, out)] : T(0.0f);
        }
      });
      return;
    }
    Tensor& y = ctx.allocate_output(0, x.dtype(), out);
    visit_dtype<FloatTypes>(x.dtype(), "MaxUnpool input " + ctx.input_name(0), [&]<class T>() {
      T* p = y.data<T>();
      std::fill(p, p + y.numel(), T(0.0f));
      const T* px = x.data<T>();
      for (size_t i = 0; i < idx.size(); ++i) p[reindex(idx[i], unpooled, out)] = px[i];
    });
  }

 private:
  UnpoolAttrs a_;
  bool grad_;
};

}  // namespace

std::unique_ptr<Kernel> make_max_unpool(const KernelInit& init) {
  return std::make_unique<MaxUnpoolKernel>(parse_unpool_attrs(init), init.op_type() == "MaxUnpoolGrad");
}

}  // namespace onnxtrain::ops
