// Cast, CastLike and BitCast at their versions, and the quantization operators (cast.cpp,
// quantize.cpp, quantize_matmul.cpp, quantize_conv.cpp). Expected values are worked out by hand
// from each op's ONNX doc.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "onnxtrain/error.h"
#include "ops/registry.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::attr;
using testing::f32;
using testing::run1;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

template <class T>
Tensor vec(const Shape& shape, const std::vector<T>& v) {
  return Tensor::from_vector<T>(shape, v);
}
Tensor f32(const std::vector<float>& v) { return f32(Shape{static_cast<int64_t>(v.size())}, v); }
// A tensor of a narrow type from its stored bytes.
Tensor codes(DataType t, const Shape& shape, const std::vector<uint8_t>& c) {
  Tensor x(t, shape);
  std::copy(c.begin(), c.end(), static_cast<uint8_t*>(x.raw_data()));
  return x;
}
std::vector<uint8_t> codes_of(const Tensor& x) {
  const auto* p = static_cast<const uint8_t*>(x.raw_data());
  return {p, p + x.numel()};
}
onnx::AttributeProto to(DataType t) { return attr("to", static_cast<int64_t>(t)); }
int64_t i(DataType t) { return static_cast<int64_t>(t); }

// ---------------------------------------------------------------------------------------------
// Cast

TEST(Cast, SaturatesFloat8ByDefaultAndNotWhenAsked) {
  const Tensor x = f32({1e6f, -kInf, 0.4375f, -0.0f});
  const Tensor sat = run1("Cast", 19, {to(DataType::Float8E4M3FN)}, {x});
  EXPECT_EQ(sat.dtype(), DataType::Float8E4M3FN);
  EXPECT_EQ(codes_of(sat), (std::vector<uint8_t>{0x7e, 0xfe, 0x2e, 0x80}));  // 448, -448, 1.75 * 2^-2, -0
  const Tensor nosat = run1("Cast", 19, {to(DataType::Float8E4M3FN), attr("saturate", int64_t{0})}, {x});
  EXPECT_EQ(codes_of(nosat), (std::vector<uint8_t>{0x7f, 0xff, 0x2e, 0x80}));  // NaN, -NaN
  const Tensor e5 = run1("Cast", 19, {to(DataType::Float8E5M2), attr("saturate", int64_t{0})}, {x});
  EXPECT_EQ(codes_of(e5), (std::vector<uint8_t>{0x7c, 0xfc, 0x37, 0x80}));  // Inf, -Inf, 0.4375
}

TEST(Cast, FnuzInfinityDependsOnTheVersion) {
  const Tensor x = f32({kInf});
  // Cast-19..23's table: Inf -> NaN for FNUZ even when saturating; Cast-24+: FLT_MAX.
  EXPECT_EQ(codes_of(run1("Cast", 23, {to(DataType::Float8E4M3FNUZ)}, {x})), std::vector<uint8_t>{0x80});
  EXPECT_EQ(codes_of(run1("Cast", 24, {to(DataType::Float8E4M3FNUZ)}, {x})), std::vector<uint8_t>{0x7f});
  EXPECT_EQ(codes_of(run1("Cast", 25, {to(DataType::Float8E5M2FNUZ)}, {x})), std::vector<uint8_t>{0x7f});
}

TEST(Cast, RoundModeAppliesToFloat8E8M0) {
  const Tensor x = f32({1.5f, 3.0f, 0.3f});
  auto cast = [&](const char* mode) {
    return codes_of(run1("Cast", 24, {to(DataType::Float8E8M0), attr("round_mode", std::string(mode))}, {x}));
  };
  EXPECT_EQ(cast("up"), (std::vector<uint8_t>{128, 129, 126}));       // 2, 4, 0.5
  EXPECT_EQ(cast("down"), (std::vector<uint8_t>{127, 128, 125}));     // 1, 2, 0.25
  EXPECT_EQ(cast("nearest"), (std::vector<uint8_t>{128, 129, 125}));  // ties up; 0.3 -> 0.25
  EXPECT_THROW(cast("sideways"), Error);
  const Tensor back = run1("Cast", 24, {to(DataType::Float32)}, {codes(DataType::Float8E8M0, Shape{2}, {127, 130})});
  EXPECT_EQ(back.to_double_vector(), (std::vector<double>{1.0, 8.0}));
}

