// Element types of tensors.
//
// DataType uses the numeric values of onnx.proto's TensorProto.DataType, so a value read from
// a model converts by a cast after a check (dtype_from_onnx). Names follow PyTorch ("float32",
// "int64", "bool"). float16 (IEEE 754 binary16) and bfloat16 (the upper 16 bits of a float32)
// are stored as 16-bit patterns and computed through float32.
//
// Narrow types (ONNX 1.15 to 1.23: float8, int4/uint4, float4, float8e8m0, int2/uint2, float6)
// are storage formats: a Tensor holds ONE ELEMENT PER BYTE, never packed, so that indexing,
// slicing and copying work as for int8. Only serialized TensorProtos pack the sub-byte types
// (io.h, onnx.proto's comments on int32_data and raw_data). No arithmetic runs in them: Cast,
// QuantizeLinear and DequantizeLinear convert to and from them, and data-movement kernels whose
// registry rows admit them copy them. Each is described at its enumerator:
//   bits  the ONNX encoding width;  range  the finite values;  stored  the byte in memory.
#pragma once

#include <complex>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

namespace onnxtrain {

enum class DataType : int32_t {
  Undefined = 0,
  Float32 = 1,
  UInt8 = 2,
  Int8 = 3,
  UInt16 = 4,
  Int16 = 5,
  Int32 = 6,
  Int64 = 7,
  String = 8,  // UTF-8 strings: each element a std::string (ONNX string tensors)
  Bool = 9,
  Float16 = 10,
  Float64 = 11,
  UInt32 = 12,
  UInt64 = 13,
  Complex64 = 14,   // not supported: named in errors only
  Complex128 = 15,  // not supported: named in errors only
  BFloat16 = 16,
  // 8-bit floats ("Float stored in 8 bits", onnx docs/technical/float8.md); stored: the bit pattern.
  //   sign 1, exponent 4 (bias 7), mantissa 3; range +-448, subnormals down to 2^-9; no Inf;
  //   NaN S.1111.111; +0 and -0.
  Float8E4M3FN = 17,
  //   sign 1, exponent 4 (bias 8), mantissa 3; range +-240, subnormals down to 2^-10; no Inf;
  //   one NaN (0x80, the pattern of -0); one zero.
  Float8E4M3FNUZ = 18,
  //   sign 1, exponent 5 (bias 15), mantissa 2 (IEEE-like); range +-57344, down to 2^-16;
  //   +-Inf S.11111.00; NaN S.11111.{01,10,11}; +0 and -0.
  Float8E5M2 = 19,
  //   sign 1, exponent 5 (bias 16), mantissa 2; range +-57344, down to 2^-17; no Inf; one NaN
  //   (0x80); one zero.
  Float8E5M2FNUZ = 20,
  // 4-bit integers ("4 bit integer types", int4.md): range 0..15; stored as a uint8 0..15.
  UInt4 = 21,
  //   range -8..7 (two's complement); stored as an int8 -8..7 (sign-extended).
  Int4 = 22,
  // 4-bit float (float4.md): sign 1, exponent 2 (bias 1), mantissa 1; values 0, 0.5, 1, 1.5, 2,
  // 3, 4, 6 and their negatives (+0 and -0); no Inf, no NaN; stored: the 4-bit code in a byte.
  Float4E2M1 = 23,
  // Scale type of the OCP microscaling formats: exponent 8 (bias 127), no sign, no mantissa;
  // values 2^-127 .. 2^127 (pattern e means 2^(e-127)); NaN 0xFF; no zero, no Inf; stored: the byte.
  Float8E8M0 = 24,
  // 2-bit integers (int2.md): range 0..3, stored as a uint8 0..3.
  UInt2 = 25,
  //   range -2..1 (two's complement), stored as an int8 -2..1 (sign-extended).
  Int2 = 26,
  // 6-bit floats (float6.md, OCP MX): no Inf, no NaN; stored: the 6-bit code in a byte.
  //   sign 1, exponent 2 (bias 1), mantissa 3; range +-7.5, down to 0.125.
  Float6E2M3 = 27,
  //   sign 1, exponent 3 (bias 3), mantissa 2; range +-28, down to 0.0625.
  Float6E3M2 = 28,
};

// The largest DataType value onnx.proto (ONNX 1.23) defines.
inline constexpr int32_t kMaxDataType = 28;

// IEEE 754 half precision, stored as its bit pattern. Conversions round to nearest even.
struct Float16 {
  uint16_t bits = 0;
  Float16() = default;
  explicit Float16(float value);
  explicit operator float() const;
  friend bool operator==(Float16 a, Float16 b) { return float(a) == float(b); }
};

// bfloat16 (the upper half of a float32), stored as its bit pattern. Conversions round to
// nearest even; NaN stays NaN.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float value);
  explicit operator float() const;
  friend bool operator==(BFloat16 a, BFloat16 b) { return float(a) == float(b); }
};

