/* conf/config.h — ravnestd.conf, the daemon's configuration file (see
 * ravnestd.conf(5)): where its state lives, what it trains, and how it
 * reaches its peers.
 *
 * config_load() checks everything a setting can be checked for on its own
 * or against the others, and reads the files it names (the network secret),
 * so a reload can keep the old Config when the new file has an error. Every
 * error names the file, the line and the setting:
 *
 *     Config c;
 *     Diag d = {};
 *     r = config_load(CONFIG_PATH, &c, &d);
 *     if (r < 0)
 *             return log_error_errno(r, "%s", d.text);  // "ravnestd.conf:7: network.listen: ..."
 *     NetConfig nc;
 *     r = config_net(&c, &id, &nc, &d);     // points into c: keep c until net_new() returns
 *     ...
 *     config_free(&c);
 */
#pragma once

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include "conf/job.h"
#include "host/idle.h"
#include "net/handshake.h"
#include "net/identity.h"
#include "net/net.h"
#include "util/diag.h"

#define CONFIG_PATH SYSCONF_DIR "/ravnestd.conf"
#define CONFIG_MAX_PEERS 1024
#define CONFIG_MAX_ALLOWED 1024
#define CONFIG_HOST_MAX 254 /* a DNS name has at most 253 characters */

typedef enum ConfigAdmission {
        CONFIG_ADMISSION_SECRET,
        CONFIG_ADMISSION_ALLOWLIST,
        CONFIG_ADMISSION_BOTH,
} ConfigAdmission;

/* "host:port" or "[IPv6]:port", split; the host without brackets. */
typedef struct ConfigAddress {
        char host[CONFIG_HOST_MAX];
        uint16_t port;
} ConfigAddress;

/* A node of the plan: "<public key hex>@host:port", or "<public key hex>"
 * alone for a node that accepts no connections (behind NAT): it dials
 * every link itself (net_dials()). */
typedef struct ConfigMember {
        uint8_t id[IDENTITY_PK_SIZE];
        ConfigAddress address;
        bool no_accept; /* no address: nobody dials it */
} ConfigMember;

typedef enum ConfigAveragingMethod {
        CONFIG_AVERAGING_RING,    /* one all-reduce ring over every member */
        CONFIG_AVERAGING_MOSHPIT, /* Moshpit groups on a virtual grid */
        CONFIG_AVERAGING_GOSSIP,  /* every step, with the group of a topology (collective/gossip.h) */
        CONFIG_AVERAGING_AUTO,    /* all-reduce or a gossip topology, as the runtime model says */
} ConfigAveragingMethod;

/* Averaging of whole-model replicas with the other members (see
 * ravnestd.conf(5), averaging). */
typedef struct ConfigAveraging {
        bool enabled;
        ConfigAveragingMethod method;
        unsigned interval_ms;       /* cadence in time ... */
        unsigned interval_steps;    /* ... or in local steps, when > 0 */
        ConfigAddress listen;
        ConfigMember *members;      /* the same list, in the same order, on every member */
        size_t n_members;
        int payload;                /* a CollPayload (collective/coll-wire.h): how values travel */
        bool error_feedback;        /* int8: each round's quantization error carried into the next */
        bool take_parameters;       /* a stage takes the others' parameters before training (averaging_join) */
        bool outer;                 /* an outer optimizer on pseudo-gradients (averaging.outer) */
        double outer_lr, outer_momentum;
        bool outer_nesterov;
        unsigned fragments;         /* 1: every round syncs all values */
        unsigned group_size;        /* ring: the most members one round takes; wider rings average on a grid */
        unsigned join_timeout_ms, round_timeout_ms;
        unsigned grid_dims, grid_side; /* moshpit; 0: the smallest square-ish grid that holds everyone */
        int topology;               /* gossip: a GossipTopology (collective/topology.h) */
        double weight;              /* gossip and auto: the self weight w; 0: 1/|G| (the group's average) */
} ConfigAveraging;

#define CONFIG_MAX_CLUSTERS 1024
#define CONFIG_MAX_STAGES 64

/* One cluster of the pipeline plan: its nodes in stage order (key and
 * pipeline address) and where it cuts the model (layer indices). */
typedef struct ConfigCluster {
        ConfigMember *nodes;               /* n_stages of them */
        int bounds[CONFIG_MAX_STAGES + 1]; /* n_stages + 1: 0 < ... < layers */
        unsigned n_stages;
        unsigned stages_line;              /* of its stages in the file; 0: a coordinator's plan */
} ConfigCluster;

/* The model cut into stages across the nodes of clusters (see
 * ravnestd.conf(5), pipeline). */
typedef struct ConfigPipeline {
        bool enabled;
        int micro_batch, staleness, update_frequency;
        bool synchronous;
        bool weight_prediction; /* async: forward passes on the predicted weights (pipe.h) */
        long long synchronous_start; /* async: updates with no gradient late; -1: twice the job's warm-up */
        unsigned neighbour_timeout_s; /* a stage gives up on a neighbour gone (or not come) this long; 0: never */
        ConfigAddress listen;
        ConfigCluster *clusters;
        unsigned n_clusters;
} ConfigPipeline;

