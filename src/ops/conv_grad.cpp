// ConvGrad and ConvTransposeGrad (domain ai.onnxtrain, version 1), emitted by the gradient rules
// of Conv and ConvTranspose.
//
//   ConvGrad(dY, X, W) -> (dX, dW, dB)           with Conv's attributes
//   ConvTransposeGrad(dY, X, W) -> (dX, dW, dB)  with ConvTranspose's attributes
// are the gradients of Y = Conv(X, W, B) (ConvTranspose(X, W, B)) for the output gradient dY,
// which must have Y's shape. The attributes are the forward node's, resolved exactly as the
// forward op does (conv_geometry.h). Every output is optional; only the requested ones are
// computed. With col = im2col (conv_ref.h), per image n and group g:
//   Conv:          dX = ConvTranspose(dY, W) over the same geometry seen from Y
//                  dW_g = sum_n dY_g · im2col(X_g)^T
//   ConvTranspose: dX = Conv(dY, W) over the same geometry seen from Y
//                  dW_g = sum_n X_g · im2col(dY_g)^T  (the taps of dY each X element reached)
//   both:          dB[m] = sum of dY[:, m, ...]
// float32 with 1 to 3 spatial dims runs through oneDNN (convolution_ / deconvolution_backward_data
// and _backward_weights, hinted by a forward_training descriptor; layouts of oneDNN's choice,
// reordered from and to the ONNX tensors), one set of primitives per shape and requested
// outputs, cached in the kernel; float16/bfloat16 are converted to float32 and back; float64,
// other ranks and shapes oneDNN rejects use the reference loops below. dB comes from oneDNN's
// backward-weights pass when dW is requested too (one pass over dY), else from a plain sum.
// A Conv whose outer kernel taps read only padding runs over the others (conv_geometry.h
// crop_unreached_taps): their W gathered for dX, their dW scattered into zeros. A Conv whose
// output maps are small runs dX and dW as one matrix product over the batch each instead of
// oneDNN's primitives where conv_gemm.h's prefer_conv_gemm says so (CPUs without AVX-512).
//
// ConvGrad's optional input 3 (runtime/fusion.h share_weight_taps, never saved) is the forward
// FusedConv's output 1, W's taps under the crop (attribute weight_taps): used instead of gathering
// them again when it has the crop's shape (conv_geometry.h weight_taps).
//
// ConvGrad with attribute dw_taps = 1 (runtime/fusion.h crop_momentum_gradients, never saved)
// writes, where a float32 run crops (1 to 3 spatial dims, not ConvTranspose), dW over the kept
// taps only, [M, C/group, cropped k...], and as output 3 their int64 description
// (conv_geometry.h kept_taps_description), for a Momentum node with attribute gradient_taps
// (optimizers.cpp); elsewhere dW whole and an empty int64 [0] as output 3.
//
// ConvGrad with attributes dy_channel_block, x_channel_block and/or dx_channel_block = b (made by
// runtime/fusion.h block_convolution_tensors, never saved) reads dY and/or X and writes dX blocked
// by b channels, [N, C / b, D..., b]: float32 with b = conv_channel_block() runs oneDNN's primitives
// on those tensors as they are (its direct backward passes read and write that layout), anything
// else the plain path between permutations.
#include <algorithm>
#include <unordered_map>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/conv_gemm.h"
#include "ops/conv_geometry.h"
#include "ops/data_movement.h"
#include "ops/dnnl_util.h"
#include "ops/factories.h"

namespace onnxtrain::ops {

namespace {

namespace du = dnnl_util;

// ---------------------------------------------------------------------------------------------
// Reference

// The same op seen from its output: input and output channels and dims swapped. The pads,
// strides, dilations and kernel stay, so im2col / col2im over it map output taps to inputs.
ConvGeometry seen_from_output(const ConvGeometry& g) {
  ConvGeometry f = g;
  std::swap(f.C, f.M);
  std::swap(f.in, f.out);
  return f;
}

// y[i, j] += sum_l a[i, l] · b[j, l], all row-major: a [rows, inner], b [cols, inner],
// y [rows, cols].
template <class T>
void add_a_bt(const T* a, const T* b, T* y, int64_t rows, int64_t inner, int64_t cols) {
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, inner));
  parallel_for(rows * cols, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* ar = a + (r / cols) * inner;
      const T* br = b + (r % cols) * inner;
      T acc = 0;
      for (int64_t l = 0; l < inner; ++l) acc += ar[l] * br[l];
      y[r] += acc;
    }
  });
}

