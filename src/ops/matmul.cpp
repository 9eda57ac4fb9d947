// MatMul and Gemm (ONNX operator docs "MatMul" and "Gemm").
//
// MatMul follows numpy.matmul: a 1-D first operand is a row vector [1, K], a 1-D second operand
// a column vector [K, 1], and the added dim is removed from the result; dims before the last two
// are batch dims and broadcast by numpy rules.
// Gemm computes Y = alpha * A' * B' + beta * C, A' = transA ? A^T : A of shape [M, K] and
// B' = transB ? B^T : B of shape [K, N]; C (optional from opset 11) is unidirectionally
// broadcast to [M, N]. Opsets before 7 have a `broadcast` attribute; C broadcasts the same way
// whatever its value. beta == 0 ignores C (as BLAS does).
//
// ai.onnxtrain.MatMulTransposed (runtime/fusion.h fuse_transpose_matmul) is MatMul of A' and B',
// A' = A with its last two dims swapped when transA = 1 (B' likewise; an operand so flagged
// must have rank >= 2, else an Error naming it).
//
// float32 runs through oneDNN: a 2-D product A' B' with B' = B^T and A' = A through its matmul
// primitive, made once per input shape and cached in the kernel, every other 2-D product through
// its sgemm, and batched MatMul through the matmul primitive (see use_sgemm); float16/bfloat16
// are converted to float32 and back; float64 and integers use the reference loops of gemm_ref.h
// (integers wrap on overflow, as in numpy).
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <memory>
#include <span>
#include <unordered_map>

#include "core/dispatch.h"
#include "core/vector_math.h"
#include "ops/broadcast.h"
#include "ops/data_movement.h"
#include "ops/dnnl_util.h"
#include "ops/matmul_primitive.h"
#include "ops/factories.h"
#include "ops/matmul_shape.h"
#include "ops/relu.h"
#include "ops/spatial_attrs.h"
#include "ops/gemm_ref.h"

namespace onnxtrain::ops {

namespace {

namespace du = dnnl_util;

// oneDNN memory descriptors have at most this many dims.
constexpr size_t kDnnlMaxRank = DNNL_MAX_NDIMS;

// Whether a 2-D float32 product A' B' runs through oneDNN's sgemm rather than its matmul
// primitive: unless only B is transposed (or only A, at the shapes named below). The primitive
// (brgemm) is slower when it must read a plain B or a transposed A; on two Xeon cores, the CNN's fc1 (M = 128, K/N = 3136 and 1024):
// dX = dY W (plain B) 3.4 ms by the primitive, 2.2 ms by sgemm; dW = dY^T X (transposed A)
// 2.7 and 2.1 ms; the forward X W^T 2.2 and 2.3 ms. The MLP's 512-wide layers run alike both ways.
// A transposed A alone goes to the primitive where transposed_a_prefers_matmul says so.
bool use_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K) {
  if (trans_a && !trans_b && transposed_a_prefers_matmul(M, N, K)) return false;
  return trans_a || !trans_b;
}

// y [M, N] = alpha * A' B' + beta * y, all row-major (A' = A^T when trans_a, A stored [K, M]; B'
// = B^T when trans_b, B stored [N, K]). beta = 0 does not read y. A transposed A alone takes the
// swapped product where transposed_a_prefers_swap says so.
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
           const float* a, const float* b, float beta, float* y) {
  if (trans_a && !trans_b && transposed_a_prefers_swap(M, N, K)) {
    swapped_transposed_a_product(M, N, K, alpha, a, M, b, N, beta, y, N);
    return;
  }
  du::check_status(row_major_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, a, trans_a ? M : K, b,
                                   trans_b ? K : N, beta, y, N),
                   "run sgemm");
}

// Y [M, N] = A [M, K] B' (+ bias [N] on every row) for float32 where B holds the same values at
// every run (an initializer: KernelInit::input_is_constant), B' = B [K, N], or B^T of B stored
// [N, K] when b_transposed. oneDNN's matmul primitive is planned with the weights in the layout
// it prefers (format any), B is reordered into that layout once and the copy kept, and the
// primitive adds the bias itself: no pass that fills Y with the bias first, and no strided or
// plain reads of B. Measured alone on this project's two EPYC cores (2 threads): 1.13 ms
// against 1.23 for sgemm after the bias fill at [4096, 256] x [256, 256] (BERT's projections),
// 4.63 against 5.20 at N = 1024, 218 against 245 us at the MLP's 128 x 784 x 512 (transB); the
// MLP's forward pass at batch 128 on one thread 713 against 773 us. The primitives of all row
// counts share one kept copy of B per layout they ask for (oneDNN 2.6 asked for the same layout
// at every row count tried, 2 to 4096), so a session meeting many batch sizes keeps one copy.
// On CPUs without AVX-512 the primitive is oneDNN's sgemm (gemm:jit), and format any gives the
// plain [K, N] layout, which runs 1.7-3.8x slower there than B^T, stored [N, K] (AMD EPYC Zen 3,
// 2 threads, alone: the CNN's fc1 128 x 3136 x 1024 22.5 against 5.9 ms, the MLP's 128 x 784 x
// 512 2.42 against 0.78, BERT's 4096 x 256 x 256 8.3 against 5.0): there the primitive is asked
// for B^T, which a Gemm with transB = 1 already stores, so such a B is read as it is and no copy
// is kept.
class ConstantWeightsProduct {
 public:
  // Whether oneDNN planned the problem; false leaves Y untouched for the caller's own path. With
  // `gelu`, Y = Gelu(A B' + bias) (oneDNN's eltwise_gelu_erf post-op, in the epilogue).
  bool run(const float* a, int64_t M, int64_t K, const float* b, bool b_transposed, int64_t N,
           const float* bias, float* y, bool gelu = false) {
    Entry& e = cache_.get(du::CacheKey().add(M).add(K).add(N).add(b_transposed).add(bias != nullptr).add(gelu),
                          [&] { return plan(M, K, N, b_transposed, bias != nullptr, gelu); });
    if (!e.planned) return false;
    dnnl::stream& stream = du::cpu_stream();
    du::checked("run a matmul on constant weights", [&] {
      if (!e.packed) {  // B read as stored
        e.weights.set_data_handle(const_cast<float*>(b));
      } else if (e.packed->from != b) {  // first run (or B moved): reorder it into the kept copy
        Packed& packed = *e.packed;
        packed.from = nullptr;
        packed.source.set_data_handle(const_cast<float*>(b));
        packed.reorder.execute(stream, packed.source, packed.memory);
        stream.wait();
        packed.from = b;
      }
      e.src.set_data_handle(const_cast<float*>(a));
      e.dst.set_data_handle(y);
      if (bias != nullptr) e.bias.set_data_handle(const_cast<float*>(bias));
      e.primitive.execute(stream, e.args);
      stream.wait();
    });
    return true;
  }

