/* SPDX-License-Identifier: Apache-2.0 */
/* The I/O engine: large positioned reads and writes, many in flight, over one backend. */
#ifndef CKPTIO_ENGINE_H
#define CKPTIO_ENGINE_H

#include "../common/common.h"

/* A request is owned by the caller from submit until it comes back from reap: the caller keeps
 * it (and its buffer) alive and untouched in between. The engine finishes a request only when
 * all `len` bytes moved, or on error (res = -errno), or, for reads, at end of file (res = the
 * bytes read, < len). Short transfers and EINTR/EAGAIN are retried inside the engine. */
enum { CKPTIO__OP_READ = 0, CKPTIO__OP_WRITE = 1 };

typedef struct ckptio__req {
    int fd;
    int op;       /* CKPTIO__OP_* */
    void *buf;    /* for O_DIRECT: aligned to the file's memory alignment */
    uint64_t off; /* for O_DIRECT: aligned to the file's offset alignment */
    uint64_t len; /* for O_DIRECT: a multiple of the offset alignment */
    int64_t res;  /* set at completion */
    void *user;   /* free for the caller */
    uint64_t user_u64;
    /* engine-private */
    uint64_t done_;
    struct ckptio__req *next_;
} ckptio__req;

/* A FIFO of requests threaded through next_, for the backends' queues. */
typedef struct ckptio__req_list {
    ckptio__req *head, *tail;
} ckptio__req_list;

static inline void ckptio__list_push(ckptio__req_list *l, ckptio__req *r)
{
    r->next_ = NULL;
    if (l->tail) l->tail->next_ = r;
    else l->head = r;
    l->tail = r;
}

static inline ckptio__req *ckptio__list_pop(ckptio__req_list *l)
{
    ckptio__req *r = l->head;
    if (r) {
        l->head = r->next_;
        if (!l->head) l->tail = NULL;
        r->next_ = NULL;
    }
    return r;
}

/* Backends. Each one is a table of functions (like SQLite's io_methods) so tests can wrap one
 * to inject faults. */
typedef struct ckptio__engine ckptio__engine;
typedef struct ckptio__backend_ops {
    const char *name; /* "io_uring", "psync" */
    int (*init)(ckptio__engine *e);
    int (*submit)(ckptio__engine *e, ckptio__req *r);
    /* Block until at least `min` (0: none, just collect) requests finished; store up to `max`
     * of them in out[]; return how many or -errno. */
    int (*reap)(ckptio__engine *e, ckptio__req **out, unsigned max, unsigned min);
    void (*fini)(ckptio__engine *e);
} ckptio__backend_ops;

struct ckptio__engine {
    const ckptio__backend_ops *ops;
    unsigned depth;    /* most requests in flight */
    unsigned threads;  /* psync pool size */
    unsigned inflight; /* maintained by ckptio__engine_submit/reap */
    double timeout;    /* seconds a request may stall (ckptio__io_timeout), set before init */
    void *impl;        /* backend state */
};

/* Choose and start a backend. `backend` is CKPTIO_BACKEND_*, after the CKPTIO_IO override has
 * been applied by the caller (ckptio__backend_from_env). AUTO tries io_uring and falls back to
 * psync when the kernel refuses it (ENOSYS, EPERM, ENOMEM from a locked-memory limit...).
 * BUFFERED starts the psync pool: the difference is only in how files are opened.
 * Asking for IO_URING where it is unavailable fails with CKPTIO_E_UNSUPPORTED. */
CKPTIO__HIDDEN int ckptio__engine_open(ckptio__engine **out, int backend, unsigned depth,
                                       unsigned threads);
CKPTIO__HIDDEN void ckptio__engine_close(ckptio__engine *e); /* waits for in-flight requests */
CKPTIO__HIDDEN const char *ckptio__engine_name(const ckptio__engine *e);
/* Submit; fails with -EBUSY if `depth` requests are already in flight. */
CKPTIO__HIDDEN int ckptio__engine_submit(ckptio__engine *e, ckptio__req *r);
CKPTIO__HIDDEN int ckptio__engine_reap(ckptio__engine *e, ckptio__req **out, unsigned max,
                                       unsigned min);

