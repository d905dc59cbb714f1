/* SPDX-License-Identifier: Apache-2.0 */
/* Tests of the credential readers: AWS's INI files, JSON answers, the JSON escaper, times. */
#include <stdlib.h>

#include "../src/store/conf_parse.h"
#include "../src/store/s3_impl.h"
#include "test.h"

/* ---- INI ---- */

static const char aws_config[] =
    "# written by aws configure\n"
    "[default]\n"
    "region = us-east-1\n"
    "output=json\n"
    "\n"
    "[profile  dev]\n"
    "  ; an indented comment\n"
    "Region = eu-west-1   \n"
    "role_arn = arn:aws:iam::123456789012:role/dev\n"
    "source_profile = default\n"
    "s3 =\n"
    "    addressing_style = path\n"
    "    max_concurrent_requests=20\n"
    "\n"
    "    # comments and blank lines inside the block\n"
    "    region = not-a-top-level-key\n"
    "endpoint_url = http://localhost:9000 # not a comment\n"
    "[ profile\tprod ]\n"
    "region: ap-south-1\n"
    "sso_session = corp\n";

static int test_ini_sections(void)
{
    char v[128];
    CHECK(ckptio__ini_has(aws_config, "default") == 1);
    CHECK(ckptio__ini_has(aws_config, "profile dev") == 1);
    CHECK(ckptio__ini_has(aws_config, "profile   dev ") == 1); /* the caller's is normalized too */
    CHECK(ckptio__ini_has(aws_config, "profile prod") == 1);
    CHECK(ckptio__ini_has(aws_config, "dev") == 0);
    CHECK(ckptio__ini_has(aws_config, "Default") == 0); /* section names keep their case */
    CHECK(ckptio__ini_has(aws_config, "profile") == 0);
    CHECK(ckptio__ini_has("", "default") == 0);

    CHECK(ckptio__ini_get(aws_config, "default", "region", v, sizeof v) == 1);
    CHECK(!strcmp(v, "us-east-1"));
    CHECK(ckptio__ini_get(aws_config, "default", "output", v, sizeof v) == 1);
    CHECK(!strcmp(v, "json"));
    CHECK(ckptio__ini_get(aws_config, "profile dev", "REGION", v, sizeof v) == 1);
    CHECK(!strcmp(v, "eu-west-1")); /* keys ignore case; the value is trimmed */
    CHECK(ckptio__ini_get(aws_config, "profile dev", "role_arn", v, sizeof v) == 1);
    CHECK(!strcmp(v, "arn:aws:iam::123456789012:role/dev")); /* the first '=' splits */
    CHECK(ckptio__ini_get(aws_config, "profile dev", "endpoint_url", v, sizeof v) == 1);
    CHECK(!strcmp(v, "http://localhost:9000 # not a comment"));
    CHECK(ckptio__ini_get(aws_config, "profile dev", "s3", v, sizeof v) == 1);
    CHECK(!strcmp(v, ""));
    CHECK(ckptio__ini_get(aws_config, "profile prod", "region", v, sizeof v) == 1);
    CHECK(!strcmp(v, "ap-south-1")); /* ':' delimits too, as in configparser */
    CHECK(ckptio__ini_get(aws_config, "profile prod", "sso_session", v, sizeof v) == 1);
    CHECK(!strcmp(v, "corp"));
    /* missing: a key of another section, a section that is not there, a comment's text */
    CHECK(ckptio__ini_get(aws_config, "default", "role_arn", v, sizeof v) == 0 && !v[0]);
    CHECK(ckptio__ini_get(aws_config, "profile nope", "region", v, sizeof v) == 0);
    CHECK(ckptio__ini_get(aws_config, "profile dev", "an", v, sizeof v) == 0);
    CHECK(ckptio__ini_get(aws_config, "profile dev", "addressing_style", v, sizeof v) == 0);
    CHECK(ckptio__ini_get(aws_config, "profile dev", "regio", v, sizeof v) == 0);
    CHECK(ckptio__ini_get(aws_config, "profile dev", "region ", v, sizeof v) == 0);
    return 0;
}

