// Placeholder: replaced by the real kernels of this family.
#include "ops/factories.h"

namespace onnxtrain::ops {

std::unique_ptr<Kernel> make_unary(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

std::unique_ptr<Kernel> make_activation(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

std::unique_ptr<Kernel> make_clip(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

std::unique_ptr<Kernel> make_cast(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

std::unique_ptr<Kernel> make_cast_like(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

std::unique_ptr<Kernel> make_identity(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

}  // namespace onnxtrain::ops
