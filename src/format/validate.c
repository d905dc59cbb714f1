/* SPDX-License-Identifier: Apache-2.0 */
/* The manifest's validation: every invariant of manifest.h checked, each failure named (pure). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/box.h"
#include "manifest.h"

enum { V_MAJOR = CKPTIO_FORMAT_VERSION, V_STRIPED = CKPTIO__FORMAT_STRIPED,
       V_NEWEST = CKPTIO__FORMAT_CODED };

/* A reader stages whole checksum blocks, so the block bounds the memory a manifest makes every
 * reader map; writers use at most 1 MiB. */
#define MAX_CSUM_BLOCK (1ull << 26)
#define MAX_FILE_SIZE (1ull << 63) /* sizes must fit off_t */
#define NAME_SHOWN 200             /* bytes of a name quoted in a message */

/* ---- messages ------------------------------------------------------------------------------ */

#define U(x) ((unsigned long long)(x))

#define fail ckptio__errf /* report into the caller's err buffer (common/error.c) */

/* Bytes of a (valid UTF-8) name to quote: clipped at a character boundary. */
static int shown(const char *s, uint64_t len)
{
    if (len <= NAME_SHOWN) return (int)len;
    size_t n = NAME_SHOWN;
    while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
    return (int)n;
}

static const char *fmt_dims(char *buf, size_t cap, const uint64_t *d, uint32_t ndim)
{
    return ckptio__fmt_dims(buf, cap, d, ndim, "()");
}

/* ---- validation ---------------------------------------------------------------------------- */

/* dims + i, also when a manifest of scalars only has no dims array (NULL + 0 is undefined). */
static const uint64_t *dims_at(const ckptio__manifest *m, uint64_t i)
{
    static const uint64_t none[1];
    return m->dims ? m->dims + i : none;
}

static bool in_range(uint64_t start, uint64_t n, uint64_t limit)
{
    return start <= limit && n <= limit - start;
}

/* Relative path of [A-Za-z0-9._-] components joined by '/'; none empty, "." or "..". */
static bool valid_file_name(const char *s, size_t len)
{
    if (len == 0) return false;
    size_t comp = 0; /* start of the current component */
    for (size_t i = 0; i <= len; i++) {
        if (i == len || s[i] == '/') {
            size_t n = i - comp;
            if (n == 0) return false;
            if (s[comp] == '.' && (n == 1 || (n == 2 && s[comp + 1] == '.'))) return false;
            comp = i + 1;
            continue;
        }
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
        if (!ok) return false;
    }
    /* The manifest's own name would let a chunk alias the commit record. */
    return !(len == 8 && !memcmp(s, "manifest", 8));
}

/* A chunk's extent as a sort key: (file, off) is a 96-bit number. */
typedef struct extent {
    uint64_t off;
    uint32_t file, chunk;
} extent;

static inline unsigned ext_digit(const extent *e, unsigned d)
{
    return d < 8 ? (unsigned)(e->off >> (8 * d)) & 255 : (e->file >> (8 * (d - 8))) & 255;
}

/* LSD radix sort by (file, off), one byte per pass, skipping bytes no two keys differ in:
 * a checkpoint's extents share most high bytes, so 5-7 linear passes replace an n log n
 * comparison sort that dominated validation. Returns the sorted array (a or tmp). */
static extent *sort_extents(extent *a, extent *tmp, uint64_t n)
{
    if (n < 2) return a;
    uint64_t off_diff = 0;
    uint32_t file_diff = 0;
    for (uint64_t i = 1; i < n; i++) {
        off_diff |= a[i].off ^ a[0].off;
        file_diff |= a[i].file ^ a[0].file;
    }
    for (unsigned d = 0; d < 12; d++) {
        uint64_t varies = d < 8 ? (off_diff >> (8 * d)) & 255 : (file_diff >> (8 * (d - 8))) & 255;
        if (!varies) continue;
        uint64_t count[256] = {0}, sum = 0;
        for (uint64_t i = 0; i < n; i++) count[ext_digit(&a[i], d)]++;
        for (unsigned b = 0; b < 256; b++) {
            uint64_t c = count[b];
            count[b] = sum;
            sum += c;
        }
        for (uint64_t i = 0; i < n; i++) tmp[count[ext_digit(&a[i], d)]++] = a[i];
        extent *t = a;
        a = tmp, tmp = t;
    }
    return a;
}

