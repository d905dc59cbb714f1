/* SPDX-License-Identifier: Apache-2.0 */
/* The manifest: canonical encoding and bounded decoding (pure, no I/O); validation is validate.c. */
#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/box.h"
#include "manifest.h"

/* ---- on-disk layout (doc/format.md is normative) ------------------------------------------ */

static const uint8_t MAGIC[8] = {0x89, 'C', 'K', 'P', 'T', 'I', 'O', '\n'};

enum {
    H_MAGIC = 0,
    H_MAJOR = 8,
    H_MINOR = 10,
    H_HSIZE = 12,
    H_BODY_LEN = 16,
    H_BODY_SUM = 24,
    H_CSUM_ALGO = 32,
    H_FLAGS = 36,
    H_CSUM_BLOCK = 40,
    H_COUNTS = 48, /* files, tensors, chunks, meta, dims, csums, strtab_len: 7 x u64 */
    H_RESERVED = 104,
    H_SUM_V1 = 120,
    HDR_V1 = 128,   /* header size written by this version */
    HDR_MAX = 4096, /* largest header a later minor version may use */
};
enum { REC_FILE = 16, REC_TENSOR = 24, REC_CHUNK = 40, REC_META = 16, REC_U64 = 8 };
enum { V_MAJOR = CKPTIO_FORMAT_VERSION, V_MINOR = 0, V_STRIPED = CKPTIO__FORMAT_STRIPED,
       V_NEWEST = CKPTIO__FORMAT_CODED };
enum { REC_ROOT = 8, REC_BLOCK = 4, REC_BASE = 16 };
/* Format 3 header: n_blocks at the second reserved word, flags bit 0 = a base record. */
#define H_N_BLOCKS (H_RESERVED + 8)
#define FLAG_BASE 1u

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define LE32(v) __builtin_bswap32(v)
#define LE64(v) __builtin_bswap64(v)
#define HOST_IS_LE 0
#else
#define LE32(v) (v)
#define LE64(v) (v)
#define HOST_IS_LE 1
#endif

static inline uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return LE32(v);
}
static inline uint64_t get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return LE64(v);
}
static inline void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void put32(uint8_t *p, uint32_t v)
{
    v = LE32(v);
    memcpy(p, &v, 4);
}
static inline void put64(uint8_t *p, uint64_t v)
{
    v = LE64(v);
    memcpy(p, &v, 8);
}

/* ---- messages ------------------------------------------------------------------------------ */

#define U(x) ((unsigned long long)(x))

#define fail ckptio__errf /* report into the caller's err buffer (common/error.c) */

/* ---- encoding ------------------------------------------------------------------------------ */

/* Section counts of the canonical encoding, whatever slack the in-memory arrays hold. */
typedef struct layout {
    uint64_t n_chunks, n_dims, n_csums, strtab_len, n_blocks, total;
    unsigned version;
} layout;

/* Block sizes of a coded chunk (0 for one stored as it is). */
static uint64_t chunk_blocks(const ckptio__manifest *m, const ckptio__mchunk *c)
{
    if (c->codec == CKPTIO__CODEC_NONE || !ckptio__is_pow2(m->csum_block)) return 0;
    return c->raw_len / m->csum_block + (c->raw_len % m->csum_block != 0);
}

