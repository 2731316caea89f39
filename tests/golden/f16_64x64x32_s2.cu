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

// MatMul<kernel>(A:GL f16[1000x1000], B:GL f16[1000x1000], C:GL f16[1000x1000]) acc f32
//   tile(m=64, n=64) >> to_blocks()
//   for m0 in block(16), n0 in block(16):
//     MatMul<block>(A:GL f16[64x1000], B:GL f16[1000x64], C:GL f16[64x64]) acc f32
//       tile(k=32)
//       Init<block>(C:RF f32[64x64] = 0)
//       for k0 in seq(32) pipelined(2 stages):
//         MatMul<block>(A:GL f16[64x32], B:GL f16[32x64], C:RF f32[64x64]) acc f32
//           move_to_smem('A')
//           Move<block>(A:GL f16[64x32] -> A:SH f16[64x32] Sw<2,3,3> x2 stages)
//           MatMul<block>(A:SH f16[64x32] Sw<2,3,3> x2 stages, B:GL f16[32x64], C:RF f32[64x64]) acc f32
//             move_to_smem('B')
//             Move<block>(B:GL f16[32x64] -> B:SH f16[32x64] Sw<3,3,3> x2 stages)
//             MatMul<block>(A:SH f16[64x32] Sw<2,3,3> x2 stages, B:SH f16[32x64] Sw<3,3,3> x2 stages, C:RF f32[64x64]) acc f32
//               tile(m=32, n=32) >> to_warps(2, 2)
//               for m1 in warp(2), n1 in warp(2):
//                 MatMul<warp>(A:SH f16[32x32] Sw<2,3,3> x2 stages, B:SH f16[32x32] Sw<3,3,3> x2 stages, C:RF f32[32x32]) acc f32
//                   tile(k=16)
//                   for k1 in seq(2):
//                     MatMul<warp>(A:SH f16[32x16] Sw<2,3,3> x2 stages, B:SH f16[16x32] Sw<3,3,3> x2 stages, C:RF f32[32x32]) acc f32
//                       move_to_regs('A')
//                       Move<warp>(A:SH f16[32x16] Sw<2,3,3> x2 stages -> A:RF f16[32x16])
//                       MatMul<warp>(A:RF f16[32x16], B:SH f16[16x32] Sw<3,3,3> x2 stages, C:RF f32[32x32]) acc f32
//                         move_to_regs('B')
//                         Move<warp>(B:SH f16[16x32] Sw<3,3,3> x2 stages -> B:RF f16[16x32])
//                         MatMul<warp>(A:RF f16[32x16], B:RF f16[16x32], C:RF f32[32x32]) acc f32
//                           tile(m=16, n=8, k=16)
//                           for m2 in seq(2), n2 in seq(4), k2 in seq(1):
//                             MatMul<warp>(A:RF f16[16x16], B:RF f16[16x8], C:RF f32[16x8]) acc f32
//                               done(sm80.mma_m16n8k16_f16_f32)
//       Move<block>(C:RF f32[64x64] -> C:GL f16[64x64])
// firesched_matmul: grid (16, 16, 1) x 128 threads, 16384 bytes of dynamic shared memory
extern "C" __global__ void __launch_bounds__(128, 1) firesched_matmul(
    const unsigned short* __restrict__ A,
    const unsigned short* __restrict__ B,
    unsigned short* __restrict__ C)
{
    const int tid = threadIdx.x;
    const int bid_x = blockIdx.x;
    const int bid_y = blockIdx.y;
    extern __shared__ __align__(128) unsigned char fs_smem[];
    // A_smem: f16[4096] at byte 0, 2 stage(s) x 64x32 f16, Sw<2,3,3>
    unsigned short* const A_smem = reinterpret_cast<unsigned short*>(fs_smem + 0);
    const unsigned A_smem_base = (unsigned)__cvta_generic_to_shared(A_smem);
    // B_smem: f16[4096] at byte 8192, 2 stage(s) x 32x64 f16, Sw<3,3,3>
    unsigned short* const B_smem = reinterpret_cast<unsigned short*>(fs_smem + 8192);
    const unsigned B_smem_base = (unsigned)__cvta_generic_to_shared(B_smem);
    alignas(16) float C_acc[32] = {};  // f32 x 32
    alignas(16) unsigned short A_frag[32] = {};  // f16 x 32
    alignas(16) unsigned short B_frag[32] = {};  // f16 x 32
    alignas(16) float epi[2] = {};  // f32 x 2
    alignas(16) unsigned short out_f16[2] = {};  // f16 x 2

    // sm90a.griddep_wait: launched programmatically: wait until the launch before this program has completed (before any global memory access)
    asm volatile("griddepcontrol.wait;"
        :
        :
        : "memory");
    // sm90a.griddep_launch_dependents: the next launch on the stream may be scheduled once every block is here
    asm volatile("griddepcontrol.launch_dependents;"
        :
        :
        : "memory");
    // C_acc[0 .. +32] = 0.0
    #pragma unroll
    for (int fs_r = 0; fs_r < 32; ++fs_r) {
        C_acc[fs_r] = 0.0f;
    }
    // K loop over 32 tiles of 32, 2-stage cp.async pipeline
    // Move<block>(A:GL f16[64x32] -> A:SH f16[64x32] Sw<2,3,3> x2 stages): 256 chunks of 8 x f16 over 128 threads
    #pragma unroll
    for (int c0 = 0; c0 < 2; ++c0) {
        // sm80.cp_async_16: A tile -> shared
        //   dst = &A_smem[tid % 4 * 8 + tid / 4 * 32 ^ (tid % 4 * 8 + tid / 4 * 32 & 192) / 8 ^ (c0 * 1024 ^ (c0 * 1024 & 192) / 8)], src = &A[bid_y * 64000 + c0 * 32000 + tid % 4 * 8 + tid / 4 * 1000]
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
            :
            : "r"(A_smem_base + ((tid % 4 * 8 + tid / 4 * 32 ^ (tid % 4 * 8 + tid / 4 * 32 & 192) / 8 ^ (c0 * 1024 ^ (c0 * 1024 & 192) / 8)) * 2)), "l"((bid_y * 64 + c0 * 32 + tid / 4 < 1000) ? A + (bid_y * 64000 + c0 * 32000 + tid % 4 * 8 + tid / 4 * 1000) : A), "r"((bid_y * 64 + c0 * 32 + tid / 4 < 1000) ? 16 : 0)
            : "memory");
    }
    // Move<block>(B:GL f16[32x64] -> B:SH f16[32x64] Sw<3,3,3> x2 stages): 256 chunks of 8 x f16 over 128 threads
    #pragma unroll
    for (int c1 = 0; c1 < 2; ++c1) {
        // sm80.cp_async_16: B tile -> shared
        //   dst = &B_smem[tid % 8 * 8 + tid / 8 * 64 ^ (tid % 8 * 8 + tid / 8 * 64 & 448) / 8 ^ (c1 * 1024 ^ (c1 * 1024 & 448) / 8)], src = &B[bid_x * 64 + c1 * 16000 + tid % 8 * 8 + tid / 8 * 1000]
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
            :
            : "r"(B_smem_base + ((tid % 8 * 8 + tid / 8 * 64 ^ (tid % 8 * 8 + tid / 8 * 64 & 448) / 8 ^ (c1 * 1024 ^ (c1 * 1024 & 448) / 8)) * 2)), "l"((bid_x * 64 + tid % 8 * 8 < 1000) ? B + (bid_x * 64 + c1 * 16000 + tid % 8 * 8 + tid / 8 * 1000) : B), "r"((bid_x * 64 + tid % 8 * 8 < 1000) ? 16 : 0)
            : "memory");
    }
    // sm80.cp_async_commit
    asm volatile("cp.async.commit_group;"
        :
        :
        : "memory");
    // sm80.cp_async_wait: at most 0 cp.async groups still pending
    asm volatile("cp.async.wait_group 0;"
        :
        :
        : "memory");
    // tile 0 landed
    __syncthreads();
    // Move<warp>(A:SH f16[32x16] Sw<2,3,3> x2 stages -> A:RF f16[32x16]): ldmatrix_x4
    // sm80.ldmatrix_x4: A fragments for mma_m16n8k16_f16_f32
    //   dst = A_frag[0 .. +8], src = &A_smem[tid % 16 * 32 + tid % 32 / 16 * 8 + tid / 64 * 1024 ^ (tid % 16 * 32 + tid % 32 / 16 * 8 + tid / 64 * 1024 & 192) / 8]
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
        : "=r"(*reinterpret_cast<unsigned*>(&A_frag[0])), "=r"(*reinterpret_cast<unsigned*>(&A_frag[2])), "=r"(*reinterpret_cast<unsigned*>(&A_frag[4])), "=r"(*reinterpret_cast<unsigned*>(&A_frag[6]))
        : "r"(A_smem_base + ((tid % 16 * 32 + tid % 32 / 16 * 8 + tid / 64 * 1024 ^ (tid % 16 * 32 + tid % 32 / 16 * 8 + tid / 64 * 1024 & 192) / 8) * 2))
        : "memory");
    // sm80.ldmatrix_x4: A fragments for mma_m16n8k16_f16_f32
    //   dst = A_frag[8 .. +8], src = &A_smem[tid % 16 * 32 + tid % 32 / 16 * 8 + tid / 64 * 1024 ^ (tid % 16 * 32 + tid % 32 / 16 * 8 + tid / 64 * 1024 & 192) / 8 ^ 512]
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
        : "=r"(*reinterpret_cast<unsigned*>(&A_frag[8])), "=r"(*reinterpret_cast<unsigned*>(&A_frag[10])), "=r"(*reinterpret_cast<unsigned*>(&A_frag[12])), "=r"(*reinterpret_cast<unsigned*>(&A_frag[14]))
        : "r"(A_smem_base + ((tid % 16 * 32 + tid % 32 / 16 * 8 + tid / 64 * 1024 ^ (tid % 16 * 32 + tid % 32 / 16 * 8 + tid / 64 * 1024 & 192) / 8 ^ 512) * 2))
        : "memory");
    // Move<warp>(B:SH f16[16x32] Sw<3,3,3> x2 stages -> B:RF f16[16x32]): ldmatrix_x4_trans
    // sm80.ldmatrix_x4_trans: B fragments for mma_m16n8k16_f16_f32
    //   dst = B_frag[0 .. +8], src = &B_smem[tid % 16 * 64 + tid % 32 / 16 * 8 + tid / 32 % 2 * 32 ^ (tid % 16 * 64 + tid % 32 / 16 * 8 + tid / 32 % 2 * 32 & 448) / 8]
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
        : "=r"(*reinterpret_cast<unsigned*>(&B_frag[0])), "=r"(*reinterpret_cast<unsigned*>(&B_frag[2])), "=r"(*reinterpret_cast<unsigned*>(&B_frag[4])), "=r"(*reinterpret_cast<unsigned*>(&B_frag[6]))
        : "r"(B_smem_base + ((tid % 16 * 64 + tid % 32 / 16 * 8 + tid / 32 % 2 * 32 ^ (tid % 16 * 64 + tid % 32 / 16 * 8 + tid / 32 % 2 * 32 & 448) / 8) * 2))
        : "memory");
    // sm80.ldmatrix_x4_trans: B fragments for mma_m16n8k16_f16_f32
    //   dst = B_frag[8 .. +8], src = &B_smem[tid % 16 * 64 + tid % 32 / 16 * 8 + tid / 32 % 2 * 32 ^ (tid % 16 * 64 + tid % 32 / 16 * 8 + tid / 32 % 2 * 32 & 448) / 8 ^ 16]
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
        : "=r"(*reinterpret_cast<unsigned*>(&B_frag[8])), "=r"(*reinterpret_cast<unsigned*>(&B_frag[10])), "=r"(*reinterpret_cast<unsigned*>(&B_frag[12])), "=r"(*reinterpret_cast<unsigned*>(&B_frag[14]))
        : "r"(B_smem_base + ((tid % 16 * 64 + tid % 32 / 16 * 8 + tid / 32 % 2 * 32 ^ (tid % 16 * 64 + tid % 32 / 16 * 8 + tid / 32 % 2 * 32 & 448) / 8 ^ 16) * 2))
        : "memory");
    #pragma unroll 1
    for (int k0 = 0; k0 < 32; ++k0) {
        if (k0 + 1 < 32) {
            // Move<block>(A:GL f16[64x32] -> A:SH f16[64x32] Sw<2,3,3> x2 stages): 256 chunks of 8 x f16 over 128 threads
            #pragma unroll
            for (int c2 = 0; c2 < 2; ++c2) {
                // sm80.cp_async_16: A tile -> shared
                //   dst = &A_smem[(k0 + 1) % 2 * 2048 + (tid % 4 * 8 + tid / 4 * 32 ^ (tid % 4 * 8 + tid / 4 * 32 & 192) / 8 ^ (c2 * 1024 ^ (c2 * 1024 & 192) / 8))], src = &A[bid_y * 64000 + c2 * 32000 + k0 * 32 + tid % 4 * 8 + tid / 4 * 1000 + 32]
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                    :
                    : "r"(A_smem_base + ((k0 + 1) % 2 * 4096 + (tid % 4 * 8 + tid / 4 * 32 ^ (tid % 4 * 8 + tid / 4 * 32 & 192) / 8 ^ (c2 * 1024 ^ (c2 * 1024 & 192) / 8)) * 2)), "l"((bid_y * 64 + c2 * 32 + tid / 4 < 1000 && k0 * 32 + tid % 4 * 8 + 32 < 1000) ? A + (bid_y * 64000 + c2 * 32000 + k0 * 32 + tid % 4 * 8 + tid / 4 * 1000 + 32) : A), "r"((bid_y * 64 + c2 * 32 + tid / 4 < 1000 && k0 * 32 + tid % 4 * 8 + 32 < 1000) ? 16 : 0)
                    : "memory");
            }
            // Move<block>(B:GL f16[32x64] -> B:SH f16[32x64] Sw<3,3,3> x2 stages): 256 chunks of 8 x f16 over 128 threads
            #pragma unroll
            for (int c3 = 0; c3 < 2; ++c3) {
                // sm80.cp_async_16: B tile -> shared
                //   dst = &B_smem[(k0 + 1) % 2 * 2048 + (tid % 8 * 8 + tid / 8 * 64 ^ (tid % 8 * 8 + tid / 8 * 64 & 448) / 8 ^ (c3 * 1024 ^ (c3 * 1024 & 448) / 8))], src = &B[bid_x * 64 + c3 * 16000 + k0 * 32000 + tid % 8 * 8 + tid / 8 * 1000 + 32000]
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                    :
                    : "r"(B_smem_base + ((k0 + 1) % 2 * 4096 + (tid % 8 * 8 + tid / 8 * 64 ^ (tid % 8 * 8 + tid / 8 * 64 & 448) / 8 ^ (c3 * 1024 ^ (c3 * 1024 & 448) / 8)) * 2)), "l"((c3 * 16 + k0 * 32 + tid / 8 + 32 < 1000 && bid_x * 64 + tid % 8 * 8 < 1000) ? B + (bid_x * 64 + c3 * 16000 + k0 * 32000 + tid % 8 * 8 + tid / 8 * 1000 + 32000) : B), "r"((c3 * 16 + k0 * 32 + tid / 8 + 32 < 1000 && bid_x * 64 + tid % 8 * 8 < 1000) ? 16 : 0)
                    : "memory");
            }
        }
        // sm80.cp_async_commit
        asm volatile("cp.async.commit_group;"
            :
            :
            : "memory");
        // Move<warp>(A:SH f16[32x16] Sw<2,3,3> x2 stages -> A:RF f16[32x16]): ldmatrix_x4
        // sm80.ldmatrix_x4: A fragments for mma_m16n8k16_f16_f32
        //   dst = A_frag[16 .. +8], src = &A_smem[k0 % 2 * 2048 + (tid % 16 * 32 + tid % 32 / 16 * 8 + tid / 64 * 1024 ^ (tid % 16 * 32 + tid % 32 / 16 * 8 + tid / 64 * 1024 & 192) / 8 ^ 16)]
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
            : "=r"(*reinterpret_cast<unsigned*>(&A_frag[16])), "=r"(*reinterpret_cast<unsigned*>(&A_frag[18])), "=r"(*reinterpret_cast<unsigned*>(&A_frag[20])), "=r"(*reinterpret_cast<unsigned*>(&A_frag[22]))
            : "r"(A_smem_base + (k0 % 2 * 4096 + (tid % 16 * 32 + tid % 32 / 16 * 8 + tid / 64 * 1024 ^ (tid % 16 * 32 + tid % 32 / 16 * 8 + tid / 64 * 1024 & 192) / 8 ^ 16) * 2))
            : "memory");
        // sm80.ldmatrix_x4: A fragments for mma_m16n8k16_f16_f32
        //   dst = A_frag[24 .. +8], src = &A_smem[k0 % 2 * 2048 + (tid % 16 * 32 + tid % 32 / 16 * 8 + tid / 64 * 1024 ^ (tid % 16 * 32 + tid % 32 / 16 * 8 + tid / 64 * 1024 & 192) / 8 ^ 528)]
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
            : "=r"(*reinterpret_cast<unsigned*>(&A_frag[24])), "=r"(*reinterpret_cast<unsigned*>(&A_frag[26])), "=r"(*reinterpret_cast<unsigned*>(&A_frag[28])), "=r"(*reinterpret_cast<unsigned*>(&A_frag[30]))
            : "r"(A_smem_base + (k0 % 2 * 4096 + (tid % 16 * 32 + tid % 32 / 16 * 8 + tid / 64 * 1024 ^ (tid % 16 * 32 + tid % 32 / 16 * 8 + tid / 64 * 1024 & 192) / 8 ^ 528) * 2))
            : "memory");
        // Move<warp>(B:SH f16[16x32] Sw<3,3,3> x2 stages -> B:RF f16[16x32]): ldmatrix_x4_trans
        // sm80.ldmatrix_x4_trans: B fragments for mma_m16n8k16_f16_f32
        //   dst = B_frag[16 .. +8], src = &B_smem[k0 % 2 * 2048 + (tid % 16 * 64 + tid % 32 / 16 * 8 + tid / 32 % 2 * 32 ^ (tid % 16 * 64 + tid % 32 / 16 * 8 + tid / 32 % 2 * 32 & 448) / 8 ^ 1024)]
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
            : "=r"(*reinterpret_cast<unsigned*>(&B_frag[16])), "=r"(*reinterpret_cast<unsigned*>(&B_frag[18])), "=r"(*reinterpret_cast<unsigned*>(&B_frag[20])), "=r"(*reinterpret_cast<unsigned*>(&B_frag[22]))
            : "r"(B_smem_base + (k0 % 2 * 4096 + (tid % 16 * 64 + tid % 32 / 16 * 8 + tid / 32 % 2 * 32 ^ (tid % 16 * 64 + tid % 32 / 16 * 8 + tid / 32 % 2 * 32 & 448) / 8 ^ 1024) * 2))
            : "memory");
        // sm80.ldmatrix_x4_trans: B fragments for mma_m16n8k16_f16_f32
        //   dst = B_frag[24 .. +8], src = &B_smem[k0 % 2 * 2048 + (tid % 16 * 64 + tid % 32 / 16 * 8 + tid / 32 % 2 * 32 ^ (tid % 16 * 64 + tid % 32 / 16 * 8 + tid / 32 % 2 * 32 & 448) / 8 ^ 1040)]
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
            : "=r"(*reinterpret_cast<unsigned*>(&B_frag[24])), "=r"(*reinterpret_cast<unsigned*>(&B_frag[26])), "=r"(*reinterpret_cast<unsigned*>(&B_frag[28])), "=r"(*reinterpret_cast<unsigned*>(&B_frag[30]))
            : "r"(B_smem_base + (k0 % 2 * 4096 + (tid % 16 * 64 + tid % 32 / 16 * 8 + tid / 32 % 2 * 32 ^ (tid % 16 * 64 + tid % 32 / 16 * 8 + tid / 32 % 2 * 32 & 448) / 8 ^ 1040) * 2))
            : "memory");
        #pragma unroll
        for (int m2 = 0; m2 < 2; ++m2) {
            #pragma unroll
            for (int n2 = 0; n2 < 4; ++n2) {
                #pragma unroll
                for (int k2 = 0; k2 < 1; ++k2) {
                    // sm80.mma_m16n8k16_f16_f32: MatMul<warp>(A:RF f16[16x16], B:RF f16[16x8], C:RF f32[16x8]) acc f32
                    //   d = C_acc[m2 * 16 + n2 * 4 .. +4], a = A_frag[m2 * 8 .. +8], b = B_frag[n2 * 4 .. +4], c = C_acc[m2 * 16 + n2 * 4 .. +4]
                    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
                        : "=f"(C_acc[m2 * 16 + n2 * 4]), "=f"(C_acc[m2 * 16 + n2 * 4 + 1]), "=f"(C_acc[m2 * 16 + n2 * 4 + 2]), "=f"(C_acc[m2 * 16 + n2 * 4 + 3])
                        : "r"(*reinterpret_cast<unsigned*>(&A_frag[m2 * 8])), "r"(*reinterpret_cast<unsigned*>(&A_frag[m2 * 8 + 2])), "r"(*reinterpret_cast<unsigned*>(&A_frag[m2 * 8 + 4])), "r"(*reinterpret_cast<unsigned*>(&A_frag[m2 * 8 + 6])), "r"(*reinterpret_cast<unsigned*>(&B_frag[n2 * 4])), "r"(*reinterpret_cast<unsigned*>(&B_frag[n2 * 4 + 2])), "f"(C_acc[m2 * 16 + n2 * 4]), "f"(C_acc[m2 * 16 + n2 * 4 + 1]), "f"(C_acc[m2 * 16 + n2 * 4 + 2]), "f"(C_acc[m2 * 16 + n2 * 4 + 3]));
                }
            }
        }
        // sm80.cp_async_wait: at most 0 cp.async groups still pending
        asm volatile("cp.async.wait_group 0;"
            :
            :
            : "memory");
        // tile kt+1 landed; stage kt-1 is no longer read
        __syncthreads();
        // Move<warp>(A:SH f16[32x16] Sw<2,3,3> x2 stages -> A:RF f16[32x16]): ldmatrix_x4
        // sm80.ldmatrix_x4: A fragments for mma_m16n8k16_f16_f32
        //   dst = A_frag[0 .. +8], src = &A_smem[(k0 + 1) % 2 * 2048 + (tid % 16 * 32 + tid % 32 / 16 * 8 + tid / 64 * 1024 ^ (tid % 16 * 32 + tid % 32 / 16 * 8 + tid / 64 * 1024 & 192) / 8)]
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
            : "=r"(*reinterpret_cast<unsigned*>(&A_frag[0])), "=r"(*reinterpret_cast<unsigned*>(&A_frag[2])), "=r"(*reinterpret_cast<unsigned*>(&A_frag[4])), "=r"(*reinterpret_cast<unsigned*>(&A_frag[6]))
            : "r"(A_smem_base + ((k0 + 1) % 2 * 4096 + (tid % 16 * 32 + tid % 32 / 16 * 8 + tid / 64 * 1024 ^ (tid % 16 * 32 + tid % 32 / 16 * 8 + tid / 64 * 1024 & 192) / 8) * 2))
            : "memory");
        // sm80.ldmatrix_x4: A fragments for mma_m16n8k16_f16_f32
        //   dst = A_frag[8 .. +8], src = &A_smem[(k0 + 1) % 2 * 2048 + (tid % 16 * 32 + tid % 32 / 16 * 8 + tid / 64 * 1024 ^ (tid % 16 * 32 + tid % 32 / 16 * 8 + tid / 64 * 1024 & 192) / 8 ^ 512)]
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
            : "=r"(*reinterpret_cast<unsigned*>(&A_frag[8])), "=r"(*reinterpret_cast<unsigned*>(&A_frag[10])), "=r"(*reinterpret_cast<unsigned*>(&A_frag[12])), "=r"(*reinterpret_cast<unsigned*>(&A_frag[14]))
            : "r"(A_smem_base + ((k0 + 1) % 2 * 4096 + (tid % 16 * 32 + tid % 32 / 16 * 8 + tid / 64 * 1024 ^ (tid % 16 * 32 + tid % 32 / 16 * 8 + tid / 64 * 1024 & 192) / 8 ^ 512) * 2))
            : "memory");
        // Move<warp>(B:SH f16[16x32] Sw<3,3,3> x2 stages -> B:RF f16[16x32]): ldmatrix_x4_trans
        // sm80.ldmatrix_x4_trans: B fragments for mma_m16n8k16_f16_f32
        //   dst = B_frag[0 .. +8], src = &B_smem[(k0 + 1) % 2 * 2048 + (tid % 16 * 64 + tid % 32 / 16 * 8 + tid / 32 % 2 * 32 ^ (tid % 16 * 64 + tid % 32 / 16 * 8 + tid / 32 % 2 * 32 & 448) / 8)]
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
            : "=r"(*reinterpret_cast<unsigned*>(&B_frag[0])), "=r"(*reinterpret_cast<unsigned*>(&B_frag[2])), "=r"(*reinterpret_cast<unsigned*>(&B_frag[4])), "=r"(*reinterpret_cast<unsigned*>(&B_frag[6]))
            : "r"(B_smem_base + ((k0 + 1) % 2 * 4096 + (tid % 16 * 64 + tid % 32 / 16 * 8 + tid / 32 % 2 * 32 ^ (tid % 16 * 64 + tid % 32 / 16 * 8 + tid / 32 % 2 * 32 & 448) / 8) * 2))
            : "memory");
        // sm80.ldmatrix_x4_trans: B fragments for mma_m16n8k16_f16_f32
        //   dst = B_frag[8 .. +8], src = &B_smem[(k0 + 1) % 2 * 2048 + (tid % 16 * 64 + tid % 32 / 16 * 8 + tid / 32 % 2 * 32 ^ (tid % 16 * 64 + tid % 32 / 16 * 8 + tid / 32 % 2 * 32 & 448) / 8 ^ 16)]
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
            : "=r"(*reinterpret_cast<unsigned*>(&B_frag[8])), "=r"(*reinterpret_cast<unsigned*>(&B_frag[10])), "=r"(*reinterpret_cast<unsigned*>(&B_frag[12])), "=r"(*reinterpret_cast<unsigned*>(&B_frag[14]))
            : "r"(B_smem_base + ((k0 + 1) % 2 * 4096 + (tid % 16 * 64 + tid % 32 / 16 * 8 + tid / 32 % 2 * 32 ^ (tid % 16 * 64 + tid % 32 / 16 * 8 + tid / 32 % 2 * 32 & 448) / 8 ^ 16) * 2))
            : "memory");
        #pragma unroll
        for (int m2 = 0; m2 < 2; ++m2) {
            #pragma unroll
            for (int n2 = 0; n2 < 4; ++n2) {
                #pragma unroll
                for (int k2 = 0; k2 < 1; ++k2) {
                    // sm80.mma_m16n8k16_f16_f32: MatMul<warp>(A:RF f16[16x16], B:RF f16[16x8], C:RF f32[16x8]) acc f32
                    //   d = C_acc[m2 * 16 + n2 * 4 .. +4], a = A_frag[m2 * 8 + 16 .. +8], b = B_frag[n2 * 4 + 16 .. +4], c = C_acc[m2 * 16 + n2 * 4 .. +4]
                    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
                        : "=f"(C_acc[m2 * 16 + n2 * 4]), "=f"(C_acc[m2 * 16 + n2 * 4 + 1]), "=f"(C_acc[m2 * 16 + n2 * 4 + 2]), "=f"(C_acc[m2 * 16 + n2 * 4 + 3])
                        : "r"(*reinterpret_cast<unsigned*>(&A_frag[m2 * 8 + 16])), "r"(*reinterpret_cast<unsigned*>(&A_frag[m2 * 8 + 18])), "r"(*reinterpret_cast<unsigned*>(&A_frag[m2 * 8 + 20])), "r"(*reinterpret_cast<unsigned*>(&A_frag[m2 * 8 + 22])), "r"(*reinterpret_cast<unsigned*>(&B_frag[n2 * 4 + 16])), "r"(*reinterpret_cast<unsigned*>(&B_frag[n2 * 4 + 18])), "f"(C_acc[m2 * 16 + n2 * 4]), "f"(C_acc[m2 * 16 + n2 * 4 + 1]), "f"(C_acc[m2 * 16 + n2 * 4 + 2]), "f"(C_acc[m2 * 16 + n2 * 4 + 3]));
                }
            }
        }
    }
    // sm80.cp_async_wait: at most 0 cp.async groups still pending
    asm volatile("cp.async.wait_group 0;"
        :
        :
        : "memory");
    // Move<block>(C:RF f32[64x64] -> C:GL f16[64x64])
    #pragma unroll
    for (int f4 = 0; f4 < 2; ++f4) {
        #pragma unroll
        for (int f5 = 0; f5 < 4; ++f5) {
            epi[0] = C_acc[f4 * 16 + f5 * 4];
            epi[1] = C_acc[f4 * 16 + f5 * 4 + 1];
            // convert.cvt_f32x2_f16x2: two elements rounded into one register
            //   d = out_f16[0 .. +2], src = epi[0 .. +2]
            asm volatile("cvt.rn.f16x2.f32 %0, %2, %1;"
                : "=r"(*reinterpret_cast<unsigned*>(&out_f16[0]))
                : "f"(epi[0]), "f"(epi[1]));
            // sm70.st_global_4: C
            //   dst = &C[bid_x * 64 + bid_y * 64000 + f4 * 16000 + f5 * 8 + tid % 32 / 4 * 1000 + tid % 4 * 2 + tid / 32 % 2 * 32 + tid / 64 * 32000], src = out_f16[0 .. +2]
            if (bid_y * 64 + f4 * 16 + tid % 32 / 4 + tid / 64 * 32 < 1000 && bid_x * 64 + f5 * 8 + tid % 4 * 2 + tid / 32 % 2 * 32 < 1000) {
                asm volatile("st.global.b32 [%0], %1;"
                    :
                    : "l"(C + (bid_x * 64 + bid_y * 64000 + f4 * 16000 + f5 * 8 + tid % 32 / 4 * 1000 + tid % 4 * 2 + tid / 32 % 2 * 32 + tid / 64 * 32000)), "r"(*reinterpret_cast<unsigned*>(&out_f16[0]))
                    : "memory");
            }
            epi[0] = C_acc[f4 * 16 + f5 * 4 + 2];
            epi[1] = C_acc[f4 * 16 + f5 * 4 + 3];
            // convert.cvt_f32x2_f16x2: two elements rounded into one register
            //   d = out_f16[0 .. +2], src = epi[0 .. +2]
            asm volatile("cvt.rn.f16x2.f32 %0, %2, %1;"
                : "=r"(*reinterpret_cast<unsigned*>(&out_f16[0]))
                : "f"(epi[0]), "f"(epi[1]));
            // sm70.st_global_4: C
            //   dst = &C[bid_x * 64 + bid_y * 64000 + f4 * 16000 + f5 * 8 + tid % 32 / 4 * 1000 + tid % 4 * 2 + tid / 32 % 2 * 32 + tid / 64 * 32000 + 8000], src = out_f16[0 .. +2]
            if (bid_y * 64 + f4 * 16 + tid % 32 / 4 + tid / 64 * 32 + 8 < 1000 && bid_x * 64 + f5 * 8 + tid % 4 * 2 + tid / 32 % 2 * 32 < 1000) {
                asm volatile("st.global.b32 [%0], %1;"
                    :
                    : "l"(C + (bid_x * 64 + bid_y * 64000 + f4 * 16000 + f5 * 8 + tid % 32 / 4 * 1000 + tid % 4 * 2 + tid / 32 % 2 * 32 + tid / 64 * 32000 + 8000)), "r"(*reinterpret_cast<unsigned*>(&out_f16[0]))
                    : "memory");
            }
        }
    }
}
