// The device model's optimizer step (src/cuda/model_optimizer.h).
#include <algorithm>
#include <cmath>

#include "cuda/global_norm.h"
#include "cuda/model_optimizer.h"
#include "model/trainable.h"

namespace jtok::cuda {

void KeptSteps::push(const AdamWConsts& c, cudaStream_t stream) {
  host.push_back(c);
  const auto n = static_cast<int64_t>(host.size());
  if (n > dev.size()) {  // room doubled (a reallocation syncs the device): all uploaded again
    dev.resize(std::max<int64_t>(64, 2 * n));
    staged = PinnedArray<AdamWConsts>(dev.size());
    copy_to_device(dev.get(), host.data(), n);
  } else {  // the new step's constants only
    staged.get()[n - 1] = c;
    JTOK_CUDA_CHECK(
        cudaMemcpyAsync(dev.get() + n - 1, staged.get() + n - 1, sizeof(AdamWConsts), cudaMemcpyHostToDevice, stream));
  }
}

template <typename E>
DeviceAdamW::DeviceAdamW(const DeviceModel<E>& dm, bool dense, bool defer_embedding_rows)
    : m(dm.n_params),
      v(dm.n_params),
      table_m(dm.tables.size()),
      table_v(dm.tables.size()),
      row_step(dm.table_flags.size()),
      dense_tables(dense),
      defer_embedding(defer_embedding_rows && dm.embed_rows_on()),
      embed_row_step(defer_embedding ? dm.cfg.padded_vocab() : 0),
      partials(sumsq_chunks(dm.n_params) + dm.table_flags.size()),
      sumsq(1),
      norm(1),
      clip(1),
      stats(2 * kTableStats) {
  std::vector<AdamWSegment> ranges;
  for (size_t i = 0; i < dm.layout.size(); ++i) {
    const ParamInfo& p = dm.layout[i];
    const int32_t table_lr = is_token_indexed_param(p.name) ? 1 : 0;  // a JTok / JTok-M parameter: its own lr
    const int32_t kind = 2 * table_lr + (p.decay ? 0 : 1);
    if (defer_embedding && p.offset == dm.embed_offset()) {
      JTOK_CHECK(kind < 2, "cuda AdamW: the embedding ", p.name, " takes the table lr");
      embed_kind = kind;           // stepped by its rows (step_embedding)
    } else if (dm.trainable[i]) {  // a frozen tensor is in no segment: never stepped, no moments
      ranges.push_back({p.offset, p.numel, 0, kind});
    }
  }
  const std::vector<AdamWSegment> segs = adamw_segments(ranges, segment_blocks);
  segments.resize(static_cast<int64_t>(segs.size()));
  copy_to_device(segments.get(), segs.data(), static_cast<int64_t>(segs.size()));
  for (DeviceArray<float>* a : {&m, &v, &table_m, &table_v}) a->zero(dm.stream);
  row_step.zero(dm.stream);
  embed_row_step.zero(dm.stream);
  stats.zero(dm.stream);
}

namespace {

// Rows [k Vp, k Vp + rows) of the tables' optimizer view: their values, the forward's bf16 copy
// (bf16 models), moments and row steps (the tables lie side by side in every array: rows Vp is one
// table, rows n_tables Vp all of them, indexed by the touched list's global rows).
template <typename E>
DeviceTable table_view(const DeviceModel<E>& dm, const DeviceAdamW& st, int64_t k, int64_t rows) {
  const int64_t Vp = dm.cfg.padded_vocab(), at = k * dm.table_numel;
  DeviceTable t;
  t.p = dm.tables.get() + at;
  if constexpr (!std::is_same_v<E, float>) t.p_bf16 = dm.table_copy.get() + at;
  t.m = st.table_m.get() + at;
  t.v = st.table_v.get() + at;
  t.row_step = st.row_step.get() + k * Vp;
  t.rows = rows;
  t.d = dm.cfg.hidden_size;
  return t;
}

// The deferred embedding's optimizer view: its values in the flat masters (and the bf16 copy), its
// moments in the flat m, v, its own row steps.
template <typename E>
DeviceTable embed_view(const DeviceModel<E>& dm, const DeviceAdamW& st) {
  const int64_t at = dm.embed_offset();
  DeviceTable t;
  t.p = dm.master.get() + at;
  if constexpr (!std::is_same_v<E, float>) t.p_bf16 = dm.copy.get() + at;
  t.m = st.m.get() + at;
  t.v = st.v.get() + at;
  t.row_step = st.embed_row_step.get();
  t.rows = dm.cfg.padded_vocab();
  t.d = dm.cfg.hidden_size;
  return t;
}

// The embedding's rows with a gradient stepped (replayed first to the step before), their gradient
// rows zeroed and flags cleared: the embedding's whole AdamW step.
template <typename E>
void step_embedding(DeviceModel<E>& dm, DeviceAdamW& st, const AdamWConsts& c) {
  st.embed_kept.push(c, dm.stream);
  RowFlags& f = dm.embed_flags;
  f.list(dm.stream);
  const TableGrad grad{dm.g.embed, f.flags.get(), true};
  table_adamw_step(embed_view(dm, st), grad, f.rows.get(), f.count.get(), f.size(), st.embed_kept.view(), st.step, true,
                   st.clip.get(), TableStats{st.embed_stats()}, dm.stream);
  f.flagged = false;
}

// The sum of squares of every gradient (the flat one's 4096-element chunks, then a partial a touched
// table row: the rows listed here, reused by step_tables), the norm and the clip coefficient on the
// device; the norm queued for reading back (st.readback, begun by the caller).
template <typename E>
const double* grad_norm(DeviceModel<E>& dm, DeviceAdamW& st, float max_grad_norm) {
  cudaStream_t s = dm.stream;
  const int64_t flat = sumsq_chunks(dm.n_params);
  sumsq_partials(st.partials.get(), dm.grads.get(), dm.n_params, s);
  const int32_t* table_rows = nullptr;  // the listed rows' count, after the flat partials
  if (dm.n_tables > 0) {
    RowFlags& f = dm.table_flags;
    f.list(s);
    sumsq_rows_partials(st.partials.get() + flat, dm.table_grads.get(), f.rows.get(), f.count.get(), f.size(),
                        dm.cfg.hidden_size, s);
    table_rows = f.count.get();
  }
  sum_partials(st.sumsq.get(), st.partials.get(), flat, s, table_rows);
  clip_coef(st.clip.get(), st.norm.get(), st.sumsq.get(), max_grad_norm, s);
  return st.readback.queue(st.norm.get(), 1, s);
}

// This step's table constants kept (dense: after the steps not yet replayed everywhere; sparse:
// alone) and uploaded, then every table stepped at its touched rows (grad_norm's list), in one launch.
template <typename E>
void step_tables(DeviceModel<E>& dm, DeviceAdamW& st, const AdamWConsts& c) {
  if (!st.dense_tables) st.kept.reset(st.step - 1);
  st.kept.push(c, dm.stream);
  RowFlags& f = dm.table_flags;
  const TableGrad grad{dm.table_grads.get(), f.flags.get(), st.zero_table_grad_rows};
  const DeviceTable all = table_view(dm, st, 0, f.size());  // indexed by the list's global rows
  if (!st.streams) {
    table_adamw_step(all, grad, f.rows.get(), f.count.get(), f.size(), st.kept_view(), st.step, st.dense_tables,
                     st.clip.get(), TableStats{st.stats.get()}, dm.stream);
  } else {  // a launch a layer's run of tables, on the step stream: its span of the list
    TableStreams& ts = *st.streams;
    const cudaStream_t side = ts.begin_step(dm.stream, f.rows.get(), f.count.get());
    const int64_t Vp = dm.cfg.padded_vocab();
    for (size_t r = 0; r < ts.runs().size(); ++r) {
      const TableStreams::Run& run = ts.runs()[r];
      table_adamw_step(all, grad, f.rows.get(), ts.span(r) + 1, (run.k1 - run.k0) * Vp, st.kept_view(), st.step,
                       st.dense_tables, st.clip.get(), TableStats{st.stats.get()}, side, ts.span(r));
      ts.end_run(r);
    }
  }
  f.flagged = false;  // every listed row's flag cleared
}

// Rows asked outside the kept steps (a statistics' fifth counter), refused: the CPU aborts on one.
void check_kept(const unsigned long long* counters, const KeptSteps& kept, const char* what) {
  if (counters[4] != 0)
    fail("cuda model: ", counters[4], " ", what, " rows were asked for steps outside the kept constants (",
         kept.base + 1, "..", kept.view().current, ")");
}

// The statistics read back (DeviceAdamW::stats): the tables' first four kept (DeviceAdamW::counts),
// and both parts' rows asked outside the kept steps refused.
void check_table_stats(DeviceAdamW& st, const unsigned long long* counters) {
  std::copy(counters, counters + 4, st.counts.begin());
  check_kept(counters, st.kept, "table");
  check_kept(counters + kTableStats, st.embed_kept, "embedding");
}

}  // namespace

template <typename E>
double optimizer_step(DeviceModel<E>& dm, DeviceAdamW& st, const StepConsts& c, float max_grad_norm) {
  if (dm.profile) dm.profile->begin(dm.stream);  // the gap since the backward is the host's
  const int64_t n_stats = st.stats.size();
  st.readback.begin(HostReadback::room_for<double>(1) + HostReadback::room_for<unsigned long long>(n_stats));
  const double* norm_at = grad_norm(dm, st, max_grad_norm);
  const bool deferred = dm.n_tables > 0 || st.defer_embedding;
  const unsigned long long* counters = deferred ? st.readback.queue(st.stats.get(), n_stats, dm.stream) : nullptr;
  st.readback.wait(dm.stream);  // one sync: the norm, and the counters of the forward's row syncs
  const double norm = *norm_at;
  if (!std::isfinite(norm))
    fail("cuda model: the global gradient norm is ", norm, "; the step was not applied (no weight or moment changed)");
  if (counters) check_table_stats(st, counters);
  mark_phase(dm.profile, "gradient norm", dm.stream);
  st.step += 1;
  __nv_bfloat16* copy = nullptr;  // the bf16 forward's copy, rewritten from the new masters
  if constexpr (!std::is_same_v<E, float>) copy = dm.copy.get();
  const AdamWKinds kinds{{c.decay, c.plain, c.table_decay, c.table_plain}};  // the segments' kind order
  adamw_update<float>(dm.master.get(), copy, dm.grads.get(), st.m.get(), st.v.get(), st.segments.get(),
                      st.segments.size(), st.segment_blocks, kinds, st.clip.get(), dm.stream);
  if (st.defer_embedding) step_embedding(dm, st, st.embed_kind == 0 ? c.decay : c.plain);
  mark_phase(dm.profile, "adamw", dm.stream);
  if (dm.n_tables > 0) {
    step_tables(dm, st, c.table_decay);  // tables are 2-D: decay applies
    mark_phase(dm.profile, "table adamw", dm.stream);
  }
  return norm;
}

template <typename E>
DeviceRowSync table_row_sync(DeviceModel<E>& dm, DeviceAdamW& st) {
  if (!st.dense_tables && !st.streams) return {};  // sparse: a row moves only when it has a gradient
  return [&dm, &st](int64_t k, int64_t tables, const DeviceRowBatch& rb, int64_t N, RowSubset subset) {
    const int64_t Vp = dm.cfg.padded_vocab();
    const cudaStream_t s = st.streams ? st.streams->begin_sync(dm.stream, k) : dm.stream;  // one layer's tables
    if (st.dense_tables)
      table_sync_rows(table_view(dm, st, k, tables * Vp), rb.unique, rb.num_unique, N, st.kept_view(),
                      TableStats{st.stats.get()}, s, subset, tables, Vp);
    if (st.streams)
      for (int64_t j = 0; j < tables; ++j) st.streams->end_sync(k + j);
  };
}

template <typename E>
DeviceEmbedSync embedding_row_sync(DeviceModel<E>& dm, DeviceAdamW& st) {
  if (!st.defer_embedding) return {};
  return [&dm, &st](const DeviceRowBatch& rb, int64_t N) {
    table_sync_rows(embed_view(dm, st), rb.unique, rb.num_unique, N, st.embed_kept.view(), TableStats{st.embed_stats()},
                    dm.stream);
  };
}

template <typename E>
DeviceRowWait table_row_wait(DeviceModel<E>& dm, DeviceAdamW& st) {
  if (!st.streams) return {};
  return [&dm, &st](int64_t k) { st.streams->wait(dm.stream, k); };
}

template <typename E>
void use_table_streams(const DeviceModel<E>& dm, DeviceAdamW& st) {
  if (dm.n_tables > 0 && !st.streams)
    st.streams = std::make_unique<TableStreams>(dm.jtok_table, dm.jtokm_table, dm.cfg.jtokm_n_e, dm.n_tables,
                                                dm.cfg.padded_vocab());
}

template <typename E>
void join_table_streams(const DeviceModel<E>& dm, DeviceAdamW& st) {
  if (st.streams) st.streams->join(dm.stream);
}

template <typename E>
void sync_tables(DeviceModel<E>& dm, DeviceAdamW& st, bool eager_pass) {
  join_table_streams(dm, st);
  if (dm.n_tables > 0 && st.dense_tables)  // every table's rows in one launch (sparse: nothing deferred)
    table_sync_all(table_view(dm, st, 0, dm.table_flags.size()), st.kept_view(), TableStats{st.stats.get()}, dm.stream);
  const bool embedding = !eager_pass && st.defer_embedding;
  if (embedding) table_sync_all(embed_view(dm, st), st.embed_kept.view(), TableStats{st.embed_stats()}, dm.stream);
  if (!eager_pass && (dm.n_tables > 0 || embedding))  // the last step's too
    check_table_stats(st, st.readback.read(st.stats.get(), st.stats.size(), dm.stream));
  if (st.dense_tables) st.kept.reset(st.kept.view().current);
  if (embedding) st.embed_kept.reset(st.embed_kept.view().current);
}

#define JTOK_MODEL_OPTIMIZER_INSTANTIATE(E)                                                   \
  template DeviceAdamW::DeviceAdamW(const DeviceModel<E>&, bool, bool);                       \
  template DeviceEmbedSync embedding_row_sync<E>(DeviceModel<E>&, DeviceAdamW&);              \
  template double optimizer_step<E>(DeviceModel<E>&, DeviceAdamW&, const StepConsts&, float); \
  template DeviceRowSync table_row_sync<E>(DeviceModel<E>&, DeviceAdamW&);                    \
  template DeviceRowWait table_row_wait<E>(DeviceModel<E>&, DeviceAdamW&);                    \
  template void use_table_streams<E>(const DeviceModel<E>&, DeviceAdamW&);                    \
  template void join_table_streams<E>(const DeviceModel<E>&, DeviceAdamW&);                   \
  template void sync_tables<E>(DeviceModel<E>&, DeviceAdamW&, bool);
JTOK_MODEL_OPTIMIZER_INSTANTIATE(float)
JTOK_MODEL_OPTIMIZER_INSTANTIATE(__nv_bfloat16)
#undef JTOK_MODEL_OPTIMIZER_INSTANTIATE

}  // namespace jtok::cuda
