// Normalizations and position encodings of transformers (ONNX operator docs):
//
// RMSNormalization-23: X seen as [outer, inner], inner = prod(dims[axis:]) (axis in [-r, r));
//   per row rms = sqrt(mean(x^2) + epsilon) and Y = X / rms * scale, scale unidirectionally
//   broadcast to X (it may vary over leading dims too). Y has scale's element type (V).
//   stash_type 1 only (as the reference implementation); statistics accumulate in double.
// GroupNormalization-18/21: X [N, C, D1..Dn], num_groups G dividing C; per (n, group of C / G
//   channels) mean and population variance, Y = (X - mean) / sqrt(var + epsilon) * scale + bias.
//   Version 18: scale and bias have G values (one per group); version 21: C values (one per
//   channel) and stash_type (1 only). Statistics in double.
// RotaryEmbedding-23 (RoPE, arXiv 2104.09864): X [B, H, S, D], or [B, S, H * D] with the
//   attribute num_heads. The first rotary_embedding_dim (0: all D, even) values of each head
//   form pairs (x1, x2), the two halves or (interleaved = 1) even and odd positions, rotated
//   by the angle of the token's position: (cos x1 - sin x2, sin x1 + cos x2); the rest passes
//   through. With position_ids [B, S] (int64) the caches are [max_position, rd / 2] and
//   indexed by it; without, the caches are [B, S, rd / 2]. float64 is accepted beyond the
//   schema's types, so the gradient rule is checked by finite differences in float64.
//
// Backward ops of the ai.onnxtrain domain (autodiff/rules_transformer.cpp), which recompute
// the statistics from X in one pass:
//   RMSNormalizationGrad(dY, X, scale) -> dX, dScale      attributes axis, epsilon
//     dX = r (g - xhat mean(g xhat)) with g = dY scale, xhat = x r, r = 1 / rms;
//     dScale = dY xhat summed to scale's shape.
//   GroupNormalizationGrad(dY, X, scale) -> dX, dScale, dBias   attributes num_groups, epsilon;
//     scale of G values means per-group parameters (version 18), of C values per channel.
//     dX = invstd (g - mean(g) - xhat mean(g xhat)) per (n, group), g = dY scale.
#include <cmath>
#include <string>
#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/factories.h"
#include "ops/registry.h"

