/* SPDX-License-Identifier: Apache-2.0 */
/* ckptio.h — the public interface of libckptio: save and load tensor checkpoints at device speed. */
#ifndef CKPTIO_H
#define CKPTIO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define CKPTIO_API __attribute__((visibility("default")))
#else
#define CKPTIO_API
#endif

/* ------------------------------------------------------------------------------------------ */
/* Versions                                                                                   */
/* ------------------------------------------------------------------------------------------ */

#define CKPTIO_VERSION_MAJOR 0
#define CKPTIO_VERSION_MINOR 1
#define CKPTIO_VERSION_PATCH 0
#define CKPTIO_VERSION_NUMBER \
    (CKPTIO_VERSION_MAJOR * 10000 + CKPTIO_VERSION_MINOR * 100 + CKPTIO_VERSION_PATCH)

/* On-disk format written by this library (doc/format.md). Readers accept versions <= this. */
#define CKPTIO_FORMAT_VERSION 1

/* Library version of the code actually linked (may differ from the header's). Since 0.1. */
CKPTIO_API unsigned ckptio_version_number(void);
CKPTIO_API const char *ckptio_version_string(void);
/* Newest on-disk format version this library writes and reads. Since 0.1. */
CKPTIO_API unsigned ckptio_format_version(void);

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* Every function returning int returns >= 0 on success and a negative code on failure:
 * -errno for system errors (-ENOSPC, -EIO, ...), or one of the CKPTIO_E_* codes below, which
 * sit in a reserved range that no errno reaches. One table generates the enum, the names and
 * ckptio_strerror(). */
#define CKPTIO_ERROR_TABLE(X)                                                                  \
    X(USAGE, -4001, "invalid argument or call")                                                \
    X(STATE, -4002, "handle is not in a state that allows this call")                          \
    X(DTYPE, -4003, "unknown dtype")                                                           \
    X(SHAPE, -4004, "shape, offset or size does not match")                                    \
    X(DUPLICATE, -4005, "duplicate tensor name or overlapping chunk")                          \
    X(INCOMPLETE, -4006, "tensor chunks do not cover the whole tensor")                        \
    X(EXISTS, -4007, "checkpoint already exists")                                              \
    X(NOT_CHECKPOINT, -4008, "not a committed checkpoint (no manifest)")                       \
    X(NOT_FOUND, -4009, "no such tensor or key")                                               \
    X(RANGE, -4010, "region lies outside the tensor")                                          \
    X(BUFFER, -4011, "destination buffer too small")                                           \
    X(FORMAT, -4012, "unsupported format version")                                             \
    X(CORRUPT, -4013, "checkpoint is corrupt")                                                 \
    X(CHECKSUM, -4014, "checksum mismatch: stored bytes are damaged")                          \
    X(LIMIT, -4015, "a size or count exceeds the format's limits")                             \
    X(UNSUPPORTED, -4016, "feature not available in this build or on this system")             \
    X(INTERRUPTED, -4017, "operation was cancelled")                                           \
    X(NOT_DURABLE, -4018, "published, but its directory entry may not be durable")

enum ckptio_error {
#define CKPTIO_X_ENUM(name, value, text) CKPTIO_E_##name = value,
    CKPTIO_ERROR_TABLE(CKPTIO_X_ENUM)
#undef CKPTIO_X_ENUM
};

/* A short static description of any return code (CKPTIO_E_*, -errno, or 0). Never NULL.
 * Thread-safe. Since 0.1. */
CKPTIO_API const char *ckptio_strerror(int code);
/* The code's symbolic name ("CKPTIO_E_CORRUPT", "ENOSPC", "OK"). Never NULL. Since 0.1. */
CKPTIO_API const char *ckptio_errname(int code);
/* The message with context (file, tensor, offset, what to do) of the last failing ckptio call
 * made by the calling thread, or "" if none failed yet. Valid until this thread's next ckptio
 * call. Each handle also keeps its own (ckptio_writer_errmsg, ckptio_reader_errmsg). */
CKPTIO_API const char *ckptio_last_error(void);

/* ------------------------------------------------------------------------------------------ */
/* Dtypes. The numeric values are stored on disk and never change.                           */
/* ------------------------------------------------------------------------------------------ */

#define CKPTIO_DTYPE_TABLE(X)                                                                  \
    X(BOOL, 1, "bool", 1)                                                                      \
    X(U8, 2, "u8", 1)                                                                          \
    X(I8, 3, "i8", 1)                                                                          \
    X(U16, 4, "u16", 2)                                                                        \
    X(I16, 5, "i16", 2)                                                                        \
    X(U32, 6, "u32", 4)                                                                        \
    X(I32, 7, "i32", 4)                                                                        \
    X(U64, 8, "u64", 8)                                                                        \
    X(I64, 9, "i64", 8)                                                                        \
    X(F16, 10, "f16", 2)                                                                       \
    X(BF16, 11, "bf16", 2)                                                                     \
    X(F32, 12, "f32", 4)                                                                       \
    X(F64, 13, "f64", 8)                                                                       \
    X(C64, 14, "c64", 8)                                                                       \
    X(C128, 15, "c128", 16)                                                                    \
    X(F8_E4M3FN, 16, "f8_e4m3fn", 1)                                                           \
    X(F8_E5M2, 17, "f8_e5m2", 1)                                                               \
    X(BYTES, 18, "bytes", 1)

typedef enum ckptio_dtype {
#define CKPTIO_X_ENUM(name, value, text, size) CKPTIO_DT_##name = value,
    CKPTIO_DTYPE_TABLE(CKPTIO_X_ENUM)
#undef CKPTIO_X_ENUM
} ckptio_dtype;

/* Bytes per element of a dtype, or 0 if the dtype is unknown. BYTES is opaque data, 1 byte per
 * element. */
CKPTIO_API size_t ckptio_dtype_size(int dtype);
/* Lower-case name ("bf16"), or NULL if unknown. */
CKPTIO_API const char *ckptio_dtype_name(int dtype);
/* Dtype from its name, or CKPTIO_E_DTYPE. */
CKPTIO_API int ckptio_dtype_from_name(const char *name);

/* ------------------------------------------------------------------------------------------ */
/* Limits of format v1 (checked on save and before any allocation on load)                    */
/* ------------------------------------------------------------------------------------------ */

#define CKPTIO_MAX_NDIM 32               /* dimensions of a tensor */
#define CKPTIO_MAX_NAME 4096             /* bytes of a tensor name or metadata key, no NUL */
#define CKPTIO_MAX_META_VALUE (64u << 20) /* bytes of one metadata value */

/* ------------------------------------------------------------------------------------------ */
/* Parameters                                                                                 */
/* ------------------------------------------------------------------------------------------ */

enum ckptio_backend {
    CKPTIO_BACKEND_AUTO = 0,     /* io_uring if the kernel allows it, else the psync pool */
    CKPTIO_BACKEND_IO_URING = 1, /* io_uring, several large requests in flight */
    CKPTIO_BACKEND_PSYNC = 2,    /* pread/pwrite from a pool of threads */
    CKPTIO_BACKEND_BUFFERED = 3  /* psync pool through the page cache (no O_DIRECT) */
};

enum ckptio_switch { CKPTIO_AUTO = -1, CKPTIO_OFF = 0, CKPTIO_ON = 1 };

/* Options for writers and readers. Always initialize with ckptio_params_init(), then change the
 * fields you care about: new fields are added at the end and `size` tells the library which
 * ones the caller knows, so programs built against an older header keep working.
 * The environment variable CKPTIO_IO=io_uring|psync|buffered overrides `backend` (for tests and
 * for users who need to force a path). */
struct ckptio_store_opts; /* the settings of an object store: below, in the experimental part */
typedef struct ckptio_params {
    uint32_t size;          /* sizeof(ckptio_params), set by ckptio_params_init */
    uint32_t io_threads;    /* psync pool threads; 0 = default (16) */
    uint32_t queue_depth;   /* I/O requests in flight; 0 = default (64) */
    uint32_t reserved0;
    uint64_t staging_bytes; /* staging pool size; 0 = default (64 MiB). Fixed for the handle. */
    uint64_t request_bytes; /* size of one I/O request; 0 = default (8 MiB) */
    int backend;            /* enum ckptio_backend */
    int direct;             /* O_DIRECT: CKPTIO_AUTO (use when the file system allows), ON
                             * (fail with -EINVAL where refused), OFF */
    int fsync;              /* writer: fsync data, manifest and directories (default ON) */
    int checksums;          /* writer: store checksums; reader: verify them (default ON) */
    int overwrite;          /* writer: replace an existing checkpoint at commit (default OFF).
                             * The old one stays loadable until the new one is complete. An
                             * empty directory may be replaced too, also only at commit. */
    int reserved1;
    /* GPU memory (CKPTIO_MEM_CUDA buffers, doc/gpu.md). Since 0.2. */
    int gpu;                    /* enum ckptio_gpu_mode; CKPTIO_GPU=auto|gds|staged|off wins */
    uint32_t reserved2;
    uint64_t gpu_staging_bytes; /* pinned ring for GPU loads (and a writer's GDS checksums,
                                 * replicas); 0 = default (256 MiB). A staged save pins the
                                 * writer's staging (staging_bytes) instead */
    /* Since 0.2, read paths (a caller whose .size stops before these gets the defaults): */
    int cache;               /* reader: enum ckptio_cache; the environment's CKPTIO_CACHE=auto|never|fill
                              * overrides it */
    uint32_t verify_threads; /* reader: threads that verify checksums and copy cached ranges,
                              * the caller's included; 0 = the CPUs this process may use, at
                              * most 8 */
    /* Since 0.3, compression (a caller whose .size stops before it gets the default): */
    int compress;            /* writer: enum ckptio_compress; the environment's
                              * CKPTIO_COMPRESS=none|auto|all overrides it */
    uint32_t reserved3;
    /* writer: NULL, or an older checkpoint to save against (an incremental checkpoint): each
     * coded tensor that the base also holds with the same dtype and shape is stored as its
     * XOR with the base's bytes where that codes smaller (needs compress AUTO or ALL). The
     * checkpoint records the base by its path relative to the new checkpoint and by its
     * manifest's checksum; loading it needs the base there, unchanged (else an error naming
     * it, never other bytes). Since 0.3. */
    const char *base;
    /* Since 0.4: NULL, or the settings of the store a URL path names (ckptio_store_opts:
     * endpoint, region, credentials, CAs), for this handle rather than the process; read while
     * the handle opens. NULL: the environment's (AWS_* variables and files), read then. */
    const struct ckptio_store_opts *store;
} ckptio_params;

/* How a writer stores host tensors (ckptio_params.compress). NONE: every chunk as it is
 * (format 1.0, readable by every ckptio). AUTO: chunks of 64 KiB or more are cut into blocks of
 * the checksum block (1 MiB), each compressed where that saves at least 2 % — float tensors
 * (bf16, f16, f32, f8) by a coder that entropy-codes their exponent field, others by zstd — and
 * while the device waits on the coder, a share of the blocks is stored as it is, so a save is
 * never slower than without compression; ALL: every block is tried (smallest checkpoint, at the
 * coder's speed). A checkpoint with a compressed chunk is format 3.0 (doc/format.md section 11),
 * which ckptio before 0.3 refuses by name; loads decode on the reader's threads and verify the
 * decoded bytes. GPU tensors are stored as they are. Since 0.3. */
enum ckptio_compress { CKPTIO_COMPRESS_NONE = 0, CKPTIO_COMPRESS_AUTO = 1, CKPTIO_COMPRESS_ALL = 2 };

/* How GPU memory moves (ckptio_params.gpu). AUTO: GPUDirect Storage (cuFile) where it works,
 * else the staged path; GDS: the same, asked for by name (data files where cuFile refuses
 * still fall back to staged, saying why in ckptio_gpu_stats); STAGED: device-to-host copies
 * on ckptio's own stream straight into the writer's staging buffers (pinned once), written
 * from there, overlapped with the O_DIRECT writes (reads: through a pinned ring); OFF: GPU buffers are refused (CKPTIO_E_UNSUPPORTED). The CUDA driver
 * (libcuda.so.1) and cuFile (libcufile.so.0) are loaded at run time, at first use: ckptio
 * needs neither to build or to run on hosts without a GPU. Since 0.2. */
enum ckptio_gpu_mode {
    CKPTIO_GPU_AUTO = 0,
    CKPTIO_GPU_GDS = 1,
    CKPTIO_GPU_STAGED = 2,
    CKPTIO_GPU_OFF = 3
};

/* Where a reader takes the bytes of a direct (O_DIRECT) data file from. AUTO: ranges resident
 * in the page cache (a file just copied, read by another program, or loaded before with
 * direct = OFF) are copied from memory through a buffered descriptor; the rest is read from
 * the device with O_DIRECT, which adds nothing to the cache. A ckptio save writes with
 * O_DIRECT too and leaves its files out of the cache, so the first load of a checkpoint
 * ckptio just wrote comes from the device; loading with direct = OFF reads through the cache
 * and leaves the file resident for the next load. NEVER: everything from the device, as
 * before 0.2. Residency is asked of the kernel once per read (cachestat(2), mincore(2) where
 * that is missing); a page evicted in between is still read correctly, from the device.
 * FILL: everything through the page cache: resident ranges are copied, the rest is read
 * with buffered reads that leave the file resident, so the next load of the same checkpoint
 * (a restarting server, a job reloading what it just wrote and loaded) runs at memory speed;
 * it costs a copy per byte and page-cache memory, which is why AUTO does not do it. Since 0.2. */
