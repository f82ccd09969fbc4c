// src/dist/communicator: alone (ctest runs it without mpirun: a world of one, no MPI) and under
// `mpirun -np 2` (tests/test_dist_comm.sh). Every check computes the expected result from data all
// ranks can regenerate (a seed per rank), so the same assertions hold for any world size.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "dist/communicator.h"
#include "dist/data_parallel.h"
#include "model/transformer.h"

using namespace jtok;

namespace {

struct DistEnv : ::testing::Environment {
  void SetUp() override { dist::init(nullptr, nullptr); }
  void TearDown() override { dist::finalize(); }
};
const auto* env = ::testing::AddGlobalTestEnvironment(new DistEnv);

std::vector<float> rank_data(int r, int64_t n) {
  std::mt19937 g(1000u + static_cast<unsigned>(r));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = nd(g) * (1.0f + static_cast<float>(r));
  return v;
}

}  // namespace

TEST(DistComm, WorldShape) {
  EXPECT_GE(dist::world_size(), 1);
  EXPECT_GE(dist::rank(), 0);
  EXPECT_LT(dist::rank(), dist::world_size());
  EXPECT_EQ(dist::active(), dist::launched_by_mpi());
  if (!dist::launched_by_mpi()) {
    EXPECT_EQ(dist::world_size(), 1);
  }
}

// The sum is ((x_0 + x_1) + x_2) ... in rank order, bit for bit, on every rank; sizes that do not
// divide by P, and fewer elements than ranks, included.
TEST(DistComm, AllreduceSumIsRankOrderSum) {
  const int P = dist::world_size();
  for (int64_t n : {1, 3, 1000, 4099}) {
    std::vector<float> mine = rank_data(dist::rank(), n);
    std::vector<float> want = rank_data(0, n);
    for (int r = 1; r < P; ++r) {
      std::vector<float> o = rank_data(r, n);
      for (int64_t i = 0; i < n; ++i) want[i] = want[i] + o[i];
    }
    dist::allreduce_sum(mine.data(), n);
    ASSERT_EQ(0, std::memcmp(mine.data(), want.data(), sizeof(float) * n)) << "n=" << n;
    std::vector<double> d(static_cast<size_t>(n)), dw(static_cast<size_t>(n), 0.0);
    for (int64_t i = 0; i < n; ++i) d[i] = 0.5 * (dist::rank() + 1) + i;
    for (int r = 0; r < P; ++r)
      for (int64_t i = 0; i < n; ++i) dw[i] += 0.5 * (r + 1) + i;
    dist::allreduce_sum(d.data(), n);
    ASSERT_EQ(d, dw);
  }
  int64_t c[2] = {dist::rank(), 1};
  dist::allreduce_sum(c, 2);
  EXPECT_EQ(c[0], static_cast<int64_t>(P) * (P - 1) / 2);
  EXPECT_EQ(c[1], P);
  double m = 10.0 * dist::rank();
  dist::allreduce_max(&m, 1);
  EXPECT_EQ(m, 10.0 * (P - 1));
}

// Rank r sends (r + 1) * (j + 1) int32 values "r*100 + j" to rank j (0 bytes for nothing included
// when P > 2 would make it so: rank 0 sends nothing to itself).
TEST(DistComm, AlltoallvDeliversEachBlock) {
  const int P = dist::world_size(), me = dist::rank();
  std::vector<int64_t> sc(P);
  for (int j = 0; j < P; ++j) sc[j] = (me == 0 && j == 0 && P > 1) ? 0 : int64_t((me + 1) * (j + 1)) * 4;
  std::vector<int64_t> so = dist::prefix_offsets(sc);
  std::vector<int32_t> send(static_cast<size_t>((so.back() + sc.back()) / 4));
  for (int j = 0; j < P; ++j)
    for (int64_t i = 0; i < sc[j] / 4; ++i) send[so[j] / 4 + i] = me * 100 + j;
  std::vector<int64_t> rc = dist::exchange_counts(sc);
  for (int j = 0; j < P; ++j)
    EXPECT_EQ(rc[j], (j == 0 && me == 0 && P > 1) ? 0 : int64_t((j + 1) * (me + 1)) * 4) << "from " << j;
  std::vector<int64_t> ro = dist::prefix_offsets(rc);
  std::vector<int32_t> recv(static_cast<size_t>((ro.back() + rc.back()) / 4), -1);
  dist::alltoallv(send.data(), sc, so, recv.data(), rc, ro);
  for (int j = 0; j < P; ++j)
    for (int64_t i = 0; i < rc[j] / 4; ++i) ASSERT_EQ(recv[ro[j] / 4 + i], j * 100 + me);
}

