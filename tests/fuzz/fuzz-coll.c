/* fuzz-coll.c — libFuzzer harness for what an averaging peer sends: READY,
 * START and ABORT messages and the pieces of a round, given to a member's
 * round state machine as its links would.
 *
 * Member 1 of four starts a round. The input's first two bytes make a START
 * from the leader (who takes part, which round), so most inputs reach the
 * running state; then comes a sequence of messages, each [sender (1 byte)]
 * [kind (1 byte)] [length (2 bytes LE)] [payload]: kind 0 is a CONTROL
 * payload, kind 1 a TENSOR payload (a piece with its header), kind 2 a piece
 * whose header is built from the payload's first 4 bytes (phase, index,
 * count) with the current round, values following.
 * The other members' links are marked up without sockets, so nothing is
 * really sent: a send fails and the round gives up, as with a lost link.
 * Whatever arrives, every piece reported complete must hold finite values,
 * and the bytes of pieces not complete must be untouched by the apply.
 *
 *     build-fuzz/tests/fuzz/fuzz-coll -max_total_time=60 build-fuzz/corpus/coll
 */
#include <math.h>
#include <string.h>

#include "collective/coll-internal.h"
#include "fuzz.h"
#include "net/handshake.h"

#define LEN 1000

static Coll *coll;
static float x[LEN];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        static Identity id;
        static NetConfig nc;
        static CollMember m[4];
        CollConfig c;
        static const uint8_t secret[HANDSHAKE_SECRET_SIZE] = { 1 };

        identity_generate(&id);
        net_config_defaults(&nc);
        nc.identity = &id;
        nc.secret = secret;
        nc.backend = NET_BACKEND_EPOLL; /* cheap to create, nothing is sent anyway */
        coll_config_defaults(&c);
        for (int i = 0; i < 4; i++) {
                m[i].id[0] = (uint8_t)i;
                strcpy(m[i].host, "127.0.0.1");
        }
        memcpy(m[1].id, id.pk, IDENTITY_PK_SIZE);
        c.net = &nc;
        c.members = m;
        c.n_members = 4;
        c.self = 1;
        c.piece_bytes = 4096; /* 1000 values: chunks of 250, one piece each */
        CHECK(coll_new(&c, &coll) == 0);
        for (unsigned i = 0; i < 4; i++)
                if (i != 1) {
                        coll->members[i].up = true;
                        coll->members[i].peer = 1000 + i; /* no such link: sends fail */
                }
        for (int i = 0; i < LEN; i++)
                x[i] = (float)i / 7.0f;
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        CollRound *r;
        static float w[LEN];

        /* every input starts from the same state */
        coll->n_readies = 0;
        coll->n_groups = 0;
        coll_early_clear(coll);
        for (unsigned i = 0; i < 4; i++)
                coll->members[i].banned_until_ns = 0;
        CHECK(coll_round_start(coll, 1, (unsigned[]){ 0, 1, 2, 3 }, 4, x, LEN, 1.0, &r) == 0);
        if (size >= 2) {
                CollStart st = { .group = 1, .round = 1 + data[1] % 4, .participants = (data[0] & 0xf) | 3 };
                st.n = (unsigned)__builtin_popcountll(st.participants);
                for (unsigned i = 0; i < st.n; i++)
                        st.weights[i] = 1 + i;
                (void)round_on_start(coll, 0, &st);
                data += 2;
                size -= 2;
        }
        while (size >= 4) {
                unsigned sender = data[0] % 4, kind = data[1] % 3;
                size_t len = (size_t)data[2] | (size_t)data[3] << 8;
                data += 4;
                size -= 4;
                if (len > size)
                        len = size;
                if (sender == 1)
                        sender = 0;
                if (kind == 0) {
                        CollCtl m;
                        if (coll_ctl_decode(data, len, &m) == 0) {
                                if (m.kind == COLL_READY)
                                        round_on_ready(coll, sender, &m.ready);
                                else if (m.kind == COLL_START)
                                        (void)round_on_start(coll, sender, &m.start);
                                else if (m.kind == COLL_ABORT) /* MODEL, STATE_*: not a round's */
                                        round_on_abort(coll, sender, &m.abort);
                        }
                } else {
                        CollPiece h;
                        NetTensor *t = calloc(1, sizeof *t);
                        CHECK(t);
                        size_t bytes = kind == 2 ? COLL_PIECE_HEADER + (len > 4 ? (len - 4) & ~(size_t)3 : 0) : len;
                        t->data = malloc(bytes ? bytes : 1);
                        CHECK(t->data);
                        if (kind == 2 && len >= 4) {
                                CollRoundInfo now;
                                coll_round_info(r, &now);
                                coll_piece_encode(&(CollPiece){ .phase = 1 + (data[0] & 1), .dtype = DTYPE_F32,
                                                                .group = 1, .index = data[1] % 8,
                                                                .count = (uint32_t)((bytes - COLL_PIECE_HEADER) / 4),
                                                                .round = now.round },
                                                  t->data);
                                memcpy(t->data + COLL_PIECE_HEADER, data + 4, bytes - COLL_PIECE_HEADER);
                        } else if (kind != 2)
                                memcpy(t->data, data, len);
                        else
                                bytes = 0;
                        t->desc.bytes = bytes;
                        t->peer = 1000 + sender;
                        if (coll_piece_decode(t->data, len, &h) == 0)
                                (void)round_on_piece(coll, sender, &h, t); /* consumes t */
                        else
                                net_tensor_release(coll_net(coll), t);
                }
                data += len;
                size -= len;
        }

        CollRoundInfo info;
        coll_round_info(r, &info);
        CHECK(info.pieces_done <= info.pieces);
        memcpy(w, x, sizeof w);
        coll_round_apply(r, w);
        for (size_t i = 0; i < info.pieces; i++) {
                size_t off, n;
                bool done;
                CHECK(coll_round_piece(r, i, &off, &n, &done) == 0);
                CHECK(off + n <= LEN);
                for (size_t k = off; k < off + n; k++)
                        CHECK(done ? isfinite(w[k]) : w[k] == x[k]);
        }
        coll_round_free(r);
        /* a round whose sends all failed holds nothing of the Net */
        round_tick(coll, 0);
        CHECK(coll->rounds == NULL);
        return 0;
}
