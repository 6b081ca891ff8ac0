/* The ARM64 primitives of blocks.c (included there on AArch64, where NEON is always present): one
 * block's activations quantised, one block's (or a packed group's) dot products, one block
 * dequantised. The products of int8 values go four at a time into each 32-bit lane: sdot (the
 * dot-product instructions, ARMv8.2's, where the compiler is told the CPU has them:
 * __ARM_FEATURE_DOTPROD), else smull then two pairwise adds, the same sums. The 4-bit values u
 * (0 .. 15, or u - 8 for Q4_0 unpacked) are already signed bytes, so no sign trick is needed.
 * Q8_0's int8 weights, widened to int16, meet int16 activations in smlal (4 products a lane a
 * block at most 8 · 128 · 32767: no overflow).
 *
 * Packed (blocks.c's layout): a 4-bit piece's 32 bytes are two vectors, rows 0-3 and 4-7, whose
 * lane j holds 4 bytes of row j; the 4 activations they meet are loaded into every lane (ld1r),
 * so each sdot adds four products to each of four rows, and a block's eight sums need no
 * horizontal adds. Q8_0's pieces widen to int16 and multiply-accumulate lane by lane per row,
 * four pairwise adds giving the rows' sums at the block's end. */
#include <arm_neon.h>

/* lanes j of acc plus the dot products of bytes 4j .. 4j + 3 of w and a */
static inline int32x4_t dot4(int32x4_t acc, int8x16_t w, int8x16_t a) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, w, a);
#else
    const int16x8_t low = vmull_s8(vget_low_s8(w), vget_low_s8(a)), high = vmull_high_s8(w, a);
    return vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(low), vpaddlq_s16(high)));
#endif
}

static inline float half(uint16_t h) {
    __fp16 value;
    memcpy(&value, &h, sizeof value);
    return (float)value;
}

static inline float32x4_t halves(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }

/* The block of 32 at src as the integers round(x · levels / max|x|) (half to even, as torch.round),
 * eight vectors of 4 int32 in q; returns max|x|. */
static inline float round_block(const float *src, float levels, int32x4_t q[8]) {
    float32x4_t v[8], peak = vdupq_n_f32(0.0f);
    for (int i = 0; i < 8; i++) {
        v[i] = vld1q_f32(src + 4 * i);
        peak = vmaxq_f32(peak, vabsq_f32(v[i]));
    }
    const float amax = vmaxvq_f32(peak), inv = amax > 0 ? levels / amax : 0.0f;
    for (int i = 0; i < 8; i++) q[i] = vcvtnq_s32_f32(vmulq_n_f32(v[i], inv));
    return amax;
}

/* One block of 32 activations -> its int8 values, scale d = max|x| / 127 and d · Σ q. */
static inline void quantize_block8(const float *src, int8_t *dst, float *d, float *s) {
    int32x4_t q[8];
    *d = round_block(src, 127.0f, q) / 127.0f;
    int32x4_t total = vdupq_n_s32(0);
    for (int i = 0; i < 8; i++) total = vaddq_s32(total, q[i]);
    for (int i = 0; i < 2; i++) {
        const int16x8_t first = vcombine_s16(vqmovn_s32(q[4 * i]), vqmovn_s32(q[4 * i + 1]));
        const int16x8_t second = vcombine_s16(vqmovn_s32(q[4 * i + 2]), vqmovn_s32(q[4 * i + 3]));
        vst1q_s8(dst + 16 * i, vcombine_s8(vqmovn_s16(first), vqmovn_s16(second)));
    }
    *s = *d * (float)vaddvq_s32(total);
}

/* One block of 32 activations -> its int16 values and scale d = max|x| / 32767. */
static inline void quantize_block16(const float *src, int16_t *dst, float *d) {
    int32x4_t q[8];
    *d = round_block(src, 32767.0f, q) / 32767.0f;
    for (int i = 0; i < 4; i++) vst1q_s16(dst + 8 * i, vcombine_s16(vqmovn_s32(q[2 * i]), vqmovn_s32(q[2 * i + 1])));
}

