/* fuzz-handshake.c — libFuzzer harness for the handshake state machine.
 *
 * One initiator and one responder, each with an admission setup the input
 * chooses, exchange messages in an order the input chooses: genuine
 * messages from the other side (as they are, altered, cut, retyped, sent
 * twice or reflected back to their sender), messages of a complete earlier
 * handshake between the same identities (a recording), and messages made of
 * fuzz bytes. Genuine messages let the fuzzer reach every state; the rest
 * is what an attacker on the path can do. A side may also turn malicious
 * while keeping its identity and secret: it sends an ephemeral key of the
 * input's choice (such as a low-order point) or picks a cipher itself.
 *
 * What must hold, or the harness abort()s so libFuzzer reports it:
 *   - no crash, no out-of-bounds access (ASan), no undefined behaviour (UBSan);
 *   - handshake_recv() fails only with a documented error, and then the state
 *     is HS_FAILED; handshake_next() fails only with -ENOBUFS, which leaves
 *     the state and the buffer alone, or with an error that leaves HS_FAILED;
 *   - a side in HS_DONE has the genuine peer's identity, that peer holds this
 *     side's network secret and is on its allowlist (when it has them), and
 *     the cipher is the best both accept: fuzz bytes, a recording or an
 *     altered message never complete a handshake, and never downgrade it;
 *   - a peer whose ephemeral key gives no shared secret is never admitted,
 *     and a cipher a malicious responder picks is one the initiator accepts;
 *   - when both sides are done (and honest), their keys match and a WELCOME
 *     sealed by the responder opens at the initiator.
 *
 * Input: 2 bytes of configuration, then records of one op byte and its
 * arguments (see the OP_* below). randombytes is replaced by a
 * deterministic generator reset for every input, so a crash reproduces;
 * FUZZ_TRACE=1 in the environment prints every step of it.
 *
 *     build-fuzz/tests/fuzz/fuzz-handshake -max_total_time=60 build-fuzz/corpus/handshake
 */
#include <errno.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdint.h>

#include "fuzz-rng.h"
#include "fuzz.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/frame.h"
#include "net/handshake.h"
#include "net/identity.h"
#include "net/seal.h"



#define MAX_OPS 64

static bool tracing;
#define TRACE(...)                                                                                 \
        do {                                                                                       \
                if (tracing)                                                                       \
                        fprintf(stderr, __VA_ARGS__);                                              \
        } while (0)

static const char *state_name(HandshakeState s) {
        static const char *const names[] = {
                [HS_SEND_HELLO] = "send-hello", [HS_WAIT_HELLO] = "wait-hello",
                [HS_WAIT_REPLY] = "wait-reply", [HS_SEND_REPLY] = "send-reply",
                [HS_SEND_AUTH] = "send-auth",   [HS_WAIT_AUTH] = "wait-auth",
                [HS_DONE] = "done",             [HS_FAILED] = "failed",
        };
        return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "?";
}

static const char *side_name(const Handshake *hs) {
        return hs->initiator ? "initiator" : "responder";
}

/* Ephemeral keys and nonces come from randombytes; with the system's a crash
 * found on one run would not reproduce on the next: fuzz-rng.h's, reset for
 * every input. */

/* ---- the cast ---------------------------------------------------------------
 * alice or carol initiates, bob responds. carol is on an allowlist only
 * where the input puts her, as the one identity that is not the peer's. */
enum { ALICE, BOB, CAROL, _N_IDS };
static Identity ids[_N_IDS];
static const uint8_t secrets[2][HANDSHAKE_SECRET_SIZE] = { { 's', '0' }, { 's', '1' } };
static uint32_t ciphers_here; /* what this CPU runs, plus CIPHER_NONE */

/* A complete handshake between alice and bob from another run. */
static struct {
        uint8_t type;
        uint8_t buf[HANDSHAKE_MAX_SIZE];
        size_t len;
} recording[3];

