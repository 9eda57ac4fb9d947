// The lane code of core/vector_math.h, included by vector_math.cpp (kW = 8) and by
// vector_math_avx512.cpp (kW = 16, compiled for x86-64-v4), each time inside an anonymous
// namespace that defines `constexpr int kW` first. It calls no library function or template: an
// inline function of a library header instantiated here would be compiled with the including
// file's instruction set, and the linker may keep that copy for every caller (an AVX-512
// std::copy run on a CPU without AVX-512).
//
// Range reduction and polynomials on kW floats, every branch computed in every lane and the
// result selected by masks. NaN survives every step because each clamp and selection is written
// as `compare ? constant : x`, false for NaN.

typedef float V __attribute__((vector_size(4 * kW)));
typedef uint32_t U __attribute__((vector_size(4 * kW)));

inline V load(const float* p) {
  V v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, V v) { __builtin_memcpy(p, &v, sizeof v); }

inline V splat(float v) { return V{} + v; }
inline V abs_of(V x) { return __builtin_bit_cast(V, __builtin_bit_cast(U, x) & 0x7fffffffu); }
// |y| with the sign bit of x (y must be >= 0 or NaN).
inline V with_sign_of(V x, V y) {
  return __builtin_bit_cast(V, __builtin_bit_cast(U, y) | (__builtin_bit_cast(U, x) & 0x80000000u));
}

// c[0] t^(N-1) + c[1] t^(N-2) + ... + c[N-1], by Horner's rule.
template <size_t N>
inline V horner(V t, const float (&c)[N]) {
  V p = splat(c[0]);
  for (size_t i = 1; i < N; ++i) p = p * t + c[i];
  return p;
}

// 1.5 * 2^23: adding it to a float of magnitude below 2^22 rounds that float to an integer k and
// leaves k + bits(kShift) in the sum's bit pattern.
constexpr float kShift = 12582912.0f;

// 2^k for integer-valued k in [-126, 127] (k is NaN only where the caller's result is NaN
// anyway): k + 127 lands in the low bits of k + 127 + kShift, and shifting left by 23 drops
// kShift's bits (all at positions >= 22) and makes k + 127 the exponent field.
inline V pow2(V k) {
  return __builtin_bit_cast(V, __builtin_bit_cast(U, k + (kShift + 127.0f)) << 23);
}

// e^x in every lane, to within 1 ulp (see vector_math.h).
inline V exp_lanes(V x) {
  // Beyond these e^x is inf (e^89 > FLT_MAX) or rounds to 0 (e^-104 < 2^-150); clamping keeps
  // n below in [-150, 128] so that 2^n splits into two normal powers.
  x = x > 89.0f ? splat(89.0f) : x;
  x = x < -104.0f ? splat(-104.0f) : x;
  // x = n ln2 + r, n = round(x / ln2), |r| <= ln2 / 2 (plus rounding); ln2 in two parts (Cody and
  // Waite): the high part 0.693359375 has 9 significant bits, so n * it is exact (Cephes expf's
  // C1 and C2).
  const V n = (x * 1.44269504088896341f + kShift) - kShift;
  const V r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  // e^r = 1 + r + r^2 P(r): Cephes expf's minimax coefficients (Stephen L. Moshier, Cephes Math
  // Library, expf.c).
  static constexpr float kP[] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
  const V er = horner(r, kP) * (r * r) + r + 1.0f;
  // e^x = e^r * 2^n1 * 2^n2 with n1 + n2 = n: the first product is exact, the second rounds once,
  // also into the subnormals or to inf.
  const V n1 = (n * 0.5f + kShift) - kShift;
  return er * pow2(n1) * pow2(n - n1);
}

inline V sigmoid_lanes(V x) {
  // e = e^-|x| <= 1 never overflows: 1 / (1 + e) for x >= 0, e / (1 + e) = e^x / (1 + e^x)
  // for x < 0, which stays accurate where the result is subnormal.
  const V e = exp_lanes(-abs_of(x));
  return (x >= 0.0f ? splat(1.0f) : e) / (1.0f + e);
}

