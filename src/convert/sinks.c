/* SPDX-License-Identifier: Apache-2.0 */
/* The convert engine's safetensors sinks: one file, or Hugging Face shards and their index. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "convert.h"

static bool is_text(const void *v, size_t n)
{
    const unsigned char *p = v;
    for (size_t i = 0; i < n;) {
        unsigned c = p[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!k || c == 0 || i + k > n) return false;
        for (size_t j = 1; j < k; j++)
            if ((p[i + j] & 0xC0) != 0x80) return false;
        i += k;
    }
    return true;
}

static const char *shard_name(const ckptio__conv *c, uint32_t s, char *buf, size_t n)
{
    snprintf(buf, n, "model-%05u-of-%05u.safetensors", s + 1, c->n_shards);
    return buf;
}

static int st_dtype_of(const ckptio__conv *c, size_t i)
{
    /* A foreign reader keeps the dtypes ckptio has no code for (stored as bytes). */
    if (c->reader && c->a.from != CKPTIO_CONVERT_CKPTIO) {
        int st = ckptio_reader_st_dtype(c->reader, i);
        if (st > 0) return st;
    }
    for (int s = 1; s < CKPTIO_ST_COUNT; s++)
        if (ckptio_st_dtype_ckptio(s) == c->items[i].dtype) return s;
    return 0;
}

/* Shards in copy order, each as large as max_shard_bytes allows (a larger tensor gets a shard
 * of its own); inside a shard, tensors whose sizes are multiples of 4096 first (stable), so
 * each starts aligned and can be read with O_DIRECT. */
int ckptio__conv_st_begin(ckptio__conv *c)
{
    c->shard = calloc(c->n_items + 1, sizeof *c->shard);
    size_t *tmp = malloc((c->n_items + 1) * sizeof *tmp);
    if (!c->shard || !tmp) return free(tmp), CONV_FAIL(c, -ENOMEM, "out of memory");
    uint64_t in = 0;
    uint32_t s = 0;
    for (size_t k = 0; k < c->n_items; k++) {
        size_t i = c->order[k];
        if (c->a.to == CKPTIO_CONVERT_HF && k && in + c->items[i].nbytes > c->a.max_shard_bytes)
            s++, in = 0;
        c->shard[i] = s;
        in += c->items[i].nbytes;
    }
    c->n_shards = s + 1;
    c->cur_shard = UINT32_MAX;
    for (size_t a = 0; a < c->n_items;) {
        size_t b = a, n = 0;
        while (b < c->n_items && c->shard[c->order[b]] == c->shard[c->order[a]])
            b++;
        for (int pass = 0; pass < 2; pass++)
            for (size_t k = a; k < b; k++)
                if ((c->items[c->order[k]].nbytes % 4096 == 0) == (pass == 0))
                    tmp[n++] = c->order[k];
        memcpy(c->order + a, tmp, n * sizeof *tmp);
        a = b;
    }
    free(tmp);
    for (size_t i = 0; i < c->n_items; i++)
        if (!st_dtype_of(c, i))
            return CONV_FAIL(c, CKPTIO_E_DTYPE, "%s: tensor '%s' has dtype %s, which safetensors "
                             "cannot hold", c->a.src, c->items[i].name,
                             ckptio_dtype_name(c->items[i].dtype) ? ckptio_dtype_name(c->items[i].dtype) : "?");
    return c->a.to == CKPTIO_CONVERT_HF ? ckptio__conv_tmp_begin(c, true) : 0;
}

/* The header of shard s, whose tensors are order[a, b). */
static int open_shard(ckptio__conv *c, uint32_t s, size_t a, size_t b)
{
    ckptio_st_header h = {.size = sizeof h};
    bool one = c->a.to == CKPTIO_CONVERT_SAFETENSORS, has_format = false;
    uint64_t slen = sizeof "format" + sizeof "pt", ndims = 0;
    for (size_t k = a; k < b; k++)
        slen += strlen(c->items[c->order[k]].name) + 1, ndims += c->items[c->order[k]].ndim;
    for (size_t i = 0; one && i < c->n_meta; i++)
        slen += strlen(c->meta[i].key) + c->meta[i].len + 2;
    h.tensors = calloc(b - a + 1, sizeof *h.tensors);
    h.meta = calloc(c->n_meta + 1, sizeof *h.meta);
    h.dims = calloc(ndims + 1, sizeof *h.dims);
    h.strtab = malloc(slen);
    uint8_t *enc = NULL;
    char *path = NULL;
    int rc = 0;
    if (!h.tensors || !h.meta || !h.dims || !h.strtab) {
        rc = CONV_FAIL(c, -ENOMEM, "out of memory");
        goto out;
    }
    uint64_t sp = 0;
#define PUTSTR(s, n) (memcpy(h.strtab + sp, (s), (n)), h.strtab[sp + (n)] = 0, sp += (n) + 1, sp - (n) - 1)
    for (size_t i = 0; one && i < c->n_meta; i++) {
        const ckptio_convert_meta *m = &c->meta[i];
        if (!is_text(m->val, m->len)) {
            /* safetensors metadata holds text only; the command says so, a library is quiet */
            if (c->a.flags & CKPTIO_CONVERT_PROGRESS)
                fprintf(stderr, "ckptio convert: metadata '%s' is binary (%zu bytes): "
                        "safetensors metadata holds text only, so it is left out\n", m->key, m->len);
            continue;
        }
        ckptio_st_meta *o = &h.meta[h.n_meta++];
        o->key_len = (uint32_t)strlen(m->key);
        o->key = PUTSTR(m->key, o->key_len);
        o->val_len = m->len;
        o->val = PUTSTR(m->val, m->len);
        has_format |= !strcmp(m->key, "format");
    }
    if (!has_format) { /* transformers refuses safetensors files whose metadata lacks it */
        ckptio_st_meta *o = &h.meta[h.n_meta++];
        o->key_len = 6, o->key = PUTSTR("format", 6);
        o->val_len = 2, o->val = PUTSTR("pt", 2);
    }
    uint64_t data = 0, dp = 0;
    for (size_t k = a; k < b; k++) {
        const ckptio_convert_tensor *it = &c->items[c->order[k]];
        ckptio_st_tensor *t = &h.tensors[h.n_tensors++];
        t->st_dtype = (uint32_t)st_dtype_of(c, c->order[k]);
        t->dtype = it->dtype;
        t->name_len = (uint32_t)strlen(it->name);
        t->name = PUTSTR(it->name, t->name_len);
        t->ndim = it->ndim;
        t->dims = dp;
        memcpy(h.dims + dp, it->shape, it->ndim * sizeof *it->shape);
        dp += it->ndim;
        t->begin = data;
        data += it->nbytes;
        t->end = data;
    }
#undef PUTSTR
    h.n_dims = dp;
    h.strtab_len = sp;
    uint64_t len = 0;
    char why[512], name[64];
    if ((rc = ckptio_st_encode(&h, 4096, &enc, &len, why, sizeof why)) < 0) {
        rc = CONV_FAIL(c, rc, "%s: %s", c->a.dst, why);
        goto out;
    }
    if (one ? !(path = strdup(c->a.dst))
            : asprintf(&path, "%s/%s", c->tmp, shard_name(c, s, name, sizeof name)) < 0) {
        path = NULL;
        rc = CONV_FAIL(c, -ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = ckptio_file_writer_open(&c->fw, path, &c->p)) < 0) {
        rc = conv_keep(c, rc);
        goto out;
    }
    if ((rc = ckptio_file_writer_write(c->fw, enc, (size_t)len)) < 0) rc = conv_keep(c, rc);
out:
    free(path);
    free(enc);
    free(h.tensors);
    free(h.meta);
    free(h.dims);
    free(h.strtab);
    return rc;
}