namespace onnxtrain::ops {

namespace {

size_t normalized_axis(const KernelContext& ctx, int64_t axis, size_t rank, bool inclusive_end) {
  const int64_t r = static_cast<int64_t>(rank);
  const int64_t hi = inclusive_end ? r : r - 1;
  if (axis < -r || axis > hi) {
    fail("attribute 'axis' = " + std::to_string(axis) + " is out of range for input " + ctx.input_name(0) + " " +
         ctx.input(0).description() + " (expected [" + std::to_string(-r) + ", " + std::to_string(hi) + "])");
  }
  return static_cast<size_t>(axis < 0 ? axis + r : axis);
}

// Where input `i` (unidirectionally broadcast to X's shape) keeps the element (row, col) of X
// seen as [outer, inner]: offset = row_offset[row] + col_offset[col].
struct BroadcastOffsets {
  std::vector<int64_t> row_offset, col_offset;
};

// Offsets of coordinate walks over dims [from, to) of `x_shape` into a tensor with strides
// `strides` (0 for a broadcast dim).
std::vector<int64_t> walk_offsets(const Shape& x_shape, const std::vector<int64_t>& strides, size_t from, size_t to) {
  std::vector<int64_t> out(static_cast<size_t>(x_shape.numel(from, to)));
  std::vector<int64_t> coord(x_shape.size(), 0);
  int64_t offset = 0;
  for (auto& o : out) {
    o = offset;
    for (size_t d = to; d-- > from;) {
      offset += strides[d];
      if (++coord[d] < x_shape[d]) break;
      offset -= strides[d] * coord[d];
      coord[d] = 0;
    }
  }
  return out;
}

BroadcastOffsets broadcast_offsets(const KernelContext& ctx, int i, const Shape& x_shape, size_t axis) {
  const Shape& s = ctx.input(i).shape();
  bool ok = s.size() <= x_shape.size();
  std::vector<int64_t> strides(x_shape.size(), 0);
  int64_t stride = 1;
  for (size_t k = 0; ok && k < s.size(); ++k) {
    const size_t d = x_shape.size() - 1 - k;
    const int64_t dim = s[s.size() - 1 - k];
    ok = dim == x_shape[d] || dim == 1;
    strides[d] = dim == 1 ? 0 : stride;
    stride *= dim;
  }
  if (!ok) {
    fail("input " + ctx.input_name(i) + " is " + ctx.input(i).description() +
         ", which does not broadcast unidirectionally to input " + ctx.input_name(0) + " " + ctx.input(0).description());
  }
  return {walk_offsets(x_shape, strides, 0, axis), walk_offsets(x_shape, strides, axis, x_shape.size())};
}

// The values of input i in compute type V.
template <class V>
std::vector<V> values_as(const KernelContext& ctx, int i) {
  const Tensor& t = ctx.input(i);
  std::vector<V> out(static_cast<size_t>(t.numel()));
  visit_dtype<FloatTypes>(t.dtype(), "input " + ctx.input_name(i), [&]<class T>() {
    const T* p = t.data<T>();
    for (size_t k = 0; k < out.size(); ++k) out[k] = convert<V>(convert<double>(p[k]));
  });
  return out;
}

template <class T>
double mean_square(const T* x, int64_t n) {
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t k = 0; k < n; ++k) {
    const double v = convert<double>(x[k]);
    sum += v * v;
  }
  return sum / static_cast<double>(n);
}

// --- RMSNormalization ---

void run_rms_norm(KernelContext& ctx, int64_t axis_attr, double epsilon) {
  const Tensor& x = ctx.input(0);
  const size_t axis = normalized_axis(ctx, axis_attr, x.rank(), false);
  const int64_t outer = x.shape().numel(0, axis), inner = x.shape().numel(axis, x.rank());
  const BroadcastOffsets off = broadcast_offsets(ctx, 1, x.shape(), axis);
  const DataType out_type = ctx.input(1).dtype();
  Tensor& y = ctx.allocate_output(0, out_type, x.shape());
  visit_dtype<FloatTypes>(x.dtype(), "input " + ctx.input_name(0), [&]<class T>() {
    visit_dtype<FloatTypes>(out_type, "input " + ctx.input_name(1), [&]<class U>() {
      using V = std::conditional_t<std::is_same_v<T, double> || std::is_same_v<U, double>, double, float>;
      const std::vector<V> scale = values_as<V>(ctx, 1);
      const T* px = x.data<T>();
      U* py = y.data<U>();
      parallel_for(outer, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(inner, 1)), [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const T* xr = px + r * inner;
          U* yr = py + r * inner;
          const V inv = convert<V>(1.0 / std::sqrt(mean_square(xr, inner) + epsilon));
          const V* s = scale.data() + off.row_offset[static_cast<size_t>(r)];
          const int64_t* col = off.col_offset.data();
          for (int64_t k = 0; k < inner; ++k) yr[k] = convert<U>(convert<V>(xr[k]) * inv * s[col[k]]);
        }
      });
    });
  });
}

