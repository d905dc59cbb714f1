/* SPDX-License-Identifier: Apache-2.0 */
/* Tests of the `ckptio` command: exit codes, inspect, verify, doctor, bench output and convert. */
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

#ifndef CKPTIO_EXE
#error "tests/meson.build defines CKPTIO_EXE, the path of the ckptio command"
#endif

/* Run `ckptio ARGS` with stdout to out.txt and stderr to err.txt (or both to out.txt when
 * `merge`); returns the exit status and leaves the captured text in *out (malloc'd). */
static int cli(char **out, int merge, const char *args)
{
    int st = merge ? t_sh("'%s' %s > out.txt 2>&1", CKPTIO_EXE, args)
                   : t_sh("'%s' %s > out.txt 2> err.txt", CKPTIO_EXE, args);
    unsigned char *text = NULL;
    long n = t_read_file("out.txt", &text);
    if (n < 0) return -1;
    char *s = realloc(text, (size_t)n + 1);
    if (!s) return -1;
    s[n] = 0;
    free(*out);
    *out = s;
    /* Echo to the test log, so a failing check shows what the command said. */
    fprintf(stderr, "$ ckptio %s -> %d\n%s\n", args, st, s);
    return st;
}

static int have_python(void)
{
    return t_sh("command -v python3 > /dev/null 2>&1") == 0;
}

/* layer.weight f32 [64,256] (64 KiB), layer.bias bf16 [256], emb f32 [8,16] in two chunks,
 * step i64 0-d; metadata step="1000", blob=3 binary bytes, quote needs JSON escapes. */
static int make_ckpt(const char *path)
{
    const size_t wbytes = 64 * 256 * 4;
    float *wt = t_alloc(wbytes);
    uint16_t bias[256];
    float emb[8 * 16];
    int64_t step = 1000;
    CHECK(wt);
    t_fill(wt, wbytes, 1);
    t_fill(bias, sizeof bias, 2);
    t_fill(emb, sizeof emb, 3);
    ckptio_writer *w = NULL;
    CHECK_OK(ckptio_writer_open(&w, path, NULL));
    uint64_t ws[2] = {64, 256}, bs[1] = {256}, es[2] = {8, 16}, half[2] = {4, 16};
    uint64_t top[2] = {0, 0}, bottom[2] = {4, 0};
    CHECK_OK(ckptio_writer_add(w, "layer.weight", CKPTIO_DT_F32, 2, ws, NULL, NULL, wt, wbytes));
    CHECK_OK(
        ckptio_writer_add(w, "layer.bias", CKPTIO_DT_BF16, 1, bs, NULL, NULL, bias, sizeof bias));
    CHECK_OK(ckptio_writer_add(w, "emb", CKPTIO_DT_F32, 2, es, top, half, emb, sizeof emb / 2));
    CHECK_OK(
        ckptio_writer_add(w, "emb", CKPTIO_DT_F32, 2, es, bottom, half, emb + 64, sizeof emb / 2));
    CHECK_OK(ckptio_writer_add(w, "step", CKPTIO_DT_I64, 0, NULL, NULL, NULL, &step, 8));
    CHECK_OK(ckptio_writer_set_meta(w, "step", "1000", 4));
    CHECK_OK(ckptio_writer_set_meta(w, "blob", "\x00\x01\x02", 3));
    CHECK_OK(ckptio_writer_set_meta(w, "quote", "a\"b\nc", 5));
    CHECK_OK(ckptio_writer_commit(w));
    ckptio_writer_close(w);
    t_free(wt, wbytes);
    return 0;
}

