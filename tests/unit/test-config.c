/* ravnestd.conf: the shipped sample parses to the documented defaults; every
 * kind of mistake names the file, the line and the setting; config_net()
 * maps the settings into a NetConfig. */
#include <criterion/criterion.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "collective/coll-wire.h"
#include "collective/topology.h"
#include "conf/config.h"
#include "conf/nodes-file.h"
#include "conf/option.h"

#define K1 "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
#define K2 "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100"
#define SECRET_HEX "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0"

static const char *base =
        "state_directory = \"/tmp\";\n"                                      /* 1 */
        "threads = 2;\n"                                                     /* 2 */
        "network = {\n"                                                      /* 3 */
        "  listen = \"127.0.0.1:7000\";\n"                                   /* 4 */
        "  peers = [ \"127.0.0.2:7001\", \"[::1]:7002\", \"localhost:7003\" ];\n" /* 5 */
        "  admission = \"secret\";\n"                                        /* 6 */
        "  secret_file = \"@SECRET@\";\n"                                    /* 7 */
        "  io_backend = \"epoll\";\n"                                        /* 8 */
        "  zerocopy_threshold = \"auto\";\n"                                 /* 9 */
        "  max_frame = 65536;\n"                                             /* 10 */
        "  idle_timeout = 30000;\n"                                          /* 11 */
        "};\n";                                                              /* 12 */

static char secret_path[64];

/* A secret file with this mode and content, named by @SECRET@ in base. */
static void make_secret(mode_t mode, const char *content) {
        strcpy(secret_path, "/tmp/ravnest-test-secret-XXXXXX");
        int fd = mkstemp(secret_path);
        cr_assert(fd >= 0);
        cr_assert_eq(write(fd, content, strlen(content)), (ssize_t)strlen(content));
        cr_assert_eq(fchmod(fd, mode), 0);
        close(fd);
}

static void replace(char *text, size_t len, const char *from, const char *to) {
        char *at = strstr(text, from), tail[4096];
        cr_assert_not_null(at, "variant anchor \"%s\" not in base", from);
        snprintf(tail, sizeof tail, "%s", at + strlen(from));
        snprintf(at, len - (size_t)(at - text), "%s%s", to, tail);
}

/* Write base with one substitution and load it. */
static int load_variant(const char *from, const char *to, Config *c, Diag *d, char *path) {
        char text[4096];
        snprintf(text, sizeof text, "%s", base);
        replace(text, sizeof text, from, to);
        if (strstr(text, "@SECRET@")) {
                if (!secret_path[0])
                        make_secret(0600, SECRET_HEX "\n");
                replace(text, sizeof text, "@SECRET@", secret_path);
        }
        strcpy(path, "/tmp/ravnest-test-config-XXXXXX");
        int fd = mkstemp(path);
        cr_assert(fd >= 0);
        cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
        close(fd);
        int r = config_load(path, c, d);
        unlink(path);
        return r;
}

static void expect_error(const char *from, const char *to, const char *where) {
        char path[64], want[512];
        Config c;
        Diag d = {};
        int r = load_variant(from, to, &c, &d, path);
        cr_expect_lt(r, 0, "variant \"%s\" loaded", to);
        if (r >= 0)
                config_free(&c);
        snprintf(want, sizeof want, "%s:%s", path, where);
        cr_expect(strstr(d.text, want), "variant \"%s\": message \"%s\" lacks \"%s\"", to, d.text, want);
}

static void cleanup(void) {
        if (secret_path[0])
                unlink(secret_path);
        secret_path[0] = 0;
}

TestSuite(config, .fini = cleanup);

Test(config, shipped_sample_gives_defaults) {
        Config c, def;
        NetConfig n;
        Diag d = {};

        cr_assert_eq(config_load(SOURCE_ROOT "/config/ravnestd.conf", &c, &d), 0, "%s", d.text);
        config_defaults(&def);
        net_config_defaults(&n);
        /* what ravnestd.conf(5) documents */
        cr_assert_str_eq(c.state_directory, "/var/lib/ravnest");
        cr_assert_str_eq(c.job, JOBS_DIR "/fashion-mnist-mlp.job");
        cr_assert_eq(c.threads, 0);
        cr_assert_eq(c.listen.port, 0);
        cr_assert_eq(c.n_peers, 0);
        cr_assert_eq(c.admission, CONFIG_ADMISSION_SECRET);
        cr_assert_str_eq(c.secret_file, "");
        cr_assert(!c.has_secret);
        cr_assert_eq(c.n_allowed, 0);
        cr_assert(!c.net.plaintext);
        cr_assert_eq(c.net.backend, NET_BACKEND_AUTO);
        cr_assert_eq(c.net.zc_threshold, NET_ZC_AUTO);
        cr_assert_eq(c.net.limits.max_payload, 1u << 20);
        cr_assert_eq(c.net.chunk, 1u << 20);
        cr_assert_eq(c.net.limits.max_tensor_bytes, 256ull << 20);
        cr_assert_eq(c.net.max_queued, 256ull << 20);
        cr_assert_eq(c.net.max_links, 256);
        cr_assert_eq(c.net.max_links_per_addr, 64);
        cr_assert_eq(c.net.handshake_timeout_ms, 5000);
        cr_assert_eq(c.net.idle_timeout_ms, 120000);
        cr_assert_eq(c.net.stall_timeout_ms, 10000);
        cr_assert_eq(c.net.pool_bytes, 64u << 20);
        cr_assert_eq(c.net.lanes, 1);
        /* and the transport's own defaults */
        cr_assert_eq(c.net.limits.max_payload, n.limits.max_payload);
        cr_assert_eq(c.net.limits.max_control, n.limits.max_control);
        cr_assert_eq(c.net.limits.max_tensor_bytes, n.limits.max_tensor_bytes);
        cr_assert_eq(c.net.chunk, n.chunk);
        cr_assert_eq(c.net.max_queued, n.max_queued);
        cr_assert_eq(c.net.max_links, n.max_links);
        cr_assert_eq(c.net.idle_timeout_ms, n.idle_timeout_ms);
        cr_assert_eq(c.net.pool_bytes, n.pool_bytes);
        cr_assert_str_eq(c.state_directory, def.state_directory);
        cr_assert_str_eq(c.job, def.job);

        /* Nothing to admit with: config_net() says so. */
        Identity id = {};
        cr_assert_eq(config_net(&c, &id, &n, &d), -EINVAL);
        cr_assert(strstr(d.text, "ravnestd.conf: network.secret_file: missing"), "%s", d.text);
        config_free(&c);
}

Test(config, base_maps_into_netconfig) {
        char path[64];
        Config c;
        Identity id;
        NetConfig n;
        Diag d = {};
        uint8_t secret[32];
        size_t len;

        cr_assert_eq(load_variant("threads", "threads", &c, &d, path), 0, "%s", d.text);
        cr_assert_str_eq(c.state_directory, "/tmp");
        cr_assert_eq(c.threads, 2);
        cr_assert_str_eq(c.listen.host, "127.0.0.1");
        cr_assert_eq(c.listen.port, 7000);
        cr_assert_eq(c.n_peers, 3);
        cr_assert_str_eq(c.peers[1].host, "::1");
        cr_assert_eq(c.peers[1].port, 7002);
        cr_assert_str_eq(c.peers[2].host, "localhost");

        cr_assert_eq(identity_generate(&id), 0);
        cr_assert_eq(config_net(&c, &id, &n, &d), 0, "%s", d.text);
        cr_assert_eq(n.identity, &id);
        cr_assert_not_null(n.secret);
        sodium_hex2bin(secret, sizeof secret, SECRET_HEX, 64, NULL, &len, NULL);
        cr_assert_eq(memcmp(n.secret, secret, 32), 0);
        cr_assert_eq(n.n_allowed, 0);
        cr_assert_null(n.allowed);
        cr_assert_eq(n.backend, NET_BACKEND_EPOLL);
        cr_assert_eq(n.zc_threshold, NET_ZC_AUTO);
        cr_assert_eq(n.limits.max_payload, 65536);
        cr_assert_eq(n.chunk, 65536);
        cr_assert_eq(n.idle_timeout_ms, 30000);
        cr_assert_eq(n.stall_timeout_ms, 10000);
        cr_assert(!n.plaintext);
        config_free(&c);

        /* A NetConfig that net_new() accepts. */
        Net *net = NULL;
        cr_assert_eq(load_variant("threads", "threads", &c, &d, path), 0, "%s", d.text);
        cr_assert_eq(config_net(&c, &id, &n, &d), 0, "%s", d.text);
        cr_assert_eq(net_new(&n, NULL, NULL, &net), 0);
        net_free(net);
        config_free(&c);
}

