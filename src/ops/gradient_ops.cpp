// Placeholder: replaced by the real kernels of this family.
#include "ops/factories.h"

namespace onnxtrain::ops {

std::unique_ptr<Kernel> make_sum_to_shape(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

std::unique_ptr<Kernel> make_gather_grad(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

}  // namespace onnxtrain::ops
