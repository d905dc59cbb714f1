/* SPDX-License-Identifier: Apache-2.0 */
/* Finding a striped checkpoint's stripe directories: given roots first, then the recorded one. */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stripes.h"

int ckptio__stripes_init(ckptio__stripes *s, uint64_t n)
{
    *s = (ckptio__stripes){0};
    s->fds = malloc((n + 1) * sizeof *s->fds);
    CKPTIO__RET_IF(!s->fds, -ENOMEM);
    for (uint64_t k = 0; k < n; k++) s->fds[k] = -1;
    s->n = n;
    return 0;
}

static void close_dirs(ckptio__stripes *s)
{
    for (uint64_t k = 0; s->fds && k < s->n; k++) {
        if (s->fds[k] >= 0) close(s->fds[k]);
        s->fds[k] = -1;
    }
}

static void free_roots(char **roots, size_t n)
{
    for (size_t k = 0; k < n; k++) free(roots[k]);
    free(roots);
}

void ckptio__stripes_free(ckptio__stripes *s)
{
    close_dirs(s);
    free(s->fds);
    free_roots(s->roots, s->n_roots);
    *s = (ckptio__stripes){0};
}

int ckptio__stripes_check(const char *const *roots, size_t n, ckptio__msg *msg, const char *fn)
{
    for (size_t k = 0; k < n; k++)
        if (!roots[k]) return ckptio__fail(msg, CKPTIO_E_USAGE, "%s: a root is NULL", fn);
    return 0;
}

int ckptio__stripes_set(ckptio__stripes *s, const char *const *roots, size_t n, ckptio__msg *msg,
                        const char *fn)
{
    CKPTIO__TRY(ckptio__stripes_check(roots, n, msg, fn));
    char **keep = NULL;
    if (n) {
        keep = calloc(n, sizeof *keep);
        CKPTIO__RET_IF(!keep, -ENOMEM);
        for (size_t k = 0; k < n; k++)
            if (!(keep[k] = strdup(roots[k]))) {
                free_roots(keep, k);
                return -ENOMEM;
            }
    }
    close_dirs(s);
    free_roots(s->roots, s->n_roots);
    s->roots = keep;
    s->n_roots = n;
    return 0;
}

int ckptio__stripes_dir(ckptio__stripes *s, const ckptio__manifest *m, uint32_t k)
{
    assert(k < s->n);
    const ckptio__mroot *mr = &m->roots[k];
    int err = ENOENT;
    /* The given roots first, then the recorded one: a stripe that did not move is found. */
    for (size_t j = 0; s->fds[k] < 0 && j <= s->n_roots; j++) {
        int at = open(j < s->n_roots ? s->roots[j] : m->strtab + mr->path,
                      O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (at < 0) {
            err = errno;
            continue;
        }
        s->fds[k] =
            openat(at, m->strtab + mr->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (s->fds[k] < 0) err = errno;
        close(at);
    }
    return s->fds[k] >= 0 ? s->fds[k] : -err;
}

int ckptio__stripes_fail(const ckptio__stripes *s, ckptio__msg *msg, int rc,
                         const ckptio__manifest *m, uint32_t k, const char *path, const char *file,
                         const char *setter)
{
    const ckptio__mroot *mr = &m->roots[k];
    return ckptio__fail(msg, rc,
                        "checkpoint '%s': its data file '%s' lies in stripe '%s' of root %u "
                        "(recorded as '%s'), which %s: mount that file system, or pass roots= "
                        "(%s) naming where the stripes are now",
                        path, file, m->strtab + mr->name, k + 1, m->strtab + mr->path,
                        s->n_roots ? "is in none of the given roots" : "cannot be opened", setter);
}