enum ckptio_cache { CKPTIO_CACHE_AUTO = 0, CKPTIO_CACHE_NEVER = 1, CKPTIO_CACHE_FILL = 2 };

/* Fill `p` with defaults. Since 0.1. */
CKPTIO_API void ckptio_params_init(ckptio_params *p);

/* What an operation did, per handle: bytes moved, wall seconds from open to the last
 * completed call (commit for writers), the backend that ran and whether O_DIRECT was used. */
typedef struct ckptio_stats {
    uint64_t bytes;          /* tensor bytes written or read (not padding) */
    uint64_t io_bytes;       /* bytes actually transferred to/from the device */
    uint64_t tensors;        /* tensors written or regions read */
    double seconds;
    double gbps;             /* bytes / seconds / 1e9 */
    char backend[16];        /* "io_uring", "psync" or "buffered" */
    int direct;              /* 1 if O_DIRECT was used for data */
    uint32_t alignment;      /* file offset alignment used for direct I/O */
} ckptio_stats;

/* Memory alignment that lets ckptio move a buffer to or from the device without a copy
 * (4096). Buffers aligned this way take the zero-copy path; others are staged. */
CKPTIO_API size_t ckptio_alignment(void);

/* ------------------------------------------------------------------------------------------ */
/* Writer                                                                                     */
/* ------------------------------------------------------------------------------------------ */

typedef struct ckptio_writer ckptio_writer;

/* Start a checkpoint at directory `path`. Nothing is visible at `path` until commit: data goes
 * to a temporary sibling directory `<path>.tmp-<pid>.<n>` that commit renames into place.
 * Fails with CKPTIO_E_EXISTS if `path` exists and p->overwrite is off. `p` may be NULL
 * (defaults). With p->overwrite, what is at `path` must be a committed checkpoint or an empty
 * directory (else CKPTIO_E_EXISTS); it is not touched before commit, so a save that fails or
 * is closed uncommitted leaves it exactly as it was.
 *
 * A `path` that is a symlink (`latest -> step-1000`) is saved through, as open(2) would: the
 * rules above apply to the directory it points to, which commit creates or replaces (its
 * temporary directory is made beside that target), and the link stays a link, now naming the
 * new checkpoint. A dangling link creates its target. On success *out owns a handle that ckptio_writer_close() releases; on failure
 * *out is NULL and ckptio_last_error() says why. A writer is used by one thread at a time.
 *
 * A save killed before its commit (SIGKILL, power loss) leaves only its temporary directory.
 * Opening a writer for `path` removes such leftovers of the same name: the siblings named
 * exactly `<name>.tmp-<pid>.<n>` whose process no longer exists (kill(pid, 0) gives ESRCH) and
 * whose lock no live writer holds (a writer keeps flock(LOCK_EX) on its temporary directory).
 * Nothing else is touched: not other names, not `<name>.old-*`, not symlinks; on file systems
 * without flock (NFS) leftovers stay and may be deleted by hand once no save is running.
 *
 * A rejected call (CKPTIO_E_USAGE, _DTYPE, _SHAPE, _DUPLICATE, _LIMIT) leaves the writer as it
 * was. An I/O failure (-ENOSPC, -EIO, ...) poisons it: every later call but close returns that
 * same error, and close removes the temporary directory.
 *
 * Fork: a writer, reader or zip writer open in a process that forks stays the parent's. The
 * child may only close its copy (a finalizer does): that frees the child's memory and nothing
 * else (no thread is joined, the parent's temporary directory and uploads are left alone).
 * Other calls on an inherited writer (adds, commit) and reads and verifies of an inherited
 * reader fail with CKPTIO_E_STATE, saying so: its threads are the parent's (a reader's
 * queries, which need none, still answer). Since 0.3. */
CKPTIO_API int ckptio_writer_open(ckptio_writer **out, const char *path, const ckptio_params *p);

/* Add one chunk of a tensor: the box [chunk_offset, chunk_offset + chunk_shape) of a global
 * tensor `name` of `dtype` and global `shape` (ndim dims; ndim 0 is a scalar). `data` holds the
 * chunk in row-major order, `nbytes` = product(chunk_shape) * ckptio_dtype_size(dtype).
 * chunk_offset NULL means all zeros; chunk_shape NULL means the whole tensor. Chunks of one
 * tensor must agree on dtype and shape, must not overlap, and must cover the tensor by commit.
 *
 * Lifetime: the call may return before the bytes reach the device. `data` must stay valid and
 * unchanged until ckptio_writer_flush() or ckptio_writer_commit() returns (buffers aligned to
 * ckptio_alignment() are written from in place; others are copied into staging, but do not
 * rely on which path a buffer takes). */
CKPTIO_API int ckptio_writer_add(ckptio_writer *w, const char *name, int dtype, uint32_t ndim,
                                 const uint64_t *shape, const uint64_t *chunk_offset,
                                 const uint64_t *chunk_shape, const void *data, uint64_t nbytes);

/* Store a metadata entry (UTF-8 key, any bytes as value; a later call with the same key
 * replaces the value). The value is copied. */
CKPTIO_API int ckptio_writer_set_meta(ckptio_writer *w, const char *key, const void *value,
                                      size_t len);

/* Wait until every byte passed to ckptio_writer_add() so far has been handed to the device:
 * afterwards the caller may reuse those buffers. Not a durability point; commit is. */
CKPTIO_API int ckptio_writer_flush(ckptio_writer *w);

/* Make the checkpoint durable and visible, atomically: flush, fsync data files, write and
 * fsync the manifest, fsync the directory, rename into place (replacing an old checkpoint
 * only with p->overwrite, and only once the new one is complete), fsync the parent, then
 * remove the replaced checkpoint. After a failure nothing new is visible at `path` and an old
 * checkpoint there is intact; the temporary directory is removed. One exception:
 * CKPTIO_E_NOT_DURABLE means the rename happened, so the new checkpoint is complete and
 * visible at `path` (and the old one gone), but the parent directory's fsync failed, so a
 * crash might still lose the rename; sync or save again. Either way the writer accepts no
 * more calls but close. */
CKPTIO_API int ckptio_writer_commit(ckptio_writer *w);

/* Release the writer. Without a successful commit this aborts: in-flight I/O is waited for
 * and the temporary directory removed, leaving `path` as it was. Accepts NULL. */
CKPTIO_API void ckptio_writer_close(ckptio_writer *w);

CKPTIO_API int ckptio_writer_stats(const ckptio_writer *w, ckptio_stats *out);
/* The handle's last error message ("" if none). Valid until the next call on the handle. */
CKPTIO_API const char *ckptio_writer_errmsg(const ckptio_writer *w);

/* ------------------------------------------------------------------------------------------ */
/* Reader                                                                                     */
/* ------------------------------------------------------------------------------------------ */

typedef struct ckptio_reader ckptio_reader;

/* Open the committed checkpoint at directory `path`: reads and checks the manifest (magic,
 * version, checksum, limits); data files are opened by the first read that needs them (a
 * missing one fails that read with CKPTIO_E_CORRUPT). CKPTIO_E_NOT_CHECKPOINT if `path` has
 * no manifest (e.g. an unfinished save). `path` may be a symlink to the checkpoint (latest ->
 * step-1000); inside the checkpoint nothing is followed out of it: a data file whose name or
 * symlink leads outside the directory is refused. `p` may be NULL. Reading calls on one reader are made
 * by one thread at a time; the query functions may be called from any thread. */
CKPTIO_API int ckptio_reader_open(ckptio_reader **out, const char *path, const ckptio_params *p);
CKPTIO_API void ckptio_reader_close(ckptio_reader *r); /* accepts NULL */

/* Structs that may grow: ckptio_tensor_info, ckptio_region and ckptio_range start with `size`,
 * which the caller sets to sizeof the struct as its header declares it. The library reads
 * (or, for ckptio_tensor_info, fills) only the fields that `size` covers, so a program built
 * against an older header keeps working with a newer library. A size of 0 or below the
 * struct's first version is CKPTIO_E_USAGE. In an array every element has the same size (the
 * first element's, used as the stride). */

/* Filled by ckptio_reader_tensor; set `size` before the call. `size` since 0.2. */
typedef struct ckptio_tensor_info {
    uint32_t size;         /* sizeof(ckptio_tensor_info), set by the caller */
    const char *name;      /* NUL-terminated, valid while the reader is open */
    int dtype;
    uint32_t ndim;
    const uint64_t *shape; /* ndim entries, valid while the reader is open */
    uint64_t nbytes;       /* product(shape) * dtype size */
    uint64_t stored_bytes; /* bytes on disk over all chunks */
    uint64_t num_chunks;
    /* Since 0.3: how the chunks are stored (doc/format.md section 11): "none", "zstd",
     * "float", or "mixed" when its chunks differ; delta: 1 when some chunk is a delta against
     * the checkpoint's base. nbytes / stored_bytes is the tensor's compression ratio. */
    const char *codec;
    uint32_t delta;
} ckptio_tensor_info;

typedef struct ckptio_chunk_info {
    const uint64_t *offset; /* ndim entries */
    const uint64_t *shape;  /* ndim entries */
    const char *file;       /* data file, relative to the checkpoint directory */
    uint64_t file_offset;
    uint64_t stored_bytes;
    uint64_t nbytes;
} ckptio_chunk_info;

/* Tensors are listed in name order (bytewise). */
CKPTIO_API size_t ckptio_reader_num_tensors(const ckptio_reader *r);
CKPTIO_API int ckptio_reader_tensor(const ckptio_reader *r, size_t index, ckptio_tensor_info *out);
/* Index of tensor `name`, or CKPTIO_E_NOT_FOUND. */
CKPTIO_API int64_t ckptio_reader_find(const ckptio_reader *r, const char *name);
CKPTIO_API int ckptio_reader_chunk(const ckptio_reader *r, size_t tensor, size_t chunk,
                                   ckptio_chunk_info *out);

CKPTIO_API size_t ckptio_reader_num_meta(const ckptio_reader *r);
/* Entry `index` of the metadata (keys in bytewise order). Pointers valid while r is open. */
CKPTIO_API int ckptio_reader_meta(const ckptio_reader *r, size_t index, const char **key,
                                  const void **value, size_t *len);
/* Value of `key`, or CKPTIO_E_NOT_FOUND. */
CKPTIO_API int ckptio_reader_get_meta(const ckptio_reader *r, const char *key, const void **value,
                                      size_t *len);

/* Where a buffer lives: host memory, or CUDA device memory (a device pointer of the current
 * context's device or one the driver maps with unified addressing), moved as
 * ckptio_params.gpu says. Since 0.2. */
enum ckptio_memory { CKPTIO_MEM_HOST = 0, CKPTIO_MEM_CUDA = 1 };

/* A box of one tensor to read into `dst`, row-major in `shape`. `size` = sizeof(ckptio_region)
 * (see above); `memory` = CKPTIO_MEM_HOST (0), or CKPTIO_MEM_CUDA with `dst` a device pointer
 * (read through a pinned ring or cuFile, as ckptio_params.gpu says; see `stream`). `name`
 * selects the tensor; if it is NULL,
 * `tensor` (an index) does. offset NULL means all zeros; shape NULL means the whole tensor.
 * `capacity` >= product(shape) * dtype size. Bytes of dst past that size may be used as
 * scratch up to `capacity`: pass capacity rounded up to ckptio_alignment(), with dst aligned
 * to it, and large reads land in dst directly with no copy. `size` and `memory` since 0.2:
 *     ckptio_region reg = {.size = sizeof reg, .name = "w", .dst = buf, .capacity = cap}; */
typedef struct ckptio_region {
    uint32_t size;   /* sizeof(ckptio_region), set by the caller */
    uint32_t memory; /* enum ckptio_memory of dst */
    const char *name;
    size_t tensor;
    const uint64_t *offset;
    const uint64_t *shape;
    void *dst;
    uint64_t capacity;
    /* CKPTIO_MEM_CUDA only: the caller's CUstream. ckptio's copies start after the work
     * queued on it before the call and it is made to wait for them, so kernels queued on it
     * afterwards see the data; 0 (the legacy default stream) also makes the call return only
     * once the data is in place. Since 0.2. */
    uint64_t stream;
    /* Bytes of memory right before dst that the read may overwrite (0: none; host memory only).
     * A tensor stored where O_DIRECT cannot start (a stock safetensors file's data begins
     * anywhere) is then read straight into dst from the block boundary below, when dst sits in
     * its page as the tensor's first byte sits in its block; else it is staged. Since 0.3. */
    uint64_t lead;
} ckptio_region;

/* Read `n` regions, whatever chunks their tensors were stored as: the reads of all regions
 * are planned together (adjacent ranges coalesced, many large requests in flight) and
 * checksums are verified as data lands (p->checksums), on p->verify_threads threads. Ranges
 * resident in the page cache are copied from it (p->cache). Returns 0 or the first error; the
 * message names the file, tensor and offset (of checksum mismatches, the first damaged block
 * in file order, whatever the order in which reads complete). On failure the destinations'
 * contents are unspecified. */
CKPTIO_API int ckptio_reader_read(ckptio_reader *r, const ckptio_region *regions, size_t n);