Test(config, zerocopy_and_sizes) {
        char path[64];
        Config c;
        Diag d = {};

        cr_assert_eq(load_variant("\"auto\";", "8192;", &c, &d, path), 0, "%s", d.text);
        cr_assert_eq(c.net.zc_threshold, 8192);
        config_free(&c);
        cr_assert_eq(load_variant("\"auto\";", "0;", &c, &d, path), 0, "%s", d.text);
        cr_assert_eq(c.net.zc_threshold, 0);
        config_free(&c);
        /* 64-bit values need libconfig's L suffix */
        cr_assert_eq(load_variant("max_frame = 65536;", "max_tensor = 4294967296L; max_queued = 8192;", &c, &d, path),
                     0, "%s", d.text);
        cr_assert_eq(c.net.limits.max_tensor_bytes, 4ull << 30);
        cr_assert_eq(c.net.max_queued, 8192);
        cr_assert_eq(c.net.limits.max_payload, 1u << 20);
        config_free(&c);
}

Test(config, admission_modes) {
        char path[64];
        Config c;
        Identity id = {};
        NetConfig n;
        Diag d = {};
        uint8_t k2[32];

        cr_assert_eq(identity_from_hex(K2, k2), 0);
        /* allowlist: keys, no secret */
        cr_assert_eq(load_variant("admission = \"secret\";\n  secret_file = \"@SECRET@\";",
                                  "admission = \"allowlist\"; allowed_peers = [ \"" K1 "\", \"" K2 "\" ];", &c, &d, path),
                     0, "%s", d.text);
        cr_assert_eq(config_net(&c, &id, &n, &d), 0, "%s", d.text);
        cr_assert_null(n.secret);
        cr_assert_eq(n.n_allowed, 2);
        cr_assert_eq(memcmp(n.allowed[1], k2, 32), 0);
        config_free(&c);

        /* both */
        cr_assert_eq(load_variant("admission = \"secret\";",
                                  "admission = \"both\"; allowed_peers = ( \"" K2 "\" );", &c, &d, path),
                     0, "%s", d.text);
        cr_assert_eq(config_net(&c, &id, &n, &d), 0, "%s", d.text);
        cr_assert_not_null(n.secret);
        cr_assert_eq(n.n_allowed, 1);
        cr_assert_eq(memcmp(n.allowed[0], k2, 32), 0);
        config_free(&c);

        /* secret (the base): secret only */
        cr_assert_eq(load_variant("threads", "threads", &c, &d, path), 0, "%s", d.text);
        cr_assert_eq(config_net(&c, &id, &n, &d), 0, "%s", d.text);
        cr_assert_not_null(n.secret);
        cr_assert_eq(n.n_allowed, 0);
        config_free(&c);
}

Test(config, plaintext_on_loopback_only) {
        char path[64];
        Config c;
        Diag d = {};

        /* 127.0.0.0/8, ::1 and localhost */
        cr_assert_eq(load_variant("max_frame", "plaintext = true; max_frame", &c, &d, path), 0, "%s", d.text);
        cr_assert(c.net.plaintext);
        config_free(&c);
        expect_error("peers = [ \"127.0.0.2:7001\",", "plaintext = true; peers = [ \"192.0.2.1:7001\",",
                     "5: network.plaintext: refused: peer 192.0.2.1 is not loopback");
        expect_error("\"localhost:7003\" ];", "\"localhost.example.com:7003\" ]; plaintext = true;",
                     "5: network.plaintext: refused: peer localhost.example.com is not loopback");
        expect_error("listen = \"127.0.0.1:7000\";", "listen = \"0.0.0.0:7000\"; plaintext = true;",
                     "4: network.plaintext: refused: listen address 0.0.0.0 is not loopback");
}

/* Replace the secret file with one of this mode and content. */
static void use_secret(mode_t mode, const char *content) {
        cleanup();
        make_secret(mode, content);
}

Test(config, secret_file_checked) {
        char want[256];

        use_secret(0644, SECRET_HEX "\n");
        snprintf(want, sizeof want, "7: network.secret_file: %s: readable by others (mode 0644): chmod 600 it", secret_path);
        expect_error("threads", "threads", want);
        use_secret(0600, "not a secret\n");
        snprintf(want, sizeof want, "7: network.secret_file: %s: must hold 64 hex digits", secret_path);
        expect_error("threads", "threads", want);
        use_secret(0600, SECRET_HEX "0\n"); /* 65 digits */
        snprintf(want, sizeof want, "7: network.secret_file: %s: must hold 64 hex digits", secret_path);
        expect_error("threads", "threads", want);
        use_secret(0400, SECRET_HEX); /* no newline, read-only: fine */
        char path[64];
        Config c;
        Diag d = {};
        cr_assert_eq(load_variant("threads", "threads", &c, &d, path), 0, "%s", d.text);
        cr_assert(c.has_secret);
        config_free(&c);
        cr_assert(!c.has_secret && c.peers == NULL);
}

Test(config, errors_name_file_line_and_setting) {
        /* unknown settings */
        expect_error("threads = 2;", "threads = 2; thread = 3;", "2: thread: unknown setting");
        expect_error("max_frame = 65536;", "max_frame = 65536; backlog = 5;", "10: network.backlog: unknown setting");
        /* wrong type */
        expect_error("threads = 2;", "threads = \"two\";", "2: threads: must be an integer in [0, 256]");
        expect_error("max_frame = 65536;", "max_frame = 1.5;", "10: network.max_frame: must be an integer");
        expect_error("idle_timeout = 30000;", "plaintext = 1;", "11: network.plaintext: must be true or false");
        expect_error("[ \"127.0.0.2:7001\", \"[::1]:7002\", \"localhost:7003\" ]", "\"127.0.0.2:7001\"",
                     "5: network.peers: must be a list of strings");
        expect_error("[ \"127.0.0.2:7001\", \"[::1]:7002\", \"localhost:7003\" ]", "( \"127.0.0.2:7001\", 7003 )",
                     "5: network.peers.[1]: must be a string");
        expect_error(base, "threads = 1;\nnetwork = 5;\n", "2: network: must be a group");
        expect_error("state_directory = \"/tmp\";", "state_directory = \"tmp\";",
                     "1: state_directory: must be an absolute path");
        expect_error("\"auto\";", "\"always\";", "9: network.zerocopy_threshold: must be \"auto\" or an integer");
        expect_error("\"epoll\";", "\"kqueue\";", "8: network.io_backend: unknown value \"kqueue\" (known: auto, io_uring, epoll)");
        expect_error("\"secret\";", "\"open\";", "6: network.admission: unknown value \"open\"");
        /* out of range */
        expect_error("threads = 2;", "threads = 300;", "2: threads: must be an integer in [0, 256], got 300");
        expect_error("max_frame = 65536;", "max_frame = 1024;",
                     "10: network.max_frame: must be an integer in [4096, 67108864], got 1024");
        expect_error("\"auto\";", "2147483647;", "9: network.zerocopy_threshold: must be an integer in [0, 1073741824]");
        expect_error("max_frame = 65536;", "max_frame = 65536; connections = 9;",
                     "10: network.connections: must be an integer in [1, 8], got 9");
        /* host:port */
        expect_error("\"127.0.0.1:7000\"", "\"127.0.0.1\"", "4: network.listen: must be \"host:port\"");
        expect_error("\"127.0.0.1:7000\"", "\"127.0.0.1:0\"", "4: network.listen: port must be in [1, 65535]");
        expect_error("\"127.0.0.1:7000\"", "\"127.0.0.1:70000\"", "4: network.listen: port must be in [1, 65535]");
        expect_error("\"[::1]:7002\"", "\"::1:7002\"", "5: network.peers.[1]: IPv6 addresses go in brackets");
        expect_error("\"[::1]:7002\"", "\"[::g]:7002\"", "5: network.peers.[1]: not an IPv6 address");
        expect_error("\"localhost:7003\"", "\"local host:7003\"", "5: network.peers.[2]: not a host name");
        /* admission */
        expect_error("  secret_file = \"@SECRET@\";\n", "", "3: network.secret_file: missing (required with admission = \"secret\")");
        expect_error("\"secret\";", "\"allowlist\"; allowed_peers = [ \"" K1 "\" ];",
                     "7: network.secret_file: only used with admission = \"secret\" or \"both\"");
        expect_error("  secret_file = \"@SECRET@\";\n", "  allowed_peers = [ \"" K1 "\", \"abc\" ];\n",
                     "7: network.allowed_peers: only used with admission");
        expect_error("admission = \"secret\";\n  secret_file = \"@SECRET@\";",
                     "admission = \"allowlist\";\n  allowed_peers = [ \"" K1 "\", \"" K1 "zz\" ];",
                     "7: network.allowed_peers.[1]: must be an Ed25519 public key in 64 hex digits");
        expect_error("admission = \"secret\";\n  secret_file = \"@SECRET@\";", "admission = \"allowlist\";",
                     "3: network.allowed_peers: missing (required with admission = \"allowlist\")");
        expect_error("\"secret\";", "\"both\"; allowed_peers = [];", "6: network.allowed_peers: empty");
        expect_error("\"@SECRET@\"", "\"secret\"", "7: network.secret_file: must be an absolute path");
        expect_error("\"@SECRET@\"", "\"/nonexistent/secret\"",
                     "7: network.secret_file: /nonexistent/secret: cannot read: No such file or directory");
}

