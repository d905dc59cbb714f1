/* SPDX-License-Identifier: Apache-2.0 */
/* The engine's one pthread_atfork list: objects whose locks, threads and descriptors a fork must not tear. */
#include <unistd.h>

#include "forksafe.h"

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static ckptio__forksafe *g_list;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

int ckptio__pid;

/* The list's lock first, then each object's: the order every other path takes them in. */
static void prepare(void)
{
    pthread_mutex_lock(&g_mu);
    for (ckptio__forksafe *f = g_list; f; f = f->next) pthread_mutex_lock(f->mu);
}

static void parent(void)
{
    for (ckptio__forksafe *f = g_list; f; f = f->next) pthread_mutex_unlock(f->mu);
    pthread_mutex_unlock(&g_mu);
}

static void child(void)
{
    ckptio__pid = (int)getpid(); /* first: the objects' handlers may ask */
    for (ckptio__forksafe *f = g_list; f; f = f->next) {
        f->child(f->obj);
        pthread_mutex_unlock(f->mu);
    }
    pthread_mutex_unlock(&g_mu);
}

static void install(void)
{
    ckptio__pid = (int)getpid();
    pthread_atfork(prepare, parent, child);
}

void ckptio__handle_init(ckptio__handle_state *h)
{
    pthread_once(&g_once, install);
    h->pid = ckptio__pid;
}

void ckptio__forksafe_lock(void)
{
    pthread_once(&g_once, install);
    pthread_mutex_lock(&g_mu);
}

void ckptio__forksafe_unlock(void)
{
    pthread_mutex_unlock(&g_mu);
}

void ckptio__forksafe_add_locked(ckptio__forksafe *f)
{
    f->next = g_list;
    g_list = f;
}

void ckptio__forksafe_add(ckptio__forksafe *f)
{
    ckptio__forksafe_lock();
    ckptio__forksafe_add_locked(f);
    ckptio__forksafe_unlock();
}

void ckptio__forksafe_remove(ckptio__forksafe *f)
{
    pthread_mutex_lock(&g_mu);
    for (ckptio__forksafe **p = &g_list; *p; p = &(*p)->next)
        if (*p == f) {
            *p = f->next;
            break;
        }
    pthread_mutex_unlock(&g_mu);
}
