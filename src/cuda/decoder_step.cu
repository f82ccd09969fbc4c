// A decode step of the GPU decoder (src/cuda/decoder_state.h's decode_step, after decode's checks),
// eager or replayed as a CUDA graph (issue 40). The step's M sequences are padded to R =
// batch_bucket(M) rows (cuda/decode_buckets.h): rows M..R-1 are dummies, the first token at position
// 0 of the scratch sequence (a page-table row and a page no KvPages handle owns), so they write and
// read only the scratch page and their logits and choices are dropped. The paged attention is
// launched for length_bucket(max_len) positions: rows stop at their own chunks, so the bits do not
// depend on it. Both modes launch the same kernels at the same shapes: the same bits.
//
// A graph holds stream work only: what a step does on the host, and where it went.
//   before the replay (decode_step): the checks (sequences open, distinct, room; ids in the
//     vocabulary), the longest row, the buckets, the stream's sync before host_step is rewritten,
//     the step's ints (ids, row_seq, pos) written into pinned host_step.
//   the graph's first nodes: host_step copied up into acts.step (memcpy nodes from the fixed pinned
//     buffers, so a replay is one launch with no copy call of the host's before it, the device idle),
//     which every captured kernel reads through fixed pointers (page tables: device buffers).
//   made capture-safe: the rows' request reads the ids from acts.step on the device
//     (StepRows::request_device: no pinned ids copy, no cudaEventSynchronize, no host id check);
//     dedup's cub temporary storage was sized at set-up (nothing allocated); the gathers' sources go
//     by value in the kernel's arguments; the side stream forks from and joins the decoder's stream
//     by events recorded inside the capture; JTok-M's choices go to pinned host_sel (a memcpy node);
//     the products are row_invariant_linear's plain launches (no cuBLASLt plan to make; see
//     queue_decode); paged attention's shared-memory attribute is set by the eager run of the same
//     shape that precedes every capture (a capture sets it again: not stream work).
//   after the replay: the M rows' logits copied to the host and the stream's sync (the copy outside
//     the graph: M rows, not R), the staged rows' errors (StepRows::check_error), the pages'
//     lengths, the rows read (the host's dedup of the ids and JTok-M's choices).
//   decode_digest's steps (sampling on the GPU, cuda/logit_digest.h): the rows' inputs go up with
//     the step's ints (pinned host_digest_rows -> acts.digest_rows, a memcpy node, dummies greedy), the graph (its
//     own, keyed by the digest flag beside the shape) ends in the digest kernel over all R rows'
//     logits, and only the M digests come back (copied outside the graph, as the logits are).
//   MoE layers: the experts' products grouped by the offsets on the device (cuda/model_moe.h's decode
//     step), no host copy, so graphs hold them too.
//   eager only (no graphs for that decoder, the reason in describe()): staged rows (the host gathers
//     them in host functions on the rows' side stream, whose ids and copy sizes are the step's: a
//     graph would fix them), profiling (events between phases), settings.cuda_graphs off.
// A capture that fails turns graphs off for the decoder, saying why once; the step it follows has
// already run eagerly, so nothing is lost.
#include <chrono>
#include <cstdio>
#include <vector>

#include "cuda/decode_buckets.h"
#include "cuda/decoder_state.h"
#include "cuda/logit_digest.h"
#include "cuda/model_kernels.h"
#include "cuda/pdl_edges.h"

