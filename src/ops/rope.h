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
// Llama 3.1's frequency scaling ("rope_type": "llama3"): wavelengths beyond original_max / low_freq_factor
// have their frequency divided by factor, those below original_max / high_freq_factor kept, and the
// band between interpolated smoothly (Hugging Face's _compute_llama3_parameters).
struct RopeScaling {
  double factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};
// The hd/2 inverse frequencies theta^(-2i/hd), in float32 as torch computes them; scaled when
// llama3 is given.
std::vector<float> rope_inv_freq(int64_t hd, double theta, const RopeScaling* llama3 = nullptr);
RopeTable make_rope_table(int64_t T, int64_t hd, double theta, const RopeScaling* llama3 = nullptr);

// x (B,T,H,hd), rotated in place; position of row t is t (each sequence starts at 0),
// or pos0 + t when decoding with a cache.
void rope_forward(float* x, const RopeTable& tab, int64_t B, int64_t T, int64_t H, int64_t hd, int64_t pos0 = 0);
// dx (B,T,H,hd) in place: the inverse rotation (the transpose of the forward).
void rope_backward(float* dx, const RopeTable& tab, int64_t B, int64_t T, int64_t H, int64_t hd);

void rope_forward_ref(float* x, int64_t B, int64_t T, int64_t H, int64_t hd, double theta);
// The same from explicit inverse frequencies (hd/2 of them: rope_inv_freq).
void rope_forward_ref(float* x, int64_t B, int64_t T, int64_t H, int64_t hd, const std::vector<float>& inv_freq);
void rope_backward_ref(float* dx, int64_t B, int64_t T, int64_t H, int64_t hd, double theta);

}  // namespace jtok
