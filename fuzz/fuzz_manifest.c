/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target for the manifest decoder: whatever it accepts must re-encode byte for byte. */
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

static bool fits(uint64_t start, uint64_t n, uint64_t limit)
{
    return start <= limit && n <= limit - start;
}

static bool str_in(const ckptio__manifest *m, uint64_t off, uint64_t len)
{
    return fits(off, len, m->strtab_len) && off + len < m->strtab_len && m->strtab[off + len] == 0;
}

/* Every index a decoded manifest hands to a loader lies inside its array; reading through
 * each one also lets ASan see a wrong arena layout. */
static void check_indices(const ckptio__manifest *m)
{
    uint64_t sink = 0, chunks = 0;
    for (uint64_t i = 0; i < m->n_files; i++)
        REQUIRE(str_in(m, m->files[i].name, m->files[i].name_len));
    for (uint64_t i = 0; i < m->n_tensors; i++) {
        const ckptio__mtensor *t = &m->tensors[i];
        REQUIRE(str_in(m, t->name, t->name_len));
        REQUIRE(ckptio_dtype_size((int)t->dtype) > 0 && t->ndim <= CKPTIO_MAX_NDIM);
        REQUIRE(fits(t->dims, t->ndim, m->n_dims));
        REQUIRE(t->n_chunks > 0 && fits(t->chunk0, t->n_chunks, m->n_chunks));
        chunks += t->n_chunks;
        const uint64_t *shape = m->dims + t->dims;
        for (uint64_t k = 0; k < t->n_chunks; k++) {
            const ckptio__mchunk *c = &m->chunks[t->chunk0 + k];
            REQUIRE(c->tensor == i && c->file < m->n_files);
            REQUIRE(fits(c->dims, 2 * (uint64_t)t->ndim, m->n_dims));
            REQUIRE(fits(c->csums, c->n_csums, m->n_csums));
            REQUIRE(fits(c->file_off, c->stored_len, m->files[c->file].size));
            const uint64_t *off = m->dims + c->dims, *shp = off + t->ndim;
            for (uint32_t d = 0; d < t->ndim; d++) REQUIRE(fits(off[d], shp[d], shape[d]));
            for (uint64_t j = 0; j < c->n_csums; j++) sink += m->csums[c->csums + j];
        }
    }
    REQUIRE(chunks == m->n_chunks);
    for (uint64_t i = 0; i < m->n_meta; i++) {
        REQUIRE(str_in(m, m->meta[i].key, m->meta[i].key_len));
        REQUIRE(str_in(m, m->meta[i].val, m->meta[i].val_len));
    }
    volatile uint64_t keep = sink;
    (void)keep;
}

static uint8_t *encode(const ckptio__manifest *m, uint64_t *len)
{
    REQUIRE(ckptio__manifest_encoded_size(m, len) == 0);
    uint8_t *buf = malloc(*len);
    REQUIRE(buf);
    REQUIRE(ckptio__manifest_encode(m, buf, *len) == 0);
    return buf;
}

/* Decode; on success the re-encoding must equal the input when the input is a v1.0 manifest
 * (the encoding is canonical), and must itself decode and re-encode to the same bytes. */
static void one(const uint8_t *data, size_t size)
{
    char err[256];
    err[0] = 0;
    ckptio__manifest *m = NULL;
    int rc = ckptio__manifest_decode(data, size, &m, err, sizeof err);
    if (rc < 0) {
        REQUIRE(m == NULL && err[0] != 0); /* every refusal says why */
        REQUIRE(rc == CKPTIO_E_CORRUPT || rc == CKPTIO_E_FORMAT || rc == CKPTIO_E_LIMIT ||
                rc == -ENOMEM);
        return;
    }
    REQUIRE(rc == 0 && m && ckptio__manifest_validate(m, err, sizeof err) == 0);
    check_indices(m);
    uint64_t len, len2;
    uint8_t *buf = encode(m, &len);
    bool minor0 = data[10] == 0 && data[11] == 0;
    if (minor0) REQUIRE(len == size && memcmp(buf, data, size) == 0);
    ckptio__manifest *m2 = NULL;
    REQUIRE(ckptio__manifest_decode(buf, len, &m2, err, sizeof err) == 0);
    uint8_t *buf2 = encode(m2, &len2);
    REQUIRE(len2 == len && memcmp(buf2, buf, len) == 0);
    free(buf2);
    free(buf);
    ckptio__manifest_free(m2);
    ckptio__manifest_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    one(data, size);
    /* A mutation almost never keeps both checksums right; decode a copy with them repaired too,
     * so that the fuzzer reaches the parser and the validator behind them. */
    uint32_t hsize;
    if (size < 128) return 0;
    memcpy(&hsize, data + 12, 4);
    if (hsize < 128 || hsize > size || hsize % 8) return 0;
    uint8_t *copy = malloc(size);
    REQUIRE(copy);
    memcpy(copy, data, size);
    uint64_t body = ckptio__hash(copy + hsize, size - hsize);
    memcpy(copy + 24, &body, 8);
    uint64_t head = ckptio__hash(copy, hsize - 8);
    memcpy(copy + hsize - 8, &head, 8);
    if (memcmp(copy, data, size) != 0) one(copy, size);
    free(copy);
    return 0;
}