static int test_ini_sub(void)
{
    char v[64];
    CHECK(ckptio__ini_sub(aws_config, "profile dev", "s3", "addressing_style", v, sizeof v) == 1);
    CHECK(!strcmp(v, "path"));
    CHECK(ckptio__ini_sub(aws_config, "profile dev", "S3", "max_concurrent_requests", v,
                          sizeof v) == 1);
    CHECK(!strcmp(v, "20"));
    /* an indented line after the block's blank line and comment is still the block's */
    CHECK(ckptio__ini_sub(aws_config, "profile dev", "s3", "region", v, sizeof v) == 1);
    CHECK(!strcmp(v, "not-a-top-level-key"));
    CHECK(ckptio__ini_get(aws_config, "profile dev", "region", v, sizeof v) == 1);
    CHECK(!strcmp(v, "eu-west-1"));
    CHECK(ckptio__ini_sub(aws_config, "profile dev", "s3", "Addressing_Style", v, sizeof v) == 0);
    CHECK(ckptio__ini_sub(aws_config, "profile dev", "s3", "nope", v, sizeof v) == 0);
    CHECK(ckptio__ini_sub(aws_config, "default", "s3", "addressing_style", v, sizeof v) == 0);
    CHECK(ckptio__ini_sub(aws_config, "profile dev", "region", "x", v, sizeof v) == 0);
    /* a key with a value of its own has no nested settings */
    CHECK(ckptio__ini_sub("[a]\ns3 = x\n  addressing_style = path\n", "a", "s3",
                          "addressing_style", v, sizeof v) == 0);
    /* a later plain s3 replaces the block; a later block replaces an earlier one */
    CHECK(ckptio__ini_sub("[a]\ns3 =\n  addressing_style = path\ns3 = x\n", "a", "s3",
                          "addressing_style", v, sizeof v) == 0);
    CHECK(ckptio__ini_sub("[a]\ns3 =\n  addressing_style = path\n[b]\n[a]\ns3 =\n"
                          "  use_accelerate_endpoint = true\n",
                          "a", "s3", "addressing_style", v, sizeof v) == 0);
    /* a line less indented than the first continuation but deeper than the key still counts */
    CHECK(ckptio__ini_sub("[a]\n  s3 =\n      x = 1\n   y = 2\n  z = 3\n", "a", "s3", "y", v,
                          sizeof v) == 1);
    CHECK(!strcmp(v, "2"));
    CHECK(ckptio__ini_get("[a]\n  s3 =\n      x = 1\n   y = 2\n  z = 3\n", "a", "z", v,
                          sizeof v) == 1);
    CHECK(!strcmp(v, "3"));
    /* indented lines right after a header are keys (there is no key to continue) */
    CHECK(ckptio__ini_get("[a]\n    k = v\n", "a", "k", v, sizeof v) == 1 && !strcmp(v, "v"));
    return 0;
}

static int test_ini_lines(void)
{
    char v[64];
    static const char creds[] =
        "[default]\r\n"
        "aws_access_key_id = AKIDEXAMPLE\r\n"
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY\r\n"
        "\r\n"
        "[dev]\r"
        "aws_access_key_id=AKIDDEV\r"
        "aws_session_token =\r\n";
    CHECK(ckptio__ini_get(creds, "default", "aws_secret_access_key", v, sizeof v) == 1);
    CHECK(!strcmp(v, "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")); /* no '\r' left */
    CHECK(ckptio__ini_get(creds, "dev", "aws_access_key_id", v, sizeof v) == 1);
    CHECK(!strcmp(v, "AKIDDEV")); /* a lone CR ends a line too */
    CHECK(ckptio__ini_get(creds, "dev", "aws_session_token", v, sizeof v) == 1 && !v[0]);
    CHECK(ckptio__ini_get(creds, "dev", "aws_secret_access_key", v, sizeof v) == 0);

    /* comments: full lines only, '#' or ';', indented or not */
    static const char c[] = "[a]\n# k = 1\n ;k = 2\nk = 3 ; four\n#k = 5\n";
    CHECK(ckptio__ini_get(c, "a", "k", v, sizeof v) == 1 && !strcmp(v, "3 ; four"));
    CHECK(ckptio__ini_get("#[a]\nk = 1\n", "a", "k", v, sizeof v) == 0);

    /* duplicates: the last wins across the file, sections merge */
    static const char d[] = "[a]\nk = 1\nj = x\n[b]\nk = 2\n[a]\nK = 3\n[a]\n";
    CHECK(ckptio__ini_get(d, "a", "k", v, sizeof v) == 1 && !strcmp(v, "3"));
    CHECK(ckptio__ini_get(d, "a", "j", v, sizeof v) == 1 && !strcmp(v, "x"));
    CHECK(ckptio__ini_get(d, "b", "k", v, sizeof v) == 1 && !strcmp(v, "2"));

    /* what is no setting is skipped: keys before any section, lines without a delimiter,
     * an empty key, a header without ']' (its keys stay in the section before it) */
    static const char junk[] = "k = 0\n[a]\njust words\n= 1\n[b\nk = 2\n";
    CHECK(ckptio__ini_get(junk, "a", "k", v, sizeof v) == 1 && !strcmp(v, "2"));
    CHECK(ckptio__ini_has(junk, "b") == 0);
    CHECK(ckptio__ini_get(junk, "a", "", v, sizeof v) == 0);
    /* the last ']' closes a header; what follows it is ignored */
    CHECK(ckptio__ini_get("[a]b] x\nk=1\n", "a]b", "k", v, sizeof v) == 1);
    CHECK(ckptio__ini_get("[a]\nk\n", "a", "k", v, sizeof v) == 0);
    CHECK(ckptio__ini_get("[a]\nk=v", "a", "k", v, sizeof v) == 1 && !strcmp(v, "v"));
    return 0;
}

