#include "infer/decoder_scores.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "infer/text_scores.h"
#include "ops/cross_entropy.h"

namespace jtok {

namespace {

void check_targets(const int32_t* targets, int64_t n, int64_t V) {
  for (int64_t i = 0; i < n; ++i)
    if (targets[i] < 0 || targets[i] >= V) fail("target id ", targets[i], " outside the vocabulary [0, ", V, ")");
}

// sequence_logits with the blocks checked to come in position order and to cover all n positions.
void logits_in_order(const DecoderScorer& sc, const int32_t* ids, int64_t n, const PositionLogits& each) {
  int64_t filled = 0;
  sequence_logits(sc, ids, n, [&](int64_t pos, int64_t k, const float* logits) {
    JTOK_CHECK(pos == filled && pos + k <= n, "decoder scores: logits of positions ", pos, "..", pos + k,
               " after ", filled, " of ", n);
    each(pos, k, logits);
    filled = pos + k;
  });
  JTOK_CHECK(filled == n, "decoder scores: logits of ", filled, " of ", n, " positions");
}

// Every position's logits of ids[0..n) into rows (n, ld), the first V columns of each row.
void sequence_rows(const DecoderScorer& sc, const int32_t* ids, int64_t n, int64_t ld, std::vector<float>& rows) {
  const int64_t V = sc.vocab_size;
  rows.resize(static_cast<size_t>(n * ld));
  logits_in_order(sc, ids, n, [&](int64_t pos, int64_t k, const float* logits) {
    for (int64_t r = 0; r < k; ++r)
      std::memcpy(rows.data() + (pos + r) * ld, logits + r * V, static_cast<size_t>(V) * sizeof(float));
  });
}

}  // namespace

void sequence_logits(const DecoderScorer& sc, const int32_t* ids, int64_t n, const PositionLogits& each) {
  if (n < 1 || sc.piece < 1) fail("decoder scores: a sequence of ", n, " tokens in pieces of ", sc.piece);
  const int64_t seq = sc.dec.open(n);
  try {
    for (int64_t at = 0; at < n; at += sc.piece) sc.dec.prefill(seq, ids + at, std::min(sc.piece, n - at), each);
  } catch (...) {
    try {
      sc.dec.close(seq);  // the first error is the one reported
    } catch (...) {
    }
    throw;
  }
  sc.dec.close(seq);
}

std::vector<std::vector<float>> decoder_token_logprobs(const DecoderScorer& sc,
                                                       const std::vector<std::vector<int32_t>>& ids) {
  const int64_t V = sc.vocab_size;
  std::vector<std::vector<float>> out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t n = static_cast<int64_t>(ids[i].size()) - 1;  // positions that predict a token
    if (n < 1) continue;
    const int32_t* next = ids[i].data() + 1;
    check_targets(next, n, V);
    std::vector<float>& lp = out[i];
    lp.assign(static_cast<size_t>(n), 0.0f);
    logits_in_order(sc, ids[i].data(), n, [&](int64_t pos, int64_t k, const float* logits) {
      cross_entropy_rows(lp.data() + pos, logits, next + pos, k, V, V);
      for (int64_t r = pos; r < pos + k; ++r) lp[static_cast<size_t>(r)] = -lp[static_cast<size_t>(r)];
    });
  }
  return out;
}

std::vector<double> decoder_score_texts(const DecoderScorer& sc, const Tokenizer& tok,
                                        const std::vector<std::string>& texts, int64_t max_positions) {
  const auto lps = decoder_token_logprobs(sc, scored_text_ids(tok, texts, max_positions));
  std::vector<double> out(texts.size(), 0.0);
  for (size_t i = 0; i < lps.size(); ++i)
    for (float v : lps[i]) out[i] += v;
  return out;
}

ValidationSums decoder_validation_sums(const DecoderScorer& sc, const Model* ref, const ValidationSet& val, int64_t nb) {
  const int64_t V = sc.vocab_size;
  if (ref && ref->cfg.vocab_size != V)
    fail("decoder scores: the reference's vocabulary ", ref->cfg.vocab_size, " is not the decoder's ", V);
  const int64_t ld = ref ? ref->cfg.padded_vocab() : V;  // rows laid out as the reference's logits
  Activations ref_acts;
  ValidationSums s;
  std::vector<float> rows;  // (T, ld): one sequence's logits
  for (int64_t i = 0; i < nb; ++i) {
    const Batch b = val.batch(static_cast<size_t>(i));
    const int64_t T = b.T;
    check_targets(b.targets.data(), static_cast<int64_t>(b.B) * T, V);
    if (ref) {
      forward(*ref, ref_acts, b.inputs.data(), b.B, T);
      s.ref_loss_sum += loss_of_logits(*ref, ref_acts, b.targets.data());
    }
    double ce = 0;
    for (int64_t r = 0; r < b.B; ++r) {
      const int32_t* targets = b.targets.data() + r * T;
      sequence_rows(sc, b.inputs.data() + r * T, T, ld, rows);
      ce += cross_entropy(nullptr, rows.data(), targets, T, V, ld, 0.0f);
      if (ref) compare_logits(s.cmp, rows.data(), ref_acts.logits.data() + r * T * ld, targets, T, V, ld);
    }
    s.loss_sum += ce / static_cast<double>(static_cast<int64_t>(b.B) * T);
  }
  return s;
}

}  // namespace jtok
