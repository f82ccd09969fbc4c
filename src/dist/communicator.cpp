#include "dist/communicator.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "core/error.h"

namespace jtok::dist {

namespace {

bool g_init = false;  // we called MPI_Init_thread and not yet MPI_Finalize
int g_rank = 0, g_size = 1;

int to_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX) fail("MPI exchange: ", what, " of ", v, " bytes does not fit an MPI int count (2 GiB per call)");
  return static_cast<int>(v);
}

void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  fail(call, " failed on rank ", g_rank, ": ", std::string(msg, static_cast<size_t>(len)));
}

std::atomic<const char*> g_call{nullptr};      // the MPI call this rank is in, or null
std::atomic<int64_t> g_call_since_ms{0};       // since when (steady clock)
int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
// Marks the time spent in one MPI call (watchdog.h reads it from another thread).
template <typename F>
void call(const char* name, F f) {
  g_call_since_ms.store(now_ms());
  g_call.store(name);
  const int rc = f();
  g_call.store(nullptr);
  check(rc, name);
}

// Reduce-scatter in rank order then allgather (see the header): T is float, double or int64_t.
template <typename T, typename Op>
void allreduce_fixed(T* buf, int64_t n, Op op) {
  if (g_size == 1 || n == 0) return;
  const int64_t P = g_size, chunk = (n + P - 1) / P;
  std::vector<int64_t> counts(static_cast<size_t>(P)), offs(static_cast<size_t>(P));
  for (int64_t j = 0; j < P; ++j) {
    const int64_t lo = std::min(n, j * chunk), hi = std::min(n, lo + chunk);
    offs[static_cast<size_t>(j)] = lo * static_cast<int64_t>(sizeof(T));
    counts[static_cast<size_t>(j)] = (hi - lo) * static_cast<int64_t>(sizeof(T));
  }
  const int64_t mine = counts[static_cast<size_t>(g_rank)] / static_cast<int64_t>(sizeof(T));
  // Every rank's copy of my chunk, rank after rank.
  std::vector<T> got(static_cast<size_t>(mine * P));
  std::vector<int64_t> rc(static_cast<size_t>(P), mine * static_cast<int64_t>(sizeof(T))), ro(static_cast<size_t>(P));
  for (int64_t j = 0; j < P; ++j) ro[static_cast<size_t>(j)] = j * mine * static_cast<int64_t>(sizeof(T));
  alltoallv(buf, counts, offs, got.data(), rc, ro);
  T* out = buf + offs[static_cast<size_t>(g_rank)] / static_cast<int64_t>(sizeof(T));
  for (int64_t i = 0; i < mine; ++i) out[i] = got[static_cast<size_t>(i)];
  for (int64_t j = 1; j < P; ++j) {
    const T* src = got.data() + j * mine;
    for (int64_t i = 0; i < mine; ++i) out[i] = op(out[i], src[i]);
  }
  // Allgather the reduced chunks in place.
  std::vector<int> c(static_cast<size_t>(P)), o(static_cast<size_t>(P));
  for (int64_t j = 0; j < P; ++j) {
    c[static_cast<size_t>(j)] = to_int(counts[static_cast<size_t>(j)], "allreduce chunk");
    o[static_cast<size_t>(j)] = to_int(offs[static_cast<size_t>(j)], "allreduce offset");
  }
  call("MPI_Allgatherv", [&] { return MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_BYTE, buf, c.data(), o.data(), MPI_BYTE, MPI_COMM_WORLD); });
}

}  // namespace


const char* current_call(double* seconds) {
  const char* c = g_call.load();
  if (c && seconds) *seconds = static_cast<double>(now_ms() - g_call_since_ms.load()) / 1e3;
  return c;
}

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

void init(int* argc, char*** argv) {
  if (g_init || !launched_by_mpi()) return;
  int provided = 0;
  check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  g_init = true;
  // Errors come back as return codes (turned into jtok::Error naming the call and rank) instead of
  // MPI's default of aborting without context.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  if (provided < MPI_THREAD_FUNNELED) fail("MPI provides thread level ", provided, ", jtok needs MPI_THREAD_FUNNELED");
}

void finalize() {
  if (!g_init) return;
  MPI_Finalize();
  g_init = false;
}

bool active() { return g_init; }
int rank() { return g_rank; }
int world_size() { return g_size; }

