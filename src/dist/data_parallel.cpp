#include "dist/data_parallel.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/profile.h"
#include "core/splitmix.h"
#include "dist/communicator.h"
#include "model/trainable.h"

namespace jtok::dist {

BatchShare batch_share(int64_t micro_batch_size, int64_t accumulation_steps, int64_t rank, int64_t ranks) {
  BatchShare s;
  s.rank = rank;
  s.ranks = ranks;
  const int64_t acc = accumulation_steps, B = micro_batch_size;
  if (acc % ranks == 0) {
    s.by_micro_batch = true;
    s.row_lo = 0;
    s.row_hi = B;
    s.grad_scale = 1.0f / static_cast<float>(acc);  // the single process's scale for each micro-batch
  } else if (B % ranks == 0) {
    s.by_micro_batch = false;
    s.row_lo = rank * B / ranks;
    s.row_hi = (rank + 1) * B / ranks;
    s.grad_scale = 1.0f / static_cast<float>(acc * ranks);  // mean over B/P rows, summed over P ranks
  } else {
    fail(ranks, " ranks divide neither gradient_accumulation_steps (", acc, ") nor micro_batch_size (", B,
         "): the global batch cannot be split evenly");
  }
  return s;
}

void gather_pairs(const BatchShare& share, int64_t a, int64_t b, std::vector<int64_t>& as, std::vector<int64_t>& bs) {
  std::vector<int64_t> all(static_cast<size_t>(2 * share.ranks), 0);
  all[static_cast<size_t>(2 * share.rank)] = a;
  all[static_cast<size_t>(2 * share.rank + 1)] = b;
  allreduce_sum(all.data(), static_cast<int64_t>(all.size()));
  for (int64_t k = 0; k < share.ranks; ++k) as.push_back(all[2 * k]), bs.push_back(all[2 * k + 1]);
}

std::vector<char> pack_table_grads(const Model& m) {
  // Per table: int64 R, then R int32 ids, then R x d floats.
  size_t bytes = 0;
  for (const auto& g : m.table_grads) bytes += sizeof(int64_t) + g.ids.size() * sizeof(int32_t) + g.rows.size() * sizeof(float);
  std::vector<char> out(bytes);
  char* p = out.data();
  for (const auto& g : m.table_grads) {
    const int64_t R = static_cast<int64_t>(g.ids.size());
    std::memcpy(p, &R, sizeof R);
    p += sizeof R;
    if (R > 0) {
      std::memcpy(p, g.ids.data(), g.ids.size() * sizeof(int32_t));
      p += g.ids.size() * sizeof(int32_t);
      std::memcpy(p, g.rows.data(), g.rows.size() * sizeof(float));
      p += g.rows.size() * sizeof(float);
    }
  }
  return out;
}

void merge_table_grads(Model& m, const std::vector<char>& packed, const std::vector<int64_t>& sizes) {
  // Rank order, then each rank's insertion order: the same sums, in the same order, on every rank.
  for (auto& g : m.table_grads) g.clear();
  const char* p = packed.data();
  for (size_t r = 0; r < sizes.size(); ++r) {
    const char* end = p + sizes[r];
    for (auto& g : m.table_grads) {
      int64_t R = 0;
      JTOK_CHECK(p + sizeof R <= end, "table gradient pack of rank ", r, " is short");
      std::memcpy(&R, p, sizeof R);
      p += sizeof R;
      const int64_t d = g.dim;
      JTOK_CHECK(p + R * static_cast<int64_t>(sizeof(int32_t) + d * sizeof(float)) <= end, "table gradient pack of rank ", r, " is short");
      const char* ids = p;
      const char* rows = p + R * static_cast<int64_t>(sizeof(int32_t));
      for (int64_t i = 0; i < R; ++i) {
        int32_t id;
        std::memcpy(&id, ids + i * static_cast<int64_t>(sizeof id), sizeof id);
        JTOK_CHECK(id >= 0 && static_cast<size_t>(id) < g.slot.size(), "table gradient id ", id, " from rank ", r);
        float* dst = g.row(id);
        const float* src = reinterpret_cast<const float*>(rows) + i * d;
        for (int64_t k = 0; k < d; ++k) dst[k] += src[k];
      }
      p = rows + R * d * static_cast<int64_t>(sizeof(float));
    }
    JTOK_CHECK(p == end, "table gradient pack of rank ", r, " has ", end - p, " bytes left over");
  }
}

GradBuckets::GradBuckets(const Model& m) {
  const int64_t L = m.cfg.num_hidden_layers, n = static_cast<int64_t>(m.grads.size());
  layer_.assign(static_cast<size_t>(L), {n, 0});
  int64_t lo = n, hi = 0, numel = 0;  // the span of all layers, and what it holds
  for (const ParamInfo& p : m.layout) {
    const std::string pre = "model.layers.";
    if (p.name.compare(0, pre.size(), pre) != 0 || !param_trainable(m, p)) continue;  // frozen: never summed
    const int64_t l = std::stoll(p.name.substr(pre.size()));
    JTOK_CHECK(l >= 0 && l < L, "parameter ", p.name, " of a layer outside [0, ", L, ")");
    auto& r = layer_[static_cast<size_t>(l)];
    r.first = std::min(r.first, p.offset);
    r.second = std::max(r.second, p.offset + p.numel);
    lo = std::min(lo, p.offset);
    hi = std::max(hi, p.offset + p.numel);
    numel += p.numel;
  }
  int64_t total = 0;
  for (auto& r : layer_) {
    if (r.second <= r.first) r = {0, 0};  // nothing of this layer trains: no bucket
    total += r.second - r.first;
  }
  // A layer's trainable tensors are contiguous: all of them, or (frozen backbone) its JTok / JTok-M
  // ones, which close the layer's block (model/transformer.cpp param_layout).
  JTOK_CHECK(total == numel && (m.backbone_frozen || total == hi - lo),
             "the layers' trainable parameters are not contiguous in the gradient buffer");
  if (!m.backbone_frozen) {
    if (lo > 0) rest_.push_back({0, lo});
    if (hi < n) rest_.push_back({hi, n});
  }
  done_.assign(layer_.size(), false);
}

void GradBuckets::layer_ready(Model& m, int64_t layer) {
  auto& r = layer_.at(static_cast<size_t>(layer));
  JTOK_CHECK(!done_[static_cast<size_t>(layer)], "layer ", layer, "'s gradient bucket started twice in one step");
  done_[static_cast<size_t>(layer)] = true;
  if (r.second > r.first) sum_.start(m.grads.data() + r.first, r.second - r.first);
}

void GradBuckets::finish(Model& m) {
  for (size_t l = layer_.size(); l-- > 0;)  // a step whose backward did not call the hook
    if (!done_[l]) layer_ready(m, static_cast<int64_t>(l));
  for (const auto& r : rest_) sum_.start(m.grads.data() + r.first, r.second - r.first);
  sum_.wait();
  done_.assign(layer_.size(), false);
}

ExchangeBytes sum_gradients(Model& m, bool tables, GradBuckets* buckets) {
  ExchangeBytes b;
  const int64_t P = world_size();
  if (P == 1) return b;
  JTOK_PROFILE("dist_grad_exchange");
  const int64_t n = static_cast<int64_t>(m.grads.size());
  if (buckets) {
    buckets->finish(m);
    b.backbone_sent = buckets->sum_.take_sent();
    b.backbone_recv = buckets->sum_.take_recv();
  } else if (!m.backbone_frozen) {
    allreduce_sum(m.grads.data(), n);
    // Reduce-scatter + allgather: each rank sends (P-1)/P of the buffer twice, and receives as much.
    const int64_t chunk = (n + P - 1) / P * static_cast<int64_t>(sizeof(float));
    b.backbone_sent = b.backbone_recv = 2 * (P - 1) * chunk;
  } else {  // only the trainable tensors (JTok scalers, JTok-M routers): the frozen gradients are 0
    for (const ParamInfo& p : m.layout) {
      if (!param_trainable(m, p)) continue;
      allreduce_sum(m.grads.data() + p.offset, p.numel);
      const int64_t chunk = (p.numel + P - 1) / P * static_cast<int64_t>(sizeof(float));
      b.backbone_sent += 2 * (P - 1) * chunk;
    }
    b.backbone_recv = b.backbone_sent;
  }
  if (tables && !m.table_grads.empty()) {
    const std::vector<char> mine = pack_table_grads(m);
    std::vector<int64_t> sizes;
    const std::vector<char> all = allgatherv(mine.data(), static_cast<int64_t>(mine.size()), &sizes);
    b.table_sent = static_cast<int64_t>(mine.size()) * (P - 1);
    b.table_recv = static_cast<int64_t>(all.size() - mine.size());
    merge_table_grads(m, all, sizes);
  }
  return b;
}

nlohmann::json gather_bytes_json(const ExchangeBytes& b) {
  const int64_t P = world_size();
  std::vector<int64_t> all(static_cast<size_t>(4 * P), 0);
  int64_t* mine = all.data() + 4 * rank();
  mine[0] = b.backbone_sent;
  mine[1] = b.backbone_recv;
  mine[2] = b.table_sent;
  mine[3] = b.table_recv;
  allreduce_sum(all.data(), static_cast<int64_t>(all.size()));
  nlohmann::json j;
  const char* names[4] = {"backbone_sent", "backbone_recv", "table_sent", "table_recv"};
  for (int k = 0; k < 4; ++k) {
    std::vector<int64_t> v(static_cast<size_t>(P));
    for (int64_t r = 0; r < P; ++r) v[static_cast<size_t>(r)] = all[static_cast<size_t>(4 * r + k)];
    j[names[k]] = v;
  }
  return j;
}

}  // namespace jtok::dist

