// Sequences decoded with a KV cache each, on one device, behind one interface: the CPU engine
// (infer/generate.h's prefill / prefill_chunk / decode_batch over a KVCache a sequence: its bits) or
// the GPU (cuda/decoder.h). `jtok generate` and the serving engine run on it; a sequence is a handle.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/decoder.h"
#include "infer/generate.h"
#include "infer/token_pick.h"
#include "model/transformer.h"

namespace jtok {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual std::string describe() const = 0;  // "cpu" or the GPU decoder's line
  virtual int64_t vocab_size() const = 0;     // the logits' columns (the real vocabulary)
  // A new, empty sequence with room for `capacity` positions: its handle (>= 0).
  virtual int64_t open(int64_t capacity) = 0;
  virtual void close(int64_t seq) = 0;
  // A new sequence holding a copy of seq's positions (a request's other choices), room for capacity.
  virtual int64_t fork(int64_t seq, int64_t capacity) = 0;
  virtual int64_t length(int64_t seq) const = 0;
  virtual int64_t capacity(int64_t seq) const = 0;
  // Appends tokens[0..n) to seq; returns the last one's logits (vocab_size). The CPU: an empty
  // sequence takes prefill (one-shot), a started one prefill_chunk, so pieces give the bits they do
  // in infer/generate.h. each (optional): every position's logits.
  virtual std::vector<float> prefill(int64_t seq, const int32_t* tokens, int64_t n,
                                     const PositionLogits& each = {}) = 0;
  // One decode step of M distinct sequences (decode_batch): tokens[i] appended to seqs[i], logits
  // (M, vocab_size). Returns the token-table rows read.
  virtual int64_t decode(const int64_t* seqs, const int32_t* tokens, int64_t M, float* logits) = 0;
  // The same step with each row's next token picked (infer/token_pick.h): req[i] is row i's
  // sampling, its sequence's RNG and top_logprobs; out (M) the tokens and their log-probs, as
  // sample_token then token_logprob on the row would give them. This one: decode's logits, then
  // exactly that (pick_from_row), a row at a time. The GPU's: each row's digest made on the device
  // (only the digests come back), picked from on the host, and a row's logits copied back only where
  // its digest does not settle the pick (pick_rows). Returns the token-table rows read.
  virtual int64_t decode_pick(const int64_t* seqs, const int32_t* tokens, int64_t M, const PickRequest* req,
                              TokenPick* out);
  // Host seconds decode_pick has spent picking (from rows or digests, the rows copied back
  // included), summed over the calls: bench-decode's sample share.
  double pick_seconds() const { return pick_s_; }
  // Prefix blocks (the serving engine's prefix reuse), behind handles the caller never looks into:
  // keep_block keeps the keys and values of seq's positions [first, first + n) (written: first + n <=
  // length; first and n multiples of block_granule()) apart from any sequence, until drop_block;
  // open_from_blocks is a new sequence whose positions [0, m) are blocks[0..k)'s in order (m: their
  // positions, its length) with room for capacity, appended to by prefill and decode as after any
  // prefill. The CPU copies (identical bits); the GPU shares reference-counted KV pages.
  virtual int64_t keep_block(int64_t seq, int64_t first, int64_t n) = 0;
  virtual void drop_block(int64_t block) = 0;
  virtual int64_t open_from_blocks(const std::vector<int64_t>& blocks, int64_t capacity) = 0;
  virtual int64_t block_granule() const { return 1; }  // the GPU: positions a KV page holds
  // Whether a kept block's memory is shared with the sequence it came from, with the sequences opened
  // from it and with their forks (the GPU's pages: it costs its positions once, and they cost them
  // not), rather than a copy beside them (the CPU).
  virtual bool blocks_shared() const { return false; }
  // The CPU engine's cache of seq (tests compare its bits); null on a device.
  virtual KVCache* host_cache(int64_t) { return nullptr; }
  // The last decode step's phases (cuda/decoder.h; a GPU decoder profiling, JTOK_PROFILE=1); the
  // CPU's: not valid.
  virtual cuda::StepBreakdown last_step() const { return {}; }
  // The kernels of the CUDA graph the GPU's last decode step replayed (0: eager, or the CPU).
  virtual int64_t last_graph_kernels() const { return 0; }
  virtual int64_t last_graph_pdl_edges() const { return 0; }  // its programmatic edges (cuda: settings.pdl)

 protected:
  double pick_s_ = 0;
  std::vector<float> pick_logits_;  // decode_pick's (M, vocab_size) logits, kept between steps
};

// The CPU engine's decoder over m (kv_bf16: KVCache::bf16).
std::unique_ptr<Decoder> make_cpu_decoder(const Model& m, bool kv_bf16);
// device "cpu" (make_cpu_decoder, s.kv_bf16) or "cuda" (cuda::make_device_decoder); anything else
// fails naming it.
std::unique_ptr<Decoder> make_decoder(const Model& m, const std::string& device, const cuda::DecoderSettings& s);

}  // namespace jtok
