// Unit tests for MatMul, Gemm, Conv, ConvTranspose and the pools: what the ONNX backend tests
// miss (dtypes, older opsets, broadcasting corners, error cases), and the float32 oneDNN paths
// against the float64 reference loops and against direct loops written here from the op docs.
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <random>

#include "onnxtrain/error.h"
#include "onnxtrain/session.h"
#include "ops/conv_geometry.h"
#include "ops/dnnl_util.h"
#include "ops/matmul_primitive.h"
#include "runtime/fusion.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::attr;
using testing::expect_close;
using testing::NodeSpec;
using testing::run_node;
using Attrs = std::vector<onnx::AttributeProto>;
using Ints = std::vector<int64_t>;

Tensor run1(const std::string& op, const std::vector<Tensor>& inputs, Attrs attrs = {},
            int opset = 17) {
  return run_node(NodeSpec{op, "", opset, std::move(attrs), 1}, inputs)[0];
}

Tensor f64(const Shape& shape, const std::vector<double>& v) {
  return Tensor::from_vector<double>(shape, v);
}
Tensor f32(const Shape& shape, const std::vector<float>& v) {
  return Tensor::from_vector<float>(shape, v);
}

// Uniform values in [-1, 1), float64.
Tensor random(const Shape& shape, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (auto& x : v) x = dist(gen);
  return f64(shape, v);
}

// Runs op on float64 inputs and on the same inputs as float32 (the oneDNN path); checks both
// against `want` (float64) and returns nothing.
void expect_both_paths(const std::string& op, const std::vector<Tensor>& inputs64,
                       const Attrs& attrs, const Tensor& want, int opset = 17) {
  expect_close(run1(op, inputs64, attrs, opset), want, 1e-10, 1e-10);
  std::vector<Tensor> inputs32;
  for (const Tensor& t : inputs64)
    inputs32.push_back(t.defined() ? t.cast(DataType::Float32) : Tensor());
  const Tensor got32 = run1(op, inputs32, attrs, opset);
  ASSERT_EQ(got32.dtype(), DataType::Float32);
  expect_close(got32.cast(DataType::Float64), want, 1e-4, 1e-5);
}

// ---------------------------------------------------------------------------------------------
// MatMul

// numpy.matmul for operands of rank 2..4 (batch dims broadcast), float64.
Tensor naive_matmul(const Tensor& a, const Tensor& b) {
  auto dims4 = [](const Shape& s) {
    Ints d(4 - s.size(), 1);
    for (int64_t x : s) d.push_back(x);
    return d;
  };
  const Ints da = dims4(a.shape()), db = dims4(b.shape());
  const int64_t M = da[2], K = da[3], N = db[3];
  Ints out{std::max(da[0], db[0]), std::max(da[1], db[1]), M, N};
  std::vector<double> y;
  const auto av = a.values<double>();
  const auto bv = b.values<double>();
  for (int64_t i0 = 0; i0 < out[0]; ++i0) {
    for (int64_t i1 = 0; i1 < out[1]; ++i1) {
      const int64_t ao = ((da[0] == 1 ? 0 : i0) * da[1] + (da[1] == 1 ? 0 : i1)) * M * K;
      const int64_t bo = ((db[0] == 1 ? 0 : i0) * db[1] + (db[1] == 1 ? 0 : i1)) * K * N;
      for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < N; ++j) {
          double s = 0;
          for (int64_t k = 0; k < K; ++k)
            s += av[static_cast<size_t>(ao + i * K + k)] * bv[static_cast<size_t>(bo + k * N + j)];
          y.push_back(s);
        }
      }
    }
  }
  const size_t rank = std::max(a.rank(), b.rank());
  Shape shape(Ints(out.end() - static_cast<std::ptrdiff_t>(rank), out.end()));
  return f64(shape, y);
}

TEST(MatMulTest, HandComputed) {
  const Tensor a = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor b = f32({3, 2}, {1, 0, 0, 1, 1, 1});
  expect_close(run1("MatMul", {a, b}), f32({2, 2}, {4, 5, 10, 11}));
}

TEST(MatMulTest, OneDimOperandsArePromotedAndTheDimRemoved) {
  const Tensor v = f64({3}, {1, 2, 3});
  const Tensor m = f64({3, 2}, {1, 0, 0, 1, 1, 1});
  expect_both_paths("MatMul", {v, m}, {}, f64({2}, {4, 5}));  // [3]x[3,2]
  expect_both_paths("MatMul", {f64({2, 3}, {1, 0, 1, 0, 1, 0}), v}, {},
                    f64({2}, {4, 2}));                     // [2,3]x[3]
  expect_both_paths("MatMul", {v, v}, {}, f64({}, {14}));  // [3]x[3]
  const Tensor batch = random({2, 3, 4}, 1);
  const Tensor want = naive_matmul(v.view({1, 3}), batch);  // [2,1,4]
  expect_both_paths("MatMul", {v, batch}, {}, want.view({2, 4}));
}

TEST(MatMulTest, Float32MatchesFloat64AndDirectLoops) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{7, 5}, {5, 9}},
      {{1, 1}, {1, 1}},
      {{3, 4, 5}, {3, 5, 6}},
      {{2, 3, 4, 5}, {5, 6}},
      {{2, 1, 4, 5}, {3, 5, 2}},
      {{4, 5}, {2, 3, 5, 6}},
      {{2, 3, 4, 5}, {2, 3, 5, 6}},
      {{1, 3, 2, 8}, {2, 1, 8, 3}},
      {{33, 70}, {70, 65}},
  };
  uint32_t seed = 10;
  for (const auto& [sa, sb] : cases) {
    SCOPED_TRACE(sa.to_string() + " x " + sb.to_string());
    const Tensor a = random(sa, seed++), b = random(sb, seed++);
    expect_both_paths("MatMul", {a, b}, {}, naive_matmul(a, b));
  }
}

TEST(MatMulTest, IntegersWrapLikeNumpy) {
  const Tensor a = Tensor::from_vector<int8_t>({1, 2}, {100, 100});
  const Tensor b = Tensor::from_vector<int8_t>({2, 1}, {2, 1});
  expect_close(run1("MatMul", {a, b}), Tensor::from_vector<int8_t>({1, 1}, {44}));  // 300 - 256
  const Tensor c = Tensor::from_vector<int32_t>({2, 2}, {1, -2, 3, 4});
  expect_close(run1("MatMul", {c, c}), Tensor::from_vector<int32_t>({2, 2}, {-5, -10, 15, 10}));
  const Tensor u = Tensor::from_vector<uint64_t>({1, 2}, {1ull << 40, 3});
  const Tensor w = Tensor::from_vector<uint64_t>({2, 1}, {2, 5});
  expect_close(run1("MatMul", {u, w}), Tensor::from_vector<uint64_t>({1, 1}, {(1ull << 41) + 15}));
}

TEST(MatMulTest, HalfTypesComputeThroughFloat) {
  const Tensor a = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor b = f32({3, 1}, {0.5f, 0.25f, 2});
  for (DataType t : {DataType::Float16, DataType::BFloat16}) {
    const Tensor y = run1("MatMul", {a.cast(t), b.cast(t)});
    EXPECT_EQ(y.dtype(), t);
    expect_close(y.cast(DataType::Float32), f32({2, 1}, {7, 15.25f}));
  }
}

TEST(MatMulTest, EmptyAndZeroInnerDim) {
  EXPECT_EQ(run1("MatMul", {random({0, 3}, 1), random({3, 4}, 2)}).shape(), Shape({0, 4}));
  const Tensor z = Tensor::zeros(DataType::Float32, {2, 0});
  expect_close(run1("MatMul", {z, Tensor::zeros(DataType::Float32, {0, 3})}),
               Tensor::zeros(DataType::Float32, {2, 3}));
}

TEST(MatMulTest, Errors) {
  EXPECT_THROW(run1("MatMul", {random({2, 3}, 1), random({4, 2}, 2)}), Error);
  EXPECT_THROW(run1("MatMul", {random({}, 1), random({1, 2}, 2)}), Error);
  EXPECT_THROW(run1("MatMul", {random({2, 3, 4}, 1), random({3, 4, 5}, 2)}), Error);
  EXPECT_THROW(run1("MatMul", {random({2, 3}, 1), random({3, 2}, 2).cast(DataType::Float32)}),
               Error);
}

// ---------------------------------------------------------------------------------------------
// Einsum (numpy's einsum; the backend tests cover batch matmul, diagonals, sums, transposes)

TEST(EinsumTest, ImplicitOutputEllipsisAndDiagonal) {
  const Attrs implicit = {attr("equation", std::string("...ij,jk"))};  // -> ...ik
  const Tensor a = random({2, 3, 4}, 1), b = random({4, 5}, 2);
  expect_both_paths("Einsum", {a, b}, implicit, run1("MatMul", {a, b}), 12);
  // ij,ji->: every label summed, the trace of a product.
  const Tensor m = f64({2, 2}, {1, 2, 3, 4}), n = f64({2, 2}, {5, 6, 7, 8});
  expect_both_paths("Einsum", {m, n}, {attr("equation", std::string("ij,ji->"))}, f64({}, {1 * 5 + 2 * 7 + 3 * 6 + 4 * 8}), 12);
  expect_both_paths("Einsum", {m}, {attr("equation", std::string("ii->i"))}, f64({2}, {1, 4}), 12);
  expect_both_paths("Einsum", {m}, {attr("equation", std::string(" i j -> j i "))}, f64({2, 2}, {1, 3, 2, 4}), 12);
  // '...' dims broadcast: [2, 1, 2] and [3, 2] -> [2, 3].
  const Tensor p = f64({2, 1, 2}, {1, 2, 3, 4}), q = f64({3, 2}, {1, 0, 0, 1, 1, 1});
  expect_both_paths("Einsum", {p, q}, {attr("equation", std::string("...i,...i->..."))},
                    f64({2, 3}, {1, 2, 3, 3, 4, 7}), 12);
}

