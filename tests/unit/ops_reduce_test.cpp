// Unit tests of reduce.cpp (Reduce*, ArgMax/ArgMin, CumSum, TopK) and generators.cpp
// (Constant, ConstantOfShape, Range, EyeLike): axis layouts the collapsed view must get right,
// long sums, empty axes, integer wrap-around, NaN, opset variants and errors. Expected values
// are worked out by hand or by the naive loops below. Infinities are checked explicitly
// (expect_close does not handle an infinite expected value).
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "onnxtrain/error.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::attr;
using testing::throws_with;
using testing::f32;
using testing::i64;
using testing::iota;
using testing::run1;
using testing::expect_close;
using testing::NodeSpec;
using testing::run_node;
using Ints = std::vector<int64_t>;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

template <class T>
Tensor scalar(T v) {
  return Tensor::scalar<T>(v);
}

std::vector<Tensor> run2(const std::string& op, int opset, std::vector<onnx::AttributeProto> attrs,
                         const std::vector<Tensor>& in) {
  return run_node(NodeSpec{op, "", opset, std::move(attrs), 2}, in);
}
Tensor reduce(const std::string& op, const Tensor& x, const Ints& axes, int64_t keepdims = 1,
              int opset = 13) {
  std::vector<onnx::AttributeProto> a{attr("keepdims", keepdims)};
  if (!axes.empty()) a.push_back(attr("axes", axes));
  return run1(op, opset, a, {x});
}

void expect_values(const Tensor& t, const Shape& shape, const std::vector<double>& want) {
  ASSERT_EQ(t.shape(), shape) << t.description();
  EXPECT_EQ(t.to_double_vector(), want) << t.description();
}
void expect_typed(const Tensor& t, DataType dtype, const Shape& shape, const std::vector<double>& want) {
  EXPECT_EQ(t.dtype(), dtype) << t.description();
  expect_values(t, shape, want);
}

onnx::AttributeProto iattr(const std::string& name, int64_t value) { return attr(name, value); }

// Whether f throws an Error whose message contains `part`.
// ---------------------------------------------------------------- Reduce*

// ReduceSum and ReduceMax over the axes in `mask` (bit d: axis d) of a rank-3 tensor, against
// a naive loop. The values are small integers, so float32 sums are exact.
void expect_naive(const Shape& shape, int mask) {
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(static_cast<int64_t>(i * 7 % 13) - 6);
  Ints axes;
  Shape out = shape;
  for (size_t d = 0; d < 3; ++d) {
    if (mask >> d & 1) axes.push_back(static_cast<int64_t>(d)), out[d] = 1;
  }
  std::vector<double> sum(static_cast<size_t>(out.numel()), 0), max(sum.size(), -100);
  for (int64_t i = 0; i < shape[0]; ++i)
    for (int64_t j = 0; j < shape[1]; ++j)
      for (int64_t k = 0; k < shape[2]; ++k) {
        const auto o = static_cast<size_t>(((mask & 1 ? 0 : i) * out[1] + (mask & 2 ? 0 : j)) * out[2] +
                                           (mask & 4 ? 0 : k));
        const double value = v[static_cast<size_t>((i * shape[1] + j) * shape[2] + k)];
        sum[o] += value;
        max[o] = std::max(max[o], value);
      }
  const Tensor x = f32(shape, v);
  expect_values(reduce("ReduceSum", x, axes, 1, 11), out, sum);
  expect_values(reduce("ReduceMax", x, axes), out, max);
}

TEST(Reduce, AxisLayoutsMatchANaiveLoop) {
  // Contiguous rows, columns, and mixes such as reduced-kept-reduced.
  for (int mask = 1; mask < 8; ++mask) expect_naive({2, 3, 4}, mask);
  // Large enough for the split paths: more than 32 rows per output folded as a tree, row
  // ranges reduced as parts and merged, and output blocks cut into column chunks.
  expect_naive({70, 3, 600}, 0b101);
  expect_naive({3000, 40, 1}, 0b001);
  expect_naive({40, 3000, 2}, 0b010);
  expect_naive({2, 70000, 1}, 0b001);
}

