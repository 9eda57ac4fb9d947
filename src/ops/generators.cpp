// Generators: ops that make tensors from attributes or shapes (ONNX operator docs, ai.onnx):
//   Constant (1-25: `value`; from 12 also value_float, value_floats, value_int, value_ints),
//   ConstantOfShape (9-25), Range (11-27), EyeLike (9-22). The versions after 17 of Constant,
//   ConstantOfShape and EyeLike add element types only.
// Limits: Constant's value_string, value_strings and sparse_value are an Error (onnxtrain
// tensors hold no strings and no sparse layout). The Constant output shares the attribute's
// storage without a copy, as views of initializers do: kernels must not write into inputs.
// Range computes its length exactly for integers (an overflowing length is an Error) and in
// float64 for floating types; element i is start + i * delta (float64 for floating types,
// wrapping integer arithmetic for integers). Range-27 computes float16 and bfloat16 in its
// `stash_type` (FLOAT, the default, or DOUBLE), rounding each element once to the output type.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/factories.h"

namespace onnxtrain::ops {

namespace {

// A value as a number C++ can compute with (float for float16/bfloat16).
template <class T>
auto widen_value(T v) {
  if constexpr (is_half_v<T>) {
    return static_cast<float>(v);
  } else {
    return v;
  }
}

// --- Constant ---
Tensor constant_value(const KernelInit& init) {
  static const char* const kUnsupported[] = {"sparse_value", "value_string", "value_strings"};
  for (const char* name : kUnsupported) {
    if (init.has_attr(name)) {
      throw Error(std::string("Constant attribute '") + name +
                  "' is not supported (onnxtrain has no string or sparse tensors)");
    }
  }
  static const char* const kValues[] = {"value", "value_float", "value_floats", "value_int", "value_ints"};
  std::string given;
  for (const char* name : kValues) {
    if (!init.has_attr(name)) continue;
    if (!given.empty()) {
      throw Error("Constant has attributes '" + given + "' and '" + name + "'; exactly one value is allowed");
    }
    given = name;
  }
  if (given.empty()) {
    throw Error(
        "Constant needs one of the attributes 'value', 'value_float', 'value_floats', "
        "'value_int', 'value_ints'");
  }
  if (given != "value" && init.opset() < 12) {
    throw Error("Constant attribute '" + given + "' needs opset 12 or later (the model imports opset " +
                std::to_string(init.opset()) + ")");
  }
  if (given == "value") return *init.attr_tensor("value");
  if (given == "value_float") return Tensor::scalar<float>(init.attr_float("value_float", 0.0f));
  if (given == "value_int") return Tensor::scalar<int64_t>(init.attr_int("value_int", 0));
  if (given == "value_floats") {
    const std::vector<float> v = init.attr_floats("value_floats");
    return Tensor::from_vector<float>(Shape{static_cast<int64_t>(v.size())}, v);
  }
  const std::vector<int64_t> v = init.attr_ints("value_ints");
  return Tensor::from_vector<int64_t>(Shape{static_cast<int64_t>(v.size())}, v);
}

// Fills all of t with `value` (a tensor of the same dtype holding at least one element).
void fill_with(Tensor& t, const Tensor& value) {
  visit_dtype<AllTypes>(t.dtype(), "fill value", [&]<class T>() {
    const T v = value.data<T>()[0];
    T* out = t.data<T>();
    parallel_for(t.numel(), kParallelGrain, [&](int64_t b, int64_t e) { std::fill(out + b, out + e, v); });
  });
}

// The one value of a 0-D or one-element tensor input (Range's start, limit, delta).
const Tensor& scalar_arg(const KernelContext& ctx, int i, const char* role) {
  const Tensor& t = ctx.input(i);
  if (t.numel() != 1 || t.rank() > 1) {
    throw Error("Range input " + ctx.input_name(i) + " (" + role + ") must be a scalar, got " +
                t.description());
  }
  return t;
}

// Number of elements of Range(start, limit, delta): max(ceil((limit - start) / delta), 0).
template <class T>
int64_t range_count(T start, T limit, T delta, const std::string& what) {
  if constexpr (is_float_v<T>) {
    const double s = static_cast<double>(widen_value(start)), l = static_cast<double>(widen_value(limit)),
                 d = static_cast<double>(widen_value(delta));
    const double n = std::ceil((l - s) / d);
    if (d == 0 || !std::isfinite(n)) {
      throw Error(what + ": start " + std::to_string(s) + ", limit " + std::to_string(l) + " and delta " +
                  std::to_string(d) + " give no finite number of elements");
    }
    if (n >= 9.0e18) throw Error(what + ": " + std::to_string(n) + " elements are too many");
    return n > 0 ? static_cast<int64_t>(n) : 0;
  } else {
    if (delta == 0) throw Error(what + ": delta is 0");
    if ((delta > 0 && limit <= start) || (delta < 0 && limit >= start)) return 0;
    // |limit - start| and |delta| as unsigned 64-bit numbers, exact for every integer type.
    const auto distance = limit > start ? static_cast<uint64_t>(limit) - static_cast<uint64_t>(start)
                                        : static_cast<uint64_t>(start) - static_cast<uint64_t>(limit);
    const auto step = delta > 0 ? static_cast<uint64_t>(delta) : uint64_t(0) - static_cast<uint64_t>(delta);
    const uint64_t n = distance / step + (distance % step != 0);
    if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw Error(what + ": " + std::to_string(n) + " elements are too many");
    }
    return static_cast<int64_t>(n);
  }
}

}  // namespace

