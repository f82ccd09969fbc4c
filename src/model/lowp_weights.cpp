#include "model/lowp_weights.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "model/transformer.h"

namespace jtok {

static const char* const kProjName[kNumProj] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                                "mlp.down_proj"};

static const char* const kExpertProjName[3] = {"gate_proj", "up_proj", "down_proj"};

static std::string proj_param(int64_t layer, int p) {
  return "model.layers." + std::to_string(layer) + "." + kProjName[p] + ".weight";
}
// A MoE layer's expert matrix: e = -1 the shared experts, else routed expert e.
static std::string expert_param(int64_t layer, int64_t e, int p) {
  const std::string l = "model.layers." + std::to_string(layer) + ".mlp.";
  return (e < 0 ? l + "shared_experts." : l + "experts." + std::to_string(e) + ".") + kExpertProjName[p] + ".weight";
}

WeightMatrix layer_matrix(const Model& m, size_t l, Proj p) {
  const int i = static_cast<int>(p);
  if (!m.lowp.layers.empty() && m.lowp.layers[l][i].data) return m.lowp.layers[l][i];
  const auto& c = m.cfg;
  const auto& W = m.w.layers[l];
  const int64_t d = c.hidden_size, F = c.intermediate_size;
  switch (p) {
    case Proj::q: return {Dtype::f32, W.wq, nullptr, c.q_dim(), d};
    case Proj::k: return {Dtype::f32, W.wk, nullptr, c.kv_dim(), d};
    case Proj::v: return {Dtype::f32, W.wv, nullptr, c.kv_dim(), d};
    case Proj::o: return {Dtype::f32, W.wo, nullptr, d, c.q_dim()};
    case Proj::gate: return {Dtype::f32, W.wg, nullptr, F, d};
    case Proj::up: return {Dtype::f32, W.wu, nullptr, F, d};
    case Proj::down: return {Dtype::f32, W.wd, nullptr, d, F};
  }
  return {};
}

const MoeLowp* moe_lowp(const Model& m, size_t l) {
  return l < m.lowp.moe.size() && m.cfg.moe_on_layer(static_cast<int64_t>(l)) ? &m.lowp.moe[l] : nullptr;
}

WeightMatrix head_matrix(const Model& m, int64_t rows) {
  const WeightMatrix& lp = m.cfg.tie_word_embeddings ? m.lowp.embed : m.lowp.lm_head;  // tied: one matrix
  WeightMatrix w = lp.data ? lp : WeightMatrix{Dtype::f32, m.w.lm_head, nullptr, m.cfg.padded_vocab(), m.cfg.hidden_size};
  JTOK_CHECK(rows <= w.rows, "head_matrix: ", rows, " rows of ", w.rows);
  w.rows = rows;
  return w;
}

void embed_rows(const Model& m, float* out, const int32_t* ids, int64_t N) {
  const int64_t d = m.cfg.hidden_size;
  if (!m.lowp.embed.data) {
    for (int64_t n = 0; n < N; ++n) std::memcpy(out + n * d, m.w.embed + static_cast<int64_t>(ids[n]) * d, sizeof(float) * d);
    return;
  }
  for (int64_t n = 0; n < N; ++n) dequantize_rows(out + n * d, m.lowp.embed, ids[n], ids[n] + 1);
}

std::set<std::string> lowp_matrix_names(const ModelConfig& c) {
  std::set<std::string> names = {"model.embed_tokens.weight"};
  if (!c.tie_word_embeddings) names.insert("lm_head.weight");
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    for (int p = 0; p < kNumProj; ++p)
      if (p < 4 || !c.moe_on_layer(l)) names.insert(proj_param(l, p));
    if (!c.moe_on_layer(l)) continue;
    for (int64_t e = c.shared_intermediate() > 0 ? -1 : 0; e < c.n_routed_experts; ++e)
      for (int p = 0; p < 3; ++p) names.insert(expert_param(l, e, p));
  }
  return names;
}

std::string lowp_scale_name(const std::string& name) { return name + "_scale"; }

// Which matrix of m.lowp `name` is, or kind none when it is not one of lowp_matrix_names(c) (parsed,
// not looked up: a MoE model has thousands of expert matrices).
struct LowpName {
  enum class Kind { none, embed, lm_head, proj, expert } kind = Kind::none;
  size_t layer = 0;
  int64_t expert = -1;  // -1: the shared experts
  int proj = 0;         // Proj, or the expert's gate / up / down
};

