/* attnkit's block kernel (attnkit/kernels/blocks.c) as a program, for testing it on an architecture
 * this machine is not: built for ARM64 and run under qemu-aarch64 by test_neon.py. Reads from
 * stdin, all little-endian:
 *   int64 mode (0: attnkit_block_matmul, 1: attnkit_block_dequantize), format, m, k, count;
 *   per weight, int64 n, then the bytes of its data, scales, minima and packed groups (4 int64);
 *   mode 0: x, m · k fp32;
 *   per weight, those four byte strings (an empty one: NULL).
 * Writes the output's fp32 values to stdout (m · Σn for mode 0, Σn · k for mode 1); exits with the
 * kernel's status (9 for input it could not read). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int attnkit_block_matmul(int format, const float *x, int count, const uint8_t *const *w, const uint16_t *const *wd,
                         const uint16_t *const *wm, const uint8_t *const *packed, const int64_t *n, float *out,
                         int64_t m, int64_t k);
int attnkit_block_dequantize(int format, int count, const uint8_t *const *w, const uint16_t *const *wd,
                             const uint16_t *const *wm, const int64_t *n, float *out, int64_t k);

static void *read_bytes(int64_t size) {
    if (size == 0) return NULL;
    void *data = malloc((size_t)size);
    if (!data || fread(data, 1, (size_t)size, stdin) != (size_t)size) exit(9);
    return data;
}

int main(void) {
    int64_t header[5], sizes[8][5], n[8], width = 0;
    if (fread(header, sizeof header, 1, stdin) != 1 || header[4] < 1 || header[4] > 8) return 9;
    const int64_t mode = header[0], format = header[1], m = header[2], k = header[3], count = header[4];
    for (int i = 0; i < count; i++) {
        if (fread(sizes[i], sizeof sizes[i], 1, stdin) != 1) return 9;
        n[i] = sizes[i][0];
        width += n[i];
    }
    const float *x = mode == 0 ? read_bytes(m * k * (int64_t)sizeof(float)) : NULL;
    const uint8_t *w[8], *packed[8];
    const uint16_t *wd[8], *wm[8];
    for (int i = 0; i < count; i++) {
        w[i] = read_bytes(sizes[i][1]);
        wd[i] = read_bytes(sizes[i][2]);
        wm[i] = read_bytes(sizes[i][3]);
        packed[i] = read_bytes(sizes[i][4]);
    }
    const int64_t size = mode == 0 ? m * width : width * k;
    float *out = malloc(sizeof(float) * (size_t)(size ? size : 1));
    if (!out) return 9;
    const int status = mode == 0 ? attnkit_block_matmul((int)format, x, (int)count, w, wd, wm, packed, n, out, m, k)
                                 : attnkit_block_dequantize((int)format, (int)count, w, wd, wm, n, out, k);
    if (status == 0 && fwrite(out, sizeof(float), (size_t)size, stdout) != (size_t)size) return 9;
    return status;
}
