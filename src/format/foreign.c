/* SPDX-License-Identifier: Apache-2.0 */
/* Building the in-memory manifest of safetensors files and Hugging Face shards: pure code. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "foreign.h"

#define U(x) ((unsigned long long)(x))
#define fail ckptio__errf

/* A tensor of one of the files: its name, and where it is. */
typedef struct cand {
    const char *name;
    uint64_t len;
    uint32_t file;
    const ckptio__st_tensor *t;
} cand;

static int cmp_bytes(const char *a, uint64_t al, const char *b, uint64_t bl)
{
    int c = memcmp(a, b, al < bl ? al : bl);
    return c ? c : (al > bl) - (al < bl);
}

static int cmp_cand(const void *x, const void *y)
{
    const cand *a = x, *b = y;
    int c = cmp_bytes(a->name, a->len, b->name, b->len);
    return c ? c : (a->file > b->file) - (a->file < b->file);
}

/* A metadata entry and its rank: earlier sources win. */
typedef struct kv {
    const char *key, *val;
    uint64_t key_len, val_len, rank;
} kv;

static int cmp_kv(const void *x, const void *y)
{
    const kv *a = x, *b = y;
    int c = cmp_bytes(a->key, a->key_len, b->key, b->key_len);
    return c ? c : (a->rank > b->rank) - (a->rank < b->rank);
}

/* A file's name and index, to find files by name. */
typedef struct fname {
    const char *name;
    uint32_t file;
} fname;

static int cmp_fname(const void *x, const void *y)
{
    return strcmp(((const fname *)x)->name, ((const fname *)y)->name);
}

/* The tensors served, sorted by name: every tensor of every file, or those the index maps. */
static int select_tensors(const ckptio__foreign_file *files, size_t n, const ckptio__st_index *ix,
                          cand *all, uint64_t n_all, cand **out, uint64_t *n_out, char *err,
                          size_t errlen)
{
    int rc = 0;
    fname *order = NULL;
    qsort(all, (size_t)n_all, sizeof *all, cmp_cand);
    if (!ix) {
        for (uint64_t i = 1; i < n_all; i++)
            if (!cmp_bytes(all[i - 1].name, all[i - 1].len, all[i].name, all[i].len))
                return fail(err, errlen, CKPTIO_E_DUPLICATE,
                            "tensor '%s' is in both '%s' and '%s'; pass one file, or a directory "
                            "with an index",
                            all[i].name, files[all[i - 1].file].name, files[all[i].file].name);
        *out = all;
        *n_out = n_all;
        return 0;
    }
    cand *sel = malloc((ix->n_map ? ix->n_map : 1) * sizeof *sel);
    order = malloc((n ? n : 1) * sizeof *order);
    if (!sel || !order) {
        rc = fail(err, errlen, -ENOMEM, "out of memory listing %llu tensors", U(ix->n_map));
        goto out;
    }
    for (size_t i = 0; i < n; i++) order[i] = (fname){files[i].name, (uint32_t)i};
    qsort(order, n, sizeof *order, cmp_fname);
    for (uint64_t i = 0; i < ix->n_map; i++) {
        const ckptio__st_meta *e = &ix->map[i];
        const char *name = ix->strtab + e->key, *file = ix->strtab + e->val;
        fname fk = {file, 0};
        const fname *f = bsearch(&fk, order, n, sizeof *order, cmp_fname);
        cand key = {.name = name, .len = e->key_len, .file = f ? f->file : 0};
        cand *hit = f ? bsearch(&key, all, (size_t)n_all, sizeof *all, cmp_cand) : NULL;
        if (!hit) {
            rc = fail(err, errlen, CKPTIO_E_CORRUPT,
                      "the index puts tensor '%s' in '%s', which does not hold it: the download "
                      "is incomplete or the index stale",
                      name, file);
            goto out;
        }
        sel[i] = *hit;
    }
    qsort(sel, (size_t)ix->n_map, sizeof *sel, cmp_cand);
    uint64_t k = 0;
    for (uint64_t i = 0; i < ix->n_map; i++) {
        if (k && !cmp_bytes(sel[k - 1].name, sel[k - 1].len, sel[i].name, sel[i].len)) {
            if (sel[k - 1].file == sel[i].file) continue; /* the same entry twice */
            rc = fail(err, errlen, CKPTIO_E_DUPLICATE,
                      "the index puts tensor '%s' in both '%s' and '%s'", sel[i].name,
                      files[sel[k - 1].file].name, files[sel[i].file].name);
            goto out;
        }
        sel[k++] = sel[i];
    }
    *out = sel;
    *n_out = k;
    sel = NULL;
out:
    free(sel);
    free(order);
    return rc;
}

