// The GPU decoder's buffer sizes and memory plan (src/cuda/decoder_sizes.h). Host-only arithmetic:
// part of jtok_lib in every build, tested on the CPU (tests/test_decoder_plan.cpp).
#include "cuda/decoder_sizes.h"

#include <algorithm>
#include <cstdio>

#include "model/moe.h"
#include "model/transformer.h"

namespace jtok::cuda {

namespace {

int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }
double gib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0); }

}  // namespace

int64_t paged_attention_scratch(int64_t R, int64_t H, int64_t hd, int64_t max_len) {
  if (R <= 0 || H <= 0 || hd <= 0 || max_len <= 0) return 0;
  return R * H * ceil_div64(max_len, kPagedAttentionChunk) * (hd + 2);  // per chunk: o (hd), m, l
}

int64_t decoder_attention_scratch(int64_t R, int64_t max_batch, int64_t H, int64_t hd, int64_t context) {
  const int64_t per_row = paged_attention_scratch(1, H, hd, context);
  if (per_row <= 0 || R <= 0) return 0;
  const int64_t rows = std::min(R, std::max({max_batch, kPagedScratchFloats / per_row, int64_t{1}}));
  return rows * per_row;
}

DecoderKvSizes decoder_kv_sizes(const ModelConfig& c, const DecoderSettings& s, int64_t context) {
  DecoderKvSizes z;
  z.max_pages = ceil_div64(context, s.page_tokens);
  z.n_pages = s.kv_tokens > 0 ? ceil_div64(s.kv_tokens, s.page_tokens) : s.max_batch * z.max_pages;
  z.max_seqs = s.max_seqs > 0 ? s.max_seqs : 4 * s.max_batch;
  z.layers = c.num_hidden_layers;
  z.page_elems = s.page_tokens * c.num_key_value_heads * c.hd();
  z.elem_bytes = s.kv_bf16 ? 2 : 4;
  return z;
}

DecoderLayerKinds decoder_layer_kinds(const ModelConfig& c) {
  DecoderLayerKinds k;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    (c.moe_on_layer(l) ? k.moe : k.dense) = true;
    k.gated |= c.jtok_on_layer(l);
  }
  k.jtokm_layers = c.jtokm_num_layers();
  k.table_slots = c.jtok_num_layers() + k.jtokm_layers * c.jtokm_n_e;
  return k;
}

int64_t MoeActSizes::bytes(int64_t e_bytes) const {
  return 4 * (probs + topw + frac + topi + offsets + slot_of + row_of + experts + num_experts) + 8 * aux +
         e_bytes * (xg + gu + act + eo + sg + su + sact);
}

MoeActSizes moe_act_sizes(const MoeDims& m, int64_t N) {
  const int64_t NK = N * m.K;
  MoeActSizes z;
  z.probs = N * m.E, z.topw = NK, z.frac = m.E;
  z.topi = NK, z.offsets = m.E + 1, z.slot_of = NK, z.row_of = NK, z.aux = 1;
  z.experts = NK, z.num_experts = 1;
  z.xg = NK * m.d, z.gu = NK * 2 * m.F, z.act = NK * m.F, z.eo = NK * m.d;
  z.sg = N * m.S, z.su = N * m.S, z.sact = N * m.S;
  return z;
}

int64_t decoder_max_rows(const DecoderSettings& s) { return std::max(s.max_batch, s.max_prefill); }

namespace {

// The layers' arrays (cuda/decoder_setup.cu's size_layer_buffers).
void layer_sizes(DecoderActSizes& z, const ModelConfig& c, const DecoderSettings& s, const DecoderLayerKinds& k,
                 int64_t context) {
  const int64_t R = z.R, d = c.hidden_size, F = c.intermediate_size, qd = c.q_dim(), kvd = c.kv_dim();
  const int64_t H = c.num_attention_heads, hd = c.hd();
  z.h = z.a = z.x = R * d, z.q = z.att = R * qd, z.k = z.v = R * kvd, z.rstd = R;
  z.qkv = R * (qd + 2 * kvd);
  z.gate_up = k.dense ? 2 * R * F : 0, z.act = k.dense ? R * F : 0;
  z.mlp_out = z.nrows = k.gated ? R * d : 0, z.inv_norm = k.gated ? R : 0;
  z.lse = H * s.max_prefill;
  z.attn_scratch = decoder_attention_scratch(R, s.max_batch, H, hd, context), z.attn_counters = R * H;
  const int64_t ne = k.jtokm_layers > 0 ? c.jtokm_n_e : 0, K = k.jtokm_layers > 0 ? c.jtokm_top_k : 0;
  z.m_logits = z.m_sig = R * ne, z.m_w = z.m_sel = R * K;
  z.m_inv_norm = ne ? R : 0;
  if (k.moe) {
    const MoeDims m = moe_dims(c);
    z.moe = moe_act_sizes(m, R);
    z.moe_logits = R * m.E;
  }
}

}  // namespace

