// Placeholder: replaced by the real kernels of this family.
#include "ops/factories.h"

namespace onnxtrain::ops {

std::unique_ptr<Kernel> make_conv_grad(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

}  // namespace onnxtrain::ops
