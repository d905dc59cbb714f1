/* SPDX-License-Identifier: Apache-2.0 */
/* `ckptio convert`: copy tensors between ckptio, safetensors (single or Hugging Face sharded),
 * torch and DCP, streaming through bounded memory; torch and DCP are handed to Python. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckptio.h"
#include "cli.h"
#include "commands.h"

enum fmt { F_NONE, F_CKPTIO, F_ST, F_HF, F_TORCH, F_DCP };
static const char *const fmt_names[] = {"?", "ckptio", "safetensors", "hf", "torch", "dcp"};

/* Bytes of tensor data in flight between source and destination: pieces of large tensors and
 * batches of small ones go through one buffer of this size, so memory stays bounded whatever
 * the model's size. The reader and writers get smaller staging pools than their defaults for
 * the same reason. */
#define ARENA_DEFAULT (32ull << 20)
#define STAGING_BYTES (16ull << 20)
/* CKPTIO_CONVERT_BUFFER (bytes, at least 4096) sets the buffer: tests split small tensors. */
static uint64_t arena_bytes = ARENA_DEFAULT;

/* One tensor to copy: where it comes from and where it goes. */
typedef struct item {
    const char *name;
    int dtype;
    uint32_t ndim;
    uint64_t shape[CKPTIO_MAX_NDIM];
    uint64_t nbytes;
    size_t src_index; /* reader tensor index, or index into the source's st files */
    uint64_t src_off; /* absolute file offset of a safetensors source tensor */
    uint32_t shard;   /* destination safetensors file */
} item;

typedef struct conv {
    const char *src, *dst;
    enum fmt from, to;
    bool overwrite;
    uint64_t max_shard;
    ckptio_params p;
    /* source */
    ckptio_reader *reader;
    char **st_paths;   /* safetensors source files */
    ckptio_st_header **st_hdrs;
    size_t n_st;
    item *items;
    size_t n_items;
    /* destination */
    ckptio_writer *writer;
    ckptio_file_writer *fw;
    uint32_t n_shards, cur_shard;
    char *tmpdir;      /* hf destination: directory built here, renamed to dst at the end */
    uint64_t total, done;
    char err[1024];
} conv;