/* What libconfig 1.5 itself reports names the setting too: it cuts an
 * integer past 32 bits to its low bits (and one past 64 with L to the
 * largest), and names only the line of a duplicate or a syntax error. */
Test(config, libconfig_errors_name_the_setting) {
        expect_error("threads = 2;", "threads = 99999999999;",
                     "2: threads: 99999999999 is read as a 32-bit integer: write 99999999999L");
        expect_error("threads = 2;", "threads = 4294967298;", /* its low 32 bits are 2 */
                     "2: threads: 4294967298 is read as a 32-bit integer");
        expect_error("threads = 2;", "threads = -99999999999;", "2: threads: -99999999999 is read as a 32-bit");
        expect_error("threads = 2;", "threads = 0x100000002;", "2: threads: 0x100000002 is read as a 32-bit");
        expect_error("threads = 2;", "threads = 99999999999L;", "2: threads: must be an integer in [0, 256], got 99999999999");
        expect_error("threads = 2;", "threads = 9223372036854775808L;", "2: threads: 9223372036854775808L does not fit 64 bits");
        expect_error("threads = 2;", "threads = 99999999999999999999;", "2: threads: 99999999999999999999 does not fit 64 bits");
        expect_error("threads = 2;", "threads = 0x80000000;", "2: threads: 0x80000000 is read as a 32-bit integer");
        /* a string with a newline in it still counts, a colon in a string is no setting's, every error is listed */
        expect_error("threads = 2;", "s = \"a\nb\";\nn = ( \"x:y\", 4294967296 ); m = 4294967297;",
                     "4: n.[1]: 4294967296 is read as a 32-bit integer");
        expect_error("threads = 2;", "s = \"a\nb\";\nn = ( \"x:y\", 4294967296 ); m = 4294967297;",
                     "4: m: 4294967297 is read as a 32-bit integer");
        expect_error("idle_timeout = 30000;", "idle_timeout = 99999999999;",
                     "11: network.idle_timeout: 99999999999 is read as a 32-bit integer");
        expect_error("threads = 2;", "threads = 2; idle = { busy_time = 99999999999; };",
                     "2: idle.busy_time: 99999999999 is read as a 32-bit integer");
        /* wherever it stands: another setting of the same name on the line, an array, a long line */
        expect_error("threads = 2;", "idle = { busy_time = 1; }; checkpoint = { interval = 1; }; x = { interval = 4294967306; };",
                     "2: x.interval: 4294967306 is read as a 32-bit integer");
        char line[3000];
        int k = snprintf(line, sizeof line, "threads = 2; idle = { busy_time = 1; max_other_cpu = 1.5e3; }; n = [ ");
        for (int i = 0; i < 600; i++) /* past the 1024 bytes a line was read back in */
                k += snprintf(line + k, sizeof line - (size_t)k, "1, ");
        snprintf(line + k, sizeof line - (size_t)k, "4294967296 ]; # 99999999999 in a comment\ns = \"99999999999\";");
        expect_error("threads = 2;", line, "2: n.[600]: 4294967296 is read as a 32-bit integer");
        expect_error("threads = 2;", "threads = 2;\nthreads = 3;", "3: threads: set twice in the same group");
        expect_error("max_frame = 65536;", "max_frame = 65536; max_frame = 4096;",
                     "10: network.max_frame: set twice in the same group");
        expect_error("threads = 2;", "threads = 2 +;", "2: syntax error in \"threads = 2 +;\"");
        expect_error("threads = 2;", "threads = 2;\njob = \"/nonexistent/x.job\";",
                     "3: job: /nonexistent/x.job: cannot read: No such file or directory");
        expect_error("threads = 2;", "threads = 2;\njob = \"/tmp\";", "3: job: /tmp: not a regular file");

        /* in range, and a job that is there: no error */
        char path[64];
        Config c;
        Diag d = {};
        cr_assert_eq(load_variant("threads = 2;", "threads = 256;\njob = \"" SOURCE_ROOT
                                  "/config/jobs/fashion-mnist-mlp.job\";", &c, &d, path), 0, "%s", d.text);
        cr_expect_eq(c.threads, 256);
        config_free(&c);
}

/* A duplicate names the setting set twice by its full path, even when it
 * was first set on an earlier line and another name comes first on this
 * one; a name in a string or a comment is no setting. */
Test(config, a_duplicate_names_its_full_path) {
        expect_error("threads = 2;", "idle = { enabled = true; };\nthreads = 1; idle = { enabled = false; };",
                     "3: idle: set twice in the same group");
        expect_error("threads = 2;", "idle = {\n  enabled = true;\n  busy_time = 1; enabled = false;\n};",
                     "4: idle.enabled: set twice in the same group");
        expect_error("threads = 2;", "threads = 2; s = \"idle = 1\"; # idle =\nidle = { };\n/* idle = */ idle = { };",
                     "4: idle: set twice in the same group");
        expect_error("threads = 2;", "idle = { enabled = true; };\nx = ( { enabled = 1; },\n  { a = 2; a = 3; } );",
                     "4: x.[1].a: set twice in the same group");
        expect_error("threads = 2;", "idle = {\n  enabled = true;\n  enabled\n  = false;\n};",
                     "4: idle.enabled: set twice in the same group");
        /* libconfig reads "1b" as 1 and a setting b: not sure which, the line is quoted */
        expect_error("threads = 2;", "b = 1;\nx = 1b;\nb = 2;", "3: duplicate setting name in \"x = 1b;\"");
}

/* An integer too wide names its setting's full path: the groups around
 * it, and its element in an array or a list on a line of its own. */
Test(config, a_wide_integer_names_its_full_path) {
        expect_error("idle_timeout = 30000;", "max_tensor = 68719476736;",
                     "11: network.max_tensor: 68719476736 is read as a 32-bit integer");
        expect_error("[ \"127.0.0.2:7001\", \"[::1]:7002\", \"localhost:7003\" ]", "[ 1,\n  99999999999 ]",
                     "6: network.peers.[1]: 99999999999 is read as a 32-bit integer");
        expect_error("threads = 2;", "x = ( { a = 1; }, { b = [ 1, 2 ]; c = ( \"s\", [ 1, 99999999999 ] ); } );",
                     "2: x.[1].c.[1].[1]: 99999999999 is read as a 32-bit integer");
}

/* A number outside its bounds is printed in the digits that tell it from
 * the bound. */
Test(config, a_number_out_of_range_is_printed_as_written) {
        expect_error("threads = 2;", "threads = 2; idle = { resume_after = 86400.0001; };",
                     "2: idle.resume_after: must be a number in [0, 86400], got 86400.0001");
        expect_error("threads = 2;", "threads = 2; idle = { max_other_cpu = 0.0099999; };",
                     "2: idle.max_other_cpu: must be a number in [0.01, 4096], got 0.0099999");
}

/* A wrong setting of membership is the one error: the averaging and
 * pipeline sections are still read as a member's, which name no members
 * and no clusters (the coordinator's plan does). */
Test(config, a_membership_error_brings_no_follow_on_errors) {
        char path[] = "/tmp/ravnest-test-member-XXXXXX";
        int fd = mkstemp(path);
        cr_assert(fd >= 0);
        const char *text = "state_directory = \"/tmp\";\npipeline = { listen = \"127.0.0.1:7103\"; };\n"
                           "averaging = { listen = \"127.0.0.1:7104\"; };\n"
                           "membership = { coordinator = \"" K1 "@127.0.0.1:7103\"; min_nodes = 0; };\n";
        cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
        close(fd);
        Config c;
        Diag d = {};
        cr_assert_lt(config_load(path, &c, &d), 0);
        char want[128];
        snprintf(want, sizeof want, "%s:4: membership.min_nodes: must be an integer in [1, 1024], got 0", path);
        cr_assert(strstr(d.text, want), "%s", d.text);
        cr_assert(!strstr(d.text, "averaging.members") && !strstr(d.text, "pipeline.clusters"), "%s", d.text);
        unlink(path);
}

/* libconfig would open what an @include names relative to the working
 * directory, and a FIFO there would block the daemon in open(): refused
 * before anything is opened, wherever it stands; in a comment it is no
 * directive. */
Test(config, an_include_is_refused_before_it_is_opened, .timeout = 20) {
        char fifo[64] = "/tmp/ravnest-test-include-XXXXXX", text[200];
        cr_assert(mkdtemp(fifo));
        strcat(fifo, "/fifo");
        cr_assert_eq(mkfifo(fifo, 0600), 0);
        snprintf(text, sizeof text, "threads = 2;\n@include \"%s\"", fifo);
        expect_error("threads = 2;", text, "3: @include is not supported");
        snprintf(text, sizeof text, "threads = 2; idle = { busy_time = 1; };\n  @include \"%s\"\n", fifo);
        expect_error("threads = 2;", text, "3: @include is not supported");
        Config c;
        Diag d = {};
        char path[64];
        cr_assert_eq(load_variant("threads = 2;", "threads = 2; # @include \"x\"\n/* @include \"y\" */", &c, &d, path),
                     0, "%s", d.text);
        config_free(&c);
        unlink(fifo);
        *strrchr(fifo, '/') = 0;
        rmdir(fifo);
}

