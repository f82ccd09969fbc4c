// Token-table rows staged to the GPU (issue 40; the path of tables the GPU cannot read in place: a
// disk store, int8 / int4 rows, or a table the measurement says to copy): the CPU table's own gather
// (gather_rows / gather_rows_bf16: any storage) writes a batch's rows into pinned staging in the
// model's activation type, cudaMemcpyAsync copies them on a side stream, and an event recorded
// after the copy is what the consumer stream waits on (cudaStreamWaitEvent) before the layer that
// reads them: the consumer never blocks the host. The two halves are apart so that the gather can
// run where the caller wants it: StepRows (step_rows.h) queues it on the side stream as a host
// function (cudaLaunchHostFunc) ahead of the copy, so no thread waits for it; stage_rows runs it
// on the calling thread.
//   t (V, d) any dtype, ids (n) host -> staging (n, d) of T pinned -> out (n, d) of T device
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>

#include "cuda/check.h"
#include "cuda/device_array.h"
#include "model/token_table.h"

namespace jtok::cuda {

// staging (n, d) of T (pinned) = the rows of ids (n, host; each held by t, else it fails naming the
// id) by gather_rows in f32, or gather_rows_bf16 (rounded to nearest even; a bf16 table's rows
// copied with their stored bits). No CUDA call (it may run as a host function on CUDA's callback
// thread; it throws jtok::Error on an id t does not hold: a host function must catch it). staging
// must not be the source of a copy still in flight (queued on that copy's stream after it, or its
// event waited for). Safe beside other gathers of t on other threads (gather_rows only reads; a
// disk store locks its cache).
template <typename T>
void gather_rows_to_staging(T* staging, const TokenTable& t, const int32_t* ids, int64_t n);

// out (n, d) of T (device) <- staging (n, d) on `side`, then `ready` (may be null) recorded on side.
template <typename T>
void copy_staged_rows(T* out, const T* staging, int64_t n, int64_t d, cudaStream_t side, cudaEvent_t ready);

// Both, the gather on the calling thread (staging's previous copy done), then the copy and its event.
template <typename T>
void stage_rows(T* out, T* staging, const TokenTable& t, const int32_t* ids, int64_t n, cudaStream_t side,
                cudaEvent_t ready) {
  gather_rows_to_staging(staging, t, ids, n);
  copy_staged_rows(out, staging, n, t.dim, side, ready);
}

// The consumer's side: the work queued on `consumer` from now on starts after `ready`'s copy.
inline void wait_rows(cudaStream_t consumer, cudaEvent_t ready) {
  JTOK_CUDA_CHECK(cudaStreamWaitEvent(consumer, ready, 0));
}

}  // namespace jtok::cuda
