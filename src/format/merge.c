/* SPDX-License-Identifier: Apache-2.0 */
/* Merging the partial manifests of a multi-rank save into one checkpoint manifest (pure, no I/O). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/box.h"
#include "manifest.h"

#define U(x) ((unsigned long long)(x))
#define NAME_SHOWN 200 /* bytes of a name quoted in a message */
#define PARTS_SHOWN 8  /* part numbers listed in a message */

#define fail ckptio__errf /* report into the caller's err buffer (common/error.c) */

/* "4096,1024"; "" for a scalar (callers add the brackets). */
static const char *fmt_dims(char *buf, size_t cap, const uint64_t *d, uint32_t ndim)
{
    return ckptio__fmt_dims(buf, cap, d, ndim, "");
}

static bool in_range(uint64_t start, uint64_t n, uint64_t limit)
{
    return start <= limit && n <= limit - start;
}

static bool str_in(const ckptio__manifest *m, uint64_t off, uint64_t len)
{
    return in_range(off, len, m->strtab_len) && off + len < m->strtab_len;
}

static const char *csum_name(uint32_t algo)
{
    return algo == CKPTIO__CSUM_NONE ? "none" : algo == CKPTIO__CSUM_XXH3_64 ? "xxh3-64" : "?";
}

static const char *dtype_name(uint32_t dt)
{
    const char *s = ckptio_dtype_name((int)dt);
    return s ? s : "unknown-dtype";
}

/* One merged tensor, in order of first appearance. */
typedef struct mtens {
    uint32_t part, first; /* where it first appears: the part and its tensor index there */
    uint32_t last_part;   /* the last part listing it: counts parts, catches a part's twins */
    uint32_t n_parts;
    uint64_t n_chunks; /* chunks kept: the non-empty ones, or one canonical empty chunk */
    uint64_t vol;      /* elements of the global shape */
    uint64_t pos;      /* index in the output, sorted by name */
    uint64_t next;     /* next free chunk slot in the output while filling */
} mtens;

/* Where an output chunk comes from. `canon`: the one chunk of an empty tensor, rewritten to
 * cover the whole shape at offset 0. */
typedef struct src {
    uint32_t part, canon;
    uint64_t chunk;
} src;

typedef struct nref {
    const char *s;
    uint64_t len;
    uint64_t idx;
} nref;

typedef struct mref {
    const char *key, *val;
    uint64_t val_len;
    uint32_t key_len, part;
} mref;

typedef struct mctx {
    const ckptio__manifest *const *parts;
    uint32_t n;
    char *err;
    size_t errlen;
    uint64_t *file_base; /* n + 1 prefix sums: part p's file k is output file file_base[p] + k */
    uint64_t *occ_base;  /* n + 1 prefix sums over the parts' tensors */
    uint32_t *occ;       /* merged tensor of each (part, tensor) occurrence */
    mtens *mt;
    uint64_t n_mt, cap_mt;
    ckptio__strmap names;
    nref *order;
    mref *meta;
    uint64_t n_meta_in, n_meta;
    src *src;
    ckptio__sweep sweep;
    uint64_t n_chunks, n_csums, n_dims, strtab_len, n_blocks;
    uint32_t csum_part; /* the part whose checksum settings the output takes */
    bool csum_set;
    bool coded;             /* some part has coded chunks or a base: the result is format 3 */
    int32_t base_part;      /* the first part naming a base, or -1 */
} mctx;

/* Block sizes a part's chunk lists (coded chunks only; the block is the part's csum_block). */
static uint64_t n_blocks_of(const ckptio__manifest *m, const ckptio__mchunk *c)
{
    if (c->codec == CKPTIO__CODEC_NONE || !ckptio__is_pow2(m->csum_block)) return 0;
    return c->raw_len / m->csum_block + (c->raw_len % m->csum_block != 0);
}

#define PNAME(m, t) (int)CKPTIO__MIN((t)->name_len, NAME_SHOWN), (m)->strtab + (t)->name

/* Indices only: whatever a merge reads through a part lies inside its arrays. Everything else
 * (names, dtypes, alignment, extents, checksum counts) is checked once, on the result. */