/* Read a whole tensor into dst (capacity >= its nbytes). */
CKPTIO_API int ckptio_reader_read_tensor(ckptio_reader *r, const char *name, void *dst,
                                         uint64_t capacity);

/* Read every stored byte and check every checksum. Returns 0 if all are intact; otherwise the
 * first error, with *bad_chunks (may be NULL) set to the number of damaged chunks; the
 * message names the first damaged file, tensor and offset. */
CKPTIO_API int ckptio_reader_verify(ckptio_reader *r, uint64_t *bad_chunks);

CKPTIO_API int ckptio_reader_stats(const ckptio_reader *r, ckptio_stats *out);
/* Where a reader's bytes came from, over all its reads and verifies so far (since 0.2). The
 * caller sets .size = sizeof(ckptio_read_stats); fields past it are left alone. */
typedef struct ckptio_read_stats {
    uint32_t size;
    uint32_t verify_threads; /* threads that verified and copied cached ranges (caller's too) */
    uint64_t cache_bytes;    /* stored bytes copied from the page cache (ckptio_params.cache) */
    uint64_t device_bytes;   /* bytes read through the I/O backend (O_DIRECT where in effect) */
    uint64_t requests;       /* requests handed to the I/O backend */
    uint64_t merged;         /* small in-place reads of neighbouring ranges merged into others */
} ckptio_read_stats;
CKPTIO_API int ckptio_reader_read_stats(const ckptio_reader *r, ckptio_read_stats *out);
CKPTIO_API const char *ckptio_reader_errmsg(const ckptio_reader *r);
/* The checkpoint directory's path as given to open. */
CKPTIO_API const char *ckptio_reader_path(const ckptio_reader *r);

/* ------------------------------------------------------------------------------------------ */
/* Single files in foreign formats. Experimental: define CKPTIO_EXPERIMENTAL to use them.     */
/* ------------------------------------------------------------------------------------------ */
#if defined(CKPTIO_EXPERIMENTAL) || defined(CKPTIO_BUILDING)

/* A file written front to back at device speed — staging ring, O_DIRECT where the file system
 * allows it, several writes in flight — for formats ckptio does not own (a torch.save zip
 * archive, safetensors). It is written as `<path>.tmp-<pid>.<n>` and appears at `path` only at
 * commit (fsync of the file, rename, fsync of the directory). Used by one thread at a time.
 * A `path` that is a symlink is written through, as torch.save does: the temporary file is
 * made beside the link's final target and renamed over it; the link stays a link. A new file
 * gets mode 0666 less the umask, as open(2) gives; a replaced file keeps its mode.
 * Since 0.1. */
typedef struct ckptio_file_writer ckptio_file_writer;

/* Fails with CKPTIO_E_EXISTS if `path` exists and p->overwrite is off. */
CKPTIO_API int ckptio_file_writer_open(ckptio_file_writer **out, const char *path,
                                       const ckptio_params *p);
/* Append `len` bytes. `data` is not used after the call returns, so it may be reused at once:
 * its bytes were copied, or (a large source aligned to ckptio_alignment() at an aligned end of
 * file) written to the device straight from `data` before the call returned. */
CKPTIO_API int ckptio_file_writer_write(ckptio_file_writer *f, const void *data, size_t len);
/* Bytes written so far (the current end of the file). */
CKPTIO_API uint64_t ckptio_file_writer_tell(const ckptio_file_writer *f);
/* Make the file durable and visible at `path` (replacing an older file only with
 * p->overwrite). After a failure nothing new is at `path`, except with CKPTIO_E_NOT_DURABLE:
 * the rename happened and the file is complete at `path`, but the directory's fsync failed, so
 * a crash might still lose it; sync or save again. */
CKPTIO_API int ckptio_file_writer_commit(ckptio_file_writer *f);
/* Release; without a commit the temporary file is removed. Accepts NULL. */
CKPTIO_API void ckptio_file_writer_close(ckptio_file_writer *f);
CKPTIO_API int ckptio_file_writer_stats(const ckptio_file_writer *f, ckptio_stats *out);
CKPTIO_API const char *ckptio_file_writer_errmsg(const ckptio_file_writer *f);

/* A zip archive in the layout torch.save writes (PyTorch's reader, Python's zipfile and zip
 * tools read it), written through a file writer (same staging, O_DIRECT, atomic commit and
 * errors as ckptio_file_writer): records stored uncompressed, each record's data at a multiple
 * of its alignment, its CRC-32 and sizes in a data descriptor after the data, zip64 records where
 * sizes or offsets pass 4 GiB. The CRC-32s are computed while the data is written, on CRC threads
 * (a quarter of the CPUs, 1 to 4; carry-less multiply folding where the CPU has it), so a
 * record costs its write. Used by one thread at a time. Since 0.3. */
typedef struct ckptio_zip_writer ckptio_zip_writer;

/* Leave a record's CRC-32 zero (torch.save's crc32 option off): torch.load still reads it. */
#define CKPTIO_ZIP_NO_CRC 1u

/* As ckptio_file_writer_open. */
CKPTIO_API int ckptio_zip_writer_open(ckptio_zip_writer **out, const char *path,
                                      const ckptio_params *p);
/* Append the record `name` (1 to 65535 bytes of UTF-8) holding `len` bytes of `data`, which
 * starts in the file at a multiple of `align` (a power of two up to 32768; 0 = 1). `data` is
 * not used after the call returns. `flags`: CKPTIO_ZIP_NO_CRC or 0. Names are not checked for
 * repeats. */
CKPTIO_API int ckptio_zip_writer_add(ckptio_zip_writer *z, const char *name, const void *data,
                                     uint64_t len, uint32_t align, unsigned flags);
/* The same record in pieces: begin names it and its length, then appends give its bytes in
 * order (`data` not used after each returns); the record ends with its last byte. */
CKPTIO_API int ckptio_zip_writer_begin(ckptio_zip_writer *z, const char *name, uint64_t len,
                                       uint32_t align, unsigned flags);
CKPTIO_API int ckptio_zip_writer_append(ckptio_zip_writer *z, const void *data, size_t n);
/* Bytes written so far. */
CKPTIO_API uint64_t ckptio_zip_writer_tell(const ckptio_zip_writer *z);
/* Write the central directory and the end records, then commit as ckptio_file_writer_commit. */
CKPTIO_API int ckptio_zip_writer_commit(ckptio_zip_writer *z);
/* Release; without a commit the temporary file is removed. Accepts NULL. */
CKPTIO_API void ckptio_zip_writer_close(ckptio_zip_writer *z);
CKPTIO_API int ckptio_zip_writer_stats(const ckptio_zip_writer *z, ckptio_stats *out);
CKPTIO_API const char *ckptio_zip_writer_errmsg(const ckptio_zip_writer *z);

/* ---- the peer tier's transport (doc/tiers.md). Since 0.3. ----
 * A "part" is one rank's committed checkpoint directory under a node's local root, named
 * relative to that root ("<step>/rank<R>"). Parts travel between ranks over TCP and are
 * published by the receiver only once complete (a "<name>.tmp-<pid>.<n>" directory renamed into
 * place, as every ckptio commit): a sender or receiver killed halfway leaves no part.
 * Every connection begins with both sides proving that they hold the job's key (HMAC-SHA256
 * over fresh nonces of both sides), before any name or byte of a part is exchanged; the
 * request is bound to that connection. A server answers a client that fails with nothing of
 * its own, and logs the client's address on stderr. The part's bytes travel in the clear:
 * what this does and does not protect is in doc/tiers.md. */
typedef struct ckptio_peer ckptio_peer;

#define CKPTIO_PEER_VERIFY 1u /* verify every block's checksum before publishing a part */
#define CKPTIO_PEER_KEY_MIN 16 /* bytes of a job's key, at least (32 random ones: as good as any) */
#define CKPTIO_PEER_KEY_MAX 64

typedef struct ckptio_peer_opts {
    double timeout;    /* seconds any one send or receive may wait (<= 0: no limit; a server:
                        * 120) */
    uint64_t max_rate; /* push: bytes per second at most (0: no limit) */
    unsigned flags;    /* fetch, copy: CKPTIO_PEER_VERIFY (a push is always verified) */
    const unsigned char *key; /* the job's key, the same on every rank, never written anywhere:
                               * required by a server and by every call that talks to one */
    size_t key_len;           /* CKPTIO_PEER_KEY_MIN..CKPTIO_PEER_KEY_MAX */
} ckptio_peer_opts;

/* Serve the parts under `root` and receive the parts other ranks push: listen on `addr`
 * (an address or host name; NULL or "": every interface, which a job should not need: name
 * the address the job's ranks talk on) and `port` (0: any free one), on a thread of ckptio's,
 * one more per connection. o->key is required (the server copies it); o->timeout bounds a
 * silent connection. A pushed part is verified (every block against its checksum) before it
 * is published; a part that fails is not kept, and the pusher is told why. */
CKPTIO_API int ckptio_peer_open(ckptio_peer **out, const char *root, const char *addr, int port,
                                const ckptio_peer_opts *o);
/* The port the server listens on. */
CKPTIO_API int ckptio_peer_port(const ckptio_peer *p);
/* Stop listening, break off transfers in progress (their parts are not kept), free. NULL ok. */
CKPTIO_API void ckptio_peer_close(ckptio_peer *p);
/* Send the committed checkpoint `src` to the server at host:port, to be kept as part `name`
 * under its root. Returns 0 once the peer has verified and published it; on failure the
 * peer's reason, or the transfer's. *bytes (may be NULL): bytes sent. */
CKPTIO_API int ckptio_peer_push(const char *src, const char *host, int port, const char *name,
                                const ckptio_peer_opts *o, uint64_t *bytes);
/* Fetch part `name` from the server at host:port into directory `dst` (created, or replaced
 * only once the new one is complete). -ENOENT: the peer holds no such committed part. A part
 * received, fetched or pushed, is made owner-only (0700 directories, 0600 files, whatever the
 * umask), as is each directory made above it. */
CKPTIO_API int ckptio_peer_fetch(const char *host, int port, const char *name, const char *dst,
                                 const ckptio_peer_opts *o, uint64_t *bytes);
/* Copy the committed checkpoint `src` to directory `dst` on a file system (copy_file_range,
 * each file fsynced), published as a fetch is. */
CKPTIO_API int ckptio_part_copy(const char *src, const char *dst, const ckptio_peer_opts *o,
                                uint64_t *bytes);

/* One destination of ckptio_part_spread: a peer's server (host and port: the part is kept as
 * `name` under its root, as ckptio_peer_push), or with host NULL a directory on a file system
 * (dst: as ckptio_part_copy). `size` = sizeof(ckptio_part_dest), set by the caller; rc, bytes
 * and errmsg are the outcome. Since 0.3. */
typedef struct ckptio_part_dest {
    uint32_t size;
    const char *host;
    int port;
    const char *dst;
    int rc;           /* out: 0 once this destination verified (peer) and published the part */
    uint64_t bytes;   /* out: bytes sent or written */
    char errmsg[1024]; /* out: why, when rc < 0 */
} ckptio_part_dest;

/* Send the committed checkpoint `src` to every destination in one pass: each of its files is
 * read once (O_DIRECT where its file system takes it), a few chunks ahead of the slowest
 * destination, and each destination takes the chunks on a thread of its own (sent to a peer,
 * written to a directory), so none waits on another; with one destination the kernel copies
 * it (sendfile, copy_file_range). A destination that fails drops out, the others go on. o->max_rate paces the pass; o->flags
 * apply to the directories (a peer always verifies). Returns 0 when every destination has the
 * part, else the first failed one's rc, with its errmsg in ckptio_last_error(). */
CKPTIO_API int ckptio_part_spread(const char *src, const char *name, ckptio_part_dest *d,
                                  size_t n, const ckptio_peer_opts *o);

/* The SHA-256 of the manifest the reader read (32 bytes into out). The manifest holds every
 * block's checksum and the metadata, so the digest names one committed checkpoint's exact
 * contents: a copy (ckptio_peer_fetch, ckptio_part_copy) has its original's digest, another
 * save of the same tensors another. The peer tier's step records are made of them
 * (doc/tiers.md). CKPTIO_E_UNSUPPORTED for a foreign reader. Since 0.3. */
CKPTIO_API int ckptio_reader_digest(const ckptio_reader *r, unsigned char out[32]);

/* One byte range of a file to read into dst (dst must hold `len` bytes; as with regions, pass
 * dst aligned to ckptio_alignment() for reads with no copy). `size` = sizeof(ckptio_range), as
 * for ckptio_region; since 0.2. */
typedef struct ckptio_range {
    uint32_t size; /* sizeof(ckptio_range), set by the caller */
    uint64_t offset;
    uint64_t len;
    void *dst;
} ckptio_range;

/* Read `n` ranges of the file at `path` at device speed: ranges are coalesced, many large
 * requests in flight, O_DIRECT where allowed, straight into aligned destinations. No checksum
 * (the file is not ckptio's). Symlinks are followed wherever they lead, as open(2) does (a
 * Hugging Face cache entry is snapshots/<rev>/<name> -> ../../blobs/<sha>). -EIO-style errors, or CKPTIO_E_CORRUPT when a range lies past
 * the end of the file; the message names the file and offset. `stats` may be NULL. Since 0.1. */
CKPTIO_API int ckptio_file_read(const char *path, const ckptio_range *ranges, size_t n,
                                const ckptio_params *p, ckptio_stats *stats);

