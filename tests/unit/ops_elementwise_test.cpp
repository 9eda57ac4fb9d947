// Unit tests of the element-wise ops (elementwise_unary.cpp, elementwise_binary.cpp): what the
// ONNX backend tests miss — integer edge cases that must not trap, legacy broadcasting, mixed
// Pow types, float16, NaN handling, and the errors. Expected values are worked out by hand.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "onnxtrain/error.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::attr;
using testing::run1;
using testing::expect_close;
using testing::NodeSpec;
using testing::run_node;

template <class T>
Tensor vec(const Shape& shape, const std::vector<T>& v) {
  return Tensor::from_vector<T>(shape, v);
}
Tensor f32(const std::vector<float>& v) { return vec<float>({static_cast<int64_t>(v.size())}, v); }


TEST(Unary, MathMatchesTheStandardLibrary) {
  const Tensor x = f32({-2.5f, -0.5f, 0.0f, 0.5f, 1.5f, 2.5f});
  const std::vector<float> xs = {-2.5f, -0.5f, 0.0f, 0.5f, 1.5f, 2.5f};
  auto map = [&](float (*f)(float)) {
    std::vector<float> v;
    for (float a : xs) v.push_back(f(a));
    return f32(v);
  };
  expect_close(run1("Exp", 13, {}, {x}), map([](float a) { return std::exp(a); }));
  expect_close(run1("Tanh", 13, {}, {x}), map([](float a) { return std::tanh(a); }));
  expect_close(run1("Erf", 13, {}, {x}), map([](float a) { return std::erf(a); }));
  expect_close(run1("Atan", 7, {}, {x}), map([](float a) { return std::atan(a); }));
  expect_close(run1("Sigmoid", 13, {}, {x}), map([](float a) { return 1.0f / (1.0f + std::exp(-a)); }));
  expect_close(run1("Softplus", 1, {}, {x}), map([](float a) { return std::log(1.0f + std::exp(a)); }));
  expect_close(run1("Relu", 14, {}, {x}), f32({0, 0, 0, 0.5f, 1.5f, 2.5f}));
  // max(x, 0) as the ONNX reference computes it (numpy.maximum): NaN stays NaN.
  EXPECT_TRUE(std::isnan(run1("Relu", 14, {}, {f32({std::nanf("")})}).values<float>()[0]));
  expect_close(run1("Abs", 13, {}, {x}), f32({2.5f, 0.5f, 0, 0.5f, 1.5f, 2.5f}));
  // Round is half to even: -2.5 -> -2, -0.5 -> -0, 0.5 -> 0, 1.5 -> 2, 2.5 -> 2.
  expect_close(run1("Round", 11, {}, {x}), f32({-2, -0.0f, 0, 0, 2, 2}));
  expect_close(run1("Sign", 13, {}, {x}), f32({-1, -1, 0, 1, 1, 1}));
  expect_close(run1("HardSwish", 14, {}, {f32({-4, -1, 0, 1, 4})}),
               f32({0, -1.0f / 3, 0, 2.0f / 3, 4}));
}

TEST(Unary, ExtremeInputsStayFinite) {
  const Tensor x = f32({-1000, 1000});
  expect_close(run1("Sigmoid", 13, {}, {x}), f32({0, 1}));
  expect_close(run1("Softplus", 1, {}, {x}), f32({0, 1000}));
}