static int failf(conv *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int failf(conv *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    return -1;
}

static bool ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static char *path_join(const char *dir, const char *name)
{
    char *s = NULL;
    if (asprintf(&s, "%s/%s", dir, name) < 0) return NULL;
    return s;
}

static bool exists_in(const char *dir, const char *name)
{
    char *p = path_join(dir, name);
    bool ok = p && access(p, F_OK) == 0;
    free(p);
    return ok;
}

/* The `<prefix>.safetensors.index.json` in dir (malloc'ed name), or NULL. */
static char *find_index(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return NULL;
    char *found = NULL;
    struct dirent *e;
    while ((e = readdir(d)))
        if (ends_with(e->d_name, ".safetensors.index.json") && e->d_name[0] != '.') {
            free(found);
            found = strdup(e->d_name);
            if (!strcmp(e->d_name, "model.safetensors.index.json")) break;
        }
    closedir(d);
    return found;
}

static enum fmt parse_fmt(const char *s)
{
    for (int f = F_CKPTIO; f <= F_DCP; f++)
        if (!strcmp(s, fmt_names[f])) return (enum fmt)f;
    if (!strcmp(s, "st")) return F_ST;
    if (!strcmp(s, "pt") || !strcmp(s, "pytorch")) return F_TORCH;
    return F_NONE;
}

static enum fmt detect_src(const char *path, char *why, size_t n)
{
    struct stat st;
    if (stat(path, &st) < 0) {
        snprintf(why, n, "%s: %s", path, strerror(errno));
        return F_NONE;
    }
    if (S_ISDIR(st.st_mode)) {
        if (exists_in(path, "manifest")) return F_CKPTIO;
        if (exists_in(path, ".metadata")) return F_DCP;
        char *idx = find_index(path);
        if (idx) return free(idx), F_HF;
        snprintf(why, n,
                 "%s: a directory without a ckptio manifest, a DCP .metadata or a "
                 "*.safetensors.index.json; pass --from",
                 path);
        return F_NONE;
    }
    if (ends_with(path, ".safetensors.index.json")) return F_HF;
    unsigned char head[9] = {0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t got = fd >= 0 ? pread(fd, head, sizeof head, 0) : -1;
    if (fd >= 0) close(fd);
    if (got >= 4 && !memcmp(head, "PK\x03\x04", 4)) return F_TORCH;
    if (got == 9 && head[8] == '{') return F_ST;
    if (ends_with(path, ".safetensors")) return F_ST;
    if (ends_with(path, ".pt") || ends_with(path, ".pth") || ends_with(path, ".bin") ||
        ends_with(path, ".ckpt"))
        return F_TORCH;
    snprintf(why, n, "%s: cannot tell the format from its name or first bytes; pass --from", path);
    return F_NONE;
}

static enum fmt detect_dst(const char *path, bool sharded)
{
    if (ends_with(path, ".safetensors")) return F_ST;
    if (ends_with(path, ".pt") || ends_with(path, ".pth") || ends_with(path, ".bin") ||
        ends_with(path, ".ckpt"))
        return F_TORCH;
    if (ends_with(path, ".dcp") || ends_with(path, ".dcp/")) return F_DCP;
    if (sharded) return F_HF;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        if (exists_in(path, ".metadata")) return F_DCP;
        char *idx = find_index(path);
        if (idx) return free(idx), F_HF;
    }
    return F_CKPTIO;
}

/* ---- sources -------------------------------------------------------------------------------- */

static int open_ckptio_src(conv *c)
{
    int rc = ckptio_reader_open(&c->reader, c->src, &c->p);
    if (rc < 0) return failf(c, "%s", ckptio_last_error());
    c->n_items = ckptio_reader_num_tensors(c->reader);
    c->items = calloc(c->n_items ? c->n_items : 1, sizeof *c->items);
    if (!c->items) return failf(c, "out of memory");
    for (size_t i = 0; i < c->n_items; i++) {
        ckptio_tensor_info ti = {.size = sizeof ti};
        if (ckptio_reader_tensor(c->reader, i, &ti) < 0)
            return failf(c, "%s", ckptio_reader_errmsg(c->reader));
        item *it = &c->items[i];
        it->name = ti.name, it->dtype = ti.dtype, it->ndim = ti.ndim, it->nbytes = ti.nbytes;
        memcpy(it->shape, ti.shape, ti.ndim * sizeof *ti.shape);
        it->src_index = i;
    }
    return 0;
}

static int read_st_header(conv *c, const char *path, ckptio_st_header **out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return failf(c, "%s: %s", path, strerror(errno));
    struct stat st;
    uint8_t len8[8];
    uint8_t *hdr = NULL;
    int ret = -1;
    if (fstat(fd, &st) < 0 || pread(fd, len8, 8, 0) != 8) {
        failf(c, "%s: not a safetensors file (shorter than 8 bytes)", path);
        goto out;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
    if (n > CKPTIO_ST_MAX_HEADER || n > (uint64_t)st.st_size - 8) {
        failf(c, "%s: not a safetensors file (header length %" PRIu64 " of a %lld-byte file)",
              path, n, (long long)st.st_size);
        goto out;
    }
    hdr = malloc(n ? n : 1);
    if (!hdr) {
        failf(c, "%s: out of memory for a %" PRIu64 "-byte header", path, n);
        goto out;
    }
    for (uint64_t got = 0; got < n;) {
        ssize_t k = pread(fd, hdr + got, n - got, (off_t)(8 + got));
        if (k <= 0) {
            failf(c, "%s: reading the header: %s", path, k < 0 ? strerror(errno) : "short file");
            goto out;
        }
        got += (uint64_t)k;
    }
    char why[512];
    if (ckptio_st_parse(hdr, n, (uint64_t)st.st_size, out, why, sizeof why) < 0) {
        failf(c, "%s: %s", path, why);
        goto out;
    }
    ret = 0;
out:
    free(hdr);
    close(fd);
    return ret;
}

/* The shard files of a Hugging Face checkpoint: `<prefix>-NNNNN-of-MMMMM.safetensors` next to
 * `<prefix>.safetensors.index.json`, every one of 1..M present (the index's weight map names
 * no other files in checkpoints that transformers and huggingface_hub write). */
static int list_hf_shards(conv *c)
{
    char *dir = NULL, *index = NULL;
    struct stat st;
    if (stat(c->src, &st) == 0 && S_ISDIR(st.st_mode)) {
        dir = strdup(c->src);
        index = find_index(c->src);
    } else {
        const char *slash = strrchr(c->src, '/');
        dir = slash ? strndup(c->src, (size_t)(slash - c->src)) : strdup(".");
        index = strdup(slash ? slash + 1 : c->src);
    }
    if (!dir || !index) {
        free(dir), free(index);
        return failf(c, "%s: no *.safetensors.index.json found", c->src);
    }
    size_t plen = strlen(index) - strlen(".safetensors.index.json");
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%.*s", (int)plen, index);
    DIR *d = opendir(dir);
    unsigned total = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        unsigned a, b;
        int used = 0;
        if (!strncmp(e->d_name, prefix, plen) &&
            sscanf(e->d_name + plen, "-%5u-of-%5u.safetensors%n", &a, &b, &used) == 2 &&
            e->d_name[plen + (size_t)used] == 0 && a >= 1 && a <= b)
            total = total ? total : b;
    }
    if (d) closedir(d);
    int ret = 0;
    if (!total) {
        ret = failf(c, "%s/%s: no shard file %s-NNNNN-of-MMMMM.safetensors beside it", dir, index,
                    prefix);
        goto out;
    }
    c->st_paths = calloc(total, sizeof *c->st_paths);
    if (!c->st_paths) {
        ret = failf(c, "out of memory");
        goto out;
    }
    for (unsigned i = 1; i <= total; i++) {
        if (asprintf(&c->st_paths[c->n_st], "%s/%s-%05u-of-%05u.safetensors", dir, prefix, i,
                     total) < 0) {
            ret = failf(c, "out of memory");
            goto out;
        }
        c->n_st++;
        if (access(c->st_paths[i - 1], R_OK) < 0) {
            ret = failf(c, "%s: %s (shard %u of %u is missing)", c->st_paths[i - 1],
                        strerror(errno), i, total);
            goto out;
        }
    }
out:
    free(dir);
    free(index);
    return ret;
}

static int open_st_src(conv *c)
{
    if (c->from == F_HF) {
        if (list_hf_shards(c) < 0) return -1;
    } else {
        c->st_paths = calloc(1, sizeof *c->st_paths);
        if (!c->st_paths || !(c->st_paths[0] = strdup(c->src))) return failf(c, "out of memory");
        c->n_st = 1;
    }
    c->st_hdrs = calloc(c->n_st, sizeof *c->st_hdrs);
    if (!c->st_hdrs) return failf(c, "out of memory");
    size_t n = 0;
    for (size_t f = 0; f < c->n_st; f++) {
        if (read_st_header(c, c->st_paths[f], &c->st_hdrs[f]) < 0) return -1;
        n += c->st_hdrs[f]->n_tensors;
    }
    c->items = calloc(n ? n : 1, sizeof *c->items);
    if (!c->items) return failf(c, "out of memory");
    for (size_t f = 0; f < c->n_st; f++) {
        const ckptio_st_header *h = c->st_hdrs[f];
        for (uint64_t i = 0; i < h->n_tensors; i++) {
            const ckptio_st_tensor *t = &h->tensors[i];
            item *it = &c->items[c->n_items++];
            it->name = h->strtab + t->name;
            if (!t->dtype)
                return failf(c,
                             "%s: tensor '%s' has dtype %s, which ckptio has no code for; it "
                             "cannot be converted",
                             c->st_paths[f], it->name, ckptio_st_dtype_name((int)t->st_dtype));
            it->dtype = t->dtype, it->ndim = t->ndim, it->nbytes = t->end - t->begin;
            memcpy(it->shape, h->dims + t->dims, t->ndim * sizeof *it->shape);
            it->src_index = f;
            it->src_off = h->data_start + t->begin;
        }
    }
    return 0;
}

/* ---- pieces: boxes of a tensor that are contiguous in row-major order and fit the arena ---- */

typedef struct piece {
    size_t item;
    uint64_t off[CKPTIO_MAX_NDIM], box[CKPTIO_MAX_NDIM];
    uint64_t first;  /* byte offset of the piece inside the tensor */
    uint64_t nbytes;
    uint64_t at;     /* where it lies in the arena */
} piece;

/* The piece of `it` that starts at byte `pos` (a multiple of what earlier pieces took) and
 * holds at most `cap` bytes: a run of whole rows of the largest trailing block that fits. */
static void next_piece(const item *it, uint64_t pos, uint64_t cap, piece *pc)
{
    uint64_t es = ckptio_dtype_size(it->dtype);
    pc->first = pos;
    if (it->nbytes <= cap || it->ndim == 0) {
        for (uint32_t d = 0; d < it->ndim; d++)
            pc->off[d] = 0, pc->box[d] = it->shape[d];
        pc->nbytes = it->nbytes;
        return;
    }
    uint32_t k = 0;
    uint64_t inner = it->nbytes / es; /* elements below dimension k, for k = -1 */
    for (k = 0; k < it->ndim; k++) {
        inner /= it->shape[k];
        if (inner * es <= cap) break;
    }
    uint64_t elem = pos / es, row = inner * es;
    /* Dimensions above k index one row; dimension k takes as many as fit. */
    uint64_t idx = elem / inner;
    for (int d = (int)k; d >= 0; d--) {
        pc->off[d] = idx % it->shape[d];
        idx /= it->shape[d];
        pc->box[d] = 1;
    }
    uint64_t room = it->shape[k] - pc->off[k], fit = cap / row;
    pc->box[k] = fit < room ? fit : room;
    for (uint32_t d = k + 1; d < it->ndim; d++)
        pc->off[d] = 0, pc->box[d] = it->shape[d];
    pc->nbytes = pc->box[k] * row;
}

/* ---- destinations ---------------------------------------------------------------------------- */

static const char *shard_name(conv *c, uint32_t s, char *buf, size_t n)
{
    snprintf(buf, n, "model-%05u-of-%05u.safetensors", s + 1, c->n_shards);
    return buf;
}

/* Map the items to shards in their order, each shard as large as --max-shard-size allows (a
 * tensor larger than that gets a shard of its own); a single file is one shard. */
static void plan_shards(conv *c)
{
    uint64_t in = 0;
    uint32_t s = 0;
    bool any = false;
    for (size_t i = 0; i < c->n_items; i++) {
        item *it = &c->items[i];
        if (c->to == F_HF && c->max_shard && any && in + it->nbytes > c->max_shard) s++, in = 0;
        it->shard = s;
        in += it->nbytes;
        any = true;
    }
    c->n_shards = s + 1;
}

static int st_dtype_of(int dt)
{
    for (int s = 1; s < CKPTIO_ST_COUNT; s++)
        if (ckptio_st_dtype_ckptio(s) == dt) return s;
    return 0;
}

/* The items of shard s are items[a, b): put those whose sizes are multiples of the alignment
 * first (stable), so each starts aligned and can be read with O_DIRECT. */
static void order_shard(conv *c, size_t a, size_t b)
{
    size_t n = b - a, k = 0;
    item *tmp = malloc((n ? n : 1) * sizeof *tmp);
    if (!tmp) return; /* the order is an optimization only */
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = a; i < b; i++)
            if ((c->items[i].nbytes % 4096 == 0) == (pass == 0)) tmp[k++] = c->items[i];
    memcpy(c->items + a, tmp, n * sizeof *tmp);
    free(tmp);
}

