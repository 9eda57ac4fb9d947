// Unit tests of signal.cpp (DFT, STFT, DFTGrad), windows.cpp (Hann/Hamming/BlackmanWindow,
// MelWeightMatrix), linalg.cpp (Det, DetGrad) and cumprod.cpp (CumProd). Expected values come
// from the definitions evaluated directly in the test: the O(n^2) DFT sum, the window formulas,
// cofactor expansions, running products; and errors for bad input.
#include <cmath>
#include <complex>
#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

#include "onnxtrain/error.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::attr;
using testing::throws_with;
using testing::expect_close;
using testing::NodeSpec;
using testing::run1;
using testing::run_node;
using Cx = std::complex<double>;
using Attrs = std::vector<onnx::AttributeProto>;

Tensor f64(const Shape& s, const std::vector<double>& v) { return Tensor::from_vector<double>(s, v); }
Tensor i64s(int64_t v) { return Tensor::scalar<int64_t>(v); }

// Complex values (or real ones, parts = 1) as a tensor [..., parts] of float64.
Tensor complex_tensor(Shape shape, const std::vector<Cx>& v, int64_t parts = 2) {
  shape.push_back(parts);
  std::vector<double> flat;
  for (const Cx& c : v) {
    flat.push_back(c.real());
    if (parts == 2) flat.push_back(c.imag());
  }
  return f64(shape, flat);
}

std::vector<Cx> random_complex(size_t n, uint32_t seed, bool real = false) {
  const Tensor r = testing::random_f64({static_cast<int64_t>(2 * n)}, seed);
  std::vector<Cx> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = {r.data<double>()[2 * i], real ? 0.0 : r.data<double>()[2 * i + 1]};
  return v;
}

// The definition: x cut or zero-padded to n, y[k] = sum_j x[j] e^(-+2 pi i jk/n), / n when inverse.
std::vector<Cx> naive_dft(const std::vector<Cx>& x, int64_t n, bool inverse) {
  std::vector<Cx> y(static_cast<size_t>(n));
  const double sign = inverse ? 1 : -1;
  for (int64_t k = 0; k < n; ++k) {
    Cx sum = 0;
    for (int64_t j = 0; j < std::min<int64_t>(n, static_cast<int64_t>(x.size())); ++j) {
      const double angle = sign * 2 * std::numbers::pi * static_cast<double>((j * k) % n) / static_cast<double>(n);
      sum += x[static_cast<size_t>(j)] * Cx(std::cos(angle), std::sin(angle));
    }
    y[static_cast<size_t>(k)] = inverse ? sum / static_cast<double>(n) : sum;
  }
  return y;
}

Tensor dft(const Tensor& x, const Attrs& attrs, const Tensor& length = Tensor(), int opset = 17, const Tensor& axis = Tensor()) {
  std::vector<Tensor> in{x, length};
  if (axis.defined()) in.push_back(axis);
  return run_node(NodeSpec{"DFT", "", opset, attrs, 1}, in)[0];
}

// ---------------------------------------------------------------- DFT

TEST(Dft, MatchesTheDefinitionForPowerOfTwoPrimeAndCompositeLengths) {
  for (const int64_t n : {1, 2, 3, 7, 8, 12, 64, 100, 127, 256}) {
    const std::vector<Cx> x = random_complex(static_cast<size_t>(n), static_cast<uint32_t>(n));
    const Tensor y = dft(complex_tensor({1, n}, x), {});
    expect_close(y, complex_tensor({1, n}, naive_dft(x, n, false)), 1e-9, 1e-9);
  }
}

