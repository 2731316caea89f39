// ---- firesched prelude: raw storage types, conversions in PTX or integer code ----
#ifndef FIRESCHED_PRELUDE
#define FIRESCHED_PRELUDE

// 2^x in one MUFU.EX2 (ex2.approx.ftz: 2 ulp; results below 2^-126 flush to 0). exp2f would
// also scale subnormal results, three more instructions an element of a softmax.
static __device__ __forceinline__ float fs_ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// f16 <-> f32 (round to nearest even)
static __device__ __forceinline__ float fs_f16_to_f32(unsigned short x)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
}

static __device__ __forceinline__ unsigned short fs_f32_to_f16(float f)
{
    unsigned short x;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(x) : "f"(f));
    return x;
}

// bf16 <-> f32: a bf16 is the high half of an f32
static __device__ __forceinline__ float fs_bf16_to_f32(unsigned short x)
{
    return __uint_as_float((unsigned)x << 16);
}

// element i of a register array of bf16 pairs (alignas(16), an even length) as f32, read from
// the 32-bit word that holds it: one shift or one mask, where extracting the 16-bit element
// first takes a byte permute besides
//     word i/2:  [ hi = element 2k+1 | lo = element 2k ]
//     2k   -> lo << 16            2k+1 -> word & 0xffff0000
static __device__ __forceinline__ float fs_bf16_at(const unsigned short* p, int i)
{
    unsigned w;
    memcpy(&w, p + (i & ~1), 4);        // the pair's word, without reading a short as an unsigned
    return __uint_as_float((i & 1) ? (w & 0xffff0000u) : (w << 16));
}

static __device__ __forceinline__ unsigned short fs_f32_to_bf16(float f)
{
#if __CUDA_ARCH__ >= 800
    unsigned short x;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(x) : "f"(f));
    return x;
#else
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (unsigned short)((u >> 16) | 0x40u);  // a NaN stays a (quiet) NaN
    }
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    return (unsigned short)(u >> 16);
#endif
}

// f32 -> tf32 (kept in an f32): 10 mantissa bits, ties away from zero, as cvt.rna.tf32.f32
static __device__ __forceinline__ float fs_f32_to_tf32(float f)
{
    return __uint_as_float((__float_as_uint(f) + 0x1000u) & 0xffffe000u);
}

// 8-bit floats.  e4m3 has no infinities (S.1111.111 is NaN), e5m2 is the high byte of an f16.
static __device__ __forceinline__ float fs_e4m3_to_f32(unsigned char x)
{
    const unsigned sign = (unsigned)(x & 0x80u) << 24;
    const unsigned e = (x >> 3) & 0xfu;
    const unsigned m = x & 0x7u;
    if (e == 0xfu && m == 0x7u) {
        return __uint_as_float(sign | 0x7fc00000u);
    }
    if (e == 0u) {
        return __uint_as_float(sign | __float_as_uint((float)m * 0.001953125f));  // m * 2^-9
    }
    return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));
}

static __device__ __forceinline__ float fs_e5m2_to_f32(unsigned char x)
{
    return fs_f16_to_f32((unsigned short)((unsigned)x << 8));
}

// f32 -> an 8-bit float with `mbits` mantissa bits and exponent bias `bias`, rounding to nearest
// even; `maxcode` is the largest finite code, `overflow` the code of anything rounding past it.
static __device__ __forceinline__ unsigned char fs_f32_to_f8(float f, unsigned mbits, unsigned bias,
                                                             unsigned maxcode, unsigned overflow,
                                                             unsigned nan)
{
    const unsigned u = __float_as_uint(f);
    const unsigned sign = (u >> 24) & 0x80u;
    unsigned a = u & 0x7fffffffu;
    if (a > 0x7f800000u) {
        return (unsigned char)(sign | nan);
    }
    unsigned code;
    if (a < ((128u - bias) << 23)) {
        // below the smallest normal: count subnormal steps of 2^(1 - bias - mbits)
        const float scale = __uint_as_float((bias + mbits - 1u + 127u) << 23);
        code = __float2uint_rn(__uint_as_float(a) * scale);
    } else {
        a += (1u << (22u - mbits)) - 1u + ((a >> (23u - mbits)) & 1u);
        code = (a >> (23u - mbits)) - ((127u - bias) << mbits);
    }
    return (unsigned char)(sign | (code > maxcode ? overflow : code));
}

static __device__ __forceinline__ unsigned char fs_f32_to_e4m3(float f)
{
    return fs_f32_to_f8(f, 3u, 7u, 0x7eu, 0x7fu, 0x7fu);
}

static __device__ __forceinline__ unsigned char fs_f32_to_e5m2(float f)
{
    return fs_f32_to_f8(f, 2u, 15u, 0x7bu, 0x7cu, 0x7eu);
}

// f32 -> integers: round to nearest even, saturate (NaN gives 0)
static __device__ __forceinline__ signed char fs_f32_to_i8(float f)
{
    const int v = __float2int_rn(f);
    return (signed char)(v < -128 ? -128 : v > 127 ? 127 : v);
}

static __device__ __forceinline__ unsigned char fs_f32_to_u8(float f)
{
    const unsigned v = __float2uint_rn(f);
    return (unsigned char)(v > 255u ? 255u : v);
}

static __device__ __forceinline__ int fs_f32_to_i4(float f)
{
    const int v = __float2int_rn(f);
    return v < -8 ? -8 : v > 7 ? 7 : v;
}

static __device__ __forceinline__ int fs_f32_to_u4(float f)
{
    const unsigned v = __float2uint_rn(f);
    return (int)(v > 15u ? 15u : v);
}

// integer arithmetic of integer registers: in 64 bits, saturated when stored
static __device__ __forceinline__ long long fs_max_ll(long long a, long long b)
{
    return a > b ? a : b;
}

