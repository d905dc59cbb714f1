/* SPDX-License-Identifier: Apache-2.0 */
/* The communicator room's internal interface: the in-process group of threads used by tests. */
#ifndef CKPTIO_DIST_COMM_H
#define CKPTIO_DIST_COMM_H

#include "../common/common.h"

/* A "local" group: nranks threads of one process, each using its own rank's ckptio_comm, which
 * exchange bytes through memory under one mutex and condition variable. Every operation honours
 * its timeout (a rank that never arrives makes the others fail with -ETIMEDOUT), after which
 * the group is broken: every later operation on any rank fails at once with the same code.
 * Ranks that call different operations (or roots) in the same round break it with
 * CKPTIO_E_USAGE. Made for tests of the multi-rank protocols. */
typedef struct ckptio__comm_local ckptio__comm_local;

CKPTIO__HIDDEN int ckptio__comm_local_new(ckptio__comm_local **out, int32_t nranks);
/* Rank r's communicator, owned by the group (its release is NULL). */
CKPTIO__HIDDEN ckptio_comm *ckptio__comm_local_rank(ckptio__comm_local *g, int32_t r);
/* Fault injection: rank r dies when it starts its operation number `op` (0-based, counted over
 * every operation it calls): that call returns -ECONNRESET, and so does every operation of the
 * other ranks from then on, at once — as a transport does when a peer's connection drops. */
CKPTIO__HIDDEN void ckptio__comm_local_kill_at(ckptio__comm_local *g, int32_t r, uint64_t op);
/* Free the group; no rank may be inside an operation. Accepts NULL. */
CKPTIO__HIDDEN void ckptio__comm_local_free(ckptio__comm_local *g);

#endif
