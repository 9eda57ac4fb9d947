#include "onnxtrain/dtype.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cassert>
#include <cmath>
#include <limits>

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

// ---------------------------------------------------------------------------------------------
// Narrow floats. Every kind but E8M0 is a sign bit, `exponent` exponent bits with `bias` and
// `mantissa` mantissa bits; a zero exponent field holds subnormals 2^(1-bias) * m / 2^mantissa.
// What the all-ones exponent and the pattern of -0 mean differs per kind (dtype.h).

namespace {

enum class Special {
  None,     // float4, float6: every pattern is a number
  AllOnes,  // E4M3FN: S.1111.111 is NaN, no Inf
  Ieee,     // E5M2: exponent all ones is Inf (mantissa 0) or NaN
  Fnuz,     // E4M3FNUZ, E5M2FNUZ: 0x80 (the pattern of -0) is the only NaN, no Inf
};

struct MiniFloat {
  int width, exponent, mantissa, bias;
  Special special;
  double max;  // the largest finite value
};

MiniFloat minifloat(DataType dtype) {
  switch (dtype) {
    case DataType::Float8E4M3FN: return {8, 4, 3, 7, Special::AllOnes, 448.0};
    case DataType::Float8E4M3FNUZ: return {8, 4, 3, 8, Special::Fnuz, 240.0};
    case DataType::Float8E5M2: return {8, 5, 2, 15, Special::Ieee, 57344.0};
    case DataType::Float8E5M2FNUZ: return {8, 5, 2, 16, Special::Fnuz, 57344.0};
    case DataType::Float4E2M1: return {4, 2, 1, 1, Special::None, 6.0};
    case DataType::Float6E2M3: return {6, 2, 3, 1, Special::None, 7.5};
    case DataType::Float6E3M2: return {6, 3, 2, 3, Special::None, 28.0};
    default: break;
  }
  assert(false && "not a sign-exponent-mantissa narrow float");
  return {8, 4, 3, 7, Special::AllOnes, 448.0};
}

// The pattern of +-max: every bit but the sign set, except E4M3FN (S.1111.111 is NaN: max is
// S.1111.110) and E5M2 (exponent all ones is Inf/NaN: max is S.11110.11).
uint8_t max_bits(const MiniFloat& f, bool negative) {
  unsigned bits = (1u << (f.width - 1)) - 1u;
  if (f.special == Special::AllOnes) bits -= 1u;
  if (f.special == Special::Ieee) bits -= 1u << f.mantissa;
  const unsigned sign = negative ? 1u << (f.width - 1) : 0u;
  return static_cast<uint8_t>(sign | bits);
}

uint8_t nan_bits(const MiniFloat& f, bool negative) {
  const unsigned sign = negative ? 0x80u : 0u;
  switch (f.special) {
    case Special::AllOnes: return static_cast<uint8_t>(sign | 0x7fu);
    case Special::Ieee: return static_cast<uint8_t>(sign | 0x7eu);  // quiet NaN S.11111.10
    case Special::Fnuz: return 0x80;
    case Special::None: return max_bits(f, false);  // float4.md, float6.md: NaN -> +max
  }
  return 0;
}

uint8_t zero_bits(const MiniFloat& f, bool negative, DataType dtype) {
  const bool keeps_sign = f.special != Special::Fnuz && dtype != DataType::Float6E2M3 &&
                          dtype != DataType::Float6E3M2;
  return static_cast<uint8_t>(negative && keeps_sign ? 1u << (f.width - 1) : 0u);
}

// What a value beyond +-max, or +-Inf, becomes.
uint8_t overflow_bits(const MiniFloat& f, bool negative, bool saturate) {
  if (saturate || f.special == Special::None) return max_bits(f, negative);
  if (f.special == Special::Ieee) return static_cast<uint8_t>((negative ? 0x80u : 0u) | 0x7cu);
  return nan_bits(f, negative);
}

// |x| rounded to nearest even at the quantum of its binade (or of the subnormal range), as
// (steps, exponent of the quantum), from the bits of the double: exact integer arithmetic.
struct Rounded {
  uint64_t steps;
  int quantum;
};
Rounded round_to_quantum(double a, int emin, int mantissa) {
  const auto bits = std::bit_cast<uint64_t>(a);
  const int field = static_cast<int>((bits >> 52) & 0x7ffu);
  if (field == 0) return {0, emin - mantissa};  // a double subnormal: far below every quantum
  const int e = field - 1023;
  const uint64_t significand = (bits & ((uint64_t{1} << 52) - 1u)) | uint64_t{1} << 52;  // a = sig 2^(e-52)
  const int quantum = std::max(e, emin) - mantissa;
  const int shift = quantum - (e - 52);  // steps = sig / 2^shift, shift >= 52 - mantissa > 0
  if (shift > 63) return {0, quantum};
  uint64_t steps = significand >> shift;
  const uint64_t rest = significand & ((uint64_t{1} << shift) - 1u), half = uint64_t{1} << (shift - 1);
  if (rest > half || (rest == half && (steps & 1u))) ++steps;
  return {steps, quantum};
}

uint8_t encode_minifloat(DataType dtype, double x, const NarrowFloatCast& how) {
  const MiniFloat f = minifloat(dtype);
  const bool negative = std::signbit(x);
  if (std::isnan(x)) return nan_bits(f, negative);
  if (std::isinf(x)) {
    if (f.special == Special::Fnuz && how.fnuz_inf_is_nan) return nan_bits(f, negative);
    return overflow_bits(f, negative, how.saturate);
  }
  const int emin = 1 - f.bias;
  const Rounded r = round_to_quantum(std::fabs(x), emin, f.mantissa);
  if (r.steps == 0) return zero_bits(f, negative, dtype);
  // steps < 2^mantissa only in the subnormal range (exponent field 0); otherwise steps is in
  // [2^mantissa, 2^(mantissa+1)], the top value being a carry into the next binade.
  const uint64_t one = uint64_t{1} << f.mantissa;
  uint64_t code = r.steps;  // subnormal: field 0, mantissa = steps
  if (r.steps >= one) {
    const uint64_t carry = r.steps >> (f.mantissa + 1);
    const auto field = static_cast<uint64_t>(r.quantum + f.mantissa + f.bias) + carry;
    code = field << f.mantissa | ((r.steps >> carry) - one);
  }
  if (code > max_bits(f, false)) return overflow_bits(f, negative, how.saturate);  // codes grow with values
  const unsigned sign = negative ? 1u << (f.width - 1) : 0u;
  return static_cast<uint8_t>(sign | code);
}

float decode_minifloat(DataType dtype, uint8_t pattern) {
  const MiniFloat f = minifloat(dtype);
  const unsigned bits = pattern & ((1u << f.width) - 1u);
  const bool negative = (bits >> (f.width - 1)) & 1u;
  const unsigned field = (bits >> f.mantissa) & ((1u << f.exponent) - 1u);
  const unsigned mantissa = bits & ((1u << f.mantissa) - 1u);
  const unsigned all_ones = (1u << f.exponent) - 1u;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  if (f.special == Special::Fnuz && bits == 0x80u) return nan;
  if (f.special == Special::AllOnes && field == all_ones && mantissa == (1u << f.mantissa) - 1u) {
    return negative ? -nan : nan;
  }
  if (f.special == Special::Ieee && field == all_ones) {
    const float special = mantissa == 0 ? std::numeric_limits<float>::infinity() : nan;
    return negative ? -special : special;
  }
  const double magnitude =
      field == 0 ? std::ldexp(static_cast<double>(mantissa), 1 - f.bias - f.mantissa)
                 : std::ldexp(static_cast<double>(mantissa + (1u << f.mantissa)),
                              static_cast<int>(field) - f.bias - f.mantissa);
  return static_cast<float>(negative ? -magnitude : magnitude);
}

// float8e8m0: 2^(bits - 127); 0xFF is NaN.
uint8_t encode_e8m0(double x, const NarrowFloatCast& how) {
  if (std::isnan(x)) return 0xff;
  const double a = std::fabs(x);
  const uint8_t low = how.saturate ? 0x00 : 0xff, high = how.saturate ? 0xfe : 0xff;
  if (std::isinf(a)) return high;
  if (a == 0) return low;
  const int e = std::ilogb(a);
  const double fraction = std::ldexp(a, -e) - 1.0;  // in [0, 1), exact
  int rounded = e;
  switch (how.round_mode) {
    case E8M0Rounding::Up: rounded += fraction > 0 ? 1 : 0; break;
    case E8M0Rounding::Down: break;
    case E8M0Rounding::Nearest: rounded += fraction >= 0.5 ? 1 : 0; break;  // ties up
  }
  if (rounded > 127) return high;
  if (rounded < -127) return low;
  return static_cast<uint8_t>(rounded + 127);
}

float decode_e8m0(uint8_t bits) {
  if (bits == 0xff) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(bits) - 127);
}