/* the averaging group, appended to base from line 13 */
static const char *base_end = "  idle_timeout = 30000;\n};\n";

/* An averaging group, a pipeline stage or a member of a swarm admits
 * peers: without a network section at all, the file is refused (it used
 * to pass --check-config and fail only when the node started). */
Test(config, a_node_with_links_and_no_network_section_is_refused) {
        char path[] = "/tmp/ravnest-test-nonet-XXXXXX";
        int fd = mkstemp(path);
        cr_assert(fd >= 0);
        const char *text = "state_directory = \"/tmp\";\naveraging = {\n  listen = \"127.0.0.1:7100\";\n"
                           "  members = [ \"" K1 "@127.0.0.1:7100\", \"" K2 "@127.0.0.1:7101\" ];\n};\n";
        cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
        close(fd);
        Config c;
        Diag d = {};
        cr_assert_eq(config_load(path, &c, &d), -EINVAL);
        char want[128];
        snprintf(want, sizeof want, "%s: network: missing: a node that averages", path);
        cr_assert(strstr(d.text, want), "%s", d.text);
        unlink(path);
}

Test(config, averaging_group) {
        char path[64];
        Config c;
        Diag d = {};
        cr_assert_eq(load_variant(base_end, "  idle_timeout = 30000;\n};\naveraging = {\n"
                                            "  method = \"moshpit\";\n  interval_steps = 50;\n  fp16 = true;\n"
                                            "  listen = \"127.0.0.1:7100\";\n"
                                            "  members = [ \"" K1 "@127.0.0.1:7100\", \"" K2 "@[::1]:7101\", \"" SECRET_HEX "@h:1\" ];\n"
                                            "};\n", &c, &d, path), 0, "%s", d.text);
        const ConfigAveraging *a = &c.averaging;
        cr_assert(a->enabled && a->method == CONFIG_AVERAGING_MOSHPIT && a->interval_steps == 50 &&
                  a->payload == COLL_PAYLOAD_F16, "fp16 = true: binary16");
        cr_assert_eq(a->n_members, 3);
        cr_assert_eq(a->members[1].address.port, 7101);
        cr_assert_str_eq(a->members[1].address.host, "::1");
        cr_assert(a->grid_dims == 2 && a->grid_side == 2, "3 members fit a 2x2 grid: %ux%u", a->grid_dims, a->grid_side);
        cr_assert_eq(a->join_timeout_ms, 10000);
        config_free(&c);

        const char *line = "  listen = \"127.0.0.1:7100\";\n  members = [ \"" K1 "@127.0.0.1:7100\", \"" K2 "@127.0.0.1:7101\" ];\n";
        char body[1024];
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  gossip = 1;\n};\n", line);
        expect_error(base_end, body, "16: averaging.gossip: unknown setting");
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  method = \"mpi\";\n};\n", line);
        expect_error(base_end, body, "16: averaging.method: unknown value \"mpi\" (known: ring, moshpit, gossip, auto)");
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  interval = 0.0;\n};\n", line);
        expect_error(base_end, body, "16: averaging.interval: must be a number in [0.05, 86400]");
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  grid = [ 2, 4 ];\n};\n", line);
        expect_error(base_end, body, "16: averaging.grid: only used with method = \"moshpit\"");
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  method = \"moshpit\"; grid = [ 1, 1 ];\n};\n", line);
        expect_error(base_end, body, "16: averaging.grid: needs 1..8 dimensions");
        expect_error(base_end, "  idle_timeout = 30000;\n};\naveraging = {\n  members = [ \"" K1 "@a:1\", \"" K2 "@b:2\" ];\n};\n",
                     "13: averaging.listen: missing");
        expect_error(base_end, "  idle_timeout = 30000;\n};\naveraging = {\n  listen = \"127.0.0.1:1\";\n  members = [ \"" K1 "@a:1\" ];\n};\n",
                     "15: averaging.members: needs every member, this node included: at least two");
        expect_error(base_end, "  idle_timeout = 30000;\n};\naveraging = {\n  listen = \"127.0.0.1:1\";\n  members = [ \"" K1 "@a:1\",\n \"" K1 "@b:2\" ];\n};\n",
                     "16: averaging.members.[1]: the same key as member 1");
        expect_error(base_end, "  idle_timeout = 30000;\n};\naveraging = {\n  listen = \"127.0.0.1:1\";\n  members = [ \"" K1 "@a:1\", \"abc@b:2\" ];\n};\n",
                     "15: averaging.members.[1]: must be \"<public key, 64 hex digits>@host:port\"");
        expect_error(base_end, "  idle_timeout = 30000;\n};\naveraging = {\n  listen = \"127.0.0.1:1\";\n  members = [ \"" K1 "@a:1\", \"" K2 "@b\" ];\n};\n",
                     "15: averaging.members.[1]: must be \"host:port\"");
}

/* averaging.payload, and fp16, its older spelling of "f16"; error
 * feedback, off by default and only with int8; averaging opens on line 13 */
Test(config, averaging_payload) {
        const char *line = "  listen = \"127.0.0.1:7100\";\n  members = [ \"" K1 "@127.0.0.1:7100\", \"" K2 "@127.0.0.1:7101\" ];\n";
        static const struct {
                const char *settings;
                int payload;
                bool feedback;
        } ok[] = {
                { "", COLL_PAYLOAD_F32, false },
                { "payload = \"f32\";", COLL_PAYLOAD_F32, false },
                { "payload = \"f16\";", COLL_PAYLOAD_F16, false },
                { "payload = \"int8\";", COLL_PAYLOAD_INT8, false },
                { "fp16 = true;", COLL_PAYLOAD_F16, false },
                { "fp16 = false;", COLL_PAYLOAD_F32, false },
                { "fp16 = true; payload = \"f16\";", COLL_PAYLOAD_F16, false },
                { "fp16 = false; payload = \"int8\";", COLL_PAYLOAD_INT8, false },
                { "payload = \"int8\"; error_feedback = false;", COLL_PAYLOAD_INT8, false },
                { "payload = \"int8\"; error_feedback = true;", COLL_PAYLOAD_INT8, true },
        };
        char body[1024], path[64];
        for (size_t i = 0; i < ELEMENTSOF(ok); i++) {
                Config c;
                Diag d = {};
                snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  %s\n};\n", line,
                         ok[i].settings);
                cr_assert_eq(load_variant(base_end, body, &c, &d, path), 0, "%s: %s", ok[i].settings, d.text);
                cr_assert_eq(c.averaging.payload, ok[i].payload, "%s", ok[i].settings);
                cr_assert_eq(c.averaging.error_feedback, ok[i].feedback, "%s", ok[i].settings);
                cr_assert(c.averaging.take_parameters, "a joiner takes the others' parameters unless told not to");
                config_free(&c);
        }
        Config c;
        Diag d = {};
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  take_parameters = false;\n};\n",
                 line);
        cr_assert_eq(load_variant(base_end, body, &c, &d, path), 0, "%s", d.text);
        cr_assert(!c.averaging.take_parameters);
        config_free(&c);
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  payload = \"bf16\";\n};\n", line);
        expect_error(base_end, body, "16: averaging.payload: unknown value \"bf16\" (known: f32, f16, int8)");
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  payload = 8;\n};\n", line);
        expect_error(base_end, body, "16: averaging.payload: must be a string");
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  fp16 = true; payload = \"int8\";\n};\n",
                 line);
        expect_error(base_end, body, "16: averaging.payload: \"int8\" disagrees with fp16 = true");
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  payload = \"f16\";\n  fp16 = false;\n};\n",
                 line);
        expect_error(base_end, body, "16: averaging.payload: \"f16\" disagrees with fp16 = false");
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  payload = \"f16\";\n  error_feedback = true;\n};\n",
                 line);
        expect_error(base_end, body, "17: averaging.error_feedback: only used with payload = \"int8\"");
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  payload = \"int8\";\n  error_feedback = 1;\n};\n",
                 line);
        expect_error(base_end, body, "17: averaging.error_feedback: must be true or false");
}

/* gossip and auto: topology and weight, every step (no cadence), members
 * training alone; averaging opens on line 13 */
