// Unit tests of core/vector_math.h: the error of each array function against the same function
// in float64 (glibc's double exp/tanh/erf, far more accurate than a float ulp) over dense sweeps
// and random floats, the special values, and the tails and in-place calls; each test for every
// lane count the build and CPU run (vmath::available_lanes(): the 8-lane variant, and the 16-lane
// AVX-512 one where it runs).
#include "core/vector_math.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace onnxtrain {
namespace {

using ArrayFunction = void (*)(const float*, float*, int64_t);

struct Case {
  std::string name;
  ArrayFunction f;
  double (*reference)(double);
  double max_ulps;  // the bound core/vector_math.h documents
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"exp", vmath::exp, [](double x) { return std::exp(x); }, 1.5},
      {"sigmoid", vmath::sigmoid, [](double x) { return 1.0 / (1.0 + std::exp(-x)); }, 2.5},
      {"tanh", vmath::tanh, [](double x) { return std::tanh(x); }, 2.0},
      {"erf", vmath::erf, [](double x) { return std::erf(x); }, 1.5},
  };
  return all;
}

// The one-input functions: cases() and gelu (whose bound depends on x: its own test below).
std::vector<Case> unary_functions() {
  std::vector<Case> all = cases();
  all.push_back({"gelu", vmath::gelu, nullptr, 0});
  return all;
}

// Each test of the suite runs once per lane count, in a process set to it.
class VectorMath : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { vmath::set_lanes(GetParam()); }
  void TearDown() override { vmath::set_lanes(vmath::available_lanes().back()); }  // the default
};

std::string lanes_name(const ::testing::TestParamInfo<int>& info) { return std::to_string(info.param) + "_lanes"; }

INSTANTIATE_TEST_SUITE_P(Lanes, VectorMath, ::testing::ValuesIn(vmath::available_lanes()), lanes_name);

TEST(VectorMathLanes, TheWidestVariantIsTheDefaultAndOthersAreRefused) {
  const std::vector<int> lanes = vmath::available_lanes();
  ASSERT_FALSE(lanes.empty());
  EXPECT_EQ(lanes.front(), 8);
  EXPECT_EQ(vmath::lanes(), lanes.back());
  EXPECT_THROW(vmath::set_lanes(4), std::invalid_argument);
  EXPECT_THROW(vmath::set_lanes(32), std::invalid_argument);
  if (lanes.size() == 1) {
    EXPECT_THROW(vmath::set_lanes(16), std::invalid_argument);
  }
  vmath::set_lanes(8);
  EXPECT_EQ(vmath::lanes(), 8);
  vmath::set_lanes(lanes.back());
#if defined(ONNXTRAIN_NATIVE_BUILD)
  // Where the CPU runs AVX-512 a native build (x86-64-v3, tests/CMakeLists.txt) must have built
  // the variant: GCC 12 and clang 14, which scripts/setup-deps installs, take -march=x86-64-v4.
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512cd") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2")) {
    EXPECT_EQ(lanes.back(), 16);
  }
#endif
}

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The inputs of the sweeps: every multiple of 2^-10 in [-100, 100]; 512 evenly spaced floats in
// every binade from 2^-149 (the subnormals) to 2^7, both signs; 10^6 random bit patterns that are
// not NaN (NaN is checked on its own).
std::vector<float> sweep_inputs() {
  std::vector<float> xs;
  for (int k = -100 * 1024; k <= 100 * 1024; ++k) xs.push_back(static_cast<float>(k) / 1024.0f);
  for (int e = -149; e <= 7; ++e) {
    for (int m = 0; m < 512; ++m) {
      const float x = std::ldexp(1.0f + static_cast<float>(m) / 512.0f, e);
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  std::mt19937 rng(18);
  while (xs.size() < 1'600'000) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    if (!std::isnan(x)) xs.push_back(x);
  }
  return xs;
}

// |y - exact| in units of the last place of float at the exact value's binade (2^-149 below
// FLT_MIN); infinite where y is not the float the exact value rounds to beyond FLT_MAX.
double ulp_error(float y, double exact) {
  const float rounded = static_cast<float>(exact);
  if (std::isinf(rounded) || std::isinf(y)) return y == rounded ? 0.0 : kInf;
  if (exact == 0.0) return y == 0.0f ? 0.0 : std::abs(static_cast<double>(y)) / std::ldexp(1.0, -149);
  const double ulp = std::ldexp(1.0, std::max(std::ilogb(exact) - 23, -149));
  return std::abs(static_cast<double>(y) - exact) / ulp;
}

TEST_P(VectorMath, ErrorAgainstFloat64WithinTheDocumentedUlps) {
  const std::vector<float> xs = sweep_inputs();
  std::vector<float> ys(xs.size());
  for (const Case& c : cases()) {
    c.f(xs.data(), ys.data(), static_cast<int64_t>(xs.size()));
    double worst = 0;
    float worst_x = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const double e = ulp_error(ys[i], c.reference(static_cast<double>(xs[i])));
      if (!(e <= worst)) worst = e, worst_x = xs[i];
    }
    std::printf("%-8s %d lanes: max error %.3f ulp at x = %a\n", c.name.c_str(), vmath::lanes(), worst, static_cast<double>(worst_x));
    EXPECT_LE(worst, c.max_ulps) << c.name << " at x = " << worst_x;
  }
}

