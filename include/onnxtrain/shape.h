// Shape: the dims of a tensor, outermost first (row-major), each >= 0.
//
// Shapes of rank <= 8 live inline, so making and copying them allocates nothing; higher ranks
// (allowed by ONNX, rare in practice) use the heap.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace onnxtrain {

class Shape {
 public:
  static constexpr size_t kInlineRank = 8;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) { assign(dims.begin(), dims.size()); }
  explicit Shape(std::span<const int64_t> dims) { assign(dims.data(), dims.size()); }
  explicit Shape(const std::vector<int64_t>& dims) { assign(dims.data(), dims.size()); }
  // A shape of `rank` dims, each `fill`.
  static Shape filled(size_t rank, int64_t fill);

  Shape(const Shape& other) { assign(other.data(), other.size()); }
  Shape& operator=(const Shape& other) {
    if (this != &other) assign(other.data(), other.size());
    return *this;
  }
  Shape(Shape&& other) noexcept { *this = std::move(other); }
  Shape& operator=(Shape&& other) noexcept;

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  int64_t* data() { return heap_ ? heap_.get() : inline_; }
  const int64_t* data() const { return heap_ ? heap_.get() : inline_; }
  int64_t& operator[](size_t i) { return data()[i]; }
  int64_t operator[](size_t i) const { return data()[i]; }
  int64_t back() const { return data()[size_ - 1]; }
  int64_t* begin() { return data(); }
  int64_t* end() { return data() + size_; }
  const int64_t* begin() const { return data(); }
  const int64_t* end() const { return data() + size_; }
  std::span<const int64_t> dims() const { return {data(), size_}; }
  std::vector<int64_t> to_vector() const { return {begin(), end()}; }

  void push_back(int64_t d);
  void resize(size_t rank, int64_t fill = 0);
  void insert(size_t pos, int64_t d);
  void erase(size_t pos);

  // Product of the dims (1 for rank 0).
  int64_t numel() const;
  // Product of dims [begin, end).
  int64_t numel(size_t begin, size_t end) const;
  // "[2,3,4]"
  std::string to_string() const;

  friend bool operator==(const Shape& a, const Shape& b) {
    return a.size_ == b.size_ && std::equal(a.begin(), a.end(), b.begin());
  }

 private:
  void assign(const int64_t* dims, size_t n);
  void reserve(size_t n);

  int64_t inline_[kInlineRank] = {};
  std::unique_ptr<int64_t[]> heap_;
  size_t size_ = 0;
  size_t capacity_ = kInlineRank;
};

// Row-major strides, in elements, of a contiguous tensor of this shape.
Shape contiguous_strides(const Shape& shape);

// Resolves a possibly negative axis against `rank` (ONNX: axis in [-rank, rank-1]).
// Throws Error naming `what` when out of range.
int64_t normalize_axis(int64_t axis, int64_t rank, const std::string& what);

}  // namespace onnxtrain