 private:
  // B in one layout a primitive asked for (`memory`, owned), the reorder that makes it from B as
  // stored (`source`, bound per reorder), and the B it was made from (nullptr: not yet made).
  struct Packed {
    dnnl::memory source, memory;
    dnnl::reorder reorder;
    const float* from = nullptr;
  };

  struct Entry {
    bool planned = false;
    dnnl::matmul primitive;
    dnnl::memory src, bias, dst;
    dnnl::memory weights;            // B as stored, when the primitive reads it so (no copy)
    std::shared_ptr<Packed> packed;  // else the copy, shared with the entries asking for its layout
    std::unordered_map<int, dnnl::memory> args;
  };

  Entry plan(int64_t M, int64_t K, int64_t N, bool b_transposed, bool has_bias, bool gelu) {
    Entry e;
    const dnnl::engine& engine = du::cpu_engine();
    const auto src = du::plain_f32({M, K}), dst = du::plain_f32({M, N}), bias = du::plain_f32({1, N});
    const auto b = b_transposed ? du::strided_f32({K, N}, {1, K}) : du::plain_f32({K, N});
    const dnnl::memory::desc wanted =
        du::has_avx512() ? dnnl::memory::desc({K, N}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::any)
               : du::strided_f32({K, N}, {1, K});  // B^T, stored [N, K]
    dnnl::matmul::primitive_desc pd;
    try {
      dnnl::primitive_attr attr;
      if (gelu) {
        dnnl::post_ops ops;
        ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_gelu_erf, 0.0f, 0.0f);
        attr.set_post_ops(ops);
      }
      pd = has_bias ? dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wanted, bias, dst), attr, engine)
                    : dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wanted, dst), attr, engine);
    } catch (const dnnl::error&) {  // no implementation: the caller's path
      return e;
    }
    du::checked("prepare a matmul on constant weights", [&] {
      e.primitive = dnnl::matmul(pd);
      e.src = dnnl::memory(src, engine, nullptr);
      e.dst = dnnl::memory(dst, engine, nullptr);
      if (pd.weights_desc() == b) {
        e.weights = dnnl::memory(b, engine, nullptr);
      } else {
        for (const auto& p : packed_) {
          if (p->source.get_desc() == b && p->memory.get_desc() == pd.weights_desc()) e.packed = p;
        }
        if (!e.packed) {
          Packed& p = *(e.packed = packed_.emplace_back(std::make_shared<Packed>()));
          p.source = dnnl::memory(b, engine, nullptr);
          p.memory = dnnl::memory(pd.weights_desc(), engine);
          p.reorder = dnnl::reorder(p.source, p.memory);
        }
      }
      e.args = {{DNNL_ARG_SRC, e.src},
                {DNNL_ARG_WEIGHTS, e.packed ? e.packed->memory : e.weights},
                {DNNL_ARG_DST, e.dst}};
      if (has_bias) {
        e.bias = dnnl::memory(bias, engine, nullptr);
        e.args[DNNL_ARG_BIAS] = e.bias;
      }
    });
    e.planned = true;
    return e;
  }

  du::PrimitiveCache<Entry> cache_;
  std::vector<std::shared_ptr<Packed>> packed_;  // every layout asked for so far
};

Shape concat(const Shape& a, std::initializer_list<int64_t> tail) {
  Shape s = a;
  for (int64_t d : tail) s.push_back(d);
  return s;
}

// ---------------------------------------------------------------------------------------------
// MatMul

template <class T>
void matmul_reference(const MatMulShape& s, const T* a, const T* b, T* y) {
  const auto a_off = batch_offsets(s.a_batch, s.batch, s.M * s.K);
  const auto b_off = batch_offsets(s.b_batch, s.batch, s.K * s.N);
  batched_matmul_ref<T>(a, a_off, b, b_off, y, s.M, s.K, s.N);
}

// The last two dims of `shape` swapped (the shape a transposed operand is read as).
Shape swapped_last2(Shape shape) {
  std::swap(shape[shape.size() - 2], shape[shape.size() - 1]);
  return shape;
}

// x with its last two dims swapped, as a new contiguous tensor.
Tensor transposed_last2(const Tensor& x) {
  std::vector<int64_t> perm(x.rank());
  for (size_t d = 0; d < perm.size(); ++d) perm[d] = static_cast<int64_t>(d);
  std::swap(perm[perm.size() - 2], perm[perm.size() - 1]);
  return permuted(x, perm);
}

// MatMul, and ai.onnxtrain.MatMulTransposed (runtime/fusion.h fuse_transpose_matmul): the
// product of A' and B' by MatMul's rules, where A' is A with its last two dims swapped when
// trans_a (B' likewise), read in place for float32 (sgemm's and the matmul primitive's strides)
// and copied for the other element types.
class MatMulKernel final : public Kernel {
 public:
  MatMulKernel(bool trans_a, bool trans_b, bool constant_b)
      : trans_a_(trans_a), trans_b_(trans_b), constant_b_(constant_b) {}

  // Output 0 of ctx = MatMul(a, b) for operands other than the node's inputs (MatMulPermuted's
  // permuted copies), by the paths run() takes; with its dims permuted by perm_y when not empty
  // (a permutation of the product's rank, checked by the caller).
  void run_on(KernelContext& ctx, const Tensor& a, const Tensor& b, std::span<const int64_t> perm_y = {}) {
    product(ctx, a, b, false, false, perm_y);
  }

