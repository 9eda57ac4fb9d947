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
// nearest even, saturation). A cast to the input's own type returns the input. String is not a
// tensor type here: a `to` of STRING is refused with the other unsupported types.
#include <cstring>
#include <string>
#include <unordered_map>

#include "core/cast.h"
#include "ops/factories.h"
#include "ops/registry.h"

namespace onnxtrain::ops {

namespace {

// T1 = T2 of Cast/CastLike at op version `version`.
DTypeSet cast_types(int version) {
  if (version >= 28) return kCast28;
  if (version >= 25) return kCast25;
  if (version >= 24) return kCast24;
  if (version >= 23) return kCast23;
  if (version >= 21) return kCast21;
  if (version >= 19) return kCast19;
  return kAll;
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
  cast_into(x, y, how);
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