void allreduce_sum(float* buf, int64_t n) { allreduce_fixed(buf, n, [](float a, float b) { return a + b; }); }
void allreduce_sum(double* buf, int64_t n) { allreduce_fixed(buf, n, [](double a, double b) { return a + b; }); }
void allreduce_sum(int64_t* buf, int64_t n) { allreduce_fixed(buf, n, [](int64_t a, int64_t b) { return a + b; }); }
void allreduce_max(double* buf, int64_t n) { allreduce_fixed(buf, n, [](double a, double b) { return a > b ? a : b; }); }

void alltoallv(const void* send, const std::vector<int64_t>& send_counts, const std::vector<int64_t>& send_offsets,
               void* recv, const std::vector<int64_t>& recv_counts, const std::vector<int64_t>& recv_offsets) {
  const size_t P = static_cast<size_t>(g_size);
  JTOK_CHECK(send_counts.size() == P && send_offsets.size() == P && recv_counts.size() == P && recv_offsets.size() == P);
  if (g_size == 1) {
    JTOK_CHECK(send_counts[0] == recv_counts[0], "alltoallv with itself: sends ", send_counts[0], " receives ", recv_counts[0]);
    if (send_counts[0] > 0)
      std::memmove(static_cast<char*>(recv) + recv_offsets[0], static_cast<const char*>(send) + send_offsets[0],
                   static_cast<size_t>(send_counts[0]));
    return;
  }
  std::vector<int> sc(P), so(P), rc(P), ro(P);
  for (size_t j = 0; j < P; ++j) {
    sc[j] = to_int(send_counts[j], "send count");
    so[j] = to_int(send_offsets[j], "send offset");
    rc[j] = to_int(recv_counts[j], "receive count");
    ro[j] = to_int(recv_offsets[j], "receive offset");
  }
  // MPI wants non-null buffers for zero counts on some paths.
  static char dummy;
  call("MPI_Alltoallv", [&] { return MPI_Alltoallv(send ? send : &dummy, sc.data(), so.data(), MPI_BYTE, recv ? recv : &dummy, rc.data(), ro.data(),
                      MPI_BYTE, MPI_COMM_WORLD); });
}

std::vector<int64_t> exchange_counts(const std::vector<int64_t>& send_counts) {
  JTOK_CHECK(send_counts.size() == static_cast<size_t>(g_size));
  if (g_size == 1) return send_counts;
  std::vector<int64_t> recv(send_counts.size());
  call("MPI_Alltoall", [&] { return MPI_Alltoall(send_counts.data(), 1, MPI_INT64_T, recv.data(), 1, MPI_INT64_T, MPI_COMM_WORLD); });
  return recv;
}

std::vector<char> allgatherv(const void* bytes, int64_t n, std::vector<int64_t>* sizes) {
  std::vector<int64_t> all(static_cast<size_t>(g_size), n);
  if (g_size > 1) call("MPI_Allgather", [&] { return MPI_Allgather(&n, 1, MPI_INT64_T, all.data(), 1, MPI_INT64_T, MPI_COMM_WORLD); });
  const std::vector<int64_t> offs = prefix_offsets(all);
  std::vector<char> out(static_cast<size_t>(offs.back() + all.back()));
  if (g_size == 1) {
    if (n > 0) std::memcpy(out.data(), bytes, static_cast<size_t>(n));
  } else {
    std::vector<int> c(all.size()), o(all.size());
    for (size_t j = 0; j < all.size(); ++j) {
      c[j] = to_int(all[j], "allgather count");
      o[j] = to_int(offs[j], "allgather offset");
    }
    static char dummy;
    call("MPI_Allgatherv", [&] { return MPI_Allgatherv(n > 0 ? bytes : &dummy, c[static_cast<size_t>(g_rank)], MPI_BYTE, out.empty() ? &dummy : out.data(),
                         c.data(), o.data(), MPI_BYTE, MPI_COMM_WORLD); });
  }
  if (sizes) *sizes = all;
  return out;
}

void broadcast(void* buf, int64_t n, int root) {
  if (g_size == 1 || n == 0) return;
  call("MPI_Bcast", [&] { return MPI_Bcast(buf, to_int(n, "broadcast"), MPI_BYTE, root, MPI_COMM_WORLD); });
}

void barrier() {
  if (g_size > 1) call("MPI_Barrier", [&] { return MPI_Barrier(MPI_COMM_WORLD); });
}