  void run(KernelContext& ctx) override {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    if (a.dtype() != b.dtype()) {
      fail("inputs " + ctx.input_name(0) + " (" + a.description() + ") and " + ctx.input_name(1) +
           " (" + b.description() + ") must have the same element type");
    }
    for (int i : {0, 1}) {
      if ((i == 0 ? trans_a_ : trans_b_) && ctx.input(i).rank() < 2) {
        fail("input " + ctx.input_name(i) + " has shape " + ctx.input(i).shape().to_string() + ", but trans" +
             (i == 0 ? "A" : "B") + " = 1 needs rank >= 2");
      }
    }
    if ((trans_a_ || trans_b_) && (a.dtype() != DataType::Float32 || a.rank() < 2 || b.rank() < 2)) {
      product(ctx, trans_a_ ? transposed_last2(a) : a, trans_b_ ? transposed_last2(b) : b, false, false);
    } else {
      product(ctx, a, b, trans_a_, trans_b_);
    }
  }

 private:
  // Y = A' B' with A' = A^T (last two dims) when ta, B' likewise; ta and tb only for float32
  // operands of rank >= 2. With perm_y, output 0 is Y with its dims permuted (a copy).
  void product(KernelContext& ctx, const Tensor& a, const Tensor& b, bool ta, bool tb,
               std::span<const int64_t> perm_y = {}) {
    // Errors show the shapes the product reads, so a transposed operand is named as such.
    const MatMulShape s = matmul_shape(ta ? swapped_last2(a.shape()) : a.shape(), tb ? swapped_last2(b.shape()) : b.shape(),
                                       ctx.input_name(0) + (trans_a_ ? " transposed" : ""),
                                       ctx.input_name(1) + (trans_b_ ? " transposed" : ""));
    visit_dtype<NumericTypes>(a.dtype(), "MatMul input " + ctx.input_name(0), [&]<class T>() {
      if constexpr (is_half_v<T>) {
        Tensor y(DataType::Float32, s.out);
        compute<float>(s, a.cast(DataType::Float32), b.cast(DataType::Float32), y, false, false);
        ctx.set_output(0, perm_y.empty() ? y.cast(a.dtype()) : permuted(y.cast(a.dtype()), perm_y));
      } else if (!perm_y.empty()) {
        Tensor y(a.dtype(), s.out);
        compute<T>(s, a, b, y, ta, tb);
        copy_permuted(y, ctx.allocate_output(0, a.dtype(), permuted_shape(s.out, perm_y)), perm_y);
      } else {
        compute<T>(s, a, b, ctx.allocate_output(0, a.dtype(), s.out), ta, tb);
      }
    });
  }

  template <class T>
  void compute(const MatMulShape& s, const Tensor& a, const Tensor& b, Tensor& y, bool ta, bool tb) {
    if (y.numel() == 0) return;
    if (s.K == 0) {
      std::memset(y.raw_data(), 0, y.nbytes());
      return;
    }
    if constexpr (std::is_same_v<T, float>) {
      const int64_t rows = s.batch.numel() * s.M;
      if (constant_b_ && !ta && b.rank() == 2 && rows > 1 &&
          constant_product_.run(a.data<float>(), rows, s.K, b.data<float>(), tb, s.N, nullptr, y.data<float>())) {
        return;  // a linear layer without bias on constant weights, A's batch in its rows
      }
      if (s.batch.numel() == 1 || (s.b_batch.numel() == 1 && !ta)) {
        // one 2-D product, A's batch folded into its rows (use_sgemm)
        sgemm(ta, tb, rows, s.N, s.K, 1.0f, a.data<float>(), b.data<float>(), 0.0f, y.data<float>());
        return;
      }
      MatMulEntry& entry =
          cache_.get(du::CacheKey().add(a.shape()).add(b.shape()), [&] { return plan(s, ta, tb); });
      if (!entry.use_reference) {
        execute(entry, a.data<float>(), b.data<float>(), y.data<float>());
        return;
      }
      if (ta || tb) {  // no oneDNN implementation: the reference on transposed copies
        const Tensor a_copy = ta ? transposed_last2(a) : a, b_copy = tb ? transposed_last2(b) : b;
        matmul_reference<float>(s, a_copy.data<float>(), b_copy.data<float>(), y.data<float>());
        return;
      }
    }
    matmul_reference<T>(s, a.data<T>(), b.data<T>(), y.data<T>());
  }

  // A float32 operand's matrices [batch..., rows, cols] (batch dims 1 where broadcast), stored
  // row-major as [batch..., cols, rows] when `transposed`.
  static dnnl::memory::desc operand(const Shape& batch, int64_t rows, int64_t cols, bool transposed) {
    dnnl::memory::dims dims = du::to_dims(concat(batch, {rows, cols}));
    dnnl::memory::dims strides(dims.size());
    strides[dims.size() - 2] = transposed ? 1 : cols;
    strides[dims.size() - 1] = transposed ? rows : 1;
    int64_t running = rows * cols;
    for (size_t d = batch.size(); d-- > 0;) {
      strides[d] = running;
      running *= batch[d];
    }
    return {dims, dnnl::memory::data_type::f32, strides};
  }

  // The oneDNN problem for shapes where B has a batch (without one, sgemm runs it): a 3-D
  // batch when both batches are equal, else oneDNN's batch broadcasting.
  static MatMulEntry plan(const MatMulShape& s, bool ta, bool tb) {
    const int64_t batches = s.batch.numel();
    const bool same = s.a_batch == s.b_batch;
    if (!same && s.batch.size() + 2 > kDnnlMaxRank) {
      MatMulEntry entry;
      entry.use_reference = true;
      return entry;
    }
    const Shape a_batch = same ? Shape{batches} : s.a_batch, b_batch = same ? Shape{batches} : s.b_batch;
    const Shape y_batch = same ? Shape{batches} : s.batch;
    return make_entry(operand(a_batch, s.M, s.K, ta), operand(b_batch, s.K, s.N, tb),
                      du::plain_f32(du::to_dims(concat(y_batch, {s.M, s.N}))), {});
  }