typedef struct Side {
        Handshake hs;
        HandshakeConfig cfg;
        int secret; /* index into secrets[], -1: none */
        uint8_t allowed[2][IDENTITY_PK_SIZE];
        /* Set by OP_EVIL: this side sent an ephemeral key of the input's
         * choice (low_order: one with no shared secret), or chose a cipher
         * that is not the best both accept. */
        bool forged_eph, low_order, forged_cipher;
        /* The last message handshake_next() gave. */
        uint8_t out_type;
        uint8_t out[HANDSHAKE_MAX_SIZE];
        size_t out_len;
} Side;

/* The responder's rule (handshake.c): plaintext when both sides offer it
 * (both were configured for it, on loopback), else the strongest shared. */
static Cipher best_cipher(uint32_t both) {
        if (both & CIPHER_BIT(CIPHER_NONE))
                return CIPHER_NONE;
        if (both & CIPHER_BIT(CIPHER_AES256GCM))
                return CIPHER_AES256GCM;
        if (both & CIPHER_BIT(CIPHER_CHACHA20POLY1305))
                return CIPHER_CHACHA20POLY1305;
        return _CIPHER_MAX;
}

/* 2 bits of secret, 2 bits of allowlist, 3 bits of ciphers. */
static void side_setup(Side *s, const Identity *id, unsigned secret_sel, unsigned allow_sel,
                       unsigned cipher_sel, const Identity *on_list) {
        static const int secret_of[4] = { -1, 0, 1, 0 };
        size_t n = 0;

        memset(s, 0, sizeof *s);
        s->secret = secret_of[secret_sel & 3];
        if ((allow_sel & 3) == 1 || (allow_sel & 3) == 3)
                memcpy(s->allowed[n++], on_list->pk, IDENTITY_PK_SIZE);
        if ((allow_sel & 3) >= 2)
                memcpy(s->allowed[n++], ids[CAROL].pk, IDENTITY_PK_SIZE);
        if (s->secret < 0 && n == 0) /* handshake_init() refuses a side that admits anyone */
                s->secret = 0;

        s->cfg = (HandshakeConfig){
                .identity = id,
                .secret = s->secret >= 0 ? secrets[s->secret] : NULL,
                .allowed = (const uint8_t(*)[IDENTITY_PK_SIZE])s->allowed,
                .n_allowed = n,
                .ciphers = (cipher_sel & 7) & ciphers_here,
        };
        if (s->cfg.ciphers == 0)
                s->cfg.ciphers = CIPHER_BIT(CIPHER_CHACHA20POLY1305);
}

static bool on_allowlist(const Side *s, const uint8_t pk[IDENTITY_PK_SIZE]) {
        for (size_t i = 0; i < s->cfg.n_allowed; i++)
                if (memcmp(s->allowed[i], pk, IDENTITY_PK_SIZE) == 0)
                        return true;
        return false;
}

/* ---- the checks ------------------------------------------------------------ */

static void check_recv(Side *s, uint8_t type, const uint8_t *in, size_t len) {
        HandshakeState before = s->hs.state;
        /* A copy of exactly len bytes, so ASan sees a read past the message. */
        uint8_t *copy = malloc(len ? len : 1);
        CHECK(copy);
        if (len)
                memcpy(copy, in, len);

        int r = handshake_recv(&s->hs, type, copy, len);
        free(copy);
        TRACE("%s: recv type %u, %zu bytes: %s -> %s, %d\n", side_name(&s->hs), type, len,
              state_name(before), state_name(s->hs.state), r);

        if (r < 0) {
                CHECK(r == -EBADMSG || r == -EACCES || r == -EPROTO || r == -EOPNOTSUPP || r == -EKEYREJECTED);
                CHECK(s->hs.state == HS_FAILED);
                return;
        }
        CHECK(r == 0);
        switch (before) {
        case HS_WAIT_HELLO:
                CHECK(!s->hs.initiator && type == FRAME_HELLO && s->hs.state == HS_SEND_REPLY);
                break;
        case HS_WAIT_REPLY:
                CHECK(s->hs.initiator && type == FRAME_HELLO_REPLY && s->hs.state == HS_SEND_AUTH);
                break;
        case HS_WAIT_AUTH:
                CHECK(!s->hs.initiator && type == FRAME_AUTH && s->hs.state == HS_DONE);
                break;
        default:
                CHECK(!"a message was accepted in a state that waits for none");
        }
}

