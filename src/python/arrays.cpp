#include "python/arrays.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "onnxtrain/error.h"

namespace onnxtrain::python {

using namespace nb::literals;

namespace {

using Code = nb::dlpack::dtype_code;

// One row per element type: its DLPack code and width, and its NumPy name (ml_dtypes' for
// the types NumPy lacks: the names onnx.helper.tensor_dtype_to_np_dtype gives). DLPack widths
// below 8 bits are packed, while a Tensor holds one element per byte: those rows only serve
// NumPy arrays of ml_dtypes' types, which also hold one element per byte.
struct DTypeRow {
  DataType dtype;
  Code code;
  uint8_t bits;
  const char* numpy;
  bool ml_dtypes;
};

constexpr DTypeRow kDTypes[] = {
    {DataType::Float32, Code::Float, 32, "float32", false},
    {DataType::Float64, Code::Float, 64, "float64", false},
    {DataType::Float16, Code::Float, 16, "float16", false},
    {DataType::BFloat16, Code::Bfloat, 16, "bfloat16", true},
    {DataType::Int8, Code::Int, 8, "int8", false},
    {DataType::Int16, Code::Int, 16, "int16", false},
    {DataType::Int32, Code::Int, 32, "int32", false},
    {DataType::Int64, Code::Int, 64, "int64", false},
    {DataType::UInt8, Code::UInt, 8, "uint8", false},
    {DataType::UInt16, Code::UInt, 16, "uint16", false},
    {DataType::UInt32, Code::UInt, 32, "uint32", false},
    {DataType::UInt64, Code::UInt, 64, "uint64", false},
    {DataType::Bool, Code::Bool, 8, "bool", false},
    {DataType::Float8E4M3FN, Code::Float8_E4M3FN, 8, "float8_e4m3fn", true},
    {DataType::Float8E4M3FNUZ, Code::Float8_E4M3FNUZ, 8, "float8_e4m3fnuz", true},
    {DataType::Float8E5M2, Code::Float8_E5M2, 8, "float8_e5m2", true},
    {DataType::Float8E5M2FNUZ, Code::Float8_E5M2FNUZ, 8, "float8_e5m2fnuz", true},
    {DataType::Float8E8M0, Code::Float8_E8M0FNU, 8, "float8_e8m0fnu", true},
    {DataType::Float4E2M1, Code::Float4_E2M1FN, 4, "float4_e2m1fn", true},
    {DataType::Float6E2M3, Code::Float6_E2M3FN, 6, "float6_e2m3fn", true},
    {DataType::Float6E3M2, Code::Float6_E3M2FN, 6, "float6_e3m2fn", true},
    {DataType::Int4, Code::Int, 4, "int4", true},
    {DataType::UInt4, Code::UInt, 4, "uint4", true},
    {DataType::Int2, Code::Int, 2, "int2", true},
    {DataType::UInt2, Code::UInt, 2, "uint2", true},
};

std::atomic<uint64_t> g_copies_in{0};

const DTypeRow* row_of(DataType dtype) {
  for (const auto& row : kDTypes) {
    if (row.dtype == dtype) return &row;
  }
  return nullptr;
}

std::string python_type(nb::handle h) { return nb::cast<std::string>(nb::type_name(h.type())); }

nb::module_ numpy() { return nb::module_::import_("numpy"); }

nb::tuple shape_tuple(const Shape& shape) {
  nb::list dims;
  for (int64_t d : shape) dims.append(d);
  return nb::tuple(dims);
}

DataType dtype_from_dlpack(nb::dlpack::dtype dt, const std::string& what) {
  if (dt.lanes == 1 && dt.bits >= 8) {
    for (const auto& row : kDTypes) {
      if (static_cast<uint8_t>(row.code) == dt.code && row.bits == dt.bits) return row.dtype;
    }
  }
  std::string kind = dt.code == static_cast<uint8_t>(Code::Complex) ? "complex" : "DLPack type code " + std::to_string(dt.code);
  throw Error(what + ": arrays of " + kind + " with " + std::to_string(dt.bits) + "-bit elements" +
              (dt.lanes == 1 ? "" : " x" + std::to_string(dt.lanes)) +
              " have no ONNX element type onnxtrain runs (sub-byte types: pass NumPy arrays of ml_dtypes' int4, "
              "uint4, int2, uint2, float4_e2m1fn, one element per byte)");
}

// Keeps an imported array alive while tensors view its memory; drops it under the GIL (the
// last tensor may die on any thread).
class ArrayOwner final : public StorageOwner {
 public:
  explicit ArrayOwner(nb::ndarray<nb::ro, nb::c_contig> array) : array_(std::move(array)) {}
  ~ArrayOwner() override { release(nullptr, 0); }
  void release(void*, size_t) noexcept override {
    if (!array_.is_valid()) return;
    nb::gil_scoped_acquire gil;
    array_ = {};
  }

