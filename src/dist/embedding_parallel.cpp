#include "dist/embedding_parallel.h"

#include <bit>
#include <cstring>

#include "core/error.h"
#include "dist/communicator.h"
#include "model/jtokm_mix.h"

namespace jtok::dist {

namespace {

// Sends per_dest[j] (4-byte words) to rank j; returns what every rank sent here, concatenated in
// rank order, with from[j] words from rank j. Counts the bytes that cross to other ranks.
template <typename W>
std::vector<W> exchange(const std::vector<std::vector<W>>& per_dest, std::vector<int64_t>& from, ExchangeBytes2& bytes) {
  static_assert(sizeof(W) == 4);
  const size_t P = per_dest.size();
  const int me = rank();
  std::vector<int64_t> sc(P);
  for (size_t j = 0; j < P; ++j) sc[j] = static_cast<int64_t>(per_dest[j].size() * sizeof(W));
  std::vector<int64_t> so = prefix_offsets(sc);
  std::vector<W> send(static_cast<size_t>((so.back() + sc.back()) / 4));
  for (size_t j = 0; j < P; ++j)
    if (!per_dest[j].empty()) std::memcpy(send.data() + so[j] / 4, per_dest[j].data(), static_cast<size_t>(sc[j]));
  std::vector<int64_t> rc = exchange_counts(sc);
  std::vector<int64_t> ro = prefix_offsets(rc);
  std::vector<W> recv(static_cast<size_t>((ro.back() + rc.back()) / 4));
  alltoallv(send.data(), sc, so, recv.data(), rc, ro);
  from.resize(P);
  for (size_t j = 0; j < P; ++j) {
    from[j] = rc[j] / 4;
    if (static_cast<int>(j) == me) continue;
    bytes.sent += sc[j];
    bytes.recv += rc[j];
  }
  return recv;
}

void check_owner(const TableShard& s, int64_t id) {
  JTOK_CHECK(id >= 0 && id < s.own.V && s.own.owner(id) == s.rank, "rank ", s.rank, " asked for row ", id, " it does not own");
}

}  // namespace

int64_t RowOwner::rows_on(int r) const {
  if (kind == kModP) return V > r ? (V - r + P - 1) / P : 0;
  const int64_t lo = std::min(V, r * chunk()), hi = std::min(V, lo + chunk());
  return hi - lo;
}

int64_t TableShard::table_bytes() const { return n_tables * rows * dim * static_cast<int64_t>(sizeof(float)); }
int64_t TableShard::moment_bytes() const { return 2 * table_bytes(); }

TableShard make_shard(const RowOwner& own, int rank, int64_t n_tables, int64_t dim, const std::vector<const float*>& full) {
  JTOK_CHECK(full.empty() || static_cast<int64_t>(full.size()) == n_tables);
  TableShard s;
  s.own = own;
  s.rank = rank;
  s.n_tables = n_tables;
  s.dim = dim;
  s.rows = own.rows_on(rank);
  s.w.assign(static_cast<size_t>(n_tables), std::vector<float>(static_cast<size_t>(s.rows * dim), 0.0f));
  s.m = s.w;
  s.v = s.w;
  s.grads.resize(static_cast<size_t>(n_tables));
  for (auto& g : s.grads) g.init(s.rows, dim);
  if (!full.empty())
    for (int64_t t = 0; t < n_tables; ++t)
      for (int64_t r = 0; r < s.rows; ++r)
        std::memcpy(s.w[t].data() + r * dim, full[t] + own.global(rank, r) * dim, sizeof(float) * dim);
  return s;
}

ExchangeBytes2 fetch_rows(float* out, const TableShard& s, int64_t table, const RowBatch& rb) {
  const size_t P = static_cast<size_t>(world_size());
  const int64_t d = s.dim, U = static_cast<int64_t>(rb.unique.size());
  ExchangeBytes2 b;
  std::vector<std::vector<int32_t>> req(P);
  std::vector<std::vector<int32_t>> where(P);  // index u of each request, per owner
  for (int64_t u = 0; u < U; ++u) {
    const int o = s.own.owner(rb.unique[u]);
    req[o].push_back(rb.unique[u]);
    where[o].push_back(static_cast<int32_t>(u));
  }
  std::vector<int64_t> from;
  const std::vector<int32_t> got = exchange(req, from, b);
  // Owner: the rows asked for, in the order asked.
  std::vector<std::vector<float>> reply(P);
  for (size_t j = 0, off = 0; j < P; off += static_cast<size_t>(from[j]), ++j) {
    reply[j].resize(static_cast<size_t>(from[j] * d));
    for (int64_t i = 0; i < from[j]; ++i) {
      check_owner(s, got[off + i]);
      if (s.sync) s.sync(table, s.own.local(got[off + i]));
      std::memcpy(reply[j].data() + i * d, s.row(table, got[off + i]), sizeof(float) * d);
    }
  }
  std::vector<int64_t> back;
  const std::vector<float> rows = exchange(reply, back, b);
  for (size_t j = 0, off = 0; j < P; off += static_cast<size_t>(back[j]), ++j)
    for (size_t i = 0; i < where[j].size(); ++i)
      std::memcpy(out + static_cast<int64_t>(where[j][i]) * d, rows.data() + off + i * d, sizeof(float) * d);
  return b;
}

ExchangeBytes2 push_row_grads(TableShard& s, int64_t table, const std::vector<int32_t>& ids, const float* grows) {
  const size_t P = static_cast<size_t>(world_size());
  const int64_t d = s.dim, U = static_cast<int64_t>(ids.size());
  ExchangeBytes2 b;
  std::vector<std::vector<uint32_t>> msg(P);  // per id: id, then d floats
  for (int64_t u = 0; u < U; ++u) {
    auto& m = msg[s.own.owner(ids[u])];
    m.push_back(static_cast<uint32_t>(ids[u]));
    for (int64_t j = 0; j < d; ++j) m.push_back(std::bit_cast<uint32_t>(grows[u * d + j]));
  }
  std::vector<int64_t> from;
  const std::vector<uint32_t> got = exchange(msg, from, b);
  for (size_t i = 0; i < got.size(); i += static_cast<size_t>(1 + d)) {
    const int32_t id = static_cast<int32_t>(got[i]);
    check_owner(s, id);
    float* g = s.grads[table].row(static_cast<int32_t>(s.own.local(id)));
    for (int64_t j = 0; j < d; ++j) g[j] += std::bit_cast<float>(got[i + 1 + j]);
  }
  return b;
}

ExchangeBytes2 premix_forward(float* e, PremixState& st, const TableShard& s, const int32_t* ids, const int32_t* sel,
                              const float* w, int64_t N, int64_t K) {
  const size_t P = static_cast<size_t>(world_size());
  const int64_t d = s.dim, words = 1 + 2 * K;
  ExchangeBytes2 b;
  st.K = K;
  st.N = N;
  std::vector<std::vector<uint32_t>> req(P);
  std::vector<std::vector<int32_t>> pos(P);
  for (int64_t n = 0; n < N; ++n) {
    const int o = s.own.owner(ids[n]);
    auto& r = req[o];
    r.push_back(static_cast<uint32_t>(ids[n]));
    for (int64_t k = 0; k < K; ++k) r.push_back(static_cast<uint32_t>(sel[n * K + k]));
    for (int64_t k = 0; k < K; ++k) r.push_back(std::bit_cast<uint32_t>(w[n * K + k]));
    pos[o].push_back(static_cast<int32_t>(n));
  }
  st.send_counts.assign(P, 0);
  st.send_pos.clear();
  for (size_t j = 0; j < P; ++j) {
    st.send_counts[j] = static_cast<int64_t>(pos[j].size());
    st.send_pos.insert(st.send_pos.end(), pos[j].begin(), pos[j].end());
  }
  std::vector<int64_t> from;
  const std::vector<uint32_t> got = exchange(req, from, b);
  st.recv_req.assign(got.begin(), got.end());
  st.recv_counts.assign(P, 0);
  // Owner: mix each request from its own rows, in the order of the model's local mixing
  // (e = 0; e += w_k row_k for k = 0..K-1), so a world of one gives the local result bit for bit.
  std::vector<std::vector<float>> reply(P);
  size_t off = 0;
  for (size_t j = 0; j < P; ++j) {
    st.recv_counts[j] = from[j] / words;
    reply[j].assign(static_cast<size_t>(st.recv_counts[j] * d), 0.0f);
    for (int64_t i = 0; i < st.recv_counts[j]; ++i, off += static_cast<size_t>(words)) {
      const int32_t id = static_cast<int32_t>(got[off]);
      check_owner(s, id);
      float* out = reply[j].data() + i * d;
      for (int64_t k = 0; k < K; ++k) {
        const int32_t t = static_cast<int32_t>(got[off + 1 + k]);
        JTOK_CHECK(t >= 0 && t < s.n_tables, "premix request for table ", t);
        const float wk = std::bit_cast<float>(got[off + 1 + K + k]);
        if (s.sync) s.sync(t, s.own.local(id));
        const float* r = s.row(t, id);
        mix_term(out, wk, r, d);
      }
    }
  }
  std::vector<int64_t> back;
  const std::vector<float> mixed = exchange(reply, back, b);
  for (size_t i = 0; i < st.send_pos.size(); ++i)
    std::memcpy(e + static_cast<int64_t>(st.send_pos[i]) * d, mixed.data() + i * d, sizeof(float) * d);
  return b;
}

ExchangeBytes2 premix_backward(float* dw, TableShard& s, const PremixState& st, const float* de) {
  const size_t P = static_cast<size_t>(world_size());
  const int64_t d = s.dim, K = st.K, words = 1 + 2 * K;
  ExchangeBytes2 b;
  std::vector<std::vector<float>> msg(P);
  for (size_t j = 0, i = 0; j < P; ++j)
    for (int64_t q = 0; q < st.send_counts[j]; ++q, ++i)
      msg[j].insert(msg[j].end(), de + static_cast<int64_t>(st.send_pos[i]) * d, de + static_cast<int64_t>(st.send_pos[i] + 1) * d);
  std::vector<int64_t> from;
  const std::vector<float> got = exchange(msg, from, b);
  // Owner: per request, dL/dw_k = de . row_k and row_k's gradient += w_k de.
  std::vector<std::vector<float>> reply(P);
  size_t q = 0;
  for (size_t j = 0; j < P; ++j) {
    JTOK_CHECK(from[j] == st.recv_counts[j] * d, "premix backward: rank ", j, " sent ", from[j], " floats");
    reply[j].resize(static_cast<size_t>(st.recv_counts[j] * K));
    for (int64_t i = 0; i < st.recv_counts[j]; ++i, ++q) {
      const uint32_t* r = st.recv_req.data() + q * words;
      const int32_t id = static_cast<int32_t>(r[0]);
      const float* g = got.data() + q * d;
      for (int64_t k = 0; k < K; ++k) {
        const int32_t t = static_cast<int32_t>(r[1 + k]);
        const float wk = std::bit_cast<float>(r[1 + K + k]);
        const float* row = s.row(t, id);
        const float acc = mix_term_dw(g, row, d);
        reply[j][static_cast<size_t>(i * K + k)] = acc;
        float* gr = s.grads[t].row(static_cast<int32_t>(s.own.local(id)));
        mix_term_grad(gr, wk, g, d);
      }
    }
  }
  std::vector<int64_t> back;
  const std::vector<float> dws = exchange(reply, back, b);
  for (size_t i = 0; i < st.send_pos.size(); ++i)
    std::memcpy(dw + static_cast<int64_t>(st.send_pos[i]) * K, dws.data() + i * K, sizeof(float) * K);
  return b;
}

ExchangeBytes2 naive_fetch(float* rows, const TableShard& s, const std::vector<int32_t>& pair_ids,
                           const std::vector<int32_t>& pair_tables) {
  const size_t P = static_cast<size_t>(world_size());
  const int64_t d = s.dim;
  ExchangeBytes2 b;
  std::vector<std::vector<int32_t>> req(P), where(P);
  for (size_t q = 0; q < pair_ids.size(); ++q) {
    const int o = s.own.owner(pair_ids[q]);
    req[o].push_back(pair_ids[q]);
    req[o].push_back(pair_tables[q]);
    where[o].push_back(static_cast<int32_t>(q));
  }
  std::vector<int64_t> from;
  const std::vector<int32_t> got = exchange(req, from, b);
  std::vector<std::vector<float>> reply(P);
  for (size_t j = 0, off = 0; j < P; off += static_cast<size_t>(from[j]), ++j) {
    reply[j].resize(static_cast<size_t>(from[j] / 2 * d));
    for (int64_t i = 0; i < from[j] / 2; ++i) {
      const int32_t id = got[off + 2 * i], t = got[off + 2 * i + 1];
      check_owner(s, id);
      JTOK_CHECK(t >= 0 && t < s.n_tables, "naive request for table ", t);
      if (s.sync) s.sync(t, s.own.local(id));
      std::memcpy(reply[j].data() + i * d, s.row(t, id), sizeof(float) * d);
    }
  }
  std::vector<int64_t> back;
  const std::vector<float> got_rows = exchange(reply, back, b);
  for (size_t j = 0, off = 0; j < P; off += static_cast<size_t>(back[j]), ++j)
    for (size_t i = 0; i < where[j].size(); ++i)
      std::memcpy(rows + static_cast<int64_t>(where[j][i]) * d, got_rows.data() + off + i * d, sizeof(float) * d);
  return b;
}

ExchangeBytes2 push_pair_grads(TableShard& s, const std::vector<int32_t>& pair_ids, const std::vector<int32_t>& pair_tables,
                               const float* grows) {
  const size_t P = static_cast<size_t>(world_size());
  const int64_t d = s.dim;
  ExchangeBytes2 b;
  std::vector<std::vector<uint32_t>> msg(P);
  for (size_t q = 0; q < pair_ids.size(); ++q) {
    auto& m = msg[s.own.owner(pair_ids[q])];
    m.push_back(static_cast<uint32_t>(pair_ids[q]));
    m.push_back(static_cast<uint32_t>(pair_tables[q]));
    for (int64_t j = 0; j < d; ++j) m.push_back(std::bit_cast<uint32_t>(grows[static_cast<int64_t>(q) * d + j]));
  }
  std::vector<int64_t> from;
  const std::vector<uint32_t> got = exchange(msg, from, b);
  for (size_t i = 0; i < got.size(); i += static_cast<size_t>(2 + d)) {
    const int32_t id = static_cast<int32_t>(got[i]), t = static_cast<int32_t>(got[i + 1]);
    check_owner(s, id);
    float* g = s.grads[t].row(static_cast<int32_t>(s.own.local(id)));
    for (int64_t j = 0; j < d; ++j) g[j] += std::bit_cast<float>(got[i + 2 + j]);
  }
  return b;
}

}  // namespace jtok::dist