TEST(Reduce, EveryKindOnAHandExample) {
  const Tensor x = f32({2, 3}, {1, -2, 3, 4, 5, -6});
  expect_close(reduce("ReduceSum", x, {1}, 0, 11), f32({2}, {2, 3}));
  expect_close(reduce("ReduceMean", x, {1}, 0), f32({2}, {2.0f / 3, 1}));
  expect_close(reduce("ReduceMax", x, {1}, 0), f32({2}, {3, 5}));
  expect_close(reduce("ReduceMin", x, {1}, 0), f32({2}, {-2, -6}));
  expect_close(reduce("ReduceProd", x, {1}, 0), f32({2}, {-6, -120}));
  expect_close(reduce("ReduceL1", x, {1}, 0), f32({2}, {6, 15}));
  expect_close(reduce("ReduceL2", x, {1}, 0), f32({2}, {std::sqrt(14.0f), std::sqrt(77.0f)}));
  expect_close(reduce("ReduceSumSquare", x, {1}, 0), f32({2}, {14, 77}));
  expect_close(reduce("ReduceLogSum", x, {1}, 0), f32({2}, {std::log(2.0f), std::log(3.0f)}));
  auto lse = [](double a, double b, double c = -1e300) {
    return static_cast<float>(std::log(std::exp(a) + std::exp(b) + std::exp(c)));
  };
  expect_close(reduce("ReduceLogSumExp", x, {1}, 0), f32({2}, {lse(1, -2, 3), lse(4, 5, -6)}));
  expect_close(reduce("ReduceLogSumExp", x, {0}, 0), f32({3}, {lse(1, 4), lse(-2, 5), lse(3, -6)}));
  // Axis 0 (column mode), keepdims.
  expect_close(reduce("ReduceProd", x, {0}, 1), f32({1, 3}, {4, -10, -18}));
  expect_close(reduce("ReduceMean", x, {-2}, 1), f32({1, 3}, {2.5f, 1.5f, -1.5f}));
}

TEST(Reduce, NonFiniteValues) {
  // Max and min propagate NaN; log-sum-exp shifts by the maximum and keeps infinities.
  const auto max = reduce("ReduceMax", f32({2, 2}, {kNaN, 1, 2, kNaN}), {1}, 0).to_double_vector();
  const auto min = reduce("ReduceMin", f32({2, 2}, {kNaN, 1, 2, kNaN}), {1}, 0).to_double_vector();
  EXPECT_TRUE(std::isnan(max[0]) && std::isnan(max[1]) && std::isnan(min[0]) && std::isnan(min[1]));
  const auto v =
      reduce("ReduceLogSumExp", f32({2, 2}, {1000, 1000, -kInf, -kInf}), {1}, 0).to_double_vector();
  EXPECT_NEAR(v[0], 1000 + std::log(2.0), 1e-3);
  EXPECT_TRUE(std::isinf(v[1]) && v[1] < 0) << v[1];
  const auto big = reduce("ReduceLogSumExp", f32({2}, {kInf, 1}), {0}, 0).to_double_vector();
  EXPECT_TRUE(std::isinf(big[0]) && big[0] > 0);
}

TEST(Reduce, EmptyAxisGivesTheIdentity) {
  const Tensor x = f32({2, 0}, {});
  expect_values(reduce("ReduceSum", x, {1}, 0, 11), {2}, {0, 0});
  expect_values(reduce("ReduceProd", x, {1}, 0), {2}, {1, 1});
  expect_values(reduce("ReduceL2", x, {1}, 0), {2}, {0, 0});
  const auto max = reduce("ReduceMax", x, {1}, 0).to_double_vector();
  const auto min = reduce("ReduceMin", x, {1}, 1).to_double_vector();
  const auto lse = reduce("ReduceLogSumExp", x, {1}, 0).to_double_vector();
  const auto mean = reduce("ReduceMean", x, {1}, 0).to_double_vector();
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(std::isinf(max[i]) && max[i] < 0);
    EXPECT_TRUE(std::isinf(min[i]) && min[i] > 0);
    EXPECT_TRUE(std::isinf(lse[i]) && lse[i] < 0);
    EXPECT_TRUE(std::isnan(mean[i]));
  }
  const Tensor xi = Tensor::from_vector<int32_t>({0, 2}, {});  // integers: the type's limits
  expect_values(reduce("ReduceMax", xi, {0}, 0), {2}, {-2147483648.0, -2147483648.0});
  expect_values(reduce("ReduceMin", xi, {0}, 0), {2}, {2147483647.0, 2147483647.0});
  EXPECT_EQ(reduce("ReduceSum", f32({0, 3}, {}), {1}, 0, 11).shape(), (Shape{0}));  // empty output
}

