/* conf/config.c */
#include "config.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster/plan.h"
#include "collective/averager.h"
#include "collective/coll-wire.h"
#include "collective/topology.h"
#include "net/relay.h"
#include "conf.h"
#include "util/file.h"
#include "nodes-file.h"

static const char *const admission_names[] = { "secret", "allowlist", "both", NULL };
static const char *const backend_names[] = { "auto", "io_uring", "epoll", NULL }; /* NetBackendKind */

void config_defaults(Config *c) {
        *c = (Config){
                .state_directory = "/var/lib/ravnest",
                .control_socket = CONFIG_CONTROL_SOCKET,
                .checkpoint = { .interval_s = 600, .load = true },
                .job = JOBS_DIR "/fashion-mnist-mlp.job",
                .admission = CONFIG_ADMISSION_SECRET,
                .pipeline = {
                        .micro_batch = 32,
                        .staleness = 4,
                        .update_frequency = 1,
                        .weight_prediction = true,
                        .synchronous_start = -1,
                        .neighbour_timeout_s = 600,
                },
                .membership = {
                        .probe_ms = 300,
                        .min_nodes = 2,
                        .settle_ms = 2000,
                        .heartbeat_ms = 1000,
                        .deadline_ms = 10000,
                        .handover_timeout_ms = 10000,
                        .train = true,
                },
                .metrics = {
                        .max_connections = 16,
                        .timeout_s = 10,
                },
                .averaging = {
                        .interval_ms = 5000,
                        .join_timeout_ms = 10000,
                        .round_timeout_ms = 30000,
                        .topology = GOSSIP_ALT_EXP_RING,
                        .take_parameters = true,
                },
        };
        net_config_defaults(&c->net);
        idle_settings_default(&c->idle);
}

ConfigCluster *config_clusters_free(ConfigCluster *clusters, unsigned n) {
        for (unsigned k = 0; clusters && k < n; k++)
                free(clusters[k].nodes);
        free(clusters);
        return NULL;
}

void config_free(Config *c) {
        if (!c)
                return;
        c->peers = mfree(c->peers);
        c->allowed = mfree(c->allowed);
        c->averaging.members = mfree(c->averaging.members);
        c->pipeline.clusters = config_clusters_free(c->pipeline.clusters, c->pipeline.n_clusters);
        c->pipeline.n_clusters = 0;
        c->averaging.n_members = 0;
        c->n_peers = c->n_allowed = 0;
        sodium_memzero(c->secret, sizeof c->secret);
        c->has_secret = false;
}

static config_setting_t *member(const config_setting_t *g, const char *name) {
        return g ? config_setting_get_member(g, name) : NULL;
}

/* network.relay is set: two nodes that accept no connections link through it. */
static bool relay_set(const config_setting_t *root) {
        return member(member(root, "network"), "relay") != NULL;
}

/* A string that, when set, must be an absolute path. */
static int get_path(const config_setting_t *g, const char *name, char *buf, size_t len, Diag *d) {
        int r;

        if (!member(g, name)) /* keep the default in buf */
                return 0;
        if ((r = conf_get_string(g, name, true, NULL, buf, len, d)) < 0)
                return r;
        if (buf[0] != '/')
                return conf_error(member(g, name), NULL, -EINVAL, d, "must be an absolute path, got \"%s\"", buf);
        return 0;
}

/* The job to train, when the file names one: an absolute path to a file
 * the daemon can read (job_load() checks what is in it when training
 * starts), so a missing job names this file and line. */
static int get_job(const config_setting_t *root, char *buf, size_t len, Diag *d) {
        const config_setting_t *s = member(root, "job");
        struct stat st;
        int r;

        if (!s || (r = get_path(root, "job", buf, len, d)) < 0)
                return s ? r : 0;
        Diag why = {};
        _cleanup_(closep) int fd = file_open_regular(buf, 0, &st, &why);
        if (fd < 0)
                return conf_error(s, NULL, fd, d, "%s", why.text);
        return 0;
}

/* A string from names (NULL-terminated); *ret is its index, and the default. */
static int get_choice(const config_setting_t *g, const char *name, const char *const *names, int *ret, Diag *d) {
        char v[64], known[128] = "";
        int r = conf_get_string(g, name, false, names[*ret], v, sizeof v, d);
        if (r < 0)
                return r;
        for (int i = 0; names[i]; i++) {
                if (strcmp(v, names[i]) == 0) {
                        *ret = i;
                        return 0;
                }
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", names[i]);
        }
        return conf_error(member(g, name), NULL, -EINVAL, d, "unknown value \"%s\" (known: %s)", v, known);
}

/* A list ( ... ) or array [ ... ] of at most max strings; *ret NULL when absent. */
static int get_strings(const config_setting_t *g, const char *name, int max, config_setting_t **ret, Diag *d) {
        config_setting_t *s = member(g, name);
        *ret = s;
        if (!s)
                return 0;
        if (!config_setting_is_array(s) && !config_setting_is_list(s))
                return conf_error(s, NULL, -EINVAL, d, "must be a list of strings [ \"...\", ... ]");
        if (config_setting_length(s) > max)
                return conf_error(s, NULL, -E2BIG, d, "more than %d entries", max);
        for (int i = 0; i < config_setting_length(s); i++) {
                const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
                if (config_setting_type(e) != CONFIG_TYPE_STRING)
                        return conf_error(e, NULL, -EINVAL, d, "must be a string");
        }
        return 0;
}

/* "auto" or a number of bytes. */
static int get_zerocopy(const config_setting_t *g, size_t *ret, Diag *d) {
        const config_setting_t *s = member(g, "zerocopy_threshold");
        long long v;
        int r;

        if (!s)
                return 0;
        if (config_setting_type(s) == CONFIG_TYPE_STRING && strcmp(config_setting_get_string(s), "auto") == 0) {
                *ret = NET_ZC_AUTO;
                return 0;
        }
        if (config_setting_type(s) != CONFIG_TYPE_INT && config_setting_type(s) != CONFIG_TYPE_INT64)
                return conf_error(s, NULL, -EINVAL, d, "must be \"auto\" or an integer in [0, %d]", 1 << 30);
        if ((r = conf_get_int(g, "zerocopy_threshold", false, 0, 1 << 30, 0, &v, d)) < 0)
                return r;
        *ret = (size_t)v;
        return 0;
}

/* "host:port" or "[IPv6]:port"; NULL, or what is wrong with it. */
static const char *parse_address(const char *text, ConfigAddress *ret) {
        static const char host_chars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-";
        const char *colon = strrchr(text, ':'), *host = text, *port;
        bool bracket = text[0] == '[';
        ConfigAddress a = {};
        struct in6_addr in6;
        size_t len;

        if (!colon)
                return "must be \"host:port\"";
        if (bracket && colon[-1] != ']')
                return "must be \"[IPv6 address]:port\"";
        if (bracket)
                host++;
        len = (size_t)(colon - host) - bracket;
        if (len == 0)
                return "must be \"host:port\"";
        if (len >= sizeof a.host)
                return "host name too long";
        memcpy(a.host, host, len);
        if (bracket && inet_pton(AF_INET6, a.host, &in6) != 1)
                return "not an IPv6 address in brackets";
        if (!bracket && strchr(a.host, ':'))
                return "IPv6 addresses go in brackets: \"[::1]:7000\"";
        if (!bracket && (strspn(a.host, host_chars) != len || a.host[0] == '-' || a.host[0] == '.'))
                return "not a host name or address";

        port = colon + 1;
        len = strlen(port);
        unsigned long p = len >= 1 && len <= 5 && strspn(port, "0123456789") == len ? strtoul(port, NULL, 10) : 0;
        if (p < 1 || p > 65535)
                return "port must be in [1, 65535]";
        a.port = (uint16_t)p;
        *ret = a;
        return NULL;
}

