/* The AVX2 primitives of blocks.c (included there when built with -mavx2 -mfma -mf16c): one
 * block's activations quantised, one block's (or a packed group's) dot products, one block
 * dequantised. A block's dot product: the activations' |a| as unsigned bytes times w with a's sign
 * (vpsignb), summed in pairs to int16 (vpmaddubsw: 127·127·2 < 2^15, no saturation), in pairs to
 * int32 (vpmaddwd), then to fp32 times the two scales (vfmadd). Q4_1's unsigned u meets a
 * directly, and its offset adds mn · d_a · Σa per block. Q8_0's int8 weights, sign-extended to
 * int16, meet int16 activations in vpmaddwd, as fast as int8 activations (which need vpsignb
 * twice and vpmaddubsw before it).
 *
 * Packed (blocks.c's layout): four bytes of the activations broadcast to every lane meet all
 * eight rows in one vpmaddubsw, so a block's eight dot products need no horizontal sums and its
 * scales convert as one vector. A 4-bit block's eight vpmaddubsw sums are added as int16
 * (8 · 2 · 15 · 127 < 2^15) before one vpmaddwd; Q8_0's go to int32 one by one (2 · 127 · 127
 * leaves no room), its weights taking the activations' signs. The same code runs on AVX-512
 * CPUs, which have AVX2 too. */
#include <immintrin.h>

static inline float hsum(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* The block of 32 at src as the integers round(x · levels / max|x|) (half to even, as torch.round),
 * four vectors of 8 int32 in q; returns max|x|. */
static inline float round_block(const float *src, float levels, __m256i q[4]) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], peak = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(src + 8 * i);
        peak = _mm256_max_ps(peak, _mm256_andnot_ps(sign, v[i]));
    }
    __m128 p = _mm_max_ps(_mm256_castps256_ps128(peak), _mm256_extractf128_ps(peak, 1));
    p = _mm_max_ps(p, _mm_movehl_ps(p, p));
    p = _mm_max_ss(p, _mm_movehdup_ps(p));
    const float amax = _mm_cvtss_f32(p), inv = amax > 0 ? levels / amax : 0.0f;
    for (int i = 0; i < 4; i++)
        q[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], _mm256_set1_ps(inv)),
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    return amax;
}

/* One block of 32 activations -> its int8 values, scale d = max|x| / 127 and d · Σ q. */
static inline void quantize_block8(const float *src, int8_t *dst, float *d, float *s) {
    __m256i q[4];
    *d = round_block(src, 127.0f, q) / 127.0f;
    const __m256i total = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    const __m256i q01 = _mm256_packs_epi32(q[0], q[1]), q23 = _mm256_packs_epi32(q[2], q[3]);
    const __m256i bytes = _mm256_packs_epi16(q01, q23);  /* packs interleaves 128-bit lanes: reorder */
    _mm256_storeu_si256((__m256i *)dst, _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    *s = *d * hsum(_mm256_cvtepi32_ps(total));
}

/* One block of 32 activations -> its int16 values and scale d = max|x| / 32767. */
static inline void quantize_block16(const float *src, int16_t *dst, float *d) {
    __m256i q[4];
    *d = round_block(src, 32767.0f, q) / 32767.0f;
    for (int i = 0; i < 2; i++) {  /* packs interleaves 128-bit lanes: put them back in order */
        const __m256i pair = _mm256_packs_epi32(q[2 * i], q[2 * i + 1]);
        _mm256_storeu_si256((__m256i *)(dst + 16 * i), _mm256_permute4x64_epi64(pair, 0xD8));
    }
}

/* The 32 4-bit values of a block, in order, one per byte (0 .. 15). */
static inline __m256i nibbles(const uint8_t *p) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)p);
    const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(raw), _mm_srli_epi16(raw, 4), 1);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

static inline float half(uint16_t h) { return _cvtsh_ss(h); }

/* Rows j .. j + rows - 1 (rows <= 4) of a 4-bit weight's out for one activation row (a, ad,
 * as): the activations' absolute values are taken once per block for all of them. format is a
 * constant at every call, so each format gets its own loop. */
static inline __attribute__((always_inline)) void dot_rows(int format, int rows, const uint8_t *w, const uint16_t *wd,
                                                           const uint16_t *wm, const int8_t *a, const float *ad,
                                                           const float *as, int64_t j, int64_t k, float *out) {
    const int64_t blocks = k / BLOCK;
    const __m256i ones = _mm256_set1_epi16(1), eight = _mm256_set1_epi8(8);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    float offset[4] = {0, 0, 0, 0};
    for (int64_t b = 0; b < blocks; b++) {
        const __m256i ab = _mm256_loadu_si256((const __m256i *)(a + b * BLOCK));
        const __m256i magnitude = _mm256_sign_epi8(ab, ab);
        for (int t = 0; t < rows; t++) {
            const uint8_t *src = w + (j + t) * (k / 2) + b * (BLOCK / 2);
            __m256i pairs;
            if (format == Q4_0)
                pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(_mm256_sub_epi8(nibbles(src), eight), ab));
            else
                pairs = _mm256_maddubs_epi16(nibbles(src), ab);
            const __m256 sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
            const float d = half(wd[(j + t) * blocks + b]);
            acc[t] = _mm256_fmadd_ps(sums, _mm256_set1_ps(ad[b] * d), acc[t]);
            if (format == Q4_1) offset[t] += half(wm[(j + t) * blocks + b]) * as[b];
        }
    }
    for (int t = 0; t < rows; t++) out[j + t] = hsum(acc[t]) + offset[t];
}