inline V tanh_lanes(V x) {
  const V a = abs_of(x);
  // |x| < 0.625: tanh(a) = a + a^3 P(a^2), Cephes tanhf's coefficients (Moshier, tanhf.c).
  static constexpr float kP[] = {-5.70498872745e-3f, 2.06390887954e-2f, -5.37397155531e-2f,
                                 1.33314422036e-1f, -3.33332819422e-1f};
  const V s = a * a;
  const V small = horner(s, kP) * s * a + a;
  // Otherwise tanh(a) = 1 - q, q = 2 / (e^2a + 1) <= 0.45: q's error of about an ulp of its
  // own binade is at most half an ulp of the result's. e^2a = inf for large a gives exactly 1.
  const V large = 1.0f - 2.0f / (exp_lanes(a + a) + 1.0f);
  return with_sign_of(x, a < 0.625f ? small : large);
}

inline V erf_lanes(V x) {
  // erf(a) rounds to 1 for a >= 3.92 (erfc(3.92) < 2^-25), so a is clamped to 4 (NaN stays).
  V a = abs_of(x);
  a = a > 4.0f ? splat(4.0f) : a;
  const V s = a * a;
  // a < 1: erf(a) = a + a Q(a^2), Q + 1 of degree 6 fitted to erf(a)/a on [0, 1] by iteratively
  // reweighted least squares in float64 toward the minimax relative error (fit error 1.2e-9).
  // Adding a last keeps a exact: the rounding errors of a Q, |Q| <= 0.16, shrink with it.
  static constexpr float kQ[] = {7.85407756e-05f, -8.01025773e-04f, 5.18833473e-03f,
                                 -2.68538147e-02f, 1.12835854e-01f,  -3.76126260e-01f,
                                 1.28379166e-01f};
  const V small = a * horner(s, kQ) + a;
  // 1 <= a <= 4: erf(a) = 1 - e^(-a^2) R(a), R = erfc(a) e^(a^2) (the scaled complementary
  // error function, smooth and entire), fitted the same way by a degree-11 polynomial in
  // t = (2a - 5) / 3 on [1, 4] (relative fit error 2.8e-8). e^(-a^2) R(a) <= 0.16, so the
  // subtraction adds at most 0.16 of its relative error.
  static constexpr float kR[] = {-3.43548891e-05f, 9.59827739e-05f, -1.50963577e-04f,
                                 3.68914509e-04f,  -1.01018057e-03f, 2.42497958e-03f,
                                 -5.57032507e-03f, 1.24843549e-02f,  -2.70052012e-02f,
                                 5.61109185e-02f,  -1.11521028e-01f, 2.10806355e-01f};
  const V t = a * (2.0f / 3.0f) - 5.0f / 3.0f;
  const V large = 1.0f - exp_lanes(-s) * horner(t, kR);
  return with_sign_of(x, a < 1.0f ? small : large);
}

