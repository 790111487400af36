/* net/identity.c */
#include "identity.h"

#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/file.h"
#include "util/macro.h"

#define IDENTITY_MAGIC "ravnest-identity-v1 "

int identity_generate(Identity *ret) {
        if (sodium_init() < 0)
                return -EIO;
        return crypto_sign_keypair(ret->pk, ret->sk) == 0 ? 0 : -EIO;
}

void identity_to_hex(const uint8_t pk[IDENTITY_PK_SIZE], char out[IDENTITY_HEX_SIZE]) {
        sodium_bin2hex(out, IDENTITY_HEX_SIZE, pk, IDENTITY_PK_SIZE);
}

int identity_from_hex(const char *hex, uint8_t pk[IDENTITY_PK_SIZE]) {
        size_t len;
        const char *end;
        if (strlen(hex) != 2 * IDENTITY_PK_SIZE)
                return -EINVAL;
        if (sodium_hex2bin(pk, IDENTITY_PK_SIZE, hex, strlen(hex), NULL, &len, &end) != 0 ||
            len != IDENTITY_PK_SIZE || *end)
                return -EINVAL;
        return 0;
}

void identity_clear(Identity *id) {
        sodium_memzero(id->sk, sizeof id->sk);
}

static int identity_write(const char *path, const Identity *id, Diag *d) {
        char tmp[4096], text[sizeof IDENTITY_MAGIC + 2 * IDENTITY_SK_SIZE + 2];
        _cleanup_(closep) int fd = -1;

        if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
                return diag_set(d, -ENAMETOOLONG, "%s: path too long", path);
        memcpy(text, IDENTITY_MAGIC, sizeof IDENTITY_MAGIC - 1);
        sodium_bin2hex(text + sizeof IDENTITY_MAGIC - 1, 2 * IDENTITY_SK_SIZE + 1, id->sk, IDENTITY_SK_SIZE);
        strcat(text, "\n");

        (void)unlink(tmp);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0)
                return diag_set(d, -errno, "%s: cannot create: %m", tmp);
        size_t len = strlen(text);
        if (write(fd, text, len) != (ssize_t)len || fsync(fd) < 0) {
                int r = errno ? -errno : -EIO;
                sodium_memzero(text, sizeof text);
                unlink(tmp);
                return diag_set(d, r, "%s: cannot write: %s", tmp, strerror(-r));
        }
        sodium_memzero(text, sizeof text);
        /* link() fails if someone else created the file meanwhile: keep theirs. */
        if (link(tmp, path) < 0) {
                int r = -errno;
                unlink(tmp);
                return diag_set(d, r, "%s: cannot create: %s", path, strerror(-r));
        }
        unlink(tmp);
        return 0;
}

static int identity_read(const char *path, Identity *ret, Diag *d) {
        char text[256] = {};
        struct stat st;
        _cleanup_(closep) int fd = file_open_regular(path, O_NOFOLLOW, &st, d);

        if (fd < 0)
                return fd;
        if (st.st_mode & 077)
                return diag_set(d, -EPERM, "%s: readable by others (mode %04o): chmod 600 it", path,
                                (unsigned)(st.st_mode & 07777));
        ssize_t n = read(fd, text, sizeof text - 1);
        if (n < 0)
                return diag_set(d, -errno, "%s: cannot read: %m", path);

        size_t ml = sizeof IDENTITY_MAGIC - 1, hl;
        const char *end;
        Identity id;
        if ((size_t)n != ml + 2 * IDENTITY_SK_SIZE + 1 || memcmp(text, IDENTITY_MAGIC, ml) != 0 ||
            text[n - 1] != '\n' ||
            sodium_hex2bin(id.sk, sizeof id.sk, text + ml, 2 * IDENTITY_SK_SIZE, NULL, &hl, &end) != 0 ||
            hl != IDENTITY_SK_SIZE) {
                sodium_memzero(text, sizeof text);
                return diag_set(d, -EBADMSG, "%s: not a ravnest identity file", path);
        }
        sodium_memzero(text, sizeof text);
        crypto_sign_ed25519_sk_to_pk(id.pk, id.sk);
        *ret = id;
        sodium_memzero(&id, sizeof id);
        return 0;
}

int identity_load_or_create(const char *path, Identity *ret, bool *ret_created, Diag *d) {
        Identity id;
        int r;

        if (sodium_init() < 0)
                return diag_set(d, -EIO, "libsodium failed to initialize");
        r = identity_read(path, ret, d);
        if (r != -ENOENT) {
                if (ret_created)
                        *ret_created = false;
                return r;
        }
        r = identity_generate(&id);
        if (r < 0)
                return diag_set(d, r, "cannot generate a key pair");
        r = identity_write(path, &id, d);
        if (r == -EEXIST) /* lost a race: read the winner's */
                return identity_load_or_create(path, ret, ret_created, d);
        if (r < 0) {
                identity_clear(&id);
                return r;
        }
        *ret = id;
        identity_clear(&id);
        if (ret_created)
                *ret_created = true;
        return 0;
}