typedef struct named {
    const char *s;
    uint64_t len;
    uint64_t idx;
} named;

static int named_cmp(const void *pa, const void *pb)
{
    const named *a = pa, *b = pb;
    int c = ckptio__name_cmp(a->s, a->len, b->s, b->len);
    return c ? c : (a->idx > b->idx) - (a->idx < b->idx);
}

typedef struct vctx {
    const ckptio__manifest *m;
    char *err;
    size_t errlen;
    ckptio__sweep sweep;
    uint8_t *claimed;     /* bitmap over chunks, only when tensors' ranges are not consecutive */
    bool partial;         /* CKPTIO__MANIFEST_PARTIAL: chunks need not cover their tensor */
} vctx;

#define TNAME(t) shown(m->strtab + (t)->name, (t)->name_len), m->strtab + (t)->name
#define FNAME(f) (int)(f)->name_len, m->strtab + (f)->name

static bool str_ok(const ckptio__manifest *m, uint64_t off, uint64_t len)
{
    return in_range(off, len, m->strtab_len) && off + len < m->strtab_len &&
           m->strtab[off + len] == 0;
}

/* The base of a delta checkpoint: a relative path, any bytes but NUL, resolved against the
 * checkpoint's own directory (so "../step-100" for a sibling). */
static int check_base(vctx *v)
{
    const ckptio__manifest *m = v->m;
    if (!m->has_base) return 0;
    if (m->base_len > CKPTIO__MAX_BASE_PATH)
        return fail(v->err, v->errlen, CKPTIO_E_LIMIT, "base path of %u bytes (limit %u)",
                    m->base_len, CKPTIO__MAX_BASE_PATH);
    const char *b = m->strtab + m->base_path;
    if (!str_ok(m, m->base_path, m->base_len) || m->base_len == 0 || b[0] == '/' ||
        memchr(b, 0, m->base_len))
        return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                    "base path is not a relative path of the string table");
    return 0;
}

/* Stripe roots: an absolute path each (where the save found the root; a reader may be told
 * another), and a stripe directory name that is one path component, unique. */
static int check_roots(vctx *v)
{
    const ckptio__manifest *m = v->m;
    for (uint64_t i = 0; i < m->n_roots; i++) {
        const ckptio__mroot *r = &m->roots[i];
        if (!str_ok(m, r->path, r->path_len) || !str_ok(m, r->name, r->name_len))
            return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                        "root %llu: path or name is not a NUL-terminated string of the string "
                        "table",
                        U(i + 1));
        const char *path = m->strtab + r->path, *name = m->strtab + r->name;
        if (r->path_len == 0 || r->path_len > CKPTIO__MAX_ROOT_PATH || path[0] != '/' ||
            memchr(path, 0, r->path_len))
            return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                        "root %llu: path is not an absolute path of 1..%u bytes without NUL",
                        U(i + 1), CKPTIO__MAX_ROOT_PATH);
        if (r->name_len > CKPTIO__MAX_FILE_NAME || memchr(name, '/', r->name_len) ||
            !valid_file_name(name, r->name_len))
            return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                        "root %llu: stripe directory name is not one [A-Za-z0-9._-] component",
                        U(i + 1));
        for (uint64_t k = 0; k < i; k++)
            if (m->roots[k].name_len == r->name_len &&
                !memcmp(m->strtab + m->roots[k].name, name, r->name_len))
                return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                            "roots %llu and %llu have the same stripe directory '%.*s'", U(k + 1),
                            U(i + 1), (int)r->name_len, name);
    }
    return 0;
}