static void check_next(Side *s, size_t cap) {
        HandshakeState before = s->hs.state;
        uint8_t type = 0;
        /* Exactly cap bytes, so ASan sees a write past the buffer. */
        uint8_t *buf = malloc(cap ? cap : 1);
        CHECK(buf);
        memset(buf, 0xa5, cap ? cap : 1);

        int r = handshake_next(&s->hs, &type, buf, cap);
        TRACE("%s: next, cap %zu: %s -> %s, %d (type %u)\n", side_name(&s->hs), cap, state_name(before),
              state_name(s->hs.state), r, type);
        if (r == -ENOBUFS) {
                /* The one error that is not final: retry with a bigger buffer. */
                CHECK(s->hs.state == before);
                for (size_t i = 0; i < cap; i++)
                        CHECK(buf[i] == 0xa5);
        } else if (r < 0) {
                CHECK(s->hs.state == HS_FAILED);
        } else if (r == 0) {
                CHECK(s->hs.state == before);
                CHECK(before != HS_SEND_HELLO && before != HS_SEND_REPLY && before != HS_SEND_AUTH);
        } else {
                CHECK((size_t)r <= cap);
                switch (before) {
                case HS_SEND_HELLO:
                        CHECK(type == FRAME_HELLO && r == HANDSHAKE_HELLO_SIZE);
                        CHECK(s->hs.state == HS_WAIT_REPLY);
                        CHECK(get_le32(buf) == s->cfg.ciphers);
                        break;
                case HS_SEND_REPLY:
                        CHECK(type == FRAME_HELLO_REPLY && r == HANDSHAKE_REPLY_SIZE);
                        CHECK(s->hs.state == HS_WAIT_AUTH);
                        break;
                case HS_SEND_AUTH:
                        CHECK(type == FRAME_AUTH && r == HANDSHAKE_AUTH_SIZE);
                        CHECK(s->hs.state == HS_DONE);
                        break;
                default:
                        CHECK(!"a message was produced in a state that sends none");
                }
                CHECK(frame_type_is_handshake(type));
                s->out_type = type;
                memcpy(s->out, buf, (size_t)r);
                s->out_len = (size_t)r;
        }
        free(buf);
}

/* s is done: it must have admitted exactly the genuine peer, on its terms. */
static void check_admitted(const Side *s, const Side *peer) {
        Cipher c;
        uint8_t tx[SEAL_KEY_SIZE], rx[SEAL_KEY_SIZE], who[IDENTITY_PK_SIZE];

        handshake_result(&s->hs, &c, tx, rx, who);
        CHECK(memcmp(who, peer->cfg.identity->pk, IDENTITY_PK_SIZE) == 0);
        if (s->secret >= 0)
                CHECK(peer->secret == s->secret);
        if (s->cfg.n_allowed > 0)
                CHECK(on_allowlist(s, who));
        /* (A responder that forged its choice has only itself to blame.) */
        if (!s->forged_cipher)
                CHECK(c < _CIPHER_MAX && (s->cfg.ciphers & CIPHER_BIT(c)));
        /* A responder that picks a weaker cipher than both accept cannot be
         * caught: the initiator does not know what the responder accepts. */
        if (!s->forged_cipher && !peer->forged_cipher)
                CHECK(c == best_cipher(s->cfg.ciphers & peer->cfg.ciphers));
        CHECK(!peer->low_order);
}