static int check_part(mctx *x, uint32_t p, bool *has_data)
{
    const ckptio__manifest *m = x->parts[p];
    char *err = x->err;
    size_t el = x->errlen;
    if (!m) return fail(err, el, CKPTIO_E_USAGE, "part %u is missing (NULL)", p);
    if (m->version != CKPTIO_FORMAT_VERSION && m->version != CKPTIO__FORMAT_CODED)
        return fail(err, el, m->version > CKPTIO__FORMAT_CODED ? CKPTIO_E_FORMAT : CKPTIO_E_CORRUPT,
                    "part %u: manifest format version %u, this library writes %u or %u", p,
                    m->version, CKPTIO_FORMAT_VERSION, CKPTIO__FORMAT_CODED);
    if ((m->n_blocks && !m->blocks) || (m->has_base && !str_in(m, m->base_path, m->base_len)))
        return fail(err, el, CKPTIO_E_CORRUPT, "part %u: block sizes or base path missing", p);
    if (m->n_files > CKPTIO__MAX_FILES || m->n_tensors > CKPTIO__MAX_TENSORS ||
        m->n_chunks > CKPTIO__MAX_CHUNKS || m->n_meta > CKPTIO__MAX_META)
        return fail(err, el, CKPTIO_E_LIMIT, "part %u: counts exceed the format's limits", p);
    if ((m->n_files && !m->files) || (m->n_tensors && !m->tensors) ||
        (m->n_chunks && !m->chunks) || (m->n_meta && !m->meta) || (m->n_dims && !m->dims) ||
        (m->n_csums && !m->csums) || (m->strtab_len && !m->strtab))
        return fail(err, el, CKPTIO_E_USAGE, "part %u: array missing for a non-zero count", p);
    if (m->csum_algo > CKPTIO__CSUM_XXH3_64)
        return fail(err, el, CKPTIO_E_CORRUPT, "part %u: unknown checksum algorithm %u", p,
                    m->csum_algo);
    for (uint64_t i = 0; i < m->n_files; i++)
        if (!str_in(m, m->files[i].name, m->files[i].name_len))
            return fail(err, el, CKPTIO_E_CORRUPT,
                        "part %u: file %llu: name lies outside the string table", p, U(i));
    uint64_t claimed = 0;
    *has_data = false;
    for (uint64_t i = 0; i < m->n_tensors; i++) {
        const ckptio__mtensor *t = &m->tensors[i];
        if (!str_in(m, t->name, t->name_len))
            return fail(err, el, CKPTIO_E_CORRUPT,
                        "part %u: tensor %llu: name lies outside the string table", p, U(i));
        if (t->ndim > CKPTIO_MAX_NDIM)
            return fail(err, el, CKPTIO_E_LIMIT,
                        "part %u: tensor '%.*s': %u dimensions exceed the limit of %u", p,
                        PNAME(m, t), t->ndim, CKPTIO_MAX_NDIM);
        if (!in_range(t->dims, t->ndim, m->n_dims) ||
            !in_range(t->chunk0, t->n_chunks, m->n_chunks))
            return fail(err, el, CKPTIO_E_CORRUPT,
                        "part %u: tensor '%.*s': shape or chunk range lies outside its arrays", p,
                        PNAME(m, t));
        /* Ranges that share chunks would make the work grow past the input's size. */
        claimed += t->n_chunks;
        if (claimed > m->n_chunks)
            return fail(err, el, CKPTIO_E_CORRUPT,
                        "part %u: its tensors claim more than its %llu chunks", p,
                        U(m->n_chunks));
        for (uint64_t k = 0; k < t->n_chunks; k++) {
            const ckptio__mchunk *c = &m->chunks[t->chunk0 + k];
            if (c->codec != CKPTIO__CODEC_NONE && !ckptio__is_pow2(m->csum_block))
                return fail(err, el, CKPTIO_E_CORRUPT,
                            "part %u: tensor '%.*s' chunk %llu is coded without a block size", p,
                            PNAME(m, t), U(k));
            if (!in_range(c->dims, 2 * (uint64_t)t->ndim, m->n_dims) || c->file >= m->n_files ||
                !in_range(c->csums, c->n_csums, m->n_csums) ||
                !in_range(c->blocks, n_blocks_of(m, c), m->n_blocks))
                return fail(err, el, CKPTIO_E_CORRUPT,
                            "part %u: tensor '%.*s' chunk %llu: box, file, checksum or block "
                            "index lies outside its arrays",
                            p, PNAME(m, t), U(k));
            if (c->stored_len) *has_data = true;
        }
    }
    for (uint64_t i = 0; i < m->n_meta; i++)
        if (!str_in(m, m->meta[i].key, m->meta[i].key_len) ||
            !str_in(m, m->meta[i].val, m->meta[i].val_len))
            return fail(err, el, CKPTIO_E_CORRUPT,
                        "part %u: metadata %llu: key or value lies outside the string table", p,
                        U(i));
    return 0;
}

/* Checksums are one setting for the whole manifest; a part that stored no bytes has nothing
 * checksummed, so its setting does not matter. */