static int check_files(vctx *v)
{
    const ckptio__manifest *m = v->m;
    for (uint64_t i = 0; i < m->n_files; i++) {
        const ckptio__mfile *f = &m->files[i];
        if (f->name_len > CKPTIO__MAX_FILE_NAME)
            return fail(v->err, v->errlen, CKPTIO_E_LIMIT,
                        "file %llu: name of %u bytes exceeds the limit of %u", U(i), f->name_len,
                        CKPTIO__MAX_FILE_NAME);
        if (!str_ok(m, f->name, f->name_len))
            return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                        "file %llu: name (offset %llu, %u bytes) is not a NUL-terminated string "
                        "of the string table",
                        U(i), U(f->name), f->name_len);
        if (!valid_file_name(m->strtab + f->name, f->name_len))
            return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                        "file %llu: name is not a relative path of [A-Za-z0-9._-] components "
                        "without '.', '..' or empty ones",
                        U(i));
        if (f->root > m->n_roots)
            return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                        "file '%.*s': root %u but the manifest lists %llu roots", FNAME(f),
                        f->root, U(m->n_roots));
        /* Readers hand sizes and offsets to pread as off_t. */
        if (f->size >= MAX_FILE_SIZE)
            return fail(v->err, v->errlen, CKPTIO_E_CORRUPT, "file '%.*s': size %llu is too large",
                        FNAME(f), U(f->size));
    }
    if (m->n_files < 2) return 0;
    /* Two records for one file would let extents overlap unseen: sort names to find twins. */
    named *ns = malloc(m->n_files * sizeof *ns);
    if (!ns) return -ENOMEM;
    for (uint64_t i = 0; i < m->n_files; i++)
        ns[i] = (named){m->strtab + m->files[i].name, m->files[i].name_len, i};
    qsort(ns, m->n_files, sizeof *ns, named_cmp);
    int rc = 0;
    for (uint64_t i = 1; i < m->n_files; i++) {
        if (ckptio__name_cmp(ns[i - 1].s, ns[i - 1].len, ns[i].s, ns[i].len) == 0) {
            rc = fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                      "files %llu and %llu are both named '%.*s'", U(ns[i - 1].idx),
                      U(ns[i].idx), (int)ns[i].len, ns[i].s);
            break;
        }
    }
    free(ns);
    return rc;
}

/* Pairwise disjointness of a tensor's chunks, already known to lie inside it and be non-empty. */
static int check_disjoint(vctx *v, const ckptio__mtensor *t)
{
    const ckptio__manifest *m = v->m;
    uint32_t ndim = t->ndim;
    uint64_t n = t->n_chunks, k1, k2;
    char b1[256], b2[256], b3[256], b4[256];
    if (ndim == 0) /* two chunks of a scalar both hold its one element */
        return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                    "tensor '%.*s': chunks 0 and 1 overlap (scalar with %llu chunks)", TNAME(t),
                    U(n));
    CKPTIO__TRY(ckptio__sweep_reserve(&v->sweep, n));
    for (uint64_t k = 0; k < n; k++) {
        v->sweep.off[k] = m->dims + m->chunks[t->chunk0 + k].dims;
        v->sweep.shp[k] = v->sweep.off[k] + ndim;
    }
    if (!ckptio__first_overlap(&v->sweep, dims_at(m, t->dims), ndim, n, &k1, &k2)) return 0;
    if (k1 > k2) {
        uint64_t tmp = k1;
        k1 = k2, k2 = tmp;
    }
    const uint64_t *p1 = m->dims + m->chunks[t->chunk0 + k1].dims;
    const uint64_t *p2 = m->dims + m->chunks[t->chunk0 + k2].dims;
    return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                "tensor '%.*s': chunk %llu [offset %s shape %s] overlaps chunk %llu "
                "[offset %s shape %s]",
                TNAME(t), U(k1), fmt_dims(b1, sizeof b1, p1, ndim),
                fmt_dims(b2, sizeof b2, p1 + ndim, ndim), U(k2), fmt_dims(b3, sizeof b3, p2, ndim),
                fmt_dims(b4, sizeof b4, p2 + ndim, ndim));
}

/* A coded chunk (format 3): a known codec, a base for deltas, and block sizes that fit. */
static int check_coded(vctx *v, const ckptio__mtensor *t, uint64_t k, const ckptio__mchunk *c)
{
    const ckptio__manifest *m = v->m;
    unsigned id = CKPTIO__CODEC_ID(c->codec);
    if (m->version != V_NEWEST || id > CKPTIO__CODEC_FLOAT ||
        (c->codec & ~(0xffu | CKPTIO__CODEC_DELTA)))
        return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                    "tensor '%.*s': chunk %llu: unknown codec %u in format %u", TNAME(t), U(k),
                    c->codec, m->version);
    if ((c->codec & CKPTIO__CODEC_DELTA) && !m->has_base)
        return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                    "tensor '%.*s': chunk %llu is a delta but the checkpoint names no base",
                    TNAME(t), U(k));
    if (c->raw_len == 0)
        return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                    "tensor '%.*s': chunk %llu: an empty chunk with codec %u", TNAME(t), U(k),
                    c->codec);
    uint64_t B = m->csum_block, n = c->raw_len / B + (c->raw_len % B != 0), sum = 0;
    if (!in_range(c->blocks, n, m->n_blocks))
        return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                    "tensor '%.*s': chunk %llu: block sizes %llu..+%llu lie outside the %llu "
                    "block sizes",
                    TNAME(t), U(k), U(c->blocks), U(n), U(m->n_blocks));
    for (uint64_t j = 0; j < n; j++) {
        uint64_t sz = m->blocks[c->blocks + j], raw = CKPTIO__MIN(B, c->raw_len - j * B);
        if (sz == 0 || sz > raw)
            return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                        "tensor '%.*s': chunk %llu: block %llu stores %llu bytes for %llu raw "
                        "bytes",
                        TNAME(t), U(k), U(j), U(sz), U(raw));
        sum += sz;
    }
    if (sum != c->stored_len)
        return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                    "tensor '%.*s': chunk %llu: stored length %llu but its blocks add up to %llu",
                    TNAME(t), U(k), U(c->stored_len), U(sum));
    return 0;
}

