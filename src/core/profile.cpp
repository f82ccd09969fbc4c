#include "core/profile.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

namespace jtok {

namespace {
struct Totals {
  std::mutex mu;
  std::map<std::string, std::pair<double, long>> t;
  ~Totals() {
    if (t.empty()) return;
    double all = 0;
    for (auto& [k, v] : t) all += v.first;
    std::fprintf(stderr, "profile (JTOK_PROFILE=1): section, seconds, calls, share\n");
    for (auto& [k, v] : t)
      std::fprintf(stderr, "  %-24s %9.3f s %7ld  %5.1f%%\n", k.c_str(), v.first, v.second, 100 * v.first / all);
  }
};
Totals& totals() {
  static Totals t;
  return t;
}
}  // namespace

bool profiling_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("JTOK_PROFILE");
    return e && *e && std::string(e) != "0";
  }();
  return on;
}

void profile_add(const char* section, double seconds) {
  auto& T = totals();
  std::lock_guard<std::mutex> g(T.mu);
  auto& e = T.t[section];
  e.first += seconds;
  e.second += 1;
}

}  // namespace jtok
