#!/usr/bin/env bash
# Training and decoding give the bits recorded for this host (scripts/bit_identity.sh: 18
# checkpoints of 20 steps at P = 1 and 2 over every --embp mode and both table optimizers, 5 greedy
# decodes), and the relations that hold on any host; on a host without a record, those relations
# and a NOTE naming the host signature and the record command.
set -euo pipefail
JTOK_BIN=${JTOK_BIN:?} exec bash "${JTOK_ROOT:?}/scripts/bit_identity.sh"