static int plan(const ckptio__manifest *m, layout *l)
{
    /* m's indices must be in range (validated); the sums are checked anyway, being cheap. */
    uint64_t chunks = 0, dims = 0, csums = 0, str = 0, blocks = 0, t, total = HDR_V1;
    bool ok = true, coded = m->has_base;
    for (uint64_t i = 0; i < m->n_files; i++) str += (uint64_t)m->files[i].name_len + 1;
    for (uint64_t i = 0; i < m->n_tensors; i++) {
        const ckptio__mtensor *te = &m->tensors[i];
        str += (uint64_t)te->name_len + 1;
        ok = ok && ckptio__add(chunks, te->n_chunks, &chunks) &&
             ckptio__mul(te->n_chunks, 2, &t) && ckptio__add(t, 1, &t) &&
             ckptio__mul(t, te->ndim, &t) && ckptio__add(dims, t, &dims);
        if (!ok) return CKPTIO_E_LIMIT;
        for (uint64_t k = 0; k < te->n_chunks; k++) {
            const ckptio__mchunk *c = &m->chunks[te->chunk0 + k];
            ok = ok && ckptio__add(csums, c->n_csums, &csums);
            blocks += chunk_blocks(m, c); /* <= 2^28 chunks of <= 2^44 blocks: no wrap */
            coded = coded || c->codec != CKPTIO__CODEC_NONE;
        }
    }
    for (uint64_t i = 0; i < m->n_meta; i++) {
        ok = ok && ckptio__add(str, (uint64_t)m->meta[i].key_len + 1, &str) &&
             ckptio__add(str, m->meta[i].val_len, &str) && ckptio__add(str, 1, &str);
    }
    for (uint64_t i = 0; i < m->n_roots; i++)
        str += (uint64_t)m->roots[i].path_len + m->roots[i].name_len + 2;
    if (m->has_base) str += (uint64_t)m->base_len + 1;
    uint64_t parts[][2] = {{m->n_files, REC_FILE}, {m->n_tensors, REC_TENSOR},
                           {chunks, REC_CHUNK},    {m->n_meta, REC_META},
                           {dims, REC_U64},        {csums, REC_U64},
                           {str, 1},               {m->n_roots, REC_ROOT},
                           {blocks, REC_BLOCK},    {m->has_base, REC_BASE}};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        ok = ok && ckptio__mul(parts[i][0], parts[i][1], &t) && ckptio__add(total, t, &total);
    if (!ok || total > CKPTIO__MAX_MANIFEST_BYTES) return CKPTIO_E_LIMIT;
    *l = (layout){chunks, dims, csums, str, blocks, total,
                  coded ? V_NEWEST : m->n_roots ? V_STRIPED : V_MAJOR};
    return 0;
}

int ckptio__manifest_encoded_size(const ckptio__manifest *m, uint64_t *out)
{
    layout l;
    CKPTIO__TRY(plan(m, &l));
    *out = l.total;
    return 0;
}

static uint8_t *put_u64s(uint8_t *p, const uint64_t *base, uint64_t idx, uint64_t n)
{
    if (n == 0) return p;
    const uint64_t *src = base + idx;
    if (HOST_IS_LE) {
        memcpy(p, src, n * 8);
        return p + n * 8;
    }
    for (uint64_t i = 0; i < n; i++, p += 8) put64(p, src[i]);
    return p;
}

static uint8_t *put_str(uint8_t *p, const char *s, uint64_t len)
{
    memcpy(p, s, len);
    p[len] = 0;
    return p + len + 1;
}

