// Placeholder: replaced by the real kernels of this family.
#include "ops/factories.h"

namespace onnxtrain::ops {

std::unique_ptr<Kernel> make_constant(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

std::unique_ptr<Kernel> make_constant_of_shape(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

std::unique_ptr<Kernel> make_range(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

std::unique_ptr<Kernel> make_eye_like(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

}  // namespace onnxtrain::ops