static int test_cli_usage(void)
{
    char *o = NULL;
    CHECK(cli(&o, 1, "") == 2 && t_contains(o, "usage"));
    CHECK(cli(&o, 1, "frobnicate") == 2 && t_contains(o, "usage") && t_contains(o, "frobnicate"));
    CHECK(cli(&o, 1, "--frob") == 2 && t_contains(o, "usage"));
    CHECK(cli(&o, 1, "inspect --bogus .") == 2 && t_contains(o, "--bogus"));
    CHECK(cli(&o, 1, "inspect") == 2 && t_contains(o, "usage"));
    CHECK(cli(&o, 1, "verify a b") == 2);
    CHECK(cli(&o, 1, "doctor --nope") == 2);
    CHECK(cli(&o, 1, "bench --frob") == 2 && t_contains(o, "usage"));
    CHECK(cli(&o, 1, "bench --size lots") == 2);
    CHECK(cli(&o, 1, "bench --runs 0") == 2);
    CHECK(cli(&o, 1, "bench --dir") == 2);
    CHECK(cli(&o, 0, "--version") == 0 && t_contains(o, ckptio_version_string()));
    CHECK(cli(&o, 0, "help") == 0 && t_contains(o, "inspect") && t_contains(o, "bench"));
    free(o);
    return 0;
}

static int test_cli_inspect(void)
{
    if (make_ckpt("ck")) return 1;
    char *o = NULL;
    CHECK(cli(&o, 0, "inspect ck") == 0);
    CHECK(t_contains(o, "layer.weight") && t_contains(o, "layer.bias") && t_contains(o, "emb"));
    CHECK(t_contains(o, "bf16") && t_contains(o, "i64") && t_contains(o, "[64, 256]"));
    CHECK(t_contains(o, "65536"));               /* stored bytes of layer.weight */
    CHECK(t_contains(o, "4 tensors, 5 chunks")); /* emb is two chunks */
    CHECK(t_contains(o, "step = 1000") && t_contains(o, "blob = <3 bytes>"));
    CHECK(t_contains(o, "quote = a\"b\\nc"));
    free(o);
    return 0;
}

static int test_cli_inspect_json(void)
{
    if (make_ckpt("ck")) return 1;
    char *o = NULL;
    CHECK(cli(&o, 0, "inspect --json ck") == 0);
    size_t n = strlen(o);
    CHECK(n > 2 && o[0] == '{' && o[n - 1] == '\n' && o[n - 2] == '}');
    CHECK(t_contains(o, "\"name\": \"layer.weight\", \"dtype\": \"f32\", \"shape\": [64, 256]"));
    CHECK(t_contains(o, "\"name\": \"step\", \"dtype\": \"i64\", \"shape\": []"));
    CHECK(t_contains(o, "\"num_tensors\": 4") && t_contains(o, "\"num_chunks\": 5"));
    CHECK(t_contains(o, "\"stored_bytes\": 65536"));
    CHECK(t_contains(o, "{\"key\": \"quote\", \"bytes\": 5, \"value\": \"a\\\"b\\nc\"}"));
    CHECK(t_contains(o, "{\"key\": \"blob\", \"bytes\": 3, \"value\": null}"));
    CHECK(t_contains(o, "{\"key\": \"step\", \"bytes\": 4, \"value\": \"1000\"}"));
    if (have_python())
        CHECK(t_sh("python3 -c 'import json; d = json.load(open(\"out.txt\")); "
                   "assert d[\"num_tensors\"] == 4 and len(d[\"tensors\"]) == 4; "
                   "e = [t for t in d[\"tensors\"] if t[\"name\"] == \"emb\"][0]; "
                   "assert e[\"num_chunks\"] == 2 and len(e[\"chunks\"]) == 2; "
                   "assert {m[\"key\"]: m[\"value\"] for m in d[\"metadata\"]}[\"quote\"] == "
                   "\"a\\\"b\\nc\"'") == 0);
    free(o);
    return 0;
}

static int test_cli_verify(void)
{
    if (make_ckpt("ck")) return 1;
    char *o = NULL;
    CHECK(cli(&o, 0, "verify ck") == 0 && t_contains(o, "OK") && t_contains(o, "GB/s"));
    free(o);
    return 0;
}