static int test_ini_limit(void)
{
    char v[8];
    CHECK(ckptio__ini_get("[a]\nk = 1234567\n", "a", "k", v, sizeof v) == 1);
    CHECK(!strcmp(v, "1234567"));
    CHECK_ERR(ckptio__ini_get("[a]\nk = 12345678\n", "a", "k", v, sizeof v), CKPTIO_E_LIMIT);
    CHECK(!v[0]);
    CHECK_ERR(ckptio__ini_sub("[a]\nk =\n  s = 12345678\n", "a", "k", "s", v, sizeof v),
              CKPTIO_E_LIMIT);
    CHECK_ERR(ckptio__ini_get("[a]\nk =\n", "a", "k", v, 0), CKPTIO_E_LIMIT);
    /* a long file: work is linear, lines of any length */
    size_t n = 1 << 20;
    char *big = malloc(n + 64);
    CHECK(big);
    memcpy(big, "[a]\nk = ", 8);
    memset(big + 8, 'x', n);
    memcpy(big + 8 + n, "\nj = 2\n", 8);
    char out[16];
    CHECK_ERR(ckptio__ini_get(big, "a", "k", out, sizeof out), CKPTIO_E_LIMIT);
    CHECK(ckptio__ini_get(big, "a", "j", out, sizeof out) == 1 && !strcmp(out, "2"));
    free(big);
    return 0;
}

/* ---- JSON ---- */

#define J(s) s, sizeof(s) - 1

