/* SPDX-License-Identifier: Apache-2.0 */
/* Reads settings out of AWS's INI files and credential JSON without I/O or allocation. */
#include "conf_parse.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>

/* Copy [b, e) with a NUL into out: 1, or CKPTIO_E_LIMIT (out then ""). */
static int put(const char *b, const char *e, char *out, size_t cap)
{
    size_t n = (size_t)(e - b);
    if (cap) out[0] = 0;
    if (n >= cap) return CKPTIO_E_LIMIT;
    memcpy(out, b, n);
    out[n] = 0;
    return 1;
}

/* ---- INI ----------------------------------------------------------------------------------- */

/* Python's str.strip() white space, less the line breaks that never reach a line. */
static bool blank(char c)
{
    return c == ' ' || c == '\t' || c == '\f' || c == '\v';
}

typedef struct line {
    const char *b, *e; /* trimmed */
    size_t indent;     /* blanks before b */
} line;

/* The line at *p, which moves past its end (LF, CRLF or a lone CR). False at the NUL. */
static bool next_line(const char **p, line *l)
{
    const char *s = *p, *e = s + strcspn(s, "\r\n");
    if (!*s) return false;
    *p = e + (*e == '\r' && e[1] == '\n' ? 2 : *e ? 1 : 0);
    for (l->b = s; l->b < e && blank(*l->b);) l->b++;
    while (e > l->b && blank(e[-1])) e--;
    l->e = e;
    l->indent = (size_t)(l->b - s);
    return true;
}

/* The next run of non-blanks at or after *p (its length in *n, 0 at the end). */
static const char *word(const char **p, const char *e, size_t *n)
{
    const char *b = *p, *w;
    while (b < e && blank(*b)) b++;
    for (w = b; w < e && !blank(*w);) w++;
    *n = (size_t)(w - b);
    *p = w;
    return b;
}

/* Whether a header's name [b, e) is s, both trimmed and with each run of blanks one space. */
static bool section_is(const char *b, const char *e, const char *s)
{
    const char *se = s + strlen(s);
    for (;;) {
        size_t n, m;
        const char *x = word(&b, e, &n), *y = word(&s, se, &m);
        if (n != m || memcmp(x, y, n)) return false;
        if (!n) return true;
    }
}

static bool key_is(const char *b, const char *e, const char *k, bool fold)
{
    for (; b < e; b++, k++) {
        char x = *b, y = *k; /* a NUL in k ends the match below */
        if (fold) {
            x = x >= 'A' && x <= 'Z' ? (char)(x + 32) : x;
            y = y >= 'A' && y <= 'Z' ? (char)(y + 32) : y;
        }
        if (!y || x != y) return false;
    }
    return !*k;
}

/* The delimiter of "name = value" in [b, e) with a non-empty name: its place and the trimmed
 * name's end, or NULL. */
static const char *split(const char *b, const char *e, const char *delims, const char **ke)
{
    const char *d = b;
    while (d < e && !strchr(delims, *d)) d++;
    if (d == e) return NULL;
    for (*ke = d; *ke > b && blank((*ke)[-1]);) (*ke)--;
    return *ke > b ? d : NULL;
}

/* What one pass over the file looks for; the last match wins. */
typedef struct ini_q {
    const char *section, *key, *sub; /* key NULL: only whether section exists */
    const char *vb, *ve;
    bool found;
} ini_q;

static void ini_scan(const char *text, ini_q *q)
{
    bool in_section = false, has_key = false, target = false, nested = false;
    size_t key_indent = 0;
    line l;
    for (const char *p = text; next_line(&p, &l);) {
        if (l.b == l.e || *l.b == '#' || *l.b == ';') continue;
        if (has_key && l.indent > key_indent) {
            /* A continuation of the key above: never a key or a header of its own. */
            const char *d, *ke;
            if (target && nested && q->sub && (d = split(l.b, l.e, "=", &ke)) &&
                key_is(l.b, ke, q->sub, false)) {
                for (q->vb = d + 1; q->vb < l.e && blank(*q->vb);) q->vb++;
                q->ve = l.e;
                q->found = true;
            }
            continue;
        }
        has_key = target = false;
        if (*l.b == '[') {
            const char *rb = l.e;
            while (rb > l.b && rb[-1] != ']') rb--;
            if (rb == l.b) continue; /* no ']': not a header */
            in_section = section_is(l.b + 1, rb - 1, q->section);
            if (in_section && !q->key) q->found = true;
            continue;
        }
        const char *ke, *d = split(l.b, l.e, "=:", &ke);
        if (!d) continue;
        has_key = true;
        key_indent = l.indent;
        if (!in_section || !q->key || !key_is(l.b, ke, q->key, true)) continue;
        const char *vb = d + 1;
        while (vb < l.e && blank(*vb)) vb++;
        target = true;
        nested = vb == l.e;
        if (q->sub) {
            q->found = false; /* a later occurrence of the key replaces the whole setting */
        } else {
            q->vb = vb;
            q->ve = l.e;
            q->found = true;
        }
    }
}

