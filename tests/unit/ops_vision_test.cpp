// Unit tests for the vision and neural-network ops (LRN, LpPool, LpNormalization,
// MeanVarianceNormalization, GridSample, AffineGrid, RoiAlign, MaxUnpool, DeformConv, Col2Im,
// CenterCropPad, Upsample): values against direct loops written here from the ONNX operator docs,
// in float64 and on the float32 paths (oneDNN's LRN), at the op versions the backend tests miss,
// and the errors for bad shapes and attributes.
#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "onnxtrain/error.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::attr;
using testing::throws_with;
using testing::expect_close;
using testing::i64;
using testing::NodeSpec;
using testing::random_f64;
using testing::run_node;
using Attrs = std::vector<onnx::AttributeProto>;
using Ints = std::vector<int64_t>;

Tensor run(const std::string& op, int opset, const std::vector<Tensor>& in, Attrs attrs = {}) {
  return run_node(NodeSpec{op, "", opset, std::move(attrs), 1}, in)[0];
}
Tensor f64(const Shape& s, const std::vector<double>& v) { return Tensor::from_vector<double>(s, v); }
Tensor f32(const Shape& s, const std::vector<float>& v) { return Tensor::from_vector<float>(s, v); }

// Row-major flat index of `idx` in `shape`.
int64_t flat(const Shape& shape, const Ints& idx) {
  int64_t f = 0;
  for (size_t d = 0; d < idx.size(); ++d) f = f * shape[d] + idx[d];
  return f;
}
// Calls f(index) for every index of `dims` in row-major order.
void for_each_index(const Ints& dims, const std::function<void(const Ints&)>& f) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  Ints idx(dims.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    f(idx);
    for (size_t d = dims.size(); d-- > 0;) {
      if (++idx[d] < dims[d]) break;
      idx[d] = 0;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// LRN: Y = X / (bias + alpha / size * square_sum)^beta over the channel window of the doc.

Tensor lrn_reference(const Tensor& x, int64_t size, double alpha, double beta, double bias) {
  const auto v = x.to_double_vector();
  std::vector<double> y(v.size());
  const int64_t C = x.dim(1), S = x.shape().numel(2, x.rank());
  for (int64_t n = 0; n < x.dim(0); ++n) {
    for (int64_t c = 0; c < C; ++c) {
      const int64_t lo = std::max<int64_t>(0, c - static_cast<int64_t>(std::floor((size - 1) / 2.0)));
      const int64_t hi = std::min<int64_t>(C - 1, c + static_cast<int64_t>(std::ceil((size - 1) / 2.0)));
      for (int64_t s = 0; s < S; ++s) {
        double sq = 0;
        for (int64_t i = lo; i <= hi; ++i) sq += v[static_cast<size_t>((n * C + i) * S + s)] * v[static_cast<size_t>((n * C + i) * S + s)];
        const size_t at = static_cast<size_t>((n * C + c) * S + s);
        y[at] = v[at] / std::pow(bias + alpha / static_cast<double>(size) * sq, beta);
      }
    }
  }
  return f64(x.shape(), y);
}

TEST(LRN, MatchesTheDocForOddAndEvenSizesOnBothPaths) {
  for (int64_t size : {1, 2, 3, 4, 5}) {
    for (const Shape& shape : {Shape{2, 7, 3, 4}, Shape{1, 6, 5}, Shape{1, 5, 2, 3, 2}}) {
      SCOPED_TRACE("size " + std::to_string(size) + " shape " + shape.to_string());
      const Tensor x = random_f64(shape, 11, 3.0);
      const Attrs a{attr("size", size), attr("alpha", 0.2f), attr("beta", 0.6f), attr("bias", 1.5f)};
      const Tensor want = lrn_reference(x, size, 0.2f, 0.6f, 1.5f);
      expect_close(run("LRN", 13, {x}, a), want, 1e-12, 1e-12);
      // float32: oneDNN for odd sizes, the loops for even ones.
      expect_close(run("LRN", 13, {x.cast(DataType::Float32)}, a).cast(DataType::Float64), want, 1e-5, 1e-6);
    }
  }
  // LRN-1 (opset 12 and before), default alpha, beta, bias; float16.
  const Tensor x = random_f64({1, 4, 2, 2}, 3, 2.0);
  expect_close(run("LRN", 1, {x.cast(DataType::Float16)}, {attr("size", int64_t{3})}).cast(DataType::Float64),
               lrn_reference(x.cast(DataType::Float16).cast(DataType::Float64), 3, 1e-4f, 0.75f, 1.0f), 2e-3, 2e-3);
}

TEST(LRN, BadAttributesAndShapesAreErrors) {
  const Tensor x = random_f64({1, 3, 2, 2}, 1);
  EXPECT_TRUE(throws_with([&] { run("LRN", 13, {x}); }, "'size'"));
  EXPECT_TRUE(throws_with([&] { run("LRN", 13, {x}, {attr("size", int64_t{0})}); }, "'size'"));
  EXPECT_TRUE(throws_with([&] { run("LRN", 13, {random_f64({3}, 1)}, {attr("size", int64_t{3})}); }, "rank"));
}

// ---------------------------------------------------------------------------------------------
// LpPool: (sum of |x|^p over the window's elements inside X)^(1/p).

// 2-D windows with explicit pads (begin h, begin w), strides, dilations and the output dims.
Tensor lp_pool_2d(const Tensor& x, double p, Ints k, Ints s, Ints dil, Ints pads, Ints out) {
  const auto v = x.to_double_vector();
  const int64_t H = x.dim(2), W = x.dim(3);
  std::vector<double> y;
  for (int64_t nc = 0; nc < x.dim(0) * x.dim(1); ++nc) {
    for (int64_t oh = 0; oh < out[0]; ++oh) {
      for (int64_t ow = 0; ow < out[1]; ++ow) {
        double sum = 0;
        for (int64_t i = 0; i < k[0]; ++i) {
          for (int64_t j = 0; j < k[1]; ++j) {
            const int64_t h = oh * s[0] - pads[0] + i * dil[0], w = ow * s[1] - pads[1] + j * dil[1];
            if (h >= 0 && h < H && w >= 0 && w < W) sum += std::pow(std::abs(v[static_cast<size_t>((nc * H + h) * W + w)]), p);
          }
        }
        y.push_back(std::pow(sum, 1 / p));
      }
    }
  }
  return f64({x.dim(0), x.dim(1), out[0], out[1]}, y);
}

TEST(LpPool, MatchesTheWindowNormAtEveryVersion) {
  const Tensor x = random_f64({2, 3, 7, 6}, 5, 2.0);
  // Version 18: dilations, ceil_mode (out = ceil((7 + 1 - 3) / 2) + 1 = 4 rows, 3 columns).
  const Attrs a18{attr("kernel_shape", Ints{2, 2}), attr("strides", Ints{2, 2}), attr("dilations", Ints{2, 1}),
                  attr("pads", Ints{1, 0, 0, 1}), attr("ceil_mode", int64_t{1}), attr("p", int64_t{3})};
  expect_close(run("LpPool", 18, {x}, a18), lp_pool_2d(x, 3, {2, 2}, {2, 2}, {2, 1}, {1, 0}, {4, 3}), 1e-12, 1e-12);
  expect_close(run("LpPool", 22, {x.cast(DataType::Float32)}, a18).cast(DataType::Float64),
               lp_pool_2d(x, 3, {2, 2}, {2, 2}, {2, 1}, {1, 0}, {4, 3}), 1e-5, 1e-5);
  // Version 11 (p 1) and version 2 (p default 2) with SAME_UPPER: pads 0 before, 1 after.
  const Attrs same{attr("kernel_shape", Ints{2, 2}), attr("auto_pad", std::string("SAME_UPPER"))};
  expect_close(run("LpPool", 2, {x}, same), lp_pool_2d(x, 2, {2, 2}, {1, 1}, {1, 1}, {0, 0}, {7, 6}), 1e-12, 1e-12);
  Attrs p1 = same;
  p1.push_back(attr("p", int64_t{1}));
  expect_close(run("LpPool", 11, {x}, p1), lp_pool_2d(x, 1, {2, 2}, {1, 1}, {1, 1}, {0, 0}, {7, 6}), 1e-12, 1e-12);
  // Version 1: p is a float.
  expect_close(run("LpPool", 1, {x}, {attr("kernel_shape", Ints{3, 2}), attr("p", 2.5f)}),
               lp_pool_2d(x, 2.5, {3, 2}, {1, 1}, {1, 1}, {0, 0}, {5, 5}), 1e-12, 1e-12);
}

TEST(LpPool, BadAttributesAreErrors) {
  const Tensor x = random_f64({1, 1, 4, 4}, 1);
  EXPECT_TRUE(throws_with([&] { run("LpPool", 18, {x}); }, "kernel_shape"));
  EXPECT_TRUE(throws_with([&] { run("LpPool", 18, {x}, {attr("kernel_shape", Ints{2, 2}), attr("p", int64_t{0})}); }, "'p'"));
  EXPECT_TRUE(throws_with([&] { run("LpPool", 18, {x}, {attr("kernel_shape", Ints{2})}); }, "rank"));
  EXPECT_TRUE(throws_with([&] { run("LpPool", 18, {x}, {attr("kernel_shape", Ints{5, 5})}); }, "window"));
}

// ---------------------------------------------------------------------------------------------
// LpNormalization and MeanVarianceNormalization

TEST(LpNormalization, DividesByTheNormAlongTheAxisAndGivesZeroForAZeroNorm) {
  // x [2, 3, 2] with the row x[1, :, 0] all zeros.
  std::vector<double> v = random_f64({2, 3, 2}, 9).to_double_vector();
  for (int64_t c = 0; c < 3; ++c) v[static_cast<size_t>(6 + 2 * c)] = 0;
  const Tensor x = f64({2, 3, 2}, v);
  for (int64_t p : {1, 2}) {
    for (int64_t axis : {1, -3, -1}) {
      const int64_t ax = axis < 0 ? axis + 3 : axis;
      std::vector<double> want(v.size());
      for_each_index({2, 3, 2}, [&](const Ints& i) {
        double norm = 0;
        for (int64_t k = 0; k < x.dim(static_cast<size_t>(ax)); ++k) {
          Ints j = i;
          j[static_cast<size_t>(ax)] = k;
          const double e = v[static_cast<size_t>(flat(x.shape(), j))];
          norm += p == 1 ? std::abs(e) : e * e;
        }
        if (p == 2) norm = std::sqrt(norm);
        const size_t at = static_cast<size_t>(flat(x.shape(), i));
        want[at] = norm == 0 ? 0 : v[at] / norm;
      });
      SCOPED_TRACE("p " + std::to_string(p) + " axis " + std::to_string(axis));
      expect_close(run("LpNormalization", 22, {x}, {attr("p", p), attr("axis", axis)}), f64(x.shape(), want), 1e-12, 1e-14);
      expect_close(run("LpNormalization", 1, {x.cast(DataType::Float32)}, {attr("p", p), attr("axis", axis)}).cast(DataType::Float64),
                   f64(x.shape(), want), 1e-6, 1e-7);
    }
  }
  EXPECT_TRUE(throws_with([&] { run("LpNormalization", 22, {x}, {attr("p", int64_t{3})}); }, "'p'"));
  EXPECT_TRUE(throws_with([&] { run("LpNormalization", 22, {x}, {attr("axis", int64_t{3})}); }, "'axis'"));
}

TEST(MeanVarianceNormalization, NormalizesOverTheAxes) {
  const Tensor x = random_f64({2, 3, 2, 2}, 4, 5.0);
  const auto v = x.to_double_vector();
  for (const Ints& axes : {Ints{0, 2, 3}, Ints{1, -1}}) {
    std::vector<bool> red(4, false);
    for (int64_t a : axes) red[static_cast<size_t>(a < 0 ? a + 4 : a)] = true;
    std::vector<double> want(v.size());
    for_each_index({2, 3, 2, 2}, [&](const Ints& i) {
      double sum = 0, sq = 0, count = 0;
      for_each_index({2, 3, 2, 2}, [&](const Ints& j) {
        for (size_t d = 0; d < 4; ++d) {
          if (!red[d] && j[d] != i[d]) return;
        }
        const double e = v[static_cast<size_t>(flat(x.shape(), j))];
        sum += e, sq += e * e, count += 1;
      });
      const double mean = sum / count;
      const size_t at = static_cast<size_t>(flat(x.shape(), i));
      want[at] = (v[at] - mean) / (std::sqrt(sq / count - mean * mean) + 1e-9);  // the function body's formula
    });
    const Attrs a = axes == Ints{0, 2, 3} ? Attrs{} : Attrs{attr("axes", axes)};
    expect_close(run("MeanVarianceNormalization", 13, {x}, a), f64(x.shape(), want), 1e-10, 1e-10);
    expect_close(run("MeanVarianceNormalization", 9, {x.cast(DataType::Float32)}, a).cast(DataType::Float64),
                 f64(x.shape(), want), 1e-5, 1e-5);
  }
  EXPECT_TRUE(throws_with([&] { run("MeanVarianceNormalization", 13, {x}, {attr("axes", Ints{1, 1})}); }, "'axes'"));
  EXPECT_TRUE(throws_with([&] { run("MeanVarianceNormalization", 13, {random_f64({2, 3}, 1)}); }, "'axes'"));
}

// ---------------------------------------------------------------------------------------------
// GridSample: a direct reading of the doc, one output element at a time, dims recursively.

struct GridRef {
  std::string mode = "linear", padding = "zeros";
  bool align = false;

  double reflect(double x, double lo, double hi) const {
    if (hi <= lo) return lo;
    while (x < lo || x > hi) x = x < lo ? 2 * lo - x : 2 * hi - x;  // mirror until inside
    return x;
  }
  // The value of plane `data` (spatial dims `dims`, row-major) at index `idx` per padding_mode.
  double pixel(const std::vector<double>& data, const Ints& dims, Ints idx) const {
    for (size_t d = 0; d < dims.size(); ++d) {
      if (idx[d] >= 0 && idx[d] < dims[d]) continue;
      if (padding == "zeros") return 0;
      if (padding == "border") {
        idx[d] = std::clamp<int64_t>(idx[d], 0, dims[d] - 1);
      } else {
        idx[d] = static_cast<int64_t>(reflect(static_cast<double>(idx[d]), align ? 0 : -0.5,
                                              align ? static_cast<double>(dims[d] - 1) : static_cast<double>(dims[d]) - 0.5));
      }
    }
    return data[static_cast<size_t>(flat(Shape(dims), idx))];
  }
  static double cubic(double t) {  // Keys' kernel, a = -0.75, at distance |t|
    const double a = -0.75, u = std::abs(t);
    if (u <= 1) return ((a + 2) * u - (a + 3)) * u * u + 1;
    if (u < 2) return ((a * u - 5 * a) * u + 8 * a) * u - 4 * a;
    return 0;
  }
  // Interpolates over dims [d, r) with the indices before d fixed in idx.
  double interp(const std::vector<double>& data, const Ints& dims, const std::vector<double>& x, Ints& idx, size_t d) const {
    if (d == dims.size()) return pixel(data, dims, idx);
    const double f = std::floor(x[d]);
    double sum = 0;
    const int64_t from = mode == "cubic" ? -1 : 0, to = mode == "cubic" ? 2 : 1;
    for (int64_t k = from; k <= to; ++k) {
      const double w = mode == "cubic" ? cubic(x[d] - (f + static_cast<double>(k))) : 1 - std::abs(x[d] - (f + static_cast<double>(k)));
      idx[d] = static_cast<int64_t>(f) + k;
      sum += w * interp(data, dims, x, idx, d + 1);
    }
    return sum;
  }
  double sample(const std::vector<double>& data, const Ints& dims, const std::vector<double>& g) const {
    const size_t r = dims.size();
    std::vector<double> x(r);
    for (size_t d = 0; d < r; ++d) {
      const double D = static_cast<double>(dims[d]), gn = g[r - 1 - d];
      double v = align ? (gn + 1) / 2 * (D - 1) : ((gn + 1) * D - 1) / 2;
      if (mode == "nearest") v = std::nearbyint(v);
      const double lo = align ? 0 : -0.5, hi = align ? D - 1 : D - 0.5;
      if (v < lo || v > hi) {
        if (padding == "border") v = std::clamp(v, 0.0, D - 1);
        if (padding == "reflection") v = reflect(v, lo, hi);
      }
      x[d] = v;
    }
    Ints idx(r);
    if (mode == "nearest") {
      for (size_t d = 0; d < r; ++d) idx[d] = static_cast<int64_t>(x[d]);
      return pixel(data, dims, idx);
    }
    return interp(data, dims, x, idx, 0);
  }
  Tensor run(const Tensor& x, const Tensor& grid) const {
    const size_t r = x.rank() - 2;
    Ints dims(x.shape().begin() + 2, x.shape().end()), out(grid.shape().begin() + 1, grid.shape().end() - 1);
    const auto xv = x.to_double_vector(), gv = grid.to_double_vector();
    const int64_t plane = Shape(dims).numel(), points = Shape(out).numel();
    std::vector<double> y;
    for (int64_t n = 0; n < x.dim(0); ++n) {
      for (int64_t c = 0; c < x.dim(1); ++c) {
        std::vector<double> data(xv.begin() + (n * x.dim(1) + c) * plane, xv.begin() + (n * x.dim(1) + c + 1) * plane);
        for (int64_t o = 0; o < points; ++o) {
          std::vector<double> g(gv.begin() + (n * points + o) * static_cast<int64_t>(r), gv.begin() + (n * points + o + 1) * static_cast<int64_t>(r));
          y.push_back(sample(data, dims, g));
        }
      }
    }
    Shape ys{x.dim(0), x.dim(1)};
    for (int64_t d : out) ys.push_back(d);
    return f64(ys, y);
  }
};

TEST(GridSample, MatchesTheDocForEveryModePaddingAndAlignment) {
  const Tensor x = random_f64({2, 2, 4, 5}, 21, 2.0);
  const Tensor grid = random_f64({2, 3, 4, 2}, 22, 1.6);  // some points outside [-1, 1]
  for (const char* mode : {"nearest", "linear", "cubic"}) {
    for (const char* padding : {"zeros", "border", "reflection"}) {
      for (int64_t align : {0, 1}) {
        SCOPED_TRACE(std::string(mode) + " " + padding + " align " + std::to_string(align));
        const GridRef ref{mode, padding, align != 0};
        const Attrs a{attr("mode", std::string(mode)), attr("padding_mode", std::string(padding)), attr("align_corners", align)};
        const Tensor want = ref.run(x, grid);
        expect_close(run("GridSample", 20, {x, grid}, a), want, 1e-10, 1e-10);
        expect_close(run("GridSample", 22, {x.cast(DataType::Float32), grid.cast(DataType::Float32)}, a).cast(DataType::Float64), want, 1e-4,
                     1e-4);
        // Version 16 names the modes bilinear and bicubic.
        const std::string m16 = std::string(mode) == "nearest" ? mode : std::string("bi") + mode;
        const Attrs a16{attr("mode", m16), attr("padding_mode", std::string(padding)), attr("align_corners", align)};
        expect_close(run("GridSample", 16, {x, grid}, a16), want, 1e-10, 1e-10);
      }
    }
  }
}

TEST(GridSample, SamplesOneAndThreeSpatialDimsAndIntegers) {
  for (const Shape& xs : {Shape{1, 2, 5}, Shape{1, 2, 3, 4, 3}}) {
    const Tensor x = random_f64(xs, 31, 2.0);
    const size_t r = xs.size() - 2;
    Shape gs{1};
    for (size_t d = 0; d < r; ++d) gs.push_back(3);
    gs.push_back(static_cast<int64_t>(r));
    const Tensor grid = random_f64(gs, 32, 1.3);
    for (const char* mode : {"nearest", "linear", "cubic"}) {
      SCOPED_TRACE(std::string(mode) + " rank " + std::to_string(xs.size()));
      const Attrs a{attr("mode", std::string(mode)), attr("padding_mode", std::string("reflection"))};
      expect_close(run("GridSample", 20, {x, grid}, a), GridRef{mode, "reflection", false}.run(x, grid), 1e-10, 1e-10);
    }
  }
  // int32 X with nearest: the values themselves.
  const Tensor xi = Tensor::from_vector<int32_t>({1, 1, 2, 2}, {1, 2, 3, 4});
  const Tensor g = f32({1, 1, 2, 2}, {-0.5f, -0.5f, 0.5f, 0.5f});
  const Tensor y = run("GridSample", 20, {xi, g}, {attr("mode", std::string("nearest"))});
  EXPECT_EQ(y.to_int64_vector("y"), (Ints{1, 4}));
}

TEST(GridSample, BadShapesAndModesAreErrors) {
  const Tensor x = random_f64({1, 1, 3, 3}, 1), grid = random_f64({1, 2, 2, 2}, 2);
  EXPECT_TRUE(throws_with([&] { run("GridSample", 16, {x, grid}, {attr("mode", std::string("linear"))}); }, "'mode'"));
  EXPECT_TRUE(throws_with([&] { run("GridSample", 20, {x, grid}, {attr("mode", std::string("bicubic"))}); }, "'mode'"));
  EXPECT_TRUE(throws_with([&] { run("GridSample", 20, {x, grid}, {attr("padding_mode", std::string("wrap"))}); }, "'padding_mode'"));
  EXPECT_TRUE(throws_with([&] { run("GridSample", 20, {x, random_f64({1, 2, 2, 3}, 2)}); }, "do not fit"));
  EXPECT_TRUE(throws_with([&] { run("GridSample", 16, {random_f64({1, 1, 2, 2, 2}, 1), random_f64({1, 2, 2, 2, 3}, 2)}); }, "r = 2"));
  EXPECT_TRUE(throws_with([&] { run("GridSample", 20, {x, random_f64({2, 2, 2, 2}, 2)}); }, "do not fit"));
}

// ---------------------------------------------------------------------------------------------
// AffineGrid

TEST(AffineGrid, AppliesThetaToTheBaseGrid) {
  for (int64_t align : {0, 1}) {
    for (const Ints& size : {Ints{2, 3, 3, 4}, Ints{1, 1, 2, 3, 1}}) {
      const size_t r = size.size() - 2;
      const Tensor theta = random_f64({size[0], static_cast<int64_t>(r), static_cast<int64_t>(r) + 1}, 41);
      const auto th = theta.to_double_vector();
      const auto base = [&](int64_t i, int64_t L) {
        if (align) return L > 1 ? -1 + 2.0 * static_cast<double>(i) / static_cast<double>(L - 1) : 0.0;
        return (2.0 * static_cast<double>(i) + 1) / static_cast<double>(L) - 1;
      };
      std::vector<double> want;
      Ints spatial(size.begin() + 2, size.end());
      for (int64_t n = 0; n < size[0]; ++n) {
        for_each_index(spatial, [&](const Ints& p) {
          std::vector<double> h(r + 1, 1.0);  // (x, y[, z], 1): x from the last dim
          for (size_t d = 0; d < r; ++d) h[r - 1 - d] = base(p[d], spatial[d]);
          for (size_t i = 0; i < r; ++i) {
            double v = 0;
            for (size_t j = 0; j <= r; ++j) v += th[static_cast<size_t>(n) * r * (r + 1) + i * (r + 1) + j] * h[j];
            want.push_back(v);
          }
        });
      }
      Shape gs{size[0]};
      for (int64_t d : spatial) gs.push_back(d);
      gs.push_back(static_cast<int64_t>(r));
      SCOPED_TRACE("align " + std::to_string(align) + " rank " + std::to_string(size.size()));
      expect_close(run("AffineGrid", 20, {theta, i64(size)}, {attr("align_corners", align)}), f64(gs, want), 1e-12, 1e-12);
    }
  }
  EXPECT_TRUE(throws_with([&] { run("AffineGrid", 20, {random_f64({1, 2, 3}, 1), i64({2, 1, 3, 3})}); }, "expected [2,2,3]"));
  EXPECT_TRUE(throws_with([&] { run("AffineGrid", 20, {random_f64({1, 2, 3}, 1), i64({1, 3, 3})}); }, "int64 [4]"));
}

// ---------------------------------------------------------------------------------------------
// RoiAlign: bilinear samples at the sub-cell centers of each bin, as the doc and ONNX Runtime.

double bilinear_roi(const std::vector<double>& plane, int64_t H, int64_t W, double y, double x, double* out_max) {
  if (y < -1 || y > static_cast<double>(H) || x < -1 || x > static_cast<double>(W)) {
    *out_max = 0;
    return 0;
  }
  y = std::max(y, 0.0), x = std::max(x, 0.0);
  int64_t y0 = static_cast<int64_t>(y), x0 = static_cast<int64_t>(x), y1 = y0 + 1, x1 = x0 + 1;
  if (y0 >= H - 1) y0 = y1 = H - 1, y = static_cast<double>(y0);
  if (x0 >= W - 1) x0 = x1 = W - 1, x = static_cast<double>(x0);
  const double ly = y - static_cast<double>(y0), lx = x - static_cast<double>(x0);
  const double w[4] = {(1 - ly) * (1 - lx), (1 - ly) * lx, ly * (1 - lx), ly * lx};
  const double v[4] = {plane[static_cast<size_t>(y0 * W + x0)], plane[static_cast<size_t>(y0 * W + x1)],
                       plane[static_cast<size_t>(y1 * W + x0)], plane[static_cast<size_t>(y1 * W + x1)]};
  *out_max = w[0] * v[0];
  for (int i = 1; i < 4; ++i) *out_max = std::max(*out_max, w[i] * v[i]);
  return w[0] * v[0] + w[1] * v[1] + w[2] * v[2] + w[3] * v[3];
}

Tensor roi_align_reference(const Tensor& x, const Tensor& rois, const Ints& batch, int64_t oh, int64_t ow, int64_t ratio, double scale,
                           bool half_pixel, bool max) {
  const auto xv = x.to_double_vector(), rv = rois.to_double_vector();
  const int64_t C = x.dim(1), H = x.dim(2), W = x.dim(3);
  std::vector<double> y;
  for (size_t r = 0; r < batch.size(); ++r) {
    const double off = half_pixel ? 0.5 : 0;
    const double x1 = rv[4 * r] * scale - off, y1 = rv[4 * r + 1] * scale - off;
    double rw = rv[4 * r + 2] * scale - off - x1, rh = rv[4 * r + 3] * scale - off - y1;
    if (!half_pixel) rw = std::max(rw, 1.0), rh = std::max(rh, 1.0);
    const int64_t gh = ratio > 0 ? ratio : static_cast<int64_t>(std::ceil(rh / static_cast<double>(oh)));
    const int64_t gw = ratio > 0 ? ratio : static_cast<int64_t>(std::ceil(rw / static_cast<double>(ow)));
    for (int64_t c = 0; c < C; ++c) {
      const std::vector<double> plane(xv.begin() + (batch[r] * C + c) * H * W, xv.begin() + (batch[r] * C + c + 1) * H * W);
      for (int64_t ph = 0; ph < oh; ++ph) {
        for (int64_t pw = 0; pw < ow; ++pw) {
          double sum = 0, best = 0;
          for (int64_t iy = 0; iy < gh; ++iy) {
            for (int64_t ix = 0; ix < gw; ++ix) {
              const double yy = y1 + (static_cast<double>(ph) + (static_cast<double>(iy) + 0.5) / static_cast<double>(gh)) * rh / static_cast<double>(oh);
              const double xx = x1 + (static_cast<double>(pw) + (static_cast<double>(ix) + 0.5) / static_cast<double>(gw)) * rw / static_cast<double>(ow);
              double m = 0;
              sum += bilinear_roi(plane, H, W, yy, xx, &m);
              best = iy == 0 && ix == 0 ? m : std::max(best, m);
            }
          }
          y.push_back(max ? best : sum / static_cast<double>(std::max<int64_t>(gh * gw, 1)));
        }
      }
    }
  }
  return f64({static_cast<int64_t>(batch.size()), C, oh, ow}, y);
}

TEST(RoiAlign, MatchesTheDocForBothModesAndCoordinateTransforms) {
  const Tensor x = random_f64({2, 3, 6, 7}, 51, 2.0);
  const Tensor rois = f64({3, 4}, {0.5, 1.0, 4.2, 5.1, 2.0, 0.3, 6.8, 3.3, -1.5, 2.0, 3.0, 7.5});
  const Ints batch{1, 0, 1};
  for (const char* mode : {"avg", "max"}) {
    for (int64_t ratio : {0, 2}) {
      SCOPED_TRACE(std::string(mode) + " sampling_ratio " + std::to_string(ratio));
      const Attrs common{attr("mode", std::string(mode)), attr("output_height", int64_t{3}), attr("output_width", int64_t{2}),
                         attr("sampling_ratio", ratio), attr("spatial_scale", 0.9f)};
      const bool mx = std::string(mode) == "max";
      // Version 10: output_half_pixel; version 16: half_pixel by default.
      expect_close(run("RoiAlign", 10, {x, rois, i64(batch)}, common),
                   roi_align_reference(x, rois, batch, 3, 2, ratio, 0.9f, false, mx), 1e-12, 1e-12);
      expect_close(run("RoiAlign", 16, {x, rois, i64(batch)}, common),
                   roi_align_reference(x, rois, batch, 3, 2, ratio, 0.9f, true, mx), 1e-12, 1e-12);
      Attrs output_half = common;
      output_half.push_back(attr("coordinate_transformation_mode", std::string("output_half_pixel")));
      expect_close(run("RoiAlign", 22, {x.cast(DataType::Float32), rois.cast(DataType::Float32), i64(batch)}, output_half)
                       .cast(DataType::Float64),
                   roi_align_reference(x, rois, batch, 3, 2, ratio, 0.9f, false, mx), 1e-4, 1e-4);
    }
  }
}

TEST(RoiAlign, BadInputsAreErrors) {
  const Tensor x = random_f64({1, 1, 4, 4}, 1);
  const Tensor rois = f64({1, 4}, {0, 0, 2, 2});
  EXPECT_TRUE(throws_with([&] { run("RoiAlign", 16, {x, rois, i64({1})}); }, "batch_indices"));
  EXPECT_TRUE(throws_with([&] { run("RoiAlign", 16, {x, f64({1, 3}, {0, 0, 2}), i64({0})}); }, "rois"));
  EXPECT_TRUE(throws_with([&] { run("RoiAlign", 16, {x, rois, i64({0})}, {attr("mode", std::string("sum"))}); }, "'mode'"));
  EXPECT_TRUE(throws_with([&] {
    run("RoiAlign", 16, {x, rois, i64({0})}, {attr("coordinate_transformation_mode", std::string("asymmetric"))});
  }, "coordinate_transformation_mode"));
}

// ---------------------------------------------------------------------------------------------
// MaxUnpool

TEST(MaxUnpool, PutsMaxPoolsMaximaBackAndPadsToOutputShape) {
  // MaxPool then MaxUnpool: each window's maximum back in place, zeros elsewhere.
  const Tensor x = random_f64({2, 2, 4, 6}, 61);
  const Attrs pool{attr("kernel_shape", Ints{2, 2}), attr("strides", Ints{2, 2})};
  const auto pooled = run_node(NodeSpec{"MaxPool", "", 12, pool, 2}, {x});
  const Tensor y = run("MaxUnpool", 11, {pooled[0], pooled[1]}, pool);
  ASSERT_EQ(y.shape(), x.shape());
  const auto xv = x.to_double_vector(), yv = y.to_double_vector();
  const auto iv = pooled[1].to_int64_vector("I");
  std::vector<double> want(xv.size(), 0.0);
  for (int64_t i : iv) want[static_cast<size_t>(i)] = xv[static_cast<size_t>(i)];
  EXPECT_EQ(yv, want);
  // output_shape [2, 2, 5, 7]: the unpooled [2, 2, 4, 6] at the beginning of each dim.
  const Tensor padded = run("MaxUnpool", 22, {pooled[0], pooled[1], i64({2, 2, 5, 7})}, pool);
  ASSERT_EQ(padded.shape(), (Shape{2, 2, 5, 7}));
  const auto pv = padded.to_double_vector();
  for_each_index({2, 2, 5, 7}, [&](const Ints& i) {
    const bool inside = i[2] < 4 && i[3] < 6;
    EXPECT_EQ(pv[static_cast<size_t>(flat(padded.shape(), i))], inside ? want[static_cast<size_t>(flat(x.shape(), i))] : 0.0);
  });
  // Version 9, pads: unpooled dim (2 - 1) * 2 - 1 + 2 = 3.
  const Tensor y9 = run("MaxUnpool", 9, {f64({1, 1, 2, 1}, {5, 6}), i64({1, 1, 2, 1}, {0, 2})},
                        {attr("kernel_shape", Ints{2, 1}), attr("strides", Ints{2, 1}), attr("pads", Ints{1, 0, 0, 0})});
  EXPECT_EQ(y9.shape(), (Shape{1, 1, 3, 1}));
  EXPECT_EQ(y9.to_double_vector(), (std::vector<double>{5, 0, 6}));
}

TEST(MaxUnpool, BadIndicesAndShapesAreErrors) {
  const Attrs a{attr("kernel_shape", Ints{2, 2}), attr("strides", Ints{2, 2})};
  const Tensor x = f64({1, 1, 1, 1}, {1});
  EXPECT_TRUE(throws_with([&] { run("MaxUnpool", 11, {x, i64({1, 1, 1, 1}, {4})}, a); }, "outside [0, 4)"));
  EXPECT_TRUE(throws_with([&] { run("MaxUnpool", 11, {x, i64({1, 1, 1, 1}, {0}), i64({1, 1, 1, 1})}, a); }, "unpooled shape"));
  EXPECT_TRUE(throws_with([&] { run("MaxUnpool", 11, {x, i64({1, 1, 1, 1}, {0})}); }, "kernel_shape"));
  EXPECT_TRUE(throws_with([&] { run("MaxUnpool", 11, {x, i64({1, 1, 1}, {0})}, a); }, "indices"));
}

// ---------------------------------------------------------------------------------------------
// DeformConv: a direct sum over kernel taps of bilinear samples at the offset positions.

double sample_linear(const std::vector<double>& plane, const Ints& dims, const std::vector<double>& pos) {
  // r-linear interpolation with zeros outside: a sum over the 2^r corners.
  const size_t r = dims.size();
  double sum = 0;
  for (int64_t corner = 0; corner < (int64_t{1} << r); ++corner) {
    double w = 1;
    Ints idx(r);
    bool inside = true;
    for (size_t d = 0; d < r; ++d) {
      const double f = std::floor(pos[d]);
      const bool up = (corner >> d) & 1;
      idx[d] = static_cast<int64_t>(f) + (up ? 1 : 0);
      w *= up ? pos[d] - f : 1 - (pos[d] - f);
      inside = inside && idx[d] >= 0 && idx[d] < dims[d];
    }
    if (inside) sum += w * plane[static_cast<size_t>(flat(Shape(dims), idx))];
  }
  return sum;
}

Tensor deform_conv_reference(const Tensor& x, const Tensor& w, const Tensor& offset, const Tensor* b, const Tensor* mask, int64_t group,
                             int64_t offset_group, const Ints& strides, const Ints& pads, const Ints& dil) {
  const size_t r = x.rank() - 2;
  const Ints in(x.shape().begin() + 2, x.shape().end()), k(w.shape().begin() + 2, w.shape().end());
  const Ints out(offset.shape().begin() + 2, offset.shape().end());
  const int64_t N = x.dim(0), C = x.dim(1), OC = w.dim(0), K = Shape(k).numel(), plane = Shape(in).numel();
  const auto xv = x.to_double_vector(), wv = w.to_double_vector(), ov = offset.to_double_vector();
  const auto bv = b ? b->to_double_vector() : std::vector<double>(static_cast<size_t>(OC), 0.0);
  const auto mv = mask ? mask->to_double_vector() : std::vector<double>();
  Shape ys{N, OC};
  for (int64_t d : out) ys.push_back(d);
  std::vector<double> y(static_cast<size_t>(ys.numel()));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t m = 0; m < OC; ++m) {
      for_each_index(out, [&](const Ints& o) {
        double acc = bv[static_cast<size_t>(m)];
        const int64_t g = m / (OC / group);
        for (int64_t ci = 0; ci < C / group; ++ci) {
          const int64_t c = g * (C / group) + ci, og = c / (C / offset_group);
          const std::vector<double> xp(xv.begin() + (n * C + c) * plane, xv.begin() + (n * C + c + 1) * plane);
          int64_t kf = 0;
          for_each_index(k, [&](const Ints& kk) {
            std::vector<double> pos(r);
            const int64_t of = flat(Shape(out), o);
            for (size_t d = 0; d < r; ++d) {
              const int64_t ch = (og * K + kf) * static_cast<int64_t>(r) + static_cast<int64_t>(d);
              pos[d] = static_cast<double>(o[d] * strides[d] - pads[d] + kk[d] * dil[d]) +
                       ov[static_cast<size_t>((n * offset.dim(1) + ch) * Shape(out).numel() + of)];
            }
            const double mk = mask ? mv[static_cast<size_t>((n * mask->dim(1) + og * K + kf) * Shape(out).numel() + of)] : 1.0;
            acc += wv[static_cast<size_t>((m * (C / group) + ci) * K + kf)] * mk * sample_linear(xp, in, pos);
            ++kf;
          });
        }
        Ints yi{n, m};
        yi.insert(yi.end(), o.begin(), o.end());
        y[static_cast<size_t>(flat(ys, yi))] = acc;
      });
    }
  }
  return f64(ys, y);
}

