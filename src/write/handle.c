/* SPDX-License-Identifier: Apache-2.0 */
/* The writer's state shared by its files: names kept in the arena, usable or failed for good. */
#include <stdlib.h>
#include <string.h>

#include "writer.h"

const char *ckptio__writer_arena_dup(ckptio_writer *w, const char *s, size_t len)
{
    arena_block *b = w->arena;
    if (!b || b->cap - b->used < len + 1) {
        size_t cap = CKPTIO__MAX((size_t)1 << 20, len + 1);
        arena_block *nb = malloc(sizeof *nb + cap);
        if (!nb) return NULL;
        nb->prev = b;
        nb->used = 0;
        nb->cap = cap;
        w->arena = b = nb;
    }
    char *p = b->data + b->used;
    memcpy(p, s, len);
    p[len] = 0;
    b->used += len + 1;
    return p;
}

int ckptio__writer_poison(ckptio_writer *w, int code)
{
    if (w->hs.state == CKPTIO__H_OPEN) code = ckptio__txn_failed(&w->txn, code, &w->msg);
    return ckptio__handle_poison(&w->hs, code);
}

int ckptio__writer_check_usable(ckptio_writer *w)
{
    return ckptio__handle_usable(&w->hs, &w->msg, w->path);
}
