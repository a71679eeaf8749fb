/*
 * addr.c — HOST:PORT as the command line and federation.ini write an
 * address: "coord.example.org:7700", "10.0.0.5:7700", "[::1]:7700". The
 * port is what follows the last colon; an IPv6 literal's brackets go.
 */
#include <stdio.h>
#include <string.h>

#include "util.h"

int hostport_split(const char *hostport, char *host, size_t host_len, char *port, size_t port_len) {
    const char *colon = strrchr(hostport, ':');
    if (colon == NULL || colon == hostport || colon[1] == '\0') return -1;
    const char *h = hostport;
    size_t n = (size_t)(colon - hostport);
    if (n >= 2 && h[0] == '[' && h[n - 1] == ']') h++, n -= 2;
    if (n == 0 || n >= host_len || strlen(colon + 1) >= port_len) return -1;
    memcpy(host, h, n);
    host[n] = '\0';
    snprintf(port, port_len, "%s", colon + 1);
    return 0;
}