int ckptio__ini_get(const char *text, const char *section, const char *key, char *out,
                    size_t cap)
{
    assert(text && section && key);
    ini_q q = {.section = section, .key = key};
    ini_scan(text, &q);
    if (cap) out[0] = 0;
    return q.found ? put(q.vb, q.ve, out, cap) : 0;
}

int ckptio__ini_sub(const char *text, const char *section, const char *key, const char *sub,
                    char *out, size_t cap)
{
    assert(text && section && key && sub);
    ini_q q = {.section = section, .key = key, .sub = sub};
    ini_scan(text, &q);
    if (cap) out[0] = 0;
    return q.found ? put(q.vb, q.ve, out, cap) : 0;
}

int ckptio__ini_has(const char *text, const char *section)
{
    assert(text && section);
    ini_q q = {.section = section};
    ini_scan(text, &q);
    return q.found;
}

/* ---- JSON ---------------------------------------------------------------------------------- */

/* A cursor over [p, end). */
typedef struct js {
    const char *p, *end;
} js;

static void ws(js *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static bool hex4(const char *p, const char *end, unsigned *out)
{
    if (end - p < 4) return false;
    unsigned v = 0;
    for (const char *q = p; q < p + 4; q++) {
        char c = *q;
        unsigned d = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
                     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                     : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                                            : 16u;
        if (d == 16) return false;
        v = v << 4 | d;
    }
    *out = v;
    return true;
}

/* One character of a string's body at *p: its UTF-8 bytes into u (*n of them) and 1; 0 at the
 * closing quote (*p then past it); -1 when the bytes are no valid string. The checker and every
 * reader of strings go through here, so what was checked decodes the same way. */
static int str_char(const char **p, const char *end, char u[4], size_t *n)
{
    const char *s = *p;
    if (s >= end) return -1;
    unsigned char c = (unsigned char)*s;
    if (c == '"') {
        *p = s + 1;
        return 0;
    }
    if (c < 0x20) return -1;
    if (c != '\\') {
        /* The length the lead byte claims; ckptio__valid_name refuses a bad lead, overlong
         * forms, surrogates and what is past U+10FFFF. */
        size_t k = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
        if ((size_t)(end - s) < k || (k > 1 && !ckptio__valid_name(s, k, 4))) return -1;
        memcpy(u, s, k);
        *n = k;
        *p = s + k;
        return 1;
    }
    if (end - s < 2) return -1;
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    const char *f = s[1] ? strchr(from, s[1]) : NULL;
    if (f) {
        u[0] = to[f - from];
        *n = 1;
        *p = s + 2;
        return 1;
    }
    unsigned cp, lo;
    if (s[1] != 'u' || !hex4(s + 2, end, &cp) || cp == 0 || (cp >= 0xDC00 && cp <= 0xDFFF))
        return -1;
    s += 6;
    if (cp >= 0xD800 && cp <= 0xDBFF) {
        if (end - s < 2 || s[0] != '\\' || s[1] != 'u' || !hex4(s + 2, end, &lo) ||
            lo < 0xDC00 || lo > 0xDFFF)
            return -1;
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        s += 6;
    }
    /* k bytes: each continuation carries 6 bits, and the lead's high bits (0xC0, 0xE0, 0xF0
     * for k = 2, 3, 4: 0xF00 >> k) say how many follow. */
    size_t k = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    for (size_t i = k - 1; i > 0; i--, cp >>= 6) u[i] = (char)(0x80 | (cp & 0x3F));
    u[0] = (char)((k == 1 ? 0 : (0xF00u >> k) & 0xFF) | cp);
    *n = k;
    *p = s;
    return 1;
}

/* Past the string at j->p (its opening quote); false when it is not one. */
static bool skip_string(js *j)
{
    char u[4];
    size_t n;
    int r;
    j->p++;
    while ((r = str_char(&j->p, j->end, u, &n)) > 0) {}
    return r == 0;
}

static void digits(js *j)
{
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++;
}

/* RFC 8259's number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static bool number(js *j)
{
    if (j->p < j->end && *j->p == '-') j->p++;
    const char *d = j->p;
    digits(j);
    if (j->p == d || (*d == '0' && j->p - d > 1)) return false;
    if (j->p < j->end && *j->p == '.') {
        d = ++j->p;
        digits(j);
        if (j->p == d) return false;
    }
    if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
        j->p++;
        if (j->p < j->end && (*j->p == '+' || *j->p == '-')) j->p++;
        d = j->p;
        digits(j);
        if (j->p == d) return false;
    }
    return true;
}

/* Past the value at j->p (after white space), nested below `depth` enclosing containers;
 * false when it is not a valid one. Recursion is bounded by CKPTIO__JSON_DEPTH. */
static bool value(js *j, int depth)
{
    ws(j);
    if (j->p >= j->end) return false;
    char c = *j->p;
    if (c == '"') return skip_string(j);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        if (depth >= CKPTIO__JSON_DEPTH) return false;
        j->p++;
        ws(j);
        if (j->p < j->end && *j->p == close) return j->p++, true;
        for (;;) {
            if (close == '}') {
                ws(j);
                if (j->p >= j->end || *j->p != '"' || !skip_string(j)) return false;
                ws(j);
                if (j->p >= j->end || *j->p != ':') return false;
                j->p++;
            }
            if (!value(j, depth + 1)) return false;
            ws(j);
            if (j->p >= j->end) return false;
            if (*j->p++ == close) return true;
            if (j->p[-1] != ',') return false;
        }
    }
    static const char *const words[] = {"true", "false", "null"};
    for (size_t i = 0; i < 3; i++) {
        size_t n = strlen(words[i]);
        if ((size_t)(j->end - j->p) >= n && !memcmp(j->p, words[i], n)) {
            j->p += n;
            return true;
        }
    }
    return number(j);
}

