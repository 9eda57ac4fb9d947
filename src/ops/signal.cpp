// Fourier transforms (ONNX operator docs, ai.onnx): DFT-17 (axis attribute, default 1), DFT-20
// (axis as an optional int64 scalar input, default -2), STFT-17; and ai.onnxtrain.DFTGrad, the
// adjoint of DFT that its gradient rule emits (autodiff/rules_signal.cpp).
//
// DFT(input [..., n, ..., c], dft_length?, axis?) with c = 1 (real) or 2 (complex, real and
// imaginary parts), along `axis` (in [-r, -2] or [0, r - 2]; the last dim holds the parts).
// The signal is cut or zero-padded to N = dft_length (default n) before the transform:
//   inverse=0 onesided=0: y [..., N, ..., 2],         y[k] = sum_j x[j] e^(-2 pi i jk/N)
//   inverse=0 onesided=1: y [..., N/2 + 1, ..., 2],   the same bins k <= N/2; real input only
//   inverse=1 onesided=0: y [..., N, ..., 2],         y[j] = 1/N sum_k x[k] e^(+2 pi i jk/N)
//   inverse=1 onesided=1: y [..., N, ..., 1] (IRFFT), complex input only; the first N/2 + 1
//     bins are completed by conjugate symmetry (x[N - k] = conj(x[k])) and the real part of
//     the inverse is returned, numpy's irfft; default N = 2 (n - 1).
// The transforms are radix-2 FFTs for powers of two and Bluestein's algorithm otherwise
// (ops/fft.h: O(N log N) for every length), computed in float64 for every element type:
// Bluestein's convolution in float32 leaves errors of about 1e-6 of the signal's magnitude,
// where numpy's transforms give exact zeros (the imaginary part of a real signal's bin 0) and
// ONNX's tests allow 1e-7. Plans are kept per length across runs.
//
// STFT(signal [B, L, c], frame_step, window? [W], frame_length?) -> [B, frames, bins, 2]:
// frame f is signal[b, f * frame_step + j] * window[j] for j < W, transformed with length W;
// frames = (L - W) / frame_step + 1; bins = W / 2 + 1 when onesided (default 1; real signals
// only), W otherwise. W = frame_length, else the window's length, else L; a window of another
// length than frame_length is an Error; no window is a window of ones.
//
// ai.onnxtrain.DFTGrad(X, dY, dft_length?, axis?) -> dX shaped like X, with DFT's attributes
// (`axis` is read when the axis input is omitted): the transpose of DFT as a real-linear map
// from X's parts to Y's parts. With R_n cutting or zero-padding to length n, P keeping the
// first N/2 + 1 bins (P^T zero-pads), F the forward transform matrix, F^H its conjugate:
//   forward          dX = R_n F^H dY           forward onesided  dX = Re R_n F^H P^T dY
//   inverse          dX = R_n (1/N) F dY       IRFFT             dX = R_n (c/N) P F dY
// (real parts where X is real), c = 1 at bins 0 and N/2 and 2 at the others, which appear
// twice in the conjugate-symmetric completion.
#include <algorithm>
#include <complex>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/factories.h"
#include "ops/fft.h"

namespace onnxtrain::ops {

namespace {

// FFT plans by length, built on first use and kept for later runs.
class FftCache {
 public:
  const Fft<double>& get(int64_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& plan = plans_[n];
    if (!plan) plan = std::make_unique<Fft<double>>(n);
    return *plan;
  }