int ckptio__manifest_encode(const ckptio__manifest *m, uint8_t *buf, uint64_t len)
{
    /* Trusts m (the writer validated it); recomputing the plan costs one pass over tensors. */
    layout l;
    CKPTIO__TRY(plan(m, &l));
    CKPTIO__RET_IF(len < l.total, CKPTIO_E_USAGE);

    uint8_t *p = buf + HDR_V1;
    /* Fixed-size sections: every index becomes implicit in the canonical order (tensor by
     * tensor, chunk by chunk), so the decoder has nothing to cross-check but counts. */
    for (uint64_t i = 0; i < m->n_files; i++, p += REC_FILE) {
        put32(p, m->files[i].name_len);
        put32(p + 4, m->files[i].root);
        put64(p + 8, m->files[i].size);
    }
    for (uint64_t i = 0; i < m->n_tensors; i++, p += REC_TENSOR) {
        const ckptio__mtensor *t = &m->tensors[i];
        put32(p, t->name_len);
        put32(p + 4, t->dtype);
        put32(p + 8, t->ndim);
        put32(p + 12, 0);
        put64(p + 16, t->n_chunks);
    }
    for (uint64_t i = 0; i < m->n_tensors; i++) {
        const ckptio__mtensor *t = &m->tensors[i];
        for (uint64_t k = 0; k < t->n_chunks; k++, p += REC_CHUNK) {
            const ckptio__mchunk *c = &m->chunks[t->chunk0 + k];
            put32(p, c->file);
            put32(p + 4, c->codec);
            put64(p + 8, c->file_off);
            put64(p + 16, c->stored_len);
            put64(p + 24, c->raw_len);
            put64(p + 32, c->n_csums);
        }
    }
    for (uint64_t i = 0; i < m->n_meta; i++, p += REC_META) {
        put32(p, m->meta[i].key_len);
        put32(p + 4, 0);
        put64(p + 8, m->meta[i].val_len);
    }
    for (uint64_t i = 0; i < m->n_tensors; i++) {
        const ckptio__mtensor *t = &m->tensors[i];
        p = put_u64s(p, m->dims, t->dims, t->ndim);
        for (uint64_t k = 0; k < t->n_chunks; k++)
            p = put_u64s(p, m->dims, m->chunks[t->chunk0 + k].dims, 2 * (uint64_t)t->ndim);
    }
    for (uint64_t i = 0; i < m->n_tensors; i++) {
        const ckptio__mtensor *t = &m->tensors[i];
        for (uint64_t k = 0; k < t->n_chunks; k++) {
            const ckptio__mchunk *c = &m->chunks[t->chunk0 + k];
            p = put_u64s(p, m->csums, c->csums, c->n_csums);
        }
    }
    for (uint64_t i = 0; i < m->n_files; i++)
        p = put_str(p, m->strtab + m->files[i].name, m->files[i].name_len);
    for (uint64_t i = 0; i < m->n_tensors; i++)
        p = put_str(p, m->strtab + m->tensors[i].name, m->tensors[i].name_len);
    for (uint64_t i = 0; i < m->n_meta; i++) {
        p = put_str(p, m->strtab + m->meta[i].key, m->meta[i].key_len);
        p = put_str(p, m->strtab + m->meta[i].val, m->meta[i].val_len);
    }
    for (uint64_t i = 0; i < m->n_roots; i++) {
        p = put_str(p, m->strtab + m->roots[i].path, m->roots[i].path_len);
        p = put_str(p, m->strtab + m->roots[i].name, m->roots[i].name_len);
    }
    if (m->has_base) p = put_str(p, m->strtab + m->base_path, m->base_len);
    /* Format 2: the roots' records follow the string table; format 3: then block sizes and
     * the base. */
    for (uint64_t i = 0; i < m->n_roots; i++, p += REC_ROOT) {
        put32(p, m->roots[i].path_len);
        put32(p + 4, m->roots[i].name_len);
    }
    for (uint64_t i = 0; i < m->n_tensors; i++) {
        const ckptio__mtensor *t = &m->tensors[i];
        for (uint64_t k = 0; k < t->n_chunks; k++) {
            const ckptio__mchunk *c = &m->chunks[t->chunk0 + k];
            uint64_t nb = chunk_blocks(m, c);
            for (uint64_t j = 0; j < nb; j++, p += REC_BLOCK)
                put32(p, m->blocks ? m->blocks[c->blocks + j] : 0);
        }
    }
    if (m->has_base) {
        put32(p, m->base_len);
        put32(p + 4, 0);
        put64(p + 8, m->base_sum);
        p += REC_BASE;
    }
    uint64_t body_len = (uint64_t)(p - buf) - HDR_V1;
    assert(body_len == l.total - HDR_V1);

    uint8_t *h = buf;
    memset(h, 0, HDR_V1);
    memcpy(h + H_MAGIC, MAGIC, sizeof MAGIC);
    put16(h + H_MAJOR, (uint16_t)l.version);
    put16(h + H_MINOR, V_MINOR);
    put32(h + H_HSIZE, HDR_V1);
    put64(h + H_BODY_LEN, body_len);
    put64(h + H_BODY_SUM, ckptio__hash(buf + HDR_V1, body_len));
    put32(h + H_CSUM_ALGO, m->csum_algo);
    put32(h + H_FLAGS, m->has_base ? FLAG_BASE : 0);
    put64(h + H_CSUM_BLOCK, m->csum_block);
    const uint64_t counts[7] = {m->n_files, m->n_tensors, l.n_chunks, m->n_meta,
                                l.n_dims,   l.n_csums,    l.strtab_len};
    for (int i = 0; i < 7; i++) put64(h + H_COUNTS + 8 * i, counts[i]);
    put64(h + H_RESERVED, m->n_roots);
    put64(h + H_N_BLOCKS, l.n_blocks);
    /* Last, as it covers every other header byte, body checksum included. */
    put64(h + H_SUM_V1, ckptio__hash(h, H_SUM_V1));
    return 0;
}

