/* y = x · wᵀ for weights w (n, k) held in blocks of 32 along k, as llama.cpp holds them, and
 * fp32 activations x (m, k) quantised on the fly in the same blocks (one fp32 scale each): to
 * int8 for the 4-bit formats (with the sum of the block's values), to int16 for Q8_0, whose int8
 * weights then meet activations 256 times finer than int8's at about the same cost. k is a
 * multiple of 32 (the caller pads). The weight formats, each with fp16 scales d (n, k / 32):
 *   Q8_0  w = q · d,        q int8 (n, k);
 *   Q4_0  w = (u - 8) · d,  u 4-bit (n, k / 2): byte i of a block holds u_i (low nibble) and
 *                           u_{i+16} (high nibble);
 *   Q4_1  w = u · d + mn,   u as Q4_0's, mn fp16 (n, k / 32).
 * The integer dot products are exact; each block's goes to fp32 times the two scales, and
 * Q4_1's offset adds mn · d_a · Σa per block.
 *
 * Every format also comes packed (attnkit.kernels.pack), as llama.cpp's REPACK holds them:
 * eight rows at a time, each block's 4-byte pieces interleaved so that 32-bit lane j of a load
 * holds 4 bytes of row j (4-bit: their low nibbles 4 values, their high nibbles the 4 that are
 * 16 on; Q8_0: 4 values), and the eight rows' scales (and 4-bit minima) side by side (Q4_0 as
 * Q4_1 with mn = -8 d): four bytes of the activations broadcast to every lane meet all eight
 * rows at once. A packed weight keeps only its last n mod 8 rows in plain blocks. Several weights
 * that meet one input go in one call; for many activation rows, attnkit_block_dequantize gives
 * the fp32 weights of unpacked blocks for a dense product instead.
 *
 * This file is the arithmetic's order, the same on every CPU; the instructions per block are
 * the CPU's own: blocks_avx2.h (x86-64, built with -mavx2 -mfma -mf16c) or blocks_neon.h (ARM64,
 * with the dot-product instructions where the CPU has them). Output rows are shared among
 * OpenMP threads (the process's libgomp, torch's: one team). Built by attnkit.kernels. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 32
enum { Q8_0 = 0, Q4_0 = 1, Q4_1 = 2 };

/* The packed groups a thread reads from memory, one stream: the lines PREFETCH bytes ahead of a
 * block's values (size bytes), and as far ahead in its scales and minima (16 bytes a block each),
 * asked for long before they are needed. The hardware's prefetcher alone kept the products from
 * memory at about half of fp32 F.linear's read rate; GPT-2 124M's compiled step, batch 1, went from
 * 159-181 to 260-272 tokens/s in int4 and from 110 to 171-178 in int8 with 16 KB ahead (2026-12-04,
 * a 2-core Intel Xeon: 1 KB ahead gave 196, 2 KB 220-229, 4 KB 244-253, 8 KB 250, 32 KB 265, 64 KB
 * 249). A hint: nothing faults past a weight's end. Any architecture: GCC's and Clang's builtin. */
#define PREFETCH 16384
static inline void prefetch(const uint8_t *values, int64_t size, const uint16_t *scales, const uint16_t *mins,
                            int64_t b) {
    for (int64_t line = 0; line < size; line += 64) __builtin_prefetch(values + PREFETCH + line, 0, 3);
    if (b % 4 == 0) {  /* a line holds 4 blocks' scales */
        __builtin_prefetch((const uint8_t *)scales + PREFETCH * 16 / size, 0, 3);
        if (mins) __builtin_prefetch((const uint8_t *)mins + PREFETCH * 16 / size, 0, 3);
    }
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "blocks_avx2.h"
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include "blocks_neon.h"
#else
#error "the block kernel needs AVX2, FMA and F16C (x86-64) or NEON (ARM64)"
#endif

/* x (m, k) fp32 -> xq (m, k) int8, xd (m, k / 32) fp32 and xs (m, k / 32) = xd · Σ xq:
 * round(x / d) with d = max|x| / 127. */
static void quantize_blocks(const float *x, int64_t m, int64_t k, int8_t *xq, float *xd, float *xs) {
    #pragma omp parallel for schedule(static) if (m > 1)
    for (int64_t r = 0; r < m; r++)
        for (int64_t b = 0; b < k / BLOCK; b++)
            quantize_block8(x + r * k + b * BLOCK, xq + r * k + b * BLOCK, xd + r * (k / BLOCK) + b,
                            xs + r * (k / BLOCK) + b);
}

/* x (m, k) fp32 -> xq (m, k) int16 and xd (m, k / 32) fp32: round(x / d) with d = max|x| / 32767. */
static void quantize_blocks16(const float *x, int64_t m, int64_t k, int16_t *xq, float *xd) {
    #pragma omp parallel for schedule(static) if (m > 1)
    for (int64_t r = 0; r < m; r++)
        for (int64_t b = 0; b < k / BLOCK; b++)
            quantize_block16(x + r * k + b * BLOCK, xq + r * k + b * BLOCK, xd + r * (k / BLOCK) + b);
}

/* The bytes of a packed group of 8 rows per block, as dot_packed and dot_packed_q8 read them (and
 * attnkit.kernels.packed_bytes gives): the values, fp16 scales and 4-bit minima. */
int64_t attnkit_packed_bytes(int format) { return format == Q8_0 ? 8 * BLOCK + 8 * 2 : 8 * BLOCK / 2 + 8 * 2 * 2; }

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
        if (g < eights[i]) {  /* a packed group of 8 rows: its values' pieces, then scales, then (4-bit) minima */
            const int64_t values = format == Q8_0 ? 8 * BLOCK : 8 * BLOCK / 2;  /* bytes a block */
            const uint8_t *pieces = packed[i] + g * blocks * values;
            const uint16_t *scales = (const uint16_t *)(packed[i] + eights[i] * blocks * values) + g * blocks * 8;
            const uint16_t *mins = scales + eights[i] * blocks * 8;
            for (int64_t r = 0; r < m; r++) {
                float *row = out + r * width + column[i] + 8 * g;
                if (format == Q8_0)
                    dot_packed_q8(pieces, scales, (const int16_t *)xq + r * k, xd + r * blocks, blocks, row);
                else
                    dot_packed(pieces, scales, mins, (const int8_t *)xq + r * k, xd + r * blocks, xs + r * blocks,
                               blocks, row);
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
                const float d = half(wd[i][j * blocks + b]), mn = format == Q4_1 ? half(wm[i][j * blocks + b]) : 0.0f;
                dequantize_block(format, src, d, mn, out + j * k + b * BLOCK);
            }
        }
        out += n[i] * k;
    }
    return 0;
}
