// onnxtrain.train: the training loop of `onnxtrain train` (include/onnxtrain/trainer.h) for
// Python. module.cpp calls bind_train once, after the sessions and arrays are bound, so that
// it may use python/arrays.h and python/models.h.
#pragma once

#include <nanobind/nanobind.h>

namespace onnxtrain::python {

void bind_train(nanobind::module_& m);

}  // namespace onnxtrain::python