Test(config, averaging_gossip_and_auto) {
        const char *line = "  listen = \"127.0.0.1:7100\";\n  members = [ \"" K1 "@127.0.0.1:7100\", \"" K2 "@127.0.0.1:7101\" ];\n";
        char body[1024], path[64];
        Config c;
        Diag d = {};

        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  method = \"gossip\"; topology = \"exp\"; weight = 0.25;\n};\n", line);
        cr_assert_eq(load_variant(base_end, body, &c, &d, path), 0, "%s", d.text);
        cr_assert(c.averaging.enabled && c.averaging.method == CONFIG_AVERAGING_GOSSIP);
        cr_assert_eq(c.averaging.topology, GOSSIP_EXP);
        cr_assert_float_eq(c.averaging.weight, 0.25, 1e-12);
        config_free(&c);
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  method = \"gossip\";\n};\n", line);
        cr_assert_eq(load_variant(base_end, body, &c, &d, path), 0, "%s", d.text);
        cr_assert_eq(c.averaging.topology, GOSSIP_ALT_EXP_RING, "the default topology");
        cr_assert_float_eq(c.averaging.weight, 0.0, 1e-12, "the default weight: the group's average");
        config_free(&c);
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  method = \"auto\"; weight = 0.5;\n};\n", line);
        cr_assert_eq(load_variant(base_end, body, &c, &d, path), 0, "%s", d.text);
        cr_assert_eq(c.averaging.method, CONFIG_AVERAGING_AUTO);
        config_free(&c);

        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  method = \"gossip\"; topology = \"star\";\n};\n", line);
        expect_error(base_end, body, "16: averaging.topology: unknown value \"star\" (known: complete, ring, exp, alt-exp-ring)");
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  topology = \"ring\";\n};\n", line);
        expect_error(base_end, body, "16: averaging.topology: only used with method = \"gossip\"");
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  method = \"auto\";\n  topology = \"ring\";\n};\n", line);
        expect_error(base_end, body, "17: averaging.topology: only used with method = \"gossip\" (auto chooses the topology)");
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  method = \"gossip\";\n  weight = 1.5;\n};\n", line);
        expect_error(base_end, body, "17: averaging.weight: must be a number in [0, 0.99], got 1.5");
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  weight = 0.5;\n};\n", line);
        expect_error(base_end, body, "16: averaging.weight: only used with method = \"gossip\" or \"auto\"");
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  method = \"gossip\";\n  interval_steps = 5;\n};\n", line);
        expect_error(base_end, body, "17: averaging.interval_steps: not used with method = \"gossip\": it mixes every step");
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  method = \"auto\";\n};\npipeline = { };\n", line);
        expect_error(base_end, body, "16: averaging.method: \"auto\" is for members training the whole model alone, not with a pipeline");
}

/* membership: the coordinator's plan instead of pipeline.clusters and
 * averaging.members, from line 13 */
Test(config, membership) {
        static const char *sections =
                "  idle_timeout = 30000;\n};\n"
                "pipeline = { listen = \"127.0.0.1:7200\"; };\n"              /* 13 */
                "averaging = { listen = \"127.0.0.1:7300\"; };\n"             /* 14 */
                "membership = {\n"                                            /* 15 */
                "  coordinator = \"" K1 "@10.0.0.1:7400\";\n";                /* 16 */
        char path[64], body[2048];
        Config c;
        Diag d = {};

        snprintf(body, sizeof body, "%s};\n", sections);
        cr_assert_eq(load_variant(base_end, body, &c, &d, path), 0, "%s", d.text);
        const ConfigMembership *m = &c.membership;
        cr_assert(m->enabled && !m->coordinate && m->train);
        cr_assert_str_eq(m->coordinator.address.host, "10.0.0.1");
        cr_assert_eq(m->coordinator.address.port, 7400);
        cr_assert_eq(m->coordinator.id[0], 0x00);
        cr_assert_eq(m->coordinator.id[1], 0x11);
        /* the defaults ravnestd.conf(5) documents */
        cr_assert_eq(m->memory, 0);
        cr_assert_eq(m->probe_ms, 300);
        cr_assert_eq(m->min_nodes, 2);
        cr_assert_eq(m->settle_ms, 2000);
        cr_assert_eq(m->heartbeat_ms, 1000);
        cr_assert_eq(m->deadline_ms, 10000);
        cr_assert_eq(m->handover_timeout_ms, 10000);
        cr_assert(!c.pipeline.enabled && !c.averaging.enabled, "the plan enables them");
        cr_assert_eq(c.pipeline.listen.port, 7200);
        cr_assert_eq(c.averaging.listen.port, 7300);
        config_free(&c);

        snprintf(body, sizeof body, "%s  coordinate = true; memory = \"512M\"; probe = 0.1; min_nodes = 6;\n"
                 "  settle = 0.5; heartbeat = 0.25; deadline = 3; handover_timeout = 4.5;\n};\n", sections);
        cr_assert_eq(load_variant(base_end, body, &c, &d, path), 0, "%s", d.text);
        cr_assert(m->coordinate);
        cr_assert_eq(m->memory, 512ull << 20);
        cr_assert_eq(m->probe_ms, 100);
        cr_assert_eq(m->min_nodes, 6);
        cr_assert_eq(m->settle_ms, 500);
        cr_assert_eq(m->heartbeat_ms, 250);
        cr_assert_eq(m->deadline_ms, 3000);
        cr_assert_eq(m->handover_timeout_ms, 4500);
        config_free(&c);

        snprintf(body, sizeof body, "%s  memory = 1048576;\n};\n", sections);
        cr_assert_eq(load_variant(base_end, body, &c, &d, path), 0, "%s", d.text);
        cr_assert_eq(m->memory, 1048576);
        config_free(&c);

        /* a coordinator that does not train needs no pipeline or averaging */
        cr_assert_eq(load_variant(base_end, "  idle_timeout = 30000;\n};\nmembership = {\n  coordinator = \"" K1
                                            "@h:1\";\n  coordinate = true; train = false;\n};\n", &c, &d, path),
                     0, "%s", d.text);
        cr_assert(m->coordinate && !m->train);
        config_free(&c);
        snprintf(body, sizeof body, "%s  train = false;\n};\n", sections);
        expect_error(base_end, body, "17: membership.train: false only with coordinate = true");
        snprintf(body, sizeof body, "%s  memory = \"lots\";\n};\n", sections);
        expect_error(base_end, body, "17: membership.memory: must be bytes, or a size");
        snprintf(body, sizeof body, "%s  min_nodes = 1025;\n};\n", sections);
        expect_error(base_end, body, "17: membership.min_nodes: must be an integer in [1, 1024]");
        snprintf(body, sizeof body, "%s  heartbeat = 2; deadline = 3;\n};\n", sections);
        expect_error(base_end, body, "17: membership.deadline: the deadline (3 s) must be at least two heartbeats");
        snprintf(body, sizeof body, "%s  leader = true;\n};\n", sections);
        expect_error(base_end, body, "17: membership.leader: unknown setting");
        expect_error(base_end, "  idle_timeout = 30000;\n};\npipeline = { listen = \"127.0.0.1:7200\"; };\n"
                               "averaging = { listen = \"127.0.0.1:7300\"; };\nmembership = { coordinate = true; };\n",
                     "15: membership.coordinator: missing");
        expect_error(base_end, "  idle_timeout = 30000;\n};\npipeline = { listen = \"127.0.0.1:7200\"; };\n"
                               "averaging = { listen = \"127.0.0.1:7300\"; };\nmembership = { coordinator = \"x@h:1\"; };\n",
                     "15: membership.coordinator: must be \"<public key, 64 hex digits>@host:port\"");
        expect_error(base_end, "  idle_timeout = 30000;\n};\naveraging = { listen = \"127.0.0.1:7300\"; };\n"
                               "membership = {\n  coordinator = \"" K1 "@h:1\";\n};\n",
                     "14: membership: needs a pipeline section");
        expect_error(base_end, "  idle_timeout = 30000;\n};\npipeline = { listen = \"127.0.0.1:7200\";\n"
                               "  clusters = ( { nodes = [ \"" K1 "@h:1\" ]; stages = [ 0, 6 ]; } ); };\n"
                               "averaging = { listen = \"127.0.0.1:7300\"; };\n"
                               "membership = {\n  coordinator = \"" K1 "@h:1\";\n};\n",
                     "14: pipeline.clusters: not with membership");
        expect_error(base_end, "  idle_timeout = 30000;\n};\npipeline = { listen = \"127.0.0.1:7200\"; };\n"
                               "averaging = { listen = \"127.0.0.1:7300\";\n"
                               "  members = [ \"" K1 "@a:1\", \"" K2 "@b:2\" ]; };\n"
                               "membership = {\n  coordinator = \"" K1 "@h:1\";\n};\n",
                     "15: averaging.members: not with membership");
}

/* membership: sections from line 13, the memory setting on line 17 */
static const char *membership_fmt =
        "  idle_timeout = 30000;\n};\n"
        "pipeline = { listen = \"%s\"; };\n"                           /* 13 */
        "averaging = { listen = \"%s\"; };\n"                          /* 14 */
        "membership = {\n"                                            /* 15 */
        "  coordinator = \"" K1 "@10.0.0.1:7400\";\n"                 /* 16 */
        "  %s\n};\n";                                                 /* 17 */

static void expect_membership_error(const char *pipeline, const char *averaging, const char *setting,
                                    const char *want) {
        char body[1024];
        snprintf(body, sizeof body, membership_fmt, pipeline, averaging, setting);
        expect_error(base_end, body, want);
}

