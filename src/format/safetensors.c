/* SPDX-License-Identifier: Apache-2.0 */
/* A strict reader of safetensors headers: fixed-shape JSON, bounds checked before allocation. */
#include "safetensors.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define U(x) ((unsigned long long)(x))
#define fail ckptio__errf /* report into the caller's err buffer (common/error.c) */
#define NAME_SHOWN 80

static const struct {
    const char *name;
    unsigned bits;
    int dt;
} st_types[CKPTIO__ST_COUNT] = {
    {NULL, 0, 0},
#define CKPTIO__ST_X_ROW(n, b, d) {#n, b, d},
    CKPTIO__ST_DTYPE_TABLE(CKPTIO__ST_X_ROW)
#undef CKPTIO__ST_X_ROW
};

const char *ckptio__st_dtype_name(int st)
{
    return st > 0 && st < CKPTIO__ST_COUNT ? st_types[st].name : NULL;
}

unsigned ckptio__st_dtype_bits(int st)
{
    return st > 0 && st < CKPTIO__ST_COUNT ? st_types[st].bits : 0;
}

int ckptio__st_dtype_ckptio(int st)
{
    return st > 0 && st < CKPTIO__ST_COUNT ? st_types[st].dt : 0;
}

/* ---- the reader ---------------------------------------------------------------------------- */

typedef struct rd {
    const uint8_t *p;
    uint64_t n, pos;
    ckptio__st_header *h;
    uint64_t cap_tensors, cap_meta, cap_dims, cap_str;
    const char *label; /* what is parsed, for messages: "safetensors header" */
    char *err;
    size_t errlen;
} rd;

/* Length of the valid UTF-8 prefix of s (RFC 3629: no overlongs, surrogates or > U+10FFFF). */
static uint64_t utf8_prefix(const uint8_t *s, uint64_t n)
{
    uint64_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        unsigned len;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF)
            len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else
            return i;
        if (n - i < len) return i;
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (unsigned k = 2; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80) return i;
        i += len;
    }
    return n;
}

