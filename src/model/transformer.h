// The dense pre-norm Transformer of docs/model.md: parameters, activations, forward, backward.
// No autograd: every layer's forward keeps what its backward needs in Activations (llm.c style),
// and parameter gradients accumulate (+=), so gradient accumulation is free.
#pragma once
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/float_buffer.h"
#include "model/config.h"
#include "model/jtok.h"
#include "model/jtokm.h"
#include "model/lowp_weights.h"
#include "model/moe.h"
#include "model/qkv_variants.h"
#include "model/token_table.h"
#include "ops/rope.h"

namespace jtok {

// One named parameter tensor inside a flat buffer.
struct ParamInfo {
  std::string name;              // Hugging Face Qwen-style name, e.g. model.layers.0.mlp.up_proj.weight
  std::vector<int64_t> shape;
  int64_t offset = 0, numel = 0;
  bool decay = false;            // AdamW weight decay applies (2-D weights), not to RMSNorm gains
};

// Views of one layer's tensors inside a flat buffer (weights or their gradients alike).
struct LayerView {
  float *ln1, *wq, *wk, *wv, *wo, *ln2;
  float *bq = nullptr, *bk = nullptr, *bv = nullptr;  // attention_bias: q/k/v biases (qkv_variants.h)
  float *q_norm = nullptr, *k_norm = nullptr;         // qk_norm: per-head RMSNorm gains (hd)
  float *wg = nullptr, *wu = nullptr, *wd = nullptr;  // dense MLP; null on MoE layers
  MoeWeights moe;                // MoE layers only (moe.router null elsewhere)
  float* jtok_scale = nullptr;   // (d) JTok scaler s, on JTok layers only
  float* jtokm_router = nullptr; // (n_e, d) JTok-M router R, on JTok-M layers only
  float* jtokm_scale = nullptr;  // (d) JTok-M scaler s
};
struct ModelView {
  float* embed;                  // (Vp, d)
  std::vector<LayerView> layers;
  float* norm;                   // (d)
  float* lm_head;                // (Vp, d); == embed when tied
};

std::vector<ParamInfo> param_layout(const ModelConfig& c);
ModelView bind_view(float* base, const std::vector<ParamInfo>& layout, const ModelConfig& c);

struct Model {
  ModelConfig cfg;
  std::vector<ParamInfo> layout;
  FloatBuffer params, grads;  // same layout (zeroed without writing: core/float_buffer.h)
  ModelView w, g;                    // views into params and grads
  RopeTable rope;
  // Token-indexed tables (their own storage, row-sparse gradients): JTok's and JTok-M's, in layer
  // order; a layer's n_e JTok-M tables are consecutive.
  std::vector<TokenTable> tables;
  std::vector<SparseRowGrad> table_grads;
  std::vector<std::string> table_names;  // safetensors names
  std::vector<int> jtok_table;           // per layer: index into tables of its JTok table, or -1
  std::vector<int> jtokm_table;          // per layer: index of the first of its n_e JTok-M tables, or -1
  LowpWeights lowp;                      // bf16 / int8 matrices of an inference export (forward only)
  // Per table: the N(0, std) of its random init and its random stream (for_each_table_init_row).
  struct TableInit { double std = 0; uint64_t stream = 0; };
  std::vector<TableInit> table_init;
  // Only the token-indexed modules train (model/trainable.h): backward() computes no weight gradient
  // of the backbone's tensors (embedding, attention, MLP / MoE, norms, lm_head).
  bool backbone_frozen = false;
};
// Safetensors names of layer l's JTok table and of its i-th JTok-M table.
std::string jtok_table_name(int64_t layer);
std::string jtokm_table_name(int64_t layer, int64_t i);

// What make_model allocates: a model about to be loaded from a file skips the random init (every
// value is overwritten), and an inference-only one has no gradient buffers (half the memory).
struct ModelAlloc {
  bool init = true;   // false: parameters and tables left zero
  bool grads = true;  // false: m.grads empty and m.g unbound (forward only)
  bool tables = true; // false: token tables get their shape but no storage (TokenTable::unbound), for a
                      // loader that attaches views (load_weights_mapped)
};
// The model's RoPE table: max_position_embeddings positions, scaled as rope_scaling_type says.
RopeTable make_model_rope_table(const ModelConfig& c);
// Allocates and initialises (docs/model.md "Initialisation") from seed.
Model make_model(const ModelConfig& cfg, uint64_t seed, ModelAlloc alloc = {});
// The random init of token table k of make_model(m.cfg, seed): row(r, values) for every row r in
// [0, padded vocab) in order (d values; padded rows zero), the very values make_model writes, made
// one row at a time, so a caller can keep some rows without the whole table ever existing (a rank's
// shard: dist::ShardedTables). make_model itself initialises the tables through it.
void for_each_table_init_row(const Model& m, uint64_t seed, int64_t k, const std::function<void(int64_t row, const float* values)>& row);
// The same values as a stream: next() writes row 0, then row 1, ... (d values each). Several
// tables' streams advance side by side, so a token-major writer makes the init token block by
// token block (a training store, train/disk_tables.h) with no table ever whole in memory.
class TableInitStream {
 public:
  TableInitStream(const Model& m, uint64_t seed, int64_t k);
  void next(float* values);  // values (d): the next row
 private:
  std::mt19937_64 rng_;
  std::normal_distribution<float> dist_;
  int64_t d_, real_rows_, rows_, row_ = 0;
};
void zero_grads(Model& m);
int64_t num_params(const Model& m);
const ParamInfo& find_param(const Model& m, const std::string& name);

// Saved activations for one micro-batch of shape (B,T).
struct LayerActs {
  std::vector<float> h_in, rstd1, a, q, k, v, lse, att, h_mid, rstd2, m, gate, up, act;  // lse (B,H,T): attention_forward
  QkNormActs qk;  // qk_norm only
  JTokActs jtok;  // JTok layers only
  JTokMActs jtokm;  // JTok-M layers only
  MoeActs moe;    // MoE layers only
};
struct Activations {
  int64_t B = 0, T = 0;
  bool inference = false;                        // ForwardMode::Inference: only layer 0's buffers (and every k, v)
  std::vector<LayerActs> layers;
  std::vector<float> h_out, rstdf, lnf, logits;  // logits (B*T, Vp); becomes dlogits in backward
  RowBatch ids;                                  // the micro-batch's deduplicated ids (JTok, JTok-M)
  RowSync row_sync;                              // if set, called before a table row is gathered
  TableProvider* tables = nullptr;               // if set, the tables' rows live there (embedding parallelism)
  // If set, backward calls it with layer l as soon as layer l's parameter gradients in m.grads are
  // final for this backward (after that layer's part of the backward, layers last to first), so a
  // caller can start summing them (dist::GradBuckets) while the backward goes on; the parameters
  // outside the layers (embedding, final norm, lm_head) are final when backward returns.
  std::function<void(int64_t layer)> on_layer_grads_ready;
  SparseRowGrad table_grad_scratch;              // with `tables`: one micro-batch's JTok table gradient
  double aux_loss = 0;                           // all aux losses: moe_aux_loss + jtokm_aux_loss
  double moe_aux_loss = 0;                       // MoE load balancing: mean over MoE layers (coef included)
  double jtokm_aux_loss = 0;                     // JTok-M load balancing: mean over JTok-M layers (lambda included)
  // Backward scratch.
  std::vector<float> dh, dx, dq, dk, dv, datt, dgate, dup, dact, dmlp, da_jtokm;
  MoeScratch moe_scratch;
};
// Train keeps every layer's activations for backward; Inference (forward only: prefill) keeps
// only every layer's k and v (after RoPE) and reuses one layer's other buffers for all layers.
enum class ForwardMode { Train, Inference };
void ensure_activations(Activations& acts, const ModelConfig& cfg, int64_t B, int64_t T,
                        ForwardMode mode = ForwardMode::Train);

// ids (B,T) -> acts.logits (B*T, Vp); positions 0..T-1 in each row. Sets acts.aux_loss.
void forward(const Model& m, Activations& acts, const int32_t* ids, int64_t B, int64_t T);
// forward() without the lm_head: stops at acts.lnf (B*T, d), the final normed hidden states;
// acts.logits is left alone (KV-cache prefill takes the head of the last position only).
// acts.layers[l].k / .v hold every layer's keys (after RoPE) and values in both modes.
void forward_hidden(const Model& m, Activations& acts, const int32_t* ids, int64_t B, int64_t T,
                    ForwardMode mode = ForwardMode::Train);
// Mean cross-entropy of acts.logits against targets (B,T) over the real vocabulary.
double loss_of_logits(const Model& m, const Activations& acts, const int32_t* targets);
// log p(target | prefix) at every position (B*T), from acts.logits after forward.
void token_logprobs(const Model& m, const Activations& acts, const int32_t* targets, float* out);
// After forward: computes the mean loss, then backpropagates grad_scale * d(mean loss + aux loss)
// into m.grads (accumulating); the aux loss (MoE and JTok-M, acts.aux_loss) is 0 without them.
// acts.logits is overwritten by dlogits. Returns the mean LM loss (without the aux loss).
double backward(Model& m, Activations& acts, const int32_t* ids, const int32_t* targets, float grad_scale = 1.0f);

}  // namespace jtok
