#include "ops/dnnl_util.h"

#include <cstdlib>
#include <new>

#include <omp.h>

#include <algorithm>

namespace onnxtrain::ops::dnnl_util {

char* thread_scratch(size_t bytes) {
  struct Buffer {
    char* data = nullptr;
    size_t size = 0;
    ~Buffer() { std::free(data); }
  };
  thread_local Buffer buffer;
  if (bytes > buffer.size) {
    const size_t size = (bytes + 63) / 64 * 64;
    void* grown = std::aligned_alloc(64, size);
    if (!grown) throw std::bad_alloc();
    std::free(buffer.data);
    buffer.data = static_cast<char*>(grown);
    buffer.size = size;
  }
  return buffer.data;
}

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& cpu_stream() {
  thread_local dnnl::stream stream(cpu_engine());
  return stream;
}

dnnl::memory::dims to_dims(std::span<const int64_t> dims) {
  return dnnl::memory::dims(dims.begin(), dims.end());
}

bool has_isa(dnnl::cpu_isa wanted) {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  return (isa & static_cast<unsigned>(wanted)) == static_cast<unsigned>(wanted);
}

bool has_avx512() {
  static const bool has = has_isa(dnnl::cpu_isa::avx512_core);
  return has;
}

dnnl::memory::desc plain_f32(const dnnl::memory::dims& dims) {
  dnnl::memory::dims strides(dims.size());
  dnnl::memory::dim running = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    strides[i] = running;
    running *= std::max<dnnl::memory::dim>(dims[i], 1);
  }
  return strided_f32(dims, strides);
}

dnnl::memory::desc strided_f32(const dnnl::memory::dims& dims, const dnnl::memory::dims& strides) {
  return checked("describe a float32 tensor",
                 [&] { return dnnl::memory::desc(dims, dnnl::memory::data_type::f32, strides); });
}

namespace {

// The offset of the element at `index` in a blocked descriptor, as oneDNN lays it out: each
// inner block, the last innermost, takes the index's remainder in that dim; what is left of
// each index then steps by the dim's outer stride.
int64_t blocked_offset(const dnnl_memory_desc_t& md, const int64_t* index) {
  const dnnl_blocking_desc_t& blocking = md.format_desc.blocking;
  int64_t left[DNNL_MAX_NDIMS];
  std::copy(index, index + md.ndims, left);
  int64_t offset = md.offset0, inner = 1;
  for (int b = blocking.inner_nblks - 1; b >= 0; --b) {
    const int d = static_cast<int>(blocking.inner_idxs[b]);
    offset += (left[d] % blocking.inner_blks[b]) * inner;
    inner *= blocking.inner_blks[b];
    left[d] /= blocking.inner_blks[b];
  }
  for (int d = 0; d < md.ndims; ++d) offset += left[d] * blocking.strides[d];
  return offset;
}

}  // namespace

void ChannelsLastTranspose::run(const float* src, float* dst) const {
  for (int64_t n = 0; n < images; ++n) {
    const float* image = src + n * channels * positions;
    float* out = dst + n * channels * positions;
    for (int64_t c = 0; c < channels; ++c) {
      const float* plane = image + c * positions;
      for (int64_t s = 0; s < positions; ++s) out[s * channels + c] = plane[s];
    }
  }
}

ChannelsLastTranspose small_channels_first_to_last(const dnnl::memory::desc& plain, const dnnl::memory::desc& wanted) {
  const dnnl::memory::dims dims = plain.dims();
  if (dims.size() < 3 || plain.data_type() != dnnl::memory::data_type::f32 || !same_layout(plain, plain_f32(dims))) {
    return {};
  }
  int64_t numel = 1;
  for (const auto d : dims) numel *= d;
  if (numel <= 0 || numel > kSmallTransposeFloats) return {};
  const int64_t images = dims[0], channels = dims[1], positions = numel / (images * channels);
  dnnl::memory::dims strides(dims.size());
  strides[0] = numel / images;
  strides[1] = 1;
  int64_t stride = channels;
  for (size_t d = dims.size() - 1; d >= 2; --d) {
    strides[d] = stride;
    stride *= dims[d];
  }
  if (!same_layout(wanted, strided_f32(dims, strides))) return {};
  return {images, channels, positions};
}

bool same_layout(const dnnl::memory::desc& a, const dnnl::memory::desc& b) {
  if (a == b) return true;
  const dnnl_memory_desc_t &x = a.data, &y = b.data;
  if (x.format_kind != dnnl_blocked || y.format_kind != dnnl_blocked || x.data_type != y.data_type ||
      x.ndims != y.ndims || a.get_size() != b.get_size()) {
    return false;
  }
  for (int d = 0; d < x.ndims; ++d) {
    if (x.dims[d] != y.dims[d] || x.padded_dims[d] != x.dims[d] || y.padded_dims[d] != y.dims[d]) return false;
    if (x.dims[d] <= 0) return false;
  }
  // Every index, in order (layouts that differ mostly do at one of the first indices).
  int64_t index[DNNL_MAX_NDIMS] = {};
  for (;;) {
    if (blocked_offset(x, index) != blocked_offset(y, index)) return false;
    int d = x.ndims - 1;
    for (; d >= 0; --d) {
      if (++index[d] < x.dims[d]) break;
      index[d] = 0;
    }
    if (d < 0) return true;
  }
}

CacheKey::CacheKey() { values_.push_back(omp_get_max_threads()); }

CacheKey& CacheKey::add(const Shape& shape) {
  values_.push_back(static_cast<int64_t>(shape.size()));
  for (int64_t d : shape) values_.push_back(d);
  return *this;
}

}  // namespace onnxtrain::ops::dnnl_util
