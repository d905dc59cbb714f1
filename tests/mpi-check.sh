#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Run the MPI test programs (the communicator's, and ckptio_save_dist's) under mpirun on 1, 2
# and 4 ranks, each launch bounded by `timeout 60`; prints "N passed, N failed" over every launch. Skips (exit 0, one line) when
# ckptio was built without MPI.
# usage: tests/mpi-check.sh BUILD_DIR
set -uo pipefail
build="${1:?usage: $0 BUILD_DIR}"
if [ ! -x "$build/tests/test-comm-mpi" ]; then
    echo "mpi-check: skipped: ckptio was built without MPI (install libopenmpi-dev and" \
        "openmpi-bin, then meson setup --reconfigure $build)"
    exit 0
fi
if ! command -v mpirun >/dev/null; then
    echo "mpi-check: skipped: mpirun not found (install openmpi-bin)"
    exit 0
fi
passed=0 failed=0
for exe in "$build/tests/test-comm-mpi" "$build/tests/test-save-mpi"; do
for np in 1 2 4; do
    out="$(timeout 60 mpirun --allow-run-as-root --oversubscribe -np "$np" "$exe" 2>&1)"
    rc=$?
    line="$(grep -E '^mpi [0-9]+ ranks: [0-9]+ passed, [0-9]+ failed$' <<<"$out" | tail -n1)"
    if [ "$rc" = 0 ] && [ -n "$line" ]; then
        echo "mpi-check: $(basename "$exe"): $line"
        p="$(sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed/\1/' <<<"$line")"
        f="$(sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed/\2/' <<<"$line")"
        passed=$((passed + p)) failed=$((failed + f))
    else
        [ "$rc" = 124 ] && echo "mpi-check: -np $np timed out after 60 s"
        echo "mpi-check: $(basename "$exe") -np $np failed (exit $rc):"
        sed 's/^/    | /' <<<"$out" | tail -n 40
        failed=$((failed + 1))
    fi
done
done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
