#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/dispatch.h"
#include "core/finite.h"
#include "onnxtrain/error.h"
#include "onnxtrain/tensor.h"

namespace onnxtrain {
namespace {

TEST(DataType, NamesAndSizes) {
  EXPECT_EQ(dtype_name(DataType::Float32), "float32");
  EXPECT_EQ(dtype_name(DataType::BFloat16), "bfloat16");
  EXPECT_EQ(dtype_size(DataType::Float64), 8u);
  EXPECT_EQ(dtype_size(DataType::Float16), 2u);
  EXPECT_EQ(dtype_size(DataType::Bool), 1u);
  EXPECT_EQ(dtype_size(DataType::String), sizeof(std::string));  // one std::string per element
  EXPECT_EQ(dtype_size(DataType::Complex64), 0u);
  EXPECT_TRUE(is_floating(DataType::BFloat16));
  EXPECT_TRUE(is_integral(DataType::UInt64));
  EXPECT_FALSE(is_integral(DataType::Bool));
}

TEST(DataType, FromOnnxRejectsUnsupported) {
  EXPECT_EQ(dtype_from_onnx(1, "x"), DataType::Float32);
  EXPECT_EQ(dtype_from_onnx(8, "x"), DataType::String);
  EXPECT_THROW(dtype_from_onnx(14, "x"), Error);  // complex64
  EXPECT_THROW(dtype_from_onnx(99, "x"), Error);
  EXPECT_THROW(dtype_from_onnx(-1, "x"), Error);
}

TEST(Float16, RoundTripsAndRounds) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f /* smallest normal */,
                  5.960464477539063e-08f /* smallest subnormal */}) {
    EXPECT_EQ(static_cast<float>(Float16(v)), v) << v;
  }
  EXPECT_TRUE(std::isinf(static_cast<float>(Float16(70000.0f))));
  EXPECT_TRUE(std::isnan(static_cast<float>(Float16(std::numeric_limits<float>::quiet_NaN()))));
  // 1 + 2^-11 is halfway between 1 and the next half (1 + 2^-10): ties go to even (1).
  EXPECT_EQ(static_cast<float>(Float16(1.0f + 0.00048828125f)), 1.0f);
  EXPECT_EQ(Float16(1.0f).bits, 0x3c00);
  EXPECT_EQ(Float16(-2.0f).bits, 0xc000);
}

TEST(BFloat16, RoundTripsAndRounds) {
  EXPECT_EQ(static_cast<float>(BFloat16(1.0f)), 1.0f);
  EXPECT_EQ(BFloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(static_cast<float>(BFloat16(3.140625f)), 3.140625f);
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(std::nanf("")))));
}

TEST(Convert, SaturatesAndTruncates) {
  EXPECT_EQ(convert<int8_t>(300.0f), 127);
  EXPECT_EQ(convert<int8_t>(-300.0f), -128);
  EXPECT_EQ(convert<int32_t>(-2.7), -2);
  EXPECT_EQ(convert<int64_t>(std::nan("")), 0);
  EXPECT_EQ(convert<bool>(0.5f), true);
  EXPECT_EQ(convert<float>(true), 1.0f);
  EXPECT_EQ(convert<uint8_t>(int32_t{257}), 1);  // integer narrowing wraps like numpy
}

TEST(Finite, AllFiniteFindsNaNAndInfAtEveryPlaceOfTheRange) {
  // Every length up to 40 (vector bodies and scalar tails), each place of the range holding one of
  // NaN (either sign), +Inf or -Inf among finite values that include the extremes, and the same
  // value just outside [begin, end) not counted.
  const auto check = [&]<class T>(double big, double tiny, std::vector<double> bad) {
    const std::vector<double> fine = {0.0, -0.0, 1.5, -big, big, tiny, -tiny};
    const auto to = [](double x) {
      if constexpr (std::is_same_v<T, double>) return x;
      else return T(static_cast<float>(x));
    };
    for (int64_t n = 1; n <= 40; ++n) {
      std::vector<T> v(static_cast<size_t>(n + 2));
      for (size_t i = 0; i < v.size(); ++i) v[i] = to(fine[i % fine.size()]);
      EXPECT_TRUE(all_finite(v.data(), 1, n + 1)) << n;
      for (double b : bad) {
        for (int64_t at = 0; at < n + 2; ++at) {
          std::vector<T> w = v;
          w[static_cast<size_t>(at)] = to(b);
          const bool inside = at >= 1 && at <= n;
          EXPECT_EQ(all_finite(w.data(), 1, n + 1), !inside) << dtype_name(dtype_of<T>) << " " << b << " at " << at << " of " << n;
        }
      }
    }
  };
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> bad = {std::nan(""), -std::nan(""), inf, -inf};
  check.operator()<float>(std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(), bad);
  check.operator()<double>(std::numeric_limits<double>::max(), std::numeric_limits<double>::denorm_min(), bad);
  // Float16: 65504 is its largest finite value, 2^-24 its smallest; 1e6 and -65536 round to Inf.
  check.operator()<Float16>(65504.0, std::ldexp(1.0, -24), {std::nan(""), inf, -inf, 1e6, -65536.0});
}