static int get_address(const config_setting_t *s, ConfigAddress *ret, Diag *d) {
        const char *text = config_setting_get_string(s), *why = parse_address(text, ret);
        return why ? conf_error(s, NULL, -EINVAL, d, "%s, got \"%s\"", why, text) : 0;
}

/* Only what the address says: a name other than localhost may resolve to
 * anything. (The transport checks the real address of every link too.) */
static bool address_is_loopback(const ConfigAddress *a) {
        struct in_addr in4;
        struct in6_addr in6;

        if (strcasecmp(a->host, "localhost") == 0)
                return true;
        if (inet_pton(AF_INET, a->host, &in4) == 1)
                return (ntohl(in4.s_addr) >> 24) == 127;
        if (inet_pton(AF_INET6, a->host, &in6) == 1)
                return IN6_IS_ADDR_LOOPBACK(&in6) || (IN6_IS_ADDR_V4MAPPED(&in6) && in6.s6_addr[12] == 127);
        return false;
}

/* 0.0.0.0 (in any form inet_aton() and so getaddrinfo() take: "0") or ::,
 * which a node listens on but no other node reaches it at. */
static bool address_is_wildcard(const ConfigAddress *a) {
        struct in_addr in4;
        struct in6_addr in6;

        if (inet_aton(a->host, &in4))
                return in4.s_addr == INADDR_ANY;
        return inet_pton(AF_INET6, a->host, &in6) == 1 && IN6_IS_ADDR_UNSPECIFIED(&in6);
}

/* 64 hex digits and an optional newline, in a file only its owner can read
 * (the same rule as the identity key, net/identity.c). */
static int load_secret(const config_setting_t *s, const char *path, uint8_t ret[HANDSHAKE_SECRET_SIZE], Diag *d) {
        char text[2 * HANDSHAKE_SECRET_SIZE + 3] = {};
        struct stat st;
        size_t bin;
        int r;

        Diag why = {};
        _cleanup_(closep) int fd = file_open_regular(path, 0, &st, &why);
        if (fd < 0)
                return conf_error(s, NULL, fd, d, "%s", why.text);
        if (st.st_mode & 077)
                return conf_error(s, NULL, -EPERM, d, "%s: readable by others (mode %04o): chmod 600 it", path,
                                  (unsigned)(st.st_mode & 07777));
        ssize_t n = read(fd, text, sizeof text - 1);
        if (n < 0) {
                r = -errno;
                return conf_error(s, NULL, r, d, "%s: cannot read: %s", path, strerror(-r));
        }
        if (n > 0 && text[n - 1] == '\n')
                n--;
        r = n == 2 * HANDSHAKE_SECRET_SIZE &&
            sodium_hex2bin(ret, HANDSHAKE_SECRET_SIZE, text, (size_t)n, NULL, &bin, NULL) == 0 &&
            bin == HANDSHAKE_SECRET_SIZE ? 0 : -EBADMSG;
        sodium_memzero(text, sizeof text);
        if (r < 0)
                return conf_error(s, NULL, r, d,
                                  "%s: must hold %d hex digits (make one with \"openssl rand -hex %d\")", path,
                                  2 * HANDSHAKE_SECRET_SIZE, HANDSHAKE_SECRET_SIZE);
        return 0;
}

static int parse_peers(const config_setting_t *list, Config *c, Diag *d) {
        int n = list ? config_setting_length(list) : 0;
        int r;

        if (n == 0)
                return 0;
        c->peers = calloc((size_t)n, sizeof *c->peers);
        if (!c->peers)
                return -ENOMEM;
        for (int i = 0; i < n; i++)
                if ((r = get_address(config_setting_get_elem(list, (unsigned)i), &c->peers[i], d)) < 0)
                        return r;
        c->n_peers = (size_t)n;
        return 0;
}

static int parse_allowed(const config_setting_t *list, Config *c, Diag *d) {
        int n = list ? config_setting_length(list) : 0;

        if (n == 0)
                return 0;
        c->allowed = calloc((size_t)n, sizeof *c->allowed);
        if (!c->allowed)
                return -ENOMEM;
        for (int i = 0; i < n; i++) {
                const config_setting_t *e = config_setting_get_elem(list, (unsigned)i);
                if (identity_from_hex(config_setting_get_string(e), c->allowed[i]) < 0)
                        return conf_error(e, NULL, -EINVAL, d,
                                          "must be an Ed25519 public key in %d hex digits, got \"%s\"",
                                          2 * IDENTITY_PK_SIZE, config_setting_get_string(e));
        }
        c->n_allowed = (size_t)n;
        return 0;
}

/* Plaintext is for benchmarks on one machine: every end must be loopback. */
static int check_plaintext(const config_setting_t *g, const Config *c, Diag *d) {
        const char *what = "listen address", *host = NULL;

        if (!c->net.plaintext)
                return 0;
        if (c->listen.port && !address_is_loopback(&c->listen))
                host = c->listen.host;
        for (size_t i = 0; !host && i < c->n_peers; i++)
                if (!address_is_loopback(&c->peers[i])) {
                        what = "peer";
                        host = c->peers[i].host;
                }
        if (host)
                return conf_error(member(g, "plaintext"), NULL, -EINVAL, d,
                                  "refused: %s %s is not loopback (plaintext is for benchmarks on one machine)",
                                  what, host);
        return 0;
}

/* The secret file and the allowlist, as admission asks. A node that neither
 * listens nor has peers needs neither, so the sample file parses as shipped. */
static int check_admission(const config_setting_t *g, const config_setting_t *allowed, const Config *c, Diag *d) {
        bool want_secret = c->admission != CONFIG_ADMISSION_ALLOWLIST;
        bool want_list = c->admission != CONFIG_ADMISSION_SECRET;
        bool networked = c->listen.port || c->n_peers || c->averaging.enabled || c->pipeline.enabled ||
                         c->membership.enabled;
        const char *mode = admission_names[c->admission];

        if (c->secret_file[0] && !want_secret)
                return conf_error(member(g, "secret_file"), NULL, -EINVAL, d,
                                  "only used with admission = \"secret\" or \"both\"");
        if (allowed && !want_list)
                return conf_error(allowed, NULL, -EINVAL, d, "only used with admission = \"allowlist\" or \"both\"");
        if (networked && want_secret && !c->secret_file[0])
                return conf_error(g, "secret_file", -EINVAL, d, "missing (required with admission = \"%s\")", mode);
        if (networked && want_list && !allowed)
                return conf_error(g, "allowed_peers", -EINVAL, d, "missing (required with admission = \"%s\")", mode);
        if (networked && want_list && config_setting_length(allowed) == 0)
                return conf_error(allowed, NULL, -EINVAL, d, "empty (admission = \"%s\" needs a key)", mode);
        return 0;
}

