// Cast and CastLike at every version ONNX 1.23 defines (operator docs "Cast", "CastLike"):
//
//   Cast-1          `to` names the type with a string ("FLOAT"); numeric and bool types
//   Cast-6, 9, 13   `to` is a TensorProto.DataType value
//   Cast-19         + float8 (E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ) and the `saturate` attribute
//                   (default 1); its saturation table turns +-Inf into NaN for the FNUZ kinds
//   Cast-21         + int4, uint4
//   Cast-23         + float4e2m1
//   Cast-24         + float8e8m0 and `round_mode` ("up" (default), "down", "nearest"); +-Inf
//                   saturates to +-max for every float8 kind
//   Cast-25         + int2, uint2
//   Cast-28         + float6e2m3, float6e3m2
//   CastLike-15, 19, 21, 23, 24, 25: the same, with the target type that of input 1.
//   BitCast-26      reinterprets the bits of each element as type `to` of the same bit width
//                   (dtype_bits): bytes are copied for the 8-bit and wider types; the 4-, 2-
//                   and 6-bit codes are re-read (sign-extended for int4, int2). A byte other than
//                   0 or 1 becomes bool true (the byte != 0), since bool holds only 0 and 1.
//
// The conversions themselves are core/dispatch.h `convert` (float to integer truncates toward
// zero and saturates; integer to integer keeps the low bits; to bool is != 0; to int4/int2
// rounds to nearest even and keeps the low bits) and dtype.h's narrow_float_bits (rounding to
// nearest even, saturation). A cast to the input's own type returns the input.
// Strings (Cast-9 and later; the doc's "Casting from string tensor ..." paragraph): a number
// becomes its shortest decimal form that reads back to the same value (std::to_chars, as
// NumPy prints float32 and float64; float16, bfloat16 and the narrow floats are printed as the
// float32 they equal), an integer its decimal digits, a bool "True" or "False" (as NumPy). A
// string is read as a decimal or scientific number, or INF, +INF, -INF, NaN in any case
// (strtod in the C locale), then converted to the target type as a float64 would be; integer
// targets read integer literals exactly. A string that is no number is an error naming it.
#include <charconv>
#include <clocale>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <locale.h>
#include <string>
#include <unordered_map>

#include "core/cast.h"
#include "ops/factories.h"
#include "ops/registry.h"