/* Flip one byte inside layer.weight's stored bytes: verify must fail and name file and tensor. */
static int test_cli_verify_corrupt(void)
{
    if (make_ckpt("ck")) return 1;
    ckptio_reader *r = NULL;
    CHECK_OK(ckptio_reader_open(&r, "ck", NULL));
    int64_t ti = ckptio_reader_find(r, "layer.weight");
    CHECK_OK(ti);
    ckptio_chunk_info ci;
    CHECK_OK(ckptio_reader_chunk(r, (size_t)ti, 0, &ci));
    char file[4096], base[4096];
    snprintf(file, sizeof file, "ck/%s", ci.file);
    const char *slash = strrchr(ci.file, '/');
    snprintf(base, sizeof base, "%s", slash ? slash + 1 : ci.file);
    uint64_t off = ci.file_offset + 1000;
    CHECK(ci.stored_bytes > 1000);
    ckptio_reader_close(r);

    int fd = open(file, O_RDWR);
    CHECK(fd >= 0);
    unsigned char byte;
    CHECK(pread(fd, &byte, 1, (off_t)off) == 1);
    byte ^= 0x40;
    CHECK(pwrite(fd, &byte, 1, (off_t)off) == 1);
    CHECK(fsync(fd) == 0);
    close(fd);
    char *o = NULL;
    CHECK(cli(&o, 1, "verify ck") == 1);
    CHECK(t_contains(o, base) && t_contains(o, "layer.weight"));
    CHECK(t_contains(o, "1 of 5 chunks damaged"));
    free(o);
    return 0;
}

static int test_cli_not_checkpoint(void)
{
    CHECK(mkdir("half", 0755) == 0 && mkdir("half/data", 0755) == 0);
    CHECK(t_write_file("half/data/000000.ckd", "xxxx", 4) == 0);
    char *o = NULL;
    CHECK(cli(&o, 1, "verify half") == 1 && t_contains(o, "not a committed checkpoint"));
    CHECK(cli(&o, 1, "inspect half") == 1 && t_contains(o, "not a committed checkpoint"));
    CHECK(cli(&o, 1, "verify missing-dir") == 1 && t_contains(o, "missing-dir"));
    free(o);
    return 0;
}

static int test_cli_doctor(void)
{
    char *o = NULL;
    CHECK(cli(&o, 0, "doctor .") == 0);
    CHECK(t_contains(o, "io_uring") && t_contains(o, "O_DIRECT") && t_contains(o, "alignment"));
    CHECK(t_contains(o, ckptio_version_string()) && t_contains(o, "free space"));
    CHECK(cli(&o, 1, "doctor no-such-dir") == 1);
    free(o);
    /* The scratch file doctor writes to probe O_DIRECT must be gone. */
    CHECK(t_sh("ls -A | grep -q ckptio-doctor") != 0);
    return 0;
}

/* Run `ckptio ARGS...` with io_uring_setup refused by a seccomp filter (as some containers
 * do) and CKPTIO_IO=io_uring; stdout and stderr go to out.txt. Returns the exit status, or
 * T_SKIP where the filter cannot be installed. */
static int run_without_uring(char *const argv[])
{
#ifdef __NR_io_uring_setup
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        struct sock_filter f[] = {
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        };
        struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ||
            prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) < 0)
            _exit(T_SKIP);
        int fd = open("out.txt", O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0) _exit(126);
        dup2(fd, 1);
        dup2(fd, 2);
        setenv("CKPTIO_IO", "io_uring", 1);
        execv(CKPTIO_EXE, argv);
        _exit(127);
    }
    int st;
    if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st)) return -1;
    return WEXITSTATUS(st);
#else
    (void)argv;
    return T_SKIP;
#endif
}

/* Where io_uring is refused, CKPTIO_IO=io_uring makes every read fail (no fallback), and
 * doctor says so instead of claiming that it forces io_uring. */
