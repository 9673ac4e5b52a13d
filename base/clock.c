/* clock: the monotonic clock and a sleep signals do not cut short; see clock.h. */
#include "base/clock.h"

#include <errno.h>
#include <math.h>
#include <time.h>

double clock_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void clock_sleep_s(double seconds) {
    if (!(seconds > 0)) return;
    struct timespec left = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&left, &left) != 0 && errno == EINTR) {
    }
}

int clock_poll_ms(double deadline_s) {
    double left = deadline_s - clock_now_s();
    if (!(left > 0)) return 0;
    return left > 1e6 ? 1000000000 : (int)ceil(left * 1000);
}
