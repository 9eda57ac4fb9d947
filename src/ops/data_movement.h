// Helpers shared by the data-movement kernels of shape_ops.cpp and indexing.cpp.
//
// These ops move elements without looking at them, so they dispatch on the element size
// (1, 2, 4 or 8 bytes) instead of the dtype: one instantiation serves int8, uint8 and bool,
// another float, int32 and uint32, and so on.
//
// copy_strided is the one copy loop behind Transpose, Slice, Expand, Tile, DepthToSpace and
// SpaceToDepth: each of them describes its output as a strided view of its input (a shape,
// and per output dim the input stride in elements, 0 to repeat, any sign to step backwards).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "onnxtrain/error.h"
#include "onnxtrain/shape.h"
#include "onnxtrain/tensor.h"

namespace onnxtrain::ops {

// Calls f.template operator()<U>() with U the unsigned integer of `size` bytes.
template <class F>
void visit_elem_size(size_t size, F&& f) {
  switch (size) {
    case 1: f.template operator()<uint8_t>(); break;
    case 2: f.template operator()<uint16_t>(); break;
    case 4: f.template operator()<uint32_t>(); break;
    case 8: f.template operator()<uint64_t>(); break;
    default: throw Error("unsupported element size " + std::to_string(size));
  }
}

// A scalar input (rank 0, or rank 1 with one element, as several ops allow) as int64.
inline int64_t scalar_int64(const Tensor& t, const std::string& what) {
  if (t.numel() != 1 || t.rank() > 1) {
    throw Error(what + " must be a scalar (or a 1-element 1-D tensor), got " + t.description());
  }
  return t.to_int64_vector(what)[0];
}

// A 1-D int64 input (a shape, pads, repeats, axes).
inline std::vector<int64_t> int64_list(const Tensor& t, const std::string& what) {
  if (t.dtype() != DataType::Int64) throw Error(what + " must be int64, got " + t.description());
  if (t.rank() != 1) throw Error(what + " must be 1-D, got " + t.description());
  return t.to_int64_vector(what);
}

namespace detail {

// One dim of a strided copy: its size and the element strides of source and destination.
struct CopyDim {
  int64_t size;
  int64_t src_stride;
  int64_t dst_stride;
};

// Walks the multi-indices of `dims` in row-major order, tracking both offsets.
class Odometer {
 public:
  Odometer(std::span<const CopyDim> dims, int64_t start) : dims_(dims), index_(dims.size()) {
    for (size_t d = dims.size(); d-- > 0;) {
      index_[d] = start % dims[d].size;
      start /= dims[d].size;
      src_ += index_[d] * dims[d].src_stride;
      dst_ += index_[d] * dims[d].dst_stride;
    }
  }
  int64_t src() const { return src_; }
  int64_t dst() const { return dst_; }
  void next() {
    for (size_t d = dims_.size(); d-- > 0;) {
      src_ += dims_[d].src_stride;
      dst_ += dims_[d].dst_stride;
      if (++index_[d] < dims_[d].size) return;
      src_ -= index_[d] * dims_[d].src_stride;
      dst_ -= index_[d] * dims_[d].dst_stride;
      index_[d] = 0;
    }
  }