static int parse_network(const config_setting_t *root, Config *c, Diag *d) {
        static const char *const keys[] = {
                "listen", "peers", "admission", "secret_file", "allowed_peers", "plaintext", "io_backend",
                "zerocopy_threshold", "max_frame", "max_tensor", "max_queued", "max_links",
                "max_links_per_address", "handshake_timeout", "idle_timeout", "stall_timeout", "receive_pool",
                "max_receive", "relay", "connections", NULL,
        };
        NetConfig *n = &c->net;
        config_setting_t *g, *s, *peers, *allowed;
        long long frame, tensor, queued, links, per_addr, hs, idle, stall, pool, receive, lanes;
        const long long max_bytes = 1LL << 36;
        int admission = c->admission, backend = n->backend, r;

        if ((r = conf_get_group(root, "network", false, false, &g, d)) < 0)
                return r;
        if (!g) /* a node with links must say whom it admits */
                return c->averaging.enabled || c->pipeline.enabled || c->membership.enabled
                               ? conf_error(root, "network", -EINVAL, d,
                                            "missing: a node that averages, runs a stage or joins a swarm admits "
                                            "peers by network.secret_file or network.allowed_peers")
                               : 0;
        if ((r = conf_check_keys(g, keys, d)) < 0 ||
            (r = get_strings(g, "peers", CONFIG_MAX_PEERS, &peers, d)) < 0 ||
            (r = get_choice(g, "admission", admission_names, &admission, d)) < 0 ||
            (r = get_path(g, "secret_file", c->secret_file, sizeof c->secret_file, d)) < 0 ||
            (r = get_strings(g, "allowed_peers", CONFIG_MAX_ALLOWED, &allowed, d)) < 0 ||
            (r = conf_get_bool(g, "plaintext", n->plaintext, &n->plaintext, d)) < 0 ||
            (r = get_choice(g, "io_backend", backend_names, &backend, d)) < 0 ||
            (r = get_zerocopy(g, &n->zc_threshold, d)) < 0 ||
            (r = conf_get_int(g, "max_frame", false, 4096, 64 << 20, n->limits.max_payload, &frame, d)) < 0 ||
            (r = conf_get_int(g, "max_tensor", false, 1, max_bytes, n->limits.max_tensor_bytes, &tensor, d)) < 0 ||
            (r = conf_get_int(g, "max_queued", false, 4096, max_bytes, n->max_queued, &queued, d)) < 0 ||
            (r = conf_get_int(g, "max_links", false, 1, 65536, n->max_links, &links, d)) < 0 ||
            (r = conf_get_int(g, "max_links_per_address", false, 1, 65536, n->max_links_per_addr, &per_addr,
                              d)) < 0 ||
            (r = conf_get_int(g, "handshake_timeout", false, 100, 600000, n->handshake_timeout_ms, &hs, d)) < 0 ||
            (r = conf_get_int(g, "idle_timeout", false, 0, 86400000, n->idle_timeout_ms, &idle, d)) < 0 ||
            (r = conf_get_int(g, "stall_timeout", false, 0, 3600000, n->stall_timeout_ms, &stall, d)) < 0 ||
            (r = conf_get_int(g, "receive_pool", false, 0, 1 << 30, (long long)n->pool_bytes, &pool, d)) < 0 ||
            (r = conf_get_int(g, "max_receive", false, 4096, max_bytes, (long long)n->max_receive_bytes, &receive,
                              d)) < 0 ||
            (r = conf_get_int(g, "connections", false, 1, NET_LANES_MAX, MAX(n->lanes, 1u), &lanes, d)) < 0)
                return r;

        s = member(g, "listen");
        if (s && config_setting_type(s) != CONFIG_TYPE_STRING)
                return conf_error(s, NULL, -EINVAL, d, "must be a string \"host:port\"");
        if (s && config_setting_get_string(s)[0] && (r = get_address(s, &c->listen, d)) < 0)
                return r;
        s = member(g, "relay");
        if (s && config_setting_type(s) != CONFIG_TYPE_STRING)
                return conf_error(s, NULL, -EINVAL, d, "must be a string \"host:port\" (a node that relays)");
        if (s && (r = get_address(s, &c->relay, d)) < 0)
                return r;
        if ((r = parse_peers(peers, c, d)) < 0)
                return r;
        c->admission = (ConfigAdmission)admission;
        if ((r = check_plaintext(g, c, d)) < 0 ||
            (r = check_admission(g, allowed, c, d)) < 0)
                return r;
        if (c->secret_file[0]) {
                if ((r = load_secret(member(g, "secret_file"), c->secret_file, c->secret, d)) < 0)
                        return r;
                c->has_secret = true;
        }
        if ((r = parse_allowed(allowed, c, d)) < 0)
                return r;

        n->backend = (NetBackendKind)backend;
        if (member(g, "max_frame")) /* else keep the transport's own chunk */
                n->limits.max_payload = n->chunk = (uint32_t)frame;
        n->limits.max_tensor_bytes = (uint64_t)tensor;
        n->lanes = (unsigned)lanes;
        n->max_queued = (uint64_t)queued;
        n->max_links = (unsigned)links;
        n->max_links_per_addr = (unsigned)per_addr;
        n->handshake_timeout_ms = (unsigned)hs;
        n->idle_timeout_ms = (unsigned)idle;
        n->stall_timeout_ms = (unsigned)stall;
        n->pool_bytes = (size_t)pool;
        n->max_receive_bytes = (uint64_t)receive;
        return 0;
}

static const char *const method_names[] = { "ring", "moshpit", "gossip", "auto", NULL };
/* in the order of GossipTopology */
static const char *const topology_names[] = { "complete", "ring", "exp", "alt-exp-ring", NULL };

/* "<64 hex digits>@host:port", or (no_address_ok) "<64 hex digits>" alone:
 * a node that accepts no connections. */
static int get_member(const config_setting_t *s, bool no_address_ok, ConfigMember *ret, Diag *d) {
        const char *text = config_setting_get_string(s), *at = strchr(text, '@'), *why;
        size_t key_len = at ? (size_t)(at - text) : strlen(text);
        char hex[IDENTITY_HEX_SIZE];

        if ((!at && !no_address_ok) || key_len != IDENTITY_HEX_SIZE - 1)
                return conf_error(s, NULL, -EINVAL, d, "must be \"<public key, 64 hex digits>@host:port\"%s, got \"%s\"",
                                  no_address_ok ? " (or the key alone for a node that accepts no connections)" : "",
                                  text);
        memcpy(hex, text, IDENTITY_HEX_SIZE - 1);
        hex[IDENTITY_HEX_SIZE - 1] = 0;
        if (identity_from_hex(hex, ret->id) < 0)
                return conf_error(s, NULL, -EINVAL, d, "not a public key (64 hex digits): \"%s\"", hex);
        memset(&ret->address, 0, sizeof ret->address);
        ret->no_accept = !at;
        if (at && (why = parse_address(at + 1, &ret->address)))
                return conf_error(s, NULL, -EINVAL, d, "%s, got \"%s\"", why, at + 1);
        return 0;
}

/* gossip and auto: a topology (gossip) and a weight; every step, so no
 * cadence; a member training alone (a pipeline stage averages its segments
 * with rings). */
static int parse_gossip(const config_setting_t *root, const config_setting_t *g, ConfigAveraging *a, Diag *d) {
        bool gossip = a->method == CONFIG_AVERAGING_GOSSIP, any = gossip || a->method == CONFIG_AVERAGING_AUTO;
        config_setting_t *s;
        int topology = a->topology, r;

        if ((s = member(g, "topology")) && !gossip)
                return conf_error(s, NULL, -EINVAL, d, "only used with method = \"gossip\"%s",
                                  a->method == CONFIG_AVERAGING_AUTO ? " (auto chooses the topology)" : "");
        if ((s = member(g, "weight")) && !any)
                return conf_error(s, NULL, -EINVAL, d, "only used with method = \"gossip\" or \"auto\"");
        if ((r = get_choice(g, "topology", topology_names, &topology, d)) < 0 ||
            (r = conf_get_double(g, "weight", false, 0, 0.99, a->weight, &a->weight, d)) < 0)
                return r;
        a->topology = topology;
        if (!any)
                return 0;
        if ((s = member(g, "interval")) || (s = member(g, "interval_steps")))
                return conf_error(s, NULL, -EINVAL, d, "not used with method = \"%s\": it mixes every step",
                                  method_names[a->method]);
        if (member(root, "pipeline") || member(root, "membership"))
                return conf_error(member(g, "method"), NULL, -EINVAL, d,
                                  "\"%s\" is for members training the whole model alone, not with %s",
                                  method_names[a->method], member(root, "pipeline") ? "a pipeline" : "membership");
        return 0;
}

