// Window functions and the mel filter bank (ONNX operator docs, ai.onnx opset 17):
// HannWindow, HammingWindow, BlackmanWindow, MelWeightMatrix.
//
// Windows: size (an int32/int64 scalar >= 0) -> output [size] of `output_datatype` (any numeric
// type, default float32). The ops' function bodies in the ONNX schemas define them as the
// generalized cosine window
//   w[k] = a0 - a1 cos(2 pi k / N) + a2 cos(4 pi k / N),   k < size,
// with N = size (periodic=1, the default) or size - 1 (periodic=0, symmetric), and
//   Hann (0.5, 0.5, 0), Hamming (25/46, 21/46, 0), Blackman (0.42, 0.5, 0.08).
// Values are computed in float64 and converted to the output type (integers truncate). A
// symmetric window of one sample, where N = 0, is [1] (PyTorch's and SciPy's value; the function
// body would divide 0 by 0).
//
// MelWeightMatrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz)
// -> [dft_length / 2 + 1, num_mel_bins] of `output_datatype`: triangular filters with peak 1 on
// the mel scale mel(f) = 2595 log10(1 + f / 700). The op doc leaves the construction open; this
// follows the ONNX reference implementation and ONNX Runtime: num_mel_bins + 2 edges spaced by
// (mel(upper) - mel(lower)) / (num_mel_bins + 2) from mel(lower), each mapped back to hertz and
// to the spectrogram bin floor((dft_length + 1) f / sample_rate); filter i rises linearly from
// edge i to 1 at edge i + 1 (a single 1 when they coincide) and falls to edge i + 2 (excluded).
// Edges outside the spectrogram's bins (upper_edge_hertz above the Nyquist frequency) are an
// Error, as are non-positive sizes and rates and lower_edge_hertz > upper_edge_hertz or < 0.
#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "core/dispatch.h"
#include "ops/factories.h"
#include "ops/registry.h"

namespace onnxtrain::ops {

namespace {

DataType output_datatype(const KernelInit& init) {
  const DataType t = dtype_from_onnx(static_cast<int32_t>(init.attr_int("output_datatype", 1)),
                                     init.op_type() + " attribute 'output_datatype'");
  if (!kNumeric.contains(t)) {
    throw Error(init.op_type() + " attribute 'output_datatype' must be a numeric type, got " +
                std::string(dtype_name(t)));
  }
  return t;
}

double float_scalar(const KernelContext& ctx, int i, const std::string& role) {
  const Tensor& t = ctx.input(i);
  if (!is_floating(t.dtype()) || t.rank() > 1 || t.numel() != 1) {
    throw Error("input " + ctx.input_name(i) + " (" + role + ") must be a floating-point scalar, got " +
                t.description());
  }
  return t.to_double_vector()[0];
}

// Writes values (float64) into a new output of `dtype`.
void write_output(KernelContext& ctx, DataType dtype, const Shape& shape, const std::vector<double>& values) {
  Tensor& y = ctx.allocate_output(0, dtype, shape);
  visit_dtype<NumericTypes>(dtype, "output", [&]<class T>() {
    T* out = y.data<T>();
    for (size_t k = 0; k < values.size(); ++k) out[k] = convert<T>(values[k]);
  });
}

class CosineWindow final : public Kernel {
 public:
  explicit CosineWindow(const KernelInit& init) : dtype_(output_datatype(init)) {
    const int64_t periodic = init.attr_int("periodic", 1);
    if (periodic != 0 && periodic != 1) {
      throw Error(init.op_type() + " attribute 'periodic' must be 0 or 1, got " + std::to_string(periodic));
    }
    periodic_ = periodic == 1;
    if (init.op_type() == "HannWindow") {
      a_ = {0.5, 0.5, 0.0};
    } else if (init.op_type() == "HammingWindow") {
      a_ = {25.0 / 46.0, 21.0 / 46.0, 0.0};
    } else {
      a_ = {0.42, 0.5, 0.08};
    }
  }

