/* SPDX-License-Identifier: Apache-2.0 */
/* `ckptio bench --merge`: runs the merge benchmark, the program ckptio-bench-merge beside it. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"

/* The benchmark times the private manifest merge, so it is built from bench/merge.c (which may
 * include src/) into a program of its own, installed (and built) in the same directory as the
 * command: found there through /proc/self/exe, wherever the two were installed. */
int cmd_bench_merge(int argc, char **argv)
{
    (void)argc;
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "ckptio bench --merge: cannot find this program (/proc/self/exe): %s\n",
                strerror(n < 0 ? errno : ENOENT));
        return 1;
    }
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (slash) *slash = 0;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/ckptio-bench-merge", slash ? self : ".");
    argv[0] = path; /* the rest as given: the benchmark reads only its own options */
    fflush(NULL);
    execv(path, argv);
    fprintf(stderr,
            "ckptio bench --merge: cannot run %s: %s (the merge benchmark is built and installed "
            "beside the ckptio command)\n",
            path, strerror(errno));
    return 1;
}