std::vector<float> apply(ArrayFunction f, std::vector<float> xs) {
  std::vector<float> ys(xs.size());
  f(xs.data(), ys.data(), static_cast<int64_t>(xs.size()));
  return ys;
}

TEST_P(VectorMath, NaNInGivesNaNOut) {
  const float negative_nan = -kNaN;
  const float payload_nan = std::bit_cast<float>(0x7fc12345u);
  const float signalling_nan = std::numeric_limits<float>::signaling_NaN();
  for (const Case& c : unary_functions()) {
    // Mixed with ordinary lanes, and in the tail.
    const std::vector<float> ys =
        apply(c.f, {kNaN, 1.0f, negative_nan, -3.0f, payload_nan, 0.5f, signalling_nan, 100.0f, kNaN});
    for (int i : {0, 2, 4, 6, 8}) EXPECT_TRUE(std::isnan(ys[i])) << c.name << " lane " << i;
    for (int i : {1, 3, 5, 7}) EXPECT_FALSE(std::isnan(ys[i])) << c.name << " lane " << i;
  }
}

TEST_P(VectorMath, InfinitiesOverflowAndUnderflow) {
  EXPECT_EQ(apply(vmath::exp, {-kInf, kInf, 100.0f, 88.73f, -104.0f, -200.0f, 0.0f, -0.0f}),
            (std::vector<float>{0.0f, kInf, kInf, kInf, 0.0f, 0.0f, 1.0f, 1.0f}));
  // The largest finite e^x and the smallest subnormal one are still produced.
  const std::vector<float> edge = apply(vmath::exp, {88.72f, -103.9f});
  EXPECT_TRUE(std::isfinite(edge[0]) && edge[0] > 3.0e38f) << edge[0];
  EXPECT_EQ(edge[1], std::numeric_limits<float>::denorm_min());
  EXPECT_EQ(apply(vmath::sigmoid, {-kInf, kInf, -200.0f, 200.0f, 0.0f, -0.0f}),
            (std::vector<float>{0.0f, 1.0f, 0.0f, 1.0f, 0.5f, 0.5f}));
  EXPECT_EQ(apply(vmath::tanh, {-kInf, kInf, -100.0f, 100.0f, -9.1f, 9.1f}),
            (std::vector<float>{-1.0f, 1.0f, -1.0f, 1.0f, -1.0f, 1.0f}));
  EXPECT_EQ(apply(vmath::erf, {-kInf, kInf, -100.0f, 100.0f, -4.0f, 4.0f}),
            (std::vector<float>{-1.0f, 1.0f, -1.0f, 1.0f, -1.0f, 1.0f}));
  // sigmoid(-80) = e^-80 / (1 + e^-80) is a normal float, not 0.
  EXPECT_NEAR(apply(vmath::sigmoid, {-80.0f})[0] / std::exp(-80.0), 1.0, 1e-6);
}

TEST_P(VectorMath, SignedZeroAndOddnessOfTanhAndErf) {
  const float tiny = std::numeric_limits<float>::denorm_min();
  for (ArrayFunction f : {vmath::tanh, vmath::erf}) {
    const std::vector<float> ys = apply(f, {0.0f, -0.0f, tiny, -tiny});
    EXPECT_TRUE(ys[0] == 0.0f && !std::signbit(ys[0]));
    EXPECT_TRUE(ys[1] == 0.0f && std::signbit(ys[1]));
    EXPECT_GT(ys[2], 0.0f);  // a subnormal input is not flushed to zero
    EXPECT_EQ(ys[3], -ys[2]);
  }
  EXPECT_EQ(apply(vmath::tanh, {1e-30f})[0], 1e-30f);  // tanh(x) = x to float precision
  std::vector<float> xs;
  for (float x = 1e-6f; x < 20.0f; x *= 1.01f) xs.push_back(x);
  for (ArrayFunction f : {vmath::tanh, vmath::erf}) {
    std::vector<float> negated = xs;
    for (float& x : negated) x = -x;
    const std::vector<float> ys = apply(f, xs);
    const std::vector<float> ns = apply(f, negated);
    for (size_t i = 0; i < xs.size(); ++i) EXPECT_EQ(ns[i], -ys[i]) << xs[i];
  }
}

