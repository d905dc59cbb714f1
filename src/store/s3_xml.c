/* SPDX-License-Identifier: Apache-2.0 */
/* What the S3 client reads of S3's XML: listings, uploads, errors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "s3_impl.h"

/* Finds "<tag>" or "<tag ...>" or "<tag/>"; S3's elements carry no attributes but the root. */
const char *ckptio__xml_next(const char *p, const char *end, const char *tag, const char **vb,
                             const char **ve)
{
    size_t tl = strlen(tag);
    while (p && p < end) {
        const char *lt = memchr(p, '<', (size_t)(end - p));
        if (!lt) return NULL;
        const char *q = lt + 1;
        if ((size_t)(end - q) > tl && !memcmp(q, tag, tl) &&
            (q[tl] == '>' || q[tl] == ' ' || q[tl] == '/')) {
            const char *gt = memchr(q + tl, '>', (size_t)(end - q - (ptrdiff_t)tl));
            if (!gt) return NULL;
            if (gt[-1] == '/') {
                *vb = *ve = gt + 1;
                return gt + 1;
            }
            const char *v = gt + 1;
            /* The closing tag: the first "</tag>" after the opening one. */
            for (const char *c = v; c < end;) {
                const char *lt2 = memchr(c, '<', (size_t)(end - c));
                if (!lt2) return NULL;
                if ((size_t)(end - lt2) >= tl + 3 && lt2[1] == '/' &&
                    !memcmp(lt2 + 2, tag, tl) && lt2[2 + tl] == '>') {
                    *vb = v;
                    *ve = lt2;
                    return lt2 + tl + 3;
                }
                c = lt2 + 1;
            }
            return NULL;
        }
        p = q;
    }
    return NULL;
}

static int put_utf8(char *out, size_t cap, size_t *n, unsigned long cp)
{
    unsigned char b[4];
    size_t k;
    if (cp == 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
    /* k bytes: a lead byte marking the length, then 6 bits per continuation byte. */
    k = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    static const unsigned char lead[5] = {0, 0x00, 0xC0, 0xE0, 0xF0};
    for (size_t i = k; i-- > 1; cp >>= 6) b[i] = (unsigned char)(0x80 | (cp & 63));
    b[0] = (unsigned char)(lead[k] | cp);
    if (*n + k >= cap) return -1;
    memcpy(out + *n, b, k);
    *n += k;
    return 0;
}

int ckptio__xml_text(const char *b, const char *e, char *out, size_t cap)
{
    static const struct {
        const char *name;
        char c;
    } ents[] = {{"amp;", '&'}, {"lt;", '<'}, {"gt;", '>'}, {"quot;", '"'}, {"apos;", '\''}};
    size_t n = 0;
    if (!cap) return -1;
    while (b < e) {
        if (!*b) return -1; /* a raw NUL: no name or text of S3's holds one */
        if (*b != '&') {
            if (n + 1 >= cap) return -1;
            out[n++] = *b++;
            continue;
        }
        const char *semi = memchr(b, ';', (size_t)(e - b));
        if (!semi || semi - b > 12) return -1;
        size_t el = (size_t)(semi - b); /* "&name" without ';' */
        bool done = false;
        for (size_t i = 0; i < sizeof ents / sizeof ents[0] && !done; i++) {
            if (strlen(ents[i].name) == el && !memcmp(b + 1, ents[i].name, el)) {
                if (n + 1 >= cap) return -1;
                out[n++] = ents[i].c;
                done = true;
            }
        }
        if (!done) {
            if (el < 3 || b[1] != '#') return -1;
            char num[16];
            bool hex = b[2] == 'x' || b[2] == 'X';
            size_t dl = el - (hex ? 3 : 2);
            if (dl == 0 || dl >= sizeof num) return -1;
            memcpy(num, b + (hex ? 3 : 2), dl);
            num[dl] = 0;
            char *endp;
            unsigned long cp = strtoul(num, &endp, hex ? 16 : 10);
            if (*endp || put_utf8(out, cap, &n, cp) < 0) return -1;
        }
        b = semi + 1;
    }
    out[n] = 0;
    return (int)n;
}

/* The decoded text of the first <tag> in [b, e) into out; false when absent or too long. */
static bool field(const char *b, const char *e, const char *tag, char *out, size_t cap)
{
    const char *vb, *ve;
    if (!ckptio__xml_next(b, e, tag, &vb, &ve)) return false;
    return ckptio__xml_text(vb, ve, out, cap) >= 0;
}

static bool is_true(const char *b, const char *e)
{
    char v[16];
    return field(b, e, "IsTruncated", v, sizeof v) && !strcmp(v, "true");
}

int ckptio__s3_parse_list(const char *xml, size_t len, ckptio__obj_list_cb cb, void *ctx,
                          bool *truncated, char *token, size_t cap)
{
    const char *p = xml, *end = xml + len, *vb, *ve;
    char key[1100], num[32], when[64];
    while ((p = ckptio__xml_next(p, end, "Contents", &vb, &ve))) {
        if (!field(vb, ve, "Key", key, sizeof key) || !key[0]) return CKPTIO_E_CORRUPT;
        uint64_t size = 0;
        int64_t mtime = 0;
        if (field(vb, ve, "Size", num, sizeof num)) size = strtoull(num, NULL, 10);
        if (field(vb, ve, "LastModified", when, sizeof when)) ckptio__time_iso(when, &mtime);
        int rc = cb(ctx, key, size, mtime);
        if (rc) return rc;
    }
    /* The page's own fields follow its <Contents> in S3's answers, but not in every server's:
     * look for them outside the entries. */
    *truncated = is_true(xml, end);
    token[0] = 0;
    if (*truncated && !field(xml, end, "NextContinuationToken", token, cap))
        return CKPTIO_E_CORRUPT;
    return 0;
}

int ckptio__s3_parse_uploads(const char *xml, size_t len, ckptio__obj_uploads_cb cb, void *ctx,
                             bool *truncated, char *next_key, char *next_id, size_t cap)
{
    const char *p = xml, *end = xml + len, *vb, *ve;
    char key[1100], id[512], when[64];
    while ((p = ckptio__xml_next(p, end, "Upload", &vb, &ve))) {
        if (!field(vb, ve, "Key", key, sizeof key) || !field(vb, ve, "UploadId", id, sizeof id))
            return CKPTIO_E_CORRUPT;
        int64_t t = 0;
        if (field(vb, ve, "Initiated", when, sizeof when)) ckptio__time_iso(when, &t);
        int rc = cb(ctx, key, id, t);
        if (rc) return rc;
    }
    *truncated = is_true(xml, end);
    next_key[0] = next_id[0] = 0;
    if (*truncated) {
        if (!field(xml, end, "NextKeyMarker", next_key, cap)) return CKPTIO_E_CORRUPT;
        field(xml, end, "NextUploadIdMarker", next_id, cap);
    }
    return 0;
}

void ckptio__s3_parse_error(const char *xml, size_t len, char *code, size_t cap)
{
    const char *vb, *ve;
    code[0] = 0;
    if (!xml || !ckptio__xml_next(xml, xml + len, "Error", &vb, &ve)) return;
    if (!field(vb, ve, "Code", code, cap)) code[0] = 0;
}
