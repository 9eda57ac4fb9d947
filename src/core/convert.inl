// Implementation of onnxtrain::convert (included by core/dispatch.h).
#pragma once

#include <cmath>
#include <limits>
#include <type_traits>

namespace onnxtrain {

namespace detail {
// The value of one element in a type C++ computes with: float16/bfloat16 and the narrow floats
// as float (exact), the sub-byte integers as their int8/uint8 value.
template <class T>
inline auto widen(T v) {
  if constexpr (is_half_v<T> || is_narrow_float_v<T>) {
    return static_cast<float>(v);
  } else if constexpr (is_sub_byte_int_v<T>) {
    return v.value;
  } else {
    return v;
  }
}
}  // namespace detail

template <class To, class From>
inline To convert(From from) {
  if constexpr (std::is_same_v<To, From>) {
    return from;
  } else {
    const auto v = detail::widen(from);
    using V = decltype(v);
    if constexpr (std::is_same_v<To, bool>) {
      return v != V(0);
    } else if constexpr (is_half_v<To>) {
      return To(static_cast<float>(v));
    } else if constexpr (is_narrow_float_v<To>) {
      return To(static_cast<double>(v));  // saturating, E8M0 rounding up: Cast's defaults
    } else if constexpr (is_sub_byte_int_v<To>) {
      // int4.md, int2.md: round to the nearest integer (ties to even), keep the low bits.
      if constexpr (std::is_floating_point_v<V>) {
        if (std::isnan(v)) return To{};
        const double r = std::nearbyint(static_cast<double>(v));
        constexpr double limit = 9.2e18;  // within int64; only the low bits matter
        return To::wrap(static_cast<int64_t>(r < -limit ? -limit : (r > limit ? limit : r)));
      } else {
        return To::wrap(static_cast<int64_t>(v));
      }
    } else if constexpr (std::is_floating_point_v<To>) {
      return static_cast<To>(v);
    } else if constexpr (std::is_floating_point_v<V>) {
      // Floating to integer: truncate, saturate, NaN -> 0.
      if (std::isnan(v)) return To(0);
      constexpr double lo = static_cast<double>(std::numeric_limits<To>::lowest());
      constexpr double hi = static_cast<double>(std::numeric_limits<To>::max());
      const double d = static_cast<double>(v);
      if (d <= lo) return std::numeric_limits<To>::lowest();
      if (d >= hi) return std::numeric_limits<To>::max();
      return static_cast<To>(d);
    } else {
      return static_cast<To>(v);  // integer to integer wraps (two's complement), as numpy does
    }
  }
}

}  // namespace onnxtrain