/* Open the safetensors file of shard s and write its header. */
static int open_shard(conv *c, uint32_t s, size_t a, size_t b)
{
    ckptio_st_header h = {.size = sizeof h};
    uint64_t strlen_ = 1, ndims = 0;
    size_t nmeta = 0;
    bool has_format = false;
    for (size_t i = a; i < b; i++)
        strlen_ += strlen(c->items[i].name) + 1, ndims += c->items[i].ndim;
    size_t nm = c->reader && c->to == F_ST ? ckptio_reader_num_meta(c->reader) : 0;
    for (size_t i = 0; i < nm; i++) {
        const char *key;
        const void *val;
        size_t len;
        if (ckptio_reader_meta(c->reader, i, &key, &val, &len) == 0 && cli_is_text(val, len))
            strlen_ += strlen(key) + len + 2;
    }
    if (c->n_st == 1 && c->to == F_ST) {
        const ckptio_st_header *sh = c->st_hdrs[0];
        for (uint64_t i = 0; i < sh->n_meta; i++)
            strlen_ += sh->meta[i].key_len + sh->meta[i].val_len + 2;
        nm = sh->n_meta;
    }
    strlen_ += sizeof "format" + sizeof "pt";
    h.tensors = calloc(b - a + 1, sizeof *h.tensors);
    h.meta = calloc(nm + 1, sizeof *h.meta);
    h.dims = calloc(ndims + 1, sizeof *h.dims);
    h.strtab = malloc(strlen_);
    int ret = -1;
    uint8_t *enc = NULL;
    if (!h.tensors || !h.meta || !h.dims || !h.strtab) {
        failf(c, "out of memory");
        goto out;
    }
    uint64_t sp = 0;
#define PUTSTR(s, n) (memcpy(h.strtab + sp, (s), (n)), h.strtab[sp + (n)] = 0, sp += (n) + 1, sp - (n) - 1)
    if (c->reader && c->to == F_ST) {
        for (size_t i = 0; i < nm; i++) {
            const char *key;
            const void *val;
            size_t len;
            if (ckptio_reader_meta(c->reader, i, &key, &val, &len) < 0) continue;
            if (!cli_is_text(val, len)) {
                fprintf(stderr, "ckptio convert: metadata '%s' is binary (%zu bytes): safetensors "
                        "metadata holds text only, so it is left out\n", key, len);
                continue;
            }
            ckptio_st_meta *m = &h.meta[nmeta++];
            m->key_len = (uint32_t)strlen(key);
            m->key = PUTSTR(key, m->key_len);
            m->val_len = len;
            m->val = PUTSTR(val, len);
            has_format |= !strcmp(key, "format");
        }
    } else if (c->n_st == 1 && c->to == F_ST) {
        const ckptio_st_header *sh = c->st_hdrs[0];
        for (uint64_t i = 0; i < sh->n_meta; i++) {
            ckptio_st_meta *m = &h.meta[nmeta++];
            m->key_len = sh->meta[i].key_len;
            m->key = PUTSTR(sh->strtab + sh->meta[i].key, m->key_len);
            m->val_len = sh->meta[i].val_len;
            m->val = PUTSTR(sh->strtab + sh->meta[i].val, m->val_len);
            has_format |= !strcmp(sh->strtab + sh->meta[i].key, "format");
        }
    }
    if (!has_format) {
        /* transformers refuses safetensors files whose metadata lacks "format". */
        ckptio_st_meta *m = &h.meta[nmeta++];
        m->key_len = 6, m->key = PUTSTR("format", 6);
        m->val_len = 2, m->val = PUTSTR("pt", 2);
    }
    h.n_meta = nmeta;
    uint64_t data = 0, dp = 0;
    for (size_t i = a; i < b; i++) {
        const item *it = &c->items[i];
        ckptio_st_tensor *t = &h.tensors[h.n_tensors++];
        t->st_dtype = (uint32_t)st_dtype_of(it->dtype);
        if (!t->st_dtype) {
            failf(c, "%s: tensor '%s' has dtype %s, which safetensors cannot hold", c->src,
                  it->name, ckptio_dtype_name(it->dtype) ? ckptio_dtype_name(it->dtype) : "?");
            goto out;
        }
        t->dtype = it->dtype;
        t->name_len = (uint32_t)strlen(it->name);
        t->name = PUTSTR(it->name, t->name_len);
        t->ndim = it->ndim;
        t->dims = dp;
        memcpy(h.dims + dp, it->shape, it->ndim * sizeof *it->shape);
        dp += it->ndim;
        t->begin = data;
        data += it->nbytes;
        t->end = data;
    }
#undef PUTSTR
    h.n_dims = dp;
    h.strtab_len = sp;
    uint64_t len = 0;
    char why[512];
    if (ckptio_st_encode(&h, 4096, &enc, &len, why, sizeof why) < 0) {
        failf(c, "%s: %s", c->dst, why);
        goto out;
    }
    char name[64], *path = NULL;
    if (c->to == F_HF)
        path = path_join(c->tmpdir, shard_name(c, s, name, sizeof name));
    else
        path = strdup(c->dst);
    if (!path) {
        failf(c, "out of memory");
        goto out;
    }
    int rc = ckptio_file_writer_open(&c->fw, path, &c->p);
    if (rc < 0) {
        failf(c, "%s", ckptio_last_error());
        free(path);
        goto out;
    }
    free(path);
    if (ckptio_file_writer_write(c->fw, enc, (size_t)len) < 0) {
        failf(c, "%s", ckptio_file_writer_errmsg(c->fw));
        goto out;
    }
    ret = 0;
out:
    free(enc);
    free(h.tensors);
    free(h.meta);
    free(h.dims);
    free(h.strtab);
    return ret;
}