TEST(DeformConv, ZeroOffsetsAreAConvolution) {
  const Tensor x = random_f64({2, 4, 5, 6}, 71), w = random_f64({6, 2, 3, 2}, 72), b = random_f64({6}, 73);
  const Attrs a{attr("group", int64_t{2}), attr("pads", Ints{1, 0, 1, 1}), attr("strides", Ints{2, 1}), attr("dilations", Ints{1, 2})};
  const Tensor conv = run("Conv", 17, {x, w, b}, a);
  Shape os{2, 3 * 2 * 2};
  for (size_t d = 2; d < 4; ++d) os.push_back(conv.dim(d));
  const Tensor zero = Tensor::zeros(DataType::Float64, os);
  expect_close(run("DeformConv", 19, {x, w, zero, b}, a), conv, 1e-12, 1e-12);
}

TEST(DeformConv, MatchesTheDirectSumWithOffsetsMasksAndGroups) {
  struct Setup {
    Shape x, w;
    int64_t group, offset_group;
    Ints strides, pads, dil;
    bool mask, bias;
  };
  for (const Setup& s : {Setup{{2, 4, 5, 5}, {4, 2, 2, 3}, 2, 2, {1, 2}, {1, 1, 0, 1}, {1, 1}, true, true},
                         Setup{{1, 2, 6}, {3, 2, 3}, 1, 2, {2}, {1, 1}, {2}, false, true},
                         Setup{{1, 2, 3, 4, 3}, {2, 1, 2, 2, 2}, 2, 1, {1, 1, 1}, {0, 1, 0, 0, 0, 1}, {1, 1, 1}, true, false}}) {
    SCOPED_TRACE("X " + s.x.to_string());
    const size_t r = s.x.size() - 2;
    Ints out;
    int64_t K = 1;
    for (size_t d = 0; d < r; ++d) {
      out.push_back((s.x[d + 2] + s.pads[d] + s.pads[d + r] - (s.dil[d] * (s.w[d + 2] - 1) + 1)) / s.strides[d] + 1);
      K *= s.w[d + 2];
    }
    Shape os{s.x[0], s.offset_group * K * static_cast<int64_t>(r)}, ms{s.x[0], s.offset_group * K};
    for (int64_t d : out) os.push_back(d), ms.push_back(d);
    const Tensor x = random_f64(s.x, 81, 2.0), w = random_f64(s.w, 82), offset = random_f64(os, 83, 1.7);
    const Tensor b = random_f64({s.w[0]}, 84), mask = random_f64(ms, 85);
    const Attrs a{attr("group", s.group), attr("offset_group", s.offset_group), attr("strides", s.strides), attr("pads", s.pads),
                  attr("dilations", s.dil)};
    const Tensor want = deform_conv_reference(x, w, offset, s.bias ? &b : nullptr, s.mask ? &mask : nullptr, s.group, s.offset_group,
                                              s.strides, s.pads, s.dil);
    const std::vector<Tensor> in{x, w, offset, s.bias ? b : Tensor(), s.mask ? mask : Tensor()};
    expect_close(run("DeformConv", 22, in, a), want, 1e-12, 1e-12);
    std::vector<Tensor> in32;
    for (const Tensor& t : in) in32.push_back(t.defined() ? t.cast(DataType::Float32) : Tensor());
    expect_close(run("DeformConv", 22, in32, a).cast(DataType::Float64), want, 1e-4, 1e-4);
  }
}