TEST(Dft, LongSignalsRoundTripAndMatchTheDefinitionAtSampledBins) {
  // 10007 is prime (Bluestein with m = 32768); 4096 is radix-2.
  for (const int64_t n : {10007, 4096}) {
    const std::vector<Cx> x = random_complex(static_cast<size_t>(n), 5);
    const Tensor y = dft(complex_tensor({1, n}, x), {});
    for (const int64_t k : {int64_t{0}, int64_t{1}, n / 3, n - 1}) {
      Cx want = 0;
      for (int64_t j = 0; j < n; ++j) {
        const double angle = -2 * std::numbers::pi * static_cast<double>((j * k) % n) / static_cast<double>(n);
        want += x[static_cast<size_t>(j)] * Cx(std::cos(angle), std::sin(angle));
      }
      EXPECT_NEAR(y.data<double>()[2 * k], want.real(), 1e-8) << n << " bin " << k;
      EXPECT_NEAR(y.data<double>()[2 * k + 1], want.imag(), 1e-8) << n << " bin " << k;
    }
    expect_close(dft(y, {attr("inverse", int64_t{1})}), complex_tensor({1, n}, x), 1e-9, 1e-11);
  }
}

TEST(Dft, TransformsAlongAnyAxisOfAFloat32Batch) {
  // [2, 3, 5, 1] real float32 along axis 1 (length 3) and 2 (length 5): every line on its own.
  std::vector<float> v(30);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(std::sin(0.7 * static_cast<double>(i)));
  const Tensor x = Tensor::from_vector<float>({2, 3, 5, 1}, v);
  for (const int64_t axis : {1, 2}) {
    const Tensor y = dft(x, {attr("axis", axis)});
    ASSERT_EQ(y.shape(), (Shape{2, 3, 5, 2}));
    const int64_t n = axis == 1 ? 3 : 5;
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t other = 0; other < (axis == 1 ? 5 : 3); ++other) {
        std::vector<Cx> line(static_cast<size_t>(n));
        auto index = [&](int64_t t) { return axis == 1 ? (b * 3 + t) * 5 + other : (b * 3 + other) * 5 + t; };
        for (int64_t t = 0; t < n; ++t) line[static_cast<size_t>(t)] = v[static_cast<size_t>(index(t))];
        const std::vector<Cx> want = naive_dft(line, n, false);
        for (int64_t k = 0; k < n; ++k) {
          EXPECT_NEAR(y.data<float>()[2 * index(k)], want[static_cast<size_t>(k)].real(), 1e-5);
          EXPECT_NEAR(y.data<float>()[2 * index(k) + 1], want[static_cast<size_t>(k)].imag(), 1e-5);
        }
      }
    }
  }
}

TEST(Dft, OneSidedInverseAndLengths) {
  const std::vector<Cx> real = random_complex(6, 11, true);
  // One-sided: bins 0..N/2 of the real signal, N = 6 or the dft_length 9 (zero-padded) or 4 (cut).
  for (const int64_t n : {6, 9, 4}) {
    const Tensor y = dft(complex_tensor({1, 6}, real, 1), {attr("onesided", int64_t{1})}, i64s(n));
    std::vector<Cx> want = naive_dft(real, n, false);
    want.resize(static_cast<size_t>(n / 2 + 1));
    expect_close(y, complex_tensor({1, n / 2 + 1}, want), 1e-9, 1e-12);
  }
  // Inverse of a complex signal, scaled by 1/N; of a real one too.
  const std::vector<Cx> c = random_complex(5, 12);
  expect_close(dft(complex_tensor({1, 5}, c), {attr("inverse", int64_t{1})}), complex_tensor({1, 5}, naive_dft(c, 5, true)),
               1e-9, 1e-12);
  expect_close(dft(complex_tensor({1, 6}, real, 1), {attr("inverse", int64_t{1})}, i64s(8)),
               complex_tensor({1, 8}, naive_dft(real, 8, true)), 1e-9, 1e-12);
}

