// `jtok bench-decode`'s work: greedy decoding of M sequences together through a Decoder
// (infer/decoder.h), on the CPU or a GPU, timed; bench/gpu_decode_peer.sh compares it with HF
// transformers (bench/hf_decode_peer.py) on the same prompts.
//
// Prompts: real token shards (`data`, the loader's sequential windows from the start: sequence i
// is the inputs of row i of the first (M, P) batch, as tests/reference/shards.py's
// SequentialBatches gives them to the peer); the long prompt is the first (1, L) batch of a fresh
// loader. A run of batch M: M sequences opened (room for P + N positions), each prefilled with its
// prompt (prefill_s: all M prefills), the first token the argmax of the prefill's last logits, then
// N decode steps of all M together (decode_s), each feeding the token the previous step chose
// (Decoder::decode_pick with greedy rows: argmax, ties to the lowest id; the CPU picks from the
// logits, a GPU from each row's digest made on the device, so only the digests come back; sample_s
// is the host's share of picking, Decoder::pick_seconds). prefill tok/s = M P / prefill_s, decode tok/s = M N / decode_s, TPOT = decode_s / N.
// A long-prompt run: one sequence of L tokens prefilled in pieces of at most max_prefill.
// Each mode (table_rows) gets its own decoder, made and dropped in turn; within it `warmup` untimed
// runs of every batch, then `repeat` timed runs of each, whose medians are reported. A GPU decoder
// that profiles (JTOK_PROFILE=1: eager steps, cudaEvents between phases) adds "step_breakdown" to
// the line, the mean over the timed steps of cuda::StepBreakdown's fields in ms (embed, attention,
// rows_wait, mlp, head, digest, logits_copy (the digests' copy), step; the rows' side stream: rows_dedup, rows_gather; host:
// rows_issue, host), and one more human line: rows_wait against rows_dedup + rows_gather is the
// row fetch's overlap with the layers. kernel_trace (JTOK_KERNEL_TRACE=FILE, a GPU decoder): after a
// line's timed runs, one more run whose decode steps (or long prefill) the device records kernel by
// kernel (cuda/kernel_trace_file.h), so the timings carry none of the tracing's cost, written to
// FILE's stem + "-<table_rows>-b<M>.csv" (decode, divided by its N steps) or "-<table_rows>-prefill.csv"
// (one prefill of L); the line's "kernel_trace" says the file and its records, or why none ran.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda/decoder.h"
#include "model/transformer.h"

namespace jtok {

struct BenchDecodeOptions {
  std::string device = "cpu";           // "cpu" | "cuda" (make_decoder)
  cuda::DecoderSettings settings;       // max_batch / max_prefill / kv_tokens are set from the runs
  std::vector<std::string> table_rows;  // cuda: a decoder per mode (hbm, in_place, staged, auto)
  std::vector<int64_t> batches = {1};   // M of each run
  int64_t prompt_len = 512, new_tokens = 128, long_prompt = 0;  // P, N, L (0: no long-prompt run)
  int64_t max_prefill = 4096;           // the longest prefill call (a long prompt goes in pieces)
  int64_t warmup = 1, repeat = 3;
  std::string data = "data/train";
  std::string kernel_trace;             // FILE, or "" (above)
  nlohmann::json model;                 // what the caller says of the model: copied into every line
};

// Prompt ids of the runs: `sequences` rows of `len` tokens (row-major), checked against vocab.
std::vector<int32_t> shard_prompts(const std::string& data, int64_t sequences, int64_t len, int64_t vocab);

// Greedy argmax of each of M rows of V logits (ties to the lowest id), into out (M).
void greedy_tokens(const float* logits, int64_t M, int64_t V, int32_t* out);

// The bytes of backbone weights one decode step of at most 16 rows reads, each matrix once (weight
// streaming): every layer's q, k, v and o, a dense layer's gate, up and down, an MoE layer's router
// and shared experts (its routed experts, those the step's rows choose, are not counted), JTok-M's
// routers and the LM head (Vp x d). A weight's bytes as the decoder holds it: the CPU f32 4, an
// export's bf16 2 or int8 1 + a 4-byte scale a row (routers f32); the GPU its precision's 2 or 4,
// and with int8_decode on an int8 export 1 + 4 a row for the matrices (cuda::decoder_q8_sizes's,
// the routed experts left out). Norms, biases and token-table rows are not counted. Every line says it
// ("step_weight_bytes"); a decode line also "weight_gbs", the bytes over its TPOT.
int64_t step_weight_bytes(const Model& m, const std::string& device, const cuda::DecoderSettings& s);

// Runs the benches; one JSON object per (mode, batch) run ("run": "decode") and per mode for the
// long prompt ("run": "prefill"), each also printed as one human line on stderr and given to
// on_line (if set) as it finishes, so a later failure loses no line.
std::vector<nlohmann::json> bench_decode(const Model& m, const BenchDecodeOptions& opt,
                                         const std::function<void(const nlohmann::json&)>& on_line = {});

}  // namespace jtok