// Every length from 0 to 40 (full vectors and every tail), out of place and in place, gives the
// same value at each index as a call on that element alone, and writes nothing past n.
TEST_P(VectorMath, TailsAndInPlace) {
  for (const Case& c : unary_functions()) {
    for (int n = 0; n <= 40; ++n) {
      std::vector<float> xs(n), ys(n + 1, 7.0f);
      for (int i = 0; i < n; ++i) xs[i] = 0.37f * static_cast<float>(i) - 5.0f;
      c.f(xs.data(), ys.data(), n);
      EXPECT_EQ(ys[n], 7.0f) << c.name << " wrote past n = " << n;
      std::vector<float> in_place = xs;
      c.f(in_place.data(), in_place.data(), n);
      for (int i = 0; i < n; ++i) {
        float one = 0;
        c.f(&xs[i], &one, 1);
        EXPECT_EQ(ys[i], one) << c.name << " n = " << n << " i = " << i;
        EXPECT_EQ(in_place[i], one) << c.name << " in place, n = " << n << " i = " << i;
      }
    }
  }
}

// Gelu and its derivative in float64: Phi(x) = 0.5 erfc(-x / sqrt 2) (no cancellation in the
// lower tail, unlike 0.5 (1 + erf)), phi(x) = e^(-x^2 / 2) / sqrt(2 pi).
double normal_cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }
double x_normal_density(double x) { return x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * std::acos(-1.0)); }

// The bound core/vector_math.h documents for gelu and gelu_backward at x.
double gelu_bound(float x) { return 8.0 + 0.5 * static_cast<double>(x) * static_cast<double>(x); }

TEST_P(VectorMath, GeluWithinTheDocumentedUlps) {
  const std::vector<float> xs = sweep_inputs();
  std::vector<float> ys(xs.size());
  vmath::gelu(xs.data(), ys.data(), static_cast<int64_t>(xs.size()));
  double worst = 0, worst_above_minus_4 = 0;
  float worst_x = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double x = xs[i];
    if (std::isinf(x)) continue;  // below
    const double e = ulp_error(ys[i], x * normal_cdf(x));
    EXPECT_LE(e, gelu_bound(xs[i])) << "x = " << xs[i] << ": " << ys[i];
    if (!(e <= worst)) worst = e, worst_x = xs[i];
    if (x >= -4 && e > worst_above_minus_4) worst_above_minus_4 = e;
  }
  std::printf("gelu %d lanes: max error %.3f ulp at x = %a, %.3f ulp for x >= -4\n", vmath::lanes(), worst,
              static_cast<double>(worst_x), worst_above_minus_4);
  // Where 0.5 x (1 + erf(x / sqrt 2)) in float loses every digit (1 + erf rounds to a few ulp of 1
  // or to 0), the result keeps its relative accuracy.
  const std::vector<float> tail = apply(vmath::gelu, {-5.0f, -8.0f, -12.0f});
  for (size_t i = 0; i < tail.size(); ++i) {
    const double x = std::vector<double>{-5.0, -8.0, -12.0}[i];
    EXPECT_NEAR(tail[i] / (x * normal_cdf(x)), 1.0, 1e-5) << x;
  }
}