 private:
  nb::ndarray<nb::ro, nb::c_contig> array_;
};

// A tensor from an object nanobind imports as an array (DLPack or the buffer protocol); `dtype`
// overrides the array's element type (ml_dtypes' arrays arrive as their bits).
Tensor import_array(nb::handle obj, DataType dtype, bool alias, const std::string& what) {
  nb::ndarray<nb::ro, nb::c_contig> a;
  if (!nb::try_cast(obj, a, true)) {
    throw nb::type_error((what + ": expected an array (NumPy, PyTorch, DLPack or buffer protocol), got " +
                          python_type(obj)).c_str());
  }
  if (a.device_type() != nb::device::cpu::value) {
    throw Error(what + ": the array is on a device other than the CPU (DLPack device type " +
                std::to_string(a.device_type()) + "); onnxtrain computes on the CPU: move it there first");
  }
  if (dtype == DataType::Undefined) dtype = dtype_from_dlpack(a.dtype(), what);
  Shape shape;
  for (size_t i = 0; i < a.ndim(); ++i) shape.push_back(static_cast<int64_t>(a.shape(i)));
  const size_t nbytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  if (alias && nbytes > 0 && reinterpret_cast<uintptr_t>(a.data()) % Tensor::kAlignment == 0) {
    void* data = const_cast<void*>(a.data());  // only read: kernels take inputs as const
    auto storage = std::make_shared<Storage>(data, nbytes, std::make_shared<ArrayOwner>(std::move(a)));
    return Tensor(dtype, shape, std::move(storage));
  }
  Tensor t(dtype, shape);
  if (nbytes > 0) std::memcpy(t.raw_data(), a.data(), nbytes);
  g_copies_in.fetch_add(1, std::memory_order_relaxed);
  return t;
}

// String tensors from NumPy str, bytes or object arrays: str elements are encoded as UTF-8
// (lone surrogates by surrogateescape, so that strings read back unchanged), bytes kept as they are.
Tensor strings_from_numpy(nb::handle array, const std::string& what) {
  Shape shape;
  for (nb::handle d : nb::tuple(array.attr("shape"))) shape.push_back(nb::cast<int64_t>(d));
  Tensor t(DataType::String, shape);
  nb::list items = nb::list(numpy().attr("ravel")(array).attr("tolist")());
  std::string* out = t.data<std::string>();
  for (size_t i = 0; i < items.size(); ++i) {
    nb::handle item = items[i];
    if (PyUnicode_Check(item.ptr())) {
      nb::object bytes = nb::steal(PyUnicode_AsEncodedString(item.ptr(), "utf-8", "surrogateescape"));
      if (!bytes.is_valid()) throw nb::python_error();
      out[i].assign(PyBytes_AS_STRING(bytes.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(bytes.ptr())));
    } else if (PyBytes_Check(item.ptr())) {
      out[i].assign(PyBytes_AS_STRING(item.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(item.ptr())));
    } else {
      throw Error(what + ": element " + std::to_string(i) + " of the object array is " + python_type(item) +
                  "; a string tensor holds str or bytes");
    }
  }
  return t;
}

// int4 and int2 as ml_dtypes stores them: the low bits of the byte. A Tensor sign-extends them.
bool is_signed_sub_byte(DataType dtype) { return dtype == DataType::Int4 || dtype == DataType::Int2; }

void sign_extend(Tensor& t) {
  const int bits = dtype_bits(t.dtype());
  auto* p = static_cast<uint8_t*>(t.raw_data());
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int low = p[i] & ((1 << bits) - 1);
    p[i] = static_cast<uint8_t>(static_cast<int8_t>(low >= (1 << (bits - 1)) ? low - (1 << bits) : low));
  }
}

Tensor tensor_from(nb::handle obj, bool alias, const std::string& what) {
  nb::module_ np = numpy();
  nb::object array = nb::borrow(obj);
  const bool is_ndarray = nb::isinstance(array, np.attr("ndarray"));
  const bool importable = PyObject_CheckBuffer(array.ptr()) || nb::hasattr(array, "__dlpack__");
  if (!is_ndarray && (!importable || PyBytes_Check(array.ptr()) || PyUnicode_Check(array.ptr()))) {
    array = np.attr("asarray")(array);  // scalars, lists, str and bytes, objects with __array__
  }
  if (nb::isinstance(array, np.attr("ndarray"))) {
    nb::object dtype = array.attr("dtype");
    const auto kind = nb::cast<std::string>(dtype.attr("kind"));
    const auto num = nb::cast<int>(dtype.attr("num"));
    if (num < 256 && (kind == "U" || kind == "S" || kind == "O")) return strings_from_numpy(array, what);
    if (num >= 256) {  // a dtype registered by another package: ml_dtypes' types
      const auto name = nb::cast<std::string>(dtype.attr("name"));
      for (const auto& row : kDTypes) {
        if (!row.ml_dtypes || name != row.numpy) continue;
        nb::object bits = array.attr("view")(np.attr(dtype_size(row.dtype) == 2 ? "uint16" : "uint8"));
        Tensor t = import_array(bits, row.dtype, alias && !is_signed_sub_byte(row.dtype), what);
        if (is_signed_sub_byte(row.dtype)) sign_extend(t);
        return t;
      }
      throw Error(what + ": NumPy dtype " + name + " has no ONNX element type");
    }
  }
  return import_array(array, DataType::Undefined, alias, what);
}

// A NumPy array over `t`'s memory, owning it through a capsule.
nb::object wrap(Tensor t, bool readonly) {
  nb::module_ np = numpy();
  nb::object dtype = numpy_dtype(t.dtype());
  const nb::tuple dims = shape_tuple(t.shape());
  if (t.dtype() == DataType::String) {
    nb::list items;
    for (const std::string& s : t.values<std::string>()) {
      items.append(nb::steal(PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "surrogateescape")));
    }
    nb::object array = np.attr("array")(items, "dtype"_a = dtype).attr("reshape")(dims);
    if (readonly) array.attr("flags").attr("writeable") = false;
    return array;
  }
  const DTypeRow* row = row_of(t.dtype());
  if (!row) throw Error("a tensor of " + std::string(dtype_name(t.dtype())) + " has no NumPy dtype");
  if (t.numel() == 0) {
    nb::object array = np.attr("empty")(dims, "dtype"_a = dtype);
    if (readonly) array.attr("flags").attr("writeable") = false;
    return array;
  }
  if (is_signed_sub_byte(t.dtype())) {  // ml_dtypes keeps only the low bits
    Tensor bits = t.clone();
    auto* p = static_cast<uint8_t*>(bits.raw_data());
    for (int64_t i = 0; i < bits.numel(); ++i) p[i] &= static_cast<uint8_t>((1 << dtype_bits(t.dtype())) - 1);
    t = std::move(bits);
  }
  const nb::dlpack::dtype dl =
      row->ml_dtypes ? nb::dlpack::dtype{static_cast<uint8_t>(Code::UInt), static_cast<uint8_t>(8 * dtype_size(t.dtype())), 1}
                     : nb::dlpack::dtype{static_cast<uint8_t>(row->code), row->bits, 1};
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  auto* kept = new Tensor(std::move(t));
  nb::capsule owner(kept, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  nb::object array;
  if (readonly) {
    array = nb::ndarray<nb::numpy, nb::ro>(kept->raw_data(), shape.size(), shape.data(), owner, nullptr, dl).cast();
  } else {
    array = nb::ndarray<nb::numpy>(kept->raw_data(), shape.size(), shape.data(), owner, nullptr, dl).cast();
  }
  return row->ml_dtypes ? array.attr("view")(dtype) : array;
}

}  // namespace

