/* cluster/plan.c — the signed plan on the wire (see plan.h and
 * ravnest-protocol(7), MEMBERSHIP):
 *
 *   offset size field
 *        0    4 magic "RVPL"
 *        4    1 version 1
 *        5    1 flags: bit 0 the synchronous schedule
 *        6    2 n_nodes (1..1024)
 *        8    8 epoch (1..2^48)
 *       16   32 signer: the coordinator's public key
 *       48    8 samples trained before this epoch
 *       56    2 n_layers (1..256)
 *       58    2 n_clusters (0..1024)
 *       60    4 micro_batch (1..65536)
 *       64    2 staleness (1..1024)
 *       66    2 update_frequency (1..1024)
 *       68    4 zero
 *       72      n_nodes x { key 32, pipeline port 2, averaging port 2, host length 1, host }
 *               n_clusters x { n_stages 1, n_stages x node index 2, n_stages + 1 x layer bound 2 }
 *       end-64 64 Ed25519 signature of every byte before it
 */
#include "plan.h"

#include <errno.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#define PLAN_MAGIC "RVPL"
#define PLAN_VERSION 1
#define PLAN_FLAG_SYNC 1u

static void put16(uint8_t *p, uint16_t v) {
        p[0] = (uint8_t)v;
        p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v) {
        for (int i = 0; i < 4; i++)
                p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
        for (int i = 0; i < 8; i++)
                p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get16(const uint8_t *p) {
        return (uint16_t)(p[0] | p[1] << 8);
}
static uint32_t get32(const uint8_t *p) {
        return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) {
        return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

Plan *plan_new(void) {
        return calloc(1, sizeof(Plan));
}

Plan *plan_free(Plan *p) {
        free(p);
        return NULL;
}

bool plan_host_valid(const char *host, size_t len) {
        static const char ok[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-:";
        if (len < 1 || len >= PLAN_HOST_MAX || host[0] == '-' || host[0] == '.')
                return false;
        for (size_t i = 0; i < len; i++)
                if (!host[i] || !strchr(ok, host[i]))
                        return false;
        return true;
}

static bool epoch_valid(uint64_t epoch) {
        return epoch >= 1 && epoch <= PLAN_EPOCH_MAX;
}

/* The rules on counts, nodes and cuts, shared by the encoder and the decoder. */
static int check_counts(uint64_t epoch, unsigned n_nodes, unsigned n_clusters, unsigned n_layers, unsigned mb,
                        unsigned tau, unsigned uf) {
        if (n_nodes > PLAN_MAX_NODES || n_clusters > PLAN_MAX_CLUSTERS || n_layers > PLAN_MAX_LAYERS)
                return -EMSGSIZE;
        if (!epoch_valid(epoch) || n_nodes < 1 || n_layers < 1 || mb < 1 || mb > 65536 || tau < 1 || tau > 1024 || uf < 1 ||
            uf > 1024)
                return -EINVAL;
        return 0;
}

static int check_clusters(const Plan *p) {
        bool used[PLAN_MAX_NODES] = {};
        for (unsigned k = 0; k < p->n_clusters; k++) {
                const PlanCluster *c = &p->clusters[k];
                if (c->n_stages > PLAN_MAX_STAGES)
                        return -EMSGSIZE;
                if (c->n_stages < 1 || c->n_stages > p->n_layers || c->bounds[0] != 0 ||
                    c->bounds[c->n_stages] != (int)p->n_layers)
                        return -EINVAL;
                for (unsigned s = 0; s < c->n_stages; s++) {
                        if (c->nodes[s] >= p->n_nodes || used[c->nodes[s]] || c->bounds[s + 1] <= c->bounds[s])
                                return -EINVAL;
                        used[c->nodes[s]] = true;
                }
        }
        return 0;
}

static int cmp_node_key(const void *a, const void *b, void *userdata) {
        const Plan *p = userdata;
        return memcmp(p->nodes[*(const uint16_t *)a].key, p->nodes[*(const uint16_t *)b].key, PLAN_KEY_SIZE);
}

/* No two nodes with one key. Every member checks a plan of up to a
 * thousand nodes: in key order (as a coordinator writes them) one pass,
 * else a sort, never every pair. */
static bool keys_unique(const Plan *p) {
        uint16_t order[PLAN_MAX_NODES];
        unsigned n = p->n_nodes;
        bool sorted = true;
        for (unsigned i = 0; i < n; i++) {
                order[i] = (uint16_t)i;
                if (i > 0 && sorted && memcmp(p->nodes[i - 1].key, p->nodes[i].key, PLAN_KEY_SIZE) >= 0)
                        sorted = false;
        }
        if (sorted)
                return true;
        qsort_r(order, n, sizeof *order, cmp_node_key, (void *)p);
        for (unsigned i = 1; i < n; i++)
                if (memcmp(p->nodes[order[i - 1]].key, p->nodes[order[i]].key, PLAN_KEY_SIZE) == 0)
                        return false;
        return true;
}

int plan_check(const Plan *p) {
        int r = check_counts(p->epoch, p->n_nodes, p->n_clusters, p->n_layers, p->micro_batch, p->staleness,
                             p->update_frequency);
        if (r < 0)
                return r;
        for (unsigned i = 0; i < p->n_nodes; i++) {
                const PlanNode *n = &p->nodes[i];
                size_t len = strnlen(n->host, PLAN_HOST_MAX);
                if (!plan_host_valid(n->host, len) || !n->pipeline_port != !n->averaging_port)
                        return -EINVAL;
        }
        if (!keys_unique(p))
                return -EINVAL;
        return check_clusters(p);
}

int plan_encode(const Plan *p, const uint8_t sk[PLAN_SK_SIZE], uint8_t *buf, size_t size) {
        size_t need = PLAN_HEADER_SIZE + PLAN_SIG_SIZE, at;
        int r = plan_check(p);
        if (r < 0)
                return -EINVAL;
        for (unsigned i = 0; i < p->n_nodes; i++)
                need += PLAN_KEY_SIZE + 5 + strlen(p->nodes[i].host);
        for (unsigned k = 0; k < p->n_clusters; k++)
                need += 1 + 2 * p->clusters[k].n_stages + 2 * (p->clusters[k].n_stages + 1);
        if (need > size || need > PLAN_MAX_BYTES)
                return -EMSGSIZE;
        if (sodium_init() < 0)
                return -EIO;

        memset(buf, 0, PLAN_HEADER_SIZE);
        memcpy(buf, PLAN_MAGIC, 4);
        buf[4] = PLAN_VERSION;
        buf[5] = p->synchronous ? PLAN_FLAG_SYNC : 0;
        put16(buf + 6, (uint16_t)p->n_nodes);
        put64(buf + 8, p->epoch);
        memcpy(buf + 16, p->signer, PLAN_KEY_SIZE);
        put64(buf + 48, p->samples);
        put16(buf + 56, (uint16_t)p->n_layers);
        put16(buf + 58, (uint16_t)p->n_clusters);
        put32(buf + 60, p->micro_batch);
        put16(buf + 64, (uint16_t)p->staleness);
        put16(buf + 66, (uint16_t)p->update_frequency);
        at = PLAN_HEADER_SIZE;
        for (unsigned i = 0; i < p->n_nodes; i++) {
                const PlanNode *n = &p->nodes[i];
                size_t len = strlen(n->host);
                memcpy(buf + at, n->key, PLAN_KEY_SIZE);
                put16(buf + at + 32, n->pipeline_port);
                put16(buf + at + 34, n->averaging_port);
                buf[at + 36] = (uint8_t)len;
                memcpy(buf + at + 37, n->host, len);
                at += 37 + len;
        }
        for (unsigned k = 0; k < p->n_clusters; k++) {
                const PlanCluster *c = &p->clusters[k];
                buf[at++] = (uint8_t)c->n_stages;
                for (unsigned s = 0; s < c->n_stages; s++, at += 2)
                        put16(buf + at, c->nodes[s]);
                for (unsigned s = 0; s <= c->n_stages; s++, at += 2)
                        put16(buf + at, (uint16_t)c->bounds[s]);
        }
        crypto_sign_detached(buf + at, NULL, buf, at, sk);
        return (int)(at + PLAN_SIG_SIZE);
}

int plan_decode(const uint8_t *buf, size_t len, const uint8_t signer[PLAN_KEY_SIZE], Plan *ret) {
        _cleanup_(plan_freep) Plan *p = NULL;
        size_t at, body;
        int r;

        if (len > PLAN_MAX_BYTES)
                return -EMSGSIZE;
        if (len < PLAN_HEADER_SIZE + PLAN_SIG_SIZE)
                return -EBADMSG;
        body = len - PLAN_SIG_SIZE;
        /* the signature first: nothing a forger wrote is parsed */
        if (sodium_init() < 0)
                return -EIO;
        if (memcmp(buf + 16, signer, PLAN_KEY_SIZE) != 0 ||
            crypto_sign_verify_detached(buf + body, buf, body, signer) != 0)
                return -EPERM;
        if (memcmp(buf, PLAN_MAGIC, 4) != 0 || buf[4] != PLAN_VERSION || (buf[5] & ~PLAN_FLAG_SYNC) ||
            get32(buf + 68) != 0)
                return -EBADMSG;
        p = plan_new();
        if (!p)
                return -ENOMEM;
        p->synchronous = buf[5] & PLAN_FLAG_SYNC;
        p->n_nodes = get16(buf + 6);
        p->epoch = get64(buf + 8);
        memcpy(p->signer, buf + 16, PLAN_KEY_SIZE);
        p->samples = get64(buf + 48);
        p->n_layers = get16(buf + 56);
        p->n_clusters = get16(buf + 58);
        p->micro_batch = get32(buf + 60);
        p->staleness = get16(buf + 64);
        p->update_frequency = get16(buf + 66);
        r = check_counts(p->epoch, p->n_nodes, p->n_clusters, p->n_layers, p->micro_batch, p->staleness,
                         p->update_frequency);
        if (r < 0)
                return r == -EINVAL ? -EBADMSG : r;

        at = PLAN_HEADER_SIZE;
        for (unsigned i = 0; i < p->n_nodes; i++) {
                PlanNode *n = &p->nodes[i];
                if (body - at < 37)
                        return -EBADMSG;
                size_t hl = buf[at + 36];
                if (body - at - 37 < hl || !plan_host_valid((const char *)buf + at + 37, hl))
                        return -EBADMSG;
                memcpy(n->key, buf + at, PLAN_KEY_SIZE);
                n->pipeline_port = get16(buf + at + 32);
                n->averaging_port = get16(buf + at + 34);
                memcpy(n->host, buf + at + 37, hl);
                n->host[hl] = '\0';
                at += 37 + hl;
        }
        for (unsigned k = 0; k < p->n_clusters; k++) {
                PlanCluster *c = &p->clusters[k];
                if (body - at < 1)
                        return -EBADMSG;
                c->n_stages = buf[at++];
                if (c->n_stages < 1 || c->n_stages > PLAN_MAX_STAGES)
                        return c->n_stages ? -EMSGSIZE : -EBADMSG;
                if (body - at < 4 * (size_t)c->n_stages + 2)
                        return -EBADMSG;
                for (unsigned s = 0; s < c->n_stages; s++, at += 2)
                        c->nodes[s] = get16(buf + at);
                for (unsigned s = 0; s <= c->n_stages; s++, at += 2)
                        c->bounds[s] = get16(buf + at);
        }
        if (at != body)
                return -EBADMSG;
        r = plan_check(p);
        if (r < 0)
                return r == -EINVAL ? -EBADMSG : r;
        memcpy(ret, p, sizeof *p);
        return 0;
}

int plan_find(const Plan *p, const uint8_t key[PLAN_KEY_SIZE], int *ret_index, unsigned *ret_cluster,
              unsigned *ret_stage) {
        int index = -1;
        for (unsigned i = 0; i < p->n_nodes && i < PLAN_MAX_NODES; i++)
                if (memcmp(p->nodes[i].key, key, PLAN_KEY_SIZE) == 0)
                        index = (int)i;
        if (ret_index)
                *ret_index = index;
        for (unsigned k = 0; index >= 0 && k < p->n_clusters; k++)
                for (unsigned s = 0; s < p->clusters[k].n_stages; s++)
                        if (p->clusters[k].nodes[s] == (unsigned)index) {
                                if (ret_cluster)
                                        *ret_cluster = k;
                                if (ret_stage)
                                        *ret_stage = s;
                                return 0;
                        }
        return -ENOENT;
}

/* JOIN: "RVMJ", version 1, host length 1, pipeline port 2, averaging port
 * 2, n_layers 2, epoch 8, n_params 8, memory 8, gflops 8, bandwidth 8,
 * latency 8 (IEEE 754 binary64), host. */
static uint64_t f64_bits(double v) {
        uint64_t u;
        memcpy(&u, &v, sizeof u);
        return u;
}
static double bits_f64(uint64_t u) {
        double v;
        memcpy(&v, &u, sizeof v);
        return v;
}

static bool link_figures_valid(double bandwidth, double latency) {
        return bandwidth > 0 && bandwidth <= 1e13 && latency >= 0 && latency <= 60; /* NaN fails both */
}

static bool join_values_ok(const PlanJoin *j, size_t host_len) {
        /* NaN fails every comparison */
        return j->gflops > 0 && j->gflops <= 1e6 && link_figures_valid(j->bandwidth, j->latency) && j->memory > 0 && j->n_layers >= 1 && j->n_layers <= PLAN_MAX_LAYERS &&
               j->n_params >= 1 && j->n_params <= (1ull << 40) && j->epoch <= PLAN_EPOCH_MAX &&
               j->micro_batch >= 1 && j->micro_batch <= 65536 &&
               !j->pipeline_port == !j->averaging_port &&
               plan_host_valid(j->host, host_len);
}

int plan_join_encode(const PlanJoin *j, uint8_t *buf, size_t size) {
        size_t hl = strnlen(j->host, PLAN_HOST_MAX);
        if (!join_values_ok(j, hl))
                return -EINVAL;
        if (size < 96 + hl)
                return -EMSGSIZE;
        memcpy(buf, "RVMJ", 4);
        buf[4] = 2;
        buf[5] = (uint8_t)hl;
        put16(buf + 6, j->pipeline_port);
        put16(buf + 8, j->averaging_port);
        put16(buf + 10, (uint16_t)j->n_layers);
        put64(buf + 12, j->epoch);
        put64(buf + 20, j->n_params);
        put64(buf + 28, j->memory);
        put64(buf + 36, f64_bits(j->gflops));
        put64(buf + 44, f64_bits(j->bandwidth));
        put64(buf + 52, f64_bits(j->latency));
        put32(buf + 60, j->micro_batch);
        memcpy(buf + 64, j->model, PLAN_MODEL_SIZE);
        memcpy(buf + 96, j->host, hl);
        return (int)(96 + hl);
}

int plan_join_decode(const uint8_t *buf, size_t len, PlanJoin *ret) {
        PlanJoin j = {};
        if (len < 96 || len > PLAN_JOIN_MAX_SIZE || memcmp(buf, "RVMJ", 4) != 0 || buf[4] != 2 ||
            len != 96 + (size_t)buf[5])
                return -EBADMSG;
        j.pipeline_port = get16(buf + 6);
        j.averaging_port = get16(buf + 8);
        j.n_layers = get16(buf + 10);
        j.epoch = get64(buf + 12);
        j.n_params = get64(buf + 20);
        j.memory = get64(buf + 28);
        j.gflops = bits_f64(get64(buf + 36));
        j.bandwidth = bits_f64(get64(buf + 44));
        j.latency = bits_f64(get64(buf + 52));
        j.micro_batch = get32(buf + 60);
        memcpy(j.model, buf + 64, PLAN_MODEL_SIZE);
        memcpy(j.host, buf + 96, buf[5]);
        if (!join_values_ok(&j, buf[5]))
                return -EBADMSG;
        *ret = j;
        return 0;
}

unsigned plan_micro_batch(const unsigned *asked, unsigned n) {
        unsigned best = 0, best_n = 0;
        for (unsigned i = 0; i < n; i++) {
                unsigned k = 0;
                for (unsigned j = 0; j < n; j++)
                        k += asked[j] == asked[i];
                if (k > best_n || (k == best_n && asked[i] < best)) {
                        best = asked[i];
                        best_n = k;
                }
        }
        return best;
}

void plan_link_encode(double bandwidth, double latency, uint8_t buf[PLAN_LINK_SIZE]) {
        memcpy(buf, "RVML", 4);
        put64(buf + 4, f64_bits(bandwidth));
        put64(buf + 12, f64_bits(latency));
}

int plan_link_decode(const uint8_t *buf, size_t len, double *ret_bandwidth, double *ret_latency) {
        if (len != PLAN_LINK_SIZE || memcmp(buf, "RVML", 4) != 0)
                return -EBADMSG;
        double bw = bits_f64(get64(buf + 4)), lat = bits_f64(get64(buf + 12));
        if (!link_figures_valid(bw, lat))
                return -EBADMSG;
        *ret_bandwidth = bw;
        *ret_latency = lat;
        return 0;
}

void plan_reach_encode(int error, uint8_t buf[PLAN_REACH_SIZE]) {
        memcpy(buf, "RVMR", 4);
        put32(buf + 4, 0);
        put32(buf + 8, (uint32_t)error);
}

int plan_reach_decode(const uint8_t *buf, size_t len, int *ret_error) {
        if (len != PLAN_REACH_SIZE || memcmp(buf, "RVMR", 4) != 0 || get32(buf + 4) != 0 || get32(buf + 8) >= 4096)
                return -EBADMSG;
        *ret_error = (int)get32(buf + 8);
        return 0;
}

void plan_stop_encode(uint64_t epoch, bool hand_in, uint8_t buf[PLAN_STOP_SIZE]) {
        memcpy(buf, "RVMS", 4);
        put64(buf + 4, epoch);
        buf[12] = hand_in;
}

int plan_stop_decode(const uint8_t *buf, size_t len, uint64_t *ret_epoch, bool *ret_hand_in) {
        if (len != PLAN_STOP_SIZE || memcmp(buf, "RVMS", 4) != 0 || !epoch_valid(get64(buf + 4)) || buf[12] > 1)
                return -EBADMSG;
        *ret_epoch = get64(buf + 4);
        *ret_hand_in = buf[12];
        return 0;
}

void plan_done_encode(uint64_t epoch, uint64_t samples, uint8_t buf[PLAN_DONE_SIZE]) {
        memcpy(buf, "RVMD", 4);
        put64(buf + 4, epoch);
        put64(buf + 12, samples);
}

int plan_done_decode(const uint8_t *buf, size_t len, uint64_t *ret_epoch, uint64_t *ret_samples) {
        if (len != PLAN_DONE_SIZE || memcmp(buf, "RVMD", 4) != 0 || !epoch_valid(get64(buf + 4)) ||
            get64(buf + 12) > (1ull << 50))
                return -EBADMSG;
        *ret_epoch = get64(buf + 4);
        *ret_samples = get64(buf + 12);
        return 0;
}