static int check_tensor(vctx *v, uint64_t ti)
{
    const ckptio__manifest *m = v->m;
    const ckptio__mtensor *t = &m->tensors[ti];
    char b1[256], b2[256], b3[256];

    if (t->name_len > CKPTIO_MAX_NAME)
        return fail(v->err, v->errlen, CKPTIO_E_LIMIT,
                    "tensor %llu: name of %u bytes exceeds the limit of %u", U(ti), t->name_len,
                    CKPTIO_MAX_NAME);
    if (!str_ok(m, t->name, t->name_len))
        return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                    "tensor %llu: name (offset %llu, %u bytes) is not a NUL-terminated string "
                    "of the string table",
                    U(ti), U(t->name), t->name_len);
    if (!ckptio__valid_name(m->strtab + t->name, t->name_len, CKPTIO_MAX_NAME))
        return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                    "tensor %llu: name is empty, holds a NUL or is not valid UTF-8", U(ti));
    if (ti > 0) {
        const ckptio__mtensor *p = &m->tensors[ti - 1];
        int c = ckptio__name_cmp(m->strtab + p->name, p->name_len, m->strtab + t->name,
                                 t->name_len);
        if (c == 0)
            return fail(v->err, v->errlen, CKPTIO_E_CORRUPT, "tensor '%.*s' is listed twice",
                        TNAME(t));
        if (c > 0)
            return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                        "tensor '%.*s' is listed after '%.*s': names must be sorted", TNAME(t),
                        TNAME(p));
    }
    size_t esize = ckptio_dtype_size((int)t->dtype);
    if (!esize)
        return fail(v->err, v->errlen, CKPTIO_E_CORRUPT, "tensor '%.*s': unknown dtype %u",
                    TNAME(t), t->dtype);
    if (t->ndim > CKPTIO_MAX_NDIM)
        return fail(v->err, v->errlen, CKPTIO_E_LIMIT,
                    "tensor '%.*s': %u dimensions exceed the limit of %u", TNAME(t), t->ndim,
                    CKPTIO_MAX_NDIM);
    uint32_t ndim = t->ndim;
    if (!in_range(t->dims, ndim, m->n_dims))
        return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                    "tensor '%.*s': shape index %llu lies outside the %llu dims", TNAME(t),
                    U(t->dims), U(m->n_dims));
    const uint64_t *tshape = dims_at(m, t->dims);
    uint64_t tvol, tbytes;
    if (!ckptio__shape_volume(tshape, ndim, &tvol) || !ckptio__mul(tvol, esize, &tbytes))
        return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                    "tensor '%.*s': size of shape %s overflows 64 bits", TNAME(t),
                    fmt_dims(b1, sizeof b1, tshape, ndim));
    if (t->n_chunks == 0)
        return fail(v->err, v->errlen, CKPTIO_E_CORRUPT, "tensor '%.*s' has no chunks", TNAME(t));
    if (!in_range(t->chunk0, t->n_chunks, m->n_chunks))
        return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                    "tensor '%.*s': chunks %llu..%llu lie outside the %llu chunks", TNAME(t),
                    U(t->chunk0), U(t->chunk0 + t->n_chunks - 1), U(m->n_chunks));
    if (tvol == 0 && t->n_chunks != 1)
        return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                    "tensor '%.*s': empty (shape %s) but has %llu chunks instead of 1", TNAME(t),
                    fmt_dims(b1, sizeof b1, tshape, ndim), U(t->n_chunks));

    uint64_t covered = 0;
    for (uint64_t k = 0; k < t->n_chunks; k++) {
        const ckptio__mchunk *c = &m->chunks[t->chunk0 + k];
        if (!in_range(c->dims, 2 * (uint64_t)ndim, m->n_dims))
            return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                        "tensor '%.*s': chunk %llu: dims index %llu lies outside the %llu dims",
                        TNAME(t), U(k), U(c->dims), U(m->n_dims));
        const uint64_t *off = dims_at(m, c->dims), *shp = off + ndim;
        for (uint32_t d = 0; d < ndim; d++) {
            uint64_t end;
            if (!ckptio__add(off[d], shp[d], &end) || end > tshape[d])
                return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                            "tensor '%.*s': chunk %llu [offset %s shape %s] lies outside shape %s",
                            TNAME(t), U(k), fmt_dims(b1, sizeof b1, off, ndim),
                            fmt_dims(b2, sizeof b2, shp, ndim),
                            fmt_dims(b3, sizeof b3, tshape, ndim));
        }
        uint64_t vol;
        /* cannot overflow: the box lies inside the tensor */
        (void)ckptio__shape_volume(shp, ndim, &vol);
        /* One canonical form for empty tensors (a single whole chunk, no bytes), so readers
         * never meet zero-volume chunks anywhere else. */
        if (tvol == 0) {
            bool whole = true;
            for (uint32_t d = 0; d < ndim; d++) whole = whole && off[d] == 0 && shp[d] == tshape[d];
            if (!whole || c->stored_len != 0 || c->file_off != 0)
                return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                            "tensor '%.*s': empty tensor's chunk must cover shape %s at offset 0 "
                            "with no stored bytes (has offset %s shape %s, %llu bytes at %llu)",
                            TNAME(t), fmt_dims(b1, sizeof b1, tshape, ndim),
                            fmt_dims(b2, sizeof b2, off, ndim), fmt_dims(b3, sizeof b3, shp, ndim),
                            U(c->stored_len), U(c->file_off));
        } else if (vol == 0) {
            return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                        "tensor '%.*s': chunk %llu [offset %s shape %s] is empty", TNAME(t), U(k),
                        fmt_dims(b1, sizeof b1, off, ndim), fmt_dims(b2, sizeof b2, shp, ndim));
        }
        if (c->raw_len != vol * esize)
            return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                        "tensor '%.*s': chunk %llu: raw length %llu, but shape %s of %s is %llu "
                        "bytes",
                        TNAME(t), U(k), U(c->raw_len), fmt_dims(b1, sizeof b1, shp, ndim),
                        ckptio_dtype_name((int)t->dtype), U(vol * esize));
        /* Formats 1 and 2 have no codecs, and 3 knows these: anything else is damage, not
         * something newer (a new codec needs a new major version). */
        if (c->codec != CKPTIO__CODEC_NONE) CKPTIO__TRY(check_coded(v, t, k, c));
        else if (c->stored_len != c->raw_len)
            return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                        "tensor '%.*s': chunk %llu: stored length %llu differs from raw length "
                        "%llu without a codec",
                        TNAME(t), U(k), U(c->stored_len), U(c->raw_len));
        if (c->file >= m->n_files)
            return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                        "tensor '%.*s': chunk %llu names file %u of %llu", TNAME(t), U(k), c->file,
                        U(m->n_files));
        const ckptio__mfile *f = &m->files[c->file];
        /* 4096 lets O_DIRECT and GPUDirect read large chunks in place; small ones only need to
         * start on a cache line, so tiny tensors do not each waste a page. */
        uint64_t align = c->stored_len >= CKPTIO__EXTENT_ALIGN ? CKPTIO__EXTENT_ALIGN
                                                                : CKPTIO__SMALL_ALIGN;
        if (c->file_off & (align - 1))
            return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                        "tensor '%.*s': chunk %llu: offset %llu in file '%.*s' is not a multiple "
                        "of %llu",
                        TNAME(t), U(k), U(c->file_off), FNAME(f), U(align));
        /* The recorded size bounds every extent, so a reader that checks a file's length once
         * can trust each read to stay inside it. */
        if (!in_range(c->file_off, c->stored_len, f->size))
            return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                        "tensor '%.*s': chunk %llu: bytes %llu..+%llu lie past the end of file "
                        "'%.*s' (%llu bytes)",
                        TNAME(t), U(k), U(c->file_off), U(c->stored_len), FNAME(f), U(f->size));
        /* Checksums prove decoded bytes: one per block of raw bytes (stored = raw uncoded). */
        uint64_t want = 0;
        if (m->csum_algo != CKPTIO__CSUM_NONE && c->raw_len > 0)
            want = c->raw_len / m->csum_block + (c->raw_len % m->csum_block != 0);
        if (c->n_csums != want)
            return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                        "tensor '%.*s': chunk %llu has %llu checksums, expected %llu", TNAME(t),
                        U(k), U(c->n_csums), U(want));
        if (!in_range(c->csums, c->n_csums, m->n_csums))
            return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                        "tensor '%.*s': chunk %llu: checksums %llu..+%llu lie outside the %llu "
                        "checksums",
                        TNAME(t), U(k), U(c->csums), U(c->n_csums), U(m->n_csums));
        /* Saturates only when chunks overlap, which check_disjoint then reports. */
        if (!ckptio__add(covered, vol, &covered)) covered = UINT64_MAX;
    }
    /* Inside + disjoint + volumes summing to the tensor's = an exact tiling; one chunk needs no
     * sweep, which keeps the common case O(ndim). */
    if (t->n_chunks > 1) CKPTIO__TRY(check_disjoint(v, t));
    if (covered != tvol && tvol != 0 && !v->partial)
        return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                    "tensor '%.*s': chunks cover %llu of the %llu elements of shape %s",
                    TNAME(t), U(covered), U(tvol), fmt_dims(b1, sizeof b1, tshape, ndim));
    return 0;
}