static int close_shard(conv *c)
{
    if (!c->fw) return 0;
    int rc = ckptio_file_writer_commit(c->fw);
    if (rc < 0 && rc != CKPTIO_E_NOT_DURABLE) {
        failf(c, "%s", ckptio_file_writer_errmsg(c->fw));
        return -1;
    }
    ckptio_file_writer_close(c->fw);
    c->fw = NULL;
    return 0;
}

/* ---- the copy -------------------------------------------------------------------------------- */

/* Read the batch of pieces into the arena (one call per source file, so reads of many small
 * tensors are planned together). */
static int read_batch(conv *c, uint8_t *arena, piece *pcs, size_t n)
{
    if (c->reader) {
        ckptio_region *rg = calloc(n, sizeof *rg);
        if (!rg) return failf(c, "out of memory");
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            const item *it = &c->items[pcs[i].item];
            if (!pcs[i].nbytes) continue;
            rg[k++] = (ckptio_region){.size = sizeof *rg,
                                    .tensor = it->src_index,
                                    .offset = pcs[i].off,
                                    .shape = pcs[i].box,
                                    .dst = arena + pcs[i].at,
                                    .capacity = pcs[i].nbytes};
        }
        int rc = k ? ckptio_reader_read(c->reader, rg, k) : 0;
        free(rg);
        if (rc < 0) return failf(c, "%s", ckptio_reader_errmsg(c->reader));
        return 0;
    }
    ckptio_range *rg = calloc(n, sizeof *rg);
    if (!rg) return failf(c, "out of memory");
    int ret = 0;
    for (size_t i = 0; i < n && !ret;) {
        size_t f = c->items[pcs[i].item].src_index, j = i, k = 0;
        for (; j < n && c->items[pcs[j].item].src_index == f; j++) {
            const item *it = &c->items[pcs[j].item];
            if (!pcs[j].nbytes) continue;
            rg[k++] = (ckptio_range){.size = sizeof *rg,
                                     .offset = it->src_off + pcs[j].first,
                                     .len = pcs[j].nbytes,
                                     .dst = arena + pcs[j].at};
        }
        if (k && ckptio_file_read(c->st_paths[f], rg, k, &c->p, NULL) < 0)
            ret = failf(c, "%s", ckptio_last_error());
        i = j;
    }
    free(rg);
    return ret;
}