TEST(EinsumTest, Errors) {
  const Tensor a = random({2, 3}, 1), b = random({4, 5}, 2);
  auto error = [&](const std::string& equation, const std::vector<Tensor>& in) {
    try {
      run1("Einsum", in, {attr("equation", equation)}, 12);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error("ij,jk->ik", {a, b}).find("label 'j' of 'ij,jk->ik' is 3 in one place and 4"), std::string::npos);
  EXPECT_NE(error("ij->k", {a}).find("output label 'k' names no input dim"), std::string::npos);
  EXPECT_NE(error("i1->i", {a}).find("unexpected character '1'"), std::string::npos);
  EXPECT_NE(error("ijk->i", {a}).find("names 3 dims"), std::string::npos);
  EXPECT_NE(error("ij,jk->ik", {a}).find("has 2 input terms but the node has 1 inputs"), std::string::npos);
}

// Resize: the backend tests cover every mode; here the errors.
TEST(ResizeTest, Errors) {
  const Tensor x = random({1, 1, 2, 2}, 1);
  const Tensor scales = Tensor::from_vector<float>({4}, {1, 1, 2, 2});
  const Tensor sizes = Tensor::from_vector<int64_t>({4}, {1, 1, 4, 4});
  auto error = [&](const std::vector<Tensor>& in, Attrs attrs) {
    try {
      run1("Resize", in, std::move(attrs), 13);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error({x, Tensor(), scales, sizes}, {}).find("exactly one of scales and sizes"), std::string::npos);
  EXPECT_NE(error({x, Tensor(), Tensor::from_vector<float>({2}, {2, 2})}, {}).find("has 2 values for input rank 4"),
            std::string::npos);
  EXPECT_NE(error({x, Tensor(), scales}, {attr("mode", std::string("area"))}).find("attribute 'mode' is 'area', expected one of nearest, linear, cubic"),
            std::string::npos);
  EXPECT_NE(error({x, Tensor(), scales}, {attr("coordinate_transformation_mode", std::string("tf_crop_and_resize"))})
                .find("needs the roi input (8 values)"),
            std::string::npos);
  EXPECT_NE(error({x, f32({2}, {0, 1}), scales}, {attr("coordinate_transformation_mode", std::string("tf_crop_and_resize"))})
                .find("must hold 2 x 4 values"),
            std::string::npos);
  // Opset 18's and 19's attributes are errors before them.
  EXPECT_NE(error({x, Tensor(), scales}, {attr("antialias", int64_t{1})}).find("opset 18"), std::string::npos);
  EXPECT_NE(error({x, Tensor(), scales}, {attr("axes", Ints{2, 3})}).find("opset 18"), std::string::npos);
  const auto at = [&](int opset, const std::vector<Tensor>& in, Attrs attrs) {
    try {
      run1("Resize", in, std::move(attrs), opset);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const Attrs symmetric{attr("coordinate_transformation_mode", std::string("half_pixel_symmetric"))};
  EXPECT_NE(at(18, {x, Tensor(), scales}, symmetric).find("expected one of"), std::string::npos);
  EXPECT_EQ(at(19, {x, Tensor(), scales}, symmetric), "no error");
  EXPECT_NE(at(18, {x, Tensor(), scales}, {attr("antialias", int64_t{1})}).find("not nearest"), std::string::npos);
  EXPECT_NE(at(18, {x, Tensor(), f32({1}, {2})}, {attr("axes", Ints{3, -1})}).find("twice"), std::string::npos);
  EXPECT_NE(at(18, {x, Tensor(), scales}, {attr("axes", Ints{2, 3})}).find("has 4 values for the 2 axes"),
            std::string::npos);
  EXPECT_NE(at(18, {x, Tensor(), Tensor(), sizes}, {attr("keep_aspect_ratio_policy", std::string("fit"))})
                .find("not_smaller"),
            std::string::npos);
}

// Opset 18's axes: roi, scales and sizes describe only those dims; the others keep their size.
// The results equal opset 13's with the full-rank inputs.
TEST(ResizeTest, Opset18AxesSelectTheDims) {
  const Tensor x = random({2, 3, 4}, 7);
  const Attrs linear{attr("mode", std::string("linear"))};
  expect_close(run1("Resize", {x, Tensor(), f32({2}, {2.0f, 0.5f})}, {linear[0], attr("axes", Ints{2, 0})}, 18),
               run1("Resize", {x, Tensor(), f32({3}, {0.5f, 1, 2})}, linear, 13), 1e-12, 1e-12);
  const Tensor sizes = Tensor::from_vector<int64_t>({1}, {5});
  expect_close(run1("Resize", {x, Tensor(), Tensor(), sizes}, {attr("axes", Ints{-2})}, 19),
               run1("Resize", {x, Tensor(), Tensor(), Tensor::from_vector<int64_t>({3}, {2, 5, 4})}, {}, 13), 0, 0);
  // roi of the axes only; the other dims get [0, 1].
  const Attrs crop{attr("coordinate_transformation_mode", std::string("tf_crop_and_resize")), linear[0]};
  Attrs crop_axes = crop;
  crop_axes.push_back(attr("axes", Ints{2}));
  expect_close(run1("Resize", {x, f32({2}, {0.25f, 0.75f}), Tensor(), Tensor::from_vector<int64_t>({1}, {3})}, crop_axes, 18),
               run1("Resize", {x, f32({6}, {0, 0, 0.25f, 1, 1, 0.75f}), Tensor(), Tensor::from_vector<int64_t>({3}, {2, 3, 3})},
                    crop, 13),
               1e-12, 1e-12);
}

// keep_aspect_ratio_policy: one scale for all the axes, the smallest (not_larger) or largest
// (not_smaller) of sizes / in, and out = round_half_up(scale * in). x = arange(24) as 4 x 6,
// asymmetric nearest: output (i, j) reads x[floor-ish(i / s), ...] (values checked against the
// ONNX reference).
TEST(ResizeTest, Opset18KeepAspectRatioPolicy) {
  const Tensor x = f64({4, 6}, [] {
    std::vector<double> v(24);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
    return v;
  }());
  const Tensor sizes = Tensor::from_vector<int64_t>({2}, {3, 3});
  const auto policy = [&](const std::string& p) {
    return run1("Resize", {x, Tensor(), Tensor(), sizes},
                {attr("coordinate_transformation_mode", std::string("asymmetric")), attr("keep_aspect_ratio_policy", p)},
                18);
  };
  // not_smaller: scale max(3/4, 3/6) = 0.75, out [3, round(4.5) = 5].
  const Tensor larger = policy("not_smaller");
  ASSERT_EQ(larger.shape(), (Shape{3, 5}));
  EXPECT_EQ(larger.to_double_vector(), (std::vector<double>{0, 1, 3, 4, 5, 6, 7, 9, 10, 11, 18, 19, 21, 22, 23}));
  // not_larger: scale 0.5, out [2, 3].
  const Tensor smaller = policy("not_larger");
  ASSERT_EQ(smaller.shape(), (Shape{2, 3}));
  EXPECT_EQ(smaller.to_double_vector(), (std::vector<double>{0, 2, 4, 12, 14, 16}));
  // stretch (the default) takes the sizes as they are.
  EXPECT_EQ(policy("stretch").shape(), (Shape{3, 3}));
}

// antialias (opset 18) widens linear and cubic kernels by 1 / scale when downscaling. Linear,
// scale 0.5, half_pixel: output 0 sits at x = 0.5 and weighs inputs -1..2 (the edge repeated)
// by 1 - |0.5 (k - 0.5)|, normalized: 1/8, 3/8, 3/8, 1/8.
TEST(ResizeTest, Opset18AntialiasWidensTheKernelWhenDownscaling) {
  const Tensor x = f64({1, 8}, {0, 1, 2, 3, 4, 5, 6, 7});
  const Attrs aa{attr("mode", std::string("linear")), attr("antialias", int64_t{1}), attr("axes", Ints{1})};
  expect_close(run1("Resize", {x, Tensor(), f32({1}, {0.5f})}, aa, 18), f64({1, 4}, {0.625, 2.5, 4.5, 6.375}), 1e-12,
               1e-12);
  // Values from the ONNX reference (onnx.reference, ONNX 1.23.2) for cubic and for sizes. The
  // reference computes the cubic weights in float32 (its cubic_coeff_a is a numpy float32, which
  // NumPy 2 keeps in float32 arithmetic), so it agrees to about 1e-6 there, not 1e-12.
  const Tensor y = f64({1, 10}, {0, 3, 1, 4, 1, 5, 9, 2, 6, 5});
  Attrs cubic{attr("mode", std::string("cubic")), attr("antialias", int64_t{1}), attr("axes", Ints{1})};
  expect_close(run1("Resize", {y, Tensor(), f32({1}, {0.4f})}, cubic, 18),
               f64({1, 4}, {1.41539903, 2.58509864, 5.54670045, 4.89659973}), 2e-6, 1e-7);
  cubic.push_back(attr("exclude_outside", int64_t{1}));
  expect_close(run1("Resize", {y, Tensor(), f32({1}, {0.4f})}, cubic, 19),
               f64({1, 4}, {1.51541706, 2.5371462, 5.53655935, 4.8892929}), 2e-6, 1e-7);
  expect_close(run1("Resize", {y, Tensor(), Tensor(), Tensor::from_vector<int64_t>({1}, {3})}, aa, 18),
               f64({1, 3}, {1.65671642, 3.93939394, 5.14925373}), 1e-7, 1e-7);
  // Upscaling is unchanged by it.
  const Attrs plain{attr("mode", std::string("linear")), attr("axes", Ints{1})};
  expect_close(run1("Resize", {x, Tensor(), f32({1}, {2.5f})}, aa, 18), run1("Resize", {x, Tensor(), f32({1}, {2.5f})}, plain, 18),
               1e-12, 1e-12);
}

// half_pixel_symmetric (opset 19) centres the sampled region when floor() shrinks the output:
// 4 -> floor(2.4) = 2 samples at 2/3 and 7/3, symmetric about 1.5 (half_pixel: 1/3 and 2).
TEST(ResizeTest, Opset19HalfPixelSymmetric) {
  const Tensor x = f64({4}, {0, 1, 2, 3});
  const auto resize = [&](const std::string& mode) {
    return run1("Resize", {x, Tensor(), f32({1}, {0.6f})},
                {attr("mode", std::string("linear")), attr("coordinate_transformation_mode", mode)}, 19);
  };
  expect_close(resize("half_pixel_symmetric"), f64({2}, {2.0 / 3, 7.0 / 3}), 1e-6, 1e-6);
  expect_close(resize("half_pixel"), f64({2}, {1.0 / 3, 2.0}), 1e-6, 1e-6);
  // With an exact output size it is half_pixel.
  const Tensor s = f32({1}, {0.5f});
  expect_close(run1("Resize", {x, Tensor(), s}, {attr("coordinate_transformation_mode", std::string("half_pixel_symmetric"))}, 19),
               run1("Resize", {x, Tensor(), s}, {}, 19), 0, 0);
}

// ---------------------------------------------------------------------------------------------
// Gemm

// alpha * A' B' + beta * C, C of shape [M|1, N|1] or rank < 2 (right-aligned), float64.
Tensor naive_gemm(const Tensor& a, const Tensor& b, const Tensor& c, bool ta, bool tb, double alpha,
                  double beta) {
  const int64_t M = ta ? a.dim(1) : a.dim(0), K = ta ? a.dim(0) : a.dim(1),
                N = tb ? b.dim(0) : b.dim(1);
  const auto av = a.values<double>(), bv = b.values<double>();
  std::vector<double> y;
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) {
        s += av[static_cast<size_t>(ta ? k * M + i : i * K + k)] *
             bv[static_cast<size_t>(tb ? j * K + k : k * N + j)];
      }
      double cv = 0;
      if (c.defined()) {
        const int64_t rows = c.rank() == 2 ? c.dim(0) : 1,
                      cols = c.rank() >= 1 ? c.shape().back() : 1;
        cv = c.values<double>()[static_cast<size_t>((rows == 1 ? 0 : i) * cols +
                                                    (cols == 1 ? 0 : j))];
      }
      y.push_back(alpha * s + beta * cv);
    }
  }
  return f64({M, N}, y);
}

// M = 1 takes the matrix-vector path (float32); K and N long enough for several column blocks
// and both threads. With transB each row's sum runs in one order whichever group of rows it falls
// in (12, 4 or 1 at a time): B's rows reversed give y reversed, to the bit.
TEST(GemmTest, OneRowProducts) {
  const int64_t K = 300, N = 705;  // per thread (352, 353 rows): 29 twelves, a four, 0 or 1 left
  uint32_t seed = 200;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      const Tensor a = random(ta ? Shape{K, 1} : Shape{1, K}, seed++);
      const Tensor b = random(tb ? Shape{N, K} : Shape{K, N}, seed++);
      const Attrs attrs = {attr("transA", int64_t{ta}), attr("transB", int64_t{tb}),
                           attr("alpha", 0.5f), attr("beta", 2.0f)};
      SCOPED_TRACE("transA " + std::to_string(ta) + " transB " + std::to_string(tb));
      expect_both_paths("Gemm", {a, b}, attrs, naive_gemm(a, b, Tensor(), ta, tb, 0.5, 2.0));
      for (const Shape& cs : std::vector<Shape>{{N}, {1, N}, {1, 1}, {}}) {
        const Tensor c = random(cs, seed++);
        expect_both_paths("Gemm", {a, b, c}, attrs, naive_gemm(a, b, c, ta, tb, 0.5, 2.0));
      }
      if (!tb) continue;
      const Tensor a32 = a.cast(DataType::Float32), b32 = b.cast(DataType::Float32);
      Tensor reversed(DataType::Float32, b32.shape());
      for (int64_t j = 0; j < N; ++j) {
        std::copy_n(b32.data<float>() + j * K, K, reversed.data<float>() + (N - 1 - j) * K);
      }
      const Tensor y = run1("Gemm", {a32, b32}, attrs, 17);
      const Tensor y_reversed = run1("Gemm", {a32, reversed}, attrs, 17);
      for (int64_t j = 0; j < N; ++j) EXPECT_EQ(y.data<float>()[j], y_reversed.data<float>()[N - 1 - j]) << "row " << j;
    }
  }
}

TEST(GemmTest, EveryTransposeAndBiasShape) {
  const int64_t M = 5, K = 7, N = 4;
  const std::vector<Shape> c_shapes = {{N}, {1, N}, {M, 1}, {M, N}, {}, {1}};
  uint32_t seed = 100;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      const Tensor a = random(ta ? Shape{K, M} : Shape{M, K}, seed++);
      const Tensor b = random(tb ? Shape{N, K} : Shape{K, N}, seed++);
      const Attrs attrs = {attr("transA", int64_t{ta}), attr("transB", int64_t{tb}),
                           attr("alpha", 0.5f), attr("beta", 2.0f)};
      SCOPED_TRACE("transA " + std::to_string(ta) + " transB " + std::to_string(tb));
      expect_both_paths("Gemm", {a, b}, attrs, naive_gemm(a, b, Tensor(), ta, tb, 0.5, 2.0));
      for (const Shape& cs : c_shapes) {
        SCOPED_TRACE("C " + cs.to_string());
        const Tensor c = random(cs, seed++);
        expect_both_paths("Gemm", {a, b, c}, attrs, naive_gemm(a, b, c, ta, tb, 0.5, 2.0));
      }
    }
  }
}

