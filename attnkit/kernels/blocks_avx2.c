/* y = x · wᵀ for weights w (n, k) held in blocks of 32 along k, as llama.cpp holds them, and
 * fp32 activations x (m, k) quantised on the fly in the same blocks (one fp32 scale each): to
 * int8 for the 4-bit formats (with the sum of the block's values), to int16 for Q8_0, whose
 * int8 weights then meet activations 256 times finer than int8's at the same cost (vpmaddwd on
 * sign-extended weights, where int8 activations need vpsignb twice and vpmaddubsw before
 * it). k is a multiple of 32 (the caller pads). The weight formats, each with fp16 scales d (n, k / 32):
 *   Q8_0  w = q · d,        q int8 (n, k);
 *   Q4_0  w = (u - 8) · d,  u 4-bit (n, k / 2): byte i of a block holds u_i (low nibble) and
 *                           u_{i+16} (high nibble);
 *   Q4_1  w = u · d + mn,   u as Q4_0's, mn fp16 (n, k / 32).
 *
 * A block's dot product: the activations' |a| as unsigned bytes times w with a's sign
 * (vpsignb), summed in pairs to int16 (vpmaddubsw: 127·127·2 < 2^15, no saturation), in pairs
 * to int32 (vpmaddwd), then to fp32 times the two scales (vfmadd). Q4_1's unsigned u meets a
 * directly, and its offset adds mn · d_a · Σa per block. Output rows are shared among OpenMP
 * threads (the process's libgomp, torch's: one team).
 *
 * Every format also comes packed (attnkit.kernels.pack), as llama.cpp's REPACK holds them:
 * eight rows at a time, each block's 4-byte pieces interleaved so that 32-bit lane j of a load
 * holds 4 bytes of row j (4-bit: their low nibbles 4 values, their high nibbles the 4 that are
 * 16 on; Q8_0: 4 values), and the eight rows' scales (and 4-bit minima) side by side (Q4_0 as
 * Q4_1 with mn = -8 d). Four bytes of the activations broadcast to every lane meet all eight
 * rows in one vpmaddubsw, so a block's eight dot products need no horizontal sums and its scales
 * convert as one vector. A 4-bit block's eight vpmaddubsw sums are added as int16
 * (8 · 2 · 15 · 127 < 2^15) before one vpmaddwd; Q8_0's go to int32 one by one (2 · 127 · 127
 * leaves no room), its weights taking the activations' signs. A packed weight keeps only its last
 * n mod 8 rows in plain blocks. Several weights that meet one input go in one call; for many
 * activation rows, attnkit_block_dequantize gives the fp32 weights of unpacked blocks for a
 * dense product instead. Built by attnkit.kernels with -mavx2 -mfma -mf16c. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define BLOCK 32
enum { Q8_0 = 0, Q4_0 = 1, Q4_1 = 2 };

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

/* x (m, k) fp32 -> xq (m, k) int8, xd (m, k / 32) fp32 and xs (m, k / 32) = xd · Σ xq:
 * round(x / d) with d = max|x| / 127. */
static void quantize_blocks(const float *x, int64_t m, int64_t k, int8_t *xq, float *xd, float *xs) {
    #pragma omp parallel for schedule(static) if (m > 1)
    for (int64_t r = 0; r < m; r++) {
        for (int64_t b = 0; b < k / BLOCK; b++) {
            __m256i q[4];
            const float d = round_block(x + r * k + b * BLOCK, 127.0f, q) / 127.0f;
            const __m256i total = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            __m256i q01 = _mm256_packs_epi32(q[0], q[1]), q23 = _mm256_packs_epi32(q[2], q[3]);
            __m256i bytes = _mm256_packs_epi16(q01, q23);
            bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(xq + r * k + b * BLOCK), bytes);
            xd[r * (k / BLOCK) + b] = d;
            xs[r * (k / BLOCK) + b] = d * hsum(_mm256_cvtepi32_ps(total));
        }
    }
}