// dX (when dx) and dW (when dw) by the formulas of the header.
template <class T>
void conv_backward_reference(const ConvGeometry& g, bool transpose, const T* dy, const T* x,
                             const T* w, T* dx, T* dw) {
  using conv_ref_detail::im2col;
  const ConvGeometry f = seen_from_output(g);
  if (dx) {
    if (transpose) {
      conv_reference<T>(f, dy, w, nullptr, dx);
    } else {
      conv_transpose_reference<T>(f, dy, w, nullptr, dx);
    }
  }
  if (!dw) return;
  const int64_t cg = g.C / g.G, mg = g.M / g.G, k = g.kernel_size();
  const int64_t in_size = g.in_size(), out_size = g.out_size();
  std::fill(dw, dw + g.G * cg * mg * k, T(0));
  std::vector<T> col(static_cast<size_t>((transpose ? mg * in_size : cg * out_size) * k));
  for (int64_t n = 0; n < g.N; ++n) {
    for (int64_t grp = 0; grp < g.G; ++grp) {
      const T* x_g = x + (n * g.C + grp * cg) * in_size;
      const T* dy_g = dy + (n * g.M + grp * mg) * out_size;
      T* dw_g = dw + grp * cg * mg * k;
      if (transpose) {  // W [C, M/G, k...]: col [M/G * k, in]
        im2col(f, dy_g, mg, col.data());
        add_a_bt(x_g, col.data(), dw_g, cg, in_size, mg * k);
      } else {  // W [M, C/G, k...]: col [C/G * k, out]
        im2col(g, x_g, cg, col.data());
        add_a_bt(dy_g, col.data(), dw_g, mg, out_size, cg * k);
      }
    }
  }
}