TEST(GemmTest, DefaultsAndOpset6BroadcastAttribute) {
  const Tensor a = random({3, 6}, 1), b = random({4, 6}, 2), c = random({4}, 3);
  const Tensor want = naive_gemm(a, b, c, false, true, 1.0, 1.0);
  expect_both_paths("Gemm", {a, b, c}, {attr("transB", int64_t{1}), attr("broadcast", int64_t{1})},
                    want, 6);
  expect_both_paths("Gemm", {a, b, c}, {attr("transB", int64_t{1})}, want, 11);
}

TEST(GemmTest, BetaZeroIgnoresC) {
  const Tensor a = random({2, 3}, 1), b = random({3, 2}, 2);
  const Tensor c = f64({1}, {std::numeric_limits<double>::infinity()});
  expect_both_paths("Gemm", {a, b, c}, {attr("beta", 0.0f)},
                    naive_gemm(a, b, Tensor(), false, false, 1, 0));
}

// A linear layer's Gemm on a B that is not an initializer (a training graph's weight): float32,
// transB, alpha = beta = 1 runs oneDNN's matmul with a C of one row of N in its epilogue, and any
// other C by filling the output first. One session meets the C shapes one after the other and
// comes back to the first ones.
TEST(GemmTest, LinearLayerBiasInTheEpilogueAndOtherCsInOneKernel) {
  const int64_t M = 6, K = 9, N = 5;
  onnx::ModelProto m = testing::empty_model("gemm");
  onnx::GraphProto& g = *m.mutable_graph();
  testing::typed_value(g.add_input(), "a", onnx::TensorProto::FLOAT, {M, K});
  testing::typed_value(g.add_input(), "b", onnx::TensorProto::FLOAT, {N, K});
  testing::typed_value(g.add_input(), "c", onnx::TensorProto::FLOAT, {});
  testing::typed_value(g.add_output(), "y", onnx::TensorProto::FLOAT, {});
  testing::add_node(g, "Gemm", {"a", "b", "c"}, {"y"})->add_attribute()->CopyFrom(attr("transB", int64_t{1}));
  runtime::Session session(m);
  const Tensor a = random({M, K}, 7), b = random({N, K}, 8);
  uint32_t seed = 20;
  for (const Shape& cs : std::vector<Shape>{{N}, {M, N}, {1, N}, {M, 1}, {}, {N}, {1}, {1, N}}) {
    SCOPED_TRACE("C " + cs.to_string());
    const Tensor c = random(cs, seed++);
    const Tensor got = session.run({{"a", a.cast(DataType::Float32)}, {"b", b.cast(DataType::Float32)},
                                    {"c", c.cast(DataType::Float32)}}).at("y");
    expect_close(got.cast(DataType::Float64), naive_gemm(a, b, c, false, true, 1.0, 1.0), 1e-4, 1e-5);
  }
}

// A weight gradient's shape, dW = dY^T X with more output rows than columns over many rows
// (M = 512, N = 128, K = 1024: ops/matmul_primitive.h), runs through oneDNN's matmul primitive
// reading A by strides with AVX-512 (transposed_a_prefers_matmul) and as the transposed product
// B^T A transposed back without it (transposed_a_prefers_swap): without C, with a bias row, and
// with a full C, alpha and beta.
TEST(GemmTest, TransposedAOfAWeightGradientsShape) {
  const int64_t M = 512, N = 128, K = 1024;
  const Tensor a = random({K, M}, 31), b = random({K, N}, 32);
  struct CCase {
    const char* what;
    Shape c;
    float alpha, beta;
  };
  for (const CCase& cc : {CCase{"no C", {}, 1.0f, 1.0f}, CCase{"bias row", {N}, 1.0f, 1.0f},
                          CCase{"full C, alpha, beta", {M, N}, 0.5f, 2.0f}}) {
    SCOPED_TRACE(cc.what);
    std::vector<Tensor> inputs{a.cast(DataType::Float32), b.cast(DataType::Float32)};
    const bool has_c = !cc.c.empty();
    const Tensor c = has_c ? random(cc.c, 33) : Tensor();
    if (has_c) inputs.push_back(c.cast(DataType::Float32));
    const Tensor got = run1("Gemm", inputs, {attr("transA", int64_t{1}), attr("alpha", cc.alpha), attr("beta", cc.beta)});
    // float32 sums over 1024 rows against float64.
    expect_close(got.cast(DataType::Float64), naive_gemm(a, b, has_c ? c : Tensor(), true, false, cc.alpha, cc.beta),
                 1e-4, 1e-4);
  }
}

// ops/matmul_primitive.h swapped_transposed_a_product on its own, whatever this CPU's rule:
// C = alpha A^T B + beta C with rows longer than the operands (leading dimensions lda, ldb, ldc
// past M, N), against float64; beta 0 ignores what C held (NaN included), and the columns of C
// past N stay as they were.
TEST(GemmTest, SwappedTransposedAProduct) {
  const int64_t M = 70, N = 33, K = 129, lda = M + 3, ldb = N + 5, ldc = N + 2;
  const Tensor a = random({K, lda}, 41), b = random({K, ldb}, 42), c0 = random({M, ldc}, 43);
  for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.5f, 2.0f}}) {
    SCOPED_TRACE("alpha " + std::to_string(alpha) + ", beta " + std::to_string(beta));
    const Tensor a32 = a.cast(DataType::Float32), b32 = b.cast(DataType::Float32);
    Tensor c = c0.cast(DataType::Float32);
    if (beta == 0.0f) c.data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
    ops::swapped_transposed_a_product(M, N, K, alpha, a32.data<float>(), lda, b32.data<float>(), ldb, beta,
                                      c.data<float>(), ldc);
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < ldc; ++n) {
        const double old = c0.data<double>()[m * ldc + n];
        double want = old;
        if (n < N) {
          double sum = 0;
          for (int64_t k = 0; k < K; ++k) sum += a.data<double>()[k * lda + m] * b.data<double>()[k * ldb + n];
          want = alpha * sum + beta * old;
        }
        ASSERT_NEAR(c.data<float>()[m * ldc + n], want, 1e-4 * (1 + std::abs(want))) << m << ", " << n;
      }
    }
  }
  // The rule: never with AVX-512; without it for the weight-gradient shapes it was measured at.
  const bool avx512 = ops::dnnl_util::has_isa(dnnl::cpu_isa::avx512_core);
  EXPECT_EQ(ops::transposed_a_prefers_swap(1024, 256, 4096), !avx512);
  EXPECT_FALSE(ops::transposed_a_prefers_swap(1024, 512, 4096));  // N as large as half of M
  EXPECT_FALSE(ops::transposed_a_prefers_swap(256, 32, 4096));    // few rows
  EXPECT_FALSE(ops::transposed_a_prefers_swap(512, 128, 128));    // a short sum
  EXPECT_FALSE(avx512 && ops::transposed_a_prefers_swap(1024, 256, 4096));
  EXPECT_FALSE(!avx512 && ops::transposed_a_prefers_matmul(1024, 256, 4096));
}

// ops/matmul_primitive.h row_major_sgemm: C = alpha op(A) B + beta C with a plain B whose rows
// are a multiple of 2 KiB long, for a transposed and a plain A, B at a 32-byte-aligned address
// (where unaligned_b_is_faster holds, the product runs as column 0 plus columns 1.. read from
// B + 1) and at one float past it (one product), against float64; beta 0 ignores what C held
// (NaN included), the columns of C past N stay as they were.
TEST(GemmTest, RowMajorSgemmWithAShiftedB) {
  const int64_t M = 64, N = 1024, K = 96, ldb = 1024, ldc = N + 3;
  std::mt19937 rng(51);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> a(static_cast<size_t>(M * K)), storage(static_cast<size_t>(K * ldb + 16)), c0(static_cast<size_t>(M * ldc));
  for (float& v : a) v = dist(rng);
  for (float& v : storage) v = dist(rng);
  for (float& v : c0) v = dist(rng);
  float* aligned = storage.data();
  while (reinterpret_cast<std::uintptr_t>(aligned) % 32 != 0) ++aligned;
  for (const char trans_a : {'N', 'T'}) {
    for (const float* b : {static_cast<const float*>(aligned), static_cast<const float*>(aligned + 1)}) {
      for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.5f, 2.0f}}) {
        SCOPED_TRACE(std::string("trans_a ") + trans_a + (b == aligned ? ", B aligned" : ", B one float on") +
                     ", alpha " + std::to_string(alpha) + ", beta " + std::to_string(beta));
        std::vector<float> c = c0;
        if (beta == 0.0f) c[0] = c[static_cast<size_t>(ldc - 1 - 3)] = std::numeric_limits<float>::quiet_NaN();
        const int64_t lda = trans_a == 'T' ? M : K;  // A stored [K, M] or [M, K]
        ASSERT_EQ(ops::row_major_sgemm(trans_a, 'N', M, N, K, alpha, a.data(), lda, b, ldb, beta, c.data(), ldc),
                  dnnl_success);
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t n = 0; n < ldc; ++n) {
            const double old = c0[static_cast<size_t>(m * ldc + n)];
            double want = old;
            if (n < N) {
              double sum = 0;
              for (int64_t k = 0; k < K; ++k) {
                sum += double(trans_a == 'T' ? a[static_cast<size_t>(k * M + m)] : a[static_cast<size_t>(m * K + k)]) *
                       b[k * ldb + n];
              }
              want = alpha * sum + beta * old;
            }
            ASSERT_NEAR(c[static_cast<size_t>(m * ldc + n)], want, 1e-4 * (1 + std::abs(want))) << m << ", " << n;
          }
        }
      }
    }
  }
  // The rule: never with AVX-512; without it at the shapes measured faster, not at the others.
  const bool avx512 = ops::dnnl_util::has_isa(dnnl::cpu_isa::avx512_core);
  EXPECT_EQ(ops::unaligned_b_is_faster(M, N, ldb), !avx512);
  EXPECT_EQ(ops::unaligned_b_is_faster(256, 1024, 1024), !avx512);  // BERT's feed-forward dW
  EXPECT_EQ(ops::unaligned_b_is_faster(512, 512, 512), !avx512);
  EXPECT_FALSE(ops::unaligned_b_is_faster(128, 3136, 3136));  // a row stride not a multiple of 2 KiB
  EXPECT_FALSE(ops::unaligned_b_is_faster(128, 1280, 1280));
  EXPECT_FALSE(ops::unaligned_b_is_faster(16, 1024, 1024));   // few rows
  EXPECT_FALSE(ops::unaligned_b_is_faster(4096, 256, 256));   // few columns
  EXPECT_FALSE(ops::unaligned_b_is_faster(512, 1024, 1024));  // oneDNN copies B there anyway
}

// ops/matmul_primitive.h row_major_sgemm: C = alpha A^T B + beta C with A's rows a multiple of
// 2 KiB apart (where padded_transposed_a_is_faster holds, A^T is read from a copy with longer
// rows): A as wide as its stride, a narrower A inside rows of 512 floats, and an A too long to
// copy (more than 16 MiB with the longer rows: read as given), against float64; A is left as it
// was, beta 0 ignores what C held (NaN included).
TEST(GemmTest, RowMajorSgemmWithATransposedAOf2KiBRows) {
  struct Case {
    int64_t M, N, K, lda;
  };
  std::mt19937 rng(61);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (const Case& cs :
       {Case{512, 64, 37, 512}, Case{40, 96, 21, 512}, Case{1024, 8, 5, 1024}, Case{512, 8, 8000, 512}}) {
    const auto [M, N, K, lda] = cs;
    std::vector<float> a(static_cast<size_t>(K * lda)), b(static_cast<size_t>(K * N)), c0(static_cast<size_t>(M * N));
    for (float& v : a) v = dist(rng);
    for (float& v : b) v = dist(rng);
    for (float& v : c0) v = dist(rng);
    const std::vector<float> a_before = a;
    for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.5f, 2.0f}}) {
      SCOPED_TRACE("M " + std::to_string(M) + ", lda " + std::to_string(lda) + ", alpha " + std::to_string(alpha) +
                   ", beta " + std::to_string(beta));
      std::vector<float> c = c0;
      if (beta == 0.0f) c[0] = std::numeric_limits<float>::quiet_NaN();
      ASSERT_EQ(ops::row_major_sgemm('T', 'N', M, N, K, alpha, a.data(), lda, b.data(), N, beta, c.data(), N),
                dnnl_success);
      for (int64_t m = 0; m < M; ++m) {
        for (int64_t n = 0; n < N; ++n) {
          double sum = 0;
          for (int64_t k = 0; k < K; ++k) sum += double(a[static_cast<size_t>(k * lda + m)]) * b[static_cast<size_t>(k * N + n)];
          const double want = alpha * sum + beta * double(c0[static_cast<size_t>(m * N + n)]);
          ASSERT_NEAR(c[static_cast<size_t>(m * N + n)], want, 1e-4 * (1 + std::abs(want))) << m << ", " << n;
        }
      }
      ASSERT_EQ(a, a_before);
    }
  }
  // The rule: never with AVX-512; without it at the shapes measured faster, not at the others.
  const bool avx512 = ops::dnnl_util::has_isa(dnnl::cpu_isa::avx512_core);
  EXPECT_EQ(ops::padded_transposed_a_is_faster(512, 512, 512), !avx512);  // the MLP's second dW
  EXPECT_EQ(ops::padded_transposed_a_is_faster(2048, 128, 2048), !avx512);
  EXPECT_EQ(ops::padded_transposed_a_is_faster(40, 96, 512), !avx512);
  EXPECT_FALSE(ops::padded_transposed_a_is_faster(512, 784, 512));     // oneDNN copies A there anyway
  EXPECT_FALSE(ops::padded_transposed_a_is_faster(1024, 3136, 1024));
  EXPECT_FALSE(ops::padded_transposed_a_is_faster(256, 256, 256));     // a row stride of 1 KiB
  EXPECT_FALSE(ops::padded_transposed_a_is_faster(16, 64, 512));       // few rows
}

