// The one door to MPI (issue 11): process-group setup and the few collectives the distributed
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