 private:
  std::mutex mutex_;
  std::map<int64_t, std::unique_ptr<Fft<double>>> plans_;
};

// A tensor seen as [outer, len, inner, parts]: lines of `len` values along the transform axis.
struct Lines {
  int64_t outer, len, inner, parts;
  int64_t offset(int64_t o, int64_t t, int64_t i) const { return ((o * len + t) * inner + i) * parts; }
};

Lines lines_of(const Shape& s, size_t axis) {
  return {s.numel(0, axis), s[axis], s.numel(axis + 1, s.size() - 1), s[s.size() - 1]};
}

// For every line: load `in`'s line into a complex buffer of length n (cut, or zero-padded; real
// parts only when in.parts == 1), call f(buffer, scratch), store the first out.len values
// (zeros past n; real parts only when out.parts == 1). `in` and `out` share outer and inner.
template <class T, class R, class F>
void for_each_line(const T* in, const Lines& li, T* out, const Lines& lo, int64_t n, int64_t scratch, F&& f) {
  using C = std::complex<R>;
  const int64_t count = li.outer * li.inner;
  const int64_t stride_in = li.inner * li.parts, stride_out = lo.inner * lo.parts;
  parallel_for(count, std::max<int64_t>(1, kParallelGrain / (4 * n + 1)), [&](int64_t begin, int64_t end) {
    std::vector<C> buf(static_cast<size_t>(n)), work(static_cast<size_t>(scratch));
    for (int64_t line = begin; line < end; ++line) {
      const int64_t o = line / li.inner, i = line % li.inner;
      const T* src = in + li.offset(o, 0, i);
      const int64_t loaded = std::min(li.len, n);
      for (int64_t t = 0; t < loaded; ++t, src += stride_in) {
        const R re = static_cast<R>(static_cast<compute_t<T>>(src[0]));
        const R im = li.parts == 2 ? static_cast<R>(static_cast<compute_t<T>>(src[1])) : R(0);
        buf[static_cast<size_t>(t)] = {re, im};
      }
      std::fill(buf.begin() + loaded, buf.end(), C(0, 0));
      f(buf.data(), work.data());
      T* dst = out + lo.offset(o, 0, i);
      for (int64_t t = 0; t < lo.len; ++t, dst += stride_out) {
        const C v = t < n ? buf[static_cast<size_t>(t)] : C(0, 0);
        dst[0] = static_cast<T>(static_cast<compute_t<T>>(v.real()));
        if (lo.parts == 2) dst[1] = static_cast<T>(static_cast<compute_t<T>>(v.imag()));
      }
    }
  });
}

int64_t positive_scalar(const KernelContext& ctx, int i, const std::string& role) {
  const int64_t v = int_scalar(ctx, i, role);
  if (v < 1) throw Error("input " + ctx.input_name(i) + " (" + role + ") must be positive, got " + std::to_string(v));
  return v;
}

bool flag_attr(const KernelInit& init, const char* name, int64_t fallback) {
  const int64_t v = init.attr_int(name, fallback);
  if (v != 0 && v != 1) {
    throw Error(init.op_type() + " attribute '" + std::string(name) + "' must be 0 or 1, got " + std::to_string(v));
  }
  return v == 1;
}

// What DFT and DFTGrad share: attributes, the axis and the transform length of a run.
struct DftSpec {
  bool inverse = false, onesided = false;
  int64_t axis_attr = 1;

  DftSpec(const KernelInit& init, int64_t default_axis)
      : inverse(flag_attr(init, "inverse", 0)),
        onesided(flag_attr(init, "onesided", 0)),
        axis_attr(init.attr_int("axis", default_axis)) {}

  // The transform axis of `x` (input `x_input` names it in errors); `axis_input` is read when given.
  size_t axis(const KernelContext& ctx, const Tensor& x, int x_input, int axis_input) const {
    const auto r = static_cast<int64_t>(x.rank());
    const std::string what = "input " + ctx.input_name(x_input);
    if (r < 2) throw Error(what + " must have rank >= 2 (signal dims and a last dim of parts), got " + x.description());
    const int64_t parts = x.dim(x.rank() - 1);
    if (parts != 1 && parts != 2) {
      throw Error(what + " must end in a dim of 1 (real) or 2 (complex), got " + x.description());
    }
    int64_t a = axis_attr;
    std::string source = "attribute 'axis'";
    if (axis_input >= 0 && ctx.has_input(axis_input)) {
      const Tensor& t = ctx.input(axis_input);
      if (t.dtype() != DataType::Int64 || t.rank() > 1 || t.numel() != 1) {
        throw Error("input " + ctx.input_name(axis_input) + " (axis) must be an int64 scalar, got " + t.description());
      }
      a = t.to_int64_vector("axis")[0];
      source = "input " + ctx.input_name(axis_input) + " (axis)";
    }
    if (a < -r || a > r - 2 || a == -1) {
      throw Error(source + " is " + std::to_string(a) + ", outside [" + std::to_string(-r) + ", -2] and [0, " +
                  std::to_string(r - 2) + "] for " + what + " " + x.description() + " (the last dim holds the parts)");
    }
    return static_cast<size_t>(a < 0 ? a + r : a);
  }

