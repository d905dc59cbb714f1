/* SPDX-License-Identifier: Apache-2.0 */
/* Every test group, once: test.h and runner.c expand this list. */
TEST_GROUP(common)
TEST_GROUP(format)
TEST_GROUP(io)
TEST_GROUP(api)
TEST_GROUP(cli)
TEST_GROUP(faults)
TEST_GROUP(powerloss)
TEST_GROUP(concurrency)
TEST_GROUP(merge)
TEST_GROUP(file)
TEST_GROUP(commit)