void run_rms_norm_grad(KernelContext& ctx, int64_t axis_attr, double epsilon) {
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const Tensor& scale_t = ctx.input(2);
  if (!(dy.shape() == x.shape())) fail("input " + ctx.input_name(0) + " is " + dy.description() + ", expected the shape of " + x.description());
  // Offsets of scale against X: broadcast_offsets reads input 0 as X, so build them here.
  const size_t axis = [&] {
    const int64_t r = static_cast<int64_t>(x.rank());
    if (axis_attr < -r || axis_attr >= r) fail("attribute 'axis' = " + std::to_string(axis_attr) + " is out of range for " + x.description());
    return static_cast<size_t>(axis_attr < 0 ? axis_attr + r : axis_attr);
  }();
  const BroadcastOffsets off = broadcast_offsets(ctx, 2, x.shape(), axis);
  const int64_t outer = x.shape().numel(0, axis), inner = x.shape().numel(axis, x.rank());
  Tensor dx = ctx.allocate_output(0, x.dtype(), x.shape());
  Tensor dscale = ctx.allocate_output(1, scale_t.dtype(), scale_t.shape());
  const int64_t scale_n = scale_t.numel();
  visit_dtype<FloatTypes>(x.dtype(), "input " + ctx.input_name(1), [&]<class T>() {
    using V = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const std::vector<double> scale = values_as<double>(ctx, 2);
    const T* px = x.data<T>();
    const T* pg = dy.data<T>();
    T* pdx = dx.data<T>();
    const int threads = std::max(1, std::min<int>(omp_get_max_threads(), static_cast<int>(outer)));
    std::vector<std::vector<double>> partial(static_cast<size_t>(threads), std::vector<double>(static_cast<size_t>(scale_n), 0.0));
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < outer; ++r) {
      std::vector<double>& ds = partial[static_cast<size_t>(omp_get_thread_num())];
      const T* xr = px + r * inner;
      const T* gr = pg + r * inner;
      T* dxr = pdx + r * inner;
      const double inv = 1.0 / std::sqrt(mean_square(xr, inner) + epsilon);
      const int64_t base = off.row_offset[static_cast<size_t>(r)];
      double dot = 0;  // sum g scale xhat
      for (int64_t k = 0; k < inner; ++k) {
        const int64_t si = base + off.col_offset[static_cast<size_t>(k)];
        const double xhat = convert<double>(xr[k]) * inv, g = convert<double>(gr[k]);
        dot += g * scale[static_cast<size_t>(si)] * xhat;
        ds[static_cast<size_t>(si)] += g * xhat;
      }
      const V m = convert<V>(dot / static_cast<double>(inner)), vinv = convert<V>(inv);
      for (int64_t k = 0; k < inner; ++k) {
        const V s = convert<V>(scale[static_cast<size_t>(base + off.col_offset[static_cast<size_t>(k)])]);
        const V xhat = convert<V>(xr[k]) * vinv;
        dxr[k] = convert<T>(vinv * (convert<V>(gr[k]) * s - xhat * m));
      }
    }
    visit_dtype<FloatTypes>(scale_t.dtype(), "input " + ctx.input_name(2), [&]<class U>() {
      U* out = dscale.data<U>();
      for (int64_t k = 0; k < scale_n; ++k) {
        double sum = 0;
        for (const auto& p : partial) sum += p[static_cast<size_t>(k)];
        out[k] = convert<U>(sum);
      }
    });
  });
}

// --- GroupNormalization ---

struct GroupGeometry {
  int64_t batch = 0, channels = 0, groups = 0, spatial = 0;
  bool per_group = false;  // scale and bias have one value per group
  int64_t param(int64_t c) const { return per_group ? c / (channels / groups) : c; }
};

GroupGeometry group_geometry(const KernelContext& ctx, int xi, int64_t groups, int version) {
  const Tensor& x = ctx.input(xi);
  if (x.rank() < 2) fail("input " + ctx.input_name(xi) + " is " + x.description() + ", expected [N, C, D1..Dn]");
  GroupGeometry g{x.dim(0), x.dim(1), groups, x.shape().numel(2, x.rank())};
  if (groups <= 0 || g.channels % groups != 0) {
    fail("attribute 'num_groups' = " + std::to_string(groups) + " does not divide the " + std::to_string(g.channels) +
         " channels of input " + ctx.input_name(xi) + " " + x.description());
  }
  const int64_t n = ctx.input(xi + 1).numel();
  // Version 18: one value per group; 21: per channel; the backward op (version 0) takes either.
  g.per_group = version == 18 || (version == 0 && n == groups && groups != g.channels);
  const int64_t want = g.per_group ? groups : g.channels;
  for (int i = xi + 1; i < ctx.num_inputs() && i <= xi + 2; ++i) {
    const Tensor& p = ctx.input(i);
    if (p.rank() != 1 || p.dim(0) != want) {
      fail("input " + ctx.input_name(i) + " is " + p.description() + ", expected shape [" + std::to_string(want) + "] (one value per " +
           (g.per_group ? "group" : "channel") + ")");
    }
  }
  return g;
}