/* Both done: the same keys, crossed, and a working first protected frame. */
static void check_link(const Side *ini, const Side *resp) {
        Cipher ci, cr;
        uint8_t itx[SEAL_KEY_SIZE], irx[SEAL_KEY_SIZE], rtx[SEAL_KEY_SIZE], rrx[SEAL_KEY_SIZE];
        uint8_t who[IDENTITY_PK_SIZE], hdr[FRAME_HEADER_SIZE], tag[FRAME_TAG_SIZE] = {};
        uint8_t payload[8] = "welcome";
        FrameHeader h = { .type = FRAME_WELCOME }, h2;
        static const FrameLimits limits = { .max_payload = 64, .max_control = 64, .max_tensor_bytes = 64 };
        Seal rs, is;

        handshake_result(&ini->hs, &ci, itx, irx, who);
        handshake_result(&resp->hs, &cr, rtx, rrx, who);
        CHECK(ci == cr);
        CHECK(memcmp(itx, rrx, SEAL_KEY_SIZE) == 0 && memcmp(irx, rtx, SEAL_KEY_SIZE) == 0);
        CHECK(memcmp(itx, irx, SEAL_KEY_SIZE) != 0);

        CHECK(seal_init(&rs, cr, rtx, rrx) == 0);
        CHECK(seal_init(&is, ci, itx, irx) == 0);
        seal_frame(&rs, &h, hdr, payload, sizeof payload, tag);
        CHECK(frame_header_decode(hdr, &limits, &h2) == 0);
        CHECK(seal_open(&is, hdr, &h2, payload, sizeof payload, tag) == 0);
        CHECK(memcmp(payload, "welcome", sizeof payload) == 0);
        TRACE("link up: %s\n", cipher_to_string(ci));
        seal_clear(&rs);
        seal_clear(&is);
}

static void check_invariants(const Side *ini, const Side *resp) {
        if (handshake_done(&ini->hs))
                check_admitted(ini, resp);
        if (handshake_done(&resp->hs))
                check_admitted(resp, ini);
        /* A forged ephemeral key has no secret key behind it: the keys differ. */
        if (handshake_done(&ini->hs) && handshake_done(&resp->hs) && !ini->forged_eph && !resp->forged_eph)
                check_link(ini, resp);
}

/* ---- set up once ------------------------------------------------------------ */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        Side a, b;

        /* Before sodium_init(), which would otherwise pick the system's. */
        CHECK(randombytes_set_implementation(&fuzz_rng) == 0);
        CHECK(sodium_init() >= 0);
        tracing = getenv("FUZZ_TRACE");
        fuzz_rng_reset(0x1d);
        for (int i = 0; i < _N_IDS; i++)
                CHECK(identity_generate(&ids[i]) == 0);
        ciphers_here = cipher_available() | CIPHER_BIT(CIPHER_NONE);

        /* The recording: a handshake that succeeds, so a replay of it would
         * be accepted if a fresh handshake did not bind everything to its own
         * ephemeral keys. A different key than the inputs' makes its
         * ephemeral keys differ from theirs. */
        fuzz_rng_reset(0x2e);
        TRACE("the recording:\n");
        side_setup(&a, &ids[ALICE], 1, 1, 7, &ids[BOB]);
        side_setup(&b, &ids[BOB], 1, 1, 7, &ids[ALICE]);
        CHECK(handshake_init(&a.hs, &a.cfg, true) == 0);
        CHECK(handshake_init(&b.hs, &b.cfg, false) == 0);
        for (int i = 0; i < 3; i++) {
                Side *from = i == 1 ? &b : &a, *to = i == 1 ? &a : &b;
                check_next(from, HANDSHAKE_MAX_SIZE);
                CHECK(from->out_len > 0);
                recording[i].type = from->out_type;
                recording[i].len = from->out_len;
                memcpy(recording[i].buf, from->out, from->out_len);
                check_recv(to, from->out_type, from->out, from->out_len);
        }
        CHECK(handshake_done(&a.hs) && handshake_done(&b.hs));
        check_invariants(&a, &b);
        handshake_clear(&a.hs);
        handshake_clear(&b.hs);
        return 0;
}

