/* cfleet: command line, shared helpers and MQTT encoders. The modes live in fleet.c and publish.c.
 *
 *   cfleet fleet   --port P --vehicles N [--requests R] [--connect-rate C] [--heartbeat-interval S] ...
 *   cfleet publish --port P --vehicles N --requests R [--window W] [--payload B] ...
 *
 * Both print exactly one JSON object on stdout when they finish (and nothing else there); the fleet
 * prints progress lines on stderr ("cfleet ready ..." once every vehicle is subscribed, "cfleet
 * progress ..." every --progress seconds and on SIGUSR1). Loopback only: the host must be in 127/8.
 */
#include "cfleet.h"

#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("cfleet: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

static double tv_s(struct timeval tv) { return (double)tv.tv_sec + (double)tv.tv_usec / 1e6; }

struct cpu cpu_self(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (struct cpu){tv_s(ru.ru_utime), tv_s(ru.ru_stime)};
}

struct cpu cpu_children(void) {
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    return (struct cpu){tv_s(ru.ru_utime), tv_s(ru.ru_stime)};
}

long hard_nofile(void) {
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    return rl.rlim_max == RLIM_INFINITY ? 1L << 20 : (long)rl.rlim_max;
}

int raise_nofile(long want) {
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rlim_t target = rl.rlim_max == RLIM_INFINITY ? (rlim_t)want : rl.rlim_max;
    if ((rlim_t)want < target)
        target = (rlim_t)want;
    if (target > rl.rlim_cur) {
        rl.rlim_cur = target;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    return (int)rl.rlim_cur;
}

void format_vin(char *out, const struct options *o, long index) {
    snprintf(out, MAX_ID + 1, "%s%0*ld", o->prefix, o->digits, o->start + index);
}

int resolve_host(const char *host, uint32_t *addr_be) {
    struct in_addr a;
    if (inet_pton(AF_INET, host, &a) == 1) {
        *addr_be = a.s_addr;
        return 0;
    }
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) != 0 || res == NULL)
        return -1;
    *addr_be = ((struct sockaddr_in *)res->ai_addr)->sin_addr.s_addr;
    freeaddrinfo(res);
    return 0;
}

/* ---------------------------------------------------------------- histogram */

void hist_merge(struct hist *into, const struct hist *from) {
    for (int i = 0; i < HIST_BUCKETS; i++)
        into->buckets[i] += from->buckets[i];
    into->count += from->count;
    if (from->max > into->max)
        into->max = from->max;
}

static double bucket_mid_us(int idx) {
    if (idx < 64)
        return idx;
    int e = (idx - 64) / 32 + 6, sub = (idx - 64) % 32;
    double lo = (double)((uint64_t)(32 + sub) << (e - HIST_SUB_BITS));
    return lo + (double)((uint64_t)1 << (e - HIST_SUB_BITS)) / 2.0;
}

double hist_quantile_ms(const struct hist *h, double q) {
    if (h->count == 0)
        return -1;
    uint64_t rank = (uint64_t)(q * (double)h->count + 0.999999999);
    if (rank < 1)
        rank = 1;
    uint64_t seen = 0;
    for (int i = 0; i < HIST_BUCKETS; i++) {
        seen += h->buckets[i];
        if (seen >= rank) {
            double v = bucket_mid_us(i);
            return (v > (double)h->max ? (double)h->max : v) / 1000.0;
        }
    }
    return (double)h->max / 1000.0;
}

static void json_num(double v) {
    if (v < 0)
        fputs("null", stdout);
    else
        printf("%.3f", v);
}

void json_hist(const char *key, const struct hist *h, int comma) {
    printf("\"%s\": {\"count\": %llu, \"p50\": ", key, (unsigned long long)h->count);
    json_num(hist_quantile_ms(h, 0.50));
    fputs(", \"p90\": ", stdout);
    json_num(hist_quantile_ms(h, 0.90));
    fputs(", \"p99\": ", stdout);
    json_num(hist_quantile_ms(h, 0.99));
    fputs(", \"max\": ", stdout);
    json_num(h->count ? (double)h->max / 1000.0 : -1);
    printf("}%s", comma ? ", " : "");
}

/* ---------------------------------------------------------------- MQTT encoders */

size_t encode_connect(uint8_t *out, const char *client_id, int clean, int keepalive, const char *username,
                      const char *password) {
    size_t id_len = strlen(client_id);
    size_t rl = 10 + 2 + id_len;
    uint8_t flags = clean ? 0x02 : 0;
    if (username) {
        rl += 2 + strlen(username);
        flags |= 0x80;
    }
    if (password) {
        rl += 2 + strlen(password);
        flags |= 0x40;
    }
    size_t n = 0;
    out[n++] = MQTT_CONNECT << 4;
    n += put_varint(out + n, rl);
    n += put_str(out + n, "MQTT", 4);
    out[n++] = 4; /* protocol level 3.1.1 */
    out[n++] = flags;
    n += put_u16(out + n, (unsigned)keepalive);
    n += put_str(out + n, client_id, id_len);
    if (username)
        n += put_str(out + n, username, strlen(username));
    if (password)
        n += put_str(out + n, password, strlen(password));
    return n;
}

