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
#include <unordered_map>
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

// Whether a and b put every element at the same place: the same element type and dims, no
// padding, and equal offsets for every index under oneDNN's blocking (outer strides, then the
// inner blocks). True for descriptors that differ in name only, such as a channel-blocked layout
// (aBcd16b) of a tensor whose spatial dims are all 1 and whose channels the block divides, which
// is the row-major layout: a reorder between them would copy every byte to where it already is.
// Throws nothing: a pair it cannot compare (a format other than blocked, a dim of 0) is false.
// Walks every index once when the layouts match (called where a primitive is planned, not per run).
bool same_layout(const dnnl::memory::desc& a, const dnnl::memory::desc& b);

// Whether oneDNN runs its kernels for `wanted` (or a superset) on this CPU
// (dnnl::get_effective_cpu_isa(), whose values are bit sets of the instruction sets they hold).
bool has_isa(dnnl::cpu_isa wanted);

// has_isa(avx512_core), asked once: the rules that choose a kernel by the CPU's vector width
// (measured on an AVX-512 and an AVX2 machine, docs/performance.md) read it at every call.
bool has_avx512();

// Calls f(); a dnnl::error becomes Error("oneDNN could not <what>: <oneDNN's message>").
template <class F>
auto checked(const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const dnnl::error& e) {
    throw Error("oneDNN could not " + what + ": " + e.what());
  }
}

// Throws Error("oneDNN could not <what> (status <status>)") unless status is dnnl_success: the
// check for oneDNN's C calls, which return a status instead of throwing (dnnl_sgemm and
// row_major_sgemm, which run inside parallel regions too and so must not throw there).
inline void check_status(dnnl_status_t status, const char* what) {
  if (status != dnnl_success) {
    throw Error(std::string("oneDNN could not ") + what + " (status " + std::to_string(static_cast<int>(status)) + ")");
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
// Memory for the reordered copies of the operands of one kernel call, shared by every call on
// the calling thread (one call runs at a time there): it holds the largest any call needed,
// not the sum over every convolution of a graph (ResNet-18 training: 20 convolutions with
// blocked copies of their weights, inputs and gradients). 64-byte aligned; valid until the next
// call of thread_scratch on this thread; grows, never shrinks. Throws std::bad_alloc.
char* thread_scratch(size_t bytes);
// The bytes a buffer of `desc` takes in thread_scratch memory (its size rounded up to 64).
inline size_t scratch_size(const dnnl::memory::desc& desc) { return (desc.get_size() + 63) / 64 * 64; }

// [N, C, S] -> [N, S, C] for float32 (S the product of the spatial dims): a small input's
// reorder from ONNX's channels-first layout into the channels-last one a convolution asked for,
// done in place of oneDNN's reorder on the calling thread. A network's first convolution at
// batch 1 (ResNet-18's [1, 3, 32, 32] input, Intel Xeon VM, 2 threads) spent 4.5-7.8 us a run in
// oneDNN 2.6's jit:uni reorder (DNNL_VERBOSE) for 12 KB; with this loop instead the network's
// run took 0.616-0.633 ms against 0.624-0.648 (four alternating pairs of 1500 runs).
struct ChannelsLastTranspose {
  int64_t images = 0, channels = 0, positions = 0;
  void run(const float* src, float* dst) const;
};
// The transpose for a reorder from `plain` to `wanted` where plain is float32 row-major [N, C,
// D...], wanted the same tensor channels-last [N, D..., C], and the tensor at most
// kSmallTransposeFloats floats; images 0 (the reorder runs) otherwise.
inline constexpr int64_t kSmallTransposeFloats = int64_t{1} << 14;
ChannelsLastTranspose small_channels_first_to_last(const dnnl::memory::desc& plain, const dnnl::memory::desc& wanted);

// One operand of a primitive that chose its own layouts (format any): the ONNX tensor (plain
// layout, its pointer bound per run) and, when the primitive wants another layout, a buffer in
// that layout and the reorder between them (tensor -> buffer for an input, buffer -> tensor for
// an output). The buffer is placed per call (place) in thread_scratch memory. Where the wanted
// layout is the tensor's own under another name (same_layout), the primitive reads or writes the
// tensor through a descriptor of the wanted layout, and nothing is copied.
class Operand {
 public:
  Operand() = default;
  Operand(const dnnl::memory::desc& plain, const dnnl::memory::desc& wanted, bool input)
      : input_(input), reordered_(!same_layout(plain, wanted)) {
    const dnnl::engine& engine = cpu_engine();
    user_ = dnnl::memory(reordered_ ? plain : wanted, engine, nullptr);
    if (!reordered_) return;
    inner_ = dnnl::memory(wanted, engine, nullptr);
    reorder_ = input ? dnnl::reorder(user_, inner_) : dnnl::reorder(inner_, user_);
    if (input) transpose_ = small_channels_first_to_last(plain, wanted);
  }

  // Bytes of scratch the reordered buffer takes (0 when the primitive reads the tensor itself),
  // rounded up to 64.
  size_t scratch_bytes() const { return reordered_ ? scratch_size(inner_.get_desc()) : 0; }
  // Puts the reordered buffer at `cursor` and moves it past the buffer.
  void place(char*& cursor) {
    if (!reordered_) return;
    inner_.set_data_handle(cursor);
    cursor += scratch_bytes();
  }

  // The memory the primitive reads or writes.
  const dnnl::memory& arg() const { return reordered_ ? inner_ : user_; }
  void bind(const float* data) { user_.set_data_handle(const_cast<float*>(data)); }
  // Inputs: before the primitive; outputs: after it.
  void reorder(dnnl::stream& stream) {
    if (!reordered_) return;
    if (transpose_.images > 0) {
      transpose_.run(static_cast<const float*>(user_.get_data_handle()), static_cast<float*>(inner_.get_data_handle()));
    } else if (input_) {
      reorder_.execute(stream, user_, inner_);
    } else {
      reorder_.execute(stream, inner_, user_);
    }
  }

 private:
  bool input_ = true, reordered_ = false;
  dnnl::memory user_, inner_;
  dnnl::reorder reorder_;
  ChannelsLastTranspose transpose_;  // images 0: the reorder runs
};

// A primitive's scratchpad, left to the caller (a primitive made with user_scratchpad()) and
// placed per call in thread_scratch memory, instead of a buffer each primitive owns for life.
class Scratchpad {
 public:
  Scratchpad() = default;
  explicit Scratchpad(const dnnl::memory::desc& desc)
      : memory_(desc, cpu_engine(), nullptr), bytes_(scratch_size(desc)) {}
  size_t scratch_bytes() const { return bytes_; }
  void place(char*& cursor) {
    if (bytes_ == 0) return;
    memory_.set_data_handle(cursor);
    cursor += bytes_;
  }
  // Adds the scratchpad to a primitive's arguments (when it needs one).
  void add_to(std::unordered_map<int, dnnl::memory>& args) const {
    if (bytes_ > 0) args[DNNL_ARG_SCRATCHPAD] = memory_;
  }

 private:
  dnnl::memory memory_;
  size_t bytes_ = 0;
};

// Primitive attributes with scratchpad_mode::user (see Scratchpad).
inline dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

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