TEST(DistComm, AllgathervConcatenatesInRankOrder) {
  const int P = dist::world_size(), me = dist::rank();
  std::string mine(static_cast<size_t>(me + 1), static_cast<char>('a' + me));
  std::vector<int64_t> sizes;
  std::vector<char> all = dist::allgatherv(mine.data(), static_cast<int64_t>(mine.size()), &sizes);
  std::string want;
  for (int r = 0; r < P; ++r) want += std::string(static_cast<size_t>(r + 1), static_cast<char>('a' + r));
  EXPECT_EQ(std::string(all.begin(), all.end()), want);
  ASSERT_EQ(sizes.size(), static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) EXPECT_EQ(sizes[r], r + 1);
  int64_t v = me == 0 ? 77 : -1;
  dist::broadcast(&v, sizeof v, 0);
  EXPECT_EQ(v, 77);
  dist::barrier();
}

// The non-blocking bucketed sum gives allreduce_sum's bits: buckets of uneven sizes (0, fewer
// elements than ranks, not divisible by P), started in an order other than the buffer's, with
// progress() polled between them and other collectives in flight meanwhile.
TEST(DistComm, BucketedSumEqualsBlockingSum) {
  const int64_t n = 10007;
  std::vector<float> blocking = rank_data(dist::rank(), n), bucketed = blocking;
  dist::allreduce_sum(blocking.data(), n);
  const std::vector<int64_t> cut = {0, 1, 2, 2, 5000, 9000, 10007};  // buckets [cut[i], cut[i+1])
  dist::BucketedSum sum;
  for (size_t b = cut.size() - 1; b-- > 0;) {
    sum.start(bucketed.data() + cut[b], cut[b + 1] - cut[b]);
    sum.progress();
    double x = 1;
    dist::allreduce_max(&x, 1);  // a collective on the world communicator between buckets
    EXPECT_EQ(x, 1.0);
  }
  EXPECT_EQ(sum.buckets(), dist::world_size() > 1 ? 5 : 0);  // the empty bucket posts nothing
  sum.wait();
  ASSERT_EQ(0, std::memcmp(blocking.data(), bucketed.data(), sizeof(float) * n));
  const int64_t P = dist::world_size();
  if (P > 1) {
    EXPECT_GT(sum.take_sent(), 0);
  }
  EXPECT_EQ(sum.take_sent(), 0);
  // Reused for a second round (the trainer's next step), same bits again.
  std::vector<float> again = rank_data(dist::rank(), n);
  sum.start(again.data(), n);
  sum.wait();
  ASSERT_EQ(0, std::memcmp(blocking.data(), again.data(), sizeof(float) * n));
}

// The trainer's path: a model's backward calls the hook once per layer (last to first), each call
// starts that layer's bucket, and after sum_gradients the gradient is bit for bit the blocking
// sum's (MoE + JTok + JTok-M, untied head: every kind of parameter range).
TEST(DistComm, GradBucketsDuringBackwardEqualBlockingSum) {
  ModelConfig c;
  c.model_type = "jtok_moe";
  c.vocab_size = 50;
  c.vocab_pad_multiple = 16;
  c.hidden_size = 16;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.intermediate_size = 24;
  c.max_position_embeddings = 16;
  c.tie_word_embeddings = false;
  c.first_k_dense_replace = 1;
  c.n_routed_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 8;
  c.jtok = true;
  c.jtok_layers = "1";
  c.jtokm = true;
  c.jtokm_layers = "all";
  c.jtokm_n_e = 3;
  c.jtokm_top_k = 2;
  const int64_t B = 2, T = 8;
  std::mt19937 g(77u + static_cast<unsigned>(dist::rank()));  // each rank its own tokens
  std::vector<int32_t> ids(B * T), tgt(B * T);
  for (auto& v : ids) v = static_cast<int32_t>(g() % 50);
  for (auto& v : tgt) v = static_cast<int32_t>(g() % 50);
  auto run = [&](bool overlap) {
    Model m = make_model(c, 5);
    Activations acts;
    dist::GradBuckets buckets(m);
    std::vector<int64_t> order;
    if (overlap)
      acts.on_layer_grads_ready = [&](int64_t l) {
        order.push_back(l);
        buckets.layer_ready(m, l);
      };
    zero_grads(m);
    forward(m, acts, ids.data(), B, T);
    backward(m, acts, ids.data(), tgt.data(), 0.5f);
    if (overlap) {
      EXPECT_EQ(order, (std::vector<int64_t>{2, 1, 0}));
      EXPECT_EQ(buckets.started(), dist::world_size() > 1 ? 3 : 0);
    }
    dist::sum_gradients(m, false, overlap ? &buckets : nullptr);
    return m.grads;
  };
  const FloatBuffer blocking = run(false), overlapped = run(true);
  ASSERT_EQ(blocking.size(), overlapped.size());
  ASSERT_EQ(0, std::memcmp(blocking.data(), overlapped.data(), sizeof(float) * blocking.size()));
}

