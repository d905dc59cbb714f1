/* SPDX-License-Identifier: Apache-2.0 */
/* The shared test checkpoint of model.h: making, saving and bit-exact checking it. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "test.h"

#if defined(__SANITIZE_ADDRESS__)
#define HAVE_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HAVE_LSAN 1
#endif
#endif
#ifdef HAVE_LSAN
#include <sanitizer/lsan_interface.h>
#endif

const char *const tnames[NT] = {"a.unaligned", "b.aligned", "c.tiny"};
const uint64_t tsizes[NT] = {(3u << 20) + 1000, 2u << 20, 100};

int model_make(model *m, uint64_t seed)
{
    for (int i = 0; i < NT; i++) {
        /* b is page-aligned (written in place); a and c go through staging */
        m->t[i] = t_alloc(tsizes[i] + 4096);
        if (!m->t[i]) return -1;
        t_fill(m->t[i], tsizes[i], seed * 10 + (uint64_t)i);
        /* Under CKPTIO_COMPRESS (the crash tests rerun with compression on) the bytes are made
         * compressible, so the checkpoints these tests kill and cut really are coded. */
        const char *comp = getenv("CKPTIO_COMPRESS");
        if (comp && *comp && strcmp(comp, "none") != 0)
            for (uint64_t k = 0; k < tsizes[i]; k++) m->t[i][k] &= 0x7f;
    }
    return 0;
}

void model_free(model *m)
{
    for (int i = 0; i < NT; i++) t_free(m->t[i], tsizes[i] + 4096);
}

ckptio_params fparams(int overwrite)
{
    ckptio_params p;
    ckptio_params_init(&p);
    p.request_bytes = 256u << 10;
    p.staging_bytes = 1u << 20;
    p.queue_depth = 4;
    p.io_threads = 2;
    p.overwrite = overwrite ? CKPTIO_ON : CKPTIO_OFF;
    return p;
}

int save_model(const char *path, const model *m, int overwrite, char *msg, size_t msglen)
{
    ckptio_params p = fparams(overwrite);
    ckptio_writer *w = NULL;
    int rc = ckptio_writer_open(&w, path, &p);
    for (int i = 0; rc >= 0 && i < NT; i++) {
        uint64_t shape = tsizes[i];
        rc = ckptio_writer_add(w, tnames[i], CKPTIO_DT_U8, 1, &shape, NULL, NULL,
                               m->t[i] + (i == 0 ? 1 : 0), tsizes[i]);
    }
    if (rc >= 0) rc = ckptio_writer_set_meta(w, "step", "7", 1);
    if (rc >= 0) rc = ckptio_writer_commit(w);
    if (msg) snprintf(msg, msglen, "%s", w ? ckptio_writer_errmsg(w) : ckptio_last_error());
    ckptio_writer_close(w);
    return rc;
}

int load_model(const char *path, const model *m)
{
    ckptio_reader *r = NULL;
    int rc = ckptio_reader_open(&r, path, NULL);
    if (rc < 0) return rc;
    int differ = 0;
    if (ckptio_reader_num_tensors(r) != NT) differ = 1;
    for (int i = 0; !differ && rc >= 0 && i < NT; i++) {
        uint64_t cap = (tsizes[i] + 4095) & ~4095ull;
        unsigned char *buf = t_alloc(cap);
        if (!buf) {
            ckptio_reader_close(r);
            return -ENOMEM;
        }
        rc = ckptio_reader_read_tensor(r, tnames[i], buf, cap);
        if (rc >= 0 && memcmp(buf, m->t[i] + (i == 0 ? 1 : 0), tsizes[i])) differ = 1;
        t_free(buf, cap);
    }
    uint64_t bad = 0;
    if (rc >= 0 && !differ) rc = ckptio_reader_verify(r, &bad);
    ckptio_reader_close(r);
    return rc < 0 ? rc : differ;
}

int count_prefix_in(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir ? dir : t_dir());
    if (!d) return -1;
    int n = 0;
    for (struct dirent *de; (de = readdir(d));) n += !strncmp(de->d_name, prefix, strlen(prefix));
    closedir(d);
    return n;
}

int leak_check(void)
{
#ifdef HAVE_LSAN
    if (__lsan_do_recoverable_leak_check()) {
        fprintf(stderr, "LeakSanitizer found leaks\n");
        return 1;
    }
#endif
    return 0;
}