TEST(GemmTest, IntegersAndHalf) {
  const Tensor a = Tensor::from_vector<int32_t>({2, 2}, {1, 2, 3, 4});
  const Tensor c = Tensor::from_vector<int32_t>({2}, {10, 20});
  expect_close(run1("Gemm", {a, a, c}), Tensor::from_vector<int32_t>({2, 2}, {17, 30, 25, 42}));
  const Tensor l = Tensor::from_vector<int64_t>({1, 2}, {1, 2});
  const Tensor r = Tensor::from_vector<int64_t>({2, 1}, {3, 4});
  expect_close(run1("Gemm", {l, r}, {attr("alpha", 2.0f)}),
               Tensor::from_vector<int64_t>({1, 1}, {22}));
  const Tensor h = f32({2, 2}, {1, 2, 3, 4}).cast(DataType::Float16);
  expect_close(run1("Gemm", {h, h}, {attr("transA", int64_t{1})}).cast(DataType::Float32),
               f32({2, 2}, {10, 14, 14, 20}));
}

TEST(GemmTest, ZeroInnerDim) {
  const Tensor a = Tensor::zeros(DataType::Float32, {2, 0}),
               b = Tensor::zeros(DataType::Float32, {0, 3});
  expect_close(run1("Gemm", {a, b, f32({3}, {1, 2, 3})}, {attr("beta", 2.0f)}),
               f32({2, 3}, {2, 4, 6, 2, 4, 6}));
}

TEST(GemmTest, Errors) {
  EXPECT_THROW(run1("Gemm", {random({2, 3, 1}, 1), random({3, 2}, 2)}), Error);
  EXPECT_THROW(run1("Gemm", {random({2, 3}, 1), random({2, 2}, 2)}), Error);
  EXPECT_THROW(run1("Gemm", {random({2, 3}, 1), random({3, 2}, 2), random({3, 2}, 3)}), Error);
  EXPECT_THROW(run1("Gemm", {random({2, 3}, 1), random({3, 2}, 2), random({2, 2, 1}, 3)}), Error);
  EXPECT_THROW(
      run1("Gemm", {random({2, 3}, 1), random({3, 2}, 2), random({2}, 3).cast(DataType::Float32)}),
      Error);
}

// ---------------------------------------------------------------------------------------------
// Conv

struct Conv2dCase {
  int64_t n, c, m, group, h, w, kh, kw;
  Ints strides, pads, dilations;  // pads: top, left, bottom, right
  bool bias;
};

Attrs conv_attrs(const Conv2dCase& k) {
  return {attr("strides", k.strides), attr("pads", k.pads), attr("dilations", k.dilations),
          attr("group", k.group)};
}

// Conv straight from the ONNX doc: y[n,m,oh,ow] = B[m] + sum over the group's input channels and
// the kernel of x[n, c, oh*s - pad + a*d, ...] * w[m, c', a, b], padding reading zero.
Tensor naive_conv2d(const Conv2dCase& k, const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t oh =
      (k.h + k.pads[0] + k.pads[2] - ((k.kh - 1) * k.dilations[0] + 1)) / k.strides[0] + 1;
  const int64_t ow =
      (k.w + k.pads[1] + k.pads[3] - ((k.kw - 1) * k.dilations[1] + 1)) / k.strides[1] + 1;
  const int64_t cg = k.c / k.group, mg = k.m / k.group;
  const auto xv = x.values<double>(), wv = w.values<double>();
  std::vector<double> y;
  for (int64_t n = 0; n < k.n; ++n) {
    for (int64_t m = 0; m < k.m; ++m) {
      for (int64_t i = 0; i < oh; ++i) {
        for (int64_t j = 0; j < ow; ++j) {
          double s = b.defined() ? b.values<double>()[static_cast<size_t>(m)] : 0.0;
          for (int64_t ci = 0; ci < cg; ++ci) {
            const int64_t c = m / mg * cg + ci;
            for (int64_t a = 0; a < k.kh; ++a) {
              for (int64_t e = 0; e < k.kw; ++e) {
                const int64_t ih = i * k.strides[0] - k.pads[0] + a * k.dilations[0];
                const int64_t iw = j * k.strides[1] - k.pads[1] + e * k.dilations[1];
                if (ih < 0 || ih >= k.h || iw < 0 || iw >= k.w) continue;
                s += xv[static_cast<size_t>(((n * k.c + c) * k.h + ih) * k.w + iw)] *
                     wv[static_cast<size_t>(((m * cg + ci) * k.kh + a) * k.kw + e)];
              }
            }
          }
          y.push_back(s);
        }
      }
    }
  }
  return f64({k.n, k.m, oh, ow}, y);
}

TEST(ConvTest, HandComputedPadded) {
  const Tensor x = f32({1, 1, 2, 2}, {1, 2, 3, 4});
  const Tensor w = f32({1, 1, 2, 2}, {1, 0, 0, 1});
  expect_close(run1("Conv", {x, w}, {attr("pads", Ints{1, 1, 1, 1})}),
               f32({1, 1, 3, 3}, {1, 2, 0, 3, 5, 2, 0, 3, 4}));
}

TEST(ConvTest, Random2dMatchesDirectLoops) {
  const std::vector<Conv2dCase> cases = {
      {1, 3, 4, 1, 7, 6, 3, 3, {1, 1}, {0, 0, 0, 0}, {1, 1}, true},
      {2, 4, 6, 2, 9, 8, 3, 2, {2, 1}, {1, 0, 2, 1}, {1, 2}, true},   // groups, asymmetric pads
      {2, 6, 6, 6, 8, 8, 3, 3, {2, 2}, {1, 1, 1, 1}, {1, 1}, false},  // depthwise
      {1, 4, 8, 4, 10, 7, 3, 3, {1, 2}, {2, 2, 2, 2}, {2, 1}, true},  // depthwise x2, dilation
      {3, 5, 2, 1, 6, 11, 1, 4, {3, 2}, {0, 3, 0, 0}, {1, 3}, false},
      {1, 2, 3, 1, 4, 4, 5, 5, {1, 1}, {1, 1, 0, 0}, {1, 1}, true},  // kernel as big as padded
                                                                     // input
  };
  uint32_t seed = 200;
  for (const auto& k : cases) {
    SCOPED_TRACE("case with c " + std::to_string(k.c) + " group " + std::to_string(k.group));
    const Tensor x = random({k.n, k.c, k.h, k.w}, seed++);
    const Tensor w = random({k.m, k.c / k.group, k.kh, k.kw}, seed++);
    const Tensor b = k.bias ? random({k.m}, seed++) : Tensor();
    std::vector<Tensor> in = {x, w};
    if (k.bias) in.push_back(b);
    expect_both_paths("Conv", in, conv_attrs(k), naive_conv2d(k, x, w, b));
  }
}

// Outputs of at most 64 positions (N x output spatial size) run in the layout oneDNN chooses
// (conv.cpp kSmallOutput), larger ones channel-blocked: the small maps a 32x32 ResNet ends
// with (3x3 on 1x1 and 2x2 maps, where most kernel taps read padding; a strided 1x1), with 16+
// and partial channel blocks, on either side of the limit, each against the ONNX definition.
TEST(ConvTest, SmallMapsOnEitherSideOfTheOutputSizeLimit) {
  const std::vector<Conv2dCase> cases = {
      {1, 40, 24, 1, 1, 1, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, false},  // 1 position: the centre tap, blocked
      {1, 20, 36, 1, 2, 2, 3, 3, {2, 2}, {1, 1, 1, 1}, {1, 1}, true},   // 1 position, 4 taps
      {3, 20, 19, 1, 2, 2, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, true},   // 12 positions
      {1, 17, 33, 1, 4, 4, 1, 1, {2, 2}, {0, 0, 0, 0}, {1, 1}, false},  // strided 1x1: channel-blocked
      {1, 16, 16, 1, 8, 8, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, false},  // 64 positions: oneDNN's layout
      {1, 16, 16, 1, 9, 8, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, false},  // 72: channel-blocked
      {2, 24, 20, 1, 6, 6, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, true},   // 72: channel-blocked
  };
  uint32_t seed = 300;
  for (const auto& k : cases) {
    SCOPED_TRACE("case n " + std::to_string(k.n) + " c " + std::to_string(k.c) + " h " + std::to_string(k.h));
    const Tensor x = random({k.n, k.c, k.h, k.w}, seed++);
    const Tensor w = random({k.m, k.c, k.kh, k.kw}, seed++);
    const Tensor b = k.bias ? random({k.m}, seed++) : Tensor();
    std::vector<Tensor> in = {x, w};
    if (k.bias) in.push_back(b);
    expect_both_paths("Conv", in, conv_attrs(k), naive_conv2d(k, x, w, b));
  }
}

TEST(ConvTest, OneAndThreeSpatialDimsFloat32MatchesFloat64) {
  struct Case {
    Shape x, w;
    Attrs attrs;
  };
  const std::vector<Case> cases = {
      {{2, 3, 17}, {4, 3, 3}, {attr("strides", Ints{2}), attr("pads", Ints{1, 2})}},
      {{1, 4, 9},
       {4, 1, 2},
       {attr("group", int64_t{4}), attr("dilations", Ints{3}),
        attr("auto_pad", std::string("SAME_UPPER"))}},
      {{1, 2, 5, 6, 4},
       {3, 2, 2, 3, 2},
       {attr("pads", Ints{1, 0, 1, 0, 2, 1}), attr("strides", Ints{1, 2, 1})}},
      {{2, 4, 4, 5, 6},
       {4, 2, 3, 1, 2},
       {attr("group", int64_t{2}), attr("dilations", Ints{1, 2, 2}),
        attr("auto_pad", std::string("SAME_LOWER"))}},
  };
  uint32_t seed = 300;
  for (const auto& c : cases) {
    SCOPED_TRACE("X " + c.x.to_string() + " W " + c.w.to_string());
    const Tensor x = random(c.x, seed++), w = random(c.w, seed++), b = random({c.w[0]}, seed++);
    const Tensor want = run1("Conv", {x, w, b}, c.attrs);
    expect_both_paths("Conv", {x, w, b}, c.attrs, want);
  }
}

// ConvGeometry of one spatial dim: in, kernel, stride, dilation, pads; out by the ONNX formula.
ops::ConvGeometry geometry_1d(int64_t in, int64_t k, int64_t s, int64_t d, int64_t p0, int64_t p1) {
  ops::ConvGeometry g;
  g.N = 1;
  g.C = g.M = 2;
  g.in = {in};
  g.kernel = {k};
  g.stride = {s};
  g.dilation = {d};
  g.pad_begin = {p0};
  g.pad_end = {p1};
  g.out = {(in + p0 + p1 - ((k - 1) * d + 1)) / s + 1};
  return g;
}

