/* data/text.c: byte-level corpora, checked to be text, split 95/5, cut
 * into windows whose targets are the next bytes. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../lib/proc.h"
#include "data/dataset.h"

static char dir[] = "/tmp/ravnest-test-text-XXXXXX";

static void setup(void) {
        cr_assert(mkdtemp(dir));
}

static void teardown(void) {
        test_remove_tree(dir);
}

TestSuite(text, .init = setup, .fini = teardown);

static void write_bytes(const char *name, const void *p, size_t n) {
        char path[256];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        FILE *f = fopen(path, "wb");
        cr_assert(f);
        cr_assert_eq(fwrite(p, 1, n, f), n);
        fclose(f);
}

Test(text, windows_and_their_next_bytes) {
        char text[2000], path[256];
        for (int i = 0; i < 2000; i++)
                text[i] = (char)('a' + i % 26);
        write_bytes("one.txt", text, sizeof text);
        snprintf(path, sizeof path, "%s/one.txt", dir);
        Dataset *train, *valid;
        Diag d = {};
        cr_assert_eq(dataset_load_text(path, false, 16, 256, &train, &d), 0, "%s", d.text);
        cr_assert_eq(dataset_load_text(path, true, 16, 256, &valid, &d), 0, "%s", d.text);
        cr_assert_eq(train->text_len, 1900);
        cr_assert_eq(valid->text_len, 100);
        cr_assert_eq(train->n, (1900 - 1) / 16);
        cr_assert_eq(valid->n, (100 - 1) / 16);
        cr_assert_eq(valid->text[0], (uint8_t)text[1900], "the validation split is the last 5 %%");
        float x[2 * 16];
        int32_t y[2 * 16];
        dataset_gather(train, x, y, (uint32_t[]){ 3, 0 }, 2);
        for (int t = 0; t < 16; t++) {
                cr_assert_eq(x[t], (float)text[3 * 16 + t]);
                cr_assert_eq(y[t], text[3 * 16 + t + 1]);
                cr_assert_eq(x[16 + t], (float)text[t]);
                cr_assert_eq(y[16 + t], text[t + 1]);
        }
        DatasetShape s = dataset_shape(train);
        cr_assert_eq(s.c, 16);
        cr_assert_eq(s.max_label, 'z');
        cr_assert_eq(dataset_check_fit(&s, 16, 1, 1, 256, &d), 0);
        cr_assert_lt(dataset_check_fit(&s, 16, 1, 1, 100, &d), 0, "a vocabulary the text exceeds");
        cr_assert(strstr(d.text, "label 122"), "%s", d.text);
        dataset_free(train);
        dataset_free(valid);
}

/* A directory is its text files by name; binary files in it are left out. */
Test(text, a_directory_skips_what_is_not_text) {
        char a[600], b[600];
        memset(a, 'a', sizeof a);
        memset(b, 'b', sizeof b);
        write_bytes("2-second", b, sizeof b);
        write_bytes("1-first", a, sizeof a);
        write_bytes("1-first.dat", "\0\0\0\2binary", 10);
        char link[256];
        snprintf(link, sizeof link, "%s/1-first.u8", dir);
        cr_assert_eq(symlink("1-first", link), 0);
        Dataset *ds;
        Diag d = {};
        cr_assert_eq(dataset_load_text(dir, false, 8, 256, &ds, &d), 0, "%s", d.text);
        cr_assert_eq(ds->text_len, 1200 - 60, "both text files once, nothing else");
        cr_assert_eq(ds->text[0], 'a');
        cr_assert_eq(ds->text[600], 'b');
        /* what the daemon logs: the files read, and those left out */
        cr_assert_eq(ds->text_files, 2);
        cr_assert_eq(ds->text_left_out, 2);
        cr_assert_str_eq(ds->text_first_left_out, "1-first.dat");
        dataset_free(ds);
}

/* Running out of memory says so, not the reason a file before was left out
 * for ("1.dat: not UTF-8 text", which sent an operator to a file that was
 * fine). The allocation fails for real: a forked child loads the corpus
 * under an address-space limit its text does not fit, and writes what it
 * got to a pipe. */
