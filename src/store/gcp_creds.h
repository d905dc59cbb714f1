/* SPDX-License-Identifier: Apache-2.0 */
/* Google Cloud settings and credentials as Google's client libraries find them (Application
 * Default Credentials): the store's settings first, then the environment and gcloud's file;
 * OAuth2 access tokens cached and refreshed before they expire. For the GCS client (gs://). */
#ifndef CKPTIO_STORE_GCP_CREDS_H
#define CKPTIO_STORE_GCP_CREDS_H

#include <stdint.h>

#include "../common/common.h"

/* ---- what a client is made from ----
 *
 * Each field is a malloc'd string or NULL, taken from the settings (ckptio_store_opts) where
 * they have it, else from the environment, read when the client is asked for. Two asks with
 * the same fields share one client (its connections and token). */
enum {
    CKPTIO__GCP_TOKEN,            /* token: a static OAuth2 access token (settings only) */
    CKPTIO__GCP_CREDS_FILE,       /* credentials_file | GOOGLE_APPLICATION_CREDENTIALS */
    CKPTIO__GCP_CREDS_FILE_GIVEN, /* "1": the file came from the settings */
    CKPTIO__GCP_PROJECT,          /* project | GOOGLE_CLOUD_PROJECT | CLOUDSDK_CORE_PROJECT */
    CKPTIO__GCP_EMULATOR,         /* STORAGE_EMULATOR_HOST */
    CKPTIO__GCP_METADATA_HOST,    /* GCE_METADATA_HOST | GCE_METADATA_IP (host[:port]) */
    CKPTIO__GCP_NO_GCE_CHECK,     /* NO_GCE_CHECK */
    CKPTIO__GCP_GCLOUD_FILE,      /* gcloud's application_default_credentials.json: in
                                   * CLOUDSDK_CONFIG, else $HOME/.config/gcloud */
    CKPTIO__GCP_CA,               /* ca_bundle */
    CKPTIO__GCP_ENDPOINT,         /* endpoint_url: a GCS-compatible JSON API's http[s]://host */
    CKPTIO__GCP_TIMEOUT,          /* CKPTIO_GCS_TIMEOUT (the client's limits: http.h) */
    CKPTIO__GCP_STALL,            /* CKPTIO_GCS_STALL */
    CKPTIO__GCP_CONNS,            /* CKPTIO_GCS_CONNECTIONS */
    CKPTIO__GCP_FIRST_TIMEOUT,    /* CKPTIO_GCS_FIRST_TIMEOUT */
    CKPTIO__GCP_N
};

typedef struct ckptio__gcp_conf {
    char *v[CKPTIO__GCP_N];
} ckptio__gcp_conf;

/* Fill c (zeroed) from the settings o, else the environment. */
CKPTIO__HIDDEN int ckptio__gcp_conf_read(ckptio__gcp_conf *c, const ckptio_store_opts *o,
                                         ckptio__msg *msg);
/* The fields as one malloc'd string, the client cache's key; NULL: no memory. It holds
 * secrets: wipe it before freeing (ckptio__gcp_conf_wipe_key). */
CKPTIO__HIDDEN char *ckptio__gcp_conf_key(const ckptio__gcp_conf *c);
CKPTIO__HIDDEN void ckptio__gcp_conf_wipe_key(char *key);
CKPTIO__HIDDEN void ckptio__gcp_conf_free(ckptio__gcp_conf *c);

/* ---- tokens ---- */

/* One OAuth2 access token, shared by reference: a request holds one while it is sent, as
 * "Authorization: Bearer <token>". The token is one line of printable ASCII. */
typedef struct ckptio__gcp_token {
    char *token;
    int64_t expires; /* seconds since the epoch; 0: not known to expire (the token setting) */
    int refs;
} ckptio__gcp_token;

typedef struct ckptio__gcp_creds ckptio__gcp_creds;

/* The provider for a client made from c (copied). Reads no file and asks no source before the
 * first get. */
CKPTIO__HIDDEN int ckptio__gcp_creds_new(ckptio__gcp_creds **out, const ckptio__gcp_conf *c,
                                         ckptio__msg *msg);
/* The project requests are billed to or buckets created in: the settings' or the
 * environment's, else NULL (the credentials file's project_id is not read). */
CKPTIO__HIDDEN const char *ckptio__gcp_creds_project(const ckptio__gcp_creds *p);
/* The current token (a reference: give it back with ckptio__gcp_token_put), walking Google's
 * chain on the first call: the token setting; the credentials file (credentials_file, else
 * GOOGLE_APPLICATION_CREDENTIALS: a service_account key, an authorized_user or an
 * external_account configuration; a file named but missing is an error); gcloud's
 * application_default_credentials.json (absent: the next source); the metadata server of
 * Compute Engine / GKE (not with NO_GCE_CHECK=true; 1 s to connect). The source that answered
 * is asked again once its token is about to expire (a quarter of its life, at most 5 minutes,
 * before); a refresh that fails while the old token is still valid keeps it. Fails naming the
 * sources tried, in order, and what each said.
 * With STORAGE_EMULATOR_HOST set and neither token nor credentials_file in the settings, as
 * Google's libraries do for an emulator: 0 with *out NULL: send no Authorization header.
 * Thread-safe. */
CKPTIO__HIDDEN int ckptio__gcp_creds_get(ckptio__gcp_creds *p, ckptio__gcp_token **out,
                                         ckptio__msg *msg);
/* Accepts NULL. */
CKPTIO__HIDDEN void ckptio__gcp_token_put(ckptio__gcp_token *t);
/* The store refused t (401): true when the next get will ask for a new one (false: the token
 * setting, which cannot be refreshed). */
CKPTIO__HIDDEN bool ckptio__gcp_creds_expired(ckptio__gcp_creds *p, const ckptio__gcp_token *t);
/* Where tokens come from ("service account 'a@p.iam.gserviceaccount.com' (/path/key.json)",
 * "metadata server (169.254.169.254)"...), for messages; "" before the first get that found
 * one (with an emulator, "none: STORAGE_EMULATOR_HOST=..." from the start). */
CKPTIO__HIDDEN const char *ckptio__gcp_creds_source(ckptio__gcp_creds *p);
/* Free a provider no client uses (accepts NULL). */
CKPTIO__HIDDEN void ckptio__gcp_creds_free(ckptio__gcp_creds *p);
/* In a forked child: the provider's lock as new (another thread of the parent may have held
 * it). */
CKPTIO__HIDDEN void ckptio__gcp_creds_after_fork(ckptio__gcp_creds *p);

#endif
