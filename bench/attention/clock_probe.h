// clock_probe.h — the SM clock the GPU runs at right now, measured on the device (see
// clock_probe.cu). hk_bench_flash_kernels calls it right after a timing, so a figure can be read
// beside the clock the power manager had settled on (the long attention shapes run at the H200's
// power cap, 1.67-1.98 GHz). Host interface only; not a timer and not used outside benchmarks.
#pragma once

// MHz: clock64 cycles over %globaltimer nanoseconds of one thread across a ~100 µs spin;
// synchronises the device. 0 when the measurement failed (no device, a launch error): the caller
// prints it.
double sm_clock_mhz();
