// The GPU decoder's int8 matrices (cuda/decoder_state.h's DecoderQ8): an int8 export's matrices
// copied to the device as stored, each found by the offset of its zeros in host.params
// (model/lowp_weights.h's lowp_slots), the parts of a fused product (q | k | v, gate | up) placed back
// to back as they lie in the flat parameters, so one Q8Weight spans them. An MoE layer's experts one
// after another, each its gate | up then its down (the flat parameters' order), so expert e's lie a
// fixed stride past expert 0's. int8_only: an untied embedding's last (a tied one is the head).
#include <algorithm>
#include <iterator>
#include <map>
#include <string>
#include <utility>
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
  std::vector<Q8Run> runs;                    // every layer's, relative to its first value and row
  int64_t values = 0;                         // int8 values placed so far
  int64_t layer = -1;                         // the layer being packed (-1: the LM head or embedding)

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
      q8.parts.push_back({it->first, m.rows * m.cols, values, layer});
      if (layer >= 0) add_rows(m.rows, m.cols);
      values += m.rows * m.cols;
      scales.insert(scales.end(), m.scale, m.scale + m.rows);
    }
    return w;
  }

  // The packing layer's next rows (cols wide): the last run longer, or a new one.
  void add_rows(int64_t rows, int64_t cols) {
    DecoderQ8::Layer& L = q8.layers.back();
    const int64_t first_row = static_cast<int64_t>(scales.size()) - L.first_row;
    if (L.runs > 0 && runs.back().cols == cols) {
      runs.back().rows += rows;
    } else {
      runs.push_back({first_row, rows, cols, values - L.first_value});
      ++L.runs;
    }
    L.rows += rows;
  }

  // The layers' bookkeeping from here on is layer l's.
  void begin_layer(int64_t l) {
    layer = l;
    DecoderQ8::Layer L;
    L.first_value = values, L.first_row = static_cast<int64_t>(scales.size());
    L.run_begin = static_cast<int64_t>(runs.size());
    q8.layers.push_back(L);
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

void upload_q8(DecoderQ8& q8, const Model& host, bool int8_only) {
  const DecoderQ8Sizes z = decoder_q8_sizes(host.cfg, int8_only);
  q8.values.resize(z.values);
  q8.scales.resize(z.rows);
  Q8Packer p{host, q8, {}, {}, {}, 0, -1};
  for (const LowpSlot& s : lowp_slots(host)) p.by_offset[s.offset] = s.w;
  for (size_t l = 0; l < host.w.layers.size(); ++l) {
    const LayerView& W = host.w.layers[l];
    const std::string at = "layer " + std::to_string(l) + "'s ";
    p.begin_layer(static_cast<int64_t>(l));
    DecoderQ8::Layer& L = q8.layers.back();
    L.qkv = p.pack({W.wq, W.wk, W.wv}, at + "q | k | v");
    L.o = p.pack({W.wo}, at + "o");
    if (W.wg) {  // a dense MLP
      L.gate_up = p.pack({W.wg, W.wu}, at + "gate | up");
      L.down = p.pack({W.wd}, at + "down");
    } else if (W.moe.router) {
      L.moe = pack_moe(p, W.moe, moe_dims(host.cfg), at);
    }
  }
  p.layer = -1;
  q8.head = p.pack({host.w.lm_head}, "the LM head");
  const bool untied = host.w.lm_head != host.w.embed;
  if (int8_only) q8.embed = untied ? p.pack({host.w.embed}, "the embedding") : q8.head;
  JTOK_CHECK(p.values == z.values && static_cast<int64_t>(p.scales.size()) == z.rows, "cuda decoder: ", p.values,
             " int8 values and ", p.scales.size(), " scales, planned ", z.values, " and ", z.rows);
  copy_to_device(q8.scales.get(), p.scales.data(), z.rows);
  q8.runs.resize(static_cast<int64_t>(p.runs.size()));
  copy_to_device(q8.runs.get(), p.runs.data(), static_cast<int64_t>(p.runs.size()));
}

std::vector<KeptRange> kept_ranges(const DecoderQ8& q8, bool int8_only, int64_t n) {
  std::vector<std::pair<int64_t, int64_t>> gaps;  // the int8 parts: [begin, end) of host.params
  if (int8_only)
    for (const DecoderQ8::Part& part : q8.parts) gaps.emplace_back(part.host_offset, part.host_offset + part.numel);
  std::sort(gaps.begin(), gaps.end());
  std::vector<KeptRange> kept;
  int64_t from = 0, at = 0;
  auto keep = [&](int64_t end) {
    if (end > from) kept.push_back({from, end, at}), at += end - from;
  };
  for (const auto& [begin, end] : gaps) {
    JTOK_CHECK(begin >= from, "cuda decoder: int8 parts overlap at ", begin);
    keep(begin);
    from = end;
  }
  keep(n);
  return kept;
}

template <typename E>
DeviceView<E> int8_only_view(const DecoderState<E>& st, const std::vector<KeptRange>& kept, const Model& host) {
  std::map<int64_t, const DecoderQ8::Part*> parts;  // the int8 parts by host offset
  for (const DecoderQ8::Part& part : st.q8.parts) parts[part.host_offset] = &part;
  auto at = [&](const float* ptr) -> E* {
    const int64_t o = ptr - host.params.data();
    const auto k =
        std::upper_bound(kept.begin(), kept.end(), o, [](int64_t x, const KeptRange& r) { return x < r.end; });
    if (k != kept.end() && k->begin <= o) return st.params.get() + k->at + (o - k->begin);
    auto p = parts.upper_bound(o);
    JTOK_CHECK(p != parts.begin(), "cuda decoder: parameter offset ", o, " in neither the copy nor the int8 parts");
    const DecoderQ8::Part& part = *std::prev(p)->second;
    JTOK_CHECK(o < part.host_offset + part.numel, "cuda decoder: parameter offset ", o, " past its int8 part");
    if (part.layer < 0) return nullptr;  // the LM head or embedding: their int8 matrices alone (q8.head, q8.embed)
    const int64_t layer_first = st.q8.layers[static_cast<size_t>(part.layer)].first_value;
    return st.q8_scratch.get() + (part.value_offset - layer_first) + (o - part.host_offset);
  };
  return map_view<E>(host.w, at);
}

template <typename E>
void dequantize_layer(DecoderState<E>& st, size_t l) {
  const DecoderQ8::Layer& L = st.q8.layers[l];
  dequantize_q8_rows(st.q8_scratch.get(), st.q8.values.get() + L.first_value, st.q8.scales.get() + L.first_row,
                     st.q8.runs.get() + L.run_begin, L.runs, L.rows, st.s());
}

template DeviceView<float> int8_only_view<float>(const DecoderState<float>&, const std::vector<KeptRange>&,
                                                 const Model&);
template DeviceView<__nv_bfloat16> int8_only_view<__nv_bfloat16>(const DecoderState<__nv_bfloat16>&,
                                                                 const std::vector<KeptRange>&, const Model&);
template void dequantize_layer<float>(DecoderState<float>&, size_t);
template void dequantize_layer<__nv_bfloat16>(DecoderState<__nv_bfloat16>&, size_t);

}  // namespace jtok::cuda
