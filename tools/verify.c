/* SPDX-License-Identifier: Apache-2.0 */
/* `ckptio verify`: read every stored byte of a checkpoint and check every checksum. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "ckptio.h"
#include "cli.h"
#include "commands.h"

/* `--roots A,B,...`: where a striped checkpoint's stripes are now. Takes the option out of argv
 * (so the rest parses as before) and splits its value in place; 0, or a usage error. */
static int take_roots(int *argc, char **argv, const char **roots, size_t cap, size_t *n)
{
    *n = 0;
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        char *v = NULL;
        if (!strcmp(argv[i], "--roots")) {
            if (i + 1 == *argc) return cli_usage_error("verify: --roots needs a value");
            v = argv[++i];
        } else if (!strncmp(argv[i], "--roots=", 8)) {
            v = argv[i] + 8;
        } else if (!strcmp(argv[i], "--")) {
            while (i < *argc) argv[out++] = argv[i++];
            break;
        } else {
            argv[out++] = argv[i];
            continue;
        }
        for (char *save = NULL, *tok = strtok_r(v, ",", &save); tok;
             tok = strtok_r(NULL, ",", &save)) {
            if (*n == cap) return cli_usage_error("verify: more than %zu roots", cap);
            roots[(*n)++] = tok;
        }
    }
    *argc = out;
    return -1;
}

/* Stripe directories of `dir` that a save left behind (it died, or an overwrite was cut short):
 * named, since they hold space; nothing is removed. */
static void report_leftovers(const char *dir, const char *const *roots, size_t n)
{
    uint64_t found = 0;
    if (ckptio_stripe_leftovers(dir, roots, n, 0, &found) < 0 || !found) return;
    printf("note: %" PRIu64 " stripe director%s of %s in its roots belong%s to no checkpoint (a "
           "save to it that did not finish); the next save to %s removes them\n",
           found, found == 1 ? "y" : "ies", dir, found == 1 ? "s" : "", dir);
}

int cmd_verify(int argc, char **argv)
{
    const char *dir = NULL, *roots[256];
    ckptio_store_opts *store = NULL;
    size_t n_roots = 0;
    int done = take_roots(&argc, argv, roots, 256, &n_roots);
    if (done >= 0) return done;
    done = cli_one_dir_arg(argc, argv, "verify", &dir, &store);
    if (done < 0 && !dir) done = cli_usage_error("verify: which checkpoint? (ckptio verify DIR)");
    if (done >= 0) {
        ckptio_store_opts_free(store);
        return done;
    }
    double t0 = cli_now();
    ckptio_reader *r = cli_open_reader("verify", dir, store);
    ckptio_store_opts_free(store); /* read while the reader opened */
    if (!r) {
        if (n_roots) report_leftovers(dir, roots, n_roots);
        fflush(stdout);
        return CLI_FAIL;
    }
    if (n_roots && ckptio_reader_set_roots(r, roots, n_roots) < 0) {
        printf("FAILED %s\n", ckptio_reader_errmsg(r));
        ckptio_reader_close(r);
        return CLI_FAIL;
    }
    size_t nt = ckptio_reader_num_tensors(r);
    uint64_t stored = 0, chunks = 0;
    for (size_t i = 0; i < nt; i++) {
        ckptio_tensor_info ti = {.size = sizeof ti};
        if (ckptio_reader_tensor(r, i, &ti) >= 0)
            stored += ti.stored_bytes, chunks += ti.num_chunks;
    }
    /* One library call does the work, so the progress line can only show that time passes. */
    cli_progress_begin(0, "verifying %s (%" PRIu64 " stored bytes)", dir, stored);
    uint64_t bad = 0;
    int rc = ckptio_reader_verify(r, &bad);
    cli_progress_end();
    double dt = cli_now() - t0;
    if (rc < 0) {
        const char *msg = ckptio_reader_errmsg(r);
        printf("FAILED %s\n", *msg ? msg : ckptio_strerror(rc));
        if (bad)
            printf("%s: %" PRIu64 " of %" PRIu64 " chunks damaged; the first is named above. "
                   "Restore the checkpoint from another copy or save it again.\n",
                   dir, bad, chunks);
        else
            printf("%s: could not read the checkpoint to the end (%s).\n", dir, ckptio_errname(rc));
        ckptio_reader_close(r);
        report_leftovers(dir, roots, n_roots);
        fflush(stdout);
        return CLI_FAIL;
    }
    char hb[32];
    cli_human(hb, sizeof hb, (double)stored);
    printf("OK %s: %zu tensors, %" PRIu64 " chunks, %" PRIu64 " bytes (%s) read and checked in "
           "%.3f s, %.2f GB/s\n",
           dir, nt, chunks, stored, hb, dt, dt > 0 ? (double)stored / dt / 1e9 : 0.0);
    ckptio_reader_close(r);
    report_leftovers(dir, roots, n_roots);
    return fflush(stdout) == 0 ? CLI_OK : CLI_FAIL;
}
