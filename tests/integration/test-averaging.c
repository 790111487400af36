/* Failure semantics of a group all-reduce between real processes: a member
 * killed before sending, during reduce-scatter or during all-gather, one
 * that stops reading, and one that sends a forged piece. The survivors
 * finish or give up within the deadline; every piece holds either the
 * average over all four or its old value, never garbage and never a mix; the
 * next round averages the survivors exactly; a killed member that comes back
 * is averaged with again. */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../lib/proc.h"
#include "collective/coll.h"
#include "net/handshake.h"
#include "util/time-util.h"

#define N 4
#define LEN 200000 /* values: 4 chunks of 50000, pieces of 16 KiB (4096 values) */
#define PIECE_BYTES 16384

typedef enum Fault {
        KILL_BEFORE_SENDING,
        KILL_IN_REDUCE_SCATTER,
        KILL_IN_ALL_GATHER,
        STOP_READING,
        FORGED_PIECE,
} Fault;

static const uint8_t secret[HANDSHAKE_SECRET_SIZE] = "averaging failure test secret..";
static Identity ids[N];

/* What a member reports to the test for each round. */
typedef struct Report {
        int round;          /* 1, 2, 3 */
        int state, error;
        unsigned participants;
        uint64_t map;       /* who took part */
        size_t pieces, pieces_done;
        double seconds;     /* START (or start) to finished */
        char problem[200];  /* empty: values as they must be */
} Report;

static float value_of(unsigned member, size_t k) {
        return (float)((k * 7 + member * 13) % 101) / 8.0f - 6.0f + (float)member;
}

typedef struct Victim {
        Fault fault;
        Coll *c;
        CollRound *rd;
} Victim;

static void victim_hook(void *ud, uint8_t phase, unsigned sent) {
        Victim *v = ud;
        switch (v->fault) {
        case KILL_BEFORE_SENDING:
                if (phase == COLL_REDUCE_SCATTER && sent == 0)
                        raise(SIGKILL);
                break;
        case KILL_IN_REDUCE_SCATTER:
                /* 13 pieces of our own go out at once; the 16th is a sum we
                 * pass on, so START and our own pieces have left */
                if (phase == COLL_REDUCE_SCATTER && sent == 16)
                        raise(SIGKILL);
                break;
        case KILL_IN_ALL_GATHER:
                if (phase == COLL_ALL_GATHER && sent == 3)
                        raise(SIGKILL);
                break;
        case STOP_READING:
                if (phase == COLL_REDUCE_SCATTER && sent == 2)
                        for (;;)
                                pause(); /* alive, links open, reading nothing */
                break;
        case FORGED_PIECE:
                if (phase == COLL_REDUCE_SCATTER && sent == 0) {
                        /* a well-formed piece 0 full of NaN, ahead of the real one */
                        CollRoundInfo info;
                        coll_round_info(v->rd, &info);
                        static uint8_t buf[COLL_PIECE_HEADER + PIECE_BYTES];
                        uint32_t count = PIECE_BYTES / 4, bytes = sizeof buf;
                        coll_piece_encode(&(CollPiece){ .phase = COLL_REDUCE_SCATTER, .dtype = DTYPE_F32, .group = 1,
                                                        .index = 0, .count = count, .round = info.round }, buf);
                        float nan = NAN;
                        for (uint32_t i = 0; i < count; i++)
                                memcpy(buf + COLL_PIECE_HEADER + 4 * i, &nan, 4);
                        TensorDesc d;
                        tensor_desc_init(&d, DTYPE_U8, 1, &bytes);
                        int64_t peer = coll_peer(v->c, (info.rank + 1) % info.participants);
                        if (peer >= 0)
                                net_send_tensor(coll_net(v->c), (uint32_t)peer, 1, &d, buf, 0);
                }
                break;
        }
}

/* Check r's values (applied to a copy of x, and in out if the round wrote
 * its averages there) against the average over the members in `over`: per
 * piece, all averaged or all old. */
