/* SPDX-License-Identifier: Apache-2.0 */
/* Small shared utilities: versions, dtypes, hashing, growable arrays, a string map, time. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common.h"

unsigned ckptio_version_number(void)
{
    return CKPTIO_VERSION_NUMBER;
}

#define CKPTIO__STR2(x) #x
#define CKPTIO__STR(x) CKPTIO__STR2(x)
const char *ckptio_version_string(void)
{
    return CKPTIO__STR(CKPTIO_VERSION_MAJOR) "." CKPTIO__STR(CKPTIO_VERSION_MINOR) "." CKPTIO__STR(
        CKPTIO_VERSION_PATCH);
}

unsigned ckptio_format_version(void)
{
    return CKPTIO_FORMAT_VERSION;
}

size_t ckptio_dtype_size(int dtype)
{
    switch (dtype) {
#define CKPTIO_X_SIZE(name, value, text, size) \
    case value: return size;
        CKPTIO_DTYPE_TABLE(CKPTIO_X_SIZE)
#undef CKPTIO_X_SIZE
    default: return 0;
    }
}

const char *ckptio_dtype_name(int dtype)
{
    switch (dtype) {
#define CKPTIO_X_NAME(name, value, text, size) \
    case value: return text;
        CKPTIO_DTYPE_TABLE(CKPTIO_X_NAME)
#undef CKPTIO_X_NAME
    default: return NULL;
    }
}

int ckptio_dtype_from_name(const char *name)
{
    if (!name) return CKPTIO_E_DTYPE;
#define CKPTIO_X_FIND(n, value, text, size) \
    if (!strcmp(name, text)) return value;
    CKPTIO_DTYPE_TABLE(CKPTIO_X_FIND)
#undef CKPTIO_X_FIND
    return CKPTIO_E_DTYPE;
}

size_t ckptio_alignment(void)
{
    return 4096;
}

bool ckptio__volume(const uint64_t *dims, uint32_t ndim, uint64_t elem, uint64_t *out)
{
    uint64_t v = elem;
    for (uint32_t i = 0; i < ndim; i++)
        if (!ckptio__mul(v, dims[i], &v)) return false;
    *out = v;
    return true;
}

void *ckptio__map(size_t len)
{
    if (len == 0) len = 1;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void ckptio__unmap(void *p, size_t len)
{
    if (len == 0) len = 1;
    if (p) munmap(p, len);
}

double ckptio__now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

bool ckptio__valid_name(const char *s, size_t len, size_t max)
{
    if (len == 0 || len > max) return false;
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        unsigned c = p[i];
        if (c == 0) return false;
        if (c < 0x80) {
            i++;
            continue;
        }
        unsigned n, min;
        uint32_t cp;
        if ((c & 0xE0) == 0xC0) n = 1, min = 0x80, cp = c & 0x1F;
        else if ((c & 0xF0) == 0xE0) n = 2, min = 0x800, cp = c & 0x0F;
        else if ((c & 0xF8) == 0xF0) n = 3, min = 0x10000, cp = c & 0x07;
        else return false;
        if (i + n >= len) return false; /* truncated sequence */
        for (unsigned k = 1; k <= n; k++) {
            if ((p[i + k] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += n + 1;
    }
    return true;
}

void ckptio__vec_init(ckptio__vec *v, size_t isize)
{
    v->items = NULL;
    v->len = v->cap = 0;
    v->isize = isize;
}

int64_t ckptio__vec_push(ckptio__vec *v, const void *src, size_t n)
{
    if (n == 0) return (int64_t)v->len;
    if (v->len + n > v->cap) {
        size_t cap = v->cap ? v->cap : 16;
        while (cap < v->len + n) {
            if (cap > SIZE_MAX / 2 / v->isize) return -ENOMEM;
            cap *= 2;
        }
        void *p = realloc(v->items, cap * v->isize);
        if (!p) return -ENOMEM;
        v->items = p;
        v->cap = cap;
    }
    uint8_t *dst = (uint8_t *)v->items + v->len * v->isize;
    if (src) memcpy(dst, src, n * v->isize);
    else memset(dst, 0, n * v->isize);
    size_t first = v->len;
    v->len += n;
    return (int64_t)first;
}

void ckptio__vec_free(ckptio__vec *v)
{
    free(v->items);
    v->items = NULL;
    v->len = v->cap = 0;
}

void ckptio__strmap_init(ckptio__strmap *m)
{
    m->slots = NULL;
    m->cap = m->len = 0;
}

static size_t strmap_find(const ckptio__map_slot *slots, size_t cap, const char *key,
                          uint32_t klen, uint32_t h)
{
    size_t i = h & (cap - 1);
    while (slots[i].key) {
        if (slots[i].hash32 == h && slots[i].klen == klen && !memcmp(slots[i].key, key, klen))
            return i;
        i = (i + 1) & (cap - 1);
    }
    return i;
}

static int strmap_grow(ckptio__strmap *m)
{
    size_t cap = m->cap ? m->cap * 2 : 64;
    ckptio__map_slot *s = calloc(cap, sizeof *s);
    if (!s) return -ENOMEM;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i].key) continue;
        size_t j = strmap_find(s, cap, m->slots[i].key, m->slots[i].klen, m->slots[i].hash32);
        s[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = s;
    m->cap = cap;
    return 0;
}