static int test_json_paths(void)
{
    char v[256];
    static const char ext[] =
        "{\"type\": \"external_account\",\n"
        " \"audience\": \"//iam.googleapis.com/projects/1/x\",\n"
        " \"credential_source\": {\"file\": \"/var/run/token\",\n"
        "   \"format\": {\"type\": \"json\", \"subject_token_field_name\": \"access_token\"}},\n"
        " \"n\": -12.5e3, \"t\": true, \"f\": false, \"z\": null, \"arr\": [1, {\"a\": 2}],\n"
        " \"empty\": {}, \"\": \"blank key\", \"dot.key\": 1}";
    CHECK(ckptio__json_get(J(ext), "type", v, sizeof v) == 1 && !strcmp(v, "external_account"));
    CHECK(ckptio__json_get(J(ext), "credential_source.format.type", v, sizeof v) == 1);
    CHECK(!strcmp(v, "json"));
    CHECK(ckptio__json_get(J(ext), "credential_source.file", v, sizeof v) == 1);
    CHECK(!strcmp(v, "/var/run/token"));
    CHECK(ckptio__json_get(J(ext), "credential_source.format", v, sizeof v) == 1);
    CHECK(!strcmp(v, "{\"type\": \"json\", \"subject_token_field_name\": \"access_token\"}"));
    CHECK(ckptio__json_get(J(ext), "n", v, sizeof v) == 1 && !strcmp(v, "-12.5e3"));
    CHECK(ckptio__json_get(J(ext), "t", v, sizeof v) == 1 && !strcmp(v, "true"));
    CHECK(ckptio__json_get(J(ext), "f", v, sizeof v) == 1 && !strcmp(v, "false"));
    CHECK(ckptio__json_get(J(ext), "z", v, sizeof v) == 1 && !strcmp(v, "null"));
    CHECK(ckptio__json_get(J(ext), "arr", v, sizeof v) == 1 && !strcmp(v, "[1, {\"a\": 2}]"));
    CHECK(ckptio__json_get(J(ext), "empty", v, sizeof v) == 1 && !strcmp(v, "{}"));
    CHECK(ckptio__json_get(J(ext), "", v, sizeof v) == 1 && !strcmp(v, "blank key"));
    /* absent: missing keys, paths through non-objects (an array, a string, a number) */
    CHECK(ckptio__json_get(J(ext), "missing", v, sizeof v) == 0 && !v[0]);
    CHECK(ckptio__json_get(J(ext), "credential_source.format.nope", v, sizeof v) == 0);
    CHECK(ckptio__json_get(J(ext), "arr.a", v, sizeof v) == 0);
    CHECK(ckptio__json_get(J(ext), "type.x", v, sizeof v) == 0);
    CHECK(ckptio__json_get(J(ext), "n.x", v, sizeof v) == 0);
    CHECK(ckptio__json_get(J(ext), "empty.x", v, sizeof v) == 0);
    CHECK(ckptio__json_get(J(ext), "dot.key", v, sizeof v) == 0); /* '.' always separates */
    CHECK(ckptio__json_get(J(ext), "Type", v, sizeof v) == 0);    /* keys are exact */
    CHECK(ckptio__json_get(J(ext), "typ", v, sizeof v) == 0);
    CHECK(ckptio__json_get(J(ext), "types", v, sizeof v) == 0);
    CHECK(ckptio__json_get(J("{}"), "a", v, sizeof v) == 0);
    CHECK(ckptio__json_get(J(" \r\n\t{ \"a\" : 1 } \n"), "a", v, sizeof v) == 1 && !strcmp(v, "1"));

    /* json_str: strings only */
    CHECK(ckptio__json_str(J(ext), "audience", v, sizeof v) == 1);
    CHECK(!strcmp(v, "//iam.googleapis.com/projects/1/x"));
    CHECK_ERR(ckptio__json_str(J(ext), "n", v, sizeof v), CKPTIO_E_CORRUPT);
    CHECK_ERR(ckptio__json_str(J(ext), "z", v, sizeof v), CKPTIO_E_CORRUPT);
    CHECK_ERR(ckptio__json_str(J(ext), "credential_source", v, sizeof v), CKPTIO_E_CORRUPT);
    CHECK(ckptio__json_str(J(ext), "missing", v, sizeof v) == 0);

    /* duplicate keys: the last wins, at every level */
    static const char dup[] = "{\"a\": {\"b\": 1}, \"k\": \"x\", \"a\": {\"c\": 2}, \"k\": \"y\"}";
    CHECK(ckptio__json_get(J(dup), "k", v, sizeof v) == 1 && !strcmp(v, "y"));
    CHECK(ckptio__json_get(J(dup), "a.b", v, sizeof v) == 0);
    CHECK(ckptio__json_get(J(dup), "a.c", v, sizeof v) == 1 && !strcmp(v, "2"));
    /* keys compare after their escapes are decoded */
    CHECK(ckptio__json_get(J("{\"ac\\u0063ess\\/x\": 7}"), "access/x", v, sizeof v) == 1);
    CHECK(!strcmp(v, "7"));

    /* members one by one, in the text's order, a repeated key each time */
    char k[32];
    CHECK(ckptio__json_member(J(dup), NULL, 0, k, sizeof k, v, sizeof v) == 1);
    CHECK(!strcmp(k, "a") && !strcmp(v, "{\"b\": 1}"));
    CHECK(ckptio__json_member(J(dup), NULL, 3, k, sizeof k, v, sizeof v) == 1);
    CHECK(!strcmp(k, "k") && !strcmp(v, "y"));
    CHECK(ckptio__json_member(J(dup), NULL, 4, k, sizeof k, v, sizeof v) == 0 && !k[0] && !v[0]);
    CHECK(ckptio__json_member(J(ext), "credential_source.format", 1, k, sizeof k, v, sizeof v) == 1);
    CHECK(!strcmp(k, "subject_token_field_name") && !strcmp(v, "access_token"));
    CHECK(ckptio__json_member(J(ext), "empty", 0, k, sizeof k, v, sizeof v) == 0);
    CHECK(ckptio__json_member(J(ext), "type", 0, k, sizeof k, v, sizeof v) == 0); /* no object */
    CHECK(ckptio__json_member(J(ext), "missing", 0, k, sizeof k, v, sizeof v) == 0);
    CHECK(ckptio__json_member(J("{\"a\\u0062\": 1}"), NULL, 0, k, 3, v, sizeof v) == 1);
    CHECK(!strcmp(k, "ab") && !strcmp(v, "1"));
    CHECK_ERR(ckptio__json_member(J("{\"abc\": 1}"), NULL, 0, k, 3, v, sizeof v), CKPTIO_E_LIMIT);
    CHECK(!k[0] && !v[0]);
    CHECK_ERR(ckptio__json_member(J("{\"a\": 123}"), NULL, 0, k, sizeof k, v, 3), CKPTIO_E_LIMIT);
    CHECK(!k[0] && !v[0]);
    CHECK_ERR(ckptio__json_member(J("{\"a\": 1"), NULL, 0, k, sizeof k, v, sizeof v),
              CKPTIO_E_CORRUPT);
    return 0;
}