TEST(Reduce, LongSumsArePairwise) {
  // 0.1f added one by one in float32 drifts by ~1% over 10^6 terms; pairwise stays exact to
  // float precision. Row mode (one long row) and column mode (a long column per output).
  const int64_t n = 1 << 20;
  const double want = static_cast<double>(n) * static_cast<double>(0.1f);
  const auto row = reduce("ReduceSum", f32({n}, std::vector<float>(n, 0.1f)), {0}, 0, 11).to_double_vector();
  EXPECT_NEAR(row[0], want, want * 1e-6);
  const Tensor cols = f32({n / 2, 2}, std::vector<float>(n, 0.1f));
  const auto col = reduce("ReduceSum", cols, {0}, 0, 11).to_double_vector();
  for (double c : col) EXPECT_NEAR(c, want / 2, want * 1e-6);
  EXPECT_NEAR(reduce("ReduceMean", cols, {}, 0).to_double_vector()[0], 0.1, 1e-7);
}

TEST(Reduce, IntegerAndHalfTypes) {
  // int8 sums wrap like numpy's astype; integer means truncate.
  expect_values(reduce("ReduceSum", Tensor::from_vector<int8_t>({2}, {100, 100}), {}, 0, 11), Shape{}, {-56});
  expect_values(reduce("ReduceMean", Tensor::from_vector<int32_t>({3}, {1, 2, -6}), {}, 0), Shape{}, {-1});
  expect_values(reduce("ReduceL1", Tensor::from_vector<int64_t>({2}, {-3, 4}), {}, 0), Shape{}, {7});
  expect_values(reduce("ReduceProd", Tensor::from_vector<uint8_t>({3}, {2, 3, 4}), {}, 0), Shape{}, {24});
  expect_values(reduce("ReduceMin", Tensor::from_vector<uint64_t>({2}, {5, 3}), {}, 0), Shape{}, {3});
  const Tensor h = Tensor::from_vector<Float16>({3}, {Float16(1.5f), Float16(2.0f), Float16(-0.5f)});
  expect_close(reduce("ReduceSum", h, {}, 0, 11), Tensor::from_vector<Float16>({}, {Float16(3.0f)}));
}

TEST(Reduce, AxesDefaultsAndErrors) {
  const Tensor x = iota({2, 3});
  expect_values(reduce("ReduceSum", x, {}, 0, 11), Shape{}, {15});
  expect_values(reduce("ReduceMax", x, {}, 1), {1, 1}, {5});
  expect_values(reduce("ReduceMin", scalar(7.0f), {}, 0), Shape{}, {7});
  // Reducing only size-1 dims maps each element.
  expect_close(reduce("ReduceL2", f32({2, 1}, {-3, 4}), {1}, 0), f32({2}, {3, 4}));
  expect_values(reduce("ReduceSum", x, {-1}, 0, 11), {2}, {3, 12});
  EXPECT_TRUE(throws_with([&] { reduce("ReduceSum", x, {-1}, 0, 10); }, "opset 11"));
  EXPECT_TRUE(throws_with([&] { reduce("ReduceMax", x, {1, -1}, 0); }, "twice"));
  EXPECT_THROW(reduce("ReduceMean", x, {2}), Error);
  EXPECT_THROW(reduce("ReduceMean", x, {-3}), Error);
}

TEST(ReduceSum, Opset13AxesInput) {
  const Tensor x = iota({2, 3});
  expect_values(run1("ReduceSum", 13, {iattr("keepdims", 0)}, {x, i64({1})}), {2}, {3, 12});
  expect_values(run1("ReduceSum", 13, {}, {x, i64({-2})}), {1, 3}, {3, 5, 7});
  expect_values(run1("ReduceSum", 13, {}, {x}), {1, 1}, {15});                     // no axes: all
  expect_values(run1("ReduceSum", 13, {}, {x, i64(Shape{0}, {})}), {1, 1}, {15});  // empty axes: all
  const Tensor noop = run1("ReduceSum", 13, {iattr("noop_with_empty_axes", 1)}, {x, i64(Shape{0}, {})});
  expect_values(noop, {2, 3}, x.to_double_vector());
  expect_values(run1("ReduceSum", 13, {iattr("noop_with_empty_axes", 1)}, {x, i64({0})}), {1, 3}, {3, 5, 7});
  EXPECT_THROW(run1("ReduceSum", 13, {}, {x, Tensor::from_vector<float>({1}, {1})}), Error);
  EXPECT_THROW(run1("ReduceSum", 13, {attr("axes", Ints{1})}, {x}), Error);  // attribute form is gone
}