TEST(Dft, InverseOneSidedIsNumpysIrfft) {
  // bins [K] -> real [N]: the first N/2 + 1 bins completed by conjugate symmetry; the imaginary
  // parts of bins 0 and N/2 do not matter.
  const std::vector<Cx> bins = random_complex(4, 13);
  const Attrs irfft{attr("inverse", int64_t{1}), attr("onesided", int64_t{1})};
  for (const int64_t n : {6, 7, 4}) {  // default 2 (K - 1); odd; bins cut to 3
    std::vector<Cx> full(static_cast<size_t>(n));
    for (int64_t k = 0; k <= n / 2; ++k) full[static_cast<size_t>(k)] = bins[static_cast<size_t>(k)];
    for (int64_t k = n / 2 + 1; k < n; ++k) full[static_cast<size_t>(k)] = std::conj(full[static_cast<size_t>(n - k)]);
    std::vector<Cx> want = naive_dft(full, n, true);
    for (Cx& w : want) w = w.real();
    const Tensor y = dft(complex_tensor({1, 4}, bins), irfft, n == 6 ? Tensor() : i64s(n));
    expect_close(y, complex_tensor({1, n}, want, 1), 1e-9, 1e-12);
  }
}

TEST(Dft, Opset20TakesTheAxisAsAnInput) {
  const std::vector<Cx> x = random_complex(12, 14);
  const Tensor in = complex_tensor({3, 4}, x);
  // Default -2: the last signal axis (length 4); axis 0: length 3.
  const Tensor last = dft(in, {}, Tensor(), 20);
  const Tensor first = dft(in, {}, Tensor(), 20, i64s(0));
  for (int64_t r = 0; r < 3; ++r) {
    const std::vector<Cx> row(x.begin() + r * 4, x.begin() + r * 4 + 4);
    const std::vector<Cx> want = naive_dft(row, 4, false);
    for (int64_t k = 0; k < 4; ++k) EXPECT_NEAR(last.data<double>()[2 * (r * 4 + k)], want[static_cast<size_t>(k)].real(), 1e-12);
  }
  for (int64_t col = 0; col < 4; ++col) {
    const std::vector<Cx> column{x[static_cast<size_t>(col)], x[static_cast<size_t>(4 + col)], x[static_cast<size_t>(8 + col)]};
    const std::vector<Cx> want = naive_dft(column, 3, false);
    for (int64_t k = 0; k < 3; ++k) {
      EXPECT_NEAR(first.data<double>()[2 * (k * 4 + col) + 1], want[static_cast<size_t>(k)].imag(), 1e-12);
    }
  }
}

TEST(Dft, BadInputIsAnError) {
  const Tensor c = complex_tensor({2, 4}, random_complex(8, 1));
  const Tensor r = complex_tensor({2, 4}, random_complex(8, 1, true), 1);
  EXPECT_TRUE(throws_with([&] { dft(c, {attr("axis", int64_t{2})}); }, "outside"));
  EXPECT_TRUE(throws_with([&] { dft(c, {}, Tensor(), 20, i64s(-1)); }, "the last dim holds the parts"));
  EXPECT_TRUE(throws_with([&] { dft(c, {attr("onesided", int64_t{1})}); }, "must be real"));
  EXPECT_TRUE(throws_with([&] { dft(r, {attr("onesided", int64_t{1}), attr("inverse", int64_t{1})}); }, "must be complex"));
  EXPECT_TRUE(throws_with([&] { dft(c, {}, i64s(0)); }, "must be positive"));
  EXPECT_TRUE(throws_with([&] { dft(c, {}, Tensor::scalar(4.0f)); }, "int32 or int64 scalar"));
  EXPECT_TRUE(throws_with([&] { dft(f64({2, 4, 3}, std::vector<double>(24, 0.0)), {}); }, "must end in a dim of 1"));
  EXPECT_TRUE(throws_with([&] { dft(c, {attr("inverse", int64_t{2})}); }, "must be 0 or 1"));
}

// ---------------------------------------------------------------- DFTGrad

// <DFT(x), g> = <x, DFTGrad(g)> for real inner products over the parts: the transpose.
double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.data<double>()[i] * b.data<double>()[i];
  return s;
}