static int test_json_strings(void)
{
    char v[64];
    CHECK(ckptio__json_str(J("{\"s\": \"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\te\"}"), "s", v,
                           sizeof v) == 1);
    CHECK(!strcmp(v, "a\"b\\c/d\b\f\n\r\te"));
    CHECK(ckptio__json_str(J("{\"s\": \"\\u00e9\\u20AC\\ud83d\\ude00x\"}"), "s", v, sizeof v) == 1);
    CHECK(!strcmp(v, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80x"));
    CHECK(ckptio__json_str(J("{\"s\": \"\xc3\xa9\xf0\x9f\x98\x80\"}"), "s", v, sizeof v) == 1);
    CHECK(!strcmp(v, "\xc3\xa9\xf0\x9f\x98\x80")); /* raw UTF-8 passes */
    CHECK(ckptio__json_str(J("{\"s\": \"\"}"), "s", v, sizeof v) == 1 && !v[0]);
    /* what no string may hold, wherever it is in the text */
    static const char *const bad[] = {
        "{\"s\": \"\\u0000\"}",         /* NUL */
        "{\"s\": \"\\ud83d\"}",         /* a high surrogate alone */
        "{\"s\": \"\\ud83dx\"}",        /* ... followed by something else */
        "{\"s\": \"\\ud83d\\u0041\"}",  /* ... followed by no low one */
        "{\"s\": \"\\ude00\"}",         /* a low surrogate alone */
        "{\"s\": \"\\u12\"}",           /* short */
        "{\"s\": \"\\u12g4\"}",         /* not hex */
        "{\"s\": \"\\x\"}",             /* unknown escape */
        "{\"s\": \"\\'\"}",             /* not JSON's */
        "{\"s\": \"a\tb\"}",            /* raw control byte */
        "{\"s\": \"\xff\"}",            /* not UTF-8 */
        "{\"s\": \"\xc0\x80\"}",        /* overlong */
        "{\"s\": \"\xed\xa0\x80\"}",    /* an encoded surrogate */
        "{\"s\": \"\xf4\x90\x80\x80\"}", /* past U+10FFFF */
        "{\"s\": \"\xe2\x82\"}",        /* cut short */
        "{\"x\": \"\\u0000\", \"s\": \"ok\"}",
        "\xef\xbb\xbf{\"s\": \"bom\"}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        if (ckptio__json_get(bad[i], strlen(bad[i]), "s", v, sizeof v) != CKPTIO_E_CORRUPT) {
            fprintf(stderr, "accepted bad[%zu]\n", i);
            return 1;
        }
    }
    /* a raw NUL byte is neither white space nor part of any token */
    CHECK_ERR(ckptio__json_get("{\"s\": 1}\0", 9, "s", v, sizeof v), CKPTIO_E_CORRUPT);
    CHECK_ERR(ckptio__json_get("{\"s\": \"a\0b\"}", 12, "s", v, sizeof v), CKPTIO_E_CORRUPT);

    /* a service account's key: ~1.7 KB with "\n" escapes, in a 4096-byte buffer */
    char pem[2048], doc[4096], key[4096];
    size_t n = (size_t)snprintf(pem, sizeof pem, "-----BEGIN PRIVATE KEY-----\\n");
    for (int line = 0; line < 26; line++) {
        for (int i = 0; i < 64; i++) pem[n++] = "ABCDEFGHabcdefgh0123456789+/"[(line * 7 + i) % 28];
        memcpy(pem + n, "\\n", 2);
        n += 2;
    }
    n += (size_t)snprintf(pem + n, sizeof pem - n, "-----END PRIVATE KEY-----\\n");
    int dl = snprintf(doc, sizeof doc,
                      "{\"type\": \"service_account\", \"project_id\": \"p\", \"private_key_id\": "
                      "\"0123abcd\", \"private_key\": \"%s\", \"client_email\": "
                      "\"sa@p.iam.gserviceaccount.com\", \"token_uri\": "
                      "\"https://oauth2.googleapis.com/token\"}",
                      pem);
    CHECK(dl > 0 && (size_t)dl < sizeof doc);
    CHECK(ckptio__json_str(doc, (size_t)dl, "private_key", key, sizeof key) == 1);
    CHECK(strlen(key) > 1700 && !strncmp(key, "-----BEGIN PRIVATE KEY-----\n", 28));
    CHECK(!strcmp(key + strlen(key) - 26, "-----END PRIVATE KEY-----\n"));
    CHECK(!strchr(key, '\\'));
    CHECK(ckptio__json_str(doc, (size_t)dl, "client_email", v, sizeof v) == 1);
    CHECK(!strcmp(v, "sa@p.iam.gserviceaccount.com"));
    return 0;
}

static int test_json_bad(void)
{
    char v[64];
    static const char *const bad[] = {
        "", " ", "[]", "\"s\"", "1", "null", /* the top must be an object */
        "{", "{\"a\"", "{\"a\":", "{\"a\":1", "{\"a\":1,", "{\"a\":\"x", "{\"a\":[1,2}",
        "{\"a\":1}x", "{\"a\":1} {}", "{\"a\":1}}", "{\"a\":1,}", "{,}", "{\"a\" 1}",
        "{a:1}", "{'a':1}", "{\"a\":tru}", "{\"a\":nul}", "{\"a\":True}", "{\"a\":01}",
        "{\"a\":-}", "{\"a\":1.}", "{\"a\":.5}", "{\"a\":1e}", "{\"a\":+1}", "{\"a\":0x10}",
        "{\"a\":NaN}", "{\"a\":[1,]}", "{\"a\":[,1]}", "{\"a\":{\"b\":1]}", "{\"a\":1;}",
        "{\"a\"\f:1}", /* form feed is not JSON white space */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = ckptio__json_get(bad[i], strlen(bad[i]), "a", v, sizeof v);
        if (rc != CKPTIO_E_CORRUPT || v[0]) {
            fprintf(stderr, "bad[%zu] '%s' -> %d\n", i, bad[i], rc);
            return 1;
        }
    }
    /* the text's length is what counts, not a NUL */
    CHECK(ckptio__json_get("{\"a\":1}garbage", 7, "a", v, sizeof v) == 1 && !strcmp(v, "1"));
    CHECK_ERR(ckptio__json_get("{\"a\":1}", 6, "a", v, sizeof v), CKPTIO_E_CORRUPT);
    /* the whole text is checked even where the member comes first */
    CHECK_ERR(ckptio__json_get(J("{\"a\":1, \"b\": [}"), "a", v, sizeof v), CKPTIO_E_CORRUPT);

    /* depth: 32 levels pass, 33 are refused (objects, arrays), a deep bomb costs nothing */
    char deep[200000];
    for (int levels = 31; levels <= 33; levels++) {
        int want = levels <= CKPTIO__JSON_DEPTH ? 0 : CKPTIO_E_CORRUPT;
        size_t n = 0;
        for (int i = 0; i < levels; i++) memcpy(deep + n, "{\"a\":", 5), n += 5;
        deep[n++] = '1';
        for (int i = 0; i < levels; i++) deep[n++] = '}';
        CHECK_ERR(ckptio__json_get(deep, n, "x", v, sizeof v), want);
        n = 0;
        memcpy(deep + n, "{\"a\":", 5), n += 5;
        for (int i = 1; i < levels; i++) deep[n++] = '[';
        for (int i = 1; i < levels; i++) deep[n++] = ']';
        deep[n++] = '}';
        CHECK_ERR(ckptio__json_get(deep, n, "x", v, sizeof v), want);
    }
    memset(deep, '[', sizeof deep);
    deep[0] = '{';
    CHECK_ERR(ckptio__json_get(deep, sizeof deep, "a", v, sizeof v), CKPTIO_E_CORRUPT);
    size_t n = 0;
    while (n + 6 < sizeof deep) memcpy(deep + n, "{\"a\":", 5), n += 5;
    CHECK_ERR(ckptio__json_get(deep, n, "a.a.a", v, sizeof v), CKPTIO_E_CORRUPT);
    /* nested objects 32 deep reached by a long path */
    n = 0;
    for (int i = 0; i < 32; i++) memcpy(deep + n, "{\"a\":", 5), n += 5;
    deep[n++] = '7';
    for (int i = 0; i < 32; i++) deep[n++] = '}';
    char path[128] = "a";
    for (int i = 1; i < 32; i++) strcat(path, ".a");
    CHECK(ckptio__json_get(deep, n, path, v, sizeof v) == 1 && !strcmp(v, "7"));
    strcat(path, ".a");
    CHECK(ckptio__json_get(deep, n, path, v, sizeof v) == 0);
    return 0;
}

static int test_json_limit(void)
{
    char v[8];
    CHECK(ckptio__json_get(J("{\"a\":\"1234567\"}"), "a", v, sizeof v) == 1);
    CHECK_ERR(ckptio__json_get(J("{\"a\":\"12345678\"}"), "a", v, sizeof v), CKPTIO_E_LIMIT);
    CHECK(!v[0]);
    /* the decoded length counts: 7 escapes of 6 bytes make 7 bytes */
    CHECK(ckptio__json_str(J("{\"a\":\"\\u0041\\u0041\\u0041\\u0041\\u0041\\u0041\\u0041\"}"), "a",
                           v, sizeof v) == 1);
    CHECK(!strcmp(v, "AAAAAAA"));
    /* a multi-byte character is never cut */
    CHECK_ERR(ckptio__json_str(J("{\"a\":\"123456\\u00e9\"}"), "a", v, sizeof v), CKPTIO_E_LIMIT);
    CHECK_ERR(ckptio__json_get(J("{\"a\":12345678}"), "a", v, sizeof v), CKPTIO_E_LIMIT);
    CHECK_ERR(ckptio__json_get(J("{\"a\":[1,2,3,4]}"), "a", v, sizeof v), CKPTIO_E_LIMIT);
    CHECK_ERR(ckptio__json_get(J("{\"a\":\"\"}"), "a", v, 0), CKPTIO_E_LIMIT);
    CHECK_ERR(ckptio__json_str(J("{\"a\":\"\"}"), "a", v, 0), CKPTIO_E_LIMIT);
    CHECK(ckptio__json_get(J("{\"a\":\"\"}"), "b", v, 0) == 0);
    /* CORRUPT before LIMIT: a bad text is bad whatever the buffer */
    CHECK_ERR(ckptio__json_get(J("{\"a\":\"12345678\"} x"), "a", v, sizeof v), CKPTIO_E_CORRUPT);
    return 0;
}

static int test_json_int(void)
{
    int64_t x = -1;
    static const char doc[] =
        "{\"expires_in\": 3599, \"s\": \"3600\", \"neg\": -42, \"zero\": 0, \"negs\": \"-7\","
        " \"max\": 9223372036854775807, \"min\": -9223372036854775808,"
        " \"over\": 9223372036854775808, \"under\": \"-9223372036854775809\","
        " \"big\": 123456789012345678901234567890,"
        " \"f\": 1.5, \"e\": 1e3, \"fz\": 3600.0, \"t\": true, \"n\": null, \"o\": {}, \"a\": [1],"
        " \"sp\": \" 1\", \"sx\": \"1x\", \"se\": \"\", \"sm\": \"-\", \"sf\": \"1.0\","
        " \"sp2\": \"+1\", \"m0\": -0}";
    CHECK(ckptio__json_int(J(doc), "expires_in", &x) == 1 && x == 3599);
    CHECK(ckptio__json_int(J(doc), "s", &x) == 1 && x == 3600);
    CHECK(ckptio__json_int(J(doc), "neg", &x) == 1 && x == -42);
    CHECK(ckptio__json_int(J(doc), "zero", &x) == 1 && x == 0);
    CHECK(ckptio__json_int(J(doc), "negs", &x) == 1 && x == -7);
    CHECK(ckptio__json_int(J(doc), "max", &x) == 1 && x == INT64_MAX);
    CHECK(ckptio__json_int(J(doc), "min", &x) == 1 && x == INT64_MIN);
    CHECK(ckptio__json_int(J(doc), "m0", &x) == 1 && x == 0);
    static const char *const bad[] = {"over", "under", "big", "f",  "e",  "fz", "t",  "n",
                                      "o",    "a",     "sp",  "sx", "se", "sm", "sf", "sp2"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        x = 5;
        if (ckptio__json_int(J(doc), bad[i], &x) != CKPTIO_E_CORRUPT || x != 5) {
            fprintf(stderr, "json_int accepted '%s'\n", bad[i]);
            return 1;
        }
    }
    CHECK(ckptio__json_int(J(doc), "missing", &x) == 0 && x == 5);
    CHECK_ERR(ckptio__json_int(J("{\"a\": 1"), "a", &x), CKPTIO_E_CORRUPT);
    return 0;
}

static int test_json_escape(void)
{
    char out[64];
    CHECK(ckptio__json_escape("plain", out, sizeof out) == 5 && !strcmp(out, "plain"));
    CHECK(ckptio__json_escape("a\"b\\c\n\r\t\b\f\x01\x1f\x7f\xc3\xa9/", out, sizeof out) == 33);
    CHECK(!strcmp(out, "a\\\"b\\\\c\\n\\r\\t\\b\\f\\u0001\\u001f\x7f\xc3\xa9/"));
    CHECK(ckptio__json_escape("", out, sizeof out) == 0 && !out[0]);
    /* like snprintf: the length needed, a cut prefix, a NUL */
    CHECK(ckptio__json_escape("abc\"def", out, 5) == 8 && !strcmp(out, "abc\\"));
    CHECK(ckptio__json_escape("abc", out, 4) == 3 && !strcmp(out, "abc"));
    CHECK(ckptio__json_escape("abc", out, 3) == 3 && !strcmp(out, "ab"));
    CHECK(ckptio__json_escape("abc", NULL, 0) == 3);
    /* and what it writes reads back */
    const char *s = "key \"q\" \\ line\nnext\ttab \x02 \xe2\x82\xac";
    char doc[128], back[64];
    size_t n = ckptio__json_escape(s, out, sizeof out);
    CHECK(n < sizeof out);
    int dl = snprintf(doc, sizeof doc, "{\"k\": \"%s\"}", out);
    CHECK(ckptio__json_str(doc, (size_t)dl, "k", back, sizeof back) == 1 && !strcmp(back, s));
    return 0;
}

/* Credential expirations come in three shapes; all are UTC. */
static int test_times(void)
{
    int64_t t = 0;
    CHECK_OK(ckptio__time_iso("2026-12-07T05:00:00Z", &t));
    CHECK(t == 1796619600);
    CHECK_OK(ckptio__time_iso("2026-12-07T05:00:00.123Z", &t));
    CHECK(t == 1796619600);
    CHECK_OK(ckptio__time_iso("2026-12-07T05:00:00+00:00", &t));
    CHECK(t == 1796619600);
    CHECK_OK(ckptio__time_iso("2026-12-07T05:00:00.123456+00:00", &t));
    CHECK(t == 1796619600);
    CHECK_ERR(ckptio__time_iso("2026-12-07T05:00:00+01:00", &t), CKPTIO_E_CORRUPT);
    CHECK_ERR(ckptio__time_iso("2026-12-07T05:00:00Zjunk", &t), CKPTIO_E_CORRUPT);
    CHECK_ERR(ckptio__time_iso("2026-12-07 05:00", &t), CKPTIO_E_CORRUPT);
    return 0;
}

static int test_fuzz_corpus(void)
{
#ifdef CKPTIO_FUZZ_CONF_REPLAY
    CHECK(t_sh("%s %s", CKPTIO_FUZZ_CONF_REPLAY, CKPTIO_SOURCE_ROOT "/fuzz/corpus/conf") == 0);
    return 0;
#else
    return T_SKIP;
#endif
}

const ckptio_test tests_conf[] = {
    {"conf/ini_sections", test_ini_sections, 0, 0},
    {"conf/ini_sub", test_ini_sub, 0, 0},
    {"conf/ini_lines", test_ini_lines, 0, 0},
    {"conf/ini_limit", test_ini_limit, 0, 0},
    {"conf/json_paths", test_json_paths, 0, 0},
    {"conf/json_strings", test_json_strings, 0, 0},
    {"conf/json_bad", test_json_bad, 0, 0},
    {"conf/json_limit", test_json_limit, 0, 0},
    {"conf/json_int", test_json_int, 0, 0},
    {"conf/json_escape", test_json_escape, 0, 0},
    {"conf/times", test_times, 0, 0},
    {"conf/fuzz_corpus", test_fuzz_corpus, 0, 0},
    {0, 0, 0, 0},
};