/* A 4-bit block's 16 bytes as its values 0 .. 15 and 16 .. 31, one per byte (0 .. 15). */
static inline void nibbles(const uint8_t *p, int8x16_t *low, int8x16_t *high) {
    const uint8x16_t raw = vld1q_u8(p);
    *low = vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0F)));
    *high = vreinterpretq_s8_u8(vshrq_n_u8(raw, 4));
}

/* Rows j .. j + rows - 1 (rows <= 4) of a 4-bit weight's out for one activation row (a, ad, as). */
static inline __attribute__((always_inline)) void dot_rows(int format, int rows, const uint8_t *w, const uint16_t *wd,
                                                           const uint16_t *wm, const int8_t *a, const float *ad,
                                                           const float *as, int64_t j, int64_t k, float *out) {
    const int64_t blocks = k / BLOCK;
    float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    float offset[4] = {0, 0, 0, 0};
    for (int64_t b = 0; b < blocks; b++) {
        const int8x16_t first = vld1q_s8(a + b * BLOCK), second = vld1q_s8(a + b * BLOCK + 16);
        for (int t = 0; t < rows; t++) {
            int8x16_t low, high;
            nibbles(w + (j + t) * (k / 2) + b * (BLOCK / 2), &low, &high);
            if (format == Q4_0) {
                low = vsubq_s8(low, vdupq_n_s8(8));
                high = vsubq_s8(high, vdupq_n_s8(8));
            }
            const int32x4_t sums = dot4(dot4(vdupq_n_s32(0), low, first), high, second);
            acc[t] = vfmaq_n_f32(acc[t], vcvtq_f32_s32(sums), ad[b] * half(wd[(j + t) * blocks + b]));
            if (format == Q4_1) offset[t] += half(wm[(j + t) * blocks + b]) * as[b];
        }
    }
    for (int t = 0; t < rows; t++) out[j + t] = vaddvq_f32(acc[t]) + offset[t];
}

/* The products of 32 int8 weights at w, widened, with 32 int16 activations at a, added to acc's lanes. */
static inline int32x4_t dot_q8(int32x4_t acc, const int8_t *w, const int16_t *a) {
    for (int i = 0; i < 2; i++) {
        const int8x16_t raw = vld1q_s8(w + 16 * i);
        const int16x8_t low = vmovl_s8(vget_low_s8(raw)), high = vmovl_high_s8(raw);
        const int16x8_t x0 = vld1q_s16(a + 16 * i), x1 = vld1q_s16(a + 16 * i + 8);
        acc = vmlal_high_s16(vmlal_s16(acc, vget_low_s16(low), vget_low_s16(x0)), low, x0);
        acc = vmlal_high_s16(vmlal_s16(acc, vget_low_s16(high), vget_low_s16(x1)), high, x1);
    }
    return acc;
}

/* dot_rows for Q8_0 and int16 activations. */
static inline __attribute__((always_inline)) void dot_rows_q8(int rows, const uint8_t *w, const uint16_t *wd,
                                                              const int16_t *a, const float *ad, int64_t j, int64_t k,
                                                              float *out) {
    const int64_t blocks = k / BLOCK;
    float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    for (int64_t b = 0; b < blocks; b++)
        for (int t = 0; t < rows; t++) {
            const int32x4_t sums = dot_q8(vdupq_n_s32(0), (const int8_t *)w + (j + t) * k + b * BLOCK, a + b * BLOCK);
            acc[t] = vfmaq_n_f32(acc[t], vcvtq_f32_s32(sums), ad[b] * half(wd[(j + t) * blocks + b]));
        }
    for (int t = 0; t < rows; t++) out[j + t] = vaddvq_f32(acc[t]);
}

/* Four bytes at p in every 32-bit lane. */
static inline int8x16_t broadcast4(const int8_t *p) {
    int32_t four;
    memcpy(&four, p, 4);
    return vreinterpretq_s8_s32(vdupq_n_s32(four));
}

/* The 8 outputs of a packed group of rows (blocks.c's layout: its pieces (b, s, j) of 4 bytes, its
 * scales (b, j) and minima (b, j) in fp16) for one activation row, at out. */
