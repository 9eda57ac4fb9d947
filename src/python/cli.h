// onnxtrain._core.cli_main (see cli.cpp).
#pragma once

#include <nanobind/nanobind.h>

namespace onnxtrain::python {

namespace nb = nanobind;

void bind_cli(nb::module_& m);

}  // namespace onnxtrain::python
