// The op attnkit::block_matmul (its schema is defined in attnkit/kernels/__init__.py) as a C++
// kernel over blocks.c, linked into the same library: the dispatcher calls it without
// entering Python. At batch 1 a product of SmolLM2's 576 x 576 takes about 30 us in C, and the
// Python kernel this replaces (kept as the fallback where this file does not build) added about
// 25 us to every call, 121 calls a token. Built by attnkit.kernels with the torch headers.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <torch/library.h>

#include <string_view>
#include <vector>

extern "C" {
int attnkit_block_matmul(int format, const float *x, int count, const uint8_t *const *w, const uint16_t *const *wd,
                         const uint16_t *const *wm, const uint8_t *const *packed, const int64_t *n, float *out,
                         int64_t m, int64_t k);
int64_t attnkit_packed_bytes(int format);
int attnkit_block_dequantize(int format, int count, const uint8_t *const *w, const uint16_t *const *wd,
                             const uint16_t *const *wm, const int64_t *n, float *out, int64_t k);
}

namespace {

int format_code(std::string_view format) {  // blocks.c's enum, kernels.FORMATS' order
    if (format == "q8_0") return 0;
    if (format == "q4_0") return 1;
    TORCH_CHECK(format == "q4_1", "format=", format, " is not a block format; use one of q8_0, q4_0, q4_1");
    return 2;
}

void check_status(int status) {
    TORCH_CHECK(status == 0, "the block kernel failed (status ", status,
                ": 1 = k not a multiple of 32, 2 = no memory, 3 = unknown format, 4 = more than 8 weights)");
}

// x (m, k) fp32 times the weights' blocks side by side: (m, sum n_i), as kernels.ops._run_ctypes.
at::Tensor block_matmul(const at::Tensor &x, std::string_view format, at::TensorList data, at::TensorList d,
                        at::TensorList mins, at::TensorList packed) {
    const int code = format_code(format);
    const int count = static_cast<int>(data.size());
    TORCH_CHECK(count >= 1 && count <= 8, "block_matmul takes 1 to 8 weights, not ", count);
    TORCH_CHECK(d.size() == data.size() && packed.size() == data.size() &&
                    mins.size() == (code == 2 ? data.size() : 0),
                "block_matmul: one scale tensor and one packed tensor per weight, and minima for q4_1 only");
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "block_matmul takes x (m, k) in fp32");
    const at::Tensor input = x.contiguous();
    std::vector<at::Tensor> held;  // contiguous copies, where a weight is not (kept alive for the call)
    auto pointer = [&held](const at::Tensor &t) -> const void * {
        if (t.numel() == 0) return nullptr;
        if (t.is_contiguous()) return t.data_ptr();
        held.push_back(t.contiguous());
        return held.back().data_ptr();
    };
    const uint8_t *w[8], *groups[8];
    const uint16_t *wd[8], *wm[8];
    int64_t n[8], width = 0;
    bool any_packed = false;
    const int64_t m = input.size(0), k = input.size(1);
    const int64_t group_bytes = (k / 32) * attnkit_packed_bytes(code);  // a packed group of 8 rows
    for (int i = 0; i < count; i++) {
        w[i] = static_cast<const uint8_t *>(pointer(data[i]));
        wd[i] = static_cast<const uint16_t *>(pointer(d[i]));
        wm[i] = code == 2 ? static_cast<const uint16_t *>(pointer(mins[i])) : wd[i];
        groups[i] = static_cast<const uint8_t *>(pointer(packed[i]));
        any_packed = any_packed || groups[i] != nullptr;
        n[i] = data[i].size(0) + (group_bytes ? 8 * (packed[i].numel() / group_bytes) : 0);  // packed, then the rest
        width += n[i];
    }
    const auto fp32 = at::TensorOptions().dtype(at::kFloat);
    if (m >= ATTNKIT_DENSE_ROWS && !any_packed) {  // dequantised, then one dense fp32 product
        at::Tensor dense = at::empty({width, k}, fp32);
        check_status(attnkit_block_dequantize(code, count, w, wd, wm, n, dense.data_ptr<float>(), k));
        return at::mm(input, dense.t());
    }
    at::Tensor out = at::empty({m, width}, fp32);
    check_status(attnkit_block_matmul(code, input.data_ptr<float>(), count, w, wd, wm, groups, n,
                                      out.data_ptr<float>(), m, k));
    return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(attnkit, CPU, library) { library.impl("block_matmul", TORCH_FN(block_matmul)); }
