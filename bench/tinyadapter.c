/* tinyadapter: the smallest adapter trioserve can run, for benchmarks.
 *
 *   tinyadapter [N]           read stdin to EOF, print session.started,
 *                             N message events, session.ended; exit 0.
 *   tinyadapter hang [SECS]   read stdin to EOF, print session.started,
 *                             sleep SECS (default 60), then end as above.
 *   tinyadapter slow MS [N]   sleep MS milliseconds *before* reading stdin
 *                             (a runtime loading its libraries, as a Node
 *                             adapter does for ~1.5 s), then as tinyadapter N;
 *                             session.started's data has "pid" and "idleMs",
 *                             the time from the end of the sleep to the end
 *                             of the spec (> 0: it waited, loaded, for a turn).
 *   tinyadapter burn MS [N]   spin MS milliseconds of CPU time *before*
 *                             reading stdin (a runtime that loads by
 *                             computing, as Node does: ~1.2 s of CPU), then
 *                             as slow: session.started has "pid", "idleMs".
 *   tinyadapter burn MS N TAIL  the same, and after session.started (flushed
 *                             at once) spin TAIL ms of CPU before the rest:
 *                             a turn that lasts TAIL ms past its first event.
 *   tinyadapter big BYTES     read stdin to EOF, print session.started, one
 *                             message event whose data.text is BYTES bytes
 *                             (see big_text), session.ended.
 *
 * Output goes through one big stdout buffer; every line is a v1 wire event.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char outbuf[1 << 20];

static void drain_stdin(void) {
    char buf[65536];
    while (read(STDIN_FILENO, buf, sizeof buf) > 0) {
    }
}

static void sleep_ms(long ms) {
    struct timespec left = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&left, &left) != 0 && errno == EINTR) {
    }
}

/* The text of the big event: "00000000,00000001,00000002,..." (9 bytes per
 * counter, printable ASCII, nothing JSON must escape) cut to `bytes` bytes.
 * Every 9-byte block differs, so a lost, repeated or reordered piece shows.
 * bench/run.py builds the same string to compare. */
static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static double cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* Spin until this process has used `ms` milliseconds of CPU time. */
static void burn_ms(long ms) {
    volatile unsigned long sink = 0;
    double until = cpu_ms() + (double)ms;
    while (cpu_ms() < until) {
        for (int i = 0; i < 10000; i++) {
            sink += (unsigned long)i;
        }
    }
}

static char *big_text(long bytes) {
    char *text = malloc((size_t)bytes + 16);
    if (text == NULL) {
        perror("tinyadapter: malloc");
        exit(1);
    }
    char *p = text;
    for (long k = 0; p - text < bytes; k++) {
        long v = k;
        for (int d = 7; d >= 0; d--) {
            p[d] = (char)('0' + v % 10);
            v /= 10;
        }
        p[8] = ',';
        p += 9;
    }
    return text;
}

int main(int argc, char **argv) {
    long n = 1;
    long hang = -1;
    long big = -1;
    int slow = 0;
    long tail = 0;
    double loaded = 0;
    if (argc > 1 && strcmp(argv[1], "hang") == 0) {
        hang = argc > 2 ? atol(argv[2]) : 60;
        n = 0;
    } else if (argc > 1 && strcmp(argv[1], "slow") == 0) {
        sleep_ms(argc > 2 ? atol(argv[2]) : 1500);
        n = argc > 3 ? atol(argv[3]) : 1;
        slow = 1;
        loaded = now_ms();
    } else if (argc > 1 && strcmp(argv[1], "burn") == 0) {
        burn_ms(argc > 2 ? atol(argv[2]) : 1000);
        n = argc > 3 ? atol(argv[3]) : 1;
        tail = argc > 4 ? atol(argv[4]) : 0;
        slow = 1;
        loaded = now_ms();
    } else if (argc > 1 && strcmp(argv[1], "big") == 0) {
        big = argc > 2 ? atol(argv[2]) : 8L << 20;
        n = 0;
    } else if (argc > 1) {
        n = atol(argv[1]);
    }
    setvbuf(stdout, outbuf, _IOFBF, sizeof outbuf);
    drain_stdin();
    if (slow) {
        printf("{\"v\":1,\"type\":\"session.started\",\"sessionId\":\"s_bench\","
               "\"data\":{\"pid\":%ld,\"idleMs\":%.1f}}\n",
               (long)getpid(), now_ms() - loaded);
    } else {
        fputs("{\"v\":1,\"type\":\"session.started\",\"sessionId\":\"s_bench\",\"data\":{}}\n",
              stdout);
    }
    if (tail > 0) {
        fflush(stdout);
        burn_ms(tail);
    }
    if (hang >= 0) {
        fflush(stdout);
        sleep((unsigned)hang);
    }
    if (big >= 0) {
        char *text = big_text(big);
        fputs("{\"v\":1,\"type\":\"message\",\"sessionId\":\"s_bench\","
              "\"data\":{\"role\":\"assistant\",\"text\":\"",
              stdout);
        fwrite(text, 1, (size_t)big, stdout);
        fputs("\"}}\n", stdout);
        free(text);
    }
    for (long i = 0; i < n; i++) {
        printf("{\"v\":1,\"type\":\"message\",\"sessionId\":\"s_bench\","
               "\"data\":{\"role\":\"assistant\",\"text\":\"chunk %ld\"}}\n",
               i);
    }
    fputs("{\"v\":1,\"type\":\"session.ended\",\"sessionId\":\"s_bench\","
          "\"data\":{\"reason\":\"completed\"}}\n",
          stdout);
    fflush(stdout);
    return 0;
}
