#include "ops/rope.h"

#include <cmath>

#include "core/parallel.h"

namespace jtok {

RopeTable make_rope_table(int64_t T, int64_t hd, double theta) {
  RopeTable tab;
  tab.T = T;
  tab.half = hd / 2;
  tab.cos.resize(static_cast<size_t>(T * tab.half));
  tab.sin.resize(static_cast<size_t>(T * tab.half));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < tab.half; ++i) {
      // Same float32 inv_freq as the reference (torch computes inv_freq in fp32, angle in fp32).
      float inv_freq = static_cast<float>(1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(hd)));
      double ang = static_cast<double>(static_cast<float>(t) * inv_freq);
      tab.cos[t * tab.half + i] = static_cast<float>(std::cos(ang));
      tab.sin[t * tab.half + i] = static_cast<float>(std::sin(ang));
    }
  return tab;
}

static void rotate(float* x, const RopeTable& tab, int64_t B, int64_t T, int64_t H, int64_t hd, int64_t pos0,
                   float sign) {
  const int64_t half = hd / 2;
#pragma omp parallel for collapse(2) schedule(static) if (B * T * H * hd >= kParallelMin)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const float* c = tab.cos.data() + (pos0 + t) * half;
      const float* s = tab.sin.data() + (pos0 + t) * half;
      for (int64_t h = 0; h < H; ++h) {
        float* v = x + ((b * T + t) * H + h) * hd;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          float x1 = v[i], x2 = v[i + half], sn = sign * s[i];
          v[i] = x1 * c[i] - x2 * sn;
          v[i + half] = x2 * c[i] + x1 * sn;
        }
      }
    }
}

void rope_forward(float* x, const RopeTable& tab, int64_t B, int64_t T, int64_t H, int64_t hd, int64_t pos0) {
  rotate(x, tab, B, T, H, hd, pos0, 1.0f);
}

void rope_backward(float* dx, const RopeTable& tab, int64_t B, int64_t T, int64_t H, int64_t hd) {
  rotate(dx, tab, B, T, H, hd, 0, -1.0f);
}

static void rotate_ref(float* x, int64_t B, int64_t T, int64_t H, int64_t hd, double theta, double sign) {
  const int64_t half = hd / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        float* v = x + ((b * T + t) * H + h) * hd;
        for (int64_t i = 0; i < half; ++i) {
          double ang = t * std::pow(theta, -2.0 * i / hd);
          double c = std::cos(ang), s = sign * std::sin(ang);
          double x1 = v[i], x2 = v[i + half];
          v[i] = static_cast<float>(x1 * c - x2 * s);
          v[i + half] = static_cast<float>(x2 * c + x1 * s);
        }
      }
}

void rope_forward_ref(float* x, int64_t B, int64_t T, int64_t H, int64_t hd, double theta) {
  rotate_ref(x, B, T, H, hd, theta, 1.0);
}
void rope_backward_ref(float* dx, int64_t B, int64_t T, int64_t H, int64_t hd, double theta) {
  rotate_ref(dx, B, T, H, hd, theta, -1.0);
}

}  // namespace jtok