static int write_batch(conv *c, const uint8_t *arena, piece *pcs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const item *it = &c->items[pcs[i].item];
        if (c->writer) {
            int rc = ckptio_writer_add(c->writer, it->name, it->dtype, it->ndim, it->shape,
                                       pcs[i].off, pcs[i].box, arena + pcs[i].at, pcs[i].nbytes);
            if (rc < 0) return failf(c, "%s", ckptio_writer_errmsg(c->writer));
            continue;
        }
        if (pcs[i].first == 0 && (it->shard != c->cur_shard || !c->fw)) {
            if (close_shard(c) < 0) return -1;
            size_t a = pcs[i].item, b = a;
            while (b < c->n_items && c->items[b].shard == it->shard)
                b++;
            c->cur_shard = it->shard;
            if (open_shard(c, it->shard, a, b) < 0) return -1;
        }
        if (pcs[i].nbytes && ckptio_file_writer_write(c->fw, arena + pcs[i].at, pcs[i].nbytes) < 0)
            return failf(c, "%s", ckptio_file_writer_errmsg(c->fw));
    }
    /* The writer may still point into the arena; the file writer copied already. */
    if (c->writer && ckptio_writer_flush(c->writer) < 0)
        return failf(c, "%s", ckptio_writer_errmsg(c->writer));
    return 0;
}

static int copy_all(conv *c)
{
    size_t cap_pieces = 4096;
    piece *pcs = malloc(cap_pieces * sizeof *pcs);
    uint8_t *arena = NULL;
    if (!pcs || posix_memalign((void **)&arena, 4096, arena_bytes)) {
        free(pcs);
        return failf(c, "out of memory for the %llu-byte copy buffer", (unsigned long long)arena_bytes);
    }
    int ret = 0;
    size_t n = 0;
    uint64_t used = 0;
    for (size_t i = 0; i <= c->n_items && !ret; i++) {
        uint64_t pos = 0;
        do {
            piece pc = {.item = i};
            bool last = i == c->n_items;
            if (!last) next_piece(&c->items[i], pos, arena_bytes, &pc);
            uint64_t at = (used + 4095) / 4096 * 4096;
            if (last || n == cap_pieces || at + pc.nbytes > arena_bytes) {
                if (n && (read_batch(c, arena, pcs, n) < 0 || write_batch(c, arena, pcs, n) < 0)) {
                    ret = -1;
                    break;
                }
                for (size_t k = 0; k < n; k++)
                    c->done += pcs[k].nbytes;
                cli_progress_set(c->done);
                n = 0, used = 0, at = 0;
                if (last) break;
            }
            pc.at = at;
            used = at + pc.nbytes;
            pcs[n++] = pc;
            pos += pc.nbytes;
        } while (pos < c->items[i].nbytes);
    }
    free(pcs);
    free(arena);
    return ret;
}

/* ---- publishing a Hugging Face directory -------------------------------------------------- */

static void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
                unlinkat(dirfd(d), e->d_name, 0);
        closedir(d);
    }
    rmdir(dir);
}

