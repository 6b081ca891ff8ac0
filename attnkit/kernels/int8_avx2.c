/* y = x · wᵀ for int8 weights q (n, k) in blocks of 32 along k, one fp32 scale per block
 * wd (n, k / 32) (llama.cpp's Q8_0), and fp32 activations x (m, k) quantised on the fly the
 * same way. k is a multiple of 32 (the caller pads).
 *
 * The dot product of a block: |a| as unsigned bytes times w with a's sign (vpsignb), summed in
 * pairs to int16 (vpmaddubsw: 127·127·2 < 2^15, no saturation), in pairs to int32 (vpmaddwd),
 * then to fp32 times the block's scale (vfmadd). Rows are shared among OpenMP threads (the
 * process's libgomp, torch's: one team). Built by attnkit.kernels with -mavx2 -mfma. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define BLOCK 32

static inline float hsum(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* x (m, k) fp32 -> xq (m, k) int8 and xd (m, k / 32) fp32: round(x / d), d = max|x| / 127. */
static void quantize_blocks(const float *x, int64_t m, int64_t k, int8_t *xq, float *xd) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    #pragma omp parallel for schedule(static) if (m > 1)
    for (int64_t r = 0; r < m; r++) {
        for (int64_t b = 0; b < k / BLOCK; b++) {
            const float *src = x + r * k + b * BLOCK;
            __m256 v[4], peak = _mm256_setzero_ps();
            for (int i = 0; i < 4; i++) {
                v[i] = _mm256_loadu_ps(src + 8 * i);
                peak = _mm256_max_ps(peak, _mm256_andnot_ps(sign, v[i]));
            }
            __m128 p = _mm_max_ps(_mm256_castps256_ps128(peak), _mm256_extractf128_ps(peak, 1));
            p = _mm_max_ps(p, _mm_movehl_ps(p, p));
            p = _mm_max_ss(p, _mm_movehdup_ps(p));
            const float amax = _mm_cvtss_f32(p), d = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
            xd[r * (k / BLOCK) + b] = d;
            __m256i q[4];
            for (int i = 0; i < 4; i++)  /* x · (127 / max), rounded half to even as torch.round */
                q[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], _mm256_set1_ps(inv)),
                                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            __m256i q01 = _mm256_packs_epi32(q[0], q[1]), q23 = _mm256_packs_epi32(q[2], q[3]);
            __m256i bytes = _mm256_packs_epi16(q01, q23);
            bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(xq + r * k + b * BLOCK), bytes);
        }
    }
}

/* Rows j .. j + rows - 1 (rows <= 4) of out for activation row r: the activations' absolute
 * values are taken once per block for all of them. */
static inline void dot_rows(int rows, const int8_t *q, const float *wd, const int8_t *a, const float *d, int64_t j,
                            int64_t k, float *out) {
    const int64_t blocks = k / BLOCK;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < blocks; b++) {
        const __m256i ab = _mm256_loadu_si256((const __m256i *)(a + b * BLOCK));
        const __m256i magnitude = _mm256_sign_epi8(ab, ab);
        for (int t = 0; t < rows; t++) {
            const __m256i wb = _mm256_loadu_si256((const __m256i *)(q + (j + t) * k + b * BLOCK));
            const __m256i pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(wb, ab));
            const __m256 sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
            acc[t] = _mm256_fmadd_ps(sums, _mm256_set1_ps(d[b] * wd[(j + t) * blocks + b]), acc[t]);
        }
    }
    for (int t = 0; t < rows; t++) out[j + t] = hsum(acc[t]);
}

/* out (m, n) = x (m, k) · (q (n, k) · wd (n, k / 32) per block)ᵀ */
int attnkit_int8_matmul(const float *x, const int8_t *q, const float *wd, float *out, int64_t m, int64_t n,
                        int64_t k) {
    if (k % BLOCK) return 1;
    int8_t *xq = aligned_alloc(64, (size_t)((m * k + 63) / 64 * 64));
    float *xd = malloc(sizeof(float) * (size_t)(m * (k / BLOCK) + 1));
    if (!xq || !xd) { free(xq); free(xd); return 2; }
    quantize_blocks(x, m, k, xq, xd);
    const int64_t groups = (n + 3) / 4;
    #pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < groups; g++) {
        const int64_t j = 4 * g;
        const int rows = n - j < 4 ? (int)(n - j) : 4;
        for (int64_t r = 0; r < m; r++) {
            if (rows == 4)
                dot_rows(4, q, wd, xq + r * k, xd + r * (k / BLOCK), j, k, out + r * n);
            else
                dot_rows(rows, q, wd, xq + r * k, xd + r * (k / BLOCK), j, k, out + r * n);
        }
    }
    free(xq);
    free(xd);
    return 0;
}
