/*
 * A small STREAM-style reference written for tensor-tutor (based on the method of McCalpin's
 * STREAM v5.10; not STREAM itself, so its results are "STREAM-like").
 *
 * Usage: stream_reference ELEMENTS NTIMES [REPEAT]
 * REPEAT (default 1) runs each kernel that many times inside one timed window, so that arrays small
 * enough for L1 take longer than the clock's and the parallel region's overhead (cache sweeps).
 * Three double arrays of ELEMENTS each, initialised in parallel (first touch on the threads that
 * use them). Copy c=a and triad a=b+q*c run NTIMES each under OpenMP; the first iteration is
 * excluded and the best (minimum) time of the rest is reported, as STREAM does. Bytes are counted
 * as STREAM counts them: copy 2 x 8 x N, triad 3 x 8 x N, write-allocate not counted.
 * Prints "copy_gbps <value>" and "triad_gbps <value>" (decimal GB/s) and the thread count.
 */
#include <float.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

static double best_of(double *times, int n) {
    double best = DBL_MAX;
    for (int i = 1; i < n; i++) /* skip the first iteration, as STREAM does */
        if (times[i] < best) best = times[i];
    return best;
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: %s ELEMENTS NTIMES [REPEAT]\n", argv[0]);
        return 2;
    }
    long n = atol(argv[1]);
    int ntimes = atoi(argv[2]);
    int repeat = argc == 4 ? atoi(argv[3]) : 1;
    if (n < 1 || ntimes < 2 || repeat < 1) {
        fprintf(stderr, "ELEMENTS must be >= 1, NTIMES >= 2 and REPEAT >= 1\n");
        return 2;
    }
    double *a = malloc(sizeof(double) * n), *b = malloc(sizeof(double) * n), *c = malloc(sizeof(double) * n);
    double *copy_times = malloc(sizeof(double) * ntimes), *triad_times = malloc(sizeof(double) * ntimes);
    if (!a || !b || !c || !copy_times || !triad_times) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    const double q = 3.0;
#pragma omp parallel for schedule(static)
    for (long j = 0; j < n; j++) {
        a[j] = 1.0;
        b[j] = 2.0;
        c[j] = 0.0;
    }
    for (int k = 0; k < ntimes; k++) {
        double t = omp_get_wtime();
        for (int r = 0; r < repeat; r++) {
#pragma omp parallel for schedule(static)
            for (long j = 0; j < n; j++) c[j] = a[j];
        }
        copy_times[k] = (omp_get_wtime() - t) / repeat;
        t = omp_get_wtime();
        for (int r = 0; r < repeat; r++) {
#pragma omp parallel for schedule(static)
            for (long j = 0; j < n; j++) a[j] = b[j] + q * c[j];
        }
        triad_times[k] = (omp_get_wtime() - t) / repeat;
    }
    printf("threads %d\n", omp_get_max_threads());
    printf("copy_gbps %.3f\n", 2.0 * sizeof(double) * n / best_of(copy_times, ntimes) / 1e9);
    printf("triad_gbps %.3f\n", 3.0 * sizeof(double) * n / best_of(triad_times, ntimes) / 1e9);
    /* Use the data so the compiler cannot drop the loops. */
    double check = 0.0;
    for (long j = 0; j < n; j += n / 16 + 1) check += a[j] + c[j];
    fprintf(stderr, "checksum %g\n", check);
    free(a); free(b); free(c); free(copy_times); free(triad_times);
    return 0;
}
