#include "python/train.h"

namespace onnxtrain::python {

// The binding of train() is to come (issue 15, the training loop); the hook is in place.
void bind_train(nanobind::module_&) {}

}  // namespace onnxtrain::python
