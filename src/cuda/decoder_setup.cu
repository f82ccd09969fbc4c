// The GPU decoder's set-up (src/cuda/decoder_state.h): what it refuses, the weights' device copy,
// the paged KV cache, the token-table rows' path, one step's buffers.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <type_traits>

#include "core/profile.h"
#include "cuda/decode_buckets.h"
#include "cuda/decoder_state.h"
#include "cuda/model_kernels.h"
#include "model/jtok.h"

namespace jtok::cuda {

namespace {

int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

void check_decoder_settings(const Model& host, const DecoderSettings& s) {
  check_device_supported(host, "cuda decoder");
  const ModelConfig& c = host.cfg;
  if (s.max_batch < 1 || s.max_prefill < 1 || s.page_tokens < 1 || s.kv_tokens < 0 || s.max_seqs < 0)
    fail("cuda decoder: max_batch ", s.max_batch, ", max_prefill ", s.max_prefill, ", page_tokens ", s.page_tokens,
         ", kv_tokens ", s.kv_tokens, ", max_seqs ", s.max_seqs, ": each must be >= 1 (kv_tokens, max_seqs: >= 0)");
  if (c.jtokm && c.jtokm_n_e > kJTokMMaxTables)
    fail("cuda decoder: JTok-M with ", c.jtokm_n_e, " tables a layer (the GPU kernels take at most ", kJTokMMaxTables,
         ")");
  const std::string& p = s.table_rows;
  if (p != "auto" && p != "hbm" && p != "in_place" && p != "staged")
    fail("cuda decoder: table rows from '", p, "' (auto, hbm, in_place or staged)");
  if (host.rope.T < 1) fail("cuda decoder: the model has no RoPE table");
}

namespace {

// In place: a whole f32 / bf16 table whose rows this process holds in memory (register_table_rows').
bool rows_in_place(const TokenTable& t) {
  if (t.in_store() || (t.dtype() != Dtype::f32 && t.dtype() != Dtype::bf16)) return false;
  return t.rows > 0 && t.raw_row(0) != nullptr;
}

RowPath choose_path(const Model& host, const std::string& asked) {
  if (asked == "hbm") return RowPath::hbm;
  if (asked == "in_place") return RowPath::in_place;
  if (asked == "staged") return RowPath::staged;
  for (const TokenTable& t : host.tables)
    if (!rows_in_place(t)) return RowPath::staged;
  return RowPath::in_place;
}

// host.params in E (bf16: rounded to nearest even on the device, a bounded block at a time), its
// views, the RoPE table.
template <typename E>
void upload_weights(DecoderState<E>& st, const Model& host) {
  const int64_t n = static_cast<int64_t>(host.params.size());
  st.params.resize(n);
  if constexpr (std::is_same_v<E, float>) {
    copy_to_device(st.params.get(), host.params.data(), n);
  } else {
    constexpr int64_t kBlock = int64_t{1} << 24;
    DeviceArray<float> block(std::min(n, kBlock));
    for (int64_t at = 0; at < n; at += kBlock) {
      const int64_t len = std::min(kBlock, n - at);
      copy_to_device(block.get(), host.params.data() + at, len);
      convert_from_f32(st.params.get() + at, block.get(), len, st.s());
      JTOK_CUDA_CHECK(cudaStreamSynchronize(st.s()));  // before the next block overwrites `block`
    }
  }
  st.w = device_view(st.params.get(), host);
  st.rope_T = host.rope.T;
  const int64_t rope_n = host.rope.T * host.rope.half;
  st.rope_cos.resize(rope_n);
  st.rope_sin.resize(rope_n);
  copy_to_device(st.rope_cos.get(), host.rope.cos.data(), rope_n);
  copy_to_device(st.rope_sin.get(), host.rope.sin.data(), rope_n);
  for (const LayerView& W : host.w.layers)
    st.jtok_gated.push_back(W.jtok_scale && !jtok_gate_is_one(W.jtok_scale, st.cfg.hidden_size) ? 1 : 0);
}

// The page pool (kv_tokens positions, or max_batch sequences of the whole context), its bookkeeping
// and the page tables' device copy (zeros until a sequence opens).
template <typename E>
void setup_kv(DecoderState<E>& st) {
  const DecoderSettings& s = st.settings;
  DecoderKv& kv = st.kv;
  kv.bf16 = s.kv_bf16;
  kv.page_tokens = s.page_tokens;
  kv.max_pages = ceil_div64(st.rope_T, s.page_tokens);
  kv.n_pages = s.kv_tokens > 0 ? ceil_div64(s.kv_tokens, s.page_tokens) : s.max_batch * kv.max_pages;
  kv.max_seqs = s.max_seqs > 0 ? s.max_seqs : 4 * s.max_batch;
  kv.layers = st.cfg.num_hidden_layers;
  kv.KV = st.cfg.num_key_value_heads;
  kv.hd = st.cfg.hd();
  if (kv.n_pages + 1 >= (int64_t{1} << 31) || (kv.max_seqs + 1) * kv.max_pages >= (int64_t{1} << 31))
    fail("cuda decoder: ", kv.n_pages, " KV pages for ", kv.max_seqs, " sequences of ", kv.max_pages,
         " pages: past the int32 page tables");
  kv.pages = std::make_unique<KvPages>(kv.n_pages, kv.page_tokens, kv.max_seqs);
  // Every sequence's row 0 until it opens; the scratch row lists the scratch page first.
  kv.tables_host.assign(static_cast<size_t>((kv.max_seqs + 1) * kv.max_pages), 0);
  kv.tables_host[static_cast<size_t>(kv.scratch_row() * kv.max_pages)] = kv.scratch_page();
  kv.tables.resize((kv.max_seqs + 1) * kv.max_pages);
  copy_to_device(kv.tables.get(), kv.tables_host.data(), kv.tables.size());
  kv.pool.resize(static_cast<int64_t>(2 * kv.layers) * static_cast<int64_t>(kv.pool_bytes()));
  kv.pool.zero(st.s());
}

// The token-table rows of a step (cuda/step_rows.h), and where each layer finds its tables there.
template <typename E>
void setup_rows(DecoderState<E>& st, const Model& host, int64_t max_rows) {
  const int64_t L = st.cfg.num_hidden_layers;
  st.rows_layer.assign(static_cast<size_t>(L), -1);
  st.jtokm_first.assign(static_cast<size_t>(L), 0);
  st.sel_slot.assign(static_cast<size_t>(L), -1);
  st.path = choose_path(host, st.settings.table_rows);
  std::vector<LayerTables> layers = layer_tables(host);
  for (size_t k = 0; k < layers.size(); ++k) {
    const size_t l = static_cast<size_t>(layers[k].layer);
    st.rows_layer[l] = static_cast<int64_t>(k);
    st.jtokm_first[l] = l < host.jtok_table.size() && host.jtok_table[l] >= 0 ? 1 : 0;
  }
  for (size_t l = 0; l < host.w.layers.size(); ++l)
    if (host.w.layers[l].jtokm_router) st.sel_slot[l] = st.jtokm_layers++;
  if (!layers.empty()) st.rows = std::make_unique<StepRows<E>>(std::move(layers), max_rows, st.path);
}

// The buffers of R rows through a layer (sizes 0 where no layer needs them).
template <typename E>
void size_layer_buffers(DecoderState<E>& st, const Model& host, int64_t R) {
  const ModelConfig& c = st.cfg;
  DecoderActs<E>& A = st.acts;
  const int64_t d = c.hidden_size, F = c.intermediate_size, qd = c.q_dim(), kvd = c.kv_dim();
  const int64_t H = c.num_attention_heads, KV = c.num_key_value_heads, hd = c.hd();
  bool dense = false, moe = false, gated = false;
  for (size_t l = 0; l < host.w.layers.size(); ++l) {
    dense |= host.w.layers[l].wg != nullptr;
    moe |= host.w.layers[l].moe.router != nullptr;
    gated |= st.jtok_gated[l] != 0;
  }
  A.h.resize(R * d), A.a.resize(R * d), A.x.resize(R * d), A.q.resize(R * qd), A.att.resize(R * qd);
  A.k.resize(R * kvd), A.v.resize(R * kvd), A.rstd.resize(R);
  A.q_in.resize(c.qk_norm ? R * qd : 0), A.k_in.resize(c.qk_norm ? R * kvd : 0);
  A.rstd_q.resize(c.qk_norm ? R * H : 0), A.rstd_k.resize(c.qk_norm ? R * KV : 0);
  A.gate.resize(dense ? R * F : 0), A.up.resize(dense ? R * F : 0), A.act.resize(dense ? R * F : 0);
  A.mlp_out.resize(gated ? R * d : 0), A.nrows.resize(gated ? R * d : 0), A.inv_norm.resize(gated ? R : 0);
  A.lse.resize(H * st.settings.max_prefill);
  A.attn_scratch.resize(paged_attention_scratch(R, H, hd, st.rope_T));
  const int64_t ne = st.jtokm_layers > 0 ? c.jtokm_n_e : 0, K = st.jtokm_layers > 0 ? c.jtokm_top_k : 0;
  A.m_logits.resize(R * ne), A.m_sig.resize(R * ne), A.m_w.resize(R * K), A.m_sel.resize(R * K);
  A.m_e.resize(ne ? R * d : 0), A.m_inv_norm.resize(ne ? R : 0);
  A.m_load.resize(ne), A.m_prob_sum.resize(ne), A.m_aux.resize(ne ? 1 : 0);
  if (moe) {  // the forward's arrays only: the block's scratch past logits and group is the backward's
    const MoeDims m = moe_dims(c);
    size_moe_acts(A.moe, m, R);
    A.moe_scratch.logits.resize(R * m.E);
    A.moe_scratch.group.resize(
        static_cast<int64_t>(moe_group_scratch_bytes(MoeRouteDims{R, m.E, m.K, m.norm_topk, m.aux_coef})));
  }
}

// The step's ints, the identity index, the head's rows and the host's copies.
template <typename E>
void size_step_buffers(DecoderState<E>& st, int64_t R) {
  const ModelConfig& c = st.cfg;
  DecoderActs<E>& A = st.acts;
  A.max_rows = R;
  A.head_rows = std::min(R, std::max<int64_t>(st.settings.max_batch, 32));  // the CPU's head blocks: 32 rows
  A.step.resize(3 * R);
  A.host_step = PinnedArray<int32_t>(3 * R);
  std::vector<int32_t> iota(static_cast<size_t>(R));
  std::iota(iota.begin(), iota.end(), 0);
  A.identity.resize(R);
  copy_to_device(A.identity.get(), iota.data(), R);
  A.lnf.resize(A.head_rows * c.hidden_size);
  A.logits.resize(A.head_rows * c.padded_vocab());
  A.host_logits = PinnedArray<float>(A.head_rows * c.vocab_size);
  A.host_sel = PinnedArray<int32_t>(st.jtokm_layers * st.settings.max_batch * c.jtokm_top_k);
}

// Why decode steps cannot be CUDA graphs here ("" when they can): each reason is host work inside
// a step that a graph cannot hold (cuda/decoder_step.cu lists what a step does on the host).
template <typename E>
std::string graphs_off_reason(const DecoderState<E>& st, const Model& host) {
  if (!st.settings.cuda_graphs) return "turned off (--cuda-graphs off)";
  if (st.prof) return "profiling (JTOK_PROFILE=1) times each step's phases with events, eagerly";
  for (const LayerView& W : host.w.layers)
    if (W.moe.router)
      return "MoE layers copy their expert offsets to the host in every layer (a sync that sizes each expert's "
             "products)";
  if (st.rows && st.path == RowPath::staged) return "staged table rows are gathered by the host in every step";
  return "";
}

// The profiler (settings.profile or JTOK_PROFILE=1), then graphs where nothing above rules them
// out; a reason that overrides the settings' wish is printed once, here.
template <typename E>
void setup_step_modes(DecoderState<E>& st, const Model& host) {
  if (st.settings.profile || profiling_enabled()) {
    st.prof = std::make_unique<DecodeProfiler>(st.cfg.num_hidden_layers);
    if (st.rows) st.rows->enable_timing();
  }
  st.graphs_off = graphs_off_reason(st, host);
  if (st.graphs_off.empty()) st.graphs = std::make_unique<DecodeGraphs>();
  else if (st.settings.cuda_graphs) std::fprintf(stderr, "cuda decoder: CUDA graphs off: %s\n", st.graphs_off.c_str());
}

}  // namespace

template <typename E>
void setup_decoder(DecoderState<E>& st, const Model& host, const DecoderSettings& s) {
  check_decoder_settings(host, s);
  st.info = require_cuda_device();
  st.settings = s;
  st.cfg = host.cfg;
  const int64_t max_rows = std::max(s.max_batch, s.max_prefill);
  upload_weights(st, host);
  setup_kv(st);
  setup_rows(st, host, max_rows);
  size_layer_buffers(st, host, max_rows);
  size_step_buffers(st, max_rows);
  setup_step_modes(st, host);
  JTOK_CUDA_CHECK(cudaStreamSynchronize(st.s()));
}

template <typename E>
std::string describe_decoder(const DecoderState<E>& st) {
  const DecoderKv& kv = st.kv;
  const double mib = static_cast<double>(2 * kv.layers) * static_cast<double>(kv.pool_bytes()) / (1024.0 * 1024.0);
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "cuda decoder on %s: %s weights, %s KV in %lld pages of %lld positions (%.1f MiB), batch %lld, "
                "prefill %lld, table rows %s",
                st.info.name.c_str(), std::is_same_v<E, float> ? "fp32" : "bf16", kv.bf16 ? "bf16" : "fp32",
                static_cast<long long>(kv.n_pages), static_cast<long long>(kv.page_tokens), mib,
                static_cast<long long>(st.settings.max_batch), static_cast<long long>(st.settings.max_prefill),
                st.rows ? row_path_name(st.path) : "none (no token tables)");
  std::string out = buf;
  if (st.graphs) {
    out += ", CUDA graphs on (batch buckets";
    for (int64_t b : batch_buckets(st.settings.max_batch)) {
      out += ' ';
      out += std::to_string(b);
    }
    out += "; lengths in powers of two of ";
    out += std::to_string(kPagedAttentionChunk);
    out += "-position chunks; ";
    out += std::to_string(st.graphs->size());
    out += " captured)";
  } else {
    out += ", CUDA graphs off: " + st.graphs_off;
  }
  if (st.prof) out += ", profiling steps";
  return out;
}

template void setup_decoder<float>(DecoderState<float>&, const Model&, const DecoderSettings&);
template void setup_decoder<__nv_bfloat16>(DecoderState<__nv_bfloat16>&, const Model&, const DecoderSettings&);
template std::string describe_decoder<float>(const DecoderState<float>&);
template std::string describe_decoder<__nv_bfloat16>(const DecoderState<__nv_bfloat16>&);

}  // namespace jtok::cuda