/* Shape of a tensor as served: ckptio has no code for some safetensors dtypes (see foreign.h). */
static uint32_t served(const ckptio__st_tensor *t, uint32_t *dtype)
{
    if (t->dtype) {
        *dtype = (uint32_t)t->dtype;
        return t->ndim;
    }
    *dtype = CKPTIO_DT_BYTES;
    return ckptio__st_dtype_bits((int)t->st_dtype) == 8 ? t->ndim + 1 : 1;
}

static int collect_meta(const ckptio__foreign_file *files, size_t n, const ckptio__st_index *ix,
                        kv **out, uint64_t *n_out, uint64_t *bytes, char *err, size_t errlen)
{
    uint64_t total = ix ? ix->n_meta : 0;
    for (size_t f = 0; f < n; f++) total += files[f].h->n_meta;
    kv *all = malloc((total ? total : 1) * sizeof *all);
    if (!all) return fail(err, errlen, -ENOMEM, "out of memory listing metadata");
    uint64_t k = 0;
    for (uint64_t i = 0; ix && i < ix->n_meta; i++, k++)
        all[k] = (kv){ix->strtab + ix->meta[i].key, ix->strtab + ix->meta[i].val,
                      ix->meta[i].key_len, ix->meta[i].val_len, k};
    for (size_t f = 0; f < n; f++)
        for (uint64_t i = 0; i < files[f].h->n_meta; i++, k++) {
            const ckptio__st_header *h = files[f].h;
            all[k] = (kv){h->strtab + h->meta[i].key, h->strtab + h->meta[i].val,
                          h->meta[i].key_len, h->meta[i].val_len, k};
        }
    qsort(all, (size_t)total, sizeof *all, cmp_kv);
    uint64_t m = 0;
    *bytes = 0;
    for (uint64_t i = 0; i < total; i++) {
        if (m && !cmp_bytes(all[m - 1].key, all[m - 1].key_len, all[i].key, all[i].key_len))
            continue; /* a later source's value of a key already set */
        all[m++] = all[i];
        *bytes += all[i].key_len + all[i].val_len + 2;
    }
    *out = all;
    *n_out = m;
    return 0;
}

