// Python exceptions for the library's C++ exceptions.
//
//   onnxtrain::Error (bad input: a malformed model, a wrong feed, an invalid option)
//       -> onnxtrain.Error, a subclass of ValueError, with the message the CLI prints after
//          "error: " (what went wrong and where: file, graph, node, tensor, option)
//   std::bad_alloc           -> MemoryError
//   any other std::exception -> RuntimeError (an internal failure; the CLI's exit status 1)
// Exceptions that nanobind raises itself (TypeError for an argument of the wrong type) and
// Python exceptions raised by Python code called from C++ pass through unchanged.
#pragma once

#include <nanobind/nanobind.h>

namespace onnxtrain::python {

// Creates onnxtrain.Error in `m` and registers the translation above.
void bind_errors(nanobind::module_& m);

// onnxtrain.Error, for C++ code that raises it with nb::raise_from or PyErr_SetString.
PyObject* error_type();

}  // namespace onnxtrain::python
