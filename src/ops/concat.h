// Concatenation of tensors along an axis, shared by Concat-like kernels (ConcatFromSequence).
#pragma once

#include <span>
#include <string>

#include "onnxtrain/tensor.h"

namespace onnxtrain::ops {

// The shape of `parts` concatenated along `axis`: every part has the first part's dtype, rank
// and dims but `axis` (an Error names the first `what` that does not).
Shape concat_shape(std::span<const Tensor> parts, size_t axis, const std::string& what);
// Copies `parts` into `out` (allocated with concat_shape), one row of dims [axis, rank) of each
// part per outer index, in parallel over the outer indices.
void concat_into(std::span<const Tensor> parts, size_t axis, Tensor& out);

}  // namespace onnxtrain::ops
