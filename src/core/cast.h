// Element-wise conversion between any two types a Tensor holds, with ONNX Cast semantics
// (core/dispatch.h `convert`), and the Cast-19+ options for narrow float targets.
#pragma once

#include "onnxtrain/dtype.h"
#include "onnxtrain/tensor.h"

namespace onnxtrain {

// dst[i] = src[i] converted to dst's dtype; dst must have src's element count. `how` applies
// when dst is a narrow float type (saturate, Cast-19..23's FNUZ Inf rule, E8M0 round_mode); every
// other target ignores it.
void cast_into(const Tensor& src, Tensor& dst, const NarrowFloatCast& how = {});

}  // namespace onnxtrain
