//! The C prelude every generated kernel is compiled with, by NVRTC on a GPU and by the
//! system C compiler in the host emulator ([`crate::host`]). It uses no header under NVRTC
//! (no `cuda_fp16.h`): halves are stored as `unsigned short` and converted here, with
//! round-to-nearest-even, so the same source means the same thing on both compilers.

/// Definitions for the host C compiler: CUDA's keywords and thread indices become plain C
/// (the emulator's launcher loops over blocks and threads, setting the indices).
pub const HOST_PRELUDE: &str = r#"#include <math.h>
#include <string.h>
#define __global__
#define __device__
#define __restrict__ restrict
typedef struct { unsigned x, y, z; } lum_dim3;
static _Thread_local lum_dim3 blockIdx, blockDim, threadIdx, gridDim;
#define LUM_EXTERN_C
#define LUM_DEV static inline
#define LUM_REDUCE_BOUNDS
static inline float lum_u2f(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned lum_f2u(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
/* ISO C mode contracts no products into fused multiply-adds (and x86-64 has none by default). */
#define lum_mul(a, b) ((a) * (b))
"#;

/// Definitions for NVRTC (CUDA C++): kernels get C linkage so that their names are found
/// unmangled in the module.
pub const CUDA_PRELUDE: &str = r#"#define LUM_EXTERN_C extern "C"
#define LUM_DEV static __device__ __forceinline__
/* At every generated kernel's entry (crate::codegen::cuda_source): wait until the kernel
   before it (launched as a programmatic dependency) has finished and its writes are
   visible, then let the next one be launched. Both return at once for a plain launch. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define LUM_PDL_ENTRY asm volatile("griddepcontrol.wait;" ::: "memory"); asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#else
#define LUM_PDL_ENTRY
#endif
/* Reductions launch up to 512 threads per block (codegen::MAX_THREADS_PER_OUTPUT). */
#define LUM_REDUCE_BOUNDS __launch_bounds__(512)
LUM_DEV float lum_u2f(unsigned u) { return __uint_as_float(u); }
LUM_DEV unsigned lum_f2u(float f) { return __float_as_uint(f); }
/* A product NVRTC never contracts into an FMA with a following add: the dequantizers round
   each product, as ggml's and the core's f32 decoders do, so values match them bit for bit. */
LUM_DEV float lum_mul(float a, float b) { return __fmul_rn(a, b); }
"#;

/// Dtype conversions and helpers, shared by both compilers (after one of the above and
/// luminal's shape prelude, which defines `floor_div`, `floor_mod`, `lum_min`, `lum_max`).
pub const COMMON_PRELUDE: &str = r#"#define LUM_INF lum_u2f(0x7f800000u)
#define LUM_NAN lum_u2f(0x7fc00000u)
LUM_DEV float lum_f16_to_f32(unsigned short h) {
    unsigned sign = ((unsigned)h & 0x8000u) << 16, e = ((unsigned)h >> 10) & 0x1fu, m = (unsigned)h & 0x3ffu;
    if (e == 0) { float v = (float)m * 5.9604644775390625e-8f; return sign ? -v : v; }
    if (e == 31) return lum_u2f(sign | 0x7f800000u | (m << 13));
    return lum_u2f(sign | ((e + 112u) << 23) | (m << 13));
}
LUM_DEV unsigned short lum_f32_to_f16(float f) {
    unsigned x = lum_f2u(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (unsigned short)(sign | 0x7e00u);
    if (ax >= 0x47800000u) return (unsigned short)(sign | 0x7c00u);
    if (ax < 0x33000000u) return (unsigned short)sign;
    if (ax < 0x38800000u) {
        unsigned m = (ax & 0x7fffffu) | 0x800000u, shift = 126u - (ax >> 23);
        unsigned r = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (unsigned short)(sign | r);
    }
    unsigned r = (((ax >> 23) - 112u) << 10) | ((ax & 0x7fffffu) >> 13), rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return (unsigned short)(sign | r);
}
LUM_DEV float lum_bf16_to_f32(unsigned short h) { return lum_u2f((unsigned)h << 16); }
LUM_DEV unsigned short lum_f32_to_bf16(float f) {
    unsigned x = lum_f2u(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);
    return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
/* Float to i32 as the reference rounds: truncate toward zero through i64 (saturating, like
   Rust's `as i64`), then wrap to i32; NaN is 0. */
LUM_DEV int lum_f2i(double v) {
    if (v != v) return 0;
    if (v >= 9223372036854775807.0) return -1;
    if (v <= -9223372036854775808.0) return 0;
    return (int)(unsigned long long)(long long)v;
}
"#;

/// Dequantizers of the core's byte storage ([`luminal::quant`]): `lum_deq_<type>(blocks, i)`
/// is element `i` of a buffer of whole blocks, as the core's decoder computes it (same f32
/// operations in the same order, products rounded on their own, so equal bit for bit). A
/// quantized buffer is read only by a cast (`w.dequantize()`), through the cast's view, so
/// each thread decodes the one element it needs; the block layouts are in the core's docs.
pub const QUANT_PRELUDE: &str = r#"typedef const unsigned char* lum_q;
LUM_DEV float lum_half_at(lum_q p) { return lum_f16_to_f32((unsigned short)(p[0] | (p[1] << 8))); }
LUM_DEV unsigned lum_u32_at(lum_q p) { return (unsigned)p[0] | ((unsigned)p[1] << 8) | ((unsigned)p[2] << 16) | ((unsigned)p[3] << 24); }
LUM_DEV int lum_nibble(lum_q qs, long long j) { return j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4); }
LUM_DEV float lum_deq_q4_0(lum_q b, long long i) {
    lum_q p = b + (i / 32) * 18; long long j = i % 32;
    return lum_mul(lum_half_at(p), (float)(lum_nibble(p + 2, j) - 8));
}
LUM_DEV float lum_deq_q4_1(lum_q b, long long i) {
    lum_q p = b + (i / 32) * 20; long long j = i % 32;
    return lum_mul(lum_half_at(p), (float)lum_nibble(p + 4, j)) + lum_half_at(p + 2);
}
LUM_DEV float lum_deq_q5_0(lum_q b, long long i) {
    lum_q p = b + (i / 32) * 22; long long j = i % 32;
    int q = lum_nibble(p + 6, j) | (int)((lum_u32_at(p + 2) >> j) & 1u) << 4;
    return lum_mul(lum_half_at(p), (float)(q - 16));
}
LUM_DEV float lum_deq_q5_1(lum_q b, long long i) {
    lum_q p = b + (i / 32) * 24; long long j = i % 32;
    int q = lum_nibble(p + 8, j) | (int)((lum_u32_at(p + 4) >> j) & 1u) << 4;
    return lum_mul(lum_half_at(p), (float)q) + lum_half_at(p + 2);
}
LUM_DEV float lum_deq_q8_0(lum_q b, long long i) {
    lum_q p = b + (i / 32) * 34;
    return lum_mul((float)(signed char)p[2 + i % 32], lum_half_at(p));
}
/* K-quants: 256 elements per super-block; e is the element within it. */
LUM_DEV float lum_deq_q2_k(lum_q b, long long i) {
    lum_q p = b + (i / 256) * 84; int e = (int)(i % 256);
    int half = e / 128, shift = (e % 128) / 32, l = e % 32, sub = e / 16;
    float dl = lum_mul(lum_half_at(p + 80), (float)(p[sub] & 15));
    float ml = lum_mul(lum_half_at(p + 82), (float)(p[sub] >> 4));
    return lum_mul(dl, (float)((p[16 + 32 * half + l] >> (2 * shift)) & 3)) - ml;
}
LUM_DEV float lum_deq_q3_k(lum_q b, long long i) {
    lum_q p = b + (i / 256) * 110; int e = (int)(i % 256);
    int half = e / 128, shift = (e % 128) / 32, l = e % 32, j = e / 16;
    lum_q packed = p + 96;
    int low = (packed[j % 8] >> (4 * (j / 8))) & 15, high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
    float dl = lum_mul(lum_half_at(p + 108), (float)((low | high << 4) - 32));
    int q = ((p[32 + 32 * half + l] >> (2 * shift)) & 3) | ((p[l] >> (4 * half + shift)) & 1) << 2;
    return lum_mul(dl, (float)(q - 4));
}
/* Scale and min of sub-block j (0..8) of a Q4_K/Q5_K block, 6 bits each in 12 bytes. */
LUM_DEV void lum_k4_scale_min(lum_q packed, int j, int* scale, int* min) {
    if (j < 4) { *scale = packed[j] & 63; *min = packed[j + 4] & 63; }
    else {
        *scale = (packed[j + 4] & 15) | ((packed[j - 4] >> 6) << 4);
        *min = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
    }
}
LUM_DEV float lum_deq_q4_k(lum_q b, long long i) {
    lum_q p = b + (i / 256) * 144; int e = (int)(i % 256);
    int sub = e / 32, l = e % 32, scale, min;
    lum_k4_scale_min(p + 4, sub, &scale, &min);
    float dl = lum_mul(lum_half_at(p), (float)scale), ml = lum_mul(lum_half_at(p + 2), (float)min);
    int q = (p[16 + 32 * (sub / 2) + l] >> (4 * (sub % 2))) & 15;
    return lum_mul(dl, (float)q) - ml;
}
LUM_DEV float lum_deq_q5_k(lum_q b, long long i) {
    lum_q p = b + (i / 256) * 176; int e = (int)(i % 256);
    int sub = e / 32, l = e % 32, scale, min;
    lum_k4_scale_min(p + 4, sub, &scale, &min);
    float dl = lum_mul(lum_half_at(p), (float)scale), ml = lum_mul(lum_half_at(p + 2), (float)min);
    int q = ((p[48 + 32 * (sub / 2) + l] >> (4 * (sub % 2))) & 15) | ((p[16 + l] >> sub) & 1) << 4;
    return lum_mul(dl, (float)q) - ml;
}
LUM_DEV float lum_deq_q6_k(lum_q b, long long i) {
    lum_q p = b + (i / 256) * 210; int e = (int)(i % 256);
    int half = e / 128, k = (e % 128) / 32, l = e % 32, sub = e / 16;
    int low = (p[64 * half + 32 * (k % 2) + l] >> (4 * (k / 2))) & 15;
    int high = (p[128 + 32 * half + l] >> (2 * k)) & 3;
    float dl = lum_mul(lum_half_at(p + 208), (float)(signed char)p[192 + sub]);
    return lum_mul(dl, (float)((low | high << 4) - 32));
}
"#;