  bool trans_a_ = false;
  bool trans_b_ = false;
  bool constant_b_ = false;  // B is an initializer (KernelInit::input_is_constant)
  du::PrimitiveCache<MatMulEntry> cache_;
  ConstantWeightsProduct constant_product_;
};

// ---------------------------------------------------------------------------------------------
// ai.onnxtrain.MatMulPermuted (runtime/fusion.h fuse_permuted_matmul, permute_product_outputs):
// Transpose(MatMul(Transpose(A, perm_a), Transpose(B, perm_b)), perm_y) by MatMul's and
// Transpose's rules, a perm absent for an operand read as stored or a product written as
// computed. float32 operands of one rank (3 or more) whose batch dims are equal are read in
// place and the product written in place: oneDNN's matmul primitive takes each as a view with
// the stored strides permuted (attention's head split, [batch, sequence, heads, head size] read
// as [batch, heads, sequence, head size]; the head merge and the split's gradients written back
// to [batch, sequence, heads, head size]). Measured alone on this project's two EPYC cores,
// [32, 4, 128, 64] by [32, 4, 64, 128] from the split layout: 0.58 ms against 0.53-0.54 on
// contiguous copies, where each copy costs ~0.25 ms in BERT's inference. Other cases copy the
// permuted operands and take MatMul's paths, and permute the product in a copy.
class MatMulPermutedKernel final : public Kernel {
 public:
  MatMulPermutedKernel(std::vector<int64_t> perm_a, std::vector<int64_t> perm_b, std::vector<int64_t> perm_y)
      : perm_{std::move(perm_a), std::move(perm_b)}, perm_y_(std::move(perm_y)) {}

  void run(KernelContext& ctx) override {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    if (a.dtype() != b.dtype()) {
      fail("inputs " + ctx.input_name(0) + " (" + a.description() + ") and " + ctx.input_name(1) + " (" +
           b.description() + ") must have the same element type");
    }
    const Shape view_a = view_shape(ctx, 0), view_b = view_shape(ctx, 1);
    const MatMulShape s = matmul_shape(view_a, view_b, ctx.input_name(0) + (perm_[0].empty() ? "" : " permuted"),
                                       ctx.input_name(1) + (perm_[1].empty() ? "" : " permuted"));
    if (!perm_y_.empty() && (perm_y_.size() != s.out.size() || !is_permutation(perm_y_))) {
      fail("attribute perm_y " + ints_to_string(perm_y_) + " is not a permutation of the dims of the product " +
           s.out.to_string());
    }
    if (a.dtype() == DataType::Float32 && view_a.size() == view_b.size() && view_a.size() >= 3 &&
        view_a.size() <= kDnnlMaxRank && s.a_batch == s.b_batch) {
      Tensor& y = ctx.allocate_output(0, DataType::Float32, perm_y_.empty() ? s.out : permuted_shape(s.out, perm_y_));
      if (y.numel() == 0) return;
      if (s.K == 0) {
        std::memset(y.raw_data(), 0, y.nbytes());
        return;
      }
      MatMulEntry& entry = cache_.get(du::CacheKey().add(a.shape()).add(b.shape()), [&] {
        return make_entry(view(a.shape(), perm_[0]), view(b.shape(), perm_[1]), written(s.out, perm_y_), {});
      });
      if (!entry.use_reference) {
        execute(entry, a.data<float>(), b.data<float>(), y.data<float>());
        return;
      }
    }
    // The permuted operands as contiguous copies, then MatMul's own paths (sgemm for a 2-D B, ...).
    plain_.run_on(ctx, perm_[0].empty() ? a : permuted(a, perm_[0]), perm_[1].empty() ? b : permuted(b, perm_[1]),
                  perm_y_);
  }

 private:
  // Input i's shape as the product reads it, after checking its perm against its rank.
  Shape view_shape(const KernelContext& ctx, int i) const {
    const Tensor& t = ctx.input(i);
    const std::vector<int64_t>& perm = perm_[i];
    if (perm.empty()) return t.shape();
    if (perm.size() != t.rank() || !is_permutation(perm)) {
      fail("attribute perm_" + std::string(i == 0 ? "a" : "b") + " " + ints_to_string(perm) +
           " is not a permutation of the dims of input " + ctx.input_name(i) + " " + t.shape().to_string());
    }
    return permuted_shape(t.shape(), perm);
  }

  // A contiguous tensor of `stored` read with its dims permuted by `perm` (none when empty).
  static dnnl::memory::desc view(const Shape& stored, const std::vector<int64_t>& perm) {
    const std::vector<int64_t> strides = strides_of(stored);
    dnnl::memory::dims dims, view_strides;
    for (size_t i = 0; i < stored.size(); ++i) {
      const auto d = static_cast<size_t>(perm.empty() ? static_cast<int64_t>(i) : perm[i]);
      dims.push_back(stored[d]);
      view_strides.push_back(strides[d]);
    }
    return du::strided_f32(dims, view_strides);
  }

  // The product of shape `product` as written into the contiguous Transpose(product, perm)
  // (plain when perm is empty): that stored tensor read back through the inverse permutation.
  static dnnl::memory::desc written(const Shape& product, const std::vector<int64_t>& perm) {
    if (perm.empty()) return du::plain_f32(du::to_dims(product));
    return view(permuted_shape(product, perm), inverse_permutation(perm));
  }

  std::vector<int64_t> perm_[2];
  std::vector<int64_t> perm_y_;
  du::PrimitiveCache<MatMulEntry> cache_;
  MatMulKernel plain_{false, false, false};
};