/* ---- decoding ------------------------------------------------------------------------------ */

static void get_u64s(uint64_t *dst, const uint8_t *p, uint64_t n)
{
    if (HOST_IS_LE) {
        if (n) memcpy(dst, p, n * 8);
        return;
    }
    for (uint64_t i = 0; i < n; i++) dst[i] = get64(p + 8 * i);
}

/* Claim `need` more of `have` items starting at *run; false if they are not there. */
static bool take(uint64_t *run, uint64_t need, uint64_t have)
{
    if (need > have - *run) return false;
    *run += need;
    return true;
}

enum { C_FILES, C_TENSORS, C_CHUNKS, C_META, C_DIMS, C_CSUMS, C_STRTAB, C_N };
static const char *const count_name[C_N] = {"files",  "tensors",   "chunks", "metadata entries",
                                            "dims",   "checksums", "string table bytes"};
static const uint64_t rec_size[C_N] = {REC_FILE, REC_TENSOR, REC_CHUNK, REC_META,
                                       REC_U64,  REC_U64,    1};

/* Bytes of every array of a decoded manifest; at most ~2x the encoded bytes (a tensor record
 * of 24 bytes becomes a 48-byte struct, the other records grow less). */
static uint64_t arena_size(const uint64_t *n)
{
    return ckptio__align_up(sizeof(ckptio__manifest), 8) + n[C_FILES] * sizeof(ckptio__mfile) +
           n[C_TENSORS] * sizeof(ckptio__mtensor) + n[C_CHUNKS] * sizeof(ckptio__mchunk) +
           n[C_META] * sizeof(ckptio__mmeta) + (n[C_DIMS] + n[C_CSUMS]) * 8 + n[C_STRTAB] + 1;
}

static int check_header(const uint8_t *buf, uint64_t len, uint32_t *hsize_out, char *err,
                        size_t errlen)
{
    if (memcmp(buf, MAGIC, len < sizeof MAGIC ? len : sizeof MAGIC) != 0)
        return fail(err, errlen, CKPTIO_E_CORRUPT, "not a ckptio manifest (bad magic)");
    /* Magic and version sit at fixed offsets in every version, so a newer manifest is named
     * as such even when the rest of its header means something else. */
    if (len < H_HSIZE)
        return fail(err, errlen, CKPTIO_E_CORRUPT, "manifest truncated at %llu bytes", U(len));
    unsigned major = get16(buf + H_MAJOR), minor = get16(buf + H_MINOR);
    if (major > V_NEWEST)
        return fail(err, errlen, CKPTIO_E_FORMAT,
                    "manifest format %u.%u is newer than %u.%u, the newest this library reads",
                    major, minor, V_NEWEST, V_MINOR);
    if (major < V_MAJOR)
        return fail(err, errlen, CKPTIO_E_CORRUPT, "manifest format %u.%u does not exist", major,
                    minor);
    if (len > CKPTIO__MAX_MANIFEST_BYTES)
        return fail(err, errlen, CKPTIO_E_LIMIT, "manifest of %llu bytes exceeds the limit of %llu",
                    U(len), U(CKPTIO__MAX_MANIFEST_BYTES));
    if (len < HDR_V1)
        return fail(err, errlen, CKPTIO_E_CORRUPT, "manifest truncated at %llu bytes", U(len));
    uint32_t hsize = get32(buf + H_HSIZE);
    /* A later minor version may grow the header (its checksum stays in the last 8 bytes). */
    bool hsize_ok = minor == V_MINOR ? hsize == HDR_V1
                                     : hsize >= HDR_V1 && hsize <= HDR_MAX && hsize % 8 == 0;
    if (!hsize_ok)
        return fail(err, errlen, CKPTIO_E_CORRUPT, "manifest header size %u is invalid", hsize);
    if (hsize > len)
        return fail(err, errlen, CKPTIO_E_CORRUPT, "manifest truncated at %llu bytes", U(len));
    /* The header checksum comes before any field past the version is trusted; the body's
     * before any record is parsed, so a torn write is reported as such, not as a bad record. */
    uint64_t want = get64(buf + hsize - 8), got = ckptio__hash(buf, hsize - 8);
    if (want != got)
        return fail(err, errlen, CKPTIO_E_CORRUPT,
                    "manifest header checksum mismatch (stored %016llx, computed %016llx)",
                    U(want), U(got));
    uint64_t body_len = get64(buf + H_BODY_LEN);
    if (body_len != len - hsize)
        return fail(err, errlen, CKPTIO_E_CORRUPT,
                    "manifest is %llu bytes but its header describes %llu + %llu (truncated or "
                    "trailing bytes)",
                    U(len), U(hsize), U(body_len));
    want = get64(buf + H_BODY_SUM);
    got = ckptio__hash(buf + hsize, body_len);
    if (want != got)
        return fail(err, errlen, CKPTIO_E_CORRUPT,
                    "manifest body checksum mismatch (stored %016llx, computed %016llx)", U(want),
                    U(got));
    /* Reserved bits must be zero so that a future major version cannot be misread by us. */
    uint32_t flags_ok = major == V_NEWEST ? FLAG_BASE : 0;
    if ((get32(buf + H_FLAGS) & ~flags_ok) || (major == V_MAJOR && get64(buf + H_RESERVED) != 0) ||
        (major != V_NEWEST && get64(buf + H_N_BLOCKS) != 0))
        return fail(err, errlen, CKPTIO_E_CORRUPT, "manifest header: reserved fields are not zero");
    *hsize_out = hsize;
    return 0;
}