static int write_index(conv *c)
{
    char *path = path_join(c->tmpdir, "model.safetensors.index.json");
    FILE *f = path ? fopen(path, "w") : NULL;
    if (!f) {
        int e = errno;
        free(path);
        return failf(c, "%s: %s", c->tmpdir, strerror(e));
    }
    uint64_t total = 0;
    for (size_t i = 0; i < c->n_items; i++)
        total += c->items[i].nbytes;
    fprintf(f, "{\n  \"metadata\": {\n    \"total_size\": %" PRIu64 "\n  },\n  \"weight_map\": {",
            total);
    /* Sorted by name, as transformers writes it. */
    size_t *ord = malloc((c->n_items ? c->n_items : 1) * sizeof *ord);
    if (!ord) {
        fclose(f);
        free(path);
        return failf(c, "out of memory");
    }
    for (size_t i = 0; i < c->n_items; i++)
        ord[i] = i;
    for (size_t i = 1; i < c->n_items; i++) /* insertion sort: index files are small */
        for (size_t j = i; j > 0 && strcmp(c->items[ord[j - 1]].name, c->items[ord[j]].name) > 0;
             j--) {
            size_t t = ord[j];
            ord[j] = ord[j - 1], ord[j - 1] = t;
        }
    char name[64];
    for (size_t i = 0; i < c->n_items; i++) {
        const item *it = &c->items[ord[i]];
        fputs(i ? ",\n    " : "\n    ", f);
        cli_json_str(f, it->name, strlen(it->name));
        fprintf(f, ": \"%s\"", shard_name(c, it->shard, name, sizeof name));
    }
    fputs("\n  }\n}\n", f);
    free(ord);
    int bad = ferror(f) | fflush(f) | fsync(fileno(f));
    bad |= fclose(f);
    free(path);
    return bad ? failf(c, "%s: writing the index: %s", c->tmpdir, strerror(errno)) : 0;
}

/* An existing destination directory that --overwrite may replace: empty, or a Hugging Face
 * checkpoint (never an arbitrary directory). */
static bool replaceable_hf(const char *dir)
{
    char *idx = find_index(dir);
    if (idx) return free(idx), true;
    DIR *d = opendir(dir);
    if (!d) return false;
    struct dirent *e;
    bool empty = true;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = false;
    closedir(d);
    return empty;
}

static void fsync_parent(const char *path)
{
    char *copy = strdup(path);
    if (!copy) return;
    char *slash = strrchr(copy, '/');
    const char *dir = slash ? (slash == copy ? "/" : (*slash = 0, copy)) : ".";
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) fsync(fd), close(fd);
    free(copy);
}

static int publish_hf(conv *c)
{
    int fd = open(c->tmpdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) fsync(fd), close(fd);
    if (renameat2(AT_FDCWD, c->tmpdir, AT_FDCWD, c->dst, RENAME_NOREPLACE) == 0) {
        fsync_parent(c->dst);
        return 0;
    }
    if (errno != EEXIST) return failf(c, "%s: publishing: %s", c->dst, strerror(errno));
    if (!c->overwrite)
        return failf(c, "%s already exists; pass --overwrite to replace it", c->dst);
    if (!replaceable_hf(c->dst))
        return failf(c, "%s exists and is not a Hugging Face safetensors directory (nor empty); "
                     "refusing to replace it", c->dst);
    if (renameat2(AT_FDCWD, c->tmpdir, AT_FDCWD, c->dst, RENAME_EXCHANGE) < 0)
        return failf(c, "%s: replacing: %s", c->dst, strerror(errno));
    fsync_parent(c->dst);
    remove_tree(c->tmpdir); /* the old checkpoint, now under the temporary name */
    return 0;
}

/* ---- driver ---------------------------------------------------------------------------------- */

static int convert_native(conv *c)
{
    int ret = -1;
    if ((c->from == F_CKPTIO ? open_ckptio_src(c) : open_st_src(c)) < 0) goto out;
    for (size_t i = 0; i < c->n_items; i++)
        c->total += c->items[i].nbytes;
    struct stat st;
    if (c->to == F_HF || c->to == F_ST) {
        if (stat(c->dst, &st) == 0 && !c->overwrite) {
            failf(c, "%s already exists; pass --overwrite to replace it", c->dst);
            goto out;
        }
        if (c->to == F_ST && stat(c->dst, &st) == 0 && !S_ISREG(st.st_mode)) {
            failf(c, "%s exists and is not a file; refusing to replace it", c->dst);
            goto out;
        }
        if (c->to == F_HF && stat(c->dst, &st) == 0 && (!S_ISDIR(st.st_mode) || !replaceable_hf(c->dst))) {
            failf(c, "%s exists and is not a Hugging Face safetensors directory (nor empty); "
                  "refusing to replace it", c->dst);
            goto out;
        }
        plan_shards(c);
        for (size_t a = 0; a < c->n_items;) {
            size_t b = a;
            while (b < c->n_items && c->items[b].shard == c->items[a].shard)
                b++;
            order_shard(c, a, b);
            a = b;
        }
        if (c->to == F_HF) {
            if (asprintf(&c->tmpdir, "%s.tmp-%d", c->dst, (int)getpid()) < 0) {
                c->tmpdir = NULL;
                failf(c, "out of memory");
                goto out;
            }
            if (mkdir(c->tmpdir, 0777) < 0) {
                failf(c, "%s: %s", c->tmpdir, strerror(errno));
                free(c->tmpdir);
                c->tmpdir = NULL;
                goto out;
            }
        }
    } else {
        int rc = ckptio_writer_open(&c->writer, c->dst, &c->p);
        if (rc < 0) {
            failf(c, "%s", ckptio_last_error());
            if (rc == CKPTIO_E_EXISTS && !c->overwrite)
                snprintf(c->err + strlen(c->err), sizeof c->err - strlen(c->err),
                         " (pass --overwrite to replace it)");
            goto out;
        }
        if (c->reader) {
            size_t nm = ckptio_reader_num_meta(c->reader);
            for (size_t i = 0; i < nm; i++) {
                const char *key;
                const void *val;
                size_t len;
                if (ckptio_reader_meta(c->reader, i, &key, &val, &len) < 0 ||
                    ckptio_writer_set_meta(c->writer, key, val, len) < 0) {
                    failf(c, "%s", ckptio_writer_errmsg(c->writer));
                    goto out;
                }
            }
        } else {
            for (size_t f = 0; f < c->n_st; f++) {
                const ckptio_st_header *h = c->st_hdrs[f];
                for (uint64_t i = 0; i < h->n_meta; i++)
                    if (ckptio_writer_set_meta(c->writer, h->strtab + h->meta[i].key,
                                               h->strtab + h->meta[i].val,
                                               (size_t)h->meta[i].val_len) < 0) {
                        failf(c, "%s", ckptio_writer_errmsg(c->writer));
                        goto out;
                    }
            }
        }
    }
    cli_progress_begin(c->total, "converting %s -> %s", c->src, c->dst);
    if (copy_all(c) < 0) goto out;
    if (c->to == F_ST || c->to == F_HF) {
        /* Every shard gets a file, an empty model one shard with a header only. */
        if (!c->fw && !c->n_items && open_shard(c, 0, 0, 0) < 0) goto out;
        if (close_shard(c) < 0) goto out;
        if (c->to == F_HF && (write_index(c) < 0 || publish_hf(c) < 0)) goto out;
    } else {
        int rc = ckptio_writer_commit(c->writer);
        if (rc < 0 && rc != CKPTIO_E_NOT_DURABLE) {
            failf(c, "%s", ckptio_writer_errmsg(c->writer));
            goto out;
        }
    }
    ret = 0;
out:
    cli_progress_end();
    ckptio_file_writer_close(c->fw);
    ckptio_writer_close(c->writer);
    ckptio_reader_close(c->reader);
    if (c->tmpdir) {
        if (ret < 0 || access(c->tmpdir, F_OK) == 0) remove_tree(c->tmpdir);
        free(c->tmpdir);
    }
    for (size_t f = 0; f < c->n_st; f++) {
        free(c->st_paths[f]);
        if (c->st_hdrs) ckptio_st_free(c->st_hdrs[f]);
    }
    free(c->st_paths);
    free(c->st_hdrs);
    free(c->items);
    return ret;
}

