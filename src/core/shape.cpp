#include "onnxtrain/shape.h"

#include "onnxtrain/error.h"

namespace onnxtrain {

Shape Shape::filled(size_t rank, int64_t fill) {
  Shape s;
  s.resize(rank, fill);
  return s;
}

Shape& Shape::operator=(Shape&& other) noexcept {
  if (this == &other) return *this;
  if (other.heap_) {
    heap_ = std::move(other.heap_);
    capacity_ = other.capacity_;
  } else {
    heap_.reset();
    capacity_ = kInlineRank;
    std::copy(other.inline_, other.inline_ + other.size_, inline_);
  }
  size_ = other.size_;
  other.size_ = 0;
  other.capacity_ = kInlineRank;
  return *this;
}

void Shape::reserve(size_t n) {
  if (n <= capacity_) return;
  auto grown = std::make_unique<int64_t[]>(n);
  std::copy(data(), data() + size_, grown.get());
  heap_ = std::move(grown);
  capacity_ = n;
}

void Shape::assign(const int64_t* dims, size_t n) {
  reserve(n);
  std::copy(dims, dims + n, data());
  size_ = n;
}

void Shape::push_back(int64_t d) {
  if (size_ == capacity_) reserve(capacity_ * 2);
  data()[size_++] = d;
}

void Shape::resize(size_t rank, int64_t fill) {
  reserve(rank);
  for (size_t i = size_; i < rank; ++i) data()[i] = fill;
  size_ = rank;
}

void Shape::insert(size_t pos, int64_t d) {
  push_back(0);
  int64_t* p = data();
  for (size_t i = size_ - 1; i > pos; --i) p[i] = p[i - 1];
  p[pos] = d;
}

void Shape::erase(size_t pos) {
  int64_t* p = data();
  for (size_t i = pos; i + 1 < size_; ++i) p[i] = p[i + 1];
  --size_;
}

int64_t Shape::numel() const { return numel(0, size_); }

int64_t Shape::numel(size_t begin, size_t end) const {
  int64_t n = 1;
  for (size_t i = begin; i < end; ++i) n *= data()[i];
  return n;
}

std::string Shape::to_string() const {
  std::string s = "[";
  for (size_t i = 0; i < size_; ++i) {
    if (i) s += ",";
    s += std::to_string(data()[i]);
  }
  return s + "]";
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides = Shape::filled(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
  return strides;
}

int64_t normalize_axis(int64_t axis, int64_t rank, const std::string& what) {
  if (axis < -rank || axis >= rank) {
    throw Error(what + ": axis " + std::to_string(axis) + " is out of range for rank " +
                std::to_string(rank) + " (expected [" + std::to_string(-rank) + ", " +
                std::to_string(rank - 1) + "])");
  }
  return axis < 0 ? axis + rank : axis;
}

}  // namespace onnxtrain
