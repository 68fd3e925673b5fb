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
static inline float lum_u2f(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned lum_f2u(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
"#;

/// Definitions for NVRTC (CUDA C++): kernels get C linkage so that their names are found
/// unmangled in the module.
pub const CUDA_PRELUDE: &str = r#"#define LUM_EXTERN_C extern "C"
#define LUM_DEV static __device__ __forceinline__
LUM_DEV float lum_u2f(unsigned u) { return __uint_as_float(u); }
LUM_DEV unsigned lum_f2u(float f) { return __float_as_uint(f); }
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
