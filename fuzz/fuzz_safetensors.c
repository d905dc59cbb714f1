/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target for the safetensors header and index parsers: what parses holds invariants. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../src/format/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(cond)                                                                          \
    do {                                                                                       \
        if (!(cond)) abort();                                                                  \
    } while (0)

/* The input: 8 bytes, little-endian, the length of the data section, then the header's JSON
 * bytes. The parser sees a file of 8 + header + data bytes. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 8) return 0;
    uint64_t dlen = 0;
    for (int i = 7; i >= 0; i--) dlen = dlen << 8 | data[i];
    uint64_t n = size - 8;
    /* Past 2^64 the file's size saturates: the parser sees UINT64_MAX - 8 - n data bytes. */
    uint64_t file_size = 8 + n + dlen < 8 + n ? UINT64_MAX : 8 + n + dlen;
    uint64_t data_len = file_size - 8 - n;
    /* A private copy of exactly n bytes, so a sanitizer flags any read past the header. */
    uint8_t *hdr = malloc(n ? n : 1);
    REQUIRE(hdr);
    memcpy(hdr, data + 8, n);
    char err[512];
    err[0] = 0;
    ckptio__st_header *h = (ckptio__st_header *)&err; /* must be reset to NULL */
    int rc = ckptio__st_parse(hdr, n, file_size, &h, err, sizeof err);
    if (rc < 0) {
        REQUIRE(h == NULL && err[0] != 0); /* every refusal says why */
        REQUIRE(rc == CKPTIO_E_CORRUPT || rc == CKPTIO_E_LIMIT || rc == CKPTIO_E_DTYPE ||
                rc == CKPTIO_E_DUPLICATE || rc == CKPTIO_E_SHAPE || rc == -ENOMEM);
    } else {
        REQUIRE(rc == 0 && h && h->data_start == 8 + n);
        uint64_t at = 0;
        for (uint64_t i = 0; i < h->n_tensors; i++) {
            const ckptio__st_tensor *t = &h->tensors[i];
            REQUIRE(t->begin == at && t->end >= t->begin);
            at = t->end;
            REQUIRE(t->name + t->name_len < h->strtab_len && h->strtab[t->name + t->name_len] == 0);
            REQUIRE(!memchr(h->strtab + t->name, 0, t->name_len));
            REQUIRE(t->ndim <= CKPTIO_MAX_NDIM && t->dims + t->ndim <= h->n_dims);
            REQUIRE(ckptio__st_dtype_name((int)t->st_dtype) != NULL);
        }
        REQUIRE(at == data_len);
        for (uint64_t i = 0; i < h->n_meta; i++) {
            const ckptio__st_meta *m = &h->meta[i];
            REQUIRE(m->key + m->key_len < h->strtab_len && m->val + m->val_len < h->strtab_len);
            REQUIRE(h->strtab[m->val + m->val_len] == 0);
        }
        REQUIRE(h->strtab_len <= n + 1);
        /* What parses encodes, and the encoding parses to the same header, where the encoded
         * file's size still fits in 64 bits. The tensors come back in the order of their
         * offsets, so their shapes do too: each is compared with its own tensor's, never the
         * dims arrays whole (those keep the order of the header that was read). */
        uint8_t *buf;
        uint64_t len;
        REQUIRE(ckptio__st_encode(h, 4096, &buf, &len, err, sizeof err) == 0);
        REQUIRE(len % 4096 == 0);
        ckptio__st_header *g = NULL;
        if (len + data_len >= len)
            REQUIRE(ckptio__st_parse(buf + 8, len - 8, len + data_len, &g, err, sizeof err) == 0);
        REQUIRE(!g || (g->n_tensors == h->n_tensors && g->n_meta == h->n_meta &&
                       g->n_dims == h->n_dims));
        for (uint64_t i = 0; g && i < h->n_tensors; i++) {
            const ckptio__st_tensor *x = &h->tensors[i], *y = &g->tensors[i];
            REQUIRE(x->name_len == y->name_len && x->st_dtype == y->st_dtype &&
                    x->ndim == y->ndim && x->begin == y->begin && x->end == y->end);
            REQUIRE(!memcmp(h->strtab + x->name, g->strtab + y->name, x->name_len));
            REQUIRE(!memcmp(h->dims + x->dims, g->dims + y->dims, x->ndim * sizeof *h->dims));
        }
        for (uint64_t i = 0; g && i < h->n_meta; i++) {
            const ckptio__st_meta *x = &h->meta[i], *y = &g->meta[i];
            REQUIRE(x->key_len == y->key_len && x->val_len == y->val_len);
            REQUIRE(!memcmp(h->strtab + x->key, g->strtab + y->key, x->key_len));
            REQUIRE(!memcmp(h->strtab + x->val, g->strtab + y->val, x->val_len));
        }
        ckptio__st_free(g);
        free(buf);
        ckptio__st_free(h);
    }
    /* The same bytes as an index (model.safetensors.index.json). */
    ckptio__st_index *ix = (ckptio__st_index *)&err;
    err[0] = 0;
    rc = ckptio__st_index_parse(hdr, n, &ix, err, sizeof err);
    if (rc < 0) {
        REQUIRE(ix == NULL && err[0] != 0);
        REQUIRE(rc == CKPTIO_E_CORRUPT || rc == CKPTIO_E_LIMIT || rc == CKPTIO_E_DUPLICATE ||
                rc == -ENOMEM);
    } else {
        REQUIRE(rc == 0 && ix && ix->strtab_len <= n + 1);
        for (uint64_t i = 0; i < ix->n_map + ix->n_meta; i++) {
            const ckptio__st_meta *m = i < ix->n_map ? &ix->map[i] : &ix->meta[i - ix->n_map];
            REQUIRE(m->key + m->key_len < ix->strtab_len && m->val + m->val_len < ix->strtab_len);
            REQUIRE(ix->strtab[m->key + m->key_len] == 0 && ix->strtab[m->val + m->val_len] == 0);
            REQUIRE(i >= ix->n_map || !memchr(ix->strtab + m->val, 0, m->val_len));
        }
        ckptio__st_index_free(ix);
    }
    free(hdr);
    return 0;
}
