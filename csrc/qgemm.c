/* Which implementation of each op runs (qgemm.h): the fastest this CPU has, or the one EDGE_KERNELS_ISA names. */
#include <cpuid.h>
#include <string.h>

#include "qgemm.h"

extern const QImpl q4_avx2, q4_avx512vnni, q8_avx2, q8_avx512vnni;

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

/* avx2 or avx512vnni of one op. */
static const QImpl *pick(const char *isa, const QImpl *avx2, const QImpl *vnni) {
    __builtin_cpu_init();
    if (!isa || !*isa) return has_avx512vnni() ? vnni : has_avx2() ? avx2 : NULL;
    if (!strcmp(isa, avx2->isa)) return has_avx2() ? avx2 : NULL;
    if (!strcmp(isa, vnni->isa)) return has_avx512vnni() ? vnni : NULL;
    return NULL;
}

const QImpl *q4_impl(const char *isa) { return pick(isa, &q4_avx2, &q4_avx512vnni); }
const QImpl *q8_impl(const char *isa) { return pick(isa, &q8_avx2, &q8_avx512vnni); }