// ---------------------------------------------------------------------------------------------
// ai.onnxtrain.MatMulAdd (runtime/fusion.h fuse_matmul_add): Y = MatMul(A, B') + C for float32 A,
// B' = B [K, N], or B^T of B stored [N, K] when transB = 1, and C [N] or [1] (broadcast over Y's
// rows, as Add broadcasts it). A's batch dims fold into its rows. Where B is an initializer and C
// has N elements, oneDNN's matmul primitive runs on a kept copy of B in its own layout
// (ConstantWeightsProduct); otherwise, with transB and N elements of C (a linear layer of a
// training graph, whose weights change every step), the primitive reads B where it lies and adds
// the bias in its epilogue; in the remaining cases Y's rows start as C and sgemm accumulates the
// product onto them (beta 1). Either way the bias costs no pass of its own. Measured alone on
// this project's two EPYC cores at [4096, 256] x [256, 1024] with W [1024, 256] read transposed:
// 4.36-4.48 ms with the bias in the primitive against 4.84-4.95 for the product and a separate
// bias pass (1.08-1.19 against 1.22-1.39 at N = 256).
//
// With attribute activation = "Gelu" (runtime/fusion.h fuse_matmul_add_gelu, inference graphs),
// Y = Gelu(MatMul(A, B') + C) with Gelu's erf form: inside the primitive on constant weights
// (oneDNN's eltwise_gelu_erf post-op, in the epilogue while each block of Y is in cache), else
// vmath::gelu over Y after the product.
class MatMulAddKernel final : public Kernel {
 public:
  MatMulAddKernel(bool trans_b, bool constant_b, bool gelu) : trans_b_(trans_b), constant_b_(constant_b), gelu_(gelu) {}

  void run(KernelContext& ctx) override {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    const Tensor& c = ctx.input(2);
    for (int i = 0; i < 3; ++i) {
      if (ctx.input(i).dtype() != DataType::Float32) {
        fail("input " + ctx.input_name(i) + " is " + ctx.input(i).description() + ", expected float32");
      }
    }
    if (b.rank() != 2 || c.rank() != 1) {
      fail("inputs " + ctx.input_name(1) + " " + b.shape().to_string() + " and " + ctx.input_name(2) + " " +
           c.shape().to_string() + " must have shapes " + (trans_b_ ? "[N, K]" : "[K, N]") + " and [N]");
    }
    const MatMulShape s = matmul_shape(a.shape(), trans_b_ ? swapped_last2(b.shape()) : b.shape(), ctx.input_name(0),
                                       ctx.input_name(1) + (trans_b_ ? " transposed" : ""));
    const int64_t rows = s.batch.numel() * s.M, N = s.N, K = s.K;
    if (c.dim(0) != N && c.dim(0) != 1) {
      fail("input " + ctx.input_name(2) + " " + c.shape().to_string() + " does not broadcast to the product's shape " +
           s.out.to_string());
    }
    Tensor& y = ctx.allocate_output(0, DataType::Float32, s.out);
    if (rows == 0 || N == 0) return;
    const float* a_data = a.data<float>();
    const float* b_data = b.data<float>();
    const float* bias = c.data<float>();
    float* out = y.data<float>();
    const bool full_bias = c.dim(0) == N;
    if (full_bias && K > 0 && constant_b_ && constant_product_.run(a_data, rows, K, b_data, trans_b_, N, bias, out, gelu_)) {
      return;
    }
    product(a_data, b_data, bias, full_bias, rows, N, K, out);
    if (gelu_) {
      parallel_for(rows * N, kParallelGrain, [&](int64_t begin, int64_t end) { vmath::gelu(out + begin, out + begin, end - begin); });
    }
  }

 private:
  // out [rows, N] = A B' + C without the activation.
  void product(const float* a_data, const float* b_data, const float* bias, bool full_bias, int64_t rows, int64_t N,
               int64_t K, float* out) {
    if (full_bias && K > 0 && !constant_b_ && trans_b_) {  // B [N, K] read in place as [K, N], the bias in the epilogue
      MatMulEntry& e = cache_.get(du::CacheKey().add(rows).add(K).add(N), [&] {
        return make_entry(du::plain_f32({rows, K}), du::strided_f32({K, N}, {1, K}), du::plain_f32({rows, N}), {},
                          du::plain_f32({1, N}));
      });
      if (!e.use_reference) {
        execute(e, a_data, b_data, out, bias);
        return;
      }
    }
    parallel_for(rows, std::max<int64_t>(1, kParallelGrain / N), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        if (full_bias) {
          std::copy(bias, bias + N, out + r * N);
        } else {
          std::fill(out + r * N, out + (r + 1) * N, bias[0]);
        }
      }
    });
    if (K > 0) sgemm(false, trans_b_, rows, N, K, 1.0f, a_data, b_data, 1.0f, out);
  }

 private:
  bool trans_b_ = false;
  bool constant_b_ = false;  // B is an initializer (KernelInit::input_is_constant)
  bool gelu_ = false;        // attribute activation = "Gelu"
  ConstantWeightsProduct constant_product_;
  du::PrimitiveCache<MatMulEntry> cache_;
};

// ---------------------------------------------------------------------------------------------
// Gemm

struct GemmAttrs {
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.0f;
  float beta = 1.0f;
};

struct GemmShape {
  int64_t M = 0, K = 0, N = 0;
  bool use_c = false;  // C is present and beta != 0
  int64_t c_rows = 1;  // C seen as [c_rows, c_cols], each 1 (broadcast) or M / N
  int64_t c_cols = 1;
};

