// The model's small element-wise helpers on the GPU (cuda/model.h): the bf16 copy of the fp32
// master weights, the q / k / v biases' gradient (attention_bias, model/qkv_variants.cpp), and the
// clearing of some spans of the flat gradients.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "cuda/device_array.h"

namespace jtok::cuda {

// in (n) fp32 -> out (n) of E (float: a copy; __nv_bfloat16: rounded to nearest even).
template <typename E>
void convert_from_f32(E* out, const float* in, int64_t n, cudaStream_t stream);

// dx (N,C) of E -> db (C) fp32 += the column sums: each of 512 fixed row ranges (fewer for N < 512)
// summed from zero in row order, a thread a column and range, then the ranges' sums in order (no
// atomics; within rounding of the CPU's bias_grad, which adds the rows in order: one thread walking
// all N rows of a column waited out N trips to memory). scratch: bias_grad_scratch(N, C) floats.
int64_t bias_grad_scratch(int64_t N, int64_t C);
template <typename E>
void bias_grad(float* db, const E* dx, int64_t N, int64_t C, float* scratch, cudaStream_t stream);

// Spans of a flat fp32 buffer, (offset, count) each, on the device for zero_spans: the starts (S),
// then the counts' running sums (S + 1: where each span begins in the spans laid end to end).
struct Span {
  int64_t offset = 0, count = 0;
};
struct DeviceSpans {
  DeviceArray<int64_t> at;
  int64_t S = 0, total = 0;
};
DeviceSpans upload_spans(const std::vector<Span>& spans);
// Every element of the spans of base set to 0, in one launch (none for no span).
void zero_spans(float* base, const DeviceSpans& spans, cudaStream_t stream);

}  // namespace jtok::cuda

namespace jtok::cuda {

// Host: every id of ids (N) in [0, V), or an error naming the first that is not ("token" / "target").
void check_ids(const int32_t* ids, int64_t N, int64_t V, const char* what);

// The mean of x (N) fp32 on the device: summed in double in a fixed order into sum (1, scratch),
// read back through rb after the queued work (one sync).
double device_mean(const float* x, double* sum, HostReadback& rb, int64_t N, cudaStream_t stream);

}  // namespace jtok::cuda