// Which taps crop_unreached_taps keeps, counted by hand from o * s - p0 + t * d in [0, in).
TEST(ConvTest, TapsThatReadOnlyPaddingAreFoundByHand) {
  struct Case {
    const char* name;
    ops::ConvGeometry g;
    bool crops;
    int64_t first, kernel, pad_begin, pad_end;
  };
  const Case cases[] = {
      {"3 taps, pads 1, a 1-wide map: the centre", geometry_1d(1, 3, 1, 1, 1, 1), true, 1, 1, 0, 0},
      {"stride 2 on a 2-wide map: o = 0 reads taps 1 and 2", geometry_1d(2, 3, 2, 1, 1, 1), true, 1, 2, 0, 1},
      {"stride 1 on a 2-wide map: every tap", geometry_1d(2, 3, 1, 1, 1, 1), false, 0, 0, 0, 0},
      {"stride 3: taps 1 and 4, 2 and 3 between them kept", geometry_1d(1, 5, 3, 1, 4, 4), true, 1, 4, 3, 4},
      {"dilation 2: the centre", geometry_1d(1, 3, 1, 2, 2, 2), true, 1, 1, 0, 0},
      {"end taps beyond the map", geometry_1d(3, 5, 1, 1, 0, 2), true, 0, 3, 0, 0},
      {"dilation 3 would need pad_begin -1", geometry_1d(2, 2, 1, 3, 2, 0), false, 0, 0, 0, 0},
      {"no tap reaches the map", geometry_1d(1, 1, 10, 1, 5, 5), false, 0, 0, 0, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::optional<ops::TapCrop> crop = ops::crop_unreached_taps(c.g);
    ASSERT_EQ(crop.has_value(), c.crops);
    if (!crop) continue;
    EXPECT_EQ(crop->first, Ints{c.first});
    EXPECT_EQ(crop->geometry.kernel, Ints{c.kernel});
    EXPECT_EQ(crop->geometry.pad_begin, Ints{c.pad_begin});
    EXPECT_EQ(crop->geometry.pad_end, Ints{c.pad_end});
    EXPECT_EQ(crop->geometry.out, c.g.out);
    // The cropped convolution has the same output length by the ONNX formula.
    const ops::ConvGeometry& k = crop->geometry;
    EXPECT_EQ((k.in[0] + k.pad_begin[0] + k.pad_end[0] - ((k.kernel[0] - 1) * k.dilation[0] + 1)) / k.stride[0] + 1,
              c.g.out[0]);
  }
  // gather_taps / scatter_taps on a 2-D kernel: [2, 2, 3, 3] cropped to its centre row's right
  // two taps and back.
  ops::ConvGeometry g2;
  g2.N = 1;
  g2.C = g2.M = 2;
  g2.in = g2.out = g2.kernel = {3, 3};
  g2.stride = g2.dilation = {1, 1};
  g2.pad_begin = g2.pad_end = {1, 1};
  ops::TapCrop crop{g2, {1, 1}};
  crop.geometry.kernel = {1, 2};
  std::vector<float> w(36), back(36, -1.0f);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i);
  const Tensor cropped = ops::gather_taps(g2, crop, w.data());
  ASSERT_EQ(cropped.shape(), Shape({2, 2, 1, 2}));
  const std::vector<float> wc(cropped.data<float>(), cropped.data<float>() + cropped.numel());
  EXPECT_EQ(wc, (std::vector<float>{4, 5, 13, 14, 22, 23, 31, 32}));
  ops::scatter_taps(g2, crop, wc.data(), back.data());
  for (size_t i = 0; i < back.size(); ++i) EXPECT_EQ(back[i], i % 9 == 4 || i % 9 == 5 ? w[i] : 0.0f) << i;
}

// Convolutions whose outer taps read only padding run (fed weights, float32) over the other
// taps (conv_geometry.h crop_unreached_taps); each against the float64 reference, which
// convolves every tap.
TEST(ConvTest, TapsThatReadOnlyPaddingAreCroppedAway) {
  struct Case {
    Shape x, w;
    Attrs attrs;
  };
  const std::vector<Case> cases = {
      {{3, 20, 1, 1}, {24, 20, 3, 3}, {attr("pads", Ints{1, 1, 1, 1})}},
      {{2, 17, 2, 2}, {33, 17, 3, 3}, {attr("pads", Ints{1, 1, 1, 1}), attr("strides", Ints{2, 2})}},
      {{2, 6, 1, 3}, {4, 3, 3, 3}, {attr("pads", Ints{1, 1, 1, 1}), attr("group", int64_t{2})}},
      {{1, 4, 1, 2}, {5, 4, 5, 5}, {attr("pads", Ints{4, 2, 4, 2}), attr("strides", Ints{3, 1})}},
      {{2, 3, 1}, {4, 3, 3}, {attr("pads", Ints{2, 2}), attr("dilations", Ints{2})}},
      {{1, 2, 1, 2, 3}, {3, 2, 3, 3, 3}, {attr("pads", Ints{1, 1, 1, 1, 1, 1})}},
      {{2, 4, 2, 2}, {8, 4, 2, 2}, {attr("pads", Ints{2, 0, 0, 1}), attr("dilations", Ints{3, 1})}},
  };
  uint32_t seed = 700;
  for (const auto& c : cases) {
    SCOPED_TRACE("X " + c.x.to_string() + " W " + c.w.to_string());
    const Tensor x = random(c.x, seed++), w = random(c.w, seed++), b = random({c.w[0]}, seed++);
    expect_both_paths("Conv", {x, w, b}, c.attrs, run1("Conv", {x, w, b}, c.attrs));
    expect_both_paths("Conv", {x, w}, c.attrs, run1("Conv", {x, w}, c.attrs));
  }
}

TEST(ConvTest, AutoPadSplitsPadding) {
  const Tensor x = f32({1, 1, 4}, {1, 2, 3, 4});
  const Tensor w = f32({1, 1, 2}, {1, 1});
  const auto run = [&](const char* mode) {
    return run1("Conv", {x, w}, {attr("auto_pad", std::string(mode))});
  };
  expect_close(run("SAME_UPPER"), f32({1, 1, 4}, {3, 5, 7, 4}));
  expect_close(run("SAME_LOWER"), f32({1, 1, 4}, {1, 3, 5, 7}));
  expect_close(run("VALID"), f32({1, 1, 3}, {3, 5, 7}));
  expect_close(
      run1("Conv", {x, w}, {attr("auto_pad", std::string("SAME_UPPER")), attr("strides", Ints{3})}),
      f32({1, 1, 2}, {3, 4}));  // out = ceil(4 / 3) = 2, total pad (2-1)*3+2-4 = 1 at the end
}

TEST(ConvTest, FourSpatialDimsUseTheReference) {
  const Tensor x = Tensor::from_vector<float>({1, 1, 3, 3, 3, 3}, std::vector<float>(81, 1.0f));
  const Tensor w = Tensor::from_vector<float>({2, 1, 2, 2, 2, 2}, std::vector<float>(32, 1.0f));
  const Tensor b = f32({2}, {0, 1});
  const Tensor y = run1("Conv", {x, w, b});
  ASSERT_EQ(y.shape(), Shape({1, 2, 2, 2, 2, 2}));
  for (int64_t i = 0; i < 32; ++i)
    EXPECT_EQ(y.values<float>()[static_cast<size_t>(i)], i < 16 ? 16.0f : 17.0f);
}

TEST(ConvTest, HalfAndKernelShapeAttribute) {
  const Tensor x = f32({1, 1, 2, 2}, {1, 2, 3, 4});
  const Tensor w = f32({1, 1, 1, 1}, {0.5f});
  const Tensor y = run1("Conv", {x.cast(DataType::Float16), w.cast(DataType::Float16)},
                        {attr("kernel_shape", Ints{1, 1})});
  EXPECT_EQ(y.dtype(), DataType::Float16);
  expect_close(y.cast(DataType::Float32), f32({1, 1, 2, 2}, {0.5f, 1, 1.5f, 2}));
}

TEST(ConvTest, EmptyBatchAndNoInputChannels) {
  EXPECT_EQ(run1("Conv", {random({0, 2, 3, 3}, 1), random({4, 2, 2, 2}, 2)}).shape(),
            Shape({0, 4, 2, 2}));
  const Tensor y = run1("Conv", {Tensor::zeros(DataType::Float32, {1, 0, 2}),
                                 Tensor::zeros(DataType::Float32, {2, 0, 1}), f32({2}, {3, 4})});
  expect_close(y, f32({1, 2, 2}, {3, 3, 4, 4}));
}

TEST(ConvTest, Errors) {
  const Tensor x = random({1, 4, 5, 5}, 1);
  EXPECT_THROW(run1("Conv", {x, random({2, 3, 3, 3}, 2)}), Error);  // channel mismatch
  EXPECT_THROW(run1("Conv", {x, random({3, 2, 3, 3}, 2)}, {attr("group", int64_t{2})}),
               Error);                                                        // 3 % 2
  EXPECT_THROW(run1("Conv", {x, random({2, 4, 3}, 2)}), Error);               // W rank
  EXPECT_THROW(run1("Conv", {random({4, 5}, 1), random({2, 4}, 2)}), Error);  // X rank
  EXPECT_THROW(run1("Conv", {x, random({2, 4, 6, 3}, 2)}), Error);            // kernel > input
  EXPECT_THROW(run1("Conv", {x, random({2, 4, 3, 3}, 2)}, {attr("dilations", Ints{3, 1})}),
               Error);  // dilated 7 > 5
  EXPECT_NO_THROW(run1("Conv", {x, random({2, 4, 6, 3}, 2)}, {attr("pads", Ints{1, 0, 0, 0})}));
  EXPECT_THROW(run1("Conv", {x, random({2, 4, 3, 3}, 2)}, {attr("kernel_shape", Ints{2, 2})}),
               Error);
  EXPECT_THROW(run1("Conv", {x, random({2, 4, 3, 3}, 2), random({3}, 3)}), Error);  // bias size
  EXPECT_THROW(run1("Conv", {x, random({2, 4, 3, 3}, 2)}, {attr("auto_pad", std::string("SAME"))}),
               Error);
  EXPECT_THROW(run1("Conv", {x, random({2, 4, 3, 3}, 2)}, {attr("strides", Ints{0, 1})}), Error);
  EXPECT_THROW(run1("Conv", {x, random({2, 4, 3, 3}, 2)}, {attr("pads", Ints{1, 1})}), Error);
  EXPECT_THROW(run1("Conv", {x, random({2, 4, 3, 3}, 2).cast(DataType::Float32)}), Error);  // dtype
}

// ---------------------------------------------------------------------------------------------
// ConvTranspose

struct Deconv2dCase {
  int64_t n, c, m, group, h, w, kh, kw;
  Ints strides, pads, dilations, output_padding;
  bool bias;
};

// ConvTranspose straight from the ONNX doc: every x[n, c, i, j] adds x * w[c, m', a, b] to
// y[n, m, i*s + a*d - pad_begin, ...] for the output channels m of c's group.
Tensor naive_deconv2d(const Deconv2dCase& k, const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t oh = k.strides[0] * (k.h - 1) + k.output_padding[0] + (k.kh - 1) * k.dilations[0] +
                     1 - k.pads[0] - k.pads[2];
  const int64_t ow = k.strides[1] * (k.w - 1) + k.output_padding[1] + (k.kw - 1) * k.dilations[1] +
                     1 - k.pads[1] - k.pads[3];
  const int64_t cg = k.c / k.group, mg = k.m / k.group;
  std::vector<double> y(static_cast<size_t>(k.n * k.m * oh * ow));
  for (int64_t n = 0; n < k.n; ++n) {
    for (int64_t m = 0; m < k.m; ++m) {
      for (int64_t o = 0; o < oh * ow; ++o)
        y[static_cast<size_t>((n * k.m + m) * oh * ow + o)] =
            b.defined() ? b.values<double>()[static_cast<size_t>(m)] : 0;
    }
  }
  const auto xv = x.values<double>(), wv = w.values<double>();
  for (int64_t n = 0; n < k.n; ++n) {
    for (int64_t c = 0; c < k.c; ++c) {
      for (int64_t i = 0; i < k.h; ++i) {
        for (int64_t j = 0; j < k.w; ++j) {
          const double xval = xv[static_cast<size_t>(((n * k.c + c) * k.h + i) * k.w + j)];
          for (int64_t mi = 0; mi < mg; ++mi) {
            const int64_t m = c / cg * mg + mi;
            for (int64_t a = 0; a < k.kh; ++a) {
              for (int64_t e = 0; e < k.kw; ++e) {
                const int64_t r = i * k.strides[0] + a * k.dilations[0] - k.pads[0];
                const int64_t s = j * k.strides[1] + e * k.dilations[1] - k.pads[1];
                if (r < 0 || r >= oh || s < 0 || s >= ow) continue;
                y[static_cast<size_t>(((n * k.m + m) * oh + r) * ow + s)] +=
                    xval * wv[static_cast<size_t>(((c * mg + mi) * k.kh + a) * k.kw + e)];
              }
            }
          }
        }
      }
    }
  }
  return f64({k.n, k.m, oh, ow}, y);
}

