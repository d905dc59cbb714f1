/* SPDX-License-Identifier: Apache-2.0 */
/* `ckptio doctor`: describe this build and system (backends, io_uring, O_DIRECT, alignment). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckptio.h"
#include "cli.h"
#include "commands.h"

int cmd_doctor(int argc, char **argv)
{
    const char *dir = NULL;
    int done = cli_one_dir_arg(argc, argv, "doctor", &dir, NULL);
    if (done >= 0) return done;
    char small[4096];
    int n = ckptio_describe_system(dir, small, sizeof small);
    if (n < 0) return cli_fail("doctor", "%s", ckptio_strerror(n));
    char *buf = small;
    if ((size_t)n >= sizeof small) {
        buf = malloc((size_t)n + 1);
        if (!buf) return cli_fail("doctor", "out of memory");
        ckptio_describe_system(dir, buf, (size_t)n + 1);
    }
    fputs(buf, stdout);
    if (buf != small) free(buf);
    struct stat st;
    if (dir && stat(dir, &st) < 0) return cli_fail("doctor", "%s: %s", dir, strerror(errno));
    if (dir && !S_ISDIR(st.st_mode)) return cli_fail("doctor", "%s: not a directory", dir);
    return fflush(stdout) == 0 ? CLI_OK : CLI_FAIL;
}