static uint64_t membership_memory(const char *setting) {
        char body[1024], path[64];
        Config c;
        Diag d = {};
        snprintf(body, sizeof body, membership_fmt, "127.0.0.1:7200", "127.0.0.1:7300", setting);
        cr_assert_eq(load_variant(base_end, body, &c, &d, path), 0, "%s: %s", setting, d.text);
        uint64_t v = c.membership.memory;
        config_free(&c);
        return v;
}

/* membership.memory: 0 (what the machine has), or what a nodes file takes:
 * digits, an optional fraction, one K, M, G or T, from 1K to 1024T (a
 * test's tiny model offers 360K). */
Test(config, sizes_are_strict_and_bounded_alike) {
        cr_assert_eq(membership_memory(""), 0);
        cr_assert_eq(membership_memory("memory = 0;"), 0);
        cr_assert_eq(membership_memory("memory = \"1.5G\";"), 3ull << 29);
        cr_assert_eq(membership_memory("memory = 1048576;"), 1ull << 20);
        cr_assert_eq(membership_memory("memory = \"360K\";"), 360ull << 10);
        cr_assert_eq(membership_memory("memory = 1024;"), 1024);
        cr_assert_eq(membership_memory("memory = \"1024T\";"), 1ull << 50);
        cr_assert_eq(membership_memory("memory = 1125899906842624L;"), 1ull << 50);
        const char *malformed[] = { "\" 2G\"", "\"2G \"", "\"2GB\"", "\"2GiB\"", "\"2g\"", "\"0x10G\"", "\"1e3M\"",
                                    "\"+2G\"", "\"-2G\"", "\"2.G\"", "\".5G\"", "\"G\"", "\"\"", "\"inf\"", "1.5" };
        char setting[64];
        for (size_t i = 0; i < sizeof malformed / sizeof malformed[0]; i++) {
                snprintf(setting, sizeof setting, "memory = %s;", malformed[i]);
                expect_membership_error("127.0.0.1:7200", "127.0.0.1:7300", setting,
                                        "17: membership.memory: must be bytes, or a size like");
        }
        const char *outside[] = { "\"0.0001K\"", "1", "1023", "\"1025T\"", "\"99999999999999999999T\"", "-1",
                                  "1125899906842625L" };
        for (size_t i = 0; i < sizeof outside / sizeof outside[0]; i++) {
                snprintf(setting, sizeof setting, "memory = %s;", outside[i]);
                expect_membership_error("127.0.0.1:7200", "127.0.0.1:7300", setting,
                                        "17: membership.memory: must be between 1K and 1024T");
        }
        /* the one parser of a nodes file's memory too */
        uint64_t v;
        cr_assert_eq(nodes_file_parse_size("512M", &v), 0);
        cr_assert_eq(v, 512ull << 20);
        cr_assert_eq(nodes_file_parse_size("2GB", &v), -EINVAL);
        cr_assert_eq(nodes_file_parse_size(" 2G", &v), -EINVAL);
        cr_assert_eq(nodes_file_parse_size("0x10G", &v), -EINVAL);
        cr_assert_eq(nodes_file_parse_size("0.0001K", &v), -ERANGE);
        cr_assert_eq(nodes_file_parse_size("1", &v), -ERANGE);
}

/* Membership hands pipeline.listen and averaging.listen to the other
 * nodes: a wildcard address, which reaches nobody, is refused by the file's
 * check (it was refused only at start, with no line). */
Test(config, membership_refuses_wildcard_listen_addresses) {
        expect_membership_error("0.0.0.0:7200", "0.0.0.0:7300", "",
                                "13: pipeline.listen: membership hands this address to the other nodes: a wildcard "
                                "address (\"0.0.0.0:7200\") does not reach this one");
        expect_membership_error("127.0.0.1:7200", "[::]:7300", "", "14: averaging.listen: membership hands");
        expect_membership_error("127.0.0.1:7200", "0:7300", "", "14: averaging.listen: membership hands");
        expect_membership_error("[0::0]:7200", "127.0.0.1:7300", "", "13: pipeline.listen: membership hands");
        cr_assert_eq(membership_memory("behind_nat = true;"), 0, "other addresses pass");
        /* without membership, a stage may listen on every address */
        Config c;
        char path[64], body[1024];
        Diag d = {};
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\npipeline = { listen = \"0.0.0.0:7200\";\n"
                 "  clusters = ( { nodes = [ \"" K1 "@h:1\", \"" K2 "@h:2\" ]; stages = [ 0, 3, 6 ]; } ); };\n");
        cr_assert_eq(load_variant(base_end, body, &c, &d, path), 0, "%s", d.text);
        config_free(&c);
}

Test(config, idle_checkpoint_and_control_socket) {
        char path[64];
        Config c;
        Diag d = {};

        /* defaults, as ravnestd.conf(5) documents them */
        cr_assert_eq(load_variant("threads = 2;\n", "threads = 2;\n", &c, &d, path), 0, "%s", d.text);
        cr_assert_str_eq(c.control_socket, "/run/ravnest/control");
        cr_assert(c.idle.enabled);
        cr_assert_float_eq(c.idle.max_other_cpu, 0.5, 1e-9);
        cr_assert_float_eq(c.idle.max_pressure, 0.2, 1e-9);
        cr_assert_eq(c.idle.busy_ms, 1000);
        cr_assert_eq(c.idle.resume_ms, 60000);
        cr_assert(!c.idle.run_on_battery);
        cr_assert(c.idle.use_logind);
        cr_assert_float_eq(c.idle.max_duty, 1.0, 1e-9);
        cr_assert_eq(c.checkpoint.interval_s, 600);
        cr_assert(c.checkpoint.load);
        config_free(&c);

        cr_assert_eq(load_variant("threads = 2;\n",
                                  "threads = 2;\ncontrol_socket = \"\";\n"
                                  "idle = { enabled = false; max_other_cpu = 1.5; max_pressure = 0.1; busy_time = 0.5;\n"
                                  "  resume_after = 3; run_on_battery = true; use_logind = false; max_duty = 0.25; };\n"
                                  "checkpoint = { interval = 0; load = false; };\n",
                                  &c, &d, path),
                     0, "%s", d.text);
        cr_assert_str_eq(c.control_socket, "");
        cr_assert(!c.idle.enabled);
        cr_assert_float_eq(c.idle.max_other_cpu, 1.5, 1e-9);
        cr_assert_eq(c.idle.busy_ms, 500);
        cr_assert_eq(c.idle.resume_ms, 3000);
        cr_assert(c.idle.run_on_battery);
        cr_assert(!c.idle.use_logind);
        cr_assert_float_eq(c.idle.max_duty, 0.25, 1e-9);
        cr_assert_eq(c.checkpoint.interval_s, 0);
        cr_assert(!c.checkpoint.load);
        config_free(&c);

        expect_error("threads = 2;\n", "threads = 2;\nidle = { max_duty = 0.0; };\n", "3: idle.max_duty");
        expect_error("threads = 2;\n", "threads = 2;\nidle = { idle_for = 3; };\n", "3: idle.idle_for: unknown");
        expect_error("threads = 2;\n", "threads = 2;\ncheckpoint = { interval = -1; };\n", "3: checkpoint.interval");
        expect_error("threads = 2;\n", "threads = 2;\ncontrol_socket = \"run/x\";\n", "3: control_socket");
}

Test(config, metrics) {
        char path[64];
        Config c;
        Diag d = {};

        /* off unless the group is set */
        cr_assert_eq(load_variant("threads = 2;\n", "threads = 2;\n", &c, &d, path), 0, "%s", d.text);
        cr_assert(!c.metrics.enabled);
        cr_assert_eq(c.metrics.max_connections, 16);
        cr_assert_eq(c.metrics.timeout_s, 10);
        config_free(&c);

        cr_assert_eq(load_variant("threads = 2;\n", "threads = 2;\nmetrics = { listen = \"127.0.0.1:9464\"; };\n",
                                  &c, &d, path), 0, "%s", d.text);
        cr_assert(c.metrics.enabled);
        cr_assert_str_eq(c.metrics.listen.host, "127.0.0.1");
        cr_assert_eq(c.metrics.listen.port, 9464);
        cr_assert_eq(c.metrics.max_connections, 16);
        config_free(&c);

        cr_assert_eq(load_variant("threads = 2;\n",
                                  "threads = 2;\nmetrics = {\n  listen = \"[::1]:9000\";\n  max_connections = 4;\n"
                                  "  timeout = 2;\n};\n", &c, &d, path), 0, "%s", d.text);
        cr_assert_str_eq(c.metrics.listen.host, "::1");
        cr_assert_eq(c.metrics.max_connections, 4);
        cr_assert_eq(c.metrics.timeout_s, 2);
        config_free(&c);

        expect_error("threads = 2;\n", "threads = 2;\nmetrics = { };\n", "3: metrics.listen: missing");
        expect_error("threads = 2;\n", "threads = 2;\nmetrics = {\n  listen = \"127.0.0.1\";\n};\n",
                     "4: metrics.listen: must be \"host:port\"");
        expect_error("threads = 2;\n", "threads = 2;\nmetrics = {\n  listen = 9464;\n};\n", "4: metrics.listen: must be a string");
        expect_error("threads = 2;\n", "threads = 2;\nmetrics = { listen = \"127.0.0.1:1\";\n  max_connections = 0; };\n",
                     "4: metrics.max_connections: must be an integer in [1, 1024]");
        expect_error("threads = 2;\n", "threads = 2;\nmetrics = { listen = \"127.0.0.1:1\";\n  port = 1; };\n",
                     "4: metrics.port: unknown");
        expect_error("threads = 2;\n", "threads = 2;\nmetrics = \"127.0.0.1:1\";\n", "3: metrics");
}

