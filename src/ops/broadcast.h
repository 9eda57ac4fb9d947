// Multidirectional (numpy) broadcasting, ONNX docs/Broadcasting.md.
//
// Broadcast<N> aligns N input shapes at the right, checks that each dim pair is equal or 1,
// and describes the output as "runs": contiguous stretches of output elements along which
// every input either advances by one element or stays put. Adjacent dims with the same
// pattern are merged, so same-shape inputs give a single run and a bias over the last dim
// gives one run per row.
//
//   Broadcast<2> b({&a.shape(), &c.shape()});       // throws Error on incompatible shapes
//   b.for_each_run([&](int64_t out, const auto& in, int64_t len, const auto& step) { ... });
//
// for_each_run visits runs in parallel for large outputs; the callback must not throw.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "onnxtrain/error.h"
#include "onnxtrain/shape.h"
#include "onnxtrain/tensor.h"

namespace onnxtrain::ops {

// The broadcast shape of a and b; throws Error mentioning both shapes when incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b);

template <size_t N>
class Broadcast {
 public:
  explicit Broadcast(const std::array<const Shape*, N>& shapes) {
    size_t rank = 0;
    for (const Shape* s : shapes) rank = std::max(rank, s->size());
    out_ = Shape::filled(rank, 1);
    for (const Shape* s : shapes) out_ = broadcast_shapes(out_, *s);
    // Per input, per output dim: the input's dim (1 where padded on the left).
    std::vector<std::array<int64_t, N>> in_dims(rank);
    for (size_t k = 0; k < N; ++k) {
      const Shape& s = *shapes[k];
      for (size_t d = 0; d < rank; ++d) {
        const size_t pad = rank - s.size();
        in_dims[d][k] = d < pad ? 1 : s[d - pad];
      }
    }
    // Collapse: drop dims of size 1, merge neighbours whose inputs broadcast alike.
    for (size_t d = 0; d < rank; ++d) {
      if (out_[d] == 1) continue;
      std::array<bool, N> full;
      for (size_t k = 0; k < N; ++k) full[k] = in_dims[d][k] != 1;
      if (!dims_.empty() && full == full_.back()) {
        dims_.back() *= out_[d];
      } else {
        dims_.push_back(out_[d]);
        full_.push_back(full);
      }
    }
    // Element strides of each input along each collapsed dim (0 where broadcast).
    strides_.assign(dims_.size(), {});
    std::array<int64_t, N> running;
    running.fill(1);
    for (size_t d = dims_.size(); d-- > 0;) {
      for (size_t k = 0; k < N; ++k) {
        strides_[d][k] = full_[d][k] ? running[k] : 0;
        if (full_[d][k]) running[k] *= dims_[d];
      }
    }
  }

  const Shape& shape() const { return out_; }
  int64_t numel() const { return out_.numel(); }

  // f(out_offset, in_offsets, length, in_steps): for i in [0, length), output element
  // out_offset + i reads input k at in_offsets[k] + i * in_steps[k] (in_steps[k] is 0 or 1).
  template <class F>
  void for_each_run(F&& f) const {
    std::array<int64_t, N> zero{};
    if (numel() == 0) return;
    if (dims_.empty()) {  // every dim is 1: a single element
      f(int64_t{0}, zero, int64_t{1}, zero);
      return;
    }
    const size_t inner = dims_.size() - 1;
    const int64_t len = dims_[inner];
    std::array<int64_t, N> step;
    for (size_t k = 0; k < N; ++k) step[k] = strides_[inner][k];
    const int64_t runs = numel() / len;
    if (runs == 1) {  // one long run (same shapes, or scalars): split it between threads
      parallel_for(len, kParallelGrain, [&](int64_t begin, int64_t end) {
        std::array<int64_t, N> in;
        for (size_t k = 0; k < N; ++k) in[k] = begin * step[k];
        f(begin, in, end - begin, step);
      });
      return;
    }
    const int64_t grain = std::max<int64_t>(1, kParallelGrain / len);
    parallel_for(runs, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        std::array<int64_t, N> in{};
        int64_t rest = r;
        for (size_t d = inner; d-- > 0;) {
          const int64_t i = rest % dims_[d];
          rest /= dims_[d];
          for (size_t k = 0; k < N; ++k) in[k] += i * strides_[d][k];
        }
        f(r * len, in, len, step);
      }
    });
  }

 private:
  Shape out_;
  std::vector<int64_t> dims_;
  std::vector<std::array<bool, N>> full_;
  std::vector<std::array<int64_t, N>> strides_;
};

// out = a + b as the ONNX Add kernel computes it (elementwise_binary.cpp: in the compute type,
// rounded to the element type), over bc, the Broadcast of a's and b's shapes. a, b and out have
// one numeric element type, out the shape bc.shape(). Throws Error naming `what` for a type Add
// does not support.
void add_broadcast(const Broadcast<2>& bc, const Tensor& a, const Tensor& b, Tensor& out, const std::string& what);

}  // namespace onnxtrain::ops