/* Tensors' chunk ranges must partition [0, n_chunks). Decoded manifests lay them out
 * consecutively; a writer may not, so fall back to marking each chunk. */
static int check_partition(vctx *v)
{
    const ckptio__manifest *m = v->m;
    uint64_t next = 0;
    bool consecutive = true;
    for (uint64_t i = 0; i < m->n_tensors && consecutive; i++) {
        consecutive = m->tensors[i].chunk0 == next;
        next += m->tensors[i].n_chunks;
    }
    if (consecutive && next == m->n_chunks) return 0;
    v->claimed = calloc(m->n_chunks / 8 + 1, 1);
    if (!v->claimed) return -ENOMEM;
    uint64_t total = 0;
    for (uint64_t i = 0; i < m->n_tensors; i++) {
        const ckptio__mtensor *t = &m->tensors[i];
        for (uint64_t c = t->chunk0; c < t->chunk0 + t->n_chunks; c++) {
            uint8_t bit = (uint8_t)(1u << (c & 7));
            if (v->claimed[c >> 3] & bit)
                return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                            "tensor '%.*s': chunk %llu (entry %llu) also belongs to another tensor",
                            TNAME(t), U(c - t->chunk0), U(c));
            v->claimed[c >> 3] |= bit;
        }
        total += t->n_chunks;
    }
    if (total != m->n_chunks)
        return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                    "%llu of the %llu chunks belong to no tensor", U(m->n_chunks - total),
                    U(m->n_chunks));
    return 0;
}

