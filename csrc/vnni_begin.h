/* Compile the rest of the including file for AVX-512 VNNI (with AVX2, FMA, F16C, AVX-512 F/BW/VL), while
 * the library as a whole stays AVX2: qgemm.c picks the VNNI implementations only where the CPU has them.
 * Include it first; include vnni_end.h last (clang's attribute push needs its pop). */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))), \
                             apply_to = function)
#elif defined(__GNUC__)
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#endif
