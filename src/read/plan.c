/* SPDX-License-Identifier: Apache-2.0 */
/* The read planner: regions against chunks, as segments, then requests in file order. */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "reader.h"

/* ---- planning ---- */

extent ckptio__read_chunk_extent(const ckptio_reader *r, uint64_t chunk)
{
    const ckptio__mchunk *c = &r->m->chunks[chunk];
    return (extent){.off = c->file_off, .len = c->stored_len, .file = c->file,
                    .verify = ckptio__read_verifying(r, c)};
}

static int push_seg(plan *pl, const seg *s)
{
    return ckptio__vec_push(&pl->segs, s, 1) < 0 ? -ENOMEM : 0;
}

/* Longest staged segment: a buffer minus alignment slack, in whole checksum blocks. */
static uint64_t staged_span(const plan *pl, bool verify)
{
    uint64_t span = pl->buf_size - 2 * 4096;
    span = verify ? ckptio__align_down(span, pl->block) : span;
    assert(span > 0); /* buf_size >= 2 blocks, so every cut makes progress */
    return span;
}

/* Cut extent bytes [a, b) into staged segments. */
int ckptio__read_plan_staged(plan *pl, const extent *x, seg proto, uint64_t a, uint64_t b)
{
    proto.verify = x->verify;
    uint64_t span = staged_span(pl, x->verify);
    for (uint64_t i = a; i < b;) {
        uint64_t j = CKPTIO__MIN(b, i + span);
        proto.a = i;
        proto.b = j;
        proto.foff = x->off + i;
        proto.direct = 0;
        proto.len = j - i;
        CKPTIO__TRY(push_seg(pl, &proto));
        i = j;
    }
    return 0;
}

/* A piece that is one run: read straight into dst where alignment allows. */
int ckptio__read_plan_single_run(plan *pl, const extent *x, const piece *p, seg proto)
{
    const rfile *f = &pl->files[x->file];
    assert(f->fd >= 0); /* opened before planning */
    uint64_t B = pl->block;
    bool verify = x->verify;
    uint64_t s = p->src0, e = p->src0 + p->run_len;
    uint64_t S = verify ? ckptio__align_down(s, B) : s;
    uint64_t E = verify ? CKPTIO__MIN(ckptio__align_up(e, B), x->len) : e;
    uint8_t *d = p->dst + p->dst0;
    proto.verify = verify;
    /* An unaligned start read from the block boundary below, into the caller's lead room. */
    uint64_t head = f->direct && !verify && !p->dst0 ? (x->off + s) % f->off_align : 0;
    if (head > p->lead || ((uintptr_t)d - head) % f->mem_align) head = 0;
    bool direct = S == s && E == e &&
                  (!f->direct || head ||
                   ((x->off + s) % f->off_align == 0 && (uintptr_t)d % f->mem_align == 0));
    if (!direct) return ckptio__read_plan_staged(pl, x, proto, S, E);
    /* Requests of pl->request bytes, never below one checksum block; the tail may need care. */
    uint64_t step = CKPTIO__MAX(ckptio__align_down(pl->request, verify ? B : 4096),
                                verify ? B : 4096);
    for (uint64_t i = s; i < e;) {
        uint64_t h = i == s ? head : 0; /* later requests start aligned */
        uint64_t j = CKPTIO__MIN(e, i + step - h), len = j - i + h;
        if (f->direct && len % f->off_align) {
            uint64_t dst_end = p->dst0 + (j - s), padded = ckptio__align_up(len, f->off_align);
            bool scratch =
                dst_end == p->dst_bytes && p->dst0 + (i - s) - h + padded <= p->dst_cap;
            if (scratch) len = padded;
            else if (h) return ckptio__read_plan_staged(pl, x, proto, i, e); /* no tail room */
            else {
                /* Stage the unaligned tail (with checksums: the whole last block). */
                uint64_t body = ckptio__align_down(j - i, verify ? B : f->off_align);
                if (body) {
                    proto.a = i, proto.b = i + body, proto.len = body;
                    proto.foff = x->off + i, proto.direct = 1;
                    CKPTIO__TRY(push_seg(pl, &proto));
                }
                return ckptio__read_plan_staged(pl, x, proto, i + body, j);
            }
        }
        proto.a = i, proto.b = j, proto.len = len, proto.head = (uint32_t)h;
        proto.foff = x->off + i, proto.direct = 1;
        CKPTIO__TRY(push_seg(pl, &proto));
        proto.head = 0;
        i = j;
    }
    return 0;
}

/* Segments for a piece of many runs: walk the runs in file order, merge near ones (whole
 * checksum blocks when verifying) and remember where each segment's first run is. */