namespace jtok::dist {

int64_t routing_digest(const Activations& acts, int64_t mb, int64_t row_lo) {
  const int64_t N = acts.B * acts.T;
  uint64_t sum = 0;
  for (size_t l = 0; l < acts.layers.size(); ++l) {
    const LayerActs& la = acts.layers[l];
    auto add = [&](const std::vector<int32_t>& choice, uint64_t kind) {
      if (choice.empty() || N == 0) return;
      const int64_t K = static_cast<int64_t>(choice.size()) / N;
      for (int64_t n = 0; n < N; ++n) {
        const uint64_t pos = (static_cast<uint64_t>(mb) << 40) ^ (static_cast<uint64_t>(row_lo + n / acts.T) << 20) ^
                             static_cast<uint64_t>(n % acts.T);
        for (int64_t k = 0; k < K; ++k)
          sum += mix64(mix64(pos) ^ (kind << 56) ^ (static_cast<uint64_t>(l) << 40) ^
                       static_cast<uint64_t>(choice[static_cast<size_t>(n * K + k)])) >> 24;
      }
    };
    add(la.moe.topi, 1);
    add(la.jtokm.sel, 2);
  }
  return static_cast<int64_t>(sum & ((1ULL << 56) - 1));
}

}  // namespace jtok::dist