size_t encode_subscribe(uint8_t *out, unsigned packet_id, const char *filter, size_t filter_len, int qos) {
    size_t n = 0;
    out[n++] = (MQTT_SUBSCRIBE << 4) | 0x02; /* MQTT-3.8.1-1: reserved flags 0010 */
    n += put_varint(out + n, 2 + 2 + filter_len + 1);
    n += put_u16(out + n, packet_id);
    n += put_str(out + n, filter, filter_len);
    out[n++] = (uint8_t)qos;
    return n;
}

size_t encode_publish_head(uint8_t *out, const char *topic, size_t topic_len, int qos, unsigned packet_id,
                           size_t payload_len) {
    size_t n = 0;
    out[n++] = (uint8_t)((MQTT_PUBLISH << 4) | (qos << 1));
    n += put_varint(out + n, 2 + topic_len + (qos ? 2 : 0) + payload_len);
    n += put_str(out + n, topic, topic_len);
    if (qos)
        n += put_u16(out + n, packet_id);
    return n;
}

size_t delivery_prefix(char *out, size_t cap, const char *topic_prefix, const char *vin) {
    const char *mark = strstr(topic_prefix, "{VIN}");
    int n = mark ? snprintf(out, cap, "%.*s%s%s", (int)(mark - topic_prefix), topic_prefix, vin, mark + 5)
                 : snprintf(out, cap, "%s", topic_prefix);
    return n < 0 || (size_t)n >= cap ? cap - 1 : (size_t)n;
}

/* ---------------------------------------------------------------- command line */

static void usage(FILE *f) {
    fputs("usage: cfleet fleet|publish [options]\n"
          "  --host H              broker address, loopback only (default 127.0.0.1)\n"
          "  --port P[,P...]       broker port(s); vehicle i uses port[i %% n] (default 1883)\n"
          "  --vehicles N          how many vehicles (default 10)\n"
          "  --prefix S            VIN prefix (default WVW)\n"
          "  --digits D            VIN index width (default 14: WVW00000000000001)\n"
          "  --start I             first VIN index (default 1)\n"
          "  --topic-prefix T      delivery topic prefix (default agent/{VIN}/proxy/request)\n"
          "  --requests R          fleet: unique deliveries expected per vehicle (0: stop once subscribed);\n"
          "                        publish: requests to send (one PUBLISH per vehicle each)\n"
          "  --time-cap S          stop after S seconds whatever happens (default 120)\n"
          "  --keepalive S         CONNECT keepalive; PINGREQ after S/2 of silence (default 60)\n"
          "  --username U --password P\n"
          "  --persistent          clean session 0 (default: clean session 1)\n"
          "fleet:\n"
          "  --processes K         vehicle processes (default: as the descriptor limit needs)\n"
          "  --connect-rate C      connects/s over the fleet, 0 = as fast as possible (default 0)\n"
          "  --concurrency C       handshakes in flight per process (default 500)\n"
          "  --heartbeat-interval S  each subscribed vehicle publishes ecp/<VIN>/heartbeat every S s\n"
          "  --settle S            stay connected S s once the goal is reached (default 0)\n"
          "  --until-signal        run until SIGTERM/SIGINT (or the cap), not until the goal\n"
          "  --connect-timeout S   CONNACK and SUBACK within S s, else retry (default 30)\n"
          "  --no-online           do not publish ecp/<VIN>/online after SUBACK\n"
          "  --progress S          progress line on stderr every S s, 0 = none (default 1)\n"
          "  --per-address N       vehicles per 127.2.x.y source address (default 5000)\n"
          "  --coalesce-us U       after a wakeup with few events sleep U us first (default 0)\n"
          "publish:\n"
          "  --window W            unacknowledged PUBLISHes at most (default 128)\n"
          "  --payload B           payload bytes, stamped with the send time (default 256)\n"
          "  --request-prefix S    request id S-00001 ... (default req; empty: no request id, the VIN's topic)\n"
          "  --client-id S         the publisher's client id (default cfleet-platform)\n",
          f);
}

static double num(const char *name, const char *s, double lo, double hi) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || v < lo || v > hi)
        die("--%s: %s is not a number in [%g, %g]", name, s, lo, hi);
    return v;
}

static void parse_ports(struct options *o, const char *s) {
    o->nports = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (o->nports == MAX_PORTS)
            die("--port: at most %d ports", MAX_PORTS);
        o->ports[o->nports++] = (int)num("port", tok, 1, 65535);
    }
    if (!o->nports)
        die("--port: no port given");
}

