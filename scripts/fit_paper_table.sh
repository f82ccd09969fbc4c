#!/usr/bin/env bash
# Fits the JTok paper's own Appendix C table (docs/data/paper_isoflops_*.csv): alpha, beta and
# R^2 of both frontiers (log2 L = alpha log10 C + beta) and the compute saving of JTok-M,
# with separate fits (the paper's formula) and with a shared slope.
# Usage: scripts/fit_paper_table.sh [--json] [--svg-dir DIR]   (JTOK_BIN overrides build/jtok)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
JTOK=${JTOK_BIN:-$ROOT/build/jtok}
[ -x "$JTOK" ] || { echo "fit_paper_table.sh: $JTOK not built (cmake --build build)" >&2; exit 1; }
"$JTOK" scaling fit \
  --frontier "$ROOT/docs/data/paper_isoflops_moe.csv" \
  --frontier "$ROOT/docs/data/paper_isoflops_jtokm.csv" "$@"
if [ "${1:-}" != "--json" ]; then
  cat <<'TXT'
paper's text (Appendix C): MoE alpha -0.2016 beta 5.1334 R^2 0.9994; JTok-M alpha -0.2009 beta 5.0881
R^2 0.9991; delta beta 0.038 -> saving 35.2%. See docs/results.md for the comparison.
TXT
fi
