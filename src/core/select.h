// Branch-free selection, for loops whose conditions are data-dependent and unpredictable
// (ReLU masks, the winner of a pooling window), where a branch mispredicts half the time.
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

namespace onnxtrain {

// c ? a : b through bit masks, for any trivially copyable type of 1, 2, 4 or 8 bytes.
template <class T>
inline T select_bits(bool c, T a, T b) {
  using U = std::conditional_t<sizeof(T) == 1, uint8_t,
                               std::conditional_t<sizeof(T) == 2, uint16_t,
                                                  std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>>;
  static_assert(sizeof(U) == sizeof(T));
  const U mask = static_cast<U>(U(0) - static_cast<U>(c));
  return std::bit_cast<T>(static_cast<U>((std::bit_cast<U>(a) & mask) | (std::bit_cast<U>(b) & static_cast<U>(~mask))));
}

}  // namespace onnxtrain
