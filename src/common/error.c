/* SPDX-License-Identifier: Apache-2.0 */
/* Error codes, their names and texts, and the per-handle / per-thread messages. */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static _Thread_local char last_error[CKPTIO__MSG_LEN];
/* The same failure as values; code 0 (zeroed) until this thread's first failure. */
static _Thread_local ckptio_error_info last_info;

const char *ckptio_strerror(int code)
{
    if (code >= 0) return "success";
    switch (code) {
#define CKPTIO_X_TEXT(name, value, text) \
    case value: return text;
        CKPTIO_ERROR_TABLE(CKPTIO_X_TEXT)
#undef CKPTIO_X_TEXT
    default: break;
    }
    /* strerror() is not guaranteed thread-safe; strerrordesc_np (glibc >= 2.32) is static. */
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
    const char *s = code > INT_MIN ? strerrordesc_np(-code) : NULL; /* -INT_MIN overflows */
    if (s) return s;
#endif
    return "unknown error";
}

const char *ckptio_errname(int code)
{
    if (code >= 0) return "OK";
    switch (code) {
#define CKPTIO_X_NAME(name, value, text) \
    case value: return "CKPTIO_E_" #name;
        CKPTIO_ERROR_TABLE(CKPTIO_X_NAME)
#undef CKPTIO_X_NAME
    default: break;
    }
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
    const char *s = code > INT_MIN ? strerrorname_np(-code) : NULL;
    if (s) return s;
#endif
    return "EUNKNOWN";
}

const char *ckptio_last_error(void)
{
    return last_error;
}

void ckptio__info_none(ckptio_error_info *info)
{
    info->size = sizeof *info;
    info->code = 0;
    info->rank = info->other_rank = CKPTIO_ERROR_NO_RANK;
    info->flags = info->reserved = 0;
    info->offset = CKPTIO_ERROR_NO_OFFSET;
    info->tensor[0] = info->file[0] = 0;
}

/* "dir/file", either part may be NULL; truncated to fit. */
static void set_file(ckptio_error_info *info, const char *dir, const char *file)
{
    if (dir && file)
        snprintf(info->file, sizeof info->file, "%s/%s", dir, file);
    else if (dir || file)
        snprintf(info->file, sizeof info->file, "%s", dir ? dir : file);
}

static int vfail_info(ckptio__msg *m, int code, const ckptio_error_info *where, const char *fmt,
                      va_list ap)
{
    char text[CKPTIO__MSG_LEN];
    int n = vsnprintf(text, sizeof text, fmt, ap);
    if (n < 0) text[0] = 0;
    /* Append the code's description unless the caller already ends with it. */
    size_t used = strlen(text);
    if (!strstr(text, ckptio_errname(code)) && used + 4 < sizeof text)
        snprintf(text + used, sizeof text - used, " (%s)", ckptio_errname(code));
    memcpy(last_error, text, sizeof text);
    /* where may be the thread's own last_info (a failure raised again): copy it first. */
    if (where && where != &last_info) last_info = *where;
    if (!where) ckptio__info_none(&last_info);
    last_info.size = sizeof last_info;
    last_info.code = code;
    if (m) {
        memcpy(m->text, text, sizeof text);
        m->info = last_info;
    }
    return code;
}

int ckptio__vfail(ckptio__msg *m, int code, const char *fmt, va_list ap)
{
    return vfail_info(m, code, NULL, fmt, ap);
}

int ckptio__fail_info(ckptio__msg *m, int code, const ckptio_error_info *where, const char *fmt,
                      ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail_info(m, code, where, fmt, ap);
    va_end(ap);
    return code;
}

