/* tests/lib/coll-swarm.c — see coll-swarm.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll-swarm.h"
#include "net/handshake.h"

static const uint8_t secret[HANDSHAKE_SECRET_SIZE] = { 7, 7, 7 };

int swarm_init(Swarm *s, unsigned n, const CollConfig *tmpl, bool plaintext) {
        static NetConfig nc[16];
        CollMember m[16] = {};
        int r;

        memset(s, 0, sizeof *s);
        s->n = n;
        for (unsigned i = 0; i < n; i++) {
                identity_generate(&s->node[i].id);
                memcpy(m[i].id, s->node[i].id.pk, IDENTITY_PK_SIZE);
                snprintf(m[i].host, sizeof m[i].host, "127.0.0.1");
        }
        for (unsigned i = 0; i < n; i++) {
                CollConfig c = *tmpl;
                net_config_defaults(&nc[i]);
                nc[i].identity = &s->node[i].id;
                nc[i].secret = secret;
                nc[i].plaintext = plaintext;
                c.net = &nc[i];
                c.members = m;
                c.n_members = n;
                c.self = i;
                r = coll_new(&c, &s->node[i].coll);
                if (r < 0)
                        return r;
                r = coll_listen(s->node[i].coll, 0, &m[i].port);
                if (r < 0)
                        return r;
                s->node[i].swarm = s;
                s->node[i].index = i;
        }
        for (unsigned i = 0; i < n; i++)
                for (unsigned j = 0; j < n; j++)
                        coll_set_address(s->node[i].coll, j, "127.0.0.1", m[j].port);
        return 0;
}

/* One round of group g, then forwarding until every member is through. */
static void node_round(SwarmNode *nd, uint32_t g, unsigned through) {
        Swarm *s = nd->swarm;
        unsigned members[16];
        CollRound *rd = NULL;

        for (unsigned i = 0; i < s->n; i++)
                members[i] = i;
        if (coll_round_start(nd->coll, g, members, s->n, nd->x, nd->len, nd->weight, &rd) < 0 ||
            (nd->out && coll_round_set_output(rd, nd->out) < 0) ||
            (nd->feedback && coll_round_set_feedback(rd, nd->feedback) < 0)) {
                nd->info.state = COLL_ROUND_FAILED;
                atomic_fetch_add(&s->finished, 1);
        } else {
                while (!coll_round_finished(rd))
                        coll_run(nd->coll, 5);
                coll_round_info(rd, &nd->info);
                if (nd->avg && coll_round_read(rd, 0, nd->len, nd->avg) < 0) {
                        free(nd->avg);
                        nd->avg = NULL;
                }
                if (nd->w)
                        coll_round_apply(rd, nd->w);
                atomic_fetch_add(&s->finished, 1);
        }
        /* Keep forwarding for the others until everyone is through. */
        while (atomic_load(&s->finished) < through)
                coll_run(nd->coll, 2);
        coll_round_free(rd);
}

/* A node's thread: its rounds one after another (io_uring wants one
 * thread to submit all of a Net's work), then the goodbyes. */
static void *node_main(void *arg) {
        SwarmNode *nd = arg;
        Swarm *s = nd->swarm;
        unsigned rounds = s->rounds ? s->rounds : 1;

        for (int i = 0; i < 5000 && coll_n_connected(nd->coll) < s->n - 1; i++)
                coll_run(nd->coll, 2);
        for (unsigned k = 0; k < rounds; k++) {
                node_round(nd, s->group + k, s->n * (k + 1));
                if (nd->history && nd->avg)
                        memcpy(nd->history + (size_t)k * nd->len, nd->avg, nd->len * sizeof *nd->avg);
        }
        for (int i = 0; i < 20; i++)
                coll_run(nd->coll, 1);
        atomic_fetch_add(&s->leaving, 1);
        while (atomic_load(&s->leaving) < s->n)
                coll_run(nd->coll, 1);
        return NULL;
}

int swarm_round(Swarm *s) {
        atomic_store(&s->finished, 0);
        atomic_store(&s->leaving, 0);
        for (unsigned i = 0; i < s->n; i++)
                if (pthread_create(&s->node[i].thread, NULL, node_main, &s->node[i]) != 0)
                        return -EAGAIN;
        for (unsigned i = 0; i < s->n; i++)
                pthread_join(s->node[i].thread, NULL);
        s->group += s->rounds ? s->rounds : 1;
        return 0;
}

void swarm_free(Swarm *s) {
        for (unsigned i = 0; i < s->n; i++)
                s->node[i].coll = coll_free(s->node[i].coll);
}
