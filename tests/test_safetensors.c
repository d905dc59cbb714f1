/* SPDX-License-Identifier: Apache-2.0 */
/* Tests of the safetensors header parser: valid headers, each refusal and its message, corpus. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

#include "../src/format/safetensors.h"
#include "test.h"

#ifndef CKPTIO_SOURCE_ROOT
#define CKPTIO_SOURCE_ROOT "."
#endif

static char err[512];

/* Parse `json` (its own bytes exactly, no NUL) as the header of a file with dlen data bytes. */
static int parse_n(const void *json, size_t n, uint64_t dlen, ckptio__st_header **h)
{
    uint8_t *copy = malloc(n ? n : 1); /* exactly n bytes, so ASan sees any overread */
    if (!copy) return -ENOMEM;
    memcpy(copy, json, n);
    err[0] = 0;
    int rc = ckptio__st_parse(copy, n, 8 + n + dlen, h, err, sizeof err);
    free(copy);
    return rc;
}

static int parse(const char *json, uint64_t dlen, ckptio__st_header **h)
{
    return parse_n(json, strlen(json), dlen, h);
}

/* Refused with `code` and a message holding `want`. */
static int refused(const char *json, uint64_t dlen, int code, const char *want)
{
    ckptio__st_header *h = (ckptio__st_header *)err;
    int rc = parse(json, dlen, &h);
    if (rc != code || h != NULL || !strstr(err, want)) {
        fprintf(stderr, "header %s\n -> %d (%s) \"%s\"; expected %s with \"%s\"\n", json, rc,
                ckptio_errname(rc), err, ckptio_errname(code), want);
        return 1;
    }
    return 0;
}

static const char *name_of(const ckptio__st_header *h, uint64_t i)
{
    return h->strtab + h->tensors[i].name;
}

static int test_valid(void)
{
    ckptio__st_header *h;
    const char *j = "{\"__metadata__\":{\"format\":\"pt\",\"k\":\"v\\u0000w\"},"
                    " \"b\" : {\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[16,24]},\n"
                    "\"a\":{\"shape\":[2,2],\"data_offsets\":[0,16],\"dtype\":\"F32\"},"
                    "\"s\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[24,25]},"
                    "\"z\":{\"dtype\":\"F64\",\"shape\":[3,0],\"data_offsets\":[25,25]}}      ";
    CHECK_OK(parse(j, 25, &h));
    CHECK(h->n_tensors == 4 && h->n_meta == 2 && h->data_start == 8 + strlen(j));
    CHECK(!strcmp(name_of(h, 0), "a") && !strcmp(name_of(h, 1), "b"));
    CHECK(!strcmp(name_of(h, 2), "s") && !strcmp(name_of(h, 3), "z"));
    CHECK(h->tensors[0].dtype == CKPTIO_DT_F32 && h->tensors[0].ndim == 2);
    CHECK(h->dims[h->tensors[0].dims] == 2 && h->dims[h->tensors[0].dims + 1] == 2);
    CHECK(h->tensors[1].dtype == CKPTIO_DT_BF16 && h->tensors[1].begin == 16);
    CHECK(h->tensors[2].ndim == 0 && h->tensors[2].end == 25);
    CHECK(h->tensors[3].begin == 25 && h->tensors[3].end == 25);
    CHECK(!strcmp(h->strtab + h->meta[0].key, "format") && h->meta[0].val_len == 2);
    CHECK(h->meta[1].val_len == 3 && !memcmp(h->strtab + h->meta[1].val, "v\0w", 3));
    ckptio__st_free(h);
    CHECK_OK(parse("{}", 0, &h));
    CHECK(h->n_tensors == 0);
    ckptio__st_free(h);
    return 0;
}

static int test_dtypes(void)
{
    for (int st = 1; st < CKPTIO__ST_COUNT; st++) {
        const char *name = ckptio__st_dtype_name(st);
        unsigned bits = ckptio__st_dtype_bits(st);
        uint64_t size = (7 * bits + 7) / 8; /* seven elements, sub-byte dtypes rounded up */
        char j[256];
        snprintf(j, sizeof j, "{\"t\":{\"dtype\":\"%s\",\"shape\":[7],\"data_offsets\":[0,%llu]}}",
                 name, (unsigned long long)size);
        ckptio__st_header *h;
        CHECK_OK(parse(j, size, &h));
        CHECK(h->tensors[0].st_dtype == (uint32_t)st);
        int dt = ckptio__st_dtype_ckptio(st);
        CHECK(h->tensors[0].dtype == dt);
        if (dt) CHECK(ckptio_dtype_size(dt) * 8 == bits);
        ckptio__st_free(h);
        /* one byte more or less is a size mismatch */
        snprintf(j, sizeof j, "{\"t\":{\"dtype\":\"%s\",\"shape\":[7],\"data_offsets\":[0,%llu]}}",
                 name, (unsigned long long)size + 1);
        CHECK(refused(j, size + 1, CKPTIO_E_SHAPE, "tensor 't'") == 0);
    }
    CHECK(ckptio__st_dtype_ckptio(CKPTIO__ST_F8_E4M3) == CKPTIO_DT_F8_E4M3FN);
    CHECK(ckptio__st_dtype_ckptio(CKPTIO__ST_F4) == 0);
    CHECK(ckptio__st_dtype_bits(CKPTIO__ST_F6_E2M3) == 6);
    CHECK(refused("{\"t\":{\"dtype\":\"F12\",\"shape\":[],\"data_offsets\":[0,1]}}", 1,
                  CKPTIO_E_DTYPE, "tensor 't': unknown dtype 'F12'") == 0);
    CHECK(refused("{\"t\":{\"dtype\":\"f32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4,
                  CKPTIO_E_DTYPE, "unknown dtype") == 0);
    return 0;
}