static int plan_runs(plan *pl, const extent *x, const piece *p, seg proto)
{
    bool verify = x->verify;
    uint64_t B = pl->block, span = staged_span(pl, verify);
    const uint64_t *cnt = CKPTIO__VEC_AT(&pl->geo, uint64_t, p->geo);
    const uint64_t *ss = cnt + p->k;
    uint64_t idx[CKPTIO_MAX_NDIM] = {0};
    bool open = false;
    proto.verify = verify;
    for (uint64_t n = 0; n < p->runs; n++) {
        uint64_t rs = p->src0;
        for (uint32_t j = 0; j < p->k; j++) rs += idx[j] * ss[j];
        uint64_t re = rs + p->run_len;
        uint64_t RS = verify ? ckptio__align_down(rs, B) : rs;
        uint64_t RE = verify ? CKPTIO__MIN(ckptio__align_up(re, B), x->len) : re;
        if (open && RS <= proto.b + GAP_BYTES && RE - proto.a <= span) {
            proto.b = CKPTIO__MAX(proto.b, RE);
        } else {
            if (open) {
                proto.len = proto.b - proto.a;
                CKPTIO__TRY(push_seg(pl, &proto));
            }
            int64_t it = ckptio__vec_push(&pl->iters, idx, p->k);
            if (it < 0) return -ENOMEM;
            proto.iter = (uint64_t)it;
            if (RS < proto.b && open) RS = proto.b; /* blocks already read by the last one */
            /* A run longer than a buffer is cut into several segments starting in it. */
            while (RE - RS > span) {
                proto.a = RS, proto.b = RS + span, proto.len = span;
                proto.foff = x->off + RS;
                CKPTIO__TRY(push_seg(pl, &proto));
                RS += span;
            }
            proto.a = RS, proto.b = RE, proto.foff = x->off + RS;
            open = true;
        }
        for (uint32_t j = p->k; j-- > 0;) { /* next multi-index, last dimension fastest */
            if (++idx[j] < cnt[j]) break;
            idx[j] = 0;
        }
    }
    if (open) {
        proto.len = proto.b - proto.a;
        CKPTIO__TRY(push_seg(pl, &proto));
    }
    return 0;
}

static int cmp_seg(const void *a, const void *b)
{
    const seg *x = a, *y = b;
    if (x->file != y->file) return x->file < y->file ? -1 : 1;
    return x->foff < y->foff ? -1 : x->foff > y->foff;
}

/* Where a part of s that starts at q may end: the next granule boundary, in whole checksum
 * blocks of the chunk when s is verified, else on a file offset multiple of the granule. */
static uint64_t next_cut(const plan *pl, const seg *s, uint64_t q)
{
    if (s->verify) {
        uint64_t g = CKPTIO__MAX(pl->block, CACHE_GRAN / pl->block * pl->block);
        return CKPTIO__MIN(s->b, q / g * g + g);
    }
    uint64_t f = s->foff + (q - s->a);
    return CKPTIO__MIN(s->b, q + (CACHE_GRAN - f % CACHE_GRAN));
}

static bool resident(rfile *f, uint64_t off, uint64_t len, bool *none)
{
    uint64_t res = 0, pages = 0;
    if (ckptio__cache_resident(&f->cf, off, len, &res, &pages) < 0) res = 0;
    if (none) *none = res == 0;
    return pages && res == pages;
}

/* Bytes [q, e) of s as a segment of their own. */
static int push_part(ckptio__vec *to, const seg *s, uint64_t q, uint64_t e, bool cached)
{
    seg t = *s;
    t.a = q;
    t.b = e;
    t.foff = s->foff + (q - s->a);
    t.head = q == s->a ? s->head : 0; /* only the first part starts before a */
    t.len = (e == s->b ? s->len - s->head - (q - s->a) : e - q) + t.head; /* the last part
                                                                             keeps a padded tail */
    t.cached = cached;
    return ckptio__vec_push(to, &t, 1) < 0 ? -ENOMEM : 0;
}

/* Split the segments by page-cache residency: resident granules go to csegs, copied by the
 * workers through the buffered descriptor; runs of the others stay for the device. */