// Opset 18 moves every reduction's axes to an optional input, with noop_with_empty_axes.
TEST(Reduce, Opset18AxesInputForEveryKind) {
  const Tensor x = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  // Row sums 6 and 15; row maxima 3 and 6; the same axis as an attribute at opset 17.
  for (const char* op : {"ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                         "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"}) {
    SCOPED_TRACE(op);
    const Tensor by_attr = reduce(op, x, {1}, 0, 17);
    expect_close(run1(op, 18, {iattr("keepdims", 0)}, {x, i64({1})}), by_attr);
    expect_close(run1(op, 18, {iattr("keepdims", 0)}, {x, i64({-1})}), by_attr);
    expect_close(run1(op, 18, {}, {x}), reduce(op, x, {}, 1, 17));                 // no axes: all
    expect_close(run1(op, 18, {}, {x, i64(Shape{0}, {})}), reduce(op, x, {}, 1, 17));  // empty: all
    EXPECT_TRUE(throws_with([&] { run1(op, 18, {attr("axes", Ints{1})}, {x}); }, "second input"));
    EXPECT_TRUE(throws_with([&] { run1(op, 17, {iattr("noop_with_empty_axes", 1)}, {x}); }, "opset 18"));
  }
  expect_values(run1("ReduceMean", 18, {iattr("keepdims", 0)}, {x, i64({1})}), {2}, {2, 5});
  expect_values(run1("ReduceMax", 20, {}, {x, i64({0})}), {1, 3}, {4, 5, 6});
  // Duplicates and out-of-range axes name the input.
  EXPECT_TRUE(throws_with([&] { run1("ReduceMean", 18, {}, {x, i64({1, -1})}); }, "twice"));
  EXPECT_TRUE(throws_with([&] { run1("ReduceMax", 18, {}, {x, i64({2})}); }, "axes"));
  EXPECT_THROW(run1("ReduceMin", 18, {}, {x, Tensor::from_vector<int32_t>({1}, {1})}), Error);  // int64 only
}

// noop_with_empty_axes reduces over no axes: the reduction's other steps still apply (ONNX op
// doc: "ReduceLogSum returns the Log of input tensor, and ReduceSumSquare returns the Square").
TEST(Reduce, NoopWithEmptyAxesKeepsTheNonReductionSteps) {
  const Tensor x = f32({2, 2}, {-1, 2, 0.5f, 4});
  const auto noop = [&](const std::string& op, bool omit_axes) {
    std::vector<Tensor> in{x};
    if (!omit_axes) in.push_back(i64(Shape{0}, {}));
    return run1(op, 18, {iattr("noop_with_empty_axes", 1), iattr("keepdims", 0)}, in);
  };
  for (bool omit : {true, false}) {
    SCOPED_TRACE(omit ? "axes omitted" : "empty axes");
    for (const char* op : {"ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd"}) expect_close(noop(op, omit), x);
    expect_close(noop("ReduceL1", omit), f32({2, 2}, {1, 2, 0.5f, 4}));
    expect_close(noop("ReduceL2", omit), f32({2, 2}, {1, 2, 0.5f, 4}));
    expect_close(noop("ReduceSumSquare", omit), f32({2, 2}, {1, 4, 0.25f, 16}));
    expect_close(noop("ReduceLogSumExp", omit), x);
    const Tensor log_sum = noop("ReduceLogSum", omit);
    EXPECT_TRUE(std::isnan(log_sum.to_double_vector()[0]));  // log(-1)
    EXPECT_NEAR(log_sum.to_double_vector()[1], std::log(2.0), 1e-6);
    EXPECT_NEAR(log_sum.to_double_vector()[3], std::log(4.0), 1e-6);
  }
  // With axes given, noop_with_empty_axes changes nothing.
  expect_values(run1("ReduceMax", 18, {iattr("noop_with_empty_axes", 1)}, {x, i64({0})}), {1, 2}, {0.5, 4});
}

// ReduceMax/ReduceMin-20 take bool (False < True): any and all; an empty reduction gives False
// and True (the ONNX reference's identities).
TEST(Reduce, BoolMaxAndMinFromOpset20) {
  const Tensor b = Tensor::from_vector<bool>({2, 3}, {true, false, false, true, true, true});
  expect_typed(run1("ReduceMax", 20, {iattr("keepdims", 0)}, {b, i64({1})}), DataType::Bool, {2}, {1, 1});
  expect_typed(run1("ReduceMin", 20, {iattr("keepdims", 0)}, {b, i64({1})}), DataType::Bool, {2}, {0, 1});
  expect_values(run1("ReduceMin", 20, {}, {b, i64({0})}), {1, 3}, {1, 0, 0});
  expect_values(run1("ReduceMax", 20, {}, {b}), {1, 1}, {1});
  const Tensor empty = Tensor::from_vector<bool>({2, 0}, {});
  expect_values(run1("ReduceMax", 20, {iattr("keepdims", 0)}, {empty, i64({1})}), {2}, {0, 0});
  expect_values(run1("ReduceMin", 20, {iattr("keepdims", 0)}, {empty, i64({1})}), {2}, {1, 1});
  // Long rows and columns go through the vectorized paths.
  std::vector<bool> v(3000, false);
  v[2717] = true;
  const Tensor col = Tensor::from_vector<bool>({3000, 1}, v);
  expect_values(run1("ReduceMax", 20, {iattr("keepdims", 0)}, {col, i64({0})}), {1}, {1});
  expect_values(run1("ReduceMin", 20, {iattr("keepdims", 0)}, {col, i64({0})}), {1}, {0});
  // Before opset 20, and for the other reductions, bool is not a type of the op.
  EXPECT_TRUE(throws_with([&] { run1("ReduceMax", 18, {}, {b}); }, "bool"));
  EXPECT_TRUE(throws_with([&] { run1("ReduceSum", 20, {}, {b}); }, "bool"));
}

// ReduceLogSum and ReduceLogSumExp drop the integer types at opset 28.
TEST(Reduce, LogSumOfIntegersEndsAtOpset28) {
  const Tensor n = Tensor::from_vector<int32_t>({3}, {1, 2, 4});
  expect_typed(run1("ReduceLogSum", 18, {iattr("keepdims", 0)}, {n}), DataType::Int32, {}, {1});  // trunc(log 7)
  expect_typed(run1("ReduceLogSum", 27, {iattr("keepdims", 0)}, {n}), DataType::Int32, {}, {1});
  EXPECT_TRUE(throws_with([&] { run1("ReduceLogSum", 28, {}, {n}); }, "int32"));
  EXPECT_TRUE(throws_with([&] { run1("ReduceLogSumExp", 28, {}, {n}); }, "int32"));
  const Tensor f = f32({3}, {1, 2, 4});
  EXPECT_NEAR(run1("ReduceLogSum", 28, {iattr("keepdims", 0)}, {f}).to_double_vector()[0], std::log(7.0), 1e-6);
}

// ---------------------------------------------------------------- ArgMax, ArgMin

TEST(ArgReduce, FirstAndLastIndex) {
  const Tensor x = f32({2, 3}, {1, 3, 3, 2, 2, 1});
  auto arg = [&](const std::string& op, int64_t axis, int64_t last, int64_t keep = 1) {
    return run1(op, 13, {attr("axis", axis), attr("select_last_index", last), attr("keepdims", keep)}, {x});
  };
  expect_typed(arg("ArgMax", 1, 0), DataType::Int64, {2, 1}, {1, 0});
  expect_values(arg("ArgMax", -1, 1, 0), {2}, {2, 1});
  expect_values(arg("ArgMin", 1, 0, 0), {2}, {0, 2});
  expect_values(arg("ArgMin", 1, 1, 0), {2}, {0, 2});
  expect_values(arg("ArgMax", 0, 0, 0), {3}, {1, 0, 0});  // column mode
  expect_values(arg("ArgMin", 0, 1, 0), {3}, {0, 1, 1});
  expect_values(run1("ArgMax", 1, {}, {x}), {1, 3}, {1, 0, 0});  // default axis 0
}

TEST(ArgReduce, NaNWinsAndErrors) {
  const Tensor x = f32({4}, {1, kNaN, 3, kNaN});
  expect_values(run1("ArgMax", 13, {}, {x}), {1}, {1});
  expect_values(run1("ArgMin", 13, {iattr("select_last_index", 1)}, {x}), {1}, {3});
  EXPECT_THROW(run1("ArgMax", 11, {iattr("select_last_index", 1)}, {x}), Error);
  EXPECT_THROW(run1("ArgMax", 10, {iattr("axis", -1)}, {x}), Error);
  EXPECT_THROW(run1("ArgMax", 13, {iattr("axis", 1)}, {x}), Error);
  EXPECT_TRUE(throws_with([&] { run1("ArgMin", 13, {iattr("axis", 1)}, {f32({2, 0}, {})}); }, "empty"));
  EXPECT_EQ(run1("ArgMin", 13, {iattr("axis", 1)}, {f32({0, 3}, {})}).shape(), (Shape{0, 1}));
}

TEST(ArgReduce, LongRowsAndWideColumns) {
  // A 1500-long row is searched block by block: ties and NaN in different blocks.
  std::vector<float> v(1500, 0.0f);
  v[700] = v[1300] = 5;
  const Tensor x = f32({1, 1500}, v);
  const std::vector<onnx::AttributeProto> last{iattr("axis", 1), iattr("select_last_index", 1)};
  expect_values(run1("ArgMax", 13, {iattr("axis", 1)}, {x}), {1, 1}, {700});
  expect_values(run1("ArgMax", 13, last, {x}), {1, 1}, {1300});
  v[900] = v[1400] = kNaN;
  expect_values(run1("ArgMin", 13, {iattr("axis", 1)}, {f32({1, 1500}, v)}), {1, 1}, {900});
  expect_values(run1("ArgMax", 13, last, {f32({1, 1500}, v)}), {1, 1}, {1400});
  // 1500 columns: more than one column block.
  std::vector<float> w(3000, 1.0f);
  w[1499] = 2;  // column 1499: row 0 wins
  w[1500] = 3;  // column 0: row 1 wins
  const auto first = run1("ArgMax", 13, {}, {f32({2, 1500}, w)}).to_double_vector();
  const auto final =
      run1("ArgMax", 13, {iattr("select_last_index", 1)}, {f32({2, 1500}, w)}).to_double_vector();
  EXPECT_TRUE(first[0] == 1 && first[1] == 0 && first[1499] == 0);
  EXPECT_TRUE(final[0] == 1 && final[1] == 1 && final[1499] == 0);
}

// ---------------------------------------------------------------- CumSum

TEST(CumSum, ExclusiveAndReverse) {
  const Tensor x = f32({3}, {1, 2, 3});
  const Tensor axis = scalar<int64_t>(0);
  auto cs = [&](int64_t exclusive, int64_t reverse) {
    return run1("CumSum", 14, {attr("exclusive", exclusive), attr("reverse", reverse)}, {x, axis});
  };
  expect_values(cs(0, 0), {3}, {1, 3, 6});
  expect_values(cs(1, 0), {3}, {0, 1, 3});
  expect_values(cs(0, 1), {3}, {6, 5, 3});
  expect_values(cs(1, 1), {3}, {5, 3, 0});
}

TEST(CumSum, AxesTypesAndErrors) {
  const Tensor x = iota({2, 3});
  expect_values(run1("CumSum", 11, {}, {x, scalar<int32_t>(0)}), {2, 3}, {0, 1, 2, 3, 5, 7});
  expect_values(run1("CumSum", 11, {}, {x, i64({-1})}), {2, 3}, {0, 1, 3, 3, 7, 12});
  const Tensor xi = Tensor::from_vector<int64_t>({2, 2}, {5, -1, 7, 2});
  expect_values(run1("CumSum", 14, {iattr("reverse", 1)}, {xi, scalar<int64_t>(0)}), {2, 2}, {12, 1, 7, 2});
  EXPECT_THROW(run1("CumSum", 14, {}, {x, scalar<int64_t>(2)}), Error);
  EXPECT_THROW(run1("CumSum", 14, {}, {x, i64({0, 1})}), Error);
  EXPECT_THROW(run1("CumSum", 14, {}, {x, scalar<float>(0)}), Error);
}

// ---------------------------------------------------------------- TopK

TEST(TopK, LargestSmallestTiesAndAxes) {
  const Tensor x = f32({1, 4}, {3, 1, 3, 2});
  auto top = run2("TopK", 11, {}, {x, i64({2})});
  expect_values(top[0], {1, 2}, {3, 3});
  expect_values(top[1], {1, 2}, {0, 2});
  top = run2("TopK", 11, {iattr("largest", 0)}, {x, i64({3})});
  expect_values(top[0], {1, 3}, {1, 2, 3});
  expect_values(top[1], {1, 3}, {1, 3, 0});
  top = run2("TopK", 1, {iattr("k", 1)}, {x});  // opset 1: k attribute
  expect_values(top[1], {1, 1}, {0});
  top = run2("TopK", 13, {iattr("axis", 0)}, {f32({3, 2}, {1, 6, 5, 2, 3, 4}), i64({2})});
  expect_values(top[0], {2, 2}, {5, 6, 3, 4});
  expect_values(top[1], {2, 2}, {1, 0, 2, 2});
  top = run2("TopK", 13, {}, {x, i64({0})});
  EXPECT_EQ(top[0].shape(), (Shape{1, 0}));
}

TEST(TopK, NaNIsGreatestAndErrors) {
  const Tensor x = f32({4}, {2, kNaN, 5, 1});
  auto top = run2("TopK", 11, {}, {x, i64({2})});
  expect_values(top[1], {2}, {1, 2});
  top = run2("TopK", 11, {iattr("largest", 0)}, {x, i64({4})});
  expect_values(top[1], {4}, {3, 0, 2, 1});
  EXPECT_THROW(run2("TopK", 11, {}, {x, i64({5})}), Error);
  EXPECT_THROW(run2("TopK", 11, {}, {x, i64({-1})}), Error);
  EXPECT_THROW(run2("TopK", 11, {}, {x, scalar<int32_t>(1)}), Error);
  EXPECT_THROW(run2("TopK", 10, {iattr("largest", 0)}, {x, i64({1})}), Error);
  EXPECT_THROW(run2("TopK", 9, {}, {x}), Error);  // k attribute missing
}

// ---------------------------------------------------------------- generators

onnx::AttributeProto tensor_attr(const std::string& name, int32_t dtype, const Ints& dims,
                                 const std::vector<float>& floats, const Ints& ints = {}) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::TENSOR);
  auto* t = a.mutable_t();
  t->set_data_type(dtype);
  for (int64_t d : dims) t->add_dims(d);
  for (float f : floats) t->add_float_data(f);
  for (int64_t i : ints) t->add_int64_data(i);
  return a;
}

