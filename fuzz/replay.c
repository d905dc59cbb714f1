/* SPDX-License-Identifier: Apache-2.0 */
/* Runs the fuzz target over stored inputs (files or directories), so the corpus replays in CI. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static unsigned ran;

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) goto fail;
    struct stat st;
    if (fstat(fileno(f), &st) < 0) goto fail_close;
    size_t size = (size_t)st.st_size;
    /* Exactly `size` bytes, so a sanitizer flags any read past the input. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) goto fail_close;
    if (fread(buf, 1, size, f) != size) {
        free(buf);
        goto fail_close;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, size);
    free(buf);
    ran++;
    return 0;
fail_close:
    fclose(f);
fail:
    fprintf(stderr, "fuzz-replay: %s: %s\n", path, strerror(errno ? errno : EIO));
    return -1;
}

static int run_path(const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0) {
        fprintf(stderr, "fuzz-replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) return run_file(path);
    DIR *d = opendir(path);
    if (!d) {
        fprintf(stderr, "fuzz-replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        size_t n = strlen(path) + strlen(e->d_name) + 2;
        char *sub = malloc(n);
        if (!sub) {
            rc = -1;
            break;
        }
        snprintf(sub, n, "%s/%s", path, e->d_name);
        if (run_path(sub) < 0) rc = -1;
        free(sub);
    }
    closedir(d);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE_OR_DIR...\n", argv[0]);
        return 2;
    }
    int rc = 0;
    for (int i = 1; i < argc; i++)
        if (run_path(argv[i]) < 0) rc = 1;
    printf("fuzz-replay: ran %u inputs\n", ran);
    return rc;
}