// db[m] = sum of dy[:, m, ...] (accumulated in double).
template <class T>
void bias_grad(const ConvGeometry& g, const T* dy, T* db) {
  const int64_t size = g.out_size();
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, g.N * size));
  parallel_for(g.M, grain, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      double sum = 0;
      for (int64_t n = 0; n < g.N; ++n) {
        const T* p = dy + (n * g.M + m) * size;
        for (int64_t o = 0; o < size; ++o) sum += static_cast<double>(p[o]);
      }
      db[m] = static_cast<T>(sum);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// oneDNN
//
// The primitives choose the layouts of all their operands (format any, du::Operand): for the
// backward passes, blocked layouts are several times faster than plain ones even counting the
// reorders to and from the ONNX tensors (backward weights of a 16x64x56x56 3x3 convolution on
// 2 cores: 66 ms against 256 ms).

// The backward primitives for one shape: data (dX) and/or weights (dW).
struct GradEntry {
  bool use_reference = false;  // oneDNN has no implementation for these shapes
  DnnlConvDims dims;
  std::vector<float> dy_block;  // dims.embed: the part of dY that inputs reach
  bool data = false;            // dX: backward data
  dnnl::primitive data_primitive;
  du::Operand data_dy, w, dx;
  du::Scratchpad data_scratchpad;
  bool weights = false;  // dW: backward weights
  bool bias = false;     // dB too, from the same pass over dY
  dnnl::primitive weights_primitive;
  du::Operand weights_dy, x, dw;
  du::Scratchpad weights_scratchpad;
  dnnl::memory db;
  bool share_dy = false;  // both read dY in the same layout: reorder it once, into data_dy
  std::unordered_map<int, dnnl::memory> data_args, weights_args;  // the memories above by role
};

// Makes the primitives of one direction (Conv: convolution_*, ConvTranspose: deconvolution_*)
// and their operands; throws dnnl::error when oneDNN has no implementation.
// x_plain, dy_plain and dx_plain are the ONNX tensors' descriptors (plain, or blocked by channels
// for the attributes *_channel_block).
template <class Fwd, class BwdData, class BwdWeights>
void make_primitives(GradEntry& e, dnnl::algorithm algorithm, const dnnl::memory::desc& x_plain,
                     const dnnl::memory::desc& dy_plain, const dnnl::memory::desc& w_plain,
                     const dnnl::memory::desc& dx_plain) {
  using dnnl::memory;
  const auto any = [](const memory::desc& plain) {
    return memory::desc(plain.dims(), memory::data_type::f32, memory::format_tag::any);
  };
  const memory::desc x_any = any(x_plain), dy_any = any(dy_plain), w_any = any(w_plain);
  const DnnlConvDims& d = e.dims;
  const dnnl::engine& engine = du::cpu_engine();
  const typename Fwd::desc fwd_desc(dnnl::prop_kind::forward_training, algorithm, x_any, w_any,
                                    memory::desc(), dy_any, d.strides, d.dilates, d.pad_l, d.pad_r);
  const typename Fwd::primitive_desc hint(fwd_desc, engine);
  memory::desc data_dy;
  if (e.data) {
    const typename BwdData::desc desc(algorithm, x_any, w_any, dy_any, d.strides, d.dilates,
                                      d.pad_l, d.pad_r);
    const typename BwdData::primitive_desc pd(desc, du::user_scratchpad(), engine, hint);
    e.data_primitive = BwdData(pd);
    e.data_scratchpad = du::Scratchpad(pd.scratchpad_desc());
    data_dy = pd.diff_dst_desc();
    e.data_dy = du::Operand(dy_plain, data_dy, true);
    e.w = du::Operand(w_plain, pd.weights_desc(), true);
    e.dx = du::Operand(dx_plain, pd.diff_src_desc(), false);
    e.data_args = {{DNNL_ARG_DIFF_DST, e.data_dy.arg()}, {DNNL_ARG_WEIGHTS, e.w.arg()},
                   {DNNL_ARG_DIFF_SRC, e.dx.arg()}};
    e.data_scratchpad.add_to(e.data_args);
  }
  if (e.weights) {
    const memory::desc b_plain = e.bias ? du::plain_f32({dy_plain.dims()[1]}) : memory::desc();
    const typename BwdWeights::desc desc(algorithm, x_any, w_any, b_plain, dy_any, d.strides,
                                         d.dilates, d.pad_l, d.pad_r);
    const typename BwdWeights::primitive_desc pd(desc, du::user_scratchpad(), engine, hint);
    e.weights_primitive = BwdWeights(pd);
    e.weights_scratchpad = du::Scratchpad(pd.scratchpad_desc());
    e.share_dy = e.data && pd.diff_dst_desc() == data_dy;
    if (!e.share_dy) e.weights_dy = du::Operand(dy_plain, pd.diff_dst_desc(), true);
    e.x = du::Operand(x_plain, pd.src_desc(), true);
    e.dw = du::Operand(w_plain, pd.diff_weights_desc(), false);
    e.weights_args = {{DNNL_ARG_SRC, e.x.arg()},
                      {DNNL_ARG_DIFF_DST, (e.share_dy ? e.data_dy : e.weights_dy).arg()},
                      {DNNL_ARG_DIFF_WEIGHTS, e.dw.arg()}};
    e.weights_scratchpad.add_to(e.weights_args);
    if (e.bias) {
      e.db = memory(b_plain, engine, nullptr);
      e.weights_args[DNNL_ARG_DIFF_BIAS] = e.db;
    }
  }
}

// The channel blocks of dY, X and dX (0: plain).
struct GradBlocks {
  int64_t dy = 0, x = 0, dx = 0;
  bool any() const { return dy || x || dx; }
};

// A plain descriptor, or one blocked by conv_channel_block() channels where `blocked` (the only
// block run_blocked plans for).
dnnl::memory::desc tensor_desc(const dnnl::memory::dims& dims, int64_t blocked) {
  return blocked ? blocked_channels_f32(dims) : du::plain_f32(dims);
}

GradEntry plan(const ConvGeometry& g, bool transpose, bool want_dx, bool want_dw, bool want_db,
               GradBlocks blocks = {}) {
  GradEntry e;
  e.dims = dnnl_conv_dims(g);
  e.data = want_dx;
  e.weights = want_dw;
  e.bias = want_dw && want_db && !e.dims.embed;  // with embed, oneDNN sees only part of dY
  if (e.dims.empty) {  // no output is reached: the reference writes the zeros
    e.use_reference = true;
    return e;
  }
  const auto x = tensor_desc(dims_of(g.N, g.C, g.in), blocks.x);
  const auto dx = tensor_desc(dims_of(g.N, g.C, g.in), blocks.dx);
  const auto dy = tensor_desc(dims_of(g.N, g.M, e.dims.dst_dims), blocks.dy);
  const auto w = conv_weights_desc(g, transpose);
  try {
    if (transpose) {
      make_primitives<dnnl::deconvolution_forward, dnnl::deconvolution_backward_data,
                      dnnl::deconvolution_backward_weights>(
          e, dnnl::algorithm::deconvolution_direct, x, dy, w, dx);
    } else {
      make_primitives<dnnl::convolution_forward, dnnl::convolution_backward_data,
                      dnnl::convolution_backward_weights>(e, dnnl::algorithm::convolution_direct, x,
                                                          dy, w, dx);
    }
  } catch (const dnnl::error&) {  // no implementation for these shapes: use the reference
    GradEntry fallback;
    fallback.use_reference = true;
    return fallback;
  }
  if (e.dims.embed) {
    e.dy_block.resize(static_cast<size_t>(g.N * g.M * dims_product(e.dims.dst_dims)));
  }
  return e;
}

void execute(GradEntry& e, const ConvGeometry& g, const float* dy, const float* x, const float* w,
             float* dx, float* dw, float* db) {
  if (e.dims.embed) {
    copy_conv_block(g, e.dims, dy, e.dy_block.data(), false);
    dy = e.dy_block.data();
  }
  dnnl::stream& stream = du::cpu_stream();
  du::checked("run a convolution gradient", [&] {
    du::Operand* operands[] = {&e.data_dy, &e.w, &e.dx, &e.weights_dy, &e.x, &e.dw};
    size_t bytes = e.data_scratchpad.scratch_bytes() + e.weights_scratchpad.scratch_bytes();
    for (const du::Operand* o : operands) bytes += o->scratch_bytes();
    char* scratch = du::thread_scratch(bytes);
    for (du::Operand* o : operands) o->place(scratch);
    e.data_scratchpad.place(scratch);
    e.weights_scratchpad.place(scratch);
    if (dx) {
      e.data_dy.bind(dy);
      e.w.bind(w);
      e.dx.bind(dx);
      e.data_dy.reorder(stream);
      e.w.reorder(stream);
      e.data_primitive.execute(stream, e.data_args);
      e.dx.reorder(stream);
    }
    if (dw) {
      if (!e.share_dy) {  // else data_dy holds it already
        e.weights_dy.bind(dy);
        e.weights_dy.reorder(stream);
      }
      e.x.bind(x);
      e.dw.bind(dw);
      e.x.reorder(stream);
      if (e.bias) e.db.set_data_handle(db);
      e.weights_primitive.execute(stream, e.weights_args);
      e.dw.reorder(stream);
    }
    stream.wait();
  });
}

// ---------------------------------------------------------------------------------------------

class ConvGradKernel final : public Kernel {
 public:
  ConvGradKernel(ConvAttrs attrs, GradBlocks blocks, bool dw_taps)
      : attrs_(std::move(attrs)), blocks_(blocks), dw_taps_(dw_taps) {}

  void run(KernelContext& ctx) override {
    dw_crop_.reset();
    gradients(ctx);
    if (dw_taps_ && ctx.has_output(3)) {  // the taps dW holds, or an empty tensor for all of them
      ctx.set_output(3, dw_crop_ ? kept_taps_description(dw_geometry_, *dw_crop_) : Tensor(DataType::Int64, Shape{0}));
    }
  }

 private:
  void gradients(KernelContext& ctx) {
    const Tensor& dy = ctx.input(0);
    const Tensor& x = ctx.input(1);
    const Tensor& w = ctx.input(2);
    taps_ = ctx.has_input(3) ? &ctx.input(3) : nullptr;
    const Shape x_shape =
        blocks_.x ? channels_merged_shape(x, ctx.input_name(1), w.rank() - 2, blocks_.x, "x_channel_block") : x.shape();
    const ConvGeometry g =
        resolve_conv_geometry(attrs_, {x.view(x_shape), ctx.input_name(1)}, {w, ctx.input_name(2)});
    // Attribute dw_taps: dW over the taps that reach the input only, where the float32 paths crop.
    if (dw_taps_ && ctx.has_output(1) && x.dtype() == DataType::Float32 && w.dtype() == DataType::Float32 &&
        !attrs_.transpose && g.rank() <= 3) {
      dw_crop_ = crop_unreached_taps(g);
      dw_geometry_ = g;
    }
    const Shape y_shape = conv_output_shape(g);
    const std::string forward = attrs_.transpose ? "ConvTranspose" : "Conv";
    if (dy.dtype() != x.dtype()) {
      fail("input " + ctx.input_name(0) + " is " + dy.description() + ", expected " +
           std::string(dtype_name(x.dtype())) + " like " + ctx.input_name(1));
    }
    const Shape dy_expected = blocks_.dy ? blocked_or_fail(ctx, y_shape, blocks_.dy, "dy_channel_block") : y_shape;
    if (!(dy.shape() == dy_expected)) {
      fail("input " + ctx.input_name(0) + " has shape " + dy.shape().to_string() + ", expected " +
           dy_expected.to_string() + " (the output of " + forward + " for " + ctx.input_name(1) + " " +
           x.shape().to_string() + " and " + ctx.input_name(2) + " " + w.shape().to_string() +
           (blocks_.dy ? ", blocked by attribute dy_channel_block" : "") + ")");
    }
    const Shape dx_shape = blocks_.dx ? blocked_or_fail(ctx, x_shape, blocks_.dx, "dx_channel_block") : x_shape;
    if (blocks_.any() && run_blocked(ctx, g, dy, x, w, dx_shape)) return;
    // Blocked operands run the plain path between permutations.
    const Tensor dy_plain = blocks_.dy ? unblocked_channels(dy, blocks_.dy) : dy;
    const Tensor x_plain = blocks_.x ? unblocked_channels(x, blocks_.x) : x;
    const std::string what = ctx.node().op_type + " input " + ctx.input_name(1);
    visit_dtype<FloatTypes>(x.dtype(), what, [&]<class T>() {
      Tensor grads[3];
      for (int i = 0; i < 3; ++i) {
        if (!ctx.has_output(i)) continue;
        const bool direct = !is_half_v<T> && !(i == 0 && blocks_.dx);  // written where the output lies
        grads[i] = direct ? ctx.allocate_output(i, x.dtype(), shape_of(g, i, x_plain, w))
                          : Tensor(is_half_v<T> ? DataType::Float32 : x.dtype(), shape_of(g, i, x_plain, w));
      }
      if constexpr (is_half_v<T>) {
        const auto f32 = [](const Tensor& t) { return t.cast(DataType::Float32); };
        compute<float>(g, f32(dy_plain), f32(x_plain), f32(w), grads);
      } else {
        compute<T>(g, dy_plain, x_plain, w, grads);
      }
      for (int i = 0; i < 3; ++i) {
        if (!ctx.has_output(i)) continue;
        const Tensor out = grads[i].dtype() == x.dtype() ? grads[i] : grads[i].cast(x.dtype());
        if (i == 0 && blocks_.dx) {
          copy_into_channel_blocks(out, ctx.allocate_output(0, x.dtype(), dx_shape), blocks_.dx);
        } else if (is_half_v<T>) {
          ctx.set_output(i, out);
        }
      }
    });
  }

  // `plain` [N, C, D...] blocked by b channels; fails unless b divides C.
  static Shape blocked_or_fail(KernelContext& ctx, const Shape& plain, int64_t b, const char* attribute) {
    if (plain[1] % b != 0) {
      fail("attribute " + std::string(attribute) + " = " + std::to_string(b) + " does not divide the " +
           std::to_string(plain[1]) + " channels of " + plain.to_string() + " (node inputs " + ctx.input_name(1) +
           ", " + ctx.input_name(2) + ")");
    }
    return channel_blocked_shape(plain, b);
  }

  // With blocked operands (attributes *_channel_block): float32 through oneDNN's primitives on the
  // blocked tensors as they are, where the blocks are conv_channel_block() and oneDNN's direct
  // backward passes take the shapes. Returns false, having written nothing, elsewhere.
  bool run_blocked(KernelContext& ctx, const ConvGeometry& g, const Tensor& dy, const Tensor& x, const Tensor& w,
                   const Shape& dx_shape) {
    const int64_t block = conv_channel_block();
    for (int64_t b : {blocks_.dy, blocks_.x, blocks_.dx}) {
      if (b != 0 && b != block) return false;
    }
    const bool want_dx = ctx.has_output(0), want_dw = ctx.has_output(1), want_db = ctx.has_output(2);
    if (x.dtype() != DataType::Float32 || w.dtype() != DataType::Float32 || attrs_.transpose || g.rank() > 3 ||
        !(want_dx || want_dw) || (want_db && !want_dw) || dy.numel() == 0 || x.numel() == 0 || w.numel() == 0) {
      return false;
    }
    const std::optional<TapCrop> crop = crop_unreached_taps(g);
    const ConvGeometry& run_g = crop ? crop->geometry : g;
    if ((!want_dx && prefer_weight_grad_per_image(run_g)) || prefer_conv_gemm(run_g)) return false;
    du::CacheKey key;
    key.add(dy.shape()).add(x.shape()).add(w.shape()).add(want_dx).add(want_dw).add(want_db).add(blocks_.dy);
    key.add(blocks_.x).add(blocks_.dx);
    GradEntry& e = cache_.get(key, [&] { return plan(run_g, false, want_dx, want_dw, want_db, blocks_); });
    if (e.use_reference || e.dims.embed || (want_db && !e.bias)) return false;
    float* dx = want_dx ? ctx.allocate_output(0, x.dtype(), dx_shape).data<float>() : nullptr;
    float* dw = want_dw ? ctx.allocate_output(1, x.dtype(), shape_of(g, 1, x, w)).data<float>() : nullptr;
    float* db = want_db ? ctx.allocate_output(2, x.dtype(), Shape{g.M}).data<float>() : nullptr;
    execute_cropped(e, g, crop, dy.data<float>(), x.data<float>(), w.data<float>(), dx, dw, db, taps_, dw_crop_.has_value());
    return true;
  }

  // execute() over the taps of `crop` when there is one: W's for dX (`taps` where it holds them,
  // else gathered), dW's scattered back with zeros at the others (conv_geometry.h
  // crop_unreached_taps), or with `dw_cropped` written as they are into dw, crop's shape.
  static void execute_cropped(GradEntry& e, const ConvGeometry& g, const std::optional<TapCrop>& crop, const float* dy,
                              const float* x, const float* w, float* dx, float* dw, float* db, const Tensor* taps,
                              bool dw_cropped) {
    Tensor w_cropped, dw_taps;
    const float* w_run = w;
    float* dw_run = dw;
    if (crop && dx) {
      w_cropped = weight_taps(g, *crop, w_run, taps);
      w_run = w_cropped.data<float>();
    }
    const bool scatter = crop && dw && !dw_cropped;
    if (scatter) {
      dw_taps = Tensor(DataType::Float32, crop->weights_shape());
      dw_run = dw_taps.data<float>();
    }
    execute(e, crop ? crop->geometry : g, dy, x, w_run, dx, dw_run, db);
    if (scatter) scatter_taps(g, *crop, dw_run, dw);
  }

  // The shape of output i: dX like X, dW like W (dw_crop_'s cropped W where it is set), dB [M].
  Shape shape_of(const ConvGeometry& g, int i, const Tensor& x, const Tensor& w) const {
    return i == 0 ? x.shape() : i == 1 ? (dw_crop_ ? dw_crop_->weights_shape() : w.shape()) : Shape{g.M};
  }

  // grads: dX, dW, dB, each undefined when not requested.
  template <class T>
  void compute(const ConvGeometry& g, const Tensor& dy, const Tensor& x, const Tensor& w,
               Tensor* grads) {
    T* dx = grads[0].defined() ? grads[0].data<T>() : nullptr;
    T* dw = grads[1].defined() ? grads[1].data<T>() : nullptr;
    T* db = grads[2].defined() ? grads[2].data<T>() : nullptr;
    if (!dx && !dw) {
      if (db) bias_grad<T>(g, dy.data<T>(), db);
      return;
    }
    if (dy.numel() == 0 || x.numel() == 0 || w.numel() == 0) {  // nothing flows back
      if (dx) std::fill(dx, dx + x.numel(), T(0));
      if (dw) std::fill(dw, dw + grads[1].numel(), T(0));
      if (db) bias_grad<T>(g, dy.data<T>(), db);
      return;
    }
    if constexpr (std::is_same_v<T, float>) {
      if (g.rank() <= 3) {
        du::CacheKey key;
        key.add(dy.shape()).add(x.shape()).add(w.shape()).add(dx != nullptr).add(dw != nullptr);
        key.add(db != nullptr);
        // oneDNN runs over the taps that reach the input (conv_geometry.h crop_unreached_taps):
        // W's taps gathered for dX, dW's scattered back with zeros at the others.
        const std::optional<TapCrop> crop =
            attrs_.transpose ? std::nullopt : crop_unreached_taps(g);
        const ConvGeometry& run_g = crop ? crop->geometry : g;
        // With dw_crop_ (then crop is the same) dW is written over the cropped taps as it is.
        const bool scatter = crop && dw && !dw_crop_;
        if (!attrs_.transpose && !dx && prefer_weight_grad_per_image(run_g)) {  // sums of products per image
          Tensor dw_taps = scatter ? Tensor(DataType::Float32, crop->weights_shape()) : Tensor();
          float* dw_run = scatter ? dw_taps.data<float>() : dw;
          conv_gemm_weight_grad_per_image(run_g, dy.data<float>(), x.data<float>(), dw_run, db);
          if (scatter) scatter_taps(g, *crop, dw_run, dw);
          return;
        }
        if (!attrs_.transpose && prefer_conv_gemm(run_g)) {  // one product over the batch per output
          const Tensor w_cropped = crop && dx ? weight_taps(g, *crop, w.data<float>(), taps_) : Tensor();
          const float* w_run = crop && dx ? w_cropped.data<float>() : w.data<float>();
          Tensor dw_taps = scatter ? Tensor(DataType::Float32, crop->weights_shape()) : Tensor();
          float* dw_run = scatter ? dw_taps.data<float>() : dw;
          conv_gemm_backward(run_g, dy.data<float>(), x.data<float>(), w_run, dx, dw_run);
          if (scatter) scatter_taps(g, *crop, dw_run, dw);
          if (db) bias_grad<T>(g, dy.data<T>(), db);
          return;
        }
        GradEntry& e = cache_.get(key, [&] {
          return plan(run_g, attrs_.transpose, dx != nullptr, dw != nullptr, db != nullptr);
        });
        if (!e.use_reference) {
          execute_cropped(e, g, crop, dy.data<float>(), x.data<float>(), w.data<float>(), dx, dw, db, taps_,
                          dw_crop_.has_value());
          if (db && !e.bias) bias_grad<T>(g, dy.data<T>(), db);
          return;
        }
      }
    }
    if constexpr (std::is_same_v<T, float>) {
      if (dw && dw_crop_) {  // the reference's whole dW, then the kept taps
        Tensor full(DataType::Float32, w.shape());
        conv_backward_reference<T>(g, attrs_.transpose, dy.data<T>(), x.data<T>(), w.data<T>(), dx, full.data<T>());
        gather_taps(g, *dw_crop_, full.data<float>(), dw);
        if (db) bias_grad<T>(g, dy.data<T>(), db);
        return;
      }
    }
    conv_backward_reference<T>(g, attrs_.transpose, dy.data<T>(), x.data<T>(), w.data<T>(), dx, dw);
    if (db) bias_grad<T>(g, dy.data<T>(), db);
  }

  ConvAttrs attrs_;
  GradBlocks blocks_;
  bool dw_taps_;  // attribute dw_taps
  du::PrimitiveCache<GradEntry> cache_;
  const Tensor* taps_ = nullptr;  // the run's input 3, if any
  std::optional<TapCrop> dw_crop_;  // this run's crop of dW (attribute dw_taps), if any
  ConvGeometry dw_geometry_;        // and the geometry it crops
};

}  // namespace

std::unique_ptr<Kernel> make_conv_grad(const KernelInit& init) {
  const GradBlocks blocks{parse_channel_block(init, "dy_channel_block"), parse_channel_block(init, "x_channel_block"),
                          parse_channel_block(init, "dx_channel_block")};
  return std::make_unique<ConvGradKernel>(parse_conv_attrs(init, init.op_type() == "ConvTransposeGrad"), blocks,
                                          init.attr_int("dw_taps", 0) != 0);
}

}  // namespace onnxtrain::ops