GemmShape gemm_shape(const KernelContext& ctx, const GemmAttrs& attrs) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  for (int i = 0; i < 2; ++i) {
    if (ctx.input(i).rank() != 2) {
      fail("input " + ctx.input_name(i) + " has shape " + ctx.input(i).shape().to_string() +
           ", expected rank 2");
    }
  }
  GemmShape s;
  s.M = attrs.trans_a ? a.dim(1) : a.dim(0);
  s.K = attrs.trans_a ? a.dim(0) : a.dim(1);
  const int64_t b_rows = attrs.trans_b ? b.dim(1) : b.dim(0);
  s.N = attrs.trans_b ? b.dim(0) : b.dim(1);
  if (b_rows != s.K) {
    fail("inputs " + ctx.input_name(0) + " " + a.shape().to_string() +
         " (transA=" + std::to_string(attrs.trans_a) + ") and " + ctx.input_name(1) + " " +
         b.shape().to_string() + " (transB=" + std::to_string(attrs.trans_b) +
         ") cannot be multiplied: " + std::to_string(s.K) + " columns against " +
         std::to_string(b_rows) + " rows");
  }
  for (int i = 1; i < 3; ++i) {
    if (ctx.has_input(i) && ctx.input(i).dtype() != a.dtype()) {
      fail("input " + ctx.input_name(i) + " is " + ctx.input(i).description() + ", expected " +
           std::string(dtype_name(a.dtype())) + " like " + ctx.input_name(0));
    }
  }
  if (ctx.has_input(2)) {
    const Shape& c = ctx.input(2).shape();
    s.c_rows = c.size() == 2 ? c[0] : 1;
    s.c_cols = c.empty() ? 1 : c.back();
    if (c.size() > 2 || (s.c_rows != 1 && s.c_rows != s.M) || (s.c_cols != 1 && s.c_cols != s.N)) {
      fail("input " + ctx.input_name(2) + " has shape " + c.to_string() +
           ", which does not broadcast to [M, N] = [" + std::to_string(s.M) + "," +
           std::to_string(s.N) + "]");
    }
    s.use_c = attrs.beta != 0.0f;
  }
  return s;
}

// y [M, N] = C broadcast to [M, N].
template <class T>
void fill_with_c(const GemmShape& s, const T* c, T* y) {
  parallel_for(s.M, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, s.N)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t i = begin; i < end; ++i) {
                   const T* c_row = c + (s.c_rows == 1 ? 0 : i * s.c_cols);
                   T* y_row = y + i * s.N;
                   if (s.c_cols == 1) {
                     std::fill(y_row, y_row + s.N, c_row[0]);
                   } else {
                     std::copy(c_row, c_row + s.N, y_row);
                   }
                 }
               });
}

// y = alpha * y + beta * C (broadcast), after y = A' B' (reference path).
template <class T>
void gemm_epilogue(const GemmShape& s, const GemmAttrs& attrs, const T* c, T* y) {
  const bool plain_sum = attrs.alpha == 1.0f && attrs.beta == 1.0f;
  if (!s.use_c && attrs.alpha == 1.0f) return;
  for (int64_t i = 0; i < s.M; ++i) {
    T* y_row = y + i * s.N;
    const T* c_row = s.use_c ? c + (s.c_rows == 1 ? 0 : i * s.c_cols) : nullptr;
    for (int64_t j = 0; j < s.N; ++j) {
      const T cv = c_row ? c_row[s.c_cols == 1 ? 0 : j] : T(0);
      if constexpr (std::is_integral_v<T>) {
        using Acc = gemm_acc_t<T>;
        y_row[j] = plain_sum ? static_cast<T>(static_cast<Acc>(y_row[j]) + static_cast<Acc>(cv))
                             : convert<T>(attrs.alpha * static_cast<double>(y_row[j]) +
                                          attrs.beta * static_cast<double>(cv));
      } else {
        y_row[j] = static_cast<T>(attrs.alpha) * y_row[j] +
                   (c_row ? static_cast<T>(attrs.beta) * cv : T(0));
      }
    }
  }
}

// What ai.onnxtrain.FusedGemm applies to the product (runtime/fusion.h fuse_gemm_relu): Relu,
// or ReluGrad's mask, dX = product where Y > 0, else 0, with Y its input 3.
enum class GemmActivation { None, Relu, ReluGrad };

// Gemm, and ai.onnxtrain.FusedGemm with an activation.
class GemmKernel final : public Kernel {
 public:
  GemmKernel(GemmAttrs attrs, bool constant_b, GemmActivation activation = GemmActivation::None)
      : attrs_(attrs), constant_b_(constant_b), activation_(activation) {}

  void run(KernelContext& ctx) override {
    const GemmShape s = gemm_shape(ctx, attrs_);
    const Tensor& a = ctx.input(0);
    const Shape out{s.M, s.N};
    if (activation_ == GemmActivation::ReluGrad) {
      const Tensor& y = ctx.input(3);
      if (y.dtype() != a.dtype() || !(y.shape() == out) || !is_floating(y.dtype())) {
        fail("input " + ctx.input_name(3) + " (ReluGrad's Y) is " + y.description() + ", expected " +
             std::string(dtype_name(a.dtype())) + " of the product's shape " + out.to_string() +
             " and a floating-point type");
      }
    }
    visit_dtype<NumericTypes>(a.dtype(), "Gemm input " + ctx.input_name(0), [&]<class T>() {
      const Tensor& b = ctx.input(1);
      const Tensor c = ctx.has_input(2) ? ctx.input(2) : Tensor();
      // ReluGrad's mask on the result (float types only: FusedGemm's ReluGrad takes no others).
      const auto mask = [&](Tensor& result) {
        if constexpr (is_float_v<T>) {
          if (activation_ == GemmActivation::ReluGrad) relu_grad<T>(ctx.input(3).data<T>(), result.data<T>(), result.data<T>(), result.numel());
        }
      };
      if constexpr (is_half_v<T>) {
        Tensor y(DataType::Float32, out);
        const Tensor c32 = c.defined() ? c.cast(DataType::Float32) : Tensor();
        compute<float>(s, a.cast(DataType::Float32), b.cast(DataType::Float32), c32, y);
        Tensor rounded = y.cast(a.dtype());  // Relu commutes with the rounding to half
        mask(rounded);
        ctx.set_output(0, std::move(rounded));
      } else {
        Tensor& y = ctx.allocate_output(0, a.dtype(), out);
        compute<T>(s, a, b, c, y);
        mask(y);
      }
    });
  }

 private:
  // y = Gemm(a, b, c), with Relu applied for activation_ Relu.
  template <class T>
  void compute(const GemmShape& s, const Tensor& a, const Tensor& b, const Tensor& c, Tensor& y) {
    if (y.numel() == 0) return;
    if (!product<T>(s, a, b, c, y) && activation_ == GemmActivation::Relu) relu_in_place<T>(y.data<T>(), y.numel());
  }