TEST(DeformConv, BadShapesAreErrors) {
  const Tensor x = random_f64({1, 2, 4, 4}, 1), w = random_f64({2, 2, 2, 2}, 2), off = random_f64({1, 8, 3, 3}, 3);
  EXPECT_TRUE(throws_with([&] { run("DeformConv", 19, {x, w, random_f64({1, 8, 2, 3}, 3)}); }, "offset"));
  EXPECT_TRUE(throws_with([&] { run("DeformConv", 19, {x, w, off, Tensor(), random_f64({1, 3, 3, 3}, 4)}); }, "mask"));
  EXPECT_TRUE(throws_with([&] { run("DeformConv", 19, {x, w, off}, {attr("group", int64_t{2})}); }, "group"));
  EXPECT_TRUE(throws_with([&] { run("DeformConv", 19, {x, w, off}, {attr("kernel_shape", Ints{3, 3})}); }, "kernel_shape"));
  EXPECT_TRUE(throws_with([&] { run("DeformConv", 19, {x, w, off, random_f64({3}, 5)}); }, "bias"));
}

// ---------------------------------------------------------------------------------------------
// Col2Im

TEST(Col2Im, SumsTheColumnsIntoTheImage) {
  // image 5x4, block 2x3, dilations [2, 1], strides [1, 2], pads [1, 0, 0, 1]:
  // blocks (5 + 1 - 3) / 1 + 1 = 4 rows and (4 + 1 - 3) / 2 + 1 = 2 columns.
  const Ints image{5, 4}, block{2, 3}, dil{2, 1}, str{1, 2}, pads{1, 0, 0, 1};
  const Tensor in = random_f64({2, 3 * 6, 8}, 91);
  const auto v = in.to_double_vector();
  std::vector<double> want(2 * 3 * 20, 0.0);
  for (int64_t n = 0; n < 2; ++n) {
    for (int64_t c = 0; c < 3; ++c) {
      for (int64_t ki = 0; ki < 2; ++ki) {
        for (int64_t kj = 0; kj < 3; ++kj) {
          for (int64_t bi = 0; bi < 4; ++bi) {
            for (int64_t bj = 0; bj < 2; ++bj) {
              const int64_t h = bi * str[0] - pads[0] + ki * dil[0], w = bj * str[1] - pads[1] + kj * dil[1];
              if (h < 0 || h >= 5 || w < 0 || w >= 4) continue;
              want[static_cast<size_t>(((n * 3 + c) * 5 + h) * 4 + w)] +=
                  v[static_cast<size_t>((n * 18 + c * 6 + ki * 3 + kj) * 8 + bi * 2 + bj)];
            }
          }
        }
      }
    }
  }
  const Attrs a{attr("dilations", dil), attr("strides", str), attr("pads", pads)};
  expect_close(run("Col2Im", 18, {in, i64(image), i64(block)}, a), f64({2, 3, 5, 4}, want), 1e-12, 1e-12);
  // int32: exact sums.
  const Tensor ones = Tensor::from_vector<int32_t>({1, 4, 4}, std::vector<int32_t>(16, 1));
  const Tensor counts = run("Col2Im", 18, {ones, i64({3, 3}), i64({2, 2})});
  EXPECT_EQ(counts.to_int64_vector("y"), (Ints{1, 2, 1, 2, 4, 2, 1, 2, 1}));
}

