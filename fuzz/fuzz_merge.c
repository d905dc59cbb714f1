/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target for the partial-manifest merge: whatever merges must validate and round-trip. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "../src/format/manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(cond)                                                                          \
    do {                                                                                       \
        if (!(cond)) abort();                                                                  \
    } while (0)

#define MAX_PARTS 8

/* The input: up to 8 pieces, each a 4-byte little-endian word then that many bytes (the last
 * piece may be cut short). The word's low 24 bits are the length; its top byte says how to
 * cut the decoded manifest down to a partial one (1: drop each tensor's first chunk, 2: its
 * last, 3: keep only its first), so that parts sharing a tensor can tile it between them. */
typedef struct piece {
    const uint8_t *p;
    size_t len;
    unsigned cut;
} piece;

static size_t split(const uint8_t *data, size_t size, piece *out)
{
    size_t n = 0, pos = 0;
    while (n < MAX_PARTS && size - pos >= 4) {
        uint32_t w = (uint32_t)data[pos] | (uint32_t)data[pos + 1] << 8 |
                     (uint32_t)data[pos + 2] << 16 | (uint32_t)data[pos + 3] << 24;
        pos += 4;
        size_t len = w & 0xFFFFFF;
        if (len > size - pos) len = size - pos;
        out[n++] = (piece){data + pos, len, (w >> 24) & 3};
        pos += len;
    }
    return n;
}

/* Decode, and if that fails, decode a copy with both checksums repaired (a mutation almost
 * never keeps them right), so the fuzzer reaches merges of changed manifests. */
static ckptio__manifest *decode(const piece *pc)
{
    char err[256];
    ckptio__manifest *m = NULL;
    if (ckptio__manifest_decode(pc->p, pc->len, &m, err, sizeof err) == 0) return m;
    if (pc->len < 128) return NULL;
    uint32_t hsize;
    memcpy(&hsize, pc->p + 12, 4);
    if (hsize < 128 || hsize > pc->len || hsize % 8) return NULL;
    uint8_t *copy = malloc(pc->len);
    REQUIRE(copy);
    memcpy(copy, pc->p, pc->len);
    uint64_t body = ckptio__hash(copy + hsize, pc->len - hsize);
    memcpy(copy + 24, &body, 8);
    uint64_t head = ckptio__hash(copy, hsize - 8);
    memcpy(copy + hsize - 8, &head, 8);
    if (ckptio__manifest_decode(copy, pc->len, &m, err, sizeof err) != 0) m = NULL;
    free(copy);
    return m;
}

static void cut(ckptio__manifest *m, unsigned how)
{
    for (uint64_t i = 0; i < m->n_tensors && how; i++) {
        ckptio__mtensor *t = &m->tensors[i];
        if (t->n_chunks < 2) continue;
        if (how == 1) t->chunk0++, t->n_chunks--;
        if (how == 2) t->n_chunks--;
        if (how == 3) t->n_chunks = 1;
    }
}

#define SAME_ARRAY(a, b, field, count)                                                         \
    ((a)->count == (b)->count &&                                                               \
     ((a)->count == 0 || !memcmp((a)->field, (b)->field, (a)->count * sizeof *(a)->field)))

static bool same_manifest(const ckptio__manifest *a, const ckptio__manifest *b)
{
    return a->version == b->version && a->csum_algo == b->csum_algo &&
           a->csum_block == b->csum_block && SAME_ARRAY(a, b, files, n_files) &&
           SAME_ARRAY(a, b, tensors, n_tensors) && SAME_ARRAY(a, b, chunks, n_chunks) &&
           SAME_ARRAY(a, b, meta, n_meta) && SAME_ARRAY(a, b, dims, n_dims) &&
           SAME_ARRAY(a, b, csums, n_csums) && SAME_ARRAY(a, b, strtab, strtab_len);
}

/* Chunks of tensor `name` in part m that hold elements (decoded parts are sorted by name). */
static uint64_t chunks_in(const ckptio__manifest *m, const char *name, uint32_t len)
{
    uint64_t lo = 0, hi = m->n_tensors;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        const ckptio__mtensor *t = &m->tensors[mid];
        int c = memcmp(m->strtab + t->name, name, t->name_len < len ? t->name_len : len);
        if (c == 0) c = (t->name_len > len) - (t->name_len < len);
        if (c == 0) {
            uint64_t n = 0;
            for (uint64_t k = 0; k < t->n_chunks; k++) n += m->chunks[t->chunk0 + k].raw_len > 0;
            return n;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

static void check_merged(ckptio__manifest *const *parts, size_t n, const ckptio__manifest *m)
{
    char err[512];
    REQUIRE(ckptio__manifest_validate(m, err, sizeof err) == 0);
    uint64_t files = 0, meta = 0;
    for (size_t i = 0; i < n; i++) files += parts[i]->n_files, meta += parts[i]->n_meta;
    REQUIRE(m->n_files == files && m->n_meta <= meta);
    for (uint64_t i = 0; i < m->n_tensors; i++) {
        const ckptio__mtensor *t = &m->tensors[i];
        uint64_t want = 0;
        for (size_t p = 0; p < n; p++) want += chunks_in(parts[p], m->strtab + t->name, t->name_len);
        /* an empty tensor keeps one chunk whatever the parts held */
        REQUIRE(t->n_chunks == want || (want == 0 && t->n_chunks == 1));
    }
    uint64_t len, len2;
    REQUIRE(ckptio__manifest_encoded_size(m, &len) == 0);
    uint8_t *buf = malloc(len);
    REQUIRE(buf && ckptio__manifest_encode(m, buf, len) == 0);
    ckptio__manifest *d = NULL;
    REQUIRE(ckptio__manifest_decode(buf, len, &d, err, sizeof err) == 0);
    REQUIRE(same_manifest(m, d));
    REQUIRE(ckptio__manifest_encoded_size(d, &len2) == 0 && len2 == len);
    ckptio__manifest_free(d);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    piece pcs[MAX_PARTS];
    ckptio__manifest *parts[MAX_PARTS];
    size_t n_pieces = split(data, size, pcs), n = 0;
    for (size_t i = 0; i < n_pieces; i++) {
        ckptio__manifest *m = decode(&pcs[i]);
        if (!m) continue;
        cut(m, pcs[i].cut);
        parts[n++] = m;
    }
    if (n == 0) return 0;
    char err[512];
    err[0] = 0;
    ckptio__manifest *out = NULL;
    int rc = ckptio__manifest_merge((const ckptio__manifest *const *)parts, n, &out, err,
                                    sizeof err);
    if (rc < 0) {
        REQUIRE(out == NULL && err[0] != 0); /* every refusal says why */
        REQUIRE(rc == CKPTIO_E_CORRUPT || rc == CKPTIO_E_DUPLICATE || rc == CKPTIO_E_SHAPE ||
                rc == CKPTIO_E_INCOMPLETE || rc == CKPTIO_E_RANGE || rc == CKPTIO_E_USAGE ||
                rc == CKPTIO_E_LIMIT || rc == -ENOMEM);
    } else {
        REQUIRE(rc == 0 && out);
        check_merged(parts, n, out);
    }
    ckptio__manifest_free(out);
    for (size_t i = 0; i < n; i++) ckptio__manifest_free(parts[i]);
    return 0;
}
