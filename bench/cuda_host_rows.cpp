// Times a step's token-table rows on the GPU at Qwen3-0.6B's row shape (issue 40: d 1024 bf16, 28
// layers of one JTok table each, vocabulary 151936): a decode step of 16 sequences (16 ids) and a
// 4096-token prefill, each deduplicated, every layer's rows gathered into a device buffer
//   hbm:      the tables copied to the device (the control), the gather kernel reading them there
//   in_place: the tables registered where they lie in host memory, the same kernel reading them over UVA
//   staged:   the CPU's gather into pinned staging, copied on a side stream (StepRows' staged path:
//             the gathers are host functions on that stream, queued by the request)
// Each step: the ids uploaded, deduplicated on the device, every layer's gather, then a sync; wall
// milliseconds per step until every layer's rows are on the device (ms: mean over reps after two
// warm-ups), the host's time to queue it (issue_ms: what the caller's thread spends before it can
// queue its forward; staged too, now its gathers run on the side stream) and GB/s of unique rows
// moved. Built with
// the CUDA kernels (target bench_cuda_host_rows; not a test: timings are no check):
//   build/bench_cuda_host_rows [--shard data/val/val_000.bin] [--layers 28] [--tables 1] [--d 1024]
//                              [--vocab 151936] [--decode 16] [--prefill 4096] [--reps 20]
// --tables n: tables a layer (1: JTok; JTok-M's n_e, e.g. 5: every id's n_e rows, one launch a layer).
// Ids come from a token shard when one is given (decode: tokens spread through it, one a sequence;
// prefill: its first tokens), else from a fixed pseudo-random set (uniform, seed 1); the output says
// which. One JSON line per (step, path). Needs layers x tables x vocab x d x 2 bytes of RAM and of HBM.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/check.h"
#include "cuda/device_array.h"
#include "cuda/host_rows.h"
#include "cuda/step_rows.h"
#include "data/shard.h"

namespace {

using bf16 = __nv_bfloat16;
using jtok::cuda::DeviceArray;

struct Options {
  std::string shard;
  int64_t layers = 28, per_layer = 1, d = 1024, vocab = 151936, decode = 16, prefill = 4096;
  int reps = 20;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) jtok::fail(a, " needs a value");
    const char* v = argv[++i];
    if (a == "--shard") o.shard = v;
    else if (a == "--layers") o.layers = std::atoll(v);
    else if (a == "--tables") o.per_layer = std::atoll(v);
    else if (a == "--d") o.d = std::atoll(v);
    else if (a == "--vocab") o.vocab = std::atoll(v);
    else if (a == "--decode") o.decode = std::atoll(v);
    else if (a == "--prefill") o.prefill = std::atoll(v);
    else if (a == "--reps") o.reps = std::atoi(v);
    else jtok::fail("unknown option ", a);
  }
  if (o.layers <= 0 || o.per_layer <= 0 || o.d <= 0 || o.vocab <= 0 || o.decode <= 0 || o.prefill <= 0 || o.reps <= 0)
    jtok::fail("every size must be positive");
  return o;
}

// The step's ids: from the shard (decode: n tokens spread through it; prefill: its first n), or uniform.
std::vector<int32_t> step_ids(const Options& o, int64_t n, bool spread, std::string& source) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  if (o.shard.empty()) {
    source = "pseudo-random (uniform, seed 1)";
    std::mt19937_64 rng(1 + static_cast<uint64_t>(n));
    for (int32_t& id : ids) id = static_cast<int32_t>(std::uniform_int_distribution<int64_t>(0, o.vocab - 1)(rng));
    return ids;
  }
  const jtok::Shard s(o.shard);
  if (s.size() < static_cast<uint64_t>(n)) jtok::fail(o.shard, ": ", s.size(), " tokens, fewer than the step's ", n);
  if (s.info().vocab_size > o.vocab) jtok::fail(o.shard, ": vocabulary ", s.info().vocab_size, " > --vocab ", o.vocab);
  source = "shard " + o.shard + " (" + s.info().tokenizer + ")";
  const uint64_t step = spread ? s.size() / static_cast<uint64_t>(n) : 1;
  for (int64_t i = 0; i < n; ++i)
    ids[static_cast<size_t>(i)] = static_cast<int32_t>(s.token(static_cast<uint64_t>(i) * step));
  return ids;
}