void run_group_norm(KernelContext& ctx, int64_t groups, double epsilon, int version) {
  const Tensor& x = ctx.input(0);
  const GroupGeometry g = group_geometry(ctx, 0, groups, version);
  Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
  const int64_t cpg = g.channels / g.groups, block = cpg * g.spatial;
  if (x.numel() == 0) return;
  visit_dtype<FloatTypes>(x.dtype(), "input " + ctx.input_name(0), [&]<class T>() {
    using V = compute_t<T>;
    const std::vector<V> scale = values_as<V>(ctx, 1), bias = values_as<V>(ctx, 2);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    parallel_for(g.batch * g.groups, std::max<int64_t>(1, kParallelGrain / block), [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        const T* xb = px + p * block;
        double sum = 0, squares = 0;
        for (int64_t k = 0; k < block; ++k) sum += convert<double>(xb[k]);
        const double mean = sum / static_cast<double>(block);
        for (int64_t k = 0; k < block; ++k) {
          const double d = convert<double>(xb[k]) - mean;
          squares += d * d;
        }
        const V inv = convert<V>(1.0 / std::sqrt(squares / static_cast<double>(block) + epsilon));
        const V m = convert<V>(mean);
        for (int64_t c = 0; c < cpg; ++c) {
          const int64_t channel = (p % g.groups) * cpg + c;
          const V s = scale[static_cast<size_t>(g.param(channel))] * inv, b = bias[static_cast<size_t>(g.param(channel))];
          const T* xc = xb + c * g.spatial;
          T* yc = py + p * block + c * g.spatial;
          for (int64_t k = 0; k < g.spatial; ++k) yc[k] = convert<T>((convert<V>(xc[k]) - m) * s + b);
        }
      }
    });
  });
}

void run_group_norm_grad(KernelContext& ctx, int64_t groups, double epsilon) {
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  if (!(dy.shape() == x.shape()) || dy.dtype() != x.dtype()) {
    fail("input " + ctx.input_name(0) + " is " + dy.description() + ", expected " + x.description());
  }
  const GroupGeometry g = group_geometry(ctx, 1, groups, 0);
  const int64_t cpg = g.channels / g.groups, block = cpg * g.spatial;
  const Tensor& scale_t = ctx.input(2);
  Tensor dx = ctx.allocate_output(0, x.dtype(), x.shape());
  Tensor dscale = ctx.allocate_output(1, scale_t.dtype(), scale_t.shape());
  Tensor dbias = ctx.allocate_output(2, scale_t.dtype(), scale_t.shape());
  // Per (n, channel): sum dy xhat and sum dy, reduced over n afterwards.
  std::vector<double> sum_gx(static_cast<size_t>(g.batch * g.channels), 0.0), sum_g(sum_gx.size(), 0.0);
  visit_dtype<FloatTypes>(x.dtype(), "input " + ctx.input_name(1), [&]<class T>() {
    const std::vector<double> scale = values_as<double>(ctx, 2);
    const T* px = x.data<T>();
    const T* pg = dy.data<T>();
    T* pdx = dx.data<T>();
    parallel_for(g.batch * g.groups, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(block, 1)), [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        const T* xb = px + p * block;
        const T* gb = pg + p * block;
        double sum = 0, squares = 0;
        for (int64_t k = 0; k < block; ++k) sum += convert<double>(xb[k]);
        const double mean = sum / static_cast<double>(block);
        for (int64_t k = 0; k < block; ++k) squares += (convert<double>(xb[k]) - mean) * (convert<double>(xb[k]) - mean);
        const double inv = 1.0 / std::sqrt(squares / static_cast<double>(block) + epsilon);
        double mg = 0, mgx = 0;  // sums of g = dy scale and of g xhat over the block
        for (int64_t c = 0; c < cpg; ++c) {
          const int64_t channel = (p % g.groups) * cpg + c;
          const double s = scale[static_cast<size_t>(g.param(channel))];
          double sg = 0, sgx = 0;
          for (int64_t k = c * g.spatial; k < (c + 1) * g.spatial; ++k) {
            const double gv = convert<double>(gb[k]), xhat = (convert<double>(xb[k]) - mean) * inv;
            sg += gv;
            sgx += gv * xhat;
          }
          const size_t nc = static_cast<size_t>((p / g.groups) * g.channels + channel);
          sum_g[nc] = sg;
          sum_gx[nc] = sgx;
          mg += s * sg;
          mgx += s * sgx;
        }
        mg /= static_cast<double>(block);
        mgx /= static_cast<double>(block);
        for (int64_t c = 0; c < cpg; ++c) {
          const double s = scale[static_cast<size_t>(g.param((p % g.groups) * cpg + c))];
          for (int64_t k = c * g.spatial; k < (c + 1) * g.spatial; ++k) {
            const double xhat = (convert<double>(xb[k]) - mean) * inv;
            pdx[p * block + k] = convert<T>(inv * (convert<double>(gb[k]) * s - mg - xhat * mgx));
          }
        }
      }
    });
  });
  visit_dtype<FloatTypes>(scale_t.dtype(), "input " + ctx.input_name(2), [&]<class U>() {
    std::vector<double> ds(static_cast<size_t>(scale_t.numel()), 0.0), db(ds.size(), 0.0);
    for (int64_t n = 0; n < g.batch; ++n) {
      for (int64_t c = 0; c < g.channels; ++c) {
        const size_t k = static_cast<size_t>(g.param(c)), nc = static_cast<size_t>(n * g.channels + c);
        ds[k] += sum_gx[nc];
        db[k] += sum_g[nc];
      }
    }
    for (size_t k = 0; k < ds.size(); ++k) {
      dscale.data<U>()[k] = convert<U>(ds[k]);
      dbias.data<U>()[k] = convert<U>(db[k]);
    }
  });
}

