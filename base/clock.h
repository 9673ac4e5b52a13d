/* clock: the monotonic clock in seconds, and a sleep that signals do not cut short. */
#ifndef FSDP_CLOCK_H
#define FSDP_CLOCK_H

/* CLOCK_MONOTONIC in seconds (cannot fail for that clock). */
double clock_now_s(void);
/* Sleeps `seconds` whatever signals arrive (nanosleep resumed on EINTR). */
void clock_sleep_s(double seconds);
/* Milliseconds left until deadline_s (a clock_now_s() value), rounded up, for poll();
 * 0 once it has passed. */
int clock_poll_ms(double deadline_s);

#endif
