/* The OOM bench's grower (hack/bench-oom.sh): allocates and touches
 * anonymous memory, first PREFILL MiB as fast as it can, then at RATE MiB/s
 * (0: as fast as it can, the physical limit), up to MAX MiB, then holds it.
 * One write per 4 KiB page, as a program filling its heap would.
 *
 * Usage: grower PREFILL_MIB RATE_MIB_S MAX_MIB [GOFILE]
 *        (with GOFILE: after the prefill, waits until it exists, polling
 *        every millisecond)
 *        grower --measure MIB   (touches MIB MiB at full speed, prints MiB/s)
 * Built static (gcc -O2 -static) so that it runs in the busybox image.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024UL * 1024UL)
#define PAGE 4096UL

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static char *map(unsigned long bytes) {
	char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED) {
		perror("mmap");
		exit(2);
	}
	return p;
}

static void touch(char *p, unsigned long from, unsigned long to) {
	for (unsigned long o = from; o < to; o += PAGE)
		p[o] = 1;
}

int main(int argc, char **argv) {
	if (argc == 3 && strcmp(argv[1], "--measure") == 0) {
		unsigned long bytes = strtoul(argv[2], NULL, 10) * MIB;
		char *p = map(bytes);
		double t0 = now();
		touch(p, 0, bytes);
		double dt = now() - t0;
		printf("%.0f\n", bytes / MIB / dt);
		return 0;
	}
	if (argc != 4 && argc != 5) {
		fprintf(stderr, "usage: grower PREFILL_MIB RATE_MIB_S MAX_MIB [GOFILE]\n");
		return 2;
	}

	unsigned long prefill = strtoul(argv[1], NULL, 10) * MIB;
	double rate = strtod(argv[2], NULL) * MIB;
	unsigned long max = strtoul(argv[3], NULL, 10) * MIB;
	char *p = map(max);
	if (prefill > max)
		prefill = max;
	touch(p, 0, prefill);
	unsigned long done = prefill;
	if (argc == 5)
		while (access(argv[4], F_OK) != 0)
			usleep(1000);
	double t0 = now();
	printf("prefilled %lu MiB\n", prefill / MIB);
	fflush(stdout);
	while (done < max) {
		unsigned long target = max;
		if (rate > 0) {
			double want = prefill + rate * (now() - t0);
			target = want < max ? ((unsigned long)want & ~(PAGE - 1)) : max;
		}
		if (target > done) {
			/* At most 1 MiB per step, so the rate stays smooth. */
			unsigned long step = target - done > MIB ? MIB : target - done;
			touch(p, done, done + step);
			done += step;
		} else {
			usleep(1000);
		}
	}
	printf("held %lu MiB\n", max / MIB);
	fflush(stdout);
	for (;;)
		pause();
}