int ckptio__read_plan_cache(plan *pl)
{
    if (!pl->cache) return 0;
    ckptio__vec out;
    ckptio__vec_init(&out, sizeof(seg));
    int rc = 0;
    for (size_t i = 0; i < pl->segs.len; i++) {
        const seg *s = CKPTIO__VEC_AT(&pl->segs, seg, i);
        rfile *f = &pl->files[s->file];
        bool none = true, all = false;
        if (s->coded) { /* whole blocks, decoded once read: always through the ring */
            CKPTIO__GOTO_IF(ckptio__vec_push(&out, s, 1) < 0, -ENOMEM);
            continue;
        }
        if (f->bfd >= 0 && pl->cache == CKPTIO__CACHE_FILL) none = !(all = true);
        else if (f->bfd >= 0) all = resident(f, s->foff, s->b - s->a, &none);
        if (f->bfd < 0 || none) {
            CKPTIO__GOTO_IF(ckptio__vec_push(&out, s, 1) < 0, -ENOMEM);
            continue;
        }
        for (uint64_t q = s->a; q < s->b;) {
            uint64_t e = next_cut(pl, s, q);
            if (all || resident(f, s->foff + (q - s->a), e - q, NULL)) {
                CKPTIO__CHECK(push_part(&pl->csegs, s, q, e, true));
                q = e;
                continue;
            }
            while (e < s->b) {
                uint64_t n = next_cut(pl, s, e);
                if (resident(f, s->foff + (e - s->a), n - e, NULL)) break;
                e = n;
            }
            /* An in-place part must lie where O_DIRECT can read it: else the cache reads it too
             * (a buffered read of pages not resident goes to the device, just as correctly). */
            bool aligned = true;
            if (s->direct && pl->files[s->file].direct) {
                const piece *p = CKPTIO__VEC_AT(&pl->pieces, piece, s->piece);
                uintptr_t d = (uintptr_t)(p->dst + p->dst0 + (q - p->src0));
                uint64_t h = q == s->a ? s->head : 0;
                aligned = (s->foff + (q - s->a) - h) % f->off_align == 0 &&
                          (d - h) % f->mem_align == 0 &&
                          (e == s->b || (e - q + h) % f->off_align == 0);
            }
            CKPTIO__CHECK(push_part(aligned ? &out : &pl->csegs, s, q, e, !aligned));
            q = e;
        }
    }
    ckptio__vec_free(&pl->segs);
    pl->segs = out;
    if (pl->csegs.len > 1) qsort(pl->csegs.items, pl->csegs.len, sizeof(seg), cmp_seg);
    return 0;
out:
    ckptio__vec_free(&out);
    return rc;
}

/* Turn the segments into requests, in file order: a direct segment is one request, staged
 * neighbours share one staging buffer. */
int ckptio__read_plan_ios(plan *pl)
{
    seg *segs = pl->segs.items;
    size_t n = pl->segs.len;
    if (n > 1) qsort(segs, n, sizeof *segs, cmp_seg);
    /* Small in-place ranges that touch a neighbour are staged with it (merged below). */
    for (size_t k = 0; k < n; k++) {
        seg *s = &segs[k];
        if (!s->direct || s->b - s->a > MERGE_BYTES) continue;
        const uint64_t slack = 4096; /* the alignment padding between stored tensors */
        bool prev = k > 0 && segs[k - 1].file == s->file &&
                    segs[k - 1].foff + (segs[k - 1].b - segs[k - 1].a) + slack >= s->foff;
        bool next = k + 1 < n && segs[k + 1].file == s->file &&
                    s->foff + (s->b - s->a) + slack >= segs[k + 1].foff;
        if (prev || next) {
            s->direct = 0;
            s->head = 0;
            pl->merged++;
        }
    }
    for (size_t next = 0; next < n;) {
        const seg *s = &segs[next];
        const rfile *f = &pl->files[s->file];
        ckptio__ring_io io = {.fd = f->fd};
        size_t first = next;
        if (s->direct) {
            const piece *p = CKPTIO__VEC_AT(&pl->pieces, piece, s->piece);
            io.dst = p->dst + p->dst0 + (s->a - p->src0) - s->head;
            io.off = s->foff - s->head;
            io.len = s->len;
            next++;
        } else {
            uint64_t al = CKPTIO__MAX(f->off_align, 1u);
            uint64_t lo = ckptio__align_down(s->foff, al), hi = s->foff + (s->b - s->a);
            size_t j = next + 1;
            while (j < n && !segs[j].direct && segs[j].file == s->file &&
                   segs[j].foff <= hi + GAP_BYTES &&
                   ckptio__align_up(CKPTIO__MAX(hi, segs[j].foff + segs[j].b - segs[j].a), al) -
                           lo <= pl->buf_size) {
                hi = CKPTIO__MAX(hi, segs[j].foff + segs[j].b - segs[j].a);
                j++;
            }
            io.off = lo;
            io.len = ckptio__align_up(hi, al) - lo;
            next = j;
        }
        if (ckptio__vec_push(&pl->ios, &io, 1) < 0 || ckptio__vec_push(&pl->firsts, &first, 1) < 0)
            return -ENOMEM;
    }
    return ckptio__vec_push(&pl->firsts, &n, 1) < 0 ? -ENOMEM : 0;
}

