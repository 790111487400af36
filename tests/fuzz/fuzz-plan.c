/* fuzz-plan.c — libFuzzer harness for what a node takes from its
 * coordinator and what a coordinator takes from a member: the signed plan
 * (cluster/plan.h) and the JOIN, STOP and DONE messages.
 *
 * The fuzzer cannot forge an Ed25519 signature, so the input is decoded
 * twice: as it is (it must be refused unless it verifies), and signed here
 * with a fixed test key, which lets the parser behind the signature be
 * explored. Every accepted plan must pass plan_check() and re-encode to the
 * same bytes; every accepted JOIN likewise; anything else abort()s so
 * libFuzzer reports it.
 *
 *     build-fuzz/tests/fuzz/fuzz-plan -max_total_time=60 build-fuzz/corpus/plan
 */
#include <sodium.h>
#include <string.h>

#include "cluster/plan.h"
#include "fuzz.h"

static uint8_t pk[PLAN_KEY_SIZE], sk[PLAN_SK_SIZE];
static Plan *plan;
static uint8_t *buf, *again;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        uint8_t seed[crypto_sign_SEEDBYTES] = { 'R', 'V', 'P', 'L' };
        CHECK(sodium_init() >= 0);
        crypto_sign_seed_keypair(pk, sk, seed);
        plan = plan_new();
        buf = malloc(PLAN_MAX_BYTES + 1);
        again = malloc(PLAN_MAX_BYTES + 1);
        CHECK(plan && buf && again);
        return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        /* as it came: only a valid signature gets it taken */
        if (plan_decode(data, size, pk, plan) == 0)
                CHECK(plan_check(plan) == 0);

        /* signed here: the parser behind the signature */
        if (size <= PLAN_MAX_BYTES - PLAN_SIG_SIZE) {
                memcpy(buf, data, size);
                if (size >= 16 + PLAN_KEY_SIZE) /* it claims the test key */
                        memcpy(buf + 16, pk, PLAN_KEY_SIZE);
                crypto_sign_detached(buf + size, NULL, buf, size, sk);
                if (plan_decode(buf, size + PLAN_SIG_SIZE, pk, plan) == 0) {
                        CHECK(plan_check(plan) == 0);
                        int n = plan_encode(plan, sk, again, PLAN_MAX_BYTES);
                        CHECK(n == (int)(size + PLAN_SIG_SIZE));
                        CHECK(memcmp(buf, again, (size_t)n) == 0);
                }
        }

        PlanJoin j;
        uint8_t out[PLAN_JOIN_MAX_SIZE];
        if (plan_join_decode(data, size, &j) == 0) {
                int n = plan_join_encode(&j, out, sizeof out);
                CHECK(n == (int)size && memcmp(out, data, size) == 0);
        }
        uint64_t epoch, samples;
        bool hand_in;
        if (plan_stop_decode(data, size, &epoch, &hand_in) == 0)
                CHECK(epoch >= 1 && size == PLAN_STOP_SIZE && data[12] == hand_in);
        if (plan_done_decode(data, size, &epoch, &samples) == 0)
                CHECK(epoch >= 1 && size == PLAN_DONE_SIZE);
        double bw, lat;
        if (plan_link_decode(data, size, &bw, &lat) == 0)
                CHECK(size == PLAN_LINK_SIZE && bw > 0 && bw <= 1e13 && lat >= 0 && lat <= 60);
        return 0;
}