TEST(DftGrad, IsTheTransposeOfDft) {
  struct Mode {
    Attrs attrs;
    Shape x;
    int64_t length;  // 0: none
  };
  const std::vector<Mode> modes{
      {{}, {2, 5, 2}, 0},
      {{}, {2, 5, 1}, 8},
      {{attr("onesided", int64_t{1})}, {2, 6, 1}, 5},
      {{attr("inverse", int64_t{1})}, {2, 5, 2}, 3},
      {{attr("inverse", int64_t{1}), attr("onesided", int64_t{1})}, {2, 4, 2}, 0},
      {{attr("inverse", int64_t{1}), attr("onesided", int64_t{1})}, {2, 4, 2}, 7},
  };
  uint32_t seed = 30;
  for (const Mode& m : modes) {
    const Tensor x = testing::random_f64(m.x, ++seed);
    const Tensor len = m.length ? i64s(m.length) : Tensor();
    const Tensor y = dft(x, m.attrs, len);
    const Tensor g = testing::random_f64(y.shape(), ++seed);
    Attrs grad_attrs = m.attrs;
    grad_attrs.push_back(attr("axis", int64_t{1}));
    const Tensor gx = run_node(NodeSpec{"DFTGrad", "ai.onnxtrain", 1, grad_attrs, 1}, {x, g, len})[0];
    ASSERT_EQ(gx.shape(), x.shape());
    EXPECT_NEAR(dot(y, g), dot(x, gx), 1e-9) << "mode " << (&m - modes.data());
  }
}

TEST(DftGrad, RejectsAGradientShapedUnlikeTheOutput) {
  const Tensor x = testing::random_f64({2, 5, 2}, 1);
  EXPECT_TRUE(throws_with(
      [&] { run_node(NodeSpec{"DFTGrad", "ai.onnxtrain", 1, {attr("axis", int64_t{1})}, 1}, {x, testing::random_f64({2, 4, 2}, 2)}); },
      "is not shaped like the DFT"));
}

// ---------------------------------------------------------------- STFT

TEST(Stft, FramesAreWindowedTransforms) {
  const int64_t length = 20, step = 3, n = 8;
  const Tensor signal = testing::random_f64({2, length, 1}, 40);
  const Tensor window = testing::random_f64({n}, 41);
  for (const int64_t onesided : {1, 0}) {
    const Tensor y = run_node(NodeSpec{"STFT", "", 17, {attr("onesided", onesided)}, 1},
                              {signal, i64s(step), window, i64s(n)})[0];
    const int64_t frames = (length - n) / step + 1, bins = onesided ? n / 2 + 1 : n;
    ASSERT_EQ(y.shape(), (Shape{2, frames, bins, 2}));
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t f = 0; f < frames; ++f) {
        std::vector<Cx> frame(static_cast<size_t>(n));
        for (int64_t j = 0; j < n; ++j) {
          frame[static_cast<size_t>(j)] = signal.data<double>()[b * length + f * step + j] * window.data<double>()[j];
        }
        const std::vector<Cx> want = naive_dft(frame, n, false);
        for (int64_t k = 0; k < bins; ++k) {
          const double* got = y.data<double>() + ((b * frames + f) * bins + k) * 2;
          EXPECT_NEAR(got[0], want[static_cast<size_t>(k)].real(), 1e-12);
          EXPECT_NEAR(got[1], want[static_cast<size_t>(k)].imag(), 1e-12);
        }
      }
    }
  }
}