static __device__ __forceinline__ long long fs_sat(long long v, long long lo, long long hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

// 4-bit elements, two per byte, low nibble first
static __device__ __forceinline__ int fs_i4_get(const unsigned char* p, int i)
{
    const int v = (p[i >> 1] >> ((i & 1) * 4)) & 0xf;
    return v >= 8 ? v - 16 : v;
}

static __device__ __forceinline__ int fs_u4_get(const unsigned char* p, int i)
{
    return (p[i >> 1] >> ((i & 1) * 4)) & 0xf;
}

static __device__ __forceinline__ void fs_4bit_set(unsigned char* p, int i, int v)
{
    const int s = (i & 1) * 4;
    p[i >> 1] = (unsigned char)((p[i >> 1] & ~(0xf << s)) | ((v & 0xf) << s));
}

#endif  // FIRESCHED_PRELUDE

// ---- firesched sm_90a prelude: arch check, tensor maps, wgmma descriptors ----
#ifndef FIRESCHED_PRELUDE_SM90
#define FIRESCHED_PRELUDE_SM90

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "firesched: this unit uses sm_90a instructions (wgmma, TMA, mbarrier, stmatrix, setmaxnreg); compile it with arch='sm_90a'"
#endif

// A TMA descriptor as cuTensorMapEncodeTiled writes it: 128 opaque bytes, 64-byte aligned.
struct alignas(64) CUtensorMap {
    unsigned long long opaque[16];
};

// wgmma shared-memory matrix descriptor: start address >> 4 in bits 0-13, leading byte offset
// >> 4 in 16-29, stride byte offset >> 4 in 32-45, base offset 0, swizzle mode in 62-63
// (0 none, 1 128B, 2 64B, 3 32B).
static __device__ __forceinline__ unsigned long long fs_smem_desc(unsigned addr, unsigned lbo, unsigned sbo,
                                                                  unsigned mode)
{
    return (unsigned long long)((addr & 0x3FFFFu) >> 4)
        | ((unsigned long long)((lbo >> 4) & 0x3FFFu) << 16)
        | ((unsigned long long)((sbo >> 4) & 0x3FFFu) << 32)
        | ((unsigned long long)(mode & 3u) << 62);
}

// The descriptor ``units`` x 16 bytes past ``desc``'s start: the start field (bits 0-13, the
// address >> 4) takes the sum without a carry, a shared address being below 2^18.
static __device__ __forceinline__ unsigned long long fs_desc_add(unsigned long long desc, unsigned units)
{
    return (desc & 0xFFFFFFFF00000000ull) | (unsigned)((unsigned)desc + units);
}

// Register fences: the compiler may not move accesses of the register across them.
static __device__ __forceinline__ void fs_fence_reg(float& r)
{
    asm volatile("" : "+f"(r) : : "memory");
}

static __device__ __forceinline__ void fs_fence_reg(unsigned short& r)
{
    asm volatile("" : "+h"(r) : : "memory");
}

#endif  // FIRESCHED_PRELUDE_SM90

// MatMul<kernel>(A:GL bf16[2048x2048], B:GL bf16[2048x2048], C:GL f32[2048x2048]) acc f32
//   tile(m=128, n=128) >> to_blocks(group=8, persistent=True)
//   for m0 in block(16) grouped(8) persistent, n0 in block(16) grouped(8) persistent:
//     MatMul<block>(A:GL bf16[128x2048], B:GL bf16[2048x128], C:GL f32[128x128]) acc f32
//       tile(k=32)
//       Init<block>(C:RF f32[128x128] = 0)
//       for k0 in seq(64) pipelined(8 stages) warp-specialized(producer 40 regs, consumers 232):
//         MatMul<block>(A:GL bf16[128x32], B:GL bf16[32x128], C:RF f32[128x128]) acc f32
//           move_to_smem('A', via=(sm90a.tma_load_2d,))
//           Move<block>(A:GL bf16[128x32] -> A:SH bf16[128x32] Sw<2,3,3> x8 stages)
//             via tma_load_2d
//           MatMul<block>(A:SH bf16[128x32] Sw<2,3,3> x8 stages, B:GL bf16[32x128], C:RF f32[128x128]) acc f32
//             move_to_smem('B', via=(sm90a.tma_load_2d,))
//             Move<block>(B:GL bf16[32x128] -> B:SH bf16[32x128] Sw<2,3,3> x8 stages)
//               via tma_load_2d
//             MatMul<block>(A:SH bf16[128x32] Sw<2,3,3> x8 stages, B:SH bf16[32x128] Sw<2,3,3> x8 stages, C:RF f32[128x128]) acc f32
//               tile(m=64) >> to_warpgroups()
//               for m1 in warpgroup(2):
//                 MatMul<warpgroup>(A:SH bf16[64x32] Sw<2,3,3> x8 stages, B:SH bf16[32x128] Sw<2,3,3> x8 stages, C:RF f32[64x128]) acc f32
//                   tile(k=16)
//                   for k1 in seq(2):
//                     MatMul<warpgroup>(A:SH bf16[64x16] Sw<2,3,3> x8 stages, B:SH bf16[16x128] Sw<2,3,3> x8 stages, C:RF f32[64x128]) acc f32
//                       done(sm90a.wgmma_m64n128k16_bf16_f32_ss)
//       Move<block>(C:RF f32[128x128] -> C:GL f32[128x128])
// firesched_matmul: grid (132, 1, 1) x 384 threads, 164864 bytes of dynamic shared memory
extern "C" __global__ void __launch_bounds__(384, 1) firesched_matmul(
    const __grid_constant__ CUtensorMap tmap_A,
    const __grid_constant__ CUtensorMap tmap_B,
    const __grid_constant__ CUtensorMap tmap_C)
{
    const int tid = threadIdx.x;
    const int bid_x = blockIdx.x;
    extern __shared__ __align__(1024) unsigned char fs_smem[];
    // A_smem: bf16[32768] at byte 0, 8 stage(s) x 128x32 bf16, K-major, 64B swizzle
    unsigned short* const A_smem = reinterpret_cast<unsigned short*>(fs_smem + 0);
    const unsigned A_smem_base = (unsigned)__cvta_generic_to_shared(A_smem);
    // B_smem: bf16[32768] at byte 65536, 8 stage(s) x 32x128 bf16, K-major, 64B swizzle
    unsigned short* const B_smem = reinterpret_cast<unsigned short*>(fs_smem + 65536);
    const unsigned B_smem_base = (unsigned)__cvta_generic_to_shared(B_smem);
    // full: f64[8] at byte 131072, one per stage: the stage's TMA bytes have landed
    unsigned long long* const full = reinterpret_cast<unsigned long long*>(fs_smem + 131072);
    const unsigned full_base = (unsigned)__cvta_generic_to_shared(full);
    // empty: f64[8] at byte 131136, one per stage: all 2 consumer warpgroups are done reading it
    unsigned long long* const empty = reinterpret_cast<unsigned long long*>(fs_smem + 131136);
    const unsigned empty_base = (unsigned)__cvta_generic_to_shared(empty);
    // C_smem: f32[8192] at byte 132096, 2 buffers x 2 consumer warpgroups x 64x32 f32, 128B swizzle (TMA-store staging)
    float* const C_smem = reinterpret_cast<float*>(fs_smem + 132096);
    const unsigned C_smem_base = (unsigned)__cvta_generic_to_shared(C_smem);
    alignas(16) float C_acc[64] = {};  // f32 x 64
    alignas(16) float epi[2] = {};  // f32 x 2
    alignas(16) float out_f32[2] = {};  // f32 x 2

    // MatMul<block>(A:GL bf16[128x2048], B:GL bf16[2048x128], C:GL f32[128x128]) acc f32
    if (tid < 1) {
        // sm90a.mbarrier_init
        //   bar = &full[0], count = 1
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
            :
            : "r"(full_base), "r"((int)(1))
            : "memory");
        // sm90a.mbarrier_init
        //   bar = &full[1], count = 1
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
            :
            : "r"(full_base + 8), "r"((int)(1))
            : "memory");
        // sm90a.mbarrier_init
        //   bar = &full[2], count = 1
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
            :
            : "r"(full_base + 16), "r"((int)(1))
            : "memory");
        // sm90a.mbarrier_init
        //   bar = &full[3], count = 1
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
            :
            : "r"(full_base + 24), "r"((int)(1))
            : "memory");
        // sm90a.mbarrier_init
        //   bar = &full[4], count = 1
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
            :
            : "r"(full_base + 32), "r"((int)(1))
            : "memory");
        // sm90a.mbarrier_init
        //   bar = &full[5], count = 1
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
            :
            : "r"(full_base + 40), "r"((int)(1))
            : "memory");
        // sm90a.mbarrier_init
        //   bar = &full[6], count = 1
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
            :
            : "r"(full_base + 48), "r"((int)(1))
            : "memory");
        // sm90a.mbarrier_init
        //   bar = &full[7], count = 1
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
            :
            : "r"(full_base + 56), "r"((int)(1))
            : "memory");
        // sm90a.mbarrier_init
        //   bar = &empty[0], count = 2
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
            :
            : "r"(empty_base), "r"((int)(2))
            : "memory");
        // sm90a.mbarrier_init
        //   bar = &empty[1], count = 2
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
            :
            : "r"(empty_base + 8), "r"((int)(2))
            : "memory");
        // sm90a.mbarrier_init
        //   bar = &empty[2], count = 2
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
            :
            : "r"(empty_base + 16), "r"((int)(2))
            : "memory");
        // sm90a.mbarrier_init
        //   bar = &empty[3], count = 2
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
            :
            : "r"(empty_base + 24), "r"((int)(2))
            : "memory");
        // sm90a.mbarrier_init
        //   bar = &empty[4], count = 2
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
            :
            : "r"(empty_base + 32), "r"((int)(2))
            : "memory");
        // sm90a.mbarrier_init
        //   bar = &empty[5], count = 2
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
            :
            : "r"(empty_base + 40), "r"((int)(2))
            : "memory");
        // sm90a.mbarrier_init
        //   bar = &empty[6], count = 2
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
            :
            : "r"(empty_base + 48), "r"((int)(2))
            : "memory");
        // sm90a.mbarrier_init
        //   bar = &empty[7], count = 2
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
            :
            : "r"(empty_base + 56), "r"((int)(2))
            : "memory");
        // sm90a.fence_mbarrier_init
        asm volatile("fence.mbarrier_init.release.cluster;"
            :
            :
            : "memory");
    }
    // mbarriers initialised
    __syncthreads();
    if (tid < 128) {  // role producer: threads 0..127
        const int rtid = tid - 0;  // thread index within the role
        // sm90a.setmaxnreg_dec: the producer needs few registers
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;"
            :
            :
            : "memory");
        if (tid < 1) {
            // tiles of this block: 2
            #pragma unroll 1
            for (int tile_i = 0; tile_i < 2; ++tile_i) {
                if (bid_x + tile_i * 132 < 256) {
                    #pragma unroll 1
                    for (int k0 = 0; k0 < 64; ++k0) {
                        // sm90a.mbarrier_try_wait: the consumers released the stage (the first round returns at once)
                        //   bar = &empty[k0 % 8], parity = (k0 / 8 + 1) % 2
                        asm volatile("{ .reg .pred fs_p; fs_wait_0: mbarrier.try_wait.parity.shared::cta.b64 fs_p, [%0], %1; @fs_p bra fs_done_0; bra fs_wait_0; fs_done_0: }"
                            :
                            : "r"(empty_base + (k0 % 8 * 8)), "r"((int)((k0 / 8 + 1) % 2))
                            : "memory");
                        // sm90a.mbarrier_arrive_expect_tx
                        //   bar = &full[k0 % 8], bytes = 16384
                        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                            :
                            : "r"(full_base + (k0 % 8 * 8)), "r"((int)(16384))
                            : "memory");
                        // sm90a.tma_load_2d: A tile 128x32
                        //   dst = &A_smem[k0 % 8 * 4096], tmap = &tmap_A, c0 = k0 * 32, c1 = (bid_x + tile_i * 132) / 128 * 1024 + (bid_x + tile_i * 4) % 128 % min(-(bid_x + tile_i * 132) / 128 * 8 + 16, 8) * 128, mbar = &full[k0 % 8]
                        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                            :
                            : "r"(A_smem_base + (k0 % 8 * 8192)), "l"(reinterpret_cast<unsigned long long>(&tmap_A)), "r"((int)(k0 * 32)), "r"((int)((bid_x + tile_i * 132) / 128 * 1024 + (bid_x + tile_i * 4) % 128 % min(-(bid_x + tile_i * 132) / 128 * 8 + 16, 8) * 128)), "r"(full_base + (k0 % 8 * 8))
                            : "memory");
                        // sm90a.tma_load_2d: B tile 128x32
                        //   dst = &B_smem[k0 % 8 * 4096], tmap = &tmap_B, c0 = k0 * 32, c1 = (bid_x + tile_i * 4) % 128 / min(-(bid_x + tile_i * 132) / 128 * 8 + 16, 8) * 128, mbar = &full[k0 % 8]
                        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                            :
                            : "r"(B_smem_base + (k0 % 8 * 8192)), "l"(reinterpret_cast<unsigned long long>(&tmap_B)), "r"((int)(k0 * 32)), "r"((int)((bid_x + tile_i * 4) % 128 / min(-(bid_x + tile_i * 132) / 128 * 8 + 16, 8) * 128)), "r"(full_base + (k0 % 8 * 8))
                            : "memory");
                    }
                }
            }
        }
    } else if (tid >= 128 && tid < 384) {  // role consumers: threads 128..383
        const int rtid = tid - 128;  // thread index within the role
        // sm90a.setmaxnreg_inc: the accumulators need registers
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;"
            :
            :
            : "memory");
        // tiles of this block: 2
        #pragma unroll 1
        for (int tile_i = 0; tile_i < 2; ++tile_i) {
            if (bid_x + tile_i * 132 < 256) {
                // C_acc[0 .. +64] = 0.0
                #pragma unroll
                for (int fs_r = 0; fs_r < 64; ++fs_r) {
                    C_acc[fs_r] = 0.0f;
                }
                // K loop over 64 tiles of 32, one wgmma group in flight
                #pragma unroll 1
                for (int k0_c = 0; k0_c < 64; ++k0_c) {
                    // sm90a.mbarrier_try_wait: the tile is in shared memory
                    //   bar = &full[k0_c % 8], parity = k0_c / 8 % 2
                    asm volatile("{ .reg .pred fs_p; fs_wait_1: mbarrier.try_wait.parity.shared::cta.b64 fs_p, [%0], %1; @fs_p bra fs_done_1; bra fs_wait_1; fs_done_1: }"
                        :
                        : "r"(full_base + (k0_c % 8 * 8)), "r"((int)(k0_c / 8 % 2))
                        : "memory");
                    // sm90a.wgmma_fence
                    #pragma unroll
                    for (int fs_i = 0; fs_i < 64; ++fs_i) {
                        fs_fence_reg(C_acc[fs_i]);
                    }
                    asm volatile("wgmma.fence.sync.aligned;"
                        :
                        :
                        : "memory");
                    // k1 = 0
                    // sm90a.wgmma_m64n128k16_bf16_f32_ss: MatMul<warpgroup>(A:SH bf16[64x16] Sw<2,3,3> x8 stages, B:SH bf16[16x128] Sw<2,3,3> x8 stages, C:RF f32[64x128]) acc f32
                    //   d = C_acc[0 .. +64], desc_a = desc(&A_smem[k0_c % 8 * 4096 + rtid / 128 * 2048], swizzle 64, lbo 16, sbo 512), desc_b = desc(&B_smem[k0_c % 8 * 4096], swizzle 64, lbo 16, sbo 512), scale_d = 1
                    asm volatile("{ .reg .pred fs_p; setp.ne.b32 fs_p, %66, 0; wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, fs_p, 1, 1, 0, 0; }"
                        : "+f"(C_acc[0]), "+f"(C_acc[1]), "+f"(C_acc[2]), "+f"(C_acc[3]), "+f"(C_acc[4]), "+f"(C_acc[5]), "+f"(C_acc[6]), "+f"(C_acc[7]), "+f"(C_acc[8]), "+f"(C_acc[9]), "+f"(C_acc[10]), "+f"(C_acc[11]), "+f"(C_acc[12]), "+f"(C_acc[13]), "+f"(C_acc[14]), "+f"(C_acc[15]), "+f"(C_acc[16]), "+f"(C_acc[17]), "+f"(C_acc[18]), "+f"(C_acc[19]), "+f"(C_acc[20]), "+f"(C_acc[21]), "+f"(C_acc[22]), "+f"(C_acc[23]), "+f"(C_acc[24]), "+f"(C_acc[25]), "+f"(C_acc[26]), "+f"(C_acc[27]), "+f"(C_acc[28]), "+f"(C_acc[29]), "+f"(C_acc[30]), "+f"(C_acc[31]), "+f"(C_acc[32]), "+f"(C_acc[33]), "+f"(C_acc[34]), "+f"(C_acc[35]), "+f"(C_acc[36]), "+f"(C_acc[37]), "+f"(C_acc[38]), "+f"(C_acc[39]), "+f"(C_acc[40]), "+f"(C_acc[41]), "+f"(C_acc[42]), "+f"(C_acc[43]), "+f"(C_acc[44]), "+f"(C_acc[45]), "+f"(C_acc[46]), "+f"(C_acc[47]), "+f"(C_acc[48]), "+f"(C_acc[49]), "+f"(C_acc[50]), "+f"(C_acc[51]), "+f"(C_acc[52]), "+f"(C_acc[53]), "+f"(C_acc[54]), "+f"(C_acc[55]), "+f"(C_acc[56]), "+f"(C_acc[57]), "+f"(C_acc[58]), "+f"(C_acc[59]), "+f"(C_acc[60]), "+f"(C_acc[61]), "+f"(C_acc[62]), "+f"(C_acc[63])
                        : "l"(fs_desc_add(fs_smem_desc(A_smem_base, 16u, 512u, 2u), (k0_c % 8 * 512 + rtid / 128 * 256))), "l"(fs_desc_add(fs_smem_desc(B_smem_base, 16u, 512u, 2u), (k0_c % 8 * 512))), "r"((int)(1))
                        : "memory");
                    // k1 = 1
                    // sm90a.wgmma_m64n128k16_bf16_f32_ss: MatMul<warpgroup>(A:SH bf16[64x16] Sw<2,3,3> x8 stages, B:SH bf16[16x128] Sw<2,3,3> x8 stages, C:RF f32[64x128]) acc f32
                    //   d = C_acc[0 .. +64], desc_a = desc(&A_smem[k0_c % 8 * 4096 + rtid / 128 * 2048 + 16], swizzle 64, lbo 16, sbo 512), desc_b = desc(&B_smem[k0_c % 8 * 4096 + 16], swizzle 64, lbo 16, sbo 512), scale_d = 1
                    asm volatile("{ .reg .pred fs_p; setp.ne.b32 fs_p, %66, 0; wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, fs_p, 1, 1, 0, 0; }"
                        : "+f"(C_acc[0]), "+f"(C_acc[1]), "+f"(C_acc[2]), "+f"(C_acc[3]), "+f"(C_acc[4]), "+f"(C_acc[5]), "+f"(C_acc[6]), "+f"(C_acc[7]), "+f"(C_acc[8]), "+f"(C_acc[9]), "+f"(C_acc[10]), "+f"(C_acc[11]), "+f"(C_acc[12]), "+f"(C_acc[13]), "+f"(C_acc[14]), "+f"(C_acc[15]), "+f"(C_acc[16]), "+f"(C_acc[17]), "+f"(C_acc[18]), "+f"(C_acc[19]), "+f"(C_acc[20]), "+f"(C_acc[21]), "+f"(C_acc[22]), "+f"(C_acc[23]), "+f"(C_acc[24]), "+f"(C_acc[25]), "+f"(C_acc[26]), "+f"(C_acc[27]), "+f"(C_acc[28]), "+f"(C_acc[29]), "+f"(C_acc[30]), "+f"(C_acc[31]), "+f"(C_acc[32]), "+f"(C_acc[33]), "+f"(C_acc[34]), "+f"(C_acc[35]), "+f"(C_acc[36]), "+f"(C_acc[37]), "+f"(C_acc[38]), "+f"(C_acc[39]), "+f"(C_acc[40]), "+f"(C_acc[41]), "+f"(C_acc[42]), "+f"(C_acc[43]), "+f"(C_acc[44]), "+f"(C_acc[45]), "+f"(C_acc[46]), "+f"(C_acc[47]), "+f"(C_acc[48]), "+f"(C_acc[49]), "+f"(C_acc[50]), "+f"(C_acc[51]), "+f"(C_acc[52]), "+f"(C_acc[53]), "+f"(C_acc[54]), "+f"(C_acc[55]), "+f"(C_acc[56]), "+f"(C_acc[57]), "+f"(C_acc[58]), "+f"(C_acc[59]), "+f"(C_acc[60]), "+f"(C_acc[61]), "+f"(C_acc[62]), "+f"(C_acc[63])
                        : "l"(fs_desc_add(fs_smem_desc(A_smem_base, 16u, 512u, 2u), (k0_c % 8 * 512 + rtid / 128 * 256 + 2))), "l"(fs_desc_add(fs_smem_desc(B_smem_base, 16u, 512u, 2u), (k0_c % 8 * 512 + 2))), "r"((int)(1))
                        : "memory");
                    // sm90a.wgmma_commit
                    asm volatile("wgmma.commit_group.sync.aligned;"
                        :
                        :
                        : "memory");
                    // sm90a.wgmma_wait: the previous K tile's wgmma are done
                    asm volatile("wgmma.wait_group.sync.aligned 1;"
                        :
                        :
                        : "memory");
                    #pragma unroll
                    for (int fs_i = 0; fs_i < 64; ++fs_i) {
                        fs_fence_reg(C_acc[fs_i]);
                    }
                    if (k0_c >= 1 && rtid % 128 < 1) {
                        // sm90a.mbarrier_arrive: release the previous stage
                        //   bar = &empty[(k0_c + 7) % 8]
                        asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];"
                            :
                            : "r"(empty_base + ((k0_c + 7) % 8 * 8))
                            : "memory");
                    }
                }
                // sm90a.wgmma_wait
                asm volatile("wgmma.wait_group.sync.aligned 0;"
                    :
                    :
                    : "memory");
                #pragma unroll
                for (int fs_i = 0; fs_i < 64; ++fs_i) {
                    fs_fence_reg(C_acc[fs_i]);
                }
                if (rtid % 128 < 1) {
                    // sm90a.mbarrier_arrive: release the last stage
                    //   bar = &empty[7]
                    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];"
                        :
                        : "r"(empty_base + 56)
                        : "memory");
                }
                // Move<block>(C:RF f32[128x128] -> C:GL f32[128x128]): D fragments -> C_smem (128B swizzle) -> TMA store, 4 chunks of 64x32
                if (rtid % 128 < 1) {
                    // sm90a.tma_wait_read: the store that last used this buffer has read it
                    asm volatile("cp.async.bulk.wait_group.read 1;"
                        :
                        :
                        : "memory");
                }
                // the C_smem buffer is free
                asm volatile("bar.sync %0, %1;"
                    :
                    : "r"(rtid / 128 + 1), "n"(128)
                    : "memory");
                #pragma unroll
                for (int e0 = 0; e0 < 4; ++e0) {
                    epi[0] = C_acc[e0 * 4];
                    epi[1] = C_acc[e0 * 4 + 1];
                    out_f32[0] = epi[0];
                    out_f32[1] = epi[1];
                    // sm70.st_shared_8: C pair
                    //   dst = &C_smem[(rtid % 4 * 8) % 16 / 4 + ((rtid % 4 * 8) / 16 + e0 * 2 ^ rtid % 32 / 4) * 4 + rtid % 128 / 32 * 512 + rtid % 32 / 4 * 32 + rtid / 128 * 2048], src = out_f32[0 .. +2]
                    asm volatile("st.shared.v2.b32 [%0], {%1, %2};"
                        :
                        : "r"(C_smem_base + ((rtid % 4 * 8) % 16 / 4 * 4 + ((rtid % 4 * 8) / 16 + e0 * 2 ^ rtid % 32 / 4) * 16 + rtid % 128 / 32 * 2048 + rtid % 32 / 4 * 128 + rtid / 128 * 8192)), "r"(*reinterpret_cast<unsigned*>(&out_f32[0])), "r"(*reinterpret_cast<unsigned*>(&out_f32[1]))
                        : "memory");
                    epi[0] = C_acc[e0 * 4 + 2];
                    epi[1] = C_acc[e0 * 4 + 3];
                    out_f32[0] = epi[0];
                    out_f32[1] = epi[1];
                    // sm70.st_shared_8: C pair
                    //   dst = &C_smem[(rtid % 4 * 8) % 16 / 4 + ((rtid % 4 * 8) / 16 + e0 * 2 ^ rtid % 32 / 4) * 4 + rtid % 128 / 32 * 512 + rtid % 32 / 4 * 32 + rtid / 128 * 2048 + 256], src = out_f32[0 .. +2]
                    asm volatile("st.shared.v2.b32 [%0], {%1, %2};"
                        :
                        : "r"(C_smem_base + ((rtid % 4 * 8) % 16 / 4 * 4 + ((rtid % 4 * 8) / 16 + e0 * 2 ^ rtid % 32 / 4) * 16 + rtid % 128 / 32 * 2048 + rtid % 32 / 4 * 128 + rtid / 128 * 8192 + 1024)), "r"(*reinterpret_cast<unsigned*>(&out_f32[0])), "r"(*reinterpret_cast<unsigned*>(&out_f32[1]))
                        : "memory");
                }
                // sm90a.fence_proxy_async: st.shared -> visible to the TMA store
                asm volatile("fence.proxy.async.shared::cta;"
                    :
                    :
                    : "memory");
                // chunk 0 is in C_smem
                asm volatile("bar.sync %0, %1;"
                    :
                    : "r"(rtid / 128 + 1), "n"(128)
                    : "memory");
                if (rtid % 128 < 1) {
                    // sm90a.tma_store_2d: C rows +64, columns 0..+32
                    //   tmap = &tmap_C, c0 = (bid_x + tile_i * 4) % 128 / min(-(bid_x + tile_i * 132) / 128 * 8 + 16, 8) * 128, c1 = (bid_x + tile_i * 132) / 128 * 1024 + (bid_x + tile_i * 4) % 128 % min(-(bid_x + tile_i * 132) / 128 * 8 + 16, 8) * 128 + rtid / 128 * 64, src = &C_smem[rtid / 128 * 2048]
                    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
                        :
                        : "l"(reinterpret_cast<unsigned long long>(&tmap_C)), "r"((int)((bid_x + tile_i * 4) % 128 / min(-(bid_x + tile_i * 132) / 128 * 8 + 16, 8) * 128)), "r"((int)((bid_x + tile_i * 132) / 128 * 1024 + (bid_x + tile_i * 4) % 128 % min(-(bid_x + tile_i * 132) / 128 * 8 + 16, 8) * 128 + rtid / 128 * 64)), "r"(C_smem_base + (rtid / 128 * 8192))
                        : "memory");
                    // sm90a.tma_commit
                    asm volatile("cp.async.bulk.commit_group;"
                        :
                        :
                        : "memory");
                }
                if (rtid % 128 < 1) {
                    // sm90a.tma_wait_read: the store that last used this buffer has read it
                    asm volatile("cp.async.bulk.wait_group.read 1;"
                        :
                        :
                        : "memory");
                }
                // the C_smem buffer is free
                asm volatile("bar.sync %0, %1;"
                    :
                    : "r"(rtid / 128 + 1), "n"(128)
                    : "memory");
                #pragma unroll
                for (int e1 = 0; e1 < 4; ++e1) {
                    epi[0] = C_acc[e1 * 4 + 16];
                    epi[1] = C_acc[e1 * 4 + 17];
                    out_f32[0] = epi[0];
                    out_f32[1] = epi[1];
                    // sm70.st_shared_8: C pair
                    //   dst = &C_smem[(rtid % 4 * 8) % 16 / 4 + ((rtid % 4 * 8) / 16 + e1 * 2 ^ rtid % 32 / 4) * 4 + rtid % 128 / 32 * 512 + rtid % 32 / 4 * 32 + rtid / 128 * 2048 + 4096], src = out_f32[0 .. +2]
                    asm volatile("st.shared.v2.b32 [%0], {%1, %2};"
                        :
                        : "r"(C_smem_base + ((rtid % 4 * 8) % 16 / 4 * 4 + ((rtid % 4 * 8) / 16 + e1 * 2 ^ rtid % 32 / 4) * 16 + rtid % 128 / 32 * 2048 + rtid % 32 / 4 * 128 + rtid / 128 * 8192 + 16384)), "r"(*reinterpret_cast<unsigned*>(&out_f32[0])), "r"(*reinterpret_cast<unsigned*>(&out_f32[1]))
                        : "memory");
                    epi[0] = C_acc[e1 * 4 + 18];
                    epi[1] = C_acc[e1 * 4 + 19];
                    out_f32[0] = epi[0];
                    out_f32[1] = epi[1];
                    // sm70.st_shared_8: C pair
                    //   dst = &C_smem[(rtid % 4 * 8) % 16 / 4 + ((rtid % 4 * 8) / 16 + e1 * 2 ^ rtid % 32 / 4) * 4 + rtid % 128 / 32 * 512 + rtid % 32 / 4 * 32 + rtid / 128 * 2048 + 4352], src = out_f32[0 .. +2]
                    asm volatile("st.shared.v2.b32 [%0], {%1, %2};"
                        :
                        : "r"(C_smem_base + ((rtid % 4 * 8) % 16 / 4 * 4 + ((rtid % 4 * 8) / 16 + e1 * 2 ^ rtid % 32 / 4) * 16 + rtid % 128 / 32 * 2048 + rtid % 32 / 4 * 128 + rtid / 128 * 8192 + 17408)), "r"(*reinterpret_cast<unsigned*>(&out_f32[0])), "r"(*reinterpret_cast<unsigned*>(&out_f32[1]))
                        : "memory");
                }
                // sm90a.fence_proxy_async: st.shared -> visible to the TMA store
                asm volatile("fence.proxy.async.shared::cta;"
                    :
                    :
                    : "memory");
                // chunk 1 is in C_smem
                asm volatile("bar.sync %0, %1;"
                    :
                    : "r"(rtid / 128 + 1), "n"(128)
                    : "memory");
                if (rtid % 128 < 1) {
                    // sm90a.tma_store_2d: C rows +64, columns 32..+32
                    //   tmap = &tmap_C, c0 = (bid_x + tile_i * 4) % 128 / min(-(bid_x + tile_i * 132) / 128 * 8 + 16, 8) * 128 + 32, c1 = (bid_x + tile_i * 132) / 128 * 1024 + (bid_x + tile_i * 4) % 128 % min(-(bid_x + tile_i * 132) / 128 * 8 + 16, 8) * 128 + rtid / 128 * 64, src = &C_smem[rtid / 128 * 2048 + 4096]
                    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
                        :
                        : "l"(reinterpret_cast<unsigned long long>(&tmap_C)), "r"((int)((bid_x + tile_i * 4) % 128 / min(-(bid_x + tile_i * 132) / 128 * 8 + 16, 8) * 128 + 32)), "r"((int)((bid_x + tile_i * 132) / 128 * 1024 + (bid_x + tile_i * 4) % 128 % min(-(bid_x + tile_i * 132) / 128 * 8 + 16, 8) * 128 + rtid / 128 * 64)), "r"(C_smem_base + (rtid / 128 * 8192 + 16384))
                        : "memory");
                    // sm90a.tma_commit
                    asm volatile("cp.async.bulk.commit_group;"
                        :
                        :
                        : "memory");
                }
                if (rtid % 128 < 1) {
                    // sm90a.tma_wait_read: the store that last used this buffer has read it
                    asm volatile("cp.async.bulk.wait_group.read 1;"
                        :
                        :
                        : "memory");
                }
                // the C_smem buffer is free
                asm volatile("bar.sync %0, %1;"
                    :
                    : "r"(rtid / 128 + 1), "n"(128)
                    : "memory");
                #pragma unroll
                for (int e2 = 0; e2 < 4; ++e2) {
                    epi[0] = C_acc[e2 * 4 + 32];
                    epi[1] = C_acc[e2 * 4 + 33];
                    out_f32[0] = epi[0];
                    out_f32[1] = epi[1];
                    // sm70.st_shared_8: C pair
                    //   dst = &C_smem[(rtid % 4 * 8) % 16 / 4 + ((rtid % 4 * 8) / 16 + e2 * 2 ^ rtid % 32 / 4) * 4 + rtid % 128 / 32 * 512 + rtid % 32 / 4 * 32 + rtid / 128 * 2048], src = out_f32[0 .. +2]
                    asm volatile("st.shared.v2.b32 [%0], {%1, %2};"
                        :
                        : "r"(C_smem_base + ((rtid % 4 * 8) % 16 / 4 * 4 + ((rtid % 4 * 8) / 16 + e2 * 2 ^ rtid % 32 / 4) * 16 + rtid % 128 / 32 * 2048 + rtid % 32 / 4 * 128 + rtid / 128 * 8192)), "r"(*reinterpret_cast<unsigned*>(&out_f32[0])), "r"(*reinterpret_cast<unsigned*>(&out_f32[1]))
                        : "memory");
                    epi[0] = C_acc[e2 * 4 + 34];
                    epi[1] = C_acc[e2 * 4 + 35];
                    out_f32[0] = epi[0];
                    out_f32[1] = epi[1];
                    // sm70.st_shared_8: C pair
                    //   dst = &C_smem[(rtid % 4 * 8) % 16 / 4 + ((rtid % 4 * 8) / 16 + e2 * 2 ^ rtid % 32 / 4) * 4 + rtid % 128 / 32 * 512 + rtid % 32 / 4 * 32 + rtid / 128 * 2048 + 256], src = out_f32[0 .. +2]
                    asm volatile("st.shared.v2.b32 [%0], {%1, %2};"
                        :
                        : "r"(C_smem_base + ((rtid % 4 * 8) % 16 / 4 * 4 + ((rtid % 4 * 8) / 16 + e2 * 2 ^ rtid % 32 / 4) * 16 + rtid % 128 / 32 * 2048 + rtid % 32 / 4 * 128 + rtid / 128 * 8192 + 1024)), "r"(*reinterpret_cast<unsigned*>(&out_f32[0])), "r"(*reinterpret_cast<unsigned*>(&out_f32[1]))
                        : "memory");
                }
                // sm90a.fence_proxy_async: st.shared -> visible to the TMA store
                asm volatile("fence.proxy.async.shared::cta;"
                    :
                    :
                    : "memory");
                // chunk 2 is in C_smem
                asm volatile("bar.sync %0, %1;"
                    :
                    : "r"(rtid / 128 + 1), "n"(128)
                    : "memory");
                if (rtid % 128 < 1) {
                    // sm90a.tma_store_2d: C rows +64, columns 64..+32
                    //   tmap = &tmap_C, c0 = (bid_x + tile_i * 4) % 128 / min(-(bid_x + tile_i * 132) / 128 * 8 + 16, 8) * 128 + 64, c1 = (bid_x + tile_i * 132) / 128 * 1024 + (bid_x + tile_i * 4) % 128 % min(-(bid_x + tile_i * 132) / 128 * 8 + 16, 8) * 128 + rtid / 128 * 64, src = &C_smem[rtid / 128 * 2048]
                    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
                        :
                        : "l"(reinterpret_cast<unsigned long long>(&tmap_C)), "r"((int)((bid_x + tile_i * 4) % 128 / min(-(bid_x + tile_i * 132) / 128 * 8 + 16, 8) * 128 + 64)), "r"((int)((bid_x + tile_i * 132) / 128 * 1024 + (bid_x + tile_i * 4) % 128 % min(-(bid_x + tile_i * 132) / 128 * 8 + 16, 8) * 128 + rtid / 128 * 64)), "r"(C_smem_base + (rtid / 128 * 8192))
                        : "memory");
                    // sm90a.tma_commit
                    asm volatile("cp.async.bulk.commit_group;"
                        :
                        :
                        : "memory");
                }
                if (rtid % 128 < 1) {
                    // sm90a.tma_wait_read: the store that last used this buffer has read it
                    asm volatile("cp.async.bulk.wait_group.read 1;"
                        :
                        :
                        : "memory");
                }
                // the C_smem buffer is free
                asm volatile("bar.sync %0, %1;"
                    :
                    : "r"(rtid / 128 + 1), "n"(128)
                    : "memory");
                #pragma unroll
                for (int e3 = 0; e3 < 4; ++e3) {
                    epi[0] = C_acc[e3 * 4 + 48];
                    epi[1] = C_acc[e3 * 4 + 49];
                    out_f32[0] = epi[0];
                    out_f32[1] = epi[1];
                    // sm70.st_shared_8: C pair
                    //   dst = &C_smem[(rtid % 4 * 8) % 16 / 4 + ((rtid % 4 * 8) / 16 + e3 * 2 ^ rtid % 32 / 4) * 4 + rtid % 128 / 32 * 512 + rtid % 32 / 4 * 32 + rtid / 128 * 2048 + 4096], src = out_f32[0 .. +2]
                    asm volatile("st.shared.v2.b32 [%0], {%1, %2};"
                        :
                        : "r"(C_smem_base + ((rtid % 4 * 8) % 16 / 4 * 4 + ((rtid % 4 * 8) / 16 + e3 * 2 ^ rtid % 32 / 4) * 16 + rtid % 128 / 32 * 2048 + rtid % 32 / 4 * 128 + rtid / 128 * 8192 + 16384)), "r"(*reinterpret_cast<unsigned*>(&out_f32[0])), "r"(*reinterpret_cast<unsigned*>(&out_f32[1]))
                        : "memory");
                    epi[0] = C_acc[e3 * 4 + 50];
                    epi[1] = C_acc[e3 * 4 + 51];
                    out_f32[0] = epi[0];
                    out_f32[1] = epi[1];
                    // sm70.st_shared_8: C pair
                    //   dst = &C_smem[(rtid % 4 * 8) % 16 / 4 + ((rtid % 4 * 8) / 16 + e3 * 2 ^ rtid % 32 / 4) * 4 + rtid % 128 / 32 * 512 + rtid % 32 / 4 * 32 + rtid / 128 * 2048 + 4352], src = out_f32[0 .. +2]
                    asm volatile("st.shared.v2.b32 [%0], {%1, %2};"
                        :
                        : "r"(C_smem_base + ((rtid % 4 * 8) % 16 / 4 * 4 + ((rtid % 4 * 8) / 16 + e3 * 2 ^ rtid % 32 / 4) * 16 + rtid % 128 / 32 * 2048 + rtid % 32 / 4 * 128 + rtid / 128 * 8192 + 17408)), "r"(*reinterpret_cast<unsigned*>(&out_f32[0])), "r"(*reinterpret_cast<unsigned*>(&out_f32[1]))
                        : "memory");
                }
                // sm90a.fence_proxy_async: st.shared -> visible to the TMA store
                asm volatile("fence.proxy.async.shared::cta;"
                    :
                    :
                    : "memory");
                // chunk 3 is in C_smem
                asm volatile("bar.sync %0, %1;"
                    :
                    : "r"(rtid / 128 + 1), "n"(128)
                    : "memory");
                if (rtid % 128 < 1) {
                    // sm90a.tma_store_2d: C rows +64, columns 96..+32
                    //   tmap = &tmap_C, c0 = (bid_x + tile_i * 4) % 128 / min(-(bid_x + tile_i * 132) / 128 * 8 + 16, 8) * 128 + 96, c1 = (bid_x + tile_i * 132) / 128 * 1024 + (bid_x + tile_i * 4) % 128 % min(-(bid_x + tile_i * 132) / 128 * 8 + 16, 8) * 128 + rtid / 128 * 64, src = &C_smem[rtid / 128 * 2048 + 4096]
                    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
                        :
                        : "l"(reinterpret_cast<unsigned long long>(&tmap_C)), "r"((int)((bid_x + tile_i * 4) % 128 / min(-(bid_x + tile_i * 132) / 128 * 8 + 16, 8) * 128 + 96)), "r"((int)((bid_x + tile_i * 132) / 128 * 1024 + (bid_x + tile_i * 4) % 128 % min(-(bid_x + tile_i * 132) / 128 * 8 + 16, 8) * 128 + rtid / 128 * 64)), "r"(C_smem_base + (rtid / 128 * 8192 + 16384))
                        : "memory");
                    // sm90a.tma_commit
                    asm volatile("cp.async.bulk.commit_group;"
                        :
                        :
                        : "memory");
                }
            }
        }
        if (rtid % 128 < 1) {
            // sm90a.tma_wait_read: the last TMA stores have read shared memory
            asm volatile("cp.async.bulk.wait_group.read 0;"
                :
                :
                : "memory");
        }
    }
}