DecoderActSizes decoder_act_sizes(const ModelConfig& c, const DecoderSettings& s, const DecoderLayerKinds& k,
                                  int64_t context) {
  DecoderActSizes z;
  z.R = decoder_max_rows(s);
  z.head_rows = std::min(z.R, std::max<int64_t>(s.max_batch, 32));  // the CPU's head blocks: 32 rows
  layer_sizes(z, c, s, k, context);
  z.step = z.host_step = 3 * z.R;
  z.identity = z.R;
  z.lnf = z.head_rows * c.hidden_size;
  z.logits = z.head_rows * c.padded_vocab();
  z.host_logits = z.head_rows * c.vocab_size;
  z.host_sel = k.jtokm_layers * s.max_batch * c.jtokm_top_k;
  z.digests = s.max_batch;
  return z;
}

StepRowsSizes step_rows_sizes(int64_t slots, int64_t max_n, int64_t V, int64_t d) {
  return {slots * max_n * d, max_n, max_n + 1, V * d};
}

namespace {

// Bytes of the step's activations: every DecoderActs array but the attention scratch and the head's.
int64_t activation_bytes(const DecoderActSizes& z, int64_t eb, const DecoderCubBytes& cub) {
  const int64_t e = z.h + z.a + z.x + z.q + z.att + z.k + z.v + z.qkv + z.gate_up + z.act + z.mlp_out +
                    z.nrows;
  const int64_t f32 = z.rstd + z.inv_norm + z.lse + z.m_logits + z.m_sig + z.m_w + z.m_inv_norm + z.moe_logits;
  const int64_t i32 = z.m_sel + z.step + z.identity + z.attn_counters;
  return eb * e + 4 * (f32 + i32) + z.moe.bytes(eb) + (z.moe_logits ? cub.moe_group : 0);
}

int64_t param_count(const ModelConfig& c) {
  const std::vector<ParamInfo> layout = param_layout(c);
  return layout.back().offset + layout.back().numel;
}

}  // namespace

DecoderQ8Sizes decoder_q8_sizes(const ModelConfig& c, bool embed) {
  const int64_t d = c.hidden_size, F = c.intermediate_size, qkv = c.q_dim() + 2 * c.kv_dim();
  const int64_t vocab_matrices = embed && !c.tie_word_embeddings ? 2 : 1;  // the LM head (and the embedding)
  DecoderQ8Sizes z{vocab_matrices * c.padded_vocab() * d, vocab_matrices * c.padded_vocab()};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    int64_t values = qkv * d + d * c.q_dim(), rows = qkv + d;  // the layer's
    if (c.moe_on_layer(l)) {  // each routed expert's gate | up and down, then the shared experts'
      const MoeDims m = moe_dims(c);
      z.routed_values += m.E * 3 * m.F * d;
      z.routed_rows += m.E * (2 * m.F + d);
      values += m.E * 3 * m.F * d + 3 * m.S * d;
      rows += m.E * (2 * m.F + d) + (m.S > 0 ? 2 * m.S + d : 0);
    } else {
      values += 2 * F * d + d * F;
      rows += 2 * F + d;
    }
    z.values += values, z.rows += rows;
    z.max_layer_values = std::max(z.max_layer_values, values);
  }
  return z;
}