TEST(Stft, FrameLengthDefaultsAndErrors) {
  const Tensor signal = testing::random_f64({1, 10, 1}, 42);
  // No window: a rectangular one of frame_length; neither: the whole signal in one frame.
  const Tensor rect = run_node(NodeSpec{"STFT", "", 17, {}, 1}, {signal, i64s(2), Tensor(), i64s(4)})[0];
  EXPECT_EQ(rect.shape(), (Shape{1, 4, 3, 2}));
  const Tensor whole = run_node(NodeSpec{"STFT", "", 17, {}, 1}, {signal, i64s(1)})[0];
  ASSERT_EQ(whole.shape(), (Shape{1, 1, 6, 2}));
  double sum = 0;
  for (int64_t j = 0; j < 10; ++j) sum += signal.data<double>()[j];
  EXPECT_NEAR(whole.data<double>()[0], sum, 1e-12);
  const Tensor complex_signal = testing::random_f64({1, 10, 2}, 43);
  EXPECT_TRUE(throws_with([&] { run_node(NodeSpec{"STFT", "", 17, {}, 1}, {complex_signal, i64s(1), Tensor(), i64s(4)}); },
                          "one-sided STFT needs a real signal"));
  EXPECT_TRUE(throws_with(
      [&] { run_node(NodeSpec{"STFT", "", 17, {}, 1}, {signal, i64s(1), testing::random_f64({5}, 1), i64s(4)}); },
      "has 5 values"));
  EXPECT_TRUE(throws_with([&] { run_node(NodeSpec{"STFT", "", 17, {}, 1}, {signal, i64s(0), Tensor(), i64s(4)}); },
                          "must be positive"));
  EXPECT_TRUE(throws_with([&] { run_node(NodeSpec{"STFT", "", 17, {}, 1}, {signal, i64s(1), Tensor(), i64s(11)}); },
                          "frame length 11"));
}

// ---------------------------------------------------------------- windows

Tensor window(const std::string& op, int64_t size, Attrs attrs = {}) {
  return run1(op, 17, std::move(attrs), {Tensor::scalar<int32_t>(static_cast<int32_t>(size))});
}

TEST(Windows, FollowTheirFormulas) {
  const double pi = std::numbers::pi;
  const int64_t size = 9;
  for (const int64_t periodic : {1, 0}) {
    const double n = periodic ? size : size - 1;
    const Tensor hann = window("HannWindow", size, {attr("periodic", periodic), attr("output_datatype", int64_t{11})});
    const Tensor hamming = window("HammingWindow", size, {attr("periodic", periodic), attr("output_datatype", int64_t{11})});
    const Tensor blackman = window("BlackmanWindow", size, {attr("periodic", periodic), attr("output_datatype", int64_t{11})});
    for (int64_t k = 0; k < size; ++k) {
      const double t = static_cast<double>(k) / n;
      EXPECT_NEAR(hann.data<double>()[k], std::pow(std::sin(pi * t), 2), 1e-15);
      EXPECT_NEAR(hamming.data<double>()[k], 25.0 / 46 - 21.0 / 46 * std::cos(2 * pi * t), 1e-15);
      EXPECT_NEAR(blackman.data<double>()[k], 0.42 - 0.5 * std::cos(2 * pi * t) + 0.08 * std::cos(4 * pi * t), 1e-15);
      if (!periodic) {
        EXPECT_NEAR(hann.data<double>()[k], hann.data<double>()[size - 1 - k], 1e-15);
      }
    }
  }
}

TEST(Windows, OutputTypesSizesAndErrors) {
  const Tensor f = window("HannWindow", 4);  // default float32, periodic: [0, 0.5, 1, 0.5]
  EXPECT_EQ(f.dtype(), DataType::Float32);
  expect_close(f, testing::f32({4}, {0, 0.5f, 1, 0.5f}), 0, 1e-7);
  const Tensor ints = window("HannWindow", 4, {attr("output_datatype", int64_t{6})});  // int32: truncated
  EXPECT_EQ(ints.to_int64_vector("w"), (std::vector<int64_t>{0, 0, 1, 0}));
  EXPECT_EQ(window("HammingWindow", 0).numel(), 0);
  EXPECT_EQ(window("BlackmanWindow", 1, {attr("periodic", int64_t{0})}).to_double_vector(), std::vector<double>{1.0});
  EXPECT_TRUE(throws_with([] { window("HannWindow", -1); }, "must be >= 0"));
  EXPECT_TRUE(throws_with([] { window("HannWindow", 3, {attr("output_datatype", int64_t{9})}); }, "numeric type"));
  EXPECT_TRUE(throws_with([] { window("HannWindow", 3, {attr("periodic", int64_t{2})}); }, "must be 0 or 1"));
}

