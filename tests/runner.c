/* SPDX-License-Identifier: Apache-2.0 */
/* Test runner: forks each test with a timeout in a fresh directory; one crash fails one test. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

static const ckptio_test *const groups[] = {
#define TEST_GROUP(g) tests_##g,
#ifdef CKPTIO_TEST_LIST /* a private list, to build a subset while developing */
#include CKPTIO_TEST_LIST
#else
#include "list.h"
#endif
#undef TEST_GROUP
};

static const char *const backends[] = {"io_uring", "psync", "buffered"};
static char dir_buf[4096];
static const char *cur_backend = "auto";

const char *t_dir(void)
{
    return dir_buf;
}

const char *t_path(const char *name)
{
    static char bufs[8][4096];
    static unsigned k;
    char *b = bufs[k++ % 8];
    if (snprintf(b, 4096, "%s/%s", dir_buf, name) >= 4096) b[0] = 0;
    return b;
}

void t_fill(void *buf, size_t len, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    unsigned char *p = buf;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    for (; i < len; i++) p[i] = (unsigned char)(x >> (8 * (i & 7)));
}

void *t_alloc(size_t len)
{
    void *p = mmap(NULL, len ? len : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void t_free(void *p, size_t len)
{
    if (p) munmap(p, len ? len : 1);
}

const char *t_backend(void)
{
    return cur_backend;
}

int t_contains(const char *h, const char *n)
{
    return h && n && strstr(h, n) != NULL;
}

long t_read_file(const char *path, unsigned char **out)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(n > 0 ? (size_t)n : 1);
    if (!b || fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        fclose(f);
        return -1;
    }
    fclose(f);
    *out = b;
    return n;
}

int t_write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(data, 1, len, f) == len;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

int t_reap(int pid, int seconds)
{
    int st = 0;
    for (int i = 0; i < seconds * 100; i++) {
        if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

int t_sh(const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    fflush(NULL);
    int st = system(cmd);
    if (st == -1 || !WIFEXITED(st)) return -1;
    return WEXITSTATUS(st);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int matches(const char *name, int argc, char **argv)
{
    if (argc <= 1) return 1;
    for (int i = 1; i < argc; i++)
        if (strstr(name, argv[i])) return 1;
    return 0;
}

/* Run one test in a child; returns 0 pass, 77 skip, 1 fail. */
static int run_one(const ckptio_test *t, const char *backend, const char *base, const char *label)
{
    if (snprintf(dir_buf, sizeof dir_buf, "%s/%s", base, label) >= (int)sizeof dir_buf) return 1;
    for (char *p = dir_buf + strlen(base) + 1; *p; p++)
        if (*p == '/' || *p == '[' || *p == ']') *p = '_';
    char log[4200];
    snprintf(log, sizeof log, "%s.log", dir_buf);
    if (mkdir(dir_buf, 0700) < 0) {
        fprintf(stderr, "cannot create %s: %s\n", dir_buf, strerror(errno));
        return 1;
    }
    unsigned timeout = t->timeout ? t->timeout : 60;
    fflush(NULL);
    double t0 = now();
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        if (chdir(dir_buf) < 0) _exit(1);
        if (backend) setenv("CKPTIO_IO", backend, 1);
        else unsetenv("CKPTIO_IO");
        cur_backend = backend ? backend : "auto";
        alarm(timeout);
        int rc = t->fn();
        fflush(NULL);
        _exit(rc);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    double dt = now() - t0;
    int rc;
    const char *why = "";
    if (WIFEXITED(st)) rc = WEXITSTATUS(st) == 0 ? 0 : WEXITSTATUS(st) == T_SKIP ? T_SKIP : 1;
    else {
        rc = 1;
        why = WTERMSIG(st) == SIGALRM ? " (timed out)" : " (crashed)";
    }
    printf("%-4s %s%s  %.2fs\n", rc == 0 ? "ok" : rc == T_SKIP ? "skip" : "FAIL", label, why, dt);
    if (rc != 0) {
        FILE *f = fopen(log, "r");
        if (f) {
            char line[1024];
            int lines = 0;
            while (fgets(line, sizeof line, f) && lines++ < 60) printf("    | %s", line);
            fclose(f);
        }
        if (WIFSIGNALED(st)) printf("    | signal %d\n", WTERMSIG(st));
    }
    fflush(stdout);
    char cmd[8400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir_buf, log);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir_buf);
    return rc;
}

int main(int argc, char **argv)
{
    /* No test asks a cloud's instance metadata service (169.254.169.254): tests that want one
     * start a stand-in and point AWS_EC2_METADATA_SERVICE_ENDPOINT (or GCE_METADATA_HOST, with
     * NO_GCE_CHECK unset) at it. */
    setenv("AWS_EC2_METADATA_DISABLED", "true", 0);
    setenv("NO_GCE_CHECK", "true", 0);
    const char *tmp = getenv("CKPTIO_TEST_TMP");
    if (!tmp) tmp = getenv("TMPDIR");
    if (!tmp) tmp = "/var/tmp";
    char base[4096];
    snprintf(base, sizeof base, "%s/ckptio-tests.%d", tmp, (int)getpid());
    if (mkdir(base, 0700) < 0) {
        fprintf(stderr, "cannot create %s: %s\n", base, strerror(errno));
        return 2;
    }
    if (argc > 1 && !strcmp(argv[1], "--list")) {
        for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++)
            for (const ckptio_test *t = groups[g]; t->name; t++) printf("%s\n", t->name);
        rmdir(base);
        return 0;
    }
    unsigned passed = 0, failed = 0, skipped = 0;
    double t0 = now();
    for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
        for (const ckptio_test *t = groups[g]; t->name; t++) {
            size_t nb = (t->flags & T_PER_BACKEND) ? 3 : 1;
            for (size_t b = 0; b < nb; b++) {
                char label[512];
                const char *be = (t->flags & T_PER_BACKEND) ? backends[b] : NULL;
                if (be) snprintf(label, sizeof label, "%s[%s]", t->name, be);
                else snprintf(label, sizeof label, "%s", t->name);
                if (!matches(label, argc, argv)) continue;
                int rc = run_one(t, be, base, label);
                if (rc == 0) passed++;
                else if (rc == T_SKIP) skipped++;
                else failed++;
            }
        }
    }
    rmdir(base);
    printf("\nC tests: %.1fs\n", now() - t0);
    printf("%u passed, %u failed, %u skipped\n", passed, failed, skipped);
    return failed ? 1 : (passed ? 0 : 1);
}