TEST(Constant, AttributeForms) {
  expect_values(run1("Constant", 9, {tensor_attr("value", 1, {2}, {1.5f, -2})}, {}), {2}, {1.5, -2});
  expect_typed(run1("Constant", 12, {attr("value_float", 2.5f)}, {}), DataType::Float32, Shape{}, {2.5});
  expect_typed(run1("Constant", 13, {attr("value_ints", Ints{4, 5})}, {}), DataType::Int64, {2}, {4, 5});
  expect_values(run1("Constant", 13, {iattr("value_int", -3)}, {}), Shape{}, {-3});
  expect_values(run1("Constant", 13, {attr("value_floats", std::vector<float>{1, 2})}, {}), {2}, {1, 2});
  EXPECT_TRUE(throws_with([] { run1("Constant", 13, {attr("value_string", std::string("a"))}, {}); },
                          "not supported"));
  EXPECT_THROW(run1("Constant", 11, {attr("value_float", 1.0f)}, {}), Error);
  EXPECT_THROW(run1("Constant", 13, {attr("value_float", 1.0f), iattr("value_int", 1)}, {}), Error);
  EXPECT_THROW(run1("Constant", 13, {}, {}), Error);
}

TEST(ConstantOfShape, ValueAndShape) {
  expect_typed(run1("ConstantOfShape", 9, {}, {i64({2, 3})}), DataType::Float32, {2, 3},
               std::vector<double>(6, 0));
  expect_typed(run1("ConstantOfShape", 9, {tensor_attr("value", 7, {1}, {}, {7})}, {i64({3})}),
               DataType::Int64, {3}, {7, 7, 7});
  expect_values(run1("ConstantOfShape", 9, {tensor_attr("value", 1, {1}, {2})}, {i64(Shape{0}, {})}), Shape{},
                {2});
  EXPECT_EQ(run1("ConstantOfShape", 9, {}, {i64({2, 0})}).numel(), 0);
  EXPECT_THROW(run1("ConstantOfShape", 9, {}, {i64({2, -1})}), Error);
  EXPECT_THROW(run1("ConstantOfShape", 9, {tensor_attr("value", 1, {2}, {1, 2})}, {i64({2})}), Error);
}