TEST(Col2Im, BadShapesAreErrors) {
  const Tensor in = random_f64({1, 4, 4}, 1);
  EXPECT_TRUE(throws_with([&] { run("Col2Im", 18, {in, i64({3, 3}), i64({2, 2, 1})}); }, "block_shape"));
  EXPECT_TRUE(throws_with([&] { run("Col2Im", 18, {in, i64({4, 3}), i64({2, 2})}); }, "expected [N, C * 4, 6]"));
  EXPECT_TRUE(throws_with([&] { run("Col2Im", 18, {in, i64({1, 3}), i64({2, 2})}); }, "does not fit"));
  EXPECT_TRUE(throws_with([&] { run("Col2Im", 18, {in, i64({3, 3}), i64({2, 2})}, {attr("pads", Ints{1, 1})}); }, "'pads'"));
}

// ---------------------------------------------------------------------------------------------
// CenterCropPad

TEST(CenterCropPad, CropsAndPadsAroundTheCenter) {
  // [5, 4] -> [2, 7]: rows from floor(3 / 2) = 1; columns padded floor(3 / 2) = 1 before, 2 after.
  const Tensor x = testing::iota({5, 4});
  const Tensor y = run("CenterCropPad", 18, {x, i64({2, 7})});
  std::vector<float> want(14, 0.0f);
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < 4; ++j) want[static_cast<size_t>(i * 7 + j + 1)] = static_cast<float>((i + 1) * 4 + j);
  }
  EXPECT_EQ(y.shape(), (Shape{2, 7}));
  EXPECT_EQ(y.to_double_vector(), Tensor::from_vector<float>({2, 7}, want).to_double_vector());
  // Axes (negative), int32 shape, bool and int8 data; an axis not listed stays.
  const Tensor b = Tensor::from_vector<bool>({2, 3, 1}, {true, false, true, true, true, false});
  const Tensor yb = run("CenterCropPad", 18, {b, Tensor::from_vector<int32_t>({2}, {3, 1})}, {attr("axes", Ints{-1, 1})});
  EXPECT_EQ(yb.shape(), (Shape{2, 1, 3}));
  EXPECT_EQ(yb.to_int64_vector("y"), (Ints{0, 0, 0, 0, 1, 0}));  // x[:, 1, :] centered in 3 (pad 1 before)
  const Tensor i8 = Tensor::from_vector<int8_t>({3}, {1, 2, 3});
  EXPECT_EQ(run("CenterCropPad", 18, {i8, i64({6})}).to_int64_vector("y"), (Ints{0, 1, 2, 3, 0, 0}));
  EXPECT_EQ(run("CenterCropPad", 18, {i8, i64({1})}).to_int64_vector("y"), (Ints{2}));
}

