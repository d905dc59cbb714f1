/* SPDX-License-Identifier: Apache-2.0 */
/* Pure readers of what cloud credentials come in: AWS's INI files and JSON answers. */
#ifndef CKPTIO_STORE_CONF_PARSE_H
#define CKPTIO_STORE_CONF_PARSE_H

#include <stddef.h>
#include <stdint.h>

#include "../common/common.h"

/* Every function here is pure: no I/O, no allocation, work linear in the text (times the
 * number of path components for JSON), safe on any bytes, thread-safe. The text may come
 * from a network answer. Outputs are NUL-terminated whenever cap > 0, also on failure ("" then);
 * cap 0 is always CKPTIO_E_LIMIT. */

/* ---- AWS shared config and credentials files ----
 *
 * Read as botocore reads them (Python's configparser, then botocore's own rules):
 *  - Lines end at LF, CRLF or a lone CR. Blank lines are ignored.
 *  - A line whose first non-blank byte is '#' or ';' is a comment, wherever it is indented.
 *  - "[name]" starts a section. The name between '[' and the last ']' is trimmed, and runs of
 *    spaces and tabs inside it count as one space, so "[profile   dev]" and "[ profile dev ]"
 *    are both "profile dev". ~/.aws/config names "default" and "profile NAME", ~/.aws/credentials
 *    "NAME": callers pass the section as the file names it. Section names are case-sensitive.
 *  - "key = value" or "key: value" (the first '=' or ':' splits), key and value trimmed; keys
 *    are compared ignoring ASCII case. Inline comments are NOT stripped: "region = x # y" is
 *    "x # y" (configparser's default, and botocore's).
 *  - A line indented deeper than the key line above it belongs to that key (a continuation):
 *    it is never read as a key of its own. A key with an empty value and such lines below it
 *    is a nested setting ("s3 =\n    addressing_style = path"); the lines of a non-empty value
 *    are a multi-line value, of which ckptio__ini_get returns the first line only.
 *  - A section given twice is one section; a key given twice (anywhere in it) is its last.
 *  - Lines that are none of these (no delimiter, an empty key, keys before any section) are
 *    skipped, where configparser would refuse the whole file.
 * text is NUL-terminated; section, key and sub are plain NUL-terminated names. */

/* The value of `key` in `section`: 1 (copied into out, cap bytes), 0 when absent,
 * CKPTIO_E_LIMIT when it does not fit. */
CKPTIO__HIDDEN int ckptio__ini_get(const char *text, const char *section, const char *key,
                                   char *out, size_t cap);
/* The value of `sub` in the nested setting `key` of `section` ("sub = value" under "key =";
 * split at the first '=' only, as botocore splits them; the last `sub` wins). Same returns;
 * 0 also when the key's last occurrence has a value of its own. */
CKPTIO__HIDDEN int ckptio__ini_sub(const char *text, const char *section, const char *key,
                                   const char *sub, char *out, size_t cap);
/* Whether `section` exists (1) or not (0). */
CKPTIO__HIDDEN int ckptio__ini_has(const char *text, const char *section);

/* ---- JSON answers (container and instance credentials, credential_process output, Google
 * service-account files, OAuth2 token answers, GCE metadata) ----
 *
 * The text [text, text + len) must be one JSON value (RFC 8259) whose top is an object, with
 * nothing but white space after it; it is checked whole before anything is looked up, else
 * CKPTIO_E_CORRUPT. Stricter than RFC 8259 in three ways, so that every string decodes: the
 * text must be valid UTF-8 (no BOM), and no string may hold \u0000 or an unpaired surrogate.
 * Objects and arrays nest at most CKPTIO__JSON_DEPTH deep (the top object is depth 1).
 *
 * path names a member: keys separated by '.' into nested objects ("credential_source.format.
 * type"); a key holding '.' cannot be named, an empty component names the key "". Keys are
 * compared byte for byte after decoding escapes. An object giving a key twice has its last
 * (so "{"a":{"b":1},"a":{}}" has no a.b). A path through a non-object value is absent. */
#define CKPTIO__JSON_DEPTH 32

/* The member at path into out (cap bytes): a string decoded to UTF-8; a number, true, false or
 * null as its literal text ("3600", "null"); an object or array as its raw JSON text. 1 found,
 * 0 absent, CKPTIO_E_CORRUPT (the text is not as above), CKPTIO_E_LIMIT (does not fit). */
CKPTIO__HIDDEN int ckptio__json_get(const char *text, size_t len, const char *path, char *out,
                                    size_t cap);
/* The same for a member that must be a string: CKPTIO_E_CORRUPT when it is of another type. */
CKPTIO__HIDDEN int ckptio__json_str(const char *text, size_t len, const char *path, char *out,
                                    size_t cap);
/* An integer member: a JSON number without fraction or exponent, or a string holding only an
 * optional '-' and decimal digits ("3600", as some servers send expires_in). 1 and *out, 0 when
 * absent, CKPTIO_E_CORRUPT when it is something else or does not fit in int64. */
CKPTIO__HIDDEN int ckptio__json_int(const char *text, size_t len, const char *path,
                                    int64_t *out);

/* The i-th member (from 0, in the text's order, a repeated key each time) of the object at
 * path (NULL: the top object): its key decoded into key (kcap bytes) and its value as
 * ckptio__json_get gives it into out (cap bytes). 1 found; 0 when the object has fewer members
 * or path names no object; CKPTIO_E_CORRUPT; CKPTIO_E_LIMIT (the key or the value does not
 * fit: both ""). For objects whose keys are not known beforehand (HTTP headers to send). */
CKPTIO__HIDDEN int ckptio__json_member(const char *text, size_t len, const char *path, size_t i,
                                       char *key, size_t kcap, char *out, size_t cap);

/* Each element of the array at path (NULL: the text is one array, checked whole like an
 * object), in order: cb(ctx, its raw text, its length), a checked JSON value (an object's text
 * goes to ckptio__json_get as it is). A nonzero return stops and is returned; 0 after the last,
 * or when path names no array; CKPTIO_E_CORRUPT. For listings (GCS's "items"): one scan of the
 * page, whatever its length. */
CKPTIO__HIDDEN int ckptio__json_each(const char *text, size_t len, const char *path,
                                     int (*cb)(void *ctx, const char *v, size_t n), void *ctx);
/* s as the body of a JSON string (no quotes) into out, like snprintf: at most cap - 1 bytes
 * and a NUL when cap > 0; returns the length the whole escaped text needs (excluding the NUL),
 * so a result >= cap means it was cut. Escapes '"', '\\' and bytes below 0x20 (\b \f \n \r \t,
 * else \u00XX); other bytes, UTF-8 included, pass unchanged. */
CKPTIO__HIDDEN size_t ckptio__json_escape(const char *s, char *out, size_t cap);

#endif