TEST(ConvTransposeTest, Random2dMatchesDirectLoops) {
  const std::vector<Deconv2dCase> cases = {
      {1, 3, 2, 1, 4, 5, 3, 3, {1, 1}, {0, 0, 0, 0}, {1, 1}, {0, 0}, true},
      {2, 4, 6, 2, 3, 4, 3, 2, {2, 3}, {1, 0, 1, 1}, {1, 2}, {1, 2}, true},   // groups,
                                                                              // output_padding
      {1, 6, 6, 6, 5, 5, 3, 3, {2, 2}, {1, 1, 1, 1}, {1, 1}, {1, 1}, false},  // depthwise
      {2, 2, 3, 1, 3, 3, 2, 3, {3, 2}, {0, 1, 0, 0}, {2, 1}, {2, 1}, true},  // output_padding > pad
                                                                             // end
      {1, 4, 4, 2, 2, 6, 4, 1, {1, 2}, {2, 0, 1, 0}, {1, 1}, {0, 1}, false},
  };
  uint32_t seed = 400;
  for (const auto& k : cases) {
    SCOPED_TRACE("case with c " + std::to_string(k.c) + " group " + std::to_string(k.group));
    const Tensor x = random({k.n, k.c, k.h, k.w}, seed++);
    const Tensor w = random({k.c, k.m / k.group, k.kh, k.kw}, seed++);
    const Tensor b = k.bias ? random({k.m}, seed++) : Tensor();
    std::vector<Tensor> in = {x, w};
    if (k.bias) in.push_back(b);
    const Attrs attrs = {attr("strides", k.strides), attr("pads", k.pads),
                         attr("dilations", k.dilations), attr("group", k.group),
                         attr("output_padding", k.output_padding)};
    expect_both_paths("ConvTranspose", in, attrs, naive_deconv2d(k, x, w, b));
  }
}

TEST(ConvTransposeTest, OutputShapeAndAutoPadSetThePads) {
  // Full output of x = [1, 2, 3], kernel [1, 1], stride 2: [1, 1, 2, 2, 3, 3].
  const Tensor x = f64({1, 1, 3}, {1, 2, 3});
  const Tensor w = f64({1, 1, 2}, {1, 1});
  const Tensor b = f64({1}, {10});
  const Attrs stride = {attr("strides", Ints{2})};
  auto with = [&](Attrs more) {
    Attrs a = stride;
    for (auto& m : more) a.push_back(m);
    return a;
  };
  // total padding 1: NOTSET puts the odd one at the beginning, SAME_UPPER at the end.
  expect_both_paths("ConvTranspose", {x, w}, with({attr("output_shape", Ints{5})}),
                    f64({1, 1, 5}, {1, 2, 2, 3, 3}));
  expect_both_paths(
      "ConvTranspose", {x, w},
      with({attr("output_shape", Ints{5}), attr("auto_pad", std::string("SAME_UPPER"))}),
      f64({1, 1, 5}, {1, 1, 2, 2, 3}));
  expect_both_paths("ConvTranspose", {x, w}, with({attr("auto_pad", std::string("SAME_LOWER"))}),
                    f64({1, 1, 6}, {1, 1, 2, 2, 3, 3}));
  // Larger than the full output: the extra element sees only the bias. Full [N, C, W] form too.
  expect_both_paths("ConvTranspose", {x, w, b}, with({attr("output_shape", Ints{1, 1, 7})}),
                    f64({1, 1, 7}, {11, 11, 12, 12, 13, 13, 10}));
  expect_both_paths("ConvTranspose", {x, w},
                    with({attr("output_padding", Ints{1}), attr("pads", Ints{0, 2})}),
                    f64({1, 1, 5}, {1, 1, 2, 2, 3}));
  // Every output beyond the full output: only the bias.
  expect_both_paths("ConvTranspose", {x, w, b},
                    with({attr("output_padding", Ints{3}), attr("pads", Ints{7, 0})}),
                    f64({1, 1, 2}, {10, 10}));
}

TEST(ConvTransposeTest, OneAndThreeSpatialDimsFloat32MatchesFloat64) {
  struct Case {
    Shape x, w;
    Attrs attrs;
  };
  const std::vector<Case> cases = {
      {{2, 3, 7},
       {3, 2, 3},
       {attr("strides", Ints{3}), attr("pads", Ints{1, 0}), attr("output_padding", Ints{2})}},
      {{1, 4, 5}, {4, 1, 2}, {attr("group", int64_t{2}), attr("dilations", Ints{2})}},
      {{1, 2, 3, 2, 4},
       {2, 3, 2, 3, 2},
       {attr("strides", Ints{2, 1, 2}), attr("pads", Ints{1, 0, 0, 0, 1, 1})}},
      {{2, 4, 2, 3, 3},
       {4, 1, 3, 2, 2},
       {attr("group", int64_t{4}), attr("auto_pad", std::string("SAME_UPPER")),
        attr("strides", Ints{2, 2, 1})}},
  };
  uint32_t seed = 500;
  for (const auto& c : cases) {
    SCOPED_TRACE("X " + c.x.to_string() + " W " + c.w.to_string());
    const Tensor x = random(c.x, seed++), w = random(c.w, seed++);
    int64_t group = 1;
    for (const auto& a : c.attrs) {
      if (a.name() == "group") group = a.i();
    }
    const Tensor b = random({c.w[1] * group}, seed++);
    const Tensor want = run1("ConvTranspose", {x, w, b}, c.attrs);
    expect_both_paths("ConvTranspose", {x, w, b}, c.attrs, want);
  }
}

TEST(ConvTransposeTest, Errors) {
  const Tensor x = random({1, 4, 3, 3}, 1);
  EXPECT_THROW(run1("ConvTranspose", {x, random({3, 2, 2, 2}, 2)}), Error);  // W[0] != C
  EXPECT_THROW(run1("ConvTranspose", {x, random({4, 2, 2, 2}, 2)}, {attr("group", int64_t{3})}),
               Error);  // 4 % 3
  EXPECT_THROW(run1("ConvTranspose", {x, random({4, 2, 2}, 2)}), Error);
  EXPECT_THROW(run1("ConvTranspose", {x, random({4, 2, 2, 2}, 2)}, {attr("output_shape", Ints{5})}),
               Error);
  EXPECT_THROW(
      run1("ConvTranspose", {x, random({4, 2, 2, 2}, 2)}, {attr("pads", Ints{3, 3, 3, 3})}), Error);
  EXPECT_THROW(
      run1("ConvTranspose", {x, random({4, 2, 2, 2}, 2)}, {attr("output_padding", Ints{1})}),
      Error);
}

// ---------------------------------------------------------------------------------------------
// Pools

TEST(MaxPoolTest, IndicesInBothStorageOrders) {
  std::vector<float> v = {1, 9, 3, 4, 5, 6, 12, 8, 2, 10, 11, 7};
  for (int i = 0; i < 12; ++i) v.push_back(v[static_cast<size_t>(i)] + 100);  // second channel
  const Tensor x = f32({1, 2, 3, 4}, v);
  const NodeSpec row{"MaxPool", "", 12, {attr("kernel_shape", Ints{2, 2})}, 2};
  const auto r = run_node(row, {x});
  expect_close(r[0], f32({1, 2, 2, 3}, {9, 12, 12, 10, 12, 12, 109, 112, 112, 110, 112, 112}));
  expect_close(
      r[1], Tensor::from_vector<int64_t>({1, 2, 2, 3}, {1, 6, 6, 9, 6, 6, 13, 18, 18, 21, 18, 18}));
  NodeSpec column = row;
  column.attributes.push_back(attr("storage_order", int64_t{1}));
  // Column-major spatial offset of (h, w) is h + w * 3.
  expect_close(
      run_node(column, {x})[1],
      Tensor::from_vector<int64_t>({1, 2, 2, 3}, {3, 7, 7, 5, 7, 7, 15, 19, 19, 17, 19, 19}));
}

TEST(MaxPoolTest, DilationPaddingAndIndicesMatchTorch) {
  std::vector<float> v;
  for (int i = 0; i < 60; ++i) v.push_back(static_cast<float>(i * 7 % 11));
  const Tensor x = f32({1, 2, 5, 6}, v);
  const NodeSpec spec{"MaxPool",
                      "",
                      12,
                      {attr("kernel_shape", Ints{2, 3}), attr("strides", Ints{2, 1}),
                       attr("pads", Ints{1, 1, 1, 1}), attr("dilations", Ints{2, 2})},
                      2};
  const auto r = run_node(spec, {x});
  // torch.nn.functional.max_pool2d(x, (2,3), (2,1), padding=(1,1), dilation=(2,2),
  // return_indices=True)
  expect_close(r[0], f32({1, 2, 3, 4}, {8, 9,  8, 4, 8, 9,  8, 8, 4, 8, 7, 8,
                                        9, 10, 9, 5, 9, 10, 9, 9, 5, 9, 8, 9}));
  std::vector<int64_t> idx = {9, 6, 9, 10, 9, 6, 9, 20, 21, 20, 23, 20};
  for (int i = 0; i < 12; ++i) idx.push_back(idx[static_cast<size_t>(i)] + 30);  // channel offset
  expect_close(r[1], Tensor::from_vector<int64_t>({1, 2, 3, 4}, idx));
}

TEST(MaxPoolTest, CeilModeDropsAWindowStartingInThePadding) {
  const Tensor x = f32({1, 1, 5}, {1, 2, 3, 4, 5});
  const Attrs attrs = {attr("kernel_shape", Ints{2}), attr("strides", Ints{2}),
                       attr("pads", Ints{1, 1}), attr("ceil_mode", int64_t{1})};
  expect_close(run1("MaxPool", {x}, attrs, 12), f32({1, 1, 3}, {1, 3, 5}));  // as torch
  const Attrs floor = {attr("kernel_shape", Ints{2}), attr("strides", Ints{2}),
                       attr("pads", Ints{1, 1})};
  expect_close(run1("MaxPool", {x}, floor, 12), f32({1, 1, 3}, {1, 3, 5}));
  const Tensor six = f32({1, 1, 6}, {1, 2, 3, 4, 5, 6});
  expect_close(run1("MaxPool", {six}, attrs, 12), f32({1, 1, 4}, {1, 3, 5, 6}));
}

TEST(MaxPoolTest, IntegersHalfAndNaN) {
  const Tensor i8 = Tensor::from_vector<int8_t>({1, 1, 4}, {-5, -3, -128, 7});
  expect_close(run1("MaxPool", {i8}, {attr("kernel_shape", Ints{2})}, 12),
               Tensor::from_vector<int8_t>({1, 1, 3}, {-3, -3, 7}));
  const Tensor u8 = Tensor::from_vector<uint8_t>({1, 1, 3}, {0, 255, 1});
  expect_close(run1("MaxPool", {u8}, {attr("kernel_shape", Ints{2}), attr("pads", Ints{1, 0})}, 12),
               Tensor::from_vector<uint8_t>({1, 1, 3}, {0, 255, 255}));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor x = f32({1, 1, 4}, {1, nan, 2, 3});
  expect_close(run1("MaxPool", {x}, {attr("kernel_shape", Ints{2})}),
               f32({1, 1, 3}, {nan, nan, 3}));
  const Tensor h = x.cast(DataType::Float16);
  expect_close(run1("MaxPool", {h}, {attr("kernel_shape", Ints{2})}).cast(DataType::Float32),
               f32({1, 1, 3}, {nan, nan, 3}));
}