static int check_csums(mctx *x, uint32_t p, bool has_data)
{
    const ckptio__manifest *m = x->parts[p];
    if (m->version == CKPTIO__FORMAT_CODED) x->coded = true;
    if (m->has_base) {
        /* One base for the whole checkpoint: every rank deltas against the same older save. */
        const ckptio__manifest *b = x->base_part >= 0 ? x->parts[x->base_part] : NULL;
        if (!b) {
            x->base_part = (int32_t)p;
            x->strtab_len += (uint64_t)m->base_len + 1;
        } else if (b->base_sum != m->base_sum || b->base_len != m->base_len ||
                   memcmp(b->strtab + b->base_path, m->strtab + m->base_path, m->base_len))
            return fail(x->err, x->errlen, CKPTIO_E_USAGE,
                        "part %u names base '%.*s', part %d names '%.*s' (every rank must save "
                        "against the same base)",
                        p, (int)CKPTIO__MIN(m->base_len, NAME_SHOWN), m->strtab + m->base_path,
                        x->base_part, (int)CKPTIO__MIN(b->base_len, NAME_SHOWN),
                        b->strtab + b->base_path);
    }
    if (!has_data) return 0;
    if (!x->csum_set) {
        x->csum_set = true;
        x->csum_part = p;
        return 0;
    }
    const ckptio__manifest *f = x->parts[x->csum_part];
    /* Coded chunks are cut in checksum blocks, checked or not. */
    if (f->csum_algo == m->csum_algo &&
        (m->csum_algo == CKPTIO__CSUM_NONE || f->csum_block == m->csum_block) &&
        (!x->coded || f->csum_block == m->csum_block))
        return 0;
    return fail(x->err, x->errlen, CKPTIO_E_USAGE,
                "checksums differ: part %u uses %s in blocks of %llu bytes, part %u uses %s in "
                "blocks of %llu bytes (every rank must save with the same checksum settings)",
                p, csum_name(m->csum_algo), U(m->csum_block), x->csum_part,
                csum_name(f->csum_algo), U(f->csum_block));
}

