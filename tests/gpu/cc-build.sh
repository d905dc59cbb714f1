#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A plain cc build of ckptio for machines without meson, liburing or xxhash headers (the GPU
# machine of `make test-gpu`): the library's sources, the ckptio command, the C tests, the GPU
# stand-in and the Python extension, into BUILD/{obj,bin,pkg}.
# usage: tests/gpu/cc-build.sh SRC BUILD PYTHON  (CKPTIO_CC_SHIM_XXHASH=1: use libxxhash.so.0
# through our own declaration even where xxhash.h exists, to test that path)
set -euo pipefail
src="$1" B="$2" PY="$3"
CC="${CC:-cc}"
jobs="$(nproc 2>/dev/null || echo 4)"
mkdir -p "$B/obj" "$B/bin" "$B/gen" "$B/pkg/ckptio"
cflags=(-std=c11 -O2 -g -fPIC -pthread -D_GNU_SOURCE -DCKPTIO_BUILDING -fvisibility=hidden
        -Wall -Wextra -I"$src/include" -I"$B/gen" -I"$src")
libs=(-pthread -ldl)

have_header() { printf '#include <%s>\nint main(void){return 0;}\n' "$1" |
    "$CC" -x c - -o /dev/null "${@:2}" >/dev/null 2>&1; }

uring=0
if have_header liburing.h -luring; then uring=1; libs+=(-luring); fi
if [ -n "${CKPTIO_CC_SHIM_XXHASH:-}" ] || ! have_header xxhash.h; then
    lib="$(ldconfig -p 2>/dev/null | awk '/libxxhash\.so\.0 /{print $NF; exit}')"
    [ -n "$lib" ] || { echo "cc-build: no xxhash.h and no libxxhash.so.0: cannot build" >&2; exit 1; }
    # The one function ckptio calls, declared here; XXH_INLINE_ALL then has nothing to inline.
    printf '%s\n' '/* Declares the one xxHash function ckptio calls (libxxhash.so.0, no headers). */' \
        '#include <stddef.h>' '#include <stdint.h>' \
        'uint64_t XXH3_64bits(const void *data, size_t len);' >"$B/gen/xxhash.h"
    libs+=("$lib")
fi
cat >"$B/gen/ckptio_config.h" <<CFG
#pragma once
#define CKPTIO_BUILD_TYPE "release"
#define CKPTIO_HAVE_IO_URING $uring
#define CKPTIO_HAVE_MPI 0
#define CKPTIO_HAVE_ZSTD 0
CFG
echo "cc-build: io_uring $uring, xxhash ${lib:-header}"

# The library: every source but the MPI communicator (and io_uring's without liburing).
srcs=()
while IFS= read -r f; do
    case "$f" in
    */ranks/comm_mpi.c | */common/hash_variant.c) continue ;;
    */io/uring.c) [ $uring = 1 ] || continue ;;
    esac
    srcs+=("$f")
done < <(find "$src/src" -name '*.c' | sort)
compile() { # out src extra-flags...
    local o="$1" s="$2"
    shift 2
    "$CC" "${cflags[@]}" "$@" -c "$s" -o "$o"
}
objs=() pids=()
for s in "${srcs[@]}"; do
    o="$B/obj/lib_$(echo "${s#"$src"/}" | tr '/' '_').o"
    objs+=("$o")
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    compile "$o" "$s" &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
if [ "$(uname -m)" = x86_64 ]; then
    compile "$B/obj/hash_avx2.o" "$src/src/common/hash_variant.c" -mavx2 -DCKPTIO_HASH_NAME=ckptio__hash_avx2
    compile "$B/obj/hash_avx512.o" "$src/src/common/hash_variant.c" -mavx512f -DCKPTIO_HASH_NAME=ckptio__hash_avx512
    objs+=("$B/obj/hash_avx2.o" "$B/obj/hash_avx512.o")
    cflags+=(-DCKPTIO_HAVE_HASH_VARIANTS)
fi
ar rcs "$B/obj/libckptio.a" "${objs[@]}"

# The command, the stand-in, the C tests.
"$CC" "${cflags[@]}" -I"$src/tools" "$src"/tools/*.c "$B/obj/libckptio.a" "${libs[@]}" -lm -o "$B/bin/ckptio"
"$CC" -std=c11 -O2 -fPIC -shared -pthread -D_GNU_SOURCE "$src/tests/gpu_standin.c" \
    -o "$B/bin/libckptio-gpu-standin.so"
tests=()
for t in "$src"/tests/*.c; do
    case "$t" in */gpu_standin.c) ;; *) tests+=("$t") ;; esac
done
"$CC" "${cflags[@]}" -I"$src/tests" "${tests[@]}" "$B/obj/libckptio.a" "${libs[@]}" -lm \
    -DCKPTIO_EXE="\"$B/bin/ckptio\"" -DCKPTIO_SOURCE_ROOT="\"$src\"" \
    -DCKPTIO_FUZZ_REPLAY="\"/nonexistent\"" -DCKPTIO_FUZZ_MERGE_REPLAY="\"/nonexistent\"" \
    -DCKPTIO_FUZZ_ST_REPLAY="\"/nonexistent\"" \
    -DCKPTIO_GPU_STANDIN="\"$B/bin/libckptio-gpu-standin.so\"" -o "$B/bin/ckptio-tests"

# The Python package: its sources and the extension, built for $PY.
inc="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
ext="$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
cp "$src"/python/ckptio/*.py "$B/pkg/ckptio/"
[ -f "$src/python/ckptio/py.typed" ] && cp "$src/python/ckptio/py.typed" "$B/pkg/ckptio/"
if [ -f "$inc/Python.h" ]; then
    "$CC" "${cflags[@]}" -DCKPTIO_EXPERIMENTAL -I"$inc" -shared "$src"/python/ckptio/_core.c \
        "$src"/python/ckptio/_comm.c "$B/obj/libckptio.a" "${libs[@]}" \
        -o "$B/pkg/ckptio/_core$ext"
else
    echo "cc-build: no Python.h for $PY: the Python extension is not built" >&2
fi
echo "cc-build: done"