/* dot_rows for Q8_0 and int16 activations: a block's 32 weights sign-extended to int16 meet
 * them in two vpmaddwd (|q a| <= 128 · 32767, a block's sum well within int32). */
static inline __attribute__((always_inline)) void dot_rows_q8(int rows, const uint8_t *w, const uint16_t *wd,
                                                              const int16_t *a, const float *ad, int64_t j, int64_t k,
                                                              float *out) {
    const int64_t blocks = k / BLOCK;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < blocks; b++) {
        const __m256i first = _mm256_loadu_si256((const __m256i *)(a + b * BLOCK));
        const __m256i second = _mm256_loadu_si256((const __m256i *)(a + b * BLOCK + 16));
        for (int t = 0; t < rows; t++) {
            const uint8_t *src = w + (j + t) * k + b * BLOCK;
            const __m256i low = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)src));
            const __m256i high = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(src + 16)));
            const __m256i sums = _mm256_add_epi32(_mm256_madd_epi16(low, first), _mm256_madd_epi16(high, second));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(ad[b] * half(wd[(j + t) * blocks + b])),
                                     acc[t]);
        }
    }
    for (int t = 0; t < rows; t++) out[j + t] = hsum(acc[t]);
}

/* The 8 outputs of a packed group of rows (blocks.c's layout: its pieces (b, s, j) of 4 bytes, its
 * scales (b, j) and minima (b, j) in fp16) for one activation row, at out. */
static inline void dot_packed(const uint8_t *pieces, const uint16_t *scales, const uint16_t *mins, const int8_t *a,
                              const float *ad, const float *as, int64_t blocks, float *out) {
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *p = pieces + b * 128;
        prefetch(p, 128, scales + b * 8, mins + b * 8, b);
        const int8_t *ab = a + b * BLOCK;
        __m256i sums = _mm256_setzero_si256();
        for (int s = 0; s < 4; s++) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(p + 32 * s));
            const __m256i lo = _mm256_and_si256(raw, low), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
            int32_t first, second;  /* the activations' bytes 4 s .. 4 s + 3 and 16 + 4 s .. */
            __builtin_memcpy(&first, ab + 4 * s, 4);
            __builtin_memcpy(&second, ab + 16 + 4 * s, 4);
            sums = _mm256_add_epi16(sums, _mm256_maddubs_epi16(lo, _mm256_set1_epi32(first)));
            sums = _mm256_add_epi16(sums, _mm256_maddubs_epi16(hi, _mm256_set1_epi32(second)));
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(scales + b * 8)));
        const __m256 mn = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mins + b * 8)));
        const __m256 dots = _mm256_cvtepi32_ps(_mm256_madd_epi16(sums, ones));
        acc = _mm256_fmadd_ps(dots, _mm256_mul_ps(d, _mm256_set1_ps(ad[b])), acc);
        acc = _mm256_fmadd_ps(mn, _mm256_set1_ps(as[b]), acc);
    }
    _mm256_storeu_ps(out, acc);
}

/* dot_packed for Q8_0 and int16 activations: the pieces (b, s, j) of 4 bytes (s < 8), and the
 * scales (b, j). A piece's 32 bytes, sign-extended to int16 a half at a time (rows 0-3, then
 * 4-7), meet 4 activations broadcast to every 64 bits in one vpmaddwd: two int32 sums a row,
 * which one vphaddd adds at the block's end (rows then in the order 0 1 4 5 2 3 6 7). */
static inline void dot_packed_q8(const uint8_t *pieces, const uint16_t *scales, const int16_t *a, const float *ad,
                                 int64_t blocks, float *out) {
    const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *p = pieces + b * 256;
        prefetch(p, 256, scales + b * 8, NULL, b);
        const int16_t *ab = a + b * BLOCK;
        __m256i low = _mm256_setzero_si256(), high = _mm256_setzero_si256();
        for (int s = 0; s < 8; s++) {
            int64_t four;  /* the activations 4 s .. 4 s + 3 */
            __builtin_memcpy(&four, ab + 4 * s, 8);
            const __m256i x = _mm256_set1_epi64x(four);
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(p + 32 * s));
            low = _mm256_add_epi32(low, _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(raw)), x));
            high = _mm256_add_epi32(high, _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(raw, 1)), x));
        }
        const __m256i dots = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(low, high), order);
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(scales + b * 8)));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), _mm256_mul_ps(d, _mm256_set1_ps(ad[b])), acc);
    }
    _mm256_storeu_ps(out, acc);
}

/* One block's 32 weights in fp32 at dst: q · d, (u - 8) · d or u · d + mn. */
static inline void dequantize_block(int format, const uint8_t *src, float d, float mn, float *dst) {
    __m256i values = format == Q8_0 ? _mm256_loadu_si256((const __m256i *)src) : nibbles(src);
    if (format == Q4_0) values = _mm256_sub_epi8(values, _mm256_set1_epi8(8));
    for (int q = 0; q < 4; q++) {  /* 8 values at a time: int8 -> int32 -> fp32 */
        const __m128i part = q < 2 ? _mm256_castsi256_si128(values) : _mm256_extracti128_si256(values, 1);
        const __m256i wide = _mm256_cvtepi8_epi32(q % 2 ? _mm_srli_si128(part, 8) : part);
        _mm256_storeu_ps(dst + 8 * q, _mm256_fmadd_ps(_mm256_cvtepi32_ps(wide), _mm256_set1_ps(d), _mm256_set1_ps(mn)));
    }
}
