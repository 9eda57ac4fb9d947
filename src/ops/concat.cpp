#include "ops/concat.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "core/parallel.h"
#include "onnxtrain/error.h"

namespace onnxtrain::ops {

Shape concat_shape(std::span<const Tensor> parts, size_t axis, const std::string& what) {
  const Tensor& first = parts[0];
  if (dtype_size(first.dtype()) == 0 || first.dtype() == DataType::String) {
    throw Error(what + " 0 is " + first.description() + "; concatenation copies numeric and bool tensors only");
  }
  if (axis >= first.rank()) {
    throw Error(what + " 0 is " + first.description() + ", which has no axis " + std::to_string(axis));
  }
  Shape shape = first.shape();
  shape[axis] = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Tensor& t = parts[i];
    bool same = t.dtype() == first.dtype() && t.rank() == first.rank();
    for (size_t d = 0; same && d < t.rank(); ++d) same = d == axis || t.dim(d) == first.dim(d);
    if (!same) {
      throw Error(what + " " + std::to_string(i) + " is " + t.description() + " but " + what + " 0 is " +
                  first.description() + " (only dim " + std::to_string(axis) + " may differ)");
    }
    shape[axis] += t.dim(axis);
  }
  return shape;
}

void concat_into(std::span<const Tensor> parts, size_t axis, Tensor& out) {
  if (out.numel() == 0) return;
  const auto elem = static_cast<int64_t>(dtype_size(out.dtype()));
  std::vector<std::pair<const char*, int64_t>> rows;  // data, bytes of one row
  for (const Tensor& t : parts) {
    const int64_t row = t.shape().numel(axis, t.rank()) * elem;
    if (row > 0) rows.emplace_back(static_cast<const char*>(t.raw_data()), row);
  }
  const int64_t outer = out.shape().numel(0, axis);
  const int64_t out_row = out.shape().numel(axis, out.rank()) * elem;
  auto* dst_base = static_cast<char*>(out.raw_data());
  parallel_for(outer, std::max<int64_t>(1, kParallelGrain * 4 / out_row), [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      char* dst = dst_base + o * out_row;
      for (const auto& [data, row] : rows) {
        std::memcpy(dst, data + o * row, static_cast<size_t>(row));
        dst += row;
      }
    }
  });
}

}  // namespace onnxtrain::ops
