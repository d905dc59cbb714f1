/* SPDX-License-Identifier: Apache-2.0 */
/* The single-file writer: a foreign-format file written at device speed, published atomically. */
#include <errno.h>
#include <stdlib.h>

#include "file_writer.h"

int ckptio_file_writer_open(ckptio_file_writer **out, const char *path, const ckptio_params *p)
{
    if (!out || !path || !*path) {
        if (out) *out = NULL;
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_file_writer_open: out and path are required");
    }
    *out = NULL;
    ckptio_file_writer *f = calloc(1, sizeof *f);
    if (!f) return ckptio__fail(NULL, -ENOMEM, "out of memory");
    int rc = ckptio__file_writer_init(f, path, p);
    if (rc < 0) {
        ckptio__msg keep = f->msg;
        ckptio_file_writer_close(f);
        return ckptio__refail(NULL, &keep, rc, "cannot open file writer", NULL);
    }
    *out = f;
    return 0;
}

int ckptio__file_writer_init(ckptio_file_writer *f, const char *path, const ckptio_params *p)
{
    f->t_open = ckptio__now();
    ckptio__handle_init(&f->hs);
    int rc;
    CKPTIO__CHECK(ckptio__cfg_resolve(p, &f->cfg, &f->msg));
    /* Saving to a symlink writes through to its target, as torch.save does: the temporary file
     * goes beside the target (a rename cannot cross file systems) and replaces it; the link
     * stays a link. */
    CKPTIO__CHECK(ckptio__txn_begin(&f->txn, path, CKPTIO__TXN_FILE,
                                    ckptio__cfg_txn_flags(&f->cfg), f->cfg.direct, f->cfg.store,
                                    &f->msg));
    CKPTIO__CHECK(ckptio__sink_init(&f->sink, f->txn.fd, f->txn.direct, f->cfg.backend,
                                    f->cfg.depth, f->cfg.threads, f->cfg.staging, f->cfg.request,
                                    f->txn.tmp_path, &f->msg));
    ckptio__stats_backend(f->stats.backend, f->cfg.backend, ckptio__engine_name(f->sink.eng));
    f->stats.direct = f->txn.direct;
    f->stats.alignment = f->sink.off_align;
    return 0;
out:
    if (rc == -ENOMEM && !f->msg.text[0]) ckptio__fail(&f->msg, rc, "out of memory");
    return rc;
}

/* A large aligned source at an aligned offset goes to the device from the caller's memory (no
 * copy), and the call waits for those writes, since the caller may reuse `src` once it returns.
 * Its last request's worth is still copied: those staged writes keep the device busy after the
 * return, until the next call submits more. */
static int put(ckptio__sink *s, const uint8_t *src, uint64_t n)
{
    uint64_t head = 0;
    if (n >= CKPTIO__SINK_IN_PLACE_MIN + s->request && s->cursor % s->off_align == 0 &&
        (uintptr_t)src % s->mem_align == 0)
        head = ckptio__align_down(n - s->request, s->off_align);
    int rc = head ? ckptio__sink_put(s, src, head, s->request, NULL, NULL) : 0;
    if (rc == 0) rc = ckptio__sink_write(s, src + head, n - head);
    /* even after a failure: no write may still read src once this returns */
    int w = head ? ckptio__sink_settle(s) : 0;
    return rc < 0 ? rc : w;
}

int ckptio_file_writer_write(ckptio_file_writer *f, const void *data, size_t len)
{
    if (!f) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_file_writer_write: writer is NULL");
    CKPTIO__TRY(ckptio__handle_usable(&f->hs, &f->msg, f->txn.path));
    if (len && !data) return ckptio__fail(&f->msg, CKPTIO_E_USAGE, "ckptio_file_writer_write: data is NULL");
    int rc = put(&f->sink, data, len);
    if (rc < 0) return ckptio__handle_poison(&f->hs, rc);
    f->stats.bytes += len;
    return 0;
}

uint64_t ckptio_file_writer_tell(const ckptio_file_writer *f)
{
    return f ? f->sink.cursor : 0;
}

int ckptio_file_writer_commit(ckptio_file_writer *f)
{
    if (!f) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_file_writer_commit: writer is NULL");
    CKPTIO__TRY(ckptio__handle_usable(&f->hs, &f->msg, f->txn.path));
    int rc;
    CKPTIO__CHECK(ckptio__sink_finish(&f->sink));
    rc = ckptio__txn_publish(&f->txn, NULL, 0, &f->msg); /* keeps the mode, fsyncs, renames */
    if (f->txn.published) { /* CKPTIO_E_NOT_DURABLE too: the file is complete */
        f->hs.state = CKPTIO__H_COMMITTED;
        f->stats.io_bytes = f->sink.io_bytes;
        f->stats.seconds = ckptio__now() - f->t_open;
        f->stats.gbps =
            f->stats.seconds > 0 ? (double)f->stats.bytes / f->stats.seconds / 1e9 : 0;
    }
out:
    if (rc < 0) ckptio__handle_poison(&f->hs, rc);
    return rc;
}

void ckptio__file_writer_fini(ckptio_file_writer *f)
{
    ckptio__sink_fini(&f->sink);
    ckptio__txn_fini(&f->txn); /* closes the file; removes it unless published */
}

void ckptio_file_writer_close(ckptio_file_writer *f)
{
    if (!f) return;
    ckptio__file_writer_fini(f);
    free(f);
}

int ckptio_file_writer_stats(const ckptio_file_writer *f, ckptio_stats *out)
{
    if (!f || !out) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_file_writer_stats: NULL argument");
    *out = f->stats;
    return 0;
}

const char *ckptio_file_writer_errmsg(const ckptio_file_writer *f)
{
    return f ? f->msg.text : "";
}

int ckptio_file_writer_error_info(const ckptio_file_writer *f, ckptio_error_info *out)
{
    if (!f) return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_file_writer_error_info: NULL");
    return ckptio__msg_info(&f->msg, out, "ckptio_file_writer_error_info");
}
