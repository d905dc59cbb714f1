#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Install the library into a scratch root, build the README's example against it through
# pkg-config (as a user's program would), run it, and check that only ckptio_* is exported and
# that the header, the version script and the built library list the same functions.
set -euo pipefail
build="$1"
"$(dirname "$0")/check-symbols.sh" "$build"
root="$(cd "$build" && pwd)/install-check"
rm -rf "$root"
meson install -C "$build" --destdir "$root" >/dev/null
pc="$(dirname "$(find "$root" -name ckptio.pc | head -n1)")"
libdir="$(dirname "$(find "$root" -name 'libckptio.so' | head -n1)")"
export PKG_CONFIG_PATH="$pc" PKG_CONFIG_SYSROOT_DIR="$root"
cc -std=c11 -Wall -Wextra -Werror examples/save_load.c $(pkg-config --cflags --libs ckptio) \
   -o "$root/example"
cd "$root"
LD_LIBRARY_PATH="$libdir" ./example "$root/example-ckpt" >/dev/null
bad="$(nm -D --defined-only "$libdir/libckptio.so" | awk '{print $3}' | grep -v '^ckptio_[a-z]' | grep -v '^CKPTIO_' || true)"
if [ -n "$bad" ]; then echo "install-check: unexpected exported symbols: $bad" >&2; exit 1; fi
echo "install-check: ok (example built with pkg-config against the installed library)"