namespace jtok::cuda {

DecodeGraphs::~DecodeGraphs() {
  for (auto& [shape, graph] : graphs_) cudaGraphExecDestroy(graph.exec);
}

DecodeGraphs::Captured DecodeGraphs::find(const DecodeShape& shape) const {
  const auto it = graphs_.find(shape);
  return it == graphs_.end() ? Captured{} : it->second;
}

void DecodeGraphs::add(const DecodeShape& shape, const Captured& graph) {
  Captured& slot = graphs_[shape];
  if (slot.exec) cudaGraphExecDestroy(slot.exec);
  slot = graph;
}

namespace {

using Clock = std::chrono::steady_clock;

// The R rows' digest inputs into pinned host_digest_rows: rows[0..M), then greedy dummies.
template <typename E>
void fill_digest_rows(DecoderState<E>& st, const DigestRow* rows, int64_t M, const StepShape& sh) {
  DecoderActs<E>& A = st.acts;
  JTOK_CHECK(sh.R <= A.digests.size(), "cuda decoder: digests of ", sh.R, " rows (room for ", A.digests.size(), ")");
  DigestRow* h = A.host_digest_rows.get();
  for (int64_t r = 0; r < sh.R; ++r) h[r] = r < M ? rows[r] : DigestRow{};
}

// The step's ints of R rows into pinned host_step (copied up by queue_decode): row r < M is sequence
// seqs[r] at its length, the rest the scratch sequence at position 0; tokens holds the R padded ids.
// A digest step's rows too. After the stream's sync: the last step's copies out of them are done.
template <typename E>
void fill_step(DecoderState<E>& st, const int64_t* seqs, const std::vector<int32_t>& tokens, int64_t M,
               const StepShape& sh, const DigestRow* rows) {
  DecoderActs<E>& A = st.acts;
  JTOK_CUDA_CHECK(cudaStreamSynchronize(st.s()));  // the last copy out of host_step is done
  int32_t* h = A.host_step.get();
  const int64_t n = A.max_rows;
  for (int64_t r = 0; r < sh.R; ++r) {
    h[r] = tokens[static_cast<size_t>(r)];
    h[n + r] = static_cast<int32_t>(r < M ? seqs[r] : st.kv.scratch_row());
    h[2 * n + r] = static_cast<int32_t>(r < M ? st.kv.pages->length(seqs[r]) : 0);
  }
  if (sh.digest) fill_digest_rows(st, rows, M, sh);
}

// The pinned step ints (and a digest step's rows) up into acts.step (and acts.digest_rows): the
// first stream work of a step, so a graph holds them as memcpy nodes from the fixed pinned buffers
// and a replay is one launch, no copy call of the host's before it.
template <typename E>
void queue_step_upload(DecoderState<E>& st, const StepShape& sh) {
  DecoderActs<E>& A = st.acts;
  JTOK_CUDA_CHECK(cudaMemcpyAsync(A.step.get(), A.host_step.get(),
                                  static_cast<size_t>(3 * A.max_rows) * sizeof(int32_t), cudaMemcpyHostToDevice,
                                  st.s()));
  if (sh.digest)
    JTOK_CUDA_CHECK(cudaMemcpyAsync(A.digest_rows.get(), A.host_digest_rows.get(),
                                    static_cast<size_t>(sh.R) * sizeof(DigestRow), cudaMemcpyHostToDevice, st.s()));
}

// The step's stream work: its ints up, the forward of its R rows, the head of all R and, for
// decode_digest, the R rows' digests (what a graph captures). Every product of it (q/k/v and their biases, o,
// gate/up/down, JTok-M's router, the MoE block's router and experts, the LM head: linear_forward on
// st.mm, R rows or fewer) is row_invariant_linear, so a sequence's logits do not depend on the others
// in its step (prefill stays on cuBLASLt: one sequence a call already).
template <typename E>
void queue_decode(DecoderState<E>& st, const int32_t* tokens, const StepShape& sh) {
  const RowInvariantProducts row_invariant(st.mm, sh.R, st.settings.tensor_cores);
  queue_step_upload(st, sh);
  forward_rows(st, tokens, sh);
  if (sh.timed) st.prof->mark(StepMark::head_begin, 0, st.s());
  head_forward(st, 0, sh.R);
  if (sh.timed) st.prof->mark(StepMark::head_end, 0, st.s());
  DecoderActs<E>& A = st.acts;
  if (sh.digest)
    logit_digest(A.digests.get(), A.logits.get(), sh.R, st.cfg.vocab_size, st.cfg.padded_vocab(), A.digest_rows.get(),
                 st.s());
  if (sh.timed) st.prof->mark(StepMark::digest_end, 0, st.s());
}

// The step's results to the host, queued: M rows' logits, or their digests.
template <typename E>
void queue_results_copy(DecoderState<E>& st, int64_t M, const StepShape& sh) {
  if (!sh.digest) return queue_logits_copy(st, M);
  JTOK_CUDA_CHECK(cudaMemcpyAsync(st.acts.host_digests.get(), st.acts.digests.get(),
                                  static_cast<size_t>(M) * sizeof(LogitDigest), cudaMemcpyDeviceToHost, st.s()));
}

// The kernel nodes of a captured graph (bench-decode's graph_kernels).
int64_t kernel_nodes(cudaGraph_t graph) {
  size_t n = 0;
  JTOK_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  JTOK_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  int64_t kernels = 0;
  for (size_t i = 0; i < n; ++i) {
    cudaGraphNodeType type;
    JTOK_CUDA_CHECK(cudaGraphNodeGetType(nodes[i], &type));
    kernels += type == cudaGraphNodeTypeKernel;
  }
  return kernels;
}

// queue_decode of shape sh captured (nothing runs) and instantiated, with its kernel count.
// ThreadLocal: a call on this thread that a capture forbids fails instead of syncing; other threads
// are not affected.
template <typename E>
DecodeGraphs::Captured capture_decode(DecoderState<E>& st, const int32_t* tokens, const StepShape& sh) {
  cudaGraph_t graph = nullptr;
  JTOK_CUDA_CHECK(cudaStreamBeginCapture(st.s(), cudaStreamCaptureModeThreadLocal));
  try {
    queue_decode(st, tokens, sh);
  } catch (...) {
    cudaStreamEndCapture(st.s(), &graph);  // out of capture mode, the side stream with it
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  JTOK_CUDA_CHECK(cudaStreamEndCapture(st.s(), &graph));
  int64_t kernels = 0;
  try {
    kernels = kernel_nodes(graph);
  } catch (...) {
    cudaGraphDestroy(graph);
    throw;
  }
  cudaGraphExec_t exec = nullptr;
  int64_t pdl_edges = 0;
  if (st.settings.pdl && st.pdl_off.empty()) {
    try {
      pdl_edges = make_programmatic_edges(graph);
    } catch (const Error& e) {  // an edge may be gone: this graph is dropped, the shape captured again without
      cudaGraphDestroy(graph);
      cudaGetLastError();
      st.pdl_off = e.what();
      std::fprintf(stderr, "cuda decoder: programmatic dependent launch off: %s\n", st.pdl_off.c_str());
      return capture_decode(st, tokens, sh);
    }
  }
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  JTOK_CUDA_CHECK(made);
  const cudaError_t uploaded = cudaGraphUpload(exec, st.s());
  if (uploaded != cudaSuccess) cudaGraphExecDestroy(exec);
  JTOK_CUDA_CHECK(uploaded);
  return {exec, kernels, pdl_edges};
}

// After an eager step of a new shape: its graph, or graphs off for this decoder if capture fails.
template <typename E>
void capture_after_eager(DecoderState<E>& st, const int32_t* tokens, const StepShape& sh) {
  try {
    st.graphs->add({sh.R, sh.max_len, sh.digest}, capture_decode(st, tokens, sh));
  } catch (const Error& e) {
    cudaGetLastError();  // a capture's error is not sticky: clear it for the next check
    st.graphs.reset();
    st.graphs_off = std::string("the capture of a decode step failed: ") + e.what();
    std::fprintf(stderr, "cuda decoder: CUDA graphs off: %s\n", st.graphs_off.c_str());
  }
}

// The profiled step's breakdown, after its sync.
template <typename E>
StepBreakdown read_profile(const DecoderState<E>& st, const StepShape& sh, Clock::time_point t0) {
  StepBreakdown b = st.prof->read();
  b.rows = sh.R;
  b.max_len = sh.max_len;
  if (st.rows) {
    const auto t = st.rows->last_times();
    b.rows_dedup_ms = t.dedup_ms;
    b.rows_gather_ms = t.gather_ms;
  }
  b.host_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  return b;
}

}  // namespace

template <typename E>
void decode_step(DecoderState<E>& st, const int64_t* seqs, const int32_t* tokens, int64_t M, int64_t max_len,
                 const DigestRow* rows) {
  const auto t0 = Clock::now();
  StepShape sh;
  sh.R = batch_bucket(M, st.settings.max_batch);
  sh.max_len = length_bucket(max_len, st.rope_T, kPagedAttentionChunk);
  sh.count_rows = true;
  sh.timed = st.prof != nullptr;
  sh.digest = rows != nullptr;
  std::vector<int32_t> padded(tokens, tokens + M);
  padded.resize(static_cast<size_t>(sh.R), tokens[0]);  // a dummy row's id: one the step reads anyway
  check_ids(padded.data(), sh.R, st.cfg.vocab_size, "token");
  if (sh.timed) st.prof->begin_step();
  fill_step(st, seqs, padded, M, sh, rows);
  if (sh.timed) st.prof->mark(StepMark::step_begin, 0, st.s());
  DecodeGraphs::Captured captured;
  if (st.graphs) captured = st.graphs->find({sh.R, sh.max_len, sh.digest});
  const cudaGraphExec_t graph = captured.exec;
  st.last_graph_kernels = captured.kernels;
  st.last_graph_pdl_edges = captured.pdl_edges;
  if (graph) JTOK_CUDA_CHECK(cudaGraphLaunch(graph, st.s()));
  else queue_decode(st, padded.data(), sh);
  queue_results_copy(st, M, sh);
  if (sh.timed) st.prof->mark(StepMark::copy_end, 0, st.s());
  JTOK_CUDA_CHECK(cudaStreamSynchronize(st.s()));
  if (st.rows) st.rows->check_error();  // staged: a gather's error fails the step here
  if (!graph && st.graphs) capture_after_eager(st, padded.data(), sh);
  if (sh.timed) st.last_step = read_profile(st, sh, t0);
}

template void decode_step<float>(DecoderState<float>&, const int64_t*, const int32_t*, int64_t, int64_t,
                                 const DigestRow*);
template void decode_step<__nv_bfloat16>(DecoderState<__nv_bfloat16>&, const int64_t*, const int32_t*, int64_t,
                                         int64_t, const DigestRow*);

}  // namespace jtok::cuda
