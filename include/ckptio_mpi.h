/* SPDX-License-Identifier: Apache-2.0 */
/* ckptio_mpi.h — the MPI communicator for C programs (library libckptio-mpi, pkg-config
 * ckptio-mpi), kept out of ckptio.h so that only programs that use MPI need <mpi.h>. */
#ifndef CKPTIO_MPI_H
#define CKPTIO_MPI_H

#include <mpi.h>

#if !defined(CKPTIO_EXPERIMENTAL) && !defined(CKPTIO_BUILDING)
#error "ckptio_mpi.h is experimental: define CKPTIO_EXPERIMENTAL before including ckptio headers"
#endif
#include "ckptio.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A ckptio communicator over the ranks of `comm`. Collective and blocking over `comm`: it
 * duplicates it (MPI_Comm_dup, errors returned rather than fatal), so ckptio's messages never
 * match the program's own. MPI must be initialized and not finalized (CKPTIO_E_STATE otherwise);
 * ckptio calls MPI only from the thread that calls it, so MPI_THREAD_FUNNELED suffices when
 * that is the main thread, and any thread with MPI_THREAD_MULTIPLE. Free it with
 * ckptio_comm_free() before MPI_Finalize.
 *
 * Every operation is made of non-blocking collectives (MPI_Ibarrier; MPI_Igather of the lengths
 * then MPI_Igatherv; MPI_Ibcast of the length then of the bytes) polled until its timeout, so
 * a rank that never comes yields -ETIMEDOUT instead of a hang; MPI errors yield -ECOMM. MPI
 * cannot cancel a collective, so after a failure the operation stays posted (with its buffers,
 * which are deliberately leaked) and the communicator is unusable: every later operation fails
 * at once with the same code, and ckptio_comm_free() leaves the duplicated MPI communicator
 * alone. The caller then aborts the job (MPI_Abort) or, if every rank failed the same way and
 * its MPI allows it, carries on with a new communicator. A gather moves at most 2 GiB - 1 bytes
 * per rank and in total (CKPTIO_E_LIMIT, and the communicator is unusable). Since 0.2. */
CKPTIO_API int ckptio_comm_mpi(ckptio_comm **out, MPI_Comm comm);

#ifdef __cplusplus
}
#endif
#endif /* CKPTIO_MPI_H */
