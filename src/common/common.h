/* SPDX-License-Identifier: Apache-2.0 */
/* Internal helpers shared by every layer: error idioms, messages, checked arithmetic, memory. */
#ifndef CKPTIO_COMMON_H
#define CKPTIO_COMMON_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckptio.h"

#define CKPTIO__HIDDEN __attribute__((visibility("hidden")))
#define CKPTIO__UNUSED(x) ((void)(x))
#define CKPTIO__LIKELY(x) __builtin_expect(!!(x), 1)
#define CKPTIO__UNLIKELY(x) __builtin_expect(!!(x), 0)
#define CKPTIO__MIN(a, b) ((a) < (b) ? (a) : (b))
#define CKPTIO__MAX(a, b) ((a) > (b) ? (a) : (b))

/* The one early-return idiom: every error path is a single line.
 *   CKPTIO__RET_IF(cond, code)  return code when cond holds
 *   CKPTIO__TRY(expr)           return expr's value when it is negative
 *   CKPTIO__GOTO_IF(cond, code) set rc = code and goto out (cleanup at one label)
 *   CKPTIO__CHECK(expr)         rc = expr; goto out when negative                  */
#define CKPTIO__RET_IF(cond, code)                                                             \
    do {                                                                                       \
        if (CKPTIO__UNLIKELY(cond)) return (code);                                             \
    } while (0)
#define CKPTIO__TRY(expr)                                                                      \
    do {                                                                                       \
        int ckptio__r_ = (int)(expr);                                                          \
        if (CKPTIO__UNLIKELY(ckptio__r_ < 0)) return ckptio__r_;                               \
    } while (0)
#define CKPTIO__GOTO_IF(cond, code)                                                            \
    do {                                                                                       \
        if (CKPTIO__UNLIKELY(cond)) {                                                          \
            rc = (code);                                                                       \
            goto out;                                                                          \
        }                                                                                      \
    } while (0)
#define CKPTIO__CHECK(expr)                                                                    \
    do {                                                                                       \
        rc = (int)(expr);                                                                      \
        if (CKPTIO__UNLIKELY(rc < 0)) goto out;                                                \
    } while (0)

/* Messages. Each handle owns a buffer; every failure is also copied to the calling thread's
 * last-error buffer so that failed constructors can explain themselves. */
#define CKPTIO__MSG_LEN 1024
typedef struct ckptio__msg {
    char text[CKPTIO__MSG_LEN];
    ckptio_error_info info; /* the same failure as values; info.code 0 until one is set */
} ckptio__msg;

/* Format the message into m (may be NULL) and the thread's last error; returns code so that
 * `return ckptio__fail(&h->msg, rc, "...")` reads naturally. The text should name the file,
 * tensor and offset involved and say what the user can do. */