Test(config, relay) {
        char path[64];
        Config c;
        Diag d = {};

        cr_assert_eq(load_variant("threads = 2;\n", "threads = 2;\n", &c, &d, path), 0, "%s", d.text);
        cr_assert(!c.relay_server.enabled);
        config_free(&c);

        cr_assert_eq(load_variant("threads = 2;\n", "threads = 2;\nrelay = { listen = \"0.0.0.0:7400\"; };\n", &c, &d,
                                  path), 0, "%s", d.text);
        cr_assert(c.relay_server.enabled);
        cr_assert_eq(c.relay_server.listen.port, 7400);
        cr_assert_eq(c.relay_server.max_links, 64);
        cr_assert_eq(c.relay_server.max_links_per_addr, 32);
        config_free(&c);

        cr_assert_eq(load_variant("threads = 2;\n",
                                  "threads = 2;\nrelay = { listen = \"0.0.0.0:7400\"; max_links = 8;\n"
                                  "  max_links_per_address = 3; };\n", &c, &d, path), 0, "%s", d.text);
        cr_assert_eq(c.relay_server.max_links, 8);
        cr_assert_eq(c.relay_server.max_links_per_addr, 3);
        config_free(&c);

        expect_error("threads = 2;\n", "threads = 2;\nrelay = { listen = \"0.0.0.0:7400\";\n  max_links_per_address = 0; };\n",
                     "4: relay.max_links_per_address: must be an integer in [1, 65536]");
}

/* One run lists every error, one line each, not just the first. */
/* d says each of where ("line: setting...", after path) and nothing else:
 * one line each. */
static void expect_exactly(const Diag *d, const char *path, const char *const *where, int n) {
        char want[256];
        for (int i = 0; i < n; i++) {
                snprintf(want, sizeof want, "%s:%s", path, where[i]);
                cr_expect(strstr(d->text, want), "\"%s\" missing from:\n%s", want, d->text);
        }
        int lines = 1;
        for (const char *p = d->text; *p; p++)
                lines += *p == '\n';
        cr_expect_eq(lines, n, "%s", d->text);
}

Test(config, every_error_is_reported) {
        char path[64];
        Config c;
        Diag d = {};
        int r = load_variant("threads = 2;\n",
                             "threads = 300;\nidle = { max_duty = 2.0; };\ncheckpoint = { every = 5; };\n", &c, &d, path);
        cr_assert_lt(r, 0);
        expect_exactly(&d, path, (const char *[]){ "2: threads", "3: idle.max_duty", "4: checkpoint.every" }, 3);
}

/* An integer too wide for how it is written is not the end of the check:
 * the other sections' errors come after it, and the misread value's own
 * line is not reported a second time (threads read as 1215752191). */
Test(config, a_wide_integer_does_not_hide_the_other_errors) {
        char path[64];
        Config c;
        Diag d = {};
        int r = load_variant("threads = 2;\n", "threads = 99999999999;\nidle = { max_duty = 2.0; };\nbogus = 1;\n", &c,
                             &d, path);
        cr_assert_eq(r, -ERANGE, "%d: %s", r, d.text);
        expect_exactly(&d, path, (const char *[]){ "2: threads: 99999999999 is read as a 32-bit integer",
                                                   "3: idle.max_duty", "4: bogus: unknown setting" }, 3);
}

/* The same in a file whose path holds a colon (the other errors were
 * taken for the wide integer's line and left out). */
Test(config, a_wide_integer_does_not_hide_the_other_errors_in_a_path_with_a_colon) {
        char dir[] = "/tmp/ravnest-test-a:b-XXXXXX", path[96];
        Config c;
        Diag d = {};
        cr_assert_not_null(mkdtemp(dir));
        snprintf(path, sizeof path, "%s/x.conf", dir);
        FILE *f = fopen(path, "w");
        cr_assert(f);
        fputs("threads = 99999999999;\nbogus = 1;\n", f);
        fclose(f);
        int r = config_load(path, &c, &d);
        unlink(path);
        rmdir(dir);
        cr_assert_eq(r, -ERANGE, "%d: %s", r, d.text);
        cr_expect(strstr(d.text, ":1: threads: 99999999999 is read as"), "%s", d.text);
        cr_expect(strstr(d.text, ":2: bogus: unknown setting"), "%s", d.text);
}

Test(config, averaging_outer_and_fragments) {
        const char *line = "  listen = \"127.0.0.1:7100\";\n  members = [ \"" K1 "@127.0.0.1:7100\", \"" K2 "@127.0.0.1:7101\" ];\n";
        char body[1024], path[64];
        Config c;
        Diag d = {};
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  outer = { lr = 0.5; };\n  fragments = 4;\n};\n",
                 line);
        cr_assert_eq(load_variant(base_end, body, &c, &d, path), 0, "%s", d.text);
        cr_assert(c.averaging.outer && c.averaging.outer_nesterov);
        cr_assert_float_eq(c.averaging.outer_lr, 0.5, 1e-12);
        cr_assert_float_eq(c.averaging.outer_momentum, 0.9, 1e-12);
        cr_assert_eq(c.averaging.fragments, 4);
        cr_assert_eq(c.averaging.group_size, COLL_MAX_MEMBERS, "the default");
        config_free(&c);
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  outer = { momentum = 1.5; };\n};\n", line);
        expect_error(base_end, body, "16: averaging.outer.momentum: ");
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  outer = { step = 1; };\n};\n", line);
        expect_error(base_end, body, "16: averaging.outer.step: unknown setting");
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  fragments = 0;\n};\n", line);
        expect_error(base_end, body, "16: averaging.fragments: ");
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  group_size = 65;\n};\n", line);
        expect_error(base_end, body, "16: averaging.group_size: ");
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  method = \"moshpit\";\n  group_size = 8;\n};\n",
                 line);
        expect_error(base_end, body, "17: averaging.group_size: only used with method = \"ring\"");
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  method = \"moshpit\";\n  fragments = 2;\n};\n",
                 line);
        expect_error(base_end, body, "17: averaging.fragments: only used with method = \"ring\"");
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\naveraging = {\n%s  method = \"gossip\";\n  outer = { };\n};\n",
                 line);
        expect_error(base_end, body, "17: averaging.outer: only used with method = \"ring\" or \"moshpit\"");
}

/* A node that accepts no connections (behind NAT) is its key alone, in the
 * pipeline's clusters and the averaging members; two of them cannot link,
 * so a plan that needs such a link is refused (file, line, setting). */
Test(config, nodes_behind_nat) {
        char path[64], body[1024];
        Config c;
        Diag d = {};

        snprintf(body, sizeof body, "%saveraging = {\n  listen = \"127.0.0.1:1\";\n  members = [ \"" K1 "@a:1\", \"" K2
                 "\" ];\n};\n", base_end);
        cr_assert_eq(load_variant(base_end, body, &c, &d, path), 0, "%s", d.text);
        cr_assert(!c.averaging.members[0].no_accept && c.averaging.members[1].no_accept);
        cr_assert_eq(c.averaging.members[1].address.port, 0);
        config_free(&c);

        expect_error(base_end, "  idle_timeout = 30000;\n};\naveraging = {\n  listen = \"127.0.0.1:1\";\n  members = [ \"" K1
                               "\",\n \"" K2 "@b:2\", \"" SECRET_HEX "\" ];\n};\n",
                     "16: averaging.members.[2]: members 1 and 3 both accept no connections");
        const char *pipe = "  idle_timeout = 30000;\n};\npipeline = { listen = \"127.0.0.1:7200\";\n"
                           "  clusters = ( { nodes = [ \"" K1 "@h:1\", \"" K2 "\", \"" SECRET_HEX "\" ];\n"
                           "  stages = [ 0, 2, 4, 6 ]; } ); };\n";
        expect_error(base_end, pipe, "14: pipeline.clusters.[0].nodes.[2]: stages 2 and 3 both accept no connections");
        expect_error(base_end, "  idle_timeout = 30000;\n};\npipeline = { listen = \"127.0.0.1:7200\"; };\n"
                               "averaging = { listen = \"127.0.0.1:7300\"; };\nmembership = { coordinator = \"" K1 "\"; };\n",
                     "15: membership.coordinator: must be \"<public key, 64 hex digits>@host:port\", got");

        expect_error(base_end, "  idle_timeout = 30000;\n};\npipeline = { listen = \"127.0.0.1:7200\"; };\n"
                               "averaging = { listen = \"127.0.0.1:7300\"; };\nmembership = { coordinator = \"" K1
                               "@h:1\";\n  coordinate = true; behind_nat = true; };\n",
                     "16: membership.behind_nat: not with coordinate = true");

        /* with a pipeline, members that hold different layers may both lack one */
        snprintf(body, sizeof body, "  idle_timeout = 30000;\n};\npipeline = { listen = \"127.0.0.1:7200\";\n"
                 "  clusters = ( { nodes = [ \"" K1 "@h:1\", \"" K2 "\" ]; stages = [ 0, 3, 6 ]; } ); };\n"
                 "averaging = { listen = \"127.0.0.1:7300\";\n  members = [ \"" K1 "@h:2\", \"" K2 "\", \"" SECRET_HEX
                 "\" ]; };\n");
        cr_assert_eq(load_variant(base_end, body, &c, &d, path), 0, "%s", d.text);
        cr_assert(c.pipeline.clusters[0].nodes[1].no_accept && !c.pipeline.clusters[0].nodes[0].no_accept);
        config_free(&c);
}