nb::object numpy_dtype(DataType dtype) {
  if (dtype == DataType::Undefined) return nb::none();
  if (dtype == DataType::String) return numpy().attr("dtype")(nb::module_::import_("builtins").attr("object"));
  const DTypeRow* row = row_of(dtype);
  if (!row) throw Error("element type " + std::string(dtype_name(dtype)) + " has no NumPy dtype");
  if (row->ml_dtypes) return numpy().attr("dtype")(nb::module_::import_("ml_dtypes").attr(row->numpy));
  return numpy().attr("dtype")(row->numpy);
}

Tensor tensor_from_array(nb::handle array, const std::string& what) { return tensor_from(array, true, what); }

Tensor owned_tensor_from_array(nb::handle array, const std::string& what) { return tensor_from(array, false, what); }

nb::object array_from_tensor(Tensor tensor) {
  if (!tensor.defined()) return nb::none();
  // Memory the library or another output still uses stays read-only for Python.
  const bool shared = tensor.dtype() != DataType::String && !tensor.storage_unique();
  return wrap(std::move(tensor), shared);
}

nb::object readonly_array_from_tensor(const Tensor& tensor) {
  if (!tensor.defined()) return nb::none();
  return wrap(tensor, true);
}

std::vector<std::pair<std::string, nb::object>> mapping_items(nb::handle mapping, const std::string& what) {
  nb::object dict = nb::borrow(mapping);
  if (!nb::isinstance<nb::dict>(dict)) {
    if (!nb::hasattr(dict, "keys")) {
      throw nb::type_error((what + " must be a mapping from name to array, got " + python_type(dict)).c_str());
    }
    dict = nb::module_::import_("builtins").attr("dict")(dict);
  }
  std::vector<std::pair<std::string, nb::object>> items;
  for (auto [key, value] : nb::borrow<nb::dict>(dict)) {
    if (!nb::isinstance<nb::str>(key)) {
      throw nb::type_error((what + ": names must be str, got " + python_type(key)).c_str());
    }
    items.emplace_back(nb::cast<std::string>(key), nb::borrow(value));
  }
  return items;
}