/* How a checkpoint writer names and bounds its data files. By default one file,
 * data/000000.ckd, holds every chunk. With a `prefix` (at most 64 of [A-Za-z0-9._-], not
 * starting with '.'; NULL or "" for none) the files are data/<prefix>000000.ckd,
 * data/<prefix>000001.ckd, ...: one rank of a multi-rank save names its files by its rank.
 * With `max_file_bytes` (0: no bound) a chunk that would take the current file past that size
 * starts the next file instead; a chunk larger than the bound gets a file of its own. Call
 * before the first ckptio_writer_add (else CKPTIO_E_STATE). Readers need nothing: the
 * manifest lists the files. Since 0.1. */
CKPTIO_API int ckptio_writer_set_data_files(ckptio_writer *w, const char *prefix,
                                            uint64_t max_file_bytes);

/* Stripe the checkpoint over several storage roots (say one directory on each NVMe drive):
 * besides the checkpoint's own directory, each of the `n` roots (existing directories; one that
 * is the checkpoint's parent directory means the checkpoint's own share) gets a stripe
 * directory `<root>/<name>.<id>.ckptio-stripe/` holding its share of the data files. Chunks go
 * to the root given the fewest bytes so far (a chunk of 64 MiB or more is first cut along its
 * first dimension into row blocks, at most one per root, stored as chunks of their own), each
 * root's writes through its own I/O engine, so
 * that all roots are written at once (each root has its own staging pool of staging_bytes and
 * its own io_threads). The stripes are made durable before the manifest is
 * published, removed if the save fails, and replaced with the checkpoint on overwrite; stripes
 * of this path left by a save that crashed are removed here. The manifest records each root
 * (format 2.0; readers before it refuse the checkpoint with CKPTIO_E_FORMAT). Call once,
 * before the first ckptio_writer_add (else CKPTIO_E_STATE); not for a multi-rank save. Since
 * 0.3. */
CKPTIO_API int ckptio_writer_set_roots(ckptio_writer *w, const char *const *roots, size_t n);

/* Where to look for a striped checkpoint's stripes when they are not where its manifest
 * recorded them (roots mounted elsewhere, a copied checkpoint): each stripe directory is
 * looked for by name in these `n` directories, in order, instead of its recorded root. Call
 * before the first read; `n` = 0 goes back to the recorded roots. Since 0.3. */
CKPTIO_API int ckptio_reader_set_roots(ckptio_reader *r, const char *const *roots, size_t n);

/* Stripe directories of the checkpoint at `path` that nothing uses: left in `roots` (n = 0:
 * the roots the checkpoint at `path` records) by a save to `path` that died before its
 * publish, or by an overwrite interrupted before removing the old ones. A stripe that a live
 * save holds, or that the checkpoint now at `path` names, is never counted. *found gets how
 * many there are; with `remove` they are removed (the next save to `path` over those roots
 * does the same). Since 0.3. */
CKPTIO_API int ckptio_stripe_leftovers(const char *path, const char *const *roots, size_t n,
                                       int remove, uint64_t *found);
#endif /* CKPTIO_EXPERIMENTAL */

/* ------------------------------------------------------------------------------------------ */
/* safetensors headers. Experimental: define CKPTIO_EXPERIMENTAL to use them.                 */
/* ------------------------------------------------------------------------------------------ */
#if defined(CKPTIO_EXPERIMENTAL) || defined(CKPTIO_BUILDING)

/* The header of a .safetensors file (a u64 length N, then N bytes of JSON) as flat arrays:
 * the parser and writer that ckptio's own conversion uses, for a tool or binding that reads
 * or writes such files through ckptio_file_read and ckptio_file_writer. Pure code, no I/O;
 * the parser is fuzzed. Since 0.3. */

/* Largest header length N accepted, as in the reference implementation. */
#define CKPTIO_ST_MAX_HEADER 100000000ull
/* safetensors dtypes are numbered 1 .. CKPTIO_ST_COUNT - 1 (0: none); ckptio_st_dtype_name
 * gives each one's name ("BF16", "F8_E4M3", ...). */
#define CKPTIO_ST_COUNT 23

/* One tensor of a header. Its layout is versioned by the ckptio_st_header that points to it
 * (see its .size), as is ckptio_st_meta's. */
typedef struct ckptio_st_tensor {
    uint64_t name;     /* strtab offset; strtab[name + name_len] == 0 */
    uint32_t name_len;
    uint32_t st_dtype; /* 1 .. CKPTIO_ST_COUNT - 1 */
    int32_t dtype;     /* CKPTIO_DT_*, or 0 where ckptio has none (F4, F6_*, F8_E8M0, ...FNUZ) */
    uint32_t ndim;     /* <= CKPTIO_MAX_NDIM; 0 for a scalar */
    uint64_t dims;     /* index into dims[] of ndim entries */
    uint64_t begin;    /* data_offsets, relative to the data start (8 + header length) */
    uint64_t end;
} ckptio_st_tensor;

typedef struct ckptio_st_meta {
    uint64_t key; /* strtab offsets, each string followed by a NUL */
    uint32_t key_len;
    uint32_t reserved;
    uint64_t val;
    uint64_t val_len; /* a value may hold NULs of its own (\u0000): use val_len */
} ckptio_st_meta;

/* Strings live in strtab, each followed by a NUL. `size` versions this struct and, with it,
 * the layout of the ckptio_st_tensor and ckptio_st_meta arrays it points to (when either of
 * those grows, this struct grows too). A header the caller builds for ckptio_st_encode, its
 * arrays included, is the caller's: set .size = sizeof(ckptio_st_header). A parsed header
 * (ckptio_st_parse) is the library's, one allocation in the library's own layout, and its
 * .size says which. */
typedef struct ckptio_st_header {
    uint32_t size;       /* sizeof(ckptio_st_header) */
    uint32_t reserved;   /* 0 */
    uint64_t header_len; /* N */
    uint64_t data_start; /* 8 + N */
    uint64_t n_tensors, n_meta, n_dims, strtab_len;
    ckptio_st_tensor *tensors; /* parsed: sorted by (begin, end, order in the header) */
    ckptio_st_meta *meta;      /* parsed: in header order; keys unique */
    uint64_t *dims;
    char *strtab;
} ckptio_st_header;

/* Parse the n JSON bytes `hdr` of a safetensors file of file_size bytes (whose first 8 bytes
 * hold n). Checked: UTF-8; one object of name -> {"dtype", "shape", "data_offsets"} and at
 * most one "__metadata__" -> {string: string}; unique names; end - begin = ceil(bits *
 * elements / 8); the tensors, by offset, tile the data exactly. On success *out is one
 * allocation (free with ckptio_st_free). On failure CKPTIO_E_LIMIT, CKPTIO_E_DTYPE,
 * CKPTIO_E_DUPLICATE, CKPTIO_E_SHAPE, CKPTIO_E_CORRUPT or -ENOMEM, and err (errlen bytes)
 * says why, naming the tensor and the byte. Thread-safe. */
CKPTIO_API int ckptio_st_parse(const uint8_t *hdr, uint64_t n, uint64_t file_size,
                               ckptio_st_header **out, char *err, size_t errlen);
CKPTIO_API void ckptio_st_free(ckptio_st_header *h); /* accepts NULL */
/* Encode h (its tensors, meta, dims and strtab; header_len and data_start are ignored) as the
 * start of a safetensors file: the length word, then the JSON ("__metadata__" first when
 * there is any, then the tensors in h's order), padded with spaces so that the data start is
 * a multiple of `align` (a power of two; 1: no padding). Offsets are written as given: the
 * caller lays them out. On success *out (malloc'd; free()) holds *len bytes; else
 * CKPTIO_E_USAGE (also for an h->size other than sizeof(ckptio_st_header)), CKPTIO_E_LIMIT or
 * -ENOMEM, with err. Thread-safe. */
CKPTIO_API int ckptio_st_encode(const ckptio_st_header *h, uint64_t align, uint8_t **out,
                                uint64_t *len, char *err, size_t errlen);
/* A safetensors dtype's name, or NULL outside 1 .. CKPTIO_ST_COUNT - 1. */
CKPTIO_API const char *ckptio_st_dtype_name(int st_dtype);
/* The CKPTIO_DT_* a safetensors dtype holds, or 0 where ckptio has none. */
CKPTIO_API int ckptio_st_dtype_ckptio(int st_dtype);

/* A reader over safetensors files instead of a checkpoint: `path` is one .safetensors file (any
 * name: a Hugging Face cache blob too), a "*.safetensors.index.json", or a directory holding
 * "model.safetensors.index.json" (else the one "*.safetensors.index.json"; several are
 * CKPTIO_E_USAGE) or, without an index, *.safetensors files (a tensor in two of them is
 * CKPTIO_E_DUPLICATE). An index's weight_map says which file holds each tensor; a file it names
 * outside its directory (absolute, or with a ".." component) is CKPTIO_E_CORRUPT, and so is a
 * tensor missing from its file. Links are followed wherever they lead. A directory with a
 * ckptio manifest is CKPTIO_E_FORMAT (use ckptio_reader_open). Each header is parsed as
 * ckptio_st_parse does (a hostile one fails the open with its code, naming the file). The
 * reader then serves every call of a checkpoint's: each tensor is one chunk (file, offset,
 * length; ckptio_reader_chunk names its file relative to the directory), tensors in name order,
 * metadata from the index and then each file's __metadata__ (the first value of a key wins; an
 * index value that is no string as its JSON text). A safetensors dtype ckptio has no code for
 * is CKPTIO_DT_BYTES: 8-bit ones (F8_E8M0, F8_*FNUZ) with a trailing dimension of 1, F4 and F6_*
 * as a vector of their bytes. Nothing is checksummed: reads check nothing and
 * ckptio_reader_verify is CKPTIO_E_UNSUPPORTED. Since 0.3. */
CKPTIO_API int ckptio_reader_open_foreign(ckptio_reader **out, const char *path,
                                          const ckptio_params *p);
/* The safetensors dtype (1 .. CKPTIO_ST_COUNT - 1: ckptio_st_dtype_name names it) of tensor
 * `index` of a reader from ckptio_reader_open_foreign; 0 for a tensor of a ckptio checkpoint.
 * CKPTIO_E_NOT_FOUND past the tensors, CKPTIO_E_USAGE for NULL. Thread-safe. Since 0.3. */
CKPTIO_API int ckptio_reader_st_dtype(const ckptio_reader *r, size_t index);

#endif /* CKPTIO_EXPERIMENTAL */

/* ------------------------------------------------------------------------------------------ */
/* Commit in the background. Experimental: define CKPTIO_EXPERIMENTAL to use them.            */
/* ------------------------------------------------------------------------------------------ */
#if defined(CKPTIO_EXPERIMENTAL) || defined(CKPTIO_BUILDING)

/* A commit running on a thread of its own (ckptio_writer_commit_async). Since 0.2. */
typedef struct ckptio_completion ckptio_completion;

/* Start ckptio_writer_commit(w) (which flushes first) on a thread that ckptio owns, and return
 * at once. On success *out owns `w`: the caller makes no further call on w, not even close;
 * ckptio_completion_free() closes it. Every buffer given to ckptio_writer_add() must stay valid
 * and unchanged until the completion is done (ckptio_completion_wait() returned something
 * other than -ETIMEDOUT, or ckptio_completion_done() returned 1): copy into buffers of your
 * own before the call if the originals must change sooner. The commit's result is returned by
 * wait, never by this call. On failure (-EAGAIN: no thread; CKPTIO_E_USAGE) *out is NULL,
 * nothing was started and w is still the caller's, in the state it was. Since 0.2. */
CKPTIO_API int ckptio_writer_commit_async(ckptio_writer *w, ckptio_completion **out);

/* Wait up to `timeout` seconds (< 0: without limit) for the commit to finish; return its
 * result, the value ckptio_writer_commit() returned (0, CKPTIO_E_NOT_DURABLE, -ENOSPC...),
 * with its message in ckptio_last_error() and ckptio_completion_errmsg(). -ETIMEDOUT if it
 * is still running (then call again or free). May be called any number of times, from any
 * thread, concurrently with ckptio_completion_done(). Since 0.2. */
CKPTIO_API int ckptio_completion_wait(ckptio_completion *c, double timeout);
/* 1 once the commit has finished (wait would return at once), else 0. Since 0.2. */
CKPTIO_API int ckptio_completion_done(const ckptio_completion *c);
/* The finished commit's message ("" on success, or while it runs). Since 0.2. */
CKPTIO_API const char *ckptio_completion_errmsg(const ckptio_completion *c);
/* The writer's stats once the commit has finished; CKPTIO_E_STATE while it runs. Since 0.2. */
CKPTIO_API int ckptio_completion_stats(const ckptio_completion *c, ckptio_stats *out);
/* Wait for the commit if it is still running, then close the writer and release everything.
 * Called once, when no other call on c is in progress. Accepts NULL. Since 0.2. */
CKPTIO_API void ckptio_completion_free(ckptio_completion *c);
#endif /* CKPTIO_EXPERIMENTAL */

/* ------------------------------------------------------------------------------------------ */
/* Communicators (several ranks saving one checkpoint). Experimental: define CKPTIO_EXPERIMENTAL */
/* ------------------------------------------------------------------------------------------ */
#if defined(CKPTIO_EXPERIMENTAL) || defined(CKPTIO_BUILDING)