// Gelu's standard normal distribution in every lane (Gelu-20, approximate "none"): Phi(x), the
// cumulative distribution 0.5 erfc(-x / sqrt 2), and e^(-x^2 / 2), the density times sqrt(2 pi).
// For a = |x| / sqrt 2: erfc(a) = e^(-a^2) t P(u), t = 1 / (1 + 0.4 a), u = 2.5 t - 1.5, P of
// degree 9 fitted to erfc(a) e^(a^2) / t over a in [0, 10] (u in [-1, 1]) by iteratively
// reweighted least squares in float64 toward the minimax relative error (7.9e-9; 3.1e-8 with the
// coefficients rounded to float). Phi = 1 - erfc / 2 for x > 0 and erfc / 2 otherwise: neither
// subtracts nearly equal numbers, so Phi keeps its relative accuracy down the lower tail, where
// 0.5 (1 + erf(x / sqrt 2)) loses it (at x = -5, 1 + erf is 5.7e-7, a few ulp of 1). Beyond
// a = 10 (x < -14.1) Phi < 2^-149 whatever t is, so a is clamped there (NaN stays). The rounding
// of x^2 adds up to x^2 / 2 ulp to e^(-x^2 / 2), which only matters in the lower tail.
struct NormalLanes {
  V cdf;      // Phi(x)
  V density;  // e^(-x^2 / 2)
};
inline NormalLanes normal_lanes(V x) {
  V a = abs_of(x) * 0.707106781f;
  a = a > 10.0f ? splat(10.0f) : a;
  static constexpr float kP[] = {-7.758160791e-06f, 2.503727774e-05f, 1.115906853e-04f, -3.627388796e-04f,
                                 -1.768548856e-03f, 2.829320729e-03f,  3.888050094e-02f, 1.440484077e-01f,
                                 3.224317431e-01f,  4.938124716e-01f};
  const V t = 1.0f / (1.0f + 0.4f * a);
  const V e = exp_lanes(-0.5f * (x * x));
  const V half_erfc = (0.5f * e) * (t * horner(t * 2.5f - 1.5f, kP));
  return {x > 0.0f ? 1.0f - half_erfc : half_erfc, e};
}

// x Phi(x).
inline V gelu_lanes(V x) { return x * normal_lanes(x).cdf; }

// dy (Phi(x) + x phi(x)), phi(x) = e^(-x^2 / 2) / sqrt(2 pi).
inline V gelu_backward_lanes(V dy, V x) {
  const NormalLanes n = normal_lanes(x);
  return dy * (n.cdf + x * (n.density * 0.398942280f));
}

// y[i] = f(x[i]) kW lanes at a time; the last n % kW elements through a zero-padded buffer, so
// that in-place calls never read an element already written.
template <class F>
inline void apply(const float* x, float* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + kW <= n; i += kW) store(y + i, f(load(x + i)));
  if (i == n) return;
  float buffer[kW] = {};
  __builtin_memcpy(buffer, x + i, static_cast<size_t>(n - i) * sizeof(float));
  store(buffer, f(load(buffer)));
  __builtin_memcpy(y + i, buffer, static_cast<size_t>(n - i) * sizeof(float));
}


// y[i] = f(a[i], b[i]) as apply: y may be a or b, no other overlap.
template <class F>
inline void apply2(const float* a, const float* b, float* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + kW <= n; i += kW) store(y + i, f(load(a + i), load(b + i)));
  if (i == n) return;
  float buffer_a[kW] = {}, buffer_b[kW] = {};
  __builtin_memcpy(buffer_a, a + i, static_cast<size_t>(n - i) * sizeof(float));
  __builtin_memcpy(buffer_b, b + i, static_cast<size_t>(n - i) * sizeof(float));
  store(buffer_a, f(load(buffer_a), load(buffer_b)));
  __builtin_memcpy(y + i, buffer_a, static_cast<size_t>(n - i) * sizeof(float));
}

// The array functions of core/vector_math.h at kW lanes.
void exp_n(const float* x, float* y, int64_t n) {
  apply(x, y, n, [](V v) { return exp_lanes(v); });
}
void sigmoid_n(const float* x, float* y, int64_t n) {
  apply(x, y, n, [](V v) { return sigmoid_lanes(v); });
}
void tanh_n(const float* x, float* y, int64_t n) {
  apply(x, y, n, [](V v) { return tanh_lanes(v); });
}
void erf_n(const float* x, float* y, int64_t n) {
  apply(x, y, n, [](V v) { return erf_lanes(v); });
}
void gelu_n(const float* x, float* y, int64_t n) {
  apply(x, y, n, [](V v) { return gelu_lanes(v); });
}
void gelu_backward_n(const float* dy, const float* x, float* dx, int64_t n) {
  apply2(dy, x, dx, n, [](V g, V v) { return gelu_backward_lanes(g, v); });
}
