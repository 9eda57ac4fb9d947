// Unit tests of the shape and indexing ops (shape_ops.cpp, indexing.cpp): what the ONNX backend
// tests miss — older opset forms, negative axes, empty tensors, views, dtypes and every error.
// Expected values are worked out by hand or with numpy (noted where numpy was used).
#include <cstring>
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
using testing::f32;
using testing::i64;
using testing::iota;
using testing::run1;
using testing::NodeSpec;
using testing::run_node;

Tensor i32(const std::vector<int32_t>& v) {
  return Tensor::from_vector<int32_t>(Shape{static_cast<int64_t>(v.size())}, v);
}


void expect_values(const Tensor& t, const Shape& shape, const std::vector<double>& want) {
  ASSERT_EQ(t.shape(), shape) << t.description();
  EXPECT_EQ(t.to_double_vector(), want) << t.description();
}

// The message of the Error `f` throws ("" if none).
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// ---------------------------------------------------------------- views

TEST(Reshape, IsAViewOfTheInput) {
  const Tensor x = iota({2, 3, 4});
  const Tensor y = run1("Reshape", 14, {}, {x, i64({4, -1})});
  expect_values(y, {4, 6}, x.to_double_vector());
  EXPECT_TRUE(y.shares_storage_with(x));
}

TEST(Reshape, ZeroCopiesTheInputDimUnlessAllowzero) {
  const Tensor x = iota({2, 0, 3});
  EXPECT_EQ(run1("Reshape", 13, {}, {x, i64({0, 0, 3})}).shape(), (Shape{2, 0, 3}));
  EXPECT_EQ(run1("Reshape", 13, {}, {iota({2, 3}), i64({0, -1})}).shape(), (Shape{2, 3}));
  EXPECT_EQ(run1("Reshape", 14, {attr("allowzero", int64_t{1})}, {x, i64({0, 3, 4})}).shape(),
            (Shape{0, 3, 4}));
  EXPECT_EQ(run1("Reshape", 14, {}, {iota({2, 3}), i64({0, 3})}).shape(), (Shape{2, 3}));
  // allowzero=1: the 0 is a real 0, so a -1 cannot be inferred beside it.
  EXPECT_THROW(run1("Reshape", 14, {attr("allowzero", int64_t{1})}, {x, i64({0, -1})}), Error);
}

TEST(Reshape, Opset4ShapeAttribute) {
  const Tensor x = iota({2, 3});
  const Tensor y = run1("Reshape", 4, {attr("shape", std::vector<int64_t>{3, -1})}, {x});
  expect_values(y, {3, 2}, x.to_double_vector());
  EXPECT_TRUE(y.shares_storage_with(x));
  EXPECT_THROW(run1("Reshape", 4, {}, {x}), Error);
}

TEST(Reshape, ToScalarAndErrors) {
  EXPECT_EQ(run1("Reshape", 14, {}, {f32({1, 1}, {5}), i64(Shape{0}, {})}).shape(), Shape{});
  const Tensor x = iota({2, 3});
  EXPECT_THROW(run1("Reshape", 14, {}, {x, i64({4, 2})}), Error);     // 6 vs 8 elements
  EXPECT_THROW(run1("Reshape", 14, {}, {x, i64({-1, -1})}), Error);   // two -1
  EXPECT_THROW(run1("Reshape", 14, {}, {x, i64({4, -1})}), Error);    // 6 not divisible by 4
  EXPECT_THROW(run1("Reshape", 14, {}, {x, i64({-2, -3})}), Error);   // dims < -1
  EXPECT_THROW(run1("Reshape", 14, {}, {x, i64({6, 1, 0})}), Error);  // 0 beyond the input rank
  EXPECT_THROW(run1("Reshape", 14, {}, {x, i32({6})}), Error);        // shape must be int64
  EXPECT_NE(error_of([&] {
              run1("Reshape", 14, {}, {x, i64({-1, 2, -1})});
            }).find("more than one -1"),
            std::string::npos);
}

TEST(Flatten, AxesAndViews) {
  const Tensor x = iota({2, 3, 4});
  Tensor y = run1("Flatten", 13, {attr("axis", int64_t{0})}, {x});
  EXPECT_EQ(y.shape(), (Shape{1, 24}));
  EXPECT_TRUE(y.shares_storage_with(x));
  EXPECT_EQ(run1("Flatten", 13, {attr("axis", int64_t{3})}, {x}).shape(), (Shape{24, 1}));
  EXPECT_EQ(run1("Flatten", 13, {attr("axis", int64_t{-1})}, {x}).shape(), (Shape{6, 4}));
  EXPECT_EQ(run1("Flatten", 1, {}, {x}).shape(), (Shape{2, 12}));
  EXPECT_EQ(run1("Flatten", 13, {}, {iota({0, 3})}).shape(), (Shape{0, 3}));
  // Negative axes are documented from opset 11 and accepted earlier too (old exporters wrote them).
  EXPECT_EQ(run1("Flatten", 9, {attr("axis", int64_t{-1})}, {x}).shape(), (Shape{6, 4}));
  EXPECT_THROW(run1("Flatten", 13, {attr("axis", int64_t{4})}, {x}), Error);
  EXPECT_THROW(run1("Flatten", 13, {attr("axis", int64_t{-4})}, {x}), Error);
}

TEST(Squeeze, AllFormsAreViews) {
  const Tensor x = iota({1, 3, 1, 2});
  Tensor y = run1("Squeeze", 13, {}, {x});  // no axes: every 1-dim
  EXPECT_EQ(y.shape(), (Shape{3, 2}));
  EXPECT_TRUE(y.shares_storage_with(x));
  EXPECT_EQ(run1("Squeeze", 13, {}, {x, i64({-2})}).shape(), (Shape{1, 3, 2}));
  EXPECT_EQ(run1("Squeeze", 11, {attr("axes", std::vector<int64_t>{0, -2})}, {x}).shape(), (Shape{3, 2}));
  EXPECT_EQ(run1("Squeeze", 1, {attr("axes", std::vector<int64_t>{2})}, {x}).shape(), (Shape{1, 3, 2}));
  EXPECT_EQ(run1("Squeeze", 1, {}, {f32({1, 1}, {7})}).shape(), Shape{});
  EXPECT_EQ(run1("Squeeze", 13, {}, {x, i64(Shape{0}, {})}).shape(), (Shape{3, 2}));  // empty axes: all
}

TEST(Squeeze, Errors) {
  const Tensor x = iota({1, 3, 1, 2});
  EXPECT_NE(error_of([&] { run1("Squeeze", 13, {}, {x, i64({1})}); }).find("not 1"), std::string::npos);
  EXPECT_THROW(run1("Squeeze", 13, {}, {x, i64({4})}), Error);                             // out of range
  EXPECT_THROW(run1("Squeeze", 13, {}, {x, i64({0, -4})}), Error);                         // axis 0 twice
  EXPECT_NO_THROW(run1("Squeeze", 1, {attr("axes", std::vector<int64_t>{-2})}, {x}));  // negative before 11 too
}

