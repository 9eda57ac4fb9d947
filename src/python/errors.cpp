#include "python/errors.h"

#include <exception>
#include <new>

#include "onnxtrain/error.h"

namespace onnxtrain::python {

namespace nb = nanobind;

namespace {
PyObject* g_error = nullptr;  // onnxtrain.Error; the module keeps a reference for the process
}  // namespace

PyObject* error_type() { return g_error; }

void bind_errors(nb::module_& m) {
  g_error = PyErr_NewExceptionWithDoc(
      "onnxtrain.Error",
      "Bad input reported by onnxtrain: a malformed or unsupported model, a feed of the wrong "
      "name, dtype or shape, an invalid option. The message says what and where, as the "
      "command-line tool prints it after 'error: '. A subclass of ValueError.",
      PyExc_ValueError, nullptr);
  if (!g_error) throw nb::python_error();
  m.attr("Error") = nb::handle(g_error);
  // Translators registered later are tried first: this one before nanobind's defaults, which
  // would make some std::logic_error kinds ValueError or IndexError.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const onnxtrain::Error& e) {
      PyErr_SetString(g_error, e.what());
    } catch (const std::bad_alloc&) {
      PyErr_SetString(PyExc_MemoryError, "out of memory");
    } catch (const std::exception& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
}

}  // namespace onnxtrain::python
