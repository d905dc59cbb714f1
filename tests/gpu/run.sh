#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `make test-gpu`: build ckptio on a machine with an NVIDIA GPU, run every GPU test and the GPU
# bench, and write ONE JSON summary. Needs no network and installs nothing: a C compiler, the
# system python3 (with torch / jax / cupy where present) and its headers. Without a GPU it
# says "no GPU", writes a summary saying so and exits 0.
#
# Build: meson when meson, ninja and libxxhash (pkg-config) are all there; otherwise a plain
# cc build of the same sources (tests/gpu/cc-build.sh), which takes what the machine lacks of
# the headers and of libcrypto and libzstd from .gpu-deps/ (tests/gpu/fetch-deps.sh makes it
# on a machine with Debian's registry; the GPU machine's call carries it), builds without
# liburing (psync backend only) or libcurl (no object stores) where neither is there, and
# says which it did ("build_features" in the summary). Output: $GPU_BUILD (default
# build-gpu/) and the summary at $GPU_SUMMARY (default $OUT/gpu-summary.json when $OUT is set,
# else build-gpu/gpu-summary.json); with $OUT set, the logs and bench.json go there too.
# Budget: under 8 minutes on one GPU (GPU_BENCH_BYTES, default 4 GiB, sizes the bench).
# For checking this script where there is no GPU: GPU_RUN_FORCE=1 goes on past the GPU check
# (the real-driver tests then skip, and the bench fails unless GPU_BENCH_DEVICE=cpu makes it
# a dry run on CPU tensors); GPU_BUILD_WITH=cc skips meson (tests/python/test_gpu_run.py).
set -uo pipefail
src="$(cd "$(dirname "$0")/../.." && pwd)"
B="${GPU_BUILD:-$src/build-gpu}"
mkdir -p "$B"
B="$(cd "$B" && pwd)"
summary="${GPU_SUMMARY:-${OUT:+$OUT/gpu-summary.json}}"
summary="${summary:-$B/gpu-summary.json}"
PY="${PYTHON:-python3}"
log="$B/run.log"
: >"$log"
say() { echo "test-gpu: $*" | tee -a "$log"; }
t_start=$(date +%s)

write_skip() { # reason
    printf '{"gpu": null, "skipped": "%s", "tested": false}\n' "$1" >"$summary"
    say "$1: nothing to test (summary: $summary)"
    exit 0
}

# ---- is there a GPU? ----
gpu_name=""
if command -v nvidia-smi >/dev/null 2>&1; then
    gpu_name="$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
fi
if [ -n "${GPU_RUN_FORCE:-}" ]; then
    say "GPU_RUN_FORCE: going on without checking for a GPU"
elif [ -z "$gpu_name" ] && ! ls /dev/nvidia0 >/dev/null 2>&1; then
    write_skip "no GPU (no nvidia-smi GPU, no /dev/nvidia0)"
fi
if [ -z "${GPU_RUN_FORCE:-}" ] && ! "$PY" -c 'import ctypes; l = ctypes.CDLL("libcuda.so.1"); import sys; n = ctypes.c_int(0); sys.exit(0 if l.cuInit(0) == 0 and l.cuDeviceGetCount(ctypes.byref(n)) == 0 and n.value > 0 else 1)' 2>>"$log"; then
    write_skip "no GPU (libcuda.so.1 missing or cuInit reports no device)"
fi
say "GPU: ${gpu_name:-unknown}"

# ---- build ----
jobs="$(nproc 2>/dev/null || echo 4)"
built=""
if [ "${GPU_BUILD_WITH:-}" != cc ] && command -v meson >/dev/null 2>&1 && command -v ninja >/dev/null 2>&1 &&
    pkg-config --exists libxxhash 2>/dev/null; then
    if { [ -f "$B/meson/build.ninja" ] || meson setup "$B/meson" "$src" -Dmpi=disabled \
            -Dpython=enabled -Dbuildtype=release; } >>"$log" 2>&1 &&
        ninja -C "$B/meson" >>"$log" 2>&1; then
        built=meson
        mkdir -p "$B/pkg/ckptio" "$B/bin"
        (cd "$src/python" && find ckptio \( -name '*.py' -o -name py.typed \) -exec cp --parents {} "$B/pkg/" \;)
        cp "$B/meson"/python/_core*.so "$B/pkg/ckptio/" 2>>"$log"
        ln -sf "$B/meson/tests/ckptio-tests" "$B/bin/ckptio-tests"
        ln -sf "$B/meson/tests/libckptio-gpu-standin.so" "$B/bin/libckptio-gpu-standin.so"
        ln -sf "$B/meson/tools/ckptio" "$B/bin/ckptio"
        ls "$B/pkg/ckptio"/_core*.so >/dev/null 2>&1 || built=""
    fi
    [ -n "$built" ] || say "meson build failed (see $log); trying a plain cc build"