 private:
  std::span<const CopyDim> dims_;
  std::vector<int64_t> index_;
  int64_t src_ = 0;
  int64_t dst_ = 0;
};

// Rows along the innermost dim: contiguous (memcpy), repeated (fill) or strided on either side.
template <class U>
void copy_rows(const U* src, U* dst, std::span<const CopyDim> dims) {
  const CopyDim in = dims.back();
  const auto outer = dims.first(dims.size() - 1);
  int64_t rows = 1;
  for (const CopyDim& d : outer) rows *= d.size;
  parallel_for(rows, std::max<int64_t>(1, kParallelGrain / in.size), [&](int64_t begin, int64_t end) {
    Odometer od(outer, begin);
    for (int64_t r = begin; r < end; ++r, od.next()) {
      const U* s = src + od.src();
      U* d = dst + od.dst();
      if (in.src_stride == 1 && in.dst_stride == 1) {
        std::memcpy(d, s, static_cast<size_t>(in.size) * sizeof(U));
      } else if (in.src_stride == 0 && in.dst_stride == 1) {
        std::fill(d, d + in.size, *s);
      } else {
        for (int64_t j = 0; j < in.size; ++j) d[j * in.dst_stride] = s[j * in.src_stride];
      }
    }
  });
}

// Transposes the 8 x 8 block of 4-byte elements held as 8 rows of 8 lanes: afterwards row k
// holds what was column k. Three rounds of two-vector shuffles (pairs of lanes, pairs of pairs,
// halves), which GCC emits as unpack / shuffle / lane-permute instructions under AVX.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"  // inline only: no vector crosses a real call
typedef uint32_t Lanes8 __attribute__((vector_size(32)));
inline void transpose_8x8(Lanes8 r[8]) {
  Lanes8 t[8], u[8];
  for (int k = 0; k < 8; k += 2) {
    t[k] = __builtin_shufflevector(r[k], r[k + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[k + 1] = __builtin_shufflevector(r[k], r[k + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int k = 0; k < 8; k += 4) {
    for (int h = 0; h < 2; ++h) {
      u[k + 2 * h] = __builtin_shufflevector(t[k + h], t[k + h + 2], 0, 1, 8, 9, 4, 5, 12, 13);
      u[k + 2 * h + 1] = __builtin_shufflevector(t[k + h], t[k + h + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    }
  }
  for (int k = 0; k < 4; ++k) {
    r[k] = __builtin_shufflevector(u[k], u[k + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    r[k + 4] = __builtin_shufflevector(u[k], u[k + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
}
#pragma GCC diagnostic pop

// dst[i * dst_stride + j] = src[i + j * src_stride] for the 8 x 8 block i, j in [0, 8).
inline void copy_block_8x8(const uint32_t* src, int64_t src_stride, uint32_t* dst, int64_t dst_stride) {
  Lanes8 r[8];
  for (int j = 0; j < 8; ++j) std::memcpy(&r[j], src + j * src_stride, sizeof(Lanes8));
  transpose_8x8(r);
  for (int i = 0; i < 8; ++i) std::memcpy(dst + i * dst_stride, &r[i], sizeof(Lanes8));
}

// A transpose of two dims: `t` reads the source contiguously, the innermost dim writes the
// destination contiguously. Copy tile by tile so both sides stay in cache; 4-byte elements
// (float32, int32) move in 8 x 8 register blocks, whose element-by-element copy GCC left as
// strided scalar loads (the BERT encoder's training step spent 7 % of its time there).
template <class U>
void copy_transposed(const U* src, U* dst, std::span<const CopyDim> dims, size_t t) {
  constexpr int64_t kTile = 32;
  const CopyDim a = dims[t];
  const CopyDim b = dims.back();
  std::vector<CopyDim> outer;
  for (size_t d = 0; d + 1 < dims.size(); ++d) {
    if (d != t) outer.push_back(dims[d]);
  }
  int64_t outer_count = 1;
  for (const CopyDim& d : outer) outer_count *= d.size;
  const int64_t a_tiles = (a.size + kTile - 1) / kTile;
  const int64_t tasks = outer_count * a_tiles;
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / (kTile * b.size));
  parallel_for(tasks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const Odometer od(outer, task / a_tiles);
      const int64_t i0 = (task % a_tiles) * kTile;
      const int64_t i1 = std::min(a.size, i0 + kTile);
      for (int64_t j0 = 0; j0 < b.size; j0 += kTile) {
        const int64_t j1 = std::min(b.size, j0 + kTile);
        int64_t i = i0;
        if constexpr (sizeof(U) == 4) {  // a.src_stride == 1 and b.dst_stride == 1 (see copy_strided)
          if (j1 - j0 == kTile) {
            for (; i + 8 <= i1; i += 8) {
              for (int64_t j = j0; j < j1; j += 8) {
                copy_block_8x8(reinterpret_cast<const uint32_t*>(src + od.src() + i + j * b.src_stride), b.src_stride,
                               reinterpret_cast<uint32_t*>(dst + od.dst() + i * a.dst_stride + j), a.dst_stride);
              }
            }
          }
        }
        for (; i < i1; ++i) {
          const U* s = src + od.src() + i * a.src_stride;
          U* d = dst + od.dst() + i * a.dst_stride;
          for (int64_t j = j0; j < j1; ++j) d[j] = s[j * b.src_stride];
        }
      }
    }
  });
}

// The dims of a copy of `shape` between two strided layouts, for copy_rows / copy_transposed:
// size-1 dims dropped, and each dim merged into its outer neighbour where both sides are
// contiguous across the two (so long rows stay one run).
inline std::vector<CopyDim> copy_dims(const Shape& shape, std::span<const int64_t> src_strides,
                                      std::span<const int64_t> dst_strides) {
  std::vector<CopyDim> dims;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    const CopyDim cur{shape[d], src_strides[d], dst_strides[d]};
    if (!dims.empty() && dims.back().src_stride == cur.src_stride * cur.size &&
        dims.back().dst_stride == cur.dst_stride * cur.size) {
      dims.back() = {dims.back().size * cur.size, cur.src_stride, cur.dst_stride};
    } else {
      dims.push_back(cur);
    }
  }
  if (dims.empty()) dims.push_back({1, 1, 1});
  return dims;
}

}  // namespace detail

// dst (contiguous, row-major, `shape`) receives the elements of the strided view of src:
// dst[i_0, ..., i_n-1] = src[sum_d i_d * src_strides[d]]. `src` points at the view's first
// element; strides are in elements and may be 0 (repeat) or negative (reverse).
inline void copy_strided(const void* src, void* dst, size_t elem_size, const Shape& shape,
                         std::span<const int64_t> src_strides) {
  if (shape.numel() == 0) return;
  const std::vector<int64_t> dst_strides = contiguous_strides(shape).to_vector();
  const std::vector<detail::CopyDim> dims = detail::copy_dims(shape, src_strides, dst_strides);
  // A dim other than the innermost that reads the source contiguously: a transpose.
  size_t transposed = dims.size();
  if (dims.back().src_stride != 1 && dims.back().src_stride != 0) {
    for (size_t d = 0; d + 1 < dims.size(); ++d) {
      if (dims[d].src_stride == 1 && dims[d].size >= 8) transposed = d;
    }
  }
  visit_elem_size(elem_size, [&]<class U>() {
    const U* s = static_cast<const U*>(src);
    U* d = static_cast<U*>(dst);
    if (transposed < dims.size() && dims.back().size >= 8) {
      detail::copy_transposed(s, d, dims, transposed);
    } else {
      detail::copy_rows(s, d, dims);
    }
  });
}

// The inverse of copy_strided: the strided view of dst (`dst` pointing at its first element,
// strides in elements, none 0 along a dim of size > 1, no element reached twice) receives the
// contiguous, row-major src of `shape`: dst[sum_d i_d * dst_strides[d]] = src[i_0, ..., i_n-1].
// Slice's gradient writes dY into its slice of dX with it.
inline void copy_to_strided(const void* src, void* dst, size_t elem_size, const Shape& shape,
                            std::span<const int64_t> dst_strides) {
  if (shape.numel() == 0) return;
  const std::vector<int64_t> src_strides = contiguous_strides(shape).to_vector();
  const std::vector<detail::CopyDim> dims = detail::copy_dims(shape, src_strides, dst_strides);
  visit_elem_size(elem_size, [&]<class U>() {
    detail::copy_rows(static_cast<const U*>(src), static_cast<U*>(dst), dims);
  });
}

// Row-major strides of `t` in elements, as a vector.
inline std::vector<int64_t> strides_of(const Shape& shape) { return contiguous_strides(shape).to_vector(); }

// Whether perm holds each of 0 .. perm.size() - 1 once (a Transpose perm of that rank).
inline bool is_permutation(std::span<const int64_t> perm) {
  std::vector<bool> seen(perm.size(), false);
  for (int64_t d : perm) {
    if (d < 0 || d >= static_cast<int64_t>(perm.size()) || seen[static_cast<size_t>(d)]) return false;
    seen[static_cast<size_t>(d)] = true;
  }
  return true;
}

// The permutation that undoes `perm` (a permutation of 0..rank-1, checked by the caller):
// Transpose(Transpose(x, perm), inverse_permutation(perm)) = x.
inline std::vector<int64_t> inverse_permutation(std::span<const int64_t> perm) {
  std::vector<int64_t> inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inverse[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
  return inverse;
}

// The shape of a tensor of `shape` with its dims permuted as Transpose does: dim i of the result
// is dim perm[i] (perm a permutation of 0..rank-1, checked by the caller).
inline Shape permuted_shape(const Shape& shape, std::span<const int64_t> perm) {
  Shape out;
  for (int64_t d : perm) out.push_back(shape[static_cast<size_t>(d)]);
  return out;
}

// y (contiguous, permuted_shape(x.shape(), perm), x's dtype) = x with its dims permuted.
inline void copy_permuted(const Tensor& x, Tensor& y, std::span<const int64_t> perm) {
  const Shape in_strides = contiguous_strides(x.shape());
  std::vector<int64_t> strides;
  for (int64_t d : perm) strides.push_back(in_strides[static_cast<size_t>(d)]);
  copy_strided(x.raw_data(), y.raw_data(), dtype_size(x.dtype()), y.shape(), strides);
}

// x with its dims permuted by `perm`, as a new contiguous tensor of x's dtype.
inline Tensor permuted(const Tensor& x, std::span<const int64_t> perm) {
  Tensor y(x.dtype(), permuted_shape(x.shape(), perm));
  copy_permuted(x, y, perm);
  return y;
}

// Tensors blocked by b channels: [N, C, D...] stored as [N, C / b, D..., b] (oneDNN's nChw16c and
// nChw8c for two spatial dims), the layout of the attributes x_channel_block / y_channel_block /
// dy_channel_block / dx_channel_block of the internal convolution and pooling ops.

// [N, C / b, D..., b] for [N, C, D...] (b divides C, checked by the caller).
inline Shape channel_blocked_shape(const Shape& plain, int64_t b) {
  Shape s{plain[0], plain[1] / b};
  for (size_t d = 2; d < plain.size(); ++d) s.push_back(plain[d]);
  s.push_back(b);
  return s;
}

// [N, C, D...] for [N, C / b, D..., b].
inline Shape channels_merged_shape(const Shape& blocked, int64_t b) {
  Shape s{blocked[0], blocked[1] * b};
  for (size_t d = 2; d + 1 < blocked.size(); ++d) s.push_back(blocked[d]);
  return s;
}

// [N, C, D...] for `t`, input `name` read as [N, C / b, D..., b] with `spatial` spatial dims
// (attribute `attribute` = b); throws Error naming the input for any other rank or last dim.
inline Shape channels_merged_shape(const Tensor& t, const std::string& name, size_t spatial, int64_t b,
                                   const std::string& attribute) {
  const size_t rank = spatial + 3;
  if (t.rank() != rank || t.dim(t.rank() - 1) != b) {
    throw Error("input " + name + " has shape " + t.shape().to_string() + ", expected rank " + std::to_string(rank) +
                " with last dim " + std::to_string(b) + " ([N, C / b, spatial..., b]: attribute " + attribute + " = " +
                std::to_string(b) + ")");
  }
  return channels_merged_shape(t.shape(), b);
}

// The plain [N, C, D...] tensor of x [N, C / b, D..., b], as a new tensor.
inline Tensor unblocked_channels(const Tensor& x, int64_t b) {
  std::vector<int64_t> order{0, 1, static_cast<int64_t>(x.rank()) - 1};
  for (size_t d = 2; d + 1 < x.rank(); ++d) order.push_back(static_cast<int64_t>(d));
  return permuted(x, order).view(channels_merged_shape(x.shape(), b));  // via [N, C / b, b, D...]
}

// y [N, C / b, D..., b] = plain [N, C, D...] blocked by b channels.
inline void copy_into_channel_blocks(const Tensor& plain, Tensor& y, int64_t b) {
  Shape s{plain.dim(0), plain.dim(1) / b, b};
  for (size_t d = 2; d < plain.rank(); ++d) s.push_back(plain.dim(d));
  std::vector<int64_t> order{0, 1};
  for (size_t d = 3; d < s.size(); ++d) order.push_back(static_cast<int64_t>(d));
  order.push_back(2);
  copy_permuted(plain.view(s), y, order);
}

}  // namespace onnxtrain::ops
