#include "onnxtrain/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "core/dispatch.h"
#include "onnxtrain/error.h"

namespace onnxtrain {

void throw_unsupported_dtype(DataType dtype, std::string_view what) {
  throw Error(std::string(what) + ": element type " + std::string(dtype_name(dtype)) +
              " is not supported here");
}

Storage::Storage(size_t nbytes) : nbytes_(nbytes) {
  // Round up so aligned_alloc's size is a multiple of the alignment; never allocate 0 bytes.
  const size_t rounded = (nbytes + Tensor::kAlignment - 1) / Tensor::kAlignment * Tensor::kAlignment;
  data_ = std::aligned_alloc(Tensor::kAlignment, rounded == 0 ? Tensor::kAlignment : rounded);
  if (!data_) throw std::bad_alloc();
}

Storage::~Storage() { std::free(data_); }

Tensor::Tensor(DataType dtype, const Shape& shape) : dtype_(dtype), shape_(shape) {
  if (!is_supported(dtype)) throw_unsupported_dtype(dtype, "tensor");
  for (int64_t d : shape) {
    if (d < 0) throw Error("tensor shape " + shape.to_string() + " has a negative dim");
  }
  storage_ = std::make_shared<Storage>(nbytes());
}

Tensor Tensor::zeros(DataType dtype, const Shape& shape) {
  Tensor t(dtype, shape);
  std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::view(const Shape& shape) const {
  if (shape.numel() != numel()) {
    throw Error("cannot view " + description() + " as shape " + shape.to_string() +
                ": element counts differ (" + std::to_string(numel()) + " vs " +
                std::to_string(shape.numel()) + ")");
  }
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::clone() const {
  if (!defined()) return {};
  Tensor t(dtype_, shape_);
  std::memcpy(t.raw_data(), raw_data(), nbytes());
  return t;
}

Tensor Tensor::cast(DataType to) const {
  if (to == dtype_) return clone();
  Tensor out(to, shape_);
  const int64_t n = numel();
  visit_dtype<AllTypes>(dtype_, "cast source", [&]<class From>() {
    visit_dtype<AllTypes>(to, "cast target", [&]<class To>() {
      const From* src = data<From>();
      To* dst = out.data<To>();
      for (int64_t i = 0; i < n; ++i) dst[i] = convert<To>(src[i]);
    });
  });
  return out;
}

std::vector<int64_t> Tensor::to_int64_vector(const std::string& what) const {
  std::vector<int64_t> result(static_cast<size_t>(numel()));
  if (is_floating(dtype_)) {
    throw Error(what + ": expected an integer tensor, got " + description());
  }
  visit_dtype<AllTypes>(dtype_, what, [&]<class T>() {
    const T* p = data<T>();
    for (size_t i = 0; i < result.size(); ++i) result[i] = convert<int64_t>(p[i]);
  });
  return result;
}

std::vector<double> Tensor::to_double_vector() const {
  std::vector<double> result(static_cast<size_t>(numel()));
  visit_dtype<AllTypes>(dtype_, "tensor", [&]<class T>() {
    const T* p = data<T>();
    for (size_t i = 0; i < result.size(); ++i) result[i] = convert<double>(p[i]);
  });
  return result;
}

std::string Tensor::description() const {
  if (!defined()) return "undefined tensor";
  return std::string(dtype_name(dtype_)) + shape_.to_string();
}

}  // namespace onnxtrain