// "float32", "int64", "float8e4m3fn", ...; "undefined" for Undefined, "unknown type" for a
// value outside the enum.
std::string_view dtype_name(DataType dtype);
// Bytes per element in memory (1 for every narrow type, sizeof(std::string) for String); 0
// for Undefined and complex.
size_t dtype_size(DataType dtype);
// Bits per element in ONNX's encoding: 4 for int4/uint4/float4e2m1, 2 for int2/uint2, 6 for the
// float6 types, 8 * dtype_size otherwise (bool: 8; meaningless for String).
int dtype_bits(DataType dtype);
// True for the types a Tensor can hold (every type above but Undefined and complex).
bool is_supported(DataType dtype);
// float16, bfloat16, float32, float64: the floating types kernels compute in and gradients flow
// through. The narrow floats are not among them (is_narrow_float).
bool is_floating(DataType dtype);
bool is_integral(DataType dtype);  // signed and unsigned integers of 8 bits or more, not bool
bool is_signed_integral(DataType dtype);
// float8 (four kinds), float8e8m0, float4e2m1, float6 (two kinds).
bool is_narrow_float(DataType dtype);
// int4, uint4, int2, uint2.
bool is_sub_byte_integral(DataType dtype);
// Converts TensorProto.DataType to DataType. Throws Error naming `what` (a tensor or attribute)
// for values outside onnx.proto or for types a Tensor cannot hold (string, complex).
DataType dtype_from_onnx(int32_t onnx_type, std::string_view what);

// ---------------------------------------------------------------------------------------------
// Conversions to the narrow float types (ONNX Cast-19+ and the technical docs float8.md,
// float4.md, float6.md): round to nearest, ties to even, at the target's mantissa width.
//
// float8 with saturate (Cast's default): a rounded value beyond the largest finite one becomes
// +-max, +-Inf becomes +-max (Cast-24+; with fnuz_inf_is_nan, Cast-19..23's table, the FNUZ
// kinds turn +-Inf into NaN), NaN stays NaN. Without saturate: beyond max is Inf for E5M2 and
// NaN for the others; Inf is Inf for E5M2, NaN for the others (-NaN for E4M3FN's -Inf).
// -0 stays -0 except for the FNUZ kinds, which have no -0 (and whose only NaN is 0x80).
// float4e2m1 and float6 always saturate (the `saturate` flag does not apply): beyond +-max and
// +-Inf give +-max, NaN gives +max (float4.md, float6.md); float6 gives +0 for -0 (float6.md).
// float8e8m0 (Cast-24 `round_mode`): the power of two 2^E of the magnitude (the sign is
// ignored; ONNX leaves negative inputs undefined), E rounded up, down or to nearest (ties up) from
// log2|x|; E beyond [-127, 127], 0 and Inf give 2^127 or 2^-127 with saturate and NaN without;
// NaN gives NaN.
enum class E8M0Rounding { Up, Down, Nearest };
struct NarrowFloatCast {
  bool saturate = true;
  bool fnuz_inf_is_nan = false;
  E8M0Rounding round_mode = E8M0Rounding::Up;
};

// The bit pattern (in the low bits of a byte) of `value` as narrow float type `dtype`. `dtype`
// must satisfy is_narrow_float (checked by assertion).
uint8_t narrow_float_bits(DataType dtype, double value, const NarrowFloatCast& how = {});
// The value of bit pattern `bits` of narrow float type `dtype` (exact in float32; bits above
// the type's width are ignored).
float narrow_float_value(DataType dtype, uint8_t bits);

// One element of a narrow float type: its bit pattern. Conversion from float uses the default
// NarrowFloatCast (saturate, E8M0 rounding up), as Cast does by default.
template <DataType D>
struct NarrowFloat {
  static constexpr DataType dtype = D;
  uint8_t bits = 0;
  NarrowFloat() = default;
  explicit NarrowFloat(float value) : bits(narrow_float_bits(D, value)) {}
  explicit NarrowFloat(double value) : bits(narrow_float_bits(D, value)) {}
  static NarrowFloat from_bits(uint8_t b) {
    NarrowFloat f;
    f.bits = b;
    return f;
  }
  explicit operator float() const { return narrow_float_value(D, bits); }
  friend bool operator==(NarrowFloat a, NarrowFloat b) { return float(a) == float(b); }
};
using Float8E4M3FN = NarrowFloat<DataType::Float8E4M3FN>;
using Float8E4M3FNUZ = NarrowFloat<DataType::Float8E4M3FNUZ>;
using Float8E5M2 = NarrowFloat<DataType::Float8E5M2>;
using Float8E5M2FNUZ = NarrowFloat<DataType::Float8E5M2FNUZ>;
using Float8E8M0 = NarrowFloat<DataType::Float8E8M0>;
using Float4E2M1 = NarrowFloat<DataType::Float4E2M1>;
using Float6E2M3 = NarrowFloat<DataType::Float6E2M3>;
using Float6E3M2 = NarrowFloat<DataType::Float6E3M2>;