/* Membership (see ravnestd.conf(5), membership): a coordinator forms the
 * pipeline plan from the nodes that join it, instead of pipeline.clusters
 * and averaging.members. */
typedef struct ConfigMembership {
        bool enabled;
        ConfigMember coordinator;    /* its key and address */
        bool coordinate;             /* this node runs the coordinator */
        bool train;                  /* and trains (false: it only coordinates) */
        bool behind_nat;             /* it accepts no connections: it joins with no ports and dials every link */
        uint64_t memory;             /* bytes this node offers at most; 0: what the machine has */
        unsigned probe_ms;           /* the sgemm probe at start */
        unsigned min_nodes;          /* coordinator: the first plan waits for this many */
        unsigned settle_ms;          /* coordinator: quiet after a join or leave before a new plan */
        unsigned heartbeat_ms;       /* members: between heartbeats */
        unsigned deadline_ms;        /* coordinator: a member silent this long has left */
        unsigned handover_timeout_ms; /* coordinator: waiting for the layers of the old plan */
} ConfigMembership;

#define CONFIG_CONTROL_SOCKET "/run/ravnest/control"

/* Checkpoints of this node's training state (see ravnestd.conf(5),
 * checkpoint). */
typedef struct ConfigCheckpoint {
        unsigned interval_s;            /* 0: only on stop and on request */
        bool load;                      /* resume from the last checkpoint at start */
} ConfigCheckpoint;

/* The HTTP endpoint for Prometheus and people (see ravnestd.conf(5),
 * metrics): off unless the group is set. */
typedef struct ConfigMetrics {
        bool enabled;
        ConfigAddress listen;
        unsigned max_connections;       /* served at once; more wait to be accepted */
        unsigned timeout_s;             /* a request and its answer must go through within this long */
} ConfigMetrics;

/* This node relays links between nodes that accept no connections (see
 * ravnestd.conf(5), relay; net/relay.h): off unless the group is set. */
typedef struct ConfigRelay {
        bool enabled;
        ConfigAddress listen;
        unsigned max_links;
        unsigned max_links_per_addr;    /* waiting and relayed with an end at one address */
} ConfigRelay;

typedef struct Config {
        char path[PATH_MAX];            /* the file it was read from */
        char control_socket[PATH_MAX];  /* D-Bus object on a direct connection; "" for none */
        char state_directory[PATH_MAX]; /* the identity key is <state_directory>/identity */
        unsigned state_directory_line;  /* its line in path; 0: the default */
        char job[PATH_MAX];
        unsigned threads;               /* 0: the number of online CPUs */

        /* network */
        ConfigAddress listen;           /* port 0: do not listen */
        ConfigAddress *peers;
        size_t n_peers;
        ConfigAddress relay;            /* network.relay: the relay this node's links may go through; port 0: none */
        ConfigAdmission admission;
        char secret_file[PATH_MAX];     /* "" when not set */
        bool has_secret;                /* secret holds the contents of secret_file */
        uint8_t secret[HANDSHAKE_SECRET_SIZE];
        uint8_t (*allowed)[IDENTITY_PK_SIZE];
        size_t n_allowed;
        /* The transport's settings; identity, secret and allowed stay unset
         * here (config_net() fills them). */
        NetConfig net;

        ConfigAveraging averaging;
        ConfigPipeline pipeline;
        ConfigMembership membership;
        IdleSettings idle;
        ConfigCheckpoint checkpoint;
        ConfigMetrics metrics;
        ConfigRelay relay_server;
} Config;

/* The documented defaults; the transport's are net_config_defaults(). */
void config_defaults(Config *c);
/* Read path; *ret is untouched on failure. */
int config_load(const char *path, Config *ret, Diag *d);
/* state_directory is a directory this process may write, or one it can
 * create (its parent is): -errno with the file, the line and the setting
 * in d. It is not config_load()'s: ravnestctl reads the file too, as a
 * user who need not write there. The daemon's start and --check-config
 * run it. */
int config_check_state_directory(const Config *c, Diag *d);
/* The NetConfig for identity id. It points into c (secret, allowlist);
 * net_new() copies them. -EINVAL when c has no admission rule (a node that
 * neither listens nor has peers need not set one). */
int config_net(const Config *c, const Identity *id, NetConfig *ret, Diag *d);
/* What the file asks of the job it runs: every pipeline cluster cuts the
 * job's model whole. -EINVAL with the file, the line and the setting in d.
 * The daemon's start and --check-config both run it. */
int config_check_job(const Config *c, const Job *job, Diag *d);
/* The same for a pipeline from elsewhere (a coordinator's plan); source
 * names it in the message. */
int config_pipeline_fits_job(const ConfigPipeline *p, const char *source, const Job *job, Diag *d);
/* Free the lists and wipe the secret; c may be reused after config_defaults(). */
void config_free(Config *c);
/* Free n clusters and the nodes of each; NULL. */
ConfigCluster *config_clusters_free(ConfigCluster *clusters, unsigned n);