static LowpName parse_lowp_name(const ModelConfig& c, const std::string& name) {
  if (name == "model.embed_tokens.weight") return {LowpName::Kind::embed};
  if (name == "lm_head.weight") return {c.tie_word_embeddings ? LowpName::Kind::none : LowpName::Kind::lm_head};
  // "model.layers.<l>.<rest>": the digits, then rebuilt and compared, so "01" or "+1" match nothing.
  auto number = [&](size_t& pos, int64_t& v) {
    size_t end = pos;
    while (end < name.size() && name[end] >= '0' && name[end] <= '9') ++end;
    if (end == pos || end - pos > 9 || name.size() <= end || name[end] != '.') return false;
    v = std::stoll(name.substr(pos, end - pos));
    pos = end + 1;
    return true;
  };
  const std::string pre = "model.layers.";
  size_t pos = pre.size();
  int64_t l = 0;
  if (name.compare(0, pre.size(), pre) != 0 || !number(pos, l) || l >= c.num_hidden_layers) return {};
  const size_t layer = static_cast<size_t>(l);
  for (int p = 0; p < kNumProj; ++p)
    if ((p < 4 || !c.moe_on_layer(l)) && name == proj_param(l, p)) return {LowpName::Kind::proj, layer, -1, p};
  if (!c.moe_on_layer(l)) return {};
  int64_t e = -1;
  const std::string routed = pre + std::to_string(l) + ".mlp.experts.";
  if (name.compare(0, routed.size(), routed) == 0) {
    pos = routed.size();
    if (!number(pos, e) || e >= c.n_routed_experts) return {};
  } else if (c.shared_intermediate() == 0) {
    return {};
  }
  for (int p = 0; p < 3; ++p)
    if (name == expert_param(l, e, p)) return {LowpName::Kind::expert, layer, e, p};
  return {};
}

// The slot of lw (LowpWeights, const or not) that n names, or null where lw has none for it.
template <typename LW>
auto slot_in(LW& lw, const LowpName& n) -> decltype(&lw.embed) {
  switch (n.kind) {
    case LowpName::Kind::none:
      return nullptr;
    case LowpName::Kind::embed:
      return &lw.embed;
    case LowpName::Kind::lm_head:
      return &lw.lm_head;
    case LowpName::Kind::proj:
      return n.layer < lw.layers.size() ? &lw.layers[n.layer][n.proj] : nullptr;
    case LowpName::Kind::expert:
      break;
  }
  if (n.layer >= lw.moe.size()) return nullptr;
  auto& ml = lw.moe[n.layer];
  if (n.expert < 0) return &ml.shared[n.proj];
  const size_t e = static_cast<size_t>(n.expert);
  return e < ml.routed.size() ? &ml.routed[e][n.proj] : nullptr;
}

// The slot of m.lowp that matrix `name` fills (made where it is not yet), or null.
static WeightMatrix* lowp_slot(Model& m, const std::string& name) {
  const LowpName n = parse_lowp_name(m.cfg, name);
  auto& lw = m.lowp;
  const size_t L = static_cast<size_t>(m.cfg.num_hidden_layers);
  if (lw.layers.empty()) lw.layers.resize(L);
  if (lw.moe.empty()) lw.moe.resize(L);
  if (n.kind == LowpName::Kind::expert && n.expert >= 0 && lw.moe[n.layer].routed.empty())
    lw.moe[n.layer].routed.resize(static_cast<size_t>(m.cfg.n_routed_experts));
  return slot_in(lw, n);
}

// The low-precision matrix `name` of m, or null (fp32, or not one that may be low precision).
static const WeightMatrix* lowp_matrix(const Model& m, const std::string& name) {
  const WeightMatrix* w = slot_in(m.lowp, parse_lowp_name(m.cfg, name));
  return w && w->data ? w : nullptr;
}

std::vector<LowpSlot> lowp_slots(const Model& m) {
  std::vector<LowpSlot> out;
  if (!m.lowp.any()) return out;
  for (const ParamInfo& p : m.layout)
    if (const WeightMatrix* w = lowp_matrix(m, p.name)) {
      JTOK_CHECK(w->rows * w->cols == p.numel, "lowp_slots: ", p.name, " is ", w->rows, " x ", w->cols, ", its slot ",
                 p.numel, " values");
      out.push_back({p.offset, *w});
    }
  return out;
}

void params_block_f32(const Model& m, const std::vector<LowpSlot>& slots, float* out, int64_t at, int64_t len) {
  JTOK_CHECK(at >= 0 && len >= 0 && at + len <= static_cast<int64_t>(m.params.size()), "params_block_f32: [", at, ", ",
             at + len, ") of ", m.params.size());
  std::memcpy(out, m.params.data() + at, sizeof(float) * static_cast<size_t>(len));
  std::vector<float> rows;
  for (const LowpSlot& s : slots) {
    const int64_t cols = s.w.cols, lo = std::max(at, s.offset), hi = std::min(at + len, s.offset + s.w.rows * cols);
    if (lo >= hi) continue;
    const int64_t r0 = (lo - s.offset) / cols, r1 = (hi - s.offset + cols - 1) / cols;  // the rows [lo, hi) touches
    rows.resize(static_cast<size_t>((r1 - r0) * cols));
    dequantize_rows(rows.data(), s.w, r0, r1);
    std::memcpy(out + (lo - at), rows.data() + (lo - s.offset - r0 * cols),
                sizeof(float) * static_cast<size_t>(hi - lo));
  }
}