  void run(KernelContext& ctx) override {
    const int64_t size = int_scalar(ctx, 0, "size");
    if (size < 0) throw Error("input " + ctx.input_name(0) + " (size) must be >= 0, got " + std::to_string(size));
    const int64_t n = periodic_ ? size : size - 1;
    std::vector<double> w(static_cast<size_t>(size), 1.0);
    if (n > 0) {
      for (int64_t k = 0; k < size; ++k) {
        const double angle = 2 * std::numbers::pi * static_cast<double>(k) / static_cast<double>(n);
        w[static_cast<size_t>(k)] = a_[0] - a_[1] * std::cos(angle) + a_[2] * std::cos(2 * angle);
      }
    }
    write_output(ctx, dtype_, Shape{size}, w);
  }

 private:
  DataType dtype_;
  bool periodic_ = true;
  std::vector<double> a_;
};

class MelWeightMatrix final : public Kernel {
 public:
  explicit MelWeightMatrix(const KernelInit& init) : dtype_(output_datatype(init)) {}

  void run(KernelContext& ctx) override {
    const int64_t mels = int_scalar(ctx, 0, "num_mel_bins");
    const int64_t dft_length = int_scalar(ctx, 1, "dft_length");
    const int64_t rate = int_scalar(ctx, 2, "sample_rate");
    const double lower = float_scalar(ctx, 3, "lower_edge_hertz");
    const double upper = float_scalar(ctx, 4, "upper_edge_hertz");
    if (mels < 1 || dft_length < 1 || rate < 1) {
      throw Error("num_mel_bins, dft_length and sample_rate must be positive, got " + std::to_string(mels) + ", " +
                  std::to_string(dft_length) + ", " + std::to_string(rate));
    }
    if (!(lower >= 0 && lower <= upper)) {
      throw Error("the edges must satisfy 0 <= lower_edge_hertz <= upper_edge_hertz, got " + std::to_string(lower) +
                  " and " + std::to_string(upper));
    }
    const int64_t bins = dft_length / 2 + 1;
    auto mel = [](double f) { return 2595.0 * std::log10(1.0 + f / 700.0); };
    const double low = mel(lower), step = (mel(upper) - low) / static_cast<double>(mels + 2);
    std::vector<int64_t> edge(static_cast<size_t>(mels + 2));
    for (int64_t i = 0; i < mels + 2; ++i) {
      const double hz = 700.0 * (std::pow(10.0, (low + static_cast<double>(i) * step) / 2595.0) - 1.0);
      const double bin = std::floor(static_cast<double>(dft_length + 1) * hz / static_cast<double>(rate));
      if (!(bin >= 0 && bin < static_cast<double>(bins))) {
        throw Error("input " + ctx.input_name(4) + " (upper_edge_hertz) " + std::to_string(upper) +
                    " puts a filter edge past the last of the " + std::to_string(bins) +
                    " spectrogram bins (at most about sample_rate / 2)");
      }
      edge[static_cast<size_t>(i)] = static_cast<int64_t>(bin);
    }
    std::vector<double> w(static_cast<size_t>(bins * mels), 0.0);
    auto at = [&](int64_t j, int64_t i) -> double& { return w[static_cast<size_t>(j * mels + i)]; };
    for (int64_t i = 0; i < mels; ++i) {
      const int64_t l = edge[static_cast<size_t>(i)], c = edge[static_cast<size_t>(i + 1)], h = edge[static_cast<size_t>(i + 2)];
      if (c == l) {
        at(c, i) = 1.0;
      } else {
        for (int64_t j = l; j <= c; ++j) at(j, i) = static_cast<double>(j - l) / static_cast<double>(c - l);
      }
      for (int64_t j = c; j < h; ++j) at(j, i) = static_cast<double>(h - j) / static_cast<double>(h - c);
    }
    write_output(ctx, dtype_, Shape{bins, mels}, w);
  }

 private:
  DataType dtype_;
};

}  // namespace

std::unique_ptr<Kernel> make_window(const KernelInit& init) { return std::make_unique<CosineWindow>(init); }
std::unique_ptr<Kernel> make_mel_weight_matrix(const KernelInit& init) { return std::make_unique<MelWeightMatrix>(init); }

}  // namespace onnxtrain::ops