static int test_cli_doctor_no_uring(void)
{
    CHECK(make_ckpt("ck") == 0);
    char *const doctor[] = {"ckptio", "doctor", ".", NULL};
    int st = run_without_uring(doctor);
    if (st == T_SKIP) {
        printf("no seccomp filter here: skipped\n");
        return T_SKIP;
    }
    unsigned char *text = NULL;
    long n = t_read_file("out.txt", &text);
    CHECK(n >= 0);
    char *o = realloc(text, (size_t)n + 1);
    CHECK(o);
    o[n] = 0;
    fprintf(stderr, "doctor without io_uring -> %d\n%s\n", st, o);
    CHECK(st == 0);
    CHECK(t_contains(o, "io_uring: unavailable"));
    CHECK(!t_contains(o, "forces the io_uring backend"));
    CHECK(t_contains(o, "CKPTIO_IO=io_uring") && t_contains(o, "will fail"));
    CHECK(!t_contains(o, "zstd") && !t_contains(o, "MPI"));
    free(o);
    /* what doctor claims: a read under the same conditions fails */
    char *const verify[] = {"ckptio", "verify", "ck", NULL};
    st = run_without_uring(verify);
    text = NULL;
    n = t_read_file("out.txt", &text);
    CHECK(n >= 0);
    fprintf(stderr, "verify without io_uring -> %d\n%.*s\n", st, (int)n, (char *)text);
    CHECK(st == 1);
    free(text);
    return 0;
}

static int test_cli_describe_system(void)
{
    char big[16384], small[16];
    int n = ckptio_describe_system(t_dir(), big, sizeof big);
    CHECK(n > 0 && (size_t)n < sizeof big && strlen(big) == (size_t)n);
    memset(small, 'x', sizeof small);
    int m = ckptio_describe_system(t_dir(), small, sizeof small);
    CHECK(m >= n - 64 && m > (int)sizeof small); /* free space may change the text slightly */
    CHECK(strlen(small) == sizeof small - 1 && !strncmp(small, big, sizeof small - 1));
    CHECK(ckptio_describe_system(NULL, NULL, 0) > 0);
    return 0;
}

static int test_cli_bench(void)
{
    char *o = NULL;
    int st = cli(&o, 0, "bench --size 64M --runs 1 --json --dir bd");
    unsigned char *err = NULL;
    long nerr = t_read_file("err.txt", &err);
    if (nerr > 0) fprintf(stderr, "stderr:\n%.*s\n", (int)nerr, (const char *)err);
    CHECK(st == 0);
    /* stderr is not a terminal here, so no progress line may appear. */
    CHECK(nerr == 0 || (!memchr(err, '\r', (size_t)nerr) && !memchr(err, '\033', (size_t)nerr)));
    free(err);
    size_t n = strlen(o);
    CHECK(n > 2 && o[0] == '{' && o[n - 1] == '\n' && o[n - 2] == '}');
    CHECK(strchr(o + 1, '{') == NULL); /* exactly one flat object */
    static const char *const keys[] = {
        "raw_write_gbps", "raw_read_gbps", "save_gbps",         "load_gbps",        "save_fraction",
        "load_fraction",  "bytes",         "tensors",           "backend",          "direct",
        "peak_extra_mib", "tiny_tensors",  "tiny_save_seconds", "tiny_load_seconds",
        "warm_load_gbps", "warm_verify_gbps_1", "warm_verify_gbps_n", "verify_threads"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        char k[64];
        snprintf(k, sizeof k, "\"%s\": ", keys[i]);
        if (!t_contains(o, k)) fprintf(stderr, "missing key %s\n", keys[i]);
        CHECK(t_contains(o, k));
    }
    CHECK(t_contains(o, "\"tiny_tensors\": 100000"));
    if (have_python())
        CHECK(t_sh("python3 -c 'import json; d = json.load(open(\"out.txt\")); "
                   "assert abs(d[\"bytes\"] - 64 * 2**20) < 2**20, d[\"bytes\"]; "
                   "assert d[\"tensors\"] > 1000 and d[\"save_gbps\"] > 0 and "
                   "d[\"load_gbps\"] > 0 and d[\"raw_write_gbps\"] > 0; "
                   "assert abs(d[\"save_fraction\"] - d[\"save_gbps\"] / "
                   "d[\"raw_write_gbps\"]) < 1e-3'") == 0);
    struct stat sb;
    CHECK(stat("bd", &sb) < 0); /* cleaned up without --keep */
    free(o);
    return 0;
}