TEST(Unary, IntegersAndPredicates) {
  const Tensor i = vec<int32_t>({4}, {-3, 0, 5, std::numeric_limits<int32_t>::min()});
  const Tensor abs = run1("Abs", 13, {}, {i});
  EXPECT_EQ(abs.dtype(), DataType::Int32);
  EXPECT_EQ(abs.to_double_vector(), (std::vector<double>{3, 0, 5, std::numeric_limits<int32_t>::min()}));
  EXPECT_EQ(run1("Neg", 13, {}, {i}).to_double_vector()[2], -5);
  EXPECT_EQ(run1("Relu", 14, {}, {i}).to_double_vector(), (std::vector<double>{0, 0, 5, 0}));
  EXPECT_EQ(run1("Sign", 13, {}, {vec<uint8_t>({2}, {0, 7})}).to_double_vector(), (std::vector<double>{0, 1}));

  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor special = f32({nan, inf, -inf, 1});
  const Tensor isnan = run1("IsNaN", 13, {}, {special});
  EXPECT_EQ(isnan.dtype(), DataType::Bool);
  EXPECT_EQ(isnan.to_double_vector(), (std::vector<double>{1, 0, 0, 0}));
  EXPECT_EQ(run1("IsInf", 10, {}, {special}).to_double_vector(), (std::vector<double>{0, 1, 1, 0}));
  EXPECT_EQ(run1("IsInf", 10, {attr("detect_negative", int64_t{0})}, {special}).to_double_vector(),
            (std::vector<double>{0, 1, 0, 0}));
  EXPECT_EQ(run1("Not", 1, {}, {vec<bool>({2}, {true, false})}).to_double_vector(),
            (std::vector<double>{0, 1}));
}

TEST(Unary, Float16ComputesInFloat) {
  const Tensor x = f32({0.5f, 2.0f}).cast(DataType::Float16);
  const Tensor y = run1("Sqrt", 13, {}, {x});
  EXPECT_EQ(y.dtype(), DataType::Float16);
  expect_close(y.cast(DataType::Float32), f32({std::sqrt(0.5f), std::sqrt(2.0f)}), 1e-3);
}

TEST(Activation, AttributesAndDefaults) {
  const Tensor x = f32({-2, -0.5f, 0.5f, 2});
  expect_close(run1("LeakyRelu", 16, {}, {x}), f32({-0.02f, -0.005f, 0.5f, 2}));
  expect_close(run1("LeakyRelu", 16, {attr("alpha", 0.5f)}, {x}), f32({-1, -0.25f, 0.5f, 2}));
  expect_close(run1("Elu", 6, {}, {x}), f32({std::expm1(-2.0f), std::expm1(-0.5f), 0.5f, 2}));
  expect_close(run1("HardSigmoid", 6, {}, {x}), f32({0.1f, 0.4f, 0.6f, 0.9f}));
  expect_close(run1("ThresholdedRelu", 10, {}, {x}), f32({0, 0, 0, 2}));
  expect_close(run1("Shrink", 9, {attr("lambd", 1.0f), attr("bias", 0.5f)}, {x}), f32({-1.5f, 0, 0, 1.5f}));
  expect_close(run1("Celu", 12, {attr("alpha", 2.0f)}, {x}),
               f32({2 * std::expm1(-1.0f), 2 * std::expm1(-0.25f), 0.5f, 2}));
  const float selu_a = 1.67326319217681884765625f, selu_g = 1.05070102214813232421875f;
  expect_close(run1("Selu", 6, {}, {x}),
               f32({selu_g * selu_a * std::expm1(-2.0f), selu_g * selu_a * std::expm1(-0.5f),
                    selu_g * 0.5f, selu_g * 2}));
  EXPECT_THROW(run1("Celu", 12, {attr("alpha", 0.0f)}, {x}), Error);
}

TEST(Clip, AttributesBeforeOpset11InputsAfter) {
  const Tensor x = f32({-3, 0, 3});
  expect_close(run1("Clip", 6, {attr("min", -1.0f), attr("max", 2.0f)}, {x}), f32({-1, 0, 2}));
  expect_close(run1("Clip", 6, {attr("max", 2.0f)}, {x}), f32({-3, 0, 2}));
  expect_close(run1("Clip", 13, {}, {x, Tensor::scalar(-1.0f), Tensor::scalar(2.0f)}), f32({-1, 0, 2}));
  expect_close(run1("Clip", 13, {}, {x, Tensor(), Tensor::scalar(1.0f)}), f32({-3, 0, 1}));
  // min > max: everything becomes max (Clip-13 doc).
  expect_close(run1("Clip", 13, {}, {x, Tensor::scalar(2.0f), Tensor::scalar(1.0f)}), f32({1, 1, 1}));
  const Tensor ints = run1("Clip", 13, {}, {vec<int64_t>({3}, {-9, 4, 9}), Tensor::scalar<int64_t>(0),
                                            Tensor::scalar<int64_t>(5)});
  EXPECT_EQ(ints.to_double_vector(), (std::vector<double>{0, 4, 5}));
  EXPECT_THROW(run1("Clip", 13, {}, {x, f32({0, 1})}), Error);           // bound is not a scalar
  EXPECT_THROW(run1("Clip", 13, {}, {x, Tensor::scalar(0.0)}), Error);   // bound of another type
}