bool take_lowp_matrix(Model& m, const StIndex& idx, const std::string& name, const std::vector<int64_t>& shape,
                      const std::shared_ptr<const MappedFile>& file, std::set<std::string>& used) {
  auto it = idx.tensors.find(name);
  if (it == idx.tensors.end() || it->second.dtype == "F32") return false;
  const StEntry& t = it->second;
  Dtype dt;
  if (t.dtype == "BF16") dt = Dtype::bf16;
  else if (t.dtype == "I8") dt = Dtype::int8;
  else return false;  // the caller's F32 check names the dtype
  WeightMatrix* slot = lowp_slot(m, name);
  if (!slot)
    fail(idx.path, ": tensor ", name, " is ", t.dtype,
         "; only the attention / MLP projections, MoE experts, embedding and LM head may be low precision");
  if (t.shape != shape || shape.size() != 2)
    fail(idx.path, ": tensor ", name, " has the wrong shape for the config");
  if (m.lowp.any() && m.lowp.dtype != dt)
    fail(idx.path, ": tensor ", name, " is ", t.dtype, " but another matrix is ", dtype_name(m.lowp.dtype));
  m.lowp.dtype = dt;
  used.insert(name);
  const int64_t rows = shape[0], cols = shape[1];
  auto bytes_of = [&](const std::string& n, const StEntry& e) -> const void* {
    if (file) {
      if (e.offset % 4 != 0) fail(idx.path, ": tensor ", n, " starts at byte ", e.offset, ", not 4-byte aligned");
      m.lowp.keep.push_back(file);
      return file->data() + e.offset;
    }
    auto buf = std::make_shared<std::vector<uint8_t>>(e.nbytes);
    read_tensor_bytes(idx, n, buf->data());
    m.lowp.keep.push_back(buf);
    return buf->data();
  };
  *slot = {dt, bytes_of(name, t), nullptr, rows, cols};
  if (dt == Dtype::int8) {
    const std::string sn = lowp_scale_name(name);
    auto s = idx.tensors.find(sn);
    if (s == idx.tensors.end()) fail(idx.path, ": int8 tensor ", name, " has no scales (", sn, ")");
    if (s->second.dtype != "F32" || s->second.shape != std::vector<int64_t>{rows})
      fail(idx.path, ": tensor ", sn, " must be F32 of shape (", rows, ")");
    slot->scale = static_cast<const float*>(bytes_of(sn, s->second));
    used.insert(sn);
  }
  return true;
}

// W (rows, cols) in t (bf16, or int8 with scale (rows)) into bytes (rows x cols x 2, or x 1): the
// export's conversion, in a file (convert_to_lowp) or in memory (convert_model_to_lowp).
static void quantize_matrix(Dtype t, const float* W, int64_t rows, int64_t cols, void* bytes, float* scale) {
  if (t == Dtype::bf16)
    quantize_bf16(static_cast<uint16_t*>(bytes), W, rows * cols);
  else
    quantize_int8_rows(static_cast<int8_t*>(bytes), scale, W, rows, cols);
}

void convert_to_lowp(StFile& st, const ModelConfig& c, Dtype t) {
  if (t == Dtype::f32) return;
  for (const std::string& name : lowp_matrix_names(c)) {
    auto it = st.tensors.find(name);
    JTOK_CHECK(it != st.tensors.end() && it->second.dtype == "F32", "convert_to_lowp: ", name);
    const std::vector<float> w = it->second.as_f32();
    const std::vector<int64_t> shape = it->second.shape;
    const int64_t rows = shape[0], cols = shape[1];
    StTensor out;
    out.shape = shape;
    out.dtype = t == Dtype::bf16 ? "BF16" : "I8";
    out.bytes.resize(static_cast<size_t>(rows * cols * dtype_bytes(t)));
    std::vector<float> scale(t == Dtype::int8 ? static_cast<size_t>(rows) : 0);
    quantize_matrix(t, w.data(), rows, cols, out.bytes.data(), scale.data());
    if (t == Dtype::int8) st.tensors[lowp_scale_name(name)] = st_f32({rows}, scale.data());
    it->second = std::move(out);
  }
}

void convert_model_to_lowp(Model& m, Dtype t) {
  if (t == Dtype::f32) return;
  JTOK_CHECK(!m.lowp.any(), "convert_model_to_lowp: the model's matrices are ", dtype_name(m.lowp.dtype), " already");
  const std::set<std::string> names = lowp_matrix_names(m.cfg);
  for (const ParamInfo& p : m.layout) {
    if (!names.count(p.name)) continue;
    JTOK_CHECK(p.shape.size() == 2, "convert_model_to_lowp: ", p.name, " is not a matrix");
    const int64_t rows = p.shape[0], cols = p.shape[1];
    float* w = m.params.data() + p.offset;
    auto bytes = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(rows * cols * dtype_bytes(t)));
    auto scale = std::make_shared<std::vector<float>>(t == Dtype::int8 ? static_cast<size_t>(rows) : 0);
    quantize_matrix(t, w, rows, cols, bytes->data(), scale->data());
    *lowp_slot(m, p.name) = {t, bytes->data(), t == Dtype::int8 ? scale->data() : nullptr, rows, cols};
    m.lowp.keep.push_back(bytes);
    m.lowp.keep.push_back(scale);
    std::fill(w, w + rows * cols, 0.0f);
  }
  m.lowp.dtype = t;
}

}  // namespace jtok