/* The one rule for who dials: the node that accepts nothing, else the first. */
Test(config, who_dials) {
        cr_assert(net_dials(true, true, true) && !net_dials(true, true, false));
        cr_assert(net_dials(false, true, false) && net_dials(false, true, true));
        cr_assert(!net_dials(true, false, true) && !net_dials(true, false, false));
        cr_assert(!net_dials(false, false, true) && !net_dials(false, false, false));
}

/* A pipeline section with settings inserted on line 13. */
static const char pipeline_fmt[] =
        "  idle_timeout = 30000;\n};\npipeline = { listen = \"127.0.0.1:7200\";%s\n"
        "  clusters = ( { nodes = [ \"" K1 "@h:1\", \"" K2 "@h:2\" ]; stages = [ 0, 3, 6 ]; } ); };\n";

static void load_pipeline(const char *settings, Config *c) {
        char path[64], body[1024];
        Diag d = {};
        snprintf(body, sizeof body, pipeline_fmt, settings);
        cr_assert_eq(load_variant(base_end, body, c, &d, path), 0, "%s", d.text);
}

static void expect_pipeline_error(const char *settings, const char *want) {
        char body[1024];
        snprintf(body, sizeof body, pipeline_fmt, settings);
        expect_error(base_end, body, want);
}

Test(config, weight_prediction) {
        Config c;
        load_pipeline("", &c);
        cr_assert(c.pipeline.weight_prediction, "on by default");
        config_free(&c);
        load_pipeline(" weight_prediction = false;", &c);
        cr_assert(!c.pipeline.weight_prediction);
        config_free(&c);
        expect_pipeline_error(" weight_prediction = 1;", "13: pipeline.weight_prediction: must be");
}

Test(config, synchronous_start) {
        Config c;
        load_pipeline("", &c);
        cr_assert_eq(c.pipeline.synchronous_start, -1, "twice the job's warm-up by default");
        config_free(&c);
        load_pipeline(" synchronous_start = 0;", &c);
        cr_assert_eq(c.pipeline.synchronous_start, 0);
        config_free(&c);
        expect_pipeline_error(" synchronous_start = 1099511627776;",
                              "13: pipeline.synchronous_start: 1099511627776 is read as a 32-bit integer: write "
                              "1099511627776L");
        load_pipeline(" synchronous_start = 1099511627776L;", &c);
        cr_assert_eq(c.pipeline.synchronous_start, 1ll << 40);
        config_free(&c);
        expect_pipeline_error(" synchronous_start = 1099511627777L;", "13: pipeline.synchronous_start: ");
        expect_pipeline_error(" synchronous_start = -5;", "13: pipeline.synchronous_start: ");
        expect_pipeline_error(" synchronous_start = \"auto\";", "13: pipeline.synchronous_start: ");
}

/* Two clusters of a pipeline from line 15, each of two nodes. */
static const char clusters_fmt[] =
        "  idle_timeout = 30000;\n};\npipeline = { listen = \"127.0.0.1:7200\";\n  clusters = (\n" /* 13-14 */
        "    { nodes = [ %s ]; stages = [ 0, 3, 6 ]; },\n"                                        /* 15 */
        "    { nodes = [ %s ]; stages = [ 0, 2, 6 ]; } ); };\n";                                  /* 16 */

static void expect_clusters_error(const char *first, const char *second, const char *want) {
        char body[1024];
        snprintf(body, sizeof body, clusters_fmt, first, second);
        expect_error(base_end, body, want);
}

/* A node holds one stage of one cluster: a key twice in the clusters (the
 * node would wait for itself) is refused as averaging.members refuses it. */
Test(config, a_node_in_two_places_of_the_pipeline_is_refused) {
        const char *k3 = "\"" SECRET_HEX "@h:3\"", *k4 = "\"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef@h:4\"";
        char first[256], second[256], body[1024], path[64];
        Config c;
        Diag d = {};

        snprintf(first, sizeof first, "\"" K1 "@h:1\", \"" K2 "@h:2\"");
        snprintf(second, sizeof second, "%s, %s", k3, k4);
        snprintf(body, sizeof body, clusters_fmt, first, second);
        cr_assert_eq(load_variant(base_end, body, &c, &d, path), 0, "%s", d.text);
        cr_assert_eq(c.pipeline.n_clusters, 2);
        config_free(&c);

        expect_clusters_error("\"" K1 "@h:1\", \"" K1 "@h:2\"", second,
                              "15: pipeline.clusters.[0].nodes.[1]: the same key as stage 1 of cluster 1");
        snprintf(second, sizeof second, "%s, \"" K1 "@h:4\"", k3);
        expect_clusters_error(first, second, "16: pipeline.clusters.[1].nodes.[1]: the same key as stage 1 of cluster 1");
        /* a node that accepts no connections is its key alone */
        snprintf(second, sizeof second, "\"" K2 "\", %s", k3);
        expect_clusters_error(first, second, "16: pipeline.clusters.[1].nodes.[0]: the same key as stage 2 of cluster 1");
}

/* A pipeline that does not cut the job's model names the line of the
 * cluster's stages (the fashion-mnist-mlp job has 6 layers). */
Test(config, a_pipeline_that_misfits_the_job_names_the_line) {
        Job job;
        Config c;
        char want[PATH_MAX + 256];
        Diag d = {};
        cr_assert_eq(job_load(SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job", &job, &d), 0, "%s", d.text);
        cr_assert_eq(job.model.n_layers, 6);
        load_pipeline("", &c);
        cr_assert_eq(config_check_job(&c, &job, &d), 0, "%s", d.text);
        c.pipeline.clusters[0].bounds[2] = 5; /* as if stages = [ 0, 3, 5 ] */
        cr_assert_eq(config_check_job(&c, &job, &d), -EINVAL);
        snprintf(want, sizeof want, "%s:14: pipeline.clusters.[0].stages: cluster 1 cuts 5 layers, job %s has 6", c.path,
                 job.name);
        cr_assert(strstr(d.text, want), "%s", d.text);
        c.pipeline.clusters[0].bounds[2] = 6;
        c.pipeline.clusters[0].bounds[1] = 1; /* the flatten alone: nothing to average */
        cr_assert_eq(config_check_job(&c, &job, &d), -EINVAL);
        snprintf(want, sizeof want, "%s:14: pipeline.clusters.[0].stages: stage 1 of cluster 1 (layers 0-0", c.path);
        cr_assert(strstr(d.text, want), "%s", d.text);
        config_free(&c);
}

/* Numbers on the command line are decimal, as integers are: no hex, inf or
 * nan, and the whole argument. */
Test(option, a_number_is_decimal_and_whole) {
        const char *good[] = { "2", "0.25", "-0.5", "+3", ".5", "5.", "1e-3", "2.5E2" };
        const double want[] = { 2, 0.25, -0.5, 3, 0.5, 5, 1e-3, 250 };
        double v;
        for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
                cr_assert_eq(option_double("x", good[i], -10, 1000, &v), 0, "%s", good[i]);
                cr_assert_float_eq(v, want[i], 1e-12, "%s", good[i]);
        }
        const char *bad[] = { "0x10", "0X1p4", "inf", "nan", "infinity", " 1", "1 ", "", ".", "1e", "e3", "1e+", "--1",
                              "1,5", "1..2" };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                v = 7;
                cr_assert_eq(option_double("x", bad[i], -10, 1000, &v), -EINVAL, "%s", bad[i]);
                cr_assert_eq(v, 7, "untouched");
        }
        cr_assert_eq(option_double("x", NULL, -10, 1000, &v), -EINVAL);
        cr_assert_eq(option_double("x", "1e999", -10, 1000, &v), -ERANGE, "not finite");
        cr_assert_eq(option_double("x", "1001", -10, 1000, &v), -ERANGE);
        long long n;
        cr_assert_eq(option_int("x", "0x10", 0, 100, &n), -EINVAL, "the same rule for integers");
}