static int test_strings(void)
{
    ckptio__st_header *h;
    /* é, the euro sign, and U+1F600 from a surrogate pair; \/ and \n */
    const char *j = "{\"\\u00e9\\u20AC\\ud83d\\ude00\\/\\n\":"
                    "{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
    CHECK_OK(parse(j, 1, &h));
    CHECK(!strcmp(name_of(h, 0), "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80/\n"));
    ckptio__st_free(h);
    const char *tail = ":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
    const struct {
        const char *name, *want;
    } bad[] = {
        {"\"a\\u0000b\"", "NUL"},
        {"\"\\ud83d\"", "invalid escape"},
        {"\"\\ude00x\"", "invalid escape"},
        {"\"\\ud83d\\u0041\"", "invalid escape"},
        {"\"\\x41\"", "invalid escape"},
        {"\"\\u12g4\"", "invalid escape"},
        {"\"a\tb\"", "control byte"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char buf[256];
        snprintf(buf, sizeof buf, "{%s%s", bad[i].name, tail);
        CHECK(refused(buf, 1, CKPTIO_E_CORRUPT, bad[i].want) == 0);
    }
    CHECK(refused("{\"a\\u", 0, CKPTIO_E_CORRUPT, "invalid escape") == 0);
    CHECK(refused("{\"abc", 0, CKPTIO_E_CORRUPT, "not closed") == 0);
    /* raw bytes that are not UTF-8: a stray continuation, an overlong, a surrogate */
    const char *nonutf[] = {"{\"ab\x80\":1}", "{\"\xc0\xaf\":1}", "{\"\xed\xa0\x80\":1}",
                            "{\"\xf4\x90\x80\x80\":1}", "{\"\xe2\x82\":1}"};
    for (size_t i = 0; i < sizeof nonutf / sizeof *nonutf; i++) {
        char want[64];
        snprintf(want, sizeof want, "not UTF-8 at byte %d", i == 0 ? 4 : 2);
        CHECK(refused(nonutf[i], 0, CKPTIO_E_CORRUPT, want) == 0);
    }
    return 0;
}

static int test_numbers(void)
{
    const char *fmt = "{\"t\":{\"dtype\":\"U8\",\"shape\":[%s],\"data_offsets\":[0,1]}}";
    const struct {
        const char *num, *want;
    } bad[] = {
        {"-1", "negative"},
        {"1.0", "not an integer"},
        {"1e0", "not an integer"},
        {"01", "leading zero"},
        {"18446744073709551616", "does not fit in 64 bits"},
        {"\"1\"", "expected an integer"},
        {"[1]", "expected an integer"},
        {"true", "expected an integer"},
        {"1,", "expected an integer"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char buf[256];
        snprintf(buf, sizeof buf, fmt, bad[i].num);
        CHECK(refused(buf, 1, CKPTIO_E_CORRUPT, bad[i].want) == 0);
    }
    /* the largest u64 parses; its product overflows the size */
    CHECK(refused("{\"t\":{\"dtype\":\"U8\",\"shape\":[18446744073709551615,2],"
                  "\"data_offsets\":[0,1]}}",
                  1, CKPTIO_E_SHAPE, "needs more than") == 0);
    CHECK(refused("{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,-1]}}", 1,
                  CKPTIO_E_CORRUPT, "data_offsets[1] at byte") == 0);
    CHECK(refused("{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 1,
                  CKPTIO_E_CORRUPT, "two integers") == 0);
    char many[1024] = "{\"t\":{\"dtype\":\"U8\",\"shape\":[1";
    for (int i = 0; i < CKPTIO_MAX_NDIM; i++) strcat(many, ",1");
    strcat(many, "],\"data_offsets\":[0,1]}}");
    CHECK(refused(many, 1, CKPTIO_E_LIMIT, "more than 32 dimensions") == 0);
    return 0;
}

static int test_layout(void)
{
    CHECK(refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                  8, CKPTIO_E_CORRUPT,
                  "tensor 'b': data_offsets [4, 8) overlap tensor 'a' [0, 8)") == 0);
    CHECK(refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                  12, CKPTIO_E_CORRUPT, "tensor 'b': data_offsets [8, 12) leave a gap [4, 8)") ==
          0);
    CHECK(refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 3,
                  CKPTIO_E_CORRUPT, "tensor 'a': data_offsets [0, 4) lie past the end") == 0);
    CHECK(refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 5,
                  CKPTIO_E_CORRUPT, "1 bytes unaccounted for") == 0);
    CHECK(refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4,
                  CKPTIO_E_CORRUPT, "end before they begin") == 0);
    CHECK(refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
                  CKPTIO_E_SHAPE, "tensor 'a': data_offsets [0, 4) hold 4 bytes but F32") == 0);
    CHECK(refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                  8, CKPTIO_E_DUPLICATE, "tensor 'a' appears twice") == 0);
    CHECK(refused("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, CKPTIO_E_DUPLICATE,
                  "metadata key 'k' appears twice") == 0);
    CHECK(refused("{\"__metadata__\":{},\"__metadata__\":{}}", 0, CKPTIO_E_DUPLICATE,
                  "\"__metadata__\" appears twice") == 0);
    return 0;
}

