/* SPDX-License-Identifier: Apache-2.0 */
/* Error codes, their names and texts, and the per-handle / per-thread messages. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common.h"

static _Thread_local char last_error[CKPTIO__MSG_LEN];

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
    const char *s = strerrordesc_np(-code);
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
    const char *s = strerrorname_np(-code);
    if (s) return s;
#endif
    return "EUNKNOWN";
}

const char *ckptio_last_error(void)
{
    return last_error;
}

int ckptio__vfail(ckptio__msg *m, int code, const char *fmt, va_list ap)
{
    char text[CKPTIO__MSG_LEN];
    int n = vsnprintf(text, sizeof text, fmt, ap);
    if (n < 0) text[0] = 0;
    /* Append the code's description unless the caller already ends with it. */
    size_t used = strlen(text);
    if (!strstr(text, ckptio_errname(code)) && used + 4 < sizeof text)
        snprintf(text + used, sizeof text - used, " (%s)", ckptio_errname(code));
    memcpy(last_error, text, sizeof text);
    if (m) memcpy(m->text, text, sizeof text);
    return code;
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
    if (m) m->text[0] = 0;
}

int ckptio__refail(ckptio__msg *dst, const ckptio__msg *src, int code, const char *fallback,
                   const char *fmt, ...)
{
    const char *text = src && src->text[0] ? src->text : fallback;
    if (!text) return code;
    char keep[CKPTIO__MSG_LEN], prefix[CKPTIO__MSG_LEN] = "";
    snprintf(keep, sizeof keep, "%s", text);
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(prefix, sizeof prefix, fmt, ap);
        va_end(ap);
    }
    return ckptio__fail(dst, code, "%s%s", prefix, keep);
}

int ckptio__handle_unusable(const ckptio__handle_state *h, ckptio__msg *m, const char *path)
{
    if (h->state == CKPTIO__H_FAILED)
        return ckptio__fail(m, h->err, "writer for '%s' failed earlier (%s); close it and save "
                            "again", path, ckptio_strerror(h->err));
    if (h->state != CKPTIO__H_OPEN)
        return ckptio__fail(m, CKPTIO_E_STATE,
                            "writer for '%s' was already committed; open a new writer", path);
    return 0;
}