static bool is_ws(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static void skip_ws(rd *r)
{
    while (r->pos < r->n && is_ws(r->p[r->pos])) r->pos++;
}

static int expect(rd *r, uint8_t c, const char *what)
{
    skip_ws(r);
    if (r->pos >= r->n)
        return fail(r->err, r->errlen, CKPTIO_E_CORRUPT,
                    "%s: expected '%c' (%s) at byte %llu, found the end", r->label, c, what,
                    U(r->pos));
    if (r->p[r->pos] != c)
        return fail(r->err, r->errlen, CKPTIO_E_CORRUPT,
                    "%s: expected '%c' (%s) at byte %llu, found '%c'", r->label, c, what,
                    U(r->pos), r->p[r->pos] >= 0x20 && r->p[r->pos] < 0x7F ? r->p[r->pos] : '?');
    r->pos++;
    return 0;
}

/* The next non-blank byte, or -1 at the end. */
static int peek(rd *r)
{
    skip_ws(r);
    return r->pos < r->n ? r->p[r->pos] : -1;
}

static int hex4(rd *r, uint64_t at, uint32_t *out)
{
    if (r->n - at < 4) return -1;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        uint8_t c = r->p[at + i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= c - '0';
        else if (c >= 'a' && c <= 'f')
            v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            v |= c - 'A' + 10;
        else
            return -1;
    }
    *out = v;
    return 0;
}

static void put_utf8(char *s, uint64_t *len, uint32_t cp)
{
    if (cp < 0x80) {
        s[(*len)++] = (char)cp;
    } else if (cp < 0x800) {
        s[(*len)++] = (char)(0xC0 | cp >> 6);
        s[(*len)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        s[(*len)++] = (char)(0xE0 | cp >> 12);
        s[(*len)++] = (char)(0x80 | (cp >> 6 & 0x3F));
        s[(*len)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        s[(*len)++] = (char)(0xF0 | cp >> 18);
        s[(*len)++] = (char)(0x80 | (cp >> 12 & 0x3F));
        s[(*len)++] = (char)(0x80 | (cp >> 6 & 0x3F));
        s[(*len)++] = (char)(0x80 | (cp & 0x3F));
    }
}

/* A JSON string, decoded into the string table (followed by a NUL). The input is already known
 * to be UTF-8, and a decoded string is never longer than its quoted form, so the table (sized
 * n + 1) cannot overflow. */
static int string(rd *r, uint64_t *off, uint64_t *len, const char *what)
{
    skip_ws(r);
    uint64_t start = r->pos;
    if (r->pos >= r->n || r->p[r->pos] != '"')
        return fail(r->err, r->errlen, CKPTIO_E_CORRUPT,
                    "%s: expected a string (%s) at byte %llu", r->label, what, U(start));
    r->pos++;
    char *s = r->h->strtab + r->h->strtab_len;
    uint64_t l = 0;
    for (;;) {
        if (r->pos >= r->n)
            return fail(r->err, r->errlen, CKPTIO_E_CORRUPT,
                        "%s: string at byte %llu (%s) is not closed", r->label, U(start),
                        what);
        uint8_t c = r->p[r->pos];
        if (c == '"') {
            r->pos++;
            break;
        }
        if (c < 0x20)
            return fail(r->err, r->errlen, CKPTIO_E_CORRUPT,
                        "%s: control byte 0x%02x inside a string at byte %llu",
                        r->label, c, U(r->pos));
        if (c != '\\') {
            s[l++] = (char)c;
            r->pos++;
            continue;
        }
        uint64_t at = r->pos;
        if (r->n - r->pos < 2) goto bad_escape;
        c = r->p[r->pos + 1];
        r->pos += 2;
        switch (c) {
        case '"': s[l++] = '"'; break;
        case '\\': s[l++] = '\\'; break;
        case '/': s[l++] = '/'; break;
        case 'b': s[l++] = '\b'; break;
        case 'f': s[l++] = '\f'; break;
        case 'n': s[l++] = '\n'; break;
        case 'r': s[l++] = '\r'; break;
        case 't': s[l++] = '\t'; break;
        case 'u': {
            uint32_t cp, lo;
            if (hex4(r, r->pos, &cp) < 0) goto bad_escape;
            r->pos += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF) goto bad_escape; /* a lone low surrogate */
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (r->n - r->pos < 6 || r->p[r->pos] != '\\' || r->p[r->pos + 1] != 'u' ||
                    hex4(r, r->pos + 2, &lo) < 0 || lo < 0xDC00 || lo > 0xDFFF)
                    goto bad_escape;
                r->pos += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            put_utf8(s, &l, cp);
            break;
        }
        default:
            goto bad_escape;
        }
        continue;
    bad_escape:
        return fail(r->err, r->errlen, CKPTIO_E_CORRUPT,
                    "%s: invalid escape at byte %llu (%s)", r->label, U(at), what);
    }
    s[l] = 0;
    *off = r->h->strtab_len;
    *len = l;
    r->h->strtab_len += l + 1;
    return 0;
}

/* A non-negative integer below 2^64: digits only, no leading zero. */
static int integer(rd *r, uint64_t *out, const char *what)
{
    skip_ws(r);
    uint64_t at = r->pos;
    if (at < r->n && r->p[at] == '-')
        return fail(r->err, r->errlen, CKPTIO_E_CORRUPT,
                    "safetensors header: %s at byte %llu is negative", what, U(at));
    uint64_t v = 0, digits = 0;
    while (r->pos < r->n && r->p[r->pos] >= '0' && r->p[r->pos] <= '9') {
        unsigned d = r->p[r->pos] - '0';
        if (v > (UINT64_MAX - d) / 10)
            return fail(r->err, r->errlen, CKPTIO_E_CORRUPT,
                        "safetensors header: %s at byte %llu does not fit in 64 bits", what,
                        U(at));
        v = v * 10 + d;
        r->pos++, digits++;
    }
    if (digits == 0)
        return fail(r->err, r->errlen, CKPTIO_E_CORRUPT,
                    "safetensors header: expected an integer (%s) at byte %llu", what, U(at));
    if (r->pos < r->n && (r->p[r->pos] == '.' || r->p[r->pos] == 'e' || r->p[r->pos] == 'E'))
        return fail(r->err, r->errlen, CKPTIO_E_CORRUPT,
                    "safetensors header: %s at byte %llu is not an integer", what, U(at));
    if (digits > 1 && r->p[at] == '0')
        return fail(r->err, r->errlen, CKPTIO_E_CORRUPT,
                    "safetensors header: %s at byte %llu has a leading zero", what, U(at));
    *out = v;
    return 0;
}

static bool key_is(const rd *r, uint64_t off, uint64_t len, const char *k)
{
    return len == strlen(k) && !memcmp(r->h->strtab + off, k, len);
}

/* Show a name clipped at a character boundary. */
static int shown(const char *s, uint64_t len)
{
    if (len <= NAME_SHOWN) return (int)len;
    size_t n = NAME_SHOWN;
    while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
    return (int)n;
}

#define TNAME(h, t) shown((h)->strtab + (t)->name, (t)->name_len), (h)->strtab + (t)->name

static int metadata(rd *r)
{
    int rc = expect(r, '{', "__metadata__ object");
    if (rc) return rc;
    if (peek(r) == '}') return r->pos++, 0;
    for (;;) {
        uint64_t ko, kl, vo, vl;
        if ((rc = string(r, &ko, &kl, "metadata key")) || (rc = expect(r, ':', "after a key")) ||
            (rc = string(r, &vo, &vl, "metadata value")))
            return rc;
        ckptio__st_header *h = r->h;
        if (h->n_meta == r->cap_meta || kl > UINT32_MAX)
            return fail(r->err, r->errlen, CKPTIO_E_CORRUPT,
                        "safetensors header: too many metadata entries");
        h->meta[h->n_meta++] = (ckptio__st_meta){ko, (uint32_t)kl, 0, vo, vl};
        int c = peek(r);
        if (c == ',') {
            r->pos++;
            continue;
        }
        return expect(r, '}', "end of __metadata__");
    }
}

static int dtype_of(const char *s, uint64_t len)
{
    for (int i = 1; i < CKPTIO__ST_COUNT; i++)
        if (strlen(st_types[i].name) == len && !memcmp(st_types[i].name, s, len)) return i;
    return 0;
}

static int tensor(rd *r, ckptio__st_tensor *t)
{
    ckptio__st_header *h = r->h;
    bool seen_dtype = false, seen_shape = false, seen_offsets = false;
    int rc = expect(r, '{', "tensor object");
    if (rc) return rc;
    if (peek(r) != '}')
        for (;;) {
            uint64_t ko, kl;
            uint64_t save = h->strtab_len;
            if ((rc = string(r, &ko, &kl, "tensor field")) || (rc = expect(r, ':', "after a key")))
                return rc;
            h->strtab_len = save; /* field names need not be kept */
            if (key_is(r, ko, kl, "dtype") && !seen_dtype) {
                uint64_t vo, vl;
                if ((rc = string(r, &vo, &vl, "dtype"))) return rc;
                h->strtab_len = save;
                t->st_dtype = (uint32_t)dtype_of(h->strtab + vo, vl);
                if (!t->st_dtype)
                    return fail(r->err, r->errlen, CKPTIO_E_DTYPE,
                                "safetensors header: tensor '%.*s': unknown dtype '%.*s'",
                                TNAME(h, t), shown(h->strtab + vo, vl), h->strtab + vo);
                t->dtype = ckptio__st_dtype_ckptio((int)t->st_dtype);
                seen_dtype = true;
            } else if (key_is(r, ko, kl, "shape") && !seen_shape) {
                if ((rc = expect(r, '[', "shape"))) return rc;
                t->dims = h->n_dims;
                if (peek(r) != ']')
                    for (;;) {
                        uint64_t d;
                        if ((rc = integer(r, &d, "a dimension"))) return rc;
                        if (h->n_dims == r->cap_dims)
                            return fail(r->err, r->errlen, CKPTIO_E_CORRUPT,
                                        "safetensors header: too many dimensions");
                        if (t->ndim == CKPTIO_MAX_NDIM)
                            return fail(r->err, r->errlen, CKPTIO_E_LIMIT,
                                        "safetensors header: tensor '%.*s' has more than %d "
                                        "dimensions",
                                        TNAME(h, t), CKPTIO_MAX_NDIM);
                        h->dims[h->n_dims++] = d;
                        t->ndim++;
                        if (peek(r) != ',') break;
                        r->pos++;
                    }
                if ((rc = expect(r, ']', "end of shape"))) return rc;
                seen_shape = true;
            } else if (key_is(r, ko, kl, "data_offsets") && !seen_offsets) {
                if ((rc = expect(r, '[', "data_offsets")) ||
                    (rc = integer(r, &t->begin, "data_offsets[0]")) ||
                    (rc = expect(r, ',', "between data_offsets")) ||
                    (rc = integer(r, &t->end, "data_offsets[1]")) ||
                    (rc = expect(r, ']', "end of data_offsets (two integers)")))
                    return rc;
                seen_offsets = true;
            } else {
                return fail(r->err, r->errlen, CKPTIO_E_CORRUPT,
                            "safetensors header: tensor '%.*s': unexpected or repeated field "
                            "'%.*s' at byte %llu",
                            TNAME(h, t), shown(h->strtab + ko, kl), h->strtab + ko, U(r->pos));
            }
            if (peek(r) != ',') break;
            r->pos++;
        }
    if ((rc = expect(r, '}', "end of tensor object"))) return rc;
    if (!seen_dtype || !seen_shape || !seen_offsets)
        return fail(r->err, r->errlen, CKPTIO_E_CORRUPT,
                    "safetensors header: tensor '%.*s' lacks \"%s\"", TNAME(h, t),
                    !seen_dtype ? "dtype" : !seen_shape ? "shape" : "data_offsets");
    return 0;
}

typedef struct by_name {
    const char *s;
    uint64_t len;
} by_name;

static int cmp_name(const void *a, const void *b)
{
    const by_name *x = a, *y = b;
    int c = memcmp(x->s, y->s, x->len < y->len ? x->len : y->len);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

static int cmp_offset(const void *a, const void *b)
{
    const ckptio__st_tensor *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return (x->name > y->name) - (x->name < y->name); /* strtab order = header order */
}

/* Sizes, names, and the tiling of the data section. */
static int check(rd *r, uint64_t data_len, by_name *names)
{
    ckptio__st_header *h = r->h;
    for (uint64_t i = 0; i < h->n_tensors; i++) {
        ckptio__st_tensor *t = &h->tensors[i];
        uint64_t count = 1;
        bool over = false;
        for (uint32_t k = 0; k < t->ndim; k++) {
            uint64_t d = h->dims[t->dims + k];
            if (d && count > UINT64_MAX / d) over = true;
            count *= d;
        }
        uint64_t bits = ckptio__st_dtype_bits((int)t->st_dtype);
        if (!over && count > UINT64_MAX / bits) over = true;
        uint64_t size = over ? 0 : count / 8 * bits + (count % 8 * bits + 7) / 8;
        if (t->end < t->begin)
            return fail(r->err, r->errlen, CKPTIO_E_CORRUPT,
                        "safetensors header: tensor '%.*s': data_offsets [%llu, %llu) end "
                        "before they begin",
                        TNAME(h, t), U(t->begin), U(t->end));
        if (t->end > data_len)
            return fail(r->err, r->errlen, CKPTIO_E_CORRUPT,
                        "safetensors header: tensor '%.*s': data_offsets [%llu, %llu) lie past "
                        "the end of the data (%llu bytes): the file is truncated or the header "
                        "wrong",
                        TNAME(h, t), U(t->begin), U(t->end), U(data_len));
        if (over || t->end - t->begin != size)
            return fail(r->err, r->errlen, CKPTIO_E_SHAPE,
                        "safetensors header: tensor '%.*s': data_offsets [%llu, %llu) hold %llu "
                        "bytes but %s of its shape needs %s%llu",
                        TNAME(h, t), U(t->begin), U(t->end), U(t->end - t->begin),
                        ckptio__st_dtype_name((int)t->st_dtype), over ? "more than " : "",
                        U(over ? UINT64_MAX : size));
        names[i] = (by_name){h->strtab + t->name, t->name_len};
    }
    if (h->n_tensors) qsort(names, h->n_tensors, sizeof *names, cmp_name);
    for (uint64_t i = 1; i < h->n_tensors; i++)
        if (!cmp_name(&names[i - 1], &names[i]))
            return fail(r->err, r->errlen, CKPTIO_E_DUPLICATE,
                        "safetensors header: tensor '%.*s' appears twice",
                        shown(names[i].s, names[i].len), names[i].s);
    /* Metadata keys unique: sorted in the same scratch, so a huge header costs n log n. */
    for (uint64_t i = 0; i < h->n_meta; i++)
        names[i] = (by_name){h->strtab + h->meta[i].key, h->meta[i].key_len};
    if (h->n_meta) qsort(names, h->n_meta, sizeof *names, cmp_name);
    for (uint64_t i = 1; i < h->n_meta; i++)
        if (!cmp_name(&names[i - 1], &names[i]))
            return fail(r->err, r->errlen, CKPTIO_E_DUPLICATE,
                        "safetensors header: metadata key '%.*s' appears twice",
                        shown(names[i].s, names[i].len), names[i].s);
    if (h->n_tensors) qsort(h->tensors, h->n_tensors, sizeof *h->tensors, cmp_offset);
    uint64_t at = 0;
    for (uint64_t i = 0; i < h->n_tensors; i++) {
        const ckptio__st_tensor *t = &h->tensors[i];
        if (t->begin > at)
            return fail(r->err, r->errlen, CKPTIO_E_CORRUPT,
                        "safetensors header: tensor '%.*s': data_offsets [%llu, %llu) leave a "
                        "gap [%llu, %llu) before them",
                        TNAME(h, t), U(t->begin), U(t->end), U(at), U(t->begin));
        if (t->begin < at) {
            const ckptio__st_tensor *o = &h->tensors[i - 1];
            return fail(r->err, r->errlen, CKPTIO_E_CORRUPT,
                        "safetensors header: tensor '%.*s': data_offsets [%llu, %llu) overlap "
                        "tensor '%.*s' [%llu, %llu)",
                        TNAME(h, t), U(t->begin), U(t->end), TNAME(h, o), U(o->begin),
                        U(o->end));
        }
        at = t->end;
    }
    if (at != data_len)
        return fail(r->err, r->errlen, CKPTIO_E_CORRUPT,
                    "safetensors header: the tensors end at data byte %llu but the file holds "
                    "%llu data bytes (%llu bytes unaccounted for at the end)",
                    U(at), U(data_len), U(data_len - at));
    return 0;
}

static int parse(rd *r)
{
    int rc = expect(r, '{', "the header object");
    if (rc) return rc;
    ckptio__st_header *h = r->h;
    bool seen_meta = false;
    if (peek(r) != '}')
        for (;;) {
            uint64_t ko, kl;
            if ((rc = string(r, &ko, &kl, "tensor name")) || (rc = expect(r, ':', "after a name")))
                return rc;
            if (key_is(r, ko, kl, "__metadata__")) {
                if (seen_meta)
                    return fail(r->err, r->errlen, CKPTIO_E_DUPLICATE,
                                "safetensors header: \"__metadata__\" appears twice");
                h->strtab_len = ko;
                if ((rc = metadata(r))) return rc;
                seen_meta = true;
            } else {
                if (memchr(h->strtab + ko, 0, kl))
                    return fail(r->err, r->errlen, CKPTIO_E_CORRUPT,
                                "safetensors header: a tensor name holds a NUL (before byte %llu)",
                                U(r->pos));
                if (h->n_tensors == r->cap_tensors || kl > UINT32_MAX)
                    return fail(r->err, r->errlen, CKPTIO_E_CORRUPT,
                                "safetensors header: too many tensors");
                ckptio__st_tensor *t = &h->tensors[h->n_tensors++];
                *t = (ckptio__st_tensor){.name = ko, .name_len = (uint32_t)kl};
                if ((rc = tensor(r, t))) return rc;
            }
            if (peek(r) != ',') break;
            r->pos++;
        }
    if ((rc = expect(r, '}', "end of the header object"))) return rc;
    for (uint64_t i = r->pos; i < r->n; i++)
        if (r->p[i] != ' ')
            return fail(r->err, r->errlen, CKPTIO_E_CORRUPT,
                        "safetensors header: byte %llu after the header object is not a space "
                        "padding",
                        U(i));
    return 0;
}

int ckptio__st_parse(const uint8_t *hdr, uint64_t n, uint64_t file_size, ckptio__st_header **out,
                     char *err, size_t errlen)
{
    *out = NULL;
    if (n > CKPTIO__ST_MAX_HEADER)
        return fail(err, errlen, CKPTIO_E_LIMIT,
                    "safetensors header length %llu exceeds %llu bytes: not a safetensors file?",
                    U(n), U(CKPTIO__ST_MAX_HEADER));
    if (file_size < 8 || n > file_size - 8)
        return fail(err, errlen, CKPTIO_E_CORRUPT,
                    "safetensors header length %llu exceeds the file (%llu bytes): truncated?",
                    U(n), U(file_size));
    if (n == 0 || hdr[0] != '{')
        return fail(err, errlen, CKPTIO_E_CORRUPT,
                    "safetensors header does not start with '{': not a safetensors file?");
    uint64_t ok = utf8_prefix(hdr, n);
    if (ok != n)
        return fail(err, errlen, CKPTIO_E_CORRUPT, "safetensors header is not UTF-8 at byte %llu",
                    U(ok));
    /* Upper bounds, so the one allocation stays near 14 n bytes at worst: every tensor takes at
     * least four ':' (name, dtype, shape, data_offsets) and 49 bytes
     * ("":{"dtype":"U8","shape":[],"data_offsets":[0,0]}), every metadata entry 5 ("":""),
     * every dimension 2 and is followed by ',' or ']'. The + 1 leaves room for the entry that
     * runs into the end, so a cut-off header fails on its syntax, never on these bounds. */
    uint64_t colons = 0, seps = 0;
    for (uint64_t i = 0; i < n; i++) {
        colons += hdr[i] == ':';
        seps += hdr[i] == ',' || hdr[i] == ']';
    }
    rd r = {.p = hdr, .n = n, .err = err, .errlen = errlen, .label = "safetensors header"};
    r.cap_tensors = (colons / 4 < n / 49 ? colons / 4 : n / 49) + 1;
    r.cap_meta = (colons < n / 5 ? colons : n / 5) + 1;
    r.cap_dims = (seps < n / 2 ? seps : n / 2) + 1;
    r.cap_str = n + 1;
    uint64_t cap_names = r.cap_tensors > r.cap_meta ? r.cap_tensors : r.cap_meta;
    uint64_t bytes = sizeof(ckptio__st_header) + r.cap_tensors * sizeof(ckptio__st_tensor) +
                     cap_names * sizeof(by_name) + r.cap_meta * sizeof(ckptio__st_meta) +
                     r.cap_dims * sizeof(uint64_t) + r.cap_str;
    uint8_t *a = calloc(1, (size_t)bytes);
    if (!a) return fail(err, errlen, -ENOMEM, "safetensors header: out of memory (%llu bytes)",
                        U(bytes));
    ckptio__st_header *h = (ckptio__st_header *)a;
    uint8_t *p = a + sizeof *h;
    h->tensors = (ckptio__st_tensor *)p, p += r.cap_tensors * sizeof(ckptio__st_tensor);
    by_name *names = (by_name *)p;
    p += cap_names * sizeof(by_name);
    h->meta = (ckptio__st_meta *)p, p += r.cap_meta * sizeof(ckptio__st_meta);
    h->dims = (uint64_t *)p, p += r.cap_dims * sizeof(uint64_t);
    h->strtab = (char *)p;
    h->size = sizeof *h;
    h->header_len = n;
    h->data_start = 8 + n;
    r.h = h;
    int rc = parse(&r);
    if (rc == 0) rc = check(&r, file_size - 8 - n, names);
    if (rc) {
        free(a);
        return rc;
    }
    *out = h;
    return 0;
}

void ckptio__st_free(ckptio__st_header *h)
{
    free(h);
}

/* ---- the index of a sharded save (model.safetensors.index.json) -------------------------- */

#define INDEX_DEPTH 64 /* nesting of the values skipped or kept as text */

/* A byte of a number or a literal (true, false, null). */
static bool token_byte(uint8_t c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || c == '+' || c == '-' || c == '.' ||
           c == 'E';
}

/* Skip one JSON value (strings are checked and decoded, then dropped from the table). */
static int skip_value(rd *r, unsigned depth)
{
    int c = peek(r), rc;
    if (depth > INDEX_DEPTH)
        return fail(r->err, r->errlen, CKPTIO_E_LIMIT,
                    "%s: values nested deeper than %u levels at byte %llu", r->label, INDEX_DEPTH,
                    U(r->pos));
    if (c == '"') {
        uint64_t mark = r->h->strtab_len, o, l;
        rc = string(r, &o, &l, "a value");
        r->h->strtab_len = mark;
        return rc;
    }
    if (c == '{' || c == '[') {
        uint8_t end = c == '{' ? '}' : ']';
        r->pos++;
        if (peek(r) == end) return r->pos++, 0;
        for (;;) {
            if (c == '{') {
                uint64_t mark = r->h->strtab_len, o, l;
                rc = string(r, &o, &l, "a key");
                r->h->strtab_len = mark;
                if (rc || (rc = expect(r, ':', "after a key"))) return rc;
            }
            if ((rc = skip_value(r, depth + 1))) return rc;
            if (peek(r) != ',') return expect(r, end, "end of an object or array");
            r->pos++;
        }
    }
    /* A number or a literal: its characters, then a check of which it is. */
    uint64_t at = r->pos;
    while (r->pos < r->n && token_byte(r->p[r->pos])) r->pos++;
    uint64_t len = r->pos - at;
    const char *t = (const char *)r->p + at;
    bool word = (len == 4 && (!memcmp(t, "true", 4) || !memcmp(t, "null", 4))) ||
                (len == 5 && !memcmp(t, "false", 5));
    bool number = len && (t[0] == '-' || (t[0] >= '0' && t[0] <= '9'));
    for (uint64_t i = 0; number && i < len; i++)
        number = !(t[i] >= 'a' && t[i] <= 'z' && t[i] != 'e');
    if (!word && !number)
        return fail(r->err, r->errlen, CKPTIO_E_CORRUPT, "%s: expected a value at byte %llu",
                    r->label, U(at));
    return 0;
}

/* "weight_map": {tensor: file, ...} into ix->map. */
static int weight_map(rd *r, ckptio__st_index *ix, uint64_t cap)
{
    int rc = expect(r, '{', "the weight_map object");
    if (rc) return rc;
    if (peek(r) == '}') return r->pos++, 0;
    for (;;) {
        uint64_t ko, kl, vo, vl;
        if ((rc = string(r, &ko, &kl, "tensor name")) || (rc = expect(r, ':', "after a name")) ||
            (rc = string(r, &vo, &vl, "file name")))
            return rc;
        if (ix->n_map == cap || kl > UINT32_MAX)
            return fail(r->err, r->errlen, CKPTIO_E_CORRUPT, "%s: too many entries", r->label);
        if (memchr(r->h->strtab + ko, 0, kl) || memchr(r->h->strtab + vo, 0, vl))
            return fail(r->err, r->errlen, CKPTIO_E_CORRUPT,
                        "%s: a weight_map entry holds a NUL (before byte %llu)", r->label,
                        U(r->pos));
        ix->map[ix->n_map++] = (ckptio__st_meta){ko, (uint32_t)kl, 0, vo, vl};
        if (peek(r) != ',') return expect(r, '}', "end of the weight_map");
        r->pos++;
    }
}

/* "metadata": {key: value, ...} into ix->meta: a string's value, or another value's text. */
static int index_meta(rd *r, ckptio__st_index *ix, uint64_t cap)
{
    int rc = expect(r, '{', "the metadata object");
    if (rc) return rc;
    if (peek(r) == '}') return r->pos++, 0;
    for (;;) {
        uint64_t ko, kl, vo, vl;
        if ((rc = string(r, &ko, &kl, "metadata key")) || (rc = expect(r, ':', "after a key")))
            return rc;
        if (peek(r) == '"') {
            if ((rc = string(r, &vo, &vl, "metadata value"))) return rc;
        } else {
            uint64_t at = (skip_ws(r), r->pos);
            if ((rc = skip_value(r, 1))) return rc;
            /* The raw text is no longer than the input it came from, as the table's bound
             * (input length + 1) assumes of every string. */
            vo = r->h->strtab_len;
            vl = r->pos - at;
            memcpy(r->h->strtab + vo, r->p + at, vl);
            r->h->strtab[vo + vl] = 0;
            r->h->strtab_len += vl + 1;
        }
        if (ix->n_meta == cap || kl > UINT32_MAX)
            return fail(r->err, r->errlen, CKPTIO_E_CORRUPT, "%s: too many entries", r->label);
        ix->meta[ix->n_meta++] = (ckptio__st_meta){ko, (uint32_t)kl, 0, vo, vl};
        if (peek(r) != ',') return expect(r, '}', "end of the metadata");
        r->pos++;
    }
}

static int parse_index(rd *r, ckptio__st_index *ix, uint64_t cap)
{
    int rc = expect(r, '{', "the index object");
    bool seen_map = false, seen_meta = false;
    if (rc) return rc;
    if (peek(r) != '}')
        for (;;) {
            uint64_t ko, kl;
            if ((rc = string(r, &ko, &kl, "a key")) || (rc = expect(r, ':', "after a key")))
                return rc;
            bool *seen = key_is(r, ko, kl, "weight_map") ? &seen_map
                         : key_is(r, ko, kl, "metadata") ? &seen_meta
                                                         : NULL;
            r->h->strtab_len = ko;
            if (seen && *seen)
                return fail(r->err, r->errlen, CKPTIO_E_DUPLICATE, "%s: \"%s\" appears twice",
                            r->label, seen == &seen_map ? "weight_map" : "metadata");
            if (seen == &seen_map) rc = weight_map(r, ix, cap);
            else if (seen == &seen_meta && peek(r) == '{') rc = index_meta(r, ix, cap);
            else rc = skip_value(r, 1);
            if (rc) return rc;
            if (seen) *seen = true;
            if (peek(r) != ',') break;
            r->pos++;
        }
    if ((rc = expect(r, '}', "end of the index object"))) return rc;
    if (peek(r) >= 0)
        return fail(r->err, r->errlen, CKPTIO_E_CORRUPT, "%s: bytes after the object at byte %llu",
                    r->label, U(r->pos));
    if (!seen_map)
        return fail(r->err, r->errlen, CKPTIO_E_CORRUPT, "%s: no weight_map object", r->label);
    return 0;
}

int ckptio__st_index_parse(const uint8_t *buf, uint64_t n, ckptio__st_index **out, char *err,
                           size_t errlen)
{
    *out = NULL;
    if (n > CKPTIO__ST_MAX_HEADER)
        return fail(err, errlen, CKPTIO_E_LIMIT, "index of %llu bytes exceeds %llu bytes", U(n),
                    U(CKPTIO__ST_MAX_HEADER));
    uint64_t ok = utf8_prefix(buf, n);
    if (ok != n)
        return fail(err, errlen, CKPTIO_E_CORRUPT, "index is not UTF-8 at byte %llu", U(ok));
    /* Every entry takes a ':' and at least 5 bytes ("":""). */
    uint64_t colons = 0;
    for (uint64_t i = 0; i < n; i++) colons += buf[i] == ':';
    uint64_t cap = (colons < n / 5 ? colons : n / 5) + 1;
    uint64_t bytes = sizeof(ckptio__st_index) + sizeof(ckptio__st_header) +
                     2 * cap * sizeof(ckptio__st_meta) + n + 1;
    uint8_t *a = calloc(1, (size_t)bytes);
    if (!a) return fail(err, errlen, -ENOMEM, "index: out of memory (%llu bytes)", U(bytes));
    ckptio__st_index *ix = (ckptio__st_index *)a;
    ckptio__st_header *h = (ckptio__st_header *)(a + sizeof *ix);
    ix->map = (ckptio__st_meta *)(a + sizeof *ix + sizeof *h);
    ix->meta = ix->map + cap;
    h->strtab = ix->strtab = (char *)(ix->meta + cap);
    rd r = {.p = buf, .n = n, .h = h, .err = err, .errlen = errlen, .label = "index"};
    int rc = parse_index(&r, ix, cap);
    if (rc) {
        free(a);
        return rc;
    }
    ix->strtab_len = h->strtab_len;
    *out = ix;
    return 0;
}

void ckptio__st_index_free(ckptio__st_index *ix)
{
    free(ix);
}

/* ---- the writer ---------------------------------------------------------------------------- */

/* Appends to buf when it is set, else only counts. */
typedef struct wr {
    uint8_t *buf;
    uint64_t len;
} wr;

static void put(wr *w, const char *s, size_t n)
{
    if (w->buf) memcpy(w->buf + w->len, s, n);
    w->len += n;
}

static void puts_(wr *w, const char *s)
{
    put(w, s, strlen(s));
}

static void put_u64(wr *w, uint64_t v)
{
    char d[24];
    int n = snprintf(d, sizeof d, "%llu", U(v));
    put(w, d, (size_t)n);
}

/* A JSON string: '"' and '\\' escaped, control bytes as \u00XX, everything else as is. */
static void put_str(wr *w, const char *s, uint64_t n)
{
    static const char hex[] = "0123456789abcdef";
    put(w, "\"", 1);
    for (uint64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            put(w, e, 2);
        } else if (c < 0x20) {
            char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            put(w, e, 6);
        } else {
            put(w, (const char *)&c, 1);
        }
    }
    put(w, "\"", 1);
}

static void put_json(wr *w, const ckptio__st_header *h)
{
    puts_(w, "{");
    if (h->n_meta) {
        puts_(w, "\"__metadata__\":{");
        for (uint64_t i = 0; i < h->n_meta; i++) {
            const ckptio__st_meta *m = &h->meta[i];
            if (i) puts_(w, ",");
            put_str(w, h->strtab + m->key, m->key_len);
            puts_(w, ":");
            put_str(w, h->strtab + m->val, m->val_len);
        }
        puts_(w, "}");
    }
    for (uint64_t i = 0; i < h->n_tensors; i++) {
        const ckptio__st_tensor *t = &h->tensors[i];
        if (i || h->n_meta) puts_(w, ",");
        put_str(w, h->strtab + t->name, t->name_len);
        puts_(w, ":{\"dtype\":\"");
        puts_(w, ckptio__st_dtype_name((int)t->st_dtype));
        puts_(w, "\",\"shape\":[");
        for (uint32_t k = 0; k < t->ndim; k++) {
            if (k) puts_(w, ",");
            put_u64(w, h->dims[t->dims + k]);
        }
        puts_(w, "],\"data_offsets\":[");
        put_u64(w, t->begin);
        puts_(w, ",");
        put_u64(w, t->end);
        puts_(w, "]}");
    }
    puts_(w, "}");
}

static bool utf8_ok(const char *s, uint64_t n)
{
    return utf8_prefix((const uint8_t *)s, n) == n;
}

int ckptio__st_encode(const ckptio__st_header *h, uint64_t align, uint8_t **out, uint64_t *len,
                      char *err, size_t errlen)
{
    *out = NULL;
    *len = 0;
    if (align == 0 || (align & (align - 1)) || align > (1u << 30))
        return fail(err, errlen, CKPTIO_E_USAGE,
                    "safetensors encode: alignment %llu is not a power of two up to 1 GiB",
                    U(align));
    for (uint64_t i = 0; i < h->n_tensors; i++) {
        const ckptio__st_tensor *t = &h->tensors[i];
        const char *name = h->strtab + t->name;
        if (!utf8_ok(name, t->name_len) || memchr(name, 0, t->name_len))
            return fail(err, errlen, CKPTIO_E_USAGE,
                        "safetensors encode: tensor %llu: name is not UTF-8 or holds a NUL", U(i));
        if (!ckptio__st_dtype_name((int)t->st_dtype) || t->ndim > CKPTIO_MAX_NDIM)
            return fail(err, errlen, CKPTIO_E_USAGE,
                        "safetensors encode: tensor '%.*s': unknown dtype %u or %u dimensions",
                        shown(name, t->name_len), name, t->st_dtype, t->ndim);
    }
    for (uint64_t i = 0; i < h->n_meta; i++) {
        const ckptio__st_meta *m = &h->meta[i];
        if (!utf8_ok(h->strtab + m->key, m->key_len) || !utf8_ok(h->strtab + m->val, m->val_len))
            return fail(err, errlen, CKPTIO_E_USAGE,
                        "safetensors encode: metadata %llu is not UTF-8", U(i));
    }
    wr w = {0};
    put_json(&w, h);
    uint64_t total = (8 + w.len + align - 1) / align * align;
    if (total - 8 > CKPTIO__ST_MAX_HEADER)
        return fail(err, errlen, CKPTIO_E_LIMIT,
                    "safetensors encode: header of %llu bytes exceeds %llu", U(total - 8),
                    U(CKPTIO__ST_MAX_HEADER));
    uint8_t *buf = malloc((size_t)total);
    if (!buf) return fail(err, errlen, -ENOMEM, "safetensors encode: out of memory");
    uint64_t n = total - 8;
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(n >> (8 * i));
    w = (wr){buf + 8, 0};
    put_json(&w, h);
    memset(buf + 8 + w.len, ' ', (size_t)(n - w.len));
    *out = buf;
    *len = total;
    return 0;
}

/* ---- the experimental public names ---- */

_Static_assert(CKPTIO__ST_COUNT == CKPTIO_ST_COUNT, "include/ckptio.h's CKPTIO_ST_COUNT");

int ckptio_st_parse(const uint8_t *hdr, uint64_t n, uint64_t file_size, ckptio_st_header **out,
                    char *err, size_t errlen)
{
    return ckptio__st_parse(hdr, n, file_size, out, err, errlen);
}

void ckptio_st_free(ckptio_st_header *h)
{
    ckptio__st_free(h);
}

int ckptio_st_encode(const ckptio_st_header *h, uint64_t align, uint8_t **out, uint64_t *len,
                     char *err, size_t errlen)
{
    /* One layout so far: a header of another size was built against another ckptio.h. */
    if (h && h->size != sizeof *h) {
        *out = NULL;
        *len = 0;
        return fail(err, errlen, CKPTIO_E_USAGE,
                    "ckptio_st_encode: h->size is %u; set it to sizeof(ckptio_st_header) (%zu "
                    "here)", h->size, sizeof *h);
    }
    return ckptio__st_encode(h, align, out, len, err, errlen);
}

const char *ckptio_st_dtype_name(int st_dtype)
{
    return ckptio__st_dtype_name(st_dtype);
}

int ckptio_st_dtype_ckptio(int st_dtype)
{
    return ckptio__st_dtype_ckptio(st_dtype);
}