TEST(Cast, IntAndStringTargetsSaturationAndBool) {
  const Tensor x = f32({-1.7f, 0.0f, 2.9f, 1e10f});
  const Tensor to_int = run1("Cast", 13, {attr("to", int64_t{6})}, {x});  // INT32
  EXPECT_EQ(to_int.dtype(), DataType::Int32);
  EXPECT_EQ(to_int.to_double_vector(), (std::vector<double>{-1, 0, 2, std::numeric_limits<int32_t>::max()}));
  const Tensor to_bool = run1("Cast", 1, {attr("to", std::string("BOOL"))}, {x});  // Cast-1 form
  EXPECT_EQ(to_bool.dtype(), DataType::Bool);
  EXPECT_EQ(to_bool.to_double_vector(), (std::vector<double>{1, 0, 1, 1}));
  const Tensor like = run1("CastLike", 15, {}, {x, vec<double>({1}, {0})});
  EXPECT_EQ(like.dtype(), DataType::Float64);
  EXPECT_THROW(run1("Cast", 6, {attr("to", int64_t{8})}, {x}), Error);   // STRING: from Cast-9
  EXPECT_THROW(run1("Cast", 1, {attr("to", std::string("COMPLEX"))}, {x}), Error);
}

// Cast-9+ to and from strings: shortest round-trip text (as NumPy prints), and numbers read
// from plain, scientific and the special spellings; text that is no number names the input.
TEST(Cast, StringsBothWays) {
  const Tensor x = f32({0.1f, -2.5f, 1e-5f, 3e38f});
  const Tensor text = run1("Cast", 13, {attr("to", int64_t{8})}, {x});
  ASSERT_EQ(text.dtype(), DataType::String);
  EXPECT_EQ(std::vector<std::string>(text.data<std::string>(), text.data<std::string>() + 4),
            (std::vector<std::string>{"0.1", "-2.5", "1e-05", "3e+38"}));
  const Tensor i = run1("Cast", 19, {attr("to", int64_t{8})}, {vec<int64_t>({2}, {-7, 9007199254740993})});
  EXPECT_EQ(i.data<std::string>()[1], "9007199254740993");
  const Tensor words = Tensor::from_vector<std::string>({6}, {"3.25", "1E2", "+INF", "-inf", "nan", " 7"});
  const Tensor back = run1("Cast", 13, {attr("to", int64_t{11})}, {words.view({6})}).view({6});
  const double* v = back.data<double>();
  EXPECT_EQ(v[0], 3.25);
  EXPECT_EQ(v[1], 100);
  EXPECT_TRUE(std::isinf(v[2]) && v[2] > 0);
  EXPECT_TRUE(std::isinf(v[3]) && v[3] < 0);
  EXPECT_TRUE(std::isnan(v[4]));
  EXPECT_EQ(v[5], 7);  // leading space, as strtod reads it
  // Integer targets read integer literals exactly and truncate decimals.
  const Tensor ints = run1("Cast", 13, {attr("to", int64_t{7})},
                           {Tensor::from_vector<std::string>({3}, {"9007199254740993", "100.9", "-3"})});
  EXPECT_EQ(ints.to_int64_vector("ints"), (std::vector<int64_t>{9007199254740993, 100, -3}));
  try {
    run1("Cast", 13, {attr("to", int64_t{1})}, {Tensor::from_vector<std::string>({2}, {"1", "Hello World!"})});
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("element 1 of input 'in0', \"Hello World!\", is not a number"), std::string::npos)
        << e.what();
  }
}