/* The tensor owning chunk c and c's index within it (error paths only: a linear scan). */
static const ckptio__mtensor *owner(const ckptio__manifest *m, uint64_t c, uint64_t *k)
{
    for (uint64_t i = 0; i < m->n_tensors; i++) {
        const ckptio__mtensor *t = &m->tensors[i];
        if (c >= t->chunk0 && c - t->chunk0 < t->n_chunks) {
            *k = c - t->chunk0;
            return t;
        }
    }
    return NULL; /* unreachable after check_partition */
}

/* Runs after check_partition, so every chunk has passed check_tensor. */
static int check_extents(vctx *v)
{
    const ckptio__manifest *m = v->m;
    uint64_t n = 0;
    extent *ext = malloc(2 * m->n_chunks * sizeof *ext + 1);
    if (!ext) return -ENOMEM;
    for (uint64_t i = 0; i < m->n_chunks; i++)
        if (m->chunks[i].stored_len) /* empty chunks occupy no bytes anywhere */
            ext[n++] = (extent){m->chunks[i].file_off, m->chunks[i].file, (uint32_t)i};
    const extent *s = sort_extents(ext, ext + m->n_chunks, n);
    int rc = 0;
    for (uint64_t i = 1; i < n; i++) {
        const ckptio__mchunk *a = &m->chunks[s[i - 1].chunk], *b = &m->chunks[s[i].chunk];
        if (a->file != b->file || a->file_off + a->stored_len <= b->file_off) continue;
        const ckptio__mfile *f = &m->files[a->file];
        uint64_t ka = 0, kb = 0;
        const ckptio__mtensor *ta = owner(m, s[i - 1].chunk, &ka), *tb = owner(m, s[i].chunk, &kb);
        if (!ta || !tb) {
            rc = fail(v->err, v->errlen, CKPTIO_E_CORRUPT, "file '%.*s': extents overlap",
                      FNAME(f));
            break;
        }
        rc = fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                  "file '%.*s': bytes %llu..%llu of tensor '%.*s' chunk %llu overlap bytes "
                  "%llu..%llu of tensor '%.*s' chunk %llu",
                  FNAME(f), U(a->file_off), U(a->file_off + a->stored_len), TNAME(ta), U(ka),
                  U(b->file_off), U(b->file_off + b->stored_len), TNAME(tb), U(kb));
        break;
    }
    free(ext);
    return rc;
}