/* averaging.outer = { lr; momentum; nesterov; }, averaging.fragments and group_size:
 * for the methods that run rounds of a group (ring; Moshpit without
 * fragments). */
static int parse_outer(const config_setting_t *g, ConfigAveraging *a, Diag *d) {
        static const char *const keys[] = { "lr", "momentum", "nesterov", NULL };
        config_setting_t *o, *s;
        long long fragments, group;
        int r;

        if ((r = conf_get_group(g, "outer", false, false, &o, d)) < 0 ||
            (r = conf_get_int(g, "fragments", false, 1, AVERAGER_MAX_FRAGMENTS, 1, &fragments, d)) < 0 ||
            (r = conf_get_int(g, "group_size", false, 2, COLL_MAX_MEMBERS, COLL_MAX_MEMBERS, &group, d)) < 0)
                return r;
        a->fragments = (unsigned)fragments;
        a->group_size = (unsigned)group;
        if ((s = member(g, "fragments")) && a->method != CONFIG_AVERAGING_RING)
                return conf_error(s, NULL, -EINVAL, d, "only used with method = \"ring\"");
        if ((s = member(g, "group_size")) && a->method != CONFIG_AVERAGING_RING)
                return conf_error(s, NULL, -EINVAL, d, "only used with method = \"ring\"");
        if (!o)
                return 0;
        if (a->method != CONFIG_AVERAGING_RING && a->method != CONFIG_AVERAGING_MOSHPIT)
                return conf_error(o, NULL, -EINVAL, d, "only used with method = \"ring\" or \"moshpit\"");
        if ((r = conf_check_keys(o, keys, d)) < 0 ||
            (r = conf_get_double(o, "lr", false, 1e-6, 10, 0.7, &a->outer_lr, d)) < 0 ||
            (r = conf_get_double(o, "momentum", false, 0, 0.999, 0.9, &a->outer_momentum, d)) < 0 ||
            (r = conf_get_bool(o, "nesterov", true, &a->outer_nesterov, d)) < 0)
                return r;
        a->outer = true;
        return 0;
}

/* The index of the first of members[0..n) with key id, or -1. */
static int find_key(const ConfigMember *members, size_t n, const uint8_t id[IDENTITY_PK_SIZE]) {
        for (size_t j = 0; j < n; j++)
                if (memcmp(members[j].id, id, IDENTITY_PK_SIZE) == 0)
                        return (int)j;
        return -1;
}

/* averaging.members: every member, this node included, each key once. */
static int parse_members(config_setting_t *g, config_setting_t *members, ConfigAveraging *a, Diag *d) {
        int n = members ? config_setting_length(members) : 0, j, r;
        if (n < 2)
                return conf_error(members ? members : g, members ? NULL : "members", -EINVAL, d,
                                  "needs every member, this node included: at least two");
        /* a ring wider than one round averages on a grid; gossip's groups are one round's map */
        unsigned max = a->method == CONFIG_AVERAGING_MOSHPIT ? CONFIG_MAX_PEERS
                       : a->method == CONFIG_AVERAGING_RING  ? AVERAGER_RING_MAX
                                                             : COLL_MAX_MEMBERS;
        if ((unsigned)n > max)
                return conf_error(members, NULL, -E2BIG, d, "at most %u members with method \"%s\"", max,
                                  method_names[a->method]);
        a->members = calloc((size_t)n, sizeof *a->members);
        if (!a->members)
                return -ENOMEM;
        a->n_members = (size_t)n;
        for (int i = 0; i < n; i++) {
                config_setting_t *e = config_setting_get_elem(members, (unsigned)i);
                if ((r = get_member(e, true, &a->members[i], d)) < 0)
                        return r;
                if ((j = find_key(a->members, (size_t)i, a->members[i].id)) >= 0)
                        return conf_error(e, NULL, -EINVAL, d, "the same key as member %d", j + 1);
        }
        return 0;
}

/* Members training alone may average with any other: at most one of them
 * may accept no connections. (With a pipeline, only the members that hold
 * the same layers link: the stage checks its rings.) */
static int check_reachable(const config_setting_t *root, config_setting_t *members, const ConfigAveraging *a,
                           Diag *d) {
        int first = -1;
        if (member(root, "pipeline") || relay_set(root))
                return 0;
        for (size_t i = 0; i < a->n_members; i++) {
                if (!a->members[i].no_accept)
                        continue;
                if (first >= 0)
                        return conf_error(config_setting_get_elem(members, (unsigned)i), NULL, -EINVAL, d,
                                          "members %d and %zu both accept no connections (no address), and members "
                                          "training alone may average with any other: at most one may lack one, "
                                          "unless network.relay is set",
                                          first + 1, i + 1);
                first = (int)i;
        }
        return 0;
}

/* averaging.grid = [ dims, side ]: the Moshpit grid; by default 2
 * dimensions with room for every member. */
static int parse_grid(config_setting_t *g, ConfigAveraging *a, Diag *d) {
        config_setting_t *s = member(g, "grid");
        unsigned n = (unsigned)a->n_members;

        if (s && (config_setting_type(s) != CONFIG_TYPE_ARRAY || config_setting_length(s) != 2 ||
                  config_setting_type(config_setting_get_elem(s, 0)) != CONFIG_TYPE_INT))
                return conf_error(s, NULL, -EINVAL, d, "must be [ dimensions, side ]");
        if (s && a->method != CONFIG_AVERAGING_MOSHPIT)
                return conf_error(s, NULL, -EINVAL, d, "only used with method = \"moshpit\"");
        if (s) {
                long long dims = config_setting_get_int_elem(s, 0), side = config_setting_get_int_elem(s, 1);
                double cells = pow((double)side, (double)dims);
                if (dims < 1 || dims > 8 || side < 2 || side > 65536 || cells > 65536 || cells < n)
                        return conf_error(s, NULL, -EINVAL, d,
                                          "needs 1..8 dimensions, a side of at least 2, side^dimensions at most 65536 "
                                          "and at least the %u members", n);
                a->grid_dims = (unsigned)dims;
                a->grid_side = (unsigned)side;
        } else if (a->method == CONFIG_AVERAGING_MOSHPIT) {
                a->grid_dims = 2;
                a->grid_side = 2;
                while (a->grid_side * a->grid_side < n)
                        a->grid_side++;
        }
        return 0;
}

/* averaging.payload; fp16 = true is its older spelling of "f16" (and
 * fp16 = false of anything else): both given, they must agree.
 * error_feedback goes with "int8" only. */