  bool irfft() const { return inverse && onesided; }
};

// ------------------------------------------------------------------ DFT

class Dft final : public Kernel {
 public:
  explicit Dft(const KernelInit& init) : spec_(init, init.opset() >= 20 ? -2 : 1), axis_input_(init.opset() >= 20) {
    if (!axis_input_ && init.num_inputs() > 2) throw Error("DFT-17 takes 2 inputs (axis is an attribute before opset 20)");
    if (axis_input_ && init.has_attr("axis")) throw Error("DFT-20 takes the axis as its third input, not an attribute");
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const size_t axis = spec_.axis(ctx, x, 0, axis_input_ ? 2 : -1);
    const Lines li = lines_of(x.shape(), axis);
    if (spec_.onesided && !spec_.inverse && li.parts != 1) {
      throw Error("input " + ctx.input_name(0) + " must be real (last dim 1) for a one-sided forward DFT, got " +
                  x.description());
    }
    if (spec_.irfft() && li.parts != 2) {
      throw Error("input " + ctx.input_name(0) + " must be complex (last dim 2) for an inverse one-sided DFT, got " +
                  x.description());
    }
    int64_t n = li.len;
    if (ctx.has_input(1)) {
      n = positive_scalar(ctx, 1, "dft_length");
    } else if (spec_.irfft()) {
      n = 2 * (li.len - 1);
      if (n < 1) throw Error("input " + ctx.input_name(0) + " needs at least 2 bins along the axis for an inverse one-sided DFT without dft_length, got " + x.description());
    }
    if (n < 1) throw Error("input " + ctx.input_name(0) + " has no values along the DFT axis: " + x.description());
    Shape out_shape = x.shape();
    out_shape[axis] = spec_.onesided && !spec_.inverse ? n / 2 + 1 : n;
    out_shape[out_shape.size() - 1] = spec_.irfft() ? 1 : 2;
    Tensor& y = ctx.allocate_output(0, x.dtype(), out_shape);
    if (y.numel() == 0) return;
    const Lines lo = lines_of(out_shape, axis);
    visit_dtype<FloatTypes>(x.dtype(), "DFT input " + ctx.input_name(0), [&]<class T>() {
      using R = double;
      const Fft<R>& fft = plans_.get(n);
      const bool inverse = spec_.inverse, irfft = spec_.irfft();
      const int64_t half = n / 2 + 1;
      const R scale = inverse ? R(1) / static_cast<R>(n) : R(1);
      for_each_line<T, R>(x.data<T>(), li, y.data<T>(), lo, n, fft.scratch_size(),
                          [&](std::complex<R>* buf, std::complex<R>* work) {
                            if (irfft) {  // bins past N/2 from conjugate symmetry
                              for (int64_t k = half; k < n; ++k) buf[k] = std::conj(buf[n - k]);
                            }
                            fft.transform(buf, inverse, work);
                            if (inverse) {
                              for (int64_t k = 0; k < n; ++k) buf[k] *= scale;
                            }
                          });
    });
  }

 private:
  DftSpec spec_;
  bool axis_input_;
  FftCache plans_;
};

// ------------------------------------------------------------------ DFTGrad

class DftGrad final : public Kernel {
 public:
  explicit DftGrad(const KernelInit& init) : spec_(init, 1) {}

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& dy = ctx.input(1);
    const size_t axis = spec_.axis(ctx, x, 0, 3);
    const Lines lx = lines_of(x.shape(), axis);
    if (dy.dtype() != x.dtype() || dy.rank() != x.rank()) {
      throw Error("input " + ctx.input_name(1) + " " + dy.description() + " does not match input " +
                  ctx.input_name(0) + " " + x.description());
    }
    const Lines ly = lines_of(dy.shape(), axis);
    // The transform length, as DFT determines it.
    int64_t n = lx.len;
    if (ctx.has_input(2)) {
      n = positive_scalar(ctx, 2, "dft_length");
    } else if (spec_.irfft()) {
      n = 2 * (lx.len - 1);
    }
    Shape want = x.shape();  // the DFT's output shape
    want[axis] = spec_.onesided && !spec_.inverse ? n / 2 + 1 : n;
    want[want.size() - 1] = spec_.irfft() ? 1 : 2;
    if (n < 1 || dy.shape() != want) {
      throw Error("input " + ctx.input_name(1) + " " + dy.description() + " is not shaped like the DFT of input " +
                  ctx.input_name(0) + " " + x.description() + " with length " + std::to_string(n));
    }
    Tensor& dx = ctx.allocate_output(0, x.dtype(), x.shape());
    if (dx.numel() == 0) return;
    visit_dtype<FloatTypes>(x.dtype(), "DFTGrad input " + ctx.input_name(0), [&]<class T>() {
      using R = double;
      const Fft<R>& fft = plans_.get(n);
      const bool inverse = spec_.inverse, irfft = spec_.irfft();
      const int64_t half = n / 2 + 1;
      const R inv_n = R(1) / static_cast<R>(n);
      // The loaded dY line is zero-padded to n, which is P^T for the one-sided forward case.
      for_each_line<T, R>(dy.data<T>(), ly, dx.data<T>(), lx, n, fft.scratch_size(),
                          [&](std::complex<R>* buf, std::complex<R>* work) {
                            fft.transform(buf, !inverse, work);  // F^H (unscaled inverse) or F
                            if (!inverse) return;
                            for (int64_t k = 0; k < n; ++k) buf[k] *= inv_n;
                            if (!irfft) return;
                            for (int64_t k = 1; k < half; ++k) {
                              if (2 * k != n) buf[k] *= R(2);
                            }
                            for (int64_t k = half; k < n; ++k) buf[k] = {R(0), R(0)};
                          });
    });
  }