/* Consecutive failed reaps after which a caller stops waiting for its requests and shuts the
 * engine down (ckptio__engine_close returns once the backend is gone): a reap fails only
 * when the backend itself is broken, and waiting on it forever would hang the caller. */
#define CKPTIO__REAP_TRIES 8u

/* Seconds an io_uring engine waits without any request making progress before reap fails with
 * -ETIMEDOUT: CKPTIO_IO_TIMEOUT from the environment (seconds, > 0), else the default. */
#define CKPTIO__IO_TIMEOUT_S 120.0
CKPTIO__HIDDEN double ckptio__io_timeout(void);
/* Appended to the message of a wait that timed out. */
#define CKPTIO__IO_TIMEOUT_HINT                                                              \
    ": the kernel finished none of the requests in flight within CKPTIO_IO_TIMEOUT seconds "  \
    "(default 120); the device or file system is not answering: check it (dmesg), or raise "   \
    "CKPTIO_IO_TIMEOUT for a slow one"

/* Tests only: when set, each engine runs the table hook(real) returns in place of the backend
 * `real` it picked, so that a test can make submit or reap fail. The wrapper keeps `real`
 * and calls it; the engine's impl is the real backend's. Set before any I/O starts. */
typedef const ckptio__backend_ops *(*ckptio__backend_hook)(const ckptio__backend_ops *real);
CKPTIO__HIDDEN extern ckptio__backend_hook ckptio__backend_wrap;

/* CKPTIO_IO=io_uring|psync|buffered from the environment overrides `requested`; returns the
 * backend to use, or CKPTIO_E_USAGE for an unknown value. */
CKPTIO__HIDDEN int ckptio__backend_from_env(int requested);
/* Whether io_uring can be set up here (probed once, cached). */
CKPTIO__HIDDEN bool ckptio__io_uring_available(void);

extern const ckptio__backend_ops ckptio__io_uring_ops; /* absent when built without liburing */
extern const ckptio__backend_ops ckptio__psync_ops;

/* ---- files ---- */

enum {
    CKPTIO__F_READ = 1,
    CKPTIO__F_WRITE = 2,  /* create exclusively (O_CREAT|O_EXCL), write only, mode 0644 */
    CKPTIO__F_WRITE_USER = 4, /* the same, mode 0666 less the umask: a file the user names,
                               * created as open(2) in torch.save would create it */
};

/* Open `name` relative to directory fd `dirfd`. want_direct is CKPTIO_AUTO / ON / OFF: with
 * AUTO, O_DIRECT is tried and dropped where the file system refuses it (tmpfs: EINVAL);
 * with ON such a refusal fails. For reads the name must stay beneath dirfd: no absolute path,
 * no "..", no symlink leaving the directory (openat2 RESOLVE_BENEATH where available).
 * *direct_out tells whether O_DIRECT is in effect. */
CKPTIO__HIDDEN int ckptio__file_open(int dirfd, const char *name, int flags, int want_direct,
                                     int *fd_out, int *direct_out);
/* Direct-I/O alignment of an open file: statx's STATX_DIOALIGN where the kernel reports it,
 * else 4096 for both; values below 512 are raised to 512, results are powers of two. */
CKPTIO__HIDDEN void ckptio__file_dio_align(int fd, uint32_t *mem_align, uint32_t *off_align);
/* fsync that retries EINTR. */
CKPTIO__HIDDEN int ckptio__fsync(int fd);
/* Open a directory (O_DIRECTORY|O_RDONLY) and fsync it. */
CKPTIO__HIDDEN int ckptio__fsync_path(const char *dir);

/* ---- staging pool ---- */

/* A fixed set of equal, page-aligned buffers allocated once at creation; nothing grows. */
typedef struct ckptio__pool {
    uint8_t *base;
    size_t buf_size;
    unsigned count;
    unsigned nfree;
    unsigned *free_list;
} ckptio__pool;
CKPTIO__HIDDEN int ckptio__pool_init(ckptio__pool *p, unsigned count, size_t buf_size);
CKPTIO__HIDDEN void ckptio__pool_fini(ckptio__pool *p);
/* NULL when all buffers are out. */
CKPTIO__HIDDEN void *ckptio__pool_get(ckptio__pool *p);
CKPTIO__HIDDEN void ckptio__pool_put(ckptio__pool *p, void *buf);

#endif
