/* SPDX-License-Identifier: Apache-2.0 */
/* The registry of descriptors that are no file: descriptor -> (ops, object). */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "vfd.h"

typedef struct vfd {
    const ckptio__vfd_ops *ops;
    void *obj;
    int pid; /* the process that opened it */
} vfd;

/* Indexed by descriptor. `open_count` lets lookups answer for files without the lock while no
 * such descriptor is open. */
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static vfd *reg;
static size_t reg_cap;
static atomic_uint open_count;

static vfd lookup(int fd)
{
    vfd v = {0};
    if (fd < 0 || !atomic_load_explicit(&open_count, memory_order_acquire)) return v;
    pthread_mutex_lock(&reg_lock);
    if ((size_t)fd < reg_cap) v = reg[fd];
    pthread_mutex_unlock(&reg_lock);
    return v;
}

int ckptio__vfd_open(const ckptio__vfd_ops *ops, void *obj, int *fd, ckptio__msg *msg)
{
    *fd = -1;
    int e = eventfd(0, EFD_CLOEXEC);
    if (e < 0) return ckptio__fail(msg, -errno, "eventfd: %s", strerror(errno));
    pthread_mutex_lock(&reg_lock);
    if ((size_t)e >= reg_cap) {
        size_t cap = reg_cap ? reg_cap : 64;
        while (cap <= (size_t)e) cap *= 2;
        vfd *r = realloc(reg, cap * sizeof *r);
        if (!r) {
            pthread_mutex_unlock(&reg_lock);
            close(e);
            return ckptio__fail(msg, -ENOMEM, "out of memory");
        }
        memset(r + reg_cap, 0, (cap - reg_cap) * sizeof *r);
        reg = r;
        reg_cap = cap;
    }
    reg[e] = (vfd){ops, obj, (int)getpid()};
    atomic_fetch_add_explicit(&open_count, 1, memory_order_release);
    pthread_mutex_unlock(&reg_lock);
    *fd = e;
    return 0;
}

void *ckptio__vfd_obj(int fd, const ckptio__vfd_ops *ops)
{
    vfd v = lookup(fd);
    return v.ops == ops ? v.obj : NULL;
}

const char *ckptio__vfd_error(int fd)
{
    vfd v = lookup(fd);
    return v.ops && v.ops->error ? v.ops->error(v.obj) : "";
}

bool ckptio__vfd_io(ckptio__req *r)
{
    vfd v = lookup(r->fd);
    if (!v.ops) return false;
    v.ops->io(v.obj, r);
    return true;
}

void ckptio__fd_close(int fd)
{
    if (fd < 0) return;
    vfd v = {0};
    pthread_mutex_lock(&reg_lock);
    if ((size_t)fd < reg_cap && reg[fd].ops) {
        v = reg[fd];
        reg[fd] = (vfd){0};
        atomic_fetch_sub_explicit(&open_count, 1, memory_order_release);
    }
    pthread_mutex_unlock(&reg_lock);
    if (v.ops) v.ops->close(v.obj, ckptio__forked(v.pid));
    close(fd);
}
