// Determinants (ONNX operator docs, ai.onnx): Det (11: float16/32/64; 22: also bfloat16), and
// ai.onnxtrain.DetGrad, the backward op its gradient rule emits (autodiff/rules_signal.cpp).
//
// Det(X [*, M, M]) -> Y [*]: the determinant of each matrix, by LU factorization with partial
// pivoting (row exchanges flip the sign), computed in float64 for every type; M = 0 gives 1.
//
// DetGrad(X [*, M, M], dY [*]) -> dX [*, M, M] = dY cof(X), the cofactor matrix, which is
// det(X) X^-T where X is invertible (Jacobi's formula d det(X) = tr(adj(X) dX)). X^-1 comes
// from the same LU factorization (one forward and back substitution per column). A matrix
// with an exact zero pivot is singular: its cofactors are then the signed determinants of its
// (M-1) x (M-1) minors (O(M^5), only for such matrices), which is right for any rank (zero when
// the rank is below M - 1).
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/factories.h"

namespace onnxtrain::ops {

namespace {

// In-place LU factorization with partial pivoting of the m x m row-major matrix `a`:
// P A = L U with unit L below the diagonal and U on and above it. perm[i] is the original row
// now at row i. Returns the determinant (0 at the first zero pivot, leaving `a` partial).
double lu_factor(std::vector<double>& a, int64_t m, std::vector<int64_t>& perm) {
  perm.resize(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) perm[static_cast<size_t>(i)] = i;
  auto at = [&](int64_t r, int64_t c) -> double& { return a[static_cast<size_t>(r * m + c)]; };
  double det = 1;
  for (int64_t k = 0; k < m; ++k) {
    int64_t p = k;  // the largest magnitude in column k (a NaN wins, to propagate)
    for (int64_t r = k + 1; r < m && !std::isnan(at(p, k)); ++r) {
      if (std::isnan(at(r, k)) || std::abs(at(r, k)) > std::abs(at(p, k))) p = r;
    }
    if (std::isnan(at(p, k))) return at(p, k);
    if (at(p, k) == 0) return 0.0;
    if (p != k) {
      for (int64_t c = 0; c < m; ++c) std::swap(at(p, c), at(k, c));
      std::swap(perm[static_cast<size_t>(p)], perm[static_cast<size_t>(k)]);
      det = -det;
    }
    const double pivot = at(k, k);
    det *= pivot;
    for (int64_t r = k + 1; r < m; ++r) {
      const double f = at(r, k) / pivot;
      at(r, k) = f;
      if (f == 0) continue;
      for (int64_t c = k + 1; c < m; ++c) at(r, c) -= f * at(k, c);
    }
  }
  return det;
}

double determinant(std::vector<double> a, int64_t m) {
  std::vector<int64_t> perm;
  return lu_factor(a, m, perm);
}

// The cofactor matrix of the m x m matrix `x` (row-major), into `cof`.
void cofactors(const std::vector<double>& x, int64_t m, std::vector<double>& cof) {
  cof.assign(static_cast<size_t>(m * m), 0.0);
  if (m == 1) {
    cof[0] = 1;
    return;
  }
  std::vector<double> lu = x;
  std::vector<int64_t> perm;
  const double det = lu_factor(lu, m, perm);
  if (std::isnan(det)) {
    cof.assign(cof.size(), det);
    return;
  }
  if (det != 0) {
    // Column j of X^-1 solves L U z = P e_j; cof[i][j] = det (X^-1)[j][i].
    std::vector<double> z(static_cast<size_t>(m));
    for (int64_t j = 0; j < m; ++j) {
      for (int64_t i = 0; i < m; ++i) z[static_cast<size_t>(i)] = perm[static_cast<size_t>(i)] == j ? 1.0 : 0.0;
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t c = 0; c < i; ++c) z[static_cast<size_t>(i)] -= lu[static_cast<size_t>(i * m + c)] * z[static_cast<size_t>(c)];
      }
      for (int64_t i = m; i-- > 0;) {
        for (int64_t c = i + 1; c < m; ++c) z[static_cast<size_t>(i)] -= lu[static_cast<size_t>(i * m + c)] * z[static_cast<size_t>(c)];
        z[static_cast<size_t>(i)] /= lu[static_cast<size_t>(i * m + i)];
      }
      for (int64_t i = 0; i < m; ++i) cof[static_cast<size_t>(j * m + i)] = det * z[static_cast<size_t>(i)];
    }
    return;
  }
  // Singular: cof[i][j] = (-1)^(i+j) det(X without row i and column j).
  std::vector<double> minor(static_cast<size_t>((m - 1) * (m - 1)));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < m; ++j) {
      size_t k = 0;
      for (int64_t r = 0; r < m; ++r) {
        if (r == i) continue;
        for (int64_t c = 0; c < m; ++c) {
          if (c != j) minor[k++] = x[static_cast<size_t>(r * m + c)];
        }
      }
      const double d = determinant(minor, m - 1);
      cof[static_cast<size_t>(i * m + j)] = (i + j) % 2 == 0 ? d : -d;
    }
  }
}