TEST(Unsqueeze, AllFormsAreViews) {
  const Tensor x = iota({3, 4});
  Tensor y = run1("Unsqueeze", 13, {}, {x, i64({0, -1})});
  EXPECT_EQ(y.shape(), (Shape{1, 3, 4, 1}));
  EXPECT_TRUE(y.shares_storage_with(x));
  EXPECT_EQ(run1("Unsqueeze", 13, {}, {x, i64({3, 1})}).shape(), (Shape{3, 1, 4, 1}));
  EXPECT_EQ(run1("Unsqueeze", 11, {attr("axes", std::vector<int64_t>{-3})}, {x}).shape(), (Shape{1, 3, 4}));
  EXPECT_EQ(run1("Unsqueeze", 1, {attr("axes", std::vector<int64_t>{2})}, {x}).shape(), (Shape{3, 4, 1}));
  EXPECT_EQ(run1("Unsqueeze", 13, {}, {f32({}, {2}), i64({0})}).shape(), (Shape{1}));
}

// The docs ask for 1-D axes; a 0-D one names one axis (ONNX 1.23's expanded AffineGrid tests give
// Unsqueeze a scalar, which the ONNX reference reads so).
TEST(Unsqueeze, ScalarAxesNameOneAxis) {
  const Tensor x = iota({3, 4});
  EXPECT_EQ(run1("Unsqueeze", 13, {}, {x, Tensor::scalar<int64_t>(1)}).shape(), (Shape{3, 1, 4}));
  EXPECT_EQ(run1("Unsqueeze", 25, {}, {x, Tensor::scalar<int64_t>(-1)}).shape(), (Shape{3, 4, 1}));
  EXPECT_EQ(run1("Squeeze", 21, {}, {iota({3, 1, 4}), Tensor::scalar<int64_t>(1)}).shape(), (Shape{3, 4}));
  EXPECT_THROW(run1("Unsqueeze", 13, {}, {x, Tensor::scalar<int32_t>(1)}), Error);  // int64 only
}

TEST(Unsqueeze, Errors) {
  const Tensor x = iota({3, 4});
  EXPECT_THROW(run1("Unsqueeze", 13, {}, {x, i64({0, 0})}), Error);  // duplicate
  EXPECT_THROW(run1("Unsqueeze", 13, {}, {x, i64({3})}), Error);     // output rank is 3
  EXPECT_THROW(run1("Unsqueeze", 13, {}, {x}), Error);               // axes input required
  EXPECT_THROW(run1("Unsqueeze", 11, {}, {x}), Error);               // axes attribute required
  EXPECT_NO_THROW(run1("Unsqueeze", 1, {attr("axes", std::vector<int64_t>{-1})}, {x}));  // negative before 11 too
}

// ---------------------------------------------------------------- copies

// y[i..] = x[perm applied], by the definition, for checking Transpose.
Tensor transpose_reference(const Tensor& x, const std::vector<int64_t>& perm) {
  Shape out;
  for (int64_t p : perm) out.push_back(x.dim(static_cast<size_t>(p)));
  const Shape in_strides = contiguous_strides(x.shape());
  const auto v = x.to_double_vector();
  std::vector<float> r(v.size());
  std::vector<int64_t> idx(perm.size(), 0);
  for (size_t i = 0; i < r.size(); ++i) {
    int64_t src = 0;
    for (size_t d = 0; d < perm.size(); ++d) src += idx[d] * in_strides[static_cast<size_t>(perm[d])];
    r[i] = static_cast<float>(v[static_cast<size_t>(src)]);
    for (size_t d = perm.size(); d-- > 0;) {
      if (++idx[d] < out[d]) break;
      idx[d] = 0;
    }
  }
  return f32(out, r);
}

TEST(Transpose, DefaultReversesAndPermIsApplied) {
  expect_values(run1("Transpose", 13, {}, {iota({2, 3})}), {3, 2}, {0, 3, 1, 4, 2, 5});
  // numpy: np.arange(24).reshape(2,3,4).transpose(1,2,0)
  expect_values(run1("Transpose", 13, {attr("perm", std::vector<int64_t>{1, 2, 0})}, {iota({2, 3, 4})}),
                {3, 4, 2},
                {0, 12, 1, 13, 2, 14, 3, 15, 4, 16, 5, 17, 6, 18, 7, 19, 8, 20, 9, 21, 10, 22, 11, 23});
}

