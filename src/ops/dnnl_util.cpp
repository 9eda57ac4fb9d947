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

CacheKey::CacheKey() { values_.push_back(omp_get_max_threads()); }

CacheKey& CacheKey::add(const Shape& shape) {
  values_.push_back(static_cast<int64_t>(shape.size()));
  for (int64_t d : shape) values_.push_back(d);
  return *this;
}

}  // namespace onnxtrain::ops::dnnl_util
