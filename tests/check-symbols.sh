#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Check that src/libckptio.map, include/ckptio.h and the built libckptio.so agree: every
# CKPTIO_API function is listed (experimental ones in a CKPTIO_EXPERIMENTAL_* node, the others
# in a stable node), the map names nothing else, and the library exports exactly the map.
# usage: tests/check-symbols.sh BUILD_DIR
set -euo pipefail
build="${1:?usage: $0 BUILD_DIR}"
src="$(cd "$(dirname "$0")/.." && pwd)"
header="$src/include/ckptio.h"
map="$src/src/libckptio.map"
lib="$build/libckptio.so"
[ -f "$lib" ] || { echo "check-symbols: $lib not found; build first (make)" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# The header's functions, read after the preprocessor so that line breaks and macros do not
# matter: CKPTIO_API expands to the visibility attribute, and the name is the last identifier
# before the opening parenthesis.
declared() {
    "${CC:-cc}" -E -P -x c "$@" "$header" | tr '\n' ' ' |
        grep -o 'visibility *( *"default" *) *) *)[^;(]*(' |
        sed 's/($//; s/.*[^A-Za-z0-9_]//' | sort -u
}
declared >"$tmp/stable"
declared -DCKPTIO_EXPERIMENTAL >"$tmp/all"
comm -13 "$tmp/stable" "$tmp/all" >"$tmp/experimental"

# The map as "node symbol" lines; comments stripped, wildcards outside `local:` refused.
sed 's:/\*.*\*/::g; s:#.*::' "$map" | awk -v map="$map" '
    /\/\*/ { incomment = 1 }
    incomment { if (/\*\//) incomment = 0; next }
    {
        gsub(/;/, " ; "); gsub(/\{/, " { "); gsub(/\}/, " } "); gsub(/:/, " : ")
        for (i = 1; i <= NF; i++) {
            t = $i
            if (t == "{") { node = prev; section = "global"; continue }
            if (t == "}") { node = ""; continue }
            if (t == ":") { section = prev; continue }
            if (t == ";") continue
            if (node != "" && section == "global" && $(i + 1) == ";") {
                if (t ~ /[*?\[]/) {
                    printf "check-symbols: %s: wildcard \"%s\" in node %s; list each symbol\n",
                        map, t, node > "/dev/stderr"
                    bad = 1
                }
                print node, t
            }
            prev = t
        }
    }
    END { exit bad }' >"$tmp/map"

# What the library exports, as "node symbol" (nm -D prints name@@node); version-node markers
# (type A) are not functions.
nm -D --defined-only "$lib" |
    awk '$2 != "A" { split($3, p, "@@"); print (p[2] == "" ? "-" : p[2]), p[1] }' |
    sort >"$tmp/exported"

fail=0
problem() { echo "check-symbols: $*" >&2; fail=1; }

while read -r sym; do
    node="$(awk -v s="$sym" '$2 == s { print $1 }' "$tmp/map")"
    if grep -qx "$sym" "$tmp/experimental"; then want=experimental; else want=stable; fi
    if [ -z "$node" ]; then
        where="a stable node (CKPTIO_0.1)"
        [ "$want" = stable ] || where="a CKPTIO_EXPERIMENTAL_* node"
        problem "$sym is declared CKPTIO_API in include/ckptio.h but missing from" \
            "src/libckptio.map: add it to $where"
    elif [ "$want" = experimental ] && [[ "$node" != CKPTIO_EXPERIMENTAL_* ]]; then
        problem "$sym is experimental in include/ckptio.h but listed in node $node of" \
            "src/libckptio.map: move it to a CKPTIO_EXPERIMENTAL_* node"
    elif [ "$want" = stable ] && [[ "$node" == CKPTIO_EXPERIMENTAL_* ]]; then
        problem "$sym is stable in include/ckptio.h but listed in node $node of" \
            "src/libckptio.map: move it to a stable node, or declare it in the header's" \
            "CKPTIO_EXPERIMENTAL section"
    fi
done <"$tmp/all"

while read -r node sym; do
    [ "$(grep -c " $sym\$" "$tmp/map")" -le 1 ] ||
        problem "$sym is listed more than once in src/libckptio.map"
    grep -qx "$sym" "$tmp/all" ||
        problem "src/libckptio.map names $sym, which include/ckptio.h does not declare" \
            "CKPTIO_API: remove it from the map or declare it"
    grep -qx "$node $sym" "$tmp/exported" ||
        problem "src/libckptio.map names $sym (node $node) but $lib does not export it as" \
            "$sym@@$node: define it in the library with CKPTIO_API, or remove it from the map"
done <"$tmp/map"

while read -r node sym; do
    grep -qx "$node $sym" "$tmp/map" ||
        problem "$lib exports $sym${node:+ (version $node)}, which src/libckptio.map does not list"
done <"$tmp/exported"

[ "$fail" = 0 ] || exit 1
echo "check-symbols: ok ($(wc -l <"$tmp/stable") stable and $(wc -l <"$tmp/experimental")" \
    "experimental functions: header, map and library agree)"