static int check_meta(vctx *v)
{
    const ckptio__manifest *m = v->m;
    for (uint64_t i = 0; i < m->n_meta; i++) {
        const ckptio__mmeta *e = &m->meta[i];
        if (e->key_len > CKPTIO_MAX_NAME)
            return fail(v->err, v->errlen, CKPTIO_E_LIMIT,
                        "metadata %llu: key of %u bytes exceeds the limit of %u", U(i), e->key_len,
                        CKPTIO_MAX_NAME);
        if (!str_ok(m, e->key, e->key_len))
            return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                        "metadata %llu: key is not a NUL-terminated string of the string table",
                        U(i));
        if (!ckptio__valid_name(m->strtab + e->key, e->key_len, CKPTIO_MAX_NAME))
            return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                        "metadata %llu: key is empty, holds a NUL or is not valid UTF-8", U(i));
        const char *key = m->strtab + e->key;
        int kl = shown(key, e->key_len);
        if (e->val_len > CKPTIO_MAX_META_VALUE)
            return fail(v->err, v->errlen, CKPTIO_E_LIMIT,
                        "metadata '%.*s': value of %llu bytes exceeds the limit of %u", kl, key,
                        U(e->val_len), CKPTIO_MAX_META_VALUE);
        if (!str_ok(m, e->val, e->val_len))
            return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                        "metadata '%.*s': value is not a NUL-terminated string of the string "
                        "table",
                        kl, key);
        if (i > 0) {
            const ckptio__mmeta *p = &m->meta[i - 1];
            int c = ckptio__name_cmp(m->strtab + p->key, p->key_len, key, e->key_len);
            if (c == 0)
                return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                            "metadata key '%.*s' is listed twice", kl, key);
            if (c > 0)
                return fail(v->err, v->errlen, CKPTIO_E_CORRUPT,
                            "metadata key '%.*s' is listed after '%.*s': keys must be sorted", kl,
                            key, shown(m->strtab + p->key, p->key_len), m->strtab + p->key);
        }
    }
    return 0;
}

int ckptio__manifest_validate(const ckptio__manifest *m, char *err, size_t errlen)
{
    return ckptio__manifest_validate_ex(m, 0, err, errlen);
}