int main(int argc, char **argv) {
    struct options o = {
        .host = "127.0.0.1", .ports = {1883}, .nports = 1, .prefix = "WVW", .digits = 14, .start = 1,
        .vehicles = 10, .topic_prefix = "agent/{VIN}/proxy/request", .concurrency = 500, .keepalive = 60,
        .time_cap = 120, .connect_timeout = 30, .clean = 1, .window = 128, .payload = 256,
        .request_prefix = "req", .client_id = "cfleet-platform", .progress = 1.0, .per_address = 5000,
    };
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    o.mode = argv[1];
    enum { HOST = 1, PORT, VEH, PREFIX, DIGITS, START, TOPIC, REQ, CAP, KA, USER, PASS, PERSIST, PROCS, RATE, CONC,
           HB, SETTLE, UNTIL, CTO, NOONLINE, PROG, PERADDR, COALESCE, WIN, PAYLOAD, RPREFIX, CID, HELP };
    static const struct option longs[] = {
        {"host", 1, 0, HOST}, {"port", 1, 0, PORT}, {"vehicles", 1, 0, VEH}, {"prefix", 1, 0, PREFIX},
        {"digits", 1, 0, DIGITS}, {"start", 1, 0, START}, {"topic-prefix", 1, 0, TOPIC}, {"requests", 1, 0, REQ},
        {"time-cap", 1, 0, CAP}, {"keepalive", 1, 0, KA}, {"username", 1, 0, USER}, {"password", 1, 0, PASS},
        {"persistent", 0, 0, PERSIST}, {"processes", 1, 0, PROCS}, {"connect-rate", 1, 0, RATE},
        {"concurrency", 1, 0, CONC}, {"heartbeat-interval", 1, 0, HB}, {"settle", 1, 0, SETTLE},
        {"until-signal", 0, 0, UNTIL}, {"connect-timeout", 1, 0, CTO}, {"no-online", 0, 0, NOONLINE},
        {"progress", 1, 0, PROG}, {"per-address", 1, 0, PERADDR}, {"coalesce-us", 1, 0, COALESCE},
        {"window", 1, 0, WIN}, {"payload", 1, 0, PAYLOAD},
        {"request-prefix", 1, 0, RPREFIX}, {"client-id", 1, 0, CID}, {"help", 0, 0, HELP}, {0, 0, 0, 0},
    };
    optind = 2;
    int c;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (c) {
        case HOST: o.host = optarg; break;
        case PORT: parse_ports(&o, optarg); break;
        case VEH: o.vehicles = (long)num("vehicles", optarg, 1, 10000000); break;
        case PREFIX: o.prefix = optarg; break;
        case DIGITS: o.digits = (int)num("digits", optarg, 1, 20); break;
        case START: o.start = (long)num("start", optarg, 0, 1e15); break;
        case TOPIC: o.topic_prefix = optarg; break;
        case REQ: o.requests = (long)num("requests", optarg, 0, 1e9); break;
        case CAP: o.time_cap = num("time-cap", optarg, 0.1, 1e6); break;
        case KA: o.keepalive = (int)num("keepalive", optarg, 0, 65535); break;
        case USER: o.username = optarg; break;
        case PASS: o.password = optarg; break;
        case PERSIST: o.clean = 0; break;
        case PROCS: o.processes = (int)num("processes", optarg, 1, 256); break;
        case RATE: o.connect_rate = num("connect-rate", optarg, 0, 1e9); break;
        case CONC: o.concurrency = (int)num("concurrency", optarg, 1, 1e7); break;
        case HB: o.heartbeat_interval = num("heartbeat-interval", optarg, 0, 1e6); break;
        case SETTLE: o.settle = num("settle", optarg, 0, 1e6); break;
        case UNTIL: o.until_signal = 1; break;
        case CTO: o.connect_timeout = num("connect-timeout", optarg, 0.1, 1e6); break;
        case NOONLINE: o.no_online = 1; break;
        case PROG: o.progress = num("progress", optarg, 0, 1e6); break;
        case PERADDR: o.per_address = (long)num("per-address", optarg, 1, 1e9); break;
        case COALESCE: o.coalesce_us = (int)num("coalesce-us", optarg, 0, 100000); break;
        case WIN: o.window = (int)num("window", optarg, 1, 32768); break;
        case PAYLOAD: o.payload = (int)num("payload", optarg, 0, 16 << 20); break;
        case RPREFIX: o.request_prefix = optarg; break;
        case CID: o.client_id = optarg; break;
        case HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc)
        die("unexpected argument %s", argv[optind]);
    uint32_t addr;
    if (resolve_host(o.host, &addr) != 0)
        die("--host %s does not resolve", o.host);
    if ((ntohl(addr) >> 24) != 127)
        die("--host %s is not a loopback address (127/8): cfleet is a loopback load generator", o.host);
    char probe[MAX_ID + 2];
    snprintf(probe, sizeof probe, "%s%0*ld", o.prefix, o.digits, o.start + o.vehicles - 1);
    if (strlen(probe) > MAX_ID)
        die("VIN %s... is longer than %d characters", probe, MAX_ID);
    if (strlen(o.topic_prefix) + MAX_ID + 64 > MAX_TOPIC)
        die("--topic-prefix is too long");
    if (!strcmp(o.mode, "fleet"))
        return run_fleet(&o);
    if (!strcmp(o.mode, "publish")) {
        if (o.requests < 1)
            die("publish: --requests must be >= 1");
        return run_publish(&o);
    }
    die("unknown mode %s (fleet or publish)", o.mode);
}
