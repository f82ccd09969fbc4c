// The GPU decoder's decode steps as CUDA graphs (src/cuda/decoder_step.cu) against the same steps
// launched eagerly and against profiled (eager, events between phases) steps: one schedule of decode
// steps whose batch changes (1, 2 and 3 sequences: buckets 1, 2 and 4, the last with a dummy row)
// and whose lengths cross a page (15 -> 25, pages of 16) and a length bucket (250 -> 263: 256 ->
// 512 positions), through three decoders, must give the same logits' bits, greedy tokens and
// token-table rows read. The graph decoder must have captured the schedule's six shapes (and
// replayed each: every shape recurs), the others none; the profiled one's breakdown must tile its
// step. Models: Qwen3's shape (fp32 and bf16), JTok + JTok-M with rows in place and from hbm (bf16),
// MoE + JTok + JTok-M (fp32 and bf16: the experts' products grouped by the device's offsets); staged
// rows fall back to eager, saying why; programmatic dependent launch (settings.pdl) gives the plain
// graphs' bits. Runs only on a GPU host (in test_cuda_ops).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cuda/decoder.h"
#include "model/transformer.h"
#include "model_case.h"

namespace {

using namespace jtok::cuda_test;
using jtok::cuda::DecoderSettings;
using jtok::cuda::DeviceDecoder;
using jtok::cuda::StepBreakdown;

constexpr int64_t kContext = 640;  // length buckets 256, 512, 640 (chunks of 256 positions)
constexpr int kSteps = 16;
// Which of the 3 sequences step s feeds: bit i = sequence i (3 rows, 1, 2, 1, 3, 2, ...).
constexpr int kMasks[] = {7, 2, 5, 4, 7, 6};

jtok::ModelConfig long_context(jtok::ModelConfig c) {
  c.max_position_embeddings = kContext;
  return c;
}

// model_case.h's decoder with prefill calls of 256 tokens (the long prompts), graphs and profiling.
DecoderSettings settings(bool bf16, const std::string& rows, bool graphs, bool profile) {
  DecoderSettings s = decoder_settings(bf16, rows);
  s.max_prefill = 256;
  s.cuda_graphs = graphs;
  s.profile = profile;
  return s;
}

int32_t argmax(const float* x, int64_t n) { return static_cast<int32_t>(std::max_element(x, x + n) - x); }

struct Schedule {
  std::vector<float> logits;   // every step's (M, V), back to back
  std::vector<int32_t> fed;    // every step's tokens
  std::vector<int64_t> rows;   // per step
  std::vector<StepBreakdown> steps;
};

// Prompts of 5, 15 and 250 tokens, then kSteps greedy steps of the sequences kMasks picks.
Schedule run_schedule(DeviceDecoder& dec, const jtok::ModelConfig& c) {
  const int64_t V = c.vocab_size;
  std::vector<int64_t> seqs;
  std::vector<int32_t> next;
  std::vector<float> l(static_cast<size_t>(4 * V));
  for (int64_t n : {5, 15, 250}) {
    const std::vector<int32_t> p = skewed_ids(n, V, 80 + static_cast<uint64_t>(n));
    seqs.push_back(dec.open(kContext));
    dec.prefill(seqs.back(), p.data(), n, l.data());
    next.push_back(argmax(l.data(), V));
  }
  Schedule out;
  for (int s = 0; s < kSteps; ++s) {
    std::vector<int64_t> sq, who;
    std::vector<int32_t> tk;
    for (int64_t i = 0; i < 3; ++i) {
      if (((kMasks[s % 6] >> i) & 1) == 0) continue;
      sq.push_back(seqs[static_cast<size_t>(i)]);
      tk.push_back(next[static_cast<size_t>(i)]);
      who.push_back(i);
    }
    const int64_t M = static_cast<int64_t>(sq.size());
    out.rows.push_back(dec.decode(sq.data(), tk.data(), M, l.data()));
    out.fed.insert(out.fed.end(), tk.begin(), tk.end());
    out.logits.insert(out.logits.end(), l.begin(), l.begin() + M * V);
    out.steps.push_back(dec.last_step());
    for (int64_t k = 0; k < M; ++k)
      next[static_cast<size_t>(who[static_cast<size_t>(k)])] = argmax(l.data() + k * V, V);
  }
  EXPECT_EQ(dec.length(seqs[2]), 250 + 13) << "the schedule crosses the 256-position length bucket";
  EXPECT_EQ(dec.length(seqs[1]), 15 + 10) << "the schedule crosses a page";
  for (int64_t q : seqs) dec.close(q);
  return out;
}

// A profiled step: valid, its bucket's rows, phases that tile the step (the marks are consecutive on
// one stream, so the sum is the whole up to rounding), the rows' side stream timed where there are rows.
void expect_breakdown(const std::string& name, const StepBreakdown& b, int64_t bucket, bool has_rows) {
  ASSERT_TRUE(b.valid) << name;
  EXPECT_EQ(b.rows, bucket) << name;
  EXPECT_GE(b.max_len, 256) << name;
  for (double v : {b.embed_ms, b.attention_ms, b.rows_wait_ms, b.mlp_ms, b.head_ms, b.digest_ms, b.logits_copy_ms, b.rows_dedup_ms,
                   b.rows_gather_ms, b.rows_issue_ms})
    EXPECT_GE(v, 0.0) << name;
  const double parts =
      b.embed_ms + b.attention_ms + b.rows_wait_ms + b.mlp_ms + b.head_ms + b.digest_ms + b.logits_copy_ms;
  EXPECT_GT(b.step_ms, 0.0) << name;
  EXPECT_NEAR(parts, b.step_ms, 1e-3 + 1e-3 * b.step_ms) << name;
  EXPECT_GE(b.host_ms, b.step_ms * 0.5) << name << ": the call holds the step";
  if (has_rows) EXPECT_GT(b.rows_dedup_ms + b.rows_gather_ms, 0.0) << name;
  else EXPECT_EQ(b.rows_wait_ms, 0.0) << name;
}

void expect_graphs_match_eager(const std::string& name, const jtok::Model& m, bool bf16, const std::string& rows) {
  auto graphs = jtok::cuda::make_device_decoder(m, settings(bf16, rows, true, false));
  auto eager = jtok::cuda::make_device_decoder(m, settings(bf16, rows, false, false));
  auto profiled = jtok::cuda::make_device_decoder(m, settings(bf16, rows, true, true));
  EXPECT_NE(graphs->describe().find("CUDA graphs on (batch buckets 1 2 4;"), std::string::npos) << graphs->describe();
  EXPECT_NE(eager->describe().find("CUDA graphs off: turned off"), std::string::npos) << eager->describe();
  EXPECT_NE(profiled->describe().find("CUDA graphs off: profiling"), std::string::npos) << profiled->describe();
  const Schedule g = run_schedule(*graphs, m.cfg), e = run_schedule(*eager, m.cfg), p = run_schedule(*profiled, m.cfg);
  EXPECT_NE(graphs->describe().find("6 captured"), std::string::npos) << name << ": " << graphs->describe();
  for (const Schedule* other : {&e, &p}) {
    EXPECT_EQ(g.fed, other->fed) << name;
    EXPECT_EQ(g.rows, other->rows) << name;
    ASSERT_EQ(g.logits.size(), other->logits.size()) << name;
    EXPECT_TRUE(std::equal(g.logits.begin(), g.logits.end(), other->logits.begin(),
                           [](float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }))
        << name << ": graph and eager logits differ in their bits";
  }
  for (int s = 0; s < kSteps; ++s) {
    EXPECT_FALSE(g.steps[static_cast<size_t>(s)].valid) << name << ": a graph decoder does not profile";
    const int M = __builtin_popcount(kMasks[s % 6]);
    expect_breakdown(name + " step " + std::to_string(s), p.steps[static_cast<size_t>(s)], M == 3 ? 4 : M,
                     !m.tables.empty());
  }
}

TEST(CudaDecoderGraphs, GraphsGiveTheEagerBits) {
  const jtok::Model qwen3 = test_model(long_context(tiny_qwen3()));
  expect_graphs_match_eager("qwen3 fp32", qwen3, false, "auto");
  expect_graphs_match_eager("qwen3 bf16", qwen3, true, "auto");
  const jtok::Model tables = test_model(long_context(tiny_jtok_jtokm()));
  expect_graphs_match_eager("jtok+jtokm bf16 in place", tables, true, "in_place");
  expect_graphs_match_eager("jtok+jtokm bf16 hbm", tables, true, "hbm");
  const jtok::Model moe = test_model(long_context(tiny_moe_jtok_jtokm()));
  expect_graphs_match_eager("moe+jtok+jtokm fp32", moe, false, "auto");
  expect_graphs_match_eager("moe+jtok+jtokm bf16 in place", moe, true, "in_place");
}

// What needs the host inside a step runs eagerly, named in describe(), and still decodes.
TEST(CudaDecoderGraphs, HostBoundStepsFallBackToEager) {
  const jtok::Model tables = test_model(long_context(tiny_jtok_jtokm()));
  auto b = jtok::cuda::make_device_decoder(tables, settings(true, "staged", true, false));
  EXPECT_NE(b->describe().find("CUDA graphs off: staged"), std::string::npos) << b->describe();
  auto c = jtok::cuda::make_device_decoder(tables, settings(true, "in_place", true, false));
  const Schedule staged = run_schedule(*b, tables.cfg), in_place = run_schedule(*c, tables.cfg);
  EXPECT_EQ(staged.logits, in_place.logits) << "staged (eager) against in place (graphs)";
  EXPECT_EQ(staged.rows, in_place.rows);
}

// The kernels of a decode step's graph (its second step: the first is eager and captured), or 0 eager.
int64_t step_graph_kernels(const jtok::Model& m, const std::string& rows, bool graphs) {
  const int64_t V = m.cfg.vocab_size;
  auto dec = jtok::cuda::make_device_decoder(m, settings(false, rows, graphs, false));
  const std::vector<int32_t> prompt = skewed_ids(5, V, 91);
  std::vector<float> logits(static_cast<size_t>(V));
  const int64_t seq = dec->open(kContext);
  dec->prefill(seq, prompt.data(), 5, logits.data());
  std::vector<int64_t> kernels;
  for (int step = 0; step < 2; ++step) {
    const int32_t next = argmax(logits.data(), V);
    dec->decode(&seq, &next, 1, logits.data());
    kernels.push_back(dec->last_graph_kernels());
  }
  EXPECT_EQ(kernels[0], 0) << "the first step of a shape runs eagerly";
  return kernels[1];
}

// A dense layer's decode step is 6 kernels (q | k | v with the input norm inside, paged_qkv, the
// paged attention, o, gate | up with the second norm and SwiGLU inside, down; cuda/decoder_forward.cu)
// and a step adds the embedding and the LM head with the final norm inside: the tiny Qwen3's graph
// holds 1 + 6 L + 1 kernels. A step that ran eagerly (the first of its shape, or graphs off) reports none.
TEST(CudaDecoderGraphs, ADenseLayerDecodesInSixKernels) {
  const jtok::Model qwen3 = test_model(long_context(tiny_qwen3()));
  const int64_t L = qwen3.cfg.num_hidden_layers;
  EXPECT_EQ(step_graph_kernels(qwen3, "auto", true), 1 + 6 * L + 1);
  EXPECT_EQ(step_graph_kernels(qwen3, "auto", false), 0) << "graphs off";
}

// A JTok-M layer adds 1 kernel to the dense layer's 6: the mix, which routes each position itself
// (no route kernel, and none of training's statistics), its router's product being columns of the
// q | k | v product's launch; the step's rows from HBM add the ids' dedup (2 kernels) and a gather a
// layer on the rows' stream. With the products on the tensor cores the router is a launch of its own.
TEST(CudaDecoderGraphs, AJtokmLayerAddsOneKernel) {
  jtok::ModelConfig c = long_context(tiny_qwen3());
  c.jtokm = true, c.jtokm_n_e = 3, c.jtokm_top_k = 2;
  const int64_t L = c.num_hidden_layers;
  EXPECT_EQ(step_graph_kernels(test_model(c), "hbm", true), 1 + (6 + 1) * L + 1 + 2 + L);
}

// Programmatic dependent launch (settings.pdl, cuda/pdl_edges.h) changes when a kernel's blocks
// launch, not what they compute: the schedule's bits, tokens and rows equal the plain graphs'. On a
// GPU every dense layer's chain of kernels gets programmatic edges (at least 5 of each layer's 6
// kernels wait on one); the emulated GPU keeps no edges, so there the decoder says why it is off and
// decodes with the plain graphs.
void expect_pdl_bits(const std::string& name, const jtok::Model& m, bool bf16, const std::string& rows) {
  DecoderSettings with = settings(bf16, rows, true, false);
  with.pdl = true;
  auto pdl = jtok::cuda::make_device_decoder(m, with);
  auto plain = jtok::cuda::make_device_decoder(m, settings(bf16, rows, true, false));
  const Schedule a = run_schedule(*pdl, m.cfg), b = run_schedule(*plain, m.cfg);
  EXPECT_EQ(a.fed, b.fed) << name;
  EXPECT_EQ(a.rows, b.rows) << name;
  ASSERT_EQ(a.logits.size(), b.logits.size()) << name;
  EXPECT_EQ(0, std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)))
      << name << ": logits with programmatic edges differ from the plain graphs'";
  EXPECT_EQ(plain->last_graph_pdl_edges(), 0) << name;
  const std::string said = pdl->describe();
  std::printf("%s: %lld programmatic edges in the last graph of %lld kernels; %s\n", name.c_str(),
              static_cast<long long>(pdl->last_graph_pdl_edges()), static_cast<long long>(pdl->last_graph_kernels()),
              said.c_str());
  if (said.find("emulated") != std::string::npos) {
    EXPECT_NE(said.find("programmatic dependent launch off: "), std::string::npos) << said;
    EXPECT_NE(said.find("cudaGraphGetEdges"), std::string::npos) << said;
    EXPECT_EQ(pdl->last_graph_pdl_edges(), 0) << name;
  } else {
    EXPECT_NE(said.find("programmatic dependent launch on"), std::string::npos) << said;
    EXPECT_GE(pdl->last_graph_pdl_edges(), 5 * m.cfg.num_hidden_layers) << name;
  }
}

TEST(CudaDecoderGraphs, PdlGivesThePlainGraphsBits) {
  const jtok::Model qwen3 = test_model(long_context(tiny_qwen3()));
  expect_pdl_bits("qwen3 bf16", qwen3, true, "auto");
  expect_pdl_bits("qwen3 fp32", qwen3, false, "auto");
  const jtok::Model tables = test_model(long_context(tiny_jtok_jtokm()));
  expect_pdl_bits("jtok+jtokm bf16 in place", tables, true, "in_place");
}

}  // namespace
