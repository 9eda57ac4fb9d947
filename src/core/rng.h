// Counter-based random numbers: Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random
// numbers: as easy as 1, 2, 3", SC 2011).
//
// A value is a pure function of (key, counter), so a random op needs no mutable generator:
// its stream is keyed by the seed and the node, and counted by (run index, element index).
// Replaying a run with the same key and run index gives the same numbers on any number of
// threads, and a checkpoint only has to remember the run index.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string_view>

namespace onnxtrain {

class Philox {
 public:
  // `seed` and `stream` (e.g. a node's stream_id) are mixed into the 64-bit key.
  Philox(uint64_t seed, uint64_t stream) {
    const uint64_t k = mix(seed ^ mix(stream));
    key_ = {static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32)};
  }

  // Four 32-bit random words for block `block` of run `run`.
  std::array<uint32_t, 4> block(uint64_t run, uint64_t block) const {
    return philox4x32_10({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                          static_cast<uint32_t>(run), static_cast<uint32_t>(run >> 32)},
                         key_);
  }

  // The bare Philox4x32-10 bijection of (counter, key).
  static std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
    for (int round = 0; round < 10; ++round) {
      const uint64_t p0 = uint64_t{0xD2511F53} * ctr[0];
      const uint64_t p1 = uint64_t{0xCD9E8D57} * ctr[2];
      ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0], static_cast<uint32_t>(p1),
             static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1], static_cast<uint32_t>(p0)};
      key[0] += 0x9E3779B9u;
      key[1] += 0xBB67AE85u;
    }
    return ctr;
  }

  // Uniform in [0, 1) with 24 random bits (exactly representable in float).
  static float to_unit_float(uint32_t word) { return static_cast<float>(word >> 8) * (1.0f / 16777216.0f); }
  // Uniform in [0, 1) with 53 random bits.
  static double to_unit_double(uint32_t hi, uint32_t lo) {
    return static_cast<double>((uint64_t{hi} << 21) ^ (lo >> 11)) * (1.0 / 9007199254740992.0);
  }

 private:
  // splitmix64's finalizer.
  static uint64_t mix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  std::array<uint32_t, 2> key_{};
};

// A stable 64-bit hash of a name (FNV-1a), used as a node's stream id.
inline uint64_t stream_id(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace onnxtrain
