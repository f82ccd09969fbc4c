// Opt-in section timers: set JTOK_PROFILE=1 and the totals per section are printed at exit.
// Costs one branch per section when off.
#pragma once
#include <chrono>

namespace jtok {

bool profiling_enabled();
void profile_add(const char* section, double seconds);

struct ProfileScope {
  const char* name;
  std::chrono::steady_clock::time_point t0;
  bool on;
  explicit ProfileScope(const char* n) : name(n), on(profiling_enabled()) {
    if (on) t0 = std::chrono::steady_clock::now();
  }
  ~ProfileScope() {
    if (on) profile_add(name, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
};

}  // namespace jtok

#define JTOK_PROFILE_CAT2(a, b) a##b
#define JTOK_PROFILE_CAT(a, b) JTOK_PROFILE_CAT2(a, b)
#define JTOK_PROFILE(name) ::jtok::ProfileScope JTOK_PROFILE_CAT(jtok_profile_, __LINE__)(name)