 private:
  DftSpec spec_;
  FftCache plans_;
};

// ------------------------------------------------------------------ STFT

class Stft final : public Kernel {
 public:
  explicit Stft(const KernelInit& init) : onesided_(flag_attr(init, "onesided", 1)) {}

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (x.rank() != 3 || (x.dim(2) != 1 && x.dim(2) != 2)) {
      throw Error("input " + ctx.input_name(0) + " must be [batch, signal_length, 1 or 2], got " + x.description());
    }
    if (onesided_ && x.dim(2) == 2) {
      throw Error("input " + ctx.input_name(0) + " is complex; a one-sided STFT needs a real signal (set onesided=0)");
    }
    const int64_t step = positive_scalar(ctx, 1, "frame_step");
    const bool has_window = ctx.has_input(2);
    if (has_window) {
      const Tensor& w = ctx.input(2);
      if (w.rank() != 1 || w.dtype() != x.dtype()) {
        throw Error("input " + ctx.input_name(2) + " (window) must be 1-D of the signal's type, got " + w.description());
      }
    }
    int64_t n = has_window ? ctx.input(2).dim(0) : x.dim(1);
    if (ctx.has_input(3)) {
      const int64_t length = positive_scalar(ctx, 3, "frame_length");
      if (has_window && length != n) {
        throw Error("input " + ctx.input_name(3) + " (frame_length) is " + std::to_string(length) + " but input " +
                    ctx.input_name(2) + " (window) has " + std::to_string(n) + " values");
      }
      n = length;
    }
    if (n < 1 || n > x.dim(1)) {
      throw Error("the frame length " + std::to_string(n) + " must be in [1, " + std::to_string(x.dim(1)) +
                  "], the length of input " + ctx.input_name(0) + " " + x.description());
    }
    const int64_t frames = (x.dim(1) - n) / step + 1, bins = onesided_ ? n / 2 + 1 : n;
    Tensor& y = ctx.allocate_output(0, x.dtype(), Shape{x.dim(0), frames, bins, 2});
    if (y.numel() == 0) return;
    visit_dtype<FloatTypes>(x.dtype(), "STFT input " + ctx.input_name(0), [&]<class T>() {
      using R = double;
      using C = std::complex<R>;
      const Fft<R>& fft = plans_.get(n);
      const T* xs = x.data<T>();
      const T* win = has_window ? ctx.input(2).data<T>() : nullptr;
      T* ys = y.data<T>();
      const int64_t parts = x.dim(2), length = x.dim(1);
      parallel_for(x.dim(0) * frames, std::max<int64_t>(1, kParallelGrain / (4 * n)), [&](int64_t begin, int64_t end) {
        std::vector<C> buf(static_cast<size_t>(n)), work(static_cast<size_t>(fft.scratch_size()));
        for (int64_t line = begin; line < end; ++line) {
          const int64_t b = line / frames, f = line % frames;
          const T* src = xs + (b * length + f * step) * parts;
          for (int64_t j = 0; j < n; ++j) {
            const R w = win ? static_cast<R>(static_cast<compute_t<T>>(win[j])) : R(1);
            const R re = static_cast<R>(static_cast<compute_t<T>>(src[j * parts]));
            const R im = parts == 2 ? static_cast<R>(static_cast<compute_t<T>>(src[j * parts + 1])) : R(0);
            buf[static_cast<size_t>(j)] = {re * w, im * w};
          }
          fft.transform(buf.data(), false, work.data());
          T* dst = ys + line * bins * 2;
          for (int64_t k = 0; k < bins; ++k) {
            dst[2 * k] = static_cast<T>(static_cast<compute_t<T>>(buf[static_cast<size_t>(k)].real()));
            dst[2 * k + 1] = static_cast<T>(static_cast<compute_t<T>>(buf[static_cast<size_t>(k)].imag()));
          }
        }
      });
    });
  }

 private:
  bool onesided_;
  FftCache plans_;
};

}  // namespace

std::unique_ptr<Kernel> make_dft(const KernelInit& init) { return std::make_unique<Dft>(init); }
std::unique_ptr<Kernel> make_dft_grad(const KernelInit& init) { return std::make_unique<DftGrad>(init); }
std::unique_ptr<Kernel> make_stft(const KernelInit& init) { return std::make_unique<Stft>(init); }

}  // namespace onnxtrain::ops