CKPTIO__HIDDEN int ckptio__fail(ckptio__msg *m, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
CKPTIO__HIDDEN int ckptio__vfail(ckptio__msg *m, int code, const char *fmt, va_list ap);
/* ckptio__fail that also records, as values, where it happened: `where` (may be NULL) gives
 * rank, other_rank, offset, tensor and file; its code and size are ignored. */
CKPTIO__HIDDEN int ckptio__fail_info(ckptio__msg *m, int code, const ckptio_error_info *where,
                                     const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* ckptio__fail naming the tensor (may be NULL), the file "dir/file" (either may be NULL) and
 * the byte offset in it (CKPTIO_ERROR_NO_OFFSET: unknown): the reader's and writer's sites. */
CKPTIO__HIDDEN int ckptio__fail_at(ckptio__msg *m, int code, const char *tensor, const char *dir,
                                   const char *file, uint64_t offset, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
/* Fill in what m's last failure (and so the thread's last error, which holds the same) did not
 * yet name: the tensor, the file "dir/file" and the offset (arguments as for ckptio__fail_at).
 * For a public entry point that knows the tensor its inner layers failed on. No-op if m has no
 * failure. */
CKPTIO__HIDDEN void ckptio__msg_name(ckptio__msg *m, const char *tensor, const char *dir,
                                     const char *file, uint64_t offset);
/* Copy the thread's last error (text and values) into out, to raise it again later with
 * ckptio__refail after calls that may overwrite it. */
CKPTIO__HIDDEN void ckptio__msg_last(ckptio__msg *out);
/* Set info to "no failure known" (code 0, no rank, no offset, empty names). */
CKPTIO__HIDDEN void ckptio__info_none(ckptio_error_info *info);
/* Copy m's failure (NULL: the thread's last error) into a caller's out, honouring out->size:
 * what ckptio_*_error_info() return. */
CKPTIO__HIDDEN int ckptio__msg_info(const ckptio__msg *m, ckptio_error_info *out,
                                    const char *who);
CKPTIO__HIDDEN void ckptio__msg_clear(ckptio__msg *m);
/* For the pure rooms (format/, dist/ plans) that report into a caller's buffer, not a handle:
 * format into err (errlen bytes; either may be 0/NULL) and return code. */
CKPTIO__HIDDEN int ckptio__errf(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Raise again, with `code`, what `src` says (or `fallback` where it says nothing; with neither,
 * nothing happens): after the printf-style prefix `fmt` when that is not NULL, the text goes to
 * the thread's last error and to `dst` (may be NULL). The text is copied first, so dst may be
 * src. A constructor that fails copies its handle's message (a struct copy), closes the handle,
 * then raises the copy, so that close can neither free nor overwrite it. Returns code. */
CKPTIO__HIDDEN int ckptio__refail(ckptio__msg *dst, const ckptio__msg *src, int code,
                                  const char *fallback, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* The life of a writer handle: open until committed, or failed for good with the first error
 * (a writer whose data may be incomplete must not publish). Every call checks it first. */
enum { CKPTIO__H_OPEN, CKPTIO__H_COMMITTED, CKPTIO__H_FAILED };
typedef struct ckptio__handle_state {
    int state; /* CKPTIO__H_*; zero (open) on a calloc'd handle */
    int err;   /* the poisoning error, once failed */
    int pid;   /* the process that opened it (ckptio__handle_init); 0: not recorded */
} ckptio__handle_state;
/* This process's id, kept by forksafe.c (updated in a forked child before anything runs). */
CKPTIO__HIDDEN extern int ckptio__pid;
/* Record the process opening the handle (forksafe.c: starts keeping ckptio__pid). */
CKPTIO__HIDDEN void ckptio__handle_init(ckptio__handle_state *h);
/* Fail the handle with `code` if it is still open (the first error sticks); returns code. */
static inline int ckptio__handle_poison(ckptio__handle_state *h, int code)
{
    if (h->state == CKPTIO__H_OPEN) {
        h->state = CKPTIO__H_FAILED;
        h->err = code;
    }
    return code;
}
/* 0 if the handle is open and this process's, else its error (CKPTIO_E_STATE once committed,
 * or in a child of the process that opened it, whose threads it uses) with a message in m
 * naming `path`. Inline: every add of a small tensor asks. */
CKPTIO__HIDDEN int ckptio__handle_unusable(const ckptio__handle_state *h, ckptio__msg *m,
                                           const char *path);
static inline int ckptio__handle_usable(const ckptio__handle_state *h, ckptio__msg *m,
                                        const char *path)
{
    return CKPTIO__LIKELY(h->state == CKPTIO__H_OPEN && (h->pid == ckptio__pid || !h->pid))
               ? 0
               : ckptio__handle_unusable(h, m, path);
}

/* Checked arithmetic: false on overflow. */
static inline bool ckptio__mul(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool ckptio__add(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}
static inline uint64_t ckptio__align_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) & ~(a - 1); /* a is a power of two */
}
static inline uint64_t ckptio__align_down(uint64_t v, uint64_t a)
{
    return v & ~(a - 1);
}
static inline bool ckptio__is_pow2(uint64_t v)
{
    return v && !(v & (v - 1));
}

/* Codec ids as recorded in a chunk's `codec` field (doc/format.md section 11): the low 8 bits
 * name how each block is coded; CKPTIO__CODEC_DELTA marks a chunk whose decoded blocks are
 * XORed with the same bytes of its base checkpoint. */
#define CKPTIO__CODEC_NONE 0u
#define CKPTIO__CODEC_ZSTD 1u
#define CKPTIO__CODEC_FLOAT 2u
#define CKPTIO__CODEC_ID(c) ((c) & 0xffu)
#define CKPTIO__CODEC_DELTA 0x100u

/* Product of dims times elem, false on overflow. ndim 0 gives elem (a scalar). */
CKPTIO__HIDDEN bool ckptio__volume(const uint64_t *dims, uint32_t ndim, uint64_t elem,
                                   uint64_t *out);

/* Page-aligned memory from mmap, for staging and test buffers. NULL on failure. */
CKPTIO__HIDDEN void *ckptio__map(size_t len);
CKPTIO__HIDDEN void ckptio__unmap(void *p, size_t len);

/* XXH3-64 of a buffer, and a streaming form for data that arrives in pieces. */
CKPTIO__HIDDEN uint64_t ckptio__hash(const void *p, size_t len);

/* Monotonic seconds. */
CKPTIO__HIDDEN double ckptio__now(void);

/* Valid UTF-8, no NUL, length 1..max. */
CKPTIO__HIDDEN bool ckptio__valid_name(const char *s, size_t len, size_t max);

/* Growable array of fixed-size items: `items` may move on push. */
typedef struct ckptio__vec {
    void *items;
    size_t len, cap, isize;
} ckptio__vec;
CKPTIO__HIDDEN void ckptio__vec_init(ckptio__vec *v, size_t isize);
/* Append n items (copied from src, or zeroed if src is NULL); returns index of the first or
 * -ENOMEM. */
CKPTIO__HIDDEN int64_t ckptio__vec_push(ckptio__vec *v, const void *src, size_t n);
CKPTIO__HIDDEN void ckptio__vec_free(ckptio__vec *v);
#define CKPTIO__VEC_AT(v, type, i) (&((type *)(v)->items)[i])

/* String -> u64 map (open addressing, keys are not copied: they must outlive the map). */
typedef struct ckptio__map_slot {
    const char *key;
    uint32_t klen;
    uint32_t hash32;
    uint64_t value;
} ckptio__map_slot;
typedef struct ckptio__strmap {
    ckptio__map_slot *slots;
    size_t cap, len;
} ckptio__strmap;
CKPTIO__HIDDEN void ckptio__strmap_init(ckptio__strmap *m);
/* Insert; returns 1 if inserted, 0 if the key existed (*value then holds the old value and the
 * map is unchanged), -ENOMEM. */
CKPTIO__HIDDEN int ckptio__strmap_put(ckptio__strmap *m, const char *key, size_t klen,
                                      uint64_t *value);
/* 1 and *value if found, else 0. */
CKPTIO__HIDDEN int ckptio__strmap_get(const ckptio__strmap *m, const char *key, size_t klen,
                                      uint64_t *value);
CKPTIO__HIDDEN void ckptio__strmap_free(ckptio__strmap *m);

/* Malloc'd names, grown by ckptio__names_add (a copy of s's first len bytes). */
typedef struct ckptio__names {
    char **v;
    size_t n, cap;
} ckptio__names;

CKPTIO__HIDDEN int ckptio__names_add(ckptio__names *ns, const char *s, size_t len);
CKPTIO__HIDDEN void ckptio__names_free(ckptio__names *ns);

/* Whether this process is a fork of the one whose pid is `owner`: the threads that process
 * started are not here, and what they share with it (descriptors, temporary directories, object
 * uploads) is its own. A handle the child inherited may only be closed there, and its close
 * then frees memory and nothing else. */
CKPTIO__HIDDEN bool ckptio__forked(int owner);

#endif
