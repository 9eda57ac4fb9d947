// ops/dnnl_util.h same_layout: which pairs of oneDNN descriptors put every element at the same
// place (so an Operand binds the tensor itself instead of reordering it), and a convolution and
// its gradient on 1x1 maps, where oneDNN's channel-blocked layout is the tensor's own, against
// float64 references; the Operand's own transpose of small channels-first inputs.
#include <gtest/gtest.h>

#include "ops/dnnl_util.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

namespace du = ops::dnnl_util;
using tag = dnnl::memory::format_tag;
using testing::attr;
using testing::expect_close;
using testing::NodeSpec;
using testing::random_f64;
using testing::run_node;

dnnl::memory::desc desc(const dnnl::memory::dims& dims, tag format) {
  return dnnl::memory::desc(dims, dnnl::memory::data_type::f32, format);
}

TEST(SameLayoutTest, ChannelBlocksOfOneByOneMapsAreRowMajor) {
  // [N, C, 1, 1] with 16 | C: channel c of image n is at n * C + c either way.
  EXPECT_TRUE(du::same_layout(desc({32, 512, 1, 1}, tag::abcd), desc({32, 512, 1, 1}, tag::aBcd16b)));
  EXPECT_TRUE(du::same_layout(desc({3, 16, 1, 1}, tag::aBcd16b), desc({3, 16, 1, 1}, tag::abcd)));
  EXPECT_TRUE(du::same_layout(desc({2, 3, 4}, tag::abc), desc({2, 3, 4}, tag::abc)));
  // A row vector is its own transpose.
  EXPECT_TRUE(du::same_layout(desc({1, 5}, tag::ab), desc({1, 5}, tag::ba)));
}

TEST(SameLayoutTest, LayoutsThatMoveElementsDiffer) {
  // 2x2 maps: channel 0's second position is element 1 in rows, 16 in channel blocks.
  EXPECT_FALSE(du::same_layout(desc({32, 256, 2, 2}, tag::abcd), desc({32, 256, 2, 2}, tag::aBcd16b)));
  // 24 channels pad to 32 in blocks of 16: more bytes, never the same.
  EXPECT_FALSE(du::same_layout(desc({2, 24, 1, 1}, tag::abcd), desc({2, 24, 1, 1}, tag::aBcd16b)));
  // Weights blocked by both channel dims transpose each 16 x 16 tile.
  EXPECT_FALSE(du::same_layout(desc({16, 16, 1, 1}, tag::abcd), desc({16, 16, 1, 1}, tag::ABcd16b16a)));
  EXPECT_FALSE(du::same_layout(desc({2, 5}, tag::ab), desc({2, 5}, tag::ba)));
  // Other dims or element types.
  EXPECT_FALSE(du::same_layout(desc({32, 512, 1, 1}, tag::abcd), desc({32, 512, 1, 2}, tag::abcd)));
  EXPECT_FALSE(du::same_layout(
      desc({4, 16}, tag::ab), dnnl::memory::desc({4, 16}, dnnl::memory::data_type::s32, tag::ab)));
}

// Convolutions on 1x1 maps with 32 channels (a 3x3 kernel with pads 1, as ResNet-18's last layer
// on its 1x1 maps, and a 1x1 kernel), and their gradients, against float64: oneDNN's blocked
// convolutions read and write such tensors in place of a reorder (the Operand's same layout).
TEST(SameLayoutTest, ConvolutionsOnOneByOneMapsMatchFloat64) {
  for (const int64_t k : {3, 1}) {
    SCOPED_TRACE("kernel " + std::to_string(k));
    const int64_t p = k / 2;
    const std::vector<onnx::AttributeProto> attrs{attr("pads", std::vector<int64_t>{p, p, p, p})};
    const Tensor x = random_f64(Shape{4, 32, 1, 1}, 11), w = random_f64(Shape{48, 32, k, k}, 12);
    const Tensor dy = random_f64(Shape{4, 48, 1, 1}, 13);
    const auto f32 = [](const Tensor& t) { return t.cast(DataType::Float32); };
    const Tensor y = run_node(NodeSpec{"Conv", "", 17, attrs, 1}, {f32(x), f32(w)}).at(0);
    expect_close(y, f32(run_node(NodeSpec{"Conv", "", 17, attrs, 1}, {x, w}).at(0)), 1e-5, 1e-5);
    const auto g = run_node(NodeSpec{"ConvGrad", "ai.onnxtrain", 1, attrs, 2}, {f32(dy), f32(x), f32(w)});
    const auto want = run_node(NodeSpec{"ConvGrad", "ai.onnxtrain", 1, attrs, 2}, {dy, x, w});
    expect_close(g.at(0), f32(want.at(0)), 1e-5, 1e-5);
    expect_close(g.at(1), f32(want.at(1)), 1e-5, 1e-5);
  }
}

// A small channels-first input that a primitive wants channels-last is transposed by the
// Operand's own loop (du::small_channels_first_to_last): the same floats as oneDNN's reorder,
// for 1 to 3 spatial dims; blocked layouts, larger tensors and plain-to-plain keep the reorder.
TEST(SameLayoutTest, SmallChannelsLastInputsAreTransposedAsOneDnnReordersThem) {
  const std::vector<std::pair<dnnl::memory::dims, tag>> cases{
      {{1, 3, 32, 32}, tag::acdb}, {{2, 5, 7}, tag::acb}, {{3, 4, 2, 3, 5}, tag::acdeb}, {{4, 3, 32, 32}, tag::acdb}};
  for (const auto& [dims, channels_last] : cases) {
    SCOPED_TRACE(::testing::Message() << dims.size() << "-D, " << dims[0] << " images of " << dims[1] << " channels");
    const dnnl::memory::desc plain = du::plain_f32(dims), wanted = desc(dims, channels_last);
    const du::ChannelsLastTranspose t = du::small_channels_first_to_last(plain, wanted);
    EXPECT_EQ(t.images, dims[0]);
    EXPECT_EQ(t.channels, dims[1]);
    const size_t n = plain.get_size() / sizeof(float);
    std::vector<float> x(n), got(n, -1.0f), want(n, -2.0f);
    for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i) * 0.5f - 3.0f;
    du::Operand operand(plain, wanted, true);
    operand.bind(x.data());
    char* cursor = reinterpret_cast<char*>(got.data());
    operand.place(cursor);
    operand.reorder(du::cpu_stream());
    dnnl::memory from(plain, du::cpu_engine(), x.data()), to(wanted, du::cpu_engine(), want.data());
    dnnl::reorder(from, to).execute(du::cpu_stream(), from, to);
    du::cpu_stream().wait();
    EXPECT_EQ(got, want);
  }
  // Not this path: blocks of 16 of 32 channels (16 channels in one block would be channels-last),
  // more than kSmallTransposeFloats floats, a row-major target, a channels-last source.
  const auto images = [](const dnnl::memory::desc& from, const dnnl::memory::desc& to) {
    return du::small_channels_first_to_last(from, to).images;
  };
  EXPECT_EQ(images(du::plain_f32({1, 32, 4, 4}), desc({1, 32, 4, 4}, tag::aBcd16b)), 0);
  EXPECT_EQ(images(du::plain_f32({8, 3, 32, 32}), desc({8, 3, 32, 32}, tag::acdb)), 0);
  EXPECT_EQ(images(du::plain_f32({2, 3, 4}), desc({2, 3, 4}, tag::abc)), 0);
  EXPECT_EQ(images(desc({1, 3, 4, 4}, tag::acdb), du::plain_f32({1, 3, 4, 4})), 0);
}

}  // namespace
}  // namespace onnxtrain
