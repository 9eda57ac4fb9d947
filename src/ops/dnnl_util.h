// Shared oneDNN plumbing for the float32 kernels of matmul.cpp and conv.cpp: one CPU engine
// per process, one stream per thread, memory descriptors for onnxtrain tensors, a translation
// of oneDNN failures into onnxtrain::Error, and the small per-kernel cache that keeps the
// primitives a kernel made for the input shapes it has seen.
//
// oneDNN runs on OpenMP here (DNNL_CPU_RUNTIME_OMP) and takes its thread count from
// omp_get_max_threads() when a primitive is created; SessionOptions.threads sets that count
// with omp_set_num_threads. Cache keys therefore start with the current thread count, so a
// changed count makes new primitives instead of reusing ones planned for another count.
#pragma once

#include <cstdint>
#include <deque>
#include <dnnl.hpp>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "onnxtrain/error.h"
#include "onnxtrain/shape.h"

namespace onnxtrain::ops::dnnl_util {

dnnl::engine& cpu_engine();
// The calling thread's stream (streams are not shared between threads).
dnnl::stream& cpu_stream();

dnnl::memory::dims to_dims(std::span<const int64_t> dims);
inline dnnl::memory::dims to_dims(const Shape& shape) { return to_dims(shape.dims()); }

// A float32 descriptor of a dense row-major tensor with these dims.
dnnl::memory::desc plain_f32(const dnnl::memory::dims& dims);
// A float32 descriptor with explicit element strides (transposed or permuted views).
dnnl::memory::desc strided_f32(const dnnl::memory::dims& dims, const dnnl::memory::dims& strides);

// Calls f(); a dnnl::error becomes Error("oneDNN could not <what>: <oneDNN's message>").
template <class F>
auto checked(const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const dnnl::error& e) {
    throw Error("oneDNN could not " + what + ": " + e.what());
  }
}

// A cache key: the OpenMP thread count, then whatever the kernel adds (shapes, flags).
class CacheKey {
 public:
  CacheKey();
  CacheKey& add(int64_t v) {
    values_.push_back(v);
    return *this;
  }
  // Adds the rank, then the dims (so [2,3]+[4] and [2]+[3,4] differ).
  CacheKey& add(const Shape& shape);
  friend bool operator==(const CacheKey&, const CacheKey&) = default;

 private:
  std::vector<int64_t> values_;
};

// The primitives (and whatever goes with them) a kernel made, by key. Holds the few most
// recently made entries; the oldest is dropped when a new shape arrives and it is full.
// One operand of a primitive that chose its own layouts (format any): the ONNX tensor (plain
// layout, its pointer bound per run) and, when the primitive wants another layout, an owned
// buffer in that layout and the reorder between them (tensor -> buffer for an input, buffer ->
// tensor for an output).
class Operand {
 public:
  Operand() = default;
  Operand(const dnnl::memory::desc& plain, const dnnl::memory::desc& wanted, bool input)
      : input_(input), reordered_(wanted != plain) {
    const dnnl::engine& engine = cpu_engine();
    user_ = dnnl::memory(plain, engine, nullptr);
    if (!reordered_) return;
    inner_ = dnnl::memory(wanted, engine);
    reorder_ = input ? dnnl::reorder(user_, inner_) : dnnl::reorder(inner_, user_);
  }

  // The memory the primitive reads or writes.
  const dnnl::memory& arg() const { return reordered_ ? inner_ : user_; }
  void bind(const float* data) { user_.set_data_handle(const_cast<float*>(data)); }
  // Inputs: before the primitive; outputs: after it.
  void reorder(dnnl::stream& stream) {
    if (!reordered_) return;
    if (input_) {
      reorder_.execute(stream, user_, inner_);
    } else {
      reorder_.execute(stream, inner_, user_);
    }
  }

 private:
  bool input_ = true, reordered_ = false;
  dnnl::memory user_, inner_;
  dnnl::reorder reorder_;
};

template <class Entry>
class PrimitiveCache {
 public:
  static constexpr size_t kCapacity = 8;

  // The entry for `key`, made by make() on a miss.
  template <class Make>
  Entry& get(const CacheKey& key, Make&& make) {
    for (auto& [k, entry] : entries_) {
      if (k == key) return entry;
    }
    if (entries_.size() == kCapacity) entries_.pop_front();
    entries_.emplace_back(key, make());
    return entries_.back().second;
  }
  size_t size() const { return entries_.size(); }

 private:
  std::deque<std::pair<CacheKey, Entry>> entries_;
};

}  // namespace onnxtrain::ops::dnnl_util