/* `bench --merge`: the coordinator's merge at a small scale, every chunk in the result. */
static int test_cli_bench_merge(void)
{
    char *o = NULL;
    CHECK(cli(&o, 0, "bench --merge --parts 50 --tensors 200 --shards 5") == 0);
    CHECK(t_contains(o, "\"parts\": 50, \"tensors\": 200, \"chunks\": 1000, \"files\": 50"));
    CHECK(t_contains(o, "\"merge_s\": ") && t_contains(o, "\"peak_rss_mib\": "));
    free(o);
    o = NULL;
    CHECK(cli(&o, 0, "bench --merge --parts 2 --shards 3") == 2);
    free(o);
    return 0;
}

/* Every tensor of checkpoints a and b holds the same dtype, shape and bytes. */
static int same_ckpt(const char *a, const char *b)
{
    ckptio_reader *ra = NULL, *rb = NULL;
    CHECK_OK(ckptio_reader_open(&ra, a, NULL));
    CHECK_OK(ckptio_reader_open(&rb, b, NULL));
    CHECK(ckptio_reader_num_tensors(ra) == ckptio_reader_num_tensors(rb));
    for (size_t i = 0; i < ckptio_reader_num_tensors(ra); i++) {
        ckptio_tensor_info ta = {.size = sizeof ta}, tb = {.size = sizeof tb};
        CHECK_OK(ckptio_reader_tensor(ra, i, &ta));
        CHECK_OK(ckptio_reader_tensor(rb, i, &tb));
        CHECK(!strcmp(ta.name, tb.name) && ta.dtype == tb.dtype && ta.ndim == tb.ndim);
        CHECK(!memcmp(ta.shape, tb.shape, ta.ndim * sizeof *ta.shape) && ta.nbytes == tb.nbytes);
        unsigned char *x = malloc(ta.nbytes + 1), *y = malloc(ta.nbytes + 1);
        CHECK(x && y);
        CHECK_OK(ckptio_reader_read_tensor(ra, ta.name, x, ta.nbytes));
        CHECK_OK(ckptio_reader_read_tensor(rb, tb.name, y, tb.nbytes));
        CHECK(!memcmp(x, y, ta.nbytes));
        free(x), free(y);
    }
    ckptio_reader_close(ra);
    ckptio_reader_close(rb);
    return 0;
}

/* ckptio -> safetensors -> ckptio and ckptio -> 3 shards (the 64 KiB tensor alone) -> ckptio,
 * tensors split into pieces by a 4 KiB buffer; text metadata survives, binary metadata is
 * named and left out. */
static int test_cli_convert(void)
{
    if (make_ckpt("ck")) return 1;
    char *o = NULL;
    CHECK(setenv("CKPTIO_CONVERT_BUFFER", "4096", 1) == 0);
    CHECK(cli(&o, 0, "convert ck m.safetensors") == 0);
    CHECK(cli(&o, 0, "convert m.safetensors ck2") == 0);
    CHECK(same_ckpt("ck", "ck2") == 0);
    ckptio_reader *r = NULL;
    const void *v;
    size_t len;
    CHECK_OK(ckptio_reader_open(&r, "ck2", NULL));
    CHECK(ckptio_reader_get_meta(r, "step", &v, &len) == 0 && len == 4 && !memcmp(v, "1000", 4));
    CHECK(ckptio_reader_get_meta(r, "blob", &v, &len) == CKPTIO_E_NOT_FOUND);
    ckptio_reader_close(r);
    CHECK(cli(&o, 0, "convert ck hf --max-shard-size 40K") == 0);
    CHECK(access("hf/model-00001-of-00003.safetensors", F_OK) == 0);
    CHECK(access("hf/model-00003-of-00003.safetensors", F_OK) == 0);
    CHECK(access("hf/model.safetensors.index.json", F_OK) == 0);
    CHECK(cli(&o, 0, "convert hf ck3") == 0);
    CHECK(same_ckpt("ck", "ck3") == 0);
    CHECK(cli(&o, 0, "convert hf/model.safetensors.index.json one.safetensors") == 0);
    CHECK(cli(&o, 0, "convert one.safetensors ck4") == 0);
    CHECK(same_ckpt("ck", "ck4") == 0);
    /* An existing destination only with --overwrite. */
    CHECK(cli(&o, 1, "convert ck m.safetensors") == 1 && t_contains(o, "--overwrite"));
    CHECK(cli(&o, 1, "convert ck hf --max-shard-size 40K") == 1 && t_contains(o, "--overwrite"));
    CHECK(cli(&o, 0, "convert ck hf --max-shard-size 40K --overwrite") == 0);
    /* "hf2/" is the directory hf2, built beside it, not inside. */
    CHECK(cli(&o, 0, "convert ck hf2/ --max-shard-size 40K") == 0);
    CHECK(t_sh("test \"$(ls -A hf2 | wc -l)\" = 4") == 0);
    /* safetensors -> torch is Python's (running the same engine): without one, the message
     * says what to install, and nothing is left. */
    CHECK(setenv("CKPTIO_PYTHON", "/nonexistent/python", 1) == 0);
    CHECK(cli(&o, 1, "convert m.safetensors x.pt") == 1 && t_contains(o, "pip install"));
    CHECK(t_contains(o, "nothing was written at x.pt"));
    CHECK(t_sh("test -z \"$(ls -A | grep x.pt)\"") == 0);
    CHECK(unsetenv("CKPTIO_PYTHON") == 0);
    CHECK(unsetenv("CKPTIO_CONVERT_BUFFER") == 0);
    free(o);
    return 0;
}

