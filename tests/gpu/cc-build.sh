#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A plain cc build of ckptio for machines without meson or the development packages (the GPU
# machine of `make test-gpu`): the library's sources, the ckptio command, the C tests, the GPU
# stand-in and the Python package with its extension, into BUILD/{obj,bin,pkg} (and BUILD/lib:
# carried runtime libraries). What it links and leaves out: below.
# usage: tests/gpu/cc-build.sh SRC BUILD PYTHON  (CKPTIO_CC_DEPS: the carried dependencies,
# default SRC/.gpu-deps; CKPTIO_CC_WITHOUT: see below; CKPTIO_CC_SHIM_XXHASH=1: use
# libxxhash.so.0 through our own declaration even where xxhash.h exists, to test that path)
set -euo pipefail
src="$1" B="$2" PY="$3"
CC="${CC:-$(command -v cc || command -v gcc || echo cc)}"
jobs="$(nproc 2>/dev/null || echo 4)"
mkdir -p "$B/obj" "$B/bin" "$B/gen" "$B/pkg/ckptio"
rm -f "$B/gen/xxhash.h" "$B/gen/tests.h"
cflags=(-std=c11 -O2 -g -fPIC -pthread -D_GNU_SOURCE -DCKPTIO_BUILDING -fvisibility=hidden
        -Wall -Wextra -I"$src/include" -I"$B/gen" -I"$src")
libs=(-pthread -ldl)

# ---- dependencies: the system's, else what tests/gpu/fetch-deps.sh carried, else without ----
# DEPS (default SRC/.gpu-deps) holds Debian's headers of libcurl, OpenSSL, zstd, xxHash and
# liburing (searched after the system's: -idirafter), liburing.a, and the runtime libraries
# libcrypto.so.3 and libzstd.so.1 (used only where the system has none; then BUILD/lib holds
# them and every binary finds them there by its rpath). A library is linked as -lNAME where
# the system has its development link, else by the path of its runtime file (the system's, as
# ldconfig knows it, or the carried one). CKPTIO_CC_WITHOUT="curl uring" builds as if
# the system and DEPS had none of those (to test those builds anywhere).
deps="${CKPTIO_CC_DEPS:-$src/.gpu-deps}"
for d in "$deps/include" "$deps/include/x86_64-linux-gnu"; do
    [ -d "$d" ] && cflags+=(-idirafter "$d")
done
without() { case " ${CKPTIO_CC_WITHOUT:-} " in *" $1 "*) return 0 ;; esac; return 1; }
have_header() { printf '#include <%s>\nint main(void){return 0;}\n' "$1" |
    "$CC" "${cflags[@]}" -x c - -o /dev/null >/dev/null 2>&1; }
links() { printf 'int main(void){return 0;}\n' | "$CC" -x c - -x none -o /dev/null "$@" >/dev/null 2>&1; }
# lib_for NAME SONAME: what links library NAME (-lNAME, a runtime file's path, the carried
# static archive); nothing where there is none.
lib_for() {
    local name="$1" soname="$2" p
    if links "-l$name"; then echo "-l$name"; return; fi
    p="$(ldconfig -p 2>/dev/null | awk -v s="$soname" '$1 == s {print $NF; exit}')"
    if [ -n "$p" ] && links "$p"; then echo "$p"; return; fi
    if [ -f "$deps/lib/$soname" ]; then
        mkdir -p "$B/lib"
        cp -L "$deps/lib/$soname" "$B/lib/$soname"
        echo "$B/lib/$soname"
        return
    fi
    [ -f "$deps/lib/lib$name.a" ] && links "$deps/lib/lib$name.a" && echo "$deps/lib/lib$name.a"
}
# use NAME SONAME HEADER: adds the library to libs and succeeds, or fails where it is missing.
use() {
    without "$1" && return 1
    have_header "$3" || return 1
    local l
    l="$(lib_for "$1" "$2")"
    [ -n "$l" ] || return 1
    libs+=("$l")
    case "$l" in "$B/lib/"*) libs+=("-Wl,-rpath,$B/lib") ;; esac
    echo "cc-build: $1: $l"
}
use crypto libcrypto.so.3 openssl/evp.h ||
    { echo "cc-build: no libcrypto (OpenSSL 3) and none in $deps: cannot build" >&2; exit 1; }
