// onnxtrain._core: the extension module of the Python package (python/onnxtrain). Every binding
// lives in the file of its subject; this file only lists them.
#include <nanobind/nanobind.h>

#include "python/arrays.h"
#include "python/cli.h"
#include "python/errors.h"
#include "python/models.h"
#include "python/sessions.h"
#include "python/train.h"

NB_MODULE(_core, m) {
  m.doc() = "onnxtrain's C++ library: sessions, make_trainable, the command line (use the package onnxtrain).";
  onnxtrain::python::bind_errors(m);
  onnxtrain::python::bind_arrays(m);
  onnxtrain::python::bind_sessions(m);
  onnxtrain::python::bind_models(m);
  onnxtrain::python::bind_cli(m);
  onnxtrain::python::bind_train(m);
}