// A bf16 table of arbitrary bits (timing only: the values do not matter, every page is touched).
jtok::TokenTable filler_table(int64_t V, int64_t d, uint64_t seed) {
  std::vector<uint8_t> bytes(static_cast<size_t>(V * d * 2));
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const uint64_t w = x & 0x3fff3fff3fff3fffull;  // finite bf16 values
    std::memcpy(bytes.data() + i, &w, 8);
  }
  return jtok::TokenTable::quantized_in_ram(V, d, jtok::Dtype::bf16, std::move(bytes), {});
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Mean wall milliseconds of step() followed by a device sync, after two warm-ups.
template <typename F>
double time_ms(F&& step, int reps) {
  for (int i = 0; i < 2; ++i) step();
  JTOK_CUDA_CHECK(cudaDeviceSynchronize());
  const double t0 = now_s();
  for (int i = 0; i < reps; ++i) {
    step();
    JTOK_CUDA_CHECK(cudaDeviceSynchronize());
  }
  return (now_s() - t0) * 1e3 / reps;
}

// The HBM control: device copies of the tables, the ids uploaded and deduplicated, every layer's gather.
struct HbmStep {
  std::vector<DeviceArray<uint8_t>> copies;
  std::vector<jtok::cuda::RowSource> sources;
  DeviceArray<int32_t> ids, unique, inverse, offsets, order, count;
  DeviceArray<char> scratch;
  DeviceArray<bf16> out;
  jtok::cuda::PinnedArray<int32_t> pinned;
  int64_t max_n, V, d;

  int64_t per_layer;

  HbmStep(const std::vector<jtok::TokenTable>& tables, int64_t n_max, int64_t tables_per_layer)
      : ids(n_max), unique(n_max), inverse(n_max), offsets(n_max + 1), order(n_max), count(1),
        scratch(static_cast<int64_t>(jtok::cuda::dedup_scratch_bytes(n_max, tables[0].rows))),
        out(static_cast<int64_t>(tables.size()) * n_max * tables[0].dim), pinned(n_max), max_n(n_max),
        V(tables[0].rows), d(tables[0].dim), per_layer(tables_per_layer) {
    for (const jtok::TokenTable& t : tables) {
      copies.emplace_back(t.storage_bytes());
      jtok::cuda::copy_to_device(copies.back().get(), static_cast<const uint8_t*>(t.raw_row(0)), t.storage_bytes());
      sources.push_back({copies.back().get(), t.rows, t.dim, t.dtype()});
    }
  }
  void run(const std::vector<int32_t>& host_ids) {
    const int64_t N = static_cast<int64_t>(host_ids.size());
    std::memcpy(pinned.get(), host_ids.data(), host_ids.size() * sizeof(int32_t));
    JTOK_CUDA_CHECK(cudaMemcpyAsync(ids.get(), pinned.get(), host_ids.size() * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, nullptr));
    const jtok::cuda::DeviceRowBatch rb{unique.get(), inverse.get(), offsets.get(), order.get(), count.get()};
    jtok::cuda::dedup_ids(rb, ids.get(), N, V, scratch.get(), static_cast<size_t>(scratch.size()), nullptr);
    std::vector<bf16*> outs;
    for (int64_t t = 0; t < static_cast<int64_t>(sources.size()); ++t) outs.push_back(out.get() + t * max_n * d);
    for (size_t t = 0; t < sources.size(); t += static_cast<size_t>(per_layer))  // one launch a layer
      jtok::cuda::gather_rows_device_tables(outs.data() + t, sources.data() + t, static_cast<int>(per_layer), rb, N,
                                            jtok::cuda::RowErrors{}, nullptr);
  }
};

// Mean host milliseconds of issue() alone (its work then synced, untimed), after two warm-ups.
template <typename F>
double mean_issue_ms(F&& issue, int reps) {
  double s = 0;
  for (int i = 0; i < reps + 2; ++i) {
    const double t0 = now_s();
    issue();
    if (i >= 2) s += now_s() - t0;
    JTOK_CUDA_CHECK(cudaDeviceSynchronize());
  }
  return s * 1e3 / reps;
}

