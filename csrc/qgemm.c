/* Which implementation of each op runs (qgemm.h): the fastest this CPU has, or the one EDGE_KERNELS_ISA names. */
#define _GNU_SOURCE /* syscall() */
#include <cpuid.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "qgemm.h"

extern const QImpl q4_avx2, q4_avx512vnni, q4_amx, q8_avx2, q8_avx512vnni, q8_amx;

/* F16C through cpuid: clang's __builtin_cpu_supports does not know the name (clang 14). AVX2's check
 * covers the OS's saving of the YMM state, which F16C needs too. */
static int has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

static int has_avx2(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c(); }

static int has_avx512vnni(void) {
    return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

/* AMX-TILE and AMX-INT8 in cpuid, the tile state enabled by the OS (XCR0 bits 17-18), and this process
 * allowed to use it: Linux (5.16+) grants the 8 KB of tile data per process on request
 * (ARCH_REQ_XCOMP_PERM), and a tile instruction without it is a SIGILL. Asked once. */
static int has_amx(void) {
    static int known = -1;
    if (known >= 0) return known;
    unsigned a, b, c, d, lo, hi;
    int ok = has_avx512vnni() && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 1) && (d >> 25 & 1);
    if (ok) {
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        ok = (lo >> 17 & 3) == 3;
    }
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    if (ok) ok = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return known = ok;
}

/* avx2, avx512vnni or amx of one op. */
static const QImpl *pick(const char *isa, const QImpl *avx2, const QImpl *vnni, const QImpl *amx) {
    __builtin_cpu_init();
    if (!isa || !*isa) return has_amx() ? amx : has_avx512vnni() ? vnni : has_avx2() ? avx2 : NULL;
    if (!strcmp(isa, avx2->isa)) return has_avx2() ? avx2 : NULL;
    if (!strcmp(isa, vnni->isa)) return has_avx512vnni() ? vnni : NULL;
    if (!strcmp(isa, amx->isa)) return has_amx() ? amx : NULL;
    return NULL;
}

const QImpl *q4_impl(const char *isa) { return pick(isa, &q4_avx2, &q4_avx512vnni, &q4_amx); }
const QImpl *q8_impl(const char *isa) { return pick(isa, &q8_avx2, &q8_avx512vnni, &q8_amx); }