TEST(Shape, InlineAndHeapStorage) {
  Shape s{2, 3, 4};
  EXPECT_EQ(s.size(), 3u);
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s.to_string(), "[2,3,4]");
  Shape big = Shape::filled(12, 2);  // beyond the inline capacity
  EXPECT_EQ(big.numel(), 4096);
  Shape copy = big;
  copy[11] = 3;
  EXPECT_EQ(big[11], 2);
  EXPECT_EQ(copy.numel(), 6144);
  Shape moved = std::move(copy);
  EXPECT_EQ(moved.numel(), 6144);
  s.insert(0, 1);
  s.erase(2);
  EXPECT_EQ(s, (Shape{1, 2, 4}));
  EXPECT_EQ(Shape{}.numel(), 1);
  EXPECT_EQ(contiguous_strides(Shape{2, 3, 4}), (Shape{12, 4, 1}));
}

TEST(Shape, NormalizeAxis) {
  EXPECT_EQ(normalize_axis(-1, 3, "x"), 2);
  EXPECT_EQ(normalize_axis(0, 3, "x"), 0);
  EXPECT_THROW(normalize_axis(3, 3, "x"), Error);
  EXPECT_THROW(normalize_axis(-4, 3, "x"), Error);
}

TEST(Tensor, AlignedStorageAndViews) {
  Tensor t = Tensor::from_vector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % Tensor::kAlignment, 0u);
  Tensor v = t.view({3, 2});
  EXPECT_TRUE(v.shares_storage_with(t));
  EXPECT_EQ(v.data<float>()[5], 6.0f);
  v.data<float>()[0] = 10;
  EXPECT_EQ(t.data<float>()[0], 10.0f);
  EXPECT_THROW(t.view({4}), Error);
  Tensor c = t.clone();
  EXPECT_FALSE(c.shares_storage_with(t));
  EXPECT_FALSE(t.storage_unique());  // v shares it
}

TEST(Tensor, ScalarsEmptyAndErrors) {
  Tensor s = Tensor::scalar<int64_t>(7);
  EXPECT_EQ(s.rank(), 0u);
  EXPECT_EQ(s.numel(), 1);
  Tensor e = Tensor::zeros(DataType::Float32, {0, 5});
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(e.nbytes(), 0u);
  EXPECT_THROW(Tensor(DataType::Complex64, {1}), Error);
  EXPECT_THROW(Tensor(DataType::Float32, {-1}), Error);
  EXPECT_FALSE(Tensor().defined());
}

TEST(Tensor, CastFollowsOnnxRules) {
  Tensor f = Tensor::from_vector<float>({4}, {1.7f, -1.7f, 0.0f, 300.0f});
  Tensor i = f.cast(DataType::Int8);
  EXPECT_EQ(i.data<int8_t>()[0], 1);
  EXPECT_EQ(i.data<int8_t>()[1], -1);
  EXPECT_EQ(i.data<int8_t>()[3], 127);
  Tensor b = f.cast(DataType::Bool);
  EXPECT_EQ(b.to_int64_vector("b"), (std::vector<int64_t>{1, 1, 0, 1}));
  Tensor h = f.cast(DataType::Float16);
  EXPECT_NEAR(h.to_double_vector()[0], 1.7, 1e-3);
  EXPECT_THROW(f.to_int64_vector("f"), Error);
}

TEST(Dispatch, VisitsListedTypesOnly) {
  int size = 0;
  visit_dtype<FloatTypes>(DataType::Float64, "x", [&]<class T>() { size = sizeof(T); });
  EXPECT_EQ(size, 8);
  EXPECT_THROW(visit_dtype<FloatTypes>(DataType::Int32, "x", [&]<class T>() {}), Error);
}

}  // namespace
}  // namespace onnxtrain

#include "core/rng.h"

namespace onnxtrain {
namespace {

// Known-answer vectors of Philox4x32-10 from the Random123 distribution (kat_vectors).
TEST(Philox, MatchesKnownAnswers) {
  EXPECT_EQ(Philox::philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (std::array<uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(Philox::philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (std::array<uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(Philox::philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (std::array<uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Philox, StreamsAndRunsDiffer) {
  Philox a(1, stream_id("node_a")), b(1, stream_id("node_b")), c(2, stream_id("node_a"));
  EXPECT_NE(a.block(0, 0), b.block(0, 0));
  EXPECT_NE(a.block(0, 0), c.block(0, 0));
  EXPECT_NE(a.block(0, 0), a.block(1, 0));
  EXPECT_EQ(a.block(5, 7), Philox(1, stream_id("node_a")).block(5, 7));
  const float u = Philox::to_unit_float(0xffffffffu);
  EXPECT_LT(u, 1.0f);
  EXPECT_GE(Philox::to_unit_float(0), 0.0f);
}

}  // namespace
}  // namespace onnxtrain