// The request-reply exchange (JTok's rows posted once per forward): every rank asks every rank
// (itself included) for items, of different counts (none included), and gets each owner's answer
// in request order; progress() between a collective and the wait.
TEST(DistComm, RequestReplyAnswersEveryRequestInOrder) {
  const int P = dist::world_size(), me = dist::rank();
  for (int round = 0; round < 2; ++round) {
    std::vector<std::vector<int32_t>> req(static_cast<size_t>(P));
    for (int j = 0; j < P; ++j)
      for (int i = 0; i < (me + 2 * j + round) % 4; ++i) {  // 2 words per item: (i, me)
        req[static_cast<size_t>(j)].push_back(100 * j + i);
        req[static_cast<size_t>(j)].push_back(me);
      }
    const std::vector<std::vector<int32_t>> sent = req;
    const int64_t R = 3;
    int served_from_self = 0;
    dist::RequestReply rr(std::move(req), 2, R, [&](int src, const int32_t* q, int64_t n, float* out) {
      if (src == me) ++served_from_self;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(q[2 * i + 1], src);
        ASSERT_EQ(q[2 * i] / 100, me);  // asked of its owner
        for (int64_t r = 0; r < R; ++r) out[i * R + r] = static_cast<float>(q[2 * i] * 10 + r + 1000 * me);
      }
    });
    double x = 1;
    dist::allreduce_max(&x, 1);
    rr.progress();
    rr.wait();
    EXPECT_TRUE(rr.done());
    EXPECT_EQ(served_from_self, 1);
    for (int j = 0; j < P; ++j) {
      const auto& q = sent[static_cast<size_t>(j)];
      const auto& rep = rr.reply(j);
      ASSERT_EQ(rep.size(), q.size() / 2 * R);
      for (size_t i = 0; i < q.size() / 2; ++i)
        for (int64_t r = 0; r < R; ++r) EXPECT_EQ(rep[i * R + r], static_cast<float>(q[2 * i] * 10 + r + 1000 * j));
    }
    if (P == 1) {
      EXPECT_EQ(rr.sent_bytes(), 0);
    }
  }
}

// Several exchanges in flight at once (each has tags of its own: none takes another's messages),
// completed out of posting order; one-way pushes (no reply) in ordered mode serve their sources
// strictly in rank order whatever arrives first (the owners' order of sums: dist/sharded_tables.h).
TEST(DistComm, RequestReplyExchangesInFlightTogetherAndOrderedPushes) {
  const int P = dist::world_size(), me = dist::rank();
  std::vector<std::vector<int32_t>> ask(static_cast<size_t>(P)), pushb(static_cast<size_t>(P)), pushc(static_cast<size_t>(P));
  for (int j = 0; j < P; ++j) {
    ask[static_cast<size_t>(j)] = {10 * me + j, 20 * me + j};        // 2 items of 1 word
    for (int i = 0; i < 3 + me; ++i) pushb[static_cast<size_t>(j)].insert(pushb[static_cast<size_t>(j)].end(), {me, i});
    pushc[static_cast<size_t>(j)] = {me, 1000 + j};
  }
  std::vector<int> order_b, order_c;
  int64_t items_b = 0;
  dist::RequestReply a(ask, 1, 2, [&](int src, const int32_t* q, int64_t n, float* out) {
    for (int64_t i = 0; i < n; ++i) out[2 * i] = static_cast<float>(q[i]), out[2 * i + 1] = static_cast<float>(src + 100 * me);
  });
  dist::RequestReply b(pushb, 2, 0, [&](int src, const int32_t* q, int64_t n, float*) {
    order_b.push_back(src);
    items_b += n;
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(q[2 * i], src);
  }, /*ordered=*/true);
  dist::RequestReply c(pushc, 2, 0, [&](int src, const int32_t* q, int64_t n, float*) {
    order_c.push_back(src);
    ASSERT_EQ(n, 1);
    EXPECT_EQ(q[0], src);
    EXPECT_EQ(q[1], 1000 + me);
  }, /*ordered=*/true);
  double x = 1;
  dist::allreduce_max(&x, 1);
  b.progress();
  c.progress();
  c.wait();
  b.wait();
  a.wait();
  std::vector<int> ranks(static_cast<size_t>(P));
  for (int j = 0; j < P; ++j) ranks[static_cast<size_t>(j)] = j;
  EXPECT_EQ(order_b, ranks);
  EXPECT_EQ(order_c, ranks);
  EXPECT_TRUE(b.served() && c.served());
  int64_t want_items = 0;
  for (int j = 0; j < P; ++j) want_items += 3 + j;
  EXPECT_EQ(items_b, want_items);
  for (int j = 0; j < P; ++j) {
    const auto& rep = a.reply(j);
    ASSERT_EQ(rep.size(), 4u);
    EXPECT_EQ(rep[0], static_cast<float>(10 * me + j));
    EXPECT_EQ(rep[1], static_cast<float>(me + 100 * j));
    EXPECT_EQ(rep[2], static_cast<float>(20 * me + j));
    EXPECT_TRUE(b.reply(j).empty() && c.reply(j).empty());  // a push has no reply
  }
  // Pushes count their requests only: sent 4 B x 2 words per item to each other rank.
  int64_t sent_b = 0;
  for (int j = 0; j < P; ++j)
    if (j != me) sent_b += static_cast<int64_t>(pushb[static_cast<size_t>(j)].size()) * 4;
  EXPECT_EQ(b.sent_bytes(), sent_b);
}
