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

void ckptio__msg_clear(ckptio__msg *m)
{
    if (m) m->text[0] = 0;
}
