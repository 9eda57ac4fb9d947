// Fuzz harness: safetensors files through io::read_safetensors (safetensors.h), read from an
// in-memory file.
#include "harness.h"
#include "onnxtrain/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static onnxtrain::fuzz::MemFile file;
  const auto path = file.write(data, size);
  onnxtrain::fuzz::expect_error_or_success([&] {
    for (const auto& [name, tensor] : onnxtrain::io::read_safetensors(path).tensors) onnxtrain::fuzz::check_tensor(tensor);
  });
  return 0;
}