static int parse_payload(const config_setting_t *g, ConfigAveraging *a, Diag *d) {
        config_setting_t *s = member(g, "payload");
        int payload = a->payload, r;
        bool fp16 = false;

        if ((r = get_choice(g, "payload", coll_payload_names, &payload, d)) < 0 ||
            (r = conf_get_bool(g, "fp16", false, &fp16, d)) < 0)
                return r;
        if (s && member(g, "fp16") && fp16 != (payload == COLL_PAYLOAD_F16))
                return conf_error(s, NULL, -EINVAL, d, "\"%s\" disagrees with fp16 = %s", coll_payload_names[payload],
                                  fp16 ? "true" : "false");
        a->payload = s ? payload : fp16 ? COLL_PAYLOAD_F16 : payload;
        if ((s = member(g, "error_feedback")) && a->payload != COLL_PAYLOAD_INT8)
                return conf_error(s, NULL, -EINVAL, d, "only used with payload = \"int8\"");
        return conf_get_bool(g, "error_feedback", false, &a->error_feedback, d);
}

static int parse_averaging(const config_setting_t *root, Config *c, Diag *d) {
        static const char *const keys[] = {
                "method", "interval", "interval_steps", "listen", "members", "payload", "fp16", "join_timeout",
                "round_timeout", "grid", "topology", "weight", "outer", "fragments", "error_feedback",
                "take_parameters", "group_size", NULL,
        };
        ConfigAveraging *a = &c->averaging;
        config_setting_t *g, *s, *members;
        long long steps, join, round;
        double interval;
        int method = a->method, r;

        if ((r = conf_get_group(root, "averaging", false, false, &g, d)) < 0 || !g)
                return r;
        if ((r = conf_check_keys(g, keys, d)) < 0 ||
            (r = get_choice(g, "method", method_names, &method, d)) < 0 ||
            (r = conf_get_double(g, "interval", false, 0.05, 86400, a->interval_ms / 1000.0, &interval, d)) < 0 ||
            (r = conf_get_int(g, "interval_steps", false, 0, 1 << 30, 0, &steps, d)) < 0 ||
            (r = parse_payload(g, a, d)) < 0 ||
            (r = conf_get_int(g, "join_timeout", false, 100, 3600000, a->join_timeout_ms, &join, d)) < 0 ||
            (r = conf_get_int(g, "round_timeout", false, 100, 3600000, a->round_timeout_ms, &round, d)) < 0 ||
            (r = get_strings(g, "members", CONFIG_MAX_PEERS, &members, d)) < 0 ||
            (r = conf_get_bool(g, "take_parameters", a->take_parameters, &a->take_parameters, d)) < 0)
                return r;
        a->method = (ConfigAveragingMethod)method;
        if ((r = parse_gossip(root, g, a, d)) < 0 || (r = parse_outer(g, a, d)) < 0)
                return r;
        a->interval_ms = (unsigned)(interval * 1000);
        a->interval_steps = (unsigned)steps;
        a->join_timeout_ms = (unsigned)join;
        a->round_timeout_ms = (unsigned)round;

        s = member(g, "listen");
        if (!s)
                return conf_error(g, "listen", -EINVAL, d, "missing (\"host:port\" for the averaging links)");
        if (config_setting_type(s) != CONFIG_TYPE_STRING)
                return conf_error(s, NULL, -EINVAL, d, "must be a string \"host:port\"");
        if ((r = get_address(s, &a->listen, d)) < 0)
                return r;

        if (c->membership.enabled) { /* the plan names the members */
                if (members)
                        return conf_error(members, NULL, -EINVAL, d,
                                          "not with membership: the coordinator's plan names the members");
                if (a->method != CONFIG_AVERAGING_RING)
                        return conf_error(member(g, "method"), NULL, -EINVAL, d,
                                          "only \"ring\" with membership (the plan's rings)");
                return 0;
        }
        if ((r = parse_members(g, members, a, d)) < 0 || (r = parse_grid(g, a, d)) < 0 ||
            (r = check_reachable(root, members, a, d)) < 0)
                return r;
        a->enabled = true;
        return 0;
}

static const char *const schedule_names[] = { "async", "sync", NULL };

static int parse_cluster(const config_setting_t *e, bool relay, ConfigCluster *k, Diag *d) {
        static const char *const keys[] = { "nodes", "stages", NULL };
        config_setting_t *nodes, *stages;
        int r;

        if (config_setting_type(e) != CONFIG_TYPE_GROUP)
                return conf_error(e, NULL, -EINVAL, d, "must be a group { nodes = [ ... ]; stages = [ ... ]; }");
        if ((r = conf_check_keys(e, keys, d)) < 0 || (r = get_strings(e, "nodes", CONFIG_MAX_STAGES, &nodes, d)) < 0)
                return r;
        if (!nodes || config_setting_length(nodes) < 1)
                return conf_error(e, "nodes", -EINVAL, d, "missing: the cluster's nodes, \"<key>@host:port\", in stage order");
        k->nodes = calloc((size_t)config_setting_length(nodes), sizeof *k->nodes);
        if (!k->nodes)
                return -ENOMEM;
        k->n_stages = (unsigned)config_setting_length(nodes);
        for (unsigned i = 0; i < k->n_stages; i++) {
                if ((r = get_member(config_setting_get_elem(nodes, i), true, &k->nodes[i], d)) < 0)
                        return r;
                if (i > 0 && k->nodes[i - 1].no_accept && k->nodes[i].no_accept && !relay)
                        return conf_error(config_setting_get_elem(nodes, i), NULL, -EINVAL, d,
                                          "stages %u and %u both accept no connections (no address): one end of "
                                          "every pipeline link must have one, or network.relay must be set", i,
                                          i + 1);
        }
        stages = member(e, "stages");
        if (!stages)
                return conf_error(e, "stages", -EINVAL, d, "missing: the first layer of each stage, then the layer count");
        if (!config_setting_is_array(stages) || config_setting_length(stages) != (int)k->n_stages + 1)
                return conf_error(stages, NULL, -EINVAL, d, "must be an array of %u integers: 0, the first layer of "
                                  "each further stage, the number of layers", k->n_stages + 1);
        k->stages_line = config_setting_source_line(stages);
        for (unsigned i = 0; i <= k->n_stages; i++) {
                config_setting_t *b = config_setting_get_elem(stages, i);
                if (config_setting_type(b) != CONFIG_TYPE_INT)
                        return conf_error(stages, NULL, -EINVAL, d, "must hold integers");
                k->bounds[i] = config_setting_get_int(b);
                if ((i == 0 && k->bounds[0] != 0) || (i > 0 && k->bounds[i] <= k->bounds[i - 1]))
                        return conf_error(stages, NULL, -EINVAL, d, "must start at 0 and increase");
        }
        return 0;
}

/* A node holds one stage of one cluster: each key of cluster k (setting
 * nodes) once in it and in the clusters before it. */
static int check_cluster_keys(const config_setting_t *nodes, const ConfigPipeline *p, unsigned k, Diag *d) {
        const ConfigCluster *cl = &p->clusters[k];
        for (unsigned s = 0; s < cl->n_stages; s++)
                for (unsigned o = 0; o <= k; o++) {
                        int j = find_key(p->clusters[o].nodes, o == k ? s : p->clusters[o].n_stages, cl->nodes[s].id);
                        if (j >= 0)
                                return conf_error(config_setting_get_elem(nodes, s), NULL, -EINVAL, d,
                                                  "the same key as stage %d of cluster %u: a node holds one stage "
                                                  "of one cluster", j + 1, o + 1);
                }
        return 0;
}