struct StepTimes {
  double ms = 0, issue_ms = 0;  // until the rows are on the device; queuing them on the host
};

// Every layer's rows through StepRows (in place or staged), the consumer waiting for each layer;
// then a staged gather's error, if any, thrown.
StepTimes time_step_rows(jtok::cuda::StepRows<bf16>& step, const std::vector<int32_t>& ids, int reps) {
  const auto one = [&] {
    step.request(ids.data(), static_cast<int64_t>(ids.size()), nullptr);
    for (int64_t k = 0; k < static_cast<int64_t>(step.layers().size()); ++k) step.wait(k, nullptr);
  };
  const StepTimes t{time_ms(one, reps), mean_issue_ms(one, reps)};
  step.check_error();
  return t;
}

void report(const char* step, const std::string& source, int64_t n, int64_t unique, const char* path, StepTimes t,
            int64_t bytes) {
  std::printf("{\"step\": \"%s\", \"ids\": \"%s\", \"n\": %lld, \"unique\": %lld, \"path\": \"%s\", \"ms\": %.4f, "
              "\"issue_ms\": %.4f, \"gbps\": %.2f, \"bytes\": %lld}\n",
              step, source.c_str(), static_cast<long long>(n), static_cast<long long>(unique), path, t.ms, t.issue_ms,
              static_cast<double>(bytes) / (t.ms * 1e-3) / 1e9, static_cast<long long>(bytes));
  std::fflush(stdout);
}

struct Paths {
  HbmStep* hbm;
  jtok::cuda::StepRows<bf16>* in_place;
  jtok::cuda::StepRows<bf16>* staged;
};

void bench_step(const Options& o, Paths p, const char* name, int64_t n, bool spread) {
  std::string source;
  const std::vector<int32_t> ids = step_ids(o, n, spread, source);
  const int64_t unique = static_cast<int64_t>(jtok::dedup_ids(ids.data(), n, o.vocab).unique.size());
  const int64_t bytes = unique * o.d * o.layers * o.per_layer * static_cast<int64_t>(sizeof(bf16));  // rows written
  const auto hbm = [&] { p.hbm->run(ids); };
  report(name, source, n, unique, "hbm", {time_ms(hbm, o.reps), mean_issue_ms(hbm, o.reps)}, bytes);
  report(name, source, n, unique, "in_place", time_step_rows(*p.in_place, ids, o.reps), bytes);
  report(name, source, n, unique, "staged", time_step_rows(*p.staged, ids, o.reps), bytes);
}

void run(const Options& o) {
  std::vector<jtok::TokenTable> tables;
  const int64_t n_tables = o.layers * o.per_layer;
  for (int64_t t = 0; t < n_tables; ++t) tables.push_back(filler_table(o.vocab, o.d, static_cast<uint64_t>(t + 1)));
  std::vector<jtok::cuda::LayerTables> layers;
  for (int64_t l = 0; l < o.layers; ++l) {
    layers.push_back({l, {}});
    for (int64_t i = 0; i < o.per_layer; ++i)
      layers.back().tables.push_back(&tables[static_cast<size_t>(l * o.per_layer + i)]);
  }
  const int64_t max_n = std::max(o.decode, o.prefill);
  HbmStep hbm(tables, max_n, o.per_layer);
  const double t0 = now_s();
  jtok::cuda::StepRows<bf16> in_place(layers, max_n, jtok::cuda::RowPath::in_place);
  std::printf("{\"register_s\": %.3f, \"table_bytes\": %lld, \"layers\": %lld, \"tables_per_layer\": %lld, "
              "\"d\": %lld, \"vocab\": %lld}\n",
              now_s() - t0, static_cast<long long>(tables[0].storage_bytes() * n_tables),
              static_cast<long long>(o.layers), static_cast<long long>(o.per_layer), static_cast<long long>(o.d),
              static_cast<long long>(o.vocab));
  jtok::cuda::StepRows<bf16> staged(layers, max_n, jtok::cuda::RowPath::staged);
  const Paths p{&hbm, &in_place, &staged};
  bench_step(o, p, "decode", o.decode, true);
  bench_step(o, p, "prefill", o.prefill, false);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_host_rows: %s\n", e.what());
    return 1;
  }
  return 0;
}