TEST(MelWeightMatrix, TrianglesPeakAtOneBetweenTheirEdges) {
  // 8 mel bins over [100, 3000] Hz of a 64-point DFT at 8 kHz: 33 spectrogram bins.
  const Tensor w = run1("MelWeightMatrix", 17, {attr("output_datatype", int64_t{11})},
                        {Tensor::scalar<int32_t>(8), Tensor::scalar<int32_t>(64), Tensor::scalar<int32_t>(8000),
                         Tensor::scalar(100.0f), Tensor::scalar(3000.0f)});
  ASSERT_EQ(w.shape(), (Shape{33, 8}));
  auto mel = [](double f) { return 2595 * std::log10(1 + f / 700); };
  const double step = (mel(3000.0) - mel(100.0)) / 10;
  for (int64_t i = 0; i < 8; ++i) {
    int64_t edge[3];
    for (int e = 0; e < 3; ++e) {
      const double hz = 700 * (std::pow(10.0, (mel(100.0) + static_cast<double>(i + e) * step) / 2595) - 1);
      edge[e] = static_cast<int64_t>(std::floor(65 * hz / 8000));
    }
    for (int64_t j = 0; j < 33; ++j) {
      double want = 0;
      if (j >= edge[0] && j <= edge[1]) want = edge[1] == edge[0] ? 1.0 : double(j - edge[0]) / double(edge[1] - edge[0]);
      if (j > edge[1] && j < edge[2]) want = double(edge[2] - j) / double(edge[2] - edge[1]);
      EXPECT_NEAR(w.data<double>()[j * 8 + i], want, 1e-15) << "bin " << j << " filter " << i;
    }
    EXPECT_EQ(w.data<double>()[edge[1] * 8 + i], 1.0);
  }
  auto mel_matrix = [](float upper, int32_t mels) {
    return run1("MelWeightMatrix", 17, {}, {Tensor::scalar<int32_t>(mels), Tensor::scalar<int32_t>(64),
                                            Tensor::scalar<int32_t>(8000), Tensor::scalar(0.0f), Tensor::scalar(upper)});
  };
  EXPECT_TRUE(throws_with([&] { mel_matrix(6000, 8); }, "past the last of the 33"));
  EXPECT_TRUE(throws_with([&] { mel_matrix(3000, 0); }, "must be positive"));
}

// ---------------------------------------------------------------- Det and DetGrad

TEST(Det, MatchesCofactorExpansions) {
  // 2x2 ad - bc; 3x3 by the rule of Sarrus; a permutation matrix (-1); a singular one (0).
  const Tensor x = f64({4, 3, 3}, {2, -1, 0.5, 3, 4, -2, 1, 0, 6,     //
                                   0, 1, 0, 1, 0, 0, 0, 0, 1,         //
                                   1, 2, 3, 2, 4, 6, 7, 8, 9,         //
                                   -3, 0.25, 1, 2, 2, 2, 0.5, -1, 4});
  std::vector<double> want;
  for (int64_t b = 0; b < 4; ++b) {
    const double* m = x.data<double>() + b * 9;
    want.push_back(m[0] * m[4] * m[8] + m[1] * m[5] * m[6] + m[2] * m[3] * m[7] - m[2] * m[4] * m[6] -
                   m[0] * m[5] * m[7] - m[1] * m[3] * m[8]);
  }
  expect_close(run1("Det", 17, {}, {x}), f64({4}, want), 1e-12, 1e-12);
  expect_close(run1("Det", 17, {}, {f64({2, 2}, {3, 7, -2, 5})}), Tensor::scalar(29.0), 1e-12, 0);
  expect_close(run1("Det", 22, {}, {testing::f32({1, 1, 1}, {-4})}), testing::f32({1}, {-4}), 0, 0);
  EXPECT_EQ(run1("Det", 17, {}, {f64({2, 0, 0}, {})}).to_double_vector(), (std::vector<double>{1, 1}));
  EXPECT_TRUE(throws_with([] { run1("Det", 17, {}, {f64({2, 3}, std::vector<double>(6, 1))}); }, "square matrices"));
}

