// Matrix products on the GPU by cuBLASLt, in the row-major convention of ops/linear.h (jtok::gemm
// and the linear layers: weights stored (out, in) as in PyTorch). Every product sums in fp32
// (CUBLAS_COMPUTE_32F: no TF32 for fp32 operands, so the fp32 instantiation checks against the
// CPU); bf16 operands use the tensor cores. Instantiated for (In, Out) = (float, float),
// (__nv_bfloat16, __nv_bfloat16) and (__nv_bfloat16, float) (bf16 products into fp32 gradients).
#pragma once
#include <cstdint>
#include <memory>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace jtok::cuda {

// A cuBLASLt handle, its workspace and, per product shape (and operand alignment), the descriptors
// and the algorithm its heuristic chose, made once and reused: the same algorithm for a shape on
// every call, so a run is bitwise reproducible. Not thread-safe, and its workspace serves one
// stream at a time: one Matmul per stream.
class Matmul {
 public:
  Matmul();
  ~Matmul();
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;

  // Row-major C (M,N) = alpha op(A) op(B) + beta C (+ bias (N) on every row when bias is not null),
  // op = transpose when trans_* is set, as jtok::gemm: A (M,K), or (K,M) if trans_a; B (K,N), or
  // (N,K) if trans_b; lda, ldb, ldc are row strides. beta 1 accumulates (gradients). c_in (not
  // null): beta's C is read from c_in (C's layout) and the result written to C (cuBLASLt's C != D).
  template <typename In, typename Out>
  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const In* A, int64_t lda,
            const In* B, int64_t ldb, float beta, Out* C, int64_t ldc, const Out* bias, cudaStream_t stream,
            const Out* c_in = nullptr);

  size_t cached_plans() const;  // distinct shapes seen so far (the heuristic ran once for each)
  // At most this many plans are kept: past it the cache starts over. MoE's expert products take
  // each step's row counts (and their operands' alignments) as shapes, so a long run would otherwise
  // keep a plan for nearly every step. The heuristic gives a shape the same algorithm again.
  static constexpr size_t kMaxPlans = 4096;
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLAS's recommendation for Hopper

  // linear_forward's products of 1..rows rows go to row_invariant_linear (cuda/row_invariant_linear.h:
  // a row's bits depend on no other row) instead of cuBLASLt; 0, the default: none. The GPU decoder
  // sets it around its decode steps (RowInvariantProducts). A setting on the Matmul rather than a
  // parameter: a decode step reaches its products through linear_forward and the trainer's shared
  // mlp_update (cuda/model.h) and MoE block, all of which take the Matmul, so no signature the
  // trainer calls changes, and the trainer, whose Matmul never sets it, keeps its products and bits.
  void set_row_invariant_rows(int64_t rows) { row_invariant_rows_ = rows; }
  int64_t row_invariant_rows() const { return row_invariant_rows_; }
  // Those products on the tensor cores where they can be (cuda/row_invariant_mma.h's
  // row_invariant_product: bf16); the decoder's DecoderSettings::tensor_cores.
  void set_row_invariant_tensor_cores(bool on) { row_invariant_tensor_cores_ = on; }
  bool row_invariant_tensor_cores() const { return row_invariant_tensor_cores_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t row_invariant_rows_ = 0;
  bool row_invariant_tensor_cores_ = false;
};

// mm's row_invariant_rows (and tensor cores) set for a scope, the previous values back at its end
// (exceptions included).
class RowInvariantProducts {
 public:
  RowInvariantProducts(Matmul& mm, int64_t rows, bool tensor_cores = false)
      : mm_(mm), prev_(mm.row_invariant_rows()), prev_tc_(mm.row_invariant_tensor_cores()) {
    mm.set_row_invariant_rows(rows);
    mm.set_row_invariant_tensor_cores(tensor_cores);
  }
  ~RowInvariantProducts() {
    mm_.set_row_invariant_rows(prev_);
    mm_.set_row_invariant_tensor_cores(prev_tc_);
  }
  RowInvariantProducts(const RowInvariantProducts&) = delete;
  RowInvariantProducts& operator=(const RowInvariantProducts&) = delete;

 private:
  Matmul& mm_;
  int64_t prev_;
  bool prev_tc_;
};

// The GemmFn of cuda/gemm_ref.h (the fused ops' matrix product, e.g. the LM head's) by cuBLASLt:
// the product above without bias, on this thread's Matmul (made on first use; one stream at a time
// per thread, as a Matmul).
template <typename In, typename Out>
void gemm_lt(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const In* A, int64_t lda,
             const In* B, int64_t ldb, float beta, Out* C, int64_t ldc, cudaStream_t stream);

// Linear layer forward: out (N,OC) (+)= inp (N,C) weight (OC,C)^T (+ bias (OC); null: none);
// accumulate adds to out instead of overwriting it. cuBLASLt, or row_invariant_linear (on the tensor
// cores with mm.row_invariant_tensor_cores(): row_invariant_product) when N <= mm.row_invariant_rows().
template <typename In, typename Out>
void linear_forward(Matmul& mm, Out* out, const In* inp, const In* weight, const Out* bias, int64_t N, int64_t C,
                    int64_t OC, bool accumulate, cudaStream_t stream);

// out (N,OC) = residual (N,OC) + inp (N,C) weight (OC,C)^T (+ bias): linear_forward accumulating onto
// a copy of residual, without the copy (cuBLASLt reads residual as its C and writes out as its D;
// the row-invariant products copy, then accumulate). The same bits as the copy and the accumulate.
// residual may be out itself.
template <typename In, typename Out>
void linear_forward_residual(Matmul& mm, Out* out, const Out* residual, const In* inp, const In* weight,
                             const Out* bias, int64_t N, int64_t C, int64_t OC, cudaStream_t stream);

// Its backward, accumulating as the CPU's linear_backward: dinp (N,C) += dout (N,OC) weight (OC,C)
// (null: skipped; without add_to_dinp written over, its old values never read: no zeroing first) and
// dweight (OC,C) += dout^T (OC,N) inp (N,C) (null: a frozen weight, skipped; without add_to_dweight
// written over likewise). dinp has the activations' type; dweight is E or fp32 (master gradients).
template <typename E, typename DW>
void linear_backward(Matmul& mm, E* dinp, DW* dweight, const E* dout, const E* inp, const E* weight, int64_t N,
                     int64_t C, int64_t OC, cudaStream_t stream, bool add_to_dinp = true, bool add_to_dweight = true);

}  // namespace jtok::cuda
