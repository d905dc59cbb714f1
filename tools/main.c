/* SPDX-License-Identifier: Apache-2.0 */
/* The `ckptio` command's entry point: picks the subcommand named by the first argument. */
#include <string.h>

#include "ckptio.h"
#include "cli.h"
#include "commands.h"

int main(int argc, char **argv)
{
    if (argc < 2) return cli_usage_error("which command?");
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("ckptio %s (on-disk format %u)\n", ckptio_version_string(), ckptio_format_version());
        return CLI_OK;
    }
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        cli_usage(stdout);
        return CLI_OK;
    }
    if (!strcmp(cmd, "inspect")) return cmd_inspect(argc - 1, argv + 1);
    if (!strcmp(cmd, "verify")) return cmd_verify(argc - 1, argv + 1);
    if (!strcmp(cmd, "doctor")) return cmd_doctor(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "convert")) return cmd_convert(argc - 1, argv + 1);
    if (cmd[0] == '-') return cli_usage_error("unknown option '%s'", cmd);
    return cli_usage_error("unknown command '%s'", cmd);
}