  // y = Gemm(a, b, c); true when activation_ Relu was applied too.
  template <class T>
  bool product(const GemmShape& s, const Tensor& a, const Tensor& b, const Tensor& c, Tensor& y) {
    const T* c_data = s.use_c ? c.data<T>() : nullptr;
    if (s.K == 0) {  // A' B' is all zeros
      std::memset(y.raw_data(), 0, y.nbytes());
      gemm_epilogue<T>(s, attrs_, c_data, y.data<T>());
      return false;
    }
    if constexpr (std::is_same_v<T, float>) {
      if (s.M == 1) {  // one row (batch-1 inference): a matrix-vector product
        gemv(s, a.data<float>(), b.data<float>(), c_data, y.data<float>());
        return true;
      }
      // A linear layer on constant weights (Y = A B' + C, C absent or one row of N).
      const bool bias_row = !s.use_c || (attrs_.beta == 1.0f && s.c_rows == 1 && s.c_cols == s.N);
      if (constant_b_ && !attrs_.trans_a && attrs_.alpha == 1.0f && bias_row &&
          constant_product_.run(a.data<float>(), s.M, s.K, b.data<float>(), attrs_.trans_b, s.N, c_data,
                                y.data<float>())) {
        return false;
      }
      if (use_sgemm(attrs_.trans_a, attrs_.trans_b, s.M, s.N, s.K)) {
        if (s.use_c) fill_with_c<float>(s, c_data, y.data<float>());
        sgemm(attrs_.trans_a, attrs_.trans_b, s.M, s.N, s.K, attrs_.alpha, a.data<float>(),
              b.data<float>(), s.use_c ? attrs_.beta : 0.0f, y.data<float>());
        return false;
      }
      // A bias row of N elements goes into the primitive's epilogue; any other C fills y first.
      const bool epilogue_bias = s.use_c && attrs_.alpha == 1.0f && attrs_.beta == 1.0f && s.c_rows == 1 &&
                                 s.c_cols == s.N;
      MatMulEntry& entry = cache_.get(du::CacheKey().add(a.shape()).add(b.shape()).add(s.use_c).add(epilogue_bias),
                                      [&] { return plan(s, epilogue_bias); });
      if (!entry.use_reference) {
        if (s.use_c && !epilogue_bias) fill_with_c<float>(s, c_data, y.data<float>());
        execute(entry, a.data<float>(), b.data<float>(), y.data<float>(), epilogue_bias ? c_data : nullptr);
        return false;
      }
    }
    // Transposed operands are copied row-major so that the product runs i-k-j.
    const T* a_data = a.data<T>();
    const T* b_data = b.data<T>();
    std::vector<T> a_t, b_t;
    if (attrs_.trans_a) a_data = (a_t = transposed(a_data, s.K, s.M)).data();
    if (attrs_.trans_b) b_data = (b_t = transposed(b_data, s.N, s.K)).data();
    matmul_ref<T>(a_data, b_data, y.data<T>(), s.M, s.K, s.N);
    gemm_epilogue<T>(s, attrs_, c_data, y.data<T>());
    return false;
  }

  // Rows of B the transposed-B matrix-vector product takes at once (dot_rows): 12 accumulators
  // and x in 13 of AVX2's 16 vector registers. The CNN's fc1 at batch 1 (1x3136 by 3136x1024,
  // 12.8 MB of B from L3), two threads of the Zen 4 VM of 2026-11-29, best of 300 alone: 4 rows
  // 93-97 us, 8 rows 84-88, 12 rows 80 (160 GB/s; a plain read of B 69 us).
  static constexpr int kGemvRows = 12;

  // out[i] = x . r_i for the R rows r_i = r + i K of K floats: each as 8-lane partial sums over
  // the first K / 8 * 8 elements (vector FMAs), the lanes added (l + l4, then pairwise), then the
  // rest in order; the same order for every R.
  template <int R>
  static void dot_rows(const float* __restrict x, const float* __restrict r, int64_t K, float* out) {
    int64_t k = 0;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 acc[R];
    for (int i = 0; i < R; ++i) acc[i] = _mm256_setzero_ps();
    for (; k + 8 <= K; k += 8) {
      const __m256 xv = _mm256_loadu_ps(x + k);
      for (int i = 0; i < R; ++i) acc[i] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(r + i * K + k), acc[i]);
    }
    for (int i = 0; i < R; ++i) {
      __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc[i]), _mm256_extractf128_ps(acc[i], 1));
      h = _mm_hadd_ps(h, h);
      h = _mm_hadd_ps(h, h);
      out[i] = _mm_cvtss_f32(h);
    }
#else
    for (int i = 0; i < R; ++i) out[i] = 0.0f;
