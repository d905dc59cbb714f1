/* SPDX-License-Identifier: Apache-2.0 */
/* AWS settings and credentials as the AWS SDKs find them: the store's settings first, then the
 * environment and the shared files; credentials from the SDKs' chain, cached and refreshed
 * before they expire. Used by the S3 client (s3.c). */
#ifndef CKPTIO_STORE_AWS_CREDS_H
#define CKPTIO_STORE_AWS_CREDS_H

#include <stdint.h>

#include "../common/common.h"

/* ---- what a client is made from ----
 *
 * Each field is a malloc'd string or NULL, taken from the settings (ckptio_store_opts) where
 * they have it, else from the environment, read when the client is asked for. Two asks with
 * the same fields share one client (its connections and credentials). */
enum {
    CKPTIO__AWS_ENDPOINT,      /* endpoint_url | AWS_ENDPOINT_URL_S3 | AWS_ENDPOINT_URL */
    CKPTIO__AWS_REGION,        /* region | AWS_REGION | AWS_DEFAULT_REGION */
    CKPTIO__AWS_PROFILE,       /* profile | AWS_PROFILE | AWS_DEFAULT_PROFILE */
    CKPTIO__AWS_PROFILE_GIVEN, /* "1": the profile came from the settings (env keys unread) */
    CKPTIO__AWS_KEY_ID,        /* access_key_id | AWS_ACCESS_KEY_ID */
    CKPTIO__AWS_SECRET,        /* secret_access_key | AWS_SECRET_ACCESS_KEY */
    CKPTIO__AWS_TOKEN,         /* session_token | AWS_SESSION_TOKEN */
    CKPTIO__AWS_KEYS_GIVEN,    /* "1": the keys came from the settings */
    CKPTIO__AWS_CA,            /* ca_bundle | AWS_CA_BUNDLE */
    CKPTIO__AWS_ADDRESSING,    /* addressing_style */
    CKPTIO__AWS_STS,           /* sts_endpoint_url | AWS_ENDPOINT_URL_STS | AWS_ENDPOINT_URL */
    CKPTIO__AWS_CONFIG_FILE,   /* AWS_CONFIG_FILE | ~/.aws/config */
    CKPTIO__AWS_CREDS_FILE,    /* AWS_SHARED_CREDENTIALS_FILE | ~/.aws/credentials */
    CKPTIO__AWS_WEB_TOKEN_FILE, /* AWS_WEB_IDENTITY_TOKEN_FILE */
    CKPTIO__AWS_ROLE_ARN,      /* AWS_ROLE_ARN */
    CKPTIO__AWS_ROLE_SESSION,  /* AWS_ROLE_SESSION_NAME */
    CKPTIO__AWS_CONT_FULL,     /* AWS_CONTAINER_CREDENTIALS_FULL_URI */
    CKPTIO__AWS_CONT_REL,      /* AWS_CONTAINER_CREDENTIALS_RELATIVE_URI */
    CKPTIO__AWS_CONT_TOKEN,    /* AWS_CONTAINER_AUTHORIZATION_TOKEN */
    CKPTIO__AWS_CONT_TOKEN_FILE, /* AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE */
    CKPTIO__AWS_IMDS_OFF,      /* AWS_EC2_METADATA_DISABLED */
    CKPTIO__AWS_IMDS_ENDPOINT, /* AWS_EC2_METADATA_SERVICE_ENDPOINT */
    CKPTIO__AWS_TIMEOUT,       /* CKPTIO_S3_TIMEOUT */
    CKPTIO__AWS_STALL,         /* CKPTIO_S3_STALL */
    CKPTIO__AWS_CONNS,         /* CKPTIO_S3_CONNECTIONS */
    CKPTIO__AWS_FIRST_TIMEOUT, /* CKPTIO_S3_FIRST_TIMEOUT */
    CKPTIO__AWS_N
};

typedef struct ckptio__aws_conf {
    char *v[CKPTIO__AWS_N];
} ckptio__aws_conf;

/* Fill c (zeroed) from the settings o, else the environment. CKPTIO_E_USAGE for settings that
 * do not go together (an access key without its secret). */
CKPTIO__HIDDEN int ckptio__aws_conf_read(ckptio__aws_conf *c, const ckptio_store_opts *o,
                                         ckptio__msg *msg);
/* The fields as one malloc'd string ("<i>=<value>\n"...), the client cache's key; NULL: no
 * memory. It holds secrets: wipe it before freeing (ckptio__aws_conf_wipe_key). */
CKPTIO__HIDDEN char *ckptio__aws_conf_key(const ckptio__aws_conf *c);
CKPTIO__HIDDEN void ckptio__aws_conf_wipe_key(char *key);
CKPTIO__HIDDEN void ckptio__aws_conf_free(ckptio__aws_conf *c);

/* ---- credentials ---- */

/* One set of credentials, shared by reference: a request holds one while it is signed. */
typedef struct ckptio__aws_key {
    char *id, *secret, *token; /* token NULL for long-term keys */
    int64_t expires;           /* seconds since the epoch; 0: they do not expire */
    int refs;
} ckptio__aws_key;

typedef struct ckptio__aws_creds ckptio__aws_creds;

/* The provider for a client made from c (copied): reads the shared files now; asks no
 * credential source before the first get. */
CKPTIO__HIDDEN int ckptio__aws_creds_new(ckptio__aws_creds **out, const ckptio__aws_conf *c,
                                         ckptio__msg *msg);
/* A value of the client's profile in the shared config file ("region", "endpoint_url",
 * "ca_bundle"; with sub, a nested one: "s3" / "addressing_style"): 1 into out, 0 when absent. */
CKPTIO__HIDDEN int ckptio__aws_profile_value(const ckptio__aws_creds *p, const char *key,
                                             const char *sub, char *out, size_t cap);
/* The region requests are signed for: the conf's, else the profile's, else us-east-1. */
CKPTIO__HIDDEN const char *ckptio__aws_creds_region(const ckptio__aws_creds *p);
/* The current credentials (a reference: give it back with ckptio__aws_key_put): the chain is
 * walked on the first call (the settings' keys, the environment, web identity, the profile,
 * the container endpoint, the instance metadata service, in that order), and the source that
 * answered is asked again once its credentials are about to expire (a quarter of their life,
 * at most 5 minutes, before). A refresh that fails while the old ones are still valid keeps
 * them. Fails naming the sources tried, in order, and what each said. Thread-safe. */
CKPTIO__HIDDEN int ckptio__aws_creds_get(ckptio__aws_creds *p, ckptio__aws_key **out,
                                         ckptio__msg *msg);
CKPTIO__HIDDEN void ckptio__aws_key_put(ckptio__aws_key *k);
/* The store refused k as expired: true when the next get will load new ones (false: the
 * source cannot be refreshed, e.g. keys in the environment). */
CKPTIO__HIDDEN bool ckptio__aws_creds_expired(ckptio__aws_creds *p, const ckptio__aws_key *k);
/* Where the credentials came from ("environment", "profile 'dev' (role_arn)"...), for
 * messages; "" before the first get. */
CKPTIO__HIDDEN const char *ckptio__aws_creds_source(ckptio__aws_creds *p);
/* Free a provider no client uses (one whose client failed to be made). */
CKPTIO__HIDDEN void ckptio__aws_creds_free(ckptio__aws_creds *p);
/* In a forked child: the provider's lock as new (another thread of the parent may have held
 * it). */
CKPTIO__HIDDEN void ckptio__aws_creds_after_fork(ckptio__aws_creds *p);

#endif
