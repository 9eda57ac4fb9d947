// The kernel registry: one explicit table (registry.cpp) of every operator onnxtrain runs,
// keyed by (domain, op type, range of op versions). An op's version follows ONNX's operator
// versioning: the newest since_version of its schema at the opset the model imports for the
// node's domain (op_version); ops whose semantics changed between versions have one row per
// range, and a version no row covers is not run.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

#include "ops/kernel.h"

namespace onnxtrain::ops {

// A set of DataTypes, as a bit mask over DataType values.
class DTypeSet {
 public:
  constexpr DTypeSet() = default;
  constexpr DTypeSet(std::initializer_list<DataType> types) {
    for (DataType t : types) bits_ |= bit(t);
  }
  constexpr bool contains(DataType t) const { return (bits_ & bit(t)) != 0; }
  constexpr DTypeSet operator|(DTypeSet other) const { return from_bits(bits_ | other.bits_); }
  constexpr bool empty() const { return bits_ == 0; }
  std::string to_string() const;  // "float32, float64"

 private:
  static constexpr uint32_t bit(DataType t) { return uint32_t{1} << static_cast<int>(t); }
  static constexpr DTypeSet from_bits(uint32_t bits) {
    DTypeSet s;
    s.bits_ = bits;
    return s;
  }
  uint32_t bits_ = 0;
};

inline constexpr DTypeSet kFloat{DataType::Float32, DataType::Float64, DataType::Float16,
                                 DataType::BFloat16};
inline constexpr DTypeSet kSignedInt{DataType::Int8, DataType::Int16, DataType::Int32,
                                     DataType::Int64};
inline constexpr DTypeSet kUnsignedInt{DataType::UInt8, DataType::UInt16, DataType::UInt32,
                                       DataType::UInt64};
inline constexpr DTypeSet kInt = kSignedInt | kUnsignedInt;
inline constexpr DTypeSet kNumeric = kFloat | kInt;
inline constexpr DTypeSet kSignedNumeric = kFloat | kSignedInt;
inline constexpr DTypeSet kBool{DataType::Bool};
inline constexpr DTypeSet kAll = kNumeric | kBool;
inline constexpr DTypeSet kString{DataType::String};
inline constexpr DTypeSet kIndex{DataType::Int32, DataType::Int64};

// --- narrow types (ONNX 1.15 to 1.23; dtype.h) and the type sets of Cast by version ---
inline constexpr DTypeSet kFloat8{DataType::Float8E4M3FN, DataType::Float8E4M3FNUZ,
                                  DataType::Float8E5M2, DataType::Float8E5M2FNUZ};
inline constexpr DTypeSet kInt4{DataType::UInt4, DataType::Int4};
inline constexpr DTypeSet kInt2{DataType::UInt2, DataType::Int2};
inline constexpr DTypeSet kFloat6{DataType::Float6E2M3, DataType::Float6E3M2};
inline constexpr DTypeSet kNarrow = kFloat8 | kInt4 | kInt2 | kFloat6 |
                                    DTypeSet{DataType::Float4E2M1, DataType::Float8E8M0};
// Cast and CastLike's T1 and T2 (string aside): float8 from Cast-19, int4/uint4 from 21,
// float4e2m1 from 23, float8e8m0 from 24, int2/uint2 from 25, float6 from 28.
inline constexpr DTypeSet kCast19 = kAll | kFloat8;
inline constexpr DTypeSet kCast21 = kCast19 | kInt4;
inline constexpr DTypeSet kCast23 = kCast21 | DTypeSet{DataType::Float4E2M1};
inline constexpr DTypeSet kCast24 = kCast23 | DTypeSet{DataType::Float8E8M0};
inline constexpr DTypeSet kCast25 = kCast24 | kInt2;
inline constexpr DTypeSet kCast28 = kCast25 | kFloat6;
// The input `x` of the quantization ops by version (their other type constraints are checked
// by the kernels, quantize.cpp).
inline constexpr DTypeSet kInt8Quant{DataType::Int8, DataType::UInt8};
inline constexpr DTypeSet kQuantizeIn10{DataType::Float32, DataType::Int32};
inline constexpr DTypeSet kQuantizeIn19 = kQuantizeIn10 | DTypeSet{DataType::Float16, DataType::BFloat16};
inline constexpr DTypeSet kDequantizeIn10 = kInt8Quant | DTypeSet{DataType::Int32};
inline constexpr DTypeSet kDequantizeIn19 = kDequantizeIn10 | kFloat8;
inline constexpr DTypeSet kDequantizeIn21 = kDequantizeIn19 | kInt4 | DTypeSet{DataType::Int16, DataType::UInt16};
inline constexpr DTypeSet kDequantizeIn23 = kDequantizeIn21 | DTypeSet{DataType::Float4E2M1};
inline constexpr DTypeSet kDequantizeIn25 = kDequantizeIn23 | kInt2;
inline constexpr DTypeSet kDequantizeIn28 = kDequantizeIn25 | kFloat6;

struct KernelDef {
  std::string_view domain;  // "" for ai.onnx
  std::string_view op_type;
  int since;  // first op version this row serves (a since_version of the op's schema)
  int until;  // last op version it serves (inclusive)
  DTypeSet types;  // element types accepted for input `type_input`
  KernelFactory make;
  int type_input = 0;
};

// Opset versions onnxtrain understands, per domain.
struct OpsetRange {
  std::string_view domain;
  int min;
  int max;
};

std::span<const KernelDef> kernel_table();
std::span<const OpsetRange> supported_opsets();
// The version of the op a model importing `opset` of `domain` uses: the newest since_version
// of ONNX's schema for it that is <= opset; 0 when ONNX defines no such op at that opset; the
// opset itself for onnxtrain's own domain (ai.onnxtrain), which has no ONNX schemas.
int op_version(std::string_view domain, std::string_view op_type, int opset);
// The row for (domain, op_type) in a model importing `opset` of the domain, or nullptr.
const KernelDef* find_kernel(std::string_view domain, std::string_view op_type, int opset);
// The domain's supported range, or nullptr for an unknown domain.
const OpsetRange* find_opset_range(std::string_view domain);

}  // namespace onnxtrain::ops
