// The GPU decoder's int8 matrices (cuda/decoder_state.h's DecoderQ8): an int8 export's matrices
// copied to the device as stored, each found by the offset of its zeros in host.params
// (model/lowp_weights.h's lowp_slots), the parts of a fused product (q | k | v, gate | up) placed back
// to back as they lie in the flat parameters, so one Q8Weight spans them. An MoE layer's experts one
// after another, each its gate | up then its down (the flat parameters' order), so expert e's lie a
// fixed stride past expert 0's.
#include <map>
#include <string>
#include <vector>

#include "cuda/decoder_state.h"
#include "model/lowp_weights.h"
#include "model/moe.h"

namespace jtok::cuda {

namespace {

struct Q8Packer {
  const Model& host;
  DecoderQ8& q8;
  std::map<int64_t, WeightMatrix> by_offset;  // host's int8 matrices by their slots' offsets
  std::vector<float> scales;                  // (rows) on the host, uploaded at the end
  int64_t values = 0;                         // int8 values placed so far

  // The matrices at host.params pointers `parts` (back to back there) as one (sum of rows, C) matrix.
  Q8Weight pack(std::initializer_list<const float*> parts, const std::string& what) {
    const Q8Weight w{q8.values.get() + values, q8.scales.get() + static_cast<int64_t>(scales.size())};
    int64_t cols = 0;
    for (const float* p : parts) {
      const auto it = by_offset.find(p - host.params.data());
      if (it == by_offset.end() || it->second.dtype != Dtype::int8)
        fail("cuda decoder: ", what, " is not an int8 matrix of the export (--int8-decode off decodes it from the ",
             "dequantised copy)");
      const WeightMatrix& m = it->second;
      JTOK_CHECK(cols == 0 || m.cols == cols, "cuda decoder: ", what, "'s parts have ", cols, " and ", m.cols,
                 " columns");
      cols = m.cols;
      JTOK_CHECK(values + m.rows * m.cols <= q8.values.size(), "cuda decoder: int8 matrices past the ",
                 q8.values.size(), " values planned");
      copy_to_device(q8.values.get() + values, static_cast<const int8_t*>(m.data), m.rows * m.cols);
      values += m.rows * m.cols;
      scales.insert(scales.end(), m.scale, m.scale + m.rows);
    }
    return w;
  }
};

// An MoE layer's int8 experts: routed expert e's gate | up and down (the strides checked against
// expert 0's), then the shared experts' gate | up and down.
MoeQ8 pack_moe(Q8Packer& p, const MoeWeights& w, const MoeDims& m, const std::string& at) {
  MoeQ8 q;
  q.values_stride = 3 * m.F * m.d, q.scale_stride = 2 * m.F + m.d;
  for (int64_t e = 0; e < m.E; ++e) {
    const std::string name = at + "expert " + std::to_string(e) + "'s ";
    const Q8Weight gu = p.pack({expert_gate(w, m, e), expert_up(w, m, e)}, name + "gate | up");
    const Q8Weight down = p.pack({expert_down(w, m, e)}, name + "down");
    if (e == 0) q.gate_up = gu, q.down = down;
    JTOK_CHECK(gu.q == q.gate_up.q + e * q.values_stride && gu.scale == q.gate_up.scale + e * q.scale_stride &&
                   down.q == q.down.q + e * q.values_stride,
               "cuda decoder: ", name, "int8 matrices off their expert stride");
  }
  if (w.sg) {
    q.shared_gate_up = p.pack({w.sg, w.su}, at + "shared experts' gate | up");
    q.shared_down = p.pack({w.sd}, at + "shared experts' down");
  }
  return q;
}

}  // namespace

void upload_q8(DecoderQ8& q8, const Model& host) {
  const DecoderQ8Sizes z = decoder_q8_sizes(host.cfg);
  q8.values.resize(z.values);
  q8.scales.resize(z.rows);
  Q8Packer p{host, q8, {}, {}, 0};
  for (const LowpSlot& s : lowp_slots(host)) p.by_offset[s.offset] = s.w;
  for (size_t l = 0; l < host.w.layers.size(); ++l) {
    const LayerView& W = host.w.layers[l];
    const std::string at = "layer " + std::to_string(l) + "'s ";
    DecoderQ8::Layer L;
    L.qkv = p.pack({W.wq, W.wk, W.wv}, at + "q | k | v");
    L.o = p.pack({W.wo}, at + "o");
    if (W.wg) {  // a dense MLP
      L.gate_up = p.pack({W.wg, W.wu}, at + "gate | up");
      L.down = p.pack({W.wd}, at + "down");
    } else if (W.moe.router) {
      L.moe = pack_moe(p, W.moe, moe_dims(host.cfg), at);
    }
    q8.layers.push_back(L);
  }
  q8.head = p.pack({host.w.lm_head}, "the LM head");
  JTOK_CHECK(p.values == z.values && static_cast<int64_t>(p.scales.size()) == z.rows, "cuda decoder: ", p.values,
             " int8 values and ", p.scales.size(), " scales, planned ", z.values, " and ", z.rows);
  copy_to_device(q8.scales.get(), p.scales.data(), z.rows);
}

}  // namespace jtok::cuda
