/*
 * A tiny HTTP/1.0 server for the real node's tests (tests/cluster/node-images.sh packs it into
 * teifleet.local/echo), built static so the image is this one file:
 *
 *   GET /                  200 "echo <hostname>"
 *   GET /env/<NAME>        200 the variable's value, 404 when unset (what a device plugin set)
 *   GET /connect/<ip>:<p>  200 "connected" when a TCP connection opens within 3 s, 502 otherwise
 *                          (what the pod's network reaches, e.g. the API server's Service)
 *
 * Usage: echo [port]   (default 8080). Exits at SIGTERM or SIGINT.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void stop(int signal) {
  (void)signal;
  _exit(0);
}

static void reply(int client, int status, const char *body) {
  char head[256];
  const char *reason = status == 200 ? "OK" : status == 404 ? "Not Found" : status == 400 ? "Bad Request" : "Bad Gateway";
  int n = snprintf(head, sizeof head,
                   "HTTP/1.0 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                   status, reason, strlen(body) + 1);
  if (write(client, head, (size_t)n) < 0 || write(client, body, strlen(body)) < 0 || write(client, "\n", 1) < 0) {
    perror("echo: write");
  }
}

/* Opens a TCP connection to "ip:port" within 3 s; 0 when it did. */
static int try_connect(const char *target, char *why, size_t why_size) {
  char ip[64];
  const char *colon = strrchr(target, ':');
  if (!colon || (size_t)(colon - target) >= sizeof ip) {
    snprintf(why, why_size, "expected <ip>:<port>");
    return -1;
  }
  memcpy(ip, target, (size_t)(colon - target));
  ip[colon - target] = '\0';
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof addr);
  addr.sin_family = AF_INET;
  addr.sin_port = htons((unsigned short)atoi(colon + 1));
  if (inet_pton(AF_INET, ip, &addr.sin_addr) != 1) {
    snprintf(why, why_size, "not an IPv4 address: %.63s", ip);
    return -1;
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    snprintf(why, why_size, "socket: %s", strerror(errno));
    return -1;
  }
  int result = connect(fd, (struct sockaddr *)&addr, sizeof addr);
  if (result < 0 && errno == EINPROGRESS) {
    struct pollfd wait = {.fd = fd, .events = POLLOUT};
    int error = 0;
    socklen_t len = sizeof error;
    if (poll(&wait, 1, 3000) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0 && error == 0) {
      result = 0;
    } else {
      errno = error ? error : ETIMEDOUT;
    }
  }
  if (result < 0) snprintf(why, why_size, "connect %.64s: %s", target, strerror(errno));
  close(fd);
  return result;
}

static void serve(int client) {
  char request[1024];
  ssize_t n = read(client, request, sizeof request - 1);
  if (n <= 0) return;
  request[n] = '\0';
  char path[512];
  if (sscanf(request, "GET %511s", path) != 1) {
    reply(client, 400, "only GET");
    return;
  }
  char body[600];
  if (strcmp(path, "/") == 0) {
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    snprintf(body, sizeof body, "echo %s", host);
    reply(client, 200, body);
  } else if (strncmp(path, "/env/", 5) == 0) {
    const char *value = getenv(path + 5);
    reply(client, value ? 200 : 404, value ? value : "unset");
  } else if (strncmp(path, "/connect/", 9) == 0) {
    char why[256];
    if (try_connect(path + 9, why, sizeof why) == 0) {
      reply(client, 200, "connected");
    } else {
      reply(client, 502, why);
    }
  } else {
    reply(client, 404, "no such path");
  }
}

int main(int argc, char **argv) {
  int port = argc > 1 ? atoi(argv[1]) : 8080;
  signal(SIGTERM, stop);
  signal(SIGINT, stop);
  signal(SIGPIPE, SIG_IGN);
  int server = socket(AF_INET, SOCK_STREAM, 0);
  int on = 1;
  setsockopt(server, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof addr);
  addr.sin_family = AF_INET;
  addr.sin_port = htons((unsigned short)port);
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  if (server < 0 || bind(server, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(server, 64) < 0) {
    perror("echo: listen");
    return 1;
  }
  fprintf(stderr, "echo: listening on :%d\n", port);
  for (;;) {
    int client = accept(server, NULL, NULL);
    if (client < 0) continue;
    struct timeval timeout = {.tv_sec = 5};
    setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    serve(client);
    close(client);
  }
}
