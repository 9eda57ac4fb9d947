// Element types of tensors.
//
// DataType uses the numeric values of onnx.proto's TensorProto.DataType, so a value read from
// a model converts by a cast after a check (dtype_from_onnx). Names follow PyTorch ("float32",
// "int64", "bool"). float16 (IEEE 754 binary16) and bfloat16 (the upper 16 bits of a float32)
// are stored as 16-bit patterns and computed through float32.
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
};

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

// "float32", "int64", ...; "undefined" for Undefined, "type<N>" for a value outside the enum.
std::string_view dtype_name(DataType dtype);
// Bytes per element in memory; sizeof(std::string) for String; 0 for Undefined and complex
// types.
size_t dtype_size(DataType dtype);
// True for the types a Tensor can hold (every type above but Undefined and complex).
bool is_supported(DataType dtype);
bool is_floating(DataType dtype);  // float16, bfloat16, float32, float64
bool is_integral(DataType dtype);  // signed and unsigned integers, not bool
bool is_signed_integral(DataType dtype);
// Converts TensorProto.DataType to DataType. Throws Error naming `what` (a tensor or attribute)
// for values outside onnx.proto or for types a Tensor cannot hold (string, complex).
DataType dtype_from_onnx(int32_t onnx_type, std::string_view what);

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
template <class T> inline constexpr DataType dtype_of = DTypeOf<T>::value;

// float16/bfloat16 are computed in float32; every other type in itself.
template <class T> struct ComputeType { using type = T; };
template <> struct ComputeType<Float16> { using type = float; };
template <> struct ComputeType<BFloat16> { using type = float; };
template <class T> using compute_t = typename ComputeType<T>::type;

template <class T> inline constexpr bool is_half_v =
    std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>;
template <class T> inline constexpr bool is_float_v = std::is_floating_point_v<T> || is_half_v<T>;

}  // namespace onnxtrain