DecoderMemoryPlan decoder_memory_plan(const ModelConfig& c, const DecoderSettings& s, const DecoderLayerKinds& k,
                                      bool hbm_tables, bool staged_rows, const DecoderCubBytes& cub) {
  const int64_t eb = s.bf16 ? 2 : 4, context = c.max_position_embeddings, d = c.hidden_size;
  DecoderMemoryPlan p;
  p.weights = eb * param_count(c) + 2 * 4 * context * (c.hd() / 2);  // + RoPE's cos and sin
  const DecoderKvSizes kv = decoder_kv_sizes(c, s, context);
  p.kv_pages = 2 * kv.layers * kv.pool_bytes() + 4 * kv.table_ints();
  const DecoderActSizes a = decoder_act_sizes(c, s, k, context);
  p.activations = activation_bytes(a, eb, cub);
  p.attention_scratch = 4 * a.attn_scratch;
  const int64_t digest_bytes = a.digests * static_cast<int64_t>(sizeof(DigestRow) + sizeof(LogitDigest));
  p.logits = 4 * a.logits + eb * a.lnf + digest_bytes;
  p.host_pinned = 4 * (a.host_step + a.host_logits + a.host_sel) + digest_bytes;
  if (k.table_slots > 0) {
    const StepRowsSizes r = step_rows_sizes(k.table_slots, a.R, c.padded_vocab(), d);
    p.row_slots = eb * r.out + 4 * (4 * r.ids + r.offsets + 1) + cub.rows_dedup;
    p.hbm_tables = hbm_tables ? eb * k.table_slots * r.table : 0;
    p.host_pinned += 4 * r.ids + (staged_rows ? eb * r.out : 0);
  }
  if (k.int8) {
    const DecoderQ8Sizes z = decoder_q8_sizes(c, k.int8_only);
    p.int8_weights = z.bytes();
    if (k.int8_only) {  // every int8 matrix leaves the copy; one layer's come back, dequantised, in the scratch
      p.weights -= eb * z.values;
      p.int8_weights += eb * z.max_layer_values;
    }
  }
  return p;
}

DecoderMemoryPlan decoder_memory_plan(const ModelConfig& c, const DecoderSettings& s, bool int8_export) {
  DecoderLayerKinds k = decoder_layer_kinds(c);
  k.int8 = int8_export && s.int8_decode;
  k.int8_only = k.int8 && s.int8_only;
  return decoder_memory_plan(c, s, k, s.table_rows == "hbm", s.table_rows == "staged");
}

std::vector<std::pair<std::string, int64_t>> DecoderMemoryPlan::items() const {
  return {{"weights", weights},         {"KV pages", kv_pages},
          {"activations", activations}, {"attention scratch", attention_scratch},
          {"logits blocks", logits},    {"table row slots", row_slots},
          {"hbm tables", hbm_tables},   {"int8 weights", int8_weights}};
}

std::string decoder_plan_line(const DecoderMemoryPlan& p) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "GPU memory plan %.2f GiB:", gib(p.total()));
  std::string out = buf;
  const char* sep = " ";
  for (const auto& [name, b] : p.items()) {
    std::snprintf(buf, sizeof buf, "%s%s %.2f", sep, name.c_str(), gib(b));
    out += buf;
    sep = ", ";
  }
  std::snprintf(buf, sizeof buf, " GiB (host pinned %.2f GiB)", gib(p.host_pinned));
  return out + buf;
}

namespace {

// The setting that shrinks an item (names as DecoderMemoryPlan::items gives them).
const char* shrink_hint(const std::string& item) {
  if (item == "weights")
    return "--precision bf16 halves fp32 weights; an int8 export's --int8-decode only drops the copy of its int8 "
           "matrices; else a smaller model";
  if (item == "KV pages")
    return "fewer KV pages: --kv-budget-tokens (serve), --max-batch, --kv-dtype bf16, a shorter context";
  if (item == "activations") return "they scale with max(--max-batch, --max-prefill) rows: a smaller --max-prefill";
  if (item == "attention scratch") return "it holds max(--max-batch, 256 MiB's) rows over the whole context";
  if (item == "logits blocks") return "they scale with --max-batch (at least 32 rows)";
  if (item == "table row slots") return "they scale with max(--max-batch, --max-prefill) rows: a smaller --max-prefill";
  if (item == "hbm tables") return "--table-rows in_place (or staged) reads the host's tables instead";
  if (item == "int8 weights")
    return "--int8-decode off decodes from the bf16 copy alone; --int8-decode only from the int8 matrices alone, "
           "without their copy";
  return "";
}

}  // namespace

std::string decoder_memory_refusal(const DecoderMemoryPlan& p, int64_t free_bytes) {
  if (p.total() + kDecoderHeadroomBytes <= free_bytes) return "";
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "cuda decoder: the GPU memory plan needs %.2f GiB (+ %.2f GiB headroom) but the GPU has %.2f GiB free",
                gib(p.total()), gib(kDecoderHeadroomBytes), gib(free_bytes));
  std::string msg = buf;
  std::vector<std::pair<std::string, int64_t>> items = p.items();
  std::stable_sort(items.begin(), items.end(), [](const auto& x, const auto& y) { return x.second > y.second; });
  for (size_t i = 0; i < items.size() && i < 3 && items[i].second > 0; ++i) {
    std::snprintf(buf, sizeof buf, "; %s %.2f GiB (", items[i].first.c_str(), gib(items[i].second));
    msg += buf;
    msg += shrink_hint(items[i].first);
    msg += ")";
  }
  return msg + "; " + decoder_plan_line(p);
}

}  // namespace jtok::cuda
