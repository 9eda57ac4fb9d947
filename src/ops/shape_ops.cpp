// Placeholder: replaced by the real kernels of this family.
#include "ops/factories.h"

namespace onnxtrain::ops {

std::unique_ptr<Kernel> make_reshape(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

std::unique_ptr<Kernel> make_flatten(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

std::unique_ptr<Kernel> make_squeeze(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

std::unique_ptr<Kernel> make_unsqueeze(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

std::unique_ptr<Kernel> make_transpose(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

std::unique_ptr<Kernel> make_concat(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

std::unique_ptr<Kernel> make_split(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

std::unique_ptr<Kernel> make_expand(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

std::unique_ptr<Kernel> make_tile(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

std::unique_ptr<Kernel> make_pad(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

std::unique_ptr<Kernel> make_shape(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

std::unique_ptr<Kernel> make_size(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

std::unique_ptr<Kernel> make_depth_to_space(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

std::unique_ptr<Kernel> make_space_to_depth(const KernelInit& init) {
  throw Error(init.op_type() + " is not implemented yet");
}

}  // namespace onnxtrain::ops
