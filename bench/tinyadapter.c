/* tinyadapter: the smallest adapter trioserve can run, for benchmarks.
 *
 *   tinyadapter [N]           read stdin to EOF, print session.started,
 *                             N message events, session.ended; exit 0.
 *   tinyadapter hang [SECS]   read stdin to EOF, print session.started,
 *                             sleep SECS (default 60), then end as above.
 *
 * Output goes through one big stdout buffer; every line is a v1 wire event.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char outbuf[1 << 20];

static void drain_stdin(void) {
    char buf[65536];
    while (read(STDIN_FILENO, buf, sizeof buf) > 0) {
    }
}

int main(int argc, char **argv) {
    long n = 1;
    long hang = -1;
    if (argc > 1 && strcmp(argv[1], "hang") == 0) {
        hang = argc > 2 ? atol(argv[2]) : 60;
        n = 0;
    } else if (argc > 1) {
        n = atol(argv[1]);
    }
    setvbuf(stdout, outbuf, _IOFBF, sizeof outbuf);
    drain_stdin();
    fputs("{\"v\":1,\"type\":\"session.started\",\"sessionId\":\"s_bench\",\"data\":{}}\n", stdout);
    if (hang >= 0) {
        fflush(stdout);
        sleep((unsigned)hang);
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
