// The narrow element types (dtype.h): their ONNX numbers, encodings, conversions (ONNX technical
// docs float8.md, float4.md, float6.md, int4.md, int2.md and the Cast docs' saturation tables),
// and their TensorProto serialization (onnx.proto's comments on raw_data and int32_data).
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

#include "core/cast.h"
#include "core/dispatch.h"
#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

const DataType kMiniFloats[] = {DataType::Float8E4M3FN, DataType::Float8E4M3FNUZ, DataType::Float8E5M2,
                                DataType::Float8E5M2FNUZ, DataType::Float4E2M1, DataType::Float6E2M3,
                                DataType::Float6E3M2};

uint8_t bits(DataType t, double v, NarrowFloatCast how = {}) { return narrow_float_bits(t, v, how); }
float value(DataType t, uint8_t b) { return narrow_float_value(t, b); }
NarrowFloatCast no_saturate() {
  NarrowFloatCast how;
  how.saturate = false;
  return how;
}

TEST(DType, NumbersAreOnnxProtos) {
  EXPECT_EQ(static_cast<int>(DataType::Float8E4M3FN), onnx::TensorProto::FLOAT8E4M3FN);
  EXPECT_EQ(static_cast<int>(DataType::Float8E4M3FNUZ), onnx::TensorProto::FLOAT8E4M3FNUZ);
  EXPECT_EQ(static_cast<int>(DataType::Float8E5M2), onnx::TensorProto::FLOAT8E5M2);
  EXPECT_EQ(static_cast<int>(DataType::Float8E5M2FNUZ), onnx::TensorProto::FLOAT8E5M2FNUZ);
  EXPECT_EQ(static_cast<int>(DataType::UInt4), onnx::TensorProto::UINT4);
  EXPECT_EQ(static_cast<int>(DataType::Int4), onnx::TensorProto::INT4);
  EXPECT_EQ(static_cast<int>(DataType::Float4E2M1), onnx::TensorProto::FLOAT4E2M1);
  EXPECT_EQ(static_cast<int>(DataType::Float8E8M0), onnx::TensorProto::FLOAT8E8M0);
  EXPECT_EQ(static_cast<int>(DataType::UInt2), onnx::TensorProto::UINT2);
  EXPECT_EQ(static_cast<int>(DataType::Int2), onnx::TensorProto::INT2);
  EXPECT_EQ(static_cast<int>(DataType::Float6E2M3), onnx::TensorProto::FLOAT6E2M3);
  EXPECT_EQ(static_cast<int>(DataType::Float6E3M2), onnx::TensorProto::FLOAT6E3M2);
  EXPECT_EQ(kMaxDataType, onnx::TensorProto::DataType_MAX);
}

TEST(DType, NamesSizesAndSupport) {
  EXPECT_EQ(dtype_name(DataType::Float8E4M3FN), "float8e4m3fn");
  EXPECT_EQ(dtype_name(DataType::Int4), "int4");
  EXPECT_EQ(dtype_name(DataType::Float6E3M2), "float6e3m2");
  for (int t = 17; t <= kMaxDataType; ++t) {
    const auto d = static_cast<DataType>(t);
    EXPECT_TRUE(is_supported(d)) << t;
    EXPECT_EQ(dtype_size(d), 1u) << t;
    EXPECT_EQ(dtype_from_onnx(t, "x"), d);
    EXPECT_FALSE(is_floating(d)) << t;
    EXPECT_FALSE(is_integral(d)) << t;
  }
  EXPECT_EQ(dtype_bits(DataType::Int4), 4);
  EXPECT_EQ(dtype_bits(DataType::Float4E2M1), 4);
  EXPECT_EQ(dtype_bits(DataType::UInt2), 2);
  EXPECT_EQ(dtype_bits(DataType::Float6E2M3), 6);
  EXPECT_EQ(dtype_bits(DataType::Float8E8M0), 8);
  EXPECT_EQ(dtype_bits(DataType::Float32), 32);
  EXPECT_TRUE(is_narrow_float(DataType::Float8E8M0));
  EXPECT_FALSE(is_narrow_float(DataType::Int4));
  EXPECT_TRUE(is_sub_byte_integral(DataType::Int2));
  EXPECT_THROW(dtype_from_onnx(29, "x"), Error);
  EXPECT_EQ(dtype_from_onnx(8, "x"), DataType::String);
  EXPECT_THROW(dtype_from_onnx(14, "x"), Error);  // complex64
}