std::unique_ptr<Kernel> make_constant(const KernelInit& init) {
  Tensor value = constant_value(init);
  return make_kernel([value](KernelContext& ctx) { ctx.set_output(0, value); });
}

std::unique_ptr<Kernel> make_constant_of_shape(const KernelInit& init) {
  Tensor value = Tensor::zeros(DataType::Float32, Shape{1});
  if (const Tensor* v = init.attr_tensor("value")) {
    if (v->numel() != 1) {
      throw Error("ConstantOfShape attribute 'value' must hold one element, got " + v->description());
    }
    value = *v;
  }
  return make_kernel([value](KernelContext& ctx) {
    const Tensor& shape = ctx.input(0);
    const std::string what = "ConstantOfShape input " + ctx.input_name(0);
    if (shape.rank() != 1) throw Error(what + " must be a 1-D shape, got " + shape.description());
    const std::vector<int64_t> dims = shape.to_int64_vector(what);
    for (int64_t d : dims) {
      if (d < 0) throw Error(what + " holds a negative dim: " + Shape(dims).to_string());
    }
    Tensor& y = ctx.allocate_output(0, value.dtype(), Shape(dims));
    fill_with(y, value);
  });
}

std::unique_ptr<Kernel> make_range(const KernelInit& init) {
  // Before Range-27 (which has no float16/bfloat16 in its schema) every floating type computes
  // in float64.
  bool stash_float = false;
  if (init.opset() >= 27) {
    const int64_t stash = init.attr_int("stash_type", 1);
    if (stash != 1 && stash != 11) {
      throw Error("Range attribute 'stash_type' is " + std::to_string(stash) + ", expected 1 (FLOAT) or 11 (DOUBLE)");
    }
    stash_float = stash == 1;
  }
  return make_kernel([stash_float](KernelContext& ctx) {
    const Tensor& start = scalar_arg(ctx, 0, "start");
    const Tensor& limit = scalar_arg(ctx, 1, "limit");
    const Tensor& delta = scalar_arg(ctx, 2, "delta");
    if (limit.dtype() != start.dtype() || delta.dtype() != start.dtype()) {
      throw Error("Range inputs " + ctx.input_name(0) + ", " + ctx.input_name(1) + " and " +
                  ctx.input_name(2) + " must have one element type, got " + start.description() + ", " +
                  limit.description() + " and " + delta.description());
    }
    visit_dtype<NumericTypes>(start.dtype(), "Range input " + ctx.input_name(0), [&]<class T>() {
      const T s = start.data<T>()[0], d = delta.data<T>()[0];
      const int64_t n = range_count<T>(s, limit.data<T>()[0], d,
                                       "Range inputs " + ctx.input_name(0) + ", " + ctx.input_name(1) + ", " +
                                           ctx.input_name(2) + " (start, limit, delta)");
      Tensor& y = ctx.allocate_output(0, start.dtype(), Shape{n});
      T* out = y.data<T>();
      parallel_for(n, kParallelGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          if constexpr (is_half_v<T>) {
            if (stash_float) {
              out[i] = convert<T>(widen_value(s) + static_cast<float>(i) * widen_value(d));
            } else {
              out[i] = convert<T>(static_cast<double>(widen_value(s)) +
                                  static_cast<double>(i) * static_cast<double>(widen_value(d)));
            }
          } else if constexpr (is_float_v<T>) {
            out[i] = convert<T>(static_cast<double>(widen_value(s)) +
                                static_cast<double>(i) * static_cast<double>(widen_value(d)));
          } else {
            out[i] = static_cast<T>(static_cast<uint64_t>(s) +
                                    static_cast<uint64_t>(i) * static_cast<uint64_t>(d));
          }
        }
      });
    });
  });
}

std::unique_ptr<Kernel> make_eye_like(const KernelInit& init) {
  const bool has_dtype = init.has_attr("dtype");
  const DataType dtype = has_dtype ? dtype_from_onnx(static_cast<int32_t>(init.attr_int("dtype", 1)),
                                                     "EyeLike attribute 'dtype'")
                                   : DataType::Undefined;
  const int64_t k = init.attr_int("k", 0);
  return make_kernel([has_dtype, dtype, k](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    if (x.rank() != 2)
      throw Error("EyeLike input " + ctx.input_name(0) + " must be 2-D, got " + x.description());
    Tensor& y = ctx.allocate_output(0, has_dtype ? dtype : x.dtype(), x.shape());
    if (y.numel() == 0) return;
    std::memset(y.raw_data(), 0, y.nbytes());  // zero is all-zero bits in every dtype
    const int64_t rows = x.dim(0), cols = x.dim(1);
    if (k >= cols || k <= -rows) return;  // the diagonal misses the matrix
    visit_dtype<AllTypes>(y.dtype(), "EyeLike output", [&]<class T>() {
      T* out = y.data<T>();
      // Ones at (i, i + k) for the rows where 0 <= i + k < cols.
      for (int64_t i = std::max<int64_t>(0, -k); i < rows && i + k < cols; ++i)
        out[i * cols + i + k] = convert<T>(1);
    });
  });
}

}  // namespace onnxtrain::ops