// One element of a 4- or 2-bit integer type, unpacked into a byte (sign-extended when signed).
// `wrap` keeps the low Bits bits of a value (two's complement), as Cast does for integer sources
// ("discard higher bits and reinterpret"); QuantizeLinear clamps to [min, max] instead.
template <int Bits, bool Signed>
struct SubByteInt {
  using value_type = std::conditional_t<Signed, int8_t, uint8_t>;
  static constexpr int bits = Bits;
  static constexpr int64_t min = Signed ? -(int64_t{1} << (Bits - 1)) : 0;
  static constexpr int64_t max = Signed ? (int64_t{1} << (Bits - 1)) - 1 : (int64_t{1} << Bits) - 1;
  value_type value = 0;
  static constexpr SubByteInt wrap(int64_t v) {
    const auto low = static_cast<uint8_t>(static_cast<uint64_t>(v) & ((1u << Bits) - 1u));
    SubByteInt r;
    if constexpr (Signed) {
      r.value = static_cast<int8_t>(low >= (1u << (Bits - 1)) ? int{low} - (1 << Bits) : int{low});
    } else {
      r.value = low;
    }
    return r;
  }
  friend bool operator==(SubByteInt a, SubByteInt b) { return a.value == b.value; }
};
using UInt4 = SubByteInt<4, false>;
using Int4 = SubByteInt<4, true>;
using UInt2 = SubByteInt<2, false>;
using Int2 = SubByteInt<2, true>;

// The C++ type that stores one element of each DataType (bool is one byte, 0 or 1).
template <class T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DataType value = DataType::Float32; };
template <> struct DTypeOf<double> { static constexpr DataType value = DataType::Float64; };
template <> struct DTypeOf<Float16> { static constexpr DataType value = DataType::Float16; };
template <> struct DTypeOf<BFloat16> { static constexpr DataType value = DataType::BFloat16; };
template <> struct DTypeOf<int8_t> { static constexpr DataType value = DataType::Int8; };
template <> struct DTypeOf<int16_t> { static constexpr DataType value = DataType::Int16; };
template <> struct DTypeOf<int32_t> { static constexpr DataType value = DataType::Int32; };
template <> struct DTypeOf<int64_t> { static constexpr DataType value = DataType::Int64; };
template <> struct DTypeOf<uint8_t> { static constexpr DataType value = DataType::UInt8; };
template <> struct DTypeOf<uint16_t> { static constexpr DataType value = DataType::UInt16; };
template <> struct DTypeOf<uint32_t> { static constexpr DataType value = DataType::UInt32; };
template <> struct DTypeOf<uint64_t> { static constexpr DataType value = DataType::UInt64; };
template <> struct DTypeOf<bool> { static constexpr DataType value = DataType::Bool; };
template <> struct DTypeOf<std::string> { static constexpr DataType value = DataType::String; };
template <DataType D> struct DTypeOf<NarrowFloat<D>> { static constexpr DataType value = D; };
template <> struct DTypeOf<UInt4> { static constexpr DataType value = DataType::UInt4; };
template <> struct DTypeOf<Int4> { static constexpr DataType value = DataType::Int4; };
template <> struct DTypeOf<UInt2> { static constexpr DataType value = DataType::UInt2; };
template <> struct DTypeOf<Int2> { static constexpr DataType value = DataType::Int2; };
template <class T> inline constexpr DataType dtype_of = DTypeOf<T>::value;

// float16/bfloat16 and the narrow floats are computed in float32, the sub-byte integers in
// int32; every other type in itself.
template <class T> struct ComputeType { using type = T; };
template <> struct ComputeType<Float16> { using type = float; };
template <> struct ComputeType<BFloat16> { using type = float; };
template <DataType D> struct ComputeType<NarrowFloat<D>> { using type = float; };
template <int B, bool S> struct ComputeType<SubByteInt<B, S>> { using type = int32_t; };
template <class T> using compute_t = typename ComputeType<T>::type;

template <class T> inline constexpr bool is_half_v =
    std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>;
template <class T> inline constexpr bool is_float_v = std::is_floating_point_v<T> || is_half_v<T>;
template <class T> struct IsNarrowFloat : std::false_type {};
template <DataType D> struct IsNarrowFloat<NarrowFloat<D>> : std::true_type {};
template <class T> inline constexpr bool is_narrow_float_v = IsNarrowFloat<T>::value;
template <class T> struct IsSubByteInt : std::false_type {};
template <int B, bool S> struct IsSubByteInt<SubByteInt<B, S>> : std::true_type {};
template <class T> inline constexpr bool is_sub_byte_int_v = IsSubByteInt<T>::value;

}  // namespace onnxtrain
