#include "model/qkv_variants.h"

#include <algorithm>
#include <cstring>

#include "core/parallel.h"
#include "model/transformer.h"
#include "ops/rmsnorm.h"

namespace jtok {

namespace {

// x (N, C) += b (C) on every row.
void add_bias(float* x, const float* b, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
  for (int64_t n = 0; n < N; ++n)
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) x[n * C + c] += b[c];
}

// db (C) += sum over the N rows of dx (N, C), rows in order (the same bits at any thread count).
void bias_grad(float* db, const float* dx, int64_t N, int64_t C) {
  if (!db) return;  // a frozen bias
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
  for (int64_t c = 0; c < C; ++c) {
    float s = 0.0f;
    for (int64_t n = 0; n < N; ++n) s += dx[n * C + c];
    db[c] += s;
  }
}

// x (rows, hd) normed in place per row with gain g; x_in and rstd keep what the backward needs.
void head_norm_forward(float* x, std::vector<float>& x_in, std::vector<float>& rstd, const float* g, int64_t rows,
                       int64_t hd, float eps) {
  x_in.assign(x, x + rows * hd);
  rstd.resize(static_cast<size_t>(rows));
  rmsnorm_forward(x, rstd.data(), x_in.data(), g, rows, hd, eps);
}

// dx (rows, hd): the gradient w.r.t. the norm's output, replaced by the one w.r.t. its input.
void head_norm_backward(float* dx, float* dg, const std::vector<float>& x_in, const std::vector<float>& rstd,
                        const float* g, std::vector<float>& scratch, int64_t rows, int64_t hd) {
  if (scratch.size() < static_cast<size_t>(rows * hd)) scratch.resize(static_cast<size_t>(rows * hd));
  std::copy(dx, dx + rows * hd, scratch.begin());  // never shrunk: its size is the memory it holds
  std::fill(dx, dx + rows * hd, 0.0f);
  rmsnorm_backward(dx, dg, scratch.data(), x_in.data(), g, rstd.data(), rows, hd);
}

}  // namespace

void qkv_variants_forward(const LayerView& W, float* q, float* k, float* v, int64_t N, int64_t H, int64_t KV,
                          int64_t hd, float eps, QkNormActs& save) {
  if (W.bq) {
    add_bias(q, W.bq, N, H * hd);
    add_bias(k, W.bk, N, KV * hd);
    add_bias(v, W.bv, N, KV * hd);
  }
  if (W.q_norm) {
    head_norm_forward(q, save.q_in, save.rstd_q, W.q_norm, N * H, hd, eps);
    head_norm_forward(k, save.k_in, save.rstd_k, W.k_norm, N * KV, hd, eps);
  }
}

void qkv_variants_backward(const LayerView& W, LayerView& G, float* dq, float* dk, const float* dv, QkNormActs& a,
                           int64_t N, int64_t H, int64_t KV, int64_t hd) {
  if (W.q_norm) {
    head_norm_backward(dq, G.q_norm, a.q_in, a.rstd_q, W.q_norm, a.scratch, N * H, hd);
    head_norm_backward(dk, G.k_norm, a.k_in, a.rstd_k, W.k_norm, a.scratch, N * KV, hd);
  }
  if (W.bq) {
    bias_grad(G.bq, dq, N, H * hd);
    bias_grad(G.bk, dk, N, KV * hd);
    bias_grad(G.bv, dv, N, KV * hd);
  }
}

}  // namespace jtok
