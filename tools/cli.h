/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers shared by the `ckptio` command's subcommands: exit codes, arguments, JSON, sizes,
 * progress (tools/cli.c, tools/progress.c). */
#ifndef CKPTIO_CLI_H
#define CKPTIO_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ckptio.h"

/* Exit codes of every subcommand. */
enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

/* The usage text, to stdout for `help`, to stderr after a usage error. */
void cli_usage(FILE *f);
/* Print "ckptio: <message>" and the usage to stderr; returns CLI_USAGE. */
int cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Print "ckptio <cmd>: <message>" to stderr; returns CLI_FAIL. */
int cli_fail(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parse the arguments of a subcommand that takes at most one directory (argv[0] is its name),
 * storing it in *dir; with store non-NULL, "--option KEY=VALUE" too (cli_store_option). Returns
 * -1 to go on, or the exit status to return (help printed, usage error). */
int cli_one_dir_arg(int argc, char **argv, const char *cmd, const char **dir,
                    ckptio_store_opts **store);
/* One "KEY=VALUE" setting of the object store a URL names (ckptio_store_opts_set: endpoint_url,
 * region, profile, ca_bundle...; doc/s3.md) into *o, made at the first. Returns -1 to go on, or
 * CLI_USAGE after saying why. */
int cli_store_option(const char *cmd, ckptio_store_opts **o, const char *kv);
/* Open the checkpoint `dir` (store: its store's settings, or NULL) for `ckptio cmd`; on failure
 * print why to stderr and return NULL. */
ckptio_reader *cli_open_reader(const char *cmd, const char *dir, const ckptio_store_opts *store);

/* Monotonic seconds. */
double cli_now(void);
/* "4.29 GB" (decimal units, as bandwidth is quoted). */
void cli_human(char *buf, size_t n, double bytes);
/* "4G", "64M", "1.5G", "4096" (binary K/M/G/T, optional "iB"/"B"): 0, or -1 if malformed. */
int cli_parse_size(const char *s, uint64_t *out);

/* A JSON string literal of n bytes of s, escaped; bytes that are not UTF-8 become \u00XX. */
void cli_json_str(FILE *f, const char *s, size_t n);
/* Whether n bytes are valid UTF-8 without NUL (shown as text, else as "<N bytes>"). */
int cli_is_text(const void *p, size_t n);

/* A progress line on stderr, only when stderr is a terminal and a phase has lasted over a
 * second: "\r<label>  <done>/<total>  <seconds>". Updated from a background thread, so a
 * single long library call still shows that it is alive. Calls are thread-safe. */
void cli_progress_begin(uint64_t total, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cli_progress_set(uint64_t done);
void cli_progress_end(void);

#endif