static int parse_pipeline(const config_setting_t *root, Config *c, Diag *d) {
        static const char *const keys[] = {
                "micro_batch", "staleness", "update_frequency", "schedule", "weight_prediction",
                "synchronous_start", "neighbour_timeout", "listen", "clusters", NULL,
        };
        ConfigPipeline *p = &c->pipeline;
        config_setting_t *g, *s, *clusters;
        long long mb, tau, uf, lost;
        int sched = 0, r;

        if ((r = conf_get_group(root, "pipeline", false, false, &g, d)) < 0 || !g)
                return r;
        if ((r = conf_check_keys(g, keys, d)) < 0 ||
            (r = conf_get_int(g, "micro_batch", false, 1, 65536, p->micro_batch, &mb, d)) < 0 ||
            (r = conf_get_int(g, "staleness", false, 1, 1024, p->staleness, &tau, d)) < 0 ||
            (r = conf_get_int(g, "update_frequency", false, 1, 1024, p->update_frequency, &uf, d)) < 0 ||
            (r = conf_get_int(g, "neighbour_timeout", false, 0, 7 * 86400, p->neighbour_timeout_s, &lost, d)) < 0 ||
            (r = get_choice(g, "schedule", schedule_names, &sched, d)) < 0 ||
            (r = conf_get_bool(g, "weight_prediction", p->weight_prediction, &p->weight_prediction, d)) < 0 ||
            (r = conf_get_int(g, "synchronous_start", false, 0, 1ll << 40, p->synchronous_start,
                              &p->synchronous_start, d)) < 0 ||
            (r = conf_get_group(g, "clusters", !c->membership.enabled, true, &clusters, d)) < 0)
                return r;
        if (clusters && c->membership.enabled)
                return conf_error(clusters, NULL, -EINVAL, d,
                                  "not with membership: the coordinator's plan forms the clusters");
        p->micro_batch = (int)mb;
        p->staleness = (int)tau;
        p->update_frequency = (int)uf;
        p->neighbour_timeout_s = (unsigned)lost;
        p->synchronous = sched == 1;
        s = member(g, "listen");
        if (!s)
                return conf_error(g, "listen", -EINVAL, d, "missing (\"host:port\" for the links of the pipeline)");
        if (config_setting_type(s) != CONFIG_TYPE_STRING)
                return conf_error(s, NULL, -EINVAL, d, "must be a string \"host:port\"");
        if ((r = get_address(s, &p->listen, d)) < 0)
                return r;
        if (!clusters)
                return 0;
        int n = config_setting_length(clusters);
        if (n < 1 || n > CONFIG_MAX_CLUSTERS)
                return conf_error(clusters, NULL, -EINVAL, d, "needs 1 to %d clusters", CONFIG_MAX_CLUSTERS);
        p->clusters = calloc((size_t)n, sizeof *p->clusters);
        if (!p->clusters)
                return -ENOMEM;
        p->n_clusters = (unsigned)n;
        for (int i = 0; i < n; i++) {
                const config_setting_t *e = config_setting_get_elem(clusters, (unsigned)i);
                if ((r = parse_cluster(e, relay_set(root), &p->clusters[i], d)) < 0 ||
                    (r = check_cluster_keys(member(e, "nodes"), p, (unsigned)i, d)) < 0)
                        return r;
        }
        p->enabled = true;
        return 0;
}

/* membership.memory: 0 (what the machine has), or the bounds of a nodes
 * file's memory. */
static int get_memory(const config_setting_t *g, uint64_t *ret, Diag *d) {
        const config_setting_t *s = member(g, "memory");
        if (!s || ((config_setting_type(s) == CONFIG_TYPE_INT || config_setting_type(s) == CONFIG_TYPE_INT64) &&
                   config_setting_get_int64(s) == 0)) {
                *ret = 0;
                return 0;
        }
        return nodes_file_get_memory(s, ret, d);
}

/* The coordinator's "<key>@host:port", who coordinates, and the timings. */
static int parse_membership(const config_setting_t *root, Config *c, Diag *d) {
        static const char *const keys[] = {
                "coordinator", "coordinate", "train", "memory", "probe", "min_nodes", "settle", "heartbeat",
                "deadline", "handover_timeout", "behind_nat", NULL,
        };
        ConfigMembership *m = &c->membership;
        config_setting_t *g, *s;
        double probe, settle, heartbeat, deadline, handover;
        char deadline_text[CONF_NUMBER_MAX], heartbeat_text[CONF_NUMBER_MAX];
        long long min_nodes;
        int r;

        if ((r = conf_get_group(root, "membership", false, false, &g, d)) < 0 || !g)
                return r;
        /* set first: the averaging and pipeline sections are read as under
         * membership even when a setting here is wrong (not as sections that
         * lack their members and clusters) */
        m->enabled = true;
        if ((r = conf_check_keys(g, keys, d)) < 0 ||
            (r = conf_get_bool(g, "coordinate", false, &m->coordinate, d)) < 0 ||
            (r = conf_get_bool(g, "train", true, &m->train, d)) < 0 ||
            (r = conf_get_bool(g, "behind_nat", false, &m->behind_nat, d)) < 0 ||
            (r = conf_get_double(g, "probe", false, 0.01, 10, m->probe_ms / 1000.0, &probe, d)) < 0 ||
            (r = conf_get_int(g, "min_nodes", false, 1, PLAN_MAX_NODES, m->min_nodes, &min_nodes, d)) < 0 ||
            (r = conf_get_double(g, "settle", false, 0, 3600, m->settle_ms / 1000.0, &settle, d)) < 0 ||
            (r = conf_get_double(g, "heartbeat", false, 0.05, 600, m->heartbeat_ms / 1000.0, &heartbeat, d)) < 0 ||
            (r = conf_get_double(g, "deadline", false, 0.2, 3600, m->deadline_ms / 1000.0, &deadline, d)) < 0 ||
            (r = conf_get_double(g, "handover_timeout", false, 0.1, 3600, m->handover_timeout_ms / 1000.0,
                                 &handover, d)) < 0)
                return r;
        s = member(g, "coordinator");
        if (!s)
                return conf_error(g, "coordinator", -EINVAL, d,
                                  "missing: the coordinator's \"<public key>@host:port\"");
        if (config_setting_type(s) != CONFIG_TYPE_STRING)
                return conf_error(s, NULL, -EINVAL, d, "must be a string \"<public key>@host:port\"");
        if ((r = get_member(s, false, &m->coordinator, d)) < 0)
                return r;
        if (m->behind_nat && m->coordinate)
                return conf_error(member(g, "behind_nat"), NULL, -EINVAL, d,
                                  "not with coordinate = true: the nodes must reach the coordinator");
        if (!m->train && !m->coordinate)
                return conf_error(member(g, "train"), NULL, -EINVAL, d,
                                  "false only with coordinate = true (a node that neither trains nor coordinates)");
        if (heartbeat * 2 > deadline)
                return conf_error(member(g, "deadline") ?: member(g, "heartbeat"), NULL, -EINVAL, d,
                                  "the deadline (%s s) must be at least two heartbeats of %s s",
                                  conf_number(deadline, deadline_text), conf_number(heartbeat, heartbeat_text));
        if ((r = get_memory(g, &m->memory, d)) < 0)
                return r;
        m->probe_ms = (unsigned)(probe * 1000 + 0.5);
        m->min_nodes = (unsigned)min_nodes;
        m->settle_ms = (unsigned)(settle * 1000 + 0.5);
        m->heartbeat_ms = (unsigned)(heartbeat * 1000 + 0.5);
        m->deadline_ms = (unsigned)(deadline * 1000 + 0.5);
        m->handover_timeout_ms = (unsigned)(handover * 1000 + 0.5);
        return 0;
}

/* An address membership hands to the other nodes (setting s, when set):
 * a wildcard one reaches nobody. */
