// CumProd (ONNX operator doc, ai.onnx opset 26): the running product of x along `axis`.
//
// CumProd(x, axis) -> y shaped like x; x is uint32, uint64, int32, int64, float16, bfloat16,
// float32 or float64; axis an int32/int64 scalar (0-D, or 1-D of one element as CumSum takes)
// in [-r, r-1]. y[j] = prod_{k <= j} x[k] along the axis; exclusive=1 leaves x[j] out (the first
// product is 1); reverse=1 runs from the end. Floating products are formed in float32
// (float16/bfloat16/float32) or float64; integer products wrap modulo 2^64 and are cast to the
// element type (two's complement, numpy's result when they overflow).
#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/factories.h"

namespace onnxtrain::ops {

namespace {

using CumProdTypes = TypeList<uint32_t, uint64_t, int32_t, int64_t, Float16, BFloat16, float, double>;

class CumProd final : public Kernel {
 public:
  explicit CumProd(const KernelInit& init)
      : exclusive_(flag(init, "exclusive")), reverse_(flag(init, "reverse")) {}

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const auto axis = static_cast<size_t>(normalize_axis(int_scalar(ctx, 1, "axis"), static_cast<int64_t>(x.rank()),
                                                         "CumProd input " + ctx.input_name(1) + " (axis)"));
    const int64_t outer = x.shape().numel(0, axis), n = x.dim(axis), inner = x.shape().numel(axis + 1, x.rank());
    Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
    if (y.numel() == 0) return;
    visit_dtype<CumProdTypes>(x.dtype(), "CumProd input " + ctx.input_name(0), [&]<class T>() {
      using A = std::conditional_t<is_float_v<T>, compute_t<T>, uint64_t>;
      const T* xs = x.data<T>();
      T* ys = y.data<T>();
      // Blocks of `inner` contiguous columns advance together, one row of the axis at a time.
      const int64_t step = reverse_ ? -1 : 1;
      parallel_for(outer, std::max<int64_t>(1, kParallelGrain / (n * inner)), [&](int64_t b, int64_t e) {
        std::vector<A> acc(static_cast<size_t>(inner));
        for (int64_t o = b; o < e; ++o) {
          std::fill(acc.begin(), acc.end(), A(1));
          int64_t k = reverse_ ? n - 1 : 0;
          for (int64_t t = 0; t < n; ++t, k += step) {
            const T* xr = xs + (o * n + k) * inner;
            T* yr = ys + (o * n + k) * inner;
            for (int64_t j = 0; j < inner; ++j) {
              const A before = acc[static_cast<size_t>(j)];
              acc[static_cast<size_t>(j)] = before * static_cast<A>(static_cast<compute_t<T>>(xr[j]));
              yr[j] = static_cast<T>(static_cast<compute_t<T>>(exclusive_ ? before : acc[static_cast<size_t>(j)]));
            }
          }
        }
      });
    });
  }

 private:
  static bool flag(const KernelInit& init, const char* name) {
    const int64_t v = init.attr_int(name, 0);
    if (v != 0 && v != 1) {
      throw Error(std::string("CumProd attribute '") + name + "' must be 0 or 1, got " + std::to_string(v));
    }
    return v == 1;
  }

  bool exclusive_;
  bool reverse_;
};

}  // namespace

std::unique_ptr<Kernel> make_cumprod(const KernelInit& init) { return std::make_unique<CumProd>(init); }

}  // namespace onnxtrain::ops