// Values of patterns from the tables of float8.md, float4.md, float6.md and the E8M0 definition.
TEST(DType, DecodesTheDocumentedPatterns) {
  EXPECT_EQ(value(DataType::Float8E4M3FN, 0x38), 1.0f);   // 0.0111.000
  EXPECT_EQ(value(DataType::Float8E4M3FN, 0x7e), 448.0f);  // max S.1111.110
  EXPECT_EQ(value(DataType::Float8E4M3FN, 0x01), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(value(DataType::Float8E4M3FN, 0x7f)));
  EXPECT_TRUE(std::isnan(value(DataType::Float8E4M3FN, 0xff)));
  EXPECT_TRUE(std::signbit(value(DataType::Float8E4M3FN, 0x80)));
  EXPECT_EQ(value(DataType::Float8E4M3FNUZ, 0x40), 1.0f);  // bias 8
  EXPECT_EQ(value(DataType::Float8E4M3FNUZ, 0x7f), 240.0f);
  EXPECT_EQ(value(DataType::Float8E4M3FNUZ, 0xff), -240.0f);
  EXPECT_EQ(value(DataType::Float8E4M3FNUZ, 0x01), std::ldexp(1.0f, -10));
  EXPECT_TRUE(std::isnan(value(DataType::Float8E4M3FNUZ, 0x80)));
  EXPECT_EQ(value(DataType::Float8E5M2, 0x3c), 1.0f);
  EXPECT_EQ(value(DataType::Float8E5M2, 0x7b), 57344.0f);
  EXPECT_EQ(value(DataType::Float8E5M2, 0x7c), kInf);
  EXPECT_EQ(value(DataType::Float8E5M2, 0xfc), -kInf);
  for (uint8_t b : {0x7d, 0x7e, 0x7f, 0xfd}) EXPECT_TRUE(std::isnan(value(DataType::Float8E5M2, b)));
  EXPECT_EQ(value(DataType::Float8E5M2, 0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(value(DataType::Float8E5M2FNUZ, 0x40), 1.0f);
  EXPECT_EQ(value(DataType::Float8E5M2FNUZ, 0x7f), 57344.0f);
  EXPECT_EQ(value(DataType::Float8E5M2FNUZ, 0x01), std::ldexp(1.0f, -17));
  EXPECT_TRUE(std::isnan(value(DataType::Float8E5M2FNUZ, 0x80)));
  const float e2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (uint8_t b = 0; b < 8; ++b) {
    EXPECT_EQ(value(DataType::Float4E2M1, b), e2m1[b]);
    EXPECT_EQ(value(DataType::Float4E2M1, static_cast<uint8_t>(b | 8)), -e2m1[b]);
  }
  EXPECT_EQ(value(DataType::Float6E2M3, 0x1f), 7.5f);
  EXPECT_EQ(value(DataType::Float6E2M3, 0x01), 0.125f);
  EXPECT_EQ(value(DataType::Float6E2M3, 0x08), 1.0f);  // min normal 1.000 * 2^0
  EXPECT_EQ(value(DataType::Float6E3M2, 0x1f), 28.0f);
  EXPECT_EQ(value(DataType::Float6E3M2, 0x01), 0.0625f);
  EXPECT_EQ(value(DataType::Float6E3M2, 0x04), 0.25f);  // min normal 1.00 * 2^-2
  EXPECT_EQ(value(DataType::Float6E3M2, 0x3f), -28.0f);
  EXPECT_EQ(value(DataType::Float8E8M0, 127), 1.0f);
  EXPECT_EQ(value(DataType::Float8E8M0, 0), std::ldexp(1.0f, -127));
  EXPECT_EQ(value(DataType::Float8E8M0, 254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(value(DataType::Float8E8M0, 255)));
}

// Every finite pattern converts back to itself (but -0 of float6, which has no -0 on conversion).
TEST(DType, EveryPatternRoundTrips) {
  for (DataType t : kMiniFloats) {
    const unsigned patterns = 1u << dtype_bits(t);
    for (unsigned b = 0; b < patterns; ++b) {
      const float v = value(t, static_cast<uint8_t>(b));
      if (std::isnan(v) || std::isinf(v)) continue;
      if (v == 0 && std::signbit(v) && (t == DataType::Float6E2M3 || t == DataType::Float6E3M2)) continue;
      EXPECT_EQ(bits(t, v), b) << dtype_name(t) << " pattern " << b;
    }
  }
  for (unsigned b = 0; b < 255; ++b) EXPECT_EQ(bits(DataType::Float8E8M0, value(DataType::Float8E8M0, static_cast<uint8_t>(b))), b);
}

// Between two neighbouring values, the midpoint goes to the even pattern and anything off the
// midpoint to the nearer one (round to nearest, ties to even).
TEST(DType, RoundsToNearestEven) {
  for (DataType t : kMiniFloats) {
    const unsigned positives = 1u << (dtype_bits(t) - 1);
    for (unsigned b = 0; b + 1 < positives; ++b) {
      const double lo = value(t, static_cast<uint8_t>(b)), hi = value(t, static_cast<uint8_t>(b + 1));
      if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
      const double mid = (lo + hi) / 2;
      const unsigned even = b % 2 == 0 ? b : b + 1;
      const unsigned got_mid = bits(t, mid), got_below = bits(t, std::nextafter(mid, lo)),
                     got_above = bits(t, std::nextafter(mid, hi));
      EXPECT_EQ(got_mid, even) << dtype_name(t) << " between " << lo << " and " << hi;
      EXPECT_EQ(got_below, b) << dtype_name(t);
      EXPECT_EQ(got_above, b + 1) << dtype_name(t);
      // The same for negative values (FNUZ: the sign bit is 0x80 too).
      const unsigned sign = 1u << (dtype_bits(t) - 1);
      if (b > 0) {
        EXPECT_EQ(bits(t, -std::nextafter(mid, hi)), (b + 1) | sign) << dtype_name(t);
      }
    }
  }
}

// The Cast docs' tables (float8.md): saturate and no-saturate, Cast-24+ (and 19..23 for FNUZ).
TEST(DType, Float8SpecialValuesFollowTheCastTables) {
  const NarrowFloatCast sat, nosat = no_saturate();
  NarrowFloatCast old_sat;
  old_sat.fnuz_inf_is_nan = true;
  // E4M3FN
  EXPECT_EQ(bits(DataType::Float8E4M3FN, 0.0), 0x00);
  EXPECT_EQ(bits(DataType::Float8E4M3FN, -0.0), 0x80);
  EXPECT_EQ(bits(DataType::Float8E4M3FN, kNaN) & 0x7f, 0x7f);
  EXPECT_EQ(bits(DataType::Float8E4M3FN, kInf, sat), 0x7e);
  EXPECT_EQ(bits(DataType::Float8E4M3FN, -kInf, sat), 0xfe);
  EXPECT_EQ(bits(DataType::Float8E4M3FN, 1e6, sat), 0x7e);
  EXPECT_EQ(bits(DataType::Float8E4M3FN, kInf, nosat), 0x7f);
  EXPECT_EQ(bits(DataType::Float8E4M3FN, -kInf, nosat), 0xff);
  EXPECT_EQ(bits(DataType::Float8E4M3FN, 1e6, nosat), 0x7f);
  EXPECT_EQ(bits(DataType::Float8E4M3FN, 464.0, nosat), 0x7e);  // [464] = 448: not beyond max
  EXPECT_EQ(bits(DataType::Float8E4M3FN, 465.0, nosat), 0x7f);  // [465] = 480
  // E5M2
  EXPECT_EQ(bits(DataType::Float8E5M2, kInf, sat), 0x7b);
  EXPECT_EQ(bits(DataType::Float8E5M2, kInf, nosat), 0x7c);
  EXPECT_EQ(bits(DataType::Float8E5M2, -1e6, nosat), 0xfc);
  EXPECT_EQ(bits(DataType::Float8E5M2, -1e6, sat), 0xfb);
  EXPECT_EQ(bits(DataType::Float8E5M2, -0.0), 0x80);
  EXPECT_TRUE(std::isnan(value(DataType::Float8E5M2, bits(DataType::Float8E5M2, kNaN))));
  // FNUZ: one zero, NaN 0x80
  for (DataType t : {DataType::Float8E4M3FNUZ, DataType::Float8E5M2FNUZ}) {
    EXPECT_EQ(bits(t, -0.0), 0x00) << dtype_name(t);
    EXPECT_EQ(bits(t, -1e-30), 0x00) << dtype_name(t);
    EXPECT_EQ(bits(t, kNaN), 0x80) << dtype_name(t);
    EXPECT_EQ(bits(t, -kNaN, nosat), 0x80) << dtype_name(t);
    EXPECT_EQ(bits(t, kInf, sat), 0x7f) << dtype_name(t);
    EXPECT_EQ(bits(t, -kInf, sat), 0xff) << dtype_name(t);
    EXPECT_EQ(bits(t, kInf, old_sat), 0x80) << dtype_name(t);
    EXPECT_EQ(bits(t, 1e6, old_sat), 0x7f) << dtype_name(t);  // finite: still saturates
    EXPECT_EQ(bits(t, kInf, nosat), 0x80) << dtype_name(t);
    EXPECT_EQ(bits(t, 1e6, nosat), 0x80) << dtype_name(t);
    EXPECT_EQ(bits(t, -1e6, sat), 0xff) << dtype_name(t);
  }
  EXPECT_EQ(bits(DataType::Float8E4M3FN, kInf, old_sat), 0x7e);  // the rule is FNUZ's only
}

TEST(DType, Float4AndFloat6SaturateAsTheirDocsSay) {
  const DataType f4 = DataType::Float4E2M1;
  EXPECT_EQ(value(f4, bits(f4, 9.0)), 6.0f);
  EXPECT_EQ(value(f4, bits(f4, -8.0)), -6.0f);
  EXPECT_EQ(value(f4, bits(f4, kInf)), 6.0f);
  EXPECT_EQ(value(f4, bits(f4, -kInf)), -6.0f);
  EXPECT_EQ(value(f4, bits(f4, kNaN)), 6.0f);
  EXPECT_EQ(bits(f4, kInf, no_saturate()), bits(f4, kInf));  // no non-saturating mode
  EXPECT_EQ(bits(f4, -0.0), 0x8);
  EXPECT_EQ(value(f4, bits(f4, 2.5)), 2.0f);   // tie: 2 (even) over 3
  EXPECT_EQ(value(f4, bits(f4, 5.0)), 4.0f);   // tie: 4 over 6
  EXPECT_EQ(value(f4, bits(f4, 0.75)), 1.0f);  // tie: 1 over 0.5
  EXPECT_EQ(value(f4, bits(f4, 0.25)), 0.0f);  // tie: 0 over 0.5
  const DataType e2m3 = DataType::Float6E2M3, e3m2 = DataType::Float6E3M2;
  EXPECT_EQ(value(e2m3, bits(e2m3, 25.0)), 7.5f);  // float6.md's examples
  EXPECT_EQ(value(e3m2, bits(e3m2, 25.0)), 24.0f);
  EXPECT_EQ(bits(e2m3, -0.0), 0x00);
  EXPECT_EQ(bits(e3m2, -0.0), 0x00);
  EXPECT_EQ(value(e2m3, bits(e2m3, kInf)), 7.5f);
  EXPECT_EQ(value(e3m2, bits(e3m2, kInf)), 28.0f);
  EXPECT_EQ(value(e2m3, bits(e2m3, kNaN)), 7.5f);
  EXPECT_EQ(value(e3m2, bits(e3m2, kNaN)), 28.0f);
  EXPECT_EQ(value(e3m2, bits(e3m2, -100.0)), -28.0f);
}

TEST(DType, Float8E8M0RoundsAsItsModeSays) {
  const DataType e8 = DataType::Float8E8M0;
  NarrowFloatCast up, down, nearest;
  down.round_mode = E8M0Rounding::Down;
  nearest.round_mode = E8M0Rounding::Nearest;
  EXPECT_EQ(bits(e8, 1.0, up), 127);
  EXPECT_EQ(bits(e8, 1.1, up), 128);
  EXPECT_EQ(bits(e8, 0.124, up), 124);  // 2^-3
  EXPECT_EQ(bits(e8, 1.9, down), 127);
  EXPECT_EQ(bits(e8, 1.5, nearest), 128);  // ties up
  EXPECT_EQ(bits(e8, 1.49, nearest), 127);
  EXPECT_EQ(bits(e8, 3.0, nearest), 129);  // 1.5 * 2: ties up to 4
  EXPECT_EQ(bits(e8, -4.0, up), 129);      // the sign is ignored
  // Out of range: saturate gives the bounds, no saturate NaN (Cast-24's table).
  NarrowFloatCast nosat = no_saturate();
  nosat.round_mode = E8M0Rounding::Nearest;
  EXPECT_EQ(bits(e8, 0.0, up), 0x00);
  EXPECT_EQ(bits(e8, 0.0, nosat), 0xff);
  EXPECT_EQ(bits(e8, kInf, up), 0xfe);
  EXPECT_EQ(bits(e8, kInf, nosat), 0xff);
  EXPECT_EQ(bits(e8, kNaN, up), 0xff);
  EXPECT_EQ(bits(e8, std::ldexp(1.5, 127), up), 0xfe);
  EXPECT_EQ(bits(e8, std::ldexp(1.5, 127), nosat), 0xff);
  EXPECT_EQ(bits(e8, std::ldexp(1.2, 127), nosat), 0xfe);  // nearest: 2^127
  EXPECT_EQ(bits(e8, std::ldexp(1.0, -130), up), 0x00);
  EXPECT_EQ(bits(e8, std::ldexp(1.0, -130), nosat), 0xff);
}

TEST(DType, SubByteIntegersRoundAndKeepTheLowBits) {
  // int4.md: round to nearest (ties to even), then keep 4 bits (two's complement).
  EXPECT_EQ(convert<Int4>(9.0f).value, -7);
  EXPECT_EQ(convert<Int4>(-9.0f).value, 7);
  EXPECT_EQ(convert<Int4>(2.5f).value, 2);
  EXPECT_EQ(convert<Int4>(3.5f).value, 4);
  EXPECT_EQ(convert<Int4>(kNaN).value, 0);
  EXPECT_EQ(convert<UInt4>(int64_t{-1}).value, 15);
  EXPECT_EQ(convert<UInt4>(int32_t{17}).value, 1);
  EXPECT_EQ(convert<Int2>(int8_t{3}).value, -1);
  EXPECT_EQ(convert<UInt2>(-3.0).value, 1);
  EXPECT_EQ(convert<Int2>(true).value, 1);
  EXPECT_EQ(convert<int8_t>(Int4::wrap(8)), -8);
  EXPECT_EQ(convert<float>(UInt2::wrap(3)), 3.0f);
  EXPECT_EQ(convert<Float8E4M3FN>(Int4::wrap(-3)).bits, 0xc4);  // -3 = -1.5 * 2^1
}

TEST(DType, TensorCastsBetweenNarrowTypes) {
  const Tensor x = testing::f32(Shape{5}, {0.3f, -1.0f, 500.0f, kNaN, 7.0f});
  const Tensor f8 = x.cast(DataType::Float8E4M3FN);
  EXPECT_EQ(f8.dtype(), DataType::Float8E4M3FN);
  const std::vector<double> back = f8.cast(DataType::Float32).to_double_vector();
  EXPECT_EQ(back[0], 0.3125);  // 1.25 * 2^-2, the nearest
  EXPECT_EQ(back[1], -1.0);
  EXPECT_EQ(back[2], 448.0);  // saturated
  EXPECT_TRUE(std::isnan(back[3]));
  EXPECT_EQ(back[4], 7.0);
  const Tensor i4 = f8.cast(DataType::Int4);  // through float: 0.3125 -> 0, 448 -> 448 mod 16 = 0
  EXPECT_EQ(i4.to_int64_vector("i4"), (std::vector<int64_t>{0, -1, 0, 0, 7}));
  Tensor e5(DataType::Float8E5M2, Shape{3});
  NarrowFloatCast nosat = no_saturate();
  cast_into(testing::f32(Shape{3}, {1e6f, -kInf, 0.5f}), e5, nosat);
  const std::vector<double> e5v = e5.to_double_vector();
  EXPECT_EQ(e5v[0], std::numeric_limits<double>::infinity());
  EXPECT_EQ(e5v[1], -std::numeric_limits<double>::infinity());
  EXPECT_EQ(e5v[2], 0.5);
  EXPECT_THROW(f8.to_int64_vector("f8"), Error);
}

// ---------------------------------------------------------------------------------------------
// TensorProto

Tensor from_codes(DataType t, const Shape& shape, const std::vector<uint8_t>& codes) {
  Tensor x(t, shape);
  std::copy(codes.begin(), codes.end(), static_cast<uint8_t*>(x.raw_data()));
  return x;
}
std::vector<uint8_t> codes_of(const Tensor& x) {
  const auto* p = static_cast<const uint8_t*>(x.raw_data());
  return {p, p + x.numel()};
}
Tensor read(const onnx::TensorProto& p) { return io::tensor_from_proto(p, {}, "tensor"); }

TEST(DTypeProto, PacksFourBitTypesLowNibbleFirst) {
  const Tensor x = from_codes(DataType::Int4, Shape{3}, {1, static_cast<uint8_t>(-2), 7});
  onnx::TensorProto p;
  io::tensor_to_proto(x, "x", p);
  EXPECT_EQ(p.data_type(), onnx::TensorProto::INT4);
  ASSERT_EQ(p.raw_data().size(), 2u);  // ceil(3 / 2)
  EXPECT_EQ(static_cast<uint8_t>(p.raw_data()[0]), 0xe1);  // -2 = 0xe in the high nibble
  EXPECT_EQ(static_cast<uint8_t>(p.raw_data()[1]), 0x07);  // padding 0
  const Tensor back = read(p);
  EXPECT_EQ(back.dtype(), DataType::Int4);
  EXPECT_EQ(back.to_int64_vector("x"), (std::vector<int64_t>{1, -2, 7}));
}

TEST(DTypeProto, PacksTwoBitTypesFromBitZero) {
  const Tensor x = from_codes(DataType::UInt2, Shape{5}, {1, 2, 3, 0, 3});
  onnx::TensorProto p;
  io::tensor_to_proto(x, "x", p);
  ASSERT_EQ(p.raw_data().size(), 2u);
  EXPECT_EQ(static_cast<uint8_t>(p.raw_data()[0]), 1 | 2 << 2 | 3 << 4 | 0 << 6);
  EXPECT_EQ(static_cast<uint8_t>(p.raw_data()[1]), 3);
  EXPECT_EQ(codes_of(read(p)), (std::vector<uint8_t>{1, 2, 3, 0, 3}));
  // int2 sign-extends: 3 -> -1, 2 -> -2
  p.set_data_type(onnx::TensorProto::INT2);
  EXPECT_EQ(read(p).to_int64_vector("x"), (std::vector<int64_t>{1, -2, -1, 0, -1}));
}

TEST(DTypeProto, PacksFloat6AsAnLsbFirstBitStream) {
  const std::vector<uint8_t> codes = {0x01, 0x22, 0x3f, 0x15, 0x2a};
  const Tensor x = from_codes(DataType::Float6E3M2, Shape{5}, codes);
  onnx::TensorProto p;
  io::tensor_to_proto(x, "x", p);
  ASSERT_EQ(p.raw_data().size(), 4u);  // ceil(6 * 5 / 8)
  const auto b = [&](size_t i) { return static_cast<unsigned>(static_cast<uint8_t>(p.raw_data()[i])); };
  // onnx.proto: byte0 = x0 | (x1 & 3) << 6; byte1 = x1 >> 2 | (x2 & 0xF) << 4; byte2 = x2 >> 4 | x3 << 2
  EXPECT_EQ(b(0), (0x01u | (0x22u & 3u) << 6) & 0xffu);
  EXPECT_EQ(b(1), (0x22u >> 2 | (0x3fu & 0xfu) << 4) & 0xffu);
  EXPECT_EQ(b(2), (0x3fu >> 4 | 0x15u << 2) & 0xffu);
  EXPECT_EQ(b(3), 0x2au);
  EXPECT_EQ(codes_of(read(p)), codes);
}

TEST(DTypeProto, EveryNarrowTypeRoundTripsThroughRawData) {
  for (int t = 17; t <= kMaxDataType; ++t) {
    const auto dtype = static_cast<DataType>(t);
    const unsigned patterns = 1u << dtype_bits(dtype);
    std::vector<uint8_t> codes;
    for (unsigned c = 0; c < 2 * patterns + 1; ++c) {  // odd count: exercises the padding
      const unsigned code = c % patterns;
      codes.push_back(dtype == DataType::Int4 || dtype == DataType::Int2
                          ? static_cast<uint8_t>(static_cast<int8_t>(code << (8 - dtype_bits(dtype))) >> (8 - dtype_bits(dtype)))
                          : static_cast<uint8_t>(code));
    }
    const Tensor x = from_codes(dtype, Shape{static_cast<int64_t>(codes.size())}, codes);
    onnx::TensorProto p;
    io::tensor_to_proto(x, "x", p);
    EXPECT_EQ(p.raw_data().size(), (codes.size() * static_cast<size_t>(dtype_bits(dtype)) + 7) / 8) << t;
    EXPECT_EQ(codes_of(read(p)), codes) << dtype_name(dtype);
  }
}

TEST(DTypeProto, ReadsInt32Data) {
  onnx::TensorProto p;
  p.add_dims(3);
  p.set_data_type(onnx::TensorProto::UINT4);
  p.add_int32_data(0x21);  // elements 1, 2
  p.add_int32_data(0x0f);  // element 15 and padding
  EXPECT_EQ(read(p).to_int64_vector("x"), (std::vector<int64_t>{1, 2, 15}));
  p.set_data_type(onnx::TensorProto::FLOAT4E2M1);
  EXPECT_EQ(read(p).to_double_vector(), (std::vector<double>{0.5, 1.0, -6.0}));
  p.add_int32_data(0);  // three entries where two are needed
  EXPECT_THROW(read(p), Error);

  onnx::TensorProto f8;
  f8.add_dims(2);
  f8.set_data_type(onnx::TensorProto::FLOAT8E5M2);
  f8.add_int32_data(0x3c);  // one element per entry
  f8.add_int32_data(0x7c);
  EXPECT_EQ(read(f8).to_double_vector(), (std::vector<double>{1.0, std::numeric_limits<double>::infinity()}));

  onnx::TensorProto i2;
  i2.add_dims(4);
  i2.set_data_type(onnx::TensorProto::INT2);
  i2.add_int32_data(0b10'01'11'00);  // 0, -1, 1, -2
  EXPECT_EQ(read(i2).to_int64_vector("x"), (std::vector<int64_t>{0, -1, 1, -2}));

  onnx::TensorProto f6;
  f6.add_dims(2);
  f6.set_data_type(onnx::TensorProto::FLOAT6E2M3);
  f6.add_int32_data(0x1f);  // one element per entry, bits 0-5
  f6.add_int32_data(0x08);
  EXPECT_EQ(read(f6).to_double_vector(), (std::vector<double>{7.5, 1.0}));
}

TEST(DTypeProto, RejectsRawDataOfTheWrongSize) {
  onnx::TensorProto p;
  p.add_dims(3);
  p.set_data_type(onnx::TensorProto::INT4);
  p.set_raw_data(std::string(3, '\0'));  // 3 elements need 2 bytes
  EXPECT_THROW(read(p), Error);
  p.set_raw_data(std::string(2, '\0'));
  EXPECT_NO_THROW(read(p));
}

TEST(DTypeProto, ReadsPackedExternalData) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("onnxtrain-dtype-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream out(dir / "w.bin", std::ios::binary);
    out.put('\x00');                       // offset byte, skipped
    out.put(static_cast<char>(0x9f));      // elements 0, 1: 0xf (-1), 0x9 (-7)
    out.put(static_cast<char>(0x08));      // element 2: 0x8 (-8), padding
  }
  onnx::TensorProto p;
  p.add_dims(3);
  p.set_data_type(onnx::TensorProto::INT4);
  p.set_data_location(onnx::TensorProto::EXTERNAL);
  auto entry = [&](const char* key, const char* value) {
    auto* e = p.add_external_data();
    e->set_key(key);
    e->set_value(value);
  };
  entry("location", "w.bin");
  entry("offset", "1");
  entry("length", "2");
  const Tensor t = io::tensor_from_proto(p, dir, "w");
  std::filesystem::remove_all(dir);
  EXPECT_EQ(t.to_int64_vector("w"), (std::vector<int64_t>{-1, -7, -8}));
}

TEST(DTypeProto, NpyRefusesNarrowTypes) {
  const Tensor x = from_codes(DataType::Float8E4M3FN, Shape{2}, {0x38, 0x40});
  try {
    io::serialize_npy(x);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("float8e4m3fn"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace onnxtrain