TEST(Cast, SubByteIntegersWrapAndRound) {
  const Tensor x = f32({-9, 8, 2.5f, 15});
  EXPECT_EQ(run1("Cast", 21, {to(DataType::Int4)}, {x}).to_int64_vector("y"), (std::vector<int64_t>{7, -8, 2, -1}));
  EXPECT_EQ(run1("Cast", 21, {to(DataType::UInt4)}, {x}).to_int64_vector("y"), (std::vector<int64_t>{7, 8, 2, 15}));
  EXPECT_EQ(run1("Cast", 25, {to(DataType::Int2)}, {x}).to_int64_vector("y"), (std::vector<int64_t>{-1, 0, -2, -1}));
  const Tensor i4 = codes(DataType::Int4, Shape{2}, {static_cast<uint8_t>(-8), 7});
  EXPECT_EQ(run1("Cast", 21, {to(DataType::Int8)}, {i4}).to_int64_vector("y"), (std::vector<int64_t>{-8, 7}));
  EXPECT_EQ(run1("Cast", 21, {to(DataType::Float16)}, {i4}).to_double_vector(), (std::vector<double>{-8, 7}));
}

TEST(Cast, Float4AndFloat6) {
  const Tensor x = f32({0.8f, -7, kNaN, 2.5f});
  const Tensor f4 = run1("Cast", 23, {to(DataType::Float4E2M1)}, {x});
  EXPECT_EQ(f4.to_double_vector(), (std::vector<double>{1.0, -6.0, 6.0, 2.0}));
  const Tensor f6 = run1("Cast", 28, {to(DataType::Float6E3M2)}, {x});
  EXPECT_EQ(f6.to_double_vector(), (std::vector<double>{0.75, -7.0, 28.0, 2.5}));
}

TEST(Cast, RefusesTypesItsVersionDoesNotDefine) {
  const Tensor x = f32({1});
  EXPECT_THROW(run1("Cast", 13, {to(DataType::Float8E4M3FN)}, {x}), Error);
  EXPECT_THROW(run1("Cast", 19, {to(DataType::Int4)}, {x}), Error);
  EXPECT_THROW(run1("Cast", 23, {to(DataType::Float8E8M0)}, {x}), Error);
  EXPECT_THROW(run1("Cast", 25, {to(DataType::Float6E2M3)}, {x}), Error);
  EXPECT_THROW(run1("Cast", 21, {to(DataType::Float32)}, {codes(DataType::UInt2, Shape{1}, {1})}), Error);
  EXPECT_NO_THROW(run1("Cast", 28, {to(DataType::Float6E2M3)}, {x}));
}

TEST(CastLike, TakesTheSecondInputsTypeAndSaturate) {
  const Tensor like = codes(DataType::Float8E5M2, Shape{0}, {});
  const Tensor x = f32({1e6f, 1.0f});
  EXPECT_EQ(codes_of(run1("CastLike", 19, {}, {x, like})), (std::vector<uint8_t>{0x7b, 0x3c}));
  EXPECT_EQ(codes_of(run1("CastLike", 19, {attr("saturate", int64_t{0})}, {x, like})),
            (std::vector<uint8_t>{0x7c, 0x3c}));
  EXPECT_THROW(run1("CastLike", 19, {}, {x, codes(DataType::Int4, Shape{0}, {})}), Error);
  EXPECT_EQ(run1("CastLike", 21, {}, {x, codes(DataType::Int4, Shape{0}, {})}).dtype(), DataType::Int4);
}