TEST(Range, CountsAndTypes) {
  expect_values(run1("Range", 11, {}, {scalar(3.0f), scalar(9.0f), scalar(3.0f)}), {2}, {3, 6});
  expect_values(run1("Range", 11, {}, {scalar(3.0f), scalar(10.0f), scalar(3.0f)}), {3}, {3, 6, 9});
  expect_values(run1("Range", 11, {}, {scalar<int32_t>(10), scalar<int32_t>(4), scalar<int32_t>(-2)}), {3},
                {10, 8, 6});
  expect_values(run1("Range", 11, {}, {scalar(0.5), scalar(-1.0), scalar(-0.5)}), {3}, {0.5, 0, -0.5});
  EXPECT_EQ(run1("Range", 11, {}, {scalar<int64_t>(5), scalar<int64_t>(1), scalar<int64_t>(1)}).shape(),
            (Shape{0}));
  const int64_t big = std::numeric_limits<int64_t>::max();
  expect_values(run1("Range", 11, {}, {scalar<int64_t>(big - 2), scalar<int64_t>(big), scalar<int64_t>(1)}),
                {2}, {double(big - 2), double(big - 1)});
  EXPECT_THROW(run1("Range", 11, {}, {scalar<int64_t>(0), scalar<int64_t>(3), scalar<int64_t>(0)}), Error);
  EXPECT_THROW(run1("Range", 11, {}, {scalar(0.0f), scalar(kInf), scalar(1.0f)}), Error);
  EXPECT_THROW(run1("Range", 11, {}, {scalar(0.0f), scalar<int64_t>(3), scalar(1.0f)}), Error);
  EXPECT_THROW(run1("Range", 11, {}, {f32({2}, {0, 1}), scalar(3.0f), scalar(1.0f)}), Error);
}