TEST(DetGrad, IsTheCofactorMatrixTimesDy) {
  // Nonsingular 2x2: cof = [[d, -c], [-b, a]]; the singular rank-2 matrix: each cofactor from its minor.
  const Tensor two = f64({2, 2}, {3, 7, -2, 5});
  const Tensor g2 = run_node(NodeSpec{"DetGrad", "ai.onnxtrain", 1, {}, 1}, {two, Tensor::scalar(2.0)})[0];
  expect_close(g2, f64({2, 2}, {10, 4, -14, 6}), 1e-12, 1e-12);
  const std::vector<double> s{1, 2, 3, 2, 4, 6, 7, 8, 10};
  std::vector<double> cof(9);
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) {
      const int r0 = i == 0 ? 1 : 0, r1 = i == 2 ? 1 : 2, c0 = j == 0 ? 1 : 0, c1 = j == 2 ? 1 : 2;
      const double minor = s[r0 * 3 + c0] * s[r1 * 3 + c1] - s[r0 * 3 + c1] * s[r1 * 3 + c0];
      cof[i * 3 + j] = (i + j) % 2 ? -minor : minor;
    }
  }
  const Tensor g3 = run_node(NodeSpec{"DetGrad", "ai.onnxtrain", 1, {}, 1}, {f64({1, 3, 3}, s), f64({1}, {1})})[0];
  expect_close(g3, f64({1, 3, 3}, cof), 1e-12, 1e-12);
  EXPECT_TRUE(throws_with([&] { run_node(NodeSpec{"DetGrad", "ai.onnxtrain", 1, {}, 1}, {two, f64({1}, {1})}); },
                          "must be shaped like Det"));
}

// ---------------------------------------------------------------- CumProd

TEST(CumProd, RunningProductsInEveryMode) {
  // [2, 3, 2] along axis 1, against the running products written out.
  const Tensor x = f64({2, 3, 2}, {1, 2, 3, -1, 0.5, 4, 2, 0, -3, 5, 1, 2});
  for (const int64_t exclusive : {0, 1}) {
    for (const int64_t reverse : {0, 1}) {
      std::vector<double> want(12);
      for (int64_t o = 0; o < 2; ++o) {
        for (int64_t i = 0; i < 2; ++i) {
          double acc = 1;
          for (int64_t t = 0; t < 3; ++t) {
            const int64_t k = reverse ? 2 - t : t;
            const double v = x.data<double>()[(o * 3 + k) * 2 + i];
            if (!exclusive) acc *= v;
            want[static_cast<size_t>((o * 3 + k) * 2 + i)] = acc;
            if (exclusive) acc *= v;
          }
        }
      }
      const Tensor y = run1("CumProd", 26, {attr("exclusive", exclusive), attr("reverse", reverse)}, {x, i64s(-2)});
      EXPECT_EQ(y.to_double_vector(), want) << "exclusive " << exclusive << " reverse " << reverse;
    }
  }
}

TEST(CumProd, IntegersWrapAndErrors) {
  const Tensor x = Tensor::from_vector<int32_t>({3}, {65536, 65536, 3});
  EXPECT_EQ(run1("CumProd", 26, {}, {x, Tensor::scalar<int32_t>(0)}).to_int64_vector("y"),
            (std::vector<int64_t>{65536, 0, 0}));  // 2^32 wraps to 0
  EXPECT_TRUE(throws_with([&] { run1("CumProd", 26, {}, {x, i64s(1)}); }, "out of range"));
  EXPECT_TRUE(throws_with([&] { run1("CumProd", 26, {}, {x, Tensor::scalar(0.0f)}); }, "int32 or int64 scalar"));
  EXPECT_TRUE(throws_with([&] { run1("CumProd", 26, {attr("reverse", int64_t{3})}, {x, i64s(0)}); }, "must be 0 or 1"));
}

}  // namespace
}  // namespace onnxtrain
