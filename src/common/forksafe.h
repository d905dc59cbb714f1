/* SPDX-License-Identifier: Apache-2.0 */
/* Objects that fork must not tear: their locks are held across fork() and the child fixes them up. */
#ifndef CKPTIO_COMMON_FORKSAFE_H
#define CKPTIO_COMMON_FORKSAFE_H

#include <pthread.h>

#include "common.h"

/* Embedded in an object with a mutex: while it is listed, fork() takes `mu` in the parent
 * (so the object is never copied half-changed) and, in the child, calls child(obj) with it
 * still held, then releases it. child() runs in the child's only thread: it must drop what
 * belonged to the parent's other threads and call nothing that takes a lock of the list. */
typedef struct ckptio__forksafe {
    pthread_mutex_t *mu;
    void (*child)(void *obj);
    void *obj;
    struct ckptio__forksafe *next;
} ckptio__forksafe;

CKPTIO__HIDDEN void ckptio__forksafe_add(ckptio__forksafe *f);
CKPTIO__HIDDEN void ckptio__forksafe_remove(ckptio__forksafe *f);
/* The list's own lock, for a caller that must list an object atomically with starting the
 * thread that uses it (a fork in between must see both or neither). */
CKPTIO__HIDDEN void ckptio__forksafe_lock(void);
CKPTIO__HIDDEN void ckptio__forksafe_unlock(void);
/* ckptio__forksafe_add with the list's lock already held. */
CKPTIO__HIDDEN void ckptio__forksafe_add_locked(ckptio__forksafe *f);

#endif