int ckptio__strmap_put(ckptio__strmap *m, const char *key, size_t klen, uint64_t *value)
{
    if ((m->len + 1) * 4 > m->cap * 3) CKPTIO__TRY(strmap_grow(m));
    uint32_t h = (uint32_t)XXH3_64bits(key, klen);
    size_t i = strmap_find(m->slots, m->cap, key, (uint32_t)klen, h);
    if (m->slots[i].key) {
        *value = m->slots[i].value;
        return 0;
    }
    m->slots[i] = (ckptio__map_slot){.key = key, .klen = (uint32_t)klen, .hash32 = h, .value = *value};
    m->len++;
    return 1;
}

int ckptio__strmap_get(const ckptio__strmap *m, const char *key, size_t klen, uint64_t *value)
{
    if (!m->cap) return 0;
    uint32_t h = (uint32_t)XXH3_64bits(key, klen);
    size_t i = strmap_find(m->slots, m->cap, key, (uint32_t)klen, h);
    if (!m->slots[i].key) return 0;
    *value = m->slots[i].value;
    return 1;
}

void ckptio__strmap_free(ckptio__strmap *m)
{
    free(m->slots);
    m->slots = NULL;
    m->cap = m->len = 0;
}

/* ---- byte buffers (ckptio.h) and name lists ---- */

int ckptio_bytes_resize(ckptio_bytes *b, size_t len)
{
    if (!b) return CKPTIO_E_USAGE;
    if (len > b->cap) {
        size_t cap = CKPTIO__MAX(len, b->cap + b->cap / 2);
        void *p = realloc(b->data, cap);
        if (!p) return -ENOMEM;
        b->data = p;
        b->cap = cap;
    }
    b->len = len;
    return 0;
}

int ckptio_bytes_set(ckptio_bytes *b, const void *src, size_t len)
{
    CKPTIO__TRY(ckptio_bytes_resize(b, len));
    if (len) memcpy(b->data, src, len);
    return 0;
}

void ckptio_bytes_free(ckptio_bytes *b)
{
    if (!b) return;
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

int ckptio__names_add(ckptio__names *ns, const char *s, size_t len)
{
    if (ns->n == ns->cap) {
        size_t cap = ns->cap ? 2 * ns->cap : 32;
        char **v = realloc(ns->v, cap * sizeof *v);
        if (!v) return -ENOMEM;
        ns->v = v;
        ns->cap = cap;
    }
    if (!(ns->v[ns->n] = strndup(s, len))) return -ENOMEM;
    ns->n++;
    return 0;
}

void ckptio__names_free(ckptio__names *ns)
{
    for (size_t i = 0; i < ns->n; i++) free(ns->v[i]);
    free(ns->v);
    *ns = (ckptio__names){0};
}

bool ckptio__forked(int owner)
{
    return owner != (int)getpid();
}