// The value of every pattern of every narrow float, computed once.
struct NarrowTables {
  std::array<std::array<float, 256>, kMaxDataType + 1> value{};
  NarrowTables() {
    for (int t = 0; t <= kMaxDataType; ++t) {
      const auto dtype = static_cast<DataType>(t);
      if (!is_narrow_float(dtype)) continue;
      for (unsigned b = 0; b < 256; ++b) {
        value[static_cast<size_t>(t)][b] = dtype == DataType::Float8E8M0
                                               ? decode_e8m0(static_cast<uint8_t>(b))
                                               : decode_minifloat(dtype, static_cast<uint8_t>(b));
      }
    }
  }
};

const NarrowTables& narrow_tables() {
  static const NarrowTables tables;
  return tables;
}

}  // namespace

uint8_t narrow_float_bits(DataType dtype, double value, const NarrowFloatCast& how) {
  assert(is_narrow_float(dtype));
  if (dtype == DataType::Float8E8M0) return encode_e8m0(value, how);
  return encode_minifloat(dtype, value, how);
}

float narrow_float_value(DataType dtype, uint8_t bits) {
  assert(is_narrow_float(dtype));
  return narrow_tables().value[static_cast<size_t>(dtype)][bits];
}

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
    case DataType::Float8E4M3FN: return "float8e4m3fn";
    case DataType::Float8E4M3FNUZ: return "float8e4m3fnuz";
    case DataType::Float8E5M2: return "float8e5m2";
    case DataType::Float8E5M2FNUZ: return "float8e5m2fnuz";
    case DataType::UInt4: return "uint4";
    case DataType::Int4: return "int4";
    case DataType::Float4E2M1: return "float4e2m1";
    case DataType::Float8E8M0: return "float8e8m0";
    case DataType::UInt2: return "uint2";
    case DataType::Int2: return "int2";
    case DataType::Float6E2M3: return "float6e2m3";
    case DataType::Float6E3M2: return "float6e3m2";
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
    default: return is_narrow_float(dtype) || is_sub_byte_integral(dtype) ? 1 : 0;
  }
}

