#include "dist/embedding_parallel.h"

#include <bit>
#include <cstring>

#include "core/error.h"
#include "dist/communicator.h"
#include "model/jtokm_mix.h"

namespace jtok::dist {

namespace {

void check_owner(const TableShard& s, int64_t id) {
  JTOK_CHECK(id >= 0 && id < s.own.V && s.own.owner(id) == s.rank, "rank ", s.rank, " asked for row ", id, " it does not own");
}
void check_table(const TableShard& s, int64_t t, const char* what) {
  JTOK_CHECK(t >= 0 && t < s.n_tables, what, " for table ", t, " of a group of ", s.n_tables);
}

// Posts the exchange, waits for it, counts its bytes.
void post_and_wait(TableBytes& b, std::vector<std::vector<int32_t>> req, int64_t item, int64_t reply_floats,
                   RequestReply::Serve serve, std::unique_ptr<RequestReply>* keep = nullptr) {
  auto rr = std::make_unique<RequestReply>(std::move(req), item, reply_floats, std::move(serve), /*ordered=*/true);
  rr->wait();
  b.add({rr->sent_bytes(), rr->recv_bytes()});
  if (keep) *keep = std::move(rr);
}

}  // namespace

int64_t RowOwner::rows_on(int r) const {
  if (kind == kModP) return V > r ? (V - r + P - 1) / P : 0;
  const int64_t lo = std::min(V, r * chunk()), hi = std::min(V, lo + chunk());
  return hi - lo;
}

int64_t TableShard::table_bytes() const { return n_tables * rows * dim * static_cast<int64_t>(sizeof(float)); }

std::vector<int32_t> owned_ids(const RowOwner& own, int rank) {
  std::vector<int32_t> ids(static_cast<size_t>(own.rows_on(rank)));
  for (size_t r = 0; r < ids.size(); ++r) ids[r] = static_cast<int32_t>(own.global(rank, static_cast<int64_t>(r)));
  return ids;
}

TableShard make_shard(const RowOwner& own, int rank, int64_t n_tables, int64_t dim, const std::vector<const float*>& full) {
  JTOK_CHECK(full.empty() || static_cast<int64_t>(full.size()) == n_tables);
  TableShard s;
  s.own = own;
  s.rank = rank;
  s.n_tables = n_tables;
  s.dim = dim;
  s.rows = own.rows_on(rank);
  const int64_t first = own.kind == RowOwner::kModP ? rank : rank * own.chunk();
  const int64_t stride = own.kind == RowOwner::kModP ? own.P : 1;
  for (int64_t t = 0; t < n_tables; ++t) s.tables.push_back(TokenTable::shard_in_ram(own.V, first, stride, s.rows, dim));
  s.grads.resize(static_cast<size_t>(n_tables));
  for (auto& g : s.grads) g.init(s.rows, dim);
  if (!full.empty()) {
    const std::vector<int32_t> ids = owned_ids(own, rank);
    std::vector<float> rows(static_cast<size_t>(s.rows * dim));
    for (int64_t t = 0; t < n_tables; ++t) {
      for (int64_t r = 0; r < s.rows; ++r) std::memcpy(rows.data() + r * dim, full[t] + ids[r] * dim, sizeof(float) * dim);
      scatter_rows(s.tables[t], ids.data(), rows.data(), s.rows);
    }
  }
  return s;
}

void serve_rows(const TableShard& s, int64_t t, const int32_t* ids, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) check_owner(s, ids[i]);
  gather_rows(out, s.tables[static_cast<size_t>(t)], ids, n, s.sync, t);
}

void serve_pairs(const TableShard& s, const int32_t* req, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    check_owner(s, req[2 * i]);
    check_table(s, req[2 * i + 1], "naive request");
    gather_rows(out + i * s.dim, s.tables[static_cast<size_t>(req[2 * i + 1])], req + 2 * i, 1, s.sync, req[2 * i + 1]);
  }
}

void serve_premix(const TableShard& s, const int32_t* req, int64_t n, int64_t K, float* out) {
  const int64_t words = 1 + 2 * K, d = s.dim;
  std::vector<float> rows(static_cast<size_t>(K * d));
  for (int64_t i = 0; i < n; ++i) {
    const int32_t* r = req + i * words;
    check_owner(s, r[0]);
    for (int64_t k = 0; k < K; ++k) {
      check_table(s, r[1 + k], "premix request");
      gather_rows(rows.data() + k * d, s.tables[static_cast<size_t>(r[1 + k])], r, 1, s.sync, r[1 + k]);
    }
    const float* w = reinterpret_cast<const float*>(r + 1 + K);
    mix_position(out + i * d, [&](int64_t k) { return rows.data() + k * d; }, w, K, d);
  }
}

