/* SPDX-License-Identifier: Apache-2.0 */
/* Manifest building: what a writer collected, sorted by name, validated and encoded (no I/O). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/box.h"
#include "manifest.h"

typedef struct name_ref {
    const char *s;
    size_t len;
    size_t index;
} name_ref;

static int cmp_name(const void *a, const void *b)
{
    const name_ref *x = a, *y = b;
    return ckptio__name_cmp(x->s, x->len, y->s, y->len);
}

static int push_str(ckptio__vec *strtab, const void *s, size_t len, uint64_t *off)
{
    int64_t at = ckptio__vec_push(strtab, s, len);
    CKPTIO__TRY(at);
    char nul = 0;
    CKPTIO__TRY(ckptio__vec_push(strtab, &nul, 1));
    *off = (uint64_t)at;
    return 0;
}

int ckptio__manifest_build(const ckptio__build *b, const char *what, uint8_t **buf, uint64_t *len,
                           char *err, size_t errlen)
{
    int rc = 0;
    size_t nt = b->n_tensors, nm = b->n_meta;
    name_ref *order = malloc((nt + nm + 1) * sizeof *order);
    ckptio__mtensor *mt = malloc((nt + 1) * sizeof *mt);
    ckptio__mchunk *mc = malloc((b->n_chunks + 1) * sizeof *mc);
    ckptio__mmeta *mm = malloc((nm + 1) * sizeof *mm);
    ckptio__mfile *files = NULL;
    ckptio__mroot *roots = NULL;
    ckptio__vec strtab;
    ckptio__vec_init(&strtab, 1);
    *buf = NULL;
    err[0] = 0;
    CKPTIO__GOTO_IF(!order || !mt || !mc || !mm, -ENOMEM);
    for (size_t i = 0; i < nt; i++) {
        const ckptio__btensor *t = &b->tensors[i];
        order[i] = (name_ref){t->name, t->name_len, i};
    }
    qsort(order, nt, sizeof *order, cmp_name);
    uint64_t nc = 0;
    for (size_t i = 0; i < nt; i++) {
        const ckptio__btensor *t = &b->tensors[order[i].index];
        uint64_t volume;
        ckptio__shape_volume(b->dims + t->dims, t->ndim, &volume);
        if (t->covered != volume && !b->partial) {
            snprintf(err, errlen,
                     "tensor '%s': its chunks cover %llu of %llu elements; add the missing "
                     "chunks before commit",
                     t->name, (unsigned long long)t->covered, (unsigned long long)volume);
            rc = CKPTIO_E_INCOMPLETE;
            goto out;
        }
        mt[i] = (ckptio__mtensor){.name_len = t->name_len, .dtype = t->dtype, .ndim = t->ndim,
                                  .dims = t->dims, .chunk0 = nc, .n_chunks = t->n_chunks};
        CKPTIO__CHECK(push_str(&strtab, t->name, t->name_len, &mt[i].name));
        for (uint64_t c = t->head; c != UINT64_MAX; c = b->next[c]) {
            mc[nc] = b->chunks[c];
            mc[nc++].tensor = (uint32_t)i;
        }
    }
    for (size_t i = 0; i < nm; i++) order[i] = (name_ref){b->meta[i].key, b->meta[i].key_len, i};
    qsort(order, nm, sizeof *order, cmp_name);
    for (size_t i = 0; i < nm; i++) {
        const ckptio__bmeta *m = &b->meta[order[i].index];
        mm[i] = (ckptio__mmeta){.key_len = (uint32_t)m->key_len, .val_len = m->val_len};
        CKPTIO__CHECK(push_str(&strtab, m->key, m->key_len, &mm[i].key));
        CKPTIO__CHECK(push_str(&strtab, m->val, m->val_len, &mm[i].val));
    }
    uint64_t nf = b->n_files;
    files = malloc((nf + 1) * sizeof *files);
    roots = malloc((b->n_roots + 1) * sizeof *roots);
    CKPTIO__GOTO_IF(!files || !roots, -ENOMEM);
    for (uint64_t i = 0; i < nf; i++) {
        const ckptio__bfile *f = &b->files[i];
        files[i] = (ckptio__mfile){.name_len = (uint32_t)strlen(f->name), .root = f->root,
                                   .size = f->size};
        CKPTIO__CHECK(push_str(&strtab, f->name, files[i].name_len, &files[i].name));
    }
    for (size_t k = 0; k < b->n_roots; k++) {
        const ckptio__broot *st = &b->roots[k];
        roots[k] = (ckptio__mroot){.path_len = (uint32_t)strlen(st->path),
                                   .name_len = (uint32_t)strlen(st->name)};
        CKPTIO__CHECK(push_str(&strtab, st->path, roots[k].path_len, &roots[k].path));
        CKPTIO__CHECK(push_str(&strtab, st->name, roots[k].name_len, &roots[k].name));
    }

    bool coded = b->base != NULL;
    for (uint64_t i = 0; i < nc && !coded; i++) coded = mc[i].codec != CKPTIO__CODEC_NONE;
    uint64_t base_path = 0;
    if (b->base) CKPTIO__CHECK(push_str(&strtab, b->base, strlen(b->base), &base_path));
    ckptio__manifest m = {
        .version = coded ? CKPTIO__FORMAT_CODED
                   : b->n_roots ? CKPTIO__FORMAT_STRIPED : CKPTIO_FORMAT_VERSION,
        .n_blocks = b->n_blocks, .blocks = (uint32_t *)b->blocks,
        .has_base = b->base != NULL, .base_len = b->base ? (uint32_t)strlen(b->base) : 0,
        .base_path = base_path, .base_sum = b->base_sum,
        .n_roots = b->n_roots, .roots = roots,
        .csum_algo = b->checksums ? CKPTIO__CSUM_XXH3_64 : CKPTIO__CSUM_NONE,
        .csum_block = b->csum_block,
        .n_files = nf, .n_tensors = nt, .n_chunks = nc, .n_meta = nm,
        .n_dims = b->n_dims, .n_csums = b->n_csums, .strtab_len = strtab.len,
        .files = files, .tensors = mt, .chunks = mc, .meta = mm,
        .dims = b->dims, .csums = b->csums, .strtab = strtab.items,
    };
    char why[512];
    rc = ckptio__manifest_validate_ex(&m, b->partial ? CKPTIO__MANIFEST_PARTIAL : 0, why,
                                      sizeof why);
    if (rc < 0) {
        /* The writer checked every input already, so this is a bug in ckptio itself. */
        snprintf(err, errlen, "internal error: the manifest built for '%s' is invalid: %s", what,
                 why);
        goto out;
    }
    CKPTIO__CHECK(ckptio__manifest_encoded_size(&m, len));
    *buf = malloc(*len ? *len : 1);
    CKPTIO__GOTO_IF(!*buf, -ENOMEM);
    CKPTIO__CHECK(ckptio__manifest_encode(&m, *buf, *len));
out:
    if (rc < 0) {
        free(*buf);
        *buf = NULL;
    }
    free(order);
    free(mt);
    free(mc);
    free(mm);
    free(files);
    free(roots);
    ckptio__vec_free(&strtab);
    return rc;
}
