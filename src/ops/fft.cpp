// Radix-2 and Bluestein FFTs (see fft.h).
#include "ops/fft.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace onnxtrain::ops {

namespace {

bool is_power_of_two(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

// a * b without std::complex's NaN/Inf recovery (which keeps the loop from vectorizing).
template <class R>
std::complex<R> mul(std::complex<R> a, std::complex<R> b) {
  return {a.real() * b.real() - a.imag() * b.imag(), a.real() * b.imag() + a.imag() * b.real()};
}

// e^(-2 pi i k / len) for k < len / 2, in double precision, rounded to R.
template <class R>
std::vector<std::complex<R>> twiddles(int64_t len) {
  std::vector<std::complex<R>> tw(static_cast<size_t>(len / 2));
  for (int64_t k = 0; k < len / 2; ++k) {
    const double angle = -2.0 * std::numbers::pi * static_cast<double>(k) / static_cast<double>(len);
    tw[static_cast<size_t>(k)] = {static_cast<R>(std::cos(angle)), static_cast<R>(std::sin(angle))};
  }
  return tw;
}

std::vector<int64_t> bit_reversal(int64_t len) {
  std::vector<int64_t> rev(static_cast<size_t>(len), 0);
  int bits = 0;
  while ((int64_t{1} << bits) < len) ++bits;
  for (int64_t i = 0; i < len; ++i) {
    int64_t r = 0;
    for (int b = 0; b < bits; ++b) r |= ((i >> b) & 1) << (bits - 1 - b);
    rev[static_cast<size_t>(i)] = r;
  }
  return rev;
}

}  // namespace

template <class R>
Fft<R>::Fft(int64_t n) : n_(n) {
  if (is_power_of_two(n)) {
    twiddles_ = twiddles<R>(n);
    rev_ = bit_reversal(n);
    return;
  }
  bluestein_ = true;
  m_ = 1;
  while (m_ < 2 * n - 1) m_ <<= 1;
  twiddles_ = twiddles<R>(m_);
  rev_ = bit_reversal(m_);
  // w[k] = e^(-i pi k^2 / n); k^2 is reduced mod 2n (the chirp's period) incrementally.
  chirp_.resize(static_cast<size_t>(n));
  int64_t k2 = 0;  // k^2 mod 2n
  for (int64_t k = 0; k < n; ++k) {
    const double angle = -std::numbers::pi * static_cast<double>(k2) / static_cast<double>(n);
    chirp_[static_cast<size_t>(k)] = {static_cast<R>(std::cos(angle)), static_cast<R>(std::sin(angle))};
    k2 = (k2 + 2 * k + 1) % (2 * n);
  }
  // b[t] = conj(w[|t|]) for |t| < n, stored circularly (t < 0 at m + t); kernel = FFT(b).
  kernel_.assign(static_cast<size_t>(m_), C(0, 0));
  for (int64_t k = 0; k < n; ++k) {
    const C b = std::conj(chirp_[static_cast<size_t>(k)]);
    kernel_[static_cast<size_t>(k)] = b;
    if (k > 0) kernel_[static_cast<size_t>(m_ - k)] = b;
  }
  radix2(kernel_.data(), m_, twiddles_, rev_, false);
}

template <class R>
void Fft<R>::radix2(C* data, int64_t len, const std::vector<C>& tw, const std::vector<int64_t>& rev, bool inverse) {
  for (int64_t i = 0; i < len; ++i) {
    const int64_t r = rev[static_cast<size_t>(i)];
    if (i < r) std::swap(data[i], data[r]);
  }
  for (int64_t span = 2; span <= len; span <<= 1) {
    const int64_t half = span / 2, step = len / span;
    for (int64_t start = 0; start < len; start += span) {
      C* lo = data + start;
      C* hi = lo + half;
      for (int64_t j = 0; j < half; ++j) {
        C w = tw[static_cast<size_t>(j * step)];
        if (inverse) w = std::conj(w);
        const C u = lo[j], v = mul(hi[j], w);
        lo[j] = u + v;
        hi[j] = u - v;
      }
    }
  }
}

template <class R>
void Fft<R>::transform(C* data, bool inverse, C* scratch) const {
  if (n_ == 1) return;
  if (!bluestein_) return radix2(data, n_, twiddles_, rev_, inverse);
  // The inverse is conj(forward(conj(x))).
  if (inverse) {
    for (int64_t k = 0; k < n_; ++k) data[k] = std::conj(data[k]);
  }
  // X[k] = w[k] sum_j (x[j] w[j]) conj(w[k - j]): a convolution of length m by radix-2 FFTs.
  for (int64_t j = 0; j < n_; ++j) scratch[j] = mul(data[j], chirp_[static_cast<size_t>(j)]);
  std::fill(scratch + n_, scratch + m_, C(0, 0));
  radix2(scratch, m_, twiddles_, rev_, false);
  for (int64_t k = 0; k < m_; ++k) scratch[k] = mul(scratch[k], kernel_[static_cast<size_t>(k)]);
  radix2(scratch, m_, twiddles_, rev_, true);
  const R scale = R(1) / static_cast<R>(m_);
  for (int64_t k = 0; k < n_; ++k) {
    const C y = mul(scratch[k], chirp_[static_cast<size_t>(k)]) * scale;
    data[k] = inverse ? std::conj(y) : y;
  }
}

template class Fft<double>;

}  // namespace onnxtrain::ops