static int test_structure(void)
{
    const struct {
        const char *json, *want;
    } bad[] = {
        {"", "does not start with '{'"},
        {" {}", "does not start with '{'"},
        {"[]", "does not start with '{'"},
        {"{} x", "byte 3 after the header object is not a space"},
        {"{}\n", "not a space"},
        {"{}}", "not a space"},
        {"{", "expected a string (tensor name) at byte 1"},
        {"{\"a\":{\"dtype\"", "found the end"},
        {"{\"a\":1}", "expected '{' (tensor object)"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", "tensor 'a' lacks \"data_offsets\""},
        {"{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\"}}", "repeated field 'dtype'"},
        {"{\"a\":{\"dtype\":\"U8\",\"extra\":1}}", "unexpected or repeated field 'extra'"},
        {"{\"__metadata__\":{\"k\":1}}", "expected a string (metadata value)"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[[[[[[[[[[1]]]]]]]]]]}}", "expected an integer"},
        {"{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{", "expected a string (tensor name)"},
        {"{\"a\":{},}", "tensor 'a' lacks"},
        {"{\"a\" \"b\"}", "expected ':'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(refused(bad[i].json, 0, CKPTIO_E_CORRUPT, bad[i].want) == 0);
    /* A NUL byte where the JSON should be. */
    ckptio__st_header *h = NULL;
    CHECK(parse_n("{}\0", 3, 0, &h) == CKPTIO_E_CORRUPT && !h && strstr(err, "byte 2"));
    return 0;
}

static int test_lengths(void)
{
    ckptio__st_header *h = (ckptio__st_header *)err;
    static const uint8_t j[] = "{}";
    err[0] = 0;
    CHECK(ckptio__st_parse(j, 100000001, UINT64_MAX, &h, err, sizeof err) == CKPTIO_E_LIMIT);
    CHECK(!h && strstr(err, "header length 100000001 exceeds 100000000"));
    CHECK(ckptio__st_parse(j, UINT64_MAX, UINT64_MAX, &h, err, sizeof err) == CKPTIO_E_LIMIT);
    /* N past the file, and files shorter than the length word */
    CHECK(ckptio__st_parse(j, 2, 9, &h, err, sizeof err) == CKPTIO_E_CORRUPT);
    CHECK(!h && strstr(err, "header length 2 exceeds the file (9 bytes)"));
    CHECK(ckptio__st_parse(j, 2, 3, &h, err, sizeof err) == CKPTIO_E_CORRUPT);
    CHECK(ckptio__st_parse(j, 2, 10, &h, err, sizeof err) == 0);
    ckptio__st_free(h);
    return 0;
}

static bool same_str(const ckptio__st_header *a, uint64_t ao, uint64_t al,
                     const ckptio__st_header *b, uint64_t bo, uint64_t bl)
{
    return al == bl && !memcmp(a->strtab + ao, b->strtab + bo, al);
}

static bool same_header(const ckptio__st_header *a, const ckptio__st_header *b)
{
    if (a->n_tensors != b->n_tensors || a->n_meta != b->n_meta) return false;
    for (uint64_t i = 0; i < a->n_tensors; i++) {
        const ckptio__st_tensor *x = &a->tensors[i], *y = &b->tensors[i];
        if (!same_str(a, x->name, x->name_len, b, y->name, y->name_len) ||
            x->st_dtype != y->st_dtype || x->dtype != y->dtype || x->ndim != y->ndim ||
            x->begin != y->begin || x->end != y->end ||
            (x->ndim && memcmp(a->dims + x->dims, b->dims + y->dims, x->ndim * 8)))
            return false;
    }
    for (uint64_t i = 0; i < a->n_meta; i++) {
        const ckptio__st_meta *x = &a->meta[i], *y = &b->meta[i];
        if (!same_str(a, x->key, x->key_len, b, y->key, y->key_len) ||
            !same_str(a, x->val, x->val_len, b, y->val, y->val_len))
            return false;
    }
    return true;
}

/* parse(encode(parse(json))) == parse(json), with the data start a multiple of align. */
static int round_trip(const char *json, uint64_t dlen, uint64_t align)
{
    ckptio__st_header *a, *b;
    CHECK_OK(parse(json, dlen, &a));
    uint8_t *buf;
    uint64_t len;
    CHECK_OK(ckptio__st_encode(a, align, &buf, &len, err, sizeof err));
    CHECK(len % align == 0 && len >= 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | buf[i];
    CHECK(n == len - 8);
    if (align == 1) CHECK(buf[len - 1] == '}');
    int rc = ckptio__st_parse(buf + 8, n, len + dlen, &b, err, sizeof err);
    if (rc) fprintf(stderr, "%.*s\n -> %s\n", (int)n, (const char *)buf + 8, err);
    CHECK(rc == 0);
    CHECK(same_header(a, b));
    CHECK(b->data_start == len);
    free(buf);
    ckptio__st_free(a);
    ckptio__st_free(b);
    return 0;
}

static int test_encode(void)
{
    const char *j = "{\"__metadata__\":{\"format\":\"pt\",\"k\":\"v\\u0000w\\\"\"},"
                    "\"b\\\\\\\"\\u0001\\u00e9\":"
                    "{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[16,24]},"
                    "\"a\":{\"shape\":[2,2],\"data_offsets\":[0,16],\"dtype\":\"F32\"},"
                    "\"s\":{\"dtype\":\"F4\",\"shape\":[],\"data_offsets\":[24,25]},"
                    "\"z\":{\"dtype\":\"F64\",\"shape\":[3,0],\"data_offsets\":[25,25]}}";
    CHECK(round_trip(j, 25, 4096) == 0);
    CHECK(round_trip(j, 25, 1) == 0);
    CHECK(round_trip(j, 25, 8) == 0);
    CHECK(round_trip("{}", 0, 4096) == 0);
    CHECK(round_trip("{\"__metadata__\":{}}", 0, 64) == 0);
    ckptio__st_header *h;
    CHECK_OK(parse(j, 25, &h));
    uint8_t *buf;
    uint64_t len;
    CHECK(ckptio__st_encode(h, 3000, &buf, &len, err, sizeof err) == CKPTIO_E_USAGE);
    CHECK(ckptio__st_encode(h, 0, &buf, &len, err, sizeof err) == CKPTIO_E_USAGE);
    /* The public encoder reads the caller's layout by .size: a parsed header says the library's. */
    CHECK(h->size == sizeof *h);
    CHECK_OK(ckptio_st_encode(h, 1, &buf, &len, err, sizeof err));
    free(buf);
    h->size = 0;
    CHECK(ckptio_st_encode(h, 1, &buf, &len, err, sizeof err) == CKPTIO_E_USAGE);
    CHECK(buf == NULL && strstr(err, "sizeof(ckptio_st_header)"));
    h->size = sizeof *h;
    h->tensors[0].st_dtype = CKPTIO__ST_COUNT;
    CHECK(ckptio__st_encode(h, 1, &buf, &len, err, sizeof err) == CKPTIO_E_USAGE);
    CHECK(buf == NULL && strstr(err, "unknown dtype"));
    ckptio__st_free(h);
    return 0;
}

#ifdef CKPTIO_FUZZ_ST_REPLAY
static int test_corpus(void)
{
    CHECK(t_sh("%s %s", CKPTIO_FUZZ_ST_REPLAY, CKPTIO_SOURCE_ROOT "/fuzz/corpus/safetensors") == 0);
    return 0;
}
#endif

const ckptio_test tests_safetensors[] = {
    {"safetensors/valid", test_valid, 0, 0},
    {"safetensors/dtypes", test_dtypes, 0, 0},
    {"safetensors/strings", test_strings, 0, 0},
    {"safetensors/numbers", test_numbers, 0, 0},
    {"safetensors/layout", test_layout, 0, 0},
    {"safetensors/structure", test_structure, 0, 0},
    {"safetensors/lengths", test_lengths, 0, 0},
    {"safetensors/encode", test_encode, 0, 0},
#ifdef CKPTIO_FUZZ_ST_REPLAY
    {"safetensors/corpus", test_corpus, 0, 0},
#endif
    {0, 0, 0, 0},
};