void serve_premix_backward(TableShard& s, const int32_t* req, const float* de, int64_t n, int64_t K, float* dw) {
  const int64_t words = 1 + 2 * K, d = s.dim;
  std::vector<float> rows(static_cast<size_t>(K * d));
  for (int64_t i = 0; i < n; ++i) {
    const int32_t* r = req + i * words;
    const float* g = de + i * d;
    for (int64_t k = 0; k < K; ++k) gather_rows(rows.data() + k * d, s.tables[static_cast<size_t>(r[1 + k])], r, 1);
    mix_position_dw(dw + i * K, g, [&](int64_t k) { return rows.data() + k * d; }, K, d);
    for (int64_t k = 0; k < K; ++k) mix_term_grad(s.grad_row(r[1 + k], r[0]), std::bit_cast<float>(r[1 + K + k]), g, d);
  }
}

void add_pushed_grads(TableShard& s, const int32_t* msg, int64_t n, bool pairs, int64_t table) {
  const int64_t head = pairs ? 2 : 1, item = head + s.dim;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t* r = msg + i * item;
    const int64_t t = pairs ? r[1] : table;
    JTOK_CHECK(r[0] >= 0 && r[0] < s.own.V && s.own.owner(r[0]) == s.rank, "rank ", s.rank, " got a gradient for row ",
               r[0], " it does not own");
    check_table(s, t, "gradient push");
    float* g = s.grad_row(t, r[0]);
    const float* x = reinterpret_cast<const float*>(r + head);
    for (int64_t j = 0; j < s.dim; ++j) g[j] += x[j];
  }
}

OwnerRequests route_to_owners(const RowOwner& own, const int32_t* ids, const int32_t* tables, size_t n) {
  OwnerRequests r;
  r.req.assign(static_cast<size_t>(own.P), {});
  r.where.assign(r.req.size(), {});
  for (size_t i = 0; i < n; ++i) {
    const size_t o = static_cast<size_t>(own.owner(ids[i]));
    r.req[o].push_back(ids[i]);
    if (tables) r.req[o].push_back(tables[i]);
    r.where[o].push_back(static_cast<int32_t>(i));
  }
  return r;
}

std::vector<std::vector<int32_t>> premix_requests(PremixState& st, const RowOwner& own, const int32_t* ids,
                                                  const int32_t* sel, const float* w, int64_t N, int64_t K,
                                                  const char* premixed) {
  const size_t P = static_cast<size_t>(own.P);
  st.K = K;
  st.N = N;
  st.where.assign(P, {});
  st.recv.assign(P, {});
  std::vector<std::vector<int32_t>> req(P);
  for (int64_t n = 0; n < N; ++n) {
    if (premixed && !premixed[n]) continue;
    const size_t o = static_cast<size_t>(own.owner(ids[n]));
    auto& r = req[o];
    r.push_back(ids[n]);
    for (int64_t k = 0; k < K; ++k) r.push_back(sel[n * K + k]);
    for (int64_t k = 0; k < K; ++k) r.push_back(std::bit_cast<int32_t>(w[n * K + k]));
    st.where[o].push_back(static_cast<int32_t>(n));
  }
  return req;
}

RequestReply::Serve premix_serve(TableShard& s, PremixState& st) {
  return [&s, &st](int src, const int32_t* q, int64_t n, float* out) {
    st.recv[static_cast<size_t>(src)].assign(q, q + n * (1 + 2 * st.K));  // for the backward
    serve_premix(s, q, n, st.K, out);
  };
}

RequestReply::Serve premix_backward_serve(TableShard& s, PremixState& st) {
  return [&s, &st](int src, const int32_t* q, int64_t n, float* out) {
    const std::vector<int32_t>& fw = st.recv[static_cast<size_t>(src)];
    JTOK_CHECK(static_cast<int64_t>(fw.size()) == n * (1 + 2 * st.K), "premix backward: rank ", src, " sent ", n,
               " gradients for ", fw.size() / static_cast<size_t>(1 + 2 * st.K), " forward requests");
    serve_premix_backward(s, fw.data(), reinterpret_cast<const float*>(q), n, st.K, out);
  };
}

