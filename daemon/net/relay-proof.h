/* net/relay-proof.h — a relay's check that both ends of a link it joined
 * hold the network secret, from the bytes it copies between them.
 *
 * The handshake's first three frames go in the clear (handshake.h): the
 * initiator's HELLO, the responder's HELLO_REPLY with its MAC over T1, the
 * initiator's AUTH with its MAC over T2. A relay that holds the network
 * secret recomputes T1, T2 and both MACs from those bytes as they pass, with
 * the handshake's own code, and so knows that both ends hold the secret, or
 * that someone recorded a real handshake and sends it again (the relay
 * lets one recording prove one link at a time: RelayProof.t1 names it). It
 * learns nothing else: it cannot read or forge a protected frame, since the
 * link keys also take the X25519 secret of the ends' ephemeral keys.
 *
 * A pure state machine over the bytes of both directions, in the order the
 * relay reads them; at most one frame of FRAME_HEADER_SIZE +
 * HANDSHAKE_MAX_SIZE bytes is held, and nothing past the AUTH is looked at.
 *
 *     RelayProof p;
 *     relay_proof_init(&p, secret);
 *     r = relay_proof_feed(&p, true, bytes, n);  // from the asker: 1 proven, 0 more to come
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "frame.h"
#include "handshake.h"

typedef enum RelayProofStep {
        PROOF_HELLO,   /* the asker's (the initiator's) HELLO */
        PROOF_REPLY,   /* the waiter's HELLO_REPLY */
        PROOF_AUTH,    /* the asker's AUTH */
        PROOF_DONE,    /* both MACs verified */
        PROOF_FAILED,
} RelayProofStep;

typedef struct RelayProof {
        const uint8_t *secret;                   /* HANDSHAKE_SECRET_SIZE bytes, the caller's */
        RelayProofStep step;
        int error;                               /* PROOF_FAILED: why */
        size_t have;                             /* bytes of the frame coming */
        uint8_t frame[FRAME_HEADER_SIZE + HANDSHAKE_MAX_SIZE];
        uint8_t hello[HANDSHAKE_HELLO_SIZE];
        uint8_t t1[32];                          /* from the reply on; proven: names the handshake */
} RelayProof;

void relay_proof_init(RelayProof *p, const uint8_t *secret);
/* len bytes read from one end (from_asker: the CONNECT's end, which is the
 * initiator). 1: proven (and from then on, whatever comes); 0: more to
 * come; -EBADMSG: not the handshake's frames in their order (a malformed
 * header, another type or length, bytes from the end whose turn it is
 * not); -EACCES: a MAC the secret does not give. An error is final. */
int relay_proof_feed(RelayProof *p, bool from_asker, const uint8_t *buf, size_t len);