// The matrix size M of X [*, M, M] (input 0), or an Error.
int64_t square_size(const KernelContext& ctx, const Tensor& x) {
  if (x.rank() < 2 || x.dim(x.rank() - 1) != x.dim(x.rank() - 2)) {
    throw Error("input " + ctx.input_name(0) + " must be [*, M, M] (square matrices), got " + x.description());
  }
  return x.dim(x.rank() - 1);
}

Shape batch_shape(const Tensor& x) { return Shape(x.shape().dims().first(x.rank() - 2)); }

template <class T>
std::vector<double> load_matrix(const T* p, int64_t m) {
  std::vector<double> a(static_cast<size_t>(m * m));
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<double>(static_cast<compute_t<T>>(p[i]));
  return a;
}

}  // namespace

std::unique_ptr<Kernel> make_det(const KernelInit& /*init*/) {
  return make_kernel([](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const int64_t m = square_size(ctx, x);
    Tensor& y = ctx.allocate_output(0, x.dtype(), batch_shape(x));
    visit_dtype<FloatTypes>(x.dtype(), "Det input " + ctx.input_name(0), [&]<class T>() {
      const T* xs = x.data<T>();
      T* ys = y.data<T>();
      parallel_for(y.numel(), std::max<int64_t>(1, kParallelGrain / (m * m * m + 1)), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) ys[i] = convert<T>(determinant(load_matrix(xs + i * m * m, m), m));
      });
    });
  });
}

std::unique_ptr<Kernel> make_det_grad(const KernelInit& /*init*/) {
  return make_kernel([](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Tensor& dy = ctx.input(1);
    const int64_t m = square_size(ctx, x);
    if (dy.dtype() != x.dtype() || dy.shape() != batch_shape(x)) {
      throw Error("input " + ctx.input_name(1) + " " + dy.description() + " must be shaped like Det of input " +
                  ctx.input_name(0) + " " + x.description());
    }
    Tensor& dx = ctx.allocate_output(0, x.dtype(), x.shape());
    visit_dtype<FloatTypes>(x.dtype(), "DetGrad input " + ctx.input_name(0), [&]<class T>() {
      const T* xs = x.data<T>();
      const T* g = dy.data<T>();
      T* out = dx.data<T>();
      parallel_for(dy.numel(), std::max<int64_t>(1, kParallelGrain / (m * m * m + 1)), [&](int64_t b, int64_t e) {
        std::vector<double> cof;
        for (int64_t i = b; i < e; ++i) {
          cofactors(load_matrix(xs + i * m * m, m), m, cof);
          const double gi = static_cast<double>(static_cast<compute_t<T>>(g[i]));
          for (int64_t k = 0; k < m * m; ++k) out[i * m * m + k] = convert<T>(gi * cof[static_cast<size_t>(k)]);
        }
      });
    });
  });
}

}  // namespace onnxtrain::ops