int ckptio__manifest_validate_ex(const ckptio__manifest *m, unsigned flags, char *err,
                                 size_t errlen)
{
    if (err && errlen) err[0] = 0;
    if (!m) return fail(err, errlen, CKPTIO_E_USAGE, "no manifest");
    if (m->version > V_NEWEST)
        return fail(err, errlen, CKPTIO_E_FORMAT,
                    "manifest format version %u is newer than this library's %u", m->version,
                    V_NEWEST);
    if (m->version < V_MAJOR)
        return fail(err, errlen, CKPTIO_E_CORRUPT, "manifest format version %u does not exist",
                    m->version);
    /* One form per manifest: roots make it format 2, and format 2 always has roots; codecs or
     * a base make it format 3 (with or without roots), and format 3 always has one of them
     * (checked once the chunks are known to be there, below). */
    if (m->version != V_NEWEST && (m->version == V_STRIPED) != (m->n_roots > 0))
        return fail(err, errlen, CKPTIO_E_CORRUPT, "manifest format version %u with %llu roots",
                    m->version, U(m->n_roots));
    if (m->version != V_NEWEST && (m->n_blocks || m->has_base))
        return fail(err, errlen, CKPTIO_E_CORRUPT,
                    "manifest format version %u with block sizes or a base", m->version);
    if ((m->n_blocks && !m->blocks) || (m->has_base && !m->strtab))
        return fail(err, errlen, CKPTIO_E_USAGE, "manifest array missing for a non-zero count");
    if (m->n_blocks > CKPTIO__MAX_CHUNKS * 64)
        return fail(err, errlen, CKPTIO_E_LIMIT, "manifest lists %llu block sizes",
                    U(m->n_blocks));
    if (m->n_roots > CKPTIO__MAX_ROOTS)
        return fail(err, errlen, CKPTIO_E_LIMIT, "manifest lists %llu roots (limit %u)",
                    U(m->n_roots), CKPTIO__MAX_ROOTS);
    if (m->n_roots && !m->roots)
        return fail(err, errlen, CKPTIO_E_USAGE, "manifest array missing for a non-zero count");
    /* Limits first: everything after allocates or loops in proportion to these counts. */
    if (m->n_files > CKPTIO__MAX_FILES || m->n_tensors > CKPTIO__MAX_TENSORS ||
        m->n_chunks > CKPTIO__MAX_CHUNKS || m->n_meta > CKPTIO__MAX_META)
        return fail(err, errlen, CKPTIO_E_LIMIT,
                    "counts exceed the format's limits: %llu files (max %u), %llu tensors (max "
                    "%u), %llu chunks (max %llu), %llu metadata (max %u)",
                    U(m->n_files), CKPTIO__MAX_FILES, U(m->n_tensors), CKPTIO__MAX_TENSORS,
                    U(m->n_chunks), U(CKPTIO__MAX_CHUNKS), U(m->n_meta), CKPTIO__MAX_META);
    if ((m->n_files && !m->files) || (m->n_tensors && !m->tensors) ||
        (m->n_chunks && !m->chunks) || (m->n_meta && !m->meta) || (m->n_dims && !m->dims) ||
        (m->n_csums && !m->csums) || (m->strtab_len && !m->strtab))
        return fail(err, errlen, CKPTIO_E_USAGE, "manifest array missing for a non-zero count");
    bool coded = m->has_base;
    for (uint64_t i = 0; i < m->n_chunks && !coded; i++)
        coded = m->chunks[i].codec != CKPTIO__CODEC_NONE;
    if (m->version == V_NEWEST && !coded)
        return fail(err, errlen, CKPTIO_E_CORRUPT,
                    "manifest format version %u without coded chunks or a base", m->version);
    if (m->csum_algo > CKPTIO__CSUM_XXH3_64)
        return fail(err, errlen, CKPTIO_E_CORRUPT, "unknown checksum algorithm %u", m->csum_algo);
    bool block_ok = ckptio__is_pow2(m->csum_block) && m->csum_block >= CKPTIO__EXTENT_ALIGN &&
                    m->csum_block <= MAX_CSUM_BLOCK;
    /* Coded chunks are cut into blocks of this size even without checksums. */
    if (!block_ok && !(m->csum_algo == CKPTIO__CSUM_NONE && m->csum_block == 0 && !coded))
        return fail(err, errlen, CKPTIO_E_CORRUPT,
                    "checksum block of %llu bytes is not a power of two between 4096 and 2^26 (64 "
                    "MiB)",
                    U(m->csum_block));

    /* Files before tensors (chunks name them), tensors before the partition and extent checks
     * (which quote tensor names, so those must be known to be valid strings). */
    vctx v = {.m = m, .err = err, .errlen = errlen, .partial = flags & CKPTIO__MANIFEST_PARTIAL};
    int rc = 0;
    CKPTIO__CHECK(check_roots(&v));
    CKPTIO__CHECK(check_base(&v));
    CKPTIO__CHECK(check_files(&v));
    for (uint64_t i = 0; i < m->n_tensors; i++) CKPTIO__CHECK(check_tensor(&v, i));
    CKPTIO__CHECK(check_partition(&v));
    CKPTIO__CHECK(check_extents(&v));
    CKPTIO__CHECK(check_meta(&v));
out:
    ckptio__sweep_fini(&v.sweep);
    free(v.claimed);
    return rc;
}