// --- RotaryEmbedding ---

struct RotarySpec {
  bool interleaved = false;
  int64_t rotary_dim = 0;
  int64_t num_heads = 0;
};

void run_rotary(KernelContext& ctx, const RotarySpec& spec) {
  const Tensor& x = ctx.input(0);
  const Tensor& cos_t = ctx.input(1);
  const Tensor& sin_t = ctx.input(2);
  // Element (b, s, h, d) of X is at b * sb + s * ss + h * sh + d.
  int64_t B = 0, S = 0, H = 0, D = 0, sb = 0, ss = 0, sh = 0;
  if (x.rank() == 4) {
    B = x.dim(0), H = x.dim(1), S = x.dim(2), D = x.dim(3);
    sb = H * S * D, sh = S * D, ss = D;
  } else if (x.rank() == 3) {
    if (spec.num_heads <= 0 || x.dim(2) % spec.num_heads != 0) {
      fail("input " + ctx.input_name(0) + " is " + x.description() + ": a 3-D input needs the attribute 'num_heads' dividing its last dim (num_heads = " +
           std::to_string(spec.num_heads) + ")");
    }
    B = x.dim(0), S = x.dim(1), H = spec.num_heads, D = x.dim(2) / H;
    sb = S * H * D, ss = H * D, sh = D;
  } else {
    fail("input " + ctx.input_name(0) + " is " + x.description() + ", expected [batch, heads, seq, head_size] or [batch, seq, hidden]");
  }
  const int64_t rd = spec.rotary_dim == 0 ? D : spec.rotary_dim;
  if (rd % 2 != 0 || rd > D || rd < 0) {
    fail("attribute 'rotary_embedding_dim' = " + std::to_string(rd) + " must be even and at most the head size " + std::to_string(D));
  }
  const int64_t half = rd / 2;
  const bool with_ids = ctx.has_input(3);
  std::vector<int64_t> ids;
  const Shape want_cache = with_ids ? Shape{cos_t.rank() == 2 ? cos_t.dim(0) : -1, half} : Shape{B, S, half};
  for (int i = 1; i <= 2; ++i) {
    const Tensor& c = ctx.input(i);
    if (!(c.shape() == want_cache) || c.dtype() != x.dtype()) {
      fail("input " + ctx.input_name(i) + " is " + c.description() + ", expected " + std::string(dtype_name(x.dtype())) +
           (with_ids ? " [max_position, " + std::to_string(half) + "] (the same for both caches)" : " " + want_cache.to_string()) +
           " for rotary_embedding_dim / 2 = " + std::to_string(half));
    }
  }
  if (with_ids) {
    const Tensor& p = ctx.input(3);
    if (!(p.shape() == Shape{B, S})) fail("input " + ctx.input_name(3) + " is " + p.description() + ", expected " + Shape{B, S}.to_string());
    ids = p.to_int64_vector("input " + ctx.input_name(3));
    for (int64_t id : ids) {
      if (id < 0 || id >= cos_t.dim(0)) {
        fail("input " + ctx.input_name(3) + " holds position " + std::to_string(id) + ", outside the caches' " + std::to_string(cos_t.dim(0)) + " positions");
      }
    }
  }
  Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
  visit_dtype<FloatTypes>(x.dtype(), "input " + ctx.input_name(0), [&]<class T>() {
    using V = compute_t<T>;
    const T* px = x.data<T>();
    const T* pc = cos_t.data<T>();
    const T* ps = sin_t.data<T>();
    T* py = y.data<T>();
    const int64_t step = spec.interleaved ? 2 : 1, second = spec.interleaved ? 1 : half;
    parallel_for(B * S, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(H * D, 1)), [&](int64_t begin, int64_t end) {
      for (int64_t bs = begin; bs < end; ++bs) {
        const int64_t b = bs / S, s = bs % S;
        const int64_t row = with_ids ? ids[static_cast<size_t>(bs)] : bs;
        const T* c = pc + row * half;
        const T* sn = ps + row * half;
        for (int64_t h = 0; h < H; ++h) {
          const int64_t o = b * sb + s * ss + h * sh;
          const T* xh = px + o;
          T* yh = py + o;
          for (int64_t k = 0; k < half; ++k) {
            const V x1 = convert<V>(xh[k * step]), x2 = convert<V>(xh[k * step + second]);
            const V cv = convert<V>(c[k]), sv = convert<V>(sn[k]);
            yh[k * step] = convert<T>(cv * x1 - sv * x2);
            yh[k * step + second] = convert<T>(sv * x1 + cv * x2);
          }
          for (int64_t d = rd; d < D; ++d) yh[d] = xh[d];
        }
      }
    });
  });
}

}  // namespace

