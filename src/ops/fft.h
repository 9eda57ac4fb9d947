// Fast Fourier transforms of one length, planned once and applied to many signals (DFT, STFT
// and DFTGrad, ops/signal.cpp).
//
//   Fft<double> fft(n);                       // the plan: twiddle factors, chirp
//   std::vector<std::complex<double>> scratch(fft.scratch_size());
//   fft.transform(data, /*inverse=*/false, scratch.data());
//
// transform() computes, in place on n complex values,
//   forward: X[k] = sum_j x[j] e^(-2 pi i j k / n)
//   inverse: x[j] = sum_k X[k] e^(+2 pi i j k / n)     (unscaled: the caller divides by n)
// Paths, all O(n log n):
//   - n a power of two: iterative radix-2 Cooley-Tukey (bit-reversal permutation, then
//     butterflies with twiddles computed once in double precision);
//   - any other n: Bluestein's chirp-z algorithm (Bluestein 1970): the DFT written as a
//     convolution with the chirp e^(i pi k^2 / n), evaluated by radix-2 transforms of length
//     m >= 2n - 1. The chirp's angle uses k^2 mod 2n in integer arithmetic, so it stays exact
//     for long signals.
// The plan is immutable, so threads may share it; each thread passes its own scratch
// (scratch_size() complex values: 0 for powers of two, m for Bluestein).
#pragma once

#include <complex>
#include <cstdint>
#include <vector>

namespace onnxtrain::ops {

template <class R>
class Fft {
 public:
  using C = std::complex<R>;
  // n >= 1.
  explicit Fft(int64_t n);

  int64_t size() const { return n_; }
  int64_t scratch_size() const { return bluestein_ ? m_ : 0; }
  void transform(C* data, bool inverse, C* scratch) const;

 private:
  // Radix-2 transform of length `len` (a power of two) with the twiddles `tw` (len / 2 values
  // e^(-2 pi i k / len)).
  static void radix2(C* data, int64_t len, const std::vector<C>& tw, const std::vector<int64_t>& rev, bool inverse);

  int64_t n_;
  bool bluestein_ = false;
  int64_t m_ = 0;              // Bluestein's convolution length (a power of two)
  std::vector<C> twiddles_;    // of the radix-2 length (n, or m)
  std::vector<int64_t> rev_;   // bit-reversal permutation of that length
  std::vector<C> chirp_;       // w[k] = e^(-i pi k^2 / n), k < n
  std::vector<C> kernel_;      // forward FFT (length m) of conj(w) laid out circularly
};

extern template class Fft<double>;

}  // namespace onnxtrain::ops
