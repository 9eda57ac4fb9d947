// Fuzz harness: .npz archives (zip of .npy members) through io::read_npz (io.h), read from an
// in-memory file.
#include "harness.h"
#include "onnxtrain/io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static onnxtrain::fuzz::MemFile file;
  const auto path = file.write(data, size);
  onnxtrain::fuzz::expect_error_or_success([&] {
    for (const auto& [name, tensor] : onnxtrain::io::read_npz(path)) onnxtrain::fuzz::check_tensor(tensor);
  });
  return 0;
}