/* ---- one input ---------------------------------------------------------------- */

typedef struct Reader {
        const uint8_t *p;
        size_t n;
} Reader;

static bool take(Reader *r, uint8_t *ret) {
        if (r->n == 0)
                return false;
        *ret = *r->p++;
        r->n--;
        return true;
}

/* An op byte's top bit picks the side it acts on, the rest the op; the
 * arguments follow it. */
enum {
        OP_NEXT,      /* handshake_next() with a full buffer */
        OP_NEXT_CAP,  /* cap: handshake_next() with cap bytes */
        OP_SEND,      /* how, args: deliver the side's last message to the other side */
        OP_FUZZ,      /* type, len, bytes: a message made of fuzz bytes, to the side */
        OP_REPLAY,    /* which: a message of the recording, to the side */
        OP_EVIL,      /* what, args: the side turns malicious */
        _OP_MAX,
};

enum {
        SEND_AS_IS,
        SEND_FLIP,    /* pos, xor: one byte changed */
        SEND_CUT,     /* len: shortened (or left as is if not shorter) */
        SEND_EXTEND,  /* byte: one byte more */
        SEND_RETYPE,  /* type: the same bytes as another type */
        SEND_REFLECT, /* back to the side that sent it */
        _SEND_MAX,
};

static void op_send(Reader *rd, Side *from, Side *to) {
        uint8_t how = 0, a = 0, b = 0, type = from->out_type;
        uint8_t msg[HANDSHAKE_MAX_SIZE + 1];
        size_t len = from->out_len;

        (void)take(rd, &how);
        memcpy(msg, from->out, len);
        switch (how % _SEND_MAX) {
        case SEND_FLIP:
                (void)take(rd, &a);
                (void)take(rd, &b);
                if (len > 0)
                        msg[a % len] ^= b ? b : 1;
                break;
        case SEND_CUT:
                (void)take(rd, &a);
                if (a < len)
                        len = a;
                break;
        case SEND_EXTEND:
                (void)take(rd, &a);
                msg[len++] = a;
                break;
        case SEND_RETYPE:
                (void)take(rd, &type);
                break;
        case SEND_REFLECT:
                to = from;
                break;
        default:
                break;
        }
        check_recv(to, type, msg, len);
}

/* The X25519 points of small order (and p-1, p, p+1, their non-canonical
 * forms): with any of them the shared secret is zero, whatever the scalar.
 * The fuzzer would hardly find the order-8 ones in fuzz bytes. */
static const uint8_t low_order_points[7][32] = {
        { 0 },
        { 1 },
        { 0xe0, 0xeb, 0x7a, 0x7c, 0x3b, 0x41, 0xb8, 0xae, 0x16, 0x56, 0xe3, 0xfa, 0xf1, 0x9f, 0xc4, 0x6a,
          0xda, 0x09, 0x8d, 0xeb, 0x9c, 0x32, 0xb1, 0xfd, 0x86, 0x62, 0x05, 0x16, 0x5f, 0x49, 0xb8, 0x00 },
        { 0x5f, 0x9c, 0x95, 0xbc, 0xa3, 0x50, 0x8c, 0x24, 0xb1, 0xd0, 0xb1, 0x55, 0x9c, 0x83, 0xef, 0x5b,
          0x04, 0x44, 0x5c, 0xc4, 0x58, 0x1c, 0x8e, 0x86, 0xd8, 0x22, 0x4e, 0xdd, 0xd0, 0x9f, 0x11, 0x57 },
        { 0xec, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
          0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f },
        { 0xed, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
          0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f },
        { 0xee, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
          0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f },
};