int ckptio__fail_at(ckptio__msg *m, int code, const char *tensor, const char *dir,
                    const char *file, uint64_t offset, const char *fmt, ...)
{
    ckptio_error_info *where = malloc(sizeof *where); /* ~8 KiB: not on a worker's stack */
    if (where) {
        ckptio__info_none(where);
        if (tensor) snprintf(where->tensor, sizeof where->tensor, "%s", tensor);
        set_file(where, dir, file);
        where->offset = offset;
    }
    va_list ap;
    va_start(ap, fmt);
    vfail_info(m, code, where, fmt, ap);
    va_end(ap);
    free(where);
    return code;
}

void ckptio__msg_name(ckptio__msg *m, const char *tensor, const char *dir, const char *file,
                      uint64_t offset)
{
    if (!m || m->info.code == 0) return;
    ckptio_error_info *i = &m->info;
    if (tensor && !i->tensor[0]) snprintf(i->tensor, sizeof i->tensor, "%s", tensor);
    if (!i->file[0]) set_file(i, dir, file);
    if (i->offset == CKPTIO_ERROR_NO_OFFSET) i->offset = offset;
    if (last_info.code == i->code && strcmp(last_error, m->text) == 0) last_info = *i;
}

int ckptio__msg_info(const ckptio__msg *m, ckptio_error_info *out, const char *who)
{
    if (!out || out->size < offsetof(ckptio_error_info, tensor))
        return ckptio__fail(NULL, CKPTIO_E_USAGE, "%s: out is NULL or out->size is not set",
                            who);
    const ckptio_error_info *src = m ? &m->info : &last_info;
    ckptio_error_info none;
    if (src->code == 0) {
        ckptio__info_none(&none);
        src = &none;
    }
    uint32_t size = out->size;
    memcpy(out, src, CKPTIO__MIN(size, sizeof *out));
    out->size = size;
    return 0;
}

void ckptio__msg_last(ckptio__msg *out)
{
    memcpy(out->text, last_error, sizeof out->text);
    out->info = last_info;
}

int ckptio_last_error_info(ckptio_error_info *out)
{
    return ckptio__msg_info(NULL, out, "ckptio_last_error_info");
}

int ckptio__fail(ckptio__msg *m, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ckptio__vfail(m, code, fmt, ap);
    va_end(ap);
    return code;
}

int ckptio__errf(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

void ckptio__msg_clear(ckptio__msg *m)
{
    if (m) {
        m->text[0] = 0;
        m->info.code = 0;
    }
}

int ckptio__refail(ckptio__msg *dst, const ckptio__msg *src, int code, const char *fallback,
                   const char *fmt, ...)
{
    const char *text = src && src->text[0] ? src->text : fallback;
    if (!text) return code;
    char keep[CKPTIO__MSG_LEN], prefix[CKPTIO__MSG_LEN] = "";
    snprintf(keep, sizeof keep, "%s", text);
    /* The values travel with the text: copied first, since dst may be src. */
    ckptio_error_info *where = src && src->text[0] && src->info.code ? malloc(sizeof *where) : NULL;
    if (where) *where = src->info;
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(prefix, sizeof prefix, fmt, ap);
        va_end(ap);
    }
    ckptio__fail_info(dst, code, where, "%s%s", prefix, keep);
    free(where);
    return code;
}

int ckptio__handle_unusable(const ckptio__handle_state *h, ckptio__msg *m, const char *path)
{
    if (h->pid && h->pid != ckptio__pid)
        return ckptio__fail(m, CKPTIO_E_STATE,
                            "the writer for '%s' belongs to process %d, which forked this one: "
                            "its threads are that process's, so here it can only be closed (the "
                            "parent's save goes on there); open a writer of this process's own",
                            path, h->pid);
    if (h->state == CKPTIO__H_FAILED)
        return ckptio__fail(m, h->err, "writer for '%s' failed earlier (%s); close it and save "
                            "again", path, ckptio_strerror(h->err));
    if (h->state != CKPTIO__H_OPEN)
        return ckptio__fail(m, CKPTIO_E_STATE,
                            "writer for '%s' was already committed; open a new writer", path);
    return 0;
}
