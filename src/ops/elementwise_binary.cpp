// Placeholder: replaced by the real kernels of this family.
#include "ops/factories.h"

namespace onnxtrain::ops {

std::unique_ptr<Kernel> make_binary(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

std::unique_ptr<Kernel> make_variadic(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

std::unique_ptr<Kernel> make_where(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

}  // namespace onnxtrain::ops