/* A growable byte buffer owned by ckptio: what a communicator hands back. Zero-initialized
 * (CKPTIO_BYTES_INIT) it is empty and valid. `data` is allocated and freed only by the two
 * functions below, never assigned by the caller; `data` may be NULL while `len` is 0. A plain
 * value type: it has no size field because it never grows (a new need gets a new type).
 * Since 0.2. */
typedef struct ckptio_bytes {
    void *data;
    size_t len; /* bytes in use */
    size_t cap; /* bytes allocated */
} ckptio_bytes;
#define CKPTIO_BYTES_INIT {0, 0, 0}

/* Make b hold exactly `len` bytes: the first min(len, old len) keep their value, the rest are
 * unspecified; then fill b->data. 0, or -ENOMEM with b unchanged. Since 0.2. */
CKPTIO_API int ckptio_bytes_resize(ckptio_bytes *b, size_t len);
/* Replace b's contents with a copy of `len` bytes at `src` (which may be NULL when len is 0).
 * 0 or -ENOMEM. Since 0.2. */
CKPTIO_API int ckptio_bytes_set(ckptio_bytes *b, const void *src, size_t len);
/* Free b's memory and leave it empty (CKPTIO_BYTES_INIT). Accepts NULL. Since 0.2. */
CKPTIO_API void ckptio_bytes_free(ckptio_bytes *b);

/* A communicator: how the ranks of one save talk to each other, as a table of callbacks so any
 * runtime plugs in (MPI, torch.distributed, JAX's distributed client, mpi4py; the single-process
 * and MPI ones ship with ckptio). The operations are collective: every rank of the group calls
 * the same operation, in the same order, with the same `root`. ckptio uses them only through
 * the ckptio_comm_* functions below, which check arguments and results.
 *
 * Every operation takes `timeout`, in seconds (> 0), the longest it may wait for the other
 * ranks, and returns 0 or a negative code: -ETIMEDOUT when the others did not all arrive in
 * time, CKPTIO_E_* or another -errno otherwise (-ENOMEM, -ECOMM for a transport error,
 * -ECONNRESET for a peer known to be gone). It must never block past the timeout. After any
 * failure the communicator is unusable: a rank may have left the operation half done, so
 * every later call may fail (it must not hang); the job is aborted or a new communicator built.
 *
 * Received bytes go into ckptio_bytes buffers that ckptio owns; an implementation fills them
 * with ckptio_bytes_resize()/ckptio_bytes_set() only, and must not keep pointers to them or to
 * `data` after it returns. A failed operation may leave them with any contents.
 *
 * Ownership: a table made by a ckptio constructor is freed with ckptio_comm_free(). A table made
 * by the caller (static, on the stack) stays the caller's; ckptio only reads it, and it and its
 * ctx must outlive every ckptio call given it. Thread safety: one thread at a time per
 * communicator; the callbacks are called from the thread that called into ckptio.
 * Since 0.2. */
typedef struct ckptio_comm {
    uint32_t size;   /* sizeof(ckptio_comm) as the implementation knew it: new fields go at
                      * the end and ckptio reads only those that `size` covers */
    int32_t rank;    /* this process's rank, 0 <= rank < nranks */
    int32_t nranks;  /* number of ranks, >= 1 */
    uint32_t reserved; /* 0 */
    void *ctx;       /* the implementation's state, passed to every callback */

    /* Return once every rank has entered the barrier. */
    int (*barrier)(void *ctx, double timeout);
    /* Broadcast bytes from `root`: on the root `buf` holds the bytes to send and is left as
     * it is; on every other rank `buf` is replaced by those bytes (any length, 0 included). */
    int (*broadcast)(void *ctx, int32_t root, ckptio_bytes *buf, double timeout);
    /* Gather to `root` each rank's `len` bytes at `data` (any length, 0 included; `data` may
     * be NULL when len is 0): on the root, `out` is replaced by the concatenation in rank
     * order and lens[i] set to rank i's length (lens has nranks entries); on the other ranks
     * `out` and `lens` are NULL. Bytes a rank sends are its own; only the root receives O(N). */
    int (*gather)(void *ctx, int32_t root, const void *data, size_t len, ckptio_bytes *out,
                  uint64_t *lens, double timeout);
    /* Called by ckptio_comm_free(); NULL for tables the caller owns. */
    void (*release)(void *ctx);
} ckptio_comm;

/* A communicator of one rank (rank 0 of 1): every operation succeeds at once. Free it with
 * ckptio_comm_free(). Since 0.2. */
CKPTIO_API int ckptio_comm_single(ckptio_comm **out);
/* Release a communicator made by a ckptio constructor: calls c->release(c->ctx) if set, so a
 * caller-owned table (release NULL) is left alone. Accepts NULL. Since 0.2. */
CKPTIO_API void ckptio_comm_free(ckptio_comm *c);

/* The operations, called through the table after checking it (size, callbacks, rank, root,
 * timeout > 0) and what it returns (the lengths at the root add up to out->len). Failures carry
 * a message in ckptio_last_error() naming the operation, the rank and the timeout. Collective:
 * see ckptio_comm. Since 0.2. */
CKPTIO_API int ckptio_comm_barrier(const ckptio_comm *c, double timeout);
CKPTIO_API int ckptio_comm_broadcast(const ckptio_comm *c, int32_t root, ckptio_bytes *buf,
                                     double timeout);
/* On ranks other than root, `out` and `lens` may be NULL (they are not touched). */
CKPTIO_API int ckptio_comm_gather(const ckptio_comm *c, int32_t root, const void *data,
                                  size_t len, ckptio_bytes *out, uint64_t *lens, double timeout);

/* Agree on one outcome: every rank passes its own result (`code`: 0 or negative, and `msg`, may
 * be NULL) and every rank gets the same answer: 0 if every rank passed 0; otherwise the code of
 * the lowest-numbered failing rank, with ckptio_last_error() reading "rank R of N: <its msg>" on
 * every rank. It gathers to rank 0 and broadcasts back (each rank sends under 1 KiB), all
 * within `timeout` seconds. If the exchange itself fails (a rank died or never came), every
 * surviving rank returns an error (the communicator's: -ETIMEDOUT, ...) within the timeout;
 * whatever happens, no rank returns 0 unless every rank passed 0. This is how a distributed
 * save makes every rank return the same success or the same error. Since 0.2. */
CKPTIO_API int ckptio_comm_agree(const ckptio_comm *c, int code, const char *msg,
                                 double timeout);

/* One item a rank contributes to a distributed save: the box [offset, offset + box) of global
 * tensor `name` (dtype, ndim, global `shape`), its bytes at `data` in row-major order, `nbytes`
 * = product(box) * dtype size. offset NULL means zeros, box NULL the whole shape. A plain item
 * is global state: ranks holding the same box must hold the same bytes (else the save fails,
 * naming the ranks). With CKPTIO_DIST_RANK_LOCAL in `flags` the item is this rank's own state,
 * stored as "<name>@rank<R>" and never compared across ranks. Set `size` to
 * sizeof(ckptio_dist_item). Since 0.2. */
#define CKPTIO_DIST_RANK_LOCAL 1u
typedef struct ckptio_dist_item {
    uint32_t size;
    uint32_t flags;
    const char *name;
    int dtype;
    uint32_t ndim;
    const uint64_t *shape;
    const uint64_t *offset;
    const uint64_t *box;
    const void *data;
    uint64_t nbytes;
    /* Since 0.3 (a smaller `size` means CKPTIO_MEM_HOST): where `data` lives (enum
     * ckptio_memory). CKPTIO_MEM_CUDA: `data` is a device pointer and `stream` the caller's
     * CUstream (0: the legacy default stream); the rank's pieces go through the writer's GPU
     * path (ckptio_writer_add_mem, doc/gpu.md), with host memory bounded by its staging ring,
     * and replicated slabs this rank does not write are hashed through the same ring. The
     * device buffer must not change until ckptio_save_dist returns. */
    uint32_t memory;
    uint64_t stream;
} ckptio_dist_item;

/* Save one checkpoint at `path` from every rank of `comm`: collective, every rank calls it with
 * its own items and the same path, params and timeout. Rank 0 coordinates: it checks that the
 * ranks' boxes tile each tensor exactly (a hole, an overlap, a dtype or shape disagreement fail
 * on every rank before any byte is written), assigns each distinct box to one holder
 * (replicated state split about evenly), begins the checkpoint's temporary directory, and after
 * every rank has written its pieces into its own data files there (data/rNNNNN-*.ckd), checks
 * that replicas agree (the other holders' hashes against the writer's block checksums:
 * diverging replicas fail every rank, nothing published), merges their partial manifests,
 * writes the manifest and publishes atomically. Metadata is taken from rank 0 only (other ranks' meta arguments are
 * ignored; pass n_meta 0 there).
 *
 * Every rank returns the same result: 0, or the same error code with ckptio_last_error()
 * reading "rank R of N: <message>" (R the first failing rank). A rank that fails or dies makes
 * every surviving rank fail within about `timeout` seconds per step (> 0) — never a hang;
 * nothing is published and what was at `path` is intact; the coordinator removes the temporary
 * directory (or, if the coordinator died, the next save does). `out` (may be NULL) gets this
 * rank's own statistics: the bytes it wrote. The coordinator caches the plan while the
 * structure of what the ranks hold does not change. Since 0.2. */
CKPTIO_API int ckptio_save_dist(const char *path, const ckptio_comm *comm,
                                const ckptio_dist_item *items, size_t n,
                                const char *const *meta_keys, const void *const *meta_vals,
                                const size_t *meta_lens, size_t n_meta, const ckptio_params *p,
                                double timeout, ckptio_stats *out);

/* Take part in the ckptio_save_dist of `path` that the other ranks of `comm` are making, while
 * refusing it: this rank could not make its items, for the reason `code` (< 0) and `msg` (may
 * be NULL; a code >= 0 is taken as CKPTIO_E_USAGE). Collective, with the same path, params and
 * timeout as the others' calls. The plan fails on every rank before any byte is written: every
 * rank (this one too) returns the code of rank R, the lowest-numbered rank that refused or
 * failed, with ckptio_last_error() reading "rank R: <its msg>" and ckptio_last_error_info()
 * giving rank R (and CKPTIO_ERROR_REFUSED in flags when R refused). So a rank that cannot take
 * part makes the others fail at once, not at the timeout. Never returns 0. Since 0.3. */
CKPTIO_API int ckptio_save_dist_refuse(const char *path, const ckptio_comm *comm, int code,
                                       const char *msg, const ckptio_params *p, double timeout);

/* MPI, for C programs: include <ckptio_mpi.h> (which includes <mpi.h>) and link libckptio-mpi
 * (pkg-config ckptio-mpi), built when MPI was found at build time. ckptio.h never needs MPI. */
#endif /* CKPTIO_EXPERIMENTAL */

/* ------------------------------------------------------------------------------------------ */
/* Async saves: a pool of host buffers, snapshots into it, the write in the background.       */
/* Experimental: define CKPTIO_EXPERIMENTAL to use them. Since 0.3.                            */
/* ------------------------------------------------------------------------------------------ */
#if defined(CKPTIO_EXPERIMENTAL) || defined(CKPTIO_BUILDING)

/* An async save is two steps. ckptio_snapshot_take copies the caller's tensors (host memory,
 * or CUDA device memory: the device-to-host copy lands straight in the pool's buffer) into
 * host buffers of a pool and returns; from then on the caller may change its tensors. Then
 * ckptio_snapshot_commit_async (one process) or ckptio_snapshot_save_dist_async (several
 * ranks) writes the copies and commits on a thread of ckptio's, and gives the buffers back to
 * the pool when it is done, success or failure.
 *
 * The error rule. The take reports everything that happens during the call: invalid items,
 * no memory, a failed device copy, an I/O error while writing what the cap could not hold;
 * then nothing is lent and nothing is started. ckptio_completion_wait reports everything after
 * it: the writes, checks, commit and publish. A save whose error nobody received from
 * ckptio_completion_wait (freed without waiting, or not yet waited for) has its error reported
 * once by the next ckptio_snapshot_take on the same pool, which then starts nothing and says
 * so; the checkpoint of the failed save was not written.
 *
 * One save in flight per pool: a take waits for the pool's save in flight first.
 *
 * Fork: a forked child inherits no save. In the child, a completion started by the parent
 * reports CKPTIO_E_STATE at once ("belongs to the parent process") and is not reported by the
 * child's next take; its free neither waits for the parent's thread nor touches its writer;
 * buffers the parent had lent belong to no pool in the child; the pool's copy threads are
 * started anew; pinned memory is not used in the child (the CUDA driver does not survive a
 * fork), plain idle buffers are reused. A child may take snapshots and save as any process. */

/* A pool of host buffers, each of exactly the size of a tensor it holds a copy of, aligned to
 * ckptio_alignment(), faulted in once when made and reused by size by later snapshots, so a
 * save of the same state allocates nothing the second time. It never holds more than its cap:
 * idle buffers of sizes a snapshot does not reuse are freed before new ones are made.
 *
 * Thread safety: a pool, and the snapshots and completions made from it, are used by one
 * thread at a time, except ckptio_pool_stats, ckptio_completion_wait and
 * ckptio_completion_done, which any thread may call at any time. */
typedef struct ckptio_pool ckptio_pool;

