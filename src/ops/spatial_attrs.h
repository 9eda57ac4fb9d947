// Attributes shared by the sliding-window ops (Conv, ConvTranspose, MaxPool, AveragePool):
// auto_pad, and the per-spatial-dim int lists kernel_shape, strides, dilations and pads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ops/kernel.h"

namespace onnxtrain::ops {

// ONNX `auto_pad`: NOTSET uses `pads`; SAME_UPPER/SAME_LOWER pad so that
// out = ceil(in / stride), the odd element going at the end (UPPER) or the beginning (LOWER);
// VALID does not pad.
enum class AutoPad { NotSet, SameUpper, SameLower, Valid };

inline AutoPad parse_auto_pad(const KernelInit& init) {
  const std::string s = init.attr_string("auto_pad", "NOTSET");
  if (s == "NOTSET" || s.empty()) return AutoPad::NotSet;
  if (s == "SAME_UPPER") return AutoPad::SameUpper;
  if (s == "SAME_LOWER") return AutoPad::SameLower;
  if (s == "VALID") return AutoPad::Valid;
  throw Error("attribute 'auto_pad' is '" + s +
              "', expected NOTSET, SAME_UPPER, SAME_LOWER or VALID");
}

inline std::string ints_to_string(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// The ints attribute `name` if present, each value checked to be >= min.
inline std::optional<std::vector<int64_t>> ints_at_least(const KernelInit& init,
                                                         const std::string& name, int64_t min) {
  auto v = init.optional_ints(name);
  if (v) {
    for (int64_t x : *v) {
      if (x < min) {
        throw Error("attribute '" + name + "' is " + ints_to_string(*v) +
                    ", expected values >= " + std::to_string(min));
      }
    }
  }
  return v;
}

// One value per spatial dim (`per` = 1) or per spatial dim and end (`per` = 2, for pads): the
// attribute's values, or `fallback` everywhere when it is absent. Throws when the length is not
// per * rank.
inline std::vector<int64_t> spatial_values(const std::optional<std::vector<int64_t>>& v,
                                           const std::string& name, size_t rank, int64_t fallback,
                                           size_t per = 1) {
  if (!v) return std::vector<int64_t>(rank * per, fallback);
  if (v->size() != rank * per) {
    throw Error("attribute '" + name + "' is " + ints_to_string(*v) + ", expected " +
                std::to_string(rank * per) + " values for " + std::to_string(rank) +
                " spatial dims");
  }
  return *v;
}

// Splits a total padding between the two ends as ONNX's SAME_UPPER (extra at the end) or
// otherwise SAME_LOWER (extra at the beginning) does, with floor division as in the ONNX
// reference, which matters for ConvTranspose whose total may be negative.
inline void split_padding(int64_t total, bool upper, int64_t& begin, int64_t& end) {
  const int64_t half = total >= 0 ? total / 2 : -((1 - total) / 2);  // floor(total / 2)
  if (upper) {
    begin = half;
    end = total - half;
  } else {
    end = half;
    begin = total - half;
  }
}

}  // namespace onnxtrain::ops
