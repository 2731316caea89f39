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

// MatMul<kernel>(A:GL f16[4096x4096], B:GL f16[4096x4096], C:GL f16[4096x4096]) acc f32
//   tile(m=128, n=256) >> to_blocks(group=8, persistent=True, cluster=2)
//   for m0 in block(32) grouped(8) persistent clusters(2), n0 in block(16) grouped(8) persistent:
//     MatMul<block>(A:GL f16[128x4096], B:GL f16[4096x256], C:GL f16[128x256]) acc f32
//       tile(k=64)
//       Init<block>(C:RF f32[128x256] = 0)
//       for k0 in seq(64) pipelined(4 stages) warp-specialized(producer 40 regs, consumers 232):
//         MatMul<block>(A:GL f16[128x64], B:GL f16[64x256], C:RF f32[128x256]) acc f32
//           move_to_smem('A', via=(sm90a.tma_load_2d,))
//           Move<block>(A:GL f16[128x64] -> A:SH f16[128x64] Sw<3,3,3> x4 stages)
//             via tma_load_2d
//           MatMul<block>(A:SH f16[128x64] Sw<3,3,3> x4 stages, B:GL f16[64x256], C:RF f32[128x256]) acc f32
//             move_to_smem('B', via=(sm90a.tma_load_2d,))
//             Move<block>(B:GL f16[64x256] -> B:SH f16[64x256] Sw<3,3,5> x4 stages)
//               via tma_load_2d
//             MatMul<block>(A:SH f16[128x64] Sw<3,3,3> x4 stages, B:SH f16[64x256] Sw<3,3,5> x4 stages, C:RF f32[128x256]) acc f32
//               tile(m=64) >> to_warpgroups()
//               for m1 in warpgroup(2):
//                 MatMul<warpgroup>(A:SH f16[64x64] Sw<3,3,3> x4 stages, B:SH f16[64x256] Sw<3,3,5> x4 stages, C:RF f32[64x256]) acc f32
//                   tile(k=16)
//                   for k1 in seq(4):
//                     MatMul<warpgroup>(A:SH f16[64x16] Sw<3,3,3> x4 stages, B:SH f16[16x256] Sw<3,3,5> x4 stages, C:RF f32[64x256]) acc f32
//                       done(sm90a.wgmma_m64n256k16_f16_f32_ss_tnspb)
//       Move<block>(C:RF f32[128x256] -> C:GL f16[128x256])
// firesched_matmul: grid (132, 1, 1) x 384 threads, 230400 bytes of dynamic shared memory
// thread-block clusters of 2 blocks along x (rank = blockIdx.x % 2)
extern "C" __global__ void __launch_bounds__(384, 1) __cluster_dims__(2, 1, 1) firesched_matmul(
    const __grid_constant__ CUtensorMap tmap_A,
    const __grid_constant__ CUtensorMap tmap_B,
    const __grid_constant__ CUtensorMap tmap_C)
{
    const int tid = threadIdx.x;
    const int bid_x = blockIdx.x;
    extern __shared__ __align__(1024) unsigned char fs_smem[];
    // A_smem: f16[32768] at byte 0, 4 stage(s) x 128x64 f16, K-major, 128B swizzle
    unsigned short* const A_smem = reinterpret_cast<unsigned short*>(fs_smem + 0);
    const unsigned A_smem_base = (unsigned)__cvta_generic_to_shared(A_smem);
    // B_smem: f16[65536] at byte 65536, 4 stage(s) x 64x256 f16, boxes of 64 columns, 128B swizzle
    unsigned short* const B_smem = reinterpret_cast<unsigned short*>(fs_smem + 65536);
    const unsigned B_smem_base = (unsigned)__cvta_generic_to_shared(B_smem);
    // full: f64[4] at byte 196608, one per stage: the stage's TMA bytes have landed
    unsigned long long* const full = reinterpret_cast<unsigned long long*>(fs_smem + 196608);
    const unsigned full_base = (unsigned)__cvta_generic_to_shared(full);
    // empty: f64[4] at byte 196640, one per stage: all 2 consumer warpgroups are done reading it, in each of the cluster's 2 blocks (their multicasts write it)
    unsigned long long* const empty = reinterpret_cast<unsigned long long*>(fs_smem + 196640);
    const unsigned empty_base = (unsigned)__cvta_generic_to_shared(empty);
    // C_smem: f16[16384] at byte 197632, 2 buffers x 2 consumer warpgroups x 64x64 f16, 128B swizzle (TMA-store staging)
    unsigned short* const C_smem = reinterpret_cast<unsigned short*>(fs_smem + 197632);
    const unsigned C_smem_base = (unsigned)__cvta_generic_to_shared(C_smem);
    alignas(16) float C_acc[128] = {};  // f32 x 128
    alignas(16) float epi[2] = {};  // f32 x 2
    alignas(16) unsigned short out_f16[2] = {};  // f16 x 2

    // MatMul<block>(A:GL f16[128x4096], B:GL f16[4096x256], C:GL f16[128x256]) acc f32
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
        //   bar = &empty[0], count = 4
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
            :
            : "r"(empty_base), "r"((int)(4))
            : "memory");
        // sm90a.mbarrier_init
        //   bar = &empty[1], count = 4
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
            :
            : "r"(empty_base + 8), "r"((int)(4))
            : "memory");
        // sm90a.mbarrier_init
        //   bar = &empty[2], count = 4
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
            :
            : "r"(empty_base + 16), "r"((int)(4))
            : "memory");
        // sm90a.mbarrier_init
        //   bar = &empty[3], count = 4
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
            :
            : "r"(empty_base + 24), "r"((int)(4))
            : "memory");
        // sm90a.fence_mbarrier_init
        asm volatile("fence.mbarrier_init.release.cluster;"
            :
            :
            : "memory");
    }
    // sm90a.barrier_cluster: every block's mbarriers are initialised: the cluster's multicasts and arrivals may target them
    asm volatile("barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;"
        :
        :
        : "memory");
    if (tid < 128) {  // role producer: threads 0..127
        const int rtid = tid - 0;  // thread index within the role
        // sm90a.setmaxnreg_dec: the producer needs few registers
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;"
            :
            :
            : "memory");
        if (tid < 1) {
            // tiles of this block: 4
            #pragma unroll 1
            for (int tile_i = 0; tile_i < 4; ++tile_i) {
                if (bid_x / 2 + tile_i * 66 < 256) {
                    #pragma unroll 1
                    for (int k0 = 0; k0 < 64; ++k0) {
                        // sm90a.mbarrier_try_wait: the consumers released the stage (the first round returns at once)
                        //   bar = &empty[k0 % 4], parity = (k0 / 4 + 1) % 2
                        asm volatile("{ .reg .pred fs_p; fs_wait_0: mbarrier.try_wait.parity.shared::cta.b64 fs_p, [%0], %1; @fs_p bra fs_done_0; bra fs_wait_0; fs_done_0: }"
                            :
                            : "r"(empty_base + (k0 % 4 * 8)), "r"((int)((k0 / 4 + 1) % 2))
                            : "memory");
                        // sm90a.mbarrier_arrive_expect_tx
                        //   bar = &full[k0 % 4], bytes = 49152
                        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                            :
                            : "r"(full_base + (k0 % 4 * 8)), "r"((int)(49152))
                            : "memory");
                        // sm90a.tma_load_2d: A tile 128x64
                        //   dst = &A_smem[k0 % 4 * 8192], tmap = &tmap_A, c0 = k0 * 64, c1 = (bid_x / 2 + tile_i * 2) % 64 % min(-(bid_x / 2 + tile_i * 66) / 64 * 4 + 16, 4) * 256 + (bid_x / 2 + tile_i * 66) / 64 * 1024 + bid_x % 2 * 128, mbar = &full[k0 % 4]
                        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                            :
                            : "r"(A_smem_base + (k0 % 4 * 16384)), "l"(reinterpret_cast<unsigned long long>(&tmap_A)), "r"((int)(k0 * 64)), "r"((int)((bid_x / 2 + tile_i * 2) % 64 % min(-(bid_x / 2 + tile_i * 66) / 64 * 4 + 16, 4) * 256 + (bid_x / 2 + tile_i * 66) / 64 * 1024 + bid_x % 2 * 128)), "r"(full_base + (k0 % 4 * 8))
                            : "memory");
                        // sm90a.tma_load_2d_multicast: B columns (0 + rank) * 64..+64, to every block of the cluster
                        //   dst = &B_smem[bid_x % 2 * 4096 + k0 % 4 * 16384], tmap = &tmap_B, c0 = (bid_x / 2 + tile_i * 2) % 64 / min(-(bid_x / 2 + tile_i * 66) / 64 * 4 + 16, 4) * 256 + bid_x % 2 * 64, c1 = k0 * 64, mbar = &full[k0 % 4], mask = 3
                        asm volatile("{ .reg .b16 fs_m; cvt.u16.u32 fs_m, %5; cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3}], [%4], fs_m; }"
                            :
                            : "r"(B_smem_base + (bid_x % 2 * 8192 + k0 % 4 * 32768)), "l"(reinterpret_cast<unsigned long long>(&tmap_B)), "r"((int)((bid_x / 2 + tile_i * 2) % 64 / min(-(bid_x / 2 + tile_i * 66) / 64 * 4 + 16, 4) * 256 + bid_x % 2 * 64)), "r"((int)(k0 * 64)), "r"(full_base + (k0 % 4 * 8)), "r"((int)(3))
                            : "memory");
                        // sm90a.tma_load_2d_multicast: B columns (2 + rank) * 64..+64, to every block of the cluster
                        //   dst = &B_smem[bid_x % 2 * 4096 + k0 % 4 * 16384 + 8192], tmap = &tmap_B, c0 = (bid_x / 2 + tile_i * 2) % 64 / min(-(bid_x / 2 + tile_i * 66) / 64 * 4 + 16, 4) * 256 + bid_x % 2 * 64 + 128, c1 = k0 * 64, mbar = &full[k0 % 4], mask = 3
                        asm volatile("{ .reg .b16 fs_m; cvt.u16.u32 fs_m, %5; cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3}], [%4], fs_m; }"
                            :
                            : "r"(B_smem_base + (bid_x % 2 * 8192 + k0 % 4 * 32768 + 16384)), "l"(reinterpret_cast<unsigned long long>(&tmap_B)), "r"((int)((bid_x / 2 + tile_i * 2) % 64 / min(-(bid_x / 2 + tile_i * 66) / 64 * 4 + 16, 4) * 256 + bid_x % 2 * 64 + 128)), "r"((int)(k0 * 64)), "r"(full_base + (k0 % 4 * 8)), "r"((int)(3))
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
        // tiles of this block: 4
        #pragma unroll 1
        for (int tile_i = 0; tile_i < 4; ++tile_i) {
            if (bid_x / 2 + tile_i * 66 < 256) {
                // C_acc[0 .. +128] = 0.0
                #pragma unroll
                for (int fs_r = 0; fs_r < 128; ++fs_r) {
                    C_acc[fs_r] = 0.0f;
                }
                // K loop over 64 tiles of 64, one wgmma group in flight
                #pragma unroll 1
                for (int k0_c = 0; k0_c < 64; ++k0_c) {
                    // sm90a.mbarrier_try_wait: the tile is in shared memory
                    //   bar = &full[k0_c % 4], parity = k0_c / 4 % 2
                    asm volatile("{ .reg .pred fs_p; fs_wait_1: mbarrier.try_wait.parity.shared::cta.b64 fs_p, [%0], %1; @fs_p bra fs_done_1; bra fs_wait_1; fs_done_1: }"
                        :
                        : "r"(full_base + (k0_c % 4 * 8)), "r"((int)(k0_c / 4 % 2))
                        : "memory");
                    // sm90a.wgmma_fence
                    #pragma unroll
                    for (int fs_i = 0; fs_i < 128; ++fs_i) {
                        fs_fence_reg(C_acc[fs_i]);
                    }
                    asm volatile("wgmma.fence.sync.aligned;"
                        :
                        :
                        : "memory");
                    // k1 = 0
                    // sm90a.wgmma_m64n256k16_f16_f32_ss_tnspb: MatMul<warpgroup>(A:SH f16[64x16] Sw<3,3,3> x4 stages, B:SH f16[16x256] Sw<3,3,5> x4 stages, C:RF f32[64x256]) acc f32
                    //   d = C_acc[0 .. +128], desc_a = desc(&A_smem[k0_c % 4 * 8192 + rtid / 128 * 4096], swizzle 128, lbo 16, sbo 1024), desc_b = desc(&B_smem[k0_c % 4 * 16384], swizzle 128, lbo 8192, sbo 1024), scale_d = 1
                    asm volatile("{ .reg .pred fs_p; setp.ne.b32 fs_p, %130, 0; wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, fs_p, 1, 1, 0, 1; }"
                        : "+f"(C_acc[0]), "+f"(C_acc[1]), "+f"(C_acc[2]), "+f"(C_acc[3]), "+f"(C_acc[4]), "+f"(C_acc[5]), "+f"(C_acc[6]), "+f"(C_acc[7]), "+f"(C_acc[8]), "+f"(C_acc[9]), "+f"(C_acc[10]), "+f"(C_acc[11]), "+f"(C_acc[12]), "+f"(C_acc[13]), "+f"(C_acc[14]), "+f"(C_acc[15]), "+f"(C_acc[16]), "+f"(C_acc[17]), "+f"(C_acc[18]), "+f"(C_acc[19]), "+f"(C_acc[20]), "+f"(C_acc[21]), "+f"(C_acc[22]), "+f"(C_acc[23]), "+f"(C_acc[24]), "+f"(C_acc[25]), "+f"(C_acc[26]), "+f"(C_acc[27]), "+f"(C_acc[28]), "+f"(C_acc[29]), "+f"(C_acc[30]), "+f"(C_acc[31]), "+f"(C_acc[32]), "+f"(C_acc[33]), "+f"(C_acc[34]), "+f"(C_acc[35]), "+f"(C_acc[36]), "+f"(C_acc[37]), "+f"(C_acc[38]), "+f"(C_acc[39]), "+f"(C_acc[40]), "+f"(C_acc[41]), "+f"(C_acc[42]), "+f"(C_acc[43]), "+f"(C_acc[44]), "+f"(C_acc[45]), "+f"(C_acc[46]), "+f"(C_acc[47]), "+f"(C_acc[48]), "+f"(C_acc[49]), "+f"(C_acc[50]), "+f"(C_acc[51]), "+f"(C_acc[52]), "+f"(C_acc[53]), "+f"(C_acc[54]), "+f"(C_acc[55]), "+f"(C_acc[56]), "+f"(C_acc[57]), "+f"(C_acc[58]), "+f"(C_acc[59]), "+f"(C_acc[60]), "+f"(C_acc[61]), "+f"(C_acc[62]), "+f"(C_acc[63]), "+f"(C_acc[64]), "+f"(C_acc[65]), "+f"(C_acc[66]), "+f"(C_acc[67]), "+f"(C_acc[68]), "+f"(C_acc[69]), "+f"(C_acc[70]), "+f"(C_acc[71]), "+f"(C_acc[72]), "+f"(C_acc[73]), "+f"(C_acc[74]), "+f"(C_acc[75]), "+f"(C_acc[76]), "+f"(C_acc[77]), "+f"(C_acc[78]), "+f"(C_acc[79]), "+f"(C_acc[80]), "+f"(C_acc[81]), "+f"(C_acc[82]), "+f"(C_acc[83]), "+f"(C_acc[84]), "+f"(C_acc[85]), "+f"(C_acc[86]), "+f"(C_acc[87]), "+f"(C_acc[88]), "+f"(C_acc[89]), "+f"(C_acc[90]), "+f"(C_acc[91]), "+f"(C_acc[92]), "+f"(C_acc[93]), "+f"(C_acc[94]), "+f"(C_acc[95]), "+f"(C_acc[96]), "+f"(C_acc[97]), "+f"(C_acc[98]), "+f"(C_acc[99]), "+f"(C_acc[100]), "+f"(C_acc[101]), "+f"(C_acc[102]), "+f"(C_acc[103]), "+f"(C_acc[104]), "+f"(C_acc[105]), "+f"(C_acc[106]), "+f"(C_acc[107]), "+f"(C_acc[108]), "+f"(C_acc[109]), "+f"(C_acc[110]), "+f"(C_acc[111]), "+f"(C_acc[112]), "+f"(C_acc[113]), "+f"(C_acc[114]), "+f"(C_acc[115]), "+f"(C_acc[116]), "+f"(C_acc[117]), "+f"(C_acc[118]), "+f"(C_acc[119]), "+f"(C_acc[120]), "+f"(C_acc[121]), "+f"(C_acc[122]), "+f"(C_acc[123]), "+f"(C_acc[124]), "+f"(C_acc[125]), "+f"(C_acc[126]), "+f"(C_acc[127])
                        : "l"(fs_desc_add(fs_smem_desc(A_smem_base, 16u, 1024u, 1u), (k0_c % 4 * 1024 + rtid / 128 * 512))), "l"(fs_desc_add(fs_smem_desc(B_smem_base, 8192u, 1024u, 1u), (k0_c % 4 * 2048))), "r"((int)(1))
                        : "memory");
                    // k1 = 1
                    // sm90a.wgmma_m64n256k16_f16_f32_ss_tnspb: MatMul<warpgroup>(A:SH f16[64x16] Sw<3,3,3> x4 stages, B:SH f16[16x256] Sw<3,3,5> x4 stages, C:RF f32[64x256]) acc f32
                    //   d = C_acc[0 .. +128], desc_a = desc(&A_smem[k0_c % 4 * 8192 + rtid / 128 * 4096 + 16], swizzle 128, lbo 16, sbo 1024), desc_b = desc(&B_smem[k0_c % 4 * 16384 + 1024], swizzle 128, lbo 8192, sbo 1024), scale_d = 1
                    asm volatile("{ .reg .pred fs_p; setp.ne.b32 fs_p, %130, 0; wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, fs_p, 1, 1, 0, 1; }"
                        : "+f"(C_acc[0]), "+f"(C_acc[1]), "+f"(C_acc[2]), "+f"(C_acc[3]), "+f"(C_acc[4]), "+f"(C_acc[5]), "+f"(C_acc[6]), "+f"(C_acc[7]), "+f"(C_acc[8]), "+f"(C_acc[9]), "+f"(C_acc[10]), "+f"(C_acc[11]), "+f"(C_acc[12]), "+f"(C_acc[13]), "+f"(C_acc[14]), "+f"(C_acc[15]), "+f"(C_acc[16]), "+f"(C_acc[17]), "+f"(C_acc[18]), "+f"(C_acc[19]), "+f"(C_acc[20]), "+f"(C_acc[21]), "+f"(C_acc[22]), "+f"(C_acc[23]), "+f"(C_acc[24]), "+f"(C_acc[25]), "+f"(C_acc[26]), "+f"(C_acc[27]), "+f"(C_acc[28]), "+f"(C_acc[29]), "+f"(C_acc[30]), "+f"(C_acc[31]), "+f"(C_acc[32]), "+f"(C_acc[33]), "+f"(C_acc[34]), "+f"(C_acc[35]), "+f"(C_acc[36]), "+f"(C_acc[37]), "+f"(C_acc[38]), "+f"(C_acc[39]), "+f"(C_acc[40]), "+f"(C_acc[41]), "+f"(C_acc[42]), "+f"(C_acc[43]), "+f"(C_acc[44]), "+f"(C_acc[45]), "+f"(C_acc[46]), "+f"(C_acc[47]), "+f"(C_acc[48]), "+f"(C_acc[49]), "+f"(C_acc[50]), "+f"(C_acc[51]), "+f"(C_acc[52]), "+f"(C_acc[53]), "+f"(C_acc[54]), "+f"(C_acc[55]), "+f"(C_acc[56]), "+f"(C_acc[57]), "+f"(C_acc[58]), "+f"(C_acc[59]), "+f"(C_acc[60]), "+f"(C_acc[61]), "+f"(C_acc[62]), "+f"(C_acc[63]), "+f"(C_acc[64]), "+f"(C_acc[65]), "+f"(C_acc[66]), "+f"(C_acc[67]), "+f"(C_acc[68]), "+f"(C_acc[69]), "+f"(C_acc[70]), "+f"(C_acc[71]), "+f"(C_acc[72]), "+f"(C_acc[73]), "+f"(C_acc[74]), "+f"(C_acc[75]), "+f"(C_acc[76]), "+f"(C_acc[77]), "+f"(C_acc[78]), "+f"(C_acc[79]), "+f"(C_acc[80]), "+f"(C_acc[81]), "+f"(C_acc[82]), "+f"(C_acc[83]), "+f"(C_acc[84]), "+f"(C_acc[85]), "+f"(C_acc[86]), "+f"(C_acc[87]), "+f"(C_acc[88]), "+f"(C_acc[89]), "+f"(C_acc[90]), "+f"(C_acc[91]), "+f"(C_acc[92]), "+f"(C_acc[93]), "+f"(C_acc[94]), "+f"(C_acc[95]), "+f"(C_acc[96]), "+f"(C_acc[97]), "+f"(C_acc[98]), "+f"(C_acc[99]), "+f"(C_acc[100]), "+f"(C_acc[101]), "+f"(C_acc[102]), "+f"(C_acc[103]), "+f"(C_acc[104]), "+f"(C_acc[105]), "+f"(C_acc[106]), "+f"(C_acc[107]), "+f"(C_acc[108]), "+f"(C_acc[109]), "+f"(C_acc[110]), "+f"(C_acc[111]), "+f"(C_acc[112]), "+f"(C_acc[113]), "+f"(C_acc[114]), "+f"(C_acc[115]), "+f"(C_acc[116]), "+f"(C_acc[117]), "+f"(C_acc[118]), "+f"(C_acc[119]), "+f"(C_acc[120]), "+f"(C_acc[121]), "+f"(C_acc[122]), "+f"(C_acc[123]), "+f"(C_acc[124]), "+f"(C_acc[125]), "+f"(C_acc[126]), "+f"(C_acc[127])
                        : "l"(fs_desc_add(fs_smem_desc(A_smem_base, 16u, 1024u, 1u), (k0_c % 4 * 1024 + rtid / 128 * 512 + 2))), "l"(fs_desc_add(fs_smem_desc(B_smem_base, 8192u, 1024u, 1u), (k0_c % 4 * 2048 + 128))), "r"((int)(1))
                        : "memory");
                    // k1 = 2
                    // sm90a.wgmma_m64n256k16_f16_f32_ss_tnspb: MatMul<warpgroup>(A:SH f16[64x16] Sw<3,3,3> x4 stages, B:SH f16[16x256] Sw<3,3,5> x4 stages, C:RF f32[64x256]) acc f32
                    //   d = C_acc[0 .. +128], desc_a = desc(&A_smem[k0_c % 4 * 8192 + rtid / 128 * 4096 + 32], swizzle 128, lbo 16, sbo 1024), desc_b = desc(&B_smem[k0_c % 4 * 16384 + 2048], swizzle 128, lbo 8192, sbo 1024), scale_d = 1
                    asm volatile("{ .reg .pred fs_p; setp.ne.b32 fs_p, %130, 0; wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, fs_p, 1, 1, 0, 1; }"
                        : "+f"(C_acc[0]), "+f"(C_acc[1]), "+f"(C_acc[2]), "+f"(C_acc[3]), "+f"(C_acc[4]), "+f"(C_acc[5]), "+f"(C_acc[6]), "+f"(C_acc[7]), "+f"(C_acc[8]), "+f"(C_acc[9]), "+f"(C_acc[10]), "+f"(C_acc[11]), "+f"(C_acc[12]), "+f"(C_acc[13]), "+f"(C_acc[14]), "+f"(C_acc[15]), "+f"(C_acc[16]), "+f"(C_acc[17]), "+f"(C_acc[18]), "+f"(C_acc[19]), "+f"(C_acc[20]), "+f"(C_acc[21]), "+f"(C_acc[22]), "+f"(C_acc[23]), "+f"(C_acc[24]), "+f"(C_acc[25]), "+f"(C_acc[26]), "+f"(C_acc[27]), "+f"(C_acc[28]), "+f"(C_acc[29]), "+f"(C_acc[30]), "+f"(C_acc[31]), "+f"(C_acc[32]), "+f"(C_acc[33]), "+f"(C_acc[34]), "+f"(C_acc[35]), "+f"(C_acc[36]), "+f"(C_acc[37]), "+f"(C_acc[38]), "+f"(C_acc[39]), "+f"(C_acc[40]), "+f"(C_acc[41]), "+f"(C_acc[42]), "+f"(C_acc[43]), "+f"(C_acc[44]), "+f"(C_acc[45]), "+f"(C_acc[46]), "+f"(C_acc[47]), "+f"(C_acc[48]), "+f"(C_acc[49]), "+f"(C_acc[50]), "+f"(C_acc[51]), "+f"(C_acc[52]), "+f"(C_acc[53]), "+f"(C_acc[54]), "+f"(C_acc[55]), "+f"(C_acc[56]), "+f"(C_acc[57]), "+f"(C_acc[58]), "+f"(C_acc[59]), "+f"(C_acc[60]), "+f"(C_acc[61]), "+f"(C_acc[62]), "+f"(C_acc[63]), "+f"(C_acc[64]), "+f"(C_acc[65]), "+f"(C_acc[66]), "+f"(C_acc[67]), "+f"(C_acc[68]), "+f"(C_acc[69]), "+f"(C_acc[70]), "+f"(C_acc[71]), "+f"(C_acc[72]), "+f"(C_acc[73]), "+f"(C_acc[74]), "+f"(C_acc[75]), "+f"(C_acc[76]), "+f"(C_acc[77]), "+f"(C_acc[78]), "+f"(C_acc[79]), "+f"(C_acc[80]), "+f"(C_acc[81]), "+f"(C_acc[82]), "+f"(C_acc[83]), "+f"(C_acc[84]), "+f"(C_acc[85]), "+f"(C_acc[86]), "+f"(C_acc[87]), "+f"(C_acc[88]), "+f"(C_acc[89]), "+f"(C_acc[90]), "+f"(C_acc[91]), "+f"(C_acc[92]), "+f"(C_acc[93]), "+f"(C_acc[94]), "+f"(C_acc[95]), "+f"(C_acc[96]), "+f"(C_acc[97]), "+f"(C_acc[98]), "+f"(C_acc[99]), "+f"(C_acc[100]), "+f"(C_acc[101]), "+f"(C_acc[102]), "+f"(C_acc[103]), "+f"(C_acc[104]), "+f"(C_acc[105]), "+f"(C_acc[106]), "+f"(C_acc[107]), "+f"(C_acc[108]), "+f"(C_acc[109]), "+f"(C_acc[110]), "+f"(C_acc[111]), "+f"(C_acc[112]), "+f"(C_acc[113]), "+f"(C_acc[114]), "+f"(C_acc[115]), "+f"(C_acc[116]), "+f"(C_acc[117]), "+f"(C_acc[118]), "+f"(C_acc[119]), "+f"(C_acc[120]), "+f"(C_acc[121]), "+f"(C_acc[122]), "+f"(C_acc[123]), "+f"(C_acc[124]), "+f"(C_acc[125]), "+f"(C_acc[126]), "+f"(C_acc[127])
                        : "l"(fs_desc_add(fs_smem_desc(A_smem_base, 16u, 1024u, 1u), (k0_c % 4 * 1024 + rtid / 128 * 512 + 4))), "l"(fs_desc_add(fs_smem_desc(B_smem_base, 8192u, 1024u, 1u), (k0_c % 4 * 2048 + 256))), "r"((int)(1))
                        : "memory");
                    // k1 = 3
                    // sm90a.wgmma_m64n256k16_f16_f32_ss_tnspb: MatMul<warpgroup>(A:SH f16[64x16] Sw<3,3,3> x4 stages, B:SH f16[16x256] Sw<3,3,5> x4 stages, C:RF f32[64x256]) acc f32
                    //   d = C_acc[0 .. +128], desc_a = desc(&A_smem[k0_c % 4 * 8192 + rtid / 128 * 4096 + 48], swizzle 128, lbo 16, sbo 1024), desc_b = desc(&B_smem[k0_c % 4 * 16384 + 3072], swizzle 128, lbo 8192, sbo 1024), scale_d = 1
                    asm volatile("{ .reg .pred fs_p; setp.ne.b32 fs_p, %130, 0; wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, fs_p, 1, 1, 0, 1; }"
                        : "+f"(C_acc[0]), "+f"(C_acc[1]), "+f"(C_acc[2]), "+f"(C_acc[3]), "+f"(C_acc[4]), "+f"(C_acc[5]), "+f"(C_acc[6]), "+f"(C_acc[7]), "+f"(C_acc[8]), "+f"(C_acc[9]), "+f"(C_acc[10]), "+f"(C_acc[11]), "+f"(C_acc[12]), "+f"(C_acc[13]), "+f"(C_acc[14]), "+f"(C_acc[15]), "+f"(C_acc[16]), "+f"(C_acc[17]), "+f"(C_acc[18]), "+f"(C_acc[19]), "+f"(C_acc[20]), "+f"(C_acc[21]), "+f"(C_acc[22]), "+f"(C_acc[23]), "+f"(C_acc[24]), "+f"(C_acc[25]), "+f"(C_acc[26]), "+f"(C_acc[27]), "+f"(C_acc[28]), "+f"(C_acc[29]), "+f"(C_acc[30]), "+f"(C_acc[31]), "+f"(C_acc[32]), "+f"(C_acc[33]), "+f"(C_acc[34]), "+f"(C_acc[35]), "+f"(C_acc[36]), "+f"(C_acc[37]), "+f"(C_acc[38]), "+f"(C_acc[39]), "+f"(C_acc[40]), "+f"(C_acc[41]), "+f"(C_acc[42]), "+f"(C_acc[43]), "+f"(C_acc[44]), "+f"(C_acc[45]), "+f"(C_acc[46]), "+f"(C_acc[47]), "+f"(C_acc[48]), "+f"(C_acc[49]), "+f"(C_acc[50]), "+f"(C_acc[51]), "+f"(C_acc[52]), "+f"(C_acc[53]), "+f"(C_acc[54]), "+f"(C_acc[55]), "+f"(C_acc[56]), "+f"(C_acc[57]), "+f"(C_acc[58]), "+f"(C_acc[59]), "+f"(C_acc[60]), "+f"(C_acc[61]), "+f"(C_acc[62]), "+f"(C_acc[63]), "+f"(C_acc[64]), "+f"(C_acc[65]), "+f"(C_acc[66]), "+f"(C_acc[67]), "+f"(C_acc[68]), "+f"(C_acc[69]), "+f"(C_acc[70]), "+f"(C_acc[71]), "+f"(C_acc[72]), "+f"(C_acc[73]), "+f"(C_acc[74]), "+f"(C_acc[75]), "+f"(C_acc[76]), "+f"(C_acc[77]), "+f"(C_acc[78]), "+f"(C_acc[79]), "+f"(C_acc[80]), "+f"(C_acc[81]), "+f"(C_acc[82]), "+f"(C_acc[83]), "+f"(C_acc[84]), "+f"(C_acc[85]), "+f"(C_acc[86]), "+f"(C_acc[87]), "+f"(C_acc[88]), "+f"(C_acc[89]), "+f"(C_acc[90]), "+f"(C_acc[91]), "+f"(C_acc[92]), "+f"(C_acc[93]), "+f"(C_acc[94]), "+f"(C_acc[95]), "+f"(C_acc[96]), "+f"(C_acc[97]), "+f"(C_acc[98]), "+f"(C_acc[99]), "+f"(C_acc[100]), "+f"(C_acc[101]), "+f"(C_acc[102]), "+f"(C_acc[103]), "+f"(C_acc[104]), "+f"(C_acc[105]), "+f"(C_acc[106]), "+f"(C_acc[107]), "+f"(C_acc[108]), "+f"(C_acc[109]), "+f"(C_acc[110]), "+f"(C_acc[111]), "+f"(C_acc[112]), "+f"(C_acc[113]), "+f"(C_acc[114]), "+f"(C_acc[115]), "+f"(C_acc[116]), "+f"(C_acc[117]), "+f"(C_acc[118]), "+f"(C_acc[119]), "+f"(C_acc[120]), "+f"(C_acc[121]), "+f"(C_acc[122]), "+f"(C_acc[123]), "+f"(C_acc[124]), "+f"(C_acc[125]), "+f"(C_acc[126]), "+f"(C_acc[127])
                        : "l"(fs_desc_add(fs_smem_desc(A_smem_base, 16u, 1024u, 1u), (k0_c % 4 * 1024 + rtid / 128 * 512 + 6))), "l"(fs_desc_add(fs_smem_desc(B_smem_base, 8192u, 1024u, 1u), (k0_c % 4 * 2048 + 384))), "r"((int)(1))
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
                    for (int fs_i = 0; fs_i < 128; ++fs_i) {
                        fs_fence_reg(C_acc[fs_i]);
                    }
                    if (k0_c >= 1 && rtid % 128 < 1) {
                        // sm90a.mbarrier_arrive_cluster: release the previous stage (block rank 0)
                        //   bar = &empty[(k0_c + 3) % 4], cta = 0
                        asm volatile("{ .reg .b32 fs_r; mapa.shared::cluster.u32 fs_r, %0, %1; mbarrier.arrive.shared::cluster.b64 _, [fs_r]; }"
                            :
                            : "r"(empty_base + ((k0_c + 3) % 4 * 8)), "r"((int)(0))
                            : "memory");
                        // sm90a.mbarrier_arrive_cluster: release the previous stage (block rank 1)
                        //   bar = &empty[(k0_c + 3) % 4], cta = 1
                        asm volatile("{ .reg .b32 fs_r; mapa.shared::cluster.u32 fs_r, %0, %1; mbarrier.arrive.shared::cluster.b64 _, [fs_r]; }"
                            :
                            : "r"(empty_base + ((k0_c + 3) % 4 * 8)), "r"((int)(1))
                            : "memory");
                    }
                }
                // sm90a.wgmma_wait
                asm volatile("wgmma.wait_group.sync.aligned 0;"
                    :
                    :
                    : "memory");
                #pragma unroll
                for (int fs_i = 0; fs_i < 128; ++fs_i) {
                    fs_fence_reg(C_acc[fs_i]);
                }
                if (rtid % 128 < 1) {
                    // sm90a.mbarrier_arrive_cluster: release the last stage (block rank 0)
                    //   bar = &empty[3], cta = 0
                    asm volatile("{ .reg .b32 fs_r; mapa.shared::cluster.u32 fs_r, %0, %1; mbarrier.arrive.shared::cluster.b64 _, [fs_r]; }"
                        :
                        : "r"(empty_base + 24), "r"((int)(0))
                        : "memory");
                    // sm90a.mbarrier_arrive_cluster: release the last stage (block rank 1)
                    //   bar = &empty[3], cta = 1
                    asm volatile("{ .reg .b32 fs_r; mapa.shared::cluster.u32 fs_r, %0, %1; mbarrier.arrive.shared::cluster.b64 _, [fs_r]; }"
                        :
                        : "r"(empty_base + 24), "r"((int)(1))
                        : "memory");
                }
                // Move<block>(C:RF f32[128x256] -> C:GL f16[128x256]): D fragments -> C_smem (128B swizzle) -> TMA store, 4 chunks of 64x64
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
                for (int e0 = 0; e0 < 8; ++e0) {
                    epi[0] = C_acc[e0 * 4];
                    epi[1] = C_acc[e0 * 4 + 1];
                    // convert.cvt_f32x2_f16x2: two elements rounded into one register
                    //   d = out_f16[0 .. +2], src = epi[0 .. +2]
                    asm volatile("cvt.rn.f16x2.f32 %0, %2, %1;"
                        : "=r"(*reinterpret_cast<unsigned*>(&out_f16[0]))
                        : "f"(epi[0]), "f"(epi[1]));
                    // sm70.st_shared_4: C pair
                    //   dst = &C_smem[(e0 ^ rtid % 32 / 4) * 8 + rtid % 128 / 32 * 1024 + rtid % 32 / 4 * 64 + rtid % 4 * 2 + rtid / 128 * 4096], src = out_f16[0 .. +2]
                    asm volatile("st.shared.b32 [%0], %1;"
                        :
                        : "r"(C_smem_base + ((e0 ^ rtid % 32 / 4) * 16 + rtid % 128 / 32 * 2048 + rtid % 32 / 4 * 128 + rtid % 4 * 4 + rtid / 128 * 8192)), "r"(*reinterpret_cast<unsigned*>(&out_f16[0]))
                        : "memory");
                    epi[0] = C_acc[e0 * 4 + 2];
                    epi[1] = C_acc[e0 * 4 + 3];
                    // convert.cvt_f32x2_f16x2: two elements rounded into one register
                    //   d = out_f16[0 .. +2], src = epi[0 .. +2]
                    asm volatile("cvt.rn.f16x2.f32 %0, %2, %1;"
                        : "=r"(*reinterpret_cast<unsigned*>(&out_f16[0]))
                        : "f"(epi[0]), "f"(epi[1]));
                    // sm70.st_shared_4: C pair
                    //   dst = &C_smem[(e0 ^ rtid % 32 / 4) * 8 + rtid % 128 / 32 * 1024 + rtid % 32 / 4 * 64 + rtid % 4 * 2 + rtid / 128 * 4096 + 512], src = out_f16[0 .. +2]
                    asm volatile("st.shared.b32 [%0], %1;"
                        :
                        : "r"(C_smem_base + ((e0 ^ rtid % 32 / 4) * 16 + rtid % 128 / 32 * 2048 + rtid % 32 / 4 * 128 + rtid % 4 * 4 + rtid / 128 * 8192 + 1024)), "r"(*reinterpret_cast<unsigned*>(&out_f16[0]))
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
                    // sm90a.tma_store_2d: C rows +64, columns 0..+64
                    //   tmap = &tmap_C, c0 = (bid_x / 2 + tile_i * 2) % 64 / min(-(bid_x / 2 + tile_i * 66) / 64 * 4 + 16, 4) * 256, c1 = (bid_x / 2 + tile_i * 2) % 64 % min(-(bid_x / 2 + tile_i * 66) / 64 * 4 + 16, 4) * 256 + (bid_x / 2 + tile_i * 66) / 64 * 1024 + bid_x % 2 * 128 + rtid / 128 * 64, src = &C_smem[rtid / 128 * 4096]
                    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
                        :
                        : "l"(reinterpret_cast<unsigned long long>(&tmap_C)), "r"((int)((bid_x / 2 + tile_i * 2) % 64 / min(-(bid_x / 2 + tile_i * 66) / 64 * 4 + 16, 4) * 256)), "r"((int)((bid_x / 2 + tile_i * 2) % 64 % min(-(bid_x / 2 + tile_i * 66) / 64 * 4 + 16, 4) * 256 + (bid_x / 2 + tile_i * 66) / 64 * 1024 + bid_x % 2 * 128 + rtid / 128 * 64)), "r"(C_smem_base + (rtid / 128 * 8192))
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
                for (int e1 = 0; e1 < 8; ++e1) {
                    epi[0] = C_acc[e1 * 4 + 32];
                    epi[1] = C_acc[e1 * 4 + 33];
                    // convert.cvt_f32x2_f16x2: two elements rounded into one register
                    //   d = out_f16[0 .. +2], src = epi[0 .. +2]
                    asm volatile("cvt.rn.f16x2.f32 %0, %2, %1;"
                        : "=r"(*reinterpret_cast<unsigned*>(&out_f16[0]))
                        : "f"(epi[0]), "f"(epi[1]));
                    // sm70.st_shared_4: C pair
                    //   dst = &C_smem[(e1 ^ rtid % 32 / 4) * 8 + rtid % 128 / 32 * 1024 + rtid % 32 / 4 * 64 + rtid % 4 * 2 + rtid / 128 * 4096 + 8192], src = out_f16[0 .. +2]
                    asm volatile("st.shared.b32 [%0], %1;"
                        :
                        : "r"(C_smem_base + ((e1 ^ rtid % 32 / 4) * 16 + rtid % 128 / 32 * 2048 + rtid % 32 / 4 * 128 + rtid % 4 * 4 + rtid / 128 * 8192 + 16384)), "r"(*reinterpret_cast<unsigned*>(&out_f16[0]))
                        : "memory");
                    epi[0] = C_acc[e1 * 4 + 34];
                    epi[1] = C_acc[e1 * 4 + 35];
                    // convert.cvt_f32x2_f16x2: two elements rounded into one register
                    //   d = out_f16[0 .. +2], src = epi[0 .. +2]
                    asm volatile("cvt.rn.f16x2.f32 %0, %2, %1;"
                        : "=r"(*reinterpret_cast<unsigned*>(&out_f16[0]))
                        : "f"(epi[0]), "f"(epi[1]));
                    // sm70.st_shared_4: C pair
                    //   dst = &C_smem[(e1 ^ rtid % 32 / 4) * 8 + rtid % 128 / 32 * 1024 + rtid % 32 / 4 * 64 + rtid % 4 * 2 + rtid / 128 * 4096 + 8704], src = out_f16[0 .. +2]
                    asm volatile("st.shared.b32 [%0], %1;"
                        :
                        : "r"(C_smem_base + ((e1 ^ rtid % 32 / 4) * 16 + rtid % 128 / 32 * 2048 + rtid % 32 / 4 * 128 + rtid % 4 * 4 + rtid / 128 * 8192 + 17408)), "r"(*reinterpret_cast<unsigned*>(&out_f16[0]))
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
                    // sm90a.tma_store_2d: C rows +64, columns 64..+64
                    //   tmap = &tmap_C, c0 = (bid_x / 2 + tile_i * 2) % 64 / min(-(bid_x / 2 + tile_i * 66) / 64 * 4 + 16, 4) * 256 + 64, c1 = (bid_x / 2 + tile_i * 2) % 64 % min(-(bid_x / 2 + tile_i * 66) / 64 * 4 + 16, 4) * 256 + (bid_x / 2 + tile_i * 66) / 64 * 1024 + bid_x % 2 * 128 + rtid / 128 * 64, src = &C_smem[rtid / 128 * 4096 + 8192]
                    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
                        :
                        : "l"(reinterpret_cast<unsigned long long>(&tmap_C)), "r"((int)((bid_x / 2 + tile_i * 2) % 64 / min(-(bid_x / 2 + tile_i * 66) / 64 * 4 + 16, 4) * 256 + 64)), "r"((int)((bid_x / 2 + tile_i * 2) % 64 % min(-(bid_x / 2 + tile_i * 66) / 64 * 4 + 16, 4) * 256 + (bid_x / 2 + tile_i * 66) / 64 * 1024 + bid_x % 2 * 128 + rtid / 128 * 64)), "r"(C_smem_base + (rtid / 128 * 8192 + 16384))
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
                for (int e2 = 0; e2 < 8; ++e2) {
                    epi[0] = C_acc[e2 * 4 + 64];
                    epi[1] = C_acc[e2 * 4 + 65];
                    // convert.cvt_f32x2_f16x2: two elements rounded into one register
                    //   d = out_f16[0 .. +2], src = epi[0 .. +2]
                    asm volatile("cvt.rn.f16x2.f32 %0, %2, %1;"
                        : "=r"(*reinterpret_cast<unsigned*>(&out_f16[0]))
                        : "f"(epi[0]), "f"(epi[1]));
                    // sm70.st_shared_4: C pair
                    //   dst = &C_smem[(e2 ^ rtid % 32 / 4) * 8 + rtid % 128 / 32 * 1024 + rtid % 32 / 4 * 64 + rtid % 4 * 2 + rtid / 128 * 4096], src = out_f16[0 .. +2]
                    asm volatile("st.shared.b32 [%0], %1;"
                        :
                        : "r"(C_smem_base + ((e2 ^ rtid % 32 / 4) * 16 + rtid % 128 / 32 * 2048 + rtid % 32 / 4 * 128 + rtid % 4 * 4 + rtid / 128 * 8192)), "r"(*reinterpret_cast<unsigned*>(&out_f16[0]))
                        : "memory");
                    epi[0] = C_acc[e2 * 4 + 66];
                    epi[1] = C_acc[e2 * 4 + 67];
                    // convert.cvt_f32x2_f16x2: two elements rounded into one register
                    //   d = out_f16[0 .. +2], src = epi[0 .. +2]
                    asm volatile("cvt.rn.f16x2.f32 %0, %2, %1;"
                        : "=r"(*reinterpret_cast<unsigned*>(&out_f16[0]))
                        : "f"(epi[0]), "f"(epi[1]));
                    // sm70.st_shared_4: C pair
                    //   dst = &C_smem[(e2 ^ rtid % 32 / 4) * 8 + rtid % 128 / 32 * 1024 + rtid % 32 / 4 * 64 + rtid % 4 * 2 + rtid / 128 * 4096 + 512], src = out_f16[0 .. +2]
                    asm volatile("st.shared.b32 [%0], %1;"
                        :
                        : "r"(C_smem_base + ((e2 ^ rtid % 32 / 4) * 16 + rtid % 128 / 32 * 2048 + rtid % 32 / 4 * 128 + rtid % 4 * 4 + rtid / 128 * 8192 + 1024)), "r"(*reinterpret_cast<unsigned*>(&out_f16[0]))
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
                    // sm90a.tma_store_2d: C rows +64, columns 128..+64
                    //   tmap = &tmap_C, c0 = (bid_x / 2 + tile_i * 2) % 64 / min(-(bid_x / 2 + tile_i * 66) / 64 * 4 + 16, 4) * 256 + 128, c1 = (bid_x / 2 + tile_i * 2) % 64 % min(-(bid_x / 2 + tile_i * 66) / 64 * 4 + 16, 4) * 256 + (bid_x / 2 + tile_i * 66) / 64 * 1024 + bid_x % 2 * 128 + rtid / 128 * 64, src = &C_smem[rtid / 128 * 4096]
                    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
                        :
                        : "l"(reinterpret_cast<unsigned long long>(&tmap_C)), "r"((int)((bid_x / 2 + tile_i * 2) % 64 / min(-(bid_x / 2 + tile_i * 66) / 64 * 4 + 16, 4) * 256 + 128)), "r"((int)((bid_x / 2 + tile_i * 2) % 64 % min(-(bid_x / 2 + tile_i * 66) / 64 * 4 + 16, 4) * 256 + (bid_x / 2 + tile_i * 66) / 64 * 1024 + bid_x % 2 * 128 + rtid / 128 * 64)), "r"(C_smem_base + (rtid / 128 * 8192))
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
                for (int e3 = 0; e3 < 8; ++e3) {
                    epi[0] = C_acc[e3 * 4 + 96];
                    epi[1] = C_acc[e3 * 4 + 97];
                    // convert.cvt_f32x2_f16x2: two elements rounded into one register
                    //   d = out_f16[0 .. +2], src = epi[0 .. +2]
                    asm volatile("cvt.rn.f16x2.f32 %0, %2, %1;"
                        : "=r"(*reinterpret_cast<unsigned*>(&out_f16[0]))
                        : "f"(epi[0]), "f"(epi[1]));
                    // sm70.st_shared_4: C pair
                    //   dst = &C_smem[(e3 ^ rtid % 32 / 4) * 8 + rtid % 128 / 32 * 1024 + rtid % 32 / 4 * 64 + rtid % 4 * 2 + rtid / 128 * 4096 + 8192], src = out_f16[0 .. +2]
                    asm volatile("st.shared.b32 [%0], %1;"
                        :
                        : "r"(C_smem_base + ((e3 ^ rtid % 32 / 4) * 16 + rtid % 128 / 32 * 2048 + rtid % 32 / 4 * 128 + rtid % 4 * 4 + rtid / 128 * 8192 + 16384)), "r"(*reinterpret_cast<unsigned*>(&out_f16[0]))
                        : "memory");
                    epi[0] = C_acc[e3 * 4 + 98];
                    epi[1] = C_acc[e3 * 4 + 99];
                    // convert.cvt_f32x2_f16x2: two elements rounded into one register
                    //   d = out_f16[0 .. +2], src = epi[0 .. +2]
                    asm volatile("cvt.rn.f16x2.f32 %0, %2, %1;"
                        : "=r"(*reinterpret_cast<unsigned*>(&out_f16[0]))
                        : "f"(epi[0]), "f"(epi[1]));
                    // sm70.st_shared_4: C pair
                    //   dst = &C_smem[(e3 ^ rtid % 32 / 4) * 8 + rtid % 128 / 32 * 1024 + rtid % 32 / 4 * 64 + rtid % 4 * 2 + rtid / 128 * 4096 + 8704], src = out_f16[0 .. +2]
                    asm volatile("st.shared.b32 [%0], %1;"
                        :
                        : "r"(C_smem_base + ((e3 ^ rtid % 32 / 4) * 16 + rtid % 128 / 32 * 2048 + rtid % 32 / 4 * 128 + rtid % 4 * 4 + rtid / 128 * 8192 + 17408)), "r"(*reinterpret_cast<unsigned*>(&out_f16[0]))
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
                    // sm90a.tma_store_2d: C rows +64, columns 192..+64
                    //   tmap = &tmap_C, c0 = (bid_x / 2 + tile_i * 2) % 64 / min(-(bid_x / 2 + tile_i * 66) / 64 * 4 + 16, 4) * 256 + 192, c1 = (bid_x / 2 + tile_i * 2) % 64 % min(-(bid_x / 2 + tile_i * 66) / 64 * 4 + 16, 4) * 256 + (bid_x / 2 + tile_i * 66) / 64 * 1024 + bid_x % 2 * 128 + rtid / 128 * 64, src = &C_smem[rtid / 128 * 4096 + 8192]
                    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
                        :
                        : "l"(reinterpret_cast<unsigned long long>(&tmap_C)), "r"((int)((bid_x / 2 + tile_i * 2) % 64 / min(-(bid_x / 2 + tile_i * 66) / 64 * 4 + 16, 4) * 256 + 192)), "r"((int)((bid_x / 2 + tile_i * 2) % 64 % min(-(bid_x / 2 + tile_i * 66) / 64 * 4 + 16, 4) * 256 + (bid_x / 2 + tile_i * 66) / 64 * 1024 + bid_x % 2 * 128 + rtid / 128 * 64)), "r"(C_smem_base + (rtid / 128 * 8192 + 16384))
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
    // sm90a.barrier_cluster: no block leaves while the others may still arrive on its mbarriers
    asm volatile("barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;"
        :
        :
        : "memory");
}