/* How a pool is made. Initialize with ckptio_pool_params_init(). `size` as for ckptio_params. */
typedef struct ckptio_pool_params {
    uint32_t size;         /* sizeof(ckptio_pool_params), set by ckptio_pool_params_init */
    int pinned;            /* enum ckptio_switch. AUTO: page-locked (cuMemHostAlloc) when the
                            * CUDA driver loads and reports a device, plain otherwise, and plain
                            * from the first host copy's buffer the driver refuses on (it makes
                            * the process's CUDA context: pass OFF for host-only saves on a GPU
                            * host); ON: page-locked or fail; OFF: plain memory. Device tensors
                            * are copied into page-locked buffers only; with plain buffers they
                            * are written through the writer during the take. */
    uint64_t max_bytes;    /* the cap; 0 = a quarter of physical memory. */
    uint32_t copy_threads; /* threads that copy host tensors, the caller's included; 0 = 2 */
    uint32_t reserved;
} ckptio_pool_params;

/* Fill `p` with defaults. Since 0.3. */
CKPTIO_API void ckptio_pool_params_init(ckptio_pool_params *p);
/* Make a pool (no buffer yet). `p` may be NULL (defaults). ON without a usable CUDA device is
 * CKPTIO_E_UNSUPPORTED. Free with ckptio_pool_free(). Since 0.3. */
CKPTIO_API int ckptio_pool_new(ckptio_pool **out, const ckptio_pool_params *p);
/* Change the cap for the next snapshots (0: the default). Idle buffers over it are freed at
 * the next take; buffers lent are never taken back. Since 0.3. */
CKPTIO_API int ckptio_pool_set_max_bytes(ckptio_pool *pool, uint64_t max_bytes);
/* Free every idle buffer (buffers lent to a snapshot or a save in flight are kept); returns
 * the bytes freed. Since 0.3. */
CKPTIO_API uint64_t ckptio_pool_release(ckptio_pool *pool);

/* A pool's accounting. `size` = sizeof(ckptio_pool_usage), set by the caller. Since 0.3. */
typedef struct ckptio_pool_usage {
    uint32_t size;
    uint32_t pinned;       /* 1 if buffers made from now on are page-locked, 0 if plain */
    uint64_t max_bytes;    /* the cap */
    uint64_t held;         /* bytes of every buffer the pool owns, lent or idle: at most
                            * max_bytes (after a lower cap, once the next take has run and
                            * the buffers lent before it are back) */
    uint64_t lent;         /* of which lent to snapshots (saves not yet done) */
    uint64_t pinned_bytes; /* of `held`, page-locked */
    uint64_t buffers;      /* buffers held */
    uint64_t allocations;  /* buffers made since the pool was made */
    char reason[160];      /* why buffers are plain, or "" */
} ckptio_pool_usage;
/* The pool's accounting into `out` (fields past out->size left alone). Thread-safe. Since
 * 0.3. */
CKPTIO_API int ckptio_pool_stats(const ckptio_pool *pool, ckptio_pool_usage *out);
/* Free the idle buffers and the pool; snapshots and saves made from it keep it alive until
 * they are freed. Accepts NULL. Since 0.3. */
CKPTIO_API void ckptio_pool_free(ckptio_pool *pool);

/* A copy of a set of tensors in a pool's buffers: the items given to ckptio_snapshot_take,
 * re-pointed at host copies. Owned by the caller until handed to a background save. Since
 * 0.3. */
typedef struct ckptio_snapshot ckptio_snapshot;

/* Copy `n` items (see ckptio_dist_item: a box of a global tensor; CKPTIO_MEM_CUDA items are
 * copied on the item's stream, after the work queued on it before the call) into `pool`'s
 * buffers, on the pool's copy threads, and return once every copy is complete: the caller's
 * tensors may change at once. First waits for the pool's save in flight (see the error rule).
 *
 * What does not fit under the cap (less what other snapshots of the pool hold) is written
 * through `w` during the call (ckptio_writer_add_mem, then flushed): an item of which at least
 * 1 MiB fits is split along its first dimension, the rows that fit copied, the others written
 * now as a chunk of their own. `w` is then the writer that ckptio_snapshot_commit_async must
 * commit. Without `w` (NULL, a multi-rank save) nothing is split or written: items that do not
 * all fit fail with CKPTIO_E_LIMIT, nothing lent, and the caller saves during the call. The
 * writer's own staging memory is not counted: open it with a small staging_bytes.
 *
 * Strings and arrays of the items are copied; zero-byte items are kept. On failure *out is
 * NULL, the pool lends nothing more than before, and `w` may be poisoned (an I/O error).
 * Since 0.3. */
CKPTIO_API int ckptio_snapshot_take(ckptio_snapshot **out, ckptio_pool *pool,
                                    const ckptio_dist_item *items, size_t n, ckptio_writer *w);
/* The snapshot's items (host memory, sizeof(ckptio_dist_item) each): the copied ones, and the
 * copied heads of split ones; what was written during the take is not among them. Valid while
 * the snapshot lives. Since 0.3. */
CKPTIO_API int ckptio_snapshot_items(const ckptio_snapshot *s, const ckptio_dist_item **items,
                                     size_t *n);

/* What a take did. `size` = sizeof(ckptio_take_stats), set by the caller. Since 0.3. */
typedef struct ckptio_take_stats {
    uint32_t size;
    uint32_t split;         /* items split between a copy and a write */
    uint64_t copied_bytes;  /* bytes copied into the pool's buffers */
    uint64_t device_bytes;  /* of which from device memory */
    uint64_t written_bytes; /* bytes written through the writer during the take */
    uint64_t allocations;   /* buffers the pool had to make for this take */
    double seconds;         /* the take's wall time */
} ckptio_take_stats;
CKPTIO_API int ckptio_snapshot_stats(const ckptio_snapshot *s, ckptio_take_stats *out);
/* Give the buffers back to the pool and free. Accepts NULL. Since 0.3. */
CKPTIO_API void ckptio_snapshot_free(ckptio_snapshot *s);

/* Add the snapshot's items to `w` (the writer given to the take, or any open writer when
 * everything fit) and commit it, on a thread of ckptio's (ckptio_writer_commit_async). On
 * success the completion owns `s` and `w`: the buffers go back to the pool when the commit
 * is done, before wait returns. Set metadata on `w` before the call. On failure nothing was
 * started and `s` and `w` are still the caller's. Since 0.3. */
CKPTIO_API int ckptio_snapshot_commit_async(ckptio_snapshot *s, ckptio_writer *w,
                                            ckptio_completion **out);
/* ckptio_save_dist of the snapshot's items on a thread of ckptio's: collective, as
 * ckptio_save_dist. `path`, the metadata and `p` are copied; `comm` is used from that thread
 * and must outlive the completion (one thread at a time: give it a communicator the caller's
 * other threads do not use). On success the completion owns `s`; ckptio_completion_stats gives
 * this rank's statistics. On failure nothing was started and `s` is still the caller's.
 * Since 0.3. */
CKPTIO_API int ckptio_snapshot_save_dist_async(ckptio_snapshot *s, const char *path,
                                               const ckptio_comm *comm,
                                               const char *const *meta_keys,
                                               const void *const *meta_vals,
                                               const size_t *meta_lens, size_t n_meta,
                                               const ckptio_params *p, double timeout,
                                               ckptio_completion **out);

/* One record of a zip archive written from a snapshot (ckptio_snapshot_zip_async): with `data`
 * set, its `len` bytes (copied by the call: a pickle, a version string); with `data` NULL, the
 * bytes of the snapshot's item number `item` (ckptio_snapshot_items' order, which is the
 * take's when nothing was split; `len` is ignored). `align` and `flags` as for
 * ckptio_zip_writer_add. `size` = sizeof(ckptio_zip_record). Since 0.3. */
typedef struct ckptio_zip_record {
    uint32_t size;
    uint32_t flags;
    const char *name;
    const void *data;
    uint64_t len;
    uint64_t item;
    uint32_t align;
    uint32_t reserved;
} ckptio_zip_record;

/* Write the `n` records, in order, to the open zip writer `z` and commit it
 * (ckptio_zip_writer_commit), on a thread of ckptio's: a torch.save archive of a snapshot
 * written in the background, its CRC-32s computed alongside. The records are checked and
 * their names and bytes copied before the call returns. On success the completion owns `s`
 * and `z` (the buffers go back to the pool when the commit is done, before wait returns;
 * ckptio_completion_stats gives the zip writer's statistics). On failure nothing was started,
 * and `s` and `z` are still the caller's. Take the snapshot without a writer: a record reads
 * a whole item. Since 0.3. */
CKPTIO_API int ckptio_snapshot_zip_async(ckptio_snapshot *s, ckptio_zip_writer *z,
                                         const ckptio_zip_record *records, size_t n,
                                         ckptio_completion **out);
#endif /* CKPTIO_EXPERIMENTAL */

/* ------------------------------------------------------------------------------------------ */
/* Mapped (lazy) loads. Experimental: define CKPTIO_EXPERIMENTAL to use them.                 */
/* ------------------------------------------------------------------------------------------ */
#if defined(CKPTIO_EXPERIMENTAL) || defined(CKPTIO_BUILDING)

/* A committed checkpoint whose data files are handed out for mmap(2), with the checks that a
 * reader makes as it reads, for bytes the caller reads through its own mapping. The mapper
 * holds the checkpoint's directory open from ckptio_mapper_open on, so every data file it
 * opens belongs to the manifest it read: a checkpoint replaced by a later save (a rename)
 * keeps its files alive for as long as they are open or mapped. Calls on one mapper are made
 * by one thread at a time. Since 0.3. */
typedef struct ckptio_mapper ckptio_mapper;

/* Open the checkpoint at directory `path` and read its manifest (checked as
 * ckptio_reader_open checks it). Tensors are indexed as a reader of the same checkpoint
 * indexes them (name order). */
CKPTIO_API int ckptio_mapper_open(ckptio_mapper **out, const char *path);
/* Release; mappings made from its descriptors stay valid. Accepts NULL. */
CKPTIO_API void ckptio_mapper_close(ckptio_mapper *m);
/* 1 if `path` names the directory the mapper opened, 0 if it names another (the checkpoint
 * was replaced in between: a reader opened on `path` meanwhile may have read another
 * manifest), or -errno. */
CKPTIO_API int ckptio_mapper_same(const ckptio_mapper *m, const char *path);
/* A striped checkpoint's stripes (see ckptio_reader_set_roots) are looked for in these `n`
 * directories first, then where the save recorded them; `n` = 0 goes back to the recorded
 * roots. Stripes are opened at once (an error is reported by the first ckptio_mapper_chunk
 * that needs the file). Call it before the first ckptio_mapper_chunk: after that it is
 * CKPTIO_E_STATE. Copies the strings. Since 0.3. */
CKPTIO_API int ckptio_mapper_set_roots(ckptio_mapper *m, const char *const *roots, size_t n);
/* Where chunk `chunk` of tensor `tensor` lies: *fd, a read-only descriptor of its data file
 * owned by the mapper (valid until close; dup it to keep it), at *file_offset, *stored_bytes
 * long. The file is opened on first need (not following links out of the checkpoint) and must
 * be at least as long as the manifest says: a shorter one is CKPTIO_E_CORRUPT, since touching
 * a mapping past the end of a file raises SIGBUS. */
CKPTIO_API int ckptio_mapper_chunk(ckptio_mapper *m, size_t tensor, size_t chunk, int *fd,
                                   uint64_t *file_offset, uint64_t *stored_bytes);
/* Check `len` bytes at `data` (a mapping of the chunk, or any copy of it) against the chunk's
 * stored checksums: 0 when they match or the checkpoint has none; CKPTIO_E_CHECKSUM naming the
 * tensor, the damaged bytes, the file and its offset; CKPTIO_E_SHAPE when len is not the
 * chunk's stored length. Reads `data` only. */
CKPTIO_API int ckptio_mapper_check(ckptio_mapper *m, size_t tensor, size_t chunk,
                                   const void *data, uint64_t len);
/* 0 if no data file opened so far has changed since it was opened (size, modification or
 * status change time); else CKPTIO_E_CORRUPT naming the first one that did: it was written
 * in place (ckptio never does so), and pages not yet touched through a private mapping may
 * show the new bytes. */
CKPTIO_API int ckptio_mapper_unchanged(ckptio_mapper *m);
CKPTIO_API const char *ckptio_mapper_errmsg(const ckptio_mapper *m);
#endif /* CKPTIO_EXPERIMENTAL */

/* ------------------------------------------------------------------------------------------ */
/* GPU memory. Experimental: define CKPTIO_EXPERIMENTAL to use them. doc/gpu.md               */
/* ------------------------------------------------------------------------------------------ */
#if defined(CKPTIO_EXPERIMENTAL) || defined(CKPTIO_BUILDING)

/* ckptio_writer_add() for a buffer in `memory` (enum ckptio_memory). For CKPTIO_MEM_CUDA,
 * `data` is a device pointer and `stream` the caller's CUstream (0: the legacy default
 * stream): the bytes are read after the work queued on that stream before the call. The call
 * returns once they are copied out of device memory (into pinned staging, or to the file
 * through GDS), so the device buffer may change at once; checksums are computed on the staged
 * host copy. Host memory used is bounded by params.gpu_staging_bytes, whatever the tensor's
 * size. A failing copy poisons the writer like a failing write: nothing is published. For
 * CKPTIO_MEM_HOST it is ckptio_writer_add() (stream ignored). Since 0.2. */