namespace onnxtrain::ops {

namespace {

// T1 = T2 of Cast/CastLike at op version `version` (strings from Cast-9).
DTypeSet cast_types(int version) {
  if (version >= 28) return kCast28 | kString;
  if (version >= 25) return kCast25 | kString;
  if (version >= 24) return kCast24 | kString;
  if (version >= 23) return kCast23 | kString;
  if (version >= 21) return kCast21 | kString;
  if (version >= 19) return kCast19 | kString;
  return version >= 9 ? kAll | kString : kAll;
}

std::string to_text(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}
std::string to_text(float v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// Numbers to their text (see the file comment).
void numbers_to_strings(const Tensor& x, Tensor& y) {
  std::string* out = y.data<std::string>();
  const int64_t n = x.numel();
  if (x.dtype() == DataType::Bool) {
    for (int64_t i = 0; i < n; ++i) out[i] = x.data<bool>()[i] ? "True" : "False";
  } else if (x.dtype() == DataType::Float64) {
    for (int64_t i = 0; i < n; ++i) out[i] = to_text(x.data<double>()[i]);
  } else if (is_integral(x.dtype()) || is_sub_byte_integral(x.dtype())) {
    Tensor wide(is_signed_integral(x.dtype()) || x.dtype() == DataType::Int4 || x.dtype() == DataType::Int2
                    ? DataType::Int64 : DataType::UInt64, x.shape());
    cast_into(x, wide);
    for (int64_t i = 0; i < n; ++i) {
      out[i] = wide.dtype() == DataType::Int64 ? std::to_string(wide.data<int64_t>()[i])
                                               : std::to_string(wide.data<uint64_t>()[i]);
    }
  } else {
    Tensor f = x;
    if (x.dtype() != DataType::Float32) {
      f = Tensor(DataType::Float32, x.shape());
      cast_into(x, f);
    }
    for (int64_t i = 0; i < n; ++i) out[i] = to_text(f.data<float>()[i]);
  }
}

// Text to numbers (see the file comment); `what` names the input in errors.
void strings_to_numbers(const Tensor& x, Tensor& y, const NarrowFloatCast& how, const std::string& what) {
  static const locale_t c_locale = newlocale(LC_ALL_MASK, "C", static_cast<locale_t>(nullptr));
  const std::string* in = x.data<std::string>();
  const int64_t n = x.numel();
  const bool integer_target = is_integral(y.dtype());
  Tensor wide(integer_target ? DataType::Int64 : DataType::Float64, x.shape());
  for (int64_t i = 0; i < n; ++i) {
    const std::string& s = in[i];
    if (integer_target) {
      int64_t v = 0;
      const char* first = s.data() + (!s.empty() && s[0] == '+' ? 1 : 0);
      const auto r = std::from_chars(first, s.data() + s.size(), v);
      if (r.ec == std::errc() && r.ptr == s.data() + s.size()) {
        wide.data<int64_t>()[i] = v;
        continue;
      }
    }
    char* end = nullptr;
    const double d = strtod_l(s.c_str(), &end, c_locale);
    if (s.empty() || end != s.c_str() + s.size()) {
      fail("element " + std::to_string(i) + " of " + what + ", \"" + s + "\", is not a number");
    }
    if (integer_target) {
      if (!std::isfinite(d)) fail("element " + std::to_string(i) + " of " + what + ", \"" + s + "\", is no integer");
      wide.data<int64_t>()[i] = static_cast<int64_t>(std::clamp(std::trunc(d), -9.2e18, 9.2e18));
    } else {
      wide.data<double>()[i] = d;
    }
  }
  cast_into(wide, y, how);
}

// Cast-1 to Cast-5 name the target type with a string ("FLOAT"), later opsets with an int.
DataType cast_target(const KernelInit& init) {
  const ir::Attribute* to = init.attr("to");
  if (!to) throw Error("Cast needs the attribute 'to'");
  if (to->type == ir::AttributeType::String) {
    static const std::unordered_map<std::string, DataType> names = {
        {"FLOAT", DataType::Float32}, {"DOUBLE", DataType::Float64}, {"FLOAT16", DataType::Float16},
        {"BFLOAT16", DataType::BFloat16}, {"INT8", DataType::Int8}, {"INT16", DataType::Int16},
        {"INT32", DataType::Int32}, {"INT64", DataType::Int64}, {"UINT8", DataType::UInt8},
        {"UINT16", DataType::UInt16}, {"UINT32", DataType::UInt32}, {"UINT64", DataType::UInt64},
        {"BOOL", DataType::Bool},
    };
    const std::string name = init.attr_string("to", "");
    const auto it = names.find(name);
    if (it == names.end()) throw Error("Cast attribute 'to' names an unsupported type '" + name + "'");
    return it->second;
  }
  return dtype_from_onnx(static_cast<int32_t>(init.attr_int("to", 0)), "Cast attribute 'to'");
}

// The narrow-float options of Cast/CastLike at `version`: `saturate` from 19, `round_mode`
// from 24, and the FNUZ Inf rule of the saturation tables of versions 19 to 23.
NarrowFloatCast narrow_cast_options(const KernelInit& init, int version) {
  NarrowFloatCast how;
  if (version >= 19) how.saturate = init.attr_int("saturate", 1) != 0;
  how.fnuz_inf_is_nan = version >= 19 && version < 24;
  if (version >= 24) {
    const std::string mode = init.attr_string("round_mode", "up");
    if (mode == "up") how.round_mode = E8M0Rounding::Up;
    else if (mode == "down") how.round_mode = E8M0Rounding::Down;
    else if (mode == "nearest") how.round_mode = E8M0Rounding::Nearest;
    else throw Error("attribute 'round_mode' is '" + mode + "', expected up, down or nearest");
  }
  return how;
}

std::string version_name(const std::string& op, int version) {
  return op + "-" + std::to_string(version);
}

void cast_output(KernelContext& ctx, DataType to, const NarrowFloatCast& how) {
  const Tensor& x = ctx.input(0);
  if (x.dtype() == to) {
    ctx.set_output(0, x);
    return;
  }
  Tensor& y = ctx.allocate_output(0, to, x.shape());
  if (to == DataType::String) {
    numbers_to_strings(x, y);
  } else if (x.dtype() == DataType::String) {
    strings_to_numbers(x, y, how, "input " + ctx.input_name(0));
  } else {
    cast_into(x, y, how);
  }
}

}  // namespace

std::unique_ptr<Kernel> make_cast(const KernelInit& init) {
  const int version = op_version("", "Cast", init.opset());
  const DataType to = cast_target(init);
  if (!cast_types(version).contains(to)) {
    throw Error("Cast attribute 'to' is " + std::string(dtype_name(to)) + ", which " +
                version_name("Cast", version) + " does not define (it takes " +
                cast_types(version).to_string() + ")");
  }
  const NarrowFloatCast how = narrow_cast_options(init, version);
  return make_kernel([to, how](KernelContext& ctx) { cast_output(ctx, to, how); });
}

std::unique_ptr<Kernel> make_cast_like(const KernelInit& init) {
  const int version = op_version("", "CastLike", init.opset());
  const NarrowFloatCast how = narrow_cast_options(init, version);
  const DTypeSet types = cast_types(version);
  return make_kernel([how, types, version](KernelContext& ctx) {
    const DataType to = ctx.input(1).dtype();
    if (!types.contains(to)) {
      fail("input " + ctx.input_name(1) + " is " + ctx.input(1).description() + "; " +
           version_name("CastLike", version) + " takes " + types.to_string());
    }
    cast_output(ctx, to, how);
  });
}

std::unique_ptr<Kernel> make_bitcast(const KernelInit& init) {
  const DataType to = dtype_from_onnx(static_cast<int32_t>(init.attr_int("to", 0)), "BitCast attribute 'to'");
  return make_kernel([to](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    if (dtype_bits(x.dtype()) != dtype_bits(to)) {
      fail("input " + ctx.input_name(0) + " is " + x.description() + " (" + std::to_string(dtype_bits(x.dtype())) +
           " bits); BitCast to " + std::string(dtype_name(to)) + " needs " + std::to_string(dtype_bits(to)) +
           " bits per element");
    }
    Tensor& y = ctx.allocate_output(0, to, x.shape());
    const auto* in = static_cast<const uint8_t*>(x.raw_data());
    auto* out = static_cast<uint8_t*>(y.raw_data());
    const int bits = dtype_bits(to);
    if (to == DataType::Bool) {
      for (int64_t i = 0; i < x.numel(); ++i) out[i] = in[i] != 0;
    } else if (bits >= 8) {
      std::memcpy(out, in, x.nbytes());
    } else {
      const unsigned mask = (1u << bits) - 1u;
      for (int64_t i = 0; i < x.numel(); ++i) {
        const unsigned code = in[i] & mask;
        if (to == DataType::Int4) out[i] = static_cast<uint8_t>(Int4::wrap(code).value);
        else if (to == DataType::Int2) out[i] = static_cast<uint8_t>(Int2::wrap(code).value);
        else out[i] = static_cast<uint8_t>(code);
      }
    }
  });
}

}  // namespace onnxtrain::ops