/* Open the chunk's file and check that the chunk lies within it: all a read does before it is
 * planned. */
int ckptio__read_prepare_chunk(ckptio_reader *r, uint64_t chunk)
{
    const ckptio__mchunk *c = &r->m->chunks[chunk];
    int rc = ckptio__read_open_file(r, c->file);
    if (rc < 0) {
        ckptio__msg_name(&r->msg, tname(r, chunk), NULL, NULL, c->file_off);
        return rc;
    }
    const rfile *f = &r->files[c->file];
    if (c->file_off + c->stored_len > f->size)
        return ckptio__fail_at(&r->msg, CKPTIO_E_CORRUPT, tname(r, chunk), r->path,
                               fname(r, c->file), c->file_off,
                               "data file '%s/%s' is truncated: it has %llu bytes but tensor "
                               "'%s' is stored at bytes %llu..%llu (the manifest says the file "
                               "has %llu); the checkpoint is damaged, load another one",
                               r->path, fname(r, c->file), (unsigned long long)f->size,
                               tname(r, chunk), (unsigned long long)c->file_off,
                               (unsigned long long)(c->file_off + c->stored_len),
                               (unsigned long long)r->m->files[c->file].size);
    return 0;
}


/* The part of a chunk inside the box: lo (tensor coordinates) and cnt; false when none. */
static bool intersect(const ckptio_reader *r, const box *bx, uint64_t chunk, uint64_t *lo,
                      uint64_t *cnt)
{
    const ckptio__mtensor *t = &r->m->tensors[bx->t];
    const uint64_t *co = r->m->dims + r->m->chunks[chunk].dims, *cs = co + t->ndim;
    for (uint32_t j = 0; j < t->ndim; j++) {
        lo[j] = CKPTIO__MAX(co[j], bx->ro[j]);
        uint64_t hi = CKPTIO__MIN(co[j] + cs[j], bx->ro[j] + bx->rs[j]);
        if (lo[j] >= hi) return false;
        cnt[j] = hi - lo[j];
    }
    return true;
}

/* Plan the reads of one chunk's part of the box. */
static int plan_piece(ckptio_reader *r, plan *pl, const box *bx, uint64_t chunk)
{
    const ckptio__mtensor *t = &r->m->tensors[bx->t];
    const ckptio__mchunk *c = &r->m->chunks[chunk];
    const uint64_t *co = r->m->dims + c->dims, *cs = co + t->ndim;
    const uint64_t *ro = bx->ro, *rs = bx->rs;
    uint32_t nd = t->ndim;
    uint64_t lo[CKPTIO_MAX_NDIM], cnt[CKPTIO_MAX_NDIM];
    if (!intersect(r, bx, chunk, lo, cnt)) return 0;
    uint64_t esize = ckptio_dtype_size((int)t->dtype);
    piece p = {.dst = bx->reg->dst, .dst_cap = bx->reg->capacity, .dst_bytes = bx->bytes,
               .lead = bx->reg->lead, .chunk = chunk};
    /* Fold trailing dimensions that are whole in both chunk and region into one run. */
    uint32_t k = nd;
    uint64_t run = esize;
    while (k > 0 && cnt[k - 1] == cs[k - 1] && cnt[k - 1] == rs[k - 1]) run *= cs[--k];
    uint64_t sstride[CKPTIO_MAX_NDIM + 1], dstride[CKPTIO_MAX_NDIM + 1];
    sstride[nd] = dstride[nd] = esize;
    for (uint32_t j = nd; j-- > 0;) {
        sstride[j] = sstride[j + 1] * cs[j];
        dstride[j] = dstride[j + 1] * rs[j];
    }
    if (k > 0) {
        run = cnt[k - 1] * sstride[k];
        k--; /* dimension k is the run's own; dims [0, k) are iterated */
    }
    p.k = k;
    p.run_len = run;
    p.runs = 1;
    for (uint32_t j = 0; j < nd; j++) {
        p.src0 += (lo[j] - co[j]) * sstride[j + 1];
        p.dst0 += (lo[j] - ro[j]) * dstride[j + 1];
    }
    int64_t g = ckptio__vec_push(&pl->geo, NULL, 3 * (size_t)k);
    if (g < 0) return -ENOMEM;
    uint64_t *geo = CKPTIO__VEC_AT(&pl->geo, uint64_t, g);
    for (uint32_t j = 0; j < k; j++) {
        geo[j] = cnt[j];
        geo[k + j] = sstride[j + 1];
        geo[2 * k + j] = dstride[j + 1];
        p.runs *= cnt[j];
    }
    p.geo = (uint64_t)g;
    int64_t pi = ckptio__vec_push(&pl->pieces, &p, 1);
    if (pi < 0) return -ENOMEM;
    seg proto = {.piece = (uint64_t)pi, .chunk = chunk, .file = c->file, .iter = NONE};
    if (ckptio__chunk_coded(c)) {
        /* Every block between the piece's first and last byte. */
        uint64_t hi = p.src0 + p.run_len;
        for (uint32_t j = 0; j < k; j++) hi += (geo[j] - 1) * geo[k + j];
        return ckptio__read_plan_coded(r, pl, proto, p.src0, hi);
    }
    extent x = ckptio__read_chunk_extent(r, chunk);
    if (p.runs == 1) return ckptio__read_plan_single_run(pl, &x, &p, proto);
    return plan_runs(pl, &x, &p, proto);
}