static uint32_t part_of_file(const mctx *x, uint64_t g)
{
    uint32_t lo = 0, hi = x->n; /* last p with file_base[p] <= g */
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (x->file_base[mid] <= g)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

static int merge_files(mctx *x)
{
    ckptio__strmap seen;
    ckptio__strmap_init(&seen);
    int rc = 0;
    for (uint32_t p = 0; p < x->n; p++) {
        const ckptio__manifest *m = x->parts[p];
        for (uint64_t k = 0; k < m->n_files; k++) {
            const ckptio__mfile *f = &m->files[k];
            uint64_t g = x->file_base[p] + k;
            int r = ckptio__strmap_put(&seen, m->strtab + f->name, f->name_len, &g);
            CKPTIO__GOTO_IF(r < 0, fail(x->err, x->errlen, -ENOMEM, "out of memory merging"));
            if (r == 0) {
                uint32_t q = part_of_file(x, g);
                rc = fail(x->err, x->errlen, CKPTIO_E_DUPLICATE,
                          "file '%.*s' is listed by part %u (file %llu) and part %u (file %llu): "
                          "every rank must write files of its own names",
                          (int)CKPTIO__MIN(f->name_len, NAME_SHOWN), m->strtab + f->name, q,
                          U(g - x->file_base[q]), p, U(k));
                goto out;
            }
        }
    }
out:
    ckptio__strmap_free(&seen);
    return rc;
}

/* First sight of a tensor name: a new merged tensor. */
static int add_tensor(mctx *x, uint32_t p, uint64_t i)
{
    const ckptio__manifest *m = x->parts[p];
    const ckptio__mtensor *t = &m->tensors[i];
    char b[256];
    if (x->n_mt >= CKPTIO__MAX_TENSORS)
        return fail(x->err, x->errlen, CKPTIO_E_LIMIT,
                    "the parts hold more than %u distinct tensors", CKPTIO__MAX_TENSORS);
    if (x->n_mt == x->cap_mt) {
        uint64_t cap = x->cap_mt ? 2 * x->cap_mt : 256;
        mtens *n = realloc(x->mt, cap * sizeof *n);
        if (!n) return fail(x->err, x->errlen, -ENOMEM, "out of memory merging");
        x->mt = n, x->cap_mt = cap;
    }
    const uint64_t *shape = m->dims + t->dims;
    uint64_t vol = 0;
    if (!ckptio__shape_volume(shape, t->ndim, &vol))
        return fail(x->err, x->errlen, CKPTIO_E_CORRUPT,
                    "part %u: tensor '%.*s': shape [%s] overflows 64 bits", p, PNAME(m, t),
                    fmt_dims(b, sizeof b, shape, t->ndim));
    x->mt[x->n_mt++] = (mtens){.part = p, .first = (uint32_t)i, .last_part = p, .n_parts = 1,
                               .vol = vol};
    return 0;
}

/* A later part's view of a known tensor must agree with the first one's. */
static int same_tensor(mctx *x, uint32_t p, uint64_t i, mtens *e)
{
    const ckptio__manifest *m = x->parts[p], *f = x->parts[e->part];
    const ckptio__mtensor *t = &m->tensors[i], *ft = &f->tensors[e->first];
    const uint64_t *s = m->dims + t->dims, *fs = f->dims + ft->dims;
    char b1[256], b2[256];
    if (t->dtype != ft->dtype || t->ndim != ft->ndim ||
        (t->ndim && memcmp(s, fs, t->ndim * sizeof *s) != 0))
        return fail(x->err, x->errlen, CKPTIO_E_SHAPE,
                    "tensor '%.*s': part %u says %s [%s], part %u says %s [%s] (every rank must "
                    "save it with the same dtype and global shape)",
                    PNAME(m, t), p, dtype_name(t->dtype), fmt_dims(b1, sizeof b1, s, t->ndim),
                    e->part, dtype_name(ft->dtype), fmt_dims(b2, sizeof b2, fs, ft->ndim));
    if (e->last_part == p)
        return fail(x->err, x->errlen, CKPTIO_E_DUPLICATE, "tensor '%.*s' is listed twice by part %u",
                    PNAME(m, t), p);
    e->last_part = p;
    e->n_parts++;
    return 0;
}

/* Chunks kept in the output: empty boxes say nothing about coverage and the format allows them
 * only as the single chunk of an empty tensor, so they are dropped, except the first one of an
 * empty tensor. */
static int count_chunks(mctx *x, uint32_t p, uint64_t i, mtens *e)
{
    const ckptio__manifest *m = x->parts[p];
    const ckptio__mtensor *t = &m->tensors[i];
    const uint64_t *shape = m->dims + t->dims;
    char b1[256], b2[256], b3[256];
    for (uint64_t k = 0; k < t->n_chunks; k++) {
        const ckptio__mchunk *c = &m->chunks[t->chunk0 + k];
        const uint64_t *off = m->dims + c->dims, *shp = off + t->ndim;
        for (uint32_t d = 0; d < t->ndim; d++) {
            uint64_t end;
            if (!ckptio__add(off[d], shp[d], &end) || end > shape[d])
                return fail(x->err, x->errlen, CKPTIO_E_RANGE,
                            "tensor '%.*s': part %u's chunk %llu [offset %s shape %s] lies outside "
                            "its shape [%s]",
                            PNAME(m, t), p, U(k), fmt_dims(b1, sizeof b1, off, t->ndim),
                            fmt_dims(b2, sizeof b2, shp, t->ndim),
                            fmt_dims(b3, sizeof b3, shape, t->ndim));
        }
        uint64_t vol = 0;
        (void)ckptio__shape_volume(shp, t->ndim, &vol); /* inside the shape: no overflow */
        if (vol == 0) {
            if (c->stored_len != 0)
                return fail(x->err, x->errlen, CKPTIO_E_CORRUPT,
                            "tensor '%.*s': part %u's chunk %llu is empty but claims %llu stored "
                            "bytes",
                            PNAME(m, t), p, U(k), U(c->stored_len));
            if (e->vol == 0 && e->n_chunks == 0) e->n_chunks = 1;
            continue;
        }
        e->n_chunks++;
        x->n_csums += c->n_csums;
        x->n_blocks += n_blocks_of(m, c);
    }
    return 0;
}

static int merge_tensors(mctx *x)
{
    for (uint32_t p = 0; p < x->n; p++) {
        const ckptio__manifest *m = x->parts[p];
        for (uint64_t i = 0; i < m->n_tensors; i++) {
            const ckptio__mtensor *t = &m->tensors[i];
            uint64_t j = x->n_mt;
            int r = ckptio__strmap_put(&x->names, m->strtab + t->name, t->name_len, &j);
            if (r < 0) return fail(x->err, x->errlen, -ENOMEM, "out of memory merging");
            if (r == 1)
                CKPTIO__TRY(add_tensor(x, p, i));
            else
                CKPTIO__TRY(same_tensor(x, p, i, &x->mt[j]));
            x->occ[x->occ_base[p] + i] = (uint32_t)j;
            CKPTIO__TRY(count_chunks(x, p, i, &x->mt[j]));
        }
    }
    for (uint64_t j = 0; j < x->n_mt; j++) {
        if (!ckptio__add(x->n_chunks, x->mt[j].n_chunks, &x->n_chunks) ||
            x->n_chunks > CKPTIO__MAX_CHUNKS)
            return fail(x->err, x->errlen, CKPTIO_E_LIMIT,
                        "the parts hold more than %llu chunks", U(CKPTIO__MAX_CHUNKS));
        const ckptio__mtensor *t = &x->parts[x->mt[j].part]->tensors[x->mt[j].first];
        x->n_dims += (uint64_t)t->ndim * (1 + 2 * x->mt[j].n_chunks);
        x->strtab_len += (uint64_t)t->name_len + 1;
    }
    return 0;
}

static int nref_cmp(const void *pa, const void *pb)
{
    const nref *a = pa, *b = pb;
    int c = ckptio__name_cmp(a->s, a->len, b->s, b->len);
    return c ? c : (a->idx > b->idx) - (a->idx < b->idx);
}

static int mref_cmp(const void *pa, const void *pb)
{
    const mref *a = pa, *b = pb;
    int c = ckptio__name_cmp(a->key, a->key_len, b->key, b->key_len);
    return c ? c : (a->part > b->part) - (a->part < b->part);
}

/* Keys are sorted with their part numbers, so equal keys sit together; equal values collapse. */
static int merge_meta(mctx *x)
{
    uint64_t n = 0;
    for (uint32_t p = 0; p < x->n; p++) n += x->parts[p]->n_meta;
    x->n_meta_in = n;
    if (!n) return 0;
    x->meta = malloc(n * sizeof *x->meta);
    if (!x->meta) return fail(x->err, x->errlen, -ENOMEM, "out of memory merging");
    n = 0;
    for (uint32_t p = 0; p < x->n; p++) {
        const ckptio__manifest *m = x->parts[p];
        for (uint64_t i = 0; i < m->n_meta; i++)
            x->meta[n++] = (mref){m->strtab + m->meta[i].key, m->strtab + m->meta[i].val,
                                  m->meta[i].val_len, m->meta[i].key_len, p};
    }
    qsort(x->meta, n, sizeof *x->meta, mref_cmp);
    uint64_t kept = 0;
    for (uint64_t i = 0; i < n; i++) {
        const mref *a = &x->meta[i];
        if (kept > 0) {
            const mref *b = &x->meta[kept - 1];
            if (ckptio__name_cmp(a->key, a->key_len, b->key, b->key_len) == 0) {
                if (a->val_len == b->val_len && !memcmp(a->val, b->val, a->val_len)) continue;
                return fail(x->err, x->errlen, CKPTIO_E_DUPLICATE,
                            "metadata '%.*s': part %u and part %u give it different values",
                            (int)CKPTIO__MIN(a->key_len, NAME_SHOWN), a->key, b->part, a->part);
            }
        }
        x->meta[kept++] = *a;
        x->strtab_len += (uint64_t)a->key_len + 1 + a->val_len + 1;
    }
    x->n_meta = kept;
    if (kept > CKPTIO__MAX_META)
        return fail(x->err, x->errlen, CKPTIO_E_LIMIT, "the parts hold %llu metadata keys (limit %u)",
                    U(kept), CKPTIO__MAX_META);
    return 0;
}

/* Same arena layout as decode: the struct, then files, tensors, chunks, metadata, dims,
 * checksums and the string table with a spare NUL; arrays in the canonical encoding order. */
static ckptio__manifest *alloc_out(mctx *x, uint64_t n_files)
{
    uint64_t total = ckptio__align_up(sizeof(ckptio__manifest), 8);
    const uint64_t sizes[] = {n_files * sizeof(ckptio__mfile), x->n_mt * sizeof(ckptio__mtensor),
                              x->n_chunks * sizeof(ckptio__mchunk),
                              x->n_meta * sizeof(ckptio__mmeta), x->n_dims * 8, x->n_csums * 8,
                              x->n_blocks * 4, x->strtab_len + 1};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (!ckptio__add(total, sizes[i], &total)) return NULL;
    if (total > SIZE_MAX) return NULL;
    uint8_t *arena = malloc((size_t)total);
    if (!arena) return NULL;
    ckptio__manifest *o = (ckptio__manifest *)arena;
    uint8_t *a = arena + ckptio__align_up(sizeof *o, 8);
    *o = (ckptio__manifest){.version = x->coded ? CKPTIO__FORMAT_CODED : CKPTIO_FORMAT_VERSION,
                            .n_files = n_files,
                            .n_tensors = x->n_mt, .n_chunks = x->n_chunks, .n_meta = x->n_meta,
                            .n_dims = x->n_dims, .n_csums = x->n_csums, .n_blocks = x->n_blocks,
                            .strtab_len = x->strtab_len, .arena = arena};
    o->files = (ckptio__mfile *)a, a += sizes[0];
    o->tensors = (ckptio__mtensor *)a, a += sizes[1];
    o->chunks = (ckptio__mchunk *)a, a += sizes[2];
    o->meta = (ckptio__mmeta *)a, a += sizes[3];
    o->dims = (uint64_t *)a, a += sizes[4];
    o->csums = (uint64_t *)a, a += sizes[5];
    o->blocks = (uint32_t *)a, a += sizes[6];
    o->strtab = (char *)a;
    return o;
}

static uint64_t put_str(ckptio__manifest *o, uint64_t *cur, const char *s, uint64_t len)
{
    uint64_t at = *cur;
    if (len) memcpy(o->strtab + at, s, len);
    o->strtab[at + len] = 0;
    *cur += len + 1;
    return at;
}

/* Part by part, so each tensor's chunks come in part order (part 0's first). */
static void place_chunks(mctx *x, ckptio__manifest *o)
{
    for (uint32_t p = 0; p < x->n; p++) {
        const ckptio__manifest *m = x->parts[p];
        for (uint64_t i = 0; i < m->n_tensors; i++) {
            const ckptio__mtensor *t = &m->tensors[i];
            mtens *e = &x->mt[x->occ[x->occ_base[p] + i]];
            uint64_t chunk0 = o->tensors[e->pos].chunk0;
            for (uint64_t k = 0; k < t->n_chunks; k++) {
                const ckptio__mchunk *c = &m->chunks[t->chunk0 + k];
                uint64_t vol = 0;
                (void)ckptio__shape_volume(m->dims + c->dims + t->ndim, t->ndim, &vol);
                if (vol == 0) {
                    if (e->vol == 0 && e->next == chunk0)
                        x->src[e->next++] = (src){p, 1, t->chunk0 + k};
                    continue;
                }
                x->src[e->next++] = (src){p, 0, t->chunk0 + k};
            }
        }
    }
}

static void fill(mctx *x, ckptio__manifest *o)
{
    uint64_t str = 0, dims = 0, chunk = 0, csum = 0, block = 0;
    const ckptio__manifest *pc = x->parts[x->csum_part];
    o->csum_algo = pc->csum_algo;
    o->csum_block = pc->csum_block;
    for (uint32_t p = 0; p < x->n; p++) {
        const ckptio__manifest *m = x->parts[p];
        for (uint64_t k = 0; k < m->n_files; k++) {
            const ckptio__mfile *f = &m->files[k];
            o->files[x->file_base[p] + k] = (ckptio__mfile){
                .name = put_str(o, &str, m->strtab + f->name, f->name_len),
                .name_len = f->name_len, .size = f->size};
        }
    }
    for (uint64_t r = 0; r < x->n_mt; r++) {
        mtens *e = &x->mt[x->order[r].idx];
        const ckptio__mtensor *t = &x->parts[e->part]->tensors[e->first];
        e->pos = r;
        e->next = chunk;
        o->tensors[r] = (ckptio__mtensor){
            .name = put_str(o, &str, x->parts[e->part]->strtab + t->name, t->name_len),
            .name_len = t->name_len, .dtype = t->dtype, .ndim = t->ndim, .dims = dims,
            .chunk0 = chunk, .n_chunks = e->n_chunks};
        if (t->ndim) memcpy(o->dims + dims, x->parts[e->part]->dims + t->dims, t->ndim * 8);
        dims += (uint64_t)t->ndim * (1 + 2 * e->n_chunks);
        chunk += e->n_chunks;
    }
    for (uint64_t i = 0; i < x->n_meta; i++) {
        const mref *a = &x->meta[i];
        o->meta[i] = (ckptio__mmeta){.key = put_str(o, &str, a->key, a->key_len),
                                     .key_len = a->key_len};
        o->meta[i].val = put_str(o, &str, a->val, a->val_len);
        o->meta[i].val_len = a->val_len;
    }
    if (x->base_part >= 0) {
        const ckptio__manifest *b = x->parts[x->base_part];
        o->has_base = true;
        o->base_len = b->base_len;
        o->base_sum = b->base_sum;
        o->base_path = put_str(o, &str, b->strtab + b->base_path, b->base_len);
    }
    o->strtab[str] = 0;
    place_chunks(x, o);
    /* Now in output order, so dims and checksums are laid out as decode lays them out. */
    for (uint64_t r = 0; r < x->n_mt; r++) {
        const ckptio__mtensor *t = &o->tensors[r];
        uint32_t nd = t->ndim;
        for (uint64_t k = 0; k < t->n_chunks; k++) {
            const src *s = &x->src[t->chunk0 + k];
            const ckptio__manifest *m = x->parts[s->part];
            const ckptio__mchunk *c = &m->chunks[s->chunk];
            ckptio__mchunk *oc = &o->chunks[t->chunk0 + k];
            *oc = (ckptio__mchunk){.dims = t->dims + nd + 2 * (uint64_t)nd * k,
                                   .file = (uint32_t)(x->file_base[s->part] + c->file),
                                   .tensor = (uint32_t)r, .csums = csum};
            uint64_t *box = o->dims + oc->dims;
            if (s->canon) {
                if (nd) memset(box, 0, nd * 8);
                if (nd) memcpy(box + nd, o->dims + t->dims, nd * 8);
                continue;
            }
            if (nd) memcpy(box, m->dims + c->dims, 2 * (uint64_t)nd * 8);
            oc->file_off = c->file_off;
            oc->stored_len = c->stored_len;
            oc->raw_len = c->raw_len;
            oc->codec = c->codec;
            oc->n_csums = c->n_csums;
            if (c->n_csums) memcpy(o->csums + csum, m->csums + c->csums, c->n_csums * 8);
            csum += c->n_csums;
            uint64_t nb = n_blocks_of(m, c);
            oc->blocks = block;
            if (nb) memcpy(o->blocks + block, m->blocks + c->blocks, nb * 4);
            block += nb;
        }
    }
}

/* "parts 0, 1, 3" (chunks arrive in part order, so distinct parts are runs). */
static const char *fmt_parts(char *buf, size_t cap, const src *s, uint64_t n)
{
    uint64_t shown = 0, distinct = 0;
    size_t used = 0;
    buf[0] = 0;
    for (uint64_t k = 0; k < n; k++) {
        if (k > 0 && s[k].part == s[k - 1].part) continue;
        distinct++;
        if (shown < PARTS_SHOWN) {
            int w = snprintf(buf + used, cap - used, "%s%u", shown ? ", " : "", s[k].part);
            if (w > 0 && (size_t)w < cap - used) used += (size_t)w;
            shown++;
        }
    }
    if (distinct > shown)
        snprintf(buf + used, cap - used, ", ... (%llu parts)", U(distinct));
    return buf;
}

/* The tiling check of validate again, but naming parts: which two overlap, which box nobody
 * holds. Chunks are known to lie inside the shape and (but for an empty tensor's) be non-empty. */
static int check_tiling(mctx *x, const ckptio__manifest *o, uint64_t r)
{
    const ckptio__mtensor *t = &o->tensors[r];
    const uint64_t *shape = o->dims + t->dims;
    const src *s = x->src + t->chunk0;
    uint32_t nd = t->ndim;
    uint64_t n = t->n_chunks, tvol = x->mt[x->order[r].idx].vol, covered = 0, ka, kb;
    char b1[256], b2[256], b3[256], b4[256], bp[128];
    int tl = (int)CKPTIO__MIN(t->name_len, NAME_SHOWN);
    const char *tn = o->strtab + t->name;
    if (n == 0)
        return fail(x->err, x->errlen, CKPTIO_E_INCOMPLETE,
                    "tensor '%.*s' [%s]: %u part(s) list it but none holds any of it", tl, tn,
                    fmt_dims(b1, sizeof b1, shape, nd), x->mt[x->order[r].idx].n_parts);
    if (tvol == 0) return 0;
    for (uint64_t k = 0; k < n; k++) {
        uint64_t v = 0;
        (void)ckptio__shape_volume(o->dims + o->chunks[t->chunk0 + k].dims + nd, nd, &v);
        if (!ckptio__add(covered, v, &covered)) covered = UINT64_MAX;
    }
    if (n > 1 && nd == 0)
        return fail(x->err, x->errlen, CKPTIO_E_DUPLICATE,
                    "tensor '%.*s' (a scalar) is held by part %u and part %u: a replicated "
                    "tensor must be saved by one part only",
                    tl, tn, s[0].part, s[1].part);
    if (ckptio__sweep_reserve(&x->sweep, n))
        return fail(x->err, x->errlen, -ENOMEM, "out of memory merging");
    for (uint64_t k = 0; k < n; k++) {
        x->sweep.off[k] = o->dims + o->chunks[t->chunk0 + k].dims;
        x->sweep.shp[k] = x->sweep.off[k] + nd;
    }
    if (ckptio__first_overlap(&x->sweep, shape, nd, n, &ka, &kb)) {
        /* ka is met first along the sweep: named first, as the part that already holds it */
        const uint64_t *a = o->dims + o->chunks[t->chunk0 + ka].dims;
        const uint64_t *b = o->dims + o->chunks[t->chunk0 + kb].dims;
        uint32_t pa = s[ka].part, pb = s[kb].part;
        return fail(x->err, x->errlen, CKPTIO_E_DUPLICATE,
                    "tensor '%.*s': part %u's chunk [offset %s shape %s] overlaps part "
                    "%u's chunk [offset %s shape %s]%s",
                    tl, tn, pa, fmt_dims(b1, sizeof b1, a, nd), fmt_dims(b2, sizeof b2, a + nd, nd),
                    pb, fmt_dims(b3, sizeof b3, b, nd), fmt_dims(b4, sizeof b4, b + nd, nd),
                    pa == pb ? ""
                             : " (a replicated tensor or shard must be saved by one part only)");
    }
    if (covered == tvol) return 0;
    /* Disjoint boxes inside the shape cover less than it: say which box is missing when the
     * chunks split one dimension only (row or column sharding), else the volumes. */
    snprintf(b4, sizeof b4, "chunks from parts %s cover %llu of the %llu elements",
             fmt_parts(bp, sizeof bp, s, n), U(covered), U(tvol));
    if (x->sweep.one_dim) {
        uint32_t d = x->sweep.dim;
        uint64_t lo, hi, off[CKPTIO_MAX_NDIM] = {0}, shp[CKPTIO_MAX_NDIM];
        ckptio__sweep_gap(&x->sweep, n, shape[d], &lo, &hi);
        memcpy(shp, shape, nd * 8);
        off[d] = lo, shp[d] = hi - lo;
        return fail(x->err, x->errlen, CKPTIO_E_INCOMPLETE,
                    "tensor '%.*s' [%s]: %s; no part holds [offset %s shape %s]", tl, tn,
                    fmt_dims(b1, sizeof b1, shape, nd), b4, fmt_dims(b2, sizeof b2, off, nd),
                    fmt_dims(b3, sizeof b3, shp, nd));
    }
    return fail(x->err, x->errlen, CKPTIO_E_INCOMPLETE, "tensor '%.*s' [%s]: %s", tl, tn,
                fmt_dims(b1, sizeof b1, shape, nd), b4);
}

int ckptio__manifest_merge(const ckptio__manifest *const *parts, size_t n, ckptio__manifest **out,
                           char *err, size_t errlen)
{
    if (err && errlen) err[0] = 0;
    if (!out) return fail(err, errlen, CKPTIO_E_USAGE, "no place for the merged manifest");
    *out = NULL;
    if (!parts || n == 0) return fail(err, errlen, CKPTIO_E_USAGE, "no partial manifests to merge");
    if (n > UINT32_MAX) return fail(err, errlen, CKPTIO_E_LIMIT, "%zu parts are too many", n);
    mctx x = {.parts = parts, .n = (uint32_t)n, .err = err, .errlen = errlen, .base_part = -1};
    ckptio__strmap_init(&x.names);
    ckptio__manifest *o = NULL;
    int rc = 0;
    x.file_base = calloc(n + 1, sizeof *x.file_base);
    x.occ_base = calloc(n + 1, sizeof *x.occ_base);
    CKPTIO__GOTO_IF(!x.file_base || !x.occ_base, fail(err, errlen, -ENOMEM, "out of memory merging"));
    for (uint32_t p = 0; p < x.n; p++) {
        bool has_data = false;
        CKPTIO__CHECK(check_part(&x, p, &has_data));
        CKPTIO__CHECK(check_csums(&x, p, has_data));
        x.file_base[p + 1] = x.file_base[p] + parts[p]->n_files;
        x.occ_base[p + 1] = x.occ_base[p] + parts[p]->n_tensors;
    }
    uint64_t n_files = x.file_base[n];
    CKPTIO__GOTO_IF(n_files > CKPTIO__MAX_FILES,
                    fail(err, errlen, CKPTIO_E_LIMIT, "the parts hold %llu files (limit %u)",
                         U(n_files), CKPTIO__MAX_FILES));
    for (uint32_t p = 0; p < x.n; p++)
        for (uint64_t k = 0; k < parts[p]->n_files; k++)
            x.strtab_len += (uint64_t)parts[p]->files[k].name_len + 1;
    CKPTIO__CHECK(merge_files(&x));
    x.occ = malloc(x.occ_base[n] * sizeof *x.occ + 1);
    CKPTIO__GOTO_IF(!x.occ, fail(err, errlen, -ENOMEM, "out of memory merging"));
    CKPTIO__CHECK(merge_tensors(&x));
    ckptio__strmap_free(&x.names);
    CKPTIO__CHECK(merge_meta(&x));

    x.order = malloc(x.n_mt * sizeof *x.order + 1);
    x.src = malloc(x.n_chunks * sizeof *x.src + 1);
    CKPTIO__GOTO_IF(!x.order || !x.src,
                    fail(err, errlen, -ENOMEM, "out of memory merging"));
    for (uint64_t j = 0; j < x.n_mt; j++) {
        const ckptio__manifest *m = parts[x.mt[j].part];
        const ckptio__mtensor *t = &m->tensors[x.mt[j].first];
        x.order[j] = (nref){m->strtab + t->name, t->name_len, j};
    }
    qsort(x.order, x.n_mt, sizeof *x.order, nref_cmp);
    if (!x.csum_set) x.csum_part = 0;
    o = alloc_out(&x, n_files);
    CKPTIO__GOTO_IF(!o, fail(err, errlen, -ENOMEM, "out of memory for the merged manifest"));
    fill(&x, o);
    for (uint64_t r = 0; r < x.n_mt; r++) CKPTIO__CHECK(check_tiling(&x, o, r));
    {
        char why[512];
        rc = ckptio__manifest_validate(o, why, sizeof why);
        CKPTIO__GOTO_IF(rc < 0, fail(err, errlen, rc, "merged manifest: %s", why));
    }
    *out = o;
    o = NULL;
out:
    ckptio__manifest_free(o);
    ckptio__strmap_free(&x.names);
    free(x.file_base);
    free(x.occ_base);
    free(x.occ);
    free(x.mt);
    free(x.order);
    free(x.meta);
    free(x.src);
    ckptio__sweep_fini(&x.sweep);
    return rc;
}