int ckptio__foreign_manifest(const ckptio__foreign_file *files, size_t n,
                             const ckptio__st_index *ix, ckptio__manifest **out, char *err,
                             size_t errlen)
{
    *out = NULL;
    if (n > CKPTIO__MAX_FILES)
        return fail(err, errlen, CKPTIO_E_LIMIT, "%zu files exceed the limit of %u", n,
                    CKPTIO__MAX_FILES);
    uint64_t n_all = 0, n_sel = 0, n_meta = 0, meta_bytes = 0;
    for (size_t f = 0; f < n; f++) n_all += files[f].h->n_tensors;
    cand *all = malloc((n_all ? n_all : 1) * sizeof *all), *sel = NULL;
    kv *meta = NULL;
    int rc = 0;
    if (!all) return fail(err, errlen, -ENOMEM, "out of memory listing %llu tensors", U(n_all));
    for (size_t f = 0, k = 0; f < n; f++)
        for (uint64_t i = 0; i < files[f].h->n_tensors; i++, k++) {
            const ckptio__st_tensor *t = &files[f].h->tensors[i];
            all[k] = (cand){files[f].h->strtab + t->name, t->name_len, (uint32_t)f, t};
        }
    CKPTIO__CHECK(select_tensors(files, n, ix, all, n_all, &sel, &n_sel, err, errlen));
    if (n_sel > CKPTIO__MAX_TENSORS) {
        rc = fail(err, errlen, CKPTIO_E_LIMIT, "%llu tensors exceed the limit of %u", U(n_sel),
                  CKPTIO__MAX_TENSORS);
        goto out;
    }
    CKPTIO__CHECK(collect_meta(files, n, ix, &meta, &n_meta, &meta_bytes, err, errlen));
    uint64_t n_dims = 0, str = meta_bytes;
    for (uint64_t i = 0; i < n_sel; i++) {
        uint32_t dt;
        uint32_t nd = served(sel[i].t, &dt);
        if (nd > CKPTIO_MAX_NDIM) {
            rc = fail(err, errlen, CKPTIO_E_LIMIT,
                      "tensor '%s' of '%s': %u dimensions and a trailing byte exceed %u",
                      sel[i].name, files[sel[i].file].name, sel[i].t->ndim, CKPTIO_MAX_NDIM);
            goto out;
        }
        n_dims += 3 * (uint64_t)nd;
        str += sel[i].len + 1;
    }
    for (size_t f = 0; f < n; f++) str += strlen(files[f].name) + 1;
    uint64_t bytes = ckptio__align_up(sizeof(ckptio__manifest), 8) + n * sizeof(ckptio__mfile) +
                     n_sel * (sizeof(ckptio__mtensor) + sizeof(ckptio__mchunk)) +
                     n_meta * sizeof(ckptio__mmeta) + n_dims * sizeof(uint64_t) + str + 1;
    uint8_t *arena = calloc(1, (size_t)bytes);
    CKPTIO__GOTO_IF(!arena, -ENOMEM);
    ckptio__manifest *m = (ckptio__manifest *)arena;
    uint8_t *a = arena + ckptio__align_up(sizeof *m, 8);
    *m = (ckptio__manifest){.version = 1, .csum_algo = CKPTIO__CSUM_NONE, .n_files = n,
                            .n_tensors = n_sel, .n_chunks = n_sel, .n_meta = n_meta,
                            .n_dims = n_dims, .arena = arena};
    m->files = (ckptio__mfile *)a, a += n * sizeof *m->files;
    m->tensors = (ckptio__mtensor *)a, a += n_sel * sizeof *m->tensors;
    m->chunks = (ckptio__mchunk *)a, a += n_sel * sizeof *m->chunks;
    m->meta = (ckptio__mmeta *)a, a += n_meta * sizeof *m->meta;
    m->dims = (uint64_t *)a, a += n_dims * sizeof *m->dims;
    m->strtab = (char *)a;
    uint64_t s = 0, d = 0;
#define PUT(p, len, off)                                                                           \
    do {                                                                                           \
        *(off) = s;                                                                                \
        memcpy(m->strtab + s, (p), (size_t)(len));                                                 \
        m->strtab[s + (len)] = 0;                                                                  \
        s += (len) + 1;                                                                            \
    } while (0)
    for (size_t f = 0; f < n; f++) {
        uint64_t len = strlen(files[f].name);
        PUT(files[f].name, len, &m->files[f].name);
        m->files[f].name_len = (uint32_t)len;
        m->files[f].size = files[f].size;
    }
    for (uint64_t i = 0; i < n_sel; i++) {
        const ckptio__st_tensor *t = sel[i].t;
        const ckptio__st_header *h = files[sel[i].file].h;
        ckptio__mtensor *mt = &m->tensors[i];
        ckptio__mchunk *c = &m->chunks[i];
        uint32_t dt, nd = served(t, &dt);
        uint64_t len = t->end - t->begin;
        PUT(sel[i].name, sel[i].len, &mt->name);
        mt->name_len = (uint32_t)sel[i].len;
        mt->dtype = dt;
        mt->ndim = nd;
        mt->reserved = t->st_dtype;
        mt->dims = d;
        mt->chunk0 = i;
        mt->n_chunks = 1;
        if (t->dtype || nd == t->ndim + 1) {
            memcpy(m->dims + d, h->dims + t->dims, t->ndim * sizeof *m->dims);
            if (!t->dtype) m->dims[d + t->ndim] = 1;
        } else
            m->dims[d] = len;
        memcpy(m->dims + d + 2 * nd, m->dims + d, nd * sizeof *m->dims); /* the chunk's shape */
        *c = (ckptio__mchunk){.dims = d + nd, .file_off = len ? h->data_start + t->begin : 0,
                              .stored_len = len, .raw_len = len, .file = sel[i].file,
                              .codec = CKPTIO__CODEC_NONE, .tensor = (uint32_t)i};
        d += 3 * (uint64_t)nd; /* the chunk's offset, between, is zeros (calloc) */
    }
    for (uint64_t i = 0; i < n_meta; i++) {
        PUT(meta[i].key, meta[i].key_len, &m->meta[i].key);
        m->meta[i].key_len = (uint32_t)meta[i].key_len;
        PUT(meta[i].val, meta[i].val_len, &m->meta[i].val);
        m->meta[i].val_len = meta[i].val_len;
    }
#undef PUT
    m->strtab_len = s;
    *out = m;
out:
    if (sel != all) free(sel);
    free(all);
    free(meta);
    return rc;
}