// Range-27 adds float16 and bfloat16, computed in stash_type (float by default, or double) and
// rounded once per element: start + i delta, not a running sum of deltas in the half type.
TEST(Range, HalfTypesComputeInTheStashType) {
  const auto half = [](float v) { return Tensor::scalar<Float16>(Float16(v)); };
  // 2048 + i: float16 represents only even numbers above 2048, so an odd value rounds to even.
  const Tensor h = run1("Range", 27, {}, {half(2048), half(2054), half(1)});
  expect_typed(h, DataType::Float16, {6}, {2048, 2048, 2050, 2052, 2052, 2052});
  // 0.1 steps in bfloat16: each element is the float sum, rounded to bfloat16 once.
  const auto bf = [](float v) { return Tensor::scalar<BFloat16>(BFloat16(v)); };
  const Tensor b = run1("Range", 27, {}, {bf(0), bf(1), bf(0.25f)});
  expect_typed(b, DataType::BFloat16, {4}, {0, 0.25, 0.5, 0.75});
  const BFloat16 step(0.1f);
  const Tensor tenths = run1("Range", 27, {iattr("stash_type", 11)}, {bf(0), bf(1), Tensor::scalar<BFloat16>(step)});
  const std::vector<double> got = tenths.to_double_vector();
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i], static_cast<double>(static_cast<float>(BFloat16(static_cast<float>(i) * static_cast<float>(step)))));
  }
  EXPECT_TRUE(throws_with([&] { run1("Range", 27, {iattr("stash_type", 10)}, {half(0), half(2), half(1)}); },
                          "stash_type"));
  // stash_type has no effect on other types.
  expect_values(run1("Range", 27, {iattr("stash_type", 11)}, {scalar<int32_t>(0), scalar<int32_t>(3), scalar<int32_t>(1)}),
                {3}, {0, 1, 2});
}

TEST(EyeLike, DiagonalsAndDtype) {
  const Tensor x = f32({3, 4}, std::vector<float>(12, 5));
  expect_values(run1("EyeLike", 9, {}, {x}), {3, 4}, {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0});
  expect_typed(run1("EyeLike", 9, {iattr("k", 2), iattr("dtype", 7)}, {x}), DataType::Int64, {3, 4},
               {0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0});
  expect_values(run1("EyeLike", 9, {iattr("k", -1)}, {x}), {3, 4}, {0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0});
  expect_values(run1("EyeLike", 9, {iattr("k", 4)}, {x}), {3, 4}, std::vector<double>(12, 0));
  expect_typed(run1("EyeLike", 9, {iattr("dtype", 9)}, {f32({2, 2}, {0, 0, 0, 0})}), DataType::Bool, {2, 2},
               {1, 0, 0, 1});
  EXPECT_THROW(run1("EyeLike", 9, {}, {f32({3}, {1, 2, 3})}), Error);
}

}  // namespace
}  // namespace onnxtrain
