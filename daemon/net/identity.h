/* net/identity.h — a node's long-term identity: an Ed25519 key pair kept in
 * its state directory, mode 0600, created on first start.
 *
 * The file is one line of 149 bytes: "ravnest-identity-v1 ", 128 hex digits
 * of libsodium's 64-byte secret key (seed, then public key; written in
 * lower case, read in either), "\n". The public key is its second half.
 * Documented for operators in ravnestd(8), FILES.
 *
 *     Identity id;
 *     bool created;
 *     r = identity_load_or_create("/var/lib/ravnest/identity", &id, &created, &d);
 *     char hex[IDENTITY_HEX_SIZE];
 *     identity_to_hex(id.pk, hex);      // what peers put in their allowlist
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "util/diag.h"

#define IDENTITY_PK_SIZE 32
#define IDENTITY_SK_SIZE 64
#define IDENTITY_HEX_SIZE (2 * IDENTITY_PK_SIZE + 1)

typedef struct Identity {
        uint8_t pk[IDENTITY_PK_SIZE];
        uint8_t sk[IDENTITY_SK_SIZE];
} Identity;

/* A fresh key pair (for tests and first starts). */
int identity_generate(Identity *ret);
/* Load path, or create it (0600, written atomically) if it does not exist.
 * A file readable by group or others is refused (-EPERM), as ssh does. */
int identity_load_or_create(const char *path, Identity *ret, bool *ret_created, Diag *d);
void identity_to_hex(const uint8_t pk[IDENTITY_PK_SIZE], char out[IDENTITY_HEX_SIZE]);
/* 64 hex digits to a public key; -EINVAL otherwise. */
int identity_from_hex(const char *hex, uint8_t pk[IDENTITY_PK_SIZE]);
/* Wipe the secret key. */
void identity_clear(Identity *id);
