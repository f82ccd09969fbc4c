// Helpers for op tests: random tensors, normalised error, finite-difference gradients.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <vector>

namespace jtok::testing {

inline std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// ||a - b|| / max(||b||, tiny): the normalised error of ggml's test-backend-ops.
inline double rel_err(std::span<const float> a, std::span<const float> b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

// Central finite differences of a scalar function f(x) with respect to every element of x.
// f reads x; it is evaluated in double where the op allows. Returns df/dx.
// Central difference of f with respect to one value x (restored afterwards).
inline float central_difference(float& x, const std::function<double()>& f, float h = 1e-2f) {
  const float keep = x;
  x = keep + h;
  const double fp = f();
  x = keep - h;
  const double fm = f();
  x = keep;
  return static_cast<float>((fp - fm) / (2.0 * h));
}

inline std::vector<float> numeric_grad(std::span<float> x, const std::function<double()>& f, float h = 1e-2f) {
  std::vector<float> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) g[i] = central_difference(x[i], f, h);
  return g;
}

// Scalar probe of an output: sum(out * w) in double.
inline double dot(const std::vector<float>& out, const std::vector<float>& w) {
  double s = 0;
  for (size_t i = 0; i < out.size(); ++i) s += static_cast<double>(out[i]) * w[i];
  return s;
}

}  // namespace jtok::testing