TEST(Identity, SharesTheInputsStorage) {
  const Tensor x = f32({1, 2});
  expect_close(run1("Identity", 16, {}, {x}), x);
}

TEST(Binary, NumpyBroadcasting) {
  const Tensor a = vec<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor row = vec<float>({3}, {10, 20, 30});
  const Tensor col = vec<float>({2, 1}, {100, 200});
  expect_close(run1("Add", 14, {}, {a, row}), vec<float>({2, 3}, {11, 22, 33, 14, 25, 36}));
  expect_close(run1("Sub", 14, {}, {a, col}), vec<float>({2, 3}, {-99, -98, -97, -196, -195, -194}));
  expect_close(run1("Mul", 14, {}, {col, row}), vec<float>({2, 3}, {1000, 2000, 3000, 2000, 4000, 6000}));
  expect_close(run1("Div", 14, {}, {a, Tensor::scalar(2.0f)}), vec<float>({2, 3}, {0.5f, 1, 1.5f, 2, 2.5f, 3}));
  EXPECT_THROW(run1("Add", 14, {}, {a, f32({1, 2})}), Error);
  EXPECT_THROW(run1("Add", 14, {}, {a, vec<double>({3}, {1, 2, 3})}), Error);
}

TEST(Binary, LegacyBroadcastNeedsTheAttribute) {
  const Tensor a = vec<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor per_row = f32({10, 20});
  // Opset 6, broadcast=1, axis=0: B lines up with A's first dim.
  expect_close(run1("Add", 6, {attr("broadcast", int64_t{1}), attr("axis", int64_t{0})}, {a, per_row}),
               vec<float>({2, 3}, {11, 12, 13, 24, 25, 26}));
  // Without an axis B aligns at the right, as numpy does.
  expect_close(run1("Mul", 6, {attr("broadcast", int64_t{1})}, {a, f32({1, 0, -1})}),
               vec<float>({2, 3}, {1, 0, -3, 4, 0, -6}));
  // broadcast=0 requires equal shapes.
  EXPECT_THROW(run1("Add", 6, {}, {a, f32({1, 0, -1})}), Error);
}

TEST(Binary, IntegerDivisionAndModuloNeverTrap) {
  const int32_t min = std::numeric_limits<int32_t>::min();
  const Tensor a = vec<int32_t>({5}, {7, -7, 7, min, 5});
  const Tensor b = vec<int32_t>({5}, {2, 2, 0, -1, -3});
  EXPECT_EQ(run1("Div", 14, {}, {a, b}).to_double_vector(), (std::vector<double>{3, -3, 0, min, -1}));
  // fmod=0 takes the divisor's sign (Python %), fmod=1 the dividend's (C fmod).
  EXPECT_EQ(run1("Mod", 13, {}, {a, b}).to_double_vector(), (std::vector<double>{1, 1, 0, 0, -1}));
  EXPECT_EQ(run1("Mod", 13, {attr("fmod", int64_t{1})}, {a, b}).to_double_vector(),
            (std::vector<double>{1, -1, 0, 0, 2}));
  expect_close(run1("Mod", 13, {attr("fmod", int64_t{1})}, {f32({-7.5f}), f32({2})}), f32({-1.5f}));
}