static void check_round(CollRound *rd, const float *x, const float *out, const bool *over, Report *rep) {
        CollRoundInfo info;
        coll_round_info(rd, &info);
        float *w = malloc(LEN * sizeof *w);
        memcpy(w, x, LEN * sizeof *w);
        coll_round_apply(rd, w);
        for (size_t i = 0; i < info.pieces && !rep->problem[0]; i++) {
                size_t off, len;
                bool done;
                coll_round_piece(rd, i, &off, &len, &done);
                for (size_t k = off; k < off + len; k++) {
                        double avg = 0;
                        unsigned n = 0;
                        for (unsigned m = 0; m < N; m++)
                                if (over[m]) {
                                        avg += value_of(m, k);
                                        n++;
                                }
                        avg /= n;
                        bool is_avg = fabs(w[k] - avg) < 1e-4, is_old = w[k] == x[k];
                        if (out && (done ? fabs(out[k] - avg) >= 1e-4 : out[k] != x[k])) {
                                snprintf(rep->problem, sizeof rep->problem,
                                         "output: piece %zu (%s) value %zu: %g, old %g, average %g", i,
                                         done ? "averaged" : "not averaged", k, out[k], x[k], avg);
                                break;
                        }
                        if (done ? !is_avg : !is_old) {
                                snprintf(rep->problem, sizeof rep->problem,
                                         "piece %zu (%s) value %zu: %g, old %g, average %g", i,
                                         done ? "averaged" : "not averaged", k, w[k], x[k], avg);
                                break;
                        }
                }
        }
        free(w);
}

static int run_member(unsigned self, Fault fault, bool victim, const uint16_t *ports, int report_fd, int rounds_from) {
        NetConfig nc;
        CollConfig cc;
        CollMember m[N] = {};
        Coll *c;
        int r;

        net_config_defaults(&nc);
        nc.identity = &ids[self];
        nc.secret = secret;
        nc.stall_timeout_ms = 2000;
        coll_config_defaults(&cc);
        for (unsigned i = 0; i < N; i++) {
                memcpy(m[i].id, ids[i].pk, IDENTITY_PK_SIZE);
                strcpy(m[i].host, "127.0.0.1");
                m[i].port = ports[i];
        }
        cc.net = &nc;
        cc.members = m;
        cc.n_members = N;
        cc.self = self;
        cc.piece_bytes = PIECE_BYTES;
        cc.join_timeout_ms = 2000;
        cc.round_timeout_ms = 3000;
        cc.redial_ms = 200;
        if ((r = coll_new(&cc, &c)) < 0 || (r = coll_listen(c, ports[self], NULL)) < 0)
                return r;

        float *x = malloc(LEN * sizeof *x);
        for (size_t k = 0; k < LEN; k++)
                x[k] = value_of(self, k);
        /* odd members take the averages in a buffer of theirs as they complete */
        float *out = self % 2 ? malloc(LEN * sizeof *out) : NULL;
        Victim v = { .fault = fault, .c = c };
        if (victim)
                coll_set_piece_hook(c, victim_hook, &v);

        /* everyone connected before round 1 (round 3: before the return) */
        for (int i = 0; i < 1000 && coll_n_connected(c) < N - 1; i++)
                coll_run(c, 5);
        for (int round = rounds_from; round <= 3; round++) {
                bool over[N];
                CollRound *rd;
                if (round == 3 && !victim) /* wait for the killed member to come back */
                        for (int i = 0; i < 2000 && coll_n_connected(c) < N - 1; i++)
                                coll_run(c, 5);
                uint64_t t0 = now_ns();
                if ((r = coll_round_start(c, 1, (unsigned[]){ 0, 1, 2, 3 }, N, x, LEN, 1, &rd)) < 0)
                        return r;
                if (out) {
                        memcpy(out, x, LEN * sizeof *out);
                        if ((r = coll_round_set_output(rd, out)) < 0)
                                return r;
                }
                v.rd = rd;
                while (!coll_round_finished(rd) && now_ns() - t0 < 30 * NSEC_PER_SEC)
                        coll_run(c, 5);
                Report rep = { .round = round };
                CollRoundInfo info;
                coll_round_info(rd, &info);
                rep.state = info.state;
                rep.error = info.error;
                rep.participants = info.participants;
                rep.map = info.participants_map;
                rep.pieces = info.pieces;
                rep.pieces_done = info.pieces_done;
                rep.seconds = ns_to_sec(now_ns() - t0);
                if (!coll_round_finished(rd))
                        snprintf(rep.problem, sizeof rep.problem, "round %d still running after 30 s", round);
                /* averages over the participants START named */
                for (unsigned i = 0; i < N; i++)
                        over[i] = info.participants_map & (1ull << i);
                if (!rep.problem[0] && info.participants > 1)
                        check_round(rd, x, out, over, &rep);
                if (!victim && write(report_fd, &rep, sizeof rep) != sizeof rep)
                        return -EIO;
                /* keep serving the others' last pieces */
                for (int i = 0; i < 40; i++)
                        coll_run(c, 5);
                coll_round_free(rd);
                if (victim && round == 2) /* the forger tried again, and was left out */
                        break;
        }
        /* stay until the test is done with us */
        for (;;)
                coll_run(c, 50);
}