static int check_handed_address(const config_setting_t *s, const ConfigAddress *a, Diag *d) {
        if (!s || !address_is_wildcard(a))
                return 0;
        return conf_error(s, NULL, -EINVAL, d, "membership hands this address to the other nodes: a wildcard address "
                          "(\"%s\") does not reach this one", config_setting_get_string(s));
}

/* Membership needs the pipeline's and the averaging's listen addresses:
 * they go to the coordinator, and into the plan, so the other nodes must
 * reach this one there. */
static int check_membership(const config_setting_t *root, const Config *c, Diag *d) {
        const config_setting_t *g = member(root, "membership");
        int r;
        if (!c->membership.enabled || !c->membership.train)
                return 0;
        if (!member(root, "pipeline"))
                return conf_error(g, NULL, -EINVAL, d, "needs a pipeline section with listen (where its stage listens)");
        if (!member(root, "averaging"))
                return conf_error(g, NULL, -EINVAL, d,
                                  "needs an averaging section with listen (where it averages with other clusters)");
        if ((r = check_handed_address(member(member(root, "pipeline"), "listen"), &c->pipeline.listen, d)) < 0)
                return r;
        return check_handed_address(member(member(root, "averaging"), "listen"), &c->averaging.listen, d);
}

/* control_socket: an absolute path, or "" for none. */
static int get_socket_path(const config_setting_t *root, char *buf, size_t len, Diag *d) {
        const config_setting_t *s = member(root, "control_socket");
        if (s && config_setting_type(s) == CONFIG_TYPE_STRING && !config_setting_get_string(s)[0]) {
                buf[0] = '\0';
                return 0;
        }
        int r = get_path(root, "control_socket", buf, len, d);
        if (r >= 0 && strlen(buf) >= 108) /* sun_path */
                return conf_error(s, NULL, -ENAMETOOLONG, d, "a unix socket path has at most 107 characters");
        return r;
}

static int parse_idle(const config_setting_t *root, Config *c, Diag *d) {
        static const char *const keys[] = {
                "enabled", "max_other_cpu", "max_pressure", "busy_time", "resume_after", "run_on_battery",
                "use_logind", "max_duty", NULL,
        };
        IdleSettings *i = &c->idle;
        config_setting_t *g;
        double busy, resume;
        int r;

        if ((r = conf_get_group(root, "idle", false, false, &g, d)) < 0 || !g)
                return r;
        if ((r = conf_check_keys(g, keys, d)) < 0 || (r = conf_get_bool(g, "enabled", i->enabled, &i->enabled, d)) < 0 ||
            (r = conf_get_double(g, "max_other_cpu", false, 0.01, 4096, i->max_other_cpu, &i->max_other_cpu, d)) < 0 ||
            (r = conf_get_double(g, "max_pressure", false, 0.0, 1.0, i->max_pressure, &i->max_pressure, d)) < 0 ||
            (r = conf_get_double(g, "busy_time", false, 0.0, 60, i->busy_ms / 1000.0, &busy, d)) < 0 ||
            (r = conf_get_double(g, "resume_after", false, 0.0, 86400, i->resume_ms / 1000.0, &resume, d)) < 0 ||
            (r = conf_get_bool(g, "run_on_battery", i->run_on_battery, &i->run_on_battery, d)) < 0 ||
            (r = conf_get_bool(g, "use_logind", i->use_logind, &i->use_logind, d)) < 0 ||
            (r = conf_get_double(g, "max_duty", false, 0.01, 1.0, i->max_duty, &i->max_duty, d)) < 0)
                return r;
        i->busy_ms = (unsigned)(busy * 1000 + 0.5);
        i->resume_ms = (unsigned)(resume * 1000 + 0.5);
        return 0;
}

static int parse_checkpoint(const config_setting_t *root, Config *c, Diag *d) {
        static const char *const keys[] = { "interval", "load", NULL };
        config_setting_t *g;
        long long interval;
        int r;

        if ((r = conf_get_group(root, "checkpoint", false, false, &g, d)) < 0 || !g)
                return r;
        if ((r = conf_check_keys(g, keys, d)) < 0 ||
            (r = conf_get_int(g, "interval", false, 0, 7 * 86400, c->checkpoint.interval_s, &interval, d)) < 0 ||
            (r = conf_get_bool(g, "load", c->checkpoint.load, &c->checkpoint.load, d)) < 0)
                return r;
        c->checkpoint.interval_s = (unsigned)interval;
        return 0;
}

/* relay = { listen; max_links; max_links_per_address; }: this node relays
 * links between nodes that accept no connections. */
static int parse_relay(const config_setting_t *root, Config *c, Diag *d) {
        static const char *const keys[] = { "listen", "max_links", "max_links_per_address", NULL };
        ConfigRelay *rl = &c->relay_server;
        config_setting_t *g, *s;
        long long max, per_addr;
        int r;

        rl->max_links_per_addr = RELAY_MAX_LINKS_PER_ADDR;
        if ((r = conf_get_group(root, "relay", false, false, &g, d)) < 0 || !g)
                return r;
        if ((r = conf_check_keys(g, keys, d)) < 0 ||
            (r = conf_get_int(g, "max_links", false, 1, 65536, 64, &max, d)) < 0 ||
            (r = conf_get_int(g, "max_links_per_address", false, 1, 65536, RELAY_MAX_LINKS_PER_ADDR, &per_addr, d)) < 0)
                return r;
        s = member(g, "listen");
        if (!s)
                return conf_error(g, "listen", -EINVAL, d, "missing: where the relay listens, \"0.0.0.0:7400\"");
        if (config_setting_type(s) != CONFIG_TYPE_STRING)
                return conf_error(s, NULL, -EINVAL, d, "must be a string \"host:port\"");
        if ((r = get_address(s, &rl->listen, d)) < 0)
                return r;
        rl->max_links = (unsigned)max;
        rl->max_links_per_addr = (unsigned)per_addr;
        rl->enabled = true;
        return 0;
}

static int parse_metrics(const config_setting_t *root, Config *c, Diag *d) {
        static const char *const keys[] = { "listen", "max_connections", "timeout", NULL };
        ConfigMetrics *m = &c->metrics;
        config_setting_t *g, *s;
        long long max, timeout;
        int r;

        if ((r = conf_get_group(root, "metrics", false, false, &g, d)) < 0 || !g)
                return r;
        if ((r = conf_check_keys(g, keys, d)) < 0 ||
            (r = conf_get_int(g, "max_connections", false, 1, 1024, m->max_connections, &max, d)) < 0 ||
            (r = conf_get_int(g, "timeout", false, 1, 3600, m->timeout_s, &timeout, d)) < 0)
                return r;
        s = member(g, "listen");
        if (!s)
                return conf_error(g, "listen", -EINVAL, d, "missing: where the HTTP endpoint listens, \"127.0.0.1:9464\"");
        if (config_setting_type(s) != CONFIG_TYPE_STRING)
                return conf_error(s, NULL, -EINVAL, d, "must be a string \"host:port\"");
        if ((r = get_address(s, &m->listen, d)) < 0)
                return r;
        m->max_connections = (unsigned)max;
        m->timeout_s = (unsigned)timeout;
        m->enabled = true;
        return 0;
}

/* Whether error ("path:line: ...") is about a line one of reported's
 * lines names. */
static bool same_line(const char *path, const char *reported, const char *error) {
        size_t n = strlen(path);
        if (strncmp(error, path, n) != 0 || error[n] != ':')
                return false;
        const char *colon = strchr(error + n + 1, ':');
        if (!colon)
                return false;
        n = (size_t)(colon + 1 - error);
        for (const char *l = reported; *l; l += strcspn(l, "\n") + (l[strcspn(l, "\n")] == '\n'))
                if (strncmp(l, error, n) == 0)
                        return true;
        return false;
}

