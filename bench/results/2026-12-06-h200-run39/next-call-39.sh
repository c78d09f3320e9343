#!/usr/bin/env bash
# Run 39 (NOT RUN YET; written 2026-12-06, no device time left): window-rowpass.patch beside this
# file against HEAD's kernel rebuilt in the same call. Before the call:
#   git apply bench/results/next/window-rowpass.patch
#   mkdir -p .carry/base && git show HEAD:kernels/rel_pos_attention.cu > .carry/base/rel_pos_attention.cu
#   git show HEAD:kernels/rel_pos_attention.cc > .carry/base/rel_pos_attention.cc
# The patch: in window mode each thread keeps one 16-byte column of rows r0, r0 + 12, ... of a key
# tile (the column, its shared-memory offset and the table index step by constants) and a padded
# key's source is a byte offset from kb selected against the token's (no pointer select). SASS per
# key tile per thread (cuobjdump): vit_h 1122 -> 1042 (loads 291 -> 199), vit_b 967 -> 933 (loads
# 208 -> 135), and no register spills left in the window kernels (were 20-32 B).
# The steps are run 37's (the same comparison): its script runs as is from its folder.
#   OUT=$OUT CALL_LIMIT=400 bash bench/results/next/next-call-39.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
[ -f .carry/base/rel_pos_attention.cu ] || { echo "stage HEAD's kernel in .carry/base first (see above)"; exit 2; }
exec bash bench/results/2026-12-06-h100-run37/next-call-37.sh
