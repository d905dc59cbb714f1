/* SPDX-License-Identifier: Apache-2.0 */
/* The convert engine's format detection: what a source holds, what a destination's name asks. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../store/store.h"
#include "convert.h"

static const char *const fmt_names[] = {NULL, "ckptio", "safetensors", "hf", "torch", "dcp"};

const char *ckptio_convert_format_name(int format)
{
    return format >= CKPTIO_CONVERT_CKPTIO && format <= CKPTIO_CONVERT_DCP ? fmt_names[format]
                                                                           : NULL;
}

int ckptio_convert_format_parse(const char *name)
{
    if (!name) return CKPTIO_E_USAGE;
    for (int f = CKPTIO_CONVERT_CKPTIO; f <= CKPTIO_CONVERT_DCP; f++)
        if (!strcmp(name, fmt_names[f])) return f;
    if (!strcmp(name, "st")) return CKPTIO_CONVERT_SAFETENSORS;
    if (!strcmp(name, "pt") || !strcmp(name, "pytorch")) return CKPTIO_CONVERT_TORCH;
    return CKPTIO_E_USAGE;
}

bool ckptio__conv_ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static bool exists_in(const char *dir, const char *name)
{
    char *p = NULL;
    bool ok = asprintf(&p, "%s/%s", dir, name) >= 0 && access(p, F_OK) == 0;
    free(p);
    return ok;
}

char *ckptio__conv_find_index(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return NULL;
    char *found = NULL;
    struct dirent *e;
    while ((e = readdir(d)))
        if (ckptio__conv_ends_with(e->d_name, ".safetensors.index.json") && e->d_name[0] != '.') {
            free(found);
            found = strdup(e->d_name);
            if (!found || !strcmp(e->d_name, "model.safetensors.index.json")) break;
        }
    closedir(d);
    return found;
}

static bool torch_name(const char *path)
{
    return ckptio__conv_ends_with(path, ".pt") || ckptio__conv_ends_with(path, ".pth") ||
           ckptio__conv_ends_with(path, ".bin") || ckptio__conv_ends_with(path, ".ckpt");
}

int ckptio__conv_remote(const char *path)
{
    ckptio__msg msg = {0};
    int rc = ckptio__store_remote(path, &msg);
    return rc < 0 ? ckptio__refail(NULL, &msg, rc, "convert", NULL) : rc;
}

/* In a store that is no file system names decide, then whether a manifest is there. */
static int detect_url(const char *path, const ckptio_store_opts *store)
{
    if (ckptio__conv_ends_with(path, ".safetensors")) return CKPTIO_CONVERT_SAFETENSORS;
    if (ckptio__conv_ends_with(path, ".safetensors.index.json")) return CKPTIO_CONVERT_HF;
    int rc = ckptio_is_checkpoint_with(path, store);
    return rc < 0 ? rc : rc ? CKPTIO_CONVERT_CKPTIO : CKPTIO_CONVERT_HF;
}

static int detect_src(const char *path, const ckptio_store_opts *store)
{
    int rc = ckptio__conv_remote(path);
    if (rc < 0) return rc;
    if (rc) return detect_url(path, store);
    struct stat st;
    if (stat(path, &st) < 0) return ckptio__fail(NULL, -errno, "%s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        if (exists_in(path, "manifest")) return CKPTIO_CONVERT_CKPTIO;
        if (exists_in(path, ".metadata")) return CKPTIO_CONVERT_DCP;
        char *idx = ckptio__conv_find_index(path);
        if (idx) return free(idx), CKPTIO_CONVERT_HF;
        return ckptio__fail(NULL, CKPTIO_E_FORMAT,
                            "%s: a directory without a ckptio manifest, a DCP .metadata or a "
                            "*.safetensors.index.json; pass --from",
                            path);
    }
    if (ckptio__conv_ends_with(path, ".safetensors.index.json")) return CKPTIO_CONVERT_HF;
    unsigned char head[9] = {0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t got = fd >= 0 ? pread(fd, head, sizeof head, 0) : -1;
    if (fd >= 0) close(fd);
    if (got >= 4 && !memcmp(head, "PK\x03\x04", 4)) return CKPTIO_CONVERT_TORCH;
    if (got == 9 && head[8] == '{') return CKPTIO_CONVERT_SAFETENSORS;
    if (ckptio__conv_ends_with(path, ".safetensors")) return CKPTIO_CONVERT_SAFETENSORS;
    if (torch_name(path)) return CKPTIO_CONVERT_TORCH;
    return ckptio__fail(NULL, CKPTIO_E_FORMAT,
                        "%s: cannot tell the format from its name or first bytes; pass --from",
                        path);
}

int ckptio_convert_detect(const char *path, int is_dst, int sharded)
{
    return ckptio__conv_detect(path, is_dst, sharded, NULL);
}

int ckptio__conv_detect(const char *path, int is_dst, int sharded, const ckptio_store_opts *store)
{
    if (!path || !*path) return ckptio__fail(NULL, CKPTIO_E_USAGE, "convert: no path");
    if (!is_dst) return detect_src(path, store);
    if (ckptio__conv_ends_with(path, ".safetensors")) return CKPTIO_CONVERT_SAFETENSORS;
    if (torch_name(path)) return CKPTIO_CONVERT_TORCH;
    if (ckptio__conv_ends_with(path, ".dcp") || ckptio__conv_ends_with(path, ".dcp/"))
        return CKPTIO_CONVERT_DCP;
    if (sharded) return CKPTIO_CONVERT_HF;
    struct stat st;
    int rc = ckptio__conv_remote(path);
    if (rc < 0) return rc;
    if (!rc && stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        if (exists_in(path, ".metadata")) return CKPTIO_CONVERT_DCP;
        char *idx = ckptio__conv_find_index(path);
        if (idx) return free(idx), CKPTIO_CONVERT_HF;
    }
    return CKPTIO_CONVERT_CKPTIO;
}
