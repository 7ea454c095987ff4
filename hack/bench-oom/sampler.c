/* The OOM bench's sampler (hack/bench-oom.sh): reads a list of kernel files
 * every INTERVAL_US microseconds and writes one line per sample,
 * "<CLOCK_MONOTONIC ns> <value>...", until STOPFILE exists or MAX_S seconds
 * have passed. The first line is "# realtime-monotonic <ns>", to line the
 * samples up with wall-clock log stamps.
 *
 * A spec is a path (its first number) or PATH:KEY (the number after KEY on
 * the line that starts with KEY and a space or a colon, as /proc/meminfo's
 * "SwapFree:"; for a PSI line, its avg10). A file that
 * cannot be read gives -1 (a removed cgroup, a dead pod).
 *
 * Usage: sampler OUT INTERVAL_US MAX_S STOPFILE SPEC...
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct spec {
	int fd;
	const char *key;
	size_t keylen;
	int same; /* index of an earlier spec of the same file, or -1 */
	char buf[16384];
};

static long long ns(clockid_t c) {
	struct timespec ts;
	clock_gettime(c, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* A file named by several specs (the root's memory.stat) is read once per
 * sample: the first spec reads it, the others parse that text. */
static double value(struct spec *specs, int i) {
	struct spec *s = &specs[i];
	char *buf = s->same >= 0 ? specs[s->same].buf : s->buf;
	if (s->same < 0) {
		if (s->fd < 0)
			return -1;
		ssize_t n = pread(s->fd, buf, sizeof s->buf - 1, 0);
		if (n <= 0) {
			buf[0] = 0;
			return -1;
		}
		buf[n] = 0;
	} else if (!buf[0]) {
		return -1;
	}
	if (!s->key)
		return strtod(buf, NULL);
	for (char *line = buf; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
		if (strncmp(line, s->key, s->keylen) == 0 && (line[s->keylen] == ' ' || line[s->keylen] == ':')) {
			char *avg = strstr(line, "avg10=");
			char *eol = strchr(line, '\n');
			if (avg && (!eol || avg < eol))
				return strtod(avg + 6, NULL);
			return strtod(line + s->keylen + 1, NULL);
		}
	}
	return -1;
}

int main(int argc, char **argv) {
	if (argc < 6) {
		fprintf(stderr, "usage: sampler OUT INTERVAL_US MAX_S STOPFILE SPEC...\n");
		return 2;
	}
	FILE *out = fopen(argv[1], "w");
	if (!out) {
		perror(argv[1]);
		return 2;
	}
	long interval = atol(argv[2]);
	long long end = ns(CLOCK_MONOTONIC) + atoll(argv[3]) * 1000000000LL;
	const char *stop = argv[4];
	int n = argc - 5;
	struct spec *specs = calloc(n, sizeof *specs);
	for (int i = 0; i < n; i++) {
		char *path = strdup(argv[5 + i]);
		char *colon = strrchr(path, ':');
		if (colon) {
			*colon = 0;
			specs[i].key = colon + 1;
			specs[i].keylen = strlen(colon + 1);
		}
		specs[i].same = -1;
		for (int j = 0; j < i; j++)
			if (strncmp(argv[5 + j], path, strlen(path)) == 0 &&
			    (argv[5 + j][strlen(path)] == ':' || argv[5 + j][strlen(path)] == 0))
				specs[i].same = j;
		while (specs[i].same >= 0 && specs[specs[i].same].same >= 0)
			specs[i].same = specs[specs[i].same].same;
		specs[i].fd = specs[i].same >= 0 ? -1 : open(path, O_RDONLY | O_CLOEXEC);
	}
	size_t cap = 1 << 24, len = 0;
	char *buf = malloc(cap);
	len += snprintf(buf, cap, "# realtime-monotonic %lld\n",
			ns(CLOCK_REALTIME) - ns(CLOCK_MONOTONIC));
	struct timespec next;
	clock_gettime(CLOCK_MONOTONIC, &next);
	for (;;) {
		long long t = ns(CLOCK_MONOTONIC);
		if (t > end || access(stop, F_OK) == 0)
			break;
		if (cap - len < 4096) {
			cap *= 2;
			buf = realloc(buf, cap);
		}
		len += snprintf(buf + len, cap - len, "%lld", t);
		for (int i = 0; i < n; i++)
			/* PSI avg10 (a percentage) in hundredths, to stay an integer. */
			len += snprintf(buf + len, cap - len, " %.0f",
					value(specs, i) * (specs[i].key && strcmp(specs[i].key, "full") == 0 ? 100 : 1));
		buf[len++] = '\n';
		next.tv_nsec += interval * 1000;
		while (next.tv_nsec >= 1000000000) {
			next.tv_nsec -= 1000000000;
			next.tv_sec++;
		}
		/* Behind (the sampler was not scheduled): start again from now. */
		if (next.tv_sec * 1000000000LL + next.tv_nsec < ns(CLOCK_MONOTONIC))
			clock_gettime(CLOCK_MONOTONIC, &next);
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
	}
	fwrite(buf, 1, len, out);
	fclose(out);
	return 0;
}