/* Check a region against the manifest, resolve it into *bx, and open the files its chunks are
 * in. */
int ckptio__read_prepare_region(ckptio_reader *r, const ckptio_region *reg, size_t i, box *bx)
{
    int64_t t_idx;
    if (reg->name) {
        t_idx = ckptio__read_find_tensor(r, reg->name);
        if (t_idx < 0)
            return ckptio__fail(&r->msg, CKPTIO_E_NOT_FOUND,
                                "no tensor '%s' in '%s' (region %zu); list them with ckptio "
                                "inspect",
                                reg->name, r->path, i);
    } else {
        if (reg->tensor >= r->m->n_tensors)
            return ckptio__fail(&r->msg, CKPTIO_E_NOT_FOUND, "region %zu: tensor index %zu is past the %llu tensors of '%s'",
                                i, reg->tensor, (unsigned long long)r->m->n_tensors, r->path);
        t_idx = (int64_t)reg->tensor;
    }
    const ckptio__mtensor *t = &r->m->tensors[t_idx];
    const char *name = r->m->strtab + t->name;
    const uint64_t *shape = r->m->dims + t->dims;
    bx->reg = reg;
    bx->t = (uint64_t)t_idx;
    for (uint32_t j = 0; j < t->ndim; j++) {
        bx->ro[j] = reg->offset ? reg->offset[j] : 0;
        if (bx->ro[j] > shape[j])
            return ckptio__fail(&r->msg, CKPTIO_E_RANGE,
                                "region of tensor '%s' starts at %llu in dimension %u, past its "
                                "size %llu",
                                name, (unsigned long long)bx->ro[j], j, (unsigned long long)shape[j]);
        bx->rs[j] = reg->shape ? reg->shape[j] : shape[j] - bx->ro[j];
        if (bx->rs[j] > shape[j] - bx->ro[j])
            return ckptio__fail(&r->msg, CKPTIO_E_RANGE,
                                "region of tensor '%s' ends at %llu in dimension %u, past its "
                                "size %llu",
                                name, (unsigned long long)(bx->ro[j] + bx->rs[j]), j,
                                (unsigned long long)shape[j]);
    }
    ckptio__volume(bx->rs, t->ndim, ckptio_dtype_size((int)t->dtype), &bx->bytes);
    if (reg->capacity < bx->bytes)
        return ckptio__fail(&r->msg, CKPTIO_E_BUFFER,
                            "tensor '%s': the region needs %llu bytes but the destination holds "
                            "%llu",
                            name, (unsigned long long)bx->bytes, (unsigned long long)reg->capacity);
    if (!bx->bytes) return 0;
    if (!reg->dst)
        return ckptio__fail(&r->msg, CKPTIO_E_USAGE, "tensor '%s': destination is NULL", name);
    uint64_t lo[CKPTIO_MAX_NDIM], cnt[CKPTIO_MAX_NDIM];
    for (uint64_t c = t->chunk0; c < t->chunk0 + t->n_chunks; c++)
        if (intersect(r, bx, c, lo, cnt)) CKPTIO__TRY(ckptio__read_prepare_chunk(r, c));
    return 0;
}

int ckptio__read_plan_region(ckptio_reader *r, plan *pl, const box *bx)
{
    if (!bx->bytes) return 0;
    const ckptio__mtensor *t = &r->m->tensors[bx->t];
    r->stats.bytes += bx->bytes;
    r->stats.tensors++;
    for (uint64_t c = 0; c < t->n_chunks; c++) CKPTIO__TRY(plan_piece(r, pl, bx, t->chunk0 + c));
    return 0;
}