static pid_t spawn(unsigned self, Fault fault, bool victim, const uint16_t *ports, int report_fd, int rounds_from) {
        pid_t pid = fork();
        if (pid == 0) {
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                int r = run_member(self, fault, victim, ports, report_fd, rounds_from);
                fprintf(stderr, "member %u: %s\n", self, strerror(-r));
                _exit(1);
        }
        return pid;
}

static void read_report(int fd, Report *rep) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        cr_assert_eq(poll(&p, 1, 60000), 1, "no report within 60 s: a member hangs");
        cr_assert_eq(read(fd, rep, sizeof *rep), (ssize_t)sizeof *rep);
}

static void scenario(Fault fault, unsigned victim) {
        uint16_t ports[N];
        int fds[2];
        pid_t pid[N];
        cr_assert_eq(pipe(fds), 0);
        for (unsigned i = 0; i < N; i++)
                identity_generate(&ids[i]);
        for (unsigned i = 0; i < N; i++)
                ports[i] = test_free_port();
        for (unsigned i = 0; i < N; i++)
                pid[i] = spawn(i, fault, i == victim, ports, fds[1], 1);

        /* round 1: the fault; round 2: without the victim. Members report
         * in any order. */
        uint64_t survivors = ((1ull << N) - 1) & ~(1ull << victim);
        for (unsigned k = 0; k < 2 * (N - 1); k++) {
                Report rep;
                read_report(fds[0], &rep);
                cr_log_info("fault %d round %d: state %d error %d, participants %#lx, %zu/%zu pieces, %.2f s\n", fault,
                            rep.round, rep.state, rep.error, (unsigned long)rep.map, rep.pieces_done, rep.pieces,
                            rep.seconds);
                cr_assert(rep.round == 1 || rep.round == 2);
                cr_assert(!rep.problem[0], "round %d: %s", rep.round, rep.problem);
                cr_assert(rep.state == COLL_ROUND_DONE || rep.state == COLL_ROUND_FAILED);
                /* the victim takes part in round 1 unless it died before START left */
                if (rep.round == 1)
                        cr_assert(rep.map == (1ull << N) - 1 || (fault == KILL_BEFORE_SENDING && rep.map == survivors),
                                  "round 1 participants %#lx", (unsigned long)rep.map);
                else {
                        cr_assert_eq(rep.state, COLL_ROUND_DONE, "round 2 error %d", rep.error);
                        cr_assert_eq(rep.map, survivors, "round 2 leaves the victim out");
                }
        }

        bool killed = fault <= KILL_IN_ALL_GATHER;
        if (killed) { /* the member comes back, with its identity, for round 3 */
                int status;
                waitpid(pid[victim], &status, 0);
                cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "the victim died as planned");
                pid[victim] = spawn(victim, fault, false, ports, fds[1], 3);
                for (unsigned k = 0; k < N; k++) {
                        Report rep;
                        read_report(fds[0], &rep);
                        cr_assert_eq(rep.round, 3);
                        cr_assert(!rep.problem[0], "round 3: %s", rep.problem);
                        cr_assert_eq(rep.state, COLL_ROUND_DONE, "round 3 error %d", rep.error);
                        cr_assert_eq(rep.map, (1ull << N) - 1, "the returning member takes part again");
                }
        }
        for (unsigned i = 0; i < N; i++) {
                kill(pid[i], SIGKILL);
                waitpid(pid[i], NULL, 0);
        }
        close(fds[0]);
        close(fds[1]);
}

/* the leader (member 0) itself dies, and later returns */
Test(averaging_failures, killed_before_sending, .timeout = 120) { scenario(KILL_BEFORE_SENDING, 0); }
Test(averaging_failures, killed_in_reduce_scatter, .timeout = 120) { scenario(KILL_IN_REDUCE_SCATTER, 0); }
Test(averaging_failures, killed_in_all_gather, .timeout = 120) { scenario(KILL_IN_ALL_GATHER, 0); }
Test(averaging_failures, stops_reading, .timeout = 120) { scenario(STOP_READING, 2); }
Test(averaging_failures, forged_piece, .timeout = 120) { scenario(FORGED_PIECE, 1); }