// Mod-28 defines fmod=0 for floating-point inputs: A - floor(A / B) B with the divisor's sign,
// and the doc's special cases (numpy.mod's); the kernel computes it so in every version.
TEST(Binary, FloatModWithFmod0TakesTheDivisorsSign) {
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor a = f32({7.5f, -7.5f, 7.5f, -7.5f, 0.0f, -0.0f, 3.0f, -3.0f, 3.0f, inf, 1.0f});
  const Tensor b = f32({2.0f, 2.0f, -2.0f, -2.0f, -5.0f, 5.0f, inf, inf, -inf, 2.0f, 0.0f});
  for (int opset : {13, 28}) {
    const std::vector<double> got = run1("Mod", opset, {}, {a, b}).to_double_vector();
    const std::vector<double> want = {1.5, 0.5, -0.5, -1.5, 0, 0, 3, inf, -inf};
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "element " << i;
    EXPECT_TRUE(std::signbit(got[4]));   // +0 mod -5 is -0: the divisor's sign
    EXPECT_FALSE(std::signbit(got[5]));  // -0 mod 5 is +0
    EXPECT_TRUE(std::isnan(got[9]));     // inf mod 2
    EXPECT_TRUE(std::isnan(got[10]));    // 1 mod 0
  }
  // fmod=1 keeps the dividend's sign; float64 and float16 take the same path.
  expect_close(run1("Mod", 28, {attr("fmod", int64_t{1})}, {f32({-7.5f}), f32({2})}), f32({-1.5f}));
  EXPECT_EQ(run1("Mod", 28, {}, {vec<double>({1}, {-1e-3}), vec<double>({1}, {4})}).to_double_vector()[0], 4 - 1e-3);
  EXPECT_EQ(run1("Mod", 28, {}, {vec<Float16>({1}, {Float16(-5.0f)}), vec<Float16>({1}, {Float16(3.0f)})})
                .to_double_vector()[0],
            1.0);
}

// The versions after 17 of the unary math and activations add bfloat16 (22), float16 and
// float64 for Celu (28), float16/bfloat16 for IsInf (20): computed in float like float16.
TEST(Unary, NewerVersionsAddHalfAndDoubleTypes) {
  const std::vector<float> xs = {-1.5f, -0.25f, 0.5f, 2.0f};
  const Tensor bf = vec<BFloat16>({4}, {BFloat16(xs[0]), BFloat16(xs[1]), BFloat16(xs[2]), BFloat16(xs[3])});
  auto want = [&](auto f) {
    std::vector<float> v;
    for (float x : xs) v.push_back(static_cast<float>(BFloat16(f(x))));
    return v;
  };
  auto expect_bf = [&](const Tensor& got, const std::vector<float>& w) {
    EXPECT_EQ(got.dtype(), DataType::BFloat16);
    const std::vector<double> g = got.to_double_vector();
    for (size_t i = 0; i < w.size(); ++i) EXPECT_EQ(g[i], w[i]) << "element " << i;
  };
  expect_bf(run1("Sin", 22, {}, {bf}), want([](float x) { return std::sin(x); }));
  expect_bf(run1("Softplus", 22, {}, {bf}), want([](float x) { return std::log1p(std::exp(x)); }));
  expect_bf(run1("Elu", 22, {}, {bf}), want([](float x) { return x > 0 ? x : std::expm1(x); }));
  expect_bf(run1("Round", 22, {}, {bf}), want([](float x) { return std::nearbyint(x); }));
  const Tensor d = vec<double>({2}, {-2.0, 1.0});
  expect_close(run1("Celu", 28, {attr("alpha", 2.0f)}, {d}), vec<double>({2}, {2.0 * std::expm1(-1.0), 1.0}));
  const Tensor h = vec<Float16>({3}, {Float16(1.0f), Float16(std::numeric_limits<float>::infinity()), Float16(-std::numeric_limits<float>::infinity())});
  EXPECT_EQ(run1("IsInf", 20, {attr("detect_negative", int64_t{0})}, {h}).to_double_vector(), (std::vector<double>{0, 1, 0}));
  EXPECT_THROW(run1("Sin", 22, {}, {vec<int32_t>({1}, {1})}), Error);  // still floating types only
}

TEST(Binary, PowMixedTypesAndIntegerPowers) {
  expect_close(run1("Pow", 15, {}, {f32({2, 4, 9}), vec<int64_t>({3}, {3, -1, 0})}), f32({8, 0.25f, 1}));
  EXPECT_EQ(run1("Pow", 15, {}, {vec<int64_t>({3}, {3, -2, 2}), vec<int64_t>({3}, {4, 3, -1})}).to_double_vector(),
            (std::vector<double>{81, -8, 0}));
  EXPECT_THROW(run1("Pow", 7, {}, {f32({2}), vec<int64_t>({1}, {3})}), Error);  // mixed types need 12
}