/* A damaged ckptio source fails the conversion with the checksum error, and nothing is left
 * at the destination (file or directory). */
static int test_cli_convert_corrupt(void)
{
    if (make_ckpt("ck")) return 1;
    int fd = open("ck/data/000000.ckd", O_RDWR);
    CHECK(fd >= 0);
    unsigned char byte;
    CHECK(pread(fd, &byte, 1, 100) == 1);
    byte ^= 0x01;
    CHECK(pwrite(fd, &byte, 1, 100) == 1);
    close(fd);
    char *o = NULL;
    CHECK(cli(&o, 1, "convert ck m.safetensors") == 1 && t_contains(o, "checksum"));
    CHECK(t_contains(o, "nothing was written at m.safetensors"));
    CHECK(cli(&o, 1, "convert ck hf --max-shard-size 20K") == 1 && t_contains(o, "checksum"));
    CHECK(cli(&o, 1, "convert ck ck2") == 1 && t_contains(o, "checksum"));
    CHECK(t_sh("test -z \"$(ls | grep -v -e '^ck$' -e '^out.txt$')\"") == 0);
    /* torch and DCP need Python: without one, say what to install. */
    CHECK(setenv("CKPTIO_PYTHON", "/nonexistent/python", 1) == 0);
    CHECK(cli(&o, 1, "convert ck x.pt") == 1 && t_contains(o, "pip install"));
    CHECK(unsetenv("CKPTIO_PYTHON") == 0);
    free(o);
    return 0;
}

const ckptio_test tests_cli[] = {
    {"cli_usage", test_cli_usage, 0, 0},
    {"cli_inspect", test_cli_inspect, 0, 0},
    {"cli_inspect_json", test_cli_inspect_json, 0, 0},
    {"cli_verify", test_cli_verify, T_PER_BACKEND, 0},
    {"cli_verify_corrupt", test_cli_verify_corrupt, T_PER_BACKEND, 0},
    {"cli_not_checkpoint", test_cli_not_checkpoint, 0, 0},
    {"cli_doctor", test_cli_doctor, 0, 0},
    {"cli_doctor_no_uring", test_cli_doctor_no_uring, 0, 0},
    {"cli_describe_system", test_cli_describe_system, 0, 0},
    {"cli_bench", test_cli_bench, 0, 600},
    {"cli_bench_merge", test_cli_bench_merge, 0, 120},
    {"cli_convert", test_cli_convert, 0, 0},
    {"cli_convert_corrupt", test_cli_convert_corrupt, 0, 0},
    {0, 0, 0, 0},
};