TEST(Transpose, LargeBlockedAndEveryElementSize) {
  for (const auto& [shape, perm] : std::vector<std::pair<Shape, std::vector<int64_t>>>{
           {{67, 131}, {1, 0}},
           {{300, 400}, {1, 0}},  // large enough to run in parallel
           {{3, 40, 50}, {2, 0, 1}},
           {{5, 6, 7, 8}, {0, 3, 1, 2}},
           {{4, 33, 9}, {1, 0, 2}},
           {{2, 3, 64, 40}, {0, 1, 3, 2}},   // the attention's K^T: 8 x 8 blocks and a partial tile
           {{2, 40, 3, 72}, {0, 3, 2, 1}}}) {
    // Values below 251 so every dtype holds them exactly.
    std::vector<float> v(static_cast<size_t>(shape.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 251);
    const Tensor x = f32(shape, v);
    const Tensor want = transpose_reference(x, perm);
    for (DataType dt : {DataType::Float32, DataType::Float64, DataType::Int16, DataType::UInt8}) {
      const Tensor xc = x.cast(dt);
      const Tensor y = run1("Transpose", 13, {attr("perm", perm)}, {xc});
      testing::expect_close(y, want.cast(dt), 0, 0);
    }
  }
}

TEST(Transpose, MovesFloat32BitPatternsUnchanged) {
  // The 8 x 8 register blocks move bits, not values: NaN payloads and signed zeros survive.
  const Shape shape{40, 72};
  std::vector<uint32_t> bits(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = 0x7fc00000u + static_cast<uint32_t>(i) * 7u + (i % 3 == 0 ? 0x80000000u : 0u);
  Tensor x(DataType::Float32, shape);
  std::memcpy(x.raw_data(), bits.data(), bits.size() * 4);
  const Tensor y = run1("Transpose", 13, {}, {x});
  ASSERT_EQ(y.shape(), (Shape{72, 40}));
  const auto* out = static_cast<const uint32_t*>(y.raw_data());
  for (int64_t i = 0; i < 40; ++i) {
    for (int64_t j = 0; j < 72; ++j) ASSERT_EQ(out[j * 40 + i], bits[static_cast<size_t>(i * 72 + j)]) << i << "," << j;
  }
}

TEST(Transpose, EmptyAndErrors) {
  EXPECT_EQ(run1("Transpose", 13, {}, {iota({0, 3})}).shape(), (Shape{3, 0}));
  const Tensor x = iota({2, 3});
  EXPECT_THROW(run1("Transpose", 13, {attr("perm", std::vector<int64_t>{0, 0})}, {x}), Error);
  EXPECT_THROW(run1("Transpose", 13, {attr("perm", std::vector<int64_t>{0, 2})}, {x}), Error);
  EXPECT_THROW(run1("Transpose", 13, {attr("perm", std::vector<int64_t>{-1, 0})}, {x}), Error);
  EXPECT_THROW(run1("Transpose", 13, {attr("perm", std::vector<int64_t>{2, 0, 1})}, {x}),
               Error);  // rank 3 perm
}

TEST(Concat, AxesEmptyInputsAndOpset1Default) {
  const Tensor a = iota({2, 2});
  const Tensor b = f32({2, 1}, {10, 11});
  expect_values(run_node({"Concat", "", 13, {attr("axis", int64_t{-1})}}, {a, b, iota({2, 0})})[0], {2, 3},
                {0, 1, 10, 2, 3, 11});
  expect_values(run_node({"Concat", "", 13, {attr("axis", int64_t{0})}}, {a, iota({0, 2}), a})[0], {4, 2},
                {0, 1, 2, 3, 0, 1, 2, 3});
  expect_values(run_node({"Concat", "", 1, {}}, {a, b})[0], {2, 3}, {0, 1, 10, 2, 3, 11});  // default axis 1
  EXPECT_EQ(run_node({"Concat", "", 13, {attr("axis", int64_t{1})}}, {iota({2, 0}), iota({2, 0})})[0].shape(),
            (Shape{2, 0}));
}

TEST(Concat, Errors) {
  const Tensor a = iota({2, 2});
  EXPECT_THROW(run_node({"Concat", "", 13, {}}, {a, a}), Error);  // axis required from opset 4
  EXPECT_THROW(run_node({"Concat", "", 13, {attr("axis", int64_t{0})}}, {a, iota({2, 3})}), Error);
  EXPECT_THROW(run_node({"Concat", "", 13, {attr("axis", int64_t{0})}}, {a, iota({4})}), Error);
  EXPECT_THROW(run_node({"Concat", "", 13, {attr("axis", int64_t{2})}}, {a, a}), Error);
  EXPECT_THROW(run_node({"Concat", "", 13, {attr("axis", int64_t{0})}}, {a, a.cast(DataType::Float64)}),
               Error);
  EXPECT_NO_THROW(run_node({"Concat", "", 4, {attr("axis", int64_t{-1})}}, {a, a}));  // negative before 11 too
}

TEST(Split, EveryOpsetForm) {
  const Tensor x = iota({2, 6});
  // Opset 13: sizes as an input, negative axis.
  auto y = run_node({"Split", "", 13, {attr("axis", int64_t{-1})}, 2}, {x, i64({2, 4})});
  expect_values(y[0], {2, 2}, {0, 1, 6, 7});
  expect_values(y[1], {2, 4}, {2, 3, 4, 5, 8, 9, 10, 11});
  // Opset 11: sizes as an attribute.
  y = run_node({"Split", "", 11, {attr("axis", int64_t{1}), attr("split", std::vector<int64_t>{5, 1})}, 2},
               {x});
  expect_values(y[1], {2, 1}, {5, 11});
  // Opset 1: sizes from the second input when the attribute is absent.
  y = run_node({"Split", "", 1, {attr("axis", int64_t{1})}, 2}, {x, i64({3, 3})});
  expect_values(y[0], {2, 3}, {0, 1, 2, 6, 7, 8});
  // Equal parts, default axis 0, and a zero-size part.
  y = run_node({"Split", "", 13, {}, 2}, {x});
  expect_values(y[1], {1, 6}, {6, 7, 8, 9, 10, 11});
  y = run_node({"Split", "", 13, {attr("axis", int64_t{1})}, 3}, {x, i64({0, 6, 0})});
  EXPECT_EQ(y[0].shape(), (Shape{2, 0}));
  EXPECT_EQ(y[2].shape(), (Shape{2, 0}));
}

// Split-18's num_outputs: parts of ceil(dim / n), the last one smaller (ONNX op doc 'Split').
TEST(Split, Opset18NumOutputsAllowsAnUnevenLastPart) {
  const Tensor x = iota({2, 7});
  auto y = run_node({"Split", "", 18, {attr("axis", int64_t{1}), attr("num_outputs", int64_t{3})}, 3}, {x});
  expect_values(y[0], {2, 3}, {0, 1, 2, 7, 8, 9});
  expect_values(y[1], {2, 3}, {3, 4, 5, 10, 11, 12});
  expect_values(y[2], {2, 1}, {6, 13});
  y = run_node({"Split", "", 18, {attr("axis", int64_t{-1}), attr("num_outputs", int64_t{4})}, 4}, {x});
  for (int k = 0; k < 3; ++k) EXPECT_EQ(y[static_cast<size_t>(k)].shape(), (Shape{2, 2}));
  expect_values(y[3], {2, 1}, {6, 13});
  y = run_node({"Split", "", 18, {attr("num_outputs", int64_t{2})}, 2}, {x});  // even: axis 0 halves
  expect_values(y[1], {1, 7}, {7, 8, 9, 10, 11, 12, 13});
  // The opset 13 forms still work at 18.
  y = run_node({"Split", "", 18, {attr("axis", int64_t{1})}, 2}, {x, i64({5, 2})});
  expect_values(y[1], {2, 2}, {5, 6, 12, 13});
  const auto split = [&](int opset, int64_t n, int outputs, std::vector<Tensor> in) {
    return error_of([&] { run_node({"Split", "", opset, {attr("axis", int64_t{1}), attr("num_outputs", n)}, outputs}, in); });
  };
  EXPECT_NE(split(18, 3, 2, {x}).find("has 2 outputs"), std::string::npos);
  EXPECT_NE(split(18, 2, 2, {x, i64({5, 2})}).find("not both"), std::string::npos);
  EXPECT_NE(split(17, 2, 2, {x}).find("opset 18"), std::string::npos);
  EXPECT_NE(split(18, 4, 4, {iota({1, 5})}).find("too many outputs"), std::string::npos);  // 2+2+2 leaves -1
  // 5 into 6: parts of 1 and an empty last one, as ONNX's shape inference computes it.
  const auto parts = run_node({"Split", "", 18, {attr("axis", int64_t{1}), attr("num_outputs", int64_t{6})}, 6}, {iota({1, 5})});
  EXPECT_EQ(parts[4].shape(), (Shape{1, 1}));
  EXPECT_EQ(parts[5].shape(), (Shape{1, 0}));
  // Without num_outputs an uneven split is still an error.
  EXPECT_THROW(run_node({"Split", "", 18, {attr("axis", int64_t{1})}, 3}, {x}), Error);
}

TEST(Split, Errors) {
  const Tensor x = iota({2, 6});
  EXPECT_NE(error_of([&] {
              run_node({"Split", "", 13, {attr("axis", int64_t{1})}, 2}, {x, i64({2, 3})});
            }).find("sums to 5"),
            std::string::npos);
  EXPECT_THROW(run_node({"Split", "", 13, {attr("axis", int64_t{1})}, 2}, {x, i64({6})}),
               Error);  // 1 size, 2 outputs
  EXPECT_THROW(run_node({"Split", "", 13, {attr("axis", int64_t{1})}, 2}, {x, i64({7, -1})}),
               Error);  // negative
  EXPECT_THROW(run_node({"Split", "", 13, {attr("axis", int64_t{1})}, 4}, {x}),
               Error);  // 6 into 4 equal parts
  EXPECT_THROW(run_node({"Split", "", 2, {attr("split", std::vector<int64_t>{1, 2})}, 2}, {x}), Error);
  EXPECT_THROW(run_node({"Split", "", 13, {attr("axis", int64_t{2})}, 2}, {x}), Error);
  EXPECT_NO_THROW(run_node({"Split", "", 2, {attr("axis", int64_t{-1})}, 2}, {x}));  // negative before 11 too
}

TEST(Expand, BidirectionalBroadcast) {
  // numpy: np.array([[1],[2],[3]]) * np.ones((2,1,4))
  const Tensor x = f32({3, 1}, {1, 2, 3});
  expect_values(run1("Expand", 13, {}, {x, i64({2, 1, 4})}), {2, 3, 4},
                {1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3});
  expect_values(run1("Expand", 8, {}, {x, i64({1})}), {3, 1}, {1, 2, 3});  // shape smaller than input
  EXPECT_EQ(run1("Expand", 13, {}, {x, i64({0, 3, 1})}).shape(), (Shape{0, 3, 1}));
  EXPECT_THROW(run1("Expand", 13, {}, {x, i64({2, 4})}), Error);  // 3 vs 2
  EXPECT_THROW(run1("Expand", 13, {}, {x, i64({-1, 1})}), Error);
}

TEST(Tile, RepeatsEachDim) {
  // numpy: np.tile([[1,2,3],[4,5,6]], (2,2))
  const Tensor x = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  expect_values(run1("Tile", 13, {}, {x, i64({2, 2})}), {4, 6},
                {1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6, 1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6});
  EXPECT_EQ(run1("Tile", 6, {}, {x, i64({0, 3})}).shape(), (Shape{0, 9}));
  EXPECT_THROW(run1("Tile", 13, {}, {x, i64({2})}), Error);
  EXPECT_THROW(run1("Tile", 13, {}, {x, i64({1, -1})}), Error);
  EXPECT_THROW(run1("Tile", 13, {}, {x, i32({1, 1})}), Error);
}

TEST(Pad, OlderOpsetAttributes) {
  const Tensor x = f32({2, 2}, {1, 2, 3, 4});
  // Pad-1 `paddings` and Pad-2 `pads` are [x1_begin, x2_begin, x1_end, x2_end].
  expect_values(run1("Pad", 1, {attr("paddings", std::vector<int64_t>{0, 1, 0, 0})}, {x}), {2, 3},
                {0, 1, 2, 0, 3, 4});
  expect_values(run1("Pad", 2, {attr("pads", std::vector<int64_t>{1, 0, 0, 1}), attr("value", 9.5f)}, {x}),
                {3, 3}, {9.5, 9.5, 9.5, 1, 2, 9.5, 3, 4, 9.5});
  // The float `value` is converted to the data's type.
  expect_values(run1("Pad", 2, {attr("pads", std::vector<int64_t>{0, 1, 0, 0}), attr("value", 7.0f)},
                     {x.cast(DataType::Int32)}),
                {2, 3}, {7, 1, 2, 7, 3, 4});
  EXPECT_THROW(run1("Pad", 2, {}, {x}), Error);
}

TEST(Pad, ModesAndCrop) {
  const Tensor x = f32({4}, {1, 2, 3, 4});
  // numpy: np.pad([1,2,3,4], (5,6), mode='reflect'): reflection repeats past the border.
  expect_values(run1("Pad", 13, {attr("mode", std::string("reflect"))}, {x, i64({5, 6})}), {15},
                {2, 3, 4, 3, 2, 1, 2, 3, 4, 3, 2, 1, 2, 3, 4});
  // Crop first, then pad: [3,4] reflected (numpy: np.pad([3,4], (0,3), mode='reflect')).
  expect_values(run1("Pad", 13, {attr("mode", std::string("reflect"))}, {x, i64({-2, 3})}), {5},
                {3, 4, 3, 4, 3});
  expect_values(run1("Pad", 11, {}, {x, i64({-1, -2})}), {1}, {2});
  // numpy: np.pad(np.arange(6).reshape(2,3), ((1,0),(2,1)), mode='edge')
  expect_values(run1("Pad", 13, {attr("mode", std::string("edge"))}, {iota({2, 3}), i64({1, 2, 0, 1})}),
                {3, 6}, {0, 0, 0, 1, 2, 2, 0, 0, 0, 1, 2, 2, 3, 3, 3, 4, 5, 5});
  expect_values(run1("Pad", 11, {}, {x, i64({1, 1}), f32({}, {-1})}), {6}, {-1, 1, 2, 3, 4, -1});
  const Tensor b = Tensor::from_vector<bool>({2}, {true, true});
  expect_values(run1("Pad", 13, {}, {b, i64({1, 0})}), {3}, {0, 1, 1});
  EXPECT_EQ(run1("Pad", 13, {}, {iota({0, 2}), i64({1, 0, 0, 0})}).shape(), (Shape{1, 2}));
}

// Pad-18's axes input names the axes the pads apply to (int32 or int64, negative from the back).
TEST(Pad, Opset18AxesInput) {
  const Tensor x = iota({2, 3});
  expect_values(run1("Pad", 18, {}, {x, i64({1, 2}), Tensor(), i64({1})}), {2, 6},
                {0, 0, 1, 2, 0, 0, 0, 3, 4, 5, 0, 0});
  expect_values(run1("Pad", 18, {}, {x, i64({1, 2}), f32({}, {9}), i32({-1})}), {2, 6},
                {9, 0, 1, 2, 9, 9, 9, 3, 4, 5, 9, 9});
  // [axis 0 begin, axis -1 begin, axis 0 end, axis -1 end]
  expect_values(run1("Pad", 18, {attr("mode", std::string("edge"))}, {x, i64({0, 1, 1, -1}), Tensor(), i64({0, -1})}),
                {3, 3}, {0, 0, 1, 3, 3, 4, 3, 3, 4});
  // Without axes, all of them, as before.
  expect_values(run1("Pad", 18, {}, {x, i64({0, 0, 1, 0})}), {3, 3}, {0, 1, 2, 3, 4, 5, 0, 0, 0});
  EXPECT_NE(error_of([&] { run1("Pad", 18, {}, {x, i64({1, 1, 1, 1}), Tensor(), i64({1})}); }).find("expected 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] { run1("Pad", 18, {}, {x, i64({1, 1, 1, 1}), Tensor(), i64({1, -1})}); }).find("twice"),
            std::string::npos);
  EXPECT_THROW(run1("Pad", 18, {}, {x, i64({1, 1}), Tensor(), i64({2})}), Error);  // out of range
  EXPECT_THROW(run1("Pad", 18, {}, {x, i64({1, 1}), Tensor(), f32({1}, {1})}), Error);
}

// Pad-19's wrap mode: the padded axis repeats as a ring (the doc's example 4, values 0..5 for
// its 1.0 ... 5.7).
TEST(Pad, Opset19WrapMode) {
  const Tensor x = iota({3, 2});
  expect_values(run1("Pad", 19, {attr("mode", std::string("wrap"))}, {x, i64({2, 1, 1, 1})}), {6, 4},
                {3, 2, 3, 2, 5, 4, 5, 4, 1, 0, 1, 0, 3, 2, 3, 2, 5, 4, 5, 4, 1, 0, 1, 0});
  // Longer than the axis (numpy: np.pad([1, 2, 3], (4, 5), mode='wrap')), and after a crop.
  const Tensor v = f32({3}, {1, 2, 3});
  expect_values(run1("Pad", 19, {attr("mode", std::string("wrap"))}, {v, i64({4, 5})}), {12},
                {3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2});
  expect_values(run1("Pad", 21, {attr("mode", std::string("wrap"))}, {v, i64({-1, 2})}), {4}, {2, 3, 2, 3});
  EXPECT_NE(error_of([&] { run1("Pad", 18, {attr("mode", std::string("wrap"))}, {v, i64({1, 1})}); }).find("opset 19"),
            std::string::npos);
  EXPECT_THROW(run1("Pad", 19, {attr("mode", std::string("wrap"))}, {iota({0}), i64({1, 1})}), Error);
}

TEST(Pad, Errors) {
  const Tensor x = f32({4}, {1, 2, 3, 4});
  EXPECT_THROW(run1("Pad", 13, {}, {x, i64({1, 1, 1, 1})}), Error);  // 4 pads for rank 1
  EXPECT_THROW(run1("Pad", 13, {}, {x, i64({-3, -2})}), Error);      // crops 5 of 4
  EXPECT_THROW(run1("Pad", 13, {attr("mode", std::string("wrap"))}, {x, i64({1, 1})}), Error);
  EXPECT_THROW(run1("Pad", 13, {attr("mode", std::string("edge"))}, {iota({0}), i64({1, 1})}), Error);
  EXPECT_THROW(run1("Pad", 13, {}, {x, i64({1, 1}), Tensor::scalar<double>(1.0)}), Error);  // value dtype
}

TEST(ShapeAndSize, StartEndClamp) {
  const Tensor x = iota({2, 3, 4});
  expect_values(run1("Shape", 13, {}, {x}), {3}, {2, 3, 4});
  expect_values(run1("Shape", 15, {attr("start", int64_t{-2})}, {x}), {2}, {3, 4});
  expect_values(run1("Shape", 15, {attr("start", int64_t{-10}), attr("end", int64_t{10})}, {x}), {3},
                {2, 3, 4});
  expect_values(run1("Shape", 15, {attr("start", int64_t{2}), attr("end", int64_t{1})}, {x}), {0}, {});
  expect_values(run1("Shape", 15, {}, {f32({}, {1})}), {0}, {});
  const Tensor n = run1("Size", 13, {}, {x});
  EXPECT_EQ(n.dtype(), DataType::Int64);
  expect_values(n, {}, {24});
  expect_values(run1("Size", 1, {}, {iota({3, 0})}), {}, {0});
}

TEST(DepthToSpace, DcrCrdAndOpset1) {
  // numpy, per the DepthToSpace-13 doc formulas, x = np.arange(8).reshape(1,8,1,1), blocksize 2.
  const Tensor x = iota({1, 8, 1, 1});
  expect_values(run1("DepthToSpace", 13, {attr("blocksize", int64_t{2})}, {x}), {1, 2, 2, 2},
                {0, 2, 4, 6, 1, 3, 5, 7});
  expect_values(run1("DepthToSpace", 1, {attr("blocksize", int64_t{2})}, {x}), {1, 2, 2, 2},
                {0, 2, 4, 6, 1, 3, 5, 7});
  expect_values(
      run1("DepthToSpace", 13, {attr("blocksize", int64_t{2}), attr("mode", std::string("CRD"))}, {x}),
      {1, 2, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7});
  EXPECT_THROW(run1("DepthToSpace", 13, {attr("blocksize", int64_t{3})}, {x}), Error);  // 8 % 9
  EXPECT_THROW(
      run1("DepthToSpace", 13, {attr("blocksize", int64_t{2}), attr("mode", std::string("RDC"))}, {x}),
      Error);
  EXPECT_THROW(run1("DepthToSpace", 13, {}, {x}), Error);
  EXPECT_THROW(run1("DepthToSpace", 13, {attr("blocksize", int64_t{2})}, {iota({8, 1, 1})}), Error);
}

TEST(SpaceToDepth, InverseOfDepthToSpace) {
  // numpy: y.reshape(1,2,2,2,2,2).transpose(0,3,5,1,2,4).reshape(1,8,2,2), y = arange(32)
  const Tensor y = iota({1, 2, 4, 4});
  const Tensor s = run1("SpaceToDepth", 13, {attr("blocksize", int64_t{2})}, {y});
  expect_values(s, {1, 8, 2, 2}, {0, 2, 8,  10, 16, 18, 24, 26, 1, 3, 9,  11, 17, 19, 25, 27,
                                  4, 6, 12, 14, 20, 22, 28, 30, 5, 7, 13, 15, 21, 23, 29, 31});
  testing::expect_close(run1("DepthToSpace", 13, {attr("blocksize", int64_t{2})}, {s}), y, 0, 0);
  EXPECT_THROW(run1("SpaceToDepth", 13, {attr("blocksize", int64_t{3})}, {y}), Error);
}

// SpaceToDepth-28's mode CRD: channel c * bs^2 + row * bs + column, the inverse of DepthToSpace CRD
// (numpy: y.reshape(1,2,2,2,2,2).transpose(0,1,3,5,2,4).reshape(1,8,2,2), y = arange(32)).
TEST(SpaceToDepth, Opset28CrdMode) {
  const Tensor y = iota({1, 2, 4, 4});
  const auto crd = std::vector<onnx::AttributeProto>{attr("blocksize", int64_t{2}), attr("mode", std::string("CRD"))};
  const Tensor s = run1("SpaceToDepth", 28, crd, {y});
  expect_values(s, {1, 8, 2, 2}, {0,  2,  8,  10, 1,  3,  9,  11, 4,  6,  12, 14, 5,  7,  13, 15,
                                  16, 18, 24, 26, 17, 19, 25, 27, 20, 22, 28, 30, 21, 23, 29, 31});
  testing::expect_close(run1("DepthToSpace", 28, crd, {s}), y, 0, 0);
  // DCR stays the default.
  testing::expect_close(run1("SpaceToDepth", 28, {attr("blocksize", int64_t{2})}, {y}),
                        run1("SpaceToDepth", 13, {attr("blocksize", int64_t{2})}, {y}), 0, 0);
  EXPECT_THROW(run1("SpaceToDepth", 13, crd, {y}), Error);  // no mode before opset 28
  EXPECT_THROW(run1("SpaceToDepth", 28, {attr("blocksize", int64_t{2}), attr("mode", std::string("RDC"))}, {y}), Error);
}

// Large inputs take the parallel paths; checked against loops that follow the definitions.
TEST(LargeInputs, ConcatPadExpandMatchTheDefinition) {
  const Tensor a = iota({300, 200});
  const Tensor b = iota({300, 100});
  const Tensor c = run_node({"Concat", "", 13, {attr("axis", int64_t{1})}}, {a, b})[0];
  ASSERT_EQ(c.shape(), (Shape{300, 300}));
  for (int64_t i = 0; i < 300; ++i) {
    for (int64_t j = 0; j < 300; ++j) {
      const float want = j < 200 ? a.data<float>()[i * 200 + j] : b.data<float>()[i * 100 + j - 200];
      ASSERT_EQ(c.data<float>()[i * 300 + j], want) << i << "," << j;
    }
  }
  // Pad [64,70,80] by begin [0,1,2], end [0,3,-1] with 5: out[i,j,k] = x[i,j-1,k-2] inside.
  const Tensor x = iota({64, 70, 80});
  const Tensor p = run1("Pad", 13, {}, {x, i64({0, 1, 2, 0, 3, -1}), f32({}, {5})});
  ASSERT_EQ(p.shape(), (Shape{64, 74, 81}));
  for (int64_t i = 0; i < 64; ++i) {
    for (int64_t j = 0; j < 74; ++j) {
      for (int64_t k = 0; k < 81; ++k) {
        const int64_t sj = j - 1, sk = k - 2;
        const float want =
            (sj >= 0 && sj < 70 && sk >= 0 && sk < 79) ? x.data<float>()[(i * 70 + sj) * 80 + sk] : 5.0f;
        ASSERT_EQ(p.data<float>()[(i * 74 + j) * 81 + k], want) << i << "," << j << "," << k;
      }
    }
  }
  // Expand [1,300,1] to [200,300,4].
  const Tensor e = run1("Expand", 13, {}, {iota({1, 300, 1}), i64({200, 1, 4})});
  ASSERT_EQ(e.shape(), (Shape{200, 300, 4}));
  for (int64_t i = 0; i < e.numel(); ++i) ASSERT_EQ(e.data<float>()[i], static_cast<float>(i / 4 % 300)) << i;
}

TEST(LargeInputs, SliceGatherMatchTheDefinition) {
  // Slice axes [0,2] starts [1,-3] ends [39,2] steps [2,-4] of [40,50,60]:
  // axis 0 takes 1,3,...,37 (19); axis 2 takes 57,53,...,5 (14).
  const Tensor x = iota({40, 50, 60});
  const Tensor y = run1("Slice", 13, {}, {x, i64({1, -3}), i64({39, 2}), i64({0, 2}), i64({2, -4})});
  ASSERT_EQ(y.shape(), (Shape{19, 50, 14}));
  for (int64_t i = 0; i < 19; ++i) {
    for (int64_t j = 0; j < 50; ++j) {
      for (int64_t k = 0; k < 14; ++k) {
        const float want = x.data<float>()[((1 + 2 * i) * 50 + j) * 60 + (57 - 4 * k)];
        ASSERT_EQ(y.data<float>()[(i * 50 + j) * 14 + k], want) << i << "," << j << "," << k;
      }
    }
  }
  const Tensor table = iota({1000, 100});
  std::vector<int64_t> idx(700);
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int64_t>(i * 389 % 2000) - 1000;
  const Tensor g = run1("Gather", 13, {}, {table, i64(idx)});
  ASSERT_EQ(g.shape(), (Shape{700, 100}));
  for (size_t i = 0; i < idx.size(); ++i) {
    const int64_t row = idx[i] < 0 ? idx[i] + 1000 : idx[i];
    for (int64_t j = 0; j < 100; ++j) {
      ASSERT_EQ(g.data<float>()[static_cast<int64_t>(i) * 100 + j], table.data<float>()[row * 100 + j]);
    }
  }
}

// ---------------------------------------------------------------- indexing

TEST(Slice, Opset1Attributes) {
  const Tensor x = iota({2, 4});
  // Slice-1 doc example 2: starts [0,1], ends [-1,1000] -> [[1,2,3]].
  expect_values(
      run1("Slice", 1,
           {attr("starts", std::vector<int64_t>{0, 1}), attr("ends", std::vector<int64_t>{-1, 1000})}, {x}),
      {1, 3}, {1, 2, 3});
  expect_values(run1("Slice", 9,
                     {attr("starts", std::vector<int64_t>{1}), attr("ends", std::vector<int64_t>{3}),
                      attr("axes", std::vector<int64_t>{1})},
                     {x}),
                {2, 2}, {1, 2, 5, 6});
  EXPECT_THROW(run1("Slice", 9, {attr("starts", std::vector<int64_t>{1})}, {x}), Error);
  EXPECT_EQ(run1("Slice", 9,
                 {attr("starts", std::vector<int64_t>{0}), attr("ends", std::vector<int64_t>{1}),
                  attr("axes", std::vector<int64_t>{-1})},
                 {x}).shape(),
            (Shape{x.shape()[0], 1}));  // negative axes, accepted before opset 11 too
}

TEST(Slice, NegativeStepsAndClamping) {
  const Tensor x = iota({2, 3, 4});
  // numpy: np.arange(24).reshape(2,3,4)[::-1, 2:0:-2, -1:-5:-3]
  const int64_t lo = std::numeric_limits<int64_t>::min();
  expect_values(
      run1("Slice", 13, {}, {x, i64({-1, 2, -1}), i64({lo, 0, -5}), i64({0, 1, 2}), i64({-1, -2, -3})}),
      {2, 1, 2}, {23, 20, 11, 8});
  // INT_MAX end, out-of-range start, int32 indices, negative axes.
  const int32_t big = std::numeric_limits<int32_t>::max();
  expect_values(run1("Slice", 13, {}, {iota({5}), i32({-100}), i32({big})}), {5}, {0, 1, 2, 3, 4});
  EXPECT_EQ(run1("Slice", 13, {}, {x, i64({10}), i64({20}), i64({-1})}).shape(), (Shape{2, 3, 0}));
  EXPECT_EQ(run1("Slice", 13, {}, {x, i64({0}), i64({3}), i64({1}), i64({-1})}).shape(), (Shape{2, 0, 4}));
  EXPECT_EQ(run1("Slice", 13, {}, {iota({0, 2}), i64({0}), i64({-1}), i64({0}), i64({-1})}).shape(),
            (Shape{0, 2}));
  // Huge steps take one element.
  expect_values(run1("Slice", 13, {}, {iota({5}), i64({4}), i64({lo}), i64({0}), i64({lo})}), {1}, {4});
}

TEST(Slice, Errors) {
  const Tensor x = iota({2, 3});
  EXPECT_THROW(run1("Slice", 13, {}, {x, i64({0}), i64({1}), i64({0}), i64({0})}), Error);  // step 0
  EXPECT_THROW(run1("Slice", 13, {},
                    {
                        x,
                        i64({0, 0}),
                        i64({1}),
                    }),
               Error);                                                                      // lengths differ
  EXPECT_THROW(run1("Slice", 13, {}, {x, i64({0, 0}), i64({1, 1}), i64({1, -1})}), Error);  // axis 1 twice
  EXPECT_THROW(run1("Slice", 13, {}, {x, i64({0}), i64({1}), i64({2})}), Error);  // axis out of range
  EXPECT_THROW(run1("Slice", 13, {}, {x, f32({1}, {0}), i64({1})}), Error);       // float starts
}

// ai.onnxtrain.SliceGrad (Slice's gradient): dY written into zeros where Slice took its
// elements, by hand for the NegativeStepsAndClamping slice; then its errors.
TEST(SliceGrad, WritesDyWhereSliceTookItsElements) {
  const int64_t lo = std::numeric_limits<int64_t>::min();
  const Tensor dy = f32({2, 1, 2}, {1, 2, 3, 4});
  const NodeSpec grad{"SliceGrad", "ai.onnxtrain", 1, {}};
  const std::vector<Tensor> params{i64({-1, 2, -1}), i64({lo, 0, -5}), i64({0, 1, 2}), i64({-1, -2, -3})};
  std::vector<Tensor> in{dy, i64({2, 3, 4})};
  in.insert(in.end(), params.begin(), params.end());
  const Tensor dx = run_node(grad, in)[0];
  std::vector<double> want(24, 0.0);  // Slice took x[1, 2, 3], x[1, 2, 0], x[0, 2, 3], x[0, 2, 0]
  want[23] = 1;
  want[20] = 2;
  want[11] = 3;
  want[8] = 4;
  expect_values(dx, {2, 3, 4}, want);
  // dY's shape must be Slice's output shape; the shape must be a list of dims >= 0.
  in[0] = f32({2, 1, 1}, {1, 2});
  EXPECT_THROW(run_node(grad, in), Error);
  in[0] = dy;
  in[1] = i64({2, -3, 4});
  EXPECT_THROW(run_node(grad, in), Error);
  // Starts and ends alone slice the first axes; an empty slice gives zeros.
  const Tensor first = run_node(grad, {f32({1, 2}, {5, 6}), i64({2, 3}), i64({1, 1}), i64({2, 3})})[0];
  expect_values(first, {2, 3}, {0, 0, 0, 0, 5, 6});
  const Tensor none = run_node(grad, {f32({0, 3}, {}), i64({2, 3}), i64({1}), i64({1})})[0];
  expect_values(none, {2, 3}, {0, 0, 0, 0, 0, 0});
}

TEST(Gather, AxesNegativeIndicesAndErrors) {
  const Tensor x = iota({3, 3});
  expect_values(run1("Gather", 13, {attr("axis", int64_t{1})}, {x, i64({2, -3})}), {3, 2},
                {2, 0, 5, 3, 8, 6});
  expect_values(run1("Gather", 1, {}, {x, i32({-1})}), {1, 3}, {6, 7, 8});
  expect_values(run1("Gather", 13, {}, {x, i64(Shape{}, {1})}), {3},
                {3, 4, 5});  // scalar index drops the dim
  EXPECT_EQ(run1("Gather", 13, {attr("axis", int64_t{-1})}, {x, i64(Shape{2, 0}, {})}).shape(),
            (Shape{3, 2, 0}));
  const std::string msg = error_of([&] { run1("Gather", 13, {}, {x, i64({0, 7})}); });
  EXPECT_NE(msg.find("index 7"), std::string::npos) << msg;
  EXPECT_THROW(run1("Gather", 13, {}, {x, i64({-4})}), Error);
  EXPECT_THROW(run1("Gather", 13, {attr("axis", int64_t{2})}, {x, i64({0})}), Error);
  EXPECT_THROW(run1("Gather", 13, {}, {x, f32({1}, {0})}), Error);
}

TEST(GatherElements, NegativeIndicesAndErrors) {
  // GatherElements doc example 1 with -2 in place of 0.
  const Tensor x = f32({2, 2}, {1, 2, 3, 4});
  expect_values(run1("GatherElements", 13, {attr("axis", int64_t{1})}, {x, i64({2, 2}, {-2, 0, 1, 0})}),
                {2, 2}, {1, 1, 4, 3});
  // indices smaller than data on the other axis.
  expect_values(run1("GatherElements", 13, {}, {iota({3, 3}), i64({1, 2}, {2, 0})}), {1, 2}, {6, 1});
  EXPECT_THROW(run1("GatherElements", 13, {}, {x, i64({1, 2}, {2, 0})}), Error);  // index 2 for dim 2
  EXPECT_THROW(run1("GatherElements", 13, {}, {x, i64({2}, {0, 0})}), Error);     // rank differs
  EXPECT_THROW(run1("GatherElements", 13, {}, {x, i64({2, 3}, {0, 0, 0, 0, 0, 0})}),
               Error);  // 3 > 2 on axis 1
}

TEST(GatherND, BatchDimsAndErrors) {
  // GatherND doc example 5 (batch_dims 1) on np.arange(12).reshape(2,2,3).
  const Tensor x = iota({2, 2, 3});
  expect_values(run1("GatherND", 13, {attr("batch_dims", int64_t{1})}, {x, i64({2, 1}, {1, 0})}), {2, 3},
                {3, 4, 5, 6, 7, 8});
  expect_values(run1("GatherND", 11, {}, {x, i64({2, 3}, {1, 1, 2, 0, -1, 0})}), {2}, {11, 3});
  EXPECT_THROW(run1("GatherND", 13, {}, {x, i64({1, 4}, {0, 0, 0, 0})}), Error);  // k = 4 > rank
  EXPECT_THROW(run1("GatherND", 13, {}, {x, i64({1, 2}, {2, 0})}), Error);        // index 2 for dim 2
  EXPECT_THROW(run1("GatherND", 13, {attr("batch_dims", int64_t{1})}, {x, i64({3, 1}, {0, 0, 0})}), Error);
  EXPECT_THROW(run1("GatherND", 13, {}, {x, i32({0})}), Error);
}

TEST(ScatterElements, ReductionsAndDuplicates) {
  const Tensor data = f32({3, 3}, {1, 1, 1, 1, 1, 1, 1, 1, 1});
  const Tensor idx = i64({2, 3}, {1, 0, 2, 1, 2, -2});
  const Tensor upd = f32({2, 3}, {2, 3, 4, 5, 6, 7});
  // Duplicates on (1,0): none keeps the later value, add sums, mul multiplies (numpy loop).
  expect_values(run_node({"ScatterElements", "", 16, {}}, {data, idx, upd})[0], {3, 3},
                {1, 3, 1, 5, 1, 7, 1, 6, 4});
  expect_values(
      run_node({"ScatterElements", "", 16, {attr("reduction", std::string("add"))}}, {data, idx, upd})[0],
      {3, 3}, {1, 4, 1, 8, 1, 8, 1, 7, 5});
  expect_values(
      run_node({"ScatterElements", "", 16, {attr("reduction", std::string("mul"))}}, {data, idx, upd})[0],
      {3, 3}, {1, 3, 1, 10, 1, 7, 1, 6, 4});
  // axis 1 with int32 indices and int64 data.
  const Tensor d2 = i64({1, 5}, {1, 2, 3, 4, 5});
  expect_values(run_node({"ScatterElements", "", 13, {attr("axis", int64_t{1})}},
                         {d2, Tensor::from_vector<int32_t>({1, 2}, {1, 3}), i64({1, 2}, {9, 8})})[0],
                {1, 5}, {1, 9, 3, 8, 5});
}

// Opset 18 adds reduction max and min (NaN-propagating, as Max and Min are).
TEST(ScatterElements, Opset18MaxAndMin) {
  const Tensor idx = i64({2, 3}, {1, 0, 2, 1, 2, -2});
  const Tensor upd = f32({2, 3}, {2, 3, 4, 5, 6, 7});
  const auto scatter = [&](const std::string& op, const std::string& r, const Tensor& data, const Tensor& i,
                           const Tensor& u) { return run_node({op, "", 18, {attr("reduction", r)}}, {data, i, u})[0]; };
  // (1,0) gets 2 and 5, (0,1) 3, (2,2) 4, (2,1) 6, (1,2) 7.
  expect_values(scatter("ScatterElements", "max", f32({3, 3}, std::vector<float>(9, 1)), idx, upd), {3, 3},
                {1, 3, 1, 5, 1, 7, 1, 6, 4});
  expect_values(scatter("ScatterElements", "min", f32({3, 3}, std::vector<float>(9, 10)), idx, upd), {3, 3},
                {10, 3, 10, 2, 10, 7, 10, 6, 4});
  const Tensor nan = scatter("ScatterElements", "max", f32({2}, {std::numeric_limits<float>::quiet_NaN(), 1}),
                             i64({2}, {0, 1}), f32({2}, {5, std::numeric_limits<float>::quiet_NaN()}));
  EXPECT_TRUE(std::isnan(nan.to_double_vector()[0]) && std::isnan(nan.to_double_vector()[1]));
  // Integers and ScatterND slices.
  expect_values(scatter("ScatterND", "min", iota({3, 2}), i64({2, 1}, {1, 1}), f32({2, 2}, {1, 7, 3, 0})), {3, 2},
                {0, 1, 1, 0, 4, 5});
  expect_values(scatter("ScatterND", "max", i64({3}, {4, 5, 6}), i64({2, 1}, {0, 0}), i64({2}, {9, 2})), {3},
                {9, 5, 6});
  EXPECT_NE(error_of([&] { scatter("ScatterElements", "avg", iota({2}), i64({1}, {0}), f32({1}, {0})); }).find("'min'"),
            std::string::npos);
}

TEST(ScatterElements, Errors) {
  const Tensor data = iota({2, 2});
  EXPECT_THROW(run_node({"ScatterElements", "", 16, {}}, {data, i64({1, 1}, {2}), f32({1, 1}, {0})}), Error);
  EXPECT_THROW(run_node({"ScatterElements", "", 16, {}}, {data, i64({1, 1}, {0}), f32({1, 2}, {0, 0})}),
               Error);
  EXPECT_THROW(run_node({"ScatterElements", "", 16, {}}, {data, i64({1, 1}, {0}), i64({1, 1}, {0})}), Error);
  EXPECT_THROW(run_node({"ScatterElements", "", 16, {attr("reduction", std::string("max"))}},
                        {data, i64({1, 1}, {0}), f32({1, 1}, {0})}),
               Error);
  EXPECT_THROW(run_node({"ScatterElements", "", 13, {attr("reduction", std::string("add"))}},
                        {data, i64({1, 1}, {0}), f32({1, 1}, {0})}),
               Error);  // reduction needs opset 16
}

TEST(ScatterND, SlicesReductionsAndErrors) {
  const Tensor data = iota({3, 2});
  expect_values(
      run_node({"ScatterND", "", 13, {}}, {data, i64({2, 1}, {2, -3}), f32({2, 2}, {7, 8, 9, 10})})[0],
      {3, 2}, {9, 10, 2, 3, 7, 8});
  expect_values(run_node({"ScatterND", "", 16, {attr("reduction", std::string("mul"))}},
                         {data, i64({2, 2}, {1, 1, 1, 1}), f32({2}, {2, 3})})[0],
                {3, 2}, {0, 1, 2, 18, 4, 5});
  EXPECT_THROW(run_node({"ScatterND", "", 16, {}}, {data, i64({1, 1}, {0}), f32({1, 3}, {0, 0, 0})}), Error);
  EXPECT_THROW(run_node({"ScatterND", "", 16, {}}, {data, i64({1, 1}, {3}), f32({1, 2}, {0, 0})}), Error);
  EXPECT_THROW(run_node({"ScatterND", "", 16, {}}, {data, i64({1, 3}, {0, 0, 0}), f32({1}, {0})}), Error);
}

TEST(OneHot, AxesNegativeIndicesAndOpset9) {
  const Tensor values = f32({2}, {0, 5});
  // Opset 11: -1 is depth-1; 3 is out of range -> all off.
  expect_values(run1("OneHot", 11, {}, {i64({0, -1, 3}), f32({}, {3}), values}), {3, 3},
                {5, 0, 0, 0, 0, 5, 0, 0, 0});
  // Opset 9: negative indices are out of range.
  expect_values(run1("OneHot", 9, {}, {i64({0, -1}), i64({2}), values}), {2, 2}, {5, 0, 0, 0});
  // axis 0 with float indices: output[d, i] = on where indices[i] == d.
  expect_values(run1("OneHot", 11, {attr("axis", int64_t{0})}, {f32({2}, {1, 0}), f32({}, {2}), values}),
                {2, 2}, {0, 5, 5, 0});
  const Tensor b = run1("OneHot", 11, {attr("axis", int64_t{-2})},
                        {i64({1}, {1}), i64({1}, {2}), Tensor::from_vector<bool>({2}, {false, true})});
  EXPECT_EQ(b.dtype(), DataType::Bool);
  expect_values(b, {2, 1}, {0, 1});
  EXPECT_THROW(run1("OneHot", 11, {}, {i64({0}), i64({-2}), values}), Error);
  EXPECT_THROW(run1("OneHot", 11, {}, {i64({0}), i64({2}), f32({3}, {0, 1, 2})}), Error);
  EXPECT_THROW(run1("OneHot", 11, {attr("axis", int64_t{3})}, {i64({0}), i64({2}), values}), Error);
}

TEST(Trilu, UpperLowerAndK) {
  // numpy: np.triu(np.arange(1,13).reshape(3,4), 1) and np.tril(..., -1)
  const Tensor x = f32({3, 4}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  expect_values(run1("Trilu", 14, {}, {x, i64(Shape{}, {1})}), {3, 4}, {0, 2, 3, 4, 0, 0, 7, 8, 0, 0, 0, 12});
  expect_values(run1("Trilu", 14, {attr("upper", int64_t{0})}, {x, i64(Shape{}, {-1})}), {3, 4},
                {0, 0, 0, 0, 5, 0, 0, 0, 9, 10, 0, 0});
  const int64_t big = std::numeric_limits<int64_t>::max();
  expect_values(run1("Trilu", 14, {attr("upper", int64_t{0})}, {x, i64(Shape{}, {big})}), {3, 4},
                x.to_double_vector());
  const Tensor batch = run1("Trilu", 14, {}, {iota({2, 2, 2})});
  expect_values(batch, {2, 2, 2}, {0, 1, 0, 3, 4, 5, 0, 7});
  EXPECT_THROW(run1("Trilu", 14, {}, {iota({3})}), Error);
  EXPECT_THROW(run1("Trilu", 14, {}, {x, i32({1})}), Error);
}

}  // namespace
}  // namespace onnxtrain