// MaxPool without Indices takes the maximum over a window's input rows first, then along the
// last dim (pool.cpp max_pool); with Indices it walks each window tap by tap. Both must give the
// same Y: 2-D and 3-D windows with strides, pads, dilations and ceil_mode, NaNs, in float32,
// float16 and int8.
TEST(MaxPoolTest, RowsFirstAgreesWithTheIndicesPath) {
  struct Case {
    Shape x;
    Attrs attrs;
  };
  const std::vector<Case> cases = {
      {{2, 3, 16, 16}, {attr("kernel_shape", Ints{3, 3}), attr("strides", Ints{2, 2}), attr("pads", Ints{1, 1, 1, 1})}},
      {{1, 2, 7, 9}, {attr("kernel_shape", Ints{3, 2}), attr("strides", Ints{2, 3}), attr("pads", Ints{1, 0, 2, 1}),
                      attr("ceil_mode", int64_t{1})}},
      {{1, 2, 9, 8}, {attr("kernel_shape", Ints{2, 3}), attr("dilations", Ints{3, 2}), attr("pads", Ints{2, 1, 2, 2})}},
      {{1, 1, 5, 6, 7}, {attr("kernel_shape", Ints{2, 3, 2}), attr("strides", Ints{1, 2, 2}), attr("pads", Ints{1, 1, 0, 0, 1, 1})}},
      {{1, 3, 1, 9}, {attr("kernel_shape", Ints{1, 3}), attr("strides", Ints{1, 2})}},
  };
  uint32_t seed = 900;
  for (const Case& c : cases) {
    SCOPED_TRACE("X " + c.x.to_string());
    Tensor x = random(c.x, seed++).cast(DataType::Float32);
    x.data<float>()[7] = std::numeric_limits<float>::quiet_NaN();
    for (const DataType t : {DataType::Float32, DataType::Float16, DataType::Int8}) {
      SCOPED_TRACE(dtype_name(t));
      const Tensor xt = t == DataType::Int8 ? Tensor::from_vector<int8_t>(c.x, [&] {
        std::vector<int8_t> v;
        for (int64_t i = 0; i < x.numel(); ++i) v.push_back(static_cast<int8_t>(i * 37 % 251 - 125));
        return v;
      }())
                                            : x.cast(t);
      const Tensor alone = run_node(NodeSpec{"MaxPool", "", 12, c.attrs, 1}, {xt})[0];
      const Tensor with_indices = run_node(NodeSpec{"MaxPool", "", 12, c.attrs, 2}, {xt})[0];
      ASSERT_EQ(alone.shape(), with_indices.shape());
      const auto a = alone.to_double_vector(), b = with_indices.to_double_vector();
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_TRUE(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i]))) << i << ": " << a[i] << " vs " << b[i];
      }
    }
  }
}

TEST(AveragePoolTest, CeilModeDivisors) {
  const Tensor x = f32({1, 1, 6}, {1, 2, 3, 4, 5, 6});
  Attrs attrs = {attr("kernel_shape", Ints{3}), attr("strides", Ints{2}), attr("pads", Ints{1, 1}),
                 attr("ceil_mode", int64_t{1})};
  // The last window holds 6, one pad and one position past the padded input (torch agrees).
  expect_close(run1("AveragePool", {x}, attrs), f32({1, 1, 4}, {1.5f, 3, 5, 6}));
  attrs.push_back(attr("count_include_pad", int64_t{1}));
  expect_close(run1("AveragePool", {x}, attrs), f32({1, 1, 4}, {1, 3, 5, 3}));
}

TEST(AveragePoolTest, ThreeDimsMatchTorch) {
  std::vector<double> v;
  for (int i = 0; i < 64; ++i) v.push_back(i * 5 % 13);
  const Tensor x = f64({1, 1, 4, 4, 4}, v);
  Attrs attrs = {attr("kernel_shape", Ints{2, 3, 2}), attr("strides", Ints{2, 2, 1}),
                 attr("pads", Ints{1, 1, 0, 1, 1, 0}), attr("ceil_mode", int64_t{1})};
  // torch.nn.functional.avg_pool3d(x, (2,3,2), (2,2,1), padding=(1,1,0), ceil_mode=True,
  // count_include_pad=...)
  const std::vector<double> exclude = {6.0,      7.75, 6.25, 17.0 / 3, 19.0 / 3, 7.0,  4.0,
                                       2.5,      7.5,  5.75, 5.875,    6.0,      6.5,  5.0,
                                       17.0 / 3, 7.0,  5.5,  7.25,     5.5,      7.25, 5.75,
                                       31.0 / 6, 8.0,  6.5,  3.5,      8.5,      7.0};
  const std::vector<double> include = {
      2.0,      31.0 / 12, 25.0 / 12, 17.0 / 6,  19.0 / 6, 3.5,      1.0,   0.625, 1.875,
      23.0 / 6, 47.0 / 12, 4.0,       6.5,       5.0,      17.0 / 3, 3.5,   2.75,  3.625,
      11.0 / 6, 29.0 / 12, 23.0 / 12, 31.0 / 12, 4.0,      3.25,     0.875, 2.125, 1.75};
  expect_close(run1("AveragePool", {x}, attrs), f64({1, 1, 3, 3, 3}, exclude), 1e-12, 1e-12);
  expect_close(run1("AveragePool", {x.cast(DataType::Float32)}, attrs),
               f64({1, 1, 3, 3, 3}, exclude).cast(DataType::Float32));
  attrs.push_back(attr("count_include_pad", int64_t{1}));
  expect_close(run1("AveragePool", {x}, attrs), f64({1, 1, 3, 3, 3}, include), 1e-12, 1e-12);
}

TEST(AveragePoolTest, AutoPadAndOldOpsets) {
  const Tensor x = f32({1, 1, 5}, {1, 2, 3, 4, 5});
  const Attrs k2 = {attr("kernel_shape", Ints{2}), attr("strides", Ints{2})};
  auto with = [&](const char* mode) {
    Attrs a = k2;
    a.push_back(attr("auto_pad", std::string(mode)));
    return a;
  };
  // out = ceil(5 / 2) = 3, total pad 1 at the end (UPPER) or the beginning (LOWER).
  expect_close(run1("AveragePool", {x}, with("SAME_UPPER")), f32({1, 1, 3}, {1.5f, 3.5f, 5}));
  expect_close(run1("AveragePool", {x}, with("SAME_LOWER")), f32({1, 1, 3}, {1, 2.5f, 4.5f}));
  expect_close(run1("AveragePool", {x}, with("VALID")), f32({1, 1, 2}, {1.5f, 3.5f}));
  expect_close(run1("AveragePool", {x}, k2, 1), f32({1, 1, 2}, {1.5f, 3.5f}));
  expect_close(run1("MaxPool", {x}, k2, 1), f32({1, 1, 2}, {2, 4}));
}

