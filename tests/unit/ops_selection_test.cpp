// Unit tests of selection.cpp (Unique, NonZero, Compress, ReverseSequence, TensorScatter),
// nms.cpp (NonMaxSuppression) and bitwise.cpp (BitShift, Bitwise*). Expected values are the op
// docs' examples, worked out by hand, or computed by naive loops in the test; errors for bad input.
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
using testing::throws_with;
using testing::f32;
using testing::i64;
using testing::NodeSpec;
using testing::run1;
using testing::run_node;
using Ints = std::vector<int64_t>;
using Attrs = std::vector<onnx::AttributeProto>;

Tensor bools(const std::vector<bool>& v) {
  Tensor t(DataType::Bool, Shape{static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.data<bool>()[i] = v[i];
  return t;
}
std::vector<double> values(const Tensor& t) { return t.to_double_vector(); }
Ints ints(const Tensor& t) { return t.to_int64_vector("t"); }

// ---------------------------------------------------------------- Unique

std::vector<Tensor> unique(const Tensor& x, Attrs attrs, int opset = 11) {
  return run_node(NodeSpec{"Unique", "", opset, std::move(attrs), 4}, {x});
}

TEST(Unique, TheOpDocsExamples) {
  // Example 1: unsorted.
  auto u = unique(f32({6}, {2, 1, 1, 3, 4, 3}), {attr("sorted", int64_t{0})});
  EXPECT_EQ(values(u[0]), (std::vector<double>{2, 1, 3, 4}));
  EXPECT_EQ(ints(u[1]), (Ints{0, 1, 3, 4}));
  EXPECT_EQ(ints(u[2]), (Ints{0, 1, 1, 2, 3, 2}));
  EXPECT_EQ(ints(u[3]), (Ints{1, 2, 2, 1}));
  // Example 2: sorted, flattened.
  u = unique(i64({2, 2}, {1, 3, 2, 3}), {});
  EXPECT_EQ(ints(u[0]), (Ints{1, 2, 3}));
  EXPECT_EQ(ints(u[1]), (Ints{0, 2, 1}));
  EXPECT_EQ(ints(u[2]), (Ints{0, 2, 1, 2}));
  EXPECT_EQ(ints(u[3]), (Ints{1, 1, 2}));
  // Example 3: rows.
  u = unique(i64({3, 3}, {1, 0, 0, 1, 0, 0, 2, 3, 4}), {attr("axis", int64_t{0})});
  EXPECT_EQ(u[0].shape(), (Shape{2, 3}));
  EXPECT_EQ(ints(u[0]), (Ints{1, 0, 0, 2, 3, 4}));
  EXPECT_EQ(ints(u[1]), (Ints{0, 2}));
  EXPECT_EQ(ints(u[2]), (Ints{0, 0, 1}));
  EXPECT_EQ(ints(u[3]), (Ints{2, 1}));
  // Example 4: slices along axis 1 of [2, 4, 2].
  u = unique(f32({2, 4, 2}, {1, 1, 0, 1, 2, 1, 0, 1, 1, 1, 0, 1, 2, 1, 0, 1}), {attr("axis", int64_t{1})});
  EXPECT_EQ(u[0].shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(values(u[0]), (std::vector<double>{0, 1, 1, 1, 2, 1, 0, 1, 1, 1, 2, 1}));
  EXPECT_EQ(ints(u[1]), (Ints{1, 0, 2}));
  EXPECT_EQ(ints(u[2]), (Ints{1, 0, 2, 0}));
  EXPECT_EQ(ints(u[3]), (Ints{2, 1, 1}));
}

TEST(Unique, UnsortedSlicesNaNsBoolsAndEmpty) {
  // Columns (axis -1) in first-occurrence order: c0 = c2 = [5, 1], c1 = [0, 0].
  auto u = unique(i64({2, 3}, {5, 0, 5, 1, 0, 1}), {attr("axis", int64_t{-1}), attr("sorted", int64_t{0})}, 28);
  EXPECT_EQ(ints(u[0]), (Ints{5, 0, 1, 0}));
  EXPECT_EQ(ints(u[1]), (Ints{0, 1}));
  EXPECT_EQ(ints(u[2]), (Ints{0, 1, 0}));
  // NaN sorts last and all NaNs are one value (numpy's equal_nan); -0 equals 0.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  u = unique(f32({6}, {nan, 1, -0.0f, nan, 0, -2}), {});
  ASSERT_EQ(u[0].numel(), 4);
  EXPECT_EQ(values(u[0])[0], -2);
  EXPECT_EQ(values(u[0])[2], 1);
  EXPECT_TRUE(std::isnan(values(u[0])[3]));
  EXPECT_EQ(ints(u[1]), (Ints{5, 2, 1, 0}));
  EXPECT_EQ(ints(u[3]), (Ints{1, 2, 1, 2}));
  u = unique(bools({true, false, true}), {});
  EXPECT_EQ(ints(u[0]), (Ints{0, 1}));
  u = unique(f32({0}, {}), {});
  EXPECT_EQ(u[0].numel(), 0);
  EXPECT_EQ(u[2].numel(), 0);
  EXPECT_TRUE(throws_with([] { unique(f32({2}, {1, 2}), {attr("axis", int64_t{1})}); }, "out of range"));
  EXPECT_TRUE(throws_with([] { unique(f32({2}, {1, 2}), {attr("sorted", int64_t{2})}); }, "must be 0 or 1"));
}

// ---------------------------------------------------------------- NonZero

TEST(NonZero, IndicesInRowMajorOrder) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor y = run1("NonZero", 13, {}, {f32({2, 3}, {0, 2, -0.0f, nan, 0, 1})});
  EXPECT_EQ(y.shape(), (Shape{2, 3}));
  EXPECT_EQ(ints(y), (Ints{0, 1, 1, 1, 0, 2}));  // rows of (0,1), (1,0), (1,2)
  EXPECT_EQ(run1("NonZero", 9, {}, {Tensor::scalar<int32_t>(7)}).shape(), (Shape{0, 1}));
  EXPECT_EQ(run1("NonZero", 13, {}, {bools({false, false})}).shape(), (Shape{1, 0}));
}

// ---------------------------------------------------------------- Compress

TEST(Compress, SlicesAlongAnAxisOrFlattenedElements) {
  const Tensor x = f32({3, 2}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(values(run1("Compress", 11, {attr("axis", int64_t{0})}, {x, bools({false, true, true})})),
            (std::vector<double>{3, 4, 5, 6}));
  const Tensor cols = run1("Compress", 11, {attr("axis", int64_t{-1})}, {x, bools({false, true})});
  EXPECT_EQ(cols.shape(), (Shape{3, 1}));
  EXPECT_EQ(values(cols), (std::vector<double>{2, 4, 6}));
  // Flattened, with a condition shorter than the input: nothing past its end.
  EXPECT_EQ(values(run1("Compress", 9, {}, {x, bools({false, true, false, false, true})})), (std::vector<double>{2, 5}));
  EXPECT_EQ(run1("Compress", 11, {attr("axis", int64_t{1})}, {x, bools({false, false})}).shape(), (Shape{3, 0}));
  EXPECT_TRUE(throws_with([&] { run1("Compress", 11, {attr("axis", int64_t{0})}, {x, bools({false, true, true, true})}); },
                          "past the end"));
  EXPECT_TRUE(throws_with([&] { run1("Compress", 9, {attr("axis", int64_t{-1})}, {x, bools({true})}); }, "needs opset 11"));
  EXPECT_TRUE(throws_with([&] { run1("Compress", 11, {}, {x, i64({2}, {1, 0})}); }, "1-D bool"));
}

// ---------------------------------------------------------------- ReverseSequence

TEST(ReverseSequence, TheOpDocsExamplesAndInnerDims) {
  std::vector<float> v(16);
  for (size_t i = 0; i < 16; ++i) v[i] = static_cast<float>(i);
  // Example 1 (time_axis 0): input[t][b] = 4 b + t ... written out in the doc.
  const Tensor x1 = f32({4, 4}, {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15});
  EXPECT_EQ(values(run1("ReverseSequence", 10, {}, {x1, i64({4, 3, 2, 1})})),
            (std::vector<double>{3, 6, 9, 12, 2, 5, 8, 13, 1, 4, 10, 14, 0, 7, 11, 15}));
  // Example 2 (batch_axis 0).
  EXPECT_EQ(values(run1("ReverseSequence", 28, {attr("batch_axis", int64_t{0}), attr("time_axis", int64_t{1})},
                        {f32({4, 4}, v), i64({1, 2, 3, 4})})),
            (std::vector<double>{0, 1, 2, 3, 5, 4, 6, 7, 10, 9, 8, 11, 15, 14, 13, 12}));
  // [time 3, batch 1, 2]: whole rows of 2 move.
  EXPECT_EQ(values(run1("ReverseSequence", 10, {}, {f32({3, 1, 2}, {1, 2, 3, 4, 5, 6}), i64({3})})),
            (std::vector<double>{5, 6, 3, 4, 1, 2}));
  EXPECT_TRUE(throws_with([&] { run1("ReverseSequence", 10, {}, {x1, i64({4, 5, 1, 1})}); }, "outside [0, 4]"));
  EXPECT_TRUE(throws_with([&] { run1("ReverseSequence", 10, {}, {x1, i64({4, 3})}); }, "the batch size"));
  EXPECT_TRUE(throws_with([&] { run1("ReverseSequence", 10, {attr("batch_axis", int64_t{0})}, {x1, i64({1, 1, 1, 1})}); },
                          "0 and 1 in some order"));
}

// ---------------------------------------------------------------- TensorScatter

TEST(TensorScatter, WritesRowsLinearlyOrCircularly) {
  // past [2, 4, 1] of zeros, update [2, 2, 1]: batch 0 writes rows 1-2, batch 1 rows 3, 0 (circular).
  const Tensor past = f32({2, 4, 1}, std::vector<float>(8, 0));
  const Tensor update = f32({2, 2, 1}, {1, 2, 3, 4});
  EXPECT_EQ(values(run1("TensorScatter", 24, {attr("axis", int64_t{1}), attr("mode", std::string("circular"))},
                        {past, update, i64({1, 3})})),
            (std::vector<double>{0, 1, 2, 0, 4, 0, 0, 3}));
  EXPECT_EQ(values(run1("TensorScatter", 24, {attr("axis", int64_t{1})}, {past, update})),
            (std::vector<double>{1, 2, 0, 0, 3, 4, 0, 0}));
  // Default axis -2 of [2, 1, 3, 2]: rows of 2 along dim 2, batch 1 at 1.
  const Tensor p4 = f32({2, 1, 3, 2}, std::vector<float>(12, 0));
  const Tensor u4 = f32({2, 1, 1, 2}, {1, 2, 3, 4});
  EXPECT_EQ(values(run1("TensorScatter", 24, {}, {p4, u4, i64({2, 1})})),
            (std::vector<double>{0, 0, 0, 0, 1, 2, 0, 0, 3, 4, 0, 0}));
  EXPECT_TRUE(throws_with([&] { run1("TensorScatter", 24, {attr("axis", int64_t{1})}, {past, update, i64({3, 0})}); },
                          "do not fit"));
  EXPECT_TRUE(throws_with([&] { run1("TensorScatter", 24, {attr("axis", int64_t{0})}, {past, update}); }, "batch axis"));
  EXPECT_TRUE(throws_with([&] { run1("TensorScatter", 24, {attr("axis", int64_t{1})}, {past, f32({2, 5, 1}, std::vector<float>(10, 0))}); },
                          "must match"));
  EXPECT_TRUE(throws_with([&] { run1("TensorScatter", 24, {attr("mode", std::string("ring"))}, {past, update}); }, "\"circular\""));
}

// ---------------------------------------------------------------- NonMaxSuppression

Tensor nms(const Tensor& boxes, const Tensor& scores, int64_t max_out, float iou, const Tensor& score_min, Attrs attrs = {}) {
  return run1("NonMaxSuppression", 11, std::move(attrs),
              {boxes, scores, i64({1}, {max_out}), f32({1}, {iou}), score_min});
}

TEST(NonMaxSuppression, SelectsByScoreAndSuppressesByIoU) {
  // Box 0 [0,0,1,1]; box 1 [0,0.1,1,1.1] overlaps it by IoU 0.9/1.1 = 0.818; box 2 [0,2,1,3] apart;
  // box 3 equals box 0 with corners flipped.
  const Tensor boxes = f32({1, 4, 4}, {0, 0, 1, 1, 0, 0.1f, 1, 1.1f, 0, 2, 1, 3, 1, 1, 0, 0});
  const Tensor scores = f32({1, 2, 4}, {0.9f, 0.95f, 0.5f, 0.4f, 0.1f, 0.2f, 0.3f, 0.3f});
  // Class 0: 1 (0.95); 0 suppressed (IoU 0.818 with 1 > 0.5); 2; 3 suppressed (0.818 with 1).
  // Class 1: 2 and 3 tie at 0.3 (lower index first, IoU 0); 1 suppressed by 3 (0.818); 0 by 3 (1).
  const Tensor all = nms(boxes, scores, 10, 0.5f, Tensor());
  EXPECT_EQ(ints(all), (Ints{0, 0, 1, 0, 0, 2, 0, 1, 2, 0, 1, 3}));
  // A threshold at 0.9: nothing suppresses; the maximum cuts each class at 3.
  EXPECT_EQ(ints(nms(boxes, scores, 3, 0.9f, Tensor())), (Ints{0, 0, 1, 0, 0, 0, 0, 0, 2, 0, 1, 2, 0, 1, 3, 0, 1, 1}));
  // Scores below 0.4 removed; 0.4 itself stays (the op doc: "less than score_threshold are
  // removed"); threshold 1: no IoU exceeds it.
  EXPECT_EQ(ints(nms(boxes, scores, 10, 1.0f, f32({1}, {0.4f}))), (Ints{0, 0, 1, 0, 0, 0, 0, 0, 2, 0, 0, 3}));
  EXPECT_EQ(nms(boxes, scores, 0, 0.5f, Tensor()).shape(), (Shape{0, 3}));
  // Center format: [x_c, y_c, w, h] of the same boxes 0 and 1.
  const Tensor centered = f32({1, 2, 4}, {0.5f, 0.5f, 1, 1, 0.6f, 0.5f, 1, 1});
  EXPECT_EQ(ints(nms(centered, f32({1, 1, 2}, {0.9f, 0.8f}), 5, 0.5f, Tensor(), {attr("center_point_box", int64_t{1})})),
            (Ints{0, 0, 0}));
  EXPECT_TRUE(throws_with([&] { nms(boxes, scores, 3, 1.5f, Tensor()); }, "must be in [0, 1]"));
  EXPECT_TRUE(throws_with([&] { nms(boxes, f32({1, 1, 3}, {1, 2, 3}), 3, 0.5f, Tensor()); }, "to match the boxes"));
}

// ---------------------------------------------------------------- bitwise

template <class T>
Tensor typed(const Shape& s, const std::vector<T>& v) {
  return Tensor::from_vector<T>(s, v);
}

TEST(Bitwise, AndOrXorNotBroadcast) {
  const Tensor a = typed<int16_t>({2, 3}, {0x0f0f, -1, 12, 7, -32768, 255});
  const Tensor b = typed<int16_t>({3}, {0x00ff, 0x1234, -3});
  const char* ops[] = {"BitwiseAnd", "BitwiseOr", "BitwiseXor"};
  for (int op = 0; op < 3; ++op) {
    std::vector<int64_t> want;
    for (int64_t i = 0; i < 6; ++i) {
      const int16_t x = a.data<int16_t>()[i], y = b.data<int16_t>()[i % 3];
      want.push_back(op == 0 ? int16_t(x & y) : op == 1 ? int16_t(x | y) : int16_t(x ^ y));
    }
    EXPECT_EQ(run1(ops[op], 18, {}, {a, b}).to_int64_vector("y"), want) << ops[op];
  }
  EXPECT_EQ(run1("BitwiseNot", 18, {}, {typed<uint8_t>({3}, {0, 0xf0, 255})}).to_int64_vector("y"), (Ints{255, 0x0f, 0}));
  EXPECT_EQ(run1("BitwiseNot", 18, {}, {typed<int32_t>({2}, {0, -6})}).to_int64_vector("y"), (Ints{-1, 5}));
  EXPECT_TRUE(throws_with([&] { run1("BitwiseAnd", 18, {}, {a, typed<int32_t>({3}, {1, 2, 3})}); }, "same type"));
}

TEST(BitShift, UnsignedAndSignedShiftsIncludingOutOfRange) {
  const Attrs left{attr("direction", std::string("LEFT"))}, right{attr("direction", std::string("RIGHT"))};
  const Tensor x = typed<uint8_t>({4}, {1, 4, 255, 16});
  EXPECT_EQ(run1("BitShift", 11, left, {x, typed<uint8_t>({4}, {1, 2, 1, 8})}).to_int64_vector("z"), (Ints{2, 16, 254, 0}));
  EXPECT_EQ(run1("BitShift", 11, right, {x, typed<uint8_t>({1}, {2})}).to_int64_vector("z"), (Ints{0, 1, 63, 4}));
  // Signed (28): arithmetic right shifts; left shifts through the sign bit; amounts < 0 or >= 8.
  const Tensor s = typed<int8_t>({5}, {-128, -7, 64, 3, -1});
  EXPECT_EQ(run1("BitShift", 28, right, {s, typed<int8_t>({5}, {7, 1, 6, 8, -1})}).to_int64_vector("z"),
            (Ints{-1, -4, 1, 0, -1}));
  EXPECT_EQ(run1("BitShift", 28, left, {s, typed<int8_t>({5}, {1, 1, 1, -2, 9})}).to_int64_vector("z"),
            (Ints{0, -14, -128, 0, 0}));
  EXPECT_EQ(run1("BitShift", 28, left, {typed<int64_t>({1}, {1}), typed<int64_t>({1}, {63})}).to_int64_vector("z"),
            (Ints{std::numeric_limits<int64_t>::min()}));
  EXPECT_TRUE(throws_with([&] { run1("BitShift", 11, {attr("direction", std::string("UP"))}, {x, x}); }, "\"LEFT\" or \"RIGHT\""));
  EXPECT_ANY_THROW(run1("BitShift", 11, left, {s, s}));  // signed types need BitShift-28
}

}  // namespace
}  // namespace onnxtrain
