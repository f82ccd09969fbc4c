// The one door to MPI: process-group setup and the few collectives the distributed
// trainer needs. Only src/dist, src/train and apps include this; the model knows no MPI.
//
// World of one: a process not started by an MPI launcher (mpirun / mpiexec) never calls MPI at
// all: rank 0 of 1, every collective is a local copy, exactly today's single-process jtok.
//
// Reproducibility: allreduce_sum does not use MPI_Allreduce (whose summation order is up to the
// MPI library's algorithm choice). Element i is reduced by one rank, the owner of its chunk, as
// ((x_0 + x_1) + x_2) + ... in rank order, and the result is broadcast: every rank gets the same
// bits, and a run with the same P gives the same bits every time. (It is a reduce-scatter through
// MPI_Alltoallv plus an MPI_Allgatherv: the bandwidth of a ring allreduce.)
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace jtok::dist {

// Whether this process was started by an MPI launcher (Open MPI, MPICH/hydra or PMIx variables).
bool launched_by_mpi();
// Initialises MPI (thread level FUNNELED: only the main thread calls MPI) if launched_by_mpi();
// otherwise nothing. Idempotent. `finalize` ends MPI if it was initialised.
void init(int* argc, char*** argv);
void finalize();
bool active();     // MPI initialised and not finalised
int rank();        // 0 in a world of one
int world_size();  // 1 without a launcher

// Sums `n` values over all ranks in place, in rank order (see above). No-op in a world of one.
void allreduce_sum(float* buf, int64_t n);
void allreduce_sum(double* buf, int64_t n);
void allreduce_sum(int64_t* buf, int64_t n);
// Non-blocking fixed-order sum of a buffer in buckets (the backbone gradients, summed while
// the backward still runs). start(p, n) posts the sum of bucket [p, p + n) over the ranks;
// progress() moves posted buckets on (call it often: MPI moves data only inside MPI calls, there is
// no progress thread); wait() completes them all. Every bucket ends as allreduce_sum would leave
// it, bit for bit: element i is reduced by the owner of its chunk as ((x_0 + x_1) + x_2) + ... in
// rank order and sent back to every rank; the owner and order do not depend on timing. Made of
// point-to-point MPI_Isend / MPI_Irecv on a communicator of its own (tags per bucket), not
// MPI_Iallreduce, whose summation order is the library's choice (Open MPI's tuned component picks
// its algorithm by message size and P, and a ring or tree changes the order of float sums).
// Every rank must start the same buckets, with the same sizes, in the same order; the buffer of a
// bucket must not be touched between start and wait.
class BucketedSum {
 public:
  BucketedSum();
  ~BucketedSum();
  BucketedSum(const BucketedSum&) = delete;
  BucketedSum& operator=(const BucketedSum&) = delete;
  void start(float* p, int64_t n);
  void progress();
  void wait();
  int64_t buckets() const { return static_cast<int64_t>(b_.size()); }
  // Bytes this rank sent to / received from other ranks since the last take.
  int64_t take_sent() { int64_t v = sent_; sent_ = 0; return v; }
  int64_t take_recv() { int64_t v = recv_; recv_ = 0; return v; }

 private:
  struct Bucket;
  std::vector<Bucket*> b_;
  int64_t sent_ = 0, recv_ = 0;
  void advance(Bucket& k, bool block);
};

// A non-blocking request-reply exchange (JTok's rows for a micro-batch, posted once at the start of
// the forward; JTok-M's premix and naive exchanges, posted after a layer's router and consumed at
// its write-back; the backward's gradient pushes: dist/sharded_tables.h). Rank r sends requests[j]
// (int32 words, `item` words per item) to rank j and gets back `reply_floats` floats per item it
// asked (0: a one-way push, no reply message at all); `serve(src, req, n, out)` is the owner's answer
// to n items from rank src (out: n * reply_floats floats). The constructor posts everything (point
// to point, on a communicator of its own, with tags of its own: several may be in flight at once);
// progress() serves the requests that have arrived and moves messages on; wait() serves the rest and
// completes. A rank's requests to itself are served without MPI. Every rank must construct the same
// exchanges in the same order (the tags are a per-process sequence number).
// Ordered (for serves that accumulate, e.g. gradients): sources are served strictly in rank order,
// src 0, 1, ..., P-1 (progress() stops at the first whose requests have not arrived), so the
// owner's sums are in the order of the blocking MPI_Alltoallv path whatever the timing.
class RequestReply {
 public:
  using Serve = std::function<void(int src, const int32_t* req, int64_t n, float* out)>;
  RequestReply(std::vector<std::vector<int32_t>> requests, int64_t item, int64_t reply_floats, Serve serve,
               bool ordered = false);
  ~RequestReply();
  RequestReply(const RequestReply&) = delete;
  RequestReply& operator=(const RequestReply&) = delete;
  void progress();
  void wait();
  bool done() const { return done_; }
  bool served() const;  // every source's requests served (replies may still be on their way)
  // The reply of rank j to this rank's requests[j], in request order (after wait()).
  const std::vector<float>& reply(int j) const { return reply_[static_cast<size_t>(j)]; }
  int64_t sent_bytes() const { return sent_; }  // to other ranks: requests and replies
  int64_t recv_bytes() const { return recv_; }

 private:
  struct Impl;
  Impl* impl_;
  std::vector<std::vector<int32_t>> req_;
  std::vector<std::vector<float>> reply_;
  int64_t item_, reply_floats_;
  Serve serve_;
  bool ordered_;
  int tag_ = 0;  // this exchange's three tags: tag_, tag_ + 1, tag_ + 2
  bool done_ = false;
  int64_t sent_ = 0, recv_ = 0;
  void step(bool block);
};

// Maximum over ranks, in place.
void allreduce_max(double* buf, int64_t n);

// Personalised exchange of bytes: rank r sends send_counts[j] bytes (at send_offsets[j] of send)
// to rank j, and receives recv_counts[j] bytes from rank j at recv_offsets[j] of recv. Counts
// must agree pairwise (exchange_counts gives recv_counts from send_counts).
void alltoallv(const void* send, const std::vector<int64_t>& send_counts, const std::vector<int64_t>& send_offsets,
               void* recv, const std::vector<int64_t>& recv_counts, const std::vector<int64_t>& recv_offsets);
// recv_counts[j] = what rank j will send to this rank (an MPI_Alltoall of one count each).
std::vector<int64_t> exchange_counts(const std::vector<int64_t>& send_counts);
// Every rank's `bytes` (this rank's may differ in size from others'), concatenated in rank order;
// sizes[j] is rank j's byte count.
std::vector<char> allgatherv(const void* bytes, int64_t n, std::vector<int64_t>* sizes = nullptr);
// Copies rank `root`'s n bytes into every rank's buf.
void broadcast(void* buf, int64_t n, int root = 0);

void barrier();
// Prints "jtok: error: rank R of P: msg" to stderr and ends the whole job (MPI_Abort) with `code`;
// in a world of one, prints the same without the rank and exits.
[[noreturn]] void abort(const std::string& msg, int code = 1);

// The MPI call this rank is blocked in (null if none) and for how many seconds (dist/watchdog.h).
const char* current_call(double* seconds);

// Offsets of consecutive blocks of the given sizes (prefix sums, starting at 0).
std::vector<int64_t> prefix_offsets(const std::vector<int64_t>& sizes);

}  // namespace jtok::dist