int config_load(const char *path, Config *ret, Diag *d) {
        static const char *const keys[] = {
                "state_directory", "job", "threads", "control_socket", "network", "averaging", "pipeline", "idle",
                "checkpoint", "membership", "metrics", "relay", NULL,
        };
        _cleanup_(config_free) Config c;
        _cleanup_(config_destroy) config_t cf;
        const config_setting_t *root;
        long long threads;
        int r;

        config_init(&cf);
        config_defaults(&c);
        if (strlen(path) >= sizeof c.path)
                return diag_set(d, -ENAMETOOLONG, "%s: path too long", path);
        strcpy(c.path, path);

        /* integers too wide for how they are written (-ERANGE) leave a file
         * that parsed: its sections are checked too */
        Diag wide = {};
        if ((r = conf_read_file(&cf, path, &wide)) < 0 && r != -ERANGE)
                return diag_set(d, r, "%s", wide.text);
        root = config_root_setting(&cf);
        /* Every section is checked even after an error in another, so one
         * run of --check-config lists every error (one per section; not a
         * second one on the line of a wide integer, which was misread). */
        Diag one;
        int first = r;
#define CHECK(call)                                                  \
        do {                                                         \
                one.text[0] = '\0';                                  \
                int k_ = (call);                                     \
                if (k_ < 0) {                                        \
                        first = first ?: k_;                         \
                        if (!same_line(path, wide.text, one.text))         \
                                diag_append(d, "%s", one.text);      \
                }                                                    \
        } while (0)
        if (d)
                snprintf(d->text, sizeof d->text, "%s", wide.text);
        threads = 0;
        CHECK(conf_check_keys(root, keys, &one));
        CHECK(get_path(root, "state_directory", c.state_directory, sizeof c.state_directory, &one));
        if (member(root, "state_directory"))
                c.state_directory_line = (unsigned)config_setting_source_line(member(root, "state_directory"));
        CHECK(get_job(root, c.job, sizeof c.job, &one));
        CHECK(get_socket_path(root, c.control_socket, sizeof c.control_socket, &one));
        CHECK(parse_idle(root, &c, &one));
        CHECK(parse_checkpoint(root, &c, &one));
        CHECK(parse_metrics(root, &c, &one));
        CHECK(parse_relay(root, &c, &one));
        CHECK(conf_get_int(root, "threads", false, 0, 256, 0, &threads, &one));
        CHECK(parse_membership(root, &c, &one));
        CHECK(parse_averaging(root, &c, &one));
        CHECK(parse_pipeline(root, &c, &one));
        CHECK(check_membership(root, &c, &one));
        CHECK(parse_network(root, &c, &one));
#undef CHECK
        if (first < 0)
                return first;
        c.threads = (unsigned)threads;

        *ret = c;
        c.peers = NULL; /* now ret's; the cleanup wipes this copy of the secret */
        c.allowed = NULL;
        c.averaging.members = NULL;
        c.pipeline.clusters = NULL;
        return 0;
}

int config_pipeline_fits_job(const ConfigPipeline *p, const char *source, const Job *job, Diag *d) {
        for (unsigned i = 0; i < p->n_clusters; i++) {
                const ConfigCluster *cl = &p->clusters[i];
                char where[PATH_MAX + 64];
                if (cl->stages_line)
                        snprintf(where, sizeof where, "%s:%u: pipeline.clusters.[%u].stages", source, cl->stages_line,
                                 i);
                else
                        snprintf(where, sizeof where, "%s: pipeline.clusters.[%u].stages", source, i);
                if (cl->bounds[cl->n_stages] != job->model.n_layers)
                        return diag_set(d, -EINVAL, "%s: cluster %u cuts %d layers, job %s has %d", where, i + 1,
                                        cl->bounds[cl->n_stages], job->name, job->model.n_layers);
                /* a stage with nothing to average has no place in the rings */
                for (unsigned s = 0; s < cl->n_stages; s++)
                        if (model_spec_params(&job->model, cl->bounds[s], cl->bounds[s + 1]) == 0)
                                return diag_set(d, -EINVAL, "%s: stage %u of cluster %u (layers %d-%d of job %s) "
                                                "holds no parameters", where, s + 1, i + 1, cl->bounds[s],
                                                cl->bounds[s + 1] - 1, job->name);
        }
        return 0;
}

int config_check_job(const Config *c, const Job *job, Diag *d) {
        return c->pipeline.enabled ? config_pipeline_fits_job(&c->pipeline, c->path, job, d) : 0;
}

int config_check_state_directory(const Config *c, Diag *d) {
        const char *dir = c->state_directory;
        char where[PATH_MAX + 64], parent[PATH_MAX];
        struct stat st;

        if (c->state_directory_line)
                snprintf(where, sizeof where, "%s:%u: state_directory", c->path, c->state_directory_line);
        else
                snprintf(where, sizeof where, "%s: state_directory (the default)", c->path);
        if (stat(dir, &st) >= 0) {
                if (!S_ISDIR(st.st_mode))
                        return diag_set(d, -ENOTDIR, "%s: %s is not a directory", where, dir);
                if (access(dir, W_OK | X_OK) < 0)
                        return diag_set(d, -errno, "%s: %s: cannot write there: %m", where, dir);
                return 0;
        }
        if (errno != ENOENT)
                return diag_set(d, -errno, "%s: %s: %m", where, dir);
        /* the daemon creates it, one level (mkdir()): its parent must take it */
        snprintf(parent, sizeof parent, "%s", dir);
        for (size_t n = strlen(parent); n > 1 && parent[n - 1] == '/'; n--)
                parent[n - 1] = 0;
        char *slash = strrchr(parent, '/');
        slash[slash == parent] = 0; /* an absolute path (get_path()): "/x" -> "/" */
        if (stat(parent, &st) < 0)
                return diag_set(d, -errno, "%s: %s cannot be created: %s: %m", where, dir, parent);
        if (!S_ISDIR(st.st_mode))
                return diag_set(d, -ENOTDIR, "%s: %s cannot be created: %s is not a directory", where, dir, parent);
        if (access(parent, W_OK | X_OK) < 0)
                return diag_set(d, -errno, "%s: %s cannot be created: %s: %m", where, dir, parent);
        return 0;
}

int config_net(const Config *c, const Identity *id, NetConfig *ret, Diag *d) {
        bool secret = c->admission != CONFIG_ADMISSION_ALLOWLIST;
        bool list = c->admission != CONFIG_ADMISSION_SECRET;
        NetConfig n = c->net;

        if (!id)
                return -EINVAL;
        if (secret && !c->has_secret)
                return diag_set(d, -EINVAL, "%s: network.secret_file: missing (required with admission = \"%s\")",
                                c->path, admission_names[c->admission]);
        if (list && c->n_allowed == 0)
                return diag_set(d, -EINVAL, "%s: network.allowed_peers: missing (required with admission = \"%s\")",
                                c->path, admission_names[c->admission]);
        n.identity = id;
        n.secret = secret ? c->secret : NULL;
        n.allowed = list ? (const uint8_t(*)[IDENTITY_PK_SIZE])c->allowed : NULL;
        n.n_allowed = list ? c->n_allowed : 0;
        n.relay_host = c->relay.port ? c->relay.host : NULL;
        n.relay_port = c->relay.port;
        *ret = n;
        return 0;
}