std::unique_ptr<Kernel> make_rms_norm(const KernelInit& init) {
  const int64_t axis = init.attr_int("axis", -1);
  const double epsilon = init.attr_float("epsilon", 1e-5f);
  if (init.op_type() == "RMSNormalizationGrad") {
    return make_kernel([axis, epsilon](KernelContext& ctx) { run_rms_norm_grad(ctx, axis, epsilon); });
  }
  const int64_t stash_type = init.attr_int("stash_type", 1);
  if (stash_type != 1) fail("attribute 'stash_type' = " + std::to_string(stash_type) + " is not supported (only 1, float32)");
  return make_kernel([axis, epsilon](KernelContext& ctx) { run_rms_norm(ctx, axis, epsilon); });
}

std::unique_ptr<Kernel> make_group_norm(const KernelInit& init) {
  const int64_t groups = init.required_int("num_groups");
  const double epsilon = init.attr_float("epsilon", 1e-5f);
  if (init.op_type() == "GroupNormalizationGrad") {
    return make_kernel([groups, epsilon](KernelContext& ctx) { run_group_norm_grad(ctx, groups, epsilon); });
  }
  const int version = op_version("", "GroupNormalization", init.opset());
  const int64_t stash_type = init.attr_int("stash_type", 1);
  if (stash_type != 1) fail("attribute 'stash_type' = " + std::to_string(stash_type) + " is not supported (only 1, float32)");
  return make_kernel([groups, epsilon, version](KernelContext& ctx) { run_group_norm(ctx, groups, epsilon, version); });
}

std::unique_ptr<Kernel> make_rotary_embedding(const KernelInit& init) {
  RotarySpec spec;
  spec.interleaved = init.attr_int("interleaved", 0) != 0;
  spec.rotary_dim = init.attr_int("rotary_embedding_dim", 0);
  spec.num_heads = init.attr_int("num_heads", 0);
  return make_kernel([spec](KernelContext& ctx) { run_rotary(ctx, spec); });
}

}  // namespace onnxtrain::ops
