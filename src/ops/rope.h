// Rotary position embedding, Hugging Face "rotate_half" layout (docs/model.md):
// for i < hd/2, (x_i, x_{i+hd/2}) is rotated by angle t * theta^(-2i/hd).
#pragma once
#include <cstdint>
#include <vector>

namespace jtok {

// cos/sin tables (T, hd/2) for positions 0..T-1.
struct RopeTable {
  int64_t T = 0, half = 0;
  std::vector<float> cos, sin;
};
RopeTable make_rope_table(int64_t T, int64_t hd, double theta);

// x (B,T,H,hd), rotated in place; position of row t is t (each sequence starts at 0),
// or pos0 + t when decoding with a cache.
void rope_forward(float* x, const RopeTable& tab, int64_t B, int64_t T, int64_t H, int64_t hd, int64_t pos0 = 0);
// dx (B,T,H,hd) in place: the inverse rotation (the transpose of the forward).
void rope_backward(float* dx, const RopeTable& tab, int64_t B, int64_t T, int64_t H, int64_t hd);

void rope_forward_ref(float* x, int64_t B, int64_t T, int64_t H, int64_t hd, double theta);
void rope_backward_ref(float* dx, int64_t B, int64_t T, int64_t H, int64_t hd, double theta);

}  // namespace jtok
