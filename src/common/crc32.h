/* SPDX-License-Identifier: Apache-2.0 */
/* The zip format's CRC-32 (the polynomial of zlib and PKZIP), fast and in pieces. */
#ifndef CKPTIO_COMMON_CRC32_H
#define CKPTIO_COMMON_CRC32_H

#include "common.h"

/* crc32 as zlib's crc32(crc, buf, n): start from 0, feed pieces in order. Carry-less multiply
 * folding where the CPU has PCLMULQDQ (CKPTIO_CRC32_TABLES=1 forces the table code), else
 * eight tables. */
CKPTIO__HIDDEN uint32_t ckptio__crc32(uint32_t crc, const void *buf, size_t n);
/* The CRC of a || b from crc(a), crc(b) and b's length, as zlib's crc32_combine. */
CKPTIO__HIDDEN uint32_t ckptio__crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);
/* ckptio__crc32 of n bytes cut into `threads` pieces computed at once (the caller's thread
 * takes one) and combined; small buffers stay on the caller's thread. */
#define CKPTIO__CRC32_MAX_THREADS 64u
#define CKPTIO__CRC32_MIN_PIECE (4u << 20)
CKPTIO__HIDDEN uint32_t ckptio__crc32_parallel(uint32_t crc, const void *buf, size_t n,
                                               unsigned threads);

#endif