int dtype_bits(DataType dtype) {
  switch (dtype) {
    case DataType::UInt4:
    case DataType::Int4:
    case DataType::Float4E2M1: return 4;
    case DataType::UInt2:
    case DataType::Int2: return 2;
    case DataType::Float6E2M3:
    case DataType::Float6E3M2: return 6;
    default: return static_cast<int>(8 * dtype_size(dtype));
  }
}

bool is_supported(DataType dtype) { return dtype_size(dtype) != 0; }

bool is_narrow_float(DataType dtype) {
  switch (dtype) {
    case DataType::Float8E4M3FN:
    case DataType::Float8E4M3FNUZ:
    case DataType::Float8E5M2:
    case DataType::Float8E5M2FNUZ:
    case DataType::Float8E8M0:
    case DataType::Float4E2M1:
    case DataType::Float6E2M3:
    case DataType::Float6E3M2: return true;
    default: return false;
  }
}

bool is_sub_byte_integral(DataType dtype) {
  return dtype == DataType::UInt4 || dtype == DataType::Int4 || dtype == DataType::UInt2 ||
         dtype == DataType::Int2;
}

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
  if (onnx_type < 0 || onnx_type > kMaxDataType) {
    throw Error(std::string(what) + ": unknown element type " + std::to_string(onnx_type) +
                " (onnx.proto defines 1 to " + std::to_string(kMaxDataType) + ")");
  }
  if (!is_supported(dtype)) {
    throw Error(std::string(what) + ": element type " + std::string(dtype_name(dtype)) +
                " is not supported (numeric, bool and string tensors only)");
  }
  return dtype;
}

}  // namespace onnxtrain