/* Whether the key at j->p (checked text) decodes to [kb, ke); j->p moves past it. */
static bool json_key_is(js *j, const char *kb, const char *ke)
{
    char u[4];
    size_t n;
    bool eq = true;
    j->p++;
    while (str_char(&j->p, j->end, u, &n) > 0) {
        eq = eq && (size_t)(ke - kb) >= n && !memcmp(kb, u, n);
        kb += eq ? n : 0;
    }
    return eq && kb == ke;
}

/* In the checked object at o (its '{'), the start of the last member named [kb, ke), or NULL. */
static const char *member(const char *o, const char *end, const char *kb, const char *ke)
{
    js j = {o + 1, end};
    const char *found = NULL;
    ws(&j);
    if (*j.p == '}') return NULL;
    for (;;) {
        ws(&j);
        bool eq = json_key_is(&j, kb, ke);
        ws(&j);
        j.p++; /* ':' */
        ws(&j);
        if (eq) found = j.p;
        value(&j, 0);
        ws(&j);
        if (*j.p++ == '}') return found;
    }
}

/* The top object of text, checked whole: its '{' in *o, or CKPTIO_E_CORRUPT. */
static int top(const char *text, size_t len, const char **o)
{
    js j = {text, text + len};
    ws(&j);
    *o = j.p;
    if (j.p >= j.end || *j.p != '{' || !value(&j, 0)) return CKPTIO_E_CORRUPT;
    ws(&j);
    return j.p == j.end ? 0 : CKPTIO_E_CORRUPT;
}

/* The member at path: 1 and its raw text [*vb, *ve), 0, or CKPTIO_E_CORRUPT. */
static int find(const char *text, size_t len, const char *path, const char **vb,
                const char **ve)
{
    const char *o, *end = text + len;
    if (top(text, len, &o) < 0) return CKPTIO_E_CORRUPT;
    /* Each step goes one object deeper into checked text, so there are at most
     * CKPTIO__JSON_DEPTH scans, whatever the path. */
    for (const char *c = path;;) {
        const char *dot = strchr(c, '.'), *ce = dot ? dot : c + strlen(c);
        const char *v = member(o, end, c, ce);
        if (!v) return 0;
        if (!dot) {
            js k = {v, end};
            value(&k, 0);
            *vb = v;
            *ve = k.p;
            return 1;
        }
        if (*v != '{') return 0;
        o = v;
        c = dot + 1;
    }
}

/* The checked string at p (its opening quote), decoded into out: 1 or CKPTIO_E_LIMIT. */
static int decode(const char *p, const char *end, char *out, size_t cap)
{
    char u[4];
    size_t n = 0, k;
    for (p++; str_char(&p, end, u, &k) > 0; n += k) {
        if (n + k >= cap) { /* never a character cut in two: all of it or "" */
            out[0] = 0;
            return CKPTIO_E_LIMIT;
        }
        memcpy(out + n, u, k);
    }
    out[n] = 0;
    return 1;
}

/* json_get, or json_str when only a string will do. */
static int get(const char *text, size_t len, const char *path, char *out, size_t cap,
               bool string_only)
{
    assert(text && path && (out || !cap));
    const char *vb, *ve;
    if (cap) out[0] = 0;
    int rc = find(text, len, path, &vb, &ve);
    if (rc <= 0) return rc;
    if (string_only && *vb != '"') return CKPTIO_E_CORRUPT;
    if (!cap) return CKPTIO_E_LIMIT;
    return *vb == '"' ? decode(vb, ve, out, cap) : put(vb, ve, out, cap);
}