/* An admitted peer can still lie about what it generates: replace the
 * ephemeral key it is about to send, or the cipher it is about to pick. */
static void op_evil(Reader *rd, Side *s) {
        uint8_t what = 0, arg = 0;

        (void)take(rd, &what);
        (void)take(rd, &arg);
        if (what % 2 == 0) {
                bool not_sent = s->hs.initiator ? s->hs.state == HS_SEND_HELLO
                                                : s->hs.state == HS_WAIT_HELLO || s->hs.state == HS_SEND_REPLY;
                uint8_t pk[32] = {}, scalar[32] = { 9 }, q[32];

                if (arg % 8 < 7)
                        memcpy(pk, low_order_points[arg % 8], sizeof pk);
                else
                        for (size_t i = 0; i < sizeof pk && take(rd, &pk[i]); i++)
                                ;
                if (!not_sent)
                        return;
                memcpy(s->hs.eph_pk, pk, sizeof pk);
                s->forged_eph = true;
                /* libsodium fails for every point whose product is zero. */
                s->low_order = crypto_scalarmult(q, scalar, pk) != 0;
                TRACE("%s: forges its ephemeral key (%s)\n", side_name(&s->hs),
                      s->low_order ? "low order" : "a valid point");
        } else {
                /* The responder picks between HELLO and its reply. */
                if (s->hs.initiator || s->hs.state != HS_SEND_REPLY)
                        return;
                s->hs.cipher = (Cipher)arg;
                s->forged_cipher = true;
                TRACE("%s: forges its cipher choice: %u\n", side_name(&s->hs), arg);
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        Reader rd = { data, size };
        uint8_t c0, c1;
        static Side ini, resp;

        if (!take(&rd, &c0) || !take(&rd, &c1))
                return 0;

        fuzz_rng_reset(0x3f);
        TRACE("the input:\n");
        side_setup(&ini, &ids[(c1 >> 6) & 1 ? CAROL : ALICE], c0, c0 >> 2, c1, &ids[BOB]);
        side_setup(&resp, &ids[BOB], c0 >> 4, c0 >> 6, c1 >> 3, &ids[ALICE]);
        CHECK(handshake_init(&ini.hs, &ini.cfg, true) == 0);
        CHECK(handshake_init(&resp.hs, &resp.cfg, false) == 0);

        for (int n = 0; n < MAX_OPS; n++) {
                uint8_t op, arg = 0, type = 0, len = 0;
                Side *side;

                if (!take(&rd, &op))
                        break;
                /* The top bit says which side an op acts on, the rest which op. */
                side = op & 0x80 ? &resp : &ini;
                switch ((op & 0x7f) % _OP_MAX) {
                case OP_NEXT:
                        check_next(side, HANDSHAKE_MAX_SIZE);
                        break;
                case OP_NEXT_CAP:
                        (void)take(&rd, &arg);
                        check_next(side, arg % (HANDSHAKE_MAX_SIZE + 1));
                        break;
                case OP_SEND:
                        if (side->out_len > 0)
                                op_send(&rd, side, side == &ini ? &resp : &ini);
                        break;
                case OP_FUZZ: {
                        (void)take(&rd, &type);
                        (void)take(&rd, &len);
                        size_t l = len < rd.n ? len : rd.n;
                        check_recv(side, type, rd.p, l);
                        rd.p += l;
                        rd.n -= l;
                        break;
                }
                case OP_REPLAY:
                        (void)take(&rd, &arg);
                        check_recv(side, recording[arg % 3].type, recording[arg % 3].buf,
                                   recording[arg % 3].len);
                        break;
                case OP_EVIL:
                        op_evil(&rd, side);
                        break;
                }
                check_invariants(&ini, &resp);
        }

        handshake_clear(&ini.hs);
        handshake_clear(&resp.hs);
        return 0;
}