TEST(Binary, PReluSlopeBroadcastsToX) {
  const Tensor x = vec<float>({1, 2, 2}, {-1, 1, -2, 2});
  expect_close(run1("PRelu", 16, {}, {x, vec<float>({2, 1}, {0.5f, 0.25f})}),
               vec<float>({1, 2, 2}, {-0.5f, 1, -0.5f, 2}));
  // PRelu-6: a 1-D slope holds one value per channel.
  expect_close(run1("PRelu", 6, {}, {x, f32({0.5f, 0.25f})}), vec<float>({1, 2, 2}, {-0.5f, 1, -0.5f, 2}));
  EXPECT_THROW(run1("PRelu", 16, {}, {f32({1}), f32({1, 2})}), Error);  // slope larger than X
}

TEST(Binary, ComparisonsAndLogicGiveBool) {
  const Tensor a = f32({1, 2, 3});
  const Tensor two = Tensor::scalar(2.0f);
  EXPECT_EQ(run1("Less", 13, {}, {a, two}).to_double_vector(), (std::vector<double>{1, 0, 0}));
  EXPECT_EQ(run1("GreaterOrEqual", 16, {}, {a, two}).to_double_vector(), (std::vector<double>{0, 1, 1}));
  EXPECT_EQ(run1("Equal", 13, {}, {vec<int64_t>({2}, {4, 5}), vec<int64_t>({2}, {4, 6})}).to_double_vector(),
            (std::vector<double>{1, 0}));
  const Tensor t = vec<bool>({2}, {true, false});
  const Tensor f = vec<bool>({2}, {true, true});
  EXPECT_EQ(run1("Xor", 7, {}, {t, f}).to_double_vector(), (std::vector<double>{0, 1}));
  EXPECT_EQ(run1("And", 7, {}, {t, f}).to_double_vector(), (std::vector<double>{1, 0}));
  EXPECT_EQ(run1("Less", 13, {}, {a, two}).dtype(), DataType::Bool);
}

TEST(Variadic, FoldsBroadcastInputsAndPropagatesNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor a = vec<float>({2, 2}, {1, 5, 3, 7});
  const Tensor b = f32({4, nan});
  const Tensor c = Tensor::scalar(2.0f);
  const Tensor max = run1("Max", 13, {}, {a, b, c});
  EXPECT_EQ(max.shape(), (Shape{2, 2}));
  const auto mv = max.to_double_vector();
  EXPECT_EQ(mv[0], 4);
  EXPECT_TRUE(std::isnan(mv[1]));
  EXPECT_EQ(mv[2], 4);
  expect_close(run1("Min", 13, {}, {a, c}), vec<float>({2, 2}, {1, 2, 2, 2}));
  expect_close(run1("Sum", 13, {}, {a, a, c}), vec<float>({2, 2}, {4, 12, 8, 16}));
  expect_close(run1("Mean", 13, {}, {a, c}), vec<float>({2, 2}, {1.5f, 3.5f, 2.5f, 4.5f}));
  expect_close(run1("Sum", 13, {}, {a}), a);
  EXPECT_THROW(run1("Sum", 13, {}, {a, vec<double>({1}, {1})}), Error);
}

TEST(Where, BroadcastsAllThree) {
  const Tensor cond = vec<bool>({2, 1}, {true, false});
  const Tensor x = f32({1, 2, 3});
  const Tensor y = Tensor::scalar(-1.0f);
  expect_close(run1("Where", 16, {}, {cond, x, y}), vec<float>({2, 3}, {1, 2, 3, -1, -1, -1}));
  EXPECT_THROW(run1("Where", 16, {}, {x, x, x}), Error);  // condition must be bool
}

}  // namespace
}  // namespace onnxtrain
