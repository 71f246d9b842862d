/* The end of vnni_begin.h's region (GCC's target pragma lasts to the end of the file anyway). */
#if defined(__clang__)
#pragma clang attribute pop
#endif
