// Bitwise ops on integers (ONNX operator docs, ai.onnx): BitwiseAnd, BitwiseOr, BitwiseXor,
// BitwiseNot (18; int8-64, uint8-64), BitShift (11: uint8-64; 28: also int8-64).
//
// The binary ops broadcast their two inputs (numpy rules, ops/broadcast.h); both must have the
// same type. BitShift(X, Y, direction) shifts X by Y bits, LEFT or RIGHT. BitShift-28 defines
// every case: a signed right shift is arithmetic (sign-extending); a signed left shift moves
// bits into and past the sign bit (computed on the unsigned bit pattern, so never undefined);
// a shift amount that is negative or >= the type's width gives 0, or -1 for a right shift of a
// negative X. BitShift-11 (unsigned only) leaves a shift by the width or more undefined; it
// gives 0 here as in 28.
#include <limits>
#include <string>
#include <type_traits>

#include "core/dispatch.h"
#include "ops/broadcast.h"
#include "ops/factories.h"

namespace onnxtrain::ops {

namespace {

enum class BitOp { And, Or, Xor, ShiftLeft, ShiftRight };

template <class T>
T shift(T x, T y, bool left) {
  using U = std::make_unsigned_t<T>;
  constexpr int kBits = std::numeric_limits<U>::digits;
  const bool negative_x = std::is_signed_v<T> && x < T(0);
  const bool out_of_range = (std::is_signed_v<T> && y < T(0)) || static_cast<U>(y) >= static_cast<U>(kBits);
  if (out_of_range) return !left && negative_x ? T(-1) : T(0);
  const int s = static_cast<int>(y);
  if (left) return static_cast<T>(static_cast<U>(static_cast<U>(x) << s));
  if constexpr (std::is_signed_v<T>) {
    // Arithmetic shift, written without relying on the implementation's >> of negatives.
    return negative_x ? static_cast<T>(~(~x >> s)) : static_cast<T>(x >> s);
  } else {
    return static_cast<T>(x >> s);
  }
}

// f over the broadcast runs of two inputs (a plain loop per run, which vectorizes).
template <class T, class F>
void binary_runs(const Broadcast<2>& bc, const T* pa, const T* pb, T* po, F f) {
  bc.for_each_run([&](int64_t o, const auto& in, int64_t len, const auto& step) {
    const T* x = pa + in[0];
    const T* y = pb + in[1];
    T* z = po + o;
    if (step[0] && step[1]) {
      for (int64_t i = 0; i < len; ++i) z[i] = f(x[i], y[i]);
    } else if (step[0]) {
      const T yv = *y;
      for (int64_t i = 0; i < len; ++i) z[i] = f(x[i], yv);
    } else if (step[1]) {
      const T xv = *x;
      for (int64_t i = 0; i < len; ++i) z[i] = f(xv, y[i]);
    } else {
      const T v = f(*x, *y);
      for (int64_t i = 0; i < len; ++i) z[i] = v;
    }
  });
}

class BitwiseBinary final : public Kernel {
 public:
  explicit BitwiseBinary(const KernelInit& init) : name_(init.op_type()) {
    if (name_ == "BitwiseAnd") {
      op_ = BitOp::And;
    } else if (name_ == "BitwiseOr") {
      op_ = BitOp::Or;
    } else if (name_ == "BitwiseXor") {
      op_ = BitOp::Xor;
    } else {
      const std::string direction = init.attr_string("direction", "");
      if (direction != "LEFT" && direction != "RIGHT") {
        throw Error("BitShift attribute 'direction' must be \"LEFT\" or \"RIGHT\", got \"" + direction + "\"");
      }
      op_ = direction == "LEFT" ? BitOp::ShiftLeft : BitOp::ShiftRight;
    }
  }

  void run(KernelContext& ctx) override {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    if (a.dtype() != b.dtype()) {
      throw Error(name_ + " inputs " + ctx.input_name(0) + " " + a.description() + " and " + ctx.input_name(1) + " " +
                  b.description() + " must have the same type");
    }
    const Broadcast<2> bc({&a.shape(), &b.shape()});
    Tensor& out = ctx.allocate_output(0, a.dtype(), bc.shape());
    visit_dtype<IntTypes>(a.dtype(), name_ + " input " + ctx.input_name(0), [&]<class T>() {
      const T* pa = a.data<T>();
      const T* pb = b.data<T>();
      T* po = out.data<T>();
      switch (op_) {
        case BitOp::And: return binary_runs(bc, pa, pb, po, [](T x, T y) { return static_cast<T>(x & y); });
        case BitOp::Or: return binary_runs(bc, pa, pb, po, [](T x, T y) { return static_cast<T>(x | y); });
        case BitOp::Xor: return binary_runs(bc, pa, pb, po, [](T x, T y) { return static_cast<T>(x ^ y); });
        case BitOp::ShiftLeft: return binary_runs(bc, pa, pb, po, [](T x, T y) { return shift(x, y, true); });
        case BitOp::ShiftRight: return binary_runs(bc, pa, pb, po, [](T x, T y) { return shift(x, y, false); });
      }
    });
  }

 private:
  std::string name_;
  BitOp op_ = BitOp::And;
};

}  // namespace

std::unique_ptr<Kernel> make_bitwise(const KernelInit& init) { return std::make_unique<BitwiseBinary>(init); }

std::unique_ptr<Kernel> make_bitwise_not(const KernelInit& /*init*/) {
  return make_kernel([](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
    visit_dtype<IntTypes>(x.dtype(), "BitwiseNot input " + ctx.input_name(0), [&]<class T>() {
      const T* px = x.data<T>();
      T* py = y.data<T>();
      parallel_for(x.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) py[i] = static_cast<T>(~px[i]);
      });
    });
  });
}

}  // namespace onnxtrain::ops
