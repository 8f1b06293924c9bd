// __half and __nv_bfloat16 for the CPU emulation (cpu_emulation.h): host structs of their bits,
// with the round-to-nearest-even conversions of cuda_fp16.h and cuda_bf16.h.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

struct __half {
    uint16_t bits;
};
struct __nv_bfloat16 {
    uint16_t bits;
};

namespace tf_emu {
inline uint32_t float_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}
inline float bits_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}
inline float half_bits_to_float(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    if (exponent == 0) {
        const float magnitude = std::ldexp(float(mantissa), -24);  // zero or subnormal
        return sign ? -magnitude : magnitude;
    }
    if (exponent == 31) return bits_float(sign | 0x7f800000u | (mantissa << 13));  // inf, nan
    return bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}
// The 65,536 values of the half bit patterns, decoded once (the mma emulation converts many).
inline const float* half_table() {
    static const std::vector<float> table = [] {
        std::vector<float> t(65536);
        for (uint32_t h = 0; h < 65536; ++h) t[h] = half_bits_to_float(uint16_t(h));
        return t;
    }();
    return table.data();
}
}  // namespace tf_emu

inline float __half2float(__half h) { return tf_emu::half_table()[h.bits]; }

// float -> half, round to nearest even: overflow to inf, subnormals by exact scaling.
inline __half __float2half_rn(float f) {
    const uint32_t x = tf_emu::float_bits(f), sign = (x >> 16) & 0x8000u, magnitude = x & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return {uint16_t(sign | 0x7e00u)};             // nan
    if (magnitude >= 0x477ff000u) return {uint16_t(sign | 0x7c00u)};            // >= 65520 rounds to inf
    if (magnitude < 0x38800000u) {                                                // below 2^-14: subnormal
        const float scaled = tf_emu::bits_float(magnitude) * 16777216.0f;         // exact: × 2^24
        return {uint16_t(sign | uint32_t(std::nearbyint(scaled)))};               // ties to even
    }
    const uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
    return {uint16_t(sign | ((rounded - 0x38000000u) >> 13))};
}

inline float __bfloat162float(__nv_bfloat16 b) { return tf_emu::bits_float(uint32_t(b.bits) << 16); }

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    const uint32_t x = tf_emu::float_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return {uint16_t((x >> 16) | 0x40u)};  // nan stays nan
    return {uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16)};
}

inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.bits; }
