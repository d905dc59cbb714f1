/* SPDX-License-Identifier: Apache-2.0 */
/* XXH3-64 with the widest vector unit the CPU has, chosen once at run time. */
#include <stdatomic.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common.h"

/* Built in their own objects with -mavx2 / -mavx512f (src/common/meson.build); every variant
 * computes the same XXH3 value, only faster. */
CKPTIO__HIDDEN uint64_t ckptio__hash_avx2(const void *p, size_t len);
CKPTIO__HIDDEN uint64_t ckptio__hash_avx512(const void *p, size_t len);

static uint64_t hash_sse2(const void *p, size_t len)
{
    return XXH3_64bits(p, len);
}

typedef uint64_t (*hash_fn)(const void *, size_t);
static _Atomic(hash_fn) chosen;

static hash_fn choose(void)
{
#if defined(__x86_64__) && defined(CKPTIO_HAVE_HASH_VARIANTS)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return ckptio__hash_avx512;
    if (__builtin_cpu_supports("avx2")) return ckptio__hash_avx2;
#endif
    return hash_sse2;
}

uint64_t ckptio__hash(const void *p, size_t len)
{
    hash_fn f = atomic_load_explicit(&chosen, memory_order_relaxed);
    if (CKPTIO__UNLIKELY(!f)) {
        f = choose();
        atomic_store_explicit(&chosen, f, memory_order_relaxed);
    }
    return f(p, len);
}
