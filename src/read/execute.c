/* SPDX-License-Identifier: Apache-2.0 */
/* Running a read plan: requests through the ring, checksums verified, bytes scattered. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../io/vfd.h"
#include "../io/vfs.h"
#include "reader.h"

/* ---- execution ---- */

static void report_bad(ckptio_reader *r, const plan *pl)
{
    ckptio__fail_at(&r->msg, CKPTIO_E_CHECKSUM, tname(r, pl->bad_chunk), r->path,
                    fname(r, pl->bad_file), pl->bad_foff,
                    "checksum mismatch in tensor '%s': bytes %llu..%llu of its chunk at offset "
                    "%llu of '%s/%s' are damaged; restore this checkpoint from a copy or load an "
                    "earlier one",
                    tname(r, pl->bad_chunk), (unsigned long long)pl->bad_x,
                    (unsigned long long)(pl->bad_x + pl->bad_len), (unsigned long long)pl->bad_foff,
                    r->path, fname(r, pl->bad_file));
}

/* One checksum block to hash, and the part of it a staged segment puts in its destination
 * (cp_len 0: none), copied by the same worker while the block is still in its cache. */
typedef struct hblock {
    const uint8_t *p;
    uint64_t len, hash;
    uint8_t *dst;
    uint64_t cp_off, cp_len;
} hblock;

static void hash_block(void *ctx, size_t i, unsigned worker)
{
    (void)worker;
    hblock *b = (hblock *)ctx + i;
    b->hash = ckptio__hash(b->p, b->len);
    if (b->cp_len) memcpy(b->dst, b->p + b->cp_off, b->cp_len);
}

/* A staged, verified segment whose piece is one run: its blocks are copied out as they are
 * hashed (on every worker) instead of by ckptio__read_scatter() afterwards (on one thread). */
static bool fused(const plan *pl, const seg *s)
{
    return !s->direct && !s->coded && s->verify && s->piece != NONE &&
           CKPTIO__VEC_AT(&pl->pieces, piece, s->piece)->k == 0;
}

/* Verify the blocks of segments segs[first, last), all in one buffer at file offset `off`,
 * hashing on every worker; mismatches are noted in file order. */
static int check_io(ckptio_reader *r, plan *pl, size_t first, size_t last, const uint8_t *buf,
                    uint64_t off)
{
    const seg *segs = pl->segs.items;
    uint64_t B = r->m->csum_block;
    pl->blocks.len = 0;
    for (size_t k = first; k < last; k++) {
        const seg *s = &segs[k];
        if (!s->verify || s->coded) continue;
        const ckptio__mchunk *c = &r->m->chunks[s->chunk];
        const uint8_t *base = buf + (s->foff - off);
        const piece *p = fused(pl, s) ? CKPTIO__VEC_AT(&pl->pieces, piece, s->piece) : NULL;
        for (uint64_t x = s->a; x < s->b; x += B) {
            hblock hb = {base + (x - s->a), CKPTIO__MIN(B, c->stored_len - x), 0, NULL, 0, 0};
            if (p) {
                uint64_t lo = CKPTIO__MAX(x, p->src0);
                uint64_t hi = CKPTIO__MIN(CKPTIO__MIN(x + hb.len, s->b), p->src0 + p->run_len);
                if (lo < hi) {
                    hb.dst = p->dst + p->dst0 + (lo - p->src0);
                    hb.cp_off = lo - x;
                    hb.cp_len = hi - lo;
                }
            }
            if (ckptio__vec_push(&pl->blocks, &hb, 1) < 0) return -ENOMEM;
        }
    }
    ckptio__workers_for(pl->workers, pl->blocks.len, hash_block, pl->blocks.items);
    const hblock *hb = pl->blocks.items;
    int rc = 0;
    for (size_t k = first; k < last; k++) {
        const seg *s = &segs[k];
        if (!s->verify || s->coded) continue;
        const ckptio__mchunk *c = &r->m->chunks[s->chunk];
        for (uint64_t x = s->a; x < s->b; x += B, hb++)
            if (hb->hash != r->m->csums[c->csums + x / B] && !rc)
                rc = ckptio__read_note_bad(r, pl, s, x, hb->len);
    }
    return rc;
}

void ckptio__read_io_segs(const plan *pl, size_t i, size_t *first, size_t *last)
{
    const size_t *f = pl->firsts.items;
    *first = f[i];
    *last = f[i + 1];
}

typedef struct read_ctx {
    ckptio_reader *r;
    plan *pl;
} read_ctx;

