// SplitMix64: the one 64-bit mixing function behind the loader's random windows, the routing
// digest of distributed training and embp-plan's stand-in routing.
#pragma once
#include <cstdint>

namespace jtok {

inline constexpr uint64_t kSplitMixGamma = 0x9e3779b97f4a7c15ULL;

// The SplitMix64 output for state z (z + gamma, then the finalizer): a stateless hash of z.
inline uint64_t mix64(uint64_t z) {
  z += kSplitMixGamma;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The generator: the next value of the stream whose state is x, advancing it.
inline uint64_t splitmix64(uint64_t& x) {
  const uint64_t r = mix64(x);
  x += kSplitMixGamma;
  return r;
}

}  // namespace jtok
