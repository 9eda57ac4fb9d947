#include "onnxtrain/dtype.h"

#include <bit>
#include <cmath>

#include "onnxtrain/error.h"

namespace onnxtrain {

namespace {

uint16_t float_to_half_bits(float value) {
  const uint32_t f = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (f >> 16) & 0x8000u;
  const uint32_t abs = f & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to Inf
  if (abs < 0x38800000u) {
    // Subnormal half (or zero): value * 2^24 rounded to nearest even gives the mantissa.
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // below half the smallest
    const uint32_t exponent = abs >> 23;
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exponent;  // in [14, 24]
    uint32_t half = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  // Normal: rebias the exponent and round the mantissa to 10 bits, nearest even.
  uint32_t half = ((abs >> 13) - (112u << 10));
  const uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

}  // namespace

Float16::Float16(float value) : bits(float_to_half_bits(value)) {}
Float16::operator float() const { return half_bits_to_float(bits); }

BFloat16::BFloat16(float value) {
  const uint32_t f = std::bit_cast<uint32_t>(value);
  if ((f & 0x7fffffffu) > 0x7f800000u) {
    bits = static_cast<uint16_t>((f >> 16) | 0x40u);  // quiet NaN
    return;
  }
  const uint32_t rounding = 0x7fffu + ((f >> 16) & 1u);
  bits = static_cast<uint16_t>((f + rounding) >> 16);
}
BFloat16::operator float() const { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

std::string_view dtype_name(DataType dtype) {
  switch (dtype) {
    case DataType::Undefined: return "undefined";
    case DataType::Float32: return "float32";
    case DataType::UInt8: return "uint8";
    case DataType::Int8: return "int8";
    case DataType::UInt16: return "uint16";
    case DataType::Int16: return "int16";
    case DataType::Int32: return "int32";
    case DataType::Int64: return "int64";
    case DataType::String: return "string";
    case DataType::Bool: return "bool";
    case DataType::Float16: return "float16";
    case DataType::Float64: return "float64";
    case DataType::UInt32: return "uint32";
    case DataType::UInt64: return "uint64";
    case DataType::Complex64: return "complex64";
    case DataType::Complex128: return "complex128";
    case DataType::BFloat16: return "bfloat16";
  }
  return "unknown type";
}

size_t dtype_size(DataType dtype) {
  switch (dtype) {
    case DataType::Float64:
    case DataType::Int64:
    case DataType::UInt64: return 8;
    case DataType::Float32:
    case DataType::Int32:
    case DataType::UInt32: return 4;
    case DataType::Float16:
    case DataType::BFloat16:
    case DataType::Int16:
    case DataType::UInt16: return 2;
    case DataType::Int8:
    case DataType::UInt8:
    case DataType::Bool: return 1;
    case DataType::String: return sizeof(std::string);
    default: return 0;
  }
}

bool is_supported(DataType dtype) { return dtype_size(dtype) != 0; }

bool is_floating(DataType dtype) {
  return dtype == DataType::Float32 || dtype == DataType::Float64 ||
         dtype == DataType::Float16 || dtype == DataType::BFloat16;
}

bool is_signed_integral(DataType dtype) {
  return dtype == DataType::Int8 || dtype == DataType::Int16 || dtype == DataType::Int32 ||
         dtype == DataType::Int64;
}

bool is_integral(DataType dtype) {
  return is_signed_integral(dtype) || dtype == DataType::UInt8 || dtype == DataType::UInt16 ||
         dtype == DataType::UInt32 || dtype == DataType::UInt64;
}

DataType dtype_from_onnx(int32_t onnx_type, std::string_view what) {
  const auto dtype = static_cast<DataType>(onnx_type);
  if (onnx_type < 0 || onnx_type > static_cast<int32_t>(DataType::BFloat16)) {
    throw Error(std::string(what) + ": unknown element type " + std::to_string(onnx_type) +
                " (onnx.proto defines 1 to 16)");
  }
  if (!is_supported(dtype)) {
    throw Error(std::string(what) + ": element type " + std::string(dtype_name(dtype)) +
                " is not supported (numeric, bool and string tensors only)");
  }
  return dtype;
}

}  // namespace onnxtrain
