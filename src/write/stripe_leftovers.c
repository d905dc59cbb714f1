/* SPDX-License-Identifier: Apache-2.0 */
/* What the writer needs to stripe a checkpoint: its owner name, old stripes, leftover removal. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../commit/stripe.h"
#include "../commit/txn.h"
#include "../format/manifest.h"
#include "writer.h"

char *ckptio__stripe_owner_of(const char *target)
{
    char *parent = ckptio__parent_dir(target);
    char *abs = parent ? realpath(parent, NULL) : NULL;
    const char *slash = strrchr(target, '/');
    char *out = NULL;
    if (abs && asprintf(&out, "%s%s%s", abs, strcmp(abs, "/") ? "/" : "",
                        slash ? slash + 1 : target) < 0)
        out = NULL;
    free(parent);
    free(abs);
    return out;
}

/* The manifest of the checkpoint at `dir`, decoded; NULL when there is none (ENOENT) or it is
 * format 1 (no stripes), -errno or a decode error otherwise. */
static int published_manifest(const char *dir, ckptio__manifest **out)
{
    *out = NULL;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/manifest", dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return errno == ENOENT || errno == ENOTDIR ? 0 : -errno;
    /* Most checkpoints are format 1, without stripes: their manifest need not be decoded. */
    uint8_t head[10];
    if (pread(fd, head, sizeof head, 0) == (ssize_t)sizeof head &&
        !memcmp(head, "\x89" "CKPTIO\n", 8) && head[8] == 1 && head[9] == 0) {
        close(fd);
        return 0;
    }
    off_t len = lseek(fd, 0, SEEK_END);
    uint8_t *buf = len > 0 && (uint64_t)len <= CKPTIO__MAX_MANIFEST_BYTES ? malloc((size_t)len)
                                                                        : NULL;
    int rc = buf ? 0 : -EIO;
    if (buf && pread(fd, buf, (size_t)len, 0) != len) rc = -EIO;
    close(fd);
    char err[256];
    if (rc == 0) rc = ckptio__manifest_decode(buf, (uint64_t)len, out, err, sizeof err);
    free(buf);
    return rc;
}

typedef struct named_ctx {
    const char *owner;
} named_ctx;

/* Whether the checkpoint now at the owner's path names stripe `name`; when it cannot be read
 * the stripe is kept (a leftover is better than a lost checkpoint). */
static bool named_by_published(void *ctx, const char *name)
{
    ckptio__manifest *m = NULL;
    int rc = published_manifest(((named_ctx *)ctx)->owner, &m);
    if (rc < 0) return true;
    bool named = false;
    for (uint64_t i = 0; m && i < m->n_roots && !named; i++)
        named = !strcmp(m->strtab + m->roots[i].name, name);
    ckptio__manifest_free(m);
    return named;
}

int ckptio__stripe_collect_owned(const char *owner, const char *root, bool dry, unsigned *found)
{
    named_ctx c = {owner};
    return ckptio__stripe_collect(root, owner, named_by_published, &c, dry, found);
}

int ckptio__stripe_recorded_roots(const char *dir, char ***roots, size_t *n)
{
    *roots = NULL;
    *n = 0;
    ckptio__manifest *m = NULL;
    int rc = published_manifest(dir, &m);
    if (rc < 0 || !m || !m->n_roots) {
        ckptio__manifest_free(m);
        return rc < 0 ? rc : 0;
    }
    char **r = calloc(m->n_roots, sizeof *r);
    for (uint64_t i = 0; r && i < m->n_roots; i++) {
        r[i] = strdup(m->strtab + m->roots[i].path);
        if (!r[i]) rc = -ENOMEM;
    }
    if (!r) rc = -ENOMEM;
    if (r) *n = (size_t)m->n_roots;
    *roots = r;
    ckptio__manifest_free(m);
    return rc;
}

int ckptio_stripe_leftovers(const char *path, const char *const *roots, size_t n, int remove,
                            uint64_t *found)
{
    if (found) *found = 0;
    if (!path || !*path || (n && !roots))
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_stripe_leftovers: path is required");
    /* The owner name a save to `path` records: links followed, trailing slashes dropped. */
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/') len--;
    char *given = strndup(path, len), *target = NULL, *owner = NULL;
    int rc = given ? ckptio__follow_links(given, &target) : -ENOMEM;
    free(given);
    if (rc == 0 && !(owner = ckptio__stripe_owner_of(target))) rc = -errno ? -errno : -ENOMEM;
    if (rc < 0) ckptio__fail(NULL, rc, "cannot resolve '%s'", path);
    char **recorded = NULL;
    size_t n_rec = 0;
    if (rc == 0 && !n && (rc = ckptio__stripe_recorded_roots(owner, &recorded, &n_rec)) < 0)
        ckptio__fail(NULL, rc, "cannot read the manifest of '%s'", path);
    uint64_t total = 0;
    for (size_t i = 0; rc == 0 && i < (n ? n : n_rec); i++) {
        unsigned k = 0;
        const char *root = n ? roots[i] : recorded[i];
        if (!root) rc = ckptio__fail(NULL, CKPTIO_E_USAGE, "ckptio_stripe_leftovers: root is NULL");
        else if ((rc = ckptio__stripe_collect_owned(owner, root, !remove, &k)) < 0)
            ckptio__fail(NULL, rc, "cannot list root '%s'", root);
        total += k;
    }
    for (size_t i = 0; i < n_rec; i++) free(recorded[i]);
    free(recorded);
    free(target);
    free(owner);
    if (found) *found = total;
    return rc;
}