int ckptio__manifest_decode(const uint8_t *buf, uint64_t len, ckptio__manifest **out, char *err,
                            size_t errlen)
{
    return ckptio__manifest_decode_ex(buf, len, 0, out, err, errlen);
}

int ckptio__manifest_decode_ex(const uint8_t *buf, uint64_t len, unsigned flags,
                               ckptio__manifest **out, char *err, size_t errlen)
{
    if (err && errlen) err[0] = 0;
    if (!out || (!buf && len)) return fail(err, errlen, CKPTIO_E_USAGE, "no buffer to decode");
    *out = NULL;
    uint32_t hsize = 0;
    CKPTIO__TRY(check_header(buf, len, &hsize, err, errlen));
    const uint8_t *body = buf + hsize;
    uint64_t body_len = len - hsize;
    unsigned minor = get16(buf + H_MINOR);

    /* Bound every count by its limit and by what the remaining body bytes could hold before
     * anything is allocated: the arena is then at most a small multiple of len. */
    uint64_t n[C_N], rem = body_len;
    const uint8_t *sec[C_N];
    static const uint64_t limit[C_N] = {CKPTIO__MAX_FILES, CKPTIO__MAX_TENSORS,
                                        CKPTIO__MAX_CHUNKS, CKPTIO__MAX_META,
                                        UINT64_MAX,          UINT64_MAX,
                                        UINT64_MAX};
    for (int i = 0; i < C_N; i++) {
        n[i] = get64(buf + H_COUNTS + 8 * i);
        if (n[i] > limit[i])
            return fail(err, errlen, CKPTIO_E_LIMIT, "manifest declares %llu %s (limit %llu)",
                        U(n[i]), count_name[i], U(limit[i]));
        if (n[i] > rem / rec_size[i])
            return fail(err, errlen, CKPTIO_E_CORRUPT,
                        "manifest declares %llu %s but only %llu body bytes remain for them",
                        U(n[i]), count_name[i], U(rem));
        sec[i] = body + (body_len - rem);
        rem -= n[i] * rec_size[i];
    }
    /* Format 2: the roots' records come right after the string table; format 3: then the
     * block sizes and the base. */
    unsigned major = get16(buf + H_MAJOR);
    uint64_t n_roots = major >= V_STRIPED ? get64(buf + H_RESERVED) : 0;
    uint64_t n_blocks = major == V_NEWEST ? get64(buf + H_N_BLOCKS) : 0;
    bool has_base = major == V_NEWEST && (get32(buf + H_FLAGS) & FLAG_BASE);
    const uint8_t *sec_roots = body + (body_len - rem);
    if (n_roots > CKPTIO__MAX_ROOTS)
        return fail(err, errlen, CKPTIO_E_LIMIT, "manifest declares %llu roots (limit %u)",
                    U(n_roots), CKPTIO__MAX_ROOTS);
    if (n_roots > rem / REC_ROOT)
        return fail(err, errlen, CKPTIO_E_CORRUPT,
                    "manifest declares %llu roots but only %llu body bytes remain for them",
                    U(n_roots), U(rem));
    rem -= n_roots * REC_ROOT;
    const uint8_t *sec_blocks = body + (body_len - rem);
    if (n_blocks > rem / REC_BLOCK)
        return fail(err, errlen, CKPTIO_E_CORRUPT,
                    "manifest declares %llu block sizes but only %llu body bytes remain for them",
                    U(n_blocks), U(rem));
    rem -= n_blocks * REC_BLOCK;
    const uint8_t *sec_base = body + (body_len - rem);
    if (has_base && rem < REC_BASE)
        return fail(err, errlen, CKPTIO_E_CORRUPT, "manifest truncated in its base record");
    if (has_base) rem -= REC_BASE;
    /* Data after the string table (and roots) belongs to a later minor version; x.0 has none. */
    if (minor == V_MINOR && rem != 0)
        return fail(err, errlen, CKPTIO_E_CORRUPT,
                    "manifest body has %llu bytes after its string table", U(rem));

    uint64_t total = arena_size(n) + n_roots * sizeof(ckptio__mroot) + n_blocks * 4;
    if (total > SIZE_MAX) return fail(err, errlen, -ENOMEM, "manifest too large for memory");
    /* One allocation for the struct and all arrays: a single free, and no partial states. */
    uint8_t *arena = malloc((size_t)total);
    if (!arena) return fail(err, errlen, -ENOMEM, "out of memory decoding the manifest");
    ckptio__manifest *m = (ckptio__manifest *)arena;
    uint8_t *a = arena + ckptio__align_up(sizeof *m, 8);
    *m = (ckptio__manifest){
        .version = get16(buf + H_MAJOR),
        .csum_algo = get32(buf + H_CSUM_ALGO),
        .csum_block = get64(buf + H_CSUM_BLOCK),
        .n_files = n[C_FILES],
        .n_tensors = n[C_TENSORS],
        .n_chunks = n[C_CHUNKS],
        .n_meta = n[C_META],
        .n_dims = n[C_DIMS],
        .n_csums = n[C_CSUMS],
        .strtab_len = n[C_STRTAB],
        .n_roots = n_roots,
        .n_blocks = n_blocks,
        .has_base = has_base,
        .arena = arena,
    };
    m->files = (ckptio__mfile *)a, a += n[C_FILES] * sizeof *m->files;
    m->tensors = (ckptio__mtensor *)a, a += n[C_TENSORS] * sizeof *m->tensors;
    m->chunks = (ckptio__mchunk *)a, a += n[C_CHUNKS] * sizeof *m->chunks;
    m->meta = (ckptio__mmeta *)a, a += n[C_META] * sizeof *m->meta;
    m->dims = (uint64_t *)a, a += n[C_DIMS] * 8;
    m->csums = (uint64_t *)a, a += n[C_CSUMS] * 8;
    m->roots = (ckptio__mroot *)a, a += n_roots * sizeof *m->roots;
    m->blocks = (uint32_t *)a, a += n_blocks * 4;
    m->strtab = (char *)a;

    int rc = 0;
    uint64_t str = 0, dims = 0, chunk = 0, csum = 0, block = 0;
    const uint8_t *p = sec[C_FILES];
    for (uint64_t i = 0; i < n[C_FILES]; i++, p += REC_FILE) {
        ckptio__mfile *f = &m->files[i];
        *f = (ckptio__mfile){.name = str, .name_len = get32(p), .root = get32(p + 4),
                             .size = get64(p + 8)};
        CKPTIO__GOTO_IF(!n_roots && f->root != 0,
                        fail(err, errlen, CKPTIO_E_CORRUPT,
                             "file %llu: reserved field is not zero", U(i)));
        CKPTIO__GOTO_IF(!take(&str, (uint64_t)f->name_len + 1, n[C_STRTAB]),
                        fail(err, errlen, CKPTIO_E_CORRUPT,
                             "file %llu: name of %u bytes overruns the string table", U(i),
                             f->name_len));
    }
    p = sec[C_TENSORS];
    /* Chunks follow their tensors in order, so one pass assigns every implicit index. */
    const uint8_t *pc = sec[C_CHUNKS];
    for (uint64_t i = 0; i < n[C_TENSORS]; i++, p += REC_TENSOR) {
        ckptio__mtensor *t = &m->tensors[i];
        *t = (ckptio__mtensor){.name = str, .name_len = get32(p), .dtype = get32(p + 4),
                               .ndim = get32(p + 8), .dims = dims, .chunk0 = chunk,
                               .n_chunks = get64(p + 16)};
        CKPTIO__GOTO_IF(get32(p + 12) != 0, fail(err, errlen, CKPTIO_E_CORRUPT,
                                                 "tensor %llu: reserved field is not zero", U(i)));
        CKPTIO__GOTO_IF(!take(&str, (uint64_t)t->name_len + 1, n[C_STRTAB]),
                        fail(err, errlen, CKPTIO_E_CORRUPT,
                             "tensor %llu: name of %u bytes overruns the string table", U(i),
                             t->name_len));
        CKPTIO__GOTO_IF(t->ndim > CKPTIO_MAX_NDIM,
                        fail(err, errlen, CKPTIO_E_LIMIT,
                             "tensor %llu: %u dimensions exceed the limit of %u", U(i), t->ndim,
                             CKPTIO_MAX_NDIM));
        CKPTIO__GOTO_IF(!take(&chunk, t->n_chunks, n[C_CHUNKS]),
                        fail(err, errlen, CKPTIO_E_CORRUPT,
                             "tensor %llu: %llu chunks overrun the %llu in the manifest", U(i),
                             U(t->n_chunks), U(n[C_CHUNKS])));
        /* n_chunks <= 2^28 and ndim <= 32 here, so this cannot wrap. */
        uint64_t nd = t->ndim, need = nd * (1 + 2 * t->n_chunks);
        CKPTIO__GOTO_IF(!take(&dims, need, n[C_DIMS]),
                        fail(err, errlen, CKPTIO_E_CORRUPT,
                             "tensor %llu: shapes overrun the %llu dims in the manifest", U(i),
                             U(n[C_DIMS])));
        for (uint64_t k = 0; k < t->n_chunks; k++, pc += REC_CHUNK) {
            ckptio__mchunk *c = &m->chunks[t->chunk0 + k];
            *c = (ckptio__mchunk){.dims = t->dims + nd + 2 * nd * k, .file_off = get64(pc + 8),
                                  .stored_len = get64(pc + 16), .raw_len = get64(pc + 24),
                                  .csums = csum, .n_csums = get64(pc + 32), .file = get32(pc),
                                  .codec = get32(pc + 4), .tensor = (uint32_t)i};
            /* Block sizes follow in chunk order; validation checks each against its chunk. */
            c->blocks = block;
            if (c->codec != CKPTIO__CODEC_NONE) {
                uint64_t B = m->csum_block ? m->csum_block : 1;
                uint64_t nb = c->raw_len / B + (c->raw_len % B != 0);
                CKPTIO__GOTO_IF(!ckptio__is_pow2(m->csum_block) || !take(&block, nb, n_blocks),
                                fail(err, errlen, CKPTIO_E_CORRUPT,
                                     "tensor %llu chunk %llu: its block sizes overrun the %llu "
                                     "in the manifest",
                                     U(i), U(k), U(n_blocks)));
            }
            CKPTIO__GOTO_IF(!take(&csum, c->n_csums, n[C_CSUMS]),
                            fail(err, errlen, CKPTIO_E_CORRUPT,
                                 "tensor %llu chunk %llu: %llu checksums overrun the %llu in the "
                                 "manifest",
                                 U(i), U(k), U(c->n_csums), U(n[C_CSUMS])));
        }
    }
    p = sec[C_META];
    for (uint64_t i = 0; i < n[C_META]; i++, p += REC_META) {
        ckptio__mmeta *e = &m->meta[i];
        *e = (ckptio__mmeta){.key = str, .key_len = get32(p), .val_len = get64(p + 8)};
        CKPTIO__GOTO_IF(get32(p + 4) != 0, fail(err, errlen, CKPTIO_E_CORRUPT,
                                                "metadata %llu: reserved field is not zero", U(i)));
        bool ok = take(&str, (uint64_t)e->key_len + 1, n[C_STRTAB]);
        e->val = str;
        ok = ok && e->val_len < n[C_STRTAB] - str && take(&str, e->val_len + 1, n[C_STRTAB]);
        CKPTIO__GOTO_IF(!ok, fail(err, errlen, CKPTIO_E_CORRUPT,
                                  "metadata %llu: key or value overruns the string table", U(i)));
    }
    p = sec_roots;
    for (uint64_t i = 0; i < n_roots; i++, p += REC_ROOT) {
        ckptio__mroot *r = &m->roots[i];
        *r = (ckptio__mroot){.path = str, .path_len = get32(p), .name_len = get32(p + 4)};
        bool ok = take(&str, (uint64_t)r->path_len + 1, n[C_STRTAB]);
        r->name = str;
        ok = ok && take(&str, (uint64_t)r->name_len + 1, n[C_STRTAB]);
        CKPTIO__GOTO_IF(!ok, fail(err, errlen, CKPTIO_E_CORRUPT,
                                  "root %llu: path or name overruns the string table", U(i + 1)));
    }
    if (has_base) {
        m->base_len = get32(sec_base);
        m->base_sum = get64(sec_base + 8);
        m->base_path = str;
        CKPTIO__GOTO_IF(get32(sec_base + 4) != 0 || !take(&str, (uint64_t)m->base_len + 1, n[C_STRTAB]),
                        fail(err, errlen, CKPTIO_E_CORRUPT,
                             "base record: reserved field not zero or path overruns the string "
                             "table"));
    }
    CKPTIO__GOTO_IF(block != n_blocks,
                    fail(err, errlen, CKPTIO_E_CORRUPT,
                         "manifest declares %llu block sizes but its chunks use %llu",
                         U(n_blocks), U(block)));
    for (uint64_t i = 0; i < n_blocks; i++) m->blocks[i] = get32(sec_blocks + 4 * i);
    const uint64_t used[] = {chunk, dims, csum, str};
    const int which[] = {C_CHUNKS, C_DIMS, C_CSUMS, C_STRTAB};
    for (int i = 0; i < 4; i++)
        CKPTIO__GOTO_IF(used[i] != n[which[i]],
                        fail(err, errlen, CKPTIO_E_CORRUPT,
                             "manifest declares %llu %s but its records use %llu",
                             U(n[which[i]]), count_name[which[i]], U(used[i])));
    /* Same order on disk as in memory, so these three sections are plain copies. */
    get_u64s(m->dims, sec[C_DIMS], n[C_DIMS]);
    get_u64s(m->csums, sec[C_CSUMS], n[C_CSUMS]);
    if (n[C_STRTAB]) memcpy(m->strtab, sec[C_STRTAB], n[C_STRTAB]);
    m->strtab[n[C_STRTAB]] = 0; /* the spare byte: strtab is a C string even when empty */
    CKPTIO__CHECK(ckptio__manifest_validate_ex(m, flags, err, errlen));
    *out = m;
    return 0;
out:
    free(arena);
    return rc;
}

void ckptio__manifest_free(ckptio__manifest *m)
{
    /* A decoded manifest lives inside its own arena; a caller-built one is the caller's. */
    if (m && m->arena) free(m->arena);
}