TEST(CenterCropPad, BadShapesAndAxesAreErrors) {
  const Tensor x = testing::iota({2, 3});
  EXPECT_TRUE(throws_with([&] { run("CenterCropPad", 18, {x, i64({2})}); }, "one value per axis"));
  EXPECT_TRUE(throws_with([&] { run("CenterCropPad", 18, {x, i64({2, 2})}, {attr("axes", Ints{0, 2})}); }, "'axes'"));
  EXPECT_TRUE(throws_with([&] { run("CenterCropPad", 18, {x, i64({2, 2})}, {attr("axes", Ints{0, -2})}); }, "'axes'"));
  EXPECT_TRUE(throws_with([&] { run("CenterCropPad", 18, {x, i64({2, -1})}); }, "negative"));
}

// ---------------------------------------------------------------------------------------------
// Upsample

TEST(Upsample, NearestAndLinearWithAsymmetricCoordinates) {
  const Tensor x = random_f64({1, 2, 3, 2}, 101);
  const auto v = x.to_double_vector();
  const std::vector<float> scales{1, 1, 2.5f, 1.5f};  // output [1, 2, 7, 3]
  std::vector<double> nearest, linear;
  for (int64_t c = 0; c < 2; ++c) {
    for (int64_t h = 0; h < 7; ++h) {
      for (int64_t w = 0; w < 3; ++w) {
        const double sh = static_cast<double>(h) / 2.5, sw = static_cast<double>(w) / 1.5;
        const int64_t h0 = static_cast<int64_t>(std::floor(sh)), w0 = static_cast<int64_t>(std::floor(sw));
        const auto at = [&](int64_t i, int64_t j) { return v[static_cast<size_t>((c * 3 + std::min<int64_t>(i, 2)) * 2 + std::min<int64_t>(j, 1))]; };
        nearest.push_back(at(h0, w0));
        const double th = sh - static_cast<double>(h0), tw = sw - static_cast<double>(w0);
        linear.push_back((1 - th) * ((1 - tw) * at(h0, w0) + tw * at(h0, w0 + 1)) + th * ((1 - tw) * at(h0 + 1, w0) + tw * at(h0 + 1, w0 + 1)));
      }
    }
  }
  const Tensor s9 = f32({4}, scales);
  expect_close(run("Upsample", 9, {x, s9}), f64({1, 2, 7, 3}, nearest), 0, 0);
  expect_close(run("Upsample", 7, {x}, {attr("scales", scales)}), f64({1, 2, 7, 3}, nearest), 0, 0);
  expect_close(run("Upsample", 9, {x, s9}, {attr("mode", std::string("linear"))}), f64({1, 2, 7, 3}, linear), 1e-12, 1e-12);
  expect_close(run("Upsample", 8, {x.cast(DataType::Float32)}, {attr("mode", std::string("linear")), attr("scales", scales)})
                   .cast(DataType::Float64),
               f64({1, 2, 7, 3}, linear), 1e-6, 1e-6);
  // Nearest moves any element type.
  const Tensor b = Tensor::from_vector<bool>({2}, {true, false});
  EXPECT_EQ(run("Upsample", 9, {b, f32({1}, {2})}).to_int64_vector("y"), (Ints{1, 1, 0, 0}));
}

