/* mlx-rs seeds its random state with Darwin's mach_approximate_time; on Linux
 * the monotonic clock in nanoseconds serves the same purpose. */
#include <stdint.h>
#include <time.h>

uint64_t mach_approximate_time(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
}