/* A checkpoint read came back: verify its blocks, then scatter the staged bytes. */
static int read_done(void *ctx, size_t i, const ckptio__ring_io *io, const void *buf, int64_t res)
{
    ckptio_reader *r = ((read_ctx *)ctx)->r;
    plan *pl = ((read_ctx *)ctx)->pl;
    const seg *segs = pl->segs.items;
    size_t first, last;
    ckptio__read_io_segs(pl, i, &first, &last);
    if (res < 0) {
        const seg *s = &segs[first];
        const char *why = ckptio__vfd_error(r->files[s->file].fd); /* an object store's words */
        return ckptio__fail(&r->msg, (int)res,
                            "reading %llu bytes at offset %llu of '%s/%s' (tensor '%s') failed%s%s",
                            (unsigned long long)io->len, (unsigned long long)io->off, r->path,
                            fname(r, s->file), tname(r, s->chunk), *why ? ": " : "", why);
    }
    r->stats.io_bytes += (uint64_t)res;
    r->rstats.requests++;
    /* stats.direct: O_DIRECT read some of the data (the ring reads a direct file's descriptor;
     * resident ranges were copied through the buffered one) */
    if (pl->files[segs[first].file].direct) r->stats.direct = 1;
    /* Segments that the bytes cover are verified and copied out; the first one cut short ends
     * the request. */
    size_t end = last;
    int trunc = 0;
    for (size_t k = first; k < last; k++) {
        const seg *s = &segs[k];
        uint64_t need = s->foff + (s->b - s->a) - io->off;
        if ((uint64_t)res < need) {
            if (pl->bad && !pl->bad[s->chunk]) {
                pl->bad[s->chunk] = 1; /* a flag: counting here would wrap */
                pl->bad_chunks++;
            }
            trunc = ckptio__fail_at(&r->msg, CKPTIO_E_CORRUPT, tname(r, s->chunk), r->path,
                                    fname(r, s->file), io->off + (uint64_t)res,
                                    "data file '%s/%s' ended at byte %llu while reading tensor "
                                    "'%s'; the file is truncated",
                                    r->path, fname(r, s->file),
                                    (unsigned long long)(io->off + (uint64_t)res),
                                    tname(r, s->chunk));
            end = k;
            break;
        }
    }
    int rc = check_io(r, pl, first, end, buf, io->off);
    int drc = ckptio__read_decode_io(r, pl, first, end, buf, io->off);
    if (!rc) rc = drc;
    for (size_t k = first; k < end; k++) {
        const seg *s = &segs[k];
        if (!s->direct && !s->coded && s->piece != NONE && !fused(pl, s))
            ckptio__read_scatter(pl, s, (const uint8_t *)buf + (s->foff - io->off));
    }
    return trunc ? trunc : rc;
}

void ckptio__read_plan_init(plan *pl, rfile *files, uint64_t block, uint64_t request,
                            uint64_t buf_size)
{
    memset(pl, 0, sizeof *pl);
    pl->files = files;
    pl->block = block;
    pl->request = request;
    pl->buf_size = buf_size;
    ckptio__vec_init(&pl->pieces, sizeof(piece));
    ckptio__vec_init(&pl->segs, sizeof(seg));
    ckptio__vec_init(&pl->geo, sizeof(uint64_t));
    ckptio__vec_init(&pl->iters, sizeof(uint64_t));
    ckptio__vec_init(&pl->ios, sizeof(ckptio__ring_io));
    ckptio__vec_init(&pl->firsts, sizeof(size_t));
    ckptio__vec_init(&pl->csegs, sizeof(seg));
    ckptio__vec_init(&pl->blocks, sizeof(hblock));
}

void ckptio__read_plan_free(plan *pl)
{
    ckptio__vec_free(&pl->pieces);
    ckptio__vec_free(&pl->segs);
    ckptio__vec_free(&pl->geo);
    ckptio__vec_free(&pl->iters);
    ckptio__vec_free(&pl->ios);
    ckptio__vec_free(&pl->firsts);
    ckptio__vec_free(&pl->csegs);
    ckptio__vec_free(&pl->blocks);
    free(pl->bad);
}

/* Start the ring if need be and read everything planned. */

typedef struct cjob {
    plan *pl;
    const ckptio_reader *r; /* NULL: a foreign file, nothing to verify */
    uint8_t *scratch;       /* one buffer of `stride` bytes per worker, for staged parts */
    uint64_t stride;
    cres *res;
} cjob;

/* Copy one resident part from the page cache, verify it while it is still in the CPU's
 * cache, and scatter it when it was staged. Parts write disjoint destination bytes. */
