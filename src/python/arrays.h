// Arrays between Python and onnxtrain: Tensor and Value in, NumPy arrays out.
//
// In (tensor_from_array): NumPy arrays, PyTorch tensors and any object with __dlpack__ or the
// buffer protocol; Python scalars and nested lists go through numpy.asarray. Element types
// map exactly, never by conversion (the table in arrays.cpp): NumPy's own types, ml_dtypes'
// bfloat16, float8_e4m3fn, float8_e4m3fnuz, float8_e5m2, float8_e5m2fnuz, float8_e8m0fnu,
// float4_e2m1fn, float6_e2m3fn, float6_e3m2fn, int4, uint4, int2, uint2 (the types onnx's
// helper.tensor_dtype_to_np_dtype names), DLPack's codes for the same (torch.bfloat16,
// torch.float8_e4m3fn, ...), and str, bytes or object arrays for string tensors. Arrays on
// another device than the CPU, complex arrays and packed sub-byte DLPack arrays are errors.
// Memory: a CPU array that is C-contiguous and whose data is 64-byte aligned (Tensor's
// alignment; PyTorch's CPU allocator aligns to 64 bytes, NumPy's usually does not) is viewed
// without a copy and kept alive by the tensor; any other array is copied once. The library
// never writes into the tensors it is given, so a viewed array is only read.
//
// Out (array_from_tensor): a NumPy array over the tensor's own memory, never a copy, which
// keeps the storage alive through a capsule. It is writable when no other tensor shares that
// storage, and read-only when one does (a step's new weights are also the session's state, an
// output may be an initializer or another output): the library never writes into a tensor it
// made, so the values stay, and Python cannot change what the session still uses. bfloat16 and
// the narrow types come back as arrays of ml_dtypes' types (int4 and int2 through one copy: ml_dtypes
// keeps their low bits where a Tensor sign-extends), strings as object arrays of str.
//
// Errors: onnxtrain::Error naming `what` (e.g. "feed 'x'") for arrays that cannot become
// tensors; nb::type_error for objects that are no arrays at all. Call with the GIL held.
#pragma once

#include <nanobind/nanobind.h>

#include <string>
#include <utility>
#include <vector>

#include "onnxtrain/session.h"
#include "onnxtrain/tensor.h"
#include "onnxtrain/value.h"

namespace onnxtrain::python {

namespace nb = nanobind;

// A tensor from any array (see the file comment); may view the array's memory.
Tensor tensor_from_array(nb::handle array, const std::string& what);
// The same, always in memory of its own (values a session keeps, such as set_state's).
Tensor owned_tensor_from_array(nb::handle array, const std::string& what);
// A NumPy array over the tensor's memory: writable when the storage is unshared (pass the tensor
// with std::move), else read-only.
nb::object array_from_tensor(Tensor tensor);
// A read-only NumPy array over the tensor's memory, never a copy (for state the session keeps:
// the library replaces tensors, it never writes into them, so the view keeps its values).
nb::object readonly_array_from_tensor(const Tensor& tensor);

// The (str key, value) items of a mapping (a dict or anything with keys()), in its order;
// nb::type_error naming `what` for a non-mapping or a non-str key.
std::vector<std::pair<std::string, nb::object>> mapping_items(nb::handle mapping, const std::string& what);
// Feeds from a mapping of input name (str) to array. nb::type_error for a non-mapping or a
// non-str key.
runtime::NamedTensors feeds_from_dict(nb::handle feeds);
// Every tensor as an array (array_from_tensor); pass the map with std::move, else every array is
// read-only (the caller's map still shares each tensor).
nb::dict dict_from_tensors(runtime::NamedTensors tensors);

// A value of the declared `type` (ONNX IR "Static types"): an array for a tensor type, a list
// or tuple of values for a sequence type, None or a value for an optional type.
Value value_from_object(nb::handle object, const ValueType& type, const std::string& what);
// A tensor as an array, a sequence as a list, an optional as None or its element.
nb::object object_from_value(Value value);

// The NumPy dtype of an element type (ml_dtypes' for the types NumPy lacks, object for strings;
// None for Undefined).
nb::object numpy_dtype(DataType dtype);

// onnxtrain._core._copies_in(): arrays copied in (not viewed) since the module was loaded, for the
// tests of the zero-copy path.
void bind_arrays(nb::module_& m);

}  // namespace onnxtrain::python