TEST(BitCast, ReinterpretsBitsOfEqualWidth) {
  const Tensor x = f32({1.0f, -2.0f});
  const Tensor y = run1("BitCast", 26, {to(DataType::Int32)}, {x});
  EXPECT_EQ(y.to_int64_vector("y"), (std::vector<int64_t>{0x3f800000, static_cast<int32_t>(0xc0000000u)}));
  const Tensor i4 = codes(DataType::Int4, Shape{3}, {static_cast<uint8_t>(-1), 7, static_cast<uint8_t>(-8)});
  EXPECT_EQ(run1("BitCast", 26, {to(DataType::UInt4)}, {i4}).to_int64_vector("y"), (std::vector<int64_t>{15, 7, 8}));
  EXPECT_EQ(run1("BitCast", 26, {to(DataType::Float4E2M1)}, {i4}).to_double_vector(),
            (std::vector<double>{-6.0, 6.0, -0.0}));
  const Tensor u8 = vec<uint8_t>(Shape{2}, {0x38, 0x00});
  EXPECT_EQ(run1("BitCast", 26, {to(DataType::Float8E4M3FN)}, {u8}).to_double_vector(), (std::vector<double>{1.0, 0.0}));
  EXPECT_THROW(run1("BitCast", 26, {to(DataType::Int16)}, {x}), Error);
  EXPECT_THROW(run1("BitCast", 26, {to(DataType::Int8)}, {i4}), Error);
}

// ---------------------------------------------------------------------------------------------
// QuantizeLinear / DequantizeLinear

TEST(QuantizeLinear, PerTensorRoundsHalfToEvenAndSaturates) {
  const Tensor x = f32({0, 2, 3, 5, -3, 1000, -1000});
  const Tensor scale = f32(Shape{}, {2.0f});
  // x / 2 = 0, 1, 1.5 -> 2, 2.5 -> 2, -1.5 -> -2; + 128, clamped to [0, 255]
  const Tensor y = run1("QuantizeLinear", 10, {}, {x, scale, vec<uint8_t>(Shape{}, {128})});
  EXPECT_EQ(y.dtype(), DataType::UInt8);
  EXPECT_EQ(y.to_int64_vector("y"), (std::vector<int64_t>{128, 129, 130, 130, 126, 255, 0}));
  const Tensor s8 = run1("QuantizeLinear", 13, {}, {x, scale, vec<int8_t>(Shape{}, {-1})});
  EXPECT_EQ(s8.to_int64_vector("y"), (std::vector<int64_t>{-1, 0, 1, 1, -3, 127, -128}));
  const Tensor no_zp = run1("QuantizeLinear", 13, {}, {x, scale});  // uint8 with zero point 0
  EXPECT_EQ(no_zp.to_int64_vector("y"), (std::vector<int64_t>{0, 1, 2, 2, 0, 255, 0}));
}