/* torch files and DCP directories are read and written by torch, in Python: run
 * `python -m ckptio._convert` with the formats settled here, in place of this process
 * (`replace`) or as a child waited for. CKPTIO_PYTHON names the interpreter (`python -m ckptio`
 * sets it to itself), else python3 from PATH. Returns an exit status. */
static int run_python(const char *src, const char *dst, enum fmt from, enum fmt to,
                      bool overwrite, bool replace)
{
    const char *py = getenv("CKPTIO_PYTHON");
    if (!py || !*py) py = "python3";
    const char *argv[16];
    int n = 0;
    argv[n++] = py;
    argv[n++] = "-m";
    argv[n++] = "ckptio._convert";
    argv[n++] = "--from";
    argv[n++] = fmt_names[from];
    argv[n++] = "--to";
    argv[n++] = fmt_names[to];
    if (overwrite) argv[n++] = "--overwrite";
    argv[n++] = "--";
    argv[n++] = src;
    argv[n++] = dst;
    argv[n] = NULL;
    fflush(NULL);
    pid_t pid = replace ? 0 : fork();
    if (pid == 0) {
        execvp(py, (char *const *)argv);
        cli_fail("convert",
                 "converting %s -> %s needs Python with ckptio and torch, and '%s' cannot be "
                 "run (%s); set CKPTIO_PYTHON to a Python that has them (pip install ckptio "
                 "torch)",
                 fmt_names[from], fmt_names[to], py, strerror(errno));
        if (!replace) _exit(CLI_FAIL);
        return CLI_FAIL;
    }
    int st;
    if (pid < 0 || waitpid(pid, &st, 0) < 0)
        return cli_fail("convert", "cannot run %s: %s", py, strerror(errno));
    return WIFEXITED(st) ? WEXITSTATUS(st) : CLI_FAIL;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

/* Between safetensors and torch or DCP, two steps through a temporary ckptio checkpoint
 * beside DST (the C side and the Python side each stream): `in` when the source is Python's. */
static int convert_chained(conv *c, bool in)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp-ckptio-%d", c->dst, (int)getpid());
    if (!c->overwrite && access(c->dst, F_OK) == 0)
        return cli_fail("convert", "%s already exists; pass --overwrite to replace it", c->dst);
    const char *dst = c->dst;
    enum fmt to = c->to;
    int ret = CLI_FAIL;
    if (in) {
        if (run_python(c->src, tmp, c->from, F_CKPTIO, false, false) != CLI_OK) goto out;
        c->src = tmp, c->from = F_CKPTIO;
    } else {
        c->dst = tmp, c->to = F_CKPTIO, c->p.overwrite = 0;
    }
    if (convert_native(c) < 0) {
        fprintf(stderr, "ckptio convert: %s\n", c->err);
        goto out;
    }
    ret = in ? CLI_OK : run_python(tmp, dst, F_CKPTIO, to, c->overwrite, false);
out:
    nftw(tmp, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    if (ret != CLI_OK) fprintf(stderr, "ckptio convert: nothing was written at %s\n", dst);
    return ret;
}

static void convert_usage(FILE *f)
{
    fputs("usage: ckptio convert [--from FMT] [--to FMT] [--max-shard-size SIZE] [--overwrite] "
          "SRC DST\n"
          "\n"
          "Copy every tensor of SRC into a new DST of another format, streaming through a\n"
          "bounded buffer. Formats (FMT):\n"
          "  ckptio       a ckptio checkpoint directory (checksums verified as it is read)\n"
          "  safetensors  one .safetensors file\n"
          "  hf           a Hugging Face directory: model-00001-of-0000N.safetensors shards and\n"
          "               model.safetensors.index.json\n"
          "  torch        a torch.save file (.pt/.pth/.bin), read weights-only: no pickled code\n"
          "               runs\n"
          "  dcp          a torch.distributed.checkpoint directory (.metadata, __N_M.distcp)\n"
          "SRC's format is detected from its contents; DST's from its name (.safetensors,\n"
          ".pt/.pth/.bin/.ckpt, .dcp; with --max-shard-size: hf; else ckptio).\n"
          "torch and dcp need Python with ckptio and torch (CKPTIO_PYTHON, else python3);\n"
          "between them and safetensors/hf the data passes through a temporary ckptio\n"
          "checkpoint beside DST.\n"
          "\n"
          "options:\n"
          "  --from FMT, --to FMT    override the detected formats\n"
          "  --max-shard-size SIZE   hf: largest shard (e.g. 5G, 500M; default 5G)\n"
          "  --overwrite             replace an existing DST of the same kind\n"
          "\n"
          "Nothing appears at DST unless the whole conversion succeeds.\n",
          f);
}

int cmd_convert(int argc, char **argv)
{
    conv c = {0};
    const char *pos[2] = {NULL, NULL}, *from = NULL, *to = NULL, *max_shard = NULL;
    int npos = 0;
    bool opts = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_val = i + 1 < argc;
        if (opts && (!strcmp(a, "--help") || !strcmp(a, "-h")))
            return convert_usage(stdout), CLI_OK;
        else if (opts && !strcmp(a, "--"))
            opts = false;
        else if (opts && !strcmp(a, "--overwrite"))
            c.overwrite = true;
        else if (opts && !strcmp(a, "--from") && has_val)
            from = argv[++i];
        else if (opts && !strcmp(a, "--to") && has_val)
            to = argv[++i];
        else if (opts && !strcmp(a, "--max-shard-size") && has_val)
            max_shard = argv[++i];
        else if (opts && a[0] == '-' && a[1])
            return cli_usage_error("convert: unknown option '%s' (or its value is missing)", a);
        else if (npos < 2)
            pos[npos++] = a;
        else
            return cli_usage_error("convert: more than two paths ('%s')", a);
    }
    if (npos < 2) return cli_usage_error("convert: which source and destination? (ckptio convert SRC DST)");
    /* "out/" names the directory out: its temporary sibling must not land inside it. */
    char dst[4096];
    size_t dl = strlen(pos[1]);
    while (dl > 1 && pos[1][dl - 1] == '/')
        dl--;
    if (dl >= sizeof dst) return cli_usage_error("convert: destination path too long");
    memcpy(dst, pos[1], dl);
    dst[dl] = 0;
    c.src = pos[0], c.dst = dst;
    if (max_shard && (cli_parse_size(max_shard, &c.max_shard) < 0 || !c.max_shard))
        return cli_usage_error("convert: --max-shard-size '%s' is not a size (5G, 500M)", max_shard);
    char why[1024];
    if (from && !(c.from = parse_fmt(from)))
        return cli_usage_error("convert: unknown format '%s'", from);
    if (to && !(c.to = parse_fmt(to))) return cli_usage_error("convert: unknown format '%s'", to);
    if (!c.from && !(c.from = detect_src(c.src, why, sizeof why)))
        return cli_fail("convert", "%s", why);
    if (!c.to) c.to = detect_dst(c.dst, max_shard != NULL);
    if (max_shard && c.to != F_HF)
        return cli_usage_error("convert: --max-shard-size applies to hf destinations only");
    if (c.to == F_HF && !c.max_shard) c.max_shard = 5ull << 30;
    bool py_from = c.from == F_TORCH || c.from == F_DCP, py_to = c.to == F_TORCH || c.to == F_DCP;
    bool st_from = c.from == F_ST || c.from == F_HF, st_to = c.to == F_ST || c.to == F_HF;
    if ((py_from || py_to) && !(py_from && st_to) && !(st_from && py_to))
        return run_python(c.src, c.dst, c.from, c.to, c.overwrite, true);
    const char *buf = getenv("CKPTIO_CONVERT_BUFFER");
    uint64_t bb;
    if (buf && cli_parse_size(buf, &bb) == 0 && bb >= 4096) arena_bytes = bb / 4096 * 4096;
    ckptio_params_init(&c.p);
    c.p.staging_bytes = STAGING_BYTES;
    c.p.overwrite = c.overwrite;
    if (py_from || py_to) return convert_chained(&c, py_from);
    double t0 = cli_now();
    if (convert_native(&c) < 0) {
        fprintf(stderr, "ckptio convert: %s\n", c.err);
        fprintf(stderr, "ckptio convert: nothing was written at %s\n", c.dst);
        return CLI_FAIL;
    }
    if (isatty(STDOUT_FILENO)) {
        char hb[32];
        cli_human(hb, sizeof hb, (double)c.total);
        printf("converted %s (%s) -> %s (%s): %zu tensors, %s in %.2f s\n", c.src,
               fmt_names[c.from], c.dst, fmt_names[c.to], c.n_items, hb, cli_now() - t0);
    }
    return fflush(stdout) == 0 ? CLI_OK : CLI_FAIL;
}
