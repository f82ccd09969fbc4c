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
#include "model/lowp_weights.h"

namespace jtok::cuda {

void check_decoder_settings(const Model& host, const DecoderSettings& s) {
  check_device_supported(host, "cuda decoder", true);
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
  if (s.int8_only && (!s.int8_decode || host.lowp.dtype != Dtype::int8))
    fail("cuda decoder: --int8-decode only holds an int8 export's matrices in int8 alone; this model's are ",
         host.lowp.any() ? dtype_name(host.lowp.dtype) : std::string("f32"),
         " (jtok export --weight-dtype int8 makes an int8 export)");
  if (s.tensor_cores && !s.bf16)
    fail("cuda decoder: tensor-core products are bf16's (the fp32 decoder multiplies on the CUDA cores)");
  if (host.rope.T < 1 || host.rope.T != c.max_position_embeddings)
    fail("cuda decoder: the model's RoPE table has ", host.rope.T, " positions, max_position_embeddings ",
         c.max_position_embeddings, " (they must agree: the memory plan sizes the context by the latter)");
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

// MoE's grouping scratch for R rows (cub's sort included).
int64_t moe_group_bytes(const ModelConfig& c, int64_t R) {
  const MoeDims m = moe_dims(c);
  return static_cast<int64_t>(moe_group_scratch_bytes(MoeRouteDims{R, m.E, m.K, m.norm_topk, m.aux_coef}));
}

// The host model's layers (decoder_layer_kinds from its weights: a JTok layer is gated unless its
// scaler is all ones, the CPU's choice) and st.jtok_gated, each layer's.
template <typename E>
DecoderLayerKinds layer_kinds(DecoderState<E>& st, const Model& host) {
  DecoderLayerKinds k = decoder_layer_kinds(st.cfg);
  k.gated = false;
  k.int8 = host.lowp.dtype == Dtype::int8 && st.settings.int8_decode;
  k.int8_only = k.int8 && st.settings.int8_only;
  for (const LayerView& W : host.w.layers) {
    st.jtok_gated.push_back(W.jtok_scale && !jtok_gate_is_one(W.jtok_scale, st.cfg.hidden_size) ? 1 : 0);
    k.gated |= st.jtok_gated.back() != 0;
  }
  return k;
}

// The set-up's plan, cub's scratch included, and its refusal when the GPU's free memory cannot hold it.
template <typename E>
void plan_memory(DecoderState<E>& st, const DecoderLayerKinds& k) {
  const DecoderSettings& s = st.settings;
  DecoderCubBytes cub;
  const int64_t R = decoder_max_rows(s);
  if (k.table_slots > 0) cub.rows_dedup = static_cast<int64_t>(dedup_scratch_bytes(R, st.cfg.padded_vocab()));
  if (k.moe) cub.moe_group = moe_group_bytes(st.cfg, R);
  st.plan = decoder_memory_plan(st.cfg, s, k, st.path == RowPath::hbm, st.path == RowPath::staged, cub);
  size_t free_bytes = 0, total_bytes = 0;
  JTOK_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const std::string why = decoder_memory_refusal(st.plan, static_cast<int64_t>(free_bytes));
  if (!why.empty()) fail(why);
}

// host.params in E (bf16: rounded to nearest even on the device), a bounded block at a time, with an
// export's bf16 / int8 matrices dequantised into their slots on the host (model/lowp_weights.h: a
// bf16 matrix arrives exact; int8's q * scale is rounded to bf16 once), its views, the RoPE table.
// int8_only (st.q8 uploaded first): the stretches between the int8 matrices, back to back, the layers'
// matrices' views in the one layer's scratch (the embedding's and LM head's null).
template <typename E>
void upload_weights(DecoderState<E>& st, const Model& host) {
  const int64_t n = static_cast<int64_t>(host.params.size());
  const std::vector<LowpSlot> slots = lowp_slots(host);
  const bool only = st.settings.int8_only && st.q8.on();
  const std::vector<KeptRange> kept = kept_ranges(st.q8, only, n);
  st.weights_from = host.lowp.any() ? dtype_name(host.lowp.dtype) : "";
  st.params.resize(kept.empty() ? 0 : kept.back().at + (kept.back().end - kept.back().begin));
  constexpr int64_t kBlock = int64_t{1} << 24;
  // An fp32 checkpoint's blocks are host.params itself; an export's are staged with its matrices in.
  std::vector<float> staged(slots.empty() ? 0 : static_cast<size_t>(std::min(n, kBlock)));
  DeviceArray<float> block(std::is_same_v<E, float> ? 0 : std::min(n, kBlock));
  for (const KeptRange& r : kept)
    for (int64_t at = r.begin; at < r.end; at += kBlock) {
      const int64_t len = std::min(kBlock, r.end - at);
      const float* src = host.params.data() + at;
      if (!slots.empty()) {
        params_block_f32(host, slots, staged.data(), at, len);
        src = staged.data();
      }
      E* dst = st.params.get() + r.at + (at - r.begin);
      if constexpr (std::is_same_v<E, float>) {
        copy_to_device(dst, src, len);
      } else {
        copy_to_device(block.get(), src, len);
        convert_from_f32(dst, block.get(), len, st.s());
        JTOK_CUDA_CHECK(cudaStreamSynchronize(st.s()));  // before the next block overwrites `block`
      }
    }
  if (only) {
    st.q8_scratch.resize(decoder_q8_sizes(st.cfg).max_layer_values);
    st.w = int8_only_view(st, kept, host);
  } else {
    st.w = device_view(st.params.get(), host);
  }
  require_fused_layout(st.w, st.cfg, "cuda decoder");  // model/transformer.cpp's layout always is
  st.rope_T = host.rope.T;
  const int64_t rope_n = host.rope.T * host.rope.half;
  st.rope_cos.resize(rope_n);
  st.rope_sin.resize(rope_n);
  copy_to_device(st.rope_cos.get(), host.rope.cos.data(), rope_n);
  copy_to_device(st.rope_sin.get(), host.rope.sin.data(), rope_n);
}

// The page pool (kv_tokens positions, or max_batch sequences of the whole context), its bookkeeping
// and the page tables' device copy (zeros until a sequence opens).
template <typename E>
void setup_kv(DecoderState<E>& st) {
  const DecoderSettings& s = st.settings;
  const DecoderKvSizes z = decoder_kv_sizes(st.cfg, s, st.rope_T);
  DecoderKv& kv = st.kv;
  kv.bf16 = s.kv_bf16;
  kv.page_tokens = s.page_tokens;
  kv.max_pages = z.max_pages;
  kv.n_pages = z.n_pages;
  kv.max_seqs = z.max_seqs;
  kv.layers = z.layers;
  kv.KV = st.cfg.num_key_value_heads;
  kv.hd = st.cfg.hd();
  if (kv.n_pages + 1 >= (int64_t{1} << 31) || (kv.max_seqs + 1) * kv.max_pages >= (int64_t{1} << 31))
    fail("cuda decoder: ", kv.n_pages, " KV pages for ", kv.max_seqs, " sequences of ", kv.max_pages,
         " pages: past the int32 page tables");
  kv.pages = std::make_unique<KvPages>(kv.n_pages, kv.page_tokens, kv.max_seqs);
  // Every sequence's row 0 until it opens; the scratch row lists the scratch page first.
  kv.tables_host.assign(static_cast<size_t>(z.table_ints()), 0);
  kv.tables_host[static_cast<size_t>(kv.scratch_row() * kv.max_pages)] = kv.scratch_page();
  kv.tables.resize(z.table_ints());
  copy_to_device(kv.tables.get(), kv.tables_host.data(), kv.tables.size());
  JTOK_CHECK(static_cast<int64_t>(kv.pool_bytes()) == z.pool_bytes(), "cuda decoder: KV pool of ", kv.pool_bytes(),
             " bytes, planned ", z.pool_bytes());
  kv.pool.resize(2 * kv.layers * z.pool_bytes());
  kv.pool.zero(st.s());
}

// The token-table rows of a step (cuda/step_rows.h), and where each layer finds its tables there.
template <typename E>
void setup_rows(DecoderState<E>& st, const Model& host, int64_t max_rows) {
  const int64_t L = st.cfg.num_hidden_layers;
  st.rows_layer.assign(static_cast<size_t>(L), -1);
  st.jtokm_first.assign(static_cast<size_t>(L), 0);
  st.sel_slot.assign(static_cast<size_t>(L), -1);
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

// Every step buffer at decoder_act_sizes' counts (0 where no layer needs one): the layers', then
// the step's ints, the identity index, the head's rows and the host's copies.
template <typename E>
void size_step_buffers(DecoderState<E>& st, const DecoderLayerKinds& kinds) {
  const ModelConfig& c = st.cfg;
  const DecoderActSizes z = decoder_act_sizes(c, st.settings, kinds, st.rope_T);
  DecoderActs<E>& A = st.acts;
  A.h.resize(z.h), A.a.resize(z.a), A.x.resize(z.x), A.q.resize(z.q), A.att.resize(z.att);
  A.k.resize(z.k), A.v.resize(z.v), A.rstd.resize(z.rstd);
  A.qkv.resize(z.qkv), A.gate_up.resize(z.gate_up), A.act.resize(z.act);
  A.mlp_out.resize(z.mlp_out), A.nrows.resize(z.nrows), A.inv_norm.resize(z.inv_norm);
  A.lse.resize(z.lse), A.attn_scratch.resize(z.attn_scratch), A.attn_counters.resize(z.attn_counters);
  A.attn_counters.zero(st.s());  // paged_attention leaves them zero after every call
  A.m_logits.resize(z.m_logits), A.m_sig.resize(z.m_sig), A.m_w.resize(z.m_w), A.m_sel.resize(z.m_sel);
  A.m_inv_norm.resize(z.m_inv_norm);
  if (kinds.moe) {  // the forward's arrays only: the block's scratch past logits and group is the backward's
    const MoeDims m = moe_dims(c);
    size_moe_acts(A.moe, m, z.R);
    A.moe_scratch.logits.resize(z.moe_logits);
    A.moe_scratch.group.resize(moe_group_bytes(c, z.R));
  }
  A.max_rows = z.R;
  A.head_rows = z.head_rows;
  A.step.resize(z.step);
  A.host_step = PinnedArray<int32_t>(z.host_step);
  std::vector<int32_t> iota(static_cast<size_t>(z.identity));
  std::iota(iota.begin(), iota.end(), 0);
  A.identity.resize(z.identity);
  copy_to_device(A.identity.get(), iota.data(), z.identity);
  A.lnf.resize(z.lnf);
  A.logits.resize(z.logits);
  A.host_logits = PinnedArray<float>(z.host_logits);
  A.host_sel = PinnedArray<int32_t>(z.host_sel);
  A.digest_rows.resize(z.digests);
  A.digests.resize(z.digests);
  A.host_digest_rows = PinnedArray<DigestRow>(z.digests);
  A.host_digests = PinnedArray<LogitDigest>(z.digests);
}

// Why decode steps cannot be CUDA graphs here ("" when they can): each reason is host work inside
// a step that a graph cannot hold (cuda/decoder_step.cu lists what a step does on the host).
template <typename E>
std::string graphs_off_reason(const DecoderState<E>& st) {
  if (!st.settings.cuda_graphs) return "turned off (--cuda-graphs off)";
  if (st.prof) return "profiling (JTOK_PROFILE=1) times each step's phases with events, eagerly";
  if (st.rows && st.path == RowPath::staged) return "staged table rows are gathered by the host in every step";
  return "";
}

// The profiler (settings.profile or JTOK_PROFILE=1), then graphs where nothing above rules them
// out; a reason that overrides the settings' wish is printed once, here.
template <typename E>
void setup_step_modes(DecoderState<E>& st) {
  if (st.settings.profile || profiling_enabled()) {
    st.prof = std::make_unique<DecodeProfiler>(st.cfg.num_hidden_layers);
    if (st.rows) st.rows->enable_timing();
  }
  st.graphs_off = graphs_off_reason(st);
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
  st.path = choose_path(host, s.table_rows);
  const DecoderLayerKinds kinds = layer_kinds(st, host);
  plan_memory(st, kinds);
  if (kinds.int8) upload_q8(st.q8, host, kinds.int8_only);
  upload_weights(st, host);
  setup_kv(st);
  setup_rows(st, host, decoder_max_rows(s));
  JTOK_CHECK(st.jtokm_layers == kinds.jtokm_layers, "cuda decoder: ", st.jtokm_layers, " JTok-M layers, planned ",
             kinds.jtokm_layers);
  size_step_buffers(st, kinds);
  setup_step_modes(st);
  JTOK_CUDA_CHECK(cudaStreamSynchronize(st.s()));
}

template <typename E>
std::string describe_decoder(const DecoderState<E>& st) {
  const DecoderKv& kv = st.kv;
  const double mib = static_cast<double>(2 * kv.layers) * static_cast<double>(kv.pool_bytes()) / (1024.0 * 1024.0);
  std::string weights = std::is_same_v<E, float> ? "fp32 weights" : "bf16 weights";
  if (st.q8.on() && st.settings.int8_only)
    weights +=
        " (the checkpoint's int8 matrices held in int8 alone: the layers' read as stored by decode steps and "
        "dequantised a layer at a time by prefills, the embedding's rows dequantised as gathered)";
  else if (!st.weights_from.empty())
    weights += " (the checkpoint's " + st.weights_from + " matrices, dequantised at load)";
  if (st.q8.on() && !st.settings.int8_only) weights += "; decode steps read the int8 matrices as stored";
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "cuda decoder on %s: %s, %s KV in %lld pages of %lld positions (%.1f MiB), batch %lld, "
                "prefill %lld, table rows %s, GPU memory plan %.2f GiB",
                st.info.name.c_str(), weights.c_str(), kv.bf16 ? "bf16" : "fp32", static_cast<long long>(kv.n_pages),
                static_cast<long long>(kv.page_tokens), mib, static_cast<long long>(st.settings.max_batch),
                static_cast<long long>(st.settings.max_prefill),
                st.rows ? row_path_name(st.path) : "none (no token tables)",
                static_cast<double>(st.plan.total()) / (1024.0 * 1024.0 * 1024.0));
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
  if (st.graphs && st.settings.pdl)
    out += st.pdl_off.empty() ? ", programmatic dependent launch on"
                              : ", programmatic dependent launch off: " + st.pdl_off;
  if (st.settings.tensor_cores) out += ", decode products on the tensor cores";
  if (st.prof) out += ", profiling steps";
  return out;
}

template void setup_decoder<float>(DecoderState<float>&, const Model&, const DecoderSettings&);
template void setup_decoder<__nv_bfloat16>(DecoderState<__nv_bfloat16>&, const Model&, const DecoderSettings&);
template std::string describe_decoder<float>(const DecoderState<float>&);
template std::string describe_decoder<__nv_bfloat16>(const DecoderState<__nv_bfloat16>&);

}  // namespace jtok::cuda