TEST(QuantizeLinear, PerAxisAndBlocked) {
  const Tensor x = f32(Shape{2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  const Tensor per_axis = run1("QuantizeLinear", 13, {attr("axis", int64_t{0})},
                               {x, f32({1.0f, 2.0f}), vec<uint8_t>(Shape{2}, {0, 10})});
  EXPECT_EQ(per_axis.to_int64_vector("y"), (std::vector<int64_t>{1, 2, 3, 4, 12, 13, 14, 14}));
  // Blocks of 3 along axis 1: scale [2, 2] covers columns {0, 1, 2} and {3}.
  const Tensor scale = f32(Shape{2, 2}, {1.0f, 0.5f, 2.0f, 4.0f});
  const Tensor blocked = run1("QuantizeLinear", 21, {attr("axis", int64_t{1}), attr("block_size", int64_t{3})},
                              {x, scale, vec<int8_t>(Shape{2, 2}, {0, 1, 0, -1})});
  EXPECT_EQ(blocked.to_int64_vector("y"), (std::vector<int64_t>{1, 2, 3, 9, 2, 3, 4, 1}));
  EXPECT_NO_THROW(run1("QuantizeLinear", 21, {attr("axis", int64_t{1}), attr("block_size", int64_t{2})}, {x, scale}));
  EXPECT_THROW(run1("QuantizeLinear", 21, {attr("axis", int64_t{1}), attr("block_size", int64_t{1})}, {x, scale}),
               Error);  // blocks of 1 need 4 scales per row
  EXPECT_THROW(run1("QuantizeLinear", 10, {}, {x, f32({1.0f, 2.0f})}), Error);  // per-axis needs 13
}

TEST(QuantizeLinear, OutputDtypeAndNarrowTypes) {
  const Tensor x = f32({-20, -3, 0.2f, 5, 100});
  const Tensor s = f32(Shape{}, {1.0f});
  EXPECT_EQ(run1("QuantizeLinear", 21, {attr("output_dtype", i(DataType::Int4))}, {x, s}).to_int64_vector("y"),
            (std::vector<int64_t>{-8, -3, 0, 5, 7}));
  EXPECT_EQ(run1("QuantizeLinear", 21, {}, {x, s, codes(DataType::UInt4, Shape{}, {3})}).to_int64_vector("y"),
            (std::vector<int64_t>{0, 0, 3, 8, 15}));
  EXPECT_EQ(run1("QuantizeLinear", 25, {attr("output_dtype", i(DataType::Int2))}, {x, s}).to_int64_vector("y"),
            (std::vector<int64_t>{-2, -2, 0, 1, 1}));
  EXPECT_EQ(run1("QuantizeLinear", 21, {attr("output_dtype", i(DataType::Int16))}, {x, f32(Shape{}, {0.001f})})
                .to_int64_vector("y"),
            (std::vector<int64_t>{-20000, -3000, 200, 5000, 32767}));
  const Tensor f8 = run1("QuantizeLinear", 19, {}, {x, s, codes(DataType::Float8E4M3FN, Shape{}, {0})});
  EXPECT_EQ(f8.to_double_vector(), (std::vector<double>{-20, -3, 0.203125, 5, 96}));
  const Tensor f8_big = run1("QuantizeLinear", 19, {attr("saturate", int64_t{0})},
                             {f32({1000}), s, codes(DataType::Float8E4M3FN, Shape{}, {0})});
  EXPECT_TRUE(std::isnan(f8_big.to_double_vector()[0]));
  const Tensor f4 = run1("QuantizeLinear", 23, {attr("output_dtype", i(DataType::Float4E2M1))}, {x, s});
  EXPECT_EQ(f4.to_double_vector(), (std::vector<double>{-6, -3, 0, 4, 6}));
  // The output type must match a given zero point's; int4 needs version 21.
  EXPECT_THROW(run1("QuantizeLinear", 21, {attr("output_dtype", i(DataType::Int8))},
                    {x, s, vec<uint8_t>(Shape{}, {0})}),
               Error);
  EXPECT_THROW(run1("QuantizeLinear", 19, {}, {x, s, codes(DataType::Int4, Shape{}, {0})}), Error);
}

TEST(QuantizeLinear, PrecisionAndScaleTypes) {
  // float16 scale: x / scale rounded to float16 before rounding to int. 2049 / 1 = 2049 rounds to
  // 2048 in float16 (11-bit significand), so the int16 result is 2048; float32 precision: 2049.
  const Tensor x = f32({2049});
  const Tensor s16 = Tensor::from_vector<Float16>(Shape{}, {Float16(1.0f)});
  const auto q = [&](std::vector<onnx::AttributeProto> attrs) {
    attrs.push_back(attr("output_dtype", i(DataType::Int16)));
    return run1("QuantizeLinear", 23, attrs, {x, s16}).to_int64_vector("y")[0];
  };
  EXPECT_EQ(q({}), 2048);
  EXPECT_EQ(q({attr("precision", i(DataType::Float32))}), 2049);
  // float8e8m0 scales (24+): 2^k.
  const Tensor e8 = codes(DataType::Float8E8M0, Shape{}, {129});  // 4
  EXPECT_EQ(run1("QuantizeLinear", 24, {}, {f32({8, 10}), e8}).to_int64_vector("y"), (std::vector<int64_t>{2, 2}));
  EXPECT_THROW(run1("QuantizeLinear", 23, {}, {f32({8}), e8}), Error);
  // Saturating float8 FNUZ: +Inf is NaN before version 24 (Cast-19's table), max from 24.
  const Tensor fnuz = codes(DataType::Float8E4M3FNUZ, Shape{}, {0});
  EXPECT_EQ(codes_of(run1("QuantizeLinear", 23, {}, {f32({kInf}), f32(Shape{}, {1.0f}), fnuz})), std::vector<uint8_t>{0x80});
  EXPECT_EQ(codes_of(run1("QuantizeLinear", 24, {}, {f32({kInf}), f32(Shape{}, {1.0f}), fnuz})), std::vector<uint8_t>{0x7f});
  // Versions 19 and 21: x and the scale share one type.
  EXPECT_THROW(run1("QuantizeLinear", 19, {}, {f32({8}), s16}), Error);
}

TEST(DequantizeLinear, AllGranularitiesAndTypes) {
  const Tensor x = vec<uint8_t>(Shape{2, 3}, {0, 10, 255, 128, 129, 127});
  const Tensor y = run1("DequantizeLinear", 10, {}, {x, f32(Shape{}, {0.5f}), vec<uint8_t>(Shape{}, {128})});
  EXPECT_EQ(y.dtype(), DataType::Float32);
  EXPECT_EQ(y.to_double_vector(), (std::vector<double>{-64, -59, 63.5, 0, 0.5, -0.5}));
  const Tensor axis = run1("DequantizeLinear", 13, {attr("axis", int64_t{0})},
                           {x, f32({1.0f, 2.0f}), vec<uint8_t>(Shape{2}, {0, 128})});
  EXPECT_EQ(axis.to_double_vector(), (std::vector<double>{0, 10, 255, 0, 2, -2}));
  const Tensor blocked = run1("DequantizeLinear", 21, {attr("axis", int64_t{1}), attr("block_size", int64_t{2})},
                              {x, f32(Shape{2, 2}, {1, 10, 100, 1000})});
  EXPECT_EQ(blocked.to_double_vector(), (std::vector<double>{0, 10, 2550, 12800, 12900, 127000}));
  const Tensor i32 = run1("DequantizeLinear", 13, {}, {vec<int32_t>(Shape{2}, {-7, 1 << 20}), f32(Shape{}, {0.25f})});
  EXPECT_EQ(i32.to_double_vector(), (std::vector<double>{-1.75, 262144}));
  const Tensor i4 = codes(DataType::Int4, Shape{3}, {static_cast<uint8_t>(-8), 0, 7});
  EXPECT_EQ(run1("DequantizeLinear", 21, {}, {i4, f32(Shape{}, {2.0f}), codes(DataType::Int4, Shape{}, {1})})
                .to_double_vector(),
            (std::vector<double>{-18, -2, 12}));
  const Tensor f8 = codes(DataType::Float8E5M2, Shape{2}, {0x3c, 0x7c});  // 1, Inf
  EXPECT_EQ(run1("DequantizeLinear", 19, {}, {f8, f32(Shape{}, {3.0f})}).to_double_vector(),
            (std::vector<double>{3, std::numeric_limits<double>::infinity()}));
  // float16 scale: float16 output; output_dtype (23+) overrides it.
  const Tensor s16 = Tensor::from_vector<Float16>(Shape{}, {Float16(0.5f)});
  EXPECT_EQ(run1("DequantizeLinear", 19, {}, {x, s16}).dtype(), DataType::Float16);
  const Tensor as_f32 = run1("DequantizeLinear", 23, {attr("output_dtype", i(DataType::Float32))}, {x, s16});
  EXPECT_EQ(as_f32.dtype(), DataType::Float32);
  EXPECT_EQ(as_f32.to_double_vector()[2], 127.5);
  // A float8e8m0 scale needs output_dtype; the zero point must have x's type.
  const Tensor e8 = codes(DataType::Float8E8M0, Shape{}, {126});  // 0.5
  EXPECT_THROW(run1("DequantizeLinear", 24, {}, {x, e8}), Error);
  EXPECT_EQ(run1("DequantizeLinear", 24, {attr("output_dtype", i(DataType::Float32))}, {x, e8}).to_double_vector()[1], 5);
  EXPECT_THROW(run1("DequantizeLinear", 13, {}, {x, f32(Shape{}, {1.0f}), vec<int8_t>(Shape{}, {0})}), Error);
}

TEST(DynamicQuantizeLinear, FollowsItsFunctionBody) {
  // min -1 (adjusted: -1), max 2.5: scale 3.5 / 255; zero point round(1 / scale) = round(72.857) = 73
  const auto out = testing::run_node({"DynamicQuantizeLinear", "", 11, {}, 3}, {f32({-1.0f, 0.0f, 2.5f, 1.0f})});
  const float scale = 3.5f / 255.0f;
  EXPECT_EQ(out[1].to_double_vector()[0], static_cast<double>(scale));
  EXPECT_EQ(out[2].to_int64_vector("zp"), std::vector<int64_t>{73});
  const std::vector<int64_t> want = {0, 73, 255, static_cast<int64_t>(std::nearbyint(1.0f / scale)) + 73};
  EXPECT_EQ(out[0].to_int64_vector("y"), want);
  // All positive: the range starts at 0, zero point 0.
  const auto pos = testing::run_node({"DynamicQuantizeLinear", "", 11, {}, 3}, {f32({1.0f, 5.1f})});
  EXPECT_EQ(pos[2].to_int64_vector("zp"), std::vector<int64_t>{0});
  EXPECT_EQ(pos[0].to_int64_vector("y")[1], 255);
}

// ---------------------------------------------------------------------------------------------
// Integer matrix products and convolutions

TEST(MatMulInteger, SubtractsRowAndColumnZeroPoints) {
  const Tensor a = vec<uint8_t>(Shape{2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor b = vec<int8_t>(Shape{3, 2}, {1, -1, 0, 2, -3, 1});
  // a - [1, 2] per row = [[0, 1, 2], [2, 3, 4]]; b - [0, 1] per column = [[1, -2], [0, 1], [-3, 0]]
  const Tensor y = run1("MatMulInteger", 10, {}, {a, b, vec<uint8_t>(Shape{2}, {1, 2}), vec<int8_t>(Shape{2}, {0, 1})});
  EXPECT_EQ(y.dtype(), DataType::Int32);
  EXPECT_EQ(y.shape(), (Shape{2, 2}));
  EXPECT_EQ(y.to_int64_vector("y"), (std::vector<int64_t>{-6, 1, -10, -1}));
  // Batched, with a 1-D right operand and no zero points.
  const Tensor batched = run1("MatMulInteger", 10, {}, {vec<int8_t>(Shape{2, 1, 2}, {1, 2, -3, 4}), vec<int8_t>(Shape{2}, {5, 6})});
  EXPECT_EQ(batched.shape(), (Shape{2, 1}));
  EXPECT_EQ(batched.to_int64_vector("y"), (std::vector<int64_t>{17, 9}));
}

TEST(QLinearMatMul, RequantizesWithTheScales) {
  const Tensor a = vec<uint8_t>(Shape{1, 2}, {10, 20});
  const Tensor b = vec<uint8_t>(Shape{2, 2}, {1, 2, 3, 4});
  // (a - 10) = [0, 10]; b - 0; product [30, 40]; * 0.5 * 0.1 / 0.2 = 0.25: [7.5 -> 8, 10]; + 5
  const std::vector<Tensor> in = {a, f32(Shape{}, {0.5f}), vec<uint8_t>(Shape{}, {10}), b, f32(Shape{}, {0.1f}),
                                  vec<uint8_t>(Shape{}, {0}), f32(Shape{}, {0.2f}), vec<uint8_t>(Shape{}, {5})};
  const Tensor y = run1("QLinearMatMul", 10, {}, in);
  EXPECT_EQ(y.dtype(), DataType::UInt8);
  EXPECT_EQ(y.to_int64_vector("y"), (std::vector<int64_t>{13, 15}));
  // Per-column b scales [0.1, 0.3]: [30 * 0.25, 40 * 0.75] = [7.5, 30] -> [8, 30] + 5
  std::vector<Tensor> cols = in;
  cols[4] = f32({0.1f, 0.3f});
  cols[5] = vec<uint8_t>(Shape{2}, {0, 0});
  EXPECT_EQ(run1("QLinearMatMul", 21, {}, cols).to_int64_vector("y"), (std::vector<int64_t>{13, 35}));
}

TEST(QLinearMatMul, Float8OperandsFromVersion21) {
  // a [1, 2] = [1, 2], b [2, 1] = [1, 0.5] in float8e4m3fn: a·b = 2; scales 1, 1 and y_scale 0.25: 8.
  const Tensor a = codes(DataType::Float8E4M3FN, Shape{1, 2}, {0x38, 0x40});
  const Tensor b = codes(DataType::Float8E4M3FN, Shape{2, 1}, {0x38, 0x30});
  const Tensor zero = codes(DataType::Float8E4M3FN, Shape{}, {0});
  const Tensor one = f32(Shape{}, {1.0f});
  const Tensor y = run1("QLinearMatMul", 21, {}, {a, one, zero, b, one, zero, f32(Shape{}, {0.25f}), zero});
  EXPECT_EQ(y.dtype(), DataType::Float8E4M3FN);
  EXPECT_EQ(y.to_double_vector(), std::vector<double>{8.0});
  EXPECT_THROW(run1("QLinearMatMul", 10, {}, {a, one, zero, b, one, zero, one, zero}), Error);
}

TEST(ConvInteger, ConvolvesCenteredIntegers) {
  // x 1x1x3x3 = 1..9, zero point 1; w 1x1x2x2 all 1 (zero point 0): window sums of 0..8.
  const Tensor x = vec<uint8_t>(Shape{1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  const Tensor w = vec<uint8_t>(Shape{1, 1, 2, 2}, {1, 1, 1, 1});
  const Tensor y = run1("ConvInteger", 10, {}, {x, w, vec<uint8_t>(Shape{}, {1})});
  EXPECT_EQ(y.dtype(), DataType::Int32);
  EXPECT_EQ(y.shape(), (Shape{1, 1, 2, 2}));
  EXPECT_EQ(y.to_int64_vector("y"), (std::vector<int64_t>{8, 12, 20, 24}));
  // Padding 1, 1x1 kernels [1, 3] with a per-channel zero point of 1: centered weights 0 and 2.
  const Tensor w2 = vec<uint8_t>(Shape{2, 1, 1, 1}, {1, 3});
  const Tensor y2 = run1("ConvInteger", 10, {attr("pads", std::vector<int64_t>{1, 1, 1, 1})},
                         {x, w2, vec<uint8_t>(Shape{}, {0}), vec<uint8_t>(Shape{2}, {1, 1})});
  EXPECT_EQ(y2.shape(), (Shape{1, 2, 5, 5}));
  const std::vector<int64_t> v = y2.to_int64_vector("y");
  EXPECT_EQ(v[0 * 25 + 6], 0);        // channel 0, x[0][0] * 0
  EXPECT_EQ(v[1 * 25 + 6], 2);        // channel 1, x[0][0] * 2
  EXPECT_EQ(v[1 * 25 + 18], 18);      // channel 1, x[2][2] * 2
  EXPECT_EQ(v[1 * 25 + 0], 0);        // padding
}

TEST(QLinearConv, RequantizesPerOutputChannel) {
  const Tensor x = vec<uint8_t>(Shape{1, 1, 2, 2}, {2, 4, 6, 8});
  const Tensor w = vec<int8_t>(Shape{2, 1, 1, 1}, {1, -2});
  // x - 0; w - 0; conv = x * w: [2, 4, 6, 8] and [-4, -8, -12, -16]; bias [1, 0]
  // scales: 0.5 * [1, 0.25] / 1 = [0.5, 0.125]: [1.5, 2.5, 3.5, 4.5] -> [2, 2, 4, 4];
  // [-0.5, -1, -1.5, -2] -> [-0, -1, -2, -2]; + 10
  const std::vector<Tensor> in = {x, f32(Shape{}, {0.5f}), vec<uint8_t>(Shape{}, {0}), w, f32({1.0f, 0.25f}),
                                  vec<int8_t>(Shape{2}, {0, 0}), f32(Shape{}, {1.0f}), vec<int8_t>(Shape{}, {10}),
                                  vec<int32_t>(Shape{2}, {1, 0})};
  const Tensor y = run1("QLinearConv", 10, {}, in);
  EXPECT_EQ(y.dtype(), DataType::Int8);
  EXPECT_EQ(y.to_int64_vector("y"), (std::vector<int64_t>{12, 12, 14, 14, 10, 9, 8, 8}));
}

// ---------------------------------------------------------------------------------------------
// Gradients: they flow through Cast between the compute floating types (float16, bfloat16,
// float32, float64) only; a narrow float value ends the path like an integer one.

// d sum(Cast(Cast(x, through), float32)) / dx at x = [0.3, -2].
std::vector<double> gradient_through_cast(DataType through) {
  onnx::ModelProto model;
  model.set_ir_version(10);
  model.add_opset_import()->set_version(21);
  auto* training = model.add_opset_import();
  training->set_domain("ai.onnx.preview.training");
  training->set_version(1);
  auto& g = *model.mutable_graph();
  g.set_name("g");
  testing::typed_value(g.add_input(), "x", onnx::TensorProto::FLOAT, {2});
  testing::add_node(g, "Cast", {"x"}, {"n"})->add_attribute()->CopyFrom(to(through));
  testing::add_node(g, "Cast", {"n"}, {"f"})->add_attribute()->CopyFrom(to(DataType::Float32));
  testing::add_node(g, "ReduceSum", {"f"}, {"y"});
  auto* grad = testing::add_node(g, "Gradient", {"x"}, {"dx"});
  grad->set_domain("ai.onnx.preview.training");
  auto* xs = grad->add_attribute();
  xs->set_name("xs");
  xs->set_type(onnx::AttributeProto::STRINGS);
  xs->add_strings("x");
  grad->add_attribute()->CopyFrom(attr("y", std::string("y")));
  g.add_output()->set_name("dx");
  return runtime::Session(model).run({{"x", f32({0.3f, -2.0f})}}).at("dx").to_double_vector();
}

TEST(CastGradient, FlowsBetweenFloatingTypesOnly) {
  // Float8 needs opset 19+, where ops of the backward graph have newer versions than 17.
  for (const char* op : {"Shape", "Expand", "ConstantOfShape", "Identity", "ReduceSum"}) {
    if (!ops::find_kernel("", op, 21)) GTEST_SKIP() << op << " at opset 21 has no kernel row in this build";
  }
  EXPECT_EQ(gradient_through_cast(DataType::Float16), (std::vector<double>{1, 1}));
  EXPECT_EQ(gradient_through_cast(DataType::Float8E4M3FN), (std::vector<double>{0, 0}));
  EXPECT_EQ(gradient_through_cast(DataType::Int4), (std::vector<double>{0, 0}));
}

}  // namespace
}  // namespace onnxtrain