/* x (m, k) fp32 -> xq (m, k) int16 and xd (m, k / 32) fp32: round(x / d) with d = max|x| / 32767. */
static void quantize_blocks16(const float *x, int64_t m, int64_t k, int16_t *xq, float *xd) {
    #pragma omp parallel for schedule(static) if (m > 1)
    for (int64_t r = 0; r < m; r++) {
        for (int64_t b = 0; b < k / BLOCK; b++) {
            __m256i q[4];
            const float amax = round_block(x + r * k + b * BLOCK, 32767.0f, q);
            for (int i = 0; i < 2; i++) {  /* packs interleaves 128-bit lanes: put them back in order */
                const __m256i pair = _mm256_packs_epi32(q[2 * i], q[2 * i + 1]);
                _mm256_storeu_si256((__m256i *)(xq + r * k + b * BLOCK + 16 * i), _mm256_permute4x64_epi64(pair, 0xD8));
            }
            xd[r * (k / BLOCK) + b] = amax / 32767.0f;
        }
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

/* Rows 8 g .. 8 g + 7 of out from their packed blocks (layout above: the pieces (g, b, s, j) of
 * 4 bytes, then the scales (g, b, j) and minima (g, b, j) in fp16) for one activation row. */
static inline void dot_packed(const uint8_t *packed, int64_t groups, int64_t g, const int8_t *a, const float *ad,
                              const float *as, int64_t k, float *out) {
    const int64_t blocks = k / BLOCK;
    const uint8_t *pieces = packed + g * blocks * 128;
    const uint16_t *scales = (const uint16_t *)(packed + groups * blocks * 128) + g * blocks * 8;
    const uint16_t *mins = scales + groups * blocks * 8;
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *p = pieces + b * 128;
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
    _mm256_storeu_ps(out + 8 * g, acc);
}

/* The bytes of a packed group of 8 rows per block, as dot_packed and dot_packed_q8 read them (and
 * attnkit.kernels.packed_bytes gives): the values, fp16 scales and 4-bit minima. */
int64_t attnkit_packed_bytes(int format) { return format == Q8_0 ? 8 * BLOCK + 8 * 2 : 8 * BLOCK / 2 + 8 * 2 * 2; }

/* dot_packed for Q8_0 and int16 activations: the pieces (g, b, s, j) of 4 bytes (s < 8), then the
 * scales (g, b, j). A piece's 32 bytes, sign-extended to int16 a half at a time (rows 0-3, then
 * 4-7), meet 4 activations broadcast to every 64 bits in one vpmaddwd: two int32 sums a row,
 * which one vphaddd adds at the block's end (rows then in the order 0 1 4 5 2 3 6 7). */
static inline void dot_packed_q8(const uint8_t *packed, int64_t groups, int64_t g, const int16_t *a, const float *ad,
                                 int64_t k, float *out) {
    const int64_t blocks = k / BLOCK;
    const uint8_t *pieces = packed + g * blocks * 256;
    const uint16_t *scales = (const uint16_t *)(packed + groups * blocks * 256) + g * blocks * 8;
    const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *p = pieces + b * 256;
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
    _mm256_storeu_ps(out + 8 * g, acc);
}

/* The products of one activation matrix with ``count`` weights, out (m, Σ n_i) = x · [w_0; w_1; …]ᵀ:
 * q, k and v, or an FFN's gate and up, in one call, their rows shared among the threads as one
 * list of groups of 4 (a layer's whole work in one OpenMP region, its activations quantised once:
 * xq int16 for Q8_0, else int8). */
static inline __attribute__((always_inline)) void matmul(int format, const void *xq, const float *xd,
                                                         const float *xs, int count, const uint8_t *const *w,
                                                         const uint16_t *const *wd, const uint16_t *const *wm,
                                                         const uint8_t *const *packed, const int64_t *n, float *out,
                                                         int64_t m, int64_t k) {
    /* count <= 8: weight i's first unit of work, its packed groups of 8 rows, its first column */
    int64_t first[9] = {0}, eights[8] = {0}, column[9] = {0};
    for (int i = 0; i < count; i++) {
        eights[i] = packed[i] ? n[i] / 8 : 0;
        first[i + 1] = first[i] + eights[i] + (n[i] - 8 * eights[i] + 3) / 4;
        column[i + 1] = column[i] + n[i];
    }
    const int64_t units = first[count], blocks = k / BLOCK, width = column[count];
    #pragma omp parallel for schedule(static)
    for (int64_t u = 0; u < units; u++) {
        int i = 0;
        while (u >= first[i + 1]) i++;
        const int64_t g = u - first[i];
        if (g < eights[i]) {  /* a packed group of 8 rows */
            for (int64_t r = 0; r < m; r++) {
                float *row = out + r * width + column[i];
                if (format == Q8_0)
                    dot_packed_q8(packed[i], eights[i], g, (const int16_t *)xq + r * k, xd + r * blocks, k, row);
                else
                    dot_packed(packed[i], eights[i], g, (const int8_t *)xq + r * k, xd + r * blocks, xs + r * blocks,
                               k, row);
            }
            continue;
        }
        /* the rest, 4 rows at a time: row 8 eights + j of the output is row j of w[i] */
        const int64_t j = 4 * (g - eights[i]), left = n[i] - 8 * eights[i] - j;
        const int rows = left < 4 ? (int)left : 4;
        for (int64_t r = 0; r < m; r++) {
            const int8_t *a = (const int8_t *)xq + r * k;
            const float *ad = xd + r * blocks, *as = xs + r * blocks;
            float *row = out + r * width + column[i] + 8 * eights[i];
            if (format == Q8_0)
                dot_rows_q8(rows, w[i], wd[i], (const int16_t *)xq + r * k, ad, j, k, row);
            else if (rows == 4)
                dot_rows(format, 4, w[i], wd[i], wm[i], a, ad, as, j, k, row);
            else
                dot_rows(format, rows, w[i], wd[i], wm[i], a, ad, as, j, k, row);
        }
    }
}

/* out (m, Σ n_i) = x (m, k) · [w_0; …; w_{count-1}]ᵀ, each weight of n_i rows in ``format``'s
 * blocks: packed[i] its first n_i / 8 groups of 8 rows packed (or NULL: none), and w[i], wd[i],
 * wm[i] (Q4_1's minima, else unused) its other rows, the n_i mod 8 after the packed ones (all n_i
 * where packed[i] is NULL), 1 <= count <= 8. Returns 0, 1 where k is not a multiple of 32, 2 without memory, 3 for
 * an unknown format, 4 for a count out of range. */
int attnkit_block_matmul(int format, const float *x, int count, const uint8_t *const *w, const uint16_t *const *wd,
                         const uint16_t *const *wm, const uint8_t *const *packed, const int64_t *n, float *out,
                         int64_t m, int64_t k) {
    if (k % BLOCK) return 1;
    if (format != Q8_0 && format != Q4_0 && format != Q4_1) return 3;
    if (count < 1 || count > 8) return 4;
    /* the quantised activations (2 bytes each, room for Q8_0's int16): one buffer per thread, kept
     * and grown (no allocation per call) */
    static _Thread_local void *xq = NULL;
    static _Thread_local float *xd = NULL;
    static _Thread_local int64_t held = 0;
    if (m * k > held) {
        free(xq);
        free(xd);
        held = (m * k + 4095) / 4096 * 4096;
        xq = aligned_alloc(64, 2 * (size_t)held);
        xd = malloc(sizeof(float) * (size_t)(2 * (held / BLOCK)));
        if (!xq || !xd) { free(xq); free(xd); xq = NULL; xd = NULL; held = 0; return 2; }
    }
    float *xs = xd + held / BLOCK;
    if (format == Q8_0) {
        quantize_blocks16(x, m, k, xq, xd);
        matmul(Q8_0, xq, xd, xs, count, w, wd, wm, packed, n, out, m, k);
        return 0;
    }
    quantize_blocks(x, m, k, xq, xd, xs);
    if (format == Q4_0)
        matmul(Q4_0, xq, xd, xs, count, w, wd, wm, packed, n, out, m, k);
    else
        matmul(Q4_1, xq, xd, xs, count, w, wd, wm, packed, n, out, m, k);
    return 0;
}

/* out (Σ n_i, k) fp32 = the weights w_0; …; w_{count-1} (as attnkit_block_matmul's) dequantised,
 * for products with many activation rows, where a dense fp32 product beats the integer dot
 * products row by row. Returns as attnkit_block_matmul. */
int attnkit_block_dequantize(int format, int count, const uint8_t *const *w, const uint16_t *const *wd,
                             const uint16_t *const *wm, const int64_t *n, float *out, int64_t k) {
    if (k % BLOCK) return 1;
    if (format != Q8_0 && format != Q4_0 && format != Q4_1) return 3;
    if (count < 1 || count > 8) return 4;
    const int64_t blocks = k / BLOCK;
    for (int i = 0; i < count; i++) {
        const int64_t stride = format == Q8_0 ? k : k / 2;
        #pragma omp parallel for schedule(static)
        for (int64_t j = 0; j < n[i]; j++) {
            for (int64_t b = 0; b < blocks; b++) {
                const uint8_t *src = w[i] + j * stride + b * (format == Q8_0 ? BLOCK : BLOCK / 2);
                const __m256 d = _mm256_set1_ps(half(wd[i][j * blocks + b]));
                const __m256 mn = _mm256_set1_ps(format == Q4_1 ? half(wm[i][j * blocks + b]) : 0.0f);
                __m256i values = format == Q8_0 ? _mm256_loadu_si256((const __m256i *)src) : nibbles(src);
                if (format == Q4_0) values = _mm256_sub_epi8(values, _mm256_set1_epi8(8));
                float *dst = out + j * k + b * BLOCK;
                for (int q = 0; q < 4; q++) {  /* 8 values at a time: int8 -> int32 -> fp32 */
                    const __m128i part = q < 2 ? _mm256_castsi256_si128(values) : _mm256_extracti128_si256(values, 1);
                    const __m256i wide = _mm256_cvtepi8_epi32(q % 2 ? _mm_srli_si128(part, 8) : part);
                    _mm256_storeu_ps(dst + 8 * q, _mm256_fmadd_ps(_mm256_cvtepi32_ps(wide), d, mn));
                }
            }
        }
        out += n[i] * k;
    }
    return 0;
}
