// Dtype dispatch: run a templated lambda with the C++ element type of a runtime DataType.
//
//   visit_dtype<FloatTypes>(x.dtype(), "Sqrt input 'x'", [&]<class T>() { ... });
//
// A dtype outside the list is an Error naming `what`.
#pragma once

#include <string>
#include <string_view>

#include "onnxtrain/dtype.h"
#include "onnxtrain/error.h"

namespace onnxtrain {

template <class... Ts>
struct TypeList {};

using FloatTypes = TypeList<float, double, Float16, BFloat16>;
using SignedIntTypes = TypeList<int8_t, int16_t, int32_t, int64_t>;
using UnsignedIntTypes = TypeList<uint8_t, uint16_t, uint32_t, uint64_t>;
using IntTypes = TypeList<int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t>;
using NumericTypes = TypeList<float, double, Float16, BFloat16, int8_t, int16_t, int32_t, int64_t,
                              uint8_t, uint16_t, uint32_t, uint64_t>;
using SignedNumericTypes =
    TypeList<float, double, Float16, BFloat16, int8_t, int16_t, int32_t, int64_t>;
using AllTypes = TypeList<float, double, Float16, BFloat16, int8_t, int16_t, int32_t, int64_t,
                          uint8_t, uint16_t, uint32_t, uint64_t, bool>;
using IndexTypes = TypeList<int32_t, int64_t>;
// The narrow storage types (dtype.h): no kernel computes in them; they are converted (Cast,
// QuantizeLinear, DequantizeLinear) or copied.
using Float8Types = TypeList<Float8E4M3FN, Float8E4M3FNUZ, Float8E5M2, Float8E5M2FNUZ>;
using NarrowFloatTypes = TypeList<Float8E4M3FN, Float8E4M3FNUZ, Float8E5M2, Float8E5M2FNUZ,
                                  Float8E8M0, Float4E2M1, Float6E2M3, Float6E3M2>;
using SubByteIntTypes = TypeList<UInt4, Int4, UInt2, Int2>;
// Every type a Tensor can hold: AllTypes and the narrow types.
using TensorTypes = TypeList<float, double, Float16, BFloat16, int8_t, int16_t, int32_t, int64_t,
                             uint8_t, uint16_t, uint32_t, uint64_t, bool, Float8E4M3FN,
                             Float8E4M3FNUZ, Float8E5M2, Float8E5M2FNUZ, Float8E8M0, Float4E2M1,
                             Float6E2M3, Float6E3M2, UInt4, Int4, UInt2, Int2>;

[[noreturn]] void throw_unsupported_dtype(DataType dtype, std::string_view what);

template <class... Ts, class F>
void visit_dtype_impl(TypeList<Ts...>, DataType dtype, std::string_view what, F&& f) {
  const bool matched = ((dtype == dtype_of<Ts> ? (f.template operator()<Ts>(), true) : false) || ...);
  if (!matched) throw_unsupported_dtype(dtype, what);
}

template <class List, class F>
void visit_dtype(DataType dtype, std::string_view what, F&& f) {
  visit_dtype_impl(List{}, dtype, what, std::forward<F>(f));
}

// Converts between element types: float16/bfloat16 go through float; to bool is "!= 0";
// floating to integer truncates toward zero and saturates at the target's limits (NaN -> 0),
// which keeps out-of-range values defined. Narrow floats go through float (from) or double
// (to, with dtype.h's default NarrowFloatCast: saturating); to int4/uint4/int2/uint2 rounds to
// the nearest integer, ties to even, and keeps the low bits (int4.md), as integer sources do.
template <class To, class From>
inline To convert(From v);

}  // namespace onnxtrain

#include "core/convert.inl"
