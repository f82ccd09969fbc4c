// Low-precision (bf16 / int8) backbone matrices for inference (ops/lowp_linear.h), as written by
// `jtok export --weight-dtype` (docs/formats.md "Low-precision weights"): the attention and dense
// MLP projections, the MoE layers' shared and routed experts, the embedding and the LM head. Norms,
// scalers, routers (JTok-M's and MoE's) and the token tables keep their own dtype. A model holding
// them is forward-only: training refuses it.
//
// The forward reads every matrix through layer_matrix / moe_lowp (model/moe.h's moe_matrix) /
// head_matrix / embed_rows, which return the low-precision matrix where the model has one and a view
// of the fp32 parameter otherwise.
#pragma once
#include <array>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "io/mapped_file.h"
#include "io/safetensors.h"
#include "model/moe.h"
#include "ops/lowp_linear.h"

namespace jtok {

struct Model;
struct ModelConfig;

enum class Proj { q, k, v, o, gate, up, down };
constexpr int kNumProj = 7;

struct LowpWeights {
  Dtype dtype = Dtype::f32;  // f32: none (the forward reads m.w)
  std::vector<std::array<WeightMatrix, kNumProj>> layers;  // data null: that matrix is fp32
  std::vector<MoeLowp> moe;  // per layer: MoE layers' experts (dense layers' stay empty)
  WeightMatrix embed, lm_head;
  std::vector<std::shared_ptr<const void>> keep;  // owners of the bytes (buffers, or the mapped file)
  bool any() const { return dtype != Dtype::f32; }
};

WeightMatrix layer_matrix(const Model& m, size_t layer, Proj p);
// MoE layer `layer`'s low-precision experts for moe_forward, or null (none: all fp32).
const MoeLowp* moe_lowp(const Model& m, size_t layer);
// The LM head's first `rows` rows (the real vocabulary, or all padded_vocab rows).
WeightMatrix head_matrix(const Model& m, int64_t rows);
// out (N, d) = the embedding rows of ids (dequantised where low precision).
void embed_rows(const Model& m, float* out, const int32_t* ids, int64_t N);

// A low-precision matrix and its fp32 slot in m.params (zeros, never read), which starts at offset.
struct LowpSlot {
  int64_t offset = 0;
  WeightMatrix w;
};
// Every low-precision matrix of m with its slot, in layout order (none for an fp32 model).
std::vector<LowpSlot> lowp_slots(const Model& m);
// out (len) = m.params[at, at + len) with the slots' matrices dequantised over their zeros: the
// weights as a device that multiplies f32 or bf16 reads them (cuda's decoder), a block at a time so
// no whole fp32 copy of the model is made.
void params_block_f32(const Model& m, const std::vector<LowpSlot>& slots, float* out, int64_t at, int64_t len);

// The parameters a low-precision export converts, by name.
std::set<std::string> lowp_matrix_names(const ModelConfig& c);
// The name of int8 matrix `name`'s per-row scales: "x.weight" -> "x.weight_scale".
std::string lowp_scale_name(const std::string& name);

// Loading: if idx holds parameter `name` (expected shape {rows, cols}) as BF16, or as I8 with its
// F32 scales, takes it into m.lowp (read into a buffer, or, with a mapping, viewed in place) and adds
// the tensors it used to `used`; returns false for an F32 tensor (the caller reads it). Errors name
// the file and tensor on a wrong shape, a missing scale, or a dtype mixed with another matrix's.
bool take_lowp_matrix(Model& m, const StIndex& idx, const std::string& name, const std::vector<int64_t>& shape,
                      const std::shared_ptr<const MappedFile>& file, std::set<std::string>& used);

// Exporting: replaces every lowp_matrix_names tensor of st (F32) by its bf16 or int8 (+ scale) form.
void convert_to_lowp(StFile& st, const ModelConfig& c, Dtype t);
// The same in memory: m's own lowp_matrix_names matrices converted to t (bf16 / int8) into m.lowp,
// their slots in m.params zeroed: the model an export of m loads as (bench-decode's random models).
// t f32: nothing. m must hold fp32 matrices.
void convert_model_to_lowp(Model& m, Dtype t);

}  // namespace jtok