TEST_P(VectorMath, GeluBackwardWithinTheDocumentedUlpsOfItsLargerTerm) {
  const std::vector<float> xs = sweep_inputs();
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> scale(-3.0f, 3.0f);
  std::vector<float> dys(xs.size()), dxs(xs.size());
  for (float& d : dys) d = scale(rng);
  vmath::gelu_backward(dys.data(), xs.data(), dxs.data(), static_cast<int64_t>(xs.size()));
  double worst = 0;
  float worst_x = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double x = xs[i], dy = dys[i];
    if (std::isinf(x) || dy == 0) continue;
    const double cdf = normal_cdf(x), xpdf = x_normal_density(x);
    // The error of dy Gelu'(x) in ulp of dy times the larger term (2^-149 below FLT_MIN); dy adds
    // one rounding.
    const double larger = std::abs(dy) * std::max(std::abs(cdf), std::abs(xpdf));
    const double ulp = std::ldexp(1.0, std::max(std::ilogb(larger) - 23, -149));
    const double e = std::abs(static_cast<double>(dxs[i]) - dy * (cdf + xpdf)) / ulp;
    EXPECT_LE(e, gelu_bound(xs[i]) + 1.0) << "x = " << xs[i] << ", dy = " << dys[i] << ": " << dxs[i];
    if (!(e <= worst)) worst = e, worst_x = xs[i];
  }
  std::printf("gelu_backward %d lanes: max error %.3f ulp at x = %a\n", vmath::lanes(), worst,
              static_cast<double>(worst_x));
}

TEST_P(VectorMath, GeluSpecialValues) {
  const std::vector<float> ys = apply(vmath::gelu, {kInf, -kInf, kNaN, 0.0f, -0.0f, 100.0f, -100.0f, 1.0f, kNaN});
  EXPECT_EQ(ys[0], kInf);
  EXPECT_TRUE(std::isnan(ys[1]));  // -inf times Phi(-inf) = 0, as 0.5 x (1 + erf) gives in float64
  EXPECT_TRUE(std::isnan(ys[2]));
  EXPECT_TRUE(ys[3] == 0.0f && !std::signbit(ys[3]));
  EXPECT_TRUE(ys[4] == 0.0f && std::signbit(ys[4]));
  EXPECT_EQ(ys[5], 100.0f);
  EXPECT_TRUE(ys[6] == 0.0f && std::signbit(ys[6]));  // -100 Phi(-100): below the subnormals
  EXPECT_FALSE(std::isnan(ys[7]));
  EXPECT_TRUE(std::isnan(ys[8]));  // in the tail
  const std::vector<float> x = {kInf, -kInf, kNaN, 0.0f, 100.0f, -100.0f, 2.0f, kNaN, 0.5f};
  const std::vector<float> dy = {1.0f, 1.0f, 1.0f, 2.0f, 3.0f, 3.0f, kNaN, 1.0f, 0.0f};
  std::vector<float> dx(x.size());
  vmath::gelu_backward(dy.data(), x.data(), dx.data(), static_cast<int64_t>(x.size()));
  EXPECT_TRUE(std::isnan(dx[0]) && std::isnan(dx[1]));  // inf times a zero density
  EXPECT_TRUE(std::isnan(dx[2]));
  EXPECT_NEAR(dx[3], 1.0f, 4e-7f);  // 2 Phi(0)
  EXPECT_EQ(dx[4], 3.0f);
  EXPECT_EQ(dx[5], 0.0f);
  EXPECT_TRUE(std::isnan(dx[6]));
  EXPECT_TRUE(std::isnan(dx[7]));
  EXPECT_EQ(dx[8], 0.0f);
}

// As TailsAndInPlace for the two-input gelu_backward: every length to 40, out of place and in
// place over dy and over x, equal to the element computed alone, nothing written past n.
TEST_P(VectorMath, GeluBackwardTailsAndInPlace) {
  for (int n = 0; n <= 40; ++n) {
    std::vector<float> xs(n), dys(n), dxs(n + 1, 7.0f);
    for (int i = 0; i < n; ++i) xs[i] = 0.37f * static_cast<float>(i) - 5.0f, dys[i] = 1.0f + 0.25f * static_cast<float>(i);
    vmath::gelu_backward(dys.data(), xs.data(), dxs.data(), n);
    EXPECT_EQ(dxs[n], 7.0f) << "wrote past n = " << n;
    std::vector<float> over_dy = dys, over_x = xs;
    vmath::gelu_backward(over_dy.data(), xs.data(), over_dy.data(), n);
    vmath::gelu_backward(dys.data(), over_x.data(), over_x.data(), n);
    for (int i = 0; i < n; ++i) {
      float one = 0;
      vmath::gelu_backward(&dys[i], &xs[i], &one, 1);
      EXPECT_EQ(dxs[i], one) << "n = " << n << " i = " << i;
      EXPECT_EQ(over_dy[i], one) << "in place over dy, n = " << n << " i = " << i;
      EXPECT_EQ(over_x[i], one) << "in place over x, n = " << n << " i = " << i;
    }
  }
}

}  // namespace
}  // namespace onnxtrain