fi
if [ -z "$built" ]; then
    if ! "$src/tests/gpu/cc-build.sh" "$src" "$B" "$PY" >>"$log" 2>&1; then
        tail -30 "$log"
        printf '{"gpu": "%s", "error": "build failed: see %s", "tested": false}\n' \
            "$gpu_name" "$log" >"$summary"
        exit 1
    fi
    built=cc
fi
features="meson: every feature"
[ "$built" = cc ] && features="$(sed -n 's/^cc-build: io_uring/io_uring/p' "$log" | tail -1)"
say "built with $built ($features) in $(($(date +%s) - t_start)) s"

# ---- cuFile ----
# ckptio opens libcufile.so.0 by name; where the system has none, the one a Python package
# carries (pip's CUDA: nvidia-cufile), so that the GDS phases run through cuFile whenever it
# is on the machine at all (its driver may still refuse, in which case the summary says why).
cufile="system"
if [ -n "${CKPTIO_CUFILE_LIBRARY:-}" ]; then
    cufile="$CKPTIO_CUFILE_LIBRARY"
elif ! ldconfig -p 2>/dev/null | grep -q 'libcufile\.so\.0 '; then
    cufile="$("$PY" -c 'import glob, site
print(next(iter(sorted(p for d in site.getsitepackages()
                       for p in glob.glob(d + "/nvidia/**/libcufile.so.0", recursive=True))), ""))' \
        2>>"$log")"
    if [ -n "$cufile" ]; then export CKPTIO_CUFILE_LIBRARY="$cufile"; else cufile="none found"; fi
fi
say "cuFile: $cufile"

# ---- tests ----
# The C GPU tests against the stand-in (pipeline logic), then against the real driver.
c_standin=fail c_real=fail py_tests=skipped
"$B/bin/ckptio-tests" gpu_ >"$B/c-standin.txt" 2>&1 && c_standin=pass
CKPTIO_TEST_REAL_GPU=1 "$B/bin/ckptio-tests" gpu_ >"$B/c-real.txt" 2>&1 && c_real=pass
say "C GPU tests: stand-in $c_standin, real driver $c_real ($(tail -1 "$B/c-real.txt"))"
export PYTHONPATH="$B/pkg${PYTHONPATH:+:$PYTHONPATH}"
export CKPTIO_GPU_STANDIN="$B/bin/libckptio-gpu-standin.so"
export JAX_PLATFORMS="${JAX_PLATFORMS-}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false # the bench shares the GPU with jax
if "$PY" -c 'import pytest' 2>/dev/null; then
    (cd "$B" && "$PY" -m pytest -q -p no:cacheprovider "$src/tests/python/test_gpu.py" \
        -o addopts="" --rootdir "$src/tests/python") >"$B/py-tests.txt" 2>&1 &&
        py_tests=pass || py_tests=fail
    say "Python GPU tests: $py_tests ($(tail -1 "$B/py-tests.txt"))"
else
    say "pytest is not installed: the Python tests are skipped (the bench checks equality)"
fi

# ---- bench ----
bench_dir="${GPU_BENCH_DIR:-$B/bench-dir}"
mkdir -p "$bench_dir"
rm -f "$B/bench.json" # a killed bench must not leave an earlier run's figures in the summary
# Bounded (GPU_BENCH_TIMEOUT, default 400 s: its budget of 300 s and the phases it cannot cut,
# leaving the build and tests their share of the device call's 540 s), so that a hang still
# leaves the summary and the logs of everything before it.
timeout -k 10 "${GPU_BENCH_TIMEOUT:-400}" "$PY" "$src/tests/gpu/bench.py" --dir "$bench_dir" \
    --ckptio "$B/bin/ckptio" --out "$B/bench.json" >>"$log" 2>&1
bench_rc=$?
[ $bench_rc = 124 ] && say "bench: killed after ${GPU_BENCH_TIMEOUT:-400} s"
rm -rf "$bench_dir"
say "bench: exit $bench_rc"

"$PY" - "$summary" "$gpu_name" "$built" "$c_standin" "$c_real" "$py_tests" "$B" "$t_start" \
    "$features" "$cufile" <<'PYEOF'
import json, sys, time
out, gpu, built, cs, cr, pt, b, t0, features, cufile = sys.argv[1:11]
try:
    bench = json.load(open(f"{b}/bench.json"))
except Exception as e:  # noqa: BLE001 - the summary says what failed
    bench = {"error": f"no bench results: {e}"}
s = {"gpu": gpu, "tested": True, "build": built, "build_features": features, "cufile": cufile,
     "c_tests": {"standin": cs, "real_driver": cr}, "python_tests": pt,
     "seconds": int(time.time()) - int(t0), **bench}
json.dump(s, open(out, "w"), indent=1)
print(json.dumps(s, indent=1))
PYEOF
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
    for f in run.log c-standin.txt c-real.txt py-tests.txt bench.json; do
        [ -f "$B/$f" ] && cp "$B/$f" "$OUT/"
    done
fi
[ "$c_standin" = pass ] && [ "$c_real" = pass ] && [ "$py_tests" != fail ] && [ $bench_rc = 0 ]
