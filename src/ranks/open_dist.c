/* SPDX-License-Identifier: Apache-2.0 */
/* A reader opened by every rank of a job at once: the manifest read once, by rank 0, and sent
 * to the others over the job's communicator. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../read/chain.h"
#include "../read/reader.h"
#include "comm.h"

/* What rank 0 broadcasts: a status word (0, or the negative code its open failed with), then
 * the manifest's bytes, or the failure's message. */
#define STATUS_BYTES 4

int ckptio_reader_open_comm(ckptio_reader **out, const char *path, const ckptio_params *p,
                            const ckptio_comm *comm, double timeout)
{
    if (!out || !path || !*path || !comm) {
        if (out) *out = NULL;
        return ckptio__fail(NULL, CKPTIO_E_USAGE,
                            "ckptio_reader_open_comm: out, path and comm are required");
    }
    *out = NULL;
    ckptio_bytes b = CKPTIO_BYTES_INIT;
    int rc;
    if (comm->rank == 0) {
        uint8_t *man = NULL;
        uint64_t len = 0;
        int32_t st = ckptio__read_open_with(out, path, p, NULL, 0, &man, &len);
        const char *why = st < 0 ? ckptio_last_error() : NULL;
        size_t body = st < 0 ? strlen(why) : (size_t)len;
        rc = ckptio_bytes_resize(&b, STATUS_BYTES + body);
        if (rc == 0) {
            memcpy(b.data, &st, STATUS_BYTES);
            memcpy((uint8_t *)b.data + STATUS_BYTES, st < 0 ? (const void *)why : man, body);
        }
        free(man);
        if (rc == 0) rc = ckptio_comm_broadcast(comm, 0, &b, timeout);
        if (rc < 0 || st < 0) {
            ckptio_reader_close(*out);
            *out = NULL;
        }
        if (*out) (*out)->base_read = ckptio__base_read; /* as ckptio_reader_open's */
        if (st < 0) rc = ckptio__fail(NULL, st, "%.*s", (int)body, (const char *)b.data + STATUS_BYTES);
        ckptio_bytes_free(&b);
        return rc < 0 ? rc : 0;
    }
    rc = ckptio_comm_broadcast(comm, 0, &b, timeout);
    if (rc == 0 && b.len < STATUS_BYTES)
        rc = ckptio__fail(NULL, -EPROTO, "ckptio_reader_open_comm: rank 0 sent %zu bytes for '%s'",
                          b.len, path);
    if (rc == 0) {
        int32_t st;
        memcpy(&st, b.data, STATUS_BYTES);
        const uint8_t *body = (const uint8_t *)b.data + STATUS_BYTES;
        size_t n = b.len - STATUS_BYTES;
        if (st < 0)
            rc = ckptio__fail(NULL, st, "rank 0 could not open '%s' for the job: %.*s", path,
                              (int)n, (const char *)body);
        else if ((rc = ckptio__read_open_with(out, path, p, body, n, NULL, NULL)) == 0)
            (*out)->base_read = ckptio__base_read;
    }
    ckptio_bytes_free(&b);
    return rc;
}
