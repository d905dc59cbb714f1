/* SPDX-License-Identifier: Apache-2.0 */
/* The `ckptio` subcommands main() dispatches to; each gets argv from its own name on. */
#ifndef CKPTIO_COMMANDS_H
#define CKPTIO_COMMANDS_H

/* Each returns an exit code (CLI_OK, CLI_FAIL, CLI_USAGE); argv[0] is the subcommand's name. */
int cmd_inspect(int argc, char **argv); /* tools/inspect.c */
int cmd_verify(int argc, char **argv);  /* tools/verify.c */
int cmd_doctor(int argc, char **argv);  /* tools/doctor.c */
int cmd_bench(int argc, char **argv);   /* tools/bench.c */
int cmd_convert(int argc, char **argv); /* tools/convert.c */
int cmd_bench_merge(int argc, char **argv); /* tools/bench_merge.c: `bench --merge` */

#endif
