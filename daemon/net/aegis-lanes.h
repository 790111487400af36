/* net/aegis-lanes.h — AEGIS-256 on LANES lanes side by side, one lane per
 * 128-bit block of a register: included by aegis.c once per width (1, 2
 * and 4 lanes), not a header of its own. The includer defines
 *
 *     LANES          1, 2 or 4: the functions are update1(), init2(), ...
 *     TARGET         the function attribute that enables the instructions
 *     VEC            the register type
 *     XOR AND AESENC ZERO LOAD STORE   the register operations
 *     ALL(b)         a 128-bit block in every lane
 *     FOLD(v)        the xor of v's lanes, as one 128-bit block
 *     CTX            the lanes' contexts: LANES blocks of Byte(i) || Byte(LANES - 1)
 *
 * which the end of this file undefines. See aegis.c's top for the state and
 * S0 ^ Y. */
#define LANE_CAT(a, b) a##b
#define LANE_FN(name, n) LANE_CAT(name, n)
#define FN(name) LANE_FN(name, LANES)

/* Update(m) on a state whose s[0] holds S0 ^ *y. */
static inline TARGET void FN(update_lazy)(VEC s[6], VEC *y, VEC m) {
        VEC s0 = XOR(s[0], *y), s5 = s[5];
        s[5] = AESENC(s[4], s5);
        s[4] = AESENC(s[3], s[4]);
        s[3] = AESENC(s[2], s[3]);
        s[2] = AESENC(s[1], s[2]);
        s[1] = AESENC(s0, s[1]);
        s[0] = AESENC(s5, s[0]);
        *y = XOR(*y, m);
}

static inline TARGET void FN(update)(VEC s[6], VEC m) {
        VEC y = ZERO();
        FN(update_lazy)(s, &y, m);
        s[0] = XOR(s[0], y);
}

static inline TARGET VEC FN(keystream)(const VEC s[6]) {
        return XOR(XOR(s[1], s[4]), XOR(s[5], AND(s[2], s[3])));
}

static inline TARGET void FN(load)(const Aegis256 *a, VEC s[6]) {
        for (int i = 0; i < 6; i++)
                s[i] = LOAD(a->state[i]);
}

static inline TARGET void FN(store)(Aegis256 *a, const VEC s[6]) {
        for (int i = 0; i < 6; i++)
                STORE(a->state[i], s[i]);
}

/* The context goes into S3 and S5 before each of the 16 updates (it is
 * zero for one lane: plain AEGIS-256). */
static TARGET void FN(init)(Aegis256 *a, const uint8_t *key, const uint8_t *nonce) {
        __m128i k0 = LD1(key), k1 = LD1(key + 16), c0 = LD1(C0), c1 = LD1(C1);
        __m128i k0n0 = _mm_xor_si128(k0, LD1(nonce)), k1n1 = _mm_xor_si128(k1, LD1(nonce + 16));
        VEC s[6] = { ALL(k0n0), ALL(k1n1), ALL(c1), ALL(c0), ALL(_mm_xor_si128(k0, c0)), ALL(_mm_xor_si128(k1, c1)) };
        VEC m[4] = { ALL(k0), ALL(k1), ALL(k0n0), ALL(k1n1) }, ctx = LOAD(CTX);
        for (int i = 0; i < 16; i++) {
                s[3] = XOR(s[3], ctx);
                s[5] = XOR(s[5], ctx);
                FN(update)(s, m[i % 4]);
        }
        FN(store)(a, s);
}

/* Whole blocks of n: the bytes done. */
static TARGET size_t FN(bulk)(Aegis256 *a, uint8_t *dst, const uint8_t *src, size_t n, bool dec) {
        VEC s[6], y = ZERO();
        size_t i = 0;
        FN(load)(a, s);
        for (; i + sizeof(VEC) <= n; i += sizeof(VEC)) {
                VEC in = LOAD(src + i), out = XOR(in, FN(keystream)(s));
                FN(update_lazy)(s, &y, dec ? out : in);
                STORE(dst + i, out);
        }
        s[0] = XOR(s[0], y);
        FN(store)(a, s);
        return i;
}

/* Seven updates with the lengths in bits; the tag is the xor of the
 * blocks, over every lane. */
static TARGET void FN(tag)(Aegis256 *a, uint8_t tag[AEGIS256_TAG_SIZE]) {
        VEC s[6];
        FN(load)(a, s);
        VEC t = XOR(s[3], ALL(_mm_set_epi64x((long long)(a->msg_len * 8), (long long)(a->ad_len * 8))));
        for (int i = 0; i < 7; i++)
                FN(update)(s, t);
        VEC x = XOR(XOR(XOR(s[0], s[1]), XOR(s[2], s[3])), XOR(s[4], s[5]));
        ST1(tag, FOLD(x));
}

#undef FN
#undef LANE_FN
#undef LANE_CAT
#undef LANES
#undef TARGET
#undef VEC
#undef XOR
#undef AND
#undef AESENC
#undef ZERO
#undef LOAD
#undef STORE
#undef ALL
#undef FOLD
#undef CTX
