/* SPDX-License-Identifier: Apache-2.0 */
/* The live progress line of long `ckptio` subcommands, drawn by a background thread. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    bool started, active, quit, shown;
    char label[160];
    uint64_t done, total;
    double t0;
} prog = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void progress_draw_locked(void)
{
    double dt = cli_now() - prog.t0;
    if (!prog.active || dt < 1.0) return;
    char line[256];
    int n = snprintf(line, sizeof line, "\r\033[K%s", prog.label);
    if (prog.total && n > 0 && (size_t)n < sizeof line) {
        char a[32], b[32];
        cli_human(a, sizeof a, (double)prog.done);
        cli_human(b, sizeof b, (double)prog.total);
        n += snprintf(line + n, sizeof line - (size_t)n, "  %s / %s (%.0f%%)", a, b,
                      100.0 * (double)prog.done / (double)prog.total);
    }
    if (n > 0 && (size_t)n < sizeof line)
        snprintf(line + n, sizeof line - (size_t)n, "  %.1f s", dt);
    fputs(line, stderr);
    fflush(stderr);
    prog.shown = true;
}

static void *progress_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&prog.mu);
    while (!prog.quit) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 250 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&prog.cv, &prog.mu, &ts);
        if (!prog.quit) progress_draw_locked();
    }
    pthread_mutex_unlock(&prog.mu);
    return NULL;
}

static void progress_stop_thread(void)
{
    pthread_mutex_lock(&prog.mu);
    prog.quit = true;
    pthread_cond_signal(&prog.cv);
    pthread_mutex_unlock(&prog.mu);
    pthread_join(prog.thread, NULL);
}

void cli_progress_begin(uint64_t total, const char *fmt, ...)
{
    /* Only a person watching a terminal wants a live line; logs and pipes get none. */
    if (!isatty(STDERR_FILENO)) return;
    pthread_mutex_lock(&prog.mu);
    if (!prog.started) {
        if (pthread_create(&prog.thread, NULL, progress_main, NULL) == 0) {
            prog.started = true;
            atexit(progress_stop_thread);
        }
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prog.label, sizeof prog.label, fmt, ap);
    va_end(ap);
    prog.total = total;
    prog.done = 0;
    prog.t0 = cli_now();
    prog.active = true;
    pthread_mutex_unlock(&prog.mu);
}

void cli_progress_set(uint64_t done)
{
    pthread_mutex_lock(&prog.mu);
    prog.done = done;
    pthread_mutex_unlock(&prog.mu);
}

void cli_progress_end(void)
{
    pthread_mutex_lock(&prog.mu);
    prog.active = false;
    if (prog.shown) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
        prog.shown = false;
    }
    pthread_mutex_unlock(&prog.mu);
}