static int close_shard(ckptio__conv *c)
{
    if (!c->fw) return 0;
    int rc = ckptio_file_writer_commit(c->fw);
    if (rc < 0 && rc != CKPTIO_E_NOT_DURABLE) return conv_keep(c, rc);
    ckptio_file_writer_close(c->fw);
    c->fw = NULL;
    return 0;
}

/* The first piece of a tensor in a new shard closes the last shard and opens the next. */
static int next_shard(ckptio__conv *c, size_t item, size_t a)
{
    size_t b = a;
    while (b < c->n_items && c->shard[c->order[b]] == c->shard[item])
        b++;
    int rc = close_shard(c);
    if (rc < 0) return rc;
    c->cur_shard = c->shard[item];
    return open_shard(c, c->shard[item], a, b);
}

int ckptio__conv_st_write(ckptio__conv *c, const uint8_t *buf, const ckptio__piece *pc)
{
    int rc;
    if (pc->first == 0 && (c->shard[pc->item] != c->cur_shard || !c->fw))
        if ((rc = next_shard(c, pc->item, pc->pos)) < 0) return rc;
    if (pc->nbytes && (rc = ckptio_file_writer_write(c->fw, buf + pc->at, pc->nbytes)) < 0)
        return conv_keep(c, rc);
    return 0;
}

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

static int cmp_name(const void *x, const void *y, void *arg)
{
    const ckptio__conv *c = arg;
    return strcmp(c->items[*(const size_t *)x].name, c->items[*(const size_t *)y].name);
}

/* model.safetensors.index.json, tensors sorted by name as transformers writes it. */
static int write_index(ckptio__conv *c)
{
    char *path = NULL;
    size_t *ord = malloc((c->n_items + 1) * sizeof *ord);
    FILE *f = ord && asprintf(&path, "%s/model.safetensors.index.json", c->tmp) >= 0
                  ? fopen(path, "w") : NULL;
    if (!f) {
        int e = errno;
        free(ord);
        free(path);
        return CONV_FAIL(c, -e, "%s: writing the index: %s", c->a.dst, strerror(e));
    }
    fprintf(f, "{\n  \"metadata\": {\n    \"total_size\": %" PRIu64 "\n  },\n  \"weight_map\": {",
            c->total);
    for (size_t i = 0; i < c->n_items; i++)
        ord[i] = i;
    qsort_r(ord, c->n_items, sizeof *ord, cmp_name, c);
    char name[64];
    for (size_t i = 0; i < c->n_items; i++) {
        fputs(i ? ",\n    " : "\n    ", f);
        json_str(f, c->items[ord[i]].name);
        fprintf(f, ": \"%s\"", shard_name(c, c->shard[ord[i]], name, sizeof name));
    }
    fputs("\n  }\n}\n", f);
    free(ord);
    int bad = ferror(f) | fflush(f) | fsync(fileno(f));
    bad |= fclose(f);
    free(path);
    return bad ? CONV_FAIL(c, -EIO, "%s: writing the index: %s", c->a.dst, strerror(errno)) : 0;
}

int ckptio__conv_st_end(ckptio__conv *c)
{
    int rc;
    /* Every shard gets a file, an empty model one shard with a header only. */
    if (!c->fw && !c->n_items && (rc = open_shard(c, 0, 0, 0)) < 0) return rc;
    if ((rc = close_shard(c)) < 0) return rc;
    if (c->a.to != CKPTIO_CONVERT_HF) return 0;
    if ((rc = write_index(c)) < 0) return rc;
    return ckptio__conv_publish(c);
}
