#include "ops/rope.h"

#include <cmath>

#include "core/parallel.h"

namespace jtok {

std::vector<float> rope_inv_freq(int64_t hd, double theta, const RopeScaling* llama3) {
  std::vector<float> inv(static_cast<size_t>(hd / 2));
  for (int64_t i = 0; i < hd / 2; ++i) {
    // Same float32 inv_freq as the reference (torch computes inv_freq in fp32, angle in fp32).
    inv[i] = static_cast<float>(1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(hd)));
    if (!llama3) continue;
    const double f = inv[i], wavelen = 2.0 * M_PI / f, orig = static_cast<double>(llama3->original_max_position_embeddings);
    const double lo = llama3->low_freq_factor, hi = llama3->high_freq_factor, k = llama3->factor;
    if (wavelen > orig / lo) {
      inv[i] = static_cast<float>(f / k);  // long wavelengths: interpolated by the factor
    } else if (wavelen >= orig / hi) {     // the band between: a smooth blend of the two
      const double smooth = (orig / wavelen - lo) / (hi - lo);
      inv[i] = static_cast<float>((1.0 - smooth) * f / k + smooth * f);
    }
  }
  return inv;
}

RopeTable make_rope_table(int64_t T, int64_t hd, double theta, const RopeScaling* llama3) {
  RopeTable tab;
  tab.T = T;
  tab.half = hd / 2;
  tab.cos.resize(static_cast<size_t>(T * tab.half));
  tab.sin.resize(static_cast<size_t>(T * tab.half));
  const std::vector<float> inv = rope_inv_freq(hd, theta, llama3);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < tab.half; ++i) {
      const float inv_freq = inv[static_cast<size_t>(i)];
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

// The reference rotation in double: angle t * freq[i] for the hd/2 frequencies freq.
static void rotate_ref(float* x, int64_t B, int64_t T, int64_t H, int64_t hd, const std::vector<double>& freq,
                       double sign) {
  const int64_t half = hd / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        float* v = x + ((b * T + t) * H + h) * hd;
        for (int64_t i = 0; i < half; ++i) {
          const double ang = static_cast<double>(t) * freq[static_cast<size_t>(i)];
          const double c = std::cos(ang), s = sign * std::sin(ang), x1 = v[i], x2 = v[i + half];
          v[i] = static_cast<float>(x1 * c - x2 * s);
          v[i + half] = static_cast<float>(x2 * c + x1 * s);
        }
      }
}

static std::vector<double> theta_freq(int64_t hd, double theta) {
  std::vector<double> f(static_cast<size_t>(hd / 2));
  for (int64_t i = 0; i < hd / 2; ++i) f[static_cast<size_t>(i)] = std::pow(theta, -2.0 * i / hd);
  return f;
}

void rope_forward_ref(float* x, int64_t B, int64_t T, int64_t H, int64_t hd, double theta) {
  rotate_ref(x, B, T, H, hd, theta_freq(hd, theta), 1.0);
}
void rope_forward_ref(float* x, int64_t B, int64_t T, int64_t H, int64_t hd, const std::vector<float>& inv_freq) {
  rotate_ref(x, B, T, H, hd, std::vector<double>(inv_freq.begin(), inv_freq.end()), 1.0);
}
void rope_backward_ref(float* dx, int64_t B, int64_t T, int64_t H, int64_t hd, double theta) {
  rotate_ref(dx, B, T, H, hd, theta_freq(hd, theta), -1.0);
}

}  // namespace jtok