void abort(const std::string& msg, int code) {
  if (g_size > 1) {
    std::fprintf(stderr, "jtok: error: rank %d of %d: %s\n", g_rank, g_size, msg.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
  } else {
    std::fprintf(stderr, "jtok: error: %s\n", msg.c_str());
    std::fflush(stderr);
  }
  std::fflush(stdout);
  std::_Exit(code);
}

// ---- BucketedSum ----------------------------------------------------------------------------

namespace {
MPI_Comm g_bucket_comm = MPI_COMM_NULL;  // a duplicate of MPI_COMM_WORLD: its tags never meet others'
}

struct BucketedSum::Bucket {
  float* p = nullptr;
  int64_t n = 0, tag = 0;
  std::vector<int64_t> lo, cnt;   // chunk of each rank
  std::vector<float> got;         // every other rank's copy of my chunk, in rank order (my slot unused)
  std::vector<MPI_Request> req;   // the posted phase's requests
  int phase = 0;                  // 1: reduce-scatter posted; 2: allgather posted; 3: done
};

BucketedSum::BucketedSum() {
  if (g_size > 1 && g_bucket_comm == MPI_COMM_NULL) {
    call("MPI_Comm_dup", [&] { return MPI_Comm_dup(MPI_COMM_WORLD, &g_bucket_comm); });
    MPI_Comm_set_errhandler(g_bucket_comm, MPI_ERRORS_RETURN);
  }
}

// Buckets still posted here mean an error is on its way to MPI_Abort (dist::abort): the requests
// are left to it.
BucketedSum::~BucketedSum() {
  for (Bucket* k : b_) delete k;
}

void BucketedSum::start(float* p, int64_t n) {
  if (g_size == 1 || n == 0) return;
  const int64_t tag_ub = 32767;  // the standard's guaranteed minimum of MPI_TAG_UB
  JTOK_CHECK(2 * static_cast<int64_t>(b_.size()) + 1 <= tag_ub, "too many buckets: ", b_.size());
  auto* k = new Bucket;
  b_.push_back(k);
  k->p = p;
  k->n = n;
  k->tag = 2 * static_cast<int64_t>(b_.size() - 1);
  const int64_t P = g_size, chunk = (n + P - 1) / P;
  k->lo.resize(static_cast<size_t>(P));
  k->cnt.resize(static_cast<size_t>(P));
  for (int64_t j = 0; j < P; ++j) {
    k->lo[static_cast<size_t>(j)] = std::min(n, j * chunk);
    k->cnt[static_cast<size_t>(j)] = std::min(n, k->lo[static_cast<size_t>(j)] + chunk) - k->lo[static_cast<size_t>(j)];
  }
  const int64_t mine = k->cnt[static_cast<size_t>(g_rank)];
  k->got.resize(static_cast<size_t>(mine * P));
  // Phase 1 (reduce-scatter): chunk j to rank j; every other rank's copy of my chunk into got.
  for (int j = 0; j < g_size; ++j) {
    if (j == g_rank) continue;
    const int64_t c = k->cnt[static_cast<size_t>(j)];
    if (c > 0) {
      k->req.emplace_back();
      call("MPI_Isend", [&] { return MPI_Isend(p + k->lo[static_cast<size_t>(j)], to_int(c, "bucket chunk"), MPI_FLOAT, j,
                                               static_cast<int>(k->tag), g_bucket_comm, &k->req.back()); });
      sent_ += c * static_cast<int64_t>(sizeof(float));
    }
    if (mine > 0) {
      k->req.emplace_back();
      call("MPI_Irecv", [&] { return MPI_Irecv(k->got.data() + j * mine, to_int(mine, "bucket chunk"), MPI_FLOAT, j,
                                               static_cast<int>(k->tag), g_bucket_comm, &k->req.back()); });
      recv_ += mine * static_cast<int64_t>(sizeof(float));
    }
  }
  k->phase = 1;
  progress();
}

void BucketedSum::advance(Bucket& k, bool block) {
  if (k.phase == 3) return;
  if (!k.req.empty()) {
    if (block) {
      call("MPI_Waitall", [&] { return MPI_Waitall(static_cast<int>(k.req.size()), k.req.data(), MPI_STATUSES_IGNORE); });
    } else {
      int done = 0;
      call("MPI_Testall", [&] { return MPI_Testall(static_cast<int>(k.req.size()), k.req.data(), &done, MPI_STATUSES_IGNORE); });
      if (!done) return;
    }
    k.req.clear();
  }
  if (k.phase == 1) {
    // My chunk summed in rank order, my own copy in its place: the order of allreduce_fixed.
    const int64_t mine = k.cnt[static_cast<size_t>(g_rank)];
    float* out = k.p + k.lo[static_cast<size_t>(g_rank)];
    std::copy(out, out + mine, k.got.data() + g_rank * mine);
    std::copy(k.got.data(), k.got.data() + mine, out);
    for (int j = 1; j < g_size; ++j) {
      const float* src = k.got.data() + j * mine;
      for (int64_t i = 0; i < mine; ++i) out[i] = out[i] + src[i];
    }
    std::vector<float>().swap(k.got);
    // Phase 2 (allgather): my summed chunk to every rank; theirs into place.
    for (int j = 0; j < g_size; ++j) {
      if (j == g_rank) continue;
      const int64_t c = k.cnt[static_cast<size_t>(j)];
      if (mine > 0) {
        k.req.emplace_back();
        call("MPI_Isend", [&] { return MPI_Isend(out, to_int(mine, "bucket chunk"), MPI_FLOAT, j, static_cast<int>(k.tag + 1),
                                                 g_bucket_comm, &k.req.back()); });
        sent_ += mine * static_cast<int64_t>(sizeof(float));
      }
      if (c > 0) {
        k.req.emplace_back();
        call("MPI_Irecv", [&] { return MPI_Irecv(k.p + k.lo[static_cast<size_t>(j)], to_int(c, "bucket chunk"), MPI_FLOAT, j,
                                                 static_cast<int>(k.tag + 1), g_bucket_comm, &k.req.back()); });
        recv_ += c * static_cast<int64_t>(sizeof(float));
      }
    }
    k.phase = 2;
    if (block) advance(k, true);
    return;
  }
  k.phase = 3;
}

void BucketedSum::progress() {
  // Buckets in the order they were started; each moves as far as its messages allow.
  for (Bucket* k : b_) advance(*k, false);
}

void BucketedSum::wait() {
  for (Bucket* k : b_) advance(*k, true);
  for (Bucket* k : b_) delete k;
  b_.clear();
}

// ---- RequestReply ---------------------------------------------------------------------------

namespace {
MPI_Comm g_rr_comm = MPI_COMM_NULL;
// Each exchange has three tags (count, requests, reply) from a sequence that every rank advances in
// the same order, so exchanges in flight at once never match each other's messages. 10,000
// exchanges' tags before the sequence wraps (tags up to 30,002: the standard guarantees 32,767);
// far more than are ever in flight.
int64_t g_rr_seq = 0;
constexpr int kTagCount = 0, kTagReq = 1, kTagReply = 2;
}

struct RequestReply::Impl {
  // Per peer j: my count to it, its count to me, its requests, my reply to it.
  std::vector<int64_t> my_count, its_count;
  std::vector<std::vector<int32_t>> its_req;
  std::vector<std::vector<float>> my_reply;
  std::vector<int> stage;                 // per peer: 0 count pending, 1 request pending, 2 served
  std::vector<MPI_Request> count_rq, req_rq;  // receives of its count, of its requests
  std::vector<MPI_Request> other;         // sends and reply receives: waited at the end
};

RequestReply::RequestReply(std::vector<std::vector<int32_t>> requests, int64_t item, int64_t reply_floats, Serve serve,
                           bool ordered)
    : impl_(new Impl), req_(std::move(requests)), item_(item), reply_floats_(reply_floats), serve_(std::move(serve)),
      ordered_(ordered) {
  const int P = g_size;
  JTOK_CHECK(static_cast<int>(req_.size()) == P && item_ > 0 && reply_floats_ >= 0);
  tag_ = static_cast<int>(3 * (g_rr_seq++ % 10000));
  if (P > 1 && g_rr_comm == MPI_COMM_NULL) {
    call("MPI_Comm_dup", [&] { return MPI_Comm_dup(MPI_COMM_WORLD, &g_rr_comm); });
    MPI_Comm_set_errhandler(g_rr_comm, MPI_ERRORS_RETURN);
  }
  Impl& x = *impl_;
  reply_.resize(static_cast<size_t>(P));
  x.my_count.assign(static_cast<size_t>(P), 0);
  x.its_count.assign(static_cast<size_t>(P), 0);
  x.its_req.resize(static_cast<size_t>(P));
  x.my_reply.resize(static_cast<size_t>(P));
  x.stage.assign(static_cast<size_t>(P), 0);
  x.count_rq.assign(static_cast<size_t>(P), MPI_REQUEST_NULL);
  x.req_rq.assign(static_cast<size_t>(P), MPI_REQUEST_NULL);
  for (int j = 0; j < P; ++j) {
    const size_t J = static_cast<size_t>(j);
    JTOK_CHECK(static_cast<int64_t>(req_[J].size()) % item_ == 0, "request of ", req_[J].size(), " words, items of ", item_);
    const int64_t n = static_cast<int64_t>(req_[J].size()) / item_;
    x.my_count[J] = n;
    reply_[J].resize(static_cast<size_t>(n * reply_floats_));
    if (j == g_rank) continue;
    call("MPI_Irecv", [&] { return MPI_Irecv(&x.its_count[J], 1, MPI_INT64_T, j, tag_ + kTagCount, g_rr_comm, &x.count_rq[J]); });
    x.other.emplace_back();
    call("MPI_Isend", [&] { return MPI_Isend(&x.my_count[J], 1, MPI_INT64_T, j, tag_ + kTagCount, g_rr_comm, &x.other.back()); });
    if (n > 0) {
      x.other.emplace_back();
      call("MPI_Isend", [&] { return MPI_Isend(req_[J].data(), to_int(n * item_, "request"), MPI_INT32_T, j, tag_ + kTagReq,
                                               g_rr_comm, &x.other.back()); });
      if (reply_floats_ > 0) {
        x.other.emplace_back();
        call("MPI_Irecv", [&] { return MPI_Irecv(reply_[J].data(), to_int(n * reply_floats_, "reply"), MPI_FLOAT, j,
                                                 tag_ + kTagReply, g_rr_comm, &x.other.back()); });
      }
      sent_ += n * item_ * 4;
      recv_ += n * reply_floats_ * 4;
    }
  }
  progress();
}

RequestReply::~RequestReply() { delete impl_; }  // not waited: an error is on its way to MPI_Abort

void RequestReply::step(bool block) {
  Impl& x = *impl_;
  const int P = g_size;
  for (int j = 0; j < P; ++j) {
    const size_t J = static_cast<size_t>(j);
    if (x.stage[J] == 2) continue;
    if (j == g_rank) {  // my requests to myself
      serve_(j, req_[J].data(), x.my_count[J], reply_[J].data());
      x.stage[J] = 2;
      continue;
    }
    if (x.stage[J] == 0) {
      int got = 0;
      if (block) call("MPI_Wait", [&] { got = 1; return MPI_Wait(&x.count_rq[J], MPI_STATUS_IGNORE); });
      else call("MPI_Test", [&] { return MPI_Test(&x.count_rq[J], &got, MPI_STATUS_IGNORE); });
      if (!got) {
        if (ordered_) return;  // src j first
        continue;
      }
      const int64_t n = x.its_count[J];
      x.its_req[J].resize(static_cast<size_t>(n * item_));
      if (n > 0)
        call("MPI_Irecv", [&] { return MPI_Irecv(x.its_req[J].data(), to_int(n * item_, "request"), MPI_INT32_T, j,
                                                 tag_ + kTagReq, g_rr_comm, &x.req_rq[J]); });
      x.stage[J] = 1;
    }
    if (x.stage[J] == 1) {
      int got = 1;
      if (x.req_rq[J] != MPI_REQUEST_NULL) {
        if (block) call("MPI_Wait", [&] { return MPI_Wait(&x.req_rq[J], MPI_STATUS_IGNORE); });
        else call("MPI_Test", [&] { return MPI_Test(&x.req_rq[J], &got, MPI_STATUS_IGNORE); });
      }
      if (!got) {
        if (ordered_) return;
        continue;
      }
      const int64_t n = x.its_count[J];
      x.my_reply[J].resize(static_cast<size_t>(n * reply_floats_));
      serve_(j, x.its_req[J].data(), n, x.my_reply[J].data());
      std::vector<int32_t>().swap(x.its_req[J]);
      if (n > 0) {
        if (reply_floats_ > 0) {
          x.other.emplace_back();
          call("MPI_Isend", [&] { return MPI_Isend(x.my_reply[J].data(), to_int(n * reply_floats_, "reply"), MPI_FLOAT, j,
                                                   tag_ + kTagReply, g_rr_comm, &x.other.back()); });
        }
        sent_ += n * reply_floats_ * 4;
        recv_ += n * item_ * 4;
      }
      x.stage[J] = 2;
    }
  }
}

bool RequestReply::served() const {
  if (done_) return true;
  for (int s : impl_->stage)
    if (s != 2) return false;
  return true;
}

void RequestReply::progress() {
  if (!done_) step(false);
}

void RequestReply::wait() {
  if (done_) return;
  step(true);
  Impl& x = *impl_;
  if (!x.other.empty())
    call("MPI_Waitall", [&] { return MPI_Waitall(static_cast<int>(x.other.size()), x.other.data(), MPI_STATUSES_IGNORE); });
  x.other.clear();
  done_ = true;
}

std::vector<int64_t> prefix_offsets(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> offs(sizes.size(), 0);
  for (size_t j = 1; j < sizes.size(); ++j) offs[j] = offs[j - 1] + sizes[j - 1];
  return offs;
}

}  // namespace jtok::dist