CKPTIO_API int ckptio_writer_add_mem(ckptio_writer *w, const char *name, int dtype, uint32_t ndim,
                                     const uint64_t *shape, const uint64_t *chunk_offset,
                                     const uint64_t *chunk_shape, const void *data,
                                     uint64_t nbytes, uint32_t memory, uint64_t stream);

/* Which way a handle's GPU bytes went. `size` = sizeof(ckptio_gpu_stats), set by the caller.
 * Since 0.2. */
typedef struct ckptio_gpu_stats {
    uint32_t size;
    uint32_t reserved;
    char path[16];          /* "none" (no GPU buffer yet), "staged", "gds" or "gds+staged" */
    uint64_t device_bytes;  /* bytes moved from or to GPU memory */
    uint64_t gds_bytes;     /* of which by cuFile straight between GPU memory and the file */
    uint64_t staging_bytes; /* pinned host memory held for the staging ring */
    char reason[256];       /* why GDS was not used (or not for every file), or "" */
} ckptio_gpu_stats;
CKPTIO_API int ckptio_writer_gpu_stats(const ckptio_writer *w, ckptio_gpu_stats *out);
CKPTIO_API int ckptio_reader_gpu_stats(const ckptio_reader *r, ckptio_gpu_stats *out);

/* Which path GPU buffers would take for files in directory `dir` (NULL: the current one) with
 * params `p` (may be NULL) and CKPTIO_GPU: CKPTIO_GPU_GDS, CKPTIO_GPU_STAGED, or CKPTIO_GPU_OFF
 * when GPU buffers would be refused; `why` (may be NULL) gets the reason. Loads the driver
 * (and cuFile) if need be. Since 0.2. */
CKPTIO_API int ckptio_gpu_probe(const char *dir, const ckptio_params *p, char *why, size_t len);

/* The route GPU buffers take, decided once for every front end: CKPTIO_GPU_GDS or
 * CKPTIO_GPU_STAGED (ckptio's own path: pass them as CKPTIO_MEM_CUDA); CKPTIO_GPU_OFF when the
 * caller should copy them to host memory itself, `why` saying why in a few words ("CKPTIO_GPU=off",
 * "gpu=off", or why no driver is usable under CKPTIO_GPU_AUTO); CKPTIO_E_UNSUPPORTED when GDS
 * or staged is asked for by name (CKPTIO_GPU or params.gpu) but no driver is usable, `why`
 * saying so; CKPTIO_E_USAGE for an invalid CKPTIO_GPU or params.gpu. `dir` and `p` as for
 * ckptio_gpu_probe (whose result is this one with CKPTIO_E_UNSUPPORTED reported as
 * CKPTIO_GPU_OFF). The answer can change only with CKPTIO_GPU, params.gpu or `dir`: the driver
 * is loaded once per process. Thread-safe. Since 0.3. */
CKPTIO_API int ckptio_gpu_route(const char *dir, const ckptio_params *p, char *why, size_t len);
#endif /* CKPTIO_EXPERIMENTAL */

/* ------------------------------------------------------------------------------------------ */
/* Errors as values. Experimental: define CKPTIO_EXPERIMENTAL to use them.                     */
/* ------------------------------------------------------------------------------------------ */
#if defined(CKPTIO_EXPERIMENTAL) || defined(CKPTIO_BUILDING)

#define CKPTIO_ERROR_NO_RANK (-1)               /* rank and other_rank: not known */
#define CKPTIO_ERROR_NO_OFFSET UINT64_MAX       /* offset: not known */
#define CKPTIO_ERROR_FILE_MAX 4096              /* bytes of `file`, with its NUL */
#define CKPTIO_ERROR_REFUSED 1u                 /* flags: `rank` refused to take part */

/* A failure as values, beside its message, for bindings that must not parse text: what the
 * failing site knew of where it happened. Fields it did not know are empty ("") or
 * CKPTIO_ERROR_NO_*. Set `size` to sizeof(ckptio_error_info) before asking; fields beyond a
 * smaller size are left alone, so the struct can grow. Since 0.3. */
typedef struct ckptio_error_info {
    uint32_t size;
    int32_t code;       /* the error returned (0: no failure recorded) */
    int32_t rank;       /* the rank to blame in a multi-rank save: the one that failed, refused,
                         * or (with other_rank) disagreed */
    int32_t other_rank; /* the rank it disagreed with (overlapping boxes, differing replicas,
                         * dtypes or shapes), or CKPTIO_ERROR_NO_RANK */
    uint32_t flags;     /* CKPTIO_ERROR_REFUSED: `rank` called ckptio_save_dist_refuse */
    uint32_t reserved;
    uint64_t offset;    /* byte offset in `file` where the trouble is (the damaged block of a
                         * checksum mismatch, the chunk of a truncated file) */
    char tensor[CKPTIO_MAX_NAME + 1]; /* the tensor's stored name ("<name>@rank<R>" for
                                       * rank-local state), NUL-terminated */
    char file[CKPTIO_ERROR_FILE_MAX]; /* the file involved, as a path (truncated to fit) */
} ckptio_error_info;

/* The calling thread's last failure (ckptio_last_error()) as values. 0, or CKPTIO_E_USAGE when
 * out is NULL or out->size is smaller than offsetof(ckptio_error_info, tensor). Thread-safe.
 * Since 0.3. */
CKPTIO_API int ckptio_last_error_info(ckptio_error_info *out);
/* A handle's last failure (its *_errmsg()) as values; same results. A completion has one once
 * it is done. Since 0.3. */
CKPTIO_API int ckptio_writer_error_info(const ckptio_writer *w, ckptio_error_info *out);
CKPTIO_API int ckptio_reader_error_info(const ckptio_reader *r, ckptio_error_info *out);
CKPTIO_API int ckptio_file_writer_error_info(const ckptio_file_writer *f, ckptio_error_info *out);
CKPTIO_API int ckptio_completion_error_info(const ckptio_completion *c, ckptio_error_info *out);
CKPTIO_API int ckptio_mapper_error_info(const ckptio_mapper *m, ckptio_error_info *out);
#endif /* CKPTIO_EXPERIMENTAL */

/* ------------------------------------------------------------------------------------------ */
/* Conversion between checkpoint formats. Experimental: define CKPTIO_EXPERIMENTAL to use them. */
/* Since 0.3.                                                                                  */
/* ------------------------------------------------------------------------------------------ */
#if defined(CKPTIO_EXPERIMENTAL) || defined(CKPTIO_BUILDING)

/* The formats a conversion reads and writes. ckptio, safetensors (one file) and hf (a Hugging
 * Face directory: model-0000K-of-0000N.safetensors shards and model.safetensors.index.json)
 * have sources and sinks built in; torch files and DCP directories come from the caller as an
 * external source or sink (Python's `python -m ckptio._convert` hands them in). */
enum {
    CKPTIO_CONVERT_AUTO = 0, /* detect (ckptio_convert_detect) */
    CKPTIO_CONVERT_CKPTIO = 1,
    CKPTIO_CONVERT_SAFETENSORS = 2,
    CKPTIO_CONVERT_HF = 3,
    CKPTIO_CONVERT_TORCH = 4,
    CKPTIO_CONVERT_DCP = 5,
};

/* One tensor of a conversion: its bytes are row-major, nbytes of them. */
typedef struct ckptio_convert_tensor {
    size_t size; /* sizeof(ckptio_convert_tensor) */
    const char *name;
    int dtype; /* CKPTIO_DT_* */
    uint32_t ndim;
    uint64_t shape[CKPTIO_MAX_NDIM];
    uint64_t nbytes;
} ckptio_convert_tensor;

/* One metadata value (bytes; text where the source has text). */
typedef struct ckptio_convert_meta {
    size_t size; /* sizeof(ckptio_convert_meta) */
    const char *key;
    const void *val;
    size_t len;
} ckptio_convert_meta;

/* A source the caller implements (a format only it can parse). Callbacks return 0 or a
 * negative code, are called from the thread that called ckptio_convert, one at a time. */
typedef struct ckptio_convert_source {
    size_t size; /* sizeof(ckptio_convert_source) */
    void *ctx;
    /* The tensors, in the order they are to be copied, and the metadata. The arrays and the
     * strings they point to are the source's and must live until ckptio_convert returns. */
    int (*list)(void *ctx, const ckptio_convert_tensor **tensors, size_t *n_tensors,
                const ckptio_convert_meta **meta, size_t *n_meta);
    /* Fill buf with bytes [offset, offset + len) of tensor `index`. */
    int (*read)(void *ctx, size_t index, uint64_t offset, void *buf, size_t len);
    /* Why the last call failed (may be NULL, or return NULL): it goes into the message. */
    const char *(*errmsg)(void *ctx);
} ckptio_convert_source;

/* A sink the caller implements. It writes into `tmp_path`, which the engine names beside the
 * destination and publishes by one rename once end() returned 0; nothing appears at the
 * destination otherwise. Callbacks as for a source. */
typedef struct ckptio_convert_sink {
    size_t size; /* sizeof(ckptio_convert_sink) */
    void *ctx;
    /* 1: the destination is a directory, which the engine creates at tmp_path before begin();
     * 0: a file, which the sink creates at tmp_path. */
    int is_dir;
    /* Everything that will be written (arrays live until end() or abort() returns). */
    int (*begin)(void *ctx, const ckptio_convert_tensor *tensors, size_t n_tensors,
                 const ckptio_convert_meta *meta, size_t n_meta, const char *tmp_path);
    /* Bytes [offset, offset + len) of tensor `index`: tensors in list order, each front to
     * back; buf lives until the call returns. */
    int (*write)(void *ctx, size_t index, uint64_t offset, const void *buf, size_t len);
    /* Every byte was written: finish tmp_path and make its files durable (fsync). */
    int (*end)(void *ctx);
    /* After begin() returned 0, when the conversion fails: stop; the engine removes tmp_path. */
    void (*abort)(void *ctx);
    const char *(*errmsg)(void *ctx);
} ckptio_convert_sink;

/* flags */
#define CKPTIO_CONVERT_PROGRESS 1u /* draw a live progress line on stderr when it is a terminal */

typedef struct ckptio_convert_args {
    size_t size; /* sizeof(ckptio_convert_args) */
    const char *src, *dst;
    int from, to;               /* CKPTIO_CONVERT_*; AUTO: detected */
    int overwrite;              /* replace an existing destination of the same kind (never an
                                 * unrelated file or directory) */
    uint64_t max_shard_bytes;   /* hf: the largest shard (a larger tensor gets one of its own);
                                 * 0: 5 GiB */
    uint64_t piece_bytes;       /* tensor bytes in flight (large tensors go in pieces of runs of
                                 * rows, small ones in batches); 0: 32 MiB; rounded down to a
                                 * multiple of 4096, at least 4096 */
    unsigned flags;             /* CKPTIO_CONVERT_PROGRESS */
    /* Called after each batch (may be NULL). */
    void (*progress)(void *ctx, uint64_t done, uint64_t total);
    void *progress_ctx;
    const ckptio_convert_source *source; /* NULL: the built-in one for `from` */
    const ckptio_convert_sink *sink;     /* NULL: the built-in one for `to` */
    /* Since 0.3 (a caller whose .size stops before it gets 0, none): how a ckptio destination
     * stores its tensors, an enum ckptio_compress (ckptio_params.compress; CKPTIO_COMPRESS
     * overrides it). Another destination format refuses anything but NONE (CKPTIO_E_USAGE). */
    int compress;
    /* Since 0.4 (a caller whose .size stops before them gets NULL, the environment's): the
     * settings of the stores src and dst are in (ckptio_store_opts), e.g. two S3-compatible
     * stores with their own endpoints and credentials. */
    const struct ckptio_store_opts *src_store, *dst_store;
} ckptio_convert_args;

/* What a conversion did. */
typedef struct ckptio_convert_result {
    size_t size; /* sizeof(ckptio_convert_result) */
    int from, to; /* the formats, as detected */
    size_t n_tensors;
    uint64_t nbytes;
} ckptio_convert_result;

/* Copy every tensor and the metadata of a->src into a new a->dst of another format, through a
 * buffer of a->piece_bytes (memory stays bounded whatever the size of the model). Nothing
 * appears at dst unless the whole conversion succeeds; an existing dst is replaced only with
 * a->overwrite, and only when it is of the destination's kind (a checkpoint, a safetensors file,
 * a Hugging Face or DCP directory, an empty directory, a file for torch). torch and DCP need an
 * external source or sink (else CKPTIO_E_UNSUPPORTED). Returns 0 and fills out (may be NULL),
 * or a negative code with ckptio_last_error() naming the file and the tensor and saying what to
 * do (a failing callback's code is returned as it is). Since 0.3. */
CKPTIO_API int ckptio_convert(const ckptio_convert_args *a, ckptio_convert_result *out);

/* The format of `path`: as a source (is_dst 0), from its contents (a ckptio manifest, a DCP
 * .metadata, a *.safetensors.index.json, a zip archive is torch, a safetensors header), else
 * its name; as a destination, from its name (.safetensors, .pt/.pth/.bin/.ckpt, .dcp), then
 * hf when `sharded`, then what an existing directory holds, else ckptio. Returns a
 * CKPTIO_CONVERT_* > 0, or CKPTIO_E_FORMAT (a source it cannot tell; "pass --from") or -errno
 * with ckptio_last_error(). Since 0.3. */
