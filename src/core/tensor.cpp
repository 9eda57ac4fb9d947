#include "onnxtrain/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#if defined(__unix__)
#include <sys/mman.h>
#endif

#include "core/cast.h"
#include "core/dispatch.h"
#include "core/memory.h"
#include "onnxtrain/error.h"

namespace onnxtrain {

void throw_unsupported_dtype(DataType dtype, std::string_view what) {
  throw Error(std::string(what) + ": element type " + std::string(dtype_name(dtype)) +
              " is not supported here");
}

namespace {

// Freed blocks by rounded size. Training repeats the same sizes every step, so after the first
// step every block comes from here. Bounded by kMaxCachedBytes; beyond it blocks are freed.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

class BlockCache {
 public:
  static constexpr size_t kMaxCachedBytes = size_t{256} << 20;

  void* take(size_t rounded) {
    {
      std::lock_guard lock(mutex_);
      auto it = free_.find(rounded);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_bytes_ -= rounded;
        return p;
      }
    }
    void* p = std::aligned_alloc(Tensor::kAlignment, rounded);
    if (!p) throw std::bad_alloc();
    memory_stats_.system_allocations.fetch_add(1, std::memory_order_relaxed);
    return p;
  }

  void give(void* p, size_t rounded) noexcept {
    if (kSanitized) {  // let AddressSanitizer see every use after free
      std::free(p);
      return;
    }
    {
      std::lock_guard lock(mutex_);
      if (cached_bytes_ + rounded <= kMaxCachedBytes) {
        try {
          free_[rounded].push_back(p);
          cached_bytes_ += rounded;
          return;
        } catch (...) {  // no memory for the list: free the block instead
        }
      }
    }
    std::free(p);
  }

  void trim() noexcept {
    std::lock_guard lock(mutex_);
    for (auto& [size, blocks] : free_) {
      for (void* p : blocks) std::free(p);
    }
    free_.clear();
    cached_bytes_ = 0;
  }

  MemoryStats memory_stats_;

 private:
  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_bytes_ = 0;
};

BlockCache& block_cache() {
  static BlockCache* cache = new BlockCache;  // never destroyed: tensors may outlive statics
  return *cache;
}

// Round up so aligned_alloc's size is a multiple of the alignment; never allocate 0 bytes.
size_t rounded_size(size_t nbytes) {
  const size_t rounded = (nbytes + Tensor::kAlignment - 1) / Tensor::kAlignment * Tensor::kAlignment;
  return rounded == 0 ? Tensor::kAlignment : rounded;
}

}  // namespace

const MemoryStats& memory_stats() { return block_cache().memory_stats_; }
void* take_block(size_t bytes) { return block_cache().take(bytes); }
void give_block(void* block, size_t bytes) noexcept { block_cache().give(block, bytes); }
void trim_block_cache() noexcept { block_cache().trim(); }

void* take_mapped_block(size_t bytes) {
#if defined(__unix__) && !defined(__SANITIZE_ADDRESS__)
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
#else
  void* p = std::aligned_alloc(Tensor::kAlignment, rounded_size(bytes));
  if (!p) throw std::bad_alloc();
#endif
  block_cache().memory_stats_.system_allocations.fetch_add(1, std::memory_order_relaxed);
  return p;
}

void give_mapped_block(void* block, size_t bytes) noexcept {
#if defined(__unix__) && !defined(__SANITIZE_ADDRESS__)
  munmap(block, bytes);
#else
  (void)bytes;
  std::free(block);
#endif
}

Storage::Storage(size_t nbytes) : data_(block_cache().take(rounded_size(nbytes))), nbytes_(nbytes) {
  block_cache().memory_stats_.storage_allocations.fetch_add(1, std::memory_order_relaxed);
}

Storage::Storage(void* data, size_t nbytes, std::shared_ptr<StorageOwner> owner)
    : data_(data), nbytes_(nbytes), owner_(std::move(owner)) {
  block_cache().memory_stats_.storage_allocations.fetch_add(1, std::memory_order_relaxed);
}

std::shared_ptr<Storage> Storage::strings(size_t count) {
  auto storage = std::make_shared<Storage>(count * sizeof(std::string));
  auto* p = static_cast<std::string*>(storage->data_);
  for (size_t i = 0; i < count; ++i) new (p + i) std::string();
  storage->strings_ = count;
  return storage;
}

Storage::~Storage() {
  auto* strings = static_cast<std::string*>(data_);
  for (size_t i = 0; i < strings_; ++i) strings[i].~basic_string();
  if (owner_) {
    owner_->release(data_, nbytes_);
  } else {
    block_cache().give(data_, rounded_size(nbytes_));
  }
}

size_t checked_nbytes(DataType dtype, const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw Error("tensor shape " + shape.to_string() + " has a negative dim");
    if (__builtin_mul_overflow(n, d, &n)) throw Error("tensor shape " + shape.to_string() + " has too many elements");
  }
  int64_t bytes = 0;
  if (__builtin_mul_overflow(n, static_cast<int64_t>(dtype_size(dtype)), &bytes)) {
    throw Error("tensor shape " + shape.to_string() + " has too many elements");
  }
  return static_cast<size_t>(bytes);
}

Tensor::Tensor(DataType dtype, const Shape& shape) : dtype_(dtype), shape_(shape) {
  if (!is_supported(dtype)) throw_unsupported_dtype(dtype, "tensor");
  checked_nbytes(dtype, shape);
  storage_ = dtype == DataType::String ? Storage::strings(static_cast<size_t>(numel()))
                                       : std::make_shared<Storage>(nbytes());
}

Tensor::Tensor(DataType dtype, const Shape& shape, std::shared_ptr<Storage> storage)
    : storage_(std::move(storage)), dtype_(dtype), shape_(shape) {
  if (!is_supported(dtype)) throw_unsupported_dtype(dtype, "tensor");
  if (dtype == DataType::String) throw Error("string tensors own their storage; they cannot view raw memory");
  checked_nbytes(dtype, shape);
  if (!storage_ || storage_->nbytes() < nbytes()) {
    throw Error("storage of " + std::to_string(storage_ ? storage_->nbytes() : 0) + " bytes is too small for " +
                description());
  }
}

Tensor Tensor::zeros(DataType dtype, const Shape& shape) {
  Tensor t(dtype, shape);
  if (dtype != DataType::String) std::memset(t.raw_data(), 0, t.nbytes());  // strings start empty
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
  if (dtype_ == DataType::String) {
    std::copy_n(data<std::string>(), numel(), t.data<std::string>());
  } else {
    std::memcpy(t.raw_data(), raw_data(), nbytes());
  }
  return t;
}

Tensor Tensor::cast(DataType to) const {
  if (to == dtype_) return clone();
  Tensor out(to, shape_);
  cast_into(*this, out);
  return out;
}

std::vector<int64_t> Tensor::to_int64_vector(const std::string& what) const {
  std::vector<int64_t> result(static_cast<size_t>(numel()));
  if (is_floating(dtype_) || is_narrow_float(dtype_)) {
    throw Error(what + ": expected an integer tensor, got " + description());
  }
  visit_dtype<TensorTypes>(dtype_, what, [&]<class T>() {
    const T* p = data<T>();
    for (size_t i = 0; i < result.size(); ++i) result[i] = convert<int64_t>(p[i]);
  });
  return result;
}

std::vector<double> Tensor::to_double_vector() const {
  std::vector<double> result(static_cast<size_t>(numel()));
  visit_dtype<TensorTypes>(dtype_, "tensor", [&]<class T>() {
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