runtime::NamedTensors feeds_from_dict(nb::handle feeds) {
  runtime::NamedTensors result;
  for (const auto& [name, value] : mapping_items(feeds, "feeds")) {
    result[name] = tensor_from_array(value, "feed '" + name + "'");
  }
  return result;
}

nb::dict dict_from_tensors(runtime::NamedTensors tensors) {
  nb::dict result;
  for (auto& [name, tensor] : tensors) {
    Tensor t = std::move(tensor);  // leaves the map's entry empty, so only `t` holds the storage
    result[name.c_str()] = array_from_tensor(std::move(t));
  }
  return result;
}

Value value_from_object(nb::handle object, const ValueType& type, const std::string& what) {
  if (type.kind() == ValueType::Kind::Sequence) {
    if (!nb::isinstance<nb::list>(object) && !nb::isinstance<nb::tuple>(object)) {
      throw Error(what + ": the model declares " + type.to_string() + "; pass a list, got " + python_type(object));
    }
    std::vector<Value> elements;
    size_t i = 0;
    for (nb::handle item : object) {
      elements.push_back(value_from_object(item, type.element(), what + "[" + std::to_string(i++) + "]"));
    }
    return Value::sequence(type.element(), std::move(elements));
  }
  if (type.kind() == ValueType::Kind::Optional) {
    if (object.is_none()) return Value::none(type.element());
    return Value::optional(type.element(), value_from_object(object, type.element(), what));
  }
  return tensor_from_array(object, what);
}

nb::object object_from_value(Value value) {
  if (value.is_sequence()) {
    nb::list items;
    for (const Value& v : value.elements()) items.append(object_from_value(v));
    return items;
  }
  if (value.is_optional()) return value.has_element() ? object_from_value(value.element()) : nb::none();
  Tensor t = std::move(value.tensor());
  value = Value();
  return array_from_tensor(std::move(t));
}

void bind_arrays(nb::module_& m) {
  m.def(
      "_copies_in",
      [] {
        return g_copies_in.load(std::memory_order_relaxed);
      },
      "Arrays copied in (not viewed) since the module was loaded: for the tests of the zero-copy path.");
}

}  // namespace onnxtrain::python