#endif
    for (; k < K; ++k) {
      for (int i = 0; i < R; ++i) out[i] += x[k] * r[i * K + k];
    }
  }

  // y [1, N] = alpha * a B' + beta * C for a row a of K elements (A' is [1, K] with or without
  // transA). oneDNN's matmul takes about 0.22 ms for 1x3136 by 3136x1024 on two cores here;
  // these loops, parallel over N and vectorized along the rows of B, read B once at memory speed.
  void gemv(const GemmShape& s, const float* a, const float* b, const float* c, float* y) const {
    const float alpha = attrs_.alpha, beta = attrs_.beta;
    const bool relu = activation_ == GemmActivation::Relu;
    auto epilogue = [&](int64_t j, float dot) {
      const float cv = c ? beta * c[s.c_cols == 1 ? 0 : j] : 0.0f;
      const float v = alpha * dot + cv;
      return relu && v < 0.0f ? 0.0f : v;
    };
    if (attrs_.trans_b) {  // B is [N, K]: y[j] = a . B[j, :]
      parallel_for(s.N, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, s.K)), [&](int64_t begin, int64_t end) {
        int64_t j = begin;
        float dots[kGemvRows];
        // kGemvRows rows at a time, then 4, then one: every row's sum in the same order (dot_rows).
        for (; j + kGemvRows <= end; j += kGemvRows) {
          dot_rows<kGemvRows>(a, b + j * s.K, s.K, dots);
          for (int i = 0; i < kGemvRows; ++i) y[j + i] = epilogue(j + i, dots[i]);
        }
        for (; j + 4 <= end; j += 4) {
          dot_rows<4>(a, b + j * s.K, s.K, dots);
          for (int i = 0; i < 4; ++i) y[j + i] = epilogue(j + i, dots[i]);
        }
        for (; j < end; ++j) {
          dot_rows<1>(a, b + j * s.K, s.K, dots);
          y[j] = epilogue(j, dots[0]);
        }
      });
      return;
    }
    // B is [K, N]: y = sum_k a[k] B[k, :], in column blocks that stay in cache.
    constexpr int64_t kBlock = 256;
    const int64_t blocks = (s.N + kBlock - 1) / kBlock;
    parallel_for(blocks, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, s.K * kBlock)), [&](int64_t begin, int64_t end) {
      alignas(64) float acc[kBlock];
      const float* __restrict x = a;
      const int64_t K = s.K, N = s.N;
      for (int64_t blk = begin; blk < end; ++blk) {
        const int64_t j0 = blk * kBlock, len = std::min(kBlock, N - j0);
        std::fill(acc, acc + len, 0.0f);
        for (int64_t k = 0; k < K; ++k) {
          const float ak = x[k];
          const float* __restrict row = b + k * N + j0;
          float* __restrict out = acc;
#pragma omp simd
          for (int64_t j = 0; j < len; ++j) out[j] += ak * row[j];
        }
        for (int64_t j = 0; j < len; ++j) y[j0 + j] = epilogue(j0 + j, acc[j]);
      }
    });
  }

  // dst = alpha * A' B' (+ beta * dst, dst prefilled with C) for the layouts that do not run
  // through sgemm (use_sgemm: A B^T, and A^T B at the shapes transposed_a_prefers_matmul
  // names): alpha is the output scale, beta a sum post-op, a transposed operand is expressed by
  // its strides. With `epilogue_bias` (alpha = beta = 1, C one row of N: a linear layer) the
  // primitive adds C itself instead of a pass filling dst: the MLP's training step (its weights
  // are inputs there) 1.22-1.28 -> 1.20-1.22 ms in steady state, four alternating pairs on two
  // EPYC cores; the same sums (c + AB either way), so the same losses.
  MatMulEntry plan(const GemmShape& s, bool epilogue_bias) const {
    const auto a = attrs_.trans_a ? du::strided_f32({s.M, s.K}, {1, s.M}) : du::plain_f32({s.M, s.K});
    const auto b = attrs_.trans_b ? du::strided_f32({s.K, s.N}, {1, s.K}) : du::plain_f32({s.K, s.N});
    dnnl::primitive_attr attr;
    du::checked("set Gemm's alpha and beta", [&] {
      if (attrs_.alpha != 1.0f) attr.set_output_scales(0, {attrs_.alpha});
      if (s.use_c && !epilogue_bias) {
        dnnl::post_ops ops;
        ops.append_sum(attrs_.beta);
        attr.set_post_ops(ops);
      }
    });
    const dnnl::memory::desc bias = epilogue_bias ? du::plain_f32({1, s.N}) : dnnl::memory::desc();
    return make_entry(a, b, du::plain_f32({s.M, s.N}), attr, bias);
  }

  GemmAttrs attrs_;
  bool constant_b_ = false;  // B is an initializer (KernelInit::input_is_constant)
  GemmActivation activation_ = GemmActivation::None;  // FusedGemm's
  du::PrimitiveCache<MatMulEntry> cache_;
  ConstantWeightsProduct constant_product_;
};

}  // namespace

std::unique_ptr<Kernel> make_matmul(const KernelInit& init) {
  return std::make_unique<MatMulKernel>(false, false, init.input_is_constant(1));
}

std::unique_ptr<Kernel> make_matmul_transposed(const KernelInit& init) {
  return std::make_unique<MatMulKernel>(init.attr_int("transA", 0) != 0, init.attr_int("transB", 0) != 0,
                                        init.input_is_constant(1));
}

std::unique_ptr<Kernel> make_matmul_permuted(const KernelInit& init) {
  return std::make_unique<MatMulPermutedKernel>(init.attr_ints("perm_a"), init.attr_ints("perm_b"),
                                                init.attr_ints("perm_y"));
}

std::unique_ptr<Kernel> make_matmul_add(const KernelInit& init) {
  const std::string activation = init.attr_string("activation", "");
  if (!activation.empty() && activation != "Gelu") fail("attribute activation is '" + activation + "', expected 'Gelu' or none");
  return std::make_unique<MatMulAddKernel>(init.attr_int("transB", 0) != 0, init.input_is_constant(1), activation == "Gelu");
}

namespace {
GemmAttrs gemm_attrs(const KernelInit& init) {
  GemmAttrs attrs;
  attrs.trans_a = init.attr_int("transA", 0) != 0;
  attrs.trans_b = init.attr_int("transB", 0) != 0;
  attrs.alpha = init.attr_float("alpha", 1.0f);
  attrs.beta = init.attr_float("beta", 1.0f);
  return attrs;
}
}  // namespace

std::unique_ptr<Kernel> make_gemm(const KernelInit& init) {
  return std::make_unique<GemmKernel>(gemm_attrs(init), init.input_is_constant(1));
}

std::unique_ptr<Kernel> make_fused_gemm(const KernelInit& init) {
  const std::string activation = init.attr_string("activation", "");
  if (activation != "Relu" && activation != "ReluGrad") {
    fail("attribute activation is '" + activation + "', expected 'Relu' or 'ReluGrad'");
  }
  return std::make_unique<GemmKernel>(gemm_attrs(init), init.input_is_constant(1),
                                      activation == "Relu" ? GemmActivation::Relu : GemmActivation::ReluGrad);
}

}  // namespace onnxtrain::ops