TEST(Upsample, BadScalesAndDeprecatedVersionAreErrors) {
  const Tensor x = random_f64({1, 1, 2, 2}, 1);
  EXPECT_TRUE(throws_with([&] { run("Upsample", 9, {x, f32({4}, {1, 1, 0.5f, 2})}); }, ">= 1"));
  EXPECT_TRUE(throws_with([&] { run("Upsample", 9, {x, f32({3}, {1, 1, 2})}); }, "rank"));
  EXPECT_TRUE(throws_with([&] { run("Upsample", 7, {x}); }, "scales"));
  EXPECT_TRUE(throws_with([&] { run("Upsample", 9, {x, f32({4}, {1, 1, 2, 2})}, {attr("mode", std::string("cubic"))}); }, "'mode'"));
  // Upsample-10 is deprecated: no kernel serves it.
  EXPECT_THROW(run("Upsample", 10, {x, f32({4}, {1, 1, 2, 2})}), Error);
}

// ---------------------------------------------------------------------------------------------
// The backward ops at the op versions whose Gradient expansion needs newer rows than the
// registry may have (gradient_rules_test.cpp skips those cases): each ai.onnxtrain <Op>Grad,
// run directly with dY = R, against central differences of sum(R * forward).

// d sum(R * op(inputs)) / d inputs[i] by central differences, the forward at `opset`.
Tensor numeric_gradient(const std::string& op, int opset, const Attrs& attrs, std::vector<Tensor> inputs, size_t i,
                        const Tensor& r) {
  const auto rv = r.to_double_vector();
  return testing::central_differences(
      [&](const Tensor& v) {
        inputs[i] = v;
        const auto y = run(op, opset, inputs, attrs).to_double_vector();
        double sum = 0;
        for (size_t k = 0; k < y.size(); ++k) sum += rv[k] * y[k];
        return sum;
      },
      inputs[i]);
}