CKPTIO_API int ckptio_convert_detect(const char *path, int is_dst, int sharded);
/* "ckptio", "safetensors", "hf", "torch", "dcp"; NULL for another value. */
CKPTIO_API const char *ckptio_convert_format_name(int format);
/* The CKPTIO_CONVERT_* a name (or "st", "pt", "pytorch") stands for; CKPTIO_E_USAGE if none. */
CKPTIO_API int ckptio_convert_format_parse(const char *name);

#endif /* CKPTIO_EXPERIMENTAL */

/* ------------------------------------------------------------------------------------------ */
/* Environment                                                                                */
/* ------------------------------------------------------------------------------------------ */

/* What this build and system offer, for `ckptio doctor` and for logging. Writes a
 * human-readable multi-line report about directory `dir` (may be NULL: the current directory)
 * into buf (always NUL-terminated). Returns the length it needed, like snprintf. */
CKPTIO_API int ckptio_describe_system(const char *dir, char *buf, size_t len);

/* ------------------------------------------------------------------------------------------ */
/* Shared reads: several readers of one host loading the same bytes. Experimental: define     */
/* CKPTIO_EXPERIMENTAL to use them.                                                           */
/* ------------------------------------------------------------------------------------------ */
#if defined(CKPTIO_EXPERIMENTAL) || defined(CKPTIO_BUILDING)

#define CKPTIO_SHARE_PART_BYTES (32ull << 20) /* a part holds at least this many bytes */
#define CKPTIO_SHARE_MAX_ROUNDS 8u            /* parts per reader at most */

/* One part of a shared read: regions [first, first + count) of the caller's array. */
typedef struct ckptio_share_part {
    uint64_t first;
    uint64_t count; /* 0: the part holds no region's first byte and read nothing */
    uint64_t bytes; /* the bytes of its regions */
} ckptio_share_part;

/* This reader's place among `count` readers that read the same bytes, and what the read did.
 * Set `size` = sizeof(ckptio_share), `index` and `count`; `parts` may be NULL, else it has
 * room for `parts_cap` records (count * CKPTIO_SHARE_MAX_ROUNDS is always enough). Since 0.3. */
typedef struct ckptio_share {
    uint32_t size;
    uint32_t index;            /* 0 .. count - 1 */
    uint32_t count;            /* readers sharing the bytes, >= 1 */
    uint32_t rounds;           /* out: k, parts per reader */
    uint64_t start;            /* out: where the first part read starts, in bytes from the
                                * regions' first byte (their bytes counted in array order) */
    uint64_t n_parts;          /* out: count * rounds */
    ckptio_share_part *parts;  /* out: the first parts_cap parts, in the order they were read */
    uint64_t parts_cap;
} ckptio_share;

/* ckptio_reader_read of `n` regions in P = count x k parts (k up to CKPTIO_SHARE_MAX_ROUNDS,
 * parts of CKPTIO_SHARE_PART_BYTES or more, cut at equal byte offsets; a region belongs to the
 * part where its first byte lies), this reader reading parts index, index + 1, ... wrapping
 * around, each part planned and read on its own. Open the reader with buffered reads
 * (ckptio_params.direct off): at each step the readers are on neighbouring parts, the one ahead
 * bringing a part into the page cache while the others copy parts already there, so each byte
 * comes off the device about once and the device reads overlap the copies. Every region is
 * checked before any byte is read. Returns as ckptio_reader_read does; share->rounds, start and
 * n_parts are set once the regions are checked, parts as each is read. Since 0.3. */
CKPTIO_API int ckptio_reader_read_shared(ckptio_reader *r, const ckptio_region *regions, size_t n,
                                         ckptio_share *share);

/* ------------------------------------------------------------------------------------------ */
/* Destinations the reader chooses. Experimental.                                             */

#define CKPTIO_NO_BLOCK UINT32_MAX /* ckptio_landing.block of a region of no bytes */

/* Memory allocated by ckptio_reader_place: `len` bytes at `base` (aligned to
 * ckptio_alignment(), usable up to the next multiple of it). Free it with ckptio_block_free. */
typedef struct ckptio_block {
    void *base;
    uint64_t len;
} ckptio_block;

/* Where a region lands: set each region's dst = blocks[block].base + at, and its capacity and
 * lead to these, then read. `size` = sizeof(ckptio_landing), set by the caller in out[0]. */
typedef struct ckptio_landing {
    uint32_t size;
    uint32_t block;    /* index in *blocks, or CKPTIO_NO_BLOCK for a region of no bytes */
    uint64_t at;       /* offset of the region's first byte in the block */
    uint64_t capacity; /* bytes from there the read may use */
    uint64_t lead;     /* bytes before there the read may overwrite */
} ckptio_landing;

/* Choose and allocate memory for `n` regions (dst, capacity and lead ignored), checked as
 * ckptio_reader_read checks them, so that the read lands in it without a copy: a region of
 * 4096 bytes or more gets a block of its own, its capacity rounded up to the alignment; a
 * whole tensor stored at an offset off the alignment (a stock safetensors file) gets `lead`
 * bytes before it, the distance to the boundary below, where its elements stay aligned;
 * smaller regions share blocks of 4 MiB at 64-byte alignment. On success *blocks (free() it)
 * holds *n_blocks blocks, each the caller's to free with ckptio_block_free; on failure nothing
 * is left allocated. Since 0.3. */
CKPTIO_API int ckptio_reader_place(ckptio_reader *r, const ckptio_region *regions, size_t n,
                                   ckptio_landing *out, ckptio_block **blocks, size_t *n_blocks);
CKPTIO_API void ckptio_block_free(void *base); /* accepts NULL */
/* The same choice for `n` byte ranges of a file that ckptio_file_read will read (their `dst`
 * ignored): a range of 4096 bytes or more gets a block of its own with `lead` bytes before it,
 * its file offset's distance from the alignment below, so a direct read lands in place; smaller
 * ranges share blocks of 4 MiB at 64-byte alignment. Set each range's dst to blocks[block].base
 * + at, then read. On success *blocks (free() it) holds *n_blocks blocks, each the caller's to
 * free with ckptio_block_free; on failure nothing is left allocated. Since 0.3. */
CKPTIO_API int ckptio_file_place(const ckptio_range *ranges, size_t n, ckptio_landing *out,
                                 ckptio_block **blocks, size_t *n_blocks);
#endif /* CKPTIO_EXPERIMENTAL */

/* ------------------------------------------------------------------------------------------ */
/* Incremental checkpoints. Experimental: define CKPTIO_EXPERIMENTAL to use them.             */
/* ------------------------------------------------------------------------------------------ */
#if defined(CKPTIO_EXPERIMENTAL) || defined(CKPTIO_BUILDING)

/* The base of a delta checkpoint (saved with ckptio_params.base) as recorded: a path relative
 * to the checkpoint's directory; NULL for a checkpoint without one. Valid while r is open.
 * Since 0.3. */
CKPTIO_API const char *ckptio_reader_base(const ckptio_reader *r);

#endif /* CKPTIO_EXPERIMENTAL */

/* ------------------------------------------------------------------------------------------ */
/* Checkpoints in object stores. Experimental: define CKPTIO_EXPERIMENTAL to use them.        */
/* ------------------------------------------------------------------------------------------ */
/* Wherever a checkpoint path goes (ckptio_writer_open, ckptio_reader_open, the multi-rank and
 * async saves), "s3://bucket/key" names a checkpoint in an S3-compatible store: the object
 * key/manifest, written last by a conditional PUT, and data objects under key/d-<save>/.
 * Credentials, region and endpoint come from the AWS_* variables (doc/s3.md). */
#if defined(CKPTIO_EXPERIMENTAL) || defined(CKPTIO_BUILDING)

/* Called with each checkpoint's name; a non-zero return stops the listing and is returned. */
typedef int (*ckptio_list_cb)(void *ctx, const char *name);
/* The committed checkpoints directly under `prefix` (a directory, or "s3://bucket/prefix"):
 * the names of its entries that hold a manifest, in byte order. A prefix that does not exist
 * holds none. Since 0.3. */
CKPTIO_API int ckptio_list_checkpoints(const char *prefix, ckptio_list_cb cb, void *ctx);
/* Remove the checkpoint at `path` (a directory or an s3:// URL; CKPTIO_E_NOT_CHECKPOINT when
 * it holds no manifest). In an object store the manifest goes first, so the checkpoint
 * disappears whole; its data objects and unfinished uploads follow. Since 0.3. */
CKPTIO_API int ckptio_remove_checkpoint(const char *path);
/* Remove what killed saves and removals left directly under `prefix` (a directory, or
 * "s3://bucket/prefix") and no live save or removal still owns; the number removed, or a
 * negative code. A directory: the temporaries "<name>.tmp-<pid>.<n>" whose process is gone and
 * whose lock no one holds, and the trees "<name>.deleting-<pid>" of removals that died
 * midway (a live removal holds its lock); never a symlink, never a checkpoint. An object store:
 * under each checkpoint <prefix>/<name>, the data and unfinished uploads of saves that began
 * before its manifest was last written and that it does not name (they can no longer commit);
 * a name with no manifest yet is left alone, since its first save may still be running. Each
 * save sweeps its own path as well; this is for the paths no save comes back to. Since 0.3. */
CKPTIO_API int ckptio_sweep(const char *prefix);
/* 1 when `path` (a directory or an s3:// URL) holds a committed checkpoint (its manifest), 0
 * when not, or a negative code when that cannot be told (no credentials, no server...). Since
 * 0.3. */
CKPTIO_API int ckptio_is_checkpoint(const char *path);
/* The kind of store that serves `path`: "posix" for a path without a scheme (a directory of
 * a local or mounted file system), "s3" for "s3://bucket/key". NULL for a "<scheme>://" no
 * store serves, with ckptio_last_error() naming the schemes there are. The one answer to
 * "is this a URL": bindings ask here. Since 0.3. */
CKPTIO_API const char *ckptio_store_name(const char *path);

/* Settings of an object store for the calls that are given them (ckptio_params.store, the
 * `_with` calls below), as boto3 and fsspec take them per client: a job may read from one
 * store and write to another, or change endpoint between calls. Named values (doc/s3.md):
 *   endpoint_url      "http[s]://host[:port]" of an S3-compatible store (path-style)
 *   region            the bucket's region
 *   profile           the profile of ~/.aws/config and ~/.aws/credentials to take credentials
 *                     and region from (the AWS_ACCESS_KEY_ID... variables are then not read)
 *   access_key_id, secret_access_key, session_token
 *                     static credentials (no other source is asked)
 *   ca_bundle         a PEM file of the certificate authorities to trust for https
 *   addressing_style  auto (default: path-style for a custom endpoint, virtual hosts on AWS),
 *                     path or virtual
 *   sts_endpoint_url  where role credentials (web identity, role_arn) are asked for
 *   credentials_file, token, project
 *                     the gs:// store's (doc/gcs.md): a credentials file (else
 *                     GOOGLE_APPLICATION_CREDENTIALS), a static OAuth2 access token, the project
 *   prefix_spread     "0" (default, else CKPTIO_PREFIX_SPREAD), "1" or "2": a save puts its data
 *                     objects under 16 or 256 prefixes of the checkpoint's parent,
 *                     <parent>/.ckptio-<hex>/<name>/..., for the request rate of many ranks
 *                     (doc/s3.md, "At scale"); loads need no setting
 * A setting not given is taken from the environment when the store is first used with these
 * settings, as the AWS SDKs would (AWS_ENDPOINT_URL_S3, AWS_REGION, AWS_PROFILE, AWS_CA_BUNDLE,
 * the credential chain); clients (connections, credentials) are kept per distinct setting and
 * environment. An unknown name, or a value a setting cannot take, is CKPTIO_E_USAGE; a NULL
 * value removes the setting. Options may be freed once the call they were given to returns.
 * Since 0.4. */
typedef struct ckptio_store_opts ckptio_store_opts;
CKPTIO_API int ckptio_store_opts_new(ckptio_store_opts **out);
CKPTIO_API int ckptio_store_opts_set(ckptio_store_opts *o, const char *key, const char *value);
CKPTIO_API void ckptio_store_opts_free(ckptio_store_opts *o); /* accepts NULL; wipes secrets */
/* The catalog calls above, with the store's settings (o NULL: as without). Since 0.4. */
CKPTIO_API int ckptio_list_checkpoints_with(const char *prefix, const ckptio_store_opts *o,
                                            ckptio_list_cb cb, void *ctx);
CKPTIO_API int ckptio_remove_checkpoint_with(const char *path, const ckptio_store_opts *o);
CKPTIO_API int ckptio_sweep_with(const char *prefix, const ckptio_store_opts *o);
CKPTIO_API int ckptio_is_checkpoint_with(const char *path, const ckptio_store_opts *o);
/* ckptio_reader_open on every rank of `comm` at once (collective): rank 0 reads the manifest
 * and sends its bytes to the others, which check them as if they had read them; in an object
 * store a job's load then asks for the manifest once, not once per rank. Rank 0's failure is
 * every rank's (the same code, its message). Since 0.4. */
CKPTIO_API int ckptio_reader_open_comm(ckptio_reader **out, const char *path,
                                       const ckptio_params *p, const ckptio_comm *comm,
                                       double timeout);

#endif /* CKPTIO_EXPERIMENTAL */

#ifdef __cplusplus
}
#endif
#endif /* CKPTIO_H */
