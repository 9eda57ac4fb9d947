// Fixed-width float vectors for loops GCC does not vectorize on its own: the 2x2 pools
// (ops/pool.cpp, ops/pool_grad.cpp) read and write pairs of adjacent elements over rows as short
// as 7 outputs, where GCC left scalar compare-and-select code that branched unpredictably (the
// 2x2 MaxPool over 128x32x28x28 random floats: 9.9 ms that way, 0.7 ms with these, one thread).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace onnxtrain::simd {

// Floats<W>: W floats as one value (GCC vector extension), one AVX register for W = 8 where the
// build has AVX, else the compiler splits it. Arithmetic, comparisons (lane masks) and
// mask ? a : b work lane by lane.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"  // inline helpers: no vector crosses a real call
template <int W>
struct FloatVector {
  typedef float type __attribute__((vector_size(4 * W)));  // an alias would drop the attribute
};
template <int W>
using Floats = typename FloatVector<W>::type;

template <int W>
inline Floats<W> load(const float* p) {
  Floats<W> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <int W>
inline void store(float* p, Floats<W> v) {
  std::memcpy(p, &v, sizeof v);
}

// Masks<W>: the lane masks comparisons of Floats<W> give (all bits set where true, 0 where false).
template <int W>
using Masks = decltype(Floats<W>{} < Floats<W>{});

// The 8 lanes of a mask as the bits of one byte, lane l in bit l (vmovmskps where the build has
// AVX; GCC turns a float-to-byte vector conversion into a scalar one per lane).
inline uint8_t mask_bits(Masks<8> m) {
#if defined(__AVX__)
  return static_cast<uint8_t>(__builtin_ia32_movmskps256((Floats<8>)m));  // a bit cast: same size
#else
  uint8_t bits = 0;
  for (int l = 0; l < 8; ++l) bits = static_cast<uint8_t>(bits | ((m[l] & 1) << l));
  return bits;
#endif
}

// The inverse of mask_bits: lane l set where bit l of `bits` is.
inline Masks<8> bits_mask(uint8_t bits) {
  const Masks<8> lane = {1, 2, 4, 8, 16, 32, 64, 128};
  return ((Masks<8>{} + bits) & lane) != Masks<8>{};
}

// Every other element of the 2W floats (a, b), from element kFirst: 0 for the even ones, 1 for
// the odd ones.
template <int W, int kFirst>
inline Floats<W> every_other(Floats<W> a, Floats<W> b) {
  constexpr int f = kFirst;
  if constexpr (W == 8) {
    return __builtin_shufflevector(a, b, f, f + 2, f + 4, f + 6, f + 8, f + 10, f + 12, f + 14);
  } else {
    static_assert(W == 4);
    return __builtin_shufflevector(a, b, f, f + 2, f + 4, f + 6);
  }
}
template <int W>
inline Floats<W> evens(Floats<W> a, Floats<W> b) {
  return every_other<W, 0>(a, b);
}
template <int W>
inline Floats<W> odds(Floats<W> a, Floats<W> b) {
  return every_other<W, 1>(a, b);
}
// The first (half 0) or last (half 1) W floats of e0 o0 e1 o1 ...: the inverse of evens / odds.
template <int W, int kHalf>
inline Floats<W> interleave(Floats<W> e, Floats<W> o) {
  if constexpr (W == 8) {
    if constexpr (kHalf == 0) return __builtin_shufflevector(e, o, 0, 8, 1, 9, 2, 10, 3, 11);
    return __builtin_shufflevector(e, o, 4, 12, 5, 13, 6, 14, 7, 15);
  } else {
    static_assert(W == 4);
    if constexpr (kHalf == 0) return __builtin_shufflevector(e, o, 0, 4, 1, 5);
    return __builtin_shufflevector(e, o, 2, 6, 3, 7);
  }
}

// The lane sums of eight vectors, [sum(v[0]), ..., sum(v[7])], each a pairwise tree
// ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)): three rounds of evens + odds instead of
// 64 scalar additions (ops/rnn.cpp's dot products at batch 1).
inline Floats<8> lane_sums(const Floats<8> (&v)[8]) {
  // Adjacent lanes of (a, b) added: a's four pair sums, then b's.
  const auto pair_sums = [](Floats<8> a, Floats<8> b) { return evens<8>(a, b) + odds<8>(a, b); };
  const Floats<8> quads[2] = {pair_sums(pair_sums(v[0], v[1]), pair_sums(v[2], v[3])),
                              pair_sums(pair_sums(v[4], v[5]), pair_sums(v[6], v[7]))};
  return pair_sums(quads[0], quads[1]);
}

// Calls f.template operator()<W>(s) for chunks [s, s + W) covering [0, n), W = 8 when n >= 8,
// else 4; the last chunk starts at n - W and may overlap the one before, so f must write the
// same values whenever it covers an index twice. Requires n >= 4.
template <class F>
inline void cover_in_chunks(int64_t n, F&& f) {
  const auto run = [&]<int W>() {
    for (int64_t s = 0; s < n; s += W) f.template operator()<W>(std::min<int64_t>(s, n - W));
  };
  if (n >= 8) {
    run.template operator()<8>();
  } else {
    run.template operator()<4>();
  }
}
#pragma GCC diagnostic pop

}  // namespace onnxtrain::simd