int ckptio__json_get(const char *text, size_t len, const char *path, char *out, size_t cap)
{
    return get(text, len, path, out, cap, false);
}

int ckptio__json_str(const char *text, size_t len, const char *path, char *out, size_t cap)
{
    return get(text, len, path, out, cap, true);
}

int ckptio__json_member(const char *text, size_t len, const char *path, size_t i, char *key,
                        size_t kcap, char *out, size_t cap)
{
    assert(text && (key || !kcap) && (out || !cap));
    const char *o, *oe, *end = text + len;
    if (kcap) key[0] = 0;
    if (cap) out[0] = 0;
    int rc = path ? find(text, len, path, &o, &oe) : top(text, len, &o) == 0 ? 1 : CKPTIO_E_CORRUPT;
    if (rc <= 0) return rc;
    if (*o != '{') return 0;
    js j = {o + 1, end};
    ws(&j);
    if (*j.p == '}') return 0;
    for (size_t k = 0;; k++) { /* checked text: every step below finds what it expects */
        ws(&j);
        const char *kb = j.p;
        skip_string(&j);
        ws(&j);
        j.p++; /* ':' */
        ws(&j);
        const char *vb = j.p;
        value(&j, 0);
        if (k == i) {
            if (!kcap || !cap) return CKPTIO_E_LIMIT;
            rc = decode(kb, end, key, kcap);
            if (rc == 1) rc = *vb == '"' ? decode(vb, j.p, out, cap) : put(vb, j.p, out, cap);
            if (rc != 1) key[0] = 0;
            return rc;
        }
        ws(&j);
        if (*j.p++ == '}') return 0;
    }
}

int ckptio__json_each(const char *text, size_t len, const char *path,
                      int (*cb)(void *ctx, const char *v, size_t n), void *ctx)
{
    assert(text && cb);
    const char *a, *ae, *end = text + len;
    int rc;
    if (path) {
        rc = find(text, len, path, &a, &ae);
    } else { /* a top-level array, checked whole */
        js j = {text, end};
        ws(&j);
        a = j.p;
        rc = j.p < j.end && *j.p == '[' && value(&j, 0) ? (ws(&j), j.p == j.end) : 0;
        rc = rc ? 1 : CKPTIO_E_CORRUPT;
    }
    if (rc <= 0) return rc;
    if (*a != '[') return 0;
    js j = {a + 1, end};
    ws(&j);
    if (*j.p == ']') return 0;
    for (;;) { /* checked text: every step below finds what it expects */
        ws(&j);
        const char *vb = j.p;
        value(&j, 0);
        if ((rc = cb(ctx, vb, (size_t)(j.p - vb)))) return rc;
        ws(&j);
        if (*j.p++ == ']') return 0;
    }
}

int ckptio__json_int(const char *text, size_t len, const char *path, int64_t *out)
{
    assert(text && path && out);
    const char *vb, *ve;
    char num[24]; /* "-9223372036854775808" and a NUL */
    int rc = find(text, len, path, &vb, &ve);
    if (rc <= 0) return rc;
    if (*vb == '"' ? decode(vb, ve, num, sizeof num) < 0 : put(vb, ve, num, sizeof num) < 0)
        return CKPTIO_E_CORRUPT;
    const char *d = num + (num[0] == '-');
    uint64_t v = 0, max = (uint64_t)INT64_MAX + (num[0] == '-');
    if (!*d) return CKPTIO_E_CORRUPT;
    for (; *d; d++) {
        if (*d < '0' || *d > '9' || v > (max - (uint64_t)(*d - '0')) / 10)
            return CKPTIO_E_CORRUPT;
        v = v * 10 + (uint64_t)(*d - '0');
    }
    /* -(v - 1) - 1 reaches INT64_MIN without overflowing. */
    *out = num[0] == '-' ? (v ? -(int64_t)(v - 1) - 1 : 0) : (int64_t)v;
    return 1;
}

size_t ckptio__json_escape(const char *s, char *out, size_t cap)
{
    static const char from[] = "\"\\\b\f\n\r\t", to[] = "\"\\bfnrt";
    size_t n = 0;
    assert(s && (out || !cap));
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char e[8];
        const char *f = strchr(from, c);
        if (f)
            snprintf(e, sizeof e, "\\%c", to[f - from]);
        else if (c < 0x20)
            snprintf(e, sizeof e, "\\u%04x", c);
        else
            e[0] = (char)c, e[1] = 0;
        for (const char *x = e; *x; x++, n++)
            if (n + 1 < cap) out[n] = *x;
    }
    if (cap) out[n < cap ? n : cap - 1] = 0;
    return n;
}