std::vector<std::vector<int32_t>> premix_backward_messages(const PremixState& st, const float* de, int64_t d) {
  std::vector<std::vector<int32_t>> msg(st.where.size());
  for (size_t j = 0; j < st.where.size(); ++j) {
    msg[j].resize(st.where[j].size() * static_cast<size_t>(d));
    for (size_t i = 0; i < st.where[j].size(); ++i)
      std::memcpy(msg[j].data() + i * static_cast<size_t>(d), de + static_cast<int64_t>(st.where[j][i]) * d, sizeof(float) * d);
  }
  return msg;
}

void place_replies(float* out, const std::vector<std::vector<int32_t>>& where, const RequestReply& rr, int64_t width) {
  for (size_t j = 0; j < where.size(); ++j) {
    const std::vector<float>& rep = rr.reply(static_cast<int>(j));
    for (size_t i = 0; i < where[j].size(); ++i)
      std::memcpy(out + static_cast<int64_t>(where[j][i]) * width, rep.data() + static_cast<int64_t>(i) * width,
                  sizeof(float) * width);
  }
}

TableBytes fetch_rows(float* out, const TableShard& s, int64_t table, const RowBatch& rb) {
  OwnerRequests r = route_to_owners(s.own, rb.unique.data(), nullptr, rb.unique.size());
  TableBytes b;
  std::unique_ptr<RequestReply> rr;
  post_and_wait(b, std::move(r.req), 1, s.dim,
                [&s, table](int, const int32_t* ids, int64_t n, float* o) { serve_rows(s, table, ids, n, o); }, &rr);
  place_replies(out, r.where, *rr, s.dim);
  return b;
}

std::vector<std::vector<int32_t>> grad_messages(const RowOwner& own, int64_t d, const std::vector<int32_t>& ids,
                                                       const std::vector<int32_t>* tables, const float* grows) {
  std::vector<std::vector<int32_t>> msg(static_cast<size_t>(own.P));
  for (size_t q = 0; q < ids.size(); ++q) {
    auto& m = msg[static_cast<size_t>(own.owner(ids[q]))];
    m.push_back(ids[q]);
    if (tables) m.push_back((*tables)[q]);
    const size_t at = m.size();
    m.resize(at + static_cast<size_t>(d));
    std::memcpy(m.data() + at, grows + static_cast<int64_t>(q) * d, sizeof(float) * d);
  }
  return msg;
}

TableBytes push_row_grads(TableShard& s, int64_t table, const std::vector<int32_t>& ids, const float* grows) {
  TableBytes b;
  post_and_wait(b, grad_messages(s.own, s.dim, ids, nullptr, grows), 1 + s.dim, 0,
                [&s, table](int, const int32_t* m, int64_t n, float*) { add_pushed_grads(s, m, n, false, table); });
  return b;
}

TableBytes premix_forward(float* e, PremixState& st, TableShard& s, const int32_t* ids, const int32_t* sel, const float* w,
                          int64_t N, int64_t K) {
  TableBytes b;
  std::unique_ptr<RequestReply> rr;
  post_and_wait(b, premix_requests(st, s.own, ids, sel, w, N, K), 1 + 2 * K, s.dim, premix_serve(s, st), &rr);
  place_replies(e, st.where, *rr, s.dim);
  return b;
}

TableBytes premix_backward(float* dw, TableShard& s, PremixState& st, const float* de) {
  TableBytes b;
  std::unique_ptr<RequestReply> rr;
  post_and_wait(b, premix_backward_messages(st, de, s.dim), s.dim, st.K, premix_backward_serve(s, st), &rr);
  place_replies(dw, st.where, *rr, st.K);
  return b;
}

TableBytes naive_fetch(float* rows, const TableShard& s, const std::vector<int32_t>& pair_ids,
                       const std::vector<int32_t>& pair_tables) {
  OwnerRequests r = route_to_owners(s.own, pair_ids.data(), pair_tables.data(), pair_ids.size());
  TableBytes b;
  std::unique_ptr<RequestReply> rr;
  post_and_wait(b, std::move(r.req), 2, s.dim, [&s](int, const int32_t* q, int64_t n, float* o) { serve_pairs(s, q, n, o); },
                &rr);
  place_replies(rows, r.where, *rr, s.dim);
  return b;
}

TableBytes push_pair_grads(TableShard& s, const std::vector<int32_t>& pair_ids, const std::vector<int32_t>& pair_tables,
                           const float* grows) {
  TableBytes b;
  post_and_wait(b, grad_messages(s.own, s.dim, pair_ids, &pair_tables, grows), 2 + s.dim, 0,
                [&s](int, const int32_t* m, int64_t n, float*) { add_pushed_grads(s, m, n, true, 0); });
  return b;
}

}  // namespace jtok::dist
