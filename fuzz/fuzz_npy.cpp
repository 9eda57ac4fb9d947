// Fuzz harness: NumPy .npy bytes through io::parse_npy (io.h).
#include <string>

#include "harness.h"
#include "onnxtrain/io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  onnxtrain::fuzz::expect_error_or_success([&] { onnxtrain::fuzz::check_tensor(onnxtrain::io::parse_npy(bytes, "fuzz.npy")); });
  return 0;
}