TEST(BackwardOps, MatchFiniteDifferencesAtTheNewerVersions) {
  struct Check {
    std::string op;
    int opset;
    Attrs attrs;
    std::vector<Tensor> inputs;
    std::vector<size_t> wrt;   // forward inputs whose gradients the backward op returns, in order
    std::vector<int> outputs;  // the backward op's output index for each
    std::vector<size_t> grad_inputs;  // forward inputs the backward op reads after dY
  };
  std::vector<Check> checks;
  for (const char* mode : {"linear", "cubic"}) {
    checks.push_back({"GridSample", 20, {attr("mode", std::string(mode)), attr("padding_mode", std::string("reflection"))},
                      {random_f64({1, 2, 2, 3, 3}, 1), random_f64({1, 2, 1, 2, 3}, 2, 1.2)}, {0, 1}, {0, 1}, {0, 1}});
  }
  checks.push_back({"GridSample", 22, {attr("mode", std::string("cubic")), attr("align_corners", int64_t{1})},
                    {random_f64({2, 1, 4}, 3), random_f64({2, 3, 1}, 4, 0.9)}, {0, 1}, {0, 1}, {0, 1}});
  checks.push_back({"AffineGrid", 20, {}, {random_f64({2, 2, 3}, 5), i64({2, 1, 3, 4})}, {0}, {0}, {1}});
  checks.push_back({"AffineGrid", 20, {attr("align_corners", int64_t{1})}, {random_f64({1, 3, 4}, 6), i64({1, 2, 2, 3, 2})}, {0}, {0}, {1}});
  checks.push_back({"DeformConv", 19, {attr("offset_group", int64_t{2}), attr("pads", Ints{1, 0, 0, 1}), attr("strides", Ints{1, 2})},
                    {random_f64({1, 2, 3, 4}, 7), random_f64({2, 2, 2, 2}, 8), random_f64({1, 16, 3, 2}, 9, 1.5), random_f64({2}, 10),
                     random_f64({1, 8, 3, 2}, 11)},
                    {0, 1, 2, 3, 4}, {0, 1, 2, 3, 4}, {0, 1, 2, 4}});
  checks.push_back({"DeformConv", 22, {attr("group", int64_t{2})}, {random_f64({1, 2, 3}, 12), random_f64({2, 1, 2}, 13), random_f64({1, 2, 2}, 14, 0.8)},
                    {0, 1, 2}, {0, 1, 2}, {0, 1, 2}});
  for (const Check& c : checks) {
    SCOPED_TRACE(c.op + "-" + std::to_string(c.opset));
    const Tensor y = run(c.op, c.opset, c.inputs, c.attrs);
    const Tensor r = random_f64(y.shape(), 99);
    std::vector<Tensor> grad_in{r};
    for (size_t i : c.grad_inputs) grad_in.push_back(c.inputs[i]);
    int outputs = 0;
    for (int o : c.outputs) outputs = std::max(outputs, o + 1);
    const auto got = run_node(NodeSpec{c.op + "Grad", "ai.onnxtrain", 1, c.attrs, outputs}, grad_in);
    for (size_t k = 0; k < c.wrt.size(); ++k) {
      SCOPED_TRACE("input " + std::to_string(c.wrt[k]));
      expect_close(got[static_cast<size_t>(c.outputs[k])], numeric_gradient(c.op, c.opset, c.attrs, c.inputs, c.wrt[k], r), 1e-5, 1e-6);
    }
  }
}

}  // namespace
}  // namespace onnxtrain