use zstd libzstd.so.1 zstd.h ||
    { echo "cc-build: no libzstd and none in $deps: cannot build" >&2; exit 1; }
curl=0 uring=0
use curl libcurl.so.4 curl/curl.h && curl=1
use uring liburing.so.2 liburing.h && uring=1
xxhash=header
if [ -n "${CKPTIO_CC_SHIM_XXHASH:-}" ] || ! have_header xxhash.h; then
    lib="$(ldconfig -p 2>/dev/null | awk '$1 == "libxxhash.so.0" {print $NF; exit}')"
    [ -n "$lib" ] || { echo "cc-build: no xxhash.h and no libxxhash.so.0: cannot build" >&2; exit 1; }
    # The one function ckptio calls, declared here; XXH_INLINE_ALL then has nothing to inline.
    printf '%s\n' '/* Declares the one xxHash function ckptio calls (libxxhash.so.0, no headers). */' \
        '#include <stddef.h>' '#include <stdint.h>' \
        'uint64_t XXH3_64bits(const void *data, size_t len);' >"$B/gen/xxhash.h"
    libs+=("$lib")
    xxhash="$lib"
fi
cat >"$B/gen/ckptio_config.h" <<CFG
#pragma once
#define CKPTIO_BUILD_TYPE "release"
#define CKPTIO_HAVE_IO_URING $uring
#define CKPTIO_HAVE_MPI 0
CFG
echo "cc-build: io_uring $uring, object storage (libcurl) $curl, xxhash $xxhash"

# The library: every source but the MPI communicator (and io_uring's without liburing).
srcs=()
while IFS= read -r f; do
    case "$f" in
    */ranks/comm_mpi.c | */common/hash_variant.c) continue ;;
    */io/uring.c) [ $uring = 1 ] || continue ;;
    */store/objc_none.c) [ $curl = 0 ] || continue ;;
    */store/http.c | */store/http_simple.c | */store/s3*.c | */store/gcs.c | */store/*_creds.c)
        [ $curl = 1 ] || continue ;;
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
# Without libcurl, the groups of the object stores' own tests are left out (tests/list.h's
# other groups are the list).
tests=() skip=" gpu_standin "
[ $curl = 1 ] || skip+="s3 s3_ckpt gcs gcp_creds store conf_parse "
for t in "$src"/tests/*.c; do
    n="$(basename "$t" .c)"
    case "$skip" in *" ${n#test_} "*) ;; *) tests+=("$t") ;; esac
done
list=()
if [ $curl = 0 ]; then
    grep -v -E '^TEST_GROUP\((s3|s3ckpt|gcs|gcp|store|conf)\)$' "$src/tests/list.h" >"$B/gen/tests.h"
    list=(-DCKPTIO_TEST_LIST="\"$B/gen/tests.h\"")
fi
"$CC" "${cflags[@]}" "${list[@]}" -I"$src/tests" "${tests[@]}" "$B/obj/libckptio.a" "${libs[@]}" -lm \
    -DCKPTIO_EXE="\"$B/bin/ckptio\"" -DCKPTIO_SOURCE_ROOT="\"$src\"" \
    -DCKPTIO_FUZZ_REPLAY="\"/nonexistent\"" -DCKPTIO_FUZZ_MERGE_REPLAY="\"/nonexistent\"" \
    -DCKPTIO_FUZZ_ST_REPLAY="\"/nonexistent\"" \
    -DCKPTIO_GPU_STANDIN="\"$B/bin/libckptio-gpu-standin.so\"" -o "$B/bin/ckptio-tests"

# The Python package: its sources and the extension, built for $PY.
inc="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
ext="$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
(cd "$src/python" && find ckptio \( -name '*.py' -o -name py.typed \) -exec cp --parents {} "$B/pkg/" \;)
if [ -f "$inc/Python.h" ]; then
    "$CC" "${cflags[@]}" -DCKPTIO_EXPERIMENTAL -I"$inc" -shared "$src"/python/ckptio/*.c \
        "$B/obj/libckptio.a" "${libs[@]}" -o "$B/pkg/ckptio/_core$ext"
else
    echo "cc-build: no Python.h for $PY: the Python extension is not built" >&2
fi
echo "cc-build: done"
