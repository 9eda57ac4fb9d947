// Tensor: a dense, contiguous, row-major n-dimensional array.
//
// String tensors (DataType::String) hold one std::string per element, constructed empty and
// destroyed with their storage; kernels copy them element by element, never with memcpy.
//
// A Tensor is a (dtype, shape) pair over shared storage. Copying a Tensor is cheap and shares
// the storage; `view` reinterprets it with another shape of the same element count (what
// Reshape, Flatten, Squeeze and Unsqueeze produce). Storage is 64-byte aligned. Use `clone` for
// a deep copy. Scalars have rank 0 and one element; a dim of 0 gives an empty tensor.
#pragma once

#include <cassert>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "onnxtrain/dtype.h"
#include "onnxtrain/shape.h"

namespace onnxtrain {

// Memory lent to tensors by someone else (a runtime's arena, runtime/memory_plan.h): the last
// tensor that views it hands it back through release() instead of freeing it.
class StorageOwner {
 public:
  virtual ~StorageOwner() = default;
  virtual void release(void* data, size_t nbytes) noexcept = 0;
};

// A 64-byte-aligned block of memory, shared by the tensors that view it. Blocks the tensor
// owns come from a process-wide cache of freed blocks of the same rounded size (up to 256 MiB
// is kept), so steady-state training reuses memory instead of asking the system for it.
class Storage {
 public:
  explicit Storage(size_t nbytes);
  // A block of `count` empty std::string objects (string tensors), destroyed with the block.
  static std::shared_ptr<Storage> strings(size_t count);
  // A view of `data` (nbytes long, 64-byte aligned), given back to `owner` when destroyed.
  Storage(void* data, size_t nbytes, std::shared_ptr<StorageOwner> owner);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() { return data_; }
  const void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  size_t strings_ = 0;  // std::string objects constructed at data_
  std::shared_ptr<StorageOwner> owner_;
};

class Tensor {
 public:
  static constexpr size_t kAlignment = 64;

  // An undefined tensor (an absent optional input or output).
  Tensor() = default;
  // Uninitialized storage for `shape` elements of `dtype`. Throws Error for a dtype a tensor
  // cannot hold, a negative dim, or a shape of more bytes than int64 counts (such as
  // [2^40, 2^40, 2^40]: every tensor's numel() and nbytes() are exact);
  // std::bad_alloc when the memory cannot be had.
  Tensor(DataType dtype, const Shape& shape);
  // A tensor over existing storage, which must hold at least nbytes() bytes. Throws Error when
  // it does not, the dtype cannot be held or the shape is invalid (as above).
  Tensor(DataType dtype, const Shape& shape, std::shared_ptr<Storage> storage);
  static Tensor zeros(DataType dtype, const Shape& shape);
  // A copy of `values` with the given shape (values.size() must equal shape.numel()).
  template <class T>
  static Tensor from_vector(const Shape& shape, const std::vector<T>& values);
  template <class T>
  static Tensor scalar(T value) {
    return from_vector<T>(Shape{}, {value});
  }

  bool defined() const { return dtype_ != DataType::Undefined; }
  DataType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  size_t rank() const { return shape_.size(); }
  int64_t dim(size_t i) const { return shape_[i]; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  void* raw_data() { return storage_ ? static_cast<char*>(storage_->data()) + offset_ : nullptr; }
  const void* raw_data() const {
    return storage_ ? static_cast<const char*>(storage_->data()) + offset_ : nullptr;
  }
  // Typed access; T must match dtype() (checked by assertion).
  template <class T>
  T* data() {
    assert(dtype_ == dtype_of<T>);
    return static_cast<T*>(raw_data());
  }
  template <class T>
  const T* data() const {
    assert(dtype_ == dtype_of<T>);
    return static_cast<const T*>(raw_data());
  }
  template <class T>
  std::span<const T> values() const {
    return {data<T>(), static_cast<size_t>(numel())};
  }
  // The elements as int64 (any integral or bool dtype); throws Error for floating dtypes.
  std::vector<int64_t> to_int64_vector(const std::string& what) const;
  // The elements as double (any dtype).
  std::vector<double> to_double_vector() const;

  // The same storage seen with another shape; numel must match (throws Error otherwise).
  Tensor view(const Shape& shape) const;
  // A deep copy.
  Tensor clone() const;
  // Element-wise conversion to another dtype with ONNX Cast semantics.
  Tensor cast(DataType dtype) const;
  bool shares_storage_with(const Tensor& other) const {
    return storage_ && storage_ == other.storage_;
  }
  // True when no other tensor shares this storage (the buffer may be reused in place).
  bool storage_unique() const { return storage_ && storage_.use_count() == 1; }

  // "float32[2,3]"
  std::string description() const;

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes into storage_
  DataType dtype_ = DataType::Undefined;
  Shape shape_;
};

template <class T>
Tensor Tensor::from_vector(const Shape& shape, const std::vector<T>& values) {
  Tensor t(dtype_of<T>, shape);
  assert(static_cast<int64_t>(values.size()) == shape.numel());
  T* out = t.data<T>();
  for (size_t i = 0; i < values.size(); ++i) out[i] = values[i];
  return t;
}

}  // namespace onnxtrain