static inline void dot_packed(const uint8_t *pieces, const uint16_t *scales, const uint16_t *mins, const int8_t *a,
                              const float *ad, const float *as, int64_t blocks, float *out) {
    float32x4_t acc[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *p = pieces + b * 128;
        prefetch(p, 128, scales + b * 8, mins + b * 8, b);
        const int8_t *ab = a + b * BLOCK;
        int32x4_t sums[2] = {vdupq_n_s32(0), vdupq_n_s32(0)};
        for (int s = 0; s < 4; s++) {
            const int8x16_t first = broadcast4(ab + 4 * s), second = broadcast4(ab + 16 + 4 * s);
            for (int h = 0; h < 2; h++) {  /* rows 0-3, then 4-7 */
                int8x16_t low, high;
                nibbles(p + 32 * s + 16 * h, &low, &high);
                sums[h] = dot4(dot4(sums[h], low, first), high, second);
            }
        }
        for (int h = 0; h < 2; h++) {
            const float32x4_t d = halves(scales + b * 8 + 4 * h), mn = halves(mins + b * 8 + 4 * h);
            acc[h] = vfmaq_f32(acc[h], vcvtq_f32_s32(sums[h]), vmulq_n_f32(d, ad[b]));
            acc[h] = vfmaq_n_f32(acc[h], mn, as[b]);
        }
    }
    vst1q_f32(out, acc[0]);
    vst1q_f32(out + 4, acc[1]);
}

/* dot_packed for Q8_0 and int16 activations: the pieces (b, s, j) of 4 bytes (s < 8), and the
 * scales (b, j). Row t's 4 bytes of a piece, widened, meet the 4 activations in one smlal into
 * row t's accumulator; at the block's end pairwise adds give the eight rows' sums. */
static inline void dot_packed_q8(const uint8_t *pieces, const uint16_t *scales, const int16_t *a, const float *ad,
                                 int64_t blocks, float *out) {
    float32x4_t acc[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *p = pieces + b * 256;
        prefetch(p, 256, scales + b * 8, NULL, b);
        int32x4_t row[8];
        for (int t = 0; t < 8; t++) row[t] = vdupq_n_s32(0);
        for (int s = 0; s < 8; s++) {
            const int16x4_t x = vld1_s16(a + b * BLOCK + 4 * s);
            const int16x8_t x2 = vcombine_s16(x, x);
            for (int h = 0; h < 4; h++) {  /* rows 2h and 2h + 1 */
                const int16x8_t w = vmovl_s8(vld1_s8((const int8_t *)p + 32 * s + 8 * h));
                row[2 * h] = vmlal_s16(row[2 * h], vget_low_s16(w), x);
                row[2 * h + 1] = vmlal_high_s16(row[2 * h + 1], w, x2);
            }
        }
        for (int h = 0; h < 2; h++) {
            const int32x4_t dots = vpaddq_s32(vpaddq_s32(row[4 * h], row[4 * h + 1]), vpaddq_s32(row[4 * h + 2], row[4 * h + 3]));
            const float32x4_t d = halves(scales + b * 8 + 4 * h);
            acc[h] = vfmaq_f32(acc[h], vcvtq_f32_s32(dots), vmulq_n_f32(d, ad[b]));
        }
    }
    vst1q_f32(out, acc[0]);
    vst1q_f32(out + 4, acc[1]);
}

/* One block's 32 weights in fp32 at dst: q · d, (u - 8) · d or u · d + mn. */
static inline void dequantize_block(int format, const uint8_t *src, float d, float mn, float *dst) {
    int8x16_t part[2];
    if (format == Q8_0) {
        part[0] = vld1q_s8((const int8_t *)src);
        part[1] = vld1q_s8((const int8_t *)src + 16);
    } else {
        nibbles(src, &part[0], &part[1]);
    }
    for (int i = 0; i < 2; i++) {
        const int8x16_t values = format == Q4_0 ? vsubq_s8(part[i], vdupq_n_s8(8)) : part[i];
        const int16x8_t halves16[2] = {vmovl_s8(vget_low_s8(values)), vmovl_high_s8(values)};
        for (int q = 0; q < 4; q++) {
            const int16x8_t h = halves16[q / 2];
            const int32x4_t wide = q % 2 ? vmovl_high_s16(h) : vmovl_s16(vget_low_s16(h));
            vst1q_f32(dst + 16 * i + 4 * q, vfmaq_n_f32(vdupq_n_f32(mn), vcvtq_f32_s32(wide), d));
        }
    }
}
