#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What `make test-gpu` may need on a machine with no package registry, fetched here from
# Debian's: the headers of libcurl, OpenSSL, zstd, xxHash and liburing, liburing.a (built
# -fPIC, so it links into the Python extension too), and the runtime libraries that have no
# dependencies of their own, libcrypto.so.3 and libzstd.so.1. tests/gpu/cc-build.sh uses each
# only where that machine has none of its own. Nothing else is carried: without libcurl that
# build leaves out the object stores. Writes DIR (default .gpu-deps/ in the checkout, which git
# ignores and the GPU machine's call carries: `carry: [".gpu-deps"]`), about 8 MB.
# usage: tests/gpu/fetch-deps.sh [DIR]   (needs `apt-get update` to have run once)
set -euo pipefail
src="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-$src/.gpu-deps}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
pkgs=(libcurl4-openssl-dev libssl-dev libssl3 libzstd-dev libzstd1 libxxhash-dev liburing-dev)
# The GPU machine is x86-64: its packages, whatever this machine is.
if ! (cd "$tmp" && apt-get download "${pkgs[@]/%/:amd64}") >"$tmp/apt.log" 2>&1; then
    cat "$tmp/apt.log" >&2
    echo "fetch-deps: apt-get download failed (run apt-get update once, as root)" >&2
    exit 1
fi
for d in "$tmp"/*.deb; do dpkg-deb -x "$d" "$tmp/root"; done
lib="$tmp/root/usr/lib/x86_64-linux-gnu"
rm -rf "$out"
mkdir -p "$out/lib"
cp -a "$tmp/root/usr/include" "$out/include"
cp -L "$lib/liburing.a" "$lib/libcrypto.so.3" "$lib/libzstd.so.1" "$out/lib/"
ls "$tmp"/*.deb | sed 's|.*/||' >"$out/PACKAGES"
echo "fetch-deps: $(du -sh "$out" | cut -f1) in $out, from: $(tr '\n' ' ' <"$out/PACKAGES")"
