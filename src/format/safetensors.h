/* SPDX-License-Identifier: Apache-2.0 */
/* The safetensors header (JSON after a u64 length) as flat structures: pure code, fuzzed. */
#ifndef CKPTIO_SAFETENSORS_H
#define CKPTIO_SAFETENSORS_H

#include "../common/common.h"

/* Largest header length accepted, as in the reference implementation. */
#define CKPTIO__ST_MAX_HEADER CKPTIO_ST_MAX_HEADER

/* The safetensors dtypes. Sizes are in bits: F4 and F6_* pack below a byte, and a tensor of
 * those takes ceil(bits * element count / 8) bytes (the rule this parser checks offsets by). */
#define CKPTIO__ST_DTYPE_TABLE(X)                                                              \
    X(BOOL, 8, CKPTIO_DT_BOOL)                                                                 \
    X(F4, 4, 0)                                                                                \
    X(F6_E2M3, 6, 0)                                                                           \
    X(F6_E3M2, 6, 0)                                                                           \
    X(U8, 8, CKPTIO_DT_U8)                                                                     \
    X(I8, 8, CKPTIO_DT_I8)                                                                     \
    X(F8_E5M2, 8, CKPTIO_DT_F8_E5M2)                                                           \
    X(F8_E4M3, 8, CKPTIO_DT_F8_E4M3FN)                                                         \
    X(F8_E8M0, 8, 0)                                                                           \
    X(F8_E4M3FNUZ, 8, 0)                                                                       \
    X(F8_E5M2FNUZ, 8, 0)                                                                       \
    X(I16, 16, CKPTIO_DT_I16)                                                                  \
    X(U16, 16, CKPTIO_DT_U16)                                                                  \
    X(F16, 16, CKPTIO_DT_F16)                                                                  \
    X(BF16, 16, CKPTIO_DT_BF16)                                                                \
    X(I32, 32, CKPTIO_DT_I32)                                                                  \
    X(U32, 32, CKPTIO_DT_U32)                                                                  \
    X(F32, 32, CKPTIO_DT_F32)                                                                  \
    X(C64, 64, CKPTIO_DT_C64)                                                                  \
    X(F64, 64, CKPTIO_DT_F64)                                                                  \
    X(I64, 64, CKPTIO_DT_I64)                                                                  \
    X(U64, 64, CKPTIO_DT_U64)

typedef enum ckptio__st_dtype {
    CKPTIO__ST_NONE = 0,
#define CKPTIO__ST_X_ENUM(name, bits, dt) CKPTIO__ST_##name,
    CKPTIO__ST_DTYPE_TABLE(CKPTIO__ST_X_ENUM)
#undef CKPTIO__ST_X_ENUM
    CKPTIO__ST_COUNT
} ckptio__st_dtype;

/* Name ("F8_E4M3"), bits per element, and CKPTIO_DT_* (0 where ckptio has no code for the
 * dtype: F4, F6_*, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ; a caller loads those as bytes or
 * refuses them). Unknown st: NULL / 0 / 0. */
CKPTIO__HIDDEN const char *ckptio__st_dtype_name(int st);
CKPTIO__HIDDEN unsigned ckptio__st_dtype_bits(int st);
CKPTIO__HIDDEN int ckptio__st_dtype_ckptio(int st);

/* The structures are the public ones (include/ckptio.h, experimental). */
typedef ckptio_st_tensor ckptio__st_tensor;
typedef ckptio_st_meta ckptio__st_meta;
typedef ckptio_st_header ckptio__st_header;

/* Parse the n JSON bytes `hdr` of a safetensors file of file_size bytes (whose first 8 bytes
 * hold n). The header must be UTF-8, start with '{', and end with the object's '}' followed
 * only by spaces. Accepted: one object of tensor name -> {"dtype", "shape", "data_offsets"}
 * (each exactly once, nothing else) and at most one "__metadata__" -> {string: string}.
 * Names are unique, without NUL; shape and offsets are non-negative integers < 2^64. Checked:
 * end - begin = ceil(bits * prod(shape) / 8) and the tensors, by offset, tile the data from 0 to
 * file_size - 8 - n exactly. On success *out lives in one allocation of at most about
 * 14 n bytes (free with ckptio__st_free). On failure: CKPTIO_E_LIMIT (n too large, too many
 * dimensions), CKPTIO_E_DTYPE (unknown dtype), CKPTIO_E_DUPLICATE (a name twice),
 * CKPTIO_E_SHAPE (size mismatch), CKPTIO_E_CORRUPT (anything else), -ENOMEM; err says why,
 * naming the tensor and the byte. */
CKPTIO__HIDDEN int ckptio__st_parse(const uint8_t *hdr, uint64_t n, uint64_t file_size,
                                    ckptio__st_header **out, char *err, size_t errlen);
CKPTIO__HIDDEN void ckptio__st_free(ckptio__st_header *h);

/* The index of a sharded save ("model.safetensors.index.json"): {"weight_map": {tensor: file},
 * "metadata": {key: value}, ...}, n bytes of UTF-8 JSON. Entries keep their order in the
 * index; map[i].key is a tensor name, map[i].val its file (neither holds a NUL); a metadata
 * value that is a string is kept decoded, any other value as its JSON text. Other keys are
 * checked as JSON and skipped. Strings live in strtab, each followed by a NUL. On success *out
 * is one allocation (free with ckptio__st_index_free); else CKPTIO_E_CORRUPT (no weight_map,
 * bad JSON), CKPTIO_E_DUPLICATE, CKPTIO_E_LIMIT or -ENOMEM, with err naming the byte. */
typedef struct ckptio__st_index {
    uint64_t n_map, n_meta, strtab_len;
    ckptio__st_meta *map;
    ckptio__st_meta *meta;
    char *strtab;
} ckptio__st_index;

CKPTIO__HIDDEN int ckptio__st_index_parse(const uint8_t *buf, uint64_t n, ckptio__st_index **out,
                                          char *err, size_t errlen);
CKPTIO__HIDDEN void ckptio__st_index_free(ckptio__st_index *ix);

/* Encode h (its tensors, meta, dims and strtab; header_len and data_start are ignored) as the
 * start of a safetensors file: the u64 length word, then the JSON, padded with spaces so that
 * the data start 8 + N is a multiple of `align` (a power of two, e.g. 4096, so that the data
 * can be written and read with O_DIRECT; 1 for no padding). Key order: "__metadata__" first
 * (left out when there is none), then the tensors in the order of h->tensors, each as
 * {"dtype", "shape", "data_offsets"}. Offsets are written as given; the caller lays them out,
 * tiling [0, data length) in the order of h->tensors. A writer that wants every large tensor
 * aligned puts first the tensors whose sizes are multiples of `align` (each then starts
 * aligned, the data start being aligned), then the rest. On success *out (malloc'ed, free())
 * holds *len bytes. CKPTIO_E_USAGE (bad align, a name or value not UTF-8, a name with a NUL,
 * an unknown dtype), CKPTIO_E_LIMIT (N over the limit) or -ENOMEM, with err. */
CKPTIO__HIDDEN int ckptio__st_encode(const ckptio__st_header *h, uint64_t align, uint8_t **out,
                                     uint64_t *len, char *err, size_t errlen);

#endif