// AveragePool-19 documents dilations (window taps i, i + d, ...); AveragePool-22 and MaxPool-22
// add bfloat16, computed in float.
TEST(AveragePoolTest, Opset19DilationsAndOpset22Bfloat16) {
  const Tensor x = f32({1, 1, 8}, {0, 1, 2, 3, 4, 5, 6, 7});
  const Attrs dilated{attr("kernel_shape", Ints{2}), attr("dilations", Ints{2})};
  expect_close(run1("AveragePool", {x}, dilated, 19), f32({1, 1, 6}, {1, 2, 3, 4, 5, 6}));
  // ceil_mode with dilation: the last window starts at 6 and reads 6 only (8 is outside).
  Attrs ceil = dilated;
  ceil.push_back(attr("strides", Ints{3}));
  ceil.push_back(attr("ceil_mode", int64_t{1}));
  expect_close(run1("AveragePool", {x}, ceil, 19), f32({1, 1, 3}, {1, 4, 6}));
  const Tensor b = x.cast(DataType::BFloat16);
  const Tensor avg = run1("AveragePool", {b}, dilated, 22);
  EXPECT_EQ(avg.dtype(), DataType::BFloat16);
  EXPECT_EQ(avg.to_double_vector(), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(run1("MaxPool", {b}, dilated, 22).to_double_vector(), (std::vector<double>{2, 3, 4, 5, 6, 7}));
  EXPECT_THROW(run1("AveragePool", {x.cast(DataType::Int32)}, dilated, 22), Error);  // floating types only
}

TEST(PoolTest, Errors) {
  const Tensor x = random({1, 2, 4, 4}, 1).cast(DataType::Float32);
  EXPECT_THROW(run1("MaxPool", {x}), Error);                                      // no kernel_shape
  EXPECT_THROW(run1("MaxPool", {x}, {attr("kernel_shape", Ints{2})}), Error);     // rank
  EXPECT_THROW(run1("MaxPool", {x}, {attr("kernel_shape", Ints{5, 2})}), Error);  // window > input
  EXPECT_THROW(
      run1("AveragePool", {x}, {attr("kernel_shape", Ints{2, 2}), attr("strides", Ints{1})}),
      Error);
  EXPECT_THROW(
      run1("MaxPool", {x}, {attr("kernel_shape", Ints{2, 2}), attr("storage_order", int64_t{2})}),
      Error);
  EXPECT_THROW(run1("AveragePool", {Tensor::from_vector<int32_t>({1, 1, 2}, {1, 2})},
                    {attr("kernel_shape", Ints{2})}),
               Error);
  EXPECT_NO_THROW(
      run1("MaxPool", {x}, {attr("kernel_shape", Ints{5, 2}), attr("pads", Ints{1, 0, 0, 0})}));
}

TEST(GlobalPoolTest, AverageAndMax) {
  const Tensor x = f32({1, 2, 2, 3}, {1, 2, 3, 4, 5, 6, -1, -2, -3, -4, -5, -9});
  expect_close(run1("GlobalAveragePool", {x}), f32({1, 2, 1, 1}, {3.5f, -4}));
  expect_close(run1("GlobalMaxPool", {x}), f32({1, 2, 1, 1}, {6, -1}));
  const Tensor x3 = f64({2, 1, 1, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 9});
  expect_close(run1("GlobalAveragePool", {x3}), f64({2, 1, 1, 1, 1}, {2.5, 6.75}));
  expect_close(run1("GlobalMaxPool", {x3.cast(DataType::Float16)}).cast(DataType::Float64),
               f64({2, 1, 1, 1, 1}, {4, 9}));
  EXPECT_THROW(run1("GlobalMaxPool", {f32({3}, {1, 2, 3})}), Error);
}

// ---------------------------------------------------------------------------------------------
// oneDNN plumbing

TEST(PrimitiveCacheTest, KeysOnShapesAndThreadCount) {
  using ops::dnnl_util::CacheKey;
  ops::dnnl_util::PrimitiveCache<int> cache;
  int made = 0;
  const auto make = [&] { return ++made; };
  EXPECT_EQ(cache.get(CacheKey().add(Shape{2, 3}).add(Shape{4}), make), 1);
  EXPECT_EQ(cache.get(CacheKey().add(Shape{2, 3}).add(Shape{4}), make), 1);
  EXPECT_EQ(cache.get(CacheKey().add(Shape{2}).add(Shape{3, 4}), make), 2);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(threads + 1);
  EXPECT_EQ(cache.get(CacheKey().add(Shape{2, 3}).add(Shape{4}), make), 3);
  omp_set_num_threads(threads);
  for (int64_t i = 0; i < 10; ++i) cache.get(CacheKey().add(i), make);
  EXPECT_EQ(cache.size(), decltype(cache)::kCapacity);
  EXPECT_EQ(cache.get(CacheKey().add(Shape{2, 3}).add(Shape{4}), make), 14);  // evicted, made again
}

int thread_count() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// With one OpenMP thread, oneDNN and the reference loops start no other thread (checked in a
// fresh process, where no earlier test has started OpenMP's pool).
TEST(ThreadsDeathTest, OneOmpThreadRunsOnOneThread) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        omp_set_num_threads(1);
        run1("Conv", {random({4, 16, 32, 32}, 1).cast(DataType::Float32),
                      random({32, 16, 3, 3}, 2).cast(DataType::Float32)});
        run1("MatMul", {random({256, 256}, 3).cast(DataType::Float32),
                        random({256, 256}, 4).cast(DataType::Float32)});
        run1("MaxPool", {random({4, 16, 64, 64}, 5)}, {attr("kernel_shape", Ints{3, 3})});
        std::exit(thread_count() == 1 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

// ---------------------------------------------------------------------------------------------
// Conv -> [Relu ->] MaxPool fused into ai.onnxtrain.FusedConv (runtime/fusion.h): the fused
// session gives the unfused one's results, on the oneDNN channels-last path (float32, 1-3
// spatial dims) and the fallbacks (float64, float16, 4 spatial dims).

struct ChainSpec {
  Attrs conv, pool;
  bool relu = true;
  bool has_bias = true;
  int opset = 17;
  bool relu_is_output = false;   // the Relu's output is also a graph output: no fusion
  bool pool_indices = false;     // MaxPool's Indices wanted: no fusion
};

onnx::ModelProto chain_model(const ChainSpec& c, const Tensor& x, const Tensor& w, const Tensor& b) {
  onnx::ModelProto model = testing::empty_model("chain");
  model.mutable_opset_import(0)->set_version(c.opset);
  auto& g = *model.mutable_graph();
  const auto add_input = [&](const std::string& name, const Tensor& t) {
    testing::typed_value(g.add_input(), name, static_cast<int>(t.dtype()), t.shape().to_vector());
  };
  add_input("x", x);
  add_input("w", w);
  std::vector<std::string> conv_inputs = {"x", "w"};
  if (c.has_bias) {
    add_input("b", b);
    conv_inputs.push_back("b");
  }
  auto* conv = testing::add_node(g, "Conv", conv_inputs, {"c"});
  conv->set_name("conv");
  for (const auto& a : c.conv) *conv->add_attribute() = a;
  std::string pooled = "c";
  if (c.relu) {
    testing::add_node(g, "Relu", {"c"}, {"r"});
    pooled = "r";
    if (c.relu_is_output) g.add_output()->set_name("r");
  }
  auto* pool = testing::add_node(g, "MaxPool", {pooled}, c.pool_indices ? std::vector<std::string>{"y", "indices"}
                                                                          : std::vector<std::string>{"y"});
  for (const auto& a : c.pool) *pool->add_attribute() = a;
  g.add_output()->set_name("y");
  return model;
}

// Runs the chain fused and unfused; checks the fusion happened and the outputs agree.
void expect_fused_chain(const ChainSpec& c, const Tensor& x, const Tensor& w, const Tensor& b,
                        double rtol = 1e-5) {
  const onnx::ModelProto model = chain_model(c, x, w, b);
  onnx::GraphProto graph = model.graph();
  ASSERT_EQ(runtime::fuse_conv_pool(graph), 1);
  ASSERT_EQ(graph.node_size(), 1);
  EXPECT_EQ(graph.node(0).op_type(), "FusedConv");
  EXPECT_EQ(graph.node(0).name(), "conv");
  runtime::NamedTensors feeds{{"x", x}, {"w", w}};
  if (c.has_bias) feeds["b"] = b;
  runtime::Session fused(model), unfused(model, {.fuse = false});
  const Tensor got = fused.run(feeds).at("y"), want = unfused.run(feeds).at("y");
  expect_close(got, want, rtol, rtol);
  // The fused session runs again with the same result (cached primitives and pool plan).
  expect_close(fused.run(feeds).at("y"), got, 0, 0);
}

Tensor random32(const Shape& shape, uint32_t seed) { return random(shape, seed).cast(DataType::Float32); }

TEST(FusedConvTest, MatchesConvReluMaxPoolOnTheOneDnnPath) {
  ChainSpec c;
  c.conv = {attr("kernel_shape", Ints{5, 5}), attr("pads", Ints{2, 2, 2, 2})};
  c.pool = {attr("kernel_shape", Ints{2, 2}), attr("strides", Ints{2, 2})};
  expect_fused_chain(c, random32({3, 2, 12, 10}, 1), random32({8, 2, 5, 5}, 2), random32({8}, 3));
  c.relu = false;  // Conv -> MaxPool
  expect_fused_chain(c, random32({3, 2, 12, 10}, 1), random32({8, 2, 5, 5}, 2), random32({8}, 3));
  c.has_bias = false;
  c.conv = {attr("kernel_shape", Ints{3, 3})};
  expect_fused_chain(c, random32({1, 3, 9, 9}, 4), random32({5, 3, 3, 3}, 5), Tensor());
}

TEST(FusedConvTest, ImagesGoThroughInChunksOfTheirConvolutionOutput) {
  // 64 channels of 32x32 output per image, 256 KiB: conv.cpp's kPooledChunkBytes (1 MiB) takes
  // 4 images per oneDNN call, so batch 10 runs chunks of 4, 4 and 2 and batch 5 of 4 and 1, each
  // image's result written at its own place in y.
  ChainSpec c;
  c.conv = {attr("kernel_shape", Ints{3, 3}), attr("pads", Ints{1, 1, 1, 1})};
  c.pool = {attr("kernel_shape", Ints{2, 2}), attr("strides", Ints{2, 2})};
  for (const int64_t batch : {10, 5}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    expect_fused_chain(c, random32({batch, 3, 32, 32}, 30), random32({64, 3, 3, 3}, 31), random32({64}, 32));
  }
}

TEST(FusedConvTest, PoolPaddingCeilModeDilationsAndGroups) {
  ChainSpec c;
  c.conv = {attr("kernel_shape", Ints{3, 3}), attr("strides", Ints{2, 1}), attr("group", int64_t{2}),
            attr("pads", Ints{1, 0, 1, 2})};
  c.pool = {attr("kernel_shape", Ints{3, 2}), attr("strides", Ints{2, 2}), attr("pads", Ints{1, 1, 1, 0}),
            attr("dilations", Ints{1, 2}), attr("ceil_mode", int64_t{1})};
  expect_fused_chain(c, random32({2, 4, 11, 9}, 6), random32({6, 2, 3, 3}, 7), random32({6}, 8));
  c.pool = {attr("kernel_shape", Ints{3, 3}), attr("auto_pad", std::string("SAME_UPPER"))};
  expect_fused_chain(c, random32({2, 4, 11, 9}, 6), random32({6, 2, 3, 3}, 7), random32({6}, 8));
}

TEST(FusedConvTest, OneAndThreeSpatialDims) {
  ChainSpec c1;
  c1.conv = {attr("kernel_shape", Ints{3}), attr("pads", Ints{1, 1})};
  c1.pool = {attr("kernel_shape", Ints{3}), attr("strides", Ints{2})};
  expect_fused_chain(c1, random32({2, 3, 17}, 9), random32({4, 3, 3}, 10), random32({4}, 11));
  ChainSpec c3;
  c3.conv = {attr("kernel_shape", Ints{2, 2, 2})};
  c3.pool = {attr("kernel_shape", Ints{2, 2, 2}), attr("strides", Ints{1, 2, 2})};
  expect_fused_chain(c3, random32({2, 2, 5, 6, 7}, 12), random32({3, 2, 2, 2, 2}, 13), random32({3}, 14));
}

TEST(FusedConvTest, FallbackPathsForOtherDtypesAndRanks) {
  ChainSpec c;
  c.conv = {attr("kernel_shape", Ints{3, 3}), attr("pads", Ints{1, 1, 1, 1})};
  c.pool = {attr("kernel_shape", Ints{2, 2}), attr("strides", Ints{2, 2})};
  // float64 runs the reference convolution, then the plain pool and Relu: exact.
  expect_fused_chain(c, random({2, 3, 8, 8}, 15), random({4, 3, 3, 3}, 16), random({4}, 17), 0);
  expect_fused_chain(c, random({2, 3, 8, 8}, 15).cast(DataType::Float16),
                     random({4, 3, 3, 3}, 16).cast(DataType::Float16), random({4}, 17).cast(DataType::Float16),
                     0);
  ChainSpec c4;  // 4 spatial dims: no oneDNN convolution
  c4.conv = {attr("kernel_shape", Ints{2, 1, 2, 1})};
  c4.pool = {attr("kernel_shape", Ints{2, 2, 1, 2})};
  expect_fused_chain(c4, random({1, 2, 3, 4, 3, 4}, 18), random({2, 2, 2, 1, 2, 1}, 19), random({2}, 20), 0);
}

TEST(FusedConvTest, NaNAndNegativeValuesKeepMaxPoolAndReluSemantics) {
  ChainSpec c;
  c.conv = {attr("kernel_shape", Ints{1, 1})};
  c.pool = {attr("kernel_shape", Ints{2, 2}), attr("strides", Ints{2, 2})};
  // A 1x1 convolution with weight 1 passes x through: the pool sees NaN, -inf and negatives.
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const Tensor x = f32({1, 1, 2, 6}, {nan, -1, -5, -3, 2, -inf,  //
                                      -2, -4, -6, -7, -inf, 1});
  const Tensor w = f32({1, 1, 1, 1}, {1});
  const Tensor b = f32({1}, {0});
  expect_fused_chain(c, x, w, b);
  runtime::Session fused(chain_model(c, x, w, b));
  const Tensor y = fused.run({{"x", x}, {"w", w}, {"b", b}}).at("y");
  const auto v = y.to_double_vector();
  ASSERT_EQ(v.size(), 3u);
  EXPECT_TRUE(std::isnan(v[0]));       // NaN wins its window
  EXPECT_EQ(v[1], 0.0);                // max -3 -> Relu 0
  EXPECT_FALSE(std::signbit(v[1]));    // +0, as Relu gives
  EXPECT_EQ(v[2], 2.0);
}

TEST(FusedConvTest, NotFusedWhereAnIntermediateIsNeededOrIndicesAreWanted) {
  ChainSpec c;
  c.conv = {attr("kernel_shape", Ints{3, 3})};
  c.pool = {attr("kernel_shape", Ints{2, 2})};
  const Tensor x = random32({1, 2, 6, 6}, 21), w = random32({3, 2, 3, 3}, 22), b = random32({3}, 23);
  c.relu_is_output = true;
  onnx::GraphProto graph = chain_model(c, x, w, b).graph();
  EXPECT_EQ(runtime::fuse_conv_pool(graph), 0);
  EXPECT_EQ(graph.node_size(), 3);
  c.relu_is_output = false;
  c.pool_indices = true;
  graph = chain_model(c, x, w, b).graph();
  EXPECT_EQ(runtime::fuse_conv_pool(graph), 0);
  // A second reader of the convolution's output keeps the Conv, so nothing fuses.
  c.pool_indices = false;
  graph = chain_model(c, x, w, b).graph();
  auto* extra = graph.add_node();
  extra->set_op_type("Identity");
  extra->add_input("c");
  extra->add_output("c_copy");
  graph.add_output()->set_name("c_copy");
  EXPECT_EQ(runtime::fuse_conv_pool(graph), 0);
}

// Conv -> Relu whose Relu output has other readers (in a training graph, the backward pass):
// fuse_conv_pool leaves it, fuse_conv_relu makes a FusedConv with the Relu inside (applied while
// float32 leaves oneDNN's blocked layout) and the MaxPool stays; both outputs are the unfused
// session's, with Relu's NaN and signed zeros.
TEST(FusedConvTest, ConvReluFusesWhereTheReluOutputHasOtherReaders) {
  ChainSpec c;
  c.conv = {attr("kernel_shape", Ints{3, 3}), attr("pads", Ints{1, 1, 1, 1})};
  c.pool = {attr("kernel_shape", Ints{2, 2}), attr("strides", Ints{2, 2})};
  c.relu_is_output = true;
  const auto check = [&](const ChainSpec& spec, const Tensor& x, const Tensor& w, const Tensor& b, double rtol) {
    const onnx::ModelProto model = chain_model(spec, x, w, b);
    onnx::GraphProto graph = model.graph();
    EXPECT_EQ(runtime::fuse_conv_pool(graph), 0);
    ASSERT_EQ(runtime::fuse_conv_relu(graph), 1);
    ASSERT_EQ(graph.node_size(), 2);
    EXPECT_EQ(graph.node(0).op_type(), "FusedConv");
    const runtime::NamedTensors feeds{{"x", x}, {"w", w}, {"b", b}};
    runtime::Session fused(model), unfused(model, {.fuse = false});
    const auto got = fused.run(feeds), want = unfused.run(feeds);
    for (const char* name : {"r", "y"}) {
      SCOPED_TRACE(name);
      expect_close(got.at(name), want.at(name), rtol, rtol);
      const auto g = got.at(name).to_double_vector(), v = want.at(name).to_double_vector();
      for (size_t i = 0; i < g.size(); ++i) EXPECT_EQ(std::signbit(g[i]), std::signbit(v[i])) << i;
    }
  };
  // 20 and 5 output channels: whole and partial channel blocks.
  check(c, random32({2, 3, 8, 10}, 27), random32({20, 3, 3, 3}, 28), random32({20}, 29), 1e-5);
  check(c, random32({2, 3, 8, 10}, 27), random32({5, 3, 3, 3}, 28), random32({5}, 29), 1e-5);
  check(c, random({2, 3, 8, 10}, 27), random({4, 3, 3, 3}, 28), random({4}, 29), 0);  // reference
  const float nan = std::numeric_limits<float>::quiet_NaN();
  ChainSpec pass = c;  // a 1x1 convolution with weight 1: Relu sees NaN, negatives and zeros
  pass.conv = {attr("kernel_shape", Ints{1, 1})};
  check(pass, f32({1, 1, 2, 4}, {nan, -1, 0, 3, -0.0f, -2, 5, nan}), f32({1, 1, 1, 1}, {1}), f32({1}, {0.0f}), 0);
}

TEST(FusedConvTest, BadAttributesAreErrors) {
  ChainSpec c;
  c.conv = {attr("kernel_shape", Ints{3, 3})};
  c.pool = {attr("kernel_shape", Ints{2, 2})};
  onnx::ModelProto model = chain_model(c, random32({1, 1, 4, 4}, 24), random32({1, 1, 3, 3}, 25), random32({1}, 26));
  onnx::GraphProto graph = model.graph();
  ASSERT_EQ(runtime::fuse_conv_pool(graph), 1);
  for (auto& a : *graph.mutable_node(0)->mutable_attribute()) {
    if (a.name() == "activation") a.set_s("Tanh");
  }
  *model.mutable_graph() = graph;
  model.add_opset_import()->set_domain("ai.onnxtrain");
  model.mutable_opset_import(1)->set_version(1);
  try {
    runtime::Session session(model, {.fuse = false});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'activation' is 'Tanh'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace onnxtrain
