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
