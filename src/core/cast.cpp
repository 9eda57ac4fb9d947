// Tensor casts between every pair of tensor types (core/cast.h).
#include "core/cast.h"

#include <cassert>

#include "core/dispatch.h"
#include "core/parallel.h"

namespace onnxtrain {

namespace {

template <class To, class From>
void cast_loop(const From* src, To* dst, int64_t n, const NarrowFloatCast& how) {
  parallel_for(n, kParallelGrain, [&](int64_t begin, int64_t end) {
    if constexpr (is_narrow_float_v<To> && !std::is_same_v<To, From>) {
      for (int64_t i = begin; i < end; ++i) {
        const double v = static_cast<double>(detail::widen(src[i]));
        dst[i] = To::from_bits(narrow_float_bits(To::dtype, v, how));
      }
    } else {
      for (int64_t i = begin; i < end; ++i) dst[i] = convert<To>(src[i]);
    }
  });
}

}  // namespace

void cast_into(const Tensor& src, Tensor& dst, const NarrowFloatCast& how) {
  assert(src.numel() == dst.numel());
  visit_dtype<TensorTypes>(src.dtype(), "cast source", [&]<class From>() {
    visit_dtype<TensorTypes>(dst.dtype(), "cast target", [&]<class To>() {
      cast_loop<To, From>(src.data<From>(), dst.data<To>(), src.numel(), how);
    });
  });
}

}  // namespace onnxtrain