static void cached_job(void *ctx, size_t i, unsigned worker)
{
    cjob *j = ctx;
    const seg *s = CKPTIO__VEC_AT(&j->pl->csegs, seg, i);
    const rfile *f = &j->pl->files[s->file];
    cres *o = &j->res[i];
    uint64_t n = s->b - s->a;
    uint8_t *dst = j->scratch + (size_t)worker * j->stride;
    if (s->direct) {
        const piece *p = CKPTIO__VEC_AT(&j->pl->pieces, piece, s->piece);
        dst = p->dst + p->dst0 + (s->a - p->src0);
    }
    for (uint64_t got = 0; got < n;) {
        ssize_t k = CKPTIO__VFS->pread(f->bfd, dst + got, (size_t)(n - got), (off_t)(s->foff + got));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            o->rc = k < 0 ? -errno : CKPTIO_E_CORRUPT;
            o->got = got;
            return;
        }
        got += (uint64_t)k;
    }
    if (s->verify && j->r) {
        const ckptio__mchunk *c = &j->r->m->chunks[s->chunk];
        uint64_t B = j->r->m->csum_block;
        for (uint64_t x = s->a; x < s->b; x += B) {
            uint64_t len = CKPTIO__MIN(B, c->stored_len - x);
            if (ckptio__hash(dst + (x - s->a), len) != j->r->m->csums[c->csums + x / B]) {
                o->bad = true;
                o->bad_x = x;
                o->bad_len = len;
                break;
            }
        }
    }
    if (!s->direct && s->piece != NONE) ckptio__read_scatter(j->pl, s, dst);
}

/* Run every cached segment's job on the workers; *out (the caller frees it) says how each went. */
int ckptio__read_run_cached(plan *pl, const ckptio_reader *r, cres **out)
{
    size_t n = pl->csegs.len;
    *out = NULL;
    if (!n) return 0;
    cjob j = {.pl = pl, .r = r};
    for (size_t i = 0; i < n; i++) {
        const seg *s = CKPTIO__VEC_AT(&pl->csegs, seg, i);
        if (!s->direct) j.stride = CKPTIO__MAX(j.stride, s->b - s->a);
        pl->cache_bytes += s->b - s->a;
    }
    j.res = calloc(n, sizeof *j.res);
    if (j.stride) j.scratch = malloc((size_t)j.stride * ckptio__workers_count(pl->workers));
    if (!j.res || (j.stride && !j.scratch)) {
        free(j.res);
        free(j.scratch);
        return -ENOMEM;
    }
    ckptio__workers_for(pl->workers, n, cached_job, &j);
    free(j.scratch);
    *out = j.res;
    return 0;
}

int ckptio__read_start_workers(ckptio__workers **w, unsigned n, ckptio__msg *msg, const char *label)
{
    if (*w) return 0;
    int rc = ckptio__workers_start(w, n);
    if (rc < 0) return ckptio__fail(msg, rc, "cannot start the threads that read '%s'", label);
    return 0;
}

/* Read everything planned: resident parts by the workers, then the rest through the ring.
 * Both run to the end after a checksum mismatch, so the damaged block reported is the first
 * in file order whatever the timing. */
int ckptio__read_execute(ckptio_reader *r, plan *pl)
{
    CKPTIO__TRY(ckptio__read_start_workers(&r->workers, r->cfg.verify_threads, &r->msg, r->path));
    pl->workers = r->workers;
    r->rstats.verify_threads = ckptio__workers_count(r->workers);
    CKPTIO__TRY(ckptio__read_plan_cache(pl));
    CKPTIO__TRY(ckptio__read_plan_ios(pl));
    r->rstats.merged += pl->merged;
    CKPTIO__TRY(ckptio__read_start_ring(r));
    cres *res;
    CKPTIO__TRY(ckptio__read_run_cached(pl, r, &res));
    r->rstats.cache_bytes += pl->cache_bytes;
    int rc = 0;
    for (size_t i = 0; i < pl->csegs.len; i++) {
        const seg *s = CKPTIO__VEC_AT(&pl->csegs, seg, i);
        if (res[i].rc < 0) {
            if (pl->bad && !pl->bad[s->chunk]) {
                pl->bad[s->chunk] = 1;
                pl->bad_chunks++;
            }
            rc = res[i].rc == CKPTIO_E_CORRUPT
                     ? ckptio__fail_at(&r->msg, CKPTIO_E_CORRUPT, tname(r, s->chunk), r->path,
                                       fname(r, s->file), s->foff + res[i].got,
                                       "data file '%s/%s' ended at byte %llu while reading "
                                       "tensor '%s'; the file is truncated",
                                       r->path, fname(r, s->file),
                                       (unsigned long long)(s->foff + res[i].got),
                                       tname(r, s->chunk))
                     : ckptio__fail(&r->msg, res[i].rc,
                                    "reading %llu bytes at offset %llu of '%s/%s' (tensor '%s') "
                                    "from the page cache failed",
                                    (unsigned long long)(s->b - s->a), (unsigned long long)s->foff,
                                    r->path, fname(r, s->file), tname(r, s->chunk));
            break;
        }
        if (res[i].bad) ckptio__read_note_bad(r, pl, s, res[i].bad_x, res[i].bad_len);
    }
    free(res);
    if (rc < 0) return rc;
    read_ctx ctx = {r, pl};
    rc = ckptio__ring_run(&r->ring, pl->ios.items, pl->ios.len, read_done, &ctx);
    if (pl->has_bad && (rc == 0 || rc == CKPTIO_E_CHECKSUM)) {
        report_bad(r, pl);
        rc = pl->bad ? rc : CKPTIO_E_CHECKSUM;
    }
    return rc;
}