Test(text, out_of_memory_is_not_a_skipped_file_s_reason) {
#if defined(__SANITIZE_ADDRESS__)
        cr_skip_test("SKIP: AddressSanitizer maps terabytes of shadow memory, which no address-space limit admits");
#endif
        enum { TEXT = 64 << 20 };
        char *text = malloc(TEXT);
        cr_assert(text);
        memset(text, 'a', TEXT);
        write_bytes("1.dat", "\0\0\0\2binary", 10);
        write_bytes("2.txt", text, TEXT);
        free(text);

        int fds[2];
        cr_assert_eq(pipe(fds), 0);
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
                /* what the child has mapped now, and 16 MiB more */
                char line[256];
                long kib = -1;
                FILE *f = fopen("/proc/self/status", "r");
                while (f && fgets(line, sizeof line, f))
                        sscanf(line, "VmSize: %ld kB", &kib);
                if (f)
                        fclose(f);
                rlim_t limit = ((rlim_t)kib << 10) + (16 << 20);
                Dataset *ds = NULL;
                Diag d = {};
                int r = kib < 0 || setrlimit(RLIMIT_AS, &(struct rlimit){ limit, limit }) < 0 ? -EPERM :
                        dataset_load_text(dir, false, 8, 256, &ds, &d);
                dprintf(fds[1], "%d %s", r, d.text);
                _exit(0);
        }
        close(fds[1]);
        char got[2048] = "";
        size_t n = 0;
        ssize_t k;
        while (n + 1 < sizeof got && (k = read(fds[0], got + n, sizeof got - 1 - n)) > 0)
                n += (size_t)k;
        close(fds[0]);
        waitpid(pid, NULL, 0);
        cr_assert_eq(atoi(got), -ENOMEM, "the child: %s", got);
        cr_assert(strstr(got, "Cannot allocate memory"), "%s", got);
        cr_assert_null(strstr(got, "1.dat"), "%s", got);
}

Test(text, what_is_not_text_is_refused) {
        char path[256];
        Dataset *ds = NULL;
        Diag d = {};
        write_bytes("empty", "", 0);
        snprintf(path, sizeof path, "%s/empty", dir);
        cr_assert_lt(dataset_load_text(path, false, 8, 256, &ds, &d), 0);
        cr_assert(strstr(d.text, "empty"), "%s", d.text);

        write_bytes("nul", "abc\0def", 7);
        snprintf(path, sizeof path, "%s/nul", dir);
        cr_assert_lt(dataset_load_text(path, false, 2, 256, &ds, &d), 0);
        cr_assert(strstr(d.text, "not UTF-8 text (byte 3 is 0x00)"), "%s", d.text);

        write_bytes("latin1", "caf\xe9 au lait, caf\xe9 noir", 22);
        snprintf(path, sizeof path, "%s/latin1", dir);
        cr_assert_lt(dataset_load_text(path, false, 2, 256, &ds, &d), 0);
        cr_assert(strstr(d.text, "not UTF-8 text (byte 3 is 0xe9)"), "%s", d.text);

        /* an overlong "/" (C0 AF), a surrogate (ED A0 80), past U+10FFFF (F4 90 80 80) */
        static const char *const bad[] = { "ab\xc0\xaf cd", "ab\xed\xa0\x80 cd", "ab\xf4\x90\x80\x80 cd" };
        for (int i = 0; i < 3; i++) {
                write_bytes("bad", bad[i], strlen(bad[i]));
                snprintf(path, sizeof path, "%s/bad", dir);
                cr_assert_lt(dataset_load_text(path, false, 1, 256, &ds, &d), 0, "case %d", i);
                cr_assert(strstr(d.text, "not UTF-8 text (byte 2 is"), "case %d: %s", i, d.text);
        }
        /* and what is valid: 2, 3 and 4 bytes (é, €, U+10348) */
        write_bytes("good", "caf\xc3\xa9 \xe2\x82\xac \xf0\x90\x8d\x88 ok", 17);
        snprintf(path, sizeof path, "%s/good", dir);
        cr_assert_eq(dataset_load_text(path, false, 2, 256, &ds, &d), 0, "%s", d.text);
        ds = dataset_free(ds);

        write_bytes("short", "too short for a context of 64", 29);
        snprintf(path, sizeof path, "%s/short", dir);
        cr_assert_lt(dataset_load_text(path, false, 64, 256, &ds, &d), 0);
        cr_assert(strstr(d.text, "shorter than one context of 64 bytes"), "%s", d.text);

        snprintf(path, sizeof path, "%s/missing", dir);
        cr_assert_eq(dataset_load_text(path, false, 8, 256, &ds, &d), -ENOENT);
        cr_assert_null(ds);
}

/* The probe sees what loading sees, without keeping the bytes. */
Test(text, the_probe_agrees_with_loading) {
        char text[3000], path[256];
        for (int i = 0; i < 3000; i++)
                text[i] = (char)(' ' + i % 90);
        write_bytes("t", text, sizeof text);
        snprintf(path, sizeof path, "%s/t", dir);
        for (int test = 0; test < 2; test++) {
                Dataset *ds;
                DatasetShape s, p;
                Diag d = {};
                cr_assert_eq(dataset_load_text(path, test, 32, 256, &ds, &d), 0, "%s", d.text);
                cr_assert_eq(dataset_probe_text(path, test, 32, &p, &d), 0, "%s", d.text);
                s = dataset_shape(ds);
                cr_assert(s.n == p.n && s.c == p.c && s.max_label == p.max_label);
                dataset_free(ds);
        }
}
