/* net/identity.c: the identity file as ravnestd(8), FILES, documents it. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "net/identity.h"
#include "../lib/proc.h"

static char dir[] = "/tmp/ravnest-test-identity-XXXXXX";

static void setup(void) {
        cr_assert_not_null(mkdtemp(dir));
}
static void teardown(void) {
        test_remove_tree(dir);
}
TestSuite(identity, .init = setup, .fini = teardown);

static void write_text(const char *path, const char *text, mode_t mode) {
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
        cr_assert(fd >= 0);
        cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
        close(fd);
        chmod(path, mode);
}

/* A created file: "ravnest-identity-v1 ", 128 lower-case hex digits, "\n",
 * 149 bytes, mode 0600; the public key is the secret key's second half. */
Test(identity, created_file_has_the_documented_form) {
        char path[128], text[256] = {};
        snprintf(path, sizeof path, "%s/identity", dir);
        Identity id;
        bool created;
        Diag d = {};
        cr_assert_eq(identity_load_or_create(path, &id, &created, &d), 0, "%s", d.text);
        cr_assert(created);
        struct stat st;
        cr_assert_eq(stat(path, &st), 0);
        cr_assert_eq(st.st_mode & 07777, 0600);
        cr_assert_eq(st.st_size, 149);
        FILE *f = fopen(path, "r");
        cr_assert_eq(fread(text, 1, sizeof text - 1, f), 149u);
        fclose(f);
        cr_assert_eq(memcmp(text, "ravnest-identity-v1 ", 20), 0);
        for (int i = 20; i < 148; i++)
                cr_assert(isxdigit((unsigned char)text[i]) && !isupper((unsigned char)text[i]), "byte %d", i);
        cr_assert_eq(text[148], '\n');
        uint8_t sk[64];
        cr_assert_eq(sodium_hex2bin(sk, sizeof sk, text + 20, 128, NULL, NULL, NULL), 0);
        cr_assert_arr_eq(sk, id.sk, 64);
        cr_assert_arr_eq(sk + 32, id.pk, 32);
}

/* A file written by hand in that form (upper case too) loads as that key;
 * one byte off the form, or readable by others, does not. */
Test(identity, hand_written_file_loads) {
        Identity want, got;
        identity_generate(&want);
        char hex[129], text[160], path[128];
        sodium_bin2hex(hex, sizeof hex, want.sk, 64);
        for (char *c = hex; *c; c++)
                *c = (char)toupper((unsigned char)*c);
        snprintf(text, sizeof text, "ravnest-identity-v1 %s\n", hex);
        snprintf(path, sizeof path, "%s/id-upper", dir);
        write_text(path, text, 0600);
        Diag d = {};
        cr_assert_eq(identity_load_or_create(path, &got, NULL, &d), 0, "%s", d.text);
        cr_assert_arr_eq(got.pk, want.pk, 32);

        snprintf(text, sizeof text, "ravnest-identity-v1 %s", hex); /* no newline */
        write_text(path, text, 0600);
        cr_assert_eq(identity_load_or_create(path, &got, NULL, &d), -EBADMSG);
        snprintf(text, sizeof text, "ravnest-identity-v1 %s\n", hex);
        write_text(path, text, 0640);
        cr_assert_eq(identity_load_or_create(path, &got, NULL, &d), -EPERM);
}
